//! The layering of design.md §3 (and ../shared/architecture.json) that the compiler cannot see.
//!
//! The floors are crates (`crates/model`, `crates/protocol`, `crates/engine`, and `deltascope` at
//! the root), so the compiler already refuses any path upward between floors, whatever its
//! spelling: an alias, a macro, `extern crate self`, a public field. `the_crates_are_the_floors`
//! pins that graph. What it cannot see is a rule between parts that share a crate, or a part
//! reaching the wrong half of a crate below it: Core → Model inside the model crate, Chat →
//! Generation or Generation → Model inside and below the protocol crate, and in the top crate the
//! TUI reaching the CLI, or the TUI and the server reaching the model or the engine (the top crate
//! depends on every floor). Those are read from the text of every crate:
//!
//! 1. every path into our crates (`crate::…`, `super::…`, `self::…`, `$crate::…`,
//!    `deltascope_model::…`, `deltascope_protocol::…`, `deltascope_engine::…`, the binary's
//!    `deltascope::…`, and a name bound by such a `use`) is resolved to an absolute module path
//!    in one tree of parts (the engine crate's modules under `engine::`), inline `mod x { … }`
//!    blocks included, and may only point at a part its own part is allowed to import;
//! 2. a part may pass on (`pub use`, `pub type`, a `pub` field) only what every part allowed to
//!    import it may import itself, so `use crate::backend::Model` cannot launder a model type
//!    into a front end;
//! 3. what would hide a path from 1 and 2 is refused outright: `extern crate` (it makes a new
//!    anchor), `#[path]`, and a macro that assembles a path from the tokens it is handed;
//! 4. every exception listed here is still needed, and every developer tool that reaches past the
//!    backend says so in its module doc.
//!
//! Each of the four holes of the last review (a `pub type` over a privately imported name,
//! `extern crate self as x`, a path-assembling macro, a public field) is planted in a scratch
//! copy of the tree by its own test below, and caught.
//!
//! The source is read by a small Rust lexer: comments (nested block comments too), strings
//! (raw, byte and C strings too) and char literals are dropped before anything is judged.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The parts, by path prefix in the one tree of all crates (see [`tree_at`]; first match wins).
/// Mirrors architecture.json `parts`; `exit.rs` (the top crate's error text and signal exits) is
/// a shared leaf like Core's.
const PARTS: &[(&str, &str)] = &[
    ("error.rs", "Core"),
    ("hash.rs", "Core"),
    ("exit.rs", "Core"),
    ("checkpoint/", "Core"),
    ("units.rs", "Core"),
    ("devices.rs", "Core"),
    ("lib.rs", "Root"),
    ("model/", "Model"),
    ("chat/", "Chat"),
    ("generation/", "Generation"),
    ("engine/", "Engine"),
    ("backend/", "Backend"),
    ("session/", "Session"),
    ("server/", "Server"),
    ("tui/", "Tui"),
    ("cli/", "Cli"),
    ("main.rs", "Cli"),
    ("verify/", "Verify"),
];

/// Which part the first segment of an absolute path (`crate::NAME::…`) reaches.
const MODULES: &[(&str, &str)] = &[
    ("error", "Core"),
    ("hash", "Core"),
    ("exit", "Core"),
    ("Error", "Core"),
    ("Result", "Core"),
    ("checkpoint", "Core"),
    ("units", "Core"),
    ("devices", "Core"),
    ("model", "Model"),
    ("chat", "Chat"),
    ("generation", "Generation"),
    ("engine", "Engine"),
    ("backend", "Backend"),
    ("session", "Session"),
    ("server", "Server"),
    ("tui", "Tui"),
    ("cli", "Cli"),
    ("verify", "Verify"),
];

/// architecture.json's `may_import`, pair for pair and in its order (a part may always use
/// itself). Keep the two in step: CI runs without ../shared, so the table lives here.
const MAY_IMPORT: &[(&str, &str)] = &[
    ("Model", "Core"),
    ("Chat", "Core"),
    ("Engine", "Model"),
    ("Engine", "Chat"),
    ("Engine", "Core"),
    ("Backend", "Engine"),
    ("Backend", "Chat"),
    ("Backend", "Model"),
    ("Backend", "Core"),
    ("Session", "Backend"),
    ("Session", "Core"),
    ("Server", "Backend"),
    ("Server", "Core"),
    ("Tui", "Backend"),
    ("Tui", "Session"),
    ("Tui", "Chat"),
    ("Tui", "Core"),
    ("Cli", "Tui"),
    ("Cli", "Server"),
    ("Cli", "Backend"),
    ("Cli", "Session"),
    ("Cli", "Core"),
    ("Generation", "Core"),
    ("Generation", "Chat"),
    ("Engine", "Generation"),
    ("Backend", "Generation"),
    ("Session", "Generation"),
    ("Server", "Generation"),
    ("Tui", "Generation"),
    ("Cli", "Generation"),
    ("Verify", "Backend"),
    ("Verify", "Generation"),
    ("Verify", "Model"),
    ("Verify", "Chat"),
    ("Verify", "Core"),
    ("Cli", "Verify"),
    ("Tui", "Verify"),
];

/// architecture.json `never`: the edges that must stay absent whatever `MAY_IMPORT` says.
const NEVER: &[(&str, &str)] = &[
    ("Model", "Engine"),
    ("Model", "Chat"),
    ("Engine", "Tui"),
    ("Tui", "Model"),
    ("Server", "Model"),
    ("Tui", "Cli"),
    ("Generation", "Engine"),
    ("Generation", "Model"),
];

/// architecture.json `developer_tools`: "inspect, logits, bench and trace measure the engine
/// itself and may import Model / Engine / Chat directly from src/cli/; say so where they do."
const DEVELOPER_TOOLS: &[&str] =
    &["cli/inspect.rs", "cli/inspect_gguf.rs", "cli/logits.rs", "cli/bench.rs", "cli/trace.rs"];

