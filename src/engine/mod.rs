//! The engine: decides what to compute (sampling, budgets, phases) and emits one event stream.
//! It never renders.

pub mod events;
pub mod generate;
pub mod reasoning;
pub mod request;
pub mod sampler;
pub mod worker;

pub use events::{DraftKind, EngineEvent, FinishReason, Phase, Timing, Usage};
pub use generate::{Generator, Outcome};
pub use request::{GenerateRequest, GenerationParams};
pub use worker::EngineHandle;
