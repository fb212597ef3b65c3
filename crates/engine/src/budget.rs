//! The forced end of thinking when the thinking budget is spent, or when a loop in thinking is
//! rescued (`--on-loop answer`, or the user's key): the bridge text and `</think>` (what
//! llama.cpp and vLLM force for a budget); the model writes what follows, the blank line
//! included.

use super::sequence::DecodeSequence;
use crate::generator::Generator;
use crate::run::{Rounds, Run, emit_state};
use deltascope_model::Result;
use deltascope_protocol::TextTokenizer;
use deltascope_protocol::{DraftKind, FinishReason, Verdict};

/// The token ids forced to end thinking (empty when the tokenizer has no `</think>`).
pub(super) struct ForcedClose {
    ids: Vec<u32>,
}

impl ForcedClose {
    /// Built without a budget too: its length sizes the fix offered for a starved answer.
    pub(crate) fn new(tokenizer: &TextTokenizer, bridge: &str) -> Result<Self> {
        let Some(end) = tokenizer.specials.think_end else { return Ok(ForcedClose { ids: vec![] }) };
        let mut ids = tokenizer.encode(bridge)?;
        ids.push(end);
        Ok(ForcedClose { ids })
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Appends the forced tokens (as many as max_tokens leaves room for) and feeds them.
    pub(crate) fn force(
        &self,
        g: &Generator,
        run: &mut Run,
        source: &mut dyn DecodeSequence,
        logits: &[f32],
        req: &super::GenerateRequest,
    ) -> Result<Rounds> {
        let block = &self.ids[..self.ids.len().min(run.tally.room())];
        let at = run.tokens.len();
        run.tally.forced_close("the engine", Some(self.ids.len()), run.emit);
        for &id in block {
            if let Verdict::Finish(f) = g.append(run, req, id, true, logits, DraftKind::None) {
                return Ok(Rounds::Finished(f));
            }
        }
        if block.len() < self.ids.len() {
            return Ok(Rounds::Finished(FinishReason::Length));
        }
        let next = source.feed(block)?;
        emit_state(run, source, Some(at));
        Ok(Rounds::Fed(next))
    }
}
