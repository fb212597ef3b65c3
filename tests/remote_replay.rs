//! `deltascope run --server URL --json` against replayed servers: SGLang 0.5.23 and vLLM 0.32.0
//! (reconstructed wire bytes, `tests/fixtures/wire/{sglang,vllm}`), a plain OpenAI-compatible
//! server, and misbehaving servers (refused connections, TLS on a plain port, 4xx/5xx, cut,
//! malformed, oversized and silent streams, HTML instead of JSON, a server that ignores
//! `stream`), plus cancelling a stream with SIGINT.
//!
//! Everything runs on 127.0.0.1 against `tests/common/replay.rs`; every client run is bounded by
//! [`RUN_LIMIT`] (a hang fails the test, and the child is killed).

#[path = "common/replay.rs"]
mod replay;

use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use replay::{After, Recorded, ReplayServer, Reply, Route, wire};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_deltascope");
const PROMPT: &str = "Is 91 prime?";
/// The thinking and the answer every "Is 91 prime?" fixture streams (tests/fixtures/wire/README.md).
const THINKING: &str = "Check divisors up to the square root of 91.\n91 ÷ 2 = 45 r 1\n91 ÷ 3 = 30 r 1\n91 ÷ 5 = 18 r 1\n91 ÷ 7 = 13 r 0\n7 divides 91.\n";
const ANSWER: &str = "No, 91 = 7 × 13, so 91 is not prime.";
/// The longest any client run may take; past it the child is killed and the test fails.
const RUN_LIMIT: Duration = Duration::from_secs(15);
/// A generic server's `/v1/models` (two models, so "served models" lists are checkable).
const GENERIC_MODELS: &str = r#"{"object":"list","data":[{"id":"demo","object":"model","owned_by":"someone"},{"id":"demo-2","object":"model","owned_by":"someone"}]}"#;

// ---------------------------------------------------------------------------------------------
// Running the client.

/// A client process whose stdout lines arrive on a channel.
struct Running {
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr: Option<JoinHandle<String>>,
    started: Instant,
}

/// A finished client run.
struct Out {
    code: Option<i32>,
    /// Every stdout line, parsed as JSON (`--json`).
    events: Vec<Value>,
    stderr: String,
    /// From spawn to exit.
    elapsed: Duration,
}

fn command(url: &str, extra: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["run", "--server", url, "--prompt", PROMPT, "--json"]).args(extra);
    // Keys only where a test sets them; no proxy between us and 127.0.0.1; default logging.
    for var in [
        "DELTASCOPE_API_KEY",
        "OPENAI_API_KEY",
        "RUST_LOG",
        "http_proxy",
        "HTTP_PROXY",
        "https_proxy",
        "HTTPS_PROXY",
        "all_proxy",
        "ALL_PROXY",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    cmd
}

fn spawn(url: &str, extra: &[&str], env: &[(&str, &str)]) -> Running {
    let started = Instant::now();
    let mut child = command(url, extra, env).spawn().expect("spawn deltascope");
    let stdout = child.stdout.take().expect("stdout");
    let mut stderr = child.stderr.take().expect("stderr");
    let (tx, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    Running { child, lines, seen: Vec::new(), stderr: Some(stderr), started }
}

impl Running {
    /// The next stdout line as JSON, waiting at most `within`.
    fn next_event(&mut self, within: Duration) -> Option<Value> {
        match self.lines.recv_timeout(within) {
            Ok(line) => {
                let v = parse_line(&line);
                self.seen.push(line);
                Some(v)
            }
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Waits for the exit (at most [`RUN_LIMIT`] from the spawn) and collects the output.
    fn finish(mut self) -> Out {
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if self.started.elapsed() > RUN_LIMIT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let stderr = self.stderr.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default();
                let seen: Vec<String> = self.seen.iter().cloned().chain(self.lines.try_iter()).collect();
                panic!(
                    "the client ran past {RUN_LIMIT:?} and was killed\nstdout:\n{}\nstderr:\n{stderr}",
                    seen.join("\n")
                );
            }
            thread::sleep(Duration::from_millis(5));
        };
        let elapsed = self.started.elapsed();
        // The pipe closes with the process: the reader thread ends and the channel drains.
        let mut lines = std::mem::take(&mut self.seen);
        lines.extend(self.lines.iter());
        let stderr = self.stderr.take().map(|h| h.join().unwrap_or_default()).unwrap_or_default();
        Out { code: status.code(), events: lines.iter().map(|l| parse_line(l)).collect(), stderr, elapsed }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Only when a test failed half-way: never leave a client behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn parse_line(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("stdout line is not JSON ({e}): {line:?}"))
}

/// `deltascope run --server URL --prompt "Is 91 prime?" --json EXTRA…`, to the end.
fn client(url: &str, extra: &[&str]) -> Out {
    spawn(url, extra, &[]).finish()
}

fn client_env(url: &str, extra: &[&str], env: &[(&str, &str)]) -> Out {
    spawn(url, extra, env).finish()
}

impl Out {
    fn context(&self) -> String {
        // Long lines (a 64 KiB token) are cut so that a failure stays readable.
        let events: Vec<String> = self
            .events
            .iter()
            .map(|e| {
                let line = e.to_string();
                if line.chars().count() > 600 {
                    format!("{}…", line.chars().take(600).collect::<String>())
                } else {
                    line
                }
            })
            .collect();
        format!(
            "exit {:?} after {:?}\nstdout:\n{}\nstderr:\n{}",
            self.code,
            self.elapsed,
            events.join("\n"),
            self.stderr
        )
    }

    fn first(&self) -> &Value {
        self.events.first().unwrap_or_else(|| panic!("no events\n{}", self.context()))
    }

    fn last(&self) -> &Value {
        self.events.last().unwrap_or_else(|| panic!("no events\n{}", self.context()))
    }

    fn of(&self, event: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["event"] == event).collect()
    }

    fn tokens(&self) -> Vec<&Value> {
        self.of("token")
    }

    /// The texts of the token events in `phase`, joined.
    fn text(&self, phase: &str) -> String {
        self.tokens().iter().filter(|t| t["phase"] == phase).filter_map(|t| t["text"].as_str()).collect()
    }

    fn no_panic(&self) {
        assert!(!self.stderr.contains("panicked"), "panic text on stderr\n{}", self.context());
    }

    /// A successful run: exit 0, `start` first, `done` last (returned), indices 0, 1, 2, …
    fn done(&self) -> &Value {
        self.no_panic();
        assert_eq!(self.code, Some(0), "{}", self.context());
        assert_eq!(self.first()["event"], "start", "{}", self.context());
        let done = self.last();
        assert_eq!(done["event"], "done", "{}", self.context());
        for (i, t) in self.tokens().iter().enumerate() {
            assert_eq!(t["index"], i, "token indices run 0, 1, 2, …\n{}", self.context());
        }
        done
    }

    /// The one `error: …` line on stderr (without the prefix); nothing else on stderr.
    fn error_line(&self) -> String {
        self.no_panic();
        assert!(self.code.is_some_and(|c| c != 0), "a failed run exits non-zero\n{}", self.context());
        let lines: Vec<&str> = self.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "exactly one line on stderr\n{}", self.context());
        let message = lines[0]
            .strip_prefix("error: ")
            .unwrap_or_else(|| panic!("stderr starts with `error: `\n{}", self.context()));
        assert!(!message.trim().is_empty(), "{}", self.context());
        message.to_string()
    }

    /// An error before anything streamed: nothing on stdout, one `error:` line; its message.
    fn startup_error(&self) -> String {
        let message = self.error_line();
        assert!(self.events.is_empty(), "nothing on stdout for an error before streaming\n{}", self.context());
        eprintln!("startup error: {message}");
        message
    }

    /// An error once streaming began: `start` first, an `error` event of `kind` last, whose
    /// message is also the one `error:` line on stderr; its message.
    fn stream_error(&self, kind: &str) -> String {
        let line = self.error_line();
        assert_eq!(self.first()["event"], "start", "{}", self.context());
        let last = self.last();
        assert_eq!(last["event"], "error", "the last event is the error\n{}", self.context());
        assert_eq!(last["kind"], kind, "{}", self.context());
        let message = last["message"].as_str().unwrap_or_default().to_string();
        assert_eq!(line, message, "stderr repeats the error event's message\n{}", self.context());
        assert!(self.of("done").is_empty(), "no done after an error\n{}", self.context());
        eprintln!("stream error: {message}");
        for (i, t) in self.tokens().iter().enumerate() {
            assert_eq!(t["index"], i, "{}", self.context());
        }
        message
    }
}

