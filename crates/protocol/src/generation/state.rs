//! The state scope's events: the model's [`StateTrace`] of one fed pass turned into a
//! [`StateEvent`] (per GDN layer and value head: β, g, retention, ‖S‖, ‖ΔS‖/‖S‖, non-finite
//! entries; per attention layer: the KV cache), for the event stream, sessions and replay.

use serde::{Deserialize, Serialize};

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
    /// How far another correct engine's mean g may lie from this one's, relative: e^u − 1 for u
    /// one rounding step of the gate input a at its largest over the pass (a bf16 step at the bf16
    /// cast points). Two engines whose sums for a round on either side of a step compute g from
    /// inputs a step apart, and |ln(g₁ / g₂)| ≤ |a₁ − a₂| (softplus's log-slope is at most 1).
    /// Empty in traces written before it was recorded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub g_slack: Vec<f32>,
    /// The same for the mean β, absolute: a step of b moves sigmoid(b) by at most a quarter step,
    /// and β itself is rounded (one step of β at its largest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub beta_slack: Vec<f32>,
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
