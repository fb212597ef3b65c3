//! The keys of `config.json` beyond the ones the checks read (`raw.rs`): keys known to change
//! nothing this engine computes, keys known with only some values supported (any other value is
//! refused), and the rest — unknown. An unknown key is never dropped in silence: each one is
//! kept on the [`ModelConfig`](super::ModelConfig), reported in one line by `inspect`, `run` and
//! the workbench, and refused under `--strict-config`.

use serde::Serialize;
use serde_json::{Map, Value};

use super::checker::Checker;
use crate::error::{Error, Result};

/// Keys that do not change the language model's numbers: bookkeeping of the tools that wrote the
/// file, training-time switches, the vision tower's settings (deltascope runs the text model),
/// and Qwen2's sliding-window sizes (read only with `use_sliding_window`, refused below).
const INERT: &[&str] = &[
    "transformers_version",
    "_name_or_path",
    "bos_token_id",
    "pad_token_id",
    "use_cache",
    "initializer_range",
    "attention_dropout",
    "output_router_logits",
    "router_aux_loss_coef",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "use_return_dict",
    "torchscript",
    "is_encoder_decoder",
    "tokenizer_class",
    "image_token_id",
    "video_token_id",
    "vision_start_token_id",
    "vision_end_token_id",
    "vision_config",
    "max_window_layers",
    "sliding_window",
];

/// A key deltascope does not know, as the file has it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UnknownKey {
    /// Its path in the file: `text_config.foo`, `rope_parameters.factor`.
    pub path: String,
    /// Its value as compact JSON (cut at 60 characters).
    pub value: String,
}

impl UnknownKey {
    /// "config.json: unknown key `foo` = 3, ignored: if it changes the architecture, results will
    /// be wrong".
    pub fn warning(&self, file: &str) -> String {
        format!(
            "{file}: unknown key `{}` = {}, ignored: if it changes the architecture, results will be wrong",
            self.path, self.value
        )
    }
}

/// The keys of `rest` (what the raw structs did not read) that are unknown, after refusing a
/// known key's unsupported value. `prefix` is the level's path (`""`, `"text_config."`).
pub(super) fn unknown_keys(f: &Checker, prefix: &str, rest: &Map<String, Value>) -> Result<Vec<UnknownKey>> {
    let mut unknown = vec![];
    for (key, value) in rest {
        if INERT.contains(&key.as_str()) {
            continue;
        }
        if let Some(supported) = known_values(key) {
            if !supported.iter().any(|ok| ok == value) {
                let allowed: Vec<String> = supported.iter().map(Value::to_string).collect();
                return Err(Error::Unsupported {
                    file: f.file.to_string(),
                    message: format!(
                        "{prefix}{key} = {value} is not supported (deltascope computes {}); {}",
                        allowed.join(" or "),
                        why_not(key)
                    ),
                });
            }
            continue;
        }
        let mut text = value.to_string();
        if text.chars().count() > 60 {
            text = format!("{}…", text.chars().take(60).collect::<String>());
        }
        unknown.push(UnknownKey { path: format!("{prefix}{key}"), value: text });
    }
    Ok(unknown)
}

/// The values a known key may take for the model deltascope computes to be the one the file
/// describes.
fn known_values(key: &str) -> Option<Vec<Value>> {
    Some(match key {
        // The MTP head shares the model's embeddings (its own would be extra tensors).
        "mtp_use_dedicated_embeddings" => vec![Value::Bool(false)],
        // The Gated DeltaNet's output gate (vLLM's name; "swish" is SiLU).
        "output_gate_type" => vec![Value::from("silu"), Value::from("swish")],
        // Qwen2's sliding-window attention: no Qwen3.5 / Qwen3-Next checkpoint turns it on.
        "use_sliding_window" => vec![Value::Bool(false)],
        _ => return None,
    })
}

fn why_not(key: &str) -> &'static str {
    match key {
        "mtp_use_dedicated_embeddings" => "an MTP head with embeddings of its own is not implemented",
        "output_gate_type" => "a sigmoid (or other) GDN output gate, as in Qwen3.8-Flash-Next, is not implemented",
        "use_sliding_window" => "sliding-window attention is not implemented",
        _ => "",
    }
}

/// `model_type`s of related families that deltascope knows and does not run, with what is
/// missing.
pub(super) fn known_unsupported(model_type: &str) -> Option<&'static str> {
    match model_type {
        "qwen4_exp" => Some(
            "Qwen3.8-Flash-Next: deltascope does not implement its sparse attention, hyper-connections or n-gram embeddings",
        ),
        _ => None,
    }
}
