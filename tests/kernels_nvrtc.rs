//! Every kernel in kernels/ compiles with NVRTC from PyPI (pinned, installed by
//! `scripts/setup-nvrtc.sh`, run by this test) to PTX and to an sm_90 CUBIN, with the entry
//! points it must define, and fits the register, spill and shared-memory limits on sm_90 and
//! sm_86; the kernel cache keys and reuses compiled code. No GPU is needed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use deltascope_model::cuda::{kernels, nvrtc, probe, resources};
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

/// Set in the child that runs the resource check in-process (see below).
const RESOURCES_INNER: &str = "DELTASCOPE_TEST_NVRTC_RESOURCES_INNER";
const RESOURCES_TEST: &str = "every_kernel_fits_the_register_spill_and_shared_memory_limits";
/// Hopper (H100 / H200) and Ampere's A6000.
const RESOURCE_ARCHS: &[&str] = &["sm_90", "sm_86"];

/// ptxas's report for every entry point, on each architecture: no spills, at most 255
/// registers, at most 48 KiB of static shared memory. cudarc opens libnvrtc by name once per
/// process, so LD_LIBRARY_PATH has to be set before the process starts: the test runs itself
/// again, in a child with it set, and checks that the child ran the check on every entry.
#[test]
fn every_kernel_fits_the_register_spill_and_shared_memory_limits() {
    if std::env::var_os(RESOURCES_INNER).is_some() {
        return check_resources();
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([RESOURCES_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env("LD_LIBRARY_PATH", nvrtc_dir())
        .env(RESOURCES_INNER, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the resource check failed:\n{stdout}\n{stderr}");
    // The child's table, shown with --nocapture.
    eprintln!("{stderr}");
    assert!(stdout.contains("1 passed"), "the child ran no test:\n{stdout}");
    let expected = kernels::FILES.iter().map(|f| f.entries.len()).sum::<usize>() * RESOURCE_ARCHS.len();
    let line = format!("resources checked: {expected} entries ({} architectures)", RESOURCE_ARCHS.len());
    assert!(stdout.contains(&line), "expected {line:?} from the child:\n{stdout}");
}

fn check_resources() {
    assert_eq!(probe::nvrtc_version(), Some((13, 4)), "the pinned NVRTC");
    let mut failures = vec![];
    let mut checked = 0;
    // (file, entry) → each architecture's numbers, in RESOURCE_ARCHS order.
    let mut rows: Vec<(String, &str, Vec<resources::KernelResources>)> = vec![];
    for file in kernels::FILES {
        for e in file.entries {
            rows.push((format!("{}.cu", file.name), e, vec![]));
        }
    }
    for arch in RESOURCE_ARCHS {
        for file in kernels::FILES {
            let report =
                nvrtc::resource_usage(file, arch).unwrap_or_else(|e| panic!("{}.cu for {arch}: {e}", file.name));
            for f in &report.device_functions {
                if let Some(v) = f.violation() {
                    failures.push(format!("{}.cu, {arch}: {v}", file.name));
                }
            }
            for &entry in file.entries {
                let Some(r) = report.entry(entry) else {
                    failures.push(format!("{}.cu, {arch}: ptxas reported no entry {entry}", file.name));
                    continue;
                };
                assert_eq!(&r.arch, arch, "{}.cu {entry}", file.name);
                for v in r.violations() {
                    failures.push(format!(
                        "{}.cu {entry}, {arch}: {v} [{} registers, {} bytes smem, {}-byte stack frame, \
                         {} bytes spill stores, {} bytes spill loads]",
                        file.name,
                        r.registers,
                        r.smem_bytes,
                        r.stack_frame_bytes,
                        r.spill_store_bytes,
                        r.spill_load_bytes
                    ));
                }
                let row = rows.iter_mut().find(|(f, e, _)| *f == format!("{}.cu", file.name) && *e == entry).unwrap();
                row.2.push(r.clone());
                checked += 1;
            }
        }
    }
    let per_arch = |rs: &[resources::KernelResources], f: fn(&resources::KernelResources) -> u64| {
        let v: Vec<u64> = rs.iter().map(f).collect();
        if v.windows(2).all(|w| w[0] == w[1]) && !v.is_empty() {
            v[0].to_string()
        } else {
            v.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(" / ")
        }
    };
    let archs = RESOURCE_ARCHS.join(" / ");
    let mut table = format!(
        "NVRTC 13.4, ptxas --verbose; where the architectures differ, numbers are {archs}\n\n\
         | file | entry | registers ({archs}) | static smem (B) | stack frame (B) | spill stores / loads (B) |\n\
         |---|---|---:|---:|---:|---:|\n"
    );
    for (file, entry, rs) in &rows {
        let regs: Vec<String> = rs.iter().map(|r| r.registers.to_string()).collect();
        table += &format!(
            "| {file} | {entry} | {} | {} | {} | {} / {} |\n",
            regs.join(" / "),
            per_arch(rs, |r| r.smem_bytes),
            per_arch(rs, |r| r.stack_frame_bytes),
            per_arch(rs, |r| r.spill_store_bytes),
            per_arch(rs, |r| r.spill_load_bytes),
        );
    }
    eprintln!("{table}");
    assert!(failures.is_empty(), "kernels past the limits:\n{}", failures.join("\n"));
    println!("resources checked: {checked} entries ({} architectures)", RESOURCE_ARCHS.len());
}
