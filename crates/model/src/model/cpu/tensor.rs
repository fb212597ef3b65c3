//! The CPU compute primitives of the model: a row-major f32 matrix, linear layers (threaded
//! multi-row GEMV for decode and MTP verify, candle's GEMM crate for prefill), and the precision policy.
//!
//! Weights are held as the checkpoint stores them (f32, bf16, f16: `storage::Weights`) and
//! widened to f32 in the kernels; activations and arithmetic are f32. `Precision::Bf16` reproduces the bf16 reference
//! (transformers with `dtype=bfloat16`) by rounding to bf16 exactly where PyTorch rounds: a bf16
//! GEMM is an f32-accumulated product of bf16 values rounded once, which is what an f32 GEMM of
//! bf16-valued operands followed by one rounding computes (up to summation order). In bf16 mode
//! the decode GEMV multiplies bf16 activations by bf16 weights directly (`vdpbf16ps` where the
//! CPU has AVX512_BF16; `gemv::PairKernel`), rounding a layer's input to bf16 first, which is
//! exact where it already is a bf16 value.

use rayon::prelude::*;

use super::gemv::{self, PairKernel, PairRows, WeightRow};
use super::quant_gemv::{self, QuantRows};
use super::simd::Simd;
use super::{amx, gemm_bf16};
use crate::error::{Error, Result};
use crate::model::storage::Weights;

pub use super::precision::Precision;

// The precision's rounding of a whole buffer, threaded over rows (the type and its one-value
// rounding are precision.rs, below the maths).
impl Precision {
    pub fn round_all(self, xs: &mut [f32]) {
        if self == Precision::Bf16 {
            for_rows(xs, 1024.min(xs.len()), |_, row| {
                for x in row {
                    *x = super::math::round_bf16(*x);
                }
            });
        }
    }
}

/// Bytes of an f32 (norm weights, state, KV entries).
pub(crate) const F32_BYTES: usize = std::mem::size_of::<f32>();

pub use super::math::{sigmoid, silu};

/// torch's softplus (beta 1, threshold 20).
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 { x } else { super::math::exp(x).ln_1p() }
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

    /// Runs `f(r, row)` on every row: on all threads for a prefill's many rows, on the calling
    /// thread for a decode step's few (a hand-off would cost more than the work). Rows are
    /// independent, so the bits are the same either way.
    pub fn for_rows(&mut self, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
        for_rows(&mut self.data, self.cols, f);
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

/// [`Mat::for_rows`] over `data` holding rows of `cols` values.
pub(crate) fn for_rows(data: &mut [f32], cols: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if cols == 0 {
        return;
    }
    if data.len() / cols > GEMV_MAX_ROWS && data.len() >= PARALLEL_MIN_VALUES {
        data.par_chunks_mut(cols).enumerate().for_each(|(r, row)| f(r, row));
    } else {
        data.chunks_mut(cols).enumerate().for_each(|(r, row)| f(r, row));
    }
}

/// Values below which an elementwise pass runs on the calling thread.
const PARALLEL_MIN_VALUES: usize = 1 << 14;

/// `a · b` over the shorter length, with the fixed summation order of [`gemv`]: the same bits
/// on every instruction set, and the bits one row of a decode GEMV gets.
#[inline]
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let mut out = [0f32];
    gemv::dot_rows(Simd::detect(), WeightRow::F32(&a[..n]), &[&b[..n]], &mut out);
    out[0]
}

/// Rows at or below which a linear layer runs as a threaded GEMV (decode, MTP verify) instead
/// of a GEMM: candle's GEMM runs m = 1 on one thread only (build-notes §2).
const GEMV_MAX_ROWS: usize = gemv::MAX_ROWS;

/// Weight elements below which a GEMV runs on the calling thread.
const PARALLEL_MIN_WEIGHTS: usize = 1 << 16;

/// Values of a bf16 / f16 weight widened to f32 at a time for a prefill GEMM: 8 MiB of f32
/// (2048 rows of a 1024-wide layer). Of 1, 8 and 32 MiB, 8 was fastest on the 0.8B shape here
/// (pp128 63-68 tok/s against 45-50 with 1 MiB).
const WIDEN_BLOCK_VALUES: usize = 1 << 21;

/// A bias-free linear layer `y = x · Wᵀ` with `W: [out, in]` (PyTorch `nn.Linear` layout),
/// its weights in their stored dtype. A fused projection (q/k/v, gate/up, the GDN inputs) is
/// its checkpoint tensors one after the other, each kept as loaded (a view into the mapped
/// file), not copied into one buffer.
pub struct Linear {
    pub out_features: usize,
    pub in_features: usize,
    /// Row blocks in output order: `parts[i]` holds rows `starts[i]..starts[i + 1]`.
    parts: Vec<Weights>,
    starts: Vec<usize>,
    simd: Simd,
    pairs: PairKernel,
}

impl Linear {
    pub fn new(weight: Vec<f32>, out_features: usize, in_features: usize) -> Result<Self> {
        Linear::from_weights(Weights::f32(weight), out_features, in_features)
    }

    pub fn from_weights(weights: Weights, out_features: usize, in_features: usize) -> Result<Self> {
        Linear::fused(vec![(weights, out_features)], in_features)
    }

