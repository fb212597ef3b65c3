//! Which device holds which layers: a contiguous split of the decoder by free memory (a layer
//! split, like llama.cpp's `-sm layer`), computed from the config alone so that a user can plan
//! two 48 GB cards before downloading anything. One hidden-state copy crosses each boundary
//! per step. A layer split buys capacity, not batch-1 speed: the devices take turns.

use serde::Serialize;

use crate::model::config::{LayerKind, MlpKind, ModelConfig};
use crate::model::sizes::{fp8_device_bytes, fp8_layer_matrices, param_counts};

/// Tokens per prefill pass of the CUDA model: the activations of one pass are sized by it, and
/// the plan reserves its workspace ([`PlanInputs::for_model`]). Here, with the plan, so that the
/// CUDA model and the plan agree without importing each other for it.
pub const PREFILL_CHUNK: usize = 512;

/// Bytes of one weight / KV / conv-state / activation element (bf16) and of one SSM-state
/// element (f32, the checkpoints' `mamba_ssm_dtype`); f32 / i32 activations (router logits,
/// expert ids and weights, positions) take [`WORD_BYTES`].
const WEIGHT_BYTES: u64 = 2;
const ACT_BYTES: u64 = 2;
const SSM_BYTES: u64 = 4;
const WORD_BYTES: u64 = 4;
/// Held back on every device for the CUDA context, loaded kernels and the cuBLASLt workspace
/// (a CUDA 12/13 context alone takes 300–500 MiB on Hopper).
pub const CONTEXT_RESERVE: u64 = 768 << 20;

/// One device and the memory it offers.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceBudget {
    /// "cuda:0", or "device 0" for a planned one.
    pub label: String,
    pub free_bytes: u64,
}

/// What the plan reserves room for.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PlanInputs {
    /// KV cache reserved for this many tokens of one sequence.
    pub context_tokens: u64,
    /// Draft tokens verified per step (MTP): a verify pass runs `mtp_depth + 1` tokens, and
    /// each GDN layer keeps a slot of its SSM state and conv window per token to roll back to.
    pub mtp_depth: u64,
    /// Tokens per prefill pass (sizes the activation workspace).
    pub prefill_chunk: u64,
}

impl PlanInputs {
    /// The whole context, MTP at depth 3 (when the model has an MTP layer), prefill passes of
    /// the CUDA model's chunk ([`PREFILL_CHUNK`] tokens).
    pub fn for_model(c: &ModelConfig) -> Self {
        PlanInputs {
            context_tokens: c.max_position_embeddings as u64,
            mtp_depth: if c.mtp_num_hidden_layers > 0 { 3 } else { 0 },
            prefill_chunk: PREFILL_CHUNK as u64,
        }
    }
}

/// One device's share.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceShare {
    pub label: String,
    pub free_bytes: u64,
    /// Decoder layers `first..end` (empty when the device holds none).
    pub layers: std::ops::Range<usize>,
    pub gdn_layers: usize,
    pub attention_layers: usize,
    pub embedding: bool,
    /// The final norm and the LM head.
    pub head: bool,
    pub mtp: bool,
    pub weights_bytes: u64,
    pub kv_bytes_per_token: u64,
    /// KV at `context_tokens`.
    pub kv_bytes: u64,
    /// Conv + SSM state of its GDN layers, one sequence.
    pub recurrent_bytes: u64,
    /// The rollback slots of a verify pass (`mtp_depth + 1` tokens, each an SSM state and a
    /// conv window per GDN layer), held once the first verify pass ran.
    pub mtp_slot_bytes: u64,
    /// The activations of one pass of `prefill_chunk` tokens at their peak (with every row's
    /// logits and, on the last device, the MTP pass over the same rows), and
    /// [`CONTEXT_RESERVE`].
    pub workspace_bytes: u64,
    pub total_bytes: u64,
    /// `free − total`: negative when it does not fit.
    pub headroom_bytes: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DevicePlan {
    pub inputs: PlanInputs,
    pub devices: Vec<DeviceShare>,
    /// For each decoder layer, the index into `devices` that runs it.
    pub layer_device: Vec<usize>,
    /// Bytes of the hidden state copied at each boundary, per token.
    pub boundary_bytes_per_token: u64,
    pub fits: bool,
}

