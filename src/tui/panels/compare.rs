//! Compare: the original run and its re-run with other settings, side by side, each with its
//! settings (differences highlighted), statistics, budget bar and answer; and reference mode,
//! a turn re-scored by the local reference, each token coloured by its agreement.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use ratatui::crossterm::event::KeyEvent;

use super::gauges::BudgetBar;
use super::inspector::{fmt_logprob, fmt_p};
use crate::session::Turn;
use crate::tui::highlight::block_line;
use crate::tui::keymap::Action;
use crate::tui::panel::{Ctx, DrawCtx, Handled, Panel};
use crate::tui::screen::Layout as Laid;
use crate::tui::theme::Theme;
use crate::tui::wrap::wrap;
use crate::verify::rescore::Rescore;
use crate::verify::score::{Agreement, Alt, Position, Verdict};
use crate::verify::server::PromptCheck;
use deltascope_model::duration_ms;
use deltascope_protocol::Phase;

/// Turns `a` (the original) and `b` (its re-run) of `turns`, side by side.
fn draw(f: &mut Frame, area: Rect, ctx: &DrawCtx, turns: &[Turn], a: usize, b: usize) {
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
                tm.ttft_ms.map_or_else(|| "-".to_string(), duration_ms),
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

/// What reference mode shows: a turn re-scored by the local reference.
pub struct ReferenceView<'a> {
    pub turn: &'a Turn,
    pub index: usize,
    /// The subject's name (the server's model, or the local engine).
    pub subject: &'a str,
    /// The rescore once it is done.
    pub score: Option<&'a Rescore>,
    /// The inspector's token.
    pub cursor: Option<usize>,
}

/// Reference mode: the turn's tokens coloured by agreement with the reference (left), the
/// reference's findings and the cursor's token on both sides (right).
fn draw_reference(f: &mut Frame, area: Rect, ctx: &DrawCtx, v: &ReferenceView) {
    let th = ctx.theme;
    let [left, right] = Layout::horizontal([Constraint::Percentage(55), Constraint::Percentage(45)]).areas(area);
    let block = Block::bordered()
        .title(Line::styled(format!(" {} · turn {} ", v.subject, v.index + 1), th.title()))
        .border_style(th.border(false));
    let inner = block.inner(left);
    f.render_widget(block, left);
    let (lines, cursor_row) = coloured_tokens(ctx, v, inner.width as usize);
    // The cursor's row in view (a third from the top), else the top.
    let skip = cursor_row.map_or(0, |r| r.saturating_sub(inner.height as usize / 3));
    f.render_widget(Paragraph::new(lines.into_iter().skip(skip).collect::<Vec<_>>()), inner);

    let title = match v.score {
        Some(r) => format!(" reference {} ", r.reference),
        None => " reference ".to_string(),
    };
    let block = Block::bordered().title(Line::styled(title, th.title())).border_style(th.border(false));
    let inner = block.inner(right);
    f.render_widget(block, right);
    let lines = match v.score {
        None => vec![Line::styled("re-scoring with the reference…", th.fg(th.warn))],
        Some(r) => findings(ctx, r, v.cursor, v.turn.params.sampling.temperature),
    };
    f.render_widget(Paragraph::new(wrap(&lines, inner.width as usize)), inner);
}

fn class_style(ctx: &DrawCtx, c: Agreement) -> Style {
    let th = ctx.theme;
    match c {
        Agreement::Agrees => th.fg(th.good),
        Agreement::Drifts => th.fg(th.warn).add_modifier(Modifier::BOLD),
        Agreement::Diverges => th.fg(th.bad).add_modifier(Modifier::BOLD | Modifier::REVERSED),
        Agreement::NotScored => th.fg(th.dim),
    }
}

