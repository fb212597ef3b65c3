//! Gated DeltaNet (linear attention) layer, model-spec §3.
//!
//! The recurrent rule (decode) and the chunked rule (prefill, C = 64) are direct f32 loops over
//! the per-head `[dk, dv]` state, threaded over value heads: the state is small and the work per
//! head is a handful of rank-1 updates and mat-vecs, which chains of tiny tensor ops would drown
//! in overhead.

use rayon::prelude::*;

use super::config::{Family, LinearAttnConfig};
use super::cpu::Simd;
use super::cpu::tensor::{F32_BYTES, Linear, Mat, Precision, dot, sigmoid, silu, small_gemm, softplus};
use super::load::Loader;
use super::state::GdnState;
use super::storage::Weights;
use super::trace::{GdnPassTrace, head_state_norms};
use crate::error::Result;

pub const CHUNK: usize = 64;

pub struct GdnLayer {
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
}

impl GdnLayer {
    pub fn load(ld: &Loader, p: &str, cfg: &LinearAttnConfig, hidden: usize, eps: f64, family: Family) -> Result<Self> {
        let (kd, vd, hv, hk) = (cfg.key_dim(), cfg.value_dim(), cfg.num_value_heads, cfg.num_key_heads);
        let (dk, dv, r) = (cfg.key_head_dim, cfg.value_head_dim, cfg.head_ratio());
        let in_proj = match family {
            Family::Qwen3Next => {
                // Fused and grouped per key head g: [q_g | k_g | v_(r·g..) | z_(r·g..)], and
                // [b_(r·g..) | a_(r·g..)]. Reorder rows into the logical [q; k; v; z; b; a].
                let qkvz = ld.weights(&format!("{p}in_proj_qkvz.weight"), &[2 * kd + 2 * vd, hidden])?;
                let ba = ld.weights(&format!("{p}in_proj_ba.weight"), &[2 * hv, hidden])?;
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
                    (ld.weights(&format!("{p}in_proj_qkv.weight"), &[2 * kd + vd, hidden])?, 2 * kd + vd),
                    (ld.weights(&format!("{p}in_proj_z.weight"), &[vd, hidden])?, vd),
                    (ld.weights(&format!("{p}in_proj_b.weight"), &[hv, hidden])?, hv),
                    (ld.weights(&format!("{p}in_proj_a.weight"), &[hv, hidden])?, hv),
                ],
                hidden,
            )?,
        };
        let conv_w = ld.get(&format!("{p}conv1d.weight"), &[cfg.conv_dim(), 1, cfg.conv_kernel])?;
        let (k, cd) = (cfg.conv_kernel, cfg.conv_dim());
        let conv_taps: Vec<f32> = (0..k * cd).map(|i| conv_w[(i % cd) * k + i / cd]).collect();
        let a_log = ld.get(&format!("{p}A_log"), &[hv])?;
        Ok(GdnLayer {
            cfg: cfg.clone(),
            eps: eps as f32,
            in_proj,
            conv_taps,
            a_neg: a_log.iter().map(|a| -a.exp()).collect(),
            a_log,
            dt_bias: ld.get(&format!("{p}dt_bias"), &[hv])?,
            norm_w: ld.get(&format!("{p}norm.weight"), &[dv])?,
            out_proj: ld.linear(&format!("{p}out_proj.weight"), hidden, vd)?,
        })
    }

    pub fn weight_bytes(&self) -> usize {
        self.in_proj.weight_bytes()
            + self.out_proj.weight_bytes()
            + (self.conv_taps.len() + self.a_neg.len() + self.dt_bias.len() + self.norm_w.len()) * F32_BYTES
    }

    /// Runs the layer over `x`. With `verify`, every token goes through the recurrent rule — the
    /// exact arithmetic of one-token decoding — and a [`GdnTape`] is kept so the state can be
    /// rolled back to any prefix of the tokens (speculative decoding).
    pub fn forward(&self, x: &Mat, state: &mut GdnState, prec: Precision, verify: bool) -> Result<Mat> {
        Ok(self.forward_traced(x, state, prec, verify, false)?.0)
    }

    /// [`GdnLayer::forward`], and with `trace` what the pass did to the state (β and g per
    /// token, the state's norm and change per head): each head copies its state before the rule
    /// and measures it after, on the thread that ran the head, while it is in cache.
    pub fn forward_traced(
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
            tp.start(state, &proj, conv_dim, t_len, hv * c.key_head_dim, hv * c.value_head_dim, hv);
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
                let out =
                    recurrent_from(from, &q, &kk, &v, &gh, &bh, s, dk, dv, verify.then_some(deltas.as_mut_slice()));
                if !verify {
                    deltas.clear();
                }
                let norms = before.map(|b| head_state_norms(&b, s));
                HeadPass { out, deltas, keys: if verify { kk } else { vec![] }, norms }
            } else {
                for x in &mut q {
                    *x *= scale;
                }
                let out = chunked_head(&q, &kk, &v, &gh, &bh, s, dk, dv);
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
        let normed = gated_norm_stage(&heads, &proj, zo, hv, dv, &self.norm_w, self.eps, prec);
        let traced = trace.then(|| {
            let norms: Vec<(f32, f32, u32)> = results.iter().filter_map(|r| r.norms).collect();
            GdnPassTrace {
                tokens: t_len,
                heads: hv,
                beta,
                g,
                state_norm: norms.iter().map(|n| n.0).collect(),
                delta_norm: norms.iter().map(|n| n.1).collect(),
                nonfinite: norms.iter().map(|n| n.2).collect(),
            }
        });
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

/// Stage 1 of a GDN layer: the causal depthwise conv and SiLU over `[window; inputs]` for the
/// q/k/v columns of the input projection `proj` (`[T][conv_dim + …]`). `window` holds the last
/// K−1 pre-conv inputs (`[K−1][conv_dim]`, oldest first), `taps` the conv weights tap-major
/// (`[K][conv_dim]`). Returns the conv outputs `[T][conv_dim]` and the window after them.
/// The CPU twin of `kernels/conv1d.cu`.
pub fn conv_stage(
    proj: &Mat,
    window: &[f32],
    taps: &[f32],
    conv_dim: usize,
    k: usize,
    prec: Precision,
) -> (Mat, Vec<f32>) {
    let t_len = proj.rows;
    let mut qkv = Mat::zeros(t_len, conv_dim);
    let input_row = |tau: isize| -> &[f32] {
        if tau < 0 {
            let r = ((k - 1) as isize + tau) as usize;
            &window[r * conv_dim..(r + 1) * conv_dim]
        } else {
            &proj.row(tau as usize)[..conv_dim]
        }
    };
    qkv.for_rows(|t, out| {
        // Per channel, the taps are added in order from 0, as the scalar loop over a
        // channel's taps adds them (the same bits), but across the channels at once.
        for j in 0..k {
            let src = input_row(t as isize - (k as isize - 1) + j as isize);
            let taps = &taps[j * conv_dim..(j + 1) * conv_dim];
            for ((o, w), x) in out.iter_mut().zip(taps).zip(src) {
                *o += w * x;
            }
        }
        for o in out.iter_mut() {
            // PyTorch's fallback rounds the conv output, then the SiLU output.
            *o = prec.round(silu(prec.round(*o)));
        }
    });
    let mut next = Vec::with_capacity((k - 1) * conv_dim);
    for tau in (t_len as isize - (k as isize - 1))..t_len as isize {
        next.extend_from_slice(input_row(tau));
    }
    (qkv, next)
}

/// Stage 2: the gates per token and value head, from the projection's `b` and `a` columns (at
/// `bo` and `ao`): beta = sigmoid(b) in the activation dtype; g = −exp(A_log)·softplus(a +
/// dt_bias) in f32 (`a_neg` = −exp(A_log)). Returns `(beta, g)`, each `[T][Hv]`.
pub fn gates_stage(
    proj: &Mat,
    bo: usize,
    ao: usize,
    a_neg: &[f32],
    dt_bias: &[f32],
    prec: Precision,
) -> (Vec<f32>, Vec<f32>) {
    let (t_len, hv) = (proj.rows, a_neg.len());
    let mut beta = vec![0f32; t_len * hv];
    let mut g = vec![0f32; t_len * hv];
    for t in 0..t_len {
        let row = proj.row(t);
        for h in 0..hv {
            beta[t * hv + h] = prec.round(sigmoid(row[bo + h]));
            g[t * hv + h] = a_neg[h] * softplus(row[ao + h] + dt_bias[h]);
        }
    }
    (beta, g)
}

/// Stage 4: the gated RMSNorm of each value head's output (`heads[h]` is `[T][dv]`) with the
/// projection's z columns (at `zo`): norm in f32 → dtype, × weight in dtype, × silu(z) in f32 →
/// dtype. Returns `[T][Hv·dv]`. The CPU twin of `rms_norm_gated` in `kernels/norm.cu`.
#[allow(clippy::too_many_arguments)]
pub fn gated_norm_stage(
    heads: &[&Vec<f32>],
    proj: &Mat,
    zo: usize,
    hv: usize,
    dv: usize,
    norm_w: &[f32],
    eps: f32,
    prec: Precision,
) -> Mat {
    let mut normed = Mat::zeros(proj.rows, hv * dv);
    normed.for_rows(|t, out| {
        let z = &proj.row(t)[zo..zo + hv * dv];
        for h in 0..hv {
            let o = &mut out[h * dv..(h + 1) * dv];
            for (x, y) in o.iter_mut().zip(&heads[h][t * dv..(t + 1) * dv]) {
                *x = prec.round(*y);
            }
            let inv = super::norm::rsqrt_mean_square(o, eps);
            for (i, x) in o.iter_mut().enumerate() {
                let n = prec.round(norm_w[i] * prec.round(*x * inv));
                *x = prec.round(n * silu(z[h * dv + i]));
            }
        }
    });
    normed
}

/// `x · rsqrt(Σx² + 1e-6)` (the FLA convention transformers follows).
#[inline]
fn l2norm(x: &mut [f32]) {
    let inv = 1.0 / (dot(x, x) + 1e-6).sqrt();
    for v in x {
        *v *= inv;
    }
}

/// The recurrent rule over `T` tokens of one head (model-spec §3.6). `s` is `[dk][dv]`.
/// Returns the outputs `[T][dv]`.
///
/// The loops run along `dv` and are compiled for the widest vector unit the CPU has
/// (AVX-512, AVX2, else the baseline); a multiply and an add are never fused, so every
/// instruction set gives the same bits, and [`replay_head`] (compiled the same way) the bits
/// of having decoded.
#[allow(clippy::too_many_arguments)]
pub fn recurrent_head(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    s: &mut [f32],
    dk: usize,
    dv: usize,
    deltas: Option<&mut [f32]>,
) -> Vec<f32> {
    recurrent_from(None, q, k, v, g, beta, s, dk, dv, deltas)
}

/// [`recurrent_head`] starting from the state `from` (written to `s` on the way) when given,
/// else from `s` itself.
#[allow(clippy::too_many_arguments)]
fn recurrent_from(
    from: Option<&[f32]>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    s: &mut [f32],
    dk: usize,
    dv: usize,
    deltas: Option<&mut [f32]>,
) -> Vec<f32> {
    #[cfg(target_arch = "x86_64")]
    match Simd::detect() {
        // SAFETY: the CPU has the instruction set (detected at run time).
        Simd::Avx512 => return unsafe { vector::recurrent_avx512(from, q, k, v, g, beta, s, dk, dv, deltas) },
        Simd::Avx2 => return unsafe { vector::recurrent_avx2(from, q, k, v, g, beta, s, dk, dv, deltas) },
        Simd::Portable => {}
    }
    recurrent_body(from, q, k, v, g, beta, s, dk, dv, deltas)
}

/// [`recurrent_head`] and [`replay_head`] compiled for AVX-512 and AVX2 (the same source).
#[cfg(target_arch = "x86_64")]
mod vector {
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn recurrent_avx512(
        from: Option<&[f32]>,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: &[f32],
        beta: &[f32],
        s: &mut [f32],
        dk: usize,
        dv: usize,
        deltas: Option<&mut [f32]>,
    ) -> Vec<f32> {
        super::recurrent_body(from, q, k, v, g, beta, s, dk, dv, deltas)
    }

    #[target_feature(enable = "avx2")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn recurrent_avx2(
        from: Option<&[f32]>,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        g: &[f32],
        beta: &[f32],
        s: &mut [f32],
        dk: usize,
        dv: usize,
        deltas: Option<&mut [f32]>,
    ) -> Vec<f32> {
        super::recurrent_body(from, q, k, v, g, beta, s, dk, dv, deltas)
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn replay_avx512(s: &mut [f32], k: &[f32], delta: &[f32], g: &[f32], dk: usize, dv: usize) {
        super::replay_body(s, k, delta, g, dk, dv)
    }

    #[target_feature(enable = "avx2")]
    pub unsafe fn replay_avx2(s: &mut [f32], k: &[f32], delta: &[f32], g: &[f32], dk: usize, dv: usize) {
        super::replay_body(s, k, delta, g, dk, dv)
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn recurrent_body(
    from: Option<&[f32]>,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    s: &mut [f32],
    dk: usize,
    dv: usize,
    mut deltas: Option<&mut [f32]>,
) -> Vec<f32> {
    let t_len = g.len();
    let mut out = vec![0f32; t_len * dv];
    let mut kv = vec![0f32; dv];
    let mut delta = vec![0f32; dv];
    for t in 0..t_len {
        let (qt, kt, vt) = (&q[t * dk..(t + 1) * dk], &k[t * dk..(t + 1) * dk], &v[t * dv..(t + 1) * dv]);
        let decay = g[t].exp();
        kv.fill(0.0);
        for a in 0..dk {
            let row = &mut s[a * dv..(a + 1) * dv];
            if let (0, Some(b)) = (t, from) {
                row.copy_from_slice(&b[a * dv..(a + 1) * dv]);
            }
            for (x, acc) in row.iter_mut().zip(kv.iter_mut()) {
                *x *= decay;
                *acc += *x * kt[a];
            }
        }
        for j in 0..dv {
            delta[j] = (vt[j] - kv[j]) * beta[t];
        }
        if let Some(d) = deltas.as_deref_mut() {
            d[t * dv..(t + 1) * dv].copy_from_slice(&delta);
        }
        let o = &mut out[t * dv..(t + 1) * dv];
        for a in 0..dk {
            let row = &mut s[a * dv..(a + 1) * dv];
            for j in 0..dv {
                row[j] += kt[a] * delta[j];
                o[j] += row[j] * qt[a];
            }
        }
    }
    out
}

/// Rebuilds a head's state after `T` tokens from the state before them and each token's key,
/// gate and `δ`: the same decay and rank-1 update as [`recurrent_head`], in the same order, so the
/// result is bit-identical to having decoded those tokens.
pub fn replay_head(s: &mut [f32], k: &[f32], delta: &[f32], g: &[f32], dk: usize, dv: usize) {
    #[cfg(target_arch = "x86_64")]
    match Simd::detect() {
        // SAFETY: the CPU has the instruction set (detected at run time).
        Simd::Avx512 => return unsafe { vector::replay_avx512(s, k, delta, g, dk, dv) },
        Simd::Avx2 => return unsafe { vector::replay_avx2(s, k, delta, g, dk, dv) },
        Simd::Portable => {}
    }
    replay_body(s, k, delta, g, dk, dv)
}

#[inline(always)]
fn replay_body(s: &mut [f32], k: &[f32], delta: &[f32], g: &[f32], dk: usize, dv: usize) {
    for t in 0..g.len() {
        let decay = g[t].exp();
        for x in s.iter_mut() {
            *x *= decay;
        }
        let (kt, dt) = (&k[t * dk..(t + 1) * dk], &delta[t * dv..(t + 1) * dv]);
        for a in 0..dk {
            let row = &mut s[a * dv..(a + 1) * dv];
            for j in 0..dv {
                row[j] += kt[a] * dt[j];
            }
        }
    }
}

/// What a verify pass of a GDN layer keeps so that the state can be rolled back to any prefix of
/// its tokens.
///
/// Rollback scheme, chosen by measured cost: instead of a state snapshot after every verified
/// token ((K+1) copies of `[Hv, dk, dv]` per layer per step — 3 MiB per layer for Qwen3.6-27B),
/// keep one copy of the state before the pass plus each token's key, gate and delta
/// (`Hv·(dk+dv+1)` floats per token: 0.26 % of a state for 128-wide heads), and replay the
/// accepted prefix on rejection. A full acceptance needs no replay at all.
///
/// Measured with `deltascope bench --rollback` on one Qwen3.6-27B-shaped layer (48 heads ×
/// 128 × 128, f32, 2-core CPU): copying the state takes 0.31 ms and replaying one token 0.15 ms,
/// so at K = 2 per-position snapshots cost 0.92 ms on every step while the tape costs 0.31 ms
/// plus at most 0.30 ms, and only when a draft is rejected. Memory: one state per layer instead
/// of K + 1.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GdnTape {
    pub base_conv: Vec<f32>,
    pub base_ssm: Vec<f32>,
    /// Pre-conv inputs of the verified tokens, `[T][conv_dim]` (they rebuild the conv window).
    pub inputs: Vec<f32>,
    /// `[T][Hv][dk]`, l2-normalised keys.
    pub k: Vec<f32>,
    /// `[T][Hv][dv]`.
    pub delta: Vec<f32>,
    /// `[T][Hv]`, log decays.
    pub g: Vec<f32>,
    pub tokens: usize,
}

impl GdnTape {
    pub fn bytes(&self) -> usize {
        (self.base_conv.len()
            + self.base_ssm.len()
            + self.inputs.len()
            + self.k.len()
            + self.delta.len()
            + self.g.len())
            * F32_BYTES
    }

    /// Starts a pass of `tokens` over `state`, reusing this tape's buffers: the state before it
    /// and the pass's pre-conv inputs (the first `conv_dim` columns of `proj`).
    #[allow(clippy::too_many_arguments)]
    fn start(
        &mut self,
        state: &mut GdnState,
        proj: &Mat,
        conv_dim: usize,
        tokens: usize,
        keys: usize,
        values: usize,
        heads: usize,
    ) {
        let refill = |v: &mut Vec<f32>, from: &[f32]| {
            v.clear();
            v.extend_from_slice(from);
        };
        refill(&mut self.base_conv, &state.conv);
        // The state before the pass moves into the tape, and the recurrent rule writes the new
        // one into the tape's old buffer, reading the first token's decay from here: no copy.
        std::mem::swap(&mut self.base_ssm, &mut state.ssm);
        state.ssm.resize(self.base_ssm.len(), 0.0);
        self.inputs.clear();
        for t in 0..tokens {
            self.inputs.extend_from_slice(&proj.row(t)[..conv_dim]);
        }
        for (v, n) in [(&mut self.k, keys), (&mut self.delta, values), (&mut self.g, heads)] {
            v.clear();
            v.resize(tokens * n, 0.0);
        }
        self.tokens = tokens;
    }

    /// Sets `conv` and `ssm` to the state after the first `keep` tokens of the pass.
    pub fn rebuild(&self, keep: usize, cfg: &LinearAttnConfig, conv: &mut Vec<f32>, ssm: &mut Vec<f32>) {
        let (hv, dk, dv, conv_dim, kw) =
            (cfg.num_value_heads, cfg.key_head_dim, cfg.value_head_dim, cfg.conv_dim(), cfg.conv_kernel - 1);
        // Conv window: the last K-1 rows of [base window; inputs of the kept tokens].
        let mut rows: Vec<&[f32]> = self.base_conv.chunks(conv_dim).collect();
        rows.extend(self.inputs.chunks(conv_dim).take(keep));
        conv.clear();
        for r in &rows[rows.len() - kw..] {
            conv.extend_from_slice(r);
        }
        ssm.clear();
        ssm.extend_from_slice(&self.base_ssm);
        for (h, s) in ssm.chunks_mut(dk * dv).enumerate() {
            let k: Vec<f32> =
                (0..keep).flat_map(|t| self.k[(t * hv + h) * dk..(t * hv + h + 1) * dk].iter().copied()).collect();
            let d: Vec<f32> =
                (0..keep).flat_map(|t| self.delta[(t * hv + h) * dv..(t * hv + h + 1) * dv].iter().copied()).collect();
            let g: Vec<f32> = (0..keep).map(|t| self.g[t * hv + h]).collect();
            replay_head(s, &k, &d, &g, dk, dv);
        }
    }
}

/// The chunked rule (model-spec §3.7, chunk 64, boundaries at the start of the call) over `T`
/// tokens of one head, in transformers' formulation (`torch_chunk_gated_delta_rule`): within a
/// chunk the sequential delta updates become `T = (I + A)⁻¹` (a 64×64 forward substitution)
/// and matrix products, which run on the GEMM's SIMD kernels on the calling thread (the
/// caller threads over heads); chunks are scanned in order. Mathematically identical to
/// [`recurrent_head`]. Returns the outputs `[T][dv]`.
#[allow(clippy::too_many_arguments)]
pub fn chunked_head(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    s: &mut [f32],
    dk: usize,
    dv: usize,
) -> Vec<f32> {
    let t_len = g.len();
    let mut out = vec![0f32; t_len * dv];
    let mut cum = vec![0f32; CHUNK];
    // exp(G_i − G_j) for j ≤ i (zero above the diagonal), shared by A and P.
    let mut decay = vec![0f32; CHUNK * CHUNK];
    let mut a_mat = vec![0f32; CHUNK * CHUNK];
    let mut t_mat = vec![0f32; CHUNK * CHUNK];
    let mut p_mat = vec![0f32; CHUNK * CHUNK];
    let mut kb = vec![0f32; CHUNK * dk];
    let mut vb = vec![0f32; CHUNK * dv];
    let mut w = vec![0f32; CHUNK * dk];
    let mut qe = vec![0f32; CHUNK * dk];
    let mut vnew = vec![0f32; CHUNK * dv];
    for c0 in (0..t_len).step_by(CHUNK) {
        let n = CHUNK.min(t_len - c0);
        let qc = &q[c0 * dk..(c0 + n) * dk];
        let kc = &k[c0 * dk..(c0 + n) * dk];
        let vc = &v[c0 * dv..(c0 + n) * dv];
        let mut acc = 0f32;
        for i in 0..n {
            acc += g[c0 + i];
            cum[i] = acc;
        }
        for i in 0..n {
            let row = &mut decay[i * CHUNK..i * CHUNK + n];
            for (j, d) in row.iter_mut().enumerate() {
                *d = if j <= i { (cum[i] - cum[j]).exp() } else { 0.0 };
            }
            let b = beta[c0 + i];
            let eg = cum[i].exp();
            for a in 0..dk {
                kb[i * dk + a] = kc[i * dk + a] * b;
                qe[i * dk + a] = qc[i * dk + a] * eg;
            }
            for j in 0..dv {
                vb[i * dv + j] = vc[i * dv + j] * b;
            }
        }
        // A[i][j] = (kβ_i · k_j)·exp(G_i − G_j) for j < i.
        small_gemm(n, n, dk, &mut a_mat, CHUNK, None, (&kb, dk, 1), (kc, 1, dk), 1.0);
        for i in 0..n {
            a_mat[i * CHUNK + i] = 0.0;
            for j in 0..n {
                a_mat[i * CHUNK + j] *= decay[i * CHUNK + j];
            }
        }
        // T = (I + A)⁻¹, unit lower triangular: row i is e_i − Σ_{j<i} A[i][j]·T[j].
        for i in 0..n {
            let (done, cur) = t_mat.split_at_mut(i * CHUNK);
            let row = &mut cur[..n];
            row.fill(0.0);
            row[i] = 1.0;
            for j in 0..i {
                let aij = a_mat[i * CHUNK + j];
                for (x, y) in row[..=j].iter_mut().zip(&done[j * CHUNK..j * CHUNK + j + 1]) {
                    *x -= aij * y;
                }
            }
        }
        // U = T·vβ (into v_new) and W = T·(kβ·exp(G)).
        for i in 0..n {
            let eg = cum[i].exp();
            for x in &mut kb[i * dk..(i + 1) * dk] {
                *x *= eg;
            }
        }
        small_gemm(n, dv, n, &mut vnew, dv, None, (&t_mat, CHUNK, 1), (&vb, dv, 1), 1.0);
        small_gemm(n, dk, n, &mut w, dk, None, (&t_mat, CHUNK, 1), (&kb, dk, 1), 1.0);
        // v_new = U − W·S ; o = (q·exp(G))·S + P·v_new with P[i][j] = (q_i·k_j)·exp(G_i − G_j), j ≤ i.
        small_gemm(n, dv, dk, &mut vnew, dv, Some(1.0), (&w, dk, 1), (s, dv, 1), -1.0);
        let o = &mut out[c0 * dv..(c0 + n) * dv];
        small_gemm(n, dv, dk, o, dv, None, (&qe, dk, 1), (s, dv, 1), 1.0);
        small_gemm(n, n, dk, &mut p_mat, CHUNK, None, (qc, dk, 1), (kc, 1, dk), 1.0);
        for i in 0..n {
            for j in 0..n {
                p_mat[i * CHUNK + j] *= decay[i * CHUNK + j];
            }
        }
        small_gemm(n, dv, n, o, dv, Some(1.0), (&p_mat, CHUNK, 1), (&vnew, dv, 1), 1.0);
        // S = S·exp(G_last) + Σ_i (k_i·exp(G_last − G_i)) ⊗ v_new_i = S·exp(G_last) + K'ᵀ·v_new.
        let last = cum[n - 1];
        for i in 0..n {
            let e = (last - cum[i]).exp();
            for (x, y) in w[i * dk..(i + 1) * dk].iter_mut().zip(&kc[i * dk..(i + 1) * dk]) {
                *x = y * e;
            }
        }
        small_gemm(dk, dv, n, s, dv, Some(last.exp()), (&w, 1, dk), (&vnew, dv, 1), 1.0);
    }
    out
}
