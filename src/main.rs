#![forbid(unsafe_code)]
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use deltascope::cli::interrupt::Interrupted;
use deltascope::cli::{Cli, main_with};

fn init_logging(cli: &Cli) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    // A --log-file the user named and that cannot be opened is an error: what they asked to
    // keep would be lost.
    if let Some(path) = &cli.log_file
        && let Err(e) = open_log(path)
    {
        anyhow::bail!("--log-file {}: cannot open it for writing ({e})", path.display());
    }
    // The TUI owns the terminal: its logs go to a file (--log-file, else the data directory's).
    // A default file that cannot be opened is a warning and the next place is tried — the
    // state directory, the temporary directory — never a reason not to start.
    let mut wanted: Vec<PathBuf> = cli.log_file.iter().cloned().collect();
    if cli.is_tui() {
        wanted.extend(deltascope::tui::log_file_candidates());
    }
    let mut failed = vec![];
    let opened = wanted.iter().find_map(|path| match open_log(path) {
        Ok(file) => Some((path.clone(), file)),
        Err(e) => {
            failed.push(format!("{}: {e}", path.display()));
            None
        }
    });
    if !failed.is_empty() {
        let fallback = match (&opened, cli.is_tui()) {
            (Some((path, _)), _) => format!("logging to {}", path.display()),
            (None, true) => "not logging".to_string(),
            (None, false) => "logging to stderr".to_string(),
        };
        let note = format!("cannot open the log file ({}): {fallback}", failed.join("; "));
        if cli.is_tui() {
            deltascope::tui::note_at_start(note);
        } else {
            let _ = writeln!(std::io::stderr(), "warning: {note}");
        }
    }
    match opened {
        Some((_, file)) => {
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

/// Opens (appending) a log file, creating its directory.
fn open_log(path: &Path) -> std::io::Result<std::fs::File> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::OpenOptions::new().create(true).append(true).open(path)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A kernel family this CPU cannot run is refused before anything computes (the engine
    // would otherwise fall back to the best one, and the results would not be the ones asked for).
    if let Some(why) = deltascope::backend::local::cpu_kernel_refusal() {
        let _ = writeln!(std::io::stderr(), "error: {why}");
        return ExitCode::from(2);
    }
    match init_logging(&cli).and_then(|_| main_with(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => exit_for(&e),
    }
}

fn exit_for(e: &anyhow::Error) -> ExitCode {
    // Stopped by a signal after printing what finished: the status says which one.
    if let Some(i) = e.downcast_ref::<Interrupted>() {
        // What the command had left to say (the workbench: what was lost, where a copy went).
        if e.chain().count() > 1 {
            let _ = writeln!(std::io::stderr(), "{e}");
        }
        return ExitCode::from(i.exit_code());
    }
    // The reader went away (`| head -1`): nothing to say, and no one to say it to.
    let broken_pipe =
        e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|io| io.kind() == ErrorKind::BrokenPipe));
    if broken_pipe {
        return ExitCode::SUCCESS;
    }
    // A closed stderr must not turn an error into a panic.
    let _ = writeln!(std::io::stderr(), "error: {}", deltascope::exit::error_text(e));
    ExitCode::FAILURE
}
