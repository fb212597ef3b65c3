//! The session picker: the saved sessions the runner listed (a file that cannot be read is
//! listed with the reason) by name — the file's, when one was chosen, else the first prompt —
//! ↑/↓ to select, Enter to open, r to replay, n to rename, d to delete (asked twice), Esc to
//! close.

use std::path::PathBuf;

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Clear, Paragraph};
use ratatui_textarea::TextArea;

use crate::session::{SessionInfo, format_timestamp};
use crate::tui::panel::{Ctx, DrawCtx, Handled, Panel};
use crate::tui::popup::centered;
use crate::tui::screen::Layout;

/// The picker's state: the listed sessions, the selected one and the directory they are in.
#[derive(Debug, Clone)]
pub struct Picker {
    items: Vec<SessionInfo>,
    selected: usize,
    /// Where the sessions were listed from (shown when there are none).
    dir: Option<PathBuf>,
    mode: Mode,
}

/// What the picker's keys do now.
#[derive(Debug, Clone, Default)]
enum Mode {
    #[default]
    Browse,
    /// Typing the selected session's new name.
    Rename(Box<TextArea<'static>>),
    /// `d` was pressed once: `y` / `d` deletes, anything else keeps it.
    ConfirmDelete,
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
    /// Rename the session at `path` to `name` (the picker stays open).
    Rename {
        path: PathBuf,
        name: String,
    },
    /// Delete the session at `path` (confirmed).
    Delete(PathBuf),
}

/// A session's creation time as people read it: `2026-12-05 08:57` (the file-name form
/// `format_timestamp` gives is `2026-12-05T08-57-10`).
fn when(secs: u64) -> String {
    let stamp = format_timestamp(secs);
    match stamp.split_once('T') {
        Some((day, time)) => format!("{day} {}", time.splitn(3, '-').take(2).collect::<Vec<_>>().join(":")),
        None => stamp,
    }
}

impl Picker {
    pub fn new(items: Vec<SessionInfo>, dir: Option<PathBuf>) -> Picker {
        Picker { items, selected: 0, dir, mode: Mode::Browse }
    }

    /// The list again after a rename or a delete, the selection kept near where it was
    /// (on `path` when it is listed).
    pub fn relisted(mut self, items: Vec<SessionInfo>, path: Option<&std::path::Path>) -> Picker {
        self.selected = path
            .and_then(|p| items.iter().position(|i| i.path == p))
            .unwrap_or(self.selected)
            .min(items.len().saturating_sub(1));
        self.items = items;
        self.mode = Mode::Browse;
        self
    }

    fn on_key(&mut self, k: KeyEvent) -> PickerKey {
        match std::mem::take(&mut self.mode) {
            Mode::Browse => {}
            Mode::Rename(mut input) => {
                return match k.code {
                    KeyCode::Esc => PickerKey::Stay,
                    KeyCode::Enter => match self.items.get(self.selected) {
                        Some(info) => PickerKey::Rename {
                            path: info.path.clone(),
                            name: input.lines().first().cloned().unwrap_or_default(),
                        },
                        None => PickerKey::Stay,
                    },
                    _ => {
                        if (k.code, k.modifiers) == (KeyCode::Char('u'), KeyModifiers::CONTROL) {
                            input.delete_line_by_head();
                        } else {
                            input.input(k);
                        }
                        self.mode = Mode::Rename(input);
                        PickerKey::Stay
                    }
                };
            }
            Mode::ConfirmDelete => {
                return match (k.code, self.items.get(self.selected)) {
                    (KeyCode::Char('y' | 'd'), Some(info)) => PickerKey::Delete(info.path.clone()),
                    _ => PickerKey::Stay,
                };
            }
        }
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
            KeyCode::Char('n') | KeyCode::F(2) => {
                if let Some(info) = self.items.get(self.selected) {
                    let stem = info.path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
                    let mut input = TextArea::new(vec![stem]);
                    input.move_cursor(ratatui_textarea::CursorMove::End);
                    self.mode = Mode::Rename(Box::new(input));
                }
                PickerKey::Stay
            }
            KeyCode::Char('d') | KeyCode::Delete => {
                if self.items.get(self.selected).is_some() {
                    self.mode = Mode::ConfirmDelete;
                }
                PickerKey::Stay
            }
            _ => PickerKey::Stay,
        }
    }

    fn draw_list(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx) {
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
            let title: String = s.title().chars().take(48).collect();
            let turns = if s.turns == 1 { "1 turn".to_string() } else { format!("{} turns", s.turns) };
            lines.push(Line::styled(
                format!(
                    "{} {title:<48}  {turns:>9}  {}  {}",
                    if sel { "▸" } else { " " },
                    when(s.created),
                    s.model.chars().take(20).collect::<String>(),
                ),
                st,
            ));
        }
        let title = match &self.mode {
            Mode::Browse => " Sessions · Enter open · r replay · n rename · d delete · Esc close ".to_string(),
            Mode::Rename(_) => " Rename · Enter keeps the new name · Esc leaves it ".to_string(),
            Mode::ConfirmDelete => {
                let name = self.items.get(selected).map(SessionInfo::title).unwrap_or_default();
                format!(
                    " Delete \"{}\"? y deletes the file · any other key keeps it ",
                    name.chars().take(40).collect::<String>()
                )
            }
        };
        let style = if matches!(self.mode, Mode::ConfirmDelete) { th.fg(th.bad) } else { th.title() };
        let block = Block::bordered().title(Line::styled(title, style)).border_style(th.border(true));
        let inner = block.inner(r);
        f.render_widget(Paragraph::new(lines).block(block), r);
        if let Mode::Rename(input) = &self.mode {
            // The name field over the selected row.
            let row = (selected - skip) as u16;
            let at = Rect { x: inner.x + 2, y: inner.y + row, width: inner.width.saturating_sub(2).min(60), height: 1 };
            f.render_widget(Clear, at);
            f.render_widget(&**input, at);
        }
    }
}

impl Panel for Picker {
    type Shown<'a> = ();
    /// Where the key's request to the app goes (open, rename, delete, close).
    type Keyed<'a> = &'a mut PickerKey;

    fn key(&mut self, k: KeyEvent, asked: &mut PickerKey, _: &mut Ctx) -> Handled {
        *asked = self.on_key(k);
        Handled::Consumed
    }

    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, _: (), _: &mut Layout) {
        self.draw_list(f, area, ctx)
    }
}
