//! Bad input gets a specific error — naming the file, tensor or field, with expected vs found —
//! a non-zero exit, and no panic. Each case breaks a copy of a fixture and runs the real binary.

use std::path::Path;
use std::process::Command;

#[path = "common/fixture_edit.rs"]
mod fixture_edit;

use fixture_edit::{drop_tensor, edit_tensors, fixture_copy};

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
    drop_tensor(&dir.path().join("model.safetensors"), "model.layers.1.linear_attn.A_log");
    let err = fails_run(dir.path());
    assert!(
        err.contains("tensor `model.layers.1.linear_attn.A_log` not found") && err.contains("model.safetensors"),
        "{err}"
    );
}

#[test]
fn missing_lm_head_of_an_untied_model() {
    let dir = fixture_copy("qwen3_next");
    drop_tensor(&dir.path().join("model.safetensors"), "lm_head.weight");
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
        (vec!["--stop-token-id", "512"], "the model has 512 ids, 0–511"),
        (vec!["--loop-min-repeats", "0"], "--loop-min-repeats 0: must be at least 2"),
        (vec!["--loop-min-span", "0"], "--loop-min-span 0: must be at least 1"),
        (vec!["--answer-budget", "0"], "--answer-budget 0: must be at least 1"),
        (vec!["--temperature", "-1"], "--temperature -1: must be in [0, 100]"),
        (vec!["--top-p", "-0.5"], "--top-p -0.5: must be in (0, 1]"),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(extra.iter().copied()).collect();
        let err = fails(&args);
        assert!(err.contains(want), "{extra:?}: {err}");
    }
    // Refused by the flag's parser (exit 2), saying what it takes: a negative count; a number
    // past f32's range named as typed, not as the inf it would become; and (issue 35, item 18)
    // a count too large, with the limit.
    for (flag, value, want) in [
        ("--max-tokens", "-1", "'--max-tokens <N>': expected a whole number (0 or more), found -1"),
        ("--frequency-penalty", "1e39", "1e39 is beyond the range of a 32-bit float"),
        ("--max-tokens", "1e23", "1e23 is too large: a count here is at most 18446744073709551615"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
            .args(["run", "--prompt", "Hi", flag, value])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(want), "{flag} {value}: {err}");
    }
    // An infinite value is refused for not being finite, not for its sign (item 18).
    for (flag, value, want) in [
        ("--presence-penalty", "NaN", "--presence-penalty NaN: must be a finite number (in [-2, 2])"),
        ("--temperature", "inf", "--temperature inf: must be a finite number (in [0, 100]"),
    ] {
        let err = fails(&["run", "--prompt", "Hi", flag, value]);
        assert!(err.contains(want), "{flag} {value}: {err}");
    }
    // A dtype it has no path for, with the ones it has.
    let err = fails(&["run", "--prompt", "Hi", "--dtype", "fp8"]);
    assert!(err.contains("unknown dtype \"fp8\" (expected auto, f32 or bf16)"), "{err}");
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

#[test]
fn a_missing_size_names_the_field() {
    for field in ["hidden_size", "vocab_size"] {
        let dir = fixture_copy("qwen3_5_text");
        edit_json(&dir.path().join("config.json"), |v| {
            v.as_object_mut().unwrap().remove(field);
        });
        let err = fails_run(dir.path());
        assert!(err.contains(&format!("config.json: field `{field}`: missing")), "{err}");
        assert!(!err.contains("has shape"), "named before any shape check: {err}");
    }
}

/// What is at a path is named: a missing directory, a file where the directory should be, a
/// link to nothing, a link loop, a FIFO (reading it would block), a directory.
#[cfg(unix)]
#[test]
fn links_fifos_and_directories_are_named_as_such() {
    use std::os::unix::fs::symlink;
    let weights = |dir: &Path| dir.join("model.safetensors");
    let dir = fixture_copy("qwen3_5_text");
    let missing = dir.path().join("nowhere");
    assert!(fails_run(&missing).contains("nowhere: no such directory"));
    let err = fails_run(&dir.path().join("config.json"));
    assert!(err.contains("config.json: a file, not a directory"), "{err}");
    let err = fails_run(Path::new("/dev/null"));
    assert!(err.contains("/dev/null: a character device, not a directory"), "{err}");

    std::fs::remove_file(weights(dir.path())).unwrap();
    symlink("/no/such/file.safetensors", weights(dir.path())).unwrap();
    let err = fails_run(dir.path());
    assert!(
        err.contains("model.safetensors: a symbolic link to /no/such/file.safetensors, which does not exist"),
        "{err}"
    );
    let err = fails(&["inspect", "--model", dir.path().to_str().unwrap()]);
    assert!(err.contains("a symbolic link to /no/such/file.safetensors"), "inspect names it too: {err}");

    std::fs::remove_file(weights(dir.path())).unwrap();
    symlink("loop-b", weights(dir.path())).unwrap();
    symlink("model.safetensors", dir.path().join("loop-b")).unwrap();
    let err = fails_run(dir.path());
    assert!(err.contains("model.safetensors: a symbolic link loop"), "{err}");

    std::fs::remove_file(weights(dir.path())).unwrap();
    assert!(Command::new("mkfifo").arg(weights(dir.path())).status().unwrap().success());
    let err = fails_run(dir.path());
    assert!(err.contains("model.safetensors: a FIFO (named pipe), not a file"), "{err}");

    std::fs::remove_file(weights(dir.path())).unwrap();
    std::fs::create_dir(weights(dir.path())).unwrap();
    let err = fails_run(dir.path());
    assert!(err.contains("model.safetensors: a directory, not a file"), "{err}");

    // The model directory itself as a link to nothing.
    let link = dir.path().join("model-link");
    symlink(&missing, &link).unwrap();
    let err = fails_run(&link);
    assert!(err.contains("model-link: a symbolic link to") && err.contains("which does not exist"), "{err}");
}

