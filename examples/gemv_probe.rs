//! Probe: GEMV throughput of the decode kernels on bf16 matrices (f32 with `F32_WEIGHTS=1`, FP8
//! in Qwen's block format with `FP8=1`) of one shape, cycling through enough copies that every call reads from memory (not the cache).
//!
//!     cargo run --release --example gemv_probe -- OUT IN
//!
//! `COPIES=1` times one matrix over and over (from cache when it fits: the kernels' arithmetic
//! rate; `REPS=N` calls per timing, default the copies or 8); `THREADS=1,2` and `ROWS=1,4` pick the thread counts and activation rows to time.
use deltascope_model::Weights;
use deltascope_model::cpu::Linear;
use deltascope_model::fp8::{self, Fp8Weights};
use deltascope_model::{Mat, Precision};
use std::time::Instant;

fn main() {
    let a: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (out, inp) = (a.first().copied().unwrap_or(248320), a.get(1).copied().unwrap_or(1024));
    let f32_weights = std::env::var("F32_WEIGHTS").is_ok_and(|v| v == "1");
    let fp8 = std::env::var("FP8").is_ok_and(|v| v == "1");
    let size = if fp8 {
        1
    } else if f32_weights {
        4
    } else {
        2
    };
    let from_memory = (1usize << 30).div_ceil(out * inp * size).max(1);
    let copies = std::env::var("COPIES").ok().and_then(|v| v.parse().ok()).unwrap_or(from_memory);
    let lins: Vec<Linear> = (0..copies)
        .map(|c| {
            let value = |i: usize| half::bf16::from_f32(((i * 7919 + c) % 2003) as f32 / 997.0 - 1.0);
            let weights = if fp8 {
                let values: Vec<f32> = (0..out * inp).map(|i| value(i).to_f32()).collect();
                let (q, scales) = fp8::quantize(&values, out, inp);
                let scales = scales.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect();
                Weights::Fp8(Fp8Weights { q: q.into(), scales, cols: inp, row0: 0 })
            } else if f32_weights {
                Weights::f32((0..out * inp).map(|i| value(i).to_f32()).collect())
            } else {
                Weights::bf16((0..out * inp).map(|i| value(i).to_bits()).collect())
            };
            Linear::from_weights(weights, out, inp).unwrap()
        })
        .collect();
    let reps = std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(copies.max(8));
    let bytes = (out * inp * size * reps) as f64;
    let stored = if fp8 {
        "fp8"
    } else if f32_weights {
        "f32"
    } else {
        "bf16"
    };
    println!("[{out}, {inp}] {stored}, {copies} copies, {reps} calls per timing");
    let only = |name: &str, all: Vec<usize>| -> Vec<usize> {
        std::env::var(name).ok().map(|v| v.split(',').filter_map(|x| x.parse().ok()).collect()).unwrap_or(all)
    };
    for threads in only("THREADS", vec![1, 2]) {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
        // bf16 activations need bf16 or FP8 weights (f32 weights run their f32-activation
        // kernel at either dtype; FP8 at bf16 runs `vdpbf16ps` where the CPU has it).
        let precs: &[Precision] = if f32_weights { &[Precision::F32] } else { &[Precision::F32, Precision::Bf16] };
        for &prec in precs {
            let mut line = format!("{:>4} threads {threads}:", prec.name());
            let mut base = 0.0;
            for rows in only("ROWS", vec![1, 2, 3, 4, 5]) {
                let x = Mat::from_vec(
                    rows,
                    inp,
                    (0..rows * inp).map(|i| half::bf16::from_f32((i as f32 * 0.37).sin()).to_f32()).collect(),
                );
                let mut times = vec![];
                for _ in 0..5 {
                    let t = Instant::now();
                    for i in 0..reps {
                        let y = pool.install(|| lins[i % copies].forward(&x, prec).unwrap());
                        std::hint::black_box(&y);
                    }
                    times.push(t.elapsed().as_secs_f64());
                }
                times.sort_by(|a, b| a.partial_cmp(b).unwrap());
                if rows == 1 {
                    base = times[2];
                }
                line += &format!("  r{rows} {:.1} GB/s {:.2}x", bytes / times[2] / 1e9, times[2] / base);
            }
            println!("{line}");
        }
    }
}