/// The turn's tokens wrapped to `width`, each styled by its class (thinking in italics, the
/// cursor underlined), and the row the cursor is on.
fn coloured_tokens(ctx: &DrawCtx, v: &ReferenceView, width: usize) -> (Vec<Line<'static>>, Option<usize>) {
    let mut source: Vec<Line<'static>> = vec![Line::default()];
    let mut cursor_at: Option<(usize, usize)> = None;
    for (k, tok) in v.turn.tokens.iter().enumerate() {
        let class = v.score.and_then(|r| r.classes.get(k).copied()).unwrap_or(Agreement::NotScored);
        let mut st = class_style(ctx, class);
        if tok.phase == Phase::Thinking {
            st = st.add_modifier(Modifier::ITALIC);
        }
        if v.cursor == Some(k) {
            st = st.add_modifier(Modifier::UNDERLINED | Modifier::BOLD);
            let line = source.len() - 1;
            let col = source[line].width();
            cursor_at = Some((line, col));
        }
        // A token that is only a line break still shows where it is.
        let mut parts = tok.text.split('\n').peekable();
        while let Some(part) = parts.next() {
            let shown = if part.is_empty() && parts.peek().is_some() && v.cursor == Some(k) { "⏎" } else { part };
            if !shown.is_empty()
                && let Some(last) = source.last_mut()
            {
                last.spans.push(Span::styled(shown.to_string(), st));
            }
            if parts.peek().is_some() {
                source.push(Line::default());
            }
        }
    }
    let mut out = vec![];
    let mut cursor_row = None;
    for (i, line) in source.iter().enumerate() {
        if let Some((l, col)) = cursor_at
            && l == i
        {
            // The rows before the cursor's column on its line.
            let before: String = line.spans.iter().map(|s| s.content.as_ref()).collect::<String>();
            let prefix: String = before
                .chars()
                .scan(0usize, |w, c| {
                    *w += unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
                    (*w <= col).then_some(c)
                })
                .collect();
            let rows = wrap(&[Line::raw(prefix)], width).len();
            cursor_row = Some(out.len() + rows.saturating_sub(1));
        }
        out.extend(wrap(std::slice::from_ref(line), width));
    }
    (out, cursor_row)
}

/// The reference's findings on the turn, then the cursor's token from both sides.
fn findings(ctx: &DrawCtx, r: &Rescore, cursor: Option<usize>, temperature: f32) -> Vec<Line<'static>> {
    let th = ctx.theme;
    let mut lines = turn_findings(ctx, r, temperature);
    let Some(c) = cursor else {
        lines.extend(class_legend(th));
        return lines;
    };
    lines.push(Line::default());
    match r.position_of(c) {
        None => lines.push(Line::styled(format!("token #{c}: not scored"), th.fg(th.dim))),
        Some(p) => lines.extend(token_findings(ctx, r, c, p)),
    }
    lines
}

/// A label or separator in the findings.
fn dim(th: &Theme, s: &str) -> Span<'static> {
    Span::styled(s.to_string(), th.fg(th.dim))
}

/// A value in the findings.
fn text(th: &Theme, s: String) -> Span<'static> {
    Span::styled(s, th.fg(th.text))
}

/// What the reference found over the whole turn: its verdict, the prompt check, how many
/// tokens fall in each class, the worst position, and the keys that go through them.
fn turn_findings(ctx: &DrawCtx, r: &Rescore, temperature: f32) -> Vec<Line<'static>> {
    let th = ctx.theme;
    let mut lines = vec![verdict_line(th, r)];
    lines.push(Line::from(vec![dim(th, "prompt   "), text(th, prompt_text(&r.prompt))]));
    if let Some(why) = &r.not_same_model {
        lines.push(Line::styled(format!("⚠ not the same model: {why}"), th.fg(th.warn).add_modifier(Modifier::BOLD)));
    }
    lines.push(counts_line(ctx, r));
    let w = crate::verify::score::worst(&r.positions);
    lines.push(Line::from(vec![
        dim(th, "worst    "),
        text(th, format!("|Δ| {:.3} · top-k overlap {:.2} · KL ≥ {:.4}", w.delta, w.overlap, w.kl)),
    ]));
    if let Some((i, t)) = &r.unmapped {
        lines.push(Line::styled(
            format!("token #{i} ({t:?}) has no reference id: not scored from there"),
            th.fg(th.warn),
        ));
    }
    lines.push(Line::from(vec![
        dim(th, "keys     "),
        text(
            th,
            format!(
                "{} token · {} first divergence · {} close",
                ctx.keymap.first(Action::Inspector),
                ctx.keymap.first(Action::FirstDivergence),
                ctx.keymap.first(Action::CompareView)
            ),
        ),
    ]));
    if temperature > 0.0 {
        lines.push(Line::styled(
            format!(
                "sampled at temperature {temperature:.2}: a token drawn against the odds reads as a divergence; Δ and KL are what tell (greedy turns are the clean check)"
            ),
            th.fg(th.dim),
        ));
    }
    lines
}

