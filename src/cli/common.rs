//! Pieces shared by the subcommands: which backend (a checkpoint, or a server), the prompt
//! flags and the generation flags. Everything here is plain flag parsing; loading, rendering
//! and validation live in the backend.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

use deltascope_model::DeviceSpec;

pub use crate::backend::flags::{float32, on_loop, whole_number};
use crate::backend::{
    self, Backend, BackendSpec, BudgetMode, ChatMessage, KeySource, OpenProgress, Prompt, ReasoningSplit, RemoteSpec,
    Role,
    local::{Loaded, LocalSpec},
};

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A Hugging Face model directory (config.json, *.safetensors, tokenizer.json), a GGUF file
    /// (or a folder of one, or a split set), or `demo` for the embedded demo model (the default).
    #[arg(long, value_name = "DIR|FILE.gguf|demo", conflicts_with = "server")]
    pub model: Option<PathBuf>,
    /// Activation precision: `auto` (the checkpoint's own dtype from config.json, as
    /// transformers loads it: bf16 for bf16 checkpoints, f32 otherwise), `f32` (exact f32 math
    /// on the stored weights: the reference mode), or `bf16` with the cast points of the
    /// transformers reference. Weights stay in the checkpoint's dtype either way (bf16 mode
    /// rounds f32 / f16 weights to bf16, as transformers does).
    #[arg(long, default_value = "auto", value_name = "auto|f32|bf16")]
    pub dtype: String,
    /// Threads for the in-process engine (default: the CPU's physical cores).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub threads: Option<i64>,
    /// Where the in-process engine runs: `auto` (a GPU when one can run the model, else the
    /// CPU, saying why in one line), `cpu`, `cuda` (every GPU the model needs), `cuda:0`,
    /// `cuda:0,1`, or `emu` / `emu:0,1` (the emulated CUDA device: the CUDA engine with its
    /// kernels compiled for this CPU; slow, for checking the GPU path without a GPU). A device
    /// asked for by name that cannot run is an error.
    #[arg(long, default_value = "auto", value_name = "auto|cpu|cuda[:N[,M]]|emu[:N[,M]]", value_parser = device_spec, conflicts_with = "server")]
    pub device: DeviceSpec,
    /// The CUDA kernels' sources read from this folder (prelude.cu and every kernels/*.cu)
    /// instead of the copies built into the binary: an edited kernel runs on --device
    /// cuda|emu without a rebuild.
    #[arg(long, value_name = "DIR", conflicts_with = "server")]
    pub kernels: Option<PathBuf>,
    /// Refuse a config.json key deltascope does not know (by default each one is a warning:
    /// ignored, which is wrong if it changes the architecture).
    #[arg(long)]
    pub strict_config: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

/// The model flags of a command that runs the CPU engine's forward pass itself (`logits`):
/// no server, no GPU.
#[derive(Args, Debug)]
pub struct LocalModelArgs {
    /// A Hugging Face model directory (config.json, *.safetensors, tokenizer.json), a GGUF file
    /// (or a folder of one, or a split set), or `demo` for the embedded demo model (the default).
    #[arg(long, value_name = "DIR|FILE.gguf|demo")]
    pub model: Option<PathBuf>,
    /// Activation precision: `auto` (the checkpoint's own dtype), `f32` or `bf16`.
    #[arg(long, default_value = "auto", value_name = "auto|f32|bf16")]
    pub dtype: String,
    /// Threads for the engine (default: the CPU's physical cores).
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub threads: Option<i64>,
    /// Refuse a config.json key deltascope does not know (by default: a warning).
    #[arg(long)]
    pub strict_config: bool,
}

impl LocalModelArgs {
    /// The engine these flags name, on `device`.
    pub fn spec(&self, device: DeviceSpec) -> anyhow::Result<LocalSpec> {
        let mut spec = LocalSpec::new(self.model.as_deref(), &self.dtype)?;
        spec.threads = checked_threads(self.threads)?;
        spec.device = device;
        spec.strict_config = self.strict_config;
        Ok(spec)
    }

    /// Loads the model on the CPU, saying what a user must know about it.
    pub fn load(&self) -> anyhow::Result<Loaded> {
        let loaded = Loaded::load(&self.spec(DeviceSpec::Cpu)?, &|_: OpenProgress| {})?;
        if let Some(note) = &loaded.placement().note {
            eprintln!("{note}");
        }
        let source = loaded.model().source();
        for note in loaded.model().config().unknown_key_warnings(&source.file_label("config.json")) {
            eprintln!("warning: {note}");
        }
        for note in source.notes() {
            eprintln!("note: {note}");
        }
        Ok(loaded)
    }
}

