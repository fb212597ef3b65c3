//! The headless commands end to end, through the real binary: `run --json` events, `run
//! --dry-run`, `logits --json`, `inspect`.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name).display().to_string()
}

fn ok(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope")).args(args).output().unwrap();
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn events(args: &[&str]) -> Vec<Value> {
    ok(args).lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}"))).collect()
}

fn golden(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(PathBuf::from(fixture(name)).join("golden.json")).unwrap()).unwrap()
}

#[test]
fn run_json_emits_start_tokens_and_done() {
    let m = fixture("qwen3_5_vl");
    let ev = events(&[
        "run",
        "--model",
        &m,
        "--prompt",
        "Hello, what is 2 + 2?",
        "--max-tokens",
        "8",
        "--mtp",
        "0",
        "--json",
    ]);
    assert_eq!(ev[0]["event"], "start");
    assert_eq!(ev[0]["prompt_tokens"], 31);
    // The prompt ends inside `<think>`: generation starts in the thinking phase.
    assert_eq!(ev[0]["phase"], "thinking");
    assert_eq!(ev[0]["params"]["max_tokens"], 8);
    let tokens: Vec<&Value> = ev.iter().filter(|e| e["event"] == "token").collect();
    assert_eq!(tokens.len(), 8);
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(t["index"], i);
        assert!(t["id"].is_u64() && t["logprob"].as_f64().unwrap() <= 0.0);
        assert_eq!(t["draft"], "none");
        assert_eq!(t["forced"], false);
        assert!(t["phase"] == "thinking" || t["phase"] == "answer");
    }
    let done = ev.last().unwrap();
    assert_eq!(done["event"], "done");
    assert_eq!(done["finish_reason"], "length");
    let u = &done["usage"];
    assert_eq!(u["prompt_tokens"], 31);
    assert_eq!(u["completion_tokens"], 8);
    assert_eq!(u["thinking_tokens"].as_u64().unwrap() + u["answer_tokens"].as_u64().unwrap(), 8);
    assert!(done["timing"]["ttft_ms"].as_f64().unwrap() > 0.0);
    assert!(done["timing"]["decode_tok_s"].as_f64().unwrap() > 0.0);
    assert!(done["memory"]["weights_bytes"].as_u64().unwrap() > 0);
    assert!(
        done["memory"]["kv_bytes"].as_u64().unwrap() > 0 && done["memory"]["recurrent_bytes"].as_u64().unwrap() > 0
    );
    // The token texts reassemble the thinking and the answer.
    let text: String = tokens.iter().map(|t| t["text"].as_str().unwrap()).collect();
    assert_eq!(text, format!("{}{}", done["thinking"].as_str().unwrap(), done["answer"].as_str().unwrap()));
}

