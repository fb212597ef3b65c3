//! GGUF, the file llama.cpp runs: the container (header, metadata, tensor infos), the ggml
//! tensor types and their exact dequantisation, and the model it holds opened as the Hugging
//! Face checkpoint it stands for (`source.rs`: the config and tokenizer files from the
//! metadata; `plan.rs` and `store.rs`: the tensors by their transformers names, llama.cpp's
//! converter transforms undone).

mod config;
mod container;
mod dequant;
mod file;
mod plan;
mod source;
pub(crate) mod store;
mod types;
mod vocab;

pub use container::{Gguf, GgufError, TensorInfo, Value};
pub use dequant::{DequantError, dequantize};
pub use file::{GgufFile, QuantShare};
pub use source::{is_gguf, parts, source_for};
pub use types::GgmlType;
pub use vocab::{VocabError, generation_config_json, tokenizer_config_json, tokenizer_json};
