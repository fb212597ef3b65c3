//! A GGUF run by the engine: every command that takes `--model DIR` takes the file llama.cpp
//! serves (the demo converted by `scripts/make_gguf.py`, from `scripts/setup-servers.sh`),
//! `verify` says whether the server runs the very file the reference reads, and the CUDA engine
//! refuses a GGUF in one line.

#[path = "common/llama_server.rs"]
mod llama_server;
#[path = "common/serve.rs"]
mod serve;

use std::path::Path;
use std::process::{Command, Output};

use llama_server::{Build, LlamaServer};
use serde_json::Value;
use serve::Serve;

fn ds(args: &[&str], model: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(args)
        .arg("--model")
        .arg(model)
        .output()
        .expect("running deltascope")
}

/// Standard output of a command that succeeded.
fn ok(out: &Output) -> String {
    let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "exit {:?}\nstdout:\n{o}\nstderr:\n{e}", out.status.code());
    o.to_string()
}

#[test]
fn run_logits_trace_sweep_and_bench_take_a_gguf() {
    let gguf = &llama_server::setup().demo_gguf;
    // Greedy, the GGUF (F16 of the demo's bf16 weights) answers as the demo does.
    let args = ["run", "--max-tokens", "60", "--temperature", "0", "--dtype", "f32", "--prompt", "Hello, who are you?"];
    let on_gguf = ok(&ds(&args, gguf));
    let on_demo = ok(&ds(&args, Path::new("demo")));
    let answer = |s: &str| s.lines().take_while(|l| !l.starts_with("[finish")).collect::<Vec<_>>().join("\n");
    assert_eq!(answer(&on_gguf), answer(&on_demo));
    assert!(!answer(&on_gguf).is_empty());

    let logits = ok(&ds(&["logits", "--json", "--top", "3", "--prompt", "Hi"], gguf));
    let v: Value = serde_json::from_str(logits.lines().next().unwrap()).unwrap();
    assert_eq!(v["top"].as_array().unwrap().len(), 3);

    let trace = ok(&ds(&["trace", "--prompt", "hi", "--max-tokens", "6", "--temperature", "0"], gguf));
    assert!(trace.contains("no alarm"), "{trace}");

    let sweep =
        ok(&ds(&["sweep", "--prompt", "hi", "--thinking-budgets", "4,8", "--max-tokens", "24", "--json"], gguf));
    let v: Value = serde_json::from_str(sweep.trim()).unwrap();
    assert_eq!(v["runs"].as_array().map(Vec::len), Some(2), "{sweep}");

    // bench names the file's type (F16 here: `general.file_type` 1).
    let bench = ok(&ds(
        &["bench", "--prompt-len", "24", "--max-tokens", "8", "--repeat", "1", "--warmup", "0", "--mtp", "0"],
        gguf,
    ));
    assert!(bench.contains("demo.gguf (F16) · "), "{bench}");
}

/// The f32 safetensors copy of `gguf` that the reference reader makes (`scripts/gguf_reference.py
/// hf-copy`: `gguf.quants.dequantize` of every tensor, llama.cpp's converter transforms undone
/// in numpy), with the demo's tokenizer files (the fixtures' own).
fn hf_copy(gguf: &Path) -> tempfile::TempDir {
    let setup = llama_server::setup();
    let dir = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gguf_reference.py");
    let config = gguf.parent().unwrap().join("config.json");
    let out = Command::new(&setup.xllamacpp_py)
        .arg(script)
        .arg("hf-copy")
        .arg(gguf)
        .arg(&config)
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "hf-copy {}: {}", gguf.display(), String::from_utf8_lossy(&out.stderr));
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        std::fs::copy(Path::new("models/demo").join(f), dir.path().join(f)).unwrap();
    }
    dir
}

/// Every logit (the whole vocabulary) after `ids`, in f32.
fn all_logits(model: &Path, ids: &str) -> Vec<f64> {
    let out = ok(&ds(&["logits", "--dtype", "f32", "--json", "--top", "512", "--prompt-ids", ids], model));
    let v: Value = serde_json::from_str(out.trim()).unwrap();
    let mut top: Vec<(u64, f64)> = v["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["id"].as_u64().unwrap(), e["logit"].as_f64().unwrap()))
        .collect();
    top.sort_by_key(|e| e.0);
    assert_eq!(top.len(), 512, "the whole vocabulary");
    top.into_iter().map(|e| e.1).collect()
}

/// Point 3 of the GGUF issue: with `--dtype f32`, a GGUF computes exactly what the same engine
/// computes on an f32 copy holding its dequantised weights. Both runs read identical f32
/// weight values and sum in f32 (the quantised GEMV keeps the f32 GEMV's order; the GDN output
/// projection's input is permuted instead of its columns), so the only room is f32
/// reassociation over a few hundred terms: 1e-5 of the largest logit.
#[test]
fn a_gguf_computes_what_its_dequantised_f32_copy_computes() {
    let ids = "1,40,77,300,12,198,481,5,90,260,33,411,7,128,64,2";
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf");
    let files = [
        "dense/dense-Q4_K_M.gguf",
        "dense/dense-Q5_K_M.gguf",
        "dense/dense-Q6_K.gguf",
        "dense/dense-Q8_0.gguf",
        "moe/moe-Q4_K_M.gguf",
        "next/next-Q4_K_M.gguf",
        "demo/demo-Q8_0.gguf",
    ];
    for f in files {
        let gguf = root.join(f);
        let copy = hf_copy(&gguf);
        let (a, b) = (all_logits(&gguf, ids), all_logits(copy.path(), ids));
        let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0f64, f64::max);
        assert!(scale > 0.0 && worst <= 1e-5 * scale, "{f}: max |Δlogit| {worst:e} against max |logit| {scale}");
    }
}

