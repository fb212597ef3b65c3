//! From a server's streamed chat-completion frames to the engine's events. Pure: the HTTP
//! side ([`super::stream`]) hands in each SSE frame's JSON, and this keeps the state a
//! generation needs — the thinking/answer split, counts, the loop alarm, the usage, the
//! speculative-decoding figures — and builds the same `done` and diagnostics as the local
//! engine.
//!
//! What the recordings taught (../shared/servers-and-cuda.md §1.4, serving-notes.md §2):
//! - thinking arrives as `delta.reasoning_content` (llama.cpp, SGLang, older vLLM) or
//!   `delta.reasoning` (vLLM); the answer as `delta.content`; a server without a reasoning
//!   parser puts everything in `content`, `<think>` … `</think>` included, and is split here;
//! - the role frame may carry `content: null` (llama.cpp) or `""` (SGLang, vLLM);
//! - `</think>`, the blank line after it and `<|im_end|>` come with no frame and no logprob
//!   when the server splits (llama.cpp), so counts take the server's usage where given;
//! - `usage` arrives in a frame with `choices: []`; SGLang adds `sglext`, vLLM `metrics`,
//!   llama.cpp `timings` (with `draft_n` / `draft_n_accepted` under MTP);
//! - logprobs are missing on tokens that came from accepted MTP drafts (llama.cpp).

use std::collections::HashMap;
use std::time::Instant;

use serde_json::Value;

use crate::generation::advice;
use crate::generation::watchdog::LoopDetector;
use crate::generation::{
    Alternative, CountSource, Diagnostic, DiagnosticKind, DoneEvent, EngineEvent, ErrorKind, FinishReason,
    GenerationParams, MtpStats, Phase, ServerMemory, StatsEvent, Timing, TokenEvent, Usage,
};

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";
/// A `stats` event every this many tokens (live gauges), as the engine does.
const STATS_EVERY: usize = 16;

/// Who splits thinking from the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The server's reasoning parser: `content` is always the answer.
    Server,
    /// Not known: `content` is split on `</think>` here until a reasoning field shows that the
    /// server splits (a Qwen3.5 prompt with thinking on leaves the model inside `<think>`).
    Auto,
}

/// What the mapper asks the stream to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// The loop alarm fired with `--loop-stop`: close the stream, finish `loop`.
    StopLoop,
}

/// One token's logprob entry as servers send it.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    id: Option<u32>,
    text: String,
    logprob: Option<f32>,
    top: Vec<Alternative>,
}

/// How a stream ended, as seen by the HTTP side.
#[derive(Debug, Clone, PartialEq)]
pub enum End {
    /// `[DONE]` or a clean end after a finish reason.
    Complete,
    /// The user cancelled; the connection was closed.
    Cancelled,
    /// The mapper asked to stop (loop alarm).
    Stopped(FinishReason),
    /// Something went wrong; what arrived is kept.
    Failed(ErrorKind, String),
}

/// Per-request speculative-decoding counters from `/metrics`, read before and after.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetricsDelta {
    pub drafts: f64,
    pub per_position: Vec<f64>,
    /// "llama.cpp /metrics" or "vLLM /metrics".
    pub source: String,
}

