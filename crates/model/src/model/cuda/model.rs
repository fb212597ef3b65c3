//! The CUDA model: the CPU [`Model`]'s weights uploaded in bf16 to one or two GPUs by a
//! [`DevicePlan`] (layers split contiguously; embedding on the first device, final norm, head
//! and MTP module on the last), and the forward pass as the kernels of `kernels/*.cu` in the
//! CPU engine's order of operations and roundings (`--dtype bf16`). It implements
//! [`Forward`], so the engine's session, MTP, budgets and the loop alarm run on it unchanged.
//!
//! One hidden-state copy per device boundary per forward (through the host: `[T][hidden]`
//! bf16, 10 KiB a decode step on the 27B). A layer split buys capacity, not batch-1 speed:
//! the devices run one after the other.
//!
//! The devices are [`Gpu`]s behind the [`Device`](super::device::Device) seam: real GPUs, or
//! the emulated device (`--device emu`), which runs this same host code over the same kernels
//! compiled for the CPU.
//!
//! Prefills run in chunks of [`PREFILL_CHUNK`] tokens (the memory plan's workspace): bit for
//! bit the same as one pass, since every kernel carries its state across the boundary.
//!
//! Not yet: cuBLASLt for prefill GEMMs (the tiled kernel runs), a chunked GDN prefill (the
//! recurrent kernel runs every token), a workspace arena (buffers are allocated per pass).

use super::device::Buf;
use super::error::{GpuError, GpuResult};
use super::ops::{self, Bf16Buf, DeviceFp8, DeviceMat, GdnShape, MatWeights, Out, RopeParams};
use super::runtime::Gpu;
use crate::error::{Error, Result};
use crate::model::finite::{self, Sublayer};
use crate::model::forward::{DraftCache, Forward, SequenceCache};
use crate::model::hybrid::{
    DecoderLayer, ForwardOptions, ForwardOutput, LogitsRows, Mixer, Model, MtpOutput, validate_ids,
};
use crate::model::mlp::{DenseMlp, Mlp};
use crate::model::norm::RmsNorm;
use crate::model::placement::plan::DevicePlan;
use crate::model::rope::Rope;
use crate::model::state::StateBytes;
use crate::model::trace::{GdnPassTrace, LayerTrace, StateTrace};
use crate::model::{Mat, ModelConfig, Precision};

pub use crate::model::placement::plan::PREFILL_CHUNK;

impl From<GpuError> for Error {
    fn from(e: GpuError) -> Self {
        Error::Gpu(e.to_string())
    }
}

fn bits(x: &[f32]) -> Vec<u16> {
    x.iter().map(|v| half::bf16::from_f32(*v).to_bits()).collect()
}

fn norm_weight(gpu: &Gpu, n: &RmsNorm) -> GpuResult<Bf16Buf> {
    gpu.upload(&bits(n.weight()))
}

/// Rows `o0..o0 + n` of a weight: kept FP8 where the checkpoint stores them so (a byte a
/// weight), else bf16.
fn mat(gpu: &Gpu, l: &crate::model::cpu::tensor::Linear, o0: usize, n: usize) -> GpuResult<DeviceMat> {
    refuse_quant(l, o0, n)?;
    match l.fp8_rows(o0, n) {
        Some(stack) => DeviceMat::upload_fp8(gpu, &stack, n, l.in_features),
        None => {
            if l.any_fp8(o0, n) {
                // A fused projection whose parts differ (an FP8 one beside one the checkpoint
                // left unconverted): widened to bf16 whole, as the kernels take one kind a matrix.
                tracing::warn!("a weight of mixed storage ({} rows from {o0}) is uploaded as bf16", n);
            }
            DeviceMat::upload(gpu, &l.bf16_rows(o0, n), n, l.in_features)
        }
    }
}

/// The experts' matrices stacked expert-major (`[E][rows][k]`): FP8 when every expert's is.
fn experts(gpu: &Gpu, ls: &[&crate::model::cpu::tensor::Linear]) -> GpuResult<MatWeights> {
    // One expert's stack at a time on the host besides the whole (a 35B-A3B layer's gate_up
    // experts are 0.5 GB of codes).
    for l in ls {
        refuse_quant(l, 0, l.out_features)?;
    }
    let mut all = crate::model::fp8::Fp8Stack::default();
    let fp8 = ls.iter().all(|l| l.fp8_rows(0, l.out_features).map(|st| all.append(&st)).is_some());
    if fp8 {
        return Ok(MatWeights::Fp8(DeviceFp8::upload(gpu, &all)?));
    }
    let mut bits = vec![];
    for l in ls {
        bits.extend(l.bf16_rows(0, l.out_features));
    }
    Ok(MatWeights::Bf16(gpu.upload(&bits)?))
}

/// GGUF quantised weights have no device kernels: refused rather than widened to bf16 (a Q4_K
/// matrix would take 3.6 times its bytes on the device).
fn refuse_quant(l: &crate::model::cpu::tensor::Linear, o0: usize, n: usize) -> GpuResult<()> {
    if l.any_quant(o0, n) {
        return Err(GpuError::Shape(format!(
            "GGUF quantised weights run on the CPU engine ({} rows of {})",
            n,
            l.dtype_name()
        )));
    }
    Ok(())
}

fn whole(gpu: &Gpu, l: &crate::model::cpu::tensor::Linear) -> GpuResult<DeviceMat> {
    mat(gpu, l, 0, l.out_features)
}

