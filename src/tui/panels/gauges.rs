//! Live gauges: the stacked token budget (prompt | thinking | answer | headroom of max_tokens,
//! with the thinking-budget marker; "≈" and the reason where a server only estimates the forced
//! tokens), speed (tok/s sparkline, TTFT, prefill tok/s), MTP
//! (acceptance, per-position bars, mean accepted length, accepted-per-step sparkline) and
//! memory (weights, KV growing, recurrent constant, snapshots) per device.

use ratatui::Frame;
use ratatui::buffer::Buffer;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Sparkline, Widget};

use ratatui::crossterm::event::KeyEvent;

use crate::backend::BackendInfo;
use crate::session::Turn;
use crate::tui::panel::{Ctx, DrawCtx, Handled, Panel};
use crate::tui::screen::Layout as Laid;
use crate::tui::theme::Theme;
use crate::tui::wrap::wrap;
use deltascope_model::{duration_ms, short_bytes};
use unicode_width::UnicodeWidthStr;

pub const MIN_HEIGHT: u16 = 18;

/// What the gauges show, gathered by the view from the app.
#[derive(Clone, Copy)]
pub struct Readings<'a> {
    /// The turn the panes show.
    pub turn: Option<&'a Turn>,
    /// The open backend (weights, devices, whether it drafts, whether it is a server).
    pub model: Option<&'a BackendInfo>,
    /// The model's context, when known.
    pub context: Option<usize>,
    /// Tokens the conversation takes before the next prompt (≈).
    pub history: usize,
}

/// One stacked bar: segments of (cells, style), plus an optional marker column.
pub struct BudgetBar {
    pub prompt: usize,
    pub thinking: usize,
    /// Forced by the thinking budget (bridge, `</think>`), between the two.
    pub forced: usize,
    pub answer: usize,
    pub max_tokens: usize,
    /// Thinking budget (tokens after the prompt), drawn as a marker.
    pub budget: Option<usize>,
    /// Where a rescued loop began (generated tokens), drawn as `↻`: the forced segment after
    /// it is the rescue's, not the budget's.
    pub rescued_from: Option<usize>,
    /// prompt, thinking, forced, answer, headroom.
    pub colors: [Color; 5],
    pub marker: Color,
}

impl BudgetBar {
    pub fn new(t: &Turn, th: &Theme) -> BudgetBar {
        BudgetBar {
            prompt: t.prompt_tokens,
            thinking: t.thinking_tokens(),
            forced: t.forced_tokens(),
            answer: t.answer_tokens(),
            max_tokens: t.params.max_tokens,
            budget: t.params.thinking.budget(),
            rescued_from: rescued_loop(t),
            colors: [th.prompt, th.thinking, th.forced, th.answer, th.headroom],
            marker: th.budget_marker,
        }
    }
}

impl Widget for BudgetBar {
    fn render(self, area: Rect, buf: &mut Buffer) {
        if area.width == 0 || area.height == 0 {
            return;
        }
        let total = (self.prompt + self.max_tokens).max(1) as f64;
        let w = area.width as f64;
        // Cumulative boundaries in cells; every non-empty segment gets at least one cell.
        let generated = self.thinking + self.forced + self.answer;
        let counts = [self.prompt, self.thinking, self.forced, self.answer, self.max_tokens.saturating_sub(generated)];
        let mut bounds = [0u16; 5];
        let mut acc = 0usize;
        let mut prev = 0u16;
        for (i, c) in counts.iter().enumerate() {
            acc += c;
            let mut b = ((acc as f64 / total) * w).round() as u16;
            if *c > 0 && b <= prev && prev < area.width {
                b = prev + 1;
            }
            bounds[i] = b.min(area.width);
            prev = bounds[i];
        }
        bounds[4] = area.width;
        let glyphs = ['▒', '█', '▓', '█', '░'];
        for x in 0..area.width {
            let seg = bounds.iter().position(|b| x < *b).unwrap_or(4);
            for y in area.top()..area.bottom() {
                if let Some(cell) = buf.cell_mut((area.x + x, y)) {
                    cell.set_char(glyphs[seg]).set_style(Style::new().fg(self.colors[seg]));
                }
            }
        }
        // Markers: where a rescued loop began (↻) and the thinking budget (┃), tokens after the prompt.
        let marks = [(self.rescued_from, '↻'), (self.budget, '┃')];
        for (at, glyph) in marks.into_iter().filter_map(|(at, g)| at.map(|a| (a, g))) {
            let x = (((self.prompt + at) as f64 / total) * w).round() as u16;
            if x < area.width {
                for y in area.top()..area.bottom() {
                    if let Some(cell) = buf.cell_mut((area.x + x, y)) {
                        cell.set_char(glyph).set_style(Style::new().fg(self.marker).add_modifier(Modifier::BOLD));
                    }
                }
            }
        }
    }
}

