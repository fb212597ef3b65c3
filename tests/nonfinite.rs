//! NaN / ±Inf from the model are caught where they start: a copy of a fixture broken in one
//! place (NaN in one `down_proj`, +Inf in one norm, NaN embedding rows) makes `run` stop with
//! finish reason `error` and a `nonfinite` diagnostic naming the layer and sublayer, exit 1, and
//! say nothing of loops or `max_tokens`; `rms_norm_eps: -1` is refused when the config is read;
//! `inspect --verify-weights` names the broken tensors.

#[path = "common/fixture_edit.rs"]
mod fixture_edit;

use std::path::Path;
use std::process::Command;

use fixture_edit::{edit_tensors, f32_bytes, f32s, fixture_copy, poison, poison_bf16_nan};
use serde_json::Value;

struct Run {
    code: Option<i32>,
    events: Vec<Value>,
    stderr: String,
}

fn run(dir: &Path) -> Run {
    run_with(dir, &[])
}

fn run_with(dir: &Path, extra: &[&str]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["run", "--model", dir.to_str().unwrap(), "--prompt", "Is 91 prime?", "--max-tokens", "40"])
        .args(["--temperature", "0", "--json"])
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    Run {
        code: out.status.code(),
        events: stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect(),
        stderr: String::from_utf8_lossy(&out.stderr).to_string(),
    }
}

fn diagnostics<'a>(r: &'a Run, kind: &str) -> Vec<&'a Value> {
    r.events.iter().filter(|e| e["event"] == "diagnostic" && e["kind"] == kind).collect()
}

/// The run stopped at the first non-finite value, named `location`, and nothing else was
/// diagnosed.
fn stopped_at(r: &Run, location: &str, suspect: &str) -> String {
    assert_eq!(r.code, Some(1), "exit status; stderr: {}", r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    assert!(r.stderr.contains("NaN or ±Inf"), "{}", r.stderr);
    let done = r.events.iter().find(|e| e["event"] == "done").expect("a done event");
    assert_eq!(done["finish_reason"], "error", "{done}");
    let nf = diagnostics(r, "nonfinite");
    assert_eq!(nf.len(), 1, "one nonfinite diagnostic: {:?}", r.events);
    let msg = nf[0]["message"].as_str().unwrap().to_string();
    assert!(msg.contains(location), "{msg:?} should name {location:?}");
    assert!(msg.contains(suspect), "{msg:?} should point at {suspect:?}");
    assert!(msg.contains("rms_norm_eps") && msg.contains("dtype") && msg.contains("--verify-weights"), "{msg}");
    for other in ["degenerate_loop", "thinking_exhausted_max_tokens", "answer_truncated"] {
        assert!(diagnostics(r, other).is_empty(), "no {other} for a broken model: {:?}", r.events);
    }
    msg
}

#[test]
fn the_healthy_fixture_runs_to_the_end() {
    let dir = fixture_copy("qwen3_5_text");
    let r = run(dir.path());
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(diagnostics(&r, "nonfinite").is_empty());
    let done = r.events.iter().find(|e| e["event"] == "done").unwrap();
    assert_ne!(done["finish_reason"], "error");
}

#[test]
fn nan_in_one_down_proj_is_named_at_its_layer() {
    let dir = fixture_copy("qwen3_5_text");
    poison(&dir.path().join("model.safetensors"), "model.layers.1.mlp.down_proj.weight", 0, f32::NAN);
    let r = run(dir.path());
    let msg = stopped_at(&r, "layer 1's MLP output", "layers.1.mlp.*");
    // Found while reading the prompt: nothing was generated.
    assert!(msg.contains("NaN first appeared") && msg.contains("prompt token 1 of"), "{msg}");
    assert!(msg.contains("before the first token"), "{msg}");
    assert!(!r.events.iter().any(|e| e["event"] == "token"), "no token after the NaN");
}

#[test]
fn inf_in_one_norm_is_named_at_its_layer() {
    let dir = fixture_copy("qwen3_5_text");
    poison(&dir.path().join("model.safetensors"), "model.layers.2.input_layernorm.weight", 5, f32::INFINITY);
    let r = run(dir.path());
    stopped_at(&r, "layer 2's input norm output", "layers.2.input_layernorm.weight");
}

#[test]
fn nan_embedding_rows_are_named_as_the_embedding() {
    let dir = fixture_copy("qwen3_5_text");
    edit_tensors(&dir.path().join("model.safetensors"), |name, shape, data| {
        if name != "model.embed_tokens.weight" {
            return Some((shape.to_vec(), data.to_vec()));
        }
        // Every other row NaN (a half-written checkpoint): the prompt reads one at once.
        let mut v = f32s(data);
        let cols = shape[1];
        for row in (0..shape[0]).step_by(2) {
            v[row * cols..(row + 1) * cols].fill(f32::NAN);
        }
        Some((shape.to_vec(), f32_bytes(&v)))
    });
    let r = run(dir.path());
    stopped_at(&r, "the embedding output", "embed_tokens.weight");
}

#[test]
fn a_negative_rms_norm_eps_is_refused_naming_the_field() {
    let dir = fixture_copy("qwen3_5_text");
    let path = dir.path().join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    v["rms_norm_eps"] = (-1.0).into();
    std::fs::write(&path, v.to_string()).unwrap();
    let r = run(dir.path());
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("config.json") && r.stderr.contains("rms_norm_eps"), "{}", r.stderr);
    assert!(r.stderr.contains("found -1"), "{}", r.stderr);
    assert!(r.events.is_empty(), "nothing generated: {:?}", r.events);
}