struct GdnWeights {
    shape: GdnShape,
    conv_dim: usize,
    kernel: usize,
    eps: f32,
    qkv: DeviceMat,
    z: DeviceMat,
    b: DeviceMat,
    a: DeviceMat,
    /// `[conv_dim][K]` (the checkpoint's layout; the CPU keeps them tap-major).
    conv_w: Bf16Buf,
    a_log: Buf<f32>,
    dt_bias: Buf<f32>,
    norm_w: Bf16Buf,
    out: DeviceMat,
}

struct AttnWeights {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    eps: f32,
    /// `[heads][query | gate]` rows.
    q: DeviceMat,
    k: DeviceMat,
    v: DeviceMat,
    q_norm: Bf16Buf,
    k_norm: Bf16Buf,
    o: DeviceMat,
}

struct DenseWeights {
    inter: usize,
    gate_up: DeviceMat,
    down: DeviceMat,
}

struct MoeWeights {
    experts: usize,
    top_k: usize,
    renorm: bool,
    inter: usize,
    router: DeviceMat,
    /// `[E][2·inter][hidden]` and `[E][hidden][inter]`.
    gate_up: MatWeights,
    down: MatWeights,
    shared: DenseWeights,
    shared_gate: DeviceMat,
}

// Built once per layer and held: the size difference costs nothing.
#[allow(clippy::large_enum_variant)]
enum MixerWeights {
    Gdn(GdnWeights),
    Attn(AttnWeights),
}

#[allow(clippy::large_enum_variant)]
enum MlpWeights {
    Dense(DenseWeights),
    Moe(MoeWeights),
}

struct LayerWeights {
    device: usize,
    input_norm: Bf16Buf,
    post_norm: Bf16Buf,
    eps: f32,
    mixer: MixerWeights,
    mlp: MlpWeights,
}

struct MtpWeights {
    fc: DeviceMat,
    norm_embedding: Bf16Buf,
    norm_hidden: Bf16Buf,
    layers: Vec<LayerWeights>,
    norm: Bf16Buf,
}

pub struct CudaModel {
    pub config: ModelConfig,
    gpus: Vec<Gpu>,
    /// Each device's rotary table.
    rope: Vec<RopeParams>,
    embed: DeviceMat,
    /// `None`: the head is the embedding, on the one device.
    head: Option<DeviceMat>,
    norm: Bf16Buf,
    layers: Vec<LayerWeights>,
    mtp: Option<MtpWeights>,
    weight_bytes: usize,
    /// Per used device: its label and the bytes of weights put there.
    pub device_weights: Vec<(String, usize)>,
    /// Weights held as FP8 codes on the devices (the model's own count when every FP8 weight of
    /// the checkpoint stayed FP8).
    pub fp8_weights: usize,
}

fn dense(gpu: &Gpu, m: &DenseMlp) -> GpuResult<DenseWeights> {
    Ok(DenseWeights { inter: m.inter, gate_up: whole(gpu, &m.gate_up)?, down: whole(gpu, &m.down)? })
}

fn layer(gpu: &Gpu, device: usize, l: &DecoderLayer, c: &ModelConfig) -> GpuResult<LayerWeights> {
    // The kernels' register tiles: a head's dims in ≤ 8 pieces of 32 per lane.
    if c.head_dim > 256 || c.linear.key_head_dim > 256 || c.linear.conv_kernel > 8 || c.linear.conv_kernel < 2 {
        return Err(GpuError::Shape(format!(
            "head_dim {} / linear_key_head_dim {} must be ≤ 256 and linear_conv_kernel_dim {} in 2..=8",
            c.head_dim, c.linear.key_head_dim, c.linear.conv_kernel
        )));
    }
    let mixer = match &l.mixer {
        Mixer::Linear(g) => {
            if g.out_input_order.is_some() {
                return Err(GpuError::Shape(
                    "out_proj keeps a GGUF's column order: GGUF runs on the CPU engine".into(),
                ));
            }
            let lc = &g.cfg;
            let (cd, vd, hv, k) = (lc.conv_dim(), lc.value_dim(), lc.num_value_heads, lc.conv_kernel);
            let mut conv = vec![0f32; cd * k];
            for j in 0..k {
                for ch in 0..cd {
                    conv[ch * k + j] = g.conv_taps[j * cd + ch];
                }
            }
            MixerWeights::Gdn(GdnWeights {
                shape: GdnShape { k_heads: lc.num_key_heads, v_heads: hv, dk: lc.key_head_dim, dv: lc.value_head_dim },
                conv_dim: cd,
                kernel: k,
                eps: g.eps,
                qkv: mat(gpu, &g.in_proj, 0, cd)?,
                z: mat(gpu, &g.in_proj, cd, vd)?,
                b: mat(gpu, &g.in_proj, cd + vd, hv)?,
                a: mat(gpu, &g.in_proj, cd + vd + hv, hv)?,
                conv_w: gpu.upload(&bits(&conv))?,
                a_log: gpu.f32(&g.a_log)?,
                dt_bias: gpu.f32(&g.dt_bias)?,
                norm_w: gpu.upload(&bits(&g.norm_w))?,
                out: whole(gpu, &g.out_proj)?,
            })
        }
        Mixer::Attention(a) => {
            let (qw, kw) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
            MixerWeights::Attn(AttnWeights {
                heads: a.heads,
                kv_heads: a.kv_heads,
                head_dim: a.head_dim,
                eps: a.q_norm.eps,
                q: mat(gpu, &a.qkv, 0, 2 * qw)?,
                k: mat(gpu, &a.qkv, 2 * qw, kw)?,
                v: mat(gpu, &a.qkv, 2 * qw + kw, kw)?,
                q_norm: norm_weight(gpu, &a.q_norm)?,
                k_norm: norm_weight(gpu, &a.k_norm)?,
                o: whole(gpu, &a.o_proj)?,
            })
        }
    };
    let mlp = match &l.mlp {
        Mlp::Dense(m) => MlpWeights::Dense(dense(gpu, m)?),
        Mlp::Moe(m) => {
            let gate_up: Vec<_> = m.experts.iter().map(|e| &e.gate_up).collect();
            let down: Vec<_> = m.experts.iter().map(|e| &e.down).collect();
            MlpWeights::Moe(MoeWeights {
                experts: m.experts.len(),
                top_k: m.top_k,
                renorm: m.norm_topk_prob,
                inter: m.experts.first().map_or(0, |e| e.inter),
                router: whole(gpu, &m.router)?,
                gate_up: experts(gpu, &gate_up)?,
                down: experts(gpu, &down)?,
                shared: dense(gpu, &m.shared)?,
                shared_gate: whole(gpu, &m.shared_gate)?,
            })
        }
    };
    Ok(LayerWeights {
        device,
        input_norm: norm_weight(gpu, &l.input_norm)?,
        post_norm: norm_weight(gpu, &l.post_norm)?,
        eps: c.rms_norm_eps as f32,
        mixer,
        mlp,
    })
}

