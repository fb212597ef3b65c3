//! The workbench TUI: ratatui over the engine's event stream.
//!
//! Threads: the backend's (the engine's OS thread, or a server stream's), a terminal-input
//! thread, a thread that opens the backend at start (loading a model, or asking a server what
//! it is), and the main thread, which owns the state, executes the app's effects and draws at
//! most one frame per interval (see [`render`]). The TUI talks to the backend only through
//! [`crate::backend`]: one [`Generation`] per request.

#![forbid(unsafe_code)]

pub mod app;
pub mod config;
pub mod effect;
pub mod event;
pub mod highlight;
pub mod keymap;
pub mod log;
pub mod panel;
pub mod panels;
/// The sliders' settings (`tui::sliders::Settings`) where they always were.
pub use self::panels::sliders;
pub mod popup;
pub mod render;
pub mod runner;
pub mod screen;
pub mod theme;
pub mod view;
pub mod wrap;

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use anyhow::Context;
use ratatui::DefaultTerminal;
use ratatui::crossterm::event::{DisableBracketedPaste, EnableBracketedPaste};

use self::app::{App, AppConfig, SessionsDir};
use self::event::Inbound;
use self::keymap::Keymap;
use self::panels::sliders::Settings;
use self::render::FrameClock;
use self::runner::Runner;
use self::theme::Theme;
use crate::backend::local::{Loaded, LocalSpec};
use crate::backend::{self, BackendSpec, OpenProgress, ParamOverrides, Support};
use crate::session::{Session, default_sessions_dir};
use deltascope_model::panic_message;
use deltascope_protocol::GenerationParams;
use deltascope_protocol::{Preset, Thinking};

/// Everything `deltascope chat` (or plain `deltascope`) was asked for.
pub struct TuiOptions {
    /// The model to load, or the server to attach to.
    pub backend: BackendSpec,
    /// The sliders' starting values, as flags gave them.
    pub generation: ParamOverrides,
    pub system: Option<String>,
    pub no_think: bool,
    pub theme: Option<String>,
    pub session: Option<PathBuf>,
    pub sessions_dir: Option<PathBuf>,
    pub keymap: Option<PathBuf>,
    /// A local reference engine (`--reference`) that re-scores turns, and what to call it
    /// while it loads.
    pub reference: Option<(LocalSpec, String)>,
}

/// Installs a panic hook over the one `ratatui::try_init` set (which restores the terminal and
/// then reports). A panic on the main thread goes through it; one on a helper thread must not
/// tear the terminal out from under a TUI that is still running, so it is only logged: the
/// engine turns it into an error event and the loader into a load error.
fn install_panic_hook() {
    let restore_and_report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        tracing::error!("panic on thread {}: {info}", thread.name().unwrap_or("unnamed"));
        if thread.name() == Some("main") {
            let _ = ratatui::crossterm::execute!(std::io::stdout(), DisableBracketedPaste);
            restore_and_report(info);
        }
    }));
}

/// Fault injection for the end-to-end test of terminal restoration: with
/// `DELTASCOPE_FAULT=panic` (or `error`) the main loop panics (or fails) right after it draws
/// the first frame with the model loaded.
enum Fault {
    None,
    Panic,
    Error,
}

impl Fault {
    fn from_env() -> Self {
        match std::env::var("DELTASCOPE_FAULT").as_deref() {
            Ok("panic") => Fault::Panic,
            Ok("error") => Fault::Error,
            _ => Fault::None,
        }
    }

    fn strike(&self) -> anyhow::Result<()> {
        match self {
            Fault::None => Ok(()),
            Fault::Panic => panic!("injected panic (DELTASCOPE_FAULT=panic)"),
            Fault::Error => anyhow::bail!("injected error (DELTASCOPE_FAULT=error)"),
        }
    }
}

/// Restores the terminal when dropped (normal exit and errors; panics are covered by the
/// hook that `ratatui::try_init` installs, which restores before printing).
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        // While unwinding from a panic the hook has already restored (and printed below the
        // TUI); leaving the alternate screen twice would move the cursor back over that message.
        if !std::thread::panicking() {
            // Errors are ignored: a terminal that is gone cannot be restored, and that is fine.
            let _ = ratatui::crossterm::execute!(std::io::stdout(), DisableBracketedPaste);
            ratatui::restore();
        }
    }
}

