//! The engine on its own OS thread (generation is compute-bound and never runs on an async
//! runtime). Each request gets its own event stream and its own control ([`Generation`]), so
//! cancelling one request can never touch another; requests queue behind each other.

use std::sync::Arc;
use std::sync::mpsc::{self, Sender};
use std::thread::JoinHandle;

use super::generator::Generator;
use super::request::GenerateRequest;
use super::sequence::Compute;
use deltascope_model::panic_message;
use deltascope_protocol::TextTokenizer;
use deltascope_protocol::{EngineEvent, ErrorKind, Generation, StepControl, error_kind};

enum Command {
    Generate { req: Box<GenerateRequest>, events: Sender<EngineEvent>, control: Arc<StepControl> },
    Shutdown,
}

pub struct EngineHandle {
    commands: Sender<Command>,
    thread: Option<JoinHandle<()>>,
}

impl EngineHandle {
    /// The engine thread over `compute` (the CPU model, or a GPU model beside it).
    pub fn spawn(
        compute: Arc<dyn Compute>,
        tokenizer: Arc<TextTokenizer>,
        model_name: String,
    ) -> std::io::Result<Self> {
        let (cmd_tx, cmd_rx) = mpsc::channel::<Command>();
        let thread = std::thread::Builder::new().name("deltascope-engine".into()).spawn(move || {
            let generator = Generator::new(&tokenizer, model_name);
            while let Ok(Command::Generate { req, events, control }) = cmd_rx.recv() {
                let mut emit = |e: EngineEvent| {
                    let _ = events.send(e);
                };
                let drafting = req.params.mtp.is_on();
                // A panic inside one generation (a bug, or a shape a checkpoint gets wrong)
                // ends that generation with an error event; the engine stays up for the next.
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut session = compute.sequence(drafting)?;
                    generator.generate(session.as_mut(), &req, control.as_ref(), &mut emit)
                }));
                let error = match run {
                    Ok(Ok(_)) => continue,
                    Ok(Err(e)) => EngineEvent::error(error_kind(&e), e.to_string()),
                    Err(panic) => EngineEvent::error(
                        ErrorKind::Internal,
                        format!("internal error in the engine: {}", panic_message(panic.as_ref())),
                    ),
                };
                let _ = events.send(error);
            }
        })?;
        Ok(EngineHandle { commands: cmd_tx, thread: Some(thread) })
    }

    /// Queues a generation (behind a running one) with its own stream and control.
    pub fn generate(&self, req: GenerateRequest) -> Generation {
        self.generate_with(req, Arc::new(StepControl::default()))
    }

    /// [`EngineHandle::generate`] steered by `control` from the start (step mode set before
    /// the request holds it before its first token).
    pub fn generate_with(&self, req: GenerateRequest, control: Arc<StepControl>) -> Generation {
        let (tx, rx) = mpsc::channel();
        if self
            .commands
            .send(Command::Generate { req: Box::new(req), events: tx.clone(), control: control.clone() })
            .is_err()
        {
            let _ = tx.send(EngineEvent::error(ErrorKind::Unavailable, "the engine thread has stopped"));
        }
        Generation::new(rx, control)
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
