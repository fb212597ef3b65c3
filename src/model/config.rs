//! Every supported `config.json` variant, read from the raw JSON into one [`ModelConfig`] and a
//! per-layer plan.
//!
//! A value present in the file always wins; the Hugging Face class defaults apply only to fields
//! that are absent (or `null`). transformers' `AutoConfig` would silently substitute class
//! defaults in some paths (a llama.cpp converter bug came from exactly that), so we never go
//! through an intermediate "config class" that has defaults of its own.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// The model families deltascope runs. They share the hybrid layer stack and differ in tensor
/// layout and MLP kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Family {
    /// Qwen3.5 / Qwen3.6 dense (`qwen3_5`, `qwen3_5_text`).
    Qwen35,
    /// Qwen3.5 / Qwen3.6 MoE (`qwen3_5_moe`, `qwen3_5_moe_text`).
    Qwen35Moe,
    /// Qwen3-Next (`qwen3_next`): fused GDN projections, per-expert MoE tensors.
    Qwen3Next,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Gated DeltaNet (linear attention with a recurrent state).
    LinearAttention,
    /// Gated full attention with a KV cache.
    FullAttention,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MlpKind {
    Dense,
    Moe,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinearAttnConfig {
    pub conv_kernel: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    pub num_key_heads: usize,
    pub num_value_heads: usize,
}

impl LinearAttnConfig {
    pub fn key_dim(&self) -> usize {
        self.key_head_dim * self.num_key_heads
    }
    pub fn value_dim(&self) -> usize {
        self.value_head_dim * self.num_value_heads
    }
    /// Channels of the depthwise conv: q, k and v.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }
    /// Value heads per key head (the GDN "GQA" ratio).
    pub fn head_ratio(&self) -> usize {
        self.num_value_heads / self.num_key_heads
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct RopeConfig {
    pub rope_type: String,
    pub theta: f64,
    pub partial_rotary_factor: f64,
    /// Rotated dims per head: `int(head_dim * partial_rotary_factor)`.
    pub rotary_dim: usize,
    pub mrope_section: Option<Vec<usize>>,
    pub mrope_interleaved: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub num_experts_per_tok: usize,
    pub moe_intermediate_size: usize,
    pub shared_expert_intermediate_size: usize,
    pub norm_topk_prob: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelConfig {
    /// `model_type` at the top of the file (`qwen3_5`, `qwen3_next`, …).
    pub model_type: String,
    /// `model_type` of the language model (`qwen3_5_text` under a multimodal `qwen3_5`).
    pub text_model_type: String,
    pub family: Family,
    /// LM fields nested under `text_config` (the multimodal Qwen3.5/3.6 checkpoints).
    pub nested: bool,
    pub architectures: Vec<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// Dense MLP width (absent for Qwen3.5-MoE, where every layer is MoE).
    pub intermediate_size: Option<usize>,
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    pub attention_bias: bool,
    pub attn_output_gate: bool,
    pub linear: LinearAttnConfig,
    pub layer_types: Vec<LayerKind>,
    pub mlp_kinds: Vec<MlpKind>,
    pub rope: RopeConfig,
    pub moe: Option<MoeConfig>,
    pub mtp_num_hidden_layers: usize,
    /// Storage dtype the checkpoint declares (`dtype` / `torch_dtype`), if any.
    pub declared_dtype: Option<String>,
    /// `mamba_ssm_dtype` (the recurrent-state dtype servers use), if any.
    pub mamba_ssm_dtype: Option<String>,
    /// EOS ids named in config.json (generation_config.json and the tokenizer add to these).
    pub eos_token_ids: Vec<u32>,
}

/// Reads JSON fields with the path of the field in every message.
struct Fields<'a> {
    file: &'a str,
    prefix: &'a str,
    obj: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn path(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    /// The value of `key`, treating JSON `null` like an absent field.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.obj.get(key).filter(|v| !v.is_null())
    }

    fn usize_opt(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_u64().map(|n| Some(n as usize)).ok_or_else(|| {
                Error::field(self.file, &self.path(key), format!("expected a non-negative integer, found {v}"))
            }),
        }
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        Ok(self.usize_opt(key)?.unwrap_or(default))
    }

    fn positive_or(&self, key: &str, default: usize) -> Result<usize> {
        let n = self.usize_or(key, default)?;
        if n == 0 {
            return Err(Error::field(self.file, &self.path(key), "must be greater than 0"));
        }
        Ok(n)
    }

    /// A size every checkpoint's config sets: absent, the class default would not match the
    /// weights and loading would fail later on a shape, far from the cause.
    fn positive_required(&self, key: &str, class_default: usize) -> Result<usize> {
        if self.usize_opt(key)?.is_none() {
            return Err(Error::field(
                self.file,
                &self.path(key),
                format!(
                    "missing (transformers would take its class default {class_default}, which the weights' shapes would then contradict)"
                ),
            ));
        }
        self.positive_or(key, class_default)
    }

    fn f64_opt(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| Error::field(self.file, &self.path(key), format!("expected a number, found {v}"))),
        }
    }

    /// A norm epsilon: finite and > 0 (≤ 0 makes `rsqrt(mean(x²) + eps)` NaN or ±Inf for small
    /// activations, and the model emits garbage from the first layer on).
    fn eps_or(&self, key: &str, default: f64) -> Result<f64> {
        let eps = self.f64_opt(key)?.unwrap_or(default);
        if !(eps.is_finite() && eps > 0.0) {
            return Err(Error::field(
                self.file,
                &self.path(key),
                format!("must be a small positive number (typically 1e-6), found {eps}"),
            ));
        }
        Ok(eps)
    }

    fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_bool()
                .map(Some)
                .ok_or_else(|| Error::field(self.file, &self.path(key), format!("expected true or false, found {v}"))),
        }
    }

    fn str_opt(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(Some)
                .ok_or_else(|| Error::field(self.file, &self.path(key), format!("expected a string, found {v}"))),
        }
    }

    fn ids_opt(&self, key: &str) -> Result<Vec<u32>> {
        match self.get(key) {
            None => Ok(vec![]),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_u64().map(|n| n as u32).ok_or_else(|| {
                        Error::field(self.file, &self.path(key), format!("expected token ids, found {v}"))
                    })
                })
                .collect(),
            Some(v) => v.as_u64().map(|n| vec![n as u32]).ok_or_else(|| {
                Error::field(self.file, &self.path(key), format!("expected a token id or a list of ids, found {v}"))
            }),
        }
    }
}

