//! `deltascope bench`: prefill and decode speed, TTFT, MTP acceptance and speed-up per draft
//! depth, memory; and the cost of the two rollback schemes for speculative decoding.
//! A developer tool (architecture.json): it measures the engine and the model directly.

use std::io::{self, Write};
use std::time::Instant;

use serde::Serialize;

use super::bench_stats::{Speedup, Spread};
use super::common::{self};
use super::interrupt::Interrupt;
use super::report::{Report, emit};
use crate::backend::local::Loaded;
use crate::backend::{ChatMessage, ChatRequest, Prompt, Role};
use deltascope_engine::{GenerateRequest, Generator};
use deltascope_model::cpu::CpuInfo;
use deltascope_model::layers::replay_head;
use deltascope_protocol::{GenerationParams, Memory, MtpMode, MtpStats, SamplingParams};

pub use super::bench_args::BenchArgs;

pub const DEMO_PROMPTS: [&str; 4] =
    ["Sort 93, 17, 56, 41, 8, 72.", "How many r are in strawberry?", "What is 482 + 739?", "Is 197 prime?"];

/// What `--prompt-len` puts before the question, repeated: plain text that asks for nothing.
const PREAMBLE: &str = "The numbers 93, 17, 56 and 41 were written on the board. ";

#[derive(Debug, Serialize)]
pub struct BenchRow {
    pub mtp: String,
    /// Measured passes over the prompts (fewer than `--repeat` when interrupted).
    pub passes: usize,
    /// Tokens generated in one pass (greedy: the same in every pass).
    pub generated_tokens: usize,
    pub decode_tok_s: Spread,
    /// Against `--mtp 0`'s decode speed (when it was measured).
    pub speedup: Option<Speedup>,
    pub prefill_tok_s: Spread,
    /// The median TTFT of a pass's prompts.
    pub ttft_ms: Spread,
    pub acceptance_rate: Option<f64>,
    pub mean_accepted_length: Option<f64>,
    pub per_position: Option<Vec<f64>>,
    pub final_depth: Option<usize>,
    pub draft_share: Option<f64>,
    /// Milliseconds of one verify pass (the last measured pass's mean).
    pub verify_ms_per_pass: Option<f64>,
    /// One verify pass (K + 1 tokens through the target) against one plain decode step of
    /// `--mtp 0` (its median): what the accepted drafts must make up for MTP to pay.
    pub verify_cost: Option<f64>,
    pub kv_bytes: usize,
    pub recurrent_bytes: usize,
    pub snapshot_bytes: usize,
}

/// The prompts to run: `--prompt` (one of them may be `-`, standard input), then each
/// `--prompt-file`; the demo set when none is given.
pub fn prompts(a: &BenchArgs) -> anyhow::Result<Vec<String>> {
    anyhow::ensure!(a.prompt.iter().filter(|p| *p == "-").count() <= 1, "--prompt -: standard input can be read once");
    let mut out = vec![];
    for p in &a.prompt {
        out.extend(common::prompt_text(Some(p), None)?);
    }
    for f in &a.prompt_file {
        out.extend(common::prompt_text(None, Some(f))?);
    }
    if out.is_empty() {
        out = DEMO_PROMPTS.iter().map(|s| s.to_string()).collect();
    }
    Ok(out)
}

pub fn median(v: Vec<f64>) -> f64 {
    Spread::of(&v).map_or(0.0, |s| s.median)
}

/// The name of the `--trace-state` row.
const TRACED: &str = "0+trace";

/// `bench`'s depths when `--mtp` is not given and the model has an MTP head.
const DEFAULT_DEPTHS: [usize; 4] = [0, 1, 2, 3];

/// One `--mtp` entry, checked before anything runs.
fn mtp_setting(s: &str) -> anyhow::Result<MtpMode> {
    let mode: MtpMode = s.parse().map_err(|e| anyhow::anyhow!("--mtp {s}: {e}"))?;
    let p = GenerationParams { mtp: mode, ..Default::default() };
    p.check().map_err(|e| anyhow::anyhow!("--mtp {s}: must be {}, or auto", e.expected))?;
    Ok(mode)
}

/// One row of the table: an `--mtp` setting (or the traced plain row), as named on the row.
struct Setting {
    name: String,
    mtp: MtpMode,
    /// `--trace-state`'s row: plain decoding with the state trace on.
    traced: bool,
}

