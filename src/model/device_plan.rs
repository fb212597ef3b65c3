//! Which device holds which layers: a contiguous split of the decoder by free memory (a layer
//! split, like llama.cpp's `-sm layer`), computed from the config alone so that a user can plan
//! two 48 GB cards before downloading anything. One hidden-state copy crosses each boundary
//! per step. A layer split buys capacity, not batch-1 speed: the devices take turns.

use serde::Serialize;

use super::config::{LayerKind, MlpKind, ModelConfig};
use super::plan::param_counts;

/// Bytes of one weight / KV / conv-state element (bf16) and of one SSM-state element (f32,
/// the checkpoints' `mamba_ssm_dtype`).
const WEIGHT_BYTES: u64 = 2;
const ACT_BYTES: u64 = 2;
const SSM_BYTES: u64 = 4;
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
    /// Draft tokens verified per step (MTP): each GDN layer keeps this many extra state slots.
    pub mtp_depth: u64,
    /// Tokens per prefill pass (sizes the activation workspace).
    pub prefill_chunk: u64,
}

impl PlanInputs {
    /// The whole context, MTP at depth 3 (when the model has an MTP layer), 512-token prefill
    /// passes.
    pub fn for_model(c: &ModelConfig) -> Self {
        PlanInputs {
            context_tokens: c.max_position_embeddings as u64,
            mtp_depth: if c.mtp_num_hidden_layers > 0 { 3 } else { 0 },
            prefill_chunk: 512,
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
    /// The extra state slots MTP verify writes per draft token.
    pub mtp_slot_bytes: u64,
    /// Activations of a prefill pass, logits, and [`CONTEXT_RESERVE`].
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
                weights: (mixer + ff + 2 * h) * WEIGHT_BYTES,
                kv_per_token: if gdn { 0 } else { kv_layer },
                recurrent: if gdn { conv + ssm } else { 0 },
                // One conv column and one SSM state per draft token verified.
                mtp_slots: if gdn { inputs.mtp_depth * (ssm + l.conv_dim() as u64 * ACT_BYTES) } else { 0 },
                gdn,
            }
        })
        .collect()
}

/// Activations of one prefill pass on a device (four f32 buffers of the widest projection
/// per token), plus the logits when it holds the head (f32, one row per verified token).
fn workspace(c: &ModelConfig, inputs: &PlanInputs, head: bool) -> u64 {
    let l = &c.linear;
    let ff = c.intermediate_size.unwrap_or(0).max(
        c.moe
            .as_ref()
            .map_or(0, |m| m.num_experts_per_tok * m.moe_intermediate_size + m.shared_expert_intermediate_size),
    );
    let widest = [l.conv_dim() + l.value_dim(), 2 * ff, 2 * c.num_attention_heads * c.head_dim, c.hidden_size]
        .into_iter()
        .max()
        .unwrap_or(0) as u64;
    let activations = inputs.prefill_chunk * widest * 4 * 4;
    let logits = if head { (inputs.mtp_depth + 1) * c.vocab_size as u64 * 4 } else { 0 };
    CONTEXT_RESERVE + activations + logits
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
    let mtp_weights = p.mtp * WEIGHT_BYTES;
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
            std::fs::read_to_string(format!("{}/tests/data/{path}/config.json", env!("CARGO_MANIFEST_DIR"))).unwrap();
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
        let plan_bf16 = super::super::plan::memory_plan(c, 2, 2, 4);
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
