//! `deltascope bench`'s flags, read by the local run (bench.rs) and the run against a server
//! (bench_remote.rs) alike.

use std::path::PathBuf;

use clap::Args;

use super::common::ModelArgs;

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompts to run (repeatable; `-` reads one from standard input); the default set suits
    /// the demo model.
    #[arg(long, value_name = "TEXT")]
    pub prompt: Vec<String>,
    /// A prompt from a file (repeatable; each file is one prompt).
    #[arg(long, value_name = "FILE")]
    pub prompt_file: Vec<PathBuf>,
    /// Pad every prompt to at least N tokens (a neutral preamble before the question): MTP's
    /// speed-up and TTFT at long prompts.
    #[arg(long, value_name = "N", value_parser = super::common::whole_number)]
    pub prompt_len: Option<usize>,
    /// MTP depths to compare (0 = plain decoding, 1 to 4 draft steps, `auto` adapts; default
    /// 0,1,2,3, or 0 alone for a model without an MTP head). Local engine only: a server's
    /// speculative decoding is set where it was started.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub mtp: Vec<String>,
    #[arg(long, default_value_t = 256, value_name = "N", value_parser = super::common::whole_number)]
    pub max_tokens: usize,
    /// Measured passes per setting, interleaved (A B C A B C …); median, min and max are reported.
    #[arg(long, default_value_t = 3, value_name = "N", value_parser = super::common::whole_number)]
    pub repeat: usize,
    /// Passes per setting run first and not measured (caches, page faults, CPU clocks).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = super::common::whole_number)]
    pub warmup: usize,
    /// Also time the rollback schemes on a Qwen3.6-27B-shaped GDN layer.
    #[arg(long)]
    pub rollback: bool,
    /// Also measure plain decoding with the state trace on (a `0+trace` row, interleaved with
    /// the others; its speed-up against `0` is what tracing costs).
    #[arg(long)]
    pub trace_state: bool,
    #[arg(long)]
    pub json: bool,
}
