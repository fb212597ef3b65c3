//! The popups that take typed input or show long text: the message log, the next turn's
//! rendered prompt, the quit question, save-as, and a typed slider value. Long text wraps and
//! scrolls; nothing is cut.

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};
use ratatui_textarea::TextArea;

use crate::backend::DryRun;
use crate::tui::app::{App, turns_label};
use crate::tui::keymap::Action;
use crate::tui::panel::DrawCtx;
use crate::tui::popup::{centered, scrolled_popup};
use crate::tui::sliders::Slider;
use crate::tui::wrap::wrap;

/// The next turn's prompt; returns the largest useful first line.
pub fn prompt(f: &mut Frame, area: Rect, ctx: &DrawCtx, result: &Result<DryRun, String>) -> u16 {
    let th = ctx.theme;
    let mut lines = vec![];
    match result {
        Err(e) => lines.push(Line::styled(format!("cannot render the prompt: {e}"), th.fg(th.bad))),
        Ok(d) => {
            lines.push(Line::styled(format!("rendered by {}", d.rendered_by), th.fg(th.dim)));
            if let Some(text) = &d.text {
                lines.push(Line::styled("--- prompt ---", th.fg(th.accent)));
                lines.extend(text.split('\n').map(|l| Line::styled(l.to_string(), th.fg(th.text))));
            }
            if let Some(ids) = &d.ids {
                lines.push(Line::styled(format!("--- {} token ids ---", ids.len()), th.fg(th.accent)));
                let joined = ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
                lines.push(Line::styled(joined, th.fg(th.text)));
            }
        }
    }
    scrolled_popup(f, area, ctx, "Next turn's prompt", lines)
}

pub fn confirm_quit(app: &App, f: &mut Frame, area: Rect) {
    let th = app.theme();
    let why = app.conversation().save.error.clone().unwrap_or_else(|| "it has not been saved".into());
    let last = match &app.conversation().save.last_good {
        Some(p) => format!("The last good copy is {}.", p.display()),
        None => "No copy of it was written.".into(),
    };
    let key = Style::new().fg(th.accent).add_modifier(Modifier::BOLD);
    let lines = vec![
        Line::styled(
            format!("This conversation ({}) is not saved: {why}", turns_label(app.session().turns.len())),
            th.fg(th.bad),
        ),
        Line::styled(last, th.fg(th.text)),
        Line::raw(""),
        Line::from(vec![Span::styled("s", key), Span::raw("  save it to another path")]),
        Line::from(vec![Span::styled("q", key), Span::raw("  quit anyway (what is lost is printed)")]),
        Line::from(vec![Span::styled("Esc", key), Span::raw("  cancel")]),
    ];
    let r = centered(area, 76.min(area.width), 12);
    f.render_widget(Clear, r);
    let rows = wrap(&lines, r.width.saturating_sub(2) as usize);
    let block = Block::bordered().title(Line::styled(" Quit? ", th.title())).border_style(th.border(true));
    f.render_widget(Paragraph::new(rows).block(block), r);
}

fn field(app: &App, f: &mut Frame, area: Rect, title: &str, help: &str, input: &TextArea, error: Option<&str>) {
    let th = app.theme();
    let mut lines = vec![Line::styled(help.to_string(), th.fg(th.dim))];
    if let Some(e) = error {
        lines.push(Line::styled(e.to_string(), th.fg(th.bad)));
    }
    let w = 76.min(area.width);
    let text_rows = wrap(&lines, w.saturating_sub(2) as usize);
    let r = centered(area, w, text_rows.len() as u16 + 5);
    f.render_widget(Clear, r);
    let block = Block::bordered().title(Line::styled(format!(" {title} "), th.title())).border_style(th.border(true));
    let inner = block.inner(r);
    f.render_widget(block, r);
    let n = text_rows.len() as u16;
    f.render_widget(Paragraph::new(text_rows), Rect { height: n.min(inner.height), ..inner });
    let field = Rect { y: inner.y + n + 1, height: 1, ..inner };
    if field.y < inner.bottom() {
        f.render_widget(input, field);
    }
}

pub fn save_as(app: &App, f: &mut Frame, area: Rect, input: &TextArea, error: Option<&str>) {
    field(app, f, area, "Save the conversation to", "Enter saves (then quits) · Esc cancels", input, error);
}

pub fn slider_value(app: &App, f: &mut Frame, area: Rect, slider: Slider, input: &TextArea, error: Option<&str>) {
    let accepts = match slider {
        Slider::MaxTokens => "tokens (1 up to the context)",
        Slider::ThinkingBudget => "tokens, off or unlimited",
        Slider::MtpDepth => "0–4 or auto",
        Slider::Preset => "a preset name",
        Slider::Seed | Slider::TopK => "a whole number",
        _ => "a number",
    };
    let help = format!("{accepts} · Enter sets · Esc cancels · {} help", app.keymap().first(Action::Help));
    field(app, f, area, &format!("{} (next run)", slider.label()), &help, input, error);
}
