//! The one bookkeeping of a generation: what it produced so far, whoever produced it. The local
//! engine pushes the tokens it samples or forces; the remote frame mapper pushes the pieces a
//! server streams. From those alone the tally keeps the counts (thinking / answer / forced, and
//! the thinking the budget counts), the texts, the stop-string cut, the loop alarm, the `stats`
//! cadence and the arrival times — and at the end it writes the length diagnostics, the usage,
//! the timing and the `done` event. Neither producer counts anything by itself, so every
//! backend reports the same numbers for the same tokens.

use std::collections::HashMap;
use std::time::Instant;

use super::advice;
use super::events::{
    Alternative, CountSource, Diagnostic, DiagnosticKind, DoneEvent, DraftKind, EngineEvent, FinishReason, Memory,
    MtpStats, Phase, ServerMemory, StatsEvent, Timing, TokenEvent, Usage,
};
use super::params::GenerationParams;
use super::watchdog::{LoopDetector, LoopReport, OnLoop};

/// Generated tokens between two `stats` events (live gauges), on every backend.
pub const STATS_EVERY: usize = 8;

/// One token as its producer saw it.
#[derive(Debug, Clone, Default)]
pub struct TokenPiece {
    /// `None` when a server did not say.
    pub id: Option<u32>,
    /// The text it completes (empty for stop tokens and inside a UTF-8 character).
    pub text: String,
    /// The phase it counts in (`</think>` counts as thinking: it closes it).
    pub phase: Phase,
    /// A `<think>` / `</think>` marker: counted, kept out of the texts.
    pub marker: Option<Marker>,
    /// Injected (the thinking-budget bridge and `</think>`), not sampled.
    pub forced: bool,
    /// A stop token: generation ends here (finish `stop`).
    pub stop: bool,
    pub logprob: Option<f32>,
    pub top: Vec<Alternative>,
    pub entropy: Option<f32>,
    pub draft: Option<DraftKind>,
}

/// The markers that open and close thinking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// `<think>`
    Open,
    /// `</think>`
    Close,
}

/// What one pushed token decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Continue,
    Finish(FinishReason),
}

/// What a server reported about the whole request (its `usage`, and deltascope's extension):
/// tokens it generated without streaming them (`</think>`, the blank line, `<|im_end|>`) are
/// only known from here.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reported {
    pub prompt_tokens: Option<usize>,
    /// Where `prompt_tokens` came from when no usage frame said it (the stream was closed
    /// before it, or the server sends none): an estimate, marked as one.
    pub prompt_estimate: Option<String>,
    pub completion_tokens: Option<usize>,
    /// Thinking as the server counts it (forced tokens inside thinking included).
    pub reasoning_tokens: Option<usize>,
    /// deltascope's own split (`serve`'s extension): exact.
    pub split: Option<(usize, usize, usize)>,
}

/// What only the producer knows when the generation ends.
#[derive(Debug, Clone, Default)]
pub struct FinishContext {
    /// The most max_tokens could be for this prompt (the fixes stay inside the context);
    /// `None` when the context is not known (a server).
    pub cap: Option<usize>,
    /// Tokens a forced end of thinking takes, and whether counted with the tokenizer.
    pub forced_close: (usize, bool),
    /// Prompt tokens per second (measured by the engine, or the server's timings).
    pub prefill_tok_s: Option<f64>,
    pub reported: Reported,
    pub memory: Option<Memory>,
    pub server_memory: Option<ServerMemory>,
    pub mtp: Option<MtpStats>,
    /// Why the forced-token count is an estimate, when the producer cannot tell.
    pub forced_estimate: Option<String>,
}

/// A forced end of thinking asked for by a loop or by the user.
#[derive(Debug, Clone, Copy)]
struct Rescue {
    report: Option<LoopReport>,
    by_user: bool,
}

