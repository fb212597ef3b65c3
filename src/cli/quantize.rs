//! `deltascope quantize --fp8 SRC DST`: a bf16 (or f16 / f32) checkpoint rewritten in Qwen's
//! published FP8 format (the projections as e4m3 with a bf16 scale per 128 × 128 block, the
//! rest as stored), and what that costs: both models' logits over a short probe set, compared
//! position by position, so the user sees the change before using it.
//! A developer tool (tests/architecture.rs lists the exception): it reads the checkpoint's
//! tensors and runs both models' forward passes directly.

use std::path::{Path, PathBuf};

use clap::Args;
use rayon::prelude::*;

use super::common;
use super::safetensors_out::Layout;
use crate::backend::ChatRequest;
use deltascope_protocol::{GenerationParams, Thinking};
// A developer tool (architecture.json): it rewrites the model's tensors and compares logits.
use deltascope_model::WeightStore;
use deltascope_model::Weights;
use deltascope_model::fp8;
use deltascope_model::human_bytes;
use deltascope_model::{ForwardOptions, LoadOptions, LogitsRows, Model, ModelSource, Precision, read_config};

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// Write FP8 (e4m3 weights, a bf16 scale per 128 × 128 block), the format of Qwen's
    /// published FP8 checkpoints (the only format this command writes).
    #[arg(long, required = true)]
    pub fp8: bool,
    /// The checkpoint to convert (a model directory: config.json, safetensors, tokenizer).
    #[arg(value_name = "SRC")]
    pub src: PathBuf,
    /// Where to write it (created; must be empty or missing).
    #[arg(value_name = "DST")]
    pub dst: PathBuf,
    /// Skip the logit comparison (it loads both models and runs the probe set at f32).
    #[arg(long)]
    pub no_probe: bool,
}

/// The probe set: one prompt of each kind the demo answers, and a longer one.
const PROBES: [&str; 4] = [
    "Which is larger, 94 or 91?",
    "Sort 47, 43, 54.",
    "Is 91 prime?",
    "Explain in two sentences why the sky is blue, then count from one to ten.",
];

pub fn run(a: QuantizeArgs) -> anyhow::Result<()> {
    let src = ModelSource::Dir(a.src.clone());
    let cfg = read_config(&src)?;
    if cfg.quantization.is_some() {
        anyhow::bail!(
            "{}: already quantised (config.json has a quantization_config); nothing was written",
            a.src.display()
        );
    }
    if a.dst.exists() && std::fs::read_dir(&a.dst).map(|mut d| d.next().is_some()).unwrap_or(true) {
        anyhow::bail!("{}: exists and is not an empty directory (nothing was written)", a.dst.display());
    }
    let store = WeightStore::open(&src)?;
    let mut names: Vec<String> = store.names().map(str::to_string).collect();
    names.sort();
    let plan: Vec<Entry> = names
        .into_iter()
        .flat_map(|n| {
            let shape = store.shape(&n).unwrap_or(&[]).to_vec();
            Entry::for_tensor(n, shape)
        })
        .collect();
    std::fs::create_dir_all(&a.dst).map_err(|e| anyhow::anyhow!("{}: cannot create it: {e}", a.dst.display()))?;
    let written = write(&store, &plan, &a.dst.join("model.safetensors"))?;
    drop(store);

    // config.json as it was, with the quantization_config Qwen's releases carry.
    let text = std::fs::read_to_string(a.src.join("config.json"))?;
    let mut config: serde_json::Value = serde_json::from_str(&text)?;
    let kept = plan.iter().filter(|p| !p.fp8).map(|p| p.name.as_str());
    let unconverted = fp8::unconverted_modules(kept, cfg.tie_word_embeddings);
    config["quantization_config"] = fp8::quantization_config(&unconverted);
    std::fs::write(a.dst.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    // Everything else beside the weights (tokenizer, chat template, generation config), but no
    // other copy of the weights (`.bin`, `.pt`, a GGUF …).
    const WEIGHTS: [&str; 7] = [".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5"];
    for entry in std::fs::read_dir(&a.src)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        let weights = WEIGHTS.iter().any(|x| name.ends_with(x));
        if entry.file_type()?.is_file() && !weights && name != "config.json" && name != "model.safetensors.index.json" {
            std::fs::copy(entry.path(), a.dst.join(&name))?;
        }
    }
    let quantised = plan.iter().filter(|p| p.fp8).count();
    println!(
        "wrote {}: {} tensors, {quantised} of them FP8, {} (from {})",
        a.dst.display(),
        plan.len(),
        human_bytes(written as u64),
        human_bytes(std::fs::metadata(a.src.join("model.safetensors")).map(|m| m.len()).unwrap_or(0))
    );
    if !a.no_probe {
        probe(&a.src, &a.dst)?;
    }
    Ok(())
}

