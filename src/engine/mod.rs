//! The engine: decides what to compute (sampling, budgets, phases, the loop alarm) and emits one
//! event stream. It never renders.

#![forbid(unsafe_code)]

pub mod advice;
pub mod control;
pub mod events;
pub mod generate;
pub mod reasoning;
pub mod request;
pub mod sampler;
pub mod session;
pub mod speculative;
pub mod state_trace;
pub mod watchdog;
pub mod worker;

pub use advice::{BudgetFix, Fix};
pub use control::{Control, StepControl};
pub use events::{
    Alternative, CountSource, DeviceMemory, Diagnostic, DiagnosticKind, DoneEvent, DraftKind, EngineEvent, ErrorEvent,
    ErrorKind, FinishReason, Memory, Phase, ServerLabel, ServerMemory, StartEvent, StatsEvent, Timing, TokenEvent,
    Usage,
};
pub use generate::{Generator, Outcome};
pub use request::{GenerateRequest, GenerationParams, QWEN_BUDGET_BRIDGE};
pub use sampler::{ParamProblem, Preset, SamplingParams};
pub use session::{Compute, LogitsSource, ModelSession, check_prompt};
pub use speculative::{MtpParams, MtpStats};
pub use state_trace::StateEvent;
pub use watchdog::LoopParams;
pub use worker::{EngineHandle, Generation, error_kind};