impl DevicePlan {
    /// Devices that hold anything.
    pub fn used(&self) -> impl Iterator<Item = &DeviceShare> {
        self.devices.iter().filter(|d| d.total_bytes > 0)
    }

    /// Layers where the hidden state moves to the next device.
    pub fn boundaries(&self) -> Vec<usize> {
        (1..self.layer_device.len()).filter(|&i| self.layer_device[i] != self.layer_device[i - 1]).collect()
    }
}

/// What one decoder layer costs, by kind.
struct LayerCost {
    weights: u64,
    kv_per_token: u64,
    recurrent: u64,
    mtp_slots: u64,
    gdn: bool,
}

fn layer_costs(c: &ModelConfig, inputs: &PlanInputs) -> Vec<LayerCost> {
    let p = param_counts(c);
    let h = c.hidden_size as u64;
    let l = &c.linear;
    let kv_layer = 2 * c.num_key_value_heads as u64 * c.head_dim as u64 * ACT_BYTES;
    let conv = l.conv_dim() as u64 * (l.conv_kernel as u64 - 1) * ACT_BYTES;
    let ssm = (l.num_value_heads * l.key_head_dim * l.value_head_dim) as u64 * SSM_BYTES;
    c.layer_types
        .iter()
        .zip(&c.mlp_kinds)
        .map(|(kind, mlp)| {
            let ff = match mlp {
                MlpKind::Dense => p.dense_mlp,
                MlpKind::Moe => p.moe_block,
            };
            let gdn = *kind == LayerKind::LinearAttention;
            let mixer = if gdn { p.gdn_layer } else { p.attention_layer };
            LayerCost {
                weights: layer_weight_bytes(c, mixer + ff + 2 * h, *kind, *mlp),
                kv_per_token: if gdn { 0 } else { kv_layer },
                recurrent: if gdn { conv + ssm } else { 0 },
                // A verify pass of depth + 1 tokens keeps, per token, an SSM state and a conv
                // window (`GdnCache::ensure_slots` in src/model/cuda/model.rs).
                mtp_slots: if gdn { (inputs.mtp_depth + 1) * (ssm + conv) } else { 0 },
                gdn,
            }
        })
        .collect()
}

/// Bytes of a decoder layer's `params` weights on a device: bf16, or for an FP8 checkpoint its
/// e4m3 projections as the CUDA model holds them (`fp8_device_bytes`) and the rest bf16.
fn layer_weight_bytes(c: &ModelConfig, params: u64, kind: LayerKind, mlp: MlpKind) -> u64 {
    if c.quantization.is_none() {
        return params * WEIGHT_BYTES;
    }
    let fp8 = fp8_layer_matrices(c, kind, mlp);
    let codes: u64 = fp8.iter().map(|(r, k)| r * k).sum();
    (params - codes) * WEIGHT_BYTES + fp8.iter().map(|&(r, k)| fp8_device_bytes(r, k)).sum::<u64>()
}

