//! Every view of the workbench, drawn through ratatui's TestBackend from scripted engine event
//! streams and compared with committed insta snapshots (timings are filtered).

mod common;

use common::*;
use deltascope::session::Session;
use deltascope::tui::app::{EditTarget, Effect, Focus, Overlay};
use deltascope::tui::event::Inbound;
use deltascope_protocol::{DiagnosticKind, DraftKind, EngineEvent, FinishReason, Phase, Thinking};
use ratatui::crossterm::event::{KeyCode, KeyModifiers};

const W: u16 = 160;
const H: u16 = 46;

fn snap(name: &str, screen: String) {
    insta::with_settings!({
        filters => vec![
            (r"\d+(\.\d+)? tok/s", "[RATE] tok/s"),
            // Durations: "340 ms" below a second, else "2.4 s".
            (r"TTFT (\d+ ms|\d+\.\d s)", "TTFT [DUR]"),
            (r"· (\d+ ms|\d+\.\d s)", "· [DUR]"),
        ],
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, screen);
    });
}

#[test]
fn welcome() {
    let mut app = app();
    snap("welcome", render(&mut app, W, H));
}

#[test]
fn loading_progress() {
    let mut app = unopened_app();
    let what = "weights of demo: 9.06 MiB of 23.84 MiB".to_string();
    app.update(Inbound::LoadProgress { done: 9_500_000, total: 25_000_000, what }, 0.0);
    snap("loading", render(&mut app, 100, 24));
}

#[test]
fn streaming_thinking() {
    let mut app = app();
    healthy_turn(&mut app, false);
    assert_eq!(app.state_label(), "answering");
    snap("streaming", render(&mut app, W, H));
}

#[test]
fn healthy_run_with_markdown_answer_and_gauges() {
    let mut app = app();
    healthy_turn(&mut app, true);
    assert_eq!(app.state_label(), "done");
    let screen = render(&mut app, W, H);
    // Both panes, the gauges and the finish reason are on screen.
    assert!(screen.contains("91 / 7 = 13 r 0"), "{screen}");
    assert!(screen.contains("91 = 7 × 13"), "{screen}");
    assert!(screen.contains("Token budget"), "{screen}");
    assert!(screen.contains("finish: stop"), "{screen}");
    snap("healthy", screen);
}

#[test]
fn memory_gauge_shows_each_device_of_a_layer_split() {
    use deltascope_protocol::{DeviceMemory, EngineEvent as E};
    let mut app = app();
    healthy_turn(&mut app, false);
    let mut done = done(FinishReason::Stop, 16, 10, 10, THINKING, ANSWER);
    if let E::Done(d) = &mut done {
        let m = d.memory.as_mut().expect("the scripted turn reports memory");
        m.devices = vec![
            DeviceMemory {
                device: "cuda:0".into(),
                weights_bytes: 8_000_000,
                kv_bytes: 40_960,
                recurrent_bytes: 49_152,
            },
            DeviceMemory {
                device: "cuda:1".into(),
                weights_bytes: 8_142_336,
                kv_bytes: 40_960,
                recurrent_bytes: 49_152,
            },
        ];
    }
    engine(&mut app, done, 300.0);
    let screen = render(&mut app, W, H);
    let line = |dev: &str| screen.lines().find(|l| l.contains(dev)).map(str::to_string);
    let (a, b) = (line("cuda:0 ").expect("a cuda:0 row"), line("cuda:1 ").expect("a cuda:1 row"));
    // Each device's row gives its own total: weights + KV + recurrent state.
    assert!(a.contains("7.7 MiB"), "{a}");
    assert!(b.contains("7.9 MiB"), "{b}");
}

#[test]
fn narrow_terminal_stacks_the_panes() {
    let mut app = app();
    healthy_turn(&mut app, true);
    snap("narrow", render(&mut app, 80, 34));
}

#[test]
fn tiny_terminal_gets_a_message() {
    let mut app = app();
    snap("tiny", render(&mut app, 40, 10));
}

#[test]
fn thinking_ate_max_tokens_banner_and_fixes() {
    let mut app = app();
    app.change_settings(|s| s.params.max_tokens = 16);
    let p = params(16, None);
    ask(&mut app, "Is 199 prime?", 0.0);
    engine(&mut app, start(16, &p), 1.0);
    for i in 0..16 {
        engine(&mut app, token(i, Phase::Thinking, "199 / 3 ", -0.1, DraftKind::None, false), 2.0 + i as f64);
    }
    engine(
        &mut app,
        diag(
            DiagnosticKind::ThinkingExhaustedMaxTokens,
            15,
            "max_tokens ran out while thinking: raise --max-tokens or set --thinking-budget",
            None,
        ),
        18.0,
    );
    engine(&mut app, done(FinishReason::Length, 16, 16, 0, "199 / 3 ", ""), 18.0);
    // A diagnostic without fixes (a file from an older build): worked out from the turn's
    // settings, the forced end of thinking estimated from the bridge text (55 tokens).
    let screen = render(&mut app, W, H);
    assert!(
        screen.contains("max_tokens → 528") && screen.contains("budget → 8, max_tokens → 95 (≈55 forced, ≈32 answer)"),
        "{screen}"
    );
    snap("exhausted", screen);
    // F3 raises max_tokens and re-runs the prompt in place; the starved turn is kept aside.
    key(&mut app, KeyCode::F(3), KeyModifiers::NONE, 20.0);
    assert_eq!(app.settings().params.max_tokens, 528);
    let effects = app.take_effects();
    assert!(matches!(effects.last(), Some(Effect::Generate { params, .. }) if params.max_tokens == 528), "{effects:?}");
    assert_eq!(app.session().turns.len(), 1);
    assert_eq!(app.session().branches[0].reason, "regenerated");
    engine(&mut app, done(FinishReason::Cancelled, 16, 0, 0, "", ""), 21.0);
    // The re-run (cancelled) has nothing to fix: F4 changes nothing.
    key(&mut app, KeyCode::F(4), KeyModifiers::NONE, 22.0);
    assert_eq!(app.settings().params.thinking, Thinking::Unlimited);
    assert!(app.take_effects().iter().all(|e| !matches!(e, Effect::Generate { .. })));
}

#[test]
fn loop_banner_highlights_the_loop() {
    let mut app = app();
    let p = params(256, None);
    ask(&mut app, "2 + 2", 0.0);
    engine(&mut app, start(12, &p), 1.0);
    for i in 0..8 {
        engine(&mut app, token(i, Phase::Thinking, "Let me think. ", -0.2, DraftKind::None, false), 2.0 + i as f64);
    }
    for i in 8..60 {
        let piece = ["2 + 2", " = 2.", "2"][i % 3];
        engine(&mut app, token(i, Phase::Thinking, piece, -0.01, DraftKind::None, false), 2.0 + i as f64);
    }
    engine(
        &mut app,
        diag(DiagnosticKind::DegenerateLoop, 59, "a 3-token pattern repeated 17 times", Some((3, 9))),
        62.0,
    );
    engine(&mut app, done(FinishReason::Length, 12, 60, 0, "", ""), 63.0);
    let screen = render(&mut app, W, H);
    assert!(screen.contains("LOOP DETECTED"), "{screen}");
    snap("loop", screen);
}

