//! What a server is: llama.cpp (`/props`), SGLang (`/server_info`, older `/get_server_info`),
//! vLLM (`/version`), else plain "OpenAI-compatible"; which models it serves, its context, its
//! sampling defaults, whether it speculates, and whether `/metrics` answers.

use serde_json::Value;

use super::http::Http;
use crate::backend::{BackendError, BackendResult};
use deltascope_protocol::{ErrorKind, SamplingParams};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerKind {
    LlamaCpp,
    Vllm,
    Sglang,
    /// `deltascope serve` (its `/v1/models` entry says `owned_by: deltascope`).
    Deltascope,
    Generic,
}

impl ServerKind {
    pub fn name(self) -> &'static str {
        match self {
            ServerKind::LlamaCpp => "llama.cpp",
            ServerKind::Vllm => "vLLM",
            ServerKind::Sglang => "SGLang",
            ServerKind::Deltascope => "deltascope",
            ServerKind::Generic => "OpenAI-compatible",
        }
    }
}

/// Everything learned about a server when attaching to it.
#[derive(Debug, Clone)]
pub struct ServerFacts {
    pub kind: ServerKind,
    pub version: Option<String>,
    /// The model requests name.
    pub model: String,
    pub models: Vec<String>,
    pub context: Option<usize>,
    /// What the server says of its model's shape (llama.cpp's and deltascope's `/v1/models`
    /// `meta`).
    pub identity: crate::backend::ModelIdentity,
    /// Sampling defaults the server reports (llama.cpp's `/props`).
    pub defaults: Option<SamplingParams>,
    /// The chat template the server renders with (llama.cpp's `/props`).
    pub chat_template: Option<String>,
    pub speculative: bool,
    /// `/metrics` answers (Prometheus text).
    pub metrics: bool,
    /// SGLang: whether the server runs a reasoning parser (`None`: not reported).
    pub reasoning_parser: Option<bool>,
}

/// Asks the server what it is. The first request is `/v1/models`, which every
/// OpenAI-compatible server has: its failure is the one error a user sees.
pub async fn detect(http: &Http, wanted_model: Option<&str>) -> BackendResult<ServerFacts> {
    let models_json = http.get_json("/v1/models").await?;
    let data = models_json.get("data").and_then(Value::as_array).ok_or_else(|| {
        BackendError::new(
            ErrorKind::Unavailable,
            format!("{}/v1/models: no `data` list in the answer; is this an OpenAI-compatible server?", http.base),
        )
    })?;
    let models: Vec<String> =
        data.iter().filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_string)).collect();
    let model = match wanted_model {
        Some(m) if models.iter().any(|x| x == m) => m.to_string(),
        Some(m) => {
            return Err(BackendError::invalid(format!(
                "--server-model {m}: {} serves {}",
                http.base,
                if models.is_empty() { "no models".to_string() } else { models.join(", ") }
            )));
        }
        None => models.first().cloned().ok_or_else(|| {
            BackendError::new(ErrorKind::Unavailable, format!("{} serves no models (/v1/models is empty)", http.base))
        })?,
    };
    let model_entry = data.iter().find(|m| m.get("id").and_then(Value::as_str) == Some(&model));
    let identity = identity_of(&model, model_entry.and_then(|m| m.get("meta")));
    let mut facts = ServerFacts {
        identity,
        kind: ServerKind::Generic,
        version: None,
        context: model_entry
            .and_then(|m| m.get("max_model_len").or_else(|| m.pointer("/meta/n_ctx")))
            .and_then(Value::as_u64)
            .map(|v| v as usize),
        model,
        models,
        defaults: None,
        chat_template: None,
        speculative: false,
        metrics: false,
        reasoning_parser: None,
    };
    if let Some(ds) = model_entry.filter(|m| m.get("owned_by").and_then(Value::as_str) == Some("deltascope")) {
        // deltascope serve: reasoning split by the server, `thinking_budget`, its model's
        // sampling defaults in the model entry.
        facts.kind = ServerKind::Deltascope;
        facts.version = ds.pointer("/deltascope/version").and_then(Value::as_str).map(str::to_string);
        facts.reasoning_parser = Some(true);
        facts.speculative = ds.pointer("/deltascope/mtp").and_then(Value::as_bool).unwrap_or(false);
        facts.defaults = ds
            .pointer("/deltascope/sampling_defaults")
            .and_then(|d| serde_json::from_value::<SamplingParams>(d.clone()).ok());
    } else if let Some(props) = http.try_get_json("/props").await.filter(|p| p.get("build_info").is_some()) {
        facts.kind = ServerKind::LlamaCpp;
        facts.version = props.get("build_info").and_then(Value::as_str).map(str::to_string);
        facts.chat_template = props.get("chat_template").and_then(Value::as_str).map(str::to_string);
        let g = props.get("default_generation_settings");
        if let Some(n) = g.and_then(|g| g.get("n_ctx")).and_then(Value::as_u64) {
            facts.context = Some(n as usize);
        }
        facts.defaults = g.and_then(|g| g.get("params")).map(llama_defaults);
        // `/props` does not reflect --spec-type; `/slots` does.
        facts.speculative = http
            .try_get_json("/slots")
            .await
            .and_then(|s| {
                s.as_array().and_then(|a| a.first()).and_then(|s| s.get("speculative")).and_then(Value::as_bool)
            })
            .unwrap_or(false);
    } else if let Some(info) = sglang_info(http).await {
        facts.kind = ServerKind::Sglang;
        facts.version = info.get("version").and_then(Value::as_str).map(str::to_string);
        if let Some(n) = info.get("context_length").and_then(Value::as_u64) {
            facts.context = Some(n as usize);
        }
        facts.speculative = info
            .get("speculative_algorithm")
            .is_some_and(|a| !a.is_null() && a.as_str() != Some("") && a.as_str() != Some("None"));
        facts.reasoning_parser = info.get("reasoning_parser").map(|p| !p.is_null());
    } else if let Some(v) = http.try_get_json("/version").await.and_then(|v| v.get("version").cloned()) {
        facts.kind = ServerKind::Vllm;
        facts.version = v.as_str().map(str::to_string);
    }
    if let Some(text) = http.try_get_text("/metrics").await {
        facts.metrics = true;
        if facts.kind == ServerKind::Vllm {
            facts.speculative = text.contains("vllm:spec_decode_num_drafts");
        }
    }
    Ok(facts)
}

