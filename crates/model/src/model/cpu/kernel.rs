//! Which family of CPU kernels computes: the best this CPU has, or the one
//! `DELTASCOPE_CPU_KERNEL` names (`portable`, `avx2`, `avx512`, `avx512_bf16`, `amx`). Forcing
//! one lets a single machine give the results of every kind of machine that runs deltascope
//! (an AVX2 EPYC, an AVX512_BF16 EPYC, an AMX Xeon), so that what a test asserts is checked
//! under each kernel's rounding, not only under the one the test machine happens to pick.
//!
//! A family fixes every choice the CPU engine makes by instruction set: the f32 kernels
//! ([`Simd`]: the GEMV, dot products, the GDN rule, the elementwise functions), the bf16 × bf16
//! GEMV ([`PairKernel`]), the bf16 prefill GEMM (`vdpbf16ps` or AMX tiles, else widened to the
//! f32 GEMM) and the FP8 kernels. The f32 prefill GEMM is the `gemm` crate's, which takes FMA on
//! every x86-64 CPU these run on whatever the family (its sums are cut at the same places on
//! every machine: `tensor.rs`).

use std::sync::OnceLock;

use super::gemv::PairKernel;
use super::simd::Simd;

/// The environment variable that forces a kernel family.
pub(crate) const ENV: &str = "DELTASCOPE_CPU_KERNEL";

/// A family of CPU kernels, named as `bench` prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CpuKernel {
    /// Plain Rust, no vector instructions asked for (the compiler's baseline).
    Portable,
    /// AVX2 and FMA, 8 lanes.
    Avx2,
    /// AVX-512F/BW, 16 lanes; bf16 pairs by fused multiply-adds.
    Avx512,
    /// AVX-512 with `vdpbf16ps` for bf16 (the GEMV and the prefill GEMM) and FP8 at bf16.
    Avx512Bf16,
    /// AVX512_BF16 with AMX tiles (`tdpbf16ps`) for the bf16 GEMV and GEMM.
    Amx,
}

impl CpuKernel {
    /// Every family, weakest first.
    pub const ALL: [CpuKernel; 5] =
        [CpuKernel::Portable, CpuKernel::Avx2, CpuKernel::Avx512, CpuKernel::Avx512Bf16, CpuKernel::Amx];

    pub fn name(self) -> &'static str {
        match self {
            CpuKernel::Portable => "portable",
            CpuKernel::Avx2 => "avx2",
            CpuKernel::Avx512 => "avx512",
            CpuKernel::Avx512Bf16 => "avx512_bf16",
            CpuKernel::Amx => "amx",
        }
    }

    pub fn parse(s: &str) -> Option<CpuKernel> {
        CpuKernel::ALL.into_iter().find(|k| k.name() == s.trim())
    }

    /// The f32 kernels of this family.
    pub fn simd(self) -> Simd {
        match self {
            CpuKernel::Portable => Simd::Portable,
            CpuKernel::Avx2 => Simd::Avx2,
            CpuKernel::Avx512 | CpuKernel::Avx512Bf16 | CpuKernel::Amx => Simd::Avx512,
        }
    }

    /// The bf16 × bf16 GEMV of this family.
    pub fn pairs(self) -> PairKernel {
        match self {
            CpuKernel::Portable => PairKernel::Portable,
            CpuKernel::Avx2 => PairKernel::Avx2,
            CpuKernel::Avx512 => PairKernel::Avx512,
            CpuKernel::Avx512Bf16 => PairKernel::Dpbf16,
            CpuKernel::Amx => PairKernel::Amx,
        }
    }

    /// Whether the family multiplies bf16 with `vdpbf16ps` (the prefill GEMM, FP8 at bf16).
    pub fn dpbf16(self) -> bool {
        matches!(self, CpuKernel::Avx512Bf16 | CpuKernel::Amx)
    }

    /// The CPU features the family needs, as /proc/cpuinfo names them.
    pub fn needs(self) -> &'static [&'static str] {
        match self {
            CpuKernel::Portable => &[],
            CpuKernel::Avx2 => &["avx2", "fma"],
            CpuKernel::Avx512 => &["avx512f", "avx512bw"],
            CpuKernel::Avx512Bf16 => &["avx512f", "avx512bw", "avx512_bf16"],
            CpuKernel::Amx => &["avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"],
        }
    }

    /// Whether this CPU (and, for AMX, the operating system) can run the family.
    pub fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            let avx512 = || std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw");
            match self {
                CpuKernel::Portable => true,
                CpuKernel::Avx2 => std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma"),
                CpuKernel::Avx512 => avx512(),
                CpuKernel::Avx512Bf16 => avx512() && std::is_x86_feature_detected!("avx512bf16"),
                CpuKernel::Amx => avx512() && std::is_x86_feature_detected!("avx512bf16") && super::amx::available(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == CpuKernel::Portable
        }
    }

    /// The families this CPU runs, weakest first.
    pub fn supported() -> Vec<CpuKernel> {
        CpuKernel::ALL.into_iter().filter(|k| k.runs_here()).collect()
    }

    /// The best family this CPU runs.
    pub fn best() -> CpuKernel {
        CpuKernel::supported().into_iter().last().unwrap_or(CpuKernel::Portable)
    }

    /// The family `DELTASCOPE_CPU_KERNEL` asks for: `Ok(None)` when it is unset or empty, an
    /// error naming what is wrong when it names no family or one this CPU cannot run.
    pub fn from_env() -> Result<Option<CpuKernel>, KernelChoiceError> {
        match std::env::var(ENV) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => CpuKernel::choose(&v).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => {
                Err(KernelChoiceError::Unknown { value: v.to_string_lossy().into_owned() })
            }
        }
    }

    /// `value` as a family this CPU runs.
    pub fn choose(value: &str) -> Result<CpuKernel, KernelChoiceError> {
        let kernel = CpuKernel::parse(value).ok_or_else(|| KernelChoiceError::Unknown { value: value.to_string() })?;
        if !kernel.runs_here() {
            return Err(KernelChoiceError::Unsupported {
                kernel,
                has: cpu_features(),
                runs: CpuKernel::supported().iter().map(|k| k.name()).collect::<Vec<_>>().join(", "),
            });
        }
        Ok(kernel)
    }

    /// The family that computes in this process: the one `DELTASCOPE_CPU_KERNEL` names, else the
    /// best. Decided once. The binary refuses a value it cannot honour before anything
    /// computes ([`CpuKernel::from_env`]); a library caller that did not check gets the best
    /// family, with the refusal logged.
    pub fn active() -> CpuKernel {
        static ACTIVE: OnceLock<CpuKernel> = OnceLock::new();
        *ACTIVE.get_or_init(|| match CpuKernel::from_env() {
            Ok(Some(k)) => k,
            Ok(None) => CpuKernel::best(),
            Err(e) => {
                tracing::error!("{e}; running the best kernels this CPU has ({})", CpuKernel::best().name());
                CpuKernel::best()
            }
        })
    }

    /// Whether `DELTASCOPE_CPU_KERNEL` chose the active family (not the detection).
    pub fn forced() -> bool {
        matches!(CpuKernel::from_env(), Ok(Some(_)))
    }

    /// "avx2", or "avx2 (DELTASCOPE_CPU_KERNEL; the CPU's best is avx512_bf16)" when forced.
    pub fn describe_active() -> String {
        let k = CpuKernel::active();
        if CpuKernel::forced() {
            format!("{} (forced by {ENV}; this CPU's best is {})", k.name(), CpuKernel::best().name())
        } else {
            k.name().to_string()
        }
    }
}

