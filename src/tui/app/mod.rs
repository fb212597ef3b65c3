//! The workbench's state and its one update function. Everything that changes the state goes
//! through [`App::update`] (or [`App::dispatch`] for a bound action); drawing
//! (`view::draw(&App, …)`) only reads it, so tests can build a state from scripted events and
//! snapshot it. The app never talks to the backend or the disk itself: it queues [`Effect`]s,
//! which the runner executes (and reports back through [`App::save_now`], [`App::show_dry_run`]
//! and [`App::export_to`]).
//!
//! The state is split by what it is about: the prompt box ([`Composer`]), the conversation
//! and its saving ([`Conversation`]), what the screen shows ([`ViewState`]), popups
//! ([`Overlay`]) and the message log ([`MessageLog`]).

mod actions;
mod conversation;
mod layout;
mod overlay;
mod replay;
mod saving;
mod view_state;

use std::path::PathBuf;

use ratatui::crossterm::event::{Event as TermEvent, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

pub use self::conversation::{Conversation, Live};
pub use self::layout::{Layout, PaneLayout};
pub use self::overlay::Overlay;
pub use self::replay::{Replay, ReplayItem};
pub use self::saving::{SaveState, SessionsDir, check_writable, turns_label};
pub use self::view_state::{ColourMode, Focus, ThinkingView, ViewState};
use super::event::Inbound;
use super::highlight::Markdown;
use super::keymap::Keymap;
use super::sliders::Settings;
use super::theme::Theme;
use crate::backend::{BackendInfo, DryRun, Prompt, Support};
use crate::generation::{EngineEvent, GenerationParams, Phase};
use crate::session::{Session, Turn};
use crate::tui::panels::DrawCtx;
pub use crate::tui::panels::composer::{Composer, EditTarget, MAX_ROWS as COMPOSER_MAX_ROWS};
pub use crate::tui::panels::messages::{Level, Message, MessageLog};
pub use crate::tui::panels::state_scope::StateScope;
pub use crate::tui::panels::transcript::PaneScroll;

/// What the runner does for the app.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Generate {
        prompt: Prompt,
        enable_thinking: bool,
        params: Box<GenerationParams>,
    },
    /// Render this prompt without generating (the runner answers with [`App::show_dry_run`]).
    DryRun {
        prompt: Prompt,
        enable_thinking: bool,
        params: Box<GenerationParams>,
    },
    Cancel,
    SetPaused(bool),
    Step,
    /// Put this text on the terminal's clipboard.
    Copy(String),
    /// Write this session to `path`, atomically (the runner answers with [`Inbound::Saved`];
    /// `path: None`, no sessions directory, is answered with the error).
    Save {
        path: Option<PathBuf>,
        session: Box<Session>,
    },
    /// Write this Markdown transcript to `path` (answered with [`Inbound::Exported`]).
    Export {
        path: PathBuf,
        markdown: String,
    },
    /// List the saved sessions in this directory (answered with [`Inbound::SessionsListed`]).
    ListSessions(PathBuf),
    /// Read the session saved at `path`, to continue it or to `replay` it (answered with
    /// [`Inbound::SessionLoaded`]).
    LoadSession {
        path: PathBuf,
        replay: bool,
    },
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

pub struct App {
    pub(crate) theme: Theme,
    pub(crate) keymap: Keymap,
    pub(crate) settings: Settings,
    /// What the backend said about itself, once it is open.
    pub(crate) model: Option<BackendInfo>,
    /// Loading progress: (done, total, what).
    pub(crate) loading: Option<(u64, u64, String)>,
    pub(crate) fatal: Option<String>,
    pub(crate) composer: Composer,
    pub convo: Conversation,
    pub(crate) view: ViewState,
    pub(crate) overlay: Overlay,
    pub(crate) messages: MessageLog,
    /// Rendered answer of the shown turn (for turn index `md_turn`).
    pub(crate) md: Markdown,
    md_turn: Option<usize>,
    /// App time in ms (set by each update).
    pub(crate) now_ms: f64,
    pub(crate) quit: bool,
    /// Quit once the save asked for has worked (a path typed after a failed save).
    quit_after_save: bool,
    pub(crate) dirty: bool,
    effects: Vec<Effect>,
}