#[test]
fn run_greedy_reproduces_the_reference_continuation() {
    // End to end through the engine thread: greedy tokens == transformers' (f32).
    let g = golden("qwen3_next");
    let p = &g["prompts"][3]; // long_raw: prefill crosses five 64-token chunks
    let ids: Vec<String> = p["ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
    let want: Vec<u64> = p["f32"]["greedy"].as_array().unwrap().iter().map(|s| s["id"].as_u64().unwrap()).collect();
    let m = fixture("qwen3_next");
    let ev = events(&[
        "run",
        "--model",
        &m,
        "--prompt-ids",
        &ids.join(","),
        "--max-tokens",
        "32",
        "--temperature",
        "0",
        "--json",
    ]);
    let got: Vec<u64> = ev.iter().filter(|e| e["event"] == "token").map(|e| e["id"].as_u64().unwrap()).collect();
    // The reference never stops (no EOS); ours stops at a stop id, so compare up to there.
    assert_eq!(got[..], want[..got.len()]);
    let done = ev.last().unwrap();
    if got.len() < 32 {
        assert_eq!(done["finish_reason"], "stop");
    } else {
        assert_eq!(done["finish_reason"], "length");
    }
}

#[test]
fn no_think_starts_in_the_answer_phase() {
    let m = fixture("qwen3_5_vl");
    let ev = events(&["run", "--model", &m, "--prompt", "Hi", "--no-think", "--max-tokens", "3", "--json"]);
    assert_eq!(ev[0]["phase"], "answer");
    let dry = ok(&["run", "--model", &m, "--prompt", "Hi", "--no-think", "--dry-run"]);
    assert!(dry.contains("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{dry}");
}

#[test]
fn dry_run_shows_the_rendered_prompt_and_ids() {
    let m = fixture("qwen3_5_vl");
    let out = ok(&["run", "--model", &m, "--prompt", "Is 91 prime?", "--system", "Be brief.", "--dry-run"]);
    assert!(out.contains("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nIs 91 prime?<|im_end|>\n<|im_start|>assistant\n<think>\n"), "{out}");
    assert!(out.contains("chat_template.jinja"), "names the template source: {out}");
    let v: Value =
        serde_json::from_str(ok(&["run", "--model", &m, "--prompt", "Is 91 prime?", "--dry-run", "--json"]).trim())
            .unwrap();
    let n = v["ids"].as_array().unwrap().len();
    assert_eq!(v["prompt_tokens"], n);
    assert!(v["prompt"].as_str().unwrap().ends_with("<think>\n"));
    // --raw skips the template.
    let v: Value = serde_json::from_str(
        ok(&["run", "--model", &m, "--prompt", "plain text", "--raw", "--dry-run", "--json"]).trim(),
    )
    .unwrap();
    assert_eq!(v["prompt"], "plain text");
}

#[test]
fn logits_json_matches_the_reference() {
    let g = golden("qwen3_5_moe");
    let p = &g["prompts"][0]; // chat_think: "Hello, what is 2 + 2?" through the template
    let m = fixture("qwen3_5_moe");
    let v: Value = serde_json::from_str(
        // The golden logits are transformers' f32: the exact mode, named (not left to `auto`).
        ok(&["logits", "--model", &m, "--dtype", "f32", "--text", "Hello, what is 2 + 2?", "--top", "20", "--json"])
            .trim(),
    )
    .unwrap();
    assert_eq!(v["ids"], p["ids"]);
    let top = v["top"].as_array().unwrap();
    assert_eq!(top.len(), 20);
    let want = p["f32"]["top20"].as_array().unwrap();
    for (ours, theirs) in top.iter().zip(want) {
        assert_eq!(ours["id"], theirs[0]);
        assert!((ours["logit"].as_f64().unwrap() - theirs[1].as_f64().unwrap()).abs() < 1e-4);
        assert!(ours["text"].is_string());
    }
    // Sorted, highest first.
    assert!(top.windows(2).all(|w| w[0]["logit"].as_f64() >= w[1]["logit"].as_f64()));
    // The same through --ids and --raw.
    let ids: Vec<String> = p["ids"].as_array().unwrap().iter().map(|v| v.to_string()).collect();
    let v2: Value = serde_json::from_str(
        ok(&["logits", "--model", &m, "--dtype", "f32", "--ids", &ids.join(","), "--top", "3", "--json"]).trim(),
    )
    .unwrap();
    assert_eq!(v2["top"][0], top[0]);
    let human = ok(&["logits", "--model", &m, "--text", "Hello", "--top", "3"]);
    assert!(human.contains("rank") && human.lines().count() == 5, "{human}");
}

#[test]
fn inspect_qwen36_27b_from_config_alone() {
    let cfg = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/qwen3_6_27b");
    let out = ok(&["inspect", "--model", cfg.to_str().unwrap()]);
    for want in [
        "64: 48 GDN + 16 full attention",
        "GGGA GGGA",
        "24 Q / 4 KV heads × 256 (GQA 6)",
        "16 QK / 48 V heads × 128/128 (ratio 3)",
        "26.90 billion (26,895,998,464)",
        "53.79 GB (50.10 GiB) as bf16",
        "64.00 KiB / token",
        "32k 2.00 GiB",
        "262144 16.00 GiB",
        "146.81 MiB / sequence",
        "conv 61440 B bf16 + SSM 3145728 B f32",
        "MTP cost     424.70 million params",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
    let v: Value =
        serde_json::from_str(&ok(&["inspect", "--model", cfg.join("config.json").to_str().unwrap(), "--json"]))
            .unwrap();
    assert_eq!(v["plan_bf16"]["params"]["total"], 26_895_998_464u64);
    assert_eq!(v["plan_bf16"]["recurrent_bytes_per_sequence"], 153_944_064u64);
    assert_eq!(v["weights_found"], false);
}

#[test]
fn inspect_sees_mtp_tensors_in_a_checkpoint() {
    let out = ok(&["inspect", "--model", &fixture("qwen3_5_vl")]);
    assert!(out.contains("MTP          present"), "{out}");
    let out = ok(&["inspect", "--model", &fixture("qwen3_next")]);
    assert!(out.contains("ggGa") && out.contains("MTP          absent"), "{out}");
}

#[test]
fn builtin_chatml_when_the_model_ships_no_template() {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(fixture("qwen3_5_vl")).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "chat_template.jinja" {
            std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
        }
    }
    let m = dir.path().to_str().unwrap();
    let out = ok(&["run", "--model", m, "--prompt", " Hi ", "--system", "Be brief.", "--dry-run"]);
    assert!(out.contains("built-in ChatML"), "{out}");
    assert!(out.contains("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n---"), "{out}");
    let out = ok(&["run", "--model", m, "--prompt", "Hi", "--no-think", "--dry-run"]);
    assert!(out.contains("<|im_start|>assistant\n<think>\n\n</think>\n\n\n---"), "{out}");
}

// --- Generation control through `run` and `sweep`, on the embedded demo model ----------------

#[test]
fn run_defaults_to_the_embedded_demo_model() {
    let ev = events(&["run", "--prompt", "Is 91 prime?", "--temperature", "0", "--json"]);
    assert_eq!(ev[0]["model"], "embedded:demo");
    let done = ev.last().unwrap();
    assert_eq!(done["finish_reason"], "stop");
    assert!(done["answer"].as_str().unwrap().contains("91 is not prime"), "{done}");
    // `--model demo` names it explicitly.
    let ev = events(&["run", "--model", "demo", "--prompt", "Is 97 prime?", "--temperature", "0", "--json"]);
    assert!(ev.last().unwrap()["answer"].as_str().unwrap().contains("97 is prime"));
}

/// Without a prompt flag, piped standard input is the prompt; with none at all the error lists
/// every way to give one. With the thinking elsewhere, stdout is the answer from its first line.
#[test]
fn run_takes_its_prompt_from_a_pipe_and_says_every_way_to_give_one() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let bin = env!("CARGO_BIN_EXE_deltascope");
    let mut child = Command::new(bin)
        .args(["run", "--thinking-to", "none", "--temperature", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"Is 91 prime?\n").unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.starts_with("No, 91 = 7 × 13"), "no blank lines before the answer: {stdout:?}");
    let out = Command::new(bin).args(["run"]).stdin(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for way in ["--prompt TEXT", "--prompt-file FILE", "--prompt-ids", "pipe it in", "standard input was empty"] {
        assert!(err.contains(way), "{way}: {err}");
    }
    let out = Command::new(bin).args(["sweep", "--thinking-budgets", "0"]).stdin(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--prompt-file FILE") && !err.contains("--prompt-ids"), "{err}");
}

/// `sweep --on-loop off,answer` at the shipped `degenerate-loop` session's settings: each value
/// a row, the rescued run answering where the plain one is empty; `run` takes one value and says
/// where a list goes; a value that is not off / stop / answer is named.
#[test]
fn sweep_compares_on_loop_values_and_run_takes_one() {
    let looping =
        ["--prompt", "What is 482 + 739?", "--max-tokens", "400", "--temperature", "0", "--repetition-penalty", "0.4"];
    let mut args = vec!["sweep", "--thinking-budgets", "-1", "--on-loop", "off,answer", "--json"];
    args.extend(looping);
    let v: Value = serde_json::from_str(ok(&args).trim()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    let row = |on_loop: &str| runs.iter().find(|r| r["on_loop"] == on_loop).unwrap_or_else(|| panic!("{on_loop}: {v}"));
    let (off, answer) = (row("off"), row("answer"));
    assert_eq!((off["finish_reason"].as_str(), off["rescued"].as_bool()), (Some("length"), Some(false)), "{off}");
    assert_eq!(off["answer"], "", "{off}");
    // Rescued and answering (at a penalty that rewards repeats the answer may loop too, and a
    // loop in the answer stops: finish `loop`, the answer kept; or run to max_tokens).
    assert_eq!(answer["rescued"].as_bool(), Some(true), "{answer}");
    assert!(["stop", "length", "loop"].contains(&answer["finish_reason"].as_str().unwrap_or("")), "{answer}");
    assert!(!answer["answer"].as_str().unwrap().trim().is_empty(), "{answer}");
    let summary = v["summary"].as_array().unwrap();
    let answered: Vec<(String, u64)> =
        summary.iter().map(|s| (s["on_loop"].as_str().unwrap().to_string(), s["answered"].as_u64().unwrap())).collect();
    assert_eq!(answered, [("off".to_string(), 0), ("answer".to_string(), 1)], "{v}");
    // The table has the column.
    let mut args = vec!["sweep", "--thinking-budgets", "-1", "--on-loop", "off,answer"];
    args.extend(looping);
    let table = ok(&args);
    assert!(table.contains("on-loop") && table.contains("rescued") && table.contains(" answer "), "{table}");

    let bin = env!("CARGO_BIN_EXE_deltascope");
    let out = Command::new(bin).args(["run", "--prompt", "x", "--on-loop", "off,answer"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--on-loop takes one value here (2 given)"), "{err}");
    let out = Command::new(bin).args(["run", "--prompt", "x", "--on-loop", "rescue"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("expected off, stop or answer"), "{err}");
}

#[test]
fn run_thinking_budget_zero_turns_thinking_off() {
    let ev = events(&["run", "--prompt", "What is 12 + 30?", "--thinking-budget", "0", "--temperature", "0", "--json"]);
    assert_eq!(ev[0]["phase"], "answer");
    assert_eq!(ev.last().unwrap()["usage"]["thinking_tokens"], 0);
}

#[test]
fn run_thinking_budget_forces_and_reports() {
    let ev =
        events(&["run", "--prompt", "What is 482 + 739?", "--thinking-budget", "4", "--temperature", "0", "--json"]);
    let forced: Vec<&Value> = ev.iter().filter(|e| e["event"] == "token" && e["forced"] == true).collect();
    assert!(!forced.is_empty());
    let diag = ev.iter().find(|e| e["event"] == "diagnostic").expect("a diagnostic");
    assert_eq!(diag["kind"], "thinking_budget_forced");
    assert_eq!(diag["at_token"], 4);
    let done = ev.last().unwrap();
    assert_eq!(done["usage"]["forced_tokens"], forced.len());
    assert!(done["thinking"].as_str().unwrap().contains("Considering the limited time"));
}

#[test]
fn run_reports_thinking_that_ate_max_tokens() {
    let args = ["run", "--prompt", "Sort 93, 17, 56, 41, 8, 72.", "--max-tokens", "10", "--temperature", "0"];
    let ev = events(&[&args[..], &["--json"]].concat());
    let done = ev.last().unwrap();
    assert_eq!(done["finish_reason"], "length");
    assert_eq!(done["answer"], "");
    assert!(ev.iter().any(|e| e["kind"] == "thinking_exhausted_max_tokens"));
    // Human output shows it as a banner on stderr.
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope")).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[thinking_exhausted_max_tokens]") && err.contains("raise max_tokens"), "{err}");
}

#[test]
fn run_top_logprobs_presets_and_sampling_flags() {
    let ev = events(&[
        "run",
        "--prompt",
        "Is 7 prime?",
        "--max-tokens",
        "5",
        "--top-logprobs",
        "3",
        "--preset",
        "thinking-general",
        "--seed",
        "3",
        "--json",
    ]);
    let p = &ev[0]["params"]["sampling"];
    assert_eq!(
        (p["temperature"].as_f64(), p["top_p"].as_f64(), p["top_k"].as_u64(), p["presence_penalty"].as_f64()),
        (Some(1.0), Some(0.95), Some(20), Some(1.5))
    );
    for t in ev.iter().filter(|e| e["event"] == "token") {
        assert_eq!(t["top_logprobs"].as_array().unwrap().len(), 3);
    }
    // An explicit flag wins over the preset; generation_config.json supplies defaults.
    let ev = events(&[
        "run",
        "--prompt",
        "Hi",
        "--max-tokens",
        "2",
        "--preset",
        "thinking-general",
        "--temperature",
        "0.2",
        "--json",
    ]);
    assert_eq!(ev[0]["params"]["sampling"]["temperature"].as_f64(), Some(0.2));
    let m = fixture("qwen3_next");
    let ev = events(&["run", "--model", &m, "--prompt", "Hi", "--max-tokens", "2", "--json"]);
    assert_eq!(ev[0]["params"]["sampling"]["top_k"], 20, "from the fixture's generation_config.json");
    assert_eq!(ev[0]["params"]["sampling"]["temperature"].as_f64(), Some(1.0));
    // The demo model ships `do_sample: false`: greedy unless asked otherwise.
    let ev = events(&["run", "--prompt", "Hi", "--max-tokens", "2", "--json"]);
    assert_eq!(ev[0]["params"]["sampling"]["temperature"].as_f64(), Some(0.0));
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["run", "--prompt", "Hi", "--preset", "bogus"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("invalid value 'bogus' for '--preset"), "{err}");
    assert!(err.contains("thinking-general, thinking-coding, instruct-general, instruct-reasoning"), "{err}");
}

#[test]
fn sweep_table_json_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("sweep.svg");
    let out = ok(&[
        "sweep",
        "--prompt",
        "What is 482 + 739?",
        "--thinking-budgets",
        "0,4,-1",
        "--check",
        "= 1221\\.",
        "--temperature",
        "0",
        "--plot",
        svg.to_str().unwrap(),
        "--json",
    ]);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    assert_eq!(runs[0]["thinking_tokens"], 0);
    assert_eq!(runs[1]["forced"], true);
    assert_eq!(runs[2]["forced"], false);
    // Forced tokens counted apart: the budget's 4 thinking tokens, then 52 forced (the bridge's
    // 51 tokens and `</think>`).
    assert_eq!((runs[1]["thinking_tokens"].as_u64(), runs[1]["forced_tokens"].as_u64()), (Some(4), Some(52)));
    assert_eq!(runs[2]["forced_tokens"], 0);
    assert_eq!(runs[2]["correct"], true, "unlimited thinking gets 482 + 739 right: {}", runs[2]);
    assert!(runs[2]["thinking_tokens"].as_u64().unwrap() > runs[1]["thinking_tokens"].as_u64().unwrap());
    let summary = v["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 3);
    assert_eq!(summary[2]["accuracy"], 1.0);
    let s = std::fs::read_to_string(&svg).unwrap();
    assert!(s.starts_with("<svg") && s.contains("polyline") && s.contains("∞"));
    assert!(s.contains("<title>forced 52.0</title>"), "the forced tokens have their own bar segment");
    // The human table.
    let table = ok(&[
        "sweep",
        "--prompt",
        "Is 91 prime?",
        "--thinking-budgets",
        "8,-1",
        "--repeat",
        "2",
        "--temperature",
        "0.7",
    ]);
    assert!(table.contains("budget") && table.contains("mean thinking") && table.lines().count() >= 8, "{table}");
    assert!(table.contains("mean forced"), "{table}");
    // Budget 8: 8 thinking tokens and 52 forced in each row, apart.
    let row = table.lines().find(|l| l.split_whitespace().next() == Some("8")).unwrap();
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!((cells[2], cells[5]), ("8", "52"), "{table}");
}

/// `bench`: warm-up passes, then measured passes interleaved; every figure as median, min, max
/// and spread; speed-ups against `--mtp 0` say whether they are inside the spread.
#[test]
fn bench_reports_median_min_max_and_whether_a_difference_is_noise() {
    let out = ok(&["bench", "--mtp", "0,1", "--repeat", "3", "--warmup", "1", "--max-tokens", "24", "--json"]);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["warmup"].as_u64(), v["repeat"].as_u64()), (Some(1), Some(3)));
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r["passes"], 3, "{r}");
        for k in ["decode_tok_s", "prefill_tok_s", "ttft_ms"] {
            let f = |x: &str| r[k][x].as_f64().unwrap_or_else(|| panic!("{k}.{x} in {r}"));
            assert!(f("min") <= f("median") && f("median") <= f("max"), "{k}: {r}");
            assert!(f("min") > 0.0, "{k}: {r}");
            assert!((f("spread") - (f("max") - f("min")) / f("median")).abs() < 1e-9, "{k}: {r}");
        }
    }
    assert!(rows[0]["speedup"].is_null(), "the baseline has no speed-up: {}", rows[0]);
    let s = &rows[1]["speedup"];
    let (lo, mid, hi) = (s["min"].as_f64().unwrap(), s["median"].as_f64().unwrap(), s["max"].as_f64().unwrap());
    assert!(lo <= mid && mid <= hi, "{s}");
    let d = |i: usize, x: &str| rows[i]["decode_tok_s"][x].as_f64().unwrap();
    let noise = (d(1, "median") - d(0, "median")).abs() < (d(0, "max") - d(0, "min")).max(d(1, "max") - d(1, "min"));
    assert_eq!(s["within_spread"].as_bool(), Some(noise), "{s}");
    // A verify pass against a plain step: positive, and none for the baseline.
    assert!(rows[1]["verify_cost"].as_f64().is_some_and(|v| v > 0.0), "{}", rows[1]);
    assert!(rows[0]["verify_cost"].is_null());

    // The CPU it ran on, and the threads it ran with.
    let cpu = &v["cpu"];
    assert!(cpu["physical_cores"].as_u64().unwrap() >= 1 && cpu["threads"].as_u64().unwrap() >= 1, "{cpu}");
    // The kernel family that ran, and its f32 and bf16 kernels.
    let (family, f32k, bf16) =
        (cpu["kernel"].as_str().unwrap(), cpu["kernels"].as_str().unwrap(), cpu["bf16_kernels"].as_str().unwrap());
    let parts = match family {
        "portable" => ("portable", "portable"),
        "avx2" => ("avx2", "avx2"),
        "avx512" => ("avx512", "avx512"),
        "avx512_bf16" => ("avx512", "avx512_bf16"),
        "amx" => ("avx512", "amx_bf16"),
        other => panic!("kernel {other:?}: {cpu}"),
    };
    assert_eq!((f32k, bf16), parts, "{cpu}");
    let supported: Vec<&str> =
        cpu["kernels_supported"].as_array().unwrap().iter().map(|k| k.as_str().unwrap()).collect();
    assert!(supported.contains(&family), "{cpu}");
    // The best family this CPU runs, unless DELTASCOPE_CPU_KERNEL forces one: vdpbf16ps or AMX
    // tiles exactly when the CPU reports AVX512_BF16; the tiles exactly when it reports AMX-BF16
    // too (Linux grants them on request).
    match std::env::var("DELTASCOPE_CPU_KERNEL").ok().filter(|v| !v.is_empty()) {
        Some(forced) => assert_eq!((family, cpu["kernel_forced"].as_bool()), (forced.as_str(), Some(true)), "{cpu}"),
        None => {
            assert_eq!(family, *supported.last().unwrap(), "{cpu}");
            let has = |f: &str| cpu["features"].as_array().unwrap().iter().any(|x| x == f);
            let avx512 = f32k == "avx512";
            assert_eq!(["amx_bf16", "avx512_bf16"].contains(&bf16), has("avx512_bf16") && avx512, "{cpu}");
            assert_eq!(bf16 == "amx_bf16", has("avx512_bf16") && has("amx_bf16") && avx512, "{cpu}");
        }
    }
    // Why that many threads: the default's count, or the flag.
    let why = cpu["threads_why"].as_str().unwrap();
    assert!(why.contains("this process may use"), "{why}");
    // `--dtype auto` (the default) follows the demo's config.json: bfloat16.
    assert_eq!(v["dtype"], "bf16", "{v}");
    assert!(v["dtype_why"].as_str().unwrap().starts_with("auto: config.json declares bfloat16"), "{v}");
    let out = ok(&["bench", "--mtp", "0", "--repeat", "1", "--max-tokens", "4", "--threads", "1", "--json"]);
    let cpu = serde_json::from_str::<Value>(out.trim()).unwrap()["cpu"].clone();
    assert_eq!((cpu["threads"].as_u64(), cpu["threads_why"].as_str()), (Some(1), Some("--threads 1")));
    let out = ok(&["bench", "--mtp", "0", "--repeat", "1", "--max-tokens", "4", "--threads", "1", "--dtype", "f32"]);
    assert!(out.lines().any(|l| l == "threads: 1 — --threads 1"), "{out}");
    assert!(out.lines().any(|l| l == "dtype: f32 — --dtype f32"), "{out}");

    // Long prompts: every prompt padded to at least --prompt-len tokens.
    let out = ok(&["bench", "--mtp", "0", "--repeat", "1", "--max-tokens", "8", "--prompt-len", "600", "--json"]);
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    let lens: Vec<u64> = v["prompt_tokens"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
    assert_eq!(lens.len(), 4);
    assert!(lens.iter().all(|&n| (600..700).contains(&n)), "{lens:?}");
}

/// Every sampled token carries the entropy of the full distribution it was drawn from (at
/// least what its top alternatives alone contribute); forced tokens carry none.
#[test]
fn tokens_carry_the_entropy_of_their_distribution() {
    let ev = events(&["run", "--prompt", "Is 91 prime?", "--thinking-budget", "4", "--top-logprobs", "5", "--json"]);
    let tokens: Vec<&Value> = ev.iter().filter(|e| e["event"] == "token").collect();
    assert!(tokens.iter().any(|t| t["forced"] == true));
    for t in &tokens {
        if t["forced"] == true {
            assert!(t.get("entropy").is_none(), "{t}");
            continue;
        }
        let h = t["entropy"].as_f64().unwrap_or_else(|| panic!("no entropy: {t}"));
        let partial: f64 = t["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let lp = a["logprob"].as_f64().unwrap();
                -lp.exp() * lp
            })
            .sum();
        assert!(h >= partial - 1e-4 && h <= (512f64).ln() + 1e-4, "entropy {h} vs top-5 part {partial}: {t}");
    }
}

/// Without `--mtp`, a model with no MTP head is benchmarked plainly (and says so); asking for a
/// draft depth on it is still an error naming the model. The weights line says what is held
/// and how much of it is read in place.
#[test]
fn bench_without_an_mtp_head_measures_plain_decoding() {
    let m = fixture("qwen3_5_text");
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["bench", "--model", &m, "--repeat", "1", "--max-tokens", "4", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("has no MTP head: measuring --mtp 0 only"), "{stderr}");
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["mtp"].as_str().unwrap()).collect::<Vec<_>>(), ["0"]);
    let load = &v["load"];
    assert!(load["mapped_bytes"].as_u64().unwrap() > 0, "{load}");
    assert!(load["mapped_bytes"].as_u64() <= load["weights_bytes"].as_u64(), "{load}");
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["bench", "--model", &m, "--mtp", "0,1", "--repeat", "1", "--max-tokens", "4"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("--mtp 1:") && stderr.contains("no MTP head"), "{stderr}");
}

