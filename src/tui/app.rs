//! The workbench's state and its one update function. Everything that changes the state goes
//! through [`App::update`]; drawing (`view::draw(&App, …)`) only reads it, so tests can build
//! a state from scripted events and snapshot it. The app never talks to the engine itself: it
//! queues [`Effect`]s, which the runner executes.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::path::PathBuf;

use ratatui::crossterm::event::{Event as TermEvent, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui_textarea::TextArea;

use super::event::Inbound;
use super::highlight::Markdown;
use super::keymap::{Action, Keymap};
use super::sliders::{Settings, Slider};
use super::theme::Theme;
use crate::backend::{BackendInfo, ChatMessage, EngineEvent, GenerationParams, Phase, Support};
use crate::session::{Session, SessionInfo, Turn, list_sessions};

/// What the runner does for the app.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    Generate {
        messages: Vec<ChatMessage>,
        enable_thinking: bool,
        params: Box<GenerationParams>,
    },
    Cancel,
    SetPaused(bool),
    Step,
    /// Put this text on the terminal's clipboard.
    Copy(String),
    Quit,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    Input,
    Sliders,
    Thinking,
    Answer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThinkingView {
    Shown,
    Collapsed,
    Hidden,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColourMode {
    Phase,
    Logprob,
    Provenance,
}

impl ColourMode {
    pub fn name(self) -> &'static str {
        match self {
            ColourMode::Phase => "phase",
            ColourMode::Logprob => "logprob",
            ColourMode::Provenance => "MTP provenance",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Overlay {
    None,
    Help,
    Picker { items: Vec<SessionInfo>, selected: usize },
}

/// Scroll state of a streaming pane: `None` follows the tail. Draw records the last layout
/// (in cells: a read-only draw cannot otherwise report what it laid out), so a scroll key
/// knows where the view currently is.
#[derive(Debug, Default)]
pub struct PaneScroll {
    pub top: Option<usize>,
    pub last_total: Cell<usize>,
    pub last_height: Cell<usize>,
    /// The pane's wrapped token lines, and wrapped Markdown, kept between frames.
    pub lines: RefCell<crate::tui::view::PaneCache>,
    pub markdown: RefCell<crate::tui::view::MarkdownWrap>,
}

impl PaneScroll {
    /// The first visible line for `total` lines in `height` rows.
    pub fn first_line(&self, total: usize, height: usize) -> usize {
        let tail = total.saturating_sub(height);
        self.top.map(|t| t.min(tail)).unwrap_or(tail)
    }

    fn scroll(&mut self, delta: i64) {
        let total = self.last_total.get();
        let height = self.last_height.get().max(1);
        let tail = total.saturating_sub(height);
        let cur = self.first_line(total, height) as i64;
        let next = (cur + delta).clamp(0, tail as i64) as usize;
        // Back at the bottom: follow the tail again.
        self.top = if next >= tail { None } else { Some(next) };
    }
}

/// A session being replayed: items due at (ms since the replay started).
#[derive(Debug)]
pub struct Replay {
    pub started_ms: f64,
    pub queue: VecDeque<(f64, ReplayItem)>,
    /// When the turn being replayed began (replay time).
    pub turn_start: f64,
}

#[derive(Debug)]
// Items are moved once from the queue; boxing each event would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum ReplayItem {
    Begin(Box<Turn>),
    Event(EngineEvent),
}

/// Startup configuration.
pub struct AppConfig {
    pub theme: Theme,
    pub keymap: Keymap,
    pub settings: Settings,
    /// Where sessions are autosaved (`None`: not saved, e.g. in tests).
    pub sessions_dir: Option<PathBuf>,
    /// The file this session is saved to (`--session FILE`); default `sessions_dir/ID.json`.
    pub session_path: Option<PathBuf>,
    pub session: Session,
}

pub struct App {
    pub theme: Theme,
    pub keymap: Keymap,
    pub settings: Settings,
    /// What the backend said about itself, once it is open.
    pub model: Option<BackendInfo>,
    /// Loading progress: (done, total, what).
    pub loading: Option<(u64, u64, String)>,
    pub fatal: Option<String>,
    pub session: Session,
    pub sessions_dir: Option<PathBuf>,
    pub session_path: Option<PathBuf>,
    pub input: TextArea<'static>,
    pub input_history: Vec<String>,
    history_pos: Option<usize>,
    /// Sending replaces the last turn (edit last prompt).
    pub editing_last: bool,
    pub focus: Focus,
    pub slider: usize,
    pub thinking_view: ThinkingView,
    pub colour_mode: ColourMode,
    /// Token inspector cursor (index into the shown turn's tokens).
    pub inspector: Option<usize>,
    pub overlay: Overlay,
    pub show_compare: bool,
    pub step_mode: bool,
    /// The turn receiving engine events, and the app time its request was sent.
    /// First line of the help overlay shown, and the largest useful value (the view sets it).
    pub help_scroll: u16,
    pub help_scroll_max: Cell<u16>,
    pub live: Option<(usize, f64)>,
    pub replay: Option<Replay>,
    pub status: Option<(String, f64)>,
    pub thinking_scroll: PaneScroll,
    pub answer_scroll: PaneScroll,
    /// Rendered answer of the shown turn (for turn index `md_turn`).
    pub md: Markdown,
    md_turn: Option<usize>,
    /// App time in ms (set by each update).
    pub now_ms: f64,
    pub quit: bool,
    pub dirty: bool,
    effects: Vec<Effect>,
}

impl App {
    pub fn new(cfg: AppConfig) -> App {
        let mut input = TextArea::default();
        input.set_placeholder_text("Ask something — e.g. Is 91 prime?");
        let input_history =
            cfg.session.turns.iter().filter(|t| t.compare_of.is_none()).map(|t| t.user.clone()).collect();
        let mut app = App {
            theme: cfg.theme,
            keymap: cfg.keymap,
            settings: cfg.settings,
            model: None,
            loading: None,
            fatal: None,
            session: cfg.session,
            sessions_dir: cfg.sessions_dir,
            session_path: cfg.session_path,
            input,
            input_history,
            history_pos: None,
            editing_last: false,
            focus: Focus::Input,
            slider: 0,
            thinking_view: ThinkingView::Shown,
            colour_mode: ColourMode::Phase,
            inspector: None,
            overlay: Overlay::None,
            show_compare: false,
            step_mode: false,
            help_scroll: 0,
            help_scroll_max: Cell::new(0),
            live: None,
            replay: None,
            status: None,
            thinking_scroll: PaneScroll::default(),
            answer_scroll: PaneScroll::default(),
            md: Markdown::default(),
            md_turn: None,
            now_ms: 0.0,
            quit: false,
            dirty: true,
            effects: vec![],
        };
        app.sync_markdown();
        app
    }

    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.effects)
    }

    pub fn generating(&self) -> bool {
        self.live.is_some()
    }

    pub fn busy(&self) -> bool {
        self.live.is_some() || self.replay.is_some() || self.loading.is_some()
    }

    /// The turn the panes show: the latest one.
    pub fn shown_index(&self) -> Option<usize> {
        self.session.turns.len().checked_sub(1)
    }

    pub fn shown(&self) -> Option<&Turn> {
        self.shown_index().and_then(|i| self.session.turns.get(i))
    }

    /// The latest comparison: (original, re-run).
    pub fn compare_pair(&self) -> Option<(usize, usize)> {
        self.session.turns.iter().enumerate().rev().find_map(|(i, t)| t.compare_of.map(|o| (o, i)))
    }

    /// idle / loading / prefill / thinking / answering / paused / done.
    pub fn state_label(&self) -> &'static str {
        if self.loading.is_some() {
            return "loading";
        }
        if self.replay.is_some() {
            return "replay";
        }
        match (self.live, self.shown()) {
            (Some(_), Some(t)) => {
                if self.step_mode {
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

    pub fn set_status(&mut self, msg: impl Into<String>) {
        self.status = Some((msg.into(), self.now_ms));
    }

    /// The backend is ready (a model loaded, or a server answered).
    pub fn set_model(&mut self, info: BackendInfo) {
        self.settings.mtp = match (&info.mtp_control, info.has_mtp) {
            (Support::No(why), _) => Support::No(why.clone()),
            (Support::Yes, false) => Support::No("no head".into()),
            (Support::Yes, true) => Support::Yes,
        };
        if self.session.model.is_empty() {
            self.session.model = info.name.clone();
        }
        self.model = Some(info);
        self.warn_other_model();
        self.loading = None;
        self.dirty = true;
    }

    /// One inbound event at app time `now_ms`.
    pub fn update(&mut self, ev: Inbound, now_ms: f64) {
        self.now_ms = now_ms;
        // A tick changes nothing on screen unless something runs or a message may expire.
        let quiet = matches!(ev, Inbound::Tick) && !self.busy() && self.status.is_none();
        match ev {
            Inbound::Term(TermEvent::Key(k)) if k.kind != KeyEventKind::Release => self.on_key(k),
            Inbound::Term(TermEvent::Paste(s)) => {
                self.input.insert_str(s);
            }
            Inbound::Term(_) => {}
            Inbound::Tick => self.on_tick(),
            Inbound::Engine(e) => self.on_engine(e),
            Inbound::LoadProgress { done, total, what } => self.loading = Some((done, total, what)),
            Inbound::Ready(Err(e)) => {
                self.loading = None;
                self.fatal = Some(e);
            }
            // The runner takes `Ready(Ok)` (it owns the backend) and calls `set_model`.
            Inbound::Ready(Ok(_)) => {}
            Inbound::Terminate => self.do_quit(),
        }
        if !quiet {
            self.dirty = true;
        }
    }

    fn on_tick(&mut self) {
        if let Some((_, at)) = &self.status
            && self.now_ms - at > 6000.0
        {
            self.status = None;
        }
        let Some(replay) = self.replay.as_mut() else { return };
        let elapsed = self.now_ms - replay.started_ms;
        let mut due = vec![];
        while replay.queue.front().is_some_and(|(t, _)| *t <= elapsed) {
            if let Some(item) = replay.queue.pop_front() {
                due.push(item);
            }
        }
        let finished = replay.queue.is_empty();
        let mut turn_start = replay.turn_start;
        for (at, item) in due {
            match item {
                ReplayItem::Begin(turn) => {
                    turn_start = at;
                    self.session.turns.push(*turn);
                    self.thinking_scroll.top = None;
                    self.answer_scroll.top = None;
                }
                ReplayItem::Event(e) => {
                    if let Some(t) = self.session.turns.last_mut() {
                        t.apply(&e, at - turn_start);
                    }
                }
            }
        }
        if let Some(r) = self.replay.as_mut() {
            r.turn_start = turn_start;
        }
        self.sync_markdown();
        if finished {
            self.replay = None;
            self.set_status("replay finished");
        }
    }

    /// An engine event for the live turn.
    pub fn on_engine(&mut self, ev: EngineEvent) {
        let Some((i, sent)) = self.live else { return };
        let end = ev.is_terminal();
        if let Some(t) = self.session.turns.get_mut(i) {
            t.apply(&ev, self.now_ms - sent);
        }
        if let EngineEvent::Error(e) = &ev {
            self.set_status(format!("error: {}", e.message));
        }
        self.sync_markdown();
        if end {
            self.live = None;
            self.autosave();
        }
    }

    /// Brings the answer's rendered markdown up to date (only new finished lines render).
    fn sync_markdown(&mut self) {
        let idx = self.shown_index();
        if idx != self.md_turn {
            self.md = Markdown::default();
            self.md_turn = idx;
        }
        if let Some(t) = idx.and_then(|i| self.session.turns.get(i)) {
            self.md.sync(t.answer.trim_start_matches('\n'), &self.theme);
        }
    }

    fn on_key(&mut self, k: KeyEvent) {
        match &mut self.overlay {
            Overlay::Help => {
                // ↑/↓/PgUp/PgDn scroll a help taller than the terminal; any other key closes it.
                let (scroll, max) = (&mut self.help_scroll, self.help_scroll_max.get());
                match k.code {
                    KeyCode::Up => *scroll = scroll.saturating_sub(1),
                    KeyCode::Down => *scroll = scroll.saturating_add(1).min(max),
                    KeyCode::PageUp => *scroll = scroll.saturating_sub(10),
                    KeyCode::PageDown => *scroll = scroll.saturating_add(10).min(max),
                    _ => {
                        self.overlay = Overlay::None;
                        self.help_scroll = 0;
                    }
                }
                return;
            }
            Overlay::Picker { items, selected } => {
                match k.code {
                    KeyCode::Esc => self.overlay = Overlay::None,
                    KeyCode::Up => *selected = selected.saturating_sub(1),
                    KeyCode::Down => *selected = (*selected + 1).min(items.len().saturating_sub(1)),
                    KeyCode::Enter | KeyCode::Char('r') => {
                        let replay = k.code == KeyCode::Char('r');
                        if let Some(info) = items.get(*selected).cloned() {
                            self.overlay = Overlay::None;
                            self.open_session(&info.path, replay);
                        }
                    }
                    _ => {}
                }
                return;
            }
            Overlay::None => {}
        }
        let action = self.keymap.action(&k);
        if let Some(a) = action
            && self.run_action(a)
        {
            return;
        }
        // `?` is help everywhere except in a prompt being typed (no question starts with it).
        let typing = self.focus == Focus::Input && self.input.lines().iter().any(|l| !l.is_empty());
        if k.code == KeyCode::Char('?') && !typing && k.modifiers.difference(KeyModifiers::SHIFT).is_empty() {
            self.overlay = Overlay::Help;
            return;
        }
        if let Some(cur) = self.inspector {
            let n = self.shown().map(|t| t.tokens.len()).unwrap_or(0);
            let moved = match k.code {
                KeyCode::Left => Some(cur.saturating_sub(1)),
                KeyCode::Right => Some((cur + 1).min(n.saturating_sub(1))),
                KeyCode::Up => Some(cur.saturating_sub(10)),
                KeyCode::Down => Some((cur + 10).min(n.saturating_sub(1))),
                KeyCode::Home => Some(0),
                KeyCode::End => Some(n.saturating_sub(1)),
                _ => None,
            };
            if let Some(m) = moved {
                self.inspector = Some(m);
                return;
            }
        }
        match self.focus {
            Focus::Input => self.input_key(k),
            Focus::Sliders => self.slider_key(k),
            Focus::Thinking | Focus::Answer => {
                let scroll =
                    if self.focus == Focus::Thinking { &mut self.thinking_scroll } else { &mut self.answer_scroll };
                match k.code {
                    KeyCode::Up => scroll.scroll(-1),
                    KeyCode::Down => scroll.scroll(1),
                    KeyCode::Home => scroll.top = Some(0),
                    KeyCode::End => scroll.top = None,
                    _ => {}
                }
            }
        }
    }

    /// Runs a bound action; `false` lets the key fall through (e.g. Enter outside the input).
    fn run_action(&mut self, a: Action) -> bool {
        match a {
            Action::Quit => self.do_quit(),
            Action::CancelOrQuit => {
                if self.generating() {
                    self.effects.push(Effect::Cancel);
                    self.set_status("cancelling… (output kept)");
                } else if self.replay.take().is_some() {
                    self.set_status("replay stopped");
                } else {
                    self.do_quit();
                }
            }
            Action::Cancel => {
                if self.generating() {
                    self.effects.push(Effect::Cancel);
                    self.set_status("cancelling… (output kept)");
                } else if self.replay.take().is_some() {
                    self.set_status("replay stopped");
                } else if self.inspector.is_some() || self.show_compare {
                    self.inspector = None;
                    self.show_compare = false;
                } else if self.focus != Focus::Input {
                    self.focus = Focus::Input;
                } else if self.editing_last {
                    self.editing_last = false;
                    self.input = fresh_input();
                }
            }
            Action::Send => {
                if self.focus != Focus::Input && self.focus != Focus::Sliders {
                    return false;
                }
                self.send();
            }
            Action::Newline => {
                if self.focus != Focus::Input {
                    return false;
                }
                self.input.insert_newline();
            }
            Action::HistoryPrev => self.history(-1),
            Action::HistoryNext => self.history(1),
            Action::Regenerate => self.regenerate(),
            Action::EditLast => self.edit_last(),
            Action::ToggleThinking => {
                self.settings.enable_thinking = !self.settings.enable_thinking;
                let on = if self.settings.enable_thinking { "on" } else { "off" };
                self.set_status(format!("thinking {on} for the next generation"));
            }
            Action::CollapseThinking => {
                self.thinking_view = match self.thinking_view {
                    ThinkingView::Shown => ThinkingView::Collapsed,
                    ThinkingView::Collapsed => ThinkingView::Hidden,
                    ThinkingView::Hidden => ThinkingView::Shown,
                };
            }
            Action::StepMode => {
                if let Some(why) = self.model.as_ref().and_then(|m| m.step.reason()) {
                    self.set_status(format!("step mode is not available: {why}"));
                    return true;
                }
                self.step_mode = !self.step_mode;
                self.effects.push(Effect::SetPaused(self.step_mode));
                let step = self.keymap.first(Action::Step);
                self.set_status(if self.step_mode {
                    format!("step mode: {step} advances one token")
                } else {
                    "step mode off".to_string()
                });
            }
            Action::Step => {
                if self.step_mode {
                    self.effects.push(Effect::Step);
                } else {
                    self.set_status(format!("not in step mode ({} turns it on)", self.keymap.first(Action::StepMode)));
                }
            }
            Action::Compare => self.compare(),
            Action::CompareView => {
                if self.compare_pair().is_some() {
                    self.show_compare = !self.show_compare;
                } else {
                    self.set_status(format!(
                        "no comparison yet ({} re-runs the last prompt)",
                        self.keymap.first(Action::Compare)
                    ));
                }
            }
            Action::ColourMode => {
                let provenance = self.model.as_ref().map(|m| m.provenance.clone());
                self.colour_mode = match (self.colour_mode, provenance.as_ref().and_then(|p| p.reason())) {
                    (ColourMode::Phase, _) => ColourMode::Logprob,
                    (ColourMode::Logprob, None) => ColourMode::Provenance,
                    (ColourMode::Logprob, Some(why)) => {
                        self.colour_mode = ColourMode::Phase;
                        self.set_status(format!("colour by phase (MTP provenance is not available: {why})"));
                        return true;
                    }
                    (ColourMode::Provenance, _) => ColourMode::Phase,
                };
                self.set_status(format!("colour by {}", self.colour_mode.name()));
            }
            Action::Inspector => {
                self.inspector = match self.inspector {
                    Some(_) => None,
                    None => self.shown().and_then(|t| t.tokens.len().checked_sub(1)),
                };
                if self.inspector.is_none() && self.shown().is_none_or(|t| t.tokens.is_empty()) {
                    self.set_status("no tokens to inspect yet");
                }
            }
            Action::FocusNext | Action::FocusPrev => {
                const ORDER: [Focus; 4] = [Focus::Input, Focus::Sliders, Focus::Thinking, Focus::Answer];
                let i = ORDER.iter().position(|f| *f == self.focus).unwrap_or(0);
                let d = if a == Action::FocusNext { 1 } else { ORDER.len() - 1 };
                self.focus = ORDER[(i + d) % ORDER.len()];
            }
            Action::Help => self.overlay = Overlay::Help,
            Action::Picker => {
                let items = self.sessions_dir.as_deref().map(list_sessions).unwrap_or_default();
                if items.is_empty() {
                    self.set_status("no saved sessions");
                }
                self.overlay = Overlay::Picker { items, selected: 0 };
            }
            Action::Export => self.export(),
            Action::CopyAnswer => self.copy(Phase::Answer),
            Action::CopyThinking => self.copy(Phase::Thinking),
            Action::Replay => self.start_replay(self.session.clone()),
            Action::RaiseMaxTokens => {
                let max = self.model.as_ref().and_then(|m| m.context).filter(|c| *c > 0).unwrap_or(usize::MAX);
                let prompt = self.shown().map(|t| t.prompt_tokens).unwrap_or(0);
                let p = &mut self.settings.params;
                p.max_tokens = (p.max_tokens * 2).min(max.saturating_sub(prompt)).max(p.max_tokens);
                let n = p.max_tokens;
                self.set_status(format!("max_tokens = {n}"));
                self.regenerate();
            }
            Action::SetThinkingBudget => {
                let p = &mut self.settings.params;
                let b = (p.max_tokens / 2).max(1);
                p.thinking_budget = Some(b);
                self.settings.enable_thinking = true;
                self.set_status(format!("thinking budget = {b}"));
                self.regenerate();
            }
            Action::ScrollUp | Action::ScrollDown => {
                let d = if a == Action::ScrollUp { -1 } else { 1 };
                let s = if self.focus == Focus::Thinking { &mut self.thinking_scroll } else { &mut self.answer_scroll };
                let page = s.last_height.get().max(2) as i64 - 1;
                s.scroll(d * page);
            }
            Action::FollowTail => {
                self.thinking_scroll.top = None;
                self.answer_scroll.top = None;
            }
        }
        true
    }

    fn do_quit(&mut self) {
        if self.generating() {
            self.effects.push(Effect::Cancel);
        }
        self.autosave();
        self.quit = true;
        self.effects.push(Effect::Quit);
    }

    fn input_key(&mut self, k: KeyEvent) {
        let single = self.input.lines().len() <= 1;
        match k.code {
            KeyCode::Up if single && k.modifiers.is_empty() => self.history(-1),
            KeyCode::Down if single && k.modifiers.is_empty() => self.history(1),
            _ => {
                self.input.input(k);
            }
        }
    }

    fn slider_key(&mut self, k: KeyEvent) {
        let n = Slider::ALL.len();
        let big = k.modifiers.contains(KeyModifiers::SHIFT);
        match k.code {
            KeyCode::Up => self.slider = (self.slider + n - 1) % n,
            KeyCode::Down => self.slider = (self.slider + 1) % n,
            KeyCode::Left | KeyCode::Char('h') | KeyCode::Char('-') => {
                Slider::ALL[self.slider].adjust(&mut self.settings, -1, big)
            }
            KeyCode::Right | KeyCode::Char('l') | KeyCode::Char('+') | KeyCode::Char('=') => {
                Slider::ALL[self.slider].adjust(&mut self.settings, 1, big)
            }
            KeyCode::Char('[') => Slider::ALL[self.slider].adjust(&mut self.settings, -1, true),
            KeyCode::Char(']') => Slider::ALL[self.slider].adjust(&mut self.settings, 1, true),
            KeyCode::Char('p') => Slider::Preset.adjust(&mut self.settings, 1, false),
            _ => {}
        }
    }

    fn history(&mut self, dir: i32) {
        if self.input_history.is_empty() {
            return;
        }
        let last = self.input_history.len() - 1;
        let pos = match (self.history_pos, dir < 0) {
            (None, true) => Some(last),
            (None, false) => None,
            (Some(p), true) => Some(p.saturating_sub(1)),
            (Some(p), false) if p >= last => None,
            (Some(p), false) => Some(p + 1),
        };
        self.history_pos = pos;
        let text = pos.and_then(|p| self.input_history.get(p)).cloned().unwrap_or_default();
        self.input = input_with(&text);
    }

    fn prompt_text(&self) -> String {
        self.input.lines().join("\n")
    }

    fn can_generate(&mut self) -> bool {
        if self.model.is_none() {
            self.set_status("the model is still loading");
            return false;
        }
        if self.generating() {
            self.set_status(format!("generating — {} cancels", self.keymap.first(Action::Cancel)));
            return false;
        }
        if self.replay.is_some() {
            self.set_status("replaying — Esc stops the replay");
            return false;
        }
        true
    }

    /// Sends the input as a new turn (or as the replacement of the last one when editing).
    pub fn send(&mut self) {
        let text = self.prompt_text();
        if text.trim().is_empty() || !self.can_generate() {
            return;
        }
        if self.editing_last {
            self.editing_last = false;
            self.drop_last_turn();
        }
        if self.input_history.last() != Some(&text) {
            self.input_history.push(text.clone());
        }
        self.history_pos = None;
        self.input = fresh_input();
        let upto = self.session.turns.len();
        self.start_turn(text, upto, None);
    }

    /// Starts a generation of `user` with the conversation before turn `upto` as context.
    fn start_turn(&mut self, user: String, upto: usize, compare_of: Option<usize>) {
        let messages = self.session.messages(upto, &user);
        let mut params = self.settings.params.clone();
        // The inspector shows the top alternatives of every token.
        params.top_logprobs = params.top_logprobs.max(5);
        let enable_thinking = self.settings.enable_thinking;
        let mut turn = Turn::new(user, enable_thinking, params.clone());
        turn.compare_of = compare_of;
        self.session.turns.push(turn);
        self.live = Some((self.session.turns.len() - 1, self.now_ms));
        self.inspector = None;
        self.thinking_scroll.top = None;
        self.answer_scroll.top = None;
        self.show_compare = compare_of.is_some();
        self.sync_markdown();
        self.effects.push(Effect::Generate { messages, enable_thinking, params: Box::new(params) });
    }

    fn drop_last_turn(&mut self) {
        self.session.turns.pop();
        self.sync_markdown();
    }

    /// The last turn of the conversation proper (not a comparison).
    fn last_main_turn(&self) -> Option<usize> {
        self.session.turns.iter().rposition(|t| t.compare_of.is_none())
    }

    pub fn regenerate(&mut self) {
        if !self.can_generate() {
            return;
        }
        let Some(last) = self.session.turns.len().checked_sub(1) else {
            self.set_status("nothing to regenerate yet");
            return;
        };
        let turn = self.session.turns.remove(last);
        // A comparison re-runs with the context of the turn it compares with.
        let upto = turn.compare_of.unwrap_or(self.session.turns.len());
        self.start_turn(turn.user, upto, turn.compare_of);
    }

    fn edit_last(&mut self) {
        if self.generating() {
            self.set_status("generating — cancel first");
            return;
        }
        let Some(i) = self.session.turns.len().checked_sub(1) else {
            self.set_status("no prompt to edit yet");
            return;
        };
        let text = self.session.turns[i].user.clone();
        self.input = input_with(&text);
        self.editing_last = true;
        self.focus = Focus::Input;
        self.set_status("editing the last prompt: Enter re-sends it in place of the last turn (Esc abandons)");
    }

    /// Re-runs the last prompt with the current settings, next to the original.
    pub fn compare(&mut self) {
        if !self.can_generate() {
            return;
        }
        let Some(orig) = self.last_main_turn() else {
            self.set_status("nothing to compare yet: send a prompt first");
            return;
        };
        // Drop an earlier comparison of the same turn so the pair stays side by side.
        while self.session.turns.len() > orig + 1
            && self.session.turns.last().is_some_and(|t| t.compare_of == Some(orig))
        {
            self.session.turns.pop();
        }
        let user = self.session.turns[orig].user.clone();
        self.start_turn(user, orig, Some(orig));
    }

    fn file_path(&self) -> Option<PathBuf> {
        self.session_path.clone().or_else(|| self.sessions_dir.as_ref().map(|d| d.join(self.session.file_name())))
    }

    /// Saves the session (atomic replace); does nothing for an empty one or while replaying.
    pub fn autosave(&mut self) {
        if self.session.turns.is_empty() || self.replay.is_some() {
            return;
        }
        let Some(path) = self.file_path() else { return };
        if let Err(e) = self.session.save_atomic(&path) {
            tracing::warn!("{e}");
            self.set_status(format!("autosave failed: {e}"));
        }
    }

    /// Copies the shown turn's answer or thinking (the text so far, while it streams).
    fn copy(&mut self, phase: Phase) {
        let (what, text) = match (self.shown(), phase) {
            (Some(t), Phase::Answer) => ("answer", t.answer.trim().to_string()),
            (Some(t), Phase::Thinking) => ("thinking", t.thinking.trim().to_string()),
            (None, _) => ("text", String::new()),
        };
        if text.is_empty() {
            self.set_status(format!("no {what} to copy"));
            return;
        }
        self.set_status(format!("copied the {what} ({} chars) to the clipboard", text.chars().count()));
        self.effects.push(Effect::Copy(text));
    }

    fn export(&mut self) {
        let Some(json) = self.file_path() else {
            self.set_status("no sessions directory to export to");
            return;
        };
        let md = json.with_extension("md");
        let res = md
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .map(std::fs::create_dir_all)
            .unwrap_or(Ok(()))
            .and_then(|_| std::fs::write(&md, self.session.to_markdown()));
        match res {
            Ok(()) => self.set_status(format!("exported to {}", md.display())),
            Err(e) => self.set_status(format!("export failed: {}: {e}", md.display())),
        }
    }

    /// Opens a saved session to continue it (or to replay it).
    pub fn open_session(&mut self, path: &std::path::Path, replay: bool) {
        if self.generating() {
            self.set_status("generating — cancel first");
            return;
        }
        match Session::load(path) {
            Ok(s) => {
                if let Some(t) = s.turns.iter().rev().find(|t| t.compare_of.is_none()) {
                    self.settings.params = t.params.clone();
                    self.settings.enable_thinking = t.enable_thinking;
                }
                self.input_history =
                    s.turns.iter().filter(|t| t.compare_of.is_none()).map(|t| t.user.clone()).collect();
                self.session_path = Some(path.to_path_buf());
                if replay {
                    self.start_replay(s);
                } else {
                    self.session = s;
                    self.sync_markdown();
                    self.set_status(format!("opened {}", path.display()));
                    self.warn_other_model();
                }
            }
            Err(e) => self.set_status(e.to_string()),
        }
    }

    /// A session recorded with another model continues on the loaded one: say so, since its
    /// old turns and the new ones are not comparable.
    fn warn_other_model(&mut self) {
        if let Some(m) = &self.model
            && !self.session.turns.is_empty()
            && self.session.model != m.name
        {
            let msg = format!("this session was recorded with {}; new turns use {}", self.session.model, m.name);
            self.set_status(msg);
        }
    }

    /// Plays `s` back turn by turn with its recorded timing (half a second between turns).
    pub fn start_replay(&mut self, s: Session) {
        if self.generating() {
            self.set_status("generating — cancel first");
            return;
        }
        if s.turns.is_empty() {
            self.set_status("nothing to replay");
            return;
        }
        let mut queue = VecDeque::new();
        let mut offset = 0.0;
        for t in &s.turns {
            let mut skeleton = Turn::new(t.user.clone(), t.enable_thinking, t.params.clone());
            skeleton.compare_of = t.compare_of;
            queue.push_back((offset, ReplayItem::Begin(Box::new(skeleton))));
            let events = t.replay_events();
            let end = events.last().map(|(ms, _)| *ms).unwrap_or(0.0);
            for (ms, e) in events {
                queue.push_back((offset + ms, ReplayItem::Event(e)));
            }
            offset += end + 500.0;
        }
        self.session = Session { turns: vec![], ..s };
        self.replay = Some(Replay { started_ms: self.now_ms, queue, turn_start: 0.0 });
        self.sync_markdown();
        self.set_status("replaying with the original timing (Esc stops)");
    }
}

fn fresh_input() -> TextArea<'static> {
    let mut t = TextArea::default();
    t.set_placeholder_text("Ask something — e.g. Is 91 prime?");
    t
}

fn input_with(text: &str) -> TextArea<'static> {
    let mut t = TextArea::new(text.split('\n').map(str::to_string).collect());
    t.set_placeholder_text("Ask something — e.g. Is 91 prime?");
    t.move_cursor(ratatui_textarea::CursorMove::Bottom);
    t.move_cursor(ratatui_textarea::CursorMove::End);
    t
}
