//! `deltascope trace`: the state scope, headless. Generates with the state trace on and writes
//! it (JSON Lines, the `run --json` event schema), summarises it per layer, draws it as SVG, and
//! compares two traces layer by layer (`--compare A B`: which layer parts ways first).

use std::fmt::{self, Write as _};
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use serde::Serialize;

use super::common::{self, ModelArgs, PromptArgs};
use super::interrupt::Interrupt;
use super::report::{self, Report};
use crate::backend::ChatRequest;
use crate::backend::ParamOverrides;
use deltascope_model::{short_bytes, sig4};
use deltascope_protocol::{AttentionLayerState, Diagnostic, DiagnosticKind, EngineEvent, FinishReason, Generation};
use deltascope_protocol::{EXPLODED_NORM, FORGETS_WITHIN, HeadMemory, KEEPS_PAST, memory_of};
use deltascope_protocol::{GdnLayerState, Numerics, StateEvent, StateMetric, TokenEvent};

#[derive(Args, Debug)]
pub struct TraceArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The user message (rendered through the chat template unless --raw).
    #[arg(long, value_name = "TEXT", required_unless_present = "compare")]
    pub prompt: Option<String>,
    #[command(flatten)]
    pub prompt_opts: PromptArgs,
    #[command(flatten)]
    pub generation: ParamOverrides,
    /// Print the trace as JSON Lines on stdout (the `run --json` events) instead of a summary.
    #[arg(long)]
    pub json: bool,
    /// Also write the trace (JSON Lines) to this file.
    #[arg(long, value_name = "FILE.jsonl")]
    pub out: Option<PathBuf>,
    /// Draw an SVG: the metric per layer × head at the last token, and over the tokens for --layer.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// The metric --plot draws: beta, half-life, norm, delta (--compare checks β, g and ‖S‖).
    #[arg(long, default_value = "beta", value_parser = metric)]
    pub metric: StateMetric,
    /// The layer whose heads the SVG draws over the tokens (default: the first GDN layer).
    #[arg(long, value_name = "N")]
    pub layer: Option<usize>,
    /// Compare two traces (files written by --out or `run --trace-state --json`): per layer,
    /// the first token where they differ by more than --tolerance. Exit 1 when they do.
    #[arg(long, num_args = 2, value_names = ["A.jsonl", "B.jsonl"], conflicts_with_all = ["prompt", "json", "out"])]
    pub compare: Option<Vec<PathBuf>>,
    /// Relative difference that counts as diverged (β, g, ‖S‖ per head): finite and > 0.
    /// Default: from the device, precision and kernels both traces record — the same ones:
    /// 1e-6; f32 engines that add in another order: 1e-3; bf16: 16 bf16 rounding steps (6.25e-2).
    #[arg(long, value_name = "REL", allow_hyphen_values = true, value_parser = tolerance)]
    pub tolerance: Option<f64>,
}

/// The tolerance two traces are compared at when none is given, and why: two healthy engines
/// differ by the rounding their arithmetic implies, and nothing more.
pub fn derived_tolerance(a: Option<&Numerics>, b: Option<&Numerics>) -> (f64, String) {
    let (Some(a), Some(b)) = (a, b) else {
        return (1e-3, "a trace records no device, precision or kernels (written before they were): 1e-3".into());
    };
    let what = |n: &Numerics| format!("{} {} {}", n.device, n.dtype, n.kernel);
    if a == b {
        return (1e-6, format!("both traces computed alike ({}): the same arithmetic", what(a)));
    }
    if a.dtype == "f32" && b.dtype == "f32" {
        return (1e-3, format!("f32 engines that add in another order ({} vs {})", what(a), what(b)));
    }
    // A value near a bf16 rounding boundary rounds one way in one engine and the other way in
    // the other: a whole step (2⁻⁸ relative), compounded over the layers before it.
    let steps = 16.0;
    (steps * BF16_STEP, format!("bf16 ({} vs {}): {steps} bf16 rounding steps of 2⁻⁸", what(a), what(b)))
}

/// One bf16 rounding step, relative (8 bits of significand).
const BF16_STEP: f64 = 1.0 / 256.0;

fn tolerance(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(t) if t.is_finite() && t > 0.0 => Ok(t),
        Ok(_) => Err(format!("{s}: must be a finite number > 0 (a relative difference, e.g. 1e-3)")),
        Err(_) => Err(format!("{s:?} is not a number (a relative difference, e.g. 1e-3)")),
    }
}

fn metric(s: &str) -> Result<StateMetric, String> {
    StateMetric::parse(s).ok_or_else(|| {
        let names: Vec<_> = StateMetric::ALL.iter().map(|m| m.name()).collect();
        format!("{s:?} is not a metric: one of {}", names.join(", "))
    })
}

/// A trace: the state events, the generated tokens' ids and texts, and what computed them.
#[derive(Debug, Default)]
pub struct Trace {
    pub states: Vec<StateEvent>,
    pub tokens: Vec<TokenEvent>,
    /// The device, precision and kernels (from the start event; `None` in older traces).
    pub numerics: Option<Numerics>,
}

impl Trace {
    fn push(&mut self, ev: &EngineEvent) {
        match ev {
            EngineEvent::State(s) => self.states.push(s.clone()),
            EngineEvent::Token(t) => self.tokens.push(t.clone()),
            EngineEvent::Start(s) => self.numerics.clone_from(&s.numerics),
            _ => {}
        }
    }

    /// Reads the state and token events of a JSON Lines file (other events are skipped).
    pub fn read(path: &Path) -> anyhow::Result<Trace> {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut t = Trace::default();
        for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let ev: EngineEvent = serde_json::from_str(line).with_context(|| {
                format!("{}:{}: not an engine event (JSON Lines of run --json)", path.display(), i + 1)
            })?;
            t.push(&ev);
        }
        if t.states.is_empty() {
            bail!(
                "{}: no state events (write it with `deltascope trace --out` or `run --trace-state --json`)",
                path.display()
            );
        }
        Ok(t)
    }

    fn token_text(&self, at: Option<usize>) -> String {
        match at {
            None => "prompt".into(),
            Some(i) => self.tokens.get(i).map_or_else(|| format!("#{i}"), |t| format!("#{i} {:?}", t.text)),
        }
    }
}

pub fn run(a: TraceArgs) -> anyhow::Result<()> {
    match &a.compare {
        // Two files: clap takes exactly two.
        Some(files) => compare_files(&files[0], &files[1], a.tolerance),
        None => record(&a),
    }
}

