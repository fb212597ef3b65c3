//! Online detection of degenerate loops ("2 + 2 = 2.2 + 2 = 2.2 + 2 = 2…").
//!
//! Two signals, both O(1)–O(64) per token:
//! * an exact period: for every period p in 1..=64 the detector keeps how many consecutive
//!   tokens equal the token p positions earlier; a loop is a run that covers `min_repeats`
//!   copies of the period *and* at least `min_span` tokens (so short legitimate repeats — a
//!   table rule, "}}}", a run of spaces — never fire);
//! * an n-gram repeat ratio: over the last `window` tokens, the share of n-grams already seen
//!   in that window (catches loops whose period drifts by a token).
//!
//! Lists, tables and code repeat structure but not token sequences (the numbers, cells and
//! names change), so they stay below both thresholds.

use std::collections::{HashMap, VecDeque};

use serde::{Deserialize, Serialize};

pub const MAX_PERIOD: usize = 64;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoopParams {
    /// Copies of the period a run must cover.
    pub min_repeats: usize,
    /// Tokens a run must cover.
    pub min_span: usize,
    /// n of the n-gram signal.
    pub ngram: usize,
    /// Tokens the n-gram signal looks back over (0 = off).
    pub window: usize,
    /// Share of repeated n-grams in the window that counts as a loop.
    pub ngram_ratio: f32,
    /// Stop generation (finish_reason `loop`) when a loop is detected.
    pub auto_stop: bool,
}

