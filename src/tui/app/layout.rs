//! The layout a frame drew: drawing returns it, the runner hands it back to the app, so a
//! scroll key knows where the view is (drawing never writes into the state).

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
