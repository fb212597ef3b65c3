//! Every parser that reads a file or the network, fed thousands of generated inputs: the
//! model's `config.json`, the safetensors header and the shard index, session files, SSE frames
//! (through the remote backend, from a loopback server), the keymap, theme and config TOML, the
//! GGUF header, and `serve`'s request bodies. Each input must be accepted or refused; a refusal is one line that
//! says what is wrong; nothing panics and nothing hangs.
//!
//! The inputs are mutations of real ones (the demo's and the fixtures' files, the recorded
//! streams of llama.cpp, SGLang and vLLM, the shipped sessions and themes): a value replaced by
//! one of a list of awkward values (null, -1, 1e308, 2^64, "", a 10 000-character string, 40
//! levels of nesting, the wrong type), a key dropped or added, bytes flipped, cut, repeated or
//! spliced with JSON / TOML punctuation. A fixed seed per parser, so a failure repeats; the
//! failing input is printed.

#[path = "common/replay.rs"]
mod replay;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Map, Value, json};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> Vec<u8> {
    std::fs::read(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// Generating inputs.

/// xorshift64*: small, fast, and the same sequence on every machine.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { (self.next() % n as u64) as usize }
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len())]
    }
}

/// Values that break careless readers.
fn awkward(rng: &mut Rng) -> Value {
    let nested = (0..40).fold(json!(1), |v, _| json!([v]));
    let choices = [
        Value::Null,
        json!(true),
        json!(false),
        json!(0),
        json!(-1),
        json!(1),
        json!(2),
        json!(3.5),
        json!(-0.0),
        json!(1e308),
        json!(-1e308),
        json!(u64::MAX),
        json!(i64::MIN),
        json!(9_007_199_254_740_993_u64),
        json!(4_294_967_296_u64),
        json!(""),
        json!("x"),
        json!("\u{0}"),
        json!("NaN"),
        json!("-1"),
        json!("é\u{202e}界"),
        json!("a".repeat(10_000)),
        json!([]),
        json!({}),
        json!([1, "a", null]),
        json!({"a": {"b": []}}),
        nested,
    ];
    rng.pick(&choices).clone()
}

fn paths(v: &Value, at: &mut Vec<Vec<PathStep>>, here: &mut Vec<PathStep>) {
    at.push(here.clone());
    match v {
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate().take(64) {
                here.push(PathStep::Index(i));
                paths(x, at, here);
                here.pop();
            }
        }
        Value::Object(o) => {
            for (k, x) in o {
                here.push(PathStep::Key(k.clone()));
                paths(x, at, here);
                here.pop();
            }
        }
        _ => {}
    }
}

#[derive(Clone)]
enum PathStep {
    Key(String),
    Index(usize),
}

fn at_path<'v>(v: &'v mut Value, path: &[PathStep]) -> &'v mut Value {
    path.iter().fold(v, |v, step| match step {
        PathStep::Key(k) => &mut v[k.as_str()],
        PathStep::Index(i) => &mut v[*i],
    })
}

/// One structural change: a value replaced, a key or element dropped, a key added, an element
/// repeated.
fn mutate_value(v: &mut Value, rng: &mut Rng, keys: &[String]) {
    let mut all = vec![];
    paths(v, &mut all, &mut vec![]);
    let path = rng.pick(&all).clone();
    let node = at_path(v, &path);
    match rng.below(6) {
        0..=2 => *node = awkward(rng),
        3 => match node {
            Value::Object(o) if !o.is_empty() => {
                let k = o.keys().nth(rng.below(o.len())).cloned().unwrap_or_default();
                o.remove(&k);
            }
            Value::Array(a) if !a.is_empty() => {
                a.remove(rng.below(a.len()));
            }
            other => *other = awkward(rng),
        },
        4 => match node {
            Value::Object(o) => {
                let k = if keys.is_empty() || rng.chance(0.3) {
                    format!("k{}", rng.below(5))
                } else {
                    rng.pick(keys).clone()
                };
                o.insert(k, awkward(rng));
            }
            Value::Array(a) if !a.is_empty() => {
                let x = a[rng.below(a.len())].clone();
                let n = 1 + rng.below(3);
                a.extend(std::iter::repeat_n(x, n));
            }
            other => *other = awkward(rng),
        },
        _ => {
            // The same value as another type.
            *node = match node.take() {
                Value::Number(n) => Value::String(n.to_string()),
                Value::String(s) => s.parse::<f64>().map(|f| json!(f)).unwrap_or(json!([s])),
                Value::Bool(b) => json!(u8::from(b)),
                Value::Array(a) => a.into_iter().next().unwrap_or(Value::Null),
                Value::Object(o) => Value::Array(o.into_iter().map(|(_, v)| v).collect()),
                Value::Null => json!({}),
            }
        }
    }
}

