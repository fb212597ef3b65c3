//! The Hugging Face `config.json` a GGUF's metadata stands for (`qwen35.*`, `qwen35moe.*`,
//! `qwen3next.*`, as llama.cpp's converter writes them), so that the model is configured, and
//! checked, by the one `ModelConfig` reader every checkpoint goes through.

use serde_json::{Map, Value as Json, json};

use super::container::{Gguf, Value};

/// The architectures deltascope reads, with the Hugging Face `model_type` and class each
/// stands for.
pub(super) const ARCHITECTURES: [(&str, &str, &str); 3] = [
    ("qwen35", "qwen3_5_text", "Qwen3_5ForCausalLM"),
    ("qwen35moe", "qwen3_5_moe_text", "Qwen3_5MoeForCausalLM"),
    ("qwen3next", "qwen3_next", "Qwen3NextForCausalLM"),
];

/// Reads one architecture's keys (`<arch>.<key>`), each error naming the key.
struct Keys<'a> {
    g: &'a Gguf,
    arch: &'a str,
}

impl Keys<'_> {
    fn key(&self, key: &str) -> String {
        format!("{}.{key}", self.arch)
    }

    fn get(&self, key: &str) -> Option<&Value> {
        self.g.get(&self.key(key))
    }

    fn uint(&self, key: &str) -> Result<Option<u64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .map(Some)
                .ok_or_else(|| format!("metadata `{}` is {v:?}, expected a non-negative whole number", self.key(key))),
        }
    }

    fn required(&self, key: &str) -> Result<u64, String> {
        self.uint(key)?.ok_or_else(|| format!("metadata `{}` is missing (llama.cpp requires it too)", self.key(key)))
    }

    fn float(&self, key: &str) -> Result<Option<f64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_f64().map(Some).ok_or_else(|| format!("metadata `{}` is {v:?}, expected a number", self.key(key)))
            }
        }
    }
}

/// The architecture a GGUF declares, checked against the ones deltascope reads.
pub(super) fn architecture(g: &Gguf) -> Result<&'static (&'static str, &'static str, &'static str), String> {
    let arch = g
        .get("general.architecture")
        .ok_or("metadata `general.architecture` is missing")?
        .as_str()
        .ok_or("metadata `general.architecture` is not a string")?;
    let known = ARCHITECTURES.iter().map(|a| a.0).collect::<Vec<_>>().join(", ");
    ARCHITECTURES.iter().find(|a| a.0 == arch).ok_or_else(|| {
        let why = if arch == "qwen4exp" { " (llama.cpp's post-#27742 layout, not read yet)" } else { "" };
        format!("architecture `{arch}`{why} is not one deltascope runs; it reads {known}")
    })
}

/// `config.json` for the model the GGUF holds. `vocab_rows` is the embedding's row count and
/// `has_output` whether the file carries its own LM head (`output.weight`).
pub(super) fn hf_config(g: &Gguf, vocab_rows: u64, has_output: bool) -> Result<Json, String> {
    let &(arch, model_type, class) = architecture(g)?;
    let k = Keys { g, arch };
    let blocks = k.required("block_count")?;
    let nextn = k.uint("nextn_predict_layers")?.unwrap_or(0);
    let layers = blocks.checked_sub(nextn).filter(|&n| n > 0).ok_or_else(|| {
        format!(
            "metadata `{arch}.block_count` is {blocks} but `{arch}.nextn_predict_layers` is {nextn}: no layers left"
        )
    })?;
    let head_dim = k.required("attention.key_length")?;
    let value_heads = k.required("ssm.time_step_rank")?;
    let inner = k.required("ssm.inner_size")?;
    if value_heads == 0 || !inner.is_multiple_of(value_heads) {
        return Err(format!(
            "metadata `{arch}.ssm.inner_size` ({inner}) is not a multiple of `{arch}.ssm.time_step_rank` ({value_heads}, the value heads)"
        ));
    }
    let mut c = Map::new();
    c.insert("model_type".into(), json!(model_type));
    c.insert("architectures".into(), json!([class]));
    c.insert("vocab_size".into(), json!(vocab_rows));
    c.insert("hidden_size".into(), json!(k.required("embedding_length")?));
    c.insert("num_hidden_layers".into(), json!(layers));
    c.insert("num_attention_heads".into(), json!(k.required("attention.head_count")?));
    c.insert("num_key_value_heads".into(), json!(k.required("attention.head_count_kv")?));
    c.insert("head_dim".into(), json!(head_dim));
    c.insert("linear_conv_kernel_dim".into(), json!(k.required("ssm.conv_kernel")?));
    c.insert("linear_key_head_dim".into(), json!(k.required("ssm.state_size")?));
    c.insert("linear_num_key_heads".into(), json!(k.required("ssm.group_count")?));
    c.insert("linear_num_value_heads".into(), json!(value_heads));
    c.insert("linear_value_head_dim".into(), json!(inner / value_heads));
    c.insert("hidden_act".into(), json!("silu"));
    c.insert("attention_bias".into(), json!(false));
    c.insert("attn_output_gate".into(), json!(true));
    c.insert("tie_word_embeddings".into(), json!(!has_output));
    // The weights are dequantised to f32 values: `--dtype auto` runs them exactly.
    c.insert("dtype".into(), json!("float32"));
    c.insert("mamba_ssm_dtype".into(), json!("float32"));
    c.insert("mtp_num_hidden_layers".into(), json!(nextn));
    if let Some(eps) = k.float("attention.layer_norm_rms_epsilon")? {
        // Stored as f32: printed as the shortest decimal of that f32, which reads back to it.
        c.insert("rms_norm_eps".into(), json!((eps as f32).to_string().parse::<f64>().unwrap_or(eps)));
    }
    if let Some(n) = k.uint("context_length")? {
        c.insert("max_position_embeddings".into(), json!(n));
    }
    if let Some(n) = k.uint("feed_forward_length")?.filter(|&n| n > 0) {
        c.insert("intermediate_size".into(), json!(n));
    }
    if let Some(n) = k.uint("full_attention_interval")? {
        c.insert("full_attention_interval".into(), json!(n));
    }
    if let Some(types) = layer_types(&k, layers)? {
        c.insert("layer_types".into(), json!(types));
    }
    if let Some(id) = g.get("tokenizer.ggml.eos_token_id").and_then(Value::as_u64) {
        c.insert("eos_token_id".into(), json!(id));
    }
    for (key, field) in [
        ("expert_count", "num_experts"),
        ("expert_used_count", "num_experts_per_tok"),
        ("expert_feed_forward_length", "moe_intermediate_size"),
        ("expert_shared_feed_forward_length", "shared_expert_intermediate_size"),
    ] {
        if let Some(n) = k.uint(key)? {
            c.insert(field.into(), json!(n));
        }
    }
    if let Some(Value::Bool(b)) = k.get("expert_weights_norm") {
        c.insert("norm_topk_prob".into(), json!(b));
    }
    rope(&k, head_dim, &mut c)?;
    Ok(Json::Object(c))
}

