//! The prefill GEMM for bf16 activations against bf16 weights (`--dtype bf16`) on CPUs with
//! AVX512_BF16: `y = x · Wᵀ` with `vdpbf16ps`, 32 products an instruction, twice the f32
//! GEMM's rate, and no f32 copy of the weights.
//!
//! Summation order (what [`reference`] computes, bit for bit): each output is one f32
//! accumulator over the input's pairs in order, adding pair `p`'s odd product `w[2p+1]·x[2p+1]`
//! then its even one (`vdpbf16ps`'s order, each add rounded; a product of two bf16 values is
//! exact in f32). Every output is computed by one kernel pass over the whole input, so the bits
//! do not depend on the tiling or the number of threads. It is not the decode GEMV's order
//! (`gemv::PairKernel`): a prefill and a decode step agree to f32 rounding, as the f32 GEMM and
//! GEMV always have.
//!
//! Blocking: threads take panels of 32 output features; a panel's weights are packed pair-major
//! (`[pair][feature]`, one 64-byte line per 16 features per pair, 64–224 KiB: it stays in L2)
//! and swept by tiles of up to 12 tokens, whose bf16 pairs are packed `[pair][token]` once per
//! call. A tile keeps 24 accumulators in registers: per pair two weight loads and twelve
//! broadcasts feed 24 `vdpbf16ps`.

use rayon::prelude::*;

/// Output features per panel (two registers of 16 lanes).
const PANEL: usize = 32;
/// Tokens per tile (24 accumulators of the 32 registers).
const TILE: usize = 12;

/// Whether this CPU runs [`gemm`] (`vdpbf16ps`).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The activations rounded to bf16 (round to nearest even; exact where they already are bf16
/// values) and packed for the kernel: tiles of up to [`TILE`] tokens, each `[pair][token]` as
/// `u32` (even element in the low half, as `vdpbf16ps` reads a pair), an odd input padded with
/// a zero.
pub struct PackedTokens {
    rows: usize,
    pairs: usize,
    data: Vec<u32>,
}

impl PackedTokens {
    pub fn new(x: &[f32], rows: usize, k: usize) -> PackedTokens {
        assert_eq!(x.len(), rows * k);
        let pairs = k.div_ceil(2);
        let mut data = vec![0u32; rows * pairs];
        let bits = |r: usize, i: usize| if i < k { u32::from(half::bf16::from_f32(x[r * k + i]).to_bits()) } else { 0 };
        // Tiles on all threads (a prefill's rows; each tile is written by one task).
        data.par_chunks_mut(TILE * pairs).enumerate().for_each(|(ti, tile)| {
            let (t0, n) = (ti * TILE, tile.len() / pairs);
            for r in 0..n {
                for p in 0..pairs {
                    tile[p * n + r] = bits(t0 + r, 2 * p) | (bits(t0 + r, 2 * p + 1) << 16);
                }
            }
        });
        PackedTokens { rows, pairs, data }
    }
}

/// `y[:, o] = x · W[o]ᵀ` for every output feature `o < out`: `row(o)` gives weight row `o`
/// (`k` bf16 values as stored), `y` is `[rows, out]` row-major. Only on CPUs where
/// [`available`] holds.
pub fn gemm<'w, F>(x: &PackedTokens, k: usize, out: usize, row: F, y: &mut [f32])
where
    F: Fn(usize) -> &'w [u16] + Sync,
{
    assert!(available(), "the bf16 GEMM needs AVX512_BF16");
    assert!(y.len() == x.rows * out && x.pairs == k.div_ceil(2));
    let panels = out.div_ceil(PANEL);
    let y_ptr = OutPtr(y.as_mut_ptr());
    (0..panels).into_par_iter().for_each_init(
        || vec![0u32; x.pairs * PANEL],
        |packed, pi| {
            let n0 = pi * PANEL;
            let width = PANEL.min(out - n0);
            pack_panel(&row, n0, width, k, packed);
            for t0 in (0..x.rows).step_by(TILE) {
                let n = TILE.min(x.rows - t0);
                let tile = &x.data[t0 * x.pairs..(t0 + n) * x.pairs];
                // SAFETY: the CPU has AVX512_BF16 (asserted above); `packed` holds `pairs`
                // lines of 32 features and `tile` `pairs` lines of `n` tokens; this panel
                // writes only columns n0..n0 + width of rows t0..t0 + n, which no other panel
                // writes, all inside `y` (rows · out values).
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    x86::tile(n, packed, tile, x.pairs, y_ptr.at(t0 * out + n0), out, width)
                };
            }
        },
    );
}

