//! The model's tokenizer (`tokenizer.json` through the tokenizers crate), its special tokens
//! as the files define them, and incremental detokenisation that never emits a broken UTF-8
//! character.

use std::collections::HashMap;

use serde_json::Value as Json;

use deltascope_model::ModelSource;
use deltascope_model::{Error, Result};

/// Special token ids, looked up by their strings in the tokenizer's vocabulary (never
/// hard-coded: the demo model and the fixtures have ids of their own).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SpecialTokens {
    pub im_start: Option<u32>,
    pub im_end: Option<u32>,
    pub think_start: Option<u32>,
    pub think_end: Option<u32>,
    pub endoftext: Option<u32>,
    /// Ids that end generation: generation_config.json's and config.json's `eos_token_id`,
    /// and tokenizer_config.json's `eos_token`.
    pub stop: Vec<u32>,
}

pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    pub specials: SpecialTokens,
    /// Raw bytes of every token (byte-level BPE), for exact incremental decoding.
    token_bytes: Option<Vec<Vec<u8>>>,
    /// Ids the tokenizer knows (`0..len`).
    pub len: usize,
}

/// GPT-2's byte ↔ printable-character table used by byte-level BPE.
fn byte_level_decoder() -> HashMap<char, u8> {
    let mut bs: Vec<u32> =
        ('!' as u32..='~' as u32).chain('¡' as u32..='¬' as u32).chain('®' as u32..='ÿ' as u32).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    bs.into_iter().zip(cs).filter_map(|(b, c)| char::from_u32(c).map(|c| (c, b as u8))).collect()
}

fn is_byte_level(decoder: &Json) -> bool {
    match decoder.get("type").and_then(Json::as_str) {
        Some("ByteLevel") => true,
        Some("Sequence") => {
            decoder.get("decoders").and_then(Json::as_array).is_some_and(|d| d.iter().any(is_byte_level))
        }
        _ => false,
    }
}

fn json_ids(v: Option<&Json>) -> Vec<u32> {
    match v {
        Some(Json::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Json::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|n| n as u32)).collect(),
        _ => vec![],
    }
}

fn token_string(v: Option<&Json>) -> Option<String> {
    match v {
        Some(Json::String(s)) => Some(s.clone()),
        Some(Json::Object(o)) => o.get("content").and_then(Json::as_str).map(str::to_string),
        _ => None,
    }
}

impl TextTokenizer {
    /// Loads `tokenizer.json` (and the stop ids of generation_config.json and
    /// tokenizer_config.json) for a model with `vocab_size` embedding rows (`None`: the weights
    /// are not here, e.g. a remote server's model) whose config.json names `config_eos`.
    pub fn load(source: &ModelSource, vocab_size: Option<usize>, config_eos: &[u32]) -> Result<Self> {
        let file = source.file_label("tokenizer.json");
        let bytes = source.read("tokenizer.json")?.ok_or_else(|| Error::MissingFile {
            dir: source.dir(),
            file: "tokenizer.json".into(),
            hint: "deltascope reads the fast tokenizer file that Hugging Face checkpoints ship".into(),
        })?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| Error::Tokenizer { file: file.clone(), message: e.to_string() })?;
        let json: Json =
            serde_json::from_slice(&bytes).map_err(|e| Error::Json { file: file.clone(), message: e.to_string() })?;
        let len = inner.get_vocab_size(true);
        let max_id = inner.get_vocab(true).values().copied().max().unwrap_or(0) as usize;
        if let Some(vocab_size) = vocab_size
            && max_id >= vocab_size
        {
            return Err(Error::Tokenizer {
                file,
                message: format!(
                    "has token id {max_id}, but the model's vocab_size is {vocab_size} (tokenizer and weights do not belong together)"
                ),
            });
        }
        let added: HashMap<u32, String> =
            inner.get_added_tokens_decoder().into_iter().map(|(id, t)| (id, t.content)).collect();
        let token_bytes = json.get("decoder").filter(|d| is_byte_level(d)).map(|_| {
            let table = byte_level_decoder();
            (0..=max_id as u32)
                .map(|id| {
                    if let Some(content) = added.get(&id) {
                        return content.as_bytes().to_vec();
                    }
                    match inner.id_to_token(id) {
                        Some(tok) => tok
                            .chars()
                            .flat_map(|c| match table.get(&c) {
                                Some(b) => vec![*b],
                                None => c.to_string().into_bytes(),
                            })
                            .collect(),
                        None => vec![],
                    }
                })
                .collect()
        });