/// While a loop runs in thinking the banner offers the rescue key; the key asks the generation
/// to end thinking; the rescue's own banner and the gauge's ↻ follow the `loop_rescued`
/// diagnostic.
#[test]
fn loop_banner_offers_the_rescue_while_thinking() {
    let mut app = app();
    let p = params(256, None);
    ask(&mut app, "2 + 2", 0.0);
    engine(&mut app, start(12, &p), 1.0);
    for i in 0..60 {
        let piece = ["2 + 2", " = 2.", "2"][i % 3];
        engine(&mut app, token(i, Phase::Thinking, piece, -0.01, DraftKind::None, false), 2.0 + i as f64);
    }
    engine(&mut app, diag(DiagnosticKind::DegenerateLoop, 59, "a 3-token pattern repeats", Some((3, 0))), 62.0);
    let screen = render(&mut app, W, H);
    assert!(screen.contains("[Alt+E] end thinking now"), "{screen}");
    app.take_effects();
    key(&mut app, KeyCode::Char('e'), KeyModifiers::ALT, 63.0);
    assert!(app.take_effects().iter().any(|e| matches!(e, Effect::EndThinking)), "the key ends thinking");
    engine(
        &mut app,
        diag(DiagnosticKind::LoopRescued, 60, "loop rescued (on the user's request): a 3-token pattern", Some((3, 0))),
        64.0,
    );
    engine(&mut app, token(60, Phase::Thinking, "Considering the limited time…", 0.0, DraftKind::None, true), 64.0);
    engine(&mut app, token(61, Phase::Thinking, "</think>", 0.0, DraftKind::None, true), 64.0);
    engine(&mut app, token(62, Phase::Answer, "4", -0.1, DraftKind::None, false), 65.0);
    let screen = render(&mut app, W, H);
    assert!(screen.contains("LOOP RESCUED"), "{screen}");
    assert!(!screen.contains("end thinking now"), "no rescue offered once rescued and answering: {screen}");
    assert!(screen.contains("loop from token 0 rescued"), "the gauge shows the rescue: {screen}");
    // Outside thinking the key says so and asks nothing.
    key(&mut app, KeyCode::Char('e'), KeyModifiers::ALT, 66.0);
    assert!(app.take_effects().iter().all(|e| !matches!(e, Effect::EndThinking)));
}

/// A turn whose thinking budget (8) ran out: 8 thinking tokens, 2 forced (the bridge and
/// `</think>`), a one-token answer, streamed but not done.
fn stream_forced_turn(app: &mut deltascope::tui::app::App) {
    app.change_settings(|s| s.params.thinking = Thinking::from_budget(Some(8)));
    let p = params(256, Some(8));
    ask(app, "Is 97 prime?", 0.0);
    engine(app, start(16, &p), 1.0);
    for i in 0..8 {
        engine(app, token(i, Phase::Thinking, "97 / 2 ", -0.1, DraftKind::None, false), 2.0 + i as f64);
    }
    engine(app, diag(DiagnosticKind::ThinkingBudgetForced, 8, "thinking budget of 8 tokens spent", None), 10.0);
    engine(app, token(8, Phase::Thinking, "Considering the limited time…", 0.0, DraftKind::None, true), 10.0);
    engine(app, token(9, Phase::Thinking, "</think>", 0.0, DraftKind::None, true), 10.0);
    engine(app, token(10, Phase::Answer, "97 is prime.", -0.2, DraftKind::None, false), 11.0);
}

/// The end of [`stream_forced_turn`]: two forced tokens, counted exactly (`estimate: None`)
/// or estimated for the reason given.
fn forced_done(estimate: Option<&str>) -> EngineEvent {
    let mut end = done(FinishReason::Stop, 16, 8, 1, "", "97 is prime.");
    if let EngineEvent::Done(d) = &mut end {
        d.usage.forced_tokens = 2;
        d.usage.completion_tokens = 11;
        d.usage.estimate = estimate.map(str::to_string);
    }
    end
}

#[test]
fn forced_end_of_thinking_banner() {
    let mut app = app();
    stream_forced_turn(&mut app);
    // While streaming the forced tokens are counted apart from the thinking.
    let screen = render(&mut app, W, H);
    assert!(screen.contains("Thinking · 8 tok + 2 forced"), "{screen}");
    engine(&mut app, forced_done(None), 12.0);
    let screen = render(&mut app, W, H);
    assert!(screen.contains("Thinking · 8 tok + 2 forced"), "{screen}");
    assert!(screen.contains("think 8 ") && screen.contains("forced 2") && screen.contains("answer 1 "), "{screen}");
    assert!(screen.contains("11/256 max_tokens"), "{screen}");
    // Counted by the engine: exact, so no "≈" and no reason.
    assert!(!screen.contains("forced ≈") && !screen.contains("≈forced"), "{screen}");
    snap("forced", screen);
}

/// A server that does not say which tokens its thinking budget forced: the gauge marks the
/// forced count "≈" and says why under the legend (the narrow strip marks it too).
#[test]
fn an_estimated_forced_count_is_marked_and_explained() {
    let why =
        "llama.cpp does not say which tokens its thinking budget forced: counted as the `</think>` that ended thinking";
    let mut app = app();
    stream_forced_turn(&mut app);
    engine(&mut app, forced_done(Some(why)), 12.0);
    assert_eq!(app.shown().and_then(|t| t.forced_estimate()), Some(why));
    let screen = render(&mut app, W, H);
    assert!(screen.contains("▓forced ≈2"), "{screen}");
    assert!(screen.contains("≈forced: llama.cpp does not say which"), "{screen}");
    assert!(screen.contains("history ≈"), "the context line is still there: {screen}");
    snap("forced_estimate", screen);
    assert!(render(&mut app, 100, 30).contains("· forced ≈2 ·"), "the narrow strip");
}

#[test]
fn token_inspector_and_colour_modes() {
    let mut app = app();
    healthy_turn(&mut app, true);
    key(&mut app, KeyCode::Char('g'), KeyModifiers::CONTROL, 200.0);
    assert!(app.view().inspector.is_some());
    for _ in 0..12 {
        key(&mut app, KeyCode::Left, KeyModifiers::NONE, 200.0);
    }
    let screen = render(&mut app, W, H);
    // The scripted token: logprob -0.3 (entropy 0.65 nats), the runner-up 2.5 below it.
    assert!(screen.contains("entropy   0.6500 nats (0.9378 bits)"), "{screen}");
    assert!(screen.contains("margin    top-1 − top-2 = 2.5000 (p 0.741 vs 0.061)"), "{screen}");
    snap("inspector", screen);
    key(&mut app, KeyCode::Char('g'), KeyModifiers::CONTROL, 200.0);
    key(&mut app, KeyCode::Char('l'), KeyModifiers::CONTROL, 200.0);
    key(&mut app, KeyCode::Char('l'), KeyModifiers::CONTROL, 200.0);
    snap("provenance", render(&mut app, W, H));
}

