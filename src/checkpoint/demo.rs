//! The embedded demo model (models/demo, trained by scripts/train_demo.py): a tiny
//! Qwen3.5-architecture reasoning model compiled into the binary, so `deltascope` works on a fresh
//! machine, offline. It goes through exactly the loader of any checkpoint.

use super::{EmbeddedModel, ModelSource};

pub static DEMO: EmbeddedModel = EmbeddedModel {
    name: "demo",
    files: &[
        ("config.json", include_bytes!("../../models/demo/config.json")),
        ("model.safetensors", include_bytes!("../../models/demo/model.safetensors")),
        ("tokenizer.json", include_bytes!("../../models/demo/tokenizer.json")),
        ("tokenizer_config.json", include_bytes!("../../models/demo/tokenizer_config.json")),
        ("generation_config.json", include_bytes!("../../models/demo/generation_config.json")),
    ],
};

pub fn demo_source() -> ModelSource {
    ModelSource::Embedded(&DEMO)
}
