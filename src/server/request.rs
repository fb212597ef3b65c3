//! The request bodies of `/v1/chat/completions` and `/v1/completions`, read field by field
//! from JSON so every wrong type or value is a 400 naming its field (as the OpenAI error body's
//! `param`). Fields that change results and are not supported (`n` > 1, `tools`,
//! `response_format`) are refused; unknown harmless fields are ignored, as the peers do.

use serde_json::{Map, Value};

use crate::backend::{ChatMessage, ChatRequest, Prompt, Role};
use crate::generation::{GenerationParams, QWEN_BUDGET_BRIDGE, SamplingParams, range};

use super::error::ApiError;

/// A parsed request: what to run and how to answer.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub req: ChatRequest,
    pub stream: bool,
    pub include_usage: bool,
    /// `logprobs: true` (chat) / `logprobs: N` (completions).
    pub logprobs: bool,
    /// `max_tokens` was given (else the rest of the context, once the prompt is counted).
    pub max_tokens_given: bool,
    pub model: Option<String>,
}

/// Nesting deeper than this is refused before any field is read (serde_json's own limit is
/// 128; a body that deep is not a request).
pub const MAX_DEPTH: usize = 32;

fn depth(v: &Value) -> usize {
    match v {
        Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
        Value::Object(o) => 1 + o.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// The body as a JSON object.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    let text = std::str::from_utf8(body).map_err(|e| ApiError::bad(None, format!("the body is not UTF-8: {e}")))?;
    let v: Value =
        serde_json::from_str(text).map_err(|e| ApiError::bad(None, format!("the body is not valid JSON: {e}")))?;
    if depth(&v) > MAX_DEPTH {
        return Err(ApiError::bad(None, format!("the body nests deeper than {MAX_DEPTH} levels")));
    }
    match v {
        Value::Object(o) => Ok(o),
        other => Err(ApiError::bad(None, format!("the body must be a JSON object, not {}", kind(&other)))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, name: &str) -> Option<&Value> {
        self.0.get(name).filter(|v| !v.is_null())
    }

    fn wrong(name: &str, v: &Value, expected: &str) -> ApiError {
        ApiError::bad(Some(name), format!("{name} must be {expected}, not {}", kind(v)))
    }

    fn bool(&self, name: &str) -> Result<Option<bool>, ApiError> {
        self.get(name).map(|v| v.as_bool().ok_or_else(|| Self::wrong(name, v, "a boolean"))).transpose()
    }

    /// A number (its range is judged by `GenerationParams::check`, with everything else).
    fn f32(&self, name: &str) -> Result<Option<f32>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        let x = v.as_f64().ok_or_else(|| Self::wrong(name, v, "a number"))?;
        Ok(Some(x as f32))
    }

    /// A whole number.
    fn int(&self, name: &str) -> Result<Option<i64>, ApiError> {
        let Some(v) = self.get(name) else { return Ok(None) };
        v.as_i64().map(Some).ok_or_else(|| {
            if v.is_number() {
                ApiError::bad(Some(name), format!("{name} is {v}: must be a whole number"))
            } else {
                Self::wrong(name, v, "an integer")
            }
        })
    }

    /// A count (a whole number ≥ 0 by type); a negative one is refused with the words of the
    /// field's row in the range table.
    fn count(&self, name: &str, field: &str) -> Result<Option<usize>, ApiError> {
        match self.int(name)? {
            Some(x) if x < 0 => Err(out_of_range(name, &x.to_string(), field)),
            x => Ok(x.map(|x| x as usize)),
        }
    }

    fn string(&self, name: &str) -> Result<Option<&str>, ApiError> {
        self.get(name).map(|v| v.as_str().ok_or_else(|| Self::wrong(name, v, "a string"))).transpose()
    }
}

fn out_of_range(name: &str, value: &str, field: &str) -> ApiError {
    let expected = range(field).map_or("in range", |r| r.expected);
    ApiError::bad(Some(name), format!("{name} is {value}: must be {expected}"))
}

/// The body's names for the fields `GenerationParams::check` may refuse (the spelling the
/// client used for max_tokens and the budget), so the 400 names what the client sent.
struct Names {
    max_tokens: &'static str,
    budget: &'static str,
    top_logprobs: &'static str,
}

/// The one range check (`GenerationParams::check_within` the context), as a 400 naming the
/// body's field.
fn judge(p: &GenerationParams, context: usize, names: &Names) -> Result<(), ApiError> {
    p.check_within(context).map_err(|e| {
        let name = match e.field.as_str() {
            "max_tokens" => names.max_tokens,
            "thinking_budget" => names.budget,
            "top_logprobs" => names.top_logprobs,
            f => f.trim_start_matches("sampling."),
        };
        ApiError::bad(Some(name), format!("{name} is {}: must be {}", e.value, e.expected))
    })
}

/// The settings both endpoints share: sampling, max_tokens, stop, budgets.
/// Sampling fields left out take `defaults` (the model's generation_config.json, as vLLM does).
fn common(f: &Fields, defaults: &SamplingParams) -> Result<(GenerationParams, Names, bool, Option<String>), ApiError> {
    for (name, ok) in [
        ("n", f.get("n").is_none_or(|v| v.as_i64() == Some(1))),
        ("tools", f.get("tools").is_none_or(|v| v.as_array().is_some_and(Vec::is_empty))),
        ("tool_choice", f.get("tool_choice").is_none_or(|v| v.as_str() == Some("none"))),
        (
            "response_format",
            f.get("response_format").is_none_or(|v| v.get("type").and_then(Value::as_str) == Some("text")),
        ),
        ("best_of", f.get("best_of").is_none_or(|v| v.as_i64() == Some(1))),
        ("suffix", f.get("suffix").is_none()),
    ] {
        if !ok {
            return Err(ApiError::bad(
                Some(name),
                format!("{name} is not supported by deltascope serve (one sequence per request, no tools or formats)"),
            ));
        }
    }
    let mut p = GenerationParams { sampling: defaults.clone(), ..Default::default() };
    let mut names = Names { max_tokens: "max_tokens", budget: "thinking_budget", top_logprobs: "top_logprobs" };
    let given = match (f.count("max_completion_tokens", "max_tokens")?, f.count("max_tokens", "max_tokens")?) {
        (Some(n), _) => {
            names.max_tokens = "max_completion_tokens";
            p.max_tokens = n;
            true
        }
        (None, Some(n)) => {
            p.max_tokens = n;
            true
        }
        (None, None) => false,
    };
    let s = &mut p.sampling;
    for (name, slot) in [
        ("temperature", &mut s.temperature),
        ("top_p", &mut s.top_p),
        ("min_p", &mut s.min_p),
        ("presence_penalty", &mut s.presence_penalty),
        ("frequency_penalty", &mut s.frequency_penalty),
        ("repetition_penalty", &mut s.repetition_penalty),
    ] {
        if let Some(x) = f.f32(name)? {
            *slot = x;
        }
    }
    // top_k -1 is vLLM's spelling of off.
    match f.int("top_k")? {
        Some(-1) => s.top_k = 0,
        Some(k) if k < 0 => return Err(out_of_range("top_k", &k.to_string(), "sampling.top_k")),
        Some(k) => s.top_k = usize::try_from(k).unwrap_or(usize::MAX),
        None => {}
    }
    if let Some(x) = f.int("seed")? {
        s.seed = x as u64;
    }
    p.stop = match f.get("stop") {
        None => vec![],
        Some(Value::String(x)) => vec![x.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| Fields::wrong("stop", v, "a string (in the list)")))
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(Fields::wrong("stop", v, "a string or a list of strings")),
    };
    // The names clients already send for a thinking budget: SGLang / deltascope, vLLM,
    // llama.cpp (two spellings). -1 is unlimited.
    for name in ["thinking_budget", "thinking_token_budget", "reasoning_budget_tokens", "thinking_budget_tokens"] {
        match f.int(name)? {
            Some(-1) => p.thinking_budget = None,
            Some(b) if b < -1 => return Err(out_of_range(name, &b.to_string(), "thinking_budget")),
            Some(b) => {
                names.budget = name;
                p.thinking_budget = Some(b as usize);
            }
            None => {}
        }
    }
    p.budget_bridge = f.string("reasoning_budget_message")?.unwrap_or(QWEN_BUDGET_BRIDGE).to_string();
    p.stop_token_ids = match f.get("stop_token_ids") {
        None => vec![],
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_u64()
                    .filter(|&x| x <= u32::MAX as u64)
                    .map(|x| x as u32)
                    .ok_or_else(|| Fields::wrong("stop_token_ids", v, "a token id ≥ 0 (in the list)"))
            })
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(Fields::wrong("stop_token_ids", v, "a list of token ids")),
    };
    p.ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let model = f.string("model")?.map(str::to_string);
    Ok((p, names, given, model))
}

