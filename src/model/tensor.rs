//! The CPU compute primitives of the model: a row-major f32 matrix, linear layers (threaded
//! GEMV for decode, candle's GEMM for prefill), and the precision policy.
//!
//! Everything is stored and computed in f32. `Precision::Bf16` reproduces the bf16 reference
//! (transformers with `dtype=bfloat16`) by rounding to bf16 exactly where PyTorch rounds: a bf16
//! GEMM is an f32-accumulated product of bf16 values rounded once, which is what an f32 GEMM of
//! bf16-valued operands followed by one rounding computes (up to summation order).

use candle_core::{Device, Tensor};
use rayon::prelude::*;
use serde::Serialize;

use crate::error::{Error, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 everywhere (CPU default).
    #[default]
    F32,
    /// The bf16 cast points of the transformers reference (model-spec §3.9).
    Bf16,
}

impl Precision {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "f32" | "float32" => Ok(Precision::F32),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            _ => Err(Error::InvalidArgument(format!("unknown dtype \"{s}\" (expected f32 or bf16)"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }

    /// Rounds one value to the activation dtype.
    #[inline(always)]
    pub fn round(self, x: f32) -> f32 {
        match self {
            Precision::F32 => x,
            Precision::Bf16 => half::bf16::from_f32(x).to_f32(),
        }
    }

    pub fn round_all(self, xs: &mut [f32]) {
        if self == Precision::Bf16 {
            for x in xs {
                *x = half::bf16::from_f32(*x).to_f32();
            }
        }
    }

    /// Bytes per element of activations / KV entries in this precision's reference.
    pub fn activation_bytes(self) -> usize {
        match self {
            Precision::F32 => 4,
            Precision::Bf16 => 2,
        }
    }
}

#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

/// torch's softplus (beta 1, threshold 20).
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { x.exp().ln_1p() }
}

/// A row-major `rows × cols` f32 matrix (activations: one row per token).
#[derive(Debug, Clone, PartialEq)]
pub struct Mat {
    pub rows: usize,
    pub cols: usize,
    pub data: Vec<f32>,
}

impl Mat {
    pub fn zeros(rows: usize, cols: usize) -> Self {
        Mat { rows, cols, data: vec![0.0; rows * cols] }
    }

    pub fn from_vec(rows: usize, cols: usize, data: Vec<f32>) -> Self {
        debug_assert_eq!(data.len(), rows * cols);
        Mat { rows, cols, data }
    }

    #[inline]
    pub fn row(&self, r: usize) -> &[f32] {
        &self.data[r * self.cols..(r + 1) * self.cols]
    }

    #[inline]
    pub fn row_mut(&mut self, r: usize) -> &mut [f32] {
        &mut self.data[r * self.cols..(r + 1) * self.cols]
    }

    /// Columns `start..start+len` of every row, as a new matrix.
    pub fn columns(&self, start: usize, len: usize) -> Mat {
        let mut out = Vec::with_capacity(self.rows * len);
        for r in 0..self.rows {
            out.extend_from_slice(&self.row(r)[start..start + len]);
        }
        Mat::from_vec(self.rows, len, out)
    }

    /// Rows `idx` (in that order), as a new matrix.
    pub fn gather_rows(&self, idx: &[usize]) -> Mat {
        let mut out = Vec::with_capacity(idx.len() * self.cols);
        for &r in idx {
            out.extend_from_slice(self.row(r));
        }
        Mat::from_vec(idx.len(), self.cols, out)
    }
}

/// `dot(a, b)` with independent accumulators so the compiler vectorises it.
#[inline(always)]
fn dot_generic(a: &[f32], b: &[f32]) -> f32 {
    const L: usize = 16;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; L];
    let chunks = n / L;
    for c in 0..chunks {
        let (x, y) = (&a[c * L..c * L + L], &b[c * L..c * L + L]);
        for i in 0..L {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = 0f32;
    for i in chunks * L..n {
        s += a[i] * b[i];
    }
    // Pairwise reduction of the lanes.
    let mut w = L;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] += acc[i + w];
        }
    }
    acc[0] + s
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    dot_generic(a, b)
}

#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked above).
            return unsafe { dot_avx2(a, b) };
        }
    }
    dot_generic(a, b)
}

/// Rows at or below which a linear layer runs as a threaded GEMV (decode, MTP verify) instead
/// of a GEMM: candle's GEMM runs m = 1 on one thread only (build-notes §2).
const GEMV_MAX_ROWS: usize = 8;

/// Weight elements below which a GEMV runs on the calling thread.
const PARALLEL_MIN_WEIGHTS: usize = 1 << 16;

/// A bias-free linear layer `y = x · Wᵀ` with `W: [out, in]` (PyTorch `nn.Linear` layout).
pub struct Linear {
    pub out_features: usize,
    pub in_features: usize,
    /// `[out, in]`, f32, contiguous.
    weight: Tensor,
}