async fn sglang_info(http: &Http) -> Option<Value> {
    for path in ["/server_info", "/get_server_info"] {
        if let Some(v) =
            http.try_get_json(path).await.filter(|v| v.get("version").is_some() || v.get("model_path").is_some())
        {
            return Some(v);
        }
    }
    None
}

/// llama.cpp's default sampling (`/props` → `default_generation_settings.params`).
fn llama_defaults(p: &Value) -> SamplingParams {
    let f = |k: &str, d: f32| p.get(k).and_then(Value::as_f64).map(|v| v as f32).unwrap_or(d);
    SamplingParams {
        temperature: f("temperature", 0.8),
        top_k: p.get("top_k").and_then(Value::as_u64).unwrap_or(40) as usize,
        top_p: f("top_p", 0.95),
        min_p: f("min_p", 0.05),
        presence_penalty: f("presence_penalty", 0.0),
        frequency_penalty: f("frequency_penalty", 0.0),
        repetition_penalty: f("repeat_penalty", 1.0),
        seed: 0,
    }
}

/// The model a server names, with what its `/v1/models` entry's `meta` says of it (llama.cpp:
/// `n_vocab`, `n_embd`, `n_params`; deltascope serve adds `n_layer`, `n_params_mtp` and the
/// embedding's `fingerprint`).
fn identity_of(model: &str, meta: Option<&Value>) -> crate::backend::ModelIdentity {
    let n = |k: &str| meta.and_then(|m| m.get(k)).and_then(Value::as_u64);
    crate::backend::ModelIdentity {
        vocab_size: n("n_vocab").map(|v| v as usize),
        hidden_size: n("n_embd").map(|v| v as usize),
        layers: n("n_layer").map(|v| v as usize),
        params: n("n_params"),
        params_with_mtp: n("n_params_mtp"),
        fingerprint: meta.and_then(|m| m.get("fingerprint")).and_then(Value::as_str).map(str::to_string),
        file_bytes: n("size"),
        file_type: meta.and_then(|m| m.get("ftype")).and_then(Value::as_str).map(str::to_string),
        file_values: n("n_params_file"),
        ..crate::backend::ModelIdentity::named(model)
    }
}
