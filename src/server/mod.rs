//! `deltascope serve`: an OpenAI-compatible server on a backend (the in-process engine), shaped
//! like SGLang / vLLM with `--reasoning-parser qwen3`: `delta.reasoning_content` for thinking,
//! `delta.content` for the answer, one frame per token, usage with reasoning tokens, and a
//! `deltascope` extension object (diagnostics, MTP per position, forced tokens, timing) that
//! standard clients ignore. It imports only `backend`.
//!
//! One engine, many clients: requests queue FIFO in front of it (a fair mutex: one sequence at
//! a time, no batching), bounded by `--max-queue` (full: 503 with `Retry-After`). A client that
//! disconnects, queued or generating, drops its request's future, which cancels its
//! generation (the engine stops within one token) and frees its place.

#![forbid(unsafe_code)]

pub mod error;
pub mod metrics;
pub mod request;
mod respond;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tokio::sync::{Mutex, OwnedMutexGuard, OwnedSemaphorePermit, Semaphore, mpsc};

use crate::backend::{Backend, BackendError, ChatRequest, Prompt};
use deltascope_protocol::{EngineEvent, ErrorKind, GenerationParams, MtpMode, StepControl, Thinking};
use error::ApiError;
use metrics::Metrics;
use request::Parsed;

/// How the server listens and what it accepts.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub addr: SocketAddr,
    /// With a key, every route but `/health` needs `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
    /// Requests that may wait for the engine besides the one generating.
    pub max_queue: usize,
    /// Request bodies over this many bytes get 413.
    pub body_limit: usize,
    /// A request body that does not arrive within this long is refused (408).
    pub body_timeout: Duration,
    /// A connection whose request head does not arrive within this long is closed: a slow or
    /// idle client (kept alive between requests) cannot hold a connection forever.
    pub header_timeout: Duration,
    /// MTP speculative decoding for every request (`--mtp`; off by default).
    pub mtp: MtpMode,
}

impl ServeConfig {
    pub fn new(addr: SocketAddr) -> Self {
        ServeConfig {
            addr,
            api_key: None,
            max_queue: 64,
            body_limit: 4 << 20,
            body_timeout: Duration::from_secs(30),
            header_timeout: Duration::from_secs(30),
            mtp: MtpMode::Off,
        }
    }
}

pub struct AppState {
    backend: Arc<dyn Backend>,
    cfg: ServeConfig,
    /// The model's name in `/v1/models` and every response.
    model: String,
    context: usize,
    /// Places: the one generating + `max_queue` waiting.
    admission: Arc<Semaphore>,
    /// The engine's turn: tokio's mutex is fair, so waiters are served in arrival order.
    engine: Arc<Mutex<()>>,
    metrics: Arc<Metrics>,
    started: u64,
    next_id: std::sync::atomic::AtomicU64,
}

pub type Shared = Arc<AppState>;

impl AppState {
    pub fn new(backend: Arc<dyn Backend>, cfg: ServeConfig) -> Shared {
        let info = backend.info();
        let metrics = Metrics::new();
        if let Some(w) = info.weights_bytes {
            metrics.weights_bytes.set(w as i64);
        }
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Arc::new(AppState {
            model: info.name.clone(),
            context: info.context.unwrap_or(32_768),
            admission: Arc::new(Semaphore::new(cfg.max_queue + 1)),
            engine: Arc::new(Mutex::new(())),
            metrics: Arc::new(metrics),
            backend,
            cfg,
            started,
            next_id: 0.into(),
        })
    }
}

/// The routes, with the key check and the OpenAI-shaped 404 (tests serve this on a free port).
pub fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/apply-template", post(apply_template))
        .route("/metrics", get(metrics_text))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn_with_state(state.clone(), declared_length))
        .route("/health", get(|| async { "ok" }))
        .with_state(state)
}

