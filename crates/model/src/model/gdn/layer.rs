//! The GDN layer: its weights, loaded per family, and its forward pass (conv, gates, the delta
//! rule per value head, the gated RMSNorm, out_proj), with the verify tape and the state trace.

use rayon::prelude::*;

use super::kernels::{HeadInputs, chunked_head, recurrent_from};
use super::stages::{conv_stage, gated_norm_stage, gates_stage, l2norm};
use super::tape::GdnState;
use crate::error::Result;
use crate::model::config::{Family, LinearAttnConfig, ModelConfig};
use crate::model::cpu::tensor::{F32_BYTES, Linear, Mat, Precision};
use crate::model::load::Loader;
use crate::model::storage::Weights;
use crate::model::trace::{GdnPassTrace, head_state_norms};

pub(crate) struct GdnLayer {
    pub(crate) cfg: LinearAttnConfig,
    pub(crate) eps: f32,
    /// Fused input projection; output columns `[q k v | z | b | a]` in logical (un-interleaved)
    /// order for every family.
    pub(crate) in_proj: Linear,
    /// Depthwise conv weights `[conv_dim][K]`.
    /// The depthwise conv's taps, tap-major (`[K][conv_dim]`, the checkpoint's `[conv_dim][1][K]`
    /// transposed at load) so the conv runs across channels in vector registers.
    pub(crate) conv_taps: Vec<f32>,
    /// The stored `A_log` (the GPU kernel forms −exp(A_log) itself).
    pub(crate) a_log: Vec<f32>,
    /// `-exp(A_log)` per value head, f32.
    a_neg: Vec<f32>,
    pub(crate) dt_bias: Vec<f32>,
    /// Gated RMSNorm weight (plain, not zero-centred), shared by all heads.
    pub(crate) norm_w: Vec<f32>,
    pub(crate) out_proj: Linear,
    /// Where each value channel goes in `out_proj`'s input when the matrix keeps a GGUF's
    /// column order (llama.cpp's tiled V heads; quantised columns cannot be moved): `None` for
    /// the model's own order.
    pub(crate) out_input_order: Option<Vec<usize>>,
}

impl GdnLayer {
    /// The layer's weights under `ld` (a layer's `linear_attn.`).
    pub(crate) fn load(model: &ModelConfig, ld: &Loader) -> Result<Self> {
        let (cfg, hidden, eps, family) = (&model.linear, model.hidden_size, model.rms_norm_eps, model.family);
        let (kd, vd, hv, hk) = (cfg.key_dim(), cfg.value_dim(), cfg.num_value_heads, cfg.num_key_heads);
        let (dk, dv, r) = (cfg.key_head_dim, cfg.value_head_dim, cfg.head_ratio());
        let in_proj = match family {
            Family::Qwen3Next => {
                // Fused and grouped per key head g: [q_g | k_g | v_(r·g..) | z_(r·g..)], and
                // [b_(r·g..) | a_(r·g..)]. Reorder rows into the logical [q; k; v; z; b; a].
                let qkvz = ld.weights("in_proj_qkvz.weight", &[2 * kd + 2 * vd, hidden])?;
                let ba = ld.weights("in_proj_ba.weight", &[2 * hv, hidden])?;
                let group = 2 * dk + 2 * r * dv;
                // Each group's rows are a view into the checkpoint: the reorder copies nothing.
                let rows = |m: &Weights, start: usize, n: usize| (m.slice(start * hidden, n * hidden), n);
                let (mut q, mut k, mut v, mut z) = (vec![], vec![], vec![], vec![]);
                let (mut b, mut a) = (vec![], vec![]);
                for g in 0..hk {
                    let base = g * group;
                    q.push(rows(&qkvz, base, dk));
                    k.push(rows(&qkvz, base + dk, dk));
                    v.push(rows(&qkvz, base + 2 * dk, r * dv));
                    z.push(rows(&qkvz, base + 2 * dk + r * dv, r * dv));
                    b.push(rows(&ba, g * 2 * r, r));
                    a.push(rows(&ba, g * 2 * r + r, r));
                }
                Linear::fused([q, k, v, z, b, a].into_iter().flatten().collect(), hidden)?
            }
            Family::Qwen35 | Family::Qwen35Moe => Linear::fused(
                vec![
                    (ld.weights("in_proj_qkv.weight", &[2 * kd + vd, hidden])?, 2 * kd + vd),
                    (ld.weights("in_proj_z.weight", &[vd, hidden])?, vd),
                    (ld.weights("in_proj_b.weight", &[hv, hidden])?, hv),
                    (ld.weights("in_proj_a.weight", &[hv, hidden])?, hv),
                ],
                hidden,
            )?,
        };
        let conv_w = ld.get("conv1d.weight", &[cfg.conv_dim(), 1, cfg.conv_kernel])?;
        let (k, cd) = (cfg.conv_kernel, cfg.conv_dim());
        let conv_taps: Vec<f32> = (0..k * cd).map(|i| conv_w[(i % cd) * k + i / cd]).collect();
        let a_log = ld.get("A_log", &[hv])?;
        let (out_proj, out_input_order) = ld.linear_in_stored_order("out_proj.weight", hidden, vd)?;
        Ok(GdnLayer {
            cfg: cfg.clone(),
            eps: eps as f32,
            in_proj,
            conv_taps,
            a_neg: a_log.iter().map(|a| -crate::model::cpu::math::exp(*a)).collect(),
            a_log,
            dt_bias: ld.get("dt_bias", &[hv])?,
            norm_w: ld.get("norm.weight", &[dv])?,
            out_proj,
            out_input_order,
        })
    }

