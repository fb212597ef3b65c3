//! FP8 checkpoints as Qwen publishes them (`quantization_config.quant_method: "fp8"`): each
//! quantised projection's `*.weight` holds one `float8_e4m3fn` byte a weight (safetensors
//! `F8_E4M3`), and `*.weight_scale_inv` one multiplier per 128 × 128 block (shape
//! `[ceil(out / 128), ceil(in / 128)]`, BF16, F16 or F32 by release; element `(r, c)` uses
//! block `(r / 128, c / 128)`, the last blocks partial). A weight's value is
//! `e4m3(q) · scale_inv` — a multiplier despite the name (DeepSeek-V3's `weight_dequant`,
//! transformers' `FineGrainedDequantize`, llama.cpp's converter). The research behind this,
//! with what was read where: `docs/fp8-checkpoints.md`.
//!
//! deltascope keeps the bytes as stored (a view into the mapped file) and dequantises inside
//! the kernels, so a weight costs one byte in memory and in every token's pass.

use std::sync::Arc;

use super::values::Values;

pub use super::fp8_codes::BLOCK;
#[cfg(test)]
use super::fp8_codes::is_nan_code;
use super::fp8_codes::{E4M3, E4M3_MAX, f32_to_e4m3};

/// What `quantization_config` says, once checked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Fp8Format {
    /// `modules_to_not_convert` (or vLLM's `ignored_layers`): the modules stored unquantised.
    /// The loader goes by each tensor's dtype and uses the list only to check it.
    pub modules_to_not_convert: Vec<String>,
}

/// A matrix (or a band of its rows) of e4m3 codes and the block scales of the whole matrix.
#[derive(Debug, PartialEq)]
pub struct Fp8Weights {
    /// Codes, row-major, `cols` a row: the rows of this view.
    pub q: Values<u8>,
    /// The whole matrix's scale grid, row-major `[ceil(rows / 128), ceil(cols / 128)]`, as f32.
    pub scales: Arc<[f32]>,
    pub cols: usize,
    /// The first row of this view within the whole matrix (its scale band is `row / 128`).
    pub row0: usize,
}

impl Fp8Weights {
    pub fn grid_cols(&self) -> usize {
        self.cols.div_ceil(BLOCK)
    }

    pub fn rows(&self) -> usize {
        self.q.len().checked_div(self.cols).unwrap_or(0)
    }

    /// The scales of row `r` of this view: one per 128 columns.
    pub fn row_scales(&self, r: usize) -> &[f32] {
        let (band, gc) = ((self.row0 + r) / BLOCK, self.grid_cols());
        &self.scales[band * gc..(band + 1) * gc]
    }

    /// Rows `r0..r0 + rows` of this view (no copy).
    pub fn rows_view(&self, r0: usize, rows: usize) -> Fp8Weights {
        Fp8Weights {
            q: self.q.range(r0 * self.cols, rows * self.cols),
            scales: Arc::clone(&self.scales),
            cols: self.cols,
            row0: self.row0 + r0,
        }
    }

    /// Bytes held: the codes, and the scales of the row bands this view covers.
    pub fn bytes(&self) -> usize {
        let rows = self.rows();
        let bands = if rows == 0 { 0 } else { (self.row0 + rows - 1) / BLOCK - self.row0 / BLOCK + 1 };
        self.q.len() + bands * self.grid_cols() * std::mem::size_of::<f32>()
    }

    /// Values `start..start + out.len()` (flat, row-major) dequantised to f32: `e4m3 · scale`,
    /// one rounding, as transformers dequantises at `dtype=float32`.
    pub fn dequantize_to(&self, start: usize, out: &mut [f32]) {
        let cols = self.cols;
        let mut i = start;
        let mut out = out;
        while !out.is_empty() {
            let (r, c) = (i / cols, i % cols);
            let scales = self.row_scales(r);
            let n = out.len().min(cols - c);
            let (row, rest) = std::mem::take(&mut out).split_at_mut(n);
            crate::model::cpu::dequant::fp8_row(crate::model::cpu::Simd::detect(), &self.q[i..i + n], scales, c, row);
            out = rest;
            i += n;
        }
    }
}

/// Rows of one or more FP8 matrices of the same width stacked for a device, each row keeping
/// its own matrix's scales: `band[r]` is the row of `scales` (`grid_cols` a row) holding row
/// `r`'s. A GPU upload cuts and stacks checkpoint matrices (the q / k / v rows of a fused
/// projection, Qwen3-Next's per-head pieces of in_proj_qkvz, every expert of a MoE block), and
/// a row's 128-row band in the stack need not be its band in the checkpoint.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Fp8Stack {
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub band: Vec<i32>,
    pub grid_cols: usize,
}

