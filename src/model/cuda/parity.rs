//! Kernel-by-kernel parity on a GPU: each kernel on random inputs against its CPU twin
//! (`twins.rs`), the largest difference relative to the twin's largest value, against a stated
//! tolerance. Run by `deltascope gpu check` (and so by `scripts/gpu-check.sh`). The twins are
//! tied to the CPU engine by the tests; this closes the loop on the device.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use serde::Serialize;

use super::runtime::{Gpu, GpuResult};
use super::twins::{self, randoms};

#[derive(Debug, Clone, Serialize)]
pub struct Parity {
    pub kernel: String,
    /// What was run: shapes, tokens.
    pub case: String,
    pub max_abs: f32,
    /// `max_abs` over the twin's largest magnitude.
    pub max_rel: f32,
    pub tolerance: f32,
    pub pass: bool,
}

/// bf16 results differ from the twin where one f32 rounding tips a bf16 value: one bf16 ulp
/// (2⁻⁸ relative) of the largest value, twice for slack; f32 results to 1e-4.
const BF16_TOL: f32 = 2.0 / 256.0;
const F32_TOL: f32 = 1e-4;

fn compare(kernel: &str, case: String, gpu: &[f32], twin: &[f32], tolerance: f32) -> Parity {
    let scale = twin.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    let mut max_abs = if gpu.len() == twin.len() { 0f32 } else { f32::INFINITY };
    for (a, b) in gpu.iter().zip(twin) {
        let d = if a.is_nan() || b.is_nan() { f32::INFINITY } else { (a - b).abs() };
        max_abs = max_abs.max(d);
    }
    let max_rel = max_abs / scale;
    Parity { kernel: kernel.into(), case, max_abs, max_rel, tolerance, pass: max_rel <= tolerance }
}

fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: grid, block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

const NULL: u64 = 0;

/// Every kernel check, in order; a launch or copy that fails ends the run with its error.
pub fn run_all(gpu: &Gpu) -> GpuResult<Vec<Parity>> {
    let mut out = vec![];
    for rows in [1usize, 4, 8] {
        out.push(gemv(gpu, 5120, 1024, rows)?);
    }
    out.push(gemv(gpu, 1024, 17408, 3)?);
    out.push(gated_norm(gpu)?);
    out.push(rms_norm(gpu)?);
    out.push(rope(gpu)?);
    out.push(swiglu(gpu)?);
    out.push(embedding(gpu)?);
    out.extend(conv_prefill(gpu, 37)?);
    for tokens in [1usize, 4] {
        out.extend(conv_decode(gpu, tokens)?);
    }
    for tokens in [1usize, 4, 64] {
        out.extend(gdn(gpu, tokens, QWEN36_GDN)?);
    }
    // The small test models' heads (masked lanes and rows): the fixtures and the demo.
    for shape in [(2, 6, 8, 12), (1, 3, 16, 16), (4, 4, 32, 32)] {
        out.extend(gdn(gpu, 4, shape)?);
    }
    out.push(attention(gpu, 0, 37, QWEN36_ATTN)?);
    out.push(attention(gpu, 100, 1, QWEN36_ATTN)?);
    out.push(attention(gpu, 100, 4, QWEN36_ATTN)?);
    for shape in [(4, 1, 24), (6, 2, 16), (4, 2, 48)] {
        out.push(attention(gpu, 9, 3, shape)?);
    }
    out.extend(moe(gpu)?);
    Ok(out)
}

