//! The state trace (`--trace-state`): β, g and the state norms against an independent NumPy
//! computation (layer 0 of the fixtures and the demo model, from the model-spec formulas in
//! float64: tests/state/layer0_reference.py), the trace of a prefill against feeding the same
//! tokens one by one (every GDN layer), and the engine's `state` events.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

use deltascope_engine::{GenerateRequest, Generator, ModelSequence};
use deltascope_model::{
    ForwardOptions, GdnPassTrace, LayerKind, LayerTrace, LoadOptions, Model, ModelSource, StateTrace, read_config,
};
use deltascope_protocol::TextTokenizer;
use deltascope_protocol::{EngineEvent, GenerationParams, MtpMode};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The fixtures with one safetensors file — the Qwen3.5 layout (separate in_proj_qkv / z / b / a)
/// and Qwen3-Next's fused, per-key-head one — and the demo model.
const QWEN35: [&str; 4] =
    ["tests/fixtures/qwen3_5_text", "tests/fixtures/qwen3_5_moe", "tests/fixtures/qwen3_next", "models/demo"];
/// Every architecture, for the engine's own invariants.
const ALL: [&str; 5] = [
    "tests/fixtures/qwen3_5_text",
    "tests/fixtures/qwen3_5_moe",
    "tests/fixtures/qwen3_5_vl",
    "tests/fixtures/qwen3_next",
    "models/demo",
];

fn load(dir: &str) -> Model {
    Model::load(&ModelSource::Dir(root().join(dir)), &LoadOptions::default()).unwrap()
}

fn ids(model: &Model, n: usize) -> Vec<u32> {
    // Spread over the vocabulary, deterministic.
    (0..n).map(|i| ((i * 7919 + 13) % model.config().vocab_size) as u32).collect()
}

fn traced(model: &Model, state: &mut deltascope_model::SequenceState, ids: &[u32]) -> StateTrace {
    let opts = ForwardOptions { trace_state: true, ..Default::default() };
    model.forward(ids, state, opts).unwrap().state_trace.expect("a trace was asked for")
}

fn gdn(t: &StateTrace, layer: usize) -> &GdnPassTrace {
    match &t.layers[layer] {
        LayerTrace::Gdn(p) => p,
        other => panic!("layer {layer} is not a GDN layer: {other:?}"),
    }
}

/// |a − b| ≤ rel·|b| + abs.
fn close(a: f32, b: f64, rel: f64, abs: f64) -> bool {
    ((a as f64) - b).abs() <= rel * b.abs() + abs
}

