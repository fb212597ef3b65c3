//! The request bodies of `/v1/chat/completions` and `/v1/completions`, deserialised with serde
//! into the two bodies below (a wrong type is a 400 naming its field by its path, as the OpenAI
//! error body's `param`), then turned into [`GenerationParams`] and judged by the one range
//! table (`GenerationParams::check_within`). Fields that change results and are not supported
//! (`n` > 1, `tools`, `response_format`) are refused; unknown harmless fields are ignored, as
//! the peers do.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::backend::{ChatMessage, ChatRequest, Prompt, Role};
use deltascope_protocol::{GenerationParams, QWEN_BUDGET_BRIDGE, SamplingParams, Thinking, range};

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
    /// Thinking in `reasoning_content` and the `<think>` tags taken out (the default, as
    /// SGLang and vLLM with a reasoning parser); `separate_reasoning: false` (SGLang's field)
    /// puts every token in `content`, tags included, each with its logprob entry.
    pub separate_reasoning: bool,
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

/// The fields both endpoints share. `null` is the same as leaving a field out. Every
/// spelling of max_tokens and of the thinking budget is a field of its own rather than a serde
/// alias: clients send both `max_tokens` and `max_completion_tokens` (an alias would refuse
/// that as a duplicate), and a 400 names the spelling the client used.
#[derive(Debug, Deserialize)]
struct Common {
    model: Option<String>,
    max_completion_tokens: Option<i64>,
    max_tokens: Option<i64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    /// -1 is vLLM's spelling of off.
    top_k: Option<i64>,
    seed: Option<i64>,
    stop: Option<Stop>,
    stop_token_ids: Option<Vec<u32>>,
    ignore_eos: Option<bool>,
    /// SGLang's and deltascope's name.
    thinking_budget: Option<i64>,
    /// vLLM's.
    thinking_token_budget: Option<i64>,
    /// llama.cpp's two.
    reasoning_budget_tokens: Option<i64>,
    thinking_budget_tokens: Option<i64>,
    reasoning_budget_message: Option<String>,
    /// deltascope's: what a degenerate loop does (`off`, `stop`, or `answer`: a loop in
    /// thinking forces the end of thinking so that the model answers).
    on_loop: Option<String>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    // What deltascope does not do: refused unless at its harmless value.
    n: Option<Value>,
    best_of: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    response_format: Option<Value>,
    suffix: Option<Value>,
    /// The legacy API's prompt echo (no prompt logprobs here to go with it).
    echo: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or a list of strings")]
enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// `POST /v1/chat/completions`'s own fields. (Read from the body apart from [`Common`] rather
/// than through `#[serde(flatten)]`, which would lose the path of a wrong field.)
#[derive(Debug, Deserialize)]
struct ChatBody {
    messages: Option<Vec<Message>>,
    logprobs: Option<bool>,
    top_logprobs: Option<i64>,
    chat_template_kwargs: Option<TemplateKwargs>,
    separate_reasoning: Option<bool>,
}

#[derive(Debug, Deserialize)]
struct Message {
    role: MessageRole,
    /// `reasoning_content` on an assistant turn is accepted and dropped, as the template does
    /// with earlier turns' thinking.
    content: Option<Content>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum MessageRole {
    #[serde(alias = "developer")]
    System,
    User,
    Assistant,
}

/// Message text: a string, or OpenAI's list of `{"type": "text", "text": …}` parts.
#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = r#"a string or a list of text parts ({"type": "text", "text": …})"#)]
enum Content {
    Text(String),
    Parts(Vec<TextPart>),
}

#[derive(Debug, Deserialize)]
struct TextPart {
    #[serde(rename = "type")]
    _kind: TextKind,
    text: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "lowercase")]
enum TextKind {
    Text,
}

#[derive(Debug, Deserialize)]
struct TemplateKwargs {
    enable_thinking: Option<bool>,
}

/// `POST /v1/completions`' own fields: a raw prompt, text or token ids (no template).
#[derive(Debug, Deserialize)]
struct CompletionBody {
    prompt: Option<RawPrompt>,
    /// The legacy API's number of alternatives (`true` reads as 1).
    logprobs: Option<LegacyLogprobs>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a string or a list of token ids")]
enum RawPrompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
}

#[derive(Debug, Deserialize)]
#[serde(untagged, expecting = "a whole number of alternatives, or a boolean")]
enum LegacyLogprobs {
    Count(i64),
    Flag(bool),
}

/// The body as `T`: a wrong type is a 400 naming the field by its path (`messages[0].role`).
fn body<T: DeserializeOwned>(body: &Map<String, Value>) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(Value::Object(body.clone())).map_err(|e| {
        let path = e.path().to_string();
        let message = plain_types(&e.inner().to_string());
        match path.as_str() {
            "." => ApiError::bad(None, message),
            p => ApiError::bad(Some(p), format!("{p}: {message}")),
        }
    })
}

