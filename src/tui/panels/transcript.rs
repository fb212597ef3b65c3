//! The transcript panel: the history list, and the thinking and answer panes (side by side, or
//! stacked when narrow) with their scroll state and keys. Drawing wraps through caches the
//! runner's [`View`] keeps between frames, and records each pane's layout in the frame's
//! [`crate::tui::app::Layout`].

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent};
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Scrollbar, ScrollbarOrientation, ScrollbarState};

use crate::session::{Timed, Turn};
use crate::tui::highlight::Markdown;
use crate::tui::keymap::Action;
use crate::tui::panel::{Ctx, Panel};
use crate::tui::panel::{DrawCtx, Handled};
use crate::tui::screen::{ColourMode, Focus, Layout as Laid, PaneLayout, ThinkingView};
use crate::tui::theme::Theme;
use crate::tui::wrap::wrap;
use deltascope_model::duration_ms;
use deltascope_protocol::{DiagnosticKind, DraftKind, Phase, TokenEvent};

/// Scroll state of a streaming pane: `None` follows the tail.
#[derive(Debug, Default)]
pub struct PaneScroll {
    pub top: Option<usize>,
    /// What the last frame drew of this pane.
    pub last: PaneLayout,
}

impl PaneScroll {
    /// The first visible line for `total` lines in `height` rows.
    pub fn first_line(&self, total: usize, height: usize) -> usize {
        let tail = total.saturating_sub(height);
        self.top.map(|t| t.min(tail)).unwrap_or(tail)
    }

    pub fn scroll(&mut self, delta: i64) {
        let total = self.last.total;
        let height = self.last.height.max(1);
        let tail = total.saturating_sub(height);
        let cur = self.first_line(total, height) as i64;
        let next = (cur + delta).clamp(0, tail as i64) as usize;
        // Back at the bottom: follow the tail again.
        self.top = if next >= tail { None } else { Some(next) };
    }

    /// One page up (`-1`) or down (`1`).
    pub fn page(&mut self, dir: i64) {
        let page = self.last.height.max(2) as i64 - 1;
        self.scroll(dir * page);
    }

    pub fn follow(&mut self) {
        self.top = None;
    }
}

/// The transcript panel: the shown turn's thinking and answer panes. Its state is each pane's
/// scrolling; a key scrolls the focused pane.
#[derive(Debug, Default)]
pub struct Panes {
    pub thinking: PaneScroll,
    pub answer: PaneScroll,
}

impl Panes {
    /// Both panes follow their tails again (a new turn, another shown turn).
    pub fn follow(&mut self) {
        self.thinking.follow();
        self.answer.follow();
    }

    pub fn scroll_of(&mut self, pane: Pane) -> &mut PaneScroll {
        match pane {
            Pane::Thinking => &mut self.thinking,
            Pane::Answer => &mut self.answer,
        }
    }
}

/// What the panes show but do not own, gathered by the view from the app for one frame.
pub struct PanesShown<'a> {
    pub turns: &'a [Turn],
    /// The turn the panes show (index into `turns`).
    pub shown: Option<usize>,
    /// A generation is running (the thinking pane's title says "live").
    pub generating: bool,
    pub focus: Focus,
    pub thinking_view: ThinkingView,
    pub colour_mode: ColourMode,
    /// The token inspector's cursor.
    pub inspector: Option<usize>,
    /// The shown turn's answer, rendered up to its last finished line.
    pub markdown: &'a Markdown,
    /// Why sessions are saved elsewhere than asked (the welcome screen says so).
    pub sessions_fallback: Option<&'a str>,
    /// The panes' wrapped lines, kept by the view between frames.
    pub caches: &'a mut PaneCaches,
}

impl Panel for Panes {
    type Shown<'a> = PanesShown<'a>;
    /// The pane that has the focus.
    type Keyed<'a> = Pane;

