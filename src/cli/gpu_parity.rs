//! `deltascope gpu parity`: the CUDA model against the CPU engine at `--dtype bf16` on one
//! checkpoint (the demo model by default): the logits of a prefill within a stated bf16
//! tolerance; the device's greedy answers to two probes scored token by token by the CPU engine
//! with `deltascope verify`'s own code (`verify::server::check`: the same subject, scoring and
//! verdict as `verify --device cuda|emu --dtype bf16`); MTP greedy identical to plain greedy on
//! the GPU, a two-device layer split (two streams on the one GPU; emu:N and emu:N+1 on the
//! emulated device) equal to one device, and a rejected draft restoring the GDN state exactly.
//! A developer tool (architecture.json): it drives the model and the engine directly.

use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::AtomicBool;

use serde::Serialize;

use super::report::{Report, emit};
use crate::backend::local::{Loaded, LocalBackend, LocalSpec};
use crate::backend::{ChatMessage, OpenProgress, Role};
use crate::verify::parity::{KernelVerdict, name_kernels};
use crate::verify::probes::Probe;
use crate::verify::score::{Thresholds, Verdict};
use crate::verify::server::{self, ProbeReport};
use deltascope_engine::{GenerateRequest, Generator, ModelSequence};
use deltascope_model::DeviceSpec;
use deltascope_model::cuda::kernels::KernelFile;
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
    let mut p = plan_devices(model.config(), &budgets, PlanInputs::for_model(model.config()));
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

/// `gpu parity`'s result: every check, and the kernels run one by one when a check missed. The
/// fields in order are the JSON's keys.
#[derive(Serialize)]
struct ParityReport {
    model: String,
    device: Option<String>,
    tokens: usize,
    /// [`LOGITS_TOL`] widened to f64, as the JSON has always written it (0.029999999329447746).
    tolerance: f64,
    thresholds: Thresholds,
    pass: bool,
    checks: Vec<Check>,
    /// Each kernel against its CPU twin, run when a check missed (null when all passed).
    kernels: Option<KernelVerdict>,
}

impl Report for ParityReport {
    fn print_human(&self, w: &mut dyn Write) -> io::Result<()> {
        for c in &self.checks {
            writeln!(w, "{} {:<24} {}", if c.pass { "ok  " } else { "FAIL" }, c.check, c.detail)?;
        }
        if let Some(k) = &self.kernels {
            writeln!(w, "kernels: {}", k.sentence())?;
        }
        Ok(())
    }

    /// One line.
    fn print_json(&self, out: &mut dyn Write) -> io::Result<()> {
        serde_json::to_writer(&mut *out, self)?;
        writeln!(out)
    }
}

/// The device under test: its kind, ordinal and kernels, and where the model comes from.
#[derive(Clone, Copy)]
struct Target<'a> {
    kind: DeviceKind,
    ordinal: usize,
    kernels: &'static [KernelFile],
    model_dir: Option<&'a Path>,
    kernels_dir: Option<&'a Path>,
}

impl Target<'_> {
    /// The engine spec of the model on `device` at `dtype` (the kernels as `--kernels` says).
    fn spec(&self, device: DeviceSpec, dtype: &str) -> anyhow::Result<LocalSpec> {
        let mut s = LocalSpec::new(self.model_dir, dtype)?;
        s.device = device;
        s.kernels = self.kernels_dir.map(Path::to_path_buf);
        Ok(s)
    }

    /// The device as the engine names it (`cuda:N`, `emu:N`).
    fn device_spec(&self) -> DeviceSpec {
        match self.kind {
            DeviceKind::Cuda => DeviceSpec::Cuda(Some(vec![self.ordinal])),
            DeviceKind::Emu => DeviceSpec::Emu(vec![self.ordinal]),
        }
    }

    fn open(&self) -> anyhow::Result<Gpu> {
        Ok(Gpu::open(self.kind, self.ordinal, self.kernels)?)
    }

    /// Two devices for the split: two streams on this GPU, or emu:N and emu:N+1.
    fn open_two(&self) -> anyhow::Result<Vec<Gpu>> {
        let second = match self.kind {
            DeviceKind::Cuda => self.ordinal,
            DeviceKind::Emu => self.ordinal + 1,
        };
        Ok(vec![self.open()?, Gpu::open(self.kind, second, self.kernels)?])
    }

    /// Every kernel on its own against its CPU twin: what a miss is blamed on.
    fn name_kernels(&self) -> anyhow::Result<KernelVerdict> {
        Ok(name_kernels(&self.open()?)?)
    }
}