impl Fp8Stack {
    /// Appends every row of `w` (a view), with the scale rows of the bands it covers.
    pub fn push(&mut self, w: &Fp8Weights) {
        let rows = w.rows();
        if rows == 0 {
            return;
        }
        if self.band.is_empty() {
            self.grid_cols = w.grid_cols();
        }
        assert_eq!(self.grid_cols, w.grid_cols(), "Fp8Stack: rows of {} columns after rows of another width", w.cols);
        let (first, last) = (w.row0 / BLOCK, (w.row0 + rows - 1) / BLOCK);
        let base = (self.scales.len() / self.grid_cols.max(1)) as i64 - first as i64;
        self.scales.extend_from_slice(&w.scales[first * self.grid_cols..(last + 1) * self.grid_cols]);
        self.band.extend((w.row0..w.row0 + rows).map(|r| (base + (r / BLOCK) as i64) as i32));
        self.codes.extend_from_slice(&w.q);
    }

    /// Appends another stack's rows (the next expert).
    pub fn append(&mut self, other: &Fp8Stack) {
        if other.band.is_empty() {
            return;
        }
        if self.band.is_empty() {
            self.grid_cols = other.grid_cols;
        }
        assert_eq!(self.grid_cols, other.grid_cols, "Fp8Stack: stacks of different widths");
        let base = (self.scales.len() / self.grid_cols.max(1)) as i32;
        self.scales.extend_from_slice(&other.scales);
        self.band.extend(other.band.iter().map(|b| b + base));
        self.codes.extend_from_slice(&other.codes);
    }

    pub fn rows(&self) -> usize {
        self.band.len()
    }

    /// Row `r`'s weight `c` dequantised (`e4m3 · scale`, one rounding).
    pub fn value(&self, r: usize, cols: usize, c: usize) -> f32 {
        E4M3[self.codes[r * cols + c] as usize] * self.scales[self.band[r] as usize * self.grid_cols + c / BLOCK]
    }

    /// Bytes on a device: a byte a code, four a scale and a row's band index.
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len() + 4 * self.band.len()
    }
}

/// A row-major `[rows, cols]` f32 matrix quantised as Qwen's FP8 releases are: per 128 × 128
/// block, `scale_inv = amax / 448` rounded to bf16 (the family's scale dtype), and each value
/// the e4m3 code nearest to `x / scale_inv`. Returns the codes and the scales (bf16 bits,
/// row-major `[ceil(rows / 128), ceil(cols / 128)]`).
pub fn quantize(values: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<u16>) {
    assert_eq!(values.len(), rows * cols, "quantize: {} values for [{rows}, {cols}]", values.len());
    let (gr, gc) = (rows.div_ceil(BLOCK), cols.div_ceil(BLOCK));
    let mut scales = vec![0u16; gr * gc];
    let mut q = vec![0u8; values.len()];
    for br in 0..gr {
        let band = br * BLOCK..((br + 1) * BLOCK).min(rows);
        for bc in 0..gc {
            let span = bc * BLOCK..((bc + 1) * BLOCK).min(cols);
            let amax = band
                .clone()
                .flat_map(|r| values[r * cols + span.start..r * cols + span.end].iter())
                .fold(0f32, |m, v| m.max(v.abs()));
            // An all-zero block keeps a scale of 1 (any scale gives its zeros).
            let scale = half::bf16::from_f32(if amax > 0.0 { amax / E4M3_MAX } else { 1.0 });
            scales[br * gc + bc] = scale.to_bits();
            let s = scale.to_f32();
            for r in band.clone() {
                for c in span.clone() {
                    q[r * cols + c] = f32_to_e4m3(values[r * cols + c] / s);
                }
            }
        }
    }
    (q, scales)
}

/// [`quantize`] a band of 128 rows per task on every thread (the same bits: blocks never span
/// bands).
pub fn quantize_par(values: &[f32], rows: usize, cols: usize) -> (Vec<u8>, Vec<u16>) {
    use rayon::prelude::*;
    assert_eq!(values.len(), rows * cols, "quantize_par: {} values for [{rows}, {cols}]", values.len());
    if cols == 0 {
        return (vec![], vec![]);
    }
    let bands: Vec<(Vec<u8>, Vec<u16>)> =
        values.par_chunks(BLOCK * cols).map(|band| quantize(band, band.len() / cols, cols)).collect();
    let mut out = (Vec::with_capacity(values.len()), Vec::with_capacity(rows.div_ceil(BLOCK) * cols.div_ceil(BLOCK)));
    for (q, s) in bands {
        out.0.extend(q);
        out.1.extend(s);
    }
    out
}