/// `layer_types` from `<arch>.attention.recurrent_layers` (one flag per block, the MTP block's
/// last), when the file has it; otherwise `full_attention_interval` decides.
fn layer_types(k: &Keys, layers: u64) -> Result<Option<Vec<&'static str>>, String> {
    let Some(v) = k.get("attention.recurrent_layers") else { return Ok(None) };
    let key = k.key("attention.recurrent_layers");
    let flags = v.as_array().ok_or_else(|| format!("metadata `{key}` is {v:?}, expected an array of booleans"))?;
    if (flags.len() as u64) < layers {
        return Err(format!(
            "metadata `{key}` has {} entries, expected at least {layers} (one per layer)",
            flags.len()
        ));
    }
    flags[..layers as usize]
        .iter()
        .enumerate()
        .map(|(i, f)| match f {
            Value::Bool(true) => Ok("linear_attention"),
            Value::Bool(false) => Ok("full_attention"),
            other => Err(format!("metadata `{key}` entry {i} is {other:?}, expected a boolean")),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The rotary embedding: `rope.dimension_count` rotated dimensions of `key_length`, base
/// `rope.freq_base`, and (Qwen3.5) the interleaved M-RoPE sections.
fn rope(k: &Keys, head_dim: u64, c: &mut Map<String, Json>) -> Result<(), String> {
    let rotary = k.uint("rope.dimension_count")?.unwrap_or(head_dim / 4);
    if rotary == 0 || rotary > head_dim || head_dim == 0 {
        return Err(format!(
            "metadata `{}` is {rotary}, expected 1..={head_dim} (`{}`)",
            k.key("rope.dimension_count"),
            k.key("attention.key_length")
        ));
    }
    let factor = rotary as f64 / head_dim as f64;
    let theta = k.float("rope.freq_base")?.unwrap_or(10_000.0);
    if k.arch == "qwen3next" {
        c.insert("rope_theta".into(), json!(theta));
        c.insert("partial_rotary_factor".into(), json!(factor));
        return Ok(());
    }
    let key = k.key("rope.dimension_sections");
    let sections = k.get("rope.dimension_sections").ok_or_else(|| format!("metadata `{key}` is missing"))?;
    let sections: Vec<u64> = sections
        .as_array()
        .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<_>>>())
        .ok_or_else(|| format!("metadata `{key}` is {sections:?}, expected an array of whole numbers"))?;
    // llama.cpp stores four sections, the fourth 0 for text; transformers lists three.
    let three: Vec<u64> = sections.iter().copied().take(3).collect();
    c.insert(
        "rope_parameters".into(),
        json!({
            "rope_type": "default",
            "rope_theta": theta,
            "partial_rotary_factor": factor,
            "mrope_section": three,
            "mrope_interleaved": true,
        }),
    );
    Ok(())
}
