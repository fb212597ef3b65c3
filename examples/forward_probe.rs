//! Probe: one forward of 1..=4 tokens (a decode step and MTP verify passes) on a model.
use deltascope_model::{ForwardOptions, LoadOptions, LogitsRows};
use deltascope_model::{Model, ModelSource, Precision};
use std::time::Instant;

fn main() {
    let dir = std::env::args().nth(1).expect("model dir");
    let prec = Precision::parse(&std::env::args().nth(2).unwrap_or("bf16".into())).unwrap();
    let src = ModelSource::Dir(dir.into());
    let model = Model::load(&src, &LoadOptions { precision: prec, skip_mtp: true, progress: None }).unwrap();
    let mut state = model.new_state();
    let prompt: Vec<u32> = (0..16).map(|i| 100 + i * 7).collect();
    model.forward(&prompt, &mut state, ForwardOptions::default()).unwrap();
    // One settled verify pass first, as in speculative decoding's steady state (its buffers
    // are reused by the next pass).
    let warm = ForwardOptions { logits: LogitsRows::All, verify: true, ..Default::default() };
    model.forward(&[200, 201, 202, 203], &mut state, warm).unwrap();
    state.accept(4).unwrap();
    let only: Option<usize> = std::env::args().nth(3).and_then(|a| a.parse().ok());
    let mut times: Vec<Vec<f64>> = vec![vec![]; 4];
    let iters: usize = std::env::var("ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    for _ in 0..iters {
        for rows in 1..=4usize {
            if only.is_some_and(|o| o != rows) {
                continue;
            }
            let mut s = state.clone();
            let ids: Vec<u32> = (0..rows as u32).map(|i| 300 + i).collect();
            let opts = ForwardOptions { logits: LogitsRows::All, verify: rows > 1, ..Default::default() };
            let t = Instant::now();
            let out = model.forward(&ids, &mut s, opts).unwrap();
            times[rows - 1].push(t.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box(out);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let base = if times[0].is_empty() { 1.0 } else { med(&mut times[0].clone()) };
    for (i, t) in times.iter_mut().enumerate().filter(|(_, t)| !t.is_empty()) {
        let m = med(t);
        println!("rows {}: median {:.1} ms ({:.2}x) min {:.1} max {:.1}", i + 1, m, m / base, t[0], t[t.len() - 1]);
    }
}
