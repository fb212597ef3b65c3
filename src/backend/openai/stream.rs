//! One generation against a server: POST the request, read the SSE stream frame by frame into
//! the [`FrameMapper`], and end with `done` or `error` — never a hang: an idle timeout bounds a
//! silent server, a frame larger than [`MAX_FRAME`] is refused, a cancel closes the connection
//! within one poll interval, and whatever arrived is kept.

use std::sync::Arc;
use std::sync::mpsc::Sender;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::Value;

use super::detect::{ServerFacts, ServerKind};
use super::frames::{End, Flow, FrameMapper, MetricsDelta};
use super::http::{Ask, Http, check_status, transport_error};
use super::metrics;
use super::tokenize::tokenize;
use deltascope_protocol::{Control, EngineEvent, ErrorKind, FinishReason, StepControl};

/// The largest SSE frame accepted (a runaway or hostile server cannot fill memory).
pub const MAX_FRAME: usize = 1 << 20;
/// How often a running stream looks at the cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(20);

pub struct StreamJob {
    pub http: Http,
    pub facts: Arc<ServerFacts>,
    pub path: &'static str,
    pub body: Value,
    pub mapper: FrameMapper,
    pub idle_timeout: Duration,
    /// For the response headers and the first frame.
    pub first_byte_timeout: Duration,
    pub control: Arc<StepControl>,
    pub events: Sender<EngineEvent>,
    /// Client-forced end of thinking (budget, loop rescue): stop the stream here and continue
    /// from the bridge.
    pub client_budget: Option<ClientBudget>,
    /// How to count the prompt when no usage frame says it (the stream closed before it).
    pub prompt_count: PromptCount,
}

/// What can count a request's prompt when the server's usage frame never arrives (deltascope
/// closed the stream itself: Esc, a loop stop, Ctrl+C; or the server sends none).
pub struct PromptCount {
    /// The chat as sent, and whether thinking is on: the server renders and counts it where it
    /// can (llama.cpp and deltascope `/apply-template` + `/tokenize`, vLLM `/tokenize`).
    pub messages: Option<Value>,
    pub thinking: bool,
    /// Counted here: the local tokenizer (`--tokenizer DIR`) over the rendered chat, or the
    /// characters' count when nothing can tokenize it; with where the count comes from.
    pub fallback: (usize, String),
}

/// What a client-forced end of thinking needs to continue with `/v1/completions`.
pub struct ClientBudget {
    /// The thinking budget is enforced here (`--budget-mode client`); otherwise only a rescue
    /// (a loop under `--on-loop answer`, or the user's key) forces the end of thinking.
    pub enforce_budget: bool,
    /// The prompt rendered through the chat template (with the generation prompt).
    pub rendered_prompt: String,
    pub bridge: String,
    pub max_tokens: usize,
    /// The `/v1/completions` body for a prompt (text, or token ids) and a max_tokens.
    pub continuation: Box<dyn Fn(Value, usize) -> Value + Send>,
}

enum Outcome {
    End(End),
    /// The thinking budget ran out: continue from the bridge.
    Budget,
}

pub async fn run(mut job: StreamJob) {
    let before = metrics_snapshot(&job.http, &job.facts).await;
    let tx = job.events.clone();
    let mut emit = |e: EngineEvent| {
        let _ = tx.send(e);
    };
    let (path, body) = (job.path, job.body.clone());
    let mut outcome = one_stream(&mut job, path, body, &mut emit).await;
    if let Outcome::Budget = outcome {
        outcome = continue_after_budget(&mut job, &mut emit).await;
    }
    let end = match outcome {
        Outcome::End(e) => e,
        Outcome::Budget => End::Complete,
    };
    if !job.mapper.prompt_count_known() {
        let (n, source) = count_prompt(&job.http, &job.facts, &job.prompt_count).await;
        job.mapper.estimate_prompt(n, source);
    }
    let delta = if matches!(end, End::Complete) {
        let after = metrics_snapshot(&job.http, &job.facts).await;
        if let Some(mem) = after.as_ref().and_then(|(_, m)| m.clone()) {
            job.mapper.server_memory = Some(mem);
        }
        match (before, after) {
            (Some((Some(b), _)), Some((Some(a), _))) => {
                let d = a.since(&b);
                Some(MetricsDelta {
                    drafts: d.drafts,
                    per_position: d.per_position,
                    source: format!(
                        "{} /metrics (server-wide counters, read around the request)",
                        job.facts.kind.name()
                    ),
                })
            }
            _ => None,
        }
    } else {
        None
    };
    job.mapper.finish(end, delta, &mut emit);
}