impl LayerWeights {
    /// Every weight matrix of the layer.
    fn mats(&self) -> Vec<&MatWeights> {
        let mut out = vec![];
        match &self.mixer {
            MixerWeights::Gdn(g) => out.extend([&g.qkv, &g.z, &g.b, &g.a, &g.out].map(|m| &m.w)),
            MixerWeights::Attn(a) => out.extend([&a.q, &a.k, &a.v, &a.o].map(|m| &m.w)),
        }
        match &self.mlp {
            MlpWeights::Dense(d) => out.extend([&d.gate_up.w, &d.down.w]),
            MlpWeights::Moe(m) => {
                out.extend([&m.router.w, &m.gate_up, &m.down, &m.shared.gate_up.w, &m.shared.down.w, &m.shared_gate.w])
            }
        }
        out
    }

    fn bytes(&self) -> usize {
        let conv = match &self.mixer {
            MixerWeights::Gdn(g) => g.conv_dim * g.kernel * 2,
            MixerWeights::Attn(_) => 0,
        };
        self.mats().iter().map(|m| m.bytes()).sum::<usize>() + conv
    }
}

/// FP8 codes held by `mats`.
fn fp8_codes<'a>(mats: impl IntoIterator<Item = &'a MatWeights>) -> usize {
    mats.into_iter()
        .map(|m| match m {
            MatWeights::Fp8(f) => f.q.len(),
            MatWeights::Bf16(_) => 0,
        })
        .sum()
}

impl CudaModel {
    /// Uploads `model` (loaded at `--dtype bf16`) to the opened devices `gpus` (GPUs, or
    /// emulated devices), layers placed by `plan` (whose devices are `gpus`, in order).
    pub fn upload(model: &Model, gpus: Vec<Gpu>, plan: &DevicePlan) -> Result<CudaModel> {
        let c = &model.config;
        if model.precision != Precision::Bf16 {
            return Err(Error::InvalidArgument("the CUDA engine runs bf16: load the model with --dtype bf16".into()));
        }
        if gpus.is_empty() || plan.layer_device.len() != c.num_hidden_layers {
            return Err(Error::State("the device plan does not match the model".into()));
        }
        let last = plan.layer_device.iter().copied().max().unwrap_or(0).min(gpus.len() - 1);
        let embed = whole(&gpus[0], &model.embed)?;
        let head = match (&model.lm_head, last) {
            (Some(h), d) => Some(whole(&gpus[d], h)?),
            (None, 0) => None,
            (None, d) => Some(whole(&gpus[d], &model.embed)?),
        };
        let norm = norm_weight(&gpus[last], &model.norm)?;
        let mut layers = vec![];
        for (i, l) in model.layers.iter().enumerate() {
            let d = plan.layer_device[i].min(gpus.len() - 1);
            layers.push(layer(&gpus[d], d, l, c)?);
        }
        let mtp = match &model.mtp {
            None => None,
            Some(m) => {
                let g = &gpus[last];
                let mut ls = vec![];
                for l in &m.layers {
                    ls.push(layer(g, last, l, c)?);
                }
                Some(MtpWeights {
                    fc: whole(g, &m.fc)?,
                    norm_embedding: norm_weight(g, &m.pre_fc_norm_embedding)?,
                    norm_hidden: norm_weight(g, &m.pre_fc_norm_hidden)?,
                    layers: ls,
                    norm: norm_weight(g, &m.norm)?,
                })
            }
        };
        let sections = c.rope.mrope_section.clone().unwrap_or_default();
        let inv_freq = Rope::new(&c.rope).inv_freq().to_vec();
        let mut rope = vec![];
        for g in &gpus {
            rope.push(RopeParams {
                rotary_dim: c.rope.rotary_dim,
                inv_freq: g.f32(&inv_freq)?,
                sec_h: sections.get(1).copied().unwrap_or(0) as i32,
                sec_w: sections.get(2).copied().unwrap_or(0) as i32,
            });
        }
        let mut device_weights: Vec<(String, usize)> = gpus.iter().map(|g| (g.label(), 0)).collect();
        device_weights[0].1 += embed.bytes();
        if let Some(h) = &head {
            device_weights[last].1 += h.bytes();
        }
        for l in &layers {
            device_weights[l.device].1 += l.bytes();
        }
        if let Some(m) = &mtp {
            device_weights[last].1 += m.fc.bytes() + m.layers.iter().map(LayerWeights::bytes).sum::<usize>();
        }
        let weight_bytes = device_weights.iter().map(|d| d.1).sum();
        let mut mats: Vec<&MatWeights> = std::iter::once(&embed).chain(&head).map(|m| &m.w).collect();
        mats.extend(layers.iter().flat_map(LayerWeights::mats));
        if let Some(m) = &mtp {
            mats.push(&m.fc.w);
            mats.extend(m.layers.iter().flat_map(LayerWeights::mats));
        }
        let fp8_weights = fp8_codes(mats);
        Ok(CudaModel {
            config: c.clone(),
            gpus,
            rope,
            embed,
            head,
            norm,
            layers,
            mtp,
            weight_bytes,
            device_weights,
            fp8_weights,
        })
    }