/// What the checks compare: the CPU model at bf16 and the reference engine on it, the model
/// uploaded to one device, and the generator that runs greedy on either.
struct Rig<'a> {
    target: Target<'a>,
    cpu: &'a Model,
    reference: &'a Loaded,
    generator: &'a Generator<'a>,
    gpu: &'a CudaModel,
    tokens: usize,
    thresholds: Thresholds,
}

/// Both models' logits at every position of the chat probe's prompt.
struct Prefill {
    prompt: Vec<u32>,
    cpu: Mat,
    gpu: Mat,
}

/// One probe's greedy tokens on the device (the answer, thinking left out).
struct DeviceGreedy {
    name: &'static str,
    prompt: Vec<u32>,
    ignore_eos: bool,
    tokens: Vec<u32>,
}

impl Rig<'_> {
    /// Every check in order; an error (a non-finite value, a launch that fails) ends them.
    fn checks(&self) -> anyhow::Result<Vec<Check>> {
        let mut out = vec![];
        out.extend(self.fp8_weights());
        let prefill = self.prefill()?;
        out.push(prefill_logits(&prefill));
        let (greedy_checks, greedy) = self.greedy_on_device()?;
        out.extend(greedy_checks);
        // Only the long probe runs the whole --tokens, so only it can be compared in full.
        let long: Vec<&DeviceGreedy> = greedy.iter().filter(|g| g.name == "long").collect();
        if self.cpu.mtp().is_some() {
            out.extend(self.mtp_greedy(&long)?);
        }
        out.push(self.rejected_draft(&prefill)?);
        out.extend(self.split(&prefill, &long)?);
        Ok(out)
    }

    /// Check 0: an FP8 checkpoint stays FP8 on the device: every weight the CPU engine holds
    /// as FP8 is read by the FP8 kernels, not widened to bf16 on upload.
    fn fp8_weights(&self) -> Option<Check> {
        let (cpu, gpu) = (self.cpu, self.gpu);
        if cpu.fp8_weights() == 0 {
            return None;
        }
        let mib = |b: usize| b as f64 / (1 << 20) as f64;
        Some(check(
            "fp8 weights on the device",
            gpu.fp8_weights == cpu.fp8_weights(),
            format!(
                "{} of the checkpoint's {} FP8 weights held as FP8 (device weights {:.2} MiB)",
                gpu.fp8_weights,
                cpu.fp8_weights(),
                mib(gpu.weight_bytes())
            ),
        ))
    }

    /// Check 1: the prefill logits of every prompt position, on both.
    fn prefill(&self) -> anyhow::Result<Prefill> {
        let prompt = self.reference.render(&server::request(&PROBES[0].probe(self.tokens)))?.1;
        let all = ForwardOptions { logits: LogitsRows::All, ..Default::default() };
        let cpu = self.cpu.forward(&prompt, &mut self.cpu.new_state(), all)?.logits;
        let gpu = self.gpu.forward_cached(&prompt, &mut self.gpu.new_cache()?, all)?.logits;
        Ok(Prefill { prompt, cpu, gpu })
    }

    /// Check 2: greedy on the device, scored token by token by the CPU engine at bf16: the
    /// subject and the scoring of `deltascope verify --device` (one code path). The device's
    /// greedy tokens then feed the MTP and split checks.
    fn greedy_on_device(&self) -> anyhow::Result<(Vec<Check>, Vec<DeviceGreedy>)> {
        let subject = LocalBackend::open(&self.target.spec(self.target.device_spec(), "bf16")?, &|_: OpenProgress| {})?;
        let (mut checks, mut runs) = (vec![], vec![]);
        for probe in PROBES {
            let p = probe.probe(self.tokens);
            let r = server::check(&subject, self.reference, &p, &self.thresholds)?;
            let tokens: Vec<u32> = r.positions.iter().filter(|q| !q.hidden).map(|q| q.id).collect();
            let full = !p.ignore_eos || tokens.len() >= self.tokens;
            checks.push(greedy_verdict(probe.name, &r, tokens.len(), full));
            let prompt = self.reference.render(&server::request(&p))?.1;
            runs.push(DeviceGreedy { name: probe.name, prompt, ignore_eos: p.ignore_eos, tokens });
        }
        Ok((checks, runs))
    }

    /// Check 3: MTP greedy on the device equals plain greedy on the device (the raw prompt: it
    /// runs the whole max_tokens), at each draft depth.
    fn mtp_greedy(&self, long: &[&DeviceGreedy]) -> anyhow::Result<Vec<Check>> {
        let mut out = vec![];
        for g in long {
            for depth in 1..=3 {
                let spec = greedy(self.gpu, self.generator, &g.prompt, self.tokens, g.ignore_eos, depth)?;
                let same = spec == g.tokens;
                out.push(check(
                    &format!("mtp {depth} greedy {}", g.name),
                    same,
                    format!(
                        "{} tokens, {}",
                        spec.len(),
                        if same { "identical to plain" } else { "differs from plain" }
                    ),
                ));
            }
        }
        Ok(out)
    }

    /// Check 4: a rejected draft. A verify pass of three tokens of which only the first is kept
    /// leaves every GDN layer's conv window and recurrent state exactly as a plain step of that
    /// token does, and the next step's logits are the same bits.
    fn rejected_draft(&self, prefill: &Prefill) -> anyhow::Result<Check> {
        let (gpu, chat) = (self.gpu, &prefill.prompt);
        let mut a = gpu.new_cache()?;
        let mut b = gpu.new_cache()?;
        let first = argmax(prefill.cpu.row(prefill.cpu.rows - 1));
        gpu.forward_cached(chat, &mut a, ForwardOptions::default())?;
        gpu.forward_cached(chat, &mut b, ForwardOptions::default())?;
        let verify = ForwardOptions { verify: true, logits: LogitsRows::All, ..Default::default() };
        let wrong = (first + 1) % self.cpu.config().vocab_size as u32;
        gpu.forward_cached(&[first, wrong, wrong], &mut a, verify)?;
        deltascope_model::SequenceCache::accept(&mut a, 1)?;
        gpu.forward_cached(&[first], &mut b, ForwardOptions::default())?;
        let (sa, sb) = (a.gdn_states()?, b.gdn_states()?);
        let la = gpu.forward_cached(&[wrong], &mut a, ForwardOptions::default())?;
        let lb = gpu.forward_cached(&[wrong], &mut b, ForwardOptions::default())?;
        let same = sa == sb && la.logits.data == lb.logits.data;
        Ok(check(
            "rejected draft restore",
            same,
            format!(
                "verify of 3, keep 1: {} GDN layers' conv + recurrent state {} a plain step's; next logits {}",
                sa.len(),
                if sa == sb { "bit-identical to" } else { "DIFFER from" },
                if la.logits.data == lb.logits.data { "bit-identical" } else { "differ" }
            ),
        ))
    }

    /// Check 5: two devices (two streams on this GPU, or emu:N and emu:N+1; layers halved)
    /// equal one: the prefill logits bit for bit, and the long probe's greedy tokens.
    fn split(&self, prefill: &Prefill, long: &[&DeviceGreedy]) -> anyhow::Result<Vec<Check>> {
        let two = self.target.open_two()?;
        let two_plan = plan(self.cpu, &two, true)?;
        let split = CudaModel::upload(self.cpu, two, &two_plan)?;
        let all = ForwardOptions { logits: LogitsRows::All, ..Default::default() };
        let s_pre = split.forward_cached(&prefill.prompt, &mut split.new_cache()?, all)?;
        let bit_equal = s_pre.logits.data == prefill.gpu.data;
        let mut out = vec![check(
            "split prefill logits",
            bit_equal,
            format!(
                "{}: {}",
                split.device_weights.iter().map(|d| d.0.clone()).collect::<Vec<_>>().join(" + "),
                if bit_equal { "bit-identical to one device" } else { "differ from one device" }
            ),
        )];
        for g in long {
            let s = greedy(&split, self.generator, &g.prompt, self.tokens, g.ignore_eos, 0)?;
            let same = s == g.tokens;
            out.push(check(
                &format!("split greedy {}", g.name),
                same,
                format!(
                    "{} tokens, {}",
                    s.len(),
                    if same { "identical to one device" } else { "differ from one device" }
                ),
            ));
        }
        Ok(out)
    }
}

