//! `deltascope sweep`: one prompt across thinking budgets — how much thinking each budget used,
//! what the answer cost, how generation ended, and (with `--check`) whether it was right.

use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::common::{self, ModelArgs, PromptArgs};
use super::interrupt::Interrupt;
use super::report::{self, Report};
use crate::backend::ParamOverrides;
use crate::backend::{Backend, ChatRequest, Prompt};
use deltascope_protocol::{DiagnosticKind, EngineEvent, ErrorKind, FinishReason, OnLoop};

#[derive(Args, Debug)]
pub struct SweepArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The user message; `-` reads it from standard input.
    /// Without --prompt or --prompt-file, piped standard input is the prompt.
    #[arg(long, value_name = "TEXT", conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// The user message from a file (for prompts longer than a command line can hold).
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    #[command(flatten)]
    pub prompt_opts: PromptArgs,
    /// Thinking budgets to try: -1 unlimited, 0 thinking off.
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        allow_hyphen_values = true,
        default_value = "0,32,64,128,-1"
    )]
    pub thinking_budgets: Vec<i64>,
    /// Runs per budget (seeds seed, seed+1, …).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub repeat: u64,
    /// A regular expression the answer must match to count as correct.
    #[arg(long, value_name = "REGEX")]
    pub check: Option<String>,
    /// Draw correctness and tokens against budget into an SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Print the runs and the summary as JSON.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub generation: ParamOverrides,
}

