//! `config.json` as the file has it: `#[derive(Deserialize)]` structs (the mistral.rs
//! `qwen3_next.rs` shape) whose fields keep what was there, so that [`check`](super::check)
//! can name a wrong value in its message, and the class defaults of each family for the fields
//! a file leaves out.
//!
//! Every field is a [`Field`]: absent, `null`, a value of the expected type, or another value
//! (kept as written). Parsing a [`RawConfig`] never fails on a field; the checks do.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::Family;

/// One field of the file.
#[derive(Debug, Clone, Default)]
pub(crate) enum Field<T> {
    /// Not in the file.
    #[default]
    Absent,
    /// Of the expected type.
    Given(T),
    /// Anything else, `null` included, as the file has it.
    Other(Value),
}

impl<'de, T: for<'a> Deserialize<'a>> Deserialize<'de> for Field<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Ok(match T::deserialize(&v) {
            Ok(t) if !v.is_null() => Field::Given(t),
            _ => Field::Other(v),
        })
    }
}

impl<T> Field<T> {
    /// The value, with JSON `null` read as an absent field: `None` when absent, `Err` with what
    /// the file has when it is of another type.
    pub(crate) fn present(&self) -> Option<std::result::Result<&T, &Value>> {
        match self {
            Field::Absent | Field::Other(Value::Null) => None,
            Field::Given(t) => Some(Ok(t)),
            Field::Other(v) => Some(Err(v)),
        }
    }

    /// An element of a list: a `null` one is a wrong value, not an absent one.
    pub(crate) fn element(&self) -> std::result::Result<&T, Value> {
        match self {
            Field::Given(t) => Ok(t),
            Field::Other(v) => Err(v.clone()),
            Field::Absent => Err(Value::Null),
        }
    }
}

/// A JSON object read as `T` (any other value is not a `T`, even one `T` would accept).
#[derive(Debug, Clone)]
pub(crate) struct Object<T>(pub T);

impl<'de, T: for<'a> Deserialize<'a>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = serde_json::Map::deserialize(d)?;
        T::deserialize(Value::Object(map)).map(Object).map_err(serde::de::Error::custom)
    }
}

/// A token id or a list of them (`eos_token_id`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum Ids {
    One(u64),
    Many(Vec<Field<u64>>),
}

/// The top level of `config.json`. The language-model fields are at the top level
/// (`qwen3_5_text`, `qwen3_5_moe_text`, `qwen3_next`) or under `text_config` (the multimodal
/// `qwen3_5`, `qwen3_5_moe`); `lm` reads the top level either way (its `tie_word_embeddings`,
/// `eos_token_id` and `dtype` count for nested configs too).
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct RawConfig {
    #[serde(default)]
    pub model_type: Field<String>,
    #[serde(default)]
    pub architectures: Field<Vec<Field<String>>>,
    #[serde(default)]
    pub text_config: Field<Object<RawTextConfig>>,
    #[serde(flatten)]
    pub lm: RawTextConfig,
}

/// The language-model fields (`text_config`, or the top level of a text-only config).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawTextConfig {
    pub model_type: Field<String>,
    pub vocab_size: Field<usize>,
    pub hidden_size: Field<usize>,
    pub intermediate_size: Field<usize>,
    pub num_hidden_layers: Field<usize>,
    pub num_attention_heads: Field<usize>,
    pub num_key_value_heads: Field<usize>,
    pub head_dim: Field<usize>,
    pub hidden_act: Field<String>,
    pub max_position_embeddings: Field<usize>,
    pub rms_norm_eps: Field<f64>,
    pub tie_word_embeddings: Field<bool>,
    pub attention_bias: Field<bool>,
    pub attn_output_gate: Field<bool>,
    pub linear_conv_kernel_dim: Field<usize>,
    pub linear_key_head_dim: Field<usize>,
    pub linear_value_head_dim: Field<usize>,
    pub linear_num_key_heads: Field<usize>,
    pub linear_num_value_heads: Field<usize>,
    pub layer_types: Field<Vec<Field<String>>>,
    pub full_attention_interval: Field<usize>,
    pub num_experts: Field<usize>,
    pub num_experts_per_tok: Field<usize>,
    pub moe_intermediate_size: Field<usize>,
    pub shared_expert_intermediate_size: Field<usize>,
    pub norm_topk_prob: Field<bool>,
    pub decoder_sparse_step: Field<usize>,
    pub mlp_only_layers: Field<Vec<Field<usize>>>,
    pub mtp_num_hidden_layers: Field<usize>,
    pub rope_parameters: Field<Object<RawRope>>,
    pub rope_scaling: Field<Object<RawRope>>,
    pub rope_theta: Field<f64>,
    pub partial_rotary_factor: Field<f64>,
    pub eos_token_id: Field<Ids>,
    pub dtype: Field<String>,
    pub torch_dtype: Field<String>,
    pub mamba_ssm_dtype: Field<String>,
    /// Checked by `quant` (its own keys and messages).
    pub quantization_config: Option<Value>,
    /// Every other key at this level (`keys.rs` tells the inert ones from the unknown).
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Value>,
}

/// `rope_parameters` (or the legacy `rope_scaling`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub(crate) struct RawRope {
    pub rope_type: Field<String>,
    #[serde(rename = "type")]
    pub kind: Field<String>,
    pub rope_theta: Field<f64>,
    pub partial_rotary_factor: Field<f64>,
    pub mrope_section: Field<Vec<Field<u64>>>,
    pub mrope_interleaved: Field<bool>,
    /// Every other key (YaRN's `factor`, …): reported as unknown.
    #[serde(flatten)]
    pub rest: serde_json::Map<String, Value>,
}

/// The class defaults of the Hugging Face configs per family, for absent fields only (a value
/// in the file always wins).
pub(crate) struct Defaults {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
}

impl Defaults {
    pub(crate) fn of(family: Family) -> Defaults {
        match family {
            Family::Qwen35 => Defaults {
                vocab_size: 248320,
                hidden_size: 4096,
                intermediate_size: Some(12288),
                num_hidden_layers: 32,
                num_attention_heads: 16,
                num_key_value_heads: 4,
                num_experts: 0,
                num_experts_per_tok: 0,
            },
            Family::Qwen35Moe => Defaults {
                vocab_size: 248320,
                hidden_size: 2048,
                intermediate_size: None,
                num_hidden_layers: 40,
                num_attention_heads: 16,
                num_key_value_heads: 2,
                num_experts: 256,
                num_experts_per_tok: 8,
            },
            Family::Qwen3Next => Defaults {
                vocab_size: 151936,
                hidden_size: 2048,
                intermediate_size: Some(5632),
                num_hidden_layers: 48,
                num_attention_heads: 16,
                num_key_value_heads: 2,
                num_experts: 512,
                num_experts_per_tok: 10,
            },
        }
    }
}

/// The family of a top-level `model_type`, and whether its language-model fields are nested
/// under `text_config`.
pub(crate) fn family_of(model_type: &str) -> Option<(Family, bool)> {
    match model_type {
        "qwen3_5" => Some((Family::Qwen35, true)),
        "qwen3_5_text" => Some((Family::Qwen35, false)),
        "qwen3_5_moe" => Some((Family::Qwen35Moe, true)),
        "qwen3_5_moe_text" => Some((Family::Qwen35Moe, false)),
        "qwen3_next" => Some((Family::Qwen3Next, false)),
        _ => None,
    }
}
