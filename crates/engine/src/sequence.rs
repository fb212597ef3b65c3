//! What the generation loop needs from a model: feed tokens and get the next-token logits; and,
//! for speculative decoding, draft with the MTP head, verify a block, keep a prefix. The
//! in-process model implements it over its per-sequence state; tests script it.

use deltascope_model::{DraftCache, Forward, ForwardOptions, LogitsRows, Mat, Model, SequenceCache, StateTrace};
use deltascope_model::{Error, Result};
use deltascope_protocol::{DeviceMemory, Memory, Numerics};

pub trait DecodeSequence {
    /// Feeds `ids` (the prompt, a sampled token, or a block of forced tokens) and returns the
    /// logits after the last one.
    fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>>;
    /// Tokens consumed so far.
    fn position(&self) -> usize;
    /// The most tokens the sequence may hold.
    fn context_len(&self) -> usize;
    fn memory(&self) -> Memory;
    /// What computes this sequence's numbers (`None`: a scripted sequence).
    fn numerics(&self) -> Option<Numerics> {
        None
    }

    /// Whether [`DecodeSequence::draft`] works (the model has an MTP head and drafting is on).
    fn can_draft(&self) -> bool {
        false
    }

    /// Drafts up to `k` tokens to follow `last` (sampled, not fed yet): `choose` picks each draft
    /// from the draft logits. Returns `(token, draft logits)` per step.
    fn draft(&mut self, _last: u32, _k: usize, _choose: &mut dyn FnMut(&[f32]) -> u32) -> Result<Vec<(u32, Vec<f32>)>> {
        Err(Error::InvalidArgument("this model cannot draft (no MTP head)".into()))
    }

    /// Runs the MTP head over every position the target has read whose next token is known
    /// (all but the last), so the next [`DecodeSequence::draft`] only covers the newest one. Called
    /// right after the prompt: that pass is part of reading the prompt (prefill and TTFT), not of
    /// decoding.
    fn catch_up_draft(&mut self) -> Result<()> {
        Ok(())
    }

    /// Feeds `ids` as one verify pass; returns the logits after each of them.
    fn verify(&mut self, _ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        Err(Error::InvalidArgument("this model cannot verify drafts".into()))
    }

    /// Keeps the first `keep` tokens of the last verify pass and rolls the rest back.
    fn accept(&mut self, _keep: usize) -> Result<()> {
        Err(Error::InvalidArgument("this model cannot roll back".into()))
    }

    /// Bytes held to roll back the last verify pass.
    fn rollback_bytes(&self) -> usize {
        0
    }

    /// Turns the state trace on for the passes that follow ([`DecodeSequence::take_trace`]).
    fn trace_state(&mut self) -> Result<()> {
        Err(Error::InvalidArgument("this model cannot trace its state".into()))
    }

    /// The trace of the last [`DecodeSequence::feed`], when tracing is on.
    fn take_trace(&mut self) -> Option<StateTrace> {
        None
    }
}

/// What the engine needs from a loaded model on some device: fresh sequences to generate
/// with, and a prompt check before anything starts. Every [`Forward`] model (the CPU [`Model`],
/// the CUDA model) implements it through [`ModelSequence`], so every front end, MTP, budgets and
/// the loop alarm run on either unchanged.
pub trait Compute: Send + Sync {
    /// A new sequence at position 0; with `drafting`, one that drafts with the model's MTP head
    /// (plain when it has none). Fails when the device cannot hold another sequence's state.
    fn sequence(&self, drafting: bool) -> Result<Box<dyn DecodeSequence + '_>>;
    /// Validates a prompt (ids in the vocabulary, prompt + max_tokens within the context).
    fn check(&self, prompt: &[u32], max_tokens: usize) -> Result<()>;
    /// Why sequences here cannot trace their state (`None`: they can).
    fn state_trace_refusal(&self) -> Option<&'static str>;
}

impl<M: Forward> Compute for M {
    fn state_trace_refusal(&self) -> Option<&'static str> {
        Forward::state_trace_refusal(self)
    }

    fn sequence(&self, drafting: bool) -> Result<Box<dyn DecodeSequence + '_>> {
        Ok(Box::new(if drafting { ModelSequence::try_with_mtp(self)? } else { ModelSequence::try_new(self)? }))
    }

    fn check(&self, prompt: &[u32], max_tokens: usize) -> Result<()> {
        check_prompt(self, prompt, max_tokens)
    }
}

