//! `deltascope run`: one generation, headless.

use std::io::{IsTerminal, Write};

use clap::{Args, ValueEnum};

use super::common::{self, GenArgs, ModelArgs, PromptArgs};
use crate::engine::{EngineEvent, EngineHandle, GenerateRequest, Phase, check_prompt};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The user message (rendered through the chat template unless --raw).
    #[arg(long, value_name = "TEXT", conflicts_with = "prompt_ids", required_unless_present = "prompt_ids")]
    pub prompt: Option<String>,
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
    let loaded = common::load(&a.model)?;
    let thinking = a.generation.thinking_enabled(a.prompt_opts.no_think);
    let prompt = common::prompt(&loaded, a.prompt.as_deref(), a.prompt_ids.as_deref(), &a.prompt_opts, thinking)?;
    let mut out = std::io::stdout().lock();
    if a.dry_run {
        if a.json {
            let v = serde_json::json!({"template": loaded.template.source_name, "prompt": prompt.text, "ids": prompt.ids, "prompt_tokens": prompt.ids.len()});
            writeln!(out, "{v}")?;
        } else {
            if let Some(t) = &prompt.text {
                writeln!(
                    out,
                    "--- rendered prompt ({}) ---",
                    if a.prompt_opts.raw { "raw" } else { loaded.template.source_name.as_str() }
                )?;
                writeln!(out, "{t}")?;
            }
            writeln!(out, "--- {} token ids ---", prompt.ids.len())?;
            writeln!(out, "{}", prompt.ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","))?;
        }
        return Ok(());
    }

    let params = a.generation.params(&loaded)?;
    check_prompt(&loaded.model, &prompt.ids, params.max_tokens)?;
    let engine = EngineHandle::spawn(loaded.model.clone(), loaded.tokenizer.clone(), loaded.name.clone());
    // Ctrl+C cancels the generation (within one token; the output so far and the `done` event
    // are still printed); a second Ctrl+C exits at once.
    let control = engine.control();
    let _ = ctrlc::set_handler(move || {
        if control.is_cancelled() {
            std::process::exit(130);
        }
        control.cancel();
    });
    engine.generate(GenerateRequest { prompt_ids: prompt.ids, params });

    let tty = std::io::stdout().is_terminal();
    let err_tty = std::io::stderr().is_terminal();
    let mut err = std::io::stderr().lock();
    let mut in_thinking = false;
    for ev in engine.events.iter() {
        if a.json {
            writeln!(out, "{}", serde_json::to_string(&ev)?)?;
            out.flush()?;
        }
        match ev {
            EngineEvent::Token { phase, text, .. } if !a.json => {
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
                        }
                        write!(out, "{text}")?;
                    }
                }
                out.flush()?;
            }
            EngineEvent::Diagnostic { kind, message, .. } if !a.json => {
                let kind = kind.as_str();
                let (on, off) = if err_tty { ("\x1b[1;33m", "\x1b[0m") } else { ("", "") };
                writeln!(err, "\n{on}[{kind}] {message}{off}")?;
            }
            EngineEvent::Done { finish_reason, usage, timing, .. } => {
                if !a.json {
                    if in_thinking && tty {
                        write!(out, "\x1b[0m")?;
                    }
                    writeln!(out)?;
                    out.flush()?;
                    let forced = if usage.forced_tokens > 0 {
                        format!(" ({} forced)", usage.forced_tokens)
                    } else {
                        String::new()
                    };
                    writeln!(
                        err,
                        "[finish: {} · prompt {} · thinking {}{forced} · answer {} tokens · TTFT {:.0} ms · prefill {:.1} tok/s · decode {:.1} tok/s]",
                        finish_reason.as_str(),
                        usage.prompt_tokens,
                        usage.thinking_tokens,
                        usage.answer_tokens,
                        timing.ttft_ms,
                        timing.prefill_tok_s,
                        timing.decode_tok_s
                    )?;
                }
                break;
            }
            EngineEvent::Error { message } => {
                anyhow::bail!(message);
            }
            _ => {}
        }
    }
    Ok(())
}
