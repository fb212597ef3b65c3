//! The state scope's events: the model's [`StateTrace`] of one fed pass turned into a
//! [`StateEvent`] (per GDN layer and value head: β, g, retention, ‖S‖, ‖ΔS‖/‖S‖, non-finite
//! entries; per attention layer: the KV cache), for the event stream, sessions and replay.

use serde::{Deserialize, Serialize};

use crate::model::{LayerTrace, StateTrace};

/// One GDN layer after a pass, per value head (each list has one entry per head).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GdnLayerState {
    pub layer: usize,
    /// Write strength β = sigmoid(b), in (0, 1); the mean over the pass's tokens.
    pub beta: Vec<f32>,
    /// Decay g = −exp(A_log)·softplus(a + dt_bias) ≤ 0; the mean over the pass's tokens.
    pub g: Vec<f32>,
    /// Retention exp(g) per token, in (0, 1]; the mean over the pass's tokens.
    pub retention: Vec<f32>,
    /// ‖S‖_F after the pass.
    pub state_norm: Vec<f32>,
    /// ‖S_after − S_before‖_F / ‖S_after‖_F: how hard the pass rewrote the state (0 when S is 0).
    pub delta_ratio: Vec<f32>,
    /// NaN / ±Inf entries of S after the pass.
    pub nonfinite: Vec<u32>,
}

impl GdnLayerState {
    /// ln 0.5 / g: tokens until a head keeps half of what it holds (∞ when g is 0).
    pub fn half_life(&self, head: usize) -> f32 {
        half_life(self.g[head])
    }
}

/// ln 0.5 / g tokens (g ≤ 0; ∞ when g is 0).
pub fn half_life(g: f32) -> f32 {
    if g >= 0.0 { f32::INFINITY } else { std::f32::consts::LN_2 / -g }
}

/// One full-attention layer after a pass.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttentionLayerState {
    pub layer: usize,
    pub kv_len: usize,
    pub kv_bytes: usize,
}

/// What the model's state did over one fed pass: the prompt (summarised over its tokens), one
/// generated token, or a block of forced tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateEvent {
    /// The index of the (first) generated token this pass read; `None` for the prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_token: Option<usize>,
    /// Tokens the pass read (1 when decoding).
    pub tokens: usize,
    /// Tokens in the sequence after the pass.
    pub position: usize,
    pub gdn: Vec<GdnLayerState>,
    pub attention: Vec<AttentionLayerState>,
}

impl StateEvent {
    pub fn of(trace: &StateTrace, at_token: Option<usize>, position: usize) -> StateEvent {
        let mut gdn = vec![];
        let mut attention = vec![];
        let mut tokens = 0;
        for (layer, t) in trace.layers.iter().enumerate() {
            match t {
                LayerTrace::Gdn(p) => {
                    tokens = p.tokens;
                    let (hv, n) = (p.heads, p.tokens.max(1));
                    let mean = |f: &dyn Fn(f32) -> f64, xs: &[f32], h: usize| -> f32 {
                        ((0..p.tokens).map(|t| f(xs[t * hv + h])).sum::<f64>() / n as f64) as f32
                    };
                    let id = |x: f32| x as f64;
                    let exp = |x: f32| (x as f64).exp();
                    gdn.push(GdnLayerState {
                        layer,
                        beta: (0..hv).map(|h| mean(&id, &p.beta, h)).collect(),
                        g: (0..hv).map(|h| mean(&id, &p.g, h)).collect(),
                        retention: (0..hv).map(|h| mean(&exp, &p.g, h)).collect(),
                        state_norm: p.state_norm.clone(),
                        delta_ratio: p
                            .delta_norm
                            .iter()
                            .zip(&p.state_norm)
                            .map(|(&d, &s)| {
                                if s > 0.0 {
                                    d / s
                                } else if d > 0.0 {
                                    f32::INFINITY
                                } else {
                                    0.0
                                }
                            })
                            .collect(),
                        nonfinite: p.nonfinite.clone(),
                    });
                }
                LayerTrace::Attention { kv_len, kv_bytes } => {
                    attention.push(AttentionLayerState { layer, kv_len: *kv_len, kv_bytes: *kv_bytes })
                }
            }
        }
        StateEvent { at_token, tokens, position, gdn, attention }
    }

    /// The first head whose state went non-finite or exploded (‖S‖ over `limit`), if any:
    /// `(layer, head, what)`.
    pub fn alarm(&self, limit: f32) -> Option<(usize, usize, String)> {
        for l in &self.gdn {
            for h in 0..l.state_norm.len() {
                if l.nonfinite[h] > 0 {
                    return Some((l.layer, h, format!("{} non-finite entries in S", l.nonfinite[h])));
                }
                if !l.state_norm[h].is_finite() || l.state_norm[h] > limit {
                    return Some((l.layer, h, format!("‖S‖ = {:.3e}, over {limit:.0e}", l.state_norm[h])));
                }
            }
        }
        None
    }
}

