//! One turn of a conversation: the user's message, the settings it ran with, every event
//! that came back (with its arrival time) and what they add up to; and the event stream
//! rebuilt from them for replay.

use serde::{Deserialize, Serialize};

use deltascope_protocol::{
    CountSource, Diagnostic, DiagnosticKind, DoneEvent, EngineEvent, ErrorEvent, FinishReason, Fix, GenerationParams,
    Memory, MtpMode, MtpStats, Phase, ServerLabel, ServerMemory, StartEvent, StateEvent, StatsEvent, Thinking, Timing,
    TokenEvent, Usage, estimate_forced, starved, truncated,
};

/// An engine event and when it arrived (milliseconds since the request was sent). Stored
/// flattened: `{"t_ms": 12.5, "phase": "thinking", "text": "…", …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Timed<T> {
    pub t_ms: f64,
    #[serde(flatten)]
    pub ev: T,
}

impl<T> std::ops::Deref for Timed<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.ev
    }
}

/// What the `done` event reported, plus timings the front end measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TurnStats {
    /// The running totals as they arrived. A sample's MTP `history` is a prefix of the next
    /// sample's, so only the latest keeps it (a long turn's record grows linearly, not with
    /// the square of its length); [`Turn::replay_events`] rebuilds the prefixes.
    #[serde(default)]
    pub samples: Vec<Timed<StatsEvent>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<Timing>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_memory: Option<ServerMemory>,
    /// When the `start` event arrived (prefill begins).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ms: Option<f64>,
    /// When the first thinking token arrived, and when thinking ended (first answer token or
    /// the end of generation): the thinking pane's duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_start_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking_end_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_ms: Option<f64>,
}

/// One user message and the model's reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    pub user: String,
    /// The file's record of the template switch (`params.thinking` is what counts): files
    /// written before thinking was one setting say "off" here with any budget in `params`,
    /// which [`Turn::reconcile_thinking`] folds into `params.thinking` when a session loads.
    enable_thinking: bool,
    pub params: GenerationParams,
    /// From `start` (local engine) or the final usage (remote server).
    #[serde(default)]
    pub prompt_tokens: usize,
    /// The server that generated this turn (`None`: the in-process engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerLabel>,
    /// The phase the prompt left the model in.
    #[serde(default)]
    pub start_phase: Phase,
    /// Final texts (from `done`; built from tokens while streaming).
    #[serde(default)]
    pub thinking: String,
    #[serde(default)]
    pub answer: String,
    /// Every generated token with its arrival time. Stored as columns (one array per field,
    /// see [`super::compact`]): a third of the size of one object per token.
    #[serde(default, with = "super::compact::tokens")]
    pub tokens: Vec<Timed<TokenEvent>>,
    #[serde(default)]
    pub diagnostics: Vec<Timed<Diagnostic>>,
    /// The state trace (`--trace-state`): after the prompt and every generated token.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<Timed<StateEvent>>,
    #[serde(default)]
    pub stats: TurnStats,
    /// `None` while streaming (or when the program stopped mid-turn).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<deltascope_protocol::ErrorKind>,
    /// This turn re-ran turn N's prompt with other settings (a comparison).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compare_of: Option<usize>,
    /// How many times the answer was continued after being cut short.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub continued: u32,
    /// While a continuation streams: what the turn held before it (events of the continuation
    /// are appended to it, not put in its place).
    #[serde(skip)]
    continuation: Option<ContinuationBase>,
    /// Fields this build does not know (written by a newer one): kept as they were, so a
    /// rewrite does not drop them.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A turn as it was when a continuation started.
#[derive(Debug, Clone, PartialEq)]
struct ContinuationBase {
    tokens: usize,
    thinking: String,
    answer: String,
    usage: Option<Usage>,
}

impl Turn {
    /// The state trace as of generated token `token` (`None`: the latest pass): the last pass
    /// that read that token or an earlier one (the prompt's for none), with its index in
    /// [`Turn::states`]. `None` when the turn has no trace.
    pub fn state_at(&self, token: Option<usize>) -> Option<(usize, &StateEvent)> {
        let n = match token {
            None => self.states.len(),
            Some(i) => self.states.partition_point(|s| s.ev.at_token.is_none_or(|a| a <= i)),
        };
        let idx = n.checked_sub(1)?;
        Some((idx, &self.states[idx].ev))
    }