#[test]
fn sliders_change_the_next_generation() {
    let mut app = app();
    key(&mut app, KeyCode::Tab, KeyModifiers::NONE, 0.0);
    assert_eq!(app.view().focus, Focus::Sliders);
    key(&mut app, KeyCode::Right, KeyModifiers::NONE, 0.0); // max_tokens 256 → 384
    key(&mut app, KeyCode::Down, KeyModifiers::NONE, 0.0);
    key(&mut app, KeyCode::Left, KeyModifiers::NONE, 0.0); // budget unlimited → 16384
    key(&mut app, KeyCode::Down, KeyModifiers::NONE, 0.0);
    key(&mut app, KeyCode::Right, KeyModifiers::NONE, 0.0); // temperature 0 → 0.05
    snap("sliders", render(&mut app, W, H));
    snap("sliders_narrow", render(&mut app, 90, 32));
    key(&mut app, KeyCode::Tab, KeyModifiers::NONE, 0.0);
    key(&mut app, KeyCode::Tab, KeyModifiers::NONE, 0.0);
    key(&mut app, KeyCode::Tab, KeyModifiers::NONE, 0.0);
    assert_eq!(app.view().focus, Focus::Input);
    ask(&mut app, "Is 7 prime?", 1.0);
    let effects = app.take_effects();
    let Some(Effect::Generate { params, .. }) = effects.last() else { panic!("{effects:?}") };
    assert_eq!(params.max_tokens, 384);
    assert_eq!(params.thinking.budget(), Some(16384));
    assert_eq!(params.sampling.temperature, 0.05);
    assert_eq!(params.top_logprobs, 5);
    assert!(params.thinking.is_on());
}

#[test]
fn compare_runs_side_by_side() {
    let mut app = app();
    healthy_turn(&mut app, true);
    app.take_effects();
    app.change_settings(|s| s.params.max_tokens = 64);
    app.change_settings(|s| s.params.sampling.temperature = 0.7);
    key(&mut app, KeyCode::Char('o'), KeyModifiers::CONTROL, 300.0);
    let effects = app.take_effects();
    assert!(matches!(effects.last(), Some(Effect::Generate { params, .. }) if params.max_tokens == 64));
    assert!(app.view().show_compare);
    assert_eq!(app.compare_pair(), Some((0, 1)));
    let p = params(64, None);
    engine(&mut app, start(16, &p), 301.0);
    for (i, piece) in ["91 / 7 = 13", "</think>"].iter().enumerate() {
        engine(&mut app, token(i, Phase::Thinking, piece, -0.1, DraftKind::None, false), 302.0 + i as f64);
    }
    engine(&mut app, token(2, Phase::Answer, "91 is not prime.", -0.1, DraftKind::None, false), 305.0);
    engine(&mut app, done(FinishReason::Stop, 16, 2, 1, "91 / 7 = 13", "91 is not prime."), 306.0);
    snap("compare", render(&mut app, W, H));
    // The State view and the comparison take the panes' place one at a time.
    key(&mut app, KeyCode::F(7), KeyModifiers::NONE, 307.0);
    assert!(app.view().state.shown && !app.view().show_compare);
    key(&mut app, KeyCode::Char('c'), KeyModifiers::ALT, 308.0);
    assert!(!app.view().state.shown && app.view().show_compare);
    assert_eq!(app.view().focus, Focus::Input);
    assert!(render(&mut app, W, H).contains("B · turn 2 (re-run)"));
}

#[test]
fn cancel_keeps_output_and_step_mode_sends_steps() {
    let mut app = app();
    healthy_turn(&mut app, false);
    key(&mut app, KeyCode::Esc, KeyModifiers::NONE, 100.0);
    assert_eq!(app.take_effects().last(), Some(&Effect::Cancel));
    engine(&mut app, done(FinishReason::Cancelled, 16, 20, 1, THINKING, ""), 101.0);
    assert!(!app.generating());
    assert_eq!(app.shown().unwrap().finish_reason, Some(FinishReason::Cancelled));
    assert!(app.shown().unwrap().thinking_tokens() > 0);
    // The cancelled turn is saved like any other.
    let effects = app.take_effects();
    assert!(matches!(&effects[..], [Effect::Save { session, .. }] if session.turns.len() == 1), "{effects:?}");
    key(&mut app, KeyCode::Char('s'), KeyModifiers::CONTROL, 102.0);
    key(&mut app, KeyCode::Char('n'), KeyModifiers::CONTROL, 102.0);
    assert_eq!(app.take_effects(), vec![Effect::SetPaused(true), Effect::Step]);
    // Ctrl+C when idle quits; this app has no sessions directory, so it asks first.
    key(&mut app, KeyCode::Char('c'), KeyModifiers::CONTROL, 103.0);
    settle(&mut app);
    assert_eq!(app.overlay().name(), "confirm-quit");
    key(&mut app, KeyCode::Char('q'), KeyModifiers::NONE, 103.0);
    assert!(app.quitting());
}

#[test]
fn edit_last_prompt_and_history_recall() {
    let mut app = app();
    healthy_turn(&mut app, true);
    key(&mut app, KeyCode::Char('e'), KeyModifiers::CONTROL, 200.0);
    assert_eq!(app.composer().target, EditTarget::Turn(0));
    assert_eq!(app.composer().input.lines(), ["Is 91 prime?"]);
    key(&mut app, KeyCode::Backspace, KeyModifiers::NONE, 200.0);
    type_text(&mut app, " at all?", 200.0);
    key(&mut app, KeyCode::Enter, KeyModifiers::ALT, 200.0);
    assert_eq!(app.composer().input.lines().len(), 2, "Alt+Enter adds a line");
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 200.0);
    assert_eq!(app.session().turns.len(), 1, "the edited prompt replaced the last turn");
    assert_eq!(app.session().turns[0].user, "Is 91 prime at all?\n");
    engine(&mut app, done(FinishReason::Stop, 16, 0, 0, "", ""), 201.0);
    key(&mut app, KeyCode::Up, KeyModifiers::NONE, 202.0);
    assert_eq!(app.composer().input.lines(), ["Is 91 prime at all?", ""]);
}

#[test]
fn collapse_and_hide_thinking() {
    let mut app = app();
    healthy_turn(&mut app, true);
    key(&mut app, KeyCode::Char('t'), KeyModifiers::ALT, 200.0);
    snap("thinking_collapsed", render(&mut app, W, H));
    key(&mut app, KeyCode::Char('t'), KeyModifiers::ALT, 200.0);
    let screen = render(&mut app, W, H);
    assert!(!screen.contains(" Thinking "), "{screen}");
}

