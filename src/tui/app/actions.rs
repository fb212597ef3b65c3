//! What each bound action does. Actions are grouped by what they change: the generation in
//! flight, the conversation, the view, the settings, and the files.

use ratatui::crossterm::event::{KeyCode, KeyEvent};

use super::Level;
use super::key_ctx;
use super::overlay::{Overlay, line_input};
use super::{App, ColourMode, EditTarget, Effect, Focus};
use crate::tui::keymap::Action;
use crate::tui::panel::{Handled, Panel};
use crate::tui::panels::inspector::Inspector;
use crate::tui::panels::state_scope::StateKeys;
use crate::tui::panels::transcript::Pane;
use crate::tui::sliders::Slider;
use deltascope_protocol::{Phase, Thinking};

impl App {
    /// Runs an action; `false` lets the key fall through (e.g. Enter outside the input).
    pub fn dispatch(&mut self, a: Action) -> bool {
        match a {
            Action::Quit => self.request_quit(),
            Action::CancelOrQuit | Action::Cancel => self.cancel(a == Action::CancelOrQuit),
            Action::Send => return self.send_key(),
            Action::Newline => {
                if self.view.focus != Focus::Input {
                    return false;
                }
                self.composer.newline();
            }
            Action::HistoryPrev => self.composer.recall(-1),
            Action::HistoryNext => self.composer.recall(1),
            Action::Regenerate => self.regenerate(),
            Action::EditPrompt => self.edit_prompt(),
            Action::EditSystem => self.edit_system(),
            Action::DeleteTurn => self.delete_turn(),
            Action::Continue => self.continue_turn(),
            Action::NewConversation => self.new_conversation(),
            Action::ShowPrompt => self.show_prompt(),
            Action::Compare => self.compare(),
            Action::ReferenceCheck => self.reference_check(),
            Action::FirstDivergence => self.first_divergence(),
            Action::StepMode | Action::Step => self.step_action(a),
            Action::EndThinking => self.end_thinking(),
            Action::RaiseMaxTokens | Action::SetThinkingBudget => self.fix_action(a),
            Action::ToggleThinking => {
                self.settings.toggle_thinking();
                let on = if self.settings.params.thinking.is_on() { "on" } else { "off" };
                self.say(Level::Info, format!("thinking {on} for the next generation"));
            }
            Action::Picker | Action::Export | Action::Replay | Action::Messages | Action::Help => self.file_action(a),
            Action::StateView => self.toggle_state_view(),
            Action::TraceState => self.toggle_trace(),
            Action::CopyAnswer => self.copy(Phase::Answer),
            Action::CopyThinking => self.copy(Phase::Thinking),
            _ => self.view_action(a),
        }
        true
    }

    /// A key no action took: the focused panel's own keys (the open inspector's first).
    pub(super) fn focused_key(&mut self, k: KeyEvent) {
        let mut ctx = key_ctx(&self.look, self.now_ms, &mut self.out, &mut self.messages);
        let shown = self.convo.shown_turn(self.view.selected_turn);
        if self.view.focus == Focus::State {
            let dims = shown
                .and_then(|t| {
                    let (_, ev) = t.state_at(None)?;
                    let heads = ev.gdn.iter().map(|l| l.beta.len()).max().unwrap_or(0);
                    Some((ev.gdn.len(), heads, t.tokens.len()))
                })
                .unwrap_or((0, 0, 0));
            let with = StateKeys { cursor: &mut self.view.inspector, dims };
            if self.view.state.key(k, with, &mut ctx) == Handled::NotConsumed && k.code == KeyCode::Char('t') {
                self.toggle_trace();
            }
            return;
        }
        let tokens = shown.map_or(0, |t| t.tokens.len());
        if let Some(cursor) = self.view.inspector.as_mut()
            && Inspector.key(k, (cursor, tokens), &mut ctx) == Handled::Consumed
        {
            return;
        }
        match self.view.focus {
            Focus::Input => _ = self.composer.key(k, (), &mut ctx),
            Focus::Sliders => {
                let cap = self.settings.max_tokens_cap(self.convo.history_tokens_before_next());
                _ = self.view.sliders.key(k, (&mut self.settings, cap), &mut ctx);
            }
            Focus::State => {}
            Focus::Thinking => _ = self.view.panes.key(k, Pane::Thinking, &mut ctx),
            Focus::Answer => _ = self.view.panes.key(k, Pane::Answer, &mut ctx),
        }
    }

