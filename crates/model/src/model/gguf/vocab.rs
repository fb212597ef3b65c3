//! The tokenizer files a GGUF implies: a Hugging Face `tokenizer.json`, `tokenizer_config.json`
//! and `generation_config.json` rebuilt from the `tokenizer.*` metadata that llama.cpp's
//! converter (`convert_hf_to_gguf.py`: `TextModel._set_vocab_gpt2` and gguf-py's
//! `SpecialVocab`) wrote, so that the tokenizer, the stop ids and the chat template of a GGUF
//! are read by the same code as a checkpoint folder's.
//!
//! Only what every Qwen GGUF uses is rebuilt: `tokenizer.ggml.model` "gpt2" (byte-level BPE)
//! with the pre-tokenizers "qwen2" and "qwen35". The result is laid out as the `tokenizer.json`
//! those models ship: NFC, the model's split regex then ByteLevel, a BPE without byte
//! fallback, and the converter's control and user-defined tokens as added tokens.
//!
//! What the GGUF cannot say: the converter writes an HF added token as CONTROL when it is
//! `special` *or* looks special (`<|...|>`), else USER_DEFINED. So CONTROL becomes
//! `special: true` and USER_DEFINED `special: false`, and an added `<|...|>` token that the
//! original marked `special: false` (Qwen's `<|fim_prefix|>`, `<|repo_name|>`, …) comes back
//! special, as llama.cpp treats it too. That flag only matters to decoding with
//! `skip_special_tokens`; the ids of every encoding are the same. Unused padding rows
//! (`[PAD506]`, type UNUSED) are left out, as the original vocabulary never had them.
//!
//! Hostile metadata (wrong value types, ids out of range, merges that are not "a b", tokens
//! that repeat) is an error naming the key and what was expected and found, never a panic.

use std::collections::HashMap;

use serde_json::{Map, Value as Json, json};

use super::{Gguf, Value};

/// What is wrong with a GGUF's tokenizer metadata: the key, and what was expected and found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GGUF metadata {key}: {what}")]
pub struct VocabError {
    pub key: String,
    pub what: String,
}

fn err(key: &str, what: impl Into<String>) -> VocabError {
    VocabError { key: key.to_string(), what: what.into() }
}

const MODEL: &str = "tokenizer.ggml.model";
const PRE: &str = "tokenizer.ggml.pre";
const TOKENS: &str = "tokenizer.ggml.tokens";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const MERGES: &str = "tokenizer.ggml.merges";
const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const LOWERCASE: &str = "tokenizer.ggml.normalizer.lowercase";
const STRIP_ACCENTS: &str = "tokenizer.ggml.normalizer.strip_accents";
const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
const CHAT_TEMPLATES: &str = "tokenizer.chat_templates";

/// gguf-py's `TokenType`.
const NORMAL: u8 = 1;
const CONTROL: u8 = 3;
const USER_DEFINED: u8 = 4;
const UNUSED: u8 = 5;

/// The split regexes of the `tokenizer.json` the models ship (llama.cpp's `llama-vocab.cpp`
/// quotes them as "original regex from tokenizer.json" beside its own rewrite).
const QWEN2_REGEX: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const KNOWN_PRE: &str = "\"qwen2\", \"qwen35\"";

/// Texts of the tokens llama.cpp (b11434, `llama_vocab::impl::load`) ends generation on besides
/// the eos id, found by their text; its fill-in-the-middle stops (`<|fim_pad|>`,
/// `<|repo_name|>`, `<|file_sep|>`) are left out: they end infill, not a chat turn.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// A string from the file, quoted and escaped, at most 40 characters.
fn shown(s: &str) -> String {
    let mut out: String = s.chars().take(40).collect::<String>().escape_debug().collect();
    if s.chars().count() > 40 {
        out.push('…');
    }
    format!("\"{out}\"")
}

