//! The state trace: what every Gated-DeltaNet layer wrote, kept and forgot over one forward
//! pass, per value head (model-spec §3.6), and what every attention layer holds. Pure data,
//! computed only when [`super::ForwardOptions::trace_state`] asks (one flag per layer in the
//! forward; nothing otherwise).
//!
//! Per GDN head and token: the write strength β = sigmoid(b) and the decay g =
//! −exp(A_log)·softplus(a + dt_bias) (retention exp(g) per token). Per GDN head over the pass:
//! ‖S‖_F after it, ‖S_after − S_before‖_F (how hard the pass rewrote the state) and the
//! non-finite entries of S. With them the gate inputs a and b as the layer used them (rounded to
//! bf16 at the bf16 cast points): what a comparison of two engines needs to tell a rounding step
//! from a bug (see `engine::state_trace`).

use serde::{Deserialize, Serialize};

/// One GDN layer over one forward pass of `tokens` rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GdnPassTrace {
    pub tokens: usize,
    pub heads: usize,
    /// `[T][Hv]`.
    pub beta: Vec<f32>,
    /// `[T][Hv]`, ≤ 0 (log retention per token).
    pub g: Vec<f32>,
    /// `[T][Hv]`: the decay's input a (in_proj_a's output), as g was computed from it.
    pub a: Vec<f32>,
    /// `[T][Hv]`: the write strength's input b (in_proj_b's output), as β was computed from it.
    pub b: Vec<f32>,
    /// Whether a, b and β were rounded to bf16 (the bf16 cast points); f32 otherwise.
    pub gates_bf16: bool,
    /// `[Hv]`: ‖S‖_F after the pass.
    pub state_norm: Vec<f32>,
    /// `[Hv]`: ‖S_after − S_before‖_F.
    pub delta_norm: Vec<f32>,
    /// `[Hv]`: NaN / ±Inf entries of S after the pass.
    pub nonfinite: Vec<u32>,
}

/// One layer of the trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum LayerTrace {
    Gdn(GdnPassTrace),
    /// A full-attention layer: its KV cache after the pass.
    Attention {
        kv_len: usize,
        kv_bytes: usize,
    },
}

/// Every layer of one forward pass, in layer order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateTrace {
    pub layers: Vec<LayerTrace>,
}

/// One head's state after a pass against before it, in one pass over both (while the head is
/// still in cache): ‖S‖_F, ‖S − S_before‖_F and the non-finite entries of S.
///
/// Squares are summed in f32 over blocks of 256 entries (eight lanes of 32, so the loop
/// vectorises; each lane's sum is within 32 roundings, ≤ 4e-6 relative), and the blocks in f64:
/// a state of 16k entries does not round its small changes away.
pub fn head_state_norms(before: &[f32], after: &[f32]) -> (f32, f32, u32) {
    const LANES: usize = 8;
    let (mut norm, mut delta, mut bad) = (0f64, 0f64, 0u32);
    for (a, b) in after.chunks(LANES * 32).zip(before.chunks(LANES * 32)) {
        let (mut n, mut d, mut nb) = ([0f32; LANES], [0f32; LANES], [0u32; LANES]);
        let mut lanes = a.chunks_exact(LANES).zip(b.chunks_exact(LANES));
        for (x, y) in &mut lanes {
            for i in 0..LANES {
                n[i] += x[i] * x[i];
                let e = x[i] - y[i];
                d[i] += e * e;
                nb[i] += !x[i].is_finite() as u32;
            }
        }
        let tail = a.len() - a.len() % LANES;
        for (&x, &y) in a[tail..].iter().zip(&b[tail..]) {
            n[0] += x * x;
            d[0] += (x - y) * (x - y);
            nb[0] += !x.is_finite() as u32;
        }
        norm += n.iter().map(|&v| v as f64).sum::<f64>();
        delta += d.iter().map(|&v| v as f64).sum::<f64>();
        bad += nb.iter().sum::<u32>();
    }
    (norm.sqrt() as f32, delta.sqrt() as f32, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norms_of_one_head() {
        assert_eq!(head_state_norms(&[0.0, 0.0], &[3.0, 4.0]), (5.0, 5.0, 0));
        let (n, d, bad) = head_state_norms(&[1.0, 1.0], &[1.0, f32::NAN]);
        assert!(n.is_nan() && d.is_nan());
        assert_eq!(bad, 1);
        // Lengths that are not a multiple of four, against a plain f64 sum.
        let before: Vec<f32> = (0..4099).map(|i| (i as f32 * 0.37).sin()).collect();
        let after: Vec<f32> = before.iter().enumerate().map(|(i, b)| b * 0.9 + (i % 7) as f32 * 1e-3).collect();
        let (n, d, bad) = head_state_norms(&before, &after);
        let n64 = after.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
        let d64 = after.iter().zip(&before).map(|(&x, &y)| (x as f64 - y as f64).powi(2)).sum::<f64>().sqrt();
        assert!(((n as f64) - n64).abs() <= 1e-6 * n64 && ((d as f64) - d64).abs() <= 1e-6 * d64);
        assert_eq!(bad, 0);
    }
}
