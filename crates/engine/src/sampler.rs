//! Token selection with vLLM / SGLang semantics:
//!
//! 1. penalties on the raw logits — repetition (prompt + generated: positive logits divided,
//!    negative ones multiplied), frequency (× count in the generated tokens) and presence (once
//!    per distinct generated token);
//! 2. temperature 0 ⇒ greedy (argmax of the penalised logits);
//! 3. otherwise logits / temperature, then min-p (relative to the most likely token), top-k, and
//!    top-p over the top-k-renormalised distribution (vLLM's order), then one draw from a
//!    seeded generator (same seed ⇒ same tokens).
//!
//! Nothing sorts the whole vocabulary per token: top-k is a linear-time selection, and top-p
//! widens a selected candidate set only until it holds the requested mass.

use std::collections::HashMap;

use serde::Serialize;

use deltascope_model::cpu::exp;
use deltascope_protocol::SamplingParams;

/// SplitMix64: tiny, fast and reproducible across platforms and versions.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Draws from a distribution with `rng` (no randomness spent on a single certain token).
pub(crate) fn draw_with(dist: &[(u32, f64)], rng: &mut Rng) -> u32 {
    if dist.len() == 1 {
        return dist[0].0;
    }
    let mut u = rng.uniform();
    for &(id, p) in dist {
        if u < p {
            return id;
        }
        u -= p;
    }
    dist[dist.len() - 1].0
}

/// One alternative at a position: token id and its raw log-probability.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
}

/// Per-request sampling state: the seeded generator and the token counts the penalties need.
#[derive(Debug, Clone)]
pub struct Sampler {
    pub(crate) params: SamplingParams,
    rng: Rng,
    /// Count of each token among the generated ones.
    generated: HashMap<u32, u32>,
    /// Tokens of the prompt (repetition penalty covers prompt + generated).
    in_prompt: std::collections::HashSet<u32>,
}

impl Sampler {
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        Sampler {
            rng: Rng::new(params.seed),
            generated: HashMap::new(),
            in_prompt: prompt.iter().copied().collect(),
            params,
        }
    }

    /// Records a generated (or forced) token for the penalties.
    pub fn observe(&mut self, id: u32) {
        *self.generated.entry(id).or_insert(0) += 1;
    }

    /// The logits after penalties (a copy; the raw logits stay untouched for logprobs).
    pub fn penalised(&self, logits: &[f32]) -> Vec<f32> {
        let p = &self.params;
        let mut out = logits.to_vec();
        if p.repetition_penalty != 1.0 {
            for &id in self.in_prompt.iter().chain(self.generated.keys()) {
                if let Some(v) = out.get_mut(id as usize) {
                    *v = if *v > 0.0 { *v / p.repetition_penalty } else { *v * p.repetition_penalty };
                }
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&id, &n) in &self.generated {
                if let Some(v) = out.get_mut(id as usize) {
                    *v -= p.frequency_penalty * n as f32 + p.presence_penalty;
                }
            }
        }
        out
    }

    pub fn is_greedy(&self) -> bool {
        self.params.temperature <= 0.0
    }

    /// The distribution tokens are drawn from, after penalties, temperature, min-p, top-k and
    /// top-p: `(id, probability)` pairs summing to 1. Greedy puts all mass on the argmax.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        let z = self.penalised(logits);
        let p = &self.params;
        if p.temperature <= 0.0 {
            return vec![(argmax(&z), 1.0)];
        }
        let inv_t = 1.0 / p.temperature;
        let zmax = z.iter().cloned().fold(f32::NEG_INFINITY, f32::max) * inv_t;
        // min-p: p_i / p_max = exp(z_i - z_max) ≥ min_p.
        let floor = if p.min_p > 0.0 { zmax + p.min_p.ln() } else { f32::NEG_INFINITY };
        let mut cand: Vec<(u32, f32)> = z
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, v * inv_t))
            .filter(|(_, v)| *v >= floor && v.is_finite())
            .collect();
        if cand.is_empty() {
            return vec![(argmax(&z), 1.0)];
        }
        if p.top_k > 0 && p.top_k < cand.len() {
            cand.select_nth_unstable_by(p.top_k - 1, |a, b| b.1.total_cmp(&a.1));
            cand.truncate(p.top_k);
        }
        if p.top_p < 1.0 {
            cand = top_p_prefix(cand, p.top_p);
        }
        let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let weights: Vec<f64> = cand.iter().map(|c| ((c.1 - max) as f64).exp()).collect();
        let total: f64 = weights.iter().sum();
        cand.iter().zip(weights).map(|(c, w)| (c.0, w / total)).collect()
    }

    /// Draws from a distribution with the request's generator.
    pub fn draw(&mut self, dist: &[(u32, f64)]) -> u32 {
        draw_with(dist, &mut self.rng)
    }

    /// Chooses the next token.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let d = self.distribution(logits);
        self.draw(&d)
    }

    /// Uniform in [0, 1) from the request's generator.
    pub fn uniform(&mut self) -> f64 {
        self.rng.uniform()
    }
}

