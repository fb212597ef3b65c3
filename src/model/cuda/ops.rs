//! Typed launches of the kernels in `kernels/*.cu`: one function per kernel, its grid and
//! block as the kernel's comment states, the arguments in the kernel's order. The CUDA model
//! (`model.rs`) composes them; `parity.rs` checks each kernel alone against its CPU twin.
//!
//! bf16 buffers are `CudaSlice<u16>` (raw bits, as in the kernels). Every launch is on the
//! GPU's one stream, so each kernel sees the writes of the ones before it.

// The wrappers take the kernels' parameters one for one.
#![allow(clippy::too_many_arguments)]

use cudarc::driver::{CudaSlice, CudaView, LaunchConfig, PushKernelArg};

use super::runtime::{Gpu, GpuError, GpuResult};

pub type Bf16Buf = CudaSlice<u16>;

/// A weight matrix `[n_out][k]` in bf16 on one GPU.
pub struct DeviceMat {
    pub w: Bf16Buf,
    pub n_out: usize,
    pub k: usize,
}

impl DeviceMat {
    pub fn upload(gpu: &Gpu, bits: &[u16], n_out: usize, k: usize) -> GpuResult<Self> {
        if !k.is_multiple_of(8) || bits.len() != n_out * k {
            return Err(GpuError::Shape(format!(
                "a weight of [{n_out}, {k}] ({} values): the GEMV reads rows in 16-byte pieces, so k must be a multiple of 8",
                bits.len()
            )));
        }
        Ok(DeviceMat { w: gpu.stream.clone_htod(bits)?, n_out, k })
    }

    pub fn bytes(&self) -> usize {
        self.n_out * self.k * 2
    }
}