/// An output matrix's base pointer, shared by the tasks of a threaded GEMM (here and the AMX
/// one), which write disjoint elements.
#[derive(Clone, Copy)]
pub(super) struct OutPtr(pub(super) *mut f32);
// SAFETY: the tasks write disjoint elements through it (see the GEMMs), and the output outlives
// them.
unsafe impl Send for OutPtr {}
// SAFETY: as for Send: shared between the tasks, each writing only its own elements.
unsafe impl Sync for OutPtr {}

impl OutPtr {
    pub(super) fn at(self, offset: usize) -> *mut f32 {
        // SAFETY: callers pass an offset inside the output.
        unsafe { self.0.add(offset) }
    }
}

/// Features `n0..n0 + width` of the weights, pair-major: `packed[p · 32 + f]` is pair `p` of
/// feature `n0 + f` (zero for features past `width` and for an odd input's last pair half).
fn pack_panel<'w>(row: &impl Fn(usize) -> &'w [u16], n0: usize, width: usize, k: usize, packed: &mut [u32]) {
    let pairs = k.div_ceil(2);
    if width < PANEL {
        packed.fill(0);
    }
    for f in 0..width {
        let w = row(n0 + f);
        assert_eq!(w.len(), k, "weight row {} has {} values, expected {k}", n0 + f, w.len());
        let (whole, rest) = w.as_chunks::<2>();
        for (p, pair) in whole.iter().enumerate() {
            packed[p * PANEL + f] = u32::from(pair[0]) | (u32::from(pair[1]) << 16);
        }
        if let [last] = rest {
            packed[(pairs - 1) * PANEL + f] = u32::from(*last);
        }
    }
}

