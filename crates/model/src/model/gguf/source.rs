//! `--model FILE.gguf`, or a folder holding one GGUF or a split set
//! (`NAME-0000N-of-0000M.gguf`), opened as a [`ModelSource`]: every part's header read, the set
//! checked complete, every tensor's type checked readable before anything loads, and the
//! Hugging Face files the metadata stands for synthesised (`config.json`, and the tokenizer
//! files `vocab.rs` rebuilds).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::config::hf_config;
use super::container::Gguf;
use super::file::GgufFile;
use super::store::supported_list;
use super::vocab;
use crate::checkpoint::{GgufSource, ModelSource};
use crate::error::{Error, Result};

/// The model at `path`: a GGUF file or a folder of one (or of a split set) opens as GGUF;
/// anything else is a Hugging Face directory.
pub fn source_for(path: &Path) -> Result<ModelSource> {
    match gguf_parts(path)? {
        Some((dir, parts)) => open_parts(dir, parts),
        None => Ok(ModelSource::Dir(path.to_path_buf())),
    }
}

/// The files of the GGUF model at `path` (a file, a part of a split set, or a folder), in
/// order; an error when it is not one or a part is missing.
pub fn parts(path: &Path) -> Result<Vec<PathBuf>> {
    match gguf_parts(path)? {
        Some((dir, parts)) => Ok(parts.iter().map(|p| dir.join(p)).collect()),
        None => Err(Error::Gguf {
            file: path.display().to_string(),
            message: "is not a GGUF file, nor a folder of one".into(),
        }),
    }
}

/// Whether `path` names a GGUF model: a `.gguf` file (or one that starts with the magic), or a
/// folder with GGUF files and no config.json. (Whether it opens is [`source_for`]'s to say.)
pub fn is_gguf(path: &Path) -> bool {
    if path.is_file() {
        return path.extension().is_some_and(|e| e == "gguf") || starts_with_magic(path);
    }
    path.is_dir()
        && !path.join("config.json").exists()
        && std::fs::read_dir(path)
            .is_ok_and(|mut d| d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().ends_with(".gguf"))))
}

/// `(directory, part names)` when `path` is a GGUF model.
fn gguf_parts(path: &Path) -> Result<Option<(PathBuf, Vec<String>)>> {
    if path.is_file() {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if !name.ends_with(".gguf") && !starts_with_magic(path) {
            return Ok(None);
        }
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        return match split_name(name) {
            Some((stem, _, count)) => Ok(Some((dir.clone(), split_set(&dir, stem, count)?))),
            None => Ok(Some((dir, vec![name.to_string()]))),
        };
    }
    if !path.is_dir() || path.join("config.json").exists() {
        return Ok(None);
    }
    let mut ggufs: Vec<String> = std::fs::read_dir(path)
        .map_err(|e| Error::io(path, e))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        // A vision projector ships beside the model; it is not the language model.
        .filter(|n| n.ends_with(".gguf") && !n.starts_with("mmproj"))
        .collect();
    ggufs.sort();
    match &ggufs[..] {
        [] => Ok(None),
        [one] => match split_name(one) {
            Some((stem, _, count)) => Ok(Some((path.to_path_buf(), split_set(path, stem, count)?))),
            None => Ok(Some((path.to_path_buf(), ggufs))),
        },
        [first, ..] => match split_name(first) {
            Some((stem, _, count)) if ggufs.iter().all(|n| split_name(n).is_some_and(|s| s.0 == stem)) => {
                Ok(Some((path.to_path_buf(), split_set(path, stem, count)?)))
            }
            _ => Err(Error::Gguf {
                file: path.display().to_string(),
                message: format!(
                    "holds {} GGUF files that are not one split set ({}): name the file to run",
                    ggufs.len(),
                    ggufs.join(", ")
                ),
            }),
        },
    }
}

fn starts_with_magic(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    std::fs::File::open(path).and_then(|mut f| f.read_exact(&mut magic)).is_ok() && &magic == b"GGUF"
}

/// `NAME-0000N-of-0000M.gguf` as `(NAME, N, M)`.
fn split_name(name: &str) -> Option<(&str, usize, usize)> {
    let base = name.strip_suffix(".gguf")?;
    let (rest, count) = base.rsplit_once("-of-")?;
    let (stem, no) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(no) || !digits(count) {
        return None;
    }
    Some((stem, no.parse().ok()?, count.parse().ok()?))
}

