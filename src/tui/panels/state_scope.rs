//! The State panel, in one file: its state (which metric it shows, which GDN layer and value
//! head is selected, where its rows and columns start), its keys (`t`, tracing for the next
//! generation, is the app's: it changes the settings) and its drawing, from a [`DrawCtx`] and
//! what the view gathers for it ([`Shown`]): what every Gated-DeltaNet layer remembers and
//! forgets, at the token under the inspector's cursor (the latest pass when it is closed), so
//! moving either moves both.
//!
//! ```text
//! β write strength · after #37 " prime" (thinking) · pass 38 of 94
//! low ▁▂▃▄▅▆▇█ high   0 … 1   · forgets < 2 tok  ∞ keeps > 1000 tok  ✖ non-finite / exploded
//! layer heads at this token    │ mean of the heads, last 41 passes
//! ▸L0  ▃·▅·▂·▆·               │ ▃▃▄▅▅▅▄▃▃▂▂▃▄▅▅▅▄…
//! attention L3 L7 · KV 109 tokens · 81.8 KiB per layer
//! L0 head 2 · β 0.412 · g −0.1200 · keeps 88.7 %/token · half-life 5.78 tok · ‖S‖ 1.234 · …
//! β  ▃▃▃▃▅▅▅▂▂▂▂▂▆▆
//!     Is  91 prime
//! ```
//!
//! Each cell is a bar whose height and colour (the theme's `scale_0` … `scale_4`) both grow with
//! the value, so the map reads in any theme and without colour. A cell's second column marks a
//! head that forgets within two tokens (`·`), one that keeps half its memory past 1000 tokens
//! (`∞`), and a state gone non-finite or past the explosion threshold (`✖`).

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Clear, Paragraph};
use unicode_width::UnicodeWidthStr;

use crate::session::{Timed, Turn};
use crate::tui::keymap::Action;
use crate::tui::panel::{Ctx, DrawCtx, Handled, Panel};
use crate::tui::screen::Layout;
use crate::tui::theme::Theme;
use deltascope_model::{short_bytes, sig4 as sig};
use deltascope_protocol::{EXPLODED_NORM, FORGETS_WITHIN, HeadMemory, KEEPS_PAST, memory_of};
use deltascope_protocol::{GdnLayerState, Phase, StateEvent, StateMetric, TokenEvent};

#[derive(Debug, Default)]
pub struct StateScope {
    pub shown: bool,
    pub metric: StateMetric,
    /// The selected GDN layer, as an index into a pass's GDN layers (not the decoder layer).
    pub layer: usize,
    /// The selected value head.
    pub head: usize,
    /// The first layer row and head column on screen (the view keeps the selection in sight).
    pub top: usize,
    pub left: usize,
}

impl StateScope {
    /// Keeps `at` within `first..first + visible` by moving `first` as little as possible.
    pub fn follow(first: usize, at: usize, visible: usize) -> usize {
        let visible = visible.max(1);
        let mut f = first;
        if at < f {
            f = at;
        } else if at >= f + visible {
            f = at + 1 - visible;
        }
        f
    }
}

impl StateScope {
    /// A key while the State view has the focus: ↑/↓ layer, ←/→ head, m / M metric, [ / ]
    /// token, Home / End first token / latest. `cursor`: the token shown (`None`: the latest);
    /// `dims`: the shown turn's (layers, heads, tokens). `t` (tracing) is not the view's.
    fn on_key(&mut self, k: KeyEvent, cursor: &mut Option<usize>, dims: (usize, usize, usize)) -> Handled {
        let (layers, heads, tokens) = dims;
        let big = if k.modifiers.contains(KeyModifiers::SHIFT) { 8 } else { 1 };
        let last = |n: usize| n.saturating_sub(1);
        match k.code {
            KeyCode::Up => self.layer = self.layer.saturating_sub(big),
            KeyCode::Down => self.layer = (self.layer + big).min(last(layers)),
            KeyCode::Left => self.head = self.head.saturating_sub(big),
            KeyCode::Right => self.head = (self.head + big).min(last(heads)),
            KeyCode::Char('m') => self.metric = next_metric(self.metric, 1),
            KeyCode::Char('M') => self.metric = next_metric(self.metric, StateMetric::ALL.len() - 1),
            KeyCode::Char('[') | KeyCode::Char(',') => {
                let cur = cursor.unwrap_or(tokens);
                *cursor = (tokens > 0).then(|| cur.saturating_sub(1));
            }
            KeyCode::Char(']') | KeyCode::Char('.') => {
                // Past the last token the view follows the latest pass again.
                *cursor = cursor.map(|c| c + 1).filter(|&c| c < tokens);
            }
            KeyCode::Home => *cursor = (tokens > 0).then_some(0),
            KeyCode::End => *cursor = None,
            _ => return Handled::NotConsumed,
        }
        Handled::Consumed
    }