impl Setting {
    fn untraced(name: &str) -> anyhow::Result<Setting> {
        Ok(Setting { name: name.to_string(), mtp: mtp_setting(name)?, traced: false })
    }
}

/// The settings to measure: `--mtp`'s list (`given`, already checked), or by default every
/// depth when the model has an MTP head and plain decoding alone when not; with
/// `--trace-state`, a traced plain row beside a plain row to compare it with.
fn settings(a: &BenchArgs, loaded: &Loaded, given: Vec<MtpMode>) -> anyhow::Result<Vec<Setting>> {
    let mut settings: Vec<Setting> = if a.mtp.is_empty() {
        default_settings(loaded)?
    } else {
        a.mtp.iter().zip(given).map(|(name, mtp)| Setting { name: name.clone(), mtp, traced: false }).collect()
    };
    // Traced passes run plain (the trace is per token).
    if a.trace_state {
        if let Some(why) = loaded.compute().state_trace_refusal() {
            anyhow::bail!("--trace-state: {why}");
        }
        if !settings.iter().any(|s| s.name == "0") {
            settings.push(Setting { name: "0".into(), mtp: MtpMode::Off, traced: false });
        }
        settings.push(Setting { name: TRACED.into(), mtp: MtpMode::Off, traced: true });
    }
    if let Some(s) = settings.iter().find(|s| s.mtp.is_on() && loaded.model().mtp().is_none()) {
        let which = s.mtp.to_string();
        anyhow::bail!("--mtp {which}: {} has no MTP head, so only --mtp 0 can be measured", loaded.name());
    }
    Ok(settings)
}

/// [`DEFAULT_DEPTHS`] for a model with an MTP head, `0` alone (said on stderr) without one.
fn default_settings(loaded: &Loaded) -> anyhow::Result<Vec<Setting>> {
    if loaded.model().mtp().is_none() {
        eprintln!("{} has no MTP head: measuring --mtp 0 only", loaded.name());
        return Ok(vec![Setting::untraced("0")?]);
    }
    DEFAULT_DEPTHS.iter().map(|d| Setting::untraced(&d.to_string())).collect()
}

/// What one setting measured over its passes.
#[derive(Default)]
struct Samples {
    decode: Vec<f64>,
    prefill: Vec<f64>,
    ttft: Vec<f64>,
    generated: usize,
    stats: Option<MtpStats>,
    memory: Memory,
}

impl Samples {
    fn add(&mut self, pass: Pass) {
        self.decode.push(pass.decode);
        self.prefill.push(pass.prefill);
        self.ttft.push(pass.ttft);
        self.generated = pass.generated;
        self.memory = pass.memory;
        // Acceptance, depth and the verify cost over every measured pass, not the last one
        // alone: `auto` may draft in one pass and not in the next.
        self.stats = match (self.stats.take(), pass.stats) {
            (Some(mut all), Some(this)) => {
                all.merge(&this);
                Some(all)
            }
            (all, this) => this.or(all),
        };
    }
}

/// The user message padded with the preamble until the rendered prompt holds `len` tokens.
fn padded(loaded: &Loaded, question: &str, len: usize) -> anyhow::Result<Vec<u32>> {
    let ids = |copies: usize| -> anyhow::Result<Vec<u32>> {
        let text = format!("{}\n\n{question}", PREAMBLE.repeat(copies));
        let request =
            ChatRequest { prompt: Prompt::Chat(vec![ChatMessage::new(Role::User, text)]), params: Default::default() };
        Ok(loaded.render(&request)?.1)
    };
    let (none, one) = (ids(0)?.len(), ids(1)?.len());
    let per = one.saturating_sub(none).max(1);
    let mut copies = len.saturating_sub(none).div_ceil(per);
    let mut out = ids(copies)?;
    while out.len() < len {
        copies += 1;
        out = ids(copies)?;
    }
    Ok(out)
}

/// Each prompt rendered as a user message through the chat template (padded to
/// `--prompt-len` tokens when given).
fn prompt_ids(loaded: &Loaded, prompts: &[String], prompt_len: Option<usize>) -> anyhow::Result<Vec<Vec<u32>>> {
    prompts
        .iter()
        .map(|p| match prompt_len {
            Some(n) => padded(loaded, p, n),
            None => {
                let request = ChatRequest {
                    prompt: Prompt::Chat(vec![ChatMessage::new(Role::User, p.clone())]),
                    params: Default::default(),
                };
                Ok(loaded.render(&request)?.1)
            }
        })
        .collect()
}

