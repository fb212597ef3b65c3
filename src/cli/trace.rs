//! `deltascope trace`: the state scope, headless. Generates with the state trace on and writes
//! it (JSON Lines, the `run --json` event schema), summarises it per layer, draws it as SVG, and
//! compares two traces layer by layer (`--compare A B`: which layer parts ways first).

use std::fmt::Write as _;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;

use super::common::{self, GenArgs, ModelArgs, PromptArgs};
use super::interrupt::Interrupt;
use crate::backend::ChatRequest;
use deltascope_model::{short_bytes, sig4};
use deltascope_protocol::{DiagnosticKind, EngineEvent, FinishReason, Numerics, StateEvent, StateMetric, TokenEvent};
use deltascope_protocol::{EXPLODED_NORM, FORGETS_WITHIN, HeadMemory, KEEPS_PAST, memory_of};

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
    pub generation: GenArgs,
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
    if let Some(files) = &a.compare {
        let (x, y) = (Trace::read(&files[0])?, Trace::read(&files[1])?);
        let tol = match a.tolerance {
            Some(t) => t,
            None => {
                let (t, why) = derived_tolerance(x.numerics.as_ref(), y.numerics.as_ref());
                println!("tolerance {t:e} from the traces' arithmetic: {why}");
                t
            }
        };
        let report = compare(&x, &y, tol);
        print!("{}", report.text);
        if report.diverged {
            std::process::exit(1);
        }
        return Ok(());
    }
    let text = a.prompt.as_deref().context("--prompt is needed (or --compare A B)")?;
    // A plot that cannot be written (or is not named *.svg) fails now, not after the generation.
    if let Some(path) = &a.plot {
        common::check_plot_path(path)?;
    }
    let prompt = common::prompt(Some(text), None, &a.prompt_opts)?;
    let backend = common::open(&a.model)?;
    let mut overrides = a.generation.overrides()?.without_thinking_if(a.prompt_opts.no_think);
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
    let mut out = std::io::stdout().lock();
    let mut trace = Trace::default();
    let mut finish = None;
    let mut diagnostics = vec![];
    for ev in generation.events().iter() {
        let line = serde_json::to_string(&ev)?;
        if a.json {
            writeln!(out, "{line}")?;
        }
        if let Some(f) = file.as_mut() {
            writeln!(f, "{line}")?;
        }
        trace.push(&ev);
        match ev {
            EngineEvent::Done(d) => {
                finish = Some(d.finish_reason);
                break;
            }
            EngineEvent::Error(e) => bail!("{}", e.message),
            EngineEvent::Diagnostic(d) => diagnostics.push(d),
            // The prompt's pass names the GDN layers: a --layer that is not one fails now, not
            // after the whole generation.
            EngineEvent::State(s) if trace.states.len() == 1 => {
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
    if let Some(mut f) = file {
        f.flush()?;
    }
    // What went wrong (a pass that went non-finite, a state alarm) is said whatever else is.
    let said: Vec<String> = diagnostics.iter().map(|d| format!("{}: {}", d.kind.as_str(), d.message)).collect();
    if trace.states.is_empty() {
        match said.is_empty() {
            true => bail!("the engine sent no state events"),
            false => bail!("the engine sent no state events; {}", said.join("; ")),
        }
    }
    if !a.json {
        write!(out, "{}", summary(&trace))?;
        for line in &said {
            writeln!(out, "{line}")?;
        }
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
        let why =
            diagnostics.iter().find(|d| d.kind == DiagnosticKind::Nonfinite).map_or("an error", |d| d.kind.as_str());
        bail!("the generation stopped after {} tokens ({why}; above)", trace.tokens.len());
    }
    Ok(())
}

/// Per GDN layer, at the last token and over the whole trace; the alarms.
pub fn summary(t: &Trace) -> String {
    let mut s = String::new();
    // The last complete pass (a pass that went non-finite stops at the failing layer: its
    // ✖ heads are in the alarm below).
    let layers = t.states.iter().map(|e| e.gdn.len()).max().unwrap_or(0);
    let Some(last) = t.states.iter().rev().find(|e| e.gdn.len() == layers) else { return s };
    let _ = writeln!(
        s,
        "state trace: {} passes (the prompt, then {} tokens), position {}",
        t.states.len(),
        t.states.len() - 1,
        last.position
    );
    let _ = writeln!(
        s,
        "layer heads  β mean  half-life min  median      max  ‖S‖ max  ‖ΔS‖/‖S‖  forget<{FORGETS_WITHIN}  keep>{KEEPS_PAST}"
    );
    for (li, l) in last.gdn.iter().enumerate() {
        let heads = l.beta.len();
        let mut hl: Vec<f32> = (0..heads).map(|h| l.half_life(h)).collect();
        hl.sort_by(f32::total_cmp);
        // Over every pass that ran this layer (a failed pass may have stopped before it).
        let norm_max = t
            .states
            .iter()
            .filter_map(|e| e.gdn.get(li))
            .flat_map(|g| g.state_norm.iter().copied())
            .fold(0f32, f32::max);
        let tokens: Vec<_> = t.states[1.min(t.states.len() - 1)..].iter().filter_map(|e| e.gdn.get(li)).collect();
        let delta_mean = tokens.iter().flat_map(|g| g.delta_ratio.iter()).map(|&d| d as f64).sum::<f64>()
            / (tokens.len() * heads).max(1) as f64;
        let forgets = hl.iter().filter(|&&h| memory_of(h) == HeadMemory::Forgets).count();
        let keeps = hl.iter().filter(|&&h| memory_of(h) == HeadMemory::Keeps).count();
        let _ = writeln!(
            s,
            "{:>5} {:>5}  {:>6}  {:>13}  {:>6}  {:>7}  {:>7}  {:>8}  {:>8}  {:>9}",
            l.layer,
            heads,
            sig4(l.beta.iter().sum::<f32>() / heads as f32),
            sig4(hl[0]),
            sig4(hl[heads / 2]),
            sig4(hl[heads - 1]),
            sig4(norm_max),
            sig4(delta_mean as f32),
            forgets,
            keeps
        );
    }
    for a in &last.attention {
        let _ = writeln!(s, "{:>5} attention: KV {} tokens, {}", a.layer, a.kv_len, short_bytes(a.kv_bytes as u64));
    }
    match t.states.iter().find_map(|e| e.alarm(EXPLODED_NORM).map(|a| (e.at_token, a))) {
        Some((at, (layer, head, what))) => {
            let _ = writeln!(s, "ALARM at {}: layer {layer} head {head}: {what}", t.token_text(at));
        }
        None => {
            let _ = writeln!(s, "no alarm: every state finite, ‖S‖ below {EXPLODED_NORM:.0e}");
        }
    }
    s
}

pub struct Comparison {
    pub text: String,
    pub diverged: bool,
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

/// Per GDN layer, the first pass where two traces differ by more than `tol` (β, g or ‖S‖ of
/// any head), up to where their tokens part (after that the inputs differ, not the kernels).
/// β and g may differ further by what one rounding step of their inputs explains, as the traces
/// record it (`beta_slack`, `g_slack`): two correct bf16 engines part by that much.
pub fn compare(a: &Trace, b: &Trace, tol: f64) -> Comparison {
    let mut s = String::new();
    let same_tokens = a.tokens.iter().zip(&b.tokens).take_while(|(x, y)| x.id == y.id).count();
    // A state at token i was computed from tokens 0..=i: comparable while those agree.
    let comparable: Vec<(&StateEvent, &StateEvent)> = a
        .states
        .iter()
        .zip(&b.states)
        .take_while(|(x, y)| x.at_token == y.at_token && x.at_token.is_none_or(|i| i < same_tokens))
        .collect();
    let _ = writeln!(
        s,
        "comparing {} passes (the prompt and {} tokens; the generated tokens agree for {}), tolerance {tol:e} relative",
        comparable.len(),
        comparable.len().saturating_sub(1),
        same_tokens
    );
    // What differs in shape is a divergence of its own, said first: a trace cut short, a layer
    // or a head missing. Nothing is called agreeing that was not compared.
    let mut diverged = false;
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
    for (x, y) in &comparable {
        for (lx, ly) in x.gdn.iter().zip(&y.gdn).filter(|(lx, ly)| lx.layer == ly.layer) {
            if lx.beta.len() != ly.beta.len() {
                shape.push(format!("layer {}: A has {} heads and B {}", lx.layer, lx.beta.len(), ly.beta.len()));
            }
        }
        if shape.iter().any(|l| l.contains(" heads and B ")) {
            break;
        }
    }
    for line in &shape {
        diverged = true;
        let _ = writeln!(s, "DIFFERS: {line}");
    }
    let layers = a.states.first().map_or(0, |e| e.gdn.len()).min(b.states.first().map_or(0, |e| e.gdn.len()));
    let mut first: Option<(usize, usize, String)> = None;
    for li in 0..layers {
        let layer = a.states[0].gdn[li].layer;
        if b.states[0].gdn[li].layer != layer || a.states[0].gdn[li].beta.len() != b.states[0].gdn[li].beta.len() {
            continue;
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
        let overall = largest(passes.iter().filter_map(|(l, _)| l.as_ref()));
        let largest = match overall {
            Some(d) => {
                let i = passes.iter().position(|(l, _)| l.as_ref().is_some_and(|l| std::ptr::eq(l, d))).unwrap_or(0);
                format!("largest at {}: {}", a.token_text(comparable[i].0.at_token), d.text)
            }
            None => "identical".to_string(),
        };
        match passes.iter().position(|(_, past)| past.is_some()) {
            Some(i) => {
                diverged = true;
                let at = a.token_text(comparable[i].0.at_token);
                let text = passes[i].1.as_ref().map_or("", |d| d.text.as_str());
                let _ = writeln!(s, "layer {layer:>3}: diverges at {at}: {text}");
                let _ = writeln!(s, "           {largest}");
                if first.as_ref().is_none_or(|f| i < f.0) {
                    first = Some((i, layer, at));
                }
            }
            None => {
                let _ = writeln!(s, "layer {layer:>3}: agrees ({largest})");
            }
        }
    }
    match first {
        Some((_, layer, at)) => {
            let _ = writeln!(s, "first divergence: layer {layer} at {at} (later layers inherit it)");
        }
        None if diverged => {
            let _ = writeln!(s, "the traces differ in shape (above): the layers compared agree, the rest could not be");
        }
        None => {
            let _ = writeln!(s, "the traces agree");
        }
    }
    Comparison { text: s, diverged }
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

/// The SVG: a layers × heads heat map of `metric` at the last pass (with its colour scale), and
/// the metric of every head of `layer` over the passes (with its axes and a legend of heads).
pub fn plot(t: &Trace, metric: StateMetric, layer: usize) -> anyhow::Result<String> {
    let last = t.states.last().context("no state events")?;
    let li = last
        .gdn
        .iter()
        .position(|l| l.layer == layer)
        .with_context(|| format!("--layer {layer} is not a GDN layer of this trace"))?;
    let heads = last.gdn.iter().map(|l| l.beta.len()).max().unwrap_or(1);
    let cell = (600.0 / heads as f32).clamp(6.0, 36.0);
    let (map_w, map_h) = (heads as f32 * cell, last.gdn.len() as f32 * cell);
    let (line_w, line_h) = (720.0f32, 240.0f32);
    let (left, top) = (70.0f32, 44.0f32);
    let width = (left + map_w.max(line_w) + 120.0).ceil();
    // Title, the map (at least the colour bar's 60), its note, the chart's title, the chart, ticks.
    let height = (top + map_h.max(60.0) + 18.0 + 44.0 + line_h + 30.0).ceil();
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let scaled = |v: f32| metric.scaled(v);
    let (lo, hi) = range(last.gdn.iter().flat_map(|l| (0..l.beta.len()).map(move |h| scaled(metric.value(l, h)))));
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="18" font-size="13">{} at {} — GDN layers × value heads</text>"#,
        escape(metric.label()),
        escape(&t.token_text(last.at_token)),
    );
    for h in 0..heads {
        if heads <= 16 || h % 8 == 0 {
            let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">h{h}</text>"#, left + h as f32 * cell, top - 6.0);
        }
    }
    for (r, l) in last.gdn.iter().enumerate() {
        let y = top + r as f32 * cell;
        let _ = writeln!(s, r#"<text x="4" y="{:.1}">L{}</text>"#, y + cell * 0.5 + 4.0, l.layer);
        for h in 0..l.beta.len() {
            let v = metric.value(l, h);
            let (cr, cg, cb) = viridis((scaled(v) - lo) / (hi - lo));
            let mark = match memory_of(l.half_life(h)) {
                HeadMemory::Forgets => " stroke=\"#d00\" stroke-width=\"1.5\"",
                HeadMemory::Keeps => " stroke=\"#00d\" stroke-width=\"1.5\"",
                HeadMemory::Between => "",
            };
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="rgb({cr},{cg},{cb})"{mark}><title>L{} head {h}: {v}</title></rect>"#,
                left + h as f32 * cell,
                cell - 1.0,
                cell - 1.0,
                l.layer
            );
        }
    }
    // The colour scale, in the metric's own units.
    let bx = left + map_w + 16.0;
    for i in 0..20 {
        let (cr, cg, cb) = viridis(1.0 - i as f32 / 19.0);
        let _ = writeln!(
            s,
            r#"<rect x="{bx:.1}" y="{:.1}" width="12" height="{:.1}" fill="rgb({cr},{cg},{cb})"/>"#,
            top + i as f32 * map_h.max(60.0) / 20.0,
            map_h.max(60.0) / 20.0 + 0.5
        );
    }
    let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, bx + 16.0, top + 9.0, escape(&unscaled(metric, hi)));
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}">{}</text>"#,
        bx + 16.0,
        top + map_h.max(60.0),
        escape(&unscaled(metric, lo))
    );
    let ly = top + map_h.max(60.0) + 18.0;
    let _ = writeln!(
        s,
        "<text x=\"{left}\" y=\"{ly:.1}\">red outline: forgets within {FORGETS_WITHIN} tokens · blue outline: keeps half past {KEEPS_PAST} tokens{}</text>",
        if metric == StateMetric::HalfLife { " · colours on a log scale" } else { "" }
    );

    // The metric over the passes for one layer, one line per head.
    let series: Vec<Vec<f32>> = (0..last.gdn[li].beta.len())
        .map(|h| t.states.iter().map(|e| scaled(metric.value(&e.gdn[li], h))).collect())
        .collect();
    let (lo, hi) = range(series.iter().flatten().copied());
    let y0 = ly + 44.0;
    let _ = writeln!(
        s,
        r#"<text x="{left}" y="{:.1}" font-size="13">layer {layer}: {} of every head over {} passes (the prompt first)</text>"#,
        y0 - 12.0,
        escape(metric.label()),
        t.states.len(),
    );
    let _ =
        writeln!(s, r##"<rect x="{left}" y="{y0:.1}" width="{line_w}" height="{line_h}" fill="none" stroke="#888"/>"##);
    let _ = writeln!(s, r#"<text x="4" y="{:.1}">{}</text>"#, y0 + 10.0, escape(&unscaled(metric, hi)));
    let _ = writeln!(s, r#"<text x="4" y="{:.1}">{}</text>"#, y0 + line_h, escape(&unscaled(metric, lo)));
    let n = t.states.len().max(2) as f32 - 1.0;
    let x_of = |i: usize| left + i as f32 / n * line_w;
    // Ticks: the prompt, then every tenth of the passes, labelled with the token read.
    let step = (t.states.len() / 8).max(1);
    for (i, e) in t.states.iter().enumerate().step_by(step) {
        let label = match e.at_token {
            None => "prompt".to_string(),
            Some(a) => format!("#{a}"),
        };
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#888"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            y0 + line_h,
            y0 + line_h + 4.0,
            y0 + line_h + 16.0,
            escape(&label),
            x = x_of(i)
        );
    }
    for (h, ys) in series.iter().enumerate() {
        let (cr, cg, cb) = line_colour(h, series.len());
        let pts: Vec<String> = ys
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, v)| format!("{:.1},{:.1}", x_of(i), y0 + line_h - (v - lo) / (hi - lo) * line_h))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="rgb({cr},{cg},{cb})" stroke-width="1.2" points="{}"><title>head {h}</title></polyline>"#,
            pts.join(" ")
        );
        if h < 24 {
            let ky = y0 + 8.0 + h as f32 * 13.0;
            let _ = writeln!(
                s,
                r#"<rect x="{:.1}" y="{:.1}" width="10" height="3" fill="rgb({cr},{cg},{cb})"/><text x="{:.1}" y="{ky:.1}">h{h}</text>"#,
                left + line_w + 10.0,
                ky - 4.0,
                left + line_w + 24.0
            );
        }
    }
    let _ = writeln!(s, "</svg>");
    Ok(s)
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
        assert!(!same.diverged, "{}", same.text);
        assert!(same.text.contains("the traces agree"));
        assert!(same.text.contains("layer   1: agrees (identical)"), "{}", same.text);
        let b = trace(vec![event(None, 0.5, 1.0), event(Some(0), 0.5, 1.0), event(Some(1), 0.6, 1.0)]);
        let c = compare(&a, &b, 1e-3);
        assert!(c.diverged);
        assert!(c.text.contains("layer   0: agrees"), "{}", c.text);
        assert!(c.text.contains("layer   1: diverges at #1"), "{}", c.text);
        assert!(c.text.contains("first divergence: layer 1 at #1"), "{}", c.text);
        // Beside the first difference past the tolerance, the largest one.
        assert!(c.text.contains("largest at #1 \"x\": β head 0: 0.5 vs 0.6"), "{}", c.text);
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
        assert!(c.diverged, "no slack recorded: {}", c.text);
        let c = compare(&base, &with(one_step, 0.5, true), 2e-2);
        assert!(!c.diverged, "{}", c.text);
        assert!(c.text.contains("rounding allows 3.17e-2 more"), "{}", c.text);
        // Either trace's slack counts (a trace of an engine without it against one with it).
        assert!(!compare(&with(one_step, 0.5, true), &base, 2e-2).diverged);
        let c = compare(&base, &with(-0.0135 * (1.0 + step).powi(2), 0.5, true), 2e-2);
        assert!(c.diverged && c.text.contains("layer   1: diverges at #0"), "{}", c.text);
        // β: a step of β (2⁻⁸ at 0.5) and a quarter step of b are allowed, absolutely.
        let c = compare(&base, &with(-0.0135, 0.5 + 2f32.powi(-8), true), 2e-3);
        assert!(!c.diverged, "{}", c.text);
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
        assert!(c.diverged, "{}", c.text);
        assert!(c.text.contains("DIFFERS: A has 2 generated tokens and B 0: one trace is cut short"), "{}", c.text);
        assert!(!c.text.contains("the traces agree"), "{}", c.text);
        let mut fewer = trace(a.states.clone());
        for l in fewer.states.iter_mut().flat_map(|e| e.gdn.iter_mut()).filter(|l| l.layer == 1) {
            for v in [&mut l.beta, &mut l.g, &mut l.retention, &mut l.state_norm, &mut l.delta_ratio] {
                v.pop();
            }
            l.nonfinite.pop();
        }
        let c = compare(&a, &fewer, 1e-3);
        assert!(c.diverged && c.text.contains("DIFFERS: layer 1: A has 2 heads and B 1"), "{}", c.text);
        assert!(c.text.contains("layer   0: agrees") && !c.text.contains("layer   1: agrees"), "{}", c.text);
        let mut missing = trace(a.states.clone());
        for e in &mut missing.states {
            e.gdn.pop();
        }
        let c = compare(&a, &missing, 1e-3);
        assert!(c.diverged, "{}", c.text);
        assert!(
            c.text.contains("DIFFERS: the traces have 2 and 1 GDN layers (only in A: [1]; only in B: [])"),
            "{}",
            c.text
        );
        assert!(!c.text.contains("the traces agree"), "{}", c.text);
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
        let s = summary(&trace(vec![event(None, 0.5, 1.0), event(Some(0), 0.5, 1.0)]));
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
        let s = summary(&trace(vec![event(None, 0.5, 1.0), event(Some(0), 0.5, 3e4)]));
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
