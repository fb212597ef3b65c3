//! Drawing: a pure function of the [`App`] state. The layout adapts to the terminal: history,
//! thinking and answer side by side, and the gauge/slider column on wide terminals; panes
//! stacked on narrow ones; a message instead of a broken layout on tiny ones.

pub(crate) mod popups;
use crate::tui::panels::help::Help;
use crate::tui::panels::{compare, gauges, inspector, sliders, state_scope};
pub mod wrap;

use crate::tui::panels::transcript::{self, MarkdownWrap, PaneCache};

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Gauge, Paragraph, Wrap};

use super::app::{self, App, Level, Overlay, PaneLayout, PaneScroll};
use super::keymap::Action;
use crate::backend::BackendKind;
use crate::session::Turn;
use deltascope_protocol::Phase;

/// Below this the layout cannot show a usable workbench.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 18;

/// Width of the gauge/slider column, and the terminal width from which it is shown.
const SIDE_WIDTH: u16 = 42;
const SIDE_FROM: u16 = 110;
const HISTORY_WIDTH: u16 = 24;
const HISTORY_FROM: u16 = 150;

/// What drawing keeps between frames (each pane's wrapped lines, so a frame only wraps what
/// arrived since the last one) and the layout of the frame being drawn. The runner owns it;
/// the state never holds drawing's caches.
#[derive(Debug, Default)]
pub struct View {
    thinking: PaneCache,
    answer: PaneCache,
    pub(crate) markdown: MarkdownWrap,
    pub(crate) layout: app::Layout,
}

/// The two streaming panes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pane {
    Thinking,
    Answer,
}

impl Pane {
    pub(crate) fn phase(self) -> Phase {
        match self {
            Pane::Thinking => Phase::Thinking,
            Pane::Answer => Phase::Answer,
        }
    }

    pub(crate) fn scroll(self, view: &app::ViewState) -> &PaneScroll {
        match self {
            Pane::Thinking => &view.thinking_scroll,
            Pane::Answer => &view.answer_scroll,
        }
    }
}

impl View {
    /// Draws one frame of `app` and returns what it laid out (the runner hands that back with
    /// [`App::laid_out`]).
    pub fn draw(&mut self, app: &App, f: &mut Frame) -> app::Layout {
        self.layout = app::Layout::default();
        draw(app, f, self);
        std::mem::take(&mut self.layout)
    }

    pub(crate) fn lines(&mut self, pane: Pane) -> &mut PaneCache {
        match pane {
            Pane::Thinking => &mut self.thinking,
            Pane::Answer => &mut self.answer,
        }
    }

    pub(crate) fn record(&mut self, pane: Pane, drawn: PaneLayout) {
        match pane {
            Pane::Thinking => self.layout.thinking = Some(drawn),
            Pane::Answer => self.layout.answer = Some(drawn),
        }
    }
}

