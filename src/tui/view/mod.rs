//! Drawing: a pure function of the [`App`] state. The layout adapts to the terminal: history,
//! thinking and answer side by side, and the gauge/slider column on wide terminals; panes
//! stacked on narrow ones; a message instead of a broken layout on tiny ones.

mod banners;
pub(crate) mod popups;
mod status;

use self::banners::banner_lines;
use self::status::status;

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Gauge, Paragraph, Wrap};

use super::app::{self, App, Overlay};
use super::keymap::Action;
use crate::session::Turn;
use crate::tui::panel::Panel;
use crate::tui::panels::compare::{Compare, CompareShown, ReferenceView};
use crate::tui::panels::gauges::{self, Gauges, Readings};
use crate::tui::panels::help::Help;
use crate::tui::panels::inspector::{Inspector, InspectorShown};
use crate::tui::panels::sliders;
use crate::tui::panels::state_scope;
use crate::tui::panels::transcript::{History, PaneCaches, PanesShown};
use crate::tui::popup::centered;
use crate::tui::wrap::wrap;

/// Below this the layout cannot show a usable workbench.
pub const MIN_WIDTH: u16 = 60;
pub const MIN_HEIGHT: u16 = 18;

/// Width of the gauge/slider column, and the terminal width from which it is shown.
const SIDE_WIDTH: u16 = 42;
const SIDE_FROM: u16 = 110;
const HISTORY_WIDTH: u16 = 24;
const HISTORY_FROM: u16 = 150;

/// What drawing keeps between frames (the panes' wrapped lines, so a frame only wraps what
/// arrived since the last one) and the layout of the frame being drawn. The runner owns it;
/// the state never holds drawing's caches.
#[derive(Debug, Default)]
pub struct View {
    panes: PaneCaches,
    layout: app::Layout,
}

impl View {
    /// Draws one frame of `app` and returns what it laid out (the runner hands that back with
    /// [`App::laid_out`]).
    pub fn draw(&mut self, app: &App, f: &mut Frame) -> app::Layout {
        self.layout = app::Layout::default();
        draw(app, f, self);
        std::mem::take(&mut self.layout)
    }
}

fn draw(app: &App, f: &mut Frame, v: &mut View) {
    let area = f.area();
    if area.width < MIN_WIDTH || area.height < MIN_HEIGHT {
        return too_small(f, area);
    }
    if let Some(err) = app.fatal() {
        return fatal(app, f, area, err);
    }
    if app.model().is_none() {
        return loading(app, f, area);
    }
    // Banners wrap rather than being cut at the terminal's width.
    let mut banners = wrap(&banner_lines(app), area.width as usize);
    banners.truncate(area.height.saturating_sub(MIN_HEIGHT) as usize + 2);
    // The prompt box grows with its wrapped text (then scrolls, keeping the cursor in view).
    let input_rows = app.composer().rows(area.width.saturating_sub(2)) + 2;
    let at = Areas::of(area, banners.len() as u16, input_rows);
    let ctx = app.draw_ctx();
    if let Some(h) = at.history {
        History.draw(f, h, &ctx, (&app.session().turns, app.shown_index()), &mut v.layout);
    }
    match (at.side, at.strip) {
        (Some(side), _) => side_panel(app, f, side, &mut v.layout),
        (None, Some(strip)) => Gauges::Strip.draw(f, strip, &ctx, gauges_of(app), &mut v.layout),
        (None, None) => {}
    }
    centre(app, f, &at, v);
    if !banners.is_empty() {
        f.render_widget(Paragraph::new(banners).style(Style::new().bg(app.theme().banner_bg)), at.banner);
    }
    let focused = app.view().focus == app::Focus::Input;
    let thinking = app.settings().params.thinking.is_on();
    app.composer().draw(f, at.input, &ctx, (focused, thinking), &mut v.layout);
    status(app, f, at.status);
    // Narrow: the sliders, while they have the focus, over the panes.
    if at.side.is_none() && app.view().focus == app::Focus::Sliders {
        let r = centered(area, SIDE_WIDTH, (sliders::HEIGHT + 2).min(area.height));
        f.render_widget(Clear, r);
        app.view().sliders.draw(f, r, &ctx, (app.settings(), true), &mut v.layout);
    }
    inspector(app, f, at.centre, v);
    overlay(app, f, area, v);
}

