//! What the CPU offers the kernels: its vector features, cores, and the thread pool the layers
//! run on (`--threads`; default the physical cores, since a second hyper-thread on a core
//! shares the core's vector units and the memory bandwidth a GEMV is bound by).

use serde::Serialize;

use super::gemv::PairKernel;
use super::simd::Simd;

#[derive(Debug, Clone, Serialize)]
pub struct CpuInfo {
    /// `model name` of /proc/cpuinfo (empty where there is none).
    pub model: String,
    pub physical_cores: usize,
    pub logical_cpus: usize,
    /// The vector features that matter here, as /proc/cpuinfo names them (avx2, avx512f,
    /// avx512_bf16, amx_tile …), those present.
    pub features: Vec<String>,
    /// The kernel family that computes ([`super::CpuKernel`]): the best this CPU runs, or the
    /// one `DELTASCOPE_CPU_KERNEL` names.
    pub kernel: &'static str,
    /// Whether `DELTASCOPE_CPU_KERNEL` chose it.
    pub kernel_forced: bool,
    /// The families this CPU runs.
    pub kernels_supported: Vec<&'static str>,
    /// The f32 kernels the family dispatches to.
    pub kernels: &'static str,
    /// The kernels of the bf16 × bf16 GEMV (`--dtype bf16`): `amx_bf16` is AMX tiles,
    /// `avx512_bf16` is `vdpbf16ps`.
    pub bf16_kernels: &'static str,
    /// Threads the layers run on.
    pub threads: usize,
    /// Why that many: `--threads N`, or what the default counted (cores this process may use,
    /// hyper-threads left out, a cgroup quota).
    pub threads_why: String,
}

const FEATURES: [&str; 7] = ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16"];

impl CpuInfo {
    pub fn detect() -> CpuInfo {
        let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |line: &str, key: &str| {
            line.split_once(':').filter(|(k, _)| k.trim() == key).map(|(_, v)| v.trim().to_string())
        };
        let model = text.lines().find_map(|l| field(l, "model name")).unwrap_or_default();
        let flags: Vec<String> = text
            .lines()
            .find_map(|l| field(l, "flags"))
            .map(|f| f.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default();
        let features = FEATURES.iter().filter(|f| flags.iter().any(|x| x == *f)).map(|f| f.to_string()).collect();
        let logical = std::thread::available_parallelism().map_or(1, |n| n.get());
        CpuInfo {
            model,
            physical_cores: physical_cores(&text).unwrap_or(logical),
            logical_cpus: logical,
            features,
            kernel: super::CpuKernel::active().name(),
            kernel_forced: super::CpuKernel::forced(),
            kernels_supported: super::CpuKernel::supported().iter().map(|k| k.name()).collect(),
            kernels: Simd::detect().name(),
            bf16_kernels: PairKernel::active().name(),
            threads: rayon::current_num_threads(),
            threads_why: CHOSEN.get().cloned().unwrap_or_else(|| "the thread pool's own default".into()),
        }
    }

    /// "AMD EPYC … · 2 cores · 2 threads · avx2 avx512f avx512_bf16 · kernel avx512_bf16 (f32
    /// avx512, bf16 avx512_bf16)", with "forced by DELTASCOPE_CPU_KERNEL" when it was.
    pub fn summary(&self) -> String {
        format!(
            "{} · {} cores ({} logical) · {} threads · {} · kernel {}{} (f32 {}, bf16 {})",
            if self.model.is_empty() { "CPU" } else { &self.model },
            self.physical_cores,
            self.logical_cpus,
            self.threads,
            if self.features.is_empty() { "no AVX2".to_string() } else { self.features.join(" ") },
            self.kernel,
            if self.kernel_forced { format!(", forced by {}", super::kernel::ENV) } else { String::new() },
            self.kernels,
            self.bf16_kernels
        )
    }
}

/// Distinct (physical id, core id) pairs of /proc/cpuinfo.
fn physical_cores(cpuinfo: &str) -> Option<usize> {
    let mut cores = std::collections::BTreeSet::new();
    let (mut package, mut core) = (None, None);
    for line in cpuinfo.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if let Some(c) = core.take() {
                cores.insert((package.take().unwrap_or(0), c));
            }
            continue;
        }
        let Some((k, v)) = line.split_once(':') else { continue };
        match k.trim() {
            "physical id" => package = v.trim().parse::<usize>().ok(),
            "core id" => core = v.trim().parse::<usize>().ok(),
            _ => {}
        }
    }
    (!cores.is_empty()).then_some(cores.len())
}

