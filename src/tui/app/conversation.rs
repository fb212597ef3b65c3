//! The conversation: the session's turns, the live generation, a replay, saving, and every
//! change a user can make to it (send, regenerate, compare, edit an earlier prompt, delete,
//! continue a cut answer, start afresh).

use super::Level;
use super::replay::Replay;
use super::saving::SaveState;
use super::{App, Effect};
use crate::backend::Prompt;
use crate::session::{Session, Turn};
use deltascope_protocol::Thinking;

/// The turn receiving engine events, and the app time its events count from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Live {
    pub turn: usize,
    pub sent_ms: f64,
}

pub struct Conversation {
    pub session: Session,
    pub live: Option<Live>,
    pub replay: Option<Replay>,
    pub save: SaveState,
}

impl Conversation {
    /// The turn the panes show: `selected`, or the latest when none (or gone) is selected.
    pub fn shown_index(&self, selected: Option<usize>) -> Option<usize> {
        let n = self.session.turns.len();
        match selected {
            Some(i) if i < n => Some(i),
            _ => n.checked_sub(1),
        }
    }

    pub fn shown_turn(&self, selected: Option<usize>) -> Option<&Turn> {
        self.shown_index(selected).and_then(|i| self.session.turns.get(i))
    }

    /// Tokens the conversation takes before the next prompt (≈).
    pub fn history_tokens_before_next(&self) -> usize {
        self.history_tokens(self.session.turns.len())
    }

    /// The last turn of the conversation proper (not a comparison).
    pub fn last_main_turn(&self) -> Option<usize> {
        self.session.turns.iter().rposition(|t| t.compare_of.is_none())
    }

    /// Tokens the conversation before turn `upto` takes in the next prompt (≈: the last
    /// answered turn's prompt and answer; the template drops earlier thinking).
    pub fn history_tokens(&self, upto: usize) -> usize {
        self.session
            .turns
            .iter()
            .take(upto)
            .rev()
            .find(|t| t.compare_of.is_none() && !t.failed() && t.is_finished())
            .map(|t| t.prompt_tokens + t.answer_tokens())
            .unwrap_or(0)
    }
}

impl App {
    pub(super) fn can_generate(&mut self) -> bool {
        if self.backend.model.is_none() {
            self.say(Level::Info, "the model is still loading");
            return false;
        }
        if self.generating() {
            let cancel = self.look.keymap.first(crate::tui::keymap::Action::Cancel);
            self.say(Level::Info, format!("generating — {cancel} cancels"));
            return false;
        }
        if self.convo.replay.is_some() {
            self.say(Level::Info, "replaying — Esc stops the replay");
            return false;
        }
        true
    }

    /// Sends the prompt box: a new turn, an earlier prompt edited (re-run from there), or a
    /// new system prompt.
    pub fn send(&mut self) {
        let text = self.composer.text();
        let target = self.composer.target;
        if target == super::EditTarget::System {
            self.set_system(text);
            return;
        }
        if text.trim().is_empty() || !self.can_generate() {
            return;
        }
        self.composer.remember(&text);
        self.composer.clear();
        let upto = match target {
            super::EditTarget::Turn(i) if i < self.convo.session.turns.len() => {
                // The old continuation stays in the session as a branch.
                self.convo.session.branch_from(i, "edited");
                self.say(
                    Level::Info,
                    format!("turn {} re-run with the edited prompt (the old turns are kept in the session)", i + 1),
                );
                i
            }
            _ => self.convo.session.turns.len(),
        };
        self.start_turn(text, upto, None);
    }

    fn set_system(&mut self, text: String) {
        let system = Some(text.trim().to_string()).filter(|s| !s.is_empty());
        self.composer.clear();
        if system == self.convo.session.system {
            self.say(Level::Info, "system prompt unchanged");
            return;
        }
        let msg = match &system {
            Some(_) => "system prompt set: the next turns use it",
            None => "system prompt removed: the next turns have none",
        };
        self.convo.session.system = system;
        self.changed();
        self.say(Level::Info, msg);
    }