#[derive(Debug, Clone, Serialize)]
pub struct SweepRun {
    pub budget: i64,
    /// What a loop did in this run (`--on-loop`; several values compare them).
    pub on_loop: OnLoop,
    /// A loop in thinking was rescued (the end of thinking forced, the model answered).
    pub rescued: bool,
    pub seed: u64,
    /// The prompt's tokens (from the server's usage, or counted otherwise when its stream was
    /// closed before the usage frame: see `prompt_estimate`).
    pub prompt_tokens: usize,
    /// Where `prompt_tokens` came from when it is an estimate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_estimate: Option<String>,
    /// Generated thinking tokens (the forced ones are counted apart).
    pub thinking_tokens: usize,
    /// Tokens the budget forced: bridge text and `</think>` (counted by the same tally on every
    /// backend; an estimate where the server does not say, see `forced_estimate`).
    pub forced_tokens: usize,
    /// Why `forced_tokens` is an estimate (a server that does not mark what its budget forced).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced_estimate: Option<String>,
    pub answer_tokens: usize,
    pub finish_reason: FinishReason,
    /// Whether the budget ended thinking.
    pub forced: bool,
    pub correct: Option<bool>,
    pub decode_tok_s: f64,
    pub answer: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct SweepSummary {
    pub budget: i64,
    pub on_loop: OnLoop,
    pub runs: usize,
    pub mean_thinking_tokens: f64,
    pub mean_forced_tokens: f64,
    pub mean_answer_tokens: f64,
    /// Runs whose thinking the budget ended.
    pub forced: usize,
    /// Runs whose looping thinking was rescued.
    pub rescued: usize,
    /// Runs that ended with an answer (not empty).
    pub answered: usize,
    pub accuracy: Option<f64>,
}

fn budget_label(b: i64) -> String {
    if b < 0 { "∞".into() } else { b.to_string() }
}

pub fn run(a: SweepArgs) -> anyhow::Result<()> {
    let check = a.check.as_deref().map(regex::Regex::new).transpose().map_err(|e| anyhow::anyhow!("--check: {e}"))?;
    check_budgets(&a)?;
    // A plot that cannot be written fails now, not after the runs.
    if let Some(path) = &a.plot {
        super::common::check_plot_path(path)?;
    }
    let text = common::required_prompt_text(a.prompt.as_deref(), a.prompt_file.as_deref(), false)?;
    let prompt = common::prompt(Some(&text), None, &a.prompt_opts)?;
    let backend = common::open(&a.model)?;
    let interrupt = Interrupt::install()?;
    let on_loops = &a.generation.on_loop;
    if let Some((i, o)) = on_loops.iter().enumerate().find(|(i, o)| on_loops[..*i].contains(o)) {
        anyhow::bail!("--on-loop: {o} is listed twice (entry {}): each value once", i + 1);
    }
    let planned = on_loops.len() * a.thinking_budgets.len() * a.repeat as usize;
    let runs = collect_runs(&a, backend.as_ref(), &prompt, check.as_ref(), &interrupt)?;
    // Budgets with no finished run (an interrupted sweep) have nothing to summarise.
    let summary: Vec<SweepSummary> = on_loops
        .iter()
        .flat_map(|&o| a.thinking_budgets.iter().map(move |&b| (o, b)))
        .filter_map(|(o, b)| summarise(b, o, &runs, check.is_some()))
        .collect();
    let interrupted = interrupt.interrupted().then(|| Stopped {
        signal: interrupt.signal_name(),
        completed_runs: runs.len(),
        planned_runs: planned,
    });
    let report = SweepReport {
        prompt: text,
        runs,
        summary,
        interrupted,
        with_summary: a.repeat > 1 || check.is_some() || on_loops.len() > 1,
        loops: on_loops.len() > 1,
    };
    report::emit(&report, a.json)?;
    if let Some(path) = &a.plot {
        std::fs::write(path, plot_svg(&report.prompt, &report.summary))
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        writeln!(std::io::stderr().lock(), "wrote {}", path.display())?;
    }
    interrupt.finish(format!(
        "{} of {planned} runs finished (the run in flight was cancelled and left out)",
        report.runs.len()
    ))
}

/// The flags' budgets: each one a budget (-1 unlimited, 0 off, or a count), each once, and no
/// --thinking-budget beside them.
fn check_budgets(a: &SweepArgs) -> anyhow::Result<()> {
    anyhow::ensure!(!a.thinking_budgets.is_empty(), "--thinking-budgets is empty");
    anyhow::ensure!(
        a.generation.thinking_budget.is_none(),
        "--thinking-budget is set by each run of --thinking-budgets; leave --thinking-budget out"
    );
    anyhow::ensure!(a.repeat >= 1, "--repeat must be at least 1");
    if let Some(b) = a.thinking_budgets.iter().find(|&&b| b < -1) {
        anyhow::bail!("--thinking-budgets: {b}: use -1 for unlimited, 0 for thinking off, or a token count");
    }
    // A budget listed twice would be one row run twice and counted as two (use --repeat).
    if let Some((i, b)) = a.thinking_budgets.iter().enumerate().find(|(i, b)| a.thinking_budgets[..*i].contains(b)) {
        let shown = if *b == -1 { "-1 (unlimited)".to_string() } else { b.to_string() };
        anyhow::bail!(
            "--thinking-budgets: {shown} is listed twice (entry {}): each budget once; --repeat N runs each N times",
            i + 1
        );
    }
    Ok(())
}

/// What a sweep found: every finished run and the mean of each budget, and whether a signal
/// cut it short.
#[derive(Debug, Serialize)]
pub struct SweepReport {
    pub prompt: String,
    pub runs: Vec<SweepRun>,
    pub summary: Vec<SweepSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<Stopped>,
    /// The table's per-budget rows are worth printing (several runs per budget, a check, or
    /// several --on-loop values); the JSON always has them.
    #[serde(skip)]
    pub with_summary: bool,
    /// Several --on-loop values are compared: the table gains their columns.
    #[serde(skip)]
    pub loops: bool,
}

/// The signal that stopped a sweep, and how far it got.
#[derive(Debug, Serialize)]
pub struct Stopped {
    pub signal: &'static str,
    pub completed_runs: usize,
    pub planned_runs: usize,
}

impl Report for SweepReport {
    /// The runs, then (when worth it) one row per budget; several --on-loop values add their
    /// value, whether a loop was rescued, and how many runs answered.
    fn print_human(&self, out: &mut dyn Write) -> std::io::Result<()> {
        print_runs(out, &self.runs, self.loops)?;
        if self.with_summary {
            writeln!(out)?;
            print_summary(out, &self.summary, self.loops)?;
        }
        Ok(())
    }