    pub fn new(user: impl Into<String>, params: GenerationParams) -> Self {
        Turn {
            user: user.into(),
            enable_thinking: params.thinking.is_on(),
            params,
            prompt_tokens: 0,
            server: None,
            start_phase: Phase::Thinking,
            thinking: String::new(),
            answer: String::new(),
            tokens: vec![],
            diagnostics: vec![],
            states: vec![],
            stats: TurnStats::default(),
            finish_reason: None,
            error: None,
            error_kind: None,
            compare_of: None,
            continued: 0,
            continuation: None,
            extra: Default::default(),
        }
    }

    /// Whether the turn failed: an error event, or a generation the engine stopped with finish
    /// `error` (NaN / ±Inf from the model). A failed turn is not part of the conversation.
    pub fn failed(&self) -> bool {
        self.error.is_some() || self.finish_reason == Some(FinishReason::Error)
    }

    /// Whether this turn can be continued: it stopped at `max_tokens` or was cancelled, with
    /// no error.
    pub fn can_continue(&self) -> bool {
        self.error.is_none() && matches!(self.finish_reason, Some(FinishReason::Length | FinishReason::Cancelled))
    }

    /// Everything generated so far, verbatim (thinking, `</think>`, answer): what a
    /// continuation's prompt ends with.
    pub fn generated_text(&self) -> String {
        self.tokens.iter().map(|t| t.text.as_str()).collect()
    }

    /// Prepares the turn to receive a continuation of up to `more` tokens: its events extend
    /// the turn, and its `max_tokens` grows by `more` (the turn's budget is what all its
    /// generations together may use). The diagnostics of the cut (empty answer, answer cut)
    /// are resolved by continuing, so they go.
    pub fn begin_continuation(&mut self, more: usize) {
        self.params.max_tokens += more;
        self.continuation = Some(ContinuationBase {
            tokens: self.tokens.len(),
            thinking: self.thinking.clone(),
            answer: self.answer.clone(),
            usage: self.stats.usage.clone(),
        });
        self.continued += 1;
        self.finish_reason = None;
        self.diagnostics.retain(|d| {
            !matches!(d.kind, DiagnosticKind::ThinkingExhaustedMaxTokens | DiagnosticKind::AnswerTruncated)
        });
    }

    /// The arrival time of the last event so far (a continuation's times carry on from it).
    pub fn last_event_ms(&self) -> f64 {
        let last_token = self.tokens.last().map(|t| t.t_ms).unwrap_or(0.0);
        last_token.max(self.stats.done_ms.unwrap_or(0.0))
    }