/// The prefill check: the device's logits within [`LOGITS_TOL`] of the CPU engine's.
fn prefill_logits(p: &Prefill) -> Check {
    let d = rel_diff(&p.gpu, &p.cpu);
    check(
        "prefill logits",
        d <= LOGITS_TOL,
        format!("{} positions, worst row max|Δ| / max|logit| = {d:.4} (tolerance {LOGITS_TOL})", p.prompt.len()),
    )
}

/// One probe's greedy check from verify's scoring: it passes when verify says "agrees", the
/// generation neither failed nor left a token unmapped, and it ran in `full`.
fn greedy_verdict(name: &str, r: &ProbeReport, tokens: usize, full: bool) -> Check {
    let verdict = r.verdict.as_ref().map_or("not run", Verdict::name);
    let w = crate::verify::score::worst(&r.positions);
    let at = match (&r.verdict, &r.failed) {
        (Some(Verdict::Diverges { at }), _) => format!(" at position {at}"),
        (Some(Verdict::Drifts { at, .. }), _) => format!(" (worst at position {at})"),
        (_, Some((at, why))) => format!(", failed at position {at}: {why}"),
        _ => String::new(),
    };
    check(
        &format!("greedy {name}"),
        verdict == "agrees" && r.failed.is_none() && r.unmapped.is_none() && full,
        format!(
            "{tokens} tokens · {verdict}{at} against the CPU engine at bf16 (max |Δ| {:.3} · max KL ≥ {:.4}; deltascope verify's scoring)",
            w.delta, w.kl
        ),
    )
}