    fn last_device(&self) -> usize {
        self.layers.last().map_or(0, |l| l.device)
    }

    /// Moves `[rows][hidden]` bf16 activations from device `from` to device `to` (through the
    /// host; one copy per boundary per pass).
    fn hop(&self, x: Bf16Buf, from: usize, to: usize) -> GpuResult<Bf16Buf> {
        if from == to {
            return Ok(x);
        }
        let host = x.read()?;
        self.gpus[to].upload(&host)
    }

    fn embed_rows(&self, ids: &[u32], to: usize) -> GpuResult<Bf16Buf> {
        let g = &self.gpus[0];
        let d_ids = g.u32(ids)?;
        let mut x = g.zeros_bf16(ids.len() * self.config.hidden_size)?;
        ops::embed(g, &self.embed, &d_ids, &mut x, ids.len())?;
        self.hop(x, 0, to)
    }

    /// One decoder layer over `x` (`[T][hidden]`, on the layer's device), in place; with
    /// `trace`, what it did to its state.
    #[allow(clippy::too_many_arguments)]
    fn run_layer(
        &self,
        l: &LayerWeights,
        x: &Bf16Buf,
        cache: &mut LayerCache,
        pos0: usize,
        t: usize,
        verify: bool,
        trace: bool,
    ) -> GpuResult<Option<LayerTrace>> {
        let g = &self.gpus[l.device];
        let h = self.config.hidden_size;
        let n = g.zeros_bf16(t * h)?;
        ops::rms_norm(g, x, &l.input_norm, &n, t, h, h, l.eps)?;
        let (mixed, traced) = match (&l.mixer, cache) {
            (MixerWeights::Gdn(w), LayerCache::Gdn(c)) => {
                let (y, tr) = self.gdn(g, w, &n, c, t, verify, trace)?;
                (y, tr.map(LayerTrace::Gdn))
            }
            (MixerWeights::Attn(w), LayerCache::Attn(c)) => {
                let y = self.attention(g, w, &n, c, l.device, pos0, t)?;
                let kv_len = pos0 + t;
                (y, trace.then(|| LayerTrace::Attention { kv_len, kv_bytes: 2 * kv_len * c.row * 2 }))
            }
            _ => return Err(GpuError::Driver("the state does not match the model's layer plan".into())),
        };
        ops::add_into(g, x, &mixed, t * h)?;
        ops::rms_norm(g, x, &l.post_norm, &n, t, h, h, l.eps)?;
        let m = match &l.mlp {
            MlpWeights::Dense(d) => self.dense(g, d, &n, t)?,
            MlpWeights::Moe(m) => self.moe(g, m, &n, t)?,
        };
        ops::add_into(g, x, &m, t * h)?;
        Ok(traced)
    }

