//! The local loop: prefill, decode, sampling, budget forcing and MTP on the in-process model.
//! It speaks the generation protocol (the `deltascope-protocol` crate) and never renders.
//!
//! The modules are private; this is the face the floors above use.

#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(unreachable_pub)]

mod budget;
mod generate;
mod generator;
mod mtp;
mod request;
mod run;
mod sampler;
mod sequence;
mod state_trace;
mod worker;

pub use generator::{Generator, Outcome};
pub use request::GenerateRequest;
pub use sampler::{Rng, Sampler, argmax};
pub use sequence::{Compute, DecodeSequence, ModelSequence, check_prompt};
pub use worker::EngineHandle;