/// Every object key in a document (new keys are drawn from these, so additions hit real fields).
fn keys_of(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                out.push(k.clone());
                keys_of(x, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| keys_of(x, out)),
        _ => {}
    }
}

const SPLICES: &[&[u8]] = &[
    b"\"",
    b"{",
    b"}",
    b"[",
    b"]",
    b",",
    b":",
    b"=",
    b"\\u0000",
    b"\\ud800",
    b"\xff",
    b"\xc3\x28",
    b"\n",
    b"\r\n",
    b"null",
    b"-",
    b"1e999",
    b"99999999999999999999999",
    b"NaN",
    b"\x00",
    b"[[[[[[[[",
    b"#",
    b"'",
    b"\"\"\"",
    b"data: ",
    b"\n\n",
    b"event: x\n",
    b":\n",
];

/// One byte-level change: a flip, a cut, a deletion, a repeat or a splice.
fn mutate_bytes(b: &mut Vec<u8>, rng: &mut Rng) {
    if b.is_empty() {
        let piece = *rng.pick(SPLICES);
        b.extend_from_slice(piece);
        return;
    }
    let i = rng.below(b.len());
    match rng.below(6) {
        0 => b[i] ^= 1 << rng.below(8),
        1 => b[i] = rng.next() as u8,
        2 => b.truncate(i),
        3 => {
            let end = (i + 1 + rng.below(64)).min(b.len());
            b.drain(i..end);
        }
        4 => {
            let end = (i + 1 + rng.below(64)).min(b.len());
            let piece = b[i..end].to_vec();
            b.splice(i..i, piece);
        }
        _ => {
            let piece = *rng.pick(SPLICES);
            b.splice(i..i, piece.iter().copied());
        }
    }
}

/// A mutation of a JSON seed: structural changes (then printed compact or pretty), and / or
/// byte changes.
fn mutate_json(seed: &Value, keys: &[String], rng: &mut Rng) -> Vec<u8> {
    let structural = rng.chance(0.7);
    let mut bytes = if structural {
        let mut v = seed.clone();
        for _ in 0..1 + rng.below(3) {
            mutate_value(&mut v, rng, keys);
        }
        if rng.chance(0.5) { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) }.unwrap()
    } else {
        serde_json::to_vec_pretty(seed).unwrap()
    };
    if !structural || rng.chance(0.25) {
        for _ in 0..1 + rng.below(3) {
            mutate_bytes(&mut bytes, rng);
        }
    }
    bytes
}

/// A mutation of a TOML seed: through JSON for structural changes (values TOML cannot hold,
/// such as null, fall back to byte changes), and byte changes.
fn mutate_toml(seed: &str, rng: &mut Rng) -> Vec<u8> {
    if rng.chance(0.6) {
        let table: toml::Table = toml::from_str(seed).expect("a seed is valid TOML");
        let mut v = serde_json::to_value(&table).unwrap();
        let mut keys = vec![];
        keys_of(&v, &mut keys);
        for _ in 0..1 + rng.below(3) {
            mutate_value(&mut v, rng, &keys);
        }
        if let Ok(t) = toml::Table::try_from(v)
            && let Ok(text) = toml::to_string(&t)
        {
            return text.into_bytes();
        }
    }
    let mut bytes = seed.as_bytes().to_vec();
    for _ in 0..1 + rng.below(3) {
        mutate_bytes(&mut bytes, rng);
    }
    bytes
}

// ---------------------------------------------------------------------------------------------
// Running a parser over them.

