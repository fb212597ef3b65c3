//! `deltascope quantize --fp8 SRC DST`: a bf16 (or f16 / f32) checkpoint rewritten in Qwen's
//! published FP8 format (the projections as e4m3 with a bf16 scale per 128 × 128 block, the
//! rest as stored), and what that costs: both models' logits over a short probe set, compared
//! position by position, so the user sees the change before using it.
//! A developer tool (tests/architecture.rs lists the exception): it reads the checkpoint's
//! tensors and runs both models' forward passes directly.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use rayon::prelude::*;
use serde::Serialize;

use super::common;
use super::report::{Report, emit};
use super::safetensors_out::{Layout, Out};
use crate::backend::ChatRequest;
use deltascope_protocol::{GenerationParams, Thinking};
// A developer tool (architecture.json): it rewrites the model's tensors and compares logits.
use deltascope_model::WeightStore;
use deltascope_model::Weights;
use deltascope_model::fp8;
use deltascope_model::human_bytes;
use deltascope_model::{
    ForwardOptions, LoadOptions, LogitsRows, Model, ModelConfig, ModelSource, Precision, read_config,
};

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

/// What `quantize --fp8` wrote. (The command has no JSON; the report is what the text reads.)
#[derive(Serialize)]
struct WriteReport {
    dst: PathBuf,
    tensors: usize,
    fp8_tensors: usize,
    bytes: u64,
    /// The source's model.safetensors (0 when it is sharded: no such file).
    source_bytes: u64,
}

impl Report for WriteReport {
    fn print_human(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(
            w,
            "wrote {}: {} tensors, {} of them FP8, {} (from {})",
            self.dst.display(),
            self.tensors,
            self.fp8_tensors,
            human_bytes(self.bytes),
            human_bytes(self.source_bytes)
        )
    }
}

/// Refuses what cannot be converted before anything is written: a checkpoint already
/// quantised, or a destination that holds files.
fn refuse_unconvertible(a: &QuantizeArgs, cfg: &ModelConfig) -> anyhow::Result<()> {
    if cfg.quantization.is_some() {
        anyhow::bail!(
            "{}: already quantised (config.json has a quantization_config); nothing was written",
            a.src.display()
        );
    }
    if a.dst.exists() && std::fs::read_dir(&a.dst).map(|mut d| d.next().is_some()).unwrap_or(true) {
        anyhow::bail!("{}: exists and is not an empty directory (nothing was written)", a.dst.display());
    }
    Ok(())
}

/// The converted checkpoint's tensors, by source name in order.
fn plan_entries(store: &WeightStore) -> Vec<Entry> {
    let mut names: Vec<String> = store.names().map(str::to_string).collect();
    names.sort();
    names
        .into_iter()
        .flat_map(|n| {
            let shape = store.shape(&n).unwrap_or(&[]).to_vec();
            Entry::for_tensor(n, shape)
        })
        .collect()
}

/// config.json as it was, with the quantization_config Qwen's releases carry.
fn write_config(a: &QuantizeArgs, plan: &[Entry], tie_word_embeddings: bool) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(a.src.join("config.json"))?;
    let mut config: serde_json::Value = serde_json::from_str(&text)?;
    let kept = plan.iter().filter(|p| !p.fp8).map(|p| p.name.as_str());
    let unconverted = fp8::unconverted_modules(kept, tie_word_embeddings);
    config["quantization_config"] = fp8::quantization_config(&unconverted);
    std::fs::write(a.dst.join("config.json"), serde_json::to_vec_pretty(&config)?)?;
    Ok(())
}

/// Everything else beside the weights (tokenizer, chat template, generation config), but no
/// other copy of the weights (`.bin`, `.pt`, a GGUF …).
fn copy_companions(src: &Path, dst: &Path) -> anyhow::Result<()> {
    const WEIGHTS: [&str; 7] = [".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5"];
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().to_string();
        let weights = WEIGHTS.iter().any(|x| name.ends_with(x));
        if entry.file_type()?.is_file() && !weights && name != "config.json" && name != "model.safetensors.index.json" {
            std::fs::copy(entry.path(), dst.join(&name))?;
        }
    }
    Ok(())
}

