//! `deltascope gpu parity`: the CUDA model against the CPU engine at `--dtype bf16` on one
//! checkpoint (the demo model by default): logits of a prefill and of decode steps within a
//! stated bf16 tolerance, greedy output identical, MTP greedy identical to plain greedy on the
//! GPU, a two-device layer split (two streams on the one GPU; emu:N and emu:N+1 on the
//! emulated device) equal to one device, and a rejected draft restoring the GDN state exactly.
//! A developer tool (architecture.json): it drives the model and the engine directly.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use serde::Serialize;
use serde_json::json;

use crate::chat::{ChatTemplate, RenderOptions, TextTokenizer};
use crate::checkpoint::{ModelSource, demo_source};
use crate::engine::{GenerateRequest, Generator, ModelSequence};
use crate::generation::{GenerationParams, MtpMode};
use crate::model::cuda::{self, CudaModel, DeviceKind, Gpu};
use crate::model::placement::plan::{DeviceBudget, DevicePlan, PlanInputs, plan_devices};
use crate::model::{Forward, ForwardOptions, LoadOptions, LogitsRows, Mat, Model, Precision};

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

/// The device fed the CPU's greedy tokens: how its argmax and logits compare at each step.
struct Forced {
    /// Steps where the device's argmax differs at a near-tie: (step, CPU id, device id, gap).
    flips: Vec<(usize, u32, u32, f32)>,
    /// Steps where it differs beyond a near-tie.
    hard: usize,
    first_hard: Option<usize>,
    /// Worst row max|Δ| / max|logit| against the CPU engine at bf16.
    worst: f32,
    /// Worst of that over the step's bar (≤ 1 passes), and the step.
    worst_ratio: f32,
    worst_step: usize,
    /// The bar at that step.
    worst_bar: f32,
}

/// One bf16 step at the magnitude of `x`.
fn bf16_step(x: f32) -> f32 {
    let b = half::bf16::from_f32(x.abs());
    half::bf16::from_bits(b.to_bits() + 1).to_f32() - b.to_f32()
}

/// The device fed `tokens` after `prompt`, against the CPU engine at bf16 (`cpu`) and at f32
/// (`exact`). A step's bar is [`LOGITS_TOL`] plus twice the CPU engine's own bf16-vs-f32
/// difference there: the device may be as far from the bf16 engine as bf16 itself is from
/// exact arithmetic (another summation order moves bf16 roundings as much), and no further.
fn teacher_forced<M: Forward>(
    cpu: &Model,
    exact: &Model,
    dev: &M,
    prompt: &[u32],
    tokens: &[u32],
) -> anyhow::Result<Forced> {
    let mut f = Forced {
        flips: vec![],
        hard: 0,
        first_hard: None,
        worst: 0.0,
        worst_ratio: 0.0,
        worst_step: 0,
        worst_bar: 0.0,
    };
    let (mut cs, mut es, mut ds) = (cpu.new_state(), exact.new_state(), dev.new_cache()?);
    let mut c = cpu.forward(prompt, &mut cs, ForwardOptions::default())?;
    let mut e = exact.forward(prompt, &mut es, ForwardOptions::default())?;
    let mut d = dev.forward_cached(prompt, &mut ds, ForwardOptions::default())?;
    for (i, &want) in tokens.iter().enumerate() {
        let diff = rel_diff(&d.logits, &c.logits);
        let bar = LOGITS_TOL + 2.0 * rel_diff(&c.logits, &e.logits);
        f.worst = f.worst.max(diff);
        if diff / bar > f.worst_ratio {
            (f.worst_ratio, f.worst_step, f.worst_bar) = (diff / bar, i, bar);
        }
        let row = c.logits.row(c.logits.rows - 1);
        let got = argmax(d.logits.row(d.logits.rows - 1));
        debug_assert_eq!(argmax(row), want);
        if got != want {
            let gap = row[want as usize] - row[got as usize];
            let scale = row.iter().fold(0f32, |m, x| m.max(x.abs()));
            // A near-tie: the two are closer than the step's bar (or one bf16 step) apart.
            if gap <= bf16_step(row[want as usize]).max(bar * scale) {
                f.flips.push((i, want, got, gap));
            } else {
                f.hard += 1;
                f.first_hard.get_or_insert(i);
            }
        }
        if i + 1 < tokens.len() {
            c = cpu.forward(&[want], &mut cs, ForwardOptions::default())?;
            e = exact.forward(&[want], &mut es, ForwardOptions::default())?;
            d = dev.forward_cached(&[want], &mut ds, ForwardOptions::default())?;
        }
    }
    Ok(f)
}

