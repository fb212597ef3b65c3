//! What each kernel costs the GPU, read from ptxas's verbose log (`--ptxas-options=--verbose`,
//! which NVRTC forwards when it compiles a CUBIN): registers per thread, spills, stack frame
//! and static shared memory per entry point, and the limits they are held to.

/// The most registers one thread may use on every architecture since Kepler (more cannot be
/// addressed; ptxas spills instead).
pub const MAX_REGISTERS: u32 = 255;

/// The most static (`__shared__` array) shared memory a block may declare: 48 KiB on every
/// architecture. More has to be dynamic and opted into per kernel.
pub const MAX_STATIC_SMEM_BYTES: u64 = 48 * 1024;

/// One entry point's resources, for one architecture.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KernelResources {
    pub entry: String,
    /// `sm_90`, as ptxas names it.
    pub arch: String,
    /// Registers per thread.
    pub registers: u32,
    pub barriers: u32,
    /// Static shared memory per block.
    pub smem_bytes: u64,
    /// Per-thread local memory for the frame (local arrays indexed at run time, spills).
    pub stack_frame_bytes: u64,
    pub spill_store_bytes: u64,
    pub spill_load_bytes: u64,
}

impl KernelResources {
    /// Why this entry breaks the limits (no spills, ≤ 255 registers, ≤ 48 KiB static shared
    /// memory), one line each; empty when it fits.
    pub fn violations(&self) -> Vec<String> {
        let mut out = vec![];
        if self.registers > MAX_REGISTERS {
            out.push(format!("{} registers (the limit is {MAX_REGISTERS})", self.registers));
        }
        if self.spill_store_bytes > 0 || self.spill_load_bytes > 0 {
            out.push(format!(
                "spills: {} bytes stored, {} bytes loaded (a {}-byte stack frame)",
                self.spill_store_bytes, self.spill_load_bytes, self.stack_frame_bytes
            ));
        }
        if self.smem_bytes > MAX_STATIC_SMEM_BYTES {
            out.push(format!(
                "{} bytes of static shared memory (the limit is {MAX_STATIC_SMEM_BYTES})",
                self.smem_bytes
            ));
        }
        out
    }
}

/// A non-entry (`__device__`, not inlined) function's frame: ptxas reports no registers for
/// it, but its spills are the calling kernel's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceFunctionFrame {
    /// As ptxas names it (mangled unless `extern "C"`).
    pub name: String,
    pub stack_frame_bytes: u64,
    pub spill_store_bytes: u64,
    pub spill_load_bytes: u64,
}

impl DeviceFunctionFrame {
    /// Its spills, in one line, when it has any.
    pub fn violation(&self) -> Option<String> {
        (self.spill_store_bytes > 0 || self.spill_load_bytes > 0).then(|| {
            format!(
                "device function {} spills: {} bytes stored, {} bytes loaded",
                self.name, self.spill_store_bytes, self.spill_load_bytes
            )
        })
    }
}

/// Everything read from one ptxas log.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct PtxasReport {
    /// In the order ptxas compiled them.
    pub entries: Vec<KernelResources>,
    /// Each once, with the largest numbers reported for it (ptxas repeats a callee's frame
    /// after each caller).
    pub device_functions: Vec<DeviceFunctionFrame>,
}

impl PtxasReport {
    pub fn entry(&self, name: &str) -> Option<&KernelResources> {
        self.entries.iter().find(|r| r.entry == name)
    }
}

/// `N bytes stack frame, N bytes spill stores, N bytes spill loads` → the three numbers.
fn frame_numbers(text: &str) -> (u64, u64, u64) {
    let (mut frame, mut stores, mut loads) = (0, 0, 0);
    for part in text.trim_start_matches('.').split(',') {
        match number_and_unit(part) {
            Some((n, "bytes stack frame")) => frame = n,
            Some((n, "bytes spill stores")) => stores = n,
            Some((n, "bytes spill loads")) => loads = n,
            _ => {}
        }
    }
    (frame, stores, loads)
}