/// `--compare A B`: the comparison printed; exit 1 when the traces diverge.
fn compare_files(a: &Path, b: &Path, tolerance: Option<f64>) -> anyhow::Result<()> {
    let (x, y) = (Trace::read(a)?, Trace::read(b)?);
    let (tol, derived) = match tolerance {
        Some(t) => (t, None),
        None => {
            let (t, why) = derived_tolerance(x.numerics.as_ref(), y.numerics.as_ref());
            (t, Some(why))
        }
    };
    let mut comparison = compare(&x, &y, tol);
    comparison.tolerance_from = derived;
    report::emit(&comparison, false)?;
    if comparison.diverged {
        std::process::exit(1);
    }
    Ok(())
}

/// Generates with the state trace on and writes what the flags ask (JSON Lines on stdout and to
/// --out, the summary, the plot); a generation cut short ends in an error after them.
fn record(a: &TraceArgs) -> anyhow::Result<()> {
    let text = a.prompt.as_deref().context("--prompt is needed (or --compare A B)")?;
    // A plot that cannot be written (or is not named *.svg) fails now, not after the generation.
    if let Some(path) = &a.plot {
        common::check_plot_path(path)?;
    }
    let prompt = common::prompt(Some(text), None, &a.prompt_opts)?;
    let backend = common::open(&a.model)?;
    let mut overrides = a.generation.checked()?.without_thinking_if(a.prompt_opts.no_think);
    overrides.trace_state = true;
    let request = ChatRequest { prompt, params: overrides.resolve(backend.info())? };
    let interrupt = Interrupt::install()?;
    let generation = backend.start(request)?;
    let control = generation.control();
    interrupt.on_signal(move || control.cancel());
    let mut file = match &a.out {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let recorded = Recorded::from_events(a, &generation, file.as_mut().map(|f| f as &mut dyn Write))?;
    if let Some(mut f) = file {
        f.flush()?;
    }
    recorded.report(a, &interrupt)
}

/// What a traced generation sent: the trace, how it finished, and its diagnostics.
struct Recorded {
    trace: Trace,
    finish: Option<FinishReason>,
    diagnostics: Vec<Diagnostic>,
}

impl Recorded {
    /// Reads the generation's events to the end, writing each as a JSON line on stdout (--json)
    /// and to `file` (--out) as it comes.
    fn from_events(a: &TraceArgs, generation: &Generation, mut file: Option<&mut dyn Write>) -> anyhow::Result<Self> {
        let mut out = std::io::stdout().lock();
        let mut r = Recorded { trace: Trace::default(), finish: None, diagnostics: vec![] };
        for ev in generation.events().iter() {
            let line = serde_json::to_string(&ev)?;
            if a.json {
                writeln!(out, "{line}")?;
            }
            if let Some(f) = file.as_mut() {
                writeln!(f, "{line}")?;
            }
            r.trace.push(&ev);
            match ev {
                EngineEvent::Done(d) => {
                    r.finish = Some(d.finish_reason);
                    break;
                }
                EngineEvent::Error(e) => bail!("{}", e.message),
                EngineEvent::Diagnostic(d) => r.diagnostics.push(d),
                // The prompt's pass names the GDN layers: a --layer that is not one fails now,
                // not after the whole generation.
                EngineEvent::State(s) if r.trace.states.len() == 1 => {
                    if let (Some(_), Some(layer)) = (&a.plot, a.layer)
                        && !s.gdn.iter().any(|l| l.layer == layer)
                    {
                        generation.control().cancel();
                        let gdn: Vec<String> = s.gdn.iter().map(|l| l.layer.to_string()).collect();
                        bail!("--layer {layer} is not a GDN layer of this model (GDN layers: {})", gdn.join(", "));
                    }
                }
                _ => {}
            }
        }
        Ok(r)
    }

    /// The summary (unless --json), the plot (with --plot), then the exit: an error when a signal
    /// or the model itself cut the generation short.
    fn report(self, a: &TraceArgs, interrupt: &Interrupt) -> anyhow::Result<()> {
        let Recorded { trace, finish, diagnostics } = self;
        // What went wrong (a pass that went non-finite, a state alarm) is said whatever else is.
        let said: Vec<String> = diagnostics.iter().map(|d| format!("{}: {}", d.kind.as_str(), d.message)).collect();
        if trace.states.is_empty() {
            match said.is_empty() {
                true => bail!("the engine sent no state events"),
                false => bail!("the engine sent no state events; {}", said.join("; ")),
            }
        }
        if !a.json {
            report::emit(&TraceReport { diagnostics: said, ..summary(&trace) }, false)?;
        }
        if let Some(p) = &a.plot {
            let layer = a.layer.unwrap_or(trace.states[0].gdn[0].layer);
            let svg = plot(&trace, a.metric, layer)?;
            std::fs::write(p, svg).with_context(|| format!("writing {}", p.display()))?;
            eprintln!("wrote {}", p.display());
        }
        if finish == Some(FinishReason::Cancelled) {
            return Err(interrupt.stopped().into());
        }
        // Cut short by the model itself (a NaN): the trace is written, the exit says it stopped.
        if finish == Some(FinishReason::Error) {
            let why = diagnostics
                .iter()
                .find(|d| d.kind == DiagnosticKind::Nonfinite)
                .map_or("an error", |d| d.kind.as_str());
            bail!("the generation stopped after {} tokens ({why}; above)", trace.tokens.len());
        }
        Ok(())
    }
}

/// A trace summarised: its state per GDN layer (`None` for a trace with no state events), then
/// the generation's diagnostics.
#[derive(Debug, Serialize)]
pub struct TraceReport {
    pub states: Option<StateSummary>,
    /// Each diagnostic as `kind: message`.
    pub diagnostics: Vec<String>,
}

/// The state at the last complete pass, per layer, and the first alarm of any pass.
#[derive(Debug, Serialize)]
pub struct StateSummary {
    /// State passes: the prompt's, then one per token.
    pub passes: usize,
    /// The position after the last pass.
    pub position: usize,
    pub gdn: Vec<GdnSummary>,
    pub attention: Vec<AttentionLayerState>,
    /// The first head whose state went non-finite or exploded.
    pub alarm: Option<Alarm>,
}

/// One GDN layer at the last complete pass (‖S‖ and ‖ΔS‖/‖S‖ over the trace).
#[derive(Debug, Serialize)]
pub struct GdnSummary {
    pub layer: usize,
    pub heads: usize,
    pub beta_mean: f32,
    /// The heads' half-lives in tokens: the shortest, the median and the longest.
    pub half_life: [f32; 3],
    /// The largest ‖S‖ of any head over every pass that ran this layer.
    pub norm_max: f32,
    /// ‖ΔS‖/‖S‖ averaged over the heads and the generated tokens.
    pub delta_mean: f64,
    /// Heads that forget within `FORGETS_WITHIN` tokens, and heads that keep past `KEEPS_PAST`.
    pub forgets: usize,
    pub keeps: usize,
}

#[derive(Debug, Serialize)]
pub struct Alarm {
    /// The pass: "prompt", or the token read.
    pub at: String,
    pub layer: usize,
    pub head: usize,
    pub what: String,
}

/// Per GDN layer, at the last token and over the whole trace; the alarms.
pub fn summary(t: &Trace) -> TraceReport {
    // The last complete pass (a pass that went non-finite stops at the failing layer: its ✖
    // heads are in the alarm below).
    let layers = t.states.iter().map(|e| e.gdn.len()).max().unwrap_or(0);
    let states = t.states.iter().rev().find(|e| e.gdn.len() == layers).map(|last| StateSummary {
        passes: t.states.len(),
        position: last.position,
        gdn: (0..last.gdn.len()).map(|li| gdn_summary(t, last, li)).collect(),
        attention: last.attention.clone(),
        alarm: t.states.iter().find_map(|e| {
            e.alarm(EXPLODED_NORM).map(|(layer, head, what)| Alarm { at: t.token_text(e.at_token), layer, head, what })
        }),
    });
    TraceReport { states, diagnostics: vec![] }
}

/// Layer `li` of the pass `last`, with its ‖S‖ and ‖ΔS‖/‖S‖ over the whole trace.
fn gdn_summary(t: &Trace, last: &StateEvent, li: usize) -> GdnSummary {
    let l = &last.gdn[li];
    let heads = l.beta.len();
    let mut hl: Vec<f32> = (0..heads).map(|h| l.half_life(h)).collect();
    hl.sort_by(f32::total_cmp);
    // Over every pass that ran this layer (a failed pass may have stopped before it).
    let norm_max =
        t.states.iter().filter_map(|e| e.gdn.get(li)).flat_map(|g| g.state_norm.iter().copied()).fold(0f32, f32::max);
    let tokens: Vec<_> = t.states[1.min(t.states.len() - 1)..].iter().filter_map(|e| e.gdn.get(li)).collect();
    let delta_mean = tokens.iter().flat_map(|g| g.delta_ratio.iter()).map(|&d| d as f64).sum::<f64>()
        / (tokens.len() * heads).max(1) as f64;
    GdnSummary {
        layer: l.layer,
        heads,
        beta_mean: l.beta.iter().sum::<f32>() / heads as f32,
        half_life: [hl[0], hl[heads / 2], hl[heads - 1]],
        norm_max,
        delta_mean,
        forgets: hl.iter().filter(|&&h| memory_of(h) == HeadMemory::Forgets).count(),
        keeps: hl.iter().filter(|&&h| memory_of(h) == HeadMemory::Keeps).count(),
    }
}

impl fmt::Display for TraceReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(s) = &self.states {
            write!(f, "{s}")?;
        }
        for line in &self.diagnostics {
            writeln!(f, "{line}")?;
        }
        Ok(())
    }
}