#[test]
fn help_lists_every_key() {
    let mut app = app();
    key(&mut app, KeyCode::F(1), KeyModifiers::NONE, 0.0);
    assert_eq!(app.overlay().name(), Overlay::Help.name());
    let screen = render(&mut app, W, H);
    for a in deltascope::tui::keymap::Action::ALL {
        assert!(screen.contains(&a.name()), "{} missing from help", a.name());
        assert!(screen.contains(a.describe()), "{}: description cut in help", a.name());
    }
    snap("help", screen);

    // On a short terminal it scrolls: every key can still be read, down to the last line.
    let small = render(&mut app, 100, 24);
    assert!(small.contains("↑↓ scroll (1–22 of"), "{small}");
    assert!(!small.contains("closes this help"));
    for _ in 0..60 {
        key(&mut app, KeyCode::Down, KeyModifiers::NONE, 0.0);
    }
    assert_eq!(app.overlay().name(), Overlay::Help.name());
    let bottom = render(&mut app, 100, 24);
    assert!(bottom.contains("closes this help") && bottom.contains("quit"), "{bottom}");
    // Scrolling past the end stops there: one ↑ moves up at once.
    key(&mut app, KeyCode::Up, KeyModifiers::NONE, 0.0);
    assert!(!render(&mut app, 100, 24).contains("closes this help"));
    key(&mut app, KeyCode::Char('x'), KeyModifiers::NONE, 0.0);
    assert_eq!(app.overlay().name(), Overlay::None.name());

    // `?` opens it from an empty prompt, and is a character while a prompt is typed.
    let mut empty = common::app();
    key(&mut empty, KeyCode::Char('?'), KeyModifiers::SHIFT, 0.0);
    assert_eq!(empty.overlay().name(), Overlay::Help.name());
    let mut typing = app_with_text("Why");
    key(&mut typing, KeyCode::Char('?'), KeyModifiers::SHIFT, 0.0);
    assert_eq!(typing.overlay().name(), Overlay::None.name());
    assert_eq!(typing.composer().input.lines(), ["Why?"]);
}

fn app_with_text(s: &str) -> deltascope::tui::app::App {
    let mut a = common::app();
    type_text(&mut a, s, 0.0);
    a
}

#[test]
fn session_picker_lists_saved_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = app();
    app.set_sessions_dir(dir.path().to_path_buf());
    healthy_turn(&mut app, true);
    settle(&mut app);
    // The finished turn was autosaved atomically: one JSON file, no temporary left over.
    let files: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(files, vec![std::ffi::OsString::from("test-session.json")]);
    let mut other = Session::new("embedded:demo", None);
    other.id = "older".into();
    other.created = 1_700_000_000;
    other.save_atomic(&dir.path().join("older.json")).unwrap();
    key(&mut app, KeyCode::Char('p'), KeyModifiers::CONTROL, 300.0);
    settle(&mut app);
    let screen = render(&mut app, W, H);
    let screen = screen.replace(&dir.path().display().to_string(), "[DIR]");
    snap("picker", screen);

    // Opening a session recorded with another model says so.
    let mut foreign = Session::new("Qwen3.6-27B", None);
    foreign.turns = app.session().turns.clone();
    let path = dir.path().join("foreign.json");
    foreign.save_atomic(&path).unwrap();
    app.open_session(&path, false);
    settle(&mut app);
    let msg = app.status().unwrap().to_string();
    assert_eq!(msg, "this session was recorded with Qwen3.6-27B; new turns use embedded:demo");

    // A file the picker cannot open is listed with the reason, not hidden.
    std::fs::write(dir.path().join("broken.json"), "{").unwrap();
    app.close_overlay();
    key(&mut app, KeyCode::Char('p'), KeyModifiers::CONTROL, 300.0);
    settle(&mut app);
    let screen = render(&mut app, W, H);
    assert!(screen.contains("✖") && screen.contains("broken.json is not a deltascope session"), "{screen}");
}

/// The picker lists a session by its chosen name, else its first prompt, and renames and
/// deletes (asked twice); never the conversation open in this window, never over another file.
#[test]
fn session_picker_renames_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = app();
    app.set_sessions_dir(dir.path().to_path_buf());
    healthy_turn(&mut app, true);
    settle(&mut app);
    let saved = |id: &str, created: u64, prompt: Option<&str>| {
        let mut s = Session::new("embedded:demo", None);
        s.id = id.into();
        s.created = created;
        if let Some(p) = prompt {
            s.turns = app.session().turns.clone();
            s.turns[0].user = p.into();
        }
        s.save_atomic(&dir.path().join(format!("{id}.json"))).unwrap();
    };
    saved("2026-12-01T10-00-00-1", 1_764_583_200, Some("What is 482 + 739?"));
    saved("taken", 1_700_000_000, None);
    let open_picker = |app: &mut deltascope::tui::app::App| {
        app.close_overlay();
        key(app, KeyCode::Char('p'), KeyModifiers::CONTROL, 300.0);
        settle(app);
        render(app, W, H)
    };
    let screen = open_picker(&mut app);
    // Named by its first prompt (an autosave's file name is a time), "1 turn", a readable time.
    let row = screen.lines().find(|l| l.contains("What is 482 + 739?")).unwrap_or_else(|| panic!("{screen}"));
    assert!(row.contains(" 1 turn ") && row.contains("2025-12-01 10:00"), "{row}");
    // Select it (the newest first: the open conversation, then it) and rename it.
    let select = |app: &mut deltascope::tui::app::App, what: &str| {
        for _ in 0..5 {
            let screen = render(app, W, H);
            if screen.lines().any(|l| l.contains('▸') && l.contains(what)) {
                return;
            }
            key(app, KeyCode::Down, KeyModifiers::NONE, 300.0);
        }
        panic!("{what} is not in the picker:\n{}", render(app, W, H));
    };
    select(&mut app, "What is 482 + 739?");
    key(&mut app, KeyCode::Char('n'), KeyModifiers::NONE, 300.0);
    key(&mut app, KeyCode::Char('u'), KeyModifiers::CONTROL, 300.0);
    type_text(&mut app, "taken", 300.0);
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 300.0);
    settle(&mut app);
    assert!(app.status().unwrap().contains("a session named taken already exists"), "{:?}", app.status());
    assert!(dir.path().join("2026-12-01T10-00-00-1.json").exists(), "a refused rename leaves the file");
    key(&mut app, KeyCode::Char('n'), KeyModifiers::NONE, 300.0);
    key(&mut app, KeyCode::Char('u'), KeyModifiers::CONTROL, 300.0);
    type_text(&mut app, "addition", 300.0);
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 300.0);
    settle(&mut app);
    assert!(dir.path().join("addition.json").exists() && !dir.path().join("2026-12-01T10-00-00-1.json").exists());
    let screen = render(&mut app, W, H);
    assert!(
        screen.lines().any(|l| l.contains('▸') && l.contains("addition")),
        "the renamed one stays selected:\n{screen}"
    );
    // Delete: `d` asks, another key keeps it, `d` then `y` deletes.
    key(&mut app, KeyCode::Char('d'), KeyModifiers::NONE, 300.0);
    assert!(render(&mut app, W, H).contains("Delete \"addition\"? y deletes the file"));
    key(&mut app, KeyCode::Char('x'), KeyModifiers::NONE, 300.0);
    settle(&mut app);
    assert!(dir.path().join("addition.json").exists(), "any other key keeps it");
    key(&mut app, KeyCode::Char('d'), KeyModifiers::NONE, 300.0);
    key(&mut app, KeyCode::Char('y'), KeyModifiers::NONE, 300.0);
    settle(&mut app);
    assert!(!dir.path().join("addition.json").exists());
    // The conversation open here is neither renamed nor deleted.
    select(&mut app, "Is 91 prime?");
    key(&mut app, KeyCode::Char('d'), KeyModifiers::NONE, 300.0);
    key(&mut app, KeyCode::Char('y'), KeyModifiers::NONE, 300.0);
    settle(&mut app);
    assert!(dir.path().join("test-session.json").exists());
    assert!(app.status().unwrap().contains("is the conversation open here"), "{:?}", app.status());
}

