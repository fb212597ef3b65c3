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

/// Whether this CPU runs [`gemm`] (`vdpbf16ps`). Whether the engine uses it is the active kernel
/// family's choice ([`super::CpuKernel::dpbf16`]).
pub(crate) fn available() -> bool {
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
pub(crate) struct PackedTokens {
    rows: usize,
    pairs: usize,
    data: Vec<u32>,
}

impl PackedTokens {
    pub(crate) fn new(x: &[f32], rows: usize, k: usize) -> PackedTokens {
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
pub(crate) fn gemm<'w, F>(x: &PackedTokens, k: usize, out: usize, row: F, y: &mut [f32])
where
    F: Fn(usize) -> &'w [u16] + Sync,
{
    panels::<false>(x, k, out, y, |n0, width, packed, _| pack_panel(&row, n0, width, k, packed));
}

/// [`gemm`] for weights that are not bf16 as stored (FP8: `e4m3 · scale`, with bf16 parts of
/// the same projection beside them): `widen(o, row)` writes weight row `o` as f32. Each value
/// `v` is split into two bf16 halves, `hi` (its leading 8 significant bits, truncated) and `lo`
/// (the rest, `v − hi`, truncated to bf16), packed side by side in the thread's panel (the
/// dequantisation happens there, a panel at a time in L2: never a widened copy of the matrix),
/// and the kernel adds `hi·x` then `lo·x` per pair into one accumulator. Exact products for
/// bf16 and f16 scales (an e4m3 value times one has at most 12 / 15 significant bits, so `lo`
/// holds the rest exactly); f32 scales (Qwen3-Next's) keep 16 bits, 2^-16 relative.
pub(crate) fn gemm_split<F>(x: &PackedTokens, k: usize, out: usize, widen: F, y: &mut [f32])
where
    F: Fn(usize, &mut [f32]) + Sync,
{
    panels::<true>(x, k, out, y, |n0, width, packed, wide| {
        wide.resize(k, 0.0);
        pack_split_panel(&widen, n0, width, k, packed, wide)
    });
}

/// The threaded sweep both GEMMs share: panels of 32 output features on all threads, each
/// packed by `pack(n0, width, panel, scratch)` (one line of 32 pairs a pair, two with `SPLIT`:
/// hi then lo) and swept by tiles of tokens.
fn panels<const SPLIT: bool>(
    x: &PackedTokens,
    k: usize,
    out: usize,
    y: &mut [f32],
    pack: impl Fn(usize, usize, &mut [u32], &mut Vec<f32>) + Sync,
) {
    assert!(available(), "the bf16 GEMM needs AVX512_BF16");
    assert!(y.len() == x.rows * out && x.pairs == k.div_ceil(2));
    let lines = if SPLIT { 2 } else { 1 };
    let y_ptr = OutPtr(y.as_mut_ptr());
    (0..out.div_ceil(PANEL)).into_par_iter().for_each_init(
        || (vec![0u32; x.pairs * PANEL * lines], Vec::new()),
        |(packed, scratch), pi| {
            let n0 = pi * PANEL;
            let width = PANEL.min(out - n0);
            pack(n0, width, packed, scratch);
            for t0 in (0..x.rows).step_by(TILE) {
                let n = TILE.min(x.rows - t0);
                let tile = &x.data[t0 * x.pairs..(t0 + n) * x.pairs];
                // SAFETY: the CPU has AVX512_BF16 (asserted above); `packed` holds `pairs`
                // lines of 32 features (64 values: hi and lo, with SPLIT) and `tile` `pairs`
                // lines of `n` tokens; this panel writes only columns n0..n0 + width of rows
                // t0..t0 + n, which no other panel writes, all inside `y` (rows · out values).
                #[cfg(target_arch = "x86_64")]
                unsafe {
                    x86::tile::<SPLIT>(n, packed, tile, x.pairs, y_ptr.at(t0 * out + n0), out, width)
                };
            }
        },
    );
}

/// The two bf16 halves of `v` (see [`gemm_split`]).
#[inline(always)]
fn split(v: f32) -> (u16, u16) {
    let top = v.to_bits() & 0xFFFF_0000;
    ((top >> 16) as u16, ((v - f32::from_bits(top)).to_bits() >> 16) as u16)
}

/// [`pack_panel`] for [`gemm_split`]: pair `p` of feature `f` at `packed[p · 64 + f]` (hi) and
/// `packed[p · 64 + 32 + f]` (lo).
fn pack_split_panel(
    widen: &impl Fn(usize, &mut [f32]),
    n0: usize,
    width: usize,
    k: usize,
    packed: &mut [u32],
    wide: &mut [f32],
) {
    let pairs = k.div_ceil(2);
    if width < PANEL {
        packed.fill(0);
    }
    for f in 0..width {
        widen(n0 + f, wide);
        for p in 0..pairs {
            let (h0, l0) = split(wide[2 * p]);
            let (h1, l1) = if 2 * p + 1 < k { split(wide[2 * p + 1]) } else { (0, 0) };
            packed[p * 2 * PANEL + f] = u32::from(h0) | (u32::from(h1) << 16);
            packed[p * 2 * PANEL + PANEL + f] = u32::from(l0) | (u32::from(l1) << 16);
        }
    }
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
/// documentation). The specification the kernel is tested against (by the tests only).
#[cfg(test)]
pub(crate) fn reference(w: &[u16], x: &[u16]) -> f32 {
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
    pub(super) unsafe fn tile<const SPLIT: bool>(
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
                    $($r => unsafe { kernel::<$r, SPLIT>(panel, tokens, pairs, y, stride, width) },)*
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
    unsafe fn kernel<const R: usize, const SPLIT: bool>(
        panel: &[u32],
        tokens: &[u32],
        pairs: usize,
        y: *mut f32,
        stride: usize,
        width: usize,
    ) {
        // A split panel holds each pair's hi line of 32 features, then its lo line.
        let line = if SPLIT { 64 } else { 32 };
        debug_assert!(panel.len() >= pairs * line && tokens.len() >= pairs * R);
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        let (pp, tp) = (panel.as_ptr(), tokens.as_ptr());
        // SAFETY: pair p reads panel[p·32..p·32 + 32] and tokens[p·R..p·R + R], in bounds for
        // p < pairs; the stores write `width` values of each of the R rows (the caller's contract).
        unsafe {
            for p in 0..pairs {
                let w0: __m512bh = std::mem::transmute(_mm512_loadu_si512(pp.add(p * line).cast()));
                let w1: __m512bh = std::mem::transmute(_mm512_loadu_si512(pp.add(p * line + 16).cast()));
                if SPLIT {
                    let w2: __m512bh = std::mem::transmute(_mm512_loadu_si512(pp.add(p * line + 32).cast()));
                    let w3: __m512bh = std::mem::transmute(_mm512_loadu_si512(pp.add(p * line + 48).cast()));
                    for r in 0..R {
                        let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(*tp.add(p * R + r) as i32));
                        lo[r] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(lo[r], w0, x), w2, x);
                        hi[r] = _mm512_dpbf16_ps(_mm512_dpbf16_ps(hi[r], w1, x), w3, x);
                    }
                    continue;
                }
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
    /// The split GEMM (FP8 weights at bf16): each output has the bits of the kernel's order over
    /// the hi and lo halves (pair by pair, hi then lo), bf16 rows keep the plain GEMM's bits
    /// (their lo halves are zero), and the result is the exact sum within f32 rounding: the
    /// halves lose nothing of an e4m3 value times a bf16 scale.
    #[test]
    fn split_gemm_gives_its_reference_bits_and_the_exact_sum() {
        if !available() {
            eprintln!("no AVX512_BF16 on this CPU: the vdpbf16ps split GEMM is not exercised here");
            return;
        }
        let f = crate::model::storage::bf16_to_f32;
        let mut rng = Rng::new(23);
        for &(rows, k, out) in &[(1usize, 2usize, 1usize), (12, 63, 33), (13, 130, 70), (40, 1024, 96), (25, 7, 5)] {
            // FP8-like weights: an e4m3 value (nonzero codes, no NaN) times a bf16 block scale.
            let scale = half::bf16::from_f32(1.7e-3).to_f32();
            let wide: Vec<f32> = (0..out * k)
                .map(|i| {
                    let code = ((i * 73 + i / 3) % 0x7E + 1) as u8 | if i % 3 == 0 { 0x80 } else { 0 };
                    crate::model::fp8_codes::E4M3[code as usize] * scale
                })
                .collect();
            let xb = bf16_values(&mut rng, rows * k, 2.0);
            let xf: Vec<f32> = xb.iter().map(|&b| f(b)).collect();
            let packed = PackedTokens::new(&xf, rows, k);
            let mut y = vec![f32::NAN; rows * out];
            gemm_split(&packed, k, out, |o, row| row.copy_from_slice(&wide[o * k..(o + 1) * k]), &mut y);
            for r in 0..rows {
                let x = &xb[r * k..(r + 1) * k];
                for o in 0..out {
                    let w = &wide[o * k..(o + 1) * k];
                    let mut want = 0f32;
                    for (p, xp) in x.chunks(2).enumerate() {
                        let halves = |v: f32| split(v);
                        let (h0, l0) = halves(w[2 * p]);
                        let (h1, l1) = if xp.len() == 2 { halves(w[2 * p + 1]) } else { (0, 0) };
                        let x1 = if xp.len() == 2 { f(xp[1]) } else { 0.0 };
                        want += f(h1) * x1;
                        want += f(h0) * f(xp[0]);
                        want += f(l1) * x1;
                        want += f(l0) * f(xp[0]);
                    }
                    let got = y[r * out + o];
                    assert_eq!(got.to_bits(), want.to_bits(), "rows {rows} k {k} out {out}: y[{r}][{o}]");
                    let exact: f64 = w.iter().zip(x).map(|(a, b)| f64::from(*a) * f64::from(f(*b))).sum();
                    let mag: f64 = w.iter().zip(x).map(|(a, b)| (f64::from(*a) * f64::from(f(*b))).abs()).sum();
                    assert!(
                        (f64::from(got) - exact).abs() <= mag * 2.0 * k as f64 * f64::from(f32::EPSILON),
                        "y[{r}][{o}] = {got}, exact {exact}"
                    );
                }
            }
            // bf16 rows through the split GEMM: the plain GEMM's bits.
            let wb = bf16_values(&mut rng, out * k, 0.5);
            let (mut plain, mut split_y) = (vec![f32::NAN; rows * out], vec![f32::NAN; rows * out]);
            gemm(&packed, k, out, |o| &wb[o * k..(o + 1) * k], &mut plain);
            let widen = |o: usize, row: &mut [f32]| row.iter_mut().zip(&wb[o * k..]).for_each(|(d, &b)| *d = f(b));
            gemm_split(&packed, k, out, widen, &mut split_y);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&split_y), bits(&plain), "rows {rows} k {k} out {out}: bf16 rows split");
        }
    }
}
