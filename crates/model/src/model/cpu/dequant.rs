//! FP8 weights widened to f32 a row segment at a time, for the prefill GEMMs' panels (the f32
//! GEMM's blocks of rows, the bf16 GEMMs' packed panels): `e4m3(q) · scale`, one rounding, the
//! bits of the scalar table lookup ([`crate::model::fp8_codes::E4M3`]) on every level.
//!
//! Why: the scalar lookup was 8 % of an FP8 512-token prefill (perf on the Xeon); here 16
//! codes take a handful of instructions. The widening is the GEMV's f16 route (see
//! `gemv::x86::fp8_chunk`): a code sign-extended to 16 bits and shifted left 7, with bit 14
//! cleared, is the f16 `S 0EEEE MMM0000000`, the code's value / 256 (exact, e4m3 subnormals
//! included: `vcvtph2ps` ignores MXCSR's denormals-are-zero); times `scale · 256` that is one
//! rounding of `value · scale` (the multiplication by 256 is exact while the scale is below
//! [`MAX_SIMD_SCALE`]). NaN codes are refused by the loader, so none reach here.

use crate::model::fp8_codes::{BLOCK, E4M3};

use super::Simd;

/// Blocks whose scale is at least this (never, in a real checkpoint: Qwen's are about 1e-3)
/// are widened by the table, where `scale · 256` could overflow.
const MAX_SIMD_SCALE: f32 = 1e30;

/// `out[j] = E4M3[q[j]] · scales[(c0 + j) / 128]`: codes `q` of one weight row, the first at
/// column `c0`, and that row's block scales (one per 128 columns).
pub(crate) fn fp8_row(simd: Simd, q: &[u8], scales: &[f32], c0: usize, out: &mut [f32]) {
    assert!(
        q.len() == out.len() && (c0 + q.len()).div_ceil(BLOCK) <= scales.len(),
        "fp8_row: {} codes from column {c0}, {} outputs, {} scales",
        q.len(),
        out.len(),
        scales.len()
    );
    // Table lookups up to the next multiple of 16 columns, so no 16-code chunk straddles a block.
    let lead = ((16 - c0 % 16) % 16).min(q.len());
    portable(&q[..lead], scales, c0, &mut out[..lead]);
    let (q, out, c0) = (&q[lead..], &mut out[lead..], c0 + lead);
    let whole = q.len() / 16 * 16;
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Portable && f16c() {
        // SAFETY: AVX2 and F16C are present (every non-portable level has AVX2; F16C checked);
        // `q` and `out` hold `whole` values; `scales` covers their blocks (asserted above).
        unsafe { x86::chunks(&q[..whole], scales, c0, &mut out[..whole]) };
        portable(&q[whole..], scales, c0 + whole, &mut out[whole..]);
        return;
    }
    let _ = (simd, whole);
    portable(q, scales, c0, out);
}

/// The reference: one table lookup and one multiplication a value.
fn portable(q: &[u8], scales: &[f32], c0: usize, out: &mut [f32]) {
    for (j, (o, &b)) in out.iter_mut().zip(q).enumerate() {
        *o = E4M3[b as usize] * scales[(c0 + j) / BLOCK];
    }
}

#[cfg(target_arch = "x86_64")]
fn f16c() -> bool {
    static F16C: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *F16C.get_or_init(|| std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("f16c"))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{BLOCK, MAX_SIMD_SCALE};

    /// 16 codes a step, `c0` a multiple of 16 (so a step stays inside one block).
    ///
    /// # Safety
    ///
    /// AVX2 and F16C; `q.len() == out.len()`, a multiple of 16; `scales` covers the blocks of
    /// columns `c0..c0 + q.len()`.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn chunks(q: &[u8], scales: &[f32], c0: usize, out: &mut [f32]) {
        debug_assert!(c0.is_multiple_of(16) && q.len().is_multiple_of(16) && q.len() == out.len());
        let clear_bit_14 = _mm256_set1_epi16(0xBFFFu16 as i16);
        for (i, (qc, oc)) in q.chunks_exact(16).zip(out.chunks_exact_mut(16)).enumerate() {
            let scale = scales[(c0 + i * 16) / BLOCK];
            if scale.abs() >= MAX_SIMD_SCALE {
                super::portable(qc, scales, c0 + i * 16, oc);
                continue;
            }
            let s = _mm256_set1_ps(scale * 256.0);
            // SAFETY: each chunk holds 16 codes and 16 outputs.
            unsafe {
                let e = _mm256_cvtepi8_epi16(_mm_loadu_si128(qc.as_ptr().cast()));
                let h = _mm256_and_si256(_mm256_slli_epi16(e, 7), clear_bit_14);
                _mm256_storeu_ps(oc.as_mut_ptr(), _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), s));
                _mm256_storeu_ps(
                    oc.as_mut_ptr().add(8),
                    _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)), s),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::fp8_codes::is_nan_code;

    /// Every code, at scales of every kind (bf16-like, f32 with full mantissas, tiny ones whose
    /// products are subnormal, one too large for the f16 route), from every starting column
    /// modulo 16 and across block edges: the bits of the table lookup.
    #[test]
    fn every_level_gives_the_table_lookups_bits() {
        let codes: Vec<u8> = (0..=255u8).filter(|&b| !is_nan_code(b)).collect();
        let q: Vec<u8> = (0..700).map(|i| codes[(i * 37 + i / 5) % codes.len()]).collect();
        let scale_sets: [&[f32]; 4] = [
            &[1.5e-3, 2.0, 0.0078125, 7.25e-4, 1.0, 3.0e-2],
            &[1.234_567_8e-3, 9.876_543e-4, 0.333_333_34, 1.1e-2, 5.0e-4, 2.5e-3],
            &[1e-38, 3e-41, 1e-40, 1.7e-39, 1e-37, 2e-39],
            &[2e30, 1e-3, 3e31, 1.0, 1e30, 5.0],
        ];
        for scales in scale_sets {
            for c0 in [0usize, 1, 5, 15, 16, 17, 100, 127, 128] {
                let n = q.len().min(scales.len() * BLOCK - c0);
                let mut want = vec![0f32; n];
                portable(&q[..n], scales, c0, &mut want);
                for simd in [Simd::Portable, Simd::detect()] {
                    for len in [0, 1, 15, 16, 17, 33, n] {
                        let mut got = vec![f32::NAN; len];
                        fp8_row(simd, &q[..len], scales, c0, &mut got);
                        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
                            assert_eq!(
                                g.to_bits(),
                                w.to_bits(),
                                "{simd:?} c0 {c0} len {len} value {j} code {:#04x}",
                                q[j]
                            );
                        }
                    }
                }
            }
        }
    }
}
