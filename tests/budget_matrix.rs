//! One generation protocol, one set of numbers: the same greedy request with thinking budgets
//! 0, 8, 16, 32 and unlimited on the in-process engine, on `deltascope serve` (through
//! `--server`), and on the real llama.cpp servers b10566 and b11549 (their own budget field, and
//! `--budget-mode client`) reports the same thinking tokens (the budget when forced), the same
//! forced tokens (the bridge and `</think>`, counted apart from thinking and answer), answers of
//! the same length, `completion_tokens` = thinking + forced + answer, and the same diagnostics.
//! Client-side forcing continues from the engine's exact token ids, so its answer is the
//! engine's token for token. (That decode speeds come from the tokens' arrivals is checked with a
//! paced stream in `tests/remote_replay.rs` and in the tally's own tests: a burst of frames
//! from a fast server arrives faster than this test could time it.)
//!
//! One difference is the server's own and is asserted as such: llama.cpp b11549 forces a newline
//! before `</think>` (one more forced token, logprob ≈ −16), so the model answers from another
//! context there.

#[path = "common/llama_server.rs"]
mod llama_server;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use llama_server::{Build, LlamaServer};
use serde_json::Value;

const PROMPT: &str = "What is 482 + 739?";
const BUDGETS: [i64; 5] = [0, 8, 16, 32, -1];

/// A `deltascope serve` on a free port, killed when dropped.
struct Serve {
    child: Child,
    url: String,
}

