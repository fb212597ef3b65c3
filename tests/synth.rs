//! `deltascope synth` writes a random-weight checkpoint of any real shape, and the engine holds
//! its weights in the stored dtype: every family (dense, fused-expert MoE, per-expert MoE,
//! nested multimodal config), every storage dtype, with and without an MTP head, loads, runs,
//! and holds about the checkpoint's bytes.

use std::path::{Path, PathBuf};
use std::process::Command;

use deltascope_model::{LoadOptions, Model, ModelSource};

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_deltascope"))
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn synth(like: &Path, out: &Path, extra: &[&str]) -> String {
    let o = bin().args(["synth", "--like"]).arg(like).arg("--out").arg(out).args(extra).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).to_string()
}

#[test]
fn every_family_and_dtype_loads_runs_and_is_held_as_stored() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, dtype, mtp) in [
        ("qwen3_5_text", "bf16", true),
        ("qwen3_5_vl", "f32", false),
        ("qwen3_5_moe", "bf16", true),
        ("qwen3_next", "f16", true),
    ] {
        let out = tmp.path().join(format!("{name}-{dtype}"));
        let mut args = vec!["--dtype", dtype, "--seed", "3"];
        if mtp {
            args.push("--mtp");
        }
        let said = synth(&fixture(name), &out, &args);
        assert!(said.contains(&format!("in {dtype}")), "{said}");
        // inspect finds nothing wrong: the config matches the weights, MTP complete.
        let o = bin().args(["inspect", "--model"]).arg(&out).output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success() && !text.contains("warning"), "{name}: {text}");
        let mtp_line = text.lines().find(|l| l.starts_with("MTP ")).unwrap();
        assert_eq!(mtp_line.contains("present"), mtp, "{name}: {mtp_line}");
        // Runs, drafting when it has a head.
        let o = bin()
            .args(["run", "--model"])
            .arg(&out)
            .args(["--prompt", "Is 91 prime?", "--max-tokens", "12", "--json", "--mtp", if mtp { "2" } else { "0" }])
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", String::from_utf8_lossy(&o.stderr));
        let done = String::from_utf8_lossy(&o.stdout).lines().last().unwrap().to_string();
        assert!(done.contains("\"finish_reason\":\"length\""), "{name}: {done}");
        // Held in the stored dtype: the layers' bytes are the file's tensor bytes (norm and
        // GDN vectors are kept in f32, a few percent at most).
        let m = Model::load(&ModelSource::Dir(out.clone()), &LoadOptions::default()).unwrap();
        let stored = std::fs::metadata(out.join("model.safetensors")).unwrap().len() as f64;
        let held = m.weight_bytes() as f64;
        assert!(held <= stored * 1.1 && held >= stored * 0.8, "{name} {dtype}: holds {held} bytes, stores {stored}");
    }
}

#[test]
fn the_same_seed_writes_the_same_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let read = |d: &str| std::fs::read(tmp.path().join(d).join("model.safetensors")).unwrap();
    synth(&fixture("qwen3_5_text"), &tmp.path().join("a"), &["--seed", "7"]);
    synth(&fixture("qwen3_5_text").join("config.json"), &tmp.path().join("b"), &["--seed", "7"]);
    synth(&fixture("qwen3_5_text"), &tmp.path().join("c"), &["--seed", "8"]);
    assert_eq!(read("a"), read("b"));
    assert_ne!(read("a"), read("c"));
    // A config.json alone: the demo's tokenizer is written beside it.
    assert!(tmp.path().join("b/tokenizer.json").is_file());
    // An output directory that holds something is refused, and left as it was.
    let o = bin()
        .args(["synth", "--like"])
        .arg(fixture("qwen3_5_text"))
        .arg("--out")
        .arg(tmp.path().join("a"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("exists and is not an empty directory"));
    assert_eq!(read("a"), read("b"));
}
