//! The sliders: every setting with its current value always visible; the selected one is
//! highlighted when the sliders have focus (↑/↓ select, ←/→ change, Shift or [ ] for big
//! steps, p cycles presets).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use crate::tui::app::{App, Focus};
use crate::tui::keymap::Action;
use crate::tui::sliders::Slider;

/// Rows inside the border: one per slider plus the footer.
pub const HEIGHT: u16 = Slider::ALL.len() as u16 + 1;

pub fn draw(app: &App, f: &mut Frame, area: Rect) {
    let th = &app.theme;
    let focused = app.view.focus == Focus::Sliders;
    let title = if focused {
        Line::styled(" Settings (next run) ↑↓ ←→ ", th.title())
    } else {
        Line::from(vec![
            Span::styled(" Settings (next run) ", th.title()),
            Span::styled(format!("{} ", app.keymap.first(Action::FocusNext)), th.fg(th.dim)),
        ])
    };
    let block = Block::bordered().title(title).border_style(th.border(focused));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let bar_w = 8usize;
    let label_w = 16usize;
    let mut lines = vec![];
    for (i, s) in Slider::ALL.iter().enumerate() {
        let selected = focused && i == app.view.slider;
        let pos = s.position(&app.settings);
        let knob = ((pos * (bar_w - 1) as f64).round() as usize).min(bar_w - 1);
        let track: String = (0..bar_w).map(|x| if x == knob { '●' } else { '─' }).collect();
        let label_style =
            if selected { Style::new().fg(th.accent).add_modifier(Modifier::BOLD) } else { th.fg(th.text) };
        let mut spans = vec![
            Span::styled(if selected { "▸" } else { " " }, th.fg(th.accent)),
            Span::styled(format!("{:<label_w$}", s.label()), label_style),
        ];
        if *s == Slider::Seed || *s == Slider::Preset {
            spans.push(Span::styled(" ".repeat(bar_w), th.fg(th.dim)));
        } else {
            spans.push(Span::styled(track, th.fg(if selected { th.accent } else { th.dim })));
        }
        spans.push(Span::styled(format!(" {}", s.value(&app.settings)), label_style));
        let line = Line::from(spans);
        lines.push(if selected { line.style(Style::new().bg(th.selection_bg)) } else { line });
    }
    lines.push(Line::styled(" applies to the next generation", th.fg(th.dim)));
    f.render_widget(Paragraph::new(lines), inner);
}
