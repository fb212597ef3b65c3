//! Phase tracking on token ids: a prompt that ends inside `<think>` starts in thinking,
//! `</think>` switches to the answer, a stop id ends generation.

use super::events::Phase;
use crate::chat::SpecialTokens;

#[derive(Debug, Clone)]
pub struct PhaseTracker {
    think_start: Option<u32>,
    think_end: Option<u32>,
    stop: Vec<u32>,
    phase: Phase,
}

/// What one generated token did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    /// The phase the token counts in (`</think>` counts as thinking: it closes it).
    pub phase: Phase,
    pub is_stop: bool,
    /// The token is a `<think>` / `</think>` marker (kept out of the phase texts).
    pub is_marker: bool,
}

impl PhaseTracker {
    pub fn new(specials: &SpecialTokens, prompt: &[u32]) -> Self {
        let mut t = PhaseTracker {
            think_start: specials.think_start,
            think_end: specials.think_end,
            stop: specials.stop.clone(),
            phase: Phase::Answer,
        };
        for &id in prompt {
            t.observe(id);
        }
        t
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    fn observe(&mut self, id: u32) -> Step {
        let before = self.phase;
        let is_marker = Some(id) == self.think_start || Some(id) == self.think_end;
        if Some(id) == self.think_start {
            self.phase = Phase::Thinking;
        } else if Some(id) == self.think_end {
            self.phase = Phase::Answer;
        }
        let phase = if Some(id) == self.think_start { Phase::Thinking } else { before };
        Step { phase, is_stop: self.stop.contains(&id), is_marker }
    }

    /// Advances over one generated token.
    pub fn step(&mut self, id: u32) -> Step {
        self.observe(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specials() -> SpecialTokens {
        SpecialTokens { think_start: Some(10), think_end: Some(11), stop: vec![2, 3], ..Default::default() }
    }

    #[test]
    fn prompt_ending_inside_think_starts_thinking() {
        let mut t = PhaseTracker::new(&specials(), &[5, 6, 10, 7]);
        assert_eq!(t.phase(), Phase::Thinking);
        assert_eq!(t.step(8), Step { phase: Phase::Thinking, is_stop: false, is_marker: false });
        assert_eq!(t.step(11), Step { phase: Phase::Thinking, is_stop: false, is_marker: true });
        assert_eq!(t.phase(), Phase::Answer);
        assert_eq!(t.step(9).phase, Phase::Answer);
        assert!(t.step(3).is_stop);
    }

    #[test]
    fn closed_think_block_in_prompt_starts_answering() {
        let t = PhaseTracker::new(&specials(), &[10, 11, 5]);
        assert_eq!(t.phase(), Phase::Answer);
        let mut t = PhaseTracker::new(&specials(), &[5]);
        assert_eq!(t.phase(), Phase::Answer);
        assert_eq!(t.step(10).phase, Phase::Thinking);
        assert_eq!(t.phase(), Phase::Thinking);
    }
}
