//! The checks that turn a [`RawConfig`] into a [`ModelConfig`]: class defaults for absent
//! fields, ranges, and the relations between fields. Every error names the file and the field's
//! path (`text_config.linear_num_value_heads`), and what was expected against what was found.

use super::checker::{Checker, at};
use super::raw::{Defaults, Field, RawConfig, RawTextConfig, family_of};
use super::rope::rope_config;
use super::{Family, LayerKind, LinearAttnConfig, MlpKind, ModelConfig, MoeConfig};
use crate::error::{Error, Result};

/// The file's values, checked, with the class defaults for what it leaves out.
pub(super) fn check(raw: &RawConfig, file: &str) -> Result<ModelConfig> {
    let top = Checker { file, prefix: String::new() };
    let model_type = top
        .str_opt(at!(raw.model_type))?
        .ok_or_else(|| Error::field(file, "model_type", "missing (cannot tell which architecture this is)"))?
        .to_string();
    if let Some(missing) = super::keys::known_unsupported(&model_type) {
        return Err(Error::Unsupported {
            file: file.to_string(),
            message: format!("model_type \"{model_type}\" is not supported ({missing})"),
        });
    }
    let (family, nested) = family_of(&model_type)
        .ok_or_else(|| Error::UnknownModelType { file: file.to_string(), found: model_type.clone() })?;
    let t = if nested { text_config(raw, file, &model_type)? } else { &raw.lm };
    let f = Checker { file, prefix: if nested { "text_config." } else { "" }.to_string() };
    let text_model_type = if nested { nested_model_type(t, file, &model_type, family)? } else { model_type.clone() };

    let d = Defaults::of(family);
    let hidden_size = f.positive_required(at!(t.hidden_size), d.hidden_size)?;
    let num_hidden_layers = f.positive_or(at!(t.num_hidden_layers), d.num_hidden_layers)?;
    let num_attention_heads = f.positive_or(at!(t.num_attention_heads), d.num_attention_heads)?;
    let num_key_value_heads = f.positive_or(at!(t.num_key_value_heads), d.num_key_value_heads)?;
    if !num_attention_heads.is_multiple_of(num_key_value_heads) {
        return Err(f.error(
            "num_key_value_heads",
            format!("{num_key_value_heads} does not divide num_attention_heads {num_attention_heads}"),
        ));
    }
    let head_dim = f.positive_or(at!(t.head_dim), 256)?;
    let hidden_act = f.str_opt(at!(t.hidden_act))?.unwrap_or("silu").to_string();
    if hidden_act != "silu" && hidden_act != "swish" {
        return Err(
            f.error("hidden_act", format!("\"{hidden_act}\" is not supported (Qwen3.5/Qwen3-Next use \"silu\")"))
        );
    }
    let linear = linear_attn(&f, t)?;
    let layer_types = layer_types(&f, t, num_hidden_layers)?;
    let moe = moe(&f, t, family, &d)?;
    let mlp_kinds = mlp_kinds(&f, t, family, num_hidden_layers, moe.as_ref())?;
    let intermediate_size = intermediate_size(&f, t, &d, &mlp_kinds)?;
    let rope = rope_config(&f, t, head_dim)?;

    // Multimodal checkpoints tie through the top-level flag (what transformers reads for
    // the ForConditionalGeneration model); text-only ones through their own.
    let lm = &raw.lm;
    let tie_word_embeddings = if nested {
        top.bool_opt(at!(lm.tie_word_embeddings))?.unwrap_or(false)
    } else {
        f.bool_opt(at!(t.tie_word_embeddings))?.unwrap_or(false)
    };
    let mut eos_token_ids = f.ids_opt(at!(t.eos_token_id))?;
    if nested {
        for id in top.ids_opt(at!(lm.eos_token_id))? {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
    }
    let declared_dtype = f
        .str_opt(at!(t.dtype))?
        .or(f.str_opt(at!(t.torch_dtype))?)
        .or(top.str_opt(at!(lm.dtype))?)
        .or(top.str_opt(at!(lm.torch_dtype))?)
        .map(str::to_string);
    // At the top level (every FP8 release seen) or under text_config.
    let quantization = match (&t.quantization_config, nested) {
        (Some(q), true) => super::quant::fp8_format(Some(q), "text_config.quantization_config", file)?,
        _ => super::quant::fp8_format(raw.lm.quantization_config.as_ref(), "quantization_config", file)?,
    };
    let architectures = match &raw.architectures {
        Field::Given(list) => list.iter().filter_map(|a| a.element().ok().cloned()).collect(),
        _ => vec![],
    };

    let mut unknown_keys = super::keys::unknown_keys(&top, "", &raw.lm.rest)?;
    if nested {
        unknown_keys.extend(super::keys::unknown_keys(&f, "text_config.", &t.rest)?);
    }
    for (name, rope) in [("rope_parameters", &t.rope_parameters), ("rope_scaling", &t.rope_scaling)] {
        if let Field::Given(r) = rope {
            unknown_keys.extend(super::keys::unknown_keys(&f, &format!("{}{name}.", f.prefix), &r.0.rest)?);
        }
    }

    let cfg = ModelConfig {
        unknown_keys,
        model_type,
        text_model_type,
        family,
        nested,
        architectures,
        vocab_size: f.positive_required(at!(t.vocab_size), d.vocab_size)?,
        hidden_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        intermediate_size,
        hidden_act,
        max_position_embeddings: f.positive_or(at!(t.max_position_embeddings), 32768)?,
        rms_norm_eps: f.eps_or(at!(t.rms_norm_eps), 1e-6)?,
        tie_word_embeddings,
        attention_bias: f.bool_opt(at!(t.attention_bias))?.unwrap_or(false),
        attn_output_gate: f.bool_opt(at!(t.attn_output_gate))?.unwrap_or(true),
        linear,
        layer_types,
        mlp_kinds,
        rope,
        moe,
        mtp_num_hidden_layers: f.usize_or(at!(t.mtp_num_hidden_layers), 0)?,
        declared_dtype,
        quantization,
        mamba_ssm_dtype: f.str_opt(at!(t.mamba_ssm_dtype))?.map(str::to_string),
        eos_token_ids,
    };
    supported(&cfg, &f)?;
    Ok(cfg)
}

/// The `text_config` object a nested (multimodal) config must have.
fn text_config<'r>(raw: &'r RawConfig, file: &str, model_type: &str) -> Result<&'r RawTextConfig> {
    match &raw.text_config {
        Field::Given(o) => Ok(&o.0),
        Field::Other(v) => Err(Error::field(file, "text_config", format!("expected an object, found {v}"))),
        Field::Absent => Err(Error::field(
            file,
            "text_config",
            format!("missing: a `{model_type}` config keeps the language-model fields under text_config"),
        )),
    }
}

