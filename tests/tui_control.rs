//! Control of the conversation and of the work in it, through the app's state and effects (no
//! engine: events are scripted): failed turns leave the context, earlier prompts are edited and
//! re-run with the old turns kept, turns are deleted, cut answers continued, new conversations
//! started, the system prompt edited; pastes, typed slider values, the prompt view; and saving
//! that never loses a turn silently.

mod common;

use common::*;
use deltascope::backend::{DryRun, Prompt, Role};
use deltascope::session::Session;
use deltascope::tui::app::{App, AppConfig, EditTarget, Effect, Focus, SessionsDir};
use deltascope::tui::event::Inbound;
use deltascope::tui::keymap::Keymap;
use deltascope::tui::theme::Theme;
use deltascope_protocol::ErrorKind;
use deltascope_protocol::{DiagnosticKind, DraftKind, EngineEvent, FinishReason, Phase};
use ratatui::crossterm::event::{Event, KeyCode, KeyModifiers};

const W: u16 = 160;
const H: u16 = 46;

/// The chat messages of the last `Generate` effect, as (role, content).
fn generated(effects: &[Effect]) -> Vec<(Role, String)> {
    let Some(Effect::Generate { prompt: Prompt::Chat(m), .. }) =
        effects.iter().rev().find(|e| matches!(e, Effect::Generate { .. }))
    else {
        panic!("no chat generation in {effects:?}")
    };
    m.iter().map(|m| (m.role, m.content.clone())).collect()
}

/// A finished turn answering `a`.
fn answer_turn(app: &mut App, q: &str, a: &str, t: f64) {
    let p = params(256, None);
    ask(app, q, t);
    engine(app, start(10, &p), t + 1.0);
    engine(app, token(0, Phase::Thinking, "think\n", -0.1, DraftKind::None, false), t + 2.0);
    engine(app, token(1, Phase::Thinking, "</think>", -0.1, DraftKind::None, false), t + 3.0);
    engine(app, token(2, Phase::Answer, a, -0.1, DraftKind::None, false), t + 4.0);
    engine(app, done(FinishReason::Stop, 10, 2, 1, "think\n", a), t + 5.0);
}

#[test]
fn a_failed_turn_leaves_the_context() {
    let mut app = app();
    answer_turn(&mut app, "Is 91 prime?", "No.", 0.0);
    ask(&mut app, "What is 482 + 739?", 10.0);
    engine(&mut app, EngineEvent::error(ErrorKind::ContextOverflow, "the prompt is longer than the context"), 11.0);
    app.take_effects();
    ask(&mut app, "Sort 5, 2, 9, 1.", 20.0);
    let msgs = generated(&app.take_effects());
    let users: Vec<&str> = msgs.iter().filter(|(r, _)| *r == Role::User).map(|(_, c)| c.as_str()).collect();
    assert_eq!(users, ["Is 91 prime?", "Sort 5, 2, 9, 1."], "the failed turn is not in the context: {msgs:?}");
}

#[test]
fn an_earlier_prompt_is_edited_and_rerun_with_the_old_turns_kept() {
    let mut app = app();
    answer_turn(&mut app, "Is 91 prime?", "No.", 0.0);
    answer_turn(&mut app, "What is 482 + 739?", "1221.", 10.0);
    answer_turn(&mut app, "Sort 5, 2.", "2, 5", 20.0);
    app.take_effects();
    // Browse back to the second turn and edit its prompt.
    key(&mut app, KeyCode::Left, KeyModifiers::ALT, 30.0);
    assert_eq!(app.shown_index(), Some(1));
    key(&mut app, KeyCode::Char('e'), KeyModifiers::CONTROL, 30.0);
    assert_eq!(app.composer().target, EditTarget::Turn(1));
    assert_eq!(app.composer().text(), "What is 482 + 739?");
    for _ in 0..3 {
        key(&mut app, KeyCode::Backspace, KeyModifiers::NONE, 30.0);
    }
    type_text(&mut app, "40?", 30.0);
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 30.0);
    let msgs = generated(&app.take_effects());
    assert_eq!(
        msgs,
        [
            (Role::User, "Is 91 prime?".to_string()),
            (Role::Assistant, "No.".to_string()),
            (Role::User, "What is 482 + 740?".to_string())
        ]
    );
    let s = app.session();
    assert_eq!(s.turns.len(), 2, "turn 2 re-runs in place; turn 3 goes with the old branch");
    assert_eq!(s.turns[1].user, "What is 482 + 740?");
    assert_eq!(s.branches.len(), 1);
    assert_eq!(s.branches[0].at, 1);
    assert_eq!(s.branches[0].reason, "edited");
    let kept: Vec<&str> = s.branches[0].turns.iter().map(|t| t.user.as_str()).collect();
    assert_eq!(kept, ["What is 482 + 739?", "Sort 5, 2."]);
    // The panes follow the new turn.
    assert_eq!(app.shown_index(), Some(1));
}

