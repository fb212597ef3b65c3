//! The state of one GDN layer (its conv window and SSM state) and the tape a verify pass keeps
//! to roll it back to any prefix of its tokens.

use rayon::prelude::*;

use super::kernels::replay_head;
use crate::model::config::LinearAttnConfig;
use crate::model::cpu::tensor::{F32_BYTES, Mat};

/// Conv window and SSM state of one GDN layer (f32).
#[derive(Debug, Clone, PartialEq)]
pub struct GdnState {
    /// The last `K-1` pre-conv inputs, oldest first: `[K-1][conv_dim]`.
    pub conv: Vec<f32>,
    /// `[Hv][dk][dv]` (transformers' layout).
    pub ssm: Vec<f32>,
    /// Kept by the last verify pass, until [`SequenceState::accept`](crate::model::SequenceState::accept) settles it.
    pub tape: Option<GdnTape>,
    /// A settled tape's buffers, which the next verify pass reuses (counted with the tapes).
    pub spare: Option<Box<GdnTape>>,
}

impl GdnState {
    /// Conv window and SSM state (the tape is counted separately).
    pub fn bytes(&self) -> usize {
        (self.conv.len() + self.ssm.len()) * F32_BYTES
    }

    /// The first of `heads` value heads whose state holds NaN / ±Inf, and how many such
    /// entries it holds.
    pub fn first_nonfinite_head(&self, heads: usize) -> Option<(usize, usize)> {
        self.ssm
            .chunks((self.ssm.len() / heads.max(1)).max(1))
            .map(|s| s.iter().filter(|v| !v.is_finite()).count())
            .enumerate()
            .find(|(_, n)| *n > 0)
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

    /// Starts a pass of `proj.rows` tokens over `state`, reusing this tape's buffers: the state
    /// before it and the pass's pre-conv inputs (the first `conv_dim` columns of `proj`).
    pub(super) fn start(&mut self, state: &mut GdnState, proj: &Mat, cfg: &LinearAttnConfig) {
        let (tokens, conv_dim, hv) = (proj.rows, cfg.conv_dim(), cfg.num_value_heads);
        let (keys, values, heads) = (hv * cfg.key_head_dim, hv * cfg.value_head_dim, hv);
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

    /// Sets `conv` and `ssm` to the state after the first `keep` tokens of the pass. The state
    /// before the pass moves back out of the tape (the pass's own result goes into the tape's
    /// buffer, to be reused by the next pass) and the kept tokens are replayed on it in place,
    /// the heads on all threads: no copy of the state (18.9 MB on the 0.8B shape, a few
    /// percent of a verify pass when it was copied and replayed on one thread).
    pub fn rebuild(&mut self, keep: usize, cfg: &LinearAttnConfig, conv: &mut Vec<f32>, ssm: &mut Vec<f32>) {
        let (hv, dk, dv, conv_dim, kw) =
            (cfg.num_value_heads, cfg.key_head_dim, cfg.value_head_dim, cfg.conv_dim(), cfg.conv_kernel - 1);
        // Conv window: the last K-1 rows of [base window; inputs of the kept tokens].
        let mut rows: Vec<&[f32]> = self.base_conv.chunks(conv_dim).collect();
        rows.extend(self.inputs.chunks(conv_dim).take(keep));
        conv.clear();
        for r in &rows[rows.len() - kw..] {
            conv.extend_from_slice(r);
        }
        std::mem::swap(ssm, &mut self.base_ssm);
        ssm.par_chunks_mut(dk * dv).enumerate().for_each(|(h, s)| {
            let k: Vec<f32> =
                (0..keep).flat_map(|t| self.k[(t * hv + h) * dk..(t * hv + h + 1) * dk].iter().copied()).collect();
            let d: Vec<f32> =
                (0..keep).flat_map(|t| self.delta[(t * hv + h) * dv..(t * hv + h + 1) * dv].iter().copied()).collect();
            let g: Vec<f32> = (0..keep).map(|t| self.g[t * hv + h]).collect();
            replay_head(s, &k, &d, &g, dk, dv);
        });
    }
}