/// What a metadata value is, for messages: "the u32 7", "the string \"x\"", "an array of 3".
fn describe(v: &Value) -> String {
    match v {
        Value::U8(x) => format!("the u8 {x}"),
        Value::I8(x) => format!("the i8 {x}"),
        Value::U16(x) => format!("the u16 {x}"),
        Value::I16(x) => format!("the i16 {x}"),
        Value::U32(x) => format!("the u32 {x}"),
        Value::I32(x) => format!("the i32 {x}"),
        Value::U64(x) => format!("the u64 {x}"),
        Value::I64(x) => format!("the i64 {x}"),
        Value::F32(x) => format!("the f32 {x}"),
        Value::F64(x) => format!("the f64 {x}"),
        Value::Bool(b) => format!("the bool {b}"),
        Value::Str(s) => format!("the string {}", shown(s)),
        Value::Array(a) => format!("an array of {} items", a.len()),
    }
}

fn string<'a>(g: &'a Gguf, key: &str) -> Result<Option<&'a str>, VocabError> {
    match g.get(key) {
        None => Ok(None),
        Some(Value::Str(s)) => Ok(Some(s)),
        Some(v) => Err(err(key, format!("expected a string, found {}", describe(v)))),
    }
}

fn flag(g: &Gguf, key: &str) -> Result<Option<bool>, VocabError> {
    match g.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(err(key, format!("expected a bool, found {}", describe(v)))),
    }
}

fn array<'a>(g: &'a Gguf, key: &str, of: &str) -> Result<Option<&'a [Value]>, VocabError> {
    match g.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(v) => Err(err(key, format!("expected an array of {of}, found {}", describe(v)))),
    }
}

fn strings<'a>(g: &'a Gguf, key: &str) -> Result<Option<Vec<&'a str>>, VocabError> {
    let Some(items) = array(g, key, "strings")? else { return Ok(None) };
    items
        .iter()
        .enumerate()
        .map(|(i, v)| v.as_str().ok_or_else(|| err(key, format!("item {i} is {}, expected a string", describe(v)))))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The vocabulary: every token's text and type, by id.
struct Vocab<'a> {
    tokens: Vec<&'a str>,
    types: Vec<u8>,
}

impl Vocab<'_> {
    /// The tokens, their types (CONTROL / USER_DEFINED / NORMAL / UNUSED; a gpt2 vocabulary
    /// has no UNKNOWN or BYTE tokens) and the text → id index of the used ones, checked.
    fn read(g: &Gguf) -> Result<(Vocab<'_>, HashMap<&str, u32>), VocabError> {
        let tokens = strings(g, TOKENS)?.ok_or_else(|| err(TOKENS, "missing: the GGUF has no vocabulary"))?;
        if tokens.is_empty() {
            return Err(err(TOKENS, "is empty: the GGUF has no vocabulary"));
        }
        let raw = array(g, TOKEN_TYPE, "token types")?.ok_or_else(|| {
            err(
                TOKEN_TYPE,
                "missing: without the token types the control tokens (<|im_start|>, …) cannot be told from text",
            )
        })?;
        if raw.len() != tokens.len() {
            return Err(err(
                TOKEN_TYPE,
                format!("has {} items, but {TOKENS} has {}: one type per token expected", raw.len(), tokens.len()),
            ));
        }
        let mut types = Vec::with_capacity(raw.len());
        for (i, v) in raw.iter().enumerate() {
            let t = match v.as_u64() {
                Some(t @ (1 | 3 | 4 | 5)) => t as u8,
                Some(t @ (2 | 6)) => {
                    let name = if t == 2 { "unknown" } else { "byte" };
                    return Err(err(
                        TOKEN_TYPE,
                        format!(
                            "token {i} {} has type {t} ({name}), which a gpt2 (byte-level BPE) vocabulary does not use",
                            shown(tokens[i])
                        ),
                    ));
                }
                _ => {
                    return Err(err(
                        TOKEN_TYPE,
                        format!(
                            "item {i} is {}, expected a token type (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)",
                            describe(v)
                        ),
                    ));
                }
            };
            types.push(t);
        }
        let mut index: HashMap<&str, u32> = HashMap::with_capacity(tokens.len());
        for (i, (t, ty)) in tokens.iter().zip(&types).enumerate() {
            if *ty == UNUSED {
                continue;
            }
            if let Some(first) = index.insert(t, i as u32) {
                return Err(err(
                    TOKENS,
                    format!("token {i} {} repeats token {first}: a token's text must be unique", shown(t)),
                ));
            }
        }
        // Byte-level BPE spells every byte as one printable character; text with a byte whose
        // character is not a token could not be encoded.
        for (byte, c) in byte_level_alphabet() {
            let mut buf = [0u8; 4];
            if !index.contains_key(&*c.encode_utf8(&mut buf)) {
                return Err(err(
                    TOKENS,
                    format!(
                        "the byte-level character {c:?} (byte 0x{byte:02x}) is not a token: not a byte-level BPE vocabulary"
                    ),
                ));
            }
        }
        Ok((Vocab { tokens, types }, index))
    }

    /// A special token id at `key`, checked against the vocabulary (`None`: not in the file).
    fn id(&self, g: &Gguf, key: &str) -> Result<Option<u32>, VocabError> {
        let Some(v) = g.get(key) else { return Ok(None) };
        let id = v.as_u64().ok_or_else(|| err(key, format!("expected a token id, found {}", describe(v))))?;
        let Some(ty) = usize::try_from(id).ok().and_then(|i| self.types.get(i)) else {
            return Err(err(key, format!("is {id}, but the vocabulary has {} tokens", self.tokens.len())));
        };
        if *ty == UNUSED {
            return Err(err(key, format!("is {id}, an unused token ({})", shown(self.tokens[id as usize]))));
        }
        Ok(Some(id as u32))
    }
}