/// Reads every entry point (and non-inlined device function) ptxas reports in its verbose
/// log:
///
/// ```text
/// ptxas info    : Compiling entry function 'rms_norm' for 'sm_86'
/// ptxas info    : Function properties for rms_norm
/// ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 17 registers, used 1 barriers, 128 bytes smem, 400 bytes cmem[0]
/// ```
///
/// An entry whose register line or frame line is missing is an error, not zeros: a limit
/// check must not pass on numbers it never read.
pub fn parse_ptxas_log(log: &str) -> Result<PtxasReport, String> {
    struct Partial {
        r: KernelResources,
        used: bool,
        frame: bool,
    }
    let mut entries: Vec<Partial> = vec![];
    let mut device_functions: Vec<DeviceFunctionFrame> = vec![];
    // The function the next frame line describes.
    let mut properties_of: Option<String> = None;
    for line in log.lines() {
        let Some(rest) = line.strip_prefix("ptxas") else { continue };
        let text = rest.trim_start().trim_start_matches("info").trim_start().trim_start_matches(':').trim_start();
        if let Some(s) = text.strip_prefix("Compiling entry function ") {
            let mut quoted = s.split('\'').skip(1).step_by(2);
            let (Some(entry), Some(arch)) = (quoted.next(), quoted.next()) else {
                return Err(format!("unreadable ptxas line: {line}"));
            };
            entries.push(Partial {
                r: KernelResources {
                    entry: entry.into(),
                    arch: arch.into(),
                    registers: 0,
                    barriers: 0,
                    smem_bytes: 0,
                    stack_frame_bytes: 0,
                    spill_store_bytes: 0,
                    spill_load_bytes: 0,
                },
                used: false,
                frame: false,
            });
            properties_of = None;
        } else if let Some(name) = text.strip_prefix("Function properties for ") {
            properties_of = Some(name.trim().to_string());
        } else if text.contains("bytes stack frame") {
            let Some(name) = properties_of.take() else {
                return Err(format!("a stack frame line for no function: {line}"));
            };
            let (frame, stores, loads) = frame_numbers(text);
            match entries.last_mut() {
                Some(cur) if cur.r.entry == name => {
                    (cur.r.stack_frame_bytes, cur.r.spill_store_bytes, cur.r.spill_load_bytes) = (frame, stores, loads);
                    cur.frame = true;
                }
                _ => match device_functions.iter_mut().find(|f| f.name == name) {
                    Some(f) => {
                        f.stack_frame_bytes = f.stack_frame_bytes.max(frame);
                        f.spill_store_bytes = f.spill_store_bytes.max(stores);
                        f.spill_load_bytes = f.spill_load_bytes.max(loads);
                    }
                    None => device_functions.push(DeviceFunctionFrame {
                        name,
                        stack_frame_bytes: frame,
                        spill_store_bytes: stores,
                        spill_load_bytes: loads,
                    }),
                },
            }
        } else if let Some(s) = text.strip_prefix("Used ") {
            let Some(cur) = entries.last_mut() else {
                return Err(format!("a register line before any entry: {line}"));
            };
            for part in s.split(',') {
                let part = part.trim().trim_start_matches("used ");
                match number_and_unit(part) {
                    Some((n, "registers")) => cur.r.registers = n as u32,
                    Some((n, "barriers")) => cur.r.barriers = n as u32,
                    Some((n, "bytes smem")) => cur.r.smem_bytes = n,
                    _ => {}
                }
            }
            cur.used = true;
        }
    }
    let entries = entries
        .into_iter()
        .map(|p| match (p.used, p.frame) {
            (true, true) => Ok(p.r),
            (false, _) => Err(format!("ptxas gave no register line for {} ({})", p.r.entry, p.r.arch)),
            (_, false) => Err(format!("ptxas gave no stack frame line for {} ({})", p.r.entry, p.r.arch)),
        })
        .collect::<Result<_, _>>()?;
    Ok(PtxasReport { entries, device_functions })
}