/// `text_config.model_type`, which must be the text model of the top-level `model_type`.
fn nested_model_type(t: &RawTextConfig, file: &str, model_type: &str, family: Family) -> Result<String> {
    let f = Checker { file, prefix: "text_config.".into() };
    let expected = match family {
        Family::Qwen35Moe => "qwen3_5_moe_text",
        _ => "qwen3_5_text",
    };
    let found = f.str_opt(at!(t.model_type))?.unwrap_or(expected);
    if found != expected {
        return Err(Error::field(
            file,
            "text_config.model_type",
            format!("expected \"{expected}\" under a `{model_type}` config, found \"{found}\""),
        ));
    }
    Ok(found.to_string())
}

fn linear_attn(f: &Checker, t: &RawTextConfig) -> Result<LinearAttnConfig> {
    let linear = LinearAttnConfig {
        conv_kernel: f.positive_or(at!(t.linear_conv_kernel_dim), 4)?,
        key_head_dim: f.positive_or(at!(t.linear_key_head_dim), 128)?,
        value_head_dim: f.positive_or(at!(t.linear_value_head_dim), 128)?,
        num_key_heads: f.positive_or(at!(t.linear_num_key_heads), 16)?,
        num_value_heads: f.positive_or(at!(t.linear_num_value_heads), 32)?,
    };
    if !linear.num_value_heads.is_multiple_of(linear.num_key_heads) {
        return Err(f.error(
            "linear_num_value_heads",
            format!("{} is not a multiple of linear_num_key_heads {}", linear.num_value_heads, linear.num_key_heads),
        ));
    }
    Ok(linear)
}

/// `layer_types`, or every `full_attention_interval`-th layer full attention.
fn layer_types(f: &Checker, t: &RawTextConfig, layers: usize) -> Result<Vec<LayerKind>> {
    match t.layer_types.present() {
        Some(Ok(list)) => {
            if list.len() != layers {
                return Err(f.error(
                    "layer_types",
                    format!("has {} entries, expected num_hidden_layers = {layers}", list.len()),
                ));
            }
            list.iter()
                .enumerate()
                .map(|(i, kind)| match kind.element() {
                    Ok(s) if s == "linear_attention" => Ok(LayerKind::LinearAttention),
                    Ok(s) if s == "full_attention" => Ok(LayerKind::FullAttention),
                    found => {
                        let v = found.map_or_else(|v| v, |s| serde_json::Value::String(s.clone()));
                        Err(f.error(
                            &format!("layer_types[{i}]"),
                            format!("expected \"linear_attention\" or \"full_attention\", found {v}"),
                        ))
                    }
                })
                .collect()
        }
        Some(Err(v)) => Err(f.error("layer_types", format!("expected a list, found {v}"))),
        None => {
            let interval = f.positive_or(at!(t.full_attention_interval), 4)?;
            Ok((0..layers)
                .map(|i| if (i + 1) % interval == 0 { LayerKind::FullAttention } else { LayerKind::LinearAttention })
                .collect())
        }
    }
}

