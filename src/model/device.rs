//! Which device computes: `--device cpu|cuda|cuda:N|cuda:N,M|emu|emu:N|emu:N,M|auto`.

use std::fmt;

use crate::error::{Error, Result};

/// What the user asked for with `--device`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceSpec {
    /// A GPU when one answers and the CUDA engine can run the model, else the CPU (saying why
    /// in one line). The default.
    #[default]
    Auto,
    Cpu,
    /// `cuda`: every visible GPU the plan needs; `cuda:0` / `cuda:0,1`: those ordinals.
    Cuda(Option<Vec<usize>>),
    /// `emu` / `emu:0,1`: the emulated CUDA device (the kernels compiled for this CPU, the CUDA
    /// model's host code unchanged): slow, for checking the GPU path without a GPU.
    Emu(Vec<usize>),
}

impl DeviceSpec {
    pub fn parse(s: &str) -> Result<Self> {
        let bad = |why: &str| {
            Error::InvalidArgument(format!(
                "--device {s:?}: {why} (expected cpu, cuda, cuda:0, cuda:0,1, emu, emu:0,1 or auto)"
            ))
        };
        let ordinals = |list: &str| -> Result<Vec<usize>> {
            let mut ordinals = vec![];
            for part in list.split(',') {
                let n: usize = part.trim().parse().map_err(|_| bad(&format!("{part:?} is not a device ordinal")))?;
                if ordinals.contains(&n) {
                    return Err(bad(&format!("device {n} is named twice")));
                }
                ordinals.push(n);
            }
            Ok(ordinals)
        };
        match s.trim() {
            "auto" => Ok(DeviceSpec::Auto),
            "cpu" => Ok(DeviceSpec::Cpu),
            "cuda" => Ok(DeviceSpec::Cuda(None)),
            "emu" => Ok(DeviceSpec::Emu(vec![0])),
            other => {
                if let Some(list) = other.strip_prefix("emu:") {
                    return Ok(DeviceSpec::Emu(ordinals(list)?));
                }
                let list = other.strip_prefix("cuda:").ok_or_else(|| bad("unknown device"))?;
                Ok(DeviceSpec::Cuda(Some(ordinals(list)?)))
            }
        }
    }

    /// Whether the user asked for a GPU or the emulated one (a missing one is then an error,
    /// not a fallback).
    pub fn wants_cuda(&self) -> bool {
        matches!(self, DeviceSpec::Cuda(_) | DeviceSpec::Emu(_))
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Auto => f.write_str("auto"),
            DeviceSpec::Cpu => f.write_str("cpu"),
            DeviceSpec::Cuda(None) => f.write_str("cuda"),
            DeviceSpec::Cuda(Some(o)) => {
                let list: Vec<String> = o.iter().map(usize::to_string).collect();
                write!(f, "cuda:{}", list.join(","))
            }
            DeviceSpec::Emu(o) => {
                let list: Vec<String> = o.iter().map(usize::to_string).collect();
                write!(f, "emu:{}", list.join(","))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_form_and_names_the_bad_part() {
        assert_eq!(DeviceSpec::parse("cpu").unwrap(), DeviceSpec::Cpu);
        assert_eq!(DeviceSpec::parse("auto").unwrap(), DeviceSpec::Auto);
        assert_eq!(DeviceSpec::parse("cuda").unwrap(), DeviceSpec::Cuda(None));
        assert_eq!(DeviceSpec::parse("cuda:0").unwrap(), DeviceSpec::Cuda(Some(vec![0])));
        assert_eq!(DeviceSpec::parse("cuda:0,1").unwrap(), DeviceSpec::Cuda(Some(vec![0, 1])));
        assert_eq!(DeviceSpec::parse("cuda:1,0").unwrap().to_string(), "cuda:1,0");
        let e = DeviceSpec::parse("cuda:0,x").unwrap_err().to_string();
        assert!(e.contains("\"x\" is not a device ordinal"), "{e}");
        let e = DeviceSpec::parse("cuda:1,1").unwrap_err().to_string();
        assert!(e.contains("device 1 is named twice"), "{e}");
        assert_eq!(DeviceSpec::parse("emu").unwrap(), DeviceSpec::Emu(vec![0]));
        assert_eq!(DeviceSpec::parse("emu:0,1").unwrap(), DeviceSpec::Emu(vec![0, 1]));
        assert_eq!(DeviceSpec::parse("emu:0,1").unwrap().to_string(), "emu:0,1");
        assert!(DeviceSpec::parse("emu:0,0").unwrap_err().to_string().contains("named twice"));
        let e = DeviceSpec::parse("gpu").unwrap_err().to_string();
        assert!(e.contains("unknown device") && e.contains("cuda:0,1"), "{e}");
    }
}
