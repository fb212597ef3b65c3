//! The runner: it owns the backend, the live generation and the terminal's output, executes
//! the app's [`Effect`]s and is the only part of the TUI that touches the disk after start
//! (saving, exporting, listing and reading sessions). Every result goes back into the app as an
//! [`Inbound`] event.

use std::path::Path;
use std::sync::Arc;
use std::sync::mpsc::{Sender, TryRecvError};
use std::time::{Duration, Instant};

use super::TuiOptions;
use super::app::{App, Effect};
use super::event::Inbound;
use crate::backend::local::Loaded;
use crate::backend::{Backend, BackendInfo, ChatRequest};
use crate::session::{Session, list_sessions};
use crate::verify::rescore::rescore;
use crate::verify::score::Thresholds;
use deltascope_protocol::{EngineEvent, ErrorKind, Generation, GenerationParams, StepControl};

/// What the runner owns: the backend, the live generation, the reference engine and the
/// terminal's output stream.
pub(crate) struct Runner {
    pub(crate) backend: Option<Box<dyn Backend>>,
    live: Option<Generation>,
    /// The local reference (`--reference`) that re-scores turns.
    reference: Option<Arc<Loaded>>,
    /// Where work done on other threads (a rescore) answers.
    tx: Sender<Inbound>,
    pub(crate) stdout: std::io::Stdout,
}

impl Runner {
    pub(crate) fn new(tx: Sender<Inbound>) -> Runner {
        Runner { backend: None, live: None, reference: None, tx, stdout: std::io::stdout() }
    }

    /// The reference engine is loaded.
    pub(crate) fn reference_opened(&mut self, app: &mut App, r: Arc<Loaded>) {
        app.reference_loaded(Ok(r.name().to_string()));
        self.reference = Some(r);
    }

    pub(crate) fn opened(&mut self, app: &mut App, b: Box<dyn Backend>, opts: &TuiOptions, resumed: Option<&Session>) {
        match starting_settings(b.info(), opts, resumed) {
            Ok(params) => app.change_settings(|s| s.params = params),
            Err(e) => app.fail(crate::exit::error_text(&e)),
        }
        app.set_model(b.info().clone());
        self.backend = Some(b);
    }

    /// Moves the live generation's events into the app.
    pub(crate) fn pump(&mut self, app: &mut App, now_ms: f64) {
        if let Some(g) = &self.live {
            pump(app, g, now_ms);
            if !app.generating() {
                self.live = None;
            }
        }
    }

    pub(crate) fn run_effects(&mut self, app: &mut App) {
        for effect in app.take_effects() {
            match effect {
                Effect::Generate { prompt, params } => {
                    let Some(b) = &self.backend else { continue };
                    let request = ChatRequest { prompt, params: *params };
                    // Step mode switched on before sending holds the new generation too.
                    let control = Arc::new(StepControl::default());
                    control.set_paused(app.view().step_mode);
                    match b.start_with(request, control) {
                        Ok(g) => self.live = Some(g),
                        Err(err) => app.on_engine(EngineEvent::error(err.kind, err.message)),
                    }
                }
                Effect::DryRun { prompt, params } => {
                    let Some(b) = &self.backend else { continue };
                    let request = ChatRequest { prompt, params: *params };
                    app.show_dry_run(b.dry_run(&request).map_err(|e| e.message));
                }
                Effect::Rescore { turn, prompt, params, tokens } => {
                    let request = ChatRequest { prompt, params: *params };
                    let (Some(reference), Some(b)) = (self.reference.clone(), &self.backend) else {
                        let result = Err("the reference or the backend is not open".to_string());
                        app.update(Inbound::Rescored { turn, result }, app.now_ms());
                        continue;
                    };
                    // The subject's own rendering of the prompt (a quick request to a server)
                    // here; the teacher-forced pass, seconds to minutes, on its own thread.
                    let theirs = b.prompt_tokens(&request).map_err(|e| e.message);
                    let subject = b.info().identity.clone();
                    let tx = self.tx.clone();
                    let spawned = std::thread::Builder::new().name("deltascope-rescore".into()).spawn(move || {
                        let result = rescore(&reference, &subject, theirs, &request, &tokens, &Thresholds::default())
                            .map(Box::new)
                            .map_err(|e| e.to_string());
                        let _ = tx.send(Inbound::Rescored { turn, result });
                    });
                    if let Err(e) = spawned {
                        app.update(Inbound::Rescored { turn, result: Err(e.to_string()) }, app.now_ms());
                    }
                }
                Effect::Cancel => self.live.iter().for_each(Generation::cancel),
                Effect::SetPaused(p) => self.live.iter().for_each(|g| g.set_paused(p)),
                Effect::Step => self.live.iter().for_each(Generation::step),
                Effect::EndThinking => self.live.iter().for_each(Generation::end_thinking),
                disk @ (Effect::Save { .. }
                | Effect::Export { .. }
                | Effect::ListSessions(_)
                | Effect::ManageSession { .. }
                | Effect::LoadSession { .. }) => {
                    if let Ok(answer) = disk_io(disk) {
                        app.update(answer, app.now_ms());
                    }
                }
                Effect::Copy(text) => {
                    // OSC 52: the terminal (or tmux, or the ssh client's terminal) sets its clipboard.
                    let copy = ratatui::crossterm::clipboard::CopyToClipboard::to_clipboard_from(text.as_bytes());
                    if let Err(err) = ratatui::crossterm::execute!(self.stdout, copy) {
                        tracing::warn!("copying to the clipboard: {err}");
                    }
                }
            }
        }
    }

