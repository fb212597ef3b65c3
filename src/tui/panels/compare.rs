//! Compare: the original run and its re-run with other settings, side by side, each with its
//! settings (differences highlighted), statistics, budget bar and answer.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use super::DrawCtx;
use super::gauges::BudgetBar;
use crate::session::Turn;
use crate::tui::highlight::block_line;
use crate::tui::view::wrap::wrap;
use crate::units::duration_ms;

/// Turns `a` (the original) and `b` (its re-run) of `turns`, side by side.
pub fn draw(f: &mut Frame, area: Rect, ctx: &DrawCtx, turns: &[Turn], a: usize, b: usize) {
    let (Some(ta), Some(tb)) = (turns.get(a), turns.get(b)) else { return };
    let [left, right] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    let sa = ta.settings();
    let sb = tb.settings();
    column(ctx, f, left, &format!(" A · turn {} ", a + 1), ta, &sa, &sb);
    column(ctx, f, right, &format!(" B · turn {} (re-run) ", b + 1), tb, &sb, &sa);
}

fn column(
    ctx: &DrawCtx,
    f: &mut Frame,
    area: Rect,
    title: &str,
    t: &Turn,
    mine: &[(&str, String)],
    other: &[(&str, String)],
) {
    let th = ctx.theme;
    let block = Block::bordered().title(Line::styled(title.to_string(), th.title())).border_style(th.border(false));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let mut lines = vec![];
    // Settings, two per line; values that differ from the other run are highlighted.
    for pair in mine.chunks(2) {
        let mut spans = vec![];
        for (label, value) in pair {
            let differs = other.iter().any(|(l, v)| l == label && v != value);
            let st = if differs { Style::new().fg(th.warn).add_modifier(Modifier::BOLD) } else { th.fg(th.text) };
            spans.push(Span::styled(format!("{label} "), th.fg(th.dim)));
            spans.push(Span::styled(format!("{value:<8}"), st));
        }
        lines.push(Line::from(spans));
    }
    let finish = t.finish_reason.map(|r| r.as_str()).unwrap_or(if t.error.is_some() { "error" } else { "running…" });
    let fin_style = if finish == "stop" { th.fg(th.good) } else { th.fg(th.warn) };
    lines.push(Line::from(vec![
        Span::styled("finish ", th.fg(th.dim)),
        Span::styled(finish, fin_style.add_modifier(Modifier::BOLD)),
        Span::styled(
            match t.forced_tokens() {
                0 => format!("  thinking {}  answer {}", t.thinking_tokens(), t.answer_tokens()),
                n => format!("  thinking {}  forced {n}  answer {}", t.thinking_tokens(), t.answer_tokens()),
            },
            th.fg(th.text),
        ),
    ]));
    let timing = match &t.stats.timing {
        Some(tm) => {
            format!(
                "TTFT {} · decode {:.1} tok/s · {}",
                duration_ms(tm.ttft_ms),
                tm.decode_tok_s,
                duration_ms(tm.total_ms)
            )
        }
        None => format!("tok/s {:.1}", t.stats.samples.last().map(|s| s.tok_s).unwrap_or(0.0)),
    };
    lines.push(Line::styled(timing, th.fg(th.text)));
    let mtp = t
        .mtp()
        .map(|m| format!("MTP acc {:.0}% · len {:.2}", m.acceptance_rate * 100.0, m.mean_accepted_length))
        .unwrap_or_else(|| "MTP off".into());
    lines.push(Line::styled(mtp, th.fg(th.text)));
    for d in &t.diagnostics {
        lines.push(Line::styled(format!("⚠ {} at {}", d.kind.as_str(), d.at_token), th.fg(th.bad)));
    }
    let header = lines.len() as u16;
    if inner.height <= header + 2 {
        f.render_widget(Paragraph::new(lines), inner);
        return;
    }
    let [head, bar, body] =
        Layout::vertical([Constraint::Length(header), Constraint::Length(1), Constraint::Min(1)]).areas(inner);
    f.render_widget(Paragraph::new(lines), head);
    f.render_widget(BudgetBar::new(t, th), bar);
    let answer: Vec<Line<'static>> = t.answer.trim_start_matches('\n').split('\n').map(|l| block_line(l, th)).collect();
    let wrapped = wrap(&answer, body.width as usize);
    // Follow the tail, like the answer pane.
    let skip = wrapped.len().saturating_sub(body.height as usize);
    f.render_widget(Paragraph::new(wrapped.into_iter().skip(skip).collect::<Vec<_>>()), body);
}
