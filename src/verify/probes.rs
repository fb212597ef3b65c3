//! What `deltascope verify` asks a server: the built-in probe set, or the user's own
//! (`--prompts FILE`, JSON Lines). Short probes of each kind (arithmetic, code, a second turn,
//! thinking on and off, a generation past token 128), and long prompts that cross the places
//! where Gated-DeltaNet implementations break: the 64-token chunks of the chunked rule, and
//! prompts of about 1k, 4k and 16k tokens.

use std::path::Path;

use serde::Deserialize;

use crate::backend::{ChatMessage, Role};

/// One request to check.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub name: String,
    pub messages: Vec<ChatMessage>,
    /// The template's `enable_thinking`.
    pub thinking: bool,
    pub max_tokens: usize,
    /// Generate `max_tokens` whatever the model says (a generation past token 128 even when
    /// the model would stop sooner).
    pub ignore_eos: bool,
    /// A long prompt (left out by `--quick`).
    pub long: bool,
}

impl Probe {
    fn short(name: &str, user: &str, thinking: bool, max_tokens: usize) -> Probe {
        Probe {
            name: name.into(),
            messages: vec![ChatMessage::new(Role::User, user)],
            thinking,
            max_tokens,
            ignore_eos: false,
            long: false,
        }
    }
}

/// Tokens of the long prompts: about 1k, 4k and 16k, a little under each so that a model with
/// a context of 4096 (the demo) still runs the 4k one.
pub const LONG_PROMPTS: [(&str, usize); 3] = [("1k prompt", 1000), ("4k prompt", 3800), ("16k prompt", 15800)];

/// The built-in set: every short probe, then the long prompts (`quick`: the short ones only),
/// sized with `tokens` (the reference's token count of a text).
pub fn builtin(quick: bool, tokens: &dyn Fn(&str) -> usize) -> Vec<Probe> {
    let mut probes = vec![
        Probe::short("arithmetic", "What is 482 + 739?", true, 160),
        Probe::short("code", "Write a Python function that tells whether a number is prime.", true, 160),
        Probe {
            name: "second turn".into(),
            messages: vec![
                ChatMessage::new(Role::User, "Is 91 prime?"),
                ChatMessage::new(Role::Assistant, "No: 91 = 7 × 13."),
                ChatMessage::new(Role::User, "And 97?"),
            ],
            thinking: true,
            max_tokens: 160,
            ignore_eos: false,
            long: false,
        },
        Probe::short("thinking off", "Sort 31, 7, 88, 12, 5, 64.", false, 96),
        // Past token 128 (where a GDN kernel's second chunk of state begins to matter in
        // decoding), on the model's own words: no ignore_eos, whose tokens past the end of
        // sequence are not the model's answer.
        Probe::short("long generation", "Count from 1 to 60, one number per line.", true, 256),
    ];
    if !quick {
        // Lines of the document per token, measured on a sample.
        let per_line = tokens(&long_prompt(20)).saturating_sub(tokens(&long_prompt(0))).max(20) as f64 / 20.0;
        for (name, target) in LONG_PROMPTS {
            let base = tokens(&long_prompt(0));
            let facts = ((target.saturating_sub(base)) as f64 / per_line) as usize;
            probes.push(Probe {
                name: name.into(),
                messages: vec![ChatMessage::new(Role::User, long_prompt(facts))],
                thinking: false,
                max_tokens: 48,
                ignore_eos: false,
                long: true,
            });
        }
    }
    probes
}

/// A document of `facts` numbered lines (about 16 tokens each) and a question about one in
/// the middle: the answer needs the whole prompt read right.
fn long_prompt(facts: usize) -> String {
    let mut text = String::from("Read the list, then answer the question after it.\n\n");
    for i in 1..=facts {
        text.push_str(&format!("Item {i}: the crate labelled {} holds {} apples.\n", i * 7 % 101, (i * i * 13) % 997));
    }
    let asked = facts / 2 + 1;
    text.push_str(&format!("\nHow many apples does item {asked} say its crate holds?"));
    text
}

/// One line of `--prompts FILE`: a chat (`messages`) or one user message (`prompt`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    name: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<ChatMessage>>,
    #[serde(default = "yes")]
    thinking: bool,
    #[serde(default = "default_max")]
    max_tokens: usize,
    #[serde(default)]
    ignore_eos: bool,
}

fn yes() -> bool {
    true
}

fn default_max() -> usize {
    160
}

/// Reads `--prompts FILE`: one JSON object a line, `{"prompt": "…"}` or `{"messages": […]}`,
/// with optional `name`, `thinking` (default true), `max_tokens` (default 160), `ignore_eos`.
/// Errors name the file and the line.
pub fn from_file(path: &Path) -> Result<Vec<Probe>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut probes = vec![];
    for (i, raw) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = format!("{}:{}", path.display(), i + 1);
        let line: Line = serde_json::from_str(raw).map_err(|e| format!("{at}: {e}"))?;
        let messages = match (line.prompt, line.messages) {
            (Some(p), None) => vec![ChatMessage::new(Role::User, p)],
            (None, Some(m)) if !m.is_empty() => m,
            _ => return Err(format!("{at}: give either \"prompt\" (a user message) or a non-empty \"messages\" list")),
        };
        if line.max_tokens == 0 {
            return Err(format!("{at}: max_tokens must be at least 1"));
        }
        probes.push(Probe {
            name: line.name.unwrap_or_else(|| format!("line {}", i + 1)),
            messages,
            thinking: line.thinking,
            max_tokens: line.max_tokens,
            ignore_eos: line.ignore_eos,
            long: false,
        });
    }
    if probes.is_empty() {
        return Err(format!("{}: no prompts in it", path.display()));
    }
    Ok(probes)
}