    /// Several `[out_i, in]` weights stacked row-wise into one layer (one pass over `x`).
    pub fn fused(parts: Vec<(Weights, usize)>, in_features: usize) -> Result<Self> {
        let mut starts = vec![0];
        for (w, rows) in &parts {
            if w.len() != rows * in_features {
                return Err(Error::Compute(format!("linear: {} weights for [{rows}, {in_features}]", w.len())));
            }
            starts.push(starts[starts.len() - 1] + rows);
        }
        let out_features = starts[starts.len() - 1];
        Ok(Linear {
            out_features,
            in_features,
            parts: parts.into_iter().map(|p| p.0).collect(),
            starts,
            simd: Simd::detect(),
            pairs: PairKernel::active(),
        })
    }

    /// Bytes of the weights as held.
    pub fn weight_bytes(&self) -> usize {
        self.parts.iter().map(Weights::bytes).sum()
    }

    pub fn dtype_name(&self) -> &'static str {
        let first = self.parts.first().map_or("f32", Weights::dtype_name);
        if self.parts.iter().all(|w| w.dtype_name() == first) { first } else { "mixed" }
    }

    /// The parts holding output rows `o0..o0 + k`: `(part, first row in it, rows)`.
    fn spans(&self, o0: usize, k: usize) -> impl Iterator<Item = (&Weights, usize, usize)> {
        let end = o0 + k;
        self.parts.iter().enumerate().filter_map(move |(i, w)| {
            let (a, b) = (self.starts[i].max(o0), self.starts[i + 1].min(end));
            (a < b).then(|| (w, a - self.starts[i], b - a))
        })
    }

    /// Output rows `o0..o0 + n` as bf16 bits, row-major (the upload of a weight to a GPU:
    /// bf16 weights copied as stored, f32 / f16 ones rounded to nearest even).
    pub fn bf16_rows(&self, o0: usize, n: usize) -> Vec<u16> {
        let inp = self.in_features;
        let mut out = Vec::with_capacity(n * inp);
        for (w, at, rows) in self.spans(o0, n) {
            let range = at * inp..(at + rows) * inp;
            match w {
                Weights::Bf16(v) => out.extend_from_slice(&v[range]),
                _ => {
                    let mut wide = Vec::with_capacity(range.len());
                    w.widen_into(range.start, range.len(), &mut wide);
                    out.extend(wide.iter().map(|x| half::bf16::from_f32(*x).to_bits()));
                }
            }
        }
        out
    }

    /// Output rows `o0..o0 + n` as FP8 codes with their scales, when every one of them is
    /// stored in FP8 (the upload of an FP8 weight to a GPU, kept at a byte a weight); `None`
    /// when any is not.
    pub fn fp8_rows(&self, o0: usize, n: usize) -> Option<crate::model::fp8::Fp8Stack> {
        let mut stack = crate::model::fp8::Fp8Stack::default();
        for (w, at, rows) in self.spans(o0, n) {
            let Weights::Fp8(f) = w else { return None };
            stack.push(&f.rows_view(at, rows));
        }
        (stack.rows() == n).then_some(stack)
    }

    /// Whether any of output rows `o0..o0 + n` is stored in FP8.
    pub fn any_fp8(&self, o0: usize, n: usize) -> bool {
        self.spans(o0, n).any(|(w, _, _)| matches!(w, Weights::Fp8(_)))
    }

    /// Whether any of output rows `o0..o0 + n` is stored as GGUF quantised blocks.
    pub fn any_quant(&self, o0: usize, n: usize) -> bool {
        self.spans(o0, n).any(|(w, _, _)| matches!(w, Weights::Quant(_)))
    }

    /// One weight row widened to f32 (an embedding row, for a tied head's input side).
    pub fn row(&self, r: usize) -> Result<Vec<f32>> {
        let Some((w, at, _)) = self.spans(r, 1).next() else {
            return Err(Error::Compute(format!("linear: row {r} of {}", self.out_features)));
        };
        let mut out = Vec::with_capacity(self.in_features);
        w.widen_into(at * self.in_features, self.in_features, &mut out);
        Ok(out)
    }

    pub fn forward(&self, x: &Mat, prec: Precision) -> Result<Mat> {
        if x.cols != self.in_features {
            return Err(Error::Compute(format!(
                "linear: input has {} features, weight expects {}",
                x.cols, self.in_features
            )));
        }
        // Quantised GGUF weights at bf16: the activations rounded to bf16 (as the FP8 kernels
        // take them at this precision: exact where they are bf16 values already), the
        // dequantised weights kept exact, the f32 kernels' order on every family.
        let rounded;
        let x = if prec == Precision::Bf16 && self.any_quant(0, self.out_features) {
            let mut r = x.clone();
            prec.round_all(&mut r.data);
            rounded = r;
            &rounded
        } else {
            x
        };
        let mut y = if x.rows <= GEMV_MAX_ROWS {
            self.gemv(x, prec)
        } else if prec == Precision::Bf16 && self.pairs == PairKernel::Amx && self.all_bf16() {
            self.gemm_amx(x)
        } else if prec == Precision::Bf16 && self.pairs == PairKernel::Amx && self.fp8_with_bf16() {
            self.gemm_amx_fp8(x)
        } else if prec == Precision::Bf16 && self.pairs == PairKernel::Dpbf16 && self.all_bf16() {
            self.gemm_bf16(x)?
        } else if prec == Precision::Bf16 && self.pairs == PairKernel::Dpbf16 && self.fp8_with_bf16() {
            self.gemm_bf16_fp8(x)
        } else {
            self.gemm(x)?
        };
        prec.round_all(&mut y.data);
        Ok(y)
    }

    /// Output features `o0..o0 + k`: their dot products with every input row, written
    /// `[k, rows]`, each weight read once.
    #[inline]
    fn dots(&self, o0: usize, k: usize, xs: &[&[f32]], out: &mut [f32]) {
        let inp = self.in_features;
        let mut out = out;
        for (w, at, n) in self.spans(o0, k) {
            let (mine, rest) = std::mem::take(&mut out).split_at_mut(n * xs.len());
            out = rest;
            let range = at * inp..(at + n) * inp;
            match w {
                Weights::F32(v) => gemv::gemv_rows(self.simd, WeightRow::F32(&v[range]), inp, xs, mine),
                Weights::Bf16(v) => gemv::gemv_rows(self.simd, WeightRow::Bf16(&v[range]), inp, xs, mine),
                Weights::Fp8(f) => {
                    let rows = gemv::Fp8Rows { q: &f.q[range], grid: &f.scales, row0: f.row0 + at };
                    gemv::fp8_rows(self.simd, rows, inp, xs, mine)
                }
                Weights::Quant(q) => {
                    let rb = q.row_bytes();
                    let rows = QuantRows { ty: q.ty(), q: &q.data()[at * rb..(at + n) * rb] };
                    quant_gemv::quant_rows(self.simd, rows, inp, xs, mine)
                }
                Weights::F16(_) => {
                    // Rare (f16 checkpoints): widened a row at a time.
                    let mut scratch = vec![0f32; inp];
                    for (j, yo) in mine.chunks_mut(xs.len()).enumerate() {
                        w.widen_to((at + j) * inp, &mut scratch);
                        gemv::dot_rows(self.simd, WeightRow::F32(&scratch), xs, yo);
                    }
                }
            }
        }
    }

    /// Threaded over output features; each weight row is read once for all input rows.
    fn gemv(&self, x: &Mat, prec: Precision) -> Mat {
        let (rows, inp, out) = (x.rows, self.in_features, self.out_features);
        let xs: Vec<&[f32]> = (0..rows).map(|r| x.row(r)).collect();
        // bf16 activations against bf16 weights (`--dtype bf16`): the pair order, which
        // `vdpbf16ps` computes where the CPU has it (`gemv::PairKernel`); FP8 weights (with
        // bf16 parts beside them) against bf16 activations with `vdpbf16ps` too, where the CPU
        // has it (`gemv::fp8_pairs_rows`).
        let fp8_pairs = self.fp8_with_bf16() && super::CpuKernel::active().dpbf16();
        let pairs =
            (prec == Precision::Bf16 && (self.all_bf16() || fp8_pairs)).then(|| PairRows::new(self.pairs, &xs, inp));
        // The kernels write a block of outputs transposed ([block, rows]); threads own blocks.
        let block_fn = |(bi, chunk): (usize, &mut [f32]), block: usize| match &pairs {
            Some(p) => self.pair_dots(bi * block, chunk.len() / rows, p, chunk),
            None => self.dots(bi * block, chunk.len() / rows, &xs, chunk),
        };
        // Small layers (the demo model): one block, as a thread hand-off costs more than the work.
        let small = out * inp < PARALLEL_MIN_WEIGHTS;
        let block = if small { out } else { 64.max(out / (rayon::current_num_threads() * 8).max(1)) };
        let mut y = Mat::zeros(rows, out);
        if rows == 1 {
            // [block, 1] is [1, block]: a decode step's output goes straight into place.
            if small {
                block_fn((0, &mut y.data), out);
            } else {
                y.data.par_chunks_mut(block).enumerate().for_each(|c| block_fn(c, block));
            }
            return y;
        }
        // A verify pass: each block's [block, rows] is turned into its segments of the output
        // rows by the thread that computed it, while it is in cache (a separate pass over the
        // LM head's 4 × 248k logits cost several percent of the pass).
        let mut segments: Vec<Vec<&mut [f32]>> = (0..out.div_ceil(block)).map(|_| Vec::with_capacity(rows)).collect();
        for row in y.data.chunks_mut(out) {
            for (b, seg) in row.chunks_mut(block).enumerate() {
                segments[b].push(seg);
            }
        }
        let work = |(bi, segs): (usize, Vec<&mut [f32]>)| {
            let n = segs.first().map_or(0, |s| s.len());
            let mut local = vec![0f32; n * rows];
            block_fn((bi, &mut local), block);
            for (r, seg) in segs.into_iter().enumerate() {
                seg.iter_mut().zip(local[r..].iter().step_by(rows)).for_each(|(d, s)| *d = *s);
            }
        };
        if small {
            segments.into_iter().enumerate().for_each(work);
        } else {
            segments.into_par_iter().enumerate().for_each(work);
        }
        y
    }

    fn all_bf16(&self) -> bool {
        self.parts.iter().all(|w| matches!(w, Weights::Bf16(_)))
    }

    /// FP8 parts, and bf16 ones beside them (the GDN's in_proj of an FP8 checkpoint: in_proj_a /
    /// in_proj_b stay bf16).
    fn fp8_with_bf16(&self) -> bool {
        self.parts.iter().any(|w| matches!(w, Weights::Fp8(_)))
            && self.parts.iter().all(|w| matches!(w, Weights::Fp8(_) | Weights::Bf16(_)))
    }

    /// The prefill GEMM at bf16 for FP8 weights on AMX: each weight `e4m3 · scale` split into two
    /// bf16 halves, `hi` (its leading 8 significant bits) and `lo` (the rest), and the product
    /// taken as `x · hi + x · lo` by two passes of the AMX GEMM, a block of output rows at a
    /// time (never a widened copy of the matrix). A bf16 part's `lo` is zero: its rows get the
    /// bits [`Linear::gemm_amx`] gives them. Exact for bf16 and f16 scales, whose products
    /// with an e4m3 value have at most 12 and 15 significant bits; f32 scales (Qwen3-Next's)
    /// keep 16 bits, 2^-16 relative. The activations are bf16 at this precision already.
    fn gemm_amx_fp8(&self, x: &Mat) -> Mat {
        let (inp, out, rows) = (self.in_features, self.out_features, x.rows);
        let tokens = amx::Tokens::new(&x.data, rows, inp);
        let mut y = vec![0f32; rows * out];
        let block = (WIDEN_BLOCK_VALUES / inp).max(32).min(out) / 32 * 32;
        let block = block.max(32);
        let (mut hi, mut lo) = (vec![0u16; block * inp], vec![0u16; block * inp]);
        let (mut y_hi, mut y_lo) = (vec![0f32; rows * block], vec![0f32; rows * block]);
        for o0 in (0..out).step_by(block) {
            let n = block.min(out - o0);
            let (hi, lo) = (&mut hi[..n * inp], &mut lo[..n * inp]);
            let halves = hi.par_chunks_mut(inp).zip(lo.par_chunks_mut(inp)).enumerate();
            halves.for_each_init(
                || vec![0f32; inp],
                |wide, (r, (h, l))| {
                    if let Some((w, at, _)) = self.spans(o0 + r, 1).next() {
                        w.widen_to(at * inp, wide);
                    }
                    for ((h, l), v) in h.iter_mut().zip(l.iter_mut()).zip(wide.iter()) {
                        let top = v.to_bits() & 0xFFFF_0000;
                        *h = (top >> 16) as u16;
                        *l = ((v - f32::from_bits(top)).to_bits() >> 16) as u16;
                    }
                },
            );
            let (y_hi, y_lo) = (&mut y_hi[..rows * n], &mut y_lo[..rows * n]);
            amx::gemm(&tokens, n, |o| &hi[o * inp..(o + 1) * inp], y_hi);
            amx::gemm(&tokens, n, |o| &lo[o * inp..(o + 1) * inp], y_lo);
            for t in 0..rows {
                let dst = &mut y[t * out + o0..t * out + o0 + n];
                for ((d, a), b) in dst.iter_mut().zip(&y_hi[t * n..(t + 1) * n]).zip(&y_lo[t * n..(t + 1) * n]) {
                    *d = a + b;
                }
            }
        }
        Mat::from_vec(rows, out, y)
    }

    /// The prefill GEMM on bf16 activations and bf16 weights (`vdpbf16ps`, [`gemm_bf16`]): the
    /// weights are read as stored, a panel of rows at a time, never widened.
    fn gemm_bf16(&self, x: &Mat) -> Result<Mat> {
        let (inp, out) = (self.in_features, self.out_features);
        let packed = gemm_bf16::PackedTokens::new(&x.data, x.rows, inp);
        let mut y = vec![0f32; x.rows * out];
        gemm_bf16::gemm(&packed, inp, out, |o| self.bf16_row(o), &mut y);
        Ok(Mat::from_vec(x.rows, out, y))
    }

    /// The prefill GEMM at bf16 for FP8 weights with `vdpbf16ps` ([`gemm_bf16::gemm_split`]):
    /// each thread dequantises a panel of 32 rows and splits it into bf16 halves, as
    /// [`Linear::gemm_amx_fp8`] does for the AMX tiles; bf16 parts keep [`Linear::gemm_bf16`]'s
    /// bits.
    fn gemm_bf16_fp8(&self, x: &Mat) -> Mat {
        let (inp, out) = (self.in_features, self.out_features);
        let packed = gemm_bf16::PackedTokens::new(&x.data, x.rows, inp);
        let mut y = vec![0f32; x.rows * out];
        let widen = |o: usize, row: &mut [f32]| {
            if let Some((w, at, _)) = self.spans(o, 1).next() {
                w.widen_to(at * inp, row);
            }
        };
        gemm_bf16::gemm_split(&packed, inp, out, widen, &mut y);
        Mat::from_vec(x.rows, out, y)
    }

    /// The prefill GEMM on AMX tiles ([`amx::gemm`]): each output has the bits the decode
    /// GEMV gives it, the weights read as stored.
    fn gemm_amx(&self, x: &Mat) -> Mat {
        let (inp, out) = (self.in_features, self.out_features);
        let tokens = amx::Tokens::new(&x.data, x.rows, inp);
        let mut y = vec![0f32; x.rows * out];
        amx::gemm(&tokens, out, |o| self.bf16_row(o), &mut y);
        Mat::from_vec(x.rows, out, y)
    }

    /// Weight row `o` as stored (only for all-bf16 weights).
    fn bf16_row(&self, o: usize) -> &[u16] {
        let inp = self.in_features;
        match self.spans(o, 1).next() {
            Some((Weights::Bf16(v), at, _)) => &v[at * inp..(at + 1) * inp],
            _ => unreachable!("all parts are bf16 (checked by the caller)"),
        }
    }

    /// [`Linear::dots`] for bf16 (and FP8) weights against bf16 activations.
    fn pair_dots(&self, o0: usize, k: usize, x: &PairRows, out: &mut [f32]) {
        let inp = self.in_features;
        let mut out = out;
        for (w, at, n) in self.spans(o0, k) {
            let (mine, rest) = std::mem::take(&mut out).split_at_mut(n * x.rows());
            out = rest;
            match w {
                Weights::Bf16(v) => gemv::pairs_rows(&v[at * inp..(at + n) * inp], x, mine),
                Weights::Fp8(f) => {
                    let rows = gemv::Fp8Rows { q: &f.q[at * inp..(at + n) * inp], grid: &f.scales, row0: f.row0 + at };
                    gemv::fp8_pairs_rows(rows, inp, x, mine)
                }
                _ => unreachable!("pair rows are made for bf16 and FP8 weights only (checked by the caller)"),
            }
        }
    }

    /// The GEMM candle runs on the CPU (`gemm`, called with candle's arguments, so the bits are
    /// candle's): f32 weights are read in place, bf16 / f16 widened a block of output rows at a
    /// time on all threads (never a second copy of the whole matrix; FP8 and GGUF quantised blocks
    /// dequantised the same way, exactly); each block's product is
    /// written straight into its columns of `y`. Blocks do not change the bits: each output is
    /// one dot product over the input features either way.
    fn gemm(&self, x: &Mat) -> Result<Mat> {
        let (inp, out, m) = (self.in_features, self.out_features, x.rows);
        let mut y = vec![0f32; m * out];
        let mut widened = vec![];
        for (i, w) in self.parts.iter().enumerate() {
            let rows = self.starts[i + 1] - self.starts[i];
            // The same blocks for every dtype: gemm's kernel choice depends on the block's
            // width, so f32 storage gives the bits of bf16 storage only with equal blocks.
            let block = (WIDEN_BLOCK_VALUES / inp).max(16).min(rows);
            for r0 in (0..rows).step_by(block) {
                let n = block.min(rows - r0);
                if let Weights::F32(v) = w {
                    product(x, &v[r0 * inp..(r0 + n) * inp], n, &mut y, out, self.starts[i] + r0);
                    continue;
                }
                widened.resize(n * inp, 0.0);
                widened
                    .par_chunks_mut(WIDEN_CHUNK_VALUES)
                    .enumerate()
                    .for_each(|(c, d)| w.widen_to(r0 * inp + c * WIDEN_CHUNK_VALUES, d));
                product(x, &widened, n, &mut y, out, self.starts[i] + r0);
            }
        }
        Ok(Mat::from_vec(m, out, y))
    }
}