pub struct FrameMapper {
    params: GenerationParams,
    split: Split,
    phase: Phase,
    start_phase: Phase,
    /// A reasoning field was seen: the server splits.
    reasoning_seen: bool,
    /// Content text held back because it may be the start of `</think>`.
    pending: String,
    /// Output has begun (a leading `<think>` can only come first).
    began: bool,
    index: usize,
    thinking: String,
    answer: String,
    thinking_tokens: usize,
    answer_tokens: usize,
    /// A `</think>` token was streamed (else it is implied when the answer begins).
    marker_streamed: bool,
    thinking_closed_at: Option<usize>,
    frames: usize,
    frames_with_logprobs: usize,
    finish: Option<String>,
    stop_reason: Option<Value>,
    usage: Option<Value>,
    timings: Option<Value>,
    /// SGLang's `sglext.spec_tokens_details`.
    sglext: Option<Value>,
    vllm_metrics: Option<Value>,
    server_error: Option<String>,
    watchdog: LoopDetector,
    text_ids: HashMap<String, u32>,
    loop_reported: bool,
    /// Client-side budget: tokens streamed before the continuation, and the forced ones.
    continued: Option<usize>,
    forced: usize,
    started: Instant,
    first_token_at: Option<f64>,
    stats_at: usize,
    pub server_memory: Option<ServerMemory>,
    /// The user's prompt length when the usage cannot tell it (a client-side budget's
    /// continuation re-sends the thinking in its prompt).
    pub prompt_tokens: Option<usize>,
}

impl FrameMapper {
    pub fn new(params: GenerationParams, split: Split, enable_thinking: bool, started: Instant) -> Self {
        let phase = if enable_thinking { Phase::Thinking } else { Phase::Answer };
        FrameMapper {
            watchdog: LoopDetector::new(params.loop_detection.clone()),
            params,
            split,
            phase,
            start_phase: phase,
            reasoning_seen: false,
            pending: String::new(),
            began: false,
            index: 0,
            thinking: String::new(),
            answer: String::new(),
            thinking_tokens: 0,
            answer_tokens: 0,
            marker_streamed: false,
            thinking_closed_at: None,
            frames: 0,
            frames_with_logprobs: 0,
            finish: None,
            stop_reason: None,
            usage: None,
            timings: None,
            sglext: None,
            vllm_metrics: None,
            server_error: None,
            text_ids: HashMap::new(),
            loop_reported: false,
            continued: None,
            forced: 0,
            started,
            first_token_at: None,
            stats_at: 0,
            server_memory: None,
            prompt_tokens: None,
        }
    }

    pub fn start_phase(&self) -> Phase {
        self.start_phase
    }

    /// Tokens streamed so far.
    pub fn tokens(&self) -> usize {
        self.index
    }

    /// The thinking streamed so far (for a client-side budget continuation).
    pub fn thinking_text(&self) -> &str {
        &self.thinking
    }

    pub fn in_thinking(&self) -> bool {
        self.phase == Phase::Thinking
    }

    /// Thinking tokens sampled so far (the budget counts these).
    pub fn thinking_tokens(&self) -> usize {
        self.thinking_tokens
    }