/// Where the loop a rescue ended began (the `loop_rescued` diagnostic's start, else where the
/// rescue forced the end of thinking).
fn rescued_loop(t: &Turn) -> Option<usize> {
    let d = t.diagnostics.iter().find(|d| d.kind == deltascope_protocol::DiagnosticKind::LoopRescued)?;
    Some(d.start.unwrap_or(d.at_token))
}

/// A one-line horizontal bar of `ratio` in `width` cells.
fn bar(ratio: f64, width: usize, color: Color, empty: Color) -> Vec<Span<'static>> {
    let r = ratio.clamp(0.0, 1.0);
    let full = (r * width as f64).round() as usize;
    vec![
        Span::styled("█".repeat(full), Style::new().fg(color)),
        Span::styled("░".repeat(width.saturating_sub(full)), Style::new().fg(empty)),
    ]
}

fn panel(f: &mut Frame, area: Rect, ctx: &DrawCtx, g: &Readings) {
    let th = ctx.theme;
    let block = Block::bordered().title(Line::styled(" Gauges ", th.title())).border_style(th.border(false));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let Some(t) = g.turn else {
        let mut lines = vec![Line::styled("no generation yet", th.fg(th.dim))];
        if let Some(w) = g.model.and_then(|m| m.weights_bytes) {
            lines.push(Line::styled(format!("weights {}", short_bytes(w as u64)), th.fg(th.text)));
        }
        f.render_widget(Paragraph::new(lines), inner);
        return;
    };
    // An estimated forced count takes the rows that say why (the other sections give way).
    let why = estimate_rows(t, ctx.theme, inner.width);
    let budget_h = 5 + why.len() as u16 + u16::from(rescued_loop(t).is_some());
    let [budget, speed, mtp, memory] = Layout::vertical([
        Constraint::Length(budget_h),
        Constraint::Length(4),
        Constraint::Length(6),
        Constraint::Min(5),
    ])
    .areas(inner);
    budget_section(g, ctx, t, f, budget, why);
    speed_section(ctx, t, f, speed);
    mtp_section(g, ctx, t, f, mtp);
    memory_section(g, ctx, t, f, memory);
}

/// The most rows the reason for an estimated forced count takes in the gauge column.
const ESTIMATE_ROWS: usize = 3;

/// Why the forced count is an estimate, wrapped to `width`: the budget section's extra rows
/// (none when the count is exact). A reason longer than [`ESTIMATE_ROWS`] ends in "…".
fn estimate_rows(t: &Turn, th: &Theme, width: u16) -> Vec<Line<'static>> {
    let Some(why) = t.forced_estimate() else { return vec![] };
    let line =
        Line::from(vec![Span::styled("≈forced: ", th.fg(th.forced)), Span::styled(why.to_string(), th.fg(th.dim))]);
    let mut rows = wrap(&[line], width as usize);
    if rows.len() > ESTIMATE_ROWS {
        rows.truncate(ESTIMATE_ROWS);
        if let Some(last) = rows.last_mut() {
            // Room for the ellipsis: the row's last characters give way when it is full.
            let mut kept: String = last.spans.iter().map(|s| s.content.as_ref()).collect();
            kept.truncate(kept.trim_end().len());
            while !kept.is_empty() && kept.width() + 1 > width as usize {
                kept.pop();
            }
            *last = Line::styled(format!("{kept}…"), th.fg(th.dim));
        }
    }
    rows
}