fn verify_weights(dir: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["inspect", "--model", dir.to_str().unwrap(), "--verify-weights"])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn verify_weights_names_each_broken_tensor() {
    let dir = fixture_copy("qwen3_5_text");
    let (code, out, err) = verify_weights(dir.path());
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(out.contains("checked 55 tensors") && out.contains("all finite"), "{out}");

    let st = dir.path().join("model.safetensors");
    poison(&st, "model.layers.1.mlp.down_proj.weight", 7, f32::NAN);
    poison(&st, "model.layers.2.input_layernorm.weight", 5, f32::NEG_INFINITY);
    poison(&st, "model.layers.0.linear_attn.A_log", 2, 3.0e6);
    let (code, out, err) = verify_weights(dir.path());
    assert_eq!(code, Some(1), "non-finite weights fail: {out}{err}");
    assert!(out.contains("model.layers.1.mlp.down_proj.weight: 1 NaN of 4608 values"), "{out}");
    assert!(out.contains("model.layers.2.input_layernorm.weight: 1 -Inf of 48 values"), "{out}");
    assert!(out.contains("model.layers.0.linear_attn.A_log: 1 with |x| > 1e4 (max 3e6)"), "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("  ")).count(), 3, "only the broken tensors: {out}");
    assert!(err.contains("2 of 55 tensors hold NaN or ±Inf"), "{err}");
}

#[test]
fn nan_in_a_moe_router_is_named_as_the_router() {
    let dir = fixture_copy("qwen3_5_moe");
    poison_bf16_nan(&dir.path().join("model.safetensors"), "model.language_model.layers.0.mlp.gate.weight", 3);
    let r = run_with(dir.path(), &["--mtp", "0"]);
    stopped_at(&r, "layer 0's MoE router output", "layers.0.mlp.gate.weight");
}

/// The MTP head only drafts, so it is found at the first draft, after the first token; that
/// token is kept.
#[test]
fn nan_in_the_mtp_head_is_named_as_the_mtp_head() {
    let dir = fixture_copy("qwen3_5_moe");
    poison_bf16_nan(&dir.path().join("model.safetensors"), "mtp.fc.weight", 0);
    let healthy = run_with(fixture_copy("qwen3_5_moe").path(), &["--mtp", "0"]);
    let first = healthy.events.iter().find(|e| e["event"] == "token").unwrap()["id"].clone();
    let r = run_with(dir.path(), &["--mtp", "2"]);
    let msg = stopped_at(&r, "the MTP head output", "mtp.*");
    assert!(msg.contains("after 1 token."), "{msg}");
    let tokens: Vec<&Value> = r.events.iter().filter(|e| e["event"] == "token").collect();
    assert_eq!(tokens.len(), 1, "the token before the draft is kept: {:?}", r.events);
    assert_eq!(tokens[0]["id"], first);
    // Without drafting the same weights generate normally: only the head is broken.
    let plain = run_with(dir.path(), &["--mtp", "0"]);
    assert_eq!(plain.code, Some(0), "{}", plain.stderr);
}
