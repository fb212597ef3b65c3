//! The decode GEMV over GGUF quantised weights (`model::quant`): `y[r] = Σ_c W[r, c] · x[c]`,
//! each weight dequantised in registers exactly as `gguf::dequantize` computes it (the same f32
//! operations in the same order, no fused multiply-add), then summed in the f32 GEMV's order
//! (`gemv.rs`): 16 lanes, lane `i` adding `w[i] · x[i]`, `w[i + 16] · x[i + 16]`, … (a multiply
//! then an add), the lanes folded pairwise (8, 4, 2, 1), then the empty tail (0) added. So a
//! quantised row gives the bits of the f32 row holding its dequantised values, on every kernel
//! family: the portable kernel dequantises a few blocks into a scratch and sums them in that
//! order; the AVX2 kernel (which the AVX-512 families run too) decodes 32 values at a time into
//! four ymm registers (lanes 0–7 and 8–15 of two 16-value chunks) and keeps the same lanes.
//!
//! AVX2 kernels: Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4; any other type deltascope
//! dequantises (F32, F16, BF16 stored as GGUF) takes the portable kernel, with the same bits.

use std::ops::Range;

use super::gemv::MAX_ROWS;
use super::simd::Simd;
use crate::model::gguf::{GgmlType, dequantize};

const LANES: usize = 16;

/// Values the portable kernel dequantises at a time (whole blocks of every type: 32 and 256
/// divide it): 4 KiB of scratch, in L1.
const PORTABLE_CHUNK: usize = 1024;

/// Weight rows as stored: `q` holds whole rows of ggml blocks of type `ty`.
#[derive(Clone, Copy)]
pub(crate) struct QuantRows<'a> {
    pub(crate) ty: GgmlType,
    pub(crate) q: &'a [u8],
}

