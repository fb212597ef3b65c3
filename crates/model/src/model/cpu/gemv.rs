//! Multi-row dot-product kernels for the decode GEMV and the MTP verify pass: weight rows
//! against up to [`MAX_ROWS`] activation rows, each weight read (and, for bf16, widened) once
//! for all of them. Two families, each with one summation order that all its kernels compute:
//!
//! - **f32 activations** (`--dtype f32`; f32 or bf16 weights): exactly the sum [`tensor::dot`]
//!   computes: 16 lanes, lane `i` adding `w[i] · x[i]`, `w[i + 16] · x[i + 16]`, … in order (a
//!   multiply then an add, never fused), the lanes folded pairwise (8, 4, 2, 1), then the scalar
//!   tail added. bf16 weights give the bits of the same weights stored as f32.
//! - **bf16 activations against bf16 weights** (`--dtype bf16`, where a linear layer's input
//!   is a bf16 value as in transformers): the order of `vdpbf16ps` ([`PairKernel`]), which
//!   CPUs with AVX512_BF16 run at 32 products an instruction; the others reproduce it with
//!   fused multiply-adds (a product of two bf16 values is exact in f32).
//!
//! Either way a verify pass over K + 1 tokens gives each token the bits a one-token step gives
//! it, and the AVX-512, AVX2 and portable kernels agree bit for bit (tested below).
//!
//! [`tensor::dot`]: super::tensor::dot

use std::ops::Range;

use super::pair_tail::pairs_tail;
use super::simd::Simd;
use crate::model::storage::bf16_to_f32;

/// Activation rows one call handles (a decode step is 1, an MTP verify pass K + 1 ≤ 5; prefill
/// above this goes to the GEMM).
pub(crate) const MAX_ROWS: usize = 8;

/// Weights as stored: one row, or several rows of the same length back to back.
#[derive(Clone, Copy)]
pub enum WeightRow<'a> {
    F32(&'a [f32]),
    Bf16(&'a [u16]),
}

impl<'a> WeightRow<'a> {
    fn len(&self) -> usize {
        match self {
            WeightRow::F32(w) => w.len(),
            WeightRow::Bf16(w) => w.len(),
        }
    }

    /// Row `o` of rows of `n`.
    fn row(&self, o: usize, n: usize) -> WeightRow<'a> {
        match *self {
            WeightRow::F32(w) => WeightRow::F32(&w[o * n..(o + 1) * n]),
            WeightRow::Bf16(w) => WeightRow::Bf16(&w[o * n..(o + 1) * n]),
        }
    }
}

const LANES: usize = 16;

/// `out[r] = dot(w, xs[r])` for every activation row; each `xs[r]` holds at least `w.len()` values.
pub(crate) fn dot_rows(simd: Simd, w: WeightRow<'_>, xs: &[&[f32]], out: &mut [f32]) {
    let n = w.len();
    gemv_rows(simd, w, n, xs, out);
}

/// `w` holds `k` rows of `n` weights: `out[o · R + r] = dot(w[o], xs[r])` for every weight row
/// `o` and activation row `r` (R = `xs.len()`); each `xs[r]` holds at least `n` values.
pub fn gemv_rows(simd: Simd, w: WeightRow<'_>, n: usize, xs: &[&[f32]], out: &mut [f32]) {
    let rows = xs.len();
    let k = w.len().checked_div(n).unwrap_or(0);
    assert!(
        k * n == w.len() && out.len() == k * rows && xs.iter().all(|x| x.len() >= n),
        "gemv_rows: {} weights as rows of {n}, {} outputs for {rows} activation rows",
        w.len(),
        out.len()
    );
    if k == 0 || rows == 0 {
        return;
    }
    // Activation rows per kernel call: all 8 on AVX-512, 4 on AVX2 (16 registers).
    let group = match simd {
        Simd::Avx512 => MAX_ROWS,
        Simd::Avx2 => 4,
        Simd::Portable => rows,
    };
    in_groups(k, rows, group, out, |r, y| kernel(simd, w, n, k, &xs[r], y));
}

/// FP8 weight rows (e4m3 codes, `n` a row) and the block-scale grid of their matrix
/// (`[ceil(rows / 128), ceil(n / 128)]`); `row0` is the first row's index in that matrix.
#[derive(Clone, Copy)]
pub struct Fp8Rows<'a> {
    pub q: &'a [u8],
    pub grid: &'a [f32],
    pub row0: usize,
}

impl<'a> Fp8Rows<'a> {
    /// Row `o`'s scales: one per 128 of its `n` values.
    fn row_scales(&self, o: usize, n: usize) -> &'a [f32] {
        let (band, gc) = ((self.row0 + o) / FP8_BLOCK, n.div_ceil(FP8_BLOCK));
        &self.grid[band * gc..(band + 1) * gc]
    }
}

