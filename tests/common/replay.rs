//! A scripted HTTP/1.1 server on 127.0.0.1 for client tests: it replays recorded (or hand-built)
//! responses byte for byte, and plays misbehaving servers for fault tests.
//!
//! std only, one thread per connection, one request per connection (every reply carries
//! `Connection: close`). Everything is bounded in time: a [`After::Hang`] or [`Reply::Silent`]
//! ends after [`HANG_LIMIT`] even if the client never closes, a connection that sends no request
//! is dropped after [`REQUEST_TIMEOUT`], and dropping the [`ReplayServer`] ends every connection
//! within about [`POLL`].
//!
//! ```ignore
//! #[path = "common/replay.rs"]
//! mod replay;
//! use replay::{After, Reply, ReplayServer, Route};
//!
//! let server = ReplayServer::start(vec![
//!     Route::get("/v1/models", Reply::json_file(200, replay::wire("vllm/models.json"))),
//!     Route::post("/v1/chat/completions", Reply::sse_file(replay::wire("vllm/chat-stream-reasoning.sse"))),
//!     // the nth GET /metrics gets the nth reply (the last one repeats)
//!     Route::get("/metrics", Reply::Sequence(vec![
//!         Reply::text_file(200, replay::wire("vllm/metrics-before.txt")),
//!         Reply::text_file(200, replay::wire("vllm/metrics-after.txt")),
//!     ])),
//! ]);
//! let base = server.url(); // "http://127.0.0.1:PORT"
//! // … run the client against `base` …
//! let sent = &server.requests()[0];
//! assert_eq!(sent.path, "/v1/chat/completions");
//! assert!(sent.body_str().contains("\"stream\":true"));
//!
//! // A stream that stops mid-answer and keeps the socket open: for cancel tests.
//! let hung = ReplayServer::start(vec![Route::post(
//!     "/v1/chat/completions",
//!     Reply::sse_file(replay::wire("sglang/chat-stream-reasoning.sse")).truncated(5).then(After::Hang),
//! )]);
//! // … start the client, cancel it …
//! assert!(hung.wait_client_closes(1, std::time::Duration::from_millis(100)));
//! ```
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The longest a [`After::Hang`] or [`Reply::Silent`] keeps a socket open when the client never closes it.
pub const HANG_LIMIT: Duration = Duration::from_secs(30);
/// The longest the server waits for a complete request (head and body) on a new connection.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How often blocked connection threads look at the stop flag (and so the latency of `Drop`).
pub const POLL: Duration = Duration::from_millis(20);
/// The pause [`Reply::sse_file`] / [`Reply::sse_bytes`] put before every frame after the first, so a
/// client reading the socket sees the frames arrive one by one. [`Reply::paced`] changes it.
pub const SSE_FRAME_GAP: Duration = Duration::from_millis(1);
/// A blocked write (a client that stopped reading) fails after this long.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// Request heads larger than this are refused with 431.
const MAX_HEAD: usize = 64 * 1024;
/// Request bodies larger than this are refused with 413.
const MAX_BODY: usize = 16 * 1024 * 1024;

/// The body unknown routes get, with status 404.
pub const NO_ROUTE_BODY: &str = r#"{"error":{"message":"no route","type":"not_found"}}"#;

/// `tests/fixtures/wire/<rel>` in this crate.
pub fn wire(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wire").join(rel)
}

/// One scripted endpoint. `path` is matched exactly against the request path with its query
/// string removed; `method` is matched exactly (`"GET"`, `"POST"`, …).
#[derive(Clone, Debug)]
pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub reply: Reply,
}

impl Route {
    pub fn new(method: &'static str, path: &'static str, reply: Reply) -> Route {
        Route { method, path, reply }
    }
    pub fn get(path: &'static str, reply: Reply) -> Route {
        Route::new("GET", path, reply)
    }
    pub fn post(path: &'static str, reply: Reply) -> Route {
        Route::new("POST", path, reply)
    }
}

