//! Conversations as data: every turn keeps its prompt, its parameters, the thinking and the
//! answer, per-turn statistics and every token event with its arrival time. Sessions are saved
//! atomically as JSON (write a temporary file, then rename, so a crash never leaves half a
//! file), reloaded to resume, exported to Markdown, and replayed with their original timing.
//!
//! A turn stores the engine's own value types (usage, timing, memory, MTP statistics, token
//! alternatives); what it adds is arrival times, and it rebuilds [`EngineEvent`]s from them
//! for replay. Version 3 stores a turn's tokens as columns ([`compact`]).

#![forbid(unsafe_code)]

mod compact;
pub mod guard;
mod listing;
mod markdown;
mod turn;
mod unknown;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use self::listing::{SessionInfo, delete_session, list_sessions, rename_session};
pub use self::turn::{Timed, Turn, TurnStats, mtp_label};
use crate::backend::{ChatMessage, Role};
#[cfg(doc)]
use deltascope_protocol::EngineEvent;

/// The file format this build writes. Version 1 files (before the remote backend; their
/// tokens always had ids), version 2 files (one JSON object per token) and version 3 files
/// (forced tokens counted inside the thinking and answer counts too) still load.
pub const SESSION_VERSION: u32 = 4;
const OLDEST_READABLE: u32 = 1;

/// A whole conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Session {
    pub version: u32,
    /// File stem; also shown in the picker.
    pub id: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    #[serde(default)]
    pub turns: Vec<Turn>,
    /// Continuations replaced by an edit or a delete: kept, never dropped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub branches: Vec<Branch>,
    /// Fields this build does not know (written by a newer one), kept for the rewrite.
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// Set by [`Session::load`] when the file holds fields this build would drop (inside a
    /// turn's parameters, statistics or tokens): the file is then not overwritten.
    #[serde(skip)]
    pub unknown_fields: Vec<String>,
}

/// Turns taken out of the conversation (an earlier prompt edited and re-run, a turn deleted
/// or regenerated): they stay in the session file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Branch {
    /// The index the first of these turns had in the conversation.
    pub at: usize,
    /// Why they were set aside: "edited", "deleted" or "regenerated".
    pub reason: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    pub turns: Vec<Turn>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("cannot read session {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot write session {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{path} is not a deltascope session: {}", deltascope_model::brief(&source.to_string()))]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("{path}: session format version {found}, this build reads versions {OLDEST_READABLE} to {SESSION_VERSION}")]
    Version { path: PathBuf, found: u32 },
    #[error("{path}: {} = {}", deltascope_model::brief(field), deltascope_model::brief(message))]
    Value { path: PathBuf, field: String, message: String },
    #[error(
        "not overwriting {path}: it has fields this build does not know ({fields}), which a rewrite would drop; save to another file"
    )]
    WouldDrop { path: PathBuf, fields: String },
}

/// What a save did.
#[derive(Debug, Clone, PartialEq)]
pub enum Saved {
    Written,
    /// The file already held this session: left as it was.
    Unchanged,
    /// The file changed on disk since this process read or wrote it (another window): it was
    /// left as it is, and the session written to this conflict file beside it.
    Diverted(PathBuf),
}

impl Session {
    pub fn new(model: impl Into<String>, system: Option<String>) -> Self {
        let created = now_secs();
        // Seconds plus the process id keep two sessions started in the same second apart.
        let id = format!("{}-{}", format_timestamp(created), std::process::id());
        Session {
            version: SESSION_VERSION,
            id,
            created,
            model: model.into(),
            system,
            turns: vec![],
            branches: vec![],
            extra: Default::default(),
            unknown_fields: vec![],
        }
    }

    /// Sets turns `from..` aside as a branch (an earlier prompt is edited and re-run).
    /// Comparisons of the moved turns go with them.
    pub fn branch_from(&mut self, from: usize, reason: &str) {
        if from >= self.turns.len() {
            return;
        }
        let turns = self.turns.split_off(from);
        self.branches.push(Branch {
            at: from,
            reason: reason.into(),
            created: now_secs(),
            turns,
            extra: Default::default(),
        });
    }

