//! What a server says about tokens without generating: its tokens for a text (llama.cpp and
//! vLLM `/tokenize`, SGLang `/v1/tokenize`), and its rendering of a chat (llama.cpp
//! `/apply-template`, vLLM `/tokenize` with messages). Client-side budgets continue from the first; `deltascope
//! verify` compares the second with the reference's before any generation.

use serde_json::{Value, json};

use super::detect::{ServerFacts, ServerKind};
use super::http::{Ask, Http};
use crate::backend::{BackendError, BackendResult, ChatMessage, PromptTokens};

/// `text` in the server's own tokens, with each token's text (llama.cpp `/tokenize` with
/// pieces; vLLM gives ids only, so the text goes with the first). `None` when it cannot say.
pub(super) async fn tokenize(http: &Http, facts: &ServerFacts, text: &str) -> Option<Vec<(u32, String)>> {
    let body = match facts.kind {
        ServerKind::LlamaCpp => serde_json::json!({"content": text, "with_pieces": true}),
        ServerKind::Deltascope => serde_json::json!({"content": text}),
        ServerKind::Vllm | ServerKind::Sglang => {
            serde_json::json!({"model": facts.model, "prompt": text, "add_special_tokens": false})
        }
        _ => return None,
    };
    let path = if facts.kind == ServerKind::Sglang { "/v1/tokenize" } else { "/tokenize" };
    let resp = http.send(Ask::Post(&body), path, Some(http.timeout)).await.ok()?;
    let v: Value = resp.error_for_status().ok()?.json().await.ok()?;
    let tokens = v.get("tokens").and_then(Value::as_array)?;
    let mut out = vec![];
    for (i, t) in tokens.iter().enumerate() {
        let (id, piece) = match t {
            Value::Number(n) => (n.as_u64()?, if i == 0 { text.to_string() } else { String::new() }),
            _ => (t.get("id")?.as_u64()?, t.get("piece").and_then(Value::as_str).unwrap_or("").to_string()),
        };
        out.push((u32::try_from(id).ok()?, piece));
    }
    Some(out)
}

/// The server's own rendering and tokens for a chat prompt, with the generation prompt;
/// `None` when the server has no way to say (SGLang, deltascope serve, a generic server).
pub(super) async fn chat_prompt(
    http: &Http,
    facts: &ServerFacts,
    messages: &[ChatMessage],
    thinking: bool,
) -> BackendResult<Option<PromptTokens>> {
    let messages = serde_json::to_value(messages).map_err(|e| BackendError::invalid(format!("messages: {e}")))?;
    chat_prompt_value(http, facts, &messages, thinking).await
}

/// [`chat_prompt`] for messages already in their JSON form (as a request body holds them).
pub(super) async fn chat_prompt_value(
    http: &Http,
    facts: &ServerFacts,
    messages: &Value,
    thinking: bool,
) -> BackendResult<Option<PromptTokens>> {
    let kwargs = json!({"enable_thinking": thinking});
    match facts.kind {
        // deltascope serve answers both in llama-server's shape.
        ServerKind::LlamaCpp | ServerKind::Deltascope => {
            let body = json!({"messages": messages, "chat_template_kwargs": kwargs});
            let rendered = post_json(http, "/apply-template", &body).await?;
            let text = rendered.get("prompt").and_then(Value::as_str).ok_or_else(|| {
                BackendError::invalid(format!("{}/apply-template: no `prompt` in the answer", http.base))
            })?;
            // The template's text holds the special tokens as text: parsed as such, and no
            // BOS added (the template writes what the model needs).
            let body = json!({"content": text, "add_special": false, "parse_special": true});
            let tokens = post_json(http, "/tokenize", &body).await?;
            Ok(Some(PromptTokens { text: Some(text.to_string()), ids: ids(http, &tokens)? }))
        }
        ServerKind::Vllm => {
            let body = json!({"model": facts.model, "messages": messages, "add_generation_prompt": true,
                              "chat_template_kwargs": kwargs});
            let tokens = post_json(http, "/tokenize", &body).await?;
            Ok(Some(PromptTokens { text: None, ids: ids(http, &tokens)? }))
        }
        _ => Ok(None),
    }
}

/// A rendered prompt's text in SGLang's tokens (`/v1/tokenize`, `{"tokens": [ids], "count",
/// "max_model_len"}`); `None` for servers that render chats themselves (see [`chat_prompt`]).
pub(super) async fn text_ids(http: &Http, facts: &ServerFacts, text: &str) -> BackendResult<Option<Vec<u32>>> {
    if facts.kind != ServerKind::Sglang {
        return Ok(None);
    }
    let body = json!({"model": facts.model, "prompt": text, "add_special_tokens": false});
    let tokens = post_json(http, "/v1/tokenize", &body).await?;
    Ok(Some(ids(http, &tokens)?))
}

async fn post_json(http: &Http, path: &str, body: &Value) -> BackendResult<Value> {
    let url = http.url(path);
    let resp = http
        .send(Ask::Post(body), path, Some(http.timeout))
        .await
        .map_err(|e| super::http::transport_error(&url, &e))?;
    let status = resp.status();
    if !status.is_success() {
        let text = resp.text().await.unwrap_or_default();
        return Err(BackendError::invalid(format!(
            "{url}: HTTP {status}: {}",
            text.chars().take(200).collect::<String>()
        )));
    }
    resp.json().await.map_err(|e| BackendError::invalid(format!("{url}: the answer is not JSON: {e}")))
}

/// `{"tokens": [1, 2, …]}` or llama.cpp's `[{"id": 1, "piece": …}, …]`.
fn ids(http: &Http, v: &Value) -> BackendResult<Vec<u32>> {
    let bad = || BackendError::invalid(format!("{}/tokenize: expected {{\"tokens\": [ids]}}", http.base));
    let tokens = v.get("tokens").and_then(Value::as_array).ok_or_else(bad)?;
    tokens
        .iter()
        .map(|t| {
            t.as_u64()
                .or_else(|| t.get("id").and_then(Value::as_u64))
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(bad)
        })
        .collect()
}