/// serde's words for Rust types, in the words of a JSON API.
fn plain_types(message: &str) -> String {
    [
        ("expected f32", "expected a number"),
        ("expected i64", "expected a whole number"),
        ("expected u32", "expected a token id (a whole number from 0 to 4294967295)"),
        ("floating point", "the number"),
    ]
    .iter()
    .fold(message.to_string(), |m, (serde_words, ours)| m.replace(serde_words, ours))
}

fn out_of_range(name: &str, value: i64, field: &str) -> ApiError {
    let expected = range(field).map_or("in range", |r| r.expected);
    ApiError::bad(Some(name), format!("{name} is {value}: must be {expected}"))
}

/// A count (whole and ≥ 0); a negative one is refused in the words of the range table.
fn count(value: Option<i64>, name: &str, field: &str) -> Result<Option<usize>, ApiError> {
    match value {
        Some(x) if x < 0 => Err(out_of_range(name, x, field)),
        x => Ok(x.map(|x| x as usize)),
    }
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
        ApiError::bad(Some(name), format!("{name} is {}: {}", e.value, e.must()))
    })
}

/// What the shared fields ask for, before the endpoint's own.
struct Settings {
    params: GenerationParams,
    names: Names,
    max_tokens_given: bool,
    stream: bool,
    include_usage: bool,
}

