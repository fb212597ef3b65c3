//! The tokenizer files rebuilt from a GGUF's metadata (`gguf::vocab`) against the folder the
//! GGUF was converted from: the demo model as `scripts/make_gguf.py` converts it (the GGUF
//! `scripts/setup-servers.sh` makes for the llama.cpp tests). The rebuilt `tokenizer.json`
//! tokenises a multilingual and code corpus to the same ids and decodes them to the same text
//! as `models/demo/tokenizer.json`; the chat template and the stop ids come out the same
//! through the protocol crate's own loaders.

#[path = "common/llama_server.rs"]
mod llama_server;

use deltascope_model::gguf::{Gguf, generation_config_json, tokenizer_config_json, tokenizer_json};
use std::path::{Path, PathBuf};

use deltascope_model::ModelSource;
use deltascope_protocol::{ChatTemplate, RenderOptions, TextTokenizer};
use serde_json::{Value as Json, json};
use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, Tokenizer};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn demo_dir() -> PathBuf {
    root().join("models/demo")
}

/// The demo GGUF's header.
fn demo_gguf() -> Gguf {
    let path = &llama_server::setup().demo_gguf;
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    Gguf::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The three files synthesised from the demo GGUF, written to a folder.
fn synthesised_dir(g: &Gguf) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer_json(g).unwrap()).unwrap();
    std::fs::write(dir.path().join("tokenizer_config.json"), tokenizer_config_json(g).unwrap()).unwrap();
    let generation = generation_config_json(g).expect("the demo GGUF names an eos id");
    std::fs::write(dir.path().join("generation_config.json"), generation).unwrap();
    dir
}

fn read_json(path: &Path) -> Json {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The corpus as lines (each with its line ending, so CRLF stays in) and whole; plus strings
/// built here, which no checkout's line-ending conversion can touch.
fn corpus() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("tests/fixtures/tokenizer_corpus.txt")).unwrap();
    assert!(text.contains("\r\n"), "the corpus lost its CRLF lines (a checkout converted line endings?)");
    let mut cases: Vec<String> = text.split_inclusive('\n').map(str::to_string).collect();
    cases.push(text.clone());
    cases.extend(
        [
            "a\r\nb\r\n\r\n  c\r\n",
            "\t\tx\r\n\ty",
            "e\u{301}\u{0}\u{7f} control \u{1b}[0m",
            "\u{200d}\u{fe0f}\u{feff}",
            "<|im_start|><|im_start|><think></think><|im_end|>",
            "'S 'T 'RE 'VE 'M 'LL 'D 's 't 're 've 'm 'll 'd",
            "",
            " ",
            "\n",
        ]
        .map(str::to_string),
    );
    cases
}

