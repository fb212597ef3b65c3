//! `deltascope serve`: the in-process engine behind an OpenAI-compatible API (`server/`).

use std::io::{self, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use clap::Args;
use serde::Serialize;

use super::common::{device_spec, whole_number};
use super::report::{self, Report};
use crate::backend::{self, BackendSpec, OpenProgress};
use crate::server::{ServeConfig, serve};
use deltascope_model::DeviceSpec;
use deltascope_protocol::{GenerationParams, MtpMode};

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: super::common::LocalModelArgs,
    /// Where the engine runs: auto, cpu, cuda, cuda:0, cuda:0,1.
    #[arg(long, default_value = "auto", value_parser = device_spec, value_name = "auto|cpu|cuda|cuda:N[,M]")]
    pub device: DeviceSpec,
    /// Address or host name to bind (`localhost`, `0.0.0.0`, `::1`); anything but loopback
    /// without --api-key prints a warning.
    #[arg(long, default_value = "127.0.0.1", value_name = "ADDRESS|NAME")]
    pub host: String,
    /// Port (0: a free one, printed at start).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Every route but /health then needs `Authorization: Bearer KEY` (not empty).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// Requests that may wait for the engine besides the one generating (more: 503).
    #[arg(long, default_value_t = 64, value_name = "N")]
    pub max_queue: usize,
    /// The largest request body accepted, in bytes (larger: 413).
    #[arg(long, default_value_t = 4 << 20, value_name = "BYTES", value_parser = whole_number)]
    pub body_limit: usize,
    /// Seconds a connection may take to send a request's head, or sit idle between requests,
    /// before it is closed; a request's body has as long again (then 408).
    #[arg(long, default_value_t = 30, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout: u64,
    /// MTP speculative decoding for every request: draft steps (0 = off) or `auto`.
    #[arg(long, default_value = "0", value_name = "N|auto")]
    pub mtp: MtpMode,
}

/// The address `--host` names: an IP address as written, or a name resolved here (`localhost`
/// gives its IPv4 address first when it has one: what most clients try first too).
fn listen_address(host: &str, port: u16) -> anyhow::Result<SocketAddr> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let found: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("--host {host}: not an IP address, and the name does not resolve here ({e})"))?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| anyhow::anyhow!("--host {host}: the name resolves to no address"))
}

pub fn run(a: ServeArgs) -> anyhow::Result<()> {
    let addr = check_flags(&a)?;
    let spec = a.model.spec(a.device.clone())?;
    let opened = backend::open(&BackendSpec::Local(spec), &|_: OpenProgress| {})?;
    super::common::print_notes(opened.info());
    let name = opened.info().name.clone();
    let opened_has_mtp = opened.info().has_mtp;
    let backend: Arc<dyn backend::Backend> = Arc::from(opened);
    let cfg = config(&a, addr);
    if cfg.mtp.is_on() && !opened_has_mtp {
        anyhow::bail!("--mtp: {name} has no MTP head (no mtp.* tensors), so it cannot draft");
    }
    if !addr.ip().is_loopback() && cfg.api_key.is_none() {
        eprintln!(
            "warning: serving on {} without --api-key: anyone who can reach this address can use the model",
            addr.ip()
        );
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.block_on(serve(backend, cfg, move |addr| {
        // On stdout (the one line a script waits for), flushed at once; logs go to stderr.
        let _ = report::emit(&Listening { model: name, address: addr.to_string() }, false);
    }))?;
    Ok(())
}

/// The flags that need more than clap checks, before anything is loaded; the address to bind.
fn check_flags(a: &ServeArgs) -> anyhow::Result<SocketAddr> {
    // Zero would refuse every request: a server that cannot serve is a mistake, said now.
    anyhow::ensure!(
        a.max_queue >= 1,
        "--max-queue 0: must be at least 1 (the requests that may wait while one generates; 0 would answer 503 to every request sent during a generation)"
    );
    anyhow::ensure!(a.body_limit >= 1, "--body-limit 0: must be at least 1 byte (0 would answer 413 to every request)");
    if a.api_key.as_deref().is_some_and(|k| k.trim().is_empty()) {
        anyhow::bail!("--api-key is empty: give a key, or leave the flag out to serve without one");
    }
    let addr = listen_address(&a.host, a.port)?;
    // The depth's range is the one table's, as for `run --mtp` and the slider.
    GenerationParams { mtp: a.mtp, ..Default::default() }
        .check()
        .map_err(|e| anyhow::anyhow!("--mtp {}: must be {}, or auto", a.mtp, e.expected))?;
    Ok(addr)
}

/// The server's settings from the flags.
fn config(a: &ServeArgs, addr: SocketAddr) -> ServeConfig {
    let mut cfg = ServeConfig::new(addr);
    cfg.api_key = a.api_key.clone();
    cfg.max_queue = a.max_queue;
    cfg.body_limit = a.body_limit;
    cfg.header_timeout = std::time::Duration::from_secs(a.timeout);
    cfg.body_timeout = cfg.header_timeout;
    cfg.mtp = a.mtp;
    cfg
}

/// The server is listening: which model, where.
#[derive(Serialize)]
struct Listening {
    model: String,
    /// The bound address (`--port 0` picks a free port).
    address: String,
}

impl Report for Listening {
    fn print_human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "deltascope serve: {} on http://{} (OpenAI API under /v1; Ctrl+C stops)",
            self.model, self.address
        )
    }
}