pub fn run(opts: TuiOptions) -> anyhow::Result<()> {
    // Configuration errors are reported before the terminal switches to the TUI.
    let (mut app, resumed) = start_app(&opts)?;
    let (tx, rx) = mpsc::channel::<Inbound>();
    spawn_loaders(&opts, &mut app, &tx)?;

    let mut terminal = ratatui::try_init().context("cannot switch the terminal to the TUI")?;
    let guard = TerminalGuard;
    install_panic_hook();
    enable_bracketed_paste();
    spawn_event_sources(&tx)?;
    let mut screen = Screen {
        terminal: &mut terminal,
        view: view::View::default(),
        clock: FrameClock::default(),
        fault: Fault::from_env(),
    };

    let start = Instant::now();
    let now_ms = || start.elapsed().as_secs_f64() * 1000.0;
    let mut runner = Runner::new(tx.clone());
    let ended = event_loop(&mut screen, &mut app, &mut runner, &rx, &opts, resumed.as_ref(), now_ms)?;
    let unasked = ended == TerminalState::Gone || app.stopped_by().is_some();
    runner.shutdown(&mut app, unasked, now_ms);
    report(&mut app, guard)
}

/// The app as the flags, the configuration and the session file set it up, and the session
/// it resumes, if any.
fn start_app(opts: &TuiOptions) -> anyhow::Result<(App, Option<Session>)> {
    let config = match config::default_config_path() {
        Some(p) => config::Config::load(&p)?,
        None => config::Config::default(),
    };
    let (theme, keymap) = theme_and_keymap(opts, &config)?;
    // A directory that cannot be written falls back (and the first screen says so).
    let sessions_dir =
        SessionsDir::choose(opts.sessions_dir.clone().or(config.sessions_dir).or_else(default_sessions_dir));
    let resumed = match &opts.session {
        Some(p) if p.exists() => Some(Session::load(p)?),
        _ => None,
    };
    let session = resumed.clone().unwrap_or_else(|| Session::new(String::new(), opts.system.clone()));
    let (session_path, held) = claim_session(opts.session.as_ref());
    let settings = Settings {
        params: GenerationParams::default(),
        resume_thinking: Thinking::Unlimited,
        preset: opts.generation.preset.map(Preset::from),
        mtp: Support::Yes,
        context: None,
    };
    let mut app = App::new(AppConfig { theme, keymap, settings, sessions_dir, session_path, session });
    app.update(Inbound::LoadProgress { done: 0, total: 1, what: opening_message(&opts.backend) }, 0.0);
    for note in START_NOTES.lock().map(|mut n| std::mem::take(&mut *n)).unwrap_or_default() {
        app.say(app::Level::Warning, note);
    }
    if let Some(HeldElsewhere { file, holder, copy }) = held {
        app.held_elsewhere(file, holder, copy);
    }
    Ok((app, resumed))
}

/// The theme (the flag's, else the configuration's, else dark) and the keymap.
fn theme_and_keymap(opts: &TuiOptions, config: &config::Config) -> anyhow::Result<(Theme, Keymap)> {
    let theme_name = opts.theme.as_deref().or(config.theme.as_deref()).unwrap_or("dark");
    let theme = Theme::load(theme_name, theme::user_theme_dir().as_deref())?;
    // A keymap named on the command line must exist; the one in the config directory may not.
    let keymap = match (&opts.keymap, keymap::default_keymap_path()) {
        (Some(p), _) => Keymap::load_named(p)?,
        (None, Some(p)) => Keymap::load(&p)?,
        (None, None) => Keymap::default(),
    };
    Ok((theme, keymap))
}

/// A session file another window holds, who holds it, and the copy this window saves to.
struct HeldElsewhere {
    file: PathBuf,
    holder: String,
    copy: PathBuf,
}

/// Where this window saves the session named by `--session`, if any. Another window holding
/// that file: this one saves to a copy, and both keep their turns.
fn claim_session(session: Option<&PathBuf>) -> (Option<PathBuf>, Option<HeldElsewhere>) {
    let Some(p) = session else { return (None, None) };
    match crate::session::guard::claim(p) {
        Ok(()) => (Some(p.clone()), None),
        Err(holder) => {
            let copy = crate::session::guard::copy_path(p, "copy");
            (Some(copy.clone()), Some(HeldElsewhere { file: p.clone(), holder, copy }))
        }
    }
}

/// Starts opening the backend and, with `--reference`, loading the reference, each on its own
/// thread.
fn spawn_loaders(opts: &TuiOptions, app: &mut App, tx: &Sender<Inbound>) -> anyhow::Result<()> {
    spawn_opener(opts.backend.clone(), tx.clone())?;
    if let Some((spec, what)) = &opts.reference {
        app.expect_reference(what.clone());
        spawn_reference(spec.clone(), tx.clone())?;
    }
    Ok(())
}

