//! `scripts/gpu-check.sh` without a GPU: its step runner (every step runs whatever an earlier one
//! did, each under its own timeout, and `summary.json` says how each went), its NVRTC search, and
//! a whole run against a stand-in for the binary that fails some steps on purpose.
//! `tests/device.rs` runs the script against the real binary, which stops early without a GPU.
#![cfg(unix)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check.sh")
}

/// `bash -c BODY` after sourcing the script for its functions (`set -u` on, so that they are
/// checked against unset variables), with `$1` = `arg`. The NVRTC variables of the calling
/// environment are removed; `env` sets what a test wants.
fn sourced(body: &str, arg: &Path, env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg("-c")
        .arg(format!("set -uo pipefail\nGPU_CHECK_SOURCE_ONLY=1 source \"$0\" || exit 99\n{body}"))
        .arg(script())
        .arg(arg)
        .env_remove("NVRTC_LIB_DIR")
        .env_remove("VIRTUAL_ENV")
        .env_remove("DELTASCOPE_NVRTC_DIR")
        .env_remove("GPU_CHECK_BUDGET_S");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn summary(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap()
}

fn step<'a>(summary: &'a Value, name: &str) -> &'a Value {
    summary["steps"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no step {name}"))
}

#[test]
fn every_step_runs_under_its_own_timeout_and_the_summary_says_how_each_went() {
    let dir = tempfile::tempdir().unwrap();
    let out = sourced(
        r#"steps_init "$1"
run_step ok 5 "$1/ok.log" -- true
run_step bad 5 "$1/bad.log" -- false
run_step slow 1 "$1/slow.log" -- sleep 5
skip_step bench 90 $'the synth step did not pass: "no model"\n(see synth.txt)' -- echo bench
code=$(steps_exit_code)
write_summary "$code"
exit "$code""#,
        dir.path(),
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for line in ["-- ok: pass (exit 0", "-- bad: fail (exit 1", "-- slow: timeout (exit 124"] {
        assert!(stdout.contains(line), "{line:?} missing: {}", text(&out));
    }

    let s = summary(dir.path());
    assert_eq!(s["complete"], true);
    assert_eq!(s["exit_code"], 2);
    let names: Vec<&str> = s["steps"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["ok", "bad", "slow", "bench"]);
    for (name, command, verdict, code, timeout) in
        [("ok", "true", "pass", 0, 5), ("bad", "false", "fail", 1, 5), ("slow", "sleep 5", "timeout", 124, 1)]
    {
        let st = step(&s, name);
        assert_eq!(st["command"], command, "{st}");
        assert_eq!(st["verdict"], verdict, "{st}");
        assert_eq!(st["exit_code"], code, "{st}");
        assert_eq!(st["timeout_s"], timeout, "{st}");
        let log = st["log"].as_str().unwrap();
        assert_eq!(log, dir.path().join(format!("{name}.log")).to_str().unwrap());
        assert!(Path::new(log).exists(), "{name} did not run");
        assert!(st["wall_s"].as_f64().unwrap() >= 0.0);
    }
    assert_eq!(step(&s, "ok")["reason"], Value::Null);
    assert_eq!(step(&s, "bad")["reason"], "exit 1");
    assert_eq!(step(&s, "slow")["reason"], "no result within 1 s");
    // Stopped at its own timeout, not at sleep's end.
    let slow = step(&s, "slow")["wall_s"].as_f64().unwrap();
    assert!((0.9..4.0).contains(&slow), "slow took {slow} s");

    let bench = step(&s, "bench");
    assert_eq!(bench["verdict"], "skipped");
    assert_eq!(bench["reason"], "the synth step did not pass: \"no model\"\n(see synth.txt)");
    assert_eq!(bench["exit_code"], Value::Null);
    assert_eq!(bench["log"], Value::Null);
    assert_eq!(s["metrics"], Value::Null);
}

#[test]
fn a_run_whose_steps_all_pass_exits_0_and_keeps_each_output() {
    let dir = tempfile::tempdir().unwrap();
    let out = sourced(
        r#"steps_init "$1"
run_step --out "$1/said.json" say 5 "$1/say.err" -- sh -c 'echo "{\"said\": 1}"; echo note >&2'
skip_step --optional metrics 60 "python3 not found" -- write_metrics "$1"
code=$(steps_exit_code)
write_summary "$code"
exit "$code""#,
        dir.path(),
        &[],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let s = summary(dir.path());
    assert_eq!(s["exit_code"], 0);
    let say = step(&s, "say");
    assert_eq!(say["verdict"], "pass");
    assert_eq!(std::fs::read_to_string(say["output"].as_str().unwrap()).unwrap(), "{\"said\": 1}\n");
    assert_eq!(std::fs::read_to_string(say["log"].as_str().unwrap()).unwrap(), "note\n");
    assert_eq!(step(&s, "metrics")["verdict"], "skipped");
}

#[test]
fn the_budget_cuts_each_timeout_and_skips_the_steps_it_no_longer_covers() {
    let dir = tempfile::tempdir().unwrap();
    let out = sourced(
        r#"GPU_CHECK_BUDGET_S=8 steps_init "$1"
run_step early 60 "$1/early.log" -- true
GPU_CHECK_BUDGET_S=0 steps_init "$1"
run_step late 60 "$1/late.log" -- true
code=$(steps_exit_code)
write_summary "$code"
exit "$code""#,
        dir.path(),
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(dir.path().join("early.log").exists(), "early did not run: {}", text(&out));
    // 60 s cut to what is left of the 8 s budget (whole seconds, rounded down).
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("== early (timeout 7 s): true") || stdout.contains("== early (timeout 8 s): true"),
        "{}",
        text(&out)
    );
    let s = summary(dir.path());
    let late = step(&s, "late");
    assert_eq!(late["verdict"], "skipped");
    assert_eq!(late["reason"], "not started: the script's time budget (GPU_CHECK_BUDGET_S=0 s) is spent");
    assert!(!dir.path().join("late.log").exists());
}

#[test]
fn nvrtc_lib_dir_is_used_when_it_holds_nvrtc() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("libnvrtc.so.13"), b"").unwrap();
    let out = sourced(r#"find_nvrtc "$1""#, Path::new("/nonexistent"), &[("NVRTC_LIB_DIR", dir.path())]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        format!("nvrtc: using {} (from NVRTC_LIB_DIR)", dir.path().display())
    );
}