/// Why the pool has the size it has (set once, by the call that sized it).
static CHOSEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The default thread count and why.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ThreadChoice {
    pub threads: usize,
    pub why: String,
}

/// The default: one thread per physical core among the CPUs this process may run on
/// (`Cpus_allowed_list`: `taskset`, a container's cpuset), never more than the OS lets it use
/// at once (`available_parallelism`, which counts a cgroup CPU quota). Hyper-threads are left
/// out: a second thread on a core shares its vector units and the memory bandwidth a GEMV is
/// bound by. `quota`: the cgroup's CPU quota in CPUs, only to say why.
pub(crate) fn choose(cpuinfo: &str, allowed: Option<&[usize]>, parallelism: usize, quota: Option<f64>) -> ThreadChoice {
    let parallelism = parallelism.max(1);
    let allowed_n = allowed.map_or(parallelism, <[usize]>::len);
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    let (cores, smt, mut why) = match cores_among(cpuinfo, allowed) {
        Some((cores, logical)) => (
            cores,
            logical > cores,
            format!(
                "{cores} physical core{} of the {allowed_n} CPU{} this process may use",
                plural(cores),
                plural(allowed_n)
            ),
        ),
        // No core ids (some VMs): hyper-threads cannot be told apart.
        None => (allowed_n, false, format!("the {allowed_n} CPU{} this process may use", plural(allowed_n))),
    };
    let cores = cores.max(1);
    if smt {
        why.push_str(" (hyper-threads left out: they share a core's vector units and memory bandwidth)");
    }
    let threads = cores.min(parallelism);
    if threads < cores {
        match quota {
            Some(q) => why.push_str(&format!("; capped at {threads} by the cgroup CPU quota ({q:.1} CPUs)")),
            None => why.push_str(&format!("; capped at {threads}, what the OS lets this process run at once")),
        }
    }
    ThreadChoice { threads, why }
}

/// (physical cores, logical CPUs) among the `allowed` processors of /proc/cpuinfo (all when
/// `None`); `None` when it names no cores.
fn cores_among(cpuinfo: &str, allowed: Option<&[usize]>) -> Option<(usize, usize)> {
    let mut cores = std::collections::BTreeSet::new();
    let mut logical = 0;
    let (mut processor, mut package, mut core) = (None, None, None);
    for line in cpuinfo.lines().chain(std::iter::once("")) {
        if line.trim().is_empty() {
            if let Some(c) = core.take() {
                let id: Option<usize> = processor.take();
                if allowed.is_none_or(|a| id.is_some_and(|id| a.contains(&id))) {
                    cores.insert((package.take().unwrap_or(0), c));
                    logical += 1;
                }
            }
            (processor, package) = (None, None);
            continue;
        }
        let Some((k, v)) = line.split_once(':') else { continue };
        match k.trim() {
            "processor" => processor = v.trim().parse::<usize>().ok(),
            "physical id" => package = v.trim().parse::<usize>().ok(),
            "core id" => core = v.trim().parse::<usize>().ok(),
            _ => {}
        }
    }
    (!cores.is_empty()).then_some((cores.len(), logical))
}

/// `0-3,8,10-11` (Linux's CPU list format) → the CPU ids.
fn cpu_list(text: &str) -> Option<Vec<usize>> {
    let mut out = vec![];
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.trim().parse::<usize>().ok()?..=b.trim().parse::<usize>().ok()?),
            None => out.push(part.trim().parse().ok()?),
        }
    }
    (!out.is_empty()).then_some(out)
}