/// The prompt's length when no usage frame said it: the server's own count of the rendered
/// chat where it offers one, else the fallback counted here.
async fn count_prompt(http: &Http, facts: &ServerFacts, pc: &PromptCount) -> (usize, String) {
    if let Some(messages) = &pc.messages
        && let Ok(Some(p)) = super::tokenize::chat_prompt_value(http, facts, messages, pc.thinking).await
        && !p.ids.is_empty()
    {
        return (p.ids.len(), format!("{}'s /tokenize of the rendered chat (no usage frame came)", facts.kind.name()));
    }
    pc.fallback.clone()
}

type Snapshot = (Option<metrics::SpecCounters>, Option<deltascope_protocol::ServerMemory>);

async fn metrics_snapshot(http: &Http, facts: &ServerFacts) -> Option<Snapshot> {
    if !facts.metrics {
        return None;
    }
    let text = http.try_get_text("/metrics").await?;
    let samples = metrics::parse(&text);
    let prefix = match facts.kind {
        ServerKind::LlamaCpp => "llamacpp:",
        ServerKind::Vllm => "vllm:",
        ServerKind::Deltascope => "deltascope_",
        _ => "",
    };
    let spec = if prefix.is_empty() { None } else { metrics::spec_counters(&samples, prefix) };
    Some((spec, metrics::kv_usage(&samples)))
}

/// Which timeout fired while waiting for a request's first answer.
fn first_byte_silence(url: &str, waited: Duration, what: &str) -> String {
    format!(
        "{url}: no {what} after {:.0} s (--first-byte-timeout; a long prompt's prefill may need more)",
        waited.as_secs_f64()
    )
}

