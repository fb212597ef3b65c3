//! Sessions: atomic save, load, Markdown export, replay with the original timing, and the
//! example sessions shipped in `sessions/` (one per failure mode of design.md §1).
//!
//! The examples are made by the demo model, not by hand:
//! `cargo test --release --test sessions -- --ignored make_example_sessions`.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use deltascope::session::{Session, Turn, list_sessions};
use deltascope::tui::event::Inbound;
use deltascope_protocol::{DiagnosticKind, DraftKind, FinishReason, Phase};

fn examples_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sessions")
}

fn recorded_app_session() -> Session {
    let mut app = app();
    healthy_turn(&mut app, true);
    app.session().clone()
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
    let mut copy = Turn::new(orig.user.clone(), orig.params.clone());
    for (t, e) in &events {
        copy.apply(e, *t);
    }
    assert_eq!(&copy, orig);

    // Through the app: nothing shows before its time, everything once the last event is due.
    let mut app = app();
    app.start_replay(s.clone());
    app.update(Inbound::Tick, 0.0);
    assert_eq!(app.session().turns.len(), 1);
    assert!(app.session().turns[0].tokens.is_empty() || app.session().turns[0].tokens[0].t_ms <= 0.0);
    let half = orig.tokens[orig.tokens.len() / 2].t_ms;
    app.update(Inbound::Tick, half);
    let n = app.session().turns[0].tokens.len();
    assert!(n > 0 && n < orig.tokens.len(), "{n} of {} tokens at the half-way time", orig.tokens.len());
    app.update(Inbound::Tick, 10_000.0);
    assert!(!app.replaying());
    assert_eq!(app.session().turns[0], *orig);
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
            let mut copy = Turn::new(t.user.clone(), t.params.clone());
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
                  tweak: &dyn Fn(&mut deltascope_protocol::GenerationParams)| {
        // The command line's defaults (loop thresholds, MTP depth), greedy.
        let mut args = ChatArgs::default().generation;
        args.temperature = Some(0.0);
        let mut params = args.checked().unwrap().resolve(backend.info()).unwrap();
        params.top_logprobs = 5;
        tweak(&mut params);
        if !thinking {
            params.thinking = deltascope_protocol::Thinking::Off;
        }
        let prompt =
            if raw { Prompt::Text(user.to_string()) } else { Prompt::Chat(vec![ChatMessage::new(Role::User, user)]) };
        let mut session = Session::new(backend.info().name.clone(), None);
        session.id = Path::new(file).file_stem().unwrap().to_string_lossy().to_string();
        let mut turn = Turn::new(user, params.clone());
        let t0 = std::time::Instant::now();
        let generation = backend.start(ChatRequest { prompt, params }).unwrap();
        generation.for_each(|ev| turn.apply(ev, t0.elapsed().as_secs_f64() * 1000.0));
        session.turns.push(turn);
        // Regenerating replaces the shipped file: save_atomic keeps a different session it would
        // overwrite (it writes a `.conflict-…` copy instead), which is right for a user's file
        // and not for this one.
        let path = examples_dir().join(file);
        let _ = std::fs::remove_file(&path);
        session.save_atomic(&path).unwrap();
        session
    };
    let h = record("healthy.json", "Is 91 prime?", false, true, &|_| {});
    let s = record("starved-by-max-tokens.json", "Is 199 prime?", false, true, &|p| p.max_tokens = 24);
    // A repetition penalty below 1 rewards tokens already produced, as a broken kernel can:
    // the demo model falls into a many-token loop inside its thinking until max_tokens (v5 at
    // 0.4: a loop that drifts, "739 + 939 = 939", "839 + 939 = 939", …, from token 116; at 0.5,
    // v4's setting, v5 ends its thinking and loops in the answer instead).
    let l = record("degenerate-loop.json", "What is 482 + 739?", false, true, &|p| {
        p.max_tokens = 400;
        p.sampling.repetition_penalty = 0.4;
    });
    for s in [&h, &s, &l] {
        let t = &s.turns[0];
        eprintln!("{}: {:?} {:?} {:?}", s.id, t.finish_reason, t.answer, t.diagnostics);
    }
    // The recorded files must show what they are named for.
    shipped_examples_show_each_failure_mode();
}

