//! Frame coalescing: any number of events mark the state dirty; at most one draw happens per
//! frame interval, wrapped in a synchronized update so terminals that support it never show
//! a half-drawn frame. A fast engine emits hundreds of tokens per second; drawing each one
//! would spend the time on the terminal instead of on the keys.

use std::io::Write;
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::Backend;
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{BeginSynchronizedUpdate, EndSynchronizedUpdate};

use super::app::{App, Layout};
use super::view::View;

/// About 60 frames per second at most.
pub const FRAME: Duration = Duration::from_millis(16);

#[derive(Debug)]
pub struct FrameClock {
    last: Option<Instant>,
    pub dirty: bool,
    /// Draws so far (a test checks coalescing).
    pub frames: u64,
}

impl Default for FrameClock {
    fn default() -> Self {
        FrameClock { last: None, dirty: true, frames: 0 }
    }
}

impl FrameClock {
    /// Whether a draw is due now.
    pub fn due(&self, now: Instant) -> bool {
        self.dirty && self.last.is_none_or(|l| now.duration_since(l) >= FRAME)
    }

    /// How long the main loop may wait for input before the next frame is due.
    pub fn wait(&self, now: Instant, idle: Duration) -> Duration {
        match (self.dirty, self.last) {
            (true, Some(l)) => FRAME.saturating_sub(now.duration_since(l)),
            (true, None) => Duration::ZERO,
            (false, _) => idle,
        }
    }

    pub fn drawn(&mut self, now: Instant) {
        self.last = Some(now);
        self.dirty = false;
        self.frames += 1;
    }
}

/// Draws one frame of `app`, inside a synchronized update when `sync` (a real terminal), and
/// returns what it laid out.
pub fn draw<B: Backend, W: Write>(
    terminal: &mut Terminal<B>,
    app: &App,
    view: &mut View,
    sync: Option<&mut W>,
) -> anyhow::Result<Layout>
where
    B::Error: Send + Sync + 'static,
{
    let mut layout = Layout::default();
    match sync {
        Some(out) => {
            execute!(out, BeginSynchronizedUpdate)?;
            let r = terminal.draw(|f| layout = view.draw(app, f));
            execute!(out, EndSynchronizedUpdate)?;
            r?;
        }
        None => {
            terminal.draw(|f| layout = view.draw(app, f))?;
        }
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_events_one_frame() {
        let mut c = FrameClock::default();
        let t0 = Instant::now();
        assert!(c.due(t0));
        c.drawn(t0);
        // A burst of events within one frame interval: dirty, but no draw until the frame ends.
        for _ in 0..500 {
            c.dirty = true;
            assert!(!c.due(t0 + Duration::from_millis(5)));
        }
        assert!(c.due(t0 + FRAME));
        assert_eq!(c.wait(t0 + Duration::from_millis(6), Duration::from_secs(1)), Duration::from_millis(10));
        c.drawn(t0 + FRAME);
        assert_eq!(c.frames, 2);
        assert_eq!(c.wait(t0 + FRAME, Duration::from_millis(250)), Duration::from_millis(250));
    }
}
