//! The conversation panes: history, thinking and answer (side by side, or stacked when
//! narrow), and the input box.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Scrollbar, ScrollbarOrientation, ScrollbarState};

use super::wrap::wrap;
use crate::chat::session::{TokenRecord, Turn};
use crate::engine::{DraftKind, Phase};
use crate::tui::app::{App, ColourMode, Focus, PaneScroll, ThinkingView};
use crate::tui::keymap::Action;
use crate::tui::theme::Theme;

/// Side by side from this width of the centre area.
const SIDE_BY_SIDE_FROM: u16 = 70;

pub fn history(app: &App, f: &mut Frame, area: Rect) {
    let th = &app.theme;
    let mut lines = vec![];
    let n = app.session.turns.len();
    for (i, t) in app.session.turns.iter().enumerate() {
        let mark = if i + 1 == n { "▶" } else { " " };
        let tag = match t.compare_of {
            Some(o) => format!("{}≈{}", i + 1, o + 1),
            None => format!("{}", i + 1),
        };
        let style = if i + 1 == n { th.fg(th.text).add_modifier(Modifier::BOLD) } else { th.fg(th.text) };
        lines.push(Line::from(vec![
            Span::styled(format!("{mark}{tag} "), th.fg(th.accent)),
            Span::styled(one_line(&t.user), style),
        ]));
        let finish =
            t.finish_reason.clone().unwrap_or_else(|| if t.error.is_some() { "error".into() } else { "…".into() });
        lines.push(Line::styled(
            format!("   {} · {}+{} tok", finish, t.thinking_tokens(), t.answer_tokens()),
            th.fg(th.dim),
        ));
        let answer = one_line(t.answer.trim());
        if !answer.is_empty() {
            lines.push(Line::styled(format!("   {answer}"), th.fg(th.answer)));
        }
    }
    if lines.is_empty() {
        lines.push(Line::styled("no turns yet", th.fg(th.dim)));
    }
    let block = Block::bordered().title(Line::styled(" History ", th.title())).border_style(th.border(false));
    let inner = block.inner(area);
    // Show the end of the history.
    let skip = lines.len().saturating_sub(inner.height as usize);
    f.render_widget(block, area);
    f.render_widget(Paragraph::new(lines.into_iter().skip(skip).collect::<Vec<_>>()), inner);
}

/// One line of plain text (markdown emphasis and code marks dropped).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ").replace(['*', '`'], "")
}

/// Thinking and answer panes for the shown turn.
pub fn conversation(app: &App, f: &mut Frame, area: Rect) {
    let thinking_w = match app.thinking_view {
        ThinkingView::Shown => None,
        ThinkingView::Collapsed => Some(3),
        ThinkingView::Hidden => Some(0),
    };
    let side = area.width >= SIDE_BY_SIDE_FROM;
    let (t_area, a_area) = match (thinking_w, side) {
        (Some(0), _) => (None, area),
        (Some(h), _) => {
            let [t, a] = Layout::vertical([Constraint::Length(h), Constraint::Min(3)]).areas(area);
            (Some(t), a)
        }
        (None, true) => {
            let [t, a] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
            (Some(t), a)
        }
        (None, false) => {
            let [t, a] = Layout::vertical([Constraint::Percentage(45), Constraint::Percentage(55)]).areas(area);
            (Some(t), a)
        }
    };
    let turn = app.shown();
    if let Some(t_area) = t_area {
        thinking(app, f, t_area, turn);
    }
    answer(app, f, a_area, turn);
}

fn thinking_title(app: &App, turn: Option<&Turn>) -> Line<'static> {
    let th = &app.theme;
    let mut spans = vec![Span::styled(" Thinking ", th.title())];
    if let Some(t) = turn {
        let n = t.thinking_tokens();
        let dur = t.thinking_ms().map(|ms| format!(" · {:.1}s", ms / 1000.0)).unwrap_or_default();
        let live = app.generating() && t.tokens.last().is_some_and(|x| x.phase == Phase::Thinking);
        spans.push(Span::styled(format!("· {n} tok{dur}{} ", if live { " …" } else { "" }), th.fg(th.thinking)));
        if !t.enable_thinking {
            spans.push(Span::styled("(off) ", th.fg(th.dim)));
        }
    }
    if app.thinking_view != ThinkingView::Shown {
        spans.push(Span::styled(format!("[{}] ", app.keymap.first(Action::CollapseThinking)), th.fg(th.dim)));
    }
    Line::from(spans)
}

