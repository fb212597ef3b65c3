//! Sessions: atomic save, load, Markdown export, replay with the original timing, and the
//! example sessions shipped in `sessions/` (one per failure mode of design.md §1).
//!
//! The examples are made by the demo model, not by hand:
//! `cargo test --release --test sessions -- --ignored make_example_sessions`.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use deltascope::backend::{DiagnosticKind, FinishReason};
use deltascope::session::{Session, Turn, list_sessions};
use deltascope::tui::event::Inbound;

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sessions")
}

fn recorded_app_session() -> Session {
    let mut app = app();
    healthy_turn(&mut app, true);
    app.convo.session.clone()
}

#[test]
fn save_is_atomic_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let s = recorded_app_session();
    let path = dir.path().join("nested/dir/s.json");
    s.save_atomic(&path).unwrap();
    // Saving again replaces the file in one rename; no temporary file stays behind.
    s.save_atomic(&path).unwrap();
    let names: Vec<_> = std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("s.json")]);
    let back = Session::load(&path).unwrap();
    assert_eq!(back, s);
    // Saving an unchanged session leaves the file alone (same inode); a change replaces it.
    use std::os::unix::fs::MetadataExt;
    let inode = || std::fs::metadata(&path).unwrap().ino();
    let before = inode();
    back.save_atomic(&path).unwrap();
    assert_eq!(inode(), before, "an unchanged session was rewritten");
    let mut changed = back.clone();
    changed.system = Some("be brief".into());
    changed.save_atomic(&path).unwrap();
    assert_ne!(inode(), before);
    assert_eq!(Session::load(&path).unwrap(), changed);
    s.save_atomic(&path).unwrap();
    let t = &back.turns[0];
    assert!(t.tokens.len() > 20 && t.tokens.iter().all(|x| x.top_logprobs.len() == 3));
    assert_eq!(t.finish_reason, Some(FinishReason::Stop));
    assert!(!t.stats.samples.is_empty());
    assert_eq!(list_sessions(path.parent().unwrap()).len(), 1);
}

#[test]
fn load_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.json");
    std::fs::write(&p, "{\"version\": 1, \"id\": 3}").unwrap();
    let e = Session::load(&p).unwrap_err().to_string();
    assert!(e.starts_with(&format!("{} is not a deltascope session", p.display())), "{e}");
    let e = Session::load(&dir.path().join("missing.json")).unwrap_err().to_string();
    assert!(e.starts_with("cannot read session"), "{e}");
    let mut s = recorded_app_session();
    s.version = 99;
    s.save_atomic(&p).unwrap();
    assert!(Session::load(&p).unwrap_err().to_string().contains("format version 99"));
}

/// The picker lists every `.json` file: sessions newest first (header and first prompt only),
/// then files it cannot open, each with the reason, so nothing looks lost.
#[test]
fn listing_keeps_unreadable_files_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut old = recorded_app_session();
    old.id = "old".into();
    old.created = 1_000;
    old.save_atomic(&dir.path().join("old.json")).unwrap();
    let mut new = old.clone();
    new.id = "new".into();
    new.created = 2_000;
    new.turns.push(new.turns[0].clone());
    new.save_atomic(&dir.path().join("new.json")).unwrap();
    std::fs::write(dir.path().join("broken.json"), "{\"version\": 1, \"id\": ").unwrap();
    let mut future = old.clone();
    future.version = 99;
    future.save_atomic(&dir.path().join("future.json")).unwrap();
    std::fs::write(dir.path().join("notes.md"), "not a session").unwrap();

    let list = list_sessions(dir.path());
    let ids: Vec<&str> = list.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["new", "old", "broken", "future"]);
    assert_eq!((list[0].turns, list[0].first_prompt.as_str()), (2, "Is 91 prime?"));
    assert!(list[0].error.is_none() && list[1].error.is_none());
    let broken = list[2].error.as_deref().unwrap();
    assert!(broken.contains("broken.json is not a deltascope session"), "{broken}");
    let future = list[3].error.as_deref().unwrap();
    assert!(future.contains("session format version 99"), "{future}");
}

#[test]
fn markdown_export() {
    let md = recorded_app_session().to_markdown();
    assert!(md.starts_with("# deltascope session test-session"));
    assert!(md.contains("**User:** Is 91 prime?"));
    assert!(md.contains("> 91 / 7 = 13 r 0"), "thinking is quoted:\n{md}");
    assert!(md.contains("No, **91 = 7 × 13**, so 91 is not prime."));
    assert!(md.contains("| 256 | unlimited |"), "{md}");
    assert!(md.contains("finish: **stop**"));
    assert!(md.contains("MTP acceptance"));
}

