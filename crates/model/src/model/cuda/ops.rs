//! Typed launches of the kernels in `kernels/*.cu`: one function per kernel, its grid and
//! block as the kernel's comment states, the arguments in the kernel's order. The CUDA model
//! (`model.rs`) composes them; `verify/parity.rs` checks each kernel alone against its CPU twin.
//!
//! bf16 buffers are `Buf<u16>` (raw bits, as in the kernels). Every launch goes through the
//! [`Device`](super::device::Device) seam in order, so each kernel sees the writes of the ones
//! before it, on a GPU and on the emulated device alike.

// The wrappers take the kernels' parameters one for one.
#![allow(clippy::too_many_arguments)]

use super::device::{Arg, Buf};
use super::error::{GpuError, GpuResult};
use super::runtime::Gpu;
use crate::model::trace::GdnPassTrace;

pub type Bf16Buf = Buf<u16>;

/// A weight matrix `[n_out][k]` on one GPU.
pub struct DeviceMat {
    pub w: MatWeights,
    pub n_out: usize,
    pub k: usize,
}

/// How a device matrix holds its weights: bf16, or FP8 as the checkpoint stores it (a byte a
/// weight, dequantised in the kernels' registers).
pub enum MatWeights {
    Bf16(Bf16Buf),
    Fp8(DeviceFp8),
}

/// An [`Fp8Stack`](crate::model::fp8::Fp8Stack) on a device: the kernels' `Fp8Weights`
/// (kernels/prelude.cu).
pub struct DeviceFp8 {
    pub q: Buf<u8>,
    pub scales: Buf<f32>,
    pub band: Buf<i32>,
    pub grid_cols: usize,
}

impl DeviceFp8 {
    pub fn upload(gpu: &Gpu, stack: &crate::model::fp8::Fp8Stack) -> GpuResult<Self> {
        Ok(DeviceFp8 {
            q: gpu.upload(&stack.codes)?,
            scales: gpu.upload(&stack.scales)?,
            band: gpu.upload(&stack.band)?,
            grid_cols: stack.grid_cols,
        })
    }

    /// The kernels' (`Q`, `S`, `band`, `gc`).
    fn args(&self) -> [Arg; 4] {
        [self.q.arg(), self.scales.arg(), self.band.arg(), Arg::I32(self.grid_cols as i32)]
    }

    fn bytes(&self) -> usize {
        self.q.bytes() + self.scales.bytes() + self.band.bytes()
    }
}

impl MatWeights {
    pub fn bytes(&self) -> usize {
        match self {
            MatWeights::Bf16(w) => w.bytes(),
            MatWeights::Fp8(w) => w.bytes(),
        }
    }
}

impl DeviceMat {
    fn check(n_out: usize, k: usize, values: usize) -> GpuResult<()> {
        if !k.is_multiple_of(8) || values != n_out * k {
            return Err(GpuError::Shape(format!(
                "a weight of [{n_out}, {k}] ({values} values): the GEMV reads rows in pieces of 8, so k must be a multiple of 8"
            )));
        }
        Ok(())
    }

    pub fn upload(gpu: &Gpu, bits: &[u16], n_out: usize, k: usize) -> GpuResult<Self> {
        Self::check(n_out, k, bits.len())?;
        Ok(DeviceMat { w: MatWeights::Bf16(gpu.upload(bits)?), n_out, k })
    }

    /// FP8 rows as stacked for the device (`Linear::fp8_rows`).
    pub fn upload_fp8(gpu: &Gpu, stack: &crate::model::fp8::Fp8Stack, n_out: usize, k: usize) -> GpuResult<Self> {
        Self::check(n_out, k, stack.codes.len())?;
        if stack.rows() != n_out {
            return Err(GpuError::Shape(format!("FP8 weight of [{n_out}, {k}] with {} band rows", stack.rows())));
        }
        Ok(DeviceMat { w: MatWeights::Fp8(DeviceFp8::upload(gpu, stack)?), n_out, k })
    }