fn thinking(app: &App, f: &mut Frame, area: Rect, turn: Option<&Turn>) {
    let th = &app.theme;
    let block =
        Block::bordered().title(thinking_title(app, turn)).border_style(th.border(app.focus == Focus::Thinking));
    if app.thinking_view == ThinkingView::Collapsed {
        let inner = block.inner(area);
        f.render_widget(block, area);
        if let Some(t) = turn {
            // Collapsed: just the latest line of thinking.
            let last = t.thinking.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
            f.render_widget(Paragraph::new(Line::styled(last.to_string(), th.fg(th.thinking))), inner);
        }
        return;
    }
    let lines = turn.map(|t| token_lines(app, t, Phase::Thinking)).unwrap_or_default();
    scrolled(app, f, area, block, lines, &app.thinking_scroll);
}

fn answer(app: &App, f: &mut Frame, area: Rect, turn: Option<&Turn>) {
    let th = &app.theme;
    let mut title = vec![Span::styled(" Answer ", th.title())];
    if let Some(t) = turn {
        title.push(Span::styled(format!("· {} tok ", t.answer_tokens()), th.fg(th.answer)));
        if let Some(tm) = &t.stats.timing {
            title.push(Span::styled(format!("· {:.1} tok/s ", tm.decode_tok_s), th.fg(th.dim)));
        }
    }
    let block = Block::bordered().title(Line::from(title)).border_style(th.border(app.focus == Focus::Answer));
    let lines = match turn {
        None => welcome(app),
        // Markdown in the default view; raw tokens when colouring or inspecting tokens.
        Some(t)
            if app.colour_mode == ColourMode::Phase && app.inspector.is_none() && !has_loop_in(t, Phase::Answer) =>
        {
            app.md.lines(t.answer.trim_start_matches('\n'), th)
        }
        Some(t) => token_lines(app, t, Phase::Answer),
    };
    scrolled(app, f, area, block, lines, &app.answer_scroll);
}

fn welcome(app: &App) -> Vec<Line<'static>> {
    let th = &app.theme;
    let k = |a| app.keymap.first(a);
    vec![
        Line::styled("Type a question and press Enter.", th.fg(th.text)),
        Line::raw(""),
        Line::styled("The demo model knows: primality (Is 91 prime?), addition", th.fg(th.dim)),
        Line::styled("(What is 482 + 739?), multiplication, counting letters,", th.fg(th.dim)),
        Line::styled("sorting (Sort 5, 2, 9, 1.) and comparisons.", th.fg(th.dim)),
        Line::raw(""),
        Line::styled(
            format!("{} sliders · {} sessions · {} help", k(Action::FocusNext), k(Action::Picker), k(Action::Help)),
            th.fg(th.dim),
        ),
    ]
}

/// Draws `lines` wrapped inside `block`, following the tail unless scrolled back.
fn scrolled(app: &App, f: &mut Frame, area: Rect, block: Block, lines: Vec<Line<'static>>, scroll: &PaneScroll) {
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.width < 2 || inner.height == 0 {
        return;
    }
    let text_w = inner.width.saturating_sub(1) as usize;
    let wrapped = wrap(&lines, text_w);
    let h = inner.height as usize;
    let first = scroll.first_line(wrapped.len(), h);
    scroll.last_total.set(wrapped.len());
    scroll.last_height.set(h);
    let visible: Vec<Line> = wrapped[first..(first + h).min(wrapped.len())].to_vec();
    let text_area = Rect { width: inner.width - 1, ..inner };
    f.render_widget(Paragraph::new(visible), text_area);
    if wrapped.len() > h {
        let mut state = ScrollbarState::new(wrapped.len().saturating_sub(h)).position(first);
        f.render_stateful_widget(
            Scrollbar::new(ScrollbarOrientation::VerticalRight).style(app.theme.fg(app.theme.dim)),
            inner,
            &mut state,
        );
    }
}

fn has_loop_in(t: &Turn, phase: Phase) -> bool {
    loop_ranges(t).iter().any(|(s, e)| (*s..=*e).any(|i| t.tokens.get(i).is_some_and(|x| x.phase == phase)))
}