    /// PgUp / PgDn: a page of the shown turn's `layers`.
    pub fn page(&mut self, down: bool, layers: usize) {
        self.layer = if down { self.layer + 8 } else { self.layer.saturating_sub(8) };
        self.layer = self.layer.min(layers.saturating_sub(1));
    }
}

fn next_metric(m: StateMetric, step: usize) -> StateMetric {
    let all = StateMetric::ALL;
    let i = all.iter().position(|x| *x == m).unwrap_or(0);
    all[(i + step) % all.len()]
}

// Drawing.

const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
/// Columns of a layer row's label ("▸L12 ").
const LABEL: usize = 5;
/// The widest a token's column gets under the sparkline.
const TOKEN_COLS: usize = 8;

/// Where a value sits on the colour scale.
struct Scale {
    metric: StateMetric,
    /// For ‖S‖: the log10 range of the values on screen.
    lo: f32,
    hi: f32,
}

impl Scale {
    /// β and ‖ΔS‖/‖S‖ on 0 … 1, half-lives on 0.1 … 10 000 tokens (log): fixed, so colours mean
    /// the same at every token. ‖S‖ has no natural range: the values on screen set it (log).
    fn new(metric: StateMetric, on_screen: impl Iterator<Item = f32>) -> Scale {
        let (mut lo, mut hi) = (0.0, 1.0);
        if metric == StateMetric::StateNorm {
            let (l, h) = on_screen
                .filter(|v| v.is_finite() && *v > 0.0)
                .map(f32::log10)
                .fold((f32::MAX, f32::MIN), |(l, h), v| (l.min(v), h.max(v)));
            (lo, hi) = if l > h {
                (0.0, 1.0)
            } else if h - l < 1e-3 {
                (l - 0.5, h + 0.5)
            } else {
                (l, h)
            };
        }
        Scale { metric, lo, hi }
    }

