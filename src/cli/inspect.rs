//! `deltascope inspect`: what a checkpoint is and what it will cost, from `config.json` alone
//! (weights are only looked at, header-only, when present).
//! A developer tool (architecture.json): it reads the model's configuration, weights and device
//! plan directly.

use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use serde::Serialize;

// A developer tool (architecture.json): it reads config, weights and the memory plan directly.
use super::common::local_spec;
use super::report::{Report, emit};
use deltascope_model::cpu::CpuKernel;
use deltascope_model::cuda;
use deltascope_model::human_bytes;
use deltascope_model::placement::{DeviceBudget, DevicePlan, DeviceShare, PlanInputs, plan_devices, plan_fewest};
use deltascope_model::placement::{fp8_weight_bytes, memory_plan};
use deltascope_model::{DeviceSpec, ModelConfig, missing_mtp_tensors, read_config};
use deltascope_model::{Family, LayerKind, MlpKind};
use deltascope_model::{ModelSource, WeightStore};
use deltascope_model::{SUSPICIOUS_ABS, TensorHealth, scan_weights};

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A model directory, a config.json file, a GGUF file (what its header holds: the quant mix),
    /// or `demo` (the default).
    #[arg(long, value_name = "DIR|FILE|demo")]
    pub model: Option<PathBuf>,
    /// Print the plan as JSON.
    #[arg(long)]
    pub json: bool,
    /// Read every tensor and report NaN, ±Inf and out-of-range values by tensor name (exit 1
    /// when any tensor holds a non-finite value).
    #[arg(long)]
    pub verify_weights: bool,
    /// Plan the model on these GPUs (their free memory now): `cuda`, `cuda:0`, `cuda:0,1`.
    #[arg(long, value_name = "cuda|cuda:N[,M]", value_parser = device_spec, conflicts_with = "plan_devices")]
    pub device: Option<DeviceSpec>,
    /// Plan the model on devices of these sizes, without GPUs: `48GiB,48GiB`.
    #[arg(long, value_name = "SIZE[,SIZE…]", value_parser = byte_sizes)]
    pub plan_devices: Option<ByteSizes>,
    /// Tokens of KV cache the device plan reserves (default: the model's whole context).
    #[arg(long, value_name = "TOKENS")]
    pub plan_context: Option<u64>,
    /// Refuse a config.json key deltascope does not know (by default: a warning).
    #[arg(long)]
    pub strict_config: bool,
}

fn device_spec(s: &str) -> Result<DeviceSpec, String> {
    DeviceSpec::parse(s).map_err(|e| e.to_string())
}

/// Device sizes in bytes (one flag value, comma-separated).
#[derive(Debug, Clone)]
pub struct ByteSizes(pub Vec<u64>);

/// `48GiB,48GiB` → bytes. Units: B, KB/MB/GB/TB (powers of 1000), KiB/MiB/GiB/TiB (of 1024).
fn byte_sizes(s: &str) -> Result<ByteSizes, String> {
    s.split(',').map(|part| byte_size(part.trim())).collect::<Result<_, _>>().map(ByteSizes)
}

fn byte_size(s: &str) -> Result<u64, String> {
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("{s:?}: expected a size such as 48GiB or 80GB"))?;
    let scale: f64 = match unit.trim() {
        "" | "B" => 1.0,
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        u => return Err(format!("{s:?}: unknown unit {u:?} (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)")),
    };
    if n <= 0.0 || !n.is_finite() {
        return Err(format!("{s:?}: a device size must be positive"));
    }
    Ok((n * scale) as u64)
}

