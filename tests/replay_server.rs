//! The replay server (`tests/common/replay.rs`) and the wire fixtures it serves
//! (`tests/fixtures/wire/`), checked on their own so client tests can rely on both.
//! std + serde_json only; nothing here uses the library crate.

#[path = "common/replay.rs"]
mod replay;

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use replay::{After, NO_ROUTE_BODY, ReplayServer, Reply, Route, wire};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// A raw HTTP/1.1 client, just enough to look at the bytes the server writes.

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    stream
}

fn send(addr: SocketAddr, method: &str, target: &str, extra_headers: &str, body: &[u8]) -> TcpStream {
    let mut stream = connect(addr);
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: replay-test\r\n{extra_headers}Content-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    stream
}

struct Response {
    status: u16,
    /// Lowercased names.
    headers: Vec<(String, String)>,
    /// The body bytes as they came over the wire (still chunk-framed when chunked).
    raw_body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// Reads until the server closes.
fn read_response(mut stream: TcpStream) -> Response {
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).expect("read to EOF");
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").expect("end of head") + 4;
    let head = String::from_utf8(bytes[..end].to_vec()).unwrap();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    assert!(status_line.starts_with("HTTP/1.1 "), "{status_line}");
    let status = status_line[9..12].parse().unwrap();
    let headers = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    Response { status, headers, raw_body: bytes[end..].to_vec() }
}

/// Splits a chunked body into its chunks; `true` when the terminating chunk was there.
fn dechunk(mut body: &[u8]) -> (Vec<Vec<u8>>, bool) {
    let mut chunks = Vec::new();
    loop {
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            return (chunks, false);
        };
        let size = usize::from_str_radix(std::str::from_utf8(&body[..eol]).unwrap(), 16).unwrap();
        body = &body[eol + 2..];
        if size == 0 {
            return (chunks, body == b"\r\n");
        }
        if body.len() < size + 2 {
            return (chunks, false);
        }
        chunks.push(body[..size].to_vec());
        assert_eq!(&body[size..size + 2], b"\r\n");
        body = &body[size + 2..];
    }
}

fn read_fixture(rel: &str) -> Vec<u8> {
    std::fs::read(wire(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The server.

#[test]
fn fixed_reply_has_content_length_and_closes() {
    let server = ReplayServer::start(vec![Route::get("/v1/models", Reply::json_file(200, wire("vllm/models.json")))]);
    assert!(server.url().starts_with("http://127.0.0.1:"));
    let response = read_response(send(server.addr, "GET", "/v1/models?x=1", "", b""));
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("application/json"));
    assert_eq!(response.header("connection"), Some("close"));
    assert_eq!(response.header("transfer-encoding"), None);
    let expected = read_fixture("vllm/models.json");
    assert_eq!(response.header("content-length"), Some(expected.len().to_string().as_str()));
    assert_eq!(response.raw_body, expected);
    assert_eq!(server.connections(), 1);
    assert_eq!(server.client_closes(), 0);
}

#[test]
fn sse_file_streams_chunked_one_frame_per_chunk() {
    let file = read_fixture("sglang/chat-stream-reasoning.sse");
    let server = ReplayServer::start(vec![Route::post(
        "/v1/chat/completions",
        Reply::sse_file(wire("sglang/chat-stream-reasoning.sse")),
    )]);
    let response = read_response(send(server.addr, "POST", "/v1/chat/completions", "", b"{}"));
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some("text/event-stream"));
    assert_eq!(response.header("transfer-encoding"), Some("chunked"));
    assert_eq!(response.header("content-length"), None);
    let (chunks, complete) = dechunk(&response.raw_body);
    assert!(complete, "terminating chunk missing");
    assert_eq!(chunks, replay::sse_frames(&file), "one chunk per SSE frame");
    assert_eq!(chunks.concat(), file);
    assert!(chunks.iter().any(|c| c.starts_with(b"event: sglext_ids\n")));
}

#[test]
fn paced_frames_arrive_separately() {
    let gap = Duration::from_millis(20);
    let reply = Reply::sse_file(wire("vllm/chat-stream-reasoning.sse")).truncated(4).paced(gap);
    let server = ReplayServer::start(vec![Route::post("/v1/chat/completions", reply)]);
    let sent = Instant::now();
    let stream = send(server.addr, "POST", "/v1/chat/completions", "", b"{}");
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
    }
    let mut arrivals = Vec::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        let size = usize::from_str_radix(line.trim_end(), 16).unwrap();
        if size == 0 {
            break;
        }
        let mut chunk = vec![0; size + 2];
        reader.read_exact(&mut chunk).unwrap();
        assert!(chunk.starts_with(b"data: {"));
        arrivals.push(Instant::now());
    }
    assert_eq!(arrivals.len(), 4);
    // The server waits `gap` before each frame after the first; a reader that is scheduled late
    // may find two frames waiting, so require only most of the gaps to be seen.
    assert!(arrivals[3] - sent >= gap * 3);
    let apart = arrivals.windows(2).filter(|p| p[1] - p[0] >= gap / 2).count();
    assert!(apart >= 2, "frames coalesced: {:?}", arrivals.windows(2).map(|p| p[1] - p[0]).collect::<Vec<_>>());
}