/// A paste arrives as one event (its line breaks kept), never as keys that would send it.
fn enable_bracketed_paste() {
    if let Err(e) = ratatui::crossterm::execute!(std::io::stdout(), EnableBracketedPaste) {
        tracing::warn!("bracketed paste is not available: {e}");
    }
}

/// Starts the threads that feed the loop besides the loaders: signals, terminal input, ticks.
fn spawn_event_sources(tx: &Sender<Inbound>) -> anyhow::Result<()> {
    // SIGINT / SIGTERM / SIGHUP from outside save and quit, restoring the terminal; the exit
    // status names the signal (130 / 143 / 129), as the headless commands' does.
    spawn_signals(tx.clone());
    event::spawn_input(tx.clone()).context("cannot start the input thread")?;
    spawn_ticker(tx.clone());
    Ok(())
}

/// Whether the terminal can still be drawn on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TerminalState {
    Present,
    /// Its window closed, or an ssh connection dropped.
    Gone,
}

/// The terminal the loop draws on, and when it draws.
struct Screen<'t> {
    terminal: &'t mut DefaultTerminal,
    view: view::View,
    clock: FrameClock,
    fault: Fault,
}

impl Screen<'_> {
    /// Draws a frame of `app` if one is due.
    fn draw_if_due(&mut self, app: &mut App, runner: &mut Runner) -> anyhow::Result<TerminalState> {
        let now = Instant::now();
        if !self.clock.due(now) {
            return Ok(TerminalState::Present);
        }
        match render::draw(self.terminal, app, &mut self.view, Some(&mut runner.stdout)) {
            Ok(layout) => app.laid_out(layout),
            Err(e) => {
                tracing::warn!("the terminal is gone ({e}): saving and quitting");
                return Ok(TerminalState::Gone);
            }
        }
        self.clock.drawn(now);
        if runner.backend.is_some() {
            self.fault.strike()?;
        }
        Ok(TerminalState::Present)
    }
}

/// Hands the events to the app and the runner and draws, until the app quits or the terminal
/// is gone (which cannot be drawn on: the caller saves and leaves as for a signal).
fn event_loop(
    screen: &mut Screen,
    app: &mut App,
    runner: &mut Runner,
    rx: &Receiver<Inbound>,
    opts: &TuiOptions,
    resumed: Option<&Session>,
    now_ms: impl Fn() -> f64,
) -> anyhow::Result<TerminalState> {
    loop {
        let idle = if app.busy() { Duration::from_millis(50) } else { Duration::from_millis(500) };
        let Some(batch) = next_batch(rx, screen.clock.wait(Instant::now(), idle)) else {
            return Ok(TerminalState::Present);
        };
        for ev in batch {
            match ev {
                Inbound::Ready(Ok(b)) => runner.opened(app, b, opts, resumed),
                Inbound::Reference(Ok(r)) => runner.reference_opened(app, r),
                other => app.update(other, now_ms()),
            }
        }
        runner.pump(app, now_ms());
        runner.run_effects(app);
        if app.quitting() {
            return Ok(TerminalState::Present);
        }
        if app.take_redraw() {
            screen.clock.dirty = true;
        }
        if screen.draw_if_due(app, runner)? == TerminalState::Gone {
            return Ok(TerminalState::Gone);
        }
    }
}

/// The events that came within `wait`, or `None` once nothing can send any more.
fn next_batch(rx: &Receiver<Inbound>, wait: Duration) -> Option<Vec<Inbound>> {
    let mut batch = vec![];
    match rx.recv_timeout(wait) {
        Ok(ev) => batch.push(ev),
        Err(RecvTimeoutError::Timeout) => {}
        Err(RecvTimeoutError::Disconnected) => return None,
    }
    // Everything that is already there goes into this frame.
    while let Ok(ev) = rx.try_recv() {
        batch.push(ev);
    }
    Some(batch)
}