/// GPT-2's byte → printable character table (bytes in order).
fn byte_level_alphabet() -> Vec<(u8, char)> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut next = 256u32;
    (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            (b as u8, char::from_u32(c).unwrap_or('\u{fffd}'))
        })
        .collect()
}

/// `tokenizer.json` as the model shipped it, rebuilt from the GGUF's `tokenizer.ggml.*` keys.
pub fn tokenizer_json(g: &Gguf) -> Result<String, VocabError> {
    let model = string(g, MODEL)?.ok_or_else(|| err(MODEL, "missing: the GGUF names no tokenizer"))?;
    if model != "gpt2" {
        return Err(err(
            MODEL,
            format!("is {}: deltascope rebuilds only \"gpt2\" (byte-level BPE) tokenizers", shown(model)),
        ));
    }
    let pre = string(g, PRE)?
        .ok_or_else(|| err(PRE, format!("missing: the split regex cannot be known (deltascope knows {KNOWN_PRE})")))?;
    let regex = match pre {
        "qwen2" => QWEN2_REGEX,
        "qwen35" => QWEN35_REGEX,
        other => {
            return Err(err(
                PRE,
                format!("is {}: an unknown pre-tokenizer (deltascope knows {KNOWN_PRE})", shown(other)),
            ));
        }
    };
    for key in [LOWERCASE, STRIP_ACCENTS] {
        if flag(g, key)? == Some(true) {
            return Err(err(key, "is true: a byte-level BPE tokenizer is rebuilt with NFC only"));
        }
    }
    let (vocab, index) = Vocab::read(g)?;

    let merge_list = strings(g, MERGES)?.ok_or_else(|| err(MERGES, "missing: a byte-level BPE needs its merges"))?;
    // Added tokens a merge builds or consumes belong to the BPE's own vocabulary too.
    let mut in_model: Vec<bool> = vocab.types.iter().map(|&t| t == NORMAL).collect();
    let mut merges = Vec::with_capacity(merge_list.len());
    for (i, m) in merge_list.iter().enumerate() {
        let (a, b) = match m.split_once(' ') {
            Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains(' ') => (a, b),
            _ => {
                return Err(err(
                    MERGES,
                    format!("merge {i} is {}: expected two tokens separated by one space", shown(m)),
                ));
            }
        };
        for part in [a.to_string(), b.to_string(), format!("{a}{b}")] {
            match index.get(part.as_str()) {
                Some(&id) => in_model[id as usize] = true,
                None => {
                    return Err(err(MERGES, format!("merge {i} {}: {} is not a token", shown(m), shown(&part))));
                }
            }
        }
        merges.push(json!([a, b]));
    }

    let mut model_vocab = Map::with_capacity(vocab.tokens.len());
    let mut added = vec![];
    for (id, (&t, &ty)) in vocab.tokens.iter().zip(&vocab.types).enumerate() {
        if in_model[id] {
            model_vocab.insert(t.to_string(), json!(id));
        }
        if ty == CONTROL || ty == USER_DEFINED {
            added.push(json!({
                "id": id,
                "content": t,
                "single_word": false,
                "lstrip": false,
                "rstrip": false,
                "normalized": false,
                "special": ty == CONTROL,
            }));
        }
    }

    let post_processor = post_processor(g, &vocab)?;
    let out = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
                {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
            ],
        },
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE",
            "dropout": null,
            "unk_token": null,
            "continuing_subword_prefix": null,
            "end_of_word_suffix": null,
            "fuse_unk": false,
            "byte_fallback": false,
            "ignore_merges": false,
            "vocab": model_vocab,
            "merges": merges,
        },
    });
    Ok(out.to_string())
}