/// The checkpoint `--model` names, the embedded demo by default.
fn model_source(model_dir: Option<&Path>) -> ModelSource {
    match model_dir {
        None => demo_source(),
        Some(p) if p == Path::new("demo") => demo_source(),
        Some(p) => ModelSource::Dir(p.to_path_buf()),
    }
}

pub fn run(
    model_dir: Option<&Path>,
    kind: DeviceKind,
    ordinal: usize,
    kernels_dir: Option<&Path>,
    tokens: usize,
    json_out: bool,
) -> anyhow::Result<()> {
    if model_dir.is_some_and(deltascope_model::gguf::is_gguf) {
        anyhow::bail!("GGUF runs on the CPU engine; the CUDA engine reads safetensors");
    }
    let source = model_source(model_dir);
    // No device: say so before reading any weight.
    match kind {
        DeviceKind::Cuda => drop(cuda::probe()?),
        DeviceKind::Emu => drop(cuda::emu::probe()?),
    }
    let kernels = cuda::kernels::load(kernels_dir)?;
    let target = Target { kind, ordinal, kernels, model_dir, kernels_dir };
    let cpu = Model::load(&source, &LoadOptions { precision: Precision::Bf16, ..Default::default() })?;
    // The reference: the CPU engine at bf16, the device's own precision, so that what differs
    // is the kernels, not bf16 itself (`deltascope verify --device emu --dtype bf16` is this
    // check; verify's default f32 reference also counts bf16's own rounding).
    let reference = Loaded::load(&target.spec(DeviceSpec::Cpu, "bf16")?, &|_: OpenProgress| {})?;
    let generator = Generator::new(reference.tokenizer(), "parity");
    let one = vec![target.open()?];
    let one_plan = plan(&cpu, &one, false)?;
    let gpu = CudaModel::upload(&cpu, one, &one_plan)?;
    let rig = Rig {
        target,
        cpu: &cpu,
        reference: &reference,
        generator: &generator,
        gpu: &gpu,
        tokens,
        thresholds: Thresholds::default(),
    };
    // A check that errs (a non-finite value, a kernel launch that fails) names the kernel too.
    let checks = match rig.checks() {
        Ok(checks) => checks,
        Err(e) => {
            let k = target.name_kernels()?;
            anyhow::bail!("gpu parity on {}: {e}; {}", k.device, k.sentence());
        }
    };
    let pass = checks.iter().all(|c| c.pass);
    let report = ParityReport {
        model: source.label(),
        device: gpu.gpu(0).map(Gpu::label),
        tokens,
        tolerance: f64::from(LOGITS_TOL),
        thresholds: rig.thresholds,
        pass,
        checks,
        // A failure names its kernel: every kernel is run on its own against its CPU twin.
        kernels: if pass { None } else { Some(target.name_kernels()?) },
    };
    emit(&report, json_out)?;
    exit_on_miss(&report);
    Ok(())
}

/// Exit 2 when a check missed, naming the checks and what the kernels say.
fn exit_on_miss(report: &ParityReport) {
    let Some(k) = &report.kernels else { return };
    let failed: Vec<&str> = report.checks.iter().filter(|c| !c.pass).map(|c| c.check.as_str()).collect();
    eprintln!(
        "error: gpu parity failed {} of {} checks ({}); {}",
        failed.len(),
        report.checks.len(),
        failed.join(", "),
        k.sentence()
    );
    std::process::exit(2);
}
