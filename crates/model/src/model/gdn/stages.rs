//! The stages of a GDN layer around the delta rule, each the CPU twin of a kernel: the causal
//! conv (stage 1), the gates (stage 2), the l2 norm of q and k, and the gated RMSNorm (stage 4).

use super::super::cpu::math;
use super::super::cpu::tensor::{Mat, Precision, dot, sigmoid, softplus};

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
        // PyTorch's fallback rounds the conv output, then the SiLU output.
        math::silu_rounded(out, prec);
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

/// Stage 4: the gated RMSNorm of each value head's output (`heads[h]` is `[T][dv]`, one per
/// value head) with the
/// projection's z columns (at `zo`): norm in f32 → dtype, × weight in dtype, × silu(z) in f32 →
/// dtype. Returns `[T][Hv·dv]`. The CPU twin of `rms_norm_gated` in `kernels/norm.cu`.
pub fn gated_norm_stage(
    heads: &[&Vec<f32>],
    proj: &Mat,
    zo: usize,
    dv: usize,
    norm_w: &[f32],
    eps: f32,
    prec: Precision,
) -> Mat {
    let hv = heads.len();
    let mut normed = Mat::zeros(proj.rows, hv * dv);
    normed.for_rows(|t, out| {
        let z = &proj.row(t)[zo..zo + hv * dv];
        for h in 0..hv {
            let o = &mut out[h * dv..(h + 1) * dv];
            for (x, y) in o.iter_mut().zip(&heads[h][t * dv..(t + 1) * dv]) {
                *x = prec.round(*y);
            }
            let inv = crate::model::norm::rsqrt_mean_square(o, eps);
            math::gated_norm(o, &norm_w[..dv], inv, &z[h * dv..(h + 1) * dv], prec);
        }
    });
    normed
}

/// `x · rsqrt(Σx² + 1e-6)` (the FLA convention transformers follows).
#[inline]
pub(super) fn l2norm(x: &mut [f32]) {
    let inv = 1.0 / (dot(x, x) + 1e-6).sqrt();
    for v in x {
        *v *= inv;
    }
}