#[test]
fn the_rebuilt_tokenizer_is_laid_out_as_the_demo_s() {
    let g = demo_gguf();
    let rebuilt: Json = serde_json::from_str(&tokenizer_json(&g).unwrap()).unwrap();
    let demo = read_json(&demo_dir().join("tokenizer.json"));
    for key in ["version", "truncation", "padding", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model"]
    {
        assert_eq!(rebuilt[key], demo[key], "tokenizer.json's {key} differs");
    }
    // Added tokens: the same ids, texts and flags, but for one the GGUF cannot carry: the
    // converter writes a `<|...|>` token as CONTROL even when tokenizer.json says
    // `special: false` (does_token_look_special), so it comes back special.
    let (rebuilt_added, demo_added) =
        (rebuilt["added_tokens"].as_array().unwrap(), demo["added_tokens"].as_array().unwrap());
    assert_eq!(rebuilt_added.len(), demo_added.len());
    let mut flipped = vec![];
    for (r, d) in rebuilt_added.iter().zip(demo_added) {
        let content = d["content"].as_str().unwrap();
        let looks_special = content.starts_with("<|") && content.ends_with("|>");
        let mut expected = d.clone();
        if looks_special && d["special"] == json!(false) {
            expected["special"] = json!(true);
            flipped.push(content);
        }
        assert_eq!(r, &expected, "added token {content}");
    }
    assert_eq!(
        flipped,
        ["<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
    );
}

/// The pre-tokenizer's pieces of `text` (in byte-level characters).
fn splits(t: &Tokenizer, text: &str) -> Vec<String> {
    let mut p = PreTokenizedString::from(text);
    t.get_pre_tokenizer().unwrap().pre_tokenize(&mut p).unwrap();
    p.get_splits(OffsetReferential::Original, OffsetType::Byte).into_iter().map(|(s, _, _)| s.to_string()).collect()
}

#[test]
fn the_rebuilt_tokenizer_encodes_and_decodes_the_corpus_as_the_demo_s() {
    let g = demo_gguf();
    let rebuilt = Tokenizer::from_bytes(tokenizer_json(&g).unwrap()).unwrap();
    let demo = Tokenizer::from_file(demo_dir().join("tokenizer.json")).unwrap();
    assert_eq!(rebuilt.get_vocab(true), demo.get_vocab(true));
    assert_eq!(rebuilt.get_vocab_size(true), demo.get_vocab_size(true));
    let mut tokens = 0;
    for text in corpus() {
        for add_special in [false, true] {
            let (r, d) =
                (rebuilt.encode(text.as_str(), add_special).unwrap(), demo.encode(text.as_str(), add_special).unwrap());
            assert_eq!(r.get_ids(), d.get_ids(), "ids of {text:?} (add_special_tokens {add_special})");
            assert_eq!(r.get_tokens(), d.get_tokens(), "tokens of {text:?}");
            assert_eq!(r.get_offsets(), d.get_offsets(), "offsets of {text:?}");
            for skip in [false, true] {
                assert_eq!(
                    rebuilt.decode(r.get_ids(), skip).unwrap(),
                    demo.decode(d.get_ids(), skip).unwrap(),
                    "decoding {text:?} (skip_special_tokens {skip})"
                );
            }
            tokens += r.get_ids().len();
        }
    }
    // The split itself, piece by piece: with the demo's 224 merges most text ends as single
    // bytes whatever the split, so the ids alone would not tell the qwen2 regex from qwen35's.
    for text in corpus() {
        assert_eq!(splits(&rebuilt, &text), splits(&demo, &text), "pre-tokenizing {text:?}");
    }
    // qwen35's regex keeps Devanagari's combining signs (\p{M}: the virama, vowel signs) inside
    // the word; qwen2's would cut "नमस्ते" at the virama.
    assert_eq!(splits(&rebuilt, "नमस्ते दुनिया").len(), 2);
    // The inline special tokens are single ids; NFD text is composed first.
    let ids = |t: &str| rebuilt.encode(t, false).unwrap().get_ids().to_vec();
    assert_eq!(ids("<|im_start|>"), [481]);
    assert_eq!(ids("<think>"), [504]);
    assert_eq!(ids("</think>"), [505]);
    assert_eq!(ids("e\u{301}"), ids("\u{e9}"));
    assert!(tokens > 2000, "only {tokens} tokens: is the corpus there?");
}

#[test]
fn the_project_s_tokenizer_reads_both_alike() {
    let g = demo_gguf();
    let dir = synthesised_dir(&g);
    let config = read_json(&demo_dir().join("config.json"));
    let vocab_size = config["vocab_size"].as_u64().unwrap() as usize;
    let config_eos: Vec<u32> = match &config["eos_token_id"] {
        Json::Array(a) => a.iter().map(|v| v.as_u64().unwrap() as u32).collect(),
        v => vec![v.as_u64().unwrap() as u32],
    };
    let demo = TextTokenizer::load(&ModelSource::Dir(demo_dir()), Some(vocab_size), &config_eos).unwrap();
    // A GGUF has no config.json eos of its own: the synthesised files alone must give the stops.
    let rebuilt = TextTokenizer::load(&ModelSource::Dir(dir.path().to_path_buf()), Some(vocab_size), &[]).unwrap();
    assert_eq!(rebuilt.specials.stop, demo.specials.stop);
    assert_eq!(rebuilt.specials.stop, [482, 480]);
    let specials = |t: &TextTokenizer| serde_json::to_value(&t.specials).unwrap();
    assert_eq!(specials(&rebuilt), specials(&demo));
    assert_eq!(rebuilt.len, demo.len);
    for text in corpus() {
        let ids = demo.encode(&text).unwrap();
        assert_eq!(rebuilt.encode(&text).unwrap(), ids, "{text:?}");
        assert_eq!(rebuilt.decode(&ids), demo.decode(&ids), "{text:?}");
        assert_eq!(rebuilt.library_decode(&ids), demo.library_decode(&ids), "{text:?}");
    }
    // Every id the model can emit, the padding rows past the vocabulary included, decodes alike.
    let all: Vec<u32> = (0..vocab_size as u32).collect();
    assert_eq!(rebuilt.decode(&all), demo.decode(&all));
}

#[test]
fn the_synthesised_configs_say_what_the_demo_s_say() {
    let g = demo_gguf();
    let tc: Json = serde_json::from_str(&tokenizer_config_json(&g).unwrap()).unwrap();
    let demo_tc = read_json(&demo_dir().join("tokenizer_config.json"));
    assert_eq!(tc["chat_template"], demo_tc["chat_template"]);
    assert!(tc["chat_template"].as_str().is_some_and(|t| t.len() > 1000));
    for key in ["eos_token", "pad_token", "add_bos_token"] {
        assert_eq!(tc[key], demo_tc[key], "{key}");
    }
    // The demo has no bos (null); the GGUF names none, so the key is left out.
    assert_eq!(demo_tc["bos_token"], Json::Null);
    assert!(tc.get("bos_token").is_none());
    let generation: Json = serde_json::from_str(&generation_config_json(&g).unwrap()).unwrap();
    // eos 482 (<|im_end|>) from the GGUF, then <|endoftext|> by its text as llama.cpp stops on it;
    // the demo's generation_config.json says [482, 480] too. Its bos_token_id 480 never reached
    // the GGUF (SpecialVocab takes bos from tokenizer_config.json, where it is null).
    assert_eq!(generation, json!({"eos_token_id": [482, 480], "pad_token_id": 480}));
    let demo_generation = read_json(&demo_dir().join("generation_config.json"));
    assert_eq!(generation["eos_token_id"], demo_generation["eos_token_id"]);
    assert_eq!(generation["pad_token_id"], demo_generation["pad_token_id"]);
}

#[test]
fn the_chat_template_renders_alike() {
    let g = demo_gguf();
    let dir = synthesised_dir(&g);
    let rebuilt = ChatTemplate::load(&ModelSource::Dir(dir.path().to_path_buf()), true).unwrap();
    let demo = ChatTemplate::load(&ModelSource::Dir(demo_dir()), true).unwrap();
    let messages = json!([
        {"role": "system", "content": "You are terse. Antworte auf Deutsch, s'il te plaît. 你好"},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4.", "reasoning_content": "Two and two make four."},
        {"role": "user", "content": "And 3 + 3?\nThink first."}
    ]);
    let mut rendered = vec![];
    for enable_thinking in [None, Some(true), Some(false)] {
        for add_generation_prompt in [true, false] {
            let opts = RenderOptions { add_generation_prompt, enable_thinking, ..Default::default() };
            let r = rebuilt.render(&messages, &opts).unwrap();
            assert_eq!(
                r,
                demo.render(&messages, &opts).unwrap(),
                "thinking {enable_thinking:?}, prompt {add_generation_prompt}"
            );
            assert!(r.contains("<|im_start|>system\nYou are terse."), "{r}");
            rendered.push(r);
        }
    }
    // The switch reaches the template: thinking off and on render differently.
    assert!(rendered[4].ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{}", rendered[4]);
    assert_ne!(rendered[2], rendered[4]);
}

#[test]
fn the_gguf_model_source_reads_as_the_demo_folder() {
    // End to end: the GGUF opened as a model source (its files synthesised by
    // `gguf::source_for`), read by the loaders the engine uses, as `backend/local.rs` does.
    let folder = ModelSource::Dir(demo_dir());
    let path = &llama_server::setup().demo_gguf;
    let source = deltascope_model::gguf::source_for(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let load = |s: &ModelSource| {
        let config = deltascope_model::read_config(s).unwrap();
        TextTokenizer::load(s, Some(config.vocab_size), &config.eos_token_ids).unwrap()
    };
    let (rebuilt, demo) = (load(&source), load(&folder));
    assert_eq!(rebuilt.specials.stop, demo.specials.stop);
    assert_eq!(rebuilt.len, demo.len);
    let text = std::fs::read_to_string(root().join("tests/fixtures/tokenizer_corpus.txt")).unwrap();
    assert_eq!(rebuilt.encode(&text).unwrap(), demo.encode(&text).unwrap());
    let messages = json!([
        {"role": "system", "content": "S"},
        {"role": "user", "content": "U"},
        {"role": "assistant", "content": "A", "reasoning_content": "R"},
        {"role": "user", "content": "V"}
    ]);
    for enable_thinking in [Some(true), Some(false)] {
        let opts = RenderOptions { add_generation_prompt: true, enable_thinking, ..Default::default() };
        let render = |s: &ModelSource| ChatTemplate::load(s, true).unwrap().render(&messages, &opts).unwrap();
        assert_eq!(render(&source), render(&folder));
    }
}
