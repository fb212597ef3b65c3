//! The headless commands when things go wrong or get big, through the real binary: signals
//! during `run`, `sweep` and `bench` (the finished work printed, the exit status naming the
//! signal), a closed stdout, prompts from a file or standard input, and settings out of range
//! named by where they came from.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_deltascope"))
}

fn demo_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/demo")
}

fn signal(child: &Child, sig: &str) {
    let status = Command::new("kill").args([&format!("-{sig}"), &child.id().to_string()]).status().unwrap();
    assert!(status.success());
}

/// Runs the binary, expecting failure; returns stderr.
fn fails(args: &[&str]) -> String {
    let out = bin().args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// Ctrl+C, SIGTERM and SIGHUP during `run` cancel the generation: the output so far and the
/// `done` event are printed, and the status is 128 + the signal (130, 143, 129).
#[test]
fn run_exits_with_the_signal_it_got() {
    for (sig, code) in [("INT", 130), ("TERM", 143), ("HUP", 129)] {
        // A raw prompt on the demo model: it does not reach a stop token for a long time.
        let mut child = bin()
            .args(["run", "--prompt", "Sort", "--raw", "--max-tokens", "3000", "--temperature", "0", "--json"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut tokens = 0;
        while tokens < 5 {
            tokens += lines.next().unwrap().unwrap().contains("\"event\":\"token\"") as usize;
        }
        signal(&child, sig);
        let rest: Vec<Value> = lines.map(|l| serde_json::from_str(&l.unwrap()).unwrap()).collect();
        let done = rest.last().unwrap();
        assert_eq!((&done["event"], &done["finish_reason"]), (&"done".into(), &"cancelled".into()), "SIG{sig}");
        let generated = done["usage"]["completion_tokens"].as_u64().unwrap();
        assert!((5..3000).contains(&generated), "SIG{sig}: {generated}");
        assert_eq!(child.wait().unwrap().code(), Some(code), "SIG{sig}");
    }
}

/// Waits until `stderr` (piped) has shown `n` lines containing `marker`; returns them all.
fn wait_for_lines(child: &mut Child, marker: &str, n: usize) -> Vec<String> {
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut seen = vec![];
    while seen.iter().filter(|l: &&String| l.contains(marker)).count() < n {
        seen.push(lines.next().expect("stderr ended early").unwrap());
    }
    // Keep draining in the background so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    seen
}

/// Ctrl+C (or SIGTERM) during `sweep` cancels the run in flight and prints the table, the JSON
/// and the plot of every run that finished; the status says which signal stopped it.
#[test]
fn an_interrupted_sweep_prints_every_finished_run() {
    let dir = tempfile::tempdir().unwrap();
    let plot = dir.path().join("sweep.svg");
    for (sig, code, json) in [("TERM", 143, true), ("INT", 130, false)] {
        let mut args = vec![
            "sweep",
            "--prompt",
            "What is 482 + 739?",
            "--thinking-budgets",
            "8,-1",
            "--repeat",
            "100",
            "--temperature",
            "0.6",
            "--plot",
        ];
        args.push(plot.to_str().unwrap());
        if json {
            args.push("--json");
        }
        let mut child = bin().args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // Without --json each finished run is reported on stderr; with it, wait a little.
        if json {
            std::thread::sleep(std::time::Duration::from_millis(5000));
        } else {
            wait_for_lines(&mut child, "budget", 3);
        }
        signal(&child, sig);
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(code), "SIG{sig}");
        let stdout = String::from_utf8(out.stdout).unwrap();
        if json {
            let v: Value = serde_json::from_str(stdout.trim()).unwrap();
            let runs = v["runs"].as_array().unwrap().len();
            assert!((1..200).contains(&runs), "{runs} runs");
            assert_eq!(v["interrupted"]["signal"], "SIGTERM");
            assert_eq!(v["interrupted"]["completed_runs"], runs);
            assert_eq!(v["interrupted"]["planned_runs"], 200);
            // Every run listed finished (the cancelled one is left out), and the summary agrees.
            assert!(v["runs"].as_array().unwrap().iter().all(|r| r["finish_reason"] != "cancelled"));
            let summarised: u64 = v["summary"].as_array().unwrap().iter().map(|s| s["runs"].as_u64().unwrap()).sum();
            assert_eq!(summarised as usize, runs);
        } else {
            let rows = stdout.lines().filter(|l| l.trim_start().starts_with("8 ")).count();
            assert!(rows >= 3, "{stdout}");
            assert!(stdout.contains("mean thinking"), "{stdout}");
        }
        let svg = std::fs::read_to_string(&plot).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "SIG{sig}");
        // One bar per budget that has a finished run, none for a budget that never ran.
        let bars = svg.matches("<title>thinking ").count();
        if json {
            let v: Value = serde_json::from_str(stdout.trim()).unwrap();
            assert_eq!(bars, v["summary"].as_array().unwrap().len(), "SIG{sig}: {svg}");
        } else {
            // Stopped after 3 of budget 8's 100 runs: budget -1 never ran.
            assert_eq!(bars, 1, "SIG{sig}: {svg}");
            assert!(
                !stdout.lines().any(|l| l.trim_start().starts_with("∞ ") || l.trim_start().starts_with("-1 ")),
                "{stdout}"
            );
        }
        std::fs::remove_file(&plot).unwrap();
    }
}

/// The same for `bench`: the passes measured before the signal are printed, with the number
/// of passes behind each setting's figures; the pass in flight is left out.
#[test]
fn an_interrupted_bench_prints_what_it_measured() {
    let mut child = bin()
        .args(["bench", "--mtp", "0,1,2,3,4", "--repeat", "4", "--max-tokens", "64"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Each pass reports on stderr; the rounds interleave the settings after one warm-up round.
    let seen = wait_for_lines(&mut child, "round 1 mtp 1:", 1);
    assert!(seen.iter().filter(|l| l.starts_with("warm-up 1 mtp ")).count() == 5, "{seen:?}");
    signal(&child, "INT");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    let table = String::from_utf8(out.stdout).unwrap();
    // The CPU, threads and weights lines, the title and the column heads come first.
    let rows: Vec<&str> =
        table.lines().skip_while(|l| !l.contains("decode/s")).skip(1).filter(|l| !l.starts_with('≈')).collect();
    assert!(!rows.is_empty() && rows.len() <= 5, "{table}");
    // Settings 0 and 1 finished a pass or two; none finished all four.
    assert!(rows[0].trim_start().starts_with("0 ") && rows[1].trim_start().starts_with("1 "), "{table}");
    let passes = |r: &str| r.split_whitespace().last().unwrap().parse::<usize>().unwrap();
    assert!(rows.iter().all(|r| (1..4).contains(&passes(r))), "{table}");
}

/// `| head -1` closes stdout: the command ends quietly (no "Broken pipe" error, status 0).
#[test]
fn a_closed_stdout_ends_quietly() {
    let script = format!(
        "\"{}\" run --device cpu --prompt 'Sort 5, 2, 9, 1.' --json 2>\"$1\" | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}",
        env!("CARGO_BIN_EXE_deltascope")
    );
    let dir = tempfile::tempdir().unwrap();
    let err = dir.path().join("stderr");
    let out = Command::new("bash").args(["-c", &script, "sh"]).arg(&err).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0");
    assert_eq!(std::fs::read_to_string(&err).unwrap(), "");
}

#[test]
fn bench_with_zero_repeats_is_an_error_not_a_panic() {
    assert!(fails(&["bench", "--repeat", "0"]).contains("--repeat must be at least 1"));
    assert!(fails(&["bench", "--max-tokens", "0"]).contains("--max-tokens must be at least 1"));
    let err = fails(&["bench", "--mtp", "0,9"]);
    assert!(err.contains("--mtp 9: must be 0 (off) to 4 draft steps, or auto"), "{err}");
    assert!(fails(&["bench", "--mtp", "two"]).contains("--mtp two: expected a number of draft steps or auto"));
    assert!(fails(&["run", "--prompt", "x", "--threads", "0"]).contains("--threads 0: must be at least 1"));
    let err = fails(&["bench", "--prompt-len", "4000"]);
    assert!(
        err.contains("--prompt-len 4000 with --max-tokens 256: 4256 tokens, more than the model's context of 4096"),
        "{err}"
    );
    assert!(fails(&["sweep", "--prompt", "x", "--repeat", "0"]).contains("--repeat must be at least 1"));
}

/// Prompts too long for a command line (Linux caps one argument at 128 KiB) come from a file
/// or standard input; one final line break is dropped.
#[test]
fn prompts_from_a_file_or_standard_input() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.txt");
    let text = "Is 91 prime? ".repeat(16_000) + "Done.";
    std::fs::write(&big, format!("{text}\n")).unwrap();
    let out = bin().args(["run", "--dry-run", "--json", "--prompt-file"]).arg(&big).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["prompt"].as_str().unwrap().contains(&format!("user\n{text}<|im_end|>")));
    assert!(v["prompt_tokens"].as_u64().unwrap() > 100_000);
    // Without the template the text is used as it is: the file's final line break is dropped.
    let raw = dir.path().join("raw.txt");
    std::fs::write(&raw, "Sort\n\n1, 2\n").unwrap();
    let out = bin().args(["run", "--dry-run", "--json", "--raw", "--prompt-file"]).arg(&raw).output().unwrap();
    assert_eq!(serde_json::from_slice::<Value>(&out.stdout).unwrap()["prompt"], "Sort\n\n1, 2");
    // Generating from it is a clear context error, not a crash.
    let err = fails(&["run", "--prompt-file", big.to_str().unwrap()]);
    assert!(err.contains("context"), "{err}");

    // Standard input: the same ids as the flag.
    let ids = |args: &[&str], stdin: Option<&str>| -> Value {
        let mut child = bin().args(args).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        child.stdin.take().unwrap().write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["ids"].clone()
    };
    let by_flag = ids(&["run", "--dry-run", "--json", "--prompt", "Is 91 prime?"], None);
    assert_eq!(ids(&["run", "--dry-run", "--json", "--prompt", "-"], Some("Is 91 prime?\n")), by_flag);

    // sweep and bench read files too.
    let small = dir.path().join("q.txt");
    std::fs::write(&small, "What is 482 + 739?\n").unwrap();
    let out =
        bin().args(["sweep", "--thinking-budgets", "-1", "--json", "--prompt-file"]).arg(&small).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(serde_json::from_slice::<Value>(&out.stdout).unwrap()["prompt"], "What is 482 + 739?");
    let out = bin()
        .args(["bench", "--mtp", "0", "--repeat", "1", "--max-tokens", "8", "--json", "--prompt-file"])
        .arg(&small)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["prompts"],
        serde_json::json!(["What is 482 + 739?"])
    );

    // Bad input names itself.
    let missing = dir.path().join("missing.txt");
    let err = fails(&["run", "--prompt-file", missing.to_str().unwrap()]);
    assert!(err.contains(&format!("--prompt-file {}: cannot read it", missing.display())), "{err}");
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "\n").unwrap();
    let err = fails(&["run", "--prompt-file", empty.to_str().unwrap()]);
    assert!(err.contains(&format!("the prompt from {} is empty", empty.display())), "{err}");
}

