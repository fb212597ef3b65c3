//! One request's event stream and its controls, whoever produces the events.

use std::sync::Arc;
use std::sync::mpsc::Receiver;

use super::control::StepControl;
use super::events::{EngineEvent, ErrorKind};
use deltascope_model::Error;

/// One request's event stream and its controls. Dropping it does not stop the generation;
/// [`Generation::cancel`] does (within one token, keeping what was produced).
pub struct Generation {
    events: Receiver<EngineEvent>,
    control: Arc<StepControl>,
}

impl Generation {
    /// A generation fed by `events` and steered through `control` (the remote backend's
    /// streaming task holds the other ends).
    pub fn new(events: Receiver<EngineEvent>, control: Arc<StepControl>) -> Self {
        Generation { events, control }
    }

    pub fn events(&self) -> &Receiver<EngineEvent> {
        &self.events
    }

    /// Stops the generation; the stream still ends with `done` (finish `cancelled`).
    pub fn cancel(&self) {
        self.control.cancel();
    }

    pub fn is_cancelled(&self) -> bool {
        self.control.is_cancelled()
    }

    /// Step mode: pause before the next token; [`Generation::step`] then advances one token.
    pub fn set_paused(&self, paused: bool) {
        self.control.set_paused(paused);
    }

    pub fn step(&self) {
        self.control.step(1);
    }

    /// Forces the end of thinking before the next token (the rescue of a loop, by hand); the
    /// model then answers. A no-op outside thinking.
    pub fn end_thinking(&self) {
        self.control.end_thinking();
    }

    /// The control, for a signal handler that must cancel from another thread.
    pub fn control(&self) -> Arc<StepControl> {
        self.control.clone()
    }

    /// Waits for the terminal event (`done` or `error`), handing every event to `on_event`.
    /// A stream that ends without one (the producer died) ends with an internal error.
    pub fn for_each(&self, mut on_event: impl FnMut(&EngineEvent)) -> EngineEvent {
        for ev in self.events.iter() {
            on_event(&ev);
            if ev.is_terminal() {
                return ev;
            }
        }
        let ev = EngineEvent::error(ErrorKind::Internal, "the generation stopped without a done event");
        on_event(&ev);
        ev
    }
}

/// The error kind of a library error raised while a generation runs.
pub fn error_kind(e: &Error) -> ErrorKind {
    match e {
        Error::ContextOverflow { .. } => ErrorKind::ContextOverflow,
        Error::InvalidArgument(_) | Error::TokenOutOfRange { .. } => ErrorKind::InvalidRequest,
        Error::Device { .. } => ErrorKind::Unavailable,
        _ => ErrorKind::Internal,
    }
}