fn draw(app: &App, f: &mut Frame, v: &mut View) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        return too_small(f, area);
    }
    if let Some(err) = app.fatal() {
        let p = Paragraph::new(vec![
            Line::styled("deltascope could not start", app.theme().fg(app.theme().bad).add_modifier(Modifier::BOLD)),
            Line::raw(""),
            Line::raw(err.to_string()),
            Line::raw(""),
            Line::styled(format!("{} quits", app.keymap().first(Action::Quit)), app.theme().fg(app.theme().dim)),
        ])
        .wrap(Wrap { trim: false })
        .block(Block::bordered().border_style(app.theme().fg(app.theme().bad)));
        f.render_widget(p, centered(area, 70, 10));
        return;
    }
    if app.model().is_none() {
        return loading(app, f, area);
    }

    // Banners wrap rather than being cut at the terminal's width.
    let mut banners = wrap::wrap(&banner_lines(app), area.width as usize);
    banners.truncate(area.height.saturating_sub(MIN_HEIGHT) as usize + 2);
    // The prompt box grows with its wrapped text (then scrolls, keeping the cursor in view).
    let input_h = app.composer().rows(area.width.saturating_sub(2)) + 2;
    let [banner_area, main, input_area, status_area] = Layout::vertical([
        Constraint::Length(banners.len() as u16),
        Constraint::Min(6),
        Constraint::Length(input_h),
        Constraint::Length(1),
    ])
    .areas(area);

    let wide = area.width >= SIDE_FROM;
    let (center, side) = if wide {
        let [c, s] = Layout::horizontal([Constraint::Min(40), Constraint::Length(SIDE_WIDTH)]).areas(main);
        (c, Some(s))
    } else {
        (main, None)
    };
    let center = if area.width >= HISTORY_FROM {
        let [h, c] = Layout::horizontal([Constraint::Length(HISTORY_WIDTH), Constraint::Min(40)]).areas(center);
        transcript::history(&transcript_of(app), f, h);
        c
    } else {
        center
    };
    let center = match side {
        Some(s) => {
            side_panel(app, f, s);
            center
        }
        None => {
            // Narrow: a compact gauge strip under the panes; sliders when focused.
            let [c, strip] = Layout::vertical([Constraint::Min(4), Constraint::Length(3)]).areas(center);
            gauges::strip(f, strip, &app.draw_ctx(), &gauges_of(app));
            c
        }
    };
    if app.view().state.shown {
        let shown = state_scope::Shown {
            turn: app.shown(),
            cursor: app.view().inspector,
            focused: app.view().focus == app::Focus::State,
            generating: app.generating(),
            unavailable: app.model().and_then(|m| m.state_trace.reason()),
            tracing: app.settings().params.trace_state,
        };
        app.view().state.draw(f, center, &app.draw_ctx(), &shown, &mut v.layout);
    } else if let Some((i, score)) = app.reference_shown()
        && let Some(turn) = app.session().turns.get(i)
    {
        let subject = app.model().map(|m| short_model_name(&m.name)).unwrap_or_default();
        let v = compare::ReferenceView { turn, index: i, subject: &subject, score, cursor: app.view().inspector };
        compare::draw_reference(f, center, &app.draw_ctx(), &v);
    } else if app.view().show_compare
        && let Some((a, b)) = app.compare_pair()
    {
        compare::draw(f, center, &app.draw_ctx(), &app.session().turns, a, b);
    } else {
        // Without the history column (narrow terminals) the question asked would be nowhere
        // on screen: one line above the panes says it.
        let panes = match app.shown_index().zip(app.shown()) {
            Some((i, turn)) if area.width < HISTORY_FROM && center.height > 8 => {
                let [q, c] = Layout::vertical([Constraint::Length(1), Constraint::Min(4)]).areas(center);
                asked_line(app, f, q, i, turn);
                c
            }
            _ => center,
        };
        transcript::conversation(&transcript_of(app), f, panes, v);
    }
    if !banners.is_empty() {
        f.render_widget(Paragraph::new(banners).style(Style::new().bg(app.theme().banner_bg)), banner_area);
    }
    let focused = app.view().focus == app::Focus::Input;
    app.composer().draw(f, input_area, &app.draw_ctx(), focused, app.settings().params.thinking.is_on());
    status(app, f, status_area);

    if side.is_none() && app.view().focus == super::app::Focus::Sliders {
        let r = centered(area, SIDE_WIDTH, (sliders::HEIGHT + 2).min(area.height));
        f.render_widget(Clear, r);
        sliders::draw(f, r, &app.draw_ctx(), app.settings(), Some(app.view().slider));
    }
    // In the State view the cursor's token is its header; the popup would hide the map.
    // Reference mode's right column is its inspector, with both sides.
    if let Some(cur) = app.view().inspector
        && !app.view().state.shown
        && app.reference_shown().is_none()
        && let Some(t) = app.shown()
    {
        let speculating = app.model().is_some_and(|m| m.has_mtp);
        let reference = app
            .shown_index()
            .and_then(|i| app.reference().scores.get(&i))
            .and_then(|r| r.position_of(cur).map(|p| (p, r.classes[cur])));
        inspector::draw(f, center, &app.draw_ctx(), t, cur, speculating, reference);
    }
    match app.overlay() {
        Overlay::None => {}
        Overlay::Help => v.layout.popup_scroll_max = Some(Help.draw(f, area, &app.draw_ctx())),
        Overlay::Picker(picker) => picker.draw(f, area, &app.draw_ctx()),
        Overlay::Messages => {
            let max = app.messages().draw(f, area, &app.draw_ctx(), app.conversation().save.error.as_deref());
            v.layout.popup_scroll_max = Some(max);
        }
        Overlay::Prompt(result) => v.layout.popup_scroll_max = Some(popups::prompt(f, area, &app.draw_ctx(), result)),
        Overlay::ConfirmQuit => popups::confirm_quit(app, f, area),
        Overlay::SaveAs { input, error } => popups::save_as(app, f, area, input, error.as_deref()),
        Overlay::SliderValue { slider, input, error } => {
            popups::slider_value(app, f, area, *slider, input, error.as_deref())
        }
    }
}

