//! `deltascope synth`: a random-weight checkpoint of any real shape, written without Python —
//! the benchmark's model, the GPU check's model, and a way to size a machine before
//! downloading 54 GB. Tensors are written one after the other straight into one safetensors
//! file (header first, then each tensor as it is generated), so a 27B shape never has to fit
//! in memory.
//! A developer tool (tests/architecture.rs lists the exception): it reads the model's configuration
//! types to know which tensors a shape holds.

use rayon::prelude::*;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

use super::report::{self, Report};
// A developer tool (architecture.json): it reads the model's configuration to know its tensors.
use super::safetensors_out::{Layout, Out};
use deltascope_model::fp8;
use deltascope_model::human_bytes;
use deltascope_model::{Family, LayerKind, MlpKind, ModelConfig};
use deltascope_model::{ModelSource, demo_source};

#[derive(Args, Debug)]
pub struct SynthArgs {
    /// The shape to copy: a model directory or a config.json.
    #[arg(long, value_name = "CONFIG_OR_DIR")]
    pub like: PathBuf,
    /// Where to write config.json, model.safetensors and the tokenizer (created; must be empty
    /// or missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Storage dtype of the weights. `fp8`: Qwen's published FP8 format (the projections as
    /// e4m3 with a bf16 scale per 128 × 128 block, everything else bf16).
    #[arg(long, default_value = "bf16", value_parser = ["bf16", "f32", "f16", "fp8"])]
    pub dtype: String,
    /// Add an MTP head (one layer unless the config says how many).
    #[arg(long)]
    pub mtp: bool,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// One tensor to write: its name, shape and how to fill it.
struct Spec {
    name: String,
    shape: Vec<usize>,
    fill: Fill,
}

#[derive(Clone, Copy)]
enum Fill {
    /// Normal with this standard deviation (projections, embeddings: transformers' 0.02).
    Normal(f32),
    /// Zero (the zero-centred norms: a weight of 1).
    Zero,
    /// One (the GDN output norm, which is not zero-centred).
    One,
    /// `A_log`: ln of a value uniform in [1, 16], as the reference initialises it.
    ALog,
}

/// The tensors of a checkpoint of this configuration, in the loader's names. `per_expert`: one
/// tensor per expert (Qwen3-Next, and every FP8 MoE release) where Qwen3.5-MoE's bf16 release
/// fuses them.
fn tensors(cfg: &ModelConfig, mtp_layers: usize, per_expert: bool) -> Vec<Spec> {
    let p = if cfg.nested { "model.language_model." } else { "model." };
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    let mut t = Tensors { cfg, per_expert, specs: vec![] };
    t.add(format!("{p}embed_tokens.weight"), vec![v, h], PROJECTION);
    for i in 0..cfg.num_hidden_layers {
        t.decoder_layer(&format!("{p}layers.{i}."), cfg.layer_types[i], cfg.mlp_kinds[i]);
    }
    t.add(format!("{p}norm.weight"), vec![h], Fill::Zero);
    if !cfg.tie_word_embeddings {
        t.add("lm_head.weight".into(), vec![v, h], PROJECTION);
    }
    t.mtp(mtp_layers);
    t.specs
}

/// Projections and embeddings: transformers' initialisation.
const PROJECTION: Fill = Fill::Normal(0.02);

/// A checkpoint's tensor list as it is built, in the order it is written.
struct Tensors<'a> {
    cfg: &'a ModelConfig,
    per_expert: bool,
    specs: Vec<Spec>,
}