    #[allow(clippy::too_many_arguments)]
    fn gdn(
        &self,
        g: &Gpu,
        w: &GdnWeights,
        n: &Bf16Buf,
        c: &mut GdnCache,
        t: usize,
        verify: bool,
        trace: bool,
    ) -> GpuResult<(Bf16Buf, Option<GdnPassTrace>)> {
        let s = w.shape;
        let (vd, hv, cd) = (s.v_heads * s.dv, s.v_heads, w.conv_dim);
        let mut pre = g.zeros_bf16(t * cd)?;
        let mut z = g.zeros_bf16(t * vd)?;
        let mut b = g.zeros_bf16(t * hv)?;
        let mut a = g.zeros_bf16(t * hv)?;
        ops::linear(g, &w.qkv, n, t, Out::Bf16(&mut pre))?;
        ops::linear(g, &w.z, n, t, Out::Bf16(&mut z))?;
        ops::linear(g, &w.b, n, t, Out::Bf16(&mut b))?;
        ops::linear(g, &w.a, n, t, Out::Bf16(&mut a))?;
        let mut qkv = g.zeros_bf16(t * cd)?;
        let mut out = g.zeros_bf16(t * vd)?;
        let mut trace_buf = if trace { Some(g.zeros_f32(s.trace_len(t))?) } else { None };
        if verify {
            c.ensure_slots(g, t, cd * (w.kernel - 1), hv * s.dv * s.dk)?;
            let (cs, ss) = (c.conv_slots.as_mut(), c.ssm_slots.as_mut());
            ops::conv_decode(g, &pre, &mut c.conv, &w.conv_w, &mut qkv, cs, t, cd, w.kernel)?;
            let tb = trace_buf.as_mut();
            ops::gdn(g, &qkv, &a, &b, &w.a_log, &w.dt_bias, &mut c.ssm, ss, tb, &mut out, t, s)?;
        } else {
            if t <= ops::GEMV_MAX_ROWS {
                ops::conv_decode(g, &pre, &mut c.conv, &w.conv_w, &mut qkv, None, t, cd, w.kernel)?;
            } else {
                ops::conv_prefill(g, &pre, &mut c.conv, &w.conv_w, &mut qkv, t, cd, w.kernel)?;
            }
            let tb = trace_buf.as_mut();
            ops::gdn(g, &qkv, &a, &b, &w.a_log, &w.dt_bias, &mut c.ssm, None, tb, &mut out, t, s)?;
        }
        let mut normed = g.zeros_bf16(t * vd)?;
        ops::rms_norm_gated(g, &out, &z, &w.norm_w, &mut normed, t * hv, s.dv, w.eps)?;
        let mut y = g.zeros_bf16(t * self.config.hidden_size)?;
        ops::linear(g, &w.out, &normed, t, Out::Bf16(&mut y))?;
        let traced = match trace_buf {
            Some(tb) => Some(ops::read_gdn_trace(&tb.read()?, t, s)),
            None => None,
        };
        Ok((y, traced))
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        g: &Gpu,
        w: &AttnWeights,
        n: &Bf16Buf,
        c: &mut KvCacheDev,
        device: usize,
        pos0: usize,
        t: usize,
    ) -> GpuResult<Bf16Buf> {
        let (nh, nkv, hd) = (w.heads, w.kv_heads, w.head_dim);
        let (qw, kw) = (nh * hd, nkv * hd);
        if pos0 + t > c.l_max {
            return Err(GpuError::Driver(format!("KV cache full: {} positions, {} needed", c.l_max, pos0 + t)));
        }
        let mut q = g.zeros_bf16(t * 2 * qw)?;
        let mut k = g.zeros_bf16(t * kw)?;
        let mut v = g.zeros_bf16(t * kw)?;
        ops::linear(g, &w.q, n, t, Out::Bf16(&mut q))?;
        ops::linear(g, &w.k, n, t, Out::Bf16(&mut k))?;
        ops::linear(g, &w.v, n, t, Out::Bf16(&mut v))?;
        ops::rms_norm(g, &q, &w.q_norm, &q, t * nh, hd, 2 * hd, w.eps)?;
        ops::rms_norm(g, &k, &w.k_norm, &k, t * nkv, hd, hd, w.eps)?;
        let pos: Vec<i32> = (pos0..pos0 + t).map(|p| p as i32).collect();
        let d_pos = g.i32(&pos)?;
        let rope = &self.rope[device];
        ops::rope(g, &q, &d_pos, t, nh, 2 * qw, 2 * hd, rope)?;
        ops::rope(g, &k, &d_pos, t, nkv, kw, hd, rope)?;
        ops::kv_append(g, &k, &v, &mut c.k, &mut c.v, pos0, t, nkv, hd, c.l_max)?;
        let mut att = g.zeros_bf16(t * qw)?;
        ops::attention(g, &q, &c.k, &c.v, &mut att, pos0, t, nh, nkv, hd, c.l_max)?;
        let mut y = g.zeros_bf16(t * self.config.hidden_size)?;
        ops::linear(g, &w.o, &att, t, Out::Bf16(&mut y))?;
        Ok(y)
    }

    fn dense(&self, g: &Gpu, d: &DenseWeights, n: &Bf16Buf, t: usize) -> GpuResult<Bf16Buf> {
        let mut gu = g.zeros_bf16(t * 2 * d.inter)?;
        ops::linear(g, &d.gate_up, n, t, Out::Bf16(&mut gu))?;
        let mut hmid = g.zeros_bf16(t * d.inter)?;
        ops::swiglu(g, &gu, &mut hmid, t, d.inter)?;
        let mut y = g.zeros_bf16(t * d.down.n_out)?;
        ops::linear(g, &d.down, &hmid, t, Out::Bf16(&mut y))?;
        Ok(y)
    }

    fn moe(&self, g: &Gpu, m: &MoeWeights, n: &Bf16Buf, t: usize) -> GpuResult<Bf16Buf> {
        let (hsz, k, inter) = (self.config.hidden_size, m.top_k, m.inter);
        let pairs = t * k;
        // f32 out; moe_topk rounds to bf16 as the bf16 router's output is.
        let mut logits = g.zeros_f32(t * m.experts)?;
        ops::linear(g, &m.router, n, t, Out::F32(&mut logits))?;
        let mut ids = g.i32(&vec![0; pairs])?;
        let mut weights = g.zeros_f32(pairs)?;
        ops::moe_topk(g, &logits, &mut ids, &mut weights, t, m.experts, k, m.renorm)?;
        let mut gu = g.zeros_bf16(pairs * 2 * inter)?;
        ops::moe_gemv(g, &m.gate_up, &ids, n, false, &mut gu, 2 * inter, hsz, k, pairs)?;
        let mut hmid = g.zeros_bf16(pairs * inter)?;
        ops::swiglu(g, &gu, &mut hmid, pairs, inter)?;
        let mut y = g.zeros_bf16(pairs * hsz)?;
        ops::moe_gemv(g, &m.down, &ids, &hmid, true, &mut y, hsz, inter, k, pairs)?;
        let mut routed = g.zeros_bf16(t * hsz)?;
        ops::moe_combine(g, &y, &ids, &weights, &mut routed, t, hsz, k)?;
        let shared = self.dense(g, &m.shared, n, t)?;
        // f32 out; sigmoid_scale_rows rounds it to bf16 first, as the bf16 linear's output is.
        let mut gate = g.zeros_f32(t)?;
        ops::linear(g, &m.shared_gate, n, t, Out::F32(&mut gate))?;
        let mut scaled = g.zeros_bf16(t * hsz)?;
        ops::sigmoid_scale(g, &shared, &gate, &mut scaled, t, hsz)?;
        ops::add_into(g, &routed, &scaled, t * hsz)?;
        Ok(routed)
    }

