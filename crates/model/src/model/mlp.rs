//! The feed-forward blocks: the dense SwiGLU MLP, and the sparse MoE block (top-k router with
//! optional renormalisation, experts accumulated in ascending id order, sigmoid-gated shared
//! expert), model-spec §5.2–§5.3.

use super::config::MoeConfig;
use super::cpu::math;
use super::cpu::tensor::{Linear, Mat, Precision, sigmoid};
use super::finite::{self, Sublayer};
use super::load::Loader;
use super::storage::Weights;
use crate::error::{Error, Result};

pub(crate) struct DenseMlp {
    pub(crate) inter: usize,
    /// Fused `[gate_proj ; up_proj]`.
    pub(crate) gate_up: Linear,
    pub(crate) down: Linear,
}

impl DenseMlp {
    /// The block's weights under `ld` (a layer's `mlp.`, or one expert's).
    pub(crate) fn load(ld: &Loader, hidden: usize, inter: usize) -> Result<Self> {
        let gate_up = Linear::fused(
            vec![
                (ld.weights("gate_proj.weight", &[inter, hidden])?, inter),
                (ld.weights("up_proj.weight", &[inter, hidden])?, inter),
            ],
            hidden,
        )?;
        let down = ld.linear("down_proj.weight", hidden, inter)?;
        Ok(DenseMlp { inter, gate_up, down })
    }

    /// From already fused `gate_up [2I, H]` and `down [H, I]` weights.
    fn from_fused(gate_up: Weights, down: Weights, hidden: usize, inter: usize) -> Result<Self> {
        Ok(DenseMlp {
            inter,
            gate_up: Linear::from_weights(gate_up, 2 * inter, hidden)?,
            down: Linear::from_weights(down, hidden, inter)?,
        })
    }

    pub(crate) fn weight_bytes(&self) -> usize {
        self.gate_up.weight_bytes() + self.down.weight_bytes()
    }

    pub(crate) fn forward(&self, x: &Mat, prec: Precision) -> Result<Mat> {
        let gu = self.gate_up.forward(x, prec)?;
        let i = self.inter;
        let mut h = Mat::zeros(x.rows, i);
        h.for_rows(|t, out| {
            let (g, u) = gu.row(t).split_at(i);
            math::silu_times(out, g, u, prec);
        });
        self.down.forward(&h, prec)
    }
}

pub(crate) struct MoeBlock {
    pub(crate) top_k: usize,
    pub(crate) norm_topk_prob: bool,
    pub(crate) router: Linear,
    pub(crate) experts: Vec<DenseMlp>,
    pub(crate) shared: DenseMlp,
    pub(crate) shared_gate: Linear,
}

impl MoeBlock {
    /// The block's weights under `ld` (a layer's `mlp.`).
    pub(crate) fn load(moe: &MoeConfig, hidden: usize, ld: &Loader) -> Result<Self> {
        let (experts, top_k, inter) = (moe.num_experts, moe.num_experts_per_tok, moe.moe_intermediate_size);
        let (shared_inter, norm_topk_prob) = (moe.shared_expert_intermediate_size, moe.norm_topk_prob);
        let router = ld.linear("gate.weight", experts, hidden)?;
        let fused = "experts.gate_up_proj";
        let list = if ld.has(fused) {
            // Fused layout (Qwen3.5-MoE checkpoints): [E, 2I, H] (gate rows, then up) and [E, H, I].
            let gu = ld.weights(fused, &[experts, 2 * inter, hidden])?;
            let dn = ld.weights("experts.down_proj", &[experts, hidden, inter])?;
            let (gsz, dsz) = (2 * inter * hidden, hidden * inter);
            (0..experts)
                .map(|e| DenseMlp::from_fused(gu.slice(e * gsz, gsz), dn.slice(e * dsz, dsz), hidden, inter))
                .collect::<Result<Vec<_>>>()?
        } else if ld.has("experts.0.gate_proj.weight") {
            // One tensor per expert (Qwen3-Next checkpoints).
            (0..experts)
                .map(|e| DenseMlp::load(&ld.pp(format_args!("experts.{e}")), hidden, inter))
                .collect::<Result<Vec<_>>>()?
        } else {
            return Err(Error::MissingTensor {
                name: format!("{} (or {})", ld.name(fused), ld.name("experts.0.gate_proj.weight")),
                searched: "the checkpoint's safetensors files".into(),
            });
        };
        Ok(MoeBlock {
            top_k,
            norm_topk_prob,
            router,
            experts: list,
            shared: DenseMlp::load(&ld.pp("shared_expert"), hidden, shared_inter)?,
            shared_gate: ld.linear("shared_expert_gate.weight", 1, hidden)?,
        })
    }

