//! `deltascope bench --server URL`: the per-request figures a server reports — TTFT, prefill
//! and decode speed, tokens, and its speculative-decoding acceptance — over the same prompts,
//! repeated, with medians. (The local bench measures the engine itself; a server's engine is
//! its own, so only what the wire carries is measured here.)

use std::io::{self, Write};

use serde::Serialize;

use super::bench_args::BenchArgs;
use super::bench_stats::Spread;
use super::common;
use super::interrupt::Interrupt;
use super::report::{Report, emit};
use crate::backend::{Backend, ChatMessage, ChatRequest, Prompt, Role};
use deltascope_protocol::{EngineEvent, ErrorKind, FinishReason, GenerationParams, MtpStats};

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

/// `bench --server`'s result. The fields in order are the JSON's keys.
#[derive(Serialize)]
struct RemoteBenchReport {
    server: String,
    model: String,
    prompts: Vec<String>,
    max_tokens: usize,
    warmup: usize,
    /// The measured requests (the warm-up ones are not kept).
    requests: Vec<RequestRow>,
    summary: Summary,
    /// Only when a signal stopped the requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    interrupted: Option<Stopped>,
    /// `--repeat` (the text says it; the JSON has the requests themselves).
    #[serde(skip)]
    repeat: usize,
}

/// Medians, minima and maxima over the measured requests, and the MTP acceptance of those that
/// reported one (every field of it null when none did).
#[derive(Serialize)]
struct Summary {
    /// Over the requests that produced a first token (the others have no TTFT).
    ttft_ms: Spread,
    prefill_tok_s: Spread,
    decode_tok_s: Spread,
    mtp_acceptance_rate: Option<f64>,
    mtp_per_position: Option<Vec<f64>>,
    mtp_source: Option<String>,
}

impl Summary {
    fn of(rows: &[RequestRow]) -> Summary {
        let spread =
            |f: &dyn Fn(&RequestRow) -> f64| Spread::of(&rows.iter().map(f).collect::<Vec<_>>()).unwrap_or_default();
        let with_mtp: Vec<&MtpStats> = rows.iter().filter_map(|r| r.mtp.as_ref()).collect();
        let mut total = MtpStats::default();
        with_mtp.iter().for_each(|m| total.merge(m));
        let reported = !with_mtp.is_empty();
        Summary {
            ttft_ms: Spread::of(&rows.iter().filter_map(|r| r.ttft_ms).collect::<Vec<_>>()).unwrap_or_default(),
            prefill_tok_s: spread(&|r| r.prefill_tok_s),
            decode_tok_s: spread(&|r| r.decode_tok_s),
            mtp_acceptance_rate: reported.then_some(total.acceptance_rate),
            mtp_per_position: reported.then_some(total.per_position),
            mtp_source: with_mtp.first().and_then(|m| m.source.clone()),
        }
    }
}

/// What was measured when a signal stopped the requests.
#[derive(Serialize)]
struct Stopped {
    signal: &'static str,
    completed_requests: usize,
    planned_requests: usize,
}

impl Report for RemoteBenchReport {
    fn print_human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "{} · {} · {} prompts × {} (after {} warm-up) · greedy · max_tokens {}",
            self.server,
            self.model,
            self.prompts.len(),
            self.repeat,
            self.warmup,
            self.max_tokens
        )?;
        let s = &self.summary;
        let range = |s: Spread, unit: &str| format!("{:.1} {unit} (min {:.1}, max {:.1})", s.median, s.min, s.max);
        writeln!(
            out,
            "median TTFT {} · prefill {} · decode {} (as seen by the client)",
            range(s.ttft_ms, "ms"),
            range(s.prefill_tok_s, "tok/s"),
            range(s.decode_tok_s, "tok/s")
        )?;
        self.print_mtp(out)
    }

    /// One line.
    fn print_json(&self, out: &mut dyn Write) -> io::Result<()> {
        serde_json::to_writer(&mut *out, self)?;
        writeln!(out)
    }
}