fn budget_section(g: &Readings, ctx: &DrawCtx, t: &Turn, f: &mut Frame, area: Rect, why: Vec<Line<'static>>) {
    let th = ctx.theme;
    let [h, b, legend] =
        Layout::vertical([Constraint::Length(1), Constraint::Length(1), Constraint::Min(1)]).areas(area);
    let used = t.completion_tokens();
    f.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled("Token budget ", Style::new().fg(th.accent).add_modifier(Modifier::BOLD)),
            Span::styled(format!("{used}/{} max_tokens", t.params.max_tokens), th.fg(th.text)),
        ])),
        h,
    );
    f.render_widget(BudgetBar::new(t, th), b);
    let budget = t.params.thinking.to_string();
    // "≈": a server that reports no reasoning count, counted one per streamed frame.
    let approx = if t.counted().is_estimate() { "≈" } else { "" };
    // "≈" on the forced count: a server that does not say which tokens its budget forced.
    let forced_approx = if t.forced_estimate().is_some() { "≈" } else { "" };
    // "≈" on the prompt: the stream was closed before the server's usage frame said it.
    let prompt_approx = if t.prompt_estimate().is_some() { "≈" } else { "" };
    let mut legend_line = vec![Line::from(vec![
        Span::styled("▒", th.fg(th.prompt)),
        Span::styled(format!("prompt {prompt_approx}{} ", t.prompt_tokens), th.fg(th.text)),
        Span::styled("█", th.fg(th.thinking)),
        Span::styled(format!("think {approx}{} ", t.thinking_tokens()), th.fg(th.text)),
        Span::styled("▓", th.fg(th.forced)),
        Span::styled(format!("forced {forced_approx}{}", t.forced_tokens()), th.fg(th.text)),
    ])];
    if let Some(from) = rescued_loop(t) {
        legend_line.push(Line::from(vec![
            Span::styled("↻", th.fg(th.budget_marker).add_modifier(Modifier::BOLD)),
            Span::styled(format!("loop from token {from} rescued: thinking ended by force"), th.fg(th.text)),
        ]));
    }
    legend_line.extend([Line::from(vec![
        Span::styled("█", th.fg(th.answer)),
        Span::styled(format!("answer {approx}{} ", t.answer_tokens()), th.fg(th.text)),
        Span::styled("░", th.fg(th.headroom)),
        Span::styled(format!("free {} ", t.params.max_tokens.saturating_sub(used)), th.fg(th.text)),
        Span::styled("┃", th.fg(th.budget_marker)),
        Span::styled(format!("budget {budget}"), th.fg(th.text)),
    ])]);
    legend_line.extend(why);
    legend_line.push(Line::styled(context_in_use(g), th.fg(th.dim)));
    f.render_widget(Paragraph::new(legend_line), legend);
}

/// How much of the context the conversation takes before the next prompt (≈: the last
/// answered turn's prompt and answer; the template drops earlier thinking).
fn context_in_use(g: &Readings) -> String {
    let history = g.history;
    match g.context {
        Some(c) => format!("history ≈{history} of {c} context tokens"),
        None => format!("history ≈{history} tokens before the next prompt"),
    }
}

/// TTFT and prefill speed: from `done`, or measured from the first token while streaming.
/// `None` where there is nothing honest to show: no token yet, no start time, or a prompt that
/// was never read through (prefill 0).
fn ttft(t: &Turn) -> Option<(f64, Option<f64>)> {
    if let Some(tm) = &t.stats.timing {
        if t.tokens.is_empty() {
            return None;
        }
        return Some((tm.ttft_ms?, (tm.prefill_tok_s > 0.0).then_some(tm.prefill_tok_s)));
    }
    let first = t.tokens.first()?.t_ms;
    let start = t.stats.start_ms?;
    // Times from another generation (a cancel and a regenerate) would make an absurd rate.
    if first <= start {
        return None;
    }
    let ms = first - start;
    Some((ms, Some(t.prompt_tokens as f64 / (ms / 1000.0))))
}