/// `w` holds `k` rows of `n` quantised weights: `out[o · R + r] = w[o] · xs[r]` for every
/// weight row `o` and activation row `r` (R = `xs.len()` ≤ [`MAX_ROWS`]); each `xs[r]` holds
/// at least `n` values.
pub(crate) fn quant_rows(simd: Simd, w: QuantRows<'_>, n: usize, xs: &[&[f32]], out: &mut [f32]) {
    let (per, rows) = (w.ty.block_values(), xs.len());
    let row_bytes = w.ty.row_bytes(n as u64).unwrap_or(0) as usize;
    let k = w.q.len().checked_div(row_bytes).unwrap_or(0);
    assert!(
        w.ty.is_supported()
            && n.is_multiple_of(per)
            && k * row_bytes == w.q.len()
            && out.len() == k * rows
            && rows <= MAX_ROWS
            && xs.iter().all(|x| x.len() >= n),
        "quant_rows: {} bytes of {} as rows of {n}, {} outputs for {rows} activation rows",
        w.q.len(),
        w.ty,
        out.len()
    );
    if k == 0 || rows == 0 || n == 0 {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Portable && x86::has_kernel(w.ty) {
        let xs: Vec<&[f32]> = xs.iter().map(|x| &x[..n]).collect();
        // AVX2 (16 registers): four activation rows a call, two accumulators each.
        in_groups(k, rows, 4, out, |r, y| {
            // SAFETY: `has_kernel` checked AVX2; the lengths were asserted above.
            unsafe { x86::rows(w, n, k, row_bytes, &xs[r], y) }
        });
        return;
    }
    let _ = simd;
    portable(w, k, row_bytes, xs, out);
}

/// Dequantises `q` (whole blocks of `ty`) into `out` (one value per quantised value): the
/// bits of `gguf::dequantize`, by the AVX2 decoders where they run.
pub(crate) fn dequantize_blocks(simd: Simd, ty: GgmlType, q: &[u8], out: &mut [f32]) {
    let blocks = q.len() / ty.block_bytes();
    assert!(
        blocks * ty.block_bytes() == q.len() && out.len() == blocks * ty.block_values(),
        "dequantize_blocks: {} bytes of {ty} into {} values",
        q.len(),
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Portable && x86::has_kernel(ty) {
        // SAFETY: `has_kernel` checked AVX2; the lengths were asserted above.
        unsafe { x86::store(ty, q, out) };
        return;
    }
    let _ = simd;
    let mut wide = Vec::with_capacity(out.len());
    reference(ty, q, &mut wide);
    out.copy_from_slice(&wide);
}

/// `gguf::dequantize`, for a type `QuantWeights::new` (or the assertion above) checked.
fn reference(ty: GgmlType, q: &[u8], out: &mut Vec<f32>) {
    if let Err(e) = dequantize(ty, q, out) {
        panic!("quantised rows of a type checked when the matrix was made: {e}");
    }
}

/// Runs `kernel` over the activation rows in groups of at most `group`, each writing its
/// `[k, group rows]` block, and scatters the blocks into `out` (`[k, rows]`), as the f32 GEMV
/// does.
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

/// The reference order: each row dequantised [`PORTABLE_CHUNK`] values at a time by
/// `gguf::dequantize`, every activation row summed over them in 16 lanes.
fn portable(w: QuantRows<'_>, k: usize, row_bytes: usize, xs: &[&[f32]], out: &mut [f32]) {
    let (per, bb, rows) = (w.ty.block_values(), w.ty.block_bytes(), xs.len());
    let chunk_blocks = (PORTABLE_CHUNK / per).max(1);
    let mut wide = Vec::with_capacity(chunk_blocks * per);
    let mut acc = [[0f32; LANES]; MAX_ROWS];
    for o in 0..k {
        let row = &w.q[o * row_bytes..(o + 1) * row_bytes];
        acc[..rows].iter_mut().for_each(|a| *a = [0.0; LANES]);
        for (c, blocks) in row.chunks(chunk_blocks * bb).enumerate() {
            wide.clear();
            reference(w.ty, blocks, &mut wide);
            let c0 = c * chunk_blocks * per;
            for (a, x) in acc.iter_mut().zip(xs) {
                lanes(a, &wide, &x[c0..c0 + wide.len()]);
            }
        }
        for (r, a) in acc[..rows].iter().enumerate() {
            out[o * rows + r] = fold_lanes(*a);
        }
    }
}

/// `acc[i] += w[j] · x[j]` for `j ≡ i (mod 16)`, chunk after chunk (`w.len()` a multiple of 16).
#[inline(always)]
fn lanes(acc: &mut [f32; LANES], w: &[f32], x: &[f32]) {
    for (wc, xc) in w.chunks_exact(LANES).zip(x.chunks_exact(LANES)) {
        for i in 0..LANES {
            acc[i] += wc[i] * xc[i];
        }
    }
}

/// The lanes folded pairwise (8, 4, 2, 1), then the tail added: a row of whole blocks has
/// none, but the f32 GEMV adds its empty tail (0), which turns a -0 sum into +0.
#[inline(always)]
fn fold_lanes(mut acc: [f32; LANES]) -> f32 {
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    acc[0] + 0.0
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::GgmlType;

    /// IQ4_NL's and IQ4_XS's 16 non-linear levels (ggml's `kvalues_iq4nl`).
    const IQ4_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];
    /// MXFP4's e2m1 values, doubled (the scale is halved to match, as dequant.rs does).
    const E2M1_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

    /// How far ahead the weights are prefetched: 1 KB, what the f32 GEMV measured best on
    /// the 2-core EPYC (`gemv::x86::prefetch_bytes`).
    const PREFETCH: usize = 1024;

    /// Whether `ty` has an AVX2 kernel and this CPU runs it.
    pub(super) fn has_kernel(ty: GgmlType) -> bool {
        static AVX2: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let kernel = matches!(
            ty,
            GgmlType::Q8_0
                | GgmlType::Q4_0
                | GgmlType::Q4K
                | GgmlType::Q5K
                | GgmlType::Q6K
                | GgmlType::Iq4Xs
                | GgmlType::Mxfp4
        );
        kernel && *AVX2.get_or_init(|| std::is_x86_feature_detected!("avx2"))
    }

    /// The f16 at byte `at` of a block, as f32 (exact, as dequant.rs widens it).
    ///
    /// # Safety
    ///
    /// `b + at + 2` is within the block.
    #[inline(always)]
    unsafe fn f16_at(b: *const u8, at: usize) -> f32 {
        // SAFETY: the caller keeps the two bytes within the block.
        let bits = unsafe { u16::from_le_bytes([*b.add(at), *b.add(at + 1)]) };
        f16::from_bits(bits).to_f32()
    }

    /// 32 small signed bytes (in value order) as four vectors of 8 f32 (exact).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn widen32(v: __m256i) -> [__m256; 4] {
        let (lo, hi) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        let cvt = |h: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h));
        [cvt(lo), cvt(_mm_srli_si128(lo, 8)), cvt(hi), cvt(_mm_srli_si128(hi, 8))]
    }

    /// Each value times `d` (one rounding, as the reference multiplies).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn scaled(q: [__m256; 4], d: f32) -> [__m256; 4] {
        let d = _mm256_set1_ps(d);
        q.map(|v| _mm256_mul_ps(d, v))
    }

    /// 32 bytes from `p`.
    ///
    /// # Safety
    ///
    /// AVX2; `p..p + 32` is readable.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load32(p: *const u8) -> __m256i {
        // SAFETY: the caller keeps the 32 bytes readable.
        unsafe { _mm256_loadu_si256(p.cast()) }
    }

    /// 16 bytes from `p`.
    ///
    /// # Safety
    ///
    /// AVX2; `p..p + 16` is readable.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load16(p: *const u8) -> __m128i {
        // SAFETY: the caller keeps the 16 bytes readable.
        unsafe { _mm_loadu_si128(p.cast()) }
    }

    /// Each byte's low nibble, and each byte's high nibble.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn nibbles16(v: __m128i) -> (__m128i, __m128i) {
        let m = _mm_set1_epi8(0x0F);
        (_mm_and_si128(v, m), _mm_and_si128(_mm_srli_epi16(v, 4), m))
    }

    /// 16 nibble bytes looked up in a table of 16 levels: values 0..16 from the low nibbles,
    /// 16..32 from the high ones (the layout of Q4_0, IQ4_XS and MXFP4).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn lookup32(q: __m128i, table: &[i8; 16]) -> __m256i {
        // SAFETY: the table holds 16 bytes.
        let t = unsafe { _mm_loadu_si128(table.as_ptr().cast()) };
        let (lo, hi) = nibbles16(q);
        _mm256_set_m128i(_mm_shuffle_epi8(t, hi), _mm_shuffle_epi8(t, lo))
    }

    /// A block's f32 multipliers, computed once a block by the reference's scalar operations:
    /// `d[j]` scales group `j` (Q4_K / Q5_K / IQ4_XS: sub-block `j`; Q6_K: the 16 values of
    /// scale `j`; one-group types: `d[0]`), `m[j]` is Q4_K / Q5_K's min of sub-block `j`.
    struct Scales {
        d: [f32; 16],
        m: [f32; 8],
    }

    impl Scales {
        fn one(d: f32) -> Scales {
            let mut s = Scales { d: [0.0; 16], m: [0.0; 8] };
            s.d[0] = d;
            s
        }
    }

    /// Q8_0 and Q4_0: the f16 scale at the block's start.
    ///
    /// # Safety
    ///
    /// `b` points at a whole block.
    unsafe fn prep_f16(b: *const u8) -> Scales {
        // SAFETY: the scale is the block's first two bytes.
        Scales::one(unsafe { f16_at(b, 0) })
    }

    /// Q4_K / Q5_K: `d1 = d · sc`, `m1 = dmin · m` per sub-block (dequant.rs's
    /// `scales_and_mins`, entry by entry).
    ///
    /// # Safety
    ///
    /// `b` points at a whole Q4_K or Q5_K block (16 bytes of scales at least).
    unsafe fn prep_k(b: *const u8) -> Scales {
        let mut s = Scales { d: [0.0; 16], m: [0.0; 8] };
        // SAFETY: d, dmin and the 12 packed bytes are bytes 0..16 of the block.
        let (d, dmin, p) = unsafe { (f16_at(b, 0), f16_at(b, 2), std::slice::from_raw_parts(b.add(4), 12)) };
        for j in 0..4 {
            let (sc_hi, m_hi) = ((p[j + 8] & 0x0F) | ((p[j] >> 2) & 0x30), (p[j + 8] >> 4) | ((p[j + 4] >> 2) & 0x30));
            s.d[j] = d * f32::from(p[j] & 0x3F);
            s.m[j] = dmin * f32::from(p[j + 4] & 0x3F);
            s.d[j + 4] = d * f32::from(sc_hi);
            s.m[j + 4] = dmin * f32::from(m_hi);
        }
        s
    }

    /// Q6_K: `d · sc` for each of the sixteen signed scales.
    ///
    /// # Safety
    ///
    /// `b` points at a whole Q6_K block.
    unsafe fn prep_q6_k(b: *const u8) -> Scales {
        // SAFETY: the scales are bytes 192..208, d 208..210.
        let (sc, d) = unsafe { (std::slice::from_raw_parts(b.add(192), 16), f16_at(b, 208)) };
        Scales { d: std::array::from_fn(|j| d * f32::from(sc[j] as i8)), m: [0.0; 8] }
    }

    /// IQ4_XS: `dl = d · (scale - 32)` per sub-block, the 6-bit scale from `scales_l` (4 low
    /// bits) and `scales_h` (2 high).
    ///
    /// # Safety
    ///
    /// `b` points at a whole IQ4_XS block.
    unsafe fn prep_iq4_xs(b: *const u8) -> Scales {
        // SAFETY: d is bytes 0..2, scales_h 2..4, scales_l 4..8.
        let (d, scales_h, scales_l) = unsafe {
            (f16_at(b, 0), u16::from_le_bytes([*b.add(2), *b.add(3)]), std::slice::from_raw_parts(b.add(4), 4))
        };
        let mut s = Scales { d: [0.0; 16], m: [0.0; 8] };
        for ib in 0..8 {
            let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
            let high = ((scales_h >> (2 * ib)) & 0x03) as u8;
            s.d[ib] = d * f32::from((low | (high << 4)) as i8 - 32);
        }
        s
    }

    /// MXFP4: half the e8m0 scale (the e2m1 values are doubled to match, as dequant.rs does).
    ///
    /// # Safety
    ///
    /// `b` points at a whole block.
    unsafe fn prep_mxfp4(b: *const u8) -> Scales {
        // SAFETY: the exponent is the block's first byte.
        let e = u32::from(unsafe { *b });
        Scales::one(f32::from_bits(if e < 2 { 0x0020_0000 << e } else { (e - 1) << 23 }))
    }

    // One 32-value group of a block, as four vectors of 8 dequantised weights in value order.
    // Each is the reference's expression for those values (dequant.rs), operation for operation.

    /// Q8_0 (one group): `q · d`.
    ///
    /// # Safety
    ///
    /// AVX2; `b` points at a whole block.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q8_0(b: *const u8, _g: usize, s: &Scales) -> [__m256; 4] {
        // SAFETY: a block is 2 + 32 bytes.
        scaled(widen32(unsafe { load32(b.add(2)) }), s.d[0])
    }

    /// Q4_0 (one group): `d · (nibble - 8)`.
    ///
    /// # Safety
    ///
    /// AVX2; `b` points at a whole block.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q4_0(b: *const u8, _g: usize, s: &Scales) -> [__m256; 4] {
        // SAFETY: a block is 2 + 16 bytes.
        let (lo, hi) = nibbles16(unsafe { load16(b.add(2)) });
        let eight = _mm_set1_epi8(8);
        let v = _mm256_set_m128i(_mm_sub_epi8(hi, eight), _mm_sub_epi8(lo, eight));
        scaled(widen32(v), s.d[0])
    }

    /// `d1 · q - m1` (Q4_K / Q5_K's sub-block `g`).
    #[inline]
    #[target_feature(enable = "avx2")]
    fn k_affine(g: usize, s: &Scales, q: __m256i) -> [__m256; 4] {
        let (d1, m1) = (_mm256_set1_ps(s.d[g]), _mm256_set1_ps(s.m[g]));
        widen32(q).map(|v| _mm256_sub_ps(_mm256_mul_ps(d1, v), m1))
    }

    /// Sub-block `g`'s 32 nibbles of a Q4_K / Q5_K block (`qs` its 128 bytes): the low nibbles
    /// of chunk `g / 2` for even `g`, the high ones for odd.
    ///
    /// # Safety
    ///
    /// AVX2; `qs` points at 128 bytes; `g < 8`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn k_nibbles(qs: *const u8, g: usize) -> __m256i {
        // SAFETY: chunk g / 2 is bytes 32 · (g / 2) .. + 32 of the 128.
        let v = unsafe { load32(qs.add(g / 2 * 32)) };
        let v = if g % 2 == 1 { _mm256_srli_epi16(v, 4) } else { v };
        _mm256_and_si256(v, _mm256_set1_epi8(0x0F))
    }

    /// Q4_K, sub-block `g`.
    ///
    /// # Safety
    ///
    /// AVX2; `b` points at a whole block; `g < 8`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q4_k(b: *const u8, g: usize, s: &Scales) -> [__m256; 4] {
        // SAFETY: the nibbles are bytes 16..144 of the block.
        k_affine(g, s, unsafe { k_nibbles(b.add(16), g) })
    }

    /// Q5_K, sub-block `g`: the nibble, with bit `g` of each high-bit byte as its fifth bit.
    ///
    /// # Safety
    ///
    /// AVX2; `b` points at a whole block; `g < 8`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q5_k(b: *const u8, g: usize, s: &Scales) -> [__m256; 4] {
        // SAFETY: the high bits are bytes 16..48, the nibbles 48..176.
        let (qh, low) = unsafe { (load32(b.add(16)), k_nibbles(b.add(48), g)) };
        let bit = _mm256_set1_epi8((1u8 << g) as i8);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
        k_affine(g, s, _mm256_or_si256(low, _mm256_and_si256(set, _mm256_set1_epi8(16))))
    }

    /// `v` (16-bit lanes) shifted right by `bits` (0, 2, 4 or 6), masked to `mask` a byte.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn shifted(v: __m256i, bits: usize, mask: u8) -> __m256i {
        let v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(bits as i32));
        _mm256_and_si256(v, _mm256_set1_epi8(mask as i8))
    }

    /// Q6_K, values `32 g .. 32 g + 32`: `(d · sc) · (q - 32)`, two scales (16 values each).
    ///
    /// # Safety
    ///
    /// AVX2; `b` points at a whole block; `g < 8`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn q6_k(b: *const u8, g: usize, s: &Scales) -> [__m256; 4] {
        let v0 = 32 * g;
        let (h, w0) = (v0 / 128, v0 % 128);
        // SAFETY: ql is bytes 0..128 (this reads h · 64 + w0 % 64 .. + 32 ≤ 128), qh 128..192
        // (h · 32 .. + 32 of them).
        let (ql, qh) = unsafe { (load32(b.add(h * 64 + w0 % 64)), load32(b.add(128 + h * 32))) };
        let low = shifted(ql, 4 * (w0 / 64), 0x0F);
        let high = _mm256_slli_epi16(shifted(qh, 2 * (w0 / 32), 0x03), 4);
        let q = _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
        let [a, b2, c, e] = widen32(q);
        let (d0, d1) = (_mm256_set1_ps(s.d[v0 / 16]), _mm256_set1_ps(s.d[v0 / 16 + 1]));
        [_mm256_mul_ps(d0, a), _mm256_mul_ps(d0, b2), _mm256_mul_ps(d1, c), _mm256_mul_ps(d1, e)]
    }

    /// IQ4_XS, sub-block `g`: `dl · level`.
    ///
    /// # Safety
    ///
    /// AVX2; `b` points at a whole block; `g < 8`.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn iq4_xs(b: *const u8, g: usize, s: &Scales) -> [__m256; 4] {
        // SAFETY: the nibbles are bytes 8..136.
        let q = unsafe { load16(b.add(8 + g * 16)) };
        scaled(widen32(lookup32(q, &IQ4_LEVELS)), s.d[g])
    }

    /// MXFP4 (one group): half the e8m0 scale times the doubled e2m1 value.
    ///
    /// # Safety
    ///
    /// AVX2; `b` points at a whole block.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn mxfp4(b: *const u8, _g: usize, s: &Scales) -> [__m256; 4] {
        // SAFETY: a block is 1 + 16 bytes.
        let q = unsafe { load16(b.add(1)) };
        scaled(widen32(lookup32(q, &E2M1_DOUBLED)), s.d[0])
    }

    /// Folds 16 lanes (`lo` 0–7, `hi` 8–15) as the reference does: `+ 8`, `+ 4`, `+ 2`, `+ 1`.
    #[inline]
    #[target_feature(enable = "avx2")]
    fn fold(lo: __m256, hi: __m256) -> f32 {
        let v = _mm256_add_ps(lo, hi);
        let q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let d = _mm_add_ps(q, _mm_movehl_ps(q, q));
        _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1))) + 0.0
    }

    /// One weight row (`blocks` blocks of `$bv` values, `$bb` bytes) against `R` activation
    /// rows, each 32-value group decoded once by `$group` and added into every row's lanes.
    macro_rules! row_kernel {
        ($name:ident, $prep:ident, $group:ident, $bv:expr, $bb:expr) => {
            /// # Safety
            ///
            /// AVX2; `w` points at `blocks` whole blocks, every `x[r]` at `blocks · values a
            /// block` activations.
            #[target_feature(enable = "avx2")]
            unsafe fn $name<const R: usize>(w: *const u8, blocks: usize, x: [*const f32; R]) -> [f32; R] {
                let mut lo = [_mm256_setzero_ps(); R];
                let mut hi = [_mm256_setzero_ps(); R];
                for blk in 0..blocks {
                    let b = w.wrapping_add(blk * $bb);
                    for line in (0..$bb).step_by(64) {
                        // A hint: it never faults, so a line past the weights is harmless.
                        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PREFETCH + line).cast());
                    }
                    // SAFETY: block `blk` is within the row.
                    let s = unsafe { $prep(b) };
                    for g in 0..$bv / 32 {
                        // SAFETY: block `blk` is within the row; group g < values / 32.
                        let v = unsafe { $group(b, g, &s) };
                        let i = blk * $bv + g * 32;
                        for r in 0..R {
                            // SAFETY: i + 32 ≤ blocks · values a block, within every x row.
                            let p = unsafe { x[r].add(i) };
                            // SAFETY: as above.
                            let xv = unsafe {
                                [
                                    _mm256_loadu_ps(p),
                                    _mm256_loadu_ps(p.add(8)),
                                    _mm256_loadu_ps(p.add(16)),
                                    _mm256_loadu_ps(p.add(24)),
                                ]
                            };
                            lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(v[0], xv[0]));
                            hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(v[1], xv[1]));
                            lo[r] = _mm256_add_ps(lo[r], _mm256_mul_ps(v[2], xv[2]));
                            hi[r] = _mm256_add_ps(hi[r], _mm256_mul_ps(v[3], xv[3]));
                        }
                    }
                }
                std::array::from_fn(|r| fold(lo[r], hi[r]))
            }
        };
    }

    row_kernel!(row_q8_0, prep_f16, q8_0, 32, 34);
    row_kernel!(row_q4_0, prep_f16, q4_0, 32, 18);
    row_kernel!(row_q4_k, prep_k, q4_k, 256, 144);
    row_kernel!(row_q5_k, prep_k, q5_k, 256, 176);
    row_kernel!(row_q6_k, prep_q6_k, q6_k, 256, 210);
    row_kernel!(row_iq4_xs, prep_iq4_xs, iq4_xs, 256, 136);
    row_kernel!(row_mxfp4, prep_mxfp4, mxfp4, 32, 17);

    /// Every row of `w` against `R` activation rows, through the row kernel of `w`'s type.
    ///
    /// # Safety
    ///
    /// AVX2; `w.q` holds `k` rows of `row_bytes`, each of `n` values; every `x[r]` holds `n`.
    #[target_feature(enable = "avx2")]
    unsafe fn all_rows<const R: usize>(
        w: super::QuantRows<'_>,
        n: usize,
        k: usize,
        row_bytes: usize,
        x: [*const f32; R],
        out: &mut [f32],
    ) {
        let blocks = n / w.ty.block_values();
        for o in 0..k {
            let p = w.q[o * row_bytes..].as_ptr();
            // SAFETY: row o holds `blocks` whole blocks of its type; the x rows hold n values.
            let y: [f32; R] = unsafe {
                match w.ty {
                    GgmlType::Q8_0 => row_q8_0(p, blocks, x),
                    GgmlType::Q4_0 => row_q4_0(p, blocks, x),
                    GgmlType::Q4K => row_q4_k(p, blocks, x),
                    GgmlType::Q5K => row_q5_k(p, blocks, x),
                    GgmlType::Q6K => row_q6_k(p, blocks, x),
                    GgmlType::Iq4Xs => row_iq4_xs(p, blocks, x),
                    GgmlType::Mxfp4 => row_mxfp4(p, blocks, x),
                    other => unreachable!("{other} has no AVX2 kernel (checked by has_kernel)"),
                }
            };
            out[o * R..(o + 1) * R].copy_from_slice(&y);
        }
    }

    /// [`all_rows`] for 1 to 4 activation rows, written `[k, xs.len()]`.
    ///
    /// # Safety
    ///
    /// AVX2; the lengths `quant_rows` asserted; `xs.len()` is 1 to 4.
    pub(super) unsafe fn rows(
        w: super::QuantRows<'_>,
        n: usize,
        k: usize,
        row_bytes: usize,
        xs: &[&[f32]],
        out: &mut [f32],
    ) {
        macro_rules! by_rows {
            ($($r:literal),*) => {
                match xs.len() {
                    $($r => {
                        let x: [*const f32; $r] = std::array::from_fn(|r| xs[r].as_ptr());
                        // SAFETY: the caller's lengths and AVX2.
                        unsafe { all_rows::<$r>(w, n, k, row_bytes, x, out) }
                    })*
                    other => unreachable!("AVX2 row groups are 1 to 4, not {other}"),
                }
            };
        }
        by_rows!(1, 2, 3, 4)
    }

    /// Writes every 32-value group of `blocks` blocks of `$bv` values by `$group`.
    macro_rules! store_kernel {
        ($name:ident, $prep:ident, $group:ident, $bv:expr, $bb:expr) => {
            /// # Safety
            ///
            /// AVX2; `q` holds whole blocks; `out` one value per quantised value.
            #[target_feature(enable = "avx2")]
            unsafe fn $name(q: &[u8], out: &mut [f32]) {
                for (b, o) in q.chunks_exact($bb).zip(out.chunks_exact_mut($bv)) {
                    // SAFETY: `b` is a whole block.
                    let s = unsafe { $prep(b.as_ptr()) };
                    for (g, o) in o.chunks_exact_mut(32).enumerate() {
                        // SAFETY: `b` is a whole block, g < values / 32, `o` holds 32 values.
                        unsafe {
                            let v = $group(b.as_ptr(), g, &s);
                            for (j, v) in v.iter().enumerate() {
                                _mm256_storeu_ps(o.as_mut_ptr().add(8 * j), *v);
                            }
                        }
                    }
                }
            }
        };
    }

    store_kernel!(store_q8_0, prep_f16, q8_0, 32, 34);
    store_kernel!(store_q4_0, prep_f16, q4_0, 32, 18);
    store_kernel!(store_q4_k, prep_k, q4_k, 256, 144);
    store_kernel!(store_q5_k, prep_k, q5_k, 256, 176);
    store_kernel!(store_q6_k, prep_q6_k, q6_k, 256, 210);
    store_kernel!(store_iq4_xs, prep_iq4_xs, iq4_xs, 256, 136);
    store_kernel!(store_mxfp4, prep_mxfp4, mxfp4, 32, 17);

    /// Dequantises whole blocks of `ty` into `out`.
    ///
    /// # Safety
    ///
    /// AVX2; `out` holds one value per quantised value of `q`, whole blocks.
    pub(super) unsafe fn store(ty: GgmlType, q: &[u8], out: &mut [f32]) {
        // SAFETY: the caller's AVX2 and lengths.
        unsafe {
            match ty {
                GgmlType::Q8_0 => store_q8_0(q, out),
                GgmlType::Q4_0 => store_q4_0(q, out),
                GgmlType::Q4K => store_q4_k(q, out),
                GgmlType::Q5K => store_q5_k(q, out),
                GgmlType::Q6K => store_q6_k(q, out),
                GgmlType::Iq4Xs => store_iq4_xs(q, out),
                GgmlType::Mxfp4 => store_mxfp4(q, out),
                other => unreachable!("{other} has no AVX2 kernel (checked by has_kernel)"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cpu::gemv::{self, WeightRow};
    use crate::model::cpu::tensor::{Linear, Mat, Precision};
    use crate::model::quant::QuantWeights;
    use crate::model::quant::testing::{KERNEL_TYPES, Rng, matrix, reference};
    use crate::model::storage::Weights;

    /// Every f32 kernel level this CPU runs (each family's `Simd`, once).
    fn kernels() -> Vec<Simd> {
        super::super::CpuKernel::supported().iter().map(|f| f.simd()).fold(vec![], |mut v, s| {
            if !v.contains(&s) {
                v.push(s);
            }
            v
        })
    }

    fn activations(rows: usize, n: usize, seed: u64) -> Vec<Vec<f32>> {
        let mut rng = Rng(seed | 1);
        (0..rows).map(|_| (0..n).map(|_| rng.unit() * 2.0).collect()).collect()
    }

    /// The rounding bound of the 16-lane order against the exact sum: each lane adds `n / 16`
    /// products, then 4 folds and the tail, so a term goes through at most `n / 16 + 6`
    /// roundings (its product's included) of relative size 2^-24 each: |error| ≤ γ ·
    /// Σ|w · x| with γ = (n / 16 + 6) · 2^-24 / (1 - …), bounded here by twice that.
    fn gemv_bound(n: usize, abs_sum: f64) -> f64 {
        (n / 16 + 6) as f64 * 2f64.powi(-23) * abs_sum
    }

    /// The GEMM's bound (the `gemm` crate's own order, fused or not): at most `n` roundings a
    /// term, the brief's `cols · 2^-23 · Σ|w · x|`.
    fn gemm_bound(n: usize, abs_sum: f64) -> f64 {
        n as f64 * 2f64.powi(-23) * abs_sum
    }

    fn exact(w: &[f32], x: &[f32]) -> (f64, f64) {
        let terms = w.iter().zip(x).map(|(&a, &b)| f64::from(a) * f64::from(b));
        terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()))
    }

    /// Every type's kernel, on every family this CPU runs, for 1 to 8 activation rows: the
    /// bits of the f32 GEMV over the reference's dequantised row (so the same bits on every
    /// family), within [`gemv_bound`] of the exact sum.
    #[test]
    fn every_family_gives_the_bits_of_the_dequantised_f32_row() {
        let types = KERNEL_TYPES.iter().chain(&[GgmlType::F16, GgmlType::Bf16]);
        for (t, &ty) in types.enumerate() {
            for (k, n) in [(7, 256), (64, 512), (3, 1024)] {
                let w = matrix(ty, k, n, 11 + t as u64 * 31 + n as u64);
                let wide = reference(&w);
                let xs = activations(MAX_ROWS, n, 5 + k as u64);
                for rows in 1..=MAX_ROWS {
                    let xr: Vec<&[f32]> = xs[..rows].iter().map(|x| &x[..]).collect();
                    for simd in kernels() {
                        let mut y = vec![f32::NAN; k * rows];
                        quant_rows(simd, QuantRows { ty, q: w.data() }, n, &xr, &mut y);
                        for o in 0..k {
                            let row = &wide[o * n..(o + 1) * n];
                            let mut want = [0f32];
                            for (r, x) in xr.iter().enumerate() {
                                gemv::dot_rows(Simd::Portable, WeightRow::F32(row), &[x], &mut want);
                                let got = y[o * rows + r];
                                assert_eq!(
                                    got.to_bits(),
                                    want[0].to_bits(),
                                    "{ty} {simd:?} [{k}, {n}] rows {rows}: y[{o}][{r}]"
                                );
                                let (sum, abs) = exact(row, x);
                                assert!((f64::from(got) - sum).abs() <= gemv_bound(n, abs), "{ty}: {got} vs {sum}");
                            }
                        }
                    }
                }
            }
        }
    }

    /// The block decoders of every level give the reference's bits, block by block.
    #[test]
    fn every_level_dequantises_to_the_references_bits() {
        for (t, &ty) in KERNEL_TYPES.iter().enumerate() {
            let w = matrix(ty, 9, 1024, 101 + t as u64);
            let want: Vec<u32> = reference(&w).iter().map(|v| v.to_bits()).collect();
            for simd in kernels() {
                let mut got = vec![f32::NAN; want.len()];
                dequantize_blocks(simd, ty, w.data(), &mut got);
                assert!(got.iter().map(|v| v.to_bits()).eq(want.iter().copied()), "{ty} {simd:?}");
            }
        }
    }

    /// Zero weights against negative activations sum to -0 in every lane; the f32 GEMV's
    /// empty tail turns that into +0, and so must every quantised kernel.
    #[test]
    fn a_negative_zero_sum_comes_out_as_the_f32_gemvs() {
        let mut data = vec![0u8; 34];
        data[..2].copy_from_slice(&half::f16::from_f32(1.0).to_bits().to_le_bytes());
        let w = QuantWeights::new(GgmlType::Q8_0, data.into(), 1, 32).expect("one block");
        let x = vec![-1f32; 32];
        for simd in kernels() {
            let mut y = [f32::NAN];
            quant_rows(simd, QuantRows { ty: w.ty(), q: w.data() }, 32, &[&x], &mut y);
            assert_eq!(y[0].to_bits(), 0f32.to_bits(), "{simd:?}");
        }
    }

    fn linear(w: QuantWeights) -> Linear {
        let (k, n) = (w.rows(), w.cols());
        Linear::from_weights(Weights::Quant(w), k, n).expect("the shape")
    }

    /// Through `Linear`: the threaded GEMV (a layer big enough for several blocks) gives each
    /// row the kernel's bits, alone or in a verify pass of 5; the prefill GEMM (more rows than
    /// a GEMV takes, over the dequantised panels) is within [`gemm_bound`] of the exact sum, so
    /// within the sum of both bounds of the GEMV row by row.
    #[test]
    fn the_layers_gemv_and_prefill_gemm_agree_within_their_bounds() {
        for (t, &ty) in KERNEL_TYPES.iter().enumerate() {
            let (k, n) = (300, 512);
            let w = matrix(ty, k, n, 3 + t as u64);
            let wide = reference(&w);
            let xs = activations(20, n, 9);
            let kernel: Vec<Vec<f32>> = xs
                .iter()
                .map(|x| {
                    let mut y = vec![0f32; k];
                    quant_rows(Simd::Portable, QuantRows { ty, q: w.data() }, n, &[x], &mut y);
                    y
                })
                .collect();
            let lin = linear(w);
            assert_eq!(lin.weight_bytes(), k * n / ty.block_values() * ty.block_bytes());
            assert_eq!(lin.dtype_name(), QuantWeights::new(ty, vec![].into(), 0, n).expect("empty").dtype_name());
            let gemm = lin.forward(&Mat::from_vec(20, n, xs.concat()), Precision::F32).expect("forward");
            let verify = lin.forward(&Mat::from_vec(5, n, xs[..5].concat()), Precision::F32).expect("forward");
            for (r, x) in xs.iter().enumerate() {
                let one = lin.forward(&Mat::from_vec(1, n, x.clone()), Precision::F32).expect("forward");
                assert_eq!(one.row(0), &kernel[r][..], "{ty}: row {r} alone");
                if r < 5 {
                    assert_eq!(verify.row(r), &kernel[r][..], "{ty}: row {r} of a verify pass");
                }
                for o in 0..k {
                    let (sum, abs) = exact(&wide[o * n..(o + 1) * n], x);
                    let (g, p) = (f64::from(one.row(0)[o]), f64::from(gemm.row(r)[o]));
                    assert!((g - sum).abs() <= gemv_bound(n, abs), "{ty} GEMV y[{o}] {g} vs {sum}");
                    assert!((p - sum).abs() <= gemm_bound(n, abs), "{ty} GEMM y[{r}][{o}] {p} vs {sum}");
                    assert!((p - g).abs() <= gemv_bound(n, abs) + gemm_bound(n, abs), "{ty} y[{r}][{o}]");
                }
            }
        }
    }

    /// At bf16 precision the activations are rounded to bf16 and the dequantised weights kept
    /// exact: the output is the f32 kernel's over the rounded activations, rounded to bf16; a
    /// fused layer (a quantised part beside a bf16 one) gives its quantised rows those bits.
    #[test]
    fn at_bf16_the_activations_are_rounded_and_the_weights_kept() {
        let (k, n) = (40, 256);
        let w = matrix(GgmlType::Q4K, k, n, 77);
        let xs = activations(3, n, 21);
        let want: Vec<Vec<f32>> = xs
            .iter()
            .map(|x| {
                let xb: Vec<f32> = x.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
                let mut y = vec![0f32; k];
                quant_rows(Simd::Portable, QuantRows { ty: w.ty(), q: w.data() }, n, &[&xb], &mut y);
                y.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect()
            })
            .collect();
        let bf16_part = Weights::bf16(vec![half::bf16::from_f32(0.5).to_bits(); 3 * n]);
        let fused = Linear::fused(vec![(Weights::Quant(w), k), (bf16_part, 3)], n).expect("the shape");
        assert_eq!(fused.dtype_name(), "mixed");
        let y = fused.forward(&Mat::from_vec(3, n, xs.concat()), Precision::Bf16).expect("forward");
        for (r, want) in want.iter().enumerate() {
            assert_eq!(&y.row(r)[..k], &want[..], "row {r}");
        }
    }

    /// Not a test: decode GEMV time for a 2048 × 2048 Q4_K and Q8_0 matrix, portable against
    /// AVX2, one thread (the kernel) and all threads (`Linear`), with the weight bytes read a
    /// second. `cargo test --release -p deltascope-model quant_gemv_speed -- --ignored --nocapture`
    #[test]
    #[ignore = "a timing to read, not a check: run it with --ignored --nocapture"]
    fn quant_gemv_speed() {
        let n = 2048;
        let x = activations(1, n, 3).remove(0);
        for ty in [GgmlType::Q4K, GgmlType::Q8_0, GgmlType::Q6K, GgmlType::Q5K, GgmlType::Q4_0] {
            let w = matrix(ty, n, n, 9);
            let bytes = w.bytes() as f64;
            for simd in kernels() {
                let mut y = vec![0f32; n];
                let secs = time(|| quant_rows(simd, QuantRows { ty, q: w.data() }, n, &[&x], &mut y));
                println!(
                    "{ty} {n}x{n} {:>8} 1 thread: {:8.1} µs {:6.2} GB/s",
                    simd.name(),
                    secs * 1e6,
                    bytes / secs / 1e9
                );
            }
            let (lin, xm) = (linear(w), Mat::from_vec(1, n, x.clone()));
            let secs = time(|| drop(lin.forward(&xm, Precision::F32)));
            let threads = rayon::current_num_threads();
            println!(
                "{ty} {n}x{n} {:>8} {threads} threads (Linear): {:8.1} µs {:6.2} GB/s",
                Simd::detect().name(),
                secs * 1e6,
                bytes / secs / 1e9
            );
        }
        let f32w = Linear::new(vec![0.01; n * n], n, n).expect("shape");
        let bf16w = Linear::from_weights(Weights::bf16(vec![0x3c00; n * n]), n, n).expect("shape");
        let xm = Mat::from_vec(1, n, x);
        for (name, l) in [("f32", &f32w), ("bf16", &bf16w)] {
            let secs = time(|| drop(l.forward(&xm, Precision::F32)));
            println!(
                "{name} {n}x{n} (Linear, for scale): {:8.1} µs {:6.2} GB/s",
                secs * 1e6,
                l.weight_bytes() as f64 / secs / 1e9
            );
        }
    }

    /// The median of 31 runs after 5 warm-ups, in seconds.
    fn time(mut f: impl FnMut()) -> f64 {
        for _ in 0..5 {
            f();
        }
        let mut t: Vec<f64> = (0..31)
            .map(|_| {
                let s = std::time::Instant::now();
                f();
                s.elapsed().as_secs_f64()
            })
            .collect();
        t.sort_by(f64::total_cmp);
        t[t.len() / 2]
    }
}