impl App {
    pub fn new(cfg: AppConfig) -> App {
        let fallback = cfg.sessions_dir.fallback.clone();
        let composer = Composer::new(
            cfg.session.turns.iter().filter(|t| t.compare_of.is_none()).map(|t| t.user.clone()).collect(),
        );
        let last_good = cfg.session_path.clone().filter(|p| p.exists());
        let mut app = App {
            theme: cfg.theme,
            keymap: cfg.keymap,
            settings: cfg.settings,
            model: None,
            loading: None,
            fatal: None,
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
            md: Markdown::default(),
            md_turn: None,
            now_ms: 0.0,
            quit: false,
            quit_after_save: false,
            dirty: true,
            effects: vec![],
        };
        if let Some(why) = fallback {
            app.say(Level::Warning, why);
        }
        app.sync_markdown();
        app
    }

    /// What the panels read while they draw.
    pub(crate) fn draw_ctx(&self) -> DrawCtx<'_> {
        DrawCtx { theme: &self.theme, keymap: &self.keymap, popup_scroll: self.view.popup_scroll }
    }

    /// What the backend said about itself, once it is open.
    pub fn model(&self) -> Option<&BackendInfo> {
        self.model.as_ref()
    }

    /// The open popup ([`Overlay::None`]: none).
    pub fn overlay(&self) -> &Overlay {
        &self.overlay
    }

    /// Closes the open popup without acting on it.
    pub fn close_overlay(&mut self) {
        self.overlay = Overlay::None;
        self.dirty = true;
    }

    /// What the next generation will use.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Changes the settings for the next generation, as the sliders would.
    pub fn change_settings(&mut self, change: impl FnOnce(&mut Settings)) {
        change(&mut self.settings);
        self.dirty = true;
    }

    /// What the screen shows: focus, the shown turn, scrolling, the inspector, the State view.
    pub fn view(&self) -> &ViewState {
        &self.view
    }

    /// The prompt box.
    pub fn composer(&self) -> &Composer {
        &self.composer
    }

    /// Saves go to `dir` from now on (e.g. a test's temporary directory).
    pub fn set_sessions_dir(&mut self, dir: impl Into<PathBuf>) {
        self.convo.save.dir = SessionsDir::fixed(Some(dir.into()));
    }

    /// Every message so far.
    pub fn messages(&self) -> &MessageLog {
        &self.messages
    }

    /// Whether the app is done (the runner saves what is left and ends).
    pub fn quitting(&self) -> bool {
        self.quit
    }

    /// App time in ms, as the last update set it.
    pub fn now_ms(&self) -> f64 {
        self.now_ms
    }

    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    /// Adds a message to the log (and the status line).
    pub fn say(&mut self, level: Level, text: impl Into<String>) {
        self.messages.push(level, text, self.now_ms);
    }

    /// The status line's message, while it is shown.
    pub fn status(&self) -> Option<&str> {
        self.messages.current().map(|m| m.text.as_str())
    }

    pub fn session(&self) -> &Session {
        &self.convo.session
    }

    pub fn generating(&self) -> bool {
        self.convo.live.is_some()
    }

    pub fn busy(&self) -> bool {
        self.convo.live.is_some() || self.convo.replay.is_some() || self.loading.is_some()
    }

    /// The turn the panes show: the selected one, else the latest.
    pub fn shown_index(&self) -> Option<usize> {
        let n = self.convo.session.turns.len();
        match self.view.selected_turn {
            Some(i) if i < n => Some(i),
            _ => n.checked_sub(1),
        }
    }

    pub fn shown(&self) -> Option<&Turn> {
        self.shown_index().and_then(|i| self.convo.session.turns.get(i))
    }

    /// The latest comparison: (original, re-run).
    pub fn compare_pair(&self) -> Option<(usize, usize)> {
        self.convo.session.turns.iter().enumerate().rev().find_map(|(i, t)| t.compare_of.map(|o| (o, i)))
    }

    /// idle / loading / prefill / thinking / answering / paused / done.
    pub fn state_label(&self) -> &'static str {
        if self.loading.is_some() {
            return "loading";
        }
        if self.convo.replay.is_some() {
            return "replay";
        }
        match (self.convo.live, self.shown()) {
            (Some(_), Some(t)) => {
                if self.view.step_mode {
                    return "paused (step)";
                }
                match t.tokens.last() {
                    None => "prefill",
                    Some(tok) if tok.phase == Phase::Thinking => "thinking",
                    Some(_) => "answering",
                }
            }
            (None, Some(t)) if t.is_finished() => "done",
            _ => "idle",
        }
    }

    /// The backend is ready (a model loaded, or a server answered).
    pub fn set_model(&mut self, info: BackendInfo) {
        self.settings.mtp = match (&info.mtp_control, info.has_mtp) {
            (Support::No(why), _) => Support::No(why.clone()),
            (Support::Yes, false) => Support::No("no head".into()),
            (Support::Yes, true) => Support::Yes,
        };
        self.settings.context = info.context.filter(|c| *c > 0);
        if self.convo.session.model.is_empty() {
            self.convo.session.model = info.name.clone();
        }
        if let Some(note) = &info.device_note {
            self.say(Level::Info, note.clone());
        }
        self.model = Some(info);
        self.warn_other_model();
        self.loading = None;
        self.dirty = true;
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
            Inbound::LoadProgress { done, total, what } => self.loading = Some((done, total, what)),
            Inbound::Ready(Err(e)) => {
                self.loading = None;
                self.fatal = Some(e);
            }
            // The runner takes `Ready(Ok)` (it owns the backend) and calls `set_model`.
            Inbound::Ready(Ok(_)) => {}
            Inbound::Terminate => self.force_quit(),
            Inbound::Saved { path, result } => {
                let result = self.convo.save.written(path, result);
                self.after_save(result);
            }
            Inbound::Exported { path, result } => match result {
                Ok(()) => self.say(Level::Info, format!("exported to {}", path.display())),
                Err(e) => self.say(Level::Error, format!("export failed: {}: {e}", path.display())),
            },
            Inbound::SessionsListed(items) => self.show_sessions(items),
            Inbound::SessionLoaded { path, replay, result } => self.session_loaded(&path, replay, result),
        }
        if !quiet {
            self.dirty = true;
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
            self.convo.live = None;
            self.changed();
        }
    }

    /// Brings the answer's rendered markdown up to date (only new finished lines render).
    pub(crate) fn sync_markdown(&mut self) {
        let idx = self.shown_index();
        if idx != self.md_turn {
            self.md = Markdown::default();
            self.md_turn = idx;
        }
        if let Some(t) = idx.and_then(|i| self.convo.session.turns.get(i)) {
            self.md.sync(t.answer.trim_start_matches('\n'), &self.theme);
        }
    }

    fn on_key(&mut self, k: KeyEvent) {
        if self.overlay.is_open() {
            return self.overlay_key(k);
        }
        if let Some(a) = self.keymap.action(&k)
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

    /// Quit (Ctrl+Q): the conversation is saved first; when that fails, ask.
    fn request_quit(&mut self) {
        if self.generating() {
            // The runner waits for the cancelled generation's end, then saves.
            self.effects.push(Effect::Cancel);
            self.quit = true;
            return;
        }
        if !self.convo.save.unsaved {
            self.quit = true;
            return;
        }
        self.quit_after_save = true;
        self.save_now();
    }

    /// A signal or a lost terminal: save what can be saved and go, without asking.
    fn force_quit(&mut self) {
        if self.generating() {
            self.effects.push(Effect::Cancel);
        }
        self.quit = true;
    }

    /// Asks the runner to write the conversation if it changed ([`Effect::Save`], answered
    /// with [`Inbound::Saved`]). Also the runner's last act before the program ends.
    pub fn save_now(&mut self) {
        if self.convo.replay.is_some() {
            return;
        }
        if self.convo.save.due(&self.convo.session) {
            let path = self.convo.save.file(&self.convo.session);
            self.effects.push(Effect::Save { path, session: Box::new(self.convo.session.clone()) });
        } else {
            self.after_save(Ok(()));
        }
    }

    /// A save worked or failed: quit if that was waiting for it, or ask.
    fn after_save(&mut self, result: Result<(), String>) {
        let quit_after = std::mem::take(&mut self.quit_after_save);
        match result {
            Ok(()) if quit_after => self.quit = true,
            Ok(()) => {}
            Err(e) => {
                self.say(Level::Error, format!("autosave failed: {e}"));
                if quit_after && !self.quit {
                    self.overlay = Overlay::ConfirmQuit;
                }
            }
        }
        self.dirty = true;
    }

    /// What the last frame laid out (the runner hands back what drawing returned).
    pub fn laid_out(&mut self, layout: Layout) {
        self.view.laid_out(layout);
    }

    /// What the backend rendered for [`Effect::DryRun`].
    pub fn show_dry_run(&mut self, result: Result<DryRun, String>) {
        self.view.popup_scroll = 0;
        self.overlay = Overlay::Prompt(result);
        self.dirty = true;
    }

    /// What was lost if the program ends now (printed after the terminal is restored).
    pub fn loss_report(&self) -> Option<String> {
        self.convo.save.loss_report(&self.convo.session)
    }
}
