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

use deltascope_protocol::{MAX_DEPTH, MtpMode};

/// Picks the depth for the next step. Fixed unless `auto`, which adapts twice over:
///
/// - **Acceptance**: over the last 16 passes, a deepest draft position accepted more than 70 %
///   of the time earns one more step (up to 4), one accepted less than 30 % of the time costs
///   one (down to 1).
/// - **Cost**: drafting pays only when a verify pass of K + 1 tokens costs less than the tokens
///   it yields would cost one by one. Where the weights sit in cache (the embedded demo) or the
///   kernels are compute-bound, it does not. So after 16 passes at a depth, `auto` decodes 8
///   tokens plainly and compares wall time per token; if plain decoding is faster it turns MTP
///   off (depth 0) and tries again after 256 tokens, then 512, … up to 4096, so a slow setting
///   costs a few percent at most and a change (a longer context, another phase) is noticed.
///
/// What `auto` has learned outlives one generation: the engine hands it to the next request on
/// the same model ([`AutoVerdict`]), so short requests (chat turns, server calls) do not each
/// pay for measuring drafting that lost a moment ago.
#[derive(Debug, Clone)]
pub(crate) struct DepthControl {
    pub depth: usize,
    auto: bool,
    recent: VecDeque<(usize, usize)>,
    since_change: usize,
    cost: CostProbe,
}

/// Where `auto` stood when a generation ended: the depth it drafts at (or goes back to), and
/// whether drafting was off, with how many plain tokens were left before the next try and how
/// long the wait after that one would be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AutoVerdict {
    depth: usize,
    off_left: Option<usize>,
    backoff: usize,
}

/// Per-token wall time of drafting at the current depth against plain decoding (auto only).
#[derive(Debug, Clone, Default)]
struct CostProbe {
    /// Milliseconds and tokens over the passes at the current depth.
    spec: (f64, usize),
    spec_passes: usize,
    /// Milliseconds and tokens over the latest plain steps.
    plain: (f64, usize),
    mode: Probe,
    /// Plain tokens to decode before the next retry of drafting.
    backoff: usize,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum Probe {
    /// Drafting at `depth`, measuring it.
    #[default]
    Drafting,
    /// Decoding plainly for `left` more tokens to measure that; `resume` is the depth to go back to.
    Plain { left: usize, resume: usize },
    /// Drafting lost: plain for `left` more tokens, then try `resume` again.
    Off { left: usize, resume: usize },
}

/// Passes at one depth before its cost is compared, plain tokens measured against them, and the
/// first and longest wait before drafting is tried again after losing.
const COST_PASSES: usize = 16;
const PLAIN_SAMPLES: usize = 8;
const RETRY_FIRST: usize = 256;
const RETRY_MAX: usize = 4096;

impl DepthControl {
    pub(crate) fn new(p: MtpMode) -> Self {
        DepthControl {
            depth: p.depth().min(MAX_DEPTH),
            auto: p.is_auto(),
            recent: VecDeque::new(),
            since_change: 0,
            cost: CostProbe { backoff: RETRY_FIRST, ..Default::default() },
        }
    }

    /// `auto` carried on from where an earlier generation on the same model left it: off for the
    /// plain tokens that were left (then drafting is tried again, the wait doubling as before),
    /// or drafting at the depth it had reached, measured afresh.
    pub(crate) fn resume(v: AutoVerdict) -> Self {
        let mut c = DepthControl::new(MtpMode::Auto);
        c.cost.backoff = v.backoff;
        let depth = v.depth.clamp(1, MAX_DEPTH);
        match v.off_left {
            Some(left) if left > 0 => {
                c.depth = 0;
                c.cost.mode = Probe::Off { left, resume: depth };
            }
            _ => c.depth = depth,
        }
        c
    }

    /// What the next generation should carry on from (`auto` only). A cost measurement cut
    /// short by the end of a generation is dropped: the next one drafts and measures again.
    pub(crate) fn verdict(&self) -> Option<AutoVerdict> {
        if !self.auto {
            return None;
        }
        let (depth, off_left) = match self.cost.mode {
            Probe::Drafting => (self.depth, None),
            Probe::Plain { resume, .. } => (resume, None),
            Probe::Off { left, resume } => (resume, Some(left)),
        };
        Some(AutoVerdict { depth, off_left, backoff: self.cost.backoff })
    }