fn greedy<M: Forward>(
    m: &M,
    g: &Generator,
    prompt: &[u32],
    max_tokens: usize,
    depth: usize,
) -> anyhow::Result<Vec<u32>> {
    let params = GenerationParams { max_tokens, mtp: MtpMode::fixed(depth), ..Default::default() };
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
    // The same checkpoint at f32: how far bf16 itself is from exact arithmetic, step by step.
    let exact = Model::load(&source, &LoadOptions { precision: Precision::F32, ..Default::default() })?;
    let tok = TextTokenizer::load(&source, Some(cpu.config.vocab_size), &cpu.config.eos_token_ids)?;
    let tpl = ChatTemplate::load(&source, tok.specials.think_start.is_some())?;
    let opts = RenderOptions { add_generation_prompt: true, enable_thinking: Some(true), ..Default::default() };
    let chat = tok.encode(&tpl.render(&json!([{"role": "user", "content": "Sort 93, 17, 56, 41, 8, 72."}]), &opts)?)?;
    // A raw prompt babbles for the whole max_tokens: the greedy check compares all of them.
    let raw = tok.encode("Sort")?;
    let generator = Generator { tokenizer: &tok, model_name: "parity".into() };
    let one = vec![Gpu::open(kind, ordinal, kernels)?];
    let one_plan = plan(&cpu, &one, false)?;
    let gpu = CudaModel::upload(&cpu, one, &one_plan)?;
    let mut out = vec![];

    // 1. Prefill logits of every prompt position.
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

    // 2. Greedy: the CPU engine's greedy tokens, then the device fed the same tokens step by
    // step (its logits against the CPU's at every step, and its argmax against the CPU's
    // token). Where every argmax agrees, the device's own greedy output is those tokens (each
    // step sees the same prefix). A disagreement is allowed only at a near-tie of the CPU's
    // own logits: its top two within one bf16 step, where the summation order of any other
    // device decides (the GPU's order is not the CPU's); the comparison then goes on fed the
    // CPU's tokens, and the device's free-running greedy output is generated for the MTP checks.
    let mut gpu_plain = vec![];
    for (label, p) in [("chat", &chat), ("raw", &raw)] {
        let c = greedy(&cpu, &generator, p, tokens, 0)?;
        let forced = teacher_forced(&cpu, &exact, &gpu, p, &c)?;
        let ties: Vec<String> =
            forced.flips.iter().map(|f| format!("step {} ({} vs {}, gap {})", f.0, f.1, f.2, f.3)).collect();
        out.push(check(
            &format!("greedy {label}"),
            forced.hard == 0 && (label == "chat" || c.len() >= tokens),
            format!(
                "{} tokens; device argmax = CPU token at {}/{} steps{}{}",
                c.len(),
                c.len() - forced.flips.len() - forced.hard,
                c.len(),
                if ties.is_empty() {
                    String::new()
                } else {
                    format!("; near-ties of the CPU's bf16 logits: {}", ties.join(", "))
                },
                if forced.hard > 0 {
                    format!(
                        "; {} steps differ beyond a near-tie (first at {})",
                        forced.hard,
                        forced.first_hard.unwrap_or(0)
                    )
                } else {
                    String::new()
                }
            ),
        ));
        out.push(check(
            &format!("decode logits {label}"),
            forced.worst_ratio <= 1.0,
            format!(
                "{} steps, worst max|Δ| / max|logit| = {:.4}; worst against its step's bar: {:.4} at step {} (bar {:.4} = {LOGITS_TOL} + 2 × the engine's bf16-vs-f32 difference)",
                c.len(),
                forced.worst,
                forced.worst_ratio * forced.worst_bar,
                forced.worst_step,
                forced.worst_bar
            ),
        ));
        let plain =
            if forced.flips.is_empty() && forced.hard == 0 { c } else { greedy(&gpu, &generator, p, tokens, 0)? };
        gpu_plain.push((label, p.clone(), plain));
    }

    // 3. MTP greedy on the device equals plain greedy on the device (the raw prompt: it runs
    // the whole max_tokens).
    if cpu.mtp.is_some() {
        for (label, p, plain) in gpu_plain.iter().filter(|g| g.0 == "raw") {
            for depth in 1..=3 {
                let spec = greedy(&gpu, &generator, p, tokens, depth)?;
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
    crate::model::SequenceCache::accept(&mut a, 1)?;
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
    for (label, p, plain) in gpu_plain.iter().filter(|g| g.0 == "raw") {
        let s = greedy(&split, &generator, p, tokens, 0)?;
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

    let pass = out.iter().all(|c| c.pass);
    let mut w = std::io::stdout().lock();
    if json_out {
        writeln!(
            w,
            "{}",
            json!({"model": source.label(), "device": gpu.gpu(0).map(Gpu::label), "tokens": tokens, "tolerance": LOGITS_TOL, "pass": pass, "checks": out})
        )?;
    } else {
        for c in &out {
            writeln!(w, "{} {:<24} {}", if c.pass { "ok  " } else { "FAIL" }, c.check, c.detail)?;
        }
    }
    if !pass {
        std::process::exit(2);
    }
    Ok(())
}