/// The tally of one generation.
pub struct Tally {
    params: GenerationParams,
    phase: Phase,
    generated: usize,
    /// Each token's id, where known.
    ids: Vec<Option<u32>>,
    thinking: String,
    answer: String,
    thinking_tokens: usize,
    answer_tokens: usize,
    forced_tokens: usize,
    /// Thinking tokens the model generated (the budget counts these, not forced ones nor the
    /// markers).
    budgeted: usize,
    counted: CountSource,
    watchdog: LoopDetector,
    /// A forced end of thinking is due (`--on-loop answer`, or the user's key): the loop that
    /// asked for it, when one did.
    rescue: Option<Rescue>,
    /// Every loop the detector reported.
    loop_reports: Vec<LoopReport>,
    /// Loop keys for tokens that arrive without an id (their texts).
    text_keys: HashMap<String, u32>,
    /// Where a stop string was found: (phase, byte offset in that phase's text).
    stop_cut: Option<(Phase, usize)>,
    /// The kinds raised so far, with the token each names.
    raised: Vec<(DiagnosticKind, usize)>,
    /// A `</think>` came (streamed or implied): the index after which the answer began.
    closed_at: Option<usize>,
    /// The close was a streamed marker (a server that splits reasoning does not stream it).
    marker_streamed: bool,
    started: Instant,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    stats_at: usize,
}

impl Tally {
    /// `started` is when the request was made (time to first token counts from it).
    pub fn new(params: &GenerationParams, phase: Phase, counted: CountSource, started: Instant) -> Self {
        Tally {
            watchdog: LoopDetector::new(params.loop_detection.clone()),
            rescue: None,
            loop_reports: vec![],
            params: params.clone(),
            phase,
            generated: 0,
            ids: vec![],
            thinking: String::new(),
            answer: String::new(),
            thinking_tokens: 0,
            answer_tokens: 0,
            forced_tokens: 0,
            budgeted: 0,
            counted,
            text_keys: HashMap::new(),
            stop_cut: None,
            raised: vec![],
            closed_at: None,
            marker_streamed: false,
            started,
            first_at: None,
            last_at: None,
            stats_at: 0,
        }
    }

    pub fn params(&self) -> &GenerationParams {
        &self.params
    }

    /// The phase the next token is in.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Tokens pushed so far.
    pub fn generated(&self) -> usize {
        self.generated
    }

    /// Each pushed token's id (`None` where a server did not say).
    pub fn ids(&self) -> &[Option<u32>] {
        &self.ids
    }

    /// Tokens left before max_tokens.
    pub fn room(&self) -> usize {
        self.params.max_tokens.saturating_sub(self.generated)
    }

    pub fn answer_tokens(&self) -> usize {
        self.answer_tokens
    }

    /// The thinking tokens the budget counts.
    pub fn budgeted_thinking(&self) -> usize {
        self.budgeted
    }

    /// Thinking budget tokens left (`None`: no budget).
    pub fn budget_left(&self) -> Option<usize> {
        self.params.thinking.budget().map(|b| b.saturating_sub(self.budgeted))
    }

    /// Answer-budget tokens left (`None`: no answer budget).
    pub fn answer_budget_left(&self) -> Option<usize> {
        self.params.answer_budget.map(|b| b.saturating_sub(self.answer_tokens))
    }

    /// In thinking with the thinking budget spent: the end of thinking must be forced now.
    pub fn budget_spent(&self) -> bool {
        self.phase == Phase::Thinking && self.budget_left() == Some(0)
    }

    /// The thinking so far (without markers).
    pub fn thinking_text(&self) -> &str {
        &self.thinking
    }

    /// The diagnostics raised so far: (kind, at_token).
    pub fn raised(&self) -> &[(DiagnosticKind, usize)] {
        &self.raised
    }

    /// How the counts were obtained (a remote stream learns it as frames arrive).
    pub fn set_counted(&mut self, counted: CountSource) {
        self.counted = counted;
    }

    /// A server's reasoning parser took `</think>` out of the stream: thinking ended here.
    pub fn close_thinking(&mut self) {
        if self.phase == Phase::Thinking {
            self.phase = Phase::Answer;
            self.closed_at = Some(self.generated);
            // Thinking ended by itself before a rescue came: nothing left to rescue.
            self.rescue = None;
        }
    }

    /// Records and emits a diagnostic.
    pub fn diagnostic(&mut self, d: Diagnostic, emit: &mut dyn FnMut(EngineEvent)) {
        self.raised.push((d.kind, d.at_token));
        emit(EngineEvent::Diagnostic(d));
    }