#[test]
fn records_requests_with_content_length_and_chunked_bodies() {
    let server = ReplayServer::start(vec![Route::post("/v1/chat/completions", Reply::json(200, "{}"))]);
    let body = br#"{"model":"demo","stream":true,"messages":[{"role":"user","content":"Is 91 prime?"}]}"#;
    let first = send(server.addr, "POST", "/v1/chat/completions", "Authorization: Bearer sk-test\r\n", body);
    assert_eq!(read_response(first).status, 200);

    let mut second = connect(server.addr);
    let head = "POST /v1/chat/completions?trace=1 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nX-Custom:  padded \r\n\r\n";
    second.write_all(head.as_bytes()).unwrap();
    second.write_all(b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n").unwrap();
    assert_eq!(read_response(second).status, 200);

    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].method, "POST");
    assert_eq!(requests[0].path, "/v1/chat/completions");
    assert_eq!(requests[0].header("authorization"), Some("Bearer sk-test"));
    assert_eq!(requests[0].header("Content-Length"), Some(body.len().to_string().as_str()));
    assert_eq!(requests[0].body, body);
    let sent: Value = serde_json::from_slice(&requests[0].body).unwrap();
    assert_eq!(sent["messages"][0]["content"], "Is 91 prime?");
    assert_eq!(requests[1].target, "/v1/chat/completions?trace=1");
    assert_eq!(requests[1].path, "/v1/chat/completions");
    assert_eq!(requests[1].header("x-custom"), Some("padded"));
    assert!(requests[1].headers.iter().all(|(n, _)| *n == n.to_ascii_lowercase()));
    assert_eq!(requests[1].body_str(), "hello, world");
}

#[test]
fn unknown_routes_get_a_json_404() {
    let server = ReplayServer::start(vec![Route::post("/v1/chat/completions", Reply::json(200, "{}"))]);
    for (method, target) in [("GET", "/nope"), ("GET", "/v1/chat/completions"), ("POST", "/v1/chat/completions/")] {
        let response = read_response(send(server.addr, method, target, "", b""));
        assert_eq!(response.status, 404, "{method} {target}");
        assert_eq!(response.header("content-type"), Some("application/json"));
        assert_eq!(response.raw_body, NO_ROUTE_BODY.as_bytes());
        let body: Value = serde_json::from_slice(&response.raw_body).unwrap();
        assert_eq!(body["error"]["type"], "not_found");
    }
    assert_eq!(server.requests().len(), 3, "unknown routes are recorded too");
}

#[test]
fn sequence_answers_the_nth_request_with_the_nth_reply() {
    let server = ReplayServer::start(vec![Route::get(
        "/metrics",
        Reply::Sequence(vec![
            Reply::text_file(200, wire("vllm/metrics-before.txt")),
            Reply::text_file(200, wire("vllm/metrics-after.txt")),
        ]),
    )]);
    let bodies: Vec<Vec<u8>> =
        (0..3).map(|_| read_response(send(server.addr, "GET", "/metrics", "", b"")).raw_body).collect();
    assert_eq!(bodies[0], read_fixture("vllm/metrics-before.txt"));
    assert_eq!(bodies[1], read_fixture("vllm/metrics-after.txt"));
    assert_eq!(bodies[2], bodies[1], "the last reply repeats");
}

