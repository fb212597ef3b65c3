//! GGUF, the file llama.cpp runs: the container (header, metadata, tensor infos), the ggml
//! tensor types, and their exact dequantisation. (The mapping to a `ModelConfig` and the
//! inverse of llama.cpp's converter transforms come next.)

mod container;
mod dequant;
mod file;
mod types;

pub use container::{Gguf, GgufError, TensorInfo, Value};
pub use dequant::{DequantError, dequantize};
pub use file::{GgufFile, QuantShare};
pub use types::GgmlType;