fn python() -> String {
    let out = Command::new("bash").arg(root().join("scripts/setup-openai.sh")).output().expect("running bash");
    assert!(out.status.success(), "scripts/setup-openai.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("OPENAI_PYTHON=").map(str::to_string))
        .expect("setup-openai.sh names the python")
}

#[test]
fn layer_zero_matches_an_independent_numpy_computation() {
    let py = python();
    for dir in QWEN35 {
        let model = load(dir);
        let ids = ids(&model, 80);
        let out = Command::new(&py)
            .arg(root().join("tests/state/layer0_reference.py"))
            .arg(root().join(dir))
            .arg(serde_json::to_string(&ids).unwrap())
            .output()
            .unwrap();
        assert!(out.status.success(), "{dir}: {}", String::from_utf8_lossy(&out.stderr));
        let reference: Value = serde_json::from_slice(&out.stdout).unwrap();
        let at = |key: &str, t: usize, h: usize| reference[key][t][h].as_f64().unwrap();
        // Token by token: every metric after every token.
        let mut state = model.new_state();
        let mut worst = 0f64;
        for (t, &id) in ids.iter().enumerate() {
            let trace = traced(&model, &mut state, &[id]);
            let p = gdn(&trace, 0);
            for h in 0..p.heads {
                for (name, ours, theirs) in [
                    ("beta", p.beta[h], at("beta", t, h)),
                    ("g", p.g[h], at("g", t, h)),
                    ("state_norm", p.state_norm[h], at("state_norm", t, h)),
                    ("delta_norm", p.delta_norm[h], at("delta_norm", t, h)),
                ] {
                    worst = worst.max(((ours as f64) - theirs).abs() / theirs.abs().max(1e-30));
                    assert!(
                        close(ours, theirs, 1e-5, 1e-8),
                        "{dir}: token {t} head {h}: {name} is {ours}, NumPy says {theirs}"
                    );
                }
                assert_eq!(p.nonfinite[h], 0);
            }
        }
        // The prefill (the chunked rule): β and g of every token, the norm at the end.
        let mut state = model.new_state();
        let trace = traced(&model, &mut state, &ids);
        let p = gdn(&trace, 0);
        let last = ids.len() - 1;
        for t in 0..ids.len() {
            for h in 0..p.heads {
                assert!(close(p.beta[t * p.heads + h], at("beta", t, h), 1e-5, 1e-8), "{dir}: prefill beta {t} {h}");
                assert!(close(p.g[t * p.heads + h], at("g", t, h), 1e-5, 1e-8), "{dir}: prefill g {t} {h}");
            }
        }
        for h in 0..p.heads {
            assert!(close(p.state_norm[h], at("state_norm", last, h), 1e-5, 1e-8), "{dir}: prefill ‖S‖ head {h}");
            // From a zero state the whole prefill's change is the state itself.
            assert_eq!(p.delta_norm[h], p.state_norm[h]);
        }
        eprintln!("{dir}: layer 0, 80 tokens: worst relative difference from NumPy {worst:.2e}");
    }
}

#[test]
fn the_trace_of_a_prefill_equals_feeding_the_tokens_one_by_one() {
    for dir in ALL {
        let model = load(dir);
        // Past one 64-token chunk of the chunked rule.
        let ids = ids(&model, 100);
        let mut whole = model.new_state();
        let prefill = traced(&model, &mut whole, &ids);
        let mut single = model.new_state();
        let steps: Vec<StateTrace> = ids.iter().map(|&id| traced(&model, &mut single, &[id])).collect();
        assert_eq!(prefill.layers.len(), model.config().num_hidden_layers);
        for (layer, lt) in prefill.layers.iter().enumerate() {
            match lt {
                LayerTrace::Gdn(p) => {
                    assert_eq!(p.tokens, ids.len());
                    for (t, step) in steps.iter().enumerate() {
                        let s = gdn(step, layer);
                        for h in 0..p.heads {
                            let (b, g) = (p.beta[t * p.heads + h], p.g[t * p.heads + h]);
                            // Prefill (GEMM) and decode (GEMV) sum the projections in different
                            // orders: a few f32 roundings apart after 6 layers (1.1e-5 seen).
                            assert!(
                                close(b, s.beta[h] as f64, 5e-5, 1e-7),
                                "{dir} L{layer} t{t} h{h}: β {b} vs {}",
                                s.beta[h]
                            );
                            assert!(
                                close(g, s.g[h] as f64, 5e-5, 1e-6),
                                "{dir} L{layer} t{t} h{h}: g {g} vs {}",
                                s.g[h]
                            );
                        }
                    }
                    let end = gdn(steps.last().unwrap(), layer);
                    for h in 0..p.heads {
                        assert!(
                            close(p.state_norm[h], end.state_norm[h] as f64, 1e-5, 1e-7),
                            "{dir} L{layer} h{h}: ‖S‖ after the prefill {} vs one by one {}",
                            p.state_norm[h],
                            end.state_norm[h]
                        );
                        assert_eq!((p.nonfinite[h], end.nonfinite[h]), (0, 0));
                    }
                }
                LayerTrace::Attention { kv_len, kv_bytes } => {
                    let LayerTrace::Attention { kv_len: l1, kv_bytes: b1 } = steps.last().unwrap().layers[layer] else {
                        panic!("{dir}: layer {layer} changed kind");
                    };
                    assert_eq!((*kv_len, *kv_bytes), (l1, b1));
                    assert_eq!(*kv_len, ids.len());
                }
            }
        }
    }
}

#[test]
fn the_engine_emits_a_state_event_after_the_prompt_and_every_token_read() {
    let source = ModelSource::Dir(root().join("models/demo"));
    let model = Model::load(&source, &LoadOptions::default()).unwrap();
    let config = read_config(&source).unwrap();
    let tok = TextTokenizer::load(&source, Some(config.vocab_size), &config.eos_token_ids).unwrap();
    let prompt = tok.encode("<|im_start|>user\nIs 91 prime?<|im_end|>\n<|im_start|>assistant\n<think>\n").unwrap();
    // Drafting asked for: tracing turns it off (the trace is per token).
    let params = GenerationParams { max_tokens: 24, trace_state: true, mtp: MtpMode::fixed(2), ..Default::default() };
    let g = Generator::new(&tok, "demo");
    let mut session = ModelSequence::with_mtp(&model);
    let mut events = vec![];
    let out = g
        .generate(
            &mut session,
            &GenerateRequest { prompt_ids: prompt.clone(), params },
            &AtomicBool::new(false),
            &mut |e| events.push(e),
        )
        .unwrap();
    assert!(out.mtp.is_none(), "no drafting while tracing");
    let states: Vec<_> =
        events.iter().filter_map(|e| if let EngineEvent::State(s) = e { Some(s) } else { None }).collect();
    // The prompt, then every generated token but the last (never fed to the model).
    assert_eq!(states.len(), out.tokens.len());
    assert_eq!((states[0].at_token, states[0].tokens, states[0].position), (None, prompt.len(), prompt.len()));
    for (i, s) in states[1..].iter().enumerate() {
        assert_eq!((s.at_token, s.tokens, s.position), (Some(i), 1, prompt.len() + i + 1));
        let gdn_layers = model.config().layer_types.iter().filter(|k| **k == LayerKind::LinearAttention).count();
        assert_eq!((s.gdn.len(), s.gdn.len() + s.attention.len()), (gdn_layers, model.config().num_hidden_layers));
        for l in &s.gdn {
            assert!(l.beta.iter().all(|b| (0.0..=1.0).contains(b)));
            assert!(l.g.iter().all(|g| *g <= 0.0));
            assert!(l.retention.iter().zip(&l.g).all(|(r, g)| (r - g.exp()).abs() <= 1e-6 * r.max(1e-30)));
        }
        assert!(s.attention.iter().all(|a| a.kv_len == s.position));
        assert_eq!(s.alarm(1e6), None);
    }
    // Off: no state events.
    let mut session = ModelSequence::new(&model);
    let mut plain = vec![];
    g.generate(
        &mut session,
        &GenerateRequest { prompt_ids: prompt, params: GenerationParams { max_tokens: 4, ..Default::default() } },
        &AtomicBool::new(false),
        &mut |e| plain.push(e),
    )
    .unwrap();
    assert!(!plain.iter().any(|e| matches!(e, EngineEvent::State(_))));
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_deltascope")
}

/// A copy of a fixture with one tensor's f32 values changed by `f(index, value)` (a broken
/// checkpoint).
fn corrupted_copy(dir: &str, tensor: &str, f: impl Fn(usize, f32) -> f32) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(root().join(dir)).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, out.path().join(p.file_name().unwrap())).unwrap();
    }
    let path = out.path().join("model.safetensors");
    let mut bytes = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let t = &header[tensor];
    assert_eq!(t["dtype"], "F32", "{tensor}");
    let (a, b) = (t["data_offsets"][0].as_u64().unwrap() as usize, t["data_offsets"][1].as_u64().unwrap() as usize);
    for (i, c) in bytes[8 + n + a..8 + n + b].chunks_mut(4).enumerate() {
        let v = f(i, f32::from_le_bytes(c.try_into().unwrap()));
        c.copy_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&path, bytes).unwrap();
    out
}

