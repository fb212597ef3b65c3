//! The generation loop: prefill, then one token at a time, emitting events as it goes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::events::{DraftKind, EngineEvent, FinishReason, Memory, Phase, Timing, Usage};
use super::reasoning::PhaseTracker;
use super::request::GenerateRequest;
use super::sampler::{Rng, logprob, sample};
use crate::chat::{IncrementalDecoder, TextTokenizer};
use crate::error::{Error, Result};
use crate::model::{ForwardOptions, Model};

/// What a finished generation produced (also sent as the `done` event).
#[derive(Debug, Clone)]
pub struct Outcome {
    pub finish_reason: FinishReason,
    pub tokens: Vec<u32>,
    pub usage: Usage,
    pub timing: Timing,
    pub thinking: String,
    pub answer: String,
}

pub struct Generator<'a> {
    pub model: &'a Model,
    pub tokenizer: &'a TextTokenizer,
    /// A label for the `start` event.
    pub model_name: String,
}

impl Generator<'_> {
    /// Runs `req` to completion, cancellation or error. Cancellation is checked before every
    /// token, so it takes effect within one token and keeps everything produced.
    pub fn generate(
        &self,
        req: &GenerateRequest,
        cancel: &AtomicBool,
        emit: &mut dyn FnMut(EngineEvent),
    ) -> Result<Outcome> {
        let started = Instant::now();
        let p = &req.params;
        if req.prompt_ids.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty".into()));
        }
        if p.max_tokens == 0 {
            return Err(Error::InvalidArgument("max_tokens must be at least 1".into()));
        }
        let mut state = self.model.new_state();
        self.model.validate(&req.prompt_ids, &state)?;
        let max_ctx = self.model.config.max_position_embeddings;
        if req.prompt_ids.len() + p.max_tokens > max_ctx {
            return Err(Error::ContextOverflow { needed: req.prompt_ids.len() + p.max_tokens, max: max_ctx });
        }
        let mut phases = PhaseTracker::new(&self.tokenizer.specials, &req.prompt_ids);
        emit(EngineEvent::Start {
            model: self.model_name.clone(),
            prompt_tokens: req.prompt_ids.len(),
            phase: phases.phase(),
            params: p.clone(),
        });

        let mut rng = Rng::new(p.seed);
        let mut decoder = IncrementalDecoder::default();
        let mut tokens = vec![];
        let (mut thinking, mut answer) = (String::new(), String::new());
        let mut usage = Usage { prompt_tokens: req.prompt_ids.len(), ..Default::default() };
        let mut finish = FinishReason::Length;

        let prefill_started = Instant::now();
        let mut logits_row = if cancel.load(Ordering::Relaxed) {
            finish = FinishReason::Cancelled;
            None
        } else {
            Some(self.model.forward(&req.prompt_ids, &mut state, ForwardOptions::default())?.logits.data)
        };
        let prefill_s = prefill_started.elapsed().as_secs_f64();
        let mut first_token_at = None;
        while let Some(logits) = logits_row.take() {
            if cancel.load(Ordering::Relaxed) {
                finish = FinishReason::Cancelled;
                break;
            }
            let id = sample(&logits, p.temperature, &mut rng);
            let lp = logprob(&logits, id);
            first_token_at.get_or_insert_with(|| started.elapsed().as_secs_f64());
            let step = phases.step(id);
            let text = if step.is_stop { String::new() } else { decoder.push(self.tokenizer, id) };
            let (count, buf) = match step.phase {
                Phase::Thinking => (&mut usage.thinking_tokens, &mut thinking),
                Phase::Answer => (&mut usage.answer_tokens, &mut answer),
            };
            *count += 1;
            if !step.is_marker {
                buf.push_str(&text);
            }
            emit(EngineEvent::Token {
                index: tokens.len(),
                phase: step.phase,
                id,
                text,
                logprob: lp,
                draft: DraftKind::None,
                forced: false,
            });
            tokens.push(id);
            if step.is_stop {
                finish = FinishReason::Stop;
                break;
            }
            if tokens.len() >= p.max_tokens {
                finish = FinishReason::Length;
                break;
            }
            logits_row = Some(self.model.forward(&[id], &mut state, ForwardOptions::default())?.logits.data);
        }
        // Bytes of an incomplete character at the very end.
        let tail = decoder.finish();
        match phases.phase() {
            Phase::Thinking => thinking.push_str(&tail),
            Phase::Answer => answer.push_str(&tail),
        }
        usage.completion_tokens = usage.thinking_tokens + usage.answer_tokens;
        let total = started.elapsed().as_secs_f64();
        let ttft = first_token_at.unwrap_or(total);
        let timing = Timing {
            ttft_ms: ttft * 1e3,
            prefill_tok_s: req.prompt_ids.len() as f64 / prefill_s.max(1e-9),
            decode_tok_s: if tokens.len() > 1 { (tokens.len() - 1) as f64 / (total - ttft).max(1e-9) } else { 0.0 },
            total_ms: total * 1e3,
        };
        let sb = state.bytes();
        let memory = Memory {
            weights_bytes: self.model.weight_bytes(),
            kv_bytes: sb.kv_bytes,
            recurrent_bytes: sb.recurrent_bytes,
            snapshot_bytes: 0,
        };
        emit(EngineEvent::Done {
            finish_reason: finish,
            usage: usage.clone(),
            timing: timing.clone(),
            memory,
            thinking: thinking.clone(),
            answer: answer.clone(),
        });
        Ok(Outcome { finish_reason: finish, tokens, usage, timing, thinking, answer })
    }
}
