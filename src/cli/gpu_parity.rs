//! `deltascope gpu parity`: the CUDA model against the CPU engine at `--dtype bf16` on one
//! checkpoint (the demo model by default): logits of a prefill and of decode steps within a
//! stated bf16 tolerance, greedy output identical, MTP greedy identical to plain greedy on the
//! GPU, and a two-device layer split (two streams on the one GPU) equal to one device.
//! A developer tool (architecture.json): it drives the model and the engine directly.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use serde::Serialize;
use serde_json::json;

use crate::chat::{ChatTemplate, RenderOptions, TextTokenizer};
use crate::checkpoint::{ModelSource, demo_source};
use crate::engine::{GenerateRequest, GenerationParams, Generator, ModelSession, MtpParams};
use crate::model::cuda::{self, CudaModel};
use crate::model::device_plan::{DeviceBudget, DevicePlan, PlanInputs, plan_devices};
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

/// A plan on `ordinal` alone, or (`split`) across it twice with the layers halved.
fn plan(model: &Model, ordinal: usize, split: bool) -> anyhow::Result<DevicePlan> {
    let report = cuda::probe()?;
    let g = report.gpus.get(ordinal).ok_or_else(|| anyhow::anyhow!("GPU {ordinal} not found"))?;
    let n = if split { 2 } else { 1 };
    let budgets: Vec<DeviceBudget> = (0..n)
        .map(|i| DeviceBudget { label: format!("cuda:{ordinal} ({i})"), free_bytes: g.free_bytes / n as u64 })
        .collect();
    let mut p = plan_devices(&model.config, &budgets, PlanInputs::for_model(&model.config));
    if split {
        let layers = p.layer_device.len();
        p.layer_device = (0..layers).map(|i| usize::from(i >= layers / 2)).collect();
    }
    Ok(p)
}

fn greedy<M: Forward>(
    m: &M,
    g: &Generator,
    prompt: &[u32],
    max_tokens: usize,
    depth: usize,
) -> anyhow::Result<Vec<u32>> {
    let params = GenerationParams { max_tokens, mtp: MtpParams { depth, auto: false }, ..Default::default() };
    let mut s = if depth > 0 { ModelSession::try_with_mtp(m)? } else { ModelSession::try_new(m)? };
    let req = GenerateRequest { prompt_ids: prompt.to_vec(), params };
    Ok(g.generate(&mut s, &req, &AtomicBool::new(false), &mut |_| {})?.tokens)
}

pub fn run(model_dir: Option<&Path>, ordinal: usize, tokens: usize, json_out: bool) -> anyhow::Result<()> {
    let source = match model_dir {
        None => demo_source(),
        Some(p) if p == Path::new("demo") => demo_source(),
        Some(p) => ModelSource::Dir(p.to_path_buf()),
    };
    // No GPU: say so before reading any weight.
    cuda::probe()?;
    let cpu = Model::load(&source, &LoadOptions { precision: Precision::Bf16, ..Default::default() })?;
    let tok = TextTokenizer::load(&source, Some(cpu.config.vocab_size), &cpu.config.eos_token_ids)?;
    let tpl = ChatTemplate::load(&source, tok.specials.think_start.is_some())?;
    let opts = RenderOptions { add_generation_prompt: true, enable_thinking: Some(true), ..Default::default() };
    let chat = tok.encode(&tpl.render(&json!([{"role": "user", "content": "Sort 93, 17, 56, 41, 8, 72."}]), &opts)?)?;
    // A raw prompt babbles for the whole max_tokens: the greedy check compares all of them.
    let raw = tok.encode("Sort")?;
    let generator = Generator { tokenizer: &tok, model_name: "parity".into() };
    let gpu = CudaModel::upload(&cpu, &[ordinal], &plan(&cpu, ordinal, false)?)?;
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

    // 2. Decode steps, both fed the CPU's greedy tokens.
    let (mut worst, mut same_top) = (0f32, 0);
    let mut next = argmax(c_pre.logits.row(c_pre.logits.rows - 1));
    let steps = 16;
    for _ in 0..steps {
        let c = cpu.forward(&[next], &mut cs, ForwardOptions::default())?;
        let g = gpu.forward_cached(&[next], &mut gs, ForwardOptions::default())?;
        worst = worst.max(rel_diff(&g.logits, &c.logits));
        same_top += usize::from(argmax(&g.logits.data) == argmax(&c.logits.data));
        next = argmax(&c.logits.data);
    }
    out.push(check("decode logits", worst <= LOGITS_TOL, format!("{steps} steps, worst max|Δ| / max|logit| = {worst:.4} (tolerance {LOGITS_TOL}); same top-1 {same_top}/{steps}")));

    // 3. Greedy output, CPU vs GPU.
    let mut gpu_plain = vec![];
    for (label, p) in [("chat", &chat), ("raw", &raw)] {
        let c = greedy(&cpu, &generator, p, tokens, 0)?;
        let g = greedy(&gpu, &generator, p, tokens, 0)?;
        let first_diff = c.iter().zip(&g).position(|(a, b)| a != b);
        out.push(check(
            &format!("greedy {label}"),
            // The raw prompt must run the whole max_tokens: at least `tokens` compared.
            c == g && (label == "chat" || c.len() >= tokens),
            match first_diff {
                None if c.len() == g.len() => format!("{} tokens identical", c.len()),
                None => format!("lengths differ: CPU {} GPU {}", c.len(), g.len()),
                Some(i) => format!("first difference at token {i} of {}", c.len()),
            },
        ));
        gpu_plain.push((label, p.clone(), g));
    }

    // 4. MTP greedy on the GPU equals plain greedy on the GPU.
    if cpu.mtp.is_some() {
        for (label, p, plain) in &gpu_plain {
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

    // 5. Two devices (two streams on this GPU, layers halved) equal one device.
    let split = CudaModel::upload(&cpu, &[ordinal, ordinal], &plan(&cpu, ordinal, true)?)?;
    let mut ss = split.new_cache()?;
    let s_pre = split.forward_cached(&chat, &mut ss, all)?;
    let bit_equal = s_pre.logits.data == g_pre.logits.data;
    out.push(check(
        "split prefill logits",
        bit_equal,
        format!("two devices vs one: {}", if bit_equal { "bit-identical" } else { "differ" }),
    ));
    for (label, p, plain) in &gpu_plain {
        let s = greedy(&split, &generator, p, tokens, 0)?;
        out.push(check(&format!("split greedy {label}"), &s == plain, format!("{} tokens", s.len())));
    }

    let pass = out.iter().all(|c| c.pass);
    let mut w = std::io::stdout().lock();
    if json_out {
        writeln!(
            w,
            "{}",
            json!({"model": source.label(), "tokens": tokens, "tolerance": LOGITS_TOL, "pass": pass, "checks": out})
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
