//! The backend seam: the only thing front ends (TUI, `run`, `sweep`, `serve`, sessions) import
//! to generate. A [`Backend`] is either the in-process engine ([`local`]) or a remote
//! OpenAI-compatible server ([`openai`]); it describes itself ([`BackendInfo`]) and starts one
//! [`Generation`] per request, each with its own event stream and controls.
//!
//! The events, parameters and controls every backend speaks are the generation protocol
//! (deltascope_protocol::generation), which front ends import directly; they never import `engine` or `model`.

#![forbid(unsafe_code)]

pub mod flags;
pub mod local;
pub mod openai;
pub mod params;

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use deltascope_protocol::{ErrorKind, Generation, GenerationParams, SamplingParams, ServerLabel, StepControl};

pub use deltascope_model::ModelSource;
pub use params::{ParamOverrides, PresetArg, defaults_source, flag};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One chat message, as chat templates and OpenAI-compatible servers take it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    pub content: String,
    /// An earlier assistant turn's thinking (templates decide whether to show it again).
    #[serde(default, skip_serializing_if = "Option::is_none", rename = "reasoning_content")]
    pub reasoning: Option<String>,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        ChatMessage { role, content: content.into(), reasoning: None }
    }
}

/// What to generate from.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// Messages rendered through the chat template (the model's, or the server's).
    Chat(Vec<ChatMessage>),
    /// Text tokenised as is, no template (`--raw`).
    Text(String),
    /// Token ids used as they are (`--prompt-ids`; local only).
    Ids(Vec<u32>),
    /// More of an assistant turn that was cut short (by `max_tokens`, or cancelled): the
    /// messages rendered with the generation prompt, then the text generated so far verbatim
    /// (thinking, `</think>`, answer), so the model carries on where it stopped.
    Continue { messages: Vec<ChatMessage>, generated: String },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub prompt: Prompt,
    /// Everything about the generation, thinking included: `params.thinking` off renders the
    /// template's `enable_thinking=false` (the empty think block, the answer comes at once).
    pub params: GenerationParams,
}

/// What a request would send, without sending it (`run --dry-run`).
#[derive(Debug, Clone, PartialEq)]
pub struct DryRun {
    /// What renders the prompt: the template's name, or the server's URL.
    pub rendered_by: String,
    /// The prompt text that would be tokenised, or the request body that would be sent.
    pub text: Option<String>,
    /// The prompt's token ids, when known here.
    pub ids: Option<Vec<u32>>,
}

/// Whether a backend can do something, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Support {
    Yes,
    No(String),
}

impl Support {
    pub fn is_yes(&self) -> bool {
        matches!(self, Support::Yes)
    }