/// What the server does once the reply's pieces are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum After {
    /// Finish properly: the terminating `0\r\n\r\n` chunk (for chunked replies), then close.
    Close,
    /// Send nothing more and keep the socket open until the client closes it, the server is
    /// dropped, or [`HANG_LIMIT`] passes. A chunked body never gets its terminating chunk.
    Hang,
    /// Close at once (FIN) without the terminating chunk: the body ends mid-stream.
    Cut,
}

/// A scripted reply.
#[derive(Clone, Debug)]
pub enum Reply {
    /// Status line and headers, then a `Content-Length` body written at once, then close.
    /// `Content-Length` is added unless `headers` already has one (so a test can make it lie).
    Fixed { status: u16, headers: Vec<(String, String)>, body: Vec<u8> },
    /// Status line and headers with `Transfer-Encoding: chunked`, then each piece as one HTTP
    /// chunk (one write, `TCP_NODELAY`), each after its delay; then `then`. An empty piece is a
    /// pure delay. While it waits out a delay the server watches for the client closing.
    Chunks { status: u16, headers: Vec<(String, String)>, pieces: Vec<(Duration, Vec<u8>)>, then: After },
    /// These bytes verbatim (no status line is generated: write one yourself, or don't), then
    /// `then`. For replies that are not HTTP, or HTTP/1.0 bodies that run until close.
    Raw { bytes: Vec<u8>, then: After },
    /// Read the request, then answer nothing and hold the socket like [`After::Hang`].
    Silent,
    /// Wait this long (watching for the client closing), then send the inner reply.
    Delay(Duration, Box<Reply>),
    /// The nth request to the route gets the nth reply; the last one repeats.
    Sequence(Vec<Reply>),
}

impl Reply {
    /// A fixed reply with a `Content-Type` header.
    pub fn fixed(status: u16, content_type: &str, body: impl Into<Vec<u8>>) -> Reply {
        Reply::Fixed { status, headers: vec![("Content-Type".into(), content_type.into())], body: body.into() }
    }
    /// `application/json`, Content-Length.
    pub fn json(status: u16, body: &str) -> Reply {
        Reply::fixed(status, "application/json", body)
    }
    /// `application/json` from a file, Content-Length.
    pub fn json_file(status: u16, path: impl AsRef<Path>) -> Reply {
        Reply::fixed(status, "application/json", read(path.as_ref()))
    }
    /// `text/html; charset=utf-8`, Content-Length.
    pub fn html(status: u16, body: &str) -> Reply {
        Reply::fixed(status, "text/html; charset=utf-8", body)
    }
    /// `text/html; charset=utf-8` from a file, Content-Length.
    pub fn html_file(status: u16, path: impl AsRef<Path>) -> Reply {
        Reply::fixed(status, "text/html; charset=utf-8", read(path.as_ref()))
    }
    /// Prometheus text (`text/plain; version=0.0.4; charset=utf-8`), Content-Length.
    pub fn text(status: u16, body: &str) -> Reply {
        Reply::fixed(status, "text/plain; version=0.0.4; charset=utf-8", body)
    }
    /// Prometheus text from a file, Content-Length.
    pub fn text_file(status: u16, path: impl AsRef<Path>) -> Reply {
        Reply::fixed(status, "text/plain; version=0.0.4; charset=utf-8", read(path.as_ref()))
    }
    /// 200 `text/event-stream`, chunked, one piece per SSE frame ([`sse_frames`]), frames after the
    /// first [`SSE_FRAME_GAP`] apart, then [`After::Close`].
    pub fn sse_file(path: impl AsRef<Path>) -> Reply {
        Reply::sse_bytes(&read(path.as_ref()))
    }
    /// As [`Reply::sse_file`], from bytes.
    pub fn sse_bytes(bytes: &[u8]) -> Reply {
        let pieces = sse_frames(bytes)
            .into_iter()
            .enumerate()
            .map(|(i, frame)| (if i == 0 { Duration::ZERO } else { SSE_FRAME_GAP }, frame))
            .collect();
        Reply::Chunks {
            status: 200,
            headers: vec![
                ("Content-Type".into(), "text/event-stream".into()),
                ("Cache-Control".into(), "no-cache".into()),
            ],
            pieces,
            then: After::Close,
        }
    }
    /// As [`Reply::sse_bytes`], from frames given without their blank-line terminators
    /// (`"data: {…}"`); each gets `"\n\n"`.
    pub fn sse_events<S: AsRef<str>>(events: &[S]) -> Reply {
        let mut bytes = Vec::new();
        for event in events {
            bytes.extend_from_slice(event.as_ref().as_bytes());
            bytes.extend_from_slice(b"\n\n");
        }
        Reply::sse_bytes(&bytes)
    }

