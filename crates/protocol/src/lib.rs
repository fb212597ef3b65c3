//! deltascope's generation protocol: the tokenizer and chat templates, and what every backend
//! speaks (events, parameters with the one range table, controls, advice, phases, the loop
//! detector, state-trace values, and the Tally).
//!
//! The modules are private; this is the face the floors above use.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]
#![warn(unreachable_pub)]

mod chat;
mod generation;

pub use chat::{ChatTemplate, IncrementalDecoder, RenderOptions, SpecialTokens, TextTokenizer};
pub use generation::advice::{BudgetFix, Fix, estimate_forced, starved, truncated};
pub use generation::state::{
    AttentionLayerState, EXPLODED_NORM, FORGETS_WITHIN, GdnLayerState, HeadMemory, KEEPS_PAST, StateEvent, StateMetric,
    half_life, memory_of,
};
pub use generation::{
    Alternative, Control, CountSource, DeviceMemory, Diagnostic, DiagnosticKind, DoneEvent, DraftKind, EngineEvent,
    ErrorEvent, ErrorKind, FinishContext, FinishReason, Finished, Generation, GenerationParams, LoopParams, MAX_DEPTH,
    Marker, Memory, MtpMode, MtpStats, Numerics, OnLoop, ParamProblem, Phase, PhaseTracker, Preset, QWEN_BUDGET_BRIDGE,
    RANGES, Range, Reported, STATS_EVERY, SamplingParams, ServerLabel, ServerMemory, StartEvent, StatsEvent,
    StepControl, Tally, Thinking, Timing, TokenEvent, TokenPiece, Usage, Verdict, error_kind, range,
};