/// A long turn with MTP: every token with 3 alternatives, a stats sample every 10 tokens.
fn long_turn(tokens: usize) -> Turn {
    let p = params(tokens + 10, None);
    let mut t = Turn::new("Sort 93, 17, 56, 41, 8, 72.", p.clone());
    t.apply(&start(16, &p), 1.0);
    for i in 0..tokens {
        let phase = if i < tokens / 2 { Phase::Thinking } else { Phase::Answer };
        t.apply(&token(i, phase, " 17", -0.25 - i as f32 / 1e4, DraftKind::Accepted, false), 2.0 + i as f64);
        if i % 10 == 9 {
            let generated = i + 1;
            let thinking = generated.min(tokens / 2);
            t.apply(&stats(generated, thinking, generated - thinking, 611.5, generated / 2), 2.0 + i as f64);
        }
    }
    t.apply(&done(FinishReason::Stop, 16, tokens / 2, tokens - tokens / 2, "", ""), 3.0 + tokens as f64);
    t
}

fn file_bytes(turn: Turn) -> (usize, Session) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Session::new("embedded:demo", None);
    s.turns.push(turn);
    let path = dir.path().join("s.json");
    s.save_atomic(&path).unwrap();
    (std::fs::metadata(&path).unwrap().len() as usize, Session::load(&path).unwrap())
}

/// Tokens are stored as columns, and stats samples do not repeat the MTP history of the one
/// before: the file grows linearly with the turn (the example sessions as shipped before format 3,
/// kept in tests/fixtures/sessions-v2 — written one object per token with every sample's full
/// history — shrink by half), and it replays to the same events.
#[test]
fn sessions_are_compact_and_grow_linearly() {
    let old_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/sessions-v2");
    for name in ["healthy.json", "degenerate-loop.json"] {
        let file = old_dir.join(name);
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.starts_with("{\"version\":1,"), "{name}: a file of the old format");
        let old = text.len();
        let s = Session::load(&file).unwrap();
        let tokens: usize = s.turns.iter().map(|t| t.tokens.len()).sum();
        let (new, back) = file_bytes(s.turns[0].clone());
        assert_eq!(back.turns[0], s.turns[0]);
        eprintln!("{name}: {} → {} bytes per token", old / tokens, new / tokens);
        assert!(new * 100 <= old * 55, "{name}: {old} → {new} bytes");
        assert!(new / tokens <= 230, "{name}: {} bytes per token", new / tokens);
    }
    // The shipped examples are written in the compact format (the 24-token one is mostly its
    // settings, so only the longer two are held to the per-token size).
    for name in ["healthy.json", "degenerate-loop.json", "starved-by-max-tokens.json"] {
        let text = std::fs::read_to_string(examples_dir().join(name)).unwrap();
        assert!(text.starts_with("{\"version\":4,"), "{name} is not in format 4");
        let tokens: usize = example(name).turns.iter().map(|t| t.tokens.len()).sum();
        if tokens >= 100 {
            assert!(text.len() / tokens <= 230, "{name}: {} bytes per token", text.len() / tokens);
        }
    }
    let (short, _) = file_bytes(long_turn(1500));
    let (long, back) = file_bytes(long_turn(3000));
    assert!(long * 100 < short * 215, "3000 tokens take {long} bytes, 1500 take {short}: not linear");
    // The replay rebuilds each sample's history exactly as the engine sent it.
    let original = long_turn(3000);
    let replayed = back.turns[0].replay_events();
    let sent: Vec<_> = replayed
        .iter()
        .filter_map(|(_, e)| match e {
            deltascope_protocol::EngineEvent::Stats(s) => s.mtp.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(sent.len(), 300);
    for (i, m) in sent.iter().enumerate() {
        assert_eq!(m.history, common::mtp((i + 1) * 5).history, "sample {i}");
    }
    assert_eq!(back.turns[0], original);
}

/// A save that fails part-way (here: a file-size limit, as a full disk) keeps the old file and
/// leaves no partial temporary file behind.
#[test]
fn a_failed_write_keeps_the_old_file_and_no_temporary_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.json");
    let mut small = Session::new("embedded:demo", None);
    small.id = "small".into();
    small.save_atomic(&path).unwrap();
    let before = std::fs::read(&path).unwrap();
    // The child saves a big session under a 512-byte file-size limit (SIGXFSZ ignored, so the
    // write fails with EFBIG like a full disk) and checks the error.
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 1; exec \"$0\" --exact child_saves_under_a_size_limit --ignored --nocapture")
        .arg(&exe)
        .env("DELTASCOPE_TEST_SAVE_TO", &path)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && log.contains("1 passed"), "{log}");
    assert!(log.contains("File too large"), "{log}");
    assert_eq!(std::fs::read(&path).unwrap(), before, "the old session is intact");
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("s.json")], "no temporary file stays");
}