/// Where each part of the workbench goes in one frame, computed from the terminal's size
/// before anything is drawn: history, thinking and answer side by side, and the gauge/slider
/// column on wide terminals; a gauge strip under the panes on narrow ones.
struct Areas {
    banner: Rect,
    /// The panes, the State view or a comparison.
    centre: Rect,
    /// The history column (from [`HISTORY_FROM`] columns).
    history: Option<Rect>,
    /// The gauges and sliders column (from [`SIDE_FROM`] columns).
    side: Option<Rect>,
    /// The compact gauge strip, where there is no side column.
    strip: Option<Rect>,
    input: Rect,
    status: Rect,
    /// Whether the history column, which names each turn's question, is on screen.
    with_history: bool,
}

impl Areas {
    fn of(area: Rect, banner_rows: u16, input_rows: u16) -> Areas {
        let [banner, main, input, status] = Layout::vertical([
            Constraint::Length(banner_rows),
            Constraint::Min(6),
            Constraint::Length(input_rows),
            Constraint::Length(1),
        ])
        .areas(area);
        let (centre, side) = if area.width >= SIDE_FROM {
            let [c, s] = Layout::horizontal([Constraint::Min(40), Constraint::Length(SIDE_WIDTH)]).areas(main);
            (c, Some(s))
        } else {
            (main, None)
        };
        let with_history = area.width >= HISTORY_FROM;
        let (centre, history) = if with_history {
            let [h, c] = Layout::horizontal([Constraint::Length(HISTORY_WIDTH), Constraint::Min(40)]).areas(centre);
            (c, Some(h))
        } else {
            (centre, None)
        };
        let (centre, strip) = match side {
            Some(_) => (centre, None),
            None => {
                let [c, strip] = Layout::vertical([Constraint::Min(4), Constraint::Length(3)]).areas(centre);
                (c, Some(strip))
            }
        };
        Areas { banner, centre, history, side, strip, input, status, with_history }
    }
}

/// The centre: the State view, reference mode, a comparison, or the thinking and answer panes.
fn centre(app: &App, f: &mut Frame, at: &Areas, v: &mut View) {
    let ctx = app.draw_ctx();
    let area = at.centre;
    if app.view().state.shown {
        let shown = state_scope::Shown {
            turn: app.shown(),
            cursor: app.view().inspector,
            focused: app.view().focus == app::Focus::State,
            generating: app.generating(),
            unavailable: app.model().and_then(|m| m.state_trace.reason()),
            tracing: app.settings().params.trace_state,
        };
        app.view().state.draw(f, area, &ctx, shown, &mut v.layout);
    } else if let Some((i, score)) = app.reference_shown()
        && let Some(turn) = app.session().turns.get(i)
    {
        let subject = app.model().map(|m| short_model_name(&m.name)).unwrap_or_default();
        let shown = ReferenceView { turn, index: i, subject: &subject, score, cursor: app.view().inspector };
        Compare.draw(f, area, &ctx, CompareShown::Reference(shown), &mut v.layout);
    } else if app.view().show_compare
        && let Some((a, b)) = app.compare_pair()
    {
        let shown = CompareShown::Pair { turns: &app.session().turns, a, b };
        Compare.draw(f, area, &ctx, shown, &mut v.layout);
    } else {
        // Without the history column (narrow terminals) the question asked would be nowhere
        // on screen: one line above the panes says it.
        let panes = match app.shown_index().zip(app.shown()) {
            Some((i, turn)) if !at.with_history && area.height > 8 => {
                let [q, c] = Layout::vertical([Constraint::Length(1), Constraint::Min(4)]).areas(area);
                asked_line(app, f, q, i, turn);
                c
            }
            _ => area,
        };
        let shown = panes_of(app, &mut v.panes);
        app.view().panes.draw(f, panes, &ctx, shown, &mut v.layout);
    }
}

