//! Dequantisation of ggml blocks to f32, exactly as the reference computes it (ggml's
//! `dequantize_row_*`, and the `gguf` Python package's NumPy port, which the tests hold these
//! to bit for bit): every product and difference rounded to f32 in the reference's order, no
//! fused multiply-add. The GEMV kernels that read quantised blocks in registers compute the
//! same values.

use half::f16;

use super::types::GgmlType;

/// Why a tensor's bytes cannot be dequantised.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DequantError {
    #[error("{0} is not supported (deltascope dequantises {supported})", supported = supported_names())]
    Unsupported(GgmlType),
    #[error("{ty}: {bytes} bytes are not whole blocks of {block} bytes")]
    Ragged { ty: GgmlType, bytes: usize, block: usize },
}

fn supported_names() -> String {
    GgmlType::SUPPORTED.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
}

const QK_K: usize = 256;

/// IQ4_NL's and IQ4_XS's 16 non-linear levels.
const IQ4_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];
/// MXFP4's e2m1 values, doubled (the scale is halved to match).
const E2M1_DOUBLED: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Dequantises `bytes` (whole blocks of `ty`) into `out`, which receives one value per
/// quantised value.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut Vec<f32>) -> Result<(), DequantError> {
    let block = ty.block_bytes();
    if !bytes.len().is_multiple_of(block) {
        return Err(DequantError::Ragged { ty, bytes: bytes.len(), block });
    }
    let row: fn(&[u8], &mut [f32]) = match ty {
        GgmlType::F32 => |b, y| y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        GgmlType::F16 => |b, y| y[0] = f16_at(b, 0),
        GgmlType::Bf16 => |b, y| y[0] = f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16),
        GgmlType::Q8_0 => q8_0,
        GgmlType::Q4_0 => q4_0,
        GgmlType::Q4K => q4_k,
        GgmlType::Q5K => q5_k,
        GgmlType::Q6K => q6_k,
        GgmlType::Iq4Xs => iq4_xs,
        GgmlType::Mxfp4 => mxfp4,
        other => return Err(DequantError::Unsupported(other)),
    };
    let per = ty.block_values();
    let start = out.len();
    out.resize(start + bytes.len() / block * per, 0.0);
    for (b, y) in bytes.chunks_exact(block).zip(out[start..].chunks_exact_mut(per)) {
        row(b, y);
    }
    Ok(())
}

/// Q8_0: an f16 scale and 32 signed bytes.
fn q8_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (y, &q) in y.iter_mut().zip(&b[2..34]) {
        *y = f32::from(q as i8) * d;
    }
}

/// Q4_0: an f16 scale and 32 nibbles offset by 8; the low nibbles are the first 16 values.
fn q4_0(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    for (j, &q) in b[2..18].iter().enumerate() {
        y[j] = d * f32::from((q & 0x0F) as i8 - 8);
        y[j + 16] = d * f32::from((q >> 4) as i8 - 8);
    }
}

/// The eight 6-bit scales and mins of a Q4_K / Q5_K block, packed in 12 bytes.
fn scales_and_mins(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..4 {
        sc[j] = s[j] & 0x3F;
        m[j] = s[j + 4] & 0x3F;
        sc[j + 4] = (s[j + 8] & 0x0F) | ((s[j] >> 2) & 0x30);
        m[j + 4] = (s[j + 8] >> 4) | ((s[j + 4] >> 2) & 0x30);
    }
    (sc, m)
}

/// Q4_K: super-block scale and min (f16), eight 6-bit sub-block scales and mins, 256 nibbles;
/// each 32-byte chunk holds two sub-blocks (low nibbles, then high).
fn q4_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = scales_and_mins(&b[4..16]);
    let qs = &b[16..144];
    for s in 0..8 {
        let (d1, m1) = (d * f32::from(sc[s]), dmin * f32::from(m[s]));
        let (chunk, shift) = (&qs[s / 2 * 32..][..32], 4 * (s % 2));
        for (l, &q) in chunk.iter().enumerate() {
            y[s * 32 + l] = d1 * f32::from((q >> shift) & 0x0F) - m1;
        }
    }
}

