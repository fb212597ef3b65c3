//! What a generation request asks for. Shared by every front end (`run`, `sweep`, the TUI).

use std::num::NonZeroUsize;

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
    /// Off (the template renders `enable_thinking=false`), unlimited, or the thinking tokens
    /// the model may generate, counted across think blocks, before the engine forces the end of
    /// thinking. Stored as `thinking_budget`: `null` unlimited, `0` off, else the budget.
    #[serde(rename = "thinking_budget", default)]
    pub thinking: Thinking,
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
    pub mtp: MtpMode,
}

impl Default for GenerationParams {
    fn default() -> Self {
        GenerationParams {
            max_tokens: GenerationParams::DEFAULT_MAX_TOKENS,
            sampling: SamplingParams::default(),
            thinking: Thinking::Unlimited,
            budget_bridge: QWEN_BUDGET_BRIDGE.to_string(),
            answer_budget: None,
            stop: vec![],
            stop_token_ids: vec![],
            ignore_eos: false,
            trace_state: false,
            loop_detection: LoopParams::default(),
            top_logprobs: 0,
            mtp: MtpMode::Off,
        }
    }
}

impl GenerationParams {
    /// `max_tokens` when nobody sets it: the one place the default is written (the flags, the
    /// TUI's settings and the server read it from here).
    pub const DEFAULT_MAX_TOKENS: usize = 1024;

    /// The first setting out of its range, if any, as [`RANGES`] states them (fields named by
    /// their JSON path: `max_tokens`, `sampling.temperature`, `loop_detection.min_span`). This is
    /// the only range check: every front end (flags, the server's bodies, the sliders, session
    /// files) builds the params and asks this; none keeps a range of its own.
    pub fn check(&self) -> Result<(), ParamProblem> {
        for r in &RANGES {
            if let Some(v) = (r.get)(self)
                && !r.admits(v)
            {
                return Err(ParamProblem { field: r.field.into(), value: show(v), expected: r.expected });
            }
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(ParamProblem {
                field: "stop".into(),
                value: "\"\"".into(),
                expected: "non-empty (an empty stop string would match anywhere)",
            });
        }
        Ok(())
    }

    /// [`check`](Self::check), then the bounds that need the model's context: max_tokens and
    /// the thinking budget fit in it.
    pub fn check_within(&self, context: usize) -> Result<(), ParamProblem> {
        self.check()?;
        let over = |field: &str, v: usize| ParamProblem {
            field: field.into(),
            value: v.to_string(),
            expected: "at most the model's context length",
        };
        if self.max_tokens > context {
            return Err(over("max_tokens", self.max_tokens));
        }
        match self.thinking.budget() {
            Some(b) if b > context => Err(over("thinking_budget", b)),
            _ => Ok(()),
        }
    }
}

/// A value as a person typed it: whole numbers without a fraction.
fn show(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 { format!("{}", v as i64) } else { format!("{}", v as f32) }
}

/// One row of the range table: a setting (by its JSON path in [`GenerationParams`]) and the
/// interval it must lie in. `hi` is `f64::INFINITY` where there is no upper bound; values
/// must be finite (NaN and ±inf are refused everywhere).
#[derive(Debug, Clone, Copy)]
pub struct Range {
    pub field: &'static str,
    pub lo: f64,
    /// Whether `lo` itself is excluded (`top_p` in (0, 1]).
    pub lo_open: bool,
    pub hi: f64,
    /// What the value must be, as error messages say it.
    pub expected: &'static str,
    get: fn(&GenerationParams) -> Option<f64>,
}

impl Range {
    /// Whether `v` is in the range.
    pub fn admits(&self, v: f64) -> bool {
        v.is_finite() && (if self.lo_open { v > self.lo } else { v >= self.lo }) && v <= self.hi
    }

    /// `v` moved into the range (`step` above an open lower bound); NaN becomes the lower end.
    pub fn clamp(&self, v: f64, step: f64) -> f64 {
        let lo = if self.lo_open { self.lo + step } else { self.lo };
        if v.is_nan() { lo } else { v.clamp(lo, self.hi) }
    }

    /// The field's name without its group (`temperature` for `sampling.temperature`).
    pub fn name(&self) -> &'static str {
        self.field.rsplit('.').next().unwrap_or(self.field)
    }
}

