//! Gated full attention, model-spec §4: per-head interleaved query/gate projection, zero-centred
//! q/k norms, partial RoPE, GQA over a KV cache, sigmoid output gate. The softmax follows the
//! eager reference: scores in the activation dtype, softmax in f32, probabilities rounded back.

use rayon::prelude::*;

use super::load::Loader;
use super::norm::RmsNorm;
use super::rope::Rope;
use super::state::KvCache;
use super::tensor::{Linear, Mat, Precision, dot, sigmoid};
use crate::error::Result;

pub struct AttnLayer {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    /// Fused `[q_proj (query|gate per head) ; k_proj ; v_proj]`.
    qkv: Linear,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    o_proj: Linear,
}

impl AttnLayer {
    pub fn load(
        ld: &Loader,
        p: &str,
        hidden: usize,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        eps: f64,
    ) -> Result<Self> {
        let (qw, kw) = (heads * head_dim, kv_heads * head_dim);
        let qkv = Linear::fused(
            vec![
                (ld.weights(&format!("{p}q_proj.weight"), &[2 * qw, hidden])?, 2 * qw),
                (ld.weights(&format!("{p}k_proj.weight"), &[kw, hidden])?, kw),
                (ld.weights(&format!("{p}v_proj.weight"), &[kw, hidden])?, kw),
            ],
            hidden,
        )?;
        Ok(AttnLayer {
            heads,
            kv_heads,
            head_dim,
            qkv,
            q_norm: RmsNorm::zero_centred(&ld.get(&format!("{p}q_norm.weight"), &[head_dim])?, eps),
            k_norm: RmsNorm::zero_centred(&ld.get(&format!("{p}k_norm.weight"), &[head_dim])?, eps),
            o_proj: ld.linear(&format!("{p}o_proj.weight"), hidden, qw)?,
        })
    }

    pub fn weight_bytes(&self) -> usize {
        self.qkv.weight_bytes()
            + self.o_proj.weight_bytes()
            + (self.q_norm.dim() + self.k_norm.dim()) * std::mem::size_of::<f32>()
    }

    /// Runs `x` (tokens at positions `pos0..`) through the layer, appending to `kv`.
    pub fn forward(&self, x: &Mat, pos0: usize, kv: &mut KvCache, rope: &Rope, prec: Precision) -> Result<Mat> {
        let (t_len, hd, nh, nkv) = (x.rows, self.head_dim, self.heads, self.kv_heads);
        let qw = nh * hd;
        let kw = nkv * hd;
        let proj = self.qkv.forward(x, prec)?;
        let mut q = Mat::zeros(t_len, qw);
        let mut gate = Mat::zeros(t_len, qw);
        for t in 0..t_len {
            let row = proj.row(t);
            let (cos, sin) = rope.cos_sin(pos0 + t, prec);
            for h in 0..nh {
                let src = &row[h * 2 * hd..(h + 1) * 2 * hd];
                let qh = &mut q.row_mut(t)[h * hd..(h + 1) * hd];
                qh.copy_from_slice(&src[..hd]);
                self.q_norm.apply(qh, prec);
                rope.apply(qh, &cos, &sin, prec);
                gate.row_mut(t)[h * hd..(h + 1) * hd].copy_from_slice(&src[hd..]);
            }
            let mut k = row[2 * qw..2 * qw + kw].to_vec();
            for kh in k.chunks_mut(hd) {
                self.k_norm.apply(kh, prec);
                rope.apply(kh, &cos, &sin, prec);
            }
            kv.k.extend_from_slice(&k);
            kv.v.extend_from_slice(&row[2 * qw + kw..2 * qw + 2 * kw]);
        }

        let groups = nh / nkv;
        let scale = (hd as f32).powf(-0.5);
        let mut y = Mat::zeros(t_len, qw);
        let (keys, values) = (&kv.k, &kv.v);
        y.data.par_chunks_mut(qw).enumerate().for_each(|(t, out)| {
            let p = pos0 + t; // attends to positions 0..=p
            let mut scores = vec![0f32; p + 1];
            for h in 0..nh {
                let kvh = h / groups;
                let qh = &q.row(t)[h * hd..(h + 1) * hd];
                let mut max = f32::NEG_INFINITY;
                for (j, s) in scores.iter_mut().enumerate() {
                    let kj = &keys[j * kw + kvh * hd..j * kw + (kvh + 1) * hd];
                    *s = prec.round(prec.round(dot(qh, kj)) * scale);
                    max = max.max(*s);
                }
                let mut sum = 0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let oh = &mut out[h * hd..(h + 1) * hd];
                for (j, s) in scores.iter().enumerate() {
                    let pj = prec.round(s / sum);
                    let vj = &values[j * kw + kvh * hd..j * kw + (kvh + 1) * hd];
                    for (o, v) in oh.iter_mut().zip(vj) {
                        *o += pj * v;
                    }
                }
                for (o, g) in oh.iter_mut().zip(&gate.row(t)[h * hd..(h + 1) * hd]) {
                    *o = prec.round(prec.round(*o) * prec.round(sigmoid(*g)));
                }
            }
        });
        self.o_proj.forward(&y, prec)
    }
}