/// A sequence on an in-process model (any device).
pub struct ModelSequence<'m, M: Forward = Model> {
    pub(crate) model: &'m M,
    pub(crate) state: M::Cache,
    /// The MTP head's own KV cache, when drafting is on.
    mtp: Option<M::Draft>,
    /// Tokens the target has consumed since the MTP head last caught up, with their post-norm
    /// hidden states: the next draft's first pass covers them (model-spec §6.2).
    pending_ids: Vec<u32>,
    pending_hidden: Vec<f32>,
    /// The last verify pass: its tokens and hidden states, until `accept`.
    verified: Option<(Vec<u32>, Mat)>,
    /// Trace the state of every pass; the last pass's trace until taken.
    tracing: bool,
    trace: Option<StateTrace>,
}

impl<'m> ModelSequence<'m, Model> {
    pub fn new(model: &'m Model) -> Self {
        ModelSequence {
            model,
            state: model.new_state(),
            mtp: None,
            pending_ids: vec![],
            pending_hidden: vec![],
            verified: None,
            tracing: false,
            trace: None,
        }
    }

    /// A session that can draft with the checkpoint's MTP head (plain, when it has none).
    pub fn with_mtp(model: &'m Model) -> Self {
        let mut s = ModelSequence::new(model);
        s.mtp = model.new_mtp_state();
        s
    }
}

impl<'m, M: Forward> ModelSequence<'m, M> {
    pub fn try_new(model: &'m M) -> Result<Self> {
        Ok(ModelSequence {
            model,
            state: model.new_cache()?,
            mtp: None,
            pending_ids: vec![],
            pending_hidden: vec![],
            verified: None,
            tracing: false,
            trace: None,
        })
    }

    pub fn try_with_mtp(model: &'m M) -> Result<Self> {
        let mut s = ModelSequence::try_new(model)?;
        s.mtp = model.new_draft_cache()?;
        Ok(s)
    }

    fn remember(&mut self, ids: &[u32], hidden: &Mat) {
        if self.mtp.is_some() {
            self.pending_ids.extend_from_slice(ids);
            self.pending_hidden.extend_from_slice(&hidden.data);
        }
    }
}