impl Linear {
    pub fn new(weight: Vec<f32>, out_features: usize, in_features: usize) -> Result<Self> {
        let weight = Tensor::from_vec(weight, (out_features, in_features), &Device::Cpu)?;
        Ok(Linear { out_features, in_features, weight })
    }

    /// Concatenates several `[out_i, in]` weights row-wise into one layer (one pass over `x`).
    pub fn fused(parts: Vec<(Vec<f32>, usize)>, in_features: usize) -> Result<Self> {
        let out: usize = parts.iter().map(|p| p.1).sum();
        let mut w = Vec::with_capacity(out * in_features);
        for (p, _) in parts {
            w.extend_from_slice(&p);
        }
        Linear::new(w, out, in_features)
    }

    pub fn weight_bytes(&self) -> usize {
        self.out_features * self.in_features * 4
    }

    fn with_weight<R>(&self, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
        let (storage, layout) = self.weight.storage_and_layout();
        match &*storage {
            candle_core::Storage::Cpu(cpu) => {
                let s = cpu.as_slice::<f32>()?;
                let start = layout.start_offset();
                Ok(f(&s[start..start + self.out_features * self.in_features]))
            }
            #[allow(unreachable_patterns)]
            _ => Err(Error::Compute("linear weights must live on the CPU".into())),
        }
    }

    /// The weights as a slice (used to gather embedding rows for tied heads).
    pub fn row(&self, r: usize) -> Result<Vec<f32>> {
        self.with_weight(|w| w[r * self.in_features..(r + 1) * self.in_features].to_vec())
    }

    pub fn forward(&self, x: &Mat, prec: Precision) -> Result<Mat> {
        if x.cols != self.in_features {
            return Err(Error::Compute(format!(
                "linear: input has {} features, weight expects {}",
                x.cols, self.in_features
            )));
        }
        let mut y = if x.rows <= GEMV_MAX_ROWS { self.gemv(x)? } else { self.gemm(x)? };
        prec.round_all(&mut y.data);
        Ok(y)
    }

    /// Threaded over output features; each weight row is read once for all input rows.
    fn gemv(&self, x: &Mat) -> Result<Mat> {
        let (rows, inp, out) = (x.rows, self.in_features, self.out_features);
        // Output computed transposed ([out, rows]) so threads own contiguous blocks.
        let mut yt = vec![0f32; out * rows];
        self.with_weight(|w| {
            let block_fn = |(bi, chunk): (usize, &mut [f32]), block: usize| {
                let o0 = bi * block;
                for (j, yo) in chunk.chunks_mut(rows).enumerate() {
                    let wr = &w[(o0 + j) * inp..(o0 + j + 1) * inp];
                    for (r, v) in yo.iter_mut().enumerate() {
                        *v = dot(wr, x.row(r));
                    }
                }
            };
            if out * inp < PARALLEL_MIN_WEIGHTS {
                // Small layers (the demo model): a thread hand-off costs more than the work.
                block_fn((0, &mut yt), out);
            } else {
                let block = 64.max(out / (rayon::current_num_threads() * 8).max(1));
                yt.par_chunks_mut(block * rows).enumerate().for_each(|c| block_fn(c, block));
            }
        })?;
        let mut y = vec![0f32; rows * out];
        for o in 0..out {
            for r in 0..rows {
                y[r * out + o] = yt[o * rows + r];
            }
        }
        Ok(Mat::from_vec(rows, out, y))
    }

    fn gemm(&self, x: &Mat) -> Result<Mat> {
        let xt = Tensor::from_slice(&x.data, (x.rows, x.cols), &Device::Cpu)?;
        let y = xt.matmul(&self.weight.t()?)?;
        let data = y.flatten_all()?.to_vec1::<f32>()?;
        Ok(Mat::from_vec(x.rows, self.out_features, data))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemv_and_gemm_agree_with_naive() {
        let (out, inp) = (37, 53);
        let w: Vec<f32> = (0..out * inp).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
        let lin = Linear::new(w.clone(), out, inp).unwrap();
        for rows in [1, 3, 8, 9, 20] {
            let x: Vec<f32> = (0..rows * inp).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
            let xm = Mat::from_vec(rows, inp, x.clone());
            let y = lin.forward(&xm, Precision::F32).unwrap();
            for r in 0..rows {
                for o in 0..out {
                    let want: f32 = (0..inp).map(|i| w[o * inp + i] * x[r * inp + i]).sum();
                    assert!((y.row(r)[o] - want).abs() < 1e-4, "rows {rows} r {r} o {o}: {} vs {want}", y.row(r)[o]);
                }
            }
        }
    }

    #[test]
    fn bf16_rounding_matches_half() {
        let x = 1.0f32 + 3.0 * 2f32.powi(-9); // halfway-ish between two bf16 values
        assert_eq!(Precision::Bf16.round(x), half::bf16::from_f32(x).to_f32());
        assert_eq!(Precision::F32.round(x), x);
    }
}