/// Converts the checkpoint and writes it beside its config and companions.
fn convert(a: &QuantizeArgs) -> anyhow::Result<WriteReport> {
    let src = ModelSource::Dir(a.src.clone());
    let cfg = read_config(&src)?;
    refuse_unconvertible(a, &cfg)?;
    let store = WeightStore::open(&src)?;
    let plan = plan_entries(&store);
    std::fs::create_dir_all(&a.dst).map_err(|e| anyhow::anyhow!("{}: cannot create it: {e}", a.dst.display()))?;
    let written = write(&store, &plan, &a.dst.join("model.safetensors"))?;
    drop(store);
    write_config(a, &plan, cfg.tie_word_embeddings)?;
    copy_companions(&a.src, &a.dst)?;
    Ok(WriteReport {
        dst: a.dst.clone(),
        tensors: plan.len(),
        fp8_tensors: plan.iter().filter(|p| p.fp8).count(),
        bytes: written as u64,
        source_bytes: std::fs::metadata(a.src.join("model.safetensors")).map(|m| m.len()).unwrap_or(0),
    })
}

pub fn run(a: QuantizeArgs) -> anyhow::Result<()> {
    // What was written is said before the probe, which loads both models and takes a while.
    emit(&convert(&a)?, false)?;
    if !a.no_probe {
        emit(&probe(&a.src, &a.dst)?, false)?;
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

/// The header: every entry's place, FP8 ones as codes then scales. Tensors kept as stored are
/// loaded (views of the mapped file, no copy) because only their values tell their dtype; they
/// come back in plan order.
fn lay_out(store: &WeightStore, plan: &[Entry]) -> anyhow::Result<(Layout, Vec<Weights>)> {
    let mut layout = Layout::new("deltascope quantize --fp8");
    let mut kept = vec![];
    for e in plan {
        let n = e.shape.iter().product::<usize>();
        if e.fp8 {
            let grid = vec![e.shape[0].div_ceil(fp8::BLOCK), e.shape[1].div_ceil(fp8::BLOCK)];
            let g = grid[0] * grid[1];
            layout.place(e.name.clone(), "F8_E4M3", e.shape.clone(), n);
            layout.place(format!("{}_scale_inv", e.name), "BF16", grid, g * 2);
        } else {
            let w = store.load_weights(&e.name, &e.shape)?;
            let tag = match &w {
                Weights::F32(_) => "F32",
                Weights::Bf16(_) => "BF16",
                Weights::F16(_) => "F16",
                Weights::Fp8(_) => anyhow::bail!("{}: already FP8", e.name),
                Weights::Quant(_) => {
                    anyhow::bail!("{}: a GGUF block-quantised matrix (quantize reads safetensors)", e.name)
                }
            };
            layout.place(e.name.clone(), tag, e.shape.clone(), w.bytes());
            kept.push(w);
        }
    }
    Ok((layout, kept))
}

/// One FP8 entry: its matrix out of `src`, quantised, written as codes then scales.
fn write_fp8(w: &mut Out, e: &Entry, src: &Weights) -> anyhow::Result<()> {
    let mut values = vec![0f32; e.shape[0] * e.shape[1]];
    src.widen_to(e.offset, &mut values);
    if let Some(i) = values.iter().position(|v| !v.is_finite()) {
        anyhow::bail!("{}: value {} is {} (not quantised; nothing usable was written)", e.src, e.offset + i, values[i]);
    }
    let (codes, scales) = fp8::quantize_par(&values, e.shape[0], e.shape[1]);
    w.write(&codes)?;
    w.write(&scales.iter().flat_map(|s| s.to_le_bytes()).collect::<Vec<u8>>())
}

/// A tensor kept as stored, a million values at a time (a 27B's embedding is 2.5 GB: never a
/// second copy).
fn write_as_stored(w: &mut Out, e: &Entry, t: Weights) -> anyhow::Result<()> {
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
        Weights::Quant(_) => anyhow::bail!("{}: a GGUF block-quantised matrix (quantize reads safetensors)", e.name),
    }
    Ok(())
}

/// Writes the tensors of `plan` into one safetensors file: the header first, then each tensor
/// as it is converted (a model never has to fit in memory twice). Returns the file's size.
fn write(store: &WeightStore, plan: &[Entry], path: &Path) -> anyhow::Result<usize> {
    let (layout, kept) = lay_out(store, plan)?;
    let mut w = layout.create(path)?;
    let mut kept = kept.into_iter();
    // The source tensor of the last FP8 entry (a view of the mapped file): a fused expert
    // tensor is read once for all its experts.
    let mut source: Option<(String, Weights)> = None;
    for e in plan {
        if e.fp8 {
            if source.as_ref().is_none_or(|(n, _)| *n != e.src) {
                source = Some((e.src.clone(), store.load_weights(&e.src, &e.src_shape)?));
            }
            let Some((_, src)) = &source else { anyhow::bail!("{}: lost while writing", e.src) };
            write_fp8(&mut w, e, src)?;
        } else {
            let Some(t) = kept.next() else { anyhow::bail!("{}: lost while writing", e.name) };
            write_as_stored(&mut w, e, t)?;
        }
    }
    w.finish()
}

/// What FP8 changes in the logits over the probe set, both models at f32.
#[derive(Serialize)]
struct ProbeReport {
    prompts: usize,
    positions: usize,
    /// Positions where the top token stays.
    top_same: usize,
    /// The largest change of one logit.
    max_abs: f32,
    /// The RMS change against the logits' RMS, in percent.
    rms_change_percent: f64,
    /// Mean KL(source ‖ FP8) per position, in nats.
    mean_kl: f64,
}

impl Report for ProbeReport {
    fn print_human(&self, w: &mut dyn Write) -> io::Result<()> {
        let positions = self.positions;
        writeln!(
            w,
            "logits at f32 over {positions} positions of {} probe prompts (source against FP8):\n  top-1 token the same at {} of {positions} ({:.1} %)\n  largest change {:.4}; RMS change {:.2} % of the logits' RMS\n  mean KL(source ‖ FP8) {:.2e} nats",
            self.prompts,
            self.top_same,
            100.0 * self.top_same as f64 / positions.max(1) as f64,
            self.max_abs,
            self.rms_change_percent,
            self.mean_kl
        )
    }
}

/// The two models' logits compared position by position, summed up.
#[derive(Default)]
struct LogitChange {
    positions: usize,
    top_same: usize,
    max_abs: f32,
    kl_sum: f64,
    /// Σ (source − FP8)² and Σ source² over every logit.
    d2: f64,
    l2: f64,
}

impl LogitChange {
    /// One position: the source's logits `x`, the FP8 model's `y`.
    fn add(&mut self, x: &[f32], y: &[f32]) {
        let argmax =
            |v: &[f32]| v.iter().enumerate().fold((0, f32::MIN), |m, (i, &v)| if v > m.1 { (i, v) } else { m }).0;
        self.top_same += (argmax(x) == argmax(y)) as usize;
        for (p, q) in x.iter().zip(y) {
            self.max_abs = self.max_abs.max((p - q).abs());
            self.d2 += ((p - q) as f64).powi(2);
            self.l2 += (*p as f64).powi(2);
        }
        self.kl_sum += kl(x, y);
        self.positions += 1;
    }

    fn report(&self, prompts: usize) -> ProbeReport {
        ProbeReport {
            prompts,
            positions: self.positions,
            top_same: self.top_same,
            max_abs: self.max_abs,
            rms_change_percent: 100.0 * (self.d2 / self.l2.max(f64::MIN_POSITIVE)).sqrt(),
            mean_kl: self.kl_sum / self.positions.max(1) as f64,
        }
    }
}

/// Both models at f32 over the probe set: per position, the largest logit change, the RMS
/// change against the logits' RMS, whether the top token stays, and KL(source ‖ FP8).
fn probe(src: &Path, dst: &Path) -> anyhow::Result<ProbeReport> {
    let spec = common::local_spec(Some(src), "f32")?;
    let loaded = crate::backend::local::Loaded::load(&spec, &|_| {})?;
    let fp8_model = Model::load(
        &ModelSource::Dir(dst.to_path_buf()),
        &LoadOptions { precision: Precision::F32, skip_mtp: true, ..LoadOptions::default() },
    )?;
    let mut change = LogitChange::default();
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
            change.add(a.row(r), b.row(r));
        }
    }
    Ok(change.report(PROBES.len()))
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