/// Issue 35, item 11: the workbench is the default command, so its flags work at the root
/// (`deltascope --server URL`, `--model DIR`, `--theme …`, as the README writes them); they are
/// refused next to another subcommand.
#[test]
fn the_chat_flags_work_without_chat() {
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["--server", "http://127.0.0.1:9", "--theme", "no-such-theme"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("unexpected argument"), "{err}");
    // The flags were taken: the theme is checked before the terminal switches to the TUI.
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no-such-theme"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["--max-tokens", "5", "run", "--prompt", "Hi"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
}

/// Issue 35, item 17: `--answer-budget` counts from `</think>`, so the blank line after it is
/// the first answer token and `--answer-budget 1` answers nothing but that line; the help says so.
#[test]
fn the_answer_budget_counts_the_blank_line_after_think_and_says_so() {
    let ev = events(&["run", "--prompt", "Is 91 prime?", "--answer-budget", "1", "--temperature", "0", "--json"]);
    let done = ev.iter().find(|e| e["event"] == "done").expect("a done event");
    assert_eq!(done["usage"]["answer_tokens"], 1, "{done}");
    assert!(done["answer"].as_str().unwrap().trim().is_empty(), "only the blank line: {done}");
    // Wrapped as clap wraps it: compared word by word.
    let help = ok(&["run", "--help"]).split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("is the first: `1` answers nothing"), "{help}");
}

