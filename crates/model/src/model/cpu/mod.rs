//! The CPU side of the model's compute: the kernel family that runs (`kernel.rs`: the best
//! this CPU has, or the one `DELTASCOPE_CPU_KERNEL` names), the instruction sets the kernels
//! dispatch on (`simd.rs`), the elementwise functions (`math.rs`), the f32 matrix, linear layers and
//! precision policy (`tensor.rs`), the decode GEMV kernels (`gemv.rs`; over GGUF's quantised blocks, `quant_gemv.rs`), FP8 weights widened for the prefill's panels (`dequant.rs`), the bf16 prefill GEMMs
//! (`gemm_bf16.rs`; AMX tiles in `amx.rs`), the flush of subnormals around the prefill's small
//! products (`subnormal.rs`), the CPU's cores and the thread pool the layers run on
//! (`threads.rs`), a forward pass with the pool's threads kept awake (`awake.rs`), and the
//! allocator settings the engine runs under (`heap.rs`).

pub(crate) mod amx;
pub(crate) mod awake;
pub(crate) mod dequant;
pub(crate) mod gemm_bf16;
pub(crate) mod gemv;
pub(crate) mod heap;
pub(crate) mod kernel;
pub(crate) mod math;
mod pair_tail;
pub(crate) mod precision;
pub(crate) mod quant_gemv;
pub(crate) mod simd;
pub(crate) mod subnormal;
pub(crate) mod tensor;
pub(crate) mod threads;

pub use kernel::CpuKernel;
pub(crate) use simd::Simd;
pub use threads::{CpuInfo, set_threads};