fn speed_section(ctx: &DrawCtx, t: &Turn, f: &mut Frame, area: Rect) {
    let th = ctx.theme;
    let [h, l, s] = Layout::vertical([Constraint::Length(1), Constraint::Length(1), Constraint::Min(1)]).areas(area);
    let tok_s = t
        .stats
        .timing
        .as_ref()
        .map(|tm| tm.decode_tok_s)
        .or_else(|| t.stats.samples.last().map(|s| s.tok_s))
        .filter(|v| *v > 0.0 && t.tokens.len() > 1);
    let speed = tok_s.map_or("—".to_string(), |v| format!("{v:.1} tok/s"));
    f.render_widget(
        Paragraph::new(Line::from(vec![
            Span::styled("Speed ", Style::new().fg(th.accent).add_modifier(Modifier::BOLD)),
            Span::styled(speed, th.fg(th.text)),
        ])),
        h,
    );
    let line = match ttft(t) {
        Some((ms, Some(pf))) => format!("TTFT {} · prefill {pf:.0} tok/s", duration_ms(ms)),
        Some((ms, None)) => format!("TTFT {} · prefill —", duration_ms(ms)),
        None => "TTFT — · prefill —".to_string(),
    };
    f.render_widget(Paragraph::new(Line::styled(line, th.fg(th.text))), l);
    let data: Vec<u64> = t.stats.samples.iter().map(|s| s.tok_s.round().max(0.0) as u64).collect();
    let start = data.len().saturating_sub(s.width as usize);
    let shown = &data[start..];
    // A sparkline says what it draws: its caption takes the first row when there are two.
    let s = if s.height >= 2 && !shown.is_empty() {
        let peak = shown.iter().max().copied().unwrap_or(0);
        let caption = format!("tok/s over the run, peak {peak}");
        f.render_widget(Paragraph::new(Line::styled(caption, th.fg(th.dim))), Rect { height: 1, ..s });
        Rect { y: s.y + 1, height: s.height - 1, ..s }
    } else {
        s
    };
    f.render_widget(Sparkline::default().data(shown).style(th.fg(th.good)), s);
}

fn mtp_section(g: &Readings, ctx: &DrawCtx, t: &Turn, f: &mut Frame, area: Rect) {
    let th = ctx.theme;
    let mut lines = vec![];
    let Some(m) = t.mtp() else {
        let remote = g.model.is_some_and(|m| m.is_remote());
        let why = if remote && !t.is_finished() {
            "waiting for the server's figures".to_string()
        } else if remote {
            "not reported by the server".to_string()
        } else if !g.model.is_some_and(|m| m.has_mtp) {
            "off (no MTP head)".to_string()
        } else if !t.params.mtp.is_on() {
            "off (depth 0)".to_string()
        } else if t.params.trace_state {
            // The state trace is per token: the engine does not draft while tracing.
            "off while tracing the state".to_string()
        } else {
            "waiting for the first steps".to_string()
        };
        lines.push(Line::from(vec![
            Span::styled("MTP ", Style::new().fg(th.accent).add_modifier(Modifier::BOLD)),
            Span::styled(why, th.fg(th.dim)),
        ]));
        f.render_widget(Paragraph::new(lines), area);
        return;
    };
    let (acc, len) = (m.acceptance_rate * 100.0, m.mean_accepted_length);
    // Depth 0 under auto: it measured plain decoding faster and paused drafting.
    let depth = if m.depth == 0 && t.params.mtp.is_auto() {
        "off (auto: plain is faster)".to_string()
    } else {
        m.depth.to_string()
    };
    let full = format!("depth {depth} · acc {acc:.0}% ({}/{}) · len {len:.2}", m.accepted, m.drafted);
    // The counts go first when the column is narrow; the rates always fit.
    let text = if full.chars().count() + 4 <= area.width as usize {
        full
    } else {
        let short = if m.depth == 0 && t.params.mtp.is_auto() { "off".to_string() } else { m.depth.to_string() };
        format!("depth {short} · acc {acc:.0}% · len {len:.2}")
    };
    lines.push(Line::from(vec![
        Span::styled("MTP ", Style::new().fg(th.accent).add_modifier(Modifier::BOLD)),
        Span::styled(text, th.fg(th.text)),
    ]));
    if let Some(src) = &m.source {
        lines.push(Line::styled(format!("from {src}"), th.fg(th.dim)));
    }
    let bar_w = (area.width as usize).saturating_sub(10).max(4);
    for (i, p) in m.per_position.iter().take(4).enumerate() {
        let mut spans = vec![Span::styled(format!("d{} ", i + 1), th.fg(th.dim))];
        spans.extend(bar(*p, bar_w, th.accepted, th.headroom));
        spans.push(Span::styled(format!(" {:>3.0}%", p * 100.0), th.fg(th.text)));
        lines.push(Line::from(spans));
    }
    let used = lines.len() as u16;
    f.render_widget(Paragraph::new(lines), area);
    if area.height > used {
        let mut spark = Rect { y: area.y + used, height: area.height - used, ..area };
        let data: Vec<u64> = m.history.iter().map(|x| *x as u64).collect();
        let start = data.len().saturating_sub(spark.width as usize);
        if spark.height >= 2 && start < data.len() {
            let caption = format!("tokens per step (0–{}), last {} steps", m.depth + 1, data.len() - start);
            f.render_widget(Paragraph::new(Line::styled(caption, th.fg(th.dim))), Rect { height: 1, ..spark });
            spark = Rect { y: spark.y + 1, height: spark.height - 1, ..spark };
        }
        f.render_widget(
            Sparkline::default().data(&data[start..]).max((m.depth + 1) as u64).style(th.fg(th.bonus)),
            spark,
        );
    }
}

