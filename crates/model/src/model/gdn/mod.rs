//! Gated DeltaNet (linear attention) layer, model-spec §3, split by concern: the layer and its
//! forward pass (`layer.rs`), the stages around the delta rule (`stages.rs`: conv, gates, gated
//! norm), the per-head kernels (`kernels.rs`: recurrent, replay, chunked), and the layer's state
//! with the tape that rolls it back (`tape.rs`).
//!
//! The recurrent rule (decode) and the chunked rule (prefill, C = 64) are direct f32 loops over
//! the per-head `[dk, dv]` state, threaded over value heads: the state is small and the work per
//! head is a handful of rank-1 updates and mat-vecs, which chains of tiny tensor ops would drown
//! in overhead.

pub(crate) mod kernels;
pub(crate) mod layer;
pub(crate) mod stages;
pub(crate) mod tape;

pub use kernels::{HeadInputs, chunked_head, recurrent_head, replay_head};
pub(crate) use layer::GdnLayer;
pub use stages::{conv_stage, gated_norm_stage, gates_stage};
pub(crate) use tape::{GdnState, GdnTape};