    /// The thinking budget ran out and `who` forces the end of thinking from the next token on.
    pub fn budget_forced(&mut self, who: &str, forced: Option<usize>, emit: &mut dyn FnMut(EngineEvent)) {
        let budget = self.params.thinking.budget().unwrap_or(0);
        let how_many = forced.map(|n| format!("{n} tokens: ")).unwrap_or_default();
        let d = Diagnostic::new(
            DiagnosticKind::ThinkingBudgetForced,
            self.generated,
            format!(
                "thinking budget of {budget} tokens spent after {} thinking tokens: {who} forced the end of thinking ({how_many}bridge text, </think>); the answer follows unfinished thinking and may be wrong (a larger budget shows whether the cut changed it)",
                self.budgeted
            ),
        );
        self.diagnostic(d, emit);
    }

    /// In thinking with a rescue asked for (a loop under `--on-loop answer`, or the user's
    /// key): the end of thinking must be forced now, as when the budget is spent.
    pub fn rescue_due(&self) -> bool {
        self.phase == Phase::Thinking && self.rescue.is_some()
    }

    /// The user asked to end thinking now (the TUI's key on a loop banner): the producer forces
    /// the end of thinking before its next token. Ignored outside thinking.
    pub fn request_end_of_thinking(&mut self) {
        if self.phase == Phase::Thinking && self.rescue.is_none() {
            self.rescue = Some(Rescue { report: self.last_loop(), by_user: true });
        }
    }

    /// The last loop reported, if any (from its diagnostic).
    fn last_loop(&self) -> Option<LoopReport> {
        self.loop_reports.last().copied()
    }

    /// `who` forces the end of thinking from the next token on (`forced` tokens, when known):
    /// because a rescue is due, or because the thinking budget is spent.
    pub fn forced_close(&mut self, who: &str, forced: Option<usize>, emit: &mut dyn FnMut(EngineEvent)) {
        match self.rescue.take() {
            Some(r) => self.loop_rescued(r, who, forced, emit),
            None => self.budget_forced(who, forced, emit),
        }
    }

    /// The `loop_rescued` diagnostic; the loop detector starts afresh for the answer (a loop
    /// there stops the generation, as `--on-loop stop` would).
    fn loop_rescued(&mut self, r: Rescue, who: &str, forced: Option<usize>, emit: &mut dyn FnMut(EngineEvent)) {
        let how_many = forced.map(|n| format!("{n} tokens: ")).unwrap_or_default();
        let what = format!("{who} forced the end of thinking ({how_many}bridge text, </think>) and the model answers");
        let at = self.generated;
        let d = match r.report {
            Some(l) => {
                let held = at.saturating_sub(l.start);
                let why = if r.by_user { "on the user's request" } else { "--on-loop answer" };
                Diagnostic::new(
                    DiagnosticKind::LoopRescued,
                    at,
                    format!(
                        "loop rescued ({why}): a {}-token pattern repeating from token {} held {held} tokens of thinking; {what}",
                        l.period, l.start
                    ),
                )
                .with_loop(l.period, l.start)
            }
            None => Diagnostic::new(
                DiagnosticKind::LoopRescued,
                at,
                format!("thinking ended on the user's request after {} thinking tokens; {what}", self.budgeted),
            ),
        };
        self.diagnostic(d, emit);
        self.watchdog.restart();
    }

