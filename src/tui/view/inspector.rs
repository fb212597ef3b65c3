//! The token inspector: the token under the cursor with its id, text, logprob, phase,
//! provenance (accepted draft / bonus / forced) and the top alternatives.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};

use crate::backend::{DraftKind, Phase};
use crate::tui::app::App;

pub fn draw(app: &App, f: &mut Frame, area: Rect, cursor: usize) {
    let th = &app.theme;
    let Some(t) = app.shown() else { return };
    let Some(tok) = t.tokens.get(cursor) else { return };
    let h = (9 + tok.top_logprobs.len() as u16).min(area.height);
    let w = area.width.min(56);
    let r = Rect { x: area.x + area.width - w, y: area.y + area.height - h, width: w, height: h };
    f.render_widget(Clear, r);
    let origin = match (tok.forced, tok.draft) {
        (true, _) => "forced by the engine",
        (false, Some(DraftKind::Accepted)) => "accepted MTP draft",
        (false, Some(DraftKind::Bonus)) => "bonus (verify pass)",
        (false, Some(DraftKind::None)) => "sampled",
        (false, None) => "not reported by the server",
    };
    let speculating = app.model.as_ref().is_some_and(|m| m.has_mtp);
    let logprob = match tok.logprob {
        Some(lp) => format!("{lp:.4}  (p = {:.3})", (lp as f64).exp()),
        // llama.cpp streams no logprob for tokens that came from accepted MTP drafts.
        None if speculating => "none sent: the server gives none for accepted MTP drafts".into(),
        None => "none sent by the server for this token".into(),
    };
    let id = tok.id.map(|id| id.to_string()).unwrap_or_else(|| "not sent by the server".into());
    let phase = match tok.phase {
        Phase::Thinking => "thinking",
        Phase::Answer => "answer",
    };
    let label = |s: &str| Span::styled(format!("{s:<10}"), th.fg(th.dim));
    let mut lines = vec![
        Line::from(vec![label("token"), Span::styled(format!("#{cursor} of {}", t.tokens.len()), th.fg(th.text))]),
        Line::from(vec![label("id"), Span::styled(id, th.fg(th.text))]),
        Line::from(vec![
            label("text"),
            Span::styled(format!("{:?}", tok.text), th.fg(th.accent).add_modifier(Modifier::BOLD)),
        ]),
        Line::from(vec![label("logprob"), Span::styled(logprob, th.fg(th.text))]),
        Line::from(vec![label("phase"), Span::styled(phase, th.fg(th.text))]),
        Line::from(vec![label("origin"), Span::styled(origin, th.fg(th.text))]),
    ];
    if tok.top_logprobs.is_empty() {
        lines.push(Line::styled("no alternatives recorded", th.fg(th.dim)));
    } else {
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
            Span::styled(format!(" {:>8.4}  p {:.3}", a.logprob, (a.logprob as f64).exp()), st),
        ]));
    }
    let block = Block::bordered()
        .title(Line::styled(" Token inspector ←/→ Home/End ", th.title()))
        .border_style(th.border(true));
    f.render_widget(Paragraph::new(lines).block(block), r);
}