#[test]
fn hang_keeps_the_socket_open_and_notices_the_client_closing() {
    let reply = Reply::sse_file(wire("sglang/chat-stream-reasoning.sse")).truncated(3).then(After::Hang);
    let server = ReplayServer::start(vec![Route::post("/v1/chat/completions", reply)]);
    let mut stream = send(server.addr, "POST", "/v1/chat/completions", "", b"{}");
    // Read the head and the three frames, then expect silence (not EOF).
    stream.set_read_timeout(Some(Duration::from_millis(150))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => panic!("server closed a hung stream"),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => panic!("{e}"),
        }
    }
    let text = String::from_utf8_lossy(&got);
    assert_eq!(text.matches("data: {").count(), 3, "{text}");
    assert!(!got.ends_with(b"0\r\n\r\n"));
    assert_eq!(server.client_closes(), 0);
    // The client cancels: the server sees it at once.
    let closed_at = Instant::now();
    stream.shutdown(Shutdown::Both).unwrap();
    drop(stream);
    // Seen at once (the server blocks in read, which returns on FIN); the bound here is loose
    // only so a loaded CI machine cannot make it flaky.
    assert!(server.wait_client_closes(1, Duration::from_millis(500)), "close not seen");
    let seen = server.client_close_times()[0];
    assert!(seen.duration_since(closed_at) < Duration::from_millis(500));
}

#[test]
fn client_closing_during_a_slow_stream_is_noticed() {
    let reply = Reply::sse_file(wire("vllm/chat-stream-reasoning.sse")).paced(Duration::from_millis(200));
    let server = ReplayServer::start(vec![Route::post("/v1/chat/completions", reply)]);
    let mut stream = send(server.addr, "POST", "/v1/chat/completions", "", b"{}");
    let mut buf = [0u8; 4096];
    let n = stream.read(&mut buf).unwrap();
    assert!(n > 0);
    drop(stream);
    assert!(server.wait_client_closes(1, Duration::from_secs(1)));
}

#[test]
fn cut_ends_without_the_terminating_chunk() {
    let reply = Reply::sse_file(wire("vllm/chat-stream-reasoning.sse")).truncated(5).then(After::Cut);
    let server = ReplayServer::start(vec![Route::post("/v1/chat/completions", reply)]);
    let response = read_response(send(server.addr, "POST", "/v1/chat/completions", "", b"{}"));
    assert_eq!(response.status, 200);
    let (chunks, complete) = dechunk(&response.raw_body);
    assert!(!complete);
    assert_eq!(chunks.len(), 5);
    assert!(!response.raw_body.ends_with(b"0\r\n\r\n"));
}