    pub fn bytes(&self) -> usize {
        self.w.bytes()
    }

    /// The bf16 table (the embedding: never FP8 in Qwen's releases).
    fn bf16(&self, what: &str) -> GpuResult<&Bf16Buf> {
        match &self.w {
            MatWeights::Bf16(w) => Ok(w),
            MatWeights::Fp8(_) => Err(GpuError::Shape(format!("{what}: an FP8 table (only bf16 is read here)"))),
        }
    }
}

/// Where a matrix product goes: f32 (logits, router and gate outputs) or bf16 (activations).
pub enum Out<'a> {
    F32(&'a mut Buf<f32>),
    Bf16(&'a mut Bf16Buf),
}

/// The decode GEMV serves up to this many rows (kernels/gemv.cu `GEMV_MAX_ROWS`); more rows
/// go to the GEMM.
pub const GEMV_MAX_ROWS: usize = 8;

impl Out<'_> {
    /// The kernels' (`y_f32`, `y_bf16`) pair: one of them, the other null.
    fn args(&self) -> [Arg; 2] {
        match self {
            Out::F32(y) => [y.arg(), Arg::NULL],
            Out::Bf16(y) => [Arg::NULL, y.arg()],
        }
    }
}

fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

/// `y[r] = W · x[r]` for `rows` rows of `x` (`[rows][k]`): the GEMV for a decode step or a
/// verify pass, the tiled GEMM for a prefill.
pub fn linear(gpu: &Gpu, w: &DeviceMat, x: &Bf16Buf, rows: usize, out: Out) -> GpuResult<()> {
    let (n_i, k_i, r_i) = (Arg::I32(w.n_out as i32), Arg::I32(w.k as i32), Arg::I32(rows as i32));
    let [y_f32, y_bf16] = out.args();
    match (&w.w, rows <= GEMV_MAX_ROWS) {
        (MatWeights::Bf16(wb), true) => {
            // SAFETY: gemv_bf16(W, x, y_f32, y_bf16, n_out, k, rows); grid ceil(n_out / 8), 256
            // threads; x holds rows·k values, y rows·n_out.
            unsafe {
                gpu.launch(
                    "gemv_bf16",
                    (blocks(w.n_out, 8), 1, 1),
                    256,
                    &[wb.arg(), x.arg(), y_f32, y_bf16, n_i, k_i, r_i],
                )
            }
        }
        (MatWeights::Fp8(f), true) => {
            let [q, s, band, gc] = f.args();
            // SAFETY: gemv_fp8(Q, S, band, gc, x, y_f32, y_bf16, n_out, k, rows); as gemv_bf16;
            // Q holds n_out·k codes, band n_out rows of S.
            unsafe {
                gpu.launch(
                    "gemv_fp8",
                    (blocks(w.n_out, 8), 1, 1),
                    256,
                    &[q, s, band, gc, x.arg(), y_f32, y_bf16, n_i, k_i, r_i],
                )
            }
        }
        (MatWeights::Bf16(wb), false) => {
            // SAFETY: gemm_bf16_tiled(X, W, y_f32, y_bf16, m, n, k); grid (ceil(n / 64),
            // ceil(m / 64)), 256 threads.
            unsafe {
                gpu.launch(
                    "gemm_bf16_tiled",
                    (blocks(w.n_out, 64), blocks(rows, 64), 1),
                    256,
                    &[x.arg(), wb.arg(), y_f32, y_bf16, r_i, n_i, k_i],
                )
            }
        }
        (MatWeights::Fp8(f), false) => {
            let [q, s, band, gc] = f.args();
            // SAFETY: gemm_fp8_tiled(X, Q, S, band, gc, y_f32, y_bf16, m, n, k); as
            // gemm_bf16_tiled.
            unsafe {
                gpu.launch(
                    "gemm_fp8_tiled",
                    (blocks(w.n_out, 64), blocks(rows, 64), 1),
                    256,
                    &[x.arg(), q, s, band, gc, y_f32, y_bf16, r_i, n_i, k_i],
                )
            }
        }
    }
}

