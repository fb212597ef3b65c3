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

/// The MTP head reads the prompt with the model (part of prefill), so a broken head is found
/// before the first token; without drafting the same weights generate normally.
#[test]
fn nan_in_the_mtp_head_is_named_as_the_mtp_head() {
    let dir = fixture_copy("qwen3_5_moe");
    poison_bf16_nan(&dir.path().join("model.safetensors"), "mtp.fc.weight", 0);
    let r = run_with(dir.path(), &["--mtp", "2"]);
    let msg = stopped_at(&r, "the MTP head output", "mtp.*");
    assert!(msg.contains("before the first token"), "{msg}");
    assert!(!r.events.iter().any(|e| e["event"] == "token"), "{:?}", r.events);
    // Without drafting the same weights generate normally: only the head is broken.
    let plain = run_with(dir.path(), &["--mtp", "0"]);
    assert_eq!(plain.code, Some(0), "{}", plain.stderr);
}

/// A NaN that only a generated token reaches (its embedding row, untied from the LM head) stops
/// generation at that token: the tokens before it are kept, the same as a healthy run's.
#[test]
fn a_nan_reached_mid_generation_keeps_the_tokens_before_it() {
    let dir = fixture_copy("qwen3_5_text");
    let st = dir.path().join("model.safetensors");
    // Untie: an LM head equal to the embedding, so poisoning an embedding row leaves the logits.
    let bytes = std::fs::read(&st).unwrap();
    let embed = safetensors::SafeTensors::deserialize(&bytes)
        .unwrap()
        .tensor("model.embed_tokens.weight")
        .unwrap()
        .data()
        .to_vec();
    let cfg = dir.path().join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    v["tie_word_embeddings"] = false.into();
    std::fs::write(&cfg, v.to_string()).unwrap();
    let add_head = |st: &Path, row: Option<usize>| {
        let bytes = std::fs::read(st).unwrap();
        let t = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = t
            .tensors()
            .into_iter()
            .filter(|(n, _)| n != "lm_head.weight")
            .map(|(n, view)| (n, view.shape().to_vec(), view.data().to_vec()))
            .collect();
        let shape = tensors.iter().find(|(n, ..)| n == "model.embed_tokens.weight").unwrap().1.clone();
        tensors.push(("lm_head.weight".into(), shape.clone(), embed.clone()));
        if let Some(r) = row {
            let e = tensors.iter_mut().find(|(n, ..)| n == "model.embed_tokens.weight").unwrap();
            let mut vals = f32s(&e.2);
            vals[r * shape[1]..(r + 1) * shape[1]].fill(f32::NAN);
            e.2 = f32_bytes(&vals);
        }
        let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
            .iter()
            .map(|(n, s, b)| {
                (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap())
            })
            .collect();
        safetensors::serialize_to_file(views, None, st).unwrap();
    };
    add_head(&st, None);
    let healthy = run(dir.path());
    assert_eq!(healthy.code, Some(0), "{}", healthy.stderr);
    let ids: Vec<u64> =
        healthy.events.iter().filter(|e| e["event"] == "token").map(|e| e["id"].as_u64().unwrap()).collect();
    // The prompt's ids, to pick a token that only generation reaches.
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["run", "--model", dir.path().to_str().unwrap(), "--prompt", "Is 91 prime?", "--dry-run", "--json"])
        .output()
        .unwrap();
    let dry: Value = serde_json::from_slice(&out.stdout).unwrap();
    let prompt: Vec<u64> = dry["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    let k = (2..ids.len())
        .find(|&k| !prompt.contains(&ids[k]) && !ids[..k].contains(&ids[k]))
        .expect("a generated token that neither the prompt nor earlier tokens hold");
    add_head(&st, Some(ids[k] as usize));
    let r = run(dir.path());
    let msg = stopped_at(&r, "the embedding output", "embed_tokens.weight");
    assert!(msg.contains(&format!("generated token {}", k + 1)), "{msg}");
    let kept: Vec<u64> = r.events.iter().filter(|e| e["event"] == "token").map(|e| e["id"].as_u64().unwrap()).collect();
    assert_eq!(kept, ids[..=k].to_vec(), "the tokens up to the one that reads the NaN row are kept");
}

