//! The engine on its own OS thread (generation is compute-bound and never runs on an async
//! runtime): front ends send commands and read one stream of events.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;

use super::events::EngineEvent;
use super::generate::Generator;
use super::request::GenerateRequest;
use crate::chat::TextTokenizer;
use crate::model::Model;

pub enum Command {
    Generate(GenerateRequest),
    Shutdown,
}

pub struct EngineHandle {
    commands: Sender<Command>,
    pub events: Receiver<EngineEvent>,
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    pub fn spawn(model: Arc<Model>, tokenizer: Arc<TextTokenizer>, model_name: String) -> Self {
        let (cmd_tx, cmd_rx) = mpsc::channel::<Command>();
        let (ev_tx, ev_rx) = mpsc::channel::<EngineEvent>();
        let cancel = Arc::new(AtomicBool::new(false));
        let flag = cancel.clone();
        let thread = std::thread::Builder::new()
            .name("deltascope-engine".into())
            .spawn(move || {
                let generator = Generator { model: &model, tokenizer: &tokenizer, model_name };
                while let Ok(Command::Generate(req)) = cmd_rx.recv() {
                    flag.store(false, Ordering::SeqCst);
                    let mut emit = |e: EngineEvent| {
                        let _ = ev_tx.send(e);
                    };
                    if let Err(e) = generator.generate(&req, &flag, &mut emit) {
                        let _ = ev_tx.send(EngineEvent::Error { message: e.to_string() });
                    }
                }
            })
            .expect("spawning the engine thread");
        EngineHandle { commands: cmd_tx, events: ev_rx, cancel, thread: Some(thread) }
    }

    pub fn generate(&self, req: GenerateRequest) {
        let _ = self.commands.send(Command::Generate(req));
    }

    /// Stops the running generation within one token; what was produced is kept.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
    }

    /// A flag that cancels the running generation (for signal handlers).
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        self.cancel.clone()
    }
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
