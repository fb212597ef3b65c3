//! A GGUF weight matrix kept as its quantised ggml blocks (Q8_0, Q4_K, …): a view into the
//! memory-mapped file where it can be, dequantised only inside the kernels
//! (`cpu/quant_gemv.rs`), so a Q4_K matrix costs 4.5 bits a weight in memory and in every
//! decode step's pass over it, not 32.
//!
//! The matrix is row-major and every row is whole blocks (`cols` a multiple of the type's block
//! width), so value `i` of the flattened matrix is value `i % block_values` of block
//! `i / block_values` of the bytes: a range of values is a range of blocks, rows included.

use crate::model::cpu::Simd;
use crate::model::cpu::quant_gemv;
use crate::model::gguf::GgmlType;

use super::values::Values;

/// A `[rows, cols]` matrix of ggml blocks of one type, row after row.
#[derive(Debug, PartialEq)]
pub struct QuantWeights {
    ty: GgmlType,
    data: Values<u8>,
    rows: usize,
    cols: usize,
}

impl QuantWeights {
    /// `data` holding `rows` rows of `cols` values of type `ty`; refused (saying what was
    /// expected and what was found) when deltascope cannot dequantise the type, a row is not
    /// whole blocks, or the byte count is not the shape's.
    pub fn new(ty: GgmlType, data: Values<u8>, rows: usize, cols: usize) -> Result<Self, String> {
        if !ty.is_supported() {
            let names: Vec<&str> = GgmlType::SUPPORTED.iter().map(|t| t.name()).collect();
            return Err(format!("quantised weights of type {ty}: not supported (supported: {})", names.join(", ")));
        }
        let per = ty.block_values();
        if !cols.is_multiple_of(per) {
            return Err(format!("{ty} weights [{rows}, {cols}]: a row of {cols} values is not whole blocks of {per}"));
        }
        let want = (cols / per).checked_mul(ty.block_bytes()).and_then(|row| row.checked_mul(rows));
        match want {
            Some(want) if want == data.len() => Ok(QuantWeights { ty, data, rows, cols }),
            Some(want) => Err(format!("{ty} weights [{rows}, {cols}]: expected {want} bytes, found {}", data.len())),
            None => Err(format!("{ty} weights [{rows}, {cols}]: the byte count overflows")),
        }
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Bytes of one row (its blocks).
    pub fn row_bytes(&self) -> usize {
        self.cols / self.ty.block_values() * self.ty.block_bytes()
    }

    /// Bytes held (the blocks: their scales are inside them).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// The blocks, row after row.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Whether the blocks are a view into the mapped file (not a copy).
    pub fn is_mapped(&self) -> bool {
        self.data.is_mapped()
    }

    /// Rows `r0..r0 + n`: a view of a view (no copy) when mapped; owned blocks are copied, as
    /// [`Values::range`] does.
    pub fn rows_view(&self, r0: usize, n: usize) -> QuantWeights {
        assert!(r0 + n <= self.rows, "rows {r0}+{n} of a {} matrix of {} rows", self.ty, self.rows);
        let rb = self.row_bytes();
        QuantWeights { ty: self.ty, data: self.data.range(r0 * rb, n * rb), rows: n, cols: self.cols }
    }

    /// Values `start..start + out.len()` of the row-major matrix, dequantised exactly as
    /// `gguf::dequantize` computes them.
    pub fn dequantize_to(&self, start: usize, out: &mut [f32]) {
        let (per, bb) = (self.ty.block_values(), self.ty.block_bytes());
        let end = start + out.len();
        assert!(end <= self.rows * self.cols, "values {start}..{end} of a [{}, {}] matrix", self.rows, self.cols);
        if out.is_empty() {
            return;
        }
        let simd = Simd::detect();
        let block = |b: usize| &self.data[b * bb..(b + 1) * bb];
        // A partial block at either end goes through a scratch block; whole ones straight in.
        let mut scratch = vec![0f32; per];
        let (first, last) = (start / per, (end - 1) / per);
        let mut at = 0;
        for b in first..=last {
            let (lo, hi) = ((b * per).max(start), ((b + 1) * per).min(end));
            let dst = &mut out[at..at + hi - lo];
            if hi - lo == per {
                quant_gemv::dequantize_blocks(simd, self.ty, block(b), dst);
            } else {
                quant_gemv::dequantize_blocks(simd, self.ty, block(b), &mut scratch);
                dst.copy_from_slice(&scratch[lo - b * per..hi - b * per]);
            }
            at += hi - lo;
        }
    }

    /// Row `r` dequantised.
    pub fn row_f32(&self, r: usize) -> Vec<f32> {
        let mut out = vec![0f32; self.cols];
        self.dequantize_to(r * self.cols, &mut out);
        out
    }

    /// A matrix whose row `i` is row `order[i]` of this one (an owned copy of the blocks): how
    /// the GGUF loader undoes a converter's row permutation without dequantising.
    pub fn permuted_rows(&self, order: &[usize]) -> QuantWeights {
        let rb = self.row_bytes();
        let mut data = Vec::with_capacity(order.len() * rb);
        for &r in order {
            assert!(r < self.rows, "permuted_rows: row {r} of a matrix of {} rows", self.rows);
            data.extend_from_slice(&self.data[r * rb..(r + 1) * rb]);
        }
        QuantWeights { ty: self.ty, data: data.into(), rows: order.len(), cols: self.cols }
    }

    /// The type's name as ggml prints it for a tensor (`q4_K`, `iq4_xs`).
    pub fn dtype_name(&self) -> &'static str {
        match self.ty {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Bf16 => "bf16",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4K => "q4_K",
            GgmlType::Q5K => "q5_K",
            GgmlType::Q6K => "q6_K",
            GgmlType::Iq4Xs => "iq4_xs",
            GgmlType::Mxfp4 => "mxfp4",
            other => other.name(),
        }
    }
}