#[test]
#[ignore = "run by a_failed_write_keeps_the_old_file_and_no_temporary_file in a child process"]
fn child_saves_under_a_size_limit() {
    let path = PathBuf::from(std::env::var_os("DELTASCOPE_TEST_SAVE_TO").expect("run by the parent test"));
    // This process continues the session in the file (it read it), as a resumed window does.
    Session::load(&path).unwrap();
    let mut s = Session::new("embedded:demo", None);
    s.turns.push(long_turn(200));
    let e = s.save_atomic(&path).unwrap_err().to_string();
    eprintln!("{e}");
    assert!(e.starts_with(&format!("cannot write session {}", path.display())), "{e}");
}

/// `kill -9` at any moment of a save leaves a whole session: the old one or the new one.
#[test]
fn a_kill_mid_save_leaves_a_whole_session() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.json");
    let exe = std::env::current_exe().unwrap();
    for delay_ms in [5u64, 23, 41, 67, 90, 130] {
        let mut child = std::process::Command::new(&exe)
            .args(["--exact", "child_saves_in_a_loop", "--ignored"])
            .env("DELTASCOPE_TEST_SAVE_TO", &path)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // Wait until it has written once, then kill it somewhere in a later write.
        while !path.exists() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        let s = Session::load(&path).unwrap_or_else(|e| panic!("after a kill at {delay_ms} ms: {e}"));
        assert!(!s.turns.is_empty());
    }
}

#[test]
#[ignore = "run by a_kill_mid_save_leaves_a_whole_session in a child process"]
fn child_saves_in_a_loop() {
    let path = PathBuf::from(std::env::var_os("DELTASCOPE_TEST_SAVE_TO").expect("run by the parent test"));
    // Each child continues the file the one before it left (it reads it first, as a resumed
    // window does), so every save goes to `path` itself.
    if path.exists() {
        Session::load(&path).unwrap();
    }
    let mut s = Session::new("embedded:demo", None);
    loop {
        s.turns.push(long_turn(400));
        assert_eq!(s.save_atomic(&path).unwrap(), deltascope::session::Saved::Written);
    }
}

