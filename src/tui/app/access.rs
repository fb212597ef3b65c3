//! What drawing and tests read of the app, and the few changes made from outside an event
//! (the runner's answers, a test's setup). App's fields stay private so that every change to
//! the state goes through [`App::update`] or one of these.

use super::{App, Composer, Conversation, Layout, Level, MessageLog, Overlay, ViewState};
use crate::backend::DryRun;
use crate::session::{Session, Turn};
use crate::tui::sliders::Settings;

impl App {
    /// What the next generation will use.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Changes the settings for the next generation, as the sliders would.
    pub fn change_settings(&mut self, change: impl FnOnce(&mut Settings)) {
        change(&mut self.settings);
        self.out.dirty = true;
    }

    /// What the screen shows: focus, the shown turn, scrolling, the inspector, the State view.
    pub fn view(&self) -> &ViewState {
        &self.view
    }

    /// The prompt box.
    pub fn composer(&self) -> &Composer {
        &self.composer
    }

    /// The open popup ([`Overlay::None`]: none).
    pub fn overlay(&self) -> &Overlay {
        &self.overlay
    }

    /// Every message so far.
    pub fn messages(&self) -> &MessageLog {
        &self.messages
    }

    /// Adds a message to the log (and the status line).
    pub fn say(&mut self, level: Level, text: impl Into<String>) {
        self.messages.push(level, text, self.now_ms);
    }

    /// The status line's message, while it is shown.
    pub fn status(&self) -> Option<&str> {
        self.messages.current().map(|m| m.text.as_str())
    }

    /// App time in ms, as the last update set it.
    pub fn now_ms(&self) -> f64 {
        self.now_ms
    }

    /// The conversation: its session, the live turn, a replay, and where it is saved.
    pub fn conversation(&self) -> &Conversation {
        &self.convo
    }

    pub fn session(&self) -> &Session {
        &self.convo.session
    }

    /// The turn the panes show: the selected one, else the latest.
    pub fn shown_index(&self) -> Option<usize> {
        self.convo.shown_index(self.view.selected_turn)
    }

    pub fn shown(&self) -> Option<&Turn> {
        self.convo.shown_turn(self.view.selected_turn)
    }

    /// The latest comparison: (original, re-run).
    pub fn compare_pair(&self) -> Option<(usize, usize)> {
        self.convo.session.turns.iter().enumerate().rev().find_map(|(i, t)| t.compare_of.map(|o| (o, i)))
    }

    /// What the last frame laid out (the runner hands back what drawing returned).
    pub fn laid_out(&mut self, layout: Layout) {
        self.view.laid_out(layout);
    }

    /// What the backend rendered for [`Effect::DryRun`](super::Effect::DryRun).
    pub fn show_dry_run(&mut self, result: Result<DryRun, String>) {
        self.view.popup_scroll = 0;
        self.overlay = Overlay::Prompt(result);
        self.out.dirty = true;
    }
}
