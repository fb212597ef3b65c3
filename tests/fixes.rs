//! Fixes that fix: the advice for an answer starved by max_tokens accounts for the tokens a
//! thinking budget forces (bridge text and `</think>`: 52 on the demo tokenizer), the
//! TUI's F3 / F4 apply exactly that advice (and nothing before there is a turn to fix), and the
//! forced tokens are counted apart from thinking and answer. On the demo model.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use deltascope::backend::local::{LocalBackend, LocalSpec};
use deltascope::backend::{Backend, ChatMessage, ChatRequest, OpenProgress, Prompt, Role};
use deltascope::session::Session;
use deltascope::tui::app::{App, AppConfig, Effect, SessionsDir};
use deltascope::tui::keymap::Keymap;
use deltascope::tui::sliders::Settings;
use deltascope::tui::theme::Theme;
use deltascope_protocol::{DiagnosticKind, EngineEvent, FinishReason};
use ratatui::crossterm::event::{KeyCode, KeyModifiers};

fn demo() -> LocalBackend {
    LocalBackend::open(&LocalSpec::new(None, "f32").unwrap(), &|_: OpenProgress| {}).unwrap()
}

/// The app on a session file, with the demo model's description.
fn app_on(session: Session, backend: &LocalBackend) -> App {
    let mut app = App::new(AppConfig {
        theme: Theme::default(),
        keymap: Keymap::default(),
        settings: Settings {
            params: session.turns.last().map(|t| t.params.clone()).unwrap_or_else(|| params(256, None)),
            resume_thinking: deltascope_protocol::Thinking::Unlimited,
            preset: None,
            mtp: deltascope::backend::Support::Yes,
            context: backend.info().context,
        },
        sessions_dir: SessionsDir::fixed(None),
        session_path: None,
        session,
    });
    app.set_model(backend.info().clone());
    app
}

/// The request the app's last `Generate` effect would send.
fn generate_request(effects: Vec<Effect>) -> Option<ChatRequest> {
    effects.into_iter().rev().find_map(|e| match e {
        Effect::Generate { prompt, params } => Some(ChatRequest { prompt, params: *params }),
        _ => None,
    })
}

