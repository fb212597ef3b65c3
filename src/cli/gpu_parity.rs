//! `deltascope gpu parity`: the CUDA model against the CPU engine at `--dtype bf16` on one
//! checkpoint (the demo model by default): the logits of a prefill within a stated bf16
//! tolerance; the device's greedy answers to two probes scored token by token by the CPU engine
//! with `deltascope verify`'s own code (`verify::server::check`: the same subject, scoring and
//! verdict as `verify --device cuda|emu --dtype bf16`); MTP greedy identical to plain greedy on
//! the GPU, a two-device layer split (two streams on the one GPU; emu:N and emu:N+1 on the
//! emulated device) equal to one device, and a rejected draft restoring the GDN state exactly.
//! A developer tool (architecture.json): it drives the model and the engine directly.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use serde::Serialize;
use serde_json::json;

use crate::backend::local::{Loaded, LocalBackend, LocalSpec};
use crate::backend::{ChatMessage, OpenProgress, Role};
use crate::verify::probes::Probe;
use crate::verify::score::{Thresholds, Verdict};
use crate::verify::server;
use deltascope_engine::{GenerateRequest, Generator, ModelSequence};
use deltascope_model::DeviceSpec;
use deltascope_model::cuda::{self, CudaModel, DeviceKind, Gpu};
use deltascope_model::placement::{DeviceBudget, DevicePlan, PlanInputs, plan_devices};
use deltascope_model::{Forward, ForwardOptions, LoadOptions, LogitsRows, Mat, Model, Precision};
use deltascope_model::{ModelSource, demo_source};
use deltascope_protocol::{GenerationParams, MtpMode};

/// Logits agree when the largest difference is within this share of the largest |logit| of
/// the row: bf16 activations round at every sublayer (2⁻⁸ relative each), and the GPU's sums
/// run in another order than the CPU's, so a few bf16 ulps of the logit range build up over
/// the layers; the greedy checks below are the exact ones.
pub const LOGITS_TOL: f32 = 0.03;

#[derive(Debug, Serialize)]
pub struct Check {
    pub check: String,
    pub pass: bool,
    pub detail: String,
}

fn check(name: &str, pass: bool, detail: String) -> Check {
    Check { check: name.into(), pass, detail }
}

/// Largest |a − b| over the largest |b| of each row, the worst row.
fn rel_diff(gpu: &Mat, cpu: &Mat) -> f32 {
    if gpu.rows != cpu.rows || gpu.cols != cpu.cols {
        return f32::INFINITY;
    }
    (0..cpu.rows)
        .map(|r| {
            let scale = cpu.row(r).iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
            let d =
                gpu.row(r).iter().zip(cpu.row(r)).fold(0f32, |m, (a, b)| {
                    if a.is_nan() || b.is_nan() { f32::INFINITY } else { m.max((a - b).abs()) }
                });
            d / scale
        })
        .fold(0f32, f32::max)
}