/// The smallest set of most likely candidates whose probability (renormalised over `cand`)
/// reaches `top_p`, best first. Selects the 64 best, then 1024, … before sorting anything.
fn top_p_prefix(mut cand: Vec<(u32, f32)>, top_p: f32) -> Vec<(u32, f32)> {
    let max = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
    let total: f64 = cand.iter().map(|c| ((c.1 - max) as f64).exp()).sum();
    let mut k = 64;
    loop {
        let n = cand.len();
        if k < n {
            cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
        }
        let head = k.min(n);
        cand[..head].sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut mass = 0f64;
        for i in 0..head {
            mass += ((cand[i].1 - max) as f64).exp() / total;
            // vLLM keeps a token while the mass before it is below top_p.
            if mass >= top_p as f64 {
                cand.truncate(i + 1);
                return cand;
            }
        }
        if head == n {
            return cand;
        }
        k *= 16;
    }
}

pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// What each generated token reports about the distribution it came from, from one pass over
/// the logits.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LogitSummary {
    /// `log Σ exp(logits)`: a token's log-probability is its logit minus this.
    pub log_z: f64,
    /// Entropy (nats) of `softmax(logits)`.
    pub entropy: f32,
}

impl LogitSummary {
    /// One pass, shifted by the maximum: ln Σe^d and ln Σe^d − Σ p·d with d = x − max. The
    /// exponentials are the model's f32 `exp` (within 2 ulp; a term below e^−87 counts as 0
    /// against the maximum's 1), summed in f64. Why not libm's f64 `exp`, a pass each for the
    /// log-probability and the entropy: over a 248k vocabulary that was ~2 ms a token, serial,
    /// while the thread pool waited (3-4 % of a 0.8B decode step on 2 cores).
    pub(crate) fn of(logits: &[f32]) -> LogitSummary {
        const W: usize = 16;
        let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        let (mut z, mut zx) = (0f64, 0f64);
        let mut chunks = logits.chunks_exact(W);
        for c in &mut chunks {
            // Sixteen at a time so the exponentials compile to vector instructions.
            let d: [f32; W] = std::array::from_fn(|i| c[i] - max);
            let e: [f32; W] = std::array::from_fn(|i| exp(d[i]));
            for i in 0..W {
                z += f64::from(e[i]);
                zx += f64::from(e[i]) * f64::from(d[i]);
            }
        }
        for &v in chunks.remainder() {
            let d = v - max;
            let e = f64::from(exp(d));
            z += e;
            zx += e * f64::from(d);
        }
        let ln_z = z.ln();
        LogitSummary { log_z: f64::from(max) + ln_z, entropy: (ln_z - zx / z).max(0.0) as f32 }
    }

    /// `log_softmax(logits)[id]`.
    pub(crate) fn logprob(&self, logits: &[f32], id: u32) -> f32 {
        (f64::from(logits[id as usize]) - self.log_z) as f32
    }
}

/// `log Σ exp(logits)`. (The tests' spelling of [`LogitSummary`].)
#[cfg(test)]
pub(crate) fn log_sum_exp(logits: &[f32]) -> f64 {
    LogitSummary::of(logits).log_z
}

/// Entropy (nats) of `softmax(logits)`. (The tests' spelling of [`LogitSummary`].)
#[cfg(test)]
pub(crate) fn entropy(logits: &[f32]) -> f32 {
    LogitSummary::of(logits).entropy
}

/// `log_softmax(logits)[id]`. (The tests' spelling of [`LogitSummary`].)
#[cfg(test)]
pub(crate) fn logprob(logits: &[f32], id: u32) -> f32 {
    LogitSummary::of(logits).logprob(logits, id)
}