/// Binds and serves until Ctrl+C, then lets the requests in flight finish (at most
/// [`DRAIN`]).
///
/// Its own accept loop rather than `axum::serve`, which sets hyper no timer: this one closes
/// connections whose request head is slow to come or that sit idle (`header_timeout`), and
/// an accept error (out of file descriptors) is logged and retried, not the end of the server.
pub async fn serve(backend: Arc<dyn Backend>, cfg: ServeConfig, ready: impl FnOnce(SocketAddr)) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let listener = tokio::net::TcpListener::bind(cfg.addr).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::AddrInUse => {
                ": something else listens there (choose another --port, or --port 0 for a free one)"
            }
            std::io::ErrorKind::AddrNotAvailable => ": no network interface here has that address (--host)",
            std::io::ErrorKind::PermissionDenied => ": ports below 1024 need privileges (choose --port 1024 or above)",
            _ => "",
        };
        std::io::Error::new(e.kind(), format!("cannot listen on {}: {e}{hint}", cfg.addr))
    })?;
    let local = listener.local_addr()?;
    ready(local);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new()).header_read_timeout(cfg.header_timeout);
    let app = router(AppState::new(backend, cfg));
    let graceful = GracefulShutdown::new();
    let mut stop = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((io, _peer)) => {
                    // One SSE frame per token: without TCP_NODELAY, Nagle's algorithm holds
                    // each small write until the client acknowledges the last one, and the
                    // client sees tokens arrive in bursts (16 frames in 0.2 ms) — speeds from
                    // arrival times 100× the engine's.
                    if let Err(e) = io.set_nodelay(true) {
                        tracing::debug!("TCP_NODELAY: {e}");
                    }
                    let conn = http.serve_connection(TokioIo::new(io), TowerToHyperService::new(app.clone()));
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!("connection ended: {e}");
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!("accepting a connection: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = &mut stop => break,
        }
    }
    drop(listener);
    if tokio::time::timeout(DRAIN, graceful.shutdown()).await.is_err() {
        tracing::warn!("requests still running after {DRAIN:?}: stopping anyway");
    }
    Ok(())
}

/// How long a stopping server waits for the requests in flight.
pub const DRAIN: Duration = Duration::from_secs(10);

/// A body declared (`Content-Length`) over `--body-limit` is refused before a byte of it is
/// read: the client learns at once, instead of after sending it all or waiting out the body
/// timeout.
async fn declared_length(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared.filter(|&n| n > s.cfg.body_limit as u64) {
        let mut e = ApiError::too_large(s.cfg.body_limit);
        e.message = format!("{} (Content-Length says {n})", e.message);
        return e.into_response();
    }
    next.run(req).await
}

/// The token of an `Authorization: Bearer …` header; the scheme's name is case-insensitive
/// (RFC 9110 §11.1: `bearer`, `BEARER` are the same).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Compares in time independent of where the two differ, so response times do not reveal how
/// much of a guessed key was right.
fn same_key(given: &str, key: &str) -> bool {
    given.len() == key.len() && given.bytes().zip(key.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

async fn auth(State(s): State<Shared>, req: Request, next: Next) -> Response {
    if let Some(key) = &s.cfg.api_key {
        let given = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        match given.and_then(bearer) {
            Some(k) if same_key(k, key) => {}
            Some(_) => return ApiError::unauthorized("the API key is not the server's (--api-key)").into_response(),
            None => {
                return ApiError::unauthorized("this server needs an API key: send Authorization: Bearer KEY")
                    .into_response();
            }
        }
    }
    next.run(req).await
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!("no route {} {}", req.method(), req.uri().path()), "not_found")
}

async fn models(State(s): State<Shared>) -> Response {
    // `deltascope`: what a deltascope client reads to know this server (the sampling defaults
    // of the model's generation_config.json, which requests without those fields get).
    let info = s.backend.info();
    // llama.cpp's `meta` fields (what a client compares models by), and deltascope's own.
    let id = &info.identity;
    let meta = json!({"n_vocab": id.vocab_size, "n_embd": id.hidden_size, "n_layer": id.layers,
                      "n_params": id.params, "n_params_mtp": id.params_with_mtp, "fingerprint": id.fingerprint,
                      // A GGUF's file, as llama.cpp describes it (`size`, `ftype`), and the values
                      // of all its tensors (llama.cpp's `n_params`; ours counts the model's).
                      "size": id.file_bytes, "ftype": id.file_type, "n_params_file": id.file_values});
    let body = json!({"object": "list", "data": [{
        "id": s.model, "object": "model", "created": s.started, "owned_by": "deltascope", "max_model_len": s.context,
        "meta": meta,
        "deltascope": {"version": env!("CARGO_PKG_VERSION"), "sampling_defaults": info.defaults,
                       "mtp": s.cfg.mtp.is_on(), "has_mtp_head": info.has_mtp},
    }]});
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

async fn metrics_text(State(s): State<Shared>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], s.metrics.encode()).into_response()
}