impl Tensors<'_> {
    fn add(&mut self, name: String, shape: Vec<usize>, fill: Fill) {
        self.specs.push(Spec { name, shape, fill });
    }

    /// One decoder layer under the prefix `l`: its norms, its mixer, its MLP.
    fn decoder_layer(&mut self, l: &str, kind: LayerKind, mlp: MlpKind) {
        let h = self.cfg.hidden_size;
        self.add(format!("{l}input_layernorm.weight"), vec![h], Fill::Zero);
        self.add(format!("{l}post_attention_layernorm.weight"), vec![h], Fill::Zero);
        match kind {
            LayerKind::FullAttention => self.attention(l),
            LayerKind::LinearAttention => self.gated_delta_net(&format!("{l}linear_attn.")),
        }
        self.mlp(l, mlp);
    }

    fn attention(&mut self, l: &str) {
        let (cfg, h) = (self.cfg, self.cfg.hidden_size);
        let (qw, kw) = (cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim);
        self.add(format!("{l}self_attn.q_proj.weight"), vec![2 * qw, h], PROJECTION);
        self.add(format!("{l}self_attn.k_proj.weight"), vec![kw, h], PROJECTION);
        self.add(format!("{l}self_attn.v_proj.weight"), vec![kw, h], PROJECTION);
        self.add(format!("{l}self_attn.q_norm.weight"), vec![cfg.head_dim], Fill::Zero);
        self.add(format!("{l}self_attn.k_norm.weight"), vec![cfg.head_dim], Fill::Zero);
        self.add(format!("{l}self_attn.o_proj.weight"), vec![h, qw], PROJECTION);
    }

    /// A Gated-DeltaNet layer under the prefix `g`: Qwen3-Next fuses its input projections in
    /// pairs, Qwen3.5 keeps them apart.
    fn gated_delta_net(&mut self, g: &str) {
        let (lin, h) = (&self.cfg.linear, self.cfg.hidden_size);
        let (kd, vd, hv) = (lin.key_dim(), lin.value_dim(), lin.num_value_heads);
        if self.cfg.family == Family::Qwen3Next {
            self.add(format!("{g}in_proj_qkvz.weight"), vec![2 * kd + 2 * vd, h], PROJECTION);
            self.add(format!("{g}in_proj_ba.weight"), vec![2 * hv, h], PROJECTION);
        } else {
            self.add(format!("{g}in_proj_qkv.weight"), vec![2 * kd + vd, h], PROJECTION);
            self.add(format!("{g}in_proj_z.weight"), vec![vd, h], PROJECTION);
            self.add(format!("{g}in_proj_b.weight"), vec![hv, h], PROJECTION);
            self.add(format!("{g}in_proj_a.weight"), vec![hv, h], PROJECTION);
        }
        let conv = Fill::Normal(1.0 / (lin.conv_kernel as f32).sqrt());
        self.add(format!("{g}conv1d.weight"), vec![lin.conv_dim(), 1, lin.conv_kernel], conv);
        self.add(format!("{g}A_log"), vec![hv], Fill::ALog);
        self.add(format!("{g}dt_bias"), vec![hv], Fill::One);
        self.add(format!("{g}norm.weight"), vec![lin.value_head_dim], Fill::One);
        self.add(format!("{g}out_proj.weight"), vec![h, vd], PROJECTION);
    }

    /// The MLP: a mixture of experts with its shared expert where the layer is one (and the
    /// configuration has experts), a dense one otherwise.
    fn mlp(&mut self, l: &str, kind: MlpKind) {
        let h = self.cfg.hidden_size;
        let Some(m) = self.cfg.moe.as_ref().filter(|_| kind == MlpKind::Moe) else {
            let i = self.cfg.intermediate_size.unwrap_or(4 * h);
            self.add(format!("{l}mlp.gate_proj.weight"), vec![i, h], PROJECTION);
            self.add(format!("{l}mlp.up_proj.weight"), vec![i, h], PROJECTION);
            self.add(format!("{l}mlp.down_proj.weight"), vec![h, i], PROJECTION);
            return;
        };
        let (e, i, s) = (m.num_experts, m.moe_intermediate_size, m.shared_expert_intermediate_size);
        self.add(format!("{l}mlp.gate.weight"), vec![e, h], PROJECTION);
        self.experts(l, e, i);
        self.add(format!("{l}mlp.shared_expert.gate_proj.weight"), vec![s, h], PROJECTION);
        self.add(format!("{l}mlp.shared_expert.up_proj.weight"), vec![s, h], PROJECTION);
        self.add(format!("{l}mlp.shared_expert.down_proj.weight"), vec![h, s], PROJECTION);
        self.add(format!("{l}mlp.shared_expert_gate.weight"), vec![1, h], PROJECTION);
    }

    /// `e` experts of intermediate size `i`: one tensor each, or fused into one.
    fn experts(&mut self, l: &str, e: usize, i: usize) {
        let h = self.cfg.hidden_size;
        if self.per_expert {
            for x in 0..e {
                self.add(format!("{l}mlp.experts.{x}.gate_proj.weight"), vec![i, h], PROJECTION);
                self.add(format!("{l}mlp.experts.{x}.up_proj.weight"), vec![i, h], PROJECTION);
                self.add(format!("{l}mlp.experts.{x}.down_proj.weight"), vec![h, i], PROJECTION);
            }
        } else {
            self.add(format!("{l}mlp.experts.gate_up_proj"), vec![e, 2 * i, h], PROJECTION);
            self.add(format!("{l}mlp.experts.down_proj"), vec![e, h, i], PROJECTION);
        }
    }

    /// The MTP head: its input projection and norms once, then `layers` full-attention layers
    /// (dense on Qwen3.5, experts on the others).
    fn mtp(&mut self, layers: usize) {
        let h = self.cfg.hidden_size;
        let mlp = if self.cfg.family == Family::Qwen35 { MlpKind::Dense } else { MlpKind::Moe };
        for i in 0..layers {
            if i == 0 {
                self.add("mtp.fc.weight".into(), vec![h, 2 * h], PROJECTION);
                self.add("mtp.pre_fc_norm_embedding.weight".into(), vec![h], Fill::Zero);
                self.add("mtp.pre_fc_norm_hidden.weight".into(), vec![h], Fill::Zero);
                self.add("mtp.norm.weight".into(), vec![h], Fill::Zero);
            }
            self.decoder_layer(&format!("mtp.layers.{i}."), LayerKind::FullAttention, mlp);
        }
    }
}

