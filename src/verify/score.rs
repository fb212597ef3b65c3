//! The subject's tokens teacher-forced through the reference: one pass over the prompt (no
//! logits: the LM head runs only where a generated token is predicted), then the generated
//! tokens in chunks of [`CHUNK`] with a row of logits each. Every position is scored: the
//! subject's token's rank and log-probability under the reference, the difference from the
//! subject's own log-probability, the overlap of the two top-k sets and a lower bound on the
//! KL divergence, then the probe's verdict from [`Thresholds`].

use serde::Serialize;

use deltascope_model::Result;
use deltascope_model::{ForwardOptions, LogitsRows, Model};

/// Generated positions per forward pass: a row of `vocab` logits each, so a 27B's 248k-entry
/// rows stay at 64 MB a pass.
pub const CHUNK: usize = 64;

/// A token the subject generated, as it reported it.
#[derive(Debug, Clone, PartialEq)]
pub struct SubjectToken {
    pub id: u32,
    pub text: String,
    /// Its log-probability under the subject (`None`: the server sent none for it, as llama.cpp
    /// does for tokens from accepted MTP drafts).
    pub logprob: Option<f32>,
    /// The subject's top alternatives, mapped to reference ids (those that could not be
    /// mapped are left out).
    pub top: Vec<(u32, f32)>,
    /// Not streamed by the server (a tag its reasoning parser took out, put back here so the
    /// sequence is the model's): forced through the reference, not scored.
    pub hidden: bool,
}

/// One alternative of a top-k list, for the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alt {
    pub id: u32,
    pub text: String,
    pub logprob: f32,
}

/// One generated position, scored.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Position {
    pub index: usize,
    pub id: u32,
    pub text: String,
    pub hidden: bool,
    pub subject_logprob: Option<f32>,
    pub reference_logprob: f32,
    /// 0: the reference's own first choice (among the tokens the subject could choose: with
    /// `ignore_eos` the end-of-sequence tokens are not among them).
    pub reference_rank: usize,
    /// The log-probability of that first choice.
    pub reference_best_logprob: f32,
    /// The subject's log-probability of its token minus the reference's.
    pub delta: Option<f32>,
    /// Shared entries of the two top-k lists, over k (the subject's k).
    pub overlap: Option<f32>,
    /// KL(reference ‖ subject) ≥ this: the divergence over the subject's top-k and one bin
    /// for the rest of the vocabulary (coarser partitions only lower a KL divergence).
    pub kl_lower_bound: Option<f32>,
    pub reference_top: Vec<Alt>,
    pub subject_top: Vec<Alt>,
}

impl Position {
    /// The reference's probability of the subject's token.
    pub fn reference_p(&self) -> f32 {
        self.reference_logprob.exp()
    }

    /// The reference's probability of its own first choice.
    pub fn reference_top1_p(&self) -> f32 {
        self.reference_best_logprob.exp()
    }
}

/// Where agreement ends. Calibrated on this project's healthy and broken servers
/// (README: "Is it the server or the model?").
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Thresholds {
    /// Diverges: the subject chose a token the reference gives less than this …
    #[serde(serialize_with = "as_written")]
    pub diverge_below: f32,
    /// … while the reference's first choice had more than this.
    #[serde(serialize_with = "as_written")]
    pub diverge_top1_above: f32,
    /// Agrees: no |Δ log-probability| above this (nats), and any different choice is a
    /// near-tie within it.
    #[serde(serialize_with = "as_written")]
    pub agree_delta: f32,
    /// Agrees: no KL lower bound above this (nats).
    #[serde(serialize_with = "as_written")]
    pub agree_kl: f32,
}

/// A threshold in the JSON report as it is written here (0.01, not f32's 0.009999999776…).
fn as_written<S: serde::Serializer>(x: &f32, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(x.to_string().parse().unwrap_or(f64::from(*x)))
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { diverge_below: 0.01, diverge_top1_above: 0.5, agree_delta: 0.15, agree_kl: 0.02 }
    }
}

/// A probe's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    /// Differences at the level of bf16 rounding.
    Agrees,
    /// Larger differences, but no decision the reference would not also make.
    Drifts { worst_delta: f32, worst_kl: f32, at: usize },
    /// The subject chose a token the reference all but rules out.
    Diverges { at: usize },
}

impl Verdict {
    pub fn name(&self) -> &'static str {
        match self {
            Verdict::Agrees => "agrees",
            Verdict::Drifts { .. } => "drifts",
            Verdict::Diverges { .. } => "diverges",
        }
    }
}

/// The worst figures over the scored positions (tags put back are left out), as every report
/// prints them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Worst {
    /// The largest |Δ log-probability|.
    pub delta: f32,
    /// The smallest top-k overlap (1 when none was measured).
    pub overlap: f32,
    /// The largest KL lower bound.
    pub kl: f32,
}

