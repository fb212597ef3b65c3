//! Scroll state of a streaming pane.

use std::cell::{Cell, RefCell};

/// Scroll state of a streaming pane: `None` follows the tail. Draw records the last layout
/// (in cells: a read-only draw cannot otherwise report what it laid out), so a scroll key
/// knows where the view currently is.
#[derive(Debug, Default)]
pub struct PaneScroll {
    pub top: Option<usize>,
    pub last_total: Cell<usize>,
    pub last_height: Cell<usize>,
    /// The pane's wrapped token lines, and wrapped Markdown, kept between frames.
    pub lines: RefCell<crate::tui::view::PaneCache>,
    pub markdown: RefCell<crate::tui::view::MarkdownWrap>,
}

impl PaneScroll {
    /// The first visible line for `total` lines in `height` rows.
    pub fn first_line(&self, total: usize, height: usize) -> usize {
        let tail = total.saturating_sub(height);
        self.top.map(|t| t.min(tail)).unwrap_or(tail)
    }

    pub fn scroll(&mut self, delta: i64) {
        let total = self.last_total.get();
        let height = self.last_height.get().max(1);
        let tail = total.saturating_sub(height);
        let cur = self.first_line(total, height) as i64;
        let next = (cur + delta).clamp(0, tail as i64) as usize;
        // Back at the bottom: follow the tail again.
        self.top = if next >= tail { None } else { Some(next) };
    }

    /// One page up (`-1`) or down (`1`).
    pub fn page(&mut self, dir: i64) {
        let page = self.last_height.get().max(2) as i64 - 1;
        self.scroll(dir * page);
    }

    pub fn follow(&mut self) {
        self.top = None;
    }
}