    /// 0..=1, or `None` for a value that is not finite (or an exploded state).
    fn x(&self, v: f32) -> Option<f32> {
        match self.metric {
            StateMetric::HalfLife if v.is_infinite() && v > 0.0 => Some(1.0),
            StateMetric::HalfLife if v.is_finite() => Some(((v.max(1e-3).log10() + 1.0) / 5.0).clamp(0.0, 1.0)),
            StateMetric::StateNorm if v.is_finite() && v <= EXPLODED_NORM => {
                if v <= 0.0 {
                    Some(0.0)
                } else {
                    Some(((v.log10() - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0))
                }
            }
            StateMetric::Beta | StateMetric::DeltaRatio if v.is_finite() => Some(v.clamp(0.0, 1.0)),
            _ => None,
        }
    }

    fn range(&self) -> String {
        match self.metric {
            StateMetric::Beta => "0 … 1".into(),
            StateMetric::DeltaRatio => "0 … 1 (and over)".into(),
            StateMetric::HalfLife => "0.1 … 10k tok, log".into(),
            StateMetric::StateNorm => format!("{} … {}, log", sig(10f32.powf(self.lo)), sig(10f32.powf(self.hi))),
        }
    }
}

/// A bar for `x` (`None`: ✖), coloured on the theme's scale.
fn bar(th: &Theme, x: Option<f32>) -> (char, Style) {
    match x {
        None => ('✖', Style::new().fg(th.bad).add_modifier(Modifier::BOLD)),
        Some(x) => {
            let level = ((x * BARS.len() as f32) as usize).min(BARS.len() - 1);
            let colour = ((x * th.scale.len() as f32) as usize).min(th.scale.len() - 1);
            (BARS[level], Style::new().fg(th.scale[colour]))
        }
    }
}

/// A head's mark: forgets fast, keeps long, or broken.
fn mark(th: &Theme, l: &GdnLayerState, h: usize) -> (char, Style) {
    if l.nonfinite[h] > 0 || !l.state_norm[h].is_finite() || l.state_norm[h] > EXPLODED_NORM {
        return ('✖', Style::new().fg(th.bad).add_modifier(Modifier::BOLD));
    }
    match memory_of(l.half_life(h)) {
        HeadMemory::Forgets => ('·', th.fg(th.dim)),
        HeadMemory::Keeps => ('∞', th.fg(th.accent)),
        HeadMemory::Between => (' ', Style::new()),
    }
}

/// A token as one short line: newlines and tabs made visible, cut to [`TOKEN_COLS`].
fn token_label(t: &TokenEvent) -> String {
    let mut s: String = t
        .text
        .chars()
        .map(|c| match c {
            '\n' => '⏎',
            '\t' => '→',
            c if c.is_control() => '·',
            c => c,
        })
        .collect();
    if s.is_empty() {
        s = "∅".into();
    }
    if s.width() > TOKEN_COLS {
        let mut cut = String::new();
        for c in s.chars() {
            if cut.width() + c.to_string().width() >= TOKEN_COLS {
                break;
            }
            cut.push(c);
        }
        s = cut + "…";
    }
    s
}

/// What the State view shows besides its own state, gathered by the view from the app.
#[derive(Clone, Copy)]
pub struct Shown<'a> {
    /// The turn the panes show.
    pub turn: Option<&'a Turn>,
    /// The token under the inspector's cursor (`None`: the latest pass).
    pub cursor: Option<usize>,
    /// The view has the focus (its keys are in the title).
    pub focused: bool,
    /// A generation is running (with no cursor the view follows its latest pass).
    pub generating: bool,
    /// Why the backend has no state trace, where it has none.
    pub unavailable: Option<&'a str>,
    /// Tracing is on for the next generation.
    pub tracing: bool,
}

impl StateScope {
    /// Draws the view in `area`; where its rows and columns start goes into `layout`.
    fn draw_view(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, s: &Shown, layout: &mut Layout) {
        let th = ctx.theme;
        let focused = s.focused;
        let title = if focused {
            " State · ↑↓ layer ←→ head m metric [ ] token End latest t trace Esc close ".to_string()
        } else {
            format!(" State · {} closes · Tab to focus ", ctx.keymap.first(Action::StateView))
        };
        let block = Block::bordered().title(Line::styled(title, th.title())).border_style(th.border(focused));
        let inner = block.inner(area);
        f.render_widget(Clear, area);
        f.render_widget(block, area);
        let lines = match s.turn {
            Some(t) if !t.states.is_empty() => scope_lines(self, ctx, s, t, inner, layout),
            _ => empty_lines(ctx, s),
        };
        f.render_widget(Paragraph::new(lines), inner);
    }
}

/// Why there is nothing to show, and what to press.
fn empty_lines(ctx: &DrawCtx, s: &Shown) -> Vec<Line<'static>> {
    let th = ctx.theme;
    let key = |a| ctx.keymap.first(a);
    let mut out = vec![Line::raw("")];
    let say = |s: String| Line::styled(format!("  {s}"), th.fg(th.text));
    if let Some(why) = s.unavailable {
        out.push(say("The state scope needs the in-process engine:".into()));
        out.push(say(why.to_string()));
        return out;
    }
    out.push(say("No state trace for this turn.".into()));
    if s.tracing {
        out.push(say(format!(
            "Tracing is on: the next generation is traced ({} re-runs the last turn).",
            key(Action::Regenerate)
        )));
    } else {
        out.push(say(format!(
            "{} (or t here) traces the next generation; {} then re-runs the last turn with it.",
            key(Action::TraceState),
            key(Action::Regenerate)
        )));
    }
    if s.turn.is_some_and(|t| !t.is_finished()) && s.generating {
        out.push(say("This turn was started without the trace.".into()));
    }
    out.push(Line::raw(""));
    out.push(Line::styled(
        "  Per GDN layer and value head: write strength β, half-life, ‖S‖ and ‖ΔS‖/‖S‖ after every token.",
        th.fg(th.dim),
    ));
    out
}

