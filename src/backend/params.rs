//! From what the user asked for (flags, plain data) to the parameters of a generation, resolved
//! against what a backend says about itself. Precedence for sampling: an explicit value, then
//! the preset, then the backend's defaults (generation_config.json, or the server's own).

use super::flags::{float32, on_loop, whole_number};
use super::{BackendError, BackendInfo, BackendResult};
use deltascope_protocol::{GenerationParams, LoopParams, MtpMode, OnLoop, Preset, QWEN_BUDGET_BRIDGE, Thinking};

/// The generation settings a user asks for, declared once: the command line's flags (this is
/// the clap struct `run`, `sweep`, `trace` and `chat` flatten), the TUI's and the server's
/// starting point, resolved against what a backend says about itself. `None` means "the
/// backend's default"; every default is the protocol's (`GenerationParams::DEFAULT_MAX_TOKENS`,
/// `LoopParams::DEFAULT_*`), and [`Default`] is the empty command line. Precedence for
/// sampling: an explicit flag, then `--preset`, then the backend's defaults (the model's
/// generation_config.json, or the server's own), then greedy.
#[derive(clap::Args, Debug, Clone, PartialEq)]
pub struct ParamOverrides {
    /// Generated tokens, thinking + answer (forced tokens included).
    #[arg(long, default_value_t = GenerationParams::DEFAULT_MAX_TOKENS, value_name = "N", allow_hyphen_values = true, value_parser = whole_number)]
    pub max_tokens: usize,
    /// Thinking tokens before the end of thinking is forced: -1 (or `unlimited`) unlimited,
    /// 0 (or `off`) thinking off (through the template).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub thinking_budget: Option<Thinking>,
    /// Text forced before `</think>` when the thinking budget runs out (default: Qwen's
    /// "Considering the limited time…" sentence; may be empty).
    #[arg(long, value_name = "TEXT")]
    pub budget_bridge: Option<String>,
    /// Answer tokens after which generation stops. They are counted from `</think>`, so the
    /// blank line the model writes after it (one token on Qwen) is the first: `1` answers nothing.
    #[arg(long, value_name = "N", allow_hyphen_values = true, value_parser = whole_number)]
    pub answer_budget: Option<usize>,
    /// Model-card sampling preset.
    #[arg(long, value_enum, value_name = "NAME")]
    pub preset: Option<PresetArg>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, value_name = "T", allow_hyphen_values = true, value_parser = float32)]
    pub temperature: Option<f32>,
    #[arg(long, value_name = "K", allow_hyphen_values = true, value_parser = whole_number)]
    pub top_k: Option<usize>,
    #[arg(long, value_name = "P", allow_hyphen_values = true, value_parser = float32)]
    pub top_p: Option<f32>,
    #[arg(long, value_name = "P", allow_hyphen_values = true, value_parser = float32)]
    pub min_p: Option<f32>,
    #[arg(long, value_name = "X", allow_hyphen_values = true, value_parser = float32)]
    pub presence_penalty: Option<f32>,
    #[arg(long, value_name = "X", allow_hyphen_values = true, value_parser = float32)]
    pub frequency_penalty: Option<f32>,
    #[arg(long, value_name = "X", allow_hyphen_values = true, value_parser = float32)]
    pub repetition_penalty: Option<f32>,
    /// Sampling seed, 0 to 2^64 − 1.
    #[arg(long, default_value_t = 0, value_name = "S", allow_hyphen_values = true)]
    pub seed: i128,
    /// Stop when this string appears (repeatable; cut from the output).
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Stop at this token id (repeatable), besides the model's EOS ids.
    #[arg(long = "stop-token-id", value_name = "ID")]
    pub stop_token_ids: Vec<u32>,
    /// Generate past the model's end-of-sequence tokens (fixed-length runs, as vLLM's and
    /// SGLang's ignore_eos); stop strings, stop ids, budgets and --max-tokens still end it.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Trace every Gated-DeltaNet layer's state (β, g, ‖S‖, ‖ΔS‖/‖S‖ per head) after the
    /// prompt and every token: `state` events (the in-process engine only; drafting off).
    #[arg(long)]
    pub trace_state: bool,
    /// What a detected degenerate loop does: `off` (the alarm only), `stop` (finish_reason
    /// loop), or `answer`: a loop during thinking forces the end of thinking (the bridge text,
    /// `</think>`) so that the model answers (a loop_rescued diagnostic); a loop in the answer
    /// stops. With --server it is done client-side (needs the chat template: the server's own
    /// or --tokenizer DIR).
    /// (`sweep` takes a list, e.g. `--on-loop off,answer`, and compares them.)
    #[arg(long, value_name = "off|stop|answer", default_value = "off", value_delimiter = ',', value_parser = on_loop)]
    pub on_loop: Vec<OnLoop>,
    /// The same as --on-loop stop (kept for scripts written before --on-loop).
    #[arg(long, hide = true, conflicts_with = "on_loop")]
    pub loop_stop: bool,
    /// Copies of a repeating pattern that count as a loop.
    #[arg(long, default_value_t = LoopParams::DEFAULT_MIN_REPEATS, value_name = "N", allow_hyphen_values = true, value_parser = whole_number)]
    pub loop_min_repeats: usize,
    /// Tokens a repeating pattern must span to count as a loop.
    #[arg(long, default_value_t = LoopParams::DEFAULT_MIN_SPAN, value_name = "N", allow_hyphen_values = true, value_parser = whole_number)]
    pub loop_min_span: usize,
    /// Report the K most likely alternatives with every token (K ≤ 20).
    #[arg(long, default_value_t = 0, value_name = "K", allow_hyphen_values = true, value_parser = whole_number)]
    pub top_logprobs: usize,
    /// MTP speculative decoding: draft steps per verify pass (1–4), 0 = off, `auto` adapts the
    /// depth to the acceptance. Default: 2 when the checkpoint has an MTP head. (A server
    /// decides this itself.)
    #[arg(long, value_name = "K|auto")]
    pub mtp: Option<MtpMode>,
}

