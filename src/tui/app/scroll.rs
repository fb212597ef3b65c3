//! Scroll state of a streaming pane, and the layout a frame drew (the runner hands it back, so a
//! scroll key knows where the view is; drawing never writes into the state).

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

/// Scroll state of a streaming pane: `None` follows the tail.
#[derive(Debug, Default)]
pub struct PaneScroll {
    pub top: Option<usize>,
    /// What the last frame drew of this pane.
    pub last: PaneLayout,
}

impl PaneScroll {
    /// The first visible line for `total` lines in `height` rows.
    pub fn first_line(&self, total: usize, height: usize) -> usize {
        let tail = total.saturating_sub(height);
        self.top.map(|t| t.min(tail)).unwrap_or(tail)
    }

    pub fn scroll(&mut self, delta: i64) {
        let total = self.last.total;
        let height = self.last.height.max(1);
        let tail = total.saturating_sub(height);
        let cur = self.first_line(total, height) as i64;
        let next = (cur + delta).clamp(0, tail as i64) as usize;
        // Back at the bottom: follow the tail again.
        self.top = if next >= tail { None } else { Some(next) };
    }

    /// One page up (`-1`) or down (`1`).
    pub fn page(&mut self, dir: i64) {
        let page = self.last.height.max(2) as i64 - 1;
        self.scroll(dir * page);
    }

    pub fn follow(&mut self) {
        self.top = None;
    }
}