/// `--prompt-len` and `--max-tokens` together must fit the model's context.
fn check_context(a: &BenchArgs, loaded: &Loaded) -> anyhow::Result<()> {
    let context = loaded.model().config().max_position_embeddings;
    if let Some(n) = a.prompt_len {
        anyhow::ensure!(
            n + a.max_tokens <= context,
            "--prompt-len {n} with --max-tokens {}: {} tokens, more than the model's context of {context}",
            a.max_tokens,
            n + a.max_tokens
        );
    }
    Ok(())
}

/// `bench --server`: the flags that need the in-process engine are refused, then the server's
/// per-request figures are measured (see bench_remote).
fn run_remote(a: &BenchArgs, prompts: &[String]) -> anyhow::Result<()> {
    anyhow::ensure!(
        !a.trace_state,
        "--trace-state: the state trace needs the in-process engine; a server does not expose a model's recurrent state"
    );
    // As `run --server --mtp` says: not silently ignored.
    anyhow::ensure!(
        a.mtp.is_empty(),
        "--mtp: a server decides speculative decoding itself (set it where the server is started); bench measures what it does"
    );
    super::bench_remote::run(a, prompts)
}

/// `bench`'s result on the in-process engine. The fields in order are the JSON's keys.
#[derive(Serialize)]
struct BenchReport {
    model: String,
    /// A GGUF's file type as llama.cpp names it ("Q4_K_M").
    #[serde(skip_serializing_if = "Option::is_none")]
    file_type: Option<String>,
    prompts: Vec<String>,
    prompt_tokens: Vec<usize>,
    max_tokens: usize,
    warmup: usize,
    repeat: usize,
    cpu: CpuInfo,
    rows: Vec<BenchRow>,
    rollback: Option<RollbackCosts>,
    load: LoadFigures,
    devices: Vec<String>,
    dtype: &'static str,
    dtype_why: String,
    /// Only when a signal stopped the passes.
    #[serde(skip_serializing_if = "Option::is_none")]
    interrupted: Option<Stopped>,
    /// The model's storage in one line (the text's; the JSON has `load`).
    #[serde(skip)]
    storage: String,
}

/// Loading the model: how long it took and what it holds.
#[derive(Serialize)]
struct LoadFigures {
    seconds: f64,
    weights_bytes: usize,
    mapped_bytes: usize,
}

/// What was measured when a signal stopped the passes.
#[derive(Serialize)]
struct Stopped {
    signal: &'static str,
    measured_passes: usize,
    planned_passes: usize,
}