        let id_of = |s: &str| inner.token_to_id(s);
        let mut stop: Vec<u32> = vec![];
        let mut add_stop = |ids: Vec<u32>| {
            for id in ids {
                if !stop.contains(&id) {
                    stop.push(id);
                }
            }
        };
        let generation = source.read_json("generation_config.json")?;
        add_stop(json_ids(generation.as_ref().and_then(|g| g.get("eos_token_id"))));
        add_stop(config_eos.to_vec());
        let tok_cfg = source.read_json("tokenizer_config.json")?;
        if let Some(eos) = token_string(tok_cfg.as_ref().and_then(|c| c.get("eos_token"))) {
            add_stop(id_of(&eos).into_iter().collect());
        }
        let specials = SpecialTokens {
            im_start: id_of("<|im_start|>"),
            im_end: id_of("<|im_end|>"),
            think_start: id_of("<think>"),
            think_end: id_of("</think>"),
            endoftext: id_of("<|endoftext|>"),
            stop,
        };
        Ok(TextTokenizer { inner, specials, token_bytes, len })
    }

    /// Tokenises text as the chat-template path of transformers does (no special tokens
    /// added; special-token strings inside the text become their single ids).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::Tokenizer { file: "tokenizer.json".into(), message: e.to_string() })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Decodes ids to text, special tokens included.
    pub fn decode(&self, ids: &[u32]) -> String {
        let mut d = IncrementalDecoder::default();
        let mut s: String = ids.iter().map(|&id| d.push(self, id)).collect();
        s.push_str(&d.finish());
        s
    }

    /// Decoding by the tokenizers library itself (whole sequence at once), special tokens kept.
    pub fn library_decode(&self, ids: &[u32]) -> String {
        self.inner.decode(ids, false).unwrap_or_default()
    }

    fn bytes_of(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.as_ref().map(|t| t.get(id as usize).map(Vec::as_slice).unwrap_or(&[]))
    }
}

/// Turns a stream of token ids into text. Byte-level tokenizers are decoded byte-exactly: bytes
/// of an incomplete UTF-8 character are held until the character completes; invalid bytes
/// become U+FFFD. Other tokenizers fall back to re-decoding a sliding window.
#[derive(Debug, Default, Clone)]
pub struct IncrementalDecoder {
    pending: Vec<u8>,
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl IncrementalDecoder {
    /// The text that `id` completes (possibly empty).
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> String {
        match tok.bytes_of(id) {
            Some(b) => {
                self.pending.extend_from_slice(b);
                self.drain_valid()
            }
            None => self.push_window(tok, id),
        }
    }

    /// Bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whatever is still held (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    fn drain_valid(&mut self) -> String {
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..valid]).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete character at the end: wait for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(n) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + n);
                        }
                    }
                }
            }
        }
    }

    fn push_window(&mut self, tok: &TextTokenizer, id: u32) -> String {
        self.ids.push(id);
        let prev = tok.inner.decode(&self.ids[self.prefix..self.read], false).unwrap_or_default();
        let full = tok.inner.decode(&self.ids[self.prefix..], false).unwrap_or_default();
        if full.len() > prev.len() && !full.ends_with('\u{FFFD}') && full.is_char_boundary(prev.len()) {
            let new = full[prev.len()..].to_string();
            self.prefix = self.read;
            self.read = self.ids.len();
            new
        } else {
            String::new()
        }
    }
}