/// The full cell grid (symbols and styles) of one frame.
fn cells(app: &deltascope::tui::app::App, w: u16, h: u16) -> ratatui::buffer::Buffer {
    let mut term = terminal(w, h);
    term.draw(|f| {
        deltascope::tui::view::View::default().draw(app, f);
    })
    .expect("draw");
    term.backend().buffer().clone()
}

/// The panes keep their wrapped lines between frames and only add what streamed in since: a
/// pane drawn after every event must look exactly (styles included) like one drawn once at the
/// end, through a loop alarm, colour modes, the inspector's cursor and a resize.
#[test]
fn incremental_pane_lines_match_a_fresh_draw() {
    let p = params(4096, None);
    let mut events = vec![start(20, &p)];
    for i in 0..240 {
        let piece = match i % 11 {
            10 => "\n".to_string(),
            7 => "averyveryverylongwordthatmustbecutacrossseveralrowsofthepane ".to_string(),
            _ => format!("step{i} "),
        };
        let draft = [DraftKind::None, DraftKind::Accepted, DraftKind::Bonus][i % 3];
        events.push(token(i, Phase::Thinking, &piece, -0.3 * (i % 5) as f32, draft, false));
        if i == 180 {
            events.push(diag(DiagnosticKind::DegenerateLoop, 180, "a 22-token pattern repeats", Some((22, 130))));
        }
    }
    events.push(token(240, Phase::Thinking, "</think>", -0.01, DraftKind::None, false));
    events.push(token(241, Phase::Answer, "\n\n", -0.01, DraftKind::None, false));
    // A Markdown answer: text, a table (held until it ends), a code block, more text.
    let markdown = "## Result\nword word **bold** word\n| n | prime |\n|---|:-:|\n| 91 | no |\n| 97 | yes |\nafter the table\n```rust\nfn main() { println!(\"{}\", 7 * 13); }\n```\n";
    let mut pieces: Vec<String> = markdown.split_inclusive([' ', '\n', '|']).map(str::to_string).collect();
    pieces.extend((0..40).map(|i| if i % 9 == 8 { "\n".to_string() } else { format!("word{i} ") }));
    let mut answer = String::new();
    for (k, piece) in pieces.iter().enumerate() {
        events.push(token(242 + k, Phase::Answer, piece, -0.2, DraftKind::Accepted, false));
        answer.push_str(piece);
    }
    events.push(done(FinishReason::Stop, 20, 241, pieces.len() + 1, "", &format!("\n\n{answer}")));

    // A new app (so an empty cache) that got `n` events and then `keys`, drawn once.
    let fresh = |n: usize, keys: &[(KeyCode, KeyModifiers)], w: u16, h: u16| {
        let mut a = app();
        ask(&mut a, "q", 0.0);
        for (j, e) in events.iter().enumerate().take(n) {
            engine(&mut a, e.clone(), j as f64);
        }
        for (c, m) in keys {
            key(&mut a, *c, *m, 400.0);
        }
        cells(&a, w, h)
    };
    let mut live = app();
    ask(&mut live, "q", 0.0);
    let mut term = terminal(W, H);
    // What drawing keeps between frames, as the runner keeps it.
    let mut view = deltascope::tui::view::View::default();
    for (i, e) in events.iter().enumerate() {
        engine(&mut live, e.clone(), i as f64);
        term.draw(|f| {
            view.draw(&live, f);
        })
        .unwrap();
        // Midway through thinking, and inside the answer's table and code block.
        if [150, 262, 275].contains(&i) {
            assert_eq!(term.backend().buffer(), &fresh(i + 1, &[], W, H), "after {} events", i + 1);
        }
    }
    let all = events.len();
    assert_eq!(term.backend().buffer(), &fresh(all, &[], W, H), "streamed");
    let screen = render(&mut live, W, H);
    assert!(screen.contains("LOOP DETECTED"));
    assert!(screen.contains("91 │  no") && screen.contains("97 │  yes"), "the table is drawn aligned:\n{screen}");

    // Logprob colours: the answer pane shows tokens (not Markdown) and goes through the cache too.
    let mut keys = vec![(KeyCode::Char('l'), KeyModifiers::CONTROL)];
    key(&mut live, KeyCode::Char('l'), KeyModifiers::CONTROL, 400.0);
    term.draw(|f| {
        view.draw(&live, f);
    })
    .unwrap();
    assert_eq!(term.backend().buffer(), &fresh(all, &keys, W, H), "logprob colours");

    // The inspector's cursor moves over the tokens.
    keys.push((KeyCode::Char('g'), KeyModifiers::CONTROL));
    keys.extend([(KeyCode::Left, KeyModifiers::NONE); 70]);
    for (c, m) in &keys[1..] {
        key(&mut live, *c, *m, 400.0);
    }
    term.draw(|f| {
        view.draw(&live, f);
    })
    .unwrap();
    assert_eq!(term.backend().buffer(), &fresh(all, &keys, W, H), "inspector");

    // A narrower terminal re-wraps.
    let mut narrow = terminal(100, 30);
    narrow
        .draw(|f| {
            view.draw(&live, f);
        })
        .unwrap();
    assert_eq!(narrow.backend().buffer(), &fresh(all, &keys, 100, 30), "narrow");
}

