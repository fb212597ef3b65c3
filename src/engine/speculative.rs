//! MTP speculative decoding: settings, live metrics, the adaptive depth, and rejection sampling.
//!
//! Each step drafts `k` tokens with the checkpoint's MTP head, verifies `[last, d1..dk]` in one
//! target pass, accepts the longest valid prefix plus one token of the target's own (the
//! "bonus"), and rolls the hybrid state back to what was kept (model/state.rs `accept`).
//! Greedy acceptance compares argmaxes, so the output is token-for-token that of plain greedy
//! decoding; sampled acceptance is standard speculative sampling (accept `d` with probability
//! min(1, p(d)/q(d)), otherwise draw from the normalised residual max(0, p − q)), so the output
//! distribution is the target's.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MtpParams {
    /// Draft steps per verify pass (0 = off).
    pub depth: usize,
    /// Adapt the depth to the measured acceptance (between 1 and 4).
    pub auto: bool,
}

pub const MAX_DEPTH: usize = 4;

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct MtpStats {
    /// The depth in use (changes under `auto`).
    pub depth: usize,
    /// Verify passes.
    pub steps: usize,
    pub drafted: usize,
    pub accepted: usize,
    pub acceptance_rate: f64,
    /// Acceptance rate at each draft position (1st draft, 2nd, …): accepted there / drafted there.
    pub per_position: Vec<f64>,
    /// Tokens each verify pass produced on average: accepted drafts plus the pass's own (bonus)
    /// token — so 1.0 means every draft was rejected.
    pub mean_accepted_length: f64,
    /// Tokens produced per verify pass, pass by pass (accepted drafts + bonus).
    pub history: Vec<usize>,
    pub draft_ms: f64,
    pub verify_ms: f64,
    /// Bytes held for rollback by the last verify pass (the GDN tapes).
    pub snapshot_bytes: usize,
    /// `[drafted, accepted]` at each draft position: the counts behind `per_position`, kept so
    /// stats merge exactly and a saved session reloads to the same value.
    #[serde(default, rename = "position_counts")]
    counts: Vec<(usize, usize)>,
    /// Where a remote backend's figures come from (e.g. "llama.cpp timings.draft_n; per
    /// position from /metrics"); `None` when the in-process engine measured them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

impl MtpStats {
    pub fn new(depth: usize) -> Self {
        MtpStats { depth, ..Default::default() }
    }

    /// Adds another generation's numbers (for totals over several prompts).
    pub fn merge(&mut self, o: &MtpStats) {
        self.steps += o.steps;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        if self.counts.len() < o.counts.len() {
            self.counts.resize(o.counts.len(), (0, 0));
        }
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            a.0 += b.0;
            a.1 += b.1;
        }
        self.history.extend_from_slice(&o.history);
        self.draft_ms += o.draft_ms;
        self.verify_ms += o.verify_ms;
        self.snapshot_bytes = self.snapshot_bytes.max(o.snapshot_bytes);
        self.depth = o.depth;
        self.acceptance_rate = self.accepted as f64 / self.drafted.max(1) as f64;
        self.per_position = self.counts.iter().map(|(d, a)| *a as f64 / (*d).max(1) as f64).collect();
        self.mean_accepted_length = self.history.iter().sum::<usize>() as f64 / self.steps.max(1) as f64;
    }

    /// A remote server's figures for one request: `steps` verify passes (0 when it does not
    /// say), `drafted` / `accepted` draft tokens, `[drafted, accepted]` per draft position
    /// where known, and where the numbers came from.
    pub fn from_server(
        depth: usize,
        steps: usize,
        drafted: usize,
        accepted: usize,
        counts: Vec<(usize, usize)>,
        mean_accepted_length: f64,
        source: String,
    ) -> Self {
        MtpStats {
            depth,
            steps,
            drafted,
            accepted,
            acceptance_rate: accepted as f64 / drafted.max(1) as f64,
            per_position: counts.iter().map(|(d, a)| *a as f64 / (*d).max(1) as f64).collect(),
            mean_accepted_length,
            counts,
            source: Some(source),
            ..Default::default()
        }
    }

    /// Records one verify pass: `drafted` drafts, the first `accepted` of them kept, `produced`
    /// tokens appended in all (accepted + bonus, or fewer when generation stopped inside).
    pub fn record(&mut self, drafted: usize, accepted: usize, produced: usize) {
        self.steps += 1;
        self.drafted += drafted;
        self.accepted += accepted;
        if self.counts.len() < drafted {
            self.counts.resize(drafted, (0, 0));
        }
        for i in 0..drafted {
            self.counts[i].0 += 1;
            if i < accepted {
                self.counts[i].1 += 1;
            }
        }
        self.history.push(produced);
        self.acceptance_rate = self.accepted as f64 / self.drafted.max(1) as f64;
        self.per_position = self.counts.iter().map(|(d, a)| *a as f64 / (*d).max(1) as f64).collect();
        self.mean_accepted_length = self.history.iter().sum::<usize>() as f64 / self.steps as f64;
    }
}

