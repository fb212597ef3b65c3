//! The token inspector: the token under the cursor with its id, text, logprob, phase,
//! provenance (accepted draft / bonus / forced), the entropy of the distribution it came from,
//! the margin between the two likeliest tokens, and the top alternatives.

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent};
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};

use crate::session::Turn;
use crate::tui::panel::{Ctx, DrawCtx, Handled, Panel};
use crate::tui::screen::Layout;
use crate::tui::theme::Theme;
use crate::tui::wrap::wrap;
use crate::verify::score::{Agreement, Position};
use deltascope_protocol::{DraftKind, Phase, TokenEvent};

/// A key while the inspector is open on `cursor` (one of `tokens`): ←/→ one token, ↑/↓ ten,
/// Home / End. A key it does not take goes to the focused pane.
fn on_key(cursor: &mut usize, tokens: usize, k: KeyEvent) -> Handled {
    let cur = *cursor;
    let last = tokens.saturating_sub(1);
    let moved = match k.code {
        KeyCode::Left => cur.saturating_sub(1),
        KeyCode::Right => (cur + 1).min(last),
        KeyCode::Up => cur.saturating_sub(10),
        KeyCode::Down => (cur + 10).min(last),
        KeyCode::Home => 0,
        KeyCode::End => last,
        _ => return Handled::NotConsumed,
    };
    *cursor = moved;
    Handled::Consumed
}

/// The inspector over the bottom right of `area`, on token `cursor` of `t`; `speculating`:
/// the backend drafts with MTP (then a missing logprob is an accepted draft's); `reference`:
/// the token as the local reference scored it (reference mode), shown beside the subject's.
fn draw(
    f: &mut Frame,
    area: Rect,
    ctx: &DrawCtx,
    t: &Turn,
    cursor: usize,
    speculating: bool,
    reference: Option<(&Position, Agreement)>,
) {
    let th = ctx.theme;
    let Some(tok) = t.tokens.get(cursor) else { return };
    let extra = if reference.is_some() { 2 } else { 0 };
    let full_height = 11 + extra + tok.top_logprobs.len() as u16;
    // Where the full popup would leave fewer than 6 rows of the panes (80 × 24), a compact one:
    // the facts three to a line, the alternatives without their heading.
    let compact = full_height + 6 > area.height;
    let facts = Facts::of(t, cursor, tok, speculating);
    let mut lines = if compact { compact_facts(th, tok, facts) } else { full_facts(th, tok, facts) };
    if let Some((p, class)) = reference {
        lines.extend(reference_lines(th, p, class));
    }
    lines.extend(alternative_lines(th, tok, compact));
    show_popup(f, area, th, &lines);
}

/// The token's facts as the inspector words them.
struct Facts {
    /// `#cursor of n`.
    position: String,
    id: String,
    logprob: String,
    phase: &'static str,
    origin: &'static str,
}

impl Facts {
    fn of(t: &Turn, cursor: usize, tok: &TokenEvent, speculating: bool) -> Facts {
        let logprob = match tok.logprob {
            Some(lp) => format!("{}  (p = {})", fmt_logprob(lp), fmt_p(lp)),
            // llama.cpp streams no logprob for tokens that came from accepted MTP drafts.
            None if speculating => "none sent: the server gives none for accepted MTP drafts".into(),
            None => "none sent by the server for this token".into(),
        };
        let phase = match tok.phase {
            Phase::Thinking => "thinking",
            Phase::Answer => "answer",
        };
        Facts {
            position: format!("#{cursor} of {}", t.tokens.len()),
            id: tok.id.map(|id| id.to_string()).unwrap_or_else(|| "not sent by the server".into()),
            logprob,
            phase,
            origin: origin_text(tok),
        }
    }
}

/// Where the token came from: the engine forced it, a draft was accepted, or it was sampled.
fn origin_text(tok: &TokenEvent) -> &'static str {
    match (tok.forced, tok.draft) {
        (true, _) => "forced by the engine",
        (false, Some(DraftKind::Accepted)) => "accepted MTP draft",
        (false, Some(DraftKind::Bonus)) => "bonus (verify pass)",
        (false, Some(DraftKind::None)) => "sampled",
        (false, None) => "not reported by the server",
    }
}

/// The facts three to a line, for a screen too short for one a line.
fn compact_facts(th: &Theme, tok: &TokenEvent, facts: Facts) -> Vec<Line<'static>> {
    let short = |s: &str| Span::styled(format!("{s} "), th.fg(th.dim));
    let Facts { position, id, logprob, phase, origin } = facts;
    vec![
        Line::from(vec![Span::styled(format!("{position} · id {id} · {phase} · {origin}"), th.fg(th.text))]),
        Line::from(vec![
            short("text"),
            Span::styled(format!("{:?}", tok.text), th.fg(th.accent).add_modifier(Modifier::BOLD)),
            Span::raw("  "),
            short("logprob"),
            Span::styled(logprob, th.fg(th.text)),
        ]),
        Line::from(vec![
            short("entropy"),
            Span::styled(entropy_text(tok), th.fg(th.text)),
            Span::raw("  "),
            short("margin"),
            Span::styled(margin_text(&tok.top_logprobs), th.fg(th.text)),
        ]),
    ]
}

