//! Probe: a prefill of N tokens (default 512) on a model, repeated; prints each run's time and
//! tokens per second (for `perf record` of where prefill goes).
use deltascope_model::{ForwardOptions, LoadOptions};
use deltascope_model::{Model, ModelSource, Precision};
use std::time::Instant;

fn main() {
    let dir = std::env::args().nth(1).expect("model dir");
    let prec = Precision::parse(&std::env::args().nth(2).unwrap_or("bf16".into())).expect("precision");
    let n: u32 = std::env::args().nth(3).and_then(|a| a.parse().ok()).unwrap_or(512);
    let iters: usize = std::env::var("ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let src = ModelSource::Dir(dir.into());
    let model = Model::load(&src, &LoadOptions { precision: prec, skip_mtp: true, progress: None }).expect("load");
    let prompt: Vec<u32> = (0..n).map(|i| 100 + (i * 7919) % 5000).collect();
    for _ in 0..iters {
        let mut state = model.new_state();
        let t = Instant::now();
        let out = model.forward(&prompt, &mut state, ForwardOptions::default()).expect("forward");
        let s = t.elapsed().as_secs_f64();
        std::hint::black_box(out);
        println!("prefill {n}: {:.3} s, {:.1} tok/s", s, n as f64 / s);
    }
}