#[test]
fn replay_reproduces_the_turn_with_its_timing() {
    let s = recorded_app_session();
    let orig = &s.turns[0];
    let events = orig.replay_events();
    assert!(events.windows(2).all(|w| w[0].0 <= w[1].0), "events are in time order");
    let mut copy = Turn::new(orig.user.clone(), orig.enable_thinking, orig.params.clone());
    for (t, e) in &events {
        copy.apply(e, *t);
    }
    assert_eq!(&copy, orig);

    // Through the app: nothing shows before its time, everything once the last event is due.
    let mut app = app();
    app.start_replay(s.clone());
    app.update(Inbound::Tick, 0.0);
    assert_eq!(app.convo.session.turns.len(), 1);
    assert!(app.convo.session.turns[0].tokens.is_empty() || app.convo.session.turns[0].tokens[0].t_ms <= 0.0);
    let half = orig.tokens[orig.tokens.len() / 2].t_ms;
    app.update(Inbound::Tick, half);
    let n = app.convo.session.turns[0].tokens.len();
    assert!(n > 0 && n < orig.tokens.len(), "{n} of {} tokens at the half-way time", orig.tokens.len());
    app.update(Inbound::Tick, 10_000.0);
    assert!(app.convo.replay.is_none());
    assert_eq!(app.convo.session.turns[0], *orig);
}

fn example(name: &str) -> Session {
    Session::load(&examples_dir().join(name)).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn shipped_examples_show_each_failure_mode() {
    let healthy = example("healthy.json");
    let t = &healthy.turns[0];
    assert_eq!(t.finish_reason, Some(FinishReason::Stop));
    assert!(t.thinking_tokens() > 10 && t.answer.contains("not prime"), "{}", t.answer);
    assert!(t.diagnostics.is_empty());

    let starved = example("starved-by-max-tokens.json");
    let t = &starved.turns[0];
    assert_eq!(t.finish_reason, Some(FinishReason::Length));
    assert!(t.answer.trim().is_empty());
    assert!(t.diagnostics.iter().any(|d| d.kind == DiagnosticKind::ThinkingExhaustedMaxTokens));

    let looping = example("degenerate-loop.json");
    let t = &looping.turns[0];
    // A loop of many tokens (like "2 + 2 = 2.2 + 2 = 2.…"), not one token stuck.
    assert!(
        t.diagnostics.iter().any(|d| d.kind == DiagnosticKind::DegenerateLoop && d.period.is_some_and(|p| p >= 4)),
        "{:?}",
        t.diagnostics
    );
    assert!(t.answer.trim().is_empty(), "the loop ate the answer: {}", t.answer);

    // Each replays to itself.
    for s in [&healthy, &starved, &looping] {
        for t in &s.turns {
            let mut copy = Turn::new(t.user.clone(), t.enable_thinking, t.params.clone());
            copy.compare_of = t.compare_of;
            for (at, e) in t.replay_events() {
                copy.apply(&e, at);
            }
            assert_eq!(&copy, t);
        }
    }
    assert!(list_sessions(&examples_dir()).len() >= 3);
}

/// Runs the demo model through the engine and records the example sessions.
#[test]
#[ignore = "regenerates sessions/*.json with the demo model"]
fn make_example_sessions() {
    use deltascope::backend::local::{LocalBackend, LocalSpec};
    use deltascope::backend::{Backend, ChatMessage, ChatRequest, OpenProgress, Prompt, Role};
    use deltascope::cli::chat::ChatArgs;

    let backend = LocalBackend::open(&LocalSpec::new(None, "f32").unwrap(), &|_: OpenProgress| {}).unwrap();
    let record = |file: &str,
                  user: &str,
                  raw: bool,
                  thinking: bool,
                  tweak: &dyn Fn(&mut deltascope::backend::GenerationParams)| {
        // The command line's defaults (loop thresholds, MTP depth), greedy.
        let mut args = ChatArgs::default().generation;
        args.temperature = Some(0.0);
        let mut params = args.overrides().resolve(backend.info()).unwrap();
        params.top_logprobs = 5;
        tweak(&mut params);
        let prompt =
            if raw { Prompt::Text(user.to_string()) } else { Prompt::Chat(vec![ChatMessage::new(Role::User, user)]) };
        let mut session = Session::new(backend.info().name.clone(), None);
        session.id = Path::new(file).file_stem().unwrap().to_string_lossy().to_string();
        let mut turn = Turn::new(user, thinking, params.clone());
        let t0 = std::time::Instant::now();
        let generation = backend.start(ChatRequest { prompt, enable_thinking: thinking, params }).unwrap();
        generation.for_each(|ev| turn.apply(ev, t0.elapsed().as_secs_f64() * 1000.0));
        session.turns.push(turn);
        session.save_atomic(&examples_dir().join(file)).unwrap();
        session
    };
    let h = record("healthy.json", "Is 91 prime?", false, true, &|_| {});
    let s = record("starved-by-max-tokens.json", "Is 199 prime?", false, true, &|p| p.max_tokens = 24);
    // A repetition penalty below 1 rewards tokens already produced, as a broken kernel can:
    // the demo model falls into a many-token loop inside its thinking until max_tokens.
    let l = record("degenerate-loop.json", "Sort 5, 2, 9, 1.", false, true, &|p| {
        p.max_tokens = 200;
        p.sampling.repetition_penalty = 0.6;
    });
    for s in [&h, &s, &l] {
        let t = &s.turns[0];
        eprintln!("{}: {:?} {:?} {:?}", s.id, t.finish_reason, t.answer, t.diagnostics);
    }
    // The recorded files must show what they are named for.
    shipped_examples_show_each_failure_mode();
}
