//! Text around the model: tokenizer, chat templates, incremental decoding.

#![forbid(unsafe_code)]

pub(crate) mod template;
pub(crate) mod tokenizer;

pub use template::{ChatTemplate, RenderOptions};
pub use tokenizer::{IncrementalDecoder, SpecialTokens, TextTokenizer};