/// Zero-centred RMSNorm of `rows` rows of `n`, `stride` apart, from `x` into `y` (`y` may be
/// `x`: each thread reads an element before it writes it, after the block's sum; the kernel's
/// `x` and `y` are not `__restrict__` for that).
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
    let args = [x.arg(), w.arg(), y.arg(), Arg::I32(n as i32), Arg::I64(stride as i64), Arg::F32(eps), Arg::I32(1)];
    // SAFETY: rms_norm(x, w, y, n, stride, eps, zero_centred); one block per row, 256 threads.
    unsafe { gpu.launch("rms_norm", (rows as u32, 1, 1), 256, &args) }
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
    let args = [x.arg(), z.arg(), w.arg(), y.arg(), Arg::I32(n as i32), Arg::F32(eps)];
    // SAFETY: rms_norm_gated(x, z, w, y, n, eps); one block per row, 128 threads.
    unsafe { gpu.launch("rms_norm_gated", (rows as u32, 1, 1), 128, &args) }
}

/// The rotary parameters of a model (text: the three mRoPE position ids are equal), with the
/// inverse frequencies computed once on the host by the engine's own expression
/// ([`crate::model::rope::Rope`]): a GPU's `powf` may differ from the CPU's by an ulp, which
/// moves the angle by many bf16 steps at long positions.
pub struct RopeParams {
    pub rotary_dim: usize,
    /// `[rotary_dim / 2]` f32 on the device.
    pub inv_freq: Buf<f32>,
    pub sec_h: i32,
    pub sec_w: i32,
}

/// Rotary embedding in place on `heads` heads per token, rows `token_stride` apart, heads
/// `head_stride` apart; `pos` holds each token's position.
pub fn rope(
    gpu: &Gpu,
    x: &Bf16Buf,
    pos: &Buf<i32>,
    tokens: usize,
    heads: usize,
    token_stride: usize,
    head_stride: usize,
    r: &RopeParams,
) -> GpuResult<()> {
    let args = [
        x.arg(),
        pos.arg(),
        pos.arg(),
        pos.arg(),
        Arg::I64(token_stride as i64),
        Arg::I32(head_stride as i32),
        Arg::I32(r.rotary_dim as i32),
        r.inv_freq.arg(),
        Arg::I32(r.sec_h),
        Arg::I32(r.sec_w),
    ];
    // SAFETY: rope_mrope(x, pos_t, pos_h, pos_w, token_stride, head_stride, rotary_dim,
    // inv_freq, sec_h, sec_w); grid (tokens, heads), rotary_dim / 2 threads.
    unsafe { gpu.launch("rope_mrope", (tokens as u32, heads as u32, 1), (r.rotary_dim / 2) as u32, &args) }
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
    let stride = Arg::I64((kv_heads * hd) as i64);
    let args = [
        k.arg(),
        stride,
        v.arg(),
        stride,
        kc.arg(),
        vc.arg(),
        Arg::I32(pos0 as i32),
        Arg::I32(hd as i32),
        Arg::I32(l_max as i32),
    ];
    // SAFETY: kv_append(k, k_stride, v, v_stride, kcache, vcache, pos0, hd, l_max); grid
    // (tokens, kv_heads), hd threads; pos0 + tokens ≤ l_max (checked by the caller).
    unsafe { gpu.launch("kv_append", (tokens as u32, kv_heads as u32, 1), hd as u32, &args) }
}