    fn key(&mut self, k: KeyEvent, pane: Pane, _: &mut Ctx) -> Handled {
        self.scroll_of(pane).key(k)
    }

    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, shown: PanesShown<'_>, out: &mut Laid) {
        let tr = Transcript {
            ctx: *ctx,
            turns: shown.turns,
            shown: shown.shown,
            generating: shown.generating,
            focus: shown.focus,
            thinking_view: shown.thinking_view,
            colour_mode: shown.colour_mode,
            inspector: shown.inspector,
            thinking_scroll: &self.thinking,
            answer_scroll: &self.answer,
            markdown: shown.markdown,
            sessions_fallback: shown.sessions_fallback,
        };
        let (thinking, answer) = conversation(&tr, f, area, shown.caches);
        out.thinking = thinking.or(out.thinking);
        out.answer = answer.or(out.answer);
    }
}

/// The history column: every turn of the conversation, one or three lines each.
pub struct History;

impl Panel for History {
    /// The turns, and the one the panes show.
    type Shown<'a> = (&'a [Turn], Option<usize>);
    type Keyed<'a> = ();

    fn key(&mut self, _: KeyEvent, _: (), _: &mut Ctx) -> Handled {
        Handled::NotConsumed
    }

    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, (turns, shown): Self::Shown<'_>, _: &mut Laid) {
        history(ctx, turns, shown, f, area)
    }
}

/// What drawing the panes reads, for one frame.
#[derive(Clone, Copy)]
struct Transcript<'a> {
    ctx: DrawCtx<'a>,
    turns: &'a [Turn],
    shown: Option<usize>,
    generating: bool,
    focus: Focus,
    thinking_view: ThinkingView,
    colour_mode: ColourMode,
    inspector: Option<usize>,
    thinking_scroll: &'a PaneScroll,
    answer_scroll: &'a PaneScroll,
    markdown: &'a Markdown,
    sessions_fallback: Option<&'a str>,
}

impl Transcript<'_> {
    fn turn(&self) -> Option<&Turn> {
        self.shown.and_then(|i| self.turns.get(i))
    }

    fn scroll(&self, pane: Pane) -> &PaneScroll {
        match pane {
            Pane::Thinking => self.thinking_scroll,
            Pane::Answer => self.answer_scroll,
        }
    }
}

/// The two streaming panes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pane {
    Thinking,
    Answer,
}

impl Pane {
    fn phase(self) -> Phase {
        match self {
            Pane::Thinking => Phase::Thinking,
            Pane::Answer => Phase::Answer,
        }
    }
}

/// What drawing keeps between frames for the panes: each pane's wrapped lines, so a frame only
/// wraps what arrived since the last one. The view owns it; the state never holds drawing's
/// caches.
#[derive(Debug, Default)]
pub struct PaneCaches {
    thinking: PaneCache,
    answer: PaneCache,
    markdown: MarkdownWrap,
}

impl PaneCaches {
    fn lines(&mut self, pane: Pane) -> &mut PaneCache {
        match pane {
            Pane::Thinking => &mut self.thinking,
            Pane::Answer => &mut self.answer,
        }
    }
}

impl PaneScroll {
    /// A key while this pane has the focus: ↑/↓ scroll, Home / End.
    pub fn key(&mut self, k: KeyEvent) -> Handled {
        match k.code {
            KeyCode::Up => self.scroll(-1),
            KeyCode::Down => self.scroll(1),
            KeyCode::Home => self.top = Some(0),
            KeyCode::End => self.follow(),
            _ => return Handled::NotConsumed,
        }
        Handled::Consumed
    }
}

/// Side by side from this width of the centre area.
const SIDE_BY_SIDE_FROM: u16 = 70;

