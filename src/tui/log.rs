//! The message log: every message the workbench showed, kept whole. The status line shows the
//! latest for a few seconds; the messages panel (`panels/messages.rs`) shows them all.

/// How long an informational message stays in the status line.
const SHOWN_MS: f64 = 6000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warning,
    Error,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub at_ms: f64,
    pub level: Level,
    pub text: String,
}

#[derive(Debug, Default)]
pub struct MessageLog {
    pub items: Vec<Message>,
    /// Whether the latest message is still in the status line.
    showing: bool,
}

impl MessageLog {
    pub fn push(&mut self, level: Level, text: impl Into<String>, now_ms: f64) {
        let text = text.into();
        match level {
            Level::Info => tracing::info!("{text}"),
            Level::Warning | Level::Error => tracing::warn!("{text}"),
        }
        self.items.push(Message { at_ms: now_ms, level, text });
        self.showing = true;
    }

    /// The message the status line shows now.
    pub fn current(&self) -> Option<&Message> {
        self.items.last().filter(|_| self.showing)
    }

    /// Expires the status line's message; `true` when that changed the screen.
    pub fn tick(&mut self, now_ms: f64) -> bool {
        let expired = self.current().is_some_and(|m| now_ms - m.at_ms > SHOWN_MS);
        if expired {
            self.showing = false;
        }
        expired
    }
}
