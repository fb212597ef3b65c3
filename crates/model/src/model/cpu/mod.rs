//! The CPU side of the model's compute: the kernel family that runs (`kernel.rs`: the best
//! this CPU has, or the one `DELTASCOPE_CPU_KERNEL` names), the instruction sets the kernels
//! dispatch on (`simd.rs`), the elementwise functions (`math.rs`), the f32 matrix, linear layers and
//! precision policy (`tensor.rs`), the decode GEMV kernels (`gemv.rs`), FP8 weights widened for the prefill's panels (`dequant.rs`), the bf16 prefill GEMMs
//! (`gemm_bf16.rs`; AMX tiles in `amx.rs`), the flush of subnormals around the prefill's small
//! products (`subnormal.rs`), the CPU's cores and the thread pool the layers run on
//! (`threads.rs`), a forward pass with the pool's threads kept awake (`awake.rs`), and the
//! allocator settings the engine runs under (`heap.rs`).

pub mod amx;
pub mod awake;
pub mod dequant;
pub mod gemm_bf16;
pub mod gemv;
pub mod heap;
pub mod kernel;
pub mod math;
pub mod simd;
pub mod subnormal;
pub mod tensor;
pub mod threads;

pub use kernel::{CpuKernel, KernelChoiceError};
pub use simd::Simd;
pub use threads::{CpuInfo, set_threads};
