//! The screen's shared words: which pane has the focus, how the thinking pane and the tokens
//! are shown, and the layout a frame returns. The app keeps them, the panels read them; they
//! import nothing of either.

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

/// What one pane drew: its wrapped lines and its height in rows.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PaneLayout {
    pub total: usize,
    pub height: usize,
}

/// What a frame laid out. `None`: not drawn in that frame (the last known value stays).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub thinking: Option<PaneLayout>,
    pub answer: Option<PaneLayout>,
    /// The largest useful first line of the scrollable popup on screen.
    pub popup_scroll_max: Option<u16>,
    /// The State view's first layer row and head column (it keeps the selection in sight).
    pub state_top: Option<usize>,
    pub state_left: Option<usize>,
}
