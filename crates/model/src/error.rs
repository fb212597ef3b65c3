//! The library's error type. Every variant names what was wrong and where (file, field, tensor,
//! expected vs found), because the first thing a user sees of a bad checkpoint is this message.

#![forbid(unsafe_code)]

use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: {}", brief(what))]
    NotAFile { path: PathBuf, what: String },

    #[error("{dir}: no {} ({})", clip(file), brief(hint))]
    MissingFile { dir: PathBuf, file: String, hint: String },

    #[error("{file}: invalid JSON: {}", brief(message))]
    Json { file: String, message: String },

    #[error("{file}: field `{}`: {}", brief(field), brief(message))]
    ConfigField { file: String, field: String, message: String },

    #[error(
        "{file}: unknown model_type \"{}\" (deltascope supports qwen3_5, qwen3_5_text, qwen3_5_moe, qwen3_5_moe_text and qwen3_next)",
        brief(found)
    )]
    UnknownModelType { file: String, found: String },

    #[error("{file}: {}", brief(message))]
    Unsupported { file: String, message: String },

    #[error("tensor `{}` not found (looked in {})", clip(name), brief(searched))]
    MissingTensor { name: String, searched: String },

    #[error("{file}: tensor `{}` has shape {found:?}, expected {expected:?}", brief(name))]
    TensorShape { file: String, name: String, expected: Vec<usize>, found: Vec<usize> },

    #[error(
        "{file}: tensor `{}` has dtype {found}, expected one of BF16, F16, F32 (or F8_E4M3 with its weight_scale_inv in an FP8 checkpoint)",
        brief(name)
    )]
    TensorDtype { file: String, name: String, found: String },

    /// An FP8 weight that cannot be read as published (its scales, its codes, the config).
    #[error("{file}: FP8 tensor `{}`: {}", brief(name), brief(message))]
    Fp8Tensor { file: String, name: String, message: String },

    /// A GGUF file whose header is malformed (the message names the field and the offset).
    #[error("{file}: {}", brief(message))]
    Gguf { file: String, message: String },
    #[error("{file}: not a valid safetensors file: {}", brief(message))]
    Safetensors { file: String, message: String },

    #[error("{file}: {message}")]
    Tokenizer { file: String, message: String },

    #[error("chat template ({source_name}): {message}")]
    Template { source_name: String, message: String },

    #[error(
        "token id {id} at position {position} is out of range: the model's vocabulary has {vocab_size} entries (ids 0–{})",
        vocab_size.saturating_sub(1)
    )]
    TokenOutOfRange { id: u32, position: usize, vocab_size: usize },

    #[error(
        "the sequence would hold {needed} tokens but the model's context is {max} tokens (max_position_embeddings); shorten the prompt or lower max_tokens"
    )]
    ContextOverflow { needed: usize, max: usize },

    #[error("{0}")]
    InvalidArgument(String),

    /// The device the user named cannot run (no GPU, a missing ordinal, a missing library).
    #[error("--device {spec}: {message}")]
    Device { spec: String, message: String },

    #[error("state: {0}")]
    State(String),

    /// A CUDA call failed while running the model on a GPU.
    #[error("GPU: {0}")]
    Gpu(String),

    #[error("compute: {0}")]
    Compute(String),

    /// A forward pass produced NaN or ±Inf (found by `model::finite`).
    #[error("non-finite values: {0}")]
    NonFinite(NonFinite),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), source }
    }

    pub fn field(file: &str, field: &str, message: impl Into<String>) -> Self {
        Error::ConfigField { file: file.to_string(), field: field.to_string(), message: message.into() }
    }
}