    /// One line. Through a `Value`, as it always was written: its numbers (f32 ones widened to
    /// f64) are what scripts have read.
    fn print_json(&self, out: &mut dyn Write) -> std::io::Result<()> {
        writeln!(out, "{}", serde_json::to_value(self)?)
    }
}

/// Every budget × seed, in order, until done or interrupted (the run in flight is cancelled
/// and left out: its numbers would describe a generation cut short by the user).
fn collect_runs(
    a: &SweepArgs,
    backend: &dyn Backend,
    prompt: &Prompt,
    check: Option<&regex::Regex>,
    interrupt: &Interrupt,
) -> anyhow::Result<Vec<SweepRun>> {
    let mut runs = vec![];
    let mut err = std::io::stderr().lock();
    for (&on_loop, &budget) in a.generation.on_loop.iter().flat_map(|o| a.thinking_budgets.iter().map(move |b| (o, b)))
    {
        for r in 0..a.repeat {
            if interrupt.interrupted() {
                return Ok(runs);
            }
            let mut g = a.generation.with_on_loop(on_loop);
            g.thinking_budget =
                Some(budget.to_string().parse().map_err(|e| anyhow::anyhow!("--thinking-budgets: {e}"))?);
            let seed = a.generation.seed()?.wrapping_add(r);
            g.seed = i128::from(seed);
            let g = g.without_thinking_if(a.prompt_opts.no_think);
            let request = ChatRequest { prompt: prompt.clone(), params: g.resolve(backend.info())? };
            let Some(run) = one_run(backend, request, (budget, on_loop, seed), check, interrupt)? else {
                return Ok(runs);
            };
            if !a.json {
                writeln!(err, "{}", progress(&run, a.generation.on_loop.len() > 1))?;
            }
            runs.push(run);
        }
    }
    Ok(runs)
}

/// One generation of the sweep at `(budget, on_loop, seed)`; `None` when a signal cancelled it.
fn one_run(
    backend: &dyn Backend,
    request: ChatRequest,
    (budget, on_loop, seed): (i64, OnLoop, u64),
    check: Option<&regex::Regex>,
    interrupt: &Interrupt,
) -> anyhow::Result<Option<SweepRun>> {
    let generation = backend.start(request)?;
    let control = generation.control();
    interrupt.on_signal(move || control.cancel());
    let (mut budget_forced, mut rescued) = (false, false);
    let end = generation.for_each(|ev| {
        if let EngineEvent::Diagnostic(d) = ev {
            budget_forced |= d.kind == DiagnosticKind::ThinkingBudgetForced;
            rescued |= d.kind == DiagnosticKind::LoopRescued;
        }
    });
    Ok(Some(match end {
        EngineEvent::Done(d) if d.finish_reason == FinishReason::Cancelled => return Ok(None),
        EngineEvent::Done(d) => SweepRun {
            budget,
            on_loop,
            rescued,
            seed,
            prompt_tokens: d.usage.prompt_tokens,
            prompt_estimate: d.usage.prompt_estimate.clone(),
            thinking_tokens: d.usage.thinking_tokens,
            forced_tokens: d.usage.forced_tokens,
            forced_estimate: d.usage.estimate.clone(),
            answer_tokens: d.usage.answer_tokens,
            finish_reason: d.finish_reason,
            forced: d.usage.forced_tokens > 0 || budget_forced,
            correct: check.map(|re| re.is_match(&d.answer)),
            decode_tok_s: d.timing.decode_tok_s,
            answer: d.answer,
        },
        EngineEvent::Error(e) if e.kind == ErrorKind::Cancelled => return Ok(None),
        EngineEvent::Error(e) => anyhow::bail!("budget {}: {}", budget_label(budget), e.message),
        _ => anyhow::bail!("budget {}: the generation ended without a done event", budget_label(budget)),
    }))
}

/// A finished run's line on stderr (the --on-loop value when several are compared).
fn progress(run: &SweepRun, loops: bool) -> String {
    format!(
        "budget {:>5} seed {:>3}{}: {} thinking, {} forced, {} answer tokens, {}{}",
        budget_label(run.budget),
        run.seed,
        if loops { format!(" on-loop {:<6}", run.on_loop) } else { String::new() },
        run.thinking_tokens,
        run.forced_tokens,
        run.answer_tokens,
        run.finish_reason.as_str(),
        if run.rescued { " (loop rescued)" } else { "" }
    )
}

/// The mean of one budget's finished runs under one `--on-loop`; `None` when none finished.
fn summarise(budget: i64, on_loop: OnLoop, runs: &[SweepRun], checked: bool) -> Option<SweepSummary> {
    let rs: Vec<&SweepRun> = runs.iter().filter(|r| r.budget == budget && r.on_loop == on_loop).collect();
    if rs.is_empty() {
        return None;
    }
    let n = rs.len() as f64;
    Some(SweepSummary {
        budget,
        on_loop,
        runs: rs.len(),
        mean_thinking_tokens: rs.iter().map(|r| r.thinking_tokens as f64).sum::<f64>() / n,
        mean_forced_tokens: rs.iter().map(|r| r.forced_tokens as f64).sum::<f64>() / n,
        mean_answer_tokens: rs.iter().map(|r| r.answer_tokens as f64).sum::<f64>() / n,
        forced: rs.iter().filter(|r| r.forced).count(),
        rescued: rs.iter().filter(|r| r.rescued).count(),
        answered: rs.iter().filter(|r| !r.answer.trim().is_empty()).count(),
        accuracy: checked.then(|| rs.iter().filter(|r| r.correct == Some(true)).count() as f64 / n),
    })
}

/// The `--on-loop` column's cell (and its heading) when several values are compared.
fn lead(loops: bool, cell: &str) -> String {
    if loops { format!("{cell:>7} ") } else { String::new() }
}

/// A row per run.
fn print_runs(out: &mut dyn Write, runs: &[SweepRun], loops: bool) -> std::io::Result<()> {
    writeln!(
        out,
        "{}{:>6} {:>5} {:>9} {:>7} {:>12} {:>6} {:>8} {:>8}{}",
        lead(loops, "on-loop"),
        "budget",
        "seed",
        "thinking",
        "answer",
        "finish",
        "forced",
        "correct",
        "tok/s",
        if loops { "  rescued" } else { "" }
    )?;
    for r in runs {
        let correct = match r.correct {
            Some(true) => "yes",
            Some(false) => "no",
            None => "-",
        };
        writeln!(
            out,
            "{}{:>6} {:>5} {:>9} {:>7} {:>12} {:>6} {:>8} {:>8.1}{}",
            lead(loops, r.on_loop.name()),
            budget_label(r.budget),
            r.seed,
            r.thinking_tokens,
            r.answer_tokens,
            r.finish_reason.as_str(),
            forced_cell(r),
            correct,
            r.decode_tok_s,
            match (loops, r.rescued) {
                (false, _) => "",
                (true, true) => "  yes",
                (true, false) => "  -",
            }
        )?;
    }
    Ok(())
}

/// A row per budget (and --on-loop value): the means over its runs.
fn print_summary(out: &mut dyn Write, summary: &[SweepSummary], loops: bool) -> std::io::Result<()> {
    writeln!(
        out,
        "{}{:>6} {:>5} {:>14} {:>12} {:>12} {:>6} {:>9}{}",
        lead(loops, "on-loop"),
        "budget",
        "runs",
        "mean thinking",
        "mean forced",
        "mean answer",
        "forced",
        "accuracy",
        if loops { format!(" {:>8} {:>9}", "rescued", "answered") } else { String::new() }
    )?;
    for s in summary {
        let acc = s.accuracy.map(|x| format!("{:.0}%", x * 100.0)).unwrap_or_else(|| "-".into());
        writeln!(
            out,
            "{}{:>6} {:>5} {:>14.1} {:>12.1} {:>12.1} {:>6} {:>9}{}",
            lead(loops, s.on_loop.name()),
            budget_label(s.budget),
            s.runs,
            s.mean_thinking_tokens,
            s.mean_forced_tokens,
            s.mean_answer_tokens,
            s.forced,
            acc,
            if loops { format!(" {:>8} {:>9}", s.rescued, s.answered) } else { String::new() }
        )?;
    }
    Ok(())
}

/// The forced tokens of a run: how many ("≈" where the server does not say which tokens its
/// budget forced), "-" when thinking ended by itself.
fn forced_cell(r: &SweepRun) -> String {
    match (r.forced_tokens, r.forced, &r.forced_estimate) {
        (0, false, _) => "-".into(),
        (n, _, Some(_)) => format!("≈{n}"),
        (n, _, None) => n.to_string(),
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Mean thinking and answer tokens as stacked bars per budget (left axis), accuracy as a line
/// (right axis, when a check was given).
pub fn plot_svg(prompt: &str, summary: &[SweepSummary]) -> String {
    let c = Chart::new(summary);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#,
        w = c.w,
        h = c.h
    );
    let _ = writeln!(s, r##"<rect width="100%" height="100%" fill="#ffffff"/>"##);
    let title: String = prompt.chars().take(70).collect();
    let _ = writeln!(
        s,
        r##"<text x="{}" y="24" text-anchor="middle" font-size="14" fill="#222">Thinking budget sweep: {}</text>"##,
        c.w / 2.0,
        xml_escape(&title)
    );
    c.token_axis(&mut s);
    let points = c.bars(&mut s, summary);
    let _ = writeln!(
        s,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555">thinking budget (tokens)</text>"##,
        c.left + c.pw / 2.0,
        c.h - 16.0
    );
    if !points.is_empty() {
        c.accuracy_line(&mut s, &points);
    }
    c.legend(&mut s);
    s.push_str("</svg>\n");
    s
}

/// The sweep plot's geometry: the plot area inside its margins, a slot per summary row, and the
/// token axis rounded up.
struct Chart {
    w: f64,
    h: f64,
    left: f64,
    right: f64,
    top: f64,
    /// The plot area's width and height.
    pw: f64,
    ph: f64,
    /// The width each bar's slot takes.
    slot: f64,
    /// The token axis's maximum (a round number).
    axis: f64,
}

impl Chart {
    fn new(summary: &[SweepSummary]) -> Self {
        let (w, h) = (720.0, 420.0);
        let (left, right, top, bottom) = (70.0, 70.0, 50.0, 60.0);
        let pw = w - left - right;
        let ph = h - top - bottom;
        let max_tokens = summary
            .iter()
            .map(|s| s.mean_thinking_tokens + s.mean_forced_tokens + s.mean_answer_tokens)
            .fold(1.0, f64::max);
        // A round axis maximum.
        let mag = 10f64.powf(max_tokens.log10().floor());
        let axis = (max_tokens / mag).ceil() * mag;
        let n = summary.len().max(1) as f64;
        Chart { w, h, left, right, top, pw, ph, slot: pw / n, axis }
    }

    /// The height of `t` tokens on the left axis.
    fn y_tok(&self, t: f64) -> f64 {
        self.top + self.ph - t / self.axis * self.ph
    }

    /// The left axis: grid lines at every quarter, their token counts, and the axis's title.
    fn token_axis(&self, s: &mut String) {
        let (left, top, ph) = (self.left, self.top, self.ph);
        for i in 0..=4 {
            let v = self.axis * i as f64 / 4.0;
            let y = self.y_tok(v);
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e4e4e4"/>"##,
                self.w - self.right
            );
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{v:.0}</text>"##,
                left - 6.0,
                y + 4.0
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="18" y="{:.1}" transform="rotate(-90 18 {:.1})" text-anchor="middle" fill="#555">tokens (mean)</text>"##,
            top + ph / 2.0,
            top + ph / 2.0
        );
    }

    /// One stacked bar per summary row (thinking, forced, answer) with its budget below; returns
    /// the accuracy points (x, y, accuracy) of the rows that were checked.
    fn bars(&self, s: &mut String, summary: &[SweepSummary]) -> Vec<(f64, f64, f64)> {
        let (top, ph) = (self.top, self.ph);
        // Several --on-loop values: each bar says which.
        let loops = summary.iter().any(|x| x.on_loop != summary[0].on_loop);
        let mut points = vec![];
        for (i, sm) in summary.iter().enumerate() {
            let x = self.left + self.slot * i as f64 + self.slot * 0.25;
            let bw = self.slot * 0.5;
            let yt = self.y_tok(sm.mean_thinking_tokens);
            let yf = self.y_tok(sm.mean_thinking_tokens + sm.mean_forced_tokens);
            let ya = self.y_tok(sm.mean_thinking_tokens + sm.mean_forced_tokens + sm.mean_answer_tokens);
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="{yt:.1}" width="{bw:.1}" height="{:.1}" fill="#8a9bd0"><title>thinking {:.1}</title></rect>"##,
                top + ph - yt,
                sm.mean_thinking_tokens
            );
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="{yf:.1}" width="{bw:.1}" height="{:.1}" fill="#c678dd"><title>forced {:.1}</title></rect>"##,
                yt - yf,
                sm.mean_forced_tokens
            );
            let _ = writeln!(
                s,
                r##"<rect x="{x:.1}" y="{ya:.1}" width="{bw:.1}" height="{:.1}" fill="#e0a458"><title>answer {:.1}</title></rect>"##,
                yf - ya,
                sm.mean_answer_tokens
            );
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#333">{}</text>"##,
                x + bw / 2.0,
                top + ph + 18.0,
                if loops { format!("{} · {}", budget_label(sm.budget), sm.on_loop) } else { budget_label(sm.budget) }
            );
            if let Some(acc) = sm.accuracy {
                points.push((x + bw / 2.0, top + ph - acc * ph, acc));
            }
        }
        points
    }

    /// The right axis (percent correct) and the accuracy line through `points`.
    fn accuracy_line(&self, s: &mut String, points: &[(f64, f64, f64)]) {
        let (w, top, ph) = (self.w, self.top, self.ph);
        for i in 0..=4 {
            let v = i as f64 / 4.0;
            let _ = writeln!(
                s,
                r##"<text x="{:.1}" y="{:.1}" fill="#2a7a2a">{:.0}%</text>"##,
                w - self.right + 6.0,
                top + ph - v * ph + 4.0,
                v * 100.0
            );
        }
        let path: Vec<String> = points.iter().map(|(x, y, _)| format!("{x:.1},{y:.1}")).collect();
        let _ =
            writeln!(s, r##"<polyline points="{}" fill="none" stroke="#2a7a2a" stroke-width="2"/>"##, path.join(" "));
        for (x, y, acc) in points {
            let _ = writeln!(
                s,
                r##"<circle cx="{x:.1}" cy="{y:.1}" r="4" fill="#2a7a2a"><title>correct {:.0}%</title></circle>"##,
                acc * 100.0
            );
        }
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{:.1}" transform="rotate(90 {:.1} {:.1})" text-anchor="middle" fill="#2a7a2a">correct</text>"##,
            w - 18.0,
            top + ph / 2.0,
            w - 18.0,
            top + ph / 2.0
        );
    }

    /// The colours' key above the plot.
    fn legend(&self, s: &mut String) {
        let left = self.left;
        let _ = writeln!(
            s,
            r##"<rect x="{left}" y="33" width="12" height="12" fill="#8a9bd0"/><text x="{:.1}" y="43" fill="#333">thinking</text>"##,
            left + 16.0
        );
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="33" width="12" height="12" fill="#c678dd"/><text x="{:.1}" y="43" fill="#333">forced</text>"##,
            left + 90.0,
            left + 106.0
        );
        let _ = writeln!(
            s,
            r##"<rect x="{:.1}" y="33" width="12" height="12" fill="#e0a458"/><text x="{:.1}" y="43" fill="#333">answer</text>"##,
            left + 164.0,
            left + 180.0
        );
    }
}
