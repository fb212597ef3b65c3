//! Pieces shared by the subcommands: which model, loading it, and building the prompt.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use crate::chat::{ChatTemplate, Prompt, PromptInput, TextTokenizer, build_prompt, parse_ids};
use crate::engine::speculative::MAX_DEPTH;
use crate::engine::{GenerationParams, LoopParams, MtpParams, Preset, QWEN_BUDGET_BRIDGE, SamplingParams};
use crate::model::{LoadOptions, Model, ModelSource, Precision, demo_source};

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A Hugging Face model directory (config.json, *.safetensors, tokenizer.json), or `demo`
    /// for the embedded demo model (the default).
    #[arg(long, value_name = "DIR|demo")]
    pub model: Option<PathBuf>,
    /// Compute precision: f32, or bf16 with the cast points of the transformers reference.
    #[arg(long, default_value = "f32", value_name = "f32|bf16")]
    pub dtype: String,
}

/// `None` or `demo` is the embedded demo model (write `./demo` for a directory of that name).
pub fn model_source(model: Option<&Path>) -> ModelSource {
    match model {
        None => demo_source(),
        Some(p) if p == Path::new("demo") => demo_source(),
        Some(p) => ModelSource::Dir(p.to_path_buf()),
    }
}

impl ModelArgs {
    pub fn source(&self) -> ModelSource {
        model_source(self.model.as_deref())
    }

    pub fn precision(&self) -> anyhow::Result<Precision> {
        Ok(Precision::parse(&self.dtype)?)
    }
}

#[derive(Args, Debug, Clone)]
pub struct PromptArgs {
    /// Tokenise the prompt as is (no chat template).
    #[arg(long)]
    pub raw: bool,
    /// System prompt (chat template only).
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Render the template with thinking disabled (enable_thinking=false).
    #[arg(long)]
    pub no_think: bool,
}

/// The generation flags shared by `run`, `sweep` and `chat`. Precedence for sampling: an
/// explicit flag, then `--preset`, then the model's generation_config.json, then greedy.
#[derive(Args, Debug, Clone, Default)]
pub struct GenArgs {
    /// Generated tokens, thinking + answer (forced tokens included).
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_tokens: usize,
    /// Thinking tokens before the engine forces the end of thinking: -1 unlimited, 0 thinking
    /// off (through the template).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub thinking_budget: Option<i64>,
    /// Text forced before `</think>` when the thinking budget runs out (default: Qwen's
    /// "Considering the limited time…" sentence; may be empty).
    #[arg(long, value_name = "TEXT")]
    pub budget_bridge: Option<String>,
    /// Answer tokens after which generation stops.
    #[arg(long, value_name = "N")]
    pub answer_budget: Option<usize>,
    /// Model-card sampling preset: thinking-general, thinking-coding, instruct-general, instruct-reasoning.
    #[arg(long, value_name = "NAME")]
    pub preset: Option<String>,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, value_name = "T")]
    pub temperature: Option<f32>,
    #[arg(long, value_name = "K")]
    pub top_k: Option<usize>,
    #[arg(long, value_name = "P")]
    pub top_p: Option<f32>,
    #[arg(long, value_name = "P")]
    pub min_p: Option<f32>,
    #[arg(long, value_name = "X", allow_hyphen_values = true)]
    pub presence_penalty: Option<f32>,
    #[arg(long, value_name = "X", allow_hyphen_values = true)]
    pub frequency_penalty: Option<f32>,
    #[arg(long, value_name = "X")]
    pub repetition_penalty: Option<f32>,
    #[arg(long, default_value_t = 0, value_name = "S")]
    pub seed: u64,
    /// Stop when this string appears (repeatable; cut from the output).
    #[arg(long, value_name = "TEXT")]
    pub stop: Vec<String>,
    /// Stop at this token id (repeatable), besides the model's EOS ids.
    #[arg(long, value_name = "ID")]
    pub stop_token_id: Vec<u32>,
    /// Stop generation when a degenerate loop is detected (finish_reason loop).
    #[arg(long)]
    pub loop_stop: bool,
    /// Copies of a repeating pattern that count as a loop.
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub loop_min_repeats: usize,
    /// Tokens a repeating pattern must span to count as a loop.
    #[arg(long, default_value_t = 48, value_name = "N")]
    pub loop_min_span: usize,
    /// Report the K most likely alternatives with every token (K ≤ 20).
    #[arg(long, default_value_t = 0, value_name = "K")]
    pub top_logprobs: usize,
    /// MTP speculative decoding: draft steps per verify pass (1–4), 0 = off, `auto` adapts the
    /// depth to the acceptance. Default: 2 when the checkpoint has an MTP head.
    #[arg(long, value_name = "K|auto")]
    pub mtp: Option<String>,
}

impl GenArgs {
    /// Whether the template should render thinking on (budget 0 turns it off).
    pub fn thinking_enabled(&self, no_think: bool) -> bool {
        !no_think && self.thinking_budget != Some(0)
    }

