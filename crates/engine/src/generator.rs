//! The local generator of one loaded model: what a generation produced ([`Outcome`]), and what
//! carries from one generation to the next on the same model (`--mtp auto`'s verdict). The loop
//! itself is generate.rs; the forced end of thinking budget.rs; the speculative step mtp/step.rs.

use std::sync::Mutex;

use crate::mtp::control::AutoVerdict;
use deltascope_protocol::{DiagnosticKind, FinishReason, MtpStats, TextTokenizer, Timing, Usage};

/// What a finished generation produced (also sent as the `done` event).
#[derive(Debug, Clone)]
pub struct Outcome {
    pub finish_reason: FinishReason,
    pub tokens: Vec<u32>,
    /// Which of `tokens` were forced by the engine.
    pub forced: Vec<bool>,
    pub usage: Usage,
    pub timing: Timing,
    pub thinking: String,
    pub answer: String,
    /// Diagnostics raised during generation: (kind, at_token).
    pub diagnostics: Vec<(DiagnosticKind, usize)>,
    /// Speculative-decoding metrics, when MTP drafting ran.
    pub mtp: Option<MtpStats>,
}

pub struct Generator<'a> {
    pub(crate) tokenizer: &'a TextTokenizer,
    /// A label for the `start` event.
    pub(crate) model_name: String,
    /// Where `--mtp auto` left off in the latest generation, greedy and sampled apart (their
    /// acceptance differs): the next one on this model carries on from it.
    pub(crate) auto: Mutex<[Option<AutoVerdict>; 2]>,
}

impl<'a> Generator<'a> {
    pub fn new(tokenizer: &'a TextTokenizer, model_name: impl Into<String>) -> Self {
        Generator { tokenizer, model_name: model_name.into(), auto: Mutex::new([None; 2]) }
    }
}
