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

/// The Frobenius norm, summed in f64 (the state is small; the sum must not round away).
pub fn frobenius(x: &[f32]) -> f32 {
    x.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>().sqrt() as f32
}

/// ‖a − b‖_F.
pub fn frobenius_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(&x, &y)| ((x - y) as f64) * ((x - y) as f64)).sum::<f64>().sqrt() as f32
}

/// Per head of `[Hv][dk·dv]` states before and after: (‖S‖, ‖ΔS‖, non-finite).
pub fn head_norms(before: &[f32], after: &[f32], head_size: usize) -> (Vec<f32>, Vec<f32>, Vec<u32>) {
    let mut norms = vec![];
    let mut deltas = vec![];
    let mut bad = vec![];
    for (b, a) in before.chunks(head_size).zip(after.chunks(head_size)) {
        norms.push(frobenius(a));
        deltas.push(frobenius_diff(a, b));
        bad.push(a.iter().filter(|v| !v.is_finite()).count() as u32);
    }
    (norms, deltas, bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norms_per_head() {
        let before = [0.0, 0.0, 1.0, 1.0];
        let after = [3.0, 4.0, 1.0, f32::NAN];
        let (n, d, bad) = head_norms(&before, &after, 2);
        assert_eq!(n[0], 5.0);
        assert_eq!(d[0], 5.0);
        assert_eq!(bad, vec![0, 1]);
        assert!(n[1].is_nan());
    }
}
