//! The generation protocol every backend speaks: the events of one request's stream, the
//! parameters with their one range table, the controls, the advice a diagnostic offers, phase
//! tracking, the loop detector, the state-trace values — and the [`Tally`], the one bookkeeping
//! of what a generation produced, fed alike by the local engine and by a remote server's frames.
//! It computes nothing and knows no backend.

#![forbid(unsafe_code)]

pub(crate) mod advice;
pub(crate) mod control;
pub(crate) mod events;
pub(crate) mod handle;
pub(crate) mod params;
pub(crate) mod phases;
pub(crate) mod state;
pub(crate) mod tally;
pub(crate) mod watchdog;

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
pub use tally::{FinishContext, Finished, Marker, Reported, STATS_EVERY, Tally, TokenPiece, Verdict};
pub use watchdog::{LoopParams, OnLoop};
