//! From what the user asked for (flags, plain data) to the parameters of a generation, resolved
//! against what a backend says about itself. Precedence for sampling: an explicit value, then
//! the preset, then the backend's defaults (generation_config.json, or the server's own).

use super::{BackendError, BackendInfo, BackendResult};
use deltascope_protocol::{GenerationParams, LoopParams, MtpMode, OnLoop, Preset, QWEN_BUDGET_BRIDGE, Thinking};

/// The generation settings a user asked for; `None` means "the backend's default".
#[derive(Debug, Clone, PartialEq)]
pub struct ParamOverrides {
    pub max_tokens: usize,
    /// Off (through the template), unlimited, or N tokens; `None` = unlimited.
    pub thinking_budget: Option<Thinking>,
    pub budget_bridge: Option<String>,
    pub answer_budget: Option<usize>,
    pub preset: Option<Preset>,
    pub temperature: Option<f32>,
    pub top_k: Option<usize>,
    pub top_p: Option<f32>,
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: u64,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub trace_state: bool,
    /// What a detected loop does (`--on-loop`).
    pub on_loop: OnLoop,
    pub loop_min_repeats: usize,
    pub loop_min_span: usize,
    pub top_logprobs: usize,
    pub mtp: Option<MtpMode>,
}

impl Default for ParamOverrides {
    fn default() -> Self {
        ParamOverrides {
            max_tokens: GenerationParams::DEFAULT_MAX_TOKENS,
            thinking_budget: None,
            budget_bridge: None,
            answer_budget: None,
            preset: None,
            temperature: None,
            top_k: None,
            top_p: None,
            min_p: None,
            presence_penalty: None,
            frequency_penalty: None,
            repetition_penalty: None,
            seed: 0,
            stop: vec![],
            stop_token_ids: vec![],
            ignore_eos: false,
            trace_state: false,
            on_loop: OnLoop::Off,
            loop_min_repeats: LoopParams::DEFAULT_MIN_REPEATS,
            loop_min_span: LoopParams::DEFAULT_MIN_SPAN,
            top_logprobs: 0,
            mtp: None,
        }
    }
}

impl ParamOverrides {
    /// `--no-think`: thinking off, whatever budget was given.
    pub fn without_thinking_if(mut self, no_think: bool) -> Self {
        if no_think {
            self.thinking_budget = Some(Thinking::Off);
        }
        self
    }

    pub fn resolve(&self, info: &BackendInfo) -> BackendResult<GenerationParams> {
        let mut sampling = info.defaults.clone();
        if let Some(preset) = self.preset {
            preset.apply(&mut sampling);
        }
        let s = &mut sampling;
        s.temperature = self.temperature.unwrap_or(s.temperature);
        s.top_k = self.top_k.unwrap_or(s.top_k);
        s.top_p = self.top_p.unwrap_or(s.top_p);
        s.min_p = self.min_p.unwrap_or(s.min_p);
        s.presence_penalty = self.presence_penalty.unwrap_or(s.presence_penalty);
        s.frequency_penalty = self.frequency_penalty.unwrap_or(s.frequency_penalty);
        s.repetition_penalty = self.repetition_penalty.unwrap_or(s.repetition_penalty);
        s.seed = self.seed;
        // A value out of the defaults' range is blamed on where the defaults came from (the
        // model's generation_config.json, the server's /props; presets are in range by
        // construction); one the flags set is named by its flag below.
        if let Err(p) = sampling.check()
            && !self.gives(&p.field)
        {
            return Err(BackendError::invalid(format!("{} of {}: {p}", defaults_source(info), info.name)));
        }
        let params = GenerationParams {
            max_tokens: self.max_tokens,
            sampling,
            thinking: self.thinking_budget.unwrap_or_default(),
            budget_bridge: self.budget_bridge.clone().unwrap_or_else(|| QWEN_BUDGET_BRIDGE.to_string()),
            answer_budget: self.answer_budget,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_ids.clone(),
            ignore_eos: self.ignore_eos,
            trace_state: self.trace_state,
            loop_detection: LoopParams {
                min_repeats: self.loop_min_repeats,
                min_span: self.loop_min_span,
                on_loop: self.on_loop,
                ..Default::default()
            },
            top_logprobs: self.top_logprobs,
            mtp: self.mtp_params(info)?,
        };
        // The one range table (`GenerationParams::check`) judges; the error names the flag.
        params.check().map_err(|p| BackendError::invalid(format!("--{} {}: {}", flag(&p.field), p.value, p.must())))?;
        Ok(params)
    }

    /// Whether this sampling field (`top_p`, …) was given explicitly.
    /// What the start line says when the flags choose no sampling and the backend's own
    /// defaults sample (a llama.cpp server's `/props`: temperature 0.8, top-k 40), so that a
    /// run that is greedy on the demo model and sampled on a server is not a surprise.
    pub fn sampling_note(&self, info: &BackendInfo) -> Option<String> {
        let chosen = self.preset.is_some() || self.temperature.is_some();
        let d = &info.defaults;
        if chosen || d.temperature <= 0.0 {
            return None;
        }
        Some(format!(
            "sampling: temperature {} · top-k {} · top-p {} · min-p {} — {}; --temperature 0 for greedy",
            d.temperature,
            d.top_k,
            d.top_p,
            d.min_p,
            defaults_source(info)
        ))
    }

    fn gives(&self, field: &str) -> bool {
        match field {
            "temperature" => self.temperature.is_some(),
            "top_k" => self.top_k.is_some(),
            "top_p" => self.top_p.is_some(),
            "min_p" => self.min_p.is_some(),
            "presence_penalty" => self.presence_penalty.is_some(),
            "frequency_penalty" => self.frequency_penalty.is_some(),
            "repetition_penalty" => self.repetition_penalty.is_some(),
            _ => false,
        }
    }

    fn mtp_params(&self, info: &BackendInfo) -> BackendResult<MtpMode> {
        if self.mtp.is_some() && !info.mtp_control.is_yes() {
            return Err(BackendError::invalid(
                "--mtp: a server decides speculative decoding itself (set it where the server is started)",
            ));
        }
        let p = match self.mtp {
            None if info.mtp_control.is_yes() && info.has_mtp => MtpMode::fixed(2),
            None => MtpMode::Off,
            Some(m) => m,
        };
        if p.is_on() && !info.has_mtp {
            return Err(BackendError::invalid(format!(
                "--mtp: {} has no MTP head (no mtp.* tensors); use --mtp 0",
                info.name
            )));
        }
        Ok(p)
    }
}

/// The flag that sets a field of [`GenerationParams`] (`sampling.top_p` → `top-p`).
pub fn flag(field: &str) -> String {
    match field {
        "loop_detection.min_repeats" => "loop-min-repeats".into(),
        "loop_detection.min_span" => "loop-min-span".into(),
        "mtp.depth" => "mtp".into(),
        f => f.trim_start_matches("sampling.").replace('_', "-"),
    }
}

/// Where a backend's sampling defaults come from (what runs when no flag or slider chose).
pub fn defaults_source(info: &BackendInfo) -> String {
    match &info.kind {
        super::BackendKind::Remote(l) if l.kind == "llama.cpp" => "the server's own defaults (llama.cpp /props)".into(),
        super::BackendKind::Remote(l) => {
            format!("the model card's thinking preset ({} reports no defaults of its own)", l.kind)
        }
        super::BackendKind::Local { .. } => "the model's generation_config.json".into(),
    }
}
