//! The emulated CUDA device (`--device emu`): `kernels/*.cu` compiled unchanged for this CPU by
//! the machine's C++ compiler — the way NVRTC compiles them for a GPU: the sources embedded in
//! the binary (or read with `--kernels DIR`), each file built once into a cached shared library
//! keyed by the source, the options and the compiler's version, loaded with `libloading` — and
//! run by a fiber runtime of our own (`emu/cuda_emu.h`, `emu/cuda_emu_rt.cpp`): each CUDA
//! thread a fiber, `__syncthreads` and warp shuffles rendezvous points, shared memory poisoned
//! with NaN before every block, the threads of a block resumed in forward, reverse or seeded
//! random order (`DELTASCOPE_EMU_SCHEDULE`).
//!
//! It runs the CUDA model's host code unchanged behind [`Device`], so kernel logic, launch
//! geometry, argument lists, buffer sizes, the GDN state slots, MTP verify / restore and the
//! layer split are all checked without a GPU. What it cannot check: the GPU's maths bits
//! (`ex2.approx`, libdevice), NVRTC-only compile errors, and speed.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, c_int, c_uint, c_ulong, c_ulonglong, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};

use super::device::{Arg, DevPtr, Device};
use super::error::{EmuError, GpuError, GpuResult};
use super::kernels::KernelFile;
use super::probe::GpuInfo;
use crate::hash::fnv1a;

const HEADER: &str = include_str!("emu/cuda_emu.h");
const RUNTIME: &str = include_str!("emu/cuda_emu_rt.cpp");
/// The runtime's `emu_abi_version()`.
const ABI: c_int = 1;
/// Memory an emulated device offers when `DELTASCOPE_EMU_MEMORY` does not say (host memory,
/// allocated as used).
const DEFAULT_MEMORY: u64 = 16 << 30;

/// The order in which a block's runnable threads are resumed after each rendezvous. A correct
/// kernel gives the same bits under every order; `gpu check --device emu` runs all three.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    Forward,
    Reverse,
    /// Seeded random permutations.
    Random(u64),
}

impl Schedule {
    pub const VAR: &'static str = "DELTASCOPE_EMU_SCHEDULE";

    pub fn parse(s: &str) -> Result<Self, EmuError> {
        let bad = || EmuError::Setting {
            var: Self::VAR,
            value: s.into(),
            expected: "expected forward, reverse, random or random:SEED",
        };
        match s.trim() {
            "" | "forward" => Ok(Schedule::Forward),
            "reverse" => Ok(Schedule::Reverse),
            "random" => Ok(Schedule::Random(1)),
            other => {
                let seed = other.strip_prefix("random:").ok_or_else(bad)?;
                seed.parse().map(Schedule::Random).map_err(|_| bad())
            }
        }
    }

    /// From `DELTASCOPE_EMU_SCHEDULE` (forward when unset).
    pub fn from_env() -> Result<Self, EmuError> {
        Self::parse(&std::env::var(Self::VAR).unwrap_or_default())
    }

    fn code(self) -> (c_int, u64) {
        match self {
            Schedule::Forward => (0, 0),
            Schedule::Reverse => (1, 0),
            Schedule::Random(seed) => (2, seed),
        }
    }
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Schedule::Forward => f.write_str("forward"),
            Schedule::Reverse => f.write_str("reverse"),
            Schedule::Random(s) => write!(f, "random:{s}"),
        }
    }
}

/// The C++ compiler and its version line (part of the cache key).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Compiler {
    pub command: String,
    pub version: String,
}

/// `$CXX`, else `c++`, answering `--version`.
pub fn compiler() -> Result<Compiler, EmuError> {
    let command = std::env::var("CXX").ok().filter(|c| !c.trim().is_empty()).unwrap_or_else(|| "c++".into());
    let out = Command::new(&command)
        .arg("--version")
        .output()
        .map_err(|e| EmuError::NoCompiler { compiler: command.clone(), why: e.to_string() })?;
    if !out.status.success() {
        return Err(EmuError::NoCompiler { compiler: command, why: format!("--version exited with {}", out.status) });
    }
    let version = String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or("").trim().to_string();
    Ok(Compiler { command, version })
}

/// Whether this CPU runs the fibers, and with which compiler: the one-line reason when not.
pub fn probe() -> Result<Compiler, EmuError> {
    if !cfg!(target_pointer_width = "64") || !cfg!(target_os = "linux") {
        return Err(EmuError::Unsupported { arch: format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS) });
    }
    compiler()
}

/// `DELTASCOPE_EMU_SANITIZE=address,undefined`: the kernels built with those sanitizers (the
/// process must then start with their runtimes preloaded; see the README).
fn sanitize() -> Option<String> {
    std::env::var("DELTASCOPE_EMU_SANITIZE").ok().filter(|s| !s.trim().is_empty())
}

