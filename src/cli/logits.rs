//! `deltascope logits`: the top-k next-token logits at the last position.
//! A developer tool (architecture.json): it runs the model's forward pass directly.

use std::io::Write;

use clap::Args;

use super::common::{self, LocalModelArgs, PromptArgs};
// A developer tool (architecture.json): it reads the model's logits directly.
use crate::backend::ChatRequest;
use deltascope_model::LayerKind;
use deltascope_model::{ForwardOptions, HiddenStats, ModelConfig};
use deltascope_protocol::{GenerationParams, Thinking};

struct Prompt {
    ids: Vec<u32>,
}

#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: LocalModelArgs,
    /// The user message (rendered through the chat template unless --raw); `-` reads it from
    /// standard input. `--text` is the same.
    #[arg(long, visible_alias = "text", value_name = "TEXT", conflicts_with_all = ["prompt_ids", "prompt_file"])]
    pub prompt: Option<String>,
    /// The user message from a file.
    #[arg(long, value_name = "FILE", conflicts_with = "prompt_ids")]
    pub prompt_file: Option<std::path::PathBuf>,
    /// Prompt token ids, comma-separated (used as is). `--ids` is the same.
    #[arg(long, visible_alias = "ids", value_name = "1,2,3")]
    pub prompt_ids: Option<String>,
    #[command(flatten)]
    pub prompt_opts: PromptArgs,
    /// How many entries.
    #[arg(long, default_value_t = 20, value_name = "K")]
    pub top: usize,
    /// Print one JSON object: {"ids": [...], "top": [{"id", "logit", "text"}, ...]}.
    #[arg(long)]
    pub json: bool,
    /// Also each layer's output over the prompt: mean ‖h‖, max |x| and NaN / ±Inf count
    /// (the forward pass runs on through non-finite values to show where they start and spread).
    #[arg(long)]
    pub layers: bool,
}

pub fn run(a: LogitsArgs) -> anyhow::Result<()> {
    let text = match a.prompt_ids {
        Some(_) => common::prompt_text(a.prompt.as_deref(), a.prompt_file.as_deref())?,
        None => Some(common::required_prompt_text(a.prompt.as_deref(), a.prompt_file.as_deref(), true)?),
    };
    let loaded = a.model.load()?;
    let request = ChatRequest {
        prompt: common::prompt(text.as_deref(), a.prompt_ids.as_deref(), &a.prompt_opts)?,
        params: GenerationParams {
            thinking: if a.prompt_opts.no_think { Thinking::Off } else { Thinking::Unlimited },
            ..Default::default()
        },
    };
    let (_, ids) = loaded.render(&request)?;
    let prompt = Prompt { ids };
    let mut state = loaded.model().new_state();
    let opts = ForwardOptions { hidden_norms: a.layers, check_finite: !a.layers, ..Default::default() };
    let out = loaded.model().forward(&prompt.ids, &mut state, opts)?;
    let layers = out.hidden_norms.as_deref().map(|stats| layer_rows(&loaded.model().config, stats));
    let logits = out.logits.row(0);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let k = a.top.min(logits.len());
    order.select_nth_unstable_by(k.saturating_sub(1), |x, y| logits[*y].total_cmp(&logits[*x]).then(x.cmp(y)));
    order.truncate(k);
    order.sort_by(|x, y| logits[*y].total_cmp(&logits[*x]).then(x.cmp(y)));
    let text = |id: usize| loaded.tokenizer().decode(&[id as u32]);
    let mut w = std::io::stdout().lock();
    if a.json {
        let top: Vec<_> =
            order.iter().map(|&id| serde_json::json!({"id": id, "logit": logits[id], "text": text(id)})).collect();
        let mut v = serde_json::json!({"ids": prompt.ids, "top": top});
        if let Some(rows) = &layers {
            v["layers"] = serde_json::to_value(rows)?;
        }
        writeln!(w, "{v}")?;
    } else {
        writeln!(
            w,
            "{} prompt tokens; top {k} next-token logits at position {}:",
            prompt.ids.len(),
            prompt.ids.len() - 1
        )?;
        writeln!(w, "{:>4}  {:>8}  {:>12}  text", "rank", "id", "logit")?;
        for (r, &id) in order.iter().enumerate() {
            writeln!(w, "{:>4}  {:>8}  {:>12.6}  {:?}", r + 1, id, logits[id], text(id))?;
        }
        if let Some(rows) = &layers {
            writeln!(w, "\nhidden state after each layer, over the {} prompt positions:", prompt.ids.len())?;
            writeln!(w, "{:>6}  {:<9}  {:>12}  {:>12}  {:>10}", "layer", "kind", "mean ‖h‖", "max |x|", "non-finite")?;
            let first_bad = rows.iter().position(|r| r.nonfinite > 0);
            for (i, r) in rows.iter().enumerate() {
                let mark = if Some(i) == first_bad { "  ← first non-finite values" } else { "" };
                writeln!(
                    w,
                    "{:>6}  {:<9}  {:>12.4}  {:>12.4e}  {:>10}{mark}",
                    r.layer, r.kind, r.mean_norm, r.max_abs, r.nonfinite
                )?;
            }
        }
    }
    Ok(())
}

/// One row of `--layers`.
#[derive(serde::Serialize)]
struct LayerRow {
    /// The layer's index, or "final norm".
    layer: String,
    kind: &'static str,
    mean_norm: f32,
    max_abs: f32,
    nonfinite: usize,
}

fn layer_rows(cfg: &ModelConfig, stats: &[HiddenStats]) -> Vec<LayerRow> {
    stats
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let (layer, kind) = match cfg.layer_types.get(i) {
                Some(LayerKind::LinearAttention) => (i.to_string(), "GDN"),
                Some(LayerKind::FullAttention) => (i.to_string(), "attention"),
                None => ("final".to_string(), "norm"),
            };
            LayerRow { layer, kind, mean_norm: s.mean_norm(), max_abs: s.max_abs, nonfinite: s.nonfinite }
        })
        .collect()
}