fn trace_cli(model: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(bin())
        .args(["trace", "--device", "cpu", "--prompt", "Is 91 prime?", "--max-tokens", "12", "--model"])
        .arg(model)
        .arg("--out")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn trace_writes_jsonl_a_summary_and_an_svg_and_compare_finds_the_broken_layer() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, svg) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"), dir.path().join("a.svg"));
    let fixture = root().join("tests/fixtures/qwen3_5_text");
    let out = trace_cli(&fixture, &a, &["--plot", svg.to_str().unwrap(), "--metric", "half-life"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary = String::from_utf8_lossy(&out.stdout);
    assert!(summary.starts_with("state trace: 12 passes"), "{summary}");
    assert!(summary.contains("no alarm"), "{summary}");
    // JSON Lines: the run --json events, a state event after the prompt and 11 tokens.
    let text = std::fs::read_to_string(&a).unwrap();
    let states = text.lines().filter(|l| l.starts_with(r#"{"event":"state""#)).count();
    assert_eq!(states, 12);
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("half-life"));
    // A --layer that is not a GDN layer is refused at the prompt's pass, naming the GDN layers.
    let bad = trace_cli(&fixture, &dir.path().join("c.jsonl"), &["--plot", "x.svg", "--layer", "3"]);
    assert!(!bad.status.success());
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("--layer 3 is not a GDN layer of this model (GDN layers: 0, 1, 2)"), "{err}");

    // The same checkpoint again: the traces agree (exit 0).
    let again = dir.path().join("again.jsonl");
    assert!(trace_cli(&fixture, &again, &[]).status.success());
    let same = Command::new(bin()).args(["trace", "--compare"]).arg(&a).arg(&again).output().unwrap();
    assert!(same.status.success(), "{}", String::from_utf8_lossy(&same.stdout));
    assert!(String::from_utf8_lossy(&same.stdout).contains("the traces agree"));

    // dt_bias of layer 1 shifted: layer 0 agrees, layer 1 parts at the prompt (exit 1).
    let broken = corrupted_copy("tests/fixtures/qwen3_5_text", "model.layers.1.linear_attn.dt_bias", |_, x| x + 2.0);
    assert!(trace_cli(broken.path(), &b, &[]).status.success());
    let cmp = Command::new(bin()).args(["trace", "--compare"]).arg(&a).arg(&b).output().unwrap();
    let report = String::from_utf8_lossy(&cmp.stdout);
    assert_eq!(cmp.status.code(), Some(1), "{report}");
    assert!(report.contains("layer   0: agrees"), "{report}");
    assert!(report.contains("layer   1: diverges at prompt: g head"), "{report}");
    assert!(report.contains("first divergence: layer 1 at prompt"), "{report}");
}

fn run_json(model: &Path, extra: &[&str]) -> Vec<Value> {
    let out = Command::new(bin())
        .args(["run", "--json", "--device", "cpu", "--prompt", "Is 91 prime?", "--max-tokens", "8", "--model"])
        .arg(model)
        .args(extra)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn diagnostics<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == "diagnostic" && e["kind"] == kind).collect()
}

