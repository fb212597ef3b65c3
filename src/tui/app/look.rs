//! How the workbench looks: the theme, the keymap (drawing names keys by it) and the shown
//! answer's rendered Markdown. They sit together because drawing reads all three and the
//! Markdown is rendered with the theme, a finished line at a time as the answer streams.

use super::App;
use crate::tui::highlight::Markdown;
use crate::tui::keymap::Keymap;
use crate::tui::panel::DrawCtx;
use crate::tui::theme::Theme;

pub(super) struct Look {
    pub(super) theme: Theme,
    pub(super) keymap: Keymap,
    /// Rendered answer of the shown turn (for turn index `md_turn`).
    pub(super) md: Markdown,
    pub(super) md_turn: Option<usize>,
}

impl Look {
    pub(super) fn new(theme: Theme, keymap: Keymap) -> Look {
        Look { theme, keymap, md: Markdown::default(), md_turn: None }
    }
}

impl App {
    /// What the panels read while they draw.
    pub(crate) fn draw_ctx(&self) -> DrawCtx<'_> {
        DrawCtx { theme: &self.look.theme, keymap: &self.look.keymap, popup_scroll: self.view.popup_scroll }
    }

    pub fn theme(&self) -> &Theme {
        &self.look.theme
    }

    /// The key bindings (drawing names a key by the action it runs).
    pub fn keymap(&self) -> &Keymap {
        &self.look.keymap
    }

    /// The shown turn's answer, rendered up to its last finished line.
    pub fn markdown(&self) -> &Markdown {
        &self.look.md
    }

    /// Brings the answer's rendered markdown up to date (only new finished lines render).
    pub(crate) fn sync_markdown(&mut self) {
        let idx = self.shown_index();
        if idx != self.look.md_turn {
            self.look.md = Markdown::default();
            self.look.md_turn = idx;
        }
        if let Some(t) = idx.and_then(|i| self.convo.session.turns.get(i)) {
            self.look.md.sync(t.answer.trim_start_matches('\n'), &self.look.theme);
        }
    }
}
