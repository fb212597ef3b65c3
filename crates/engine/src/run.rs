//! One generation being run: its tally, phases, decoder, sampler and tokens ([`Run`]), the
//! events it emits between tokens (the state trace, the live stats), and how a run of steps
//! ended ([`Rounds`]). Below the loop (generate.rs), the forced close (budget.rs) and the
//! speculative step (mtp/step.rs), which all drive a `Run`.

use crate::sampler::Sampler;
use crate::sequence::DecodeSequence;
use crate::state_trace::state_event;
use deltascope_protocol::{
    Diagnostic, DiagnosticKind, EXPLODED_NORM, EngineEvent, FinishReason, IncrementalDecoder, Memory, MtpStats,
    PhaseTracker, Tally,
};

/// Running state of one generation.
pub(crate) struct Run<'e> {
    pub emit: &'e mut dyn FnMut(EngineEvent),
    pub tally: Tally,
    pub phases: PhaseTracker,
    pub decoder: IncrementalDecoder,
    pub sampler: Sampler,
    pub tokens: Vec<u32>,
    pub forced: Vec<bool>,
}

impl Run<'_> {
    pub(crate) fn diagnostic(&mut self, d: Diagnostic) {
        self.tally.diagnostic(d, self.emit);
    }
}

/// The state trace of the pass just fed, as a `state` event (when tracing is on), and the
/// first head whose state went non-finite or exploded as a `state_alarm` diagnostic (once).
pub(crate) fn emit_state(run: &mut Run, source: &mut dyn DecodeSequence, at_token: Option<usize>) {
    let Some(trace) = source.take_trace() else { return };
    let ev = state_event(&trace, at_token, source.position());
    let alarm = ev.alarm(EXPLODED_NORM);
    (run.emit)(EngineEvent::State(ev));
    let Some((layer, head, what)) = alarm else { return };
    if run.tally.raised().iter().any(|(k, _)| *k == DiagnosticKind::StateAlarm) {
        return;
    }
    let when = match at_token {
        None => "after the prompt".to_string(),
        Some(i) => format!("after reading generated token {i}"),
    };
    let message = format!(
        "layer {layer}, value head {head}: {what} {when}. What to check: layers.{layer}.linear_attn.* (A_log, dt_bias, in_proj_*, conv1d) and the GDN kernel"
    );
    run.diagnostic(
        Diagnostic::new(DiagnosticKind::StateAlarm, at_token.unwrap_or(0), message).at_head(Some(layer), Some(head)),
    );
}

/// A `stats` event when one is due (live gauges).
pub(crate) fn emit_stats(run: &mut Run, source: &dyn DecodeSequence, mtp: Option<&MtpStats>) {
    if run.tally.stats_due() {
        let stats = run.tally.stats(Some(memory(source, mtp)), None, mtp.cloned());
        (run.emit)(EngineEvent::Stats(stats));
    }
}

/// Memory now, with the rollback tape of a verify pass counted: between steps the tape is
/// settled, but every step holds it while it verifies.
pub(crate) fn memory(source: &dyn DecodeSequence, mtp: Option<&MtpStats>) -> Memory {
    let mut m = source.memory();
    if let Some(s) = mtp {
        m.snapshot_bytes = m.snapshot_bytes.max(s.snapshot_bytes);
    }
    m
}

/// How a run of steps ended (a speculative run, or the forced close).
pub(crate) enum Rounds {
    Finished(FinishReason),
    /// Everything appended has been fed; these are the logits for the next position.
    Fed(Vec<f32>),
}