/// Text from a file or the network, quoted in an error message, kept to one readable line:
/// control characters (line breaks included) become spaces, every quoted run (`"…"` or `` `…` ``)
/// longer than 80 characters keeps its first 40 and says how long it was, and a message still
/// over 400 characters keeps its start and its end (where "expected …" usually is).
pub fn brief(text: &str) -> String {
    const LONG: usize = 80;
    const KEEP: usize = 40;
    const MAX: usize = 400;
    let flat: String = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let mut out = String::with_capacity(flat.len().min(2 * MAX));
    let mut rest = flat.as_str();
    while let Some(open) = rest.find(['"', '`']) {
        let quote = rest[open..].chars().next().unwrap_or('"');
        out.push_str(&rest[..open + 1]);
        let after = &rest[open + 1..];
        let Some(close) = after.find(quote) else {
            rest = after;
            break;
        };
        let inner = &after[..close];
        let n = inner.chars().count();
        if n > LONG {
            out.extend(inner.chars().take(KEEP));
            out.push('…');
            out.push(quote);
            out.push_str(&format!(" ({n} characters)"));
        } else {
            out.push_str(inner);
            out.push(quote);
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    let n = out.chars().count();
    if n > MAX {
        let head: String = out.chars().take(MAX / 2).collect();
        let tail: String = out.chars().skip(n - MAX / 2 + 20).collect();
        out = format!("{head} … {tail}");
    }
    out
}

/// A name from a file or the network (a tensor, a shard, a key) kept short: over 80
/// characters, its first 40 and its length.
pub fn clip(name: &str) -> String {
    let n = name.chars().count();
    if n <= 80 {
        return brief(name);
    }
    let head: String = name.chars().take(40).map(|c| if c.is_control() { ' ' } else { c }).collect();
    format!("{head}… ({n} characters)")
}

/// The text a panic was raised with (`panic!` payloads are `&str` or `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

// ---------------------------------------------------------------------------------------------
// Where a forward pass first went non-finite (the payload of `Error::NonFinite`; the check itself
// is `model::finite`).

/// The part of the model whose output held the first non-finite value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sublayer {
    /// The token's embedding row.
    Embedding,
    /// The RMSNorm before the token mixer.
    InputNorm,
    /// Gated full attention.
    Attention,
    /// Gated DeltaNet (linear attention).
    Gdn,
    /// The RMSNorm before the feed-forward block.
    PostNorm,
    /// The dense MLP, or the MoE block's experts.
    Mlp,
    /// The MoE router's logits.
    MoeRouter,
    /// The final RMSNorm.
    FinalNorm,
    /// The LM head's logits.
    LmHead,
    /// The MTP module (its norms, projection, layer or logits).
    MtpHead,
}

impl Sublayer {
    pub fn as_str(self) -> &'static str {
        match self {
            Sublayer::Embedding => "embedding",
            Sublayer::InputNorm => "input norm",
            Sublayer::Attention => "attention",
            Sublayer::Gdn => "GDN",
            Sublayer::PostNorm => "post-attention norm",
            Sublayer::Mlp => "MLP",
            Sublayer::MoeRouter => "MoE router",
            Sublayer::FinalNorm => "final norm",
            Sublayer::LmHead => "LM head",
            Sublayer::MtpHead => "MTP head",
        }
    }

    /// The tensors to look at first, as a name pattern (`N` is the layer).
    fn suspects(self, layer: Option<usize>) -> String {
        let l = layer.map_or("N".to_string(), |l| l.to_string());
        match self {
            Sublayer::Embedding => "embed_tokens.weight (that token's row)".into(),
            Sublayer::InputNorm => format!("layers.{l}.input_layernorm.weight and rms_norm_eps"),
            Sublayer::Attention => format!("layers.{l}.self_attn.* (q/k/v/o_proj, q_norm, k_norm)"),
            Sublayer::Gdn => format!("layers.{l}.linear_attn.* (in_proj_*, conv1d, A_log, dt_bias, norm, out_proj)"),
            Sublayer::PostNorm => format!("layers.{l}.post_attention_layernorm.weight and rms_norm_eps"),
            Sublayer::Mlp => format!("layers.{l}.mlp.* (gate_proj, up_proj, down_proj, or the experts)"),
            Sublayer::MoeRouter => format!("layers.{l}.mlp.gate.weight"),
            Sublayer::FinalNorm => "norm.weight and rms_norm_eps".into(),
            Sublayer::LmHead => "lm_head.weight (or embed_tokens.weight when tied)".into(),
            Sublayer::MtpHead => "mtp.* (pre_fc_norm_*, fc, layers, norm)".into(),
        }
    }
}

/// The first non-finite value of a forward pass: which sublayer, which layer, which token.
#[derive(Debug, Clone, PartialEq)]
pub struct NonFinite {
    /// Decoder layer index; `None` for the embedding, the final norm, the LM head and MTP.
    pub layer: Option<usize>,
    pub sublayer: Sublayer,
    /// Sequence position of the first row that held one.
    pub position: usize,
    /// The token at that position.
    pub token: u32,
    /// NaN, +Inf or -Inf: the first such value's kind.
    pub value: f32,
    /// A GDN sublayer's output went non-finite because a value head's recurrent state did:
    /// `(head, non-finite entries in its state)` for the first such head.
    pub state_head: Option<(usize, usize)>,
}

impl NonFinite {
    /// What to check, most likely cause first.
    pub fn advice(&self) -> String {
        format!(
            "the weights {} (`deltascope inspect --model DIR --verify-weights` scans every tensor), rms_norm_eps in config.json, and the dtype (values past f16's range overflow)",
            self.sublayer.suspects(self.layer)
        )
    }

    /// "layer 3's MLP", "the LM head".
    pub fn location(&self) -> String {
        match self.layer {
            Some(l) => format!("layer {l}'s {}", self.sublayer.as_str()),
            None => format!("the {}", self.sublayer.as_str()),
        }
    }
}

impl std::fmt::Display for NonFinite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = if self.value.is_nan() {
            "NaN"
        } else if self.value > 0.0 {
            "+Inf"
        } else {
            "-Inf"
        };
        write!(
            f,
            "{what} first appeared in {} output at sequence position {} (token id {})",
            self.location(),
            self.position,
            self.token
        )?;
        if let Some((head, n)) = self.state_head {
            write!(f, "; value head {head}'s recurrent state holds {n} non-finite entries")?;
        }
        Ok(())
    }
}
