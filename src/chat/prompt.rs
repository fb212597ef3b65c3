//! Turns what the user typed into prompt token ids: through the chat template (default), as
//! raw text (`--raw`), or as ids given directly.

use serde_json::json;

use super::template::{ChatTemplate, RenderOptions};
use super::tokenizer::TextTokenizer;
use crate::error::{Error, Result};

#[derive(Debug, Clone, Default)]
pub struct PromptInput {
    pub text: Option<String>,
    pub ids: Option<Vec<u32>>,
    /// Tokenise the text as is, without the chat template.
    pub raw: bool,
    pub system: Option<String>,
    pub enable_thinking: bool,
}

#[derive(Debug, Clone)]
pub struct Prompt {
    /// The text that was tokenised (`None` for ids given directly).
    pub text: Option<String>,
    pub ids: Vec<u32>,
}

pub fn build_prompt(template: &ChatTemplate, tokenizer: &TextTokenizer, input: &PromptInput) -> Result<Prompt> {
    match (&input.text, &input.ids) {
        (Some(_), Some(_)) => Err(Error::InvalidArgument("give either a text prompt or token ids, not both".into())),
        (None, None) => Err(Error::InvalidArgument("no prompt given".into())),
        (None, Some(ids)) => {
            if ids.is_empty() {
                return Err(Error::InvalidArgument("the list of prompt ids is empty".into()));
            }
            Ok(Prompt { text: None, ids: ids.clone() })
        }
        (Some(text), None) => {
            let rendered = if input.raw {
                if input.system.is_some() {
                    return Err(Error::InvalidArgument("a system prompt needs the chat template; drop --raw".into()));
                }
                text.clone()
            } else {
                let mut messages = vec![];
                if let Some(s) = &input.system {
                    messages.push(json!({"role": "system", "content": s}));
                }
                messages.push(json!({"role": "user", "content": text}));
                let opts = RenderOptions {
                    add_generation_prompt: true,
                    enable_thinking: Some(input.enable_thinking),
                    ..Default::default()
                };
                template.render(&json!(messages), &opts)?
            };
            let ids = tokenizer.encode(&rendered)?;
            if ids.is_empty() {
                return Err(Error::InvalidArgument("the prompt tokenises to nothing".into()));
            }
            Ok(Prompt { text: Some(rendered), ids })
        }
    }
}

/// Parses `1,2,3` (spaces allowed).
pub fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u32>().map_err(|_| {
                Error::InvalidArgument(format!("`{p}` is not a token id (expected a comma-separated list like 1,2,3)"))
            })
        })
        .collect()
}