/// The attention scale as the CPU engine computes it (`hd^-0.5` through `powf`: for some head
/// sizes, 24 among them, `1 / sqrt(hd)` is one f32 ulp away).
pub fn attention_scale(hd: usize) -> f32 {
    (hd as f32).powf(-0.5)
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
    let args = [
        q.arg(),
        Arg::I64((heads * 2 * hd) as i64),
        Arg::I32((2 * hd) as i32),
        q.at(hd),
        kc.arg(),
        vc.arg(),
        Arg::I32(l_max as i32),
        out.arg(),
        Arg::I32(pos0 as i32),
        Arg::I32(heads as i32),
        Arg::I32(kv_heads as i32),
        Arg::I32(hd as i32),
        Arg::F32(attention_scale(hd)),
    ];
    // SAFETY: attn_gqa(q, q_token_stride, q_head_stride, gate, kcache, vcache, l_max, out,
    // pos0, n_heads, n_kv_heads, hd, scale); grid (T, heads), 128 threads; hd ≤ 256.
    unsafe { gpu.launch("attn_gqa", (tokens as u32, heads as u32, 1), 128, &args) }
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
    let args = [
        x.arg(),
        state.arg(),
        w.arg(),
        y.arg(),
        slots.map_or(Arg::NULL, |s| s.arg()),
        Arg::I32(tokens as i32),
        Arg::I32(channels as i32),
        Arg::I32(kernel as i32),
    ];
    // SAFETY: conv1d_decode(x, state, w, y, slots, tokens, channels, kernel); grid
    // ceil(channels / 256), 256 threads.
    unsafe { gpu.launch("conv1d_decode", (blocks(channels, 256), 1, 1), 256, &args) }
}

/// The conv over a prefill's tokens at once, then the state saved from its last inputs.
/// Tokens go on grid x (up to 2³¹ − 1; grid y stops at 65535), channel blocks on y.
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
    let (t_i, c_i, k_i) = (Arg::I32(tokens as i32), Arg::I32(channels as i32), Arg::I32(kernel as i32));
    // SAFETY: conv1d_prefill(x, state, w, y, tokens, channels, kernel); grid (tokens,
    // ceil(channels / 256)), 256 threads.
    unsafe {
        gpu.launch(
            "conv1d_prefill",
            (tokens as u32, blocks(channels, 256), 1),
            256,
            &[x.arg(), state.arg(), w.arg(), y.arg(), t_i, c_i, k_i],
        )
    }?;
    // SAFETY: conv1d_save_state(x, state, tokens, channels, kernel), after the prefill in
    // order; grid ceil(channels / 256), 256 threads.
    unsafe {
        gpu.launch("conv1d_save_state", (blocks(channels, 256), 1, 1), 256, &[x.arg(), state.arg(), t_i, c_i, k_i])
    }
}

/// After a verify pass: the state becomes slot `keep − 1` (no change for `keep` = 0).
pub fn conv_restore(gpu: &Gpu, state: &mut Bf16Buf, slots: &Bf16Buf, keep: usize, n: usize) -> GpuResult<()> {
    let args = [state.arg(), slots.arg(), Arg::I32(keep as i32), Arg::I64(n as i64)];
    // SAFETY: conv1d_restore_slot(state, slots, keep, n); slots hold ≥ keep windows of n.
    unsafe { gpu.launch("conv1d_restore_slot", (blocks(n, 256), 1, 1), 256, &args) }
}

pub fn gdn_restore(gpu: &Gpu, state: &mut Buf<f32>, slots: &Buf<f32>, keep: usize, n: usize) -> GpuResult<()> {
    let args = [state.arg(), slots.arg(), Arg::I32(keep as i32), Arg::I64(n as i64)];
    // SAFETY: gdn_restore_slot(state, slots, keep, n); slots hold ≥ keep states of n.
    unsafe { gpu.launch("gdn_restore_slot", (blocks(n, 256), 1, 1), 256, &args) }
}

/// The shapes of a GDN layer's heads.
#[derive(Debug, Clone, Copy)]
pub struct GdnShape {
    pub k_heads: usize,
    pub v_heads: usize,
    pub dk: usize,
    pub dv: usize,
}

impl GdnShape {
    /// Blocks per value head: 16 value rows each.
    pub fn row_blocks(&self) -> usize {
        self.dv.div_ceil(16)
    }

