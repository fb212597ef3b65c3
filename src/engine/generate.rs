//! The generation loop: prefill, then token by token — sampling, phase tracking, the thinking
//! budget (forced bridge + `</think>`), stop conditions, the loop alarm — emitting events as it
//! goes. Whatever ends it (stop, length, stop string, loop, cancellation), everything produced is
//! kept and reported in `done`.

use std::time::Instant;

use super::request::GenerateRequest;
use super::sampler::{Rng, Sampler, entropy, logprob, top_logprobs};
use super::sequence::DecodeSequence;
use super::speculative::{DepthControl, prob, residual};
use super::state_trace::state_event;
use crate::chat::{IncrementalDecoder, TextTokenizer};
use crate::error::{Error, Result};
use crate::generation::MtpStats;
use crate::generation::advice::{self, Fix};
use crate::generation::control::Control;
use crate::generation::events::{
    Alternative, CountSource, Diagnostic, DiagnosticKind, DoneEvent, DraftKind, EngineEvent, FinishReason, Memory,
    Phase, StartEvent, StatsEvent, Timing, TokenEvent, Usage,
};
use crate::generation::phases::PhaseTracker;
use crate::generation::state::EXPLODED_NORM;
use crate::generation::watchdog::LoopDetector;

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

/// Generated tokens between two `stats` events.
const STATS_EVERY: usize = 8;

pub struct Generator<'a> {
    pub tokenizer: &'a TextTokenizer,
    /// A label for the `start` event.
    pub model_name: String,
}

/// Running state of one generation.
struct Run<'e> {
    emit: &'e mut dyn FnMut(EngineEvent),
    phases: PhaseTracker,
    decoder: IncrementalDecoder,
    sampler: Sampler,
    watchdog: LoopDetector,
    tokens: Vec<u32>,
    forced: Vec<bool>,
    thinking: String,
    answer: String,
    usage: Usage,
    /// Thinking tokens the model generated (the budget counts these, not forced ones).
    thought: usize,
    diagnostics: Vec<(DiagnosticKind, usize)>,
    /// Where a stop string was found: (phase, byte offset in that phase's text).
    stop_cut: Option<(Phase, usize)>,
    started: Instant,
    /// Seconds from the start to the first generated token.
    first_token_at: Option<f64>,
    /// Tokens generated at the last `stats` event.
    stats_at: usize,
}

impl Run<'_> {
    fn diagnostic(&mut self, kind: DiagnosticKind, at_token: usize, message: String, loop_at: Option<(usize, usize)>) {
        self.push_diagnostic(Diagnostic {
            kind,
            at_token,
            message,
            period: loop_at.map(|l| l.0),
            start: loop_at.map(|l| l.1),
            fix: None,
            layer: None,
            head: None,
        });
    }

    /// A diagnostic with its one-key fixes.
    fn diagnostic_fix(&mut self, kind: DiagnosticKind, at_token: usize, message: String, fix: Fix) {
        self.push_diagnostic(Diagnostic {
            kind,
            at_token,
            message,
            period: None,
            start: None,
            fix: Some(fix),
            layer: None,
            head: None,
        });
    }

    fn push_diagnostic(&mut self, d: Diagnostic) {
        self.diagnostics.push((d.kind, d.at_token));
        (self.emit)(EngineEvent::Diagnostic(d));
    }
}

/// Speculative decoding state of one generation.
struct Spec {
    control: DepthControl,
    stats: MtpStats,
    draft_rng: Rng,
    /// When the previous step ended, and whether it was a plain one (for `auto`'s cost probe).
    last_step: Option<(Instant, bool)>,
}

impl Spec {
    /// Milliseconds since the previous step when it was of the same kind (a plain step after a
    /// plain step, a pass after a pass): each such interval is one step's whole cost, sampling
    /// and events included.
    fn step_ms(&mut self, plain: bool) -> Option<f64> {
        let now = Instant::now();
        let ms = match self.last_step {
            Some((t, was_plain)) if was_plain == plain => Some((now - t).as_secs_f64() * 1e3),
            _ => None,
        };
        self.last_step = Some((now, plain));
        ms
    }
}

/// How a run of speculative steps ended.
enum Rounds {
    Finished(FinishReason),
    /// Everything appended has been fed; these are the logits for the next position.
    Fed(Vec<f32>),
}

