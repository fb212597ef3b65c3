//! The one event stream every front end consumes (design §2). `run --json` prints these
//! serialised, one per line; sessions store them (they deserialise too).
//!
//! The stream has two producers: the in-process engine and a remote OpenAI-compatible server
//! (backend::openai). Fields a remote server cannot fill (token ids without logprobs, memory,
//! per-token draft provenance) are `Option`s left `None`, never made up.

use serde::{Deserialize, Serialize};

use super::params::GenerationParams;
use super::state::StateEvent;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Where a reasoning model's template leaves a prompt with thinking on.
    #[default]
    Thinking,
    Answer,
}

/// Where a token came from (speculative decoding fills in the first two).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftKind {
    Accepted,
    Bonus,
    #[default]
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token (EOS / `<|im_end|>` / a requested stop id).
    Stop,
    /// `max_tokens` (or the answer budget) reached.
    Length,
    StopString,
    Cancelled,
    Loop,
    /// The model produced NaN / ±Inf (a `nonfinite` diagnostic says where); what came before is
    /// kept.
    Error,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::StopString => "stop_string",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Loop => "loop",
            FinishReason::Error => "error",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiagnosticKind {
    /// max_tokens ran out inside the thinking phase: the answer is empty.
    ThinkingExhaustedMaxTokens,
    /// The thinking budget forced the end of thinking.
    ThinkingBudgetForced,
    /// A repeating token period (or a window of repeated n-grams).
    DegenerateLoop,
    /// A loop during thinking was rescued (`--on-loop answer`, or the user's key): the end of
    /// thinking was forced (bridge text, `</think>`) and the model answered.
    LoopRescued,
    /// max_tokens or the answer budget cut the answer.
    AnswerTruncated,
    /// The forward pass produced NaN / ±Inf: the message names the layer and sublayer.
    Nonfinite,
    /// The state trace saw a GDN head's recurrent state go non-finite or explode (‖S‖ over
    /// [`super::state::EXPLODED_NORM`]): the first such head, once per generation.
    StateAlarm,
}

impl DiagnosticKind {
    pub const ALL: [DiagnosticKind; 7] = [
        DiagnosticKind::ThinkingExhaustedMaxTokens,
        DiagnosticKind::ThinkingBudgetForced,
        DiagnosticKind::DegenerateLoop,
        DiagnosticKind::LoopRescued,
        DiagnosticKind::AnswerTruncated,
        DiagnosticKind::Nonfinite,
        DiagnosticKind::StateAlarm,
    ];

    /// The name in the event stream (`degenerate_loop`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            DiagnosticKind::ThinkingExhaustedMaxTokens => "thinking_exhausted_max_tokens",
            DiagnosticKind::ThinkingBudgetForced => "thinking_budget_forced",
            DiagnosticKind::DegenerateLoop => "degenerate_loop",
            DiagnosticKind::LoopRescued => "loop_rescued",
            DiagnosticKind::AnswerTruncated => "answer_truncated",
            DiagnosticKind::Nonfinite => "nonfinite",
            DiagnosticKind::StateAlarm => "state_alarm",
        }
    }
}

/// Why a generation failed: a server maps these to HTTP statuses, the TUI to what it offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The request itself is wrong (bad parameter, empty prompt, unknown model, refused key).
    InvalidRequest,
    /// Prompt + max_tokens do not fit the context.
    ContextOverflow,
    /// Stopped on request before anything could be kept.
    Cancelled,
    /// The backend cannot be reached or stopped answering (connection, timeout, 5xx).
    Unavailable,
    /// A bug or a broken answer (panic, malformed stream).
    Internal,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidRequest => "invalid_request",
            ErrorKind::ContextOverflow => "context_overflow",
            ErrorKind::Cancelled => "cancelled",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Internal => "internal",
        }
    }
}

/// How thinking / answer token counts were obtained (the budget gauge marks estimates "≈").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CountSource {
    /// Counted on token ids by the in-process engine: exact.
    #[default]
    Engine,
    /// The server's own `reasoning_tokens` (exact thinking count; answer = completion − thinking).
    ServerUsage,
    /// One per logprob entry the server streamed (exact for visible tokens; markers such as
    /// `</think>` that arrive without a frame are not seen).
    Logprobs,
    /// One per streamed frame: an estimate (servers may put several tokens in a frame).
    Frames,
}

