//! The device seam inside the model layer: what a sequence needs from a model, whichever
//! device computes it. The CPU [`Model`] and the CUDA model implement it side by side (siblings,
//! not `if cuda` branches); the engine's session drives either through it.

use super::hybrid::{ForwardOptions, ForwardOutput, LogitsRows, Model, MtpOutput, MtpState};
use super::state::{SequenceState, StateBytes};
use super::trace::StateTrace;
use super::{Mat, ModelConfig};
use crate::error::Result;

/// A sequence's state on some device: the recurrent states and KV caches of every layer.
pub trait SequenceCache: Send {
    /// Tokens consumed so far (the position of the next token).
    fn position(&self) -> usize;
    fn bytes(&self) -> StateBytes;
    /// Bytes held to roll back the last verify pass.
    fn rollback_bytes(&self) -> usize;
    /// Keeps the first `keep` tokens of the last verify pass and rolls the rest back.
    fn accept(&mut self, keep: usize) -> Result<()>;
    /// The bytes per device, in the order of [`Forward::device_weights`] (empty: one device).
    fn device_bytes(&self) -> Vec<StateBytes> {
        vec![]
    }
    /// The state trace of the last pass when it went non-finite instead of returning (the
    /// layers it ran); `None` when there is none or the device does not keep one.
    fn take_failed_trace(&mut self) -> Option<StateTrace> {
        None
    }
}

/// The MTP head's own KV cache on some device; it trails the main state by one position.
pub trait DraftCache: Send {
    fn position(&self) -> usize;
    /// Drops the entries at positions `len..` (chained draft steps, rewritten next round).
    fn truncate(&mut self, len: usize);
    fn bytes(&self) -> usize;
}

/// A model that runs sequences: the forward pass, and the MTP head's pass for drafting.
/// What computes a model's numbers ([`Forward::compute_label`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ComputeLabel {
    /// "cpu", "cuda:0", "emu:0,1".
    pub device: String,
    /// The activation precision: "f32" or "bf16".
    pub dtype: &'static str,
    /// The CPU kernel family ("avx2", "amx" …), or "cuda" / "emu" for the GPU engine's kernels.
    pub kernel: String,
}

pub trait Forward: Send + Sync {
    type Cache: SequenceCache;
    type Draft: DraftCache;

    fn config(&self) -> &ModelConfig;
    fn weight_bytes(&self) -> usize;
    /// What computes this model's numbers: the device, the activation precision and the kernels.
    /// Two healthy engines differ by the rounding these imply (a trace records them, so that a
    /// comparison allows just that much).
    fn compute_label(&self) -> ComputeLabel;
    /// Each device's label and weight bytes, when the model spans devices of its own (GPUs);
    /// empty on the CPU.
    fn device_weights(&self) -> Vec<(String, usize)> {
        vec![]
    }
    /// A fresh state at position 0 (on a GPU: allocated there, so it can fail).
    fn new_cache(&self) -> Result<Self::Cache>;
    /// A fresh MTP cache, when the checkpoint has an MTP module.
    fn new_draft_cache(&self) -> Result<Option<Self::Draft>>;
    /// Why this model cannot return a state trace ([`ForwardOptions::trace_state`]); `None`
    /// when it can.
    fn state_trace_refusal(&self) -> Option<&'static str> {
        None
    }
    /// Checks token ids and the context before anything is computed.
    fn validate_at(&self, ids: &[u32], position: usize) -> Result<()>;
    /// Runs `ids` at positions `cache.position()..`, advancing the cache. `hidden` in the output
    /// is the post-norm hidden state of every row (the MTP head's input).
    fn forward_cached(&self, ids: &[u32], cache: &mut Self::Cache, opts: ForwardOptions) -> Result<ForwardOutput>;
    /// One MTP pass (model-spec §6.1), appending to the MTP cache.
    fn mtp_forward_cached(
        &self,
        next_ids: &[u32],
        hidden: &Mat,
        cache: &mut Self::Draft,
        rows: LogitsRows,
    ) -> Result<MtpOutput>;
}

impl SequenceCache for SequenceState {
    fn position(&self) -> usize {
        self.position
    }

    fn bytes(&self) -> StateBytes {
        SequenceState::bytes(self)
    }

    fn rollback_bytes(&self) -> usize {
        self.tape_bytes()
    }

    fn accept(&mut self, keep: usize) -> Result<()> {
        SequenceState::accept(self, keep)
    }

    fn take_failed_trace(&mut self) -> Option<StateTrace> {
        SequenceState::take_failed_trace(self)
    }
}

impl DraftCache for MtpState {
    fn position(&self) -> usize {
        self.position
    }

    fn truncate(&mut self, len: usize) {
        MtpState::truncate(self, len)
    }

    fn bytes(&self) -> usize {
        MtpState::bytes(self)
    }
}

impl Forward for Model {
    type Cache = SequenceState;
    type Draft = MtpState;

    fn compute_label(&self) -> ComputeLabel {
        ComputeLabel {
            device: "cpu".into(),
            dtype: self.precision.name(),
            kernel: crate::model::cpu::CpuKernel::active().name().into(),
        }
    }

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn weight_bytes(&self) -> usize {
        Model::weight_bytes(self)
    }

    fn new_cache(&self) -> Result<SequenceState> {
        Ok(self.new_state())
    }

    fn new_draft_cache(&self) -> Result<Option<MtpState>> {
        Ok(self.new_mtp_state())
    }

    fn validate_at(&self, ids: &[u32], position: usize) -> Result<()> {
        super::hybrid::validate_ids(&self.config, ids, position)
    }

    fn forward_cached(&self, ids: &[u32], cache: &mut SequenceState, opts: ForwardOptions) -> Result<ForwardOutput> {
        self.forward(ids, cache, opts)
    }

    fn mtp_forward_cached(
        &self,
        next_ids: &[u32],
        hidden: &Mat,
        cache: &mut MtpState,
        rows: LogitsRows,
    ) -> Result<MtpOutput> {
        self.mtp_forward(next_ids, hidden, cache, rows)
    }
}
