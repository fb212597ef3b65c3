//! `--dtype`: which activation precision the CPU engine computes in, and — for `auto`, the
//! default — how it follows the checkpoint, as transformers' `dtype="auto"` does: a bf16
//! checkpoint runs bf16 (about 1.6× faster than f32 on CPUs with AVX512_BF16, and the precision
//! it was published in); `f32` is the exact-reference mode, asked for by name.

use crate::error::{Error, Result};
use crate::model::Precision;

/// What `--dtype` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DtypeChoice {
    /// The checkpoint's own dtype (config.json's `dtype` / `torch_dtype`).
    #[default]
    Auto,
    /// This precision whatever the checkpoint declares.
    Exact(Precision),
}

/// The precision a load runs at, and why, in words for `bench` and the logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedDtype {
    pub precision: Precision,
    pub why: String,
}

impl DtypeChoice {
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DtypeChoice::Auto),
            "f32" | "float32" | "bf16" | "bfloat16" => Ok(DtypeChoice::Exact(Precision::parse(s)?)),
            _ => Err(Error::InvalidArgument(format!(
                "unknown dtype \"{}\" (expected auto, f32 or bf16)",
                crate::error::brief(s)
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DtypeChoice::Auto => "auto",
            DtypeChoice::Exact(p) => p.name(),
        }
    }

    /// The precision for a checkpoint whose config.json declares `declared` (`None`: it names
    /// no dtype).
    pub fn resolve(self, declared: Option<&str>) -> ResolvedDtype {
        let (precision, why) = match self {
            DtypeChoice::Exact(p) => (p, format!("--dtype {}", p.name())),
            DtypeChoice::Auto => match declared {
                Some("bfloat16" | "bf16") => {
                    (Precision::Bf16, "auto: config.json declares bfloat16 (--dtype f32 for exact f32 math)".into())
                }
                Some(d @ ("float32" | "f32")) => (Precision::F32, format!("auto: config.json declares {d}")),
                // No f16 activation path: f32 holds every f16 value exactly, where bf16 would
                // round the weights' mantissas.
                Some(d @ ("float16" | "f16" | "half")) => (
                    Precision::F32,
                    format!("auto: config.json declares {d}; f32 holds it exactly (there is no f16 path)"),
                ),
                Some(d) => (Precision::F32, format!("auto: config.json declares {}, not bf16", crate::error::brief(d))),
                None => (Precision::F32, "auto: config.json declares no dtype".into()),
            },
        };
        ResolvedDtype { precision, why }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_the_checkpoint_and_names_why() {
        let r = DtypeChoice::Auto.resolve(Some("bfloat16"));
        assert_eq!(r.precision, Precision::Bf16);
        assert!(r.why.contains("declares bfloat16"), "{}", r.why);
        for (declared, said) in [
            (Some("float32"), "declares float32"),
            (Some("float16"), "there is no f16 path"),
            (None, "declares no dtype"),
            (Some("float8_e4m3fn"), "declares float8_e4m3fn, not bf16"),
        ] {
            let r = DtypeChoice::Auto.resolve(declared);
            assert_eq!(r.precision, Precision::F32, "{declared:?}");
            assert!(r.why.contains(said), "{declared:?}: {}", r.why);
        }
    }

    #[test]
    fn a_named_dtype_wins_over_the_checkpoint() {
        let r = DtypeChoice::parse("f32").unwrap().resolve(Some("bfloat16"));
        assert_eq!((r.precision, r.why.as_str()), (Precision::F32, "--dtype f32"));
        let r = DtypeChoice::parse("bfloat16").unwrap().resolve(None);
        assert_eq!(r.precision, Precision::Bf16);
        assert_eq!(DtypeChoice::parse("auto").unwrap(), DtypeChoice::Auto);
        let e = DtypeChoice::parse("fp8").unwrap_err().to_string();
        assert!(e.contains("\"fp8\"") && e.contains("auto, f32 or bf16"), "{e}");
    }
}
