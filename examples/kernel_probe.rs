//! Probe: the decode GEMV kernels called directly on this thread, no thread pool: their
//! arithmetic rate on one core, from cache for small shapes (`gemv_probe` times whole `Linear`
//! calls on the pool, whose hand-offs dominate small shapes).
//!
//!     cargo run --release --example kernel_probe -- OUT IN     # default 256 1024 (256 KB of FP8)
//!
//! `REPS=N` calls per timing (default 2000), `ROWS=R` activation rows (default 1); the best of
//! five timings, in weights a second (each weight read once a call, whatever R).
use deltascope_model::cpu::Simd;
use deltascope_model::cpu::{self as gemv, Fp8Rows, PairKernel, PairRows, WeightRow};
use deltascope_model::fp8;
use std::time::Instant;

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (out, inp) = (a.first().copied().unwrap_or(256), a.get(1).copied().unwrap_or(1024));
    let reps: usize = std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(2000);
    let simd = Simd::detect();
    let value = |i: usize| half::bf16::from_f32(((i * 7919) % 2003) as f32 / 997.0 - 1.0);
    let values: Vec<f32> = (0..out * inp).map(|i| value(i).to_f32()).collect();
    let (q, scales) = fp8::quantize(&values, out, inp);
    let grid: Vec<f32> = scales.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect();
    let bf16: Vec<u16> = values.iter().map(|&v| half::bf16::from_f32(v).to_bits()).collect();
    let rows: usize = std::env::var("ROWS").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let xs: Vec<Vec<f32>> = (0..rows)
        .map(|r| (0..inp).map(|i| half::bf16::from_f32((i as f32 * 0.37 + r as f32).sin()).to_f32()).collect())
        .collect();
    let x: Vec<&[f32]> = xs.iter().map(|v| v.as_slice()).collect();
    let pairs = PairRows::new(PairKernel::active(), &x, inp);
    let mut y = vec![0f32; out * rows];
    println!(
        "[{out}, {inp}] x {rows} activation rows, kernels {} / bf16 pairs {}, {reps} calls per timing",
        simd.name(),
        PairKernel::active().name()
    );
    let mut timed = |name: &str, f: &dyn Fn(&mut [f32])| {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..reps {
                f(&mut y);
                std::hint::black_box(&y);
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("{name:<28} {:6.2} G weights/s", (out * inp * reps) as f64 / best / 1e9);
    };
    timed("f32 weights, f32 order", &|y| gemv::gemv_rows(simd, WeightRow::F32(&values), inp, &x, y));
    timed("bf16 weights, f32 order", &|y| gemv::gemv_rows(simd, WeightRow::Bf16(&bf16), inp, &x, y));
    timed("bf16 weights, pair order", &|y| gemv::pairs_rows(&bf16, &pairs, y));
    let w = Fp8Rows { q: &q, grid: &grid, row0: 0 };
    timed("FP8 weights, f32 order", &|y| gemv::fp8_rows(simd, w, inp, &x, y));
    if gemv::fp8_pairs_available() {
        timed("FP8 weights, pair order", &|y| gemv::fp8_pairs_rows(w, inp, &pairs, y));
    }
}