/// The device memory of one pass of `t` tokens at its peak, on a device holding decoder layers
/// and, when `last`, the final norm, head and MTP layer: the buffers `CudaModel`
/// (src/model/cuda/model.rs) allocates, counted phase by phase as they are alive together
/// (each function's temporaries are freed when it returns). Host memory (the read-back hidden
/// rows and logits, the host hop between devices) is not counted.
///
/// Margin: none over what the model allocates in the phase that peaks — on the emulated device
/// (which counts its bytes) a chunk's prefill with every row's logits, or the MTP pass over its
/// rows, peaks at exactly this (tests/device_plan_emu.rs). It is an upper bound because it
/// takes the worst case where the engine asks for less: every row's logits (a prefill asks
/// for the last row's, and the MTP pass after it too: the 27B's last device then peaks at
/// 106 MB, not 301 MB), and every layer kind of the model on every device. Allocator rounding
/// on a GPU (≤ 2 MiB for each of the ~20 live buffers) comes out of [`CONTEXT_RESERVE`].
fn pass_peak(c: &ModelConfig, t: u64, last: bool) -> u64 {
    let (a, f) = (ACT_BYTES, WORD_BYTES);
    let h = c.hidden_size as u64;
    let v = c.vocab_size as u64;
    let l = &c.linear;
    let (cd, vd, hv) = (l.conv_dim() as u64, l.value_dim() as u64, l.num_value_heads as u64);
    let (qw, kw) = ((c.num_attention_heads * c.head_dim) as u64, (c.num_key_value_heads * c.head_dim) as u64);
    // run_layer: the hidden rows x and the normed rows n live through the layer.
    let xn = 2 * t * h * a;
    // gdn: pre, z, b, a, qkv, out, normed and y, alive together at its end.
    let gdn = xn + t * a * (2 * cd + 3 * vd + 2 * hv + h);
    // attention: q (query and gate), k, v, positions (i32), att and y.
    let attention = xn + t * a * (3 * qw + 2 * kw + h) + t * f;
    // The MLP runs while the mixer's output is held: x, n and mixed.
    let xnm = 3 * t * h * a;
    // dense: gate_up, hmid and y.
    let dense_of = |inter: u64| t * a * (3 * inter + h);
    let dense = xnm + dense_of(c.intermediate_size.unwrap_or(0) as u64);
    // moe: router logits (f32), ids and weights per pair, gate_up, hmid and y per pair, routed;
    // then the shared expert's dense pass, or its output with the gate (f32) and the scaled rows.
    let moe = c.moe.as_ref().map_or(0, |m| {
        let (e, p, inter) = (m.num_experts as u64, t * m.num_experts_per_tok as u64, m.moe_intermediate_size as u64);
        let shared = dense_of(m.shared_expert_intermediate_size as u64).max(2 * t * h * a + t * f);
        xnm + t * e * f + 2 * p * f + p * a * (3 * inter + h) + t * h * a + shared
    });
    let mixer = |kind: LayerKind| if kind == LayerKind::LinearAttention { gdn } else { attention };
    let mlp = |kind: MlpKind| if kind == MlpKind::Moe { moe } else { dense };
    // embed_rows: the ids (u32) and the rows.
    let embed = t * f + t * h * a;
    let layers = c.layer_types.iter().zip(&c.mlp_kinds).map(|(&k, &m)| mixer(k).max(mlp(m))).fold(embed, u64::max);
    if !last {
        return layers;
    }
    // forward_gpu's end: x, the final-normed rows, the rows selected and their logits (bf16).
    let head = t * a * (3 * h + v);
    if c.mtp_num_hidden_layers == 0 {
        return layers.max(head);
    }
    // mtp_gpu: the embedded rows, the hidden rows, both normed and their concatenation live
    // through the pass; its attention layer runs on u (fc's output: the layer's x); then u,
    // the normed output, the rows selected and their logits.
    let mtp_in = 6 * t * h * a;
    let mtp_mlp = mlp(if c.moe.is_some() { MlpKind::Moe } else { MlpKind::Dense });
    let mtp_layer = mtp_in + attention.max(mtp_mlp);
    let mtp_head = mtp_in + t * a * (3 * h + v);
    layers.max(head).max(mtp_layer).max(mtp_head)
}

