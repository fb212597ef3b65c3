//! The CUDA side of the model: a sibling of the CPU engine behind the same seam, on the
//! driver, NVRTC and cuBLAS(Lt) loaded at run time (one binary runs everywhere), or on the
//! emulated device (`emu`): the same kernels compiled for the CPU, behind one device seam.

pub(crate) mod cuda_device;
pub mod device;
pub mod emu;
pub(crate) mod error;
pub mod kernels;
pub(crate) mod model;
pub mod nvrtc;
pub mod ops;
pub mod probe;
pub mod resources;
pub mod runtime;

pub use model::CudaModel;
pub(crate) use probe::GpuInfo;
pub use probe::probe;
pub use runtime::{DeviceKind, Gpu};