fn history(ctx: &DrawCtx, turns: &[Turn], shown: Option<usize>, f: &mut Frame, area: Rect) {
    let th = ctx.theme;
    let mut lines = vec![];
    for (i, t) in turns.iter().enumerate() {
        let mark = if Some(i) == shown { "▶" } else { " " };
        let tag = match t.compare_of {
            Some(o) => format!("{}≈{}", i + 1, o + 1),
            None => format!("{}", i + 1),
        };
        let style = if Some(i) == shown { th.fg(th.text).add_modifier(Modifier::BOLD) } else { th.fg(th.text) };
        lines.push(Line::from(vec![
            Span::styled(format!("{mark}{tag} "), th.fg(th.accent)),
            Span::styled(one_line(&t.user), style),
        ]));
        let finish = t.finish_reason.map(|r| r.as_str()).unwrap_or(if t.error.is_some() { "error" } else { "…" });
        lines.push(Line::styled(
            format!("   {} · {}+{} tok", finish, t.thinking_tokens(), t.answer_tokens()),
            th.fg(th.dim),
        ));
        let answer = one_line_answer(t.answer.trim());
        if !answer.is_empty() {
            lines.push(Line::styled(format!("   {answer}"), th.fg(th.answer)));
        }
    }
    if lines.is_empty() {
        lines.push(Line::styled("no turns yet", th.fg(th.dim)));
    }
    let block = Block::bordered().title(Line::styled(" History ", th.title())).border_style(th.border(false));
    let inner = block.inner(area);
    // Show the end of the history.
    let skip = lines.len().saturating_sub(inner.height as usize);
    f.render_widget(block, area);
    f.render_widget(Paragraph::new(lines.into_iter().skip(skip).collect::<Vec<_>>()), inner);
}

/// One line of plain text (markdown emphasis and code marks dropped).
/// `s` on one line, as typed ("What is 37 * 6?" keeps its `*`).
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An answer on one line, its Markdown marks (`**bold**`, `` `code` ``) left out; a lone `*`
/// (a product) stays.
fn one_line_answer(s: &str) -> String {
    one_line(s).replace("**", "").replace('`', "")
}

