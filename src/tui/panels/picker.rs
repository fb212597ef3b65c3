//! The session picker: the saved sessions the runner listed (a file that cannot be read is
//! listed with the reason), ↑/↓ to select, Enter to open, r to replay, Esc to close.

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent};
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Clear, Paragraph};

use crate::session::{SessionInfo, format_timestamp};
use crate::tui::app::{App, Level, Overlay};
use crate::tui::view::centered;

impl App {
    /// The picker over the saved sessions the runner listed.
    pub(crate) fn show_sessions(&mut self, items: Vec<SessionInfo>) {
        if items.is_empty() {
            self.say(Level::Info, "no saved sessions");
        }
        self.overlay = Overlay::Picker { items, selected: 0 };
    }

    /// A key while the picker is open; returns what is open next.
    pub(crate) fn picker_key(&mut self, items: Vec<SessionInfo>, mut selected: usize, k: KeyEvent) -> Overlay {
        match k.code {
            KeyCode::Esc => Overlay::None,
            KeyCode::Up => Overlay::Picker { selected: selected.saturating_sub(1), items },
            KeyCode::Down => {
                selected = (selected + 1).min(items.len().saturating_sub(1));
                Overlay::Picker { items, selected }
            }
            KeyCode::Enter | KeyCode::Char('r') => {
                if let Some(info) = items.get(selected).cloned() {
                    self.open_session(&info.path, k.code == KeyCode::Char('r'));
                }
                // Opening may have opened another popup (nothing): keep what it set.
                std::mem::replace(&mut self.overlay, Overlay::None)
            }
            _ => Overlay::Picker { items, selected },
        }
    }
}

// Drawing.

pub fn draw(app: &App, f: &mut Frame, area: Rect, items: &[SessionInfo], selected: usize) {
    let th = &app.theme;
    let r = centered(area, 100, area.height.saturating_sub(4).max(6));
    f.render_widget(Clear, r);
    let mut lines = vec![];
    if items.is_empty() {
        let dir = app.convo.save.dir.path.as_ref().map(|d| d.display().to_string()).unwrap_or_else(|| "(none)".into());
        lines.push(Line::styled(format!("no saved sessions in {dir}"), th.fg(th.dim)));
    }
    let visible = r.height.saturating_sub(2) as usize;
    let skip = selected.saturating_sub(visible.saturating_sub(1));
    for (i, s) in items.iter().enumerate().skip(skip).take(visible) {
        let sel = i == selected;
        let st = if sel {
            Style::new().fg(th.accent).bg(th.selection_bg).add_modifier(Modifier::BOLD)
        } else {
            th.fg(th.text)
        };
        if let Some(e) = &s.error {
            let st = if sel { st } else { th.fg(th.bad) };
            lines.push(Line::styled(format!("{} ✖ {e}", if sel { "▸" } else { " " }), st));
            continue;
        }
        let prompt: String = s.first_prompt.split_whitespace().collect::<Vec<_>>().join(" ");
        lines.push(Line::styled(
            format!(
                "{} {}  {:>2} turns  {:<16} {}",
                if sel { "▸" } else { " " },
                format_timestamp(s.created),
                s.turns,
                s.model.chars().take(16).collect::<String>(),
                prompt.chars().take(60).collect::<String>()
            ),
            st,
        ));
    }
    let block = Block::bordered()
        .title(Line::styled(" Sessions · Enter open · r replay · Esc close ", th.title()))
        .border_style(th.border(true));
    f.render_widget(Paragraph::new(lines).block(block), r);
}