/// A new turn starts the answer pane's Markdown over, even when its first frame already holds
/// more finished lines than the last turn had.
#[test]
fn a_new_turn_redraws_the_markdown_answer() {
    let answer = |n: usize, word: &str| -> Vec<EngineEvent> {
        let p = params(4096, None);
        let mut ev = vec![start(10, &p), token(0, Phase::Thinking, "</think>", 0.0, DraftKind::None, false)];
        let mut text = String::new();
        for i in 0..n {
            let piece = format!("{word} line {i}\n");
            ev.push(token(i + 1, Phase::Answer, &piece, -0.1, DraftKind::None, false));
            text.push_str(&piece);
        }
        ev.push(done(FinishReason::Stop, 10, 1, n, "", &text));
        ev
    };
    let run = |draw_between: bool| {
        let mut a = app();
        let mut term = terminal(W, H);
        let mut view = deltascope::tui::view::View::default();
        for (q, evs) in [("first", answer(5, "alpha")), ("second", answer(12, "beta"))] {
            ask(&mut a, q, 0.0);
            for (t, e) in evs.into_iter().enumerate() {
                engine(&mut a, e, t as f64);
            }
            if draw_between {
                term.draw(|f| {
                    view.draw(&a, f);
                })
                .unwrap();
            }
        }
        term.draw(|f| {
            view.draw(&a, f);
        })
        .unwrap();
        term.backend().buffer().clone()
    };
    let (live, fresh) = (run(true), run(false));
    assert_eq!(live, fresh);
    let screen: String = live.content.iter().map(|c| c.symbol()).collect();
    assert!(screen.contains("beta line 11"), "{screen}");
}

/// The State view on a traced turn (6 GDN layers × 4 heads, like the demo model).
fn state_app() -> deltascope::tui::app::App {
    let mut app = app();
    traced_turn(&mut app, 6, 4);
    key(&mut app, KeyCode::F(7), KeyModifiers::NONE, 500.0);
    app
}

#[test]
fn state_view_fits_80x24() {
    let mut app = state_app();
    assert!(app.view().state.shown);
    assert_eq!(app.view().focus, Focus::State);
    let screen = render(&mut app, 80, 24);
    // The metric, the token it is at, the map's rows, the selected head and its history.
    assert!(screen.contains("write strength β · after #"), "{screen}");
    assert!(screen.contains("▸L0 "), "{screen}");
    assert!(screen.contains(" L6 "), "layer 6 (the sixth GDN layer, after attention layer 3): {screen}");
    assert!(screen.contains("L0 head 0 · β "), "{screen}");
    assert!(screen.contains("forgets within 2 tokens"), "head 0 of layer 0 forgets: {screen}");
    assert!(screen.contains("attention L3 L7:"), "{screen}");
    snap("state_80x24", screen);
}

#[test]
fn state_view_wide_with_every_head_of_the_layer_over_the_tokens() {
    let mut app = state_app();
    for c in [KeyCode::Right, KeyCode::Char('m')] {
        key(&mut app, c, KeyModifiers::NONE, 501.0);
    }
    let screen = render(&mut app, W, H);
    assert!(screen.contains("half-life (tokens)"), "m moves to the next metric: {screen}");
    assert!(screen.contains("L0 head 1 ·"), "→ selects head 1: {screen}");
    assert!(screen.contains("keeps half past 1000 tokens"), "{screen}");
    // One row per head of the layer, the selected one marked, and the tokens under them.
    for h in ["▸h1", " h0", " h2", " h3"] {
        assert!(screen.contains(h), "{h}: {screen}");
    }
    snap("state_wide", screen);
}

#[test]
fn state_view_follows_the_token_cursor_both_ways() {
    let mut app = state_app();
    let n = app.shown().unwrap().tokens.len();
    // The latest pass read the second-to-last token (the last one is sampled, not read).
    assert!(render(&mut app, W, H).contains(&format!("pass {n} of {n}")));
    // [ moves the cursor, which is the inspector's: to the last token (sampled, not read yet),
    // then to the one before it (the latest pass), then one more back.
    key(&mut app, KeyCode::Char('['), KeyModifiers::NONE, 501.0);
    assert_eq!(app.view().inspector, Some(n - 1));
    assert!(render(&mut app, W, H).contains(&format!("#{} not read yet: after #{} ", n - 1, n - 2)));
    key(&mut app, KeyCode::Char('['), KeyModifiers::NONE, 501.0);
    key(&mut app, KeyCode::Char('['), KeyModifiers::NONE, 501.0);
    assert_eq!(app.view().inspector, Some(n - 3));
    let screen = render(&mut app, W, H);
    assert!(
        screen.contains(&format!("after #{} ", n - 3)) && screen.contains(&format!("pass {} of {n}", n - 1)),
        "{screen}"
    );
    // The inspector's own keys move the view too (focus on the prompt, inspector open).
    key(&mut app, KeyCode::Tab, KeyModifiers::NONE, 502.0);
    assert_eq!(app.view().focus, Focus::Input);
    key(&mut app, KeyCode::Home, KeyModifiers::NONE, 502.0);
    assert_eq!(app.view().inspector, Some(0));
    assert!(render(&mut app, W, H).contains("after #0 "), "Home: the first token");
    // End follows the latest pass again; the last token is not read yet.
    key(&mut app, KeyCode::BackTab, KeyModifiers::NONE, 503.0);
    assert_eq!(app.view().focus, Focus::State);
    key(&mut app, KeyCode::End, KeyModifiers::NONE, 503.0);
    assert_eq!(app.view().inspector, None);
    key(&mut app, KeyCode::Char(']'), KeyModifiers::NONE, 503.0);
    assert_eq!(app.view().inspector, None, "] past the end keeps following");
    key(&mut app, KeyCode::Char('['), KeyModifiers::NONE, 503.0);
    assert_eq!(app.view().inspector, Some(n - 1));
    assert!(render(&mut app, W, H).contains(&format!("#{} not read yet", n - 1)));
    // Esc closes the view and gives the prompt the focus.
    key(&mut app, KeyCode::Esc, KeyModifiers::NONE, 504.0);
    assert!(!app.view().state.shown);
    assert_eq!(app.view().focus, Focus::Input);
}

#[test]
fn state_view_scrolls_many_layers_and_heads_at_80x24() {
    let mut app = app();
    traced_turn(&mut app, 48, 48);
    key(&mut app, KeyCode::F(7), KeyModifiers::NONE, 500.0);
    for _ in 0..40 {
        key(&mut app, KeyCode::Down, KeyModifiers::NONE, 501.0);
    }
    key(&mut app, KeyCode::Right, KeyModifiers::SHIFT, 501.0);
    for _ in 0..5 {
        key(&mut app, KeyCode::Right, KeyModifiers::SHIFT, 501.0);
    }
    let screen = render(&mut app, 80, 24);
    // GDN layer index 40 is decoder layer 53; head 47 is the last.
    assert!(screen.contains("▸L53 "), "{screen}");
    assert!(screen.contains("L53 head 47 ·"), "{screen}");
    assert!(screen.contains("of 48 at this pass") || !screen.contains("heads 0–"), "{screen}");
    // Nothing is drawn past the frame: every line is the terminal's width.
    assert!(screen.lines().all(|l| l.chars().count() <= 82), "{screen}");
    snap("state_scrolled", screen);
}