fn assert_contains(haystack: &str, needle: &str, context: &str) {
    assert!(haystack.contains(needle), "expected {needle:?} in {haystack:?}\n{context}");
}

fn approx(v: &Value, want: f64, context: &str) {
    let got = v.as_f64().unwrap_or_else(|| panic!("expected a number near {want}, got {v}\n{context}"));
    assert!((got - want).abs() < 1e-6, "expected {want}, got {got}\n{context}");
}

// ---------------------------------------------------------------------------------------------
// Servers.

fn sglang(chat: Reply) -> ReplayServer {
    ReplayServer::start(vec![
        Route::get("/v1/models", Reply::json_file(200, wire("sglang/models.json"))),
        Route::get("/server_info", Reply::json_file(200, wire("sglang/server_info.json"))),
        Route::get(
            "/metrics",
            Reply::Sequence(vec![
                Reply::text_file(200, wire("sglang/metrics-before.txt")),
                Reply::text_file(200, wire("sglang/metrics-before.txt")),
                Reply::text_file(200, wire("sglang/metrics-after.txt")),
            ]),
        ),
        Route::post("/v1/chat/completions", chat),
    ])
}

fn vllm(chat: Reply) -> ReplayServer {
    ReplayServer::start(vec![
        Route::get("/v1/models", Reply::json_file(200, wire("vllm/models.json"))),
        Route::get("/version", Reply::json_file(200, wire("vllm/version.json"))),
        Route::get(
            "/metrics",
            Reply::Sequence(vec![
                Reply::text_file(200, wire("vllm/metrics-before.txt")),
                Reply::text_file(200, wire("vllm/metrics-before.txt")),
                Reply::text_file(200, wire("vllm/metrics-after.txt")),
            ]),
        ),
        Route::post("/v1/chat/completions", chat),
    ])
}

/// Only `/v1/models` and the chat route: every probe gets the replay server's 404.
fn generic(chat: Reply) -> ReplayServer {
    ReplayServer::start(vec![
        Route::get("/v1/models", Reply::json(200, GENERIC_MODELS)),
        Route::post("/v1/chat/completions", chat),
    ])
}

/// The one POST to the chat route, and its body as JSON.
fn chat_request(server: &ReplayServer) -> (Recorded, Value) {
    let mut posts: Vec<Recorded> =
        server.requests().into_iter().filter(|r| r.method == "POST" && r.path == "/v1/chat/completions").collect();
    assert_eq!(posts.len(), 1, "one chat request: {posts:?}");
    let post = posts.remove(0);
    let body = serde_json::from_slice(&post.body).unwrap_or_else(|e| panic!("request body is not JSON ({e})"));
    (post, body)
}

fn no_chat_request(server: &ReplayServer) {
    let posts: Vec<String> = server.requests().into_iter().filter(|r| r.method == "POST").map(|r| r.path).collect();
    assert!(posts.is_empty(), "nothing may be POSTed: {posts:?}");
}

/// An SSE body from `data:` payloads.
fn sse(payloads: &[String], separator: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    for p in payloads {
        bytes.extend_from_slice(b"data: ");
        bytes.extend_from_slice(p.as_bytes());
        bytes.extend_from_slice(separator.as_bytes());
    }
    bytes
}

fn content_frame(text: &str) -> String {
    serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "demo",
        "choices": [{"index": 0, "delta": {"content": text}, "logprobs": null, "finish_reason": null}],
    })
    .to_string()
}

const ROLE_FRAME: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"demo","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#;
const STOP_FRAME: &str = r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"demo","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}"#;

// ---------------------------------------------------------------------------------------------
// A. SGLang 0.5.23