/// The devices to plan on: sizes given, or the GPUs named (an error, in one line, without one).
fn plan_budgets(a: &InspectArgs) -> anyhow::Result<Option<(Vec<DeviceBudget>, bool)>> {
    if let Some(ByteSizes(sizes)) = &a.plan_devices {
        let budgets = sizes
            .iter()
            .enumerate()
            .map(|(i, &b)| DeviceBudget { label: format!("device {i}"), free_bytes: b })
            .collect();
        return Ok(Some((budgets, false)));
    }
    let Some(spec) = &a.device else { return Ok(None) };
    let wanted = match spec {
        DeviceSpec::Cuda(w) => w.clone(),
        // The emulated devices offer what DELTASCOPE_EMU_MEMORY says (host memory, as used).
        DeviceSpec::Emu(ordinals) => {
            let free_bytes = cuda::emu::capacity()?;
            let budgets =
                ordinals.iter().map(|o| DeviceBudget { label: format!("emu:{o} (emulated)"), free_bytes }).collect();
            return Ok(Some((budgets, false)));
        }
        other => anyhow::bail!(
            "--device {other}: inspect plans GPUs (cuda, cuda:0, cuda:0,1) or emulated devices (emu:0,1); for sizes without a GPU use --plan-devices"
        ),
    };
    let report = cuda::probe().map_err(|no| anyhow::anyhow!("--device {spec}: {no}"))?;
    let budgets = report
        .budgets(wanted.as_deref())
        .map_err(|e| anyhow::anyhow!("--device {spec}: {e}"))?
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    // `cuda` alone: the fewest GPUs that hold it.
    Ok(Some((budgets, wanted.is_none())))
}

/// How the layers are spread: one device, or the layers where the hidden state moves on.
fn split_summary(plan: &DevicePlan) -> String {
    let bounds = plan.boundaries();
    if bounds.is_empty() {
        return "one device, no split".to_string();
    }
    let at: Vec<String> = bounds.iter().map(usize::to_string).collect();
    format!(
        "layer split at layer {} (one hidden-state copy of {} per token at each)",
        at.join(", "),
        human_bytes(plan.boundary_bytes_per_token)
    )
}

/// What one device holds, in words: its layers, and the embedding, head and MTP layer if there.
fn holdings(d: &DeviceShare) -> String {
    let mut holds = vec![];
    if !d.layers.is_empty() {
        holds.push(format!(
            "layers {}–{} ({} GDN + {} attention)",
            d.layers.start,
            d.layers.end - 1,
            d.gdn_layers,
            d.attention_layers
        ));
    }
    if d.embedding {
        holds.push("embedding".into());
    }
    if d.head {
        holds.push("final norm + LM head".into());
    }
    if d.mtp {
        holds.push("MTP layer".into());
    }
    holds.join(", ")
}

/// One device's two lines: what it holds, then what that costs against its free memory.
fn write_device(w: &mut dyn Write, d: &DeviceShare) -> io::Result<()> {
    let headroom = if d.headroom_bytes >= 0 {
        format!("headroom {}", human_bytes(d.headroom_bytes as u64))
    } else {
        format!("SHORT by {}", human_bytes(d.headroom_bytes.unsigned_abs()))
    };
    writeln!(w, "  {} ({} free): {}", d.label, human_bytes(d.free_bytes), holdings(d))?;
    writeln!(
        w,
        "    weights {} · KV {} / token = {} · recurrent {} · MTP slots {} · workspace {} · total {} · {headroom}",
        human_bytes(d.weights_bytes),
        human_bytes(d.kv_bytes_per_token),
        human_bytes(d.kv_bytes),
        human_bytes(d.recurrent_bytes),
        human_bytes(d.mtp_slot_bytes),
        human_bytes(d.workspace_bytes),
        human_bytes(d.total_bytes)
    )
}

fn write_plan(w: &mut dyn Write, plan: &DevicePlan) -> io::Result<()> {
    let used = plan.used().count();
    writeln!(
        w,
        "device plan  {} device{}, {}; KV for {} tokens, MTP depth {}, prefill passes of {} tokens",
        used,
        if used == 1 { "" } else { "s" },
        split_summary(plan),
        plan.inputs.context_tokens,
        plan.inputs.mtp_depth,
        plan.inputs.prefill_chunk
    )?;
    for d in &plan.devices {
        write_device(w, d)?;
    }
    if plan.fits {
        writeln!(w, "fits         yes")?;
    } else {
        writeln!(w, "fits         NO: lower --plan-context, or plan on more or larger devices")?;
    }
    if !plan.boundaries().is_empty() {
        writeln!(
            w,
            "note         a layer split buys capacity, not batch-1 speed: the devices take turns on every token"
        )?;
    }
    Ok(())
}

fn family_name(f: Family) -> &'static str {
    match f {
        Family::Qwen35 => "Qwen3.5 / Qwen3.6 dense",
        Family::Qwen35Moe => "Qwen3.5 / Qwen3.6 MoE",
        Family::Qwen3Next => "Qwen3-Next",
    }
}

fn gb(b: u64) -> String {
    if b >= 1_000_000_000 { format!("{:.2} GB ({})", b as f64 / 1e9, human_bytes(b)) } else { human_bytes(b) }
}