    /// Logits of `rows` rows of post-norm hidden states `x` (on the last device), to the host,
    /// rounded to bf16 as the CPU engine's bf16 head and transformers' return them (greedy
    /// breaks ties between equal bf16 logits toward the lower id on both).
    fn logits(&self, x: &Bf16Buf, rows: std::ops::Range<usize>) -> GpuResult<Mat> {
        let d = self.last_device();
        let g = &self.gpus[d];
        let (h, n) = (self.config.hidden_size, rows.len());
        let sel = x.copy_range(rows.start * h..rows.end * h)?;
        let head = self.head.as_ref().unwrap_or(&self.embed);
        let mut y = g.zeros_bf16(n * head.n_out)?;
        ops::linear(g, head, &sel, n, Out::Bf16(&mut y))?;
        Ok(Mat::from_vec(n, head.n_out, g.read_bf16(&y)?))
    }

    fn read_mat(&self, device: usize, x: &Bf16Buf, rows: usize) -> GpuResult<Mat> {
        Ok(Mat::from_vec(rows, self.config.hidden_size, self.gpus[device].read_bf16(x)?))
    }

    /// One pass of `ids` (a prefill chunk, a decode step or a verify pass): logits of the rows
    /// `opts.logits` asks for, the post-norm hidden rows, and the layers' traces when asked.
    fn forward_gpu(
        &self,
        ids: &[u32],
        cache: &mut CudaCache,
        opts: ForwardOptions,
    ) -> GpuResult<(Mat, Mat, Option<Vec<LayerTrace>>)> {
        let (t, pos0, h) = (ids.len(), cache.position, self.config.hidden_size);
        let first = self.layers.first().map_or(0, |l| l.device);
        let mut x = self.embed_rows(ids, first)?;
        let mut at = first;
        let mut traces = opts.trace_state.then(Vec::new);
        for (l, c) in self.layers.iter().zip(cache.layers.iter_mut()) {
            x = self.hop(x, at, l.device)?;
            at = l.device;
            let traced = self.run_layer(l, &x, c, pos0, t, opts.verify, opts.trace_state)?;
            if let (Some(ts), Some(tr)) = (traces.as_mut(), traced) {
                ts.push(tr);
            }
        }
        let last = self.last_device();
        let x = self.hop(x, at, last)?;
        let g = &self.gpus[last];
        let hidden = g.zeros_bf16(t * h)?;
        ops::rms_norm(g, &x, &self.norm, &hidden, t, h, h, self.config.rms_norm_eps as f32)?;
        let rows = match opts.logits {
            LogitsRows::All => 0..t,
            LogitsRows::Last => t - 1..t,
        };
        let logits = self.logits(&hidden, rows)?;
        cache.verified = opts.verify.then_some(t);
        Ok((logits, self.read_mat(last, &hidden, t)?, traces))
    }

    fn mtp_gpu(
        &self,
        next_ids: &[u32],
        hidden: &Mat,
        cache: &mut CudaDraft,
        rows: LogitsRows,
    ) -> GpuResult<(Mat, Mat)> {
        let Some(m) = &self.mtp else {
            return Err(GpuError::Driver("this checkpoint has no MTP module".into()));
        };
        let d = self.last_device();
        let g = &self.gpus[d];
        let (t, h, eps) = (next_ids.len(), self.config.hidden_size, self.config.rms_norm_eps as f32);
        let e = self.embed_rows(next_ids, d)?;
        let hin = g.bf16(&hidden.data)?;
        let en = g.zeros_bf16(t * h)?;
        let hn = g.zeros_bf16(t * h)?;
        ops::rms_norm(g, &e, &m.norm_embedding, &en, t, h, h, eps)?;
        ops::rms_norm(g, &hin, &m.norm_hidden, &hn, t, h, h, eps)?;
        // Embedding first, hidden second (vLLM / SGLang order).
        let mut cat = g.zeros_bf16(t * 2 * h)?;
        ops::concat_rows(g, &en, &hn, &mut cat, t, h, h)?;
        let mut u = g.zeros_bf16(t * h)?;
        ops::linear(g, &m.fc, &cat, t, Out::Bf16(&mut u))?;
        let pos0 = cache.position;
        for (l, c) in m.layers.iter().zip(cache.layers.iter_mut()) {
            self.run_layer(l, &u, c, pos0, t, false, false)?;
        }
        cache.position += t;
        let out = g.zeros_bf16(t * h)?;
        ops::rms_norm(g, &u, &m.norm, &out, t, h, h, eps)?;
        let rows = match rows {
            LogitsRows::All => 0..t,
            LogitsRows::Last => t - 1..t,
        };
        Ok((self.logits(&out, rows)?, self.read_mat(d, &out, t)?))
    }

    fn layer_caches<'a>(&self, layers: impl Iterator<Item = &'a LayerWeights>) -> GpuResult<Vec<LayerCache>> {
        let l_max = self.config.max_position_embeddings;
        layers
            .map(|l| {
                let g = &self.gpus[l.device];
                Ok(match &l.mixer {
                    MixerWeights::Gdn(w) => {
                        let s = w.shape;
                        LayerCache::Gdn(GdnCache {
                            device: l.device,
                            conv: g.zeros_bf16(w.conv_dim * (w.kernel - 1))?,
                            ssm: g.zeros_f32(s.v_heads * s.dv * s.dk)?,
                            conv_slots: None,
                            ssm_slots: None,
                            slot_tokens: 0,
                        })
                    }
                    MixerWeights::Attn(w) => {
                        let n = w.kv_heads * l_max * w.head_dim;
                        LayerCache::Attn(KvCacheDev {
                            device: l.device,
                            k: g.zeros_bf16(n)?,
                            v: g.zeros_bf16(n)?,
                            l_max,
                            row: w.kv_heads * w.head_dim,
                        })
                    }
                })
            })
            .collect()
    }

    pub fn gpu(&self, device: usize) -> Option<&Gpu> {
        self.gpus.get(device)
    }

    /// Whether the devices are emulated (`--device emu`).
    pub fn emulated(&self) -> bool {
        self.gpus.iter().any(|g| g.dev.emulated())
    }
}