#[test]
fn nvrtc_lib_dir_without_nvrtc_is_an_error_that_names_the_variable() {
    let dir = tempfile::tempdir().unwrap();
    let out = sourced(r#"find_nvrtc "$1""#, Path::new("/nonexistent"), &[("NVRTC_LIB_DIR", dir.path())]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(out.stdout.is_empty(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "gpu-check: NVRTC_LIB_DIR={} holds no libnvrtc.so* (point it at the folder holding libnvrtc.so.13, or unset it to search)",
            dir.path().display()
        )
    );
}

#[test]
fn nvrtc_is_found_in_the_virtual_env() {
    let venv = tempfile::tempdir().unwrap();
    let lib = venv.path().join("lib/python3.12/site-packages/nvidia/cu13/lib");
    std::fs::create_dir_all(&lib).unwrap();
    std::fs::write(lib.join("libnvrtc.so.13"), b"").unwrap();
    let out = sourced(r#"find_nvrtc "$1""#, Path::new("/nonexistent"), &[("VIRTUAL_ENV", venv.path())]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        format!("nvrtc: using {} (from VIRTUAL_ENV={})", lib.display(), venv.path().display())
    );
}

/// A stand-in for the binary: logs each call to $FAKE_LOG, fails the subcommands named in
/// $FAKE_FAIL, and otherwise answers as a machine with one GPU of compute capability 10.0.
const FAKE: &str = r#"#!/bin/sh
echo "$*" >> "$FAKE_LOG"
key=$1
[ "$1" = gpu ] && key=$2
case " $FAKE_FAIL " in *" $key "*) echo "error: $key failed on purpose" >&2; exit 3 ;; esac
case $key in
  info)
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> "$FAKE_LOG"
    cat <<'J'
{
  "libraries": {
    "driver": true
  },
  "nvrtc_version": "13.0",
  "gpus": [
    {
      "ordinal": 0,
      "name": "Fake H200",
      "compute_capability": [
        10,
        0
      ]
    }
  ],
  "driver_version": 13000,
  "no_gpu": null
}
J
    ;;
  kernels | check | parity) echo '{"pass": true}' ;;
  synth) echo "synthesized" ;;
  bench) echo '{"load": {"weights_bytes": 54000000000}, "rows": [{"mtp": "0", "decode_tok_s": {"median": 70.0}}]}' ;;
