//! A popup's frame: a rectangle centred on the screen, and a scrollable popup of wrapped lines.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::text::Line;
use ratatui::widgets::{Block, Clear, Paragraph};

use crate::tui::panel::DrawCtx;
use crate::tui::wrap::wrap;

/// A `w`×`h` rectangle centred in `area`.
pub fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h }
}

/// A scrollable popup of `lines`, wrapped to the popup's width (↑/↓/PgUp/PgDn scroll).
/// Returns the largest useful first line.
pub fn scrolled_popup(f: &mut Frame, area: Rect, ctx: &DrawCtx, title: &str, lines: Vec<Line<'static>>) -> u16 {
    let th = ctx.theme;
    let r = centered(area, area.width.saturating_sub(6).clamp(20, 110), area.height.saturating_sub(4));
    f.render_widget(Clear, r);
    let rows = wrap(&lines, r.width.saturating_sub(2) as usize);
    let visible = r.height.saturating_sub(2) as usize;
    let max = rows.len().saturating_sub(visible);
    let first = (ctx.popup_scroll as usize).min(max);
    let title = if rows.len() > visible {
        format!(" {title} · ↑↓ scroll ({}–{} of {}) ", first + 1, (first + visible).min(rows.len()), rows.len())
    } else {
        format!(" {title} ")
    };
    let block = Block::bordered().title(Line::styled(title, th.title())).border_style(th.border(true));
    f.render_widget(Paragraph::new(rows[first..].to_vec()).block(block), r);
    max.min(u16::MAX as usize) as u16
}
