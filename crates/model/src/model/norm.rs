//! Zero-centred RMSNorm (every norm of these models except the gated one inside GDN):
//! `y = x · rsqrt(mean(x²) + eps) · (1 + w)`, computed in f32 and rounded once.

use super::cpu::tensor::{Mat, Precision, dot};

pub struct RmsNorm {
    /// `1 + w` in f32 (transformers computes `1.0 + weight.float()`).
    scale: Vec<f32>,
    /// The stored parameter `w` (a GPU kernel forms `1 + w` itself, in f32 as here).
    weight: Vec<f32>,
    pub(crate) eps: f32,
}

impl RmsNorm {
    /// `weight` is the stored (zero-centred) parameter.
    pub fn zero_centred(weight: &[f32], eps: f64) -> Self {
        RmsNorm { scale: weight.iter().map(|w| 1.0 + w).collect(), weight: weight.to_vec(), eps: eps as f32 }
    }

    /// The stored (zero-centred) parameter.
    pub fn weight(&self) -> &[f32] {
        &self.weight
    }

    pub fn dim(&self) -> usize {
        self.scale.len()
    }

    /// Normalises one vector in place.
    #[inline]
    pub fn apply(&self, x: &mut [f32], prec: Precision) {
        let inv = rsqrt_mean_square(x, self.eps);
        for (v, s) in x.iter_mut().zip(&self.scale) {
            *v = prec.round((*v * inv) * s);
        }
    }

    pub fn forward(&self, x: &Mat, prec: Precision) -> Mat {
        let mut y = x.clone();
        y.for_rows(|_, row| self.apply(row, prec));
        y
    }
}

/// `1 / sqrt(mean(x²) + eps)` in f32.
#[inline]
pub(crate) fn rsqrt_mean_square(x: &[f32], eps: f32) -> f32 {
    let ms = dot(x, x) / x.len() as f32;
    1.0 / (ms + eps).sqrt()
}