/// `"  128 bytes smem"` → `(128, "bytes smem")`.
fn number_and_unit(part: &str) -> Option<(u64, &str)> {
    let part = part.trim();
    let (n, unit) = part.split_once(' ')?;
    Some((n.parse().ok()?, unit.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NVRTC 13.4's log for kernels/moe.cu, sm_90 (Hopper lists no cmem).
    const MOE_SM90: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'sigmoid_scale_rows' for 'sm_90'
ptxas info    : Function properties for sigmoid_scale_rows
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 20 registers, used 0 barriers
ptxas info    : Compile time = 18.257 ms
ptxas info    : Compiling entry function 'moe_combine' for 'sm_90'
ptxas info    : Function properties for moe_combine
ptxas         .     128 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 0 barriers, 128 bytes cumulative stack size
ptxas info    : Compile time = 23.921 ms
ptxas info    : Compiling entry function 'moe_gemv' for 'sm_90'
ptxas info    : Function properties for moe_gemv
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 0 barriers
ptxas info    : Compile time = 16.378 ms
ptxas info    : Compiling entry function 'moe_topk' for 'sm_90'
ptxas info    : Function properties for moe_topk
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 30 registers, used 1 barriers, 4480 bytes smem
ptxas info    : Compile time = 58.477 ms
";

    /// NVRTC 13.4's log for kernels/rope.cu and kernels/gemm.cu, sm_86 (cmem banks listed).
    const ROPE_GEMM_SM86: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'rope_mrope' for 'sm_86'
ptxas info    : Function properties for rope_mrope
ptxas         .     32 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 32 bytes cumulative stack size, 412 bytes cmem[0], 8 bytes cmem[2]
ptxas info    : Compile time = 36.422 ms
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'gemm_bf16_tiled' for 'sm_86'
ptxas info    : Function properties for gemm_bf16_tiled
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 41 registers, used 1 barriers, 8320 bytes smem, 396 bytes cmem[0]
ptxas info    : Compile time = 50.041 ms
";

    /// NVRTC 13.4's log, sm_90, for two kernels calling a `__noinline__` helper, compiled
    /// with `--maxrregcount=16` to make them spill: an entry's own spills, and a callee's
    /// (reported after each caller, under its mangled name).
    const SPILLING_SM90: &str = "\
ptxas warning : For profile sm_90 adjusting per thread register count of 16 to lower bound of 24
ptxas info    : Overriding maximum register limit 256 for 'k2' with  24 of maxrregcount option
ptxas info    : Overriding maximum register limit 256 for 'k' with  24 of maxrregcount option
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k2' for 'sm_90'
ptxas info    : Function properties for k2
ptxas         .     216 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 216 bytes cumulative stack size, 4096 bytes smem
ptxas info    : Compile time = 24.136 ms
ptxas info    : Function properties for _Z6helperPfi
ptxas         .     0 bytes stack frame, 256 bytes spill stores, 256 bytes spill loads
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     216 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 24 registers, used 0 barriers, 216 bytes cumulative stack size
ptxas info    : Compile time = 22.447 ms
ptxas info    : Function properties for _Z6helperPfi
ptxas         .     0 bytes stack frame, 256 bytes spill stores, 256 bytes spill loads
";

    fn numbers(r: &KernelResources) -> (u32, u32, u64, u64, u64, u64) {
        (r.registers, r.barriers, r.smem_bytes, r.stack_frame_bytes, r.spill_store_bytes, r.spill_load_bytes)
    }

    #[test]
    fn every_entry_of_a_hopper_log_is_read() {
        let rep = parse_ptxas_log(MOE_SM90).unwrap();
        let names: Vec<&str> = rep.entries.iter().map(|r| r.entry.as_str()).collect();
        assert_eq!(names, ["sigmoid_scale_rows", "moe_combine", "moe_gemv", "moe_topk"]);
        assert!(rep.entries.iter().all(|r| r.arch == "sm_90"));
        assert_eq!(numbers(rep.entry("sigmoid_scale_rows").unwrap()), (20, 0, 0, 0, 0, 0));
        // A local array's frame is not a spill.
        assert_eq!(numbers(rep.entry("moe_combine").unwrap()), (32, 0, 0, 128, 0, 0));
        assert_eq!(numbers(rep.entry("moe_topk").unwrap()), (30, 1, 4480, 0, 0, 0));
        assert!(rep.device_functions.is_empty());
        assert!(rep.entries.iter().all(|r| r.violations().is_empty()));
    }

    #[test]
    fn cmem_and_stack_sizes_are_not_taken_for_shared_memory() {
        let rep = parse_ptxas_log(ROPE_GEMM_SM86).unwrap();
        let rope = rep.entry("rope_mrope").unwrap();
        assert_eq!(rope.arch, "sm_86");
        assert_eq!(numbers(rope), (24, 0, 0, 32, 0, 0));
        assert_eq!(numbers(rep.entry("gemm_bf16_tiled").unwrap()), (41, 1, 8320, 0, 0, 0));
    }

    #[test]
    fn an_entrys_spills_and_its_callees_are_told_apart() {
        let rep = parse_ptxas_log(SPILLING_SM90).unwrap();
        assert_eq!(numbers(rep.entry("k2").unwrap()), (24, 1, 4096, 216, 4, 4));
        assert_eq!(numbers(rep.entry("k").unwrap()), (24, 0, 0, 216, 0, 0));
        assert_eq!(
            rep.device_functions,
            [DeviceFunctionFrame {
                name: "_Z6helperPfi".into(),
                stack_frame_bytes: 0,
                spill_store_bytes: 256,
                spill_load_bytes: 256
            }]
        );
        assert_eq!(
            rep.entry("k2").unwrap().violations(),
            ["spills: 4 bytes stored, 4 bytes loaded (a 216-byte stack frame)"]
        );
        assert!(rep.entry("k").unwrap().violations().is_empty());
        assert_eq!(
            rep.device_functions[0].violation().unwrap(),
            "device function _Z6helperPfi spills: 256 bytes stored, 256 bytes loaded"
        );
    }

    #[test]
    fn registers_and_shared_memory_past_the_limits_are_named() {
        let base = parse_ptxas_log(MOE_SM90).unwrap().entries[0].clone();
        assert!(base.violations().is_empty());
        let at_limits = KernelResources { registers: 255, smem_bytes: 48 * 1024, ..base.clone() };
        assert!(at_limits.violations().is_empty());
        let over = KernelResources { registers: 256, smem_bytes: 48 * 1024 + 4, ..base };
        assert_eq!(
            over.violations(),
            ["256 registers (the limit is 255)", "49156 bytes of static shared memory (the limit is 49152)"]
        );
    }

    #[test]
    fn an_entry_without_its_numbers_is_an_error() {
        let no_used = "\
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
";
        assert!(parse_ptxas_log(no_used).unwrap_err().contains("no register line for k"));
        let no_frame = "\
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Used 8 registers, used 0 barriers
";
        assert!(parse_ptxas_log(no_frame).unwrap_err().contains("no stack frame line for k"));
        assert_eq!(parse_ptxas_log("").unwrap(), PtxasReport::default());
    }
}