/// Thinking and answer panes for the shown turn; what each laid out.
fn conversation(
    tr: &Transcript,
    f: &mut Frame,
    area: Rect,
    v: &mut PaneCaches,
) -> (Option<PaneLayout>, Option<PaneLayout>) {
    let thinking_w = match tr.thinking_view {
        ThinkingView::Shown => None,
        ThinkingView::Collapsed => Some(3),
        ThinkingView::Hidden => Some(0),
    };
    let side = area.width >= SIDE_BY_SIDE_FROM;
    let (t_area, a_area) = match (thinking_w, side) {
        (Some(0), _) => (None, area),
        (Some(h), _) => {
            let [t, a] = Layout::vertical([Constraint::Length(h), Constraint::Min(3)]).areas(area);
            (Some(t), a)
        }
        (None, true) => {
            let [t, a] = Layout::horizontal([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
            (Some(t), a)
        }
        (None, false) => {
            let [t, a] = Layout::vertical([Constraint::Percentage(45), Constraint::Percentage(55)]).areas(area);
            (Some(t), a)
        }
    };
    let turn = tr.turn();
    let thinking = t_area.and_then(|t_area| thinking(tr, f, t_area, turn, v));
    (thinking, answer(tr, f, a_area, turn, v))
}

fn thinking_title(tr: &Transcript, turn: Option<&Turn>) -> Line<'static> {
    let th = tr.ctx.theme;
    let mut spans = vec![Span::styled(" Thinking ", th.title())];
    if let Some(t) = turn {
        let n = t.thinking_tokens();
        // A time under a millisecond (a few tokens, or tokens that arrived together) would read
        // "0 ms": no time is shown rather than a wrong one.
        let dur = t
            .thinking_ms()
            .filter(|ms| n > 0 && *ms >= 1.0)
            .map(|ms| format!(" · {}", duration_ms(ms)))
            .unwrap_or_default();
        let live = tr.generating && t.tokens.last().is_some_and(|x| x.phase == Phase::Thinking);
        spans.push(Span::styled(format!("· {n} tok"), th.fg(th.thinking)));
        // What the thinking budget forced (bridge, `</think>`) is not thinking.
        if let n @ 1.. = t.forced_tokens() {
            spans.push(Span::styled(format!(" + {n} forced"), th.fg(th.forced)));
        }
        spans.push(Span::styled(format!("{dur}{} ", if live { " …" } else { "" }), th.fg(th.thinking)));
        if !t.params.thinking.is_on() {
            spans.push(Span::styled("(off) ", th.fg(th.dim)));
        }
    }
    if tr.thinking_view != ThinkingView::Shown {
        spans.push(Span::styled(format!("[{}] ", tr.ctx.keymap.first(Action::CollapseThinking)), th.fg(th.dim)));
    }
    Line::from(spans)
}

fn thinking(tr: &Transcript, f: &mut Frame, area: Rect, turn: Option<&Turn>, v: &mut PaneCaches) -> Option<PaneLayout> {
    let th = tr.ctx.theme;
    let block = Block::bordered().title(thinking_title(tr, turn)).border_style(th.border(tr.focus == Focus::Thinking));
    if tr.thinking_view == ThinkingView::Collapsed {
        let inner = block.inner(area);
        f.render_widget(block, area);
        if let Some(t) = turn {
            // Collapsed: just the latest line of thinking.
            let last = t.thinking.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
            f.render_widget(Paragraph::new(Line::styled(last.to_string(), th.fg(th.thinking))), inner);
        }
        return None;
    }
    match turn {
        Some(t) => token_pane(tr, f, area, block, t, Pane::Thinking, v),
        None => scrolled(tr, f, area, block, vec![], Pane::Thinking),
    }
}

fn answer(tr: &Transcript, f: &mut Frame, area: Rect, turn: Option<&Turn>, v: &mut PaneCaches) -> Option<PaneLayout> {
    let th = tr.ctx.theme;
    let mut title = vec![Span::styled(" Answer ", th.title())];
    if let Some(t) = turn {
        title.push(Span::styled(format!("· {} tok ", t.answer_tokens()), th.fg(th.answer)));
        // No speed for an empty answer: there was nothing to time.
        if let Some(tm) = t.stats.timing.as_ref().filter(|tm| t.answer_tokens() > 0 && tm.decode_tok_s > 0.0) {
            title.push(Span::styled(format!("· {:.1} tok/s ", tm.decode_tok_s), th.fg(th.dim)));
        }
    }
    let block = Block::bordered().title(Line::from(title)).border_style(th.border(tr.focus == Focus::Answer));
    match turn {
        None => scrolled(tr, f, area, block, welcome(tr), Pane::Answer),
        // Markdown in the default view; raw tokens when colouring or inspecting tokens.
        Some(t) if tr.colour_mode == ColourMode::Phase && tr.inspector.is_none() && !has_loop_in(t, Phase::Answer) => {
            markdown_pane(tr, f, area, block, t, v)
        }
        Some(t) => token_pane(tr, f, area, block, t, Pane::Answer, v),
    }
}

fn welcome(tr: &Transcript) -> Vec<Line<'static>> {
    let th = tr.ctx.theme;
    let k = |a| tr.ctx.keymap.first(a);
    let mut lines = vec![];
    // A sessions directory that cannot be used is said on the first screen.
    if let Some(why) = tr.sessions_fallback {
        lines.push(Line::styled(format!("⚠ {why}"), th.fg(th.warn)));
        lines.push(Line::raw(""));
    }
    lines.extend([
        Line::styled("Type a question and press Enter.", th.fg(th.text)),
        Line::raw(""),
        // One paragraph, wrapped to the pane (lines broken by hand came out ragged).
        Line::styled(
            "The demo model knows: primality (Is 91 prime?), addition (What is 482 + 739?), multiplication, counting letters, sorting (Sort 5, 2, 9, 1.) and comparisons.",
            th.fg(th.dim),
        ),
        Line::raw(""),
        Line::styled(
            format!("{} sliders · {} sessions · {} help", k(Action::FocusNext), k(Action::Picker), k(Action::Help)),
            th.fg(th.dim),
        ),
    ]);
    lines
}

