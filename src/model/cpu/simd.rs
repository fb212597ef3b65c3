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
