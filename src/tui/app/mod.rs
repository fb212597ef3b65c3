//! The workbench's state and its one update function. Everything that changes the state goes
//! through [`App::update`] (or [`App::dispatch`] for a bound action); drawing
//! (`view::View::draw(&App, …)`) only reads it, through methods, so tests can build a state
//! from scripted events and snapshot it. The app never talks to the backend or the disk
//! itself: it queues [`Effect`]s, which the runner executes and answers with inbound events
//! ([`Inbound::Saved`], [`Inbound::SessionLoaded`], …) or [`App::show_dry_run`].
//!
//! `App` is a router: this file holds the state's parts and sends each event to the one it is
//! about: the prompt box ([`Composer`]), the conversation and its saving ([`Conversation`]),
//! what the screen shows ([`ViewState`]), popups ([`Overlay`]), the message log
//! ([`MessageLog`]), the backend's status (`status.rs`), the look (`look.rs`) and what goes
//! back to the runner (`outbox.rs`). What each action does is in `actions.rs`; what drawing
//! and tests read is in `access.rs`.

mod access;
mod actions;
mod conversation;
mod look;
mod outbox;
mod overlay;
mod reference;
mod replay;
mod saving;
mod status;
#[cfg(any(test, feature = "test-support"))]
mod testing;
mod view_state;

use std::path::PathBuf;

use ratatui::crossterm::event::{Event as TermEvent, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

pub use self::conversation::{Conversation, Live};
use self::look::Look;
use self::outbox::Outbox;
pub use self::overlay::Overlay;
pub use self::reference::ReferenceState;
pub use self::replay::{Replay, ReplayItem};
pub use self::saving::{SaveState, SessionsDir, check_writable, turns_label};
use self::status::BackendStatus;
pub use self::view_state::ViewState;
use super::event::Inbound;
use super::keymap::Keymap;
use super::sliders::Settings;
use super::theme::Theme;
use crate::session::Session;
pub use crate::tui::effect::Effect;
pub use crate::tui::log::{Level, Message, MessageLog};
use crate::tui::panel::Ctx;
pub use crate::tui::panels::composer::{Composer, EditTarget, MAX_ROWS as COMPOSER_MAX_ROWS};
pub use crate::tui::panels::state_scope::StateScope;
pub use crate::tui::panels::transcript::{PaneScroll, Panes};
pub use crate::tui::screen::{ColourMode, Focus, Layout, PaneLayout, ThinkingView};
use deltascope_protocol::EngineEvent;

/// The panels' context for a key, from the app's parts (its fields, so that the panel, another
/// field, can be borrowed beside it).
fn key_ctx<'a>(look: &'a Look, now_ms: f64, out: &'a mut Outbox, log: &'a mut MessageLog) -> Ctx<'a> {
    Ctx { theme: &look.theme, keymap: &look.keymap, now_ms, effects: &mut out.effects, log }
}

/// Startup configuration.
pub struct AppConfig {
    pub theme: Theme,
    pub keymap: Keymap,
    pub settings: Settings,
    /// Where sessions are autosaved (`path: None`: not saved, e.g. in tests).
    pub sessions_dir: SessionsDir,
    /// The file this session is saved to (`--session FILE`); default `sessions_dir/ID.json`.
    pub session_path: Option<PathBuf>,
    pub session: Session,
}

/// The router: each event goes to the part of the state it is about. The fields are private
/// (drawing and tests read through methods), grouped by what they are about.
pub struct App {
    /// The theme, the keymap and the shown answer's rendered Markdown.
    look: Look,
    settings: Settings,
    /// Loading, the open backend's description, or why it could not open.
    backend: BackendStatus,
    composer: Composer,
    convo: Conversation,
    view: ViewState,
    overlay: Overlay,
    messages: MessageLog,
    /// The reference engine (`--reference`) and the turns it re-scored.
    reference: ReferenceState,
    /// App time in ms (set by each update).
    now_ms: f64,
    /// Effects for the runner, a screen to redraw, quitting.
    out: Outbox,
}

impl App {
    pub fn new(cfg: AppConfig) -> App {
        let fallback = cfg.sessions_dir.fallback.clone();
        let composer = Composer::new(
            cfg.session.turns.iter().filter(|t| t.compare_of.is_none()).map(|t| t.user.clone()).collect(),
        );
        let last_good = cfg.session_path.clone().filter(|p| p.exists());
        let mut app = App {
            look: Look::new(cfg.theme, cfg.keymap),
            settings: cfg.settings,
            backend: BackendStatus::default(),
            composer,
            convo: Conversation {
                session: cfg.session,
                live: None,
                replay: None,
                save: SaveState { dir: cfg.sessions_dir, path: cfg.session_path, last_good, ..Default::default() },
            },
            view: ViewState::default(),
            overlay: Overlay::None,
            messages: MessageLog::default(),
            reference: ReferenceState::default(),
            now_ms: 0.0,
            out: Outbox { dirty: true, ..Default::default() },
        };
        if let Some(why) = fallback {
            app.say(Level::Warning, why);
        }
        app.sync_markdown();
        app
    }