/// Picks the depth for the next step. Fixed unless `auto`: then, over the last 16 passes, a
/// deepest draft position accepted more than 70 % of the time earns one more step (up to 4), and
/// one accepted less than 30 % of the time costs one (down to 1).
#[derive(Debug, Clone)]
pub struct DepthControl {
    pub depth: usize,
    auto: bool,
    recent: VecDeque<(usize, usize)>,
    since_change: usize,
}

impl DepthControl {
    pub fn new(p: MtpParams) -> Self {
        let depth = if p.auto && p.depth == 0 { 2 } else { p.depth.min(MAX_DEPTH) };
        DepthControl { depth, auto: p.auto, recent: VecDeque::new(), since_change: 0 }
    }

    pub fn observe(&mut self, drafted: usize, accepted: usize) {
        if !self.auto || drafted < self.depth {
            return;
        }
        self.recent.push_back((drafted, accepted));
        if self.recent.len() > 16 {
            self.recent.pop_front();
        }
        self.since_change += 1;
        if self.since_change < 16 {
            return;
        }
        let deepest = self.recent.iter().filter(|(_, a)| *a >= self.depth).count() as f64 / self.recent.len() as f64;
        let next = if deepest > 0.7 && self.depth < MAX_DEPTH {
            self.depth + 1
        } else if deepest < 0.3 && self.depth > 1 {
            self.depth - 1
        } else {
            self.depth
        };
        if next != self.depth {
            self.depth = next;
            self.recent.clear();
            self.since_change = 0;
        }
    }
}

/// Probability of `id` in a sparse distribution.
pub fn prob(dist: &[(u32, f64)], id: u32) -> f64 {
    dist.iter().find(|(t, _)| *t == id).map_or(0.0, |(_, p)| *p)
}

/// The normalised residual max(0, p − q); `p` itself when the residual has no mass.
pub fn residual(p: &[(u32, f64)], q: &[(u32, f64)]) -> Vec<(u32, f64)> {
    let r: Vec<(u32, f64)> =
        p.iter().map(|&(id, pp)| (id, (pp - prob(q, id)).max(0.0))).filter(|(_, x)| *x > 0.0).collect();
    let total: f64 = r.iter().map(|(_, x)| x).sum();
    if total <= 0.0 { p.to_vec() } else { r.into_iter().map(|(id, x)| (id, x / total)).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_count_positions_and_the_bonus() {
        let mut s = MtpStats::new(2);
        s.record(2, 2, 3);
        s.record(2, 0, 1);
        s.record(2, 1, 2);
        assert_eq!((s.steps, s.drafted, s.accepted), (3, 6, 3));
        assert_eq!(s.per_position, vec![2.0 / 3.0, 1.0 / 3.0]);
        assert_eq!(s.mean_accepted_length, 2.0);
        assert_eq!(s.history, vec![3, 1, 2]);
    }

    #[test]
    fn auto_depth_follows_acceptance() {
        let mut c = DepthControl::new(MtpParams { depth: 2, auto: true });
        for _ in 0..16 {
            c.observe(2, 2);
        }
        assert_eq!(c.depth, 3);
        for _ in 0..16 {
            c.observe(3, 0);
        }
        assert_eq!(c.depth, 2);
        let mut fixed = DepthControl::new(MtpParams { depth: 3, auto: false });
        for _ in 0..40 {
            fixed.observe(3, 0);
        }
        assert_eq!(fixed.depth, 3);
    }

    #[test]
    fn residual_is_normalised() {
        let p = [(1, 0.5), (2, 0.3), (3, 0.2)];
        let q = [(1, 0.8), (2, 0.2)];
        let r = residual(&p, &q);
        assert_eq!(r.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 3]);
        assert!((r[0].1 - 0.1 / 0.3).abs() < 1e-12 && (r[1].1 - 0.2 / 0.3).abs() < 1e-12);
        assert_eq!(residual(&p, &p), p.to_vec());
    }
}