/// Runs `check` on every input on a worker thread. A panic, a refusal that is empty or longer
/// than one line, or no progress for [`STALL`] (a hang) fails, printing the input.
fn fuzz(name: &str, inputs: Vec<Vec<u8>>, check: impl Fn(&[u8]) -> Result<(), String> + Send + 'static) -> Tally {
    let progress = Arc::new(AtomicUsize::new(0));
    let current = Arc::new(Mutex::new(Vec::new()));
    let (p, c) = (progress.clone(), current.clone());
    let total = inputs.len();
    let worker = std::thread::spawn(move || -> Result<Tally, String> {
        let mut tally = Tally::default();
        for input in inputs {
            *c.lock().unwrap() = input.clone();
            match catch_unwind(AssertUnwindSafe(|| check(&input))) {
                Err(panic) => {
                    let what = panic
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    return Err(format!("panicked ({what}) on input:\n{}", show(&input)));
                }
                Ok(Ok(())) => tally.accepted += 1,
                Ok(Err(message)) => {
                    if message.trim().is_empty() || message.contains('\n') || message.chars().count() > 600 {
                        return Err(format!(
                            "a refusal that is not one line of at most 600 characters ({} characters, {} lines):\n{}\ninput:\n{}",
                            message.chars().count(),
                            message.lines().count(),
                            show(message.as_bytes()),
                            show(&input)
                        ));
                    }
                    tally.longest = tally.longest.max(message.chars().count());
                    if tally.examples.len() < 3 && !tally.examples.contains(&message) {
                        tally.examples.push(message);
                    }
                    tally.refused += 1;
                }
            }
            p.fetch_add(1, Ordering::Relaxed);
        }
        Ok(tally)
    });
    let mut seen = 0;
    let mut moved = Instant::now();
    while !worker.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
        let now = progress.load(Ordering::Relaxed);
        if now != seen {
            (seen, moved) = (now, Instant::now());
        } else if moved.elapsed() > STALL {
            panic!("{name}: no progress for {STALL:?} (a hang) on input {now}:\n{}", show(&current.lock().unwrap()));
        }
    }
    let tally = worker.join().expect("the worker catches panics").unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(tally.accepted + tally.refused, total);
    println!(
        "{name}: {total} inputs, {} accepted, {} refused (longest refusal {} chars), e.g.:",
        tally.accepted, tally.refused, tally.longest
    );
    for e in &tally.examples {
        println!("    {e}");
    }
    tally
}

/// How long one input may take before the run counts as hung (generous: a slow CI machine).
const STALL: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Tally {
    accepted: usize,
    refused: usize,
    longest: usize,
    examples: Vec<String>,
}

fn show(input: &[u8]) -> String {
    let text = String::from_utf8_lossy(input);
    if text.chars().count() > 400 { text.chars().take(400).collect::<String>() + " …(cut)" } else { text.into() }
}

/// Mutations of each seed in turn, `count` in all.
fn json_inputs(seeds: &[Vec<u8>], count: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
    let parsed: Vec<(Value, Vec<String>)> = seeds
        .iter()
        .map(|s| {
            let v: Value = serde_json::from_slice(s).expect("a seed is valid JSON");
            let mut keys = vec![];
            keys_of(&v, &mut keys);
            (v, keys)
        })
        .collect();
    (0..count)
        .map(|i| {
            let (v, keys) = &parsed[i % parsed.len()];
            mutate_json(v, keys, rng)
        })
        .collect()
}

/// Both outcomes happen: a fuzz whose inputs are all refused (or all accepted) tests little.
fn assert_mixed(name: &str, t: &Tally) {
    assert!(t.accepted > 0 && t.refused > 0, "{name}: {} accepted, {} refused", t.accepted, t.refused);
}

// ---------------------------------------------------------------------------------------------
// The parsers.

#[test]
fn config_json() {
    let seeds: Vec<Vec<u8>> = [
        "models/demo/config.json",
        "tests/data/qwen3_5_0_8b/config.json",
        "tests/data/qwen3_6_27b/config.json",
        "tests/data/qwen3_6_35b_a3b/config.json",
        "tests/data/qwen3_next_80b_a3b/config.json",
    ]
    .iter()
    .map(|p| read(p))
    .collect();
    let inputs = json_inputs(&seeds, 4000, &mut Rng::new(1));
    let t = fuzz("config.json", inputs, |b| {
        let text = String::from_utf8_lossy(b);
        deltascope_model::ModelConfig::from_json_str(&text, "config.json").map(|_| ()).map_err(|e| e.to_string())
    });
    assert_mixed("config.json", &t);
}

