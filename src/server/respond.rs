//! A generation's events as OpenAI responses: SSE frames one per token (`stream: true`), or
//! one JSON body at the end. Thinking goes to `reasoning_content`, the answer to `content`
//! (the qwen3 reasoning parser's split; the `</think>` tag itself is in neither).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde_json::{Value, json};

use super::error::ApiError;
use super::metrics::Metrics;
use super::{Endpoint, Running};
use deltascope_protocol::{Diagnostic, DoneEvent, EngineEvent, ErrorEvent, FinishReason, Phase, TokenEvent};

pub(crate) struct Context {
    pub id: String,
    pub model: String,
    pub created: u64,
    pub endpoint: Endpoint,
    pub logprobs: bool,
    pub include_usage: bool,
    /// See [`super::request::Parsed::separate_reasoning`].
    pub separate_reasoning: bool,
    pub metrics: Arc<Metrics>,
}

/// What vLLM / SGLang put in `finish_reason`: a stop string ends as `stop`, a loop stop too
/// (the `deltascope` extension names the loop), a cancellation as `abort`.
pub fn finish_reason(r: FinishReason) -> &'static str {
    match r {
        FinishReason::Stop | FinishReason::StopString | FinishReason::Loop => "stop",
        FinishReason::Length => "length",
        FinishReason::Cancelled => "abort",
        FinishReason::Error => "error",
    }
}

fn is_tag(t: &TokenEvent) -> bool {
    matches!(t.text.trim(), "<think>" | "</think>")
}

/// The events so far, for the metrics and the final objects.
struct Seen {
    diagnostics: Vec<Diagnostic>,
    last_token: Option<Instant>,
    tokens: usize,
}

impl Seen {
    fn new() -> Self {
        Seen { diagnostics: vec![], last_token: None, tokens: 0 }
    }

    /// Counted as it comes, as vLLM does: a request cut short has still generated its tokens.
    fn token(&mut self, t: &TokenEvent, run: &Running, m: &Metrics) {
        m.generation_tokens.inc();
        if t.phase == Phase::Thinking && !t.forced {
            m.thinking_tokens.inc();
        }
        let now = Instant::now();
        match self.last_token {
            None => m.ttft.observe(now.duration_since(run.started).as_secs_f64()),
            Some(t) => m.inter_token.observe(now.duration_since(t).as_secs_f64()),
        }
        self.last_token = Some(now);
        self.tokens += 1;
    }

    fn done(&self, run: &mut Running, m: &Metrics, d: &DoneEvent) {
        run.finished = true;
        let kinds: Vec<_> = self.diagnostics.iter().map(|d| d.kind).collect();
        m.finished(finish_reason(d.finish_reason), Some(d), &kinds);
        m.e2e.observe(run.arrived.elapsed().as_secs_f64());
    }
}

fn bytes_of(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

/// One token's logprobs in the chat shape (with the token id, which OpenAI's lacks).
fn chat_logprob(t: &TokenEvent) -> Value {
    let top: Vec<Value> = t
        .top_logprobs
        .iter()
        .map(|a| json!({"token": a.text, "logprob": a.logprob, "bytes": bytes_of(&a.text), "token_id": a.id}))
        .collect();
    json!({"token": t.text, "logprob": t.logprob.unwrap_or(0.0), "bytes": bytes_of(&t.text), "token_id": t.id, "top_logprobs": top})
}

/// The legacy completions shape: parallel lists.
fn completion_logprobs(ts: &[&TokenEvent]) -> Value {
    json!({
        "tokens": ts.iter().map(|t| t.text.clone()).collect::<Vec<_>>(),
        "token_ids": ts.iter().map(|t| t.id).collect::<Vec<_>>(),
        "token_logprobs": ts.iter().map(|t| t.logprob).collect::<Vec<_>>(),
        "top_logprobs": ts.iter().map(|t| {
            t.top_logprobs.iter().map(|a| (a.text.clone(), json!(a.logprob))).collect::<serde_json::Map<_, _>>()
        }).collect::<Vec<_>>(),
    })
}

fn usage(d: &DoneEvent) -> Value {
    let u = &d.usage;
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": u.thinking_tokens},
    })
}