fn argmax(x: &[f32]) -> u32 {
    x.iter().enumerate().fold((0, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32
}

/// The greedy probes: a chat that ends by itself, and a prompt generated for the whole
/// `--tokens` (`ignore_eos`) that the MTP and split checks compare in full.
struct ParityProbe {
    name: &'static str,
    user: &'static str,
    thinking: bool,
    ignore_eos: bool,
}

const PROBES: [ParityProbe; 2] = [
    ParityProbe { name: "chat", user: "Sort 93, 17, 56, 41, 8, 72.", thinking: true, ignore_eos: false },
    ParityProbe { name: "long", user: "Sort", thinking: false, ignore_eos: true },
];

impl ParityProbe {
    fn probe(&self, max_tokens: usize) -> Probe {
        Probe {
            name: self.name.into(),
            messages: vec![ChatMessage::new(Role::User, self.user.to_string())],
            thinking: self.thinking,
            max_tokens,
            ignore_eos: self.ignore_eos,
            long: false,
        }
    }
}

/// A plan on `gpus[0]`'s memory: one device, or (`split`) two with the layers halved.
fn plan(model: &Model, gpus: &[Gpu], split: bool) -> anyhow::Result<DevicePlan> {
    let g = gpus.first().ok_or_else(|| anyhow::anyhow!("no device"))?;
    let (free, _) = g.dev.memory()?;
    let n = if split { 2 } else { 1 };
    let budgets: Vec<DeviceBudget> =
        (0..n).map(|i| DeviceBudget { label: format!("{} ({i})", g.label()), free_bytes: free / n as u64 }).collect();
    let mut p = plan_devices(&model.config, &budgets, PlanInputs::for_model(&model.config));
    if split {
        let layers = p.layer_device.len();
        p.layer_device = (0..layers).map(|i| usize::from(i >= layers / 2)).collect();
    }
    Ok(p)
}

/// Greedy tokens of `m` after `prompt`, drafting `depth` tokens ahead with MTP (0: plain).
fn greedy<M: Forward>(
    m: &M,
    g: &Generator,
    prompt: &[u32],
    max_tokens: usize,
    ignore_eos: bool,
    depth: usize,
) -> anyhow::Result<Vec<u32>> {
    let params = GenerationParams { max_tokens, ignore_eos, mtp: MtpMode::fixed(depth), ..Default::default() };
    let mut s = if depth > 0 { ModelSequence::try_with_mtp(m)? } else { ModelSequence::try_new(m)? };
    let req = GenerateRequest { prompt_ids: prompt.to_vec(), params };
    Ok(g.generate(&mut s, &req, &AtomicBool::new(false), &mut |_| {})?.tokens)
}

pub fn run(
    model_dir: Option<&Path>,
    kind: DeviceKind,
    ordinal: usize,
    kernels_dir: Option<&Path>,
    tokens: usize,
    json_out: bool,
) -> anyhow::Result<()> {
    let source = match model_dir {
        None => demo_source(),
        Some(p) if p == Path::new("demo") => demo_source(),
        Some(p) => ModelSource::Dir(p.to_path_buf()),
    };
    // No device: say so before reading any weight.
    match kind {
        DeviceKind::Cuda => drop(cuda::probe()?),
        DeviceKind::Emu => drop(cuda::emu::probe()?),
    }
    let kernels = cuda::kernels::load(kernels_dir)?;
    let cpu = Model::load(&source, &LoadOptions { precision: Precision::Bf16, ..Default::default() })?;
    // The reference: the CPU engine at bf16, the device's own precision, so that what differs
    // is the kernels, not bf16 itself (`deltascope verify --device emu --dtype bf16` is this
    // check; verify's default f32 reference also counts bf16's own rounding).
    let spec = |device: DeviceSpec, dtype: &str| -> anyhow::Result<LocalSpec> {
        let mut s = LocalSpec::new(model_dir, dtype)?;
        s.device = device;
        s.kernels = kernels_dir.map(Path::to_path_buf);
        Ok(s)
    };
    let reference = Loaded::load(&spec(DeviceSpec::Cpu, "bf16")?, &|_: OpenProgress| {})?;
    let tok = &reference.tokenizer();
    let generator = Generator::new(tok, "parity");
    let one = vec![Gpu::open(kind, ordinal, kernels)?];
    let one_plan = plan(&cpu, &one, false)?;
    let gpu = CudaModel::upload(&cpu, one, &one_plan)?;
    let thresholds = Thresholds::default();
    // A check that errs (a non-finite value, a kernel launch that fails) names the kernel too.
    let checked = (|| -> anyhow::Result<Vec<Check>> {
        let mut out = vec![];

        // 0. An FP8 checkpoint stays FP8 on the device: every weight the CPU engine holds as FP8
        // is read by the FP8 kernels, not widened to bf16 on upload.
        if cpu.fp8_weights > 0 {
            let mib = |b: usize| b as f64 / (1 << 20) as f64;
            out.push(check(
                "fp8 weights on the device",
                gpu.fp8_weights == cpu.fp8_weights,
                format!(
                    "{} of the checkpoint's {} FP8 weights held as FP8 (device weights {:.2} MiB)",
                    gpu.fp8_weights,
                    cpu.fp8_weights,
                    mib(gpu.weight_bytes())
                ),
            ));
        }

        // 1. Prefill logits of every prompt position.
        let chat = reference.render(&server::request(&PROBES[0].probe(tokens)))?.1;
        let all = ForwardOptions { logits: LogitsRows::All, ..Default::default() };
        let mut cs = cpu.new_state();
        let c_pre = cpu.forward(&chat, &mut cs, all)?;
        let mut gs = gpu.new_cache()?;
        let g_pre = gpu.forward_cached(&chat, &mut gs, all)?;
        let d = rel_diff(&g_pre.logits, &c_pre.logits);
        out.push(check(
            "prefill logits",
            d <= LOGITS_TOL,
            format!("{} positions, worst row max|Δ| / max|logit| = {d:.4} (tolerance {LOGITS_TOL})", chat.len()),
        ));

        // 2. Greedy on the device, scored token by token by the CPU engine at bf16: the subject and
        // the scoring of `deltascope verify --device` (one code path). The device's greedy tokens
        // then feed the MTP and split checks.
        let device = match kind {
            DeviceKind::Cuda => DeviceSpec::Cuda(Some(vec![ordinal])),
            DeviceKind::Emu => DeviceSpec::Emu(vec![ordinal]),
        };
        let subject = LocalBackend::open(&spec(device, "bf16")?, &|_: OpenProgress| {})?;
        let mut gpu_plain = vec![];
        for probe in PROBES {
            let p = probe.probe(tokens);
            let r = server::check(&subject, &reference, &p, &thresholds)?;
            let plain: Vec<u32> = r.positions.iter().filter(|q| !q.hidden).map(|q| q.id).collect();
            let verdict = r.verdict.as_ref().map_or("not run", Verdict::name);
            let w = crate::verify::score::worst(&r.positions);
            let full = !p.ignore_eos || plain.len() >= tokens;
            out.push(check(
                &format!("greedy {}", probe.name),
                verdict == "agrees" && r.failed.is_none() && r.unmapped.is_none() && full,
                format!(
                    "{} tokens · {verdict}{} against the CPU engine at bf16 (max |Δ| {:.3} · max KL ≥ {:.4}; deltascope verify's scoring)",
                    plain.len(),
                    match (&r.verdict, &r.failed) {
                        (Some(Verdict::Diverges { at }), _) => format!(" at position {at}"),
                        (Some(Verdict::Drifts { at, .. }), _) => format!(" (worst at position {at})"),
                        (_, Some((at, why))) => format!(", failed at position {at}: {why}"),
                        _ => String::new(),
                    },
                    w.delta,
                    w.kl
                ),
            ));
            let ids = reference.render(&server::request(&p))?.1;
            gpu_plain.push((probe.name, ids, p.ignore_eos, plain));
        }

        // 3. MTP greedy on the device equals plain greedy on the device (the raw prompt: it runs
        // the whole max_tokens).
        if cpu.mtp.is_some() {
            for (label, p, ignore_eos, plain) in gpu_plain.iter().filter(|g| g.0 == "long") {
                for depth in 1..=3 {
                    let spec = greedy(&gpu, &generator, p, tokens, *ignore_eos, depth)?;
                    out.push(check(
                        &format!("mtp {depth} greedy {label}"),
                        &spec == plain,
                        format!(
                            "{} tokens, {}",
                            spec.len(),
                            if &spec == plain { "identical to plain" } else { "differs from plain" }
                        ),
                    ));
                }
            }
        }

        // 4. A rejected draft: a verify pass of three tokens of which only the first is kept leaves
        // every GDN layer's conv window and recurrent state exactly as a plain step of that token
        // does, and the next step's logits are the same bits.
        let mut a = gpu.new_cache()?;
        let mut b = gpu.new_cache()?;
        let first = argmax(c_pre.logits.row(c_pre.logits.rows - 1));
        gpu.forward_cached(&chat, &mut a, ForwardOptions::default())?;
        gpu.forward_cached(&chat, &mut b, ForwardOptions::default())?;
        let verify = ForwardOptions { verify: true, logits: LogitsRows::All, ..Default::default() };
        let wrong = (first + 1) % cpu.config.vocab_size as u32;
        gpu.forward_cached(&[first, wrong, wrong], &mut a, verify)?;
        deltascope_model::SequenceCache::accept(&mut a, 1)?;
        gpu.forward_cached(&[first], &mut b, ForwardOptions::default())?;
        let (sa, sb) = (a.gdn_states()?, b.gdn_states()?);
        let la = gpu.forward_cached(&[wrong], &mut a, ForwardOptions::default())?;
        let lb = gpu.forward_cached(&[wrong], &mut b, ForwardOptions::default())?;
        let same = sa == sb && la.logits.data == lb.logits.data;
        out.push(check(
            "rejected draft restore",
            same,
            format!(
                "verify of 3, keep 1: {} GDN layers' conv + recurrent state {} a plain step's; next logits {}",
                sa.len(),
                if sa == sb { "bit-identical to" } else { "DIFFER from" },
                if la.logits.data == lb.logits.data { "bit-identical" } else { "differ" }
            ),
        ));

        // 5. Two devices (two streams on this GPU, or emu:N and emu:N+1; layers halved) equal one.
        let two = match kind {
            DeviceKind::Cuda => vec![Gpu::open(kind, ordinal, kernels)?, Gpu::open(kind, ordinal, kernels)?],
            DeviceKind::Emu => vec![Gpu::open(kind, ordinal, kernels)?, Gpu::open(kind, ordinal + 1, kernels)?],
        };
        let two_plan = plan(&cpu, &two, true)?;
        let split = CudaModel::upload(&cpu, two, &two_plan)?;
        let mut ss = split.new_cache()?;
        let s_pre = split.forward_cached(&chat, &mut ss, all)?;
        let bit_equal = s_pre.logits.data == g_pre.logits.data;
        out.push(check(
            "split prefill logits",
            bit_equal,
            format!(
                "{}: {}",
                split.device_weights.iter().map(|d| d.0.clone()).collect::<Vec<_>>().join(" + "),
                if bit_equal { "bit-identical to one device" } else { "differ from one device" }
            ),
        ));
        for (label, p, ignore_eos, plain) in gpu_plain.iter().filter(|g| g.0 == "long") {
            let s = greedy(&split, &generator, p, tokens, *ignore_eos, 0)?;
            out.push(check(
                &format!("split greedy {label}"),
                &s == plain,
                format!(
                    "{} tokens, {}",
                    s.len(),
                    if &s == plain { "identical to one device" } else { "differ from one device" }
                ),
            ));
        }
        Ok(out)
    })();
    let out = match checked {
        Ok(out) => out,
        Err(e) => {
            let k = crate::verify::parity::name_kernels(&Gpu::open(kind, ordinal, kernels)?)?;
            anyhow::bail!("gpu parity on {}: {e}; {}", k.device, k.sentence());
        }
    };
    let pass = out.iter().all(|c| c.pass);
    // A failure names its kernel: every kernel is run on its own against its CPU twin.
    let kernels_verdict =
        if pass { None } else { Some(crate::verify::parity::name_kernels(&Gpu::open(kind, ordinal, kernels)?)?) };
    let mut w = std::io::stdout().lock();
    if json_out {
        writeln!(
            w,
            "{}",
            json!({"model": source.label(), "device": gpu.gpu(0).map(Gpu::label), "tokens": tokens, "tolerance": LOGITS_TOL, "thresholds": thresholds, "pass": pass, "checks": out, "kernels": kernels_verdict})
        )?;
    } else {
        for c in &out {
            writeln!(w, "{} {:<24} {}", if c.pass { "ok  " } else { "FAIL" }, c.check, c.detail)?;
        }
        if let Some(k) = &kernels_verdict {
            writeln!(w, "kernels: {}", k.sentence())?;
        }
    }
    w.flush()?;
    if let Some(k) = kernels_verdict {
        let failed: Vec<&str> = out.iter().filter(|c| !c.pass).map(|c| c.check.as_str()).collect();
        eprintln!(
            "error: gpu parity failed {} of {} checks ({}); {}",
            failed.len(),
            out.len(),
            failed.join(", "),
            k.sentence()
        );
        std::process::exit(2);
    }
    Ok(())
}