/// Fields a newer build wrote survive a rewrite at the levels that keep them (session, turn);
/// deeper ones make the save refuse to overwrite the file, saying which.
#[test]
fn fields_this_build_does_not_know_are_kept_or_the_file_is_not_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.json");
    let mut s = recorded_app_session();
    s.save_atomic(&path).unwrap();
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    v["title"] = "from a newer build".into();
    v["turns"][0]["rating"] = 5.into();
    std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
    let mut back = Session::load(&path).unwrap();
    assert!(back.unknown_fields.is_empty(), "{:?}", back.unknown_fields);
    back.system = Some("be brief".into());
    back.save_atomic(&path).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!((v["title"].as_str(), v["turns"][0]["rating"].as_u64()), (Some("from a newer build"), Some(5)));
    assert_eq!(v["system"], "be brief");

    let mut v = v;
    v["turns"][0]["params"]["sampling"]["typical_p"] = 0.9.into();
    let text = serde_json::to_string_pretty(&v).unwrap();
    std::fs::write(&path, &text).unwrap();
    let mut back = Session::load(&path).unwrap();
    assert_eq!(back.unknown_fields, ["turns[0].params.sampling.typical_p"]);
    s.system = None;
    back.system = None;
    let e = back.save_atomic(&path).unwrap_err().to_string();
    assert_eq!(
        e,
        format!(
            "not overwriting {}: it has fields this build does not know (turns[0].params.sampling.typical_p), which a rewrite would drop; save to another file",
            path.display()
        )
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text, "the file is as it was");
    // Another path is fine.
    back.save_atomic(&dir.path().join("copy.json")).unwrap();
}

/// Settings read from a session are checked like the flags, naming the file and the field.
#[test]
fn bad_settings_in_a_session_name_the_file_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.json");
    recorded_app_session().save_atomic(&path).unwrap();
    let good: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    for (field, value, message) in [
        (
            "temperature",
            serde_json::json!(-5.0),
            "turns[0].params.sampling.temperature = -5: must be in [0, 100] (0 is greedy)",
        ),
        ("top_p", serde_json::json!(7.0), "turns[0].params.sampling.top_p = 7: must be in (0, 1]"),
        ("max_tokens", serde_json::json!(0), "turns[0].params.max_tokens = 0: must be at least 1"),
    ] {
        let mut v = good.clone();
        match field {
            "max_tokens" => v["turns"][0]["params"]["max_tokens"] = value,
            f => v["turns"][0]["params"]["sampling"][f] = value,
        }
        std::fs::write(&path, serde_json::to_vec(&v).unwrap()).unwrap();
        let e = Session::load(&path).unwrap_err().to_string();
        assert_eq!(e, format!("{}: {message}", path.display()));
    }
}

/// Format 3 counted the tokens a thinking budget forced inside the thinking and answer counts
/// as well; read now, they are counted apart, and a format-4 file is read as it is.
#[test]
fn a_format_3_file_counts_forced_tokens_apart_when_read() {
    let p = params(256, Some(1));
    let mut turn = Turn::new("Is 97 prime?", p.clone());
    turn.apply(&start(5, &p), 0.0);
    let toks = [
        (Phase::Thinking, "97 / 2", false),
        (Phase::Thinking, "Considering the limited time…", true),
        (Phase::Thinking, "</think>", true),
        (Phase::Answer, "\n\n", true),
        (Phase::Answer, "97 is prime.", false),
    ];
    for (i, (phase, text, forced)) in toks.into_iter().enumerate() {
        turn.apply(&token(i, phase, text, if forced { 0.0 } else { -0.1 }, DraftKind::None, forced), 1.0 + i as f64);
    }
    let mut end = done(FinishReason::Stop, 5, 3, 2, "97 / 2", "97 is prime.");
    if let deltascope_protocol::EngineEvent::Done(d) = &mut end {
        d.usage.forced_tokens = 3;
    }
    turn.apply(&end, 9.0);
    let dir = tempfile::tempdir().unwrap();
    let mut s = Session::new("embedded:demo", None);
    s.turns.push(turn);
    s.version = 3;
    let old = dir.path().join("v3.json");
    s.save_atomic(&old).unwrap();
    let t = &Session::load(&old).unwrap().turns[0];
    assert_eq!((t.thinking_tokens(), t.forced_tokens(), t.answer_tokens(), t.completion_tokens()), (1, 3, 1, 5));

    s.version = 4;
    let new = dir.path().join("v4.json");
    s.save_atomic(&new).unwrap();
    let t = &Session::load(&new).unwrap().turns[0];
    assert_eq!((t.thinking_tokens(), t.forced_tokens(), t.answer_tokens()), (3, 3, 2), "format 4 is read as it is");
}