/// A `DELTASCOPE_CPU_KERNEL` that cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelChoiceError {
    #[error("{ENV}={value:?} names no CPU kernel: one of portable, avx2, avx512, avx512_bf16, amx")]
    Unknown { value: String },
    #[error(
        "{ENV}={}: this CPU cannot run it (it needs {}; this CPU has {}); kernels this CPU runs: {runs}",
        kernel.name(),
        kernel.needs().join(" "),
        if has.is_empty() { "none of them".to_string() } else { has.join(" ") }
    )]
    Unsupported { kernel: CpuKernel, has: Vec<String>, runs: String },
}

/// The vector features the families need that this CPU has, as /proc/cpuinfo names them.
fn cpu_features() -> Vec<String> {
    let wanted = ["avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "amx_tile", "amx_bf16"];
    #[cfg(target_arch = "x86_64")]
    {
        let has = |f: &str| match f {
            "avx2" => std::is_x86_feature_detected!("avx2"),
            "fma" => std::is_x86_feature_detected!("fma"),
            "avx512f" => std::is_x86_feature_detected!("avx512f"),
            "avx512bw" => std::is_x86_feature_detected!("avx512bw"),
            "avx512_bf16" => std::is_x86_feature_detected!("avx512bf16"),
            "amx_tile" | "amx_bf16" => super::amx::cpu_has_amx_bf16(),
            _ => false,
        };
        wanted.iter().filter(|f| has(f)).map(|f| f.to_string()).collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = wanted;
        vec![]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_families_nest() {
        for k in CpuKernel::ALL {
            assert_eq!(CpuKernel::parse(k.name()), Some(k));
        }
        assert_eq!(CpuKernel::parse("avx512bf16"), None);
        // A CPU that runs a family runs every weaker one (the CI runs each it supports).
        let supported = CpuKernel::supported();
        assert_eq!(supported[0], CpuKernel::Portable);
        for w in supported.windows(2) {
            assert!(w[0] < w[1]);
        }
        let runs = |k: CpuKernel| supported.contains(&k);
        for (weaker, stronger) in [(CpuKernel::Avx512, CpuKernel::Avx512Bf16), (CpuKernel::Avx512Bf16, CpuKernel::Amx)]
        {
            assert!(!runs(stronger) || runs(weaker));
        }
        assert_eq!(CpuKernel::best(), *supported.last().unwrap());
    }

    #[test]
    fn a_family_this_cpu_cannot_run_is_refused_naming_what_it_has() {
        assert!(matches!(CpuKernel::choose("sse9"), Err(KernelChoiceError::Unknown { .. })));
        let e = CpuKernel::choose("sse9").unwrap_err().to_string();
        assert!(e.contains("portable, avx2, avx512, avx512_bf16, amx"), "{e}");
        assert_eq!(CpuKernel::choose("portable"), Ok(CpuKernel::Portable));
        for k in CpuKernel::ALL {
            match CpuKernel::choose(k.name()) {
                Ok(chosen) => assert!(chosen.runs_here() && chosen == k),
                Err(e) => {
                    let text = e.to_string();
                    assert!(!k.runs_here(), "{text}");
                    assert!(text.contains("this CPU cannot run it") && text.contains(k.needs()[0]), "{text}");
                    assert!(!text.contains('\n'), "one line: {text}");
                }
            }
        }
    }

    /// The active family's parts are the ones it names, and the detection honours a forced one.
    #[test]
    fn the_active_family_drives_every_dispatch() {
        let k = CpuKernel::active();
        assert_eq!(Simd::detect(), k.simd());
        assert_eq!(PairKernel::active(), k.pairs());
        // `vdpbf16ps` is used only by a family that has it, and only where the CPU has it.
        assert!(!k.dpbf16() || super::super::gemm_bf16::available());
        if let Ok(Some(forced)) = CpuKernel::from_env() {
            assert_eq!(k, forced);
        }
    }
}