fn gemv(gpu: &Gpu, n_out: usize, k: usize, rows: usize) -> GpuResult<Parity> {
    let w = randoms(n_out * k, 1, 0.05);
    let x = randoms(rows * k, 2, 1.0);
    let (dw, dx) = (gpu.bf16(&w)?, gpu.bf16(&x)?);
    let mut dy = gpu.zeros_f32(rows * n_out)?;
    let f = gpu.function("gemv_bf16")?;
    let (n_i, k_i, r_i) = (n_out as i32, k as i32, rows as i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dw).arg(&dx).arg(&mut dy).arg(&NULL).arg(&n_i).arg(&k_i).arg(&r_i);
    // SAFETY: the arguments match gemv_bf16's parameters (kernels/gemv.cu) and the buffers' sizes.
    unsafe { b.launch(cfg((n_out.div_ceil(8) as u32, 1, 1), 256)) }?;
    let y = gpu.read_f32(&dy)?;
    let twin = twins::gemv_bf16(&w, &x, n_out, k, rows);
    Ok(compare("gemv_bf16", format!("{n_out}x{k}, {rows} rows"), &y, &twin, F32_TOL))
}

fn gated_norm(gpu: &Gpu) -> GpuResult<Parity> {
    let (rows, n) = (4 * 48, 128);
    let x = randoms(rows * n, 3, 1.0);
    let z = randoms(rows * n, 4, 2.0);
    let w = randoms(n, 5, 1.0);
    let (dx, dz, dw) = (gpu.bf16(&x)?, gpu.bf16(&z)?, gpu.bf16(&w)?);
    let mut dy = gpu.zeros_bf16(rows * n)?;
    let f = gpu.function("rms_norm_gated")?;
    let (n_i, eps) = (n as i32, 1e-6f32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dx).arg(&dz).arg(&dw).arg(&mut dy).arg(&n_i).arg(&eps);
    // SAFETY: matches rms_norm_gated (kernels/norm.cu).
    unsafe { b.launch(cfg((rows as u32, 1, 1), 128)) }?;
    let y = gpu.read_bf16(&dy)?;
    let twin = twins::rms_norm_gated(&x, &z, &w, n, 1e-6);
    Ok(compare("rms_norm_gated", format!("{rows} rows of {n}"), &y, &twin, BF16_TOL))
}

fn conv_decode(gpu: &Gpu, tokens: usize) -> GpuResult<Vec<Parity>> {
    let (c, k) = (10240usize, 4usize);
    let x = randoms(tokens * c, 6, 1.0);
    let w = randoms(c * k, 7, 0.5);
    let state0 = randoms(c * (k - 1), 8, 1.0);
    let (dx, dw) = (gpu.bf16(&x)?, gpu.bf16(&w)?);
    let mut dstate = gpu.bf16(&state0)?;
    let mut dy = gpu.zeros_bf16(tokens * c)?;
    let mut dslots = gpu.zeros_bf16(tokens * c * (k - 1))?;
    let f = gpu.function("conv1d_decode")?;
    let (t_i, c_i, k_i) = (tokens as i32, c as i32, k as i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dx).arg(&mut dstate).arg(&dw).arg(&mut dy).arg(&mut dslots).arg(&t_i).arg(&c_i).arg(&k_i);
    // SAFETY: matches conv1d_decode (kernels/conv1d.cu).
    unsafe { b.launch(cfg((c.div_ceil(256) as u32, 1, 1), 256)) }?;
    let y = gpu.read_bf16(&dy)?;
    let slots = gpu.read_bf16(&dslots)?;
    let mut st = state0.clone();
    let mut twin_slots = vec![0f32; tokens * c * (k - 1)];
    let twin = twins::conv1d_decode(&x, &mut st, &w, Some(&mut twin_slots), tokens, c, k);
    let case = format!("{c} channels, K {k}, {tokens} tokens");
    Ok(vec![
        compare("conv1d_decode", case.clone(), &y, &twin, BF16_TOL),
        compare("conv1d_decode slots", case, &slots, &twin_slots, 0.0),
    ])
}

/// Qwen3.6-27B's GDN heads: 16 key / 48 value heads of 128.
const QWEN36_GDN: (usize, usize, usize, usize) = (16, 48, 128, 128);
/// Qwen3.6-27B's attention: 24 query / 4 KV heads of 256.
const QWEN36_ATTN: (usize, usize, usize) = (24, 4, 256);