/// A count in words ("26.90 billion"), so that it cannot be read as bytes.
fn count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000_000 => format!("{:.2} trillion", n as f64 / 1e12),
        n if n >= 1_000_000_000 => format!("{:.2} billion", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} million", n as f64 / 1e6),
        n if n >= 1_000 => format!("{:.1} thousand", n as f64 / 1e3),
        n => n.to_string(),
    }
}

/// Digits in groups of three: 26,895,998,464.
fn grouped(n: u64) -> String {
    let d = n.to_string();
    let mut out = String::new();
    for (i, c) in d.chars().enumerate() {
        if i > 0 && (d.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Values the checkpoint stores for the language model (its layers, embeddings and head; not
/// the vision tower or the MTP head), to hold against what config.json describes.
fn stored_lm_values(store: &WeightStore) -> u64 {
    store
        .names()
        .filter(|n| {
            (n.starts_with("model.") && !n.starts_with("model.visual.") && !n.starts_with("mtp."))
                || *n == "lm_head.weight"
        })
        .filter_map(|n| store.shape(n))
        .map(|s| s.iter().product::<usize>() as u64)
        .sum()
}

/// Warnings where config.json and the weights beside it disagree.
fn mismatches(cfg: &ModelConfig, store: &WeightStore, described: u64) -> Vec<String> {
    let mut out = vec![];
    let stored = stored_lm_values(store);
    let ratio = stored as f64 / described.max(1) as f64;
    if !(0.9..=1.1).contains(&ratio) {
        out.push(format!(
            "config.json describes {} parameters ({}) but the checkpoint stores {} ({}) for the language model: the config does not belong to these weights",
            count(described),
            grouped(described),
            count(stored),
            grouped(stored)
        ));
    }
    let embed = ["model.language_model.embed_tokens.weight", "model.embed_tokens.weight"]
        .into_iter()
        .find_map(|n| store.shape(n).map(|s| (n, s.to_vec())));
    if let Some((name, shape)) = embed
        && shape != [cfg.vocab_size, cfg.hidden_size]
    {
        out.push(format!(
            "{name} is {shape:?}, config.json says [vocab_size, hidden_size] = [{}, {}]",
            cfg.vocab_size, cfg.hidden_size
        ));
    }
    out
}

/// What `inspect` found: config.json, the memory plans it implies, what the weights beside it
/// hold, and the device plan when one was asked for. The fields in order are the JSON's keys.
/// `Plan` is the model crate's memory plan, serialised as it is (the crate does not export the
/// type by name).
#[derive(Serialize)]
struct InspectReport<Plan> {
    /// The plan on `--device` / `--plan-devices` (null without either).
    device_plan: Option<DevicePlan>,
    config: ModelConfig,
    /// bf16 checkpoints; KV and conv state in bf16; SSM state f32 (mamba_ssm_dtype, as servers
    /// keep it).
    plan_bf16: Plan,
    plan_cpu_f32: Plan,
    weights_found: bool,
    stored_bytes: Option<usize>,
    stored_dtypes: Option<Vec<String>>,
    mtp_tensors: Option<usize>,
    mtp_missing: Vec<String>,
    /// Where config.json and the weights beside it disagree.
    warnings: Vec<String>,
    /// The config.json keys deltascope does not know.
    config_warnings: Vec<String>,
    /// The CPU kernel family the engine would run this model with (the best this CPU has, or
    /// the family DELTASCOPE_CPU_KERNEL forces).
    cpu_kernel: &'static str,
    /// The same kernels as the text describes them.
    #[serde(skip)]
    cpu_kernel_described: String,
    /// The figures of `plan_bf16` and `plan_cpu_f32` that the text shows.
    #[serde(skip)]
    sizes: Sizes,
}

/// What the text shows of the two memory plans, read from them when the report is collected.
struct Sizes {
    params_total: u64,
    params_active: u64,
    params_mtp: u64,
    /// Parameters stored as e4m3 in an FP8 checkpoint.
    fp8_projections: u64,
    /// The weights as FP8: those projections with their block scales, the rest bf16.
    fp8_weights_bytes: u64,
    bf16_weights_bytes: u64,
    f32_weights_bytes: u64,
    mtp_weights_bytes: u64,
    kv_bytes_per_token: u64,
    recurrent_bytes_per_sequence: u64,
    conv_state_bytes_per_layer: u64,
    ssm_state_bytes_per_layer: u64,
}

/// The report on `cfg` and the weights beside it (`None`: config.json alone).
fn inspect_report(
    cfg: ModelConfig,
    weights: Option<&WeightStore>,
    device_plan: Option<DevicePlan>,
    config_warnings: Vec<String>,
) -> InspectReport<impl Serialize> {
    let plan = memory_plan(&cfg, 2, 2, 4);
    let cpu = memory_plan(&cfg, 4, 4, 4);
    let sizes = Sizes {
        params_total: plan.params.total,
        params_active: plan.params.active,
        params_mtp: plan.params.mtp,
        fp8_projections: plan.params.fp8_projections,
        fp8_weights_bytes: fp8_weight_bytes(&plan.params, 2),
        bf16_weights_bytes: plan.weights_bytes,
        f32_weights_bytes: cpu.weights_bytes,
        mtp_weights_bytes: plan.mtp_weights_bytes,
        kv_bytes_per_token: plan.kv_bytes_per_token,
        recurrent_bytes_per_sequence: plan.recurrent_bytes_per_sequence,
        conv_state_bytes_per_layer: plan.conv_state_bytes_per_layer,
        ssm_state_bytes_per_layer: plan.ssm_state_bytes_per_layer,
    };
    let mtp_missing = weights.map(|w| missing_mtp_tensors(w, &cfg)).unwrap_or_default();
    let warnings = weights.map(|w| mismatches(&cfg, w, plan.params.total)).unwrap_or_default();
    InspectReport {
        device_plan,
        config: cfg,
        plan_bf16: plan,
        plan_cpu_f32: cpu,
        weights_found: weights.is_some(),
        stored_bytes: weights.map(WeightStore::stored_bytes),
        stored_dtypes: weights.map(WeightStore::dtype_names),
        mtp_tensors: weights.map(|w| w.names().filter(|n| n.starts_with("mtp.")).count()),
        mtp_missing,
        warnings,
        config_warnings,
        cpu_kernel: CpuKernel::active().name(),
        cpu_kernel_described: CpuKernel::describe_active(),
        sizes,
    }
}

impl<Plan: Serialize> Report for InspectReport<Plan> {
    fn print_human(&self, w: &mut dyn Write) -> io::Result<()> {
        write_layout(w, &self.config)?;
        write_mixers(w, &self.config)?;
        self.write_weights(w)?;
        self.write_state(w)?;
        self.write_mtp(w)?;
        writeln!(w, "CPU kernels  {}", self.cpu_kernel_described)?;
        if let Some(plan) = &self.device_plan {
            write_plan(w, plan)?;
        }
        Ok(())
    }
}

/// The layer map, four layers a group: G = GDN, A = attention, lower case for an MoE block.
fn layer_map(cfg: &ModelConfig) -> String {
    let groups: Vec<String> = cfg
        .layer_types
        .chunks(4)
        .zip(cfg.mlp_kinds.chunks(4))
        .map(|(ls, ms)| {
            ls.iter()
                .zip(ms)
                .map(|(l, m)| {
                    let c = if *l == LayerKind::LinearAttention { 'G' } else { 'A' };
                    if *m == MlpKind::Moe { c.to_ascii_lowercase() } else { c }
                })
                .collect()
        })
        .collect();
    groups.join(" ")
}

/// Which layers have an MoE block and which a dense MLP.
fn feed_forward(cfg: &ModelConfig) -> String {
    let moe_layers = cfg.mlp_kinds.iter().filter(|k| **k == MlpKind::Moe).count();
    match (moe_layers, cfg.num_hidden_layers - moe_layers) {
        (0, _) => "dense MLP".to_string(),
        (m, 0) => format!("MoE in all {m} layers"),
        (m, d) => format!("MoE in {m} layers, dense MLP in {d}"),
    }
}

/// The architecture, the layer stack and the model's widths.
fn write_layout(w: &mut dyn Write, cfg: &ModelConfig) -> io::Result<()> {
    let arch = cfg.architectures.first().cloned().unwrap_or_else(|| "?".into());
    let mt =
        if cfg.nested { format!("{} → {}", cfg.model_type, cfg.text_model_type) } else { cfg.model_type.clone() };
    writeln!(w, "model        {arch} ({mt}; {})", family_name(cfg.family))?;
    writeln!(
        w,
        "layers       {}: {} GDN + {} full attention; {}",
        cfg.num_hidden_layers,
        cfg.num_linear_layers(),
        cfg.num_full_layers(),
        feed_forward(cfg)
    )?;
    writeln!(w, "layer map    {}   (G = GDN, A = attention; lower case = MoE feed-forward)", layer_map(cfg))?;
    writeln!(
        w,
        "hidden       {} · vocab {} · context {} · tied embeddings: {}",
        cfg.hidden_size, cfg.vocab_size, cfg.max_position_embeddings, cfg.tie_word_embeddings
    )
}

/// The token mixers (attention, GDN) and the feed-forward blocks (MoE, dense MLP).
fn write_mixers(w: &mut dyn Write, cfg: &ModelConfig) -> io::Result<()> {
    writeln!(
        w,
        "attention    {} Q / {} KV heads × {} (GQA {}), output gate, RoPE on {} of {} dims (θ = {})",
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.gqa_groups(),
        cfg.rope.rotary_dim,
        cfg.head_dim,
        cfg.rope.theta
    )?;
    let l = &cfg.linear;
    writeln!(
        w,
        "GDN          {} QK / {} V heads × {}/{} (ratio {}), conv kernel {}, conv channels {}",
        l.num_key_heads,
        l.num_value_heads,
        l.key_head_dim,
        l.value_head_dim,
        l.head_ratio(),
        l.conv_kernel,
        l.conv_dim()
    )?;
    if let Some(m) = &cfg.moe {
        writeln!(
            w,
            "MoE          {} experts, top {} ({}), expert width {}, shared expert {}",
            m.num_experts,
            m.num_experts_per_tok,
            if m.norm_topk_prob { "renormalised" } else { "not renormalised" },
            m.moe_intermediate_size,
            m.shared_expert_intermediate_size
        )?;
    }
    if let Some(i) = cfg.intermediate_size.filter(|_| cfg.mlp_kinds.contains(&MlpKind::Dense)) {
        writeln!(w, "MLP          intermediate {i}")?;
    }
    Ok(())
}

impl<Plan> InspectReport<Plan> {
    /// Parameters, the weights' size in memory, and what the checkpoint stores.
    fn write_weights(&self, w: &mut dyn Write) -> io::Result<()> {
        let (cfg, s) = (&self.config, &self.sizes);
        let active =
            if cfg.moe.is_some() { format!(" · {} active per token", count(s.params_active)) } else { String::new() };
        writeln!(w, "parameters   {} ({}) language model{active}", count(s.params_total), grouped(s.params_total))?;
        if cfg.quantization.is_some() {
            writeln!(
                w,
                "weights      {} as FP8 ({} of the parameters e4m3, the rest bf16) · {} as bf16 (deltascope reads the matrices in place from the mapped checkpoint, FP8 as FP8)",
                gb(s.fp8_weights_bytes),
                count(s.fp8_projections),
                gb(s.bf16_weights_bytes)
            )?;
        } else {
            writeln!(
                w,
                "weights      {} as bf16 · {} as f32 (deltascope reads the matrices in place from the mapped checkpoint, in its dtype)",
                gb(s.bf16_weights_bytes),
                gb(s.f32_weights_bytes)
            )?;
        }
        if let (Some(bytes), Some(dtypes)) = (self.stored_bytes, &self.stored_dtypes) {
            writeln!(w, "checkpoint   {} stored ({})", gb(bytes as u64), dtypes.join(", "))?;
        }
        if let Some(q) = &cfg.quantization {
            writeln!(
                w,
                "quantised    FP8 e4m3 with a scale per 128 × 128 block (quantization_config): those matrices stay 1 byte a weight in memory, dequantised in the kernels; {} modules listed as unconverted",
                q.modules_to_not_convert.len()
            )?;
        }
        Ok(())
    }

    /// The state a sequence holds: KV cache per token (and at a few contexts), recurrent state.
    fn write_state(&self, w: &mut dyn Write) -> io::Result<()> {
        let (cfg, s) = (&self.config, &self.sizes);
        let kv = s.kv_bytes_per_token;
        let at = |n: u64| human_bytes(kv * n);
        writeln!(
            w,
            "KV cache     {} / token in bf16 ({} layers × K,V × {} × {}): 4k {} · 32k {} · 128k {} · {} {}",
            human_bytes(kv),
            cfg.num_full_layers(),
            cfg.num_key_value_heads,
            cfg.head_dim,
            at(4096),
            at(32768),
            at(131072),
            cfg.max_position_embeddings,
            at(cfg.max_position_embeddings as u64)
        )?;
        writeln!(
            w,
            "recurrent    {} / sequence, constant in context ({} GDN layers × (conv {} B bf16 + SSM {} B f32))",
            human_bytes(s.recurrent_bytes_per_sequence),
            cfg.num_linear_layers(),
            s.conv_state_bytes_per_layer,
            s.ssm_state_bytes_per_layer
        )
    }

    /// Whether the MTP head is there, as config.json declares it and the checkpoint holds it.
    fn mtp_status(&self) -> String {
        let missing = &self.mtp_missing;
        match (self.mtp_tensors, self.config.mtp_num_hidden_layers) {
            (Some(n), _) if n > 0 && !missing.is_empty() => format!(
                "INCOMPLETE: {n} mtp.* tensors, but not {} ({} missing in all): loading the model fails until they are there",
                missing.iter().take(3).map(String::as_str).collect::<Vec<_>>().join(", "),
                missing.len()
            ),
            (Some(n), _) if n > 0 => format!("present: {n} mtp.* tensors in the checkpoint"),
            (Some(_), 0) => "absent".to_string(),
            (Some(_), k) => format!("config declares {k} layer(s), but the checkpoint has no mtp.* tensors"),
            (None, 0) => "none declared (weights not present to check)".to_string(),
            (None, k) => format!("declared: {k} layer(s) (weights not present to check)"),
        }
    }

    /// The MTP line, the warnings, then what the MTP head costs when there is one.
    fn write_mtp(&self, w: &mut dyn Write) -> io::Result<()> {
        let (cfg, s) = (&self.config, &self.sizes);
        writeln!(w, "MTP          {}", self.mtp_status())?;
        for warning in self.warnings.iter().chain(&self.config_warnings) {
            writeln!(w, "warning      {warning}")?;
        }
        if cfg.mtp_num_hidden_layers > 0 || self.mtp_tensors.unwrap_or(0) > 0 {
            let mtp_kv = s.kv_bytes_per_token / cfg.num_full_layers().max(1) as u64;
            writeln!(
                w,
                "MTP cost     {} params · {} bf16 · KV +{} / token",
                count(s.params_mtp),
                gb(s.mtp_weights_bytes),
                human_bytes(mtp_kv)
            )?;
        }
        Ok(())
    }
}

/// config.json, the source beside it (`None` for a config file given on its own, which plans
/// without weights), and how to name the file in messages.
fn read_model_config(model: Option<&Path>) -> anyhow::Result<(ModelConfig, Option<ModelSource>, String)> {
    match model {
        Some(file) if file.is_file() => {
            let text =
                std::fs::read_to_string(file).map_err(|e| anyhow::anyhow!("cannot read {}: {e}", file.display()))?;
            Ok((ModelConfig::from_json_str(&text, &file.display().to_string())?, None, file.display().to_string()))
        }
        m => {
            let source = local_spec(m, "f32")?.source;
            let label = source.file_label("config.json");
            Ok((read_config(&source)?, Some(source), label))
        }
    }
}

/// The weights beside config.json, header only, when the source holds any.
fn open_weights(source: Option<&ModelSource>, cfg: &ModelConfig) -> anyhow::Result<Option<WeightStore>> {
    match source {
        Some(s) if s.present("model.safetensors") || s.present("model.safetensors.index.json") => {
            let mut store = WeightStore::open(s)?;
            store.expect_fp8(cfg.quantization.clone());
            Ok(Some(store))
        }
        _ => Ok(None),
    }
}

/// The plan on `--device` or `--plan-devices`, for `--plan-context` tokens; `None` without either.
fn device_plan(a: &InspectArgs, cfg: &ModelConfig) -> anyhow::Result<Option<DevicePlan>> {
    let Some((budgets, fewest)) = plan_budgets(a)? else { return Ok(None) };
    let mut inputs = PlanInputs::for_model(cfg);
    if let Some(t) = a.plan_context {
        inputs.context_tokens = t;
    }
    Ok(Some(if fewest { plan_fewest(cfg, &budgets, inputs) } else { plan_devices(cfg, &budgets, inputs) }))
}

pub fn run(a: InspectArgs) -> anyhow::Result<()> {
    // A GGUF file: what its header says (the quant mix, the file type).
    // A GGUF file, a part of a split set or a folder of them: what the headers say (the
    // quant mix, the file type).
    let gguf = |p: &&std::path::Path| {
        deltascope_model::gguf::is_gguf(p) || p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    };
    if let Some(path) = a.model.as_deref().filter(gguf) {
        return super::inspect_gguf::run(path, a.json);
    }
    let (cfg, source, config_file) = read_model_config(a.model.as_deref())?;
    if a.strict_config {
        cfg.refuse_unknown_keys(&config_file)?;
    }
    let config_warnings = cfg.unknown_key_warnings(&config_file);
    let weights = open_weights(source.as_ref(), &cfg)?;
    if a.verify_weights {
        let Some(store) = &weights else {
            anyhow::bail!(
                "--verify-weights needs the weights: {} holds no model.safetensors (or index)",
                a.model.as_ref().map_or("the model".to_string(), |m| m.display().to_string())
            );
        };
        return verify_weights(store, a.json);
    }
    let device_plan = device_plan(&a, &cfg)?;
    emit(&inspect_report(cfg, weights.as_ref(), device_plan, config_warnings), a.json)
}

/// `inspect --verify-weights`: every tensor read and checked; the unhealthy ones named.
#[derive(Serialize)]
struct WeightHealthReport {
    tensors: usize,
    /// The tensors holding NaN, ±Inf or values beyond `suspicious_abs`.
    #[serde(serialize_with = "widened")]
    unhealthy: Vec<TensorHealth>,
    suspicious_abs: f64,
    /// Values read over all the tensors (the text counts them; the JSON never has).
    #[serde(skip)]
    values: u64,
}

impl WeightHealthReport {
    /// Reads every tensor of `store`.
    fn scan(store: &WeightStore) -> anyhow::Result<WeightHealthReport> {
        let all = scan_weights(store)?;
        let tensors = all.len();
        let values = all.iter().map(|h| h.elements).sum::<usize>() as u64;
        let unhealthy = all.into_iter().filter(|h| !h.is_healthy()).collect();
        Ok(WeightHealthReport { tensors, unhealthy, suspicious_abs: f64::from(SUSPICIOUS_ABS), values })
    }

    /// Tensors with a NaN or ±Inf (the others among the unhealthy are only out of range).
    fn nonfinite(&self) -> usize {
        self.unhealthy.iter().filter(|h| h.nonfinite() > 0).count()
    }
}

impl Report for WeightHealthReport {
    fn print_human(&self, w: &mut dyn Write) -> io::Result<()> {
        writeln!(w, "checked {} tensors ({} values)", self.tensors, count(self.values))?;
        for h in &self.unhealthy {
            let mut parts = vec![];
            for (n, what) in [(h.nan, "NaN"), (h.pos_inf, "+Inf"), (h.neg_inf, "-Inf")] {
                if n > 0 {
                    parts.push(format!("{n} {what}"));
                }
            }
            if h.out_of_range > 0 {
                parts.push(format!("{} with |x| > {:e} (max {:e})", h.out_of_range, self.suspicious_abs, h.max_abs));
            }
            writeln!(w, "  {}: {} of {} values", h.name, parts.join(", "), h.elements)?;
        }
        if self.unhealthy.is_empty() {
            writeln!(w, "all finite, none beyond |x| = {:e}", self.suspicious_abs)?;
        }
        Ok(())
    }
}

/// Serialises `value` as it went through `serde_json::Value` before, an f32 inside widened to
/// f64 (`max_abs` 0.1 as 0.10000000149011612), so the JSON stays byte for byte what it was.
fn widened<T: Serialize, S: serde::Serializer>(value: &T, s: S) -> Result<S::Ok, S::Error> {
    serde_json::to_value(value).map_err(serde::ser::Error::custom)?.serialize(s)
}

fn verify_weights(store: &WeightStore, json: bool) -> anyhow::Result<()> {
    let report = WeightHealthReport::scan(store)?;
    emit(&report, json)?;
    let nonfinite = report.nonfinite();
    if nonfinite > 0 {
        anyhow::bail!("{nonfinite} of {} tensors hold NaN or ±Inf (listed above)", report.tensors);
    }
    Ok(())
}