/// The BOS / EOS the GGUF says to add around a sequence (`add_bos_token`, `add_eos_token`) as
/// the `TemplateProcessing` an HF tokenizer does it with; `null` when nothing is added (Qwen).
fn post_processor(g: &Gguf, vocab: &Vocab) -> Result<Json, VocabError> {
    let mut around = vec![];
    for (add_key, id_key) in [(ADD_BOS, BOS_ID), (ADD_EOS, EOS_ID)] {
        if flag(g, add_key)? != Some(true) {
            around.push(None);
            continue;
        }
        let id = vocab.id(g, id_key)?.ok_or_else(|| err(add_key, format!("is true, but {id_key} is missing")))?;
        around.push(Some((vocab.tokens[id as usize], id)));
    }
    let (bos, eos) = (around[0], around[1]);
    if bos.is_none() && eos.is_none() {
        return Ok(Json::Null);
    }
    let special = |t: &str, type_id: u32| json!({"SpecialToken": {"id": t, "type_id": type_id}});
    let sequence = |s: &str, type_id: u32| json!({"Sequence": {"id": s, "type_id": type_id}});
    let one = |s: &str, type_id: u32| {
        let mut v = vec![];
        v.extend(bos.map(|(t, _)| special(t, type_id)));
        v.push(sequence(s, type_id));
        v.extend(eos.map(|(t, _)| special(t, type_id)));
        v
    };
    let mut pair = one("A", 0);
    pair.extend(one("B", 1));
    let mut tokens = Map::new();
    for (t, id) in [bos, eos].into_iter().flatten() {
        tokens.insert(t.to_string(), json!({"id": t, "ids": [id], "tokens": [t]}));
    }
    Ok(json!({"type": "TemplateProcessing", "single": one("A", 0), "pair": pair, "special_tokens": tokens}))
}

/// `tokenizer_config.json`: the chat template and the special tokens' texts, as far as the GGUF
/// says (a key it does not say is left out).
pub fn tokenizer_config_json(g: &Gguf) -> Result<String, VocabError> {
    let (vocab, _) = Vocab::read(g)?;
    let mut out = Map::new();
    for (key, name) in [(ADD_BOS, "add_bos_token"), (ADD_EOS, "add_eos_token")] {
        if let Some(b) = flag(g, key)? {
            out.insert(name.into(), json!(b));
        }
    }
    for (key, name) in [(BOS_ID, "bos_token"), (EOS_ID, "eos_token"), (PAD_ID, "pad_token"), (UNK_ID, "unk_token")] {
        if let Some(id) = vocab.id(g, key)? {
            out.insert(name.into(), json!(vocab.tokens[id as usize]));
        }
    }
    if let Some(t) = chat_template(g)? {
        out.insert("chat_template".into(), t);
    }
    Ok(Json::Object(out).to_string())
}

