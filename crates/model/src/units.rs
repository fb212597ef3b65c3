//! Unit formatting shared by the front ends.

#![forbid(unsafe_code)]

/// Bytes in human units (binary), two decimals: `1.50 GiB`.
pub fn human_bytes(b: u64) -> String {
    bytes_in_units(b, 2)
}

/// Bytes in human units with one decimal, for narrow gauges: `1.5 GiB`.
pub fn short_bytes(b: u64) -> String {
    bytes_in_units(b, 1)
}

fn bytes_in_units(b: u64, decimals: usize) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{b} B") } else { format!("{v:.decimals$} {}", UNITS[u]) }
}

/// A duration for people: milliseconds below a second (`340 ms`), else seconds with one
/// decimal (`2.4 s`).
pub fn duration_ms(ms: f64) -> String {
    if ms < 999.5 { format!("{:.0} ms", ms.max(0.0)) } else { format!("{:.1} s", ms / 1000.0) }
}

/// A number in four significant digits, without a wall of zeros.
pub fn sig4(v: f32) -> String {
    let a = v.abs();
    if !v.is_finite() {
        if v.is_nan() {
            "NaN".into()
        } else if v > 0.0 {
            "∞".into()
        } else {
            "−∞".into()
        }
    } else if a != 0.0 && !(1e-3..1e4).contains(&a) {
        format!("{v:.3e}").replace('-', "−")
    } else {
        // Four significant digits (at most four decimals), trailing zeros dropped.
        let decimals = if a == 0.0 { 0 } else { (3 - a.log10().floor() as i32).clamp(0, 4) as usize };
        let s = format!("{v:.decimals$}");
        let s = if s.contains('.') { s.trim_end_matches('0').trim_end_matches('.').to_string() } else { s };
        s.replace('-', "−")
    }
}

#[cfg(test)]
mod tests {
    use super::sig4 as sig;

    #[test]
    fn four_significant_digits() {
        assert_eq!(sig(0.41234), "0.4123");
        assert_eq!(sig(-0.12), "−0.12");
        assert_eq!(sig(12345.0), "1.234e4");
        assert_eq!(sig(6_931.472), "6931");
        assert_eq!(sig(13.5335), "13.53");
        assert_eq!(sig(-1e-4), "−1.000e−4");
        assert_eq!(sig(0.0), "0");
        assert_eq!(sig(f32::INFINITY), "∞");
    }

    #[test]
    fn durations_below_a_second_are_milliseconds() {
        assert_eq!(super::duration_ms(61.4), "61 ms");
        assert_eq!(super::duration_ms(999.4), "999 ms");
        assert_eq!(super::duration_ms(999.6), "1.0 s");
        assert_eq!(super::duration_ms(2430.0), "2.4 s");
    }
}