#[test]
fn a_deleted_turn_leaves_the_context_and_stays_in_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = app();
    app.set_sessions_dir(dir.path().to_path_buf());
    answer_turn(&mut app, "Is 91 prime?", "No.", 0.0);
    answer_turn(&mut app, "What is 482 + 739?", "1221.", 10.0);
    settle(&mut app);
    key(&mut app, KeyCode::Left, KeyModifiers::ALT, 20.0);
    key(&mut app, KeyCode::Char('x'), KeyModifiers::ALT, 20.0);
    assert_eq!(app.session().turns.len(), 1);
    assert_eq!(app.session().turns[0].user, "What is 482 + 739?");
    settle(&mut app);
    let saved = Session::load(&dir.path().join("test-session.json")).unwrap();
    assert_eq!(saved.turns.len(), 1);
    assert_eq!(saved.branches[0].reason, "deleted");
    assert_eq!(saved.branches[0].turns[0].user, "Is 91 prime?");
    ask(&mut app, "Sort 5, 2.", 30.0);
    let users: Vec<String> =
        generated(&app.take_effects()).into_iter().filter(|(r, _)| *r == Role::User).map(|(_, c)| c).collect();
    assert_eq!(users, ["What is 482 + 739?", "Sort 5, 2."]);
}

#[test]
fn an_answer_cut_by_max_tokens_is_continued_in_place() {
    let mut app = app();
    let p = params(4, None);
    ask(&mut app, "Is 91 prime?", 0.0);
    engine(&mut app, start(10, &p), 1.0);
    for (i, piece) in ["Check ", "divisors", "\n", "91"].iter().enumerate() {
        engine(&mut app, token(i, Phase::Thinking, piece, -0.1, DraftKind::None, false), 2.0 + i as f64);
    }
    engine(&mut app, done(FinishReason::Length, 10, 4, 0, "Check divisors\n91", ""), 6.0);
    app.take_effects();
    let budget_before = app.session().turns[0].params.max_tokens;
    key(&mut app, KeyCode::F(5), KeyModifiers::NONE, 10.0);
    let effects = app.take_effects();
    let Some(Effect::Generate { prompt: Prompt::Continue { messages, generated }, params }) = effects.last() else {
        panic!("{effects:?}")
    };
    assert_eq!(generated, "Check divisors\n91", "the continuation's prompt ends with the text so far");
    assert_eq!(messages.last().map(|m| m.content.as_str()), Some("Is 91 prime?"));
    assert!(params.thinking.is_on());
    assert!(app.generating());
    // The continuation's events extend the same turn.
    engine(&mut app, start(14, &p), 11.0);
    engine(&mut app, token(0, Phase::Thinking, " ÷ 7", -0.1, DraftKind::None, false), 12.0);
    engine(&mut app, token(1, Phase::Thinking, "</think>", -0.1, DraftKind::None, false), 13.0);
    engine(&mut app, token(2, Phase::Answer, "No.", -0.1, DraftKind::None, false), 14.0);
    // A diagnostic of the continuation points at the turn's token, not the continuation's.
    engine(&mut app, common::diag(DiagnosticKind::AnswerTruncated, 2, "cut", None), 14.5);
    engine(&mut app, done(FinishReason::Stop, 14, 2, 1, " ÷ 7", "No."), 15.0);
    let s = app.session();
    assert_eq!(s.turns.len(), 1);
    let t = &s.turns[0];
    assert_eq!(t.finish_reason, Some(FinishReason::Stop));
    assert_eq!(t.tokens.len(), 7);
    assert_eq!(t.tokens.iter().map(|x| x.index).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(t.diagnostics.iter().map(|d| d.at_token).collect::<Vec<_>>(), [6]);
    assert_eq!(t.thinking, "Check divisors\n91 ÷ 7");
    assert_eq!(t.answer, "No.");
    assert_eq!(t.thinking_tokens(), 6);
    assert_eq!(t.answer_tokens(), 1);
    assert_eq!(t.prompt_tokens, 10, "the turn's own prompt, not the continuation's");
    assert_eq!(t.continued, 1);
    // The turn's budget is what both generations together could use.
    assert_eq!(t.params.max_tokens, budget_before + app.settings().params.max_tokens);
    // Times carry on from the first part.
    assert!(t.tokens[4].t_ms > t.tokens[3].t_ms, "{:?}", t.tokens.iter().map(|x| x.t_ms).collect::<Vec<_>>());
    // A finished answer has nothing to continue.
    app.take_effects();
    key(&mut app, KeyCode::F(5), KeyModifiers::NONE, 20.0);
    assert!(app.take_effects().is_empty());
    assert!(app.status().unwrap().contains("not cut short"), "{:?}", app.status());
}

#[test]
fn a_new_conversation_keeps_the_settings_and_the_old_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut app = app();
    app.set_sessions_dir(dir.path().to_path_buf());
    app.change_settings(|s| s.params.max_tokens = 777);
    answer_turn(&mut app, "Is 91 prime?", "No.", 0.0);
    settle(&mut app);
    key(&mut app, KeyCode::Char('n'), KeyModifiers::ALT, 10.0);
    assert!(app.session().turns.is_empty());
    assert_ne!(app.session().id, "test-session");
    assert_eq!(app.settings().params.max_tokens, 777);
    assert!(app.status().unwrap().contains("test-session.json"), "{:?}", app.status());
    ask(&mut app, "Sort 5, 2.", 20.0);
    let msgs = generated(&app.take_effects());
    assert_eq!(msgs.len(), 1, "a fresh context: {msgs:?}");
    let old = Session::load(&dir.path().join("test-session.json")).unwrap();
    assert_eq!(old.turns.len(), 1);
}