/// Subcommands outside architecture.json's list that reach past the backend today, each with
/// the parts it reaches and why. An entry the code no longer needs fails the test: remove it.
const TOOL_EXCEPTIONS: &[(&str, &str, &str)] = &[
    // `synth` writes a checkpoint of a given shape: it reads the model's configuration types to
    // know which tensors that shape holds.
    ("cli/synth.rs", "Model", "synth sizes tensors from model::config"),
    // `quantize` rewrites a checkpoint's tensors (model::weights, model::fp8) and compares the
    // two models' logits over a probe set.
    ("cli/quantize.rs", "Model", "quantize reads tensors and runs both models"),
    // `gpu` and `gpu parity` check the CUDA side of the model itself (kernels, devices, the CPU
    // model as reference). The twins and the kernel parity live in src/verify/ (allowed for
    // Cli); what they still take from model/ stays listed here.
    ("cli/gpu.rs", "Model", "gpu probes devices and compiles the model's kernels"),
    ("cli/gpu_parity.rs", "Model", "gpu parity runs the CUDA model against the CPU model"),
    ("cli/gpu_parity.rs", "Engine", "gpu parity compares greedy generations of both devices"),
];

/// Macros that assemble a path from their input, each with why it stays inside its part. An
/// entry the code no longer needs fails the test: remove it.
const MACRO_EXCEPTIONS: &[(&str, &str)] = &[
    // One GEMV body instantiated for each SIMD family: `$kernel` / `$block` name the family's
    // own modules beside it in model/cpu/, never another part.
    ("model/cpu/gemv.rs", "the SIMD families' modules inside model/cpu/"),
];

/// Re-exports the general rule refuses but the tree still makes, as (file, resolved path
/// prefix). Each entry is a debt; one the code no longer makes fails the test: remove it.
const REEXPORT_EXCEPTIONS: &[(&str, &str, &str)] = &[];

fn part_of_file(rel: &str) -> Option<&'static str> {
    PARTS.iter().find(|(prefix, _)| rel == *prefix || rel.starts_with(prefix)).map(|(_, p)| *p)
}

fn part_of_module(name: &str) -> Option<&'static str> {
    MODULES.iter().find(|(m, _)| *m == name).map(|(_, p)| *p)
}

fn may_import(from: &str, to: &str) -> bool {
    from == to || (MAY_IMPORT.contains(&(from, to)) && !NEVER.contains(&(from, to)))
}

/// The module a file is, as path segments under the crate root (`model/norm.rs` → model::norm).
/// `main.rs` is the binary's root, which reaches the library as `deltascope::`.
fn module_of_file(rel: &str) -> Vec<String> {
    let rel = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut segs: Vec<String> = rel.split('/').map(str::to_string).collect();
    if matches!(segs.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        segs.pop();
    }
    segs
}

// ---------------------------------------------------------------------------------------------
// The lexer: identifiers, `::`, single punctuation; literals become one `"` token; comments go.

fn skip_quoted(c: &[char], mut i: usize, close: char) -> usize {
    while i < c.len() {
        match c[i] {
            '\\' => i += 2,
            x if x == close => return i + 1,
            _ => i += 1,
        }
    }
    i
}

fn tokens(src: &str) -> Vec<String> {
    let c: Vec<char> = src.chars().collect();
    let at = |i: usize| c.get(i).copied();
    let mut out = vec![];
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == Some('*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == Some('/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if ch == '"' {
            i = skip_quoted(&c, i + 1, '"');
            out.push("\"".to_string());
        } else if ch == '\'' {
            if at(i + 1) == Some('\\') {
                // '\n', '\'', '\u{…}'
                i = skip_quoted(&c, i + 3, '\'');
                out.push("\"".to_string());
            } else if at(i + 2) == Some('\'') {
                i += 3;
                out.push("\"".to_string());
            } else {
                // A lifetime or a label: its name follows as an identifier.
                out.push("'".to_string());
                i += 1;
            }
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[start..i].iter().collect();
            if matches!(word.as_str(), "r" | "br" | "cr") && matches!(at(i), Some('"' | '#')) {
                let mut j = i;
                while at(j) == Some('#') {
                    j += 1;
                }
                let hashes = j - i;
                if at(j) == Some('"') {
                    // A raw string ends at a quote followed by as many `#`s as it opened with.
                    j += 1;
                    while j < c.len() && !(c[j] == '"' && (1..=hashes).all(|h| at(j + h) == Some('#'))) {
                        j += 1;
                    }
                    i = j + 1 + hashes;
                    out.push("\"".to_string());
                    continue;
                }
                if word == "r" && hashes == 1 {
                    // A raw identifier, `r#type`: the name follows as its own token.
                    i = j;
                    continue;
                }
            }
            if matches!(word.as_str(), "b" | "c") && at(i) == Some('"') {
                i = skip_quoted(&c, i + 1, '"');
                out.push("\"".to_string());
                continue;
            }
            out.push(word);
        } else if ch == ':' && at(i + 1) == Some(':') {
            out.push("::".to_string());
            i += 2;
        } else {
            out.push(ch.to_string());
            i += 1;
        }
    }
    out
}

