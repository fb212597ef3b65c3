//! Key chords: a key with its modifiers, parsed from keymap files (`ctrl-r`, `alt-enter`,
//! `f5`) and matched against crossterm's key events.

use std::fmt;

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

/// A key with its modifiers (only CONTROL, ALT and SHIFT matter).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Chord {
    code: ChordCode,
    ctrl: bool,
    alt: bool,
    shift: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum ChordCode {
    Char(char),
    F(u8),
    Named(&'static str),
}

const NAMED: [&str; 14] = [
    "enter",
    "esc",
    "tab",
    "backtab",
    "backspace",
    "delete",
    "up",
    "down",
    "left",
    "right",
    "home",
    "end",
    "pageup",
    "pagedown",
];

impl Chord {
    pub fn parse(spec: &str) -> Option<Chord> {
        let lower = spec.trim().to_lowercase();
        let mut parts: Vec<&str> = lower.split('-').collect();
        // "ctrl--" binds the minus key.
        if lower.ends_with("--") {
            parts.truncate(parts.len().saturating_sub(2));
            parts.push("-");
        }
        let key = parts.pop()?;
        let (mut ctrl, mut alt, mut shift) = (false, false, false);
        for m in parts {
            match m {
                "ctrl" | "c" => ctrl = true,
                "alt" | "a" | "m" | "meta" => alt = true,
                "shift" | "s" => shift = true,
                _ => return None,
            }
        }
        let code = if let Some(n) = NAMED.iter().find(|n| **n == key) {
            ChordCode::Named(n)
        } else if key == "space" {
            ChordCode::Char(' ')
        } else if let Some(f) = key.strip_prefix('f').filter(|r| !r.is_empty()).and_then(|r| r.parse::<u8>().ok()) {
            ChordCode::F(f)
        } else {
            let mut chars = key.chars();
            let c = chars.next()?;
            if chars.next().is_some() {
                return None;
            }
            ChordCode::Char(c)
        };
        Some(Chord { code, ctrl, alt, shift })
    }

    pub fn from_event(k: &KeyEvent) -> Option<Chord> {
        let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
        let alt = k.modifiers.contains(KeyModifiers::ALT);
        let mut shift = k.modifiers.contains(KeyModifiers::SHIFT);
        let code = match k.code {
            KeyCode::Char(c) => {
                // Shifted characters arrive already shifted ('?' rather than shift-/).
                shift = false;
                ChordCode::Char(c.to_ascii_lowercase())
            }
            KeyCode::F(n) => ChordCode::F(n),
            KeyCode::Enter => ChordCode::Named("enter"),
            KeyCode::Esc => ChordCode::Named("esc"),
            KeyCode::Tab => ChordCode::Named("tab"),
            KeyCode::BackTab => {
                shift = false;
                ChordCode::Named("backtab")
            }
            KeyCode::Backspace => ChordCode::Named("backspace"),
            KeyCode::Delete => ChordCode::Named("delete"),
            KeyCode::Up => ChordCode::Named("up"),
            KeyCode::Down => ChordCode::Named("down"),
            KeyCode::Left => ChordCode::Named("left"),
            KeyCode::Right => ChordCode::Named("right"),
            KeyCode::Home => ChordCode::Named("home"),
            KeyCode::End => ChordCode::Named("end"),
            KeyCode::PageUp => ChordCode::Named("pageup"),
            KeyCode::PageDown => ChordCode::Named("pagedown"),
            _ => return None,
        };
        Some(Chord { code, ctrl, alt, shift })
    }
}

impl fmt::Display for Chord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ctrl {
            f.write_str("Ctrl+")?;
        }
        if self.alt {
            f.write_str("Alt+")?;
        }
        if self.shift {
            f.write_str("Shift+")?;
        }
        match self.code {
            ChordCode::Char(' ') => f.write_str("Space"),
            ChordCode::Char(c) if self.ctrl || self.alt => write!(f, "{}", c.to_ascii_uppercase()),
            ChordCode::Char(c) => write!(f, "{c}"),
            ChordCode::F(n) => write!(f, "F{n}"),
            ChordCode::Named(n) => {
                let s = match n {
                    "esc" => "Esc",
                    "enter" => "Enter",
                    "tab" => "Tab",
                    "backtab" => "Shift+Tab",
                    "pageup" => "PgUp",
                    "pagedown" => "PgDn",
                    "up" => "↑",
                    "down" => "↓",
                    "left" => "←",
                    "right" => "→",
                    "home" => "Home",
                    "end" => "End",
                    "backspace" => "Backspace",
                    "delete" => "Del",
                    other => other,
                };
                f.write_str(s)
            }
        }
    }
}