/// The facts one a line, each after its label.
fn full_facts(th: &Theme, tok: &TokenEvent, facts: Facts) -> Vec<Line<'static>> {
    let Facts { position, id, logprob, phase, origin } = facts;
    vec![
        Line::from(vec![label(th, "token"), Span::styled(position, th.fg(th.text))]),
        Line::from(vec![label(th, "id"), Span::styled(id, th.fg(th.text))]),
        Line::from(vec![
            label(th, "text"),
            Span::styled(format!("{:?}", tok.text), th.fg(th.accent).add_modifier(Modifier::BOLD)),
        ]),
        Line::from(vec![label(th, "logprob"), Span::styled(logprob, th.fg(th.text))]),
        Line::from(vec![label(th, "entropy"), Span::styled(entropy_text(tok), th.fg(th.text))]),
        Line::from(vec![label(th, "margin"), Span::styled(margin_text(&tok.top_logprobs), th.fg(th.text))]),
        Line::from(vec![label(th, "phase"), Span::styled(phase, th.fg(th.text))]),
        Line::from(vec![label(th, "origin"), Span::styled(origin, th.fg(th.text))]),
    ]
}

/// A fact's label, padded so the values line up.
fn label(th: &Theme, s: &str) -> Span<'static> {
    Span::styled(format!("{s:<10}"), th.fg(th.dim))
}

/// The subject's logprob beside the reference's, then Δ, the reference's rank and its verdict.
fn reference_lines(th: &Theme, p: &Position, class: Agreement) -> [Line<'static>; 2] {
    let (verdict, st) = match class {
        Agreement::Agrees => ("agrees", th.fg(th.good)),
        Agreement::Drifts => ("drifts", th.fg(th.warn)),
        Agreement::Diverges => ("DIVERGES", th.fg(th.bad).add_modifier(Modifier::BOLD)),
        Agreement::NotScored => ("not scored", th.fg(th.dim)),
    };
    let server = p.subject_logprob.map_or("-".to_string(), fmt_logprob);
    [
        Line::from(vec![
            label(th, "server"),
            Span::styled(format!("{server:>9}  reference {:>9}", fmt_logprob(p.reference_logprob)), th.fg(th.text)),
        ]),
        Line::from(vec![
            label(th, "reference"),
            Span::styled(
                format!("Δ {}  rank {}  ", p.delta.map_or("-".to_string(), |d| format!("{d:+.4}")), p.reference_rank),
                th.fg(th.text),
            ),
            Span::styled(verdict, st),
        ]),
    ]
}

/// The top alternatives, the chosen token among them in bold (the compact popup leaves out
/// their heading).
fn alternative_lines(th: &Theme, tok: &TokenEvent, compact: bool) -> Vec<Line<'static>> {
    let mut lines = vec![];
    if tok.top_logprobs.is_empty() {
        lines.push(Line::styled("no alternatives recorded", th.fg(th.dim)));
    } else if !compact {
        lines.push(Line::styled("alternatives", th.fg(th.dim)));
    }
    for a in &tok.top_logprobs {
        let chosen = match (a.id, tok.id) {
            (Some(a), Some(t)) => a == t,
            _ => a.text == tok.text,
        };
        let st = if chosen { Style::new().fg(th.good).add_modifier(Modifier::BOLD) } else { th.fg(th.text) };
        lines.push(Line::from(vec![
            Span::styled(format!("  {:>6} ", a.id.map(|id| id.to_string()).unwrap_or_default()), th.fg(th.dim)),
            Span::styled(format!("{:<16}", format!("{:?}", a.text)), st),
            Span::styled(format!(" {:>9}  p {}", fmt_logprob(a.logprob), fmt_p(a.logprob)), st),
        ]));
    }
    lines
}