    /// Whether `auto` has turned drafting off for now (depth 0) because plain decoding measured
    /// faster (what the tests ask).
    #[cfg(test)]
    pub(crate) fn is_off(&self) -> bool {
        matches!(self.cost.mode, Probe::Off { .. })
    }

    /// One verify pass: `drafted` drafts, `accepted` of them kept, `produced` tokens appended,
    /// `ms` of wall time since the previous pass (`None` when the previous step was not a pass
    /// at this depth, e.g. the first one after plain steps, which also catches the head up).
    pub(crate) fn observe(&mut self, drafted: usize, accepted: usize, produced: usize, ms: Option<f64>) {
        if !self.auto || self.cost.mode != Probe::Drafting {
            return;
        }
        if let Some(ms) = ms {
            self.cost.spec.0 += ms;
            self.cost.spec.1 += produced;
            self.cost.spec_passes += 1;
        }
        if self.cost.spec_passes >= COST_PASSES {
            // Measured enough at this depth: now measure plain decoding against it.
            self.cost.mode = Probe::Plain { left: PLAIN_SAMPLES, resume: self.depth };
            self.cost.plain = (0.0, 0);
            self.depth = 0;
            return;
        }
        if drafted < self.depth {
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
            self.set_depth(next);
        }
    }

    /// One token decoded plainly while `auto` runs at depth 0, `ms` since the previous plain
    /// step (`None` when the previous step was a verify pass).
    pub(crate) fn observe_plain(&mut self, ms: Option<f64>) {
        if !self.auto {
            return;
        }
        match self.cost.mode {
            Probe::Drafting => {}
            Probe::Plain { left, resume } => {
                if let Some(ms) = ms {
                    self.cost.plain.0 += ms;
                    self.cost.plain.1 += 1;
                }
                let left = if ms.is_some() { left - 1 } else { left };
                if left > 0 {
                    self.cost.mode = Probe::Plain { left, resume };
                    return;
                }
                let per_spec = self.cost.spec.0 / self.cost.spec.1.max(1) as f64;
                let per_plain = self.cost.plain.0 / self.cost.plain.1.max(1) as f64;
                if per_spec < per_plain {
                    self.cost.backoff = RETRY_FIRST;
                    self.set_depth(resume);
                } else {
                    self.cost.mode = Probe::Off { left: self.cost.backoff, resume };
                    self.cost.backoff = (self.cost.backoff * 2).min(RETRY_MAX);
                }
            }
            Probe::Off { left, resume } => {
                if left > 1 {
                    self.cost.mode = Probe::Off { left: left - 1, resume };
                } else {
                    self.set_depth(resume);
                }
            }
        }
    }

