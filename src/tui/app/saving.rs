//! Where the conversation is saved, whether the last save worked, and what is not saved yet.
//! The app decides when to save (after each turn, on quit); the runner does the disk I/O
//! ([`super::Effect::Save`]) and answers with [`crate::tui::event::Inbound::Saved`], so the
//! app never touches the disk.

use std::path::{Path, PathBuf};

use crate::session::Session;

/// The sessions directory in use, and why it is not the one asked for (when it is a fallback).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SessionsDir {
    pub path: Option<PathBuf>,
    /// Set when the wanted directory could not be used: what went wrong and where sessions go
    /// instead. Shown on the first screen and in the status bar.
    pub fallback: Option<String>,
}

impl SessionsDir {
    /// Just this directory, unchecked (tests, or no saving at all with `None`).
    pub fn fixed(path: Option<PathBuf>) -> SessionsDir {
        SessionsDir { path, fallback: None }
    }

    /// Checks `wanted` (exists or can be created, and a file can be written in it); when it
    /// cannot be used, tries `$XDG_STATE_HOME/deltascope/sessions` (or the platform's state
    /// directory), then the temp dir.
    pub fn choose(wanted: Option<PathBuf>) -> SessionsDir {
        let Some(wanted) = wanted else { return SessionsDir::fixed(None) };
        let why = match check_writable(&wanted) {
            Ok(()) => return SessionsDir::fixed(Some(wanted)),
            Err(e) => e,
        };
        let candidates = [
            std::env::var_os("XDG_STATE_HOME").map(PathBuf::from).or_else(dirs::state_dir),
            Some(std::env::temp_dir()),
        ];
        for base in candidates.into_iter().flatten() {
            let dir = base.join("deltascope").join("sessions");
            if dir != wanted && check_writable(&dir).is_ok() {
                let fallback = Some(format!(
                    "sessions cannot be saved in {}: {why}; saving to {} instead",
                    wanted.display(),
                    dir.display()
                ));
                return SessionsDir { path: Some(dir), fallback };
            }
        }
        SessionsDir {
            path: None,
            fallback: Some(format!(
                "sessions cannot be saved in {}: {why}, nor in the state or temp directory: this conversation is not saved",
                wanted.display()
            )),
        }
    }
}

/// Creates `dir` if needed and writes (then removes) a probe file in it.
pub fn check_writable(dir: &Path) -> Result<(), String> {
    if dir.exists() && !dir.is_dir() {
        return Err("it is not a directory".into());
    }
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create it ({e})"))?;
    let probe = dir.join(format!(".deltascope-probe-{}", std::process::id()));
    std::fs::write(&probe, b"probe").map_err(|e| format!("cannot write in it ({e})"))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[derive(Debug, Default)]
pub struct SaveState {
    pub dir: SessionsDir,
    /// The file this session is saved to (`--session FILE`, an opened session, or a path
    /// given after a failed save); default `dir/ID.json`.
    pub path: Option<PathBuf>,
    /// Turns changed since the last good save (opening a session and quitting writes nothing).
    pub unsaved: bool,
    /// The last failed save, until a save works. Shown until then.
    pub error: Option<String>,
    /// Where the last good copy was written.
    pub last_good: Option<PathBuf>,
    /// Where a rescue copy went when the program ended without asking (a signal, a lost
    /// terminal) after the save itself failed.
    pub rescued: Option<PathBuf>,
    /// The file another deltascope window holds, and who: this window saves to `path` (a copy
    /// beside it) instead. Stays on the status line, and quitting says where the copy is.
    pub held_elsewhere: Option<(PathBuf, String)>,
}

impl SaveState {
    /// The file a save goes to.
    pub fn file(&self, session: &Session) -> Option<PathBuf> {
        self.path.clone().or_else(|| self.dir.path.as_ref().map(|d| d.join(session.file_name())))
    }

    /// Whether a turn changed since the last good save (an empty conversation is never
    /// written).
    pub fn due(&self, session: &Session) -> bool {
        self.unsaved && !(session.turns.is_empty() && session.branches.is_empty())
    }

    /// What the runner's write came to (`path: None`: there was nowhere to write). A save
    /// diverted to a conflict file goes on there: `Ok(Some(why))` says so.
    pub fn written(
        &mut self,
        path: Option<PathBuf>,
        result: Result<Option<PathBuf>, String>,
    ) -> Result<Option<String>, String> {
        match result {
            Ok(diverted) => {
                self.unsaved = false;
                self.error = None;
                let note = diverted.as_ref().map(|to| {
                    format!(
                        "{} changed on disk since this window read it (another window saved there?): left as it is; this conversation is saved to {} from now on",
                        path.as_deref().map_or_else(String::new, |p| p.display().to_string()),
                        to.display()
                    )
                });
                if let Some(to) = diverted {
                    self.path = Some(to.clone());
                    self.last_good = Some(to);
                } else {
                    self.last_good = path;
                }
                Ok(note)
            }
            Err(msg) => {
                self.error = Some(msg.clone());
                Err(msg)
            }
        }
    }

    /// Said on the terminal when the workbench ends: where this conversation went, when another
    /// window held the file it was opened with.
    pub fn copy_report(&self) -> Option<String> {
        let (file, holder) = self.held_elsewhere.as_ref()?;
        let copy = self.last_good.as_ref()?;
        Some(format!(
            "this conversation was saved to {} ({} is open in another deltascope window, {holder})",
            copy.display(),
            file.display()
        ))
    }

    /// Where to write a rescue copy when the save failed and the program is ending without
    /// asking: the session's own folder, the data directory, the state directory, then the
    /// temporary directory (each once, in that order).
    pub fn rescue_dirs(&self, session: &Session) -> Vec<PathBuf> {
        let own = self.file(session).and_then(|f| f.parent().map(Path::to_path_buf)).or_else(|| self.dir.path.clone());
        let state = std::env::var_os("XDG_STATE_HOME").map(PathBuf::from).or_else(dirs::state_dir);
        let under = |base: Option<PathBuf>| base.map(|b| b.join("deltascope").join("sessions"));
        let mut dirs = vec![];
        for d in [own, crate::session::default_sessions_dir(), under(state), under(Some(std::env::temp_dir()))]
            .into_iter()
            .flatten()
        {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
        dirs
    }

    /// What is lost if the program ends now, and where a rescue copy went (printed after the
    /// terminal is restored).
    pub fn loss_report(&self, session: &Session) -> Option<String> {
        if !self.unsaved || session.turns.is_empty() {
            return None;
        }
        let turns = turns_label(session.turns.len());
        let why = self.error.clone().unwrap_or_else(|| "it was not saved".into());
        if let Some(copy) = &self.rescued {
            return Some(format!(
                "the conversation ({turns}) could not be saved: {why}; a copy was written to {}",
                copy.display()
            ));
        }
        let copy = match &self.last_good {
            Some(p) => format!("the last good copy is {}", p.display()),
            None => "no copy was written".into(),
        };
        Some(format!("the conversation ({turns}) was not saved: {why}; {copy}"))
    }
}

/// "1 turn", "3 turns".
pub fn turns_label(n: usize) -> String {
    if n == 1 { "1 turn".into() } else { format!("{n} turns") }
}