/// The row of [`RANGES`] for a field (`"sampling.top_p"`, or the bare `"top_p"`).
pub fn range(field: &str) -> Option<&'static Range> {
    RANGES.iter().find(|r| r.field == field).or_else(|| RANGES.iter().find(|r| r.name() == field))
}

const NO_MAX: f64 = f64::INFINITY;

/// THE range table: every numeric generation setting and its allowed interval, used by
/// [`GenerationParams::check`] and by every front end that shows or clamps a value.
pub const RANGES: [Range; 20] = [
    Range {
        field: "max_tokens",
        lo: 1.0,
        lo_open: false,
        hi: NO_MAX,
        expected: "at least 1",
        get: |p| Some(p.max_tokens as f64),
    },
    Range {
        field: "thinking_budget",
        lo: 0.0,
        lo_open: false,
        hi: NO_MAX,
        expected: "0 (thinking off) or more, or unlimited",
        get: |p| p.thinking.budget().map(|b| b as f64),
    },
    Range {
        field: "answer_budget",
        lo: 1.0,
        lo_open: false,
        hi: NO_MAX,
        expected: "at least 1 (or no answer budget)",
        get: |p| p.answer_budget.map(|b| b as f64),
    },
    Range {
        field: "sampling.temperature",
        lo: 0.0,
        lo_open: false,
        hi: 100.0,
        expected: "in [0, 100] (0 is greedy)",
        get: |p| Some(p.sampling.temperature as f64),
    },
    Range {
        field: "sampling.top_k",
        lo: 0.0,
        lo_open: false,
        hi: 1_048_576.0,
        expected: "in [0, 1048576] (0 is off)",
        get: |p| Some(p.sampling.top_k as f64),
    },
    Range {
        field: "sampling.top_p",
        lo: 0.0,
        lo_open: true,
        hi: 1.0,
        expected: "in (0, 1]",
        get: |p| Some(p.sampling.top_p as f64),
    },
    Range {
        field: "sampling.min_p",
        lo: 0.0,
        lo_open: false,
        hi: 1.0,
        expected: "in [0, 1]",
        get: |p| Some(p.sampling.min_p as f64),
    },
    Range {
        field: "sampling.presence_penalty",
        lo: -2.0,
        lo_open: false,
        hi: 2.0,
        expected: "in [-2, 2]",
        get: |p| Some(p.sampling.presence_penalty as f64),
    },
    Range {
        field: "sampling.frequency_penalty",
        lo: -2.0,
        lo_open: false,
        hi: 2.0,
        expected: "in [-2, 2]",
        get: |p| Some(p.sampling.frequency_penalty as f64),
    },
    Range {
        field: "sampling.repetition_penalty",
        lo: 0.0,
        lo_open: true,
        hi: 100.0,
        expected: "in (0, 100] (1 is off)",
        get: |p| Some(p.sampling.repetition_penalty as f64),
    },
    Range {
        field: "top_logprobs",
        lo: 0.0,
        lo_open: false,
        hi: 20.0,
        expected: "at most 20",
        get: |p| Some(p.top_logprobs as f64),
    },
    Range {
        field: "stop",
        lo: 0.0,
        lo_open: false,
        hi: 16.0,
        expected: "at most 16 strings",
        get: |p| Some(p.stop.len() as f64),
    },
    Range {
        field: "loop_detection.min_repeats",
        lo: 2.0,
        lo_open: false,
        hi: NO_MAX,
        expected: "at least 2 (a loop is a pattern seen more than once)",
        get: |p| Some(p.loop_detection.min_repeats as f64),
    },
    Range {
        field: "loop_detection.min_span",
        lo: 1.0,
        lo_open: false,
        hi: NO_MAX,
        expected: "at least 1",
        get: |p| Some(p.loop_detection.min_span as f64),
    },
    Range {
        field: "loop_detection.ngram",
        lo: 1.0,
        lo_open: false,
        hi: NO_MAX,
        expected: "at least 1",
        get: |p| Some(p.loop_detection.ngram as f64),
    },
    Range {
        field: "loop_detection.window",
        lo: 0.0,
        lo_open: false,
        hi: NO_MAX,
        expected: "0 (off) or more",
        get: |p| Some(p.loop_detection.window as f64),
    },
    Range {
        field: "loop_detection.ngram_ratio",
        lo: 0.0,
        lo_open: true,
        hi: 1.0,
        expected: "in (0, 1]",
        get: |p| Some(p.loop_detection.ngram_ratio as f64),
    },
    Range {
        field: "loop_detection.recent_window",
        lo: 0.0,
        lo_open: false,
        hi: NO_MAX,
        expected: "0 (off) or more",
        get: |p| Some(p.loop_detection.recent_window as f64),
    },
    Range {
        field: "loop_detection.recent_ratio",
        lo: 0.0,
        lo_open: true,
        hi: 1.0,
        expected: "in (0, 1]",
        get: |p| Some(p.loop_detection.recent_ratio as f64),
    },
    Range {
        field: "mtp.depth",
        lo: 0.0,
        lo_open: false,
        hi: MAX_DEPTH as f64,
        expected: "0 (off) to 4 draft steps",
        get: |p| Some(p.mtp.depth() as f64),
    },
];

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