impl Default for LoopParams {
    fn default() -> Self {
        LoopParams { min_repeats: 4, min_span: 48, ngram: 6, window: 256, ngram_ratio: 0.8, auto_stop: false }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LoopReport {
    /// Period in tokens (for the n-gram signal: the most common distance between repeats).
    pub period: usize,
    /// Index (among the observed tokens) where the repetition starts.
    pub start: usize,
    /// Index of the token at which the loop was recognised.
    pub at: usize,
}

#[derive(Debug, Clone)]
pub struct LoopDetector {
    params: LoopParams,
    history: Vec<u32>,
    /// `run[p-1]`: consecutive tokens equal to the token p earlier, ending at the last token.
    run: [usize; MAX_PERIOD],
    recent: VecDeque<u64>,
    counts: HashMap<u64, u32>,
    fired: bool,
}

impl LoopDetector {
    pub fn new(params: LoopParams) -> Self {
        LoopDetector {
            params,
            history: vec![],
            run: [0; MAX_PERIOD],
            recent: VecDeque::new(),
            counts: HashMap::new(),
            fired: false,
        }
    }

    /// Feeds one token; returns a report the first time a loop is recognised.
    pub fn push(&mut self, id: u32) -> Option<LoopReport> {
        self.history.push(id);
        let t = self.history.len() - 1;
        let mut found: Option<LoopReport> = None;
        for p in 1..=MAX_PERIOD {
            if t >= p && self.history[t - p] == id {
                self.run[p - 1] += 1;
            } else {
                self.run[p - 1] = 0;
            }
            let r = self.run[p - 1];
            // A run of r matches spans r + p tokens: (r + p) / p copies of the period.
            if found.is_none() && r + p >= self.params.min_span && r + p >= p * self.params.min_repeats {
                found = Some(LoopReport { period: p, start: t + 1 - (r + p), at: t });
            }
        }
        if found.is_none() {
            found = self.ngram_signal(t);
        }
        match found {
            Some(r) if !self.fired => {
                self.fired = true;
                Some(r)
            }
            _ => None,
        }
    }

    fn ngram_signal(&mut self, t: usize) -> Option<LoopReport> {
        let (n, w) = (self.params.ngram, self.params.window);
        if w == 0 || t + 1 < n {
            return None;
        }
        let key = self.history[t + 1 - n..=t]
            .iter()
            .fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ x as u64).wrapping_mul(0x100_0000_01b3));
        *self.counts.entry(key).or_insert(0) += 1;
        self.recent.push_back(key);
        if self.recent.len() > w {
            let old = self.recent.pop_front().unwrap_or_default();
            if let Some(c) = self.counts.get_mut(&old) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&old);
                }
            }
        }
        // n-grams in the window that repeat an earlier one in it.
        let repeated = self.recent.len() - self.counts.len();
        if self.recent.len() < w || (repeated as f32) < self.params.ngram_ratio * w as f32 {
            return None;
        }
        // The period: the most common distance back to an n-gram's previous occurrence.
        let last = &self.history[t + 1 - w..=t];
        let mut seen: HashMap<&[u32], usize> = HashMap::new();
        let mut dist: HashMap<usize, usize> = HashMap::new();
        for i in 0..=last.len() - n {
            if let Some(j) = seen.insert(&last[i..i + n], i) {
                *dist.entry(i - j).or_default() += 1;
            }
        }
        let period = dist.into_iter().max_by_key(|(d, c)| (*c, usize::MAX - d)).map(|(d, _)| d).unwrap_or(1);
        Some(LoopReport { period, start: t + 1 - w, at: t })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn first_report(tokens: &[u32], params: LoopParams) -> Option<LoopReport> {
        let mut d = LoopDetector::new(params);
        tokens.iter().find_map(|&t| d.push(t))
    }

    fn ids(text: &str) -> Vec<u32> {
        // One "token" per character: enough to shape synthetic sequences.
        text.chars().map(|c| c as u32).collect()
    }

    #[test]
    fn detects_a_short_period_loop() {
        let mut t = ids("The sum is computed as follows. ");
        let start = t.len();
        for _ in 0..30 {
            t.extend(ids("2 + 2 = 2."));
        }
        let r = first_report(&t, LoopParams::default()).expect("a loop");
        assert_eq!(r.period, 10);
        assert!(r.start >= start && r.start <= start + 1, "{r:?}");
        assert!(r.at < start + 60, "recognised late: {r:?}");
    }

    #[test]
    fn detects_a_single_token_loop_and_a_long_period() {
        let mut t = ids("ok ");
        t.extend(std::iter::repeat_n(7u32, 100));
        assert_eq!(first_report(&t, LoopParams::default()).unwrap().period, 1);
        let phrase: Vec<u32> = (1000..1050).collect(); // a 50-token sentence, repeated
        let t: Vec<u32> = phrase.iter().cycle().take(400).copied().collect();
        let r = first_report(&t, LoopParams::default()).unwrap();
        assert_eq!(r.period, 50);
        assert!(r.at >= 199, "needs 4 copies: {r:?}");
    }

    #[test]
    fn reports_once() {
        let t = vec![5u32; 500];
        let mut d = LoopDetector::new(LoopParams::default());
        assert_eq!(t.iter().filter_map(|&x| d.push(x)).count(), 1);
    }

    #[test]
    fn ngram_signal_catches_a_drifting_loop() {
        // The cycle grows by one token every copy, so no exact period survives four copies.
        let mut t = vec![];
        let mut extra = 0;
        while t.len() < 900 {
            t.extend(ids("and then we add the carry "));
            t.extend(std::iter::repeat_n(9u32, extra % 3));
            extra += 1;
        }
        let exact_only = LoopParams { window: 0, ..Default::default() };
        let r = first_report(&t, exact_only);
        assert!(r.is_none(), "the exact-period signal should miss this one: {r:?}");
        assert!(first_report(&t, LoopParams::default()).is_some());
    }

    #[test]
    fn lists_tables_and_code_are_not_loops() {
        let mut list = String::new();
        for i in 1..=60 {
            list.push_str(&format!("{i}. item number {i}\n"));
        }
        let mut table = String::from("| name | value |\n|------|-------|\n");
        for i in 0..40 {
            table.push_str(&format!("| row{i} | {} |\n", i * 37 % 101));
        }
        // Code with repetitive structure: similar match arms, closing braces, a rule line.
        let mut code = String::from("fn classify(x: u32) -> &'static str {\n    match x {\n");
        for (i, name) in
            ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven"]
                .iter()
                .enumerate()
        {
            code.push_str(&format!("        {i} => \"{name}\",\n"));
        }
        code.push_str("        _ => \"many\",\n    }\n}\n\nfn main() {\n    for i in 0..20 {\n        if i % 2 == 0 {\n            println!(\"{} {}\", i, classify(i));\n        }\n    }\n}\n}\n}\n}\n");
        code.push_str(&"    ".repeat(8));
        code.push_str("// ----------------------------------------\n");
        assert!(code.len() > 400, "{}", code.len());
        let thinking = "First, 2 + 2 = 4. Then 4 + 4 = 8. Then 8 + 8 = 16. Then 16 + 16 = 32. Then 32 + 32 = 64. Then 64 + 64 = 128.";
        for text in [list.as_str(), table.as_str(), code.as_str(), thinking] {
            assert!(text.len() > 100);
            assert!(first_report(&ids(text), LoopParams::default()).is_none(), "false alarm on:\n{text}");
        }
    }
}