/// Q5_K: as Q4_K, with a fifth bit per value from 32 high-bit bytes (bit `s` for sub-block `s`).
fn q5_k(b: &[u8], y: &mut [f32]) {
    let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
    let (sc, m) = scales_and_mins(&b[4..16]);
    let (qh, qs) = (&b[16..48], &b[48..176]);
    for s in 0..8 {
        let (d1, m1) = (d * f32::from(sc[s]), dmin * f32::from(m[s]));
        let (chunk, shift) = (&qs[s / 2 * 32..][..32], 4 * (s % 2));
        for l in 0..32 {
            let q = ((chunk[l] >> shift) & 0x0F) | (((qh[l] >> s) & 1) << 4);
            y[s * 32 + l] = d1 * f32::from(q) - m1;
        }
    }
}

/// Q6_K: 256 values of 4 low bits (128 bytes) and 2 high bits (64 bytes), offset by 32, with
/// sixteen signed 8-bit scales and an f16 super-block scale.
fn q6_k(b: &[u8], y: &mut [f32]) {
    let (ql, qh, scales) = (&b[..128], &b[128..192], &b[192..208]);
    let d = f16_at(b, 208);
    for v in 0..QK_K {
        let (h, w) = (v / 128, v % 128);
        let low = (ql[h * 64 + w % 64] >> (4 * (w / 64))) & 0x0F;
        let high = (qh[h * 32 + w % 32] >> (2 * (w / 32))) & 0x03;
        let q = (low | (high << 4)) as i8 - 32;
        y[v] = d * f32::from(scales[v / 16] as i8) * f32::from(q);
    }
}

/// IQ4_XS: an f16 scale, eight 6-bit sub-block scales (4 low bits in `scales_l`, 2 high in
/// `scales_h`), 256 nibbles indexing the non-linear levels.
fn iq4_xs(b: &[u8], y: &mut [f32]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let (scales_l, qs) = (&b[4..8], &b[8..136]);
    for ib in 0..8 {
        let low = (scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
        let high = ((scales_h >> (2 * ib)) & 0x03) as u8;
        let dl = d * f32::from((low | (high << 4)) as i8 - 32);
        for (j, &q) in qs[ib * 16..][..16].iter().enumerate() {
            y[ib * 32 + j] = dl * f32::from(IQ4_LEVELS[usize::from(q & 0x0F)]);
            y[ib * 32 + j + 16] = dl * f32::from(IQ4_LEVELS[usize::from(q >> 4)]);
        }
    }
}

/// MXFP4: an e8m0 shared exponent and 32 e2m1 nibbles (low nibbles first).
fn mxfp4(b: &[u8], y: &mut [f32]) {
    let e = u32::from(b[0]);
    // Half the e8m0 scale, so that the doubled e2m1 values come out right.
    let d = f32::from_bits(if e < 2 { 0x0020_0000 << e } else { (e - 1) << 23 });
    for (j, &q) in b[1..17].iter().enumerate() {
        y[j] = d * f32::from(E2M1_DOUBLED[usize::from(q & 0x0F)]);
        y[j + 16] = d * f32::from(E2M1_DOUBLED[usize::from(q >> 4)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_0_is_scale_times_byte() {
        let mut b = f16::from_f32(0.5).to_bits().to_le_bytes().to_vec();
        b.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let mut y = vec![];
        dequantize(GgmlType::Q8_0, &b, &mut y).unwrap();
        assert_eq!(y[0], -8.0);
        assert_eq!(y[31], 7.5);
    }

    #[test]
    fn refusals_name_the_type_and_what_is_supported() {
        let e = dequantize(GgmlType::Q3K, &[0; 110], &mut vec![]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "Q3_K is not supported (deltascope dequantises F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K, IQ4_XS, MXFP4)"
        );
        assert!(matches!(dequantize(GgmlType::Q8_0, &[0; 35], &mut vec![]), Err(DequantError::Ragged { .. })));
    }
}