fn too_small(f: &mut Frame, area: Rect) {
    let msg = format!(
        "Terminal too small: {}×{}.\nThe workbench needs at least {MIN_WIDTH}×{MIN_HEIGHT}.\nEnlarge the window (Ctrl+Q quits).",
        area.width, area.height
    );
    f.render_widget(Paragraph::new(msg).wrap(Wrap { trim: true }), area);
}

fn loading(app: &App, f: &mut Frame, area: Rect) {
    let (done, total, what) = app.loading().cloned().unwrap_or((0, 1, "starting".into()));
    let r = centered(area, 60, 5);
    let ratio = if total == 0 { 0.0 } else { done as f64 / total as f64 };
    let g = Gauge::default()
        .block(Block::bordered().title(Line::styled(" Loading model ", app.theme().title())))
        .gauge_style(Style::new().fg(app.theme().accent).bg(app.theme().headroom))
        .ratio(ratio.clamp(0.0, 1.0))
        .label(what)
        .use_unicode(true);
    f.render_widget(g, r);
}

/// A `w`×`h` rectangle centred in `area`.
pub fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect { x: area.x + (area.width - w) / 2, y: area.y + (area.height - h) / 2, width: w, height: h }
}

fn side_panel(app: &App, f: &mut Frame, area: Rect) {
    let [g, s] =
        Layout::vertical([Constraint::Min(gauges::MIN_HEIGHT), Constraint::Length(sliders::HEIGHT + 2)]).areas(area);
    gauges::panel(f, g, &app.draw_ctx(), &gauges_of(app));
    let selected = (app.view().focus == app::Focus::Sliders).then_some(app.view().slider);
    sliders::draw(f, s, &app.draw_ctx(), app.settings(), selected);
}

/// What the transcript reads of the app.
fn transcript_of(app: &App) -> transcript::Transcript<'_> {
    transcript::Transcript {
        ctx: app.draw_ctx(),
        turns: &app.session().turns,
        shown: app.shown_index(),
        generating: app.generating(),
        view: app.view(),
        markdown: app.markdown(),
        sessions_fallback: app.conversation().save.dir.fallback.as_deref(),
    }
}

/// What the gauges read of the app.
fn gauges_of(app: &App) -> gauges::Gauges<'_> {
    gauges::Gauges {
        turn: app.shown(),
        model: app.model(),
        context: app.settings().context,
        history: app.next_prompt_estimate(),
    }
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