    /// Why not (`None` when supported).
    pub fn reason(&self) -> Option<&str> {
        match self {
            Support::Yes => None,
            Support::No(r) => Some(r),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum BackendKind {
    /// The in-process engine.
    Local { devices: Vec<String>, dtype: String },
    /// An OpenAI-compatible server.
    Remote(ServerLabel),
}

/// What a backend says about itself (status bar, gauges, what the sliders may do).
#[derive(Debug, Clone, PartialEq)]
pub struct BackendInfo {
    /// The model's name (checkpoint label, or the server's model id).
    pub name: String,
    pub kind: BackendKind,
    /// Why a local model runs on the CPU under `--device auto` ("no GPU: libcuda not found").
    pub device_note: Option<String>,
    /// What a user must know about the checkpoint's config.json: one line per key deltascope
    /// does not know (ignored).
    pub config_notes: Vec<String>,
    /// What identifies the model's weights, as far as this backend can say.
    pub identity: ModelIdentity,
    /// Context length in tokens, when known.
    pub context: Option<usize>,
    /// The vocabulary's size (token ids 0 to this − 1), when known.
    pub vocab_size: Option<usize>,
    /// Whether MTP speculative decoding runs (local: the checkpoint has a head; remote: the
    /// server reports speculative decoding).
    pub has_mtp: bool,
    /// e.g. "8 layers: 6 GDN + 2 attention" (local only).
    pub layers: Option<String>,
    /// A GGUF's file type as llama.cpp names it ("Q4_K_M"; local GGUF models only).
    pub file_type: Option<String>,
    pub weights_bytes: Option<usize>,
    /// Sampling defaults: generation_config.json, the server's own, or the model card's.
    pub defaults: SamplingParams,
    /// Step mode (pause / one token at a time).
    pub step: Support,
    /// Ending thinking on request (the TUI's rescue key), and `--on-loop answer`.
    pub end_thinking: Support,
    /// Per-token MTP provenance (accepted draft / bonus).
    pub provenance: Support,
    /// Whether `--mtp` / the MTP slider change anything (the server decides for itself).
    pub mtp_control: Support,
    /// Whether a cut answer can be continued ([`Prompt::Continue`]).
    pub continuation: Support,
    /// Whether generations can trace the recurrent state (`--trace-state`, the State view).
    pub state_trace: Support,
}

/// What identifies a model's weights, as far as a backend can say (a server says little, and
/// names its model by whatever it was started with: a repository id, an alias, a GGUF file's
/// path). Two backends are called different models from what both say, never from a file name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelIdentity {
    pub name: String,
    /// `name` is a file's (a `.gguf` llama.cpp serves by its path), not a model's.
    pub name_is_file: bool,
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub layers: Option<usize>,
    /// Parameters of the language model, and with its MTP head (a GGUF may or may not carry it).
    pub params: Option<u64>,
    pub params_with_mtp: Option<u64>,
    /// The first embedding rows at bf16, hashed (deltascope's engines and `serve` say it).
    pub fingerprint: Option<String>,
    /// The bytes of the weights file's tensors and its file type ("Q4_K_M"), when a GGUF is
    /// what runs (llama.cpp's `/v1/models` `meta.size` / `meta.ftype`, or the local file).
    pub file_bytes: Option<u64>,
    pub file_type: Option<String>,
    /// The values of every tensor in the local GGUF (what llama.cpp reports as `n_params`:
    /// the MTP block and the embedding included).
    pub file_values: Option<u64>,
}

impl ModelIdentity {
    /// A name as a server gives it: a file's when it ends like a weights file.
    pub fn named(name: &str) -> ModelIdentity {
        let lower = name.to_lowercase();
        let name_is_file = [".gguf", ".bin", ".safetensors", ".pt"].iter().any(|ext| lower.ends_with(ext));
        ModelIdentity { name: name.to_string(), name_is_file, ..Default::default() }
    }

    /// Why `self` and `other` are not the same model, from what both say: vocabulary, sizes,
    /// layers, parameter count (1 %, with or without the MTP head) and the weight fingerprint;
    /// when neither side says any of those, their names (two model names, never a file's).
    /// `None`: the same model, or nothing to tell them apart by.
    pub fn differs_from(&self, other: &ModelIdentity) -> Option<String> {
        let mut compared = false;
        let mut differ = vec![];
        let mut check = |what: &str, a: Option<u64>, b: Option<u64>| {
            if let (Some(a), Some(b)) = (a, b) {
                compared = true;
                if a != b {
                    differ.push(format!("{what} {a} vs {b}"));
                }
            }
        };
        let n = |v: Option<usize>| v.map(|v| v as u64);
        check("vocabulary", n(self.vocab_size), n(other.vocab_size));
        check("hidden size", n(self.hidden_size), n(other.hidden_size));
        check("layers", n(self.layers), n(other.layers));
        let near = |a: u64, b: u64| (a as f64 - b as f64).abs() <= 0.01 * a.max(b) as f64;
        let counts = |m: &ModelIdentity| [m.params, m.params_with_mtp].into_iter().flatten().collect::<Vec<u64>>();
        let (pa, pb) = (counts(self), counts(other));
        if !pa.is_empty() && !pb.is_empty() {
            compared = true;
            if !pa.iter().any(|&a| pb.iter().any(|&b| near(a, b))) {
                differ.push(format!("parameters {} vs {}", pa[0], pb[0]));
            }
        }
        if let (Some(a), Some(b)) = (&self.fingerprint, &other.fingerprint) {
            compared = true;
            if a != b {
                differ.push("the embedding weights differ".to_string());
            }
        }
        if !differ.is_empty() {
            return Some(differ.join(", "));
        }
        if compared || self.name_is_file || other.name_is_file {
            return None;
        }
        (!same_name(&self.name, &other.name)).then(|| {
            format!(
                "named {} and {} (neither says its model's shape, so only the names could be compared)",
                self.name, other.name
            )
        })
    }
}

/// Two model names for the same weights: the last path component, case and the embedded
/// model's `embedded:` prefix aside ("Qwen/Qwen3.6-27B" and "qwen3.6-27b" are one model).
pub fn same_name(a: &str, b: &str) -> bool {
    let key = |s: &str| {
        let s = s.trim_end_matches('/');
        let s = s.rsplit('/').next().unwrap_or(s);
        s.trim_start_matches("embedded:").to_lowercase()
    };
    key(a) == key(b)
}

impl BackendInfo {
    pub fn is_remote(&self) -> bool {
        matches!(self.kind, BackendKind::Remote(_))
    }

    /// "cpu · bf16" or "llama.cpp b10434 · http://…": the status bar's backend label.
    pub fn label(&self) -> String {
        match &self.kind {
            // The emulated CUDA device says so: it runs the GPU path at a fraction of the CPU
            // engine's speed.
            BackendKind::Local { devices, dtype } if devices.iter().any(|d| d.starts_with("emu:")) => {
                format!("{} · {dtype} (emulated GPU)", devices.join(","))
            }
            // The activation precision is part of what runs (`--dtype auto` picks it); a device
            // name says "in-process" on its own, where a server shows its URL.
            BackendKind::Local { devices, dtype } => match &self.file_type {
                // A GGUF's weights are its blocks; the activations are `dtype`.
                Some(ft) => format!("{} · {ft} · {dtype}", devices.join(",")),
                None => format!("{} · {dtype}", devices.join(",")),
            },
            BackendKind::Remote(s) => match &s.version {
                Some(v) => format!("{} {v} · {}", s.kind, s.url),
                None => format!("{} · {}", s.kind, s.url),
            },
        }
    }
}

/// A failure to start or describe a generation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct BackendError {
    pub kind: ErrorKind,
    pub message: String,
}

impl BackendError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        BackendError { kind, message: message.into() }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        BackendError::new(ErrorKind::InvalidRequest, message)
    }
}