/// The cgroup's CPU quota in CPUs (v2 `cpu.max`, v1 `cfs_quota_us / cfs_period_us`); `None`
/// without one.
fn cgroup_quota() -> Option<f64> {
    let v2 = std::fs::read_to_string("/sys/fs/cgroup/cpu.max").ok().and_then(|t| {
        let mut it = t.split_whitespace();
        let (q, p) = (it.next()?.parse::<f64>().ok()?, it.next()?.parse::<f64>().ok()?);
        Some(q / p)
    });
    v2.or_else(|| {
        let read =
            |f: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/{f}")).ok()?.trim().parse::<f64>().ok();
        let (q, p) = (read("cpu.cfs_quota_us")?, read("cpu.cfs_period_us")?);
        (q > 0.0).then(|| q / p)
    })
}

/// [`choose`] on this machine.
pub(crate) fn default_threads() -> ThreadChoice {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let allowed = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:").and_then(cpu_list)));
    let parallelism = std::thread::available_parallelism().map_or(1, |n| n.get());
    choose(&cpuinfo, allowed.as_deref(), parallelism, cgroup_quota())
}

/// Sizes the thread pool the layers run on; `None`: [`default_threads`]. Only the first call
/// sizes it (the pool is global and lives as long as the process).
pub fn set_threads(threads: Option<usize>) -> Result<usize, String> {
    let choice = match threads {
        Some(0) => return Err("--threads 0: at least 1".into()),
        Some(n) => ThreadChoice { threads: n, why: format!("--threads {n}") },
        None => default_threads(),
    };
    match rayon::ThreadPoolBuilder::new().num_threads(choice.threads).build_global() {
        Ok(()) => {
            // The engine starts here: its allocations get the heap settings it is fast under.
            if !super::heap::keep_freed_memory() {
                tracing::warn!("glibc refused the allocator thresholds; prefill runs slower");
            }
            let _ = CHOSEN.set(choice.why);
            Ok(choice.threads)
        }
        // Already sized (a second model in one process): it keeps its size.
        Err(_) => Ok(rayon::current_num_threads()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn physical_cores_count_distinct_cores_not_hyper_threads() {
        let two_threads_per_core = "processor : 0\nphysical id : 0\ncore id : 0\n\nprocessor : 1\nphysical id : 0\ncore id : 0\n\nprocessor : 2\nphysical id : 0\ncore id : 1\n\nprocessor : 3\nphysical id : 0\ncore id : 1\n";
        assert_eq!(physical_cores(two_threads_per_core), Some(2));
        assert_eq!(physical_cores("processor : 0\n"), None);
    }

    /// Four logical CPUs, two cores (0 and 1 share core 0, 2 and 3 core 1).
    const SMT: &str = "processor : 0\nphysical id : 0\ncore id : 0\n\nprocessor : 1\nphysical id : 0\ncore id : 0\n\nprocessor : 2\nphysical id : 0\ncore id : 1\n\nprocessor : 3\nphysical id : 0\ncore id : 1\n";

    #[test]
    fn the_default_counts_cores_this_process_may_use() {
        // The whole machine: two cores, hyper-threads left out and said so.
        let c = choose(SMT, Some(&[0, 1, 2, 3]), 4, None);
        assert_eq!(c.threads, 2);
        assert!(
            c.why.starts_with("2 physical cores of the 4 CPUs this process may use (hyper-threads left out"),
            "{}",
            c.why
        );
        // `taskset -c 0,1`: both CPUs are one core's two threads: one thread, not two.
        let c = choose(SMT, Some(&[0, 1]), 2, None);
        assert_eq!(c.threads, 1, "{}", c.why);
        // A container with a 1.5-CPU quota on the whole machine: std's parallelism says 1.
        let c = choose(SMT, Some(&[0, 1, 2, 3]), 1, Some(1.5));
        assert_eq!(c.threads, 1);
        assert!(c.why.ends_with("capped at 1 by the cgroup CPU quota (1.5 CPUs)"), "{}", c.why);
        // No core ids (some VMs, other OSes): the CPUs allowed.
        let c = choose("processor : 0\n\nprocessor : 1\n", None, 2, None);
        assert_eq!((c.threads, c.why.as_str()), (2, "the 2 CPUs this process may use"));
        assert_eq!(cpu_list("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(cpu_list("x"), None);
    }
}
