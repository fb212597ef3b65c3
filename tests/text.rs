//! The text side against transformers: chat templates rendered exactly like
//! `apply_chat_template` (real Qwen3.5 / Qwen3.6 templates), tokenisation like the tokenizers
//! library, and incremental detokenisation that never emits a broken character.

use std::path::PathBuf;

use deltascope_model::{ModelSource, read_config};
use deltascope_protocol::{ChatTemplate, IncrementalDecoder, RenderOptions, TextTokenizer};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn golden(rel: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(root().join(rel)).unwrap()).unwrap()
}

#[test]
fn templates_render_exactly_like_transformers() {
    let g = golden("tests/fixtures/templates/golden.json");
    let mut n = 0;
    for case in g["cases"].as_array().unwrap() {
        let tname = case["template"].as_str().unwrap();
        let src = std::fs::read_to_string(root().join("scripts/templates").join(tname)).unwrap();
        let t = ChatTemplate::new(&src, tname).unwrap();
        let kw = case["kwargs"].as_object().unwrap();
        let opts = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            enable_thinking: kw.get("enable_thinking").and_then(Value::as_bool),
            preserve_thinking: kw.get("preserve_thinking").and_then(Value::as_bool),
            tools: case.get("tools").filter(|t| !t.is_null()).cloned(),
            ..Default::default()
        };
        let name = case["name"].as_str().unwrap();
        let got = t.render(&case["messages"], &opts);
        match case.get("error") {
            Some(e) => {
                let msg = got.expect_err("the template should raise").to_string();
                assert!(msg.contains(e.as_str().unwrap()), "{tname}/{name}: {msg}");
            }
            None => assert_eq!(got.unwrap(), case["rendered"].as_str().unwrap(), "{tname}/{name}"),
        }
        n += 1;
    }
    assert!(n >= 20, "only {n} template cases");
}

fn fixture_tokenizer() -> TextTokenizer {
    let source = ModelSource::Dir(root().join("tests/fixtures/qwen3_5_vl"));
    let config = read_config(&source).unwrap();
    TextTokenizer::load(&source, Some(config.vocab_size), &config.eos_token_ids).unwrap()
}

#[test]
fn tokenizer_matches_the_tokenizers_library() {
    let tok = fixture_tokenizer();
    let g = golden("tests/fixtures/tokenizer/golden.json");
    for case in g["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(tok.encode(text).unwrap(), ids, "encoding {text:?}");
        assert_eq!(tok.decode(&ids), case["decoded"].as_str().unwrap(), "decoding {text:?}");
    }
}

#[test]
fn special_tokens_come_from_the_files() {
    let tok = fixture_tokenizer();
    let s = &tok.specials;
    // The fixture's ids differ from the real Qwen ids: they must be looked up, not assumed.
    assert_eq!(s.think_start, Some(504));
    assert_eq!(s.think_end, Some(505));
    assert_eq!(s.im_start, Some(481));
    assert_eq!(s.im_end, Some(482));
    // generation_config.json: [<|im_end|>, <|endoftext|>].
    assert_eq!(s.stop, vec![482, 480]);
}

#[test]
fn incremental_decoding_never_emits_a_broken_character() {
    let tok = fixture_tokenizer();
    let text = "Grüße 🙂🚀 日本語 ∑ naïve — done";
    let ids = tok.encode(text).unwrap();
    // Multi-byte characters are split across byte-level tokens here.
    assert!(
        ids.iter().any(|&id| tok.decode(&[id]).contains('\u{FFFD}')),
        "the test text should split a character across tokens"
    );
    let mut d = IncrementalDecoder::default();
    let mut out = String::new();
    for &id in &ids {
        let piece = d.push(&tok, id);
        assert!(!piece.contains('\u{FFFD}'), "token {id} produced a replacement character: {piece:?}");
        out.push_str(&piece);
    }
    out.push_str(&d.finish());
    assert_eq!(out, text);

    // Every id of the vocabulary, streamed one by one, gives what the tokenizers library decodes
    // from the whole sequence at once.
    let all: Vec<u32> = (0..tok.len as u32).collect();
    let mut d = IncrementalDecoder::default();
    let mut streamed: String = all.iter().map(|&id| d.push(&tok, id)).collect();
    streamed.push_str(&d.finish());
    assert_eq!(streamed, tok.library_decode(&all));
}