#[test]
fn sglang_reasoning_stream_with_spec_details_and_kv_usage() {
    let server = sglang(Reply::sse_file(wire("sglang/chat-stream-reasoning.sse")));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let done = out.done();

    let start = out.first();
    assert_eq!(start["server"]["kind"], "SGLang", "{ctx}");
    assert_eq!(start["server"]["version"], "0.5.23", "{ctx}");
    assert_eq!(start["server"]["url"], server.url(), "{ctx}");

    assert!(
        done["thinking"].as_str().unwrap_or_default().starts_with("Check divisors up to the square root of 91."),
        "{ctx}"
    );
    assert_eq!(done["thinking"], THINKING, "{ctx}");
    assert_eq!(done["answer"], ANSWER, "{ctx}");
    assert_eq!(out.text("thinking"), THINKING, "{ctx}");
    assert_eq!(out.text("answer"), ANSWER, "{ctx}");
    assert_eq!(done["finish_reason"], "stop", "{ctx}");

    // The server's usage frame: reasoning_tokens 71 of 94.
    let usage = &done["usage"];
    assert_eq!(usage["counted"], "server_usage", "{ctx}");
    assert_eq!(usage["prompt_tokens"], 16, "{ctx}");
    assert_eq!(usage["completion_tokens"], 94, "{ctx}");
    assert_eq!(usage["thinking_tokens"], 71, "{ctx}");
    assert_eq!(usage["answer_tokens"], 94 - 71, "{ctx}");

    // sglext.spec_tokens_details: 34 verify steps, 102 drafted, 59 accepted, histogram [5,8,12,9].
    let mtp = &done["mtp"];
    assert_eq!(mtp["depth"], 3, "{ctx}");
    assert_eq!(mtp["steps"], 34, "{ctx}");
    assert_eq!(mtp["drafted"], 102, "{ctx}");
    assert_eq!(mtp["accepted"], 59, "{ctx}");
    let per_position = mtp["per_position"].as_array().unwrap_or_else(|| panic!("per_position\n{ctx}"));
    assert_eq!(per_position.len(), 3, "{ctx}");
    for (got, accepted) in per_position.iter().zip([29.0, 21.0, 9.0]) {
        approx(got, accepted / 34.0, &ctx);
    }
    approx(&mtp["mean_accepted_length"], 94.0 / 34.0, &ctx);
    assert!(mtp["source"].as_str().unwrap_or_default().starts_with("SGLang"), "{ctx}");

    // sglang:token_usage after the request.
    assert_eq!(done["server_memory"]["metric"], "sglang:token_usage", "{ctx}");
    approx(&done["server_memory"]["kv_used_fraction"], 0.02, &ctx);

    // What was sent.
    let requests = server.requests();
    assert_eq!(requests[0].method, "GET", "{requests:?}");
    assert_eq!(requests[0].path, "/v1/models", "{requests:?}");
    assert!(requests.iter().all(|r| r.header("authorization").is_none()), "no key, no Authorization header");
    let (post, body) = chat_request(&server);
    assert!(post.header("content-type").is_some_and(|c| c.starts_with("application/json")), "{post:?}");
    assert_eq!(body["model"], "demo", "{body}");
    let messages = body["messages"].as_array().unwrap_or_else(|| panic!("messages: {body}"));
    assert_eq!(messages.last().map(|m| &m["role"]), Some(&Value::from("user")), "{body}");
    assert_eq!(messages.last().map(|m| &m["content"]), Some(&Value::from(PROMPT)), "{body}");
    assert_eq!(body["stream"], true, "{body}");
    assert_eq!(body["stream_options"]["include_usage"], true, "{body}");
    assert_eq!(body["chat_template_kwargs"]["enable_thinking"], true, "{body}");
    assert_eq!(body["return_spec_tokens_details"], true, "server_info says EAGLE: {body}");
    assert!(body.get("custom_params").is_none(), "no budget, no custom_params: {body}");
    // A server that reports no defaults gets the model card's thinking preset, every value explicit.
    approx(&body["temperature"], 1.0, &body.to_string());
    approx(&body["top_p"], 0.95, &body.to_string());
    assert_eq!(body["top_k"], 20, "{body}");
    approx(&body["min_p"], 0.0, &body.to_string());
    approx(&body["presence_penalty"], 1.5, &body.to_string());
    approx(&body["frequency_penalty"], 0.0, &body.to_string());
    approx(&body["repetition_penalty"], 1.0, &body.to_string());
    assert!(body["max_tokens"].as_u64().is_some_and(|m| m > 0), "{body}");
    // /metrics: the probe at startup, then once before and once after the request.
    assert_eq!(requests.iter().filter(|r| r.path == "/metrics").count(), 3, "{requests:?}");
}

#[test]
fn sglang_older_get_server_info_is_detected_too() {
    let server = ReplayServer::start(vec![
        Route::get("/v1/models", Reply::json_file(200, wire("sglang/models.json"))),
        Route::get("/get_server_info", Reply::json_file(200, wire("sglang/server_info.json"))),
        Route::post("/v1/chat/completions", Reply::sse_file(wire("sglang/chat-stream-reasoning.sse"))),
    ]);
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let done = out.done();
    assert_eq!(out.first()["server"]["kind"], "SGLang", "{ctx}");
    assert_eq!(out.first()["server"]["version"], "0.5.23", "{ctx}");
    assert_eq!(done["answer"], ANSWER, "{ctx}");
    // No /metrics here: no KV gauge, and the spec figures still come from sglext.
    assert!(done["server_memory"].is_null(), "{ctx}");
    assert_eq!(done["mtp"]["accepted"], 59, "{ctx}");
}

#[test]
fn sglang_thinking_budget_goes_in_custom_params() {
    let server = sglang(Reply::sse_file(wire("sglang/chat-stream-reasoning.sse")));
    let out = client(&server.url(), &["--thinking-budget", "8"]);
    out.done();
    let (_, body) = chat_request(&server);
    assert_eq!(body["custom_params"]["thinking_budget"], 8, "{body}");
    assert!(body.get("thinking_token_budget").is_none(), "{body}");
    assert!(body.get("reasoning_budget_tokens").is_none(), "{body}");
}

#[test]
fn sglang_pydantic_null_style_parses_the_same() {
    let server = sglang(Reply::sse_file(wire("sglang/chat-stream-reasoning-pydantic.sse")));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let done = out.done();
    assert_eq!(done["finish_reason"], "stop", "{ctx}");
    assert_eq!(done["thinking"], THINKING, "{ctx}");
    assert_eq!(done["answer"], ANSWER, "{ctx}");
    assert_eq!(out.text("thinking"), THINKING, "{ctx}");
    assert_eq!(out.text("answer"), ANSWER, "{ctx}");
    assert_eq!(done["usage"]["counted"], "server_usage", "{ctx}");
    assert_eq!(done["usage"]["completion_tokens"], 94, "{ctx}");
    assert_eq!(done["usage"]["thinking_tokens"], 71, "{ctx}");
    // No "null" text anywhere: null deltas are not text.
    assert!(out.tokens().iter().all(|t| t["text"].is_string() && t["text"] != "null"), "{ctx}");
}

#[test]
fn sglang_error_frame_ends_in_an_error_that_keeps_the_tokens() {
    let server = sglang(Reply::sse_file(wire("sglang/chat-stream-error.sse")));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.stream_error("unavailable");
    assert_contains(&message, "The request was aborted: the KV cache pool ran out of memory.", &ctx);
    assert_contains(&message, "kept", &ctx);
    assert_eq!(out.tokens().len(), 4, "{ctx}");
    assert_eq!(out.text("thinking"), "Check divisors up to the square root of", "{ctx}");
    assert_eq!(out.text("answer"), "", "{ctx}");
}