async fn one_stream(
    job: &mut StreamJob,
    path: &str,
    body: Value,
    emit: &mut (dyn FnMut(EngineEvent) + Send),
) -> Outcome {
    let url = job.http.url(path);
    let resp = match answered(job, path, &url, &body).await {
        Ok(r) => r,
        Err(out) => return out,
    };
    let ctype =
        resp.headers().get(reqwest::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("").to_lowercase();
    if ctype.starts_with("application/json") {
        return whole_answer(job, resp, emit).await;
    }
    if !ctype.starts_with("text/event-stream") {
        let first: String = resp.text().await.unwrap_or_default().chars().take(60).collect();
        return fail_with(
            ErrorKind::Unavailable,
            format!(
                "{url} answered {ctype} (\"{}…\"), not an event stream: this URL does not look like an OpenAI-compatible API",
                first.replace(['\n', '\r'], " ")
            ),
        );
    }
    read_stream(job, &url, resp, emit).await
}

/// Sends the request and waits for its headers (within the first-byte timeout, unless
/// cancelled), then checks the status.
async fn answered(job: &mut StreamJob, path: &str, url: &str, body: &Value) -> Result<reqwest::Response, Outcome> {
    let send = tokio::time::timeout(job.first_byte_timeout, job.http.send(Ask::Post(body), path, None));
    let resp = tokio::select! {
        r = send => r,
        _ = cancelled(&job.control) => return Err(Outcome::End(End::Cancelled)),
    };
    let resp = match resp {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => return Err(fail(transport_error(url, &e))),
        Err(_) => {
            return Err(fail_with(
                ErrorKind::Unavailable,
                first_byte_silence(url, job.first_byte_timeout, "response headers"),
            ));
        }
    };
    check_status(path, resp, &job.http.key_hint(), &job.facts.models).await.map_err(fail)
}

/// Reads the event stream to its end (or `[DONE]`), each frame through the mapper. The first
/// frame may wait for a long prefill; after it, frames come at decode pace.
async fn read_stream(
    job: &mut StreamJob,
    url: &str,
    resp: reqwest::Response,
    emit: &mut (dyn FnMut(EngineEvent) + Send),
) -> Outcome {
    let mut frame = FrameSize::default();
    let bytes = resp.bytes_stream().map(move |chunk| {
        let chunk = chunk?;
        frame.feed(&chunk)?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(chunk)
    });
    let mut events = bytes.eventsource();
    let mut first = true;
    loop {
        let wait = if first { job.first_byte_timeout } else { job.idle_timeout };
        let next = tokio::select! {
            n = tokio::time::timeout(wait, events.next()) => n,
            _ = cancelled(&job.control) => return Outcome::End(End::Cancelled),
        };
        let ev = match next {
            Err(_) if first => {
                return fail_with(ErrorKind::Unavailable, first_byte_silence(url, wait, "first stream frame"));
            }
            Err(_) => {
                return fail_with(
                    ErrorKind::Unavailable,
                    format!(
                        "{url}: the server sent nothing for {:.0} s in the middle of the stream (--idle-timeout)",
                        job.idle_timeout.as_secs_f64()
                    ),
                );
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return fail_with(ErrorKind::Unavailable, broken_stream(url, &error_chain(&e))),
            Ok(Some(Ok(ev))) => ev,
        };
        first = false;
        match take_frame(job, url, &ev, emit) {
            Frame::Next => {}
            Frame::Done => break,
            Frame::Out(out) => return out,
        }
    }
    Outcome::End(End::Complete)
}

/// Why a stream broke: a frame over the size limit, or the connection closed early.
fn broken_stream(url: &str, text: &str) -> String {
    if text.contains("frame larger") {
        format!("{url}: a stream frame is larger than {} MiB; refusing it", MAX_FRAME >> 20)
    } else {
        format!("{url}: the connection closed before the stream ended ({text})")
    }
}

/// What one stream frame leads to.
enum Frame {
    /// Read the next frame.
    Next,
    /// `[DONE]`: the stream is complete.
    Done,
    Out(Outcome),
}

/// One frame: its tokens go out through the mapper; a stop, a spent client-side budget or a
/// loop to rescue ends the stream.
fn take_frame(
    job: &mut StreamJob,
    url: &str,
    ev: &eventsource_stream::Event,
    emit: &mut (dyn FnMut(EngineEvent) + Send),
) -> Frame {
    let data = ev.data.trim();
    if data.is_empty() {
        return Frame::Next;
    }
    if data == "[DONE]" {
        return Frame::Done;
    }
    let value: Value = match serde_json::from_str(data) {
        Ok(v) => v,
        Err(e) => {
            let head: String = data.chars().take(60).collect();
            let why = format!("{url}: malformed JSON in a stream frame ({e}): {head}…");
            return Frame::Out(fail_with(ErrorKind::Internal, why));
        }
    };
    // Named events (SGLang's `sglext_ids`) carry no tokens of their own.
    if !ev.event.is_empty() && ev.event != "message" && value.get("choices").is_none() {
        return Frame::Next;
    }
    if let Flow::Stop(f) = job.mapper.frame(&value, emit) {
        return Frame::Out(Outcome::End(End::Stopped(f)));
    }
    if let Some(cb) = &job.client_budget {
        if job.control.end_thinking_requested() {
            job.mapper.request_end_of_thinking();
        }
        let tally = job.mapper.tally();
        if (cb.enforce_budget && tally.budget_spent()) || tally.rescue_due() {
            return Frame::Out(Outcome::Budget);
        }
    }
    Frame::Next
}

/// A client-forced end of thinking (the budget spent, or a loop rescued): the bridge and
/// `</think>` go out as forced tokens, then
/// `/v1/completions` continues from exactly what the engine would hold — the rendered prompt,
/// the thinking tokens, the bridge's tokens and `</think>`, as token ids when the server can
/// tokenize (llama.cpp, vLLM) — and the model writes the rest, the blank line included.
async fn continue_after_budget(job: &mut StreamJob, emit: &mut (dyn FnMut(EngineEvent) + Send)) -> Outcome {
    let Some(b) = job.client_budget.take() else { return Outcome::End(End::Complete) };
    let prompt_ids = tokenize(&job.http, &job.facts, &b.rendered_prompt).await;
    let bridge = tokenize(&job.http, &job.facts, &b.bridge).await;
    let end = tokenize(&job.http, &job.facts, THINK_END).await;
    // One forced token per bridge token (the server's pieces), then `</think>`.
    let forced: Vec<(Option<u32>, String)> = match (&bridge, &end) {
        (Some(br), Some(e)) if e.len() == 1 => {
            let mut f: Vec<(Option<u32>, String)> = br.iter().map(|(id, t)| (Some(*id), t.clone())).collect();
            f.push((Some(e[0].0), THINK_END.to_string()));
            f
        }
        _ => [(None, b.bridge.clone()), (None, THINK_END.to_string())]
            .into_iter()
            .filter(|(_, t)| !t.is_empty())
            .collect(),
    };
    // The thinking as token ids (a server sends them with logprobs, which client mode asks for).
    let thinking_ids: Option<Vec<u32>> = job.mapper.tally().ids().iter().copied().collect();
    // As many forced tokens as max_tokens leaves room for (as the engine forces them).
    let room = b.max_tokens.saturating_sub(job.mapper.tally().generated());
    job.mapper.force_end_of_thinking(forced.clone(), room, emit);
    if forced.len() > room {
        return Outcome::End(End::Stopped(FinishReason::Length));
    }
    job.mapper.prompt_tokens = prompt_ids.as_ref().map(Vec::len);
    let remaining = b.max_tokens.saturating_sub(job.mapper.tally().generated());
    if remaining == 0 {
        return Outcome::End(End::Stopped(FinishReason::Length));
    }
    let prompt = match (prompt_ids, thinking_ids, forced.iter().map(|f| f.0).collect::<Option<Vec<u32>>>()) {
        (Some(p), Some(t), Some(f)) => {
            let ids: Vec<u32> = p.iter().map(|x| x.0).chain(t).chain(f).collect();
            serde_json::json!(ids)
        }
        // No tokenizer on the server (or ids missing): the text, which it may split otherwise.
        _ => Value::String(format!("{}{}{THINK_END}", b.rendered_prompt, job.mapper.tally().thinking_text())),
    };
    let body = (b.continuation)(prompt, remaining);
    one_stream(job, "/v1/completions", body, emit).await
}

const THINK_END: &str = "</think>";

/// Bytes of the SSE frame being received, across chunks: a blank line (after `\n`, `\r\n`
/// or `\r` line ends, as the SSE spec allows) ends a frame.
#[derive(Debug, Default)]
struct FrameSize {
    frame: usize,
    line: usize,
    prev_cr: bool,
}

impl FrameSize {
    fn feed(&mut self, chunk: &[u8]) -> Result<(), FrameTooLarge> {
        for &b in chunk {
            if b == b'\n' && self.prev_cr {
                self.prev_cr = false;
                continue; // the second half of a CRLF
            }
            self.prev_cr = b == b'\r';
            if b == b'\n' || b == b'\r' {
                if self.line == 0 {
                    self.frame = 0;
                }
                self.line = 0;
            } else {
                self.line += 1;
                self.frame += 1;
                if self.frame > MAX_FRAME {
                    return Err(FrameTooLarge);
                }
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct FrameTooLarge;

impl std::fmt::Display for FrameTooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "frame larger than {} bytes", MAX_FRAME)
    }
}

impl std::error::Error for FrameTooLarge {}

/// A server that ignored `stream: true` and sent one `chat.completion`: its text is kept, and
/// the run ends with an error that says so.
async fn whole_answer(
    job: &mut StreamJob,
    resp: reqwest::Response,
    emit: &mut (dyn FnMut(EngineEvent) + Send),
) -> Outcome {
    let url = resp.url().to_string();
    let value: Value = match resp.json().await {
        Ok(v) => v,
        Err(e) => return fail_with(ErrorKind::Internal, format!("{url}: malformed JSON answer: {e}")),
    };
    job.mapper.frame(&value, emit);
    fail_with(
        ErrorKind::Internal,
        format!(
            "{url} ignored \"stream\": true and sent the whole answer at once (kept, but nothing streamed: no timings or live gauges)"
        ),
    )
}

fn fail(e: crate::backend::BackendError) -> Outcome {
    Outcome::End(End::Failed(e.kind, e.message))
}

fn fail_with(kind: ErrorKind, message: String) -> Outcome {
    Outcome::End(End::Failed(kind, message))
}

/// An error with its causes, one line ("error decoding response body: …: connection closed
/// before message completed").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut parts = vec![e.to_string()];
    let mut src = e.source();
    while let Some(s) = src {
        let t = s.to_string();
        if !parts.iter().any(|p| p.contains(&t)) {
            parts.push(t);
        }
        src = s.source();
    }
    parts.join(": ")
}

/// Resolves once the generation is cancelled.
async fn cancelled(control: &StepControl) {
    while !control.is_cancelled() {
        tokio::time::sleep(CANCEL_POLL).await;
    }
}
