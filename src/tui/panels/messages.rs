//! The messages panel: the log popup that shows every message, wrapped, so no reason is ever
//! lost to a narrow terminal or a message that scrolled away (the status line cuts the latest
//! to the terminal's width).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::Modifier;
use ratatui::text::{Line, Span};

use crate::tui::log::{Level, MessageLog};
use ratatui::crossterm::event::KeyEvent;

use crate::tui::panel::{Ctx, DrawCtx, Handled, Panel};
use crate::tui::popup::scrolled_popup;
use crate::tui::screen::Layout;

impl Panel for MessageLog {
    /// Why the conversation is not saved, shown above the messages.
    type Shown<'a> = Option<&'a str>;
    type Keyed<'a> = ();

    /// Its scrolling keys are the popup's (the app's overlay routing).
    fn key(&mut self, _: KeyEvent, _: (), _: &mut Ctx) -> Handled {
        Handled::NotConsumed
    }

    /// The message log popup: every message so far, newest first, wrapped; its largest useful
    /// first line goes into `out`.
    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, not_saved: Option<&str>, out: &mut Layout) {
        out.popup_scroll_max = Some(draw(self, f, area, ctx, not_saved));
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
