//! Weight matrices kept as the checkpoint stores them (f32, bf16, f16, or FP8 codes with block
//! scales), widened to f32 only inside the kernels: a bf16 checkpoint costs 2 bytes a weight in memory and in every token's
//! pass over the weights, not 4. Where the file's layout allows (little-endian values at an
//! aligned offset, which safetensors writers produce), a matrix is a view into the
//! memory-mapped checkpoint: loading copies nothing, and the resident set is the file's pages.

use half::{bf16, f16};

use crate::model::fp8::Fp8Weights;
use crate::model::quant::QuantWeights;

pub(crate) use super::values::{Plain, Values};

/// A weight matrix's values in their stored dtype (row-major, like the checkpoint).
#[derive(Debug, PartialEq)]
pub enum Weights {
    F32(Values<f32>),
    /// bf16 bit patterns.
    Bf16(Values<u16>),
    /// IEEE half bit patterns.
    F16(Values<u16>),
    /// e4m3 codes with a scale per 128 × 128 block (Qwen's FP8 releases).
    Fp8(Fp8Weights),
    /// GGUF's ggml blocks (Q8_0, Q4_K, …), dequantised in the kernels (`model::quant`).
    Quant(QuantWeights),
}

impl Weights {
    pub fn f32(v: Vec<f32>) -> Self {
        Weights::F32(v.into())
    }

    pub fn bf16(bits: Vec<u16>) -> Self {
        Weights::Bf16(bits.into())
    }

    pub fn len(&self) -> usize {
        match self {
            Weights::F32(v) => v.len(),
            Weights::Bf16(v) | Weights::F16(v) => v.len(),
            Weights::Fp8(w) => w.q.len(),
            Weights::Quant(w) => w.rows() * w.cols(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the values are a view into the mapped checkpoint (not a copy).
    pub fn is_mapped(&self) -> bool {
        match self {
            Weights::F32(v) => v.is_mapped(),
            Weights::Bf16(v) | Weights::F16(v) => v.is_mapped(),
            Weights::Fp8(w) => w.q.is_mapped(),
            Weights::Quant(w) => w.is_mapped(),
        }
    }

    /// Bytes per stored value (FP8: the code; its block scales are in [`Weights::bytes`]; a
    /// quantised value takes a fraction of a byte, counted as 1: [`Weights::bytes`] is exact).
    pub fn elem_bytes(&self) -> usize {
        match self {
            Weights::F32(_) => std::mem::size_of::<f32>(),
            Weights::Bf16(_) | Weights::F16(_) => std::mem::size_of::<u16>(),
            Weights::Fp8(_) | Weights::Quant(_) => 1,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            Weights::Fp8(w) => w.bytes(),
            Weights::Quant(w) => w.bytes(),
            _ => self.len() * self.elem_bytes(),
        }
    }

    pub fn dtype_name(&self) -> &'static str {
        match self {
            Weights::F32(_) => "f32",
            Weights::Bf16(_) => "bf16",
            Weights::F16(_) => "f16",
            Weights::Fp8(_) => "fp8",
            Weights::Quant(w) => w.dtype_name(),
        }
    }

    /// Values `start..start + len`, in the same dtype (a view of a view: no copy). FP8 weights
    /// and quantised weights are cut into whole rows only (their scales go by row).
    pub fn slice(&self, start: usize, len: usize) -> Weights {
        match self {
            Weights::F32(v) => Weights::F32(v.range(start, len)),
            Weights::Bf16(v) => Weights::Bf16(v.range(start, len)),
            Weights::F16(v) => Weights::F16(v.range(start, len)),
            Weights::Fp8(w) => {
                assert!(
                    start.is_multiple_of(w.cols) && len.is_multiple_of(w.cols),
                    "an FP8 matrix of rows of {} cut at {start}+{len}",
                    w.cols
                );
                Weights::Fp8(w.rows_view(start / w.cols, len / w.cols))
            }
            Weights::Quant(w) => {
                let cols = w.cols();
                assert!(
                    start.is_multiple_of(cols) && len.is_multiple_of(cols),
                    "a {} matrix of rows of {cols} cut at {start}+{len}",
                    w.dtype_name()
                );
                Weights::Quant(w.rows_view(start / cols, len / cols))
            }
        }
    }

    /// Every value widened to f32 (exact: bf16 and f16 are subsets of f32).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len());
        self.widen_into(0, self.len(), &mut out);
        out
    }

    /// The values as f32, without a copy when they are owned f32 already.
    pub fn into_f32(self) -> Vec<f32> {
        match self {
            Weights::F32(v) => v.into_vec(),
            w => w.to_f32(),
        }
    }

    /// Values `start..start + len` widened to f32, appended to `out`.
    pub fn widen_into(&self, start: usize, len: usize, out: &mut Vec<f32>) {
        let at = out.len();
        out.resize(at + len, 0.0);
        self.widen_to(start, &mut out[at..]);
    }

    /// Values `start..start + out.len()` widened to f32 into `out`.
    pub fn widen_to(&self, start: usize, out: &mut [f32]) {
        let end = start + out.len();
        match self {
            Weights::F32(v) => out.copy_from_slice(&v[start..end]),
            Weights::Bf16(v) => out.iter_mut().zip(&v[start..end]).for_each(|(o, &b)| *o = bf16_to_f32(b)),
            Weights::F16(v) => out.iter_mut().zip(&v[start..end]).for_each(|(o, &b)| *o = f16::from_bits(b).to_f32()),
            Weights::Fp8(w) => w.dequantize_to(start, out),
            Weights::Quant(w) => w.dequantize_to(start, out),
        }
    }

    /// The same values rounded to bf16 (the bf16 reference's cast of every parameter); bf16
    /// stays as it is (a view stays a view). FP8 is dequantised and rounded (a copy at two
    /// bytes a weight: the loader keeps FP8 as it is instead). Quantised GGUF weights stay as
    /// they are (a view stays a view): their kernels keep the dequantised weights exact and
    /// round the activations to bf16 at this precision (`Linear::forward`).
    pub fn into_bf16(self) -> Weights {
        match self {
            Weights::Fp8(w) => {
                let mut wide = vec![0f32; w.q.len()];
                w.dequantize_to(0, &mut wide);
                Weights::bf16(wide.iter().map(|&x| bf16::from_f32(x).to_bits()).collect())
            }
            Weights::F32(v) => Weights::bf16(v.iter().map(|&x| bf16::from_f32(x).to_bits()).collect()),
            Weights::F16(v) => {
                Weights::bf16(v.iter().map(|&b| bf16::from_f32(f16::from_bits(b).to_f32()).to_bits()).collect())
            }
            b @ (Weights::Bf16(_) | Weights::Quant(_)) => b,
        }
    }
}

/// bf16 is the top half of an f32: widening is a shift.
#[inline(always)]
pub(crate) fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::FileBytes;
    use std::sync::Arc;