fn memory_section(g: &Readings, ctx: &DrawCtx, t: &Turn, f: &mut Frame, area: Rect) {
    let th = ctx.theme;
    let title = Span::styled("Memory ", Style::new().fg(th.accent).add_modifier(Modifier::BOLD));
    let Some(mem) = t.memory().cloned() else {
        // A remote server: only what it exposes on /metrics.
        let line = match t.server_memory() {
            Some(s) => {
                let mut spans = vec![title, Span::styled("server KV ", th.fg(th.text))];
                spans.extend(bar(
                    s.kv_used_fraction,
                    (area.width as usize).saturating_sub(24).max(4),
                    th.answer,
                    th.headroom,
                ));
                spans.push(Span::styled(format!(" {:.1}%", s.kv_used_fraction * 100.0), th.fg(th.text)));
                vec![Line::from(spans), Line::styled(format!("from {}", s.metric), th.fg(th.dim))]
            }
            None => vec![Line::from(vec![title, Span::styled("remote: not reported", th.fg(th.dim))])],
        };
        f.render_widget(Paragraph::new(line), area);
        return;
    };
    let weights = g.model.and_then(|m| m.weights_bytes).unwrap_or(0);
    let weights = if mem.weights_bytes > 0 { mem.weights_bytes } else { weights };
    let devices = match g.model.map(|m| &m.kind) {
        Some(crate::backend::BackendKind::Local { devices, .. }) => devices.join(","),
        _ => "cpu".into(),
    };
    let total = (weights + mem.kv_bytes + mem.recurrent_bytes + mem.snapshot_bytes).max(1) as f64;
    let w = (area.width as usize).saturating_sub(25).max(4);
    let row = |label: &str, b: usize, note: &str, c: Color| -> Line<'static> {
        let mut spans = vec![Span::styled(format!("{label:<10}"), th.fg(th.dim))];
        spans.extend(bar(b as f64 / total, w, c, th.headroom));
        spans.push(Span::styled(format!(" {:>9}{note}", short_bytes(b as u64)), th.fg(th.text)));
        Line::from(spans)
    };
    let mut lines = vec![
        Line::from(vec![title, Span::styled(format!("{devices}: {}", short_bytes(total as u64)), th.fg(th.text))]),
        row("weights", weights, "", th.prompt),
        row("KV cache", mem.kv_bytes, " ↑", th.answer),
        row("recurrent", mem.recurrent_bytes, " =", th.thinking),
        row("snapshots", mem.snapshot_bytes, "", th.bonus),
    ];
    // A model on GPUs: each device's share (weights + KV + recurrent state), as far as the
    // panel's height allows.
    for d in &mem.devices {
        lines.push(row(&d.device, d.weights_bytes + d.kv_bytes + d.recurrent_bytes, "", th.accent));
    }
    f.render_widget(Paragraph::new(lines), area);
}

