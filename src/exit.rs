//! How a command ends, for the front ends: an error's text on one line, and a stop by a
//! signal (exit 128 + its number). Here, not in the model floor's error, because it speaks
//! `anyhow` and signals, which only the program's edges know.

#![forbid(unsafe_code)]

/// An error and its causes on one line, each cause once: a message that already quotes its
/// cause (`cannot read session X: Is a directory (os error 21)`, whose source is that same
/// I/O error) does not get it appended again.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltascope_model::Error;

    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::from_raw_os_error(21);
        let e = anyhow::Error::new(Error::Io { path: "/tmp".into(), source: io });
        assert_eq!(error_text(&e), "cannot read /tmp: Is a directory (os error 21)");
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_text(&e), "outer: inner");
    }
}

/// A command stopped by a signal after printing what it had finished: `main` exits with
/// 128 + the signal's number, without printing an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted by {}", self.name())]
pub struct Interrupted {
    signal: i32,
}

impl Interrupted {
    /// Stopped by signal number `signal` (SIGINT, SIGTERM, SIGHUP).
    pub fn new(signal: i32) -> Self {
        Interrupted { signal }
    }

    pub fn exit_code(self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(130)
    }

    pub fn name(self) -> &'static str {
        match self.signal {
            signal_hook::consts::SIGTERM => "SIGTERM",
            signal_hook::consts::SIGHUP => "SIGHUP",
            _ => "SIGINT",
        }
    }
}
