//! `deltascope bench`: prefill and decode speed, TTFT, MTP acceptance and speed-up per draft
//! depth, memory; and the cost of the two rollback schemes for speculative decoding.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde::Serialize;

use super::common::{self, ModelArgs};
use super::interrupt::Interrupt;
use crate::backend::{ChatMessage, ChatRequest, Prompt, Role};
use crate::engine::{
    GenerateRequest, GenerationParams, Generator, Memory, ModelSession, MtpParams, MtpStats, SamplingParams,
};
use crate::model::gdn::replay_head;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompts to run (repeatable; `-` reads one from standard input); the default set suits
    /// the demo model.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Vec<String>,
    /// A prompt from a file (repeatable; each file is one prompt).
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Vec<PathBuf>,
    /// MTP depths to compare (0 = plain decoding; `auto` adapts). Local engine only: a
    /// server's speculative decoding is set where it was started.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,3", value_name = "LIST")]
    pub mtp: Vec<String>,
    #[arg(long, default_value_t = 256, value_name = "N")]
    pub max_tokens: usize,
    /// Runs per setting (the median is reported).
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub repeat: usize,
    /// Also time the rollback schemes on a Qwen3.6-27B-shaped GDN layer.
    #[arg(long)]
    pub rollback: bool,
    #[arg(long)]
    pub json: bool,
}

pub const DEMO_PROMPTS: [&str; 4] =
    ["Sort 93, 17, 56, 41, 8, 72.", "How many r are in strawberry?", "What is 482 + 739?", "Is 197 prime?"];