/// The body, within the size limit and the time limit.
async fn read_body(s: &AppState, body: Body) -> Result<Bytes, ApiError> {
    match tokio::time::timeout(s.cfg.body_timeout, axum::body::to_bytes(body, s.cfg.body_limit)).await {
        Err(_) => Err(ApiError { status: 408, ..ApiError::bad(None, "the request body did not arrive in time") }),
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            // The only error a complete body read gives besides the limit is a broken connection.
            let text = format!("{e}");
            if text.contains("length limit")
                || std::error::Error::source(&e).is_some_and(|s| s.to_string().contains("length limit"))
            {
                Err(ApiError::too_large(s.cfg.body_limit))
            } else {
                Err(ApiError::bad(None, format!("cannot read the body: {text}")))
            }
        }
    }
}

fn backend_error(e: BackendError) -> ApiError {
    match e.kind {
        ErrorKind::InvalidRequest => ApiError::bad(None, e.message),
        ErrorKind::ContextOverflow => ApiError::bad(Some("max_tokens"), e.message).code("context_length_exceeded"),
        ErrorKind::Cancelled => ApiError { status: 499, ..ApiError::bad(None, e.message) },
        ErrorKind::Unavailable => ApiError { status: 503, ..ApiError::internal(e.message) },
        ErrorKind::Internal => ApiError::internal(e.message),
    }
}

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completion,
}

/// `POST /tokenize`, as llama-server answers it (`{"tokens": [ids]}`): the model's tokens of a
/// text, special tokens parsed. `deltascope verify` checks a prompt with it and
/// `/apply-template`; client-side budgets continue from such ids.
async fn tokenize(State(s): State<Shared>, body: Body) -> Result<Response, ApiError> {
    let text = request::tokenize(&request::object(&read_body(&s, body).await?)?)?;
    let req = ChatRequest { prompt: Prompt::Text(text), params: Default::default() };
    let ids = match s.backend.prompt_tokens(&req).map_err(backend_error)? {
        Some(t) => t.ids,
        None => vec![],
    };
    Ok(([(header::CONTENT_TYPE, "application/json")], json!({"tokens": ids}).to_string()).into_response())
}

/// `POST /apply-template`, as llama-server answers it (`{"prompt": text}`): the chat rendered
/// by the model's template with the generation prompt.
async fn apply_template(State(s): State<Shared>, body: Body) -> Result<Response, ApiError> {
    let (messages, thinking) = request::template(&request::object(&read_body(&s, body).await?)?)?;
    let params =
        GenerationParams { thinking: if thinking { Thinking::Unlimited } else { Thinking::Off }, ..Default::default() };
    let rendered =
        s.backend.prompt_tokens(&ChatRequest { prompt: Prompt::Chat(messages), params }).map_err(backend_error)?;
    let text = rendered.and_then(|t| t.text).unwrap_or_default();
    Ok(([(header::CONTENT_TYPE, "application/json")], json!({"prompt": text}).to_string()).into_response())
}

async fn chat_completions(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    handle(s, headers, body, Endpoint::Chat).await.unwrap_or_else(IntoResponse::into_response)
}

async fn completions(State(s): State<Shared>, headers: HeaderMap, body: Body) -> Response {
    handle(s, headers, body, Endpoint::Completion).await.unwrap_or_else(IntoResponse::into_response)
}

/// A request holding the engine: cancels its generation when dropped before the end (the
/// client went away), and gives back its place and the engine's turn.
pub(crate) struct Running {
    control: Arc<StepControl>,
    pub rx: mpsc::UnboundedReceiver<EngineEvent>,
    metrics: Arc<Metrics>,
    pub finished: bool,
    pub arrived: Instant,
    pub started: Instant,
    _turn: OwnedMutexGuard<()>,
    _place: OwnedSemaphorePermit,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.finished {
            self.control.cancel();
            self.metrics.finished("abort", None, &[]);
        }
        self.metrics.running.dec();
    }
}

/// Counts a request as waiting while it is, and as left when its client goes away before
/// the engine's turn comes (dropped without `admitted`).
struct Waiting {
    metrics: Arc<Metrics>,
    admitted: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.metrics.waiting.dec();
        if !self.admitted {
            self.metrics.left_queue.inc();
        }
    }
}