    pub(crate) fn weight_bytes(&self) -> usize {
        self.router.weight_bytes()
            + self.experts.iter().map(DenseMlp::weight_bytes).sum::<usize>()
            + self.shared.weight_bytes()
            + self.shared_gate.weight_bytes()
    }

    pub(crate) fn forward(&self, x: &Mat, prec: Precision) -> Result<Mat> {
        let (t_len, hidden) = (x.rows, x.cols);
        let logits = self.router.forward(x, prec)?;
        // NaN router logits would pick experts by NaN comparisons: stop here instead (the layer
        // and position are filled in by the caller).
        finite::check(&logits, None, Sublayer::MoeRouter, 0, &[])?;
        // Per token: softmax in f32, top-k, optional renormalisation, weights in the activation dtype.
        let mut routed: Vec<Vec<(usize, f32)>> = vec![vec![]; self.experts.len()];
        for t in 0..t_len {
            let l = logits.row(t);
            let max = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = l.iter().map(|v| math::exp(v - max)).collect();
            let sum: f32 = exps.iter().sum();
            let probs: Vec<f32> = exps.iter().map(|e| e / sum).collect();
            let mut order: Vec<usize> = (0..probs.len()).collect();
            order.sort_by(|a, b| probs[*b].total_cmp(&probs[*a]).then(a.cmp(b)));
            let top = &order[..self.top_k];
            let total: f32 = top.iter().map(|&e| probs[e]).sum();
            for &e in top {
                let w = if self.norm_topk_prob { probs[e] / total } else { probs[e] };
                routed[e].push((t, prec.round(w)));
            }
        }
        let mut acc = Mat::zeros(t_len, hidden);
        for (e, toks) in routed.iter().enumerate() {
            if toks.is_empty() {
                continue;
            }
            let idx: Vec<usize> = toks.iter().map(|(t, _)| *t).collect();
            let y = self.experts[e].forward(&x.gather_rows(&idx), prec)?;
            for (r, (t, w)) in toks.iter().enumerate() {
                for (a, v) in acc.row_mut(*t).iter_mut().zip(y.row(r)) {
                    *a = prec.round(*a + prec.round(v * w));
                }
            }
        }
        let shared = self.shared.forward(x, prec)?;
        let gate = self.shared_gate.forward(x, prec)?;
        for t in 0..t_len {
            let g = prec.round(sigmoid(gate.row(t)[0]));
            let s = shared.row(t);
            for (a, v) in acc.row_mut(t).iter_mut().zip(s) {
                *a = prec.round(*a + prec.round(g * v));
            }
        }
        Ok(acc)
    }
}

/// A layer's feed-forward block.
pub(crate) enum Mlp {
    Dense(DenseMlp),
    Moe(MoeBlock),
}

impl Mlp {
    pub(crate) fn forward(&self, x: &Mat, prec: Precision) -> Result<Mat> {
        match self {
            Mlp::Dense(m) => m.forward(x, prec),
            Mlp::Moe(m) => m.forward(x, prec),
        }
    }

    pub(crate) fn weight_bytes(&self) -> usize {
        match self {
            Mlp::Dense(m) => m.weight_bytes(),
            Mlp::Moe(m) => m.weight_bytes(),
        }
    }
}
