//! `deltascope run`: one generation, headless.

use std::io::{self, IsTerminal, StderrLock, StdoutLock, Write};
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::common::{self, ModelArgs, PromptArgs};
use super::interrupt::Interrupt;
use super::report::{self, Report};
use crate::backend::ParamOverrides;
use crate::backend::{Backend, ChatRequest, DryRun, Prompt};
use deltascope_protocol::{Diagnostic, EngineEvent, FinishReason, Fix, Phase, Timing, TokenEvent, Usage};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The user message (rendered through the chat template unless --raw); `-` reads it from
    /// standard input, as does leaving out every prompt flag when standard input is piped.
    #[arg(long, value_name = "TEXT", conflicts_with_all = ["prompt_ids", "prompt_file"])]
    pub prompt: Option<String>,
    /// The user message from a file (for prompts longer than a command line can hold).
    #[arg(long, value_name = "FILE", conflicts_with = "prompt_ids")]
    pub prompt_file: Option<PathBuf>,
    /// Prompt token ids, comma-separated (used as is).
    #[arg(long, value_name = "1,2,3")]
    pub prompt_ids: Option<String>,
    #[command(flatten)]
    pub prompt_opts: PromptArgs,
    #[command(flatten)]
    pub generation: ParamOverrides,
    /// Print JSON Lines events instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print the rendered prompt and its token ids, and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// Where the thinking text goes in human output.
    #[arg(long, value_enum, default_value = "stdout")]
    pub thinking_to: ThinkingTo,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ThinkingTo {
    Stdout,
    Stderr,
    None,
}

pub fn run(a: RunArgs) -> anyhow::Result<()> {
    let prompt = read_prompt(&a)?;
    let backend = common::open(&a.model)?;
    let request = request_for(&a, prompt, backend.as_ref())?;
    if a.dry_run {
        return report::emit(&DryRunReport::from(backend.dry_run(&request)?), a.json);
    }
    generate(&a, backend.as_ref(), request)
}

/// The prompt the flags give: text (a flag, a file or standard input) rendered through the
/// template, or token ids used as they are (text beside ids is optional).
fn read_prompt(a: &RunArgs) -> anyhow::Result<Prompt> {
    let text = match a.prompt_ids {
        Some(_) => common::prompt_text(a.prompt.as_deref(), a.prompt_file.as_deref())?,
        None => Some(common::required_prompt_text(a.prompt.as_deref(), a.prompt_file.as_deref(), true)?),
    };
    common::prompt(text.as_deref(), a.prompt_ids.as_deref(), &a.prompt_opts)
}

/// The request the generation flags describe for this backend; what a person should know about
/// it before it runs is said on stderr.
fn request_for(a: &RunArgs, prompt: Prompt, backend: &dyn Backend) -> anyhow::Result<ChatRequest> {
    let overrides = a.generation.checked()?.without_thinking_if(a.prompt_opts.no_think);
    let request = ChatRequest { prompt, params: overrides.resolve(backend.info())? };
    // Human output says which sampling runs when no flag chose it (the JSON start event
    // carries the parameters themselves).
    if let Some(note) = overrides.sampling_note(backend.info()).filter(|_| !a.json) {
        eprintln!("{note}");
    }
    if let Some(b) = request.params.thinking.budget().filter(|&b| b >= request.params.max_tokens) {
        eprintln!(
            "warning: --thinking-budget {b} is not below --max-tokens {}: max_tokens ends generation first, so the budget never forces the end of thinking",
            request.params.max_tokens
        );
    }
    Ok(request)
}

/// `--dry-run`: what would be sent, and stop.
#[derive(Serialize)]
struct DryRunReport {
    template: String,
    prompt: Option<String>,
    ids: Option<Vec<u32>>,
    prompt_tokens: Option<usize>,
}

impl From<DryRun> for DryRunReport {
    fn from(d: DryRun) -> Self {
        let prompt_tokens = d.ids.as_ref().map(Vec::len);
        DryRunReport { template: d.rendered_by, prompt: d.text, ids: d.ids, prompt_tokens }
    }
}