/// The `gemm` crate cuts a long sum (the inner dimension `k`) into equal blocks of at most
/// `kc` and adds block after block, with `kc` taken from the L1 cache's size and associativity:
/// 512 on the EPYCs, 1024 on a Xeon with a 48 KiB 12-way L1. Left to choose, it would round the
/// same product differently on different machines (on any layer wider than 512). The GEMMs here
/// hand it the blocks it picks where `kc` is 512 — as many as `k` needs at 512 each, equal in
/// size — and accumulate them in order, so every machine adds in the same places.
const GEMM_DEPTH: usize = 512;

/// `(start, len)` of each depth block of a sum over `k` (see [`GEMM_DEPTH`]).
fn depth_blocks(k: usize) -> impl Iterator<Item = (usize, usize)> {
    let len = k.div_ceil(k.div_ceil(GEMM_DEPTH).max(1)).max(1);
    (0..k).step_by(len).map(move |start| (start, len.min(k - start)))
}

/// `y[:, col..col + n] = x · wᵀ` for `w: [n, k]` row-major and `y: [m, out]`.
fn product(x: &Mat, w: &[f32], n: usize, y: &mut [f32], out: usize, col: usize) {
    let (m, k) = (x.rows, x.cols);
    assert!(w.len() == n * k && x.data.len() == m * k && col + n <= out && y.len() == m * out);
    let threads = rayon::current_num_threads();
    let parallelism = if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None };
    for (i, (k0, kn)) in depth_blocks(k).enumerate() {
        // SAFETY: the pointers and strides describe `x[:, k0..k0 + kn]` (row stride k), `wᵀ`'s
        // rows k0..k0 + kn (w read with row stride 1 and column stride k, from column k0) and
        // the columns col..col + n of `y` [m, out], all in bounds (checked above, k0 + kn ≤ k);
        // `y` is borrowed mutably, so nothing else reads or writes it meanwhile.
        unsafe {
            gemm::gemm(
                m,
                n,
                kn,
                y.as_mut_ptr().add(col),
                1,
                out as isize,
                i > 0,
                x.data.as_ptr().add(k0),
                1,
                k as isize,
                w.as_ptr().add(k0),
                k as isize,
                1,
                if i > 0 { 1.0 } else { 0.0 },
                1.0,
                false,
                false,
                false,
                parallelism,
            )
        }
    }
}

