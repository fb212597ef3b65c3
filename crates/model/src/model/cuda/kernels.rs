//! The CUDA kernels' sources (`kernels/*.cu`, compiled into the binary) and the entry points
//! each must define. Every file is compiled on its own with `kernels/prelude.cu` in front.

/// One kernel file.
#[derive(Debug, Clone, Copy)]
pub struct KernelFile {
    pub name: &'static str,
    pub source: &'static str,
    /// The `extern "C" __global__` functions it defines.
    pub entries: &'static [&'static str],
    /// What goes in front of it (`kernels/prelude.cu`).
    pub prelude: &'static str,
}

pub const PRELUDE: &str = include_str!("../../../kernels/prelude.cu");

macro_rules! kernel_file {
    ($name:literal, [$($entry:literal),* $(,)?]) => {
        KernelFile {
            name: $name,
            source: include_str!(concat!("../../../kernels/", $name, ".cu")),
            entries: &[$($entry),*],
            prelude: PRELUDE,
        }
    };
}

pub const FILES: &[KernelFile] = &[
    kernel_file!("embedding", ["embed_gather"]),
    kernel_file!("norm", ["rms_norm", "rms_norm_gated"]),
    kernel_file!("rope", ["rope_mrope"]),
    kernel_file!("gemv", ["gemv_bf16", "gemv_fp8"]),
    kernel_file!("gemm", ["gemm_bf16_tiled", "gemm_fp8_tiled"]),
    kernel_file!("conv1d", ["conv1d_decode", "conv1d_restore_slot", "conv1d_prefill", "conv1d_save_state"]),
    kernel_file!("gdn", ["gdn_recurrent", "gdn_restore_slot"]),
    kernel_file!("attention", ["attn_gqa", "kv_append"]),
    kernel_file!("elementwise", ["add_bf16", "swiglu", "f32_to_bf16", "concat_rows", "count_nonfinite_f32"]),
    kernel_file!("moe", ["moe_topk", "moe_gemv", "moe_gemv_fp8", "moe_combine", "sigmoid_scale_rows"]),
];

impl KernelFile {
    /// What NVRTC compiles: the prelude, then the file (a `#line` keeps error lines the file's).
    pub fn full_source(&self) -> String {
        format!("{}\n#line 1 \"{}.cu\"\n{}", self.prelude, self.name, self.source)
    }
}

pub fn file(name: &str) -> Option<&'static KernelFile> {
    FILES.iter().find(|f| f.name == name)
}

/// Why `--kernels DIR` cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelDirError {
    #[error("--kernels {dir}: {file} cannot be read: {message}")]
    Read { dir: String, file: String, message: String },
    #[error("--kernels {dir}: {file} does not define `extern \"C\" __global__ void {entry}(`")]
    MissingEntry { dir: String, file: String, entry: String },
}

/// The kernels to compile: the embedded copies, or (`--kernels DIR`) the same files read from
/// a folder — `prelude.cu` and every file of [`FILES`] — so an edited kernel is checked on the
/// emulator or a GPU without a rebuild. Read once per process use (the texts are kept for the
/// life of the process, as the embedded ones are).
pub fn load(dir: Option<&std::path::Path>) -> Result<&'static [KernelFile], KernelDirError> {
    let Some(dir) = dir else { return Ok(FILES) };
    let label = dir.display().to_string();
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name)).map_err(|e| KernelDirError::Read {
            dir: label.clone(),
            file: name.into(),
            message: e.to_string(),
        })
    };
    let prelude: &'static str = Box::leak(read("prelude.cu")?.into_boxed_str());
    let mut files = vec![];
    for f in FILES {
        let source: &'static str = Box::leak(read(&format!("{}.cu", f.name))?.into_boxed_str());
        for e in f.entries {
            if !source.contains(&format!("void {e}(")) {
                return Err(KernelDirError::MissingEntry {
                    dir: label.clone(),
                    file: format!("{}.cu", f.name),
                    entry: (*e).into(),
                });
            }
        }
        files.push(KernelFile { name: f.name, source, entries: f.entries, prelude });
    }
    Ok(Box::leak(files.into_boxed_slice()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parameters of one kernel's signature, as written.
    fn params(entry: &str) -> Vec<String> {
        let f = FILES.iter().find(|f| f.entries.contains(&entry)).unwrap();
        let start = f.source.find(&format!("void {entry}(")).unwrap() + entry.len() + 6;
        let end = start + f.source[start..].find(')').unwrap();
        f.source[start..end].split(',').map(|p| p.split_whitespace().collect::<Vec<_>>().join(" ")).collect()
    }

    /// Kernels the model calls in place (`rms_norm` on the q / k heads, `add_bf16` for the
    /// residual) must not promise the compiler their input and output never alias.
    #[test]
    fn kernels_called_in_place_do_not_declare_restrict() {
        for (entry, names) in [("rms_norm", ["x", "y"]), ("add_bf16", ["x", "out"])] {
            for p in params(entry) {
                if names.iter().any(|n| p.ends_with(&format!(" {n}")) || p.ends_with(&format!("*{n}"))) {
                    assert!(!p.contains("__restrict__"), "{entry}: {p}");
                }
            }
        }
        assert!(params("rms_norm").iter().any(|p| p.contains("__restrict__") && p.ends_with(" w")));
    }

    #[test]
    fn a_kernel_folder_must_hold_every_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("prelude.cu"), PRELUDE).unwrap();
        let e = load(Some(dir.path())).unwrap_err().to_string();
        assert!(e.contains("embedding.cu cannot be read"), "{e}");
        for f in FILES {
            std::fs::write(dir.path().join(format!("{}.cu", f.name)), f.source).unwrap();
        }
        let loaded = load(Some(dir.path())).unwrap();
        assert_eq!(loaded.len(), FILES.len());
        std::fs::write(dir.path().join("gemv.cu"), "// nothing here").unwrap();
        let e = load(Some(dir.path())).unwrap_err().to_string();
        assert!(e.contains("gemv.cu does not define") && e.contains("gemv_bf16"), "{e}");
    }
}