impl CountSource {
    /// Whether the counts are estimates.
    pub fn is_estimate(self) -> bool {
        matches!(self, CountSource::Frames)
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Where the prompt count came from when it is an estimate (a server's stream closed before
    /// its usage frame: the server's /tokenize, the local tokenizer, …); `None` when exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_estimate: Option<String>,
    pub thinking_tokens: usize,
    pub answer_tokens: usize,
    pub completion_tokens: usize,
    /// Of the completion tokens, how many the engine forced (budget bridge and `</think>`).
    #[serde(default)]
    pub forced_tokens: usize,
    /// Where the thinking / answer split comes from.
    #[serde(default)]
    pub counted: CountSource,
    /// Why the forced-token count is an estimate (a server that does not say which tokens its
    /// thinking budget forced); `None` when it is exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Timing {
    /// Request start to the first generated token; `None` when none came (cancelled first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    pub prefill_tok_s: f64,
    /// Generated tokens after the first, per second of decoding.
    pub decode_tok_s: f64,
    pub total_ms: f64,
}

/// Bytes held by the in-process engine (a remote server reports none of these).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Memory {
    pub weights_bytes: usize,
    pub kv_bytes: usize,
    pub recurrent_bytes: usize,
    pub snapshot_bytes: usize,
    /// Each device's share, when the model runs on GPUs (empty on the CPU: the totals are it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceMemory>,
}

/// One device's share of the engine's memory.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct DeviceMemory {
    /// "cuda:0".
    pub device: String,
    pub weights_bytes: usize,
    pub kv_bytes: usize,
    pub recurrent_bytes: usize,
}

/// A remote server's own memory figure: the share of its KV pool in use (from `/metrics`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerMemory {
    /// 0–1.
    pub kv_used_fraction: f64,
    /// The metric it was read from (`vllm:kv_cache_usage_perc`, …).
    pub metric: String,
}

/// An alternative token at a position.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Alternative {
    /// `None` when the server gives token texts only (OpenAI-style logprobs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    pub logprob: f32,
    pub text: String,
}

/// The server behind a remote backend, as detected (status bar, `run --json` start event).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ServerLabel {
    /// `llama.cpp`, `vLLM`, `SGLang` or `OpenAI-compatible`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    pub url: String,
}

/// What computed an in-process generation's numbers (`run --json`'s start event, and so every
/// trace): two healthy engines differ by the rounding these imply, which `trace --compare`
/// allows for.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Numerics {
    /// "cpu", "cuda:0", "emu:0,1".
    pub device: String,
    /// The activation precision: "f32" or "bf16".
    pub dtype: String,
    /// The CPU kernel family ("portable", "avx2", "avx512", "avx512_bf16", "amx"), or "cuda" /
    /// "emu" for the GPU engine's kernels.
    pub kernel: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StartEvent {
    pub model: String,
    /// Known up front for the in-process engine; a remote server reports it with the usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<usize>,
    /// The phase the prompt leaves the model in (a prompt ending inside `<think>` starts in
    /// thinking).
    pub phase: Phase,
    pub params: GenerationParams,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerLabel>,
    /// The in-process engine's device, precision and kernels (`None` for a server, and in
    /// sessions and traces recorded before it was written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numerics: Option<Numerics>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TokenEvent {
    /// 0-based index among the generated tokens (frames, for a remote server without logprobs).
    #[serde(default)]
    pub index: usize,
    pub phase: Phase,
    /// `None` when a remote server did not say (it gives ids only with logprobs, and not all).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u32>,
    /// The text this token completes (empty while a UTF-8 character is incomplete, and
    /// for stop tokens).
    pub text: String,
    /// Log-probability under the model's raw distribution (before penalties and
    /// temperature); 0 for forced tokens; `None` when the server sent none for this token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprob: Option<f32>,
    /// Speculative-decoding provenance; `None` when unknown (remote servers do not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft: Option<DraftKind>,
    /// Injected by the engine (thinking-budget bridge and `</think>`), not sampled.
    #[serde(default)]
    pub forced: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty", alias = "top")]
    pub top_logprobs: Vec<Alternative>,
    /// Entropy in nats of the model's raw distribution at this position, over the whole
    /// vocabulary (the local engine; a server sends only the top alternatives).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entropy: Option<f32>,
}

