//! `--device` through the real binary on a machine without a GPU (CI's kind): the one-line
//! reasons, the CPU fallback under `auto`, the error when a GPU is asked for, and `inspect`'s
//! device plan for the field report's two 48 GB cards.

use std::path::PathBuf;
use std::process::{Command, Output};

use deltascope_model::cuda;
use serde_json::Value;

fn deltascope(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deltascope")).args(args).output().unwrap()
}

fn data(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name).display().to_string()
}

/// What this machine must say about its GPU: CI machines have no libcuda at all; a machine
/// with a driver but no usable device names the driver's error.
fn expected_reason() -> String {
    match cuda::probe() {
        Err(no) => no.to_string(),
        Ok(report) => panic!("this test describes machines without a GPU; this one has {:?}", report.gpus),
    }
}

#[test]
fn the_probe_matches_the_libraries_present() {
    let libs = cuda::probe::libraries();
    let reason = expected_reason();
    if !libs.driver {
        assert_eq!(reason, "no GPU: libcuda not found");
    } else {
        assert!(reason.starts_with("no GPU: CUDA_ERROR_"), "{reason}");
    }
}

#[test]
fn auto_falls_back_to_the_cpu_and_says_why_in_one_line() {
    let out = deltascope(&["run", "--prompt", "hi", "--max-tokens", "2", "--no-think", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = format!("{}; the CPU runs", expected_reason());
    assert_eq!(stderr.lines().filter(|l| l.contains("no GPU")).collect::<Vec<_>>(), vec![line.as_str()], "{stderr}");
    let start: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(start["event"], "start");
}

#[test]
fn cpu_checks_nothing_and_says_nothing() {
    let out = deltascope(&["run", "--device", "cpu", "--prompt", "hi", "--max-tokens", "2", "--no-think"]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("GPU"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn asking_for_cuda_without_a_gpu_is_a_one_line_error_not_a_panic() {
    for (cmd, device) in [("run", "cuda"), ("run", "cuda:0"), ("bench", "cuda:0,1"), ("sweep", "cuda")] {
        let mut args = vec![cmd, "--device", device];
        match cmd {
            "run" => args.extend(["--prompt", "hi"]),
            "sweep" => args.extend(["--prompt", "hi", "--thinking-budgets", "0"]),
            _ => {}
        }
        let out = deltascope(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(stderr.trim(), format!("error: --device {device}: {}", expected_reason()), "{args:?}");
    }
}

#[test]
fn a_malformed_device_names_the_part() {
    let out = deltascope(&["run", "--device", "cuda:one", "--prompt", "hi"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("\"one\" is not a device ordinal"), "{stderr}");
}

#[test]
fn inspect_plans_qwen36_27b_on_two_48_gb_cards() {
    let out = deltascope(&["inspect", "--model", &data("qwen3_6_27b"), "--plan-devices", "48GiB,48GiB"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("device plan  2 devices, layer split at layer"), "{text}");
    assert!(text.contains("device 0 (48.00 GiB free): layers 0–"), "{text}");
    assert!(text.contains("final norm + LM head, MTP layer"), "{text}");
    assert!(text.contains("fits         yes"), "{text}");
    assert!(text.contains("a layer split buys capacity, not batch-1 speed"), "{text}");

    let out = deltascope(&["inspect", "--model", &data("qwen3_6_27b"), "--plan-devices", "48GiB,48GiB", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let plan = &v["device_plan"];
    assert_eq!(plan["fits"], true);
    assert_eq!(plan["layer_device"].as_array().unwrap().len(), 64);
    assert_eq!(plan["boundary_bytes_per_token"], 10_240);
    let devices = plan["devices"].as_array().unwrap();
    let weights: u64 = devices.iter().map(|d| d["weights_bytes"].as_u64().unwrap()).sum();
    // 26,895,998,464 language-model parameters + 424,699,392 MTP, in bf16.
    assert_eq!(weights, (26_895_998_464 + 424_699_392) * 2);
    for d in devices {
        assert!(d["headroom_bytes"].as_i64().unwrap() > 0);
    }
}

#[test]
fn inspect_says_when_a_model_does_not_fit() {
    let out = deltascope(&["inspect", "--model", &data("qwen3_next_80b_a3b"), "--plan-devices", "48GB,48GB"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("SHORT by"), "{text}");
    assert!(text.contains("fits         NO"), "{text}");
}

#[test]
fn inspect_on_gpus_without_one_says_so() {
    let out = deltascope(&["inspect", "--model", &data("qwen3_6_27b"), "--device", "cuda:0,1"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim(), format!("error: --device cuda:0,1: {}", expected_reason()));
    let out = deltascope(&["inspect", "--plan-devices", "48 parsecs"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown unit \"parsecs\""));
}

/// `scripts/gpu-check.sh` is tried as far as a CPU allows: it lists the libraries, asks the
/// binary, and stops with the one-line reason (exit 1), its JSON written.
#[test]
fn the_gpu_check_script_stops_cleanly_without_a_gpu() {
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg("scripts/gpu-check.sh")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("OUT", out_dir.path())
        .env("DELTASCOPE", env!("CARGO_BIN_EXE_deltascope"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.trim_end().lines().last(), Some(format!("gpu-check: {}", expected_reason()).as_str()));
    assert!(out_dir.path().join("libraries.txt").exists());
    let info: Value = serde_json::from_slice(&std::fs::read(out_dir.path().join("gpu-info.json")).unwrap()).unwrap();
    assert_eq!(info["no_gpu"], expected_reason());
}

#[test]
fn gpu_check_without_a_gpu_says_so_in_one_line() {
    let out = deltascope(&["gpu", "check", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert_eq!(String::from_utf8_lossy(&out.stderr).trim(), format!("error: {}", expected_reason()));
}