    fn send_key(&mut self) -> bool {
        match self.view.focus {
            Focus::Input => self.send(),
            // Enter on a slider: type its value.
            Focus::Sliders => {
                let slider = Slider::ALL[self.view.sliders.selected];
                let current = slider.typed_value(&self.settings);
                // Shown selected, so typing replaces it (←/→ keep it for editing).
                let mut input = line_input(&current);
                input.select_all();
                self.overlay = Overlay::SliderValue { slider, input, error: None };
            }
            Focus::Thinking | Focus::Answer | Focus::State => return false,
        }
        true
    }

    fn cancel(&mut self, or_quit: bool) {
        if self.generating() {
            self.out.effects.push(Effect::Cancel);
            self.say(Level::Info, "cancelling… (output kept)");
        } else if self.convo.replay.take().is_some() {
            self.say(Level::Info, "replay stopped");
        } else if or_quit {
            self.request_quit();
        } else if self.view.state.shown {
            self.toggle_state_view();
        } else if self.view.inspector.is_some() || self.view.show_compare {
            self.view.inspector = None;
            self.view.show_compare = false;
        } else if self.view.focus != Focus::Input {
            self.view.focus = Focus::Input;
        } else if self.composer.target != EditTarget::NewTurn {
            self.composer.clear();
            self.say(Level::Info, "editing abandoned");
        } else if self.view.selected_turn.is_some() {
            self.view.selected_turn = None;
            self.view.reset_panes();
            self.sync_markdown();
        }
    }

    /// Ends the thinking of the generation in flight: the engine (or, for a server, deltascope
    /// client-side) forces the bridge text and `</think>`, and the model answers.
    fn end_thinking(&mut self) {
        let key = self.look.keymap.first(Action::EndThinking);
        if !self.generating() || self.live_phase() != Some(Phase::Thinking) {
            self.say(Level::Info, format!("{key} ends thinking while the model is thinking"));
            return;
        }
        if let Some(why) = self.backend.model.as_ref().and_then(|m| m.end_thinking.reason()) {
            self.say(Level::Info, format!("ending thinking is not available: {why}"));
            return;
        }
        self.out.effects.push(Effect::EndThinking);
        self.say(Level::Info, "ending thinking: the bridge text and </think> are forced, then the model answers");
    }

    fn step_action(&mut self, a: Action) {
        if a == Action::Step {
            if self.view.step_mode {
                self.out.effects.push(Effect::Step);
            } else {
                let key = self.look.keymap.first(Action::StepMode);
                self.say(Level::Info, format!("not in step mode ({key} turns it on)"));
            }
            return;
        }
        if let Some(why) = self.backend.model.as_ref().and_then(|m| m.step.reason()) {
            self.say(Level::Info, format!("step mode is not available: {why}"));
            return;
        }
        self.view.step_mode = !self.view.step_mode;
        self.out.effects.push(Effect::SetPaused(self.view.step_mode));
        let step = self.look.keymap.first(Action::Step);
        let msg =
            if self.view.step_mode { format!("step mode: {step} advances one token") } else { "step mode off".into() };
        self.say(Level::Info, msg);
    }