impl ParamProblem {
    /// "must be in [0, 100] (0 is greedy)"; for inf and NaN, which every range refuses, "must be
    /// a finite number (in [0, 100] …)": the sign is not what is wrong with `inf`.
    pub fn must(&self) -> String {
        if matches!(self.value.as_str(), "inf" | "-inf" | "NaN") {
            format!("must be a finite number ({})", self.expected)
        } else {
            format!("must be {}", self.expected)
        }
    }
}

impl std::fmt::Display for ParamProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} = {}: {}", self.field, self.value, self.must())
    }
}

impl SamplingParams {
    /// In a few words: `greedy`, or `temperature 0.8 · top-k 40 · top-p 0.95 · min-p 0.05`
    /// (the filters that are on).
    pub fn summary(&self) -> String {
        if self.temperature <= 0.0 {
            return "greedy".into();
        }
        let mut parts = vec![format!("temperature {}", self.temperature)];
        if self.top_k > 0 {
            parts.push(format!("top-k {}", self.top_k));
        }
        if self.top_p < 1.0 {
            parts.push(format!("top-p {}", self.top_p));
        }
        if self.min_p > 0.0 {
            parts.push(format!("min-p {}", self.min_p));
        }
        if self.presence_penalty != 0.0 {
            parts.push(format!("presence {}", self.presence_penalty));
        }
        parts.join(" · ")
    }

    /// The first value out of its range in [`RANGES`], if any (named without `sampling.`).
    pub fn check(&self) -> Result<(), ParamProblem> {
        let p = GenerationParams { sampling: self.clone(), ..Default::default() };
        match p.check() {
            Err(e) if e.field.starts_with("sampling.") => {
                Err(ParamProblem { field: e.field["sampling.".len()..].to_string(), ..e })
            }
            _ => Ok(()),
        }
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

/// Thinking as asked for: off (the template renders `enable_thinking=false`), unlimited, or a
/// budget of tokens after which the engine forces the end of thinking. The front ends' one
/// spelling: `off` (also `0`, `no`, `false`), `unlimited` (also `-1`, `none`, `inf`), or a count.
/// On the OpenAI wire it is the pair `enable_thinking` + a budget field; in session files and
/// events the number `thinking_budget` (`null` unlimited, `0` off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "Option<usize>", into = "Option<usize>")]
pub enum Thinking {
    Off,
    #[default]
    Unlimited,
    Tokens(NonZeroUsize),
}

impl Thinking {
    /// From the stored pair: the template switch and the budget (0 is off too).
    pub fn from_parts(enable_thinking: bool, budget: Option<usize>) -> Self {
        match budget {
            _ if !enable_thinking => Thinking::Off,
            None => Thinking::Unlimited,
            Some(b) => NonZeroUsize::new(b).map_or(Thinking::Off, Thinking::Tokens),
        }
    }

    /// Whether the template renders thinking on.
    pub fn is_on(self) -> bool {
        self != Thinking::Off
    }

    /// From a budget as servers spell it: `None` unlimited, 0 off, else the budget.
    pub fn from_budget(budget: Option<usize>) -> Self {
        Thinking::from_parts(true, budget)
    }

    /// The budget to enforce: `None` when unlimited or off (off is the template's business).
    pub fn budget(self) -> Option<usize> {
        match self {
            Thinking::Tokens(n) => Some(n.get()),
            _ => None,
        }
    }
}

impl From<Option<usize>> for Thinking {
    fn from(budget: Option<usize>) -> Self {
        Thinking::from_budget(budget)
    }
}

/// The stored number: `None` unlimited, 0 off, else the budget.
impl From<Thinking> for Option<usize> {
    fn from(t: Thinking) -> Self {
        match t {
            Thinking::Off => Some(0),
            Thinking::Unlimited => None,
            Thinking::Tokens(n) => Some(n.get()),
        }
    }
}

impl std::str::FromStr for Thinking {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "off" | "no" | "false" | "0" => Ok(Thinking::Off),
            "unlimited" | "none" | "inf" | "-1" => Ok(Thinking::Unlimited),
            t => t.parse::<NonZeroUsize>().map(Thinking::Tokens).map_err(|_| {
                format!("{s:?}: use -1 (or unlimited) for unlimited, 0 (or off) for thinking off, or a token count")
            }),
        }
    }
}