impl fmt::Display for StateSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "state trace: {} passes (the prompt, then {} tokens), position {}",
            self.passes,
            self.passes - 1,
            self.position
        )?;
        writeln!(
            f,
            "layer heads  β mean  half-life min  median      max  ‖S‖ max  ‖ΔS‖/‖S‖  forget<{FORGETS_WITHIN}  keep>{KEEPS_PAST}"
        )?;
        for l in &self.gdn {
            writeln!(
                f,
                "{:>5} {:>5}  {:>6}  {:>13}  {:>6}  {:>7}  {:>7}  {:>8}  {:>8}  {:>9}",
                l.layer,
                l.heads,
                sig4(l.beta_mean),
                sig4(l.half_life[0]),
                sig4(l.half_life[1]),
                sig4(l.half_life[2]),
                sig4(l.norm_max),
                sig4(l.delta_mean as f32),
                l.forgets,
                l.keeps
            )?;
        }
        for a in &self.attention {
            writeln!(f, "{:>5} attention: KV {} tokens, {}", a.layer, a.kv_len, short_bytes(a.kv_bytes as u64))?;
        }
        match &self.alarm {
            Some(a) => writeln!(f, "ALARM at {}: layer {} head {}: {}", a.at, a.layer, a.head, a.what),
            None => writeln!(f, "no alarm: every state finite, ‖S‖ below {EXPLODED_NORM:.0e}"),
        }
    }
}

impl Report for TraceReport {
    fn print_human(&self, out: &mut dyn Write) -> std::io::Result<()> {
        write!(out, "{self}")
    }
}

/// The relative difference of two values (NaN against a number counts as ∞).
fn rel_diff(x: f32, y: f32) -> f64 {
    if x.is_nan() != y.is_nan() || x.is_infinite() != y.is_infinite() {
        f64::INFINITY
    } else if x.is_nan() || x == y {
        0.0
    } else {
        // Against the larger magnitude, so that A against B reads as B against A (g is ≤ 0).
        ((x - y) as f64).abs() / (x as f64).abs().max((y as f64).abs()).max(1e-12)
    }
}

/// One head's difference in one metric of one pass: `diff` relative, `score` that difference
/// against what it is allowed (`tol` plus the rounding slack the traces recorded), so that a
/// score above 1 is a divergence.
#[derive(Clone)]
struct Difference {
    diff: f64,
    score: f64,
    text: String,
}

/// The first of the largest differences by size (what is shown as the largest).
fn largest<'a>(ds: impl Iterator<Item = &'a Difference>) -> Option<&'a Difference> {
    ds.fold(None, |m: Option<&Difference>, d| if m.is_some_and(|m| m.diff >= d.diff) { m } else { Some(d) })
}

/// How the traces' recorded rounding slack (see `GdnLayerState::g_slack`) widens a metric's
/// tolerance: not at all (‖S‖), relatively (g) or by an absolute amount (β).
enum Slack<'a> {
    None,
    Relative(&'a [f32], &'a [f32]),
    Absolute(&'a [f32], &'a [f32]),
}