fn fails(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope")).args(args).output().unwrap();
    (out.status.code(), String::from_utf8_lossy(&out.stderr).to_string())
}

/// The last line of a command's stderr (after any note about where the model runs).
fn last_line(s: &str) -> &str {
    s.trim_end().lines().last().unwrap_or_default()
}

/// A config.json key deltascope does not know is said in one line by `inspect` and `run` (the
/// key, its value, "ignored: if it changes the architecture, results will be wrong"), refused
/// under `--strict-config`; a known key with a value deltascope does not compute is refused.
#[test]
fn config_keys_deltascope_does_not_know_are_said_and_refused_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("model");
    std::fs::create_dir_all(&copy).unwrap();
    for e in std::fs::read_dir(fixture("qwen3_5_text")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
    }
    let config = copy.join("config.json");
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(&config).unwrap()).unwrap();
    c["layer_scale_init"] = 0.5.into();
    std::fs::write(&config, c.to_string()).unwrap();
    let m = copy.to_str().unwrap();
    let line = "config.json: unknown key `layer_scale_init` = 0.5, ignored: if it changes the architecture, results will be wrong";
    let inspect = ok(&["inspect", "--model", m]);
    assert!(inspect.lines().any(|l| l.starts_with("warning") && l.ends_with(line)), "{inspect}");
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["run", "--model", m, "--prompt", "hi", "--max-tokens", "2"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().filter(|l| l.contains("layer_scale_init")).count(), 1, "one line: {stderr}");
    assert!(stderr.contains(line), "{stderr}");
    for cmd in [
        &["inspect", "--model", m, "--strict-config"][..],
        &["run", "--model", m, "--prompt", "hi", "--strict-config"][..],
    ] {
        let (code, stderr) = fails(cmd);
        assert_eq!(code, Some(1), "{cmd:?}: {stderr}");
        assert!(stderr.contains("unknown key `layer_scale_init` = 0.5 refused by --strict-config"), "{stderr}");
    }
    c["output_gate_type"] = "sigmoid".into();
    std::fs::write(&config, c.to_string()).unwrap();
    let (code, stderr) = fails(&["inspect", "--model", m]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("output_gate_type = \"sigmoid\" is not supported"), "{stderr}");
}