#[test]
fn state_view_without_a_trace_says_what_to_press() {
    let mut app = app();
    healthy_turn(&mut app, true);
    key(&mut app, KeyCode::F(7), KeyModifiers::NONE, 500.0);
    let screen = render(&mut app, 100, 30);
    assert!(screen.contains("No state trace for this turn."), "{screen}");
    assert!(screen.contains("F8 (or t here) traces the next generation"), "{screen}");
    // t turns tracing on for the next generation, which then asks the engine for it.
    key(&mut app, KeyCode::Char('t'), KeyModifiers::NONE, 501.0);
    assert!(app.settings().params.trace_state);
    assert!(render(&mut app, 100, 30).contains("Tracing is on"));
    assert!(render(&mut app, 160, 30).contains("state trace on"), "the status line says so");
    key(&mut app, KeyCode::Esc, KeyModifiers::NONE, 502.0);
    ask(&mut app, "again", 503.0);
    let sent = settle(&mut app).into_iter().rev().find_map(|e| match e {
        Effect::Generate { params, .. } => Some(params.trace_state),
        _ => None,
    });
    assert_eq!(sent, Some(true));
    // F8 turns it off again.
    key(&mut app, KeyCode::F(8), KeyModifiers::NONE, 504.0);
    assert!(!app.settings().params.trace_state);
}

#[test]
fn a_server_backend_says_why_there_is_no_state_view() {
    use deltascope::backend::{BackendKind, Support};
    use deltascope_protocol::ServerLabel;
    let mut app = app();
    let mut info = model();
    info.kind = BackendKind::Remote(ServerLabel {
        kind: "llama.cpp".into(),
        version: None,
        url: "http://127.0.0.1:8080".into(),
    });
    info.state_trace = Support::No("llama.cpp does not expose a model's recurrent state".into());
    app.set_model(info);
    key(&mut app, KeyCode::F(8), KeyModifiers::NONE, 1.0);
    assert!(!app.settings().params.trace_state);
    assert!(app.status().unwrap().contains("llama.cpp does not expose"), "{:?}", app.status());
    key(&mut app, KeyCode::F(7), KeyModifiers::NONE, 2.0);
    let screen = render(&mut app, 100, 30);
    assert!(screen.contains("The state scope needs the in-process engine:"), "{screen}");
    assert!(screen.contains("llama.cpp does not expose a model's recurrent state"), "{screen}");
}

#[test]
fn a_state_alarm_raises_a_banner_and_the_view_opens_on_that_head() {
    use deltascope_protocol::Diagnostic;
    let mut app = app();
    traced_turn(&mut app, 6, 4);
    let alarm = Diagnostic {
        kind: DiagnosticKind::StateAlarm,
        at_token: 3,
        message: "layer 5, value head 2: ‖S‖ = 3.200e4, over 1e4 after reading generated token 3. What to check: layers.5.linear_attn.*".into(),
        period: None,
        start: None,
        fix: None,
        layer: Some(5),
        head: Some(2),
    };
    // As the engine sends it, in the live turn: a new turn to carry it.
    ask(&mut app, "Is 97 prime?", 600.0);
    let mut p = params(256, None);
    p.trace_state = true;
    engine(&mut app, start(16, &p), 601.0);
    engine(&mut app, state_event(None, 6, 4), 602.0);
    engine(&mut app, EngineEvent::Diagnostic(alarm), 603.0);
    let screen = render(&mut app, W, H);
    assert!(screen.contains("⚠ STATE ALARM"), "{screen}");
    assert!(screen.contains("layer 5, value head 2: ‖S‖ = 3.200e4, over 1e4"), "{screen}");
    assert!(screen.contains("[F7] shows it"), "{screen}");
    key(&mut app, KeyCode::F(7), KeyModifiers::NONE, 604.0);
    let screen = render(&mut app, W, H);
    // Layer 5 is the fourth GDN layer (0, 1, 2, 4, 5, …).
    assert_eq!((app.view().state.layer, app.view().state.head), (4, 2));
    assert!(screen.contains("L5 head 2 ·"), "{screen}");
}

/// Issue 35, item 7: a pass that goes non-finite sends the trace of the layers it ran (layer 1
/// with head 2's ✖) before the `nonfinite` diagnostic; the State view shows that pass instead of
/// "No state trace".
#[test]
fn the_state_view_shows_the_pass_that_went_non_finite() {
    use deltascope_protocol::Diagnostic;
    let mut app = app();
    let mut p = params(256, None);
    p.trace_state = true;
    ask(&mut app, "Is 91 prime?", 0.0);
    engine(&mut app, start(16, &p), 2.0);
    engine(&mut app, state_event(None, 6, 4), 3.0);
    engine(&mut app, token(0, Phase::Thinking, "Check", -0.1, DraftKind::None, false), 4.0);
    // The failing pass: layers 0 and 1 only, head 2 of layer 1 non-finite.
    let EngineEvent::State(mut failed) = state_event(Some(0), 6, 4) else { unreachable!() };
    failed.gdn.truncate(2);
    failed.gdn[1].nonfinite[2] = 1024;
    failed.gdn[1].state_norm[2] = f32::NAN;
    engine(&mut app, EngineEvent::State(failed), 5.0);
    let nan = Diagnostic {
        kind: DiagnosticKind::Nonfinite,
        at_token: 0,
        message: "NaN first appeared in layer 1's GDN output at sequence position 16 (token id 1), generated token 1"
            .into(),
        period: None,
        start: None,
        fix: None,
        layer: Some(1),
        head: Some(2),
    };
    engine(&mut app, EngineEvent::Diagnostic(nan), 6.0);
    engine(&mut app, done(FinishReason::Error, 16, 1, 0, "Check", ""), 7.0);
    key(&mut app, KeyCode::F(7), KeyModifiers::NONE, 8.0);
    let screen = render(&mut app, W, H);
    assert!(!screen.contains("No state trace"), "{screen}");
    assert!(screen.contains('✖'), "head 2 of layer 1 marked: {screen}");
}

/// Issue 35, item 10: the History column keeps a prompt as typed ("37 * 6"), and an answer's
/// Markdown marks (`**`) are left out there, not its products.
#[test]
fn the_history_keeps_the_prompts_stars() {
    let mut app = app();
    ask(&mut app, "What is 37 * 6?", 0.0);
    let p = params(256, None);
    engine(&mut app, start(16, &p), 1.0);
    engine(&mut app, token(0, Phase::Answer, "**37 * 6 = 222**", -0.1, DraftKind::None, false), 2.0);
    engine(&mut app, done(FinishReason::Stop, 16, 0, 1, "", "**37 * 6 = 222**"), 3.0);
    let screen = render(&mut app, W, H);
    assert!(screen.contains("What is 37 * 6?"), "{screen}");
    assert!(screen.contains("   37 * 6 = 222"), "the answer line, without the bold marks: {screen}");
}

