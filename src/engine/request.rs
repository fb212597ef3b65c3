//! What a generation request asks for. Shared by every front end (`run`, `sweep`, the TUI).

use serde::{Deserialize, Serialize};

use super::sampler::{ParamProblem, SamplingParams};
use super::speculative::MtpParams;
use super::watchdog::LoopParams;

/// Qwen's budget-forcing sentence (QwenLM/Qwen3 docs, "Thinking Budget"): injected before
/// `</think>` when a thinking budget runs out.
pub const QWEN_BUDGET_BRIDGE: &str =
    "\n\nConsidering the limited time by the user, I have to give the solution based on the thinking directly now.\n";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GenerationParams {
    /// Generated tokens, thinking + answer (forced tokens included), as the servers count them.
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Thinking tokens the model may generate, counted across think blocks, before the engine
    /// forces the end of thinking. `None` = unlimited. (Budget 0 is thinking off, which front
    /// ends render through the template's `enable_thinking=false`.)
    pub thinking_budget: Option<usize>,
    /// Text forced before `</think>` when the thinking budget runs out (may be empty).
    pub budget_bridge: String,
    /// Answer tokens after which generation ends (finish `length`). `None` = only max_tokens.
    pub answer_budget: Option<usize>,
    /// Strings that end generation (finish `stop_string`); they are cut from the final texts.
    pub stop: Vec<String>,
    /// Token ids that end generation besides the model's EOS ids.
    pub stop_token_ids: Vec<u32>,
    /// Generate past the model's EOS ids (vLLM / SGLang `ignore_eos`: fixed-length runs for
    /// benchmarks); `stop`, `stop_token_ids`, budgets and max_tokens still end generation.
    #[serde(default)]
    pub ignore_eos: bool,
    /// Trace the recurrent state after the prompt and every token ([`super::StateEvent`]s);
    /// drafting is off while tracing (the trace is per token).
    #[serde(default)]
    pub trace_state: bool,
    pub loop_detection: LoopParams,
    /// Alternatives reported with every token (0–20).
    pub top_logprobs: usize,
    /// MTP speculative decoding (needs a checkpoint with an MTP head).
    pub mtp: MtpParams,
}

impl Default for GenerationParams {
    fn default() -> Self {
        GenerationParams {
            max_tokens: 1024,
            sampling: SamplingParams::default(),
            thinking_budget: None,
            budget_bridge: QWEN_BUDGET_BRIDGE.to_string(),
            answer_budget: None,
            stop: vec![],
            stop_token_ids: vec![],
            ignore_eos: false,
            trace_state: false,
            loop_detection: LoopParams::default(),
            top_logprobs: 0,
            mtp: MtpParams::default(),
        }
    }
}

impl GenerationParams {
    /// The first setting out of its range, if any (sampling fields as `sampling.temperature`).
    pub fn check(&self) -> Result<(), ParamProblem> {
        self.sampling.check().map_err(|p| ParamProblem { field: format!("sampling.{}", p.field), ..p })?;
        if self.max_tokens == 0 {
            return Err(ParamProblem { field: "max_tokens".into(), value: "0".into(), expected: "at least 1" });
        }
        if self.answer_budget == Some(0) {
            return Err(ParamProblem {
                field: "answer_budget".into(),
                value: "0".into(),
                expected: "at least 1 (or no answer budget)",
            });
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(ParamProblem {
                field: "stop".into(),
                value: "\"\"".into(),
                expected: "non-empty (an empty stop string would match anywhere)",
            });
        }
        if self.loop_detection.min_repeats < 2 {
            return Err(ParamProblem {
                field: "loop_detection.min_repeats".into(),
                value: self.loop_detection.min_repeats.to_string(),
                expected: "at least 2 (a loop is a pattern seen more than once)",
            });
        }
        if self.loop_detection.min_span == 0 {
            return Err(ParamProblem {
                field: "loop_detection.min_span".into(),
                value: "0".into(),
                expected: "at least 1",
            });
        }
        if self.top_logprobs > 20 {
            return Err(ParamProblem {
                field: "top_logprobs".into(),
                value: self.top_logprobs.to_string(),
                expected: "at most 20",
            });
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_ids: Vec<u32>,
    pub params: GenerationParams,
}
