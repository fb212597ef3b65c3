//! Multi-row dot-product kernels for the decode GEMV and the MTP verify pass: weight rows
//! against up to [`MAX_ROWS`] activation rows, each weight read (and, for bf16, widened) once
//! for all of them.
//!
//! Every kernel computes, for each activation row, exactly the sum [`tensor::dot`] computes:
//! 16 lanes, lane `i` adding `w[i] · x[i]`, `w[i + 16] · x[i + 16]`, … in order (a multiply then
//! an add, never fused), the lanes folded pairwise (8, 4, 2, 1), then the scalar tail added. So
//! a verify pass over K + 1 tokens gives each token the bits a one-token step gives it, bf16
//! weights give the bits of the same weights stored as f32, and the AVX-512, AVX2 and portable
//! kernels agree bit for bit (tested below).
//!
//! [`tensor::dot`]: super::tensor::dot

use super::storage::bf16_to_f32;
use super::tensor::Simd;

/// Activation rows one call handles (a decode step is 1, an MTP verify pass K + 1 ≤ 5; prefill
/// above this goes to the GEMM).
pub const MAX_ROWS: usize = 8;

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
pub fn dot_rows(simd: Simd, w: WeightRow<'_>, xs: &[&[f32]], out: &mut [f32]) {
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
    if rows <= group {
        // One group (every decode step and verify pass on AVX-512): straight into `out`.
        kernel(simd, w, n, k, xs, out);
        return;
    }
    let mut y = vec![0f32; k * group];
    for r0 in (0..rows).step_by(group) {
        let g = group.min(rows - r0);
        let y = &mut y[..k * g];
        kernel(simd, w, n, k, &xs[r0..r0 + g], y);
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
pub fn portable(w: WeightRow<'_>, x: &[f32]) -> f32 {
    match w {
        WeightRow::F32(w) => portable_widened(w, |v| v, x),
        WeightRow::Bf16(w) => portable_widened(w, bf16_to_f32, x),
    }
}

#[inline(always)]
fn portable_widened<W: Copy>(w: &[W], widen: impl Fn(W) -> f32, x: &[f32]) -> f32 {
    let n = w.len().min(x.len());
    let mut acc = [0f32; LANES];
    let chunks = n / LANES;
    for c in 0..chunks {
        for i in 0..LANES {
            acc[i] += widen(w[c * LANES + i]) * x[c * LANES + i];
        }
    }
    let mut s = 0f32;
    for i in chunks * LANES..n {
        s += widen(w[i]) * x[i];
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0] + s
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

    use super::{LANES, MAX_ROWS, WeightRow, tail};

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

    /// Eight weights at `p[i..i + 8]` as f32 (bf16 widened by a 16-bit shift, exact).
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
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn rows_avx512(w: WeightRow<'_>, n: usize, k: usize, xs: &[&[f32]], out: &mut [f32]) {
        if parts(w).1 {
            by_rows!(block512, true, w, n, k, xs, out, [1, 2, 3, 4, 5, 6, 7, 8])
        } else {
            by_rows!(block512, false, w, n, k, xs, out, [1, 2, 3, 4, 5, 6, 7, 8])
        }
    }

    /// AVX2: two ymm accumulators (lanes 0–7, 8–15) per activation row, 4 rows at most.
    #[target_feature(enable = "avx2")]
    pub unsafe fn rows_avx2(w: WeightRow<'_>, n: usize, k: usize, xs: &[&[f32]], out: &mut [f32]) {
        if parts(w).1 {
            by_rows!(block256, true, w, n, k, xs, out, [1, 2, 3, 4])
        } else {
            by_rows!(block256, false, w, n, k, xs, out, [1, 2, 3, 4])
        }
    }

    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn block512<const BF16: bool, const R: usize>(w: *const u8, x: [*const f32; R], n: usize, out: &mut [f32]) {
        let chunks = n / LANES;
        let mut acc = [_mm512_setzero_ps(); R];
        for c in 0..chunks {
            let i = c * LANES;
            // SAFETY: i + 16 <= n, and every row holds n values.
            unsafe {
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

    #[target_feature(enable = "avx2")]
    unsafe fn block256<const BF16: bool, const R: usize>(w: *const u8, x: [*const f32; R], n: usize, out: &mut [f32]) {
        let chunks = n / LANES;
        let mut lo = [_mm256_setzero_ps(); R];
        let mut hi = [_mm256_setzero_ps(); R];
        for c in 0..chunks {
            let i = c * LANES;
            // SAFETY: i + 16 <= n, and every row holds n values.
            unsafe {
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

    /// The weight row and activation row back as slices, for the scalar tail.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn kernels() -> Vec<Simd> {
        let mut k = vec![Simd::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                k.push(Simd::Avx2);
            }
            if Simd::detect() == Simd::Avx512 {
                k.push(Simd::Avx512);
            }
        }
        k
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

    /// The reference is a real dot product (not just self-consistent).
    #[test]
    fn the_reference_is_a_dot_product() {
        let w: Vec<f32> = (0..37).map(|i| i as f32 * 0.25).collect();
        let x: Vec<f32> = (0..37).map(|i| 1.0 - i as f32 * 0.125).collect();
        let exact: f64 = w.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
        assert!((portable(WeightRow::F32(&w), &x) as f64 - exact).abs() < 1e-3);
    }
}
