//! The workbench TUI: ratatui over the engine's event stream.
//!
//! Threads: the engine (its own OS thread, [`EngineHandle`]), a terminal-input thread, a
//! model-loading thread at start, and the main thread, which owns the state, executes the
//! app's effects and draws at most one frame per interval (see [`render`]).

pub mod app;
pub mod config;
pub mod event;
pub mod highlight;
pub mod keymap;
pub mod render;
pub mod sliders;
pub mod theme;
pub mod view;

use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use anyhow::Context;

use self::app::{App, AppConfig, Effect, ModelInfo};
use self::event::Inbound;
use self::keymap::Keymap;
use self::render::FrameClock;
use self::sliders::Settings;
use self::theme::Theme;
use crate::chat::RenderOptions;
use crate::chat::session::{Session, default_sessions_dir};
use crate::cli::common::{GenArgs, Loaded, ModelArgs, human_bytes, load_reporting};
use crate::engine::{EngineEvent, EngineHandle, GenerateRequest, GenerationParams, check_prompt};
use crate::model::{LayerKind, LoadProgress};

/// Everything `deltascope chat` (or plain `deltascope`) was asked for.
pub struct TuiOptions {
    pub model: ModelArgs,
    pub generation: GenArgs,
    pub system: Option<String>,
    pub no_think: bool,
    pub theme: Option<String>,
    pub session: Option<PathBuf>,
    pub sessions_dir: Option<PathBuf>,
    pub keymap: Option<PathBuf>,
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
            ratatui::restore();
        }
    }
}

pub fn run(opts: TuiOptions) -> anyhow::Result<()> {
    // Configuration errors are reported before the terminal switches to the TUI.
    let config = match config::default_config_path() {
        Some(p) => config::Config::load(&p)?,
        None => config::Config::default(),
    };
    let theme_name = opts.theme.as_deref().or(config.theme.as_deref()).unwrap_or("dark");
    let theme = Theme::load(theme_name, theme::user_theme_dir().as_deref())?;
    let keymap = match opts.keymap.clone().or_else(keymap::default_keymap_path) {
        Some(p) => Keymap::load(&p)?,
        None => Keymap::default(),
    };
    let sessions_dir = opts.sessions_dir.clone().or(config.sessions_dir).or_else(default_sessions_dir);
    let resumed = match &opts.session {
        Some(p) if p.exists() => Some(Session::load(p)?),
        _ => None,
    };
    let session = resumed.clone().unwrap_or_else(|| Session::new(String::new(), opts.system.clone()));
    let settings = Settings {
        params: GenerationParams::default(),
        enable_thinking: opts.generation.thinking_enabled(opts.no_think),
        preset: opts.generation.preset.as_deref().and_then(crate::engine::Preset::parse),
        has_mtp: false,
    };
    let mut app =
        App::new(AppConfig { theme, keymap, settings, sessions_dir, session_path: opts.session.clone(), session });
    app.loading = Some((0, 1, "reading the checkpoint".into()));

    let (tx, rx) = mpsc::channel::<Inbound>();
    spawn_loader(opts.model.clone(), tx.clone())?;

    let mut terminal = ratatui::try_init().context("cannot switch the terminal to the TUI")?;
    let _guard = TerminalGuard;
    install_panic_hook();
    // SIGINT / SIGTERM / SIGHUP from outside quit like Ctrl+Q: saved, and the terminal restored.
    let signals = tx.clone();
    if let Err(e) = ctrlc::set_handler(move || {
        let _ = signals.send(Inbound::Terminate);
    }) {
        tracing::warn!("cannot handle termination signals: {e}");
    }
    event::spawn_input(tx.clone()).context("cannot start the input thread")?;
    spawn_ticker(tx);
    let fault = Fault::from_env();

    let start = Instant::now();
    let now_ms = || start.elapsed().as_secs_f64() * 1000.0;
    let mut engine: Option<EngineHandle> = None;
    let mut loaded: Option<Box<Loaded>> = None;
    let mut clock = FrameClock::default();
    let mut stdout = std::io::stdout();
    loop {
        let idle = if app.busy() { Duration::from_millis(50) } else { Duration::from_millis(500) };
        let mut batch = vec![];
        match rx.recv_timeout(clock.wait(Instant::now(), idle)) {
            Ok(ev) => batch.push(ev),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        // Everything that is already there goes into this frame.
        while let Ok(ev) = rx.try_recv() {
            batch.push(ev);
        }
        for ev in batch {
            match ev {
                Inbound::Loaded(Ok(l)) => {
                    match l.params_for(&opts, resumed.as_ref()) {
                        Ok((params, thinking)) => {
                            app.settings.params = params;
                            app.settings.enable_thinking = thinking;
                        }
                        Err(e) => app.fatal = Some(format!("{e:#}")),
                    }
                    app.set_model(model_info(&l));
                    engine = Some(EngineHandle::spawn(l.model.clone(), l.tokenizer.clone(), l.name.clone()));
                    loaded = Some(l);
                }
                other => app.update(other, now_ms()),
            }
        }
        if let Some(e) = &engine {
            // Bounded, so a flood of tokens cannot starve the keys.
            for _ in 0..20_000 {
                match e.events.try_recv() {
                    Ok(ev) => app.update(Inbound::Engine(ev), now_ms()),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        if app.generating() {
                            app.on_engine(EngineEvent::Error { message: "the engine thread stopped".into() });
                        }
                        break;
                    }
                }
            }
        }
        for effect in app.take_effects() {
            if let Effect::Copy(text) = &effect {
                // OSC 52: the terminal (or tmux, or the ssh client's terminal) sets its clipboard.
                let copy = ratatui::crossterm::clipboard::CopyToClipboard::to_clipboard_from(text.as_bytes());
                if let Err(err) = ratatui::crossterm::execute!(stdout, copy) {
                    tracing::warn!("copying to the clipboard: {err}");
                }
                continue;
            }
            let (Some(e), Some(l)) = (&engine, &loaded) else { continue };
            match effect {
                Effect::Generate { messages, enable_thinking, params } => {
                    if let Err(err) = start_generation(e, l, &messages, enable_thinking, *params) {
                        app.on_engine(EngineEvent::Error { message: format!("{err:#}") });
                    }
                }
                Effect::Cancel => e.cancel(),
                Effect::SetPaused(p) => e.set_paused(p),
                Effect::Step => e.step(),
                Effect::Copy(_) | Effect::Quit => {}
            }
        }
        if app.quit {
            break;
        }
        if std::mem::take(&mut app.dirty) {
            clock.dirty = true;
        }
        let now = Instant::now();
        if clock.due(now) {
            render::draw(&mut terminal, &app, Some(&mut stdout))?;
            clock.drawn(now);
            if engine.is_some() {
                fault.strike()?;
            }
        }
    }
    // Quitting cancelled a running generation: wait briefly for its `done` (the engine stops
    // within a token) so the saved turn has its finish reason and stats, not an open end.
    if let Some(e) = &engine
        && app.generating()
    {
        e.cancel();
        let deadline = Instant::now() + Duration::from_secs(2);
        while app.generating() {
            match e.events.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(ev) => app.update(Inbound::Engine(ev), now_ms()),
                Err(_) => break,
            }
        }
        app.autosave();
    }
    // Dropping the engine cancels a running generation and joins its thread.
    drop(engine);
    Ok(())
}

