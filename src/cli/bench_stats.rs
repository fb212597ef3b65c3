//! The figures `bench` reports for a set of timed passes: median, min, max and the spread, and
//! whether a difference between two settings is larger than the spread of their passes (a
//! difference inside it is noise, and is marked so).

use serde::Serialize;

/// One figure over the passes that measured it.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// (max − min) / median: 0.1 is ±5 % around the median.
    pub spread: f64,
}

impl Spread {
    /// `None` without samples.
    pub fn of(samples: &[f64]) -> Option<Spread> {
        if samples.is_empty() {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        // The mean of the two middle values for an even count.
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        let (min, max) = (v[0], v[n - 1]);
        Some(Spread { median, min, max, spread: if median > 0.0 { (max - min) / median } else { 0.0 } })
    }

    pub fn range(&self) -> f64 {
        self.max - self.min
    }
}

/// A setting's speed against the baseline's.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Speedup {
    /// Median against median.
    pub median: f64,
    /// The slowest pass against the baseline's fastest, and the fastest against its slowest.
    pub min: f64,
    pub max: f64,
    /// The difference of the medians is smaller than the spread of either setting's passes:
    /// it cannot be told from noise.
    pub within_spread: bool,
}

impl Speedup {
    pub fn of(this: &Spread, base: &Spread) -> Speedup {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let difference = (this.median - base.median).abs();
        Speedup {
            median: ratio(this.median, base.median),
            min: ratio(this.min, base.max),
            max: ratio(this.max, base.min),
            within_spread: difference < this.range().max(base.range()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_min_max_and_spread() {
        let s = Spread::of(&[110.0, 90.0, 100.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (100.0, 90.0, 110.0));
        assert!((s.spread - 0.2).abs() < 1e-12);
        assert_eq!(Spread::of(&[1.0, 3.0]).unwrap().median, 2.0);
        assert_eq!(Spread::of(&[]), None);
    }

    #[test]
    fn a_difference_inside_the_spread_is_marked() {
        let base = Spread::of(&[100.0, 104.0, 96.0]).unwrap();
        // 3 % faster, but the passes spread over 8 %: noise.
        let s = Speedup::of(&Spread::of(&[103.0, 99.0, 107.0]).unwrap(), &base);
        assert!(s.within_spread);
        assert!((s.median - 1.03).abs() < 1e-12);
        assert!(s.min < 1.0 && s.max > 1.0);
        // 40 % faster with the same spread: a real difference.
        let s = Speedup::of(&Spread::of(&[140.0, 136.0, 144.0]).unwrap(), &base);
        assert!(!s.within_spread);
        assert!(s.min > 1.0);
    }
}
