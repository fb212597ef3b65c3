//! The composer panel: the prompt box's text, prompt history recall, what sending it does (a
//! new turn, the re-run of an earlier prompt, or a new system prompt), and its drawing.

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Rect;
use ratatui::text::{Line, Span};
use ratatui::widgets::Block;
use ratatui_textarea::{CursorMove, TextArea, WrapMode};
use unicode_width::UnicodeWidthStr;

use crate::tui::keymap::Action;
use crate::tui::panel::{Ctx, DrawCtx, Handled, Panel};
use crate::tui::screen::Layout;

const PLACEHOLDER: &str = "Ask something — e.g. Is 91 prime?";

/// Rows the prompt box may grow to before its text scrolls.
pub const MAX_ROWS: u16 = 10;

/// What sending the prompt box does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EditTarget {
    /// A new turn after the conversation.
    NewTurn,
    /// Replaces turn N's prompt and re-runs from there (the old continuation is kept as a
    /// branch of the session).
    Turn(usize),
    /// The system prompt (empty: none).
    System,
}

pub struct Composer {
    pub input: TextArea<'static>,
    history: Vec<String>,
    history_pos: Option<usize>,
    pub target: EditTarget,
}

impl Composer {
    pub fn new(history: Vec<String>) -> Composer {
        Composer { input: fresh(""), history, history_pos: None, target: EditTarget::NewTurn }
    }

    pub fn text(&self) -> String {
        self.input.lines().join("\n")
    }

    pub fn is_empty(&self) -> bool {
        self.input.lines().iter().all(|l| l.is_empty())
    }

    /// Empties the box and goes back to writing a new turn.
    pub fn clear(&mut self) {
        self.input = fresh("");
        self.history_pos = None;
        self.target = EditTarget::NewTurn;
    }

    /// Puts `text` in the box to edit `target`.
    pub fn edit(&mut self, text: &str, target: EditTarget) {
        self.input = fresh(text);
        self.target = target;
    }

    pub fn set_history(&mut self, history: Vec<String>) {
        self.history = history;
        self.history_pos = None;
    }

    /// Records a sent prompt for recall (not twice in a row).
    pub fn remember(&mut self, text: &str) {
        if self.history.last().map(String::as_str) != Some(text) {
            self.history.push(text.to_string());
        }
        self.history_pos = None;
    }

    /// Recalls the previous (`-1`) or next (`1`) prompt of the history.
    pub fn recall(&mut self, dir: i32) {
        if self.history.is_empty() {
            return;
        }
        let last = self.history.len() - 1;
        let pos = match (self.history_pos, dir < 0) {
            (None, true) => Some(last),
            (None, false) => None,
            (Some(p), true) => Some(p.saturating_sub(1)),
            (Some(p), false) if p >= last => None,
            (Some(p), false) => Some(p + 1),
        };
        self.history_pos = pos;
        let text = pos.and_then(|p| self.history.get(p)).cloned().unwrap_or_default();
        self.input = fresh(&text);
    }

    /// A key typed in the box: ↑/↓ recall history on a one-line prompt; everything else
    /// edits (Home/End, Ctrl+←/→ by word, and the textarea's other keys).
    fn edit_key(&mut self, k: KeyEvent) {
        let single = self.input.lines().len() <= 1;
        match k.code {
            KeyCode::Up if single && k.modifiers.is_empty() => self.recall(-1),
            KeyCode::Down if single && k.modifiers.is_empty() => self.recall(1),
            _ => shell_line_key(&mut self.input, k),
        }
    }

    /// A bracketed paste: inserted as text, its line breaks kept (terminals send `\r`).
    pub fn paste(&mut self, text: &str) {
        let text = text.replace("\r\n", "\n").replace('\r', "\n");
        self.input.insert_str(text);
    }

    pub fn newline(&mut self) {
        self.input.insert_newline();
    }