    /// Records one engine event that arrived `t_ms` after the request was sent.
    pub fn apply(&mut self, ev: &EngineEvent, t_ms: f64) {
        // Microsecond resolution is plenty, and short decimals keep the JSON small.
        let t_ms = (t_ms * 1000.0).round() / 1000.0;
        match ev {
            EngineEvent::Start(st) if self.continuation.is_some() => self.server = st.server.clone(),
            EngineEvent::Start(st) => {
                self.prompt_tokens = st.prompt_tokens.unwrap_or(0);
                self.start_phase = st.phase;
                self.server = st.server.clone();
                self.stats.start_ms = Some(t_ms);
            }
            EngineEvent::Token(tok) => {
                match tok.phase {
                    Phase::Thinking => {
                        self.stats.thinking_start_ms.get_or_insert(t_ms);
                        self.thinking.push_str(&tok.text);
                    }
                    Phase::Answer => {
                        if self.stats.thinking_start_ms.is_some() {
                            self.stats.thinking_end_ms.get_or_insert(t_ms);
                        }
                        self.answer.push_str(&tok.text);
                    }
                }
                let mut tok = tok.clone();
                if let Some(base) = &self.continuation {
                    tok.index += base.tokens;
                }
                self.tokens.push(Timed { t_ms, ev: tok });
            }
            EngineEvent::Stats(s) => {
                self.stats.samples.push(Timed { t_ms, ev: s.clone() });
                let n = self.stats.samples.len();
                if n >= 2 {
                    clear_repeated_history(&mut self.stats.samples[n - 2..]);
                }
            }
            EngineEvent::Diagnostic(d) => {
                let mut d = d.clone();
                // A continuation counts its tokens from 0; the turn counts from its first.
                if let Some(base) = &self.continuation {
                    d.at_token += base.tokens;
                    d.start = d.start.map(|s| s + base.tokens);
                }
                self.diagnostics.push(Timed { t_ms, ev: d });
            }
            EngineEvent::State(st) => {
                let mut st = st.clone();
                if let (Some(base), Some(at)) = (&self.continuation, st.at_token.as_mut()) {
                    *at += base.tokens;
                }
                self.states.push(Timed { t_ms, ev: st });
            }
            EngineEvent::Done(d) => {
                self.finish_reason = Some(d.finish_reason);
                if self.prompt_tokens == 0 {
                    self.prompt_tokens = d.usage.prompt_tokens;
                }
                let base = self.continuation.take();
                self.stats.usage = Some(match base.as_ref().and_then(|b| b.usage.as_ref()) {
                    Some(before) => Usage {
                        prompt_tokens: before.prompt_tokens,
                        prompt_estimate: before.prompt_estimate.clone(),
                        thinking_tokens: before.thinking_tokens + d.usage.thinking_tokens,
                        answer_tokens: before.answer_tokens + d.usage.answer_tokens,
                        completion_tokens: before.completion_tokens + d.usage.completion_tokens,
                        forced_tokens: before.forced_tokens + d.usage.forced_tokens,
                        counted: d.usage.counted,
                        estimate: d.usage.estimate.clone().or_else(|| before.estimate.clone()),
                    },
                    None => d.usage.clone(),
                });
                self.stats.timing = Some(d.timing.clone());
                self.stats.mtp = d.mtp.clone();
                self.stats.memory = d.memory.clone();
                self.stats.server_memory = d.server_memory.clone();
                if self.stats.thinking_start_ms.is_some() {
                    self.stats.thinking_end_ms.get_or_insert(t_ms);
                }
                self.stats.done_ms = Some(t_ms);
                // The engine's texts are authoritative: stop strings are cut from them.
                match base {
                    Some(b) => {
                        self.thinking = b.thinking + &d.thinking;
                        self.answer = b.answer + &d.answer;
                    }
                    None => {
                        self.thinking = d.thinking.clone();
                        self.answer = d.answer.clone();
                    }
                }
            }
            EngineEvent::Error(e) => {
                self.continuation = None;
                self.error = Some(e.message.clone());
                self.error_kind = Some(e.kind);
                self.stats.done_ms.get_or_insert(t_ms);
            }
        }
    }

    /// This turn's settings, labelled, in the sliders' order (the compare view and the
    /// Markdown export show them).
    pub fn settings(&self) -> Vec<(&'static str, String)> {
        let p = &self.params;
        let s = &p.sampling;
        vec![
            ("max_tokens", p.max_tokens.to_string()),
            ("thinking budget", p.thinking.to_string()),
            ("temperature", format!("{:.2}", s.temperature)),
            ("top-p", format!("{:.2}", s.top_p)),
            ("top-k", s.top_k.to_string()),
            ("min-p", format!("{:.2}", s.min_p)),
            ("presence", format!("{:.1}", s.presence_penalty)),
            ("frequency", format!("{:.1}", s.frequency_penalty)),
            ("repetition", format!("{:.2}", s.repetition_penalty)),
            ("MTP depth", mtp_label(&p.mtp)),
            ("seed", s.seed.to_string()),
        ]
    }

    /// Folds an older file's `enable_thinking: false` into `params.thinking` (off, whatever
    /// budget it stored), so the record and the setting say the same.
    pub fn reconcile_thinking(&mut self) {
        if !self.enable_thinking {
            self.params.thinking = Thinking::Off;
        }
        self.enable_thinking = self.params.thinking.is_on();
    }

    pub fn is_finished(&self) -> bool {
        self.finish_reason.is_some() || self.error.is_some()
    }

    /// Thinking tokens: the final usage once done (a server may generate tokens it does not
    /// stream, such as `</think>`), else the token events so far.
    /// Generated thinking tokens; the forced ones are counted apart ([`Turn::forced_tokens`]).
    pub fn thinking_tokens(&self) -> usize {
        match &self.stats.usage {
            Some(u) => u.thinking_tokens,
            None => self.tokens.iter().filter(|t| t.phase == Phase::Thinking && !t.forced).count(),
        }
    }

