//! The banners above the panes: one line per diagnostic of the shown turn, each with the keys
//! of its fixes (the same fixes F3 / F4 apply).

use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};

use crate::session::Turn;
use crate::tui::app::App;
use crate::tui::keymap::Action;
use deltascope_protocol::{Diagnostic, Fix, Phase};

/// One line per diagnostic of the shown turn, with its fixes, then its error.
pub(super) fn banner_lines(app: &App) -> Vec<Line<'static>> {
    let th = app.theme();
    let Some(t) = app.shown() else { return vec![] };
    let fix = t.fix(app.settings().max_tokens_cap(t.prompt_tokens));
    let mut out: Vec<Line<'static>> = t.diagnostics.iter().map(|d| banner(app, t, d, fix)).collect();
    if let Some(e) = &t.error {
        out.push(Line::from(vec![tag(" ERROR ", th.bad), Span::styled(format!(" {e}"), th.fg(th.text))]));
    }
    out
}

/// The banner of one diagnostic.
fn banner(app: &App, t: &Turn, d: &Diagnostic, fix: Option<Fix>) -> Line<'static> {
    let th = app.theme();
    match d.kind.as_str() {
        "thinking_exhausted_max_tokens" => empty_answer(app, t, d, fix),
        "thinking_budget_forced" => Line::from(vec![
            tag(" ⏵ FORCED END OF THINKING ", th.warn),
            Span::styled(
                format!(
                    " the thinking budget ({}) ran out at token {}; the engine closed thinking.",
                    t.params.thinking, d.at_token
                ),
                th.fg(th.text),
            ),
        ]),
        "degenerate_loop" => degenerate_loop(app, t, d),
        "loop_rescued" => {
            Line::from(vec![tag(" ↻ LOOP RESCUED ", th.warn), Span::styled(format!(" {}", d.message), th.fg(th.text))])
        }
        "answer_truncated" => {
            let mut spans =
                vec![tag(" ✂ ANSWER CUT ", th.warn), Span::styled(format!(" {} ", d.message), th.fg(th.text))];
            spans.extend(fix_spans(app, fix.and_then(|f| f.max_tokens), Action::RaiseMaxTokens, |m| {
                format!(" max_tokens → {m}")
            }));
            Line::from(spans)
        }
        "state_alarm" => state_alarm(app, d),
        other => Line::styled(format!(" {other}: {}", d.message), th.fg(th.warn)),
    }
}

/// A banner's reversed, bold tag in `colour`.
fn tag(text: &'static str, colour: Color) -> Span<'static> {
    Span::styled(text, Style::new().fg(colour).add_modifier(Modifier::BOLD | Modifier::REVERSED))
}

/// A fix's key and what it sets, or nothing when there is no such fix.
fn fix_spans<T>(app: &App, value: Option<T>, action: Action, what: impl Fn(T) -> String) -> Vec<Span<'static>> {
    let th = app.theme();
    match value {
        Some(v) => vec![
            Span::styled(format!("[{}]", app.keymap().first(action)), th.fg(th.accent).add_modifier(Modifier::BOLD)),
            Span::styled(what(v), th.fg(th.text)),
        ],
        None => vec![],
    }
}

/// Thinking ate max_tokens: the two fixes, more max_tokens or a thinking budget.
fn empty_answer(app: &App, t: &Turn, d: &Diagnostic, fix: Option<Fix>) -> Line<'static> {
    let th = app.theme();
    let mut spans = vec![
        tag(" ✖ EMPTY ANSWER ", th.bad),
        Span::styled(
            format!(" thinking used all {} of max_tokens (token {}). ", t.params.max_tokens, d.at_token),
            th.fg(th.text),
        ),
    ];
    spans.extend(fix_spans(app, fix.and_then(|f| f.max_tokens), Action::RaiseMaxTokens, |m| {
        format!(" max_tokens → {m}  ")
    }));
    spans.extend(fix_spans(app, fix.and_then(|f| f.thinking_budget), Action::SetThinkingBudget, |b| {
        let approx = if b.forced_exact { "" } else { "≈" };
        let max = if b.max_tokens != t.params.max_tokens {
            format!(", max_tokens → {}", b.max_tokens)
        } else {
            String::new()
        };
        format!(
            " budget → {}{max} ({approx}{} forced, {approx}{} answer)",
            b.thinking_budget, b.forced_tokens, b.answer_room
        )
    }));
    Line::from(spans)
}

/// A loop: where it starts and its period, and the rescue by hand while it still thinks.
fn degenerate_loop(app: &App, t: &Turn, d: &Diagnostic) -> Line<'static> {
    let th = app.theme();
    let start = d.start.unwrap_or(d.at_token);
    let mut spans = vec![
        tag(" ↻ LOOP DETECTED ", th.bad),
        Span::styled(
            format!(
                " period {} tokens from token {} (highlighted in the {} pane): {}",
                d.period.unwrap_or(0),
                start,
                phase_of(t, start),
                d.message
            ),
            th.fg(th.text),
        ),
    ];
    // The rescue by hand, while the loop is still thinking and nothing rescued it.
    let rescued = t.diagnostics.iter().any(|x| x.kind.as_str() == "loop_rescued");
    if app.live_phase() == Some(Phase::Thinking) && app.shown_index() == app.live_turn() && !rescued {
        spans.push(Span::styled(
            format!("  [{}] end thinking now", app.keymap().first(Action::EndThinking)),
            th.fg(th.accent).add_modifier(Modifier::BOLD),
        ));
    }
    Line::from(spans)
}

/// A state alarm: what it found, and the key of the State view that shows it.
fn state_alarm(app: &App, d: &Diagnostic) -> Line<'static> {
    let th = app.theme();
    let what = d.message.split(". What to check").next().unwrap_or(&d.message);
    let shown = if app.view().state.shown {
        String::new()
    } else {
        format!("  [{}] shows it", app.keymap().first(Action::StateView))
    };
    Line::from(vec![
        tag(" ⚠ STATE ALARM ", th.bad),
        Span::styled(format!(" {what}"), th.fg(th.text)),
        Span::styled(shown, th.fg(th.accent).add_modifier(Modifier::BOLD)),
    ])
}

fn phase_of(t: &Turn, token: usize) -> &'static str {
    match t.tokens.get(token).map(|x| x.phase) {
        Some(Phase::Answer) => "answer",
        _ => "thinking",
    }
}