/// The `deltascope` extension: what no server reports per request.
fn extension(d: &DoneEvent, diagnostics: &[Diagnostic], run: &Running) -> Value {
    let mtp = d.mtp.as_ref().map(|m| {
        json!({
            "depth": m.depth, "verify_passes": m.steps, "drafted": m.drafted, "accepted": m.accepted,
            "acceptance_rate": m.acceptance_rate, "per_position": m.per_position,
            "accepted_per_position": m.position_counts().iter().map(|c| c.1).collect::<Vec<_>>(),
            "mean_accepted_length": m.mean_accepted_length,
        })
    });
    json!({
        "finish_reason": d.finish_reason.as_str(),
        "thinking_tokens": d.usage.thinking_tokens,
        "answer_tokens": d.usage.answer_tokens,
        "forced_tokens": d.usage.forced_tokens,
        "diagnostics": diagnostics,
        "mtp": mtp,
        "timing": {
            "queue_ms": run.started.duration_since(run.arrived).as_secs_f64() * 1e3,
            "ttft_ms": d.timing.ttft_ms, "prefill_tok_s": d.timing.prefill_tok_s,
            "decode_tok_s": d.timing.decode_tok_s, "total_ms": d.timing.total_ms,
        },
        "memory": d.memory,
    })
}

fn error_value(e: &ErrorEvent) -> Value {
    json!({"error": {"message": e.message, "type": "server_error", "param": null, "code": e.kind.as_str()}})
}

impl Context {
    fn object(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            Endpoint::Completion => "text_completion",
        }
    }

    fn chunk(&self, choices: Value) -> Value {
        json!({"id": self.id, "object": self.object(), "created": self.created, "model": self.model, "choices": choices})
    }

    fn token_frame(&self, t: &TokenEvent) -> Option<Value> {
        let lp = self.logprobs;
        match self.endpoint {
            Endpoint::Chat => {
                if self.separate_reasoning && is_tag(t) {
                    return None;
                }
                let key =
                    if self.separate_reasoning && t.phase == Phase::Thinking { "reasoning_content" } else { "content" };
                let logprobs = if lp { json!({"content": [chat_logprob(t)]}) } else { Value::Null };
                Some(
                    self.chunk(
                        json!([{"index": 0, "delta": {key: t.text}, "logprobs": logprobs, "finish_reason": null}]),
                    ),
                )
            }
            Endpoint::Completion => {
                let logprobs = if lp { completion_logprobs(&[t]) } else { Value::Null };
                Some(self.chunk(json!([{"index": 0, "text": t.text, "logprobs": logprobs, "finish_reason": null}])))
            }
        }
    }

    fn final_frame(&self, d: &DoneEvent) -> Value {
        let reason = finish_reason(d.finish_reason);
        match self.endpoint {
            Endpoint::Chat => self.chunk(json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": reason}])),
            Endpoint::Completion => {
                self.chunk(json!([{"index": 0, "text": "", "logprobs": null, "finish_reason": reason}]))
            }
        }
    }
}

fn frame(v: &Value) -> Result<Bytes, Infallible> {
    Ok(Bytes::from(format!("data: {v}\n\n")))
}

enum Phase2 {
    Start,
    Events,
    Usage(Box<Value>),
    Done,
    End,
}