/// Which parts fit: rows for the layers first, then the head's history, then the rest.
struct Parts {
    legend: bool,
    columns: bool,
    attention: bool,
    history: bool,
    layer_rows: usize,
}

impl Parts {
    fn fit(height: usize, layers: usize, has_attention: bool) -> Parts {
        let mut p = Parts { legend: true, columns: true, attention: has_attention, history: true, layer_rows: 0 };
        let want = layers.clamp(1, 3);
        // Header and the selected head's lines always; then drop the least useful part first.
        loop {
            let fixed = 3 + p.legend as usize + p.columns as usize + p.attention as usize + 2 * p.history as usize;
            p.layer_rows = height.saturating_sub(fixed).min(layers);
            if p.layer_rows >= want {
                return p;
            }
            if p.columns {
                p.columns = false;
            } else if p.attention {
                p.attention = false;
            } else if p.legend {
                p.legend = false;
            } else if p.history {
                p.history = false;
            } else {
                return p;
            }
        }
    }
}

fn scope_lines(
    scope: &StateScope,
    ctx: &DrawCtx,
    s: &Shown,
    t: &Turn,
    area: Rect,
    layout: &mut Layout,
) -> Vec<Line<'static>> {
    let th = ctx.theme;
    let cursor = s.cursor;
    let Some((pass_idx, pass)) = t.state_at(cursor) else { return vec![] };
    let width = area.width as usize;
    let layers = pass.gdn.len();
    let heads = pass.gdn.iter().map(|l| l.beta.len()).max().unwrap_or(0);
    if layers == 0 || heads == 0 {
        return vec![Line::styled("  This model has no GDN layers: nothing to trace.", th.fg(th.text))];
    }
    let (sel_layer, sel_head) = (scope.layer.min(layers - 1), scope.head.min(heads - 1));
    let metric = scope.metric;
    let parts = Parts::fit(area.height as usize, layers, !pass.attention.is_empty());
    let cols = Columns::fit(width, heads, scope.left, sel_head);
    layout.state_left = Some(cols.left);
    let first_pass = (pass_idx + 1).saturating_sub(cols.strip);
    let passes = &t.states[first_pass..=pass_idx];
    let top = StateScope::follow(scope.top, sel_layer, parts.layer_rows);
    layout.state_top = Some(top);
    let scale = scale_on_screen(metric, pass, passes);

    let mut out = vec![header(th, metric, s.generating, t, pass, pass_idx, cursor)];
    if parts.legend {
        out.push(legend(th, &scale, cols.cell == 1));
    }
    if parts.columns {
        out.push(columns_heading(th, heads, &cols, passes.len()));
    }
    let map = HeatMap { th, metric, scale: &scale, cols: &cols, passes, sel_layer, sel_head };
    for (li, l) in pass.gdn.iter().enumerate().skip(top).take(parts.layer_rows) {
        out.push(map.layer_row(li, l));
    }
    if parts.attention {
        out.push(attention_line(th, pass));
    }
    out.extend(head_lines(th, &pass.gdn[sel_layer], sel_head));
    if parts.history {
        // Rows left over show the selected layer's other heads over the same tokens.
        let spare = (area.height as usize).saturating_sub(out.len() + 2);
        let rows = (1 + spare).min(heads);
        let first = sel_head.saturating_sub(rows / 2).min(heads - rows);
        let shown: Vec<usize> = (first..first + rows).collect();
        out.extend(history(th, metric, t, &scale, sel_layer, &shown, sel_head, cursor, width));
    }
    out
}

/// How the width is shared: the heat map (up to four columns a head, the last one the head's
/// mark, within two fifths of the width), then the strip of passes in the rest (at least 12
/// columns).
struct Columns {
    /// Columns a head takes.
    cell: usize,
    /// The first head on screen.
    left: usize,
    /// How many heads are on screen.
    shown_heads: usize,
    /// Columns of the strip of passes, one a pass (0: no strip).
    strip: usize,
}