    /// Generated answer tokens (a forced blank line after `</think>` is not one).
    pub fn answer_tokens(&self) -> usize {
        match &self.stats.usage {
            Some(u) => u.answer_tokens,
            None => self.tokens.iter().filter(|t| t.phase == Phase::Answer && !t.forced).count(),
        }
    }

    /// The one-key fixes of the turn's last diagnostic that has any: the engine's, or for a
    /// file written before diagnostics carried them, worked out the same way from the turn's
    /// settings (the forced end of thinking estimated from the bridge text). `cap`: the most
    /// max_tokens may be (the context).
    pub fn fix(&self, cap: usize) -> Option<Fix> {
        self.diagnostics.iter().rev().find_map(|d| {
            let p = &self.params;
            match (d.fix, d.kind) {
                (Some(f), _) => Some(f),
                (None, DiagnosticKind::ThinkingExhaustedMaxTokens) => {
                    let forced = (estimate_forced(&p.budget_bridge), false);
                    Some(starved(p.max_tokens, self.thinking_tokens(), p.thinking.budget(), forced, cap).0)
                }
                (None, DiagnosticKind::AnswerTruncated) => {
                    let by_budget = p.answer_budget.is_some_and(|b| self.answer_tokens() >= b);
                    Some(truncated(p.max_tokens, by_budget, cap))
                }
                _ => None,
            }
        })
    }

    /// Tokens forced by a thinking budget: bridge text and `</think>`.
    pub fn forced_tokens(&self) -> usize {
        match &self.stats.usage {
            Some(u) => u.forced_tokens,
            None => self.tokens.iter().filter(|t| t.forced).count(),
        }
    }

    /// Why [`forced_tokens`](Self::forced_tokens) is an estimate (a server that does not say
    /// which tokens its thinking budget forced); `None` when it is exact or not reported yet.
    pub fn forced_estimate(&self) -> Option<&str> {
        self.stats.usage.as_ref().and_then(|u| u.estimate.as_deref())
    }

    /// Where the prompt count came from when it is an estimate (a server's stream closed
    /// before its usage frame).
    pub fn prompt_estimate(&self) -> Option<&str> {
        self.stats.usage.as_ref().and_then(|u| u.prompt_estimate.as_deref())
    }

    /// All generated tokens, forced ones included (what max_tokens counts).
    pub fn completion_tokens(&self) -> usize {
        self.thinking_tokens() + self.forced_tokens() + self.answer_tokens()
    }

    /// Format 3 and older counted forced tokens inside the thinking and answer counts too.
    pub(super) fn uncount_forced_tokens(&mut self) {
        let (thinking, answer) = self.tokens.iter().filter(|t| t.forced).fold((0, 0), |(t, a), x| match x.phase {
            Phase::Thinking => (t + 1, a),
            Phase::Answer => (t, a + 1),
        });
        if let Some(u) = self.stats.usage.as_mut().filter(|u| u.forced_tokens > 0) {
            u.thinking_tokens = u.thinking_tokens.saturating_sub(thinking);
            u.answer_tokens = u.answer_tokens.saturating_sub(answer);
        }
    }

    /// How the thinking / answer counts were obtained (estimates are shown with "≈").
    pub fn counted(&self) -> CountSource {
        match &self.stats.usage {
            Some(u) => u.counted,
            None => self.stats.samples.last().map(|s| s.counted).unwrap_or_default(),
        }
    }

    /// How long thinking took, in ms (still running: up to the last token).
    pub fn thinking_ms(&self) -> Option<f64> {
        let start = self.stats.thinking_start_ms?;
        let end = self.stats.thinking_end_ms.or_else(|| self.tokens.last().map(|t| t.t_ms))?;
        Some((end - start).max(0.0))
    }

    /// The latest memory numbers (live sample, or the final ones); `None` from a remote server.
    pub fn memory(&self) -> Option<&Memory> {
        self.stats.memory.as_ref().or_else(|| self.stats.samples.last().and_then(|s| s.memory.as_ref()))
    }