/// A small, seeded generator (SplitMix64): the same seed writes the same checkpoint.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 + 1.0) / (1u64 << 24) as f32
    }

    /// Standard normal (Box–Muller).
    fn normal(&mut self) -> f32 {
        let (a, b) = (self.uniform(), self.uniform());
        (-2.0 * a.ln()).sqrt() * (std::f32::consts::TAU * b).cos()
    }
}

fn value(fill: Fill, rng: &mut Rng) -> f32 {
    match fill {
        Fill::Normal(std) => rng.normal() * std,
        Fill::Zero => 0.0,
        Fill::One => 1.0,
        Fill::ALog => (1.0 + 15.0 * rng.uniform()).ln(),
    }
}

fn encode(x: f32, dtype: &str, out: &mut Vec<u8>) {
    match dtype {
        "f32" => out.extend_from_slice(&x.to_le_bytes()),
        "f16" => out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
        _ => out.extend_from_slice(&half::bf16::from_f32(x).to_le_bytes()),
    }
}

pub fn run(a: SynthArgs) -> anyhow::Result<()> {
    let (config, cfg) = read_config(&a.like)?;
    if a.out.exists() && std::fs::read_dir(&a.out).map(|mut d| d.next().is_some()).unwrap_or(true) {
        anyhow::bail!("--out {}: exists and is not an empty directory (nothing was written)", a.out.display());
    }
    std::fs::create_dir_all(&a.out).map_err(|e| anyhow::anyhow!("--out {}: cannot create it: {e}", a.out.display()))?;

    let mtp_layers = if a.mtp { cfg.mtp_num_hidden_layers.max(1) } else { 0 };
    let storage = Storage::of(&a.dtype);
    // Qwen's FP8 MoE releases store every expert's projections as their own FP8 matrices.
    let specs = tensors(&cfg, mtp_layers, storage.fp8 || cfg.family == Family::Qwen3Next);
    let (layout, stored) = storage.layout(&specs);
    let mut w = layout.create(&a.out.join("model.safetensors"))?;
    for (ti, s) in specs.iter().enumerate() {
        let chunks = Chunks { seed: a.seed, tensor: ti, fill: s.fill, total: s.shape.iter().product() };
        storage.write(&mut w, s, &chunks)?;
    }
    w.finish()?;
    write_config(&a.out, config, &cfg, &storage, &specs, a.mtp.then_some(mtp_layers))?;
    let report = SynthReport {
        out: a.out.display().to_string(),
        tensors: specs.len(),
        parameters: specs.iter().map(|s| s.shape.iter().product::<usize>()).sum(),
        bytes: stored,
        dtype: a.dtype.clone(),
        mtp_layers,
        tokenizer: copy_tokenizer(&a.like, &a.out)?,
    };
    report::emit(&report, false)
}