/// A copy of the demo model with its generation_config.json replaced.
fn demo_with_generation_config(dir: &Path, json: &str) -> PathBuf {
    let m = dir.join("demo");
    std::fs::create_dir_all(&m).unwrap();
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(demo_dir().join(f), m.join(f)).unwrap();
    }
    std::fs::write(m.join("generation_config.json"), json).unwrap();
    m
}

/// A value out of range is blamed on where it came from: generation_config.json (file and
/// field), or the flag the user passed — never a flag the user did not pass.
#[test]
fn settings_out_of_range_name_their_source() {
    let dir = tempfile::tempdir().unwrap();
    for (json, message) in [
        (r#"{"do_sample": true, "temperature": -5}"#, "field `temperature`: -5: must be in [0, 100] (0 is greedy)"),
        (r#"{"top_p": 7}"#, "field `top_p`: 7: must be in (0, 1]"),
        (r#"{"do_sample": "yes"}"#, "field `do_sample`: \"yes\": must be true or false"),
    ] {
        let m = demo_with_generation_config(dir.path(), json);
        let err = fails(&["run", "--model", m.to_str().unwrap(), "--prompt", "Is 91 prime?"]);
        let file = m.join("generation_config.json");
        assert!(err.contains(&format!("{}: {message}", file.display())), "{err}");
        assert!(!err.contains("--"), "a flag the user did not pass is blamed: {err}");
    }
    let err = fails(&["run", "--prompt", "Is 91 prime?", "--top-p", "7"]);
    assert!(err.contains("--top-p 7: must be in (0, 1]"), "{err}");
    let err = fails(&["run", "--prompt", "Is 91 prime?", "--temperature=-1"]);
    assert!(err.contains("--temperature -1: must be in [0, 100] (0 is greedy)"), "{err}");
}