/// `--server URL` and what goes with it.
#[derive(Args, Debug, Clone, Default)]
pub struct ServerArgs {
    /// An OpenAI-compatible server (llama.cpp, vLLM, SGLang, …) instead of a local model:
    /// `http://127.0.0.1:8080`.
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// API key for the server (else $DELTASCOPE_API_KEY, else $OPENAI_API_KEY).
    #[arg(long, value_name = "KEY", requires = "server")]
    pub api_key: Option<String>,
    /// The served model's id (default: the first of the server's /v1/models).
    #[arg(long, value_name = "NAME", requires = "server")]
    pub server_model: Option<String>,
    /// A model directory with tokenizer.json and the chat template, for client-side thinking
    /// budgets on servers without a budget field (llama.cpp's /props provides its own).
    #[arg(long, value_name = "DIR", requires = "server")]
    pub tokenizer: Option<PathBuf>,
    /// How a thinking budget is enforced on a server: its own request field (`server`), or by
    /// deltascope stopping the stream and continuing with the bridge text (`client`).
    #[arg(long, value_enum, default_value = "server", value_name = "server|client")]
    pub budget_mode: BudgetModeArg,
    /// Who separates thinking from the answer: the server's reasoning parser (`server`), or
    /// deltascope on `</think>` in the text (`client`: token-exact thinking counts; llama.cpp
    /// and SGLang are asked not to split).
    #[arg(long, value_enum, default_value = "server", value_name = "server|client")]
    pub reasoning_split: SplitArg,
    /// Seconds a stream may stay silent between frames before it is cut.
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS", requires = "server")]
    pub idle_timeout: f64,
    /// Seconds to wait for the server's first answer to a request — its response headers and
    /// first stream frame, which a long prompt's prefill delays — before it is cut.
    #[arg(long, default_value_t = 300.0, value_name = "SECONDS", requires = "server")]
    pub first_byte_timeout: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SplitArg {
    #[default]
    Server,
    Client,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BudgetModeArg {
    #[default]
    Server,
    Client,
}

impl ModelArgs {
    /// The in-process engine these flags name.
    pub fn local_spec(&self) -> anyhow::Result<LocalSpec> {
        if self.kernels.is_some() && self.device == DeviceSpec::Cpu {
            anyhow::bail!(
                "--kernels DIR: the CUDA kernels' sources are read for --device cuda|emu; --device cpu runs none of them"
            );
        }
        let mut spec = LocalSpec::new(self.model.as_deref(), &self.dtype)?;
        spec.threads = checked_threads(self.threads)?;
        spec.device = self.device.clone();
        spec.kernels = self.kernels.clone();
        spec.strict_config = self.strict_config;
        Ok(spec)
    }

    /// The backend these flags name.
    pub fn spec(&self) -> anyhow::Result<BackendSpec> {
        let Some(url) = &self.server.server else {
            return Ok(BackendSpec::Local(self.local_spec()?));
        };
        let s = &self.server;
        let api_key = match &s.api_key {
            Some(k) => Some((k.clone(), KeySource::Flag)),
            None => ["DELTASCOPE_API_KEY", "OPENAI_API_KEY"]
                .into_iter()
                .find_map(|name| std::env::var(name).ok().filter(|v| !v.is_empty()).map(|v| (v, KeySource::Env(name)))),
        };
        for (flag, v) in [("--idle-timeout", s.idle_timeout), ("--first-byte-timeout", s.first_byte_timeout)] {
            anyhow::ensure!(v.is_finite() && v > 0.0, "{flag} {v}: must be a positive, finite number of seconds");
        }
        let mut spec = RemoteSpec::new(url.clone());
        spec.api_key = api_key;
        spec.model = s.server_model.clone();
        spec.tokenizer = s.tokenizer.clone();
        spec.budget_mode = match s.budget_mode {
            BudgetModeArg::Server => BudgetMode::Server,
            BudgetModeArg::Client => BudgetMode::Client,
        };
        spec.reasoning_split = match s.reasoning_split {
            SplitArg::Server => ReasoningSplit::Server,
            SplitArg::Client => ReasoningSplit::Client,
        };
        spec.idle_timeout = Duration::from_secs_f64(s.idle_timeout);
        spec.first_byte_timeout = Duration::from_secs_f64(s.first_byte_timeout);
        Ok(BackendSpec::Remote(spec))
    }
}

/// `--threads N`, checked: at least 1, the same kind of message as any value out of range.
pub fn checked_threads(threads: Option<i64>) -> anyhow::Result<Option<usize>> {
    match threads {
        None => Ok(None),
        Some(n) if n >= 1 => Ok(Some(usize::try_from(n)?)),
        Some(n) => anyhow::bail!("--threads {n}: must be at least 1 (the threads the engine's layers run on)"),
    }
}

/// Opens the backend the flags name (loading a model reports nothing: headless commands).
pub fn open(args: &ModelArgs) -> anyhow::Result<Box<dyn Backend>> {
    let backend = backend::open(&args.spec()?, &|_: OpenProgress| {})?;
    print_notes(backend.info());
    Ok(backend)
}

/// What a headless command says on stderr about the backend it opened: why the model runs
/// where it does, and each config.json key it does not know.
pub fn print_notes(info: &crate::backend::BackendInfo) {
    if let Some(note) = &info.device_note {
        eprintln!("{note}");
    }
    for note in &info.config_notes {
        eprintln!("warning: {note}");
    }
}

/// Loads the local checkpoint for a developer tool that measures the engine itself (`logits`,
/// `bench`), which has no meaning on a server.
pub fn load_local(args: &ModelArgs, command: &str) -> anyhow::Result<Loaded> {
    if let Some(url) = &args.server.server {
        anyhow::bail!("`{command}` runs the in-process engine; it cannot use --server {url}");
    }
    let loaded = Loaded::load(&args.local_spec()?, &|_: OpenProgress| {})?;
    if let Some(note) = &loaded.placement().note {
        eprintln!("{note}");
    }
    Ok(loaded)
}

/// The embedded demo model for `None` or `demo`, else a directory.
pub fn local_spec(model: Option<&Path>, dtype: &str) -> anyhow::Result<LocalSpec> {
    Ok(LocalSpec::new(model, dtype)?)
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

/// The prompt a subcommand was given: token ids, raw text, or a user message (with the
/// system prompt) for the chat template.
pub fn prompt(text: Option<&str>, ids: Option<&str>, p: &PromptArgs) -> anyhow::Result<Prompt> {
    match (text, ids) {
        (Some(_), Some(_)) => anyhow::bail!("give either a text prompt or token ids, not both"),
        (None, None) => anyhow::bail!("no prompt given"),
        (None, Some(ids)) => Ok(Prompt::Ids(parse_ids(ids)?)),
        (Some(t), None) if p.raw => {
            anyhow::ensure!(p.system.is_none(), "a system prompt needs the chat template; drop --raw");
            Ok(Prompt::Text(t.to_string()))
        }
        (Some(t), None) => {
            let mut m = vec![];
            if let Some(s) = &p.system {
                m.push(ChatMessage::new(Role::System, s.clone()));
            }
            m.push(ChatMessage::new(Role::User, t));
            Ok(Prompt::Chat(m))
        }
    }
}

/// `--prompt TEXT` (`-`: standard input) or `--prompt-file FILE`, for prompts longer than a
/// command line can hold (Linux caps one argument at 128 KiB). One line break at the end of a
/// file or of piped input is dropped (files and `echo` end with one).
pub fn prompt_text(text: Option<&str>, file: Option<&Path>) -> anyhow::Result<Option<String>> {
    let (read, from) = match (text, file) {
        (Some(_), Some(_)) => anyhow::bail!("give either --prompt or --prompt-file, not both"),
        (None, None) => return Ok(None),
        (Some("-"), None) => {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                .map_err(|e| anyhow::anyhow!("--prompt -: cannot read standard input: {e}"))?;
            (s, "standard input".to_string())
        }
        (Some(t), None) => return Ok(Some(t.to_string())),
        (None, Some(f)) => {
            let s = std::fs::read_to_string(f)
                .map_err(|e| anyhow::anyhow!("--prompt-file {}: cannot read it: {e}", f.display()))?;
            (s, f.display().to_string())
        }
    };
    let t = read.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&read);
    anyhow::ensure!(!t.trim().is_empty(), "the prompt from {from} is empty");
    Ok(Some(t.to_string()))
}

/// The prompt a command cannot run without: the flags' (as [`prompt_text`]), else standard
/// input when it is piped (`echo "Is 91 prime?" | deltascope run`), else an error listing every
/// way to give one. `ids`: the command also takes `--prompt-ids`.
pub fn required_prompt_text(text: Option<&str>, file: Option<&Path>, ids: bool) -> anyhow::Result<String> {
    if let Some(t) = prompt_text(text, file)? {
        return Ok(t);
    }
    let ways = format!(
        "--prompt TEXT, --prompt-file FILE{}, or pipe it in (`echo … | deltascope …` or --prompt -)",
        if ids { ", --prompt-ids 1,2,3" } else { "" }
    );
    if std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        anyhow::bail!("no prompt: give one with {ways}");
    }
    match prompt_text(Some("-"), None) {
        Ok(Some(t)) => Ok(t),
        _ => anyhow::bail!("no prompt: standard input was empty; give one with {ways}"),
    }
}

/// `1,2,3` → ids (`--prompt-ids`, `--ids`).
pub fn parse_ids(s: &str) -> anyhow::Result<Vec<u32>> {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u32>().map_err(|_| {
                anyhow::anyhow!(
                    "--prompt-ids / --ids: `{t}` is not a token id (expected a comma-separated list like 1,2,3)"
                )
            })
        })
        .collect()
}

pub fn device_spec(s: &str) -> Result<DeviceSpec, String> {
    DeviceSpec::parse(s).map_err(|e| e.to_string())
}

/// The plot is SVG: a path named otherwise is refused (a `.png` holding SVG opens nowhere), and
/// so is one that cannot be created (missing directory, no permission, a directory).
pub fn check_plot_path(path: &std::path::Path) -> anyhow::Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    anyhow::ensure!(
        ext.as_deref() == Some("svg"),
        "--plot {}: the plot is an SVG drawing; name the file *.svg (convert it afterwards for another format)",
        path.display()
    );
    let existed = path.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| anyhow::anyhow!("--plot {}: cannot write it: {}", path.display(), e))?;
    if !existed {
        // Written for real once the runs are done.
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}
