//! A session as a readable Markdown transcript (Ctrl+X in the TUI).

use std::fmt::Write as _;

use super::{Session, format_timestamp};
use deltascope_protocol::FinishReason;

impl Session {
    /// A readable transcript: prompts, thinking (quoted), answers, parameters and statistics.
    pub fn to_markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "# deltascope session {}\n", self.id);
        let _ = writeln!(md, "- model: `{}`", self.model);
        let _ = writeln!(md, "- created: {} UTC", format_timestamp(self.created));
        if let Some(s) = &self.system {
            let _ = writeln!(md, "- system prompt: {s}");
        }
        for (i, t) in self.turns.iter().enumerate() {
            let _ = writeln!(md);
            match t.compare_of {
                Some(of) => {
                    let _ = writeln!(md, "## Turn {} (comparison with turn {})\n", i + 1, of + 1);
                }
                None => {
                    let _ = writeln!(md, "## Turn {}\n", i + 1);
                }
            }
            let _ = writeln!(md, "**User:** {}\n", t.user);
            if !t.thinking.is_empty() {
                let forced = match t.forced_tokens() {
                    0 => String::new(),
                    n => format!(", then {n} forced by the thinking budget"),
                };
                let _ = writeln!(md, "<details><summary>Thinking ({} tokens{forced})</summary>\n", t.thinking_tokens());
                for line in t.thinking.lines() {
                    let _ = writeln!(md, "> {line}");
                }
                let _ = writeln!(md, "\n</details>\n");
            }
            let _ = writeln!(md, "**Answer:**\n\n{}\n", t.answer);
            let settings = t.settings();
            let row = |cells: Vec<&str>| format!("| {} |", cells.join(" | "));
            let _ = writeln!(md, "{}", row(settings.iter().map(|(l, _)| *l).collect()));
            let _ = writeln!(md, "{}", row(vec!["---"; settings.len()]));
            let _ = writeln!(md, "{}\n", row(settings.iter().map(|(_, v)| v.as_str()).collect()));
            let finish =
                t.finish_reason.map(FinishReason::as_str).or(t.error.as_ref().map(|_| "error")).unwrap_or("unfinished");
            let _ = write!(
                md,
                "finish: **{finish}** · thinking {}{} · answer {} tokens",
                t.thinking_tokens(),
                match t.forced_tokens() {
                    0 => String::new(),
                    n => format!(" · forced {n}"),
                },
                t.answer_tokens()
            );
            if let Some(tm) = &t.stats.timing {
                let _ = write!(
                    md,
                    " · TTFT {} · prefill {:.1} tok/s · decode {:.1} tok/s",
                    tm.ttft_ms.map_or_else(|| "-".to_string(), |ms| format!("{ms:.0} ms")),
                    tm.prefill_tok_s,
                    tm.decode_tok_s
                );
            }
            if let Some(m) = t.mtp() {
                let _ = write!(
                    md,
                    " · MTP acceptance {:.0}%, mean length {:.2}",
                    m.acceptance_rate * 100.0,
                    m.mean_accepted_length
                );
            }
            let _ = writeln!(md);
            for d in &t.diagnostics {
                let _ = writeln!(md, "\n> **{}** at token {}: {}", d.kind.as_str(), d.at_token, d.message);
            }
            if let Some(e) = &t.error {
                let _ = writeln!(md, "\n> **error:** {e}");
            }
        }
        md
    }
}