/// Every part of a split set, in order; a missing part is an error naming it.
fn split_set(dir: &Path, stem: &str, count: usize) -> Result<Vec<String>> {
    let parts: Vec<String> = (1..=count).map(|i| format!("{stem}-{i:05}-of-{count:05}.gguf")).collect();
    let missing: Vec<&String> = parts.iter().filter(|p| !dir.join(p).is_file()).collect();
    if !missing.is_empty() {
        return Err(Error::Gguf {
            file: dir.join(&parts[0]).display().to_string(),
            message: format!(
                "is part of a split set of {count} files, and {} missing: {}",
                if missing.len() == 1 { "one is" } else { "some are" },
                missing.iter().map(|m| m.as_str()).collect::<Vec<_>>().join(", ")
            ),
        });
    }
    Ok(parts)
}

/// Opens the parts, checks them, and synthesises the Hugging Face files.
fn open_parts(dir: PathBuf, parts: Vec<String>) -> Result<ModelSource> {
    let files: Vec<GgufFile> = parts.iter().map(|p| GgufFile::open(&dir.join(p))).collect::<Result<_>>()?;
    let first = &files[0];
    let label = first.path().display().to_string();
    let fail = |message: String| Error::Gguf { file: label.clone(), message };
    check_split(&files)?;
    // Every tensor's type is checked before anything loads.
    for f in &files {
        if let Some((name, ty)) = f.unsupported().first() {
            return Err(Error::Gguf {
                file: f.path().display().to_string(),
                message: format!(
                    "tensor `{name}` is {ty}, which deltascope cannot read (it reads {})",
                    supported_list()
                ),
            });
        }
    }
    let header = first.header();
    let tensor = |n: &str| files.iter().find_map(|f| f.header().tensor(n));
    let embed = tensor("token_embd.weight").ok_or_else(|| fail("has no `token_embd.weight` tensor".into()))?;
    let vocab_rows = embed.dims.get(1).copied().unwrap_or(0);
    let config = hf_config(header, vocab_rows, tensor("output.weight").is_some()).map_err(fail)?;
    let mut synthesised = vec![("config.json".to_string(), json_bytes(&config))];
    synthesised.extend(tokenizer_files(header).map_err(fail)?);
    Ok(ModelSource::Gguf(Arc::new(GgufSource {
        dir,
        parts,
        files: synthesised,
        file_type: first.file_type().map(str::to_string),
        notes: notes(&files),
        architecture: super::config::architecture(header).map_err(fail)?.0.to_string(),
        tensor_bytes: files.iter().flat_map(|f| &f.header().tensors).map(|t| t.bytes).sum(),
        tensor_values: files.iter().flat_map(|f| &f.header().tensors).map(|t| t.values()).sum(),
    })))
}

/// The one-line notes a user sees when the model loads.
fn notes(files: &[GgufFile]) -> Vec<String> {
    let mut notes = vec![];
    let low: Vec<(&str, super::GgmlType)> = files.iter().flat_map(|f| f.low_bit_state_inputs()).collect();
    if let Some((name, ty)) = low.first() {
        notes.push(format!(
            "this GGUF stores the GDN state inputs below 8 bits ({} tensors of ssm_alpha / ssm_beta / ssm_a / ssm_dt, e.g. `{name}` as {}): such quantisation has been reported to collapse reasoning depth; prefer a file that keeps them at Q8_0 or wider",
            low.len(),
            ty.name()
        ));
    }
    let has_mtp = files.iter().any(|f| f.header().tensors.iter().any(|t| t.name.contains(".nextn.")));
    if !has_mtp {
        notes.push(
            "this GGUF carries no MTP head (no `nextn` tensors; llama.cpp's converter drops them with --no-mtp, and some published files were made without): speculative decoding is off".into(),
        );
    }
    notes
}

