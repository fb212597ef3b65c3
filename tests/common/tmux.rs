//! A tmux session to drive the real binary in (the TUI end-to-end tests).
#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

pub struct Tmux {
    pub socket: String,
    pub target: String,
}

impl Tmux {
    pub fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().expect("running tmux")
    }

    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.target];
        args.extend_from_slice(keys);
        let out = self.cmd(&args);
        assert!(out.status.success(), "send-keys {keys:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn text(&self, s: &str) {
        let out = self.cmd(&["send-keys", "-t", &self.target, "-l", s]);
        assert!(out.status.success(), "send-keys -l {s:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", &self.target]).stdout).to_string()
    }

    pub fn alternate_on(&self) -> bool {
        let out = self.cmd(&["display-message", "-p", "-t", &self.target, "#{alternate_on}"]);
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    }

    /// Polls the screen until `pred` holds, up to `secs` seconds.
    pub fn wait(&self, what: &str, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if Instant::now() > end {
                panic!("timed out after {secs}s waiting for {what}; screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Checks that the terminal is back to normal: no alternate screen, cursor shown, cooked
    /// mode, and the shell answers.
    pub fn assert_restored(&self, after: &str) {
        assert!(!self.alternate_on(), "after {after}: the alternate screen is still on");
        let out = self.cmd(&["display-message", "-p", "-t", &self.target, "#{cursor_flag}"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1", "after {after}: the cursor is hidden");
        self.text("stty -a | grep -q -- -icanon && echo MODE-RAW || echo MODE-COOKED; echo EXIT-$?");
        self.keys(&["Enter"]);
        let s = self.wait("stty's answer", 10, |s| s.contains("EXIT-0"));
        assert!(s.contains("MODE-COOKED"), "after {after}: the terminal was left in raw mode:\n{s}");
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        // Ends the shell and whatever runs in it (the TUI gets SIGHUP).
        let _ = self.cmd(&["kill-server"]);
    }
}

pub fn have_tmux() -> bool {
    Command::new("tmux").arg("-V").output().map(|o| o.status.success()).unwrap_or(false)
}

/// Installs tmux when it is missing (as root, with apt-get); fails with a clear message if it cannot.
pub fn ensure_tmux() {
    if !have_tmux() {
        eprintln!("tmux not found: installing it with apt-get");
        let _ = Command::new("sh").args(["-c", "apt-get update -qq && apt-get install -y -qq tmux"]).status();
    }
    assert!(
        have_tmux(),
        "this test drives the binary in tmux, and tmux could not be installed: install it (e.g. `apt-get install tmux`)"
    );
}

/// A plain shell in a 160×48 tmux window on its own tmux server.
pub fn shell(name: &str) -> Tmux {
    ensure_tmux();
    let t = Tmux { socket: format!("deltascope-{name}-{}", std::process::id()), target: name.into() };
    let out = t.cmd(&[
        "new-session",
        "-d",
        "-s",
        name,
        "-x",
        "160",
        "-y",
        "48",
        "env",
        "-i",
        "PATH=/usr/bin:/bin",
        "TERM=xterm-256color",
        "PS1=$ ",
        "bash",
        "--norc",
        "--noprofile",
    ]);
    assert!(out.status.success(), "tmux new-session: {}", String::from_utf8_lossy(&out.stderr));
    t.wait("the shell prompt", 10, |s| s.contains('$'));
    t
}

pub fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// The pids whose parent is `parent` (from /proc, so the test needs no procps).
pub fn children(parent: &str) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // "pid (comm) state ppid …": comm may hold spaces, so split after its closing paren.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else { continue };
        if rest.split_whitespace().nth(1) == Some(parent) {
            out.push(e.file_name().to_string_lossy().to_string());
        }
    }
    out
}

/// The process running in the pane's shell (the one command it started).
pub fn pane_child(t: &Tmux) -> String {
    let pid = t.cmd(&["display-message", "-p", "-t", &t.target, "#{pane_pid}"]);
    let shell_pid = String::from_utf8_lossy(&pid.stdout).trim().to_string();
    let kids = children(&shell_pid);
    assert_eq!(kids.len(), 1, "one process under the shell {shell_pid}: {kids:?}");
    kids[0].clone()
}

/// A prefix for a shell command line that makes file modes bind: as root (CI containers), the
/// command runs without the capabilities that let root write where a mode forbids it
/// (`setpriv`, util-linux); as anyone else, nothing.
pub fn modes_bind_prefix() -> String {
    let uid = Command::new("id").arg("-u").output().expect("running id -u");
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return String::new();
    }
    let found = Command::new("setpriv").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(found, "as root this test needs setpriv (util-linux) to drop CAP_DAC_OVERRIDE: install util-linux");
    "setpriv --inh-caps=-dac_override,-dac_read_search --bounding-set=-dac_override,-dac_read_search --".into()
}