fn moe(f: &Checker, t: &RawTextConfig, family: Family, d: &Defaults) -> Result<Option<MoeConfig>> {
    if family == Family::Qwen35 {
        return Ok(None);
    }
    let num_experts = f.usize_or(at!(t.num_experts), d.num_experts)?;
    let top_k = f.usize_or(at!(t.num_experts_per_tok), d.num_experts_per_tok)?;
    if num_experts > 0 && (top_k == 0 || top_k > num_experts) {
        return Err(f.error("num_experts_per_tok", format!("{top_k} is not in 1..={num_experts} (num_experts)")));
    }
    Ok(Some(MoeConfig {
        num_experts,
        num_experts_per_tok: top_k,
        moe_intermediate_size: f.positive_or(at!(t.moe_intermediate_size), 512)?,
        shared_expert_intermediate_size: f.positive_or(at!(t.shared_expert_intermediate_size), 512)?,
        // The Qwen3.5-MoE router always renormalises; Qwen3-Next reads the flag.
        norm_topk_prob: match family {
            Family::Qwen3Next => f.bool_opt(at!(t.norm_topk_prob))?.unwrap_or(true),
            _ => true,
        },
    }))
}

/// The feed-forward kind of each layer: Qwen3-Next's sparse step and dense-only layers.
fn mlp_kinds(
    f: &Checker,
    t: &RawTextConfig,
    family: Family,
    layers: usize,
    moe: Option<&MoeConfig>,
) -> Result<Vec<MlpKind>> {
    match family {
        Family::Qwen35 => return Ok(vec![MlpKind::Dense; layers]),
        Family::Qwen35Moe => return Ok(vec![MlpKind::Moe; layers]),
        Family::Qwen3Next => {}
    }
    let step = f.positive_or(at!(t.decoder_sparse_step), 1)?;
    let only: Vec<usize> = match t.mlp_only_layers.present() {
        None => vec![],
        Some(Ok(list)) => list
            .iter()
            .map(|i| {
                i.element()
                    .copied()
                    .map_err(|v| f.error("mlp_only_layers", format!("expected layer indices, found {v}")))
            })
            .collect::<Result<_>>()?,
        Some(Err(v)) => return Err(f.error("mlp_only_layers", format!("expected a list, found {v}"))),
    };
    let experts = moe.map(|m| m.num_experts).unwrap_or(0);
    Ok((0..layers)
        .map(|i| if !only.contains(&i) && experts > 0 && (i + 1) % step == 0 { MlpKind::Moe } else { MlpKind::Dense })
        .collect())
}

/// The dense MLP width: required (and > 0) when some layer is dense.
fn intermediate_size(f: &Checker, t: &RawTextConfig, d: &Defaults, kinds: &[MlpKind]) -> Result<Option<usize>> {
    let needs_dense = kinds.contains(&MlpKind::Dense);
    let size = match (f.usize_opt(at!(t.intermediate_size))?, d.intermediate_size) {
        (Some(0), _) if needs_dense => return Err(f.error("intermediate_size", "must be greater than 0")),
        (Some(n), _) => Some(n),
        (None, dflt) => dflt,
    };
    if needs_dense && size.is_none() {
        return Err(f.error("intermediate_size", "missing, and some layers use a dense MLP"));
    }
    Ok(size)
}

/// What the engine does not run: an EOS id it can never produce, attention biases, an
/// ungated attention output.
fn supported(cfg: &ModelConfig, f: &Checker) -> Result<()> {
    // An EOS id past the vocabulary can never be produced: generation would never stop.
    if let Some(id) = cfg.eos_token_ids.iter().find(|&&id| id as usize >= cfg.vocab_size) {
        return Err(f.error(
            "eos_token_id",
            format!("{id} is out of the vocabulary (vocab_size {}: ids 0–{})", cfg.vocab_size, cfg.vocab_size - 1),
        ));
    }
    if cfg.attention_bias {
        return Err(Error::Unsupported {
            file: f.file.to_string(),
            message: format!(
                "{}: attention_bias = true is not supported (no Qwen3.5/Qwen3-Next checkpoint uses it)",
                f.path("attention_bias")
            ),
        });
    }
    if !cfg.attn_output_gate {
        return Err(Error::Unsupported {
            file: f.file.to_string(),
            message: format!(
                "{}: attn_output_gate = false is not supported (transformers always gates)",
                f.path("attn_output_gate")
            ),
        });
    }
    Ok(())
}