    /// The same reply with every piece's delay after the first set to `gap` (`Chunks` only).
    pub fn paced(mut self, gap: Duration) -> Reply {
        if let Reply::Chunks { pieces, .. } = &mut self {
            for (i, (delay, _)) in pieces.iter_mut().enumerate() {
                *delay = if i == 0 { Duration::ZERO } else { gap };
            }
        }
        self
    }
    /// The same reply with only its first `n` pieces (`Chunks` only).
    pub fn truncated(mut self, n: usize) -> Reply {
        if let Reply::Chunks { pieces, .. } = &mut self {
            pieces.truncate(n);
        }
        self
    }
    /// The same reply ending with `after` (`Chunks` and `Raw`).
    pub fn then(mut self, after: After) -> Reply {
        match &mut self {
            Reply::Chunks { then, .. } | Reply::Raw { then, .. } => *then = after,
            _ => {}
        }
        self
    }
    /// The same reply with another header (`Fixed` and `Chunks`).
    pub fn with_header(mut self, name: &str, value: &str) -> Reply {
        match &mut self {
            Reply::Fixed { headers, .. } | Reply::Chunks { headers, .. } => headers.push((name.into(), value.into())),
            _ => {}
        }
        self
    }
    /// The same reply with another status (`Fixed` and `Chunks`).
    pub fn with_status(mut self, new: u16) -> Reply {
        match &mut self {
            Reply::Fixed { status, .. } | Reply::Chunks { status, .. } => *status = new,
            _ => {}
        }
        self
    }
    /// This reply sent after a pause of `delay` (time to first byte).
    pub fn delayed(self, delay: Duration) -> Reply {
        Reply::Delay(delay, Box::new(self))
    }
}

/// Splits an SSE body into frames, each with its terminating blank line (`\n\n` or `\r\n\r\n`);
/// trailing bytes without a terminator (a cut stream) form the last frame.
pub fn sse_frames(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        let end = if bytes[i..].starts_with(b"\n\n") {
            Some(i + 2)
        } else if bytes[i..].starts_with(b"\r\n\r\n") {
            Some(i + 4)
        } else {
            None
        };
        match end {
            Some(end) => {
                frames.push(bytes[start..end].to_vec());
                start = end;
                i = end;
            }
            None => i += 1,
        }
    }
    if start < bytes.len() {
        frames.push(bytes[start..].to_vec());
    }
    frames
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("replay fixture {}: {e}", path.display()))
}

/// A request as the server received it.
#[derive(Clone, Debug)]
pub struct Recorded {
    pub method: String,
    /// The request target as sent, query string included.
    pub target: String,
    /// The path, without the query string.
    pub path: String,
    /// Header names lowercased, values trimmed, in the order sent.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked if it came with `Transfer-Encoding: chunked`.
    pub body: Vec<u8>,
}