#[test]
fn the_system_prompt_is_edited_in_the_tui() {
    let mut app = app();
    key(&mut app, KeyCode::Char('s'), KeyModifiers::ALT, 0.0);
    assert_eq!(app.composer().target, EditTarget::System);
    type_text(&mut app, "Answer briefly.", 0.0);
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 0.0);
    assert_eq!(app.session().system.as_deref(), Some("Answer briefly."));
    assert!(app.take_effects().iter().all(|e| !matches!(e, Effect::Generate { .. })), "setting it sends nothing");
    ask(&mut app, "Is 91 prime?", 1.0);
    let msgs = generated(&app.take_effects());
    assert_eq!(msgs[0], (Role::System, "Answer briefly.".to_string()));
}

#[test]
fn a_paste_keeps_its_lines_and_sends_nothing() {
    let mut app = app();
    app.update(Inbound::Term(Event::Paste("first line\r\nsecond line\rthird".into())), 0.0);
    assert_eq!(app.composer().input.lines(), ["first line", "second line", "third"]);
    assert!(app.take_effects().is_empty());
    assert!(app.session().turns.is_empty());
    // Enter sends the whole text as one prompt.
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 1.0);
    assert_eq!(app.session().turns[0].user, "first line\nsecond line\nthird");
}

#[test]
fn the_prompt_box_grows_with_wrapped_text_and_keeps_the_cursor_in_view() {
    let mut app = app();
    let long = "word ".repeat(200);
    type_text(&mut app, &long, 0.0);
    type_text(&mut app, "END", 0.0);
    let screen = render(&mut app, 100, 40);
    let rows = screen.lines().filter(|l| l.contains("word word")).count();
    assert!(rows >= 8, "the box grew to several wrapped rows ({rows}):\n{screen}");
    assert!(screen.contains("END"), "the cursor's end of the text is in view:\n{screen}");
    // Home / End move within the long prompt.
    key(&mut app, KeyCode::Home, KeyModifiers::NONE, 0.0);
    type_text(&mut app, "START ", 0.0);
    assert!(app.composer().text().starts_with("START word"), "{:?}", &app.composer().text()[..20]);
    key(&mut app, KeyCode::End, KeyModifiers::NONE, 0.0);
    type_text(&mut app, " tail", 0.0);
    assert!(app.composer().text().ends_with("END tail"));
    // Ctrl+← moves back a word.
    key(&mut app, KeyCode::Left, KeyModifiers::CONTROL, 0.0);
    type_text(&mut app, "_", 0.0);
    assert!(app.composer().text().ends_with("END _tail"), "{:?}", app.composer().text());
}