impl<M: Forward> DecodeSequence for ModelSequence<'_, M> {
    fn numerics(&self) -> Option<Numerics> {
        let l = self.model.compute_label();
        Some(Numerics { device: l.device, dtype: l.dtype.into(), kernel: l.kernel })
    }

    fn feed(&mut self, ids: &[u32]) -> Result<Vec<f32>> {
        let opts = ForwardOptions { trace_state: self.tracing, ..Default::default() };
        let out = match self.model.forward_cached(ids, &mut self.state, opts) {
            Ok(out) => out,
            Err(e) => {
                // The pass that went non-finite: its trace up to the failure, for the state event.
                self.trace = self.state.take_failed_trace();
                return Err(e);
            }
        };
        self.remember(ids, &out.hidden);
        self.trace = out.state_trace;
        Ok(out.logits.data)
    }

    fn position(&self) -> usize {
        self.state.position()
    }

    fn context_len(&self) -> usize {
        self.model.config().max_position_embeddings
    }

    fn memory(&self) -> Memory {
        let b = self.state.bytes();
        let mtp_kv = self.mtp.as_ref().map_or(0, |m| m.bytes());
        let weights = self.model.device_weights();
        let last = weights.len().saturating_sub(1);
        let devices = weights
            .into_iter()
            .zip(self.state.device_bytes())
            .enumerate()
            .map(|(i, ((device, weights_bytes), s))| DeviceMemory {
                device,
                weights_bytes,
                // The MTP head lives on the last device.
                kv_bytes: s.kv_bytes + if i == last { mtp_kv } else { 0 },
                recurrent_bytes: s.recurrent_bytes,
            })
            .collect();
        Memory {
            weights_bytes: self.model.weight_bytes(),
            kv_bytes: b.kv_bytes + mtp_kv,
            recurrent_bytes: b.recurrent_bytes,
            snapshot_bytes: self.state.rollback_bytes(),
            devices,
        }
    }

    fn can_draft(&self) -> bool {
        self.mtp.is_some()
    }

    fn catch_up_draft(&mut self) -> Result<()> {
        let Some(mtp) = self.mtp.as_mut() else { return Ok(()) };
        let n = self.pending_ids.len();
        if n < 2 {
            return Ok(());
        }
        let h = self.model.config().hidden_size;
        // Entry p pairs x_{p+1} with h_p: every pending position but the last has its x_{p+1}.
        let next = self.pending_ids[1..].to_vec();
        let hidden = Mat::from_vec(n - 1, h, self.pending_hidden[..(n - 1) * h].to_vec());
        self.model.mtp_forward_cached(&next, &hidden, mtp, LogitsRows::Last)?;
        self.pending_ids.drain(..n - 1);
        self.pending_hidden.drain(..(n - 1) * h);
        Ok(())
    }

    fn draft(&mut self, last: u32, k: usize, choose: &mut dyn FnMut(&[f32]) -> u32) -> Result<Vec<(u32, Vec<f32>)>> {
        let mtp =
            self.mtp.as_mut().ok_or_else(|| Error::InvalidArgument("this model cannot draft (no MTP head)".into()))?;
        if k == 0 {
            return Ok(vec![]);
        }
        let h = self.model.config().hidden_size;
        let n = self.pending_ids.len();
        if n == 0 || mtp.position() + n != self.state.position() {
            return Err(Error::State(format!(
                "MTP head out of step: it covers {} positions, {} are pending, the model is at {}",
                mtp.position(),
                n,
                self.state.position()
            )));
        }
        // First pass over every position the target just processed: entry p pairs x_{p+1}
        // with h_p (the last entry pairs the newly sampled token with the last hidden state).
        let mut next: Vec<u32> = self.pending_ids[1..].to_vec();
        next.push(last);
        let hidden = Mat::from_vec(n, h, std::mem::take(&mut self.pending_hidden));
        self.pending_ids.clear();
        let out = self.model.mtp_forward_cached(&next, &hidden, mtp, LogitsRows::Last)?;
        let committed = mtp.position();
        let mut drafts = vec![];
        let mut logits = out.logits.data;
        let mut h_prev = out.hidden.gather_rows(&[out.hidden.rows - 1]);
        loop {
            let d = choose(&logits);
            drafts.push((d, logits));
            if drafts.len() == k {
                break;
            }
            // Chained steps reuse the layer on the previous draft and the head's own output.
            let o = self.model.mtp_forward_cached(&[d], &h_prev, mtp, LogitsRows::Last)?;
            logits = o.logits.data;
            h_prev = o.hidden;
        }
        // The chained entries are rewritten from real hidden states next round.
        mtp.truncate(committed);
        Ok(drafts)
    }

    fn verify(&mut self, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        let opts = ForwardOptions { logits: LogitsRows::All, verify: true, ..Default::default() };
        let out = self.model.forward_cached(ids, &mut self.state, opts)?;
        let rows = (0..out.logits.rows).map(|r| out.logits.row(r).to_vec()).collect();
        self.verified = Some((ids.to_vec(), out.hidden));
        Ok(rows)
    }

    fn accept(&mut self, keep: usize) -> Result<()> {
        let (ids, hidden) = self.verified.take().ok_or_else(|| Error::State("accept without a verify pass".into()))?;
        self.state.accept(keep)?;
        let kept = hidden.gather_rows(&(0..keep).collect::<Vec<_>>());
        self.remember(&ids[..keep], &kept);
        Ok(())
    }

    fn rollback_bytes(&self) -> usize {
        self.state.rollback_bytes()
    }

    fn trace_state(&mut self) -> Result<()> {
        self.tracing = true;
        Ok(())
    }

    fn take_trace(&mut self) -> Option<StateTrace> {
        self.trace.take()
    }
}

/// Validates a prompt against the model before generation starts.
pub fn check_prompt<M: Forward>(model: &M, prompt: &[u32], max_tokens: usize) -> Result<()> {
    if prompt.is_empty() {
        return Err(Error::InvalidArgument("the prompt is empty".into()));
    }
    model.validate_at(prompt, 0)?;
    let max = model.config().max_position_embeddings;
    if prompt.len() + max_tokens > max {
        return Err(Error::ContextOverflow { needed: prompt.len() + max_tokens, max });
    }
    Ok(())
}