/// The workspace a device reserves: one pass of `prefill_chunk` tokens ([`pass_peak`]), and
/// [`CONTEXT_RESERVE`]. A verify pass (≤ 8 tokens) or a decode step needs far less.
fn workspace(c: &ModelConfig, inputs: &PlanInputs, last: bool) -> u64 {
    CONTEXT_RESERVE + pass_peak(c, inputs.prefill_chunk, last)
}

/// Splits the decoder over `devices` in order, each taking a share of the bytes in proportion
/// to what it can hold: the embedding goes with the first layer, the final norm, head and MTP
/// layer with the last (a tied head is then a second copy of the embedding).
pub fn plan_devices(c: &ModelConfig, devices: &[DeviceBudget], inputs: PlanInputs) -> DevicePlan {
    let costs = layer_costs(c, &inputs);
    let p = param_counts(c);
    let h = c.hidden_size as u64;
    let ctx = inputs.context_tokens;
    let layer_total = |lc: &LayerCost| lc.weights + lc.kv_per_token * ctx + lc.recurrent + lc.mtp_slots;
    let embed = p.embed * WEIGHT_BYTES;
    let n = devices.len().max(1);
    // A tied head shares the embedding on one device; split, the last device needs a copy.
    let head_matrix = if !c.tie_word_embeddings {
        p.lm_head
    } else if n > 1 {
        p.embed
    } else {
        0
    };
    let head_weights = (head_matrix + h) * WEIGHT_BYTES;
    let mtp_kv_layer = 2 * c.num_key_value_heads as u64 * c.head_dim as u64 * ACT_BYTES;
    // The MTP module: fc, norms and `mtp_num_hidden_layers` attention layers with the model's MLP.
    let mtp_weights = if c.mtp_num_hidden_layers == 0 {
        0
    } else {
        let mlp = if c.moe.is_some() { MlpKind::Moe } else { MlpKind::Dense };
        let per_layer = (p.mtp - 2 * h * h - 3 * h) / c.mtp_num_hidden_layers as u64;
        let layer = layer_weight_bytes(c, per_layer, LayerKind::FullAttention, mlp);
        (2 * h * h + 3 * h) * WEIGHT_BYTES + c.mtp_num_hidden_layers as u64 * layer
    };
    let mtp_kv = c.mtp_num_hidden_layers as u64 * mtp_kv_layer;

    // Capacity left for layers on each device once the fixed parts are placed.
    let fixed = |d: usize| {
        let last = d == n - 1;
        let mut b = workspace(c, &inputs, last);
        if d == 0 {
            b += embed;
        }
        if last {
            b += head_weights + mtp_weights + mtp_kv * ctx;
        }
        b
    };
    let usable: Vec<u64> =
        (0..n).map(|d| devices.get(d).map_or(0, |x| x.free_bytes).saturating_sub(fixed(d))).collect();
    let all_layers: u64 = costs.iter().map(layer_total).sum();
    let capacity: u64 = usable.iter().sum::<u64>().max(1);
    // Device d takes the layers whose midpoint falls in its share of the cumulative bytes.
    let mut bounds = vec![];
    let mut acc = 0u128;
    for u in &usable {
        acc += *u as u128;
        bounds.push(acc * all_layers as u128 / capacity as u128);
    }
    let mut layer_device = vec![];
    let mut done = 0u128;
    for lc in &costs {
        let mid = done + layer_total(lc) as u128 / 2;
        let d = bounds.iter().position(|&b| mid < b).unwrap_or(n - 1);
        // Contiguous: never go back to an earlier device.
        layer_device.push(d.max(layer_device.last().copied().unwrap_or(0)));
        done += layer_total(lc) as u128;
    }

    let devices_out: Vec<DeviceShare> = (0..n)
        .map(|d| {
            let mine: Vec<usize> = (0..costs.len()).filter(|&i| layer_device[i] == d).collect();
            let layers = match (mine.first(), mine.last()) {
                (Some(&a), Some(&b)) => a..b + 1,
                _ => 0..0,
            };
            let last = d == n - 1;
            let sum = |f: &dyn Fn(&LayerCost) -> u64| mine.iter().map(|&i| f(&costs[i])).sum::<u64>();
            let mut weights = sum(&|x| x.weights);
            let mut kv_per_token = sum(&|x| x.kv_per_token);
            if d == 0 {
                weights += embed;
            }
            if last {
                weights += head_weights + mtp_weights;
                kv_per_token += mtp_kv;
            }
            let recurrent = sum(&|x| x.recurrent);
            let mtp_slot_bytes = sum(&|x| x.mtp_slots);
            let holds_anything = !mine.is_empty() || d == 0 || last;
            let workspace_bytes = if holds_anything { workspace(c, &inputs, last) } else { 0 };
            let kv_bytes = kv_per_token * ctx;
            let total = weights + kv_bytes + recurrent + mtp_slot_bytes + workspace_bytes;
            let free = devices.get(d).map_or(0, |x| x.free_bytes);
            DeviceShare {
                label: devices.get(d).map_or_else(|| format!("device {d}"), |x| x.label.clone()),
                free_bytes: free,
                gdn_layers: mine.iter().filter(|&&i| costs[i].gdn).count(),
                attention_layers: mine.iter().filter(|&&i| !costs[i].gdn).count(),
                layers,
                embedding: d == 0,
                head: last,
                mtp: last && c.mtp_num_hidden_layers > 0,
                weights_bytes: weights,
                kv_bytes_per_token: kv_per_token,
                kv_bytes,
                recurrent_bytes: recurrent,
                mtp_slot_bytes,
                workspace_bytes,
                total_bytes: total,
                headroom_bytes: free as i64 - total as i64,
            }
        })
        .collect();
    let fits = !devices.is_empty() && devices_out.iter().all(|d| d.headroom_bytes >= 0);
    DevicePlan { inputs, devices: devices_out, layer_device, boundary_bytes_per_token: h * ACT_BYTES, fits }
}

