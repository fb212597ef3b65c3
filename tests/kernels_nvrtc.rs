//! Every kernel in kernels/ compiles with NVRTC from PyPI (pinned, installed by
//! `scripts/setup-nvrtc.sh`, run by this test) to PTX and to an sm_90 CUBIN, with the entry
//! points it must define; the kernel cache keys and reuses compiled code. No GPU is needed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory holding libnvrtc.so, installed once per test binary.
fn nvrtc_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let out = Command::new("bash").arg("scripts/setup-nvrtc.sh").current_dir(root()).output().unwrap();
        assert!(out.status.success(), "setup-nvrtc.sh failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let line = stdout.lines().rev().find_map(|l| l.strip_prefix("NVRTC_LIB_DIR=")).expect("NVRTC_LIB_DIR line");
        PathBuf::from(line)
    })
}

fn deltascope(args: &[&str], cache_home: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(args)
        .env("LD_LIBRARY_PATH", nvrtc_dir())
        .env("XDG_CACHE_HOME", cache_home)
        .output()
        .unwrap()
}

fn compile_json(args: &[&str], cache_home: &Path) -> Value {
    let out = deltascope(args, cache_home);
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

const FILES: &[&str] = &[
    "embedding.cu",
    "norm.cu",
    "rope.cu",
    "gemv.cu",
    "gemm.cu",
    "conv1d.cu",
    "gdn.cu",
    "attention.cu",
    "elementwise.cu",
    "moe.cu",
];

#[test]
fn every_kernel_compiles_to_an_sm90_cubin_with_its_entry_points() {
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let v = compile_json(
        &["gpu", "kernels", "--arch", "sm_90", "--json", "--out", out.path().to_str().unwrap()],
        cache.path(),
    );
    assert_eq!(v["nvrtc_version"], "13.4");
    assert_eq!(v["target"], "cubin");
    let files = v["files"].as_array().unwrap();
    let names: Vec<&str> = files.iter().map(|f| f["file"].as_str().unwrap()).collect();
    assert_eq!(names, FILES);
    for f in files {
        assert_eq!(f["missing"].as_array().unwrap().len(), 0, "{f}");
        assert_eq!(f["cached"], false);
        let name = f["file"].as_str().unwrap().trim_end_matches(".cu");
        let code = std::fs::read(out.path().join(format!("{name}.cubin"))).unwrap();
        assert_eq!(&code[..4], b"\x7fELF", "{name}.cubin is an ELF object");
        assert_eq!(code.len() as u64, f["bytes"].as_u64().unwrap());
        // Every entry is a NUL-terminated symbol name in the ELF string table.
        for e in f["entries"].as_array().unwrap() {
            let needle = [b"\0", e.as_str().unwrap().as_bytes(), b"\0"].concat();
            assert!(code.windows(needle.len()).any(|w| w == needle.as_slice()), "{name}.cubin lacks {e}");
        }
    }
}

#[test]
fn every_kernel_compiles_to_ptx_for_compute_90() {
    let cache = tempfile::tempdir().unwrap();
    let out = tempfile::tempdir().unwrap();
    let v = compile_json(&["gpu", "kernels", "--ptx", "--json", "--out", out.path().to_str().unwrap()], cache.path());
    for f in v["files"].as_array().unwrap() {
        let name = f["file"].as_str().unwrap().trim_end_matches(".cu");
        let ptx = std::fs::read_to_string(out.path().join(format!("{name}.ptx"))).unwrap();
        assert!(ptx.contains(".target sm_90"), "{name}.ptx");
        assert!(ptx.contains(".version 9.4"), "{name}.ptx: NVRTC 13.4 writes PTX ISA 9.4");
        for e in f["entries"].as_array().unwrap() {
            let entry = format!(".entry {}(", e.as_str().unwrap());
            assert!(ptx.contains(&entry), "{name}.ptx lacks {entry}");
        }
    }
}

#[test]
fn the_kernel_cache_is_keyed_and_reused() {
    let cache = tempfile::tempdir().unwrap();
    let first = compile_json(&["gpu", "kernels", "--json"], cache.path());
    assert!(first["files"].as_array().unwrap().iter().all(|f| f["cached"] == false));
    let second = compile_json(&["gpu", "kernels", "--json"], cache.path());
    assert!(second["files"].as_array().unwrap().iter().all(|f| f["cached"] == true));
    // Another architecture is another key.
    let other = compile_json(&["gpu", "kernels", "--arch", "sm_80", "--json"], cache.path());
    assert!(other["files"].as_array().unwrap().iter().all(|f| f["cached"] == false));
    let entries: Vec<String> = std::fs::read_dir(cache.path().join("deltascope/kernels"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries.len(), 2 * FILES.len(), "{entries:?}");
    assert!(entries.iter().any(|e| e.starts_with("gdn-sm_90-") && e.ends_with(".cubin")), "{entries:?}");
}

#[test]
fn gpu_info_names_the_libraries_and_says_no_gpu_in_one_line() {
    let cache = tempfile::tempdir().unwrap();
    let out = deltascope(&["gpu", "info"], cache.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("libnvrtc found (13.4)"), "{stdout}");
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert_eq!(stderr.trim(), "error: no GPU: libcuda not found");
}

#[test]
fn without_nvrtc_compiling_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_deltascope"))
        .args(["gpu", "kernels", "--no-cache"])
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim(), "error: NVRTC not found (libnvrtc): kernels cannot be compiled");
}