#[test]
fn delay_holds_back_the_first_byte() {
    let server = ReplayServer::start(vec![Route::get(
        "/health",
        Reply::json(200, r#"{"status":"ok"}"#).delayed(Duration::from_millis(60)),
    )]);
    let start = Instant::now();
    let response = read_response(send(server.addr, "GET", "/health", "", b""));
    assert!(start.elapsed() >= Duration::from_millis(50));
    assert_eq!(response.raw_body, br#"{"status":"ok"}"#);
}

#[test]
fn raw_replies_are_written_verbatim() {
    let bytes = b"HTTP/1.0 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: [DONE]\n\n".to_vec();
    let server = ReplayServer::start(vec![Route::post(
        "/v1/chat/completions",
        Reply::Raw { bytes: bytes.clone(), then: After::Close },
    )]);
    let mut stream = send(server.addr, "POST", "/v1/chat/completions", "", b"{}");
    let mut got = Vec::new();
    stream.read_to_end(&mut got).unwrap();
    assert_eq!(got, bytes);
}

#[test]
fn frames_over_one_mebibyte_pass_intact() {
    let big = format!(r#"data: {{"choices":[{{"index":0,"delta":{{"content":"{}"}}}}]}}"#, "x".repeat(3 << 19));
    let server = ReplayServer::start(vec![Route::post(
        "/v1/chat/completions",
        Reply::sse_events(&[big.as_str(), "data: [DONE]"]),
    )]);
    let response = read_response(send(server.addr, "POST", "/v1/chat/completions", "", b"{}"));
    let (chunks, complete) = dechunk(&response.raw_body);
    assert!(complete);
    assert_eq!(chunks.len(), 2);
    assert_eq!(chunks[0], format!("{big}\n\n").into_bytes());
}

#[test]
fn drop_does_not_hang_and_closes_hung_sockets() {
    let server = ReplayServer::start(vec![
        Route::post("/hang", Reply::sse_events(&["data: {}"]).then(After::Hang)),
        Route::post("/silent", Reply::Silent),
    ]);
    let mut clients = vec![
        send(server.addr, "POST", "/hang", "", b"{}"),
        send(server.addr, "POST", "/silent", "", b"{}"),
        connect(server.addr), // never sends a request
    ];
    thread::sleep(Duration::from_millis(50));
    let start = Instant::now();
    drop(server);
    assert!(start.elapsed() < Duration::from_secs(1), "drop took {:?}", start.elapsed());
    for client in &mut clients {
        client.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut rest = Vec::new();
        let _ = client.read_to_end(&mut rest); // EOF (or reset) once the server lets go
    }
    assert!(start.elapsed() < Duration::from_secs(2), "sockets held {:?}", start.elapsed());
}

// ---------------------------------------------------------------------------------------------
// The fixtures.

const SERVER_DIRS: [&str; 2] = ["sglang", "vllm"];

/// (event name, data payload) for each SSE event in a body.
fn sse_events(bytes: &[u8]) -> Vec<(Option<String>, String)> {
    let text = std::str::from_utf8(bytes).expect("UTF-8 SSE");
    let mut events = Vec::new();
    for block in text.split("\n\n").filter(|b| !b.is_empty()) {
        let (mut event, mut data) = (None, Vec::new());
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("event:") {
                event = Some(v.trim().to_string());
            } else if let Some(v) = line.strip_prefix("data:") {
                data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
            } else if !line.starts_with(':') {
                panic!("unexpected SSE line {line:?}");
            }
        }
        events.push((event, data.join("\n")));
    }
    events
}

/// The JSON payloads, with `[DONE]` checked to come last.
fn payloads(rel: &str) -> Vec<Value> {
    let events = sse_events(&read_fixture(rel));
    let (last, rest) = events.split_last().expect("empty fixture");
    assert_eq!(last.1, "[DONE]", "{rel}: must end with data: [DONE]");
    rest.iter()
        .map(|(_, data)| serde_json::from_str(data).unwrap_or_else(|e| panic!("{rel}: bad JSON {data:?}: {e}")))
        .collect()
}

struct Texts {
    reasoning: String,
    content: String,
    finish: Vec<String>,
}

/// Concatenated reasoning (`reasoning_content` or `reasoning`) and content texts, null-tolerant.
fn texts(values: &[Value]) -> Texts {
    let mut t = Texts { reasoning: String::new(), content: String::new(), finish: Vec::new() };
    for v in values {
        for choice in v["choices"].as_array().into_iter().flatten() {
            let delta = &choice["delta"];
            for key in ["reasoning_content", "reasoning"] {
                if let Some(s) = delta[key].as_str() {
                    t.reasoning.push_str(s);
                }
            }
            if let Some(s) = delta["content"].as_str() {
                t.content.push_str(s);
            }
            if let Some(f) = choice["finish_reason"].as_str() {
                t.finish.push(f.to_string());
            }
        }
    }
    t
}

fn llamacpp_texts(name: &str) -> Texts {
    texts(&payloads(&format!("llamacpp/{name}")))
}

fn final_usage(values: &[Value]) -> &Value {
    let usage = values.iter().rev().find(|v| v["usage"].is_object()).expect("usage frame");
    assert_eq!(usage["choices"], Value::Array(vec![]), "usage rides on a choices: [] frame");
    &usage["usage"]
}

fn files_in(dir: &str, ext: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(wire(dir))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(ext))
        .map(|n| format!("{dir}/{n}"))
        .collect();
    names.sort();
    names
}

#[test]
fn every_sglang_and_vllm_sse_fixture_parses() {
    let mut seen = 0;
    let mut named_events = 0;
    for dir in SERVER_DIRS {
        for rel in files_in(dir, ".sse") {
            for (event, _) in sse_events(&read_fixture(&rel)) {
                if let Some(event) = event {
                    assert_eq!(event, "sglext_ids", "{rel}");
                    named_events += 1;
                }
            }
            for v in payloads(&rel) {
                if v.get("error").is_some() {
                    assert!(v["error"]["message"].is_string() && v["error"]["code"].is_u64(), "{rel}: {v}");
                    continue;
                }
                assert_eq!(v["object"], "chat.completion.chunk", "{rel}");
                assert!(v["id"].as_str().is_some_and(|id| id.starts_with("chatcmpl-")), "{rel}");
                assert!(v["created"].is_u64() && v["model"].is_string(), "{rel}");
                assert!(v["choices"].is_array(), "{rel}");
            }
            seen += 1;
        }
    }
    assert_eq!(seen, 9);
    assert_eq!(named_events, 1);
}

#[test]
fn reasoning_fixtures_carry_the_llamacpp_thinking_and_answer() {
    let reference = llamacpp_texts("llamacpp-b10434-chat-stream-reasoning.sse");
    assert!(reference.reasoning.starts_with("Check divisors up to the square root of 91.\n"));
    assert!(reference.reasoning.ends_with("7 divides 91.\n"));
    assert_eq!(reference.content, "No, 91 = 7 × 13, so 91 is not prime.");
    for other in ["llamacpp-b11549-chat-stream-reasoning.sse", "llamacpp-b10434-mtp-chat-stream-reasoning.sse"] {
        let t = llamacpp_texts(other);
        assert_eq!((t.reasoning, t.content), (reference.reasoning.clone(), reference.content.clone()), "{other}");
    }
    for rel in [
        "sglang/chat-stream-reasoning.sse",
        "sglang/chat-stream-reasoning-pydantic.sse",
        "vllm/chat-stream-reasoning.sse",
        "vllm/chat-stream-reasoning-content.sse",
    ] {
        let t = texts(&payloads(rel));
        assert_eq!(t.reasoning, reference.reasoning, "{rel}");
        assert_eq!(t.content, reference.content, "{rel}");
        assert_eq!(t.finish, ["stop"], "{rel}");
    }
    // The servers name the field differently.
    let raw = |rel: &str| String::from_utf8(read_fixture(rel)).unwrap();
    assert!(raw("vllm/chat-stream-reasoning.sse").contains(r#""delta":{"reasoning":"#));
    assert!(!raw("vllm/chat-stream-reasoning.sse").contains("reasoning_content"));
    assert!(raw("vllm/chat-stream-reasoning-content.sse").contains(r#""delta":{"reasoning_content":"#));
    assert!(raw("sglang/chat-stream-reasoning-pydantic.sse").contains(r#""reasoning_content":null,"tool_calls":null"#));
    // vLLM: the step with </think> carries both fields; the last step carries text and finish_reason.
    let vllm = payloads("vllm/chat-stream-reasoning.sse");
    assert!(
        vllm.iter()
            .any(|v| v["choices"][0]["delta"]["reasoning"].is_string()
                && v["choices"][0]["delta"]["content"].is_string())
    );
    let finish = vllm.iter().find(|v| v["choices"][0]["finish_reason"].is_string()).unwrap();
    assert_eq!(finish["choices"][0]["delta"]["content"], ".");
    assert_eq!(finish["choices"][0]["stop_reason"], Value::Null);
}

#[test]
fn length_fixtures_stop_inside_thinking() {
    let reference = llamacpp_texts("llamacpp-b10434-chat-stream-length.sse");
    assert_eq!(reference.content, "");
    for rel in ["sglang/chat-stream-length.sse", "vllm/chat-stream-length.sse"] {
        let values = payloads(rel);
        let t = texts(&values);
        assert_eq!(t.reasoning, reference.reasoning, "{rel}");
        assert_eq!(t.content, "", "{rel}: no content");
        assert_eq!(t.finish, ["length"], "{rel}");
        let usage = final_usage(&values);
        let reasoning =
            usage.get("reasoning_tokens").unwrap_or(&usage["completion_tokens_details"]["reasoning_tokens"]);
        assert_eq!(reasoning, &usage["completion_tokens"], "{rel}: all tokens were thinking");
        assert_eq!(usage["completion_tokens"], 12, "{rel}");
    }
}

#[test]
fn usage_and_spec_figures_are_consistent() {
    // SGLang: top-level usage.reasoning_tokens; sglext.spec_tokens_details.
    for rel in files_in("sglang", ".sse") {
        let values = payloads(&rel);
        let usage = final_usage(&values);
        let (prompt, completion) =
            (usage["prompt_tokens"].as_u64().unwrap(), usage["completion_tokens"].as_u64().unwrap());
        assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt + completion, "{rel}");
        assert!(usage["reasoning_tokens"].as_u64().unwrap() <= completion, "{rel}");
        assert_eq!(usage["prompt_tokens_details"], Value::Null, "{rel}");
    }
    let values = payloads("sglang/chat-stream-reasoning.sse");
    let completion = final_usage(&values)["completion_tokens"].as_u64().unwrap();
    let spec = &values.iter().find(|v| v["sglext"]["spec_tokens_details"].is_object()).unwrap()["sglext"]["spec_tokens_details"];
    let verify = spec["spec_verify_ct"].as_u64().unwrap();
    let correct = spec["spec_num_correct_drafts"].as_u64().unwrap();
    let proposed = spec["spec_num_proposed_drafts"].as_u64().unwrap();
    let hist: Vec<u64> = serde_json::from_value(spec["spec_correct_drafts_histogram"].clone()).unwrap();
    assert_eq!(proposed, verify * 3, "3 drafts per verify (speculative_num_draft_tokens 4)");
    assert_eq!(hist.iter().sum::<u64>(), verify);
    assert_eq!(hist.iter().enumerate().map(|(k, n)| k as u64 * n).sum::<u64>(), correct);
    assert_eq!(1 + verify + correct, completion, "prefill token + one bonus per verify + accepted drafts");
    assert_eq!(spec["spec_accept_length"].as_f64().unwrap(), completion as f64 / verify as f64);
    assert_eq!(spec["spec_accept_rate"].as_f64().unwrap(), correct as f64 / proposed as f64);
    let ids = &values.iter().find(|v| v["sglext"]["output_ids"].is_array()).unwrap()["sglext"]["output_ids"][0];
    assert_eq!(ids.as_array().unwrap().len() as u64, completion);
    let finish = values.iter().find(|v| v["choices"][0]["finish_reason"] == "stop").unwrap();
    assert_eq!(finish["choices"][0]["matched_stop"], ids[ids.as_array().unwrap().len() - 1]);
    assert_eq!(finish["choices"][0]["matched_stop"], 482, "<|im_end|> in models/demo/tokenizer.json");
    assert_eq!(ids[70], 505, "</think> follows the 70 thinking tokens");

    // vLLM: usage.completion_tokens_details.reasoning_tokens; metrics.speculative_decoding.
    for rel in files_in("vllm", ".sse") {
        let values = payloads(&rel);
        let usage = final_usage(&values);
        let (prompt, completion) =
            (usage["prompt_tokens"].as_u64().unwrap(), usage["completion_tokens"].as_u64().unwrap());
        assert_eq!(usage["total_tokens"].as_u64().unwrap(), prompt + completion, "{rel}");
        if let Some(reasoning) = usage["completion_tokens_details"]["reasoning_tokens"].as_u64() {
            assert!(reasoning <= completion, "{rel}");
        }
        let Some(spec) = values.iter().find_map(|v| v["metrics"]["speculative_decoding"].as_object()) else {
            continue;
        };
        let steps = spec["num_spec_steps"].as_u64().unwrap();
        let accepted = spec["num_accepted_draft_tokens"].as_u64().unwrap();
        let k = spec["num_spec_tokens"].as_u64().unwrap();
        let hist: Vec<u64> = serde_json::from_value(spec["acceptance_histogram"].clone()).unwrap();
        assert_eq!(k, 3, "{rel}");
        assert_eq!(spec["num_draft_tokens"].as_u64().unwrap(), steps * k, "{rel}");
        assert_eq!(hist.len() as u64, k + 1, "{rel}");
        assert_eq!(hist.iter().sum::<u64>(), steps, "{rel}");
        assert_eq!(hist.iter().enumerate().map(|(j, n)| j as u64 * n).sum::<u64>(), accepted, "{rel}");
        assert_eq!(1 + steps + accepted, completion, "{rel}");
        assert_eq!(spec["mean_acceptance_length"].as_f64().unwrap(), 1.0 + accepted as f64 / steps as f64, "{rel}");
        assert_eq!(spec["draft_acceptance_rate"].as_f64().unwrap(), accepted as f64 / (steps * k) as f64, "{rel}");
    }
}

/// `name{labels} value` samples of a Prometheus text body, labels as written.
fn prometheus(rel: &str) -> Vec<(String, String, f64)> {
    let text = String::from_utf8(read_fixture(rel)).unwrap();
    let mut samples = Vec::new();
    let mut typed = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            typed.push(rest.split(' ').next().unwrap().to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.trim_end_matches('}')),
            None => (series, ""),
        };
        assert!(typed.iter().any(|t| t == name), "{rel}: {name} has no # TYPE");
        samples.push((name.to_string(), labels.to_string(), value.parse().unwrap()));
    }
    samples
}

fn sample(samples: &[(String, String, f64)], name: &str, label: &str) -> f64 {
    samples.iter().find(|(n, l, _)| n == name && l.contains(label)).unwrap_or_else(|| panic!("no {name}{{{label}}}")).2
}

#[test]
fn vllm_metrics_deltas_equal_the_streamed_spec_figures() {
    let (before, after) = (prometheus("vllm/metrics-before.txt"), prometheus("vllm/metrics-after.txt"));
    let delta = |name: &str, label: &str| sample(&after, name, label) - sample(&before, name, label);
    let values = payloads("vllm/chat-stream-reasoning.sse");
    let spec = values.iter().find_map(|v| v["metrics"]["speculative_decoding"].as_object()).unwrap();
    let hist: Vec<u64> = serde_json::from_value(spec["acceptance_histogram"].clone()).unwrap();
    let m = r#"model_name="demo""#;
    assert_eq!(delta("vllm:spec_decode_num_drafts_total", m), spec["num_spec_steps"].as_f64().unwrap());
    assert_eq!(delta("vllm:spec_decode_num_draft_tokens_total", m), spec["num_draft_tokens"].as_f64().unwrap());
    assert_eq!(
        delta("vllm:spec_decode_num_accepted_tokens_total", m),
        spec["num_accepted_draft_tokens"].as_f64().unwrap()
    );
    for position in 0..3 {
        // drafts accepted at position i = verify steps that accepted more than i drafts
        let expected: u64 = hist.iter().skip(position + 1).sum();
        let label = format!("position=\"{position}\"");
        assert_eq!(delta("vllm:spec_decode_num_accepted_tokens_per_pos_total", &label), expected as f64);
    }
    assert_eq!(delta("vllm:generation_tokens_total", m), final_usage(&values)["completion_tokens"].as_f64().unwrap());
    assert_eq!(delta("vllm:prompt_tokens_total", m), 16.0);
    for samples in [&before, &after] {
        let kv = sample(samples, "vllm:kv_cache_usage_perc", m);
        assert!((0.0..=1.0).contains(&kv), "a fraction, despite the name");
        assert!(samples.iter().all(|(n, l, _)| !n.starts_with("vllm:") || l.contains(r#"engine="0""#)));
    }
    assert!(sample(&after, "vllm:kv_cache_usage_perc", m) > 0.0);
}

#[test]
fn sglang_metrics_and_server_info_match_the_stream() {
    let (before, after) = (prometheus("sglang/metrics-before.txt"), prometheus("sglang/metrics-after.txt"));
    let m = r#"model_name="demo""#;
    let delta = |name: &str| sample(&after, name, m) - sample(&before, name, m);
    let values = payloads("sglang/chat-stream-reasoning.sse");
    let spec = &values.iter().find(|v| v["sglext"]["spec_tokens_details"].is_object()).unwrap()["sglext"]["spec_tokens_details"];
    assert_eq!(delta("sglang:spec_verify_calls_total"), spec["spec_verify_ct"].as_f64().unwrap());
    assert_eq!(delta("sglang:generation_tokens_total"), final_usage(&values)["completion_tokens"].as_f64().unwrap());
    assert_eq!(delta("sglang:num_requests_total"), 1.0);
    for samples in [&before, &after] {
        let used = sample(samples, "sglang:num_used_tokens", m);
        let total = sample(samples, "sglang:max_total_num_tokens", m);
        let usage = sample(samples, "sglang:token_usage", m);
        assert!((usage - (used / total * 100.0).round() / 100.0).abs() < 1e-9, "token_usage = used / max, 2 places");
        for gauge in ["sglang:spec_accept_length", "sglang:spec_accept_rate"] {
            sample(samples, gauge, m);
        }
    }
    let info: Value = serde_json::from_slice(&read_fixture("sglang/server_info.json")).unwrap();
    assert_eq!(info["version"], "0.5.23");
    assert_eq!(info["speculative_num_steps"], 3);
    assert_eq!(info["speculative_num_draft_tokens"], 4);
    assert_eq!(info["context_length"], 4096);
    assert!(info["internal_states"][0]["avg_spec_accept_length"].as_f64().unwrap() > 1.0);
    for rel in ["sglang/models.json", "vllm/models.json"] {
        let models: Value = serde_json::from_slice(&read_fixture(rel)).unwrap();
        assert_eq!(models["data"][0]["id"], "demo", "{rel}");
        assert_eq!(models["data"][0]["max_model_len"], 4096, "{rel}");
    }
    let version: Value = serde_json::from_slice(&read_fixture("vllm/version.json")).unwrap();
    assert_eq!(version["version"], "0.32.0");
}

#[test]
fn sglang_error_fixture_ends_in_an_error_frame() {
    let values = payloads("sglang/chat-stream-error.sse");
    let at = values.iter().position(|v| v.get("error").is_some()).expect("error frame");
    assert!(values[..at].iter().skip(1).all(|v| v["choices"][0]["delta"]["reasoning_content"].is_string()));
    assert_eq!(values[at]["error"]["code"], 503);
    assert!(values[at + 1..].iter().all(|v| v["choices"] == Value::Array(vec![])), "no choice after the error");
    assert!(texts(&values).finish.is_empty(), "no finish frame");
}

#[test]
fn fault_fixtures_are_what_they_say() {
    // malformed: exactly one data payload is not JSON, and it is not the first.
    let events = sse_events(&read_fixture("faults/malformed.sse"));
    let bad: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, (_, d))| d != "[DONE]" && serde_json::from_str::<Value>(d).is_err())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(bad.len(), 1);
    assert!(bad[0] >= 3);
    // cut: no [DONE], no final blank line, and the last payload stops inside a UTF-8 character.
    let cut = read_fixture("faults/cut-mid-token.sse");
    assert!(!cut.ends_with(b"\n"));
    assert!(!cut.windows(6).any(|w| w == b"[DONE]"));
    let last = cut.rsplit(|&b| b == b'\n').next().unwrap();
    assert!(std::str::from_utf8(last).is_err() && serde_json::from_slice::<Value>(&last[6..]).is_err());
    let good = &cut[..cut.len() - last.len()];
    assert!(sse_events(good).iter().all(|(_, d)| serde_json::from_str::<Value>(d).is_ok()));
    // nonstream: one chat.completion with both texts.
    let whole: Value = serde_json::from_slice(&read_fixture("faults/nonstream.json")).unwrap();
    assert_eq!(whole["object"], "chat.completion");
    let reference = llamacpp_texts("llamacpp-b10434-chat-stream-reasoning.sse");
    assert_eq!(whole["choices"][0]["message"]["content"], reference.content.as_str());
    assert_eq!(whole["choices"][0]["message"]["reasoning_content"], reference.reasoning.as_str());
    // error bodies
    for (rel, code) in [("401", 401), ("400", 400), ("503", 503), ("404-model", 404), ("400-sglang", 400)] {
        let body: Value = serde_json::from_slice(&read_fixture(&format!("faults/{rel}.json"))).unwrap();
        let error = if body.get("error").is_some() { &body["error"] } else { &body };
        assert_eq!(error["code"], code, "{rel}");
        assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()), "{rel}");
    }
    let html = read_fixture("faults/html-page.html");
    assert!(html.starts_with(b"<!DOCTYPE html>"));
    // the llama.cpp recordings are there, with their request bodies
    assert_eq!(files_in("llamacpp", ".sse").len(), 12);
    assert_eq!(files_in("llamacpp/requests", ".json").len(), 9);
    assert!(Path::new(&wire("llamacpp/llamacpp-b10434-chat-stream-reasoning.headers")).is_file());
}
