//! The local generation loop: prefill, then token by token — sampling, phase tracking, the
//! thinking budget ([`super::budget`]), MTP ([`super::speculate`]) — with every token pushed into
//! the protocol's [`Tally`], which counts, checks the stop conditions and writes `done`.
//! Whatever ends it (stop, length, stop string, loop, cancellation), everything produced is kept.

use std::time::Instant;

use super::budget::ForcedClose;
use super::mtp::step::Spec;
use super::request::GenerateRequest;
use super::sampler::{LogitSummary, Sampler, top_logprobs_of};
use super::sequence::DecodeSequence;
use crate::generator::{Generator, Outcome};
use crate::run::{Rounds, Run, emit_state, emit_stats, memory};
use deltascope_model::{Error, Result};
use deltascope_protocol::Control;
use deltascope_protocol::IncrementalDecoder;
use deltascope_protocol::PhaseTracker;
use deltascope_protocol::{
    Alternative, CountSource, Diagnostic, DiagnosticKind, DraftKind, EngineEvent, FinishContext, FinishReason, Marker,
    StartEvent, Tally, TokenPiece, Verdict,
};

/// Where the prompt starts in the sequence and how long it is (for naming a bad position).
#[derive(Clone, Copy)]
struct PromptSpan {
    at: usize,
    len: usize,
}

/// A forward pass that went non-finite ends the generation with finish `error` and a
/// `nonfinite` diagnostic naming where (everything generated before it is kept); any other error
/// fails the generation.
fn stop_on_nonfinite(
    run: &mut Run,
    source: &mut dyn DecodeSequence,
    e: Error,
    prompt: PromptSpan,
) -> Result<FinishReason> {
    let Error::NonFinite(nf) = e else { return Err(e) };
    let n = run.tokens.len();
    // The failing pass's state trace (the layers it ran, the ✖ heads among them), when tracing.
    emit_state(run, source, n.checked_sub(1));
    let token = if nf.position < prompt.at + prompt.len {
        format!("prompt token {} of {}", nf.position.saturating_sub(prompt.at) + 1, prompt.len)
    } else {
        format!("generated token {}", nf.position - prompt.at - prompt.len + 1)
    };
    let when = match n {
        0 => "before the first token".to_string(),
        1 => "after 1 token".to_string(),
        n => format!("after {n} tokens"),
    };
    let message = format!("{nf}, {token}; generation stopped {when}. What to check: {}", nf.advice());
    run.diagnostic(
        Diagnostic::new(DiagnosticKind::Nonfinite, n.saturating_sub(1), message)
            .at_head(nf.layer, nf.state_head.map(|(h, _)| h)),
    );
    Ok(FinishReason::Error)
}

