//! The instruction sets the CPU kernels dispatch on: detected once, shared by the GEMV, the
//! dot product and the GDN recurrence.

/// The instruction sets the kernels were compiled for and this CPU has, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Simd {
    Avx512,
    Avx2,
    Portable,
}

impl Simd {
    /// The best kernels for this CPU, detected once (`dot` asks on every call).
    pub fn detect() -> Simd {
        static DETECTED: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(Simd::probe)
    }

    fn probe() -> Simd {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx512f") && std::is_x86_feature_detected!("avx512bw") {
                return Simd::Avx512;
            }
            if std::is_x86_feature_detected!("avx2") {
                return Simd::Avx2;
            }
        }
        Simd::Portable
    }

    pub fn name(self) -> &'static str {
        match self {
            Simd::Avx512 => "avx512",
            Simd::Avx2 => "avx2",
            Simd::Portable => "portable",
        }
    }
}