impl Slack<'_> {
    /// The relative allowance beyond `tol` for head `h` whose values are `x` and `y`: the larger
    /// of the two traces' slacks (a trace without one allows none).
    fn relative(&self, h: usize, x: f32, y: f32) -> f64 {
        let larger =
            |p: &[f32], q: &[f32]| p.get(h).copied().unwrap_or(0.0).max(q.get(h).copied().unwrap_or(0.0)) as f64;
        match self {
            Slack::None => 0.0,
            Slack::Relative(p, q) => larger(p, q),
            Slack::Absolute(p, q) => larger(p, q) / (x.abs().max(y.abs()) as f64).max(1e-12),
        }
    }
}

fn differences(name: &str, p: &[f32], q: &[f32], slack: Slack, tol: f64) -> Vec<Difference> {
    p.iter()
        .zip(q)
        .enumerate()
        .filter_map(|(h, (&x, &y))| {
            let diff = rel_diff(x, y);
            let allow = slack.relative(h, x, y);
            let rounding = if allow > 0.0 { format!("; rounding allows {allow:.2e} more") } else { String::new() };
            (diff > 0.0).then(|| Difference {
                diff,
                score: diff / (tol + allow),
                text: format!("{name} head {h}: {x} vs {y} ({diff:.2e}{rounding})"),
            })
        })
        .collect()
}

/// Two traces compared layer by layer: what differs in their shape, then per GDN layer where
/// they part (or that they agree), and the first divergence.
#[derive(Debug, Serialize)]
pub struct Comparison {
    /// Why the tolerance is what it is, when it came from the traces rather than --tolerance.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerance_from: Option<String>,
    /// Relative.
    pub tolerance: f64,
    /// The passes compared: the prompt's and those of the tokens both traces share.
    pub passes: usize,
    /// Generated tokens both traces agree on, from the first.
    pub same_tokens: usize,
    /// How the traces differ in shape (cut short, a layer or a head missing).
    pub shape: Vec<String>,
    pub layers: Vec<LayerComparison>,
    /// The earliest pass any layer diverges at (the first such layer).
    pub first_divergence: Option<FirstDivergence>,
    /// They differ: in shape, or past the tolerance in some layer.
    pub diverged: bool,
}

/// One GDN layer of two traces.
#[derive(Debug, Serialize)]
pub struct LayerComparison {
    pub layer: usize,
    /// The first difference past what is allowed; `None`: the layer agrees.
    pub diverges: Option<Located>,
    /// The largest difference of any pass; `None`: identical.
    pub largest: Option<Located>,
}

/// A difference and the pass it is at ("prompt", or the token read).
#[derive(Debug, Serialize)]
pub struct Located {
    pub at: String,
    pub difference: String,
}

#[derive(Debug, Serialize)]
pub struct FirstDivergence {
    pub layer: usize,
    pub at: String,
}

/// Per GDN layer, the first pass where two traces differ by more than `tol` (β, g or ‖S‖ of
/// any head), up to where their tokens part (after that the inputs differ, not the kernels).
/// β and g may differ further by what one rounding step of their inputs explains, as the traces
/// record it (`beta_slack`, `g_slack`): two correct bf16 engines part by that much.
pub fn compare(a: &Trace, b: &Trace, tol: f64) -> Comparison {
    let same_tokens = a.tokens.iter().zip(&b.tokens).take_while(|(x, y)| x.id == y.id).count();
    // A state at token i was computed from tokens 0..=i: comparable while those agree.
    let comparable: Vec<(&StateEvent, &StateEvent)> = a
        .states
        .iter()
        .zip(&b.states)
        .take_while(|(x, y)| x.at_token == y.at_token && x.at_token.is_none_or(|i| i < same_tokens))
        .collect();
    let shape = shape_differences(a, b, same_tokens, &comparable);
    let layers = a.states.first().map_or(0, |e| e.gdn.len()).min(b.states.first().map_or(0, |e| e.gdn.len()));
    let mut first: Option<(usize, FirstDivergence)> = None;
    let mut compared = vec![];
    for li in 0..layers {
        let Some((layer, diverges_at)) = compare_layer(a, b, &comparable, li, tol) else { continue };
        if let (Some(i), Some(d)) = (diverges_at, &layer.diverges)
            && first.as_ref().is_none_or(|f| i < f.0)
        {
            first = Some((i, FirstDivergence { layer: layer.layer, at: d.at.clone() }));
        }
        compared.push(layer);
    }
    Comparison {
        tolerance_from: None,
        tolerance: tol,
        passes: comparable.len(),
        same_tokens,
        diverged: !shape.is_empty() || compared.iter().any(|l| l.diverges.is_some()),
        shape,
        layers: compared,
        first_divergence: first.map(|(_, f)| f),
    }
}

/// What differs in shape is a divergence of its own, said first: a trace cut short, a layer or
/// a head missing. Nothing is called agreeing that was not compared.
fn shape_differences(
    a: &Trace,
    b: &Trace,
    same_tokens: usize,
    comparable: &[(&StateEvent, &StateEvent)],
) -> Vec<String> {
    let mut shape = vec![];
    if same_tokens == a.tokens.len().min(b.tokens.len()) && a.tokens.len() != b.tokens.len() {
        shape.push(format!(
            "A has {} generated tokens and B {}: one trace is cut short (its tokens agree while both last)",
            a.tokens.len(),
            b.tokens.len()
        ));
    }
    let passes = |t: &Trace| t.states.iter().filter(|s| s.at_token.is_none_or(|i| i < same_tokens)).count();
    if passes(a) != passes(b) {
        shape.push(format!(
            "A has {} state passes and B {} over the tokens they share{}",
            passes(a),
            passes(b),
            if passes(a).min(passes(b)) == 1 { " (one ends after its prompt pass)" } else { "" }
        ));
    }
    let layer_ids = |t: &Trace| t.states.first().map(|e| e.gdn.iter().map(|l| l.layer).collect::<Vec<_>>());
    let (la, lb) = (layer_ids(a).unwrap_or_default(), layer_ids(b).unwrap_or_default());
    if la != lb {
        let only =
            |x: &[usize], y: &[usize]| x.iter().filter(|l| !y.contains(l)).map(usize::to_string).collect::<Vec<_>>();
        shape.push(format!(
            "the traces have {} and {} GDN layers (only in A: [{}]; only in B: [{}])",
            la.len(),
            lb.len(),
            only(&la, &lb).join(", "),
            only(&lb, &la).join(", ")
        ));
    }
    // The first pass where a layer's head counts differ (said once per layer of that pass).
    for (x, y) in comparable {
        for (lx, ly) in x.gdn.iter().zip(&y.gdn).filter(|(lx, ly)| lx.layer == ly.layer) {
            if lx.beta.len() != ly.beta.len() {
                shape.push(format!("layer {}: A has {} heads and B {}", lx.layer, lx.beta.len(), ly.beta.len()));
            }
        }
        if shape.iter().any(|l| l.contains(" heads and B ")) {
            break;
        }
    }
    shape
}