/// Running totals, every few tokens (for live gauges).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct StatsEvent {
    pub generated: usize,
    pub thinking_tokens: usize,
    pub answer_tokens: usize,
    #[serde(default)]
    pub counted: CountSource,
    pub tok_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_memory: Option<ServerMemory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpStats>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Diagnostic {
    pub kind: DiagnosticKind,
    /// Index of the generated token the diagnostic refers to.
    pub at_token: usize,
    pub message: String,
    /// Loop period and start (degenerate_loop, and loop_rescued for a loop's rescue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<usize>,
    /// The settings that fix it (thinking_exhausted_max_tokens, answer_truncated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<super::advice::Fix>,
    /// The decoder layer and GDN value head it names (state_alarm, and nonfinite when a
    /// recurrent state went first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head: Option<usize>,
}

impl Diagnostic {
    pub fn new(kind: DiagnosticKind, at_token: usize, message: impl Into<String>) -> Self {
        Diagnostic {
            kind,
            at_token,
            message: message.into(),
            period: None,
            start: None,
            fix: None,
            layer: None,
            head: None,
        }
    }

    /// The settings that fix it.
    pub fn with_fix(mut self, fix: super::advice::Fix) -> Self {
        self.fix = Some(fix);
        self
    }

    /// A loop's period and first token.
    pub fn with_loop(mut self, period: usize, start: usize) -> Self {
        self.period = Some(period);
        self.start = Some(start);
        self
    }

