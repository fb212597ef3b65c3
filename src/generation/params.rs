//! What a generation request asks for. Shared by every front end (`run`, `sweep`, the TUI).

use serde::{Deserialize, Serialize};

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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0.0 = off.
    pub min_p: f32,
    pub presence_penalty: f32,
    pub frequency_penalty: f32,
    /// 1.0 = off.
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            seed: 0,
        }
    }
}

/// A generation setting out of its range: which field (as the JSON names it), the value, and
/// what it must be. Whoever reports it names the source (a flag, a file and its field path).
#[derive(Debug, Clone, PartialEq)]
pub struct ParamProblem {
    pub field: String,
    pub value: String,
    pub expected: &'static str,
}

impl std::fmt::Display for ParamProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} = {}: must be {}", self.field, self.value, self.expected)
    }
}

type Range = (&'static str, fn(&SamplingParams) -> f32, fn(f32) -> bool, &'static str);

/// The one list of allowed ranges, checked for every source of sampling values (flags,
/// generation_config.json, sessions, a server's defaults).
const RANGES: [Range; 6] = [
    ("temperature", |p| p.temperature, |v| v >= 0.0 && v.is_finite(), "≥ 0 (0 is greedy)"),
    ("top_p", |p| p.top_p, |v| v > 0.0 && v <= 1.0, "in (0, 1]"),
    ("min_p", |p| p.min_p, |v| (0.0..=1.0).contains(&v), "in [0, 1]"),
    ("presence_penalty", |p| p.presence_penalty, f32::is_finite, "a finite number"),
    ("frequency_penalty", |p| p.frequency_penalty, f32::is_finite, "a finite number"),
    ("repetition_penalty", |p| p.repetition_penalty, |v| v > 0.0 && v.is_finite(), "> 0 (1 is off)"),
];

impl SamplingParams {
    /// The first value out of its range, if any.
    pub fn check(&self) -> Result<(), ParamProblem> {
        for (field, get, ok, expected) in RANGES {
            let v = get(self);
            if !ok(v) {
                return Err(ParamProblem { field: field.into(), value: v.to_string(), expected });
            }
        }
        Ok(())
    }

    /// The sampling defaults a checkpoint ships in generation_config.json (`do_sample: false`
    /// means greedy; absent fields keep the neutral values). A value of the wrong type or out
    /// of range is an error naming the field, not a setting the user never chose.
    pub fn from_generation_config(g: &serde_json::Value) -> Result<Self, ParamProblem> {
        let wrong =
            |k: &str, v: &serde_json::Value, expected| ParamProblem { field: k.into(), value: v.to_string(), expected };
        let number = |k: &'static str| -> Result<Option<f32>, ParamProblem> {
            match g.get(k) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(v) => v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| wrong(k, v, "a number")),
            }
        };
        let mut p = SamplingParams::default();
        let sample = match g.get("do_sample") {
            None | Some(serde_json::Value::Null) => true,
            Some(v) => v.as_bool().ok_or_else(|| wrong("do_sample", v, "true or false"))?,
        };
        if sample {
            p.temperature = number("temperature")?.unwrap_or(1.0);
        }
        p.top_k = match g.get("top_k") {
            None | Some(serde_json::Value::Null) => 0,
            Some(v) => v.as_u64().ok_or_else(|| wrong("top_k", v, "a whole number ≥ 0"))? as usize,
        };
        p.top_p = number("top_p")?.unwrap_or(1.0);
        p.min_p = number("min_p")?.unwrap_or(0.0);
        p.repetition_penalty = number("repetition_penalty")?.unwrap_or(1.0);
        p.presence_penalty = number("presence_penalty")?.unwrap_or(0.0);
        p.frequency_penalty = number("frequency_penalty")?.unwrap_or(0.0);
        p.check()?;
        Ok(p)
    }
}

/// The model-card presets (model-spec §7.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    ThinkingGeneral,
    ThinkingCoding,
    InstructGeneral,
    InstructReasoning,
}

impl Preset {
    pub const ALL: [Preset; 4] =
        [Preset::ThinkingGeneral, Preset::ThinkingCoding, Preset::InstructGeneral, Preset::InstructReasoning];

    pub fn name(self) -> &'static str {
        match self {
            Preset::ThinkingGeneral => "thinking-general",
            Preset::ThinkingCoding => "thinking-coding",
            Preset::InstructGeneral => "instruct-general",
            Preset::InstructReasoning => "instruct-reasoning",
        }
    }

    pub fn parse(s: &str) -> Option<Preset> {
        Preset::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Whether the preset is meant for thinking mode.
    pub fn thinking(self) -> bool {
        matches!(self, Preset::ThinkingGeneral | Preset::ThinkingCoding)
    }

    /// Applies the preset's values (the seed is kept).
    pub fn apply(self, p: &mut SamplingParams) {
        let (t, top_p, k, pres) = match self {
            Preset::ThinkingGeneral => (1.0, 0.95, 20, 1.5),
            Preset::ThinkingCoding => (0.6, 0.95, 20, 0.0),
            Preset::InstructGeneral => (0.7, 0.8, 20, 1.5),
            Preset::InstructReasoning => (1.0, 1.0, 40, 2.0),
        };
        p.temperature = t;
        p.top_p = top_p;
        p.top_k = k;
        p.min_p = 0.0;
        p.presence_penalty = pres;
        p.frequency_penalty = 0.0;
        p.repetition_penalty = 1.0;
    }
}

/// MTP speculative decoding settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MtpParams {
    /// Draft steps per verify pass (0 = off).
    pub depth: usize,
    /// Adapt the depth to the measured acceptance (between 1 and 4).
    pub auto: bool,
}

pub const MAX_DEPTH: usize = 4;

impl MtpParams {
    /// Whether drafting is asked for.
    pub fn is_on(&self) -> bool {
        self.depth > 0 || self.auto
    }
}