fn options() -> Vec<String> {
    let mut o: Vec<String> = [
        "-std=c++17",
        "-O2",
        "-fPIC",
        "-shared",
        "-fvisibility=hidden",
        // The kernels read bf16 rows as uint4 (a GPU's 16-byte loads).
        "-fno-strict-aliasing",
        // Only the kernels' explicit fmaf fuses, as with NVRTC's FMA contraction turned into
        // explicit calls; no value-changing optimisation.
        "-ffp-contract=off",
        "-fno-fast-math",
        "-fno-math-errno",
        "-Wno-unknown-pragmas",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // fmaf in one instruction (the same correctly rounded result as libm's).
        o.push("-mfma".into());
    }
    if let Some(s) = sanitize() {
        o.push(format!("-fsanitize={s}"));
        o.push("-fno-sanitize-recover=all".into());
        o.push("-fno-omit-frame-pointer".into());
        o.push("-g".into());
    }
    o
}

/// What the C++ compiler builds for one kernel file: the shim, the prelude and the file (a
/// `#line` keeps diagnostics in the file's own lines), a launch trampoline and a signature per
/// entry point, then the fiber runtime.
pub fn translation_unit(file: &KernelFile) -> String {
    let mut s = String::with_capacity(HEADER.len() + file.source.len() + RUNTIME.len() + 4096);
    s.push_str(HEADER);
    s.push_str("\n#line 1 \"prelude.cu\"\n");
    s.push_str(file.prelude);
    s.push_str(&format!("\n#line 1 \"{}.cu\"\n", file.name));
    s.push_str(file.source);
    s.push_str("\n#line 1 \"emu-trampolines\"\n");
    for e in file.entries {
        s.push_str(&format!(
            "extern \"C\" __attribute__((visibility(\"default\"))) void emu_entry_{e}(void** a) {{ emu::invoke({e}, a); }}\n\
             extern \"C\" __attribute__((visibility(\"default\"))) const char* emu_signature_{e}() {{ return emu::signature({e}); }}\n"
        ));
    }
    s.push_str("\n#line 1 \"cuda_emu_rt.cpp\"\n");
    s.push_str(RUNTIME);
    s
}

fn cache_dir() -> PathBuf {
    dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("deltascope").join("emu")
}

/// Builds (or finds in the cache) one kernel file's library.
fn build(file: &KernelFile, cxx: &Compiler, dir: &Path) -> Result<PathBuf, EmuError> {
    let tu = translation_unit(file);
    let opts = options();
    let key = fnv1a(&[tu.as_bytes(), opts.join(" ").as_bytes(), cxx.version.as_bytes(), cxx.command.as_bytes()]);
    let path = dir.join(format!("{}-{key:016x}.so", file.name));
    if path.exists() {
        return Ok(path);
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| EmuError::Load { path: dir.display().to_string(), message: format!("cannot create: {e}") })?;
    // Unique per build, so two threads (or processes) building the same file never share a
    // temporary; the rename below is atomic.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tag = format!("{}-{key:016x}.{}.{seq}", file.name, std::process::id());
    let src = dir.join(format!("{tag}.cpp"));
    let tmp = dir.join(format!("{tag}.so.tmp"));
    std::fs::write(&src, &tu)
        .map_err(|e| EmuError::Load { path: src.display().to_string(), message: format!("cannot write: {e}") })?;
    let out = Command::new(&cxx.command).args(&opts).arg("-o").arg(&tmp).arg(&src).output();
    let _ = std::fs::remove_file(&src);
    let out = out.map_err(|e| EmuError::NoCompiler { compiler: cxx.command.clone(), why: e.to_string() })?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        let log = String::from_utf8_lossy(&out.stderr).trim().to_string();
        return Err(EmuError::Compile { file: file.name.into(), compiler: cxx.version.clone(), log });
    }
    // Atomic: a parallel build of the same key leaves one whole file.
    std::fs::rename(&tmp, &path)
        .map_err(|e| EmuError::Load { path: path.display().to_string(), message: format!("cannot rename: {e}") })?;
    Ok(path)
}

type LaunchFn = unsafe extern "C" fn(
    *const c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut *mut c_void,
    c_int,
    c_ulonglong,
    *mut c_char,
    c_ulong,
) -> c_int;

/// One loaded kernel library. Its runtime keeps the running block in statics (the fibers,
/// shared memory), so launches into it are serialised process-wide.
struct Library {
    _lib: libloading::Library,
    launch: LaunchFn,
    shared_bytes: u64,
    lock: Mutex<()>,
}

struct Entry {
    lib: Arc<Library>,
    trampoline: *const c_void,
    signature: String,
}

// SAFETY: the trampoline is a function address in a library the entry keeps loaded.
unsafe impl Send for Entry {}
// SAFETY: as for Send; entries are only read once `load_kernels` has built them.
unsafe impl Sync for Entry {}

fn loaded_libraries() -> &'static Mutex<HashMap<PathBuf, Arc<Library>>> {
    static LIBS: OnceLock<Mutex<HashMap<PathBuf, Arc<Library>>>> = OnceLock::new();
    LIBS.get_or_init(|| Mutex::new(HashMap::new()))
}

fn load_error(path: &Path, e: impl std::fmt::Display) -> EmuError {
    let mut message = e.to_string();
    if sanitize().is_some() {
        message.push_str(" (a sanitized build needs its runtimes preloaded: LD_PRELOAD=\"$(c++ -print-file-name=libasan.so) $(c++ -print-file-name=libubsan.so)\")");
    }
    EmuError::Load { path: path.display().to_string(), message }
}

