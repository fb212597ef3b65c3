//! Frame cost with a long transcript: one draw of the whole workbench through TestBackend with
//! a 10k-token turn (8k thinking + 2k markdown answer), in each colour mode. The TUI draws at
//! most ~60 frames per second, so a frame must stay well under 16 ms.
//!
//! cargo bench --bench frame

#[path = "../tests/common/mod.rs"]
mod common;

use common::*;
use criterion::{Criterion, criterion_group, criterion_main};
use deltascope_protocol::{DraftKind, FinishReason, Phase};
use ratatui::crossterm::event::{KeyCode, KeyModifiers};

fn long_transcript() -> deltascope::tui::app::App {
    let mut app = app();
    let p = params(16_000, None);
    ask(&mut app, "Is 9973 prime?", 0.0);
    engine(&mut app, start(20, &p), 1.0);
    let mut t = 2.0;
    for i in 0..8_000 {
        let piece = if i % 12 == 11 { "\n".to_string() } else { format!("9973 / {} ", i % 97 + 2) };
        engine(&mut app, token(i, Phase::Thinking, &piece, -0.1, DraftKind::Accepted, false), t);
        t += 0.5;
        if i % 8 == 7 {
            engine(&mut app, stats(i + 1, i + 1, 0, 640.0, (i + 1) / 3), t);
        }
    }
    let answer_line = ["No, **9973** is prime: ", "`no divisor` up to 99. ", "- checked ", "\n"];
    for i in 0..2_000 {
        engine(&mut app, token(8_000 + i, Phase::Answer, answer_line[i % 4], -0.2, DraftKind::Bonus, false), t);
        t += 0.5;
    }
    let (tt, at) = {
        let turn = app.shown().expect("a turn");
        (turn.thinking.clone(), turn.answer.clone())
    };
    engine(&mut app, done(FinishReason::Length, 20, 8_000, 2_000, &tt, &at), t);
    app
}

fn frame(c: &mut Criterion) {
    let mut app = long_transcript();
    let mut term = terminal(160, 48);
    // What drawing keeps between frames (the panes' wrapped lines), as the runner keeps it.
    let mut view = deltascope::tui::view::View::default();
    c.bench_function("frame_10k_tokens_markdown", |b| {
        b.iter(|| {
            term.draw(|f| {
                view.draw(&app, f);
            })
            .map(|_| ())
            .unwrap_or(())
        })
    });
    key(&mut app, KeyCode::Char('l'), KeyModifiers::CONTROL, 0.0);
    c.bench_function("frame_10k_tokens_logprob_colours", |b| {
        b.iter(|| {
            term.draw(|f| {
                view.draw(&app, f);
            })
            .map(|_| ())
            .unwrap_or(())
        })
    });
    // While streaming: every frame has new tokens (here one MTP step's worth, 3) after 8k
    // thinking tokens, so the panes' caches add to what they hold rather than reuse it whole.
    let mut app = streaming_transcript();
    let mut view = deltascope::tui::view::View::default();
    let mut i = 8_000;
    c.bench_function("frame_streaming_after_8k_tokens", |b| {
        b.iter(|| {
            for _ in 0..3 {
                let piece = if i % 12 == 11 { "\n".to_string() } else { format!("9973 / {} ", i % 97 + 2) };
                engine(&mut app, token(i, Phase::Thinking, &piece, -0.1, DraftKind::Accepted, false), i as f64);
                i += 1;
            }
            term.draw(|f| {
                view.draw(&app, f);
            })
            .map(|_| ())
            .unwrap_or(())
        })
    });
}

fn streaming_transcript() -> deltascope::tui::app::App {
    let mut app = app();
    let p = params(1_000_000, None);
    ask(&mut app, "Is 9973 prime?", 0.0);
    engine(&mut app, start(20, &p), 1.0);
    for i in 0..8_000 {
        let piece = if i % 12 == 11 { "\n".to_string() } else { format!("9973 / {} ", i % 97 + 2) };
        engine(&mut app, token(i, Phase::Thinking, &piece, -0.1, DraftKind::Accepted, false), i as f64);
    }
    app
}

criterion_group!(benches, frame);
criterion_main!(benches);
