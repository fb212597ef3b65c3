//! The per-sequence state of the hybrid model: a KV cache per full-attention layer, and the
//! conv window plus the SSM state of every GDN layer. Exact byte accounting, and snapshot /
//! restore for speculative decoding.
//!
//! A snapshot deep-copies the recurrent state (constant size per sequence) and records only the
//! KV length: the KV cache is append-only, so rolling it back is a truncation. That is valid as
//! long as nothing below the snapshot's length was rewritten since, which `restore` checks.

use serde::Serialize;

use super::config::{LayerKind, LinearAttnConfig, ModelConfig};
use super::cpu::tensor::F32_BYTES;
use super::gdn::{GdnState, GdnTape};
use crate::error::{Error, Result};

/// Keys and values of one attention layer, `[position][kv_head][head_dim]`, f32.
#[derive(Debug, Clone, PartialEq)]
pub struct KvCache {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// Floats per position (`kv_heads · head_dim`).
    pub row: usize,
}

impl KvCache {
    pub fn new(row: usize) -> Self {
        KvCache { k: vec![], v: vec![], row }
    }

    pub fn len(&self) -> usize {
        self.k.len() / self.row
    }

    pub fn is_empty(&self) -> bool {
        self.k.is_empty()
    }

    pub fn truncate(&mut self, len: usize) {
        self.k.truncate(len * self.row);
        self.v.truncate(len * self.row);
    }

    pub fn bytes(&self) -> usize {
        (self.k.len() + self.v.len()) * F32_BYTES
    }