    /// f32 values of a state trace of `tokens` tokens: `[T][Hv][4]` β, g, b and a, then
    /// `[Hv][row blocks][4 warps][3]` sums (see kernels/gdn.cu).
    pub fn trace_len(&self, tokens: usize) -> usize {
        tokens * self.v_heads * 4 + self.v_heads * self.row_blocks() * 4 * 3
    }
}

/// A GDN layer's trace from the kernel's buffer ([`GdnShape::trace_len`], the layout `gdn_recurrent` writes): β, g and
/// their inputs b, a (bf16 values) as the kernel used them, the per-warp sums added in f64 per head.
pub fn read_gdn_trace(buf: &[f32], tokens: usize, s: GdnShape) -> GdnPassTrace {
    let hv = s.v_heads;
    let field = |k: usize| (0..tokens * hv).map(|i| buf[4 * i + k]).collect::<Vec<f32>>();
    let (beta, g, b, a) = (field(0), field(1), field(2), field(3));
    let sums = &buf[tokens * hv * 4..];
    let per_head = s.row_blocks() * 4 * 3;
    let (mut state_norm, mut delta_norm, mut nonfinite) = (vec![0f32; hv], vec![0f32; hv], vec![0u32; hv]);
    for h in 0..hv {
        let (mut ss, mut dd, mut bad) = (0f64, 0f64, 0f64);
        for w in sums[h * per_head..(h + 1) * per_head].chunks_exact(3) {
            ss += w[0] as f64;
            dd += w[1] as f64;
            bad += w[2] as f64;
        }
        state_norm[h] = ss.sqrt() as f32;
        delta_norm[h] = dd.sqrt() as f32;
        nonfinite[h] = bad as u32;
    }
    GdnPassTrace { tokens, heads: hv, beta, g, a, b, gates_bf16: true, state_norm, delta_norm, nonfinite }
}

/// The gated delta rule over `tokens` tokens (q/k L2 norm and the gates inside); with `slots`
/// the state after each token is kept and the state left as before the pass; with `trace`
/// ([`GdnShape::trace_len`]) β and g per token and head, and per warp of rows the sums of S²
/// and ΔS² and the non-finite count.
pub fn gdn(
    gpu: &Gpu,
    qkv: &Bf16Buf,
    a: &Bf16Buf,
    b_in: &Bf16Buf,
    a_log: &Buf<f32>,
    dt_bias: &Buf<f32>,
    state: &mut Buf<f32>,
    slots: Option<&mut Buf<f32>>,
    trace: Option<&mut Buf<f32>>,
    out: &mut Bf16Buf,
    tokens: usize,
    s: GdnShape,
) -> GpuResult<()> {
    let args = [
        qkv.arg(),
        a.arg(),
        b_in.arg(),
        a_log.arg(),
        dt_bias.arg(),
        state.arg(),
        slots.map_or(Arg::NULL, |x| x.arg()),
        trace.map_or(Arg::NULL, |x| x.arg()),
        out.arg(),
        Arg::I32(tokens as i32),
        Arg::I32(s.k_heads as i32),
        Arg::I32(s.v_heads as i32),
        Arg::I32(s.dk as i32),
        Arg::I32(s.dv as i32),
    ];
    // SAFETY: gdn_recurrent(qkv, a, b, A_log, dt_bias, state, slots, trace, out, tokens,
    // n_k_heads, n_v_heads, dk, dv); grid (Hv, ⌈dv / 16⌉), 128 threads; dk ≤ 256.
    unsafe { gpu.launch("gdn_recurrent", (s.v_heads as u32, s.row_blocks() as u32, 1), 128, &args) }
}

/// `x += y` elementwise (bf16, rounded once): the residual adds.
pub fn add_into(gpu: &Gpu, x: &Bf16Buf, y: &Bf16Buf, n: usize) -> GpuResult<()> {
    // The kernel's x and out are not restrict: the same buffer is both.
    let args = [x.arg(), y.arg(), x.arg(), Arg::I64(n as i64)];
    // SAFETY: add_bf16(x, y, out, n); ceil(n / 256) blocks of 256.
    unsafe { gpu.launch("add_bf16", (blocks(n, 256), 1, 1), 256, &args) }
}

