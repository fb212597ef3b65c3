//! Key bindings: named actions bound to key chords. Defaults live here; the user's
//! `$XDG_CONFIG_HOME/deltascope/keymap.toml` overrides single actions:
//!
//! ```toml
//! [keys]
//! regenerate = ["ctrl-r", "f6"]
//! quit = "ctrl-q"
//! ```
//!
//! Context keys (arrows in the sliders, the inspector and the picker) are fixed; the help
//! screen lists them next to the configurable ones.

mod chord;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ratatui::crossterm::event::KeyEvent;
use serde::de::IntoDeserializer;
use serde::{Deserialize, Serialize};

pub use self::chord::Chord;

/// What a key does. The names in keymap.toml are the variants in snake_case (serde's), except
/// `sessions` for the picker. The order is the help screen's, and the precedence when a user
/// binds one key to two actions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    Send,
    Newline,
    HistoryPrev,
    HistoryNext,
    Cancel,
    CancelOrQuit,
    Regenerate,
    EditPrompt,
    EditSystem,
    DeleteTurn,
    Continue,
    NewConversation,
    ShowPrompt,
    PrevTurn,
    NextTurn,
    ToggleThinking,
    CollapseThinking,
    StepMode,
    Step,
    EndThinking,
    Compare,
    CompareView,
    ReferenceCheck,
    FirstDivergence,
    ColourMode,
    Inspector,
    StateView,
    TraceState,
    FocusNext,
    FocusPrev,
    ScrollUp,
    ScrollDown,
    FollowTail,
    RaiseMaxTokens,
    SetThinkingBudget,
    CopyAnswer,
    CopyThinking,
    #[serde(rename = "sessions")]
    Picker,
    Export,
    Replay,
    Messages,
    Help,
    Quit,
}

impl Action {
    /// Every action, in declaration order (the help screen lists them so).
    pub const ALL: [Action; 43] = [
        Action::Send,
        Action::Newline,
        Action::HistoryPrev,
        Action::HistoryNext,
        Action::Cancel,
        Action::CancelOrQuit,
        Action::Regenerate,
        Action::EditPrompt,
        Action::EditSystem,
        Action::DeleteTurn,
        Action::Continue,
        Action::NewConversation,
        Action::ShowPrompt,
        Action::PrevTurn,
        Action::NextTurn,
        Action::ToggleThinking,
        Action::CollapseThinking,
        Action::StepMode,
        Action::Step,
        Action::EndThinking,
        Action::Compare,
        Action::CompareView,
        Action::ReferenceCheck,
        Action::FirstDivergence,
        Action::ColourMode,
        Action::Inspector,
        Action::StateView,
        Action::TraceState,
        Action::FocusNext,
        Action::FocusPrev,
        Action::ScrollUp,
        Action::ScrollDown,
        Action::FollowTail,
        Action::RaiseMaxTokens,
        Action::SetThinkingBudget,
        Action::CopyAnswer,
        Action::CopyThinking,
        Action::Picker,
        Action::Export,
        Action::Replay,
        Action::Messages,
        Action::Help,
        Action::Quit,
    ];