/// `tokenizer.chat_template`, or with named templates (`tokenizer.chat_templates` naming
/// `tokenizer.chat_template.NAME`) the list of `{name, template}` transformers writes, the
/// default first.
fn chat_template(g: &Gguf) -> Result<Option<Json>, VocabError> {
    let default = string(g, CHAT_TEMPLATE)?;
    let Some(names) = strings(g, CHAT_TEMPLATES)? else { return Ok(default.map(|t| json!(t))) };
    let mut list = vec![];
    if let Some(t) = default {
        list.push(json!({"name": "default", "template": t}));
    }
    for name in names {
        let key = format!("{CHAT_TEMPLATE}.{name}");
        let t = string(g, &key)?
            .ok_or_else(|| err(CHAT_TEMPLATES, format!("names the template {}, but {key} is missing", shown(name))))?;
        list.push(json!({"name": name, "template": t}));
    }
    Ok(Some(Json::Array(list)))
}

/// `generation_config.json`: `bos_token_id`, `eos_token_id`, `pad_token_id` from the GGUF's ids.
/// `eos_token_id` lists the eos id and then the control tokens llama.cpp also ends generation
/// on by their text (for Qwen `<|im_end|>` and `<|endoftext|>`: what Qwen's own
/// generation_config.json lists). `None` when the GGUF names none of them; an id that is not
/// a token is left out here (`tokenizer_config_json` says what is wrong with it).
pub fn generation_config_json(g: &Gguf) -> Option<String> {
    let vocab = Vocab::read(g).ok().map(|(v, _)| v);
    let id = |key: &str| match &vocab {
        Some(v) => v.id(g, key).ok().flatten(),
        None => None,
    };
    let mut out = Map::new();
    if let Some(b) = id(BOS_ID) {
        out.insert("bos_token_id".into(), json!(b));
    }
    let mut eos: Vec<u32> = id(EOS_ID).into_iter().collect();
    if let Some(v) = &vocab {
        for (i, (t, &ty)) in v.tokens.iter().zip(&v.types).enumerate() {
            if (ty == CONTROL || ty == USER_DEFINED) && EOG_TEXTS.contains(t) && !eos.contains(&(i as u32)) {
                eos.push(i as u32);
            }
        }
    }
    match eos.as_slice() {
        [] => {}
        [one] => {
            out.insert("eos_token_id".into(), json!(one));
        }
        many => {
            out.insert("eos_token_id".into(), json!(many));
        }
    }
    if let Some(p) = id(PAD_ID) {
        out.insert("pad_token_id".into(), json!(p));
    }
    (!out.is_empty()).then(|| Json::Object(out).to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A small byte-level vocabulary: the 256 byte characters (ids 0–255), "ab" (256), three
    /// added tokens, an unused row; merges "a b".
    fn metadata() -> BTreeMap<String, Value> {
        let mut tokens: Vec<Value> =
            byte_level_alphabet().into_iter().map(|(_, c)| Value::Str(c.to_string())).collect();
        let mut types = vec![Value::I32(1); 256];
        for (t, ty) in [("ab", 1), ("<|im_start|>", 3), ("<|im_end|>", 3), ("<think>", 4), ("[PAD260]", 5)] {
            tokens.push(Value::Str(t.into()));
            types.push(Value::I32(ty));
        }
        let s = |v: &str| Value::Str(v.into());
        BTreeMap::from([
            (MODEL.into(), s("gpt2")),
            (PRE.into(), s("qwen35")),
            (TOKENS.into(), Value::Array(tokens)),
            (TOKEN_TYPE.into(), Value::Array(types)),
            (MERGES.into(), Value::Array(vec![s("a b")])),
            (EOS_ID.into(), Value::U32(258)),
            (PAD_ID.into(), Value::U32(257)),
            (ADD_BOS.into(), Value::Bool(false)),
            (CHAT_TEMPLATE.into(), s("{{ messages }}")),
        ])
    }

    fn gguf(metadata: BTreeMap<String, Value>) -> Gguf {
        Gguf { version: 3, metadata, tensors: vec![], alignment: 32, data_offset: 0 }
    }

    /// The error of `f` on the metadata with `key` set to `v` (`None`: removed).
    fn with<T: std::fmt::Debug>(key: &str, v: Option<Value>, f: fn(&Gguf) -> Result<T, VocabError>) -> VocabError {
        let mut m = metadata();
        match v {
            Some(v) => m.insert(key.into(), v),
            None => m.remove(key),
        };
        let e = f(&gguf(m)).unwrap_err();
        assert!(e.to_string().starts_with(&format!("GGUF metadata {key}: ")), "{e}");
        e
    }

    fn parse(s: &str) -> Json {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn a_small_vocabulary_rebuilds() {
        let g = gguf(metadata());
        let t = parse(&tokenizer_json(&g).unwrap());
        assert_eq!(t["model"]["vocab"].as_object().unwrap().len(), 257);
        assert_eq!(t["model"]["vocab"]["ab"], 256);
        assert_eq!(t["model"]["merges"], json!([["a", "b"]]));
        assert_eq!(t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], QWEN35_REGEX);
        let added: Vec<(u64, &str, bool)> = t["added_tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| (a["id"].as_u64().unwrap(), a["content"].as_str().unwrap(), a["special"].as_bool().unwrap()))
            .collect();
        assert_eq!(added, [(257, "<|im_start|>", true), (258, "<|im_end|>", true), (259, "<think>", false)]);
        assert_eq!(t["post_processor"], Json::Null);
        let c = parse(&tokenizer_config_json(&g).unwrap());
        assert_eq!(
            c,
            json!({"add_bos_token": false, "eos_token": "<|im_end|>", "pad_token": "<|im_start|>", "chat_template": "{{ messages }}"})
        );
        let gen_cfg = parse(&generation_config_json(&g).unwrap());
        assert_eq!(gen_cfg, json!({"eos_token_id": 258, "pad_token_id": 257}));
    }

    #[test]
    fn qwen2_has_its_own_regex_and_bos_is_added_when_asked() {
        let mut m = metadata();
        m.insert(PRE.into(), Value::Str("qwen2".into()));
        m.insert(ADD_BOS.into(), Value::Bool(true));
        m.insert(BOS_ID.into(), Value::U32(257));
        let t = parse(&tokenizer_json(&gguf(m)).unwrap());
        assert_eq!(t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"], QWEN2_REGEX);
        assert_eq!(t["post_processor"]["single"][0]["SpecialToken"]["id"], "<|im_start|>");
        assert_eq!(t["post_processor"]["special_tokens"]["<|im_start|>"]["ids"], json!([257]));
    }

    #[test]
    fn eog_tokens_join_the_eos_id() {
        let mut m = metadata();
        if let Some(Value::Array(t)) = m.get_mut(TOKENS) {
            t[259] = Value::Str("<|endoftext|>".into());
        }
        let gen_cfg = parse(&generation_config_json(&gguf(m)).unwrap());
        assert_eq!(gen_cfg["eos_token_id"], json!([258, 259]));
        // Without the ids, <|im_end|> is still found by its text; without it too, no file.
        let mut m = metadata();
        m.remove(EOS_ID);
        m.remove(PAD_ID);
        assert_eq!(generation_config_json(&gguf(m.clone())).as_deref(), Some(r#"{"eos_token_id":258}"#));
        if let Some(Value::Array(t)) = m.get_mut(TOKENS) {
            t[258] = Value::Str("<|other|>".into());
        }
        assert_eq!(generation_config_json(&gguf(m)), None);
    }

    #[test]
    fn named_chat_templates_become_a_list() {
        let mut m = metadata();
        m.insert(CHAT_TEMPLATES.into(), Value::Array(vec![Value::Str("tool_use".into())]));
        m.insert(format!("{CHAT_TEMPLATE}.tool_use"), Value::Str("T".into()));
        let c = parse(&tokenizer_config_json(&gguf(m)).unwrap());
        assert_eq!(
            c["chat_template"],
            json!([{"name": "default", "template": "{{ messages }}"}, {"name": "tool_use", "template": "T"}])
        );
        let mut m = metadata();
        m.insert(CHAT_TEMPLATES.into(), Value::Array(vec![Value::Str("gone".into())]));
        let e = tokenizer_config_json(&gguf(m)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "GGUF metadata tokenizer.chat_templates: names the template \"gone\", but tokenizer.chat_template.gone is missing"
        );
    }

    #[test]
    fn unknown_models_and_pre_tokenizers_are_named() {
        let e = with(MODEL, Some(Value::Str("llama".into())), tokenizer_json);
        assert_eq!(e.what, "is \"llama\": deltascope rebuilds only \"gpt2\" (byte-level BPE) tokenizers");
        let e = with(MODEL, None, tokenizer_json);
        assert!(e.what.contains("missing"), "{e}");
        let e = with(PRE, Some(Value::Str("llama-bpe".into())), tokenizer_json);
        assert_eq!(e.what, "is \"llama-bpe\": an unknown pre-tokenizer (deltascope knows \"qwen2\", \"qwen35\")");
        let e = with(PRE, None, tokenizer_json);
        assert!(e.what.contains("missing") && e.what.contains("qwen35"), "{e}");
        let e = with(LOWERCASE, Some(Value::Bool(true)), tokenizer_json);
        assert!(e.what.contains("NFC only"), "{e}");
    }

    #[test]
    fn wrong_value_types_say_what_was_found() {
        let e = with(MODEL, Some(Value::U32(2)), tokenizer_json);
        assert_eq!(e.what, "expected a string, found the u32 2");
        let e = with(TOKENS, Some(Value::Str("x".into())), tokenizer_json);
        assert_eq!(e.what, "expected an array of strings, found the string \"x\"");
        let mut tokens: Vec<Value> = (0..261).map(|i| Value::Str(format!("t{i}"))).collect();
        tokens[7] = Value::I32(3);
        let e = with(TOKENS, Some(Value::Array(tokens)), tokenizer_json);
        assert_eq!(e.what, "item 7 is the i32 3, expected a string");
        let e = with(TOKEN_TYPE, Some(Value::Array(vec![Value::I32(1); 3])), tokenizer_json);
        assert_eq!(e.what, "has 3 items, but tokenizer.ggml.tokens has 261: one type per token expected");
        let mut types = vec![Value::I32(1); 261];
        types[9] = Value::Str("control".into());
        let e = with(TOKEN_TYPE, Some(Value::Array(types.clone())), tokenizer_json);
        assert!(e.what.starts_with("item 9 is the string \"control\", expected a token type (1 normal"), "{e}");
        types[9] = Value::I32(-3);
        let e = with(TOKEN_TYPE, Some(Value::Array(types.clone())), tokenizer_json);
        assert!(e.what.starts_with("item 9 is the i32 -3, expected a token type"), "{e}");
        types[9] = Value::I32(6);
        let e = with(TOKEN_TYPE, Some(Value::Array(types)), tokenizer_json);
        assert!(e.what.contains("has type 6 (byte), which a gpt2 (byte-level BPE) vocabulary does not use"), "{e}");
        let e = with(TOKEN_TYPE, None, tokenizer_json);
        assert!(e.what.starts_with("missing"), "{e}");
        let e = with(EOS_ID, Some(Value::Str("<|im_end|>".into())), tokenizer_config_json);
        assert_eq!(e.what, "expected a token id, found the string \"<|im_end|>\"");
        let e = with(ADD_BOS, Some(Value::U8(1)), tokenizer_json);
        assert_eq!(e.what, "expected a bool, found the u8 1");
        let e = with(CHAT_TEMPLATE, Some(Value::Array(vec![])), tokenizer_config_json);
        assert_eq!(e.what, "expected a string, found an array of 0 items");
        let e = with(MERGES, Some(Value::U64(1)), tokenizer_json);
        assert_eq!(e.what, "expected an array of strings, found the u64 1");
    }

    #[test]
    fn ids_out_of_range_or_unused_are_refused() {
        let e = with(EOS_ID, Some(Value::U32(9999)), tokenizer_config_json);
        assert_eq!(e.what, "is 9999, but the vocabulary has 261 tokens");
        let e = with(PAD_ID, Some(Value::U64(u64::MAX)), tokenizer_config_json);
        assert_eq!(e.what, format!("is {}, but the vocabulary has 261 tokens", u64::MAX));
        let e = with(EOS_ID, Some(Value::I32(-1)), tokenizer_config_json);
        assert_eq!(e.what, "expected a token id, found the i32 -1");
        let e = with(EOS_ID, Some(Value::U32(260)), tokenizer_config_json);
        assert_eq!(e.what, "is 260, an unused token (\"[PAD260]\")");
        // generation_config leaves a bad id out rather than fail (<|im_end|> is found by its text).
        let mut m = metadata();
        m.insert(EOS_ID.into(), Value::U32(9999));
        m.insert(PAD_ID.into(), Value::Str("x".into()));
        assert_eq!(parse(&generation_config_json(&gguf(m)).unwrap()), json!({"eos_token_id": 258}));
        // add_bos_token without a bos id.
        let e = with(ADD_BOS, Some(Value::Bool(true)), tokenizer_json);
        assert_eq!(e.what, "is true, but tokenizer.ggml.bos_token_id is missing");
    }

    #[test]
    fn bad_merges_and_repeated_tokens_are_refused() {
        for (merge, what) in [
            ("ab", "merge 0 is \"ab\": expected two tokens separated by one space"),
            ("a  b", "merge 0 is \"a  b\": expected two tokens separated by one space"),
            ("a b c", "merge 0 is \"a b c\": expected two tokens separated by one space"),
            (" a", "merge 0 is \" a\": expected two tokens separated by one space"),
            ("", "merge 0 is \"\": expected two tokens separated by one space"),
            ("a zz", "merge 0 \"a zz\": \"zz\" is not a token"),
            ("b a", "merge 0 \"b a\": \"ba\" is not a token"),
            ("a [PAD260]", "merge 0 \"a [PAD260]\": \"[PAD260]\" is not a token"),
        ] {
            let e = with(MERGES, Some(Value::Array(vec![Value::Str(merge.into())])), tokenizer_json);
            assert_eq!(e.what, what);
        }
        let e = with(MERGES, Some(Value::Array(vec![Value::Bool(true)])), tokenizer_json);
        assert_eq!(e.what, "item 0 is the bool true, expected a string");
        let e = with(MERGES, None, tokenizer_json);
        assert!(e.what.starts_with("missing"), "{e}");
        let mut m = metadata();
        if let Some(Value::Array(t)) = m.get_mut(TOKENS) {
            t[259] = Value::Str("ab".into());
        }
        let e = tokenizer_json(&gguf(m)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "GGUF metadata tokenizer.ggml.tokens: token 259 \"ab\" repeats token 256: a token's text must be unique"
        );
        // A vocabulary without the byte-level alphabet is not byte-level BPE.
        let mut m = metadata();
        if let Some(Value::Array(t)) = m.get_mut(TOKENS) {
            t[0] = Value::Str("x!".into());
        }
        let e = tokenizer_json(&gguf(m)).unwrap_err();
        assert!(e.what.contains("'Ā' (byte 0x00) is not a token"), "{e}");
        // Text from the file is escaped and clipped in messages.
        let long = format!("\n{}", "x".repeat(100));
        let e = with(MODEL, Some(Value::Str(long)), tokenizer_json);
        assert!(e.what.starts_with("is \"\\nxxx") && e.what.contains("x…\": deltascope"), "{e}");
    }

    #[test]
    fn hostile_metadata_never_panics() {
        // Every key replaced by every kind of value, one at a time.
        let kinds = [
            Value::U8(255),
            Value::I64(-5),
            Value::U64(u64::MAX),
            Value::F32(f32::NAN),
            Value::Bool(true),
            Value::Str(String::new()),
            Value::Str("a b".into()),
            Value::Array(vec![]),
            Value::Array(vec![Value::U32(u32::MAX); 261]),
            Value::Array(vec![Value::Str(" ".into()); 261]),
        ];
        let keys: Vec<String> = metadata().into_keys().chain([BOS_ID.into(), UNK_ID.into(), ADD_EOS.into()]).collect();
        for key in &keys {
            for v in &kinds {
                let mut m = metadata();
                m.insert(key.clone(), v.clone());
                let g = gguf(m);
                let _ = tokenizer_json(&g);
                let _ = tokenizer_config_json(&g);
                let _ = generation_config_json(&g);
            }
        }
    }
}