/// SwiGLU over fused `[rows][2·inter]` gate/up rows into `[rows][inter]`.
pub fn swiglu(gpu: &Gpu, gate_up: &Bf16Buf, out: &mut Bf16Buf, rows: usize, inter: usize) -> GpuResult<()> {
    let args = [gate_up.arg(), out.arg(), Arg::I32(inter as i32), Arg::I64((rows * inter) as i64)];
    // SAFETY: swiglu(gate_up, out, inter, n); ceil(n / 256) blocks of 256.
    unsafe { gpu.launch("swiglu", (blocks(rows * inter, 256), 1, 1), 256, &args) }
}

/// Embedding rows of `ids` into `out` (`[T][hidden]`).
pub fn embed(gpu: &Gpu, table: &DeviceMat, ids: &Buf<u32>, out: &mut Bf16Buf, tokens: usize) -> GpuResult<()> {
    let args = [
        table.bf16("the embedding")?.arg(),
        ids.arg(),
        out.arg(),
        Arg::I32(table.k as i32),
        Arg::U32(table.n_out as u32),
    ];
    // SAFETY: embed_gather(table, ids, out, hidden, vocab); one block per token, 256 threads.
    unsafe { gpu.launch("embed_gather", (tokens as u32, 1, 1), 256, &args) }
}

/// Router top-k per token: softmax of the bf16-rounded logits, the k largest (ties to the
/// lower id), renormalised.
pub fn moe_topk(
    gpu: &Gpu,
    logits: &Buf<f32>,
    ids: &mut Buf<i32>,
    weights: &mut Buf<f32>,
    tokens: usize,
    experts: usize,
    k: usize,
    renorm: bool,
) -> GpuResult<()> {
    let args =
        [logits.arg(), ids.arg(), weights.arg(), Arg::I32(experts as i32), Arg::I32(k as i32), Arg::I32(renorm as i32)];
    // SAFETY: moe_topk(logits, ids, weights, experts, k, renorm); one block per token, 256
    // threads; experts ≤ 1024.
    unsafe { gpu.launch("moe_topk", (tokens as u32, 1, 1), 256, &args) }
}

/// One GEMV per (token, slot) pair through its expert's rows of the expert-major `w`
/// (`[E][n_out][k_in]`). Pairs go on grid x (up to 2³¹ − 1: a 35B-A3B prefill of 8192
/// tokens makes 65536 pairs, past grid y's 65535), feature blocks on y.
pub fn moe_gemv(
    gpu: &Gpu,
    w: &MatWeights,
    ids: &Buf<i32>,
    x: &Bf16Buf,
    x_per_pair: bool,
    y: &mut Bf16Buf,
    n_out: usize,
    k_in: usize,
    top_k: usize,
    pairs: usize,
) -> GpuResult<()> {
    let rest = [
        ids.arg(),
        x.arg(),
        Arg::I32(x_per_pair as i32),
        y.arg(),
        Arg::I32(n_out as i32),
        Arg::I32(k_in as i32),
        Arg::I32(top_k as i32),
    ];
    let grid = (pairs as u32, blocks(n_out, 8), 1);
    match w {
        MatWeights::Bf16(wb) => {
            let args: Vec<Arg> = std::iter::once(wb.arg()).chain(rest).collect();
            // SAFETY: moe_gemv(W, ids, x, x_per_pair, y, n_out, k_in, top_k); grid (pairs,
            // ceil(n_out / 8)), 256 threads.
            unsafe { gpu.launch("moe_gemv", grid, 256, &args) }
        }
        MatWeights::Fp8(f) => {
            let args: Vec<Arg> = f.args().into_iter().chain(rest).collect();
            // SAFETY: moe_gemv_fp8(Q, S, band, gc, ids, x, x_per_pair, y, n_out, k_in, top_k);
            // as moe_gemv; Q holds E·n_out rows of k_in codes, band their rows of S.
            unsafe { gpu.launch("moe_gemv_fp8", grid, 256, &args) }
        }
    }
}

