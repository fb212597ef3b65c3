//! Text around the model: tokenizer, chat templates, prompts.

pub mod prompt;
pub mod template;
pub mod tokenizer;

pub use prompt::{Prompt, PromptInput, build_prompt, parse_ids};
pub use template::{ChatTemplate, RenderOptions};
pub use tokenizer::{IncrementalDecoder, SpecialTokens, TextTokenizer};
