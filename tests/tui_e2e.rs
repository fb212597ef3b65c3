//! End to end: the real binary in tmux on the demo model. Type a question, wait for the answer,
//! check both panes and the gauges, copy the answer, change a slider, cancel a generation mid-stream (step mode
//! holds it there), quit, and check that the terminal is back to normal.
//!
//! Needs tmux: when it is missing the test installs it (apt-get, as root) and fails with a clear
//! message if it cannot. It never skips.

#[path = "common/tmux.rs"]
mod common_tmux;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common_tmux::children;

struct Tmux {
    socket: String,
    target: String,
}

impl Tmux {
    fn cmd(&self, args: &[&str]) -> Output {
        Command::new("tmux").arg("-L").arg(&self.socket).args(args).output().expect("running tmux")
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", &self.target];
        args.extend_from_slice(keys);
        let out = self.cmd(&args);
        assert!(out.status.success(), "send-keys {keys:?}: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn text(&self, s: &str) {
        let out = self.cmd(&["send-keys", "-t", &self.target, "-l", s]);
        assert!(out.status.success());
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", &self.target]).stdout).to_string()
    }

    fn alternate_on(&self) -> bool {
        let out = self.cmd(&["display-message", "-p", "-t", &self.target, "#{alternate_on}"]);
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    }

    /// Polls the screen until `pred` holds, up to `secs` seconds.
    fn wait(&self, what: &str, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + Duration::from_secs(secs);
        loop {
            let s = self.screen();
            if pred(&s) {
                return s;
            }
            if Instant::now() > end {
                panic!("timed out after {secs}s waiting for {what}; screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}

fn have_tmux() -> bool {
    Command::new("tmux").arg("-V").output().map(|o| o.status.success()).unwrap_or(false)
}

/// Installs tmux when it is missing (as root, with apt-get); fails with a clear message if it cannot.
fn ensure_tmux() {
    if !have_tmux() {
        eprintln!("tmux not found: installing it with apt-get");
        let _ = Command::new("sh").args(["-c", "apt-get update -qq && apt-get install -y -qq tmux"]).status();
    }
    assert!(
        have_tmux(),
        "this test drives the binary in tmux, and tmux could not be installed: install it (e.g. `apt-get install tmux`)"
    );
}

/// A plain shell in a 160×48 tmux window on its own server, so we can look at the terminal
/// after the TUI exits.
fn shell(name: &str) -> Tmux {
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
    // OSC 52 clipboard writes become tmux paste buffers (the copy keys are checked with them).
    assert!(t.cmd(&["set-option", "-s", "set-clipboard", "on"]).status.success());
    t.wait("the shell prompt", 10, |s| s.contains('$'));
    t
}

impl Tmux {
    /// Checks that the terminal is back to normal: no alternate screen, cursor shown, cooked
    /// mode, and the shell answers.
    fn assert_restored(&self, after: &str) {
        assert!(!self.alternate_on(), "after {after}: the alternate screen is still on");
        let out = self.cmd(&["display-message", "-p", "-t", &self.target, "#{cursor_flag}"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "1", "after {after}: the cursor is hidden");
        self.text("stty -a | grep -q -- -icanon && echo MODE-RAW || echo MODE-COOKED; echo EXIT-$?");
        self.keys(&["Enter"]);
        let s = self.wait("stty's answer", 10, |s| s.contains("EXIT-0"));
        assert!(s.contains("MODE-COOKED"), "after {after}: the terminal was left in raw mode:\n{s}");
    }
}

#[test]
fn workbench_in_tmux() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("config");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::create_dir_all(&config).unwrap();
    let bin = env!("CARGO_BIN_EXE_deltascope");
    let t = shell("e2e");
    let run = format!(
        "XDG_DATA_HOME={} XDG_CONFIG_HOME={} {} chat --max-tokens 1024 --temperature 0",
        data.display(),
        config.display(),
        shell_quote(Path::new(bin))
    );
    t.text(&run);
    t.keys(&["Enter"]);
    t.wait("the workbench on the demo model", 60, |s| s.contains("Type a question") && s.contains("embedded:demo"));

    // Ask, and wait for the answer; thinking pane, answer pane and gauges are all on screen.
    t.text("Is 91 prime?");
    t.keys(&["Enter"]);
    let s = t.wait("the answer", 120, |s| s.contains("91 is not prime") && s.contains("finish: stop"));
    assert!(s.contains(" Thinking · "), "thinking pane title with its token count:\n{s}");
    assert!(s.contains(" tok · ") || s.contains(" tok "), "{s}");
    assert!(s.contains(" Answer · "), "{s}");
    assert!(s.contains("Token budget"), "{s}");
    assert!(s.contains("TTFT"), "{s}");
    assert!(s.contains("Memory cpu"), "{s}");
    assert!(s.contains("KV cache"), "{s}");
    assert!(s.contains("MTP depth 2"), "{s}");

    // Copy keys put the answer, then the thinking, on the clipboard (OSC 52, here tmux's buffer).
    t.keys(&["C-y"]);
    t.wait("the copy message", 10, |s| s.contains("copied the answer"));
    let buffer = |t: &Tmux| String::from_utf8_lossy(&t.cmd(&["show-buffer"]).stdout).to_string();
    assert_eq!(buffer(&t), "No, 91 = 7 × 13, so 91 is not prime.");
    t.keys(&["M-y"]);
    t.wait("the copy message", 10, |s| s.contains("copied the thinking"));
    assert!(buffer(&t).starts_with("Check divisors"), "{}", buffer(&t));

    // A slider: Tab focuses the settings, → raises max_tokens 1024 → 1536.
    t.keys(&["Tab"]);
    t.wait("the focused sliders", 10, |s| s.contains("Settings (next run) ↑↓ ←→"));
    t.keys(&["Right"]);
    t.wait("max_tokens 1536", 10, |s| s.lines().any(|l| l.contains("max_tokens") && l.contains("1536")));
    t.keys(&["BTab"]);
    t.wait("the prompt focused again", 10, |s| !s.contains("Settings (next run) ↑↓ ←→"));

    // Resize at any moment: a tiny window gets a message, a normal one the workbench again.
    assert!(t.cmd(&["resize-window", "-t", &t.target, "-x", "50", "-y", "15"]).status.success());
    t.wait("the too-small message", 10, |s| s.contains("Terminal too small"));
    assert!(t.cmd(&["resize-window", "-t", &t.target, "-x", "160", "-y", "48"]).status.success());
    t.wait("the workbench after resizing", 10, |s| s.contains("Token budget") && s.contains("91 is not prime"));

    // Cancel mid-stream: step mode holds the generation after a few tokens; Esc cancels it and
    // what was produced stays on screen.
    t.keys(&["C-s"]);
    t.wait("step mode", 10, |s| s.contains("step mode"));
    t.text("What is 482 + 739?");
    t.keys(&["Enter"]);
    t.wait("the paused generation", 30, |s| s.contains("paused (step)"));
    for _ in 0..4 {
        t.keys(&["C-n"]);
    }
    // Each step is one token (or one MTP verify step of up to depth + 1 tokens).
    let s = t.wait("a few stepped tokens", 30, |s| thinking_count(s).is_some_and(|n| n > 0));
    std::thread::sleep(Duration::from_millis(300));
    let stepped = thinking_count(&t.screen()).unwrap_or(0);
    assert!(stepped <= 4 * 3, "step mode let {stepped} tokens through:\n{s}");
    t.keys(&["Escape"]);
    let s = t.wait("the cancelled run", 30, |s| s.contains("finish: cancelled"));
    assert_eq!(thinking_count(&s), Some(stepped), "output kept after cancel:\n{s}");
    assert!(!s.contains("1221"), "the cancelled run did not finish:\n{s}");
    t.keys(&["C-s"]);

    // Quit: the terminal is back (no alternate screen, cooked mode, the shell answers).
    t.keys(&["C-q"]);
    t.wait("the shell after quitting", 30, |s| s.trim_end().ends_with('$'));
    t.assert_restored("Ctrl+Q");

    // The conversation was autosaved.
    let sessions = data.join("deltascope/sessions");
    let saved: Vec<_> = std::fs::read_dir(&sessions).unwrap().filter_map(|e| e.ok()).collect();
    assert_eq!(saved.len(), 1, "one autosaved session in {}", sessions.display());
    let s = deltascope::session::Session::load(&saved[0].path()).unwrap();
    assert_eq!(s.turns.len(), 2);
    assert_eq!(s.turns[1].finish_reason, Some(deltascope_protocol::FinishReason::Cancelled));
    assert_eq!(s.turns[1].params.max_tokens, 1536);
}

/// N in the thinking pane's title "Thinking · N tok".
fn thinking_count(screen: &str) -> Option<usize> {
    let rest = &screen[screen.find(" Thinking · ")? + " Thinking · ".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', "'\\''"))
}

/// The terminal is restored however the TUI ends: a panic (the message is printed below, where
/// it can be read), an error, or a termination signal from outside (the session is saved).
#[test]
fn terminal_restored_after_panic_error_and_signal() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let bin = shell_quote(Path::new(env!("CARGO_BIN_EXE_deltascope")));
    let t = shell("restore");
    let launch = |env: &str| {
        t.text(&format!("clear; XDG_DATA_HOME={} {env} {bin}; echo EXIT-CODE-$?", data.display()));
        t.keys(&["Enter"]);
    };

    // DELTASCOPE_FAULT makes the main loop panic / fail once the model is loaded and drawn.
    launch("DELTASCOPE_FAULT=panic");
    // Whole lines: the previous run's "EXIT-CODE-101" may still be on screen before `clear`.
    let exited = |code: &'static str| move |s: &str| s.lines().any(|l| l.trim() == format!("EXIT-CODE-{code}"));
    let s = t.wait("the panic's exit", 60, exited("101"));
    assert!(s.contains("injected panic (DELTASCOPE_FAULT=panic)"), "the panic message is readable:\n{s}");
    t.assert_restored("a panic");

    launch("DELTASCOPE_FAULT=error");
    let s = t.wait("the error's exit", 60, exited("1"));
    assert!(s.contains("error: injected error (DELTASCOPE_FAULT=error)"), "{s}");
    t.assert_restored("an error");

    // A model that fails to load: the error screen, then Ctrl+Q; the error is printed again on
    // the restored terminal and the exit status is 1.
    let missing = dir.path().join("no-such-model");
    t.text(&format!(
        "clear; XDG_DATA_HOME={} {bin} chat --model {}; echo EXIT-CODE-$?",
        data.display(),
        shell_quote(&missing)
    ));
    t.keys(&["Enter"]);
    t.wait("the error screen", 30, |s| s.contains("deltascope could not start") && s.contains("no such directory"));
    t.keys(&["C-q"]);
    let s = t.wait("the load failure's exit", 30, exited("1"));
    assert!(s.contains(&format!("error: {}: no such directory", missing.display())), "the error after restoring:\n{s}");
    t.assert_restored("a load failure");

    // SIGTERM mid-generation: one answered question, then a second one held by step mode.
    launch("");
    t.wait("the workbench", 60, |s| s.contains("Type a question") && s.contains("embedded:demo"));
    t.text("What is 37 * 6?");
    t.keys(&["Enter"]);
    t.wait("the answer", 120, |s| s.contains("finish: stop"));
    t.keys(&["C-s"]);
    t.wait("step mode", 10, |s| s.contains("step mode"));
    t.text("Is 91 prime?");
    t.keys(&["Enter"]);
    t.wait("the paused generation", 30, |s| s.contains("paused (step)"));
    let pid = t.cmd(&["display-message", "-p", "-t", &t.target, "#{pane_pid}"]);
    let shell_pid = String::from_utf8_lossy(&pid.stdout).trim().to_string();
    let tui = children(&shell_pid);
    assert_eq!(tui.len(), 1, "one process (the TUI) under the shell {shell_pid}: {tui:?}");
    let killed = Command::new("sh").args(["-c", &format!("kill -TERM {}", tui[0])]).status().unwrap();
    assert!(killed.success());
    // The status names the signal (128 + 15), as `run`'s does.
    t.wait("the exit after SIGTERM", 30, exited("143"));
    t.assert_restored("SIGTERM");
    let saved: Vec<_> = std::fs::read_dir(data.join("deltascope/sessions")).unwrap().flatten().collect();
    assert_eq!(saved.len(), 1, "the session was saved on SIGTERM");
    let s = deltascope::session::Session::load(&saved[0].path()).unwrap();
    assert_eq!(s.turns.len(), 2);
    assert_eq!(s.turns[0].finish_reason, Some(deltascope_protocol::FinishReason::Stop));
    // The interrupted turn was closed properly: cancelled, with its usage, not left open.
    assert_eq!(s.turns[1].finish_reason, Some(deltascope_protocol::FinishReason::Cancelled), "{:?}", s.turns[1]);
    assert!(s.turns[1].stats.usage.is_some());
}

/// A paste arrives as one bracketed paste: its lines land in the prompt and nothing is sent
/// until Enter. Then the terminal goes away under the TUI mid-generation (the tmux server is
/// killed: the pty hangs up, as when a window closes or an ssh connection drops): the session
/// is saved, with the interrupted turn closed, and the program exits without a panic.
#[test]
fn paste_and_hangup() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let log = dir.path().join("tui.log");
    let stderr = dir.path().join("stderr.txt");
    ensure_tmux();
    let t = Tmux { socket: format!("deltascope-hup-{}", std::process::id()), target: "hup".into() };
    // The TUI is the pane's process itself (exec), so the hangup reaches it, not a shell.
    let cmd = format!(
        "exec env XDG_DATA_HOME={} {} chat --log-file {} 2>{}",
        shell_quote(&data),
        shell_quote(Path::new(env!("CARGO_BIN_EXE_deltascope"))),
        shell_quote(&log),
        shell_quote(&stderr)
    );
    let out = t.cmd(&["new-session", "-d", "-s", "hup", "-x", "160", "-y", "48", &cmd]);
    assert!(out.status.success(), "tmux new-session: {}", String::from_utf8_lossy(&out.stderr));
    t.wait("the workbench", 60, |s| s.contains("Type a question") && s.contains("embedded:demo"));
    let pid = String::from_utf8_lossy(&t.cmd(&["display-message", "-p", "-t", "hup", "#{pane_pid}"]).stdout)
        .trim()
        .to_string();

    // tmux sends the buffer as a bracketed paste (-p) because the TUI asked for them.
    assert!(t.cmd(&["set-buffer", "-b", "q", "Is 91 prime?\nPlease think it through."]).status.success());
    assert!(t.cmd(&["paste-buffer", "-p", "-b", "q", "-t", "hup"]).status.success());
    let s = t.wait("the pasted lines", 10, |s| s.contains("Please think it through."));
    assert!(s.contains("Is 91 prime?"), "both lines are in the prompt:\n{s}");
    std::thread::sleep(Duration::from_millis(500));
    let s = t.screen();
    assert!(s.contains("● idle"), "the paste sent nothing:\n{s}");
    t.keys(&["Enter"]);
    t.wait("the answer", 120, |s| s.contains("finish: stop"));

    // A second question, held mid-generation by step mode; then the terminal disappears.
    t.keys(&["C-s"]);
    t.wait("step mode", 10, |s| s.contains("step mode"));
    t.text("What is 37 * 6?");
    t.keys(&["Enter"]);
    t.wait("the paused generation", 30, |s| s.contains("paused (step)"));
    let _ = t.cmd(&["kill-server"]);
    let gone = Instant::now() + Duration::from_secs(20);
    while Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < gone, "the TUI (pid {pid}) is still running 20 s after the hangup");
        std::thread::sleep(Duration::from_millis(100));
    }
    let saved: Vec<_> = std::fs::read_dir(data.join("deltascope/sessions")).unwrap().flatten().collect();
    assert_eq!(saved.len(), 1, "the session was saved on hangup");
    let s = deltascope::session::Session::load(&saved[0].path()).unwrap();
    assert_eq!(s.turns.len(), 2, "{:?}", s.turns.iter().map(|t| &t.user).collect::<Vec<_>>());
    assert_eq!(s.turns[0].user, "Is 91 prime?\nPlease think it through.");
    assert_eq!(s.turns[1].finish_reason, Some(deltascope_protocol::FinishReason::Cancelled));
    let err = std::fs::read_to_string(&stderr).unwrap_or_default();
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!err.contains("panicked") && !log.contains("panic"), "no panic:\nstderr: {err}\nlog: {log}");
}

/// The state scope in the real binary at 80 × 24: F8 traces the next generation, F7 shows
/// what every GDN layer holds after each token, its keys move through layers, heads, metrics
/// and tokens, Esc brings the panes back, and the saved session keeps the trace.
#[test]
fn state_view_in_tmux_at_80x24() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let bin = env!("CARGO_BIN_EXE_deltascope");
    let t = shell("state");
    assert!(t.cmd(&["resize-window", "-t", &t.target, "-x", "80", "-y", "24"]).status.success());
    t.text(&format!(
        "XDG_DATA_HOME={} {} chat --device cpu --max-tokens 1024 --temperature 0",
        data.display(),
        shell_quote(Path::new(bin))
    ));
    t.keys(&["Enter"]);
    t.wait("the workbench", 60, |s| s.contains("Type a question") && s.contains("embedded:demo"));
    t.keys(&["F8"]);
    // The status line (cut at 80 columns) says so.
    t.wait("tracing on", 10, |s| s.contains("state trace o"));
    t.text("Is 91 prime?");
    t.keys(&["Enter"]);
    t.wait("the answer", 120, |s| s.contains("finish: stop"));
    t.keys(&["F7"]);
    // The demo model: GDN layers 0-2 and 4-6, attention at 3 and 7, four value heads. Waited
    // for whole: tmux can capture a frame while the terminal is still drawing it.
    let rows = ["▸L0 ", " L2 ", " L4 ", " L6 "];
    let s = t.wait("the State view, drawn whole", 10, |s| {
        s.contains("write strength β · after #")
            && rows.iter().all(|r| s.contains(r))
            && s.contains("attention L3 L7: KV")
    });
    for row in rows {
        assert!(s.contains(row), "{row}:\n{s}");
    }
    assert!(s.contains("attention L3 L7: KV"), "{s}");
    assert!(s.contains("L0 head 0 · β "), "{s}");
    assert!(s.lines().count() <= 24 && s.lines().all(|l| l.chars().count() <= 80), "{s}");
    // Layer down, head right, next metric, one token back.
    t.keys(&["Down", "Right", "m", "["]);
    let s = t.wait("the moved selection", 10, |s| s.contains("half-life (tokens)") && s.contains("L1 head 1 ·"));
    assert!(s.contains("not read yet"), "the last token is sampled but not read:\n{s}");
    // Esc closes the view; the token cursor it moved is the inspector's, open at that token.
    t.keys(&["Escape"]);
    t.wait("the inspector at the same token", 10, |s| s.contains("Token inspector") && !s.contains("half-life"));
    t.keys(&["Escape"]);
    t.wait("the panes again", 10, |s| s.contains("91 is not prime") && !s.contains("Token inspector"));
    t.keys(&["C-q"]);
    t.wait("the shell after quitting", 30, |s| s.trim_end().ends_with('$'));
    t.assert_restored("Ctrl+Q");

    // The session keeps the trace: the prompt's pass, then one per token read.
    let sessions = data.join("deltascope/sessions");
    let saved: Vec<_> = std::fs::read_dir(&sessions).unwrap().filter_map(|e| e.ok()).collect();
    let s = deltascope::session::Session::load(&saved[0].path()).unwrap();
    let turn = &s.turns[0];
    assert!(turn.params.trace_state);
    assert_eq!(turn.states.len(), turn.tokens.len(), "the prompt's pass and every token but the last");
    assert_eq!(turn.states[0].ev.at_token, None);
    assert_eq!(turn.states[0].ev.gdn.len(), 6);
}
