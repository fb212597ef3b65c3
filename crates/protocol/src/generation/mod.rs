//! The generation protocol every backend speaks: the events of one request's stream, the
//! parameters with their one range table, the controls, the advice a diagnostic offers, phase
//! tracking, the loop detector, the state-trace values — and the [`Tally`], the one bookkeeping
//! of what a generation produced, fed alike by the local engine and by a remote server's frames.
//! It computes nothing and knows no backend.

#![forbid(unsafe_code)]

pub mod advice;
pub mod control;
pub mod events;
pub mod handle;
pub mod params;
pub mod phases;
pub mod state;
pub mod tally;
pub mod watchdog;

pub use advice::{BudgetFix, Fix};
pub use control::{Control, StepControl};
pub use events::{
    Alternative, CountSource, DeviceMemory, Diagnostic, DiagnosticKind, DoneEvent, DraftKind, EngineEvent, ErrorEvent,
    ErrorKind, FinishReason, Memory, MtpStats, Numerics, Phase, ServerLabel, ServerMemory, StartEvent, StatsEvent,
    Timing, TokenEvent, Usage,
};
pub use handle::{Generation, error_kind};
pub use params::{
    GenerationParams, MAX_DEPTH, MtpMode, ParamProblem, Preset, QWEN_BUDGET_BRIDGE, RANGES, Range, SamplingParams,
    Thinking, range,
};
pub use phases::PhaseTracker;
pub use state::{AttentionLayerState, GdnLayerState, StateEvent, StateMetric};
pub use tally::{FinishContext, Finished, Marker, Reported, STATS_EVERY, Tally, TokenPiece, Verdict};
pub use watchdog::{LoopParams, OnLoop};
