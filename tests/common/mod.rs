//! Scripted engine event streams and an app without a model, for the TUI tests and the bench.
#![allow(dead_code)]

use deltascope::backend::{BackendInfo, BackendKind, Support};
use deltascope::session::Session;
use deltascope::tui::app::{App, AppConfig, Effect, SessionsDir};
use deltascope::tui::event::Inbound;
use deltascope::tui::keymap::Keymap;
use deltascope::tui::sliders::Settings;
use deltascope::tui::theme::Theme;
use deltascope_protocol::{
    Alternative, CountSource, Diagnostic, DiagnosticKind, DoneEvent, DraftKind, EngineEvent, FinishReason,
    GenerationParams, Memory, MtpMode, MtpStats, Phase, SamplingParams, StartEvent, StatsEvent, Thinking, Timing,
    TokenEvent, Usage,
};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{Event, KeyCode, KeyEvent, KeyModifiers};

pub fn model() -> BackendInfo {
    BackendInfo {
        name: "embedded:demo".into(),
        kind: BackendKind::Local { devices: vec!["cpu".into()], dtype: "bf16".into() },
        device_note: None,
        config_notes: vec![],
        identity: Default::default(),
        context: Some(4096),
        vocab_size: Some(512),
        has_mtp: true,
        layers: Some("8 layers: 6 GDN + 2 attention".into()),
        file_type: None,
        weights_bytes: Some(16_142_336),
        defaults: SamplingParams::default(),
        step: Support::Yes,
        end_thinking: Support::Yes,
        provenance: Support::Yes,
        mtp_control: Support::Yes,
        continuation: Support::Yes,
        state_trace: Support::Yes,
    }
}

pub fn params(max_tokens: usize, budget: Option<usize>) -> GenerationParams {
    GenerationParams {
        max_tokens,
        thinking: Thinking::from_budget(budget),
        mtp: MtpMode::fixed(2),
        ..Default::default()
    }
}

pub fn diag(kind: DiagnosticKind, at_token: usize, message: &str, loop_at: Option<(usize, usize)>) -> EngineEvent {
    EngineEvent::Diagnostic(Diagnostic {
        kind,
        at_token,
        message: message.into(),
        period: loop_at.map(|l| l.0),
        start: loop_at.map(|l| l.1),
        fix: None,
        layer: None,
        head: None,
    })
}

/// An app with the demo model "loaded" (no engine: effects are just collected).
pub fn app() -> App {
    let mut app = unopened_app();
    app.set_model(model());
    app
}

/// An app on `info` whose sliders start at `params` (as the runner starts them from the flags
/// resolved against the backend's defaults).
pub fn app_on(info: BackendInfo, params: GenerationParams) -> App {
    let mut app = unopened_app_with(&info.name, params);
    app.set_model(info);
    app
}

/// The app before its backend is open.
pub fn unopened_app() -> App {
    unopened_app_with("embedded:demo", params(256, None))
}

/// The app before its backend is open, for `model` with the sliders at `params`.
fn unopened_app_with(model: &str, params: GenerationParams) -> App {
    let mut session = Session::new(model, None);
    session.id = "test-session".into();
    session.created = 1_764_500_000;
    App::new(AppConfig {
        theme: Theme::default(),
        keymap: Keymap::default(),
        settings: Settings {
            params,
            resume_thinking: Thinking::Unlimited,
            preset: None,
            mtp: Support::Yes,
            context: None,
        },
        sessions_dir: SessionsDir::fixed(None),
        session_path: None,
        session,
    })
}

/// Runs the app's disk effects as the runner does (saves, exports, session listing and
/// loading), handing the answers back; the other effects are returned.
pub fn settle(app: &mut App) -> Vec<Effect> {
    let mut rest = vec![];
    loop {
        let effects = app.take_effects();
        if effects.is_empty() {
            return rest;
        }
        for e in effects {
            match deltascope::tui::runner::disk_io(e) {
                Ok(answer) => {
                    let now = app.now_ms();
                    app.update(answer, now)
                }
                Err(other) => rest.push(other),
            }
        }
    }
}

pub fn key(app: &mut App, code: KeyCode, m: KeyModifiers, t: f64) {
    app.update(Inbound::Term(Event::Key(KeyEvent::new(code, m))), t);
}

pub fn type_text(app: &mut App, s: &str, t: f64) {
    for c in s.chars() {
        key(app, KeyCode::Char(c), KeyModifiers::NONE, t);
    }
}