pub fn worst(positions: &[Position]) -> Worst {
    let scored = || positions.iter().filter(|p| !p.hidden);
    Worst {
        delta: scored().filter_map(|p| p.delta.map(f32::abs)).fold(0.0, f32::max),
        overlap: scored().filter_map(|p| p.overlap).fold(1.0, f32::min),
        kl: scored().filter_map(|p| p.kl_lower_bound).fold(0.0, f32::max),
    }
}

/// One position's agreement with the reference (the workbench colours tokens by it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Agreement {
    /// Forced through, not scored (a tag put back, a token the subject's engine forced).
    NotScored,
    Agrees,
    Drifts,
    Diverges,
}

/// How far a position is from agreeing: its |Δ|, its KL bound, and for a different choice how
/// far below the reference's first choice it was.
fn off(p: &Position) -> (f32, f32) {
    let gap = p.reference_best_logprob - p.reference_logprob;
    let delta = p.delta.map_or(0.0, f32::abs).max(if p.reference_rank > 0 { gap } else { 0.0 });
    (delta, p.kl_lower_bound.unwrap_or(0.0))
}

fn diverges(p: &Position, t: &Thresholds) -> bool {
    !p.hidden && p.reference_p() < t.diverge_below && p.reference_top1_p() > t.diverge_top1_above
}

/// The class of one position under `t`: the per-token form of [`verdict`].
pub fn agreement(p: &Position, t: &Thresholds) -> Agreement {
    if p.hidden {
        return Agreement::NotScored;
    }
    if diverges(p, t) {
        return Agreement::Diverges;
    }
    let (d, k) = off(p);
    if d > t.agree_delta || k > t.agree_kl { Agreement::Drifts } else { Agreement::Agrees }
}

/// The verdict over scored positions.
pub fn verdict(positions: &[Position], t: &Thresholds) -> Verdict {
    let scored = || positions.iter().filter(|p| !p.hidden);
    if let Some(p) = scored().find(|p| diverges(p, t)) {
        return Verdict::Diverges { at: p.index };
    }
    let worst = scored().map(|p| (p.index, off(p))).max_by(|a, b| {
        let score = |(d, k): (f32, f32)| (d / t.agree_delta).max(k / t.agree_kl);
        score(a.1).total_cmp(&score(b.1))
    });
    match worst {
        Some((at, (d, k))) if d > t.agree_delta || k > t.agree_kl => {
            Verdict::Drifts { worst_delta: d, worst_kl: k, at }
        }
        _ => Verdict::Agrees,
    }
}

/// Scores `tokens` after `prompt` under the reference. `text` names a reference id (for the
/// top-k lists); `banned`: ids the subject could not choose (the end-of-sequence ids under
/// `ignore_eos`), left out of the reference's first choice and the ranks.
pub fn score(
    model: &Model,
    prompt: &[u32],
    tokens: &[SubjectToken],
    text: &dyn Fn(u32) -> String,
    banned: &[u32],
) -> Result<Vec<Position>> {
    let (Some((&last, head)), false) = (prompt.split_last(), tokens.is_empty()) else {
        return Ok(vec![]);
    };
    let mut state = model.new_state();
    if !head.is_empty() {
        model.forward(head, &mut state, ForwardOptions { logits: LogitsRows::Last, ..Default::default() })?;
    }
    // Row j of the passes predicts tokens[j]: the prompt's last token, then each generated one.
    let feed: Vec<u32> = std::iter::once(last).chain(tokens.iter().map(|t| t.id)).take(tokens.len()).collect();
    let mut positions = Vec::with_capacity(tokens.len());
    for chunk in feed.chunks(CHUNK) {
        let out = model.forward(chunk, &mut state, ForwardOptions { logits: LogitsRows::All, ..Default::default() })?;
        for r in 0..chunk.len() {
            let index = positions.len();
            positions.push(position(index, out.logits.row(r), &tokens[index], text, banned));
        }
    }
    Ok(positions)
}

fn position(index: usize, logits: &[f32], t: &SubjectToken, text: &dyn Fn(u32) -> String, banned: &[u32]) -> Position {
    let lse = log_sum_exp(logits);
    let lp = |id: u32| logits.get(id as usize).map_or(f32::NEG_INFINITY, |&x| (x as f64 - lse) as f32);
    let own = logits.get(t.id as usize).copied().unwrap_or(f32::NEG_INFINITY);
    let allowed = || logits.iter().enumerate().filter(|(i, _)| !banned.contains(&(*i as u32))).map(|(_, &x)| x);
    let reference_rank = allowed().filter(|&x| x > own).count();
    let best = allowed().fold(f32::NEG_INFINITY, f32::max);
    let k = t.top.len().max(5);
    let reference_ids = top_ids(logits, k);
    let alt = |id: u32, logprob: f32| Alt { id, text: text(id), logprob };
    let reference_top: Vec<Alt> = reference_ids.iter().take(5).map(|&id| alt(id, lp(id))).collect();
    let subject_top: Vec<Alt> = t.top.iter().take(5).map(|&(id, l)| alt(id, l)).collect();
    let (overlap, kl_lower_bound) = if t.top.is_empty() || t.hidden {
        (None, None)
    } else {
        let shared = t.top.iter().filter(|(id, _)| reference_ids[..t.top.len()].contains(id)).count();
        (Some(shared as f32 / t.top.len() as f32), Some(kl_bound(t.top.iter().map(|&(id, q)| (lp(id), q)))))
    };
    let reference_logprob = lp(t.id);
    Position {
        index,
        id: t.id,
        text: t.text.clone(),
        hidden: t.hidden,
        subject_logprob: t.logprob,
        reference_logprob,
        reference_rank,
        reference_best_logprob: (best as f64 - lse) as f32,
        delta: t.logprob.filter(|_| !t.hidden).map(|l| l - reference_logprob),
        overlap,
        kl_lower_bound,
        reference_top,
        subject_top,
    }
}