impl Report for BenchReport {
    fn print_human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "{}", self.cpu.summary())?;
        writeln!(out, "threads: {} — {}", self.cpu.threads, self.cpu.threads_why)?;
        writeln!(out, "dtype: {} — {}", self.dtype, self.dtype_why)?;
        writeln!(out, "{} · runs on {}", self.storage, self.devices.join(", "))?;
        print_table(out, self)?;
        if let Some(rb) = &self.rollback {
            writeln!(out, "\nrollback on one Qwen3.6-27B-shaped GDN layer (48 heads × 128 × 128, f32):")?;
            writeln!(out, "  copy the state once:          {:.3} ms", rb.copy_ms)?;
            writeln!(out, "  replay one token from a tape: {:.3} ms", rb.replay_token_ms)?;
            writeln!(
                out,
                "  per step with K = 2: snapshots {:.3} ms always; tape {:.3} ms (1 copy) + up to {:.3} ms on rejection",
                3.0 * rb.copy_ms,
                rb.copy_ms,
                2.0 * rb.replay_token_ms
            )?;
        }
        Ok(())
    }

    /// One line.
    fn print_json(&self, out: &mut dyn Write) -> io::Result<()> {
        serde_json::to_writer(&mut *out, self)?;
        writeln!(out)
    }
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.repeat >= 1, "--repeat must be at least 1");
    anyhow::ensure!(a.max_tokens >= 1, "--max-tokens must be at least 1");
    // Checked before anything runs; the default list waits for the model (has it a head?).
    let given: Vec<MtpMode> = a.mtp.iter().map(|s| mtp_setting(s)).collect::<anyhow::Result<_>>()?;
    let prompts = prompts(&a)?;
    if a.model.server.server.is_some() {
        // A server: only its per-request figures can be measured.
        return run_remote(&a, &prompts);
    }
    let loaded = common::load_local(&a.model, "bench")?;
    // After loading, which sized the thread pool.
    let cpu = CpuInfo::detect();
    let settings = settings(&a, &loaded, given)?;
    check_context(&a, &loaded)?;
    let interrupt = Interrupt::install()?;
    let prompt_ids = prompt_ids(&loaded, &prompts, a.prompt_len)?;
    let generator = Generator::new(loaded.tokenizer(), loaded.name().to_string());
    let passes =
        Passes { generator: &generator, loaded: &loaded, prompt_ids: &prompt_ids, a: &a, interrupt: &interrupt };
    let samples = passes.measure(&settings)?;
    let rows = rows(&settings, &samples);
    let measured_passes: usize = rows.iter().map(|r| r.passes).sum();
    let planned = a.repeat * settings.len();
    let rollback = if a.rollback && !interrupt.interrupted() { Some(rollback_costs()) } else { None };
    let interrupted = interrupt.interrupted().then(|| Stopped {
        signal: interrupt.signal_name(),
        measured_passes,
        planned_passes: planned,
    });
    let model = loaded.model();
    let report = BenchReport {
        model: loaded.name().to_string(),
        file_type: loaded.identity().file_type,
        prompt_tokens: prompt_ids.iter().map(Vec::len).collect(),
        prompts,
        max_tokens: a.max_tokens,
        warmup: a.warmup,
        repeat: a.repeat,
        cpu,
        rows,
        rollback,
        load: LoadFigures {
            seconds: model.load_seconds(),
            weights_bytes: model.weight_bytes(),
            mapped_bytes: model.mapped_bytes(),
        },
        devices: loaded.placement().devices.clone(),
        dtype: loaded.dtype().precision.name(),
        dtype_why: loaded.dtype().why.clone(),
        interrupted,
        storage: model.storage_summary(),
    };
    emit(&report, a.json)?;
    interrupt.finish(measured(measured_passes, planned))
}

/// One row per setting that measured a pass; against `--mtp 0` (when it ran) each other row
/// gets its speed-up, and its verify pass's cost in plain decode steps.
fn rows(settings: &[Setting], samples: &[Samples]) -> Vec<BenchRow> {
    let mut rows: Vec<BenchRow> = settings.iter().zip(samples).filter_map(|(s, x)| row(&s.name, x)).collect();
    if let Some(base) = rows.iter().find(|r| r.mtp == "0").map(|r| r.decode_tok_s) {
        let step_ms = 1e3 / base.median.max(1e-9);
        for r in rows.iter_mut().filter(|r| r.mtp != "0") {
            r.speedup = Some(Speedup::of(&r.decode_tok_s, &base));
            r.verify_cost = r.verify_ms_per_pass.map(|ms| ms / step_ms);
        }
    }
    rows
}

/// What one pass over every prompt measured: tokens and decode time add up across prompts.
struct Pass {
    decode: f64,
    prefill: f64,
    ttft: f64,
    generated: usize,
    stats: Option<MtpStats>,
    memory: Memory,
}

/// What every pass runs: the prompts, on the loaded model, until a signal.
struct Passes<'a> {
    generator: &'a Generator<'a>,
    loaded: &'a Loaded,
    prompt_ids: &'a [Vec<u32>],
    a: &'a BenchArgs,
    interrupt: &'a Interrupt,
}

