//! The model's sizes: parameter counts and memory plans computed from the config alone (model-spec §8), so a user
//! can plan a deployment without downloading weights.

use serde::Serialize;

use super::config::{LayerKind, MlpKind, ModelConfig};

#[derive(Debug, Clone, Serialize)]
pub struct ParamCounts {
    pub embed: u64,
    pub lm_head: u64,
    /// Token-mixer parameters of one GDN layer.
    pub gdn_layer: u64,
    /// Token-mixer parameters of one full-attention layer.
    pub attention_layer: u64,
    /// One dense MLP (absent for all-MoE models).
    pub dense_mlp: u64,
    /// One MoE block, all experts.
    pub moe_block: u64,
    /// One MoE block, what one token touches (router, top-k experts, shared expert).
    pub moe_block_active: u64,
    /// The whole language model (no vision tower, no MTP).
    pub total: u64,
    /// Parameters one token touches.
    pub active: u64,
    /// The MTP module, as real checkpoints shape it (`mtp_num_hidden_layers` layers).
    pub mtp: u64,
    /// Of `total`, the projections Qwen's FP8 releases store as e4m3 (`fp8::quantised_in_fp8`):
    /// the GDN's in_proj_qkv / in_proj_z / out_proj, attention q/k/v/o, the MLPs, the experts
    /// and the shared expert.
    pub fp8_projections: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    pub params: ParamCounts,
    /// Bytes per parameter of the checkpoint as stored (2 for bf16).
    pub storage_bytes_per_param: u64,
    pub weights_bytes: u64,
    pub mtp_weights_bytes: u64,
    /// KV cache per token: all full-attention layers, K and V, in the activation dtype.
    pub kv_bytes_per_token: u64,
    pub mtp_kv_bytes_per_token: u64,
    pub conv_state_bytes_per_layer: u64,
    pub ssm_state_bytes_per_layer: u64,
    /// Conv + SSM state of all GDN layers, per sequence (constant in context length).
    pub recurrent_bytes_per_sequence: u64,
}

pub(crate) fn param_counts(c: &ModelConfig) -> ParamCounts {
    let h = c.hidden_size as u64;
    let v = c.vocab_size as u64;
    let l = &c.linear;
    let (kd, vd, conv, hv) = (l.key_dim() as u64, l.value_dim() as u64, l.conv_dim() as u64, l.num_value_heads as u64);
    let gdn_layer =
        h * conv + h * vd + 2 * h * hv + conv * l.conv_kernel as u64 + 2 * hv + l.value_head_dim as u64 + vd * h;
    let _ = kd;
    let (nh, nkv, hd) = (c.num_attention_heads as u64, c.num_key_value_heads as u64, c.head_dim as u64);
    let attention_layer = h * nh * hd * 2 + 2 * h * nkv * hd + nh * hd * h + 2 * hd;
    let dense_mlp = c.intermediate_size.map(|i| 3 * h * i as u64).unwrap_or(0);
    let (moe_block, moe_block_active) = match &c.moe {
        Some(m) => {
            let expert = 3 * h * m.moe_intermediate_size as u64;
            let shared = 3 * h * m.shared_expert_intermediate_size as u64 + h;
            let router = m.num_experts as u64 * h;
            (router + m.num_experts as u64 * expert + shared, router + m.num_experts_per_tok as u64 * expert + shared)
        }
        None => (0, 0),
    };
    let embed = v * h;
    let lm_head = if c.tie_word_embeddings { 0 } else { v * h };
    let mut total = embed + lm_head + h;
    let mut active = embed + lm_head + h;
    let gdn_fp8 = h * conv + h * vd + vd * h;
    let attention_fp8 = attention_layer - 2 * hd;
    let moe_fp8 = c
        .moe
        .as_ref()
        .map_or(0, |m| 3 * h * (m.num_experts * m.moe_intermediate_size + m.shared_expert_intermediate_size) as u64);
    let mut fp8_projections = 0;
    for (kind, mlp) in c.layer_types.iter().zip(&c.mlp_kinds) {
        let (mixer, mixer_fp8) = match kind {
            LayerKind::LinearAttention => (gdn_layer, gdn_fp8),
            LayerKind::FullAttention => (attention_layer, attention_fp8),
        };
        let (ff, ff_active, ff_fp8) = match mlp {
            MlpKind::Dense => (dense_mlp, dense_mlp, dense_mlp),
            MlpKind::Moe => (moe_block, moe_block_active, moe_fp8),
        };
        total += mixer + ff + 2 * h;
        active += mixer + ff_active + 2 * h;
        fp8_projections += mixer_fp8 + ff_fp8;
    }
    let mtp_ff = if c.moe.is_some() { moe_block } else { dense_mlp };
    let mtp = c.mtp_num_hidden_layers as u64 * (attention_layer + mtp_ff + 2 * h)
        + if c.mtp_num_hidden_layers > 0 { 2 * h * h + 3 * h } else { 0 };
    ParamCounts {
        embed,
        lm_head,
        gdn_layer,
        attention_layer,
        dense_mlp,
        moe_block,
        moe_block_active,
        total,
        active,
        mtp,
        fp8_projections,
    }
}