/// Token index ranges (inclusive) reported as degenerate loops.
pub fn loop_ranges(t: &Turn) -> Vec<(usize, usize)> {
    t.diagnostics
        .iter()
        .filter(|d| d.kind == "degenerate_loop")
        .map(|d| {
            let start = d.start.unwrap_or(d.at_token);
            // The loop keeps going after the alarm until generation ends.
            let end = if t.is_finished() { t.tokens.len().saturating_sub(1) } else { d.at_token.max(start) };
            (start, end.max(d.at_token))
        })
        .collect()
}

/// The tokens of one phase as styled lines (colour mode, inspector cursor, loop highlight).
pub fn token_lines(app: &App, t: &Turn, phase: Phase) -> Vec<Line<'static>> {
    let loops = loop_ranges(t);
    let mut lines = vec![];
    let mut cur: Vec<Span<'static>> = vec![];
    let mut leading = phase == Phase::Answer;
    for (i, tok) in t.tokens.iter().enumerate().filter(|(_, x)| x.phase == phase) {
        let mut text = tok.text.as_str();
        if leading {
            // The blank line after </think> belongs to the answer phase; do not show it.
            text = text.trim_start_matches('\n');
            if text.is_empty() && app.inspector != Some(i) {
                continue;
            }
            leading = false;
        }
        let in_loop = loops.iter().any(|(s, e)| (*s..=*e).contains(&i));
        let style = token_style(&app.theme, app.colour_mode, tok, in_loop, app.inspector == Some(i));
        if text.is_empty() && app.inspector == Some(i) {
            // Make an empty token (a stop token) visible under the cursor.
            cur.push(Span::styled("∅", style));
            continue;
        }
        let mut parts = text.split('\n').peekable();
        while let Some(part) = parts.next() {
            if !part.is_empty() {
                cur.push(Span::styled(part.to_string(), style));
            }
            if parts.peek().is_some() {
                lines.push(Line::from(std::mem::take(&mut cur)));
            }
        }
    }
    if !cur.is_empty() {
        lines.push(Line::from(cur));
    }
    lines
}

pub fn token_style(th: &Theme, mode: ColourMode, tok: &TokenRecord, in_loop: bool, cursor: bool) -> Style {
    let phase_fg = if tok.phase == Phase::Thinking { th.thinking } else { th.answer };
    let mut s = match mode {
        _ if tok.forced => Style::new().fg(th.forced).add_modifier(Modifier::ITALIC),
        ColourMode::Phase => Style::new().fg(phase_fg),
        ColourMode::Logprob => {
            let p = (tok.logprob as f64).exp();
            let c = if p >= 0.9 {
                th.good
            } else if p >= 0.5 {
                th.text
            } else if p >= 0.2 {
                th.warn
            } else {
                th.bad
            };
            Style::new().fg(c)
        }
        ColourMode::Provenance => match tok.draft {
            DraftKind::Accepted => Style::new().fg(th.accepted),
            DraftKind::Bonus => Style::new().fg(th.bonus),
            DraftKind::None => Style::new().fg(th.dim),
        },
    };
    if in_loop {
        s = s.bg(th.loop_bg);
    }
    if cursor {
        s = s.bg(th.cursor_bg).add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
    }
    s
}

pub fn input(app: &App, f: &mut Frame, area: Rect) {
    let th = &app.theme;
    let k = |a| app.keymap.first(a);
    let mut title = vec![Span::styled(" Prompt ", th.title())];
    if app.editing_last {
        title.push(Span::styled("(editing the last prompt) ", th.fg(th.warn)));
    }
    let hint = format!(
        " {} send · {} newline · {} cancel · {} regenerate · {} compare · {} thinking {} ",
        k(Action::Send),
        k(Action::Newline),
        k(Action::Cancel),
        k(Action::Regenerate),
        k(Action::Compare),
        k(Action::ToggleThinking),
        if app.settings.enable_thinking { "on" } else { "off" }
    );
    let block = Block::bordered()
        .title(Line::from(title))
        .title_bottom(Line::styled(hint, th.fg(th.dim)))
        .border_style(th.border(app.focus == Focus::Input));
    let inner = block.inner(area);
    f.render_widget(block, area);
    f.render_widget(&app.input, inner);
}