    pub(crate) fn weight_bytes(&self) -> usize {
        self.in_proj.weight_bytes()
            + self.out_proj.weight_bytes()
            + (self.conv_taps.len() + self.a_neg.len() + self.dt_bias.len() + self.norm_w.len()) * F32_BYTES
    }

    /// Runs the layer over `x`. With `verify`, every token goes through the recurrent rule — the
    /// exact arithmetic of one-token decoding — and a [`GdnTape`](super::GdnTape) is kept so the
    /// state can be rolled back to any prefix of the tokens (speculative decoding). With `trace`,
    /// what the pass did to the state (β and g per
    /// token, the state's norm and change per head): each head copies its state before the rule
    /// and measures it after, on the thread that ran the head, while it is in cache.
    pub(crate) fn forward_traced(
        &self,
        x: &Mat,
        state: &mut GdnState,
        prec: Precision,
        verify: bool,
        trace: bool,
    ) -> Result<(Mat, Option<GdnPassTrace>)> {
        let c = &self.cfg;
        let (t_len, conv_dim, vd, hv) = (x.rows, c.conv_dim(), c.value_dim(), c.num_value_heads);
        let proj = self.in_proj.forward(x, prec)?;
        let mut tape = verify.then(|| {
            // The last pass's buffers: a fresh megabyte per layer would cost more in page
            // faults than the copy itself.
            let mut tp = state.spare.take().map(|b| *b).unwrap_or_default();
            tp.start(state, &proj, c);
            tp
        });

        // 1. Causal depthwise conv + SiLU (kernel: conv1d_decode / conv1d_prefill).
        let (qkv, window) = conv_stage(&proj, &state.conv, &self.conv_taps, conv_dim, c.conv_kernel, prec);
        state.conv = window;

        // 2. Gates (inside the kernel gdn_recurrent).
        let (zo, bo, ao) = (conv_dim, conv_dim + vd, conv_dim + vd + hv);
        let (beta, g) = gates_stage(&proj, bo, ao, &self.a_neg, &self.dt_bias, prec);

        // 3. The delta rule per value head (threaded), then the gated RMSNorm.
        let (dk, dv, r) = (c.key_head_dim, c.value_head_dim, c.head_ratio());
        let kd = c.key_dim();
        let scale = (dk as f32).powf(-0.5);
        let head = |(h, s): (usize, &mut [f32])| -> HeadPass {
            let before = trace.then(|| s.to_vec());
            let kh = h / r;
            let mut q = Vec::with_capacity(t_len * dk);
            let mut kk = Vec::with_capacity(t_len * dk);
            let mut v = Vec::with_capacity(t_len * dv);
            for t in 0..t_len {
                let row = qkv.row(t);
                q.extend_from_slice(&row[kh * dk..(kh + 1) * dk]);
                kk.extend_from_slice(&row[kd + kh * dk..kd + (kh + 1) * dk]);
                v.extend_from_slice(&row[2 * kd + h * dv..2 * kd + (h + 1) * dv]);
            }
            for t in 0..t_len {
                l2norm(&mut q[t * dk..(t + 1) * dk]);
                l2norm(&mut kk[t * dk..(t + 1) * dk]);
            }
            let gh: Vec<f32> = (0..t_len).map(|t| g[t * hv + h]).collect();
            let bh: Vec<f32> = (0..t_len).map(|t| beta[t * hv + h]).collect();
            if t_len == 1 || verify {
                for x in &mut q {
                    *x /= (dk as f32).sqrt();
                }
                let mut deltas = if verify { vec![0.0; t_len * dv] } else { vec![] };
                let from = tape.as_ref().map(|tp| &tp.base_ssm[h * dk * dv..(h + 1) * dk * dv]);
                let inputs = HeadInputs { q: &q, k: &kk, v: &v, g: &gh, beta: &bh, dk, dv };
                let out = recurrent_from(&inputs, from, s, verify.then_some(deltas.as_mut_slice()));
                if !verify {
                    deltas.clear();
                }
                let norms = before.map(|b| head_state_norms(&b, s));
                HeadPass { out, deltas, keys: if verify { kk } else { vec![] }, norms }
            } else {
                for x in &mut q {
                    *x *= scale;
                }
                let out = chunked_head(&HeadInputs { q: &q, k: &kk, v: &v, g: &gh, beta: &bh, dk, dv }, s);
                HeadPass { out, deltas: vec![], keys: vec![], norms: before.map(|b| head_state_norms(&b, s)) }
            }
        };
        // Threads only pay off once a head's work outweighs the hand-off (not for the demo model).
        let results: Vec<HeadPass> = if t_len * dk * dv < 1 << 14 {
            state.ssm.chunks_mut(dk * dv).enumerate().map(head).collect()
        } else {
            state.ssm.par_chunks_mut(dk * dv).enumerate().map(head).collect()
        };
        if let Some(tp) = tape.as_mut() {
            for (h, HeadPass { deltas, keys, .. }) in results.iter().enumerate() {
                for t in 0..t_len {
                    tp.delta[(t * hv + h) * dv..(t * hv + h + 1) * dv].copy_from_slice(&deltas[t * dv..(t + 1) * dv]);
                    tp.k[(t * hv + h) * dk..(t * hv + h + 1) * dk].copy_from_slice(&keys[t * dk..(t + 1) * dk]);
                    tp.g[t * hv + h] = g[t * hv + h];
                }
            }
        }
        state.tape = tape;
        let heads: Vec<&Vec<f32>> = results.iter().map(|r| &r.out).collect();

        // 4. The gated RMSNorm per value head (kernel: rms_norm_gated), then out_proj.
        let normed = gated_norm_stage(&heads, &proj, zo, dv, &self.norm_w, self.eps, prec);
        let traced = trace.then(|| {
            let norms: Vec<(f32, f32, u32)> = results.iter().filter_map(|r| r.norms).collect();
            let column = |o: usize| (0..t_len * hv).map(|i| proj.row(i / hv)[o + i % hv]).collect();
            GdnPassTrace {
                tokens: t_len,
                heads: hv,
                beta,
                g,
                a: column(ao),
                b: column(bo),
                gates_bf16: prec == Precision::Bf16,
                state_norm: norms.iter().map(|n| n.0).collect(),
                delta_norm: norms.iter().map(|n| n.1).collect(),
                nonfinite: norms.iter().map(|n| n.2).collect(),
            }
        });
        let normed = match &self.out_input_order {
            // The matrix's columns are in the file's order: the input goes there too.
            Some(order) => {
                let mut moved = Mat::zeros(normed.rows, normed.cols);
                for (dst, src) in moved.data.chunks_exact_mut(normed.cols).zip(normed.data.chunks_exact(normed.cols)) {
                    for (&to, &v) in order.iter().zip(src) {
                        dst[to] = v;
                    }
                }
                moved
            }
            None => normed,
        };
        Ok((self.out_proj.forward(&normed, prec)?, traced))
    }
}

/// What the delta rule of one value head returned over one pass.
struct HeadPass {
    /// `[T][dv]` outputs.
    out: Vec<f32>,
    /// Verify passes: the per-token deltas and keys the tape keeps.
    deltas: Vec<f32>,
    keys: Vec<f32>,
    /// Traced passes: (‖S‖, ‖ΔS‖, non-finite entries) after the pass.
    norms: Option<(f32, f32, u32)>,
}