    /// Appends one token: the `token` event, the counts, the texts and every stop check.
    pub fn push(&mut self, piece: TokenPiece, emit: &mut dyn FnMut(EngineEvent)) -> Verdict {
        let now = Instant::now();
        self.first_at.get_or_insert(now);
        self.last_at = Some(now);
        let index = self.generated;
        self.generated += 1;
        self.ids.push(piece.id);
        match (piece.forced, piece.phase) {
            (true, _) => self.forced_tokens += 1,
            (false, Phase::Thinking) => self.thinking_tokens += 1,
            (false, Phase::Answer) => self.answer_tokens += 1,
        }
        if piece.marker.is_none() {
            match piece.phase {
                Phase::Thinking => self.thinking.push_str(&piece.text),
                Phase::Answer => self.push_answer(&piece.text),
            }
        }
        if piece.phase == Phase::Thinking && !piece.forced && piece.marker.is_none() {
            self.budgeted += 1;
        }
        match piece.marker {
            Some(Marker::Open) => self.phase = Phase::Thinking,
            Some(Marker::Close) if self.phase == Phase::Thinking => {
                self.phase = Phase::Answer;
                self.closed_at = Some(self.generated);
                self.marker_streamed = true;
                self.rescue = None;
            }
            Some(Marker::Close) => {}
            None if piece.phase == Phase::Answer => self.close_thinking(),
            None => {}
        }
        // The loop alarm runs on token ids, or on token texts when the server sends no ids.
        let key = match piece.id {
            Some(id) => id,
            None => {
                let next = self.text_keys.len() as u32 | 0x8000_0000;
                *self.text_keys.entry(piece.text.clone()).or_insert(next)
            }
        };
        let phase = piece.phase;
        let marker = piece.marker;
        emit(EngineEvent::Token(TokenEvent {
            index,
            phase,
            id: piece.id,
            text: piece.text,
            logprob: piece.logprob,
            draft: piece.draft,
            forced: piece.forced,
            top_logprobs: piece.top,
            entropy: piece.entropy,
        }));
        if let Some(r) = self.watchdog.push(key) {
            self.loop_reports.push(r);
            let on_loop = self.params.loop_detection.on_loop;
            // A loop in thinking is rescued (still thinking after this token); elsewhere `answer`
            // stops as `stop` does.
            let rescue = on_loop == OnLoop::Answer && self.phase == Phase::Thinking;
            let stop = on_loop == OnLoop::Stop || (on_loop == OnLoop::Answer && !rescue);
            let then = match (stop, rescue) {
                (true, _) => "; stopping",
                (_, true) => "; ending thinking so that the model answers (--on-loop answer)",
                _ => "",
            };
            let d = Diagnostic::new(
                DiagnosticKind::DegenerateLoop,
                r.at,
                format!("degenerate loop: a {}-token pattern repeats from token {} on{then}", r.period, r.start),
            )
            .with_loop(r.period, r.start);
            self.diagnostic(d, emit);
            if stop {
                return Verdict::Finish(FinishReason::Loop);
            }
            if rescue && self.rescue.is_none() {
                self.rescue = Some(Rescue { report: Some(r), by_user: false });
            }
        }
        if piece.stop {
            return Verdict::Finish(FinishReason::Stop);
        }
        if let Some(at) = self.stop_string(phase) {
            self.stop_cut = Some((phase, at));
            return Verdict::Finish(FinishReason::StopString);
        }
        if self.generated >= self.params.max_tokens {
            return Verdict::Finish(FinishReason::Length);
        }
        if phase == Phase::Answer && marker.is_none() && self.answer_budget_left() == Some(0) {
            return Verdict::Finish(FinishReason::Length);
        }
        Verdict::Continue
    }

    /// Where a stop string now ends the text of `phase` (only the tail can hold a new one).
    fn stop_string(&self, phase: Phase) -> Option<usize> {
        let stops = &self.params.stop;
        if stops.is_empty() {
            return None;
        }
        let buf = match phase {
            Phase::Thinking => &self.thinking,
            Phase::Answer => &self.answer,
        };
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = buf.len().saturating_sub(longest + 8);
        while !buf.is_char_boundary(from) {
            from -= 1;
        }
        stops.iter().filter(|s| !s.is_empty()).filter_map(|s| buf[from..].find(s.as_str()).map(|i| from + i)).min()
    }

    /// A `stats` event when [`STATS_EVERY`] tokens arrived since the last one.
    pub fn stats_due(&mut self) -> bool {
        if self.generated < self.stats_at + STATS_EVERY {
            return false;
        }
        self.stats_at = self.generated;
        true
    }

