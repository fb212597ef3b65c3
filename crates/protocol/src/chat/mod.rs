//! Text around the model: tokenizer, chat templates, incremental decoding.

#![forbid(unsafe_code)]

pub mod template;
pub mod tokenizer;

pub use template::{ChatTemplate, RenderOptions};
pub use tokenizer::{IncrementalDecoder, SpecialTokens, TextTokenizer};