impl Report for DryRunReport {
    fn print_human(&self, out: &mut dyn Write) -> io::Result<()> {
        if let Some(t) = &self.prompt {
            writeln!(out, "--- rendered prompt ({}) ---", self.template)?;
            writeln!(out, "{t}")?;
        }
        if let Some(ids) = &self.ids {
            writeln!(out, "--- {} token ids ---", ids.len())?;
            writeln!(out, "{}", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","))?;
        }
        Ok(())
    }

    /// One line, like the JSON Lines of a generation.
    fn print_json(&self, out: &mut dyn Write) -> io::Result<()> {
        serde_json::to_writer(&mut *out, self)?;
        writeln!(out)
    }
}

/// Runs the generation, streaming its events as they come (text, or JSON Lines with --json).
fn generate(a: &RunArgs, backend: &dyn Backend, request: ChatRequest) -> anyhow::Result<()> {
    let interrupt = Interrupt::install()?;
    let generation = backend.start(request)?;
    // Ctrl+C (and SIGTERM / SIGHUP) cancel the generation (within one token, or at once for
    // a server's stream; the output so far and the `done` event are still printed); a second
    // signal exits at once.
    let control = generation.control();
    interrupt.on_signal(move || control.cancel());
    let mut stream = Stream::new(a.thinking_to);
    for ev in generation.events().iter() {
        if a.json {
            stream.json_line(&ev)?;
        }
        match ev {
            EngineEvent::Token(TokenEvent { phase, text, .. }) if !a.json => stream.token(phase, &text)?,
            EngineEvent::Diagnostic(d) if !a.json => stream.diagnostic(&d)?,
            EngineEvent::Done(d) => {
                if !a.json {
                    stream.finish(&RunFinish { finish_reason: d.finish_reason, usage: &d.usage, timing: &d.timing })?;
                }
                return ended(d.finish_reason, &interrupt);
            }
            EngineEvent::Error(e) => anyhow::bail!("{}", e.message),
            _ => {}
        }
    }
    Ok(())
}

/// The exit of a generation that finished: an error when the model produced a non-finite value
/// or a signal cut it short (what came before was printed either way).
fn ended(finish_reason: FinishReason, interrupt: &Interrupt) -> anyhow::Result<()> {
    match finish_reason {
        // The nonfinite diagnostic said where.
        FinishReason::Error => anyhow::bail!(
            "generation stopped: the model produced NaN or ±Inf (finish reason error; the nonfinite diagnostic names the layer)"
        ),
        // The exit status says which signal did it.
        FinishReason::Cancelled => Err(interrupt.stopped().into()),
        _ => Ok(()),
    }
}

/// The human (or JSON Lines) output of one generation as its events arrive: thinking dimmed on
/// a terminal (or sent to stderr, or dropped), then the answer, diagnostics on stderr.
struct Stream {
    out: StdoutLock<'static>,
    err: StderrLock<'static>,
    thinking_to: ThinkingTo,
    tty: bool,
    err_tty: bool,
    in_thinking: bool,
    /// With the thinking elsewhere (stderr, or not shown), stdout is the answer alone: the
    /// blank line the model writes after `</think>` would only push it down.
    answer_started: bool,
}

impl Stream {
    fn new(thinking_to: ThinkingTo) -> Self {
        Stream {
            tty: io::stdout().is_terminal(),
            err_tty: io::stderr().is_terminal(),
            out: io::stdout().lock(),
            err: io::stderr().lock(),
            thinking_to,
            in_thinking: false,
            answer_started: thinking_to == ThinkingTo::Stdout,
        }
    }

    /// `--json`: every event as one line, flushed at once (a script reads them as they come).
    fn json_line(&mut self, ev: &EngineEvent) -> anyhow::Result<()> {
        writeln!(self.out, "{}", serde_json::to_string(ev)?)?;
        self.out.flush()?;
        Ok(())
    }

