//! Reference mode: the shown turn re-scored by the local reference engine (`--reference`),
//! shown in the compare view with each token coloured by its agreement, the inspector giving
//! both log-probabilities, and a key to the first divergence.

use std::collections::BTreeMap;

use super::{App, Effect, Level};
use crate::tui::keymap::Action;
use crate::verify::rescore::Rescore;
use deltascope_protocol::TokenEvent;

/// The reference engine and the turns it re-scored.
#[derive(Debug, Default)]
pub struct ReferenceState {
    /// What `--reference` named (`None`: no reference this run).
    pub asked: Option<String>,
    /// The loaded reference's name.
    pub name: Option<String>,
    /// Why it could not be loaded.
    pub error: Option<String>,
    /// The turn being re-scored.
    pub pending: Option<usize>,
    /// Re-scored turns, by index.
    pub scores: BTreeMap<usize, Rescore>,
    /// The compare view shows this turn against the reference (rather than a re-run).
    pub shown: Option<usize>,
}

impl ReferenceState {
    /// Why the reference is not the same model as the subject, from the shown turn's rescore.
    pub fn not_same_model(&self) -> Option<&str> {
        self.shown.and_then(|i| self.scores.get(&i)).and_then(|r| r.not_same_model.as_deref())
    }
}

impl App {
    /// A reference was asked for: the status bar says so while it loads.
    pub fn expect_reference(&mut self, what: impl Into<String>) {
        self.reference.asked = Some(what.into());
    }

    /// The runner loaded the reference (its name) or could not.
    pub fn reference_loaded(&mut self, result: Result<String, String>) {
        match result {
            Ok(name) => {
                let key = self.look.keymap.first(Action::ReferenceCheck);
                self.say(Level::Info, format!("reference {name} loaded: {key} re-scores the shown turn with it"));
                self.reference.name = Some(name);
            }
            Err(e) => {
                self.say(Level::Error, format!("the reference could not be loaded: {e}"));
                self.reference.error = Some(e);
            }
        }
        self.out.dirty = true;
    }

    /// The reference's verdict on a turn, or why there is none.
    pub fn rescored(&mut self, turn: usize, result: Result<Box<Rescore>, String>) {
        // A result for turns that have changed since it was asked for is dropped.
        if self.reference.pending != Some(turn) {
            return;
        }
        self.reference.pending = None;
        match result {
            Ok(r) => {
                let [agree, drift, diverge, _] = r.counts();
                let key = self.look.keymap.first(Action::FirstDivergence);
                let verdict = match (diverge, drift) {
                    (0, 0) => "agrees".to_string(),
                    (0, _) => format!("drifts ({key} jumps to the worst token)"),
                    _ => format!("DIVERGES ({key} jumps to the first divergence)"),
                };
                let level = if diverge > 0 { Level::Warning } else { Level::Info };
                self.say(
                    level,
                    format!(
                        "turn {}: the reference {verdict}: {agree} tokens agree, {drift} drift, {diverge} diverge ({:.1} s)",
                        turn + 1,
                        r.seconds
                    ),
                );
                if let Some(why) = &r.not_same_model {
                    self.say(Level::Warning, format!("the reference is not the same model: {why}"));
                }
                self.reference.scores.insert(turn, *r);
            }
            Err(e) => self.say(Level::Error, format!("re-scoring turn {} failed: {e}", turn + 1)),
        }
        self.out.dirty = true;
    }

    /// Re-scores the shown turn with the reference and shows it in the compare view.
    pub(super) fn reference_check(&mut self) {
        let Some(i) = self.shown_index() else {
            return self.say(Level::Info, "nothing to re-score yet: send a prompt first");
        };
        if self.reference.asked.is_none() {
            return self.say(
                Level::Info,
                "no reference: start with --reference DIR (a checkpoint of the same model) or --reference demo",
            );
        }
        if let Some(e) = &self.reference.error {
            let e = e.clone();
            return self.say(Level::Error, format!("no reference: {e}"));
        }
        if self.reference.name.is_none() {
            return self.say(Level::Info, "the reference is still loading");
        }
        let t = &self.convo.session.turns[i];
        if self.convo.live.is_some_and(|l| l.turn == i) {
            return self.say(Level::Info, "the turn is still generating: re-score it when it ends");
        }
        if t.tokens.is_empty() {
            return self.say(Level::Info, "the turn has no tokens to re-score");
        }
        let upto = t.compare_of.unwrap_or(i);
        let prompt = crate::backend::Prompt::Chat(self.convo.session.messages(upto, &t.user));
        let tokens: Vec<TokenEvent> = t.tokens.iter().map(|x| x.ev.clone()).collect();
        let params = Box::new(t.params.clone());
        self.show_reference(i);
        if self.reference.scores.contains_key(&i) || self.reference.pending == Some(i) {
            return;
        }
        self.reference.pending = Some(i);
        self.say(Level::Info, format!("re-scoring turn {} ({} tokens) with the reference…", i + 1, tokens.len()));
        self.out.effects.push(Effect::Rescore { turn: i, prompt, params, tokens });
    }

    /// The compare view on turn `i` against the reference.
    fn show_reference(&mut self, i: usize) {
        if self.view.state.shown {
            self.toggle_state_view();
        }
        self.reference.shown = Some(i);
        self.view.selected_turn = Some(i);
        self.view.show_compare = true;
    }

    /// Moves the inspector to the shown turn's first divergence (else its worst token).
    pub(super) fn first_divergence(&mut self) {
        let Some(i) = self.shown_index() else { return };
        let Some(r) = self.reference.scores.get(&i) else {
            let key = self.look.keymap.first(Action::ReferenceCheck);
            return self.say(Level::Info, format!("turn {} is not re-scored: {key} re-scores it", i + 1));
        };
        match r.first_divergence() {
            Some(at) => {
                let what = if r.counts()[2] > 0 { "first divergence" } else { "the token furthest from agreeing" };
                self.say(Level::Info, format!("token #{at}: {what}"));
                self.show_reference(i);
                self.view.inspector = Some(at);
            }
            None => self.say(Level::Info, "every token agrees with the reference"),
        }
    }

    /// The reference's state (drawing reads it).
    pub fn reference(&self) -> &ReferenceState {
        &self.reference
    }

    /// The turn the compare view shows against the reference, with its rescore once done.
    pub fn reference_shown(&self) -> Option<(usize, Option<&Rescore>)> {
        let i = self.reference.shown.filter(|&i| self.view.show_compare && self.shown_index() == Some(i))?;
        Some((i, self.reference.scores.get(&i)))
    }

    /// The turns changed under the scores (a deletion, a new conversation, a loaded session).
    pub(super) fn forget_rescores(&mut self) {
        self.reference.scores.clear();
        self.reference.pending = None;
        self.reference.shown = None;
    }
}
