//! Checks of one backend against a reference, kept out of the runtime: the CPU twins of the
//! CUDA kernels (`twins.rs`) and kernel-by-kernel parity on a device (`parity.rs`), run by
//! `deltascope gpu check`. Kernels are launched through `model::cuda::ops`' typed launches: no
//! unsafe code here.

#![forbid(unsafe_code)]

pub mod parity;
pub mod twins;