/// The state trace of the pass just fed, as a `state` event (when tracing is on), and the
/// first head whose state went non-finite or exploded as a `state_alarm` diagnostic (once).
fn emit_state(run: &mut Run, source: &mut dyn DecodeSequence, at_token: Option<usize>) {
    let Some(trace) = source.take_trace() else { return };
    let ev = state_event(&trace, at_token, source.position());
    let alarm = ev.alarm(EXPLODED_NORM);
    (run.emit)(EngineEvent::State(ev));
    let Some((layer, head, what)) = alarm else { return };
    if run.diagnostics.iter().any(|(k, _)| *k == DiagnosticKind::StateAlarm) {
        return;
    }
    let when = match at_token {
        None => "after the prompt".to_string(),
        Some(i) => format!("after reading generated token {i}"),
    };
    run.push_diagnostic(Diagnostic {
        kind: DiagnosticKind::StateAlarm,
        at_token: at_token.unwrap_or(0),
        message: format!(
            "layer {layer}, value head {head}: {what} {when}. What to check: layers.{layer}.linear_attn.* (A_log, dt_bias, in_proj_*, conv1d) and the GDN kernel"
        ),
        period: None,
        start: None,
        fix: None,
        layer: Some(layer),
        head: Some(head),
    });
}

/// A `stats` event every [`STATS_EVERY`] generated tokens (live gauges).
fn emit_stats(run: &mut Run, source: &dyn DecodeSequence, mtp: Option<&MtpStats>) {
    if run.tokens.len() < run.stats_at + STATS_EVERY {
        return;
    }
    run.stats_at = run.tokens.len();
    let since = run.first_token_at.unwrap_or(0.0);
    let tok_s = (run.tokens.len() - 1) as f64 / (run.started.elapsed().as_secs_f64() - since).max(1e-9);
    (run.emit)(EngineEvent::Stats(StatsEvent {
        generated: run.tokens.len(),
        thinking_tokens: run.usage.thinking_tokens,
        answer_tokens: run.usage.answer_tokens,
        counted: CountSource::Engine,
        tok_s,
        memory: Some(memory(source, mtp)),
        server_memory: None,
        mtp: mtp.cloned(),
    }));
}

/// Memory now, with the rollback tape of a verify pass counted: between steps the tape is
/// settled, but every step holds it while it verifies.
fn memory(source: &dyn DecodeSequence, mtp: Option<&MtpStats>) -> Memory {
    let mut m = source.memory();
    if let Some(s) = mtp {
        m.snapshot_bytes = m.snapshot_bytes.max(s.snapshot_bytes);
    }
    m
}

fn draw(dist: &[(u32, f64)], rng: &mut Rng) -> u32 {
    if dist.len() == 1 {
        return dist[0].0;
    }
    let mut u = rng.uniform();
    for &(id, p) in dist {
        if u < p {
            return id;
        }
        u -= p;
    }
    dist[dist.len() - 1].0
}

/// A forward pass that went non-finite ends the generation with finish `error` and a
/// `nonfinite` diagnostic naming where (everything generated before it is kept); any other error
/// fails the generation.
fn stop_on_nonfinite(run: &mut Run, e: Error, prompt_at: usize, prompt_len: usize) -> Result<FinishReason> {
    let Error::NonFinite(nf) = e else { return Err(e) };
    let n = run.tokens.len();
    let token = if nf.position < prompt_at + prompt_len {
        format!("prompt token {} of {prompt_len}", nf.position.saturating_sub(prompt_at) + 1)
    } else {
        format!("generated token {}", nf.position - prompt_at - prompt_len + 1)
    };
    let when = match n {
        0 => "before the first token".to_string(),
        1 => "after 1 token".to_string(),
        n => format!("after {n} tokens"),
    };
    run.push_diagnostic(Diagnostic {
        kind: DiagnosticKind::Nonfinite,
        at_token: n.saturating_sub(1),
        message: format!("{nf}, {token}; generation stopped {when}. What to check: {}", nf.advice()),
        period: None,
        start: None,
        fix: None,
        layer: nf.layer,
        head: nf.state_head.map(|(h, _)| h),
    });
    Ok(FinishReason::Error)
}