#[test]
fn sglang_length_stops_inside_thinking_with_a_diagnostic() {
    let server = sglang(Reply::sse_file(wire("sglang/chat-stream-length.sse")));
    let out = client(&server.url(), &["--max-tokens", "12"]);
    let ctx = out.context();
    let done = out.done();
    assert_eq!(done["finish_reason"], "length", "{ctx}");
    assert_eq!(done["answer"], "", "{ctx}");
    assert!(THINKING.starts_with(done["thinking"].as_str().unwrap_or("?")), "{ctx}");
    assert_eq!(done["usage"]["completion_tokens"], 12, "{ctx}");
    assert_eq!(done["usage"]["thinking_tokens"], 12, "{ctx}");
    let diagnostics = out.of("diagnostic");
    assert!(diagnostics.iter().any(|d| d["kind"] == "thinking_exhausted_max_tokens"), "{ctx}");
    let (_, body) = chat_request(&server);
    assert_eq!(body["max_tokens"], 12, "{body}");
}

/// Issue 35, item 8: a server that stops for `length` before `max_tokens` (its context ran
/// out: the same 12 tokens, asked for 100) is said to have hit the context, not max_tokens,
/// and no "raise max_tokens" fix is offered.
#[test]
fn a_server_that_stops_at_its_context_says_so() {
    let server = sglang(Reply::sse_file(wire("sglang/chat-stream-length.sse")));
    let out = client(&server.url(), &["--max-tokens", "100"]);
    let ctx = out.context();
    assert_eq!(out.done()["finish_reason"], "length", "{ctx}");
    let diagnostics = out.of("diagnostic");
    let d = diagnostics.iter().find(|d| d["kind"] == "thinking_exhausted_max_tokens").expect("a length diagnostic");
    let message = d["message"].as_str().unwrap();
    assert_contains(message, "the context was the limit, not max_tokens", &ctx);
    assert_contains(message, "16 prompt + 12 generated tokens, 88 short of max_tokens (100)", &ctx);
    assert!(d["fix"].is_null(), "raising max_tokens would not help: {ctx}");
}

// ---------------------------------------------------------------------------------------------
// B. vLLM 0.32.0

#[test]
fn vllm_reasoning_stream_with_spec_summary_and_kv_usage() {
    let server = vllm(Reply::sse_file(wire("vllm/chat-stream-reasoning.sse")));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let done = out.done();

    assert_eq!(out.first()["server"]["kind"], "vLLM", "{ctx}");
    assert_eq!(out.first()["server"]["version"], "0.32.0", "{ctx}");
    assert_eq!(done["finish_reason"], "stop", "{ctx}");
    assert_eq!(done["thinking"], THINKING, "{ctx}");
    // The finishing frame carries the final "." together with finish_reason.
    assert_eq!(done["answer"], ANSWER, "{ctx}");
    assert_eq!(out.text("thinking"), THINKING, "{ctx}");
    assert_eq!(out.text("answer"), ANSWER, "{ctx}");

    let usage = &done["usage"];
    assert_eq!(usage["counted"], "server_usage", "{ctx}");
    assert_eq!(usage["completion_tokens"], 94, "{ctx}");
    assert_eq!(usage["thinking_tokens"], 70, "completion_tokens_details.reasoning_tokens\n{ctx}");
    assert_eq!(usage["answer_tokens"], 24, "{ctx}");

    let mtp = &done["mtp"];
    assert_eq!(mtp["depth"], 3, "{ctx}");
    assert_eq!(mtp["steps"], 34, "{ctx}");
    assert_eq!(mtp["drafted"], 102, "{ctx}");
    assert_eq!(mtp["accepted"], 59, "{ctx}");
    let per_position = mtp["per_position"].as_array().unwrap_or_else(|| panic!("per_position\n{ctx}"));
    assert_eq!(per_position.len(), 3, "{ctx}");
    // Histogram [4,11,9,10]: the /metrics per-position deltas +30 / +19 / +10.
    for (got, accepted) in per_position.iter().zip([30.0, 19.0, 10.0]) {
        approx(got, accepted / 34.0, &ctx);
    }
    approx(&mtp["mean_accepted_length"], 1.0 + 59.0 / 34.0, &ctx);
    assert!(mtp["source"].as_str().unwrap_or_default().starts_with("vLLM"), "{ctx}");

    assert_eq!(done["server_memory"]["metric"], "vllm:kv_cache_usage_perc", "{ctx}");
    approx(&done["server_memory"]["kv_used_fraction"], 0.0172, &ctx);

    let (_, body) = chat_request(&server);
    assert_eq!(body["model"], "demo", "{body}");
    assert_eq!(body["stream"], true, "{body}");
    assert_eq!(body["stream_options"]["include_usage"], true, "{body}");
    assert_eq!(body["chat_template_kwargs"]["enable_thinking"], true, "{body}");
    assert!(body.get("thinking_token_budget").is_none(), "{body}");
    assert!(body.get("return_spec_tokens_details").is_none(), "SGLang's field, not vLLM's: {body}");
    assert!(body.get("custom_params").is_none(), "{body}");
}

#[test]
fn vllm_thinking_budget_is_thinking_token_budget() {
    let server = vllm(Reply::sse_file(wire("vllm/chat-stream-reasoning.sse")));
    let out = client(&server.url(), &["--thinking-budget", "8"]);
    out.done();
    let (_, body) = chat_request(&server);
    assert_eq!(body["thinking_token_budget"], 8, "{body}");
    assert!(body.get("custom_params").is_none(), "{body}");
    assert!(body.get("reasoning_budget_tokens").is_none(), "{body}");
}

#[test]
fn vllm_older_reasoning_content_field() {
    let server = ReplayServer::start(vec![
        Route::get("/v1/models", Reply::json_file(200, wire("vllm/models.json"))),
        Route::get("/version", Reply::json_file(200, wire("vllm/version.json"))),
        Route::post("/v1/chat/completions", Reply::sse_file(wire("vllm/chat-stream-reasoning-content.sse"))),
    ]);
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let done = out.done();
    assert_eq!(out.first()["server"]["kind"], "vLLM", "{ctx}");
    assert_eq!(done["finish_reason"], "stop", "{ctx}");
    assert_eq!(done["thinking"], THINKING, "{ctx}");
    assert_eq!(done["answer"], ANSWER, "{ctx}");
    assert_eq!(out.text("thinking"), THINKING, "{ctx}");
    assert_eq!(out.text("answer"), ANSWER, "{ctx}");
    // No reasoning count and no logprobs: counted per frame, an estimate.
    assert_eq!(done["usage"]["counted"], "frames", "{ctx}");
    assert_eq!(done["usage"]["completion_tokens"], 94, "{ctx}");
    assert!(done["mtp"].is_null(), "no speculation reported\n{ctx}");
}

