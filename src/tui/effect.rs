//! What the runner does for the app: the app and its panels never talk to the backend or the
//! disk themselves, they queue an [`Effect`] and the runner answers with an inbound event.

use std::path::PathBuf;

use crate::backend::Prompt;
use crate::session::Session;
use deltascope_protocol::GenerationParams;

/// What the runner does for the app.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Generate {
        prompt: Prompt,
        params: Box<GenerationParams>,
    },
    /// Render this prompt without generating (the runner answers with `App::show_dry_run`).
    DryRun {
        prompt: Prompt,
        params: Box<GenerationParams>,
    },
    Cancel,
    SetPaused(bool),
    Step,
    /// Force the end of thinking of the generation in flight (the rescue of a loop, by hand).
    EndThinking,
    /// Put this text on the terminal's clipboard.
    Copy(String),
    /// Write this session to `path`, atomically (the runner answers with `Inbound::Saved`;
    /// `path: None`, no sessions directory, is answered with the error).
    Save {
        path: Option<PathBuf>,
        session: Box<Session>,
    },
    /// Write this Markdown transcript to `path` (answered with `Inbound::Exported`).
    Export {
        path: PathBuf,
        markdown: String,
    },
    /// List the saved sessions in this directory (answered with `Inbound::SessionsListed`).
    ListSessions(PathBuf),
    /// Rename (`to: Some(name)`) or delete (`to: None`) the saved session at `path`, then list
    /// its directory again (answered with `Inbound::SessionManaged`).
    ManageSession {
        path: PathBuf,
        to: Option<String>,
    },
    /// Read the session saved at `path`, to continue it or to `replay` it (answered with
    /// `Inbound::SessionLoaded`).
    LoadSession {
        path: PathBuf,
        replay: bool,
    },
    /// Re-score turn `turn` (its request and tokens) with the reference engine (answered with
    /// `Inbound::Rescored`).
    Rescore {
        turn: usize,
        prompt: Prompt,
        params: Box<GenerationParams>,
        tokens: Vec<deltascope_protocol::TokenEvent>,
    },
}