impl Default for ParamOverrides {
    /// The empty command line: clap applies each flag's default, written once above.
    fn default() -> Self {
        #[derive(clap::Parser)]
        struct Empty {
            #[command(flatten)]
            overrides: ParamOverrides,
        }
        <Empty as clap::Parser>::parse_from(["deltascope"]).overrides
    }
}

/// The model-card presets, as flag values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PresetArg {
    ThinkingGeneral,
    ThinkingCoding,
    InstructGeneral,
    InstructReasoning,
}

impl From<PresetArg> for Preset {
    fn from(p: PresetArg) -> Preset {
        match p {
            PresetArg::ThinkingGeneral => Preset::ThinkingGeneral,
            PresetArg::ThinkingCoding => Preset::ThinkingCoding,
            PresetArg::InstructGeneral => Preset::InstructGeneral,
            PresetArg::InstructReasoning => Preset::InstructReasoning,
        }
    }
}

impl ParamOverrides {
    /// The flags checked before anything loads (one `--on-loop` value, a seed in range), with
    /// the hidden `--loop-stop` folded into `--on-loop`.
    pub fn checked(&self) -> BackendResult<ParamOverrides> {
        self.seed()?;
        Ok(self.with_on_loop(self.one_on_loop()?))
    }

    /// These settings with this `--on-loop` value (`sweep` runs each value of its list).
    pub fn with_on_loop(&self, on_loop: OnLoop) -> ParamOverrides {
        let on_loop = if self.loop_stop { OnLoop::Stop } else { on_loop };
        ParamOverrides { on_loop: vec![on_loop], loop_stop: false, ..self.clone() }
    }

    /// `--seed`, checked: the same kind of message as any other value out of its range.
    pub fn seed(&self) -> BackendResult<u64> {
        u64::try_from(self.seed)
            .map_err(|_| BackendError::invalid(format!("--seed {}: must be in [0, {}]", self.seed, u64::MAX)))
    }

    /// The one `--on-loop` value (a list is for `sweep`).
    fn one_on_loop(&self) -> BackendResult<OnLoop> {
        match self.on_loop[..] {
            [_] if self.loop_stop => Ok(OnLoop::Stop),
            [one] => Ok(one),
            _ => Err(BackendError::invalid(format!(
                "--on-loop takes one value here ({} given); `deltascope sweep --on-loop off,answer` compares several",
                self.on_loop.len()
            ))),
        }
    }

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
            Preset::from(preset).apply(&mut sampling);
        }
        let s = &mut sampling;
        s.temperature = self.temperature.unwrap_or(s.temperature);
        s.top_k = self.top_k.unwrap_or(s.top_k);
        s.top_p = self.top_p.unwrap_or(s.top_p);
        s.min_p = self.min_p.unwrap_or(s.min_p);
        s.presence_penalty = self.presence_penalty.unwrap_or(s.presence_penalty);
        s.frequency_penalty = self.frequency_penalty.unwrap_or(s.frequency_penalty);
        s.repetition_penalty = self.repetition_penalty.unwrap_or(s.repetition_penalty);
        s.seed = self.seed()?;
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
                on_loop: self.one_on_loop()?,
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
