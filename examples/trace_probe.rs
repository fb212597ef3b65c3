//! Probe: what the state trace costs a decode step. One-token forwards with the trace off and
//! on, interleaved (off, on, off, on, …) from the same state, on a model directory; medians and
//! the difference.
//!
//! usage: cargo run --release --example trace_probe -- MODEL_DIR [f32|bf16]   (ITERS=40)
use deltascope_model::{ForwardOptions, LoadOptions};
use deltascope_model::{Model, ModelSource, Precision};
use std::time::Instant;

fn main() {
    let dir = std::env::args().nth(1).expect("model dir");
    let prec = Precision::parse(&std::env::args().nth(2).unwrap_or("bf16".into())).unwrap();
    let src = ModelSource::Dir(dir.into());
    let model = Model::load(&src, &LoadOptions { precision: prec, skip_mtp: true, progress: None }).unwrap();
    let mut state = model.new_state();
    let vocab = model.config().vocab_size as u32;
    let prompt: Vec<u32> = (0..64).map(|i| (100 + i * 7) % vocab).collect();
    model.forward(&prompt, &mut state, ForwardOptions::default()).unwrap();
    let iters: usize = std::env::var("ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(40);
    let (mut off, mut on) = (vec![], vec![]);
    for i in 0..iters + 2 {
        for trace in [false, true] {
            let mut s = state.clone();
            let opts = ForwardOptions { trace_state: trace, ..Default::default() };
            let t = Instant::now();
            let out = model.forward(&[(300 + i as u32 % 50) % vocab], &mut s, opts).unwrap();
            let ms = t.elapsed().as_secs_f64() * 1e3;
            std::hint::black_box(out);
            // The first two rounds warm caches and pages up.
            if i >= 2 {
                if trace { on.push(ms) } else { off.push(ms) }
            }
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.total_cmp(b));
        (v[v.len() / 2], v[v.len() / 4], v[v.len() * 3 / 4])
    };
    let (a, a1, a3) = med(&mut off);
    let (b, b1, b3) = med(&mut on);
    println!("decode step, trace off: median {a:.2} ms (quartiles {a1:.2}–{a3:.2})");
    println!("decode step, trace on:  median {b:.2} ms (quartiles {b1:.2}–{b3:.2})");
    println!("trace cost: {:+.2} ms per token, {:+.1} % of the step", b - a, (b / a - 1.0) * 100.0);
}