/// One tensor of the converted checkpoint: FP8 (its codes, then its scales) or as stored.
struct Entry {
    name: String,
    /// Its shape (`[rows, cols]` when FP8).
    shape: Vec<usize>,
    fp8: bool,
    /// Where its values are: a source tensor (name and shape) and the offset into it. A fused
    /// expert tensor gives one matrix per expert.
    src: String,
    src_shape: Vec<usize>,
    offset: usize,
}

impl Entry {
    /// The entries a source tensor becomes: a projection Qwen's releases quantise becomes FP8;
    /// Qwen3.5-MoE's fused experts (`mlp.experts.gate_up_proj` `[E, 2I, H]`, gate rows then up,
    /// and `mlp.experts.down_proj` `[E, H, I]`) become one FP8 matrix per expert and projection,
    /// named as Qwen's FP8 MoE releases name them (`mlp.experts.{e}.gate_proj.weight`, …),
    /// which the loader reads as it reads Qwen3-Next's; everything else is kept as stored.
    fn for_tensor(name: String, shape: Vec<usize>) -> Vec<Entry> {
        let one = |out: String, sh: Vec<usize>, offset: usize, fp8: bool| Entry {
            name: out,
            shape: sh,
            fp8,
            src: name.clone(),
            src_shape: shape.clone(),
            offset,
        };
        if let [e, rows, cols] = shape[..] {
            if let Some(prefix) = name.strip_suffix(".gate_up_proj").filter(|p| p.ends_with("experts")) {
                let inter = rows / 2;
                return (0..e)
                    .flat_map(|x| {
                        let at = x * rows * cols;
                        [
                            one(format!("{prefix}.{x}.gate_proj.weight"), vec![inter, cols], at, true),
                            one(format!("{prefix}.{x}.up_proj.weight"), vec![inter, cols], at + inter * cols, true),
                        ]
                    })
                    .collect();
            }
            if let Some(prefix) = name.strip_suffix(".down_proj").filter(|p| p.ends_with("experts")) {
                return (0..e)
                    .map(|x| one(format!("{prefix}.{x}.down_proj.weight"), vec![rows, cols], x * rows * cols, true))
                    .collect();
            }
        }
        let fp8 = fp8::quantised_in_fp8(&name, &shape);
        vec![one(name.clone(), shape.clone(), 0, fp8)]
    }
}

