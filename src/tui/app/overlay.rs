//! Popups over the workbench. Each one owns its keys while it is open: help, the session
//! picker, the message log, the rendered prompt of the next turn, the quit question when the
//! conversation is not saved, a path to save it to, and a typed slider value.

use std::path::PathBuf;

use ratatui::crossterm::event::{KeyCode, KeyEvent};
use ratatui_textarea::TextArea;

use super::Level;
use super::{App, Effect, key_ctx};
use crate::backend::DryRun;
use crate::session::SessionInfo;
use crate::tui::panel::Panel;
use crate::tui::panels::picker::{Picker, PickerKey};
use crate::tui::sliders::Slider;

pub enum Overlay {
    None,
    Help,
    Picker(Picker),
    /// Every message so far, wrapped.
    Messages,
    /// The next turn's prompt as the backend renders it (the `--dry-run` view), or why not.
    Prompt(Result<DryRun, String>),
    /// Quitting with turns that could not be saved: save elsewhere / quit anyway / cancel.
    ConfirmQuit,
    /// A path to save the conversation to, and why the last try failed.
    SaveAs {
        input: TextArea<'static>,
        error: Option<String>,
    },
    /// A typed value for a slider, and why the last one was refused.
    SliderValue {
        slider: Slider,
        input: TextArea<'static>,
        error: Option<String>,
    },
}

impl Overlay {
    pub fn is_open(&self) -> bool {
        !matches!(self, Overlay::None)
    }

    /// A short name (tests, logs).
    pub fn name(&self) -> &'static str {
        match self {
            Overlay::None => "none",
            Overlay::Help => "help",
            Overlay::Picker(_) => "sessions",
            Overlay::Messages => "messages",
            Overlay::Prompt(_) => "prompt",
            Overlay::ConfirmQuit => "confirm-quit",
            Overlay::SaveAs { .. } => "save-as",
            Overlay::SliderValue { .. } => "slider-value",
        }
    }
}

/// A one-line text field, its prefilled text (a suggested path, a slider's value) selected:
/// typing replaces it, ←/→ or Ctrl+A/E keep it to edit.
pub fn line_input(text: &str) -> TextArea<'static> {
    let mut t = TextArea::new(vec![text.to_string()]);
    t.move_cursor(ratatui_textarea::CursorMove::End);
    if !text.is_empty() {
        t.select_all();
    }
    t
}

/// A key in a one-line field, with the shell's line keys (Ctrl+U, Ctrl+W, Ctrl+A, Ctrl+E,
/// Ctrl+K).
fn line_key(input: &mut TextArea, k: KeyEvent) {
    crate::tui::panels::composer::shell_line_key(input, k);
}

fn first_line(t: &TextArea) -> String {
    t.lines().first().cloned().unwrap_or_default().trim().to_string()
}

impl App {
    /// A rename or a delete asked for in the picker: not of the conversation open here (its
    /// next autosave would write the file again), else done by the runner.
    fn manage_session(&mut self, picker: Picker, path: PathBuf, to: Option<String>) -> Overlay {
        if self.convo.save.file(&self.convo.session).is_some_and(|open| open == path) {
            let what = if to.is_some() { "renamed" } else { "deleted" };
            self.say(
                Level::Error,
                format!(
                    "{} is the conversation open here: it cannot be {what} while this window saves to it",
                    path.display()
                ),
            );
        } else {
            self.out.effects.push(Effect::ManageSession { path, to });
        }
        Overlay::Picker(picker)
    }

    /// The runner's answer to a rename or a delete: said, and the picker relisted.
    pub(crate) fn session_managed(
        &mut self,
        result: Result<(String, Option<PathBuf>), String>,
        items: Vec<SessionInfo>,
    ) {
        let keep = match result {
            Ok((what, path)) => {
                self.say(Level::Info, what);
                path
            }
            Err(e) => {
                self.say(Level::Error, e);
                None
            }
        };
        if let Overlay::Picker(p) = std::mem::replace(&mut self.overlay, Overlay::None) {
            self.overlay = Overlay::Picker(p.relisted(items, keep.as_deref()));
        }
    }