/// `logits --layers`: per-layer mean ‖h‖, max |x| and non-finite count over the prompt; the
/// forward pass runs on through NaN so the table shows where it starts and how it spreads.
#[test]
fn logits_layers_show_where_non_finite_values_start() {
    let healthy = fixture_copy("qwen3_5_text");
    let table = |dir: &Path| -> Vec<Value> {
        let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
            .args(["logits", "--model", dir.to_str().unwrap(), "--text", "Hi", "--raw", "--layers", "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["layers"].as_array().unwrap().clone()
    };
    let rows = table(healthy.path());
    assert_eq!(rows.len(), 4 + 1, "4 layers and the final norm: {rows:?}");
    assert_eq!(rows[4]["layer"], "final");
    for r in &rows {
        assert_eq!(r["nonfinite"], 0, "{r}");
        assert!(r["mean_norm"].as_f64().unwrap() > 0.0 && r["max_abs"].as_f64().unwrap() > 0.0, "{r}");
    }
    let broken = fixture_copy("qwen3_5_text");
    poison(&broken.path().join("model.safetensors"), "model.layers.1.mlp.down_proj.weight", 0, f32::NAN);
    let bad = table(broken.path());
    assert_eq!(bad[0], rows[0], "layer 0 is untouched");
    let counts: Vec<u64> = bad.iter().map(|r| r["nonfinite"].as_u64().unwrap()).collect();
    assert!(counts[1] > 0 && counts.iter().skip(1).all(|&c| c > 0), "from layer 1 on: {counts:?}");
    // The human table marks the first layer with non-finite values.
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["logits", "--model", broken.path().to_str().unwrap(), "--text", "Hi", "--raw", "--layers"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let marked = text.lines().find(|l| l.contains("first non-finite")).unwrap_or_else(|| panic!("{text}"));
    assert!(marked.trim_start().starts_with("1 "), "{marked}");
}

/// Issue 35, item 7: `trace` on the README's own NaN copy (layer 1's `A_log[2]` set to NaN)
/// records the pass that went non-finite — the layers it ran, head 2 of layer 1 marked — prints
/// the `nonfinite` diagnostic beside the summary, and exits 1: the generation was cut short.
#[test]
fn trace_records_the_pass_that_went_non_finite() {
    let dir = tempfile::tempdir().unwrap();
    let dst = dir.path().join("nan");
    let made = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/break_checkpoint.py"))
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/models/demo"))
        .arg(&dst)
        .args(["model.layers.1.linear_attn.A_log", "--nan", "2"])
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    let jsonl = dir.path().join("t.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["trace", "--model", dst.to_str().unwrap(), "--prompt", "Is 91 prime?", "--out"])
        .arg(&jsonl)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(!stderr.contains("no state events"), "{stderr}");
    assert!(stdout.contains("ALARM at prompt: layer 1 head 2"), "{stdout}");
    assert!(stdout.contains("nonfinite: NaN first appeared in layer 1's GDN output"), "{stdout}");
    assert!(stderr.contains("the generation stopped after 0 tokens (nonfinite"), "{stderr}");
    let states: Vec<Value> = std::fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "state")
        .collect();
    assert_eq!(states.len(), 1, "the prompt's pass, which went non-finite");
    let layers: Vec<u64> = states[0]["gdn"].as_array().unwrap().iter().map(|l| l["layer"].as_u64().unwrap()).collect();
    assert_eq!(layers, [0, 1], "the layers the pass ran, up to the failing one");
    let nonfinite = &states[0]["gdn"][1]["nonfinite"];
    assert!(nonfinite[2].as_u64().unwrap() > 0 && nonfinite[0] == 0, "head 2 alone: {nonfinite}");
}