/// Writes the tensors of `plan` into one safetensors file: the header first, then each tensor
/// as it is converted (a model never has to fit in memory twice). Returns the file's size.
fn write(store: &WeightStore, plan: &[Entry], path: &Path) -> anyhow::Result<usize> {
    let mut layout = Layout::new("deltascope quantize --fp8");
    let mut loaded = vec![];
    for e in plan {
        let n = e.shape.iter().product::<usize>();
        if e.fp8 {
            let grid = vec![e.shape[0].div_ceil(fp8::BLOCK), e.shape[1].div_ceil(fp8::BLOCK)];
            let g = grid[0] * grid[1];
            layout.place(e.name.clone(), "F8_E4M3", e.shape.clone(), n);
            layout.place(format!("{}_scale_inv", e.name), "BF16", grid, g * 2);
        } else {
            // Stored as it is: its dtype is known only by loading it (a view: no copy).
            let w = store.load_weights(&e.name, &e.shape)?;
            let tag = match &w {
                Weights::F32(_) => "F32",
                Weights::Bf16(_) => "BF16",
                Weights::F16(_) => "F16",
                Weights::Fp8(_) => anyhow::bail!("{}: already FP8", e.name),
            };
            layout.place(e.name.clone(), tag, e.shape.clone(), w.bytes());
            loaded.push(w);
        }
    }
    let mut w = layout.create(path)?;
    let mut kept = loaded.into_iter();
    // The source tensor of the last FP8 entry (a view of the mapped file): a fused expert
    // tensor is read once for all its experts.
    let mut source: Option<(String, Weights)> = None;
    for e in plan {
        if e.fp8 {
            if source.as_ref().is_none_or(|(n, _)| *n != e.src) {
                source = Some((e.src.clone(), store.load_weights(&e.src, &e.src_shape)?));
            }
            let Some((_, src)) = &source else { anyhow::bail!("{}: lost while writing", e.src) };
            let mut values = vec![0f32; e.shape[0] * e.shape[1]];
            src.widen_to(e.offset, &mut values);
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                anyhow::bail!(
                    "{}: value {} is {} (not quantised; nothing usable was written)",
                    e.src,
                    e.offset + i,
                    values[i]
                );
            }
            let (codes, scales) = fp8::quantize_par(&values, e.shape[0], e.shape[1]);
            w.write(&codes)?;
            w.write(&scales.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>())?;
        } else {
            let Some(t) = kept.next() else { anyhow::bail!("{}: lost while writing", e.name) };
            // A million values at a time (a 27B's embedding is 2.5 GB: never a second copy).
            const STEP: usize = 1 << 20;
            match t {
                Weights::F32(v) => {
                    for c in v.chunks(STEP) {
                        w.write(&c.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
                    }
                }
                Weights::Bf16(v) | Weights::F16(v) => {
                    for c in v.chunks(STEP) {
                        w.write(&c.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())?;
                    }
                }
                Weights::Fp8(_) => anyhow::bail!("{}: already FP8", e.name),
            }
        }
    }
    w.finish()
}

/// Both models at f32 over the probe set: per position, the largest logit change, the RMS
/// change against the logits' RMS, whether the top token stays, and KL(source ‖ FP8).
fn probe(src: &Path, dst: &Path) -> anyhow::Result<()> {
    let spec = common::local_spec(Some(src), "f32")?;
    let loaded = crate::backend::local::Loaded::load(&spec, &|_| {})?;
    let fp8_model = Model::load(
        &ModelSource::Dir(dst.to_path_buf()),
        &LoadOptions { precision: Precision::F32, skip_mtp: true, ..LoadOptions::default() },
    )?;
    let (mut positions, mut top_same, mut max_abs, mut kl_sum) = (0usize, 0usize, 0f32, 0f64);
    let (mut d2, mut l2) = (0f64, 0f64);
    for text in PROBES {
        let request = ChatRequest {
            prompt: crate::backend::Prompt::Text(text.to_string()),
            params: GenerationParams { thinking: Thinking::Unlimited, ..Default::default() },
        };
        let (_, ids) = loaded.render(&request)?;
        let all = ForwardOptions { logits: LogitsRows::All, ..Default::default() };
        let a = loaded.model().forward(&ids, &mut loaded.model().new_state(), all)?.logits;
        let b = fp8_model.forward(&ids, &mut fp8_model.new_state(), all)?.logits;
        for r in 0..a.rows {
            let (x, y) = (a.row(r), b.row(r));
            let argmax =
                |v: &[f32]| v.iter().enumerate().fold((0, f32::MIN), |m, (i, &v)| if v > m.1 { (i, v) } else { m }).0;
            top_same += (argmax(x) == argmax(y)) as usize;
            for (p, q) in x.iter().zip(y) {
                max_abs = max_abs.max((p - q).abs());
                d2 += ((p - q) as f64).powi(2);
                l2 += (*p as f64).powi(2);
            }
            kl_sum += kl(x, y);
            positions += 1;
        }
    }
    println!(
        "logits at f32 over {positions} positions of {} probe prompts (source against FP8):\n  top-1 token the same at {top_same} of {positions} ({:.1} %)\n  largest change {max_abs:.4}; RMS change {:.2} % of the logits' RMS\n  mean KL(source ‖ FP8) {:.2e} nats",
        PROBES.len(),
        100.0 * top_same as f64 / positions.max(1) as f64,
        100.0 * (d2 / l2.max(f64::MIN_POSITIVE)).sqrt(),
        kl_sum / positions.max(1) as f64
    );
    Ok(())
}

fn kl(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let log_softmax = |v: &[f32]| {
        let m = v.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
        let z = v.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
        v.iter().map(|&x| x as f64 - z).collect::<Vec<f64>>()
    };
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    lp.par_iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}