/// One GDN layer's state on its device: the conv window (bf16, as the engine rounds it) and
/// the f32 recurrent state; during a verify pass, per-token slots of both to roll back to.
pub(crate) struct GdnCache {
    device: usize,
    conv: Bf16Buf,
    ssm: Buf<f32>,
    conv_slots: Option<Bf16Buf>,
    ssm_slots: Option<Buf<f32>>,
    slot_tokens: usize,
}

impl GdnCache {
    fn ensure_slots(&mut self, g: &Gpu, tokens: usize, conv_n: usize, ssm_n: usize) -> GpuResult<()> {
        if self.slot_tokens < tokens {
            self.conv_slots = Some(g.zeros_bf16(tokens * conv_n)?);
            self.ssm_slots = Some(g.zeros_f32(tokens * ssm_n)?);
            self.slot_tokens = tokens;
        }
        Ok(())
    }

    /// The conv window and the recurrent state, read back (tests: a rejected draft restores
    /// them exactly).
    pub(crate) fn read(&self) -> GpuResult<(Vec<u16>, Vec<f32>)> {
        Ok((self.conv.read()?, self.ssm.read()?))
    }
}

/// One attention layer's KV cache, `[kv_heads][l_max][head_dim]` bf16 each.
pub(crate) struct KvCacheDev {
    device: usize,
    k: Bf16Buf,
    v: Bf16Buf,
    l_max: usize,
    /// Values per position (`kv_heads · head_dim`).
    row: usize,
}

pub(crate) enum LayerCache {
    Gdn(GdnCache),
    Attn(KvCacheDev),
}

/// A sequence's state on the devices.
pub struct CudaCache {
    position: usize,
    layers: Vec<LayerCache>,
    /// Tokens of the last verify pass, until `accept`.
    verified: Option<usize>,
    /// The model's devices (shared handles), for the restores `accept` launches.
    gpus: Vec<Gpu>,
}

impl CudaCache {
    /// Every GDN layer's conv window and recurrent state, in layer order.
    pub fn gdn_states(&self) -> GpuResult<Vec<(Vec<u16>, Vec<f32>)>> {
        self.layers.iter().filter_map(|l| if let LayerCache::Gdn(g) = l { Some(g.read()) } else { None }).collect()
    }
}

impl SequenceCache for CudaCache {
    fn position(&self) -> usize {
        self.position
    }

    fn bytes(&self) -> StateBytes {
        let mut b = StateBytes::default();
        for l in &self.layers {
            match l {
                LayerCache::Gdn(g) => b.recurrent_bytes += g.conv.bytes() + g.ssm.bytes(),
                // Bytes in use (the cache is allocated for the whole context).
                LayerCache::Attn(kv) => b.kv_bytes += 2 * self.position * kv.row * 2,
            }
        }
        b
    }

    fn device_bytes(&self) -> Vec<StateBytes> {
        let mut out = vec![StateBytes::default(); self.gpus.len()];
        for l in &self.layers {
            match l {
                LayerCache::Gdn(g) => out[g.device].recurrent_bytes += g.conv.bytes() + g.ssm.bytes(),
                LayerCache::Attn(kv) => out[kv.device].kv_bytes += 2 * self.position * kv.row * 2,
            }
        }
        out
    }

    fn rollback_bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                LayerCache::Gdn(g) => {
                    g.conv_slots.as_ref().map_or(0, |s| s.bytes()) + g.ssm_slots.as_ref().map_or(0, |s| s.bytes())
                }
                LayerCache::Attn(_) => 0,
            })
            .sum()
    }

    fn accept(&mut self, keep: usize) -> Result<()> {
        let tokens =
            self.verified.take().ok_or_else(|| Error::State("accept without a verify pass to settle".into()))?;
        if keep == 0 || keep > tokens {
            return Err(Error::State(format!("cannot keep {keep} of the {tokens} verified tokens")));
        }
        for l in &mut self.layers {
            if let LayerCache::Gdn(c) = l {
                restore(&self.gpus[c.device], c, keep)?;
            }
        }
        self.position = self.position - tokens + keep;
        Ok(())
    }
}

/// Puts slot `keep − 1` of the last verify pass into the layer's conv and recurrent state.
fn restore(g: &Gpu, c: &mut GdnCache, keep: usize) -> Result<()> {
    let (Some(cs), Some(ss)) = (c.conv_slots.as_ref(), c.ssm_slots.as_ref()) else {
        return Err(Error::State("verify pass without rollback slots".into()));
    };
    let (conv_n, ssm_n) = (c.conv.len(), c.ssm.len());
    ops::conv_restore(g, &mut c.conv, cs, keep, conv_n)?;
    ops::gdn_restore(g, &mut c.ssm, ss, keep, ssm_n)?;
    Ok(())
}

/// The MTP head's KV caches on the last device.
pub struct CudaDraft {
    position: usize,
    layers: Vec<LayerCache>,
}

impl DraftCache for CudaDraft {
    fn position(&self) -> usize {
        self.position
    }