/// `off`, `unlimited` or the budget: what [`FromStr`](std::str::FromStr) reads back.
impl std::fmt::Display for Thinking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Thinking::Off => f.write_str("off"),
            Thinking::Unlimited => f.write_str("unlimited"),
            Thinking::Tokens(n) => write!(f, "{n}"),
        }
    }
}

/// MTP speculative decoding: off, a fixed number of draft steps per verify pass, or `Auto`
/// (the engine adapts the depth to the measured acceptance and cost, starting at
/// [`MtpMode::AUTO_START`]). Stored as `{"depth": N, "auto": bool}`, as sessions and events have
/// always written it (`Auto` as `{"depth": 2, "auto": true}`; any depth with `auto: true` reads
/// as `Auto`, depth 0 as `Off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(from = "MtpWire", into = "MtpWire")]
pub enum MtpMode {
    #[default]
    Off,
    Fixed(NonZeroUsize),
    Auto,
}

#[derive(Serialize, Deserialize)]
struct MtpWire {
    depth: usize,
    #[serde(default)]
    auto: bool,
}

impl From<MtpWire> for MtpMode {
    fn from(w: MtpWire) -> Self {
        if w.auto { MtpMode::Auto } else { MtpMode::fixed(w.depth) }
    }
}

impl From<MtpMode> for MtpWire {
    fn from(m: MtpMode) -> Self {
        MtpWire { depth: m.depth(), auto: m.is_auto() }
    }
}

impl MtpMode {
    /// The depth `Auto` starts at.
    pub const AUTO_START: usize = 2;

    /// `depth` draft steps (0 = off).
    pub fn fixed(depth: usize) -> Self {
        NonZeroUsize::new(depth).map_or(MtpMode::Off, MtpMode::Fixed)
    }

    /// Whether drafting is asked for.
    pub fn is_on(self) -> bool {
        self != MtpMode::Off
    }

    pub fn is_auto(self) -> bool {
        self == MtpMode::Auto
    }

    /// The draft steps per verify pass: the fixed depth, `Auto`'s starting depth, 0 when off.
    pub fn depth(self) -> usize {
        match self {
            MtpMode::Off => 0,
            MtpMode::Fixed(d) => d.get(),
            MtpMode::Auto => Self::AUTO_START,
        }
    }
}

/// `auto`, `off`, or a number of draft steps (0 = off). Only the spelling is read here; the
/// depth's range is the table's (`mtp.depth`, see [`RANGES`]).
impl std::str::FromStr for MtpMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(MtpMode::Auto),
            "off" => Ok(MtpMode::Off),
            t => t
                .parse()
                .map(MtpMode::fixed)
                .map_err(|_| format!("expected a number of draft steps or auto, found \"{s}\"")),
        }
    }
}

/// `auto`, or the depth (0 = off): what [`FromStr`](std::str::FromStr) reads back.
impl std::fmt::Display for MtpMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MtpMode::Auto => f.write_str("auto"),
            m => write!(f, "{}", m.depth()),
        }
    }
}

pub const MAX_DEPTH: usize = 4;