fn stream_options(f: &Fields) -> Result<(bool, bool), ApiError> {
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.get("stream_options") {
        None => false,
        Some(Value::Object(o)) => {
            Fields(o).bool("include_usage").map_err(|e| e.param("stream_options.include_usage"))?.unwrap_or(false)
        }
        Some(v) => return Err(Fields::wrong("stream_options", v, "an object")),
    };
    Ok((stream, include_usage))
}

/// Message text: a string, or OpenAI's list of `{"type": "text", "text": …}` parts.
fn content(v: Option<&Value>, at: &str) -> Result<String, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for (i, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    _ => {
                        return Err(ApiError::bad(
                            Some(&format!("{at}.content[{i}]")),
                            "only text parts ({\"type\": \"text\", \"text\": …}) are supported",
                        ));
                    }
                }
            }
            Ok(out)
        }
        Some(v) => Err(Fields::wrong(&format!("{at}.content"), v, "a string or a list of text parts")),
    }
}

/// `POST /v1/chat/completions`.
pub fn chat(body: &Map<String, Value>, context: usize, defaults: &SamplingParams) -> Result<Parsed, ApiError> {
    let f = Fields(body);
    let (mut params, names, max_tokens_given, model) = common(&f, defaults)?;
    let (stream, include_usage) = stream_options(&f)?;
    let list = match f.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => a,
        Some(Value::Array(_)) => return Err(ApiError::bad(Some("messages"), "messages is empty")),
        Some(v) => return Err(Fields::wrong("messages", v, "a list of messages")),
        None => return Err(ApiError::bad(Some("messages"), "messages is required")),
    };
    let mut messages = vec![];
    for (i, m) in list.iter().enumerate() {
        let at = format!("messages[{i}]");
        let role = match m.get("role").and_then(Value::as_str) {
            Some("system") | Some("developer") => Role::System,
            Some("user") => Role::User,
            Some("assistant") => Role::Assistant,
            Some(r) => {
                return Err(ApiError::bad(
                    Some(&format!("{at}.role")),
                    format!("role {r:?}: must be system, user or assistant"),
                ));
            }
            None => return Err(ApiError::bad(Some(&format!("{at}.role")), "role is required")),
        };
        // reasoning_content on an assistant turn is accepted and dropped, as the template does
        // with earlier turns' thinking.
        messages.push(ChatMessage::new(role, content(m.get("content"), &at)?));
    }
    let enable_thinking = match f.get("chat_template_kwargs") {
        None => true,
        Some(Value::Object(o)) => Fields(o)
            .bool("enable_thinking")
            .map_err(|e| e.param("chat_template_kwargs.enable_thinking"))?
            .unwrap_or(true),
        Some(v) => return Err(Fields::wrong("chat_template_kwargs", v, "an object")),
    };
    let logprobs = f.bool("logprobs")?.unwrap_or(false);
    let top = f.count("top_logprobs", "top_logprobs")?.unwrap_or(0);
    if top > 0 && !logprobs {
        return Err(ApiError::bad(Some("top_logprobs"), "top_logprobs needs logprobs: true"));
    }
    params.top_logprobs = top;
    judge(&params, context, &names)?;
    Ok(Parsed {
        req: ChatRequest { prompt: Prompt::Chat(messages), enable_thinking, params },
        stream,
        include_usage,
        logprobs,
        max_tokens_given,
        model,
    })
}