impl Serve {
    fn start() -> Serve {
        let mut child = Command::new(env!("CARGO_BIN_EXE_deltascope"))
            .args(["serve", "--port", "0", "--device", "cpu", "--dtype", "f32"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting deltascope serve");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let url = loop {
            let line = lines.next().expect("serve exited before listening").expect("reading stdout");
            if let Some(rest) = line.split(" on http://").nth(1) {
                break format!("http://{}", rest.split_whitespace().next().expect("an address"));
            }
        };
        std::thread::spawn(move || for _ in lines {});
        Serve { child, url }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `run --json`: its events.
struct Run {
    who: String,
    events: Vec<Value>,
}

impl Run {
    fn done(&self) -> &Value {
        let d = self.events.last().expect("events");
        assert_eq!(d["event"], "done", "{}: the last event is done: {d}", self.who);
        d
    }

    fn usage(&self, key: &str) -> u64 {
        self.done()["usage"][key].as_u64().unwrap_or_else(|| panic!("{}: no usage.{key}", self.who))
    }

    fn tokens(&self) -> Vec<&Value> {
        self.events.iter().filter(|e| e["event"] == "token").collect()
    }

    /// The diagnostics' kinds, in order, with the token each names.
    fn diagnostics(&self) -> Vec<(String, u64)> {
        self.events
            .iter()
            .filter(|e| e["event"] == "diagnostic")
            .map(|e| (e["kind"].as_str().unwrap_or("").to_string(), e["at_token"].as_u64().unwrap_or(u64::MAX)))
            .collect()
    }

    fn answer(&self) -> String {
        self.done()["answer"].as_str().expect("answer").trim().to_string()
    }

    /// The answer's token ids (the streamed tokens after thinking; a server does not stream the
    /// end token, which has no text).
    fn answer_ids(&self) -> Vec<u64> {
        let answer = self.tokens().into_iter().filter(|t| t["phase"] == "answer" && t["text"] != "");
        answer.filter_map(|t| t["id"].as_u64()).collect()
    }
}

/// `run --prompt PROMPT --temperature 0 --thinking-budget B --json EXTRA…`.
fn run(who: &str, budget: i64, extra: &[&str]) -> Run {
    let b = budget.to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args([
            "run",
            "--prompt",
            PROMPT,
            "--temperature",
            "0",
            "--thinking-budget",
            &b,
            "--json",
            "--top-logprobs",
            "1",
        ])
        .args(extra)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running deltascope");
    let stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut events = vec![];
    for line in stdout.lines() {
        let line = line.expect("reading stdout");
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{who}: not JSON ({e}): {line}"));
        events.push(v);
    }
    let out = child.wait_with_output().expect("waiting for deltascope");
    assert!(out.status.success(), "{who} budget {budget}: {}", String::from_utf8_lossy(&out.stderr));
    Run { who: format!("{who}, budget {budget}"), events }
}

/// What every backend must report the same.
fn same_numbers(r: &Run, local: &Run, budget: i64) {
    let who = &r.who;
    let (t, f, a, c) =
        (r.usage("thinking_tokens"), r.usage("forced_tokens"), r.usage("answer_tokens"), r.usage("completion_tokens"));
    assert_eq!(c, t + f + a, "{who}: completion = thinking + forced + answer: {}", r.done());
    if budget > 0 {
        assert_eq!(t, budget as u64, "{who}: thinking tokens = the budget: {}", r.done());
    }
    assert_eq!(t, local.usage("thinking_tokens"), "{who}: thinking as the engine: {}", r.done());
    assert_eq!(f, local.usage("forced_tokens"), "{who}: forced as the engine: {}", r.done());
    assert_eq!(a, local.usage("answer_tokens"), "{who}: answer as the engine: {}", r.done());
    assert_eq!(r.diagnostics(), local.diagnostics(), "{who}: the engine's diagnostics");
    assert_eq!(r.answer(), local.answer(), "{who}: the engine's answer");
}

/// A decode speed was measured (every run here streams more than one token).
fn has_speed(r: &Run) {
    let rate = r.done()["timing"]["decode_tok_s"].as_f64().expect("decode_tok_s");
    assert!(rate.is_finite() && rate > 0.0, "{}: decode {rate} tok/s", r.who);
}

#[test]
fn every_backend_reports_the_same_numbers() {
    let serve = Serve::start();
    let servers =
        [(Build::B10566, LlamaServer::start(Build::B10566)), (Build::B11549, LlamaServer::start(Build::B11549))];
    for budget in BUDGETS {
        // f32 activations, as llama.cpp computes: the token-for-token comparisons below hold
        // only between engines doing the same math (`--dtype auto` would run the bf16 demo in bf16).
        let local = run("local engine", budget, &["--dtype", "f32"]);
        if budget > 0 {
            let forced = local.diagnostics();
            assert_eq!(forced, [("thinking_budget_forced".to_string(), budget as u64)], "{}", local.who);
        }
        has_speed(&local);
        let over_serve = run("deltascope serve", budget, &["--server", &serve.url]);
        same_numbers(&over_serve, &local, budget);
        has_speed(&over_serve);
        for (build, server) in &servers {
            let client = run(
                &format!("{} --budget-mode client", build.name()),
                budget,
                &["--server", &server.url, "--budget-mode", "client"],
            );
            same_numbers(&client, &local, budget);
            if budget > 0 {
                // Forced client-side from the engine's token ids: the engine's answer, token for token.
                assert_eq!(client.answer_ids(), local.answer_ids(), "{}", client.who);
            }
            has_speed(&client);
            let own = run(build.name(), budget, &["--server", &server.url]);
            has_speed(&own);
            if *build == Build::B11549 && budget > 0 {
                // Its extra forced newline before `</think>`: one more forced token, the rest
                // counted alike.
                let d = own.done();
                assert_eq!(own.usage("thinking_tokens"), budget as u64, "{}: {d}", own.who);
                assert_eq!(own.usage("forced_tokens"), local.usage("forced_tokens") + 1, "{}: {d}", own.who);
                assert_eq!(
                    own.usage("completion_tokens"),
                    own.usage("thinking_tokens") + own.usage("forced_tokens") + own.usage("answer_tokens"),
                    "{}: {d}",
                    own.who
                );
                assert_eq!(own.diagnostics(), local.diagnostics(), "{}", own.who);
                let forced: Vec<&str> = own
                    .tokens()
                    .iter()
                    .filter(|t| t["forced"] == true)
                    .map(|t| t["text"].as_str().unwrap_or(""))
                    .collect();
                assert_eq!(forced.last(), Some(&"\n"), "{}: the newline it forces: {forced:?}", own.who);
            } else {
                same_numbers(&own, &local, budget);
            }
        }
    }
}

/// `sweep --server` prints the local sweep's table (all but the speed column).
#[test]
fn sweep_on_a_server_prints_the_local_table() {
    let serve = Serve::start();
    let server = LlamaServer::start(Build::B10566);
    let sweep = |extra: &[&str]| {
        let mut args = vec!["sweep", "--prompt", PROMPT, "--thinking-budgets", "0,8,16,32,-1", "--temperature", "0"];
        args.extend_from_slice(extra);
        let ran = llama_server::deltascope(&args);
        assert!(ran.success(), "sweep {extra:?}: {}", ran.stderr);
        // The table: the header and one row per run, without the last (tok/s) column.
        let rows: Vec<String> = ran
            .stdout
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("budget  seed"))
            .take(1 + BUDGETS.len())
            .map(|l| {
                l.split_whitespace()
                    .collect::<Vec<_>>()
                    .split_last()
                    .map(|(_, rest)| rest.join(" "))
                    .unwrap_or_default()
            })
            .collect();
        assert_eq!(rows.len(), 1 + BUDGETS.len(), "sweep {extra:?}:\n{}", ran.stdout);
        rows
    };
    let local = sweep(&[]);
    assert_eq!(local[2], "8 0 8 17 stop 52 -", "the local row for budget 8: {local:?}");
    assert_eq!(sweep(&["--server", &serve.url]), local, "deltascope serve");
    assert_eq!(sweep(&["--server", &server.url]), local, "llama.cpp b10566");
}