fn log_sum_exp(xs: &[f32]) -> f64 {
    let max = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    max + xs.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln()
}

/// The `k` largest entries' indices, largest first.
fn top_ids(logits: &[f32], k: usize) -> Vec<u32> {
    let mut top: Vec<(f32, u32)> = Vec::with_capacity(k + 1);
    for (i, &x) in logits.iter().enumerate() {
        if top.len() < k || x > top[top.len() - 1].0 {
            let at = top.partition_point(|&(y, _)| y >= x);
            top.insert(at, (x, i as u32));
            top.truncate(k);
        }
    }
    top.into_iter().map(|(_, i)| i).collect()
}

/// KL(P ‖ Q) over the given (ln p, ln q) pairs plus one bin for everything else: a lower
/// bound on the divergence over the whole vocabulary (grouping outcomes never raises it).
pub(super) fn kl_bound(pairs: impl Iterator<Item = (f32, f32)>) -> f32 {
    let (mut kl, mut p_in, mut q_in) = (0.0f64, 0.0f64, 0.0f64);
    for (lp, lq) in pairs {
        let p = (lp as f64).exp();
        if p > 0.0 {
            kl += p * (lp as f64 - lq as f64);
        }
        p_in += p;
        q_in += (lq as f64).exp();
    }
    let (p_out, q_out) = ((1.0 - p_in).max(0.0), (1.0 - q_in).max(1e-12));
    if p_out > 0.0 {
        kl += p_out * (p_out / q_out).ln();
    }
    kl.max(0.0) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kl_bound_is_zero_for_the_same_distribution_and_below_the_true_divergence() {
        let p = [0.7f32, 0.2, 0.06, 0.04];
        let q = [0.4f32, 0.3, 0.2, 0.1];
        let pairs =
            |n: usize, a: &[f32], b: &[f32]| (0..n).map(|i| (a[i].ln(), b[i].ln())).collect::<Vec<_>>().into_iter();
        assert!(kl_bound(pairs(2, &p, &p)).abs() < 1e-6);
        let full: f32 = p.iter().zip(&q).map(|(a, b)| a * (a / b).ln()).sum();
        let bound = kl_bound(pairs(2, &p, &q));
        assert!(bound > 0.0 && bound <= full + 1e-6, "{bound} vs {full}");
        assert!((kl_bound(pairs(4, &p, &q)) - full).abs() < 1e-5, "all outcomes: the divergence itself");
    }

    #[test]
    fn top_ids_are_the_largest_first() {
        assert_eq!(top_ids(&[0.1, 3.0, -1.0, 2.0, 2.5], 3), vec![1, 4, 3]);
    }

    fn at(index: usize, lp: f32, top1: f32, delta: f32, rank: usize) -> Position {
        Position {
            index,
            id: 1,
            text: "x".into(),
            hidden: false,
            subject_logprob: Some(lp + delta),
            reference_logprob: lp,
            reference_rank: rank,
            reference_best_logprob: top1,
            delta: Some(delta),
            overlap: Some(1.0),
            kl_lower_bound: Some(0.0),
            reference_top: vec![Alt { id: 0, text: "y".into(), logprob: top1 }],
            subject_top: vec![],
        }
    }

    #[test]
    fn verdicts() {
        let t = Thresholds::default();
        let good = [at(0, -0.01, -0.01, 0.01, 0), at(1, -0.7, -0.69, 0.05, 1)];
        assert_eq!(verdict(&good, &t), Verdict::Agrees, "a near-tie chosen the other way agrees");
        let drift = [at(0, -0.01, -0.01, 0.6, 0)];
        assert!(matches!(verdict(&drift, &t), Verdict::Drifts { at: 0, .. }));
        let broken = [at(0, -0.01, -0.01, 0.0, 0), at(1, -9.0, -0.05, 8.0, 7)];
        assert_eq!(verdict(&broken, &t), Verdict::Diverges { at: 1 });
    }
}