/// The routed experts' outputs summed per token in ascending expert id, weighted.
pub fn moe_combine(
    gpu: &Gpu,
    y: &Bf16Buf,
    ids: &Buf<i32>,
    weights: &Buf<f32>,
    out: &mut Bf16Buf,
    tokens: usize,
    hidden: usize,
    top_k: usize,
) -> GpuResult<()> {
    let args = [
        y.arg(),
        ids.arg(),
        weights.arg(),
        out.arg(),
        Arg::I32(hidden as i32),
        Arg::I32(top_k as i32),
        Arg::I64((tokens * hidden) as i64),
    ];
    // SAFETY: moe_combine(y, ids, weights, out, hidden, top_k, n); ceil(n / 256) blocks.
    unsafe { gpu.launch("moe_combine", (blocks(tokens * hidden, 256), 1, 1), 256, &args) }
}

/// The shared expert's gate: `out[t] = x[t] · round(sigmoid(round(g[t])))`.
pub fn sigmoid_scale(
    gpu: &Gpu,
    x: &Bf16Buf,
    g: &Buf<f32>,
    out: &mut Bf16Buf,
    tokens: usize,
    hidden: usize,
) -> GpuResult<()> {
    let args = [x.arg(), g.arg(), out.arg(), Arg::I32(hidden as i32), Arg::I64((tokens * hidden) as i64)];
    // SAFETY: sigmoid_scale_rows(x, g, out, hidden, n); ceil(n / 256) blocks of 256.
    unsafe { gpu.launch("sigmoid_scale_rows", (blocks(tokens * hidden, 256), 1, 1), 256, &args) }
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
    let n = rows * (na + nb);
    let args = [a.arg(), b_in.arg(), out.arg(), Arg::I32(na as i32), Arg::I32(nb as i32), Arg::I64(n as i64)];
    // SAFETY: concat_rows(a, b, out, na, nb, n); ceil(n / 256) blocks of 256.
    unsafe { gpu.launch("concat_rows", (blocks(n, 256), 1, 1), 256, &args) }
}

/// f32 → bf16, element by element (`out` holds `n`).
pub fn f32_to_bf16(gpu: &Gpu, x: &Buf<f32>, out: &mut Bf16Buf, n: usize) -> GpuResult<()> {
    let args = [x.arg(), out.arg(), Arg::I64(n as i64)];
    // SAFETY: f32_to_bf16(x, out, n); ceil(n / 256) blocks of 256 over buffers of n.
    unsafe { gpu.launch("f32_to_bf16", (blocks(n, 256), 1, 1), 256, &args) }
}

/// Adds the count of NaN / ±Inf among `x`'s first `n` to `count` (one value).
pub fn count_nonfinite_f32(gpu: &Gpu, x: &Buf<f32>, n: usize, count: &mut Buf<u32>) -> GpuResult<()> {
    let args = [x.arg(), Arg::I64(n as i64), count.arg()];
    // SAFETY: count_nonfinite_f32(x, n, count); ceil(n / 256) blocks of 256 over a buffer of n
    // and one counter.
    unsafe { gpu.launch("count_nonfinite_f32", (blocks(n, 256), 1, 1), 256, &args) }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engine scales scores by `hd^-0.5` through `powf`; for a head of 24 (the qwen3_5_text
    /// fixture) that is one f32 ulp away from `1 / sqrt(24)`, and the kernels get the engine's.
    #[test]
    fn the_attention_scale_is_the_engines() {
        for hd in [16usize, 24, 32, 48, 128, 256] {
            assert_eq!(attention_scale(hd), (hd as f32).powf(-0.5), "hd {hd}");
        }
        assert_ne!(attention_scale(24), 1.0 / (24f32).sqrt(), "the two expressions differ at 24");
    }
}