fn gdn(gpu: &Gpu, tokens: usize, (hk, hv, dk, dv): (usize, usize, usize, usize)) -> GpuResult<Vec<Parity>> {
    let conv_dim = 2 * hk * dk + hv * dv;
    let qkv = randoms(tokens * conv_dim, 9, 1.0);
    let a = randoms(tokens * hv, 10, 2.0);
    let bb = randoms(tokens * hv, 11, 2.0);
    let a_log = randoms(hv, 12, 1.0);
    let dt_bias = randoms(hv, 13, 1.0);
    let state0 = randoms(hv * dv * dk, 14, 0.05);
    let with_slots = tokens <= 8;
    let (dqkv, da, db) = (gpu.bf16(&qkv)?, gpu.bf16(&a)?, gpu.bf16(&bb)?);
    let (dalog, ddt) = (gpu.f32(&a_log)?, gpu.f32(&dt_bias)?);
    let mut dstate = gpu.f32(&state0)?;
    let mut dslots = gpu.zeros_f32(if with_slots { tokens * hv * dv * dk } else { 1 })?;
    let mut dout = gpu.zeros_bf16(tokens * hv * dv)?;
    let f = gpu.function("gdn_recurrent")?;
    let (t_i, hk_i, hv_i, dk_i, dv_i) = (tokens as i32, hk as i32, hv as i32, dk as i32, dv as i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dqkv).arg(&da).arg(&db).arg(&dalog).arg(&ddt).arg(&mut dstate);
    if with_slots {
        b.arg(&mut dslots);
    } else {
        b.arg(&NULL);
    }
    b.arg(&mut dout).arg(&t_i).arg(&hk_i).arg(&hv_i).arg(&dk_i).arg(&dv_i);
    // SAFETY: matches gdn_recurrent (kernels/gdn.cu); grid (Hv, ⌈dv / 16⌉), 128 threads.
    unsafe { b.launch(cfg((hv as u32, dv.div_ceil(16) as u32, 1), 128)) }?;
    let out = gpu.read_bf16(&dout)?;
    let state = gpu.read_f32(&dstate)?;
    let mut st = state0.clone();
    let mut twin_slots = vec![0f32; if with_slots { tokens * hv * dv * dk } else { 0 }];
    let twin = twins::gdn_recurrent(
        &qkv,
        &a,
        &bb,
        &a_log,
        &dt_bias,
        &mut st,
        with_slots.then_some(twin_slots.as_mut_slice()),
        tokens,
        hk,
        hv,
        dk,
        dv,
    );
    let case = format!("{hk}/{hv} heads of {dk}/{dv}, {tokens} tokens{}", if with_slots { ", slots" } else { "" });
    let mut res = vec![compare("gdn_recurrent", case.clone(), &out, &twin, BF16_TOL)];
    if with_slots {
        let slots = gpu.read_f32(&dslots)?;
        res.push(compare("gdn_recurrent slots", case, &slots, &twin_slots, F32_TOL));
    } else {
        res.push(compare("gdn_recurrent state", case, &state, &st, F32_TOL));
    }
    Ok(res)
}