    /// Takes turn `i` (and the comparisons of it) out of the conversation, keeping it as a
    /// branch. Later comparison indices are renumbered.
    pub fn delete_turn(&mut self, i: usize) {
        if i >= self.turns.len() {
            return;
        }
        let mut moved = vec![];
        let mut kept = vec![];
        for (j, t) in std::mem::take(&mut self.turns).into_iter().enumerate() {
            if j == i || t.compare_of == Some(i) { moved.push(t) } else { kept.push((j, t)) }
        }
        let new_index = |old: usize| kept.iter().position(|(j, _)| *j == old);
        let renumbered: Vec<Turn> = kept
            .iter()
            .map(|(_, t)| {
                let mut t = t.clone();
                t.compare_of = t.compare_of.and_then(new_index);
                t
            })
            .collect();
        self.turns = renumbered;
        self.branches.push(Branch {
            at: i,
            reason: "deleted".into(),
            created: now_secs(),
            turns: moved,
            extra: Default::default(),
        });
    }

    /// The chat messages for a new user message after the turns in `upto` (comparison turns
    /// are not part of the conversation).
    pub fn messages(&self, upto: usize, user: &str) -> Vec<ChatMessage> {
        let mut m = vec![];
        if let Some(s) = &self.system {
            m.push(ChatMessage::new(Role::System, s.clone()));
        }
        // A turn that failed (context overflow, engine error, NaN from the model) asked nothing
        // the model answered: it is not part of the context.
        for t in self.turns.iter().take(upto).filter(|t| t.compare_of.is_none() && !t.failed()) {
            m.push(ChatMessage::new(Role::User, t.user.clone()));
            if t.is_finished() {
                m.push(ChatMessage {
                    role: Role::Assistant,
                    content: t.answer.clone(),
                    reasoning: Some(t.thinking.clone()),
                });
            }
        }
        m.push(ChatMessage::new(Role::User, user));
        m
    }

    pub fn file_name(&self) -> String {
        format!("{}.json", self.id)
    }

    /// Writes the session to `path` atomically: a temporary file in the same directory,
    /// flushed to disk, then renamed over the target (atomic on POSIX file systems), so the
    /// file is always a whole session, old or new, even after a `kill -9` or a power cut.
    /// A failed write removes its temporary file.
    pub fn save_atomic(&self, path: &Path) -> Result<Saved, SessionError> {
        let err = |source| SessionError::Write { path: path.to_path_buf(), source };
        if !self.unknown_fields.is_empty() && path.exists() {
            return Err(SessionError::WouldDrop { path: path.to_path_buf(), fields: self.unknown_fields.join(", ") });
        }
        // A session opened through a symlink (into a synced folder, say) is written where the
        // link points: renaming over the link would leave the target without the new turns.
        let target = resolve_links(path).map_err(err)?;
        let path = target.as_path();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let json = serde_json::to_vec(self).map_err(|e| err(std::io::Error::other(e)))?;
        // Opening a session and quitting must not rewrite it (an example file, a file under
        // version control): an unchanged session leaves the file as it is.
        let current = std::fs::read(path).ok();
        if current.as_deref() == Some(&json[..]) {
            guard::saw(path, &json);
            return Ok(Saved::Unchanged);
        }
        // A file that changed since this process read or wrote it (another window saved its
        // turns there) is not overwritten: this session goes to a conflict file beside it.
        let dest = if guard::changed_since_seen(path, current.as_deref()) {
            guard::copy_path(path, "conflict")
        } else {
            path.to_path_buf()
        };
        // The file keeps its mode (a `chmod 600` session stays private) and, where allowed,
        // its owner; a new one is created readable by its owner only: prompts can be private.
        let old = std::fs::metadata(path).ok();
        let tmp = dest.with_extension(format!("json.tmp{}", std::process::id()));
        let written = write_synced(&tmp, &json, old.as_ref()).and_then(|()| std::fs::rename(&tmp, &dest));
        written.map_err(|e| {
            // A full disk leaves a partial temporary file: it goes, the old session stays.
            let _ = std::fs::remove_file(&tmp);
            SessionError::Write { path: dest.clone(), source: e }
        })?;
        guard::saw(&dest, &json);
        Ok(if dest == path { Saved::Written } else { Saved::Diverted(dest) })
    }

