//! CPU twins of the CUDA kernels: each computes what its kernel computes, in the kernel's
//! layouts and rounding points (bf16 values carried as f32), so that a GPU run can be checked
//! kernel by kernel on random inputs. The tests here tie each twin to the engine's own stage
//! functions (`gdn::conv_stage`, `gdn::gates_stage`, `gdn::recurrent_head`,
//! `gdn::gated_norm_stage`): twin == engine, so kernel == twin means kernel == engine.

use deltascope_model::cpu::{sigmoid, silu, softplus};

fn bf(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// Deterministic values in [-scale, scale] (xorshift from `seed`), rounded to bf16: the
/// kernels' inputs are bf16. The parity runs and the twins' tests draw from it.
pub fn randoms(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e3779b97f4a7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            bf(((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale)
        })
        .collect()
}

/// `conv1d_decode`: `x` `[T][C]`, `state` `[C][K−1]` (oldest first), `w` `[C][K]`. Returns
/// `y` `[T][C]`; with `slots` (`[T][C][K−1]`) each token's window goes there and the state is
/// left as it was, else the state ends after the last token.
pub fn conv1d_decode(
    x: &[f32],
    state: &mut [f32],
    w: &[f32],
    mut slots: Option<&mut [f32]>,
    tokens: usize,
    channels: usize,
    kernel: usize,
) -> Vec<f32> {
    let keep = kernel - 1;
    let mut y = vec![0f32; tokens * channels];
    for c in 0..channels {
        let mut win: Vec<f32> = state[c * keep..(c + 1) * keep].to_vec();
        let wk = &w[c * kernel..(c + 1) * kernel];
        for t in 0..tokens {
            let xt = x[t * channels + c];
            let mut s = 0f32;
            for i in 0..keep {
                s = wk[i].mul_add(win[i], s);
            }
            s = wk[keep].mul_add(xt, s);
            y[t * channels + c] = bf(silu(bf(s)));
            if keep > 0 {
                win.remove(0);
                win.push(xt);
            }
            if let Some(sl) = slots.as_deref_mut() {
                sl[(t * channels + c) * keep..(t * channels + c + 1) * keep].copy_from_slice(&win);
            }
        }
        if slots.is_none() {
            state[c * keep..(c + 1) * keep].copy_from_slice(&win);
        }
    }
    y
}

/// `gdn_recurrent`: `qkv` `[T][2·Hk·dk + Hv·dv]`, `a` / `b` `[T][Hv]`, `a_log` / `dt_bias`
/// `[Hv]`, `state` `[Hv][dv][dk]` f32. Returns `o` `[T][Hv][dv]` (bf16 values). With `slots`
/// (`[T][Hv][dv][dk]`) the state after each token goes there and `state` is left as it was.
#[allow(clippy::too_many_arguments)]
pub fn gdn_recurrent(
    qkv: &[f32],
    a: &[f32],
    b: &[f32],
    a_log: &[f32],
    dt_bias: &[f32],
    state: &mut [f32],
    mut slots: Option<&mut [f32]>,
    tokens: usize,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
) -> Vec<f32> {
    let key_dim = hk * dk;
    let conv_dim = 2 * key_dim + hv * dv;
    let head = dv * dk;
    let mut out = vec![0f32; tokens * hv * dv];
    for h in 0..hv {
        let kh = h / (hv / hk);
        let mut s: Vec<f32> = state[h * head..(h + 1) * head].to_vec();
        let neg_a = -a_log[h].exp();
        for t in 0..tokens {
            let row = &qkv[t * conv_dim..(t + 1) * conv_dim];
            let q: Vec<f32> = row[kh * dk..(kh + 1) * dk].to_vec();
            let k: Vec<f32> = row[key_dim + kh * dk..key_dim + (kh + 1) * dk].to_vec();
            let qn = 1.0 / (q.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt() / (dk as f32).sqrt();
            let kn = 1.0 / (k.iter().map(|x| x * x).sum::<f32>() + 1e-6).sqrt();
            let q: Vec<f32> = q.iter().map(|x| x * qn).collect();
            let k: Vec<f32> = k.iter().map(|x| x * kn).collect();
            let beta = bf(sigmoid(b[t * hv + h]));
            let decay = (neg_a * softplus(a[t * hv + h] + dt_bias[h])).exp();
            for r in 0..dv {
                let v = row[2 * key_dim + h * dv + r];
                let srow = &mut s[r * dk..(r + 1) * dk];
                let mut sk = 0f32;
                for (x, kk) in srow.iter_mut().zip(&k) {
                    *x *= decay;
                    sk = x.mul_add(*kk, sk);
                }
                let delta = (v - sk) * beta;
                let mut o = 0f32;
                for ((x, kk), qq) in srow.iter_mut().zip(&k).zip(&q) {
                    *x = kk.mul_add(delta, *x);
                    o = x.mul_add(*qq, o);
                }
                out[(t * hv + h) * dv + r] = bf(o);
            }
            if let Some(sl) = slots.as_deref_mut() {
                let base = t * hv * head + h * head;
                sl[base..base + head].copy_from_slice(&s);
            }
        }
        if slots.is_none() {
            state[h * head..(h + 1) * head].copy_from_slice(&s);
        }
    }
    out
}

/// `rms_norm_gated`: rows of `n` (one value head each) of `x` and `z`, weight `w` `[n]`.
pub fn rms_norm_gated(x: &[f32], z: &[f32], w: &[f32], n: usize, eps: f32) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (r, row) in x.chunks(n).enumerate() {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / n as f32 + eps).sqrt();
        for i in 0..n {
            let normed = bf(row[i] * inv);
            let scaled = bf(w[i] * normed);
            y[r * n + i] = bf(scaled * silu(z[r * n + i]));
        }
    }
    y
}

