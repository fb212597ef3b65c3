//! The layering of design.md §3 (and ../shared/architecture.json), enforced: every `crate::`
//! path in `src/` may only point at a part its own part is allowed to import. Data flows one
//! way — front ends → backend → engine → model — and nothing imports upward.

use std::path::{Path, PathBuf};

/// The parts, by path prefix under `src/` (first match wins).
const PARTS: &[(&str, &str)] = &[
    ("error.rs", "Core"),
    ("checkpoint/", "Core"),
    ("units.rs", "Core"),
    ("lib.rs", "Root"),
    ("model/", "Model"),
    ("chat/", "Chat"),
    ("engine/", "Engine"),
    ("backend/", "Backend"),
    ("session/", "Session"),
    ("server/", "Server"),
    ("tui/", "Tui"),
    ("cli/", "Cli"),
    ("verify/", "Verify"),
    ("main.rs", "Cli"),
];

/// Which part a `crate::NAME` path reaches.
const MODULES: &[(&str, &str)] = &[
    ("error", "Core"),
    ("Error", "Core"),
    ("Result", "Core"),
    ("checkpoint", "Core"),
    ("units", "Core"),
    ("model", "Model"),
    ("chat", "Chat"),
    ("engine", "Engine"),
    ("backend", "Backend"),
    ("session", "Session"),
    ("server", "Server"),
    ("tui", "Tui"),
    ("cli", "Cli"),
    ("verify", "Verify"),
];

/// architecture.json's `may_import` (a part may always use itself).
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
    ("Verify", "Model"),
    ("Verify", "Chat"),
    ("Verify", "Core"),
    ("Verify", "Backend"),
    ("Cli", "Verify"),
    ("Tui", "Verify"),
];

/// The developer tools that measure the engine itself and may reach Model / Engine / Chat
/// directly (architecture.json `developer_tools`); each says so in its source.
/// `synth` reads the model's configuration to know which tensors a checkpoint holds.
const DEVELOPER_TOOLS: &[&str] =
    &["cli/inspect.rs", "cli/logits.rs", "cli/bench.rs", "cli/synth.rs", "cli/gpu.rs", "cli/gpu_parity.rs"];

fn part_of_file(rel: &str) -> Option<&'static str> {
    PARTS.iter().find(|(prefix, _)| rel == *prefix || rel.starts_with(prefix)).map(|(_, p)| *p)
}

fn part_of_module(name: &str) -> Option<&'static str> {
    MODULES.iter().find(|(m, _)| *m == name).map(|(_, p)| *p)
}

fn allowed(from: &str, to: &str, rel: &str) -> bool {
    from == to
        || from == "Root"
        || MAY_IMPORT.contains(&(from, to))
        || (DEVELOPER_TOOLS.contains(&rel) && matches!(to, "Model" | "Engine" | "Chat"))
}

/// The source without comments (doc comments mention paths that are not imports).
fn strip_comments(src: &str) -> String {
    src.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// Every top-level module named after `crate::` in `src`: `crate::x::…`, and each member of
/// a group `use crate::{x::…, y, …}`.
fn crate_modules(src: &str) -> Vec<String> {
    let code = strip_comments(src);
    let mut out = vec![];
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        // `deltascope::crate::` never occurs; `some_crate::` must not count.
        let before = rest[..at].chars().last();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 || (depth == 1 && c == ',') {
                    let name: String = item.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if !name.is_empty() {
                        out.push(name);
                    }
                    item.clear();
                    if depth == 0 {
                        break;
                    }
                } else if depth == 1 || !item.contains("::") {
                    item.push(c);
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            out.push(name);
        }
    }
    out
}

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

/// Every import that breaks the layering, as "file: From → To (crate::name)".
fn violations(files: &[(String, String)]) -> Vec<String> {
    let mut bad = vec![];
    for (rel, src) in files {
        let Some(from) = part_of_file(rel) else {
            bad.push(format!("{rel}: belongs to no part of architecture.json; add it to PARTS"));
            continue;
        };
        for name in crate_modules(src) {
            match part_of_module(&name) {
                None => bad.push(format!("{rel}: crate::{name} is in no part; add it to MODULES")),
                Some(to) if !allowed(from, to, rel) => bad.push(format!("{rel}: {from} → {to} (crate::{name})")),
                Some(_) => {}
            }
        }
    }
    bad
}

#[test]
fn imports_follow_the_layers() {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = vec![];
    rust_files(&src, &mut paths);
    let files: Vec<(String, String)> = paths
        .iter()
        .map(|p| {
            let rel = p.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
            (rel, std::fs::read_to_string(p).unwrap())
        })
        .collect();
    assert!(files.len() > 40, "only {} source files found", files.len());
    let bad = violations(&files);
    assert!(bad.is_empty(), "imports against the layering (design.md §3):\n{}", bad.join("\n"));
}

#[test]
fn the_check_catches_what_it_is_for() {
    let f = |rel: &str, src: &str| vec![(rel.to_string(), src.to_string())];
    // The forbidden edges of architecture.json.
    assert_eq!(
        violations(&f("model/gdn.rs", "use crate::engine::Phase;")),
        ["model/gdn.rs: Model → Engine (crate::engine)"]
    );
    assert_eq!(violations(&f("model/x.rs", "use crate::chat::TextTokenizer;")).len(), 1);
    assert_eq!(violations(&f("engine/x.rs", "fn f() { crate::tui::app::App::new(); }")).len(), 1);
    assert_eq!(violations(&f("tui/mod.rs", "use crate::model::Model;")).len(), 1);
    assert_eq!(violations(&f("tui/mod.rs", "use crate::cli::common::GenArgs;")).len(), 1);
    assert_eq!(violations(&f("server/mod.rs", "use crate::model::Model;")).len(), 1);
    // Front ends reach the engine only through the backend.
    assert_eq!(violations(&f("tui/app.rs", "use crate::engine::EngineEvent;")).len(), 1);
    assert_eq!(violations(&f("cli/run.rs", "use crate::engine::EngineHandle;")).len(), 1);
    // Groups and multi-line imports are read member by member.
    let group = "use crate::{\n    backend::Backend,\n    model::{Model, LoadOptions},\n};";
    assert_eq!(violations(&f("tui/x.rs", group)), ["tui/x.rs: Tui → Model (crate::model)"]);
    // What is allowed passes: the backend seam, the declared developer tools, comments.
    assert!(violations(&f("tui/x.rs", "use crate::backend::{EngineEvent, Generation};")).is_empty());
    assert!(violations(&f("cli/bench.rs", "use crate::model::gdn::replay_head;")).is_empty());
    assert!(violations(&f("backend/local.rs", "use crate::model::Model; use crate::engine::EngineHandle;")).is_empty());
    assert!(violations(&f("tui/x.rs", "// see crate::model::Model\nfn f() {}")).is_empty());
    // A new top-level module must be placed in a part.
    assert_eq!(violations(&f("newthing/mod.rs", "")).len(), 1);
}
