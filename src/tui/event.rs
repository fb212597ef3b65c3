//! The one inbound event type of the TUI, and the input thread that feeds it.
//!
//! Terminal input is read on its own small thread (crossterm's `read` blocks), so keys are
//! taken while the engine streams at full speed; the engine's events arrive on the live
//! generation's channel and are wrapped into the same enum by the main loop. The runner's
//! answers to the app's disk effects (saved, exported, listed, loaded) come back as events too.

use std::sync::mpsc::Sender;

use ratatui::crossterm::event::{self, Event as TermEvent};

use std::path::PathBuf;

use crate::backend::Backend;
use crate::backend::local::Loaded;
use crate::session::{Session, SessionInfo};
use crate::verify::rescore::Rescore;
use deltascope_protocol::EngineEvent;

// Events are moved once through a channel; boxing every token event would allocate per token.
#[allow(clippy::large_enum_variant)]
pub enum Inbound {
    /// A key, paste or resize from the terminal.
    Term(TermEvent),
    /// Time passes (replay, loading animation, the live thinking clock).
    Tick,
    Engine(EngineEvent),
    /// Model loading progress: `done` of `total` (bytes of weights, then whole steps), and
    /// what is being loaded.
    LoadProgress {
        done: u64,
        total: u64,
        what: String,
    },
    /// The backend is open (a model loaded, or a server answered), or why not.
    Ready(Result<Box<dyn Backend>, String>),
    /// The reference engine (`--reference`) is loaded, or why it could not be.
    Reference(Result<std::sync::Arc<Loaded>, String>),
    /// A turn re-scored by the reference ([`crate::tui::app::Effect::Rescore`]), or why not.
    Rescored {
        turn: usize,
        result: Result<Box<Rescore>, String>,
    },
    /// SIGINT, SIGTERM or SIGHUP from outside: save and quit, restoring the terminal. (Ctrl+C
    /// typed in the TUI is a key, since raw mode turns off the terminal's own signal keys.)
    Terminate(i32),
    /// The runner wrote the session to `path` (for [`crate::tui::app::Effect::Save`]), or why
    /// not; `Ok(Some(other))`: `path` had changed on disk since it was read, so it was left
    /// alone and the session written to `other`.
    Saved {
        path: Option<PathBuf>,
        result: Result<Option<PathBuf>, String>,
    },
    /// The runner wrote the Markdown transcript ([`crate::tui::app::Effect::Export`]), or why not.
    Exported {
        path: PathBuf,
        result: Result<(), String>,
    },
    /// The saved sessions in the sessions directory ([`crate::tui::app::Effect::ListSessions`]).
    SessionsListed(Vec<SessionInfo>),
    /// A saved session read from `path` ([`crate::tui::app::Effect::LoadSession`]), or why not.
    SessionLoaded {
        path: PathBuf,
        replay: bool,
        result: Result<Box<Session>, String>,
        /// Another window holds the file: who, and the copy this window saves to instead.
        held: Option<(String, PathBuf)>,
    },
    /// A session renamed or deleted from the picker ([`crate::tui::app::Effect::ManageSession`]):
    /// what happened (the renamed file's new path) or why not, and the list again.
    SessionManaged {
        result: Result<(String, Option<PathBuf>), String>,
        items: Vec<SessionInfo>,
    },
}

/// Starts the input thread. It ends when the receiver is gone or the terminal errors.
pub fn spawn_input(tx: Sender<Inbound>) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("deltascope-input".into()).spawn(move || {
        loop {
            match event::read() {
                Ok(ev) => {
                    if tx.send(Inbound::Term(ev)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    tracing::warn!("terminal input ended: {e}");
                    return;
                }
            }
        }
    })
}
