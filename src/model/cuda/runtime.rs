//! One GPU, ready to run the kernels: a context and stream on the device, every kernel file
//! compiled for its architecture (a CUBIN through the disk cache) and loaded, and the typed
//! copies in and out. bf16 travels as raw `u16` bits, as in the kernels.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, DriverError};
use cudarc::nvrtc::Ptx;

use super::kernels;
use super::nvrtc::{self, CompileError, Target};
use super::probe::{self, GpuInfo, NoGpu};

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{0}")]
    NoGpu(#[from] NoGpu),
    #[error("GPU {ordinal} not found: this machine has {count}")]
    NoSuchGpu { ordinal: usize, count: usize },
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error("CUDA: {0}")]
    Driver(String),
    #[error("the CUDA kernels cannot run this model: {0}")]
    Shape(String),
    #[error("kernel {0} is not loaded")]
    NoKernel(String),
}

impl From<DriverError> for GpuError {
    fn from(e: DriverError) -> Self {
        GpuError::Driver(format!("{:?}", e.0))
    }
}

pub type GpuResult<T> = Result<T, GpuError>;

pub struct Gpu {
    pub info: GpuInfo,
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    functions: HashMap<&'static str, CudaFunction>,
}

fn to_bits(x: &[f32]) -> Vec<u16> {
    x.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect()
}

impl Gpu {
    /// Opens GPU `ordinal`, compiling and loading every kernel (NVRTC needed).
    pub fn open(ordinal: usize) -> GpuResult<Self> {
        let report = probe::probe()?;
        let count = report.gpus.len();
        let info = report.gpus.into_iter().nth(ordinal).ok_or(GpuError::NoSuchGpu { ordinal, count })?;
        let ctx = CudaContext::new(ordinal)?;
        // A stream of its own: two `Gpu`s on one device (a layer split tried on one card) do
        // not share one, and nothing waits on the legacy default stream.
        let stream = ctx.new_stream()?;
        let cache = nvrtc::default_cache_dir();
        let arch = info.arch();
        let mut functions = HashMap::new();
        for file in kernels::FILES {
            let compiled = nvrtc::compile(file, Target::Cubin, &arch, cache.as_deref())?;
            let module = ctx.load_module(Ptx::from_binary(compiled.code))?;
            for entry in file.entries {
                functions.insert(*entry, module.load_function(entry)?);
            }
        }
        Ok(Gpu { info, ctx, stream, functions })
    }

    pub fn function(&self, name: &str) -> GpuResult<&CudaFunction> {
        self.functions.get(name).ok_or_else(|| GpuError::NoKernel(name.into()))
    }

    /// f32 values rounded to bf16, on the device.
    pub fn bf16(&self, x: &[f32]) -> GpuResult<CudaSlice<u16>> {
        Ok(self.stream.clone_htod(&to_bits(x))?)
    }

    pub fn f32(&self, x: &[f32]) -> GpuResult<CudaSlice<f32>> {
        Ok(self.stream.clone_htod(x)?)
    }

    pub fn i32(&self, x: &[i32]) -> GpuResult<CudaSlice<i32>> {
        Ok(self.stream.clone_htod(x)?)
    }

    pub fn u32(&self, x: &[u32]) -> GpuResult<CudaSlice<u32>> {
        Ok(self.stream.clone_htod(x)?)
    }

    pub fn zeros_bf16(&self, n: usize) -> GpuResult<CudaSlice<u16>> {
        Ok(self.stream.alloc_zeros::<u16>(n)?)
    }

    pub fn zeros_f32(&self, n: usize) -> GpuResult<CudaSlice<f32>> {
        Ok(self.stream.alloc_zeros::<f32>(n)?)
    }

    pub fn read_bf16(&self, x: &CudaSlice<u16>) -> GpuResult<Vec<f32>> {
        let bits = self.stream.clone_dtoh(x)?;
        Ok(bits.into_iter().map(|b| half::bf16::from_bits(b).to_f32()).collect())
    }

    pub fn read_f32(&self, x: &CudaSlice<f32>) -> GpuResult<Vec<f32>> {
        Ok(self.stream.clone_dtoh(x)?)
    }

    pub fn read_i32(&self, x: &CudaSlice<i32>) -> GpuResult<Vec<i32>> {
        Ok(self.stream.clone_dtoh(x)?)
    }

    pub fn sync(&self) -> GpuResult<()> {
        Ok(self.stream.synchronize()?)
    }
}