/// Class defaults of the Hugging Face configs (used only for absent fields).
struct Defaults {
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: Option<usize>,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    num_experts: usize,
    num_experts_per_tok: usize,
}

fn defaults(family: Family) -> Defaults {
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

fn family_of(model_type: &str) -> Option<(Family, bool)> {
    // (family, whether the LM fields are nested under text_config)
    match model_type {
        "qwen3_5" => Some((Family::Qwen35, true)),
        "qwen3_5_text" => Some((Family::Qwen35, false)),
        "qwen3_5_moe" => Some((Family::Qwen35Moe, true)),
        "qwen3_5_moe_text" => Some((Family::Qwen35Moe, false)),
        "qwen3_next" => Some((Family::Qwen3Next, false)),
        _ => None,
    }
}

impl ModelConfig {
    /// Parses the text of a `config.json`. `file` names it in error messages.
    pub fn from_json_str(text: &str, file: &str) -> Result<Self> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| Error::Json { file: file.to_string(), message: e.to_string() })?;
        Self::from_json(&root, file)
    }

    pub fn from_json(root: &Value, file: &str) -> Result<Self> {
        let top = root.as_object().ok_or_else(|| Error::Json {
            file: file.to_string(),
            message: "the top level is not a JSON object".into(),
        })?;
        let top_fields = Fields { file, prefix: "", obj: top };
        let model_type = top_fields
            .str_opt("model_type")?
            .ok_or_else(|| Error::field(file, "model_type", "missing (cannot tell which architecture this is)"))?
            .to_string();
        let (family, nested) = family_of(&model_type)
            .ok_or_else(|| Error::UnknownModelType { file: file.to_string(), found: model_type.clone() })?;

        let text_obj = if nested {
            match top.get("text_config") {
                Some(Value::Object(o)) => o,
                Some(v) => return Err(Error::field(file, "text_config", format!("expected an object, found {v}"))),
                None => {
                    return Err(Error::field(
                        file,
                        "text_config",
                        format!("missing: a `{model_type}` config keeps the language-model fields under text_config"),
                    ));
                }
            }
        } else {
            top
        };
        let f = Fields { file, prefix: if nested { "text_config." } else { "" }, obj: text_obj };
        let text_model_type = if nested {
            let t = f.str_opt("model_type")?.unwrap_or(match family {
                Family::Qwen35Moe => "qwen3_5_moe_text",
                _ => "qwen3_5_text",
            });
            let expected = match family {
                Family::Qwen35Moe => "qwen3_5_moe_text",
                _ => "qwen3_5_text",
            };
            if t != expected {
                return Err(Error::field(
                    file,
                    "text_config.model_type",
                    format!("expected \"{expected}\" under a `{model_type}` config, found \"{t}\""),
                ));
            }
            t.to_string()
        } else {
            model_type.clone()
        };

        let d = defaults(family);
        let hidden_size = f.positive_required("hidden_size", d.hidden_size)?;
        let num_hidden_layers = f.positive_or("num_hidden_layers", d.num_hidden_layers)?;
        let num_attention_heads = f.positive_or("num_attention_heads", d.num_attention_heads)?;
        let num_key_value_heads = f.positive_or("num_key_value_heads", d.num_key_value_heads)?;
        if !num_attention_heads.is_multiple_of(num_key_value_heads) {
            return Err(Error::field(
                file,
                &f.path("num_key_value_heads"),
                format!("{num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"),
            ));
        }
        let head_dim = f.positive_or("head_dim", 256)?;
        let hidden_act = f.str_opt("hidden_act")?.unwrap_or("silu").to_string();
        if hidden_act != "silu" && hidden_act != "swish" {
            return Err(Error::field(
                file,
                &f.path("hidden_act"),
                format!("\"{hidden_act}\" is not supported (Qwen3.5/Qwen3-Next use \"silu\")"),
            ));
        }

        let linear = LinearAttnConfig {
            conv_kernel: f.positive_or("linear_conv_kernel_dim", 4)?,
            key_head_dim: f.positive_or("linear_key_head_dim", 128)?,
            value_head_dim: f.positive_or("linear_value_head_dim", 128)?,
            num_key_heads: f.positive_or("linear_num_key_heads", 16)?,
            num_value_heads: f.positive_or("linear_num_value_heads", 32)?,
        };
        if !linear.num_value_heads.is_multiple_of(linear.num_key_heads) {
            return Err(Error::field(
                file,
                &f.path("linear_num_value_heads"),
                format!(
                    "{} is not a multiple of linear_num_key_heads {}",
                    linear.num_value_heads, linear.num_key_heads
                ),
            ));
        }

        let layer_types = match f.get("layer_types") {
            Some(Value::Array(a)) => {
                if a.len() != num_hidden_layers {
                    return Err(Error::field(
                        file,
                        &f.path("layer_types"),
                        format!("has {} entries, expected num_hidden_layers = {num_hidden_layers}", a.len()),
                    ));
                }
                a.iter()
                    .enumerate()
                    .map(|(i, v)| match v.as_str() {
                        Some("linear_attention") => Ok(LayerKind::LinearAttention),
                        Some("full_attention") => Ok(LayerKind::FullAttention),
                        _ => Err(Error::field(
                            file,
                            &format!("{}[{i}]", f.path("layer_types")),
                            format!("expected \"linear_attention\" or \"full_attention\", found {v}"),
                        )),
                    })
                    .collect::<Result<Vec<_>>>()?
            }
            Some(v) => return Err(Error::field(file, &f.path("layer_types"), format!("expected a list, found {v}"))),
            None => {
                let interval = f.positive_or("full_attention_interval", 4)?;
                (0..num_hidden_layers)
                    .map(
                        |i| if (i + 1) % interval == 0 { LayerKind::FullAttention } else { LayerKind::LinearAttention },
                    )
                    .collect()
            }
        };

        let moe = match family {
            Family::Qwen35 => None,
            Family::Qwen35Moe | Family::Qwen3Next => {
                let num_experts = f.usize_or("num_experts", d.num_experts)?;
                let top_k = f.usize_or("num_experts_per_tok", d.num_experts_per_tok)?;
                if num_experts > 0 && (top_k == 0 || top_k > num_experts) {
                    return Err(Error::field(
                        file,
                        &f.path("num_experts_per_tok"),
                        format!("{top_k} is not in 1..={num_experts} (num_experts)"),
                    ));
                }
                Some(MoeConfig {
                    num_experts,
                    num_experts_per_tok: top_k,
                    moe_intermediate_size: f.positive_or("moe_intermediate_size", 512)?,
                    shared_expert_intermediate_size: f.positive_or("shared_expert_intermediate_size", 512)?,
                    // The Qwen3.5-MoE router always renormalises; Qwen3-Next reads the flag.
                    norm_topk_prob: match family {
                        Family::Qwen3Next => f.bool_opt("norm_topk_prob")?.unwrap_or(true),
                        _ => true,
                    },
                })
            }
        };

        let mlp_kinds = match family {
            Family::Qwen35 => vec![MlpKind::Dense; num_hidden_layers],
            Family::Qwen35Moe => vec![MlpKind::Moe; num_hidden_layers],
            Family::Qwen3Next => {
                let step = f.positive_or("decoder_sparse_step", 1)?;
                let only: Vec<usize> = match f.get("mlp_only_layers") {
                    None => vec![],
                    Some(Value::Array(a)) => a
                        .iter()
                        .map(|v| {
                            v.as_u64().map(|n| n as usize).ok_or_else(|| {
                                Error::field(
                                    file,
                                    &f.path("mlp_only_layers"),
                                    format!("expected layer indices, found {v}"),
                                )
                            })
                        })
                        .collect::<Result<_>>()?,
                    Some(v) => {
                        return Err(Error::field(
                            file,
                            &f.path("mlp_only_layers"),
                            format!("expected a list, found {v}"),
                        ));
                    }
                };
                let experts = moe.as_ref().map(|m| m.num_experts).unwrap_or(0);
                (0..num_hidden_layers)
                    .map(|i| {
                        if !only.contains(&i) && experts > 0 && (i + 1) % step == 0 {
                            MlpKind::Moe
                        } else {
                            MlpKind::Dense
                        }
                    })
                    .collect()
            }
        };
        let needs_dense = mlp_kinds.contains(&MlpKind::Dense);
        let intermediate_size = match (f.usize_opt("intermediate_size")?, d.intermediate_size) {
            (Some(0), _) if needs_dense => {
                return Err(Error::field(file, &f.path("intermediate_size"), "must be greater than 0"));
            }
            (Some(n), _) => Some(n),
            (None, dflt) => dflt,
        };
        if needs_dense && intermediate_size.is_none() {
            return Err(Error::field(file, &f.path("intermediate_size"), "missing, and some layers use a dense MLP"));
        }

        let rope = rope_config(&f, head_dim)?;

        // Multimodal checkpoints tie through the top-level flag (what transformers reads for
        // the ForConditionalGeneration model); text-only ones through their own.
        let tie_word_embeddings = if nested {
            top_fields.bool_opt("tie_word_embeddings")?.unwrap_or(false)
        } else {
            f.bool_opt("tie_word_embeddings")?.unwrap_or(false)
        };
        let mut eos_token_ids = f.ids_opt("eos_token_id")?;
        if nested {
            for id in top_fields.ids_opt("eos_token_id")? {
                if !eos_token_ids.contains(&id) {
                    eos_token_ids.push(id);
                }
            }
        }
        let declared_dtype = f
            .str_opt("dtype")?
            .or(f.str_opt("torch_dtype")?)
            .or(top_fields.str_opt("dtype")?)
            .or(top_fields.str_opt("torch_dtype")?)
            .map(str::to_string);

        let architectures = top
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            .unwrap_or_default();

        let cfg = ModelConfig {
            model_type,
            text_model_type,
            family,
            nested,
            architectures,
            vocab_size: f.positive_required("vocab_size", d.vocab_size)?,
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            intermediate_size,
            hidden_act,
            max_position_embeddings: f.positive_or("max_position_embeddings", 32768)?,
            rms_norm_eps: f.eps_or("rms_norm_eps", 1e-6)?,
            tie_word_embeddings,
            attention_bias: f.bool_opt("attention_bias")?.unwrap_or(false),
            attn_output_gate: f.bool_opt("attn_output_gate")?.unwrap_or(true),
            linear,
            layer_types,
            mlp_kinds,
            rope,
            moe,
            mtp_num_hidden_layers: f.usize_or("mtp_num_hidden_layers", 0)?,
            declared_dtype,
            mamba_ssm_dtype: f.str_opt("mamba_ssm_dtype")?.map(str::to_string),
            eos_token_ids,
        };
        // An EOS id past the vocabulary can never be produced: generation would never stop.
        if let Some(id) = cfg.eos_token_ids.iter().find(|&&id| id as usize >= cfg.vocab_size) {
            return Err(Error::field(
                file,
                &f.path("eos_token_id"),
                format!("{id} is out of the vocabulary (vocab_size {}: ids 0..{})", cfg.vocab_size, cfg.vocab_size - 1),
            ));
        }
        if cfg.attention_bias {
            return Err(Error::Unsupported {
                file: file.to_string(),
                message: format!(
                    "{}: attention_bias = true is not supported (no Qwen3.5/Qwen3-Next checkpoint uses it)",
                    f.path("attention_bias")
                ),
            });
        }
        if !cfg.attn_output_gate {
            return Err(Error::Unsupported {
                file: file.to_string(),
                message: format!(
                    "{}: attn_output_gate = false is not supported (transformers always gates)",
                    f.path("attn_output_gate")
                ),
            });
        }
        Ok(cfg)
    }

    pub fn num_linear_layers(&self) -> usize {
        self.layer_types.iter().filter(|k| **k == LayerKind::LinearAttention).count()
    }

    pub fn num_full_layers(&self) -> usize {
        self.layer_types.len() - self.num_linear_layers()
    }

    /// Query heads per KV head in the full-attention layers.
    pub fn gqa_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }
}

