//! `deltascope bench`: prefill and decode speed, TTFT, MTP acceptance and speed-up per draft
//! depth, memory; and the cost of the two rollback schemes for speculative decoding.
//! A developer tool (architecture.json): it measures the engine and the model directly.

use std::io::Write;
use std::time::Instant;

use serde::Serialize;

use super::bench_stats::{Speedup, Spread};
use super::common::{self};
use super::interrupt::Interrupt;
use crate::backend::local::Loaded;
use crate::backend::{ChatMessage, ChatRequest, Prompt, Role};
use deltascope_engine::{GenerateRequest, Generator};
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

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.repeat >= 1, "--repeat must be at least 1");
    anyhow::ensure!(a.max_tokens >= 1, "--max-tokens must be at least 1");
    // Checked before anything runs; the default list waits for the model (has it a head?).
    let mut settings: Vec<MtpMode> = a.mtp.iter().map(|s| mtp_setting(s)).collect::<anyhow::Result<_>>()?;
    let prompts = prompts(&a)?;
    if a.model.server.server.is_some() {
        anyhow::ensure!(
            !a.trace_state,
            "--trace-state: the state trace needs the in-process engine; a server does not expose a model's recurrent state"
        );
        // As `run --server --mtp` says: not silently ignored.
        anyhow::ensure!(
            a.mtp.is_empty(),
            "--mtp: a server decides speculative decoding itself (set it where the server is started); bench measures what it does"
        );
        // A server: only its per-request figures can be measured (see bench_remote).
        return super::bench_remote::run(&a, &prompts);
    }
    let loaded = common::load_local(&a.model, "bench")?;
    // After loading, which sized the thread pool.
    let cpu = deltascope_model::cpu::CpuInfo::detect();
    let mut names = a.mtp.clone();
    if names.is_empty() {
        let has_head = loaded.model().mtp.is_some();
        names = if has_head { DEFAULT_DEPTHS.iter().map(|d| d.to_string()).collect() } else { vec!["0".into()] };
        if !has_head {
            eprintln!("{} has no MTP head: measuring --mtp 0 only", loaded.name());
        }
        settings = names.iter().map(|s| mtp_setting(s)).collect::<anyhow::Result<_>>()?;
    }
    // Traced passes run plain (the trace is per token), beside a plain row to compare with.
    let mut traced = vec![false; settings.len()];
    if a.trace_state {
        if let Some(why) = loaded.compute().state_trace_refusal() {
            anyhow::bail!("--trace-state: {why}");
        }
        if !names.iter().any(|n| n == "0") {
            names.push("0".into());
            settings.push(MtpMode::Off);
            traced.push(false);
        }
        names.push(TRACED.into());
        settings.push(MtpMode::Off);
        traced.push(true);
    }
    if let Some(m) = settings.iter().find(|m| m.is_on() && loaded.model().mtp.is_none()) {
        let which = m.to_string();
        anyhow::bail!("--mtp {which}: {} has no MTP head, so only --mtp 0 can be measured", loaded.name());
    }
    let context = loaded.model().config.max_position_embeddings;
    if let Some(n) = a.prompt_len {
        anyhow::ensure!(
            n + a.max_tokens <= context,
            "--prompt-len {n} with --max-tokens {}: {} tokens, more than the model's context of {context}",
            a.max_tokens,
            n + a.max_tokens
        );
    }
    let interrupt = Interrupt::install()?;
    let prompt_ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| match a.prompt_len {
            Some(n) => padded(&loaded, p, n),
            None => {
                let request = ChatRequest {
                    prompt: Prompt::Chat(vec![ChatMessage::new(Role::User, p.clone())]),
                    params: Default::default(),
                };
                Ok(loaded.render(&request)?.1)
            }
        })
        .collect::<anyhow::Result<_>>()?;
    let generator = Generator::new(loaded.tokenizer(), loaded.name().to_string());
    let mut samples: Vec<Samples> = settings.iter().map(|_| Samples::default()).collect();
    let mut err = std::io::stderr().lock();
    // Rounds of one pass per setting, interleaved, so that a machine getting slower or faster
    // (clocks, other work) shifts every setting alike instead of favouring the first.
    'rounds: for round in 0..a.warmup + a.repeat {
        let warm = round < a.warmup;
        for (i, &mtp) in settings.iter().enumerate() {
            let Some(pass) = one_pass(&generator, &loaded, &prompt_ids, mtp, traced[i], a.max_tokens, &interrupt)?
            else {
                // A pass cut short measures the interruption, not the engine: it goes.
                break 'rounds;
            };
            if !a.json {
                let what =
                    if warm { format!("warm-up {}", round + 1) } else { format!("round {}", round + 1 - a.warmup) };
                writeln!(err, "{what} mtp {}: {:.1} tok/s", names[i], pass.decode)?;
            }
            if warm {
                continue;
            }
            let s = &mut samples[i];
            s.decode.push(pass.decode);
            s.prefill.push(pass.prefill);
            s.ttft.push(pass.ttft);
            s.generated = pass.generated;
            s.memory = pass.memory;
            // Acceptance, depth and the verify cost over every measured pass, not the last one
            // alone: `auto` may draft in one pass and not in the next.
            s.stats = match (s.stats.take(), pass.stats) {
                (Some(mut all), Some(this)) => {
                    all.merge(&this);
                    Some(all)
                }
                (all, this) => this.or(all),
            };
        }
    }
    let mut rows: Vec<BenchRow> = names.iter().zip(&samples).filter_map(|(name, s)| row(name, s)).collect();
    if let Some(base) = rows.iter().find(|r| r.mtp == "0").map(|r| r.decode_tok_s) {
        let step_ms = 1e3 / base.median.max(1e-9);
        for r in rows.iter_mut().filter(|r| r.mtp != "0") {
            r.speedup = Some(Speedup::of(&r.decode_tok_s, &base));
            r.verify_cost = r.verify_ms_per_pass.map(|ms| ms / step_ms);
        }
    }
    let measured_passes: usize = rows.iter().map(|r| r.passes).sum();
    let planned = a.repeat * settings.len();
    let rollback = if a.rollback && !interrupt.interrupted() { Some(rollback_costs()) } else { None };
    let stopped = interrupt.interrupted().then(|| serde_json::json!({"signal": interrupt.signal_name(), "measured_passes": measured_passes, "planned_passes": planned}));
    let lens: Vec<usize> = prompt_ids.iter().map(Vec::len).collect();
    let mut out = std::io::stdout().lock();
    if a.json {
        let mut v = serde_json::json!({
            "model": loaded.name(), "prompts": prompts, "prompt_tokens": lens, "max_tokens": a.max_tokens,
            "warmup": a.warmup, "repeat": a.repeat, "cpu": cpu, "rows": rows, "rollback": rollback,
            "load": {"seconds": loaded.model().load_seconds, "weights_bytes": loaded.model().weight_bytes(),
                     "mapped_bytes": loaded.model().mapped_bytes},
            "devices": loaded.placement().devices,
            "dtype": loaded.dtype().precision.name(), "dtype_why": loaded.dtype().why,
        });
        if let Some(s) = stopped {
            v["interrupted"] = s;
        }
        writeln!(out, "{v}")?;
        return interrupt.finish(measured(measured_passes, planned));
    }
    writeln!(out, "{}", cpu.summary())?;
    writeln!(out, "threads: {} — {}", cpu.threads, cpu.threads_why)?;
    writeln!(out, "dtype: {} — {}", loaded.dtype().precision.name(), loaded.dtype().why)?;
    writeln!(out, "{} · runs on {}", loaded.model().storage_summary(), loaded.placement().devices.join(", "))?;
    print_table(&mut out, loaded.name(), &lens, &a, &rows)?;
    if let Some(rb) = rollback {
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
    interrupt.finish(measured(measured_passes, planned))
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

/// One pass of one setting over every prompt; `None` when a signal cut it short.
fn one_pass(
    generator: &Generator,
    loaded: &Loaded,
    prompt_ids: &[Vec<u32>],
    mtp: MtpMode,
    trace_state: bool,
    max_tokens: usize,
    interrupt: &Interrupt,
) -> anyhow::Result<Option<Pass>> {
    let drafting = mtp.is_on();
    let (mut toks, mut secs, mut pre_toks, mut pre_secs, mut first) = (0usize, 0f64, 0usize, 0f64, vec![]);
    let mut generated = 0;
    let mut stats = MtpStats::new(mtp.depth());
    let mut memory = Memory::default();
    for ids in prompt_ids {
        let params = GenerationParams {
            max_tokens,
            sampling: SamplingParams::default(),
            mtp,
            trace_state,
            ..Default::default()
        };
        let mut session = loaded.compute().sequence(drafting)?;
        let started = Instant::now();
        let out = generator.generate(
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

fn print_table(
    out: &mut impl Write,
    model: &str,
    lens: &[usize],
    a: &BenchArgs,
    rows: &[BenchRow],
) -> std::io::Result<()> {
    let (lo, hi) = (lens.iter().min().copied().unwrap_or(0), lens.iter().max().copied().unwrap_or(0));
    let tokens = if lo == hi { format!("{lo}") } else { format!("{lo}–{hi}") };
    writeln!(
        out,
        "{model} · {} prompts of {tokens} tokens · greedy · max_tokens {} · {} warm-up + {} measured passes per setting, interleaved",
        lens.len(),
        a.max_tokens,
        a.warmup,
        a.repeat
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
    )?;
    let mut noisy = false;
    for r in rows {
        let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map(f).unwrap_or_else(|| "-".into());
        let depth = match (r.mtp.as_str(), r.final_depth) {
            // Depth 0 at the end: auto measured drafting slower than plain decoding and turned it off.
            ("auto", Some(0)) => "auto→off".into(),
            ("auto", Some(d)) => format!("auto→{d}"),
            _ => r.mtp.clone(),
        };
        let speedup = match r.speedup {
            Some(s) => {
                noisy |= s.within_spread;
                format!("{}{:.2}× {:.2}–{:.2}", if s.within_spread { "≈" } else { "" }, s.median, s.min, s.max)
            }
            None if r.mtp == "0" => "base".into(),
            None => "-".into(),
        };
        let d = &r.decode_tok_s;
        writeln!(
            out,
            "{:>7} {:>9.1} {:>15} {:>7.0}% {:>15} {:>9.1} {:>10.1} {:>7} {:>5} {:>13} {:>6} {:>7} {:>6}",
            depth,
            d.median,
            format!("{:.1}–{:.1}", d.min, d.max),
            d.spread * 100.0,
            speedup,
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
        )?;
    }
    if noisy {
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