/// Whether Qwen's FP8 releases store this tensor as e4m3 with block scales: the projections
/// (`*_proj.weight` matrices, and the GDN's `in_proj_qkv` / `in_proj_z` / `in_proj_qkvz`). The embeddings, the LM head, norms, the GDN's small `in_proj_a`
/// / `in_proj_b` / `in_proj_ba`, its conv and decay parameters, the MoE router and shared-expert
/// gate and `mtp.fc` stay as stored (docs/fp8-checkpoints.md §1).
pub fn quantised_in_fp8(name: &str, shape: &[usize]) -> bool {
    let Some(module) = name.strip_suffix(".weight") else { return false };
    let last = module.rsplit('.').next().unwrap_or(module);
    shape.len() == 2 && (last.ends_with("_proj") || matches!(last, "in_proj_qkv" | "in_proj_z" | "in_proj_qkvz"))
}

/// The modules of the tensors `kept` unquantised (their names less `.weight`; 3-D and other
/// non-`.weight` tensors are no modules), and `lm_head` when it is tied to the embedding (as
/// transformers adds it): the `modules_to_not_convert` list of a written FP8 checkpoint.
pub fn unconverted_modules<'a>(kept: impl Iterator<Item = &'a str>, tied_embeddings: bool) -> Vec<String> {
    let mut m: Vec<String> = kept.filter_map(|n| n.strip_suffix(".weight").map(str::to_string)).collect();
    if tied_embeddings {
        m.push("lm_head".into());
    }
    m
}

