//! Which device runs which layer: what the user asked for with `--device
//! cpu|cuda|cuda:N|cuda:N,M|emu|emu:N|emu:N,M|auto` ([`DeviceSpec`]), what answers to it
//! ([`place`] → [`Placement`]), the layers per device by free memory ([`plan`]), and the upload
//! of the weights to those devices ([`upload`]).

pub(crate) mod plan;

use std::path::Path;

use self::plan::{DeviceBudget, PlanInputs, plan_devices, plan_fewest};
use super::Model;
use super::cuda::{self, DeviceKind};
pub(crate) use crate::devices::DeviceSpec;
use crate::error::{Error, Result};
use crate::units::human_bytes;

/// Where a model runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    /// "cpu", or the GPUs ("cuda:0").
    pub devices: Vec<String>,
    /// One line on why it is not on a GPU under `--device auto` ("no GPU: libcuda not
    /// found; the CPU runs"); `None` when the user chose the device.
    pub note: Option<String>,
    /// The GPUs to plan on, with their free memory (empty: the CPU runs).
    pub gpus: Vec<(usize, DeviceBudget)>,
    /// `--device cuda` without ordinals: the fewest of `gpus` that hold the model.
    pub fewest: bool,
    /// GPUs or emulated devices (meaningful when `gpus` is not empty).
    pub kind: DeviceKind,
}

impl Placement {
    /// Whether the model runs on the emulated device.
    pub fn emulated(&self) -> bool {
        !self.gpus.is_empty() && self.kind == DeviceKind::Emu
    }
}

/// Resolves `--device` before any weight is read: a GPU the user asked for that cannot run is
/// an error naming why (no driver, no device, a missing ordinal); `auto` runs the CPU, with a
/// one-line note when a GPU is present (the CUDA engine is chosen explicitly until
/// `scripts/gpu-check.sh` has passed on a GPU) or why there is none.
pub fn place(spec: &DeviceSpec) -> Result<Placement> {
    let cpu = |note: Option<String>| Placement {
        devices: vec!["cpu".into()],
        note,
        gpus: vec![],
        fewest: false,
        kind: DeviceKind::Cuda,
    };
    let fail = |message: String| Error::Device { spec: spec.to_string(), message };
    match spec {
        DeviceSpec::Cpu => Ok(cpu(None)),
        DeviceSpec::Auto => match cuda::probe() {
            Err(no) => Ok(cpu(Some(format!("{no}; the CPU runs")))),
            Ok(report) => Ok(cpu(Some(format!(
                "{} found; the CPU runs (the CUDA engine is new: choose it with --device cuda)",
                gpu_list(&report.gpus)
            )))),
        },
        DeviceSpec::Cuda(wanted) => {
            let report = cuda::probe().map_err(|no| fail(no.to_string()))?;
            let gpus =
                report.budgets(wanted.as_deref()).map_err(|e| fail(format!("{e} ({})", gpu_list(&report.gpus))))?;
            let devices = gpus.iter().map(|(o, _)| format!("cuda:{o}")).collect();
            Ok(Placement { devices, note: None, gpus, fewest: wanted.is_none(), kind: DeviceKind::Cuda })
        }
        DeviceSpec::Emu(ordinals) => {
            cuda::emu::probe().map_err(|e| fail(e.to_string()))?;
            let mut gpus = vec![];
            for &o in ordinals {
                if o >= 8 {
                    return Err(fail(cuda::error::EmuError::NoSuchDevice { ordinal: o }.to_string()));
                }
                let free_bytes = cuda::emu::capacity().map_err(|e| fail(e.to_string()))?;
                gpus.push((o, DeviceBudget { label: format!("emu:{o} (emulated)"), free_bytes }));
            }
            let devices: Vec<String> = ordinals.iter().map(|o| format!("emu:{o}")).collect();
            let note = format!(
                "{}: the emulated CUDA device (the CUDA engine with its kernels compiled for this CPU; slow, for checking the GPU path)",
                devices.join(",")
            );
            Ok(Placement { devices, note: Some(note), gpus, fewest: false, kind: DeviceKind::Emu })
        }
    }
}

/// Plans the layers over the placement's GPUs by free memory and uploads the weights; a model
/// that does not fit is an error with the plan's numbers.
pub fn upload(
    model: &Model,
    spec: &DeviceSpec,
    kernels: Option<&Path>,
    placement: &Placement,
) -> Result<cuda::CudaModel> {
    let budgets: Vec<DeviceBudget> = placement.gpus.iter().map(|(_, b)| b.clone()).collect();
    let inputs = PlanInputs::for_model(&model.config);
    let plan = if placement.fewest {
        plan_fewest(&model.config, &budgets, inputs)
    } else {
        plan_devices(&model.config, &budgets, inputs)
    };
    if !plan.fits {
        let short: Vec<String> = plan
            .devices
            .iter()
            .map(|d| format!("{} needs {} of {} free", d.label, human_bytes(d.total_bytes), human_bytes(d.free_bytes)))
            .collect();
        return Err(Error::Device {
            spec: spec.to_string(),
            message: format!(
                "the model does not fit at its full context ({} tokens): {} (see deltascope inspect --device {spec})",
                inputs.context_tokens,
                short.join("; ")
            ),
        });
    }
    let kernels = cuda::kernels::load(kernels).map_err(|e| Error::InvalidArgument(e.to_string()))?;
    let mut gpus = vec![];
    for (o, _) in placement.gpus.iter().take(plan.devices.len()) {
        gpus.push(
            cuda::Gpu::open(placement.kind, *o, kernels)
                .map_err(|e| Error::Device { spec: spec.to_string(), message: e.to_string() })?,
        );
    }
    cuda::CudaModel::upload(model, gpus, &plan)
}

/// "1 GPU (0: NVIDIA H200, sm_90, 139.8 GiB)".
pub(crate) fn gpu_list(gpus: &[cuda::GpuInfo]) -> String {
    let each: Vec<String> = gpus
        .iter()
        .map(|g| format!("{}: {}, {}, {}", g.ordinal, g.name, g.arch(), human_bytes(g.total_bytes)))
        .collect();
    format!("{} GPU{} ({})", gpus.len(), if gpus.len() == 1 { "" } else { "s" }, each.join("; "))
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
