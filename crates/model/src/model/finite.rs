//! Where NaN / ±Inf first appear in a forward pass.
//!
//! A broken kernel, a corrupt checkpoint or a bad `rms_norm_eps` shows up first as a non-finite
//! value in one sublayer's output; a few layers later every activation is NaN and the sampler
//! emits one token over and over, which looks like a loop. So the forward pass checks each
//! sublayer's output as it goes (one pass over the activations, no copy: a few hundred floats per
//! layer when decoding, against the millions of multiply-adds of the layer itself) and stops at
//! the first one, naming it.

use super::cpu::tensor::Mat;
use crate::error::{Error, Result};
pub(crate) use crate::error::{NonFinite, Sublayer};

/// The first row of `m` holding a NaN or ±Inf, and that value.
///
/// One pass, branch-free per element so it vectorises: an f32 is non-finite exactly when its
/// exponent bits are all ones.
// Not inlined, so a profiler books its cost here (README: "what the check costs").
#[inline(never)]
pub(crate) fn first_nonfinite_row(m: &Mat) -> Option<(usize, f32)> {
    const EXP: u32 = 0x7f80_0000;
    let bad = m.data.iter().fold(0u32, |acc, v| acc | ((v.to_bits() & EXP) == EXP) as u32);
    if bad == 0 {
        return None;
    }
    let i = m.data.iter().position(|v| !v.is_finite())?;
    Some((i / m.cols.max(1), m.data[i]))
}

/// Checks `m` (rows at positions `pos0..`, tokens `ids`): a non-finite row fails with
/// [`Error::NonFinite`] naming `sublayer` of `layer`.
pub(crate) fn check(m: &Mat, layer: Option<usize>, sublayer: Sublayer, pos0: usize, ids: &[u32]) -> Result<()> {
    match first_nonfinite_row(m) {
        None => Ok(()),
        Some((row, value)) => Err(Error::NonFinite(NonFinite {
            layer,
            sublayer,
            position: pos0 + row,
            token: ids.get(row).copied().unwrap_or(0),
            value,
            state_head: None,
        })),
    }
}

/// A block that reports only its row (the MoE router, `layer: None`, position = row) is placed
/// by its caller: `label` fills in which part it was, then the position and token follow from
/// `pos0` and `ids`. Other errors pass through.
pub(crate) fn place(e: Error, pos0: usize, ids: &[u32], label: impl FnOnce(&mut NonFinite)) -> Error {
    match e {
        Error::NonFinite(mut nf) if nf.layer.is_none() => {
            nf.token = ids.get(nf.position).copied().unwrap_or(0);
            nf.position += pos0;
            label(&mut nf);
            Error::NonFinite(nf)
        }
        e => e,
    }
}

/// Beyond this magnitude a weight is reported as out of range: trained weights (norm scales,
/// `A_log` and `dt_bias` included) sit far below it, and a value this large is a corrupt or
/// mis-scaled tensor (or one that overflows f16, whose largest value is 65 504).
pub const SUSPICIOUS_ABS: f32 = 1.0e4;

/// What a scan found in one tensor.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TensorHealth {
    pub name: String,
    pub elements: usize,
    pub nan: usize,
    pub pos_inf: usize,
    pub neg_inf: usize,
    /// The largest finite |x|.
    pub max_abs: f32,
    /// Finite values with |x| > [`SUSPICIOUS_ABS`].
    pub out_of_range: usize,
}

impl TensorHealth {
    pub fn of(name: &str, values: &[f32]) -> Self {
        let mut h = TensorHealth {
            name: name.to_string(),
            elements: values.len(),
            nan: 0,
            pos_inf: 0,
            neg_inf: 0,
            max_abs: 0.0,
            out_of_range: 0,
        };
        for &v in values {
            if v.is_nan() {
                h.nan += 1;
            } else if v == f32::INFINITY {
                h.pos_inf += 1;
            } else if v == f32::NEG_INFINITY {
                h.neg_inf += 1;
            } else {
                h.max_abs = h.max_abs.max(v.abs());
                h.out_of_range += (v.abs() > SUSPICIOUS_ABS) as usize;
            }
        }
        h
    }

    pub fn nonfinite(&self) -> usize {
        self.nan + self.pos_inf + self.neg_inf
    }

    pub fn is_healthy(&self) -> bool {
        self.nonfinite() == 0 && self.out_of_range == 0
    }
}

/// Reads every tensor of `store` (one at a time) and reports each, in name order.
pub fn scan_weights(store: &super::weights::WeightStore) -> crate::error::Result<Vec<TensorHealth>> {
    let mut names: Vec<String> = store.names().map(str::to_string).collect();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let shape = store.shape(&name).unwrap_or(&[]).to_vec();
        let values = store.load_f32(&name, &shape)?;
        out.push(TensorHealth::of(&name, &values));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_bad_row_and_its_kind() {
        let mut m = Mat::zeros(3, 4);
        assert_eq!(first_nonfinite_row(&m), None);
        m.data[9] = f32::NEG_INFINITY;
        m.data[11] = f32::NAN;
        assert_eq!(first_nonfinite_row(&m), Some((2, f32::NEG_INFINITY)));
        m.data[5] = f32::NAN;
        let (row, v) = first_nonfinite_row(&m).unwrap();
        assert!(row == 1 && v.is_nan());
        // Large but finite values are fine.
        let big = Mat::from_vec(1, 2, vec![f32::MAX, -f32::MAX]);
        assert_eq!(first_nonfinite_row(&big), None);
    }

    #[test]
    fn names_the_layer_the_position_and_what_to_check() {
        let mut m = Mat::zeros(2, 2);
        m.data[3] = f32::INFINITY;
        let Err(Error::NonFinite(nf)) = check(&m, Some(3), Sublayer::Mlp, 10, &[7, 8]) else { panic!("not caught") };
        assert_eq!((nf.position, nf.token), (11, 8));
        assert_eq!(nf.to_string(), "+Inf first appeared in layer 3's MLP output at sequence position 11 (token id 8)");
        assert!(nf.advice().contains("layers.3.mlp.*"), "{}", nf.advice());
    }

    #[test]
    fn a_tensor_scan_counts_each_kind() {
        let h = TensorHealth::of("w", &[1.0, f32::NAN, f32::INFINITY, -2e5, f32::NEG_INFINITY, f32::NAN, -3.0]);
        assert_eq!((h.nan, h.pos_inf, h.neg_inf, h.out_of_range, h.elements), (2, 1, 1, 1, 7));
        assert_eq!(h.max_abs, 2e5);
        assert!(!h.is_healthy());
        assert!(TensorHealth::of("ok", &[0.5, -0.25]).is_healthy());
    }
}
