//! `deltascope gpu`: what this machine has for CUDA, and the kernels compiled by its NVRTC.
//! A developer tool (architecture.json): it talks to the model's CUDA side directly.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::{Args, Subcommand};
use serde::Serialize;

use super::report::{Report, emit};
use crate::verify::parity::{self, Parity};
use deltascope_model::DeviceSpec;
use deltascope_model::cuda::device::Device;
use deltascope_model::cuda::emu::{EmuDevice, Schedule};
use deltascope_model::cuda::kernels::KernelFile;
use deltascope_model::cuda::probe::{GpuInfo, Libraries};
use deltascope_model::cuda::{self, DeviceKind, Gpu, kernels, nvrtc};
use deltascope_model::human_bytes;

#[derive(Args, Debug)]
pub struct GpuArgs {
    #[command(subcommand)]
    pub command: GpuCommand,
}

#[derive(Subcommand, Debug)]
pub enum GpuCommand {
    /// The CUDA libraries found (driver, NVRTC, cuBLAS, cuBLASLt) and each GPU, or the one
    /// line that says why there is none (exit 1).
    Info {
        #[arg(long)]
        json: bool,
    },
    /// Runs every kernel on a GPU (or the emulated device) against its CPU twin on random
    /// inputs (kernel-by-kernel parity); exit 1 without the device, 2 when a kernel differs
    /// beyond its tolerance. On `emu` each case runs under the forward, reverse and a random
    /// thread schedule (or those `--schedules` names), and results that depend on the schedule
    /// fail.
    Check {
        #[command(flatten)]
        on: OneDevice,
        /// The emulated device's thread schedules, comma-separated: forward, reverse, random
        /// or random:SEED [default: forward,reverse,random:24301]. `emu` only.
        #[arg(long, value_name = "LIST")]
        schedules: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// The CUDA model against the CPU engine at --dtype bf16: prefill logits within a stated
    /// tolerance, the device's greedy answers scored by `verify`'s code (they must agree), MTP
    /// greedy identical to plain greedy, a two-device layer split (two streams on one GPU, or
    /// emu:N and emu:N+1) equal to one device; exit 2 on a miss.
    Parity {
        /// A Hugging Face model directory (default: the embedded demo model).
        #[arg(long, value_name = "DIR")]
        model: Option<PathBuf>,
        #[command(flatten)]
        on: OneDevice,
        /// Greedy tokens compared per prompt.
        #[arg(long, default_value_t = 64)]
        tokens: usize,
        #[arg(long)]
        json: bool,
    },
    /// Compiles every kernel in kernels/ with this machine's NVRTC and checks its entry points
    /// (no GPU needed).
    Kernels {
        /// Target architecture (sm_90 = Hopper: H100 / H200).
        #[arg(long, default_value = "sm_90")]
        arch: String,
        /// PTX for the architecture family instead of a CUBIN.
        #[arg(long)]
        ptx: bool,
        /// Write each compiled file here.
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Compile afresh, without reading or writing the kernel cache.
        #[arg(long)]
        no_cache: bool,
        /// Kernel sources from this folder instead of the embedded copies.
        #[arg(long, value_name = "DIR")]
        kernels: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
}

pub fn run(a: GpuArgs) -> anyhow::Result<()> {
    match a.command {
        GpuCommand::Info { json } => info(json),
        GpuCommand::Kernels { arch, ptx, out, no_cache, kernels, json } => {
            compile_all(&arch, ptx, out, no_cache, kernels.as_deref(), json)
        }
        GpuCommand::Check { on, schedules, json } => {
            let (kind, n) = on.resolve()?;
            let schedules = match (kind, schedules) {
                (DeviceKind::Emu, list) => parse_schedules(list.as_deref())?,
                (DeviceKind::Cuda, None) => vec![],
                (DeviceKind::Cuda, Some(_)) => anyhow::bail!(
                    "--schedules is for the emulated device (--device emu): a GPU resumes its threads in its own order"
                ),
            };
            check(kind, n, on.kernels.as_deref(), &schedules, json)
        }
        GpuCommand::Parity { model, on, tokens, json } => {
            let (kind, n) = on.resolve()?;
            super::gpu_parity::run(model.as_deref(), kind, n, on.kernels.as_deref(), tokens, json)
        }
    }
}

/// The one device `gpu check` and `gpu parity` run on, and the kernels they compile.
#[derive(Args, Debug)]
pub struct OneDevice {
    /// The device: `cuda:N` or `emu:N`.
    #[arg(long, default_value = "cuda:0", value_name = "cuda:N|emu:N")]
    device: String,
    /// The GPU to run on (the same as --device cuda:N).
    #[arg(long, conflicts_with = "device", hide = true)]
    ordinal: Option<usize>,
    /// Kernel sources from this folder instead of the embedded copies.
    #[arg(long, value_name = "DIR")]
    kernels: Option<PathBuf>,
}

impl OneDevice {
    /// `cuda:N` / `emu:N`, or the hidden `--ordinal N`.
    fn resolve(&self) -> anyhow::Result<(DeviceKind, usize)> {
        if let Some(o) = self.ordinal {
            return Ok((DeviceKind::Cuda, o));
        }
        match DeviceSpec::parse(&self.device)? {
            DeviceSpec::Cuda(None) => Ok((DeviceKind::Cuda, 0)),
            DeviceSpec::Cuda(Some(o)) if o.len() == 1 => Ok((DeviceKind::Cuda, o[0])),
            DeviceSpec::Emu(o) if o.len() == 1 => Ok((DeviceKind::Emu, o[0])),
            _ => anyhow::bail!("--device {}: one device, cuda:N or emu:N", self.device),
        }
    }
}

/// The schedules `gpu check --device emu` runs when `--schedules` does not say.
const DEFAULT_SCHEDULES: [Schedule; 3] = [Schedule::Forward, Schedule::Reverse, Schedule::Random(0x5eed)];

/// `--schedules forward,reverse,random:7` (each as `DELTASCOPE_EMU_SCHEDULE` takes it); the
/// default when not given.
fn parse_schedules(list: Option<&str>) -> anyhow::Result<Vec<Schedule>> {
    let Some(list) = list else { return Ok(DEFAULT_SCHEDULES.to_vec()) };
    let mut out = vec![];
    for item in list.split(',').map(str::trim) {
        anyhow::ensure!(
            !item.is_empty(),
            "--schedules {list:?}: an empty schedule; expected a comma-separated list of forward, reverse, random or random:SEED"
        );
        let s = Schedule::parse(item).map_err(|_| {
            anyhow::anyhow!(
                "--schedules {list:?}: {item:?} is not a schedule; expected forward, reverse, random or random:SEED"
            )
        })?;
        out.push(s);
    }
    Ok(out)
}

/// `gpu check`: every kernel case against its CPU twin, on one device.
#[derive(Serialize)]
struct KernelCheckReport {
    device: String,
    gpu: GpuInfo,
    /// The emulated device's schedules (null on a GPU).
    schedules: Option<Vec<String>>,
    #[serde(serialize_with = "widened")]
    results: Vec<Parity>,
    /// The text's architecture: `sm_90`, or "emulated" (the JSON has `gpu.compute_capability`).
    #[serde(skip)]
    arch: String,
}

impl Report for KernelCheckReport {
    fn print_human(&self, w: &mut dyn Write) -> io::Result<()> {
        let under = self.schedules.as_ref().map(|n| format!(" · schedules {}", n.join(", "))).unwrap_or_default();
        writeln!(w, "{} {} ({}){under}", self.device, self.gpu.name, self.arch)?;
        for r in &self.results {
            writeln!(
                w,
                "  {:<22} {:<44} max |Δ| {:.3e} · rel {:.3e} (≤ {:.1e}) {:>6.2}s {}",
                r.kernel,
                r.case,
                r.max_abs,
                r.max_rel,
                r.tolerance,
                r.seconds,
                if r.pass { "ok" } else { "FAIL" }
            )?;
        }
        Ok(())
    }
}

/// Serialises `value` as it went through `serde_json::Value` before, an f32 inside widened to
/// f64 (`max_abs` 0.1 as 0.10000000149011612), so the JSON stays byte for byte what it was.
fn widened<T: Serialize, S: serde::Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(value).map_err(serde::ser::Error::custom)?.serialize(s)
}

/// Every kernel case on the device: on a GPU once, on the emulated device under each schedule.
fn kernel_check_report(
    kind: DeviceKind,
    ordinal: usize,
    kernels: Option<&Path>,
    schedules: &[Schedule],
) -> anyhow::Result<KernelCheckReport> {
    let kernels = cuda::kernels::load(kernels)?;
    let (gpu, results) = match kind {
        DeviceKind::Cuda => {
            let gpu = Gpu::open(kind, ordinal, kernels)?;
            let mut results = parity::run_all(&gpu)?;
            results.extend(parity::long_grids(&gpu)?);
            (gpu, results)
        }
        DeviceKind::Emu => emu_check(ordinal, kernels, schedules)?,
    };
    Ok(KernelCheckReport {
        device: gpu.label(),
        arch: if gpu.dev.emulated() { "emulated".to_string() } else { gpu.info.arch() },
        gpu: gpu.info,
        schedules: (!schedules.is_empty()).then(|| schedules.iter().map(Schedule::to_string).collect()),
        results,
    })
}

/// `gpu check`; exit 2 when a kernel differs from its twin beyond its tolerance.
fn check(
    kind: DeviceKind,
    ordinal: usize,
    kernels: Option<&Path>,
    schedules: &[Schedule],
    json: bool,
) -> anyhow::Result<()> {
    let report = kernel_check_report(kind, ordinal, kernels, schedules)?;
    emit(&report, json)?;
    let failed: Vec<String> =
        report.results.iter().filter(|r| !r.pass).map(|r| format!("{} ({})", r.kernel, r.case)).collect();
    if !failed.is_empty() {
        eprintln!("error: {} kernel check(s) differ from the CPU twins: {}", failed.len(), failed.join(", "));
        std::process::exit(2);
    }
    Ok(())
}

/// The emulated device's run: every case under each schedule (by default forward, reverse and
/// a random one; cases whose bits differ between them fail), then the long grids once, under
/// the first.
fn emu_check(
    ordinal: usize,
    kernels: &'static [cuda::kernels::KernelFile],
    schedules: &[Schedule],
) -> anyhow::Result<(Gpu, Vec<Parity>)> {
    let mut runs = vec![];
    let mut first = None;
    for &schedule in schedules {
        let dev: Arc<dyn Device> = Arc::new(EmuDevice::open_with(ordinal, kernels, schedule)?);
        let gpu = Gpu { info: dev.info().clone(), dev };
        runs.push((schedule.to_string(), parity::run_all(&gpu)?));
        first.get_or_insert(gpu);
    }
    let gpu = first.ok_or_else(|| anyhow::anyhow!("no schedule ran"))?;
    let mut results = runs[0].1.clone();
    results.extend(parity::schedule_mismatches(&runs));
    results.extend(parity::long_grids(&gpu)?);
    Ok((gpu, results))
}

/// `gpu info`: the CUDA libraries found, and the GPUs, or why there are none.
#[derive(Serialize)]
struct GpuInfoReport {
    libraries: Libraries,
    /// "12.8", when NVRTC loads.
    nvrtc_version: Option<String>,
    gpus: Option<Vec<GpuInfo>>,
    /// `cuDriverGetVersion`: 12080 is CUDA 12.8.
    driver_version: Option<i32>,
    /// Why there is no GPU (`gpus` and `driver_version` are null then).
    no_gpu: Option<String>,
}

impl GpuInfoReport {
    fn probe() -> GpuInfoReport {
        let libraries = cuda::probe::libraries();
        let nvrtc_version = cuda::probe::nvrtc_version().map(|(a, b)| format!("{a}.{b}"));
        let (gpus, driver_version, no_gpu) = match cuda::probe() {
            Ok(r) => (Some(r.gpus), Some(r.driver_version), None),
            Err(no) => (None, None, Some(no.to_string())),
        };
        GpuInfoReport { libraries, nvrtc_version, gpus, driver_version, no_gpu }
    }
}

impl Report for GpuInfoReport {
    fn print_human(&self, w: &mut dyn Write) -> io::Result<()> {
        let yes = |b: bool| if b { "found" } else { "not found" };
        let libs = &self.libraries;
        writeln!(
            w,
            "libraries    libcuda {} · libnvrtc {}{} · libcublas {} · libcublasLt {}",
            yes(libs.driver),
            yes(libs.nvrtc),
            self.nvrtc_version.as_ref().map(|v| format!(" ({v})")).unwrap_or_default(),
            yes(libs.cublas),
            yes(libs.cublaslt)
        )?;
        if let Some(v) = self.driver_version {
            writeln!(w, "driver       CUDA {}.{}", v / 1000, (v % 1000) / 10)?;
        }
        for g in self.gpus.iter().flatten() {
            writeln!(
                w,
                "cuda:{}       {} · {} · {} total, {} free",
                g.ordinal,
                g.name,
                g.arch(),
                human_bytes(g.total_bytes),
                human_bytes(g.free_bytes)
            )?;
        }
        Ok(())
    }
}

/// `gpu info`; an error (exit 1) without a GPU, after the libraries are listed.
fn info(json: bool) -> anyhow::Result<()> {
    let report = GpuInfoReport::probe();
    emit(&report, json)?;
    match report.no_gpu {
        None => Ok(()),
        Some(no) => anyhow::bail!("{no}"),
    }
}

/// `gpu kernels`: every kernel file compiled by this machine's NVRTC.
#[derive(Serialize)]
struct KernelsReport {
    nvrtc_version: String,
    arch: String,
    /// "ptx" or "cubin".
    target: &'static str,
    files: Vec<CompiledKernel>,
}

/// One kernel file compiled.
#[derive(Serialize)]
struct CompiledKernel {
    /// `gdn.cu`.
    file: String,
    bytes: usize,
    /// Compile time in milliseconds, to a tenth.
    ms: f64,
    /// Read from the kernel cache rather than compiled now.
    cached: bool,
    entries: &'static [&'static str],
    /// Entry points the compiled code does not define.
    missing: Vec<&'static str>,
}