    /// Starts a generation of `user` with the conversation before turn `upto` as context.
    pub(super) fn start_turn(&mut self, user: String, upto: usize, compare_of: Option<usize>) {
        let messages = self.convo.session.messages(upto, &user);
        let mut params = self.settings.params.clone();
        // The inspector shows the top alternatives of every token.
        params.top_logprobs = params.top_logprobs.max(5);
        let mut turn = Turn::new(user, params.clone());
        turn.compare_of = compare_of;
        self.convo.session.turns.push(turn);
        self.convo.live = Some(Live { turn: self.convo.session.turns.len() - 1, sent_ms: self.now_ms });
        self.view.selected_turn = None;
        self.view.reset_panes();
        self.view.show_compare = compare_of.is_some();
        self.reference.shown = None;
        self.sync_markdown();
        self.out.effects.push(Effect::Generate { prompt: Prompt::Chat(messages), params: Box::new(params) });
    }

    pub fn regenerate(&mut self) {
        if !self.can_generate() {
            return;
        }
        let Some(last) = self.convo.session.turns.len().checked_sub(1) else {
            self.say(Level::Info, "nothing to regenerate yet");
            return;
        };
        let (user, compare_of) = {
            let t = &self.convo.session.turns[last];
            (t.user.clone(), t.compare_of)
        };
        // The old answer stays in the session file, as a branch.
        self.convo.session.branch_from(last, "regenerated");
        // A comparison re-runs with the context of the turn it compares with.
        let upto = compare_of.unwrap_or(self.convo.session.turns.len());
        self.start_turn(user, upto, compare_of);
    }

    /// Re-runs the last prompt with the current settings, next to the original.
    pub fn compare(&mut self) {
        if !self.can_generate() {
            return;
        }
        let Some(orig) = self.convo.last_main_turn() else {
            self.say(Level::Info, "nothing to compare yet: send a prompt first");
            return;
        };
        // Drop an earlier comparison of the same turn so the pair stays side by side.
        let turns = &mut self.convo.session.turns;
        while turns.len() > orig + 1 && turns.last().is_some_and(|t| t.compare_of == Some(orig)) {
            turns.pop();
        }
        let user = turns[orig].user.clone();
        self.start_turn(user, orig, Some(orig));
    }

    /// Puts the shown turn's prompt in the box: sending it re-runs the conversation from
    /// that turn (the old turns from there on are kept as a branch).
    pub(super) fn edit_prompt(&mut self) {
        if self.generating() {
            self.say(Level::Info, "generating — cancel first");
            return;
        }
        let Some(i) = self.shown_index() else {
            self.say(Level::Info, "no prompt to edit yet");
            return;
        };
        // A comparison is edited through the turn it compares with.
        let i = self.convo.session.turns[i].compare_of.unwrap_or(i);
        let text = self.convo.session.turns[i].user.clone();
        self.composer.edit(&text, super::EditTarget::Turn(i));
        self.view.focus = super::Focus::Input;
        let n = self.convo.session.turns.len();
        let later = if i + 1 < n { format!("; turns {}–{n} are kept as a branch", i + 2) } else { String::new() };
        self.say(Level::Info, format!("editing turn {}: Enter re-runs from it{later} (Esc abandons)", i + 1));
    }

    pub(super) fn edit_system(&mut self) {
        let text = self.convo.session.system.clone().unwrap_or_default();
        self.composer.edit(&text, super::EditTarget::System);
        self.view.focus = super::Focus::Input;
        self.say(
            Level::Info,
            "editing the system prompt: Enter sets it for the next turns (empty removes it; Esc abandons)",
        );
    }