    /// One inbound event at app time `now_ms`.
    pub fn update(&mut self, ev: Inbound, now_ms: f64) {
        self.now_ms = now_ms;
        // A tick changes nothing on screen unless something runs or a message expires.
        let mut quiet = false;
        match ev {
            Inbound::Term(TermEvent::Key(k)) if k.kind != KeyEventKind::Release => self.on_key(k),
            Inbound::Term(TermEvent::Paste(s)) => match &mut self.overlay {
                Overlay::SaveAs { input, .. } | Overlay::SliderValue { input, .. } => {
                    input.insert_str(s.lines().next().unwrap_or_default());
                }
                _ => {
                    self.view.focus = Focus::Input;
                    self.composer.paste(&s);
                }
            },
            Inbound::Term(_) => {}
            Inbound::Tick => quiet = !self.on_tick(),
            Inbound::Engine(e) => self.on_engine(e),
            Inbound::LoadProgress { done, total, what } => self.backend.loading = Some((done, total, what)),
            Inbound::Ready(Err(e)) => self.fail(e),
            // The runner takes `Ready(Ok)` (it owns the backend) and calls `set_model`.
            Inbound::Ready(Ok(_)) => {}
            Inbound::Terminate(signal) => {
                self.out.signal.get_or_insert(signal);
                self.force_quit();
            }
            Inbound::Saved { path, result } => {
                let result = self.convo.save.written(path, result);
                if let Ok(Some(note)) = &result {
                    self.say(Level::Warning, note.clone());
                }
                self.after_save(result.map(|_| ()));
            }
            Inbound::Exported { path, result } => match result {
                Ok(()) => self.say(Level::Info, format!("exported to {}", path.display())),
                Err(e) => self.say(Level::Error, format!("export failed: {}: {e}", path.display())),
            },
            Inbound::SessionsListed(items) => self.show_sessions(items),
            Inbound::SessionManaged { result, items } => self.session_managed(result, items),
            Inbound::SessionLoaded { path, replay, result, held } => {
                self.session_loaded(&path, replay, result);
                if let Some((holder, copy)) = held {
                    self.held_elsewhere(path, holder, copy);
                }
            }
            // The runner takes `Reference(Ok)` (it owns the engine) and calls `reference_loaded`.
            Inbound::Reference(Ok(_)) => {}
            Inbound::Reference(Err(e)) => self.reference_loaded(Err(e)),
            Inbound::Rescored { turn, result } => self.rescored(turn, result),
        }
        if !quiet {
            self.out.dirty = true;
        }
    }

    /// `true` when the tick changed something on screen.
    fn on_tick(&mut self) -> bool {
        let expired = self.messages.tick(self.now_ms);
        let Some(replay) = self.convo.replay.as_mut() else { return expired || self.busy() };
        let before = self.convo.session.turns.len();
        let finished = replay.advance(self.now_ms, &mut self.convo.session.turns);
        if self.convo.session.turns.len() != before {
            self.view.reset_panes();
        }
        self.sync_markdown();
        if finished {
            self.convo.replay = None;
            self.say(Level::Info, "replay finished");
        }
        true
    }

    /// An engine event for the live turn.
    pub fn on_engine(&mut self, ev: EngineEvent) {
        let Some(live) = self.convo.live else { return };
        let end = ev.is_terminal();
        if let Some(t) = self.convo.session.turns.get_mut(live.turn) {
            t.apply(&ev, self.now_ms - live.sent_ms);
        }
        if let EngineEvent::Error(e) = &ev {
            self.say(Level::Error, format!("error: {}", e.message));
        }
        self.sync_markdown();
        if end {
            // "cancelling…" is answered, so the status line does not keep it next to "● done".
            if let Some(t) = self.convo.session.turns.get(live.turn)
                && t.finish_reason == Some(deltascope_protocol::FinishReason::Cancelled)
            {
                let n = t.tokens.len();
                self.say(Level::Info, format!("cancelled: the {n} token{} so far kept", if n == 1 { "" } else { "s" }));
            }
            self.convo.live = None;
            self.changed();
        }
    }

    fn on_key(&mut self, k: KeyEvent) {
        if self.overlay.is_open() {
            return self.overlay_key(k);
        }
        // A prompt being typed takes the shell's line keys first (Ctrl+E ends its line; with
        // the box empty, Ctrl+E edits the shown turn's prompt as bound).
        let typing = self.view.focus == Focus::Input && !self.composer.is_empty();
        if typing && crate::tui::panels::composer::is_shell_line_key(&k) {
            return self.focused_key(k);
        }
        if let Some(a) = self.look.keymap.action(&k)
            && self.dispatch(a)
        {
            return;
        }
        // `?` is help everywhere except in a prompt being typed (no question starts with it).
        let typing = self.view.focus == Focus::Input && !self.composer.is_empty();
        if k.code == KeyCode::Char('?') && !typing && k.modifiers.difference(KeyModifiers::SHIFT).is_empty() {
            self.overlay = Overlay::Help;
            return;
        }
        self.focused_key(k);
    }
}
