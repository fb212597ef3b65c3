//! A command's result as one value. Every subcommand parses its flags, collects a report, then
//! prints it: `print_human` for people, `print_json` (the serialised report) for scripts. The
//! two are renderings of the same value, so they cannot disagree.

use std::io::{self, Write};

use serde::Serialize;

/// What a subcommand found, collected before anything is printed.
pub(crate) trait Report: Serialize {
    /// The text a person reads.
    fn print_human(&self, out: &mut dyn Write) -> io::Result<()>;

    /// The serialised report (pretty, one trailing newline).
    fn print_json(&self, out: &mut dyn Write) -> io::Result<()> {
        serde_json::to_writer_pretty(&mut *out, self)?;
        writeln!(out)
    }
}

/// Prints `report` on stdout, as JSON when `json` is set.
pub(crate) fn emit(report: &impl Report, json: bool) -> anyhow::Result<()> {
    let mut out = io::stdout().lock();
    if json {
        report.print_json(&mut out)?
    } else {
        report.print_human(&mut out)?
    }
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Tally {
        name: &'static str,
        count: u32,
    }

    impl Report for Tally {
        fn print_human(&self, out: &mut dyn Write) -> io::Result<()> {
            writeln!(out, "{}: {}", self.name, self.count)
        }
    }

    #[test]
    fn the_json_is_the_serialised_report_and_the_text_reads_the_same_value() {
        let t = Tally { name: "tokens", count: 3 };
        let mut json = Vec::new();
        t.print_json(&mut json).unwrap();
        assert_eq!(String::from_utf8(json).unwrap(), "{\n  \"name\": \"tokens\",\n  \"count\": 3\n}\n");
        let mut human = Vec::new();
        t.print_human(&mut human).unwrap();
        assert_eq!(String::from_utf8(human).unwrap(), "tokens: 3\n");
    }
}
