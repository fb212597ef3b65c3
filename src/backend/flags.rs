//! The value parsers of the generation flags: a count, a 32-bit float, an `--on-loop` value.
//! Each says what is allowed instead of clap's bare "invalid value"; each flag's own range is
//! checked where the settings meet (`GenerationParams::check`).

use deltascope_protocol::OnLoop;

/// A count flag: a whole number, 0 or more (so `--max-tokens -1` says what is allowed instead
/// of clap's "unexpected argument"); each flag's own range is checked where the settings meet.
/// A sampling value: any number a 32-bit float holds (NaN and ±inf pass, for the range checks
/// to name); one past its range (`1e39`) is refused as typed instead of turning into inf.
pub fn float32(s: &str) -> Result<f32, String> {
    let v: f64 = s.trim().parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_finite() && v.abs() > f32::MAX as f64 {
        return Err(format!("{s} is beyond the range of a 32-bit float (±3.4e38)"));
    }
    Ok(v as f32)
}

/// `--on-loop`: off, stop or answer.
pub fn on_loop(s: &str) -> Result<OnLoop, String> {
    s.parse()
}

pub fn whole_number(s: &str) -> Result<usize, String> {
    let t = s.trim();
    if let Ok(n) = t.parse::<usize>() {
        return Ok(n);
    }
    // `1e3` is a whole number too; `1e23` is one past what a count can hold.
    match t.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v < 9_007_199_254_740_992.0 => Ok(v as usize),
        Ok(v) if v.is_finite() && v >= 0.0 && v.fract() == 0.0 => Err(format!(
            "{s} is too large: a count here is at most {} (and max_tokens at most the model's context)",
            usize::MAX
        )),
        _ => Err(format!("expected a whole number (0 or more), found {s}")),
    }
}
