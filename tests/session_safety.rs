//! Nothing lost when a session file is shared (issue 35, items 1-4): two workbench windows on
//! one file (the real binary in tmux), a file another program rewrote since it was read, a
//! session opened through a symlink, a private session's mode, and a data directory where the
//! log file cannot be opened.

#[path = "common/tmux.rs"]
mod tmux;

use std::path::Path;

use deltascope::session::{Saved, Session};
use tmux::{Tmux, modes_bind_prefix, pane_child, shell, shell_quote};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_deltascope")
}

/// The workbench on the demo model in its own tmux server, with `env` set; returns once the
/// model is loaded.
fn workbench(name: &str, env: &str, args: &str) -> Tmux {
    let t = shell(name);
    t.text(&format!("{env} {} chat {args}; echo EXIT-CODE-$?", shell_quote(Path::new(bin()))));
    t.keys(&["Enter"]);
    t.wait("the demo model loaded", 30, |s| s.contains("Type a question") || s.contains("Ask something"));
    t
}

fn ask_and_quit(t: &Tmux, question: &str) {
    t.text(question);
    t.keys(&["Enter"]);
    t.wait("the answer", 60, |s| s.contains("finish: stop"));
    t.keys(&["C-q"]);
    t.wait("the workbench quit", 20, |s| s.contains("EXIT-CODE-"));
}

fn users(s: &Session) -> Vec<String> {
    s.turns.iter().map(|t| t.user.clone()).collect()
}

/// Item 1: `deltascope chat --session s.json` in two terminals, one question in each, quit
/// both. The second window finds the file held, says by whom and saves to a copy: each file
/// keeps its window's turn, both exit 0.
#[test]
fn two_windows_on_one_session_file_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.json");
    let env = format!(
        "XDG_DATA_HOME={d}/data XDG_STATE_HOME={d}/state XDG_CONFIG_HOME={d}/config",
        d = shell_quote(dir.path())
    );
    let args = format!("--session {} --sessions-dir {}/sessions", shell_quote(&file), shell_quote(dir.path()));
    let first = workbench("share-a", &env, &args);
    let second = workbench("share-b", &env, &args);
    // The status line keeps saying it, whatever notes came after it (the CPU note, …).
    second.wait("the status line", 10, |s| s.contains("s.json open in another window: saving to s.copy-"));
    assert!(!first.screen().contains("open in another window"), "the first window holds the file: {}", first.screen());
    // The message log (Alt+M) keeps the first screen's warning.
    second.keys(&["M-m"]);
    let s = second.wait("the second window's warning", 10, |s| s.contains("is open in another deltascope window"));
    assert!(s.contains("pid "), "who holds it:\n{s}");
    second.keys(&["Escape"]);
    ask_and_quit(&first, "What is 2 + 3?");
    ask_and_quit(&second, "Is 91 prime?");
    for t in [&first, &second] {
        assert!(t.screen().contains("EXIT-CODE-0"), "{}", t.screen());
    }
    // Quitting says where the copy went (on the restored terminal).
    let joined = second.cmd(&["capture-pane", "-p", "-J", "-t", &second.target]);
    let said = String::from_utf8_lossy(&joined.stdout).replace('\n', " ");
    assert!(said.contains("this conversation was saved to ") && said.contains("s.copy-"), "{said}");
    assert!(said.contains("s.json is open in another deltascope window"), "{said}");
    assert_eq!(users(&Session::load(&file).unwrap()), ["What is 2 + 3?"]);
    let copies: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("s.copy-"))
        .collect();
    assert_eq!(copies.len(), 1, "one copy beside s.json: {copies:?}");
    assert_eq!(users(&Session::load(&copies[0]).unwrap()), ["Is 91 prime?"]);
}

