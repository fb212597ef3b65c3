//! Engine invariants: the chunked GDN rule equals the recurrent rule, prefill-then-decode equals
//! one-shot prefill, and snapshot / restore is bit-exact.

use std::path::PathBuf;

use deltascope_engine::Rng;
use deltascope_model::layers::{HeadInputs, chunked_head, recurrent_head};
use deltascope_model::{ForwardOptions, LoadOptions, LogitsRows, Model, ModelSource, Precision, SequenceState};

fn randn(rng: &mut Rng, n: usize, scale: f32) -> Vec<f32> {
    // Box–Muller from the engine's own generator.
    (0..n)
        .map(|_| {
            let (u1, u2) = (rng.uniform().max(1e-12), rng.uniform());
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32 * scale
        })
        .collect()
}

fn l2_rows(x: &mut [f32], d: usize) {
    for r in x.chunks_mut(d) {
        let n = r.iter().map(|v| v * v).sum::<f32>().sqrt();
        r.iter_mut().for_each(|v| *v /= n);
    }
}

fn rel_rms(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn chunked_rule_equals_recurrent_rule() {
    let mut rng = Rng::new(7);
    // Lengths below, at and across the 64-token chunk boundary; head dims as in real models and odd.
    for &(t, dk, dv) in &[(1usize, 16usize, 16usize), (63, 32, 16), (64, 16, 32), (150, 32, 48), (200, 128, 128)] {
        let mut q = randn(&mut rng, t * dk, 1.0);
        let mut k = randn(&mut rng, t * dk, 1.0);
        l2_rows(&mut q, dk);
        l2_rows(&mut k, dk);
        q.iter_mut().for_each(|v| *v /= (dk as f32).sqrt());
        let v = randn(&mut rng, t * dv, 1.0);
        // Decays from ~0.5 to ~1 per step; betas in (0, 1).
        let g: Vec<f32> = (0..t).map(|_| -(rng.uniform() as f32) * 0.7).collect();
        let beta: Vec<f32> = (0..t).map(|_| rng.uniform() as f32).collect();
        let s0 = randn(&mut rng, dk * dv, 0.5);
        let (mut s_rec, mut s_chunk) = (s0.clone(), s0.clone());
        let inputs = HeadInputs { q: &q, k: &k, v: &v, g: &g, beta: &beta, dk, dv };
        let o_rec = recurrent_head(&inputs, &mut s_rec, None);
        let o_chunk = chunked_head(&inputs, &mut s_chunk);
        let (eo, es) = (rel_rms(&o_chunk, &o_rec), rel_rms(&s_chunk, &s_rec));
        eprintln!("T={t} dk={dk} dv={dv}: output rel RMS {eo:.2e}, state rel RMS {es:.2e}");
        assert!(eo <= 1e-5, "outputs differ: rel RMS {eo}");
        assert!(es <= 1e-5, "final states differ: rel RMS {es}");
    }
}

fn fixture(name: &str) -> Model {
    fixture_in(name, Precision::F32)
}

fn fixture_in(name: &str, precision: Precision) -> Model {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    Model::load(&ModelSource::Dir(dir), &LoadOptions { precision, ..LoadOptions::default() }).unwrap()
}

fn prompt(n: usize) -> Vec<u32> {
    let mut rng = Rng::new(99);
    (0..n).map(|_| 3 + (rng.next_u64() % 400) as u32).collect()
}

#[test]
fn prefill_then_decode_equals_one_shot_prefill() {
    for name in ["qwen3_5_vl", "qwen3_5_text", "qwen3_next", "qwen3_5_moe"] {
        let model = fixture(name);
        let ids = prompt(150);
        let mut state = model.new_state();
        let full = model
            .forward(&ids, &mut state, ForwardOptions { logits: LogitsRows::All, ..Default::default() })
            .unwrap()
            .logits;

        // Prefill 100 tokens (two chunks), then a 20-token prefill from the cache, then decode one by one.
        let mut state = model.new_state();
        // The two paths differ (chunked vs recurrent rule, GEMM vs GEMV), so they agree to
        // f32 rounding: 1e-4 for logits up to 10, 1e-5 relative beyond.
        let mut worst = 0f32;
        let mut compare = |rows: &deltascope_model::Mat, from: usize| {
            for r in 0..rows.rows {
                for (a, b) in rows.row(r).iter().zip(full.row(from + r)) {
                    worst = worst.max((a - b).abs() / (b.abs() / 10.0).max(1.0));
                }
            }
        };
        let out = model
            .forward(&ids[..100], &mut state, ForwardOptions { logits: LogitsRows::All, ..Default::default() })
            .unwrap();
        compare(&out.logits, 0);
        let out = model
            .forward(&ids[100..120], &mut state, ForwardOptions { logits: LogitsRows::All, ..Default::default() })
            .unwrap();
        compare(&out.logits, 100);
        for (i, id) in ids.iter().enumerate().skip(120) {
            let out = model.forward(&[*id], &mut state, ForwardOptions::default()).unwrap();
            compare(&out.logits, i);
        }
        assert_eq!(state.position, ids.len());
        eprintln!("{name}: max scaled |Δlogit| split vs one-shot {worst:.2e}");
        assert!(worst <= 1e-4, "{name}: prefill+decode differs from one-shot prefill by {worst}");
    }
}

fn bits(s: &SequenceState) -> Vec<u32> {
    // The whole state as bit patterns (f32 equality would treat -0.0 == 0.0 and NaN != NaN).
    let mut v = vec![s.position as u32];
    for l in &s.layers {
        match l {
            deltascope_model::LayerState::Linear(g) => v.extend(g.conv.iter().chain(&g.ssm).map(|x| x.to_bits())),
            deltascope_model::LayerState::Attention(kv) => v.extend(kv.k.iter().chain(&kv.v).map(|x| x.to_bits())),
        }
    }
    v
}

#[test]
fn snapshot_restore_is_bit_exact() {
    for name in ["qwen3_5_vl", "qwen3_next"] {
        let model = fixture(name);
        let ids = prompt(40);
        let mut state = model.new_state();
        model.forward(&ids[..30], &mut state, ForwardOptions::default()).unwrap();
        let before = bits(&state);
        let snap = state.snapshot();
        assert_eq!(snap.bytes(), state.bytes().recurrent_bytes);

        let first: Vec<Vec<f32>> = ids[30..]
            .iter()
            .map(|id| model.forward(&[*id], &mut state, ForwardOptions::default()).unwrap().logits.data)
            .collect();
        assert_ne!(bits(&state), before);
        state.restore(&snap).unwrap();
        assert_eq!(bits(&state), before, "{name}: restore did not give back the snapshot's state");
        // Replaying the same tokens gives bit-identical logits.
        let again: Vec<Vec<f32>> = ids[30..]
            .iter()
            .map(|id| model.forward(&[*id], &mut state, ForwardOptions::default()).unwrap().logits.data)
            .collect();
        let to_bits = |v: &Vec<Vec<f32>>| v.iter().flatten().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(to_bits(&first), to_bits(&again));

        // A snapshot taken after a rollback that later tokens overwrote is refused.
        let late = state.snapshot(); // position 40
        state.restore(&snap).unwrap(); // back to 30 …
        model.forward(&ids[30..35], &mut state, ForwardOptions::default()).unwrap(); // … and rewrite 30..35
        model.forward(&ids[35..], &mut state, ForwardOptions::default()).unwrap();
        let err = state.restore(&late).unwrap_err().to_string();
        assert!(err.contains("stale"), "{err}");
    }
}

#[test]
fn state_byte_accounting_is_exact() {
    let model = fixture("qwen3_5_vl");
    let c = &model.config();
    let mut state = model.new_state();
    model.forward(&prompt(37), &mut state, ForwardOptions::default()).unwrap();
    let b = state.bytes();
    let l = &c.linear;
    let per_gdn = ((l.conv_kernel - 1) * l.conv_dim() + l.num_value_heads * l.key_head_dim * l.value_head_dim) * 4;
    assert_eq!(b.recurrent_bytes, c.num_linear_layers() * per_gdn);
    assert_eq!(b.kv_bytes, 37 * c.num_full_layers() * 2 * c.num_key_value_heads * c.head_dim * 4);
    assert!(b.kv_capacity_bytes >= b.kv_bytes);
    // One more token grows the KV cache by exactly one position; the recurrent state stays put.
    model.forward(&[5], &mut state, ForwardOptions::default()).unwrap();
    let b2 = state.bytes();
    assert_eq!(b2.kv_bytes - b.kv_bytes, c.num_full_layers() * 2 * c.num_key_value_heads * c.head_dim * 4);
    assert_eq!(b2.recurrent_bytes, b.recurrent_bytes);
}

/// Verification for speculative decoding: a verify pass over T tokens gives exactly the logits of
/// decoding them one by one, and keeping any prefix leaves exactly the state that decoding that
/// prefix leaves (bit-exact, in f32 and in bf16, where the decode GEMV is the bf16 × bf16
/// kernel family of `model::gemv::PairKernel`).
#[test]
fn verify_pass_and_rollback_are_bit_exact() {
    for (fixture_name, precision) in [
        ("qwen3_5_vl", Precision::F32),
        ("qwen3_next", Precision::F32),
        ("qwen3_5_moe", Precision::F32),
        ("qwen3_5_vl", Precision::Bf16),
        ("qwen3_5_moe", Precision::Bf16),
    ] {
        let name = format!("{fixture_name} in {}", precision.name());
        let model = fixture_in(fixture_name, precision);
        let ids = prompt(60);
        let (ctx, block) = (&ids[..50], &ids[50..55]);
        let mut base = model.new_state();
        model.forward(ctx, &mut base, ForwardOptions::default()).unwrap();

        // Plain decoding, one token at a time, with the state after each token.
        let mut plain = base.clone();
        let mut plain_logits = vec![];
        let mut plain_states = vec![];
        for id in block {
            plain_logits.push(model.forward(&[*id], &mut plain, ForwardOptions::default()).unwrap().logits.data);
            plain_states.push(bits(&plain));
        }

        let opts = ForwardOptions { logits: LogitsRows::All, verify: true, ..Default::default() };
        let mut v = base.clone();
        let out = model.forward(block, &mut v, opts).unwrap();
        for (i, want) in plain_logits.iter().enumerate() {
            let got: Vec<u32> = out.logits.row(i).iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), "{name}: verify logits of token {i}");
        }
        assert!(v.tape_bytes() > 0);
        for keep in 1..=block.len() {
            let mut s = base.clone();
            model.forward(block, &mut s, opts).unwrap();
            s.accept(keep).unwrap();
            // Settled: nothing left to accept; the tapes' buffers stay for the next pass.
            assert!(s.accept(keep).is_err());
            assert_eq!(s.tape_bytes(), v.tape_bytes());
            assert_eq!(
                bits(&s),
                plain_states[keep - 1],
                "{name}: state after keeping {keep} of {} verified tokens",
                block.len()
            );
            // And decoding continues exactly as it would have.
            let next = model.forward(&[7], &mut s, ForwardOptions::default()).unwrap().logits.data;
            let mut p = base.clone();
            for id in &block[..keep] {
                model.forward(&[*id], &mut p, ForwardOptions::default()).unwrap();
            }
            let want = model.forward(&[7], &mut p, ForwardOptions::default()).unwrap().logits.data;
            assert_eq!(
                next.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
            );
        }
        let mut s = base.clone();
        assert!(s.accept(1).is_err(), "accept without a verify pass");
    }
}
