//! End to end: the workbench's reference mode in tmux. `deltascope chat --server URL --reference
//! demo` against a real llama.cpp server (b11549) serving the demo GGUF, and against
//! `deltascope serve` on a copy of the demo with a broken GDN layer. Alt+V re-scores the shown
//! turn with the local reference: the healthy server's turn agrees; the broken one's diverges,
//! Alt+D puts the inspector on the first divergence with both sides' log-probabilities, and the
//! reference is still called the same model (it is: broken, not another) — models are told apart
//! by their sizes, parameters and weights, never by a served name or a GGUF file's name.
//!
//! Needs tmux (installed with apt-get when missing, else the test fails with a clear message) and
//! the servers of `scripts/setup-servers.sh` (run by the test). It never skips.

#[path = "common/llama_server.rs"]
mod llama_server;
#[path = "common/serve.rs"]
mod serve;
#[path = "common/tmux.rs"]
mod tmux;

use std::path::Path;

use llama_server::{Build, LlamaServer, ServerConfig};
use serve::{Serve, broken};
use tmux::{Tmux, shell, shell_quote};

/// The workbench on `url` with the demo as its reference, asked `question` at temperature 0;
/// returns once the answer is in.
fn ask(name: &str, dir: &Path, url: &str, question: &str) -> Tmux {
    let t = shell(name);
    let launch = format!(
        "XDG_DATA_HOME={d}/data XDG_CONFIG_HOME={d}/config {bin} chat --server {url} --reference demo --sessions-dir {d}/sessions --temperature 0; echo EXIT-CODE-$?",
        d = shell_quote(dir),
        bin = shell_quote(Path::new(env!("CARGO_BIN_EXE_deltascope"))),
    );
    t.text(&launch);
    t.keys(&["Enter"]);
    t.wait("the workbench attached, the reference loaded", 30, |s| {
        s.contains("Type a question") && s.contains("reference embedded:demo")
    });
    t.text(question);
    t.keys(&["Enter"]);
    t.wait("the answer", 60, |s| s.contains("finish: stop"));
    t
}

#[test]
fn a_healthy_server_agrees_and_a_broken_one_diverges_in_the_workbench() {
    let dir = tempfile::tempdir().unwrap();

    // llama.cpp serving the demo: every token agrees, and the reference is the same model.
    // No alias: llama.cpp names the model by its GGUF path, which is no model name to compare.
    let llama = LlamaServer::start_with(ServerConfig::new(Build::B11549));
    let t = ask("reference-llama", dir.path(), &llama.url, "What is 482 + 739?");
    t.keys(&["M-v"]);
    let s = t.wait("the reference's verdict", 60, |s| s.contains("verdict  agrees"));
    assert!(s.contains("demo.gguf · turn 1"), "the subject's column:\n{s}");
    assert!(s.contains("prompt   the server's is the same"), "llama.cpp's /apply-template + /tokenize:\n{s}");
    assert!(s.contains(" 0 drift · 0 diverge"), "{s}");
    assert!(!s.contains("not the same model"), "{s}");
    // The inspector on the last token: both log-probabilities side by side.
    t.keys(&["C-g"]);
    let s = t.wait("the token from both sides", 10, |s| s.contains("top-5   server"));
    let row = s.lines().find_map(|l| l.split_once("logprob  ")).map(|(_, r)| r.split('│').next().unwrap_or(r));
    let values: Vec<f32> = row.unwrap_or_default().split_whitespace().filter_map(|v| v.parse().ok()).collect();
    assert_eq!(values.len(), 2, "the server's and the reference's logprob: {row:?}\n{s}");
    t.keys(&["C-q"]);
    t.wait("the workbench quit", 10, |s| s.contains("EXIT-CODE-0"));
    drop(llama);

    // deltascope serve on a copy whose GDN layer 1 writes 3× its output: diverges.
    let bad = broken(dir.path(), "gdn-out-proj", "model.layers.1.linear_attn.out_proj.weight", &["--scale", "3"]);
    let server = Serve::start(Some(&bad));
    let t = ask("reference-broken", dir.path(), &server.1, "What is 482 + 739?");
    t.keys(&["M-v"]);
    let s = t.wait("the divergence", 60, |s| s.contains("DIVERGES at token #"));
    let at: usize = s[s.find("DIVERGES at token #").unwrap() + "DIVERGES at token #".len()..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // The same model broken, not another model: the server's /v1/models says the demo's sizes,
    // parameters and embedding fingerprint (the copy's served name is its folder's).
    assert!(!s.contains("not the same model"), "the status bar:\n{s}");
    t.keys(&["M-d"]);
    // The verdict line already reads "token #N", so wait for the inspector's own rows: the
    // top-5 table of both sides, on the token the inspector names.
    let s = t.wait("the inspector on the first divergence", 10, |s| s.contains("top-5   server"));
    let line = s
        .lines()
        .find(|l| l.contains(&format!("token #{at} ")) && !l.contains("verdict"))
        .unwrap_or_else(|| panic!("the inspector names token #{at}:\n{s}"));
    assert!(line.contains("DIVERGES"), "{line}");
    t.keys(&["C-q"]);
    t.wait("the workbench quit", 10, |s| s.contains("EXIT-CODE-0"));
}
