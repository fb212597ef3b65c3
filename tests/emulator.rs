//! The emulated CUDA device as a test tier (`gpu check --device emu`): it covers every kernel,
//! and it catches bugs. Each mutation test copies `kernels/` to a temporary folder, plants one
//! bug with a string replacement that must match exactly once, and runs the copy with
//! `--kernels`: the run must fail (exit 2) naming the mutated kernel. The sanitizer tests build
//! the kernels with ASan and UBSan (`DELTASCOPE_EMU_SANITIZE`), their runtimes preloaded into
//! the binary: the real kernels are clean, and a planted out-of-bounds read is reported.
//!
//! Needs a C++ compiler (`c++`, or `$CXX`; CI installs g++) with its sanitizer runtimes. Kernel
//! libraries are cached under the user's cache folder, keyed by source and options, so each
//! mutant gets its own entry and a second run compiles nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use deltascope_model::cuda::kernels::FILES;
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn deltascope(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_deltascope"));
    c.args(args).current_dir(root());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("running deltascope")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(out: &Output) -> Value {
    serde_json::from_str(text(&out.stdout).trim()).unwrap_or_else(|e| {
        panic!("stdout is not one JSON object ({e}):\n{}\n{}", text(&out.stdout), text(&out.stderr))
    })
}

fn results(v: &Value) -> &Vec<Value> {
    v["results"].as_array().unwrap_or_else(|| panic!("no results in {v:#}"))
}

/// The kernels of the failed results.
fn failures(v: &Value) -> Vec<String> {
    results(v).iter().filter(|r| r["pass"] != true).map(|r| r["kernel"].as_str().unwrap().to_string()).collect()
}

/// A result's kernel is an entry point, or an entry point and what was checked of it
/// ("conv1d_decode slots").
fn is_of(kernel: &str, entry: &str) -> bool {
    kernel == entry || kernel.strip_prefix(entry).is_some_and(|rest| rest.starts_with(' '))
}

/// A copy of `kernels/` in a temporary folder.
fn kernels_copy() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut n = 0;
    for e in std::fs::read_dir(root().join("crates/model/kernels")).unwrap() {
        let e = e.unwrap();
        if e.path().extension().is_some_and(|x| x == "cu") {
            std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
            n += 1;
        }
    }
    assert_eq!(n, FILES.len() + 1, "kernels/ should hold prelude.cu and one file per entry of FILES");
    dir
}

/// Replaces `from` (which must occur exactly once) by `to` in `dir/file`.
fn mutate(dir: &Path, file: &str, from: &str, to: &str) {
    let path = dir.join(file);
    let src = std::fs::read_to_string(&path).unwrap();
    assert_eq!(src.matches(from).count(), 1, "{file}: the mutation's text {from:?} must occur exactly once");
    std::fs::write(&path, src.replacen(from, to, 1)).unwrap();
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temporary path")
}