impl Recorded {
    /// The first value of a header (name case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    /// The body as UTF-8 (lossy).
    pub fn body_str(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

struct Shared {
    routes: Vec<Route>,
    stop: AtomicBool,
    connections: AtomicUsize,
    hits: Mutex<Vec<usize>>,
    requests: Mutex<Vec<Recorded>>,
    closes: Mutex<Vec<Instant>>,
    closed: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }
    fn client_closed(&self) {
        lock(&self.closes).push(Instant::now());
        self.closed.notify_all();
    }
    /// The reply for a request: its route's (the nth of a `Sequence`), else the 404.
    fn reply_for(&self, method: &str, path: &str) -> Reply {
        let Some(index) = self.routes.iter().position(|r| r.method == method && r.path == path) else {
            return Reply::json(404, NO_ROUTE_BODY);
        };
        let nth = {
            let mut hits = lock(&self.hits);
            hits[index] += 1;
            hits[index] - 1
        };
        let mut reply = self.routes[index].reply.clone();
        while let Reply::Sequence(list) = reply {
            reply = match list.get(nth).or(list.last()) {
                Some(r) => r.clone(),
                None => return Reply::json(500, r#"{"error":{"message":"empty sequence","type":"replay"}}"#),
            };
        }
        reply
    }
}

/// The server: serves `routes` on `127.0.0.1:<free port>` until dropped.
pub struct ReplayServer {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl ReplayServer {
    /// Binds `127.0.0.1:0` and serves on a thread, each connection on its own thread.
    pub fn start(routes: Vec<Route>) -> ReplayServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("replay server: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("replay server: local_addr");
        let shared = Arc::new(Shared {
            hits: Mutex::new(vec![0; routes.len()]),
            routes,
            stop: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            requests: Mutex::new(Vec::new()),
            closes: Mutex::new(Vec::new()),
            closed: Condvar::new(),
        });
        let accept_shared = Arc::clone(&shared);
        let accept = thread::Builder::new()
            .name("replay-accept".into())
            .spawn(move || accept_loop(listener, accept_shared))
            .expect("replay server: spawn");
        ReplayServer { addr, shared, accept: Some(accept) }
    }

    /// `"http://127.0.0.1:PORT"`, no trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        lock(&self.shared.requests).clone()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// How many times a client closed (or reset) its connection while the server was still
    /// replying: during a piece's delay, a [`After::Hang`], a [`Reply::Silent`] or a
    /// [`Reply::Delay`], or when a write failed. Clean finishes do not count.
    pub fn client_closes(&self) -> usize {
        lock(&self.shared.closes).len()
    }

    /// When each of those closes was seen.
    pub fn client_close_times(&self) -> Vec<Instant> {
        lock(&self.shared.closes).clone()
    }

    /// Waits until [`ReplayServer::client_closes`] reaches `n` or `within` passes; says whether it did.
    pub fn wait_client_closes(&self, n: usize, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut closes = lock(&self.shared.closes);
        while closes.len() < n {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            closes = match self.shared.closed.wait_timeout(closes, deadline - now) {
                Ok((guard, _)) => guard,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }
}

impl Drop for ReplayServer {
    /// Stops the accept loop (flag, then a connection to itself to wake `accept`) and joins it;
    /// connection threads see the flag within [`POLL`] and close their sockets. Never blocks long.
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.closed.notify_all();
        let woke = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1)).is_ok();
        if let Some(handle) = self.accept.take()
            && woke
        {
            let _ = handle.join();
        }
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stopped() {
            break;
        }
        let Ok(stream) = conn else {
            thread::sleep(Duration::from_millis(5));
            continue;
        };
        shared.connections.fetch_add(1, Ordering::SeqCst);
        let conn_shared = Arc::clone(&shared);
        let _ = thread::Builder::new().name("replay-conn".into()).spawn(move || serve(stream, &conn_shared));
    }
}

/// What happened while the server waited.
#[derive(PartialEq, Eq)]
enum Wait {
    Elapsed,
    ClientClosed,
    Stopped,
}

/// Waits `dur` while reading (and discarding) whatever the client sends, so that a close is
/// seen at once.
fn wait_watching(stream: &TcpStream, dur: Duration, shared: &Shared) -> Wait {
    let deadline = Instant::now() + dur;
    let mut sink = [0u8; 4096];
    loop {
        if shared.stopped() {
            return Wait::Stopped;
        }
        let now = Instant::now();
        if now >= deadline {
            return Wait::Elapsed;
        }
        let slice = (deadline - now).min(POLL).max(Duration::from_millis(1));
        if stream.set_read_timeout(Some(slice)).is_err() {
            return Wait::ClientClosed;
        }
        match (&*stream).read(&mut sink) {
            Ok(0) => return Wait::ClientClosed,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            Err(_) => return Wait::ClientClosed,
        }
    }
}

fn serve(stream: TcpStream, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let mut input = Input { stream: &stream, shared, buf: Vec::new(), deadline: Instant::now() + REQUEST_TIMEOUT };
    let request = match read_request(&mut input) {
        Ok(request) => request,
        Err(status) => {
            if let Some(status) = status {
                let head =
                    format!("HTTP/1.1 {status} {}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", reason(status));
                let _ = (&stream).write_all(head.as_bytes());
                finish(&stream, shared);
            }
            return;
        }
    };
    let reply = shared.reply_for(&request.method, &request.path);
    lock(&shared.requests).push(request);
    respond(&stream, reply, shared);
}

/// Writes a reply; returns once the connection is done with.
fn respond(stream: &TcpStream, reply: Reply, shared: &Shared) {
    let mut out = stream;
    match reply {
        Reply::Fixed { status, headers, body } => {
            let mut head = status_and_headers(status, &headers);
            if !has_header(&headers, "content-length") {
                head.push_str(&format!("Content-Length: {}\r\n", body.len()));
            }
            head.push_str("\r\n");
            let mut bytes = head.into_bytes();
            bytes.extend_from_slice(&body);
            if out.write_all(&bytes).is_err() {
                shared.client_closed();
                return;
            }
            finish(stream, shared);
        }
        Reply::Chunks { status, headers, pieces, then } => {
            let mut head = status_and_headers(status, &headers);
            if !has_header(&headers, "transfer-encoding") {
                head.push_str("Transfer-Encoding: chunked\r\n");
            }
            head.push_str("\r\n");
            if out.write_all(head.as_bytes()).is_err() {
                shared.client_closed();
                return;
            }
            for (delay, piece) in pieces {
                if !delay.is_zero() {
                    match wait_watching(stream, delay, shared) {
                        Wait::Elapsed => {}
                        Wait::ClientClosed => return shared.client_closed(),
                        Wait::Stopped => return cut(stream),
                    }
                }
                if piece.is_empty() {
                    continue;
                }
                let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
                chunk.extend_from_slice(&piece);
                chunk.extend_from_slice(b"\r\n");
                if out.write_all(&chunk).is_err() {
                    return shared.client_closed();
                }
            }
            match then {
                After::Close => {
                    if out.write_all(b"0\r\n\r\n").is_err() {
                        return shared.client_closed();
                    }
                    finish(stream, shared);
                }
                After::Hang => hang(stream, shared),
                After::Cut => cut(stream),
            }
        }
        Reply::Raw { bytes, then } => {
            if out.write_all(&bytes).is_err() {
                return shared.client_closed();
            }
            match then {
                After::Close => finish(stream, shared),
                After::Hang => hang(stream, shared),
                After::Cut => cut(stream),
            }
        }
        Reply::Silent => hang(stream, shared),
        Reply::Delay(delay, inner) => match wait_watching(stream, delay, shared) {
            Wait::Elapsed => respond(stream, *inner, shared),
            Wait::ClientClosed => shared.client_closed(),
            Wait::Stopped => cut(stream),
        },
        Reply::Sequence(_) => unreachable!("resolved by reply_for"),
    }
}

/// Keeps the socket open until the client closes it, the server stops, or [`HANG_LIMIT`].
fn hang(stream: &TcpStream, shared: &Shared) {
    if wait_watching(stream, HANG_LIMIT, shared) == Wait::ClientClosed {
        shared.client_closed();
    }
    cut(stream);
}

fn cut(stream: &TcpStream) {
    let _ = stream.shutdown(Shutdown::Both);
}

/// A clean end: FIN our side, then give the client a moment to read and close its side (so
/// that closing never resets data it has not read yet).
fn finish(stream: &TcpStream, shared: &Shared) {
    let _ = stream.shutdown(Shutdown::Write);
    let _ = wait_watching(stream, Duration::from_secs(2), shared);
}

fn status_and_headers(status: u16, headers: &[(String, String)]) -> String {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !has_header(headers, "connection") {
        head.push_str("Connection: close\r\n");
    }
    head
}

fn has_header(headers: &[(String, String)], name: &str) -> bool {
    headers.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
}

fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        301 => "Moved Permanently",
        302 => "Found",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Unknown",
    }
}

