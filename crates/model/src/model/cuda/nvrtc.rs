//! Compiles `kernels/*.cu` with NVRTC at run time (PTX for an architecture family, or a CUBIN
//! for one GPU), cached on disk under a key of everything that changes the output: the source,
//! the options, NVRTC's version and the architecture.

use crate::hash::fnv1a;
use std::ffi::{CString, c_char};
use std::path::{Path, PathBuf};

use cudarc::nvrtc::{result as nv, sys as nv_sys};

use super::kernels::KernelFile;
use super::probe::nvrtc_version;
use super::resources::{PtxasReport, parse_ptxas_log};

/// What to produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// PTX for `compute_XY` (JIT-compiled by the driver at load).
    Ptx,
    /// Machine code for `sm_XY` (loads without a JIT; must match the GPU).
    Cubin,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompileError {
    #[error("NVRTC not found (libnvrtc): kernels cannot be compiled")]
    NoNvrtc,
    #[error("{file}.cu: NVRTC {step} failed ({code}){log}")]
    Nvrtc { file: String, step: &'static str, code: String, log: String },
    #[error("{arch:?}: expected an architecture such as sm_90")]
    BadArch { arch: String },
    #[error("{file}.cu for {arch}: cannot read ptxas's resource report ({reason}):\n{log}")]
    PtxasLog { file: String, arch: String, reason: String, log: String },
}

/// Options every kernel is compiled with: no fast-math (expf, division and rsqrt stay
/// IEEE-faithful, as the CPU twins are), C++17.
const OPTIONS: &[&str] = &["--std=c++17", "--fmad=true"];

/// Compiled code and what produced it.
#[derive(Debug, Clone)]
pub struct Compiled {
    pub file: &'static str,
    pub target: Target,
    pub arch: String,
    pub code: Vec<u8>,
    /// Read from the disk cache rather than compiled now.
    pub cached: bool,
}

impl Compiled {
    /// Whether an entry point is defined: PTX names it in `.entry`, a CUBIN in its symbol table.
    pub fn defines(&self, entry: &str) -> bool {
        match self.target {
            Target::Ptx => {
                let text = String::from_utf8_lossy(&self.code);
                text.lines().any(|l| {
                    l.contains(".entry") && l.split(|c: char| !c.is_alphanumeric() && c != '_').any(|w| w == entry)
                })
            }
            // Symbol names sit NUL-terminated in the ELF string table.
            Target::Cubin => {
                let needle: Vec<u8> = [&[0u8][..], entry.as_bytes(), &[0u8]].concat();
                self.code.windows(needle.len()).any(|w| w == needle.as_slice())
            }
        }
    }
}

/// `sm_90` → 90, checked.
fn arch_number(arch: &str) -> Result<u32, CompileError> {
    arch.strip_prefix("sm_")
        .and_then(|n| n.trim_end_matches('a').parse().ok())
        .ok_or_else(|| CompileError::BadArch { arch: arch.into() })
}

/// The default cache: `$XDG_CACHE_HOME/deltascope/kernels` (`~/.cache/…`).
pub fn default_cache_dir() -> Option<PathBuf> {
    dirs::cache_dir().map(|d| d.join("deltascope").join("kernels"))
}

fn nvrtc_call(file: &str, step: &'static str, r: Result<(), nv::NvrtcError>, log: String) -> Result<(), CompileError> {
    r.map_err(|e| CompileError::Nvrtc { file: file.into(), step, code: format!("{:?}", e.0), log })
}

/// The program's log (warnings, errors, ptxas's report), trimmed; empty when there is none.
fn program_log(prog: nv_sys::nvrtcProgram) -> String {
    // SAFETY: prog is a live program.
    match unsafe { nv::get_program_log(prog) } {
        Ok(chars) => {
            let bytes: Vec<u8> = chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
            String::from_utf8_lossy(&bytes).trim().to_string()
        }
        Err(_) => String::new(),
    }
}

/// Runs NVRTC on one source: the code for `target` and the program's log.
fn run_nvrtc(
    file: &str,
    source: String,
    options: &[String],
    target: Target,
) -> Result<(Vec<u8>, String), CompileError> {
    let src = CString::new(source).map_err(|_| CompileError::Nvrtc {
        file: file.into(),
        step: "create",
        code: "source holds a NUL byte".into(),
        log: String::new(),
    })?;
    let name = CString::new(format!("{file}.cu")).unwrap_or_default();
    let prog = nv::create_program(&src, Some(&name)).map_err(|e| CompileError::Nvrtc {
        file: file.into(),
        step: "create",
        code: format!("{:?}", e.0),
        log: String::new(),
    })?;
    // SAFETY: prog is live until destroy_program below; the option strings outlive the call.
    unsafe {
        let compiled = nv::compile_program(prog, options);
        let log = program_log(prog);
        let shown = if log.is_empty() { String::new() } else { format!(":\n{log}") };
        let out = nvrtc_call(file, "compile", compiled, shown).and_then(|()| match target {
            Target::Ptx => nv::get_ptx(prog)
                .map(|chars| chars.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect::<Vec<u8>>())
                .map_err(|e| CompileError::Nvrtc {
                    file: file.into(),
                    step: "get PTX",
                    code: format!("{:?}", e.0),
                    log: String::new(),
                }),
            Target::Cubin => {
                let mut size = 0usize;
                nvrtc_call(file, "get CUBIN size", nv_sys::nvrtcGetCUBINSize(prog, &mut size).result(), String::new())?;
                let mut buf = vec![0u8; size];
                nvrtc_call(
                    file,
                    "get CUBIN",
                    nv_sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char).result(),
                    String::new(),
                )?;
                Ok(buf)
            }
        });
        let _ = nv::destroy_program(prog);
        out.map(|code| (code, log))
    }
}

