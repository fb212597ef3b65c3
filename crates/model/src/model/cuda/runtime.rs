//! One device, ready to run the kernels: a GPU through the driver or the emulated device (the
//! same kernels compiled for the CPU), behind [`Device`], with the typed copies in and out.
//! bf16 travels as raw `u16` bits, as in the kernels.

use std::sync::Arc;

use super::cuda_device::CudaDevice;
use super::device::{Arg, Buf, Device, Elem};
use super::emu::EmuDevice;
use super::kernels::KernelFile;
use super::probe::GpuInfo;

pub use super::error::{GpuError, GpuResult};

/// Which kind of device runs the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// A GPU through the CUDA driver.
    Cuda,
    /// `kernels/*.cu` compiled for this CPU by its C++ compiler, each CUDA thread a fiber.
    Emu,
}

impl DeviceKind {
    /// "cuda" / "emu", as `--device` spells it.
    pub fn prefix(self) -> &'static str {
        match self {
            DeviceKind::Cuda => "cuda",
            DeviceKind::Emu => "emu",
        }
    }
}

/// A device and the typed copies the model and the parity checks use. Cheap to clone.
#[derive(Clone)]
pub struct Gpu {
    pub info: GpuInfo,
    pub dev: Arc<dyn Device>,
}

fn to_bits(x: &[f32]) -> Vec<u16> {
    x.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect()
}

impl Gpu {
    /// Opens device `ordinal` of `kind` with `kernels` compiled and loaded (NVRTC for a GPU,
    /// the C++ compiler for the emulator).
    pub fn open(kind: DeviceKind, ordinal: usize, kernels: &'static [KernelFile]) -> GpuResult<Self> {
        let dev: Arc<dyn Device> = match kind {
            DeviceKind::Cuda => Arc::new(CudaDevice::open(ordinal, kernels)?),
            DeviceKind::Emu => Arc::new(EmuDevice::open(ordinal, kernels)?),
        };
        Ok(Gpu { info: dev.info().clone(), dev })
    }

    pub fn label(&self) -> String {
        self.dev.label()
    }

    /// Launches `kernel` (see [`Device::launch`]).
    ///
    /// # Safety
    /// As [`Device::launch`]: the arguments match the kernel and the buffers its grid touches.
    pub unsafe fn launch(&self, kernel: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> GpuResult<()> {
        // SAFETY: forwarded.
        unsafe { self.dev.launch(kernel, grid, block, args) }
    }

    pub fn upload<T: Elem>(&self, x: &[T]) -> GpuResult<Buf<T>> {
        Buf::from_host(&self.dev, x)
    }

    /// f32 values rounded to bf16, on the device.
    pub fn bf16(&self, x: &[f32]) -> GpuResult<Buf<u16>> {
        self.upload(&to_bits(x))
    }

    pub fn f32(&self, x: &[f32]) -> GpuResult<Buf<f32>> {
        self.upload(x)
    }

    pub fn i32(&self, x: &[i32]) -> GpuResult<Buf<i32>> {
        self.upload(x)
    }

    pub fn u32(&self, x: &[u32]) -> GpuResult<Buf<u32>> {
        self.upload(x)
    }

    pub fn zeros<T: Elem>(&self, n: usize) -> GpuResult<Buf<T>> {
        Buf::zeros(&self.dev, n)
    }

    pub fn zeros_bf16(&self, n: usize) -> GpuResult<Buf<u16>> {
        self.zeros(n)
    }

    pub fn zeros_f32(&self, n: usize) -> GpuResult<Buf<f32>> {
        self.zeros(n)
    }

    pub fn read_bf16(&self, x: &Buf<u16>) -> GpuResult<Vec<f32>> {
        Ok(x.read()?.into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect())
    }

    pub fn read_f32(&self, x: &Buf<f32>) -> GpuResult<Vec<f32>> {
        x.read()
    }

    pub fn read_i32(&self, x: &Buf<i32>) -> GpuResult<Vec<i32>> {
        x.read()
    }

    pub fn sync(&self) -> GpuResult<()> {
        self.dev.synchronize()
    }
}