/// `gemv_bf16` (f32 output): `y[r][n] = Σ_k W[n][k]·x[r][k]`, in the kernel's order per lane
/// (each lane sums 8-wide chunks `lane, lane + 32, …` with fused multiply-adds, then the warp's
/// butterfly adds the 32 lane sums).
pub fn gemv_bf16(w: &[f32], x: &[f32], n_out: usize, k: usize, rows: usize) -> Vec<f32> {
    let mut y = vec![0f32; rows * n_out];
    for r in 0..rows {
        let xr = &x[r * k..(r + 1) * k];
        for n in 0..n_out {
            let wr = &w[n * k..(n + 1) * k];
            let mut lanes = [0f32; 32];
            for (lane, acc) in lanes.iter_mut().enumerate() {
                let mut c = lane;
                while c < k / 8 {
                    for j in 0..8 {
                        *acc = wr[c * 8 + j].mul_add(xr[c * 8 + j], *acc);
                    }
                    c += 32;
                }
            }
            // __shfl_xor_sync butterfly: offsets 16, 8, 4, 2, 1; lane 0's sum is kept.
            let mut off = 16;
            while off > 0 {
                let prev = lanes;
                for l in 0..32 {
                    lanes[l] = prev[l] + prev[l ^ off];
                }
                off /= 2;
            }
            y[r * n_out + n] = lanes[0];
        }
    }
    y
}