/// The `k` most likely tokens under the raw distribution, best first. (The tests' spelling of [`LogitSummary`].)
#[cfg(test)]
pub(crate) fn top_logprobs(logits: &[f32], k: usize) -> Vec<TokenLogprob> {
    top_logprobs_of(logits, &LogitSummary::of(logits), k)
}

/// The `k` most likely tokens under the raw distribution, best first, given the logits' summary.
pub(crate) fn top_logprobs_of(logits: &[f32], summary: &LogitSummary, k: usize) -> Vec<TokenLogprob> {
    if k == 0 {
        return vec![];
    }
    let lse = summary.log_z;
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let k = k.min(idx.len());
    idx.select_nth_unstable_by(k - 1, |a, b| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b)));
    idx.truncate(k);
    idx.sort_by(|a, b| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b)));
    idx.into_iter().map(|id| TokenLogprob { id, logprob: (logits[id as usize] as f64 - lse) as f32 }).collect()
}

#[cfg(test)]
mod entropy_tests {
    use super::entropy;

    #[test]
    fn entropy_of_known_distributions() {
        // Uniform over 4: ln 4.
        assert!((entropy(&[0.0; 4]) - 4f32.ln()).abs() < 1e-6);
        // One certain token: 0.
        assert!(entropy(&[0.0, -1e4, -1e4]) < 1e-6);
        // p = (0.5, 0.5, 0): ln 2.
        assert!((entropy(&[1.0, 1.0, -1e4]) - 2f32.ln()).abs() < 1e-6);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltascope_protocol::Preset;

    fn draws(params: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(params, &[]);
        (0..n).map(|_| s.sample(logits)).collect()
    }

    fn freq(d: &[u32], id: u32) -> f64 {
        d.iter().filter(|&&x| x == id).count() as f64 / d.len() as f64
    }

    #[test]
    fn greedy_at_temperature_zero() {
        assert_eq!(draws(SamplingParams::default(), &[0.1, 2.0, -1.0, 1.9], 5), vec![1; 5]);
    }

    #[test]
    fn same_seed_same_tokens() {
        let p = SamplingParams { temperature: 1.0, seed: 7, ..Default::default() };
        let l = [0.1, 2.0, -1.0, 1.9, 0.5];
        assert_eq!(draws(p.clone(), &l, 50), draws(p.clone(), &l, 50));
        assert_ne!(draws(p.clone(), &l, 50), draws(SamplingParams { seed: 8, ..p }, &l, 50));
    }

    #[test]
    fn temperature_follows_the_distribution() {
        let l = [0.0f32, (3.0f32).ln()]; // p = 0.25, 0.75
        let d = draws(SamplingParams { temperature: 1.0, seed: 42, ..Default::default() }, &l, 20000);
        assert!((freq(&d, 1) - 0.75).abs() < 0.015);
        // Temperature 0.5 squares the odds: 9 : 1.
        let d = draws(SamplingParams { temperature: 0.5, seed: 42, ..Default::default() }, &l, 20000);
        assert!((freq(&d, 1) - 0.9).abs() < 0.01, "{}", freq(&d, 1));
    }

    #[test]
    fn top_k_top_p_min_p_cut_the_tail() {
        // probabilities ∝ 8, 4, 2, 1, 1
        let l: Vec<f32> = [8f32, 4., 2., 1., 1.].iter().map(|x| x.ln()).collect();
        let base = SamplingParams { temperature: 1.0, seed: 3, ..Default::default() };
        let d = draws(SamplingParams { top_k: 2, ..base.clone() }, &l, 3000);
        assert!(d.iter().all(|&x| x < 2) && (freq(&d, 0) - 2.0 / 3.0).abs() < 0.03);
        // top_p 0.7: 8/16 = 0.5 < 0.7, 12/16 = 0.75 ≥ 0.7 → tokens 0 and 1.
        let d = draws(SamplingParams { top_p: 0.7, ..base.clone() }, &l, 3000);
        assert!(d.iter().all(|&x| x < 2) && d.contains(&1));
        // top_p is applied over the top-k-renormalised distribution: with k = 3 the masses are
        // 8/14, 12/14 → top_p 0.8 keeps two.
        let d = draws(SamplingParams { top_k: 3, top_p: 0.8, ..base.clone() }, &l, 3000);
        assert!(d.iter().all(|&x| x < 2));
        // min_p 0.3: keep p ≥ 0.3 · p_max → 8, 4 (2/8 = 0.25 is cut).
        let d = draws(SamplingParams { min_p: 0.3, ..base.clone() }, &l, 3000);
        assert!(d.iter().all(|&x| x < 2) && d.contains(&1));
    }

    #[test]
    fn top_p_over_a_large_flat_vocabulary() {
        // 248k tokens, nearly flat: the candidate set must widen past its first selections.
        let l: Vec<f32> = (0..248_320).map(|i| (i % 7) as f32 * 1e-3).collect();
        let d = draws(SamplingParams { temperature: 1.0, top_p: 0.5, seed: 1, ..Default::default() }, &l, 200);
        let distinct: std::collections::HashSet<_> = d.iter().collect();
        assert!(distinct.len() > 150, "{}", distinct.len());
    }

    #[test]
    fn penalties_follow_vllm() {
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..Default::default() }, &[0]);
        s.observe(2);
        let z = s.penalised(&[4.0, 4.0, -1.0, 1.0]);
        // Prompt token 0 (positive) is divided, generated token 2 (negative) multiplied.
        assert_eq!(z, vec![2.0, 4.0, -2.0, 1.0]);
        let mut s =
            Sampler::new(SamplingParams { frequency_penalty: 0.5, presence_penalty: 1.0, ..Default::default() }, &[0]);
        s.observe(1);
        s.observe(1);
        s.observe(3);
        // Prompt tokens are not penalised by frequency / presence.
        assert_eq!(s.penalised(&[1.0, 1.0, 1.0, 1.0]), vec![1.0, -1.0, 1.0, -0.5]);
        // And the penalty changes the greedy choice.
        assert_eq!(s.sample(&[0.0, 1.5, 0.2, 0.0]), 2);
    }

    #[test]
    fn presets_match_the_model_cards() {
        let mut p = SamplingParams { seed: 9, ..Default::default() };
        Preset::ThinkingGeneral.apply(&mut p);
        assert_eq!(
            (p.temperature, p.top_p, p.top_k, p.min_p, p.presence_penalty, p.repetition_penalty, p.seed),
            (1.0, 0.95, 20, 0.0, 1.5, 1.0, 9)
        );
        Preset::InstructReasoning.apply(&mut p);
        assert_eq!((p.temperature, p.top_p, p.top_k, p.presence_penalty), (1.0, 1.0, 40, 2.0));
        assert_eq!(Preset::parse("thinking-coding"), Some(Preset::ThinkingCoding));
    }

    #[test]
    fn top_logprobs_are_sorted_and_normalised() {
        let l = [1.0f32, 3.0, 2.0, 0.0];
        let t = top_logprobs(&l, 2);
        assert_eq!(t.iter().map(|x| x.id).collect::<Vec<_>>(), vec![1, 2]);
        let total: f64 = l.iter().map(|&v| ((v as f64) - log_sum_exp(&l)).exp()).sum();
        // The exponentials behind log_z are f32 (2 ulp): the total is 1 to f32's precision.
        assert!((total - 1.0).abs() < 1e-6, "{total}");
        assert!((t[0].logprob - logprob(&l, 1)).abs() < 1e-7);
    }

    #[test]
    fn the_one_pass_summary_matches_f64_exponentials_over_a_vocabulary() {
        // A 248k vocabulary of spread-out logits, plus a remainder past the 16-wide chunks.
        let l: Vec<f32> =
            (0..248_331u32).map(|i| ((i.wrapping_mul(2_654_435_761) >> 8) % 4000) as f32 / 100.0 - 25.0).collect();
        let max = l.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let z: f64 = l.iter().map(|&v| (v as f64 - max).exp()).sum();
        let zx: f64 = l.iter().map(|&v| (v as f64 - max).exp() * (v as f64 - max)).sum();
        let s = LogitSummary::of(&l);
        assert!((s.log_z - (max + z.ln())).abs() < 1e-6, "{} vs {}", s.log_z, max + z.ln());
        let h = z.ln() - zx / z;
        assert!(((s.entropy as f64) - h).abs() < 1e-5 * h, "{} vs {h}", s.entropy);
        for id in [0u32, 17, 248_330] {
            let want = l[id as usize] as f64 - max - z.ln();
            assert!((s.logprob(&l, id) as f64 - want).abs() < 1e-5, "token {id}");
        }
    }
}