fn is_ident(t: &str) -> bool {
    t.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

// ---------------------------------------------------------------------------------------------
// Paths and use trees.

/// One path of a use tree (or an expression), as written, with the name it binds in a `use`.
#[derive(Debug, Clone)]
struct UsePath {
    segs: Vec<String>,
    bind: Option<String>,
}

/// Reads a use tree (`a::b::{c, d::{self, e as f}, *}`) from `toks[*i]`, each leaf appended to
/// `out` with `prefix` before it. Also reads a plain expression path (`crate::x::Y::new`).
fn use_tree(toks: &[String], i: &mut usize, prefix: Vec<String>, out: &mut Vec<UsePath>) {
    let mut segs = prefix;
    loop {
        match toks.get(*i).map(String::as_str) {
            Some("{") => {
                *i += 1;
                while let Some(t) = toks.get(*i) {
                    match t.as_str() {
                        "}" => {
                            *i += 1;
                            break;
                        }
                        "," => *i += 1,
                        _ => {
                            let before = *i;
                            use_tree(toks, i, segs.clone(), out);
                            if *i == before {
                                *i += 1;
                            }
                        }
                    }
                }
                return;
            }
            Some("*") => {
                *i += 1;
                segs.push("*".to_string());
                out.push(UsePath { segs, bind: None });
                return;
            }
            Some(t) if is_ident(t) => {
                segs.push(t.to_string());
                *i += 1;
                let mut bind = if t == "self" { segs.iter().rev().nth(1).cloned() } else { Some(t.to_string()) };
                if toks.get(*i).map(String::as_str) == Some("as") {
                    bind = toks.get(*i + 1).filter(|a| a.as_str() != "_").cloned();
                    *i += 2;
                }
                if toks.get(*i).map(String::as_str) == Some("::") {
                    *i += 1;
                    continue;
                }
                out.push(UsePath { segs, bind });
                return;
            }
            _ => {
                if !segs.is_empty() {
                    out.push(UsePath { segs, bind: None });
                }
                return;
            }
        }
    }
}

/// An anchored path resolved against the module it is written in: the absolute segments in the
/// one tree of parts. `None` for a path the crate does not anchor (an extern crate, a child module,
/// a local name), or a `super` past the root.
fn resolve(module: &[String], segs: &[String]) -> Option<Vec<String>> {
    let (mut base, mut rest) = match segs.first()?.as_str() {
        // The engine crate's modules sit under `engine::` in the one tree; the other crates'
        // module names are their parts' own (model, error, chat, generation, …).
        "crate" if module.first().is_some_and(|m| m == "engine") => (vec!["engine".to_string()], &segs[1..]),
        // A lower crate's face: `deltascope_protocol::TextTokenizer` is chat::TextTokenizer.
        // … or in one of its namespaces: `deltascope_model::cuda::Gpu` is model::cuda::Gpu.
        c @ ("deltascope_model" | "deltascope_protocol" | "deltascope_engine")
            if let Some(to) = segs.get(2).and_then(|name| face_of(c, &format!("{}::{name}", segs[1]))) =>
        {
            (to, &segs[3..])
        }
        c @ ("deltascope_model" | "deltascope_protocol" | "deltascope_engine")
            if let Some(to) = segs.get(1).and_then(|name| face_of(c, name)) =>
        {
            (to, &segs[2..])
        }
        "deltascope_engine" => (vec!["engine".to_string()], &segs[1..]),
        "crate" | "deltascope" | "deltascope_model" | "deltascope_protocol" => (vec![], &segs[1..]),
        "self" => (module.to_vec(), &segs[1..]),
        "super" => (module.to_vec(), segs),
        _ => return None,
    };
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    base.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(base)
}

/// The lower crates: their name in a path, their `lib.rs`, and where their modules sit in the
/// one tree of parts.
const LOWER_CRATES: &[(&str, &str, &str)] = &[
    ("deltascope_model", "crates/model/src/lib.rs", ""),
    ("deltascope_protocol", "crates/protocol/src/lib.rs", ""),
    ("deltascope_engine", "crates/engine/src/lib.rs", "engine"),
];

/// What `name` is in `krate`'s face (its `lib.rs`'s `pub use`s), as a path in the one tree.
fn face_of(krate: &str, name: &str) -> Option<Vec<String>> {
    static FACES: std::sync::OnceLock<Vec<(String, String, Vec<String>)>> = std::sync::OnceLock::new();
    let faces = FACES.get_or_init(|| {
        let mut out = vec![];
        for (krate, lib, prefix) in LOWER_CRATES {
            let toks = tokens(&std::fs::read_to_string(root().join(lib)).unwrap());
            let under = |segs: Vec<String>| -> Vec<String> {
                let segs = segs.into_iter().skip_while(|s| s == "crate");
                prefix.split('/').filter(|s| !s.is_empty()).map(str::to_string).chain(segs).collect()
            };
            // A namespace of the face (`pub mod cuda { pub use … }`): its name, and its depth.
            let mut namespace: Option<(String, usize)> = None;
            let mut depth = 0;
            let mut i = 0;
            while i < toks.len() {
                match toks[i].as_str() {
                    "mod" if toks.get(i + 2).is_some_and(|t| t == "{") => {
                        let name = toks[i + 1].clone();
                        // The namespace itself is in the part of what it passes on (model/).
                        out.push((krate.to_string(), name.clone(), under(vec!["model".into(), name.clone()])));
                        namespace = Some((name, depth + 1));
                        i += 2;
                    }
                    "{" => {
                        depth += 1;
                        i += 1;
                    }
                    "}" => {
                        if namespace.as_ref().is_some_and(|(_, d)| *d == depth) {
                            namespace = None;
                        }
                        depth -= 1;
                        i += 1;
                    }
                    "use" if visible_before(&toks, i) => {
                        i += 1;
                        let mut paths = vec![];
                        use_tree(&toks, &mut i, vec![], &mut paths);
                        for p in paths {
                            let Some(bind) = p.bind else { continue };
                            let key = match &namespace {
                                Some((ns, _)) => format!("{ns}::{bind}"),
                                None => bind,
                            };
                            out.push((krate.to_string(), key, under(p.segs)));
                        }
                    }
                    _ => i += 1,
                }
            }
        }
        out
    });
    faces.iter().find(|(k, n, _)| k == krate && n == name).map(|(_, _, p)| p.clone())
}

/// One path into the crate found in a file.
#[derive(Debug)]
struct Reach {
    /// Absolute, under the crate root.
    path: Vec<String>,
    /// A `pub use` or `pub type`: the file passes the item on.
    reexport: bool,
}

impl Reach {
    fn shown(&self) -> String {
        format!("crate::{}", self.path.join("::"))
    }
}

/// Whether a visibility (`pub`, `pub(crate)`, `pub(in …)`, not `pub(self)`) ends at `toks[end]`
/// (exclusive).
fn visible_before(toks: &[String], end: usize) -> bool {
    let t = |k: usize| toks.get(k).map(String::as_str);
    if end >= 1 && t(end - 1) == Some("pub") {
        return true;
    }
    if end >= 1
        && t(end - 1) == Some(")")
        && let Some(open) = (0..end - 1).rev().find(|&k| t(k) == Some("("))
    {
        return open >= 1 && t(open - 1) == Some("pub") && t(open + 1) != Some("self");
    }
    false
}

/// Item keywords: after a visibility, anything else starts a field (`pub name: T`) or a tuple
/// struct's field type (`pub T`).
const ITEM_WORDS: &[&str] = &[
    "fn",
    "struct",
    "enum",
    "union",
    "mod",
    "use",
    "type",
    "const",
    "static",
    "trait",
    "impl",
    "unsafe",
    "async",
    "extern",
    "macro_rules",
    "crate",
];

/// What one file holds: every path into our crates, resolved, and what the scanner refuses
/// outright because it would hide a path.
#[derive(Default)]
struct Scan {
    reaches: Vec<Reach>,
    refused: Vec<String>,
}

/// Every path into our crates in one file, resolved, and what is refused outright.
fn scan(rel: &str, src: &str) -> Scan {
    let toks = tokens(src);
    let file_module = module_of_file(rel);
    // Inline `mod name { … }` blocks: (name, the brace depth inside them).
    let mut inline: Vec<(String, usize)> = vec![];
    let mut depth = 0usize;
    // Names bound by a `use` of an anchored path, to their absolute path.
    let mut bound: Vec<(String, Vec<String>)> = vec![];
    // Inside `pub type … ;`: what it names is passed on.
    let mut reexport_until_semi = false;
    // Inside a `pub` field's type: (the brace depth it sits at, the `<`/`(` nesting inside it).
    let mut pub_field: Option<(usize, usize)> = None;
    // Inside a `macro_rules!` body: the brace depth it closes at.
    let mut macro_body: Option<usize> = None;
    let mut out = Scan::default();
    let mut i = 0;
    while i < toks.len() {
        let module: Vec<String> = file_module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
        let t = toks[i].as_str();
        let prev = if i > 0 { toks[i - 1].as_str() } else { "" };
        let next = toks.get(i + 1).map(String::as_str);
        let passing_on = reexport_until_semi || pub_field.is_some();
        match t {
            "{" => {
                depth += 1;
                i += 1;
            }
            "}" => {
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
                if macro_body == Some(depth) {
                    macro_body = None;
                }
                if pub_field.is_some_and(|(d, _)| d == depth) {
                    pub_field = None;
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            ";" => {
                reexport_until_semi = false;
                i += 1;
            }
            "<" | "(" | "[" if pub_field.is_some() => {
                pub_field = pub_field.map(|(d, n)| (d, n + 1));
                i += 1;
            }
            ">" | ")" | "]" if pub_field.is_some() && prev != "-" => {
                pub_field = match pub_field {
                    // A tuple struct's `)` ends its last field.
                    Some((_, 0)) => None,
                    Some((d, n)) => Some((d, n - 1)),
                    None => None,
                };
                i += 1;
            }
            "," if pub_field.is_some_and(|(_, n)| n == 0) => {
                pub_field = None;
                i += 1;
            }
            "pub" => {
                // `pub name: T` (a field), or `pub T` in a tuple struct; `pub(crate)` too.
                let mut k = i + 1;
                if toks.get(k).is_some_and(|t| t == "(") {
                    while toks.get(k).is_some_and(|t| t != ")") {
                        k += 1;
                    }
                    k += 1;
                }
                let after = toks.get(k).map(String::as_str).unwrap_or("");
                let is_self = toks.get(i + 2).is_some_and(|t| t == "self") && toks.get(i + 1).is_some_and(|t| t == "(");
                if is_ident(after) && !ITEM_WORDS.contains(&after) && !is_self {
                    pub_field = Some((depth, 0));
                    let field_name = toks.get(k + 1).is_some_and(|t| t == ":");
                    i = if field_name { k + 2 } else { k };
                } else {
                    i += 1;
                }
            }
            "extern" if next == Some("crate") => {
                out.refused.push(format!(
                    "{rel}: `extern crate` makes a name the layering cannot follow; name the crate by its path"
                ));
                i += 2;
            }
            "#" if toks.get(i + 1).is_some_and(|t| t == "[") && toks.get(i + 2).is_some_and(|t| t == "path") => {
                out.refused.push(format!("{rel}: `#[path]` places a file where its part cannot be told"));
                i += 3;
            }
            "macro_rules" if next == Some("!") => {
                // The body is the next `{ … }` (or `( … );`): judged until its closing brace.
                macro_body = Some(depth + 1);
                i += 2;
            }
            "$" if macro_body.is_some()
                && next.is_some_and(|n| is_ident(n) && n != "crate")
                && toks.get(i + 2).is_some_and(|t| t == "::") =>
            {
                out.refused.push(format!(
                    "{rel}: a macro assembles a path from its input (`${}::…`); write the path out in full",
                    next.unwrap_or("")
                ));
                i += 3;
            }
            "mod" if next.is_some_and(is_ident) && toks.get(i + 2).is_some_and(|b| b == "{") => {
                inline.push((toks[i + 1].clone(), depth + 1));
                i += 2;
            }
            "type" if visible_before(&toks, i) => {
                reexport_until_semi = true;
                i += 1;
            }
            "use" => {
                let reexport = visible_before(&toks, i);
                i += 1;
                if toks.get(i).is_some_and(|t| t == "::") {
                    i += 1;
                }
                let mut paths = vec![];
                use_tree(&toks, &mut i, vec![], &mut paths);
                for p in paths {
                    let abs = resolve(&module, &p.segs).or_else(|| {
                        // `use crate::model; … use model::X;`: a bound name continues a path.
                        let (_, to) = bound.iter().rev().find(|(n, _)| *n == p.segs[0])?;
                        Some(to.iter().chain(&p.segs[1..]).filter(|s| *s != "self").cloned().collect())
                    });
                    if let Some(path) = abs {
                        if let Some(b) = p.bind {
                            bound.push((b, path.clone()));
                        }
                        out.reaches.push(Reach { path, reexport });
                    }
                }
            }
            "crate"
            | "super"
            | "self"
            | "deltascope"
            | "deltascope_model"
            | "deltascope_protocol"
            | "deltascope_engine"
                if next == Some("::") && prev != "::" =>
            {
                let mut paths = vec![];
                use_tree(&toks, &mut i, vec![], &mut paths);
                for p in paths {
                    if let Some(path) = resolve(&module, &p.segs) {
                        out.reaches.push(Reach { path, reexport: passing_on });
                    }
                }
            }
            // What a `pub type` or a `pub` field names through a name a `use` bound: passed on.
            _ if passing_on && prev != "::" && prev != "." && bound.iter().any(|(n, _)| n == t) => {
                let (_, to) = bound.iter().rev().find(|(n, _)| n == t).expect("just found");
                let mut path = to.clone();
                let mut k = i + 1;
                while toks.get(k).is_some_and(|c| c == "::") && toks.get(k + 1).is_some_and(|n| is_ident(n)) {
                    path.push(toks[k + 1].clone());
                    k += 2;
                }
                out.reaches.push(Reach { path, reexport: true });
                i = k;
            }
            _ => i += 1,
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The judgement.

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// What the check found: the breaches, and which listed exceptions were needed.
#[derive(Default)]
struct Verdict {
    bad: Vec<String>,
    used: BTreeSet<String>,
}

/// Every import and re-export that breaks the layering.
fn judge(files: &[(String, String)]) -> Verdict {
    let mut v = Verdict::default();
    for (rel, src) in files {
        let Some(from) = part_of_file(rel) else {
            v.bad.push(format!("{rel}: belongs to no part of architecture.json; add it to PARTS"));
            continue;
        };
        let mut says_tool = false;
        let Scan { reaches, refused } = scan(rel, src);
        for r in refused {
            match MACRO_EXCEPTIONS.iter().find(|(f, _)| f == rel) {
                Some((f, _)) if r.contains("a macro assembles a path") => {
                    v.used.insert(format!("{f} assembles paths"));
                }
                _ => v.bad.push(r),
            }
        }
        for r in reaches {
            let first = r.path.first().map(String::as_str).unwrap_or("");
            let Some(to) = part_of_module(first) else {
                v.bad.push(format!("{rel}: {} is in no part; add it to MODULES", r.shown()));
                continue;
            };
            if from != "Root" && !may_import(from, to) {
                if DEVELOPER_TOOLS.contains(&rel.as_str()) && matches!(to, "Model" | "Engine" | "Chat") {
                    says_tool = true;
                } else if let Some(e) = TOOL_EXCEPTIONS.iter().find(|(f, p, _)| f == rel && *p == to) {
                    says_tool = true;
                    v.used.insert(format!("{} → {}", e.0, e.1));
                } else {
                    v.bad.push(format!("{rel}: {from} → {to} ({})", r.shown()));
                    continue;
                }
            }
            if r.reexport && from != "Root" && from != to {
                // Whoever may import `from` gets `to`'s item through it.
                let launders: Vec<&str> =
                    MAY_IMPORT.iter().filter(|(r, p)| *p == from && !may_import(r, to)).map(|(r, _)| *r).collect();
                if !launders.is_empty() {
                    let shown = r.shown();
                    let excused = REEXPORT_EXCEPTIONS.iter().find(|(f, prefix, _)| {
                        f == rel && (shown == *prefix || shown.starts_with(&format!("{prefix}::")))
                    });
                    match excused {
                        Some(e) => {
                            v.used.insert(format!("{} re-exports {}", e.0, e.1));
                        }
                        None => v.bad.push(format!(
                            "{rel}: {from} re-exports {shown} ({to}), which {} may not import",
                            launders.join(", ")
                        )),
                    }
                }
            }
        }
        let doc: String = src.lines().filter(|l| l.trim_start().starts_with("//!")).collect::<Vec<_>>().join(" ");
        if says_tool && !doc.to_lowercase().contains("developer tool") {
            v.bad.push(format!(
                "{rel}: reaches past the backend as a developer tool; say so in its module doc (\"developer tool\")"
            ));
        }
    }
    v
}

fn violations(files: &[(String, String)]) -> Vec<String> {
    judge(files).bad
}

/// Where each crate's sources sit in the one tree of parts: the model and protocol crates'
/// module names are their parts' own, the engine crate's modules sit under `engine/` (its
/// `lib.rs` is `engine/mod.rs`), the top crate's are under `src/`.
const CRATE_SOURCES: &[(&str, &str)] =
    &[("src", ""), ("crates/model/src", ""), ("crates/protocol/src", ""), ("crates/engine/src", "engine/")];

/// Every Rust file of every crate under `root`, as (its path in the one tree, its text).
fn tree_at(root: &Path) -> Vec<(String, String)> {
    let mut files = vec![];
    for (dir, prefix) in CRATE_SOURCES {
        let src = root.join(dir);
        let mut paths = vec![];
        rust_files(&src, &mut paths);
        for p in paths {
            let rel = p.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
            let rel = match (*prefix, rel.as_str()) {
                ("engine/", "lib.rs") => "engine/mod.rs".to_string(),
                _ => format!("{prefix}{rel}"),
            };
            files.push((rel, std::fs::read_to_string(&p).unwrap()));
        }
    }
    files
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn tree() -> Vec<(String, String)> {
    tree_at(&root())
}

#[test]
fn imports_follow_the_layers() {
    let files = tree();
    assert!(files.len() > 40, "only {} source files found", files.len());
    let verdict = judge(&files);
    assert!(verdict.bad.is_empty(), "imports against the layering (design.md §3):\n{}", verdict.bad.join("\n"));
    let listed = TOOL_EXCEPTIONS
        .iter()
        .map(|(f, p, _)| format!("{f} → {p}"))
        .chain(REEXPORT_EXCEPTIONS.iter().map(|(f, p, _)| format!("{f} re-exports {p}")))
        .chain(MACRO_EXCEPTIONS.iter().map(|(f, _)| format!("{f} assembles paths")));
    let stale: Vec<String> = listed.filter(|e| !verdict.used.contains(e)).collect();
    assert!(stale.is_empty(), "exceptions no longer needed; remove them from this test:\n{}", stale.join("\n"));
}

/// Inside the TUI the compiler sees one crate, so this test holds its floors: the screen's shared
/// words, the panel contract, the message log, the effects and the drawing helpers import no
/// panel, no app and no view; a panel imports neither the app nor the frame's composition
/// (`view/`), which sit above it; the app never imports the view, which reads it.
const TUI_FLOORS: &[(&str, &[&str])] = &[
    ("tui/screen.rs", &["tui::panels", "tui::app", "tui::view"]),
    ("tui/panel.rs", &["tui::panels", "tui::app", "tui::view"]),
    ("tui/log.rs", &["tui::panels", "tui::app", "tui::view"]),
    ("tui/effect.rs", &["tui::panels", "tui::app", "tui::view"]),
    ("tui/wrap.rs", &["tui::panels", "tui::app", "tui::view"]),
    ("tui/popup.rs", &["tui::panels", "tui::app", "tui::view"]),
    ("tui/panels/", &["tui::app", "tui::view"]),
    ("tui/app/", &["tui::view"]),
];

fn tui_breaches(files: &[(String, String)]) -> Vec<String> {
    let mut bad = vec![];
    for (rel, src) in files {
        let Some((_, banned)) =
            TUI_FLOORS.iter().find(|(at, _)| rel == at || (at.ends_with('/') && rel.starts_with(at)))
        else {
            continue;
        };
        for r in scan(rel, src).reaches {
            let path = r.path.join("::");
            if let Some(b) = banned.iter().find(|b| path == **b || path.starts_with(&format!("{b}::"))) {
                bad.push(format!("{rel}: reaches {} ({b} sits above it)", r.shown()));
            }
        }
    }
    bad
}

#[test]
fn the_tui_panels_sit_below_the_app_and_the_view() {
    let files = tree();
    assert!(files.iter().any(|(rel, _)| rel.starts_with("tui/panels/")), "no panels found");
    let bad = tui_breaches(&files);
    assert!(bad.is_empty(), "the TUI's floors are breached:\n{}", bad.join("\n"));
    // The check catches each way up: a panel into the app, through `super::super`, into the
    // view; the contract into a panel; the app into the view.
    let f = |rel: &str, src: &str| tui_breaches(&[(rel.to_string(), src.to_string())]);
    assert_eq!(
        f("tui/panels/gauges.rs", "use crate::tui::app::App;"),
        ["tui/panels/gauges.rs: reaches crate::tui::app::App (tui::app sits above it)"]
    );
    assert_eq!(f("tui/panels/help.rs", "fn f() { super::super::app::Effect::Cancel; }").len(), 1);
    assert_eq!(f("tui/panels/help.rs", "use crate::tui::view::View;").len(), 1);
    assert_eq!(f("tui/panel.rs", "use crate::tui::panels::help::Help;").len(), 1);
    assert_eq!(f("tui/app/look.rs", "use crate::tui::view::View;").len(), 1);
    assert!(f("tui/view/mod.rs", "use crate::tui::app::App;").is_empty());
    assert!(f("tui/panels/help.rs", "use crate::tui::panel::Panel;").is_empty());
}

/// The unsafe-code wall at the root of each part (module-level inner attributes). Model holds the
/// SIMD kernels and the CUDA side and is the one part left open; checkpoint/ and verify/ deny
/// unsafe code and allow it on the few functions that need it (the file mapping; kernel
/// launches), each with its `SAFETY:` comment.
const UNSAFE_WALLS: &[(&str, &[&str])] = &[
    ("error.rs", &["#![forbid(unsafe_code)]"]),
    ("hash.rs", &["#![forbid(unsafe_code)]"]),
    ("exit.rs", &["#![forbid(unsafe_code)]"]),
    ("units.rs", &["#![forbid(unsafe_code)]"]),
    ("devices.rs", &["#![forbid(unsafe_code)]"]),
    ("checkpoint/mod.rs", &["#![deny(unsafe_code)]"]),
    ("chat/mod.rs", &["#![forbid(unsafe_code)]"]),
    ("generation/mod.rs", &["#![forbid(unsafe_code)]"]),
    ("engine/mod.rs", &["#![forbid(unsafe_code)]"]),
    ("backend/mod.rs", &["#![forbid(unsafe_code)]"]),
    ("session/mod.rs", &["#![forbid(unsafe_code)]"]),
    ("server/mod.rs", &["#![forbid(unsafe_code)]"]),
    ("tui/mod.rs", &["#![forbid(unsafe_code)]"]),
    ("cli/mod.rs", &["#![forbid(unsafe_code)]"]),
    ("main.rs", &["#![forbid(unsafe_code)]"]),
    ("verify/mod.rs", &["#![forbid(unsafe_code)]", "#![deny(unsafe_code)]"]),
];

#[test]
fn every_part_but_model_walls_off_unsafe_code() {
    let files = tree();
    let mut missing = vec![];
    for (root, walls) in UNSAFE_WALLS {
        let Some((_, text)) = files.iter().find(|(rel, _)| rel == root) else {
            missing.push(format!("{root}: not found in the tree of parts"));
            continue;
        };
        if !text.lines().any(|l| walls.contains(&l.trim())) {
            missing.push(format!("{root}: needs `{}` at its top", walls.join("` or `")));
        }
    }
    for (part, _) in PARTS.iter().filter(|(_, p)| *p != "Root" && *p != "Model") {
        let root = if part.ends_with('/') { format!("{part}mod.rs") } else { part.to_string() };
        if !UNSAFE_WALLS.iter().any(|(r, _)| *r == root) {
            missing.push(format!("{root}: a part without an entry in UNSAFE_WALLS"));
        }
    }
    assert!(missing.is_empty(), "unsafe code not walled off:\n{}", missing.join("\n"));
}

#[test]
fn the_tables_are_consistent() {
    let parts: BTreeSet<&str> = PARTS.iter().map(|(_, p)| *p).filter(|p| *p != "Root").collect();
    let reached: BTreeSet<&str> = MODULES.iter().map(|(_, p)| *p).collect();
    assert_eq!(parts, reached, "every part has a module and every module a part");
    for (a, b) in MAY_IMPORT.iter().chain(NEVER) {
        assert!(parts.contains(a) && parts.contains(b), "unknown part in ({a}, {b})");
    }
    for pair in NEVER {
        assert!(!MAY_IMPORT.contains(pair), "{pair:?} is both allowed and never");
    }
}

#[test]
fn the_lexer_drops_comments_and_literals() {
    let toks = tokens(
        "let u = \"http://x\"; /* a /* nested */ crate::tui */ let r = r#\"// \"crate::x\"\"#; \
         let c = '\"'; let q = '\\''; fn f<'a>(_: &'a str) {} // crate::model\nuse crate::tui::App;",
    );
    let text = toks.join(" ");
    assert!(text.ends_with("use crate :: tui :: App ;"), "{text}");
    assert!(!text.contains("model") && !text.contains("nested"), "{text}");
    assert_eq!(text.matches("crate").count(), 1, "{text}");
    assert!(text.contains("fn f < ' a >"), "{text}");
}

#[test]
fn the_check_catches_what_it_is_for() {
    let f = |rel: &str, src: &str| vec![(rel.to_string(), src.to_string())];
    // The forbidden edges of architecture.json.
    assert_eq!(
        violations(&f("model/gdn.rs", "use crate::engine::Phase;")),
        ["model/gdn.rs: Model → Engine (crate::engine::Phase)"]
    );
    assert_eq!(violations(&f("model/x.rs", "use crate::chat::TextTokenizer;")).len(), 1);
    assert_eq!(violations(&f("tui/x.rs", "fn f() { crate::cli::run::x(); }")).len(), 1);
    // The engine crate's `crate::` is its own root (`engine::` in the tree of parts).
    assert!(violations(&f("engine/x.rs", "fn f() { crate::sampler::argmax(&[]); }")).is_empty());
    assert_eq!(
        violations(&f("tui/x.rs", "use deltascope_engine::Generator;")),
        ["tui/x.rs: Tui → Engine (crate::engine::generator::Generator)"]
    );
    assert_eq!(violations(&f("server/x.rs", "fn f() { deltascope_model::Model::load(); }")).len(), 1);
    assert!(violations(&f("tui/x.rs", "use deltascope_model::human_bytes;")).is_empty());
    assert_eq!(violations(&f("chat/x.rs", "use crate::generation::Event;")).len(), 1);
    assert_eq!(violations(&f("generation/x.rs", "use deltascope_model::Model;")).len(), 1);
    assert_eq!(violations(&f("checkpoint/x.rs", "use crate::model::Model;")).len(), 1);
    assert_eq!(violations(&f("tui/mod.rs", "use crate::model::Model;")).len(), 1);
    assert_eq!(violations(&f("tui/mod.rs", "use crate::cli::common::ModelArgs;")).len(), 1);
    assert_eq!(violations(&f("server/mod.rs", "use crate::model::Model;")).len(), 1);
    assert_eq!(violations(&f("generation/events.rs", "use crate::engine::Generator;")).len(), 1);
    assert_eq!(violations(&f("generation/tally.rs", "use crate::model::Model;")).len(), 1);
    assert_eq!(violations(&f("verify/twins.rs", "use crate::tui::App;")).len(), 1);
    // Front ends reach the engine only through the backend (and the protocol, generation/).
    assert_eq!(violations(&f("tui/app.rs", "use crate::engine::EngineEvent;")).len(), 1);
    assert_eq!(violations(&f("cli/run.rs", "use crate::engine::EngineHandle;")).len(), 1);
    assert!(violations(&f("tui/app.rs", "use crate::generation::EngineEvent;")).is_empty());
    assert!(violations(&f("cli/gpu.rs", "use crate::verify::twins;")).is_empty());
    // Groups and multi-line imports are read member by member, nested groups too.
    let group = "use crate::{\n    backend::Backend,\n    model::{Model, LoadOptions},\n};";
    assert_eq!(
        violations(&f("tui/x.rs", group)),
        ["tui/x.rs: Tui → Model (crate::model::Model)", "tui/x.rs: Tui → Model (crate::model::LoadOptions)"]
    );
    // `super::` chains and `self::` resolve to absolute paths (the review's first hole).
    assert_eq!(
        violations(&f("model/norm.rs", "use super::super::tui::app::App;")),
        ["model/norm.rs: Model → Tui (crate::tui::app::App)"]
    );
    assert_eq!(violations(&f("model/cuda/emu.rs", "fn f() { super::super::super::engine::x(); }")).len(), 1);
    assert!(violations(&f("model/cuda/emu.rs", "use super::super::device::Buf;")).is_empty());
    assert!(violations(&f("model/mod.rs", "use self::norm::RmsNorm; use super::error::Error;")).is_empty());
    // … inside inline modules, which add a level: here `super::super` is model, not the root.
    assert!(violations(&f("model/plan.rs", "mod tests { fn t() { super::super::norm::x(); } }")).is_empty());
    assert_eq!(violations(&f("model/plan.rs", "mod a { } fn t() { super::super::tui::x(); }")).len(), 1);
    // A name bound by a use continues a path.
    assert_eq!(violations(&f("backend/x.rs", "use crate::model; pub use model::Model;")).len(), 1);
    // Re-exports may not launder an item past the layering (the review's second hole): both the
    // model's DeviceSpec and Model (front ends take DeviceSpec from Core's devices.rs).
    let laundered = violations(&f("backend/mod.rs", "pub use crate::model::{DeviceSpec, Model};"));
    assert_eq!(laundered.len(), 2, "{laundered:?}");
    assert!(laundered[1].starts_with("backend/mod.rs: Backend re-exports crate::model::Model (Model), which"));
    assert!(laundered[1].contains("Tui") && laundered[1].contains("Server"), "{laundered:?}");
    let two = [
        ("backend/mod.rs".to_string(), "pub use crate::model::{DeviceSpec, Model};".to_string()),
        ("tui/event.rs".to_string(), "use crate::backend::Model;".to_string()),
    ];
    assert_eq!(violations(&two).len(), 2, "the laundering is reported where the items are passed on");
    assert_eq!(violations(&f("backend/x.rs", "pub(crate) use crate::model::Model;")).len(), 1);
    assert_eq!(violations(&f("backend/x.rs", "pub type Weights = crate::model::Model;")).len(), 1);
    assert_eq!(violations(&f("generation/x.rs", "pub use crate::chat::TextTokenizer;")).len(), 1);
    assert!(violations(&f("backend/x.rs", "use crate::model::Model; type M = crate::model::Model;")).is_empty());
    assert!(violations(&f("model/mod.rs", "pub use crate::checkpoint::ModelSource;")).is_empty());
    assert!(violations(&f("backend/mod.rs", "pub use crate::generation::events::*;")).is_empty());
    // Comments and literals are not code: a `//` inside a string does not cut the line.
    assert_eq!(violations(&f("model/x.rs", "let u = \"http://x\" ; use crate::tui::App;")).len(), 1);
    assert_eq!(violations(&f("model/x.rs", "/* crate::tui */ fn f() { crate::tui::x(); }")).len(), 1);
    assert!(violations(&f("tui/x.rs", "// see crate::model::Model\nfn f() {}")).is_empty());
    assert!(violations(&f("tui/x.rs", "/* crate::model::Model */ fn f() { \"crate::model\"; }")).is_empty());
    // What is allowed passes: the backend seam, the declared developer tools.
    assert!(violations(&f("tui/x.rs", "use crate::backend::{EngineEvent, Generation};")).is_empty());
    assert!(violations(&f("cli/bench.rs", "//! A developer tool.\nuse crate::model::gdn::replay_head;")).is_empty());
    assert!(violations(&f("backend/local.rs", "use crate::model::Model; use crate::engine::EngineHandle;")).is_empty());
    // A developer tool says so; a subcommand that is none may not reach past the backend.
    assert_eq!(violations(&f("cli/bench.rs", "use crate::model::gdn::replay_head;")).len(), 1);
    assert_eq!(violations(&f("cli/run.rs", "//! A developer tool.\nuse crate::model::Model;")).len(), 1);
    // The binary reaches the library as `deltascope::`.
    assert_eq!(violations(&f("main.rs", "use deltascope_model::Model;")).len(), 1);
    assert!(violations(&f("main.rs", "use deltascope::cli::{Cli, main_with};")).is_empty());
    // A new top-level module must be placed in a part, and so must a path to one.
    assert_eq!(violations(&f("newthing/mod.rs", "")).len(), 1);
    assert_eq!(violations(&f("tui/x.rs", "use crate::newthing::X;")).len(), 1);
    assert_eq!(violations(&f("model/mod.rs", "use super::*;")).len(), 1);
}

// ---------------------------------------------------------------------------------------------
// The review's four holes, each planted in a scratch copy of the tree and caught.

/// A copy of every crate's sources in a temporary folder, laid out as in the repository.
fn scratch_copy() -> tempfile::TempDir {
    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let p = e.unwrap().path();
            let dest = to.join(p.file_name().unwrap());
            if p.is_dir() {
                copy_dir(&p, &dest);
            } else {
                std::fs::copy(&p, &dest).unwrap();
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    for (src, _) in CRATE_SOURCES {
        copy_dir(&root().join(src), &dir.path().join(src));
    }
    dir
}

/// Replaces `from` (which must occur exactly once) by `to` in the copy's `file`.
fn plant(dir: &Path, file: &str, from: &str, to: &str) {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches(from).count(), 1, "{file}: the plant's anchor {from:?} must occur exactly once");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

/// Appends `code` to the copy's `file`.
fn plant_at_end(dir: &Path, file: &str, code: &str) {
    let path = dir.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(&path, format!("{text}\n{code}\n")).unwrap();
}

fn breaches_in(dir: &Path) -> Vec<String> {
    judge(&tree_at(dir)).bad
}

#[test]
fn a_scratch_copy_of_the_tree_is_clean() {
    let dir = scratch_copy();
    assert_eq!(breaches_in(dir.path()), Vec::<String>::new());
}

#[test]
fn a_pub_type_over_a_privately_imported_name_is_caught() {
    // The review's P2b: the private `use` is Backend → Engine (allowed), the alias passes the
    // engine's Generator on to every part that may import the backend.
    let dir = scratch_copy();
    plant_at_end(
        dir.path(),
        "src/backend/local.rs",
        "use deltascope_engine::Generator as EngineGenerator;\npub type PlantedGenerator<'a> = EngineGenerator<'a>;",
    );
    plant_at_end(dir.path(), "src/tui/event.rs", "use crate::backend::local::PlantedGenerator;");
    assert_eq!(
        breaches_in(dir.path()),
        [
            "backend/local.rs: Backend re-exports crate::engine::generator::Generator (Engine), which Session, Server, Tui, Cli, Verify may not import"
        ]
    );
    // P2c: a module bound by `use … as`, then a path through it.
    let dir = scratch_copy();
    plant_at_end(
        dir.path(),
        "src/backend/params.rs",
        "use deltascope_engine as eng;\npub type PlantedHandle = eng::EngineHandle;",
    );
    let found = breaches_in(dir.path());
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("backend/params.rs: Backend re-exports crate::engine::EngineHandle (Engine)"),
        "{found:?}"
    );
}

#[test]
fn extern_crate_self_is_caught() {
    // The review's P3b: a new name for the top crate, through which a path reaches the CLI.
    let dir = scratch_copy();
    plant_at_end(
        dir.path(),
        "src/tui/render.rs",
        "extern crate self as planted_ds;\nfn planted() { let _ = planted_ds::cli::common::ModelArgs::default(); }",
    );
    assert_eq!(
        breaches_in(dir.path()),
        ["tui/render.rs: `extern crate` makes a name the layering cannot follow; name the crate by its path"]
    );
}

#[test]
fn a_macro_that_assembles_a_path_is_caught() {
    // The review's P4: the definition holds `$root::$m`, the call `crate cli`.
    let dir = scratch_copy();
    plant_at_end(
        dir.path(),
        "src/tui/render.rs",
        "macro_rules! planted_path { ($root:tt $m:ident) => { $root::$m::common::ModelArgs::default() }; }\n\
         fn planted() { let _ = planted_path!(crate cli); }",
    );
    assert_eq!(
        breaches_in(dir.path()),
        [
            "tui/render.rs: a macro assembles a path from its input (`$root::…`); write the path out in full",
            "tui/render.rs: a macro assembles a path from its input (`$m::…`); write the path out in full",
        ]
    );
}

#[test]
fn a_public_field_that_hands_on_the_model_is_caught() {
    // `Loaded` holds the model privately; made `pub`, the TUI (which holds a `Loaded`) would
    // reach the tensors without naming the model crate.
    let dir = scratch_copy();
    plant(dir.path(), "src/backend/local.rs", "\n    model: Arc<Model>,", "\n    pub model: Arc<Model>,");
    assert_eq!(
        breaches_in(dir.path()),
        [
            "backend/local.rs: Backend re-exports crate::model::Model (Model), which Session, Server, Tui, Cli may not import"
        ]
    );
    // A tuple struct's public field too.
    let dir = scratch_copy();
    plant_at_end(dir.path(), "src/backend/local.rs", "pub struct PlantedWeights(pub Arc<Model>);");
    assert_eq!(breaches_in(dir.path()).len(), 1);
}

/// The dependencies between our crates, read from each manifest's `[dependencies]`.
fn our_dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap();
    let deps = text.split("\n[dependencies]\n").nth(1).unwrap_or("");
    let deps = deps.split("\n[").next().unwrap_or("");
    let mut out: Vec<String> = deps
        .lines()
        .filter_map(|l| l.split(['=', '.']).next())
        .map(str::trim)
        .filter(|n| n.starts_with("deltascope"))
        .map(str::to_string)
        .collect();
    out.sort();
    out
}

#[test]
fn the_crates_are_the_floors() {
    // What the compiler holds: each floor names only the floors below it.
    let floors: &[(&str, &[&str])] = &[
        ("crates/model/Cargo.toml", &[]),
        ("crates/protocol/Cargo.toml", &["deltascope-model"]),
        ("crates/engine/Cargo.toml", &["deltascope-model", "deltascope-protocol"]),
        ("Cargo.toml", &["deltascope-engine", "deltascope-model", "deltascope-protocol"]),
    ];
    for (manifest, below) in floors {
        assert_eq!(our_dependencies(&root().join(manifest)), *below, "{manifest}");
    }
    // `cargo test` / `cargo run` at the root cover every floor.
    let top = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let members = top.lines().find(|l| l.starts_with("default-members")).expect("default-members");
    for (manifest, _) in &floors[..3] {
        let dir = manifest.trim_end_matches("/Cargo.toml");
        assert!(members.contains(&format!("\"{dir}\"")), "default-members lacks {dir}: {members}");
    }
}