    /// A remote server's latest KV usage, when it reports one.
    pub fn server_memory(&self) -> Option<&ServerMemory> {
        self.stats.server_memory.as_ref().or_else(|| self.stats.samples.last().and_then(|s| s.server_memory.as_ref()))
    }

    /// The latest MTP numbers (live sample, or the final ones).
    pub fn mtp(&self) -> Option<&MtpStats> {
        self.stats.mtp.as_ref().or_else(|| self.stats.samples.iter().rev().find_map(|s| s.mtp.as_ref()))
    }

    /// Clears every stats sample's MTP history that the next sample repeats (what recording
    /// does as samples arrive; a file written before version 3 holds them all).
    pub fn clear_repeated_histories(&mut self) {
        for i in 1..self.stats.samples.len() {
            clear_repeated_history(&mut self.stats.samples[i - 1..=i]);
        }
    }

    /// The stats samples as the engine sent them: each cleared MTP history rebuilt as the
    /// prefix (one entry per verify pass) of the nearest later history kept.
    fn replay_samples(&self) -> Vec<Timed<StatsEvent>> {
        let mut out = self.stats.samples.clone();
        let mut later: Option<Vec<usize>> = None;
        for s in out.iter_mut().rev() {
            let Some(m) = s.ev.mtp.as_mut() else { continue };
            match &later {
                Some(h) if m.history.is_empty() && m.steps > 0 && h.len() >= m.steps => {
                    m.history = h[..m.steps].to_vec();
                }
                _ if !m.history.is_empty() => later = Some(m.history.clone()),
                _ => {}
            }
        }
        out
    }

    /// Rebuilds this turn's event stream with the original arrival times, for replay.
    pub fn replay_events(&self) -> Vec<(f64, EngineEvent)> {
        let mut out = vec![];
        let start_ms = self.stats.start_ms.unwrap_or(0.0);
        out.push((
            start_ms,
            EngineEvent::Start(StartEvent {
                model: String::new(),
                prompt_tokens: Some(self.prompt_tokens).filter(|&n| n > 0),
                phase: self.start_phase,
                params: self.params.clone(),
                server: self.server.clone(),
                numerics: None,
            }),
        ));
        out.extend(self.tokens.iter().map(|t| (t.t_ms, EngineEvent::Token(t.ev.clone()))));
        out.extend(self.replay_samples().into_iter().map(|s| (s.t_ms, EngineEvent::Stats(s.ev))));
        out.extend(self.diagnostics.iter().map(|d| (d.t_ms, EngineEvent::Diagnostic(d.ev.clone()))));
        out.extend(self.states.iter().map(|s| (s.t_ms, EngineEvent::State(s.ev.clone()))));
        let end_ms = self.stats.done_ms.unwrap_or_else(|| self.tokens.last().map(|t| t.t_ms).unwrap_or(start_ms));
        if let Some(reason) = self.finish_reason {
            out.push((
                end_ms,
                EngineEvent::Done(DoneEvent {
                    finish_reason: reason,
                    usage: self.stats.usage.clone().unwrap_or_default(),
                    timing: self.stats.timing.clone().unwrap_or_default(),
                    mtp: self.stats.mtp.clone(),
                    memory: self.stats.memory.clone(),
                    server_memory: self.stats.server_memory.clone(),
                    thinking: self.thinking.clone(),
                    answer: self.answer.clone(),
                }),
            ));
        } else if let Some(message) = &self.error {
            let kind = self.error_kind.unwrap_or(deltascope_protocol::ErrorKind::Internal);
            out.push((end_ms, EngineEvent::Error(ErrorEvent { kind, message: message.clone() })));
        }
        // A stable sort keeps the engine's order for events with the same timestamp.
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// `pair` is (earlier sample, next sample): the earlier one's MTP history goes when the next
/// one's starts with it, so [`Turn::replay_events`] can rebuild it exactly.
fn clear_repeated_history(pair: &mut [Timed<StatsEvent>]) {
    let [prev, next] = pair else { return };
    if let (Some(p), Some(n)) = (prev.ev.mtp.as_mut(), next.ev.mtp.as_ref())
        && n.history.starts_with(&p.history)
    {
        p.history = Vec::new();
    }
}

/// The MTP setting as shown: `auto`, or the draft depth (0 = off).
pub fn mtp_label(m: &MtpMode) -> String {
    m.to_string()
}