#[test]
fn sliders_take_typed_values_and_stop_at_the_context() {
    let mut app = app();
    app.change_settings(|s| s.context = Some(4096));
    key(&mut app, KeyCode::Tab, KeyModifiers::NONE, 0.0);
    assert_eq!(app.view().focus, Focus::Sliders);
    // Enter on max_tokens, then the field report's 4000.
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 0.0);
    assert_eq!(app.overlay().name(), "slider-value");
    // The current value is shown selected: typing replaces it.
    type_text(&mut app, "9000", 0.0);
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 0.0);
    let screen = render(&mut app, 80, 30);
    assert!(screen.contains("max_tokens 9000: must be at most the model's context"), "{screen}");
    for _ in 0..4 {
        key(&mut app, KeyCode::Backspace, KeyModifiers::NONE, 0.0);
    }
    type_text(&mut app, "4000", 0.0);
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 0.0);
    assert_eq!(app.overlay().name(), "none");
    assert_eq!(app.settings().params.max_tokens, 4000);
    // The thinking budget: 3000.
    key(&mut app, KeyCode::Down, KeyModifiers::NONE, 0.0);
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 0.0);
    type_text(&mut app, "3000", 0.0);
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 0.0);
    assert_eq!(app.settings().params.thinking.budget(), Some(3000));
    // Steps stop at the context.
    key(&mut app, KeyCode::Up, KeyModifiers::NONE, 0.0);
    for _ in 0..5 {
        key(&mut app, KeyCode::Right, KeyModifiers::NONE, 0.0);
    }
    assert_eq!(app.settings().params.max_tokens, 4096);
}

#[test]
fn the_next_turns_prompt_is_shown_with_its_token_ids() {
    let mut app = app();
    answer_turn(&mut app, "Is 91 prime?", "No.", 0.0);
    app.take_effects();
    type_text(&mut app, "What is 2 + 2?", 1.0);
    key(&mut app, KeyCode::F(2), KeyModifiers::NONE, 1.0);
    let effects = app.take_effects();
    let Some(Effect::DryRun { prompt: Prompt::Chat(m), .. }) = effects.last() else { panic!("{effects:?}") };
    assert_eq!(m.last().map(|m| m.content.as_str()), Some("What is 2 + 2?"));
    assert_eq!(m.len(), 3, "with the conversation before it");
    app.show_dry_run(Ok(DryRun {
        rendered_by: "chat_template.jinja".into(),
        text: Some("<|im_start|>user\nWhat is 2 + 2?<|im_end|>".into()),
        ids: Some(vec![1, 2, 3]),
    }));
    let screen = render(&mut app, W, H);
    assert!(screen.contains("Next turn's prompt") && screen.contains("--- 3 token ids ---"), "{screen}");
    assert!(screen.contains("1,2,3"), "{screen}");
    // Nothing was sent, and the prompt is still there.
    assert_eq!(app.composer().text(), "What is 2 + 2?");
    assert_eq!(app.session().turns.len(), 1);
}

#[test]
fn the_context_in_use_is_in_the_budget_gauge() {
    let mut app = app();
    app.change_settings(|s| s.context = Some(4096));
    answer_turn(&mut app, "Is 91 prime?", "No.", 0.0);
    let screen = render(&mut app, W, H);
    // The last turn's prompt (10) and answer (1).
    assert!(screen.contains("history ≈11 of 4096 context tokens"), "{screen}");
}

/// A sessions "directory" that is a file: every save fails.
fn unsavable() -> (tempfile::TempDir, App) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let mut app = app();
    app.set_sessions_dir(file);
    (dir, app)
}