/// Once the loop is over: the error that says why the workbench stopped, if it did not stop
/// because it was asked to, so that the exit status says so.
fn report(app: &mut App, guard: TerminalGuard) -> anyhow::Result<()> {
    // Stopped by a signal: what was lost (if anything) and where its copy went are said once
    // the terminal is back (`main` prints the context), and the status names the signal.
    if let Some(signal) = app.stopped_by() {
        let stopped = anyhow::Error::new(crate::exit::Interrupted::new(signal));
        return Err(match app.loss_report().or_else(|| app.copy_report()) {
            Some(said) => stopped.context(said),
            None => stopped,
        });
    }
    // What stopped the workbench from working (a model that failed to load) is said again
    // once the terminal is back, where it stays readable, and the exit status says so.
    match (app.take_fatal(), app.loss_report()) {
        (Some(fatal), Some(loss)) => anyhow::bail!("{fatal}\n{loss}"),
        (Some(fatal), None) => anyhow::bail!("{fatal}"),
        (None, Some(loss)) => anyhow::bail!("{loss}"),
        (None, None) => {
            // Once the terminal is back: where the conversation went, when another window
            // held its file.
            drop(guard);
            if let Some(note) = app.copy_report() {
                eprintln!("{note}");
            }
            Ok(())
        }
    }
}

fn opening_message(spec: &BackendSpec) -> String {
    match spec {
        BackendSpec::Local(_) => "reading the checkpoint".into(),
        BackendSpec::Remote(r) => format!("asking {} what it serves", r.url),
    }
}

/// Opens the backend on its own thread, reporting progress: bytes of tensor data while
/// weights are read (the long part), then the small files; or the server's answers.
fn spawn_opener(spec: BackendSpec, tx: Sender<Inbound>) -> anyhow::Result<()> {
    std::thread::Builder::new().name("deltascope-load".into()).spawn(move || {
        let progress = |p: OpenProgress| {
            let _ = tx.send(Inbound::LoadProgress { done: p.done, total: p.total, what: p.what });
        };
        // A checkpoint that makes loading panic gets the same error screen as one that fails.
        let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| backend::open(&spec, &progress))) {
            Ok(r) => r.map_err(|e| e.message),
            Err(p) => Err(format!("loading failed: {}", panic_message(p.as_ref()))),
        };
        let _ = tx.send(Inbound::Ready(result));
    })?;
    Ok(())
}

/// Loads the reference engine (`--reference`, on the CPU) on its own thread.
fn spawn_reference(spec: LocalSpec, tx: Sender<Inbound>) -> anyhow::Result<()> {
    std::thread::Builder::new().name("deltascope-reference".into()).spawn(move || {
        let result = match std::panic::catch_unwind(|| Loaded::load(&spec, &|_: OpenProgress| {})) {
            Ok(r) => r.map(std::sync::Arc::new).map_err(|e| e.to_string()),
            Err(p) => Err(format!("loading failed: {}", panic_message(p.as_ref()))),
        };
        let _ = tx.send(Inbound::Reference(result));
    })?;
    Ok(())
}

/// SIGINT / SIGTERM / SIGHUP as [`Inbound::Terminate`] with the signal's number.
fn spawn_signals(tx: Sender<Inbound>) {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    match signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) {
        Ok(mut signals) => {
            let _ = std::thread::Builder::new().name("deltascope-signals".into()).spawn(move || {
                for sig in signals.forever() {
                    if tx.send(Inbound::Terminate(sig)).is_err() {
                        break;
                    }
                }
            });
        }
        Err(e) => tracing::warn!("cannot handle termination signals: {e}"),
    }
}

/// Ticks for replay timing and the status line's expiry (25 Hz; the main loop also wakes for
/// every event, and a tick only causes a draw when something is running).
fn spawn_ticker(tx: Sender<Inbound>) {
    let _ = std::thread::Builder::new().name("deltascope-tick".into()).spawn(move || {
        while tx.send(Inbound::Tick).is_ok() {
            std::thread::sleep(Duration::from_millis(40));
        }
    });
}

/// Where the TUI logs (it owns the terminal, so logs cannot go to stderr), in order of
/// preference: the data directory, the state directory, the temporary directory. The first
/// that can be opened is used; a read-only or missing one is not a reason not to start.
pub fn log_file_candidates() -> Vec<PathBuf> {
    let under = |d: Option<PathBuf>| d.map(|d| d.join("deltascope").join("deltascope.log"));
    [under(dirs::data_dir()), under(dirs::state_dir()), Some(std::env::temp_dir().join("deltascope.log"))]
        .into_iter()
        .flatten()
        .collect()
}

/// Warnings from before the TUI started (a log file that could not be opened): the first
/// screen shows them in the message log.
static START_NOTES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Adds a warning for the TUI's first screen.
pub fn note_at_start(text: impl Into<String>) {
    if let Ok(mut notes) = START_NOTES.lock() {
        notes.push(text.into());
    }
}