/// One line per diagnostic of the shown turn, with its fixes.
fn banner_lines(app: &App) -> Vec<Line<'static>> {
    let th = app.theme();
    let Some(t) = app.shown() else { return vec![] };
    let mut out = vec![];
    let bold = Modifier::BOLD;
    // The same fixes F3 / F4 apply.
    let fix = t.fix(app.settings().max_tokens_cap(t.prompt_tokens));
    for d in &t.diagnostics {
        let line = match d.kind.as_str() {
            "thinking_exhausted_max_tokens" => {
                let mut spans = vec![
                    Span::styled(" ✖ EMPTY ANSWER ", Style::new().fg(th.bad).add_modifier(bold | Modifier::REVERSED)),
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
            "thinking_budget_forced" => Line::from(vec![
                Span::styled(
                    " ⏵ FORCED END OF THINKING ",
                    Style::new().fg(th.warn).add_modifier(bold | Modifier::REVERSED),
                ),
                Span::styled(
                    format!(
                        " the thinking budget ({}) ran out at token {}; the engine closed thinking.",
                        t.params.thinking, d.at_token
                    ),
                    th.fg(th.text),
                ),
            ]),
            "degenerate_loop" => {
                let mut spans = vec![
                    Span::styled(" ↻ LOOP DETECTED ", Style::new().fg(th.bad).add_modifier(bold | Modifier::REVERSED)),
                    Span::styled(
                        format!(
                            " period {} tokens from token {} (highlighted in the {} pane): {}",
                            d.period.unwrap_or(0),
                            d.start.unwrap_or(d.at_token),
                            phase_of(t, d.start.unwrap_or(d.at_token)),
                            d.message
                        ),
                        th.fg(th.text),
                    ),
                ];
                // The rescue by hand, while the loop is still thinking and nothing rescued it.
                let rescued = t.diagnostics.iter().any(|x| x.kind.as_str() == "loop_rescued");
                if app.live_phase() == Some(deltascope_protocol::Phase::Thinking)
                    && app.shown_index() == app.live_turn()
                    && !rescued
                {
                    spans.push(Span::styled(
                        format!("  [{}] end thinking now", app.keymap().first(Action::EndThinking)),
                        th.fg(th.accent).add_modifier(bold),
                    ));
                }
                Line::from(spans)
            }
            "loop_rescued" => Line::from(vec![
                Span::styled(" ↻ LOOP RESCUED ", Style::new().fg(th.warn).add_modifier(bold | Modifier::REVERSED)),
                Span::styled(format!(" {}", d.message), th.fg(th.text)),
            ]),
            "answer_truncated" => {
                let mut spans = vec![
                    Span::styled(" ✂ ANSWER CUT ", Style::new().fg(th.warn).add_modifier(bold | Modifier::REVERSED)),
                    Span::styled(format!(" {} ", d.message), th.fg(th.text)),
                ];
                spans.extend(fix_spans(app, fix.and_then(|f| f.max_tokens), Action::RaiseMaxTokens, |m| {
                    format!(" max_tokens → {m}")
                }));
                Line::from(spans)
            }
            "state_alarm" => {
                let what = d.message.split(". What to check").next().unwrap_or(&d.message);
                let shown = if app.view().state.shown {
                    String::new()
                } else {
                    format!("  [{}] shows it", app.keymap().first(Action::StateView))
                };
                Line::from(vec![
                    Span::styled(" ⚠ STATE ALARM ", Style::new().fg(th.bad).add_modifier(bold | Modifier::REVERSED)),
                    Span::styled(format!(" {what}"), th.fg(th.text)),
                    Span::styled(shown, th.fg(th.accent).add_modifier(bold)),
                ])
            }
            other => Line::styled(format!(" {other}: {}", d.message), th.fg(th.warn)),
        };
        out.push(line);
    }
    if let Some(e) = &t.error {
        out.push(Line::from(vec![
            Span::styled(" ERROR ", Style::new().fg(th.bad).add_modifier(bold | Modifier::REVERSED)),
            Span::styled(format!(" {e}"), th.fg(th.text)),
        ]));
    }
    out
}

fn phase_of(t: &Turn, token: usize) -> &'static str {
    match t.tokens.get(token).map(|x| x.phase) {
        Some(deltascope_protocol::Phase::Answer) => "answer",
        _ => "thinking",
    }
}