fn rope_config(f: &Fields, head_dim: usize) -> Result<RopeConfig> {
    // transformers' priority: the `rope_parameters` (or legacy `rope_scaling`) dict, then the
    // flat field, then the default (theta 10000, partial_rotary_factor 0.25 for these models).
    let (dict_key, dict) = match (f.get("rope_parameters"), f.get("rope_scaling")) {
        (Some(Value::Object(o)), _) => ("rope_parameters", Some(o)),
        (_, Some(Value::Object(o))) => ("rope_scaling", Some(o)),
        (Some(v), _) => {
            return Err(Error::field(f.file, &f.path("rope_parameters"), format!("expected an object, found {v}")));
        }
        _ => ("rope_parameters", None),
    };
    let inner_prefix = format!("{}{}.", f.prefix, dict_key);
    let inner = dict.map(|o| Fields { file: f.file, prefix: &inner_prefix, obj: o });
    let from_dict_f64 =
        |k: &str| -> Result<Option<f64>> { inner.as_ref().map(|i| i.f64_opt(k)).transpose().map(Option::flatten) };
    let theta = match from_dict_f64("rope_theta")? {
        Some(t) => t,
        None => f.f64_opt("rope_theta")?.unwrap_or(10_000.0),
    };
    let partial_rotary_factor = match from_dict_f64("partial_rotary_factor")? {
        Some(p) => p,
        None => f.f64_opt("partial_rotary_factor")?.unwrap_or(0.25),
    };
    if !(partial_rotary_factor > 0.0 && partial_rotary_factor <= 1.0) {
        return Err(Error::field(
            f.file,
            &f.path("partial_rotary_factor"),
            format!("{partial_rotary_factor} is not in (0, 1]"),
        ));
    }
    let rope_type = match &inner {
        Some(i) => i.str_opt("rope_type")?.or(i.str_opt("type")?).unwrap_or("default").to_string(),
        None => "default".to_string(),
    };
    if rope_type != "default" {
        return Err(Error::Unsupported {
            file: f.file.to_string(),
            message: format!(
                "{inner_prefix}rope_type: \"{rope_type}\" is not supported yet (only \"default\"; YaRN is only needed beyond 262,144 tokens)"
            ),
        });
    }
    let rotary_dim = (head_dim as f64 * partial_rotary_factor) as usize;
    if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) {
        return Err(Error::field(
            f.file,
            &f.path("partial_rotary_factor"),
            format!("gives a rotary dimension of {rotary_dim} for head_dim {head_dim}; it must be even and positive"),
        ));
    }
    let mrope_section = match inner.as_ref().and_then(|i| i.get("mrope_section")) {
        Some(Value::Array(a)) => Some(a.iter().filter_map(Value::as_u64).map(|n| n as usize).collect()),
        _ => None,
    };
    let mrope_interleaved = match &inner {
        Some(i) => i.bool_opt("mrope_interleaved")?.unwrap_or(false),
        None => false,
    };
    Ok(RopeConfig { rope_type, theta, partial_rotary_factor, rotary_dim, mrope_section, mrope_interleaved })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: serde_json::Value) -> Result<ModelConfig> {
        ModelConfig::from_json(&v, "config.json")
    }

    #[test]
    fn file_values_win_over_class_defaults() {
        // The llama.cpp converter pitfall: linear_num_value_heads must come from the file.
        let c = parse(serde_json::json!({"model_type": "qwen3_5_text", "linear_num_value_heads": 48, "linear_num_key_heads": 16, "num_hidden_layers": 8, "hidden_size": 4096, "vocab_size": 248320})).unwrap();
        assert_eq!(c.linear.num_value_heads, 48);
        assert_eq!(c.linear.head_ratio(), 3);
        // Absent fields take the class defaults.
        assert_eq!(c.rope.theta, 10_000.0);
        assert_eq!(c.rope.rotary_dim, 64);
        assert_eq!(
            c.layer_types,
            vec![
                LayerKind::LinearAttention,
                LayerKind::LinearAttention,
                LayerKind::LinearAttention,
                LayerKind::FullAttention,
                LayerKind::LinearAttention,
                LayerKind::LinearAttention,
                LayerKind::LinearAttention,
                LayerKind::FullAttention
            ]
        );
    }

    #[test]
    fn nested_text_config_and_top_level_tie() {
        let c = parse(serde_json::json!({
            "model_type": "qwen3_5", "tie_word_embeddings": true,
            "text_config": {"model_type": "qwen3_5_text", "hidden_size": 64, "vocab_size": 1000, "tie_word_embeddings": false,
                            "rope_parameters": {"rope_theta": 1e7, "partial_rotary_factor": 0.5}}
        }))
        .unwrap();
        assert!(c.nested);
        assert_eq!(c.hidden_size, 64);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.rope.theta, 1e7);
        assert_eq!(c.rope.rotary_dim, 128);
    }

    #[test]
    fn qwen3_next_moe_plan_and_flat_rope() {
        let c = parse(serde_json::json!({
            "model_type": "qwen3_next", "num_hidden_layers": 4, "mlp_only_layers": [2], "hidden_size": 2048, "vocab_size": 151936,
            "rope_theta": 5e6, "partial_rotary_factor": 0.5, "rope_scaling": null, "num_experts": 8, "num_experts_per_tok": 2
        }))
        .unwrap();
        assert_eq!(c.mlp_kinds, vec![MlpKind::Moe, MlpKind::Moe, MlpKind::Dense, MlpKind::Moe]);
        assert_eq!(c.rope.theta, 5e6);
        assert_eq!(c.rope.rotary_dim, 128);
        assert!(c.moe.as_ref().unwrap().norm_topk_prob);
    }

    #[test]
    fn text_only_moe_variant() {
        let c = parse(serde_json::json!({"model_type": "qwen3_5_moe_text", "num_hidden_layers": 4, "hidden_size": 2048, "vocab_size": 248320})).unwrap();
        assert_eq!(c.family, Family::Qwen35Moe);
        assert!(!c.nested);
        assert_eq!(c.mlp_kinds, vec![MlpKind::Moe; 4]);
        let m = c.moe.unwrap();
        assert_eq!((m.num_experts, m.num_experts_per_tok), (256, 8));
        assert!(m.norm_topk_prob);
        assert_eq!(c.intermediate_size, None);
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse(serde_json::json!({"model_type": "llama"})).unwrap_err().to_string();
        assert!(e.contains("unknown model_type \"llama\""), "{e}");
        let e = parse(serde_json::json!({"model_type": "qwen3_5"})).unwrap_err().to_string();
        assert!(e.contains("text_config"), "{e}");
        let e = parse(serde_json::json!({"model_type": "qwen3_5_text", "hidden_size": "big"})).unwrap_err().to_string();
        assert!(e.contains("`hidden_size`") && e.contains("\"big\""), "{e}");
        // Sizes every checkpoint sets are required: a class default would contradict the weights.
        let e = parse(serde_json::json!({"model_type": "qwen3_5_text", "vocab_size": 1000})).unwrap_err().to_string();
        assert!(e.contains("`hidden_size`: missing"), "{e}");
        let e = parse(serde_json::json!({"model_type": "qwen3_5", "text_config": {"hidden_size": 64}}))
            .unwrap_err()
            .to_string();
        assert!(e.contains("`text_config.vocab_size`: missing"), "{e}");
        let e = parse(serde_json::json!({"model_type": "qwen3_5", "text_config": {"hidden_size": 64, "vocab_size": 1000, "num_attention_heads": 6, "num_key_value_heads": 4}})).unwrap_err().to_string();
        assert!(e.contains("text_config.num_key_value_heads"), "{e}");
        let e = parse(serde_json::json!({"model_type": "qwen3_5_text", "hidden_size": 64, "vocab_size": 1000, "num_hidden_layers": 2, "layer_types": ["linear_attention"]})).unwrap_err().to_string();
        assert!(e.contains("layer_types") && e.contains("has 1 entries"), "{e}");
        let e = parse(
            serde_json::json!({"model_type": "qwen3_5_text", "hidden_size": 64, "vocab_size": 1000, "rope_parameters": {"rope_type": "yarn", "factor": 4.0}}),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("yarn"), "{e}");
    }
}