    fn token(&mut self, phase: Phase, text: &str) -> io::Result<()> {
        match (phase, self.thinking_to) {
            (Phase::Thinking, ThinkingTo::None) => {}
            (Phase::Thinking, ThinkingTo::Stderr) => write!(self.err, "{text}")?,
            (Phase::Thinking, ThinkingTo::Stdout) => {
                if self.tty && !self.in_thinking {
                    write!(self.out, "\x1b[2m")?;
                }
                self.in_thinking = true;
                write!(self.out, "{text}")?;
            }
            (Phase::Answer, _) => self.answer(text)?,
        }
        self.out.flush()
    }

    fn answer(&mut self, text: &str) -> io::Result<()> {
        if self.in_thinking {
            if self.tty {
                write!(self.out, "\x1b[0m")?;
            }
            self.in_thinking = false;
            // A server's reasoning parser drops the blank line after `</think>`.
            if !text.starts_with('\n') {
                writeln!(self.out)?;
            }
        }
        let text = if self.answer_started { text } else { text.trim_start() };
        self.answer_started |= !text.is_empty();
        write!(self.out, "{text}")
    }

    fn diagnostic(&mut self, d: &Diagnostic) -> io::Result<()> {
        let (on, off) = if self.err_tty { ("\x1b[1;33m", "\x1b[0m") } else { ("", "") };
        writeln!(self.err, "\n{on}[{}] {}{off}", d.kind.as_str(), d.message)?;
        if let Some(flags) = d.fix.as_ref().and_then(fix_flags) {
            writeln!(self.err, "fix: {flags}")?;
        }
        Ok(())
    }

    /// The end of the text on stdout, then the finish line on stderr.
    fn finish(&mut self, finish: &RunFinish) -> io::Result<()> {
        if self.in_thinking && self.tty {
            write!(self.out, "\x1b[0m")?;
        }
        writeln!(self.out)?;
        self.out.flush()?;
        finish.print_human(&mut self.err)
    }
}

/// How a generation ended, in numbers: the human output's last line (with --json, the `done`
/// event carries the same values).
#[derive(Serialize)]
struct RunFinish<'a> {
    finish_reason: FinishReason,
    usage: &'a Usage,
    timing: &'a Timing,
}

impl Report for RunFinish<'_> {
    fn print_human(&self, out: &mut dyn Write) -> io::Result<()> {
        let (usage, timing) = (self.usage, self.timing);
        // Forced by the thinking budget (bridge, `</think>`): neither thinking nor answer.
        let forced =
            if usage.forced_tokens > 0 { format!(" · forced {}", usage.forced_tokens) } else { String::new() };
        // "≈": a server that reports no reasoning count, counted one per frame.
        let approx = if usage.counted.is_estimate() { "≈" } else { "" };
        // "≈" on the prompt: the server's usage frame never came (the stream was closed
        // first); counted otherwise (`prompt_estimate` in --json says how).
        let prompt_approx = if usage.prompt_estimate.is_some() { "≈" } else { "" };
        writeln!(
            out,
            "[finish: {} · prompt {prompt_approx}{} · thinking {approx}{}{forced} · answer {approx}{} tokens · TTFT {} · prefill {:.1} tok/s · decode {:.1} tok/s]",
            self.finish_reason.as_str(),
            usage.prompt_tokens,
            usage.thinking_tokens,
            usage.answer_tokens,
            timing.ttft_ms.map_or_else(|| "-".to_string(), |ms| format!("{ms:.0} ms")),
            timing.prefill_tok_s,
            timing.decode_tok_s
        )
    }
}

/// A diagnostic's fixes as the flags that apply them (`--max-tokens 536`, or
/// `--thinking-budget 12 --max-tokens 97`).
fn fix_flags(fix: &Fix) -> Option<String> {
    let raise = fix.max_tokens.map(|m| format!("--max-tokens {m}"));
    let budget =
        fix.thinking_budget.map(|b| format!("--thinking-budget {} --max-tokens {}", b.thinking_budget, b.max_tokens));
    match (raise, budget) {
        (Some(r), Some(b)) => Some(format!("{r}, or {b}")),
        (r, b) => r.or(b),
    }
}