    /// Quitting cancelled a running generation: wait briefly for its `done` (the engine stops
    /// within a token, a server stream at once) so the saved turn has its finish reason and
    /// stats, not an open end. Then the last save.
    /// `unasked`: the program is ending without asking the user (a signal, a lost terminal).
    pub(crate) fn shutdown(mut self, app: &mut App, unasked: bool, now_ms: impl Fn() -> f64) {
        if let Some(g) = &self.live
            && app.generating()
        {
            g.cancel();
            let deadline = Instant::now() + Duration::from_secs(2);
            while app.generating() {
                match g.events().recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(ev) => app.update(Inbound::Engine(ev), now_ms()),
                    Err(_) => break,
                }
            }
        }
        app.take_effects();
        app.save_now();
        for effect in app.take_effects() {
            if let Ok(answer) = disk_io(effect) {
                app.update(answer, now_ms());
            }
        }
        // Ending without asking (a signal, a lost terminal) with the save failed: a copy goes
        // to the first folder that takes it, and the loss report names it.
        if unasked && let Some((dirs, session)) = app.rescue_plan() {
            let name = session.file_name();
            for dir in dirs {
                let path = dir.join(&name);
                let written = std::fs::create_dir_all(&dir)
                    .map_err(|e| e.to_string())
                    .and_then(|()| session.save_atomic(&path).map_err(|e| e.to_string()));
                match written {
                    Ok(crate::session::Saved::Diverted(to)) => {
                        app.rescued(to);
                        break;
                    }
                    Ok(_) => {
                        app.rescued(path);
                        break;
                    }
                    Err(e) => tracing::warn!("rescue copy in {}: {e}", dir.display()),
                }
            }
        }
        // Dropping the backend stops its engine thread (or its server connections).
        self.live = None;
        self.backend = None;
    }
}

/// Moves the live generation's events into the app (bounded, so a flood of tokens cannot
/// starve the keys).
fn pump(app: &mut App, g: &Generation, now_ms: f64) {
    for _ in 0..20_000 {
        match g.events().try_recv() {
            Ok(ev) => app.update(Inbound::Engine(ev), now_ms),
            Err(TryRecvError::Empty) => break,
            Err(TryRecvError::Disconnected) => {
                if app.generating() {
                    app.on_engine(EngineEvent::error(
                        ErrorKind::Internal,
                        "the generation stopped without a done event",
                    ));
                }
                break;
            }
        }
    }
}

/// The sliders' starting values: a resumed session's last settings, else the flags (resolved
/// exactly like `run`'s).
fn starting_settings(
    info: &BackendInfo,
    opts: &TuiOptions,
    resumed: Option<&Session>,
) -> anyhow::Result<GenerationParams> {
    if let Some(t) = resumed.and_then(|s| s.turns.iter().rev().find(|t| t.compare_of.is_none())) {
        return Ok(t.params.clone());
    }
    Ok(opts.generation.clone().without_thinking_if(opts.no_think).resolve(info)?)
}

/// Does one disk effect and returns the app's answer to it; any other effect comes back
/// unchanged. Sessions are written atomically ([`Session::save_atomic`]).
pub fn disk_io(effect: Effect) -> Result<Inbound, Effect> {
    Ok(match effect {
        Effect::Save { path, session } => {
            let result = match &path {
                Some(path) => session
                    .save_atomic(path)
                    .map(|saved| match saved {
                        crate::session::Saved::Diverted(to) => Some(to),
                        _ => None,
                    })
                    .map_err(|e| {
                        tracing::warn!("{e}");
                        e.to_string()
                    }),
                None => Err("no sessions directory: this conversation is not saved".to_string()),
            };
            Inbound::Saved { path, result }
        }
        Effect::Export { path, markdown } => {
            let result = write_creating_dir(&path, &markdown).map_err(|e| e.to_string());
            Inbound::Exported { path, result }
        }
        Effect::ListSessions(dir) => Inbound::SessionsListed(list_sessions(&dir)),
        Effect::ManageSession { path, to } => {
            let result = match to {
                Some(name) => crate::session::rename_session(&path, &name)
                    .map(|new| (format!("renamed to {}", new.display()), Some(new))),
                None => crate::session::delete_session(&path).map(|()| (format!("deleted {}", path.display()), None)),
            };
            let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
            Inbound::SessionManaged { result, items: list_sessions(&dir) }
        }
        Effect::LoadSession { path, replay } => {
            let result = Session::load(&path).map(Box::new).map_err(|e| e.to_string());
            // A replay writes nothing; a session opened to continue is claimed.
            let held = match (&result, replay) {
                (Ok(_), false) => crate::session::guard::claim(&path)
                    .err()
                    .map(|holder| (holder, crate::session::guard::copy_path(&path, "copy"))),
                _ => None,
            };
            Inbound::SessionLoaded { path, replay, result, held }
        }
        other => return Err(other),
    })
}

/// Writes `text` to `path`, creating its directory.
fn write_creating_dir(path: &Path, text: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(path, text)
}