#[test]
fn vllm_length_stops_inside_thinking_with_a_diagnostic() {
    let server = vllm(Reply::sse_file(wire("vllm/chat-stream-length.sse")));
    let out = client(&server.url(), &["--max-tokens", "12"]);
    let ctx = out.context();
    let done = out.done();
    assert_eq!(done["finish_reason"], "length", "{ctx}");
    assert_eq!(done["answer"], "", "{ctx}");
    let thinking = done["thinking"].as_str().unwrap_or("?");
    assert!(THINKING.starts_with(thinking) && thinking.ends_with("1.\n"), "the last step's text is kept\n{ctx}");
    assert_eq!(done["usage"]["thinking_tokens"], 12, "{ctx}");
    assert_eq!(done["usage"]["completion_tokens"], 12, "{ctx}");
    assert!(out.of("diagnostic").iter().any(|d| d["kind"] == "thinking_exhausted_max_tokens"), "{ctx}");
    assert_eq!(done["mtp"]["steps"], 5, "{ctx}");
}

// ---------------------------------------------------------------------------------------------
// C. A plain OpenAI-compatible server

#[test]
fn generic_server_streams_and_is_named_openai_compatible() {
    let server = generic(Reply::sse_file(wire("vllm/chat-stream-reasoning.sse")));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let done = out.done();
    assert_eq!(out.first()["server"]["kind"], "OpenAI-compatible", "{ctx}");
    assert!(out.first()["server"]["version"].is_null(), "{ctx}");
    assert_eq!(done["thinking"], THINKING, "{ctx}");
    assert_eq!(done["answer"], ANSWER, "{ctx}");
    let (_, body) = chat_request(&server);
    assert_eq!(body["model"], "demo", "the first served model: {body}");
    for field in ["thinking_token_budget", "custom_params", "reasoning_budget_tokens", "return_spec_tokens_details"] {
        assert!(body.get(field).is_none(), "{field} is a known server's field: {body}");
    }
}

#[test]
fn generic_server_refuses_a_server_side_thinking_budget_before_streaming() {
    let server = generic(Reply::sse_file(wire("vllm/chat-stream-reasoning.sse")));
    let out = client(&server.url(), &["--thinking-budget", "8"]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "--thinking-budget", &ctx);
    assert_contains(&message, "--budget-mode client", &ctx);
    no_chat_request(&server);
}

fn simple_answer() -> Reply {
    let payloads =
        [ROLE_FRAME.to_string(), content_frame("Hi"), content_frame("."), STOP_FRAME.to_string(), "[DONE]".into()];
    Reply::sse_bytes(&sse(&payloads, "\n\n"))
}

const SAMPLING_FLAGS: [&str; 12] = [
    "--temperature",
    "0.7",
    "--top-p",
    "0.8",
    "--min-p",
    "0.05",
    "--presence-penalty",
    "0.3",
    "--top-k",
    "40",
    "--seed",
    "7",
];

#[test]
fn flags_reach_the_request_body() {
    let server = vllm(simple_answer());
    let mut args = SAMPLING_FLAGS.to_vec();
    args.extend([
        "--no-think",
        "--top-logprobs",
        "3",
        "--max-tokens",
        "64",
        "--stop",
        "END",
        "--stop-token-id",
        "482",
        "--thinking-budget",
        "8",
    ]);
    let out = client(&server.url(), &args);
    let ctx = out.context();
    let done = out.done();
    assert_eq!(done["answer"], "Hi.", "{ctx}");
    let (_, body) = chat_request(&server);
    let b = body.to_string();
    assert_eq!(body["chat_template_kwargs"]["enable_thinking"], false, "{b}");
    assert!(body.get("thinking_token_budget").is_none(), "no budget with thinking off: {b}");
    assert_eq!(body["logprobs"], true, "{b}");
    assert_eq!(body["top_logprobs"], 3, "{b}");
    assert_eq!(body["max_tokens"], 64, "{b}");
    assert_eq!(body["stop"], serde_json::json!(["END"]), "{b}");
    assert_eq!(body["stop_token_ids"], serde_json::json!([482]), "{b}");
    assert_eq!(body["seed"], 7, "{b}");
    assert_eq!(body["top_k"], 40, "{b}");
    approx(&body["temperature"], 0.7, &b);
    approx(&body["top_p"], 0.8, &b);
    approx(&body["min_p"], 0.05, &b);
    approx(&body["presence_penalty"], 0.3, &b);
}

#[test]
fn the_request_sends_the_sampling_values_the_start_event_shows() {
    // "What the workbench shows is what the server gets" (request.rs): `--top-p 0.8` is shown as
    // 0.8 and must go out as 0.8, not as the f32 widened to 0.800000011920929.
    let server = vllm(simple_answer());
    let out = client(&server.url(), &SAMPLING_FLAGS);
    let ctx = out.context();
    out.done();
    let shown = &out.first()["params"]["sampling"];
    let (_, body) = chat_request(&server);
    for key in [
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "seed",
    ] {
        assert_eq!(body[key], shown[key], "{key}: sent {} but shown {}\nbody: {body}\n{ctx}", body[key], shown[key]);
    }
    assert_eq!(body["top_p"].to_string(), "0.8", "{body}");
}

#[test]
fn server_model_picks_the_model_named() {
    let server = generic(Reply::sse_file(wire("vllm/chat-stream-reasoning.sse")));
    let out = client(&server.url(), &["--server-model", "demo-2"]);
    out.done();
    let (_, body) = chat_request(&server);
    assert_eq!(body["model"], "demo-2", "{body}");
}

