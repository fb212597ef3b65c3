//! What can go wrong on a device, for every file of the device side: a missing or refused GPU,
//! an emulated device that cannot run, a kernel that does not compile or faults. A leaf: the
//! runtime, the devices behind it and the launches all return these, none imports another
//! for them.

use cudarc::driver::DriverError;

use super::nvrtc::CompileError;
use super::probe::NoGpu;

/// Why the emulated device cannot run, in one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmuError {
    #[error("no emulated device: no C++ compiler ({compiler}: {why}); install one (apt-get install g++) or set CXX")]
    NoCompiler { compiler: String, why: String },
    #[error(
        "no emulated device: {arch} is not supported (x86-64 runs the fibers natively; other 64-bit Linux CPUs through ucontext)"
    )]
    Unsupported { arch: String },
    #[error("emulated device: {file}.cu does not compile for the CPU ({compiler}):\n{log}")]
    Compile { file: String, compiler: String, log: String },
    #[error("emulated device: cannot load {path}: {message}")]
    Load { path: String, message: String },
    #[error("{var}={value:?}: {expected}")]
    Setting { var: &'static str, value: String, expected: &'static str },
    #[error("emulated device {ordinal}: at most 8 emulated devices (emu:0 .. emu:7)")]
    NoSuchDevice { ordinal: usize },
}

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{0}")]
    NoGpu(#[from] NoGpu),
    #[error("{0}")]
    Emu(#[from] EmuError),
    #[error("GPU {ordinal} not found: this machine has {count}")]
    NoSuchGpu { ordinal: usize, count: usize },
    #[error(transparent)]
    Compile(#[from] CompileError),
    #[error("CUDA: {0}")]
    Driver(String),
    /// A launch the device refused, or (emulated) a fault inside the kernel: named by kernel.
    #[error("kernel {kernel}: {message}")]
    Launch { kernel: String, message: String },
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
