//! Unit formatting shared by the front ends.

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

#[cfg(test)]
mod tests {
    #[test]
    fn durations_below_a_second_are_milliseconds() {
        assert_eq!(super::duration_ms(61.4), "61 ms");
        assert_eq!(super::duration_ms(999.4), "999 ms");
        assert_eq!(super::duration_ms(999.6), "1.0 s");
        assert_eq!(super::duration_ms(2430.0), "2.4 s");
    }
}