impl Generator<'_> {
    /// Runs `req` on `source` (whose prompt has not been fed yet) to completion, cancellation or
    /// error.
    pub fn generate(
        &self,
        source: &mut dyn DecodeSequence,
        req: &GenerateRequest,
        control: &dyn Control,
        emit: &mut dyn FnMut(EngineEvent),
    ) -> Result<Outcome> {
        let started = Instant::now();
        let p = &req.params;
        self.validate(source, req)?;
        let phases = PhaseTracker::new(&self.tokenizer.specials, &req.prompt_ids);
        emit(EngineEvent::Start(StartEvent {
            model: self.model_name.clone(),
            prompt_tokens: Some(req.prompt_ids.len()),
            phase: phases.phase(),
            params: p.clone(),
            server: None,
            numerics: source.numerics(),
        }));
        let mut run = Run {
            tally: Tally::new(p, phases.phase(), CountSource::Engine, started),
            emit,
            phases,
            decoder: IncrementalDecoder::default(),
            sampler: Sampler::new(p.sampling.clone(), &req.prompt_ids),
            tokens: vec![],
            forced: vec![],
        };
        let close = ForcedClose::new(self.tokenizer, &p.budget_bridge)?;
        // The most max_tokens could be for this prompt (the fixes stay inside the context).
        let cap = source.context_len() - source.position() - req.prompt_ids.len();
        let prompt = PromptSpan { at: source.position(), len: req.prompt_ids.len() };
        // The state trace is per token: no drafting while tracing.
        let speculative = p.mtp.is_on() && !p.trace_state;
        if p.trace_state {
            source.trace_state()?;
        }
        let drafting = speculative && source.can_draft();
        let auto_slot = usize::from(run.sampler.is_greedy());
        let carried = self.auto.lock().map_or(None, |a| a[auto_slot]);
        let mut spec = speculative.then(|| Spec::new(p, carried));
        let mut prefill_s = None;
        let finish = match self.prefill(&mut run, source, req, control, drafting, prompt) {
            Ok(Ok((logits, secs))) => {
                prefill_s = Some(secs);
                self.decode_loop(&mut run, source, req, control, logits, &close, &mut spec, prompt)?
            }
            Ok(Err(finish)) => finish,
            Err(e) => return Err(e),
        };
        let tail = run.decoder.finish();
        run.tally.add_tail(&tail);
        if let (Some(v), Ok(mut a)) = (spec.as_ref().and_then(|s| s.control.verdict()), self.auto.lock()) {
            a[auto_slot] = Some(v);
        }
        let mtp = spec.map(|s| s.stats);
        let ctx = FinishContext {
            cap: Some(cap),
            forced_close: (close.len(), true),
            // No prefill time when the prompt was never read through (cancelled first, or
            // stopped by a non-finite value): no rate rather than an absurd one.
            prefill_tok_s: Some(prefill_s.filter(|&s| s > 0.0).map_or(0.0, |s| prompt.len as f64 / s)),
            memory: Some(memory(source, mtp.as_ref())),
            mtp: mtp.clone(),
            reported: deltascope_protocol::Reported { prompt_tokens: Some(prompt.len), ..Default::default() },
            ..Default::default()
        };
        let Run { tally, tokens, forced, emit, .. } = run;
        let done = tally.finish(finish, ctx, emit);
        let d = done.done;
        Ok(Outcome {
            finish_reason: finish,
            tokens,
            forced,
            usage: d.usage,
            timing: d.timing,
            thinking: d.thinking,
            answer: d.answer,
            diagnostics: done.diagnostics,
            mtp,
        })
    }

    /// What `check()` cannot know: the prompt, the context and the tokenizer's `</think>`.
    fn validate(&self, source: &dyn DecodeSequence, req: &GenerateRequest) -> Result<()> {
        let p = &req.params;
        if req.prompt_ids.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty".into()));
        }
        p.check().map_err(|problem| Error::InvalidArgument(problem.to_string()))?;
        let needed = source.position() + req.prompt_ids.len() + p.max_tokens;
        if needed > source.context_len() {
            return Err(Error::ContextOverflow { needed, max: source.context_len() });
        }
        if p.thinking.budget().is_some() && self.tokenizer.specials.think_end.is_none() {
            return Err(Error::InvalidArgument(
                "this tokenizer has no </think> token, so a thinking budget cannot be enforced".into(),
            ));
        }
        Ok(())
    }

    /// Reads the prompt (and, when drafting, lets the MTP head read it too: part of prefill,
    /// not decode). `Ok(Err(finish))` when it ended before a token: cancelled or non-finite.
    fn prefill(
        &self,
        run: &mut Run,
        source: &mut dyn DecodeSequence,
        req: &GenerateRequest,
        control: &dyn Control,
        drafting: bool,
        prompt: PromptSpan,
    ) -> Result<std::result::Result<(Vec<f32>, f64), FinishReason>> {
        if !control.proceed() {
            return Ok(Err(FinishReason::Cancelled));
        }
        // Timed from here: step mode may have held the request in `proceed` first.
        let reading = Instant::now();
        let read = source.feed(&req.prompt_ids).and_then(|l| {
            if drafting {
                source.catch_up_draft()?;
            }
            Ok(l)
        });
        match read {
            Ok(l) => {
                let secs = reading.elapsed().as_secs_f64();
                emit_state(run, source, None);
                Ok(Ok((l, secs)))
            }
            Err(e) => Ok(Err(stop_on_nonfinite(run, source, e, prompt)?)),
        }
    }

    /// Token by token until something ends the generation.
    #[allow(clippy::too_many_arguments)]
    fn decode_loop(
        &self,
        run: &mut Run,
        source: &mut dyn DecodeSequence,
        req: &GenerateRequest,
        control: &dyn Control,
        first: Vec<f32>,
        close: &ForcedClose,
        spec: &mut Option<Spec>,
        prompt: PromptSpan,
    ) -> Result<FinishReason> {
        let mut logits = first;
        let mut utf8_grace = 0;
        loop {
            if !control.proceed() {
                return Ok(FinishReason::Cancelled);
            }
            if control.end_thinking_requested() {
                run.tally.request_end_of_thinking();
            }
            // The thinking budget (once spent) or a loop's rescue: force the end of thinking —
            // after completing a UTF-8 character the model is in the middle of (at most 4 more
            // tokens).
            if run.tally.budget_spent() || run.tally.rescue_due() {
                if run.decoder.has_pending() && utf8_grace < 4 {
                    utf8_grace += 1;
                } else {
                    match close.force(self, run, source, &logits, req) {
                        Ok(Rounds::Fed(next)) => logits = next,
                        Ok(Rounds::Finished(f)) => return Ok(f),
                        Err(e) => return stop_on_nonfinite(run, source, e, prompt),
                    }
                    continue;
                }
            }
            let id = run.sampler.sample(&logits);
            if let Verdict::Finish(f) = self.append(run, req, id, false, &logits, DraftKind::None) {
                return Ok(f);
            }
            let fed = match spec.as_mut() {
                Some(sp) if source.can_draft() => self.speculate(run, source, req, id, control, sp),
                _ => source.feed(&[id]).map(Rounds::Fed),
            };
            match fed {
                Ok(Rounds::Finished(f)) => return Ok(f),
                Ok(Rounds::Fed(next)) => {
                    let at = run.tokens.len() - 1;
                    emit_state(run, source, Some(at));
                    logits = next;
                }
                Err(e) => return stop_on_nonfinite(run, source, e, prompt),
            }
            emit_stats(run, source, spec.as_ref().map(|s| &s.stats));
        }
    }

    /// Appends one generated or forced token to the tally (which emits it and checks every
    /// stop condition).
    pub(super) fn append(
        &self,
        run: &mut Run,
        req: &GenerateRequest,
        id: u32,
        forced: bool,
        logits: &[f32],
        draft: DraftKind,
    ) -> Verdict {
        let p = &req.params;
        let step = run.phases.step(id);
        let stop = (step.is_stop && !p.ignore_eos) || p.stop_token_ids.contains(&id);
        let text = if stop { String::new() } else { run.decoder.push(self.tokenizer, id) };
        let marker = match step.is_marker {
            false => None,
            true if Some(id) == self.tokenizer.specials.think_end => Some(Marker::Close),
            true => Some(Marker::Open),
        };
        let (logprob, top, entropy) = if forced {
            (0.0, vec![], None)
        } else {
            let summary = LogitSummary::of(logits);
            let top = top_logprobs_of(logits, &summary, p.top_logprobs)
                .into_iter()
                .map(|a| Alternative { id: Some(a.id), logprob: a.logprob, text: self.tokenizer.decode(&[a.id]) })
                .collect();
            (summary.logprob(logits, id), top, Some(summary.entropy))
        };
        run.tokens.push(id);
        run.forced.push(forced);
        run.sampler.observe(id);
        let piece = TokenPiece {
            id: Some(id),
            text,
            phase: step.phase,
            marker,
            forced,
            stop,
            logprob: Some(logprob),
            top,
            entropy,
            draft: Some(draft),
        };
        run.tally.push(piece, run.emit)
    }
}
