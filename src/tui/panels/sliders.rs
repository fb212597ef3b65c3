//! The sliders panel, in one file: the generation settings the sliders edit and how each slider
//! steps, their keys, and their drawing (every setting with its current value always visible;
//! the selected one is highlighted when the sliders have focus: ↑/↓ select, ←/→ change, Shift
//! or [ ] for big steps, p cycles presets). Changes apply to the next generation; the running
//! one keeps the parameters it started with.

use ratatui::Frame;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Rect;
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph};

use crate::backend::Support;
use crate::tui::keymap::Action;
use crate::tui::log::Level;
use crate::tui::panel::{Ctx, DrawCtx, Handled, Panel};
use crate::tui::screen::Layout;
use deltascope_protocol::{GenerationParams, MAX_DEPTH, MtpMode, Preset, Thinking, range};

/// What the next generation will use.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    pub params: GenerationParams,
    /// What Ctrl+T turns thinking back on to: the setting it had when it was turned off
    /// (`params.thinking` is what the next generation uses).
    pub resume_thinking: Thinking,
    /// The preset last applied (cleared when a sampling slider moves).
    pub preset: Option<Preset>,
    /// Whether the MTP depth can be set here (no MTP head, or a server that decides itself:
    /// the slider is fixed, and says why).
    pub mtp: Support,
    /// The model's context length, when known: `max_tokens` stops there.
    pub context: Option<usize>,
}

impl Settings {
    /// Ctrl+T: thinking off, or back to the budget it had.
    pub fn toggle_thinking(&mut self) {
        let t = &mut self.params.thinking;
        if t.is_on() {
            self.resume_thinking = *t;
            *t = Thinking::Off;
        } else {
            *t = if self.resume_thinking.is_on() { self.resume_thinking } else { Thinking::Unlimited };
        }
    }