fn start_generation(
    e: &EngineHandle,
    l: &Loaded,
    messages: &serde_json::Value,
    enable_thinking: bool,
    params: GenerationParams,
) -> anyhow::Result<()> {
    let opts =
        RenderOptions { add_generation_prompt: true, enable_thinking: Some(enable_thinking), ..Default::default() };
    let text = l.template.render(messages, &opts)?;
    let ids = l.tokenizer.encode(&text)?;
    check_prompt(&l.model, &ids, params.max_tokens)?;
    e.generate(GenerateRequest { prompt_ids: ids, params });
    Ok(())
}

trait StartSettings {
    fn params_for(&self, opts: &TuiOptions, resumed: Option<&Session>) -> anyhow::Result<(GenerationParams, bool)>;
}

impl StartSettings for Loaded {
    /// The sliders' starting values: a resumed session's last settings, else the flags
    /// (resolved exactly like `run`'s).
    fn params_for(&self, opts: &TuiOptions, resumed: Option<&Session>) -> anyhow::Result<(GenerationParams, bool)> {
        if let Some(t) = resumed.and_then(|s| s.turns.iter().rev().find(|t| t.compare_of.is_none())) {
            return Ok((t.params.clone(), t.enable_thinking));
        }
        let params = opts.generation.params(self)?;
        Ok((params, opts.generation.thinking_enabled(opts.no_think)))
    }
}

fn model_info(l: &Loaded) -> ModelInfo {
    let c = &l.model.config;
    let gdn = c.layer_types.iter().filter(|k| matches!(k, LayerKind::LinearAttention)).count();
    ModelInfo {
        name: l.name.clone(),
        backend: "local".into(),
        devices: vec!["cpu".into()],
        weights_bytes: l.model.weight_bytes(),
        has_mtp: l.model.mtp.is_some(),
        layers: format!("{} layers: {gdn} GDN + {} attention", c.layer_types.len(), c.layer_types.len() - gdn),
        context: c.max_position_embeddings,
    }
}

/// Loads the model on its own thread, reporting progress: bytes of tensor data while the
/// weights are read (the long part), then the small files.
fn spawn_loader(args: ModelArgs, tx: Sender<Inbound>) -> anyhow::Result<()> {
    std::thread::Builder::new().name("deltascope-load".into()).spawn(move || {
        let load = || -> anyhow::Result<Loaded> {
            let label = args.source().label();
            let weights_tx = tx.clone();
            let weights = LoadProgress(std::sync::Arc::new(move |read: u64, total: u64| {
                let what = format!("weights of {label}: {} of {}", human_bytes(read), human_bytes(total));
                let _ = weights_tx.send(Inbound::LoadProgress { done: read, total, what });
            }));
            let step = |what: &str| {
                let _ = tx.send(Inbound::LoadProgress { done: 1, total: 1, what: what.into() });
            };
            load_reporting(&args, Some(weights), &step)
        };
        // A checkpoint that makes loading panic gets the same error screen as one that fails.
        let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(load)) {
            Ok(r) => r.map(Box::new).map_err(|e| format!("{e:#}")),
            Err(p) => Err(format!("loading failed: {}", crate::engine::worker::panic_message(p.as_ref()))),
        };
        let _ = tx.send(Inbound::Loaded(result));
    })?;
    Ok(())
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

/// The default log file of the TUI (it owns the terminal, so logs cannot go to stderr).
pub fn default_log_file() -> Option<PathBuf> {
    let dir = dirs::data_dir()?.join("deltascope");
    std::fs::create_dir_all(&dir).ok()?;
    Some(dir.join("deltascope.log"))
}