    /// The rows the text takes wrapped at `width` cells (the box grows to show them, up to
    /// [`MAX_ROWS`]).
    pub fn rows(&self, width: u16) -> u16 {
        let w = width.max(1) as usize;
        let rows: usize = self.input.lines().iter().map(|l| l.width().max(1).div_ceil(w)).sum();
        rows.clamp(1, MAX_ROWS as usize) as u16
    }
}

/// The shell's line keys a user's fingers expect in every text field: Ctrl+A / Ctrl+E to the
/// start / end of the line, Ctrl+U deletes to its start (the text area's own Ctrl+U is undo),
/// Ctrl+K to its end, Ctrl+W the word before the cursor; every other key as the text area
/// takes it.
pub fn shell_line_key(input: &mut TextArea, k: KeyEvent) {
    if k.modifiers == KeyModifiers::CONTROL {
        match k.code {
            KeyCode::Char('a') => return input.move_cursor(CursorMove::Head),
            KeyCode::Char('e') => return input.move_cursor(CursorMove::End),
            KeyCode::Char('u') => {
                input.delete_line_by_head();
                return;
            }
            KeyCode::Char('k') => {
                input.delete_line_by_end();
                return;
            }
            KeyCode::Char('w') => {
                input.delete_word();
                return;
            }
            _ => {}
        }
    }
    input.input(k);
}

/// Whether `k` is one of [`shell_line_key`]'s keys (a field being typed in takes them before
/// the workbench's own bindings: Ctrl+E ends the line there, it does not edit the prompt).
pub fn is_shell_line_key(k: &KeyEvent) -> bool {
    k.modifiers == KeyModifiers::CONTROL && matches!(k.code, KeyCode::Char('a' | 'e' | 'u' | 'k' | 'w'))
}

fn fresh(text: &str) -> TextArea<'static> {
    let mut t = TextArea::new(text.split('\n').map(str::to_string).collect());
    t.set_placeholder_text(PLACEHOLDER);
    // Long prompts wrap at words (long words by glyph) instead of scrolling sideways.
    t.set_wrap_mode(WrapMode::WordOrGlyph);
    t.move_cursor(CursorMove::Bottom);
    t.move_cursor(CursorMove::End);
    t
}

// Drawing.

impl Panel for Composer {
    /// Whether the prompt box has the focus, and whether the next turn thinks.
    type Shown<'a> = (bool, bool);
    type Keyed<'a> = ();

    fn key(&mut self, k: KeyEvent, _: (), _: &mut Ctx) -> Handled {
        self.edit_key(k);
        Handled::Consumed
    }

    /// The prompt box: what is being edited, the keys that send it, and the text.
    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, (focused, thinking): (bool, bool), _: &mut Layout) {
        draw(self, f, area, ctx, focused, thinking)
    }
}

fn draw(composer: &Composer, f: &mut Frame, area: Rect, ctx: &DrawCtx, focused: bool, thinking: bool) {
    let th = ctx.theme;
    let k = |a| ctx.keymap.first(a);
    let mut title = vec![Span::styled(" Prompt ", th.title())];
    match composer.target {
        EditTarget::NewTurn => {}
        EditTarget::Turn(i) => {
            title.push(Span::styled(format!("(editing turn {}: Enter re-runs from it) ", i + 1), th.fg(th.warn)))
        }
        EditTarget::System => title.push(Span::styled("(editing the system prompt) ", th.fg(th.warn))),
    }
    let hint = format!(
        " {} send · {} newline · {} cancel · {} regenerate · {} compare · {} thinking {} ",
        k(Action::Send),
        k(Action::Newline),
        k(Action::Cancel),
        k(Action::Regenerate),
        k(Action::Compare),
        k(Action::ToggleThinking),
        if thinking { "on" } else { "off" }
    );
    let block = Block::bordered()
        .title(Line::from(title))
        .title_bottom(Line::styled(hint, th.fg(th.dim)))
        .border_style(th.border(focused));
    let inner = block.inner(area);
    f.render_widget(block, area);
    f.render_widget(&composer.input, inner);
}