#[derive(Debug, Serialize)]
pub struct BenchRow {
    pub mtp: String,
    /// Passes over the prompts that finished (fewer than `--repeat` when interrupted).
    pub passes: usize,
    pub generated_tokens: usize,
    pub decode_tok_s: f64,
    pub speedup: Option<f64>,
    pub prefill_tok_s: f64,
    pub ttft_ms: f64,
    pub acceptance_rate: Option<f64>,
    pub mean_accepted_length: Option<f64>,
    pub per_position: Option<Vec<f64>>,
    pub final_depth: Option<usize>,
    pub draft_share: Option<f64>,
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

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.repeat >= 1, "--repeat must be at least 1");
    anyhow::ensure!(a.max_tokens >= 1, "--max-tokens must be at least 1");
    let prompts = prompts(&a)?;
    if a.model.server.server.is_some() {
        // A server: only its per-request figures can be measured (see bench_remote).
        return super::bench_remote::run(&a, &prompts);
    }
    let loaded = common::load_local(&a.model, "bench")?;
    let interrupt = Interrupt::install()?;
    let prompt_ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| {
            let request = ChatRequest {
                prompt: Prompt::Chat(vec![ChatMessage::new(Role::User, p.clone())]),
                enable_thinking: true,
                params: Default::default(),
            };
            loaded.render(&request).map(|(_, ids)| ids)
        })
        .collect::<Result<_, _>>()?;
    let generator = Generator { tokenizer: &loaded.tokenizer, model_name: loaded.name.clone() };
    let mut rows: Vec<BenchRow> = vec![];
    let mut err = std::io::stderr().lock();
    'settings: for setting in &a.mtp {
        let mtp = match setting.as_str() {
            "auto" => MtpParams { depth: 2, auto: true },
            k => MtpParams {
                depth: k.parse().map_err(|_| anyhow::anyhow!("--mtp {k}: expected a depth or auto"))?,
                auto: false,
            },
        };
        anyhow::ensure!(
            mtp.depth == 0 || loaded.model.mtp.is_some(),
            "{} has no MTP head: only --mtp 0 can be measured",
            loaded.name
        );
        let (mut decode, mut prefill, mut ttft) = (vec![], vec![], vec![]);
        let mut stats: Option<MtpStats> = None;
        let mut generated = 0;
        let mut memory = Memory::default();
        let mut runs = 0;
        for _ in 0..a.repeat {
            // One pass over every prompt: tokens and decode time add up across prompts.
            let (mut toks, mut secs, mut pre_toks, mut pre_secs, mut first) = (0usize, 0f64, 0usize, 0f64, vec![]);
            let mut run_stats = MtpStats::new(mtp.depth);
            for ids in &prompt_ids {
                let params = GenerationParams {
                    max_tokens: a.max_tokens,
                    sampling: SamplingParams::default(),
                    mtp,
                    ..Default::default()
                };
                let mut session = if mtp.depth > 0 || mtp.auto {
                    ModelSession::with_mtp(&loaded.model)
                } else {
                    ModelSession::new(&loaded.model)
                };
                let started = Instant::now();
                let out = generator.generate(
                    &mut session,
                    &GenerateRequest { prompt_ids: ids.clone(), params },
                    interrupt.cancel_flag(),
                    &mut |_| {},
                )?;
                if interrupt.interrupted() {
                    // A pass cut short measures the interruption, not the engine: it goes.
                    if runs > 0 {
                        rows.push(row(setting, runs, generated, &decode, &prefill, &ttft, stats.as_ref(), &memory));
                    }
                    break 'settings;
                }
                let total = started.elapsed().as_secs_f64();
                let t = out.timing.ttft_ms / 1e3;
                toks += out.tokens.len().saturating_sub(1);
                secs += total - t;
                pre_toks += ids.len();
                pre_secs += ids.len() as f64 / out.timing.prefill_tok_s.max(1e-9);
                first.push(out.timing.ttft_ms);
                memory = crate::engine::LogitsSource::memory(&session);
                if let Some(s) = out.mtp {
                    run_stats.merge(&s);
                }
            }
            generated = toks;
            decode.push(toks as f64 / secs.max(1e-9));
            prefill.push(pre_toks as f64 / pre_secs.max(1e-9));
            ttft.push(median(first));
            if mtp.depth > 0 || mtp.auto {
                stats = Some(run_stats);
            }
            runs += 1;
        }
        let row = row(setting, runs, generated, &decode, &prefill, &ttft, stats.as_ref(), &memory);
        if !a.json {
            writeln!(err, "mtp {setting}: {:.1} tok/s", row.decode_tok_s)?;
        }
        rows.push(row);
    }
    if let Some(base) = rows.iter().find(|r| r.mtp == "0").map(|r| r.decode_tok_s) {
        for r in &mut rows {
            r.speedup = Some(r.decode_tok_s / base);
        }
    }
    let rollback = if a.rollback && !interrupt.interrupted() { Some(rollback_costs()) } else { None };
    let stopped = interrupt.interrupted().then(|| serde_json::json!({"signal": interrupt.signal_name()}));
    let mut out = std::io::stdout().lock();
    if a.json {
        let mut v = serde_json::json!({"model": loaded.name, "prompts": prompts, "max_tokens": a.max_tokens, "rows": rows, "rollback": rollback});
        if let Some(s) = stopped {
            v["interrupted"] = s;
        }
        writeln!(out, "{v}")?;
        return interrupt.finish(measured(rows.len(), a.mtp.len()));
    }
    writeln!(
        out,
        "{} · {} prompts · greedy · max_tokens {} · median of {} passes",
        loaded.name,
        prompts.len(),
        a.max_tokens,
        a.repeat
    )?;
    writeln!(
        out,
        "{:>5} {:>10} {:>8} {:>10} {:>9} {:>9} {:>8} {:>16} {:>7} {:>6}",
        "mtp", "decode/s", "speedup", "prefill/s", "TTFT ms", "accept", "mean len", "per position", "draft%", "passes"
    )?;
    for r in &rows {
        let opt = |x: Option<f64>, f: &dyn Fn(f64) -> String| x.map(f).unwrap_or_else(|| "-".into());
        let depth = match (r.mtp.as_str(), r.final_depth) {
            ("auto", Some(d)) => format!("auto→{d}"),
            _ => r.mtp.clone(),
        };
        writeln!(
            out,
            "{:>5} {:>10.1} {:>8} {:>10.1} {:>9.1} {:>9} {:>8} {:>16} {:>7} {:>6}",
            depth,
            r.decode_tok_s,
            opt(r.speedup, &|x| format!("{x:.2}×")),
            r.prefill_tok_s,
            r.ttft_ms,
            opt(r.acceptance_rate, &|x| format!("{:.0}%", x * 100.0)),
            opt(r.mean_accepted_length, &|x| format!("{x:.2}")),
            r.per_position
                .as_ref()
                .map(|p| p.iter().map(|x| format!("{:.0}", x * 100.0)).collect::<Vec<_>>().join("/"))
                .unwrap_or_else(|| "-".into()),
            opt(r.draft_share, &|x| format!("{:.0}%", x * 100.0)),
            r.passes,
        )?;
    }
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
    interrupt.finish(measured(rows.len(), a.mtp.len()))
}

fn measured(done: usize, planned: usize) -> String {
    format!("{done} of {planned} MTP settings measured (the pass in flight was left out)")
}

/// One setting's row: medians over its finished passes.
#[allow(clippy::too_many_arguments)]
fn row(
    setting: &str,
    passes: usize,
    generated: usize,
    decode: &[f64],
    prefill: &[f64],
    ttft: &[f64],
    stats: Option<&MtpStats>,
    memory: &Memory,
) -> BenchRow {
    BenchRow {
        mtp: setting.to_string(),
        passes,
        generated_tokens: generated,
        decode_tok_s: median(decode.to_vec()),
        speedup: None,
        prefill_tok_s: median(prefill.to_vec()),
        ttft_ms: median(ttft.to_vec()),
        acceptance_rate: stats.map(|s| s.acceptance_rate),
        mean_accepted_length: stats.map(|s| s.mean_accepted_length),
        per_position: stats.map(|s| s.per_position.clone()),
        final_depth: stats.map(|s| s.depth),
        draft_share: stats.map(|s| s.draft_ms / (s.draft_ms + s.verify_ms).max(1e-9)),
        kv_bytes: memory.kv_bytes,
        recurrent_bytes: memory.recurrent_bytes,
        snapshot_bytes: stats.map_or(0, |s| s.snapshot_bytes),
    }
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