impl Columns {
    /// The columns for `heads` in `width`, moving the first head shown from `left` as little as
    /// keeps `selected` in sight.
    fn fit(width: usize, heads: usize, left: usize, selected: usize) -> Columns {
        let room = width.saturating_sub(LABEL + 3);
        let for_heads = room.saturating_sub(12).max(1);
        let cell = (room * 2 / 5 / heads).clamp(1, 4).min((for_heads / heads).max(1));
        let shown_heads = heads.min((for_heads / cell).max(1));
        let left = StateScope::follow(left, selected, shown_heads);
        let strip = width.saturating_sub(LABEL + shown_heads * cell + 3);
        Columns { cell, left, shown_heads, strip }
    }
}

/// The scale for every value on screen: the heads at this pass and those of the strip's passes.
fn scale_on_screen(metric: StateMetric, pass: &StateEvent, passes: &[Timed<StateEvent>]) -> Scale {
    let on_screen =
        pass.gdn.iter().flat_map(|l| (0..l.beta.len()).map(|h| metric.value(l, h))).chain(
            passes.iter().flat_map(|p| p.ev.gdn.iter().flat_map(|l| (0..l.beta.len()).map(|h| metric.value(l, h)))),
        );
    Scale::new(metric, on_screen)
}

/// The headings over the heat map and the strip of `passes` passes.
fn columns_heading(th: &Theme, heads: usize, cols: &Columns, passes: usize) -> Line<'static> {
    let heads_label = if cols.shown_heads < heads {
        format!("heads {}–{} of {heads}", cols.left, cols.left + cols.shown_heads - 1)
    } else {
        format!("{heads} heads")
    };
    let heat = format!("layer {heads_label} at this pass");
    let heat_w = LABEL + cols.shown_heads * cols.cell;
    let mut line = format!("{heat:<heat_w$}");
    if cols.strip > 0 {
        line.push_str(&format!(" │ mean of the heads, last {passes} passes"));
    }
    Line::styled(line, th.fg(th.dim))
}

/// What the layer rows are drawn from: the heat map of the heads at this pass, and the strip
/// of the mean of the heads over the passes before it.
struct HeatMap<'a> {
    th: &'a Theme,
    metric: StateMetric,
    scale: &'a Scale,
    cols: &'a Columns,
    /// The strip's passes, the one in view last.
    passes: &'a [Timed<StateEvent>],
    sel_layer: usize,
    sel_head: usize,
}

impl HeatMap<'_> {
    /// Layer `li`'s row: its label, its heads on screen, then its strip.
    fn layer_row(&self, li: usize, l: &GdnLayerState) -> Line<'static> {
        let th = self.th;
        let selected = li == self.sel_layer;
        let label_style = if selected { th.fg(th.accent).add_modifier(Modifier::BOLD) } else { th.fg(th.dim) };
        let mut spans = vec![Span::styled(
            format!("{}{:<width$}", if selected { '▸' } else { ' ' }, format!("L{}", l.layer), width = LABEL - 1),
            label_style,
        )];
        let Columns { left, shown_heads, strip, .. } = *self.cols;
        for h in left..(left + shown_heads).min(l.beta.len()) {
            spans.extend(self.head_cell(l, h, selected && h == self.sel_head));
        }
        if strip > 0 {
            spans.extend(self.strip(li, l));
        }
        Line::from(spans)
    }

    /// Head `h`'s cell: its bar, then its mark where the cell has room for one.
    fn head_cell(&self, l: &GdnLayerState, h: usize, selected: bool) -> Vec<Span<'static>> {
        let (th, cell) = (self.th, self.cols.cell);
        let (mut g, mut style) = bar(th, self.scale.x(self.metric.value(l, h)));
        let (m, m_style) = mark(th, l, h);
        // One column a head: a broken head shows its ✖, the memory marks become styles.
        if cell == 1 {
            match m {
                '✖' => (g, style) = (m, m_style),
                '·' => style = style.add_modifier(Modifier::DIM),
                '∞' => style = style.add_modifier(Modifier::UNDERLINED),
                _ => {}
            }
        }
        if selected {
            style = style.add_modifier(Modifier::REVERSED);
        }
        let mut spans = vec![Span::styled(g.to_string().repeat(cell.max(2) - 1), style)];
        if cell >= 2 {
            spans.push(Span::styled(m.to_string(), m_style));
        }
        spans
    }

    /// Layer `li`'s strip, after room for the heads it lacks: the mean of its heads at each pass.
    fn strip(&self, li: usize, l: &GdnLayerState) -> Vec<Span<'static>> {
        let Columns { cell, left, shown_heads, .. } = *self.cols;
        let pad = (shown_heads.saturating_sub(l.beta.len().saturating_sub(left))) * cell;
        let mut spans = vec![Span::raw(format!("{} │ ", " ".repeat(pad)))];
        for p in self.passes {
            let (g, style) = match p.ev.gdn.get(li) {
                Some(pl) => bar(self.th, mean_x(self.scale, self.metric, pl)),
                None => (' ', Style::new()),
            };
            spans.push(Span::styled(g.to_string(), style));
        }
        spans
    }
}