/// Types a prompt and sends it.
pub fn ask(app: &mut App, s: &str, t: f64) {
    type_text(app, s, t);
    key(app, KeyCode::Enter, KeyModifiers::NONE, t);
}

pub fn engine(app: &mut App, e: EngineEvent, t: f64) {
    app.update(Inbound::Engine(e), t);
}

pub fn start(prompt_tokens: usize, p: &GenerationParams) -> EngineEvent {
    EngineEvent::Start(StartEvent {
        model: "embedded:demo".into(),
        prompt_tokens: Some(prompt_tokens),
        phase: Phase::Thinking,
        params: p.clone(),
        server: None,
        numerics: None,
    })
}

pub fn token(index: usize, phase: Phase, text: &str, logprob: f32, draft: DraftKind, forced: bool) -> EngineEvent {
    EngineEvent::Token(TokenEvent {
        index,
        phase,
        id: Some(100 + (index as u32 % 300)),
        text: text.into(),
        logprob: Some(logprob),
        draft: Some(draft),
        forced,
        top_logprobs: vec![
            Alternative { id: Some(100 + (index as u32 % 300)), logprob, text: text.into() },
            Alternative { id: Some(7), logprob: logprob - 2.5, text: " the".into() },
            Alternative { id: Some(9), logprob: logprob - 3.75, text: "3".into() },
        ],
        // Scripted: a sharp distribution has a low entropy.
        entropy: (!forced).then(|| (-logprob).max(0.0) * 2.0 + 0.05),
    })
}

pub fn memory(kv: usize) -> Memory {
    Memory { weights_bytes: 16_142_336, kv_bytes: kv, recurrent_bytes: 98_304, snapshot_bytes: 24_576, devices: vec![] }
}

pub fn mtp(steps: usize) -> MtpStats {
    let mut m = MtpStats::new(2);
    for i in 0..steps {
        let acc = [2, 1, 2, 0, 2][i % 5];
        m.record(2, acc, acc + 1);
    }
    m
}

pub fn stats(generated: usize, thinking: usize, answer: usize, tok_s: f64, steps: usize) -> EngineEvent {
    EngineEvent::Stats(StatsEvent {
        generated,
        thinking_tokens: thinking,
        answer_tokens: answer,
        counted: CountSource::Engine,
        tok_s,
        memory: Some(memory(4096 * (24 + generated))),
        server_memory: None,
        mtp: Some(mtp(steps)),
    })
}

pub fn done(reason: FinishReason, prompt: usize, thinking: usize, answer: usize, tt: &str, at: &str) -> EngineEvent {
    EngineEvent::Done(DoneEvent {
        finish_reason: reason,
        usage: Usage {
            prompt_estimate: None,
            prompt_tokens: prompt,
            thinking_tokens: thinking,
            answer_tokens: answer,
            completion_tokens: thinking + answer,
            forced_tokens: 0,
            counted: CountSource::Engine,
            estimate: None,
        },
        timing: Timing { ttft_ms: Some(14.0), prefill_tok_s: 1143.0, decode_tok_s: 612.5, total_ms: 120.0 },
        mtp: Some(mtp(thinking / 2)),
        memory: Some(memory(4096 * (24 + thinking + answer))),
        server_memory: None,
        thinking: tt.into(),
        answer: at.into(),
    })
}

pub const THINKING: &str = "Check divisors of 91 up to 9.\n91 / 2 = 45 r 1\n91 / 3 = 30 r 1\n91 / 5 = 18 r 1\n91 / 7 = 13 r 0\n7 divides 91.\n";
pub const ANSWER: &str = "No, **91 = 7 × 13**, so 91 is not prime.\n\n```python\nprint(7 * 13)\n```\n";

/// Streams a whole healthy turn: thinking, `</think>`, a markdown answer, stats, done.
pub fn healthy_turn(app: &mut App, finish: bool) {
    let p = params(256, None);
    ask(app, "Is 91 prime?", 0.0);
    engine(app, start(16, &p), 2.0);
    let mut t = 14.0;
    let mut i = 0;
    for piece in THINKING.split_inclusive([' ', '\n']) {
        let draft = [DraftKind::None, DraftKind::Accepted, DraftKind::Bonus][i % 3];
        engine(app, token(i, Phase::Thinking, piece, -0.05 * (i % 7) as f32, draft, false), t);
        i += 1;
        t += 1.6;
        if i % 8 == 0 {
            engine(app, stats(i, i, 0, 600.0 + i as f64, i / 2), t);
        }
    }
    engine(app, token(i, Phase::Thinking, "</think>", -0.01, DraftKind::None, false), t);
    i += 1;
    let thinking_n = i;
    engine(app, token(i, Phase::Answer, "\n\n", -0.01, DraftKind::None, false), t);
    i += 1;
    if !finish {
        return;
    }
    for piece in ANSWER.split_inclusive([' ', '\n']) {
        engine(app, token(i, Phase::Answer, piece, -0.3, DraftKind::Accepted, false), t);
        i += 1;
        t += 1.6;
    }
    engine(app, done(FinishReason::Stop, 16, thinking_n, i - thinking_n, THINKING, ANSWER), t);
}