#[test]
fn a_shard_outside_the_model_directory_is_refused() {
    let dir = fixture_copy("qwen3_5_vl");
    let index = dir.path().join("model.safetensors.index.json");
    edit_json(&index, |v| {
        let map = v["weight_map"].as_object_mut().unwrap();
        let first = map.keys().next().unwrap().clone();
        map.insert(first, "../../etc/passwd".into());
    });
    let err = fails_run(dir.path());
    assert!(
        err.contains("model.safetensors.index.json: field `weight_map.")
            && err.contains("shard \"../../etc/passwd\" is not a file inside the model directory (refused)"),
        "{err}"
    );
}

#[test]
fn a_single_file_next_to_an_index_is_reported() {
    let dir = fixture_copy("qwen3_5_vl");
    let single = fixture_copy("qwen3_5_text");
    std::fs::copy(single.path().join("model.safetensors"), dir.path().join("model.safetensors")).unwrap();
    let err = fails_run(dir.path());
    assert!(err.contains("holds both model.safetensors and model.safetensors.index.json"), "{err}");
}

#[test]
fn a_bad_safetensors_header_names_the_tensor() {
    let dir = fixture_copy("qwen3_5_text");
    let p = dir.path().join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let name = "model.layers.3.self_attn.k_proj.weight";
    header[name]["shape"][0] = 25.into();
    let mut h = serde_json::to_vec(&header).unwrap();
    h.resize(h.len().div_ceil(8) * 8, b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(&h);
    out.extend(&bytes[8 + n..]);
    std::fs::write(&p, out).unwrap();
    let err = fails_run(dir.path());
    assert!(
        err.contains(&format!("tensor `{name}`: shape [25, 48] in F32 is 4800 bytes, but its data_offsets")),
        "{err}"
    );
}

#[test]
fn an_incomplete_mtp_head_names_the_missing_tensor() {
    let dir = fixture_copy("qwen3_5_moe");
    drop_tensor(&dir.path().join("model.safetensors"), "mtp.fc.weight");
    let err = fails_run(dir.path());
    assert!(err.contains("tensor `mtp.fc.weight` not found") && err.contains("MTP head is incomplete"), "{err}");
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["inspect", "--model", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("MTP ")).unwrap();
    assert!(line.contains("INCOMPLETE") && line.contains("mtp.fc.weight"), "{line}");
}

#[test]
fn inspect_warns_when_config_and_weights_disagree() {
    let dir = fixture_copy("qwen3_5_text");
    edit_json(&dir.path().join("config.json"), |v| v["hidden_size"] = 4_000_000.into());
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["inspect", "--model", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let warnings: Vec<&str> = text.lines().filter(|l| l.starts_with("warning")).collect();
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("billion parameters") && w.contains("the config does not belong to these weights")),
        "{text}"
    );
    assert!(warnings.iter().any(|w| w.contains("embed_tokens.weight is [512, 48]")), "{text}");
    // Counts are words, never a unit that reads as bytes.
    let params = text.lines().find(|l| l.starts_with("parameters")).unwrap();
    assert!(params.contains("billion (") && !params.contains(" B "), "{params}");
}

#[test]
fn os_errors_are_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let err = fails(&["chat", "--session", dir.path().to_str().unwrap()]);
    assert_eq!(err.matches("os error 21").count(), 1, "{err}");
    let err = fails(&["run", "--prompt-file", dir.path().to_str().unwrap()]);
    assert_eq!(err.matches("os error 21").count(), 1, "{err}");
}

#[test]
fn sweep_flags_are_checked_before_any_run() {
    let err = fails(&["sweep", "--prompt", "x", "--thinking-budgets=-5"]);
    assert!(err.contains("--thinking-budgets: -5: use -1 for unlimited"), "{err}");
    // Issue 35, item 12: a budget listed twice is refused before anything runs (it printed the
    // ∞ row twice, and an interrupted sweep listed runs that never ran).
    let err = fails(&["sweep", "--prompt", "x", "--thinking-budgets=0,-1,-1"]);
    assert!(err.contains("--thinking-budgets: -1 (unlimited) is listed twice (entry 3)"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("x.png");
    let err = fails(&["sweep", "--prompt", "x", "--plot", png.to_str().unwrap()]);
    assert!(err.contains("the plot is an SVG drawing; name the file *.svg"), "{err}");
    assert!(!png.exists());
    let unwritable = dir.path().join("no-dir/x.svg");
    let err = fails(&["sweep", "--prompt", "x", "--thinking-budgets", "0,-1", "--plot", unwritable.to_str().unwrap()]);
    assert!(err.contains("--plot") && err.contains("cannot write it"), "{err}");
    assert!(!err.contains("budget"), "refused before the runs (nothing else on stderr): {err}");
}
