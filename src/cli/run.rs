//! `deltascope run`: one generation, headless.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;

use clap::{Args, ValueEnum};

use super::common::{self, GenArgs, ModelArgs, PromptArgs};
use super::interrupt::Interrupt;
use crate::backend::ChatRequest;
use deltascope_protocol::{Diagnostic, DoneEvent, EngineEvent, FinishReason, Fix, Phase, TokenEvent};

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
    pub generation: GenArgs,
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
    let text = match a.prompt_ids {
        Some(_) => common::prompt_text(a.prompt.as_deref(), a.prompt_file.as_deref())?,
        None => Some(common::required_prompt_text(a.prompt.as_deref(), a.prompt_file.as_deref(), true)?),
    };
    let prompt = common::prompt(text.as_deref(), a.prompt_ids.as_deref(), &a.prompt_opts)?;
    let backend = common::open(&a.model)?;
    let overrides = a.generation.overrides()?.without_thinking_if(a.prompt_opts.no_think);
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
    let mut out = std::io::stdout().lock();
    if a.dry_run {
        let d = backend.dry_run(&request)?;
        if a.json {
            let v = serde_json::json!({"template": d.rendered_by, "prompt": d.text, "ids": d.ids, "prompt_tokens": d.ids.as_ref().map(Vec::len)});
            writeln!(out, "{v}")?;
        } else {
            if let Some(t) = &d.text {
                writeln!(out, "--- rendered prompt ({}) ---", d.rendered_by)?;
                writeln!(out, "{t}")?;
            }
            if let Some(ids) = &d.ids {
                writeln!(out, "--- {} token ids ---", ids.len())?;
                writeln!(out, "{}", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","))?;
            }
        }
        return Ok(());
    }

    let interrupt = Interrupt::install()?;
    let generation = backend.start(request)?;
    // Ctrl+C (and SIGTERM / SIGHUP) cancel the generation (within one token, or at once for
    // a server's stream; the output so far and the `done` event are still printed); a second
    // signal exits at once.
    let control = generation.control();
    interrupt.on_signal(move || control.cancel());

    let tty = std::io::stdout().is_terminal();
    let err_tty = std::io::stderr().is_terminal();
    let mut err = std::io::stderr().lock();
    let mut in_thinking = false;
    // With the thinking elsewhere (stderr, or not shown), stdout is the answer alone: the blank
    // line the model writes after `</think>` would only push it down.
    let mut answer_started = a.thinking_to == ThinkingTo::Stdout;
    for ev in generation.events().iter() {
        if a.json {
            writeln!(out, "{}", serde_json::to_string(&ev)?)?;
            out.flush()?;
        }
        match ev {
            EngineEvent::Token(TokenEvent { phase, text, .. }) if !a.json => {
                match (phase, a.thinking_to) {
                    (Phase::Thinking, ThinkingTo::None) => {}
                    (Phase::Thinking, ThinkingTo::Stderr) => write!(err, "{text}")?,
                    (Phase::Thinking, ThinkingTo::Stdout) => {
                        if tty && !in_thinking {
                            write!(out, "\x1b[2m")?;
                        }
                        in_thinking = true;
                        write!(out, "{text}")?;
                    }
                    (Phase::Answer, _) => {
                        if in_thinking {
                            if tty {
                                write!(out, "\x1b[0m")?;
                            }
                            in_thinking = false;
                            // A server's reasoning parser drops the blank line after `</think>`.
                            if !text.starts_with('\n') {
                                writeln!(out)?;
                            }
                        }
                        let text = if answer_started { text.as_str() } else { text.trim_start() };
                        answer_started |= !text.is_empty();
                        write!(out, "{text}")?;
                    }
                }
                out.flush()?;
            }
            EngineEvent::Diagnostic(Diagnostic { kind, message, fix, .. }) if !a.json => {
                let kind = kind.as_str();
                let (on, off) = if err_tty { ("\x1b[1;33m", "\x1b[0m") } else { ("", "") };
                writeln!(err, "\n{on}[{kind}] {message}{off}")?;
                if let Some(flags) = fix.as_ref().and_then(fix_flags) {
                    writeln!(err, "fix: {flags}")?;
                }
            }
            EngineEvent::Done(DoneEvent { finish_reason, usage, timing, .. }) => {
                if !a.json {
                    if in_thinking && tty {
                        write!(out, "\x1b[0m")?;
                    }
                    writeln!(out)?;
                    out.flush()?;
                    // Forced by the thinking budget (bridge, `</think>`): neither
                    // thinking nor answer.
                    let forced = if usage.forced_tokens > 0 {
                        format!(" · forced {}", usage.forced_tokens)
                    } else {
                        String::new()
                    };
                    // "≈": a server that reports no reasoning count, counted one per frame.
                    let approx = if usage.counted.is_estimate() { "≈" } else { "" };
                    // "≈" on the prompt: the server's usage frame never came (the stream was
                    // closed first); counted otherwise (`prompt_estimate` in --json says how).
                    let prompt_approx = if usage.prompt_estimate.is_some() { "≈" } else { "" };
                    writeln!(
                        err,
                        "[finish: {} · prompt {prompt_approx}{} · thinking {approx}{}{forced} · answer {approx}{} tokens · TTFT {} · prefill {:.1} tok/s · decode {:.1} tok/s]",
                        finish_reason.as_str(),
                        usage.prompt_tokens,
                        usage.thinking_tokens,
                        usage.answer_tokens,
                        timing.ttft_ms.map_or_else(|| "-".to_string(), |ms| format!("{ms:.0} ms")),
                        timing.prefill_tok_s,
                        timing.decode_tok_s
                    )?;
                }
                if finish_reason == FinishReason::Error {
                    // What came before was printed; the nonfinite diagnostic said where.
                    out.flush()?;
                    anyhow::bail!(
                        "generation stopped: the model produced NaN or ±Inf (finish reason error; the nonfinite diagnostic names the layer)"
                    );
                }
                if finish_reason == FinishReason::Cancelled {
                    // Cut short: what arrived was printed, and the exit status says which
                    // signal did it.
                    out.flush()?;
                    return Err(interrupt.stopped().into());
                }
                break;
            }
            EngineEvent::Error(e) => {
                anyhow::bail!("{}", e.message);
            }
            _ => {}
        }
    }
    Ok(())
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