/// The popup with `lines`, at most 56 columns wide, in the bottom right corner of `area`.
fn show_popup(f: &mut Frame, area: Rect, th: &Theme, lines: &[Line<'static>]) {
    let w = area.width.min(56);
    let block = Block::bordered()
        .title(Line::styled(" Token inspector ←/→ Home/End ", th.title()))
        .border_style(th.border(true));
    // Wrapped to the popup, so a long line (the margin at 56 columns) is never cut.
    let lines = wrap(lines, w.saturating_sub(2) as usize);
    let h = (lines.len() as u16 + 2).min(area.height);
    let r = Rect { x: area.x + area.width - w, y: area.y + area.height - h, width: w, height: h };
    f.render_widget(Clear, r);
    f.render_widget(Paragraph::new(lines).block(block), r);
}

/// A logprob with the digits that matter: −0.0004 and −4.0e-7 are not shown as 0.
pub fn fmt_logprob(lp: f32) -> String {
    match lp.abs() {
        0.0 => "0".into(),
        a if a < 1e-3 => format!("{lp:.1e}"),
        _ => format!("{lp:.4}"),
    }
}

/// A probability from its logprob; near 1 as `1 − ε` (0.9999996 would print as 1.000).
pub fn fmt_p(lp: f32) -> String {
    let p = (lp as f64).exp();
    match p {
        p if p >= 0.999 && lp < 0.0 => format!("1 − {:.1e}", -(lp as f64).exp_m1()),
        p if p >= 0.999 => "1".into(),
        p if p < 1e-3 => format!("{p:.1e}"),
        p => format!("{p:.3}"),
    }
}

/// The entropy of the distribution the token was drawn from: exact from the local engine; from
/// a server's top alternatives only a lower bound (the tokens left out add to it).
fn entropy_text(tok: &deltascope_protocol::TokenEvent) -> String {
    if tok.forced {
        return "- (forced, not drawn)".into();
    }
    if let Some(h) = tok.entropy {
        return format!("{} nats ({} bits)", fmt_amount(h as f64), fmt_amount(h as f64 / std::f64::consts::LN_2));
    }
    if tok.top_logprobs.is_empty() {
        return "not known (no alternatives)".into();
    }
    let partial: f64 = tok.top_logprobs.iter().map(|a| -(a.logprob as f64).exp() * a.logprob as f64).sum();
    format!("≥ {} nats (from the top {} only)", fmt_amount(partial), tok.top_logprobs.len())
}

/// A non-negative amount (an entropy) with the digits that matter, as [`fmt_logprob`] does:
/// a near-certain token's 3e-7 nats is not "0.0000".
fn fmt_amount(x: f64) -> String {
    match x.abs() {
        0.0 => "0".into(),
        a if a < 1e-3 => format!("{x:.1e}"),
        _ => format!("{x:.4}"),
    }
}

/// How far the likeliest token is ahead of the second: a small margin is a coin toss that a
/// kernel's rounding can flip.
fn margin_text(top: &[deltascope_protocol::Alternative]) -> String {
    let mut lps: Vec<f32> = top.iter().map(|a| a.logprob).collect();
    lps.sort_by(|a, b| b.total_cmp(a));
    match lps[..] {
        [a, b, ..] => {
            format!("top-1 − top-2 = {} (p {} vs {})", fmt_logprob(a - b).trim_start_matches('-'), fmt_p(a), fmt_p(b))
        }
        _ => "- (fewer than two alternatives)".into(),
    }
}

/// The token inspector: a popup on one token of the shown turn. Its cursor is the view's
/// (the panes mark the same token), so the panel itself holds nothing.
pub struct Inspector;

/// What the inspector shows: token `cursor` of `turn`; `speculating`: the backend drafts
/// with MTP (then a missing logprob is an accepted draft's); `reference`: the token as the
/// local reference scored it (reference mode).
pub struct InspectorShown<'a> {
    pub turn: &'a Turn,
    pub cursor: usize,
    pub speculating: bool,
    pub reference: Option<(&'a Position, Agreement)>,
}

impl Panel for Inspector {
    type Shown<'a> = InspectorShown<'a>;
    /// The cursor and how many tokens the shown turn has.
    type Keyed<'a> = (&'a mut usize, usize);

    fn key(&mut self, k: KeyEvent, (cursor, tokens): (&mut usize, usize), _: &mut Ctx) -> Handled {
        on_key(cursor, tokens, k)
    }

    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, s: InspectorShown<'_>, _: &mut Layout) {
        draw(f, area, ctx, s.turn, s.cursor, s.speculating, s.reference)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_logprobs_keep_their_digits() {
        assert_eq!(fmt_logprob(0.0), "0");
        assert_eq!(fmt_logprob(-0.0004), "-4.0e-4");
        assert_eq!(fmt_logprob(-0.25), "-0.2500");
        assert_eq!(fmt_p(-0.0004), "1 − 4.0e-4");
        assert_eq!(fmt_p(0.0), "1");
        assert_eq!(fmt_p(-0.5), "0.607");
        assert_eq!(fmt_p(-20.0), "2.1e-9");
        assert_eq!(fmt_amount(3.2e-7), "3.2e-7");
        assert_eq!(fmt_amount(0.0), "0");
        assert_eq!(fmt_amount(0.25), "0.2500");
    }

    #[test]
    fn margin_and_entropy_bound() {
        let alt = |lp: f32| deltascope_protocol::Alternative { id: None, logprob: lp, text: String::new() };
        assert!(margin_text(&[alt(-0.1), alt(-2.5)]).starts_with("top-1 − top-2 = 2.4000"));
        assert!(margin_text(&[alt(-0.1)]).starts_with("-"));
    }
}
