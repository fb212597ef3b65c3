//! `deltascope logits`: the top-k next-token logits at the last position.

use std::io::Write;

use clap::Args;

use super::common::{self, ModelArgs, PromptArgs};
// A developer tool (architecture.json): it reads the model's logits directly.
use crate::backend::ChatRequest;
use crate::model::ForwardOptions;

struct Prompt {
    ids: Vec<u32>,
}

#[derive(Args, Debug)]
pub struct LogitsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Text (rendered through the chat template as a user message unless --raw).
    #[arg(long, value_name = "TEXT", conflicts_with = "ids", required_unless_present = "ids")]
    pub text: Option<String>,
    /// Token ids, comma-separated (used as is).
    #[arg(long, value_name = "1,2,3")]
    pub ids: Option<String>,
    #[command(flatten)]
    pub prompt_opts: PromptArgs,
    /// How many entries.
    #[arg(long, default_value_t = 20, value_name = "K")]
    pub top: usize,
    /// Print one JSON object: {"ids": [...], "top": [{"id", "logit", "text"}, ...]}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: LogitsArgs) -> anyhow::Result<()> {
    let loaded = common::load_local(&a.model, "logits")?;
    let request = ChatRequest {
        prompt: common::prompt(a.text.as_deref(), a.ids.as_deref(), &a.prompt_opts)?,
        enable_thinking: !a.prompt_opts.no_think,
        params: Default::default(),
    };
    let (_, ids) = loaded.render(&request)?;
    let prompt = Prompt { ids };
    let mut state = loaded.model.new_state();
    let out = loaded.model.forward(&prompt.ids, &mut state, ForwardOptions::default())?;
    let logits = out.logits.row(0);
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let k = a.top.min(logits.len());
    order.select_nth_unstable_by(k.saturating_sub(1), |x, y| logits[*y].total_cmp(&logits[*x]).then(x.cmp(y)));
    order.truncate(k);
    order.sort_by(|x, y| logits[*y].total_cmp(&logits[*x]).then(x.cmp(y)));
    let text = |id: usize| loaded.tokenizer.decode(&[id as u32]);
    let mut w = std::io::stdout().lock();
    if a.json {
        let top: Vec<_> =
            order.iter().map(|&id| serde_json::json!({"id": id, "logit": logits[id], "text": text(id)})).collect();
        writeln!(w, "{}", serde_json::json!({"ids": prompt.ids, "top": top}))?;
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
    }
    Ok(())
}