/// The turn's verdict, with the token (not the scored position) where it is worst.
fn verdict_line(th: &Theme, r: &Rescore) -> Line<'static> {
    let (verdict, vstyle) = match &r.verdict {
        Verdict::Agrees => ("agrees".to_string(), th.fg(th.good)),
        Verdict::Drifts { worst_delta, at, .. } => {
            let tok = r.by_token.iter().position(|p| *p == Some(*at)).map_or(String::new(), |k| format!(" at #{k}"));
            (format!("drifts (worst |Δ| {worst_delta:.3}{tok})"), th.fg(th.warn))
        }
        Verdict::Diverges { at } => {
            let tok = r.by_token.iter().position(|p| *p == Some(*at)).map_or(String::new(), |k| format!(" #{k}"));
            (format!("DIVERGES at token{tok}"), th.fg(th.bad))
        }
    };
    Line::from(vec![dim(th, "verdict  "), Span::styled(verdict, vstyle.add_modifier(Modifier::BOLD))])
}

/// Whether the server saw the prompt the reference scored.
fn prompt_text(prompt: &PromptCheck) -> String {
    match prompt {
        PromptCheck::Same { tokens } => format!("the server's is the same ({tokens} tokens)"),
        PromptCheck::TokenizerSame { tokens } => {
            format!("the server tokenises the reference's the same ({tokens} tokens; it renders no chat)")
        }
        PromptCheck::Differs { at, reference, subject, .. } => {
            format!("DIFFERS at token {at}: {subject} where the reference has {reference}")
        }
        PromptCheck::NotChecked { why } => format!("not checked ({why})"),
    }
}

/// How many of the turn's tokens agree, drift, diverge or were not scored.
fn counts_line(ctx: &DrawCtx, r: &Rescore) -> Line<'static> {
    let th = ctx.theme;
    let [agree, drift, diverge, not_scored] = r.counts();
    Line::from(vec![
        dim(th, "tokens   "),
        Span::styled(format!("{agree} agree"), class_style(ctx, Agreement::Agrees)),
        dim(th, " · "),
        Span::styled(format!("{drift} drift"), th.fg(th.warn)),
        dim(th, " · "),
        Span::styled(format!("{diverge} diverge"), th.fg(th.bad)),
        dim(th, format!(" · {not_scored} not scored").as_str()),
    ])
}

/// What the classes mean, shown while no token is picked.
fn class_legend(th: &Theme) -> [Line<'static>; 3] {
    [
        Line::default(),
        Line::styled("agrees: |Δ| and KL at the level of bf16 rounding; drifts: larger,", th.fg(th.dim)),
        Line::styled("no decision changed; diverges: a token the reference all but rules out", th.fg(th.dim)),
    ]
}