#[test]
fn api_key_from_the_environment_goes_with_every_request() {
    let server = generic(Reply::sse_file(wire("vllm/chat-stream-reasoning.sse")));
    let out = client_env(&server.url(), &[], &[("DELTASCOPE_API_KEY", "sk-env-1"), ("OPENAI_API_KEY", "sk-other")]);
    out.done();
    let requests = server.requests();
    assert!(requests.len() >= 2, "{requests:?}");
    for r in &requests {
        assert_eq!(r.header("authorization"), Some("Bearer sk-env-1"), "$DELTASCOPE_API_KEY wins: {r:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// D. Faults

#[test]
fn connection_refused_is_one_line() {
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    }; // released: nothing listens there now
    let out = client(&format!("http://127.0.0.1:{port}"), &[]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "connection refused", &ctx);
    assert_contains(&message, &format!("127.0.0.1:{port}"), &ctx);
    assert!(out.elapsed < Duration::from_secs(5), "{ctx}");
}

#[test]
fn https_to_a_plain_http_server_names_tls_and_http() {
    let server = generic(Reply::sse_file(wire("vllm/chat-stream-reasoning.sse")));
    let url = format!("https://{}", server.addr);
    let out = client(&url, &[]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "TLS", &ctx);
    assert_contains(&message, "http://", &ctx);
    assert!(out.elapsed < Duration::from_secs(8), "{ctx}");
    no_chat_request(&server);
}

fn models_refused(status: u16) -> ReplayServer {
    let body = match status {
        401 => std::fs::read_to_string(wire("faults/401.json")).expect("401.json"),
        _ => r#"{"error":{"code":403,"message":"Forbidden: this key may not list models","type":"permission_error"}}"#
            .to_string(),
    };
    ReplayServer::start(vec![
        Route::get("/v1/models", Reply::json(status, &body)),
        Route::post("/v1/chat/completions", Reply::sse_file(wire("vllm/chat-stream-reasoning.sse"))),
    ])
}

#[test]
fn unauthorized_names_where_the_key_came_from() {
    // --api-key
    let server = models_refused(401);
    let out = client(&server.url(), &["--api-key", "sk-flag-123"]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "401", &ctx);
    assert_contains(&message, "Invalid API Key", &ctx);
    assert_contains(&message, "--api-key", &ctx);
    assert!(!message.contains("sk-flag-123"), "the key itself is never printed\n{ctx}");
    assert_eq!(server.requests()[0].header("authorization"), Some("Bearer sk-flag-123"));
    no_chat_request(&server);

    // $DELTASCOPE_API_KEY
    let server = models_refused(401);
    let out = client_env(&server.url(), &[], &[("DELTASCOPE_API_KEY", "sk-env-456")]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "$DELTASCOPE_API_KEY", &ctx);
    assert!(!message.contains("sk-env-456"), "{ctx}");
    assert_eq!(server.requests()[0].header("authorization"), Some("Bearer sk-env-456"));

    // No key at all: say so, and how to pass one.
    let server = models_refused(401);
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "no API key was sent", &ctx);
    assert_contains(&message, "--api-key", &ctx);
    assert_contains(&message, "DELTASCOPE_API_KEY", &ctx);
    assert_eq!(server.requests()[0].header("authorization"), None);
}

#[test]
fn forbidden_names_where_the_key_came_from() {
    let server = models_refused(403);
    let out = client(&server.url(), &["--api-key", "sk-flag-123"]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "403", &ctx);
    assert_contains(&message, "Forbidden: this key may not list models", &ctx);
    assert_contains(&message, "--api-key", &ctx);

    let server = models_refused(403);
    let out = client_env(&server.url(), &[], &[("OPENAI_API_KEY", "sk-openai-789")]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "$OPENAI_API_KEY", &ctx);
    assert!(!message.contains("sk-openai-789"), "{ctx}");

    let server = models_refused(403);
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "no API key was sent", &ctx);
    assert_contains(&message, "--api-key", &ctx);
}

#[test]
fn unknown_server_model_lists_the_served_models() {
    let server = generic(Reply::sse_file(wire("vllm/chat-stream-reasoning.sse")));
    let out = client(&server.url(), &["--server-model", "missing"]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "missing", &ctx);
    assert_contains(&message, "demo", &ctx);
    assert_contains(&message, "demo-2", &ctx);
    no_chat_request(&server);
}

#[test]
fn model_not_found_on_the_chat_route_lists_the_served_models() {
    let server = generic(Reply::json_file(404, wire("faults/404-model.json")));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.stream_error("invalid_request");
    assert_contains(&message, "404", &ctx);
    assert_contains(&message, "The model `qwen3.5-27b` does not exist.", &ctx);
    let served =
        message.find("serves").map(|at| &message[at..]).unwrap_or_else(|| panic!("names the served models\n{ctx}"));
    assert_contains(served, "demo", &ctx);
    assert_contains(served, "demo-2", &ctx);
    assert!(out.tokens().is_empty(), "{ctx}");
}

#[test]
fn bad_request_carries_the_servers_message_and_spots_context_overflow() {
    // llama.cpp: exceed_context_size_error.
    let server = generic(Reply::json_file(400, wire("faults/400.json")));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.stream_error("context_overflow");
    assert_contains(&message, "400", &ctx);
    assert_contains(&message, "request (5210 tokens) exceeds the available context size (4096 tokens)", &ctx);

    // Any other 400: invalid_request, with the server's message.
    let server = generic(Reply::json(
        400,
        r#"{"error":{"message":"temperature must be non-negative, got -1","type":"BadRequestError","param":"temperature","code":400}}"#,
    ));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.stream_error("invalid_request");
    assert_contains(&message, "temperature must be non-negative, got -1", &ctx);
}

#[test]
fn sglang_bad_request_for_a_long_prompt_is_a_context_overflow() {
    // SGLang's ErrorResponse is not wrapped in "error", and says "longer than the model's
    // context length": a context overflow all the same.
    let server = sglang(Reply::json_file(400, wire("faults/400-sglang.json")));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.stream_error("context_overflow");
    assert_contains(&message, "400", &ctx);
    assert_contains(&message, "The input (5210 tokens) is longer than the model's context length (4096 tokens).", &ctx);
}

#[test]
fn server_errors_are_unavailable_with_the_servers_message() {
    // 500 on the chat route: after `start`, so an error event.
    let server = generic(Reply::json(
        500,
        r#"{"error":{"message":"CUDA error: an illegal memory access was encountered","type":"InternalServerError","code":500}}"#,
    ));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.stream_error("unavailable");
    assert_contains(&message, "500", &ctx);
    assert_contains(&message, "CUDA error: an illegal memory access was encountered", &ctx);

    // 503 on the chat route (llama.cpp while loading).
    let server = generic(Reply::json_file(503, wire("faults/503.json")));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.stream_error("unavailable");
    assert_contains(&message, "503", &ctx);
    assert_contains(&message, "Loading model", &ctx);

    // 503 on /v1/models: a one-line error at startup.
    let server = ReplayServer::start(vec![Route::get("/v1/models", Reply::json_file(503, wire("faults/503.json")))]);
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "503", &ctx);
    assert_contains(&message, "Loading model", &ctx);

    // A 502 from a proxy, plain text: the text, on one line.
    let server = generic(Reply::fixed(502, "text/plain", "upstream connect error\nor disconnect/reset before headers"));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.stream_error("unavailable");
    assert_contains(&message, "502", &ctx);
    assert_contains(&message, "upstream connect error", &ctx);
}

