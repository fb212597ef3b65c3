//! How a front end steers a running generation: cancel (within one token, keeping everything
//! produced), step mode (pause, then advance one token — or one forced block — per command) and
//! ending thinking now (the rescue of a loop, by hand).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

pub trait Control: Sync {
    /// Called before every token; `false` stops the generation (cancelled). May block while the
    /// generation is paused.
    fn proceed(&self) -> bool;

    /// Whether the user asked to end thinking now (the TUI's rescue key on a loop banner);
    /// reading it clears it.
    fn end_thinking_requested(&self) -> bool {
        false
    }
}

/// A bare cancellation flag.
impl Control for AtomicBool {
    fn proceed(&self) -> bool {
        !self.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default)]
struct Gate {
    paused: bool,
    /// Tokens allowed while paused.
    credits: u64,
}

/// Cancellation plus step mode, shared between the engine thread and a front end.
#[derive(Debug, Default)]
pub struct StepControl {
    cancel: AtomicBool,
    end_thinking: AtomicBool,
    gate: Mutex<Gate>,
    wake: Condvar,
}

impl StepControl {
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.wake.notify_all();
    }

    /// Asks the generation to force the end of thinking before its next token (a no-op
    /// outside thinking).
    pub fn end_thinking(&self) {
        self.end_thinking.store(true, Ordering::SeqCst);
        self.wake.notify_all();
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    pub fn set_paused(&self, paused: bool) {
        if let Ok(mut g) = self.gate.lock() {
            g.paused = paused;
            if !paused {
                g.credits = 0;
            }
        }
        self.wake.notify_all();
    }

    pub fn is_paused(&self) -> bool {
        self.gate.lock().map(|g| g.paused).unwrap_or(false)
    }

    /// Lets a paused generation advance `n` more tokens.
    pub fn step(&self, n: u64) {
        if let Ok(mut g) = self.gate.lock() {
            g.credits += n;
        }
        self.wake.notify_all();
    }
}

impl Control for StepControl {
    fn end_thinking_requested(&self) -> bool {
        self.end_thinking.swap(false, Ordering::SeqCst)
    }

    fn proceed(&self) -> bool {
        let Ok(mut g) = self.gate.lock() else { return !self.is_cancelled() };
        while g.paused && g.credits == 0 && !self.is_cancelled() {
            g = match self.wake.wait(g) {
                Ok(g) => g,
                Err(_) => return false,
            };
        }
        if g.paused && g.credits > 0 {
            g.credits -= 1;
        }
        !self.is_cancelled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn paused_control_advances_one_credit_at_a_time() {
        let c = Arc::new(StepControl::default());
        c.set_paused(true);
        c.step(2);
        assert!(c.proceed());
        assert!(c.proceed());
        // No credit left: proceed blocks until a step or a cancel arrives.
        let c2 = c.clone();
        let h = std::thread::spawn(move || c2.proceed());
        std::thread::sleep(Duration::from_millis(50));
        assert!(!h.is_finished());
        c.step(1);
        assert!(h.join().unwrap());
        let c3 = c.clone();
        let h = std::thread::spawn(move || c3.proceed());
        std::thread::sleep(Duration::from_millis(20));
        c.cancel();
        assert!(!h.join().unwrap());
    }
}