/// `attn_gqa` for queries `q` `[T][Hq][hd]` (already normed and rotated) against caches in the
/// kernel's layout `[Hkv][l_max][hd]`, with the output gate `gate` `[T][Hq][hd]` when given.
/// Returns `[T][Hq][hd]` (bf16 values).
#[allow(clippy::too_many_arguments)]
pub fn attn_gqa(
    q: &[f32],
    gate: Option<&[f32]>,
    kcache: &[f32],
    vcache: &[f32],
    l_max: usize,
    pos0: usize,
    tokens: usize,
    nh: usize,
    nkv: usize,
    hd: usize,
) -> Vec<f32> {
    let scale = deltascope_model::cuda::ops::attention_scale(hd);
    let mut out = vec![0f32; tokens * nh * hd];
    for t in 0..tokens {
        for h in 0..nh {
            let kvh = h / (nh / nkv);
            let qh = &q[(t * nh + h) * hd..(t * nh + h + 1) * hd];
            let visible = pos0 + t + 1;
            let scores: Vec<f32> = (0..visible)
                .map(|j| {
                    let kr = &kcache[(kvh * l_max + j) * hd..(kvh * l_max + j + 1) * hd];
                    let dot = qh.iter().zip(kr).fold(0f32, |a, (x, y)| x.mul_add(*y, a));
                    bf(bf(dot) * scale)
                })
                .collect();
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
            let sum: f32 = scores.iter().map(|s| (s - max).exp()).sum();
            let o = &mut out[(t * nh + h) * hd..(t * nh + h + 1) * hd];
            for (j, s) in scores.iter().enumerate() {
                let p = bf((s - max).exp() / sum);
                let vr = &vcache[(kvh * l_max + j) * hd..(kvh * l_max + j + 1) * hd];
                for (x, v) in o.iter_mut().zip(vr) {
                    *x = p.mul_add(*v, *x);
                }
            }
            for (d, x) in o.iter_mut().enumerate() {
                *x = bf(*x);
                if let Some(g) = gate {
                    *x = bf(*x * bf(sigmoid(g[(t * nh + h) * hd + d])));
                }
            }
        }
    }
    out
}

/// `moe_topk`: per token the `k` most probable experts of `softmax(round(logits))` (the bf16
/// router's output; ties: lower id), renormalised when `renorm`, weights rounded to bf16.
/// Returns `(ids, weights)`, `[T][k]`.
pub fn moe_topk(logits: &[f32], experts: usize, k: usize, renorm: bool) -> (Vec<i32>, Vec<f32>) {
    let mut ids = vec![];
    let mut weights = vec![];
    for raw in logits.chunks(experts) {
        let row: Vec<f32> = raw.iter().map(|&x| bf(x)).collect();
        let max = row.iter().fold(f32::NEG_INFINITY, |m, x| m.max(*x));
        let e: Vec<f32> = row.iter().map(|x| (x - max).exp()).collect();
        let sum: f32 = e.iter().sum();
        let p: Vec<f32> = e.iter().map(|x| x / sum).collect();
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|a, b| p[*b].total_cmp(&p[*a]).then(a.cmp(b)));
        let top = &order[..k];
        let total: f32 = top.iter().map(|&i| p[i]).sum();
        for &i in top {
            ids.push(i as i32);
            weights.push(bf(if renorm { p[i] / total } else { p[i] }));
        }
    }
    (ids, weights)
}

/// `sigmoid_scale_rows`: the shared expert's gate, `out[t] = round(x[t] · round(sigmoid(round(g[t]))))`
/// (the gate linear's output rounded as the engine's bf16 linear rounds it).
pub fn sigmoid_scale_rows(x: &[f32], g: &[f32], hidden: usize) -> Vec<f32> {
    x.iter().enumerate().map(|(i, &v)| bf(v * bf(sigmoid(bf(g[i / hidden]))))).collect()
}

/// `moe_combine`: `out[t] = Σ_s round(w·y)` in ascending expert id, each add rounded.
pub fn moe_combine(y: &[f32], ids: &[i32], weights: &[f32], hidden: usize, k: usize) -> Vec<f32> {
    let tokens = ids.len() / k;
    let mut out = vec![0f32; tokens * hidden];
    for t in 0..tokens {
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_by_key(|&s| ids[t * k + s]);
        for c in 0..hidden {
            let mut acc = 0f32;
            for &s in &order {
                acc = bf(acc + bf(y[(t * k + s) * hidden + c] * weights[t * k + s]));
            }
            out[t * hidden + c] = acc;
        }
    }
    out
}

/// `rms_norm` (zero-centred: `1 + w`): rows of `n`.
pub fn rms_norm(x: &[f32], w: &[f32], n: usize, eps: f32, zero_centred: bool) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (r, row) in x.chunks(n).enumerate() {
        let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / n as f32 + eps).sqrt();
        for i in 0..n {
            let wi = if zero_centred { 1.0 + w[i] } else { w[i] };
            y[r * n + i] = bf(row[i] * inv * wi);
        }
    }
    y
}

