//! Kernel-by-kernel parity on a device (a GPU or the emulated one): every entry point of
//! `kernels/*.cu` on random inputs at Qwen3.6-27B / 35B-A3B shapes, launched through `ops.rs`
//! (the model's own grids, blocks and argument lists), against its CPU twin (`twins.rs`): the
//! largest difference relative to the twin's largest value, against a stated tolerance. Run by
//! `deltascope gpu check` (and so by `scripts/gpu-check.sh`). The twins are tied to the CPU
//! engine by their tests; this closes the loop on the device.

use serde::Serialize;

use super::twins::{self, randoms};
use deltascope_model::cuda::ops::{self, DeviceFp8, DeviceMat, GdnShape, MatWeights, Out, RopeParams};
use deltascope_model::cuda::runtime::{Gpu, GpuResult};
use deltascope_model::fnv1a;
use deltascope_model::fp8::{self, Fp8Stack, Fp8Weights};
use deltascope_model::head_state_norms;

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
    /// A hash of the device's output bits (the emulator compares them across schedules).
    #[serde(skip)]
    pub bits: u64,
    /// Wall time of the case (its launches, copies and twin).
    pub seconds: f64,
}

/// bf16 results differ from the twin where one f32 rounding tips a bf16 value: one bf16 ulp
/// (2⁻⁸ relative) of the largest value, twice for slack; f32 results to 1e-4.
pub const BF16_TOL: f32 = 2.0 / 256.0;
pub const F32_TOL: f32 = 1e-4;

fn hash(x: &[f32]) -> u64 {
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_bits().to_le_bytes()).collect();
    fnv1a(&[&bytes])
}

fn compare(kernel: &str, case: String, gpu: &[f32], twin: &[f32], tolerance: f32) -> Parity {
    let scale = twin.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    let mut max_abs = if gpu.len() == twin.len() { 0f32 } else { f32::INFINITY };
    for (a, b) in gpu.iter().zip(twin) {
        let d = if a.is_nan() || b.is_nan() { f32::INFINITY } else { (a - b).abs() };
        max_abs = max_abs.max(d);
    }
    let max_rel = max_abs / scale;
    Parity {
        kernel: kernel.into(),
        case,
        max_abs,
        max_rel,
        tolerance,
        pass: max_rel <= tolerance,
        bits: hash(gpu),
        seconds: 0.0,
    }
}

/// `[a0, b0, a1, b1, …]`.
fn interleave(a: &[f32], b: &[f32]) -> Vec<f32> {
    a.iter().zip(b).flat_map(|(x, y)| [*x, *y]).collect()
}

fn widen(x: &[i32]) -> Vec<f32> {
    x.iter().map(|&i| i as f32).collect()
}