#[test]
fn stream_cut_mid_token_keeps_what_arrived() {
    let server = generic(Reply::sse_file(wire("faults/cut-mid-token.sse")).then(After::Cut));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.stream_error("unavailable");
    assert_contains(&message, "kept the 14 tokens", &ctx);
    assert_eq!(out.tokens().len(), 14, "{ctx}");
    assert_eq!(out.text("thinking"), "Check divisors up to the square root of 91.\n91", "{ctx}");
    // Nothing of the cut frame (a lone 0xC3 byte) became text.
    assert!(out.tokens().iter().all(|t| !t["text"].as_str().unwrap_or_default().contains('\u{FFFD}')), "{ctx}");
}

#[test]
fn a_cut_stream_says_the_connection_closed_mid_stream() {
    // "error decoding response body" names no cause: the server closed the connection before
    // the stream ended (no terminating chunk, no [DONE]).
    let server = generic(Reply::sse_file(wire("faults/cut-mid-token.sse")).then(After::Cut));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.stream_error("unavailable").to_lowercase();
    assert!(
        ["closed", "eof", "ended", "incomplete", "cut off"].iter().any(|w| message.contains(w)),
        "the message says the connection closed mid-stream\n{ctx}"
    );
}

#[test]
fn malformed_json_in_a_frame_stops_the_stream_and_keeps_earlier_tokens() {
    let server = generic(Reply::sse_file(wire("faults/malformed.sse")));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.stream_error("internal");
    assert_contains(&message, "malformed JSON", &ctx);
    assert_contains(&message, "kept the 4 tokens", &ctx);
    // The frames after the bad one are not read: a client that skipped it would show " square".
    assert_eq!(out.text("thinking"), "Check divisors up to", "{ctx}");
    assert_eq!(out.tokens().len(), 4, "{ctx}");
}

#[test]
fn a_frame_over_one_mib_is_refused() {
    let huge = "x".repeat(2 << 20);
    let payloads = [
        ROLE_FRAME.to_string(),
        content_frame("Hello"),
        content_frame(" world"),
        content_frame(&huge),
        "[DONE]".into(),
    ];
    let server = generic(Reply::sse_bytes(&sse(&payloads, "\n\n")));
    let out = client(&server.url(), &["--no-think"]);
    let ctx = out.context();
    let message = out.stream_error("unavailable");
    assert_contains(&message, "1 MiB", &ctx);
    assert_contains(&message, "kept the 2 tokens", &ctx);
    assert_eq!(out.text("answer"), "Hello world", "{ctx}");
    assert!(message.len() < 1000, "the message does not quote the frame\n{ctx}");
    assert!(out.elapsed < Duration::from_secs(5), "{ctx}");
}

#[test]
fn frames_under_the_limit_pass_with_crlf_separators_too() {
    // 24 frames of 64 KiB each, 1.5 MiB in all, framed with CRLF CRLF (the SSE spec allows it;
    // sse-starlette writes it): no frame is over 1 MiB, so nothing is refused.
    let pieces: Vec<String> = (0..24).map(|i| format!("{i:02}{}", "y".repeat(64 << 10))).collect();
    let mut payloads = vec![ROLE_FRAME.to_string()];
    payloads.extend(pieces.iter().map(|p| content_frame(p)));
    payloads.push(STOP_FRAME.to_string());
    payloads.push("[DONE]".into());
    let server = generic(Reply::sse_bytes(&sse(&payloads, "\r\n\r\n")).paced(Duration::ZERO));
    let out = client(&server.url(), &["--no-think"]);
    let ctx = out.context();
    out.no_panic();
    assert_eq!(out.last()["event"], "done", "{ctx}");
    assert_eq!(out.code, Some(0), "{ctx}");
    assert_eq!(out.last()["finish_reason"], "stop", "{ctx}");
    assert_eq!(out.last()["answer"].as_str().map(str::len), Some(pieces.iter().map(String::len).sum()), "{ctx}");
}

#[test]
fn frames_whose_blank_line_arrives_in_a_separate_chunk_pass() {
    // Each frame written as two chunks, `data: {…}\n` and then the blank line's `\n`, as a
    // server that writes line by line does: 1.5 MiB in all, no frame over 1 MiB.
    let pieces: Vec<String> = (0..24).map(|i| format!("{i:02}{}", "z".repeat(64 << 10))).collect();
    let mut payloads = vec![ROLE_FRAME.to_string()];
    payloads.extend(pieces.iter().map(|p| content_frame(p)));
    payloads.push(STOP_FRAME.to_string());
    payloads.push("[DONE]".into());
    let mut chunks = Vec::new();
    for p in &payloads {
        chunks.push((Duration::from_millis(1), format!("data: {p}\n").into_bytes()));
        chunks.push((Duration::from_millis(1), b"\n".to_vec()));
    }
    let server = generic(Reply::Chunks {
        status: 200,
        headers: vec![("Content-Type".into(), "text/event-stream".into())],
        pieces: chunks,
        then: After::Close,
    });
    let out = client(&server.url(), &["--no-think"]);
    let ctx = out.context();
    out.no_panic();
    assert_eq!(out.last()["event"], "done", "{ctx}");
    assert_eq!(out.code, Some(0), "{ctx}");
    assert_eq!(out.last()["answer"].as_str().map(str::len), Some(pieces.iter().map(String::len).sum()), "{ctx}");
}

#[test]
fn a_silent_server_hits_the_idle_timeout_and_keeps_the_tokens() {
    let server = generic(Reply::sse_file(wire("sglang/chat-stream-reasoning.sse")).truncated(5).then(After::Hang));
    let out = client(&server.url(), &["--idle-timeout", "1"]);
    let ctx = out.context();
    let message = out.stream_error("unavailable");
    assert_contains(&message, "--idle-timeout", &ctx);
    assert_contains(&message, "kept the 4 tokens", &ctx);
    assert_eq!(out.text("thinking"), "Check divisors up to the square", "{ctx}");
    assert!(out.elapsed >= Duration::from_secs(1), "{ctx}");
    assert!(out.elapsed < Duration::from_secs(3), "{ctx}");
    // The client hung up on the silent stream.
    assert!(server.wait_client_closes(1, Duration::from_secs(1)), "{ctx}");
}

