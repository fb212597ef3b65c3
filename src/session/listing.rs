//! What the session picker shows: each file's header and first prompt, read without building
//! its turns, and the files that cannot be opened with the reason.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{OLDEST_READABLE, SESSION_VERSION, SessionError};

/// One row of the session picker.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionInfo {
    pub path: PathBuf,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub turns: usize,
    pub first_prompt: String,
    /// Why the file cannot be opened (it is listed anyway, so it does not look lost).
    pub error: Option<String>,
}

/// What the picker reads of a session file: the header and each turn's prompt. serde skips
/// the rest (token events, stats) without building it, so listing stays cheap.
#[derive(Deserialize)]
struct SessionHead {
    version: u32,
    id: String,
    #[serde(default)]
    created: u64,
    #[serde(default)]
    model: String,
    #[serde(default)]
    turns: Vec<TurnHead>,
}

#[derive(Deserialize)]
struct TurnHead {
    user: String,
}

impl SessionInfo {
    fn read(path: PathBuf) -> SessionInfo {
        let name = path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        let broken = |path: PathBuf, e: SessionError| SessionInfo {
            path,
            id: name.clone(),
            created: 0,
            model: String::new(),
            turns: 0,
            first_prompt: String::new(),
            error: Some(e.to_string()),
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(source) => return broken(path.clone(), SessionError::Read { path, source }),
        };
        match serde_json::from_str::<SessionHead>(&text) {
            Err(source) => broken(path.clone(), SessionError::Parse { path, source }),
            Ok(h) if !(OLDEST_READABLE..=SESSION_VERSION).contains(&h.version) => {
                broken(path.clone(), SessionError::Version { path, found: h.version })
            }
            Ok(h) => SessionInfo {
                id: h.id,
                created: h.created,
                model: h.model,
                turns: h.turns.len(),
                first_prompt: h.turns.into_iter().next().map(|t| t.user).unwrap_or_default(),
                path,
                error: None,
            },
        }
    }
}

/// The `.json` files in `dir`, newest first; files that cannot be opened come last, with the
/// reason. A missing directory is an empty list.
pub fn list_sessions(dir: &Path) -> Vec<SessionInfo> {
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    let mut out: Vec<SessionInfo> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(SessionInfo::read)
        .collect();
    out.sort_by(|a, b| {
        (a.error.is_some(), std::cmp::Reverse(a.created), &a.id).cmp(&(
            b.error.is_some(),
            std::cmp::Reverse(b.created),
            &b.id,
        ))
    });
    out
}

/// The name a session is listed by: its file name when someone chose one (renamed from the
/// picker or saved under a name), else its first prompt (an autosaved file is named by its
/// creation time, which says little).
impl SessionInfo {
    pub fn title(&self) -> String {
        let stem = self.path.file_stem().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        let prompt = self.first_prompt.split_whitespace().collect::<Vec<_>>().join(" ");
        if stem != self.id || prompt.is_empty() { stem } else { prompt }
    }
}

/// Renames the session file `path` to `NAME.json` in its directory. Refused: an empty name, one
/// with a path separator or a leading dot, a name already taken (never overwritten), a session
/// another window holds. Its claim file, if free, goes with it.
pub fn rename_session(path: &Path, name: &str) -> Result<PathBuf, String> {
    let name = name.trim();
    let name = name.strip_suffix(".json").unwrap_or(name);
    if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') || name.chars().any(char::is_control) {
        return Err(format!("\"{name}\" cannot be a file name (no slashes, no leading dot)"));
    }
    if let Some(who) = super::guard::holder(path) {
        return Err(format!("{} is open in another window ({who})", path.display()));
    }
    let to = path.with_file_name(format!("{name}.json"));
    if to == path {
        return Ok(to);
    }
    // A hard link fails when the name is taken: no check-then-rename race, nothing overwritten.
    match std::fs::hard_link(path, &to) {
        Ok(()) => std::fs::remove_file(path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(format!("a session named {name} already exists; choose another name"));
        }
        // A file system without hard links.
        Err(_) if !to.exists() => {
            std::fs::rename(path, &to).map_err(|e| format!("cannot rename {}: {e}", path.display()))?
        }
        Err(_) => return Err(format!("a session named {name} already exists; choose another name")),
    }
    let _ = std::fs::remove_file(super::guard::lock_path(path));
    Ok(to)
}

/// Deletes the session file `path` (and its free claim file); refused while another window
/// holds it.
pub fn delete_session(path: &Path) -> Result<(), String> {
    if let Some(who) = super::guard::holder(path) {
        return Err(format!("{} is open in another window ({who})", path.display()));
    }
    std::fs::remove_file(path).map_err(|e| format!("cannot delete {}: {e}", path.display()))?;
    let _ = std::fs::remove_file(super::guard::lock_path(path));
    Ok(())
}