/// The `li`-th GDN layer of both traces over the comparable passes, with the pass it first
/// diverges at; `None` when the traces' layers there are not the same layer with the same heads
/// (a shape difference, said apart).
fn compare_layer(
    a: &Trace,
    b: &Trace,
    comparable: &[(&StateEvent, &StateEvent)],
    li: usize,
    tol: f64,
) -> Option<(LayerComparison, Option<usize>)> {
    let layer = a.states[0].gdn[li].layer;
    if b.states[0].gdn[li].layer != layer || a.states[0].gdn[li].beta.len() != b.states[0].gdn[li].beta.len() {
        return None;
    }
    // Per pass, the largest difference of any head (β, g, ‖S‖) and the largest of those past
    // what they are allowed (a divergence).
    let passes: Vec<(Option<Difference>, Option<Difference>)> = comparable
        .iter()
        .map(|(x, y)| {
            let (lx, ly) = (&x.gdn[li], &y.gdn[li]);
            let all: Vec<Difference> = [
                differences("β", &lx.beta, &ly.beta, Slack::Absolute(&lx.beta_slack, &ly.beta_slack), tol),
                differences("g", &lx.g, &ly.g, Slack::Relative(&lx.g_slack, &ly.g_slack), tol),
                differences("‖S‖", &lx.state_norm, &ly.state_norm, Slack::None, tol),
            ]
            .concat();
            (largest(all.iter()).cloned(), largest(all.iter().filter(|d| d.score > 1.0)).cloned())
        })
        .collect();
    let at = |i: usize| a.token_text(comparable[i].0.at_token);
    let largest = largest(passes.iter().filter_map(|(l, _)| l.as_ref())).map(|d| {
        let i = passes.iter().position(|(l, _)| l.as_ref().is_some_and(|l| std::ptr::eq(l, d))).unwrap_or(0);
        Located { at: at(i), difference: d.text.clone() }
    });
    let diverges_at = passes.iter().position(|(_, past)| past.is_some());
    let diverges = diverges_at
        .map(|i| Located { at: at(i), difference: passes[i].1.as_ref().map_or(String::new(), |d| d.text.clone()) });
    Some((LayerComparison { layer, diverges, largest }, diverges_at))
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(why) = &self.tolerance_from {
            writeln!(f, "tolerance {:e} from the traces' arithmetic: {why}", self.tolerance)?;
        }
        writeln!(
            f,
            "comparing {} passes (the prompt and {} tokens; the generated tokens agree for {}), tolerance {:e} relative",
            self.passes,
            self.passes.saturating_sub(1),
            self.same_tokens,
            self.tolerance
        )?;
        for line in &self.shape {
            writeln!(f, "DIFFERS: {line}")?;
        }
        for l in &self.layers {
            let largest = match &l.largest {
                Some(d) => format!("largest at {}: {}", d.at, d.difference),
                None => "identical".to_string(),
            };
            match &l.diverges {
                Some(d) => {
                    writeln!(f, "layer {:>3}: diverges at {}: {}", l.layer, d.at, d.difference)?;
                    writeln!(f, "           {largest}")?;
                }
                None => writeln!(f, "layer {:>3}: agrees ({largest})", l.layer)?,
            }
        }
        match &self.first_divergence {
            Some(d) => writeln!(f, "first divergence: layer {} at {} (later layers inherit it)", d.layer, d.at),
            None if self.diverged => {
                writeln!(f, "the traces differ in shape (above): the layers compared agree, the rest could not be")
            }
            None => writeln!(f, "the traces agree"),
        }
    }
}

impl Report for Comparison {
    fn print_human(&self, out: &mut dyn Write) -> std::io::Result<()> {
        write!(out, "{self}")
    }
}