/// Bytes of the language model's weights in Qwen's FP8 format: the projections at one byte a
/// weight plus a bf16 scale per 128 × 128 block, everything else at `other_bytes` (bf16: 2).
pub fn fp8_weight_bytes(p: &ParamCounts, other_bytes: u64) -> u64 {
    let blocks = p.fp8_projections.div_ceil(128 * 128);
    p.fp8_projections + 2 * blocks + (p.total - p.fp8_projections) * other_bytes
}

/// The weight matrices of one decoder layer that Qwen's FP8 releases store as e4m3, `[rows,
/// cols]` as the checkpoint holds them (each with its own scale grid): the GDN's in_proj_qkv /
/// in_proj_z / out_proj or attention's q / k / v / o, and the MLP's gate / up / down (every
/// expert's, and the shared expert's).
pub(crate) fn fp8_layer_matrices(c: &ModelConfig, kind: LayerKind, mlp: MlpKind) -> Vec<(u64, u64)> {
    let h = c.hidden_size as u64;
    let l = &c.linear;
    let mut out = match kind {
        LayerKind::LinearAttention => {
            let (conv, vd) = (l.conv_dim() as u64, l.value_dim() as u64);
            vec![(conv, h), (vd, h), (h, vd)]
        }
        LayerKind::FullAttention => {
            let (q, kv) = ((c.num_attention_heads * c.head_dim) as u64, (c.num_key_value_heads * c.head_dim) as u64);
            vec![(2 * q, h), (kv, h), (kv, h), (h, q)]
        }
    };
    let mlp3 = |inter: u64| [(inter, h), (inter, h), (h, inter)];
    match (mlp, &c.moe) {
        (MlpKind::Moe, Some(m)) => {
            for _ in 0..m.num_experts {
                out.extend(mlp3(m.moe_intermediate_size as u64));
            }
            out.extend(mlp3(m.shared_expert_intermediate_size as u64));
        }
        _ => out.extend(mlp3(c.intermediate_size.unwrap_or(0) as u64)),
    }
    out
}

/// Bytes an FP8 matrix `[rows, cols]` takes on a CUDA device: a byte a code, an f32 scale per
/// 128 × 128 block and an i32 scale-row index per row (`ops::DeviceFp8`).
pub(crate) fn fp8_device_bytes(rows: u64, cols: u64) -> u64 {
    rows * cols + 4 * rows.div_ceil(128) * cols.div_ceil(128) + 4 * rows
}