/// The small things a new user met, each said clearly: a negative `--threads` or `--seed` gets
/// the message any value out of its range gets; `--kernels` with `--device cpu` and serve's zero
/// limits are refused; `logits` takes `--prompt` / `--prompt-ids` as `run` does and lists only
/// its own flags; more threads than the CPUs granted is a warning; `inspect` and `run --json`
/// say which CPU kernels run.
#[test]
fn what_a_new_user_met_is_said_clearly() {
    let (code, stderr) = fails(&["run", "--temperature", "-1", "--prompt", "x"]);
    assert_eq!((code, last_line(&stderr)), (Some(1), "error: --temperature -1: must be in [0, 100] (0 is greedy)"));
    let (code, stderr) = fails(&["run", "--threads", "-1", "--prompt", "x"]);
    assert_eq!(
        (code, last_line(&stderr)),
        (Some(1), "error: --threads -1: must be at least 1 (the threads the engine's layers run on)")
    );
    let (code, stderr) = fails(&["run", "--seed", "-1", "--prompt", "x"]);
    assert_eq!((code, last_line(&stderr)), (Some(1), "error: --seed -1: must be in [0, 18446744073709551615]"));
    let (code, stderr) = fails(&["run", "--device", "cpu", "--kernels", "kernels", "--prompt", "x"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("--kernels DIR: the CUDA kernels' sources are read for --device cuda|emu"), "{stderr}");
    for (flag, what) in [
        ("--max-queue", "--max-queue 0: must be at least 1"),
        ("--body-limit", "--body-limit 0: must be at least 1 byte"),
    ] {
        let (code, stderr) = fails(&["serve", "--port", "0", flag, "0"]);
        assert_eq!(code, Some(1), "{stderr}");
        assert!(stderr.contains(what), "{stderr}");
    }
    let by_text: Value =
        serde_json::from_str(&ok(&["logits", "--prompt", "Is 91 prime?", "--json", "--top", "3"])).unwrap();
    let ids: Vec<String> = by_text["ids"].as_array().unwrap().iter().map(|i| i.to_string()).collect();
    let by_ids: Value =
        serde_json::from_str(&ok(&["logits", "--prompt-ids", &ids.join(","), "--json", "--top", "3"])).unwrap();
    assert_eq!(by_text["top"], by_ids["top"]);
    let help = ok(&["logits", "--help"]);
    for absent in ["--server", "--device", "--kernels", "--api-key", "--budget-mode"] {
        assert!(!help.contains(absent), "logits takes no {absent}:\n{help}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["run", "--threads", "64", "--prompt", "x", "--max-tokens", "1"])
        .output()
        .unwrap();
    let granted = std::thread::available_parallelism().map_or(1, |n| n.get());
    if granted < 64 {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("warning: --threads 64 is more than the "), "{stderr}");
    }
    // Which CPU kernels run: inspect's line, and run --json's start event.
    let inspect = ok(&["inspect"]);
    assert!(inspect.lines().any(|l| l.starts_with("CPU kernels  ")), "{inspect}");
    let ev = events(&["run", "--device", "cpu", "--prompt", "x", "--max-tokens", "1", "--json"]);
    let n = &ev[0]["numerics"];
    assert_eq!((n["device"].as_str(), n["dtype"].as_str()), (Some("cpu"), Some("bf16")), "{n}");
    assert!(["portable", "avx2", "avx512", "avx512_bf16", "amx"].contains(&n["kernel"].as_str().unwrap_or("")), "{n}");
    if let Ok(k) = std::env::var("DELTASCOPE_CPU_KERNEL") {
        assert_eq!(n["kernel"].as_str(), Some(k.as_str()));
    }
}