/// Where a matrix product goes: f32 (logits, router and gate outputs) or bf16 (activations).
pub enum Out<'a> {
    F32(&'a mut CudaSlice<f32>),
    Bf16(&'a mut Bf16Buf),
}

/// The decode GEMV serves up to this many rows (kernels/gemv.cu `GEMV_MAX_ROWS`); more rows
/// go to the GEMM.
pub const GEMV_MAX_ROWS: usize = 8;

const NULL: u64 = 0;

fn cfg(grid: (u32, u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig { grid_dim: grid, block_dim: (block, 1, 1), shared_mem_bytes: 0 }
}

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

/// `y[r] = W · x[r]` for `rows` rows of `x` (`[rows][k]`): the GEMV for a decode step or a
/// verify pass, the tiled GEMM for a prefill.
pub fn linear(gpu: &Gpu, w: &DeviceMat, x: &Bf16Buf, rows: usize, out: Out) -> GpuResult<()> {
    let (n_i, k_i, r_i) = (w.n_out as i32, w.k as i32, rows as i32);
    if rows <= GEMV_MAX_ROWS {
        let f = gpu.function("gemv_bf16")?;
        let mut b = gpu.stream.launch_builder(f);
        b.arg(&w.w).arg(x);
        match out {
            Out::F32(y) => b.arg(y).arg(&NULL),
            Out::Bf16(y) => b.arg(&NULL).arg(y),
        };
        b.arg(&n_i).arg(&k_i).arg(&r_i);
        // SAFETY: gemv_bf16(W, x, y_f32, y_bf16, n_out, k, rows); grid ceil(n_out / 8), 256
        // threads; x holds rows·k values, y rows·n_out.
        unsafe { b.launch(cfg((blocks(w.n_out, 8), 1, 1), 256)) }?;
    } else {
        let f = gpu.function("gemm_bf16_tiled")?;
        let mut b = gpu.stream.launch_builder(f);
        b.arg(x).arg(&w.w);
        match out {
            Out::F32(y) => b.arg(y).arg(&NULL),
            Out::Bf16(y) => b.arg(&NULL).arg(y),
        };
        b.arg(&r_i).arg(&n_i).arg(&k_i);
        // SAFETY: gemm_bf16_tiled(X, W, y_f32, y_bf16, m, n, k); grid (ceil(n / 64),
        // ceil(m / 64)), 256 threads.
        unsafe { b.launch(cfg((blocks(w.n_out, 64), blocks(rows, 64), 1), 256)) }?;
    }
    Ok(())
}

/// Zero-centred RMSNorm of `rows` rows of `n`, `stride` apart, from `x` into `y` (`y` may be
/// `x`: each thread reads an element before it writes it, after the block's sum).
pub fn rms_norm(
    gpu: &Gpu,
    x: &Bf16Buf,
    w: &Bf16Buf,
    y: &Bf16Buf,
    rows: usize,
    n: usize,
    stride: usize,
    eps: f32,
) -> GpuResult<()> {
    let f = gpu.function("rms_norm")?;
    let (n_i, s_i, zc) = (n as i32, stride as i64, 1i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(x).arg(w).arg(y).arg(&n_i).arg(&s_i).arg(&eps).arg(&zc);
    // SAFETY: rms_norm(x, w, y, n, stride, eps, zero_centred); one block per row, 256 threads.
    unsafe { b.launch(cfg((rows as u32, 1, 1), 256)) }?;
    Ok(())
}

/// The GDN output norm per value head: `rows` = tokens · value heads, rows of `n` = dv.
pub fn rms_norm_gated(
    gpu: &Gpu,
    x: &Bf16Buf,
    z: &Bf16Buf,
    w: &Bf16Buf,
    y: &mut Bf16Buf,
    rows: usize,
    n: usize,
    eps: f32,
) -> GpuResult<()> {
    let f = gpu.function("rms_norm_gated")?;
    let n_i = n as i32;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(x).arg(z).arg(w).arg(y).arg(&n_i).arg(&eps);
    // SAFETY: rms_norm_gated(x, z, w, y, n, eps); one block per row, 128 threads.
    unsafe { b.launch(cfg((rows as u32, 1, 1), 128)) }?;
    Ok(())
}

/// The rotary parameters of a model (text: the three mRoPE position ids are equal).
#[derive(Debug, Clone, Copy)]
pub struct RopeParams {
    pub rotary_dim: usize,
    pub theta: f32,
    pub sec_h: i32,
    pub sec_w: i32,
}

/// Rotary embedding in place on `heads` heads per token, rows `token_stride` apart, heads
/// `head_stride` apart; `pos` holds each token's position.
pub fn rope(
    gpu: &Gpu,
    x: &Bf16Buf,
    pos: &CudaSlice<i32>,
    tokens: usize,
    heads: usize,
    token_stride: usize,
    head_stride: usize,
    r: RopeParams,
) -> GpuResult<()> {
    let f = gpu.function("rope_mrope")?;
    let (ts, hs, rd) = (token_stride as i64, head_stride as i32, r.rotary_dim as i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(x).arg(pos).arg(pos).arg(pos).arg(&ts).arg(&hs).arg(&rd).arg(&r.theta).arg(&r.sec_h).arg(&r.sec_w);
    // SAFETY: rope_mrope(x, pos_t, pos_h, pos_w, token_stride, head_stride, rotary_dim, theta,
    // sec_h, sec_w); grid (tokens, heads), rotary_dim / 2 threads.
    unsafe { b.launch(cfg((tokens as u32, heads as u32, 1), (r.rotary_dim / 2) as u32)) }?;
    Ok(())
}

/// Appends this pass's keys and values (`[T][kv_heads·hd]`) to the caches at `pos0..`.
pub fn kv_append(
    gpu: &Gpu,
    k: &Bf16Buf,
    v: &Bf16Buf,
    kc: &mut Bf16Buf,
    vc: &mut Bf16Buf,
    pos0: usize,
    tokens: usize,
    kv_heads: usize,
    hd: usize,
    l_max: usize,
) -> GpuResult<()> {
    let f = gpu.function("kv_append")?;
    let stride = (kv_heads * hd) as i64;
    let (p_i, hd_i, l_i) = (pos0 as i32, hd as i32, l_max as i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(k).arg(&stride).arg(v).arg(&stride).arg(kc).arg(vc).arg(&p_i).arg(&hd_i).arg(&l_i);
    // SAFETY: kv_append(k, k_stride, v, v_stride, kcache, vcache, pos0, hd, l_max); grid
    // (tokens, kv_heads), hd threads; pos0 + tokens ≤ l_max (checked by the caller).
    unsafe { b.launch(cfg((tokens as u32, kv_heads as u32, 1), hd as u32)) }?;
    Ok(())
}

/// Causal GQA attention with the output gate: `q` rows interleave query and gate per head
/// (`[T][heads][2·hd]`), `out` is `[T][heads·hd]`.
pub fn attention(
    gpu: &Gpu,
    q: &Bf16Buf,
    kc: &Bf16Buf,
    vc: &Bf16Buf,
    out: &mut Bf16Buf,
    pos0: usize,
    tokens: usize,
    heads: usize,
    kv_heads: usize,
    hd: usize,
    l_max: usize,
) -> GpuResult<()> {
    let f = gpu.function("attn_gqa")?;
    let gate: CudaView<u16> = q.slice(hd..);
    let (q_ts, q_hs) = ((heads * 2 * hd) as i64, (2 * hd) as i32);
    let (l_i, p_i, nh_i, nkv_i, hd_i) = (l_max as i32, pos0 as i32, heads as i32, kv_heads as i32, hd as i32);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut b = gpu.stream.launch_builder(f);
    b.arg(q).arg(&q_ts).arg(&q_hs).arg(&gate).arg(kc).arg(vc).arg(&l_i).arg(out);
    b.arg(&p_i).arg(&nh_i).arg(&nkv_i).arg(&hd_i).arg(&scale);
    // SAFETY: attn_gqa(q, q_token_stride, q_head_stride, gate, kcache, vcache, l_max, out,
    // pos0, n_heads, n_kv_heads, hd, scale); grid (T, heads), 128 threads; hd ≤ 256.
    unsafe { b.launch(cfg((tokens as u32, heads as u32, 1), 128)) }?;
    Ok(())
}

/// The conv for ≤ 8 tokens (decode, verify): with `slots`, each token's window is kept and the
/// state left as before the pass.
pub fn conv_decode(
    gpu: &Gpu,
    x: &Bf16Buf,
    state: &mut Bf16Buf,
    w: &Bf16Buf,
    y: &mut Bf16Buf,
    slots: Option<&mut Bf16Buf>,
    tokens: usize,
    channels: usize,
    kernel: usize,
) -> GpuResult<()> {
    let f = gpu.function("conv1d_decode")?;
    let (t_i, c_i, k_i) = (tokens as i32, channels as i32, kernel as i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(x).arg(state).arg(w).arg(y);
    match slots {
        Some(s) => b.arg(s),
        None => b.arg(&NULL),
    };
    b.arg(&t_i).arg(&c_i).arg(&k_i);
    // SAFETY: conv1d_decode(x, state, w, y, slots, tokens, channels, kernel); grid
    // ceil(channels / 256), 256 threads.
    unsafe { b.launch(cfg((blocks(channels, 256), 1, 1), 256)) }?;
    Ok(())
}

/// The conv over a prefill's tokens at once, then the state saved from its last inputs.
pub fn conv_prefill(
    gpu: &Gpu,
    x: &Bf16Buf,
    state: &mut Bf16Buf,
    w: &Bf16Buf,
    y: &mut Bf16Buf,
    tokens: usize,
    channels: usize,
    kernel: usize,
) -> GpuResult<()> {
    let (t_i, c_i, k_i) = (tokens as i32, channels as i32, kernel as i32);
    let f = gpu.function("conv1d_prefill")?;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(x).arg(&*state).arg(w).arg(y).arg(&t_i).arg(&c_i).arg(&k_i);
    // SAFETY: conv1d_prefill(x, state, w, y, tokens, channels, kernel); grid
    // (ceil(channels / 256), tokens), 256 threads.
    unsafe { b.launch(cfg((blocks(channels, 256), tokens as u32, 1), 256)) }?;
    let f = gpu.function("conv1d_save_state")?;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(x).arg(state).arg(&t_i).arg(&c_i).arg(&k_i);
    // SAFETY: conv1d_save_state(x, state, tokens, channels, kernel), after the prefill on the
    // same stream; grid ceil(channels / 256), 256 threads.
    unsafe { b.launch(cfg((blocks(channels, 256), 1, 1), 256)) }?;
    Ok(())
}

/// After a verify pass: the state becomes slot `keep − 1` (no change for `keep` = 0).
pub fn conv_restore(gpu: &Gpu, state: &mut Bf16Buf, slots: &Bf16Buf, keep: usize, n: usize) -> GpuResult<()> {
    let f = gpu.function("conv1d_restore_slot")?;
    let (k_i, n_i) = (keep as i32, n as i64);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(state).arg(slots).arg(&k_i).arg(&n_i);
    // SAFETY: conv1d_restore_slot(state, slots, keep, n); slots hold ≥ keep windows of n.
    unsafe { b.launch(cfg((blocks(n, 256), 1, 1), 256)) }?;
    Ok(())
}

pub fn gdn_restore(
    gpu: &Gpu,
    state: &mut CudaSlice<f32>,
    slots: &CudaSlice<f32>,
    keep: usize,
    n: usize,
) -> GpuResult<()> {
    let f = gpu.function("gdn_restore_slot")?;
    let (k_i, n_i) = (keep as i32, n as i64);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(state).arg(slots).arg(&k_i).arg(&n_i);
    // SAFETY: gdn_restore_slot(state, slots, keep, n); slots hold ≥ keep states of n.
    unsafe { b.launch(cfg((blocks(n, 256), 1, 1), 256)) }?;
    Ok(())
}

/// The shapes of a GDN layer's heads.
#[derive(Debug, Clone, Copy)]
pub struct GdnShape {
    pub k_heads: usize,
    pub v_heads: usize,
    pub dk: usize,
    pub dv: usize,
}

/// The gated delta rule over `tokens` tokens (q/k L2 norm and the gates inside); with `slots`
/// the state after each token is kept and the state left as before the pass.
pub fn gdn(
    gpu: &Gpu,
    qkv: &Bf16Buf,
    a: &Bf16Buf,
    b_in: &Bf16Buf,
    a_log: &CudaSlice<f32>,
    dt_bias: &CudaSlice<f32>,
    state: &mut CudaSlice<f32>,
    slots: Option<&mut CudaSlice<f32>>,
    out: &mut Bf16Buf,
    tokens: usize,
    s: GdnShape,
) -> GpuResult<()> {
    let f = gpu.function("gdn_recurrent")?;
    let (t_i, hk, hv, dk, dv) = (tokens as i32, s.k_heads as i32, s.v_heads as i32, s.dk as i32, s.dv as i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(qkv).arg(a).arg(b_in).arg(a_log).arg(dt_bias).arg(state);
    match slots {
        Some(sl) => b.arg(sl),
        None => b.arg(&NULL),
    };
    b.arg(out).arg(&t_i).arg(&hk).arg(&hv).arg(&dk).arg(&dv);
    // SAFETY: gdn_recurrent(qkv, a, b, A_log, dt_bias, state, slots, out, tokens, n_k_heads,
    // n_v_heads, dk, dv); grid (Hv, ⌈dv / 16⌉), 128 threads; dk ≤ 256.
    unsafe { b.launch(cfg((s.v_heads as u32, s.dv.div_ceil(16) as u32, 1), 128)) }?;
    Ok(())
}

/// `x += y` elementwise (bf16, rounded once): the residual adds.
pub fn add_into(gpu: &Gpu, x: &Bf16Buf, y: &Bf16Buf, n: usize) -> GpuResult<()> {
    let f = gpu.function("add_bf16")?;
    let n_i = n as i64;
    let mut b = gpu.stream.launch_builder(f);
    // The kernel's x and out are not restrict: the same buffer is both.
    b.arg(x).arg(y).arg(x).arg(&n_i);
    // SAFETY: add_bf16(x, y, out, n); ceil(n / 256) blocks of 256.
    unsafe { b.launch(cfg((blocks(n, 256), 1, 1), 256)) }?;
    Ok(())
}

/// SwiGLU over fused `[rows][2·inter]` gate/up rows into `[rows][inter]`.
pub fn swiglu(gpu: &Gpu, gate_up: &Bf16Buf, out: &mut Bf16Buf, rows: usize, inter: usize) -> GpuResult<()> {
    let f = gpu.function("swiglu")?;
    let (i_i, n) = (inter as i32, (rows * inter) as i64);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(gate_up).arg(out).arg(&i_i).arg(&n);
    // SAFETY: swiglu(gate_up, out, inter, n); ceil(n / 256) blocks of 256.
    unsafe { b.launch(cfg((blocks(rows * inter, 256), 1, 1), 256)) }?;
    Ok(())
}

/// Embedding rows of `ids` into `out` (`[T][hidden]`).
pub fn embed(gpu: &Gpu, table: &DeviceMat, ids: &CudaSlice<u32>, out: &mut Bf16Buf, tokens: usize) -> GpuResult<()> {
    let f = gpu.function("embed_gather")?;
    let (h_i, v_u) = (table.k as i32, table.n_out as u32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(&table.w).arg(ids).arg(out).arg(&h_i).arg(&v_u);
    // SAFETY: embed_gather(table, ids, out, hidden, vocab); one block per token, 256 threads.
    unsafe { b.launch(cfg((tokens as u32, 1, 1), 256)) }?;
    Ok(())
}

/// Router top-k per token: softmax, the k largest (ties to the lower id), renormalised.
pub fn moe_topk(
    gpu: &Gpu,
    logits: &CudaSlice<f32>,
    ids: &mut CudaSlice<i32>,
    weights: &mut CudaSlice<f32>,
    tokens: usize,
    experts: usize,
    k: usize,
    renorm: bool,
) -> GpuResult<()> {
    let f = gpu.function("moe_topk")?;
    let (e_i, k_i, r_i) = (experts as i32, k as i32, renorm as i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(logits).arg(ids).arg(weights).arg(&e_i).arg(&k_i).arg(&r_i);
    // SAFETY: moe_topk(logits, ids, weights, experts, k, renorm); one block per token, 256
    // threads; experts ≤ 1024.
    unsafe { b.launch(cfg((tokens as u32, 1, 1), 256)) }?;
    Ok(())
}

/// One GEMV per (token, slot) pair through its expert's rows of the expert-major `w`
/// (`[E][n_out][k_in]`).
pub fn moe_gemv(
    gpu: &Gpu,
    w: &Bf16Buf,
    ids: &CudaSlice<i32>,
    x: &Bf16Buf,
    x_per_pair: bool,
    y: &mut Bf16Buf,
    n_out: usize,
    k_in: usize,
    top_k: usize,
    pairs: usize,
) -> GpuResult<()> {
    let f = gpu.function("moe_gemv")?;
    let (pp, n_i, k_i, t_i) = (x_per_pair as i32, n_out as i32, k_in as i32, top_k as i32);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(w).arg(ids).arg(x).arg(&pp).arg(y).arg(&n_i).arg(&k_i).arg(&t_i);
    // SAFETY: moe_gemv(W, ids, x, x_per_pair, y, n_out, k_in, top_k); grid (ceil(n_out / 8),
    // pairs), 256 threads.
    unsafe { b.launch(cfg((blocks(n_out, 8), pairs as u32, 1), 256)) }?;
    Ok(())
}

/// The routed experts' outputs summed per token in ascending expert id, weighted.
pub fn moe_combine(
    gpu: &Gpu,
    y: &Bf16Buf,
    ids: &CudaSlice<i32>,
    weights: &CudaSlice<f32>,
    out: &mut Bf16Buf,
    tokens: usize,
    hidden: usize,
    top_k: usize,
) -> GpuResult<()> {
    let f = gpu.function("moe_combine")?;
    let (h_i, k_i, n) = (hidden as i32, top_k as i32, (tokens * hidden) as i64);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(y).arg(ids).arg(weights).arg(out).arg(&h_i).arg(&k_i).arg(&n);
    // SAFETY: moe_combine(y, ids, weights, out, hidden, top_k, n); ceil(n / 256) blocks.
    unsafe { b.launch(cfg((blocks(tokens * hidden, 256), 1, 1), 256)) }?;
    Ok(())
}

/// The shared expert's gate: `out[t] = x[t] · round(sigmoid(g[t]))`.
pub fn sigmoid_scale(
    gpu: &Gpu,
    x: &Bf16Buf,
    g: &CudaSlice<f32>,
    out: &mut Bf16Buf,
    tokens: usize,
    hidden: usize,
) -> GpuResult<()> {
    let f = gpu.function("sigmoid_scale_rows")?;
    let (h_i, n) = (hidden as i32, (tokens * hidden) as i64);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(x).arg(g).arg(out).arg(&h_i).arg(&n);
    // SAFETY: sigmoid_scale_rows(x, g, out, hidden, n); ceil(n / 256) blocks of 256.
    unsafe { b.launch(cfg((blocks(tokens * hidden, 256), 1, 1), 256)) }?;
    Ok(())
}

/// Rows side by side: `out[r] = [a[r], b[r]]` (the MTP layer's fc input).
pub fn concat_rows(
    gpu: &Gpu,
    a: &Bf16Buf,
    b_in: &Bf16Buf,
    out: &mut Bf16Buf,
    rows: usize,
    na: usize,
    nb: usize,
) -> GpuResult<()> {
    let f = gpu.function("concat_rows")?;
    let (a_i, b_i, n) = (na as i32, nb as i32, (rows * (na + nb)) as i64);
    let mut b = gpu.stream.launch_builder(f);
    b.arg(a).arg(b_in).arg(out).arg(&a_i).arg(&b_i).arg(&n);
    // SAFETY: concat_rows(a, b, out, na, nb, n); ceil(n / 256) blocks of 256.
    unsafe { b.launch(cfg((blocks(rows * (na + nb), 256), 1, 1), 256)) }?;
    Ok(())
}