impl Passes<'_> {
    /// Rounds of one pass per setting, interleaved, so that a machine getting slower or faster
    /// (clocks, other work) shifts every setting alike instead of favouring the first. Each
    /// pass is said on stderr (unless `--json`); the warm-up rounds are not kept.
    fn measure(&self, settings: &[Setting]) -> anyhow::Result<Vec<Samples>> {
        let a = self.a;
        let mut samples: Vec<Samples> = settings.iter().map(|_| Samples::default()).collect();
        let mut err = io::stderr().lock();
        for round in 0..a.warmup + a.repeat {
            let warm = round < a.warmup;
            for (i, s) in settings.iter().enumerate() {
                // A pass cut short measures the interruption, not the engine: it goes.
                let Some(pass) = self.one(s.mtp, s.traced)? else { return Ok(samples) };
                if !a.json {
                    let what =
                        if warm { format!("warm-up {}", round + 1) } else { format!("round {}", round + 1 - a.warmup) };
                    writeln!(err, "{what} mtp {}: {:.1} tok/s", s.name, pass.decode)?;
                }
                if !warm {
                    samples[i].add(pass);
                }
            }
        }
        Ok(samples)
    }

    /// One pass of one setting over every prompt; `None` when a signal cut it short.
    fn one(&self, mtp: MtpMode, trace_state: bool) -> anyhow::Result<Option<Pass>> {
        let (loaded, interrupt) = (self.loaded, self.interrupt);
        let drafting = mtp.is_on();
        let (mut toks, mut secs, mut pre_toks, mut pre_secs, mut first) = (0usize, 0f64, 0usize, 0f64, vec![]);
        let mut generated = 0;
        let mut stats = MtpStats::new(mtp.depth());
        let mut memory = Memory::default();
        for ids in self.prompt_ids {
            let params = GenerationParams {
                max_tokens: self.a.max_tokens,
                sampling: SamplingParams::default(),
                mtp,
                trace_state,
                ..Default::default()
            };
            let mut session = loaded.compute().sequence(drafting)?;
            let started = Instant::now();
            let out = self.generator.generate(
                session.as_mut(),
                &GenerateRequest { prompt_ids: ids.clone(), params },
                interrupt.cancel_flag(),
                &mut |_| {},
            )?;
            if interrupt.interrupted() {
                return Ok(None);
            }
            let total = started.elapsed().as_secs_f64();
            generated += out.tokens.len();
            // Decoding is every token after the first (which TTFT holds).
            toks += out.tokens.len().saturating_sub(1);
            // Every measured pass generates (max_tokens ≥ 1 and no cancel): a first token came.
            let ttft_ms = out.timing.ttft_ms.unwrap_or(total * 1e3);
            secs += total - ttft_ms / 1e3;
            pre_toks += ids.len();
            pre_secs += ids.len() as f64 / out.timing.prefill_tok_s.max(1e-9);
            first.push(ttft_ms);
            memory = session.memory();
            if let Some(s) = out.mtp {
                stats.merge(&s);
            }
        }
        Ok(Some(Pass {
            decode: toks as f64 / secs.max(1e-9),
            prefill: pre_toks as f64 / pre_secs.max(1e-9),
            ttft: median(first),
            generated,
            stats: drafting.then_some(stats),
            memory,
        }))
    }
}

/// The line above the table and the table's column heads.
fn print_table_head(out: &mut dyn Write, report: &BenchReport) -> io::Result<()> {
    let lens = &report.prompt_tokens;
    let (lo, hi) = (lens.iter().min().copied().unwrap_or(0), lens.iter().max().copied().unwrap_or(0));
    let tokens = if lo == hi { format!("{lo}") } else { format!("{lo}–{hi}") };
    writeln!(
        out,
        "{}{} · {} prompts of {tokens} tokens · greedy · max_tokens {} · {} warm-up + {} measured passes per setting, interleaved",
        report.model,
        report.file_type.as_deref().map(|t| format!(" ({t})")).unwrap_or_default(),
        lens.len(),
        report.max_tokens,
        report.warmup,
        report.repeat
    )?;
    writeln!(
        out,
        "{:>7} {:>9} {:>15} {:>8} {:>15} {:>9} {:>10} {:>7} {:>5} {:>13} {:>6} {:>7} {:>6}",
        "mtp",
        "decode/s",
        "min–max",
        "spread",
        "speedup",
        "prefill/s",
        "TTFT ms",
        "accept",
        "len",
        "per position",
        "draft%",
        "verify×",
        "passes"
    )
}

/// The setting as the table names it; `auto` with the depth it ended at.
fn depth_label(r: &BenchRow) -> String {
    match (r.mtp.as_str(), r.final_depth) {
        // Depth 0 at the end: auto measured drafting slower than plain decoding and turned it off.
        ("auto", Some(0)) => "auto→off".into(),
        ("auto", Some(d)) => format!("auto→{d}"),
        _ => r.mtp.clone(),
    }
}

/// The speed-up cell: median and range against `--mtp 0`, marked ≈ when within the noise.
fn speedup_cell(r: &BenchRow) -> String {
    match r.speedup {
        Some(s) => format!("{}{:.2}× {:.2}–{:.2}", if s.within_spread { "≈" } else { "" }, s.median, s.min, s.max),
        None if r.mtp == "0" => "base".into(),
        None => "-".into(),
    }
}