/// The token inspector over the panes. In the State view the cursor's token is its header
/// (the popup would hide the map); reference mode's right column is its inspector.
fn inspector(app: &App, f: &mut Frame, centre: Rect, v: &mut View) {
    let Some(cur) = app.view().inspector else { return };
    if app.view().state.shown || app.reference_shown().is_some() {
        return;
    }
    let Some(t) = app.shown() else { return };
    let speculating = app.model().is_some_and(|m| m.has_mtp);
    let reference = app
        .shown_index()
        .and_then(|i| app.reference().scores.get(&i))
        .and_then(|r| r.position_of(cur).map(|p| (p, r.classes[cur])));
    let shown = InspectorShown { turn: t, cursor: cur, speculating, reference };
    Inspector.draw(f, centre, &app.draw_ctx(), shown, &mut v.layout);
}

/// The open popup, over everything.
fn overlay(app: &App, f: &mut Frame, area: Rect, v: &mut View) {
    let ctx = app.draw_ctx();
    match app.overlay() {
        Overlay::None => {}
        Overlay::Help => Help.draw(f, area, &ctx, (), &mut v.layout),
        Overlay::Picker(picker) => picker.draw(f, area, &ctx, (), &mut v.layout),
        Overlay::Messages => {
            let not_saved = app.conversation().save.error.as_deref();
            app.messages().draw(f, area, &ctx, not_saved, &mut v.layout)
        }
        Overlay::Prompt(result) => v.layout.popup_scroll_max = Some(popups::prompt(f, area, &ctx, result)),
        Overlay::ConfirmQuit => popups::confirm_quit(app, f, area),
        Overlay::SaveAs { input, error } => popups::save_as(app, f, area, input, error.as_deref()),
        Overlay::SliderValue { slider, input, error } => {
            popups::slider_value(app, f, area, *slider, input, error.as_deref())
        }
    }
}

/// Why the workbench could not start, and the key that quits.
fn fatal(app: &App, f: &mut Frame, area: Rect, err: &str) {
    let th = app.theme();
    let p = Paragraph::new(vec![
        Line::styled("deltascope could not start", th.fg(th.bad).add_modifier(Modifier::BOLD)),
        Line::raw(""),
        Line::raw(err.to_string()),
        Line::raw(""),
        Line::styled(format!("{} quits", app.keymap().first(Action::Quit)), th.fg(th.dim)),
    ])
    .wrap(Wrap { trim: false })
    .block(Block::bordered().border_style(th.fg(th.bad)));
    f.render_widget(p, centered(area, 70, 10));
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

fn side_panel(app: &App, f: &mut Frame, area: Rect, out: &mut app::Layout) {
    let [g, s] =
        Layout::vertical([Constraint::Min(gauges::MIN_HEIGHT), Constraint::Length(sliders::HEIGHT + 2)]).areas(area);
    Gauges::Column.draw(f, g, &app.draw_ctx(), gauges_of(app), out);
    let focused = app.view().focus == app::Focus::Sliders;
    app.view().sliders.draw(f, s, &app.draw_ctx(), (app.settings(), focused), out);
}

/// What the panes read of the app, with the view's caches.
fn panes_of<'a>(app: &'a App, caches: &'a mut PaneCaches) -> PanesShown<'a> {
    let view = app.view();
    PanesShown {
        turns: &app.session().turns,
        shown: app.shown_index(),
        generating: app.generating(),
        focus: view.focus,
        thinking_view: view.thinking_view,
        colour_mode: view.colour_mode,
        inspector: view.inspector,
        markdown: app.markdown(),
        sessions_fallback: app.conversation().save.dir.fallback.as_deref(),
        caches,
    }
}

/// What the gauges read of the app.
fn gauges_of(app: &App) -> Readings<'_> {
    Readings {
        turn: app.shown(),
        model: app.model(),
        context: app.settings().context,
        history: app.next_prompt_estimate(),
    }
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
