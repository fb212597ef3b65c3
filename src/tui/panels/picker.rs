//! The session picker: the saved sessions the runner listed (a file that cannot be read is
//! listed with the reason), ↑/↓ to select, Enter to open, r to replay, Esc to close.

use std::path::PathBuf;

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent};
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Clear, Paragraph};

use super::DrawCtx;
use crate::session::{SessionInfo, format_timestamp};
use crate::tui::view::centered;

/// The picker's state: the listed sessions, the selected one and the directory they are in.
#[derive(Debug, Clone)]
pub struct Picker {
    items: Vec<SessionInfo>,
    selected: usize,
    /// Where the sessions were listed from (shown when there are none).
    dir: Option<PathBuf>,
}

/// What a key in the picker asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum PickerKey {
    /// Stay open.
    Stay,
    Close,
    /// Open (`replay: false`) or replay the session saved at `path`; the picker closes.
    Open {
        path: PathBuf,
        replay: bool,
    },
}

impl Picker {
    pub fn new(items: Vec<SessionInfo>, dir: Option<PathBuf>) -> Picker {
        Picker { items, selected: 0, dir }
    }

    pub fn key(&mut self, k: KeyEvent) -> PickerKey {
        match k.code {
            KeyCode::Esc => PickerKey::Close,
            KeyCode::Up => {
                self.selected = self.selected.saturating_sub(1);
                PickerKey::Stay
            }
            KeyCode::Down => {
                self.selected = (self.selected + 1).min(self.items.len().saturating_sub(1));
                PickerKey::Stay
            }
            KeyCode::Enter | KeyCode::Char('r') => match self.items.get(self.selected) {
                Some(info) => PickerKey::Open { path: info.path.clone(), replay: k.code == KeyCode::Char('r') },
                None => PickerKey::Close,
            },
            _ => PickerKey::Stay,
        }
    }

    pub fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx) {
        let th = ctx.theme;
        let (items, selected) = (&self.items, self.selected);
        let r = centered(area, 100, area.height.saturating_sub(4).max(6));
        f.render_widget(Clear, r);
        let mut lines = vec![];
        if items.is_empty() {
            let dir = self.dir.as_ref().map(|d| d.display().to_string()).unwrap_or_else(|| "(none)".into());
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
}