    /// The decoder layer and GDN value head it names.
    pub fn at_head(mut self, layer: Option<usize>, head: Option<usize>) -> Self {
        self.layer = layer;
        self.head = head;
        self
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DoneEvent {
    pub finish_reason: FinishReason,
    pub usage: Usage,
    pub timing: Timing,
    /// Speculative-decoding metrics (MTP), when drafting ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpStats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_memory: Option<ServerMemory>,
    /// Thinking text (without the `</think>` marker).
    pub thinking: String,
    /// Answer text (without the stop token or stop string).
    pub answer: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ErrorEvent {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EngineEvent {
    Start(StartEvent),
    Token(TokenEvent),
    Stats(StatsEvent),
    Diagnostic(Diagnostic),
    /// What the recurrent state did (`--trace-state`): after the prompt and every token.
    State(StateEvent),
    Done(DoneEvent),
    Error(ErrorEvent),
}

impl EngineEvent {
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        EngineEvent::Error(ErrorEvent { kind, message: message.into() })
    }

    /// `done` or `error`: nothing follows in this generation's stream.
    pub fn is_terminal(&self) -> bool {
        matches!(self, EngineEvent::Done(_) | EngineEvent::Error(_))
    }
}

/// Speculative-decoding metrics of one generation (the engine measures them; a server reports them).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MtpStats {
    /// The depth in use (changes under `auto`).
    pub depth: usize,
    /// Verify passes.
    pub steps: usize,
    pub drafted: usize,
    pub accepted: usize,
    pub acceptance_rate: f64,
    /// Acceptance rate at each draft position (1st draft, 2nd, …): accepted there / drafted there.
    pub per_position: Vec<f64>,
    /// Tokens each verify pass produced on average: accepted drafts plus the pass's own (bonus)
    /// token — so 1.0 means every draft was rejected.
    pub mean_accepted_length: f64,
    /// Tokens produced per verify pass, pass by pass (accepted drafts + bonus).
    pub history: Vec<usize>,
    pub draft_ms: f64,
    pub verify_ms: f64,
    /// Bytes held for rollback by the last verify pass (the GDN tapes).
    pub snapshot_bytes: usize,
    /// `[drafted, accepted]` at each draft position: the counts behind `per_position`, kept so
    /// stats merge exactly and a saved session reloads to the same value.
    #[serde(default, rename = "position_counts")]
    counts: Vec<(usize, usize)>,
    /// Where a remote backend's figures come from (e.g. "llama.cpp timings.draft_n; per
    /// position from /metrics"); `None` when the in-process engine measured them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl MtpStats {
    pub fn new(depth: usize) -> Self {
        MtpStats { depth, ..Default::default() }
    }

    /// Adds another generation's numbers (for totals over several prompts).
    pub fn merge(&mut self, o: &MtpStats) {
        self.steps += o.steps;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        if self.counts.len() < o.counts.len() {
            self.counts.resize(o.counts.len(), (0, 0));
        }
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            a.0 += b.0;
            a.1 += b.1;
        }
        self.history.extend_from_slice(&o.history);
        self.draft_ms += o.draft_ms;
        self.verify_ms += o.verify_ms;
        self.snapshot_bytes = self.snapshot_bytes.max(o.snapshot_bytes);
        self.depth = o.depth;
        self.acceptance_rate = self.accepted as f64 / self.drafted.max(1) as f64;
        self.per_position = self.counts.iter().map(|(d, a)| *a as f64 / (*d).max(1) as f64).collect();
        self.mean_accepted_length = self.history.iter().sum::<usize>() as f64 / self.steps.max(1) as f64;
    }

    /// A remote server's figures for one request: `steps` verify passes (0 when it does not
    /// say), `drafted` / `accepted` draft tokens, `[drafted, accepted]` per draft position
    /// where known, and where the numbers came from.
    pub fn from_server(
        depth: usize,
        steps: usize,
        drafted: usize,
        accepted: usize,
        counts: Vec<(usize, usize)>,
        mean_accepted_length: f64,
        source: String,
    ) -> Self {
        MtpStats {
            depth,
            steps,
            drafted,
            accepted,
            acceptance_rate: accepted as f64 / drafted.max(1) as f64,
            per_position: counts.iter().map(|(d, a)| *a as f64 / (*d).max(1) as f64).collect(),
            mean_accepted_length,
            counts,
            source: Some(source),
            ..Default::default()
        }
    }

    /// Records one verify pass: `drafted` drafts, the first `accepted` of them kept, `produced`
    /// tokens appended in all (accepted + bonus, or fewer when generation stopped inside).
    /// `(drafted, accepted)` at each draft position.
    pub fn position_counts(&self) -> &[(usize, usize)] {
        &self.counts
    }

    pub fn record(&mut self, drafted: usize, accepted: usize, produced: usize) {
        self.steps += 1;
        self.drafted += drafted;
        self.accepted += accepted;
        if self.counts.len() < drafted {
            self.counts.resize(drafted, (0, 0));
        }
        for i in 0..drafted {
            self.counts[i].0 += 1;
            if i < accepted {
                self.counts[i].1 += 1;
            }
        }
        self.history.push(produced);
        self.acceptance_rate = self.accepted as f64 / self.drafted.max(1) as f64;
        self.per_position = self.counts.iter().map(|(d, a)| *a as f64 / (*d).max(1) as f64).collect();
        self.mean_accepted_length = self.history.iter().sum::<usize>() as f64 / self.steps as f64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_serialised_form() {
        for k in DiagnosticKind::ALL {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
        for r in [
            FinishReason::Stop,
            FinishReason::Length,
            FinishReason::StopString,
            FinishReason::Cancelled,
            FinishReason::Loop,
            FinishReason::Error,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
        for k in [
            ErrorKind::InvalidRequest,
            ErrorKind::ContextOverflow,
            ErrorKind::Cancelled,
            ErrorKind::Unavailable,
            ErrorKind::Internal,
        ] {
            assert_eq!(serde_json::to_value(k).unwrap(), k.as_str());
        }
    }

    #[test]
    fn events_round_trip_through_json() {
        let ev = EngineEvent::Token(TokenEvent {
            index: 3,
            phase: Phase::Answer,
            id: None,
            text: "No".into(),
            logprob: None,
            draft: None,
            forced: false,
            top_logprobs: vec![Alternative { id: None, logprob: -0.5, text: "Yes".into() }],
            entropy: None,
        });
        let line = serde_json::to_string(&ev).unwrap();
        assert!(line.starts_with(r#"{"event":"token","#), "{line}");
        assert!(!line.contains("\"id\""), "an unknown id is left out, not faked: {line}");
        assert_eq!(serde_json::from_str::<EngineEvent>(&line).unwrap(), ev);
        let err = EngineEvent::error(ErrorKind::Unavailable, "connection refused");
        let line = serde_json::to_string(&err).unwrap();
        assert_eq!(line, r#"{"event":"error","kind":"unavailable","message":"connection refused"}"#);
        assert_eq!(serde_json::from_str::<EngineEvent>(&line).unwrap(), err);
    }
}
