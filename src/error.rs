//! The library's error type. Every variant names what was wrong and where (file, field, tensor,
//! expected vs found), because the first thing a user sees of a bad checkpoint is this message.

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{dir}: no {file} ({hint})")]
    MissingFile { dir: PathBuf, file: String, hint: String },

    #[error("{file}: invalid JSON: {message}")]
    Json { file: String, message: String },

    #[error("{file}: field `{field}`: {message}")]
    ConfigField { file: String, field: String, message: String },

    #[error(
        "{file}: unknown model_type \"{found}\" (deltascope supports qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text and qwen3_next)"
    )]
    UnknownModelType { file: String, found: String },

    #[error("{file}: {message}")]
    Unsupported { file: String, message: String },

    #[error("tensor `{name}` not found (looked in {searched})")]
    MissingTensor { name: String, searched: String },

    #[error("{file}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape { file: String, name: String, expected: Vec<usize>, found: Vec<usize> },

    #[error("{file}: tensor `{name}` has dtype {found}, expected one of BF16, F16, F32")]
    TensorDtype { file: String, name: String, found: String },

    #[error("{file}: not a valid safetensors file: {message}")]
    Safetensors { file: String, message: String },

    #[error("{file}: {message}")]
    Tokenizer { file: String, message: String },

    #[error("chat template ({source_name}): {message}")]
    Template { source_name: String, message: String },

    #[error(
        "token id {id} at position {position} is out of range: the model's vocabulary has {vocab_size} entries (ids 0..{vocab_size})"
    )]
    TokenOutOfRange { id: u32, position: usize, vocab_size: usize },

    #[error(
        "the sequence would hold {needed} tokens but the model's context is {max} tokens (max_position_embeddings); shorten the prompt or lower max_tokens"
    )]
    ContextOverflow { needed: usize, max: usize },

    #[error("{0}")]
    InvalidArgument(String),

    #[error("state: {0}")]
    State(String),

    #[error("compute: {0}")]
    Compute(String),
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Compute(e.to_string())
    }
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub(crate) fn field(file: &str, field: &str, message: impl Into<String>) -> Self {
        Error::ConfigField { file: file.to_string(), field: field.to_string(), message: message.into() }
    }
}

/// The text a panic was raised with (`panic!` payloads are `&str` or `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}
