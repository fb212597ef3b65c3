//! The State view's selection and keys: which metric it shows, which GDN layer and value head is
//! selected, and where its rows and columns start; tracing on / off for the next generation.
//! The token it shows is the token inspector's cursor (the latest pass when that is closed), so
//! moving either moves both.

use std::cell::Cell;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::messages::Level;
use super::{App, Focus};
use crate::generation::{DiagnosticKind, StateMetric};
use crate::tui::keymap::Action;

#[derive(Debug, Default)]
pub struct StateScope {
    pub shown: bool,
    pub metric: StateMetric,
    /// The selected GDN layer, as an index into a pass's GDN layers (not the decoder layer).
    pub layer: usize,
    /// The selected value head.
    pub head: usize,
    /// The first layer row and head column on screen (the view keeps the selection in sight).
    pub top: Cell<usize>,
    pub left: Cell<usize>,
}

impl StateScope {
    /// Keeps `at` within `first..first + visible` by moving `first` as little as possible.
    pub fn follow(first: &Cell<usize>, at: usize, visible: usize) -> usize {
        let visible = visible.max(1);
        let mut f = first.get();
        if at < f {
            f = at;
        } else if at >= f + visible {
            f = at + 1 - visible;
        }
        first.set(f);
        f
    }
}

impl App {
    /// Opens or closes the State view. Opening it on a turn with a state alarm selects the
    /// layer and head the alarm names.
    pub(super) fn toggle_state_view(&mut self) {
        let scope = &mut self.view.state;
        scope.shown = !scope.shown;
        if !scope.shown {
            if self.view.focus == Focus::State {
                self.view.focus = Focus::Input;
            }
            return;
        }
        self.view.show_compare = false;
        self.view.focus = Focus::State;
        let alarm = self.shown().and_then(|t| {
            let d = t.diagnostics.iter().find(|d| {
                matches!(d.kind, DiagnosticKind::StateAlarm | DiagnosticKind::Nonfinite) && d.head.is_some()
            })?;
            let first = t.states.first()?;
            let layer = first.ev.gdn.iter().position(|l| Some(l.layer) == d.layer)?;
            Some((layer, d.head?))
        });
        if let Some((layer, head)) = alarm {
            self.view.state.layer = layer;
            self.view.state.head = head;
        }
        if let Some(why) = self.model.as_ref().and_then(|m| m.state_trace.reason().map(str::to_string)) {
            self.say(Level::Info, format!("the state scope is not available: {why}"));
        } else if !self.settings.params.trace_state && self.shown().is_none_or(|t| t.states.is_empty()) {
            let key = self.keymap.first(Action::TraceState);
            self.say(Level::Info, format!("no state trace yet: {key} traces the next generation"));
        }
    }

    /// State tracing on / off for the next generation (drafting is off while tracing).
    pub(super) fn toggle_trace(&mut self) {
        if let Some(why) = self.model.as_ref().and_then(|m| m.state_trace.reason().map(str::to_string)) {
            self.say(Level::Info, format!("no state trace here: {why}"));
            return;
        }
        let p = &mut self.settings.params;
        p.trace_state = !p.trace_state;
        let msg = if p.trace_state {
            let drafting = if p.mtp.is_on() { "; MTP drafting pauses while tracing" } else { "" };
            let redo = self.keymap.first(Action::Regenerate);
            format!("state trace on for the next generation ({redo} re-runs the last turn with it){drafting}")
        } else {
            "state trace off".to_string()
        };
        self.say(Level::Info, msg);
    }

    /// A key while the State view has the focus: ↑/↓ layer, ←/→ head, m / M metric, [ / ]
    /// token, Home / End first token / latest, t tracing.
    pub(super) fn state_key(&mut self, k: KeyEvent) {
        let (layers, heads, tokens) = self
            .shown()
            .and_then(|t| {
                let (_, ev) = t.state_at(None)?;
                let heads = ev.gdn.iter().map(|l| l.beta.len()).max().unwrap_or(0);
                Some((ev.gdn.len(), heads, t.tokens.len()))
            })
            .unwrap_or((0, 0, 0));
        let big = if k.modifiers.contains(KeyModifiers::SHIFT) { 8 } else { 1 };
        let s = &mut self.view.state;
        let last = |n: usize| n.saturating_sub(1);
        match k.code {
            KeyCode::Up => s.layer = s.layer.saturating_sub(big),
            KeyCode::Down => s.layer = (s.layer + big).min(last(layers)),
            KeyCode::Left => s.head = s.head.saturating_sub(big),
            KeyCode::Right => s.head = (s.head + big).min(last(heads)),
            KeyCode::Char('m') => s.metric = next_metric(s.metric, 1),
            KeyCode::Char('M') => s.metric = next_metric(s.metric, StateMetric::ALL.len() - 1),
            KeyCode::Char('t') => self.toggle_trace(),
            KeyCode::Char('[') | KeyCode::Char(',') => {
                let cur = self.view.inspector.unwrap_or(tokens);
                self.view.inspector = (tokens > 0).then(|| cur.saturating_sub(1));
            }
            KeyCode::Char(']') | KeyCode::Char('.') => {
                // Past the last token the view follows the latest pass again.
                self.view.inspector = self.view.inspector.map(|c| c + 1).filter(|&c| c < tokens);
            }
            KeyCode::Home => self.view.inspector = (tokens > 0).then_some(0),
            KeyCode::End => self.view.inspector = None,
            _ => {}
        }
    }

    /// PgUp / PgDn in the State view: a page of layers.
    pub(super) fn state_page(&mut self, down: bool) {
        let layers = self.shown().and_then(|t| t.state_at(None)).map_or(0, |(_, ev)| ev.gdn.len());
        let s = &mut self.view.state;
        s.layer = if down { s.layer + 8 } else { s.layer.saturating_sub(8) };
        s.layer = s.layer.min(layers.saturating_sub(1));
    }
}

fn next_metric(m: StateMetric, step: usize) -> StateMetric {
    let all = StateMetric::ALL;
    let i = all.iter().position(|x| *x == m).unwrap_or(0);
    all[(i + step) % all.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follow_moves_the_window_as_little_as_possible() {
        let first = Cell::new(0);
        assert_eq!(StateScope::follow(&first, 3, 5), 0);
        assert_eq!(StateScope::follow(&first, 7, 5), 3);
        assert_eq!(StateScope::follow(&first, 5, 5), 3);
        assert_eq!(StateScope::follow(&first, 1, 5), 1);
        assert_eq!(next_metric(StateMetric::DeltaRatio, 1), StateMetric::Beta);
        assert_eq!(next_metric(StateMetric::Beta, 3), StateMetric::DeltaRatio);
    }
}
