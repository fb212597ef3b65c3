//! How the C allocator keeps freed memory while the CPU engine runs.
//!
//! Why: every layer of a prefill allocates its activations afresh — matrices of tokens ×
//! features, a few MB to a few hundred — and glibc hands allocations over 128 KiB straight to
//! `mmap` and returns them with `munmap` when freed. Each one then costs a page fault per 4 KiB
//! touched and a TLB shootdown across the threads when unmapped: on the 0.8B shape that was 16 %
//! of a 512-token prefill (`perf`: `exc_page_fault`, `flush_tlb_mm_range`). Serving allocations
//! up to 32 MiB from the heap, and keeping up to 256 MiB of freed heap instead of trimming it,
//! lets a layer reuse the pages the previous one freed: pp512 went 371 → 412–432 tok/s, peak RSS
//! unchanged (it is the mapped weights). Larger buffers (prompts of many thousand tokens) still
//! go to `mmap` and back, so long prompts do not pin their peak.

/// Sets glibc's thresholds (once per process; elsewhere a no-op). Returns whether they hold.
pub(crate) fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *DONE.get_or_init(|| {
            const MMAP_THRESHOLD: libc::c_int = 32 << 20;
            const TRIM_THRESHOLD: libc::c_int = 256 << 20;
            // SAFETY: `mallopt` only sets allocator parameters; these are in glibc's valid
            // ranges (the mmap threshold's maximum is 32 MiB on 64-bit).
            unsafe {
                libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                    && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            }
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        true
    }
}

#[cfg(test)]
mod tests {
    /// glibc accepts both settings (a value out of its range would be refused, silently
    /// losing the speed-up).
    #[test]
    fn glibc_accepts_the_thresholds() {
        assert!(super::keep_freed_memory());
    }
}