impl RemoteBenchReport {
    /// The server's speculative decoding over the measured requests, or that it reports none.
    fn print_mtp(&self, out: &mut dyn Write) -> io::Result<()> {
        let s = &self.summary;
        let Some(rate) = s.mtp_acceptance_rate else { return writeln!(out, "MTP: not reported by the server") };
        let (accepted, drafted) = self
            .requests
            .iter()
            .filter_map(|r| r.mtp.as_ref())
            .fold((0, 0), |(a, d), m| (a + m.accepted, d + m.drafted));
        let per_position = s.mtp_per_position.as_deref().unwrap_or_default();
        let pos = per_position.iter().map(|x| format!("{:.0}", x * 100.0)).collect::<Vec<_>>().join("/");
        writeln!(
            out,
            "MTP: acceptance {:.0}% ({accepted} of {drafted} drafts) · per position {} % · from {}",
            rate * 100.0,
            if pos.is_empty() { "-".into() } else { pos },
            s.mtp_source.clone().unwrap_or_default()
        )
    }
}

/// What every request runs on: the server, greedy parameters, and the signal that stops them.
struct Requests<'a> {
    backend: &'a dyn Backend,
    params: GenerationParams,
    interrupt: &'a Interrupt,
}

impl Requests<'_> {
    /// The first `--warmup` passes over the prompts are run and not measured (the server's
    /// caches, its clocks); then `--repeat` measured ones. Each request is said on stderr
    /// (unless `--json`). A signal ends the passes with what was measured.
    fn measure(&self, a: &BenchArgs, prompts: &[String]) -> anyhow::Result<Vec<RequestRow>> {
        let mut rows = vec![];
        let mut err = io::stderr().lock();
        for pass in 0..a.warmup + a.repeat {
            let warm = pass < a.warmup;
            let run = pass.saturating_sub(a.warmup);
            for (i, p) in prompts.iter().enumerate() {
                if self.interrupt.interrupted() {
                    return Ok(rows);
                }
                let Some(row) = self.one(i, p, run)? else { return Ok(rows) };
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
        Ok(rows)
    }

    /// Prompt `i` once; `None` when the signal cut it short (it measures the interruption and
    /// is left out).
    fn one(&self, i: usize, prompt: &str, run: usize) -> anyhow::Result<Option<RequestRow>> {
        let req = ChatRequest {
            prompt: Prompt::Chat(vec![ChatMessage::new(Role::User, prompt.to_string())]),
            params: self.params.clone(),
        };
        let generation = self.backend.start(req)?;
        let control = generation.control();
        self.interrupt.on_signal(move || control.cancel());
        let d = match generation.for_each(|_| {}) {
            EngineEvent::Done(d) if d.finish_reason == FinishReason::Cancelled => return Ok(None),
            EngineEvent::Error(e) if e.kind == ErrorKind::Cancelled => return Ok(None),
            EngineEvent::Done(d) => d,
            EngineEvent::Error(e) => anyhow::bail!("prompt {}: {}", i + 1, e.message),
            _ => anyhow::bail!("prompt {}: the stream ended without a done event", i + 1),
        };
        Ok(Some(RequestRow {
            prompt: i,
            run,
            finish_reason: d.finish_reason,
            completion_tokens: d.usage.completion_tokens,
            thinking_tokens: d.usage.thinking_tokens,
            ttft_ms: d.timing.ttft_ms,
            prefill_tok_s: d.timing.prefill_tok_s,
            decode_tok_s: d.timing.decode_tok_s,
            mtp: d.mtp,
        }))
    }
}

pub fn run(a: &BenchArgs, prompts: &[String]) -> anyhow::Result<()> {
    let backend = common::open(&a.model)?;
    let info = backend.info().clone();
    let interrupt = Interrupt::install()?;
    let mut overrides = crate::backend::ParamOverrides { max_tokens: a.max_tokens, ..Default::default() };
    overrides.temperature = Some(0.0);
    let params = overrides.resolve(&info)?;
    let requests = Requests { backend: backend.as_ref(), params, interrupt: &interrupt };
    let rows = requests.measure(a, prompts)?;
    let planned = a.repeat * prompts.len();
    let interrupted = interrupt.interrupted().then(|| Stopped {
        signal: interrupt.signal_name(),
        completed_requests: rows.len(),
        planned_requests: planned,
    });
    let report = RemoteBenchReport {
        server: info.label(),
        model: info.name,
        prompts: prompts.to_vec(),
        max_tokens: a.max_tokens,
        warmup: a.warmup,
        summary: Summary::of(&rows),
        requests: rows,
        interrupted,
        repeat: a.repeat,
    };
    emit(&report, a.json)?;
    interrupt.finish(measured(report.requests.len(), planned))
}

fn measured(done: usize, planned: usize) -> String {
    format!("{done} of {planned} requests measured (the one in flight was left out)")
}