/// Item 1, without a lock: a file another program rewrote after this process read it is not
/// overwritten; the session goes to a conflict file beside it, and the caller is told where.
#[test]
fn a_file_changed_on_disk_since_it_was_read_is_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.json");
    let mine = Session::new("demo", None);
    mine.save_atomic(&file).unwrap();
    let mut mine = Session::load(&file).unwrap();
    // Another window saves its own conversation there meanwhile.
    let mut theirs = Session::new("demo", Some("theirs".into()));
    theirs.id.push_str("-other");
    std::fs::write(&file, serde_json::to_vec(&theirs).unwrap()).unwrap();
    mine.system = Some("mine".into());
    let Saved::Diverted(to) = mine.save_atomic(&file).unwrap() else { panic!("the save must not overwrite") };
    assert_eq!(Session::load(&file).unwrap().system.as_deref(), Some("theirs"), "their file is untouched");
    assert_eq!(Session::load(&to).unwrap().system.as_deref(), Some("mine"), "ours is in {}", to.display());
    assert!(to.file_name().unwrap().to_string_lossy().starts_with("s.conflict-"), "{}", to.display());
    // Saves of what this process itself wrote go on as before.
    mine.system = Some("mine, again".into());
    assert_eq!(mine.save_atomic(&to).unwrap(), Saved::Written);
    // A file this process never read, created under a name it chose: not overwritten either.
    let fresh = dir.path().join("fresh.json");
    std::fs::write(&fresh, serde_json::to_vec(&theirs).unwrap()).unwrap();
    assert!(matches!(Session::new("demo", None).save_atomic(&fresh).unwrap(), Saved::Diverted(_)));
}

/// Item 2: a session opened through a symlink (into a synced folder, say) is written where the
/// link points; the link stays a link.
#[cfg(unix)]
#[test]
fn a_session_opened_through_a_symlink_is_written_to_its_target() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("synced")).unwrap();
    let target = dir.path().join("synced").join("s.json");
    Session::new("demo", None).save_atomic(&target).unwrap();
    let link = dir.path().join("s.json");
    std::os::unix::fs::symlink("synced/s.json", &link).unwrap();
    let mut s = Session::load(&link).unwrap();
    s.system = Some("through the link".into());
    assert_eq!(s.save_atomic(&link).unwrap(), Saved::Written);
    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link is still a link");
    assert_eq!(Session::load(&target).unwrap().system.as_deref(), Some("through the link"));
}

/// Item 3: a `chmod 600` session stays 600 after a save; a new session file is created 600.
#[cfg(unix)]
#[test]
fn a_sessions_mode_is_kept_and_new_ones_are_private() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.json");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let mut s = Session::new("demo", None);
    s.save_atomic(&file).unwrap();
    assert_eq!(mode(&file), 0o600, "a new session is private");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    s.system = Some("changed".into());
    s.save_atomic(&file).unwrap();
    assert_eq!(mode(&file), 0o640, "the file keeps the mode it was given");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    s.system = Some("changed again".into());
    s.save_atomic(&file).unwrap();
    assert_eq!(mode(&file), 0o600);
}

/// Item 4: a data directory where the default log file cannot be opened (here: under a plain
/// file) is a warning naming the fallback, not a reason not to start; a `--log-file` the user
/// named is an error.
#[test]
fn a_log_file_that_cannot_be_opened_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let env = format!(
        "XDG_DATA_HOME=/dev/null/data XDG_STATE_HOME={d}/state XDG_CONFIG_HOME={d}/config",
        d = shell_quote(dir.path())
    );
    let t = workbench("log-fallback", &env, &format!("--sessions-dir {}/sessions", shell_quote(dir.path())));
    t.keys(&["M-m"]);
    let s = t.wait("the warning", 10, |s| s.contains("cannot open the log file"));
    assert!(s.contains("logging to"), "the fallback is named:\n{s}");
    t.keys(&["Escape"]);
    t.keys(&["C-q"]);
    t.wait("the workbench quit", 20, |s| s.contains("EXIT-CODE-0"));
    assert!(dir.path().join("state/deltascope/deltascope.log").is_file(), "the state directory's log");
    // A --log-file the user named that cannot be opened is an error (what they asked to keep
    // would be lost), for the workbench and the other commands alike.
    let out = std::process::Command::new(bin())
        .args(["inspect", "--log-file", "/dev/null/x.log"])
        .output()
        .expect("running inspect");
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: --log-file /dev/null/x.log: cannot open it for writing ("), "{stderr}");
}