/// The narrow layout's gauges: the budget bar and one line of numbers.
fn strip(f: &mut Frame, area: Rect, ctx: &DrawCtx, g: &Readings) {
    let th = ctx.theme;
    let Some(t) = g.turn else { return };
    let [title, b, nums] =
        Layout::vertical([Constraint::Length(1), Constraint::Length(1), Constraint::Length(1)]).areas(area);
    let used = t.completion_tokens();
    let forced = match (t.forced_tokens(), t.forced_estimate()) {
        (0, _) => String::new(),
        (n, Some(_)) => format!(" · forced ≈{n}"),
        (n, None) => format!(" · forced {n}"),
    };
    f.render_widget(
        Paragraph::new(Line::styled(
            format!(
                "budget {used}/{} · thinking {}{forced} · answer {} · {}",
                t.params.max_tokens,
                t.thinking_tokens(),
                t.answer_tokens(),
                context_in_use(g)
            ),
            th.fg(th.text),
        )),
        title,
    );
    f.render_widget(BudgetBar::new(t, th), b);
    let tok_s = t.stats.samples.last().map(|s| s.tok_s).unwrap_or(0.0);
    let mtp = t
        .mtp()
        .map(|m| format!(" · MTP {:.0}% len {:.2}", m.acceptance_rate * 100.0, m.mean_accepted_length))
        .unwrap_or_default();
    let kv = t.memory().map(|m| format!(" · KV {}", short_bytes(m.kv_bytes as u64))).unwrap_or_default();
    f.render_widget(Paragraph::new(Line::styled(format!("{tok_s:.1} tok/s{mtp}{kv}"), th.fg(th.dim))), nums);
}

/// The gauges panel: the budget, speed, MTP and memory gauges of the shown turn, as the side
/// column of a wide terminal or a compact strip under the panes of a narrow one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gauges {
    Column,
    Strip,
}

impl Panel for Gauges {
    type Shown<'a> = Readings<'a>;
    type Keyed<'a> = ();

    fn key(&mut self, _: KeyEvent, _: (), _: &mut Ctx) -> Handled {
        Handled::NotConsumed
    }

    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, readings: Readings<'_>, _: &mut Laid) {
        match self {
            Gauges::Column => panel(f, area, ctx, &readings),
            Gauges::Strip => strip(f, area, ctx, &readings),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ttft;
    use crate::session::Turn;
    use deltascope_protocol::{EngineEvent, GenerationParams, Phase, StartEvent, TokenEvent};

    fn start() -> EngineEvent {
        EngineEvent::Start(StartEvent {
            model: "m".into(),
            prompt_tokens: Some(2000),
            phase: Phase::Thinking,
            params: GenerationParams::default(),
            server: None,
            numerics: None,
        })
    }

    fn token() -> EngineEvent {
        EngineEvent::Token(TokenEvent {
            index: 0,
            phase: Phase::Thinking,
            id: None,
            text: "a".into(),
            logprob: None,
            draft: None,
            forced: false,
            top_logprobs: vec![],
            entropy: None,
        })
    }

    #[test]
    fn streaming_ttft_is_measured_from_the_start_and_never_absurd() {
        let mut t = Turn::new("q", GenerationParams::default());
        assert_eq!(ttft(&t), None, "no token yet");
        t.apply(&start(), 1000.0);
        t.apply(&token(), 1500.0);
        let (ms, rate) = ttft(&t).unwrap();
        assert_eq!(ms, 500.0, "TTFT counts from the start, not from when the app started");
        assert_eq!(rate, Some(4000.0));
        // A token stamped before the start (another generation's clock): nothing, not 10⁶ tok/s.
        let mut t = Turn::new("q", GenerationParams::default());
        t.apply(&start(), 1000.0);
        t.apply(&token(), 1000.0);
        assert_eq!(ttft(&t), None);
    }
}
