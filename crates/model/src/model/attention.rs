//! Gated full attention, model-spec §4: per-head interleaved query/gate projection, zero-centred
//! q/k norms, partial RoPE, GQA over a KV cache, sigmoid output gate. The softmax follows the
//! eager reference: scores in the activation dtype, softmax in f32, probabilities rounded back.

use rayon::prelude::*;

use super::config::ModelConfig;
use super::cpu::gemv::MAX_ROWS as GEMV_MAX_ROWS;
use super::cpu::math;
use super::cpu::subnormal::Flush;
use super::cpu::tensor::{Linear, Mat, Precision, dot, sigmoid, small_gemm};
use super::load::Loader;
use super::norm::RmsNorm;
use super::rope::Rope;
use super::state::KvCache;
use crate::error::Result;

pub(crate) struct AttnLayer {
    pub(crate) heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    /// Fused `[q_proj (query|gate per head) ; k_proj ; v_proj]`.
    pub(crate) qkv: Linear,
    pub(crate) q_norm: RmsNorm,
    pub(crate) k_norm: RmsNorm,
    pub(crate) o_proj: Linear,
}

impl AttnLayer {
    /// The layer's weights under `ld` (a layer's `self_attn.`).
    pub(crate) fn load(cfg: &ModelConfig, ld: &Loader) -> Result<Self> {
        let (hidden, heads, kv_heads) = (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads);
        let (head_dim, eps) = (cfg.head_dim, cfg.rms_norm_eps);
        let (qw, kw) = (heads * head_dim, kv_heads * head_dim);
        let qkv = Linear::fused(
            vec![
                (ld.weights("q_proj.weight", &[2 * qw, hidden])?, 2 * qw),
                (ld.weights("k_proj.weight", &[kw, hidden])?, kw),
                (ld.weights("v_proj.weight", &[kw, hidden])?, kw),
            ],
            hidden,
        )?;
        Ok(AttnLayer {
            heads,
            kv_heads,
            head_dim,
            qkv,
            q_norm: RmsNorm::zero_centred(&ld.get("q_norm.weight", &[head_dim])?, eps),
            k_norm: RmsNorm::zero_centred(&ld.get("k_norm.weight", &[head_dim])?, eps),
            o_proj: ld.linear("o_proj.weight", hidden, qw)?,
        })
    }

    pub(crate) fn weight_bytes(&self) -> usize {
        self.qkv.weight_bytes()
            + self.o_proj.weight_bytes()
            + (self.q_norm.dim() + self.k_norm.dim()) * std::mem::size_of::<f32>()
    }

    /// Runs `x` (tokens at positions `pos0..`) through the layer, appending to `kv`.
    pub(crate) fn forward(&self, x: &Mat, pos0: usize, kv: &mut KvCache, rope: &Rope, prec: Precision) -> Result<Mat> {
        let (t_len, hd, nh, nkv) = (x.rows, self.head_dim, self.heads, self.kv_heads);
        let qw = nh * hd;
        let kw = nkv * hd;
        let proj = self.qkv.forward(x, prec)?;
        // Per token: queries and keys normed and rotated, gates split off (rows in parallel).
        let (mut q, mut gate, mut k) = (Mat::zeros(t_len, qw), Mat::zeros(t_len, qw), Mat::zeros(t_len, kw));
        q.for_rows(|t, qt| {
            let (cos, sin) = rope.cos_sin(pos0 + t, prec);
            for (h, qh) in qt.chunks_mut(hd).enumerate() {
                qh.copy_from_slice(&proj.row(t)[h * 2 * hd..h * 2 * hd + hd]);
                self.q_norm.apply(qh, prec);
                rope.apply(qh, &cos, &sin, prec);
            }
        });
        gate.for_rows(|t, gt| {
            for (h, gh) in gt.chunks_mut(hd).enumerate() {
                gh.copy_from_slice(&proj.row(t)[h * 2 * hd + hd..(h + 1) * 2 * hd]);
            }
        });
        k.for_rows(|t, kt| {
            let (cos, sin) = rope.cos_sin(pos0 + t, prec);
            kt.copy_from_slice(&proj.row(t)[2 * qw..2 * qw + kw]);
            for kh in kt.chunks_mut(hd) {
                self.k_norm.apply(kh, prec);
                rope.apply(kh, &cos, &sin, prec);
            }
        });
        kv.k.extend_from_slice(&k.data);
        for t in 0..t_len {
            kv.v.extend_from_slice(&proj.row(t)[2 * qw + kw..2 * qw + 2 * kw]);
        }
        let mut y = if t_len > GEMV_MAX_ROWS {
            self.prefill_heads(&q, pos0, kv, prec)
        } else {
            self.decode_heads(&q, pos0, kv, prec)
        };
        y.for_rows(|t, out| {
            for (o, g) in out.iter_mut().zip(gate.row(t)) {
                *o = prec.round(prec.round(*o) * prec.round(sigmoid(*g)));
            }
        });
        self.o_proj.forward(&y, prec)
    }

