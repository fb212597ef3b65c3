//! deltascope's model floor: checkpoint files, the library error, units, the devices a run asked
//! for, and the model itself (pure compute on the CPU, CUDA or the emulated device).

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod checkpoint;
pub mod devices;
pub mod error;
pub mod hash;
pub mod model;
pub mod units;

pub use error::{Error, Result};