/// Compiles one kernel file for `arch` (`sm_90`), through the disk cache when `cache` is set.
pub fn compile(
    file: &'static KernelFile,
    target: Target,
    arch: &str,
    cache: Option<&Path>,
) -> Result<Compiled, CompileError> {
    let number = arch_number(arch)?;
    let version = nvrtc_version().ok_or(CompileError::NoNvrtc)?;
    let source = file.full_source();
    let gpu_arch = match target {
        Target::Ptx => format!("--gpu-architecture=compute_{number}"),
        Target::Cubin => format!("--gpu-architecture=sm_{number}"),
    };
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(gpu_arch);
    let key = fnv1a(&[
        source.as_bytes(),
        options.join(" ").as_bytes(),
        format!("nvrtc {}.{}", version.0, version.1).as_bytes(),
    ]);
    let ext = if target == Target::Ptx { "ptx" } else { "cubin" };
    let cached_path = cache.map(|d| d.join(format!("{}-{arch}-{key:016x}.{ext}", file.name)));
    if let Some(p) = &cached_path
        && let Ok(code) = std::fs::read(p)
    {
        return Ok(Compiled { file: file.name, target, arch: arch.into(), code, cached: true });
    }

    let (code, _log) = run_nvrtc(file.name, source, &options, target)?;
    if let Some(p) = &cached_path {
        // A cache that cannot be written only costs a recompile next time.
        if let Some(dir) = p.parent()
            && std::fs::create_dir_all(dir).is_ok()
        {
            let tmp = p.with_extension(format!("{ext}.tmp{}", std::process::id()));
            if std::fs::write(&tmp, &code).is_ok() {
                let _ = std::fs::rename(&tmp, p);
            }
        }
    }
    Ok(Compiled { file: file.name, target, arch: arch.into(), code, cached: false })
}

/// What each entry point of `file` costs on `arch` (`sm_90`): registers, spills, stack frame
/// and static shared memory, as ptxas reports them when it compiles the file to a CUBIN with
/// the kernels' own options (plus `--ptxas-options=--verbose`). Always compiled now, never
/// from the disk cache: the numbers are in the log, not in the code.
pub fn resource_usage(file: &KernelFile, arch: &str) -> Result<PtxasReport, CompileError> {
    let number = arch_number(arch)?;
    nvrtc_version().ok_or(CompileError::NoNvrtc)?;
    let mut options: Vec<String> = OPTIONS.iter().map(|s| s.to_string()).collect();
    options.push(format!("--gpu-architecture=sm_{number}"));
    options.push("--ptxas-options=--verbose".into());
    let (_code, log) = run_nvrtc(file.name, file.full_source(), &options, Target::Cubin)?;
    let fail =
        |reason: String| CompileError::PtxasLog { file: file.name.into(), arch: arch.into(), reason, log: log.clone() };
    let report = parse_ptxas_log(&log).map_err(fail)?;
    if report.entries.is_empty() {
        return Err(fail("it names no entry function".into()));
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_key_is_stable_and_separates_its_parts() {
        assert_eq!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"ab", b"c"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        // FNV-1a's published offset basis and the value of "a" (then the part separator).
        assert_eq!(fnv1a(&[]), 0xcbf29ce484222325);
        let a = (0xcbf29ce484222325u64 ^ b'a' as u64).wrapping_mul(0x100000001b3);
        assert_eq!(a, 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(&[b"a"]), (a ^ 0xff).wrapping_mul(0x100000001b3));
    }

    #[test]
    fn architectures_are_checked() {
        assert_eq!(arch_number("sm_90").unwrap(), 90);
        assert_eq!(arch_number("sm_90a").unwrap(), 90);
        assert!(arch_number("hopper").is_err());
    }

    #[test]
    fn entries_are_found_in_ptx_and_cubin_text() {
        let ptx = Compiled {
            file: "x",
            target: Target::Ptx,
            arch: "sm_90".into(),
            code: b".visible .entry gemv_bf16(\n.param .u64 a\n".to_vec(),
            cached: false,
        };
        assert!(ptx.defines("gemv_bf16"));
        assert!(!ptx.defines("gemv"));
        let cubin = Compiled { target: Target::Cubin, code: b"\x7fELF\0.text.gemv_bf16\0gemv_bf16\0".to_vec(), ..ptx };
        assert!(cubin.defines("gemv_bf16"));
        assert!(!cubin.defines("gemv"));
    }
}