fn load(path: &Path) -> Result<Arc<Library>, EmuError> {
    let mut libs = loaded_libraries().lock().unwrap_or_else(|p| p.into_inner());
    if let Some(l) = libs.get(path) {
        return Ok(l.clone());
    }
    // SAFETY: our own library, built from the shim; its initialisers only zero statics.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| load_error(path, e))?;
    // SAFETY: the symbols are the runtime's exported C functions with these signatures.
    let (abi, launch, shared_bytes) = unsafe {
        let abi: libloading::Symbol<unsafe extern "C" fn() -> c_int> =
            lib.get(b"emu_abi_version").map_err(|e| load_error(path, e))?;
        let launch: libloading::Symbol<LaunchFn> = lib.get(b"emu_launch").map_err(|e| load_error(path, e))?;
        let shared: libloading::Symbol<unsafe extern "C" fn() -> c_ulonglong> =
            lib.get(b"emu_shared_bytes").map_err(|e| load_error(path, e))?;
        (abi(), *launch, shared())
    };
    if abi != ABI {
        return Err(load_error(path, format!("runtime ABI {abi}, expected {ABI}")));
    }
    let l = Arc::new(Library { _lib: lib, launch, shared_bytes, lock: Mutex::new(()) });
    libs.insert(path.to_path_buf(), l.clone());
    Ok(l)
}