/// Draws `lines` wrapped inside `block`, following the tail unless scrolled back.
fn scrolled(
    tr: &Transcript,
    f: &mut Frame,
    area: Rect,
    block: Block,
    lines: Vec<Line<'static>>,
    pane: Pane,
) -> Option<PaneLayout> {
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.width < 2 || inner.height == 0 {
        return None;
    }
    let wrapped = wrap(&lines, inner.width.saturating_sub(1) as usize);
    let drawn = show(tr, f, inner, wrapped.len(), |r| wrapped[r].to_vec(), tr.scroll(pane));
    Some(drawn)
}

/// Draws one phase's tokens inside `block`, wrapped through the pane's [`PaneCache`] so a frame
/// only wraps what arrived since the last one.
fn token_pane(
    tr: &Transcript,
    f: &mut Frame,
    area: Rect,
    block: Block,
    t: &Turn,
    pane: Pane,
    v: &mut PaneCaches,
) -> Option<PaneLayout> {
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.width < 2 || inner.height == 0 {
        return None;
    }
    let cache = v.lines(pane);
    let tail = cache.update(tr, t, pane.phase(), inner.width.saturating_sub(1) as usize);
    let closed = &cache.wrapped;
    let total = closed.len() + tail.len();
    let drawn = show(
        tr,
        f,
        inner,
        total,
        |r| r.map(|i| closed.get(i).unwrap_or_else(|| &tail[i - closed.len()]).clone()).collect(),
        tr.scroll(pane),
    );
    Some(drawn)
}

/// Draws the answer as Markdown inside `block`: the finished lines wrapped once (kept in the
/// pane's [`MarkdownWrap`]), the open ones each frame.
fn markdown_pane(
    tr: &Transcript,
    f: &mut Frame,
    area: Rect,
    block: Block,
    t: &Turn,
    v: &mut PaneCaches,
) -> Option<PaneLayout> {
    let inner = block.inner(area);
    f.render_widget(block, area);
    if inner.width < 2 || inner.height == 0 {
        return None;
    }
    let width = inner.width.saturating_sub(1) as usize;
    let cache = &mut v.markdown;
    let finished = tr.markdown.finished();
    if (cache.md_id, cache.width) != (Some(tr.markdown.id), width) || cache.wrapped_from > finished.len() {
        *cache = MarkdownWrap { md_id: Some(tr.markdown.id), width, ..Default::default() };
    }
    let new = wrap(&finished[cache.wrapped_from..], width);
    cache.wrapped.extend(new);
    cache.wrapped_from = finished.len();
    let open = wrap(&tr.markdown.open_lines(t.answer.trim_start_matches('\n'), tr.ctx.theme), width);
    let closed = &cache.wrapped;
    let total = closed.len() + open.len();
    let drawn = show(
        tr,
        f,
        inner,
        total,
        |r| r.map(|i| closed.get(i).unwrap_or_else(|| &open[i - closed.len()]).clone()).collect(),
        tr.answer_scroll,
    );
    Some(drawn)
}

/// The wrapped finished lines of one [`crate::tui::highlight::Markdown`] (by its id) at one width.
#[derive(Debug, Default)]
pub struct MarkdownWrap {
    md_id: Option<u64>,
    width: usize,
    /// Finished lines wrapped so far.
    wrapped_from: usize,
    wrapped: Vec<Line<'static>>,
}

/// Draws the visible rows of `total` wrapped lines (`rows` yields a range of them) and the
/// scrollbar, following the tail unless scrolled back. Returns what it laid out.
fn show(
    tr: &Transcript,
    f: &mut Frame,
    inner: Rect,
    total: usize,
    rows: impl FnOnce(std::ops::Range<usize>) -> Vec<Line<'static>>,
    scroll: &PaneScroll,
) -> PaneLayout {
    let h = inner.height as usize;
    let first = scroll.first_line(total, h);
    let visible = rows(first..(first + h).min(total));
    let text_area = Rect { width: inner.width - 1, ..inner };
    f.render_widget(Paragraph::new(visible), text_area);
    if total > h {
        let mut state = ScrollbarState::new(total.saturating_sub(h)).position(first);
        f.render_stateful_widget(
            Scrollbar::new(ScrollbarOrientation::VerticalRight).style(tr.ctx.theme.fg(tr.ctx.theme.dim)),
            inner,
            &mut state,
        );
    }
    PaneLayout { total, height: h }
}

