//! Bad input gets a specific error — naming the file, tensor or field, with expected vs found —
//! a non-zero exit, and no panic. Each case breaks a copy of a fixture and runs the real binary.

use std::path::Path;
use std::process::Command;

#[path = "common/fixture_edit.rs"]
mod fixture_edit;

use fixture_edit::{edit_tensors, fixture_copy};

/// Runs the binary; asserts a failure exit without a panic and returns stderr.
fn fails(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope")).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "expected failure for {args:?}, stdout: {}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    err
}

fn run_args(dir: &Path) -> Vec<String> {
    vec![
        "run".into(),
        "--model".into(),
        dir.display().to_string(),
        "--prompt".into(),
        "Hi".into(),
        "--max-tokens".into(),
        "2".into(),
    ]
}

fn fails_run(dir: &Path) -> String {
    let a = run_args(dir);
    fails(&a.iter().map(String::as_str).collect::<Vec<_>>())
}

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn missing_config() {
    let dir = fixture_copy("qwen3_5_text");
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let err = fails_run(dir.path());
    assert!(err.contains("no config.json"), "{err}");
    let err = fails(&["inspect", "--model", dir.path().to_str().unwrap()]);
    assert!(err.contains("no config.json"), "{err}");
}

#[test]
fn invalid_config_json() {
    let dir = fixture_copy("qwen3_5_text");
    std::fs::write(dir.path().join("config.json"), "{\"model_type\": ").unwrap();
    let err = fails_run(dir.path());
    assert!(err.contains("config.json: invalid JSON"), "{err}");
}

#[test]
fn unknown_model_type() {
    let dir = fixture_copy("qwen3_5_text");
    edit_json(&dir.path().join("config.json"), |v| v["model_type"] = "llama".into());
    let err = fails_run(dir.path());
    assert!(err.contains("config.json: unknown model_type \"llama\""), "{err}");
}

#[test]
fn bad_config_field_names_the_field() {
    let dir = fixture_copy("qwen3_5_vl");
    edit_json(&dir.path().join("config.json"), |v| v["text_config"]["linear_num_value_heads"] = 5.into());
    let err = fails_run(dir.path());
    assert!(
        err.contains("text_config.linear_num_value_heads") && err.contains("not a multiple of linear_num_key_heads 2"),
        "{err}"
    );
}

#[test]
fn missing_tensor() {
    let dir = fixture_copy("qwen3_5_text");
    edit_tensors(&dir.path().join("model.safetensors"), |n, s, b| {
        (n != "model.layers.1.linear_attn.A_log").then(|| (s.to_vec(), b.to_vec()))
    });
    let err = fails_run(dir.path());
    assert!(
        err.contains("tensor `model.layers.1.linear_attn.A_log` not found") && err.contains("model.safetensors"),
        "{err}"
    );
}

#[test]
fn missing_lm_head_of_an_untied_model() {
    let dir = fixture_copy("qwen3_next");
    edit_tensors(&dir.path().join("model.safetensors"), |n, s, b| {
        (n != "lm_head.weight").then(|| (s.to_vec(), b.to_vec()))
    });
    let err = fails_run(dir.path());
    assert!(err.contains("`lm_head.weight` not found") && err.contains("tie_word_embeddings is false"), "{err}");
}

#[test]
fn shape_mismatch() {
    let dir = fixture_copy("qwen3_5_text");
    edit_tensors(&dir.path().join("model.safetensors"), |n, s, b| {
        if n == "model.layers.3.self_attn.k_proj.weight" {
            // Drop one output row: [24, 48] -> [23, 48] (f32).
            Some((vec![s[0] - 1, s[1]], b[..(s[0] - 1) * s[1] * 4].to_vec()))
        } else {
            Some((s.to_vec(), b.to_vec()))
        }
    });
    let err = fails_run(dir.path());
    assert!(
        err.contains(
            "model.safetensors: tensor `model.layers.3.self_attn.k_proj.weight` has shape [23, 48], expected [24, 48]"
        ),
        "{err}"
    );
}

#[test]
fn truncated_safetensors() {
    let dir = fixture_copy("qwen3_5_text");
    let p = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let err = fails_run(dir.path());
    assert!(err.contains("model.safetensors: not a valid safetensors file") && err.contains("truncated"), "{err}");
    // A file too short to hold even the header length.
    std::fs::write(&p, b"abc").unwrap();
    let err = fails_run(dir.path());
    assert!(err.contains("model.safetensors: not a valid safetensors file"), "{err}");
}

#[test]
fn missing_shard() {
    let dir = fixture_copy("qwen3_5_vl");
    std::fs::remove_file(dir.path().join("model-00002-of-00002.safetensors")).unwrap();
    let err = fails_run(dir.path());
    assert!(
        err.contains("no model-00002-of-00002.safetensors") && err.contains("model.safetensors.index.json maps"),
        "{err}"
    );
}

