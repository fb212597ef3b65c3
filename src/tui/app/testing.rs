//! What only tests do to the app: close a popup by hand, point saves at a temporary
//! directory, read the replay and save states directly. Built for the crate's own tests and,
//! through the `test-support` feature, for the integration tests; a user's build leaves it out.

use std::path::PathBuf;

use super::{App, Overlay, SessionsDir};

impl App {
    /// Closes the open popup without acting on it.
    pub fn close_overlay(&mut self) {
        self.overlay = Overlay::None;
        self.out.dirty = true;
    }

    /// Whether a saved session is being replayed.
    pub fn replaying(&self) -> bool {
        self.convo.replay.is_some()
    }

    /// Why the conversation is not saved, while it is not.
    pub fn save_error(&self) -> Option<&str> {
        self.convo.save.error.as_deref()
    }

    /// Saves go to `dir` from now on (e.g. a test's temporary directory).
    pub fn set_sessions_dir(&mut self, dir: impl Into<PathBuf>) {
        self.convo.save.dir = SessionsDir::fixed(Some(dir.into()));
    }
}