#[test]
fn the_cuda_engine_refuses_a_gguf_in_one_line() {
    let gguf = &llama_server::setup().demo_gguf;
    for device in ["emu", "cuda"] {
        let out = ds(&["run", "--device", device, "--prompt", "hi"], gguf);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("GGUF runs on the CPU engine; the CUDA engine reads safetensors"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

#[test]
fn verify_on_the_same_bytes_says_the_file_is_the_servers() {
    let setup = llama_server::setup();
    let server = LlamaServer::start(Build::B11549);
    let verify = |model: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
            .args(["verify", "--quick", "--json", "--server", &server.url, "--model"])
            .arg(model)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        (out.status.code(), serde_json::from_str::<Value>(text.trim()).unwrap_or(Value::Null), out)
    };
    let (code, v, out) = verify(&setup.demo_gguf);
    assert_eq!(code, Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(v["same_file"]["verdict"], "same", "{v}");
    let agree: Vec<&str> = v["same_file"]["agree"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(agree.iter().any(|a| a.starts_with("tensor bytes ")) && agree.contains(&"type F16"), "{agree:?}");
    assert_eq!(v["overall"], "agrees", "{v}");
    // A safetensors reference is not a file to compare: no judgement.
    let (_, v, _) = verify(Path::new("demo"));
    assert!(v.get("same_file").is_none(), "{v}");
}

/// Three judges: a server runs the demo as Q8_0 (llama-quantize of the demo's GGUF), the
/// reference reads that very file, and the full checkpoint is the demo's own bf16. With
/// deltascope serve as the server, serving adds only f32 reassociation, so the split must put
/// (almost) everything on quantisation; with llama.cpp on the same bytes, its activation
/// quantisation shows as serving error, and the two are reported apart.
#[test]
fn three_judges_split_quantisation_error_from_serving_error() {
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf/demo/demo-Q8_0.gguf");
    let verify = |url: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
            .args(["verify", "--quick", "--json", "--server", url, "--model"])
            .arg(&gguf)
            .args(["--against-full", "demo"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        let v: Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap_or_else(|e| panic!("{e}: {err}"));
        assert_eq!(v["same_file"]["verdict"], "same", "{err}");
        assert_eq!(v["overall"], "agrees", "{err}");
        let worst = |positions: &Value| {
            positions.as_array().unwrap().iter().filter_map(|p| p["delta"].as_f64()).fold(0f64, |m, d| m.max(d.abs()))
        };
        let (mut serving, mut quantisation) = (0f64, 0f64);
        for p in v["probes"].as_array().unwrap() {
            let q = &p["quantisation"];
            assert!(q.is_object(), "probe {} has no quantisation split: {p}", p["name"]);
            let ids = |ps: &Value| ps.as_array().unwrap().iter().map(|p| p["id"].as_u64()).collect::<Vec<_>>();
            assert_eq!(ids(&q["positions"]), ids(&p["positions"]), "both judges score the server's tokens");
            serving = serving.max(worst(&p["positions"]));
            quantisation = quantisation.max(worst(&q["positions"]));
        }
        (serving, quantisation)
    };
    // A GGUF's `--dtype auto` is f32: serve computes as the reference does.
    let ours = Serve::start(Some(&gguf));
    let (serving, quantisation) = verify(&ours.1);
    assert!(serving < 1e-3, "serving error {serving}: the server computes on the reference's own bytes");
    // Q8_0 against bf16: 0.022 nats at most on this machine; a split that lost it reads 0.
    assert!(quantisation > 5e-3, "quantisation error {quantisation}");
    drop(ours);
    let llama = LlamaServer::start_with(llama_server::ServerConfig::new(Build::B11549).model(&gguf));
    let (serving_llama, quantisation_llama) = verify(&llama.url);
    // The same tokens would give the same quantisation error; llama.cpp's greedy tokens may
    // differ after a near-tie, so only its order of size is held.
    assert!(quantisation_llama > 1e-3 && serving_llama > serving, "{serving_llama} {quantisation_llama}");
}

/// Calibration on the same bytes, broken: llama.cpp serves the demo Q8_0 with one GDN layer's
/// `ssm_out` × 3 (its Q8_0 block scales tripled: `gguf_reference.py scale`), the reference
/// reads the healthy file. Every probe diverges, at a position the report names. The metadata
/// still says "same file": sizes, type and counts cannot see a changed byte.
#[test]
fn a_gguf_with_one_tensor_scaled_diverges_where_the_report_says() {
    let setup = llama_server::setup();
    let gguf = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf/demo/demo-Q8_0.gguf");
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.gguf");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gguf_reference.py");
    let out = Command::new(&setup.xllamacpp_py)
        .arg(script)
        .args(["scale"])
        .arg(&gguf)
        .args(["blk.1.ssm_out.weight", "3"])
        .arg(&broken)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let server = LlamaServer::start_with(llama_server::ServerConfig::new(Build::B11549).model(&broken));
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["verify", "--quick", "--json", "--server", &server.url, "--model"])
        .arg(&gguf)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    let v: Value = serde_json::from_str(String::from_utf8_lossy(&out.stdout).trim()).unwrap();
    assert_eq!(v["same_file"]["verdict"], "same", "{v}");
    for p in v["probes"].as_array().unwrap() {
        let at = p["verdict"]["at"].as_u64();
        assert!(at.is_some_and(|at| at < 40), "probe {}: {}", p["name"], p["verdict"]);
    }
}

/// The status bar's backend label and the load notes: the file type beside the device and the
/// activation dtype; a file that keeps its GDN state inputs at 4-bit and carries no MTP head
/// is said to.
#[test]
fn the_status_bar_names_the_file_type_and_the_notes_say_what_a_file_lacks() {
    use deltascope::backend::local::{LocalBackend, LocalSpec};
    use deltascope::backend::{Backend, OpenProgress};
    let open = |p: &Path| {
        let spec = LocalSpec::new(Some(p), "auto").unwrap();
        LocalBackend::open(&spec, &|_: OpenProgress| {}).unwrap()
    };
    let demo = open(&llama_server::setup().demo_gguf);
    assert!(demo.info().label().contains(" · F16 · f32"), "{}", demo.info().label());
    assert_eq!(demo.info().file_type.as_deref(), Some("F16"));
    assert!(demo.info().has_mtp);
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf");
    let moe = open(&root.join("moe/moe-Q4_K_M.gguf"));
    assert!(moe.info().label().contains(" · Q4_K_M · "), "{}", moe.info().label());
    let notes = moe.info().config_notes.join("\n");
    assert!(notes.contains("GDN state inputs below 8 bits"), "{notes}");
    assert!(notes.contains("no MTP head"), "{notes}");
    assert!(!moe.info().has_mtp);
}

/// A split set (`NAME-0000i-of-0000n.gguf`, written by gguf-py's GGUFWriter with every byte of
/// every tensor kept) runs as the single file does, named by the folder or by any part; a
/// missing part is named.
#[test]
fn a_split_set_runs_as_the_single_file_and_a_missing_part_is_named() {
    let setup = llama_server::setup();
    let single = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gguf/dense/dense-Q4_K_M.gguf");
    let dir = tempfile::tempdir().unwrap();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gguf_reference.py");
    let out = Command::new(&setup.xllamacpp_py)
        .arg(script)
        .arg("split")
        .arg(&single)
        .arg("30")
        .arg(dir.path().join("dense"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let parts: Vec<_> = (1..=3).map(|i| dir.path().join(format!("dense-{i:05}-of-00003.gguf"))).collect();
    assert!(parts.iter().all(|p| p.is_file()), "gguf-py wrote three parts");
    let ids = "1,40,77,300,12,198";
    let whole = all_logits(&single, ids);
    assert_eq!(all_logits(dir.path(), ids), whole, "the folder of parts");
    assert_eq!(all_logits(&parts[1], ids), whole, "a part named");
    // inspect counts the whole set.
    let v: Value = serde_json::from_str(&ok(&ds(&["inspect", "--json"], dir.path()))).unwrap();
    let one: Value = serde_json::from_str(&ok(&ds(&["inspect", "--json"], &single))).unwrap();
    assert_eq!((v["parts"].as_u64(), v["tensors"].as_u64()), (Some(3), one["tensors"].as_u64()));
    assert_eq!(v["quant_mix"].as_array().map(Vec::len), one["quant_mix"].as_array().map(Vec::len));
    std::fs::remove_file(&parts[1]).unwrap();
    let out = ds(&["run", "--prompt", "hi"], &parts[0]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("dense-00002-of-00003.gguf") && err.contains("split set of 3"), "{err}");
}