    pub fn params(&self, l: &Loaded) -> anyhow::Result<GenerationParams> {
        let mut sampling = l.generation_defaults.clone();
        if let Some(name) = &self.preset {
            let preset = Preset::parse(name).ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown preset \"{name}\" (expected one of: {})",
                    Preset::ALL.map(|p| p.name()).join(", ")
                )
            })?;
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
        anyhow::ensure!(s.temperature >= 0.0, "--temperature must be ≥ 0");
        anyhow::ensure!(s.top_p > 0.0 && s.top_p <= 1.0, "--top-p must be in (0, 1]");
        anyhow::ensure!((0.0..=1.0).contains(&s.min_p), "--min-p must be in [0, 1]");
        anyhow::ensure!(s.repetition_penalty > 0.0, "--repetition-penalty must be > 0");
        anyhow::ensure!(self.top_logprobs <= 20, "--top-logprobs is at most 20");
        let thinking_budget = match self.thinking_budget {
            None | Some(-1) => None,
            Some(n) if n >= 0 => Some(n as usize),
            Some(n) => {
                anyhow::bail!("--thinking-budget {n}: use -1 for unlimited, 0 for thinking off, or a token count")
            }
        };
        Ok(GenerationParams {
            max_tokens: self.max_tokens,
            sampling,
            thinking_budget,
            budget_bridge: self.budget_bridge.clone().unwrap_or_else(|| QWEN_BUDGET_BRIDGE.to_string()),
            answer_budget: self.answer_budget,
            stop: self.stop.clone(),
            stop_token_ids: self.stop_token_id.clone(),
            loop_detection: LoopParams {
                min_repeats: self.loop_min_repeats.max(2),
                min_span: self.loop_min_span,
                auto_stop: self.loop_stop,
                ..Default::default()
            },
            top_logprobs: self.top_logprobs,
            mtp: self.mtp_params(l)?,
        })
    }

    fn mtp_params(&self, l: &Loaded) -> anyhow::Result<MtpParams> {
        let has_head = l.model.mtp.is_some();
        let p = match self.mtp.as_deref() {
            None => MtpParams { depth: if has_head { 2 } else { 0 }, auto: false },
            Some("auto") => MtpParams { depth: 2, auto: true },
            Some(k) => {
                let depth: usize =
                    k.parse().map_err(|_| anyhow::anyhow!("--mtp {k}: expected 0–{MAX_DEPTH} or auto"))?;
                anyhow::ensure!(depth <= MAX_DEPTH, "--mtp {depth}: at most {MAX_DEPTH} draft steps");
                MtpParams { depth, auto: false }
            }
        };
        if (p.depth > 0 || p.auto) && !has_head && self.mtp.is_some() {
            anyhow::bail!("--mtp: {} has no MTP head (no mtp.* tensors); use --mtp 0", l.name);
        }
        Ok(p)
    }
}

/// A loaded model with its text side.
pub struct Loaded {
    pub model: Arc<Model>,
    pub tokenizer: Arc<TextTokenizer>,
    pub template: ChatTemplate,
    pub name: String,
    /// Sampling defaults from generation_config.json.
    pub generation_defaults: SamplingParams,
}

pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
    load_reporting(args, None, &|_| {})
}

/// [`load`], telling `weights` how many bytes of weights have been read and `step` which small
/// file comes next (the TUI's loading screen follows both).
pub fn load_reporting(
    args: &ModelArgs,
    weights: Option<crate::model::LoadProgress>,
    step: &dyn Fn(&str),
) -> anyhow::Result<Loaded> {
    let source = args.source();
    let opts = LoadOptions { precision: args.precision()?, progress: weights, ..Default::default() };
    let model = Model::load(&source, &opts)?;
    step("tokenizer");
    let tokenizer = TextTokenizer::load(&source, &model.config)?;
    step("chat template");
    let template = ChatTemplate::load(&source, tokenizer.specials.think_start.is_some())?;
    step("generation config");
    let generation_defaults = source
        .read_json("generation_config.json")?
        .map(|g| SamplingParams::from_generation_config(&g))
        .unwrap_or_default();
    Ok(Loaded {
        name: source.label(),
        model: Arc::new(model),
        tokenizer: Arc::new(tokenizer),
        template,
        generation_defaults,
    })
}

pub fn prompt(
    l: &Loaded,
    text: Option<&str>,
    ids: Option<&str>,
    p: &PromptArgs,
    thinking: bool,
) -> anyhow::Result<Prompt> {
    let ids = ids.map(parse_ids).transpose().context("--prompt-ids / --ids")?;
    let input = PromptInput {
        text: text.map(str::to_string),
        ids,
        raw: p.raw,
        system: p.system.clone(),
        enable_thinking: thinking && !p.no_think,
    };
    Ok(build_prompt(&l.template, &l.tokenizer, &input)?)
}

/// Bytes in human units (binary), two decimals: `1.50 GiB`.
pub fn human_bytes(b: u64) -> String {
    bytes_in_units(b, 2)
}

/// Bytes in human units with one decimal, for narrow gauges: `1.5 GiB`.
pub fn short_bytes(b: u64) -> String {
    bytes_in_units(b, 1)
}

fn bytes_in_units(b: u64, decimals: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{b} B") } else { format!("{v:.decimals$} {}", UNITS[u]) }
}