    /// The banners' one-key fixes: the shown turn's diagnostic says what to change (F3: a
    /// larger max_tokens; F4: a thinking budget with room for the forced end of thinking and an
    /// answer), and the last turn is re-run with it. Nothing changes when there is nothing to
    /// fix, or when the fix would offer the current value again.
    fn fix_action(&mut self, a: Action) {
        let key = self.look.keymap.first(a);
        let (Some(t), Some(shown)) = (self.shown(), self.shown_index()) else {
            self.say(Level::Info, format!("{key}: nothing to fix yet"));
            return;
        };
        let cap = self.settings.max_tokens_cap(t.prompt_tokens);
        let Some(fix) = t.fix(cap) else {
            let what = if a == Action::RaiseMaxTokens {
                "an empty or cut answer"
            } else {
                "an empty answer (thinking ate max_tokens)"
            };
            self.say(Level::Info, format!("{key} fixes {what}; turn {} has none", shown + 1));
            return;
        };
        if shown + 1 != self.convo.session.turns.len() {
            self.say(Level::Info, format!("{key} re-runs the last turn: show it to fix it"));
            return;
        }
        let (max_tokens, budget) = (t.params.max_tokens, t.params.thinking.budget());
        let p = &mut self.settings.params;
        let msg = if a == Action::RaiseMaxTokens {
            match fix.max_tokens.map(|m| m.min(cap)).filter(|&m| m > max_tokens) {
                Some(m) => {
                    p.max_tokens = m;
                    format!("max_tokens = {m}")
                }
                None => {
                    return self.say(
                        Level::Warning,
                        format!("max_tokens {max_tokens} cannot grow: the context has no more room"),
                    );
                }
            }
        } else {
            let fits = fix
                .thinking_budget
                .filter(|b| b.max_tokens <= cap && budget.is_none_or(|c| b.thinking_budget < c) && b.answer_room > 0);
            match fits {
                Some(b) => {
                    p.thinking = Thinking::from_budget(Some(b.thinking_budget));
                    p.max_tokens = b.max_tokens;
                    let approx = if b.forced_exact { "" } else { "≈" };
                    format!(
                        "thinking budget = {}, max_tokens = {} ({approx}{} forced to end thinking, {approx}{} left for the answer)",
                        b.thinking_budget, b.max_tokens, b.forced_tokens, b.answer_room
                    )
                }
                None => {
                    return self.say(
                        Level::Warning,
                        "no thinking budget leaves room for the forced end of thinking and an answer in this context",
                    );
                }
            }
        };
        self.say(Level::Info, msg);
        self.regenerate();
    }

    fn file_action(&mut self, a: Action) {
        match a {
            Action::Help => self.overlay = Overlay::Help,
            Action::Messages => {
                if self.messages.items.is_empty() {
                    self.say(Level::Info, "no messages yet");
                }
                self.overlay = Overlay::Messages;
            }
            Action::Picker => match self.convo.save.dir.path.clone() {
                Some(dir) => self.out.effects.push(Effect::ListSessions(dir)),
                None => self.show_sessions(vec![]),
            },
            Action::Export => self.export(),
            Action::Replay => self.start_replay(self.convo.session.clone()),
            _ => {}
        }
    }

