//! Which devices the user asked for (`--device`): a value every part may name — front ends
//! parse it, the backend passes it on, the model's placement acts on it.

#![forbid(unsafe_code)]

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
