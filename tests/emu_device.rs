//! The CUDA model end to end on the emulated device (`--device emu`): model parity against the
//! CPU engine on the demo model and every fixture architecture (`gpu parity --device emu`),
//! the state trace against the CPU engine's, and every front end (`run`, `sweep`, `bench`,
//! `serve`, `trace`, the workbench in tmux) running on it. The emulator needs a C++ compiler
//! (`c++`; CI installs g++); its kernel libraries are cached under the user's cache folder.

#[path = "common/tmux.rs"]
mod tmux;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_deltascope")
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deltascope(args: &[&str]) -> Output {
    Command::new(bin()).args(args).current_dir(root()).output().expect("running deltascope")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `gpu parity --device emu` on one model: every check passes, and the checks the issue names
/// are there (greedy on both prompts, MTP at depths 1-3 where the model drafts, the rejected
/// draft's exact restore, the two-device split bit-identical to one device).
fn parity(model: Option<&str>, mtp: bool) -> Value {
    let mut args = vec!["gpu", "parity", "--device", "emu", "--json"];
    if let Some(m) = model {
        args.extend(["--model", m]);
    }
    let out = deltascope(&args);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{args:?} failed ({:?}):\n{stdout}\n{}", out.status, text(&out.stderr));
    let v: Value = serde_json::from_str(stdout.trim()).expect("one JSON object");
    assert_eq!(v["pass"], true, "{v:#}");
    assert_eq!(v["device"], "emu:0", "{v:#}");
    let checks = v["checks"].as_array().expect("checks");
    let find =
        |name: &str| checks.iter().find(|c| c["check"] == name).unwrap_or_else(|| panic!("no {name:?} check in {v:#}"));
    for name in ["prefill logits", "greedy chat", "greedy long", "rejected draft restore"] {
        assert_eq!(find(name)["pass"], true, "{name}: {v:#}");
    }
    // The greedy answers are scored by verify's code, and the long probe runs the whole 64 tokens.
    for name in ["greedy chat", "greedy long"] {
        let detail = find(name)["detail"].as_str().unwrap();
        assert!(
            detail.contains("· agrees against the CPU engine at bf16") && detail.contains("verify's scoring"),
            "{detail}"
        );
    }
    assert!(find("greedy long")["detail"].as_str().unwrap().starts_with("64 tokens"), "{v:#}");
    assert_eq!(v["thresholds"]["agree_delta"], 0.15, "verify's thresholds: {v:#}");
    assert!(find("rejected draft restore")["detail"].as_str().unwrap().contains("bit-identical to a plain step"));
    let split = find("split prefill logits");
    assert!(split["detail"].as_str().unwrap().contains("emu:0 + emu:1: bit-identical"), "{split}");
    assert_eq!(find("split greedy long")["pass"], true);
    for depth in 1..=3 {
        let name = format!("mtp {depth} greedy long");
        if mtp {
            assert_eq!(find(&name)["pass"], true, "{name}: {v:#}");
        } else {
            assert!(checks.iter().all(|c| c["check"] != name.as_str()), "{name} on a model without MTP");
        }
    }
    v
}

#[test]
fn model_parity_on_the_demo_model() {
    parity(None, true);
}

#[test]
fn model_parity_on_qwen3_5_text() {
    parity(Some("tests/fixtures/qwen3_5_text"), false);
}

#[test]
fn model_parity_on_qwen3_5_moe() {
    parity(Some("tests/fixtures/qwen3_5_moe"), true);
}

#[test]
fn model_parity_on_qwen3_next() {
    parity(Some("tests/fixtures/qwen3_next"), false);
}

/// An FP8 checkpoint (Qwen's format, made by `quantize --fp8`) on the device: every parity
/// check passes with every FP8 weight of the checkpoint held as FP8 there (the FP8 GEMV, GEMM
/// and expert kernels run, nothing is widened to bf16 on upload). The demo (a trained model:
/// GDN, attention, dense MLP, MTP) and Qwen3-Next (per-head pieces of in_proj_qkvz, FP8
/// experts).
fn fp8_parity(src: &str, mtp: bool) {
    let tmp = tempfile::tempdir().unwrap();
    let dst = tmp.path().join("fp8");
    let dst = dst.to_str().unwrap();
    let out = deltascope(&["quantize", "--fp8", "--no-probe", src, dst]);
    assert!(out.status.success(), "quantize {src}: {}", text(&out.stderr));
    let v = parity(Some(dst), mtp);
    let checks = v["checks"].as_array().unwrap();
    let held = checks.iter().find(|c| c["check"] == "fp8 weights on the device").unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(held["pass"], true, "{held}");
    let detail = held["detail"].as_str().unwrap();
    let n: usize = detail.split_whitespace().next().unwrap().parse().unwrap();
    assert!(n > 0 && detail.starts_with(&format!("{n} of the checkpoint's {n} FP8 weights")), "{detail}");
}

#[test]
fn model_parity_on_the_fp8_demo_model() {
    fp8_parity("models/demo", true);
}

#[test]
fn model_parity_on_fp8_qwen3_next() {
    fp8_parity("tests/fixtures/qwen3_next", false);
}

/// Qwen3.5-MoE with its fused experts split into per-expert FP8 matrices (as Qwen's FP8 MoE
/// releases store them), MTP included. This random tiny fixture's router sits close to ties
/// (its own bf16 and f32 CPU runs differ by up to 96 % of a row's largest logit on random
/// prompts), so a change in any kernel's rounding can move its prefill row past the 3 %
/// tolerance without being wrong: look at the other FP8 parity tests first when it fails.
#[test]
fn model_parity_on_fp8_qwen3_5_moe() {
    fp8_parity("tests/fixtures/qwen3_5_moe", true);
}

#[test]
fn model_parity_on_qwen3_5_vl() {
    parity(Some("tests/fixtures/qwen3_5_vl"), true);
}

/// The state trace from the emulated device (`gdn_recurrent` writes β, g, their inputs and the
/// state's norms) agrees with the CPU engine's at bf16 at `trace --compare`'s default
/// tolerance, which it derives from the device, precision and kernels both traces record (bf16
/// against bf16 on other arithmetic: 16 bf16 steps, 6.25e-2). On the AMX Xeon the two part by
/// 2.71e-2 in ‖S‖ of layer 6, which a fixed 2e-2 called a divergence. A scaled GDN projection
/// still diverges at that tolerance, at its layer: [`a_scaled_gdn_projection_diverges_from_the_emulated_device`].
///
/// The stricter 2e-2 that `scripts/gpu-check.sh` holds a GPU to is checked here too, with
/// what one rounding step of a gate's input explains:
///
/// Whether that step is needed depends on the CPU (the emulated kernels are compiled for it): on
/// the AVX512_BF16 EPYC, on the README's memory question, the two engines' β of layer 6 head 3 (a
/// long-memory head) part by 3.43e-2 at the first generated token — 0.01202 vs 0.01245, within
/// one bf16 step of the gate input `b` and of β itself (the trace's β slack there is 7.9e-3
/// absolute) — and without the allowance the traces diverge at 2e-2; on the AVX2 EPYC they agree
/// without it too (largest 1.55e-2, g of layer 6 head 3, g ≈ −1e-4). Each trace records that
/// allowance per head (`g_slack`, `beta_slack`, from the largest |a|, |b| and β of the pass), and
/// `trace --compare` adds it to the tolerance of g and β (not of ‖S‖); that a rounding step
/// diverges without it and agrees with it is tested in `cli::trace`. (v4's "Is 91 prime?" showed the
/// same for g; on v5 that prompt parts by 3.02e-2 in g of layer 4 head 0, |g| 0.27, beyond one
/// step of `a` — a relative bar on a small value: see the README's State view section.)
const MEMORY_QUESTION: &str = "Remember the code 7305. Then read: apple river tiger maple candle rocket bridge lemon \
    pillow thunder garden falcon cherry anchor silver puzzle meadow violet comet ladder orange dolphin winter castle \
    kitten bread ocean mirror engine spring village whale crystal lantern parrot sugar island compass meteor butter. \
    What was the code?";

#[test]
fn the_state_trace_on_the_emulated_device_agrees_with_the_cpu_engine() {
    let dir = tempfile::tempdir().unwrap();
    let trace = |device: &str, dtype: &str| {
        let path = dir.path().join(format!("{device}-{dtype}.jsonl"));
        let p = path.to_str().unwrap().to_string();
        let out = deltascope(&[
            "trace",
            "--device",
            device,
            "--dtype",
            dtype,
            "--prompt",
            MEMORY_QUESTION,
            "--max-tokens",
            "24",
            "--out",
            &p,
        ]);
        assert!(out.status.success(), "trace on {device}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("state trace: 24 passes"), "{}", text(&out.stdout));
        p
    };
    let emu = trace("emu", "bf16");
    let cpu = trace("cpu", "bf16");
    let f32 = trace("cpu", "f32");
    let compare = |a: &str, b: &str| deltascope(&["trace", "--compare", a, b, "--tolerance", "2e-2"]);
    // The default: derived from what both traces record.
    let default = deltascope(&["trace", "--compare", &emu, &cpu]);
    let said = text(&default.stdout);
    assert!(default.status.success() && said.contains("the traces agree"), "emu vs cpu bf16 by default:\n{said}");
    assert!(
        said.contains("tolerance 6.25e-2 from the traces' arithmetic: bf16 (emu:0 bf16 emu vs cpu bf16 "),
        "{said}"
    );
    let same = compare(&emu, &cpu);
    if !same.status.success() {
        // Only where this CPU's kernels part from the emulator's by more than 2e-2 (the AMX
        // Xeon's ‖S‖): said, and the default above is what holds.
        eprintln!("at a fixed 2e-2 the traces part on this CPU:\n{}", text(&same.stdout));
    }
    // Without the allowance: on some CPUs they still agree (see above); where they do not, every
    // divergence is in g or β, the metrics the allowance widens — never in ‖S‖ or elsewhere.
    let strip = |p: &str| {
        let out = format!("{p}.bare.jsonl");
        let lines: Vec<String> = std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .map(|l| {
                let mut v: Value = serde_json::from_str(l).unwrap();
                let had = v["gdn"].as_array_mut().map(|ls| {
                    ls.iter_mut().all(|l| {
                        let o = l.as_object_mut().unwrap();
                        o.remove("g_slack").is_some() && o.remove("beta_slack").is_some()
                    })
                });
                assert_ne!(had, Some(false), "every GDN layer of a state event records its slack: {l}");
                v.to_string()
            })
            .collect();
        std::fs::write(&out, lines.join("\n")).unwrap();
        out
    };
    let bare = deltascope(&["trace", "--compare", &strip(&emu), &strip(&cpu)]);
    let bare_text = text(&bare.stdout);
    if bare.status.success() {
        assert!(bare_text.contains("the traces agree"), "{bare_text}");
        eprintln!("without the rounding allowance the traces agree on this CPU too");
    } else {
        let diverging: Vec<&str> = bare_text.lines().filter(|l| l.contains(": diverges at #")).collect();
        assert!(
            !diverging.is_empty() && diverging.iter().all(|l| l.contains(": g head") || l.contains(": β head")),
            "without the allowance, only g or β may part (it widens nothing else):\n{bare_text}"
        );
        eprintln!("without the rounding allowance the traces diverge on this CPU:\n{}", diverging.join("\n"));
    }
    // The f32 trace is a real trace of the same run (printed for comparison).
    eprintln!("cpu f32 vs bf16:\n{}", text(&compare(&f32, &cpu).stdout));
}

/// A copy of the demo with the value rows of layer 1's `in_proj_qkv` scaled by 1.25 (a kernel
/// that gets one projection wrong): its CPU trace against the healthy emulated device's diverges
/// at the default tolerance, first at layer 1 — the tolerance the arithmetic allows does not hide
/// a broken projection.
#[test]
fn a_scaled_gdn_projection_diverges_from_the_emulated_device() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    for e in std::fs::read_dir(root().join("models/demo")).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), broken.join(e.file_name())).unwrap();
    }
    // q and k (2 × 4 key heads × 32) come first in the rows; the value rows (4 × 32) after them.
    let (name, first_value_row, cols) = ("model.layers.1.linear_attn.in_proj_qkv.weight", 256, 192);
    let path = broken.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = vec![];
    for (n, view) in st.tensors() {
        let mut data = view.data().to_vec();
        if n == name {
            assert_eq!((view.dtype(), view.shape()), (safetensors::Dtype::BF16, &[384, cols][..]), "{n}");
            for (_, c) in data.chunks_mut(2).enumerate().filter(|(i, _)| i / cols >= first_value_row) {
                let v = half::bf16::from_le_bytes([c[0], c[1]]).to_f32() * 1.25;
                c.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
            }
        }
        tensors.push((n, view.dtype(), view.shape().to_vec(), data));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, &path).unwrap();
    let trace = |device: &str, model: &std::path::Path, out: &str| {
        let p = dir.path().join(out);
        let run = Command::new(bin())
            .args(["trace", "--device", device, "--dtype", "bf16", "--prompt", "Is 91 prime?", "--max-tokens", "8"])
            .arg("--model")
            .arg(model)
            .arg("--out")
            .arg(&p)
            .output()
            .unwrap();
        assert!(run.status.success(), "trace on {device}: {}", text(&run.stderr));
        p.to_str().unwrap().to_string()
    };
    let emu = trace("emu", &root().join("models/demo"), "emu.jsonl");
    let cpu = trace("cpu", &broken, "broken.jsonl");
    let cmp = deltascope(&["trace", "--compare", &emu, &cpu]);
    let report = text(&cmp.stdout);
    assert_eq!(cmp.status.code(), Some(1), "{report}");
    assert!(report.contains("tolerance 6.25e-2"), "{report}");
    assert!(report.contains("layer   0: agrees"), "{report}");
    assert!(report.contains("first divergence: layer 1 at prompt"), "{report}");
}

