//! Ctrl+C, SIGTERM and SIGHUP for the headless commands. The first one cancels the work in
//! flight (a generation stops within a token, a server stream at once); what already finished
//! is kept and printed. A second one exits at once. The exit status names the signal (128 + its
//! number: 130, 143, 129), so scripts can tell an interrupted run from a finished one.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

type Callback = Box<dyn Fn() + Send>;

/// The signals a headless command stops on, once installed.
#[derive(Clone)]
pub struct Interrupt {
    signal: Arc<AtomicI32>,
    cancelled: Arc<AtomicBool>,
    on_signal: Arc<Mutex<Option<Callback>>>,
}

impl Interrupt {
    /// Starts listening (a thread waits for the signals).
    pub fn install() -> anyhow::Result<Interrupt> {
        let i = Interrupt {
            signal: Arc::new(AtomicI32::new(0)),
            cancelled: Arc::new(AtomicBool::new(false)),
            on_signal: Arc::new(Mutex::new(None)),
        };
        let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])
            .map_err(|e| anyhow::anyhow!("cannot listen for Ctrl+C / SIGTERM / SIGHUP: {e}"))?;
        let me = i.clone();
        std::thread::Builder::new().name("deltascope-signals".into()).spawn(move || {
            for sig in signals.forever() {
                if me.signal.swap(sig, Ordering::SeqCst) != 0 {
                    // The second signal: the user means it.
                    std::process::exit(128 + sig);
                }
                me.cancelled.store(true, Ordering::SeqCst);
                if let Ok(f) = me.on_signal.lock()
                    && let Some(f) = f.as_ref()
                {
                    f();
                }
            }
        })?;
        Ok(i)
    }

    /// What to do when the first signal comes: cancel the generation in flight. Replaces the
    /// previous callback; called at once if a signal already came.
    pub fn on_signal(&self, f: impl Fn() + Send + 'static) {
        if let Ok(mut slot) = self.on_signal.lock() {
            if self.interrupted() {
                f();
            }
            *slot = Some(Box::new(f));
        }
    }

    pub fn interrupted(&self) -> bool {
        self.signal.load(Ordering::SeqCst) != 0
    }

    /// Set by the first signal: the engine's cancel flag for work run in this thread.
    pub fn cancel_flag(&self) -> &AtomicBool {
        &self.cancelled
    }

    /// The error a command returns once it has printed what finished before the signal.
    pub fn stopped(&self) -> Interrupted {
        Interrupted::new(self.signal.load(Ordering::SeqCst))
    }

    /// The end of a command: `Ok` when no signal came; else says on stderr what was done
    /// (`"3 of 5 runs finished"`) and returns the [`Interrupted`] error `main` exits with.
    pub fn finish(&self, what: impl std::fmt::Display) -> anyhow::Result<()> {
        if !self.interrupted() {
            return Ok(());
        }
        let _ = writeln!(std::io::stderr(), "interrupted by {}: {what}", self.signal_name());
        Err(self.stopped().into())
    }

    /// `SIGINT` / `SIGTERM` / `SIGHUP`.
    pub fn signal_name(&self) -> &'static str {
        self.stopped().name()
    }
}

pub use crate::exit::Interrupted;
