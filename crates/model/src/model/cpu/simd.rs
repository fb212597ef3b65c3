//! The instruction sets the CPU kernels dispatch on: detected once, shared by the GEMV, the
//! dot product, the GDN recurrence and the elementwise functions (`math.rs`), which compile
//! their loops once per instruction set with [`simd_dispatch!`].

/// The instruction sets the kernels were compiled for and this CPU has, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Simd {
    Avx512,
    Avx2,
    Portable,
}

impl Simd {
    /// The f32 kernels of the active family ([`super::CpuKernel::active`]: the best this CPU
    /// runs, or the one `DELTASCOPE_CPU_KERNEL` names), decided once (`dot` asks on every call).
    pub fn detect() -> Simd {
        static DETECTED: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| super::CpuKernel::active().simd())
    }

    pub fn name(self) -> &'static str {
        match self {
            Simd::Avx512 => "avx512",
            Simd::Avx2 => "avx2",
            Simd::Portable => "portable",
        }
    }
}

/// Whether the CPU is AMD's (or Hygon's, built on the same cores): some tuning differs by
/// vendor, measured (the GEMV's prefetch distance).
pub(crate) fn amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // CPUID leaf 0: the vendor string in EBX, EDX, ECX.
        let id = std::arch::x86_64::__cpuid(0);
        let vendor: Vec<u8> = [id.ebx, id.edx, id.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
        matches!(&vendor[..], b"AuthenticAMD" | b"HygonGenuine")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Defines `fn $name` running `$body` compiled three times (for AVX-512, for AVX2 and for the
/// baseline) and choosing by the instruction set detected at run time. `$body` must be
/// `#[inline(always)]` so that each copy is compiled for its instruction set.
macro_rules! simd_dispatch {
    ($(#[$attr:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? => $body:ident) => {
        $(#[$attr])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                /// `$body` compiled for AVX-512.
                ///
                /// # Safety
                ///
                /// The CPU must have AVX-512F.
                #[target_feature(enable = "avx512f")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }

                /// `$body` compiled for AVX2.
                ///
                /// # Safety
                ///
                /// The CPU must have AVX2.
                #[target_feature(enable = "avx2")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    $body($($arg),*)
                }

                match $crate::model::cpu::Simd::detect() {
                    // SAFETY: the CPU has AVX-512F (detected at run time).
                    $crate::model::cpu::Simd::Avx512 => return unsafe { avx512($($arg),*) },
                    // SAFETY: the CPU has AVX2 (detected at run time).
                    $crate::model::cpu::Simd::Avx2 => return unsafe { avx2($($arg),*) },
                    $crate::model::cpu::Simd::Portable => {}
                }
            }
            $body($($arg),*)
        }
    };
}

pub(crate) use simd_dispatch;

#[cfg(test)]
mod tests {
    /// The vendor read from CPUID is the one the kernel reports.
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    #[test]
    fn the_vendor_is_the_one_the_kernel_reports() {
        let info = std::fs::read_to_string("/proc/cpuinfo").expect("/proc/cpuinfo");
        let vendor = info
            .lines()
            .find_map(|l| {
                l.strip_prefix("vendor_id").map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_string())
            })
            .expect("a vendor_id line");
        assert_eq!(super::amd(), vendor == "AuthenticAMD" || vendor == "HygonGenuine", "vendor_id {vendor}");
    }
}