async fn handle(s: Shared, _headers: HeaderMap, body: Body, endpoint: Endpoint) -> Result<Response, ApiError> {
    let arrived = Instant::now();
    let bytes = read_body(&s, body).await?;
    let obj = request::object(&bytes)?;
    let mut parsed: Parsed = match endpoint {
        Endpoint::Chat => request::chat(&obj, s.context, &s.backend.info().defaults)?,
        Endpoint::Completion => request::completion(&obj, s.context, &s.backend.info().defaults)?,
    };
    if let Some(m) = &parsed.model
        && m != &s.model
    {
        return Err(ApiError::not_found(
            format!("model {m:?} is not served here: this server has {:?}", s.model),
            "model_not_found",
        )
        .param("model"));
    }
    // The prompt's length, to fit max_tokens to the context.
    let dry = s.backend.dry_run(&parsed.req).map_err(backend_error)?;
    let prompt_len = dry.ids.as_ref().map_or(0, Vec::len);
    if prompt_len >= s.context {
        return Err(ApiError::bad(
            Some("messages"),
            format!("the prompt is {prompt_len} tokens: the context holds {}", s.context),
        )
        .code("context_length_exceeded"));
    }
    if !parsed.max_tokens_given {
        parsed.req.params.max_tokens = s.context - prompt_len;
    } else if prompt_len + parsed.req.params.max_tokens > s.context {
        return Err(ApiError::bad(
            Some("max_tokens"),
            format!(
                "prompt {prompt_len} + max_tokens {} tokens is over the context of {}",
                parsed.req.params.max_tokens, s.context
            ),
        )
        .code("context_length_exceeded"));
    }
    parsed.req.params.mtp = s.cfg.mtp;
    if let Err(p) = parsed.req.params.check() {
        let field = p.field.trim_start_matches("sampling.").to_string();
        return Err(ApiError::bad(Some(&field), p.to_string()));
    }
    if let Some(vocab) = s.backend.info().vocab_size
        && let Some((i, id)) =
            parsed.req.params.stop_token_ids.iter().enumerate().find(|(_, id)| **id as usize >= vocab)
    {
        let path = format!("stop_token_ids[{i}]");
        return Err(ApiError::bad(
            Some(&path),
            format!("{path} is {id}: out of the vocabulary (the model has {vocab} ids, 0–{})", vocab - 1),
        ));
    }
    if let Prompt::Ids(ids) = &parsed.req.prompt
        && ids.is_empty()
    {
        return Err(ApiError::bad(Some("prompt"), "prompt is empty"));
    }

    // A place in the queue, or 503.
    let place = s.admission.clone().try_acquire_owned().map_err(|_| {
        s.metrics.rejected.inc();
        ApiError::busy(s.cfg.max_queue)
    })?;
    s.metrics.waiting.inc();
    let mut waiting = Waiting { metrics: s.metrics.clone(), admitted: false };
    let turn = s.engine.clone().lock_owned().await;
    waiting.admitted = true;
    drop(waiting);
    s.metrics.running.inc();
    let control = Arc::new(StepControl::default());
    let (tx, rx) = mpsc::unbounded_channel();
    let mut run = Running {
        control: control.clone(),
        rx,
        metrics: s.metrics.clone(),
        finished: false,
        arrived,
        started: Instant::now(),
        _turn: turn,
        _place: place,
    };
    let generation = match s.backend.start_with(parsed.req.clone(), control) {
        Ok(g) => g,
        Err(e) => {
            run.finished = true;
            return Err(backend_error(e));
        }
    };
    s.metrics.prompt_tokens.inc_by(prompt_len as u64);
    // The engine's events (a std channel) into this task; the thread ends with the stream or
    // when the request is gone.
    std::thread::spawn(move || {
        for e in generation.events().iter() {
            if tx.send(e).is_err() {
                break;
            }
        }
    });
    let id = s.next_id.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ctx = respond::Context {
        id: format!("{}-{id}", if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" }),
        model: s.model.clone(),
        created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        endpoint,
        logprobs: parsed.logprobs,
        include_usage: parsed.include_usage,
        separate_reasoning: parsed.separate_reasoning,
        metrics: s.metrics.clone(),
    };
    if parsed.stream {
        let body = Body::from_stream(respond::stream(ctx, run));
        Ok((StatusCode::OK, [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body)
            .into_response())
    } else {
        respond::whole(ctx, run).await
    }
}