    /// Takes the shown turn out of the conversation (kept in the session as a branch).
    pub(super) fn delete_turn(&mut self) {
        if self.generating() || self.convo.replay.is_some() {
            self.say(Level::Info, "busy — cancel first");
            return;
        }
        let Some(i) = self.shown_index() else {
            self.say(Level::Info, "no turn to delete");
            return;
        };
        self.convo.session.delete_turn(i);
        self.forget_rescores();
        self.view.selected_turn = None;
        self.view.show_compare = false;
        self.view.reset_panes();
        self.sync_markdown();
        self.changed();
        self.say(Level::Info, format!("turn {} deleted from the conversation (kept in the session file)", i + 1));
    }

    /// Generates more of the last turn when `max_tokens` (or a cancel) cut it short.
    pub(super) fn continue_turn(&mut self) {
        if let Some(why) = self.backend.model.as_ref().and_then(|m| m.continuation.reason()) {
            self.say(Level::Info, format!("continuing is not available: {why}"));
            return;
        }
        if !self.can_generate() {
            return;
        }
        let Some(i) = self.convo.session.turns.len().checked_sub(1) else {
            self.say(Level::Info, "nothing to continue yet");
            return;
        };
        if self.shown_index() != Some(i) {
            self.say(Level::Info, "only the last turn can be continued");
            return;
        }
        let t = &self.convo.session.turns[i];
        if !t.can_continue() {
            self.say(Level::Info, "the last turn was not cut short: nothing to continue");
            return;
        }
        let upto = t.compare_of.unwrap_or(i);
        let messages = self.convo.session.messages(upto, &t.user);
        let generated = t.generated_text();
        let mut params = self.settings.params.clone();
        params.top_logprobs = params.top_logprobs.max(5);
        // The template renders as the turn did (the text continues it); a thinking budget
        // counts what was already thought.
        params.thinking = match (t.params.thinking.is_on(), params.thinking.budget()) {
            (false, _) => Thinking::Off,
            (true, None) => Thinking::Unlimited,
            (true, Some(b)) => Thinking::from_budget(Some(b.saturating_sub(t.thinking_tokens()).max(1))),
        };
        let since = t.last_event_ms();
        self.reference.scores.remove(&i);
        let t = &mut self.convo.session.turns[i];
        t.begin_continuation(params.max_tokens);
        self.convo.live = Some(Live { turn: i, sent_ms: self.now_ms - since });
        self.view.reset_panes();
        let n = params.max_tokens;
        self.say(Level::Info, format!("continuing turn {} (up to {n} more tokens)", i + 1));
        self.out
            .effects
            .push(Effect::Generate { prompt: Prompt::Continue { messages, generated }, params: Box::new(params) });
    }

    /// A fresh conversation with the same settings; the current one stays saved.
    pub(super) fn new_conversation(&mut self) {
        if !self.can_leave_conversation() {
            return;
        }
        let old = self.convo.save.file(&self.convo.session);
        let system = self.convo.session.system.clone();
        let model = self.backend.model.as_ref().map(|m| m.name.clone()).unwrap_or_default();
        let mut session = Session::new(model, system);
        // Two conversations started in the same second must not share a file.
        while Some(&session.id) == Some(&self.convo.session.id) {
            session.id.push('b');
        }
        self.convo.session = session;
        self.forget_rescores();
        // A `--session FILE` path belonged to the old conversation.
        self.convo.save.path = None;
        self.convo.save.last_good = None;
        self.view = super::ViewState { focus: self.view.focus, ..Default::default() };
        self.composer.clear();
        self.sync_markdown();
        let kept = match (old, self.convo.session.turns.is_empty()) {
            (Some(p), _) => format!(" (the previous one is in {})", p.display()),
            _ => String::new(),
        };
        self.say(Level::Info, format!("new conversation{kept}"));
    }