#[test]
fn an_exploding_state_raises_one_alarm_naming_layer_and_head() {
    // The value rows of layer 2's in_proj_qkv (after 2 key heads × 8 for q and k) scaled up:
    // q and k are L2-normalised, so only v (and with it S) grows; the gated norm keeps the
    // layer's output finite, so generation goes on.
    let broken =
        corrupted_copy("tests/fixtures/qwen3_5_text", "model.layers.2.linear_attn.in_proj_qkv.weight", |i, x| {
            if i / 48 >= 32 { x * 1e6 } else { x }
        });
    let events = run_json(broken.path(), &["--trace-state"]);
    let alarms = diagnostics(&events, "state_alarm");
    assert_eq!(alarms.len(), 1, "one alarm per generation: {alarms:?}");
    let a = alarms[0];
    assert_eq!(a["layer"], 2, "{a}");
    assert!(a["head"].as_u64().unwrap() < 6, "{a}");
    let msg = a["message"].as_str().unwrap();
    assert!(msg.starts_with(&format!("layer 2, value head {}: ‖S‖ = ", a["head"])), "{msg}");
    assert!(msg.contains("after the prompt") && msg.contains("layers.2.linear_attn.*"), "{msg}");
    // The generation went on to the end.
    let done = events.iter().find(|e| e["event"] == "done").unwrap();
    assert_eq!(done["finish_reason"], "length", "{done}");
    // The healthy fixture raises none, and without the trace the broken one cannot tell.
    let healthy = run_json(&root().join("tests/fixtures/qwen3_5_text"), &["--trace-state"]);
    assert!(diagnostics(&healthy, "state_alarm").is_empty());
    assert!(diagnostics(&run_json(broken.path(), &[]), "state_alarm").is_empty());
}