impl From<deltascope_model::Error> for BackendError {
    fn from(e: deltascope_model::Error) -> Self {
        BackendError::new(deltascope_protocol::error_kind(&e), e.to_string())
    }
}

pub type BackendResult<T> = std::result::Result<T, BackendError>;

/// A model to generate with: the in-process engine or a remote server.
pub trait Backend: Send + Sync {
    fn info(&self) -> &BackendInfo;
    /// Validates the request synchronously (an `Err` means nothing started), then streams.
    fn start(&self, req: ChatRequest) -> BackendResult<Generation> {
        self.start_with(req, Arc::new(StepControl::default()))
    }
    /// [`Backend::start`] steered by `control` from the first token (the TUI's step mode,
    /// switched on before the prompt is sent, holds the generation before it begins).
    fn start_with(&self, req: ChatRequest, control: Arc<StepControl>) -> BackendResult<Generation>;
    /// What `start` would send, without sending it.
    fn dry_run(&self, req: &ChatRequest) -> BackendResult<DryRun>;
    /// The prompt as this backend renders and tokenises it, asked without generating (a chat
    /// prompt, with the generation prompt); `None` when it has no way to say. `deltascope
    /// verify` compares a server's with the reference's before any generation.
    fn prompt_tokens(&self, req: &ChatRequest) -> BackendResult<Option<PromptTokens>>;

    /// `text` (a rendered prompt, special tokens written out) in this backend's tokens, for a
    /// server that tokenises text but renders no chat (SGLang's `/v1/tokenize`): its tokenizer
    /// checked on the reference's rendering. `None` when it has no way to say.
    fn text_tokens(&self, text: &str) -> BackendResult<Option<Vec<u32>>> {
        let _ = text;
        Ok(None)
    }
}

