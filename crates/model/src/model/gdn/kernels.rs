//! The per-head kernels of the delta rule: the recurrent rule (decode, verify), its replay (a
//! rejected draft's rollback) and the chunked rule (prefill). Each takes one value head's
//! [`HeadInputs`] and its `[dk][dv]` state.
//!
//! The recurrent loops run along `dv` and are compiled for the widest vector unit the CPU has
//! (AVX-512, AVX2, else the baseline) by `simd_dispatch!`; a multiply and an add are never
//! fused, so every instruction set gives the same bits.

use super::super::cpu::math::exp;
use super::super::cpu::simd::simd_dispatch;
use super::super::cpu::subnormal::Flush;
use super::super::cpu::tensor::small_gemm;

/// The prefill chunk of the chunked rule (model-spec §3.7).
pub(crate) const CHUNK: usize = 64;

/// One value head's inputs over `T` tokens: the l2-normalised and scaled queries and the
/// l2-normalised keys `[T][dk]`, the values `[T][dv]`, the log decays `g` and the betas `[T]`.
#[derive(Debug, Clone, Copy)]
pub struct HeadInputs<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub g: &'a [f32],
    pub beta: &'a [f32],
    pub dk: usize,
    pub dv: usize,
}

/// The recurrent rule over `T` tokens of one head (model-spec §3.6). `s` is `[dk][dv]`.
/// Returns the outputs `[T][dv]`; with `deltas` (`[T][dv]`), each token's `δ` too.
///
/// [`replay_head`] (compiled the same way) gives the bits of having decoded.
pub fn recurrent_head(inputs: &HeadInputs<'_>, s: &mut [f32], deltas: Option<&mut [f32]>) -> Vec<f32> {
    recurrent_from(inputs, None, s, deltas)
}

simd_dispatch! {
    /// [`recurrent_head`] starting from the state `from` (written to `s` on the way) when given,
    /// else from `s` itself.
    pub(super) fn recurrent_from(
        inputs: &HeadInputs<'_>,
        from: Option<&[f32]>,
        s: &mut [f32],
        deltas: Option<&mut [f32]>,
    ) -> Vec<f32> => recurrent_body
}

#[inline(always)]
fn recurrent_body(
    inputs: &HeadInputs<'_>,
    from: Option<&[f32]>,
    s: &mut [f32],
    mut deltas: Option<&mut [f32]>,
) -> Vec<f32> {
    let HeadInputs { q, k, v, g, beta, dk, dv } = *inputs;
    let t_len = g.len();
    let mut out = vec![0f32; t_len * dv];
    let mut kv = vec![0f32; dv];
    let mut delta = vec![0f32; dv];
    for t in 0..t_len {
        let (qt, kt, vt) = (&q[t * dk..(t + 1) * dk], &k[t * dk..(t + 1) * dk], &v[t * dv..(t + 1) * dv]);
        let decay = exp(g[t]);
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

simd_dispatch! {
    /// Rebuilds a head's state after `T` tokens from the state before them and each token's key,
    /// gate and `δ`: the same decay and rank-1 update as [`recurrent_head`], in the same order, so the
    /// result is bit-identical to having decoded those tokens.
    pub fn replay_head(s: &mut [f32], k: &[f32], delta: &[f32], g: &[f32], dk: usize, dv: usize) => replay_body
}

#[inline(always)]
fn replay_body(s: &mut [f32], k: &[f32], delta: &[f32], g: &[f32], dk: usize, dv: usize) {
    for t in 0..g.len() {
        let decay = exp(g[t]);
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

/// The chunked rule (model-spec §3.7, chunk 64, boundaries at the start of the call) over `T`
/// tokens of one head, in transformers' formulation (`torch_chunk_gated_delta_rule`): within a
/// chunk the sequential delta updates become `T = (I + A)⁻¹` (a 64×64 forward substitution)
/// and matrix products, which run on the GEMM's SIMD kernels on the calling thread (the
/// caller threads over heads); chunks are scanned in order. Mathematically identical to
/// [`recurrent_head`]. Returns the outputs `[T][dv]`.
pub fn chunked_head(inputs: &HeadInputs<'_>, s: &mut [f32]) -> Vec<f32> {
    // Decays far below f32's normal range are flushed to zero (`subnormal`: each one costs a
    // microcode assist on x86, which made this rule half of a prefill).
    let _flush = Flush::new();
    let HeadInputs { q, k, v, g, beta, dk, dv } = *inputs;
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
                *d = if j <= i { exp(cum[i] - cum[j]) } else { 0.0 };
            }
            let b = beta[c0 + i];
            let eg = exp(cum[i]);
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
            let eg = exp(cum[i]);
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
            let e = exp(last - cum[i]);
            for (x, y) in w[i * dk..(i + 1) * dk].iter_mut().zip(&kc[i * dk..(i + 1) * dk]) {
                *x = y * e;
            }
        }
        small_gemm(dk, dv, n, s, dv, Some(exp(last)), (&w, 1, dk), (&vnew, dv, 1), 1.0);
    }
    out
}