/// The SSE body: a role frame, one frame per token, the finish frame, the usage frame (with
/// `stream_options.include_usage`; it carries the extension), `data: [DONE]`.
pub(crate) fn stream(ctx: Context, run: Running) -> impl Stream<Item = Result<Bytes, Infallible>> {
    let state = (ctx, run, Seen::new(), Phase2::Start);
    futures_util::stream::unfold(state, |(ctx, mut run, mut seen, phase)| async move {
        match phase {
            Phase2::Start => {
                let first = match ctx.endpoint {
                    Endpoint::Chat => Some(ctx.chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]))),
                    Endpoint::Completion => None,
                };
                let out = first.map_or_else(|| Ok(Bytes::new()), |v| frame(&v));
                Some((out, (ctx, run, seen, Phase2::Events)))
            }
            Phase2::Events => loop {
                let Some(e) = run.rx.recv().await else {
                    // The engine's stream ended without its end: say so, then close.
                    run.finished = true;
                    ctx.metrics.finished("error", None, &[]);
                    let err = ErrorEvent {
                        kind: deltascope_protocol::ErrorKind::Internal,
                        message: "the engine's stream ended early".into(),
                    };
                    return Some((frame(&error_value(&err)), (ctx, run, seen, Phase2::Done)));
                };
                match e {
                    EngineEvent::Token(t) => {
                        seen.token(&t, &run, &ctx.metrics);
                        if let Some(v) = ctx.token_frame(&t) {
                            return Some((frame(&v), (ctx, run, seen, Phase2::Events)));
                        }
                    }
                    EngineEvent::Diagnostic(d) => seen.diagnostics.push(d),
                    EngineEvent::Done(d) => {
                        seen.done(&mut run, &ctx.metrics, &d);
                        let next = if ctx.include_usage {
                            let mut u = ctx.chunk(json!([]));
                            u["usage"] = usage(&d);
                            u["deltascope"] = extension(&d, &seen.diagnostics, &run);
                            Phase2::Usage(Box::new(u))
                        } else {
                            Phase2::Done
                        };
                        return Some((frame(&ctx.final_frame(&d)), (ctx, run, seen, next)));
                    }
                    EngineEvent::Error(e) => {
                        run.finished = true;
                        ctx.metrics.finished("error", None, &[]);
                        return Some((frame(&error_value(&e)), (ctx, run, seen, Phase2::Done)));
                    }
                    _ => {}
                }
            },
            Phase2::Usage(u) => Some((frame(&u), (ctx, run, seen, Phase2::Done))),
            Phase2::Done => Some((Ok(Bytes::from_static(b"data: [DONE]\n\n")), (ctx, run, seen, Phase2::End))),
            Phase2::End => None,
        }
    })
}

/// `stream: false`: the whole response once the generation ends.
pub(crate) async fn whole(ctx: Context, mut run: Running) -> Result<Response, ApiError> {
    let mut seen = Seen::new();
    let mut tokens: Vec<TokenEvent> = vec![];
    let done = loop {
        match run.rx.recv().await {
            None => {
                run.finished = true;
                ctx.metrics.finished("error", None, &[]);
                return Err(ApiError::internal("the engine's stream ended early"));
            }
            Some(EngineEvent::Token(t)) => {
                seen.token(&t, &run, &ctx.metrics);
                tokens.push(t);
            }
            Some(EngineEvent::Diagnostic(d)) => seen.diagnostics.push(d),
            Some(EngineEvent::Done(d)) => {
                seen.done(&mut run, &ctx.metrics, &d);
                break d;
            }
            Some(EngineEvent::Error(e)) => {
                run.finished = true;
                ctx.metrics.finished("error", None, &[]);
                return Err(ApiError::internal(e.message));
            }
            Some(_) => {}
        }
    };
    let reason = finish_reason(done.finish_reason);
    let object = match ctx.endpoint {
        Endpoint::Chat => {
            let shown = |t: &&TokenEvent| !ctx.separate_reasoning || !is_tag(t);
            let logprobs = if ctx.logprobs {
                let content: Vec<Value> = tokens.iter().filter(shown).map(chat_logprob).collect();
                json!({"content": content})
            } else {
                Value::Null
            };
            let (content, reasoning) = if ctx.separate_reasoning {
                (done.answer.clone(), (!done.thinking.is_empty()).then(|| done.thinking.clone()))
            } else {
                (tokens.iter().map(|t| t.text.as_str()).collect::<String>(), None)
            };
            json!({
                "id": ctx.id, "object": "chat.completion", "created": ctx.created, "model": ctx.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content, "reasoning_content": reasoning},
                             "logprobs": logprobs, "finish_reason": reason}],
                "usage": usage(&done),
                "deltascope": extension(&done, &seen.diagnostics, &run),
            })
        }
        Endpoint::Completion => {
            let text: String = tokens.iter().map(|t| t.text.as_str()).collect();
            let logprobs =
                if ctx.logprobs { completion_logprobs(&tokens.iter().collect::<Vec<_>>()) } else { Value::Null };
            json!({
                "id": ctx.id, "object": "text_completion", "created": ctx.created, "model": ctx.model,
                "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": reason}],
                "usage": usage(&done),
                "deltascope": extension(&done, &seen.diagnostics, &run),
            })
        }
    };
    Ok(([(header::CONTENT_TYPE, "application/json")], object.to_string()).into_response())
}
