//! Every supported `config.json` variant, read into one [`ModelConfig`] and a per-layer plan:
//! the file as written (`raw.rs`: `#[derive(Deserialize)]` structs and the class defaults per
//! family), the checks that make it a [`ModelConfig`] (`check.rs`, every error naming the
//! field's path), and the rotary embedding's settings (`rope.rs`).
//!
//! A value present in the file always wins; the Hugging Face class defaults apply only to fields
//! that are absent (or `null`). transformers' `AutoConfig` would silently substitute class
//! defaults in some paths (a llama.cpp converter bug came from exactly that), so we never go
//! through an intermediate "config class" that has defaults of its own.

mod check;
mod checker;
pub(crate) mod keys;
mod quant;
pub(crate) mod raw;
mod rope;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::checkpoint::ModelSource;
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
    /// `quantization_config` of an FP8 checkpoint (`None`: not quantised).
    pub quantization: Option<crate::model::fp8::Fp8Format>,
    /// `mamba_ssm_dtype` (the recurrent-state dtype servers use), if any.
    pub mamba_ssm_dtype: Option<String>,
    /// EOS ids named in config.json (generation_config.json and the tokenizer add to these).
    pub eos_token_ids: Vec<u32>,
    /// Keys deltascope does not know (ignored, and reported: `keys.rs`).
    pub unknown_keys: Vec<keys::UnknownKey>,
}

impl ModelConfig {
    /// Parses the text of a `config.json`. `file` names it in error messages.
    pub fn from_json_str(text: &str, file: &str) -> Result<Self> {
        let root: Value =
            serde_json::from_str(text).map_err(|e| Error::Json { file: file.to_string(), message: e.to_string() })?;
        Self::from_json(&root, file)
    }

    pub fn from_json(root: &Value, file: &str) -> Result<Self> {
        let json = |message: String| Error::Json { file: file.to_string(), message };
        if !root.is_object() {
            return Err(json("the top level is not a JSON object".into()));
        }
        let raw = raw::RawConfig::deserialize(root).map_err(|e| json(e.to_string()))?;
        check::check(&raw, file)
    }

    /// One line per unknown key (`file` names the config in them).
    pub fn unknown_key_warnings(&self, file: &str) -> Vec<String> {
        self.unknown_keys.iter().map(|k| k.warning(file)).collect()
    }

    /// `--strict-config`: an unknown key is an error, not a warning.
    pub fn refuse_unknown_keys(&self, file: &str) -> Result<()> {
        match self.unknown_keys.first() {
            None => Ok(()),
            Some(k) => Err(Error::Unsupported {
                file: file.to_string(),
                message: format!(
                    "unknown key `{}` = {} refused by --strict-config ({} unknown key{} in all)",
                    k.path,
                    k.value,
                    self.unknown_keys.len(),
                    if self.unknown_keys.len() == 1 { "" } else { "s" }
                ),
            }),
        }
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

/// Reads and parses the model's `config.json`.
pub fn read_config(source: &ModelSource) -> Result<ModelConfig> {
    source.check_dir()?;
    let text = source.read_string("config.json")?.ok_or_else(|| Error::MissingFile {
        dir: source.dir(),
        file: "config.json".into(),
        hint: "a Hugging Face model directory holds config.json, *.safetensors and tokenizer.json".into(),
    })?;
    ModelConfig::from_json_str(&text, &source.file_label("config.json"))
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

    /// A key deltascope does not know is kept and reported (with its path), never dropped in
    /// silence; keys known to change nothing it computes are not reported.
    #[test]
    fn unknown_keys_are_reported_with_their_path() {
        let c = parse(serde_json::json!({
            "model_type": "qwen3_5", "transformers_version": "5.3.0", "image_token_id": 1, "new_top": [1, 2],
            "text_config": {"model_type": "qwen3_5_text", "hidden_size": 64, "vocab_size": 1000,
                "initializer_range": 0.02, "use_cache": true, "attention_dropout": 0.0, "mtp_use_dedicated_embeddings": false,
                "layer_norm_type": "x", "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "beta_fast": 32}}
        }))
        .unwrap();
        let paths: Vec<&str> = c.unknown_keys.iter().map(|k| k.path.as_str()).collect();
        assert_eq!(paths, ["new_top", "text_config.layer_norm_type", "text_config.rope_parameters.beta_fast"]);
        let w = c.unknown_key_warnings("config.json");
        assert_eq!(
            w[1],
            "config.json: unknown key `text_config.layer_norm_type` = \"x\", ignored: if it changes the architecture, results will be wrong"
        );
        let e = c.refuse_unknown_keys("config.json").unwrap_err().to_string();
        assert!(e.contains("unknown key `new_top` = [1,2] refused by --strict-config (3 unknown keys in all)"), "{e}");
        // Every shipped and test config is fully known.
        for dir in [
            "models/demo",
            "tests/data/qwen3_5_0_8b",
            "tests/data/qwen3_6_27b",
            "tests/data/qwen3_8_27b",
            "tests/data/qwen3_6_35b_a3b",
            "tests/data/qwen3_next_80b_a3b",
            "tests/fixtures/qwen3_5_text",
            "tests/fixtures/qwen3_5_vl",
            "tests/fixtures/qwen3_5_moe",
            "tests/fixtures/qwen3_next",
        ] {
            let path =
                std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join(dir).join("config.json");
            let c = ModelConfig::from_json_str(&std::fs::read_to_string(&path).unwrap(), dir).unwrap();
            assert!(c.unknown_keys.is_empty(), "{dir}: {:?}", c.unknown_keys);
        }
    }

    /// A known key with a value deltascope does not compute is refused, naming key and value;
    /// Qwen3.8-Flash-Next (`qwen4_exp`) is refused naming what is missing.
    #[test]
    fn known_keys_with_unsupported_values_and_qwen4_exp_are_refused() {
        let base = || serde_json::json!({"model_type": "qwen3_5_text", "hidden_size": 64, "vocab_size": 1000});
        let mut v = base();
        v["output_gate_type"] = "sigmoid".into();
        let e = parse(v).unwrap_err().to_string();
        assert!(
            e.contains("output_gate_type = \"sigmoid\" is not supported (deltascope computes \"silu\" or \"swish\")"),
            "{e}"
        );
        for (key, value) in
            [("output_gate_type", serde_json::json!("swish")), ("use_sliding_window", serde_json::json!(false))]
        {
            let mut v = base();
            v[key] = value;
            assert!(parse(v).unwrap().unknown_keys.is_empty(), "{key}");
        }
        let mut v = base();
        v["mtp_use_dedicated_embeddings"] = true.into();
        assert!(
            parse(v).unwrap_err().to_string().contains("an MTP head with embeddings of its own is not implemented")
        );
        let e = parse(serde_json::json!({"model_type": "qwen4_exp", "hidden_size": 64})).unwrap_err().to_string();
        assert!(
            e.contains("model_type \"qwen4_exp\" is not supported")
                && e.contains("sparse attention, hyper-connections or n-gram embeddings"),
            "{e}"
        );
    }
}