/// The plan on the fewest of `devices` (in order) that hold the model: one card when it fits
/// (a split only adds a copy per step), more when it does not. The plan on all of them when
/// none fits, to show by how much.
pub fn plan_fewest(c: &ModelConfig, devices: &[DeviceBudget], inputs: PlanInputs) -> DevicePlan {
    for k in 1..devices.len() {
        let plan = plan_devices(c, &devices[..k], inputs);
        if plan.fits {
            return plan;
        }
    }
    plan_devices(c, devices, inputs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: &str) -> ModelConfig {
        let text =
            std::fs::read_to_string(format!("{}/../../tests/data/{path}/config.json", env!("CARGO_MANIFEST_DIR")))
                .unwrap();
        ModelConfig::from_json_str(&text, path).unwrap()
    }

    fn gib(n: u64) -> DeviceBudget {
        DeviceBudget { label: format!("{n} GiB"), free_bytes: n << 30 }
    }

    /// Everything the model needs is placed exactly once, whatever the split.
    fn check_conservation(c: &ModelConfig, plan: &DevicePlan) {
        let p = param_counts(c);
        let tied_copy = if c.tie_word_embeddings && plan.devices.len() > 1 { p.embed } else { 0 };
        let weights: u64 = plan.devices.iter().map(|d| d.weights_bytes).sum();
        assert_eq!(weights, (p.total + p.mtp + tied_copy) * WEIGHT_BYTES);
        let plan_bf16 = crate::model::sizes::memory_plan(c, 2, 2, 4);
        let kv: u64 = plan.devices.iter().map(|d| d.kv_bytes_per_token).sum();
        assert_eq!(kv, plan_bf16.kv_bytes_per_token + plan_bf16.mtp_kv_bytes_per_token);
        let rec: u64 = plan.devices.iter().map(|d| d.recurrent_bytes).sum();
        assert_eq!(rec, plan_bf16.recurrent_bytes_per_sequence);
        assert_eq!(plan.layer_device.len(), c.num_hidden_layers);
        assert!(plan.layer_device.windows(2).all(|w| w[0] <= w[1]), "layers are contiguous per device");
    }

    /// The field report's case: Qwen3.6-27B (54 GB of bf16) on two 48 GB cards, the whole
    /// 262,144-token context and MTP at depth 3.
    #[test]
    fn qwen36_27b_fits_two_48_gb_cards_split_near_half() {
        let c = config("qwen3_6_27b");
        let plan = plan_devices(&c, &[gib(48), gib(48)], PlanInputs::for_model(&c));
        check_conservation(&c, &plan);
        assert!(plan.fits, "{plan:#?}");
        assert_eq!(plan.boundaries().len(), 1);
        let split = plan.boundaries()[0];
        assert!((28..=36).contains(&split), "split at layer {split}");
        assert_eq!(plan.boundary_bytes_per_token, 10_240);
        for d in &plan.devices {
            assert!(d.headroom_bytes > 1 << 30, "{} has {} B headroom", d.label, d.headroom_bytes);
        }
        // One 48 GB card cannot hold it; one H200 (141 GB, ~139 GiB free) can.
        assert!(!plan_devices(&c, &[gib(48)], PlanInputs::for_model(&c)).fits);
        let one = plan_fewest(&c, &[gib(139), gib(139)], PlanInputs::for_model(&c));
        assert!(one.fits);
        assert_eq!(one.devices.len(), 1, "one big card: no split");
        check_conservation(&c, &one);
    }

    /// A verify pass of depth + 1 tokens keeps that many SSM states and conv windows per GDN
    /// layer (what `GdnCache::ensure_slots` allocates), and the workspace is a pass of the
    /// CUDA model's chunk, independent of the context.
    #[test]
    fn verify_slots_and_workspace_follow_the_model() {
        let c = config("qwen3_6_27b");
        let inputs = PlanInputs::for_model(&c);
        assert_eq!(inputs.prefill_chunk, PREFILL_CHUNK as u64);
        let plan = plan_devices(&c, &[gib(48), gib(48)], inputs);
        let slots: u64 = plan.devices.iter().map(|d| d.mtp_slot_bytes).sum();
        // 48 GDN layers × 4 tokens × (48·128·128 f32 + 10240·3 bf16).
        assert_eq!(slots, 48 * 4 * (3_145_728 + 61_440));
        let short = plan_devices(&c, &[gib(48), gib(48)], PlanInputs { context_tokens: 4096, ..inputs });
        for (a, b) in plan.devices.iter().zip(&short.devices) {
            assert_eq!(a.workspace_bytes, b.workspace_bytes);
        }
        // Every row's logits of a 512-token chunk (bf16) are the last device's largest part.
        let logits = 512 * c.vocab_size as u64 * ACT_BYTES;
        let last = plan.devices[1].workspace_bytes - CONTEXT_RESERVE;
        assert!(last > logits && last < 2 * logits, "{last}");
    }

    #[test]
    fn moe_35b_a3b_needs_both_48_gb_cards() {
        let c = config("qwen3_6_35b_a3b");
        let inputs = PlanInputs::for_model(&c);
        assert!(!plan_devices(&c, &[gib(48)], inputs).fits);
        let plan = plan_fewest(&c, &[gib(48), gib(48)], inputs);
        check_conservation(&c, &plan);
        assert!(plan.fits);
        assert_eq!(plan.devices.len(), 2);
        assert_eq!(plan.devices[0].gdn_layers + plan.devices[1].gdn_layers, 30);
        assert_eq!(plan.devices[0].attention_layers + plan.devices[1].attention_layers, 10);
    }

    /// Qwen3-Next-80B-A3B is 148 GiB of bf16: it fits neither 2 × 48 GB nor, at its whole
    /// context with MTP, 2 × 80 GB; it takes two H200s (one is too small).
    #[test]
    fn qwen3_next_80b_needs_more_than_two_48_gb_cards() {
        let c = config("qwen3_next_80b_a3b");
        let inputs = PlanInputs::for_model(&c);
        let small = plan_devices(&c, &[gib(48), gib(48)], inputs);
        check_conservation(&c, &small);
        assert!(!small.fits);
        assert!(small.devices.iter().all(|d| d.headroom_bytes < 0), "the shortfall is spread: {small:#?}");
        assert!(!plan_devices(&c, &[gib(80), gib(80)], inputs).fits);
        let h200 = plan_fewest(&c, &[gib(139), gib(139)], inputs);
        assert!(h200.fits, "{h200:#?}");
        assert_eq!(h200.devices.len(), 2);
        check_conservation(&c, &h200);
    }

    /// Qwen3.6-27B-FP8 (29.5 GB, Qwen's FP8 release of the same config) fits one 48 GB card at
    /// the whole context with MTP, where the bf16 model needs two; its weights are the bf16
    /// plan's less a byte per FP8 weight, plus the scales and row indices the device holds.
    #[test]
    fn qwen36_27b_fp8_fits_one_48_gb_card() {
        let mut c = config("qwen3_6_27b");
        let inputs = PlanInputs::for_model(&c);
        let bf16 = plan_devices(&c, &[gib(48)], inputs);
        assert!(!bf16.fits);
        c.quantization = Some(crate::model::fp8::Fp8Format { modules_to_not_convert: vec![] });
        let fp8 = plan_devices(&c, &[gib(48)], inputs);
        assert!(fp8.fits, "{fp8:#?}");
        assert_eq!(plan_fewest(&c, &[gib(48), gib(48)], inputs).devices.len(), 1);
        let w = |p: &DevicePlan| p.devices.iter().map(|d| d.weights_bytes).sum::<u64>();
        let p = param_counts(&c);
        // The MTP layer's q / k / v / o and MLP are FP8 too.
        let h = c.hidden_size as u64;
        let (q, kv) = (24 * 256u64, 4 * 256u64);
        let mtp_codes = h * 2 * q + 2 * h * kv + q * h + 3 * h * 17408;
        let saved = w(&bf16) - w(&fp8);
        let overhead = (p.fp8_projections + mtp_codes) - saved;
        assert!(
            overhead > 0 && overhead < (p.fp8_projections + mtp_codes) / 200,
            "{overhead} B of scales and row indices"
        );
        assert!(w(&fp8) < 30_500_000_000, "{}", w(&fp8));
    }

    /// A tied head is one matrix on one device and a copy on the last of two.
    #[test]
    fn tied_head_is_copied_only_when_split() {
        let c = config("qwen3_5_0_8b");
        assert!(c.tie_word_embeddings);
        let inputs = PlanInputs { context_tokens: 4096, mtp_depth: 0, prefill_chunk: 512 };
        let one = plan_devices(&c, &[gib(8)], inputs);
        let two = plan_devices(&c, &[gib(8), gib(8)], inputs);
        check_conservation(&c, &one);
        check_conservation(&c, &two);
        let embed = c.vocab_size as u64 * c.hidden_size as u64 * WEIGHT_BYTES;
        let w = |p: &DevicePlan| p.devices.iter().map(|d| d.weights_bytes).sum::<u64>();
        assert_eq!(w(&two) - w(&one), embed);
    }

    #[test]
    fn uneven_cards_take_uneven_shares() {
        let c = config("qwen3_6_27b");
        let plan = plan_devices(
            &c,
            &[gib(80), gib(24)],
            PlanInputs { context_tokens: 32768, mtp_depth: 0, prefill_chunk: 512 },
        );
        assert!(plan.fits, "{plan:#?}");
        let (a, b) = (&plan.devices[0], &plan.devices[1]);
        assert!(a.layers.len() > 2 * b.layers.len(), "{:?} vs {:?}", a.layers, b.layers);
    }
}