/// The mean of a layer's heads on the scale (`None` when any head is broken).
fn mean_x(scale: &Scale, metric: StateMetric, l: &GdnLayerState) -> Option<f32> {
    let xs: Option<Vec<f32>> = (0..l.beta.len()).map(|h| scale.x(metric.value(l, h))).collect();
    let xs = xs?;
    Some(xs.iter().sum::<f32>() / xs.len().max(1) as f32)
}

/// The metric, the token the view is at, and which pass of how many (` · live` while it
/// follows a running generation).
fn header(
    th: &Theme,
    metric: StateMetric,
    generating: bool,
    t: &Turn,
    pass: &StateEvent,
    pass_idx: usize,
    cursor: Option<usize>,
) -> Line<'static> {
    let token = |i: usize| {
        t.tokens.get(i).map(|tok| {
            let phase = if tok.phase == Phase::Thinking { "thinking" } else { "answer" };
            format!("#{i} {:?} ({phase})", tok.text)
        })
    };
    let at = match (pass.at_token, cursor) {
        (None, _) => "after the prompt".to_string(),
        // The last token sampled is not read until the next one is asked for.
        (Some(a), Some(c)) if c > a + pass.tokens.saturating_sub(1) => {
            format!("#{c} not read yet: after {}", token(a).unwrap_or_else(|| format!("#{a}")))
        }
        (Some(a), _) if pass.tokens > 1 => format!("after #{a}…#{} (one pass)", a + pass.tokens - 1),
        (Some(a), _) => format!("after {}", token(a).unwrap_or_else(|| format!("#{a}"))),
    };
    let follow = if cursor.is_none() && generating { " · live" } else { "" };
    Line::from(vec![
        Span::styled(metric.label().to_string(), th.fg(th.accent).add_modifier(Modifier::BOLD)),
        Span::styled(format!(" · {at} · pass {} of {}{follow}", pass_idx + 1, t.states.len()), th.fg(th.text)),
    ])
}

fn legend(th: &Theme, scale: &Scale, narrow: bool) -> Line<'static> {
    let mut spans = vec![Span::styled("low ", th.fg(th.dim))];
    for i in 0..BARS.len() {
        let (g, style) = bar(th, Some((i as f32 + 0.5) / BARS.len() as f32));
        spans.push(Span::styled(g.to_string(), style));
    }
    spans.push(Span::styled(format!(" high {} │ ", scale.range()), th.fg(th.dim)));
    if narrow {
        // A column a head: the marks are styles of the bar itself.
        spans.push(Span::styled("dim", th.fg(th.dim).add_modifier(Modifier::DIM)));
        spans.push(Span::styled(format!(" forgets<{FORGETS_WITHIN} "), th.fg(th.dim)));
        spans.push(Span::styled("underlined", th.fg(th.dim).add_modifier(Modifier::UNDERLINED)));
        spans.push(Span::styled(format!(" keeps>{KEEPS_PAST} "), th.fg(th.dim)));
    } else {
        spans.push(Span::styled("·", th.fg(th.dim)));
        spans.push(Span::styled(format!("forgets<{FORGETS_WITHIN} "), th.fg(th.dim)));
        spans.push(Span::styled("∞", th.fg(th.accent)));
        spans.push(Span::styled(format!("keeps>{KEEPS_PAST} "), th.fg(th.dim)));
    }
    spans.push(Span::styled("✖", Style::new().fg(th.bad).add_modifier(Modifier::BOLD)));
    spans.push(Span::styled("broken", th.fg(th.dim)));
    Line::from(spans)
}

