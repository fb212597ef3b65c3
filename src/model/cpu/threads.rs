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
    /// The kernels the GEMV dispatches to on this CPU.
    pub kernels: &'static str,
    /// The kernels of the bf16 × bf16 GEMV (`--dtype bf16`): `avx512_bf16` is `vdpbf16ps`.
    pub bf16_kernels: &'static str,
    /// Threads the layers run on.
    pub threads: usize,
}

const FEATURES: [&str; 6] = ["avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile"];

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
            kernels: Simd::detect().name(),
            bf16_kernels: PairKernel::detect(Simd::detect()).name(),
            threads: rayon::current_num_threads(),
        }
    }

    /// "AMD EPYC … · 2 cores · 2 threads · avx2 avx512f avx512_bf16 · kernels avx512, bf16
    /// avx512_bf16".
    pub fn summary(&self) -> String {
        format!(
            "{} · {} cores ({} logical) · {} threads · {} · kernels {}, bf16 {}",
            if self.model.is_empty() { "CPU" } else { &self.model },
            self.physical_cores,
            self.logical_cpus,
            self.threads,
            if self.features.is_empty() { "no AVX2".to_string() } else { self.features.join(" ") },
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

/// Sizes the thread pool the layers run on; `None`: the physical cores. Only the first call
/// sizes it (the pool is global and lives as long as the process).
pub fn set_threads(threads: Option<usize>) -> Result<usize, String> {
    let n = match threads {
        Some(0) => return Err("--threads 0: at least 1".into()),
        Some(n) => n,
        None => {
            let text = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            physical_cores(&text).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        }
    };
    match rayon::ThreadPoolBuilder::new().num_threads(n).build_global() {
        Ok(()) => Ok(n),
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
}