fn status(app: &App, f: &mut Frame, area: Rect) {
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
    let sep = Span::styled(" │ ", th.fg(th.dim));
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
    let mut settings = vec![
        sep.clone(),
        Span::styled(
            format!("thinking {}", if app.settings().params.thinking.is_on() { "on" } else { "off" }),
            th.fg(th.text),
        ),
        sep.clone(),
        Span::styled(format!("colour: {}", app.view().colour_mode.name()), th.fg(th.text)),
    ];
    // After "thinking on": a sampled run says so, and whose defaults it samples with (a
    // llama.cpp server's /props say T 0.8 while the demo is greedy locally).
    let s = &app.settings().params.sampling;
    if s.temperature > 0.0 {
        let mut text = format!("sampled T {}", s.temperature);
        if s.top_k > 0 {
            text.push_str(&format!(" · k {}", s.top_k));
        }
        if s.top_p < 1.0 {
            text.push_str(&format!(" · p {}", s.top_p));
        }
        if let Some(info) = m
            && &info.defaults == s
        {
            text.push_str(match &info.kind {
                BackendKind::Remote(l) if l.kind == "llama.cpp" => " (server defaults)",
                BackendKind::Remote(_) => " (model card preset)",
                BackendKind::Local { .. } => " (generation_config.json)",
            });
        }
        settings.insert(2, Span::styled(text, th.fg(th.warn)));
        settings.insert(2, sep.clone());
    }
    if app.settings().params.trace_state {
        settings.extend([sep.clone(), Span::styled("state trace on", th.fg(th.accent))]);
    }
    // Reference mode: which reference, and a warning that stays while it is not the model the
    // subject runs.
    let r = app.reference();
    if let Some(asked) = &r.asked {
        let (text, style) = match (&r.name, &r.error, r.not_same_model()) {
            (_, Some(_), _) => ("reference failed to load".to_string(), th.fg(th.bad)),
            (None, None, _) => (format!("reference {asked} loading…"), th.fg(th.warn)),
            (Some(name), None, Some(_)) => (
                format!("⚠ reference {name} is not the same model"),
                Style::new().fg(th.warn).add_modifier(Modifier::BOLD),
            ),
            (Some(name), None, None) if r.pending.is_some() => {
                (format!("reference {name}: re-scoring…"), th.fg(th.warn))
            }
            (Some(name), None, None) => (format!("reference {name}"), th.fg(th.accent)),
        };
        spans.push(sep.clone());
        spans.push(Span::styled(text, style));
    }
    // What is not saved stays on the status line until a save works; a file another window
    // holds stays there too (this window saves to a copy), whatever notes come after it.
    if app.conversation().save.error.is_some() {
        spans.push(sep.clone());
        spans.push(Span::styled(
            format!("⚠ NOT SAVED ({} shows why)", app.keymap().first(Action::Messages)),
            Style::new().fg(th.bad).add_modifier(Modifier::BOLD | Modifier::REVERSED),
        ));
    } else if let (Some((file, _)), Some(copy)) =
        (&app.conversation().save.held_elsewhere, &app.conversation().save.path)
    {
        let name =
            |p: &std::path::Path| p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into());
        spans.push(sep.clone());
        spans.push(Span::styled(
            format!("⚠ {} open in another window: saving to {}", name(file), name(copy)),
            Style::new().fg(th.warn).add_modifier(Modifier::BOLD),
        ));
    } else if app.conversation().save.dir.fallback.is_some()
        && let Some(dir) = &app.conversation().save.dir.path
    {
        spans.push(sep.clone());
        spans.push(Span::styled(format!("sessions → {}", dir.display()), th.fg(th.warn)));
    }
    let width = |spans: &[Span]| spans.iter().map(Span::width).sum::<usize>();
    if let Some(m) = app.messages().current() {
        let style = match m.level {
            Level::Info => th.fg(th.accent),
            Level::Warning => th.fg(th.warn),
            Level::Error => th.fg(th.bad),
        };
        let room = (area.width as usize).saturating_sub(width(&spans) + 3);
        // A message too long for the line is cut with a pointer to the log, where it is whole.
        let text = if unicode_width::UnicodeWidthStr::width(m.text.as_str()) > room {
            let more = format!("… ({} all)", app.keymap().first(Action::Messages));
            let keep = room.saturating_sub(unicode_width::UnicodeWidthStr::width(more.as_str()));
            let mut cut = String::new();
            for c in m.text.chars() {
                if unicode_width::UnicodeWidthStr::width(cut.as_str())
                    + unicode_width::UnicodeWidthChar::width(c).unwrap_or(0)
                    > keep
                {
                    break;
                }
                cut.push(c);
            }
            cut + &more
        } else {
            m.text.clone()
        };
        let message = [sep.clone(), Span::styled(text, style)];
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

/// `❯ Is 91 prime?` (with `#2 of 3` when there are several turns), cut to one line.
fn asked_line(app: &App, f: &mut Frame, area: Rect, index: usize, turn: &Turn) {
    use unicode_width::{UnicodeWidthChar, UnicodeWidthStr};
    let th = app.theme();
    let n = app.session().turns.len();
    let prefix = if n > 1 { format!("❯ #{} of {n} ", index + 1) } else { "❯ ".to_string() };
    let question = turn.user.split_whitespace().collect::<Vec<_>>().join(" ");
    let room = (area.width as usize).saturating_sub(prefix.width());
    let mut shown = String::new();
    for c in question.chars() {
        if shown.width() + c.width().unwrap_or(0) >= room {
            shown.push('…');
            break;
        }
        shown.push(c);
    }
    let line = Line::from(vec![
        Span::styled(prefix, th.fg(th.accent).add_modifier(Modifier::BOLD)),
        Span::styled(shown, th.fg(th.text).add_modifier(Modifier::BOLD)),
    ]);
    f.render_widget(Paragraph::new(line), area);
}

/// A model shown by its file name when a server reports a path (llama.cpp's default id is
/// the GGUF's full path); repository ids such as `Qwen/Qwen3.6-27B` stay whole.
fn short_model_name(name: &str) -> String {
    if name.starts_with('/') || name.contains('\\') {
        name.rsplit(['/', '\\']).next().unwrap_or(name).to_string()
    } else {
        name.to_string()
    }
}