fn has_loop_in(t: &Turn, phase: Phase) -> bool {
    loop_ranges(t).iter().any(|(s, e)| (*s..=*e).any(|i| t.tokens.get(i).is_some_and(|x| x.phase == phase)))
}

/// Token index ranges (inclusive) reported as degenerate loops: from where the pattern
/// started to the last token that still repeats it (the loop usually runs on after the alarm;
/// an answer that escapes it is not part of it).
pub fn loop_ranges(t: &Turn) -> Vec<(usize, usize)> {
    t.diagnostics
        .iter()
        .filter(|d| d.kind == DiagnosticKind::DegenerateLoop)
        .map(|d| {
            let start = d.start.unwrap_or(d.at_token);
            let mut end = d.at_token.max(start);
            if let Some(p) = d.period.filter(|p| *p > 0) {
                while end + 1 < t.tokens.len() && end + 1 >= p && same_token(&t.tokens[end + 1], &t.tokens[end + 1 - p])
                {
                    end += 1;
                }
            }
            (start, end)
        })
        .collect()
}

/// The same token: by id, or by text when a server sent no ids.
fn same_token(a: &TokenEvent, b: &TokenEvent) -> bool {
    match (a.id, b.id) {
        (Some(x), Some(y)) => x == y,
        _ => a.text == b.text,
    }
}

/// One phase's tokens as styled lines (colour mode, inspector cursor, loop highlight), built
/// token by token: `closed` lines ended by a newline, and the `open` one.
#[derive(Debug)]
struct LineBuilder {
    closed: Vec<Line<'static>>,
    open: Vec<Span<'static>>,
    /// Still before the first shown answer token (whose leading newlines are dropped).
    leading: bool,
}

impl LineBuilder {
    fn new(phase: Phase) -> Self {
        LineBuilder { closed: vec![], open: vec![], leading: phase == Phase::Answer }
    }

    /// Adds token `i` of the turn.
    fn push(&mut self, tr: &Transcript, i: usize, tok: &TokenEvent, loops: &[(usize, usize)]) {
        let mut text = tok.text.as_str();
        if self.leading {
            // The blank line after </think> belongs to the answer phase; do not show it.
            text = text.trim_start_matches('\n');
            if text.is_empty() && tr.inspector != Some(i) {
                return;
            }
            self.leading = false;
        }
        // `</think>` closes the pane rather than being read in it (the title says thinking
        // ended); under the inspector's cursor it shows, as the token it is.
        if text == "</think>" && tr.inspector != Some(i) {
            return;
        }
        let in_loop = loops.iter().any(|(s, e)| (*s..=*e).contains(&i));
        let style = token_style(tr.ctx.theme, tr.colour_mode, tok, in_loop, tr.inspector == Some(i));
        if text.is_empty() && tr.inspector == Some(i) {
            // Make an empty token (a stop token) visible under the cursor.
            self.open.push(Span::styled("∅", style));
            return;
        }
        let mut parts = text.split('\n').peekable();
        while let Some(part) = parts.next() {
            if !part.is_empty() {
                self.open.push(Span::styled(part.to_string(), style));
            }
            if parts.peek().is_some() {
                self.closed.push(Line::from(std::mem::take(&mut self.open)));
            }
        }
    }
}

/// What the styling of a pane's tokens depends on besides the tokens themselves.
#[derive(Debug, Clone, PartialEq)]
struct CacheKey {
    phase: Phase,
    width: usize,
    colour_mode: ColourMode,
    inspector: Option<usize>,
    /// The loop alarms (where each loop starts, its period). A loop's end only grows over new
    /// tokens, which are styled as they arrive, so it is not part of the key.
    loops: Vec<(Option<usize>, Option<usize>, usize)>,
    /// (id, arrival) of the turn's first token: another turn, or the same one re-run, differs.
    first: Option<(usize, f64)>,
}