/// Random but valid blocks for the tests here and in the kernels: finite f16 scales of sane
/// magnitude, every other byte anything.
#[cfg(test)]
pub(crate) mod testing {
    use half::f16;

    use super::*;

    /// A small deterministic generator (xorshift), so that failures replay.
    pub(crate) struct Rng(pub u64);

    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        pub(crate) fn byte(&mut self) -> u8 {
            (self.next() >> 24) as u8
        }

        /// Uniform in [-1, 1).
        pub(crate) fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }

        /// An f16 scale of magnitude 2^-12 .. 2^-4 (a real checkpoint's range), either sign.
        fn scale(&mut self) -> [u8; 2] {
            let mag = 2f32.powf(-12.0 + 8.0 * (self.unit() + 1.0) / 2.0);
            let s = if self.byte() & 1 == 0 { mag } else { -mag };
            f16::from_f32(s).to_bits().to_le_bytes()
        }
    }

    /// One block of `ty`, its scales placed as dequant.rs reads them.
    pub(crate) fn block(ty: GgmlType, rng: &mut Rng) -> Vec<u8> {
        let mut b: Vec<u8> = (0..ty.block_bytes()).map(|_| rng.byte()).collect();
        let (first, second) = (rng.scale(), rng.scale());
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Iq4Xs => b[..2].copy_from_slice(&first),
            GgmlType::Q4K | GgmlType::Q5K => {
                b[..2].copy_from_slice(&first);
                b[2..4].copy_from_slice(&second);
            }
            GgmlType::Q6K => b[208..210].copy_from_slice(&first),
            // An e8m0 exponent around 2^0 (127), subnormal-making ones (0, 1) now and then.
            GgmlType::Mxfp4 => b[0] = [0, 1, 120, 127, 130][usize::from(b[0]) % 5],
            GgmlType::F16 => b.copy_from_slice(&first),
            GgmlType::Bf16 => b.copy_from_slice(&half::bf16::from_f32(rng.unit()).to_bits().to_le_bytes()),
            GgmlType::F32 => b.copy_from_slice(&rng.unit().to_le_bytes()),
            _ => {}
        }
        b
    }

    /// `rows` rows of `cols` values of random blocks.
    pub(crate) fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: u64) -> QuantWeights {
        let mut rng = Rng(seed | 1);
        let blocks = rows * cols / ty.block_values();
        let data: Vec<u8> = (0..blocks).flat_map(|_| block(ty, &mut rng)).collect();
        match QuantWeights::new(ty, data.into(), rows, cols) {
            Ok(w) => w,
            Err(e) => panic!("a test matrix: {e}"),
        }
    }

    /// The reference: `gguf::dequantize` of every block.
    pub(crate) fn reference(w: &QuantWeights) -> Vec<f32> {
        let mut out = vec![];
        crate::model::gguf::dequantize(w.ty(), w.data(), &mut out).expect("a supported type");
        out
    }

    /// The types with their own kernels, and one that falls back.
    pub(crate) const KERNEL_TYPES: [GgmlType; 7] =
        [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K, GgmlType::Iq4Xs, GgmlType::Mxfp4];
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::testing::*;
    use super::*;
    use crate::checkpoint::FileBytes;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every type deltascope dequantises (the kernel types and the plain ones), from every kind
    /// of start (block edge, mid-block, mid-row, across rows): the reference's bits.
    #[test]
    fn dequantize_to_rows_and_permutations_give_the_references_bits() {
        let types = KERNEL_TYPES.iter().chain(&[GgmlType::F32, GgmlType::F16, GgmlType::Bf16]);
        for (i, &ty) in types.enumerate() {
            let (rows, cols) = (5, 512);
            let w = matrix(ty, rows, cols, 7 + i as u64);
            let want = reference(&w);
            assert_eq!(want.len(), rows * cols);
            let mut all = vec![f32::NAN; rows * cols];
            w.dequantize_to(0, &mut all);
            assert_eq!(bits(&all), bits(&want), "{ty} whole");
            for (start, len) in [(0, 1), (1, 31), (33, 300), (250, 600), (511, 2), (1024, 512), (2559, 1), (7, 0)] {
                let mut part = vec![f32::NAN; len];
                w.dequantize_to(start, &mut part);
                assert_eq!(bits(&part), bits(&want[start..start + len]), "{ty} {start}+{len}");
            }
            for r in 0..rows {
                assert_eq!(bits(&w.row_f32(r)), bits(&want[r * cols..(r + 1) * cols]), "{ty} row {r}");
            }
            let band = w.rows_view(2, 3);
            assert_eq!((band.rows(), band.cols(), band.bytes()), (3, cols, 3 * w.row_bytes()));
            assert_eq!(bits(&reference(&band)), bits(&want[2 * cols..]), "{ty} rows 2..5");
            let order = [4, 0, 0, 3];
            let p = w.permuted_rows(&order);
            assert_eq!(p.rows(), 4);
            for (i, &r) in order.iter().enumerate() {
                assert_eq!(bits(&p.row_f32(i)), bits(&want[r * cols..(r + 1) * cols]), "{ty} permuted row {i}");
            }
        }
    }

    #[test]
    fn a_mapped_matrix_stays_a_view_when_cut_into_rows() {
        let w = matrix(GgmlType::Q4K, 4, 256, 3);
        let mut bytes = vec![0u8; 3];
        bytes.extend_from_slice(w.data());
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        let file = Arc::new(FileBytes::Static(bytes));
        let view = Values::<u8>::view(&file, 3, w.bytes()).expect("bytes need no alignment");
        let mapped = QuantWeights::new(GgmlType::Q4K, view, 4, 256).expect("the shape's bytes");
        assert!(mapped.is_mapped());
        let band = mapped.rows_view(1, 2);
        assert!(band.is_mapped());
        assert_eq!(bits(&band.row_f32(1)), bits(&w.row_f32(2)));
        assert!(!mapped.permuted_rows(&[1]).is_mapped(), "a permutation is a copy");
    }

    #[test]
    fn wrong_shapes_and_types_are_refused_saying_what_was_expected() {
        let e = QuantWeights::new(GgmlType::Q4K, vec![0u8; 144].into(), 2, 256).unwrap_err();
        assert_eq!(e, "Q4_K weights [2, 256]: expected 288 bytes, found 144");
        let e = QuantWeights::new(GgmlType::Q8_0, vec![0u8; 34].into(), 1, 48).unwrap_err();
        assert_eq!(e, "Q8_0 weights [1, 48]: a row of 48 values is not whole blocks of 32");
        let e = QuantWeights::new(GgmlType::Q3K, vec![0u8; 110].into(), 1, 256).unwrap_err();
        assert!(e.starts_with("quantised weights of type Q3_K: not supported (supported: F32"), "{e}");
        let ok = QuantWeights::new(GgmlType::Q6K, vec![0u8; 420].into(), 1, 512).expect("valid");
        assert_eq!((ok.row_bytes(), ok.dtype_name()), (420, "q6_K"));
    }
}
