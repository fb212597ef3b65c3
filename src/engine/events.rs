//! The one event stream every front end consumes (design §2). `run --json` prints these
//! serialised, one per line.

use serde::{Deserialize, Serialize};

use super::request::GenerationParams;
use super::speculative::MtpStats;

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DiagnosticKind {
    /// max_tokens ran out inside the thinking phase: the answer is empty.
    ThinkingExhaustedMaxTokens,
    /// The thinking budget forced the end of thinking.
    ThinkingBudgetForced,
    /// A repeating token period (or a window of repeated n-grams).
    DegenerateLoop,
    /// max_tokens or the answer budget cut the answer.
    AnswerTruncated,
}

impl DiagnosticKind {
    pub const ALL: [DiagnosticKind; 4] = [
        DiagnosticKind::ThinkingExhaustedMaxTokens,
        DiagnosticKind::ThinkingBudgetForced,
        DiagnosticKind::DegenerateLoop,
        DiagnosticKind::AnswerTruncated,
    ];

    /// The name in the event stream (`degenerate_loop`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            DiagnosticKind::ThinkingExhaustedMaxTokens => "thinking_exhausted_max_tokens",
            DiagnosticKind::ThinkingBudgetForced => "thinking_budget_forced",
            DiagnosticKind::DegenerateLoop => "degenerate_loop",
            DiagnosticKind::AnswerTruncated => "answer_truncated",
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub thinking_tokens: usize,
    pub answer_tokens: usize,
    pub completion_tokens: usize,
    /// Of the completion tokens, how many the engine forced (budget bridge and `</think>`).
    #[serde(default)]
    pub forced_tokens: usize,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Timing {
    /// Request start to the first generated token.
    pub ttft_ms: f64,
    pub prefill_tok_s: f64,
    /// Generated tokens after the first, per second of decoding.
    pub decode_tok_s: f64,
    pub total_ms: f64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Memory {
    pub weights_bytes: usize,
    pub kv_bytes: usize,
    pub recurrent_bytes: usize,
    pub snapshot_bytes: usize,
}

/// An alternative token at a position.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Alternative {
    pub id: u32,
    pub logprob: f32,
    pub text: String,
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
        /// for stop tokens).
        text: String,
        /// Log-probability under the model's raw distribution (before penalties and
        /// temperature); 0 for forced tokens.
        logprob: f32,
        draft: DraftKind,
        /// Injected by the engine (thinking-budget bridge and `</think>`), not sampled.
        forced: bool,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        top_logprobs: Vec<Alternative>,
    },
    /// Running totals, every few tokens (for live gauges).
    Stats {
        generated: usize,
        thinking_tokens: usize,
        answer_tokens: usize,
        tok_s: f64,
        memory: Memory,
        #[serde(skip_serializing_if = "Option::is_none")]
        mtp: Option<MtpStats>,
    },
    Diagnostic {
        kind: DiagnosticKind,
        /// Index of the generated token the diagnostic refers to.
        at_token: usize,
        message: String,
        /// Loop period and start (degenerate_loop only).
        #[serde(skip_serializing_if = "Option::is_none")]
        period: Option<usize>,
        #[serde(skip_serializing_if = "Option::is_none")]
        start: Option<usize>,
    },
    Done {
        finish_reason: FinishReason,
        usage: Usage,
        timing: Timing,
        /// Speculative-decoding metrics (MTP), when drafting ran.
        #[serde(skip_serializing_if = "Option::is_none")]
        mtp: Option<MtpStats>,
        memory: Memory,
        /// Thinking text (without the `</think>` marker).
        thinking: String,
        /// Answer text (without the stop token or stop string).
        answer: String,
    },
    Error {
        message: String,
    },
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
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
    }
}