pub fn terminal(w: u16, h: u16) -> Terminal<TestBackend> {
    Terminal::new(TestBackend::new(w, h)).expect("test backend")
}

/// Draws one frame as the runner does (handing the layout back to the app) and returns it as text.
pub fn render(app: &mut App, w: u16, h: u16) -> String {
    let mut term = terminal(w, h);
    let mut layout = Default::default();
    term.draw(|f| layout = deltascope::tui::view::View::default().draw(app, f)).expect("draw");
    app.laid_out(layout);
    format!("{}", term.backend())
}

/// A scripted state event: `layers` GDN layers (decoder layers 0, 1, 2, then 4, 5, … with an
/// attention layer every fourth) of `heads` value heads, values varying with pass, layer and
/// head; head 0 of the first layer forgets within two tokens, head 1 keeps past 1000.
pub fn state_event(at_token: Option<usize>, layers: usize, heads: usize) -> EngineEvent {
    use deltascope_protocol::{AttentionLayerState, GdnLayerState, StateEvent};
    let pass = at_token.map_or(0, |a| a + 1);
    let decoder = |i: usize| i + i / 3;
    let gdn = (0..layers)
        .map(|li| {
            let wave = |h: usize, k: usize| ((pass * 7 + li * 5 + h * 3 + k) % 11) as f32 / 10.0;
            let g: Vec<f32> = (0..heads)
                .map(|h| match (li, h) {
                    (0, 0) => -2.0,
                    (0, 1) => -1e-4,
                    _ => -0.01 - wave(h, 1),
                })
                .collect();
            GdnLayerState {
                layer: decoder(li),
                beta: (0..heads).map(|h| wave(h, 0)).collect(),
                retention: g.iter().map(|x| x.exp()).collect(),
                g,
                state_norm: (0..heads).map(|h| 0.5 + 3.0 * wave(h, 2)).collect(),
                delta_ratio: (0..heads).map(|h| wave(h, 3) / 2.0).collect(),
                nonfinite: vec![0; heads],
                g_slack: vec![],
                beta_slack: vec![],
            }
        })
        .collect();
    let attention = (0..layers / 3)
        .map(|i| AttentionLayerState { layer: 4 * i + 3, kv_len: 16 + pass, kv_bytes: 768 * (16 + pass) })
        .collect();
    EngineEvent::State(StateEvent {
        at_token,
        tokens: if at_token.is_none() { 16 } else { 1 },
        position: 16 + pass,
        gdn,
        attention,
    })
}

/// A traced turn on a model of `layers` GDN layers × `heads` heads: the prompt's state, then a
/// token and the state after reading it, for every piece of THINKING and ANSWER (the last
/// token is sampled but not read, as in the engine); done.
pub fn traced_turn(app: &mut App, layers: usize, heads: usize) {
    let mut p = params(256, None);
    p.trace_state = true;
    ask(app, "Is 91 prime?", 0.0);
    engine(app, start(16, &p), 2.0);
    engine(app, state_event(None, layers, heads), 3.0);
    let mut t = 14.0;
    let pieces: Vec<(Phase, &str)> = THINKING
        .split_inclusive([' ', '\n'])
        .map(|s| (Phase::Thinking, s))
        .chain([(Phase::Thinking, "</think>"), (Phase::Answer, "\n\n")])
        .chain(ANSWER.split_inclusive([' ', '\n']).map(|s| (Phase::Answer, s)))
        .collect();
    let thinking_n = pieces.iter().filter(|p| p.0 == Phase::Thinking).count();
    for (i, (phase, text)) in pieces.iter().enumerate() {
        engine(app, token(i, *phase, text, -0.1, DraftKind::None, false), t);
        if i + 1 < pieces.len() {
            engine(app, state_event(Some(i), layers, heads), t + 0.5);
        }
        t += 1.6;
    }
    engine(app, done(FinishReason::Stop, 16, thinking_n, pieces.len() - thinking_n, THINKING, ANSWER), t);
}