/// What the state scope shows per head: one number per GDN layer, head and pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum StateMetric {
    /// Write strength β.
    #[default]
    Beta,
    /// Tokens until half of the state is gone, ln 0.5 / g.
    HalfLife,
    /// ‖S‖_F.
    StateNorm,
    /// ‖ΔS‖_F / ‖S‖_F.
    DeltaRatio,
}

impl StateMetric {
    pub const ALL: [StateMetric; 4] =
        [StateMetric::Beta, StateMetric::HalfLife, StateMetric::StateNorm, StateMetric::DeltaRatio];

    pub fn name(self) -> &'static str {
        match self {
            StateMetric::Beta => "beta",
            StateMetric::HalfLife => "half-life",
            StateMetric::StateNorm => "norm",
            StateMetric::DeltaRatio => "delta",
        }
    }

    /// What it is, for legends.
    pub fn label(self) -> &'static str {
        match self {
            StateMetric::Beta => "write strength β",
            StateMetric::HalfLife => "half-life (tokens)",
            StateMetric::StateNorm => "‖S‖",
            StateMetric::DeltaRatio => "‖ΔS‖/‖S‖",
        }
    }

    pub fn parse(s: &str) -> Option<StateMetric> {
        StateMetric::ALL.into_iter().find(|m| m.name() == s)
    }

    pub fn value(self, l: &GdnLayerState, head: usize) -> f32 {
        match self {
            StateMetric::Beta => l.beta[head],
            StateMetric::HalfLife => l.half_life(head),
            StateMetric::StateNorm => l.state_norm[head],
            StateMetric::DeltaRatio => l.delta_ratio[head],
        }
    }

    /// Where a colour scale of this metric sits: half-lives span decades, so on a log scale.
    pub fn scaled(self, v: f32) -> f32 {
        match self {
            StateMetric::HalfLife => v.max(1e-3).log10(),
            _ => v,
        }
    }
}

/// A head that forgets within this many tokens (half-life) is marked.
pub const FORGETS_WITHIN: f32 = 2.0;
/// A head that keeps half its memory past this many tokens is marked.
pub const KEEPS_PAST: f32 = 1000.0;
/// A state norm over this is an explosion (the banner's threshold).
pub const EXPLODED_NORM: f32 = 1e4;

/// How a head's memory behaves at one pass, by its half-life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadMemory {
    /// Forgets within [`FORGETS_WITHIN`] tokens.
    Forgets,
    /// Keeps half past [`KEEPS_PAST`] tokens.
    Keeps,
    Between,
}

pub fn memory_of(half_life: f32) -> HeadMemory {
    if half_life < FORGETS_WITHIN {
        HeadMemory::Forgets
    } else if half_life > KEEPS_PAST {
        HeadMemory::Keeps
    } else {
        HeadMemory::Between
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GdnPassTrace;

    #[test]
    fn a_pass_becomes_means_per_head() {
        let trace = StateTrace {
            layers: vec![
                LayerTrace::Gdn(GdnPassTrace {
                    tokens: 2,
                    heads: 2,
                    beta: vec![0.2, 0.4, 0.6, 0.8],
                    g: vec![-1.0, 0.0, -3.0, 0.0],
                    state_norm: vec![2.0, 0.0],
                    delta_norm: vec![1.0, 0.0],
                    nonfinite: vec![0, 0],
                }),
                LayerTrace::Attention { kv_len: 7, kv_bytes: 64 },
            ],
        };
        let e = StateEvent::of(&trace, Some(3), 9);
        assert_eq!((e.tokens, e.at_token, e.position), (2, Some(3), 9));
        let l = &e.gdn[0];
        assert!((l.beta[0] - 0.4).abs() < 1e-6 && (l.beta[1] - 0.6).abs() < 1e-6);
        assert_eq!(l.g, vec![-2.0, 0.0]);
        assert!((l.retention[0] - ((-1f32).exp() + (-3f32).exp()) / 2.0).abs() < 1e-6);
        assert_eq!(l.delta_ratio, vec![0.5, 0.0]);
        assert_eq!(l.half_life(1), f32::INFINITY);
        assert!((half_life(-std::f32::consts::LN_2) - 1.0).abs() < 1e-6);
        assert_eq!(e.attention[0], AttentionLayerState { layer: 1, kv_len: 7, kv_bytes: 64 });
        assert_eq!(e.alarm(1e6), None);
        let mut bad = e.clone();
        bad.gdn[0].state_norm[1] = f32::NAN;
        assert_eq!(bad.alarm(1e6).map(|a| (a.0, a.1)), Some((0, 1)));
    }
}