/// A server that accepts the request and never sends its headers (issue 35, item 5): cut after
/// `--first-byte-timeout`, naming that timeout; and one that sends headers and then no frame
/// at all: the same timeout, naming the first frame. `--idle-timeout` alone does not wait on it.
#[test]
fn a_server_that_never_answers_hits_the_first_byte_timeout() {
    let server = generic(Reply::Silent);
    let out = client(&server.url(), &["--idle-timeout", "5", "--first-byte-timeout", "1"]);
    let ctx = out.context();
    let message = out.stream_error("unavailable");
    assert_contains(&message, "no response headers after 1 s (--first-byte-timeout", &ctx);
    assert!(out.elapsed >= Duration::from_secs(1) && out.elapsed < Duration::from_secs(4), "{ctx}");
    let headers_only =
        generic(Reply::sse_file(wire("sglang/chat-stream-reasoning.sse")).truncated(0).then(After::Hang));
    let out = client(&headers_only.url(), &["--idle-timeout", "30", "--first-byte-timeout", "1"]);
    let ctx = out.context();
    assert_contains(&out.stream_error("unavailable"), "no first stream frame after 1 s (--first-byte-timeout", &ctx);
    assert!(out.elapsed < Duration::from_secs(4), "{ctx}");
    // The flag is checked like --idle-timeout.
    let bad = client(&server.url(), &["--first-byte-timeout", "0"]);
    assert_eq!(bad.code, Some(1), "{}", bad.context());
}

#[test]
fn an_html_page_is_not_an_openai_api() {
    // A router's login page answering 200.
    let server =
        ReplayServer::start(vec![Route::get("/v1/models", Reply::html_file(200, wire("faults/html-page.html")))]);
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "does not look like an OpenAI-compatible API", &ctx);

    // A web server's 404 page.
    let server = ReplayServer::start(vec![Route::get(
        "/v1/models",
        Reply::html(
            404,
            "<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n<body>nginx</body></html>\n",
        ),
    )]);
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "404", &ctx);
    assert_contains(&message, "OpenAI-compatible", &ctx);

    // JSON, but not a model list.
    let server = ReplayServer::start(vec![Route::get("/v1/models", Reply::json(200, r#"{"status":"ok"}"#))]);
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let message = out.startup_error();
    assert_contains(&message, "OpenAI-compatible", &ctx);
}

#[test]
fn a_server_that_ignores_stream_keeps_the_answer_and_says_so() {
    let server = generic(Reply::json_file(200, wire("faults/nonstream.json")));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    out.error_line();
    let last = out.last();
    assert_eq!(last["event"], "error", "{ctx}");
    let message = last["message"].as_str().unwrap_or_default();
    assert_contains(message, "ignored", &ctx);
    assert_contains(message, "stream", &ctx);
    assert_eq!(out.text("answer"), ANSWER, "{ctx}");
    assert_eq!(out.text("thinking"), THINKING, "{ctx}");
}

#[test]
fn sigint_closes_the_stream_at_once_and_keeps_the_tokens() {
    let server = generic(Reply::sse_file(wire("sglang/chat-stream-reasoning.sse")).truncated(5).then(After::Hang));
    // --idle-timeout bounds the run even if the signal were lost.
    let mut running = spawn(&server.url(), &["--idle-timeout", "10"], &[]);
    let mut tokens = 0;
    while tokens < 2 {
        let event = running
            .next_event(Duration::from_secs(10))
            .unwrap_or_else(|| panic!("no token events: {:?}", running.seen));
        if event["event"] == "token" {
            tokens += 1;
        }
    }
    // The two tokens may be the first frames of a hanging stream: the rest of the five frames
    // arrive within milliseconds, so let them, then cancel while the stream hangs.
    thread::sleep(Duration::from_millis(100));
    assert_eq!(server.client_closes(), 0);
    let status = Command::new("kill").args(["-INT", &running.child.id().to_string()]).status().expect("kill");
    let signalled = Instant::now();
    assert!(status.success());
    let closed = server.wait_client_closes(1, Duration::from_millis(100));
    let close_at = server.client_close_times().first().copied();
    let out = running.finish();
    let ctx = out.context();
    assert!(closed, "the connection was not closed within 100 ms of the signal (closes: {close_at:?})\n{ctx}");
    if let Some(at) = close_at {
        assert!(at.saturating_duration_since(signalled) <= Duration::from_millis(100), "{ctx}");
    }
    out.no_panic();
    assert_eq!(out.code, Some(130), "{ctx}");
    let done = out.last();
    assert_eq!(done["event"], "done", "{ctx}");
    assert_eq!(done["finish_reason"], "cancelled", "{ctx}");
    assert_eq!(out.tokens().len(), 4, "{ctx}");
    assert_eq!(done["thinking"], "Check divisors up to the square", "{ctx}");
    assert_eq!(done["usage"]["completion_tokens"], 4, "{ctx}");
}

// ---------------------------------------------------------------------------------------------
// E. --dry-run

#[test]
fn dry_run_prints_the_request_body_and_sends_nothing() {
    let server = sglang(Reply::sse_file(wire("sglang/chat-stream-reasoning.sse")));
    let out = client(&server.url(), &["--dry-run", "--thinking-budget", "8"]);
    let ctx = out.context();
    out.no_panic();
    assert_eq!(out.code, Some(0), "{ctx}");
    assert_eq!(out.events.len(), 1, "{ctx}");
    let dry = &out.events[0];
    assert_contains(dry["template"].as_str().unwrap_or_default(), "/v1/chat/completions", &ctx);
    let body: Value = serde_json::from_str(dry["prompt"].as_str().unwrap_or_else(|| panic!("prompt\n{ctx}")))
        .unwrap_or_else(|e| panic!("the printed body is JSON ({e})\n{ctx}"));
    assert_eq!(body["model"], "demo", "{ctx}");
    let messages = body["messages"].as_array().unwrap_or_else(|| panic!("messages\n{ctx}"));
    assert_eq!(messages.last().map(|m| &m["content"]), Some(&Value::from(PROMPT)), "{ctx}");
    assert_eq!(body["stream"], true, "{ctx}");
    assert_eq!(body["custom_params"]["thinking_budget"], 8, "{ctx}");
    no_chat_request(&server);
}

/// The decode speed is measured from the arrivals: 40 frames 10 ms apart cannot be decoded
/// faster than 39 tokens in 390 ms, whatever the usage or the request's timing say.
#[test]
fn the_decode_speed_is_what_the_arrivals_allow() {
    let mut payloads = vec![ROLE_FRAME.to_string()];
    payloads.extend((0..40).map(|i| content_frame(&format!("w{i} "))));
    payloads.push(STOP_FRAME.to_string());
    let server = generic(Reply::sse_bytes(&sse(&payloads, "\n\n")).paced(Duration::from_millis(10)));
    let out = client(&server.url(), &[]);
    let ctx = out.context();
    let done = out.done();
    let rate = done["timing"]["decode_tok_s"].as_f64().unwrap_or(f64::NAN);
    // 39 gaps of at least 10 ms between the first token's frame and the last.
    assert!(rate > 0.0 && rate <= 39.0 / 0.390 + 1e-9, "decode {rate} tok/s: {ctx}");
    let total = done["timing"]["total_ms"].as_f64().unwrap_or(0.0);
    assert!(total >= 390.0, "{total} ms: {ctx}");
}