/// A colour for `x` in 0..=1 (viridis, five stops): reads on light and dark backgrounds.
pub fn viridis(x: f32) -> (u8, u8, u8) {
    const STOPS: [(f32, f32, f32); 5] =
        [(68.0, 1.0, 84.0), (59.0, 82.0, 139.0), (33.0, 145.0, 140.0), (94.0, 201.0, 98.0), (253.0, 231.0, 37.0)];
    let x = if x.is_finite() { x.clamp(0.0, 1.0) } else { 1.0 };
    let p = x * 4.0;
    let i = (p.floor() as usize).min(3);
    let f = p - i as f32;
    let (a, b) = (STOPS[i], STOPS[i + 1]);
    let mix = |u: f32, v: f32| (u + (v - u) * f).round() as u8;
    (mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// Minimum and maximum of the finite values (0..1 when there are none).
fn range(values: impl Iterator<Item = f32>) -> (f32, f32) {
    let (lo, hi) = values.filter(|v| v.is_finite()).fold((f32::MAX, f32::MIN), |(l, h), v| (l.min(v), h.max(v)));
    if lo > hi {
        (0.0, 1.0)
    } else if lo == hi {
        (lo, lo + 1e-6)
    } else {
        (lo, hi)
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A value back from the plot's scale (half-lives are drawn as log10 tokens).
fn unscaled(metric: StateMetric, v: f32) -> String {
    match metric {
        StateMetric::HalfLife => format!("{} tok", sig4(10f32.powf(v))),
        _ => sig4(v),
    }
}

/// Ten colours that tell lines apart (Tableau 10), then viridis for more heads.
fn line_colour(h: usize, n: usize) -> (u8, u8, u8) {
    const TAB10: [(u8, u8, u8); 10] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (127, 127, 127),
        (188, 189, 34),
        (23, 190, 207),
    ];
    if n <= TAB10.len() { TAB10[h] } else { viridis(h as f32 / (n - 1) as f32 * 0.95) }
}

/// The plot's left margin and the heat map's top edge.
const LEFT: f32 = 70.0;
const TOP: f32 = 44.0;
/// The line chart's size.
const LINE_W: f32 = 720.0;
const LINE_H: f32 = 240.0;

/// The SVG: a layers × heads heat map of `metric` at the last pass (with its colour scale), and
/// the metric of every head of `layer` over the passes (with its axes and a legend of heads).
pub fn plot(t: &Trace, metric: StateMetric, layer: usize) -> anyhow::Result<String> {
    let last = t.states.last().context("no state events")?;
    let li = last
        .gdn
        .iter()
        .position(|l| l.layer == layer)
        .with_context(|| format!("--layer {layer} is not a GDN layer of this trace"))?;
    let map = HeatMap::of(last);
    let width = (LEFT + map.w.max(LINE_W) + 120.0).ceil();
    // Title, the map (at least the colour bar's 60), its note, the chart's title, the chart, ticks.
    let height = (TOP + map.h.max(60.0) + 18.0 + 44.0 + LINE_H + 30.0).ceil();
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let note_y = map.draw(&mut s, t, last, metric);
    head_chart(&mut s, t, metric, layer, li, note_y + 44.0);
    let _ = writeln!(s, "</svg>");
    Ok(s)
}

/// The heat map's size: a square cell per head, a row per GDN layer.
struct HeatMap {
    heads: usize,
    cell: f32,
    w: f32,
    h: f32,
}

impl HeatMap {
    fn of(last: &StateEvent) -> Self {
        let heads = last.gdn.iter().map(|l| l.beta.len()).max().unwrap_or(1);
        let cell = (600.0 / heads as f32).clamp(6.0, 36.0);
        HeatMap { heads, cell, w: heads as f32 * cell, h: last.gdn.len() as f32 * cell }
    }

    /// The map of `metric` at the pass `last` with its title, colour scale and note; returns the
    /// note's height (the chart goes below it).
    fn draw(&self, s: &mut String, t: &Trace, last: &StateEvent, metric: StateMetric) -> f32 {
        let (lo, hi) =
            range(last.gdn.iter().flat_map(|l| (0..l.beta.len()).map(move |h| metric.scaled(metric.value(l, h)))));
        let _ = writeln!(
            s,
            r#"<text x="{LEFT}" y="18" font-size="13">{} at {} — GDN layers × value heads</text>"#,
            escape(metric.label()),
            escape(&t.token_text(last.at_token)),
        );
        for h in 0..self.heads {
            if self.heads <= 16 || h % 8 == 0 {
                let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">h{h}</text>"#, LEFT + h as f32 * self.cell, TOP - 6.0);
            }
        }
        for (r, l) in last.gdn.iter().enumerate() {
            self.row(s, r, l, metric, (lo, hi));
        }
        self.colour_scale(s, metric, (lo, hi));
        let ly = TOP + self.h.max(60.0) + 18.0;
        let _ = writeln!(
            s,
            "<text x=\"{LEFT}\" y=\"{ly:.1}\">red outline: forgets within {FORGETS_WITHIN} tokens · blue outline: keeps half past {KEEPS_PAST} tokens{}</text>",
            if metric == StateMetric::HalfLife { " · colours on a log scale" } else { "" }
        );
        ly
    }

    /// Row `r`: layer `l`'s heads coloured on the scale `lo..hi`, outlined where a head forgets
    /// fast (red) or keeps long (blue).
    fn row(&self, s: &mut String, r: usize, l: &GdnLayerState, metric: StateMetric, (lo, hi): (f32, f32)) {
        let cell = self.cell;
        let y = TOP + r as f32 * cell;
        let _ = writeln!(s, r#"<text x="4" y="{:.1}">L{}</text>"#, y + cell * 0.5 + 4.0, l.layer);
        for h in 0..l.beta.len() {
            let v = metric.value(l, h);
            let (cr, cg, cb) = viridis((metric.scaled(v) - lo) / (hi - lo));
            let mark = match memory_of(l.half_life(h)) {
                HeadMemory::Forgets => " stroke=\"#d00\" stroke-width=\"1.5\"",
                HeadMemory::Keeps => " stroke=\"#00d\" stroke-width=\"1.5\"",
                HeadMemory::Between => "",
            };
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="rgb({cr},{cg},{cb})"{mark}><title>L{} head {h}: {v}</title></rect>"#,
                LEFT + h as f32 * cell,
                cell - 1.0,
                cell - 1.0,
                l.layer
            );
        }
    }

    /// The colour scale beside the map, in the metric's own units.
    fn colour_scale(&self, s: &mut String, metric: StateMetric, (lo, hi): (f32, f32)) {
        let bar_h = self.h.max(60.0);
        let bx = LEFT + self.w + 16.0;
        for i in 0..20 {
            let (cr, cg, cb) = viridis(1.0 - i as f32 / 19.0);
            let _ = writeln!(
                s,
                r#"<rect x="{bx:.1}" y="{:.1}" width="12" height="{:.1}" fill="rgb({cr},{cg},{cb})"/>"#,
                TOP + i as f32 * bar_h / 20.0,
                bar_h / 20.0 + 0.5
            );
        }
        let _ =
            writeln!(s, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, bx + 16.0, TOP + 9.0, escape(&unscaled(metric, hi)));
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
            bx + 16.0,
            TOP + bar_h,
            escape(&unscaled(metric, lo))
        );
    }
}

/// The metric over the passes for one layer, one line per head, in a frame whose top is `y0`.
fn head_chart(s: &mut String, t: &Trace, metric: StateMetric, layer: usize, li: usize, y0: f32) {
    let heads = t.states.last().map_or(0, |e| e.gdn[li].beta.len());
    let series: Vec<Vec<f32>> =
        (0..heads).map(|h| t.states.iter().map(|e| metric.scaled(metric.value(&e.gdn[li], h))).collect()).collect();
    let (lo, hi) = range(series.iter().flatten().copied());
    let _ = writeln!(
        s,
        r#"<text x="{LEFT}" y="{:.1}" font-size="13">layer {layer}: {} of every head over {} passes (the prompt first)</text>"#,
        y0 - 12.0,
        escape(metric.label()),
        t.states.len(),
    );
    let _ =
        writeln!(s, r##"<rect x="{LEFT}" y="{y0:.1}" width="{LINE_W}" height="{LINE_H}" fill="none" stroke="#888"/>"##);
    let _ = writeln!(s, r#"<text x="4" y="{:.1}">{}</text>"#, y0 + 10.0, escape(&unscaled(metric, hi)));
    let _ = writeln!(s, r#"<text x="4" y="{:.1}">{}</text>"#, y0 + LINE_H, escape(&unscaled(metric, lo)));
    pass_ticks(s, t, y0);
    for (h, ys) in series.iter().enumerate() {
        head_line(s, (h, series.len()), ys, (lo, hi), y0);
    }
}

/// Where pass `i` of `passes` sits on the chart's x axis.
fn pass_x(i: usize, passes: usize) -> f32 {
    LEFT + i as f32 / (passes.max(2) as f32 - 1.0) * LINE_W
}

/// Ticks under the chart: the prompt, then every eighth of the passes, labelled with the token
/// read.
fn pass_ticks(s: &mut String, t: &Trace, y0: f32) {
    let step = (t.states.len() / 8).max(1);
    for (i, e) in t.states.iter().enumerate().step_by(step) {
        let label = match e.at_token {
            None => "prompt".to_string(),
            Some(a) => format!("#{a}"),
        };
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#888"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            y0 + LINE_H,
            y0 + LINE_H + 4.0,
            y0 + LINE_H + 16.0,
            escape(&label),
            x = pass_x(i, t.states.len())
        );
    }
}

/// Head `h` of `n`: its values over the passes as a line on the scale `lo..hi` (non-finite
/// values left out), and its key in the legend.
fn head_line(s: &mut String, (h, n): (usize, usize), ys: &[f32], (lo, hi): (f32, f32), y0: f32) {
    let (cr, cg, cb) = line_colour(h, n);
    let pts: Vec<String> = ys
        .iter()
        .enumerate()
        .filter(|(_, v)| v.is_finite())
        .map(|(i, v)| format!("{:.1},{:.1}", pass_x(i, ys.len()), y0 + LINE_H - (v - lo) / (hi - lo) * LINE_H))
        .collect();
    let _ = writeln!(
        s,
        r#"<polyline fill="none" stroke="rgb({cr},{cg},{cb})" stroke-width="1.2" points="{}"><title>head {h}</title></polyline>"#,
        pts.join(" ")
    );
    // A legend for the first 24 heads (more would run off the chart).
    if h < 24 {
        let ky = y0 + 8.0 + h as f32 * 13.0;
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{:.1}" width="10" height="3" fill="rgb({cr},{cg},{cb})"/><text x="{:.1}" y="{ky:.1}">h{h}</text>"#,
            LEFT + LINE_W + 10.0,
            ky - 4.0,
            LEFT + LINE_W + 24.0
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltascope_protocol::GdnLayerState;

    fn event(at: Option<usize>, beta: f32, norm: f32) -> StateEvent {
        StateEvent {
            at_token: at,
            tokens: 1,
            position: at.map_or(3, |i| 4 + i),
            gdn: vec![
                GdnLayerState {
                    layer: 0,
                    beta: vec![0.5, 0.5],
                    g: vec![-0.1, -5.0],
                    retention: vec![0.9, 0.0067],
                    state_norm: vec![1.0, 1.0],
                    delta_ratio: vec![0.1, 0.9],
                    nonfinite: vec![0, 0],
                    g_slack: vec![],
                    beta_slack: vec![],
                },
                GdnLayerState {
                    layer: 1,
                    beta: vec![beta, 0.5],
                    g: vec![-0.1, -1e-4],
                    retention: vec![0.9, 1.0],
                    state_norm: vec![norm, 1.0],
                    delta_ratio: vec![0.1, 0.0],
                    nonfinite: vec![0, 0],
                    g_slack: vec![],
                    beta_slack: vec![],
                },
            ],
            attention: vec![],
        }
    }

    /// A trace whose generated tokens are ids 0, 1, … (one per state event after the prompt).
    fn trace(events: Vec<StateEvent>) -> Trace {
        let tokens = (0..events.len().saturating_sub(1))
            .map(|i| serde_json::from_value(serde_json::json!({"phase": "thinking", "id": i, "text": "x"})).unwrap())
            .collect();
        Trace { states: events, tokens, numerics: None }
    }

    #[test]
    fn compare_names_the_layer_and_token_where_traces_part() {
        let a = trace(vec![event(None, 0.5, 1.0), event(Some(0), 0.5, 1.0), event(Some(1), 0.5, 1.0)]);
        let same = compare(&a, &trace(a.states.clone()), 1e-3);
        assert!(!same.diverged, "{}", same);
        assert!(same.to_string().contains("the traces agree"));
        assert!(same.to_string().contains("layer   1: agrees (identical)"), "{}", same);
        let b = trace(vec![event(None, 0.5, 1.0), event(Some(0), 0.5, 1.0), event(Some(1), 0.6, 1.0)]);
        let c = compare(&a, &b, 1e-3);
        assert!(c.diverged);
        assert!(c.to_string().contains("layer   0: agrees"), "{}", c);
        assert!(c.to_string().contains("layer   1: diverges at #1"), "{}", c);
        assert!(c.to_string().contains("first divergence: layer 1 at #1"), "{}", c);
        // Beside the first difference past the tolerance, the largest one.
        assert!(c.to_string().contains("largest at #1 \"x\": β head 0: 0.5 vs 0.6"), "{}", c);
        // A NaN against a number is a divergence however loose the tolerance.
        let n = trace(vec![event(None, 0.5, f32::NAN)]);
        assert!(compare(&trace(vec![event(None, 0.5, 1.0)]), &n, 10.0).diverged);
    }

    /// Two bf16 engines part by one rounding step of a gate's input: the g of a head whose a
    /// reaches 7 (a bf16 step 2⁻⁵) by e^(2⁻⁵) − 1 = 3.2e-2, past a 2e-2 tolerance. With the slack
    /// the traces record that is agreement; two steps, or a difference in ‖S‖, still diverge.
    #[test]
    fn a_rounding_step_of_a_gate_input_is_not_a_divergence() {
        let step = (2f32.powi(-5)).exp_m1();
        let with = |g: f32, beta: f32, slack: bool| {
            let mut e = event(Some(0), beta, 1.0);
            e.gdn[1].g[1] = g;
            if slack {
                e.gdn[1].g_slack = vec![1e-6, step];
                e.gdn[1].beta_slack = vec![2f32.powi(-9) + 2f32.powi(-8), 0.0];
            }
            trace(vec![event(None, 0.5, 1.0), e])
        };
        let base = with(-0.0135, 0.5, false);
        let one_step = -0.0135 * (1.0 + step);
        let c = compare(&base, &with(one_step, 0.5, false), 2e-2);
        assert!(c.diverged, "no slack recorded: {}", c);
        let c = compare(&base, &with(one_step, 0.5, true), 2e-2);
        assert!(!c.diverged, "{}", c);
        assert!(c.to_string().contains("rounding allows 3.17e-2 more"), "{}", c);
        // Either trace's slack counts (a trace of an engine without it against one with it).
        assert!(!compare(&with(one_step, 0.5, true), &base, 2e-2).diverged);
        let c = compare(&base, &with(-0.0135 * (1.0 + step).powi(2), 0.5, true), 2e-2);
        assert!(c.diverged && c.to_string().contains("layer   1: diverges at #0"), "{}", c);
        // β: a step of β (2⁻⁸ at 0.5) and a quarter step of b are allowed, absolutely.
        let c = compare(&base, &with(-0.0135, 0.5 + 2f32.powi(-8), true), 2e-3);
        assert!(!c.diverged, "{}", c);
        assert!(compare(&base, &with(-0.0135, 0.5 + 2f32.powi(-7), true), 2e-3).diverged);
        let mut norm = with(one_step, 0.5, true);
        norm.states[1].gdn[1].state_norm[0] = 1.03;
        assert!(compare(&base, &norm, 2e-2).diverged, "‖S‖ gets no rounding slack");
    }

    /// Issue 35, item 6: a trace cut after its prompt pass, one missing a head, one missing a
    /// layer: each a divergence that says what differs, never "the traces agree".
    #[test]
    fn traces_of_other_shapes_are_divergences() {
        let a = trace(vec![event(None, 0.5, 1.0), event(Some(0), 0.5, 1.0), event(Some(1), 0.5, 1.0)]);
        let cut = Trace { states: vec![event(None, 0.5, 1.0)], tokens: vec![], numerics: None };
        let c = compare(&a, &cut, 1e-3);
        assert!(c.diverged, "{}", c);
        assert!(c.to_string().contains("DIFFERS: A has 2 generated tokens and B 0: one trace is cut short"), "{}", c);
        assert!(!c.to_string().contains("the traces agree"), "{}", c);
        let mut fewer = trace(a.states.clone());
        for l in fewer.states.iter_mut().flat_map(|e| e.gdn.iter_mut()).filter(|l| l.layer == 1) {
            for v in [&mut l.beta, &mut l.g, &mut l.retention, &mut l.state_norm, &mut l.delta_ratio] {
                v.pop();
            }
            l.nonfinite.pop();
        }
        let c = compare(&a, &fewer, 1e-3);
        assert!(c.diverged && c.to_string().contains("DIFFERS: layer 1: A has 2 heads and B 1"), "{}", c);
        assert!(c.to_string().contains("layer   0: agrees") && !c.to_string().contains("layer   1: agrees"), "{}", c);
        let mut missing = trace(a.states.clone());
        for e in &mut missing.states {
            e.gdn.pop();
        }
        let c = compare(&a, &missing, 1e-3);
        assert!(c.diverged, "{}", c);
        assert!(
            c.to_string().contains("DIFFERS: the traces have 2 and 1 GDN layers (only in A: [1]; only in B: [])"),
            "{}",
            c
        );
        assert!(!c.to_string().contains("the traces agree"), "{}", c);
        // The tolerance is a finite number > 0.
        assert!(tolerance("1e-3").is_ok());
        for bad in ["-1", "0", "NaN", "inf", "x"] {
            assert!(tolerance(bad).is_err(), "{bad}");
        }
    }

    /// The default tolerance follows the arithmetic both traces record: none for the same
    /// arithmetic, f32 reordering for two f32 engines, whole bf16 steps where bf16 is involved,
    /// and the old 1e-3 (said) for traces that record nothing.
    #[test]
    fn the_default_tolerance_follows_the_recorded_arithmetic() {
        let n = |device: &str, dtype: &str, kernel: &str| Numerics {
            device: device.into(),
            dtype: dtype.into(),
            kernel: kernel.into(),
        };
        let t = |a: &Numerics, b: &Numerics| derived_tolerance(Some(a), Some(b)).0;
        assert_eq!(t(&n("cpu", "bf16", "avx2"), &n("cpu", "bf16", "avx2")), 1e-6);
        assert_eq!(t(&n("cpu", "f32", "avx2"), &n("cpu", "f32", "amx")), 1e-3);
        assert_eq!(t(&n("emu:0", "bf16", "emu"), &n("cpu", "bf16", "amx")), 16.0 / 256.0);
        assert_eq!(t(&n("cpu", "f32", "avx2"), &n("cpu", "bf16", "avx2")), 16.0 / 256.0);
        let (old, why) = derived_tolerance(None, Some(&n("cpu", "f32", "avx2")));
        assert!(old == 1e-3 && why.contains("records no device"), "{why}");
        let (_, why) = derived_tolerance(Some(&n("emu:0", "bf16", "emu")), Some(&n("cpu", "bf16", "amx")));
        assert_eq!(why, "bf16 (emu:0 bf16 emu vs cpu bf16 amx): 16 bf16 rounding steps of 2⁻⁸");
    }

    #[test]
    fn summary_marks_heads_and_raises_the_alarm() {
        let s = summary(&trace(vec![event(None, 0.5, 1.0), event(Some(0), 0.5, 1.0)])).to_string();
        // Layer 0: head 1 forgets (half-life 0.14); layer 1: head 1 keeps (6931 tokens).
        let row = |layer: &str| {
            let l = s.lines().find(|l| l.trim_start().starts_with(layer)).unwrap_or_default();
            l.split_whitespace().map(str::to_string).collect::<Vec<_>>()
        };
        // layer, heads, β mean, half-lives (tokens) min / median / max, ‖S‖ max, ‖ΔS‖/‖S‖ mean over
        // the tokens, heads that forget / keep
        assert_eq!(row("0 "), ["0", "2", "0.5", "0.1386", "6.931", "6.931", "1", "0.5", "1", "0"], "{s}");
        assert_eq!(row("1 "), ["1", "2", "0.5", "6.931", "6931", "6931", "1", "0.05", "0", "1"], "{s}");
        assert!(s.contains("no alarm"));
        let s = summary(&trace(vec![event(None, 0.5, 1.0), event(Some(0), 0.5, 3e4)])).to_string();
        assert!(s.contains("ALARM at #0 \"x\": layer 1 head 0"), "{s}");
    }

    #[test]
    fn the_plot_is_an_svg_with_a_cell_per_head() {
        let t = trace(vec![event(None, 0.5, 1.0), event(Some(0), 0.4, 2.0)]);
        let svg = plot(&t, StateMetric::HalfLife, 1).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<title>L").count(), 4);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(plot(&t, StateMetric::Beta, 7).is_err());
        assert_eq!(viridis(0.0), (68, 1, 84));
        assert_eq!(viridis(1.0), (253, 231, 37));
    }
}