#[test]
fn a_failed_autosave_stays_visible_and_quitting_asks() {
    let (_dir, mut app) = unsavable();
    answer_turn(&mut app, "Is 91 prime?", "No.", 0.0);
    settle(&mut app);
    let err = app.save_error().map(str::to_string).expect("the save failed");
    // Long after the status message expired, the status line still says it.
    app.update(Inbound::Tick, 60_000.0);
    let screen = render(&mut app, 80, 30);
    assert!(screen.contains("NOT SAVED"), "{screen}");
    // The message log has the whole reason, wrapped, at 80 columns.
    key(&mut app, KeyCode::Char('m'), KeyModifiers::ALT, 60_000.0);
    let screen = render(&mut app, 80, 30);
    let flat: String = screen.lines().map(|l| l.trim_matches(|c| c == '│' || c == ' ')).collect::<Vec<_>>().join(" ");
    let words: Vec<&str> = err.split_whitespace().collect();
    assert!(words.iter().all(|w| flat.contains(w)), "every word of {err:?} is on screen:\n{screen}");
    key(&mut app, KeyCode::Esc, KeyModifiers::NONE, 60_000.0);
    // Quitting tries once more, then asks.
    key(&mut app, KeyCode::Char('q'), KeyModifiers::CONTROL, 61_000.0);
    settle(&mut app);
    assert!(!app.quitting());
    assert_eq!(app.overlay().name(), "confirm-quit");
    let screen = render(&mut app, 80, 30);
    assert!(screen.contains("save it to another path") && screen.contains("quit anyway"), "{screen}");
    // Esc cancels; q quits anyway, and what was lost is reported.
    key(&mut app, KeyCode::Esc, KeyModifiers::NONE, 61_000.0);
    assert!(!app.quitting());
    key(&mut app, KeyCode::Char('q'), KeyModifiers::CONTROL, 62_000.0);
    settle(&mut app);
    key(&mut app, KeyCode::Char('q'), KeyModifiers::NONE, 62_000.0);
    assert!(app.quitting());
    let loss = app.loss_report().expect("a loss report");
    assert!(loss.contains("(1 turn)") && loss.contains("no copy was written"), "{loss}");
}

#[test]
fn saving_to_another_path_after_a_failure_keeps_the_work() {
    let (dir, mut app) = unsavable();
    answer_turn(&mut app, "Is 91 prime?", "No.", 0.0);
    settle(&mut app);
    key(&mut app, KeyCode::Char('q'), KeyModifiers::CONTROL, 1.0);
    settle(&mut app);
    key(&mut app, KeyCode::Char('s'), KeyModifiers::NONE, 1.0);
    assert_eq!(app.overlay().name(), "save-as");
    let target = dir.path().join("rescued.json");
    // Replace the suggested path with ours: Ctrl+U clears the field (as in a shell), then a paste.
    key(&mut app, KeyCode::Char('u'), KeyModifiers::CONTROL, 1.0);
    match app.overlay() {
        deltascope::tui::app::Overlay::SaveAs { input, .. } => assert_eq!(input.lines(), [""], "Ctrl+U cleared it"),
        other => panic!("{}", other.name()),
    }
    app.update(Inbound::Term(Event::Paste(target.display().to_string())), 1.0);
    key(&mut app, KeyCode::Enter, KeyModifiers::NONE, 1.0);
    settle(&mut app);
    assert!(app.quitting(), "saved, so it quits");
    assert!(app.loss_report().is_none());
    assert_eq!(Session::load(&target).unwrap().turns.len(), 1);
}

#[test]
fn a_session_directory_that_cannot_be_used_falls_back_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let state = dir.path().join("state");
    // SAFETY: the only test in this binary that reads or writes XDG_STATE_HOME.
    unsafe { std::env::set_var("XDG_STATE_HOME", &state) };
    let chosen = SessionsDir::choose(Some(file.clone()));
    assert_eq!(chosen.path, Some(state.join("deltascope/sessions")));
    let why = chosen.fallback.clone().unwrap();
    assert!(why.contains("a-file") && why.contains("not a directory") && why.contains("state"), "{why}");
    // The first screen and the status line say so.
    let mut app = App::new(AppConfig {
        theme: Theme::default(),
        keymap: Keymap::default(),
        settings: app().settings().clone(),
        sessions_dir: chosen,
        session_path: None,
        session: Session::new("embedded:demo", None),
    });
    app.set_model(model());
    let screen = render(&mut app, W, H);
    assert!(screen.contains("⚠ sessions cannot be saved in"), "{screen}");
    assert!(app.messages().items.iter().any(|m| m.text == why), "the message log has it whole");
    assert!(screen.contains("sessions →"), "{screen}");
}

