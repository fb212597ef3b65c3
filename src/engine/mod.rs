//! The local loop: prefill, decode, sampling, budget forcing and MTP on the in-process model.
//! It speaks the generation protocol (crate::generation) and never renders.

#![forbid(unsafe_code)]

pub mod budget;
pub mod generate;
pub mod request;
pub mod sampler;
pub mod sequence;
pub mod speculate;
pub mod speculative;
pub mod state_trace;
pub mod worker;

pub use generate::{Generator, Outcome};
pub use request::GenerateRequest;
pub use sequence::{Compute, DecodeSequence, ModelSequence, check_prompt};
pub use worker::EngineHandle;