/// The kernel's sum for one output: f32, pairs in order, odd product then even (see the module
/// documentation). The specification the kernel is tested against.
pub fn reference(w: &[u16], x: &[u16]) -> f32 {
    let f = crate::model::storage::bf16_to_f32;
    let mut acc = 0f32;
    for (wp, xp) in w.chunks(2).zip(x.chunks(2)) {
        if wp.len() == 2 {
            acc += f(wp[1]) * f(xp[1]);
        }
        acc += f(wp[0]) * f(xp[0]);
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// A tile of `n ≤ 12` tokens against a packed panel, dispatched to the kernel for `n`.
    ///
    /// # Safety
    /// AVX512_BF16; `panel` holds `pairs · 32` values, `tokens` `pairs · n`; `y` points at the
    /// tile's first output, rows `stride` apart, each with `width ≤ 32` writable values.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub unsafe fn tile(
        n: usize,
        panel: &[u32],
        tokens: &[u32],
        pairs: usize,
        y: *mut f32,
        stride: usize,
        width: usize,
    ) {
        macro_rules! dispatch {
            ($($r:literal),*) => {
                match n {
                    // SAFETY: as this function's contract, for n = $r.
                    $($r => unsafe { kernel::<$r>(panel, tokens, pairs, y, stride, width) },)*
                    _ => unreachable!("tiles hold 1 to 12 tokens"),
                }
            };
        }
        dispatch!(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12)
    }

    /// `R` tokens against a packed panel.
    ///
    /// # Safety
    ///
    /// As [`tile`] with `n = R`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn kernel<const R: usize>(
        panel: &[u32],
        tokens: &[u32],
        pairs: usize,
        y: *mut f32,
        stride: usize,
        width: usize,
    ) {
        debug_assert!(panel.len() >= pairs * 32 && tokens.len() >= pairs * R);
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        let (pp, tp) = (panel.as_ptr(), tokens.as_ptr());
        // SAFETY: pair p reads panel[p·32..p·32 + 32] and tokens[p·R..p·R + R], in bounds for
        // p < pairs; the stores write `width` values of each of the R rows (the caller's contract).
        unsafe {
            for p in 0..pairs {
                let w0: __m512bh = std::mem::transmute(_mm512_loadu_si512(pp.add(p * 32).cast()));
                let w1: __m512bh = std::mem::transmute(_mm512_loadu_si512(pp.add(p * 32 + 16).cast()));
                for r in 0..R {
                    let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(*tp.add(p * R + r) as i32));
                    lo[r] = _mm512_dpbf16_ps(lo[r], w0, x);
                    hi[r] = _mm512_dpbf16_ps(hi[r], w1, x);
                }
            }
            for r in 0..R {
                let row = y.add(r * stride);
                if width == 32 {
                    _mm512_storeu_ps(row, lo[r]);
                    _mm512_storeu_ps(row.add(16), hi[r]);
                } else {
                    let mask = |from: usize| -> __mmask16 {
                        let n = width.saturating_sub(from).min(16);
                        ((1u32 << n) - 1) as __mmask16
                    };
                    _mm512_mask_storeu_ps(row, mask(0), lo[r]);
                    _mm512_mask_storeu_ps(row.add(16), mask(16), hi[r]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small xorshift generator (the model layer may not use the engine's).
    struct Rng(u64);

    impl Rng {
        fn new(seed: u64) -> Rng {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }

        /// Uniform in [-1, 1).
        fn symmetric(&mut self) -> f32 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }
    }

    fn bf16_values(rng: &mut Rng, n: usize, scale: f32) -> Vec<u16> {
        // Normal values only: `vdpbf16ps` flushes subnormal inputs and results to zero.
        (0..n).map(|_| half::bf16::from_f32(rng.symmetric() * scale + 1e-3).to_bits()).collect()
    }

    #[test]
    fn reference_is_the_sum_within_f32_rounding() {
        let mut rng = Rng::new(3);
        let (w, x) = (bf16_values(&mut rng, 1025, 1.0), bf16_values(&mut rng, 1025, 1.0));
        let f = crate::model::storage::bf16_to_f32;
        let exact: f64 = w.iter().zip(&x).map(|(a, b)| f64::from(f(*a)) * f64::from(f(*b))).sum();
        let mag: f64 = w.iter().zip(&x).map(|(a, b)| (f64::from(f(*a)) * f64::from(f(*b))).abs()).sum();
        let got = f64::from(reference(&w, &x));
        assert!((got - exact).abs() <= mag * 1025.0 * f64::from(f32::EPSILON), "{got} vs {exact}");
    }

    /// Every output of the kernel has the reference's bits, for token counts across the tile
    /// size, partial panels, odd inputs and fused (per-row) weights.
    #[test]
    fn kernel_gives_the_reference_bits() {
        let cpu_has_it = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" avx512_bf16"));
        if cfg!(target_arch = "x86_64") && cfg!(target_os = "linux") {
            assert_eq!(available(), cpu_has_it, "detection disagrees with /proc/cpuinfo");
        }
        if !available() {
            // The kernel cannot run on this CPU; its prefill GEMM is the widening f32 GEMM
            // (`tensor::tests`). Say so rather than pass quietly.
            eprintln!("no AVX512_BF16 on this CPU: the vdpbf16ps GEMM is not exercised here");
            return;
        }
        let mut rng = Rng::new(11);
        for &(rows, k, out) in
            &[(1usize, 2usize, 1usize), (9, 64, 32), (12, 63, 33), (13, 130, 70), (40, 1024, 96), (25, 7, 5)]
        {
            let w = bf16_values(&mut rng, out * k, 0.5);
            let xb = bf16_values(&mut rng, rows * k, 2.0);
            let xf: Vec<f32> = xb.iter().map(|&b| crate::model::storage::bf16_to_f32(b)).collect();
            let packed = PackedTokens::new(&xf, rows, k);
            let mut y = vec![f32::NAN; rows * out];
            gemm(&packed, k, out, |o| &w[o * k..(o + 1) * k], &mut y);
            for r in 0..rows {
                for o in 0..out {
                    let want = reference(&w[o * k..(o + 1) * k], &xb[r * k..(r + 1) * k]);
                    assert_eq!(y[r * out + o].to_bits(), want.to_bits(), "rows {rows} k {k} out {out}: y[{r}][{o}]");
                }
            }
        }
    }
}