fn attention_line(th: &Theme, pass: &StateEvent) -> Line<'static> {
    let mut names: Vec<String> = pass.attention.iter().map(|a| format!("L{}", a.layer)).collect();
    if names.len() > 4 {
        names = vec![format!("×{} ({} … {})", names.len(), names[0], names[names.len() - 1])];
    }
    let kv = pass.attention.first().map(|a| (a.kv_len, a.kv_bytes)).unwrap_or((0, 0));
    Line::styled(
        format!("attention {}: KV {} tokens, {} per layer", names.join(" "), kv.0, short_bytes(kv.1 as u64)),
        th.fg(th.dim),
    )
}

/// Every metric of the selected head at this pass, on two lines.
fn head_lines(th: &Theme, l: &GdnLayerState, h: usize) -> [Line<'static>; 2] {
    let hl = l.half_life(h);
    let memory = match memory_of(hl) {
        HeadMemory::Forgets => format!(" · forgets within {FORGETS_WITHIN} tokens"),
        HeadMemory::Keeps => format!(" · keeps half past {KEEPS_PAST} tokens"),
        HeadMemory::Between => String::new(),
    };
    let health = if l.nonfinite[h] > 0 {
        format!("{} non-finite entries", l.nonfinite[h])
    } else if l.state_norm[h] > EXPLODED_NORM {
        format!("exploded (‖S‖ over {EXPLODED_NORM:.0e})")
    } else {
        "finite".into()
    };
    let bad = l.nonfinite[h] > 0 || !l.state_norm[h].is_finite() || l.state_norm[h] > EXPLODED_NORM;
    [
        Line::from(vec![
            Span::styled(format!("L{} head {h}", l.layer), th.fg(th.accent).add_modifier(Modifier::BOLD)),
            Span::styled(
                format!(
                    " · β {} · g {} · keeps {} %/token · half-life {} tok",
                    sig(l.beta[h]),
                    sig(l.g[h]),
                    sig(l.retention[h] * 100.0),
                    sig(hl),
                ),
                th.fg(th.text),
            ),
        ]),
        Line::from(vec![
            Span::styled(
                format!("  ‖S‖ {} · ‖ΔS‖/‖S‖ {} · ", sig(l.state_norm[h]), sig(l.delta_ratio[h])),
                th.fg(th.text),
            ),
            Span::styled(
                health,
                if bad { Style::new().fg(th.bad).add_modifier(Modifier::BOLD) } else { th.fg(th.good) },
            ),
            Span::styled(memory, th.fg(th.text)),
        ]),
    ]
}

/// Heads of the selected layer (the selected one marked) over the tokens around the cursor, a
/// row each, every bar as wide as the token under it.
#[allow(clippy::too_many_arguments)]
fn history(
    th: &Theme,
    metric: StateMetric,
    t: &Turn,
    scale: &Scale,
    layer: usize,
    heads: &[usize],
    selected: usize,
    cursor: Option<usize>,
    width: usize,
) -> Vec<Line<'static>> {
    const PREFIX: usize = 6;
    let room = width.saturating_sub(PREFIX);
    // The tokens read so far (the last one sampled is read by the next pass).
    let read = t.states.last().and_then(|s| s.ev.at_token.map(|a| a + s.ev.tokens)).unwrap_or(0);
    let at = cursor.unwrap_or(read.saturating_sub(1)).min(t.tokens.len().saturating_sub(1));
    let labels: Vec<String> = t.tokens.iter().map(|x| token_label(&x.ev)).collect();
    let cols = |i: usize| labels[i].width() + 1;
    // A window around the cursor: up to two thirds of the room before it, the rest after.
    let (mut from, mut to) = (at, at + 1);
    let mut used = if t.tokens.is_empty() { 0 } else { cols(at) };
    while from > 0 && used + cols(from - 1) <= room * 2 / 3 {
        from -= 1;
        used += cols(from);
    }
    while to < t.tokens.len() && used + cols(to) <= room {
        used += cols(to);
        to += 1;
    }
    while from > 0 && used + cols(from - 1) <= room {
        from -= 1;
        used += cols(from);
    }
    let tokens = from..to.min(t.tokens.len());
    // The pass that read each token (none for the last one sampled, not read yet).
    let passes: Vec<Option<&StateEvent>> = tokens
        .clone()
        .map(|i| t.state_at(Some(i)).map(|(_, p)| p).filter(|p| p.at_token.is_some_and(|a| a <= i) && i < read))
        .collect();
    let mut out = vec![];
    for &head in heads {
        let label_style = if head == selected { th.fg(th.accent).add_modifier(Modifier::BOLD) } else { th.fg(th.dim) };
        let marker = if head == selected { '▸' } else { ' ' };
        let mut bars = vec![Span::styled(format!("{marker}{:<w$}", format!("h{head}"), w = PREFIX - 1), label_style)];
        for (i, pass) in tokens.clone().zip(&passes) {
            let x = pass.and_then(|p| {
                let l = p.gdn.get(layer)?;
                (head < l.beta.len()).then(|| scale.x(metric.value(l, head)))
            });
            let (g, mut style) = match x {
                Some(x) => bar(th, x),
                None => (' ', Style::new()),
            };
            if i == at {
                style = style.add_modifier(Modifier::BOLD);
            }
            bars.push(Span::styled(g.to_string().repeat(labels[i].width()), style));
            bars.push(Span::raw(" "));
        }
        out.push(Line::from(bars));
    }
    let mut texts = vec![Span::raw(" ".repeat(PREFIX))];
    for i in tokens {
        let style = if i == at { th.fg(th.text).add_modifier(Modifier::REVERSED) } else { th.fg(th.text) };
        texts.push(Span::styled(labels[i].clone(), style));
        texts.push(Span::raw(" "));
    }
    out.push(Line::from(texts));
    out
}