/// `dst[m, n] = alpha·dst + beta·lhs·rhs` (`alpha` `None`: dst is not read) on the calling
/// thread, with the GEMM's SIMD kernels; each matrix is `(data, row stride, column stride)`
/// and `dst` is row-major with row stride `dst_rs`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn small_gemm(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    dst_rs: usize,
    alpha: Option<f32>,
    lhs: (&[f32], usize, usize),
    rhs: (&[f32], usize, usize),
    beta: f32,
) {
    let end = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs + 1;
    assert!(m > 0 && n > 0 && k > 0);
    assert!(dst.len() >= end(m, n, dst_rs, 1) && lhs.0.len() >= end(m, k, lhs.1, lhs.2));
    assert!(rhs.0.len() >= end(k, n, rhs.1, rhs.2));
    // The same depth blocks on every machine ([`GEMM_DEPTH`]); the first honours `alpha`, the
    // rest add to what the ones before wrote.
    for (i, (k0, kn)) in depth_blocks(k).enumerate() {
        let (read, keep) = if i == 0 { (alpha.is_some(), alpha.unwrap_or(0.0)) } else { (true, 1.0) };
        // SAFETY: every index the product touches is in bounds of its slice (checked above: the
        // block reads lhs columns and rhs rows k0..k0 + kn, k0 + kn ≤ k); `dst` is borrowed
        // mutably and the inputs immutably, so they do not alias.
        unsafe {
            gemm::gemm(
                m,
                n,
                kn,
                dst.as_mut_ptr(),
                1,
                dst_rs as isize,
                read,
                lhs.0.as_ptr().add(k0 * lhs.2),
                lhs.2 as isize,
                lhs.1 as isize,
                rhs.0.as_ptr().add(k0 * rhs.1),
                rhs.2 as isize,
                rhs.1 as isize,
                keep,
                beta,
                false,
                false,
                false,
                gemm::Parallelism::None,
            )
        }
    }
}