    fn set_depth(&mut self, depth: usize) {
        self.depth = depth;
        self.recent.clear();
        self.since_change = 0;
        self.cost.mode = Probe::Drafting;
        self.cost.spec = (0.0, 0);
        self.cost.spec_passes = 0;
    }
}

/// Probability of `id` in a sparse distribution.
pub(crate) fn prob(dist: &[(u32, f64)], id: u32) -> f64 {
    dist.iter().find(|(t, _)| *t == id).map_or(0.0, |(_, p)| *p)
}

/// The normalised residual max(0, p − q); `p` itself when the residual has no mass.
pub(crate) fn residual(p: &[(u32, f64)], q: &[(u32, f64)]) -> Vec<(u32, f64)> {
    let r: Vec<(u32, f64)> =
        p.iter().map(|&(id, pp)| (id, (pp - prob(q, id)).max(0.0))).filter(|(_, x)| *x > 0.0).collect();
    let total: f64 = r.iter().map(|(_, x)| x).sum();
    if total <= 0.0 { p.to_vec() } else { r.into_iter().map(|(id, x)| (id, x / total)).collect() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltascope_protocol::MtpStats;

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
        let mut c = DepthControl::new(MtpMode::Auto);
        // No timings (as if every pass followed a plain step): only acceptance steers.
        for _ in 0..16 {
            c.observe(2, 2, 3, None);
        }
        assert_eq!(c.depth, 3);
        for _ in 0..16 {
            c.observe(3, 0, 1, None);
        }
        assert_eq!(c.depth, 2);
        let mut fixed = DepthControl::new(MtpMode::fixed(3));
        for _ in 0..40 {
            fixed.observe(3, 0, 1, Some(1.0));
            fixed.observe_plain(Some(0.1));
        }
        assert_eq!(fixed.depth, 3);
    }

    /// Runs `auto` against a machine where a pass at depth d costs `pass(d)` ms and a plain
    /// step `plain` ms, every draft accepted; returns the depth after `tokens` tokens and the
    /// wall time spent.
    fn simulate(pass: impl Fn(usize) -> f64, plain: f64, tokens: usize) -> (usize, f64, bool) {
        let mut c = DepthControl::new(MtpMode::Auto);
        let (mut made, mut ms, mut last_plain) = (0, 0.0, false);
        while made < tokens {
            if c.depth == 0 {
                c.observe_plain(last_plain.then_some(plain));
                ms += plain;
                made += 1;
                last_plain = true;
            } else {
                let d = c.depth;
                c.observe(d, d, d + 1, (!last_plain).then_some(pass(d)));
                ms += pass(d);
                made += d + 1;
                last_plain = false;
            }
        }
        (c.depth, ms, c.is_off())
    }

    #[test]
    fn auto_turns_drafting_off_where_it_does_not_pay() {
        // The demo's case: weights in cache, a pass of d + 1 tokens costs d + 1.3 steps.
        let (depth, ms, off) = simulate(|d| d as f64 + 1.3, 1.0, 4000);
        assert!(off && depth == 0, "depth {depth}");
        // Retries cost a little: within 5 % of plain decoding throughout.
        assert!(ms < 4000.0 * 1.05, "{ms} ms for 4000 plain-ms of tokens");
        // A bandwidth-bound model: a pass costs little more than one step; drafting stays on.
        let (depth, ms, off) = simulate(|d| 1.0 + 0.1 * d as f64, 1.0, 4000);
        assert!(!off && depth >= 2, "depth {depth}");
        assert!(ms < 4000.0 * 0.5, "{ms}");
    }

    #[test]
    fn auto_tries_drafting_again_after_backing_off() {
        let mut c = DepthControl::new(MtpMode::Auto);
        for _ in 0..COST_PASSES {
            c.observe(2, 2, 3, Some(30.0));
        }
        assert_eq!(c.depth, 0, "measuring plain now");
        c.observe_plain(None);
        for _ in 0..PLAIN_SAMPLES {
            c.observe_plain(Some(1.0));
        }
        assert!(c.is_off());
        for _ in 0..RETRY_FIRST {
            c.observe_plain(Some(1.0));
        }
        assert_eq!(c.depth, 2, "back to the depth it left");
        assert!(!c.is_off());
    }

    #[test]
    fn a_verdict_carries_auto_on_into_the_next_generation() {
        // Drafting lost: off for RETRY_FIRST plain tokens.
        let mut c = DepthControl::new(MtpMode::Auto);
        for _ in 0..COST_PASSES {
            c.observe(2, 2, 3, Some(30.0));
        }
        c.observe_plain(None);
        for _ in 0..PLAIN_SAMPLES {
            c.observe_plain(Some(1.0));
        }
        // The generation ends 100 plain tokens into the wait.
        for _ in 0..100 {
            c.observe_plain(Some(1.0));
        }
        let v = c.verdict().unwrap();
        let mut next = DepthControl::resume(v);
        assert!(next.is_off() && next.depth == 0, "the next generation starts plain");
        for _ in 0..RETRY_FIRST - 101 {
            next.observe_plain(Some(1.0));
        }
        assert!(next.is_off(), "one plain token left of the wait");
        next.observe_plain(Some(1.0));
        assert_eq!(next.depth, 2, "then drafting is tried at the depth it left");
        // Losing again doubles the wait, as within one generation.
        for _ in 0..COST_PASSES {
            next.observe(2, 2, 3, Some(30.0));
        }
        next.observe_plain(None);
        for _ in 0..PLAIN_SAMPLES {
            next.observe_plain(Some(1.0));
        }
        assert_eq!(next.verdict().unwrap().off_left, Some(2 * RETRY_FIRST));

        // Drafting that pays carries its depth; a fixed depth has no verdict.
        let mut won = DepthControl::new(MtpMode::Auto);
        for _ in 0..16 {
            won.observe(2, 2, 3, None);
        }
        assert_eq!(won.depth, 3);
        let resumed = DepthControl::resume(won.verdict().unwrap());
        assert_eq!((resumed.depth, resumed.is_off()), (3, false));
        assert_eq!(DepthControl::new(MtpMode::fixed(2)).verdict(), None);
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
