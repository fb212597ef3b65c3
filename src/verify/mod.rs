//! Checks of one backend against a reference, kept out of the runtime: the CPU twins of the
//! CUDA kernels (`twins.rs`) and kernel-by-kernel parity on a device (`parity.rs`), run by
//! `deltascope gpu check`; and `deltascope verify`, a server's greedy tokens scored by the
//! reference engine (`probes.rs`, `score.rs`, `server.rs`). Kernels are launched through `model::cuda::ops`' typed launches: no
//! unsafe code here.

#![forbid(unsafe_code)]

pub mod against;
pub mod judges;
pub mod parity;
pub mod probes;
pub mod rescore;
pub mod same_file;
pub mod score;
pub mod server;
pub mod twins;
