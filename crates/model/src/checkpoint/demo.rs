//! The embedded demo model (models/demo, trained by scripts/train_demo.py): a tiny
//! Qwen3.5-architecture reasoning model compiled into the binary, so `deltascope` works on a fresh
//! machine, offline. It goes through exactly the loader of any checkpoint.

use super::{EmbeddedModel, ModelSource};

/// Bytes at an alignment the weights' dtypes need, so the embedded weights are read in place
/// (views, like a mapped file) instead of being copied out.
#[repr(C, align(64))]
struct Aligned<B: ?Sized>(B);

static DEMO_WEIGHTS: &Aligned<[u8]> = &Aligned(*include_bytes!("../../../../models/demo/model.safetensors"));

pub(crate) static DEMO: EmbeddedModel = EmbeddedModel {
    name: "demo",
    files: &[
        ("config.json", include_bytes!("../../../../models/demo/config.json")),
        ("model.safetensors", &DEMO_WEIGHTS.0),
        ("tokenizer.json", include_bytes!("../../../../models/demo/tokenizer.json")),
        ("tokenizer_config.json", include_bytes!("../../../../models/demo/tokenizer_config.json")),
        ("generation_config.json", include_bytes!("../../../../models/demo/generation_config.json")),
    ],
};

pub fn demo_source() -> ModelSource {
    ModelSource::Embedded(&DEMO)
}
