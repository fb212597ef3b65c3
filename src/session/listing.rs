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