    #[test]
    fn widening_is_exact_and_sizes_come_from_the_dtype() {
        let xs = [1.5f32, -0.001_953_125, 3.0e38, 0.0];
        let b = Weights::f32(xs.to_vec()).into_bf16();
        assert_eq!(b.bytes(), 8);
        assert_eq!(b.to_f32(), xs.iter().map(|&x| bf16::from_f32(x).to_f32()).collect::<Vec<_>>());
        let h = Weights::F16(xs[..2].iter().map(|&x| f16::from_f32(x).to_bits()).collect::<Vec<_>>().into());
        assert_eq!(h.to_f32(), vec![1.5, -0.001_953_125]);
        assert_eq!(Weights::f32(xs.to_vec()).bytes(), 16);
        assert_eq!(Weights::bf16(vec![1, 2, 3, 4]).slice(1, 2), Weights::bf16(vec![2, 3]));
    }

    #[test]
    fn a_view_reads_the_file_and_narrows_without_a_copy() {
        // Two bf16 values after a 2-byte prefix, then an f32 at offset 8.
        let mut bytes = vec![0xAA, 0xBB];
        for b in [0x3f80u16, 0x4000] {
            bytes.extend(b.to_le_bytes());
        }
        bytes.extend([0, 0]);
        bytes.extend(2.5f32.to_le_bytes());
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        assert!((bytes.as_ptr() as usize).is_multiple_of(4), "the allocator aligns to at least 4");
        let file = Arc::new(FileBytes::Static(bytes));
        let w = Weights::Bf16(Values::view(&file, 2, 2).expect("aligned"));
        assert!(w.is_mapped());
        assert_eq!(w.to_f32(), vec![1.0, 2.0]);
        let second = w.slice(1, 1);
        assert!(second.is_mapped());
        assert_eq!(second.to_f32(), vec![2.0]);
        assert_eq!(Values::<f32>::view(&file, 8, 1).map(|v| v.to_vec()), Some(vec![2.5]));
        // Misaligned for f32, or past the end: no view (the loader copies instead).
        assert!(Values::<f32>::view(&file, 2, 1).is_none());
        assert!(Values::<u16>::view(&file, 10, 2).is_none());
    }
}