/// A rendered, tokenised prompt (the text when the backend shows it).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptTokens {
    pub text: Option<String>,
    pub ids: Vec<u32>,
}

/// Progress while a backend opens (loading weights, asking a server what it is).
#[derive(Debug, Clone, PartialEq)]
pub struct OpenProgress {
    pub done: u64,
    pub total: u64,
    pub what: String,
}

/// Which backend to open.
#[derive(Debug, Clone)]
pub enum BackendSpec {
    Local(local::LocalSpec),
    Remote(RemoteSpec),
}

/// Where an API key came from (named in 401/403 errors).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    Flag,
    Env(&'static str),
}

impl std::fmt::Display for KeySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeySource::Flag => write!(f, "--api-key"),
            KeySource::Env(name) => write!(f, "${name}"),
        }
    }
}

/// How a thinking budget is enforced on a remote server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BudgetMode {
    /// The server's own per-request field (llama.cpp, vLLM, SGLang).
    #[default]
    Server,
    /// deltascope stops the stream at the budget and continues with `/v1/completions` on the
    /// rendered prompt + thinking + bridge + `</think>` (needs the chat template).
    Client,
}

/// Who separates thinking from the answer on a remote server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReasoningSplit {
    /// The server's reasoning parser (llama.cpp is asked per request; SGLang and vLLM need
    /// `--reasoning-parser qwen3`).
    #[default]
    Server,
    /// deltascope splits `content` on `</think>` and asks the server not to (llama.cpp
    /// `reasoning_format: none`, SGLang `separate_reasoning: false`): `</think>` then arrives
    /// as a token with its logprob, so thinking is counted token-exactly.
    Client,
}

#[derive(Debug, Clone)]
pub struct RemoteSpec {
    /// The server's base URL (`http://127.0.0.1:8080`; a trailing `/v1` is accepted).
    pub url: String,
    pub api_key: Option<(String, KeySource)>,
    /// The served model's id; default: the first of `/v1/models`.
    pub model: Option<String>,
    /// A model directory with the tokenizer and chat template (client-side budgets).
    pub tokenizer: Option<PathBuf>,
    pub budget_mode: BudgetMode,
    pub reasoning_split: ReasoningSplit,
    /// A stream that sends nothing for this long between frames is cut (error `unavailable`).
    pub idle_timeout: std::time::Duration,
    /// A request whose response headers and first frame take longer than this is cut (a long
    /// prefill may take minutes; a server that accepts and never answers must not hang us).
    pub first_byte_timeout: std::time::Duration,
    /// Connecting and the first response headers.
    pub connect_timeout: std::time::Duration,
    /// Ask for every token's id where a server sends ids only on request (vLLM's
    /// `return_tokens_as_token_ids`: the alternatives then come as `token_id:N`, so only
    /// `deltascope verify`, which names them with the reference tokenizer, asks).
    pub token_ids: bool,
}

impl RemoteSpec {
    pub fn new(url: impl Into<String>) -> Self {
        RemoteSpec {
            url: url.into(),
            api_key: None,
            model: None,
            tokenizer: None,
            budget_mode: BudgetMode::Server,
            reasoning_split: ReasoningSplit::Server,
            idle_timeout: std::time::Duration::from_secs(60),
            first_byte_timeout: std::time::Duration::from_secs(300),
            connect_timeout: std::time::Duration::from_secs(10),
            token_ids: false,
        }
    }
}

/// Opens a backend: loads a checkpoint, or asks a server what it is.
pub fn open(spec: &BackendSpec, progress: &dyn Fn(OpenProgress)) -> BackendResult<Box<dyn Backend>> {
    match spec {
        BackendSpec::Local(s) => Ok(Box::new(local::LocalBackend::open(s, progress)?)),
        BackendSpec::Remote(s) => Ok(Box::new(openai::RemoteBackend::open(s, progress)?)),
    }
}