/// Values one thread widens at a time for a prefill block (64 KiB of f32: small enough to
/// split a block across both cores, large enough that the hand-off is noise).
const WIDEN_CHUNK_VALUES: usize = 1 << 14;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::storage::bf16_to_f32;

    /// The GPU upload's rows: across the parts of a fused layer, bf16 parts as stored, f32
    /// parts rounded to nearest even.
    #[test]
    fn bf16_rows_span_fused_parts_and_round_f32() {
        let one = half::bf16::from_f32(1.0).to_bits();
        let a = Weights::bf16(vec![one, 2, 3, 4, 5, 6]); // 3 rows of 2
        // 1 + 2⁻⁹ rounds to 1 (a tie to even); 1 + 3·2⁻⁹ rounds up to 1 + 2⁻⁷.
        let b = Weights::f32(vec![1.0 + 2f32.powi(-9), 1.0 + 3.0 * 2f32.powi(-9), -2.0, 0.5]);
        let l = Linear::fused(vec![(a, 3), (b, 2)], 2).unwrap();
        let bits = |x: f32| half::bf16::from_f32(x).to_bits();
        assert_eq!(
            l.bf16_rows(0, 5),
            vec![one, 2, 3, 4, 5, 6, bits(1.0), bits(1.0 + 2f32.powi(-7)), bits(-2.0), bits(0.5)]
        );
        // A window across the seam of the parts.
        assert_eq!(l.bf16_rows(2, 2), vec![5, 6, bits(1.0), bits(1.0 + 2f32.powi(-7))]);
    }

    #[test]
    fn gemv_and_gemm_agree_with_naive() {
        let (out, inp) = (37, 53);
        let w: Vec<f32> = (0..out * inp).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
        let lin = Linear::new(w.clone(), out, inp).unwrap();
        // The same matrix as a fused projection of three parts (rows 0..5, 5..30, 30..37).
        let part = |a: usize, b: usize| (Weights::f32(w[a * inp..b * inp].to_vec()), b - a);
        let fused = Linear::fused(vec![part(0, 5), part(5, 30), part(30, out)], inp).unwrap();
        assert_eq!(fused.out_features, out);
        assert_eq!(fused.row(7).unwrap(), lin.row(7).unwrap());
        for (rows, lin) in [1, 3, 8, 9, 20].into_iter().flat_map(|r| [(r, &lin), (r, &fused)]) {
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

    /// FP8 prefill at bf16 where the CPU has AMX or `vdpbf16ps`: the bf16 halves of each
    /// dequantised weight (two tile passes; two `vdpbf16ps` a pair) give the product of the
    /// exact weights with the bf16 activations, to f32 accumulation's rounding (1e-5 of the
    /// row's largest output; the leading halves alone are off by ~2^-9). The layer's own
    /// prefill at bf16 (whichever GEMM this CPU runs, rounded to bf16) is checked against the
    /// same reference.
    #[test]
    fn fp8_prefill_at_bf16_is_the_product_of_the_dequantised_weights() {
        use crate::model::fp8::{Fp8Weights, quantize};
        // Not multiples of 32 (partial panels and input tails); several row blocks.
        let (out, inp, rows) = (4100usize, 530usize, 37usize);
        let w: Vec<f32> =
            (0..out * inp).map(|i| ((i * 7919 % 1009) as f32 / 504.5 - 1.0) * (1.0 + (i / inp % 7) as f32)).collect();
        let (q, scales) = quantize(&w, out, inp);
        let fp8 = Fp8Weights {
            q: q.into(),
            scales: scales.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect(),
            cols: inp,
            row0: 0,
        };
        let mut exact = vec![0f32; out * inp];
        fp8.dequantize_to(0, &mut exact);
        let lin = Linear::from_weights(Weights::Fp8(fp8), out, inp).unwrap();
        let x: Vec<f32> =
            (0..rows * inp).map(|i| half::bf16::from_f32(((i * 31 % 97) as f32 / 48.0 - 1.0) * 0.7).to_f32()).collect();
        let xm = Mat::from_vec(rows, inp, x.clone());
        let reference =
            |r: usize, o: usize| -> f64 { (0..inp).map(|i| exact[o * inp + i] as f64 * x[r * inp + i] as f64).sum() };
        let check = |y: &Mat, tol: f64, what: &str| {
            for r in 0..rows {
                let want: Vec<f64> = (0..out).map(|o| reference(r, o)).collect();
                let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
                for (o, w) in want.iter().enumerate() {
                    let d = (y.row(r)[o] as f64 - w).abs();
                    assert!(
                        d <= tol * scale,
                        "{what}: row {r} output {o}: {} against {w} (scale {scale})",
                        y.row(r)[o]
                    );
                }
            }
        };
        if lin.pairs == PairKernel::Amx {
            check(&lin.gemm_amx_fp8(&xm), 1e-5, "AMX halves");
        }
        if gemm_bf16::available() {
            check(&lin.gemm_bf16_fp8(&xm), 1e-5, "vdpbf16ps halves");
        }
        check(&lin.forward(&xm, Precision::Bf16).unwrap(), 1.0 / 128.0, "the layer at bf16");
    }

    /// A layer big enough for the threaded GEMV (several blocks, the last one short): every row
    /// of a multi-row call lands in its place with the bits that row gets alone, at f32 and at
    /// bf16 (where AMX tiles or `vdpbf16ps` run), and near the plain sum.
    #[test]
    fn threaded_gemv_rows_land_in_place_with_their_own_bits() {
        // Whole 32-input blocks; a tail past the last block; a fused layer whose part boundary
        // falls inside a thread's block (a block's outputs are computed part by part).
        for (out, inp, fused) in [(1003, 96, false), (1003, 100, false), (1003, 96, true)] {
            threaded_gemv_rows_case(out, inp, fused);
        }
    }

    fn threaded_gemv_rows_case(out: usize, inp: usize, fused: bool) {
        assert!(out * inp >= PARALLEL_MIN_WEIGHTS);
        let bits: Vec<u16> =
            (0..out * inp).map(|i| half::bf16::from_f32(((i * 7919) % 2003) as f32 / 1000.0 - 1.0).to_bits()).collect();
        let lin = if fused {
            let first = 517;
            let parts = vec![
                (Weights::bf16(bits[..first * inp].to_vec()), first),
                (Weights::bf16(bits[first * inp..].to_vec()), out - first),
            ];
            Linear::fused(parts, inp).unwrap()
        } else {
            Linear::from_weights(Weights::bf16(bits.clone()), out, inp).unwrap()
        };
        for prec in [Precision::F32, Precision::Bf16] {
            for rows in [2, 3, 5, 8] {
                let x: Vec<f32> = (0..rows * inp).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
                let y = lin.forward(&Mat::from_vec(rows, inp, x.clone()), prec).unwrap();
                for r in 0..rows {
                    let alone = lin.forward(&Mat::from_vec(1, inp, x[r * inp..(r + 1) * inp].to_vec()), prec).unwrap();
                    let same = alone.row(0).iter().zip(y.row(r)).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{prec:?} [{out}, {inp}] fused {fused} rows {rows}: row {r} differs from the same row alone"
                    );
                    for o in [0, 1, 500, out - 1] {
                        let want: f32 = (0..inp).map(|i| bf16_to_f32(bits[o * inp + i]) * x[r * inp + i]).sum();
                        assert!((y.row(r)[o] - want).abs() <= 0.02 * want.abs().max(1.0), "{prec:?} y[{r}][{o}]");
                    }
                }
            }
        }
    }

    /// A bf16 prefill (more rows than a GEMV takes) of a fused bf16 projection whose parts
    /// end inside a 32-feature panel: the `vdpbf16ps` GEMM where the CPU has it, bit for bit
    /// its reference sum; elsewhere the widening GEMM, within f32 rounding of the exact sum.
    #[test]
    fn bf16_prefill_of_a_fused_projection() {
        let (out, inp, rows) = (75, 96, 30);
        let bits: Vec<u16> =
            (0..out * inp).map(|i| half::bf16::from_f32(((i * 7919) % 2003) as f32 / 1000.0 - 1.0).to_bits()).collect();
        let part = |a: usize, b: usize| (Weights::bf16(bits[a * inp..b * inp].to_vec()), b - a);
        let fused = Linear::fused(vec![part(0, 5), part(5, 40), part(40, out)], inp).unwrap();
        let x: Vec<f32> =
            (0..rows * inp).map(|i| half::bf16::from_f32(((i * 31) % 17) as f32 / 8.0 - 1.0).to_f32()).collect();
        let xb: Vec<u16> = x.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
        let y = fused.forward(&Mat::from_vec(rows, inp, x.clone()), Precision::Bf16).unwrap();
        let dpbf16 = super::super::CpuKernel::active().dpbf16();
        assert_eq!(dpbf16, matches!(fused.pairs, PairKernel::Dpbf16 | PairKernel::Amx));
        for r in 0..rows {
            for o in 0..out {
                let (w, xr) = (&bits[o * inp..(o + 1) * inp], &xb[r * inp..(r + 1) * inp]);
                let got = y.row(r)[o];
                if dpbf16 {
                    let want = half::bf16::from_f32(gemm_bf16::reference(w, xr)).to_f32();
                    assert_eq!(got.to_bits(), want.to_bits(), "y[{r}][{o}]");
                } else {
                    let exact: f64 = (0..inp).map(|i| f64::from(bf16_to_f32(w[i]) * x[r * inp + i])).sum();
                    let want = half::bf16::from_f32(exact as f32).to_f32();
                    assert!((got - want).abs() <= want.abs() / 64.0 + 1e-3, "y[{r}][{o}]: {got} vs {want}");
                }
            }
        }
    }

    /// The f32 GEMM's sums are cut where the `gemm` crate cuts them on a 32 KiB-L1 machine, by
    /// the engine itself (equal blocks of at most 512), so every machine adds in the same
    /// places; a product over 1500 inputs (three blocks) and over a ragged 513 is the exact sum
    /// within f32 rounding, and a depth of 512 or less is one block.
    #[test]
    fn the_gemm_depth_is_cut_in_the_same_places_on_every_machine() {
        let blocks = |k| depth_blocks(k).collect::<Vec<_>>();
        assert_eq!(blocks(512), [(0, 512)]);
        assert_eq!(blocks(100), [(0, 100)]);
        assert_eq!(blocks(513), [(0, 257), (257, 256)]);
        assert_eq!(blocks(1024), [(0, 512), (512, 512)]);
        assert_eq!(blocks(1500), [(0, 500), (500, 500), (1000, 500)]);
        for k in [513, 1500] {
            let (m, n) = (20, 37);
            let x: Vec<f32> = (0..m * k).map(|i| ((i * 31 % 97) as f32 / 48.0 - 1.0) * 0.7).collect();
            let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919 % 2003) as f32 / 1000.0 - 1.0) * 0.3).collect();
            let lin = Linear::new(w.clone(), n, k).unwrap();
            let y = lin.forward(&Mat::from_vec(m, k, x.clone()), Precision::F32).unwrap();
            for r in 0..m {
                for o in 0..n {
                    let exact: f64 = (0..k).map(|i| f64::from(x[r * k + i]) * f64::from(w[o * k + i])).sum();
                    let scale: f64 = (0..k).map(|i| f64::from((x[r * k + i] * w[o * k + i]).abs())).sum();
                    let got = f64::from(y.row(r)[o]);
                    assert!((got - exact).abs() <= 1e-5 * scale.max(1.0), "k {k}: y[{r}][{o}] {got} vs {exact}");
                }
            }
        }
    }

    /// bf16 weights widened in the kernels give the bits of the same weights stored as f32:
    /// the GEMV on every instruction set this CPU has, and the prefill GEMM block by block.
    #[test]
    fn bf16_storage_gives_the_bits_of_f32_storage() {
        // More rows than one widened block holds (2048 of 1024 values), so the GEMM runs in
        // two blocks.
        let (out, inp) = (3000, 1024);
        let bits: Vec<u16> =
            (0..out * inp).map(|i| half::bf16::from_f32(((i * 7919) % 2003) as f32 / 1000.0 - 1.0).to_bits()).collect();
        let widened: Vec<f32> = bits.iter().map(|&b| bf16_to_f32(b)).collect();
        let as_f32 = Linear::new(widened.clone(), out, inp).unwrap();
        let as_bf16 = Linear::from_weights(Weights::bf16(bits.clone()), out, inp).unwrap();
        assert_eq!(as_bf16.weight_bytes() * 2, as_f32.weight_bytes());
        for rows in [1, 3, 8, 9, 40] {
            let x: Vec<f32> = (0..rows * inp).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
            let xm = Mat::from_vec(rows, inp, x);
            let (a, b) = (as_f32.forward(&xm, Precision::F32).unwrap(), as_bf16.forward(&xm, Precision::F32).unwrap());
            assert!(a.data.iter().zip(&b.data).all(|(p, q)| p.to_bits() == q.to_bits()), "rows {rows}");
        }
        // Fewer output rows than a widened block holds (a MoE router of 8 experts).
        let small = Linear::from_weights(Weights::bf16(bits[..8 * inp].to_vec()), 8, inp).unwrap();
        let small_f32 = Linear::new(widened[..8 * inp].to_vec(), 8, inp).unwrap();
        let xm = Mat::from_vec(20, inp, (0..20 * inp).map(|i| (i % 13) as f32 / 13.0).collect());
        assert_eq!(small.forward(&xm, Precision::F32).unwrap(), small_f32.forward(&xm, Precision::F32).unwrap());
        // A row's result does not depend on the other rows of its pass (an MTP verify pass
        // gives each token the bits of a one-token step).
        let x: Vec<f32> = (0..5 * inp).map(|i| (i as f32 * 0.37).sin()).collect();
        let five = as_bf16.forward(&Mat::from_vec(5, inp, x.clone()), Precision::F32).unwrap();
        for r in 0..5 {
            let one =
                as_bf16.forward(&Mat::from_vec(1, inp, x[r * inp..(r + 1) * inp].to_vec()), Precision::F32).unwrap();
            assert_eq!(one.row(0), five.row(r), "row {r}");
        }
    }

    #[test]
    fn bf16_rounding_matches_half() {
        let x = 1.0f32 + 3.0 * 2f32.powi(-9); // halfway-ish between two bf16 values
        assert_eq!(Precision::Bf16.round(x), half::bf16::from_f32(x).to_f32());
        assert_eq!(Precision::F32.round(x), x);
    }
}
