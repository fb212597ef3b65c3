//! The token inspector: the token under the cursor with its id, text, logprob, phase,
//! provenance (accepted draft / bonus / forced) and the top alternatives.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};

use crate::engine::{DraftKind, Phase};
use crate::tui::app::App;

pub fn draw(app: &App, f: &mut Frame, area: Rect, cursor: usize) {
    let th = &app.theme;
    let Some(t) = app.shown() else { return };
    let Some(tok) = t.tokens.get(cursor) else { return };
    let h = (9 + tok.top.len() as u16).min(area.height);
    let w = area.width.min(56);
    let r = Rect { x: area.x + area.width - w, y: area.y + area.height - h, width: w, height: h };
    f.render_widget(Clear, r);
    let origin = match (tok.forced, tok.draft) {
        (true, _) => "forced by the engine",
        (false, DraftKind::Accepted) => "accepted MTP draft",
        (false, DraftKind::Bonus) => "bonus (verify pass)",
        (false, DraftKind::None) => "sampled",
    };
    let phase = match tok.phase {
        Phase::Thinking => "thinking",
        Phase::Answer => "answer",
    };
    let label = |s: &str| Span::styled(format!("{s:<10}"), th.fg(th.dim));
    let mut lines = vec![
        Line::from(vec![label("token"), Span::styled(format!("#{cursor} of {}", t.tokens.len()), th.fg(th.text))]),
        Line::from(vec![label("id"), Span::styled(tok.id.to_string(), th.fg(th.text))]),
        Line::from(vec![
            label("text"),
            Span::styled(format!("{:?}", tok.text), th.fg(th.accent).add_modifier(Modifier::BOLD)),
        ]),
        Line::from(vec![
            label("logprob"),
            Span::styled(format!("{:.4}  (p = {:.3})", tok.logprob, (tok.logprob as f64).exp()), th.fg(th.text)),
        ]),
        Line::from(vec![label("phase"), Span::styled(phase, th.fg(th.text))]),
        Line::from(vec![label("origin"), Span::styled(origin, th.fg(th.text))]),
    ];
    if tok.top.is_empty() {
        lines.push(Line::styled("no alternatives recorded", th.fg(th.dim)));
    } else {
        lines.push(Line::styled("alternatives", th.fg(th.dim)));
    }
    for a in &tok.top {
        let chosen = a.id == tok.id;
        let st = if chosen { Style::new().fg(th.good).add_modifier(Modifier::BOLD) } else { th.fg(th.text) };
        lines.push(Line::from(vec![
            Span::styled(format!("  {:>6} ", a.id), th.fg(th.dim)),
            Span::styled(format!("{:<16}", format!("{:?}", a.text)), st),
            Span::styled(format!(" {:>8.4}  p {:.3}", a.logprob, (a.logprob as f64).exp()), st),
        ]));
    }
    let block = Block::bordered()
        .title(Line::styled(" Token inspector ←/→ Home/End ", th.title()))
        .border_style(th.border(true));
    f.render_widget(Paragraph::new(lines).block(block), r);
}