    /// Reads a session (any readable format version), checking its settings like the
    /// command-line flags: a bad value is an error naming the file and the field.
    pub fn load(path: &Path) -> Result<Session, SessionError> {
        let text = std::fs::read_to_string(path).map_err(|source| SessionError::Read { path: path.into(), source })?;
        // What this process saw of the file: a later save checks that nobody else wrote it since.
        if let Ok(real) = resolve_links(path) {
            guard::saw(&real, text.as_bytes());
        }
        let parse = |source| SessionError::Parse { path: path.into(), source };
        let mut s: Session = serde_json::from_str(&text).map_err(parse)?;
        if !(OLDEST_READABLE..=SESSION_VERSION).contains(&s.version) {
            return Err(SessionError::Version { path: path.into(), found: s.version });
        }
        if let Some((field, message)) = s.bad_setting() {
            return Err(SessionError::Value { path: path.into(), field, message });
        }
        for t in s.turns.iter_mut().chain(s.branches.iter_mut().flat_map(|b| b.turns.iter_mut())) {
            t.clear_repeated_histories();
            t.reconcile_thinking();
        }
        if s.version <= 3 {
            for t in s.turns.iter_mut().chain(s.branches.iter_mut().flat_map(|b| b.turns.iter_mut())) {
                t.uncount_forced_tokens();
            }
        }
        if s.version == 1 {
            // Version 1 token records had no index: it is their position.
            for t in &mut s.turns {
                for (i, tok) in t.tokens.iter_mut().enumerate() {
                    tok.ev.index = i;
                }
            }
        }
        let original: serde_json::Value = serde_json::from_str(&text).map_err(parse)?;
        let rewritten = serde_json::to_value(&s).map_err(|e| parse(serde::ser::Error::custom(e)))?;
        s.unknown_fields = unknown::dropped(&original, &rewritten);
        s.version = SESSION_VERSION;
        Ok(s)
    }

    /// The first turn setting out of range, as (`turns[2].params.sampling.temperature`, why).
    fn bad_setting(&self) -> Option<(String, String)> {
        let turns = self.turns.iter().enumerate().map(|(i, t)| (format!("turns[{i}]"), t));
        let branched = self.branches.iter().enumerate().flat_map(|(b, br)| {
            br.turns.iter().enumerate().map(move |(i, t)| (format!("branches[{b}].turns[{i}]"), t))
        });
        turns.chain(branched).find_map(|(at, t)| {
            t.params.check().err().map(|p| (format!("{at}.params.{}", p.field), format!("{}: {}", p.value, p.must())))
        })
    }
}

/// Writes `bytes` to a new file and flushes it to the disk.
/// Writes `bytes` to a new file at `path` with `like`'s mode and owner (or mode 600), synced.
fn write_synced(path: &Path, bytes: &[u8], like: Option<&std::fs::Metadata>) -> std::io::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        options.mode(like.map_or(0o600, |m| m.mode() & 0o7777));
    }
    let mut f = options.open(path)?;
    #[cfg(unix)]
    if let Some(m) = like {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        // The umask trimmed the mode `open` was given: set it exactly.
        f.set_permissions(std::fs::Permissions::from_mode(m.mode() & 0o7777))?;
        // Another user's file (root editing it, say) stays theirs where the system allows.
        let _ = std::os::unix::fs::fchown(&f, Some(m.uid()), Some(m.gid()));
    }
    #[cfg(not(unix))]
    let _ = like;
    std::io::Write::write_all(&mut f, bytes)?;
    f.sync_all()
}

/// `path` with every symbolic link along it followed (a link to a link, a relative link),
/// including one whose target does not exist yet; `path` itself when it is no link.
fn resolve_links(path: &Path) -> std::io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..40 {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = std::fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            _ => return Ok(p),
        }
    }
    Err(std::io::Error::other(format!("{}: too many levels of symbolic links", path.display())))
}

/// `$XDG_DATA_HOME/deltascope/sessions` (or the platform's data directory).
pub fn default_sessions_dir() -> Option<PathBuf> {
    dirs::data_dir().map(|d| d.join("deltascope").join("sessions"))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default()
}

/// `YYYY-MM-DDTHH-MM-SS` (UTC) without a date library: days-from-civil inverted.
pub fn format_timestamp(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (h, m, s) = (rem / 3600, (rem % 3600) / 60, rem % 60);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if mo <= 2 { y + 1 } else { y };
    format!("{y:04}-{mo:02}-{d:02}T{h:02}-{m:02}-{s:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_civil_dates() {
        assert_eq!(format_timestamp(0), "1970-01-01T00-00-00");
        assert_eq!(format_timestamp(1_700_000_000), "2023-11-14T22-13-20");
    }
}
