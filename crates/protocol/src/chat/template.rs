//! Chat templates rendered with minijinja exactly as transformers' `apply_chat_template`
//! renders them with jinja2: `trim_blocks` and `lstrip_blocks` on, Python string methods
//! (pycompat), `raise_exception`, and transformers' own `tojson` (Python `json.dumps`
//! formatting, `ensure_ascii=False`).

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use serde_json::Value as Json;

use deltascope_model::ModelSource;
use deltascope_model::{Error, Result};

/// Used when a model ships no template: Qwen's ChatML, with the thinking switch when the
/// tokenizer has `<think>` tokens.
pub(crate) const BUILTIN_CHATML: &str = include_str!("chatml.jinja");

const TEMPLATE_NAME: &str = "chat";

pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where the template came from (for messages and `--dry-run`).
    pub source_name: String,
    /// Special token strings passed to the template (`bos_token`, `eos_token`, …).
    specials: serde_json::Map<String, Json>,
    has_thinking: bool,
}

/// What to render besides the messages.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    pub add_generation_prompt: bool,
    /// `None` leaves the variable undefined (the template's default: thinking on).
    pub enable_thinking: Option<bool>,
    pub preserve_thinking: Option<bool>,
    pub tools: Option<Json>,
    /// Any further template variables.
    pub extra: serde_json::Map<String, Json>,
}

impl ChatTemplate {
    pub fn new(source: &str, source_name: &str) -> Result<Self> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| tmpl_err(source_name, &e))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> std::result::Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_string()).map_err(|e| tmpl_err(source_name, &e))?;
        Ok(ChatTemplate { env, source_name: source_name.to_string(), specials: Default::default(), has_thinking: true })
    }

    /// The model's template: `chat_template.jinja`, else `tokenizer_config.json`'s
    /// `chat_template` (a string, or a list of named templates: "default"), else the built-in
    /// ChatML. Special-token strings come from `tokenizer_config.json`.
    pub fn load(source: &ModelSource, has_thinking: bool) -> Result<Self> {
        let tok_cfg = source.read_json("tokenizer_config.json")?;
        let cfg_label = source.file_label("tokenizer_config.json");
        let (text, name) = if let Some(t) = source.read_string("chat_template.jinja")? {
            (t, source.file_label("chat_template.jinja"))
        } else {
            match tok_cfg.as_ref().and_then(|c| c.get("chat_template")) {
                Some(Json::String(s)) => (s.clone(), format!("{cfg_label} (chat_template)")),
                Some(Json::Array(list)) => {
                    let found = list
                        .iter()
                        .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                        .and_then(|t| t.get("template"))
                        .and_then(Json::as_str);
                    match found {
                        Some(s) => (s.to_string(), format!("{cfg_label} (chat_template \"default\")")),
                        None => {
                            return Err(Error::field(
                                &cfg_label,
                                "chat_template",
                                "a list of templates without one named \"default\"",
                            ));
                        }
                    }
                }
                Some(Json::Null) | None => {
                    (BUILTIN_CHATML.to_string(), "built-in ChatML (the model ships no chat template)".to_string())
                }
                Some(v) => {
                    return Err(Error::field(
                        &cfg_label,
                        "chat_template",
                        format!("expected a string or a list, found {v}"),
                    ));
                }
            }
        };
        let mut t = ChatTemplate::new(&text, &name)?;
        t.has_thinking = has_thinking;
        if let Some(cfg) = tok_cfg {
            for key in ["bos_token", "eos_token", "pad_token", "unk_token"] {
                let v = match cfg.get(key) {
                    Some(Json::String(s)) => Some(s.clone()),
                    Some(Json::Object(o)) => o.get("content").and_then(Json::as_str).map(str::to_string),
                    _ => None,
                };
                if let Some(v) = v {
                    t.specials.insert(key.to_string(), Json::String(v));
                }
            }
        }
        Ok(t)
    }

    /// Renders a conversation (`messages`: a JSON list of `{role, content, reasoning_content?,
    /// tool_calls?}`).
    pub fn render(&self, messages: &Json, opts: &RenderOptions) -> Result<String> {
        let mut ctx = self.specials.clone();
        ctx.insert("messages".into(), alias_reasoning(messages));
        ctx.insert("add_generation_prompt".into(), Json::Bool(opts.add_generation_prompt));
        ctx.insert("has_thinking".into(), Json::Bool(self.has_thinking));
        if let Some(t) = &opts.tools {
            ctx.insert("tools".into(), t.clone());
        }
        if let Some(b) = opts.enable_thinking {
            ctx.insert("enable_thinking".into(), Json::Bool(b));
        }
        if let Some(b) = opts.preserve_thinking {
            ctx.insert("preserve_thinking".into(), Json::Bool(b));
        }
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        let tmpl = self.env.get_template(TEMPLATE_NAME).map_err(|e| tmpl_err(&self.source_name, &e))?;
        tmpl.render(Value::from(minijinja::value::Serde(&ctx))).map_err(|e| tmpl_err(&self.source_name, &e))
    }
}

