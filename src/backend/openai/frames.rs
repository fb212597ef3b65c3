//! From a server's streamed chat-completion frames to the protocol's events. Pure: the HTTP
//! side ([`super::stream`]) hands in each SSE frame's JSON. What is a server's stays here — the
//! reasoning fields, the `<think>` split of a server without a reasoning parser, logprob entries,
//! usage / timings / `sglext` / vLLM metrics / deltascope's extension — and every token goes into
//! the generation's [`Tally`], which does all the counting, as it does for the local engine.
//!
//! What the recordings taught (../shared/servers-and-cuda.md §1.4, serving-notes.md §2):
//! - thinking arrives as `delta.reasoning_content` (llama.cpp, SGLang, older vLLM) or
//!   `delta.reasoning` (vLLM); the answer as `delta.content`; a server without a reasoning
//!   parser puts everything in `content`, `<think>` … `</think>` included, and is split here;
//! - `</think>`, the blank line after it and `<|im_end|>` come with no frame when the server
//!   splits (llama.cpp), so the tally reconciles with the server's usage at the end;
//! - a server-side thinking budget forces the bridge and `</think>` right after the budget's
//!   last token (llama.cpp, deltascope): the thinking tokens that follow are counted as forced;
//! - `usage` arrives in a frame with `choices: []`; SGLang adds `sglext`, vLLM `metrics`,
//!   llama.cpp `timings` (with `draft_n` / `draft_n_accepted` under MTP), deltascope its
//!   `deltascope` extension (the exact thinking / answer / forced split);
//! - logprobs are missing on tokens that came from accepted MTP drafts (llama.cpp).

use std::time::Instant;

use serde_json::Value;

use super::logprobs::{Entry, assign_entries, logprob_entries};
pub use super::spec_report::MetricsDelta;
use super::spec_report::server_mtp;

use deltascope_protocol::{
    CountSource, DiagnosticKind, EngineEvent, ErrorKind, FinishContext, FinishReason, GenerationParams, Marker, Phase,
    Reported, ServerMemory, Tally, TokenPiece, Verdict,
};

const THINK_START: &str = "<think>";
const THINK_END: &str = "</think>";

/// Who splits thinking from the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// The server's reasoning parser: `content` is always the answer.
    Server,
    /// Not known: `content` is split on `</think>` here until a reasoning field shows that the
    /// server splits (a Qwen3.5 prompt with thinking on leaves the model inside `<think>`).
    Auto,
}