/// `POST /v1/completions`: a raw prompt, text or token ids (no template).
pub fn completion(body: &Map<String, Value>, context: usize, defaults: &SamplingParams) -> Result<Parsed, ApiError> {
    let f = Fields(body);
    let (mut params, mut names, max_tokens_given, model) = common(&f, defaults)?;
    let (stream, include_usage) = stream_options(&f)?;
    let prompt = match f.get("prompt") {
        Some(Value::String(s)) if !s.is_empty() => Prompt::Text(s.clone()),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            Prompt::Text(a[0].as_str().unwrap_or_default().into())
        }
        Some(Value::Array(a)) if !a.is_empty() && a.iter().all(Value::is_number) => Prompt::Ids(
            a.iter()
                .map(|v| v.as_u64().filter(|&x| x <= u32::MAX as u64).map(|x| x as u32))
                .collect::<Option<Vec<u32>>>()
                .ok_or_else(|| ApiError::bad(Some("prompt"), "token ids must be whole numbers ≥ 0"))?,
        ),
        Some(Value::Array(a)) if a.len() > 1 => {
            return Err(ApiError::bad(Some("prompt"), "one prompt per request (a list of prompts is a batch)"));
        }
        Some(v) if v.as_str().is_some_and(str::is_empty) => {
            return Err(ApiError::bad(Some("prompt"), "prompt is empty"));
        }
        Some(v) => return Err(Fields::wrong("prompt", v, "a string or a list of token ids")),
        None => return Err(ApiError::bad(Some("prompt"), "prompt is required")),
    };
    // logprobs: N (the legacy API's number of alternatives).
    let n = f.count("logprobs", "top_logprobs").or_else(|e| match f.bool("logprobs") {
        Ok(Some(b)) => Ok(Some(usize::from(b))),
        _ => Err(e),
    })?;
    params.top_logprobs = n.unwrap_or(0);
    names.top_logprobs = "logprobs";
    judge(&params, context, &names)?;
    Ok(Parsed {
        req: ChatRequest { prompt, enable_thinking: true, params },
        stream,
        include_usage,
        logprobs: n.is_some(),
        max_tokens_given,
        model,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<Parsed, ApiError> {
        chat(&object(body.as_bytes())?, 4096, &SamplingParams::default())
    }

    #[test]
    fn fields_map_onto_the_generation() {
        let p = parse(
            r#"{"model": "m", "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": "a", "reasoning_content": "dropped"}, {"role": "user", "content": "again"}],
                "max_completion_tokens": 77, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.05, "seed": 9,
                "presence_penalty": 0.5, "stop": "END", "logprobs": true, "top_logprobs": 5, "stream": true,
                "stream_options": {"include_usage": true}, "chat_template_kwargs": {"enable_thinking": false},
                "thinking_token_budget": 128, "reasoning_budget_message": "ok.", "unknown_harmless": [1]}"#,
        )
        .unwrap();
        let g = &p.req.params;
        assert_eq!((g.max_tokens, g.sampling.top_k, g.sampling.seed, g.top_logprobs), (77, 20, 9, 5));
        assert_eq!((g.sampling.temperature, g.sampling.top_p, g.sampling.min_p), (0.6, 0.95, 0.05));
        assert_eq!(
            (g.thinking_budget, g.budget_bridge.as_str(), g.stop.clone()),
            (Some(128), "ok.", vec!["END".to_string()])
        );
        assert!(p.stream && p.include_usage && p.logprobs && p.max_tokens_given && !p.req.enable_thinking);
        let Prompt::Chat(m) = &p.req.prompt else { panic!("a chat prompt") };
        assert_eq!(m.len(), 4);
        assert_eq!((m[1].content.as_str(), m[2].reasoning.clone()), ("hi", None));
    }

    #[test]
    fn every_bad_field_is_named() {
        for (body, param) in [
            (r#"{"messages": "hi"}"#, "messages"),
            (r#"{"messages": []}"#, "messages"),
            (r#"{"messages": [{"role": "robot", "content": "x"}]}"#, "messages[0].role"),
            (r#"{"messages": [{"role": "user", "content": 5}]}"#, "messages[0].content"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#, "temperature"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 1e30}"#, "max_tokens"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 99999}"#, "max_tokens"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "n": 2}"#, "n"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}"#, "tools"),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}"#,
                "response_format",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 21, "logprobs": true}"#,
                "top_logprobs",
            ),
            (r#"{"messages": [{"role": "user", "content": "x"}], "stop": [1]}"#, "stop"),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": 1}}"#,
                "stream_options.include_usage",
            ),
        ] {
            let e = parse(body).expect_err(body);
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert_eq!(e.status, 400, "{body}");
        }
        assert!(parse("[1]").unwrap_err().message.contains("JSON object"));
        assert!(object(&[b'{', 0xff, b'}']).unwrap_err().message.contains("UTF-8"));
        let deep = "[".repeat(40) + &"]".repeat(40);
        assert!(object(deep.as_bytes()).unwrap_err().message.contains("deeper"));
    }
}
