//! Command-line front ends. Each subcommand lives in its own file and only consumes the
//! library (model, chat, engine events).

#![forbid(unsafe_code)]

pub mod bench;
mod bench_args;
pub mod bench_remote;
pub mod bench_stats;
pub mod chat;
pub mod common;
pub mod gpu;
pub mod gpu_parity;
pub mod inspect;
mod inspect_gguf;
pub mod interrupt;
pub mod logits;
pub mod quantize;
mod report;
pub mod run;
mod safetensors_out;
pub mod serve;
pub mod sweep;
pub mod synth;
pub mod trace;
pub mod verify;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "deltascope",
    version,
    about = "A terminal workbench for Gated-DeltaNet hybrid reasoning models (Qwen3.5 / Qwen3.6, Qwen3-Next)",
    // The workbench is the default command: its flags work without `chat` (`deltascope
    // --server URL`), and not next to another subcommand.
    args_conflicts_with_subcommands = true
)]
pub struct Cli {
    /// Write logs to this file (RUST_LOG sets the level; default warn).
    #[arg(long, global = true)]
    pub log_file: Option<PathBuf>,
    /// `deltascope` alone is `deltascope chat`: the same flags.
    #[command(flatten)]
    pub chat: chat::ChatArgs,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// The workbench TUI (the default with no subcommand): chat, watch thinking and answer
    /// stream, gauges, sliders, token inspector, sessions.
    Chat(chat::ChatArgs),
    /// Generate once, headless: human output, or JSON Lines events with --json.
    Run(run::RunArgs),
    /// Top-k next-token logits for a text or token ids (debugging, reference checks).
    Logits(logits::LogitsArgs),
    /// Architecture, layer map, parameter count and memory plan; needs only config.json.
    Inspect(inspect::InspectArgs),
    /// One prompt across thinking budgets: thinking used, answer, finish reason, correctness.
    Sweep(sweep::SweepArgs),
    /// Prefill / decode speed, TTFT, MTP acceptance and speed-up per draft depth, memory.
    Bench(bench::BenchArgs),
    /// A random-weight checkpoint of any real shape (benchmarks, GPU checks, sizing a machine).
    Synth(synth::SynthArgs),
    /// Convert a checkpoint to FP8 as Qwen publishes it (`quantize --fp8 SRC DST`), and show
    /// the logit change it causes on a probe set.
    Quantize(quantize::QuantizeArgs),
    /// CUDA on this machine: `gpu info` (libraries, GPUs), `gpu kernels` (compile kernels/ with
    /// NVRTC), `gpu check` (each kernel on the GPU against its CPU twin).
    Gpu(gpu::GpuArgs),
    /// An OpenAI-compatible server on the in-process engine (chat completions with reasoning,
    /// completions, models, health, Prometheus metrics).
    Serve(serve::ServeArgs),
    /// The state scope, headless: trace what every Gated-DeltaNet layer writes and forgets per
    /// token (JSON Lines, a summary, an SVG), or compare two traces layer by layer.
    Trace(trace::TraceArgs),
    /// Is it the server or the model? A server's greedy answers to a probe set, scored token by
    /// token by the reference engine (exit 0 agrees, 3 drifts or diverges, 1 error).
    Verify(verify::VerifyArgs),
}

impl Cli {
    /// Whether this command line opens the TUI (which owns the terminal, so logs go to a file).
    pub fn is_tui(&self) -> bool {
        matches!(self.command, None | Some(Command::Chat(_)))
    }
}

pub fn main_with(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Run(a)) => run::run(a),
        Some(Command::Logits(a)) => logits::run(a),
        Some(Command::Inspect(a)) => inspect::run(a),
        Some(Command::Sweep(a)) => sweep::run(a),
        Some(Command::Bench(a)) => bench::run(a),
        Some(Command::Synth(a)) => synth::run(a),
        Some(Command::Quantize(a)) => quantize::run(a),
        Some(Command::Gpu(a)) => gpu::run(a),
        Some(Command::Serve(a)) => serve::run(a),
        Some(Command::Trace(a)) => trace::run(a),
        Some(Command::Verify(a)) => verify::run(a),
        Some(Command::Chat(a)) => chat::run(a),
        // No subcommand: the workbench, with the chat flags given at the root (the demo model
        // when none names another).
        None => chat::run(cli.chat),
    }
}
