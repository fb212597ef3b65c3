//! What the screen shows, apart from the conversation itself: focus, the shown turn, pane
//! scrolling, the token inspector and the display toggles.

use super::{App, ColourMode, Focus, Level, Panes, StateScope, ThinkingView};
use crate::tui::keymap::Action;
use crate::tui::panels::sliders::Sliders;
use deltascope_protocol::DiagnosticKind;

#[derive(Debug)]
pub struct ViewState {
    pub focus: Focus,
    /// The sliders panel (its selected slider).
    pub sliders: Sliders,
    pub thinking_view: ThinkingView,
    pub colour_mode: ColourMode,
    /// Token inspector cursor (index into the shown turn's tokens).
    pub inspector: Option<usize>,
    pub show_compare: bool,
    /// The State view (it takes the panes' place while shown).
    pub state: StateScope,
    pub step_mode: bool,
    /// The turn the panes show; `None` follows the latest.
    pub selected_turn: Option<usize>,
    /// The thinking and answer panes' scrolling.
    pub panes: Panes,
    /// First line of a scrollable popup (help, messages, prompt view), and the largest useful
    /// value (the view sets it).
    pub popup_scroll: u16,
    pub popup_scroll_max: u16,
}

impl Default for ViewState {
    fn default() -> Self {
        ViewState {
            focus: Focus::Input,
            sliders: Sliders::default(),
            thinking_view: ThinkingView::Shown,
            colour_mode: ColourMode::Phase,
            inspector: None,
            show_compare: false,
            state: StateScope::default(),
            step_mode: false,
            selected_turn: None,
            panes: Panes::default(),
            popup_scroll: 0,
            popup_scroll_max: 0,
        }
    }
}

impl ViewState {
    /// A new turn (or another shown turn): panes follow their tails, the inspector closes.
    pub fn reset_panes(&mut self) {
        self.inspector = None;
        self.panes.follow();
    }

    /// Takes in what the last frame laid out.
    pub fn laid_out(&mut self, l: super::Layout) {
        if let Some(p) = l.thinking {
            self.panes.thinking.last = p;
        }
        if let Some(p) = l.answer {
            self.panes.answer.last = p;
        }
        if let Some(m) = l.popup_scroll_max {
            self.popup_scroll_max = m;
        }
        if let Some(t) = l.state_top {
            self.state.top = t;
        }
        if let Some(x) = l.state_left {
            self.state.left = x;
        }
    }

    /// Scrolls the popup by `delta` lines within what the view last laid out.
    pub fn scroll_popup(&mut self, delta: i32) {
        let max = self.popup_scroll_max as i32;
        self.popup_scroll = (self.popup_scroll as i32 + delta).clamp(0, max) as u16;
    }
}

impl App {
    /// Opens or closes the State view. Opening it on a turn with a state alarm selects the
    /// layer and head the alarm names.
    pub(crate) fn toggle_state_view(&mut self) {
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
        if let Some(why) = self.backend.model.as_ref().and_then(|m| m.state_trace.reason().map(str::to_string)) {
            self.say(Level::Info, format!("the state scope is not available: {why}"));
        } else if !self.settings.params.trace_state && self.shown().is_none_or(|t| t.states.is_empty()) {
            let key = self.look.keymap.first(Action::TraceState);
            self.say(Level::Info, format!("no state trace yet: {key} traces the next generation"));
        }
    }

    /// State tracing on / off for the next generation (drafting is off while tracing).
    pub(crate) fn toggle_trace(&mut self) {
        if let Some(why) = self.backend.model.as_ref().and_then(|m| m.state_trace.reason().map(str::to_string)) {
            self.say(Level::Info, format!("no state trace here: {why}"));
            return;
        }
        let p = &mut self.settings.params;
        p.trace_state = !p.trace_state;
        let msg = if p.trace_state {
            let drafting = if p.mtp.is_on() { "; MTP drafting pauses while tracing" } else { "" };
            let redo = self.look.keymap.first(Action::Regenerate);
            format!("state trace on for the next generation ({redo} re-runs the last turn with it){drafting}")
        } else {
            "state trace off".to_string()
        };
        self.say(Level::Info, msg);
    }
}