#[test]
fn a_nonfinite_state_names_the_layer_and_the_head() {
    // A_log of layer 1's value head 4 is NaN: its decay, and so its state, go NaN at the first
    // token; the layer's output follows, and the forward check stops generation there.
    let broken = corrupted_copy("tests/fixtures/qwen3_5_text", "model.layers.1.linear_attn.A_log", |i, x| {
        if i == 4 { f32::NAN } else { x }
    });
    for extra in [&[][..], &["--trace-state"][..]] {
        let events = run_json(broken.path(), extra);
        let d = diagnostics(&events, "nonfinite");
        assert_eq!(d.len(), 1, "{events:?}");
        assert_eq!((d[0]["layer"].as_u64(), d[0]["head"].as_u64()), (Some(1), Some(4)), "{}", d[0]);
        let msg = d[0]["message"].as_str().unwrap();
        assert!(msg.contains("layer 1's GDN output") && msg.contains("value head 4's recurrent state holds"), "{msg}");
    }
}

#[test]
fn break_checkpoint_makes_the_broken_demo_copies_the_readme_shows() {
    let py = python();
    let dir = tempfile::tempdir().unwrap();
    let demo = root().join("models/demo");
    let break_it = |dst: &Path, args: &[&str]| {
        Command::new(&py)
            .arg(root().join("scripts/break_checkpoint.py"))
            .arg(&demo)
            .arg(dst)
            .args(args)
            .output()
            .unwrap()
    };
    // A_log of layer 1 lowered by 12 (the demo is bf16): every head of layer 1 keeps its memory.
    let keep = dir.path().join("keep");
    let out = break_it(&keep, &["model.layers.1.linear_attn.A_log", "--add", "-12"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let summary = |model: &Path| {
        let out = Command::new(bin())
            .args(["trace", "--device", "cpu", "--prompt", "Is 91 prime?", "--max-tokens", "16", "--model"])
            .arg(model)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let layer1 = |s: &str| s.lines().find(|l| l.trim_start().starts_with("1 ")).unwrap_or_default().to_string();
    // The last column: heads that keep half their memory past 1000 tokens (the demo's layer 1 has
    // one long-memory head of four, which may pass 1000 at a token; never all four).
    assert!(!layer1(&summary(&demo)).ends_with(" 4"), "{}", summary(&demo));
    assert!(layer1(&summary(&keep)).ends_with(" 4"), "{}", summary(&keep));
    // One NaN in A_log: value head 2's state goes NaN at the first prompt token.
    let nan = dir.path().join("nan");
    assert!(break_it(&nan, &["model.layers.1.linear_attn.A_log", "--nan", "2"]).status.success());
    let d = run_json(&nan, &[]);
    let d = diagnostics(&d, "nonfinite");
    assert_eq!((d[0]["layer"].as_u64(), d[0]["head"].as_u64()), (Some(1), Some(2)), "{}", d[0]);
    // A wrong name is refused, naming the tensor and what GDN tensors look like.
    let out = break_it(&dir.path().join("x"), &["model.layers.1.linear_attn.Alog", "--nan", "0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("model.layers.1.linear_attn.Alog: no such tensor") && err.contains("A_log"), "{err}");
}

/// Issue 35, items 6 and 13: `trace`'s flags are checked before anything runs — a plot not
/// named *.svg, a plot in a folder that does not exist, a tolerance that is not a finite
/// number > 0 (`-1` included, which clap would otherwise take for a flag).
#[test]
fn trace_flags_are_checked_up_front() {
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("t.png");
    let missing = dir.path().join("no/such/dir/t.svg");
    for (plot, says) in [(png.as_path(), "name the file *.svg"), (missing.as_path(), "cannot write it")] {
        let out = Command::new(bin())
            .args(["trace", "--prompt", "Is 91 prime?", "--max-tokens", "400", "--plot"])
            .arg(plot)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(!plot.exists(), "nothing written");
        assert!(out.stdout.is_empty(), "refused before generating: no summary");
    }
    let trace = dir.path().join("a.jsonl");
    std::fs::write(&trace, "").unwrap();
    for bad in ["-1", "NaN", "0", "inf"] {
        let out = Command::new(bin())
            .args(["trace", "--compare"])
            .arg(&trace)
            .arg(&trace)
            .args(["--tolerance", bad])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {stderr}");
        assert!(stderr.contains("must be a finite number > 0"), "{bad}: {stderr}");
        assert!(!stderr.contains("unexpected argument"), "{bad}: {stderr}");
    }
}