/// The configuration `--like` names: as JSON (to write back with what changed) and as the
/// model reads it.
fn read_config(like: &Path) -> anyhow::Result<(serde_json::Value, ModelConfig)> {
    let config_path = if like.is_dir() { like.join("config.json") } else { like.to_path_buf() };
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| anyhow::anyhow!("--like {}: cannot read {}: {e}", like.display(), config_path.display()))?;
    let config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: invalid JSON: {e}", config_path.display()))?;
    let cfg = ModelConfig::from_json_str(&text, &config_path.display().to_string())?;
    Ok((config, cfg))
}

/// How the weights are stored: `plain` for every tensor, except the projections an FP8
/// checkpoint holds in FP8 (everything else in it is bf16).
struct Storage<'a> {
    fp8: bool,
    plain: &'a str,
    /// Bytes per value in the plain dtype.
    elem: usize,
}

/// Values per generated chunk, and chunks generated at once between writes.
const CHUNK: usize = 1 << 18;
const BATCH: usize = 64;

impl<'a> Storage<'a> {
    fn of(dtype: &'a str) -> Self {
        let fp8 = dtype == "fp8";
        let plain = if fp8 { "bf16" } else { dtype };
        Storage { fp8, plain, elem: if plain == "f32" { 4 } else { 2 } }
    }

    fn quantised(&self, s: &Spec) -> bool {
        self.fp8 && fp8::quantised_in_fp8(&s.name, &s.shape)
    }

    /// The header: every tensor's place in the data, computed before any value is generated
    /// (an FP8 weight's scales follow it); and the bytes they take.
    fn layout(&self, specs: &[Spec]) -> (Layout, usize) {
        let mut layout = Layout::new("deltascope synth");
        let mut stored = 0usize;
        for s in specs {
            let values = s.shape.iter().product::<usize>();
            if self.quantised(s) {
                let grid = vec![s.shape[0].div_ceil(fp8::BLOCK), s.shape[1].div_ceil(fp8::BLOCK)];
                let scale_bytes = grid[0] * grid[1] * 2;
                layout.place(s.name.clone(), "F8_E4M3", s.shape.clone(), values);
                layout.place(format!("{}_scale_inv", s.name), "BF16", grid, scale_bytes);
                stored += values + scale_bytes;
            } else {
                layout.place(s.name.clone(), &self.plain.to_uppercase(), s.shape.clone(), values * self.elem);
                stored += values * self.elem;
            }
        }
        (layout, stored)
    }

    /// One tensor's values, generated on every thread and written in order.
    fn write(&self, w: &mut Out, s: &Spec, chunks: &Chunks) -> anyhow::Result<()> {
        let n = chunks.total.div_ceil(CHUNK);
        if self.quantised(s) {
            // The same values as the other dtypes, quantised a band of 128 rows at a time (a
            // whole projection in memory: at most a few hundred MB on a 27B shape).
            let values: Vec<f32> = (0..n).into_par_iter().map(|c| chunks.values(c)).flatten().collect();
            let (q, scales) = fp8::quantize_par(&values, s.shape[0], s.shape[1]);
            w.write(&q)?;
            return w.write(&scales.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>());
        }
        for first in (0..n).step_by(BATCH) {
            let bufs: Vec<Vec<u8>> = (first..(first + BATCH).min(n))
                .into_par_iter()
                .map(|c| {
                    let v = chunks.values(c);
                    let mut buf = Vec::with_capacity(v.len() * self.elem);
                    for x in v {
                        encode(x, self.plain, &mut buf);
                    }
                    buf
                })
                .collect();
            for b in &bufs {
                w.write(b)?;
            }
        }
        Ok(())
    }
}