impl Report for KernelsReport {
    fn print_human(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "NVRTC {} · {} for {}", self.nvrtc_version, self.target.to_uppercase(), self.arch)?;
        for f in &self.files {
            // Bytes and milliseconds as the JSON writes them (5.0, not 5) and unpadded: the text
            // has always printed these two from the JSON row.
            writeln!(
                w,
                "  {:<16} {} B {} ms{}  {}",
                f.file,
                f.bytes,
                serde_json::Value::from(f.ms),
                if f.cached { " (cached)" } else { "" },
                f.entries.join(" ")
            )?;
        }
        Ok(())
    }
}

/// Where `gpu kernels` compiles to and what it keeps.
struct CompileTo<'a> {
    target: nvrtc::Target,
    arch: &'a str,
    cache: Option<PathBuf>,
    /// `--out`: each compiled file is written here.
    out: Option<PathBuf>,
}

impl CompileTo<'_> {
    /// Compiles one file (or reads it from the cache), writes it to `--out`, and checks that it
    /// defines its entry points.
    fn compile(&self, file: &'static KernelFile) -> anyhow::Result<CompiledKernel> {
        let started = std::time::Instant::now();
        let compiled = nvrtc::compile(file, self.target, self.arch, self.cache.as_deref())?;
        let ms = started.elapsed().as_secs_f64() * 1e3;
        if let Some(dir) = &self.out {
            let ext = if self.target == nvrtc::Target::Ptx { "ptx" } else { "cubin" };
            let path = dir.join(format!("{}.{ext}", file.name));
            std::fs::write(&path, &compiled.code)
                .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", path.display()))?;
        }
        Ok(CompiledKernel {
            file: format!("{}.cu", file.name),
            bytes: compiled.code.len(),
            ms: (ms * 10.0).round() / 10.0,
            cached: compiled.cached,
            entries: file.entries,
            missing: file.entries.iter().copied().filter(|e| !compiled.defines(e)).collect(),
        })
    }
}