/// A pane's wrapped token lines, kept between frames. A line ended by a newline never changes
/// while tokens stream in, so each frame styles and wraps only the new tokens and the open
/// line; anything else that changes the styling (width, colour mode, the inspector's cursor,
/// a loop alarm, another turn) starts it over.
#[derive(Debug, Default)]
pub struct PaneCache {
    key: Option<CacheKey>,
    /// Tokens of the turn (all phases) already fed, and the (id, arrival) of the last one.
    fed: usize,
    last: Option<(usize, f64)>,
    builder: Option<LineBuilder>,
    /// The closed lines, wrapped.
    wrapped: Vec<Line<'static>>,
}

impl PaneCache {
    /// Brings the cache up to `t`'s tokens; returns the open line, wrapped.
    fn update(&mut self, tr: &Transcript, t: &Turn, phase: Phase, width: usize) -> Vec<Line<'static>> {
        let stamp = |tok: &Timed<TokenEvent>| (tok.index, tok.t_ms);
        let key = CacheKey {
            phase,
            width,
            colour_mode: tr.colour_mode,
            inspector: tr.inspector,
            loops: t
                .diagnostics
                .iter()
                .filter(|d| d.kind == DiagnosticKind::DegenerateLoop)
                .map(|d| (d.start, d.period, d.at_token))
                .collect(),
            first: t.tokens.first().map(stamp),
        };
        let still_prefix =
            self.fed <= t.tokens.len() && self.last == self.fed.checked_sub(1).map(|i| stamp(&t.tokens[i]));
        if self.key.as_ref() != Some(&key) || !still_prefix || self.builder.is_none() {
            self.fed = 0;
            self.last = None;
            self.wrapped.clear();
            self.builder = Some(LineBuilder::new(phase));
        }
        let Some(b) = self.builder.as_mut() else { return vec![] };
        let loops = loop_ranges(t);
        for (i, tok) in t.tokens.iter().enumerate().skip(self.fed).filter(|(_, x)| x.phase == phase) {
            b.push(tr, i, tok, &loops);
        }
        self.wrapped.extend(wrap(&std::mem::take(&mut b.closed), width));
        self.fed = t.tokens.len();
        self.last = t.tokens.last().map(stamp);
        self.key = Some(key);
        if b.open.is_empty() { vec![] } else { wrap(&[Line::from(b.open.clone())], width) }
    }
}

pub fn token_style(th: &Theme, mode: ColourMode, tok: &TokenEvent, in_loop: bool, cursor: bool) -> Style {
    let phase_fg = if tok.phase == Phase::Thinking { th.thinking } else { th.answer };
    let mut s = match mode {
        _ if tok.forced => Style::new().fg(th.forced).add_modifier(Modifier::ITALIC),
        ColourMode::Phase => Style::new().fg(phase_fg),
        // A server sends no logprob for some tokens (llama.cpp: accepted MTP drafts).
        ColourMode::Logprob if tok.logprob.is_none() => Style::new().fg(th.dim),
        ColourMode::Logprob => {
            let p = (tok.logprob.unwrap_or(0.0) as f64).exp();
            let c = if p >= 0.9 {
                th.good
            } else if p >= 0.5 {
                th.text
            } else if p >= 0.2 {
                th.warn
            } else {
                th.bad
            };
            Style::new().fg(c)
        }
        ColourMode::Provenance => match tok.draft {
            Some(DraftKind::Accepted) => Style::new().fg(th.accepted),
            Some(DraftKind::Bonus) => Style::new().fg(th.bonus),
            Some(DraftKind::None) | None => Style::new().fg(th.dim),
        },
    };
    if in_loop {
        s = s.bg(th.loop_bg);
    }
    if cursor {
        s = s.bg(th.cursor_bg).add_modifier(Modifier::BOLD | Modifier::UNDERLINED);
    }
    s
}