    /// The picker over the saved sessions the runner listed.
    pub(crate) fn show_sessions(&mut self, items: Vec<SessionInfo>) {
        if items.is_empty() {
            self.say(Level::Info, "no saved sessions");
        }
        self.overlay = Overlay::Picker(Picker::new(items, self.convo.save.dir.path.clone()));
    }

    /// What a key in the session picker asks for.
    fn picker_key(&mut self, picker: &mut Picker, k: KeyEvent) -> PickerKey {
        let mut asked = PickerKey::Stay;
        picker.key(k, &mut asked, &mut key_ctx(&self.look, self.now_ms, &mut self.out, &mut self.messages));
        asked
    }

    /// A key while a popup is open (it takes every key).
    pub(super) fn overlay_key(&mut self, k: KeyEvent) {
        let overlay = std::mem::replace(&mut self.overlay, Overlay::None);
        self.overlay = match overlay {
            Overlay::None => Overlay::None,
            Overlay::Help | Overlay::Messages | Overlay::Prompt(_) => {
                // ↑/↓/PgUp/PgDn scroll a popup taller than the terminal; any other key closes it.
                match k.code {
                    KeyCode::Up => self.view.scroll_popup(-1),
                    KeyCode::Down => self.view.scroll_popup(1),
                    KeyCode::PageUp => self.view.scroll_popup(-10),
                    KeyCode::PageDown => self.view.scroll_popup(10),
                    _ => {
                        self.view.popup_scroll = 0;
                        return;
                    }
                }
                overlay
            }
            Overlay::Picker(mut picker) => match self.picker_key(&mut picker, k) {
                PickerKey::Stay => Overlay::Picker(picker),
                PickerKey::Close => Overlay::None,
                PickerKey::Open { path, replay } => {
                    self.open_session(&path, replay);
                    // Opening may have opened another popup (nothing): keep what it set.
                    std::mem::replace(&mut self.overlay, Overlay::None)
                }
                PickerKey::Rename { path, name } => self.manage_session(picker, path, Some(name)),
                PickerKey::Delete(path) => self.manage_session(picker, path, None),
            },
            Overlay::ConfirmQuit => match k.code {
                KeyCode::Char('s') => {
                    let suggestion = std::env::temp_dir().join(self.convo.session.file_name());
                    Overlay::SaveAs { input: line_input(&suggestion.display().to_string()), error: None }
                }
                KeyCode::Char('q') => {
                    self.out.quit = true;
                    Overlay::None
                }
                KeyCode::Esc | KeyCode::Char('c') => Overlay::None,
                _ => Overlay::ConfirmQuit,
            },
            Overlay::SaveAs { mut input, error } => match k.code {
                KeyCode::Esc => Overlay::None,
                KeyCode::Enter => {
                    let path = first_line(&input);
                    if path.is_empty() {
                        Overlay::SaveAs { input, error: Some("type a file path".into()) }
                    } else {
                        self.convo.save.path = Some(path.into());
                        self.out.quit_after_save = true;
                        self.save_now();
                        // A failed save opened the quit question again.
                        return;
                    }
                }
                _ => {
                    line_key(&mut input, k);
                    Overlay::SaveAs { input, error }
                }
            },
            Overlay::SliderValue { slider, mut input, error } => match k.code {
                KeyCode::Esc => Overlay::None,
                KeyCode::Enter => match slider.set(&mut self.settings, &first_line(&input)) {
                    Ok(()) => {
                        let msg =
                            format!("{} = {} for the next generation", slider.label(), slider.value(&self.settings));
                        self.say(Level::Info, msg);
                        Overlay::None
                    }
                    Err(e) => Overlay::SliderValue { slider, input, error: Some(e) },
                },
                _ => {
                    line_key(&mut input, k);
                    Overlay::SliderValue { slider, input, error }
                }
            },
        };
    }
}