/// The `quantization_config` Qwen's FP8 releases carry, listing `unconverted` modules.
pub fn quantization_config(unconverted: &[String]) -> serde_json::Value {
    serde_json::json!({
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [BLOCK, BLOCK],
        "modules_to_not_convert": unconverted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_split_of_quantised_and_kept_tensors() {
        let m = |n: &str| quantised_in_fp8(n, &[256, 256]);
        for q in [
            "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
            "model.language_model.layers.0.linear_attn.in_proj_z.weight",
            "model.layers.0.linear_attn.in_proj_qkvz.weight",
            "model.layers.0.linear_attn.out_proj.weight",
            "model.layers.3.self_attn.q_proj.weight",
            "model.layers.3.mlp.down_proj.weight",
            "model.layers.3.mlp.experts.7.gate_proj.weight",
            "model.layers.3.mlp.shared_expert.up_proj.weight",
            "mtp.layers.0.self_attn.o_proj.weight",
        ] {
            assert!(m(q), "{q} is FP8 in Qwen's releases");
        }
        for kept in [
            "model.language_model.layers.0.linear_attn.in_proj_a.weight",
            "model.language_model.layers.0.linear_attn.in_proj_b.weight",
            "model.layers.0.linear_attn.in_proj_ba.weight",
            "model.embed_tokens.weight",
            "lm_head.weight",
            "model.layers.3.mlp.gate.weight",
            "model.layers.3.mlp.shared_expert_gate.weight",
            "mtp.fc.weight",
            "model.layers.0.linear_attn.conv1d.weight",
            "model.layers.0.input_layernorm.weight",
        ] {
            assert!(!m(kept), "{kept} stays unquantised");
        }
        assert!(!quantised_in_fp8("model.layers.3.mlp.experts.gate_up_proj", &[4, 8, 8]), "3-D, no .weight");
    }

    #[test]
    fn every_code_decodes_as_the_format_defines() {
        assert_eq!(E4M3[0x7E], 448.0);
        assert_eq!(E4M3[0xFE], -448.0);
        assert_eq!(E4M3[0x38], 1.0);
        assert_eq!(E4M3[0x01], 2f32.powi(-9));
        assert_eq!(E4M3[0x07], 7.0 * 2f32.powi(-9));
        assert_eq!(E4M3[0x08], 2f32.powi(-6));
        assert_eq!(E4M3[0x80].to_bits(), (-0f32).to_bits());
        assert!(E4M3[0x7F].is_nan() && E4M3[0xFF].is_nan());
        // The formula, code by code: (-1)^S · 2^(E-7) · (1 + M/8), or 2^-6 · M/8 when E = 0.
        for b in 0..=255u8 {
            if is_nan_code(b) {
                continue;
            }
            let (s, e, m) = (b >> 7, (b >> 3) & 0xF, b & 7);
            let mag =
                if e == 0 { m as f64 / 8.0 * 2f64.powi(-6) } else { (1.0 + m as f64 / 8.0) * 2f64.powi(e as i32 - 7) };
            let want = if s == 1 { -mag } else { mag };
            assert_eq!(E4M3[b as usize] as f64, want, "code {b:#04x}");
        }
    }

    #[test]
    fn encoding_rounds_to_the_nearest_code_ties_to_even_and_saturates() {
        for b in (0..=0xFEu8).filter(|&b| !is_nan_code(b)) {
            let back = f32_to_e4m3(E4M3[b as usize]);
            // -0 encodes as 0x80, +0 as 0x00: every code comes back as itself.
            assert_eq!(back, b, "code {b:#04x}");
        }
        // Between 1 (0x38) and 1.125 (0x39): below, above and at the midpoint (to 0x38, even).
        assert_eq!(f32_to_e4m3(1.05), 0x38);
        assert_eq!(f32_to_e4m3(1.07), 0x39);
        assert_eq!(f32_to_e4m3(1.0625), 0x38);
        // Between 1.125 (0x39) and 1.25 (0x3A), the midpoint goes up to the even 0x3A.
        assert_eq!(f32_to_e4m3(1.1875), 0x3A);
        assert_eq!(f32_to_e4m3(-1.1875), 0xBA);
        assert_eq!(f32_to_e4m3(1e6), 0x7E);
        assert_eq!(f32_to_e4m3(-500.0), 0xFE);
        assert_eq!(f32_to_e4m3(1e-9), 0x00);
    }

    #[test]
    fn a_quantised_matrix_dequantises_within_e4m3s_step_and_views_keep_their_scales() {
        let (rows, cols) = (130, 260); // partial last blocks both ways
        let values: Vec<f32> = (0..rows * cols).map(|i| ((i * 7919 % 1009) as f32 / 504.0 - 1.0) * 0.05).collect();
        let (q, s) = quantize(&values, rows, cols);
        assert_eq!(s.len(), 2 * 3);
        let scales: Arc<[f32]> = s.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect();
        let w = Fp8Weights { q: Values::Owned(q), scales, cols, row0: 0 };
        let mut out = vec![0f32; rows * cols];
        w.dequantize_to(0, &mut out);
        for (i, (&d, &v)) in out.iter().zip(&values).enumerate() {
            // e4m3 keeps 4 significant bits: a relative step of 2^-3, so half of it at most,
            // plus the subnormal floor of the block.
            let block = w.row_scales(i / cols)[(i % cols) / BLOCK];
            assert!((d - v).abs() <= v.abs() / 16.0 + block * 2f32.powi(-10), "value {i}: {v} came back {d}");
        }
        // A band of rows starting in the second block band reads that band's scales.
        let band = w.rows_view(128, 2);
        assert_eq!(band.row0, 128);
        let mut part = vec![0f32; 2 * cols];
        band.dequantize_to(0, &mut part);
        assert_eq!(part, out[128 * cols..]);
        // From the middle of a row, across a row end.
        let mut mid = vec![0f32; cols];
        w.dequantize_to(5 * cols + 7, &mut mid);
        assert_eq!(mid, out[5 * cols + 7..6 * cols + 7]);
        assert_eq!(w.bytes(), rows * cols + 6 * 4);
        assert_eq!(band.bytes(), 2 * cols + 3 * 4);
    }

    /// Stacked views keep each row's own scales: a view starting mid-band and one from another
    /// matrix dequantise as their sources do.
    #[test]
    fn a_stack_of_views_keeps_every_rows_scales() {
        let (rows, cols) = (300usize, 200usize);
        let values = |seed: f32| -> Vec<f32> {
            (0..rows * cols).map(|i| ((i as f32 * 0.37 + seed).sin()) * (1.0 + (i / cols) as f32)).collect()
        };
        let mk = |v: &[f32]| {
            let (q, s) = quantize(v, rows, cols);
            Fp8Weights {
                q: q.into(),
                scales: s.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect(),
                cols,
                row0: 0,
            }
        };
        let (a, b) = (mk(&values(0.0)), mk(&values(1.0)));
        let parts = [a.rows_view(100, 60), b.rows_view(250, 50), a.rows_view(0, 3)];
        let mut stack = Fp8Stack::default();
        for p in &parts {
            stack.push(p);
        }
        assert_eq!(stack.rows(), 113);
        let mut r = 0;
        for p in &parts {
            let mut want = vec![0f32; p.q.len()];
            p.dequantize_to(0, &mut want);
            for (i, w) in want.iter().enumerate() {
                assert_eq!(stack.value(r + i / cols, cols, i % cols).to_bits(), w.to_bits(), "part row {}", i / cols);
            }
            r += p.rows();
        }
        // 100..160 spans bands 0 and 1, 250..300 bands 1 and 2, 0..3 band 0: five scale rows.
        assert_eq!(stack.scales.len(), 5 * stack.grid_cols);
        assert_eq!(stack.bytes(), 113 * cols + 4 * 5 * 2 + 4 * 113);
    }
}
