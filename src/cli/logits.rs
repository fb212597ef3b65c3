//! `deltascope logits`: the top-k next-token logits at the last position.
//! A developer tool (architecture.json): it runs the model's forward pass directly.

use std::io::{self, Write};

use clap::Args;
use serde::Serialize;

use super::common::{self, LocalModelArgs, PromptArgs};
use super::report::{Report, emit};
// A developer tool (architecture.json): it reads the model's logits directly.
use crate::backend::ChatRequest;
use crate::backend::local::Loaded;
use deltascope_model::LayerKind;
use deltascope_model::{ForwardOptions, HiddenStats, ModelConfig};
use deltascope_protocol::{GenerationParams, Thinking};

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

/// `logits`' result: the prompt's ids, the top-k next tokens, and with `--layers` each layer's
/// hidden-state figures. The fields in order are the JSON's keys.
#[derive(Serialize)]
struct LogitsReport {
    ids: Vec<u32>,
    top: Vec<TopToken>,
    #[serde(skip_serializing_if = "Option::is_none")]
    layers: Option<Vec<LayerRow>>,
}

/// One of the top-k next tokens.
#[derive(Serialize)]
struct TopToken {
    id: usize,
    /// The f32 logit widened to f64, as the JSON has always written it.
    logit: f64,
    text: String,
}

impl Report for LogitsReport {
    fn print_human(&self, w: &mut dyn Write) -> io::Result<()> {
        let n = self.ids.len();
        writeln!(w, "{n} prompt tokens; top {} next-token logits at position {}:", self.top.len(), n - 1)?;
        writeln!(w, "{:>4}  {:>8}  {:>12}  text", "rank", "id", "logit")?;
        for (r, t) in self.top.iter().enumerate() {
            writeln!(w, "{:>4}  {:>8}  {:>12.6}  {:?}", r + 1, t.id, t.logit, t.text)?;
        }
        if let Some(rows) = &self.layers {
            print_layers(w, n, rows)?;
        }
        Ok(())
    }

    /// One line.
    fn print_json(&self, out: &mut dyn Write) -> io::Result<()> {
        serde_json::to_writer(&mut *out, self)?;
        writeln!(out)
    }
}

/// `--layers`: each layer's output over the prompt, the first with non-finite values marked.
fn print_layers(w: &mut dyn Write, positions: usize, rows: &[LayerRow]) -> io::Result<()> {
    writeln!(w, "\nhidden state after each layer, over the {positions} prompt positions:")?;
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
    Ok(())
}

/// The `k` largest of `logits`, largest first (ties: the lower id first).
fn top_k(logits: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let k = k.min(logits.len());
    order.select_nth_unstable_by(k.saturating_sub(1), |x, y| logits[*y].total_cmp(&logits[*x]).then(x.cmp(y)));
    order.truncate(k);
    order.sort_by(|x, y| logits[*y].total_cmp(&logits[*x]).then(x.cmp(y)));
    order
}

/// The prompt rendered to ids: the text through the chat template (as is with --raw), or
/// `--prompt-ids` as given.
fn render(a: &LogitsArgs, loaded: &Loaded, text: Option<&str>) -> anyhow::Result<Vec<u32>> {
    let request = ChatRequest {
        prompt: common::prompt(text, a.prompt_ids.as_deref(), &a.prompt_opts)?,
        params: GenerationParams {
            thinking: if a.prompt_opts.no_think { Thinking::Off } else { Thinking::Unlimited },
            ..Default::default()
        },
    };
    Ok(loaded.render(&request)?.1)
}

pub fn run(a: LogitsArgs) -> anyhow::Result<()> {
    // The prompt text is read (standard input too) before the model loads.
    let text = match a.prompt_ids {
        Some(_) => common::prompt_text(a.prompt.as_deref(), a.prompt_file.as_deref())?,
        None => Some(common::required_prompt_text(a.prompt.as_deref(), a.prompt_file.as_deref(), true)?),
    };
    let loaded = a.model.load()?;
    let ids = render(&a, &loaded, text.as_deref())?;
    let mut state = loaded.model().new_state();
    let opts = ForwardOptions { hidden_norms: a.layers, check_finite: !a.layers, ..Default::default() };
    let out = loaded.model().forward(&ids, &mut state, opts)?;
    let layers = out.hidden_norms.as_deref().map(|stats| layer_rows(loaded.model().config(), stats));
    let logits = out.logits.row(0);
    let top = top_k(logits, a.top)
        .into_iter()
        .map(|id| TopToken { id, logit: f64::from(logits[id]), text: loaded.tokenizer().decode(&[id as u32]) })
        .collect();
    emit(&LogitsReport { ids, top, layers }, a.json)
}

/// One row of `--layers`.
#[derive(Serialize)]
struct LayerRow {
    /// The layer's index, or "final norm".
    layer: String,
    kind: &'static str,
    /// The f32 figures widened to f64, as the JSON has always written them.
    mean_norm: f64,
    max_abs: f64,
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
            LayerRow {
                layer,
                kind,
                mean_norm: f64::from(s.mean_norm()),
                max_abs: f64::from(s.max_abs),
                nonfinite: s.nonfinite,
            }
        })
        .collect()
}