    /// One SSE frame's JSON.
    pub fn frame(&mut self, data: &Value, emit: &mut dyn FnMut(EngineEvent)) -> Flow {
        if let Some(err) = data.get("error") {
            self.server_error = Some(error_text(err));
        }
        if let Some(u) = data.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(u.clone());
        }
        if let Some(t) = data.get("timings").filter(|t| !t.is_null()) {
            self.timings = Some(t.clone());
        }
        // SGLang sends several `sglext` objects (spec details, then output ids).
        if let Some(x) = data.pointer("/sglext/spec_tokens_details").filter(|x| !x.is_null()) {
            self.sglext = Some(x.clone());
        }
        if let Some(m) = data.get("metrics").filter(|m| !m.is_null()) {
            self.vllm_metrics = Some(m.clone());
        }
        let Some(choice) = data.get("choices").and_then(Value::as_array).and_then(|c| c.first()) else {
            return Flow::Continue;
        };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(f.to_string());
            self.stop_reason = choice.get("stop_reason").or_else(|| choice.get("matched_stop")).cloned();
        }
        let delta = choice.get("delta").or_else(|| choice.get("message"));
        let text_of = |k: &str| delta.and_then(|d| d.get(k)).and_then(Value::as_str).unwrap_or("");
        let reasoning = match text_of("reasoning_content") {
            "" => text_of("reasoning"),
            r => r,
        };
        // `/v1/completions` frames carry `text`.
        let content = match text_of("content") {
            "" => choice.get("text").and_then(Value::as_str).unwrap_or(""),
            c => c,
        };
        if reasoning.is_empty() && content.is_empty() {
            return Flow::Continue;
        }
        self.frames += 1;
        let entries = logprob_entries(choice);
        if !entries.is_empty() {
            self.frames_with_logprobs += 1;
        }
        let (r_entries, c_entries) = assign_entries(entries, reasoning, content);
        let mut flow = Flow::Continue;
        if !reasoning.is_empty() {
            self.reasoning_seen = true;
            flow = self.pieces(Phase::Thinking, reasoning, r_entries, emit);
        }
        if !content.is_empty() && flow == Flow::Continue {
            flow = self.content(content, c_entries, emit);
        }
        flow
    }

    /// Content text: the answer, or — while the split is ours — thinking up to `</think>`.
    fn content(&mut self, text: &str, entries: Vec<Entry>, emit: &mut dyn FnMut(EngineEvent)) -> Flow {
        let splitting = self.split == Split::Auto && !self.reasoning_seen;
        if !splitting || self.phase == Phase::Answer {
            if self.phase == Phase::Thinking {
                // The server's parser swallowed `</think>`: thinking ended before this.
                self.close_thinking(false);
            }
            return self.pieces(Phase::Answer, text, entries, emit);
        }
        let mut buf = std::mem::take(&mut self.pending);
        buf.push_str(text);
        // Servers without a reasoning parser re-send the prompt's `<think>\n` first.
        if !self.began {
            if THINK_START.starts_with(buf.as_str()) {
                self.pending = buf;
                return Flow::Continue;
            }
            if let Some(rest) = buf.strip_prefix(THINK_START) {
                buf = rest.strip_prefix('\n').unwrap_or(rest).to_string();
            }
        }
        let whole = |piece: &str, entries: &[Entry]| -> Vec<Entry> {
            // A piece keeps its logprob entries only when it is exactly their text.
            if entries.iter().map(|e| e.text.as_str()).collect::<String>() == piece { entries.to_vec() } else { vec![] }
        };
        if let Some(at) = buf.find(THINK_END) {
            let (before, rest) = buf.split_at(at);
            let after = &rest[THINK_END.len()..];
            let mut flow = Flow::Continue;
            if !before.is_empty() {
                flow = self.pieces(Phase::Thinking, before, whole(before, &entries), emit);
            }
            if flow == Flow::Continue {
                flow = self.pieces(Phase::Thinking, THINK_END, whole(THINK_END, &entries), emit);
            }
            if flow == Flow::Continue && !after.is_empty() {
                flow = self.pieces(Phase::Answer, after, whole(after, &entries), emit);
            }
            return flow;
        }
        // Hold back a tail that may be the start of `</think>`.
        let keep = (1..THINK_END.len()).rev().find(|&n| buf.ends_with(&THINK_END[..n])).unwrap_or(0);
        let emit_len = buf.len() - keep;
        self.pending = buf[emit_len..].to_string();
        let out = &buf[..emit_len];
        if out.is_empty() {
            return Flow::Continue;
        }
        let e = whole(out, &entries);
        self.pieces(Phase::Thinking, out, e, emit)
    }

    fn close_thinking(&mut self, streamed_marker: bool) {
        if self.phase == Phase::Thinking {
            self.phase = Phase::Answer;
            self.marker_streamed |= streamed_marker;
            self.thinking_closed_at = Some(self.index);
        }
    }

    /// Emits `text` in `phase`: one token per logprob entry when they cover it, else one token.
    fn pieces(&mut self, phase: Phase, text: &str, entries: Vec<Entry>, emit: &mut dyn FnMut(EngineEvent)) -> Flow {
        self.began = true;
        if phase == Phase::Answer && self.phase == Phase::Thinking {
            self.close_thinking(false);
        }
        let tokens = if entries.is_empty() {
            vec![Entry { id: None, text: text.to_string(), logprob: None, top: vec![] }]
        } else {
            entries
        };
        for e in tokens {
            let marker = phase == Phase::Thinking && e.text == THINK_END;
            if self.token(phase, e, marker, emit) == Flow::StopLoop {
                return Flow::StopLoop;
            }
            if marker {
                self.close_thinking(true);
            }
        }
        Flow::Continue
    }

    /// The client-side thinking budget ran out: the stream was closed, the bridge text and
    /// `</think>` are forced (as the local engine does), and a `/v1/completions` continuation
    /// streams the answer next.
    pub fn force_end_of_thinking(&mut self, bridge: &str, budget: usize, emit: &mut dyn FnMut(EngineEvent)) {
        self.flush(emit);
        let at = self.index;
        emit(EngineEvent::Diagnostic(Diagnostic {
            kind: DiagnosticKind::ThinkingBudgetForced,
            at_token: at,
            message: format!(
                "thinking budget of {budget} tokens spent: deltascope closed the stream and forced the end of thinking (bridge text, </think>), then continued with /v1/completions"
            ),
            period: None,
            start: None,
            fix: None,
            layer: None,
            head: None,
        }));
        for text in [bridge, THINK_END] {
            if text.is_empty() {
                continue;
            }
            let index = self.index;
            self.index += 1;
            self.forced += 1;
            if text != THINK_END {
                self.thinking.push_str(text);
            }
            emit(EngineEvent::Token(TokenEvent {
                index,
                phase: Phase::Thinking,
                id: None,
                text: text.to_string(),
                logprob: None,
                draft: None,
                forced: true,
                top_logprobs: vec![],
                entropy: None,
            }));
        }
        self.close_thinking(true);
        self.continued = Some(at);
        // The continuation reports its own usage and finish.
        self.usage = None;
        self.finish = None;
        self.began = true;
    }

    fn token(&mut self, phase: Phase, e: Entry, marker: bool, emit: &mut dyn FnMut(EngineEvent)) -> Flow {
        let now = self.started.elapsed().as_secs_f64();
        self.first_token_at.get_or_insert(now);
        let index = self.index;
        self.index += 1;
        match phase {
            Phase::Thinking => {
                self.thinking_tokens += 1;
                if !marker {
                    self.thinking.push_str(&e.text);
                }
            }
            Phase::Answer => {
                self.answer_tokens += 1;
                self.answer.push_str(&e.text);
            }
        }
        // The loop alarm runs on token ids, or on token texts when the server sends no ids.
        let key = match e.id {
            Some(id) => id,
            None => {
                let next = self.text_ids.len() as u32 | 0x8000_0000;
                *self.text_ids.entry(e.text.clone()).or_insert(next)
            }
        };
        emit(EngineEvent::Token(TokenEvent {
            index,
            phase,
            id: e.id,
            text: e.text,
            logprob: e.logprob,
            draft: None,
            forced: false,
            top_logprobs: e.top,
            entropy: None,
        }));
        let mut flow = Flow::Continue;
        if let Some(r) = self.watchdog.push(key)
            && !self.loop_reported
        {
            self.loop_reported = true;
            let stop = self.params.loop_detection.auto_stop;
            emit(EngineEvent::Diagnostic(Diagnostic {
                kind: DiagnosticKind::DegenerateLoop,
                at_token: r.at,
                message: format!(
                    "degenerate loop: a {}-token pattern repeats from token {} on{}",
                    r.period,
                    r.start,
                    if stop { "; stopping" } else { "" }
                ),
                period: Some(r.period),
                start: Some(r.start),
                fix: None,
                layer: None,
                head: None,
            }));
            if stop {
                flow = Flow::StopLoop;
            }
        }
        if self.index >= self.stats_at + STATS_EVERY {
            self.stats_at = self.index;
            emit(EngineEvent::Stats(self.stats()));
        }
        flow
    }

    fn counted(&self) -> CountSource {
        if self.frames > 0 && self.frames_with_logprobs == self.frames {
            CountSource::Logprobs
        } else {
            CountSource::Frames
        }
    }

    fn stats(&self) -> StatsEvent {
        let since = self.first_token_at.unwrap_or(0.0);
        let elapsed = (self.started.elapsed().as_secs_f64() - since).max(1e-9);
        StatsEvent {
            generated: self.index,
            thinking_tokens: self.thinking_tokens,
            answer_tokens: self.answer_tokens,
            counted: self.counted(),
            tok_s: self.index.saturating_sub(1) as f64 / elapsed,
            memory: None,
            server_memory: self.server_memory.clone(),
            mtp: None,
        }
    }

    /// Flushes held-back text (a stream that ended on a partial marker).
    fn flush(&mut self, emit: &mut dyn FnMut(EngineEvent)) {
        let rest = std::mem::take(&mut self.pending);
        if !rest.is_empty() && (self.began || !THINK_START.starts_with(rest.as_str())) {
            let phase = self.phase;
            self.pieces(phase, &rest, vec![], emit);
        }
    }

    /// The end of the stream: `done` (with the diagnostics a local run would raise) or
    /// `error`. What arrived is kept either way: the tokens were emitted as they came.
    pub fn finish(mut self, end: End, metrics: Option<MetricsDelta>, emit: &mut dyn FnMut(EngineEvent)) {
        self.flush(emit);
        let finish = match (&end, self.finish.as_deref()) {
            (End::Cancelled, _) => FinishReason::Cancelled,
            (End::Stopped(r), _) => *r,
            (End::Failed(kind, message), _) => {
                emit(EngineEvent::error(*kind, self.kept(message)));
                return;
            }
            (End::Complete, Some("length")) => FinishReason::Length,
            (End::Complete, Some("stop" | "tool_calls" | "eos")) => self.stop_kind(),
            (End::Complete, Some("abort")) => {
                let why = self.server_error.clone().unwrap_or_else(|| "the server aborted the request".into());
                emit(EngineEvent::error(ErrorKind::Unavailable, self.kept(&why)));
                return;
            }
            (End::Complete, Some(other)) => {
                let why = match &self.server_error {
                    Some(e) => format!("the server ended the stream with finish_reason \"{other}\": {e}"),
                    None => format!("the server ended the stream with finish_reason \"{other}\""),
                };
                emit(EngineEvent::error(ErrorKind::Internal, self.kept(&why)));
                return;
            }
            (End::Complete, None) => {
                let why = match &self.server_error {
                    Some(e) => format!("the server reported an error mid-stream: {e}"),
                    None => "the stream ended without a finish reason (the server closed it mid-answer)".into(),
                };
                emit(EngineEvent::error(ErrorKind::Unavailable, self.kept(&why)));
                return;
            }
        };
        let usage = self.usage();
        if finish == FinishReason::Length {
            self.length_diagnostic(&usage, emit);
        }
        self.budget_diagnostic(emit);
        let total = self.started.elapsed().as_secs_f64();
        let ttft = self.first_token_at.unwrap_or(total);
        let prefill_tok_s = self
            .timings
            .as_ref()
            .and_then(|t| t.get("prompt_per_second"))
            .and_then(Value::as_f64)
            .unwrap_or(usage.prompt_tokens as f64 / ttft.max(1e-9));
        let n = usage.completion_tokens.max(self.index);
        let timing = Timing {
            ttft_ms: ttft * 1e3,
            prefill_tok_s,
            decode_tok_s: if n > 1 { (n - 1) as f64 / (total - ttft).max(1e-9) } else { 0.0 },
            total_ms: total * 1e3,
        };
        let mtp = self.mtp(metrics, usage.completion_tokens);
        emit(EngineEvent::Done(DoneEvent {
            finish_reason: finish,
            usage,
            timing,
            mtp,
            memory: None,
            server_memory: self.server_memory.clone(),
            thinking: self.thinking.clone(),
            answer: self.answer.clone(),
        }));
    }

    /// "…; kept the 42 tokens that arrived".
    fn kept(&self, why: &str) -> String {
        if self.index == 0 { why.to_string() } else { format!("{why}; kept the {} tokens that arrived", self.index) }
    }

    /// `stop`, or `stop_string` when the server says one of our stop strings matched.
    fn stop_kind(&self) -> FinishReason {
        match self.stop_reason.as_ref().and_then(Value::as_str) {
            Some(s) if self.params.stop.iter().any(|x| x == s) => FinishReason::StopString,
            _ => FinishReason::Stop,
        }
    }

    fn usage(&self) -> Usage {
        let u = self.usage.as_ref();
        let field = |k: &str| u.and_then(|u| u.get(k)).and_then(Value::as_u64).map(|v| v as usize);
        let prompt = field("prompt_tokens").unwrap_or(0);
        let completion = field("completion_tokens");
        if let Some(before) = self.continued {
            // Streamed before the cut, forced, then what the continuation generated.
            let after = completion.unwrap_or(self.index - before - self.forced);
            let total = before + self.forced + after;
            return Usage {
                // The continuation's prompt re-sent the thinking and the bridge, so the user's
                // prompt length comes from the server's tokenizer (0 when it has none to ask).
                prompt_tokens: self.prompt_tokens.unwrap_or(0),
                thinking_tokens: self.thinking_tokens,
                answer_tokens: total.saturating_sub(self.thinking_tokens + self.forced),
                completion_tokens: total,
                forced_tokens: self.forced,
                counted: self.counted(),
            };
        }
        let reasoning = field("reasoning_tokens").filter(|&r| r > 0 || self.thinking_tokens == 0).or_else(|| {
            u.and_then(|u| u.pointer("/completion_tokens_details/reasoning_tokens"))
                .and_then(Value::as_u64)
                .map(|v| v as usize)
        });
        match (completion, reasoning) {
            (Some(c), Some(r)) => Usage {
                prompt_tokens: prompt,
                thinking_tokens: r.min(c),
                answer_tokens: c.saturating_sub(r),
                completion_tokens: c,
                forced_tokens: 0,
                counted: CountSource::ServerUsage,
            },
            (completion, _) => {
                // `</think>` is a thinking token the splitting server did not stream.
                let hidden_marker = usize::from(self.thinking_closed_at.is_some() && !self.marker_streamed);
                let thinking = self.thinking_tokens + hidden_marker;
                let completion = completion.unwrap_or(self.index).max(thinking);
                Usage {
                    prompt_tokens: prompt,
                    thinking_tokens: thinking,
                    // Tokens the server generated but did not stream (the blank line after
                    // `</think>`, `<|im_end|>`) belong to the answer, as the engine counts them.
                    answer_tokens: completion - thinking,
                    completion_tokens: completion,
                    forced_tokens: 0,
                    counted: self.counted(),
                }
            }
        }
    }

    fn length_diagnostic(&self, usage: &Usage, emit: &mut dyn FnMut(EngineEvent)) {
        let max = self.params.max_tokens;
        let last = self.index.saturating_sub(1);
        // The server's context is not known here: the TUI caps the fix by it when applying it.
        let cap = usize::MAX / 4;
        let (kind, message, fix) = if self.phase == Phase::Thinking && usage.answer_tokens > 0 {
            let message = format!(
                "max_tokens cut the answer after {} answer tokens: the model re-opened <think> after answering and was still thinking",
                usage.answer_tokens
            );
            (DiagnosticKind::AnswerTruncated, message, advice::truncated(max, false, cap))
        } else if self.phase == Phase::Thinking {
            // No tokenizer here: the forced end of thinking is estimated from the bridge text.
            let forced = (advice::estimate_forced(&self.params.budget_bridge), false);
            let (fix, message) = advice::starved(max, usage.thinking_tokens, self.params.thinking_budget, forced, cap);
            (DiagnosticKind::ThinkingExhaustedMaxTokens, message, fix)
        } else {
            let message = format!("max_tokens cut the answer after {} answer tokens", usage.answer_tokens);
            (DiagnosticKind::AnswerTruncated, message, advice::truncated(max, false, cap))
        };
        emit(EngineEvent::Diagnostic(Diagnostic {
            kind,
            at_token: last,
            message,
            period: None,
            start: None,
            fix: Some(fix),
            layer: None,
            head: None,
        }));
    }

    /// A thinking budget that ended thinking: the server forced `</think>` (it does not say
    /// which tokens it forced, so this is recognised from the count reaching the budget).
    fn budget_diagnostic(&self, emit: &mut dyn FnMut(EngineEvent)) {
        let (Some(budget), Some(at)) = (self.params.thinking_budget, self.thinking_closed_at) else { return };
        if self.continued.is_some() {
            return; // reported when deltascope forced it
        }
        // Builds differ by one token in where they cut (b10434 after budget−1 visible tokens).
        if self.thinking_tokens + 1 < budget {
            return;
        }
        emit(EngineEvent::Diagnostic(Diagnostic {
            kind: DiagnosticKind::ThinkingBudgetForced,
            at_token: at.saturating_sub(1),
            message: format!(
                "thinking budget of {budget} tokens spent: the server forced the end of thinking after {} thinking tokens",
                self.thinking_tokens
            ),
            period: None,
            start: None,
            fix: None,
            layer: None,
            head: None,
        }));
    }

    /// Speculative decoding, from whatever the server reported for this request.
    fn mtp(&self, metrics: Option<MetricsDelta>, completion: usize) -> Option<MtpStats> {
        let per_position = |m: &Option<MetricsDelta>| -> Option<(usize, Vec<(usize, usize)>)> {
            let m = m.as_ref().filter(|m| m.drafts > 0.0)?;
            let steps = m.drafts.round() as usize;
            Some((steps, m.per_position.iter().map(|a| (steps, a.round() as usize)).collect()))
        };
        // vLLM: `metrics.speculative_decoding` (needs --per-request-spec-decode-metrics).
        if let Some(sd) =
            self.vllm_metrics.as_ref().and_then(|m| m.get("speculative_decoding")).filter(|v| !v.is_null())
        {
            let n = |k: &str| sd.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
            let depth = n("num_spec_tokens");
            let steps = n("num_spec_steps");
            let hist = histogram(sd.get("acceptance_histogram"));
            let counts = counts_from_histogram(&hist, depth, steps);
            let len = sd.get("mean_acceptance_length").and_then(Value::as_f64).unwrap_or(0.0);
            let source = "vLLM metrics.speculative_decoding (per position from its acceptance histogram)".to_string();
            return Some(MtpStats::from_server(
                depth,
                steps,
                n("num_draft_tokens"),
                n("num_accepted_draft_tokens"),
                counts,
                len,
                source,
            ));
        }
        // SGLang: `sglext.spec_tokens_details` (return_spec_tokens_details).
        if let Some(sd) = self.sglext.as_ref() {
            let n = |k: &str| sd.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
            let steps = n("spec_verify_ct");
            let drafted = n("spec_num_proposed_drafts");
            let hist = histogram(sd.get("spec_correct_drafts_histogram"));
            let depth = drafted.checked_div(steps).unwrap_or(hist.len().saturating_sub(1));
            let counts = counts_from_histogram(&hist, depth, steps);
            let len = sd.get("spec_accept_length").and_then(Value::as_f64).unwrap_or(0.0);
            let source = "SGLang sglext.spec_tokens_details (per position from its histogram)".to_string();
            return Some(MtpStats::from_server(
                depth,
                steps,
                drafted,
                n("spec_num_correct_drafts"),
                counts,
                len,
                source,
            ));
        }
        // llama.cpp: `timings.draft_n` / `draft_n_accepted`, positions from /metrics.
        let t = self.timings.as_ref()?;
        let drafted = t.get("draft_n").and_then(Value::as_u64)? as usize;
        let accepted = t.get("draft_n_accepted").and_then(Value::as_u64).unwrap_or(0) as usize;
        let (steps, counts, source) = match per_position(&metrics) {
            Some((steps, counts)) => {
                let from = metrics.map(|m| m.source).unwrap_or_default();
                (steps, counts, format!("llama.cpp timings.draft_n; per position from {from}"))
            }
            None => (
                0,
                vec![],
                "llama.cpp timings.draft_n (per position: /metrics was not readable; start the server with --metrics)"
                    .to_string(),
            ),
        };
        let depth = if steps > 0 { drafted.div_ceil(steps) } else { 0 };
        let len = if steps > 0 { completion as f64 / steps as f64 } else { 0.0 };
        Some(MtpStats::from_server(depth, steps, drafted, accepted, counts, len, source))
    }
}