    /// The name used in keymap.toml (serde's).
    pub fn name(self) -> String {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::String(name)) => name,
            _ => format!("{self:?}"),
        }
    }

    /// The action a keymap.toml name stands for.
    fn parse(name: &str) -> Option<Action> {
        Action::deserialize(name.into_deserializer()).map_err(|_: serde::de::value::Error| ()).ok()
    }

    pub fn describe(self) -> &'static str {
        match self {
            Action::Quit => "quit (the session is saved)",
            Action::Cancel => "cancel the generation (output kept) / close a popup",
            Action::CancelOrQuit => "cancel the generation; when idle, quit",
            Action::Send => "send the prompt",
            Action::Newline => "new line in the prompt",
            Action::HistoryPrev => "previous prompt from history",
            Action::HistoryNext => "next prompt from history",
            Action::Regenerate => "regenerate the last answer with the current settings",
            Action::EditPrompt => "edit the shown turn's prompt (sending re-runs from it; the old turns are kept)",
            Action::EditSystem => "edit the system prompt (for the next turns)",
            Action::DeleteTurn => "delete the shown turn from the conversation (kept in the file)",
            Action::Continue => "continue the last answer where max_tokens (or a cancel) cut it",
            Action::NewConversation => "new conversation, same settings (the current one stays saved)",
            Action::ShowPrompt => "show the next turn's rendered prompt and token ids",
            Action::PrevTurn => "show the previous turn",
            Action::NextTurn => "show the next turn (the latest follows new turns)",
            Action::Messages => "message log: every message and error, whole",
            Action::ToggleThinking => "thinking on / off for the next generation",
            Action::CollapseThinking => "thinking pane: shown / collapsed / hidden",
            Action::StepMode => "step mode on / off (pause generation)",
            Action::Step => "step mode: advance one token (one MTP step)",
            Action::EndThinking => "end thinking now (rescue a loop): bridge and </think> forced, then the answer",
            Action::Compare => "compare: re-run the last prompt with the current settings",
            Action::CompareView => "show / hide the side-by-side comparison",
            Action::ReferenceCheck => "re-score the shown turn token by token with the local --reference",
            Action::FirstDivergence => "reference mode: the inspector to the first divergence (or worst token)",
            Action::ColourMode => "colour tokens by phase / logprob / MTP provenance",
            Action::Inspector => "token inspector (←/→ move, Home/End)",
            Action::FocusNext => "focus next pane (input, sliders, thinking, answer; the State view when shown)",
            Action::FocusPrev => "focus previous pane",
            Action::Help => "this help",
            Action::Picker => "saved sessions (Enter open, r replay)",
            Action::Export => "export the session to Markdown",
            Action::Replay => "replay this session with its original timing",
            Action::RaiseMaxTokens => "fix: double max_tokens",
            Action::SetThinkingBudget => "fix: set a thinking budget below max_tokens",
            Action::ScrollUp => "scroll the focused pane up",
            Action::ScrollDown => "scroll the focused pane down",
            Action::FollowTail => "follow the tail again",
            Action::CopyAnswer => "copy the shown answer to the clipboard (OSC 52)",
            Action::CopyThinking => "copy the shown thinking to the clipboard (OSC 52)",
            Action::StateView => "State view: what every GDN layer and head writes, keeps and forgets, per token",
            Action::TraceState => "state trace on / off for the next generation (local engine; drafting pauses)",
        }
    }

    fn defaults(self) -> &'static [&'static str] {
        match self {
            Action::Quit => &["ctrl-q"],
            Action::Cancel => &["esc"],
            Action::CancelOrQuit => &["ctrl-c"],
            Action::Send => &["enter"],
            Action::Newline => &["alt-enter", "shift-enter"],
            Action::HistoryPrev => &["alt-up"],
            Action::HistoryNext => &["alt-down"],
            Action::Regenerate => &["ctrl-r"],
            Action::EditPrompt => &["ctrl-e"],
            Action::EditSystem => &["alt-s"],
            Action::DeleteTurn => &["alt-x"],
            Action::Continue => &["f5"],
            Action::NewConversation => &["alt-n"],
            Action::ShowPrompt => &["f2"],
            Action::PrevTurn => &["alt-left"],
            Action::NextTurn => &["alt-right"],
            Action::Messages => &["alt-m"],
            Action::ToggleThinking => &["ctrl-t"],
            Action::CollapseThinking => &["alt-t"],
            Action::StepMode => &["ctrl-s"],
            Action::Step => &["ctrl-n"],
            Action::EndThinking => &["alt-e"],
            Action::Compare => &["ctrl-o"],
            Action::CompareView => &["alt-c"],
            Action::ReferenceCheck => &["alt-v"],
            Action::FirstDivergence => &["alt-d"],
            Action::ColourMode => &["ctrl-l"],
            Action::Inspector => &["ctrl-g"],
            Action::FocusNext => &["tab"],
            Action::FocusPrev => &["backtab"],
            Action::Help => &["f1"],
            Action::Picker => &["ctrl-p"],
            Action::Export => &["ctrl-x"],
            Action::Replay => &["alt-r"],
            Action::RaiseMaxTokens => &["f3"],
            Action::SetThinkingBudget => &["f4"],
            Action::ScrollUp => &["pageup"],
            Action::ScrollDown => &["pagedown"],
            Action::FollowTail => &["alt-g"],
            Action::CopyAnswer => &["ctrl-y"],
            Action::CopyThinking => &["alt-y"],
            Action::StateView => &["f7"],
            Action::TraceState => &["f8"],
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum KeymapError {
    #[error("{file}: not valid TOML: {}", deltascope_model::brief(message))]
    Toml { file: String, message: String },
    #[error("{file}: unknown action `{}` (actions: {known})", deltascope_model::brief(key))]
    UnknownAction { file: String, key: String, known: String },
    #[error(
        "{file}: {action} = \"{}\": not a key (examples: \"ctrl-r\", \"alt-enter\", \"f5\", \"pageup\", \"?\")",
        deltascope_model::brief(spec)
    )]
    BadKey { file: String, action: String, spec: String },
    #[error("{file}: `{}` must be a string or a list of strings", deltascope_model::brief(key))]
    BadValue { file: String, key: String },
    #[error("{file}: unknown table `{}` (expected [keys])", deltascope_model::brief(key))]
    UnknownTable { file: String, key: String },
    #[error("cannot read keymap {file}: {message}")]
    Read { file: String, message: String },
    #[error("{file}: {key} is bound to both {first} and {second}{hint}")]
    Conflict { file: String, key: String, first: String, second: String, hint: String },
    #[error("{file}: {action} has no key: without one there is no way to {what}")]
    Unbound { file: String, action: String, what: &'static str },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Keymap {
    bindings: BTreeMap<Action, Vec<Chord>>,
}

impl Default for Keymap {
    fn default() -> Self {
        let bindings = Action::ALL
            .into_iter()
            .map(|a| (a, a.defaults().iter().filter_map(|s| Chord::parse(s)).collect()))
            .collect();
        Keymap { bindings }
    }
}

impl Keymap {
    /// The defaults with the overrides of the file in the config directory (a missing one is
    /// just the defaults).
    pub fn load(path: &Path) -> Result<Keymap, KeymapError> {
        match std::fs::read_to_string(path) {
            Ok(src) => Keymap::parse(&src, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Keymap::default()),
            Err(e) => Err(KeymapError::Read { file: path.display().to_string(), message: e.to_string() }),
        }
    }

    /// A keymap the user named (`--keymap FILE`): it must exist.
    pub fn load_named(path: &Path) -> Result<Keymap, KeymapError> {
        let src = std::fs::read_to_string(path)
            .map_err(|e| KeymapError::Read { file: path.display().to_string(), message: e.to_string() })?;
        Keymap::parse(&src, &path.display().to_string())
    }

    pub fn parse(src: &str, file: &str) -> Result<Keymap, KeymapError> {
        let table: toml::Table = toml::from_str(src)
            .map_err(|e| KeymapError::Toml { file: file.into(), message: crate::tui::config::toml_error(&e, src) })?;
        let mut map = Keymap::default();
        let mut overridden = vec![];
        for (k, v) in &table {
            if k != "keys" {
                return Err(KeymapError::UnknownTable { file: file.into(), key: k.clone() });
            }
            let Some(keys) = v.as_table() else {
                return Err(KeymapError::UnknownTable { file: file.into(), key: k.clone() });
            };
            for (name, value) in keys {
                let action = Action::parse(name).ok_or_else(|| KeymapError::UnknownAction {
                    file: file.into(),
                    key: name.clone(),
                    known: Action::ALL.map(|a| a.name()).join(", "),
                })?;
                let specs: Vec<&str> = match value {
                    toml::Value::String(s) => vec![s.as_str()],
                    toml::Value::Array(a) => a
                        .iter()
                        .map(|x| {
                            x.as_str().ok_or_else(|| KeymapError::BadValue { file: file.into(), key: name.clone() })
                        })
                        .collect::<Result<_, _>>()?,
                    _ => return Err(KeymapError::BadValue { file: file.into(), key: name.clone() }),
                };
                let chords = specs
                    .iter()
                    .map(|s| {
                        Chord::parse(s).ok_or_else(|| KeymapError::BadKey {
                            file: file.into(),
                            action: name.clone(),
                            spec: s.to_string(),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                map.bindings.insert(action, chords);
                overridden.push(action);
            }
        }
        map.check(file, &overridden)?;
        Ok(map)
    }

    /// One key, one action: a key bound twice would silently do only one of them. And the
    /// prompt must still be sendable and the program quittable.
    fn check(&self, file: &str, overridden: &[Action]) -> Result<(), KeymapError> {
        let mut owner: BTreeMap<Chord, Action> = BTreeMap::new();
        for a in Action::ALL {
            for c in &self.bindings[&a] {
                if let Some(first) = owner.insert(*c, a) {
                    // Name the binding that still has its default, so the fix is obvious.
                    let hint = match (overridden.contains(&first), overridden.contains(&a)) {
                        (false, _) => format!(" ({} by default: rebind it too)", first.name()),
                        (_, false) => format!(" ({} by default: rebind it too)", a.name()),
                        _ => String::new(),
                    };
                    return Err(KeymapError::Conflict {
                        file: file.into(),
                        key: c.to_string(),
                        first: first.name(),
                        second: a.name(),
                        hint,
                    });
                }
            }
        }
        for (a, what) in [(Action::Send, "send a prompt"), (Action::Quit, "quit")] {
            if self.bindings[&a].is_empty() {
                return Err(KeymapError::Unbound { file: file.into(), action: a.name(), what });
            }
        }
        Ok(())
    }

    /// The action bound to a key press, if any. Later actions in [`Action::ALL`] never shadow
    /// earlier ones, so a user binding one key twice gets the first.
    pub fn action(&self, key: &KeyEvent) -> Option<Action> {
        let chord = Chord::from_event(key)?;
        Action::ALL.into_iter().find(|a| self.bindings.get(a).is_some_and(|c| c.contains(&chord)))
    }

    /// "Ctrl+R" style labels of an action's keys, joined by " / ".
    pub fn label(&self, a: Action) -> String {
        self.bindings
            .get(&a)
            .map(|c| c.iter().map(ToString::to_string).collect::<Vec<_>>().join(" / "))
            .unwrap_or_default()
    }

    /// The first key of an action (for hints in banners and the status bar).
    pub fn first(&self, a: Action) -> String {
        self.bindings.get(&a).and_then(|c| c.first()).map(ToString::to_string).unwrap_or_else(|| "(unbound)".into())
    }
}

/// `$XDG_CONFIG_HOME/deltascope/keymap.toml`.
pub fn default_keymap_path() -> Option<PathBuf> {
    dirs::config_dir().map(|d| d.join("deltascope").join("keymap.toml"))
}

#[cfg(test)]
mod tests {
    use ratatui::crossterm::event::{KeyCode, KeyModifiers};

    use super::*;

    fn key(code: KeyCode, m: KeyModifiers) -> KeyEvent {
        KeyEvent::new(code, m)
    }

    #[test]
    fn keymap_names_are_serdes_and_unchanged() {
        // The names users' keymap.toml files use: they must keep parsing.
        let names = "send newline history_prev history_next cancel cancel_or_quit regenerate edit_prompt \
            edit_system delete_turn continue new_conversation show_prompt prev_turn next_turn toggle_thinking \
            collapse_thinking step_mode step end_thinking compare compare_view reference_check first_divergence colour_mode inspector state_view trace_state \
            focus_next focus_prev scroll_up scroll_down follow_tail raise_max_tokens set_thinking_budget \
            copy_answer copy_thinking sessions export replay messages help quit";
        let names: Vec<&str> = names.split_whitespace().collect();
        assert_eq!(Action::ALL.map(Action::name).to_vec(), names);
        for a in Action::ALL {
            assert_eq!(Action::parse(&a.name()), Some(a));
        }
        assert_eq!(Action::parse("picker"), None);
        assert_eq!(Action::parse("Quit"), None);
    }

    #[test]
    fn defaults_resolve() {
        let k = Keymap::default();
        assert_eq!(k.action(&key(KeyCode::Char('r'), KeyModifiers::CONTROL)), Some(Action::Regenerate));
        assert_eq!(k.action(&key(KeyCode::Enter, KeyModifiers::ALT)), Some(Action::Newline));
        assert_eq!(k.action(&key(KeyCode::Enter, KeyModifiers::NONE)), Some(Action::Send));
        assert_eq!(k.action(&key(KeyCode::Char('r'), KeyModifiers::NONE)), None);
        assert_eq!(k.label(Action::Newline), "Alt+Enter / Shift+Enter");
        // Every action has at least one default key, and no two actions share one.
        let mut seen = std::collections::HashSet::new();
        for a in Action::ALL {
            let chords = &k.bindings[&a];
            assert!(!chords.is_empty(), "{a:?}");
            for c in chords {
                assert!(seen.insert(*c), "{c} bound twice");
            }
        }
    }

    #[test]
    fn overrides_and_errors_name_file_and_key() {
        let k = Keymap::parse("[keys]\nregenerate = [\"f6\", \"ctrl-r\"]\nquit = \"ctrl-w\"\n", "keymap.toml").unwrap();
        assert_eq!(k.action(&key(KeyCode::F(6), KeyModifiers::NONE)), Some(Action::Regenerate));
        assert_eq!(k.action(&key(KeyCode::Char('w'), KeyModifiers::CONTROL)), Some(Action::Quit));
        assert_eq!(k.action(&key(KeyCode::Char('q'), KeyModifiers::CONTROL)), None);

        let e = Keymap::parse("[keys]\nregenrate = \"f6\"\n", "/cfg/keymap.toml").unwrap_err();
        assert!(e.to_string().starts_with("/cfg/keymap.toml: unknown action `regenrate`"), "{e}");
        let e = Keymap::parse("[keys]\nquit = \"hyper-q\"\n", "/cfg/keymap.toml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "/cfg/keymap.toml: quit = \"hyper-q\": not a key (examples: \"ctrl-r\", \"alt-enter\", \"f5\", \"pageup\", \"?\")"
        );
        let e = Keymap::parse("[keys]\nquit = 5\n", "k.toml").unwrap_err();
        assert_eq!(e.to_string(), "k.toml: `quit` must be a string or a list of strings");
        let e = Keymap::parse("[bindings]\n", "k.toml").unwrap_err();
        assert_eq!(e.to_string(), "k.toml: unknown table `bindings` (expected [keys])");
        assert!(matches!(Keymap::parse("[keys", "k.toml"), Err(KeymapError::Toml { .. })));
    }

    #[test]
    fn missing_file_is_the_defaults_unless_named() {
        let dir = tempfile::tempdir().unwrap();
        let none = dir.path().join("none.toml");
        assert_eq!(Keymap::load(&none).unwrap(), Keymap::default());
        let e = Keymap::load_named(&none).unwrap_err();
        assert!(e.to_string().starts_with(&format!("cannot read keymap {}: ", none.display())), "{e}");
    }

    #[test]
    fn a_key_bound_twice_or_no_way_to_send_or_quit_is_an_error() {
        // Quit moved onto regenerate's default key.
        let e = Keymap::parse("[keys]\nquit = \"ctrl-r\"\n", "k.toml").unwrap_err();
        assert_eq!(
            e.to_string(),
            "k.toml: Ctrl+R is bound to both regenerate and quit (regenerate by default: rebind it too)"
        );
        // Both named in the file.
        let e = Keymap::parse("[keys]\nquit = \"f9\"\nhelp = [\"f1\", \"f9\"]\n", "k.toml").unwrap_err();
        assert_eq!(e.to_string(), "k.toml: F9 is bound to both help and quit");
        // Swapping two keys is fine.
        let k = Keymap::parse("[keys]\nquit = \"ctrl-r\"\nregenerate = \"ctrl-q\"\n", "k.toml").unwrap();
        assert_eq!(k.action(&key(KeyCode::Char('r'), KeyModifiers::CONTROL)), Some(Action::Quit));
        let e = Keymap::parse("[keys]\nsend = []\n", "k.toml").unwrap_err();
        assert_eq!(e.to_string(), "k.toml: send has no key: without one there is no way to send a prompt");
        let e = Keymap::parse("[keys]\nquit = []\n", "k.toml").unwrap_err();
        assert_eq!(e.to_string(), "k.toml: quit has no key: without one there is no way to quit");
        // Other actions may be left without a key.
        assert!(Keymap::parse("[keys]\nexport = []\n", "k.toml").is_ok());
    }
}