/// q rows interleave query and gate per head.
fn attention(gpu: &Gpu, pos0: usize, tokens: usize, (nh, nkv, hd): (usize, usize, usize)) -> GpuResult<Parity> {
    let l_max = pos0 + tokens;
    let q_rows = randoms(tokens * nh * 2 * hd, 15, 1.0);
    let kc = randoms(nkv * l_max * hd, 16, 1.0);
    let vc = randoms(nkv * l_max * hd, 17, 1.0);
    let (dq, dk, dv) = (gpu.bf16(&q_rows)?, gpu.bf16(&kc)?, gpu.bf16(&vc)?);
    let mut dout = gpu.zeros_bf16(tokens * nh * hd)?;
    // The gate is the same buffer offset by hd elements (2 bytes each).
    let gate_ptr: u64 = {
        use cudarc::driver::DevicePtr;
        let (p, _sync) = dq.device_ptr(&gpu.stream);
        p + (hd * 2) as u64
    };
    let f = gpu.function("attn_gqa")?;
    let (q_ts, q_hs) = ((nh * 2 * hd) as i64, (2 * hd) as i32);
    let (l_i, p_i, nh_i, nkv_i, hd_i) = (l_max as i32, pos0 as i32, nh as i32, nkv as i32, hd as i32);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dq).arg(&q_ts).arg(&q_hs).arg(&gate_ptr).arg(&dk).arg(&dv).arg(&l_i).arg(&mut dout);
    b.arg(&p_i).arg(&nh_i).arg(&nkv_i).arg(&hd_i).arg(&scale);
    // SAFETY: matches attn_gqa (kernels/attention.cu); grid (T, Hq), 128 threads.
    unsafe { b.launch(cfg((tokens as u32, nh as u32, 1), 128)) }?;
    let out = gpu.read_bf16(&dout)?;
    let mut q = vec![0f32; tokens * nh * hd];
    let mut gate = vec![0f32; tokens * nh * hd];
    for t in 0..tokens {
        for h in 0..nh {
            let src = (t * nh + h) * 2 * hd;
            q[(t * nh + h) * hd..(t * nh + h + 1) * hd].copy_from_slice(&q_rows[src..src + hd]);
            gate[(t * nh + h) * hd..(t * nh + h + 1) * hd].copy_from_slice(&q_rows[src + hd..src + 2 * hd]);
        }
    }
    let twin = twins::attn_gqa(&q, Some(&gate), &kc, &vc, l_max, pos0, tokens, nh, nkv, hd);
    Ok(compare("attn_gqa", format!("{nh}/{nkv} heads of {hd}, {pos0} cached, {tokens} tokens"), &out, &twin, BF16_TOL))
}

fn moe(gpu: &Gpu) -> GpuResult<Vec<Parity>> {
    let (tokens, experts, k, hidden) = (4usize, 256usize, 8usize, 2048usize);
    let logits = randoms(tokens * experts, 18, 4.0);
    let dl = gpu.f32(&logits)?;
    let mut dids = gpu.i32(&vec![0; tokens * k])?;
    let mut dw = gpu.zeros_f32(tokens * k)?;
    let f = gpu.function("moe_topk")?;
    let (e_i, k_i, renorm) = (experts as i32, k as i32, 1i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dl).arg(&mut dids).arg(&mut dw).arg(&e_i).arg(&k_i).arg(&renorm);
    // SAFETY: matches moe_topk (kernels/moe.cu).
    unsafe { b.launch(cfg((tokens as u32, 1, 1), 256)) }?;
    let ids = gpu.read_i32(&dids)?;
    let weights = gpu.read_f32(&dw)?;
    let (twin_ids, twin_w) = twins::moe_topk(&logits, experts, k, true);
    let ids_f: Vec<f32> = ids.iter().map(|&i| i as f32).collect();
    let twin_ids_f: Vec<f32> = twin_ids.iter().map(|&i| i as f32).collect();
    let mut res = vec![
        compare("moe_topk ids", format!("{experts} experts, top {k}"), &ids_f, &twin_ids_f, 0.0),
        compare("moe_topk weights", format!("{experts} experts, top {k}"), &weights, &twin_w, BF16_TOL),
    ];
    let y = randoms(tokens * k * hidden, 19, 1.0);
    let dy = gpu.bf16(&y)?;
    let dids2 = gpu.i32(&twin_ids)?;
    let dw2 = gpu.f32(&twin_w)?;
    let mut dout = gpu.zeros_bf16(tokens * hidden)?;
    let f = gpu.function("moe_combine")?;
    let (h_i, n) = (hidden as i32, (tokens * hidden) as i64);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dy).arg(&dids2).arg(&dw2).arg(&mut dout).arg(&h_i).arg(&k_i).arg(&n);
    // SAFETY: matches moe_combine (kernels/moe.cu).
    unsafe { b.launch(cfg(((tokens * hidden).div_ceil(256) as u32, 1, 1), 256)) }?;
    let out = gpu.read_bf16(&dout)?;
    let twin = twins::moe_combine(&y, &twin_ids, &twin_w, hidden, k);
    res.push(compare("moe_combine", format!("{tokens} tokens, top {k}, hidden {hidden}"), &out, &twin, 0.0));
    Ok(res)
}

