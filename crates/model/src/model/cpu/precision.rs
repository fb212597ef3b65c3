//! The activation precision: f32 everywhere, or the bf16 cast points of the transformers
//! reference (model-spec §3.9), and the rounding of one value to it. Below the maths
//! (math.rs) and the matrices (tensor.rs), which both round through it.

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
            Precision::Bf16 => round_bf16(x),
        }
    }
}

/// `x` rounded to the nearest bf16 (ties to even), as an f32: the bits of
/// `half::bf16::from_f32(x).to_f32()`, NaN made quiet as it does.
#[inline(always)]
pub(crate) fn round_bf16(x: f32) -> f32 {
    let b = x.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) & 0xffff_0000;
    let nan = (b & 0x7fff_ffff) > 0x7f80_0000;
    f32::from_bits(if nan { (b & 0xffff_0000) | 0x0040_0000 } else { rounded })
}