    /// A decode step or verify pass (≤ 8 tokens): see [`attend_decode`].
    fn decode_heads(&self, q: &Mat, pos0: usize, kv: &KvCache, prec: Precision) -> Mat {
        attend_decode(q, pos0, &kv.k, &kv.v, self.heads, self.kv_heads, self.head_dim, prec)
    }

    /// A prefill: per head and block of 64 queries, the scores `Q·Kᵀ` and the output `P·V` as
    /// matrix products (the GEMM's kernels, on all threads over heads and blocks), the same
    /// roundings as [`AttnLayer::decode_heads`] around them.
    fn prefill_heads(&self, q: &Mat, pos0: usize, kv: &KvCache, prec: Precision) -> Mat {
        const BLOCK: usize = 64;
        let (hd, nh, kw) = (self.head_dim, self.heads, self.kv_heads * self.head_dim);
        let (groups, qw, t_len) = (nh / self.kv_heads, nh * hd, q.rows);
        let scale = (hd as f32).powf(-0.5);
        let blocks = t_len.div_ceil(BLOCK);
        let outputs: Vec<Vec<f32>> = (0..nh * blocks)
            .into_par_iter()
            .map(|task| {
                // Softmax weights far below f32's normal range are flushed to zero (`subnormal`).
                let _flush = Flush::new();
                let (h, t0) = (task / blocks, (task % blocks) * BLOCK);
                let (n, kvh) = (BLOCK.min(t_len - t0), h / groups);
                let keys = pos0 + t0 + n; // the block's last query sees keys 0..keys
                let mut scores = vec![0f32; n * keys];
                let qh = (&q.data[t0 * qw + h * hd..], qw, 1);
                small_gemm(n, keys, hd, &mut scores, keys, None, qh, (&kv.k[kvh * hd..], 1, kw), 1.0);
                for (i, row) in scores.chunks_mut(keys).enumerate() {
                    let visible = pos0 + t0 + i + 1;
                    for s in &mut row[..visible] {
                        *s = prec.round(prec.round(*s) * scale);
                    }
                    softmax_rounded(&mut row[..visible], prec);
                    row[visible..].fill(0.0);
                }
                let mut out = vec![0f32; n * hd];
                small_gemm(n, hd, keys, &mut out, hd, None, (&scores, keys, 1), (&kv.v[kvh * hd..], kw, 1), 1.0);
                out
            })
            .collect();
        let mut y = Mat::zeros(t_len, qw);
        for (task, out) in outputs.iter().enumerate() {
            let (h, t0) = (task / blocks, (task % blocks) * BLOCK);
            for (i, o) in out.chunks(hd).enumerate() {
                y.row_mut(t0 + i)[h * hd..(h + 1) * hd].copy_from_slice(o);
            }
        }
        y
    }
}

/// Attention of `q` (`[T][heads·hd]`, normed and rotated) at positions `pos0 ..` over the keys
/// and values `[positions][kv_heads·hd]` (this pass's included), causal, GQA: per query and
/// head, one dot product per key — the order every token of a verify pass shares with a
/// one-token step. Scores `round(round(q·k)·scale)`, softmax in f32 with the probabilities
/// rounded, `P·V` in f32 (not rounded: the caller rounds with the output gate). The CPU twin
/// of `attn_gqa` in `kernels/attention.cu`.
#[allow(clippy::too_many_arguments)]
pub fn attend_decode(
    q: &Mat,
    pos0: usize,
    keys: &[f32],
    values: &[f32],
    nh: usize,
    kv_heads: usize,
    hd: usize,
    prec: Precision,
) -> Mat {
    let kw = kv_heads * hd;
    let groups = nh / kv_heads;
    let scale = (hd as f32).powf(-0.5);
    let mut y = Mat::zeros(q.rows, nh * hd);
    y.data.par_chunks_mut(nh * hd).enumerate().for_each(|(t, out)| {
        let p = pos0 + t; // attends to positions 0..=p
        let mut scores = vec![0f32; p + 1];
        for h in 0..nh {
            let kvh = h / groups;
            let qh = &q.row(t)[h * hd..(h + 1) * hd];
            for (j, s) in scores.iter_mut().enumerate() {
                let kj = &keys[j * kw + kvh * hd..j * kw + (kvh + 1) * hd];
                *s = prec.round(prec.round(dot(qh, kj)) * scale);
            }
            softmax_rounded(&mut scores, prec);
            let oh = &mut out[h * hd..(h + 1) * hd];
            for (j, pj) in scores.iter().enumerate() {
                let vj = &values[j * kw + kvh * hd..j * kw + (kvh + 1) * hd];
                for (o, v) in oh.iter_mut().zip(vj) {
                    *o += pj * v;
                }
            }
        }
    });
    y
}

/// Softmax in f32 over `scores`, the probabilities rounded to the activation dtype.
fn softmax_rounded(scores: &mut [f32], prec: Precision) {
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
    let mut sum = 0f32;
    for s in scores.iter_mut() {
        *s = math::exp(*s - max);
        sum += *s;
    }
    for s in scores.iter_mut() {
        *s = prec.round(*s / sum);
    }
}
