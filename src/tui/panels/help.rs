//! The help panel: every key, from the live keymap, and the keys that depend on the focused
//! pane (↑/↓/PgUp/PgDn scroll it when it is taller than the terminal; any other key closes it).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};

use ratatui::crossterm::event::KeyEvent;

use crate::tui::keymap::Action;
use crate::tui::panel::{Ctx, DrawCtx, Handled, Panel};
use crate::tui::popup::centered;
use crate::tui::screen::Layout;
use crate::tui::wrap::wrap;

/// Keys that depend on the focused pane (not rebindable).
const CONTEXT_KEYS: [(&str, &str); 13] = [
    ("↑ / ↓ (prompt)", "history recall on a one-line prompt"),
    ("Ctrl+A E U K W (typing)", "line start / end, delete to start / end, delete word"),
    ("↑ ↓ ← → (State)", "select a GDN layer / value head (Shift: by 8; PgUp PgDn: layers)"),
    ("m M [ ] End t (State)", "metric, token back / forward, latest, tracing on / off"),
    ("↑ ↓ ← → (settings)", "select a slider / change its value"),
    ("Enter (settings)", "type the selected slider's value (e.g. 4000)"),
    ("Shift+← → or [ ]", "big step; p cycles the presets"),
    ("↑ ↓ Home End (panes)", "scroll the focused thinking / answer pane"),
    ("← → ↑ ↓ Home End", "move the token inspector's cursor"),
    ("? (not while typing)", "this help"),
    ("Enter / r (sessions)", "open / replay the selected session"),
    ("↑ ↓ PgUp PgDn (popups)", "scroll help, messages or the prompt view when taller than the terminal"),
    ("any other key", "closes this help"),
];

/// Columns of the key and action-name columns before a description.
const KEY_COLS: usize = 24;
const NAME_COLS: usize = 20;

/// The help popup (its scroll is the popup's, in [`DrawCtx::popup_scroll`]).
#[derive(Debug, Default, Clone, Copy)]
pub struct Help;

impl Panel for Help {
    type Shown<'a> = ();
    type Keyed<'a> = ();

    /// Its scrolling keys are the popup's (the app's overlay routing).
    fn key(&mut self, _: KeyEvent, _: (), _: &mut Ctx) -> Handled {
        Handled::NotConsumed
    }

    /// The popup over `area`; its largest useful first line goes into `out`.
    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, _: (), out: &mut Layout) {
        out.popup_scroll_max = Some(draw(f, area, ctx));
    }
}

fn draw(f: &mut Frame, area: Rect, ctx: &DrawCtx) -> u16 {
    let th = ctx.theme;
    let key_style = Style::new().fg(th.accent).add_modifier(Modifier::BOLD);
    // (key, action name, description) rows; the name is empty for the context keys.
    let mut entries: Vec<(String, String, &str)> =
        Action::ALL.iter().map(|a| (ctx.keymap.label(*a), a.name(), a.describe())).collect();
    let first_context = entries.len();
    entries.extend(CONTEXT_KEYS.iter().map(|(k, d)| (k.to_string(), String::new(), *d)));
    let indent = |i: usize| if i < first_context { KEY_COLS + NAME_COLS } else { KEY_COLS };
    let heading = Line::styled("Keys (rebind in keymap.toml, see README)", th.fg(th.dim));
    // As wide as the longest line (descriptions are not cut), wrapping only when the terminal is
    // narrower (a description then continues under itself); scrolled with ↑/↓ when taller.
    let natural = entries.iter().enumerate().map(|(i, e)| indent(i) + e.2.chars().count()).max().unwrap_or(0);
    let height = entries.len() as u16 + 4;
    let r = centered(area, natural.max(heading.width()) as u16 + 2, height);
    f.render_widget(Clear, r);
    let inner = r.width.saturating_sub(2) as usize;
    // The action names (keymap.toml's) give way first on a narrow terminal, so descriptions
    // keep a column of their own rather than wrapping under the keys.
    let names = inner >= KEY_COLS + NAME_COLS + 16;
    let indent = |i: usize| if names { indent(i) } else { KEY_COLS };
    let mut rows = wrap(&[heading], inner);
    for (i, (k, name, d)) in entries.iter().enumerate() {
        if i == first_context {
            rows.push(Line::raw(""));
        }
        let cols = indent(i);
        let mut head = vec![Span::styled(format!("{k:<KEY_COLS$}"), key_style)];
        if cols > KEY_COLS {
            head.push(Span::styled(format!("{name:<NAME_COLS$}"), th.fg(th.dim)));
        }
        let desc = Line::styled(d.to_string(), th.fg(th.text));
        if inner < cols + 16 {
            // Too narrow even for two columns: the key on its line, the description under it.
            rows.push(Line::from(head));
            for part in wrap(&[desc], inner.saturating_sub(2)) {
                let mut spans = vec![Span::raw("  ")];
                spans.extend(part.spans);
                rows.push(Line::from(spans));
            }
            continue;
        }
        for (j, mut part) in wrap(&[desc], inner - cols).into_iter().enumerate() {
            let mut spans = if j == 0 { std::mem::take(&mut head) } else { vec![Span::raw(" ".repeat(cols))] };
            if j > 0
                && let Some(s) = part.spans.first_mut()
            {
                s.content = s.content.trim_start().to_string().into();
            }
            spans.extend(part.spans);
            rows.push(Line::from(spans));
        }
    }
    let visible = r.height.saturating_sub(2) as usize;
    let max = rows.len().saturating_sub(visible);
    let first = (ctx.popup_scroll as usize).min(max);
    let title = if rows.len() > visible {
        format!(" Help · ↑↓ scroll ({}–{} of {}) ", first + 1, (first + visible).min(rows.len()), rows.len())
    } else {
        " Help ".into()
    };
    let block = Block::bordered().title(Line::styled(title, th.title())).border_style(th.border(true));
    f.render_widget(Paragraph::new(rows[first..].to_vec()).block(block), r);
    max as u16
}
