//! Where the backend stands (loading, open, failed) and what the status line calls the
//! workbench's state. The runner owns the backend; the app only hears about it.

use super::{App, Level};
use crate::backend::{BackendInfo, Support};
use deltascope_protocol::Phase;

#[derive(Default)]
pub(super) struct BackendStatus {
    /// What the backend said about itself, once it is open.
    pub(super) model: Option<BackendInfo>,
    /// Loading progress: (done, total, what).
    pub(super) loading: Option<(u64, u64, String)>,
    /// Why the workbench cannot work (a model that failed to load); shown instead of it.
    pub(super) fatal: Option<String>,
}

impl App {
    /// What the backend said about itself, once it is open.
    pub fn model(&self) -> Option<&BackendInfo> {
        self.backend.model.as_ref()
    }

    /// Loading progress while the backend opens: (done, total, what).
    pub fn loading(&self) -> Option<&(u64, u64, String)> {
        self.backend.loading.as_ref()
    }

    /// Why the workbench cannot work, when it cannot.
    pub fn fatal(&self) -> Option<&str> {
        self.backend.fatal.as_deref()
    }

    /// The workbench cannot work: `why` replaces it on screen, and the runner says it again
    /// once the terminal is restored.
    pub fn fail(&mut self, why: String) {
        self.backend.loading = None;
        self.backend.fatal = Some(why);
        self.out.dirty = true;
    }

    /// The failure, taken for the runner to report after the terminal is restored.
    pub fn take_fatal(&mut self) -> Option<String> {
        self.backend.fatal.take()
    }

    /// The backend is ready (a model loaded, or a server answered).
    pub fn set_model(&mut self, info: BackendInfo) {
        self.settings.mtp = match (&info.mtp_control, info.has_mtp) {
            (Support::No(why), _) => Support::No(why.clone()),
            (Support::Yes, false) => Support::No("no head".into()),
            (Support::Yes, true) => Support::Yes,
        };
        self.settings.context = info.context.filter(|c| *c > 0);
        if self.convo.session.model.is_empty() {
            self.convo.session.model = info.name.clone();
        }
        if let Some(note) = &info.device_note {
            self.say(Level::Info, note.clone());
        }
        for note in &info.config_notes {
            self.say(Level::Warning, note.clone());
        }
        self.backend.model = Some(info);
        self.warn_other_model();
        self.backend.loading = None;
        self.out.dirty = true;
    }

    pub fn generating(&self) -> bool {
        self.convo.live.is_some()
    }

    /// The turn being generated, if any.
    pub fn live_turn(&self) -> Option<usize> {
        self.convo.live.as_ref().map(|l| l.turn)
    }

    /// The phase of the generation in flight (`None` when none is).
    pub fn live_phase(&self) -> Option<Phase> {
        let live = self.convo.live.as_ref()?;
        let t = self.convo.session.turns.get(live.turn)?;
        Some(t.tokens.last().map_or(t.start_phase, |x| x.phase))
    }

    /// Something moves on its own (a generation, a replay, loading): the runner ticks faster.
    pub fn busy(&self) -> bool {
        self.convo.live.is_some() || self.convo.replay.is_some() || self.backend.loading.is_some()
    }

    /// idle / loading / prefill / thinking / answering / paused / done.
    pub fn state_label(&self) -> &'static str {
        if self.backend.loading.is_some() {
            return "loading";
        }
        if self.convo.replay.is_some() {
            return "replay";
        }
        match (self.convo.live, self.shown()) {
            (Some(_), Some(t)) => {
                if self.view.step_mode {
                    return "paused (step)";
                }
                match t.tokens.last() {
                    None => "prefill",
                    Some(tok) if tok.phase == Phase::Thinking => "thinking",
                    Some(_) => "answering",
                }
            }
            (None, Some(t)) if t.is_finished() => "done",
            _ => "idle",
        }
    }
}