/// `rope_mrope` on rows `[T][heads][hd]` (contiguous heads) with one position per token
/// (text: the three mRoPE ids equal) and the host's inverse frequencies (`[rotary_dim / 2]`).
pub fn rope(x: &mut [f32], positions: &[usize], heads: usize, hd: usize, inv_freq: &[f32]) {
    let half = inv_freq.len();
    for (t, &pos) in positions.iter().enumerate() {
        for h in 0..heads {
            let row = &mut x[(t * heads + h) * hd..(t * heads + h + 1) * hd];
            for j in 0..half {
                let angle = pos as f32 * inv_freq[j];
                let (c, s) = (bf(angle.cos()), bf(angle.sin()));
                let (a, b) = (row[j], row[j + half]);
                row[j] = bf(bf(a * c) - bf(b * s));
                row[j + half] = bf(bf(b * c) + bf(a * s));
            }
        }
    }
}

/// `swiglu` over fused rows `[rows][2·inter]` (gate first).
pub fn swiglu(gate_up: &[f32], inter: usize) -> Vec<f32> {
    gate_up.chunks(2 * inter).flat_map(|row| (0..inter).map(move |i| bf(bf(silu(row[i])) * row[inter + i]))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltascope_model::layers::{HeadInputs, conv_stage, gated_norm_stage, gates_stage, recurrent_head};
    use deltascope_model::{Mat, Precision};

    fn close(a: &[f32], b: &[f32], rel: f32, what: &str) {
        assert_eq!(a.len(), b.len(), "{what}");
        let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= rel * scale, "{what}[{i}]: twin {x} vs engine {y} (scale {scale})");
        }
    }

    /// The conv twin (kernel layouts: state `[C][K−1]`, weights `[C][K]`) against the engine's
    /// conv stage (window `[K−1][C]`, taps `[K][C]`), for a prompt, a step and a verify block.
    #[test]
    fn conv_twin_matches_the_engine_stage() {
        let (c, k) = (96, 4);
        let w = randoms(c * k, 1, 0.5);
        let taps: Vec<f32> = (0..k).flat_map(|j| (0..c).map(move |ch| (j, ch))).map(|(j, ch)| w[ch * k + j]).collect();
        let window_engine = randoms((k - 1) * c, 2, 1.0);
        let state0: Vec<f32> =
            (0..c).flat_map(|ch| (0..k - 1).map(move |i| (ch, i))).map(|(ch, i)| window_engine[i * c + ch]).collect();
        for tokens in [1usize, 3, 7] {
            let x = randoms(tokens * c, 3 + tokens as u64, 1.0);
            let (y_engine, next_engine) =
                conv_stage(&Mat::from_vec(tokens, c, x.clone()), &window_engine, &taps, c, k, Precision::Bf16);
            let mut state = state0.clone();
            let y = conv1d_decode(&x, &mut state, &w, None, tokens, c, k);
            close(&y, &y_engine.data, 1e-2, "conv y");
            let next: Vec<f32> =
                (0..k - 1).flat_map(|i| (0..c).map(move |ch| (i, ch))).map(|(i, ch)| state[ch * (k - 1) + i]).collect();
            assert_eq!(next, next_engine, "the window after {tokens} tokens");
            // With slots the state stays and the last slot is the window after the block.
            let mut kept = state0.clone();
            let mut slots = vec![0f32; tokens * c * (k - 1)];
            let y2 = conv1d_decode(&x, &mut kept, &w, Some(&mut slots), tokens, c, k);
            assert_eq!(y2, y);
            assert_eq!(kept, state0);
            assert_eq!(&slots[(tokens - 1) * c * (k - 1)..], state.as_slice());
        }
    }

    /// The fused GDN twin (state `[Hv][dv][dk]`, gates from raw a / b) against the engine's
    /// gates stage and recurrent rule (state `[dk][dv]` per head), GQA ratio 3.
    #[test]
    fn gdn_twin_matches_the_engine_gates_and_recurrent_rule() {
        let (hk, hv, dk, dv, tokens) = (1, 3, 32, 16, 5);
        let key_dim = hk * dk;
        let conv_dim = 2 * key_dim + hv * dv;
        let qkv = randoms(tokens * conv_dim, 11, 1.0);
        let a = randoms(tokens * hv, 12, 2.0);
        let b = randoms(tokens * hv, 13, 2.0);
        let a_log = randoms(hv, 14, 1.0);
        let dt_bias = randoms(hv, 15, 1.0);
        let state0 = randoms(hv * dv * dk, 16, 0.1);

        // The engine: gates from a projection laid out [b | a], then per head the recurrent rule.
        let mut proj = vec![0f32; tokens * 2 * hv];
        for t in 0..tokens {
            proj[t * 2 * hv..t * 2 * hv + hv].copy_from_slice(&b[t * hv..(t + 1) * hv]);
            proj[t * 2 * hv + hv..(t + 1) * 2 * hv].copy_from_slice(&a[t * hv..(t + 1) * hv]);
        }
        let a_neg: Vec<f32> = a_log.iter().map(|x| -x.exp()).collect();
        let (beta, g) = gates_stage(&Mat::from_vec(tokens, 2 * hv, proj), 0, hv, &a_neg, &dt_bias, Precision::Bf16);
        let mut engine_out = vec![0f32; tokens * hv * dv];
        let mut engine_state = vec![0f32; hv * dv * dk];
        for h in 0..hv {
            let kh = h / (hv / hk);
            let l2 = |x: &[f32]| {
                let inv = 1.0 / (x.iter().map(|v| v * v).sum::<f32>() + 1e-6).sqrt();
                x.iter().map(|v| v * inv).collect::<Vec<f32>>()
            };
            let mut q = vec![];
            let mut k = vec![];
            let mut v = vec![];
            for t in 0..tokens {
                let row = &qkv[t * conv_dim..(t + 1) * conv_dim];
                q.extend(l2(&row[kh * dk..(kh + 1) * dk]).iter().map(|x| x / (dk as f32).sqrt()));
                k.extend(l2(&row[key_dim + kh * dk..key_dim + (kh + 1) * dk]));
                v.extend_from_slice(&row[2 * key_dim + h * dv..2 * key_dim + (h + 1) * dv]);
            }
            // [dv][dk] → the engine's [dk][dv].
            let mut s: Vec<f32> = (0..dk * dv).map(|i| state0[h * dv * dk + (i % dv) * dk + i / dv]).collect();
            let gh: Vec<f32> = (0..tokens).map(|t| g[t * hv + h]).collect();
            let bh: Vec<f32> = (0..tokens).map(|t| beta[t * hv + h]).collect();
            let o = recurrent_head(&HeadInputs { q: &q, k: &k, v: &v, g: &gh, beta: &bh, dk, dv }, &mut s, None);
            for t in 0..tokens {
                for j in 0..dv {
                    engine_out[(t * hv + h) * dv + j] = bf(o[t * dv + j]);
                }
            }
            for i in 0..dk * dv {
                engine_state[h * dv * dk + (i % dv) * dk + i / dv] = s[i];
            }
        }

        let mut state = state0.clone();
        let out = gdn_recurrent(&qkv, &a, &b, &a_log, &dt_bias, &mut state, None, tokens, hk, hv, dk, dv);
        close(&out, &engine_out, 1e-2, "gdn output");
        close(&state, &engine_state, 1e-5, "gdn state");

        // Verify slots: the state is untouched and slot t is the state after t + 1 tokens.
        let mut kept = state0.clone();
        let mut slots = vec![0f32; tokens * hv * dv * dk];
        let out2 = gdn_recurrent(&qkv, &a, &b, &a_log, &dt_bias, &mut kept, Some(&mut slots), tokens, hk, hv, dk, dv);
        assert_eq!(out2, out);
        assert_eq!(kept, state0);
        assert_eq!(&slots[(tokens - 1) * hv * dv * dk..], state.as_slice());
        let mut two = state0.clone();
        let c2 = 2 * conv_dim;
        gdn_recurrent(&qkv[..c2], &a[..2 * hv], &b[..2 * hv], &a_log, &dt_bias, &mut two, None, 2, hk, hv, dk, dv);
        assert_eq!(&slots[hv * dv * dk..2 * hv * dv * dk], two.as_slice(), "slot 1 = the state after 2 tokens");
    }

    #[test]
    fn gated_norm_twin_matches_the_engine_stage() {
        let (hv, dv, tokens) = (3, 32, 2);
        let x = randoms(tokens * hv * dv, 21, 1.0);
        let z = randoms(tokens * hv * dv, 22, 2.0);
        let w = randoms(dv, 23, 1.0);
        // The engine reads z from the projection and each head's output as [T][dv].
        let heads: Vec<Vec<f32>> = (0..hv)
            .map(|h| (0..tokens).flat_map(|t| x[(t * hv + h) * dv..(t * hv + h + 1) * dv].to_vec()).collect())
            .collect();
        let refs: Vec<&Vec<f32>> = heads.iter().collect();
        let engine =
            gated_norm_stage(&refs, &Mat::from_vec(tokens, hv * dv, z.clone()), 0, dv, &w, 1e-6, Precision::Bf16);
        let twin = rms_norm_gated(&x, &z, &w, dv, 1e-6);
        close(&twin, &engine.data, 1e-2, "gated norm");
    }

    #[test]
    fn gemv_twin_is_the_dot_product() {
        let (n_out, k, rows) = (5, 512, 3);
        let w = randoms(n_out * k, 31, 1.0);
        let x = randoms(rows * k, 32, 1.0);
        let y = gemv_bf16(&w, &x, n_out, k, rows);
        for r in 0..rows {
            for n in 0..n_out {
                let exact: f64 = (0..k).map(|i| w[n * k + i] as f64 * x[r * k + i] as f64).sum();
                assert!((y[r * n_out + n] as f64 - exact).abs() < 1e-4 * k as f64, "{r},{n}");
            }
        }
    }
    /// The attention twin (caches `[Hkv][l_max][hd]`) against the engine's decode attention
    /// (`attention::attend_decode`, keys `[positions][Hkv·hd]`) with the output gate applied as
    /// the engine's layer applies it: a 3-token verify block after 9 cached positions.
    #[test]
    fn attention_twin_matches_the_engine() {
        use deltascope_model::layers::attend_decode;
        let (nh, nkv, hd, pos0, tokens, l_max) = (4, 2, 32, 9, 3, 16);
        let positions = pos0 + tokens;
        let keys = randoms(positions * nkv * hd, 41, 1.0);
        let values = randoms(positions * nkv * hd, 42, 1.0);
        let q = randoms(tokens * nh * hd, 43, 1.0);
        let gate = randoms(tokens * nh * hd, 44, 2.0);
        let mut y = attend_decode(
            &Mat::from_vec(tokens, nh * hd, q.clone()),
            pos0,
            &keys,
            &values,
            nh,
            nkv,
            hd,
            Precision::Bf16,
        );
        for (o, g) in y.data.iter_mut().zip(&gate) {
            *o = bf(bf(*o) * bf(sigmoid(*g)));
        }
        let mut kc = vec![0f32; nkv * l_max * hd];
        let mut vc = vec![0f32; nkv * l_max * hd];
        for j in 0..positions {
            for h in 0..nkv {
                for d in 0..hd {
                    kc[(h * l_max + j) * hd + d] = keys[j * nkv * hd + h * hd + d];
                    vc[(h * l_max + j) * hd + d] = values[j * nkv * hd + h * hd + d];
                }
            }
        }
        let twin = attn_gqa(&q, Some(&gate), &kc, &vc, l_max, pos0, tokens, nh, nkv, hd);
        close(&twin, &y.data, 1e-2, "attention");
    }

    /// The MoE twins against the engine's routing and combine as `MoeBlock::forward` does them
    /// (restated here: the block needs loaded experts): top-k of the softmax with
    /// renormalisation, and the expert-by-expert accumulation order, bit for bit.
    #[test]
    fn moe_twins_route_and_combine_as_the_engine_does() {
        let (experts, k, hidden, tokens) = (8, 3, 16, 4);
        let logits = randoms(tokens * experts, 51, 3.0);
        let (ids, weights) = moe_topk(&logits, experts, k, true);
        for t in 0..tokens {
            let row: Vec<f32> = logits[t * experts..(t + 1) * experts].iter().map(|&x| bf(x)).collect();
            let chosen: Vec<i32> = ids[t * k..(t + 1) * k].to_vec();
            // The chosen are the k largest logits (softmax keeps the order).
            let mut sorted: Vec<usize> = (0..experts).collect();
            sorted.sort_by(|a, b| row[*b].total_cmp(&row[*a]).then(a.cmp(b)));
            assert_eq!(chosen, sorted[..k].iter().map(|&e| e as i32).collect::<Vec<_>>());
            let sum: f32 = weights[t * k..(t + 1) * k].iter().sum();
            assert!((sum - 1.0).abs() < 1e-2, "renormalised: {sum}");
        }
        let y = randoms(tokens * k * hidden, 52, 1.0);
        let out = moe_combine(&y, &ids, &weights, hidden, k);
        // The engine's order: experts by id, each token's contribution added as it comes.
        let mut acc = vec![0f32; tokens * hidden];
        for e in 0..experts as i32 {
            for t in 0..tokens {
                if let Some(s) = (0..k).find(|&s| ids[t * k + s] == e) {
                    for c in 0..hidden {
                        let a = &mut acc[t * hidden + c];
                        *a = bf(*a + bf(y[(t * k + s) * hidden + c] * weights[t * k + s]));
                    }
                }
            }
        }
        assert_eq!(out, acc, "bit for bit: the same order of roundings");
    }
    #[test]
    fn rms_norm_twin_matches_the_engine_norm() {
        use deltascope_model::layers::RmsNorm;
        let n = 64;
        let x = randoms(3 * n, 61, 2.0);
        let w = randoms(n, 62, 0.5);
        let norm = RmsNorm::zero_centred(&w, 1e-6);
        let mut engine = x.clone();
        for row in engine.chunks_mut(n) {
            norm.apply(row, Precision::Bf16);
        }
        close(&rms_norm(&x, &w, n, 1e-6, true), &engine, 1e-2, "rms norm");
    }

    #[test]
    fn rope_twin_matches_the_engine_rope() {
        use deltascope_model::RopeConfig;
        use deltascope_model::layers::Rope;
        let (heads, hd, rotary) = (3, 32, 16);
        let positions = [0usize, 5, 4095];
        let x = randoms(positions.len() * heads * hd, 63, 1.0);
        let cfg = RopeConfig {
            rope_type: "default".into(),
            theta: 1e7,
            partial_rotary_factor: 0.5,
            rotary_dim: rotary,
            mrope_section: None,
            mrope_interleaved: false,
        };
        let rope_e = Rope::new(&cfg);
        let mut engine = x.clone();
        for (t, &p) in positions.iter().enumerate() {
            let (c, s) = rope_e.cos_sin(p, Precision::Bf16);
            for h in 0..heads {
                rope_e.apply(&mut engine[(t * heads + h) * hd..(t * heads + h + 1) * hd], &c, &s, Precision::Bf16);
            }
        }
        let mut twin = x.clone();
        rope(&mut twin, &positions, heads, hd, rope_e.inv_freq());
        close(&twin, &engine, 1e-2, "rope");
        // The dims past rotary_dim pass through.
        for t in 0..positions.len() * heads {
            assert_eq!(twin[t * hd + rotary..(t + 1) * hd], x[t * hd + rotary..(t + 1) * hd]);
        }
    }

    #[test]
    fn swiglu_twin_is_the_engine_mlp_product() {
        let inter = 24;
        let gu = randoms(2 * 2 * inter, 64, 3.0);
        let twin = swiglu(&gu, inter);
        for (r, row) in gu.chunks(2 * inter).enumerate() {
            for i in 0..inter {
                let engine = Precision::Bf16.round(Precision::Bf16.round(silu(row[i])) * row[inter + i]);
                assert_eq!(twin[r * inter + i], engine);
            }
        }
    }
}