/// A small checkpoint file: two tensors and the header's metadata.
fn small_safetensors(header: &[u8], data_len: usize) -> Vec<u8> {
    let mut b = (header.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(header);
    b.extend(std::iter::repeat_n(0x3f, data_len));
    b
}

fn opens(dir: &Path) -> Result<(), String> {
    use deltascope_model::ModelSource;
    use deltascope_model::WeightStore;
    let store = WeightStore::open(&ModelSource::Dir(dir.to_path_buf())).map_err(|e| e.to_string())?;
    let names: Vec<String> = store.names().map(str::to_string).collect();
    for n in names {
        let shape = store.shape(&n).unwrap_or_default().to_vec();
        match store.load_f32(&n, &shape) {
            // A dtype the engine does not run is a refusal too.
            Ok(v) => assert_eq!(v.len(), shape.iter().product::<usize>(), "{n}"),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(())
}

#[test]
fn safetensors_header() {
    let header = json!({
        "__metadata__": {"format": "pt"},
        "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]},
        "c": {"dtype": "F16", "shape": [1, 2], "data_offsets": [32, 36]},
    });
    let mut keys = vec![];
    keys_of(&header, &mut keys);
    keys.extend(["dtype", "shape", "data_offsets", "I64", "F8_E4M3", "U8"].map(String::from));
    let mut rng = Rng::new(2);
    let inputs: Vec<Vec<u8>> = (0..2500)
        .map(|i| {
            let h = mutate_json(&header, &keys, &mut rng);
            // The data section's length varies too: short, exact or long.
            let data = [36, 36, 36, 0, 35, 37, 64][i % 7];
            let mut file = small_safetensors(&h, data);
            if rng.chance(0.15) {
                // The length prefix itself.
                let n = [0u64, 1, 7, u64::MAX, (h.len() as u64) + 1, 100_000_000][rng.below(6)];
                file[..8].copy_from_slice(&n.to_le_bytes());
            }
            file
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let t = fuzz("safetensors header", inputs, move |b| {
        std::fs::write(path.join("model.safetensors"), b).unwrap();
        opens(&path)
    });
    assert_mixed("safetensors header", &t);
}

#[test]
fn safetensors_index() {
    let dir = tempfile::tempdir().unwrap();
    let header = |names: &[&str]| {
        let mut m = Map::new();
        for (i, n) in names.iter().enumerate() {
            m.insert(n.to_string(), json!({"dtype": "F32", "shape": [2], "data_offsets": [i * 8, i * 8 + 8]}));
        }
        serde_json::to_vec(&m).unwrap()
    };
    std::fs::write(dir.path().join("model-00001-of-00002.safetensors"), small_safetensors(&header(&["a", "b"]), 16))
        .unwrap();
    std::fs::write(dir.path().join("model-00002-of-00002.safetensors"), small_safetensors(&header(&["c"]), 8)).unwrap();
    let index = json!({
        "metadata": {"total_size": 24},
        "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                       "c": "model-00002-of-00002.safetensors"},
    });
    let mut keys = vec![];
    keys_of(&index, &mut keys);
    keys.extend(["../model-00001-of-00002.safetensors", "/etc/passwd", "model.safetensors"].map(String::from));
    let mut rng = Rng::new(3);
    let inputs: Vec<Vec<u8>> = (0..2000).map(|_| mutate_json(&index, &keys, &mut rng)).collect();
    let path = dir.path().to_path_buf();
    let t = fuzz("safetensors index", inputs, move |b| {
        std::fs::write(path.join("model.safetensors.index.json"), b).unwrap();
        opens(&path)
    });
    assert_mixed("safetensors index", &t);
}

#[test]
fn session_files() {
    let seeds: Vec<Vec<u8>> = [
        "sessions/healthy.json",
        "sessions/degenerate-loop.json",
        "sessions/starved-by-max-tokens.json",
        "tests/fixtures/sessions-v2/healthy.json",
    ]
    .iter()
    .map(|p| read(p))
    .collect();
    let inputs = json_inputs(&seeds, 3000, &mut Rng::new(4));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.json");
    let t = fuzz("session files", inputs, move |b| {
        std::fs::write(&path, b).unwrap();
        let s = deltascope::session::Session::load(&path).map_err(|e| e.to_string())?;
        // What opening it in the workbench reads next.
        let _ = s.messages(s.turns.len(), "next");
        Ok(())
    });
    assert_mixed("session files", &t);
}

#[test]
fn keymap_theme_and_config_toml() {
    use deltascope::tui::config::Config;
    use deltascope::tui::keymap::Keymap;
    use deltascope::tui::theme::Theme;
    let keymap_seed =
        "[keys]\nregenerate = [\"ctrl-r\", \"f6\"]\nquit = \"ctrl-w\"\nsend = \"enter\"\ninspect = \"alt-i\"\n";
    let config_seed = "theme = \"light\"\nsessions_dir = \"/home/me/sessions\"\n";
    let themes: Vec<String> = ["dark", "light", "high-contrast"]
        .iter()
        .map(|n| String::from_utf8(read(&format!("themes/{n}.toml"))).unwrap())
        .collect();
    let user_theme =
        "extends = \"dark\"\n[colors]\nthinking = \"light-blue\"\nanswer = \"#ffcc00\"\nborder = \"244\"\n";
    let mut rng = Rng::new(5);
    let keymaps: Vec<Vec<u8>> = (0..2500).map(|_| mutate_toml(keymap_seed, &mut rng)).collect();
    let t = fuzz("keymap.toml", keymaps, |b| {
        Keymap::parse(&String::from_utf8_lossy(b), "keymap.toml").map(|_| ()).map_err(|e| e.to_string())
    });
    assert_mixed("keymap.toml", &t);
    let theme_inputs: Vec<Vec<u8>> = (0..2500)
        .map(|i| if i % 4 == 3 { mutate_toml(user_theme, &mut rng) } else { mutate_toml(&themes[i % 3], &mut rng) })
        .collect();
    let t = fuzz("theme TOML", theme_inputs, |b| {
        let parent = |name: &str| Some(Theme::builtin(name));
        Theme::parse(&String::from_utf8_lossy(b), "mine.toml", &parent).map(|_| ()).map_err(|e| e.to_string())
    });
    assert_mixed("theme TOML", &t);
    let configs: Vec<Vec<u8>> = (0..1500).map(|_| mutate_toml(config_seed, &mut rng)).collect();
    let t = fuzz("config.toml", configs, |b| {
        Config::parse(&String::from_utf8_lossy(b), "config.toml").map(|_| ()).map_err(|e| e.to_string())
    });
    assert_mixed("config.toml", &t);
}

#[test]
fn serve_request_bodies() {
    use deltascope::server::request;
    use deltascope_protocol::SamplingParams;
    let chat = json!({
        "model": "embedded:demo", "messages": [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Is 91 prime?"}]},
            {"role": "assistant", "content": "No.", "reasoning_content": "7 × 13"}, {"role": "user", "content": "Why?"}],
        "max_tokens": 600, "max_completion_tokens": 600, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
        "presence_penalty": 1.5, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "seed": 7, "stop": ["END"],
        "stop_token_ids": [3], "ignore_eos": false, "logprobs": true, "top_logprobs": 5, "stream": true,
        "stream_options": {"include_usage": true}, "chat_template_kwargs": {"enable_thinking": true},
        "thinking_budget": 64, "thinking_token_budget": 64, "reasoning_budget_message": "Done.",
        "separate_reasoning": true, "n": 1, "tools": [], "response_format": {"type": "text"}, "echo": false,
    });
    let completion = json!({"model": "embedded:demo", "prompt": [1, 2, 3], "max_tokens": 16, "logprobs": 2,
                            "stream": false, "temperature": 0, "stop": "x", "reasoning_budget_tokens": 8});
    let seeds = [serde_json::to_vec(&chat).unwrap(), serde_json::to_vec(&completion).unwrap()];
    let inputs = json_inputs(&seeds, 4000, &mut Rng::new(6));
    let t = fuzz("serve bodies", inputs, |b| {
        let obj = request::object(b).map_err(|e| e.message)?;
        let defaults = SamplingParams::default();
        let check = |r: Result<request::Parsed, deltascope::server::error::ApiError>| match r {
            Ok(_) => Ok(()),
            Err(e) => {
                assert_eq!(e.status, 400, "a body is refused with 400: {}", e.message);
                Err(e.message)
            }
        };
        // The endpoint the body was made for (the seeds: a chat with messages, a completion with
        // a prompt).
        if obj.contains_key("prompt") {
            check(request::completion(&obj, 4096, &defaults))
        } else {
            check(request::chat(&obj, 4096, &defaults))
        }
    });
    assert_mixed("serve bodies", &t);
}

/// SSE streams through the whole remote path: a loopback server sends each mutated stream (cut
/// into chunks at random places) to the remote backend, which must end every generation with
/// `done` or one `error` event of one line.
#[test]
fn sse_frames_through_the_remote_backend() {
    use deltascope::backend::{self, BackendSpec, ChatMessage, ChatRequest, Prompt, RemoteSpec, Role};
    use deltascope_protocol::{EngineEvent, GenerationParams};
    use replay::{After, ReplayServer, Reply, Route, sse_frames};

    let streams: Vec<Vec<Vec<u8>>> = [
        "llamacpp/llamacpp-b11549-chat-stream-reasoning.sse",
        "llamacpp/llamacpp-b11549-mtp-chat-stream-reasoning.sse",
        "llamacpp/llamacpp-b10434-chat-stream-budget8-message.sse",
        "sglang/chat-stream-length.sse",
        "sglang/chat-stream-error.sse",
        "deltascope/verify-arithmetic-40.sse",
    ]
    .iter()
    .map(|p| sse_frames(&read(&format!("tests/fixtures/wire/{p}"))))
    .chain(std::fs::read_dir(root().join("tests/fixtures/wire/vllm")).unwrap().filter_map(|e| {
        let p = e.unwrap().path();
        (p.extension().is_some_and(|x| x == "sse")).then(|| sse_frames(&std::fs::read(p).unwrap()))
    }))
    .collect();
    assert!(streams.len() >= 7, "the recorded streams are there");
    const COUNT: usize = 1000;
    let mut rng = Rng::new(7);
    let mut replies = vec![];
    let mut bodies = vec![];
    for i in 0..COUNT {
        let frames = &streams[i % streams.len()];
        // A window of the stream (the start, so a role frame leads; sometimes the middle).
        let start = if rng.chance(0.8) { 0 } else { rng.below(frames.len()) };
        let len = 1 + rng.below(48);
        let mut out: Vec<u8> = vec![];
        for f in frames.iter().skip(start).take(len) {
            let mut f = f.clone();
            if rng.chance(0.3) {
                let text = String::from_utf8_lossy(&f).to_string();
                if let Some(data) = text.trim().strip_prefix("data: ")
                    && let Ok(v) = serde_json::from_str::<Value>(data)
                {
                    let mut keys = vec![];
                    keys_of(&v, &mut keys);
                    let mut m = v.clone();
                    mutate_value(&mut m, &mut rng, &keys);
                    f = format!("data: {m}\n\n").into_bytes();
                }
            }
            if rng.chance(0.05) {
                mutate_bytes(&mut f, &mut rng);
            }
            out.extend_from_slice(&f);
        }
        if rng.chance(0.5) {
            out.extend_from_slice(b"data: [DONE]\n\n");
        }
        // Cut into chunks at random byte positions (an SSE line may span chunks).
        let mut pieces = vec![];
        let mut at = 0;
        while at < out.len() {
            let n = 1 + rng.below(400);
            let end = (at + n).min(out.len());
            pieces.push((Duration::ZERO, out[at..end].to_vec()));
            at = end;
        }
        replies.push(Reply::Chunks {
            status: 200,
            headers: vec![("Content-Type".into(), "text/event-stream".into())],
            pieces,
            then: After::Close,
        });
        bodies.push(out);
    }
    let server = ReplayServer::start(vec![
        Route::get("/v1/models", Reply::json(200, r#"{"object":"list","data":[{"id":"demo","object":"model"}]}"#)),
        Route::post("/v1/chat/completions", Reply::Sequence(replies)),
    ]);
    let mut spec = RemoteSpec::new(server.url());
    spec.idle_timeout = Duration::from_secs(20);
    spec.first_byte_timeout = Duration::from_secs(20);
    let remote: Arc<dyn backend::Backend> =
        Arc::from(backend::open(&BackendSpec::Remote(spec), &|_| {}).expect("the replay server is a server"));
    let next = Arc::new(AtomicUsize::new(0));
    let t = fuzz("SSE frames", bodies, move |_| {
        next.fetch_add(1, Ordering::Relaxed);
        let req = ChatRequest {
            prompt: Prompt::Chat(vec![ChatMessage::new(Role::User, "Is 91 prime?")]),
            params: GenerationParams { max_tokens: 600, ..Default::default() },
        };
        let g = remote.start(req).map_err(|e| e.message)?;
        loop {
            match g.events().recv_timeout(Duration::from_secs(30)) {
                Ok(EngineEvent::Done(_)) => return Ok(()),
                Ok(EngineEvent::Error(e)) => return Err(e.message),
                Ok(_) => {}
                Err(e) => panic!("the stream ended without done or error: {e}"),
            }
        }
    });
    assert_mixed("SSE frames", &t);
}

/// A small GGUF v3 file: metadata of every kind the writers use (a string, an array of
/// strings, integers, a float, a bool) and tensors of four types, aligned as llama.cpp aligns.
fn small_gguf() -> Vec<u8> {
    fn s(b: &mut Vec<u8>, t: &str) {
        b.extend((t.len() as u64).to_le_bytes());
        b.extend(t.as_bytes());
    }
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    let tensors: [(&str, &[u64], u32, u64); 4] = [
        ("token_embd.weight", &[256, 2], 12, 288),
        ("blk.0.attn_qkv.weight", &[64, 2], 8, 136),
        ("blk.0.ssm_a", &[4], 0, 16),
        ("output_norm.weight", &[8], 1, 16),
    ];
    b.extend((tensors.len() as u64).to_le_bytes());
    b.extend(5u64.to_le_bytes());
    s(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes());
    s(&mut b, "qwen35");
    s(&mut b, "tokenizer.ggml.tokens");
    b.extend(9u32.to_le_bytes());
    b.extend(8u32.to_le_bytes());
    b.extend(3u64.to_le_bytes());
    for t in ["<|im_start|>", "a", "b"] {
        s(&mut b, t);
    }
    s(&mut b, "qwen35.block_count");
    b.extend(4u32.to_le_bytes());
    b.extend(1u32.to_le_bytes());
    s(&mut b, "qwen35.rope.freq_base");
    b.extend(6u32.to_le_bytes());
    b.extend(1e7f32.to_le_bytes());
    s(&mut b, "general.flag");
    b.extend(7u32.to_le_bytes());
    b.push(1);
    let mut offset = 0u64;
    for (name, dims, ty, bytes) in tensors {
        s(&mut b, name);
        b.extend((dims.len() as u32).to_le_bytes());
        for d in dims {
            b.extend(d.to_le_bytes());
        }
        b.extend(ty.to_le_bytes());
        b.extend(offset.to_le_bytes());
        offset = (offset + bytes).div_ceil(32) * 32;
    }
    b.resize(b.len().div_ceil(32) * 32, 0);
    b.extend((0..offset).map(|i| i as u8));
    b
}

#[test]
fn gguf_header() {
    let seed = small_gguf();
    deltascope_model::gguf::Gguf::parse(&seed).expect("the seed is a well-formed GGUF");
    let mut rng = Rng::new(11);
    let inputs: Vec<Vec<u8>> = (0..4000)
        .map(|_| {
            let mut b = seed.clone();
            for _ in 0..1 + rng.below(3) {
                mutate_bytes(&mut b, &mut rng);
            }
            b
        })
        .collect();
    let t =
        fuzz("GGUF header", inputs, |b| deltascope_model::gguf::Gguf::parse(b).map(|_| ()).map_err(|e| e.to_string()));
    assert_mixed("GGUF header", &t);
}