fn rms_norm(gpu: &Gpu) -> GpuResult<Parity> {
    // Per-head q norm of the 27B: rows of 256, every other 256 of a 512-wide row (query, gate).
    let (tokens, heads, hd) = (3usize, 24usize, 256usize);
    let x = randoms(tokens * heads * 2 * hd, 20, 2.0);
    let w = randoms(hd, 21, 0.5);
    let (dx, dw) = (gpu.bf16(&x)?, gpu.bf16(&w)?);
    let mut dy = gpu.bf16(&x)?;
    let f = gpu.function("rms_norm")?;
    let (n_i, stride, eps, zc) = (hd as i32, (2 * hd) as i64, 1e-6f32, 1i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dx).arg(&dw).arg(&mut dy).arg(&n_i).arg(&stride).arg(&eps).arg(&zc);
    // SAFETY: matches rms_norm (kernels/norm.cu): one block per row of hd, rows 2·hd apart.
    unsafe { b.launch(cfg(((tokens * heads) as u32, 1, 1), 256)) }?;
    let y = gpu.read_bf16(&dy)?;
    let mut twin = x.clone();
    for r in 0..tokens * heads {
        let normed = twins::rms_norm(&x[r * 2 * hd..r * 2 * hd + hd], &w, hd, 1e-6, true);
        twin[r * 2 * hd..r * 2 * hd + hd].copy_from_slice(&normed);
    }
    Ok(compare("rms_norm", format!("{} heads of {hd}, strided", tokens * heads), &y, &twin, BF16_TOL))
}

fn rope(gpu: &Gpu) -> GpuResult<Parity> {
    let (heads, hd, rotary, theta) = (4usize, 256usize, 64usize, 1e7f32);
    let positions = [0usize, 1, 17, 4095, 262_143];
    let tokens = positions.len();
    let x = randoms(tokens * heads * hd, 22, 1.0);
    let mut dx = gpu.bf16(&x)?;
    let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
    let dp = gpu.i32(&pos)?;
    let f = gpu.function("rope_mrope")?;
    let (ts, hs, rd, s_h, s_w) = ((heads * hd) as i64, hd as i32, rotary as i32, 11i32, 10i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&mut dx).arg(&dp).arg(&dp).arg(&dp).arg(&ts).arg(&hs).arg(&rd).arg(&theta).arg(&s_h).arg(&s_w);
    // SAFETY: matches rope_mrope (kernels/rope.cu); text: the three position ids are one buffer.
    unsafe { b.launch(cfg((tokens as u32, heads as u32, 1), (rotary / 2) as u32)) }?;
    let y = gpu.read_bf16(&dx)?;
    let mut twin = x.clone();
    twins::rope(&mut twin, &positions, heads, hd, rotary, theta);
    Ok(compare("rope_mrope", "4 heads of 256, rotary 64, positions to 262143".into(), &y, &twin, BF16_TOL))
}

fn swiglu(gpu: &Gpu) -> GpuResult<Parity> {
    let (rows, inter) = (4usize, 17408usize);
    let gu = randoms(rows * 2 * inter, 23, 3.0);
    let dgu = gpu.bf16(&gu)?;
    let mut dout = gpu.zeros_bf16(rows * inter)?;
    let f = gpu.function("swiglu")?;
    let (i_i, n) = (inter as i32, (rows * inter) as i64);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dgu).arg(&mut dout).arg(&i_i).arg(&n);
    // SAFETY: matches swiglu (kernels/elementwise.cu).
    unsafe { b.launch(cfg(((rows * inter).div_ceil(256) as u32, 1, 1), 256)) }?;
    let y = gpu.read_bf16(&dout)?;
    Ok(compare("swiglu", format!("{rows} rows of {inter}"), &y, &twins::swiglu(&gu, inter), BF16_TOL))
}