/// `gpu kernels`; an error after the table when a file lacks an entry point.
fn compile_all(
    arch: &str,
    ptx: bool,
    out: Option<PathBuf>,
    no_cache: bool,
    sources: Option<&Path>,
    json: bool,
) -> anyhow::Result<()> {
    let files = kernels::load(sources)?;
    let target = if ptx { nvrtc::Target::Ptx } else { nvrtc::Target::Cubin };
    let cache = if no_cache { None } else { nvrtc::default_cache_dir() };
    if let Some(dir) = &out {
        std::fs::create_dir_all(dir).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", dir.display()))?;
    }
    let to = CompileTo { target, arch, cache, out };
    let compiled = files.iter().map(|f| to.compile(f)).collect::<anyhow::Result<Vec<_>>>()?;
    let (major, minor) = cuda::probe::nvrtc_version().unwrap_or((0, 0));
    let report = KernelsReport {
        nvrtc_version: format!("{major}.{minor}"),
        arch: arch.to_string(),
        target: if ptx { "ptx" } else { "cubin" },
        files: compiled,
    };
    emit(&report, json)?;
    let missing: Vec<String> =
        report.files.iter().flat_map(|f| f.missing.iter().map(move |e| format!("{}: {e}", f.file))).collect();
    anyhow::ensure!(missing.is_empty(), "entry points missing from the compiled code: {}", missing.join(", "));
    Ok(())
}