#[test]
fn f4_on_the_shipped_starved_session_produces_an_answer() {
    let backend = demo();
    let session =
        Session::load(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/sessions/starved-by-max-tokens.json"))).unwrap();
    let before = session.turns[0].clone();
    assert_eq!(before.params.max_tokens, 24);
    assert!(before.answer.is_empty());
    let mut app = app_on(session, &backend);
    app.take_effects();
    key(&mut app, KeyCode::F(4), KeyModifiers::NONE, 1.0);
    let req = generate_request(app.take_effects()).expect("F4 re-runs the turn");
    // The forced end of thinking alone (52 tokens) does not fit in max_tokens 24: F4 raises it.
    let budget = req.params.thinking.budget().expect("F4 sets a thinking budget");
    assert!(budget < 24, "budget {budget}");
    assert!(req.params.max_tokens >= budget + 52 + 32, "max_tokens {} for budget {budget}", req.params.max_tokens);
    // The old, starved turn stays in the session file.
    assert_eq!(app.session().branches.len(), 1);
    assert_eq!(app.session().branches[0].turns[0], before);

    let generation = backend.start(req).unwrap();
    let mut forced_diag = false;
    let end = generation.for_each(|ev| {
        if let EngineEvent::Diagnostic(d) = ev {
            assert_ne!(d.kind, DiagnosticKind::ThinkingExhaustedMaxTokens, "{}", d.message);
            forced_diag |= d.kind == DiagnosticKind::ThinkingBudgetForced;
        }
    });
    let EngineEvent::Done(d) = end else { panic!("{end:?}") };
    assert!(forced_diag, "the budget forced the end of thinking");
    assert_eq!(d.finish_reason, FinishReason::Stop, "{d:?}");
    assert!(d.answer.contains("199"), "an answer: {:?}", d.answer);
    // Counted apart: thinking is what the model generated, up to the budget.
    assert_eq!(d.usage.thinking_tokens, budget);
    assert_eq!(d.usage.forced_tokens, 52, "the bridge's 51 tokens and </think>");
    assert_eq!(d.usage.completion_tokens, d.usage.thinking_tokens + d.usage.forced_tokens + d.usage.answer_tokens);
}

#[test]
fn f3_and_f4_before_any_turn_change_nothing() {
    let backend = demo();
    let mut app = app_on(Session::new("embedded:demo", None), &backend);
    let settings = app.settings().clone();
    for k in [3, 4] {
        key(&mut app, KeyCode::F(k), KeyModifiers::NONE, 1.0);
        assert!(generate_request(app.take_effects()).is_none(), "F{k} started a generation");
        assert_eq!(*app.settings(), settings, "F{k} changed the settings");
        assert!(app.messages().items.last().unwrap().text.contains("nothing to fix"));
    }
    // A turn with nothing to fix: nothing either.
    healthy_turn(&mut app, true);
    app.take_effects();
    key(&mut app, KeyCode::F(4), KeyModifiers::NONE, 2.0);
    assert!(generate_request(app.take_effects()).is_none());
    assert_eq!(*app.settings(), settings);
}

#[test]
fn f4_never_offers_the_current_budget_again() {
    let backend = demo();
    let ask = |max_tokens: usize, budget: Option<usize>| {
        let mut p = params(max_tokens, budget);
        p.sampling.temperature = 0.0;
        let prompt = Prompt::Chat(vec![ChatMessage::new(Role::User, "Is 199 prime?")]);
        let mut session = Session::new("embedded:demo", None);
        let mut turn = deltascope::session::Turn::new("Is 199 prime?", p.clone());
        let t0 = std::time::Instant::now();
        backend
            .start(ChatRequest { prompt, params: p })
            .unwrap()
            .for_each(|ev| turn.apply(ev, t0.elapsed().as_secs_f64() * 1e3));
        session.turns.push(turn);
        session
    };
    // A budget of 40 in max_tokens 80: the 52 forced tokens cannot fit, the answer is empty.
    let session = ask(80, Some(40));
    let t = &session.turns[0];
    assert!(t.answer.is_empty(), "{:?}", t.answer);
    let d = t.diagnostics.iter().find(|d| d.kind == DiagnosticKind::ThinkingExhaustedMaxTokens).unwrap();
    let fix = d.fix.unwrap().thinking_budget.unwrap();
    assert!(fix.thinking_budget < 40, "{fix:?}");
    assert!(fix.max_tokens > fix.thinking_budget + 52, "{fix:?}");
    let mut app = app_on(session, &backend);
    key(&mut app, KeyCode::F(4), KeyModifiers::NONE, 1.0);
    let req = generate_request(app.take_effects()).unwrap();
    assert_eq!((req.params.thinking.budget(), req.params.max_tokens), (Some(fix.thinking_budget), fix.max_tokens));
}

#[test]
fn the_headless_suggestion_is_flags_that_work() {
    let bin = env!("CARGO_BIN_EXE_deltascope");
    let out = Command::new(bin).args(["run", "--prompt", "Is 199 prime?", "--max-tokens", "24"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("[thinking_exhausted_max_tokens]"), "{err}");
    let line = err.lines().find(|l| l.starts_with("fix: ")).unwrap_or_else(|| panic!("no fix line: {err}"));
    // "fix: --max-tokens 536, or --thinking-budget 12 --max-tokens 97"
    let budget_flags: Vec<&str> = line.split(", or ").nth(1).unwrap().split_whitespace().collect();
    assert_eq!(budget_flags[0], "--thinking-budget", "{line}");
    let mut args = vec!["run", "--prompt", "Is 199 prime?"];
    args.extend(&budget_flags);
    let out = Command::new(bin).args(&args).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(!err.contains("thinking_exhausted"), "{err}");
    assert!(err.contains("finish: stop") && err.contains("forced 52"), "{err}");
    assert!(answer.contains("199"), "answer {answer:?}, {err}");
}
