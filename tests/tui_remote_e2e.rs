//! End to end: the workbench (`deltascope chat --server`) in tmux against a real llama.cpp server
//! (b10566, through xllamacpp, with MTP on) on 127.0.0.1. Ask a question, wait for the answer,
//! check the thinking pane, the server's MTP figures in the gauges and the remote memory line,
//! check that step mode is refused, quit, and check the terminal and the saved session.
//!
//! Needs tmux (installed with apt-get when missing, else the test fails with a clear message) and
//! the servers of `scripts/setup-servers.sh` (run by the test). It never skips.

#[path = "common/llama_server.rs"]
mod llama_server;
#[path = "common/tmux.rs"]
mod tmux;

use std::path::Path;

use deltascope_protocol::FinishReason;
use llama_server::{Build, LlamaServer, ServerConfig};
use tmux::{shell, shell_quote};

/// N in the thinking pane's title "Thinking · N tok".
fn thinking_count(screen: &str) -> Option<usize> {
    let rest = &screen[screen.find(" Thinking · ")? + " Thinking · ".len()..];
    rest.split_whitespace().next()?.parse().ok()
}

#[test]
fn workbench_on_a_llama_cpp_server_in_tmux() {
    // `--alias`: the status bar shows the served model id, by default the GGUF's full path, which
    // would leave no room at 160 columns for the status message checked below.
    let server = LlamaServer::start_with(ServerConfig::new(Build::B10566).mtp(3).alias("demo"));
    let version = server.build_info();

    let dir = tempfile::tempdir().unwrap();
    let sessions = dir.path().join("sessions");
    let (data, config) = (dir.path().join("data"), dir.path().join("config"));
    for d in [&sessions, &data, &config] {
        std::fs::create_dir_all(d).unwrap();
    }
    let t = shell("remote");
    let launch = format!(
        "XDG_DATA_HOME={} XDG_CONFIG_HOME={} {} chat --server {} --sessions-dir {} --temperature 0; echo EXIT-CODE-$?",
        shell_quote(&data),
        shell_quote(&config),
        shell_quote(Path::new(env!("CARGO_BIN_EXE_deltascope"))),
        server.url,
        shell_quote(&sessions),
    );
    t.text(&launch);
    t.keys(&["Enter"]);
    let label = format!("llama.cpp {version} · {}", server.url);
    let s = t.wait("the workbench attached to the server", 20, |s| s.contains(&label) && s.contains("Type a question"));
    let status = s.lines().rfind(|l| l.contains(&label)).unwrap_or_default();
    assert!(status.contains("demo") && status.contains("idle"), "status bar: {status}");
    assert!(!s.contains("embedded:demo"), "not the local model:\n{s}");

    // Ask, and wait for the answer.
    t.text("Is 91 prime?");
    t.keys(&["Enter"]);
    let s = t.wait("the answer", 30, |s| s.contains("not prime") && s.contains("finish: stop"));
    assert!(s.contains("No, 91 = 7 × 13, so 91 is not prime."), "the greedy answer:\n{s}");
    // The thinking pane: its title with the token count, and the thinking itself.
    assert_eq!(thinking_count(&s), Some(71), "thinking pane title:\n{s}");
    assert!(s.contains("Check divisors up to the square root of 91.") && s.contains("7 divides 91."), "{s}");
    assert!(s.contains(" Answer · "), "{s}");
    assert!(s.contains("Token budget 94/1024"), "{s}");
    // The gauges: the server's MTP figures and where they came from; no memory figures.
    let mtp = s.lines().find(|l| l.contains("MTP depth 3")).unwrap_or_else(|| {
        panic!("no `MTP depth 3` line (depth 0 means the /metrics read after the stream failed):\n{s}")
    });
    assert!(mtp.contains("acc ") && mtp.contains('%') && mtp.contains("len "), "MTP line: {mtp}");
    assert!(s.lines().any(|l| l.contains("from llama.cpp")), "the figures' source:\n{s}");
    for d in ["d1 ", "d2 ", "d3 "] {
        assert!(s.lines().any(|l| l.contains(d) && l.contains('%')), "per-position bar {d}:\n{s}");
    }
    assert!(s.contains("Memory remote: not reported"), "{s}");

    // Step mode (Ctrl+S by default) cannot hold a server's stream.
    t.keys(&["C-s"]);
    let s = t.wait("the step mode refusal", 10, |s| s.contains("step mode is not available"));
    assert!(!s.contains("paused (step)"), "{s}");

    // Quit: the terminal is back.
    t.keys(&["C-q"]);
    let s = t.wait("the shell after quitting", 15, |s| s.lines().any(|l| l.trim() == "EXIT-CODE-0"));
    assert!(!s.contains("EXIT-CODE-1"), "{s}");
    t.assert_restored("Ctrl+Q");

    // The conversation was saved in --sessions-dir, with the server it ran on.
    let saved: Vec<_> = std::fs::read_dir(&sessions).unwrap().flatten().collect();
    assert_eq!(saved.len(), 1, "one saved session in {}", sessions.display());
    let raw = std::fs::read_to_string(saved[0].path()).unwrap();
    let session = deltascope::session::Session::load(&saved[0].path()).unwrap();
    assert_eq!(session.turns.len(), 1, "{raw}");
    let turn = &session.turns[0];
    assert_eq!(turn.user, "Is 91 prime?");
    assert_eq!(turn.finish_reason, Some(FinishReason::Stop), "{raw}");
    assert_eq!(turn.answer.trim(), "No, 91 = 7 × 13, so 91 is not prime.");
    let label = turn.server.as_ref().unwrap_or_else(|| panic!("no server in the saved turn: {raw}"));
    assert_eq!(label.kind, "llama.cpp");
    assert_eq!(label.version.as_deref(), Some(version.as_str()));
    assert_eq!(label.url, server.url);
    let json: serde_json::Value = serde_json::from_str(&raw).unwrap();
    assert!(json["turns"][0]["server"].is_object(), "a `server` object in the file: {raw}");
    assert_eq!(json["turns"][0]["finish_reason"], "stop");
    let m = turn.stats.mtp.as_ref().unwrap_or_else(|| panic!("no MTP figures saved: {raw}"));
    assert_eq!(m.depth, 3);
    assert!(m.drafted > 0 && m.accepted <= m.drafted, "{m:?}");
}