/// `gpu check --device emu --kernels DIR --schedules forward --json` on a mutant: exit 2, the
/// failures are all of `kernel` (one bug, one kernel named) and the error line names it.
fn check_mutant_fails_naming(file: &str, from: &str, to: &str, kernel: &str) {
    let dir = kernels_copy();
    mutate(dir.path(), file, from, to);
    let out = deltascope(
        &["gpu", "check", "--device", "emu", "--kernels", path_str(dir.path()), "--schedules", "forward", "--json"],
        &[],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "the mutant of {file} should fail the check:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let v = json(&out);
    assert_eq!(v["schedules"], serde_json::json!(["forward"]), "{v:#}");
    let failed = failures(&v);
    assert!(!failed.is_empty() && failed.iter().all(|k| is_of(k, kernel)), "only {kernel} should fail: {failed:?}");
    assert!(
        stderr.contains("kernel check(s) differ from the CPU twins") && stderr.contains(&format!("{kernel} (")),
        "the error should name {kernel}:\n{stderr}"
    );
}

/// The whole check on the embedded kernels, under the default schedules: every entry point of
/// every kernel file has a result, the launches past grid y's limit are there, and nothing
/// fails (nor differs between schedules).
#[test]
fn gpu_check_on_the_emulator_covers_every_entry_point_and_passes() {
    let out = deltascope(&["gpu", "check", "--device", "emu", "--json"], &[]);
    assert!(out.status.success(), "gpu check --device emu failed:\n{}\n{}", text(&out.stdout), text(&out.stderr));
    let v = json(&out);
    assert_eq!(v["device"], "emu:0");
    assert_eq!(v["schedules"], serde_json::json!(["forward", "reverse", "random:24301"]), "{v:#}");
    let rs = results(&v);
    let kernels: Vec<&str> = rs.iter().map(|r| r["kernel"].as_str().unwrap()).collect();
    let mut entries = vec![];
    for f in FILES {
        for e in f.entries {
            entries.push(e.to_string());
            assert!(kernels.iter().any(|k| is_of(k, e)), "{}.cu's {e} has no result: {kernels:?}", f.name);
        }
    }
    // FILES lists every `__global__` the sources define.
    let mut defined = vec![];
    for f in FILES {
        let src = std::fs::read_to_string(root().join("crates/model/kernels").join(format!("{}.cu", f.name))).unwrap();
        for piece in src.split("__global__ void ").skip(1) {
            defined.push(piece.split('(').next().unwrap().trim().to_string());
        }
    }
    entries.sort();
    defined.sort();
    assert_eq!(entries, defined);
    assert!(entries.len() >= 23, "{entries:?}");
    // The long grids: token × slot pairs and prefill tokens on grid x, past y's 65535.
    let leading = |r: &Value| -> usize {
        let case = r["case"].as_str().unwrap();
        case.split_whitespace().next().and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    assert!(
        rs.iter().any(|r| r["kernel"] == "moe_gemv"
            && r["case"].as_str().unwrap().contains(" pairs")
            && leading(r) >= 65536),
        "no moe_gemv case of ≥ 65536 pairs"
    );
    assert!(
        rs.iter().any(|r| r["kernel"] == "conv1d_prefill"
            && r["case"].as_str().unwrap().contains(" tokens")
            && leading(r) >= 65536),
        "no conv1d_prefill case of ≥ 65536 tokens"
    );
    assert_eq!(failures(&v), Vec::<String>::new());
    assert!(rs.iter().all(|r| !r["case"].as_str().unwrap().contains("thread schedule")));
}

#[test]
fn schedules_are_checked_and_only_for_the_emulator() {
    for (list, says) in [
        ("sideways", "\"sideways\" is not a schedule"),
        ("forward,,reverse", "an empty schedule"),
        ("random:x", "\"random:x\" is not a schedule"),
    ] {
        let out = deltascope(&["gpu", "check", "--device", "emu", "--schedules", list], &[]);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "--schedules {list}: {stderr}");
        assert!(stderr.contains("--schedules") && stderr.contains(says) && stderr.contains("random:SEED"), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    let out = deltascope(&["gpu", "check", "--device", "cuda", "--schedules", "forward"], &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("--schedules is for the emulated device (--device emu)"), "{stderr}");
}

/// A missing barrier: warp 0 sums the other warps' partial outputs from shared memory before
/// they wrote them (it reads the poison).
#[test]
fn a_missing_syncthreads_in_attention_is_caught() {
    check_mutant_fails_naming(
        "attention.cu",
        "    __syncthreads();\n    if (warp != 0) return;",
        "    if (warp != 0) return;",
        "attn_gqa",
    );
}

/// One bf16 rounding of the reference dropped.
#[test]
fn a_dropped_bf16_rounding_in_moe_combine_is_caught() {
    check_mutant_fails_naming("moe.cu", "acc = round_bf(acc + round_bf(", "acc = (acc + round_bf(", "moe_combine");
}

/// An index off by one: each token gathers the next id's row. (For id 999 of the case's
/// 1000-row table that row lies past the table: an out-of-bounds read that ASan reports as a
/// heap-buffer-overflow in embed_gather; here, unsanitized, it reads the heap beyond and the
/// comparison fails on the wrong rows.)
#[test]
fn an_off_by_one_row_in_embed_gather_is_caught() {
    check_mutant_fails_naming("embedding.cu", "(long long)id * hidden", "(long long)(id + 1) * hidden", "embed_gather");
}

/// A bug that the model-level check catches: RoPE's rotation with the wrong sign, through
/// `gpu parity` against the CPU engine on a fixture. The failure names the kernel (every kernel
/// re-run on its own against its CPU twin) and ends with an `error:` line; `verify --device emu`
/// on the same mutant names it too, and speaks of the device, not of a server.
#[test]
fn a_rope_sign_flip_fails_model_parity() {
    let dir = kernels_copy();
    mutate(dir.path(), "rope.cu", "round_bf(a * c) - round_bf(b * s)", "round_bf(a * c) + round_bf(b * s)");
    let args = ["gpu", "parity", "--device", "emu", "--model", "tests/fixtures/qwen3_5_text", "--tokens", "16"];
    let mut mutant = args.to_vec();
    mutant.extend(["--kernels", path_str(dir.path())]);
    let out = deltascope(&mutant, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.lines().any(|l| l.starts_with("FAIL ")), "no FAIL line:\n{stdout}");
    assert!(!text(&out.stderr).contains("panicked"), "{}", text(&out.stderr));
    assert!(stdout.contains("kernels: ") && stdout.contains("differ from their CPU twins: rope"), "{stdout}");
    let last = text(&out.stderr).lines().last().unwrap_or_default().to_string();
    assert!(last.starts_with("error: gpu parity failed ") && last.contains("rope ("), "{last}");
    let verify = deltascope(
        &[
            "verify",
            "--device",
            "emu",
            "--model",
            "tests/fixtures/qwen3_5_text",
            "--quick",
            "--kernels",
            path_str(dir.path()),
        ],
        &[],
    );
    let (vout, verr) = (text(&verify.stdout), text(&verify.stderr));
    assert_eq!(verify.status.code(), Some(3), "{vout}\n{verr}");
    assert!(!vout.contains("the server") && !verr.contains("the server"), "the device is no server:\n{vout}\n{verr}");
    let last = verr.lines().last().unwrap_or_default();
    assert!(last.starts_with("error: ") && last.contains("differ from their CPU twins: rope"), "{verr}");
    // The same run on the unmutated copy passes: the failure is the mutation's.
    let clean = kernels_copy();
    let mut control = args.to_vec();
    control.extend(["--kernels", path_str(clean.path())]);
    let out = deltascope(&control, &[]);
    assert!(out.status.success(), "{}\n{}", text(&out.stdout), text(&out.stderr));
    assert!(!text(&out.stdout).contains("FAIL "), "{}", text(&out.stdout));
}

#[test]
fn a_kernels_folder_missing_a_file_is_a_clear_error() {
    let dir = kernels_copy();
    std::fs::remove_file(dir.path().join("attention.cu")).unwrap();
    for cmd in [&["check"][..], &["parity", "--tokens", "1"][..]] {
        let mut args = vec!["gpu"];
        args.extend(cmd);
        args.extend(["--device", "emu", "--kernels", path_str(dir.path())]);
        let out = deltascope(&args, &[]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(
            stderr.contains(&format!("--kernels {}: attention.cu cannot be read", dir.path().display())),
            "{args:?}: {stderr}"
        );
    }
}

/// The sanitizer runtimes to preload, from the compiler the emulator uses.
fn sanitizer_preload() -> String {
    let cxx = std::env::var("CXX").ok().filter(|c| !c.trim().is_empty()).unwrap_or_else(|| "c++".into());
    let lib = |name: &str| {
        let out =
            Command::new(&cxx).arg(format!("-print-file-name={name}")).output().expect("running the C++ compiler");
        let path = text(&out.stdout).trim().to_string();
        // The compiler echoes the bare name when it has no such library.
        assert!(Path::new(&path).is_absolute() && Path::new(&path).exists(), "{cxx} has no {name} (got {path:?})");
        path
    };
    format!("{} {}", lib("libasan.so"), lib("libubsan.so"))
}

fn sanitized_check(kernels: Option<&Path>) -> Output {
    let preload = sanitizer_preload();
    let mut args = vec!["gpu", "check", "--device", "emu", "--schedules", "forward"];
    if let Some(k) = kernels {
        args.extend(["--kernels", path_str(k)]);
    }
    deltascope(
        &args,
        &[
            ("DELTASCOPE_EMU_SANITIZE", "address,undefined"),
            ("LD_PRELOAD", &preload),
            ("ASAN_OPTIONS", "detect_leaks=0"),
        ],
    )
}

/// Every kernel built with ASan and UBSan runs every case clean.
#[test]
fn the_kernels_are_clean_under_asan_and_ubsan() {
    let out = sanitized_check(None);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{}\n{stderr}", text(&out.stdout));
    assert!(!stderr.contains("AddressSanitizer") && !stderr.contains("runtime error"), "{stderr}");
    assert!(text(&out.stdout).lines().filter(|l| l.ends_with(" ok")).count() > 60, "{}", text(&out.stdout));
}

/// The negative control: kv_append reads each head's keys one head further on, past the end of
/// the keys buffer for the last head of the last token; ASan (which allocates the emulated
/// device's memory: the Rust allocator calls posix_memalign) stops the run there.
#[test]
fn an_out_of_bounds_read_is_caught_by_asan() {
    let dir = kernels_copy();
    mutate(
        dir.path(),
        "attention.cu",
        "kcache[dst] = k[t * k_token_stride + (long long)h * hd + d];",
        "kcache[dst] = k[t * k_token_stride + (long long)h * hd + d + hd];",
    );
    let out = sanitized_check(Some(dir.path()));
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "the out-of-bounds read went unnoticed:\n{stderr}");
    assert!(stderr.contains("ERROR: AddressSanitizer: heap-buffer-overflow"), "{stderr}");
    assert!(stderr.contains("in kv_append"), "the report should name the kernel:\n{stderr}");
}
