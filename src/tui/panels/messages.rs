//! The messages panel: every message the workbench showed, kept whole, and the log popup that
//! shows them. The status line shows the latest for a few seconds and cuts it to the terminal's
//! width; the message log shows them all, wrapped, so no reason is ever lost to a narrow
//! terminal or a message that scrolled away.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};

use super::{DrawCtx, scrolled_popup};

/// How long an informational message stays in the status line.
const SHOWN_MS: f64 = 6000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warning,
    Error,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub at_ms: f64,
    pub level: Level,
    pub text: String,
}

#[derive(Debug, Default)]
pub struct MessageLog {
    pub items: Vec<Message>,
    /// Whether the latest message is still in the status line.
    showing: bool,
}

impl MessageLog {
    pub fn push(&mut self, level: Level, text: impl Into<String>, now_ms: f64) {
        let text = text.into();
        match level {
            Level::Info => tracing::info!("{text}"),
            Level::Warning | Level::Error => tracing::warn!("{text}"),
        }
        self.items.push(Message { at_ms: now_ms, level, text });
        self.showing = true;
    }

    /// The message the status line shows now.
    pub fn current(&self) -> Option<&Message> {
        self.items.last().filter(|_| self.showing)
    }

    /// Expires the status line's message; `true` when that changed the screen.
    pub fn tick(&mut self, now_ms: f64) -> bool {
        let expired = self.current().is_some_and(|m| now_ms - m.at_ms > SHOWN_MS);
        if expired {
            self.showing = false;
        }
        expired
    }
}

// Drawing.

impl MessageLog {
    /// The message log popup: every message so far, newest first, wrapped, under why the
    /// conversation is not saved (`not_saved`); returns the largest useful first line.
    pub fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, not_saved: Option<&str>) -> u16 {
        draw(self, f, area, ctx, not_saved)
    }
}

fn draw(log: &MessageLog, f: &mut Frame, area: Rect, ctx: &DrawCtx, not_saved: Option<&str>) -> u16 {
    let th = ctx.theme;
    let mut lines = vec![];
    if let Some(err) = not_saved {
        lines.push(Line::styled(format!("NOT SAVED: {err}"), th.fg(th.bad).add_modifier(Modifier::BOLD)));
        lines.push(Line::raw(""));
    }
    for m in log.items.iter().rev() {
        let (tag, style) = match m.level {
            Level::Info => ("  ", th.fg(th.text)),
            Level::Warning => ("⚠ ", th.fg(th.warn)),
            Level::Error => ("✖ ", th.fg(th.bad)),
        };
        lines.push(Line::from(vec![
            Span::styled(format!("{:>7.1}s ", m.at_ms / 1000.0), th.fg(th.dim)),
            Span::styled(format!("{tag}{}", m.text), style),
        ]));
    }
    if lines.is_empty() {
        lines.push(Line::styled("no messages yet", th.fg(th.dim)));
    }
    scrolled_popup(f, area, ctx, "Messages (newest first)", lines)
}
