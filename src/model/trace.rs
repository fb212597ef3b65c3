//! The state trace: what every Gated-DeltaNet layer wrote, kept and forgot over one forward
//! pass, per value head (model-spec §3.6), and what every attention layer holds. Pure data,
//! computed only when [`super::ForwardOptions::trace_state`] asks (one flag per layer in the
//! forward; nothing otherwise).
//!
//! Per GDN head and token: the write strength β = sigmoid(b) and the decay g =
//! −exp(A_log)·softplus(a + dt_bias) (retention exp(g) per token). Per GDN head over the pass:
//! ‖S‖_F after it, ‖S_after − S_before‖_F (how hard the pass rewrote the state) and the
//! non-finite entries of S.

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
/// still in cache): ‖S‖_F, ‖S − S_before‖_F (sums of squares in f64: a state of 16k entries
/// must not round its small changes away) and the non-finite entries of S.
pub fn head_state_norms(before: &[f32], after: &[f32]) -> (f32, f32, u32) {
    // Four independent sums so the loop is not one long chain of dependent adds.
    let (mut n, mut d) = ([0f64; 4], [0f64; 4]);
    let mut bad = 0u32;
    let mut quads = after.chunks_exact(4).zip(before.chunks_exact(4));
    for (a, b) in &mut quads {
        for i in 0..4 {
            let (x, y) = (a[i] as f64, b[i] as f64);
            n[i] += x * x;
            d[i] += (x - y) * (x - y);
            bad += !a[i].is_finite() as u32;
        }
    }
    let tail = after.len() - after.len() % 4;
    for (&x, &y) in after[tail..].iter().zip(&before[tail..]) {
        let (x64, y64) = (x as f64, y as f64);
        n[0] += x64 * x64;
        d[0] += (x64 - y64) * (x64 - y64);
        bad += !x.is_finite() as u32;
    }
    let sum = |v: [f64; 4]| ((v[0] + v[1]) + (v[2] + v[3])).sqrt() as f32;
    (sum(n), sum(d), bad)
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
