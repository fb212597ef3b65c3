//! The one event stream every front end consumes (design §2). `run --json` prints these
//! serialised, one per line.

use serde::Serialize;

use super::request::GenerationParams;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Thinking,
    Answer,
}

/// Where a token came from (speculative decoding fills in the first two).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftKind {
    Accepted,
    Bonus,
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token (EOS / `<|im_end|>`).
    Stop,
    /// `max_tokens` reached.
    Length,
    StopString,
    Cancelled,
    Loop,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::StopString => "stop_string",
            FinishReason::Cancelled => "cancelled",
            FinishReason::Loop => "loop",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub thinking_tokens: usize,
    pub answer_tokens: usize,
    pub completion_tokens: usize,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Timing {
    /// Request start to the first generated token.
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    /// Generated tokens after the first, per second of decoding.
    pub decode_tok_s: f64,
    pub total_ms: f64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Memory {
    pub weights_bytes: usize,
    pub kv_bytes: usize,
    pub recurrent_bytes: usize,
    pub snapshot_bytes: usize,
}

#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EngineEvent {
    Start {
        model: String,
        prompt_tokens: usize,
        /// The phase the prompt leaves the model in (a prompt ending inside `<think>` starts in
        /// thinking).
        phase: Phase,
        params: GenerationParams,
    },
    Token {
        /// 0-based index among the generated tokens.
        index: usize,
        phase: Phase,
        id: u32,
        /// The text this token completes (empty while a UTF-8 character is incomplete, and
        /// for the stop token).
        text: String,
        /// Log-probability under the model's raw distribution (temperature 1).
        logprob: f32,
        draft: DraftKind,
        forced: bool,
    },
    Done {
        finish_reason: FinishReason,
        usage: Usage,
        timing: Timing,
        memory: Memory,
        /// Thinking text (without the `</think>` marker).
        thinking: String,
        /// Answer text (without the stop token).
        answer: String,
    },
    Error {
        message: String,
    },
}
