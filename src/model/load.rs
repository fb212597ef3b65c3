//! Reads parameters for the layers: shape-checked, converted to f32, and rounded to bf16 when
//! the model runs with the bf16 reference's cast points (transformers casts every parameter to
//! the model dtype, `A_log` and `dt_bias` included).

use super::tensor::Precision;
use super::weights::WeightStore;
use crate::error::Result;

pub struct Loader<'a> {
    pub store: &'a WeightStore,
    pub precision: Precision,
}

impl Loader<'_> {
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let mut v = self.store.load_f32(name, shape)?;
        self.precision.round_all(&mut v);
        Ok(v)
    }

    pub fn has(&self, name: &str) -> bool {
        self.store.contains(name)
    }
}