/// Buffered, bounded reads of the request.
struct Input<'a> {
    stream: &'a TcpStream,
    shared: &'a Shared,
    buf: Vec<u8>,
    deadline: Instant,
}

/// `Err(Some(status))`: answer with that status; `Err(None)`: just close.
type ReadResult<T> = Result<T, Option<u16>>;

impl Input<'_> {
    /// Reads more bytes into `buf`; fails on EOF, error, stop or the deadline.
    fn fill(&mut self) -> ReadResult<()> {
        let mut chunk = [0u8; 8192];
        loop {
            if self.shared.stopped() {
                return Err(None);
            }
            let now = Instant::now();
            if now >= self.deadline {
                return Err(Some(408));
            }
            let _ = self.stream.set_read_timeout(Some((self.deadline - now).min(POLL).max(Duration::from_millis(1))));
            match (&*self.stream).read(&mut chunk) {
                Ok(0) => return Err(None),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(());
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
                Err(_) => return Err(None),
            }
        }
    }
    /// Takes one CRLF- (or LF-) terminated line, without its terminator.
    fn line(&mut self, limit: usize) -> ReadResult<String> {
        loop {
            if let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
                let mut line: Vec<u8> = self.buf.drain(..=pos).collect();
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return String::from_utf8(line).map_err(|_| Some(400));
            }
            if self.buf.len() > limit {
                return Err(Some(431));
            }
            self.fill()?;
        }
    }
    /// Takes exactly `n` bytes.
    fn exact(&mut self, n: usize) -> ReadResult<Vec<u8>> {
        while self.buf.len() < n {
            self.fill()?;
        }
        Ok(self.buf.drain(..n).collect())
    }
}

