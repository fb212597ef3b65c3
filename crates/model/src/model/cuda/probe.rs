//! What this machine has for CUDA, found without ever calling into a missing library: cudarc
//! loads the driver, NVRTC and cuBLAS(Lt) at run time and panics on the first call into one
//! that is absent, so each is checked for presence first, and a driver that loads but answers
//! `cuInit` with an error (no device, no permission) is reported by that error's name.

use crate::model::placement::plan::DeviceBudget;
use std::ffi::c_int;

use cudarc::driver::{result as drv, sys as drv_sys};

/// Which CUDA libraries the loader can open (none of them needs a GPU to load).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Libraries {
    /// libcuda (the driver; installed with the NVIDIA kernel module).
    pub driver: bool,
    /// libnvrtc (compiles `kernels/*.cu` at run time).
    pub nvrtc: bool,
    pub cublas: bool,
    /// libcublasLt (prefill GEMMs; our own tiled kernel otherwise).
    pub cublaslt: bool,
}

pub fn libraries() -> Libraries {
    // SAFETY: these only try to dlopen the candidate names; nothing is called.
    unsafe {
        Libraries {
            driver: drv_sys::is_culib_present(),
            nvrtc: cudarc::nvrtc::sys::is_culib_present(),
            cublas: cudarc::cublas::sys::is_culib_present(),
            cublaslt: cudarc::cublaslt::sys::is_culib_present(),
        }
    }
}

/// One GPU as the driver describes it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GpuInfo {
    pub ordinal: usize,
    pub name: String,
    /// (major, minor): 9.0 is Hopper (H100 / H200).
    pub compute_capability: (i32, i32),
    pub total_bytes: u64,
    /// Free memory now (from a context on the device).
    pub free_bytes: u64,
}

impl GpuInfo {
    /// `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

/// What answered.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GpuReport {
    pub libraries: Libraries,
    /// `cuDriverGetVersion`: 12080 is CUDA 12.8.
    pub driver_version: i32,
    /// NVRTC's (major, minor), when it loads.
    pub nvrtc_version: Option<(i32, i32)>,
    pub gpus: Vec<GpuInfo>,
}

impl GpuReport {
    /// The GPUs `wanted` (all of them for `None`), in order, with their free memory as plan
    /// budgets; an ordinal this machine lacks is an error in one line.
    pub fn budgets(&self, wanted: Option<&[usize]>) -> Result<Vec<(usize, DeviceBudget)>, String> {
        let all: Vec<usize> = (0..self.gpus.len()).collect();
        let mut out = vec![];
        for &o in wanted.unwrap_or(&all) {
            let g = self
                .gpus
                .get(o)
                .ok_or_else(|| format!("GPU {o} not found: this machine has {} GPU(s)", self.gpus.len()))?;
            out.push((o, DeviceBudget { label: format!("cuda:{o} {}", g.name), free_bytes: g.free_bytes }));
        }
        Ok(out)
    }
}

/// Why there is no GPU to run on; its message is the one line users see.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoGpu {
    #[error("no GPU: libcuda not found")]
    NoDriver,
    /// The driver loaded but `cuInit` or a device query failed: the error's name, e.g.
    /// `CUDA_ERROR_NO_DEVICE`.
    #[error("no GPU: {0}")]
    Driver(String),
    #[error("no GPU: the driver sees no device")]
    NoDevice,
}

fn driver_error(e: drv::DriverError) -> NoGpu {
    // The enum's own name (`CUDA_ERROR_NO_DEVICE`): asking the driver for the error string
    // would be one more call into a driver that just failed.
    NoGpu::Driver(format!("{:?}", e.0))
}

/// NVRTC's version, when the library loads.
pub fn nvrtc_version() -> Option<(i32, i32)> {
    // SAFETY: presence checked first; nvrtcVersion only writes the two ints.
    unsafe {
        if !cudarc::nvrtc::sys::is_culib_present() {
            return None;
        }
        let (mut major, mut minor): (c_int, c_int) = (0, 0);
        let r = cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor);
        (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
    }
}

/// Finds the GPUs, or says in one line why there are none. Opens a context on each device
/// (to read its free memory), so it takes a moment on a machine with GPUs.
pub fn probe() -> Result<GpuReport, NoGpu> {
    let libraries = libraries();
    if !libraries.driver {
        return Err(NoGpu::NoDriver);
    }
    drv::init().map_err(driver_error)?;
    let mut driver_version: c_int = 0;
    // SAFETY: the driver is loaded and initialised; the call writes one int.
    unsafe { drv_sys::cuDriverGetVersion(&mut driver_version) }.result().map_err(driver_error)?;
    let count = drv::device::get_count().map_err(driver_error)?;
    if count <= 0 {
        return Err(NoGpu::NoDevice);
    }
    let mut gpus = vec![];
    for ordinal in 0..count as usize {
        let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(driver_error)?;
        let name = ctx.name().map_err(driver_error)?;
        let compute_capability = ctx.compute_capability().map_err(driver_error)?;
        let (free, total) = ctx.mem_get_info().map_err(driver_error)?;
        gpus.push(GpuInfo { ordinal, name, compute_capability, total_bytes: total as u64, free_bytes: free as u64 });
    }
    Ok(GpuReport { libraries, driver_version, nvrtc_version: nvrtc_version(), gpus })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_line_and_name_the_cause() {
        assert_eq!(NoGpu::NoDriver.to_string(), "no GPU: libcuda not found");
        assert_eq!(NoGpu::Driver("CUDA_ERROR_NO_DEVICE".into()).to_string(), "no GPU: CUDA_ERROR_NO_DEVICE");
    }

    #[test]
    fn driver_errors_are_named_by_the_enum() {
        let e = driver_error(drv::DriverError(drv_sys::CUresult::CUDA_ERROR_NO_DEVICE));
        assert_eq!(e.to_string(), "no GPU: CUDA_ERROR_NO_DEVICE");
    }
}