/// The split metadata agrees with the parts found: `split.count` parts, each its `split.no`.
fn check_split(files: &[GgufFile]) -> Result<()> {
    for (i, f) in files.iter().enumerate() {
        let h = f.header();
        let count = h.get("split.count").and_then(|v| v.as_u64());
        let no = h.get("split.no").and_then(|v| v.as_u64());
        let ok = match (count, no) {
            (None, None) => files.len() == 1,
            (Some(c), Some(n)) => c as usize == files.len() && n as usize == i,
            _ => false,
        };
        if !ok {
            return Err(Error::Gguf {
                file: f.path().display().to_string(),
                message: format!(
                    "split metadata says part {} of {} (`split.no`, `split.count`), but it is part {} of the {} files found",
                    no.map_or("?".into(), |n| n.to_string()),
                    count.map_or("?".into(), |n| n.to_string()),
                    i,
                    files.len()
                ),
            });
        }
    }
    Ok(())
}

fn tokenizer_files(g: &Gguf) -> std::result::Result<Vec<(String, Vec<u8>)>, String> {
    let mut out = vec![
        ("tokenizer.json".to_string(), vocab::tokenizer_json(g).map_err(|e| e.to_string())?.into_bytes()),
        ("tokenizer_config.json".to_string(), vocab::tokenizer_config_json(g).map_err(|e| e.to_string())?.into_bytes()),
    ];
    if let Some(gen_config) = vocab::generation_config_json(g) {
        out.push(("generation_config.json".to_string(), gen_config.into_bytes()));
    }
    Ok(out)
}

fn json_bytes(v: &serde_json::Value) -> Vec<u8> {
    serde_json::to_vec_pretty(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::super::container::tests::{file, string};
    use super::*;

    fn write(dir: &Path, name: &str, arch: &str, tensors: &[(&str, &[u64], u32, Vec<u8>)]) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, file(&[("general.architecture", 8, string(arch))], tensors)).unwrap();
        p
    }

    #[test]
    fn a_type_deltascope_cannot_read_is_refused_before_loading_naming_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            dir.path(),
            "m.gguf",
            "qwen35",
            &[
                ("token_embd.weight", &[256, 2], 0, vec![0; 2048]),
                ("blk.0.ffn_down.weight", &[256, 1], 10, vec![0; 84]),
            ],
        );
        let e = source_for(&p).unwrap_err().to_string();
        assert!(e.contains("`blk.0.ffn_down.weight` is Q2_K"), "{e}");
        assert!(e.contains("Q4_K") && e.contains("Q8_0") && e.contains("m.gguf"), "{e}");
    }

    #[test]
    fn an_unknown_architecture_is_named_with_the_ones_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(dir.path(), "m.gguf", "llama", &[("token_embd.weight", &[4, 2], 0, vec![0; 32])]);
        let e = source_for(&p).unwrap_err().to_string();
        assert!(e.contains("architecture `llama`") && e.contains("qwen35, qwen35moe, qwen3next"), "{e}");
    }

    #[test]
    fn a_folder_of_unrelated_ggufs_asks_which_one() {
        let dir = tempfile::tempdir().unwrap();
        for n in ["a.gguf", "b.gguf"] {
            write(dir.path(), n, "qwen35", &[("token_embd.weight", &[4, 2], 0, vec![0; 32])]);
        }
        let e = source_for(dir.path()).unwrap_err().to_string();
        assert!(e.contains("2 GGUF files") && e.contains("a.gguf, b.gguf"), "{e}");
        assert!(is_gguf(dir.path()) && is_gguf(&dir.path().join("a.gguf")));
        assert!(!is_gguf(Path::new("models/demo")));
    }

    #[test]
    fn split_names_are_read_and_others_are_not() {
        assert_eq!(split_name("Qwen3.6-27B-Q4_K_M-00001-of-00003.gguf"), Some(("Qwen3.6-27B-Q4_K_M", 1, 3)));
        assert_eq!(split_name("model.gguf"), None);
        assert_eq!(split_name("a-1-of-3.gguf"), None);
    }

    #[test]
    fn a_split_set_missing_a_part_is_named() {
        let dir = tempfile::tempdir().unwrap();
        for i in [1, 3] {
            std::fs::write(dir.path().join(format!("m-{i:05}-of-00003.gguf")), b"GGUF").unwrap();
        }
        let e = source_for(&dir.path().join("m-00001-of-00003.gguf")).unwrap_err().to_string();
        assert!(e.contains("m-00002-of-00003.gguf") && e.contains("split set of 3"), "{e}");
    }
}