/// A signal to the workbench after a save failed (the session folder turned read-only mid-way):
/// the conversation is not lost. Its copy goes to the first folder that takes it — the data
/// directory, else the state directory, else the temporary directory — the loss and the copy
/// are said on the restored terminal, and the exit status is 128 + the signal.
#[cfg(unix)]
#[test]
fn a_signal_after_a_failed_save_writes_a_copy_and_says_where() {
    use std::os::unix::fs::PermissionsExt;
    let read_only = |p: &Path| std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o555)).unwrap();
    let prefix = modes_bind_prefix();
    // (signal, its number, the folders that refuse the copy too, where the copy must go)
    let cases =
        [("TERM", 15, &[][..], "data"), ("HUP", 1, &["data"][..], "state"), ("INT", 2, &["data", "state"][..], "tmp")];
    for (signal, number, refusing, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let d = |name: &str| dir.path().join(name);
        for name in ["sessions", "data", "state", "tmp", "config"] {
            std::fs::create_dir_all(d(name)).unwrap();
        }
        for name in refusing {
            read_only(&d(name));
        }
        let t = shell(&format!("rescue-{signal}"));
        t.text(&format!(
            "XDG_DATA_HOME={} XDG_STATE_HOME={} TMPDIR={} XDG_CONFIG_HOME={} {prefix} {} chat --sessions-dir {}; echo EXIT-CODE-$?",
            shell_quote(&d("data")),
            shell_quote(&d("state")),
            shell_quote(&d("tmp")),
            shell_quote(&d("config")),
            shell_quote(Path::new(bin())),
            shell_quote(&d("sessions")),
        ));
        t.keys(&["Enter"]);
        t.wait("the demo model loaded", 30, |s| s.contains("Type a question"));
        t.text("What is 2 + 3?");
        t.keys(&["Enter"]);
        t.wait("the first answer", 60, |s| s.contains("finish: stop"));
        // The first turn is saved; then the folder turns read-only and the second turn's save fails.
        let saved: Vec<_> = std::fs::read_dir(d("sessions")).unwrap().flatten().map(|e| e.path()).collect();
        assert_eq!(saved.len(), 1, "the first turn was autosaved: {saved:?}");
        read_only(&d("sessions"));
        t.text("Is 91 prime?");
        t.keys(&["Enter"]);
        t.wait("the failed autosave", 60, |s| s.contains("91 is not prime") && s.contains("autosave failed"));
        let pid = pane_child(&t);
        assert!(std::process::Command::new("kill").args([&format!("-{signal}"), &pid]).status().unwrap().success());
        t.wait("the exit", 30, |s| s.lines().any(|l| l.trim() == format!("EXIT-CODE-{}", 128 + number)));
        // Said on the restored terminal (wrapped lines joined).
        let joined = t.cmd(&["capture-pane", "-p", "-J", "-t", &t.target]);
        let stderr = String::from_utf8_lossy(&joined.stdout).replace('\n', " ");
        t.assert_restored(&format!("SIG{signal}"));
        let copy_dir = d(expected).join("deltascope/sessions");
        let copy = copy_dir.join(saved[0].file_name().unwrap());
        assert!(
            stderr.contains("the conversation (2 turns) could not be saved: ")
                && stderr.contains(&format!("a copy was written to {}", copy.display())),
            "SIG{signal}: the loss and the copy are said:\n{stderr}"
        );
        assert_eq!(users(&Session::load(&copy).unwrap()), ["What is 2 + 3?", "Is 91 prime?"], "SIG{signal}");
        assert_eq!(users(&Session::load(&saved[0]).unwrap()), ["What is 2 + 3?"], "the original is as it was");
        for name in ["sessions", "data", "state"] {
            std::fs::set_permissions(d(name), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
}
