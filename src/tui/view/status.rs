//! The status line: the model, the backend, what runs, the settings of the next run, the
//! reference, what is not saved, and the latest message (cut to the line, whole in the log).

use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};

use super::short_model_name;
use crate::backend::BackendKind;
use crate::tui::app::{App, Level};
use crate::tui::keymap::Action;
use crate::tui::log::Message;

pub(super) fn status(app: &App, f: &mut Frame, area: Rect) {
    let th = app.theme();
    let sep = Span::styled(" │ ", th.fg(th.dim));
    let mut spans = what_runs(app, &sep);
    spans.extend(reference(app, &sep));
    spans.extend(not_saved(app, &sep));
    let settings = settings(app, &sep);
    if let Some(m) = app.messages().current() {
        let room = (area.width as usize).saturating_sub(width(&spans) + 3);
        let message = [sep.clone(), Span::styled(cut(app, m, room), message_style(app, m))];
        // A message matters more than settings the panes already show: they give way to it.
        if width(&spans) + width(&settings) + width(&message) <= area.width as usize {
            spans.extend(settings);
        }
        spans.extend(message);
    } else {
        spans.extend(settings);
        spans.push(sep);
        spans.push(Span::styled(
            format!("{} help · {} state", app.keymap().first(Action::Help), app.keymap().first(Action::StateView)),
            th.fg(th.dim),
        ));
    }
    f.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn width(spans: &[Span]) -> usize {
    spans.iter().map(Span::width).sum()
}

/// The model, the backend, what runs now, and how the shown turn finished.
fn what_runs(app: &App, sep: &Span<'static>) -> Vec<Span<'static>> {
    let th = app.theme();
    let m = app.model();
    let state = app.state_label();
    let state_style = match state {
        "thinking" => th.fg(th.thinking),
        "answering" => th.fg(th.good),
        "prefill" | "loading" | "replay" => th.fg(th.warn),
        "paused (step)" => th.fg(th.forced),
        _ => th.fg(th.dim),
    }
    .add_modifier(Modifier::BOLD);
    let mut spans = vec![
        Span::styled(" deltascope ", th.title()),
        sep.clone(),
        Span::styled(m.map(|m| short_model_name(&m.name)).unwrap_or_default(), th.fg(th.text)),
        sep.clone(),
        Span::styled(m.map(|m| m.label()).unwrap_or_default(), th.fg(th.text)),
        sep.clone(),
        Span::styled(format!("● {state}"), state_style),
    ];
    if let Some(t) = app.shown()
        && !app.generating()
    {
        let finish =
            t.finish_reason.map(|r| r.as_str().to_string()).or_else(|| t.error.as_ref().map(|_| "error".to_string()));
        if let Some(fr) = finish {
            let st = if fr == "stop" { th.fg(th.good) } else { th.fg(th.warn) };
            spans.push(sep.clone());
            spans.push(Span::styled(format!("finish: {fr}"), st));
        }
    }
    spans
}

/// The settings of the next run: thinking, sampling, the colour mode, state tracing.
fn settings(app: &App, sep: &Span<'static>) -> Vec<Span<'static>> {
    let th = app.theme();
    let mut settings = vec![
        sep.clone(),
        Span::styled(
            format!("thinking {}", if app.settings().params.thinking.is_on() { "on" } else { "off" }),
            th.fg(th.text),
        ),
        sep.clone(),
        Span::styled(format!("colour: {}", app.view().colour_mode.name()), th.fg(th.text)),
    ];
    // After "thinking on": a sampled run says so, and whose defaults it samples with.
    if let Some(sampled) = sampling(app) {
        settings.insert(2, Span::styled(sampled, th.fg(th.warn)));
        settings.insert(2, sep.clone());
    }
    if app.settings().params.trace_state {
        settings.extend([sep.clone(), Span::styled("state trace on", th.fg(th.accent))]);
    }
    settings
}

/// `sampled T 0.8 · k 40 (server defaults)` for a sampled run (a llama.cpp server's /props say
/// T 0.8 while the demo is greedy locally); nothing for a greedy one.
fn sampling(app: &App) -> Option<String> {
    let s = &app.settings().params.sampling;
    if s.temperature <= 0.0 {
        return None;
    }
    let mut text = format!("sampled T {}", s.temperature);
    if s.top_k > 0 {
        text.push_str(&format!(" · k {}", s.top_k));
    }
    if s.top_p < 1.0 {
        text.push_str(&format!(" · p {}", s.top_p));
    }
    if let Some(info) = app.model()
        && &info.defaults == s
    {
        text.push_str(match &info.kind {
            BackendKind::Remote(l) if l.kind == "llama.cpp" => " (server defaults)",
            BackendKind::Remote(_) => " (model card preset)",
            BackendKind::Local { .. } => " (generation_config.json)",
        });
    }
    Some(text)
}

/// Reference mode: which reference, and a warning that stays while it is not the model the
/// subject runs.
fn reference(app: &App, sep: &Span<'static>) -> Vec<Span<'static>> {
    let th = app.theme();
    let r = app.reference();
    let Some(asked) = &r.asked else { return vec![] };
    let (text, style) = match (&r.name, &r.error, r.not_same_model()) {
        (_, Some(_), _) => ("reference failed to load".to_string(), th.fg(th.bad)),
        (None, None, _) => (format!("reference {asked} loading…"), th.fg(th.warn)),
        (Some(name), None, Some(_)) => {
            (format!("⚠ reference {name} is not the same model"), Style::new().fg(th.warn).add_modifier(Modifier::BOLD))
        }
        (Some(name), None, None) if r.pending.is_some() => (format!("reference {name}: re-scoring…"), th.fg(th.warn)),
        (Some(name), None, None) => (format!("reference {name}"), th.fg(th.accent)),
    };
    vec![sep.clone(), Span::styled(text, style)]
}

/// What is not saved stays on the status line until a save works; a file another window holds
/// stays there too (this window saves to a copy), whatever notes come after it.
fn not_saved(app: &App, sep: &Span<'static>) -> Vec<Span<'static>> {
    let th = app.theme();
    let save = &app.conversation().save;
    if save.error.is_some() {
        return vec![
            sep.clone(),
            Span::styled(
                format!("⚠ NOT SAVED ({} shows why)", app.keymap().first(Action::Messages)),
                Style::new().fg(th.bad).add_modifier(Modifier::BOLD | Modifier::REVERSED),
            ),
        ];
    }
    if let (Some((file, _)), Some(copy)) = (&save.held_elsewhere, &save.path) {
        let name =
            |p: &std::path::Path| p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into());
        return vec![
            sep.clone(),
            Span::styled(
                format!("⚠ {} open in another window: saving to {}", name(file), name(copy)),
                Style::new().fg(th.warn).add_modifier(Modifier::BOLD),
            ),
        ];
    }
    match (&save.dir.fallback, &save.dir.path) {
        (Some(_), Some(dir)) => {
            vec![sep.clone(), Span::styled(format!("sessions → {}", dir.display()), th.fg(th.warn))]
        }
        _ => vec![],
    }
}

fn message_style(app: &App, m: &Message) -> Style {
    let th = app.theme();
    match m.level {
        Level::Info => th.fg(th.accent),
        Level::Warning => th.fg(th.warn),
        Level::Error => th.fg(th.bad),
    }
}

/// The message, or as much of it as fits in `room` columns with a pointer to the log, where it
/// is whole.
fn cut(app: &App, m: &Message, room: usize) -> String {
    if m.text.as_str().width() <= room {
        return m.text.clone();
    }
    let more = format!("… ({} all)", app.keymap().first(Action::Messages));
    let keep = room.saturating_sub(more.as_str().width());
    let mut cut = String::new();
    for c in m.text.chars() {
        if cut.as_str().width() + c.width().unwrap_or(0) > keep {
            break;
        }
        cut.push(c);
    }
    cut + &more
}
