//! Subnormal floats flushed to zero inside the prefill's small matrix products (the chunked
//! delta rule, attention's scores and `P·V`).
//!
//! Why: those products multiply by decays `exp(G_i − G_j)` and softmax weights that reach far
//! below f32's normal range (1.2e-38), and on x86 every subnormal operand or result costs a
//! microcode assist of about a hundred cycles. On the 0.8B shape here that made the chunked rule
//! 46 % of a 512-token prefill; with them flushed the prefill ran 171 → 291 tok/s. A value
//! below 1.2e-38 contributes nothing at the scale of these outputs (the tests of the chunked
//! rule against the recurrent one and of the logits against transformers hold as before).
//!
//! The mode (MXCSR's flush-to-zero and denormals-are-zero bits) is per thread; [`Flush`] sets
//! it for its lifetime on the calling thread and restores what was there, so no other code sees
//! it. The decode step does not use it: its recurrent rule and GEMVs keep IEEE behaviour.

/// While alive, the calling thread flushes subnormal inputs and results to zero.
pub(crate) struct Flush {
    #[cfg(target_arch = "x86_64")]
    saved: u32,
}

impl Flush {
    #[must_use = "the mode lasts only while the guard lives"]
    pub(crate) fn new() -> Flush {
        #[cfg(target_arch = "x86_64")]
        {
            /// MXCSR bit 15 (flush to zero) and bit 6 (denormals are zero).
            const FTZ_DAZ: u32 = (1 << 15) | (1 << 6);
            let saved = read();
            write(saved | FTZ_DAZ);
            Flush { saved }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            Flush {}
        }
    }
}

impl Default for Flush {
    fn default() -> Flush {
        Flush::new()
    }
}

impl Drop for Flush {
    fn drop(&mut self) {
        #[cfg(target_arch = "x86_64")]
        write(self.saved);
    }
}

#[cfg(target_arch = "x86_64")]
fn read() -> u32 {
    let mut csr = 0u32;
    // SAFETY: `stmxcsr` stores the 4-byte control register into `csr`, which it may write.
    unsafe { std::arch::asm!("stmxcsr [{0}]", in(reg) &mut csr, options(nostack)) };
    csr
}

#[cfg(target_arch = "x86_64")]
fn write(csr: u32) {
    // SAFETY: `ldmxcsr` loads the control register from `csr`; the values written are what
    // `read` returned, or that with the two flush bits set (valid bits, no exception unmasked).
    unsafe { std::arch::asm!("ldmxcsr [{0}]", in(reg) &csr, options(nostack, readonly)) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny_product(a: f32, b: f32) -> f32 {
        std::hint::black_box(a) * std::hint::black_box(b)
    }

    /// Inside the guard a product below the normal range is zero; outside it (before and after)
    /// it is the subnormal IEEE gives.
    #[test]
    fn flushes_only_while_alive() {
        let (a, b) = (1e-20f32, 1e-20f32);
        let before = tiny_product(a, b);
        assert!(before > 0.0 && !before.is_normal(), "IEEE gives a subnormal: {before:e}");
        {
            let _flush = Flush::new();
            let inside = tiny_product(a, b);
            if cfg!(target_arch = "x86_64") {
                assert_eq!(inside, 0.0, "flushed inside the guard");
                // A subnormal input is read as zero too.
                assert_eq!(tiny_product(before, 1e30), 0.0, "a subnormal operand is zero inside the guard");
            }
        }
        assert_eq!(tiny_product(a, b).to_bits(), before.to_bits(), "the mode is restored");
    }
}