/// What appending one token decided.
enum After {
    Continue,
    Finish(FinishReason),
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
        if req.prompt_ids.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty".into()));
        }
        if p.max_tokens == 0 {
            return Err(Error::InvalidArgument("max_tokens must be at least 1".into()));
        }
        if p.top_logprobs > 20 {
            return Err(Error::InvalidArgument(format!("top_logprobs is {}, at most 20", p.top_logprobs)));
        }
        let needed = source.position() + req.prompt_ids.len() + p.max_tokens;
        if needed > source.context_len() {
            return Err(Error::ContextOverflow { needed, max: source.context_len() });
        }
        let specials = &self.tokenizer.specials;
        if p.thinking_budget.is_some() && specials.think_end.is_none() {
            return Err(Error::InvalidArgument(
                "this tokenizer has no </think> token, so a thinking budget cannot be enforced".into(),
            ));
        }
        let phases = PhaseTracker::new(specials, &req.prompt_ids);
        emit(EngineEvent::Start(StartEvent {
            model: self.model_name.clone(),
            prompt_tokens: Some(req.prompt_ids.len()),
            phase: phases.phase(),
            params: p.clone(),
            server: None,
        }));
        let mut run = Run {
            emit,
            phases,
            decoder: IncrementalDecoder::default(),
            sampler: Sampler::new(p.sampling.clone(), &req.prompt_ids),
            watchdog: LoopDetector::new(p.loop_detection.clone()),
            tokens: vec![],
            forced: vec![],
            thinking: String::new(),
            answer: String::new(),
            usage: Usage { prompt_tokens: req.prompt_ids.len(), ..Default::default() },
            thought: 0,
            diagnostics: vec![],
            stop_cut: None,
            started,
            first_token_at: None,
            stats_at: 0,
        };
        // The forced end of thinking: bridge text, `</think>`, blank line (Qwen's sequence).
        // Built without a budget too: its length sizes the fix offered for a starved answer.
        let forced_close: Option<Vec<u32>> = match specials.think_end {
            Some(end) => {
                let mut f = self.tokenizer.encode(&p.budget_bridge)?;
                f.push(end);
                f.extend(self.tokenizer.encode("\n\n")?);
                Some(f)
            }
            None => None,
        };
        // The most max_tokens could be for this prompt (the fixes stay inside the context).
        let cap = source.context_len() - source.position() - req.prompt_ids.len();

        let mut finish = FinishReason::Length;
        let mut prefill_s = 0.0;
        let prompt_at = source.position();
        let nonfinite = |run: &mut Run, e: Error| stop_on_nonfinite(run, e, prompt_at, req.prompt_ids.len());
        // The state trace is per token: no drafting while tracing.
        let speculative = (p.mtp.depth > 0 || p.mtp.auto) && !p.trace_state;
        if p.trace_state {
            source.trace_state()?;
        }
        let drafting = speculative && source.can_draft();
        let mut logits = if control.proceed() {
            // Timed from here: step mode may have held the request in `proceed` first.
            let reading = Instant::now();
            // With drafting on, the MTP head reads the prompt too: part of prefill, not decode.
            let read = source.feed(&req.prompt_ids).and_then(|l| {
                if drafting {
                    source.catch_up_draft()?;
                }
                Ok(l)
            });
            match read {
                Ok(l) => {
                    prefill_s = reading.elapsed().as_secs_f64();
                    emit_state(&mut run, source, None);
                    Some(l)
                }
                Err(e) => {
                    finish = nonfinite(&mut run, e)?;
                    None
                }
            }
        } else {
            finish = FinishReason::Cancelled;
            None
        };
        let mut utf8_grace = 0;
        // Speculative decoding, when asked for and the model can draft.
        let mut spec = speculative.then(|| Spec {
            control: DepthControl::new(p.mtp),
            stats: MtpStats::new(DepthControl::new(p.mtp).depth),
            draft_rng: Rng::new(p.sampling.seed ^ 0x6d74_705f_6472_6166),
            last_step: None,
        });
        while let Some(l) = logits.take() {
            if !control.proceed() {
                finish = FinishReason::Cancelled;
                break;
            }
            // The thinking budget: once spent, force the end of thinking — after completing a
            // UTF-8 character the model is in the middle of (at most 4 more tokens).
            let budget_spent =
                run.phases.phase() == Phase::Thinking && p.thinking_budget.is_some_and(|b| run.thought >= b);
            if let (true, Some(close)) = (budget_spent, forced_close.as_ref().filter(|_| p.thinking_budget.is_some())) {
                if run.decoder.has_pending() && utf8_grace < 4 {
                    utf8_grace += 1;
                } else {
                    let room = p.max_tokens - run.tokens.len();
                    let block = &close[..close.len().min(room)];
                    let at = run.tokens.len();
                    let budget = p.thinking_budget.unwrap_or(0);
                    run.diagnostic(
                        DiagnosticKind::ThinkingBudgetForced,
                        at,
                        format!("thinking budget of {budget} tokens spent: the engine forced the end of thinking ({} tokens: bridge text, </think>, blank line)", close.len()),
                        None,
                    );
                    let mut end = None;
                    for &id in block {
                        if let After::Finish(f) = self.append(&mut run, req, id, true, &l, DraftKind::None) {
                            end = Some(f);
                            break;
                        }
                    }
                    if block.len() < close.len() {
                        end.get_or_insert(FinishReason::Length);
                    }
                    if let Some(f) = end {
                        finish = f;
                        break;
                    }
                    match source.feed(block) {
                        Ok(l) => {
                            emit_state(&mut run, source, Some(at));
                            logits = Some(l)
                        }
                        Err(e) => finish = nonfinite(&mut run, e)?,
                    }
                    continue;
                }
            }
            let id = run.sampler.sample(&l);
            if let After::Finish(f) = self.append(&mut run, req, id, false, &l, DraftKind::None) {
                finish = f;
                break;
            }
            let fed = match spec.as_mut() {
                Some(sp) if source.can_draft() => self.speculate(&mut run, source, req, id, control, sp),
                _ => source.feed(&[id]).map(Rounds::Fed),
            };
            match fed {
                Ok(Rounds::Finished(f)) => {
                    finish = f;
                    break;
                }
                Ok(Rounds::Fed(next)) => {
                    let at = run.tokens.len() - 1;
                    emit_state(&mut run, source, Some(at));
                    logits = Some(next)
                }
                Err(e) => {
                    finish = nonfinite(&mut run, e)?;
                    break;
                }
            }
            emit_stats(&mut run, source, spec.as_ref().map(|s| &s.stats));
        }

        // Bytes of an incomplete character at the very end.
        let tail = run.decoder.finish();
        match run.phases.phase() {
            Phase::Thinking => run.thinking.push_str(&tail),
            Phase::Answer => run.answer.push_str(&tail),
        }
        if let Some((phase, at)) = run.stop_cut {
            match phase {
                Phase::Thinking => {
                    run.thinking.truncate(at);
                    run.answer.clear();
                }
                Phase::Answer => run.answer.truncate(at),
            }
        }
        let last = run.tokens.len().saturating_sub(1);
        if finish == FinishReason::Length {
            let max = p.max_tokens;
            if run.phases.phase() == Phase::Thinking && run.usage.answer_tokens > 0 {
                // The model answered, then re-opened <think>: the answer is there, cut.
                let message = format!(
                    "max_tokens cut the answer after {} answer tokens: the model re-opened <think> after answering and was still thinking",
                    run.usage.answer_tokens
                );
                run.diagnostic_fix(DiagnosticKind::AnswerTruncated, last, message, advice::truncated(max, false, cap));
            } else if run.phases.phase() == Phase::Thinking {
                let forced = forced_close.as_ref().map_or(0, Vec::len);
                let (fix, message) =
                    advice::starved(max, run.usage.thinking_tokens, p.thinking_budget, (forced, true), cap);
                run.diagnostic_fix(DiagnosticKind::ThinkingExhaustedMaxTokens, last, message, fix);
            } else {
                let by_budget = p.answer_budget.is_some_and(|b| run.usage.answer_tokens >= b);
                let by = if by_budget { "the answer budget" } else { "max_tokens" };
                let message = format!("{by} cut the answer after {} answer tokens", run.usage.answer_tokens);
                run.diagnostic_fix(
                    DiagnosticKind::AnswerTruncated,
                    last,
                    message,
                    advice::truncated(max, by_budget, cap),
                );
            }
        }
        run.usage.completion_tokens = run.usage.thinking_tokens + run.usage.forced_tokens + run.usage.answer_tokens;
        let total = started.elapsed().as_secs_f64();
        let ttft = run.first_token_at.unwrap_or(total);
        let n = run.tokens.len();
        let timing = Timing {
            ttft_ms: ttft * 1e3,
            // No prefill time when the prompt was never read through (cancelled first, or
            // stopped by a non-finite value): no rate rather than an absurd one.
            prefill_tok_s: if prefill_s > 0.0 { req.prompt_ids.len() as f64 / prefill_s } else { 0.0 },
            decode_tok_s: if n > 1 { (n - 1) as f64 / (total - ttft).max(1e-9) } else { 0.0 },
            total_ms: total * 1e3,
        };
        let mtp = spec.map(|s| s.stats);
        (run.emit)(EngineEvent::Done(DoneEvent {
            finish_reason: finish,
            usage: run.usage.clone(),
            timing: timing.clone(),
            memory: Some(memory(source, mtp.as_ref())),
            server_memory: None,
            mtp: mtp.clone(),
            thinking: run.thinking.clone(),
            answer: run.answer.clone(),
        }));
        Ok(Outcome {
            finish_reason: finish,
            tokens: run.tokens,
            forced: run.forced,
            usage: run.usage,
            timing,
            thinking: run.thinking,
            answer: run.answer,
            diagnostics: run.diagnostics,
            mtp,
        })
    }

    /// Speculative steps starting from `x`, a token just appended but not fed yet. Each step
    /// drafts, verifies `[x, d1..dk]`, appends the accepted drafts and the verify pass's own token
    /// (which becomes the next `x`), and keeps exactly what was appended. Drafting never crosses a
    /// point where the engine must force tokens or stop (max_tokens, the thinking or answer
    /// budget): there the depth shrinks, and at zero the token is fed plainly and control returns
    /// to the main loop.
    fn speculate(
        &self,
        run: &mut Run,
        source: &mut dyn DecodeSequence,
        req: &GenerateRequest,
        mut x: u32,
        control: &dyn Control,
        spec: &mut Spec,
    ) -> Result<Rounds> {
        let p = &req.params;
        loop {
            let room = p.max_tokens - run.tokens.len();
            let mut k = spec.control.depth.min(room.saturating_sub(1));
            match run.phases.phase() {
                Phase::Thinking => {
                    if let Some(b) = p.thinking_budget {
                        k = k.min(b.saturating_sub(run.thought).saturating_sub(1));
                    }
                }
                Phase::Answer => {
                    if let Some(b) = p.answer_budget {
                        k = k.min(b.saturating_sub(run.usage.answer_tokens).saturating_sub(1));
                    }
                }
            }
            if k == 0 {
                let logits = source.feed(&[x])?;
                let ms = spec.step_ms(true);
                spec.control.observe_plain(ms);
                return Ok(Rounds::Fed(logits));
            }
            if !control.proceed() {
                return Ok(Rounds::Finished(FinishReason::Cancelled));
            }
            // Draft: each token drawn from the draft distribution q (with its own generator, so
            // draft and acceptance randomness stay independent).
            let t0 = Instant::now();
            let mut ds = run.sampler.clone();
            let mut q_dists = vec![];
            let rng = &mut spec.draft_rng;
            let drafts = source.draft(x, k, &mut |logits| {
                let q = ds.distribution(logits);
                let d = draw(&q, rng);
                ds.observe(d);
                q_dists.push(q);
                d
            })?;
            let t1 = Instant::now();
            let mut block = vec![x];
            block.extend(drafts.iter().map(|d| d.0));
            let rows = source.verify(&block)?;
            spec.stats.draft_ms += (t1 - t0).as_secs_f64() * 1e3;
            spec.stats.verify_ms += t1.elapsed().as_secs_f64() * 1e3;
            spec.stats.snapshot_bytes = source.rollback_bytes();

            let mut accepted = 0;
            let mut produced = 0;
            let mut end = None;
            let mut next = None;
            for (i, (d, _)) in drafts.iter().enumerate() {
                let target = run.sampler.distribution(&rows[i]);
                let ok = if run.sampler.is_greedy() {
                    target[0].0 == *d
                } else {
                    run.sampler.uniform() < (prob(&target, *d) / prob(&q_dists[i], *d)).min(1.0)
                };
                if ok {
                    accepted += 1;
                    produced += 1;
                    if let After::Finish(f) = self.append(run, req, *d, false, &rows[i], DraftKind::Accepted) {
                        end = Some(f);
                        break;
                    }
                } else {
                    let fix = if run.sampler.is_greedy() {
                        target[0].0
                    } else {
                        run.sampler.draw(&residual(&target, &q_dists[i]))
                    };
                    produced += 1;
                    next = Some(fix);
                    if let After::Finish(f) = self.append(run, req, fix, false, &rows[i], DraftKind::Bonus) {
                        end = Some(f);
                    }
                    break;
                }
            }
            if end.is_none() && next.is_none() {
                // Every draft held: the pass's last row gives one more token.
                let bonus = run.sampler.sample(&rows[accepted]);
                produced += 1;
                next = Some(bonus);
                if let After::Finish(f) = self.append(run, req, bonus, false, &rows[accepted], DraftKind::Bonus) {
                    end = Some(f);
                }
            }
            source.accept(1 + accepted)?;
            spec.stats.record(drafts.len(), accepted, produced);
            let ms = spec.step_ms(false);
            spec.control.observe(drafts.len(), accepted, produced, ms);
            spec.stats.depth = spec.control.depth;
            emit_stats(run, source, Some(&spec.stats));
            if let Some(f) = end {
                return Ok(Rounds::Finished(f));
            }
            x = next.unwrap_or_else(|| unreachable!("a verify pass always yields a token or a finish"));
            // Where the engine must force next (the thinking budget just ran out), hand back.
            let budget_spent =
                run.phases.phase() == Phase::Thinking && p.thinking_budget.is_some_and(|b| run.thought >= b);
            if budget_spent {
                return Ok(Rounds::Fed(source.feed(&[x])?));
            }
        }
    }

    /// Appends one generated or forced token: events, counters, texts and every stop check.
    fn append(
        &self,
        run: &mut Run,
        req: &GenerateRequest,
        id: u32,
        forced: bool,
        logits: &[f32],
        draft: DraftKind,
    ) -> After {
        let p = &req.params;
        run.first_token_at.get_or_insert_with(|| run.started.elapsed().as_secs_f64());
        let step = run.phases.step(id);
        let is_stop = (step.is_stop && !p.ignore_eos) || p.stop_token_ids.contains(&id);
        let text = if is_stop { String::new() } else { run.decoder.push(self.tokenizer, id) };
        let index = run.tokens.len();
        // Forced tokens are counted apart: thinking and answer count what the model generated.
        match (forced, step.phase) {
            (true, _) => run.usage.forced_tokens += 1,
            (false, Phase::Thinking) => run.usage.thinking_tokens += 1,
            (false, Phase::Answer) => run.usage.answer_tokens += 1,
        }
        match step.phase {
            Phase::Thinking => {
                // The budget counts thinking content, not the <think> / </think> markers.
                if !forced && !step.is_marker {
                    run.thought += 1;
                }
                if !step.is_marker {
                    run.thinking.push_str(&text);
                }
            }
            Phase::Answer => {
                if !step.is_marker {
                    run.answer.push_str(&text);
                }
            }
        }
        let (lp, alts) = if forced {
            (0.0, vec![])
        } else {
            let alts = top_logprobs(logits, p.top_logprobs)
                .into_iter()
                .map(|a| Alternative { id: Some(a.id), logprob: a.logprob, text: self.tokenizer.decode(&[a.id]) })
                .collect();
            (logprob(logits, id), alts)
        };
        (run.emit)(EngineEvent::Token(TokenEvent {
            index,
            phase: step.phase,
            id: Some(id),
            text,
            logprob: Some(lp),
            draft: Some(draft),
            forced,
            top_logprobs: alts,
            entropy: (!forced).then(|| entropy(logits)),
        }));
        run.tokens.push(id);
        run.forced.push(forced);
        run.sampler.observe(id);

        if let Some(r) = run.watchdog.push(id) {
            run.diagnostic(
                DiagnosticKind::DegenerateLoop,
                r.at,
                format!(
                    "degenerate loop: a {}-token pattern repeats from token {} on{}",
                    r.period,
                    r.start,
                    if p.loop_detection.auto_stop { "; stopping" } else { "" }
                ),
                Some((r.period, r.start)),
            );
            if p.loop_detection.auto_stop {
                return After::Finish(FinishReason::Loop);
            }
        }
        if is_stop {
            return After::Finish(FinishReason::Stop);
        }
        if !p.stop.is_empty() {
            let (phase, buf) = match step.phase {
                Phase::Thinking => (Phase::Thinking, &run.thinking),
                Phase::Answer => (Phase::Answer, &run.answer),
            };
            // Only the tail can hold a newly completed stop string.
            let longest = p.stop.iter().map(String::len).max().unwrap_or(0);
            let mut from = buf.len().saturating_sub(longest + 8);
            while !buf.is_char_boundary(from) {
                from -= 1;
            }
            if let Some(at) = p
                .stop
                .iter()
                .filter(|s| !s.is_empty())
                .filter_map(|s| buf[from..].find(s.as_str()).map(|i| from + i))
                .min()
            {
                run.stop_cut = Some((phase, at));
                return After::Finish(FinishReason::StopString);
            }
        }
        if run.tokens.len() >= p.max_tokens {
            return After::Finish(FinishReason::Length);
        }
        if step.phase == Phase::Answer
            && !step.is_marker
            && p.answer_budget.is_some_and(|b| run.usage.answer_tokens >= b)
        {
            return After::Finish(FinishReason::Length);
        }
        After::Continue
    }
}
