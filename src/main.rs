#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::io::{ErrorKind, Write};
use std::process::ExitCode;

use clap::Parser;
use deltascope::cli::interrupt::Interrupted;
use deltascope::cli::{Cli, main_with};

fn init_logging(cli: &Cli) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // The TUI owns the terminal: its logs go to a file in the data dir unless --log-file says
    // otherwise (and nowhere if that cannot be opened).
    let log_file =
        cli.log_file.clone().or_else(|| if cli.is_tui() { deltascope::tui::default_log_file() } else { None });
    match &log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("cannot open log file {}: {e}", path.display()))?;
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(false)
                .with_writer(std::sync::Mutex::new(file))
                .init();
        }
        None if cli.is_tui() => tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::sink).init(),
        None => tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init(),
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match init_logging(&cli).and_then(|_| main_with(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => exit_for(&e),
    }
}

fn exit_for(e: &anyhow::Error) -> ExitCode {
    // Stopped by a signal after printing what finished: the status says which one.
    if let Some(i) = e.downcast_ref::<Interrupted>() {
        return ExitCode::from(i.exit_code());
    }
    // The reader went away (`| head -1`): nothing to say, and no one to say it to.
    let broken_pipe =
        e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == ErrorKind::BrokenPipe));
    if broken_pipe {
        return ExitCode::SUCCESS;
    }
    // A closed stderr must not turn an error into a panic.
    let _ = writeln!(std::io::stderr(), "error: {}", deltascope::error::error_text(e));
    ExitCode::FAILURE
}