#[test]
fn opening_a_session_and_quitting_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut app0 = app();
    answer_turn(&mut app0, "Is 91 prime?", "No.", 0.0);
    // Hand-formatted: pretty-printed, as a person would keep it under version control.
    let path = dir.path().join("hand.json");
    let pretty = serde_json::to_string_pretty(app0.session()).unwrap();
    std::fs::write(&path, &pretty).unwrap();
    let mut app = app();
    app.set_sessions_dir(dir.path().to_path_buf());
    app.open_session(&path, false);
    settle(&mut app);
    assert_eq!(app.session().turns.len(), 1);
    key(&mut app, KeyCode::Char('q'), KeyModifiers::CONTROL, 1.0);
    assert!(settle(&mut app).is_empty());
    assert!(app.quitting(), "nothing changed: quit at once");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), pretty, "the file is untouched");
    // Nothing else was written but the window's claim on the file (`.hand.json.lock`).
    let names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    assert!(
        names.iter().all(|n| n == "hand.json" || n == ".hand.json.lock"),
        "and nothing else was written: {names:?}"
    );
}

/// The shell's line keys in every text field. In the prompt box: Ctrl+W deletes the word before
/// the cursor, Ctrl+A / Ctrl+E go to the start / end of the line (while typing, Ctrl+E is not
/// the key that edits the shown turn's prompt), Ctrl+U deletes to the start. In the quit
/// dialog the suggested path is selected, so typing replaces it; Ctrl+A / Ctrl+E keep it to edit.
#[test]
fn text_fields_take_the_shells_line_keys() {
    let mut app = app();
    let text = |app: &App| app.composer().input.lines().join("\n");
    type_text(&mut app, "sort these numbers", 0.0);
    key(&mut app, KeyCode::Char('w'), KeyModifiers::CONTROL, 0.0);
    assert_eq!(text(&app), "sort these ");
    key(&mut app, KeyCode::Char('a'), KeyModifiers::CONTROL, 0.0);
    type_text(&mut app, "X", 0.0);
    key(&mut app, KeyCode::Char('e'), KeyModifiers::CONTROL, 0.0);
    type_text(&mut app, "!", 0.0);
    assert_eq!(text(&app), "Xsort these !");
    assert_eq!(app.overlay().name(), "none", "Ctrl+E ended the line; it did not open the prompt editor");
    key(&mut app, KeyCode::Left, KeyModifiers::NONE, 0.0);
    key(&mut app, KeyCode::Char('u'), KeyModifiers::CONTROL, 0.0);
    assert_eq!(text(&app), "!", "Ctrl+U deleted to the start of the line");

    let (_dir, mut app) = unsavable();
    answer_turn(&mut app, "Is 91 prime?", "No.", 0.0);
    settle(&mut app);
    key(&mut app, KeyCode::Char('q'), KeyModifiers::CONTROL, 1.0);
    settle(&mut app);
    key(&mut app, KeyCode::Char('s'), KeyModifiers::NONE, 1.0);
    let field = |app: &App| match app.overlay() {
        deltascope::tui::app::Overlay::SaveAs { input, .. } => input.lines().join("\n"),
        other => panic!("{}", other.name()),
    };
    let suggested = field(&app);
    assert!(suggested.ends_with(".json"), "{suggested}");
    type_text(&mut app, "/tmp/mine.json", 1.0);
    assert_eq!(field(&app), "/tmp/mine.json", "typing replaced the selected suggestion");
    key(&mut app, KeyCode::Char('a'), KeyModifiers::CONTROL, 1.0);
    type_text(&mut app, "~", 1.0);
    key(&mut app, KeyCode::Char('e'), KeyModifiers::CONTROL, 1.0);
    key(&mut app, KeyCode::Char('w'), KeyModifiers::CONTROL, 1.0);
    assert_eq!(field(&app), "~/tmp/mine.", "Ctrl+A, Ctrl+E and Ctrl+W in the path field");
}