/// One tensor's values in chunks, each from its own generator seeded by (seed, tensor, chunk):
/// the same bits on any number of threads, generated on all of them (a 27B checkpoint in about
/// a minute on 16 cores).
struct Chunks {
    seed: u64,
    tensor: usize,
    fill: Fill,
    /// The tensor's number of values.
    total: usize,
}

impl Chunks {
    fn values(&self, c: usize) -> Vec<f32> {
        let mut rng = Rng(self.seed ^ 0x5eed_5eed_5eed_5eed ^ ((self.tensor as u64) << 32) ^ c as u64);
        rng.next_u64();
        let mut v = Vec::with_capacity(CHUNK);
        v.extend((0..CHUNK.min(self.total - c * CHUNK)).map(|_| value(self.fill, &mut rng)));
        v
    }
}

/// The config as given, saying what was written: the dtype, the MTP layers when --mtp added
/// them, and an FP8 checkpoint's quantisation.
fn write_config(
    out: &Path,
    mut config: serde_json::Value,
    cfg: &ModelConfig,
    storage: &Storage,
    specs: &[Spec],
    mtp_layers: Option<usize>,
) -> anyhow::Result<()> {
    let target = if cfg.nested { &mut config["text_config"] } else { &mut config };
    if let Some(n) = mtp_layers {
        target["mtp_num_hidden_layers"] = n.into();
    }
    target["dtype"] = match storage.plain {
        "f32" => "float32",
        "f16" => "float16",
        _ => "bfloat16",
    }
    .into();
    if storage.fp8 {
        // As Qwen's releases write it: at the top level, listing the modules left unquantised.
        let kept = specs.iter().filter(|s| !storage.quantised(s)).map(|s| s.name.as_str());
        let unconverted = fp8::unconverted_modules(kept, cfg.tie_word_embeddings);
        config["quantization_config"] = fp8::quantization_config(&unconverted);
    }
    std::fs::write(out.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    Ok(())
}

/// What `synth` wrote.
#[derive(Serialize)]
struct SynthReport {
    out: String,
    tensors: usize,
    parameters: usize,
    /// The weights' bytes in the safetensors file (FP8 scales included).
    bytes: usize,
    dtype: String,
    /// 0: no MTP head.
    mtp_layers: usize,
    /// Where the tokenizer came from.
    tokenizer: String,
}

impl Report for SynthReport {
    fn print_human(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "wrote {}: {} tensors, {} parameters, {} in {} ({}); tokenizer from {}",
            self.out,
            self.tensors,
            self.parameters,
            human_bytes(self.bytes as u64),
            self.dtype,
            match self.mtp_layers {
                0 => "no MTP head".into(),
                n => format!("with a {n}-layer MTP head"),
            },
            self.tokenizer
        )
    }
}

/// The tokenizer and chat template of `--like` when it is a model directory holding them,
/// else the demo model's (its ids are all below any real vocabulary size).
fn copy_tokenizer(like: &Path, out: &Path) -> anyhow::Result<String> {
    const FILES: [&str; 3] = ["tokenizer.json", "tokenizer_config.json", "generation_config.json"];
    if like.is_dir() && like.join("tokenizer.json").is_file() {
        for f in FILES.iter().filter(|f| like.join(f).is_file()) {
            std::fs::copy(like.join(f), out.join(f))?;
        }
        return Ok(like.display().to_string());
    }
    let demo = demo_source();
    for f in FILES {
        if let Some(bytes) = demo.read(f)? {
            std::fs::write(out.join(f), bytes)?;
        }
    }
    Ok(match demo {
        ModelSource::Embedded(e) => format!("the embedded {} model", e.name),
        ModelSource::Dir(d) => d.display().to_string(),
        ModelSource::Gguf(g) => g.path().display().to_string(),
    })
}