/// The memory plan with weights stored at `bytes_per_param`, activations / KV / conv state at
/// `act_bytes` and the SSM state at `ssm_bytes` (f32 per `mamba_ssm_dtype` on real servers).
pub fn memory_plan(c: &ModelConfig, bytes_per_param: u64, act_bytes: u64, ssm_bytes: u64) -> MemoryPlan {
    let params = param_counts(c);
    let l = &c.linear;
    let kv_layer = 2 * c.num_key_value_heads as u64 * c.head_dim as u64 * act_bytes;
    let conv = l.conv_dim() as u64 * (l.conv_kernel as u64 - 1) * act_bytes;
    let ssm = (l.num_value_heads * l.key_head_dim * l.value_head_dim) as u64 * ssm_bytes;
    MemoryPlan {
        storage_bytes_per_param: bytes_per_param,
        weights_bytes: params.total * bytes_per_param,
        mtp_weights_bytes: params.mtp * bytes_per_param,
        kv_bytes_per_token: c.num_full_layers() as u64 * kv_layer,
        mtp_kv_bytes_per_token: c.mtp_num_hidden_layers as u64 * kv_layer,
        conv_state_bytes_per_layer: conv,
        ssm_state_bytes_per_layer: ssm,
        recurrent_bytes_per_sequence: c.num_linear_layers() as u64 * (conv + ssm),
        params,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Qwen3.6-27B text config (model-spec §1.3) must give the numbers of model-spec §8.
    #[test]
    fn qwen36_27b_numbers() {
        let cfg =
            ModelConfig::from_json_str(include_str!("../../../../tests/data/qwen3_6_27b/config.json"), "config.json")
                .unwrap();
        let p = memory_plan(&cfg, 2, 2, 4);
        assert_eq!(p.params.gdn_layer, 115_876_064);
        assert_eq!(p.params.attention_layer, 104_858_112);
        assert_eq!(p.params.dense_mlp, 267_386_880);
        assert_eq!(p.params.total, 26_895_998_464);
        assert_eq!(p.params.mtp, 424_699_392);
        assert_eq!(p.weights_bytes, 53_791_996_928);
        assert_eq!(p.conv_state_bytes_per_layer, 61_440);
        assert_eq!(p.ssm_state_bytes_per_layer, 3_145_728);
        assert_eq!(p.recurrent_bytes_per_sequence, 153_944_064);
        assert_eq!(p.kv_bytes_per_token, 65_536);
        assert_eq!(p.mtp_kv_bytes_per_token, 4_096);
        // Qwen3.6-27B-FP8: the projections are 24.3 of the 26.9 billion parameters (48 GDN
        // layers × 115,343,360 + 16 attention layers × 104,857,600 + 64 MLPs × 267,386,880;
        // the embedding, LM head, norms and the GDN's a/b projections stay bf16): 29.5 GB, of
        // which 5.1 GB are the bf16 embedding and head.
        assert_eq!(p.params.fp8_projections, 48 * 115_343_360 + 16 * 104_857_600 + 64 * 267_386_880);
        let fp8 = fp8_weight_bytes(&p.params, 2);
        assert_eq!(fp8, 24_326_963_200 + 2 * 1_484_800 + (26_895_998_464 - 24_326_963_200) * 2);
        assert_eq!(fp8, 29_468_003_328);
    }

    /// Qwen3.8-27B's config (`qwen3_5`, the MTP layer count under `text_config`) loads with
    /// every key known and gives the Qwen3.6-27B plan exactly.
    #[test]
    fn qwen38_27b_matches_the_qwen36_27b_plan() {
        let read = |d: &str| {
            let path = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
                .join("tests/data")
                .join(d)
                .join("config.json");
            ModelConfig::from_json_str(&std::fs::read_to_string(path).unwrap(), d).unwrap()
        };
        let (c38, c36) = (read("qwen3_8_27b"), read("qwen3_6_27b"));
        assert!(c38.nested && c38.model_type == "qwen3_5" && c38.mtp_num_hidden_layers == 1);
        assert!(c38.unknown_keys.is_empty(), "{:?}", c38.unknown_keys);
        let plan = |c: &ModelConfig| serde_json::to_value(memory_plan(c, 2, 2, 4)).unwrap();
        assert_eq!(plan(&c38), plan(&c36));
        assert_eq!((c38.layer_types, c38.mlp_kinds), (c36.layer_types, c36.mlp_kinds));
    }
}
