//! Reads parameters for the layers: shape-checked, converted to f32, and rounded to bf16 when
//! the model runs with the bf16 reference's cast points (transformers casts every parameter to
//! the model dtype, `A_log` and `dt_bias` included).

use std::cell::Cell;
use std::sync::Arc;

use super::tensor::Precision;
use super::weights::WeightStore;
use crate::error::Result;

/// Told, after each tensor is read, how many bytes of tensor data have been read and how many
/// will be in all (front ends draw a progress bar from it).
#[derive(Clone)]
pub struct LoadProgress(pub Arc<dyn Fn(u64, u64) + Send + Sync>);

impl std::fmt::Debug for LoadProgress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LoadProgress(..)")
    }
}

pub struct Loader<'a> {
    pub store: &'a WeightStore,
    pub precision: Precision,
    pub progress: Option<&'a LoadProgress>,
    /// Bytes read so far, and the bytes the model will read in all.
    pub read: Cell<u64>,
    pub total: u64,
}

impl Loader<'_> {
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let mut v = self.store.load_f32(name, shape)?;
        self.precision.round_all(&mut v);
        if let Some(p) = self.progress {
            self.read.set(self.read.get() + self.store.tensor_bytes(name) as u64);
            (p.0)(self.read.get(), self.total);
        }
        Ok(v)
    }

    pub fn has(&self, name: &str) -> bool {
        self.store.contains(name)
    }
}