fn print_table_row(out: &mut dyn Write, r: &BenchRow) -> io::Result<()> {
    let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map(f).unwrap_or_else(|| "-".into());
    let d = &r.decode_tok_s;
    writeln!(
        out,
        "{:>7} {:>9.1} {:>15} {:>7.0}% {:>15} {:>9.1} {:>10.1} {:>7} {:>5} {:>13} {:>6} {:>7} {:>6}",
        depth_label(r),
        d.median,
        format!("{:.1}–{:.1}", d.min, d.max),
        d.spread * 100.0,
        speedup_cell(r),
        r.prefill_tok_s.median,
        r.ttft_ms.median,
        opt(r.acceptance_rate, &|x| format!("{:.0}%", x * 100.0)),
        opt(r.mean_accepted_length, &|x| format!("{x:.2}")),
        r.per_position
            .as_ref()
            .map(|p| p.iter().map(|x| format!("{:.0}", x * 100.0)).collect::<Vec<_>>().join("/"))
            .unwrap_or_else(|| "-".into()),
        opt(r.draft_share, &|x| format!("{:.0}%", x * 100.0)),
        opt(r.verify_cost, &|x| format!("{x:.2}")),
        r.passes,
    )
}

fn print_table(out: &mut dyn Write, report: &BenchReport) -> io::Result<()> {
    print_table_head(out, report)?;
    for r in &report.rows {
        print_table_row(out, r)?;
    }
    if report.rows.iter().any(|r| r.speedup.is_some_and(|s| s.within_spread)) {
        writeln!(
            out,
            "≈: the difference from mtp 0 is smaller than the spread of the passes: it cannot be told from noise (more --repeat, a quieter machine)"
        )?;
    }
    Ok(())
}

fn measured(done: usize, planned: usize) -> String {
    format!("{done} of {planned} passes measured (the pass in flight was left out)")
}

/// One setting's row: median, min and max over its measured passes; `None` without any.
fn row(setting: &str, s: &Samples) -> Option<BenchRow> {
    let stats = s.stats.as_ref();
    Some(BenchRow {
        mtp: setting.to_string(),
        passes: s.decode.len(),
        generated_tokens: s.generated,
        decode_tok_s: Spread::of(&s.decode)?,
        speedup: None,
        prefill_tok_s: Spread::of(&s.prefill)?,
        ttft_ms: Spread::of(&s.ttft)?,
        acceptance_rate: stats.map(|s| s.acceptance_rate),
        mean_accepted_length: stats.map(|s| s.mean_accepted_length),
        per_position: stats.map(|s| s.per_position.clone()),
        final_depth: stats.map(|s| s.depth),
        draft_share: stats.map(|s| s.draft_ms / (s.draft_ms + s.verify_ms).max(1e-9)),
        verify_ms_per_pass: stats.filter(|s| s.steps > 0).map(|s| s.verify_ms / s.steps as f64),
        verify_cost: None,
        kv_bytes: s.memory.kv_bytes,
        recurrent_bytes: s.memory.recurrent_bytes,
        snapshot_bytes: stats.map_or(0, |s| s.snapshot_bytes),
    })
}

#[derive(Debug, Serialize)]
pub struct RollbackCosts {
    pub copy_ms: f64,
    pub replay_token_ms: f64,
}

/// Times a state copy against replaying one token (decay + rank-1 update per head).
pub fn rollback_costs() -> RollbackCosts {
    let (hv, dk, dv) = (48, 128, 128);
    let state: Vec<f32> = (0..hv * dk * dv).map(|i| (i % 97) as f32 * 1e-3).collect();
    let k: Vec<f32> = (0..dk).map(|i| (i as f32 * 0.37).sin() / 8.0).collect();
    let d: Vec<f32> = (0..dv).map(|i| (i as f32 * 0.11).cos() / 8.0).collect();
    let reps = 20;
    let t = Instant::now();
    let mut sink = 0f32;
    for _ in 0..reps {
        let c = state.clone();
        sink += c[c.len() / 2];
    }
    let copy_ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
    let mut s = state.clone();
    let t = Instant::now();
    for _ in 0..reps {
        for head in s.chunks_mut(dk * dv) {
            replay_head(head, &k, &d, &[-0.01], dk, dv);
        }
    }
    let replay_token_ms = t.elapsed().as_secs_f64() * 1e3 / reps as f64;
    std::hint::black_box((sink, s));
    RollbackCosts { copy_ms, replay_token_ms }
}
