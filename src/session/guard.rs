//! Two windows on one session file must not lose each other's turns. Two guards:
//!
//! - **A claim**: an advisory lock on a sidecar file (`.NAME.lock` beside the session; the
//!   session itself is replaced by every atomic save, so a lock on it would not last), held
//!   until the process ends, with who holds it written inside. A second window that finds it
//!   held saves to a copy and says so.
//! - **What this process last saw of each file** (read or written): a save that finds the
//!   file changed since — another program wrote it — does not overwrite it; the session goes
//!   to a conflict file beside it, and the caller is told where.

use std::collections::HashMap;
use std::fs::{File, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Lock files held by this process (dropped at exit, which releases them).
static CLAIMS: Mutex<Vec<(PathBuf, File)>> = Mutex::new(Vec::new());

/// A fingerprint of the bytes this process last read from or wrote to each session file.
static SEEN: Mutex<Option<HashMap<PathBuf, u64>>> = Mutex::new(None);

/// The sidecar lock file of a session file.
pub fn lock_path(session: &Path) -> PathBuf {
    let name = session.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    session.with_file_name(format!(".{name}.lock"))
}

/// Claims `session` for this process. `Err(holder)` when another process holds it: who
/// (pid, host, since when), as it wrote itself into the lock file. A lock file that cannot be
/// created (a read-only folder) claims nothing and is no error: saving there fails anyway.
pub fn claim(session: &Path) -> Result<(), String> {
    // Two windows on one file through different links see one lock.
    let path = lock_path(&super::resolve_links(session).unwrap_or_else(|_| session.to_path_buf()));
    let Ok(mut file) = File::options().read(true).write(true).create(true).truncate(false).open(&path) else {
        return Ok(());
    };
    match file.try_lock() {
        Ok(()) => {
            let host = std::fs::read_to_string("/etc/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
            let who = format!(
                "pid {} on {} since {} UTC",
                std::process::id(),
                if host.is_empty() { "this machine" } else { &host },
                super::format_timestamp(super::now_secs())
            );
            let _ = file.set_len(0).and_then(|()| file.rewind()).and_then(|()| file.write_all(who.as_bytes()));
            if let Ok(mut claims) = CLAIMS.lock() {
                claims.push((path, file));
            }
            Ok(())
        }
        Err(TryLockError::WouldBlock) => {
            let mut who = String::new();
            let _ = file.read_to_string(&mut who);
            Err(if who.trim().is_empty() { "another deltascope".to_string() } else { who.trim().to_string() })
        }
        // A file system without locks: nothing to guard with.
        Err(TryLockError::Error(_)) => Ok(()),
    }
}

/// Who holds `session`'s claim, when another open file — another window, or this process's
/// own claim — holds it; `None` when it is free. Nothing is claimed by asking.
pub fn holder(session: &Path) -> Option<String> {
    let path = lock_path(&super::resolve_links(session).unwrap_or_else(|_| session.to_path_buf()));
    let mut file = File::options().read(true).open(&path).ok()?;
    match file.try_lock_shared() {
        Ok(()) => None,
        Err(TryLockError::WouldBlock) => {
            let mut who = String::new();
            let _ = file.read_to_string(&mut who);
            Some(if who.trim().is_empty() { "another deltascope".to_string() } else { who.trim().to_string() })
        }
        Err(TryLockError::Error(_)) => None,
    }
}

/// A copy's path beside `session` for a window that may not write it: `NAME.copy-TIME.json`.
pub fn copy_path(session: &Path, what: &str) -> PathBuf {
    let stem = session.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "session".into());
    let stamp = super::format_timestamp(super::now_secs());
    let mut p = session.with_file_name(format!("{stem}.{what}-{stamp}.json"));
    let mut n = 2;
    while p.exists() {
        p = session.with_file_name(format!("{stem}.{what}-{stamp}-{n}.json"));
        n += 1;
    }
    p
}

fn fingerprint(bytes: &[u8]) -> u64 {
    // FNV-1a: a change detector, not a security measure.
    bytes.iter().fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100000001b3))
}

/// This process read or wrote `bytes` at `path`.
pub fn saw(path: &Path, bytes: &[u8]) {
    if let Ok(mut seen) = SEEN.lock() {
        seen.get_or_insert_with(HashMap::new).insert(path.to_path_buf(), fingerprint(bytes));
    }
}

/// Whether the file at `path` (now holding `current`, `None` when there is none) changed
/// since this process last read or wrote it: another program wrote it, or created it after
/// this process chose the name.
pub fn changed_since_seen(path: &Path, current: Option<&[u8]>) -> bool {
    let seen = SEEN.lock().ok().and_then(|s| s.as_ref().and_then(|m| m.get(path).copied()));
    match (seen, current) {
        (_, None) => false,
        (None, Some(_)) => true,
        (Some(f), Some(now)) => fingerprint(now) != f,
    }
}