fn bf(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

fn timed(out: &mut Vec<Parity>, f: impl FnOnce() -> GpuResult<Parity>) -> GpuResult<()> {
    timed_all(out, || f().map(|p| vec![p]))
}

fn timed_all(out: &mut Vec<Parity>, f: impl FnOnce() -> GpuResult<Vec<Parity>>) -> GpuResult<()> {
    let start = std::time::Instant::now();
    let mut ps = f()?;
    let seconds = start.elapsed().as_secs_f64() / ps.len().max(1) as f64;
    for p in &mut ps {
        p.seconds = seconds;
    }
    out.extend(ps);
    Ok(())
}

/// Every kernel check, in order; a launch or copy that fails ends the run with its error
/// (naming the kernel).
pub fn run_all(gpu: &Gpu) -> GpuResult<Vec<Parity>> {
    let mut out = vec![];
    for rows in [1usize, 4, 8] {
        timed(&mut out, || linear(gpu, 5120, 1024, rows))?;
    }
    timed(&mut out, || linear(gpu, 1024, 17408, 3))?;
    // The tiled GEMM (prefill rows), ragged edges included.
    timed(&mut out, || linear(gpu, 200, 72, 37))?;
    timed(&mut out, || linear(gpu, 70, 104, 130))?;
    // FP8 weights (Qwen's block format): decode and verify rows, a row of 136 blocks, and the
    // tiled GEMM with a partial last block, each matrix cut mid-band from a larger one.
    for rows in [1usize, 8] {
        timed(&mut out, || linear_fp8(gpu, 5120, 1024, rows))?;
    }
    timed(&mut out, || linear_fp8(gpu, 1024, 17408, 3))?;
    timed(&mut out, || linear_fp8(gpu, 200, 136, 37))?;
    timed(&mut out, || gated_norm(gpu))?;
    timed(&mut out, || rms_norm(gpu))?;
    timed(&mut out, || rope(gpu))?;
    timed(&mut out, || swiglu(gpu))?;
    timed(&mut out, || elementwise(gpu))?;
    timed_all(&mut out, || misc(gpu))?;
    timed(&mut out, || embedding(gpu))?;
    timed_all(&mut out, || conv_prefill(gpu, 37))?;
    for tokens in [1usize, 4] {
        timed_all(&mut out, || conv_decode(gpu, tokens))?;
    }
    for tokens in [1usize, 4, 19] {
        timed_all(&mut out, || gdn(gpu, tokens, QWEN36_GDN))?;
    }
    // The small test models' heads (masked lanes and rows): the fixtures and the demo.
    for shape in [(2, 6, 8, 12), (1, 3, 16, 16), (4, 4, 32, 32)] {
        timed_all(&mut out, || gdn(gpu, 4, shape))?;
    }
    timed_all(&mut out, || gdn_traced(gpu, 5, (2, 4, 32, 32)))?;
    timed_all(&mut out, || gdn_traced(gpu, 2, QWEN36_GDN))?;
    timed_all(&mut out, || attention(gpu, 0, 37, QWEN36_ATTN))?;
    timed_all(&mut out, || attention(gpu, 100, 1, QWEN36_ATTN))?;
    timed_all(&mut out, || attention(gpu, 100, 4, QWEN36_ATTN))?;
    for shape in [(4, 1, 24), (6, 2, 16), (4, 2, 48)] {
        timed_all(&mut out, || attention(gpu, 9, 3, shape))?;
    }
    timed_all(&mut out, || moe(gpu))?;
    Ok(out)
}

/// Launches past grid y's 65535 limit that a long prefill makes, at small feature sizes: the
/// expert GEMVs of 8192 tokens × top 8 (35B-A3B) and the conv of 65536 tokens. Each kernel
/// puts tokens (or token × slot pairs) on grid x.
/// After a model-level failure on a device (`gpu parity`, `verify --device`): every kernel run
/// on its own against its CPU twin, to name the ones that differ. Empty `failed`: each kernel
/// matches its twin, so what differs is the host code that chains them.
#[derive(Debug, Clone, Serialize)]
pub struct KernelVerdict {
    pub device: String,
    pub checked: usize,
    /// "gdn_recurrent (T=1, …)" for each case that differs from its twin.
    pub failed: Vec<String>,
}

impl KernelVerdict {
    /// One line: which kernels differ, or that none does.
    pub fn sentence(&self) -> String {
        if self.failed.is_empty() {
            format!(
                "each of the {} kernel cases on {} matches its CPU twin: the difference is in the host code that chains the kernels (src/model/cuda/model.rs: layer wiring, caches, positions)",
                self.checked, self.device
            )
        } else {
            format!(
                "{} of {} kernel cases on {} differ from their CPU twins: {}",
                self.failed.len(),
                self.checked,
                self.device,
                self.failed.join(", ")
            )
        }
    }
}

/// [`name_kernels`] on the first device `device` names (`--device cuda|emu`), with the kernels
/// of `kernels_dir` (else the embedded ones).
pub fn name_device_kernels(
    device: &deltascope_model::DeviceSpec,
    kernels_dir: Option<&std::path::Path>,
) -> Result<KernelVerdict, String> {
    use deltascope_model::DeviceSpec;
    use deltascope_model::cuda::DeviceKind;
    let (kind, ordinal) = match device {
        DeviceSpec::Emu(o) => (DeviceKind::Emu, o.first().copied().unwrap_or(0)),
        DeviceSpec::Cuda(o) => (DeviceKind::Cuda, o.as_ref().and_then(|o| o.first().copied()).unwrap_or(0)),
        _ => return Err("no device named".into()),
    };
    let kernels = deltascope_model::cuda::kernels::load(kernels_dir).map_err(|e| e.to_string())?;
    let gpu = Gpu::open(kind, ordinal, kernels).map_err(|e| e.to_string())?;
    name_kernels(&gpu).map_err(|e| e.to_string())
}

/// Runs every kernel case (`gpu check`'s) on `gpu` and names those that differ from their twins.
pub fn name_kernels(gpu: &Gpu) -> GpuResult<KernelVerdict> {
    let mut results = run_all(gpu)?;
    results.extend(long_grids(gpu)?);
    Ok(KernelVerdict {
        device: gpu.label(),
        checked: results.len(),
        failed: results.iter().filter(|r| !r.pass).map(|r| format!("{} ({})", r.kernel, r.case)).collect(),
    })
}

pub fn long_grids(gpu: &Gpu) -> GpuResult<Vec<Parity>> {
    let mut out = vec![];
    timed_all(&mut out, || long_moe_gemv(gpu))?;
    timed_all(&mut out, || long_conv(gpu))?;
    Ok(out)
}

fn long_moe_gemv(gpu: &Gpu) -> GpuResult<Vec<Parity>> {
    let mut out = vec![];
    // moe_gemv: 65536 + 8 pairs of an [E = 4][8][32] table.
    let (experts, n_out, k_in, top_k, tokens) = (4usize, 8usize, 32usize, 8usize, 8193usize);
    let pairs = tokens * top_k;
    let w = randoms(experts * n_out * k_in, 70, 0.5);
    let x = randoms(tokens * k_in, 71, 1.0);
    let ids: Vec<i32> = (0..pairs).map(|p| ((p * 7 + p / 5) % experts) as i32).collect();
    let (dw, dx, dids) = (MatWeights::Bf16(gpu.bf16(&w)?), gpu.bf16(&x)?, gpu.i32(&ids)?);
    let mut dy = gpu.zeros_bf16(pairs * n_out)?;
    ops::moe_gemv(gpu, &dw, &dids, &dx, false, &mut dy, n_out, k_in, top_k, pairs)?;
    let y = gpu.read_bf16(&dy)?;
    let twin = moe_gemv_twin(&w, &ids, &x, false, n_out, k_in, top_k);
    out.push(compare(
        "moe_gemv",
        format!("{pairs} pairs ({tokens} tokens × top {top_k}): past grid y"),
        &y,
        &twin,
        BF16_TOL,
    ));
    Ok(out)
}

fn long_conv(gpu: &Gpu) -> GpuResult<Vec<Parity>> {
    let mut out = vec![];
    // conv1d_prefill over 65537 tokens of 8 channels.
    let (t, c, k) = (65537usize, 8usize, 4usize);
    let x = randoms(t * c, 72, 1.0);
    let w = randoms(c * k, 73, 0.5);
    let state0 = randoms(c * (k - 1), 74, 1.0);
    let (dx, dw) = (gpu.bf16(&x)?, gpu.bf16(&w)?);
    let mut dstate = gpu.bf16(&state0)?;
    let mut dy = gpu.zeros_bf16(t * c)?;
    ops::conv_prefill(gpu, &dx, &mut dstate, &dw, &mut dy, t, c, k)?;
    let y = gpu.read_bf16(&dy)?;
    let mut st = state0;
    let twin = twins::conv1d_decode(&x, &mut st, &w, None, t, c, k);
    out.push(compare("conv1d_prefill", format!("{t} tokens: past grid y"), &y, &twin, BF16_TOL));
    Ok(out)
}

/// Cases whose output bits differ between schedules of the same device: a race or a missing
/// barrier (a correct kernel's result does not depend on the order of its threads).
pub fn schedule_mismatches(runs: &[(String, Vec<Parity>)]) -> Vec<Parity> {
    let Some((first_name, first)) = runs.first() else { return vec![] };
    let mut out = vec![];
    for (name, run) in &runs[1..] {
        for (a, b) in first.iter().zip(run) {
            if a.bits != b.bits {
                out.push(Parity {
                    kernel: a.kernel.clone(),
                    case: format!("{}: results depend on the thread schedule ({first_name} vs {name})", a.case),
                    max_abs: f32::NAN,
                    max_rel: f32::NAN,
                    tolerance: 0.0,
                    pass: false,
                    bits: 0,
                    seconds: 0.0,
                });
            }
        }
    }
    out
}

fn linear(gpu: &Gpu, n_out: usize, k: usize, rows: usize) -> GpuResult<Parity> {
    let w = randoms(n_out * k, 1, 0.05);
    let x = randoms(rows * k, 2, 1.0);
    let dw = DeviceMat { w: MatWeights::Bf16(gpu.bf16(&w)?), n_out, k };
    let dx = gpu.bf16(&x)?;
    let mut dy = gpu.zeros_f32(rows * n_out)?;
    ops::linear(gpu, &dw, &dx, rows, Out::F32(&mut dy))?;
    let y = gpu.read_f32(&dy)?;
    let twin = twins::gemv_bf16(&w, &x, n_out, k, rows);
    let kernel = if rows <= ops::GEMV_MAX_ROWS { "gemv_bf16" } else { "gemm_bf16_tiled" };
    Ok(compare(kernel, format!("{n_out}x{k}, {rows} rows"), &y, &twin, F32_TOL))
}

/// An FP8 matrix `[n_out, k]` as the CUDA model uploads one: rows `37..37 + n_out` of a
/// quantised `[37 + n_out, k]` matrix (so its rows start inside a scale band), stacked with
/// their scales; and its dequantised values (`e4m3 · scale`), the twin's weights. Rows grow in
/// magnitude so that the blocks' scales differ.
fn fp8_matrix(n_out: usize, k: usize, seed: u64) -> (Fp8Stack, Vec<f32>) {
    let skip = 37;
    let rows = skip + n_out;
    let values: Vec<f32> = randoms(rows * k, seed, 0.05)
        .iter()
        .enumerate()
        .map(|(i, v)| v * (1.0 + (i / k % 300) as f32 / 50.0))
        .collect();
    let (q, scales) = fp8::quantize(&values, rows, k);
    let whole = Fp8Weights {
        q: q.into(),
        scales: scales.iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect(),
        cols: k,
        row0: 0,
    };
    let mut stack = Fp8Stack::default();
    stack.push(&whole.rows_view(skip, n_out));
    let mut wide = vec![0f32; n_out * k];
    whole.rows_view(skip, n_out).dequantize_to(0, &mut wide);
    (stack, wide)
}

fn linear_fp8(gpu: &Gpu, n_out: usize, k: usize, rows: usize) -> GpuResult<Parity> {
    let (stack, w) = fp8_matrix(n_out, k, 81);
    let x = randoms(rows * k, 82, 1.0);
    let dw = DeviceMat::upload_fp8(gpu, &stack, n_out, k)?;
    let dx = gpu.bf16(&x)?;
    let mut dy = gpu.zeros_f32(rows * n_out)?;
    ops::linear(gpu, &dw, &dx, rows, Out::F32(&mut dy))?;
    let y = gpu.read_f32(&dy)?;
    // The bf16 GEMV's twin over the dequantised weights: the kernels sum in its order.
    let twin = twins::gemv_bf16(&w, &x, n_out, k, rows);
    let kernel = if rows <= ops::GEMV_MAX_ROWS { "gemv_fp8" } else { "gemm_fp8_tiled" };
    Ok(compare(kernel, format!("{n_out}x{k}, {rows} rows, FP8 from row 37 of its matrix"), &y, &twin, F32_TOL))
}

fn gated_norm(gpu: &Gpu) -> GpuResult<Parity> {
    let (rows, n) = (4 * 48, 128);
    let x = randoms(rows * n, 3, 1.0);
    let z = randoms(rows * n, 4, 2.0);
    let w = randoms(n, 5, 1.0);
    let (dx, dz, dw) = (gpu.bf16(&x)?, gpu.bf16(&z)?, gpu.bf16(&w)?);
    let mut dy = gpu.zeros_bf16(rows * n)?;
    ops::rms_norm_gated(gpu, &dx, &dz, &dw, &mut dy, rows, n, 1e-6)?;
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
    ops::conv_decode(gpu, &dx, &mut dstate, &dw, &mut dy, Some(&mut dslots), tokens, c, k)?;
    let y = gpu.read_bf16(&dy)?;
    let slots = gpu.read_bf16(&dslots)?;
    let untouched = gpu.read_bf16(&dstate)?;
    let mut st = state0.clone();
    let mut twin_slots = vec![0f32; tokens * c * (k - 1)];
    let twin = twins::conv1d_decode(&x, &mut st, &w, Some(&mut twin_slots), tokens, c, k);
    let case = format!("{c} channels, K {k}, {tokens} tokens");
    // Accept the last token: the state becomes its slot.
    ops::conv_restore(gpu, &mut dstate, &dslots, tokens, c * (k - 1))?;
    let restored = gpu.read_bf16(&dstate)?;
    let last = &twin_slots[(tokens - 1) * c * (k - 1)..];
    Ok(vec![
        compare("conv1d_decode", case.clone(), &y, &twin, BF16_TOL),
        compare("conv1d_decode slots", case.clone(), &slots, &twin_slots, 0.0),
        compare("conv1d_decode state kept", case.clone(), &untouched, &state0, 0.0),
        compare("conv1d_restore_slot", format!("{case}, keep {tokens}"), &restored, last, 0.0),
    ])
}

/// Qwen3.6-27B's GDN heads: 16 key / 48 value heads of 128.
const QWEN36_GDN: (usize, usize, usize, usize) = (16, 48, 128, 128);
/// Qwen3.6-27B's attention: 24 query / 4 KV heads of 256.
const QWEN36_ATTN: (usize, usize, usize) = (24, 4, 256);

struct GdnInputs {
    qkv: Vec<f32>,
    a: Vec<f32>,
    b: Vec<f32>,
    a_log: Vec<f32>,
    dt_bias: Vec<f32>,
    state0: Vec<f32>,
}

fn gdn_inputs(tokens: usize, (hk, hv, dk, dv): (usize, usize, usize, usize)) -> GdnInputs {
    let conv_dim = 2 * hk * dk + hv * dv;
    GdnInputs {
        qkv: randoms(tokens * conv_dim, 9, 1.0),
        a: randoms(tokens * hv, 10, 2.0),
        b: randoms(tokens * hv, 11, 2.0),
        a_log: randoms(hv, 12, 1.0),
        dt_bias: randoms(hv, 13, 1.0),
        state0: randoms(hv * dv * dk, 14, 0.05),
    }
}

fn gdn(gpu: &Gpu, tokens: usize, (hk, hv, dk, dv): (usize, usize, usize, usize)) -> GpuResult<Vec<Parity>> {
    let s = GdnShape { k_heads: hk, v_heads: hv, dk, dv };
    let i = gdn_inputs(tokens, (hk, hv, dk, dv));
    let with_slots = tokens <= 8;
    let (dqkv, da, db) = (gpu.bf16(&i.qkv)?, gpu.bf16(&i.a)?, gpu.bf16(&i.b)?);
    let (dalog, ddt) = (gpu.f32(&i.a_log)?, gpu.f32(&i.dt_bias)?);
    let mut dstate = gpu.f32(&i.state0)?;
    let n = hv * dv * dk;
    let mut dslots = gpu.zeros_f32(if with_slots { tokens * n } else { 1 })?;
    let mut dout = gpu.zeros_bf16(tokens * hv * dv)?;
    let slots_arg = with_slots.then_some(&mut dslots);
    ops::gdn(gpu, &dqkv, &da, &db, &dalog, &ddt, &mut dstate, slots_arg, None, &mut dout, tokens, s)?;
    let out = gpu.read_bf16(&dout)?;
    let state = gpu.read_f32(&dstate)?;
    let mut st = i.state0.clone();
    let mut twin_slots = vec![0f32; if with_slots { tokens * n } else { 0 }];
    let twin = twins::gdn_recurrent(
        &i.qkv,
        &i.a,
        &i.b,
        &i.a_log,
        &i.dt_bias,
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
        res.push(compare("gdn_recurrent slots", case.clone(), &slots, &twin_slots, F32_TOL));
        res.push(compare("gdn_recurrent state kept", case.clone(), &state, &i.state0, 0.0));
        // A rejected draft: keep the first token only; the state becomes its slot exactly.
        ops::gdn_restore(gpu, &mut dstate, &dslots, 1, n)?;
        let restored = gpu.read_f32(&dstate)?;
        res.push(compare("gdn_restore_slot", format!("{case}, keep 1"), &restored, &slots[..n], 0.0));
    } else {
        res.push(compare("gdn_recurrent state", case, &state, &st, F32_TOL));
    }
    Ok(res)
}

/// The state trace written by `gdn_recurrent` (β, g and their inputs b, a per token and head; ‖S‖
/// and ‖ΔS‖ per head) against the twin's gates, the inputs as uploaded (bf16: exactly) and the
/// engine's own norms of the twin's states.
fn gdn_traced(gpu: &Gpu, tokens: usize, (hk, hv, dk, dv): (usize, usize, usize, usize)) -> GpuResult<Vec<Parity>> {
    let s = GdnShape { k_heads: hk, v_heads: hv, dk, dv };
    let i = gdn_inputs(tokens, (hk, hv, dk, dv));
    let (dqkv, da, db) = (gpu.bf16(&i.qkv)?, gpu.bf16(&i.a)?, gpu.bf16(&i.b)?);
    let (dalog, ddt) = (gpu.f32(&i.a_log)?, gpu.f32(&i.dt_bias)?);
    let mut dstate = gpu.f32(&i.state0)?;
    let mut dout = gpu.zeros_bf16(tokens * hv * dv)?;
    let mut dtrace = gpu.zeros_f32(s.trace_len(tokens))?;
    ops::gdn(gpu, &dqkv, &da, &db, &dalog, &ddt, &mut dstate, None, Some(&mut dtrace), &mut dout, tokens, s)?;
    let trace = gpu.read_f32(&dtrace)?;
    let mut st = i.state0.clone();
    twins::gdn_recurrent(&i.qkv, &i.a, &i.b, &i.a_log, &i.dt_bias, &mut st, None, tokens, hk, hv, dk, dv);
    let head = dv * dk;
    let (mut twin_gates, mut twin_norms) = (vec![], vec![]);
    for t in 0..tokens {
        for h in 0..hv {
            twin_gates.push(bf(deltascope_model::cpu::sigmoid(i.b[t * hv + h])));
            let a_neg = -i.a_log[h].exp();
            twin_gates.push(a_neg * deltascope_model::cpu::softplus(i.a[t * hv + h] + i.dt_bias[h]));
        }
    }
    // Decoded as the model decodes it (the per-warp sums added per head).
    let read = ops::read_gdn_trace(&trace, tokens, s);
    let mut norms = vec![];
    for h in 0..hv {
        let (n, d, bad) = head_state_norms(&i.state0[h * head..(h + 1) * head], &st[h * head..(h + 1) * head]);
        twin_norms.extend([n, d]);
        // A wrong non-finite count fails the case (NaN never compares equal).
        let norm = if read.nonfinite[h] == bad { read.state_norm[h] } else { f32::NAN };
        norms.extend([norm, read.delta_norm[h]]);
    }
    let case = format!("{hk}/{hv} heads of {dk}/{dv}, {tokens} tokens, traced");
    let inputs: Vec<f32> = i.b.iter().zip(&i.a).flat_map(|(&b, &a)| [bf(b), bf(a)]).collect();
    Ok(vec![
        compare("gdn_recurrent trace β, g", case.clone(), &interleave(&read.beta, &read.g), &twin_gates, F32_TOL),
        compare("gdn_recurrent trace b, a", case.clone(), &interleave(&read.b, &read.a), &inputs, 0.0),
        compare("gdn_recurrent trace ‖S‖, ‖ΔS‖", case, &norms, &twin_norms, F32_TOL),
    ])
}

/// q rows interleave query and gate per head; the keys and values go in through kv_append.
fn attention(gpu: &Gpu, pos0: usize, tokens: usize, (nh, nkv, hd): (usize, usize, usize)) -> GpuResult<Vec<Parity>> {
    let l_max = pos0 + tokens;
    let q_rows = randoms(tokens * nh * 2 * hd, 15, 1.0);
    let kc = randoms(nkv * l_max * hd, 16, 1.0);
    let vc = randoms(nkv * l_max * hd, 17, 1.0);
    // The cache holds positions < pos0; this pass's keys and values are appended by the kernel.
    let mut kc0 = kc.clone();
    let mut vc0 = vc.clone();
    let (mut k_new, mut v_new) = (vec![0f32; tokens * nkv * hd], vec![0f32; tokens * nkv * hd]);
    for t in 0..tokens {
        for h in 0..nkv {
            for d in 0..hd {
                let c = (h * l_max + pos0 + t) * hd + d;
                k_new[(t * nkv + h) * hd + d] = kc[c];
                v_new[(t * nkv + h) * hd + d] = vc[c];
                kc0[c] = 0.0;
                vc0[c] = 0.0;
            }
        }
    }
    let dq = gpu.bf16(&q_rows)?;
    let (mut dkc, mut dvc) = (gpu.bf16(&kc0)?, gpu.bf16(&vc0)?);
    let (dk, dv) = (gpu.bf16(&k_new)?, gpu.bf16(&v_new)?);
    ops::kv_append(gpu, &dk, &dv, &mut dkc, &mut dvc, pos0, tokens, nkv, hd, l_max)?;
    let cache_k = gpu.read_bf16(&dkc)?;
    let mut dout = gpu.zeros_bf16(tokens * nh * hd)?;
    ops::attention(gpu, &dq, &dkc, &dvc, &mut dout, pos0, tokens, nh, nkv, hd, l_max)?;
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
    let case = format!("{nh}/{nkv} heads of {hd}, {pos0} cached, {tokens} tokens");
    Ok(vec![compare("kv_append", case.clone(), &cache_k, &kc, 0.0), compare("attn_gqa", case, &out, &twin, BF16_TOL)])
}

/// `moe_gemv`'s twin: per pair its expert's rows times the token's (or the pair's) input.
fn moe_gemv_twin(w: &[f32], ids: &[i32], x: &[f32], per_pair: bool, n_out: usize, k_in: usize, k: usize) -> Vec<f32> {
    let mut y = vec![0f32; ids.len() * n_out];
    for (p, &e) in ids.iter().enumerate() {
        let xr = &x[(if per_pair { p } else { p / k }) * k_in..][..k_in];
        for n in 0..n_out {
            let wr = &w[(e as usize * n_out + n) * k_in..][..k_in];
            y[p * n_out + n] = bf(wr.iter().zip(xr).map(|(a, b)| (*a as f64) * (*b as f64)).sum::<f64>() as f32);
        }
    }
    y
}

fn moe(gpu: &Gpu) -> GpuResult<Vec<Parity>> {
    let (tokens, experts, k, hidden) = (4usize, 256usize, 8usize, 2048usize);
    let logits = randoms(tokens * experts, 18, 4.0);
    let dl = gpu.f32(&logits)?;
    let mut dids = gpu.i32(&vec![0; tokens * k])?;
    let mut dw = gpu.zeros_f32(tokens * k)?;
    ops::moe_topk(gpu, &dl, &mut dids, &mut dw, tokens, experts, k, true)?;
    let ids = gpu.read_i32(&dids)?;
    let weights = gpu.read_f32(&dw)?;
    let (twin_ids, twin_w) = twins::moe_topk(&logits, experts, k, true);
    let mut res = vec![
        compare("moe_topk ids", format!("{experts} experts, top {k}"), &widen(&ids), &widen(&twin_ids), 0.0),
        compare("moe_topk weights", format!("{experts} experts, top {k}"), &weights, &twin_w, BF16_TOL),
    ];
    // The router's f32 output is rounded to bf16 before the softmax (as the engine's bf16
    // router returns it): experts 3 and 5 then tie at 1.0 and the lower id wins, where the
    // unrounded 1 + 2⁻¹⁰ would pick expert 5.
    let tie = [0.25f32, -1.0, 0.5, 1.0, 0.0, 1.0 + 1.0 / 1024.0, -0.5, 0.75];
    let dl = gpu.f32(&tie)?;
    let mut dids = gpu.i32(&[0])?;
    let mut dw = gpu.zeros_f32(1)?;
    ops::moe_topk(gpu, &dl, &mut dids, &mut dw, 1, tie.len(), 1, true)?;
    let (tie_ids, _) = twins::moe_topk(&tie, tie.len(), 1, true);
    res.push(compare(
        "moe_topk ids",
        "8 experts, top 1, logits tied once rounded to bf16".into(),
        &widen(&gpu.read_i32(&dids)?),
        &widen(&tie_ids),
        0.0,
    ));
    // Expert GEMVs of 35B-A3B's gate_up ([E][2·512][2048]) over 16 experts (the table's size,
    // not the routing, is what changes at 256) and its down projection per pair.
    let (e_small, inter) = (16usize, 512usize);
    let ids_small: Vec<i32> = twin_ids.iter().map(|&i| i % e_small as i32).collect();
    let d_ids = gpu.i32(&ids_small)?;
    let x = randoms(tokens * hidden, 75, 1.0);
    let wgu = randoms(e_small * 2 * inter * hidden, 76, 0.05);
    let (dx, dwgu) = (gpu.bf16(&x)?, MatWeights::Bf16(gpu.bf16(&wgu)?));
    let pairs = tokens * k;
    let mut dgu = gpu.zeros_bf16(pairs * 2 * inter)?;
    ops::moe_gemv(gpu, &dwgu, &d_ids, &dx, false, &mut dgu, 2 * inter, hidden, k, pairs)?;
    let gu = gpu.read_bf16(&dgu)?;
    let twin_gu = moe_gemv_twin(&wgu, &ids_small, &x, false, 2 * inter, hidden, k);
    res.push(compare(
        "moe_gemv",
        format!("gate_up [{e_small}][{}][{hidden}], {pairs} pairs", 2 * inter),
        &gu,
        &twin_gu,
        BF16_TOL,
    ));
    let h = randoms(pairs * inter, 77, 1.0);
    let wd = randoms(e_small * hidden * inter, 78, 0.05);
    let (dh, dwd) = (gpu.bf16(&h)?, MatWeights::Bf16(gpu.bf16(&wd)?));
    let mut dd = gpu.zeros_bf16(pairs * hidden)?;
    ops::moe_gemv(gpu, &dwd, &d_ids, &dh, true, &mut dd, hidden, inter, k, pairs)?;
    let down = gpu.read_bf16(&dd)?;
    let twin_down = moe_gemv_twin(&wd, &ids_small, &h, true, hidden, inter, k);
    res.push(compare(
        "moe_gemv",
        format!("down [{e_small}][{hidden}][{inter}], per pair"),
        &down,
        &twin_down,
        BF16_TOL,
    ));
    // The same gate_up GEMVs over FP8 experts, each quantised as its own matrix and stacked
    // expert-major (each expert's rows keeping its scales).
    let mut stack = Fp8Stack::default();
    let mut wide = vec![];
    for e in 0..e_small {
        let (st, w) = fp8_matrix(2 * inter, hidden, 90 + e as u64);
        stack.append(&st);
        wide.extend(w);
    }
    let dq = MatWeights::Fp8(DeviceFp8::upload(gpu, &stack)?);
    let mut dq_gu = gpu.zeros_bf16(pairs * 2 * inter)?;
    ops::moe_gemv(gpu, &dq, &d_ids, &dx, false, &mut dq_gu, 2 * inter, hidden, k, pairs)?;
    let q_gu = gpu.read_bf16(&dq_gu)?;
    let twin_q_gu = moe_gemv_twin(&wide, &ids_small, &x, false, 2 * inter, hidden, k);
    res.push(compare(
        "moe_gemv_fp8",
        format!("gate_up [{e_small}][{}][{hidden}] FP8, {pairs} pairs", 2 * inter),
        &q_gu,
        &twin_q_gu,
        BF16_TOL,
    ));
    // Combine.
    let y = randoms(tokens * k * hidden, 19, 1.0);
    let dy = gpu.bf16(&y)?;
    let dids2 = gpu.i32(&twin_ids)?;
    let dw2 = gpu.f32(&twin_w)?;
    let mut dout = gpu.zeros_bf16(tokens * hidden)?;
    ops::moe_combine(gpu, &dy, &dids2, &dw2, &mut dout, tokens, hidden, k)?;
    let out = gpu.read_bf16(&dout)?;
    let twin = twins::moe_combine(&y, &twin_ids, &twin_w, hidden, k);
    res.push(compare("moe_combine", format!("{tokens} tokens, top {k}, hidden {hidden}"), &out, &twin, 0.0));
    // The shared expert's gate (f32 gate outputs, rounded in the kernel).
    // Gate values between bf16 steps, so that rounding them first matters for some tokens.
    let (gt, gh) = (512usize, 64usize);
    let g = randoms(gt, 79, 5.0).iter().map(|v| v * 1.001).collect::<Vec<f32>>();
    let sx = randoms(gt * gh, 80, 1.0);
    let (dg, dsx) = (gpu.f32(&g)?, gpu.bf16(&sx)?);
    let mut dso = gpu.zeros_bf16(gt * gh)?;
    ops::sigmoid_scale(gpu, &dsx, &dg, &mut dso, gt, gh)?;
    let so = gpu.read_bf16(&dso)?;
    let twin = twins::sigmoid_scale_rows(&sx, &g, gh);
    res.push(compare("sigmoid_scale_rows", format!("{gt} tokens, hidden {gh}"), &so, &twin, 0.0));
    Ok(res)
}

fn rms_norm(gpu: &Gpu) -> GpuResult<Parity> {
    // Per-head q norm of the 27B, in place: rows of 256, every other 256 of a 512-wide row
    // (query, gate).
    let (tokens, heads, hd) = (3usize, 24usize, 256usize);
    let x = randoms(tokens * heads * 2 * hd, 20, 2.0);
    let w = randoms(hd, 21, 0.5);
    let (dx, dw) = (gpu.bf16(&x)?, gpu.bf16(&w)?);
    ops::rms_norm(gpu, &dx, &dw, &dx, tokens * heads, hd, 2 * hd, 1e-6)?;
    let y = gpu.read_bf16(&dx)?;
    let mut twin = x.clone();
    for r in 0..tokens * heads {
        let normed = twins::rms_norm(&x[r * 2 * hd..r * 2 * hd + hd], &w, hd, 1e-6, true);
        twin[r * 2 * hd..r * 2 * hd + hd].copy_from_slice(&normed);
    }
    Ok(compare("rms_norm", format!("{} heads of {hd}, strided, in place", tokens * heads), &y, &twin, BF16_TOL))
}

fn rope(gpu: &Gpu) -> GpuResult<Parity> {
    // 27B: partial rotary 64 of 256, theta 1e7, the host's inverse frequencies.
    let (heads, hd, rotary) = (4usize, 256usize, 64usize);
    let inv_freq: Vec<f32> = (0..rotary / 2).map(|i| 1.0f32 / 1e7f32.powf((2 * i) as f32 / rotary as f32)).collect();
    let positions = [0usize, 1, 17, 4095, 262_143];
    let tokens = positions.len();
    let x = randoms(tokens * heads * hd, 22, 1.0);
    let dx = gpu.bf16(&x)?;
    let pos: Vec<i32> = positions.iter().map(|&p| p as i32).collect();
    let dp = gpu.i32(&pos)?;
    let r = RopeParams { rotary_dim: rotary, inv_freq: gpu.f32(&inv_freq)?, sec_h: 11, sec_w: 10 };
    ops::rope(gpu, &dx, &dp, tokens, heads, heads * hd, hd, &r)?;
    let y = gpu.read_bf16(&dx)?;
    let mut twin = x.clone();
    twins::rope(&mut twin, &positions, heads, hd, &inv_freq);
    Ok(compare("rope_mrope", "4 heads of 256, rotary 64, positions to 262143".into(), &y, &twin, BF16_TOL))
}

fn swiglu(gpu: &Gpu) -> GpuResult<Parity> {
    let (rows, inter) = (4usize, 17408usize);
    let gu = randoms(rows * 2 * inter, 23, 3.0);
    let dgu = gpu.bf16(&gu)?;
    let mut dout = gpu.zeros_bf16(rows * inter)?;
    ops::swiglu(gpu, &dgu, &mut dout, rows, inter)?;
    let y = gpu.read_bf16(&dout)?;
    Ok(compare("swiglu", format!("{rows} rows of {inter}"), &y, &twins::swiglu(&gu, inter), BF16_TOL))
}

/// The residual add (in place, as the model runs it).
fn elementwise(gpu: &Gpu) -> GpuResult<Parity> {
    let n = 3 * 5120 + 7;
    let (x, y) = (randoms(n, 81, 4.0), randoms(n, 82, 1.0));
    let (dx, dy) = (gpu.bf16(&x)?, gpu.bf16(&y)?);
    ops::add_into(gpu, &dx, &dy, n)?;
    let out = gpu.read_bf16(&dx)?;
    let twin: Vec<f32> = x.iter().zip(&y).map(|(a, b)| bf(a + b)).collect();
    Ok(compare("add_bf16", format!("{n} values, in place"), &out, &twin, 0.0))
}

/// The kernels the model launches outside the layers: the MTP concat, and the two helpers kept
/// for device-side checks (f32 → bf16, the non-finite count).
fn misc(gpu: &Gpu) -> GpuResult<Vec<Parity>> {
    let (rows, na, nb) = (3usize, 5120usize, 5120usize);
    let (a, b) = (randoms(rows * na, 83, 1.0), randoms(rows * nb, 84, 1.0));
    let (da, db) = (gpu.bf16(&a)?, gpu.bf16(&b)?);
    let mut dout = gpu.zeros_bf16(rows * (na + nb))?;
    ops::concat_rows(gpu, &da, &db, &mut dout, rows, na, nb)?;
    let out = gpu.read_bf16(&dout)?;
    let twin: Vec<f32> =
        (0..rows).flat_map(|r| a[r * na..(r + 1) * na].iter().chain(&b[r * nb..(r + 1) * nb]).copied()).collect();
    let mut res = vec![compare("concat_rows", format!("{rows} rows of {na} + {nb}"), &out, &twin, 0.0)];
    let n = 248_320usize;
    let mut x: Vec<f32> = randoms(n, 85, 100.0).iter().map(|v| v * 1.37).collect();
    for (i, bad) in [(7usize, f32::NAN), (70_001, f32::INFINITY), (n - 1, f32::NEG_INFINITY)] {
        x[i] = bad;
    }
    let dx = gpu.f32(&x)?;
    let mut dbf = gpu.zeros_bf16(n)?;
    let mut count = gpu.upload(&[0u32])?;
    ops::f32_to_bf16(gpu, &dx, &mut dbf, n)?;
    ops::count_nonfinite_f32(gpu, &dx, n, &mut count)?;
    let got = gpu.read_bf16(&dbf)?;
    let finite_twin: Vec<f32> = x.iter().map(|&v| bf(v)).collect();
    let (g2, t2): (Vec<f32>, Vec<f32>) = got
        .iter()
        .zip(&finite_twin)
        .map(|(a, b)| if b.is_finite() { (*a, *b) } else { (a.is_nan() as u8 as f32, b.is_nan() as u8 as f32) })
        .unzip();
    res.push(compare("f32_to_bf16", format!("{n} values with NaN and ±Inf"), &g2, &t2, 0.0));
    let counted = count.read()?[0];
    res.push(compare("count_nonfinite_f32", format!("{n} values, 3 non-finite"), &[counted as f32], &[3.0], 0.0));
    Ok(res)
}

fn embedding(gpu: &Gpu) -> GpuResult<Parity> {
    let (vocab, hidden) = (1000usize, 5120usize);
    let table = randoms(vocab * hidden, 24, 1.0);
    let ids: Vec<u32> = vec![0, 999, 17, 17, 500];
    let t = DeviceMat { w: MatWeights::Bf16(gpu.bf16(&table)?), n_out: vocab, k: hidden };
    let di = gpu.u32(&ids)?;
    let mut dout = gpu.zeros_bf16(ids.len() * hidden)?;
    ops::embed(gpu, &t, &di, &mut dout, ids.len())?;
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
    ops::conv_prefill(gpu, &dx, &mut dstate, &dw, &mut dy, tokens, c, k)?;
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

    #[test]
    fn schedules_that_disagree_are_failures_naming_the_kernel() {
        let a = compare("gemv_bf16", "c".into(), &[1.0], &[1.0], 0.0);
        let mut b = a.clone();
        assert!(
            schedule_mismatches(&[("forward".into(), vec![a.clone()]), ("reverse".into(), vec![b.clone()])]).is_empty()
        );
        b.bits ^= 1;
        let m = schedule_mismatches(&[("forward".into(), vec![a]), ("reverse".into(), vec![b])]);
        assert_eq!(m.len(), 1);
        assert!(!m[0].pass && m[0].kernel == "gemv_bf16" && m[0].case.contains("thread schedule"), "{m:?}");
    }
}