impl Common {
    fn refuse_unsupported(&self) -> Result<(), ApiError> {
        let one = |v: &Option<Value>| v.as_ref().is_none_or(|v| v.is_null() || v.as_i64() == Some(1));
        for (name, ok) in [
            ("n", one(&self.n)),
            ("best_of", one(&self.best_of)),
            ("tools", self.tools.as_ref().is_none_or(|v| v.is_null() || v.as_array().is_some_and(Vec::is_empty))),
            ("tool_choice", self.tool_choice.as_ref().is_none_or(|v| v.is_null() || v.as_str() == Some("none"))),
            (
                "response_format",
                self.response_format
                    .as_ref()
                    .is_none_or(|v| v.is_null() || v.get("type").and_then(Value::as_str) == Some("text")),
            ),
            ("suffix", self.suffix.as_ref().is_none_or(Value::is_null)),
            ("echo", self.echo.as_ref().is_none_or(|v| v.is_null() || v == &Value::Bool(false))),
        ] {
            if !ok {
                return Err(ApiError::bad(
                    Some(name),
                    format!(
                        "{name} is not supported by deltascope serve (one sequence per request, no tools, formats or prompt echo)"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The generation settings (sampling fields left out take `defaults`: the model's
    /// generation_config.json, as vLLM does). `thinking_on`: the template's switch.
    fn settings(self, defaults: &SamplingParams, thinking_on: bool) -> Result<Settings, ApiError> {
        self.refuse_unsupported()?;
        let mut p = GenerationParams { sampling: defaults.clone(), ..Default::default() };
        let mut names = Names { max_tokens: "max_tokens", budget: "thinking_budget", top_logprobs: "top_logprobs" };
        let max_completion = count(self.max_completion_tokens, "max_completion_tokens", "max_tokens")?;
        let max = count(self.max_tokens, "max_tokens", "max_tokens")?;
        if max_completion.is_some() {
            names.max_tokens = "max_completion_tokens";
        }
        let max_tokens_given = match max_completion.or(max) {
            Some(n) => {
                p.max_tokens = n;
                true
            }
            None => false,
        };
        let s = &mut p.sampling;
        for (value, slot) in [
            (self.temperature, &mut s.temperature),
            (self.top_p, &mut s.top_p),
            (self.min_p, &mut s.min_p),
            (self.presence_penalty, &mut s.presence_penalty),
            (self.frequency_penalty, &mut s.frequency_penalty),
            (self.repetition_penalty, &mut s.repetition_penalty),
        ] {
            if let Some(x) = value {
                *slot = x;
            }
        }
        match self.top_k {
            Some(-1) => s.top_k = 0,
            Some(k) if k < 0 => return Err(out_of_range("top_k", k, "sampling.top_k")),
            Some(k) => s.top_k = usize::try_from(k).unwrap_or(usize::MAX),
            None => {}
        }
        if let Some(x) = self.seed {
            s.seed = x as u64;
        }
        p.stop = match self.stop {
            None => vec![],
            Some(Stop::One(x)) => vec![x],
            Some(Stop::Many(xs)) => xs,
        };
        p.stop_token_ids = self.stop_token_ids.unwrap_or_default();
        p.ignore_eos = self.ignore_eos.unwrap_or(false);
        // Any spelling may come, several too (a client written for two servers), if they say the
        // same; -1 is unlimited and 0 thinking off (as llama-server's --reasoning-budget 0 and
        // the command line's --thinking-budget 0).
        let budgets = [
            ("thinking_budget", self.thinking_budget),
            ("thinking_token_budget", self.thinking_token_budget),
            ("reasoning_budget_tokens", self.reasoning_budget_tokens),
            ("thinking_budget_tokens", self.thinking_budget_tokens),
        ];
        let given: Vec<(&str, i64)> = budgets.into_iter().filter_map(|(name, b)| b.map(|b| (name, b))).collect();
        if let Some(&(second, b2)) = given.iter().find(|(_, b)| *b != given[0].1) {
            let (first, b1) = given[0];
            return Err(ApiError::bad(
                Some(second),
                format!("{first} is {b1} but {second} is {b2}: two thinking budgets that differ (send one)"),
            ));
        }
        let budget = match given.first().copied() {
            None | Some((_, -1)) => None,
            Some((name, b)) if b < -1 => return Err(out_of_range(name, b, "thinking_budget")),
            Some((name, b)) => {
                names.budget = name;
                Some(b as usize)
            }
        };
        p.thinking = if thinking_on { Thinking::from_budget(budget) } else { Thinking::Off };
        p.budget_bridge = self.reasoning_budget_message.unwrap_or_else(|| QWEN_BUDGET_BRIDGE.to_string());
        if let Some(o) = &self.on_loop {
            p.loop_detection.on_loop =
                o.parse().map_err(|e| ApiError::bad(Some("on_loop"), format!("on_loop: {e}")))?;
        }
        let (stream, include_usage) =
            (self.stream.unwrap_or(false), self.stream_options.and_then(|o| o.include_usage).unwrap_or(false));
        Ok(Settings { params: p, names, max_tokens_given, stream, include_usage })
    }
}

/// `POST /v1/chat/completions`.
pub fn chat(body_fields: &Map<String, Value>, context: usize, defaults: &SamplingParams) -> Result<Parsed, ApiError> {
    let common: Common = body(body_fields)?;
    let b: ChatBody = body(body_fields)?;
    let model = common.model.clone();
    let thinking_on = b.chat_template_kwargs.and_then(|k| k.enable_thinking).unwrap_or(true);
    let mut s = common.settings(defaults, thinking_on)?;
    let messages = chat_messages(b.messages)?;
    let logprobs = b.logprobs.unwrap_or(false);
    let top = count(b.top_logprobs, "top_logprobs", "top_logprobs")?.unwrap_or(0);
    if top > 0 && !logprobs {
        return Err(ApiError::bad(Some("top_logprobs"), "top_logprobs needs logprobs: true"));
    }
    s.params.top_logprobs = top;
    judge(&s.params, context, &s.names)?;
    Ok(Parsed {
        req: ChatRequest { prompt: Prompt::Chat(messages), params: s.params },
        stream: s.stream,
        include_usage: s.include_usage,
        logprobs,
        max_tokens_given: s.max_tokens_given,
        model,
        separate_reasoning: b.separate_reasoning.unwrap_or(true),
    })
}

/// The messages of a body, as the template takes them.
fn chat_messages(messages: Option<Vec<Message>>) -> Result<Vec<ChatMessage>, ApiError> {
    let messages = match messages {
        Some(m) if !m.is_empty() => m,
        Some(_) => return Err(ApiError::bad(Some("messages"), "messages is empty")),
        None => return Err(ApiError::bad(Some("messages"), "messages is required")),
    };
    messages
        .into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role {
                MessageRole::System => Role::System,
                MessageRole::User => Role::User,
                MessageRole::Assistant => Role::Assistant,
            };
            let content = match m.content {
                // Without tools (refused) no message is without text; an empty turn is "".
                None => {
                    let path = format!("messages[{i}].content");
                    return Err(ApiError::bad(
                        Some(&path),
                        format!("{path} is null or missing: every message needs its text (a string, \"\" for none)"),
                    ));
                }
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => parts.into_iter().map(|p| p.text).collect(),
            };
            Ok(ChatMessage::new(role, content))
        })
        .collect()
}

/// `POST /apply-template` (llama-server's shape): the messages and the template's
/// `enable_thinking` (default on).
pub fn template(body_fields: &Map<String, Value>) -> Result<(Vec<ChatMessage>, bool), ApiError> {
    let b: ChatBody = body(body_fields)?;
    let thinking = b.chat_template_kwargs.and_then(|k| k.enable_thinking).unwrap_or(true);
    Ok((chat_messages(b.messages)?, thinking))
}

#[derive(Debug, Deserialize)]
struct TokenizeBody {
    content: String,
}

/// `POST /tokenize` (llama-server's shape): the text to tokenise, special tokens parsed.
pub fn tokenize(body_fields: &Map<String, Value>) -> Result<String, ApiError> {
    Ok(body::<TokenizeBody>(body_fields)?.content)
}

/// `POST /v1/completions`: a raw prompt, text or token ids (no template).
pub fn completion(
    body_fields: &Map<String, Value>,
    context: usize,
    defaults: &SamplingParams,
) -> Result<Parsed, ApiError> {
    let common: Common = body(body_fields)?;
    let b: CompletionBody = body(body_fields)?;
    let model = common.model.clone();
    let mut s = common.settings(defaults, true)?;
    let prompt = match b.prompt {
        None => return Err(ApiError::bad(Some("prompt"), "prompt is required")),
        Some(RawPrompt::Text(t)) if t.is_empty() => return Err(ApiError::bad(Some("prompt"), "prompt is empty")),
        Some(RawPrompt::Text(t)) => Prompt::Text(t),
        Some(RawPrompt::Ids(ids)) if ids.is_empty() => {
            return Err(ApiError::bad(Some("prompt"), "prompt is empty"));
        }
        Some(RawPrompt::Ids(ids)) => Prompt::Ids(ids),
        Some(RawPrompt::Texts(mut t)) => match t.len() {
            1 if !t[0].is_empty() => Prompt::Text(t.remove(0)),
            0 | 1 => return Err(ApiError::bad(Some("prompt"), "prompt is empty")),
            _ => {
                return Err(ApiError::bad(Some("prompt"), "one prompt per request (a list of prompts is a batch)"));
            }
        },
    };
    let n = match b.logprobs {
        None => None,
        Some(LegacyLogprobs::Flag(f)) => Some(usize::from(f)),
        Some(LegacyLogprobs::Count(n)) => count(Some(n), "logprobs", "top_logprobs")?,
    };
    s.params.top_logprobs = n.unwrap_or(0);
    s.names.top_logprobs = "logprobs";
    judge(&s.params, context, &s.names)?;
    Ok(Parsed {
        req: ChatRequest { prompt, params: s.params },
        stream: s.stream,
        include_usage: s.include_usage,
        logprobs: n.is_some(),
        max_tokens_given: s.max_tokens_given,
        model,
        separate_reasoning: false,
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
            (g.thinking, g.budget_bridge.as_str(), g.stop.clone()),
            (Thinking::Off, "ok.", vec!["END".to_string()])
        );
        assert!(p.stream && p.include_usage && p.logprobs && p.max_tokens_given);
        let Prompt::Chat(m) = &p.req.prompt else { panic!("a chat prompt") };
        assert_eq!(m.len(), 4);
        assert_eq!((m[1].content.as_str(), m[2].reasoning.clone()), ("hi", None));
    }

    #[test]
    fn budget_spellings_and_thinking() {
        let with = |extra: &str| {
            parse(&format!(r#"{{"messages": [{{"role": "user", "content": "x"}}]{extra}}}"#)).map(|p| p.req.params)
        };
        assert_eq!(with("").unwrap().thinking, Thinking::Unlimited);
        for name in ["thinking_budget", "thinking_token_budget", "reasoning_budget_tokens", "thinking_budget_tokens"] {
            assert_eq!(with(&format!(r#", "{name}": 16"#)).unwrap().thinking.budget(), Some(16), "{name}");
            assert_eq!(with(&format!(r#", "{name}": -1"#)).unwrap().thinking, Thinking::Unlimited, "{name}");
            // 0 is thinking off, as on the command line and in llama.cpp.
            assert_eq!(with(&format!(r#", "{name}": 0"#)).unwrap().thinking, Thinking::Off, "{name}");
            let e = with(&format!(r#", "{name}": -2"#)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(name), "{}", e.message);
            let e = with(&format!(r#", "{name}": 99999"#)).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(name), "{}", e.message);
        }
        // Both spellings of max_tokens may come together; max_completion_tokens counts.
        let p = with(r#", "max_tokens": 5, "max_completion_tokens": 7"#).unwrap();
        assert_eq!(p.max_tokens, 7);
        let e = with(r#", "max_tokens": 5, "max_completion_tokens": 99999"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("max_completion_tokens"), "{}", e.message);
        // Two spellings that agree are one budget; two that differ are refused, naming the second.
        assert_eq!(
            with(r#", "thinking_budget": 16, "thinking_token_budget": 16"#).unwrap().thinking.budget(),
            Some(16)
        );
        let e = with(r#", "thinking_budget": 16, "reasoning_budget_tokens": 32"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("reasoning_budget_tokens"), "{}", e.message);
        assert!(e.message.contains("thinking_budget is 16 but reasoning_budget_tokens is 32"), "{}", e.message);
        let e = with(r#", "temperature": "hot""#).unwrap_err();
        assert!(e.message.contains("expected a number"), "{}", e.message);
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
            (r#"{"messages": [{"role": "user", "content": null}]}"#, "messages[0].content"),
            (r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]}"#, "messages[1].content"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "echo": true}"#, "echo"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "stop_token_ids": [-1]}"#, "stop_token_ids[0]"),
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