#[test]
fn run_sweep_and_bench_work_on_the_emulated_device() {
    let run = deltascope(&["run", "--device", "emu", "--prompt", "What is 2 + 3?", "--max-tokens", "12", "--json"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(text(&run.stderr).contains("emu:0: the emulated CUDA device"), "{}", text(&run.stderr));
    let events: Vec<Value> =
        text(&run.stdout).lines().filter(|l| !l.trim().is_empty()).map(|l| serde_json::from_str(l).unwrap()).collect();
    let tokens = events.iter().filter(|e| e["event"] == "token").count();
    assert_eq!(tokens, 12, "{}", text(&run.stdout));
    let done = events.iter().find(|e| e["event"] == "done").expect("a done event");
    assert_eq!(done["finish_reason"], "length", "{done}");

    let sweep = deltascope(&[
        "sweep",
        "--device",
        "emu",
        "--prompt",
        "What is 2 + 3?",
        "--thinking-budgets",
        "0,4",
        "--max-tokens",
        "40",
        "--json",
    ]);
    assert!(sweep.status.success(), "{}", text(&sweep.stderr));
    assert!(!text(&sweep.stdout).trim().is_empty());

    let bench = deltascope(&[
        "bench",
        "--device",
        "emu",
        "--prompt-len",
        "16",
        "--max-tokens",
        "4",
        "--mtp",
        "0",
        "--repeat",
        "1",
        "--warmup",
        "0",
        "--json",
    ]);
    assert!(bench.status.success(), "{}", text(&bench.stderr));
    let b: Value = serde_json::from_str(text(&bench.stdout).lines().last().unwrap_or("")).expect("bench JSON");
    assert!(b.to_string().contains("emu:0"), "bench names the device: {b}");
}

#[test]
fn serve_answers_from_the_emulated_device() {
    let mut child = Command::new(bin())
        .args(["serve", "--port", "0", "--device", "emu"])
        .current_dir(root())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting deltascope serve");
    // The device note comes on stderr before the listening line comes on stdout.
    let notes = BufReader::new(child.stderr.take().expect("stderr"));
    let notes = std::thread::spawn(move || notes.lines().map_while(Result::ok).collect::<Vec<_>>());
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr = loop {
        let line = lines.next().expect("serve exited before listening").expect("reading stdout");
        if let Some(rest) = line.split(" on http://").nth(1) {
            break rest.split_whitespace().next().expect("an address").to_string();
        }
    };
    let body = r#"{"model":"embedded:demo","messages":[{"role":"user","content":"What is 2 + 3?"}],"max_tokens":8,"temperature":0}"#;
    let out = Command::new("curl")
        .args(["-s", "-H", "content-type: application/json", "-d", body])
        .arg(format!("http://{addr}/v1/chat/completions"))
        .output()
        .expect("curl");
    let _ = child.kill();
    let _ = child.wait();
    let seen = notes.join().expect("the stderr reader");
    assert!(seen.iter().any(|l| l.contains("emulated CUDA device")), "{seen:?}");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)));
    assert_eq!(v["usage"]["completion_tokens"], 8, "{v:#}");
}