/// A sampled run says so on the status bar, with whose defaults it samples (issue 35: a
/// llama.cpp server samples at T 0.8 where the demo is greedy locally); a greedy one says
/// nothing.
#[test]
fn the_status_bar_says_when_a_run_samples_and_with_whose_defaults() {
    use deltascope::backend::{BackendKind, ParamOverrides};
    use deltascope_protocol::{SamplingParams, ServerLabel};
    let mut info = model();
    info.kind = BackendKind::Remote(ServerLabel {
        kind: "llama.cpp".into(),
        version: Some("b11549".into()),
        url: "http://127.0.0.1:8080".into(),
    });
    info.defaults = SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, ..Default::default() };
    // The sliders start where `chat --server URL` starts them: no flag, the server's defaults.
    let params = ParamOverrides::default().resolve(&info).expect("the defaults are in range");
    let mut app = app_on(info.clone(), params.clone());
    let screen = render(&mut app, W, H);
    let status = screen.lines().last().unwrap_or_default();
    assert!(status.contains("thinking on │ sampled T 0.8 · k 40 · p 0.95 (server defaults)"), "{status}");
    // Chosen on the command line: the values, without "defaults".
    let mut chosen = params.clone();
    chosen.sampling.temperature = 0.6;
    let mut app = app_on(info.clone(), chosen);
    let status = render(&mut app, W, H).lines().last().unwrap_or_default().to_string();
    assert!(status.contains("sampled T 0.6 · k 40") && !status.contains("defaults"), "{status}");
    // Greedy: nothing to say.
    let mut greedy = params;
    greedy.sampling.temperature = 0.0;
    let mut app = app_on(info, greedy);
    let status = render(&mut app, W, H).lines().last().unwrap_or_default().to_string();
    assert!(!status.contains("sampled"), "{status}");
}

/// Issue 35's newcomer list, in the views: Ctrl+X with no turns writes nothing; a cancel's
/// status says it ended; at 80 × 24 the question is on screen and the inspector leaves the top
/// of the panes and cuts no line; F1 at 60 × 20 keeps descriptions in their column.
#[test]
fn small_terminal_and_first_use_rough_edges() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = app();
    app.set_sessions_dir(dir.path().to_path_buf());
    key(&mut app, KeyCode::Char('x'), KeyModifiers::CONTROL, 0.0);
    settle(&mut app);
    assert_eq!(app.status(), Some("nothing to export yet: the conversation has no turns"));
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "no header-only file");

    // A cancel: "cancelling…" is followed by what the cancel kept.
    let p = params(256, None);
    ask(&mut app, "Count to a thousand.", 0.0);
    engine(&mut app, start(16, &p), 1.0);
    engine(&mut app, token(0, Phase::Thinking, "One", -0.1, DraftKind::None, false), 2.0);
    key(&mut app, KeyCode::Esc, KeyModifiers::NONE, 3.0);
    assert_eq!(app.status(), Some("cancelling… (output kept)"));
    engine(&mut app, done(FinishReason::Cancelled, 16, 1, 0, "", ""), 4.0);
    assert_eq!(app.status(), Some("cancelled: the 1 token so far kept"));
    let screen = render(&mut app, 80, 24);
    let status_line = screen.lines().last().unwrap_or_default().to_string();
    assert!(status_line.contains("● done"), "{status_line}");
    assert!(!status_line.contains("cancelling"), "{status_line}");
    // Thinking tokens that arrived together (a burst of accepted drafts) took no measurable
    // time: no duration, rather than "0 ms".
    let mut app = common::app();
    ask(&mut app, "Is 91 prime?", 0.0);
    engine(&mut app, start(16, &p), 1.0);
    for (i, (phase, text)) in
        [(Phase::Thinking, "Check"), (Phase::Thinking, " 7."), (Phase::Answer, "No.")].into_iter().enumerate()
    {
        engine(&mut app, token(i, phase, text, -0.1, DraftKind::Accepted, false), 2.0);
    }
    engine(&mut app, done(FinishReason::Stop, 16, 2, 1, "", ""), 2.0);
    let screen = render(&mut app, 80, 24);
    let title = screen.lines().find(|l| l.contains("Thinking ·")).unwrap_or_else(|| panic!("{screen}"));
    assert!(title.contains("Thinking · 2 tok ") && !title.contains(" ms"), "{title}");

    let mut app = common::app();
    healthy_turn(&mut app, true);
    let screen = render(&mut app, 80, 24);
    assert!(screen.lines().next().is_some_and(|l| l.starts_with("\"❯ Is 91 prime?")), "{screen}");
    key(&mut app, KeyCode::Char('g'), KeyModifiers::CONTROL, 200.0);
    for _ in 0..12 {
        key(&mut app, KeyCode::Left, KeyModifiers::NONE, 200.0);
    }
    let screen = render(&mut app, 80, 24);
    let top = screen.lines().position(|l| l.contains("Token inspector")).expect("the inspector");
    assert!(top >= 7, "the popup leaves the panes' first rows in view (it starts at row {top}):\n{screen}");
    assert!(screen.contains("(p 0.741 vs") && screen.contains("0.061)"), "the margin is wrapped, not cut:\n{screen}");

    let mut app = common::app();
    key(&mut app, KeyCode::F(1), KeyModifiers::NONE, 0.0);
    let screen = render(&mut app, 60, 20);
    let rows: Vec<&str> = screen.lines().filter_map(|l| l.strip_prefix("\"│")).collect();
    assert!(rows.len() > 10 && screen.contains("Help"), "{screen}");
    for row in rows.iter().skip(1).filter(|r| !r.trim().is_empty() && !r.starts_with("Keys")) {
        assert_eq!(row.chars().nth(23), Some(' '), "a description wrapped under the key column:\n{screen}");
    }
}

/// A prompt count the server's usage frame never gave (the stream was closed first) is marked
/// as an estimate in the gauge: "prompt ≈N".
#[test]
fn an_estimated_prompt_count_is_marked_in_the_gauge() {
    let mut app = app();
    let p = params(256, None);
    ask(&mut app, "Is 91 prime?", 0.0);
    engine(&mut app, start(0, &p), 1.0);
    engine(&mut app, token(0, Phase::Answer, "No.", -0.1, DraftKind::None, false), 2.0);
    let mut d = done(FinishReason::Cancelled, 23, 0, 1, "", "No.");
    if let deltascope_protocol::EngineEvent::Done(ref mut d) = d {
        d.usage.prompt_estimate = Some("llama.cpp's /tokenize of the rendered chat (no usage frame came)".into());
    }
    engine(&mut app, d, 3.0);
    let screen = render(&mut app, W, H);
    assert!(screen.contains("prompt ≈23"), "{screen}");
}

/// A config.json key deltascope does not know is said in the workbench (a warning in the
/// message log and on the status line), in the one line `inspect` and `run` print.
#[test]
fn an_unknown_config_key_is_said_in_the_workbench() {
    let line = "config.json: unknown key `layer_scale_init` = 0.5, ignored: if it changes the architecture, results will be wrong";
    let mut info = model();
    info.config_notes = vec![line.to_string()];
    let mut app = app_on(info, params(256, None));
    let screen = render(&mut app, W, H);
    assert!(screen.contains("unknown key `layer_scale_init` = 0.5"), "the status line:\n{screen}");
    assert!(app.messages().items.iter().any(|m| m.text == line), "the message log");
}
