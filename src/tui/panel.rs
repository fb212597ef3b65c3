//! The one contract every panel keeps, in the manner of gitui's components: a panel owns its
//! state, takes the keys it understands and draws itself. It never sees the `App`: what it
//! shows but does not own (the conversation's turns, the settings, whether it has the focus)
//! comes in as [`Panel::Shown`], gathered from the app for one frame; what a key may change
//! outside the panel comes in as [`Panel::Keyed`]; what it asks of the rest goes out through
//! [`Ctx`] (effects for the runner, messages) and, while drawing, the [`Layout`] it laid out.

use ratatui::Frame;
use ratatui::crossterm::event::KeyEvent;
use ratatui::layout::Rect;

use crate::tui::effect::Effect;
use crate::tui::keymap::Keymap;
use crate::tui::log::{Level, MessageLog};
use crate::tui::screen::Layout;
use crate::tui::theme::Theme;

/// A part of the workbench's screen with its own state, keys and drawing.
pub trait Panel {
    /// What the panel draws but does not own, read from the app for one frame.
    type Shown<'a>;
    /// What a key may read or change outside the panel (`()` when nothing).
    type Keyed<'a>;

    /// A key while the panel has the focus; a key it does not take goes on to the next one.
    fn key(&mut self, k: KeyEvent, with: Self::Keyed<'_>, ctx: &mut Ctx) -> Handled;

    /// Draws the panel into `area`; what it laid out (its lines, its largest useful scroll)
    /// goes into `out`, which the frame returns to the app.
    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, shown: Self::Shown<'_>, out: &mut Layout);
}

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