    fn truncate(&mut self, len: usize) {
        // Entries past `len` are overwritten by the next pass.
        self.position = self.position.min(len);
    }

    fn bytes(&self) -> usize {
        self.layers.iter().map(|l| if let LayerCache::Attn(kv) = l { 2 * self.position * kv.row * 2 } else { 0 }).sum()
    }
}

/// Rows `rows` of every pass's matrix, one after the other.
fn stack(parts: Vec<Mat>, cols: usize) -> Mat {
    let rows = parts.iter().map(|m| m.rows).sum();
    let mut data = Vec::with_capacity(rows * cols);
    for m in parts {
        data.extend_from_slice(&m.data);
    }
    Mat::from_vec(rows, cols, data)
}

impl Forward for CudaModel {
    type Cache = CudaCache;
    type Draft = CudaDraft;

    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    fn device_weights(&self) -> Vec<(String, usize)> {
        self.device_weights.clone()
    }

    fn compute_label(&self) -> crate::model::forward::ComputeLabel {
        let devices: Vec<&str> = self.device_weights.iter().map(|(d, _)| d.as_str()).collect();
        crate::model::forward::ComputeLabel {
            device: devices.join(","),
            // The CUDA engine computes at bf16 only (checked at load).
            dtype: Precision::Bf16.name(),
            kernel: if self.emulated() { "emu" } else { "cuda" }.into(),
        }
    }

    fn new_cache(&self) -> Result<CudaCache> {
        Ok(CudaCache {
            position: 0,
            layers: self.layer_caches(self.layers.iter())?,
            verified: None,
            gpus: self.gpus.clone(),
        })
    }

    fn new_draft_cache(&self) -> Result<Option<CudaDraft>> {
        let Some(m) = &self.mtp else { return Ok(None) };
        Ok(Some(CudaDraft { position: 0, layers: self.layer_caches(m.layers.iter())? }))
    }

    fn validate_at(&self, ids: &[u32], position: usize) -> Result<()> {
        validate_ids(&self.config, ids, position)
    }

    fn forward_cached(&self, ids: &[u32], cache: &mut CudaCache, opts: ForwardOptions) -> Result<ForwardOutput> {
        if ids.is_empty() {
            return Err(Error::InvalidArgument("forward needs at least one token".into()));
        }
        self.validate_at(ids, cache.position)?;
        if opts.verify && ids.len() > ops::GEMV_MAX_ROWS {
            return Err(Error::InvalidArgument(format!("a verify pass holds at most {} tokens", ops::GEMV_MAX_ROWS)));
        }
        let pos0 = cache.position;
        // A prefill runs in chunks of PREFILL_CHUNK tokens (the plan's workspace); a traced one
        // in one pass, so that ‖ΔS‖ is measured over the whole prefill as the CPU measures it.
        let chunk = if opts.trace_state { ids.len() } else { PREFILL_CHUNK };
        let pieces: Vec<&[u32]> = ids.chunks(chunk).collect();
        let (mut logits, mut hidden, mut traces) = (vec![], vec![], vec![]);
        for (i, piece) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len();
            // Earlier chunks' logits are dropped unless every row's were asked for.
            let (l, h, t) = self.forward_gpu(piece, cache, opts)?;
            cache.position += piece.len();
            if last || opts.logits == LogitsRows::All {
                logits.push(l);
            }
            hidden.push(h);
            if let Some(t) = t {
                traces.push(t);
            }
        }
        let vocab = self.config.vocab_size;
        let logits = stack(logits, vocab);
        let hidden = stack(hidden, self.config.hidden_size);
        if opts.check_finite {
            let first = ids.len() - logits.rows;
            finite::check(&logits, None, Sublayer::LmHead, pos0 + first, &ids[first..])?;
        }
        let state_trace =
            opts.trace_state.then(|| StateTrace { layers: traces.into_iter().next().unwrap_or_default() });
        Ok(ForwardOutput { logits, hidden_norms: None, hidden, state_trace })
    }

    fn mtp_forward_cached(
        &self,
        next_ids: &[u32],
        hidden: &Mat,
        cache: &mut CudaDraft,
        rows: LogitsRows,
    ) -> Result<MtpOutput> {
        if next_ids.len() != hidden.rows || next_ids.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "MTP needs one hidden row per token ({} tokens, {} rows)",
                next_ids.len(),
                hidden.rows
            )));
        }
        validate_ids(&self.config, next_ids, 0)?;
        let pos0 = cache.position;
        // In passes of PREFILL_CHUNK rows, as the forward pass (catching the draft cache up
        // on a prompt hands it every row): the plan's workspace holds one.
        let h = self.config.hidden_size;
        let pieces = next_ids.len().div_ceil(PREFILL_CHUNK);
        let (mut logits, mut hiddens) = (vec![], vec![]);
        for i in 0..pieces {
            let r = i * PREFILL_CHUNK..((i + 1) * PREFILL_CHUNK).min(next_ids.len());
            let part = Mat::from_vec(r.len(), h, hidden.data[r.start * h..r.end * h].to_vec());
            let (l, hs) = self.mtp_gpu(&next_ids[r], &part, cache, rows)?;
            if i + 1 == pieces || rows == LogitsRows::All {
                logits.push(l);
            }
            hiddens.push(hs);
        }
        let (logits, hidden) = (stack(logits, self.config.vocab_size), stack(hiddens, h));
        let base = next_ids.len() - logits.rows;
        finite::check(&logits, None, Sublayer::MtpHead, pos0 + base, &next_ids[base..])?;
        Ok(MtpOutput { logits, hidden })
    }
}