/// transformers fills `reasoning_content` from the older `thinking` / `reasoning` names.
fn alias_reasoning(messages: &Json) -> Json {
    let mut m = messages.clone();
    if let Some(list) = m.as_array_mut() {
        for msg in list.iter_mut().filter_map(Json::as_object_mut) {
            if !msg.contains_key("reasoning_content")
                && let Some(r) = msg.get("thinking").or_else(|| msg.get("reasoning")).cloned()
            {
                msg.insert("reasoning_content".into(), r);
            }
        }
    }
    m
}

fn tmpl_err(source_name: &str, e: &minijinja::Error) -> Error {
    // A template's own raise_exception carries the whole message in `detail`.
    let message = match (e.kind(), e.detail()) {
        (ErrorKind::InvalidOperation, Some(d)) => d.to_string(),
        _ => {
            let mut s = e.to_string();
            if let Some(line) = e.line() {
                s.push_str(&format!(" (template line {line})"));
            }
            s
        }
    };
    Error::Template { source_name: source_name.to_string(), message }
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, with those keyword arguments honoured.
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, minijinja::Error> {
    let json: Json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_string(),
            None => " ".repeat(i64::try_from(v).unwrap_or(0).max(0) as usize),
        }),
    };
    let (item_sep, key_sep) = match separators {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        _ => (if indent.is_some() { ",".into() } else { ", ".into() }, ": ".into()),
    };
    let mut out = String::new();
    let style = PyJson {
        indent,
        item_sep,
        key_sep,
        ensure_ascii: ensure_ascii.unwrap_or(false),
        sort_keys: sort_keys.unwrap_or(false),
    };
    style.write(&json, 0, &mut out);
    Ok(Value::from_safe_string(out))
}

/// Python `json.dumps` formatting.
struct PyJson {
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    ensure_ascii: bool,
    sort_keys: bool,
}

impl PyJson {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, v: &Json, depth: usize, out: &mut String) {
        match v {
            Json::Null => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Number(n) => out.push_str(&n.to_string()),
            Json::String(s) => self.string(s, out),
            Json::Array(a) => {
                if a.is_empty() {
                    out.push_str("[]");
                    return;
                }
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.write(x, depth + 1, out);
                }
                self.newline(depth, out);
                out.push(']');
            }
            Json::Object(o) => {
                if o.is_empty() {
                    out.push_str("{}");
                    return;
                }
                let mut keys: Vec<&String> = o.keys().collect();
                if self.sort_keys {
                    keys.sort();
                }
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(depth + 1, out);
                    self.string(k, out);
                    out.push_str(&self.key_sep);
                    self.write(&o[k], depth + 1, out);
                }
                self.newline(depth, out);
                out.push('}');
            }
        }
    }

    fn string(&self, s: &str, out: &mut String) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tojson_matches_python_json_dumps() {
        let t = ChatTemplate::new(
            "{{ x | tojson }}|{{ x | tojson(indent=2) }}|{{ 'é\"' | tojson(ensure_ascii=true) }}",
            "test",
        )
        .unwrap();
        let out = t
            .render(
                &serde_json::json!([]),
                &RenderOptions {
                    extra: serde_json::json!({"x": {"b": [1, 2.5], "a": "ü"}}).as_object().unwrap().clone(),
                    ..Default::default()
                },
            )
            .unwrap();
        assert_eq!(
            out,
            "{\"b\": [1, 2.5], \"a\": \"ü\"}|{\n  \"b\": [\n    1,\n    2.5\n  ],\n  \"a\": \"ü\"\n}|\"\\u00e9\\\"\""
        );
    }

    #[test]
    fn raise_exception_message_is_kept() {
        let t = ChatTemplate::new("{{ raise_exception('No user query found in messages.') }}", "test").unwrap();
        let e = t.render(&serde_json::json!([]), &RenderOptions::default()).unwrap_err().to_string();
        assert_eq!(e, "chat template (test): No user query found in messages.");
    }
}