/// What a key in the State view moves besides the view: the inspector's token (`None`: the
/// latest), within the shown turn's (layers, heads, tokens).
pub struct StateKeys<'a> {
    pub cursor: &'a mut Option<usize>,
    pub dims: (usize, usize, usize),
}

impl Panel for StateScope {
    type Shown<'a> = Shown<'a>;
    type Keyed<'a> = StateKeys<'a>;

    fn key(&mut self, k: KeyEvent, with: StateKeys<'_>, _: &mut Ctx) -> Handled {
        self.on_key(k, with.cursor, with.dims)
    }

    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, shown: Shown<'_>, out: &mut Layout) {
        self.draw_view(f, area, ctx, &shown, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_and_numbers() {
        let beta = Scale::new(StateMetric::Beta, [].into_iter());
        assert_eq!(beta.x(0.25), Some(0.25));
        assert_eq!(beta.x(f32::NAN), None);
        let hl = Scale::new(StateMetric::HalfLife, [].into_iter());
        assert_eq!(hl.x(f32::INFINITY), Some(1.0));
        assert!((hl.x(10.0).unwrap() - 0.4).abs() < 1e-6);
        let norm = Scale::new(StateMetric::StateNorm, [0.1, 10.0, f32::NAN].into_iter());
        assert_eq!((norm.lo, norm.hi), (-1.0, 1.0));
        assert_eq!(norm.x(1.0), Some(0.5));
        assert_eq!(norm.x(2e4), None, "an exploded state is marked, not coloured");
        let th = Theme::default();
        assert_eq!(bar(&th, Some(0.0)).0, '▁');
        assert_eq!(bar(&th, Some(1.0)).0, '█');
        assert_eq!(bar(&th, None).0, '✖');
    }

    #[test]
    fn parts_give_way_to_the_layer_rows() {
        let p = Parts::fit(20, 6, true);
        assert!(p.legend && p.columns && p.attention && p.history && p.layer_rows == 6);
        let p = Parts::fit(9, 48, true);
        assert_eq!(p.layer_rows, 3);
        assert!(!p.columns && !p.attention && p.legend && p.history);
    }

    #[test]
    fn follow_moves_the_window_as_little_as_possible() {
        assert_eq!(StateScope::follow(0, 3, 5), 0);
        assert_eq!(StateScope::follow(0, 7, 5), 3);
        assert_eq!(StateScope::follow(3, 5, 5), 3);
        assert_eq!(StateScope::follow(3, 1, 5), 1);
        assert_eq!(next_metric(StateMetric::DeltaRatio, 1), StateMetric::Beta);
        assert_eq!(next_metric(StateMetric::Beta, 3), StateMetric::DeltaRatio);
    }
}