    fn view_action(&mut self, a: Action) {
        match a {
            Action::CollapseThinking => self.view.thinking_view = self.view.thinking_view.next(),
            Action::CompareView => {
                if self.compare_pair().is_some() || self.reference.shown.is_some() {
                    // The comparison and the State view take the panes' place: one at a time.
                    if self.view.state.shown {
                        self.toggle_state_view();
                        self.view.show_compare = true;
                    } else {
                        self.view.show_compare = !self.view.show_compare;
                    }
                } else {
                    let key = self.look.keymap.first(Action::Compare);
                    self.say(Level::Info, format!("no comparison yet ({key} re-runs the last prompt)"));
                }
            }
            Action::ColourMode => {
                let why = self.backend.model.as_ref().and_then(|m| m.provenance.reason().map(str::to_string));
                self.view.colour_mode = match (self.view.colour_mode, why) {
                    (ColourMode::Phase, _) => ColourMode::Logprob,
                    (ColourMode::Logprob, None) => ColourMode::Provenance,
                    (ColourMode::Logprob, Some(why)) => {
                        self.view.colour_mode = ColourMode::Phase;
                        self.say(Level::Info, format!("colour by phase (MTP provenance is not available: {why})"));
                        return;
                    }
                    (ColourMode::Provenance, _) => ColourMode::Phase,
                };
                let name = self.view.colour_mode.name();
                self.say(Level::Info, format!("colour by {name}"));
            }
            Action::Inspector => {
                self.view.inspector = match self.view.inspector {
                    Some(_) => None,
                    None => self.shown().and_then(|t| t.tokens.len().checked_sub(1)),
                };
                if self.view.inspector.is_none() && self.shown().is_none_or(|t| t.tokens.is_empty()) {
                    self.say(Level::Info, "no tokens to inspect yet");
                }
            }
            Action::FocusNext | Action::FocusPrev => {
                self.view.focus = self.view.focus.cycle(a == Action::FocusNext, self.view.state.shown)
            }
            Action::ScrollUp | Action::ScrollDown if self.view.focus == Focus::State => {
                let layers = self.shown().and_then(|t| t.state_at(None)).map_or(0, |(_, ev)| ev.gdn.len());
                self.view.state.page(a == Action::ScrollDown, layers)
            }
            Action::ScrollUp | Action::ScrollDown => {
                let d = if a == Action::ScrollUp { -1 } else { 1 };
                let pane = if self.view.focus == Focus::Thinking { Pane::Thinking } else { Pane::Answer };
                self.view.panes.scroll_of(pane).page(d);
            }
            Action::FollowTail => {
                self.view.panes.follow();
            }
            Action::PrevTurn | Action::NextTurn => self.browse_turns(a == Action::NextTurn),
            _ => {}
        }
    }

    /// Shows the previous / next turn in the panes (the latest follows new turns).
    fn browse_turns(&mut self, forward: bool) {
        let n = self.convo.session.turns.len();
        if n == 0 {
            self.say(Level::Info, "no turns yet");
            return;
        }
        let cur = self.shown_index().unwrap_or(n - 1);
        let next = if forward { (cur + 1).min(n - 1) } else { cur.saturating_sub(1) };
        self.view.selected_turn = if next + 1 == n { None } else { Some(next) };
        self.view.reset_panes();
        self.view.show_compare = false;
        self.sync_markdown();
        self.say(Level::Info, format!("turn {} of {n}", next + 1));
    }

    /// Tokens the next prompt will take before generation (≈ the history so far).
    pub fn next_prompt_estimate(&self) -> usize {
        self.convo.history_tokens_before_next()
    }

    /// Copies the shown turn's answer or thinking (the text so far, while it streams).
    fn copy(&mut self, phase: Phase) {
        let (what, text) = match (self.shown(), phase) {
            (Some(t), Phase::Answer) => ("answer", t.answer.trim().to_string()),
            (Some(t), Phase::Thinking) => ("thinking", t.thinking.trim().to_string()),
            (None, _) => ("text", String::new()),
        };
        if text.is_empty() {
            self.say(Level::Info, format!("no {what} to copy"));
            return;
        }
        self.say(Level::Info, format!("copied the {what} ({} chars) to the clipboard", text.chars().count()));
        self.out.effects.push(Effect::Copy(text));
    }

    fn export(&mut self) {
        if self.convo.session.turns.is_empty() {
            self.say(Level::Info, "nothing to export yet: the conversation has no turns");
            return;
        }
        let Some(json) = self.convo.save.file(&self.convo.session) else {
            self.say(Level::Error, "no sessions directory to export to");
            return;
        };
        let path = json.with_extension("md");
        self.out.effects.push(Effect::Export { path, markdown: self.convo.session.to_markdown() });
    }
}