/// [`gemv_rows`] for FP8 weights, in the f32-activation order: each weight is dequantised in
/// registers to `e4m3 · scale` (one rounding, as transformers dequantises at float32) and then
/// summed exactly as [`portable`] sums an f32 row holding those values, so an FP8 checkpoint
/// gives the bits of the f32 checkpoint of its dequantised weights.
pub fn fp8_rows(simd: Simd, w: Fp8Rows<'_>, n: usize, xs: &[&[f32]], out: &mut [f32]) {
    let rows = xs.len();
    let k = w.q.len().checked_div(n).unwrap_or(0);
    let bands = (w.row0 + k).div_ceil(FP8_BLOCK);
    assert!(
        k * n == w.q.len()
            && out.len() == k * rows
            && xs.iter().all(|x| x.len() >= n)
            && w.grid.len() >= bands * n.div_ceil(FP8_BLOCK),
        "fp8_rows: {} codes as rows of {n} from row {}, {} scales, {} outputs for {rows} activation rows",
        w.q.len(),
        w.row0,
        w.grid.len(),
        out.len()
    );
    if k == 0 || rows == 0 {
        return;
    }
    let simd = fp8_simd(simd);
    let group = match simd {
        Simd::Portable => rows,
        Simd::Avx2 => 4,
        Simd::Avx512 => MAX_ROWS,
    };
    in_groups(k, rows, group, out, |r, y| {
        let xs = &xs[r];
        match simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `fp8_simd` returns Avx512 only where the CPU has AVX-512F and BW (the
            // engine's AVX-512 level); the lengths were asserted above.
            Simd::Avx512 => unsafe { x86::rows_fp8_avx512(w, n, k, xs, y) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `fp8_simd` returns Avx2 only where the CPU has AVX2 and F16C.
            Simd::Avx2 => unsafe { x86::rows_fp8_avx2(w, n, k, xs, y) },
            _ => {
                let g = xs.len();
                for o in 0..k {
                    let (q, scales) = (&w.q[o * n..(o + 1) * n], w.row_scales(o, n));
                    for (r, x) in xs.iter().enumerate() {
                        y[o * g + r] = portable_fp8(q, scales, x);
                    }
                }
            }
        }
    });
}

/// The FP8 kernels: AVX-512 (F and BW) as the engine detects it; AVX2 with F16C (`vcvtph2ps`
/// widens codes of large-scale rows exactly). Every level sums in the same 16-lane order, so
/// all give the same bits.
fn fp8_simd(simd: Simd) -> Simd {
    #[cfg(target_arch = "x86_64")]
    {
        static F16C: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if simd == Simd::Avx512 {
            return Simd::Avx512;
        }
        if simd == Simd::Avx2 && *F16C.get_or_init(|| std::is_x86_feature_detected!("f16c")) {
            return Simd::Avx2;
        }
    }
    let _ = simd;
    Simd::Portable
}

const FP8_BLOCK: usize = crate::model::fp8::BLOCK;

/// The FP8 reference: [`portable`]'s order over `E4M3[q] · scale` (each weight rounded once),
/// so an FP8 row gives the bits of the f32 row holding its dequantised values.
///
/// Tried and not kept: two sets of lanes (alternate chunks), which halves the kernel's
/// addition chains; decode on the FP8 0.8B shape did not move (the AVX2 EPYC, four
/// interleaved rounds), and it would cost these bits.
pub(crate) fn portable_fp8(q: &[u8], scales: &[f32], x: &[f32]) -> f32 {
    let n = q.len().min(x.len());
    portable_indexed(n, |i| fp8_value(q, scales, i), x)
}

#[inline(always)]
fn fp8_value(q: &[u8], scales: &[f32], i: usize) -> f32 {
    crate::model::fp8_codes::E4M3[q[i] as usize] * scales[i / FP8_BLOCK]
}

/// Runs `kernel` over the activation rows in groups of at most `group`, each writing its
/// `[k, group rows]` block, and scatters the blocks into `out` (`[k, rows]`). One group (every
/// decode step and verify pass on AVX-512) writes straight into `out`.
fn in_groups(k: usize, rows: usize, group: usize, out: &mut [f32], mut kernel: impl FnMut(Range<usize>, &mut [f32])) {
    if rows <= group {
        kernel(0..rows, out);
        return;
    }
    let mut y = vec![0f32; k * group];
    for r0 in (0..rows).step_by(group) {
        let g = group.min(rows - r0);
        let y = &mut y[..k * g];
        kernel(r0..r0 + g, y);
        for o in 0..k {
            out[o * rows + r0..o * rows + r0 + g].copy_from_slice(&y[o * g..(o + 1) * g]);
        }
    }
}

/// One group of activation rows (at most the kernel's width), written `[k, xs.len()]`.
fn kernel(simd: Simd, w: WeightRow<'_>, n: usize, k: usize, xs: &[&[f32]], y: &mut [f32]) {
    match simd {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Simd::detect` returns Avx512 / Avx2 only where the CPU has them (the tests
        // pick them only after checking); `gemv_rows` asserted the lengths.
        Simd::Avx512 => unsafe { x86::rows_avx512(w, n, k, xs, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        Simd::Avx2 => unsafe { x86::rows_avx2(w, n, k, xs, y) },
        _ => {
            let g = xs.len();
            for o in 0..k {
                let wo = w.row(o, n);
                for (r, x) in xs.iter().enumerate() {
                    y[o * g + r] = portable(wo, x);
                }
            }
        }
    }
}

/// The reference: the order every kernel reproduces, written plainly.
pub(crate) fn portable(w: WeightRow<'_>, x: &[f32]) -> f32 {
    match w {
        WeightRow::F32(w) => portable_widened(w, |v| v, x),
        WeightRow::Bf16(w) => portable_widened(w, bf16_to_f32, x),
    }
}

/// The reference order over slices: [`portable_indexed`]'s sums, written over whole chunks of
/// [`LANES`] so that the compiler keeps the lanes in vector registers (no bounds check per
/// element) — the same additions in the same order, several times faster.
#[inline(always)]
fn portable_widened<W: Copy>(w: &[W], widen: impl Fn(W) -> f32, x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let (w, x) = (&w[..n], &x[..n]);
    let mut acc = [0f32; LANES];
    let (wc, xc) = (w.chunks_exact(LANES), x.chunks_exact(LANES));
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (wc, xc) in wc.zip(xc) {
        for i in 0..LANES {
            acc[i] += widen(wc[i]) * xc[i];
        }
    }
    let mut s = 0f32;
    for (wi, xi) in wr.iter().zip(xr) {
        s += widen(*wi) * xi;
    }
    fold_lanes(acc, s)
}

/// The reference order's end: the lanes folded pairwise (8, 4, 2, 1), then the tail added.
#[inline(always)]
fn fold_lanes(mut acc: [f32; LANES], tail: f32) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0] + tail
}

/// The reference order over `n` weights given by index.
#[inline(always)]
fn portable_indexed(n: usize, w: impl Fn(usize) -> f32, x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = n / LANES;
    for c in 0..chunks {
        for i in 0..LANES {
            acc[i] += w(c * LANES + i) * x[c * LANES + i];
        }
    }
    let mut s = 0f32;
    for (i, xi) in x.iter().enumerate().take(n).skip(chunks * LANES) {
        s += w(i) * xi;
    }
    fold_lanes(acc, s)
}

/// The scalar tail past the last full 16 values, in order.
#[inline(always)]
fn tail(w: WeightRow<'_>, x: &[f32], from: usize) -> f32 {
    let mut s = 0f32;
    match w {
        WeightRow::F32(w) => {
            for i in from..w.len() {
                s += w[i] * x[i];
            }
        }
        WeightRow::Bf16(w) => {
            for i in from..w.len() {
                s += bf16_to_f32(w[i]) * x[i];
            }
        }
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use std::ops::Range;

    use super::{BLOCK, Fp8Rows, LANES, MAX_ROWS, PairRows, WeightRow, pairs_tail, tail};

    /// Folds 16 lanes as the reference does: `a[i] += a[i + 8]`, then `+ 4`, `+ 2`, `+ 1`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn fold8(v: __m256) -> f32 {
        let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let d = _mm_add_ps(q, _mm_movehl_ps(q, q));
        _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn fold16(v: __m512) -> f32 {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
        fold8(_mm256_add_ps(lo, hi))
    }

    /// How far ahead of the kernel the weights are prefetched, in bytes, by CPU vendor (one
    /// core's hardware prefetchers alone kept the f32 GEMV at ~10 GB/s where a plain read loop
    /// reaches ~12 on the Xeon here; the hint closes that gap).
    ///
    /// - Intel (the 2-core Xeon with AMX): 4 KB. f32 decode on the 0.8B shape read 8.5 tok/s at
    ///   2 KB, 8.8 at 4 KB and 8.8 at 8 KB; 0.5 and 1 KB were below 2 KB in a plain read loop.
    /// - AMD (the 2-core EPYC, Zen 3, AVX2): 1 KB. A plain GEMV loop on two threads read
    ///   28.9 / 29.5 / 27.3 / 25.2 GB/s at 0.5 / 1 / 2 / 4 KB (27.1 without the hint), and bf16
    ///   decode on the 0.8B shape went from about 14.5 to 16 tok/s at 1 KB (four interleaved
    ///   rounds; 4 KB was no better than no hint at all).
    fn prefetch_bytes() -> usize {
        static BYTES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        *BYTES.get_or_init(|| if super::super::simd::amd() { 1024 } else { 4096 })
    }

    /// Asks for the weight line [`prefetch_bytes`] past `p` (a hint: it never faults, so a
    /// line past the end of the weights is harmless).
    #[inline(always)]
    fn prefetch(p: *const u8) {
        // SAFETY: a prefetch reads nothing the program sees and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(prefetch_bytes()).cast()) }
    }

    /// Eight weights at `p[i..i + 8]` as f32 (bf16 widened by a 16-bit shift, exact).
    ///
    /// # Safety
    ///
    /// AVX2; `p` points at a row of at least `i + 8` weights.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8<const BF16: bool>(p: *const u8, i: usize) -> __m256 {
        // SAFETY: the caller keeps i + 8 within the row.
        unsafe {
            if BF16 {
                let h = _mm_loadu_si128(p.cast::<u16>().add(i).cast());
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            } else {
                _mm256_loadu_ps(p.cast::<f32>().add(i))
            }
        }
    }

    /// Sixteen weights at `p[i..i + 16]` as f32.
    ///
    /// # Safety
    ///
    /// AVX-512F and AVX-512BW; `p` points at a row of at least `i + 16` weights.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load16<const BF16: bool>(p: *const u8, i: usize) -> __m512 {
        // SAFETY: the caller keeps i + 16 within the row.
        unsafe {
            if BF16 {
                let h = _mm256_loadu_si256(p.cast::<u16>().add(i).cast());
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
            } else {
                _mm512_loadu_ps(p.cast::<f32>().add(i))
            }
        }
    }

    /// Why one weight row at a time: two or four rows interleaved (more independent addition
    /// chains) measured 15-30 % slower on the 0.8B shape here; decode is bound by memory, and
    /// one sequential stream per thread is what the prefetchers serve best.
    fn parts(w: WeightRow<'_>) -> ((*const u8, usize), bool) {
        match w {
            WeightRow::F32(w) => ((w.as_ptr().cast(), 4), false),
            WeightRow::Bf16(w) => ((w.as_ptr().cast(), 2), true),
        }
    }

    macro_rules! by_rows {
        ($kernel:ident, $bf16:literal, $w:expr, $n:expr, $k:expr, $xs:expr, $out:expr, [$($r:literal),*]) => {
            match $xs.len() {
                $($r => {
                    let mut x = [std::ptr::null::<f32>(); $r];
                    for (p, row) in x.iter_mut().zip($xs) {
                        *p = row.as_ptr();
                    }
                    let ((base, elem), _) = parts($w);
                    for o in 0..$k {
                        // SAFETY: row o lies within the k rows of n values the caller passed.
                        unsafe { $kernel::<$bf16, $r>(base.add(o * $n * elem), x, $n, &mut $out[o * $r..(o + 1) * $r]) };
                    }
                })*
                _ => unreachable!("row groups are at most {MAX_ROWS}"),
            }
        };
    }

    /// AVX-512: one zmm accumulator per activation row.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F and AVX-512BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn rows_avx512(w: WeightRow<'_>, n: usize, k: usize, xs: &[&[f32]], out: &mut [f32]) {
        if parts(w).1 {
            by_rows!(block512, true, w, n, k, xs, out, [1, 2, 3, 4, 5, 6, 7, 8])
        } else {
            by_rows!(block512, false, w, n, k, xs, out, [1, 2, 3, 4, 5, 6, 7, 8])
        }
    }

    /// AVX2: two ymm accumulators (lanes 0–7, 8–15) per activation row, 4 rows at most.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn rows_avx2(w: WeightRow<'_>, n: usize, k: usize, xs: &[&[f32]], out: &mut [f32]) {
        if parts(w).1 {
            by_rows!(block256, true, w, n, k, xs, out, [1, 2, 3, 4])
        } else {
            by_rows!(block256, false, w, n, k, xs, out, [1, 2, 3, 4])
        }
    }

    /// One weight row against `R` activation rows.
    ///
    /// # Safety
    ///
    /// AVX-512F and AVX-512BW; `w` and every `x[r]` point at rows of `n` values.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn block512<const BF16: bool, const R: usize>(w: *const u8, x: [*const f32; R], n: usize, out: &mut [f32]) {
        let chunks = n / LANES;
        let mut acc = [_mm512_setzero_ps(); R];
        for c in 0..chunks {
            let i = c * LANES;
            // SAFETY: i + 16 <= n, and every row holds n values.
            unsafe {
                // One hint per 64-byte line: every chunk for f32 weights, every other for bf16.
                if !BF16 || c % 2 == 0 {
                    prefetch(w.wrapping_add(i * if BF16 { 2 } else { 4 }));
                }
                let wv = load16::<BF16>(w, i);
                for r in 0..R {
                    acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(wv, _mm512_loadu_ps(x[r].add(i))));
                }
            }
        }
        for r in 0..R {
            // SAFETY: the rows hold n values.
            let (wr, xr) = unsafe { row_slices::<BF16>(w, x[r], n) };
            out[r] = fold16(acc[r]) + tail(wr, xr, chunks * LANES);
        }
    }

    /// One weight row against `R` activation rows, on AVX2.
    ///
    /// # Safety
    ///
    /// AVX2; `w` and every `x[r]` point at rows of `n` values.
    #[target_feature(enable = "avx2")]
    unsafe fn block256<const BF16: bool, const R: usize>(w: *const u8, x: [*const f32; R], n: usize, out: &mut [f32]) {
        let chunks = n / LANES;
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for c in 0..chunks {
            let i = c * LANES;
            // SAFETY: i + 16 <= n, and every row holds n values.
            unsafe {
                if !BF16 || c % 2 == 0 {
                    prefetch(w.wrapping_add(i * if BF16 { 2 } else { 4 }));
                }
                let (wl, wh) = (load8::<BF16>(w, i), load8::<BF16>(w, i + 8));
                for r in 0..R {
                    let p = x[r].add(i);
                    lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(wl, _mm256_loadu_ps(p)));
                    hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(wh, _mm256_loadu_ps(p.add(8))));
                }
            }
        }
        for r in 0..R {
            // SAFETY: the rows hold n values.
            let (wr, xr) = unsafe { row_slices::<BF16>(w, x[r], n) };
            out[r] = fold8(_mm256_add_ps(lo[r], hi[r])) + tail(wr, xr, chunks * LANES);
        }
    }

    /// FP8 weight rows against `xs.len()` activation rows (one of the listed counts): each row
    /// through `$block` with its scales, by the f32-bits widening when they allow it.
    macro_rules! fp8_by_rows {
        ($block:ident, $w:expr, $n:expr, $k:expr, $xs:expr, $out:expr, [$($r:literal),*]) => {
            match $xs.len() {
                $($r => {
                    let mut x = [std::ptr::null::<f32>(); $r];
                    for (p, row) in x.iter_mut().zip($xs) {
                        *p = row.as_ptr();
                    }
                    for o in 0..$k {
                        let scales = $w.row_scales(o, $n);
                        let (q, y) = ($w.q[o * $n..].as_ptr(), &mut $out[o * $r..(o + 1) * $r]);
                        // SAFETY: row o lies within the k rows of n codes; its scales cover its
                        // n values.
                        unsafe {
                            if scales.iter().all(|s| s.abs() < MAX_SCALE_AS_F32_BITS) {
                                $block::<$r, true>(q, scales, x, $n, y)
                            } else {
                                $block::<$r, false>(q, scales, x, $n, y)
                            }
                        };
                    }
                })*
                _ => unreachable!("FP8 row groups are at most {MAX_ROWS}"),
            }
        };
    }

    /// The scalar tail of an FP8 row past its last whole 16 values, in order.
    ///
    /// # Safety
    ///
    /// `q` and `x` point at rows of `n` values.
    unsafe fn fp8_tail(q: *const u8, scales: &[f32], x: *const f32, n: usize, from: usize) -> f32 {
        // SAFETY: the caller's rows hold n values.
        let (qs, xr) = unsafe { (std::slice::from_raw_parts(q, n), std::slice::from_raw_parts(x, n)) };
        let mut t = 0f32;
        for (i, xi) in xr.iter().enumerate().skip(from) {
            t += super::fp8_value(qs, scales, i) * xi;
        }
        t
    }

    /// FP8 rows against up to 4 activation rows (the lanes and order of [`block256`]).
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and F16C; the lengths are those `fp8_rows` asserted.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn rows_fp8_avx2(w: Fp8Rows<'_>, n: usize, k: usize, xs: &[&[f32]], out: &mut [f32]) {
        fp8_by_rows!(block256_fp8, w, n, k, xs, out, [1, 2, 3, 4])
    }

    /// FP8 rows against up to 8 activation rows, one zmm accumulator per row (the lanes and
    /// order of [`block512`], so the bits of [`rows_fp8_avx2`]).
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F and AVX-512BW; the lengths are those `fp8_rows` asserted.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn rows_fp8_avx512(w: Fp8Rows<'_>, n: usize, k: usize, xs: &[&[f32]], out: &mut [f32]) {
        fp8_by_rows!(block512_fp8, w, n, k, xs, out, [1, 2, 3, 4, 5, 6, 7, 8])
    }

    /// [`block256_fp8`] with one zmm of 16 codes a step.
    ///
    /// # Safety
    ///
    /// AVX-512F and AVX-512BW; `q` and every `x[r]` point at rows of `n` values, `scales`
    /// holds `ceil(n / 128)`.
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn block512_fp8<const R: usize, const AS_F32_BITS: bool>(
        q: *const u8,
        scales: &[f32],
        x: [*const f32; R],
        n: usize,
        out: &mut [f32],
    ) {
        let chunks = n / LANES;
        let mut acc = [_mm512_setzero_ps(); R];
        let mut s = _mm512_setzero_ps();
        let to_value = if AS_F32_BITS { 2f32.powi(120) } else { 256.0 };
        let m = _mm512_set1_epi32(0x87F0_0000u32 as i32);
        for c in 0..chunks {
            let i = c * LANES;
            if i.is_multiple_of(super::FP8_BLOCK) {
                s = _mm512_set1_ps(scales[i / super::FP8_BLOCK] * to_value);
            }
            // SAFETY: i + 16 <= n, in every row.
            unsafe {
                if c % 4 == 0 {
                    prefetch(q.wrapping_add(i));
                }
                let codes = _mm_loadu_si128(q.add(i).cast());
                let wv = if AS_F32_BITS {
                    // As in `fp8_chunk`: `S 0000EEEE MMM 0…`, the f32 of value e4m3 · 2^-120.
                    let e = _mm512_cvtepi8_epi32(codes);
                    _mm512_mul_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(e, 20), m)), s)
                } else {
                    // As in `fp8_chunk`: the f16 `S 0EEEE MMM0000000`, the code's value / 256.
                    let e = _mm256_cvtepi8_epi16(codes);
                    let h = _mm256_and_si256(_mm256_slli_epi16(e, 7), _mm256_set1_epi16(0xBFFFu16 as i16));
                    _mm512_mul_ps(_mm512_cvtph_ps(h), s)
                };
                for r in 0..R {
                    acc[r] = _mm512_add_ps(acc[r], _mm512_mul_ps(wv, _mm512_loadu_ps(x[r].add(i))));
                }
            }
        }
        for r in 0..R {
            // SAFETY: the rows hold n codes and n activations.
            out[r] = fold16(acc[r]) + unsafe { fp8_tail(q, scales, x[r], n, chunks * LANES) };
        }
    }

    /// Scales below this take the f32-bits widening (`AS_F32_BITS`): their · 2^120 stays finite.
    const MAX_SCALE_AS_F32_BITS: f32 = 128.0;

    /// One FP8 weight row against `R` activation rows: 16 codes a step ([`fp8_chunk`]), each
    /// widened exactly to the e4m3 value times a power of two and multiplied by the block's
    /// scale times its inverse — the one rounding of `e4m3 · scale`, since a power of two moves
    /// no bits.
    ///
    /// - `AS_F32_BITS` (scales below 128, every real checkpoint's): the code sign-extended to 32
    ///   bits, shifted left 20 and masked to `S 0000EEEE MMM…`, an f32 of value e4m3 · 2^-120
    ///   (an f32 subnormal for e4m3's subnormals, exact: the kernels run without flush-to-zero),
    ///   times scale · 2^120. Two integer operations and no conversion a code: 3–12 % more
    ///   decode on the FP8 0.8B shape than the f16 route (the AVX2 EPYC, six interleaved
    ///   rounds: 19.2–19.9 → 20.2–21.9 tok/s).
    /// - otherwise: through f16 (`S EEEE MMM` placed as the f16 `S 0EEEE MMM0000000`, the value
    ///   / 256, subnormals included, widened by `vcvtph2ps`), times scale · 256.
    ///
    /// # Safety
    ///
    /// AVX2 and F16C; `q` and every `x[r]` point at rows of `n` values, `scales` holds
    /// `ceil(n / 128)`.
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn block256_fp8<const R: usize, const AS_F32_BITS: bool>(
        q: *const u8,
        scales: &[f32],
        x: [*const f32; R],
        n: usize,
        out: &mut [f32],
    ) {
        let chunks = n / LANES;
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        let mut s = _mm256_setzero_ps();
        let to_value = if AS_F32_BITS { 2f32.powi(120) } else { 256.0 };
        let scale_at = |i: usize| _mm256_set1_ps(scales[i / super::FP8_BLOCK] * to_value);
        let mut c = 0;
        // Four chunks (one 64-byte line of codes) a turn: one prefetch, and the scale changes
        // only at a turn's start (128 is two turns).
        // SAFETY: every chunk read lies below chunks · 16 <= n, in every row.
        unsafe {
            while c + 4 <= chunks {
                let i = c * LANES;
                if i.is_multiple_of(super::FP8_BLOCK) {
                    s = scale_at(i);
                }
                prefetch(q.wrapping_add(i));
                for j in 0..4 {
                    fp8_chunk::<R, AS_F32_BITS>(q, i + j * LANES, s, &x, &mut lo, &mut hi);
                }
                c += 4;
            }
            while c < chunks {
                let i = c * LANES;
                if i.is_multiple_of(super::FP8_BLOCK) {
                    s = scale_at(i);
                }
                fp8_chunk::<R, AS_F32_BITS>(q, i, s, &x, &mut lo, &mut hi);
                c += 1;
            }
        }
        for r in 0..R {
            // SAFETY: the rows hold n codes and n activations.
            out[r] = fold8(_mm256_add_ps(lo[r], hi[r])) + unsafe { fp8_tail(q, scales, x[r], n, chunks * LANES) };
        }
    }

    /// Codes `i..i + 16` times `s` (the block's scale times the inverse of the widening's power
    /// of two, see [`block256_fp8`]), into the lane accumulators.
    ///
    /// # Safety
    ///
    /// AVX2 and F16C; `i + 16` is within the codes and every activation row.
    #[inline(always)]
    unsafe fn fp8_chunk<const R: usize, const AS_F32_BITS: bool>(
        q: *const u8,
        i: usize,
        s: __m256,
        x: &[*const f32; R],
        lo: &mut [__m256; R],
        hi: &mut [__m256; R],
    ) {
        // SAFETY: the caller keeps i + 16 inside the rows.
        unsafe {
            let (wl, wh) = if AS_F32_BITS {
                // Sign-extended to 32 bits and shifted left 20: `SSSS SEEEE MMM 0…`; the mask
                // keeps `S 0000EEEE MMM 0…`, the f32 of value e4m3 · 2^-120.
                let m = _mm256_set1_epi32(0x87F0_0000u32 as i32);
                let e0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(i).cast()));
                let e1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(q.add(i + 8).cast()));
                (
                    _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(e0, 20), m)), s),
                    _mm256_mul_ps(_mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(e1, 20), m)), s),
                )
            } else {
                // Sign-extended to 16 bits and shifted left 7: `S S EEEE MMM 0000000`; clearing
                // bit 14 leaves the f16 `S 0EEEE MMM0000000`, the code's value / 256.
                let e = _mm256_cvtepi8_epi16(_mm_loadu_si128(q.add(i).cast()));
                let h = _mm256_and_si256(_mm256_slli_epi16(e, 7), _mm256_set1_epi16(0xBFFFu16 as i16));
                (
                    _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s),
                    _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s),
                )
            };
            for r in 0..R {
                let p = x[r].add(i);
                lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(wl, _mm256_loadu_ps(p)));
                hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(wh, _mm256_loadu_ps(p.add(8))));
            }
        }
    }

    /// bf16 bits of the e4m3 subnormals `m · 2^-9`, m = 0..7 (the rest of the 32 unused).
    const E4M3_SUBNORMAL_BF16: [u16; 32] = {
        let mut t = [0u16; 32];
        let mut m = 1;
        while m < 8 {
            t[m] = (crate::model::fp8_codes::e4m3_to_f32(m as u8).to_bits() >> 16) as u16;
            m += 1;
        }
        t
    };

    /// FP8 rows against up to 8 bf16 activation rows ([`super::fp8_pairs_rows`]).
    ///
    /// # Safety
    ///
    /// AVX-512F, AVX-512BW and AVX512_BF16; the lengths are those `fp8_pairs_rows` asserted.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn rows_fp8_dpbf16(
        w: Fp8Rows<'_>,
        n: usize,
        k: usize,
        x: &PairRows,
        rows: Range<usize>,
        out: &mut [f32],
    ) {
        macro_rules! dispatch {
            ($($r:literal),*) => {
                match rows.len() {
                    $($r => {
                        let mut xp = [std::ptr::null::<u16>(); $r];
                        for (i, p) in xp.iter_mut().enumerate() {
                            *p = x.bits_row(rows.start + i).as_ptr();
                        }
                        for o in 0..k {
                            let scales = w.row_scales(o, n);
                            // SAFETY: row o holds n codes, its scales cover them, every
                            // activation row holds n values.
                            let acc = unsafe { fp8_dpbf16::<$r>(w.q[o * n..].as_ptr(), scales, xp, n) };
                            out[o * $r..(o + 1) * $r].copy_from_slice(&acc);
                        }
                    })*
                    _ => unreachable!("FP8 row groups are at most {MAX_ROWS}"),
                }
            };
        }
        dispatch!(1, 2, 3, 4, 5, 6, 7, 8)
    }

    /// One FP8 row against `R` bf16 rows: 32 codes a step, a block's sum scaled at its end.
    ///
    /// # Safety
    ///
    /// AVX-512F, AVX-512BW and AVX512_BF16; `q` and every `x[r]` point at rows of `n` values,
    /// `scales` holds `ceil(n / 128)`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn fp8_dpbf16<const R: usize>(q: *const u8, scales: &[f32], x: [*const u16; R], n: usize) -> [f32; R] {
        const CHUNK: usize = 32;
        let chunks = n / CHUNK;
        let mut acc = [_mm512_setzero_ps(); R];
        let mut blk = [_mm512_setzero_ps(); R];
        // SAFETY: every load reads a whole chunk below chunks · 32 <= n; the table is 32 u16.
        unsafe {
            let magnitude = _mm512_set1_epi16(0x7F);
            let sign_bit = _mm512_set1_epi16(0x80);
            // e4m3 exponent bias 7 → bf16's 127.
            let bias = _mm512_set1_epi16(120 << 7);
            let eight = _mm512_set1_epi16(8);
            let subnormal = _mm512_loadu_si512(E4M3_SUBNORMAL_BF16.as_ptr().cast());
            for c in 0..chunks {
                prefetch(q.wrapping_add(c * CHUNK).cast());
                let codes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(q.add(c * CHUNK).cast()));
                let mag = _mm512_and_si512(codes, magnitude);
                // `S EEEE MMM` → bf16 `S EEEEEEEE MMM0000` (exponent + 120) for normal codes.
                let normal = _mm512_add_epi16(_mm512_slli_epi16(mag, 4), bias);
                let small = _mm512_permutexvar_epi16(mag, subnormal);
                let bits = _mm512_mask_blend_epi16(_mm512_cmplt_epu16_mask(mag, eight), normal, small);
                let bits = _mm512_or_si512(bits, _mm512_slli_epi16(_mm512_and_si512(codes, sign_bit), 8));
                let wv: __m512bh = std::mem::transmute(bits);
                for r in 0..R {
                    let xv: __m512bh = std::mem::transmute(_mm512_loadu_si512(x[r].add(c * CHUNK).cast()));
                    blk[r] = _mm512_dpbf16_ps(blk[r], wv, xv);
                }
                // A block of 128 values (or the row's last whole chunk) ends: times its scale.
                if (c + 1) % 4 == 0 || c + 1 == chunks {
                    let s = _mm512_set1_ps(scales[c * CHUNK / 128]);
                    for r in 0..R {
                        acc[r] = _mm512_fmadd_ps(blk[r], s, acc[r]);
                        blk[r] = _mm512_setzero_ps();
                    }
                }
            }
        }
        std::array::from_fn(|r| {
            let mut t = fold16(acc[r]);
            // SAFETY: the caller's rows hold n values.
            let (qs, xr) = unsafe { (std::slice::from_raw_parts(q, n), std::slice::from_raw_parts(x[r], n)) };
            for (i, &xi) in xr.iter().enumerate().skip(chunks * CHUNK) {
                t += super::fp8_value(qs, scales, i) * crate::model::storage::bf16_to_f32(xi);
            }
            t
        })
    }

    macro_rules! pair_rows {
        ($kernel:ident, $w:expr, $k:expr, $x:expr, $rows:expr, $out:expr, $split:literal, [$($r:literal),*]) => {{
            let (n, first) = ($x.n, $rows.start);
            match $rows.len() {
                $($r => {
                    let mut xp = [std::ptr::null::<u8>(); $r];
                    for (i, p) in xp.iter_mut().enumerate() {
                        *p = if $split { $x.split_row(first + i).as_ptr().cast() } else { $x.bits_row(first + i).as_ptr().cast() };
                    }
                    for o in 0..$k {
                        let wo = &$w[o * n..(o + 1) * n];
                        // SAFETY: row o holds n weights; every activation row holds the
                        // blocks of n values in the kernel's layout.
                        let acc = unsafe { $kernel::<$r>(wo.as_ptr(), xp, n) };
                        for i in 0..$r {
                            let tail = pairs_tail(wo, $x.bits_row(first + i), (n / BLOCK) * BLOCK);
                            $out[o * $r + i] = acc[i] + tail;
                        }
                    }
                })*
                _ => unreachable!("row groups are at most {MAX_ROWS}"),
            }
        }};
    }

    /// `vdpbf16ps`: one instruction per 32 weights per activation row. One weight row at a
    /// time: two at once (each activation load serving two instructions) measured 1.5-3x
    /// slower on 1024-wide rows here, as two weight streams do for the f32 kernels.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F, AVX-512BW and AVX512_BF16.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub(super) unsafe fn pairs_dpbf16(w: &[u16], k: usize, x: &PairRows, rows: Range<usize>, out: &mut [f32]) {
        pair_rows!(block_dpbf16, w, k, x, rows, out, false, [1, 2, 3, 4, 5, 6, 7, 8])
    }

    /// AVX-512F: the odd and even halves of each pair by a mask and a shift, two fused
    /// multiply-adds.
    ///
    /// # Safety
    ///
    /// The CPU has AVX-512F and AVX-512BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn pairs_fma512(w: &[u16], k: usize, x: &PairRows, rows: Range<usize>, out: &mut [f32]) {
        pair_rows!(block_fma512, w, k, x, rows, out, true, [1, 2, 3, 4, 5, 6, 7, 8])
    }

    /// AVX2: as AVX-512F, lanes 0–7 and 8–15 in two registers.
    ///
    /// # Safety
    ///
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn pairs_fma256(w: &[u16], k: usize, x: &PairRows, rows: Range<usize>, out: &mut [f32]) {
        pair_rows!(block_fma256, w, k, x, rows, out, true, [1, 2, 3, 4])
    }

    /// The folded blocks of one weight row against R activation rows (bf16, raw).
    ///
    /// # Safety
    ///
    /// AVX-512F, AVX-512BW and AVX512_BF16; `w` and every `x[r]` hold `n` bf16 values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn block_dpbf16<const R: usize>(w: *const u16, x: [*const u8; R], n: usize) -> [f32; R] {
        let blocks = n / BLOCK;
        let mut a0 = [_mm512_setzero_ps(); R];
        let mut a1 = [_mm512_setzero_ps(); R];
        // SAFETY: every load reads a full block below blocks · 32 <= n.
        unsafe {
            let wb = |b: usize| -> __m512bh { std::mem::transmute(_mm512_loadu_si512(w.add(b * BLOCK).cast())) };
            let xb = |r: usize, b: usize| -> __m512bh {
                std::mem::transmute(_mm512_loadu_si512(x[r].cast::<u16>().add(b * BLOCK).cast()))
            };
            let mut b = 0;
            while b + 2 <= blocks {
                prefetch(w.wrapping_add(b * BLOCK).cast());
                prefetch(w.wrapping_add((b + 1) * BLOCK).cast());
                let (w0, w1) = (wb(b), wb(b + 1));
                for r in 0..R {
                    a0[r] = _mm512_dpbf16_ps(a0[r], w0, xb(r, b));
                    a1[r] = _mm512_dpbf16_ps(a1[r], w1, xb(r, b + 1));
                }
                b += 2;
            }
            if b < blocks {
                let w0 = wb(b);
                for (r, a) in a0.iter_mut().enumerate() {
                    *a = _mm512_dpbf16_ps(*a, w0, xb(r, b));
                }
            }
        }
        std::array::from_fn(|r| fold16(_mm512_add_ps(a0[r], a1[r])))
    }

    /// The folded blocks of one weight row against R activation rows (split f32 halves).
    ///
    /// # Safety
    ///
    /// AVX-512F and AVX-512BW; `w` holds `n` bf16 values and every `x[r]` `n` f32 values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn block_fma512<const R: usize>(w: *const u16, x: [*const u8; R], n: usize) -> [f32; R] {
        let blocks = n / BLOCK;
        let mut acc = [[_mm512_setzero_ps(); R]; 2];
        let odd_mask = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
        for b in 0..blocks {
            // SAFETY: every load reads a full block below blocks · 32 <= n.
            unsafe {
                prefetch(w.wrapping_add(b * BLOCK).cast());
                let v = _mm512_loadu_si512(w.add(b * BLOCK).cast());
                let odd = _mm512_castsi512_ps(_mm512_and_si512(v, odd_mask));
                let even = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
                let a = &mut acc[b % 2];
                for r in 0..R {
                    let xs = x[r].cast::<f32>().add(b * BLOCK);
                    a[r] = _mm512_fmadd_ps(odd, _mm512_loadu_ps(xs), a[r]);
                    a[r] = _mm512_fmadd_ps(even, _mm512_loadu_ps(xs.add(16)), a[r]);
                }
            }
        }
        std::array::from_fn(|r| fold16(_mm512_add_ps(acc[0][r], acc[1][r])))
    }

    /// The folded blocks of one weight row against R activation rows, on AVX2.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA; `w` holds `n` bf16 values and every `x[r]` `n` f32 values.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block_fma256<const R: usize>(w: *const u16, x: [*const u8; R], n: usize) -> [f32; R] {
        let blocks = n / BLOCK;
        // Block b adds into set b % 2. The sets are separate variables and the loop takes two
        // blocks a turn: indexed by `b % 2` at run time they lived on the stack, each
        // multiply-add a load and a store (`gemv_probe` on [2048, 1024] from cache, one thread
        // on the Zen 3 EPYC: 22 → 30 GB/s for one row, 17 → 24 for two, 14 → 16 for three,
        // ~11.5 for four either way).
        let (mut lo0, mut hi0) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
        let (mut lo1, mut hi1) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
        let mut b = 0;
        // SAFETY: every block read is a full block below blocks · 32 <= n.
        unsafe {
            while b + 2 <= blocks {
                fma256_block(w, &x, b, &mut lo0, &mut hi0);
                fma256_block(w, &x, b + 1, &mut lo1, &mut hi1);
                b += 2;
            }
            if b < blocks {
                fma256_block(w, &x, b, &mut lo0, &mut hi0);
            }
        }
        std::array::from_fn(|r| {
            let l = _mm256_add_ps(lo0[r], lo1[r]);
            let h = _mm256_add_ps(hi0[r], hi1[r]);
            fold8(_mm256_add_ps(l, h))
        })
    }

    /// Block `b` of one weight row into one accumulator set: lanes 0–7 in `lo`, 8–15 in `hi`,
    /// each lane the odd product of its pair, then the even one.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA; block `b` lies within the weight row and every activation row.
    #[inline(always)]
    unsafe fn fma256_block<const R: usize>(
        w: *const u16,
        x: &[*const u8; R],
        b: usize,
        lo: &mut [__m256; R],
        hi: &mut [__m256; R],
    ) {
        // SAFETY: the caller keeps block b inside the rows.
        unsafe {
            prefetch(w.wrapping_add(b * BLOCK).cast());
            let odd_mask = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
            let vl = _mm256_loadu_si256(w.add(b * BLOCK).cast());
            let vh = _mm256_loadu_si256(w.add(b * BLOCK + 16).cast());
            let (ol, el) =
                (_mm256_castsi256_ps(_mm256_and_si256(vl, odd_mask)), _mm256_castsi256_ps(_mm256_slli_epi32(vl, 16)));
            let (oh, eh) =
                (_mm256_castsi256_ps(_mm256_and_si256(vh, odd_mask)), _mm256_castsi256_ps(_mm256_slli_epi32(vh, 16)));
            for r in 0..R {
                let xs = x[r].cast::<f32>().add(b * BLOCK);
                lo[r] = _mm256_fmadd_ps(ol, _mm256_loadu_ps(xs), lo[r]);
                hi[r] = _mm256_fmadd_ps(oh, _mm256_loadu_ps(xs.add(8)), hi[r]);
                lo[r] = _mm256_fmadd_ps(el, _mm256_loadu_ps(xs.add(16)), lo[r]);
                hi[r] = _mm256_fmadd_ps(eh, _mm256_loadu_ps(xs.add(24)), hi[r]);
            }
        }
    }

    /// The weight row and activation row back as slices, for the scalar tail.
    ///
    /// # Safety
    ///
    /// `w` and `x` point at rows of `n` values that live for `'a`.
    #[inline(always)]
    unsafe fn row_slices<'a, const BF16: bool>(w: *const u8, x: *const f32, n: usize) -> (WeightRow<'a>, &'a [f32]) {
        // SAFETY: the caller passes pointers to rows of n values that outlive the call.
        unsafe {
            let xr = std::slice::from_raw_parts(x, n);
            if BF16 {
                (WeightRow::Bf16(std::slice::from_raw_parts(w.cast::<u16>(), n)), xr)
            } else {
                (WeightRow::F32(std::slice::from_raw_parts(w.cast::<f32>(), n)), xr)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// bf16 × bf16: the order of `vdpbf16ps`
// ---------------------------------------------------------------------------------------------

/// The kernel family for bf16 weights against bf16 activations (`--dtype bf16`, where every
/// linear layer's input is a bf16 value, as in transformers).
///
/// The order of the sum is the one `vdpbf16ps` (AVX512_BF16) computes, so that the CPUs that have
/// it can use it and every other kernel gives its bits: the row is cut into blocks of 32; block
/// `b` goes to accumulator set `b % 2` (two sets, so one activation row is not bound by one
/// chain's latency); in a block, lane `j` adds `w[2j + 1] · x[2j + 1]` and then `w[2j] · x[2j]`,
/// each addition rounded; the two sets are added lane by lane, the 16 lanes folded pairwise
/// (8, 4, 2, 1) and the scalar tail past the last full block added in order. A product of two
/// bf16 values is exact in f32, so a multiply-then-add, a fused multiply-add and `vdpbf16ps`
/// all round the same sum: the kernels agree bit for bit, except where a value or product is
/// subnormal (below 1.2e-38), which `vdpbf16ps` flushes to zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairKernel {
    /// AMX tiles (`tdpbf16ps`, [`super::amx`]): 16 weight rows × 32 inputs × every activation
    /// row an instruction. Its own summation order (tested to f32 rounding, not bit for bit
    /// against the others); an output's bits do not depend on how many rows ride along.
    Amx,
    /// `vdpbf16ps`: 32 products per instruction.
    Dpbf16,
    /// AVX-512F fused multiply-adds on the two halves of each pair.
    Avx512,
    /// AVX2 fused multiply-adds, 8 lanes at a time.
    Avx2,
    Portable,
}

impl PairKernel {
    /// The bf16 GEMV of the active kernel family ([`super::CpuKernel::active`]).
    pub fn active() -> PairKernel {
        super::CpuKernel::active().pairs()
    }

    pub fn name(self) -> &'static str {
        match self {
            PairKernel::Amx => "amx_bf16",
            PairKernel::Dpbf16 => "avx512_bf16",
            PairKernel::Avx512 => "avx512",
            PairKernel::Avx2 => "avx2",
            PairKernel::Portable => "portable",
        }
    }

    /// Activation rows one pass over the weights handles.
    fn group(self) -> usize {
        match self {
            PairKernel::Amx | PairKernel::Dpbf16 | PairKernel::Avx512 | PairKernel::Portable => MAX_ROWS,
            PairKernel::Avx2 => 4,
        }
    }
}

const BLOCK: usize = 32;

/// A 64-byte cache line, so every activation row starts on one (an unaligned 512-bit load that
/// crosses two lines costs two).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

fn lines_for(bytes: usize) -> usize {
    bytes.div_ceil(64)
}

/// Activation rows rounded to bf16 once per call, in the layout the chosen kernel loads: raw
/// bf16 (`vdpbf16ps`, the portable kernel and every tail), plus, for the fused-multiply-add
/// kernels, each block's 16 odd then 16 even values widened to f32.
pub struct PairRows {
    kernel: PairKernel,
    n: usize,
    rows: usize,
    /// Per row: `bits_stride` lines of bf16.
    bits: Vec<Line>,
    bits_stride: usize,
    /// Per row: `split_stride` lines of f32 (empty for `Dpbf16` / `Portable`).
    split: Vec<Line>,
    split_stride: usize,
    /// The rows packed for the AMX B tile (`Amx` only).
    amx: Option<super::amx::Packed>,
}

impl PairRows {
    /// `xs` rounded to bf16 (round to nearest even; exact where they already are bf16 values).
    pub fn new(kernel: PairKernel, xs: &[&[f32]], n: usize) -> PairRows {
        let rows = xs.len();
        let bits_stride = lines_for(n * 2);
        let blocks = n / BLOCK;
        let needs_split = matches!(kernel, PairKernel::Avx512 | PairKernel::Avx2);
        let split_stride = if needs_split { lines_for(blocks * BLOCK * 4) } else { 0 };
        let mut p = PairRows {
            kernel,
            n,
            rows,
            bits: vec![Line([0; 64]); rows * bits_stride],
            bits_stride,
            split: vec![Line([0; 64]); rows * split_stride],
            split_stride,
            amx: None,
        };
        for (r, x) in xs.iter().enumerate() {
            let bits = p.bits_row_mut(r);
            for (b, &v) in bits.iter_mut().zip(&x[..n]) {
                *b = half::bf16::from_f32(v).to_bits();
            }
            if needs_split {
                let split = p.split_row_mut(r);
                let bf = |i: usize| half::bf16::from_f32(x[i]).to_f32();
                for blk in 0..blocks {
                    for j in 0..16 {
                        split[blk * BLOCK + j] = bf(blk * BLOCK + 2 * j + 1);
                        split[blk * BLOCK + 16 + j] = bf(blk * BLOCK + 2 * j);
                    }
                }
            }
        }
        if kernel == PairKernel::Amx {
            p.amx = Some(super::amx::Packed::new(rows, n, |r| p.bits_row(r)));
        }
        p
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    fn bits_row(&self, r: usize) -> &[u16] {
        let l = &self.bits[r * self.bits_stride..(r + 1) * self.bits_stride];
        // SAFETY: Line is 64 plain bytes, 2-aligned; the view stays within the row's lines.
        unsafe { std::slice::from_raw_parts(l.as_ptr().cast::<u16>(), self.n) }
    }

    fn bits_row_mut(&mut self, r: usize) -> &mut [u16] {
        let l = &mut self.bits[r * self.bits_stride..(r + 1) * self.bits_stride];
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(l.as_mut_ptr().cast::<u16>(), self.n) }
    }

    fn split_row(&self, r: usize) -> &[f32] {
        let l = &self.split[r * self.split_stride..(r + 1) * self.split_stride];
        // SAFETY: Line is 64 plain bytes, 4-aligned; the view stays within the row's lines.
        unsafe { std::slice::from_raw_parts(l.as_ptr().cast::<f32>(), l.len() * 16) }
    }

    fn split_row_mut(&mut self, r: usize) -> &mut [f32] {
        let l = &mut self.split[r * self.split_stride..(r + 1) * self.split_stride];
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts_mut(l.as_mut_ptr().cast::<f32>(), l.len() * 16) }
    }
}

/// `w` holds `k` bf16 rows of `x.n` weights: `out[o · R + r] = w[o] · x[r]` in the order of
/// [`PairKernel`], for every weight row `o` and activation row `r` (R = `x.rows()`).
pub fn pairs_rows(w: &[u16], x: &PairRows, out: &mut [f32]) {
    let (n, rows) = (x.n, x.rows);
    let k = w.len().checked_div(n).unwrap_or(0);
    assert!(
        k * n == w.len() && out.len() == k * rows,
        "pairs_rows: {} weights as rows of {n}, {} outputs for {rows} activation rows",
        w.len(),
        out.len()
    );
    if k == 0 || rows == 0 {
        return;
    }
    in_groups(k, rows, x.kernel.group(), out, |r, y| pairs_kernel(w, k, x, r, y));
}

fn pairs_kernel(w: &[u16], k: usize, x: &PairRows, rows: Range<usize>, y: &mut [f32]) {
    let n = x.n;
    match x.kernel {
        PairKernel::Amx => {
            let Some(packed) = &x.amx else { unreachable!("PairRows packs for AMX when its kernel is Amx") };
            super::amx::gemv(w, k, packed, rows.clone(), y);
            let (g, from) = (rows.len(), (n / BLOCK) * BLOCK);
            if from < n {
                for o in 0..k {
                    for (i, r) in rows.clone().enumerate() {
                        y[o * g + i] += pairs_tail(&w[o * n..(o + 1) * n], x.bits_row(r), from);
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `PairKernel::active` picks these only where the CPU has the features (the
        // tests pick them only after checking); `pairs_rows` asserted the lengths.
        PairKernel::Dpbf16 => unsafe { x86::pairs_dpbf16(w, k, x, rows, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        PairKernel::Avx512 => unsafe { x86::pairs_fma512(w, k, x, rows, y) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: as above.
        PairKernel::Avx2 => unsafe { x86::pairs_fma256(w, k, x, rows, y) },
        _ => {
            let g = rows.len();
            for o in 0..k {
                for (i, r) in rows.clone().enumerate() {
                    y[o * g + i] = portable_pairs(&w[o * n..(o + 1) * n], x.bits_row(r));
                }
            }
        }
    }
}

/// The reference of [`PairKernel`]'s order, written plainly.
pub(crate) fn portable_pairs(w: &[u16], x: &[u16]) -> f32 {
    let n = w.len().min(x.len());
    let blocks = n / BLOCK;
    let mut acc = [[0f32; LANES]; 2];
    for b in 0..blocks {
        let a = &mut acc[b % 2];
        for (j, lane) in a.iter_mut().enumerate() {
            let i = b * BLOCK + 2 * j;
            *lane += bf16_to_f32(w[i + 1]) * bf16_to_f32(x[i + 1]);
            *lane += bf16_to_f32(w[i]) * bf16_to_f32(x[i]);
        }
    }
    let mut lanes = [0f32; LANES];
    for j in 0..LANES {
        lanes[j] = acc[0][j] + acc[1][j];
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            lanes[i] += lanes[i + width];
        }
    }
    lanes[0] + pairs_tail(w, x, blocks * BLOCK)
}

/// Whether [`fp8_pairs_rows`] runs on this CPU (AVX512_BF16).
pub fn fp8_pairs_available() -> bool {
    super::gemm_bf16::available()
}

/// FP8 weight rows against bf16 activation rows (`--dtype bf16` on CPUs with AVX512_BF16): each
/// 32 codes are turned into their bf16 values in registers (an e4m3 value has at most 4
/// significant bits, so it is exact in bf16: the bits are moved, a subnormal code looked up),
/// multiplied with `vdpbf16ps` (exact products, f32 sums) per 128-value block, and each block's
/// sum multiplied by its scale. Half the instructions a weight of the f32-order kernel
/// ([`fp8_rows`]), which `--dtype f32` keeps (its bits are the f32 checkpoint's); this order is
/// bf16 precision's, within f32 rounding of the exact sum.
pub fn fp8_pairs_rows(w: Fp8Rows<'_>, n: usize, x: &PairRows, out: &mut [f32]) {
    let rows = x.rows;
    let k = w.q.len().checked_div(n).unwrap_or(0);
    let bands = (w.row0 + k).div_ceil(FP8_BLOCK);
    assert!(
        fp8_pairs_available()
            && n == x.n
            && k * n == w.q.len()
            && out.len() == k * rows
            && w.grid.len() >= bands * n.div_ceil(FP8_BLOCK),
        "fp8_pairs_rows: {} codes as rows of {n} from row {}, {} scales, {} outputs for {rows} activation rows of {}",
        w.q.len(),
        w.row0,
        w.grid.len(),
        out.len(),
        x.n
    );
    if k == 0 || rows == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX512_BF16 (with F and BW) is present (asserted); the lengths were asserted.
    in_groups(k, rows, MAX_ROWS, out, |r, y| unsafe { x86::rows_fp8_dpbf16(w, n, k, x, r, y) });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f32 kernel this CPU runs (whichever family is active).
    fn kernels() -> Vec<Simd> {
        super::super::CpuKernel::supported().iter().map(|f| f.simd()).fold(vec![], |mut v, s| {
            if !v.contains(&s) {
                v.push(s);
            }
            v
        })
    }

    /// Every kernel, at every row count and at lengths with and without a tail, gives the
    /// reference's bits, for f32 and bf16 weights; bf16 gives the bits of its f32 widening.
    #[test]
    fn every_kernel_gives_the_reference_bits() {
        let have = kernels();
        // The CPUs this is built for have AVX2; a build that silently tested only the
        // portable kernel would prove nothing about the ones in use.
        #[cfg(target_arch = "x86_64")]
        assert!(have.len() >= 2, "no AVX2 on this x86-64 CPU: only the portable kernel was tested");
        for n in [1, 15, 16, 17, 100, 1024, 3584 + 5] {
            let bits: Vec<u16> =
                (0..n).map(|i| half::bf16::from_f32(((i * 7919) % 2003) as f32 / 997.0 - 1.0).to_bits()).collect();
            let wide: Vec<f32> = bits.iter().map(|&b| bf16_to_f32(b)).collect();
            let f32w: Vec<f32> = (0..n).map(|i| (i as f32 * 0.731).cos() * 0.3).collect();
            let rows: Vec<Vec<f32>> =
                (0..MAX_ROWS).map(|r| (0..n).map(|i| ((i * 31 + r * 7) as f32 * 0.37).sin()).collect()).collect();
            for r in 1..=MAX_ROWS {
                let xs: Vec<&[f32]> = rows[..r].iter().map(|v| v.as_slice()).collect();
                for w in [WeightRow::Bf16(&bits), WeightRow::F32(&f32w), WeightRow::F32(&wide)] {
                    let want: Vec<u32> = xs.iter().map(|x| portable(w, x).to_bits()).collect();
                    for &simd in &have {
                        let mut out = vec![0f32; r];
                        dot_rows(simd, w, &xs, &mut out);
                        let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(got, want, "{simd:?} n {n} rows {r}");
                    }
                }
                let a: Vec<u32> = xs.iter().map(|x| portable(WeightRow::Bf16(&bits), x).to_bits()).collect();
                let b: Vec<u32> = xs.iter().map(|x| portable(WeightRow::F32(&wide), x).to_bits()).collect();
                assert_eq!(a, b, "bf16 widened against f32 storage, n {n}");
            }
        }
    }

    /// Several weight rows at once: each output is its row's reference dot product.
    #[test]
    fn weight_rows_at_once_give_each_rows_bits() {
        let (k, n) = (5, 1000 + 3);
        let bits: Vec<u16> = (0..k * n).map(|i| half::bf16::from_f32((i as f32 * 0.013).sin()).to_bits()).collect();
        let rows: Vec<Vec<f32>> = (0..6).map(|r| (0..n).map(|i| ((i + 3 * r) as f32 * 0.29).cos()).collect()).collect();
        let xs: Vec<&[f32]> = rows.iter().map(|v| v.as_slice()).collect();
        for simd in kernels() {
            let mut out = vec![0f32; k * xs.len()];
            gemv_rows(simd, WeightRow::Bf16(&bits), n, &xs, &mut out);
            for o in 0..k {
                for (r, x) in xs.iter().enumerate() {
                    let want = portable(WeightRow::Bf16(&bits[o * n..(o + 1) * n]), x);
                    assert_eq!(out[o * xs.len() + r].to_bits(), want.to_bits(), "{simd:?} o {o} r {r}");
                }
            }
        }
    }

    /// `len` e4m3 codes running through every code (NaNs replaced by their neighbour).
    fn every_code(len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| ((i * 151 + 7) % 256) as u8)
            .map(|b| if crate::model::fp8_codes::is_nan_code(b) { b - 1 } else { b })
            .collect()
    }

    /// FP8 rows give, on every kernel and at every row count, the bits of f32 rows holding
    /// their dequantised values (`e4m3 · scale`), across scale bands and with tails; codes of
    /// every kind (subnormal, negative, the largest) and scales of several magnitudes.
    #[test]
    fn fp8_rows_give_the_bits_of_their_dequantised_f32_rows() {
        use crate::model::fp8_codes::E4M3;
        let have = kernels();
        for (k, n, row0) in [
            (3usize, 1usize, 0usize),
            (2, 15, 0),
            (3, 16, 127),
            (2, 17, 5),
            (4, 130, 126),
            (3, 1024, 0),
            (2, 3589, 200),
        ] {
            let gc = n.div_ceil(FP8_BLOCK);
            let bands = (row0 + k).div_ceil(FP8_BLOCK);
            // Scales of 300 and above in the last case's rows (the f16 route).
            let big = n == 3589;
            let grid: Vec<f32> = (0..bands * gc)
                .map(|i| {
                    if big && i % 3 == 1 {
                        300.0 * (1 + i) as f32
                    } else {
                        2f32.powi(-(i as i32 % 9)) * (1.0 + (i % 5) as f32 * 0.37)
                    }
                })
                .collect();
            let q = every_code(k * n);
            let w = Fp8Rows { q: &q, grid: &grid, row0 };
            let wide: Vec<f32> = (0..k * n)
                .map(|i| E4M3[q[i] as usize] * grid[((row0 + i / n) / FP8_BLOCK) * gc + (i % n) / FP8_BLOCK])
                .collect();
            let rows: Vec<Vec<f32>> =
                (0..MAX_ROWS).map(|r| (0..n).map(|i| ((i * 31 + r * 7) as f32 * 0.37).sin()).collect()).collect();
            for r in 1..=MAX_ROWS {
                let xs: Vec<&[f32]> = rows[..r].iter().map(|v| v.as_slice()).collect();
                let mut want = vec![0f32; k * r];
                gemv_rows(Simd::Portable, WeightRow::F32(&wide), n, &xs, &mut want);
                for &simd in &have {
                    let mut got = vec![0f32; k * r];
                    fp8_rows(simd, w, n, &xs, &mut got);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{simd:?} k {k} n {n} row0 {row0} rows {r}");
                }
            }
        }
    }

    /// FP8 against bf16 rows (`vdpbf16ps`): every output is the exact sum (f64, of the same
    /// dequantised weights and bf16 activations) within f32 accumulation's rounding, its bits do
    /// not depend on how many rows share the call, and every code decodes (subnormals, both
    /// signs, all exponents), across block edges, partial blocks and tails.
    #[test]
    fn fp8_against_bf16_rows_is_the_exact_sum_within_f32_rounding() {
        use crate::model::fp8_codes::E4M3;
        if !fp8_pairs_available() {
            eprintln!("no AVX512_BF16 on this CPU: the FP8 vdpbf16ps GEMV is not exercised here");
            return;
        }
        for (k, n, row0) in [
            (3usize, 1usize, 0usize),
            (2, 31, 0),
            (3, 32, 127),
            (2, 33, 5),
            (4, 130, 126),
            (3, 1024, 0),
            (2, 3589, 200),
        ] {
            let gc = n.div_ceil(FP8_BLOCK);
            let bands = (row0 + k).div_ceil(FP8_BLOCK);
            let grid: Vec<f32> =
                (0..bands * gc).map(|i| 2f32.powi(-(i as i32 % 9)) * (1.0 + (i % 5) as f32 * 0.37)).collect();
            // Every code, NaNs excluded.
            let q = every_code(k * n);
            let w = Fp8Rows { q: &q, grid: &grid, row0 };
            let weight =
                |o: usize, i: usize| E4M3[q[o * n + i] as usize] * grid[((row0 + o) / FP8_BLOCK) * gc + i / FP8_BLOCK];
            let rows: Vec<Vec<f32>> = (0..MAX_ROWS)
                .map(|r| {
                    (0..n).map(|i| half::bf16::from_f32(((i * 31 + r * 7) as f32 * 0.37).sin()).to_f32()).collect()
                })
                .collect();
            let all: Vec<&[f32]> = rows.iter().map(|v| v.as_slice()).collect();
            let x_all = PairRows::new(PairKernel::Dpbf16, &all, n);
            let mut together = vec![0f32; k * MAX_ROWS];
            fp8_pairs_rows(w, n, &x_all, &mut together);
            for (r, row) in rows.iter().enumerate() {
                let x_one = PairRows::new(PairKernel::Dpbf16, &[row.as_slice()], n);
                let mut alone = vec![0f32; k];
                fp8_pairs_rows(w, n, &x_one, &mut alone);
                for o in 0..k {
                    let got = together[o * MAX_ROWS + r];
                    assert_eq!(
                        got.to_bits(),
                        alone[o].to_bits(),
                        "k {k} n {n} row {r} output {o}: alone vs in a group"
                    );
                    let exact: f64 = (0..n).map(|i| f64::from(weight(o, i)) * f64::from(row[i])).sum();
                    let mag: f64 = (0..n).map(|i| (f64::from(weight(o, i)) * f64::from(row[i])).abs()).sum();
                    let bound = mag * (n as f64 + 4.0) * f64::from(f32::EPSILON);
                    assert!(
                        (f64::from(got) - exact).abs() <= bound,
                        "k {k} n {n} row {r} output {o}: {got} vs {exact} (bound {bound})"
                    );
                }
            }
        }
    }

    /// The reference is a real dot product (not just self-consistent).
    #[test]
    fn the_reference_is_a_dot_product() {
        let w: Vec<f32> = (0..37).map(|i| i as f32 * 0.25).collect();
        let x: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.125).collect();
        let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        assert!((portable(WeightRow::F32(&w), &x) as f64 - exact).abs() < 1e-3);
    }

    /// Every bf16 pair kernel this CPU runs but AMX (tested on its own, below), whichever
    /// family is active.
    fn pair_kernels() -> Vec<PairKernel> {
        let families = super::super::CpuKernel::supported();
        families.iter().map(|f| f.pairs()).filter(|p| *p != PairKernel::Amx).collect()
    }

    fn bf16_values(n: usize, seed: usize, scale: f32) -> Vec<u16> {
        (0..n)
            .map(|i| half::bf16::from_f32(((((i + seed) * 7919) % 2003) as f32 / 1001.0 - 1.0) * scale).to_bits())
            .collect()
    }

    /// Every kernel of the bf16 × bf16 family, at every row count and at lengths with and
    /// without a tail (and with an odd number of blocks), gives the reference's bits; where the
    /// CPU has AVX512_BF16 this checks `vdpbf16ps` itself against the order written down in
    /// [`PairKernel`] (two rounded additions per lane, the odd element first).
    #[test]
    fn every_pair_kernel_gives_the_reference_bits() {
        let have = pair_kernels();
        #[cfg(target_arch = "x86_64")]
        {
            assert!(have.len() >= 2, "no AVX2 on this x86-64 CPU: only the portable kernel was tested");
            if std::is_x86_feature_detected!("avx512bf16") && std::is_x86_feature_detected!("avx512bw") {
                assert!(have.contains(&PairKernel::Dpbf16), "the CPU has AVX512_BF16 but the kernel was not tested");
            }
        }
        for n in [1, 31, 32, 33, 64, 96, 100, 1024, 3584 + 5] {
            let w = bf16_values(n, 0, 0.3);
            let rows: Vec<Vec<u16>> = (0..MAX_ROWS).map(|r| bf16_values(n, 31 * r + 7, 2.0)).collect();
            let wide: Vec<Vec<f32>> = rows.iter().map(|r| r.iter().map(|&b| bf16_to_f32(b)).collect()).collect();
            for r in 1..=MAX_ROWS {
                let xs: Vec<&[f32]> = wide[..r].iter().map(|v| v.as_slice()).collect();
                let want: Vec<u32> = rows[..r].iter().map(|x| portable_pairs(&w, x).to_bits()).collect();
                for &kernel in &have {
                    let x = PairRows::new(kernel, &xs, n);
                    let mut out = vec![0f32; r];
                    pairs_rows(&w, &x, &mut out);
                    let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(got, want, "{kernel:?} n {n} rows {r}");
                }
            }
        }
    }

    /// Several weight rows at once, more activation rows than one group: each output is its
    /// row's reference sum; activations that are not bf16 values are rounded to bf16 first.
    #[test]
    fn pair_kernels_over_weight_rows_and_groups() {
        let (k, n) = (5, 1000 + 3);
        let w = bf16_values(k * n, 3, 0.5);
        let rows: Vec<Vec<f32>> =
            (0..MAX_ROWS + 3).map(|r| (0..n).map(|i| ((i + 3 * r) as f32 * 0.29).cos()).collect()).collect();
        let xs: Vec<&[f32]> = rows.iter().map(|v| v.as_slice()).collect();
        let rounded: Vec<Vec<u16>> =
            rows.iter().map(|r| r.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect()).collect();
        for kernel in pair_kernels() {
            let x = PairRows::new(kernel, &xs, n);
            let mut out = vec![0f32; k * xs.len()];
            pairs_rows(&w, &x, &mut out);
            for o in 0..k {
                for (r, xr) in rounded.iter().enumerate() {
                    let want = portable_pairs(&w[o * n..(o + 1) * n], xr);
                    assert_eq!(out[o * xs.len() + r].to_bits(), want.to_bits(), "{kernel:?} o {o} r {r}");
                }
            }
        }
    }

    /// AMX tiles, where the CPU has them (and picked over `vdpbf16ps` there): every output
    /// within f32 rounding of the exact sum (their order is the hardware's own), and its bits
    /// the same whatever activation rows ride along and wherever its weight row falls in a
    /// tile — what makes a verify pass give each token a one-token step's bits.
    #[test]
    fn amx_tiles_are_a_dot_product_whose_bits_do_not_depend_on_their_neighbours() {
        let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_has = flags.lines().any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "amx_bf16"));
        let amx = super::super::amx::available();
        // The AMX family runs where the tiles do, and the bf16 GEMV is AMX exactly when it is active.
        assert_eq!(amx, super::super::CpuKernel::Amx.runs_here());
        assert_eq!(
            super::super::CpuKernel::active() == super::super::CpuKernel::Amx,
            PairKernel::active() == PairKernel::Amx
        );
        if !amx {
            // No tiles here (or a kernel too old to grant them): the other kernels are tested above.
            // Linux 5.16+ grants the tiles to whoever asks; a CPU that lists them and is
            // refused means the request is wrong.
            assert!(!cpu_has, "/proc/cpuinfo lists amx_bf16 but the tiles were not granted");
            return;
        }
        for (k, n) in [(37, 1003), (64, 1024), (16, 32), (5, 33), (3, 31), (40, 3584)] {
            let w = bf16_values(k * n, 11, 0.4);
            let rows: Vec<Vec<f32>> = (0..MAX_ROWS)
                .map(|r| (0..n).map(|i| ((i * 7 + 13 * r) as f32 * 0.031).sin() * 1.7).collect())
                .collect();
            let xs: Vec<&[f32]> = rows.iter().map(|v| v.as_slice()).collect();
            let x = PairRows::new(PairKernel::Amx, &xs, n);
            let mut out = vec![0f32; k * MAX_ROWS];
            pairs_rows(&w, &x, &mut out);
            for (r, row) in rows.iter().enumerate() {
                let xr: Vec<f64> = row.iter().map(|&v| half::bf16::from_f32(v).to_f32() as f64).collect();
                // Alone: the same bits as among eight rows.
                let single = PairRows::new(PairKernel::Amx, &xs[r..r + 1], n);
                let mut alone = vec![0f32; k];
                pairs_rows(&w, &single, &mut alone);
                for o in 0..k {
                    let wo = &w[o * n..(o + 1) * n];
                    let exact: f64 = wo.iter().zip(&xr).map(|(&a, b)| bf16_to_f32(a) as f64 * b).sum();
                    let mag: f64 = wo.iter().zip(&xr).map(|(&a, b)| (bf16_to_f32(a) as f64 * b).abs()).sum();
                    let got = out[o * MAX_ROWS + r];
                    assert!((got as f64 - exact).abs() <= 1e-5 * mag, "k {k} n {n} o {o} r {r}: {got} against {exact}");
                    assert_eq!(alone[o].to_bits(), got.to_bits(), "k {k} n {n} o {o} r {r}: alone and among eight");
                }
            }
            // The weight rows moved by three (another tile split, a padded last tile): the
            // same bits for the same rows.
            if k > 3 {
                let mut moved = vec![0f32; (k - 3) * MAX_ROWS];
                pairs_rows(&w[3 * n..], &x, &mut moved);
                assert_eq!(
                    moved.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    out[3 * MAX_ROWS..].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "k {k} n {n}: rows 3.. on their own"
                );
            }
        }
    }

    /// The AMX prefill GEMM gives every output the bits the AMX GEMV gives it alone, whatever
    /// the token count (partial passes of 32), the output count (partial panels), the width
    /// (tails past the last whole 32 inputs) and the threads: a prompt's rows are the decode
    /// step's bits.
    #[test]
    fn amx_gemm_rows_have_the_gemv_bits() {
        use super::super::amx;
        if !amx::available() {
            // The kernel cannot run on this CPU (the test above checks a CPU listing amx_bf16 is
            // granted the tiles). Say so rather than pass quietly.
            eprintln!("no AMX tiles on this CPU: the AMX prefill GEMM is not exercised here");
            return;
        }
        for (rows, k, n) in [(33, 40, 64), (9, 17, 1003), (64, 96, 1024), (40, 33, 31), (100, 70, 3584)] {
            let w = bf16_values(k * n, 5 + rows, 0.4);
            let x: Vec<f32> = (0..rows * n).map(|i| ((i * 7 + 3) as f32 * 0.017).sin() * 1.3).collect();
            let tokens = amx::Tokens::new(&x, rows, n);
            let mut y = vec![f32::NAN; rows * k];
            amx::gemm(&tokens, k, |o| &w[o * n..(o + 1) * n], &mut y);
            for r in 0..rows {
                let xs = [&x[r * n..(r + 1) * n]];
                let single = PairRows::new(PairKernel::Amx, &xs, n);
                let mut alone = vec![0f32; k];
                pairs_rows(&w, &single, &mut alone);
                for o in 0..k {
                    assert_eq!(
                        y[r * k + o].to_bits(),
                        alone[o].to_bits(),
                        "rows {rows} k {k} n {n}: token {r} feature {o}: {} against the GEMV's {}",
                        y[r * k + o],
                        alone[o]
                    );
                }
            }
        }
    }

    /// The pair order is a real dot product: within float error of the exact sum.
    #[test]
    fn the_pair_reference_is_a_dot_product() {
        for n in [5, 70, 1027] {
            let (w, x) = (bf16_values(n, 1, 0.7), bf16_values(n, 5, 1.3));
            let exact: f64 = w.iter().zip(&x).map(|(&a, &b)| bf16_to_f32(a) as f64 * bf16_to_f32(b) as f64).sum();
            let mag: f64 = w.iter().zip(&x).map(|(&a, &b)| (bf16_to_f32(a) as f64 * bf16_to_f32(b) as f64).abs()).sum();
            let got = portable_pairs(&w, &x) as f64;
            assert!((got - exact).abs() <= 1e-6 * mag, "n {n}: {got} against {exact}");
        }
    }
}
