//! What the screen shows, apart from the conversation itself: focus, the shown turn, pane
//! scrolling, the token inspector and the display toggles.

use super::PaneScroll;
use super::StateScope;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    Input,
    Sliders,
    Thinking,
    Answer,
    /// The State view (only while it is shown).
    State,
}

impl Focus {
    const ORDER: [Focus; 5] = [Focus::Input, Focus::Sliders, Focus::Thinking, Focus::Answer, Focus::State];

    /// The next (`forward`) or previous pane in Tab order; the State view's place counts only
    /// while it is shown (it then stands where the panes were).
    pub fn cycle(self, forward: bool, state_shown: bool) -> Focus {
        let order: Vec<Focus> = Self::ORDER
            .into_iter()
            .filter(|f| match f {
                Focus::State => state_shown,
                Focus::Thinking | Focus::Answer => !state_shown,
                _ => true,
            })
            .collect();
        let i = order.iter().position(|f| *f == self).unwrap_or(0);
        let d = if forward { 1 } else { order.len() - 1 };
        order[(i + d) % order.len()]
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingView {
    Shown,
    Collapsed,
    Hidden,
}

impl ThinkingView {
    pub fn next(self) -> ThinkingView {
        match self {
            ThinkingView::Shown => ThinkingView::Collapsed,
            ThinkingView::Collapsed => ThinkingView::Hidden,
            ThinkingView::Hidden => ThinkingView::Shown,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColourMode {
    Phase,
    Logprob,
    Provenance,
}

impl ColourMode {
    pub fn name(self) -> &'static str {
        match self {
            ColourMode::Phase => "phase",
            ColourMode::Logprob => "logprob",
            ColourMode::Provenance => "MTP provenance",
        }
    }
}

#[derive(Debug)]
pub struct ViewState {
    pub focus: Focus,
    /// The selected slider.
    pub slider: usize,
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
    pub thinking_scroll: PaneScroll,
    pub answer_scroll: PaneScroll,
    /// First line of a scrollable popup (help, messages, prompt view), and the largest useful
    /// value (the view sets it).
    pub popup_scroll: u16,
    pub popup_scroll_max: u16,
}

impl Default for ViewState {
    fn default() -> Self {
        ViewState {
            focus: Focus::Input,
            slider: 0,
            thinking_view: ThinkingView::Shown,
            colour_mode: ColourMode::Phase,
            inspector: None,
            show_compare: false,
            state: StateScope::default(),
            step_mode: false,
            selected_turn: None,
            thinking_scroll: PaneScroll::default(),
            answer_scroll: PaneScroll::default(),
            popup_scroll: 0,
            popup_scroll_max: 0,
        }
    }
}

impl ViewState {
    /// A new turn (or another shown turn): panes follow their tails, the inspector closes.
    pub fn reset_panes(&mut self) {
        self.inspector = None;
        self.thinking_scroll.follow();
        self.answer_scroll.follow();
    }

    /// Takes in what the last frame laid out.
    pub fn laid_out(&mut self, l: super::Layout) {
        if let Some(p) = l.thinking {
            self.thinking_scroll.last = p;
        }
        if let Some(p) = l.answer {
            self.answer_scroll.last = p;
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