esac
"#;

fn run_with_fake(fail: &str) -> (Output, tempfile::TempDir, Value, String) {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("deltascope");
    std::fs::write(&fake, FAKE).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nvrtc = dir.path().join("nvrtc");
    std::fs::create_dir(&nvrtc).unwrap();
    std::fs::write(nvrtc.join("libnvrtc.so.13"), b"").unwrap();
    let out_dir = dir.path().join("out");
    let out = Command::new("bash")
        .arg(script())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("OUT", &out_dir)
        .env("DELTASCOPE", &fake)
        .env("SYNTH", dir.path().join("synth"))
        .env("NVRTC_LIB_DIR", &nvrtc)
        .env("FAKE_LOG", dir.path().join("calls.txt"))
        .env("FAKE_FAIL", fail)
        .env_remove("VIRTUAL_ENV")
        .env_remove("GPU_CHECK_BUDGET_S")
        .output()
        .unwrap();
    let s = summary(&out_dir);
    let calls = std::fs::read_to_string(dir.path().join("calls.txt")).unwrap();
    (out, dir, s, calls)
}

#[test]
fn the_script_runs_every_step_after_a_failure_and_skips_what_depends_on_it() {
    let (out, dir, s, calls) = run_with_fake("kernels synth");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_eq!(s["complete"], true);
    assert_eq!(s["exit_code"], 2);
    assert_eq!(s["stopped"], Value::Null);
    let verdicts: Vec<(&str, &str)> = s["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["name"].as_str().unwrap(), s["verdict"].as_str().unwrap()))
        .filter(|(name, _)| *name != "metrics")
        .collect();
    assert_eq!(
        verdicts,
        [
            ("libraries", "pass"),
            ("nvrtc", "pass"),
            ("gpu-info", "pass"),
            ("kernels", "fail"),
            ("kernel-parity", "pass"),
            ("model-parity-demo", "pass"),
            ("model-parity-qwen3_5_text", "pass"),
            ("model-parity-qwen3_5_moe", "pass"),
            ("model-parity-qwen3_next", "pass"),
            ("model-parity-qwen3_5_vl", "pass"),
            ("quantize-demo-fp8", "pass"),
            ("model-parity-demo-fp8", "pass"),
            ("trace-cuda", "pass"),
            ("trace-cpu", "pass"),
            ("trace-compare", "pass"),
            ("synth", "fail"),
            ("bench-512", "skipped"),
            ("bench-4096", "skipped"),
        ],
        "{}",
        text(&out)
    );
    assert_eq!(step(&s, "kernels")["reason"], "exit 3: error: kernels failed on purpose");
    assert_eq!(step(&s, "bench-512")["reason"], "the synth step did not pass: no model to bench");
    // The architecture comes from gpu-info.json; NVRTC's folder leads the loader path.
    let nvrtc = dir.path().join("nvrtc");
    assert!(calls.contains("gpu kernels --arch sm_100 --json --no-cache\n"), "{calls}");
    assert!(calls.contains(&format!("LD_LIBRARY_PATH={}:", nvrtc.display())), "{calls}");
    assert!(!calls.contains("bench"), "{calls}");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains(&format!("nvrtc: using {} (from NVRTC_LIB_DIR)", nvrtc.display()))
    );
    // metrics needs python3, which a machine may lack.
    assert!(["pass", "skipped"].contains(&step(&s, "metrics")["verdict"].as_str().unwrap()), "{s}");
}

#[test]
fn the_script_exits_0_when_every_step_passes() {
    let (out, _dir, s, calls) = run_with_fake("");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(s["exit_code"], 0);
    for st in s["steps"].as_array().unwrap() {
        if st["name"] == "metrics" && st["verdict"] == "skipped" {
            continue;
        }
        assert_eq!(st["verdict"], "pass", "{st}");
    }
    assert_eq!(calls.matches("bench --model").count(), 2, "{calls}");
    if step(&s, "metrics")["verdict"] == "pass" {
        assert_eq!(s["metrics"]["gpu"], "Fake H200");
        assert_eq!(s["metrics"]["decode_tok_s_mtp0"], 70.0);
    } else {
        assert_eq!(s["metrics"], Value::Null);
    }
}
