//! What the app hands the runner: the effects it queued, whether the screen changed, and
//! whether to quit. Quitting lives here with saving because a quit waits for the last save
//! (and asks when it fails).

use super::{App, Effect, Level, Overlay};

#[derive(Default)]
pub(super) struct Outbox {
    pub(super) effects: Vec<Effect>,
    pub(super) quit: bool,
    /// Quit once the save asked for has worked (a path typed after a failed save).
    pub(super) quit_after_save: bool,
    /// Something on screen changed since the last frame.
    pub(super) dirty: bool,
    /// The signal that ended the workbench (SIGINT / SIGTERM / SIGHUP from outside).
    pub(super) signal: Option<i32>,
}

impl App {
    pub fn take_effects(&mut self) -> Vec<Effect> {
        std::mem::take(&mut self.out.effects)
    }

    /// The signal that ended the workbench, if one did (the exit status names it).
    pub fn stopped_by(&self) -> Option<i32> {
        self.out.signal
    }

    /// Whether the app is done (the runner saves what is left and ends).
    pub fn quitting(&self) -> bool {
        self.out.quit
    }

    /// Whether the screen changed since the last call (the runner then draws a frame).
    pub fn take_redraw(&mut self) -> bool {
        std::mem::take(&mut self.out.dirty)
    }

    /// Quit (Ctrl+Q): the conversation is saved first; when that fails, ask.
    pub(super) fn request_quit(&mut self) {
        if self.generating() {
            // The runner waits for the cancelled generation's end, then saves.
            self.out.effects.push(Effect::Cancel);
            self.out.quit = true;
            return;
        }
        if !self.convo.save.unsaved {
            self.out.quit = true;
            return;
        }
        self.out.quit_after_save = true;
        self.save_now();
    }

    /// A signal or a lost terminal: save what can be saved and go, without asking.
    pub(super) fn force_quit(&mut self) {
        if self.generating() {
            self.out.effects.push(Effect::Cancel);
        }
        self.out.quit = true;
    }

    /// Asks the runner to write the conversation if it changed ([`Effect::Save`], answered
    /// with [`Inbound::Saved`](crate::tui::event::Inbound::Saved)). Also the runner's last act
    /// before the program ends.
    pub fn save_now(&mut self) {
        if self.convo.replay.is_some() {
            return;
        }
        if self.convo.save.due(&self.convo.session) {
            let path = self.convo.save.file(&self.convo.session);
            self.out.effects.push(Effect::Save { path, session: Box::new(self.convo.session.clone()) });
        } else {
            self.after_save(Ok(()));
        }
    }

    /// A save worked or failed: quit if that was waiting for it, or ask.
    pub(super) fn after_save(&mut self, result: Result<(), String>) {
        let quit_after = std::mem::take(&mut self.out.quit_after_save);
        match result {
            Ok(()) if quit_after => self.out.quit = true,
            Ok(()) => {}
            Err(e) => {
                self.say(Level::Error, format!("autosave failed: {e}"));
                if quit_after && !self.out.quit {
                    self.overlay = Overlay::ConfirmQuit;
                }
            }
        }
        self.out.dirty = true;
    }

    /// What was lost if the program ends now (printed after the terminal is restored).
    pub fn loss_report(&self) -> Option<String> {
        self.convo.save.loss_report(&self.convo.session)
    }

    /// The program is ending without asking (a signal, a lost terminal) and the conversation
    /// could not be saved: where a rescue copy may go, first choice first, and the session to
    /// write there. `None` when nothing is lost (or a replay, which writes nothing).
    pub fn rescue_plan(&self) -> Option<(Vec<std::path::PathBuf>, Box<crate::session::Session>)> {
        if self.convo.replay.is_some() || self.loss_report().is_none() {
            return None;
        }
        let dirs = self.convo.save.rescue_dirs(&self.convo.session);
        Some((dirs, Box::new(self.convo.session.clone())))
    }

    /// Another window holds `file` (`holder` says who): this window saves to `copy` instead,
    /// says so, and keeps saying it on the status line.
    pub fn held_elsewhere(&mut self, file: std::path::PathBuf, holder: String, copy: std::path::PathBuf) {
        self.say(
            Level::Warning,
            format!(
                "{} is open in another deltascope window ({holder}): this window saves to {} instead (neither overwrites the other)",
                file.display(),
                copy.display()
            ),
        );
        self.convo.save.path = Some(copy);
        self.convo.save.last_good = None;
        self.convo.save.held_elsewhere = Some((file, holder));
        self.out.dirty = true;
    }

    /// Where this conversation went when another window held its file (said on quitting).
    pub fn copy_report(&self) -> Option<String> {
        self.convo.save.copy_report()
    }

    /// A rescue copy was written to `path`.
    pub fn rescued(&mut self, path: std::path::PathBuf) {
        self.convo.save.rescued = Some(path);
    }
}