    /// The backend's view of the next turn's prompt (rendered text and token ids).
    pub(super) fn show_prompt(&mut self) {
        if self.backend.model.is_none() {
            self.say(Level::Info, "the model is still loading");
            return;
        }
        let text = self.composer.text();
        let user = if text.trim().is_empty() { "…".to_string() } else { text };
        let upto = match self.composer.target {
            super::EditTarget::Turn(i) => i,
            _ => self.convo.session.turns.len(),
        };
        let messages = self.convo.session.messages(upto, &user);
        self.out
            .effects
            .push(Effect::DryRun { prompt: Prompt::Chat(messages), params: Box::new(self.settings.params.clone()) });
    }

    /// Marks the conversation changed and asks the runner to save it.
    pub(super) fn changed(&mut self) {
        self.convo.save.unsaved = true;
        self.save_now();
    }

    /// Opens a saved session to continue it (or to replay it): the runner reads it and
    /// answers with [`crate::tui::event::Inbound::SessionLoaded`].
    pub fn open_session(&mut self, path: &std::path::Path, replay: bool) {
        if !self.can_leave_conversation() {
            return;
        }
        self.out.effects.push(Effect::LoadSession { path: path.to_path_buf(), replay });
    }

    /// The session the runner read for [`App::open_session`].
    pub(super) fn session_loaded(
        &mut self,
        path: &std::path::Path,
        replay: bool,
        result: Result<Box<Session>, String>,
    ) {
        match result {
            Ok(s) => {
                let s = *s;
                if let Some(t) = s.turns.iter().rev().find(|t| t.compare_of.is_none()) {
                    self.settings.params = t.params.clone();
                }
                self.convo.save.path = Some(path.to_path_buf());
                self.convo.save.last_good = Some(path.to_path_buf());
                self.forget_rescores();
                if replay {
                    self.start_replay(s);
                } else {
                    self.composer.set_history(
                        s.turns.iter().filter(|t| t.compare_of.is_none()).map(|t| t.user.clone()).collect(),
                    );
                    self.convo.session = s;
                    self.view.selected_turn = None;
                    self.view.reset_panes();
                    self.sync_markdown();
                    self.say(Level::Info, format!("opened {}", path.display()));
                    self.warn_other_model();
                }
            }
            Err(e) => self.say(Level::Error, e),
        }
    }

    /// Plays `s` back turn by turn with its recorded timing (half a second between turns).
    pub fn start_replay(&mut self, s: Session) {
        if self.generating() {
            self.say(Level::Info, "generating — cancel first");
            return;
        }
        if s.turns.is_empty() {
            self.say(Level::Info, "nothing to replay");
            return;
        }
        self.forget_rescores();
        self.convo.replay = Some(Replay::of(&s, self.now_ms));
        self.convo.session = Session { turns: vec![], ..s };
        self.view.selected_turn = None;
        self.sync_markdown();
        self.say(Level::Info, "replaying with the original timing (Esc stops)");
    }

    /// Whether the current conversation may be left for another (a new one, or one opened):
    /// not while it runs or replays, nor while it has turns that could not be saved.
    fn can_leave_conversation(&mut self) -> bool {
        if self.generating() || self.convo.replay.is_some() {
            self.say(Level::Info, "busy — cancel first");
            return false;
        }
        if self.convo.save.unsaved {
            let why = self.save_reason();
            self.say(Level::Error, format!("this conversation is not saved ({why}): quit offers another path"));
            return false;
        }
        true
    }

    pub(super) fn save_reason(&self) -> String {
        self.convo.save.error.clone().unwrap_or_else(|| "not saved yet".into())
    }

    /// A session recorded with another model continues on the loaded one: say so, since its
    /// old turns and the new ones are not comparable.
    pub(super) fn warn_other_model(&mut self) {
        if let Some(m) = &self.backend.model
            && !self.convo.session.turns.is_empty()
            && self.convo.session.model != m.name
        {
            let msg = format!("this session was recorded with {}; new turns use {}", self.convo.session.model, m.name);
            self.say(Level::Warning, msg);
        }
    }
}