/// Who ends thinking when the thinking budget is spent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Forcing {
    /// No budget (or thinking off).
    None,
    /// The server forces the bridge and `</think>` right after the budget's last token and
    /// streams them: they are told apart by the count (llama.cpp, deltascope).
    Streamed(&'static str),
    /// The server forces `</think>` without saying so (vLLM, SGLang): the forced count is an
    /// estimate, and this says why.
    Unmarked(&'static str),
    /// deltascope closes the stream and forces them itself (`--budget-mode client`).
    Client,
}

/// What the mapper asks the stream to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// The tally ended the generation (the loop alarm with `--loop-stop`): close the stream.
    Stop(FinishReason),
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

/// What the server said about the request as a whole.
#[derive(Debug, Clone, Default)]
struct Report {
    finish: Option<String>,
    stop_reason: Option<Value>,
    usage: Option<Value>,
    timings: Option<Value>,
    /// SGLang's `sglext.spec_tokens_details`.
    sglext: Option<Value>,
    vllm_metrics: Option<Value>,
    /// deltascope's own `deltascope` extension.
    extension: Option<Value>,
    error: Option<String>,
}

pub struct FrameMapper {
    tally: Tally,
    split: Split,
    forcing: Forcing,
    /// A reasoning field was seen: the server splits.
    reasoning_seen: bool,
    /// Content text held back because it may be the start of `</think>`, and the logprob
    /// entries of the tokens it is made of (held back whole, so every token keeps its id).
    pending: String,
    pending_entries: Vec<Entry>,
    /// Output has begun (a leading `<think>` can only come first).
    began: bool,
    /// Frames with text, and of them those with logprob entries (how exact the counts are).
    frames: (usize, usize),
    report: Report,
    /// Client-side budget: tokens pushed before the continuation began.
    continued_from: Option<usize>,
    start_phase: Phase,
    pub server_memory: Option<ServerMemory>,
    /// The user's prompt length when the usage cannot tell it (a client-side budget's
    /// continuation re-sends the thinking in its prompt).
    pub prompt_tokens: Option<usize>,
    /// Where `prompt_tokens` came from when it is an estimate (no usage frame arrived).
    pub prompt_estimate: Option<String>,
}

impl FrameMapper {
    pub fn new(params: &GenerationParams, split: Split, forcing: Forcing, started: Instant) -> Self {
        let phase = if params.thinking.is_on() { Phase::Thinking } else { Phase::Answer };
        FrameMapper {
            tally: Tally::new(params, phase, CountSource::Frames, started),
            split,
            forcing,
            reasoning_seen: false,
            pending: String::new(),
            pending_entries: vec![],
            began: false,
            frames: (0, 0),
            report: Report::default(),
            continued_from: None,
            start_phase: phase,
            server_memory: None,
            prompt_tokens: None,
            prompt_estimate: None,
        }
    }

    /// Whether the prompt's length is known: set (a continuation's tokenizer count, an
    /// estimate) or in a usage frame that arrived.
    pub fn prompt_count_known(&self) -> bool {
        let in_usage = self.report.usage.as_ref().and_then(|u| u.get("prompt_tokens")).and_then(Value::as_u64);
        self.prompt_tokens.is_some() || in_usage.is_some_and(|n| n > 0)
    }

    /// The prompt's length from elsewhere than the server's usage, and where it came from.
    pub fn estimate_prompt(&mut self, tokens: usize, source: String) {
        self.prompt_tokens = Some(tokens);
        self.prompt_estimate = Some(source);
    }

    pub fn start_phase(&self) -> Phase {
        self.start_phase
    }

    pub fn tally(&self) -> &Tally {
        &self.tally
    }

    /// One SSE frame's JSON.
    pub fn frame(&mut self, data: &Value, emit: &mut dyn FnMut(EngineEvent)) -> Flow {
        self.read_report(data);
        let Some(choice) = data.get("choices").and_then(Value::as_array).and_then(|c| c.first()) else {
            return Flow::Continue;
        };
        if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
            self.report.finish = Some(f.to_string());
            self.report.stop_reason = choice.get("stop_reason").or_else(|| choice.get("matched_stop")).cloned();
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
        let mut entries = logprob_entries(choice);
        if self.forcing == Forcing::Client && self.tally.params().top_logprobs == 0 {
            // Asked for the ids only (a client-side budget continues from them).
            entries.iter_mut().for_each(|e| e.top.clear());
        }
        self.frames.0 += 1;
        self.frames.1 += usize::from(!entries.is_empty());
        let (r_entries, c_entries) = assign_entries(entries, reasoning, content);
        let mut flow = Flow::Continue;
        if !reasoning.is_empty() {
            self.reasoning_seen = true;
            flow = self.pieces(Phase::Thinking, reasoning, r_entries, emit);
        }
        if !content.is_empty() && flow == Flow::Continue {
            flow = self.content(content, c_entries, emit);
        }
        if flow == Flow::Continue && self.tally.stats_due() {
            emit(EngineEvent::Stats(self.tally.stats(None, self.server_memory.clone(), None)));
        }
        flow
    }

    fn read_report(&mut self, data: &Value) {
        let r = &mut self.report;
        let keep = |slot: &mut Option<Value>, v: Option<&Value>| {
            if let Some(v) = v.filter(|v| !v.is_null()) {
                *slot = Some(v.clone());
            }
        };
        keep(&mut r.usage, data.get("usage"));
        keep(&mut r.timings, data.get("timings"));
        // SGLang sends several `sglext` objects (spec details, then output ids).
        keep(&mut r.sglext, data.pointer("/sglext/spec_tokens_details"));
        keep(&mut r.vllm_metrics, data.get("metrics"));
        keep(&mut r.extension, data.get("deltascope"));
        if let Some(err) = data.get("error") {
            r.error = Some(error_text(err));
        }
    }

    /// Content text: the answer, or — while the split is ours — thinking up to `</think>`.
    fn content(&mut self, text: &str, entries: Vec<Entry>, emit: &mut dyn FnMut(EngineEvent)) -> Flow {
        let splitting = self.split == Split::Auto && !self.reasoning_seen;
        if !splitting || self.tally.phase() == Phase::Answer {
            return self.pieces(Phase::Answer, text, entries, emit);
        }
        let mut buf = std::mem::take(&mut self.pending);
        buf.push_str(text);
        let mut entries: Vec<Entry> = std::mem::take(&mut self.pending_entries).into_iter().chain(entries).collect();
        // Servers without a reasoning parser re-send the prompt's `<think>\n` first.
        if !self.began {
            if THINK_START.starts_with(buf.as_str()) {
                self.pending = buf;
                self.pending_entries = entries;
                return Flow::Continue;
            }
            if let Some(rest) = buf.strip_prefix(THINK_START) {
                let rest = rest.strip_prefix('\n').unwrap_or(rest).to_string();
                // The re-sent prompt text comes without logprob entries (llama.cpp): they are
                // the generated tokens'. Entries that cover the prefix too go with it.
                let covered: usize = entries.iter().map(|e| e.text.len()).sum();
                if covered > rest.len() {
                    take_entries(&mut entries, &buf[..buf.len() - rest.len()]);
                }
                buf = rest;
            }
        }
        if let Some(at) = buf.find(THINK_END) {
            let (before, rest) = buf.split_at(at);
            let after = &rest[THINK_END.len()..];
            let mut flow = Flow::Continue;
            for (phase, piece) in [(Phase::Thinking, before), (Phase::Thinking, THINK_END), (Phase::Answer, after)] {
                if flow == Flow::Continue && !piece.is_empty() {
                    let e = take_entries(&mut entries, piece);
                    flow = self.pieces(phase, piece, e, emit);
                }
            }
            return flow;
        }
        // Hold back a tail that may be the start of `</think>`: whole tokens when the entries
        // cover the text (the tokens the tail belongs to), else the tail's bytes.
        let keep = (1..THINK_END.len()).rev().find(|&n| buf.ends_with(&THINK_END[..n])).unwrap_or(0);
        let mut emit_len = buf.len() - keep;
        if keep > 0 && entries.iter().map(|e| e.text.len()).sum::<usize>() == buf.len() {
            let mut held = 0;
            while held < keep {
                held += entries[entries.len() - 1 - self.pending_entries.len()].text.len();
                self.pending_entries.insert(0, entries[entries.len() - 1 - self.pending_entries.len()].clone());
            }
            entries.truncate(entries.len() - self.pending_entries.len());
            emit_len = buf.len() - held;
        }
        self.pending = buf[emit_len..].to_string();
        let out = &buf[..emit_len];
        if out.is_empty() {
            return Flow::Continue;
        }
        let e = take_entries(&mut entries, out);
        self.pieces(Phase::Thinking, out, e, emit)
    }

    /// Pushes `text` in `phase`: one token per logprob entry when they cover it, else one token.
    fn pieces(&mut self, phase: Phase, text: &str, entries: Vec<Entry>, emit: &mut dyn FnMut(EngineEvent)) -> Flow {
        self.began = true;
        if phase == Phase::Answer {
            self.close_thinking(emit);
        }
        let tokens = if entries.is_empty() {
            vec![Entry { id: None, text: text.to_string(), logprob: None, top: vec![], placeholder: false }]
        } else {
            entries
        };
        for e in tokens {
            let marker = (phase == Phase::Thinking && e.text == THINK_END).then_some(Marker::Close);
            let forced = self.forced_by_server(phase, marker, emit);
            let piece = TokenPiece {
                id: e.id,
                text: e.text,
                phase,
                marker,
                forced,
                logprob: e.logprob,
                top: e.top,
                ..Default::default()
            };
            if let Verdict::Finish(f) = self.tally.push(piece, emit) {
                // The server ends what it generates; only the loop alarm stops it from here.
                if f == FinishReason::Loop {
                    return Flow::Stop(f);
                }
            }
        }
        Flow::Continue
    }

    /// A thinking token after the budget ran out was forced by the server (the first one
    /// raises the diagnostic).
    fn forced_by_server(&mut self, phase: Phase, marker: Option<Marker>, emit: &mut dyn FnMut(EngineEvent)) -> bool {
        let spent = phase == Phase::Thinking && self.tally.budget_spent();
        let forced = match self.forcing {
            Forcing::Streamed(_) => spent,
            // Such a server forces only `</think>`.
            Forcing::Unmarked(_) => spent && marker.is_some(),
            Forcing::None | Forcing::Client => false,
        };
        if forced {
            self.budget_check(emit);
        }
        forced
    }

    /// Thinking ends (a server's parser took `</think>` out, or the answer began).
    fn close_thinking(&mut self, emit: &mut dyn FnMut(EngineEvent)) {
        if self.tally.phase() == Phase::Thinking {
            self.budget_check(emit);
            self.tally.close_thinking();
        }
    }

    /// Thinking ended with the budget spent and nothing said yet: the server forced it.
    fn budget_check(&mut self, emit: &mut dyn FnMut(EngineEvent)) {
        let who = match self.forcing {
            Forcing::Streamed(w) | Forcing::Unmarked(w) => w,
            _ => return,
        };
        if self.tally.budget_spent() && !self.budget_forced() {
            self.tally.budget_forced(who, None, emit);
        }
    }

    fn budget_forced(&self) -> bool {
        self.tally.raised().iter().any(|(k, _)| *k == DiagnosticKind::ThinkingBudgetForced)
    }

    /// The user asked to end thinking now (the TUI's key): due before the next frame.
    pub fn request_end_of_thinking(&mut self) {
        self.tally.request_end_of_thinking();
    }

    /// The client-side thinking budget ran out (or a loop is rescued): the stream was closed, and the bridge and
    /// `</think>` are forced, one token each (`ids` from the server's tokenizer, when it has
    /// one; else one piece each), before a `/v1/completions` continuation streams the answer.
    /// Only the first `fits` are pushed (max_tokens' room), as the engine forces them; the
    /// close marker only when all are.
    pub fn force_end_of_thinking(
        &mut self,
        forced: Vec<(Option<u32>, String)>,
        fits: usize,
        emit: &mut dyn FnMut(EngineEvent),
    ) {
        self.flush(emit);
        let who =
            if self.tally.rescue_due() { "deltascope (client-side)" } else { "deltascope (--budget-mode client)" };
        self.tally.forced_close(who, Some(forced.len()), emit);
        let last = forced.len().saturating_sub(1);
        for (i, (id, text)) in forced.into_iter().enumerate().take(fits) {
            let marker = (i == last).then_some(Marker::Close);
            let piece = TokenPiece { id, text, phase: Phase::Thinking, marker, forced: true, ..Default::default() };
            self.tally.push(piece, emit);
        }
        self.continued_from = Some(self.tally.generated());
        // The continuation reports its own usage and finish.
        self.report.usage = None;
        self.report.finish = None;
        self.began = true;
    }

    /// Flushes held-back text (a stream that ended on a partial marker).
    fn flush(&mut self, emit: &mut dyn FnMut(EngineEvent)) {
        let rest = std::mem::take(&mut self.pending);
        let mut entries = std::mem::take(&mut self.pending_entries);
        if !rest.is_empty() && (self.began || !THINK_START.starts_with(rest.as_str())) {
            let phase = self.tally.phase();
            let e = take_entries(&mut entries, &rest);
            self.pieces(phase, &rest, e, emit);
        }
    }

    /// The end of the stream: `done` (with the diagnostics a local run would raise) or
    /// `error`. What arrived is kept either way: the tokens were emitted as they came.
    pub fn finish(mut self, end: End, metrics: Option<MetricsDelta>, emit: &mut dyn FnMut(EngineEvent)) {
        self.flush(emit);
        let finish = match self.finish_reason(&end) {
            Ok(f) => f,
            Err((kind, why)) => {
                let n = self.tally.generated();
                let message = match n {
                    0 => why,
                    1 => format!("{why}; kept the 1 token that arrived"),
                    n => format!("{why}; kept the {n} tokens that arrived"),
                };
                // The server's own words may be long or span lines: one line, long quotes cut.
                emit(EngineEvent::error(kind, deltascope_model::brief(&message)));
                return;
            }
        };
        if finish != FinishReason::Cancelled && self.tally.phase() == Phase::Answer {
            self.budget_check(emit);
        }
        let reported = self.reported();
        let counted = if self.frames.0 > 0 && self.frames.1 == self.frames.0 {
            CountSource::Logprobs
        } else {
            CountSource::Frames
        };
        self.tally.set_counted(counted);
        let prefill = self.report.timings.as_ref().and_then(|t| t.get("prompt_per_second")).and_then(Value::as_f64);
        let r = &self.report;
        let completion = reported.completion_tokens.unwrap_or(self.tally.generated());
        let mtp = server_mtp(r.vllm_metrics.as_ref(), r.sglext.as_ref(), r.timings.as_ref(), metrics, completion);
        let estimate = match self.forcing {
            Forcing::Unmarked(who) if self.budget_forced() => Some(format!(
                "{who} does not say which tokens its thinking budget forced: counted as the `</think>` that ended thinking"
            )),
            _ => None,
        };
        let ctx = FinishContext {
            cap: None,
            // No tokenizer here: the forced end of thinking is estimated from the bridge text.
            forced_close: (deltascope_protocol::estimate_forced(&self.tally.params().budget_bridge), false),
            prefill_tok_s: prefill,
            reported,
            memory: None,
            server_memory: self.server_memory.clone(),
            mtp,
            forced_estimate: estimate,
        };
        self.tally.finish(finish, ctx, emit);
    }

    fn finish_reason(&self, end: &End) -> Result<FinishReason, (ErrorKind, String)> {
        // deltascope serve says why a generation failed in its extension's diagnostics (the
        // first NaN: where and which token).
        let diagnosed =
            self.report.extension.as_ref().and_then(|x| x.get("diagnostics")).and_then(Value::as_array).map(|d| {
                d.iter().filter_map(|d| d.get("message").and_then(Value::as_str)).collect::<Vec<_>>().join("; ")
            });
        let error = self.report.error.clone().or(diagnosed.filter(|d| !d.is_empty()));
        match (end, self.report.finish.as_deref()) {
            (End::Cancelled, _) => Ok(FinishReason::Cancelled),
            (End::Stopped(r), _) => Ok(*r),
            (End::Failed(kind, message), _) => Err((*kind, message.clone())),
            (End::Complete, Some("length")) => Ok(FinishReason::Length),
            (End::Complete, Some("stop" | "tool_calls" | "eos")) => Ok(self.stop_kind()),
            (End::Complete, Some("abort")) => {
                Err((ErrorKind::Unavailable, error.unwrap_or_else(|| "the server aborted the request".into())))
            }
            (End::Complete, Some(other)) => {
                let why = format!("the server ended the stream with finish_reason \"{other}\"");
                Err((ErrorKind::Internal, error.map_or(why.clone(), |e| format!("{why}: {e}"))))
            }
            (End::Complete, None) => Err((
                ErrorKind::Unavailable,
                error
                    .map_or("the stream ended without a finish reason (the server closed it mid-answer)".into(), |e| {
                        format!("the server reported an error mid-stream: {e}")
                    }),
            )),
        }
    }

    /// `stop`, or `stop_string` when the server says one of our stop strings matched.
    fn stop_kind(&self) -> FinishReason {
        match self.report.stop_reason.as_ref().and_then(Value::as_str) {
            Some(s) if self.tally.params().stop.iter().any(|x| x == s) => FinishReason::StopString,
            _ => FinishReason::Stop,
        }
    }

    /// The server's own figures for the request, for the tally to reconcile with.
    fn reported(&self) -> Reported {
        let u = self.report.usage.as_ref();
        let field = |v: Option<&Value>, k: &str| v.and_then(|u| u.get(k)).and_then(Value::as_u64).map(|v| v as usize);
        let mut r = Reported {
            prompt_tokens: self.prompt_tokens.or(field(u, "prompt_tokens")),
            prompt_estimate: self.prompt_estimate.clone(),
            completion_tokens: field(u, "completion_tokens"),
            reasoning_tokens: field(u, "reasoning_tokens")
                .or_else(|| field(u.and_then(|u| u.get("completion_tokens_details")), "reasoning_tokens")),
            split: None,
        };
        if let Some(before) = self.continued_from {
            // Pushed before the continuation (thinking and the forced tokens), then what the
            // continuation generated; its prompt re-sent the thinking, so its prompt count and
            // reasoning split are not the user's.
            r.completion_tokens = r.completion_tokens.map(|c| before + c);
            r.prompt_tokens = self.prompt_tokens;
            r.reasoning_tokens = None;
        }
        let x = self.report.extension.as_ref();
        if let (Some(t), Some(a), Some(f)) =
            (field(x, "thinking_tokens"), field(x, "answer_tokens"), field(x, "forced_tokens"))
        {
            r.split = Some((t, a, f));
        }
        r
    }
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

/// The entries at the front of `entries` that make up exactly `piece` (taken out), or none
/// when their texts do not line up with it (then none of the rest can be trusted either: all
/// are dropped, and the pieces go without ids rather than with wrong ones).
fn take_entries(entries: &mut Vec<Entry>, piece: &str) -> Vec<Entry> {
    let mut len = 0;
    let mut n = 0;
    while len < piece.len() && n < entries.len() {
        len += entries[n].text.len();
        n += 1;
    }
    if len == piece.len()
        && piece.starts_with(entries[..n].iter().map(|e| e.text.as_str()).collect::<String>().as_str())
    {
        entries.drain(..n).collect()
    } else {
        entries.clear();
        vec![]
    }
}