fn histogram(v: Option<&Value>) -> Vec<usize> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().map(|x| x.as_u64().unwrap_or(0) as usize).collect())
        .unwrap_or_default()
}

/// `[drafted, accepted]` per position from a histogram of drafts accepted per verify step
/// (index j = steps that accepted exactly j drafts): position i is reached by every step and
/// accepted by those that accepted more than i.
fn counts_from_histogram(hist: &[usize], depth: usize, steps: usize) -> Vec<(usize, usize)> {
    (0..depth).map(|i| (steps, hist.iter().skip(i + 1).sum())).collect()
}

/// The logprob entries of a choice (`logprobs.content`), each with its alternatives.
fn logprob_entries(choice: &Value) -> Vec<Entry> {
    let Some(list) = choice.pointer("/logprobs/content").and_then(Value::as_array) else { return vec![] };
    let id = |v: &Value| v.get("id").and_then(Value::as_u64).map(|i| i as u32);
    let text = |v: &Value| v.get("token").and_then(Value::as_str).unwrap_or("").to_string();
    let lp = |v: &Value| v.get("logprob").and_then(Value::as_f64).map(|l| l as f32);
    list.iter()
        .map(|e| Entry {
            id: id(e),
            text: text(e),
            logprob: lp(e),
            top: e
                .get("top_logprobs")
                .and_then(Value::as_array)
                .map(|alts| {
                    alts.iter()
                        .map(|a| Alternative { id: id(a), logprob: lp(a).unwrap_or(f32::NEG_INFINITY), text: text(a) })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect()
}

/// Splits a frame's entries between its reasoning and content texts (vLLM may put both in
/// one frame). Entries that do not add up to the texts are dropped rather than misassigned.
fn assign_entries(entries: Vec<Entry>, reasoning: &str, content: &str) -> (Vec<Entry>, Vec<Entry>) {
    let joined: String = entries.iter().map(|e| e.text.as_str()).collect();
    if entries.is_empty() {
        return (vec![], vec![]);
    }
    if joined == format!("{reasoning}{content}") {
        let mut used = 0;
        let mut r = vec![];
        let mut c = vec![];
        for e in entries {
            if used < reasoning.len() {
                used += e.text.len();
                r.push(e);
            } else {
                c.push(e);
            }
        }
        return (r, c);
    }
    // A server that re-sends the prompt's `<think>\n` lists only the generated token.
    if reasoning.is_empty() && content.ends_with(&joined) {
        return (vec![], entries);
    }
    (vec![], vec![])
}

/// A server error object as one line: its message, type and code.
pub fn error_text(err: &Value) -> String {
    match err {
        Value::String(s) => s.clone(),
        Value::Object(o) => {
            let message = o.get("message").and_then(Value::as_str).unwrap_or("(no message)");
            let kind = o.get("type").and_then(Value::as_str);
            match kind {
                Some(k) => format!("{message} ({k})"),
                None => message.to_string(),
            }
        }
        other => other.to_string(),
    }
}
