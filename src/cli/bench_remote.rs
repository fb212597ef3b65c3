//! `deltascope bench --server URL`: the per-request figures a server reports — TTFT, prefill
//! and decode speed, tokens, and its speculative-decoding acceptance — over the same prompts,
//! repeated, with medians. (The local bench measures the engine itself; a server's engine is
//! its own, so only what the wire carries is measured here.)

use std::io::Write;

use serde::Serialize;

use super::bench_args::BenchArgs;
use super::bench_stats::Spread;
use super::common;
use super::interrupt::Interrupt;
use crate::backend::{ChatMessage, ChatRequest, Prompt, Role};
use deltascope_protocol::{EngineEvent, ErrorKind, FinishReason, MtpStats};

#[derive(Debug, Serialize)]
pub struct RequestRow {
    pub prompt: usize,
    pub run: usize,
    pub finish_reason: FinishReason,
    pub completion_tokens: usize,
    pub thinking_tokens: usize,
    /// `None` when no token came.
    pub ttft_ms: Option<f64>,
    pub prefill_tok_s: f64,
    pub decode_tok_s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mtp: Option<MtpStats>,
}

pub fn run(a: &BenchArgs, prompts: &[String]) -> anyhow::Result<()> {
    let backend = common::open(&a.model)?;
    let info = backend.info().clone();
    let interrupt = Interrupt::install()?;
    let mut overrides = crate::backend::ParamOverrides { max_tokens: a.max_tokens, ..Default::default() };
    overrides.temperature = Some(0.0);
    let params = overrides.resolve(&info)?;
    let mut rows = vec![];
    let mut err = std::io::stderr().lock();
    // The first `--warmup` passes are run and not measured (the server's caches, its clocks).
    'runs: for pass in 0..a.warmup + a.repeat {
        let warm = pass < a.warmup;
        let run = pass.saturating_sub(a.warmup);
        for (i, p) in prompts.iter().enumerate() {
            if interrupt.interrupted() {
                break 'runs;
            }
            let req = ChatRequest {
                prompt: Prompt::Chat(vec![ChatMessage::new(Role::User, p.clone())]),
                params: params.clone(),
            };
            let generation = backend.start(req)?;
            let control = generation.control();
            interrupt.on_signal(move || control.cancel());
            // A request cut short by the signal measures the interruption: it is left out.
            let d = match generation.for_each(|_| {}) {
                EngineEvent::Done(d) if d.finish_reason == FinishReason::Cancelled => break 'runs,
                EngineEvent::Error(e) if e.kind == ErrorKind::Cancelled => break 'runs,
                EngineEvent::Done(d) => d,
                EngineEvent::Error(e) => anyhow::bail!("prompt {}: {}", i + 1, e.message),
                _ => anyhow::bail!("prompt {}: the stream ended without a done event", i + 1),
            };
            let row = RequestRow {
                prompt: i,
                run,
                finish_reason: d.finish_reason,
                completion_tokens: d.usage.completion_tokens,
                thinking_tokens: d.usage.thinking_tokens,
                ttft_ms: d.timing.ttft_ms,
                prefill_tok_s: d.timing.prefill_tok_s,
                decode_tok_s: d.timing.decode_tok_s,
                mtp: d.mtp,
            };
            if !a.json {
                writeln!(
                    err,
                    "{} {} prompt {}: {} tokens, TTFT {}, decode {:.1} tok/s",
                    if warm { "warm-up" } else { "run" },
                    if warm { pass + 1 } else { run + 1 },
                    i + 1,
                    row.completion_tokens,
                    row.ttft_ms.map_or_else(|| "-".to_string(), |ms| format!("{ms:.1} ms")),
                    row.decode_tok_s
                )?;
            }
            if !warm {
                rows.push(row);
            }
        }
    }
    let spread =
        |f: &dyn Fn(&RequestRow) -> f64| Spread::of(&rows.iter().map(f).collect::<Vec<_>>()).unwrap_or_default();
    // The requests that produced a first token (the others have no TTFT).
    let ttft = Spread::of(&rows.iter().filter_map(|r| r.ttft_ms).collect::<Vec<_>>()).unwrap_or_default();
    let with_mtp: Vec<&MtpStats> = rows.iter().filter_map(|r| r.mtp.as_ref()).collect();
    let mut total = MtpStats::default();
    with_mtp.iter().for_each(|m| total.merge(m));
    let summary = serde_json::json!({
        "ttft_ms": ttft.clone(),
        "prefill_tok_s": spread(&|r| r.prefill_tok_s),
        "decode_tok_s": spread(&|r| r.decode_tok_s),
        "mtp_acceptance_rate": if with_mtp.is_empty() { None } else { Some(total.acceptance_rate) },
        "mtp_per_position": if with_mtp.is_empty() { None } else { Some(total.per_position.clone()) },
        "mtp_source": with_mtp.first().and_then(|m| m.source.clone()),
    });
    let mut out = std::io::stdout().lock();
    let planned = a.repeat * prompts.len();
    if a.json {
        let mut v = serde_json::json!({"server": info.label(), "model": info.name, "prompts": prompts, "max_tokens": a.max_tokens, "warmup": a.warmup, "requests": rows, "summary": summary});
        if interrupt.interrupted() {
            v["interrupted"] = serde_json::json!({"signal": interrupt.signal_name(), "completed_requests": rows.len(), "planned_requests": planned});
        }
        writeln!(out, "{v}")?;
        return interrupt.finish(measured(rows.len(), planned));
    }
    writeln!(
        out,
        "{} · {} · {} prompts × {} (after {} warm-up) · greedy · max_tokens {}",
        info.label(),
        info.name,
        prompts.len(),
        a.repeat,
        a.warmup,
        a.max_tokens
    )?;
    let range = |s: Spread, unit: &str| format!("{:.1} {unit} (min {:.1}, max {:.1})", s.median, s.min, s.max);
    writeln!(
        out,
        "median TTFT {} · prefill {} · decode {} (as seen by the client)",
        range(ttft, "ms"),
        range(spread(&|r| r.prefill_tok_s), "tok/s"),
        range(spread(&|r| r.decode_tok_s), "tok/s")
    )?;
    if with_mtp.is_empty() {
        writeln!(out, "MTP: not reported by the server")?;
    } else {
        let pos = total.per_position.iter().map(|x| format!("{:.0}", x * 100.0)).collect::<Vec<_>>().join("/");
        writeln!(
            out,
            "MTP: acceptance {:.0}% ({} of {} drafts) · per position {} % · from {}",
            total.acceptance_rate * 100.0,
            total.accepted,
            total.drafted,
            if pos.is_empty() { "-".into() } else { pos },
            with_mtp[0].source.clone().unwrap_or_default()
        )?;
    }
    interrupt.finish(measured(rows.len(), planned))
}

fn measured(done: usize, planned: usize) -> String {
    format!("{done} of {planned} requests measured (the one in flight was left out)")
}
