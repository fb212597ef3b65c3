//! Reads parameters for the layers: shape-checked, weight matrices as stored (views into the
//! mapped file where they can be), vectors converted to f32, and rounded to bf16 when
//! the model runs with the bf16 reference's cast points (transformers casts every parameter to
//! the model dtype, `A_log` and `dt_bias` included).

use std::cell::Cell;
use std::sync::Arc;

use super::cpu::tensor::{Linear, Precision};
use super::storage::Weights;
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

/// What a load has read so far, shared by a [`Loader`] and every loader [`Loader::pp`] makes
/// from it.
#[derive(Debug, Default)]
pub(crate) struct LoadCounts {
    /// Bytes read so far.
    pub read: Cell<u64>,
    /// Bytes of weight matrices kept as views into the mapped file.
    pub mapped: Cell<u64>,
    /// Weights held as FP8 codes.
    pub fp8: Cell<u64>,
    /// The bytes the model will read in all.
    pub total: u64,
}

/// Reads the tensors under one name prefix (candle's `VarBuilder`): `ld.pp("self_attn")`
/// reads `….self_attn.q_proj.weight` as `q_proj.weight`.
pub(crate) struct Loader<'a> {
    pub store: &'a WeightStore,
    pub precision: Precision,
    pub progress: Option<&'a LoadProgress>,
    pub counts: &'a LoadCounts,
    /// Prepended to every name: empty, or ending in `.`.
    prefix: String,
}

impl<'a> Loader<'a> {
    /// A loader at the root of the checkpoint's names.
    pub(crate) fn new(
        store: &'a WeightStore,
        precision: Precision,
        progress: Option<&'a LoadProgress>,
        counts: &'a LoadCounts,
    ) -> Self {
        Loader { store, precision, progress, counts, prefix: String::new() }
    }

    /// The loader for the names under `name.` (candle's `vb.pp`).
    pub(crate) fn pp(&self, name: impl std::fmt::Display) -> Loader<'a> {
        Loader { prefix: format!("{}{name}.", self.prefix), ..*self }
    }

    /// The full name of `name` under this loader's prefix.
    pub(crate) fn name(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    pub(crate) fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
        let name = &self.name(name);
        let mut v = self.store.load_f32(name, shape)?;
        self.precision.round_all(&mut v);
        self.read_one(name);
        Ok(v)
    }

    /// A weight matrix in its stored dtype; with the bf16 reference's cast points, in bf16
    /// (FP8 excepted: kept as its codes and scales).
    pub(crate) fn weights(&self, name: &str, shape: &[usize]) -> Result<Weights> {
        let full = self.name(name);
        let w = self.store.load_weights(&full, shape)?;
        self.held(&full, w)
    }

    /// A weight matrix whose columns may stay in the order a GGUF stores them, with the order
    /// of its input that undoes it (see [`WeightStore::load_weights_in_stored_order`]).
    pub(crate) fn linear_in_stored_order(
        &self,
        name: &str,
        out: usize,
        inp: usize,
    ) -> Result<(Linear, Option<Vec<usize>>)> {
        let full = self.name(name);
        let (w, order) = self.store.load_weights_in_stored_order(&full, &[out, inp])?;
        Ok((Linear::from_weights(self.held(&full, w)?, out, inp)?, order))
    }

    /// A matrix as the model holds it at its precision, counted.
    fn held(&self, name: &str, w: Weights) -> Result<Weights> {
        // FP8 and GGUF blocks stay as they are at either precision: their kernels dequantise
        // in registers.
        let keep = matches!(w, Weights::Bf16(_) | Weights::Fp8(_) | Weights::Quant(_));
        let w = if self.precision == Precision::Bf16 && !keep {
            // Rounded into a new buffer: the file's pages are not needed again.
            let rounded = w.into_bf16();
            self.store.release(name);
            rounded
        } else {
            w
        };
        if w.is_mapped() {
            self.counts.mapped.set(self.counts.mapped.get() + w.bytes() as u64);
        }
        if let Weights::Fp8(f) = &w {
            self.counts.fp8.set(self.counts.fp8.get() + f.q.len() as u64);
        }
        self.read_one(name);
        Ok(w)
    }

    /// A weight matrix as a linear layer `[out, in]`.
    pub(crate) fn linear(&self, name: &str, out: usize, inp: usize) -> Result<Linear> {
        Linear::from_weights(self.weights(name, &[out, inp])?, out, inp)
    }

    /// Counts `name` (a full name) as read and tells the progress callback.
    fn read_one(&self, name: &str) {
        if let Some(p) = self.progress {
            let read = &self.counts.read;
            read.set(read.get() + self.store.tensor_bytes(name) as u64);
            (p.0)(read.get(), self.counts.total);
        }
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.store.contains(&self.name(name))
    }
}
