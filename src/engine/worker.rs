//! The engine on its own OS thread (generation is compute-bound and never runs on an async
//! runtime): front ends send commands and read one stream of events.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use super::control::StepControl;
use super::events::EngineEvent;
use super::generate::Generator;
use super::request::GenerateRequest;
use super::session::ModelSession;
use crate::chat::TextTokenizer;
use crate::model::Model;

pub enum Command {
    Generate(Box<GenerateRequest>),
    Shutdown,
}

pub struct EngineHandle {
    commands: Sender<Command>,
    pub events: Receiver<EngineEvent>,
    control: Arc<StepControl>,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    pub fn spawn(model: Arc<Model>, tokenizer: Arc<TextTokenizer>, model_name: String) -> Self {
        let (cmd_tx, cmd_rx) = mpsc::channel::<Command>();
        let (ev_tx, ev_rx) = mpsc::channel::<EngineEvent>();
        let control = Arc::new(StepControl::default());
        let ctl = control.clone();
        let thread = std::thread::Builder::new()
            .name("deltascope-engine".into())
            .spawn(move || {
                let generator = Generator { tokenizer: &tokenizer, model_name };
                while let Ok(Command::Generate(req)) = cmd_rx.recv() {
                    let mut emit = |e: EngineEvent| {
                        let _ = ev_tx.send(e);
                    };
                    let drafting = req.params.mtp.depth > 0 || req.params.mtp.auto;
                    // A panic inside one generation (a bug, or a shape a checkpoint gets wrong)
                    // ends that generation with an error event; the engine stays up for the next.
                    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        let mut session =
                            if drafting { ModelSession::with_mtp(&model) } else { ModelSession::new(&model) };
                        generator.generate(&mut session, &req, ctl.as_ref(), &mut emit)
                    }));
                    let message = match run {
                        Ok(Ok(_)) => continue,
                        Ok(Err(e)) => e.to_string(),
                        Err(panic) => format!("internal error in the engine: {}", panic_message(panic.as_ref())),
                    };
                    let _ = ev_tx.send(EngineEvent::Error { message });
                }
            })
            .expect("spawning the engine thread");
        EngineHandle { commands: cmd_tx, events: ev_rx, control, thread: Some(thread) }
    }

    /// Starts a generation (queued behind a running one). Clears a previous cancellation.
    pub fn generate(&self, req: GenerateRequest) {
        self.control.reset();
        let _ = self.commands.send(Command::Generate(Box::new(req)));
    }

    /// Stops the running generation within one token; what was produced is kept.
    pub fn cancel(&self) {
        self.control.cancel();
    }

    /// Step mode: pause before the next token; `step` then advances one token at a time.
    pub fn set_paused(&self, paused: bool) {
        self.control.set_paused(paused);
    }

    pub fn step(&self) {
        self.control.step(1);
    }

    pub fn control(&self) -> Arc<StepControl> {
        self.control.clone()
    }
}

/// The text a panic was raised with (`panic!` payloads are `&str` or `String`).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.cancel();
        let _ = self.commands.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