    pub fn capacity_bytes(&self) -> usize {
        (self.k.capacity() + self.v.capacity()) * F32_BYTES
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum LayerState {
    Linear(GdnState),
    Attention(KvCache),
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct StateBytes {
    /// KV entries held (keys + values of every attention layer).
    pub kv_bytes: usize,
    /// What the KV vectors have reserved.
    pub kv_capacity_bytes: usize,
    /// Conv windows + SSM states (constant per sequence).
    pub recurrent_bytes: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SequenceState {
    /// Tokens consumed so far (the position of the next token).
    pub position: usize,
    pub layers: Vec<LayerState>,
    /// Every rollback so far, as `(epoch, length it rolled back to)`.
    truncations: Vec<(u64, usize)>,
    epoch: u64,
    linear: LinearAttnConfig,
    /// The state trace of the last pass, when it went non-finite (the pass returned an error,
    /// not its output): the layers it ran, the failing one included.
    pub(crate) failed_trace: Option<super::trace::StateTrace>,
}

/// A point to roll a [`SequenceState`] back to.
#[derive(Debug, Clone)]
pub struct StateSnapshot {
    position: usize,
    epoch: u64,
    recurrent: Vec<Option<GdnState>>,
}

impl StateSnapshot {
    pub fn position(&self) -> usize {
        self.position
    }

    pub fn bytes(&self) -> usize {
        self.recurrent.iter().flatten().map(GdnState::bytes).sum()
    }
}

impl SequenceState {
    /// The trace of a pass that went non-finite, once ([`super::forward::SequenceCache`]).
    pub fn take_failed_trace(&mut self) -> Option<super::trace::StateTrace> {
        self.failed_trace.take()
    }

    pub fn new(cfg: &ModelConfig) -> Self {
        let lc = &cfg.linear;
        let layers = cfg
            .layer_types
            .iter()
            .map(|k| match k {
                LayerKind::LinearAttention => LayerState::Linear(GdnState {
                    conv: vec![0.0; (lc.conv_kernel - 1) * lc.conv_dim()],
                    ssm: vec![0.0; lc.num_value_heads * lc.key_head_dim * lc.value_head_dim],
                    tape: None,
                    spare: None,
                }),
                LayerKind::FullAttention => LayerState::Attention(KvCache::new(cfg.num_key_value_heads * cfg.head_dim)),
            })
            .collect();
        SequenceState {
            position: 0,
            layers,
            truncations: vec![],
            epoch: 0,
            linear: cfg.linear.clone(),
            failed_trace: None,
        }
    }

    /// Bytes held for rolling back a verify pass: its tapes, or once settled, their buffers
    /// kept for the next pass.
    pub fn tape_bytes(&self) -> usize {
        let held = |g: &GdnState| g.tape.as_ref().or(g.spare.as_deref()).map_or(0, GdnTape::bytes);
        self.layers.iter().map(|l| if let LayerState::Linear(g) = l { held(g) } else { 0 }).sum()
    }

    /// Settles the last verify pass of `T` tokens: keeps its first `keep` tokens and rolls the
    /// rest back — the recurrent state is rebuilt from the tape (bit-identical to having decoded
    /// the kept tokens), the KV caches are truncated.
    pub fn accept(&mut self, keep: usize) -> Result<()> {
        let tokens = self
            .layers
            .iter()
            .find_map(|l| if let LayerState::Linear(g) = l { g.tape.as_ref().map(|t| t.tokens) } else { None })
            .ok_or_else(|| Error::State("accept without a verify pass to settle".into()))?;
        if keep == 0 || keep > tokens {
            return Err(Error::State(format!("cannot keep {keep} of the {tokens} verified tokens")));
        }
        let start = self.position - tokens;
        for l in &mut self.layers {
            match l {
                LayerState::Linear(g) => {
                    let mut tape = g.tape.take().ok_or_else(|| Error::State("a GDN layer has no tape".into()))?;
                    if keep < tokens {
                        tape.rebuild(keep, &self.linear, &mut g.conv, &mut g.ssm);
                    }
                    g.spare = Some(Box::new(tape));
                }
                LayerState::Attention(kv) => kv.truncate(start + keep),
            }
        }
        if keep < tokens {
            self.epoch += 1;
            self.truncations.push((self.epoch, start + keep));
        }
        self.position = start + keep;
        Ok(())
    }

    pub fn bytes(&self) -> StateBytes {
        let mut b = StateBytes::default();
        for l in &self.layers {
            match l {
                LayerState::Linear(g) => b.recurrent_bytes += g.bytes(),
                LayerState::Attention(kv) => {
                    b.kv_bytes += kv.bytes();
                    b.kv_capacity_bytes += kv.capacity_bytes();
                }
            }
        }
        b
    }

    pub fn snapshot(&self) -> StateSnapshot {
        StateSnapshot {
            position: self.position,
            epoch: self.epoch,
            recurrent: self
                .layers
                .iter()
                .map(|l| match l {
                    LayerState::Linear(g) => {
                        Some(GdnState { conv: g.conv.clone(), ssm: g.ssm.clone(), tape: None, spare: None })
                    }
                    LayerState::Attention(_) => None,
                })
                .collect(),
        }
    }

    /// Rolls back to `snap`. Fails (and changes nothing) if the snapshot belongs to another
    /// model shape, lies in the future, or the KV entries below it were rewritten since.
    pub fn restore(&mut self, snap: &StateSnapshot) -> Result<()> {
        if snap.recurrent.len() != self.layers.len() {
            return Err(Error::State(format!(
                "snapshot has {} layers, state has {}",
                snap.recurrent.len(),
                self.layers.len()
            )));
        }
        if snap.position > self.position {
            return Err(Error::State(format!(
                "snapshot at position {} is ahead of the state ({})",
                snap.position, self.position
            )));
        }
        if let Some((_, len)) = self.truncations.iter().find(|(e, len)| *e > snap.epoch && *len < snap.position) {
            return Err(Error::State(format!(
                "snapshot at position {} is stale: the KV cache was rolled back to {len} and rewritten after it was taken",
                snap.position
            )));
        }
        for (l, s) in self.layers.iter_mut().zip(&snap.recurrent) {
            match (l, s) {
                (LayerState::Linear(g), Some(sg)) => g.clone_from(sg),
                (LayerState::Attention(kv), None) => kv.truncate(snap.position),
                _ => return Err(Error::State("snapshot layer kinds do not match the state".into())),
            }
        }
        if snap.position < self.position {
            self.epoch += 1;
            self.truncations.push((self.epoch, snap.position));
        }
        self.position = snap.position;
        Ok(())
    }
}