    /// The running totals now.
    pub fn stats(
        &self,
        memory: Option<Memory>,
        server_memory: Option<ServerMemory>,
        mtp: Option<MtpStats>,
    ) -> StatsEvent {
        StatsEvent {
            generated: self.generated,
            thinking_tokens: self.thinking_tokens,
            answer_tokens: self.answer_tokens,
            counted: self.counted,
            tok_s: self.decode_rate(),
            memory,
            server_memory,
            mtp,
        }
    }

    /// Tokens after the first per second between the first and the last arrival: never more
    /// than what arrived allows (0 until two arrivals are apart in time).
    fn decode_rate(&self) -> f64 {
        match (self.first_at, self.last_at) {
            (Some(a), Some(b)) if self.generated > 1 && b > a => (self.generated - 1) as f64 / (b - a).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// `thinking (phase) + answer (phase)` as the user sees them: the incomplete character at
    /// the end added, a stop string cut off.
    pub fn add_tail(&mut self, tail: &str) {
        match self.phase {
            Phase::Thinking => self.thinking.push_str(tail),
            Phase::Answer => self.push_answer(tail),
        }
    }

    /// Answer text, without the line breaks the chat template puts after `</think>` (a server
    /// that splits reasoning drops them; the engine generates them as tokens): the answer reads
    /// the same on every backend.
    fn push_answer(&mut self, text: &str) {
        let text = if self.answer.is_empty() { text.trim_start_matches(['\n', '\r']) } else { text };
        self.answer.push_str(text);
    }

    /// The end of the generation: the length diagnostic (finish `length`), the usage, the
    /// timing and the `done` event.
    pub fn finish(mut self, finish: FinishReason, ctx: FinishContext, emit: &mut dyn FnMut(EngineEvent)) -> Finished {
        if let Some((phase, at)) = self.stop_cut {
            match phase {
                Phase::Thinking => {
                    self.thinking.truncate(at);
                    self.answer.clear();
                }
                Phase::Answer => self.answer.truncate(at),
            }
        }
        let usage = self.usage(&ctx);
        if finish == FinishReason::Length {
            let d = self.length_diagnostic(&usage, &ctx);
            self.diagnostic(d, emit);
        }
        let total = self.started.elapsed().as_secs_f64();
        // No token, no time to the first one (a request cancelled before it).
        let ttft = self.first_at.map(|t| (t - self.started).as_secs_f64());
        let prompt = usage.prompt_tokens as f64;
        let timing = Timing {
            ttft_ms: ttft.map(|s| s * 1e3),
            prefill_tok_s: ctx.prefill_tok_s.unwrap_or(match ttft {
                Some(s) if s > 0.0 && prompt > 0.0 => prompt / s,
                _ => 0.0,
            }),
            decode_tok_s: self.decode_rate(),
            total_ms: total * 1e3,
        };
        let done = DoneEvent {
            finish_reason: finish,
            usage,
            timing,
            mtp: ctx.mtp,
            memory: ctx.memory,
            server_memory: ctx.server_memory,
            thinking: self.thinking,
            answer: self.answer,
        };
        emit(EngineEvent::Done(done.clone()));
        Finished { done, diagnostics: self.raised }
    }

    /// The counts, reconciled with what a server reported (tokens it did not stream).
    fn usage(&self, ctx: &FinishContext) -> Usage {
        let r = &ctx.reported;
        let estimate = ctx.forced_estimate.clone();
        let prompt_tokens = r.prompt_tokens.unwrap_or(0);
        let prompt_estimate = r.prompt_estimate.clone();
        if let Some((thinking, answer, forced)) = r.split {
            return Usage {
                prompt_tokens,
                prompt_estimate,
                thinking_tokens: thinking,
                answer_tokens: answer,
                completion_tokens: thinking + answer + forced,
                forced_tokens: forced,
                counted: CountSource::ServerUsage,
                estimate,
            };
        }
        // A `</think>` the server did not stream: forced when the budget ended thinking, else
        // thinking the model generated.
        let hidden_close = usize::from(self.closed_at.is_some() && !self.marker_streamed);
        let forcing = self
            .raised
            .iter()
            .any(|(k, _)| matches!(k, DiagnosticKind::ThinkingBudgetForced | DiagnosticKind::LoopRescued));
        let forced = self.forced_tokens + if forcing { hidden_close } else { 0 };
        let mut thinking = self.thinking_tokens + if forcing { 0 } else { hidden_close };
        let streamed = self.generated + hidden_close;
        let completion = r.completion_tokens.unwrap_or(streamed).max(streamed);
        let mut counted = self.counted;
        if let Some(reasoning) = r.reasoning_tokens.filter(|&x| x > 0 || thinking == 0) {
            // The server counts its forced tokens inside thinking.
            thinking = reasoning.saturating_sub(forced).min(completion);
            counted = CountSource::ServerUsage;
        }
        Usage {
            prompt_tokens,
            prompt_estimate,
            thinking_tokens: thinking,
            // Tokens generated but not streamed (the blank line after `</think>`,
            // `<|im_end|>`) belong to the answer, as the engine counts them.
            answer_tokens: completion.saturating_sub(thinking + forced),
            completion_tokens: completion,
            forced_tokens: forced,
            counted,
            estimate,
        }
    }

    fn length_diagnostic(&self, usage: &Usage, ctx: &FinishContext) -> Diagnostic {
        let max = self.params.max_tokens;
        let last = self.generated.saturating_sub(1);
        // A server's context is not known here: the TUI caps the fix by it when applying it.
        let cap = ctx.cap.unwrap_or(usize::MAX / 4);
        let by_budget = self.params.answer_budget.is_some_and(|b| usage.answer_tokens >= b);
        // Stopped for length short of max_tokens: the context ran out (a server says only
        // `length`); raising max_tokens would not help.
        if !by_budget && usage.completion_tokens > 0 && usage.completion_tokens < max {
            let kind = if self.phase == Phase::Thinking {
                DiagnosticKind::ThinkingExhaustedMaxTokens
            } else {
                DiagnosticKind::AnswerTruncated
            };
            let prompt = match usage.prompt_tokens {
                0 => String::new(),
                p => format!("{p} prompt + "),
            };
            let message = format!(
                "the context was the limit, not max_tokens: generation stopped at {prompt}{} generated tokens, {} short of max_tokens ({max}){}; a longer answer needs a shorter prompt or history, or a longer context",
                usage.completion_tokens,
                max - usage.completion_tokens,
                if self.phase == Phase::Thinking { ", inside thinking: the answer is empty" } else { "" }
            );
            return Diagnostic::new(kind, last, message);
        }
        if self.phase == Phase::Thinking && usage.answer_tokens > 0 {
            let message = format!(
                "max_tokens cut the answer after {} answer tokens: the model re-opened <think> after answering and was still thinking",
                usage.answer_tokens
            );
            Diagnostic::new(DiagnosticKind::AnswerTruncated, last, message).with_fix(advice::truncated(max, false, cap))
        } else if self.phase == Phase::Thinking {
            let (fix, message) =
                advice::starved(max, usage.thinking_tokens, self.params.thinking.budget(), ctx.forced_close, cap);
            Diagnostic::new(DiagnosticKind::ThinkingExhaustedMaxTokens, last, message).with_fix(fix)
        } else {
            let by = if by_budget { "the answer budget" } else { "max_tokens" };
            let message = format!("{by} cut the answer after {} answer tokens", usage.answer_tokens);
            Diagnostic::new(DiagnosticKind::AnswerTruncated, last, message)
                .with_fix(advice::truncated(max, by_budget, cap))
        }
    }
}

/// What [`Tally::finish`] leaves: the `done` event it sent and the diagnostics raised.
#[derive(Debug, Clone)]
pub struct Finished {
    pub done: DoneEvent,
    pub diagnostics: Vec<(DiagnosticKind, usize)>,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::generation::Thinking;

    use super::*;

    fn piece(text: &str, phase: Phase) -> TokenPiece {
        TokenPiece { text: text.into(), phase, ..Default::default() }
    }

    fn budgeted(budget: usize) -> GenerationParams {
        GenerationParams { thinking: Thinking::from_budget(Some(budget)), ..Default::default() }
    }

    #[test]
    fn forced_tokens_are_counted_apart_and_the_sum_holds() {
        let mut out = vec![];
        let mut emit = |e: EngineEvent| out.push(e);
        let mut t = Tally::new(&budgeted(2), Phase::Thinking, CountSource::Engine, Instant::now());
        t.push(piece("a", Phase::Thinking), &mut emit);
        assert!(!t.budget_spent());
        t.push(piece("b", Phase::Thinking), &mut emit);
        assert!(t.budget_spent(), "two thinking tokens spend a budget of 2");
        t.budget_forced("the engine", Some(2), &mut emit);
        t.push(TokenPiece { forced: true, ..piece(" bridge", Phase::Thinking) }, &mut emit);
        t.push(
            TokenPiece { forced: true, marker: Some(Marker::Close), ..piece("</think>", Phase::Thinking) },
            &mut emit,
        );
        assert_eq!(t.phase(), Phase::Answer);
        assert!(!t.budget_spent());
        t.push(piece("42", Phase::Answer), &mut emit);
        assert_eq!(
            t.push(TokenPiece { stop: true, ..piece("", Phase::Answer) }, &mut emit),
            Verdict::Finish(FinishReason::Stop)
        );
        let f = t.finish(FinishReason::Stop, FinishContext::default(), &mut emit);
        let u = &f.done.usage;
        assert_eq!((u.thinking_tokens, u.forced_tokens, u.answer_tokens, u.completion_tokens), (2, 2, 2, 6));
        assert_eq!(f.done.thinking, "ab bridge");
        assert_eq!(f.done.answer, "42");
        assert_eq!(f.diagnostics, [(DiagnosticKind::ThinkingBudgetForced, 2)]);
        let d = out.iter().find_map(|e| if let EngineEvent::Diagnostic(d) = e { Some(d) } else { None }).unwrap();
        assert!(d.message.contains("after 2 thinking tokens"), "{}", d.message);
    }

    /// A rescue asked for in thinking is dropped when thinking ends by itself first (an accepted
    /// MTP draft can be `</think>` right after the alarm's token), and never fires later.
    #[test]
    fn a_rescue_is_dropped_when_thinking_closes_by_itself() {
        use crate::generation::{LoopParams, OnLoop};
        let mut emit = |_: EngineEvent| {};
        let params = GenerationParams {
            loop_detection: LoopParams { on_loop: OnLoop::Answer, ..Default::default() },
            ..Default::default()
        };
        let mut t = Tally::new(&params, Phase::Thinking, CountSource::Engine, Instant::now());
        let mut n = 0;
        while !t.rescue_due() {
            t.push(TokenPiece { id: Some(7), ..piece("7", Phase::Thinking) }, &mut emit);
            n += 1;
            assert!(n < 200, "the loop is detected");
        }
        t.push(
            TokenPiece { id: Some(9), marker: Some(Marker::Close), ..piece("</think>", Phase::Thinking) },
            &mut emit,
        );
        assert!(!t.rescue_due());
        t.push(TokenPiece { id: Some(8), marker: Some(Marker::Open), ..piece("<think>", Phase::Answer) }, &mut emit);
        assert_eq!(t.phase(), Phase::Thinking);
        assert!(!t.rescue_due(), "a re-opened thinking is not rescued for the old loop");
    }

    #[test]
    fn a_hidden_close_after_the_budget_is_forced_and_the_server_usage_fills_the_rest() {
        let mut emit = |_: EngineEvent| {};
        let mut t = Tally::new(&budgeted(1), Phase::Thinking, CountSource::Logprobs, Instant::now());
        t.push(piece("a", Phase::Thinking), &mut emit);
        t.budget_forced("llama.cpp", None, &mut emit);
        t.push(TokenPiece { forced: true, ..piece(" bridge", Phase::Thinking) }, &mut emit);
        // The server's parser took `</think>` out of the stream; the answer follows.
        t.push(piece("x", Phase::Answer), &mut emit);
        let reported = Reported { prompt_tokens: Some(9), completion_tokens: Some(6), ..Default::default() };
        let f = t.finish(FinishReason::Stop, FinishContext { reported, ..Default::default() }, &mut emit);
        let u = &f.done.usage;
        // 1 thinking, 2 forced (the bridge token and the hidden `</think>`), 3 answer (the one
        // streamed, and two the server generated without streaming: blank line, end token).
        assert_eq!((u.thinking_tokens, u.forced_tokens, u.answer_tokens, u.completion_tokens), (1, 2, 3, 6));
        assert_eq!(u.prompt_tokens, 9);
    }

    #[test]
    fn the_decode_rate_never_exceeds_what_the_arrivals_allow() {
        let mut emit = |_: EngineEvent| {};
        let started = Instant::now();
        let mut t = Tally::new(&GenerationParams::default(), Phase::Answer, CountSource::Frames, started);
        // A slow first token, then a burst: the rate is over the arrivals, not the request.
        std::thread::sleep(Duration::from_millis(30));
        t.push(piece("x", Phase::Answer), &mut emit);
        let after_first = Instant::now();
        for _ in 0..4 {
            std::thread::sleep(Duration::from_millis(4));
            t.push(piece("x", Phase::Answer), &mut emit);
        }
        // The last push came after this: the arrivals span at least 16 ms.
        let span = after_first.elapsed().as_secs_f64();
        let f = t.finish(FinishReason::Stop, FinishContext::default(), &mut emit);
        let rate = f.done.timing.decode_tok_s;
        assert!(span >= 0.016 && rate > 0.0 && rate <= 4.0 / 0.016 + 1e-6, "{rate} tok/s over {span} s");
        assert!(f.done.timing.ttft_ms.is_some_and(|ms| ms >= 30.0), "{:?}", f.done.timing);
        // One arrival is no rate at all.
        let mut one = Tally::new(&GenerationParams::default(), Phase::Answer, CountSource::Frames, Instant::now());
        one.push(piece("x", Phase::Answer), &mut emit);
        assert_eq!(one.finish(FinishReason::Stop, FinishContext::default(), &mut emit).done.timing.decode_tok_s, 0.0);
    }

    /// A request cancelled before its first token has no time to a first token: no TTFT (not
    /// the time it waited), and no prefill rate made from one.
    #[test]
    fn a_request_cancelled_before_its_first_token_has_no_ttft() {
        let mut emit = |_: EngineEvent| {};
        let t = Tally::new(&GenerationParams::default(), Phase::Answer, CountSource::Frames, Instant::now());
        std::thread::sleep(Duration::from_millis(5));
        let ctx = FinishContext {
            reported: Reported { prompt_tokens: Some(40), ..Default::default() },
            ..Default::default()
        };
        let done = t.finish(FinishReason::Cancelled, ctx, &mut emit).done;
        assert_eq!((done.timing.ttft_ms, done.timing.prefill_tok_s), (None, 0.0), "{:?}", done.timing);
        assert!(done.timing.total_ms >= 5.0);
        let json = serde_json::to_value(&done.timing).unwrap();
        assert!(json.get("ttft_ms").is_none(), "{json}");
    }

    #[test]
    fn stop_strings_cut_and_max_tokens_end() {
        let mut emit = |_: EngineEvent| {};
        let p = GenerationParams { stop: vec!["END".into()], max_tokens: 10, ..Default::default() };
        let mut t = Tally::new(&p, Phase::Answer, CountSource::Engine, Instant::now());
        assert_eq!(t.push(piece("ok E", Phase::Answer), &mut emit), Verdict::Continue);
        assert_eq!(t.push(piece("ND more", Phase::Answer), &mut emit), Verdict::Finish(FinishReason::StopString));
        assert_eq!(t.finish(FinishReason::StopString, FinishContext::default(), &mut emit).done.answer, "ok ");
        let p = GenerationParams { max_tokens: 2, ..Default::default() };
        let mut t = Tally::new(&p, Phase::Thinking, CountSource::Engine, Instant::now());
        t.push(piece("a", Phase::Thinking), &mut emit);
        assert_eq!(t.push(piece("b", Phase::Thinking), &mut emit), Verdict::Finish(FinishReason::Length));
        let f =
            t.finish(FinishReason::Length, FinishContext { forced_close: (52, true), ..Default::default() }, &mut emit);
        assert_eq!(f.diagnostics[0].0, DiagnosticKind::ThinkingExhaustedMaxTokens);
    }
}