fn embedding(gpu: &Gpu) -> GpuResult<Parity> {
    let (vocab, hidden) = (1000usize, 5120usize);
    let table = randoms(vocab * hidden, 24, 1.0);
    let ids: Vec<u32> = vec![0, 999, 17, 17, 500];
    let (dt, di) = (gpu.bf16(&table)?, gpu.u32(&ids)?);
    let mut dout = gpu.zeros_bf16(ids.len() * hidden)?;
    let f = gpu.function("embed_gather")?;
    let (h_i, v_u) = (hidden as i32, vocab as u32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dt).arg(&di).arg(&mut dout).arg(&h_i).arg(&v_u);
    // SAFETY: matches embed_gather (kernels/embedding.cu).
    unsafe { b.launch(cfg((ids.len() as u32, 1, 1), 256)) }?;
    let y = gpu.read_bf16(&dout)?;
    let twin: Vec<f32> =
        ids.iter().flat_map(|&i| table[i as usize * hidden..(i as usize + 1) * hidden].to_vec()).collect();
    Ok(compare("embed_gather", format!("{} ids of {hidden}", ids.len()), &y, &twin, 0.0))
}

/// The prefill conv (all tokens at once, then the state saved) against the step-by-step twin.
fn conv_prefill(gpu: &Gpu, tokens: usize) -> GpuResult<Vec<Parity>> {
    let (c, k) = (10240usize, 4usize);
    let x = randoms(tokens * c, 25, 1.0);
    let w = randoms(c * k, 26, 0.5);
    let state0 = randoms(c * (k - 1), 27, 1.0);
    let (dx, dw) = (gpu.bf16(&x)?, gpu.bf16(&w)?);
    let mut dstate = gpu.bf16(&state0)?;
    let mut dy = gpu.zeros_bf16(tokens * c)?;
    let (t_i, c_i, k_i) = (tokens as i32, c as i32, k as i32);
    let f = gpu.function("conv1d_prefill")?;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dx).arg(&dstate).arg(&dw).arg(&mut dy).arg(&t_i).arg(&c_i).arg(&k_i);
    // SAFETY: matches conv1d_prefill (kernels/conv1d.cu); grid (channels / 256, tokens).
    unsafe { b.launch(cfg((c.div_ceil(256) as u32, tokens as u32, 1), 256)) }?;
    let f = gpu.function("conv1d_save_state")?;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&dx).arg(&mut dstate).arg(&t_i).arg(&c_i).arg(&k_i);
    // SAFETY: matches conv1d_save_state (kernels/conv1d.cu), after the prefill on the same stream.
    unsafe { b.launch(cfg((c.div_ceil(256) as u32, 1, 1), 256)) }?;
    let y = gpu.read_bf16(&dy)?;
    let state = gpu.read_bf16(&dstate)?;
    let mut st = state0.clone();
    let twin = twins::conv1d_decode(&x, &mut st, &w, None, tokens, c, k);
    let case = format!("{c} channels, K {k}, {tokens} tokens");
    Ok(vec![
        compare("conv1d_prefill", case.clone(), &y, &twin, BF16_TOL),
        compare("conv1d_save_state", case, &state, &st, 0.0),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_catches_nan_length_and_size() {
        assert!(compare("k", "c".into(), &[1.0, 2.0], &[1.0, 2.0], 0.0).pass);
        assert!(!compare("k", "c".into(), &[1.0, f32::NAN], &[1.0, 2.0], 1.0).pass);
        assert!(!compare("k", "c".into(), &[1.0], &[1.0, 2.0], 1.0).pass);
        let p = compare("k", "c".into(), &[1.0, 2.02], &[1.0, 2.0], BF16_TOL);
        assert!((p.max_rel - 0.01).abs() < 1e-4 && !p.pass);
    }
}