/// Token `c` (scored at `p`) from both sides: its class, logprob and probability, Δ and the
/// reference's rank, the top-k overlap and both top-5s.
fn token_findings(ctx: &DrawCtx, r: &Rescore, c: usize, p: &Position) -> Vec<Line<'static>> {
    let th = ctx.theme;
    let class = r.classes.get(c).copied().unwrap_or(Agreement::NotScored);
    let mut lines = vec![Line::from(vec![
        Span::styled(format!("token #{c} {:?} ", p.text), th.fg(th.accent).add_modifier(Modifier::BOLD)),
        Span::styled(
            match class {
                Agreement::Agrees => "agrees",
                Agreement::Drifts => "drifts",
                Agreement::Diverges => "DIVERGES",
                Agreement::NotScored => "not scored (forced through)",
            },
            class_style(ctx, class),
        ),
    ])];
    let lp = |x: Option<f32>| x.map_or("-".to_string(), fmt_logprob);
    let row = |label: &str, a: String, b: String| {
        Line::from(vec![dim(th, &format!("{label:<8}")), text(th, format!("{a:>12} {b:>12}"))])
    };
    lines.push(Line::from(vec![dim(th, &format!("{:<8}{:>12} {:>12}", "", "server", "reference"))]));
    lines.push(row("logprob", lp(p.subject_logprob), fmt_logprob(p.reference_logprob)));
    lines.push(row("p", p.subject_logprob.map_or("-".to_string(), fmt_p), fmt_p(p.reference_logprob)));
    let delta = p.delta.map_or("-".to_string(), |d| format!("{d:+.4}"));
    lines.push(Line::from(vec![
        dim(th, "Δ       "),
        text(th, format!("{delta} · reference rank {}", p.reference_rank)),
    ]));
    if let (Some(o), Some(kl)) = (p.overlap, p.kl_lower_bound) {
        lines.push(Line::from(vec![dim(th, "top-k   "), text(th, format!("overlap {o:.2} · KL ≥ {kl:.4}"))]));
    }
    lines.extend(top_fives(th, p));
    lines
}

/// The server's and the reference's top 5 side by side, the token chosen in bold where it is
/// among them.
fn top_fives(th: &Theme, p: &Position) -> Vec<Line<'static>> {
    let mut lines = vec![Line::from(vec![dim(th, &format!("{:<8}{:<17}{}", "top-5", "server", "reference"))])];
    let cell = |a: Option<&Alt>| {
        a.map_or(String::new(), |a| format!("{:<8}{:>8}", trim(&format!("{:?}", a.text), 8), fmt_logprob(a.logprob)))
    };
    let st = |a: Option<&Alt>| {
        if a.is_some_and(|a| a.id == p.id) { th.fg(th.good).add_modifier(Modifier::BOLD) } else { th.fg(th.text) }
    };
    for k in 0..5 {
        let (s, rf) = (p.subject_top.get(k), p.reference_top.get(k));
        if s.is_none() && rf.is_none() {
            break;
        }
        lines.push(Line::from(vec![
            dim(th, "  "),
            Span::styled(format!("{:<17}", cell(s)), st(s)),
            Span::styled(cell(rf), st(rf)),
        ]));
    }
    if p.subject_top.is_empty() {
        lines.push(Line::styled("the server sent no alternatives for this token", th.fg(th.dim)));
    }
    lines
}

/// `s` cut to `n` characters (with … when cut).
fn trim(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_string() } else { s.chars().take(n - 1).collect::<String>() + "…" }
}

/// The comparison panel: two runs of one prompt side by side, or a turn against the local
/// reference's re-scoring (reference mode). It holds nothing; the turns are the session's.
pub struct Compare;

/// What the comparison shows.
pub enum CompareShown<'a> {
    /// Turns `a` and `b` of `turns`.
    Pair {
        turns: &'a [Turn],
        a: usize,
        b: usize,
    },
    Reference(ReferenceView<'a>),
}

impl Panel for Compare {
    type Shown<'a> = CompareShown<'a>;
    type Keyed<'a> = ();

    fn key(&mut self, _: KeyEvent, _: (), _: &mut Ctx) -> Handled {
        Handled::NotConsumed
    }

    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, shown: CompareShown<'_>, _: &mut Laid) {
        match shown {
            CompareShown::Pair { turns, a, b } => draw(f, area, ctx, turns, a, b),
            CompareShown::Reference(v) => draw_reference(f, area, ctx, &v),
        }
    }
}
