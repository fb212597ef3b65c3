//! Pieces shared by the subcommands: which model, loading it, and building the prompt.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use crate::chat::{ChatTemplate, Prompt, PromptInput, TextTokenizer, build_prompt, parse_ids};
use crate::model::{LoadOptions, Model, ModelSource, Precision};

#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A Hugging Face model directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long, value_name = "DIR")]
    pub model: PathBuf,
    /// Compute precision: f32, or bf16 with the cast points of the transformers reference.
    #[arg(long, default_value = "f32", value_name = "f32|bf16")]
    pub dtype: String,
}

impl ModelArgs {
    pub fn source(&self) -> ModelSource {
        ModelSource::Dir(self.model.clone())
    }

    pub fn precision(&self) -> anyhow::Result<Precision> {
        Ok(Precision::parse(&self.dtype)?)
    }
}

#[derive(Args, Debug, Clone)]
pub struct PromptArgs {
    /// Tokenise the prompt as is (no chat template).
    #[arg(long)]
    pub raw: bool,
    /// System prompt (chat template only).
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Render the template with thinking disabled (enable_thinking=false).
    #[arg(long)]
    pub no_think: bool,
}

/// A loaded model with its text side.
pub struct Loaded {
    pub model: Arc<Model>,
    pub tokenizer: Arc<TextTokenizer>,
    pub template: ChatTemplate,
    pub name: String,
}

pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
    let source = args.source();
    let model = Model::load(&source, &LoadOptions { precision: args.precision()?, ..Default::default() })?;
    let tokenizer = TextTokenizer::load(&source, &model.config)?;
    let template = ChatTemplate::load(&source, tokenizer.specials.think_start.is_some())?;
    Ok(Loaded { name: source.label(), model: Arc::new(model), tokenizer: Arc::new(tokenizer), template })
}

pub fn prompt(l: &Loaded, text: Option<&str>, ids: Option<&str>, p: &PromptArgs) -> anyhow::Result<Prompt> {
    let ids = ids.map(parse_ids).transpose().context("--prompt-ids / --ids")?;
    let input = PromptInput {
        text: text.map(str::to_string),
        ids,
        raw: p.raw,
        system: p.system.clone(),
        enable_thinking: !p.no_think,
    };
    Ok(build_prompt(&l.template, &l.tokenizer, &input)?)
}

/// Bytes in human units (binary).
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{b} B") } else { format!("{v:.2} {}", UNITS[u]) }
}