#[test]
fn the_workbench_says_it_runs_on_the_emulated_device() {
    tmux::ensure_tmux();
    let t = tmux::shell("emu");
    let d = tempfile::tempdir().unwrap();
    let dq = tmux::shell_quote(d.path());
    t.text(&format!(
        "XDG_DATA_HOME={dq} XDG_CONFIG_HOME={dq} {} chat --device emu --sessions-dir {dq} --temperature 0 --max-tokens 16; echo EXIT-CODE-$?",
        tmux::shell_quote(std::path::Path::new(bin()))
    ));
    t.keys(&["Enter"]);
    t.wait("the status bar names the emulated device", 60, |s| s.contains("emu:0 · bf16 (emulated GPU)"));
    t.text("What is 2 + 3?");
    t.keys(&["Enter"]);
    t.wait("a generation to finish", 120, |s| s.contains("finish: length"));
    t.keys(&["C-q"]);
    t.wait("the workbench to exit", 20, |s| s.contains("EXIT-CODE-0"));
}

#[test]
fn the_emulated_device_refuses_clearly() {
    // No C++ compiler: one line naming it, exit 1, before any weight is read.
    let out = Command::new(bin())
        .args(["run", "--device", "emu", "--prompt", "hi", "--max-tokens", "1"])
        .env("CXX", "/nonexistent/c++")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("no emulated device: no C++ compiler (/nonexistent/c++"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    // Past the eight emulated devices.
    let out = deltascope(&["run", "--device", "emu:9", "--prompt", "hi", "--max-tokens", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("emu:9") && text(&out.stderr).contains("at most 8"), "{}", text(&out.stderr));
    // A bad schedule is named.
    let out = Command::new(bin())
        .args(["run", "--device", "emu", "--prompt", "hi", "--max-tokens", "1"])
        .env("DELTASCOPE_EMU_SCHEDULE", "sideways")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("DELTASCOPE_EMU_SCHEDULE=\"sideways\""), "{}", text(&out.stderr));
}

/// Desk-check finding 1: the CUDA model's logits are rounded to bf16 as the CPU engine's bf16
/// head returns them (greedy then breaks exact ties toward the lower id on both).
#[test]
fn the_cuda_models_logits_are_bf16_values() {
    use deltascope_model::cuda::{CudaModel, DeviceKind, Gpu, kernels};
    use deltascope_model::demo_source;
    use deltascope_model::placement::{DeviceBudget, PlanInputs, plan_devices};
    use deltascope_model::{Forward, ForwardOptions, LoadOptions, LogitsRows, Model, Precision};
    let cpu = Model::load(&demo_source(), &LoadOptions { precision: Precision::Bf16, ..Default::default() }).unwrap();
    let gpu = Gpu::open(DeviceKind::Emu, 0, kernels::FILES).unwrap();
    let budget = [DeviceBudget { label: "emu:0".into(), free_bytes: 8 << 30 }];
    let plan = plan_devices(cpu.config(), &budget, PlanInputs::for_model(cpu.config()));
    let model = CudaModel::upload(&cpu, vec![gpu], &plan).unwrap();
    let mut cache = model.new_cache().unwrap();
    let ids: Vec<u32> = (0..12).map(|i| (i * 41 + 7) % 480).collect();
    let all = ForwardOptions { logits: LogitsRows::All, ..Default::default() };
    let out = model.forward_cached(&ids, &mut cache, all).unwrap();
    let step = model.forward_cached(&[5], &mut cache, ForwardOptions::default()).unwrap();
    for v in out.logits.data.iter().chain(&step.logits.data) {
        assert_eq!(*v, half::bf16::from_f32(*v).to_f32(), "a logit that is not a bf16 value: {v}");
    }
    assert!(out.logits.data.iter().any(|v| *v != 0.0));
}

/// Desk-check finding 2: `rope_mrope` rotates by the host's inverse frequencies (the engine's
/// own table), not by the device's `powf`: a table scaled by 1.01 moves the kernel's rotation
/// exactly as it moves the twin's.
#[test]
fn rope_rotates_by_the_hosts_table() {
    use deltascope::verify::twins;
    use deltascope_model::cuda::ops::{self, RopeParams};
    use deltascope_model::cuda::{DeviceKind, Gpu, kernels};
    let gpu = Gpu::open(DeviceKind::Emu, 0, kernels::FILES).unwrap();
    let (heads, hd, rotary) = (2usize, 64usize, 32usize);
    let table: Vec<f32> = (0..rotary / 2).map(|i| 1.01 / 1e7f32.powf((2 * i) as f32 / rotary as f32)).collect();
    let positions = [0usize, 3, 4095, 262_143];
    let x = twins::randoms(positions.len() * heads * hd, 9, 1.0);
    let dx = gpu.bf16(&x).unwrap();
    let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
    let dp = gpu.i32(&pos).unwrap();
    let r = RopeParams { rotary_dim: rotary, inv_freq: gpu.f32(&table).unwrap(), sec_h: 0, sec_w: 0 };
    ops::rope(&gpu, &dx, &dp, positions.len(), heads, heads * hd, hd, &r).unwrap();
    let mut twin = x.clone();
    twins::rope(&mut twin, &positions, heads, hd, &table);
    assert_eq!(gpu.read_bf16(&dx).unwrap(), twin);
}
