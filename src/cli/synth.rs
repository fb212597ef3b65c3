//! `deltascope synth`: a random-weight checkpoint of any real shape, written without Python —
//! the benchmark's model, the GPU check's model, and a way to size a machine before
//! downloading 54 GB. Tensors are written one after the other straight into one safetensors
//! file (header first, then each tensor as it is generated), so a 27B shape never has to fit
//! in memory.
//! A developer tool (tests/architecture.rs lists the exception): it reads the model's configuration
//! types to know which tensors a shape holds.

use rayon::prelude::*;
use std::path::{Path, PathBuf};

use clap::Args;

// A developer tool (architecture.json): it reads the model's configuration to know its tensors.
use super::safetensors_out::Layout;
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
    let mut out = vec![];
    let mut add = |name: String, shape: Vec<usize>, fill: Fill| out.push(Spec { name, shape, fill });
    let proj = Fill::Normal(0.02);
    add(format!("{p}embed_tokens.weight"), vec![v, h], proj);
    let attention = |add: &mut dyn FnMut(String, Vec<usize>, Fill), l: &str| {
        let (qw, kw) = (cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim);
        add(format!("{l}self_attn.q_proj.weight"), vec![2 * qw, h], proj);
        add(format!("{l}self_attn.k_proj.weight"), vec![kw, h], proj);
        add(format!("{l}self_attn.v_proj.weight"), vec![kw, h], proj);
        add(format!("{l}self_attn.q_norm.weight"), vec![cfg.head_dim], Fill::Zero);
        add(format!("{l}self_attn.k_norm.weight"), vec![cfg.head_dim], Fill::Zero);
        add(format!("{l}self_attn.o_proj.weight"), vec![h, qw], proj);
    };
    let mlp = |add: &mut dyn FnMut(String, Vec<usize>, Fill), l: &str, kind: MlpKind| match (kind, &cfg.moe) {
        (MlpKind::Moe, Some(m)) => {
            let (e, i) = (m.num_experts, m.moe_intermediate_size);
            add(format!("{l}mlp.gate.weight"), vec![e, h], proj);
            if per_expert {
                for x in 0..e {
                    add(format!("{l}mlp.experts.{x}.gate_proj.weight"), vec![i, h], proj);
                    add(format!("{l}mlp.experts.{x}.up_proj.weight"), vec![i, h], proj);
                    add(format!("{l}mlp.experts.{x}.down_proj.weight"), vec![h, i], proj);
                }
            } else {
                add(format!("{l}mlp.experts.gate_up_proj"), vec![e, 2 * i, h], proj);
                add(format!("{l}mlp.experts.down_proj"), vec![e, h, i], proj);
            }
            let s = m.shared_expert_intermediate_size;
            add(format!("{l}mlp.shared_expert.gate_proj.weight"), vec![s, h], proj);
            add(format!("{l}mlp.shared_expert.up_proj.weight"), vec![s, h], proj);
            add(format!("{l}mlp.shared_expert.down_proj.weight"), vec![h, s], proj);
            add(format!("{l}mlp.shared_expert_gate.weight"), vec![1, h], proj);
        }
        _ => {
            let i = cfg.intermediate_size.unwrap_or(4 * h);
            add(format!("{l}mlp.gate_proj.weight"), vec![i, h], proj);
            add(format!("{l}mlp.up_proj.weight"), vec![i, h], proj);
            add(format!("{l}mlp.down_proj.weight"), vec![h, i], proj);
        }
    };
    let lin = &cfg.linear;
    let (kd, vd, hv) = (lin.key_dim(), lin.value_dim(), lin.num_value_heads);
    for i in 0..cfg.num_hidden_layers {
        let l = format!("{p}layers.{i}.");
        add(format!("{l}input_layernorm.weight"), vec![h], Fill::Zero);
        add(format!("{l}post_attention_layernorm.weight"), vec![h], Fill::Zero);
        match cfg.layer_types[i] {
            LayerKind::FullAttention => attention(&mut add, &l),
            LayerKind::LinearAttention => {
                let g = format!("{l}linear_attn.");
                if cfg.family == Family::Qwen3Next {
                    add(format!("{g}in_proj_qkvz.weight"), vec![2 * kd + 2 * vd, h], proj);
                    add(format!("{g}in_proj_ba.weight"), vec![2 * hv, h], proj);
                } else {
                    add(format!("{g}in_proj_qkv.weight"), vec![2 * kd + vd, h], proj);
                    add(format!("{g}in_proj_z.weight"), vec![vd, h], proj);
                    add(format!("{g}in_proj_b.weight"), vec![hv, h], proj);
                    add(format!("{g}in_proj_a.weight"), vec![hv, h], proj);
                }
                let conv = Fill::Normal(1.0 / (lin.conv_kernel as f32).sqrt());
                add(format!("{g}conv1d.weight"), vec![lin.conv_dim(), 1, lin.conv_kernel], conv);
                add(format!("{g}A_log"), vec![hv], Fill::ALog);
                add(format!("{g}dt_bias"), vec![hv], Fill::One);
                add(format!("{g}norm.weight"), vec![lin.value_head_dim], Fill::One);
                add(format!("{g}out_proj.weight"), vec![h, vd], proj);
            }
        }
        mlp(&mut add, &l, cfg.mlp_kinds[i]);
    }
    add(format!("{p}norm.weight"), vec![h], Fill::Zero);
    if !cfg.tie_word_embeddings {
        add("lm_head.weight".into(), vec![v, h], proj);
    }
    let mtp_mlp = if cfg.family == Family::Qwen35 { MlpKind::Dense } else { MlpKind::Moe };
    for i in 0..mtp_layers {
        if i == 0 {
            add("mtp.fc.weight".into(), vec![h, 2 * h], proj);
            add("mtp.pre_fc_norm_embedding.weight".into(), vec![h], Fill::Zero);
            add("mtp.pre_fc_norm_hidden.weight".into(), vec![h], Fill::Zero);
            add("mtp.norm.weight".into(), vec![h], Fill::Zero);
        }
        let l = format!("mtp.layers.{i}.");
        add(format!("{l}input_layernorm.weight"), vec![h], Fill::Zero);
        add(format!("{l}post_attention_layernorm.weight"), vec![h], Fill::Zero);
        attention(&mut add, &l);
        mlp(&mut add, &l, mtp_mlp);
    }
    out
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
    let config_path = if a.like.is_dir() { a.like.join("config.json") } else { a.like.clone() };
    let text = std::fs::read_to_string(&config_path)
        .map_err(|e| anyhow::anyhow!("--like {}: cannot read {}: {e}", a.like.display(), config_path.display()))?;
    let mut config: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: invalid JSON: {e}", config_path.display()))?;
    let cfg = ModelConfig::from_json_str(&text, &config_path.display().to_string())?;
    if a.out.exists() && std::fs::read_dir(&a.out).map(|mut d| d.next().is_some()).unwrap_or(true) {
        anyhow::bail!("--out {}: exists and is not an empty directory (nothing was written)", a.out.display());
    }
    std::fs::create_dir_all(&a.out).map_err(|e| anyhow::anyhow!("--out {}: cannot create it: {e}", a.out.display()))?;

    let mtp_layers = if a.mtp { cfg.mtp_num_hidden_layers.max(1) } else { 0 };
    let fp8 = a.dtype == "fp8";
    // Qwen's FP8 MoE releases store every expert's projections as their own FP8 matrices.
    let specs = tensors(&cfg, mtp_layers, fp8 || cfg.family == Family::Qwen3Next);
    // Everything that is not an FP8 projection is bf16 in an FP8 checkpoint.
    let plain = if fp8 { "bf16" } else { a.dtype.as_str() };
    let elem = if plain == "f32" { 4 } else { 2 };
    let quantised = |s: &Spec| fp8 && fp8::quantised_in_fp8(&s.name, &s.shape);
    // The header: every tensor's place in the data, computed before any value is generated
    // (an FP8 weight's scales follow it).
    let mut layout = Layout::new("deltascope synth");
    let mut stored = 0usize;
    for s in &specs {
        let values = s.shape.iter().product::<usize>();
        if quantised(s) {
            let grid = vec![s.shape[0].div_ceil(fp8::BLOCK), s.shape[1].div_ceil(fp8::BLOCK)];
            let scale_bytes = grid[0] * grid[1] * 2;
            layout.place(s.name.clone(), "F8_E4M3", s.shape.clone(), values);
            layout.place(format!("{}_scale_inv", s.name), "BF16", grid, scale_bytes);
            stored += values + scale_bytes;
        } else {
            layout.place(s.name.clone(), &plain.to_uppercase(), s.shape.clone(), values * elem);
            stored += values * elem;
        }
    }
    let mut w = layout.create(&a.out.join("model.safetensors"))?;
    // Values in chunks, each from its own generator seeded by (seed, tensor, chunk): the same
    // bits on any number of threads, generated on all of them (a 27B checkpoint in about a
    // minute on 16 cores), written in order.
    const CHUNK: usize = 1 << 18;
    const BATCH: usize = 64;
    for (ti, s) in specs.iter().enumerate() {
        let total: usize = s.shape.iter().product();
        let chunks = total.div_ceil(CHUNK);
        let generate = |c: usize, out: &mut Vec<f32>| {
            let mut rng = Rng(a.seed ^ 0x5eed_5eed_5eed_5eed ^ ((ti as u64) << 32) ^ c as u64);
            rng.next_u64();
            out.extend((0..CHUNK.min(total - c * CHUNK)).map(|_| value(s.fill, &mut rng)));
        };
        if quantised(s) {
            // The same values as the other dtypes, quantised a band of 128 rows at a time (a
            // whole projection in memory: at most a few hundred MB on a 27B shape).
            let values: Vec<f32> = (0..chunks)
                .into_par_iter()
                .map(|c| {
                    let mut v = Vec::with_capacity(CHUNK);
                    generate(c, &mut v);
                    v
                })
                .flatten()
                .collect();
            let (q, scales) = fp8::quantize_par(&values, s.shape[0], s.shape[1]);
            w.write(&q)?;
            w.write(&scales.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>())?;
            continue;
        }
        for first in (0..chunks).step_by(BATCH) {
            let bufs: Vec<Vec<u8>> = (first..(first + BATCH).min(chunks))
                .into_par_iter()
                .map(|c| {
                    let mut v = Vec::with_capacity(CHUNK);
                    generate(c, &mut v);
                    let mut buf = Vec::with_capacity(v.len() * elem);
                    for x in v {
                        encode(x, plain, &mut buf);
                    }
                    buf
                })
                .collect();
            for b in &bufs {
                w.write(b)?;
            }
        }
    }
    w.finish()?;

    // The config as given, saying what was written.
    let target = if cfg.nested { &mut config["text_config"] } else { &mut config };
    if a.mtp {
        target["mtp_num_hidden_layers"] = mtp_layers.into();
    }
    target["dtype"] = match plain {
        "f32" => "float32",
        "f16" => "float16",
        _ => "bfloat16",
    }
    .into();
    if fp8 {
        // As Qwen's releases write it: at the top level, listing the modules left unquantised.
        let kept = specs.iter().filter(|s| !quantised(s)).map(|s| s.name.as_str());
        let unconverted = fp8::unconverted_modules(kept, cfg.tie_word_embeddings);
        config["quantization_config"] = fp8::quantization_config(&unconverted);
    }
    std::fs::write(a.out.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    let copied = copy_tokenizer(&a.like, &a.out)?;
    let params: usize = specs.iter().map(|s| s.shape.iter().product::<usize>()).sum();
    println!(
        "wrote {}: {} tensors, {params} parameters, {} in {} ({}); tokenizer from {copied}",
        a.out.display(),
        specs.len(),
        human_bytes(stored as u64),
        a.dtype,
        if a.mtp { format!("with a {mtp_layers}-layer MTP head") } else { "no MTP head".into() }
    );
    Ok(())
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
    })
}