    /// The largest `max_tokens` that fits the context after a prompt of `prompt` tokens.
    pub fn max_tokens_cap(&self, prompt: usize) -> usize {
        match self.context {
            Some(c) => c.saturating_sub(prompt).max(1),
            None => usize::MAX,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slider {
    MaxTokens,
    ThinkingBudget,
    Temperature,
    TopP,
    TopK,
    MinP,
    PresencePenalty,
    FrequencyPenalty,
    RepetitionPenalty,
    MtpDepth,
    Seed,
    Preset,
}

const MAX_TOKENS: [usize; 18] =
    [8, 16, 32, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384, 32768];
const BUDGETS: [usize; 12] = [8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384];
const TOP_K: [usize; 11] = [0, 1, 2, 3, 5, 10, 20, 40, 50, 100, 200];

impl Slider {
    pub const ALL: [Slider; 12] = [
        Slider::MaxTokens,
        Slider::ThinkingBudget,
        Slider::Temperature,
        Slider::TopP,
        Slider::TopK,
        Slider::MinP,
        Slider::PresencePenalty,
        Slider::FrequencyPenalty,
        Slider::RepetitionPenalty,
        Slider::MtpDepth,
        Slider::Seed,
        Slider::Preset,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Slider::MaxTokens => "max_tokens",
            Slider::ThinkingBudget => "thinking budget",
            Slider::Temperature => "temperature",
            Slider::TopP => "top-p",
            Slider::TopK => "top-k",
            Slider::MinP => "min-p",
            Slider::PresencePenalty => "presence pen.",
            Slider::FrequencyPenalty => "frequency pen.",
            Slider::RepetitionPenalty => "repetition pen.",
            Slider::MtpDepth => "MTP depth",
            Slider::Seed => "seed",
            Slider::Preset => "preset",
        }
    }

    pub fn value(self, s: &Settings) -> String {
        let p = &s.params;
        let q = &p.sampling;
        match self {
            Slider::MaxTokens => p.max_tokens.to_string(),
            Slider::ThinkingBudget => p.thinking.to_string(),
            Slider::Temperature if q.temperature == 0.0 => "0 (greedy)".into(),
            Slider::Temperature => format!("{:.2}", q.temperature),
            Slider::TopP if q.top_p >= 1.0 => "1.00 (off)".into(),
            Slider::TopP => format!("{:.2}", q.top_p),
            Slider::TopK if q.top_k == 0 => "0 (off)".into(),
            Slider::TopK => q.top_k.to_string(),
            Slider::MinP if q.min_p == 0.0 => "0 (off)".into(),
            Slider::MinP => format!("{:.2}", q.min_p),
            Slider::PresencePenalty => format!("{:.1}", q.presence_penalty),
            Slider::FrequencyPenalty => format!("{:.1}", q.frequency_penalty),
            Slider::RepetitionPenalty if q.repetition_penalty == 1.0 => "1.00 (off)".into(),
            Slider::RepetitionPenalty => format!("{:.2}", q.repetition_penalty),
            Slider::MtpDepth if !s.mtp.is_yes() => format!("n/a ({})", s.mtp.reason().unwrap_or_default()),
            Slider::MtpDepth if p.mtp.is_auto() => "auto (adapts)".into(),
            Slider::MtpDepth if !p.mtp.is_on() => "0 (off)".into(),
            Slider::MtpDepth => p.mtp.to_string(),
            Slider::Seed => q.seed.to_string(),
            Slider::Preset => s.preset.map(|p| p.name().to_string()).unwrap_or_else(|| "custom".into()),
        }
    }

    /// Where the value sits in its range, 0..=1 (for the slider's bar).
    pub fn position(self, s: &Settings) -> f64 {
        let p = &s.params;
        let q = &p.sampling;
        let ladder =
            |l: &[usize], v: usize| l.iter().position(|x| *x >= v).unwrap_or(l.len() - 1) as f64 / (l.len() - 1) as f64;
        let v = match self {
            Slider::MaxTokens => ladder(&MAX_TOKENS, p.max_tokens),
            Slider::ThinkingBudget => match p.thinking {
                Thinking::Off => 0.0,
                Thinking::Unlimited => 1.0,
                Thinking::Tokens(b) => (ladder(&BUDGETS, b.get()) * 0.9 + 0.05).min(0.95),
            },
            Slider::Temperature => (q.temperature / 2.0) as f64,
            Slider::TopP => q.top_p as f64,
            Slider::TopK => ladder(&TOP_K, q.top_k),
            Slider::MinP => q.min_p as f64,
            Slider::PresencePenalty => ((q.presence_penalty + 2.0) / 4.0) as f64,
            Slider::FrequencyPenalty => ((q.frequency_penalty + 2.0) / 4.0) as f64,
            Slider::RepetitionPenalty => ((q.repetition_penalty - 0.5) / 1.5) as f64,
            Slider::MtpDepth if p.mtp.is_auto() => 1.0,
            Slider::MtpDepth => p.mtp.depth() as f64 / 5.0,
            Slider::Seed => 0.0,
            Slider::Preset => s
                .preset
                .and_then(|x| Preset::ALL.iter().position(|p| *p == x))
                .map(|i| (i + 1) as f64 / 4.0)
                .unwrap_or(0.0),
        };
        v.clamp(0.0, 1.0)
    }

    /// The value as typed in the value field (what [`Slider::set`] reads back).
    pub fn typed_value(self, s: &Settings) -> String {
        let p = &s.params;
        let q = &p.sampling;
        match self {
            Slider::MaxTokens => p.max_tokens.to_string(),
            Slider::ThinkingBudget => p.thinking.to_string(),
            Slider::Temperature => q.temperature.to_string(),
            Slider::TopP => q.top_p.to_string(),
            Slider::TopK => q.top_k.to_string(),
            Slider::MinP => q.min_p.to_string(),
            Slider::PresencePenalty => q.presence_penalty.to_string(),
            Slider::FrequencyPenalty => q.frequency_penalty.to_string(),
            Slider::RepetitionPenalty => q.repetition_penalty.to_string(),
            Slider::MtpDepth => p.mtp.to_string(),
            Slider::Seed => q.seed.to_string(),
            Slider::Preset => s.preset.map(|p| p.name().to_string()).unwrap_or_default(),
        }
    }

    /// Sets a typed value (Enter on a slider, then a number). The text is read as the type
    /// the setting has; its range is judged by the one table (`GenerationParams::check`, within
    /// the context when known), as for the flags and the server; the error says what is accepted.
    pub fn set(self, s: &mut Settings, text: &str) -> Result<(), String> {
        let text = text.trim();
        let label = self.label();
        let float =
            || -> Result<f32, String> { text.parse().map_err(|_| format!("{label}: {text:?} is not a number")) };
        let count = |what: &str| -> Result<usize, String> {
            text.parse::<usize>().map_err(|_| format!("{label}: {text:?} is not {what}"))
        };
        let mut next = s.clone();
        let p = &mut next.params;
        let q = &mut p.sampling;
        match self {
            Slider::MaxTokens => p.max_tokens = count("a whole number of tokens")?,
            Slider::ThinkingBudget => {
                // The front ends' one spelling (off, unlimited, -1, 0, a count).
                p.thinking = text.parse().map_err(|e| format!("{label}: {e}"))?;
            }
            Slider::Temperature => q.temperature = float()?,
            Slider::TopP => q.top_p = float()?,
            Slider::TopK => q.top_k = count("a whole number (0 = off)")?,
            Slider::MinP => q.min_p = float()?,
            Slider::PresencePenalty => q.presence_penalty = float()?,
            Slider::FrequencyPenalty => q.frequency_penalty = float()?,
            Slider::RepetitionPenalty => q.repetition_penalty = float()?,
            Slider::MtpDepth => {
                if let Some(why) = s.mtp.reason() {
                    return Err(format!("the MTP depth cannot be set here: {why}"));
                }
                p.mtp = text.parse().map_err(|e| format!("{label}: {e}"))?;
            }
            Slider::Seed => q.seed = text.parse().map_err(|_| format!("seed: {text:?} is not a whole number"))?,
            Slider::Preset => {
                let preset =
                    Preset::ALL.iter().copied().find(|p| p.name().eq_ignore_ascii_case(text)).ok_or_else(|| {
                        let names: Vec<&str> = Preset::ALL.iter().map(|p| p.name()).collect();
                        format!("preset must be one of {}; got {text:?}", names.join(", "))
                    })?;
                preset.apply(q);
                next.preset = Some(preset);
                *s = next;
                return Ok(());
            }
        }
        let checked = match next.context {
            Some(c) => next.params.check_within(c),
            None => next.params.check(),
        };
        if let Err(e) = checked {
            let within = match next.context {
                Some(c) if e.expected.contains("context") => format!(" ({c} tokens)"),
                _ => String::new(),
            };
            return Err(format!("{label} {text}: must be {}{within}", e.expected));
        }
        if self.is_sampling() {
            next.preset = None;
        }
        *s = next;
        Ok(())
    }

    fn is_sampling(self) -> bool {
        matches!(
            self,
            Slider::Temperature
                | Slider::TopP
                | Slider::TopK
                | Slider::MinP
                | Slider::PresencePenalty
                | Slider::FrequencyPenalty
                | Slider::RepetitionPenalty
        )
    }

    /// Moves the slider one step (`dir` ±1), or a big step.
    pub fn adjust(self, s: &mut Settings, dir: i32, big: bool) {
        let up = dir > 0;
        let p = &mut s.params;
        let q = &mut p.sampling;
        // Steps stay inside the field's row of the one range table.
        let step_f = |v: f32, small: f32, field: &str| -> f32 {
            let d = if big { small * 5.0 } else { small };
            let n = if up { v + d } else { v - d };
            // Round to the step's precision so values do not drift (0.30000001).
            let n = (n / small).round() * small;
            range(field).map_or(n, |r| r.clamp(n as f64, small as f64) as f32)
        };
        match self {
            Slider::MaxTokens => p.max_tokens = ladder_step(&MAX_TOKENS, p.max_tokens, up, big),
            Slider::ThinkingBudget => {
                // off < 8 < … < 16384 < unlimited
                let (first, last) = (BUDGETS[0], BUDGETS[BUDGETS.len() - 1]);
                let tokens = |b: usize| Thinking::from_budget(Some(b));
                p.thinking = match (p.thinking, up) {
                    (Thinking::Off, true) => tokens(first),
                    (Thinking::Unlimited, false) => tokens(last),
                    (t @ (Thinking::Off | Thinking::Unlimited), _) => t,
                    (Thinking::Tokens(b), true) if b.get() >= last => Thinking::Unlimited,
                    (Thinking::Tokens(b), false) if b.get() <= first => Thinking::Off,
                    (Thinking::Tokens(b), up) => tokens(ladder_step(&BUDGETS, b.get(), up, big)),
                };
            }
            Slider::Temperature => q.temperature = step_f(q.temperature, 0.05, "sampling.temperature"),
            Slider::TopP => q.top_p = step_f(q.top_p, 0.05, "sampling.top_p"),
            Slider::TopK => q.top_k = ladder_step(&TOP_K, q.top_k, up, big),
            Slider::MinP => q.min_p = step_f(q.min_p, 0.01, "sampling.min_p"),
            Slider::PresencePenalty => {
                q.presence_penalty = step_f(q.presence_penalty, 0.1, "sampling.presence_penalty")
            }
            Slider::FrequencyPenalty => {
                q.frequency_penalty = step_f(q.frequency_penalty, 0.1, "sampling.frequency_penalty")
            }
            Slider::RepetitionPenalty => {
                q.repetition_penalty = step_f(q.repetition_penalty, 0.05, "sampling.repetition_penalty")
            }
            Slider::MtpDepth => {
                // 0 (off) < 1 < … < 4 < auto (the engine adapts the depth to acceptance).
                if s.mtp.is_yes() {
                    let max = MAX_DEPTH;
                    p.mtp = match (p.mtp, up) {
                        (MtpMode::Auto, true) => MtpMode::Auto,
                        (MtpMode::Auto, false) => MtpMode::fixed(max),
                        (m, true) if m.depth() >= max => MtpMode::Auto,
                        (m, true) => MtpMode::fixed(m.depth() + 1),
                        (m, false) => MtpMode::fixed(m.depth().saturating_sub(1)),
                    };
                }
            }
            Slider::Seed => {
                let d = if big { 100 } else { 1 };
                q.seed = if up { q.seed.saturating_add(d) } else { q.seed.saturating_sub(d) };
            }
            Slider::Preset => {
                let i = s.preset.and_then(|x| Preset::ALL.iter().position(|p| *p == x));
                let next = match (i, up) {
                    (None, true) => Some(0),
                    (None, false) => Some(Preset::ALL.len() - 1),
                    (Some(i), true) => Some((i + 1) % Preset::ALL.len()),
                    (Some(i), false) => Some((i + Preset::ALL.len() - 1) % Preset::ALL.len()),
                };
                if let Some(i) = next {
                    let preset = Preset::ALL[i];
                    preset.apply(q);
                    s.preset = Some(preset);
                    return;
                }
            }
        }
        if self.is_sampling() {
            s.preset = None;
        }
    }
}

/// The next value of a ladder above/below `v` (two rungs for a big step).
fn ladder_step(ladder: &[usize], v: usize, up: bool, big: bool) -> usize {
    let n = if big { 2 } else { 1 };
    let mut cur = v;
    for _ in 0..n {
        cur = if up {
            ladder.iter().copied().find(|x| *x > cur).unwrap_or(cur)
        } else {
            ladder.iter().rev().copied().find(|x| *x < cur).unwrap_or(cur)
        };
    }
    cur
}

/// A key while the sliders have the focus: `selected` is the selected slider, `cap` the
/// largest max_tokens the context leaves room for.
fn on_key(selected: &mut usize, settings: &mut Settings, cap: usize, k: KeyEvent, ctx: &mut Ctx) -> Handled {
    let n = Slider::ALL.len();
    let big = k.modifiers.contains(KeyModifiers::SHIFT);
    let slider = Slider::ALL[*selected];
    match k.code {
        KeyCode::Up => *selected = (*selected + n - 1) % n,
        KeyCode::Down => *selected = (*selected + 1) % n,
        KeyCode::Left | KeyCode::Char('h') | KeyCode::Char('-') => slider.adjust(settings, -1, big),
        KeyCode::Right | KeyCode::Char('l') | KeyCode::Char('+') | KeyCode::Char('=') => {
            slider.adjust(settings, 1, big)
        }
        KeyCode::Char('[') => slider.adjust(settings, -1, true),
        KeyCode::Char(']') => slider.adjust(settings, 1, true),
        KeyCode::Char('p') => Slider::Preset.adjust(settings, 1, false),
        _ => {}
    }
    // Steps stop at the model's context.
    if settings.params.max_tokens > cap {
        settings.params.max_tokens = cap;
        ctx.say(Level::Info, format!("max_tokens stops at {cap}: the model's context less the conversation"));
    }
    Handled::Consumed
}

// Drawing.

/// Rows inside the border: one per slider plus the footer.
pub const HEIGHT: u16 = Slider::ALL.len() as u16 + 1;

/// The sliders over `settings`; `selected`: the selected slider, while they have the focus.
fn draw(f: &mut Frame, area: Rect, ctx: &DrawCtx, settings: &Settings, selected: Option<usize>) {
    let th = ctx.theme;
    let focused = selected.is_some();
    let title = if focused {
        Line::styled(" Settings (next run) ↑↓ ←→ ", th.title())
    } else {
        Line::from(vec![
            Span::styled(" Settings (next run) ", th.title()),
            Span::styled(format!("{} ", ctx.keymap.first(Action::FocusNext)), th.fg(th.dim)),
        ])
    };
    let block = Block::bordered().title(title).border_style(th.border(focused));
    let inner = block.inner(area);
    f.render_widget(block, area);
    let bar_w = 8usize;
    let label_w = 16usize;
    let mut lines = vec![];
    for (i, s) in Slider::ALL.iter().enumerate() {
        let selected = selected == Some(i);
        let pos = s.position(settings);
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
        spans.push(Span::styled(format!(" {}", s.value(settings)), label_style));
        let line = Line::from(spans);
        lines.push(if selected { line.style(Style::new().bg(th.selection_bg)) } else { line });
    }
    lines.push(Line::styled(" applies to the next generation", th.fg(th.dim)));
    f.render_widget(Paragraph::new(lines), inner);
}

/// The sliders panel: the settings of the next run. Its state is the selected slider; the
/// settings it moves are the app's.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sliders {
    pub selected: usize,
}

impl Panel for Sliders {
    /// The settings, and whether the sliders have the focus (then the selection shows).
    type Shown<'a> = (&'a Settings, bool);
    /// The settings a key moves, and the largest max_tokens the context leaves room for.
    type Keyed<'a> = (&'a mut Settings, usize);

    fn key(&mut self, k: KeyEvent, (settings, cap): (&mut Settings, usize), ctx: &mut Ctx) -> Handled {
        on_key(&mut self.selected, settings, cap, k, ctx)
    }

    fn draw(&self, f: &mut Frame, area: Rect, ctx: &DrawCtx, (settings, focused): Self::Shown<'_>, _: &mut Layout) {
        draw(f, area, ctx, settings, focused.then_some(self.selected))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            params: GenerationParams::default(),
            resume_thinking: Thinking::Unlimited,
            preset: None,
            mtp: Support::Yes,
            context: Some(4096),
        }
    }

    #[test]
    fn thinking_budget_runs_from_off_to_unlimited() {
        let mut s = settings();
        assert_eq!(Slider::ThinkingBudget.value(&s), "unlimited");
        Slider::ThinkingBudget.adjust(&mut s, -1, false);
        assert_eq!(Slider::ThinkingBudget.value(&s), "16384");
        for _ in 0..20 {
            Slider::ThinkingBudget.adjust(&mut s, -1, false);
        }
        assert_eq!(Slider::ThinkingBudget.value(&s), "off");
        assert_eq!(s.params.thinking, Thinking::Off);
        Slider::ThinkingBudget.adjust(&mut s, 1, false);
        assert_eq!(Slider::ThinkingBudget.value(&s), "8");
        assert!(s.params.thinking.is_on());
    }

    #[test]
    fn ctrl_t_turns_thinking_off_and_back_to_its_budget() {
        let mut s = settings();
        Slider::ThinkingBudget.set(&mut s, "300").unwrap();
        s.toggle_thinking();
        assert_eq!(s.params.thinking, Thinking::Off);
        s.toggle_thinking();
        assert_eq!(s.params.thinking.budget(), Some(300));
        // Off on the slider, then Ctrl+T: the budget it had before the toggle.
        Slider::ThinkingBudget.set(&mut s, "off").unwrap();
        s.toggle_thinking();
        assert_eq!(s.params.thinking.budget(), Some(300));
    }

    #[test]
    fn mtp_depth_runs_from_off_to_auto_and_frequency_penalty_steps() {
        let mut s = settings();
        s.params.mtp = MtpMode::Off;
        assert_eq!(Slider::MtpDepth.value(&s), "0 (off)");
        for _ in 0..4 {
            Slider::MtpDepth.adjust(&mut s, 1, false);
        }
        assert_eq!(s.params.mtp, MtpMode::fixed(4));
        Slider::MtpDepth.adjust(&mut s, 1, false);
        assert!(s.params.mtp.is_auto());
        assert_eq!(Slider::MtpDepth.value(&s), "auto (adapts)");
        assert_eq!(Slider::MtpDepth.position(&s), 1.0);
        Slider::MtpDepth.adjust(&mut s, 1, false);
        assert!(s.params.mtp.is_auto(), "auto is the top of the range");
        Slider::MtpDepth.adjust(&mut s, -1, false);
        assert_eq!(s.params.mtp, MtpMode::fixed(4));

        for _ in 0..3 {
            Slider::FrequencyPenalty.adjust(&mut s, 1, false);
        }
        assert_eq!(Slider::FrequencyPenalty.value(&s), "0.3");
        assert_eq!(s.params.sampling.frequency_penalty, 0.3);
        Slider::FrequencyPenalty.adjust(&mut s, -1, true);
        assert_eq!(Slider::FrequencyPenalty.value(&s), "-0.2");
    }

    #[test]
    fn typed_values_set_the_field_reports_and_budgets() {
        let mut s = settings();
        // The field report's numbers: max_tokens 4000, thinking budget 3000.
        Slider::MaxTokens.set(&mut s, "4000").unwrap();
        Slider::ThinkingBudget.set(&mut s, "3000").unwrap();
        assert_eq!((s.params.max_tokens, s.params.thinking.budget()), (4000, Some(3000)));
        Slider::Temperature.set(&mut s, "0.6").unwrap();
        assert_eq!(s.params.sampling.temperature, 0.6);
        Slider::ThinkingBudget.set(&mut s, "off").unwrap();
        assert_eq!(s.params.thinking, Thinking::Off);
        Slider::MtpDepth.set(&mut s, "auto").unwrap();
        assert!(s.params.mtp.is_auto());
        Slider::Preset.set(&mut s, "thinking-general").unwrap();
        assert_eq!(s.preset, Some(Preset::ALL[0]));
        // Checked like the flags, and the error says what is accepted.
        assert_eq!(
            Slider::MaxTokens.set(&mut s, "5000").unwrap_err(),
            "max_tokens 5000: must be at most the model's context length (4096 tokens)"
        );
        assert_eq!(Slider::MaxTokens.set(&mut s, "0").unwrap_err(), "max_tokens 0: must be at least 1");
        assert_eq!(Slider::TopP.set(&mut s, "7").unwrap_err(), "top-p 7: must be in (0, 1]");
        assert_eq!(
            Slider::Temperature.set(&mut s, "-5").unwrap_err(),
            "temperature -5: must be in [0, 100] (0 is greedy)"
        );
        assert!(Slider::TopK.set(&mut s, "many").unwrap_err().contains("is not a whole number"));
        assert!(Slider::MtpDepth.set(&mut s, "9").unwrap_err().contains("0 (off) to 4"));
        assert_eq!(s.params.max_tokens, 4000, "a refused value changes nothing");
        for slider in Slider::ALL {
            let typed = slider.typed_value(&s);
            let mut t = s.clone();
            slider.set(&mut t, &typed).unwrap_or_else(|e| panic!("{slider:?} {typed:?}: {e}"));
            assert_eq!(slider.value(&t), slider.value(&s), "{slider:?} reads back what it shows");
        }
    }

    #[test]
    fn steps_stay_on_round_values_and_presets_apply() {
        let mut s = settings();
        for _ in 0..6 {
            Slider::Temperature.adjust(&mut s, 1, false);
        }
        assert_eq!(Slider::Temperature.value(&s), "0.30");
        Slider::MaxTokens.adjust(&mut s, 1, false);
        assert_eq!(s.params.max_tokens, 1536);
        Slider::MaxTokens.adjust(&mut s, -1, true);
        assert_eq!(s.params.max_tokens, 768);
        Slider::Preset.adjust(&mut s, 1, false);
        assert_eq!(Slider::Preset.value(&s), "thinking-general");
        assert_eq!(s.params.sampling.top_k, 20);
        Slider::TopK.adjust(&mut s, 1, false);
        assert_eq!(s.params.sampling.top_k, 40);
        assert_eq!(Slider::Preset.value(&s), "custom");
        s.mtp = Support::No("no head".into());
        Slider::MtpDepth.adjust(&mut s, 1, false);
        assert_eq!(Slider::MtpDepth.value(&s), "n/a (no head)");
    }
}
