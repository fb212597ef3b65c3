//! The workbench's panels: each file holds one feature's state, keys and drawing. A panel
//! sees the rest of the workbench only through a context: [`Ctx`] while it takes a key (the
//! theme, the keymap, the clock, the effect queue and the message log) and [`DrawCtx`] while it
//! draws (the theme, the keymap and the popup's scroll); it never sees the `App`.

pub mod compare;
pub mod composer;
pub mod gauges;
pub mod help;
pub mod inspector;
pub mod messages;
pub mod picker;
pub mod sliders;
pub mod state_scope;
pub mod transcript;

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Clear, Paragraph};

use self::messages::{Level, MessageLog};
use crate::tui::app::Effect;
use crate::tui::keymap::Keymap;
use crate::tui::theme::Theme;
use crate::tui::view::centered;
use crate::tui::view::wrap::wrap;

/// Whether a panel took a key (a key it does not take goes on to the next one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    Consumed,
    NotConsumed,
}

/// What a panel may use and change while it takes a key.
pub struct Ctx<'a> {
    pub theme: &'a Theme,
    pub keymap: &'a Keymap,
    /// App time in ms.
    pub now_ms: f64,
    /// What the runner is to do.
    pub effects: &'a mut Vec<Effect>,
    pub log: &'a mut MessageLog,
}

impl Ctx<'_> {
    /// Adds a message to the log (and the status line).
    pub fn say(&mut self, level: Level, text: impl Into<String>) {
        self.log.push(level, text, self.now_ms);
    }
}

/// What a panel may read while it draws.
#[derive(Clone, Copy)]
pub struct DrawCtx<'a> {
    pub theme: &'a Theme,
    pub keymap: &'a Keymap,
    /// The first line of a scrollable popup (help, messages, the prompt view).
    pub popup_scroll: u16,
}

/// A scrollable popup of `lines`, wrapped to the popup's width (↑/↓/PgUp/PgDn scroll).
/// Returns the largest useful first line.
pub(crate) fn scrolled_popup(f: &mut Frame, area: Rect, ctx: &DrawCtx, title: &str, lines: Vec<Line<'static>>) -> u16 {
    let th = ctx.theme;
    let r = centered(area, area.width.saturating_sub(6).clamp(20, 110), area.height.saturating_sub(4));
    f.render_widget(Clear, r);
    let rows = wrap(&lines, r.width.saturating_sub(2) as usize);
    let visible = r.height.saturating_sub(2) as usize;
    let max = rows.len().saturating_sub(visible);
    let first = (ctx.popup_scroll as usize).min(max);
    let title = if rows.len() > visible {
        format!(" {title} · ↑↓ scroll ({}–{} of {}) ", first + 1, (first + visible).min(rows.len()), rows.len())
    } else {
        format!(" {title} ")
    };
    let block = Block::bordered().title(Line::styled(title, th.title())).border_style(th.border(true));
    f.render_widget(Paragraph::new(rows[first..].to_vec()).block(block), r);
    max.min(u16::MAX as usize) as u16
}