#[test]
fn missing_weights() {
    let dir = fixture_copy("qwen3_5_text");
    std::fs::remove_file(dir.path().join("model.safetensors")).unwrap();
    let err = fails_run(dir.path());
    assert!(err.contains("no model.safetensors"), "{err}");
}

#[test]
fn missing_tokenizer() {
    let dir = fixture_copy("qwen3_5_text");
    std::fs::remove_file(dir.path().join("tokenizer.json")).unwrap();
    let err = fails_run(dir.path());
    assert!(err.contains("no tokenizer.json"), "{err}");
}

#[test]
fn corrupt_tokenizer() {
    let dir = fixture_copy("qwen3_5_text");
    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let err = fails_run(dir.path());
    assert!(err.contains("tokenizer.json:"), "{err}");
}

#[test]
fn token_id_out_of_range() {
    let dir = fixture_copy("qwen3_5_text");
    let m = dir.path().to_str().unwrap();
    let err = fails(&["run", "--model", m, "--prompt-ids", "1,2,99999", "--max-tokens", "2"]);
    assert!(err.contains("token id 99999 at position 2 is out of range") && err.contains("512 entries"), "{err}");
    let err = fails(&["logits", "--model", m, "--ids", "5,512"]);
    assert!(err.contains("token id 512 at position 1 is out of range"), "{err}");
    let err = fails(&["logits", "--model", m, "--ids", "5,x"]);
    assert!(err.contains("`x` is not a token id"), "{err}");
}

#[test]
fn prompt_longer_than_the_context() {
    let dir = fixture_copy("qwen3_5_text");
    edit_json(&dir.path().join("config.json"), |v| v["max_position_embeddings"] = 16.into());
    let m = dir.path().to_str().unwrap();
    let ids: Vec<String> = (1..=20).map(|i| i.to_string()).collect();
    let err = fails(&["logits", "--model", m, "--ids", &ids.join(",")]);
    assert!(err.contains("would hold 20 tokens but the model's context is 16 tokens"), "{err}");
    // The prompt fits, but not with max_tokens on top.
    let err = fails(&["run", "--model", m, "--prompt-ids", "1,2,3,4,5,6,7,8,9,10", "--max-tokens", "10"]);
    assert!(
        err.contains("would hold 20 tokens but the model's context is 16 tokens") && err.contains("max_tokens"),
        "{err}"
    );
}

#[test]
fn template_error_is_reported() {
    let dir = fixture_copy("qwen3_5_vl");
    std::fs::write(dir.path().join("chat_template.jinja"), "{% for m in messages %}{{ m.content }").unwrap();
    let err = fails_run(dir.path());
    assert!(err.contains("chat template") && err.contains("chat_template.jinja"), "{err}");
}

/// Values that used to be taken silently (an empty stop string, a stop id past the vocabulary,
/// loop thresholds of 0, an answer budget of 0) are errors naming the flag and what it allows;
/// negative numbers reach that validation instead of clap's "unexpected argument".
#[test]
fn generation_flags_out_of_range_name_the_flag() {
    let base = ["run", "--prompt", "Is 91 prime?", "--max-tokens", "8"];
    for (extra, want) in [
        (vec!["--stop="], "--stop \"\": must be non-empty"),
        (vec!["--stop-token-id", "99999"], "stop token id 99999 (--stop-token-id) is out of the vocabulary"),
        (vec!["--loop-min-repeats", "0"], "--loop-min-repeats 0: must be at least 2"),
        (vec!["--loop-min-span", "0"], "--loop-min-span 0: must be at least 1"),
        (vec!["--answer-budget", "0"], "--answer-budget 0: must be at least 1"),
        (vec!["--temperature", "-1"], "--temperature -1: must be ≥ 0"),
        (vec!["--top-p", "-0.5"], "--top-p -0.5: must be in (0, 1]"),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let err = fails(&args);
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // A negative count is refused by the flag's parser, saying what it takes.
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["run", "--prompt", "Hi", "--max-tokens", "-1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("'--max-tokens <N>': expected a whole number (0 or more), found -1"), "{err}");
}

#[test]
fn an_eos_id_past_the_vocabulary_is_refused_naming_the_field() {
    let dir = fixture_copy("qwen3_5_text");
    edit_json(&dir.path().join("config.json"), |v| v["eos_token_id"] = 4096.into());
    let err = fails_run(dir.path());
    assert!(err.contains("config.json: field `eos_token_id`: 4096 is out of the vocabulary (vocab_size 512"), "{err}");
}

#[test]
fn sweep_refuses_a_thinking_budget_next_to_thinking_budgets() {
    let err = fails(&["sweep", "--prompt", "Hi", "--thinking-budgets", "0,8", "--thinking-budget", "4"]);
    assert!(err.contains("--thinking-budget is set by each run of --thinking-budgets"), "{err}");
}

#[test]
fn a_thinking_budget_not_below_max_tokens_is_a_warning() {
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["run", "--prompt", "Is 91 prime?", "--max-tokens", "8", "--thinking-budget", "8"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("warning: --thinking-budget 8 is not below --max-tokens 8"), "{err}");
}