/// Compiles (through the cache) and loads every file of `kernels`: entry name → entry.
fn load_kernels(kernels: &'static [KernelFile]) -> Result<HashMap<&'static str, Entry>, EmuError> {
    let cxx = probe()?;
    let dir = cache_dir();
    // Two compilers at a time: the files are independent translation units.
    let paths: Vec<Result<PathBuf, EmuError>> = std::thread::scope(|s| {
        let chunks: Vec<_> = kernels
            .chunks(kernels.len().div_ceil(2).max(1))
            .map(|chunk| {
                let (cxx, dir) = (&cxx, &dir);
                s.spawn(move || chunk.iter().map(|f| build(f, cxx, dir)).collect::<Vec<_>>())
            })
            .collect();
        chunks.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    let mut entries = HashMap::new();
    for (file, path) in kernels.iter().zip(paths) {
        let path = path?;
        let lib = load(&path)?;
        for &e in file.entries {
            // SAFETY: the trampolines were generated for exactly these entries.
            let (trampoline, signature) = unsafe {
                let t: libloading::Symbol<unsafe extern "C" fn(*mut *mut c_void)> =
                    lib._lib.get(format!("emu_entry_{e}").as_bytes()).map_err(|err| load_error(&path, err))?;
                let s: libloading::Symbol<unsafe extern "C" fn() -> *const c_char> =
                    lib._lib.get(format!("emu_signature_{e}").as_bytes()).map_err(|err| load_error(&path, err))?;
                (*t as *const c_void, std::ffi::CStr::from_ptr(s()).to_string_lossy().into_owned())
            };
            entries.insert(e, Entry { lib: lib.clone(), trampoline, signature });
        }
    }
    Ok(entries)
}

/// Bytes allocated on an emulated device, by start address (to check launch pointers).
type Allocations = BTreeMap<DevPtr, usize>;

pub struct EmuDevice {
    info: GpuInfo,
    entries: HashMap<&'static str, Entry>,
    schedule: Schedule,
    allocations: Mutex<Allocations>,
    /// Bytes in `allocations`, and the most there were at once.
    in_use: std::sync::atomic::AtomicU64,
    peak: std::sync::atomic::AtomicU64,
    /// `DELTASCOPE_EMU_PROFILE=1`: launches and time per kernel, printed when the device closes.
    profile: Option<Mutex<HashMap<&'static str, (u64, f64)>>>,
}

impl Drop for EmuDevice {
    fn drop(&mut self) {
        let Some(p) = &self.profile else { return };
        let p = p.lock().unwrap_or_else(|e| e.into_inner());
        let mut rows: Vec<_> = p.iter().collect();
        rows.sort_by(|a, b| b.1.1.total_cmp(&a.1.1));
        eprintln!("{}: launches and time per kernel", self.label());
        for (k, (n, s)) in rows {
            eprintln!("  {k:<22} {n:>8} launches {s:>9.3} s");
        }
    }
}

/// `DELTASCOPE_EMU_MEMORY` in bytes (suffixes K/M/G/GiB accepted), else 16 GiB.
pub fn capacity() -> Result<u64, EmuError> {
    let Ok(v) = std::env::var("DELTASCOPE_EMU_MEMORY") else { return Ok(DEFAULT_MEMORY) };
    let t = v.trim().trim_end_matches('B').trim_end_matches('i');
    let (num, mult) = match t.char_indices().last() {
        Some((i, 'K')) => (&t[..i], 1u64 << 10),
        Some((i, 'M')) => (&t[..i], 1 << 20),
        Some((i, 'G')) => (&t[..i], 1 << 30),
        _ => (t, 1),
    };
    num.trim().parse::<u64>().map(|n| n * mult).map_err(|_| EmuError::Setting {
        var: "DELTASCOPE_EMU_MEMORY",
        value: v.clone(),
        expected: "expected bytes, e.g. 8GiB or 512M",
    })
}

impl EmuDevice {
    /// Emulated device `ordinal` (0..8) with `kernels` built for this CPU, resumed in the
    /// order `DELTASCOPE_EMU_SCHEDULE` names.
    pub fn open(ordinal: usize, kernels: &'static [KernelFile]) -> Result<Self, EmuError> {
        Self::open_with(ordinal, kernels, Schedule::from_env()?)
    }

    pub fn open_with(ordinal: usize, kernels: &'static [KernelFile], schedule: Schedule) -> Result<Self, EmuError> {
        if ordinal >= 8 {
            return Err(EmuError::NoSuchDevice { ordinal });
        }
        let total = capacity()?;
        let entries = load_kernels(kernels)?;
        let info = GpuInfo {
            ordinal,
            name: "emulated CUDA device (CPU fibers)".into(),
            compute_capability: (0, 0),
            total_bytes: total,
            free_bytes: total,
        };
        let profile =
            std::env::var("DELTASCOPE_EMU_PROFILE").is_ok_and(|v| v == "1").then(|| Mutex::new(HashMap::new()));
        Ok(EmuDevice {
            info,
            entries,
            schedule,
            allocations: Mutex::new(BTreeMap::new()),
            in_use: std::sync::atomic::AtomicU64::new(0),
            peak: std::sync::atomic::AtomicU64::new(0),
            profile,
        })
    }

    pub fn schedule(&self) -> Schedule {
        self.schedule
    }

    /// The static shared memory of the library holding `kernel` (its file's `__shared__`s).
    pub fn shared_bytes(&self, kernel: &str) -> Option<u64> {
        self.entries.get(kernel).map(|e| e.lib.shared_bytes)
    }

    fn allocated(&self) -> u64 {
        self.in_use.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `p` lies in (or one past the end of) a live allocation.
    fn owns(&self, p: DevPtr) -> bool {
        let a = self.allocations.lock().unwrap_or_else(|p| p.into_inner());
        a.range(..=p).next_back().is_some_and(|(&start, &len)| p <= start + len as u64)
    }
}

const ALIGN: usize = 256;

impl Device for EmuDevice {
    fn info(&self) -> &GpuInfo {
        &self.info
    }

    fn label(&self) -> String {
        format!("emu:{}", self.info.ordinal)
    }

    fn emulated(&self) -> bool {
        true
    }

    fn alloc(&self, bytes: usize) -> GpuResult<DevPtr> {
        let bytes = bytes.max(1);
        let layout = std::alloc::Layout::from_size_align(bytes, ALIGN)
            .map_err(|e| GpuError::Driver(format!("allocation of {bytes} bytes: {e}")))?;
        if self.allocated() + bytes as u64 > self.info.total_bytes {
            return Err(GpuError::Driver(format!(
                "CUDA_ERROR_OUT_OF_MEMORY: {} of {} bytes of the emulated device in use, {bytes} more asked (DELTASCOPE_EMU_MEMORY)",
                self.allocated(),
                self.info.total_bytes
            )));
        }
        // SAFETY: a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        if p.is_null() {
            return Err(GpuError::Driver(format!("CUDA_ERROR_OUT_OF_MEMORY: the host refused {bytes} bytes")));
        }
        self.allocations.lock().unwrap_or_else(|p| p.into_inner()).insert(p as DevPtr, bytes);
        let now = self.in_use.fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed) + bytes as u64;
        self.peak.fetch_max(now, std::sync::atomic::Ordering::Relaxed);
        Ok(p as DevPtr)
    }

    unsafe fn free(&self, ptr: DevPtr, bytes: usize) {
        let known = self.allocations.lock().unwrap_or_else(|p| p.into_inner()).remove(&ptr);
        if let (Some(size), Ok(layout)) = (known, std::alloc::Layout::from_size_align(bytes.max(1), ALIGN)) {
            debug_assert_eq!(size, bytes.max(1));
            self.in_use.fetch_sub(size as u64, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(ptr as *mut u8, layout) }
        }
    }

    unsafe fn htod(&self, src: &[u8], dst: DevPtr) -> GpuResult<()> {
        // SAFETY: the caller guarantees the range lies in a live allocation.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        Ok(())
    }

    unsafe fn dtoh(&self, src: DevPtr, dst: &mut [u8]) -> GpuResult<()> {
        // SAFETY: as above.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    unsafe fn dtod(&self, src: DevPtr, dst: DevPtr, bytes: usize) -> GpuResult<()> {
        // SAFETY: as above (cudaMemcpy semantics: the ranges do not overlap).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }

    unsafe fn launch(&self, kernel: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> GpuResult<()> {
        let fail = |message: String| GpuError::Launch { kernel: kernel.into(), message };
        let e = self.entries.get(kernel).ok_or_else(|| GpuError::NoKernel(kernel.into()))?;
        let given: String = args.iter().map(Arg::code).collect();
        if given != e.signature {
            return Err(fail(format!(
                "argument list ({given}) does not match the kernel's parameters ({}) [p pointer, i int, u unsigned, l long long, f float]",
                e.signature
            )));
        }
        for (i, a) in args.iter().enumerate() {
            if let Arg::Ptr(p) = *a
                && p != 0
                && !self.owns(p)
            {
                return Err(fail(format!("argument {i} ({p:#x}) is not inside a live allocation of {}", self.label())));
            }
        }
        let mut slots: Vec<u64> = args.iter().map(Arg::slot).collect();
        let mut params: Vec<*mut c_void> = slots.iter_mut().map(|s| s as *mut u64 as *mut c_void).collect();
        let mut err = vec![0 as c_char; 1024];
        let (schedule, seed) = self.schedule.code();
        let start = std::time::Instant::now();
        let rc = {
            let _serial = e.lib.lock.lock().unwrap_or_else(|p| p.into_inner());
            // SAFETY: the trampoline unpacks `params` as the kernel's parameters (the signature
            // was checked above) and the caller guarantees the buffers.
            unsafe {
                (e.lib.launch)(
                    e.trampoline,
                    grid.0,
                    grid.1,
                    grid.2,
                    block,
                    1,
                    1,
                    0,
                    params.as_mut_ptr(),
                    schedule,
                    seed,
                    err.as_mut_ptr(),
                    err.len() as c_ulong,
                )
            }
        };
        if let Some(p) = &self.profile {
            let mut p = p.lock().unwrap_or_else(|e| e.into_inner());
            let name = self.entries.get_key_value(kernel).map_or("?", |(k, _)| k);
            let e = p.entry(name).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += start.elapsed().as_secs_f64();
        }
        if rc != 0 {
            // SAFETY: the runtime NUL-terminates what it writes (snprintf).
            let msg = unsafe { std::ffi::CStr::from_ptr(err.as_ptr()) }.to_string_lossy().into_owned();
            return Err(fail(msg));
        }
        Ok(())
    }

    fn synchronize(&self) -> GpuResult<()> {
        // Every launch and copy completes before it returns.
        Ok(())
    }

    fn memory(&self) -> GpuResult<(u64, u64)> {
        let total = self.info.total_bytes;
        Ok((total.saturating_sub(self.allocated()), total))
    }

    fn peak_bytes(&self) -> Option<u64> {
        Some(self.peak.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn reset_peak(&self) {
        self.peak.store(self.allocated(), std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_parse_and_name_the_bad_value() {
        assert_eq!(Schedule::parse("").unwrap(), Schedule::Forward);
        assert_eq!(Schedule::parse("reverse").unwrap(), Schedule::Reverse);
        assert_eq!(Schedule::parse("random:42").unwrap(), Schedule::Random(42));
        let e = Schedule::parse("sideways").unwrap_err().to_string();
        assert!(e.contains("DELTASCOPE_EMU_SCHEDULE=\"sideways\"") && e.contains("random:SEED"), "{e}");
    }

    #[test]
    fn the_translation_unit_has_a_trampoline_per_entry() {
        let f = super::super::kernels::file("norm").unwrap();
        let tu = translation_unit(f);
        assert!(tu.contains("emu_entry_rms_norm(") && tu.contains("emu_signature_rms_norm_gated("));
        assert!(tu.contains("#line 1 \"norm.cu\""));
    }
    // The strictness rules, each on a tiny kernel of our own launched through `Device::launch`
    // (what ops.rs does), with the error the emulator gives asserted word for word where it is
    // deterministic. Every refusal is a `GpuError::Launch` naming the kernel.

    use super::super::device::Buf;
    use super::super::kernels::{self, KernelFile};

    /// Test kernels (prelude.cu in front, as for kernels/*.cu).
    const STRICT: &str = r#"
extern "C" __global__ void fill(float* out, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (float)i;
}

// A full-mask shuffle: every lane of a warp of 32 must be there.
extern "C" __global__ void lane_sums(float* out) {
    out[threadIdx.x] = warp_sum((float)threadIdx.x);
}

// Lanes < 16 reduce at one call site, the others at another: undefined on a GPU.
extern "C" __global__ void split_sums(const float* x, float* out) {
    const int lane = threadIdx.x & 31;
    if (lane < 16) {
        out[threadIdx.x] = warp_sum(x[threadIdx.x]) * 2.0f;
    } else {
        out[threadIdx.x] = 1.0f - warp_sum(x[threadIdx.x] + 3.0f);
    }
}

// Thread `quitter` returns before the barrier the others wait at.
extern "C" __global__ void early_exit(float* out, int quitter) {
    __shared__ float tile[64];
    if ((int)threadIdx.x == quitter) return;
    tile[threadIdx.x] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = tile[(threadIdx.x + 1) & 63];
}

// Thread 0 publishes a value the others read without a barrier: a race.
extern "C" __global__ void racy(float* out) {
    __shared__ float published;
    if (threadIdx.x == 0) published = 42.0f;
    out[blockIdx.x * blockDim.x + threadIdx.x] = published;
}

// Correct: a tile exchanged through shared memory behind a barrier, then a block reduction.
extern "C" __global__ void block_dot(const float* x, float* out, int n) {
    __shared__ float tile[256];
    __shared__ float scratch[32];
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float v = i < n ? x[i] : 0.0f;
    tile[threadIdx.x] = v;
    __syncthreads();
    const float mirrored = tile[blockDim.x - 1 - threadIdx.x];
    const float total = block_sum(v * mirrored, scratch);
    if (i < n) out[i] = total + mirrored;
}
"#;

    /// One kernel file, `__shared__` over the 48 KiB a block may have statically.
    const BIG_SHARED: &str = r#"
extern "C" __global__ void hog(float* out) {
    __shared__ float big[12289];
    big[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = big[(threadIdx.x + 1) % blockDim.x];
}
"#;

    fn leak<T>(v: Vec<T>) -> &'static [T] {
        Box::leak(v.into_boxed_slice())
    }

    fn file(name: &str, source: &str, entries: &[&str]) -> &'static [KernelFile] {
        let entries: Vec<&'static str> = entries.iter().map(|e| &*Box::leak(e.to_string().into_boxed_str())).collect();
        leak(vec![KernelFile {
            name: Box::leak(name.to_string().into_boxed_str()),
            source: Box::leak(source.to_string().into_boxed_str()),
            entries: leak(entries),
            prelude: kernels::PRELUDE,
        }])
    }

    fn strict() -> &'static [KernelFile] {
        static FILES: OnceLock<&'static [KernelFile]> = OnceLock::new();
        FILES.get_or_init(|| {
            file("emu_test_strict", STRICT, &["fill", "lane_sums", "split_sums", "early_exit", "racy", "block_dot"])
        })
    }

    /// An emulated device with `files` (one open at a time: the tests run on threads of one
    /// process, and two threads building the same uncached library would share its temporary
    /// file names, which carry the process id only).
    fn open_emu(files: &'static [KernelFile], schedule: Schedule) -> EmuDevice {
        static OPENING: Mutex<()> = Mutex::new(());
        let _one = OPENING.lock().unwrap_or_else(|p| p.into_inner());
        EmuDevice::open_with(0, files, schedule).unwrap_or_else(|e| panic!("the emulated device: {e}"))
    }

    fn open(files: &'static [KernelFile], schedule: Schedule) -> Arc<dyn Device> {
        Arc::new(open_emu(files, schedule))
    }

    /// Launches and returns the error's text, asserting it is a launch error naming `kernel`.
    fn refused(dev: &Arc<dyn Device>, kernel: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) -> String {
        // SAFETY: every buffer the test kernels touch is as large as the launch (or the launch
        // is refused before it runs).
        let e = unsafe { dev.launch(kernel, grid, block, args) }.expect_err("the launch should be refused");
        match &e {
            GpuError::Launch { kernel: k, .. } => assert_eq!(k, kernel, "{e}"),
            other => panic!("not a launch error: {other:?}"),
        }
        let text = e.to_string();
        assert!(text.starts_with(&format!("kernel {kernel}: ")), "{text}");
        text
    }

    fn launch(dev: &Arc<dyn Device>, kernel: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) {
        // SAFETY: as in `refused`.
        unsafe { dev.launch(kernel, grid, block, args) }.unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_correct_kernel_runs() {
        let dev = open(strict(), Schedule::Forward);
        let out = Buf::<f32>::zeros(&dev, 100).unwrap();
        launch(&dev, "fill", (4, 1, 1), 32, &[out.arg(), Arg::I32(100)]);
        assert_eq!(out.read().unwrap(), (0..100).map(|i| i as f32).collect::<Vec<_>>());
    }

    #[test]
    fn a_block_of_1025_threads_is_refused() {
        let dev = open(strict(), Schedule::Forward);
        let out = Buf::<f32>::zeros(&dev, 1025).unwrap();
        let e = refused(&dev, "fill", (1, 1, 1), 1025, &[out.arg(), Arg::I32(1025)]);
        assert_eq!(
            e,
            "kernel fill: invalid launch configuration: block 1025,1,1 (1025 threads; at most 1024, z at most 64)"
        );
        // 1024 is the limit, not past it.
        launch(&dev, "fill", (1, 1, 1), 1024, &[out.arg(), Arg::I32(1024)]);
    }

    #[test]
    fn grid_y_of_65536_is_refused() {
        let dev = open(strict(), Schedule::Forward);
        let out = Buf::<f32>::zeros(&dev, 32).unwrap();
        let e = refused(&dev, "fill", (1, 65536, 1), 32, &[out.arg(), Arg::I32(32)]);
        assert_eq!(e, "kernel fill: invalid launch configuration: grid 1,65536,1 (grid y/z > 65535 or x > 2^31-1)");
        let e = refused(&dev, "fill", (1, 1, 65536), 32, &[out.arg(), Arg::I32(32)]);
        assert!(e.contains("grid 1,1,65536"), "{e}");
        let e = refused(&dev, "fill", (0, 1, 1), 32, &[out.arg(), Arg::I32(32)]);
        assert!(e.contains("a zero dimension"), "{e}");
        // x goes past 65535 (each block writes nothing past n = 32).
        launch(&dev, "fill", (70_000, 1, 1), 32, &[out.arg(), Arg::I32(32)]);
    }

    #[test]
    fn static_shared_memory_over_48_kib_is_refused() {
        let emu = open_emu(file("emu_test_big_shared", BIG_SHARED, &["hog"]), Schedule::Forward);
        let bytes = emu.shared_bytes("hog").unwrap();
        let dev: Arc<dyn Device> = Arc::new(emu);
        assert!(bytes > 48 * 1024 && bytes <= 48 * 1024 + 64, "{bytes}");
        let out = Buf::<f32>::zeros(&dev, 64).unwrap();
        let e = refused(&dev, "hog", (1, 1, 1), 64, &[out.arg()]);
        assert_eq!(e, format!("kernel hog: static shared memory {bytes} bytes > 48 KiB"));
    }

    #[test]
    fn a_full_mask_shuffle_in_a_partial_warp_is_refused() {
        let dev = open(strict(), Schedule::Forward);
        let out = Buf::<f32>::zeros(&dev, 64).unwrap();
        let e = refused(&dev, "lane_sums", (1, 1, 1), 48, &[out.arg()]);
        assert_eq!(
            e,
            "kernel lane_sums: __shfl_xor_sync(0xffffffff) in a partial warp (blockDim 48, not a multiple of 32): undefined on a GPU"
        );
        // Whole warps are fine: each lane gets the warp's sum.
        launch(&dev, "lane_sums", (1, 1, 1), 64, &[out.arg()]);
        let sums = out.read().unwrap();
        assert!(sums[..32].iter().all(|&v| v == 496.0) && sums[32..].iter().all(|&v| v == 1520.0), "{sums:?}");
    }

    #[test]
    fn lanes_at_different_shuffles_are_divergent() {
        for schedule in [Schedule::Forward, Schedule::Reverse, Schedule::Random(7)] {
            let dev = open(strict(), schedule);
            let x = Buf::from_host(&dev, &vec![1.0f32; 64]).unwrap();
            let out = Buf::<f32>::zeros(&dev, 64).unwrap();
            let e = refused(&dev, "split_sums", (1, 1, 1), 32, &[x.arg(), out.arg()]);
            assert!(
                e.starts_with("kernel split_sums: divergent __shfl_xor_sync in block (0,0,0), warp 0: lane 0 at shuffle #0, lane 16 at #0"),
                "{schedule}: {e}"
            );
            assert!(e.ends_with("(another call site or lane mask)"), "{e}");
        }
    }

    #[test]
    fn a_thread_that_exits_before_a_barrier_is_a_deadlock_with_counts() {
        let dev = open(strict(), Schedule::Forward);
        let out = Buf::<f32>::zeros(&dev, 64).unwrap();
        // Threads 0..4 wait at the barrier when thread 5 returns.
        let e = refused(&dev, "early_exit", (1, 1, 1), 64, &[out.arg(), Arg::I32(5)]);
        assert_eq!(
            e,
            "kernel early_exit: a thread exited while others wait at __syncthreads: deadlock in block (0,0,0): \
             5 threads at __syncthreads, 0 at a shuffle, 1 exited, of 64"
        );
        // Thread 0 returns first; thread 1 then reaches the barrier no one can complete.
        let e = refused(&dev, "early_exit", (1, 1, 1), 64, &[out.arg(), Arg::I32(0)]);
        assert_eq!(
            e,
            "kernel early_exit: __syncthreads after a thread of the block exited: deadlock in block (0,0,0): \
             0 threads at __syncthreads, 0 at a shuffle, 1 exited, of 64"
        );
        // In reverse, threads 63..6 are waiting.
        let dev = open(strict(), Schedule::Reverse);
        let e = refused(&dev, "early_exit", (1, 1, 1), 64, &[out_on(&dev), Arg::I32(5)]);
        assert!(
            e.contains("deadlock in block (0,0,0): 58 threads at __syncthreads, 0 at a shuffle, 1 exited, of 64"),
            "{e}"
        );
        // Nobody quitting is fine.
        launch(&dev, "early_exit", (1, 1, 1), 64, &[out_on(&dev), Arg::I32(-1)]);
    }

    /// A 64-float buffer on `dev` kept for the life of the test process (its pointer is an
    /// argument only).
    fn out_on(dev: &Arc<dyn Device>) -> Arg {
        let b = Buf::<f32>::zeros(dev, 64).unwrap();
        let a = b.arg();
        std::mem::forget(b);
        a
    }

    #[test]
    fn an_argument_list_unlike_the_kernels_parameters_is_refused() {
        let dev = open(strict(), Schedule::Forward);
        let out = Buf::<f32>::zeros(&dev, 32).unwrap();
        let e = refused(&dev, "fill", (1, 1, 1), 32, &[out.arg(), Arg::I64(32)]);
        assert_eq!(
            e,
            "kernel fill: argument list (pl) does not match the kernel's parameters (pi) \
             [p pointer, i int, u unsigned, l long long, f float]"
        );
        let e = refused(&dev, "fill", (1, 1, 1), 32, &[out.arg()]);
        assert!(e.contains("argument list (p) does not match the kernel's parameters (pi)"), "{e}");
        let e = refused(&dev, "block_dot", (1, 1, 1), 32, &[out.arg(), Arg::F32(1.0), Arg::I32(1)]);
        assert!(e.contains("argument list (pfi) does not match the kernel's parameters (ppi)"), "{e}");
        // SAFETY: refused before it runs.
        let e = unsafe { dev.launch("no_such_kernel", (1, 1, 1), 32, &[]) }.unwrap_err();
        assert_eq!(e.to_string(), "kernel no_such_kernel is not loaded");
    }

    #[test]
    fn a_pointer_outside_every_live_allocation_is_refused() {
        let dev = open(strict(), Schedule::Forward);
        let e = refused(&dev, "fill", (1, 1, 1), 32, &[Arg::Ptr(0x1000), Arg::I32(32)]);
        assert_eq!(e, "kernel fill: argument 0 (0x1000) is not inside a live allocation of emu:0");
        // A freed buffer's address.
        let freed = Buf::<f32>::zeros(&dev, 32).unwrap();
        let Arg::Ptr(p) = freed.arg() else { unreachable!() };
        drop(freed);
        let e = refused(&dev, "fill", (1, 1, 1), 32, &[Arg::Ptr(p), Arg::I32(32)]);
        assert_eq!(e, format!("kernel fill: argument 0 ({p:#x}) is not inside a live allocation of emu:0"));
        // A live buffer, and a view into it, are fine.
        let out = Buf::<f32>::zeros(&dev, 64).unwrap();
        launch(&dev, "fill", (1, 1, 1), 32, &[out.at(32), Arg::I32(32)]);
        let got = out.read().unwrap();
        assert_eq!(&got[32..], (0..32).map(|i| i as f32).collect::<Vec<_>>().as_slice());
    }

    fn run_racy(schedule: Schedule) -> Vec<u32> {
        let dev = open(strict(), schedule);
        let out = Buf::<f32>::zeros(&dev, 4 * 64).unwrap();
        launch(&dev, "racy", (4, 1, 1), 64, &[out.arg()]);
        out.read().unwrap().iter().map(|v| v.to_bits()).collect()
    }

    #[test]
    fn a_race_on_shared_memory_shows_as_poison_and_depends_on_the_schedule() {
        let forward = run_racy(Schedule::Forward);
        let reverse = run_racy(Schedule::Reverse);
        let random = run_racy(Schedule::Random(7));
        // Forward happens to run thread 0 first; reverse runs it last, so threads 1.. read the
        // shared value before anyone wrote it: the poison, 0xFF bytes (a NaN).
        assert!(forward.iter().all(|&b| b == 42f32.to_bits()), "{forward:x?}");
        for block in reverse.chunks(64) {
            assert_eq!(block[0], 42f32.to_bits());
            assert!(block[1..].iter().all(|&b| b == 0xffff_ffff), "{block:x?}");
        }
        assert_ne!(forward, reverse, "the race must change the bits between forward and reverse");
        let poisoned = random.iter().filter(|&&b| b == 0xffff_ffff).count();
        assert!(poisoned > 0 && poisoned < 4 * 63, "random:7 should mix both: {poisoned} poisoned");
    }

    /// `block_dot`'s result on the host, in the kernel's order of additions (a butterfly per
    /// warp, then the warps' totals through the same butterfly).
    fn block_dot_twin(x: &[f32], block: usize) -> Vec<f32> {
        let butterfly = |mut v: Vec<f32>| {
            for o in [16, 8, 4, 2, 1] {
                v = (0..32).map(|i| v[i] + v[i ^ o]).collect();
            }
            v[0]
        };
        let mut out = vec![0f32; x.len()];
        for (b, chunk) in out.chunks_mut(block).enumerate() {
            let v: Vec<f32> = (0..block).map(|t| x.get(b * block + t).copied().unwrap_or(0.0)).collect();
            let prod: Vec<f32> = (0..block).map(|t| v[t] * v[block - 1 - t]).collect();
            let warps: Vec<f32> = prod.chunks(32).map(|w| butterfly(w.to_vec())).collect();
            let total = butterfly((0..32).map(|l| warps.get(l).copied().unwrap_or(0.0)).collect());
            for (t, o) in chunk.iter_mut().enumerate() {
                *o = total + v[block - 1 - t];
            }
        }
        out
    }

    #[test]
    fn a_correct_kernel_gives_the_same_bits_under_every_schedule() {
        let n = 1000usize;
        let x: Vec<f32> = (0..n).map(|i| ((i * 7919 % 1009) as f32 / 1009.0 - 0.5) * 3.0).collect();
        let twin = block_dot_twin(&x, 256);
        let mut runs = vec![];
        for schedule in [Schedule::Forward, Schedule::Reverse, Schedule::Random(7)] {
            let dev = open(strict(), schedule);
            let dx = Buf::from_host(&dev, &x).unwrap();
            let out = Buf::<f32>::zeros(&dev, n).unwrap();
            launch(&dev, "block_dot", (n.div_ceil(256) as u32, 1, 1), 256, &[dx.arg(), out.arg(), Arg::I32(n as i32)]);
            let bits: Vec<u32> = out.read().unwrap().iter().map(|v| v.to_bits()).collect();
            runs.push((schedule, bits));
        }
        let twin_bits: Vec<u32> = twin.iter().map(|v| v.to_bits()).collect();
        for (schedule, bits) in &runs {
            assert_eq!(bits, &twin_bits, "{schedule}: the kernel's bits differ from the host's");
        }
    }
}