fn read_request(input: &mut Input<'_>) -> ReadResult<Recorded> {
    let mut request_line = input.line(MAX_HEAD)?;
    while request_line.is_empty() {
        request_line = input.line(MAX_HEAD)?; // tolerate stray CRLFs before the request line
    }
    let mut parts = request_line.split_whitespace();
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(Some(400));
    };
    if !version.starts_with("HTTP/1.") {
        return Err(Some(400));
    }
    let (method, target) = (method.to_string(), target.to_string());
    let mut headers = Vec::new();
    let mut head_size = request_line.len();
    loop {
        let line = input.line(MAX_HEAD)?;
        if line.is_empty() {
            break;
        }
        head_size += line.len();
        if head_size > MAX_HEAD {
            return Err(Some(431));
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(Some(400));
        };
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
    }
    let get = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str());
    if get("expect").is_some_and(|v| v.eq_ignore_ascii_case("100-continue")) {
        let _ = (&*input.stream).write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
    }
    let chunked = get("transfer-encoding").is_some_and(|v| v.to_ascii_lowercase().contains("chunked"));
    let body = if chunked {
        read_chunked(input)?
    } else if let Some(length) = get("content-length") {
        let length: usize = length.parse().map_err(|_| Some(400))?;
        if length > MAX_BODY {
            return Err(Some(413));
        }
        input.exact(length)?
    } else {
        Vec::new()
    };
    // Absolute-form targets ("http://host:port/path") keep only the path.
    let origin = match target.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]).to_string(),
        None => target.clone(),
    };
    let path = origin.split(['?', '#']).next().unwrap_or("/").to_string();
    Ok(Recorded { method, target, path, headers, body })
}

fn read_chunked(input: &mut Input<'_>) -> ReadResult<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = input.line(1024)?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| Some(400))?;
        if size == 0 {
            // trailers, up to the blank line
            while !input.line(MAX_HEAD)?.is_empty() {}
            return Ok(body);
        }
        if body.len() + size > MAX_BODY {
            return Err(Some(413));
        }
        body.extend(input.exact(size)?);
        if !input.line(2)?.is_empty() {
            return Err(Some(400));
        }
    }
}
