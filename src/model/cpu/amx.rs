//! The bf16 × bf16 GEMV on AMX tiles (`tdpbf16ps`), for the decode step and the MTP verify
//! pass on CPUs with AMX-BF16 (Sapphire Rapids and later).
//!
//! Why: `vdpbf16ps` does 32 products an instruction, so a verify pass over K + 1 tokens costs
//! K + 1 times the arithmetic of one step and, on the 2-core Xeon here, stops being bound by
//! memory (a [248320, 1024] LM head on one thread: 11.9 GB/s for one row, 6.8 GB/s for four).
//! A tile instruction multiplies 16 weight rows by 32 inputs for up to 16 activation rows at
//! once, so one to sixteen rows cost the same: 13 GB/s measured for 1, 2, 4, 5, 8 and 16 rows.
//!
//! Layout: `Yᵀ = W · Xᵀ`. The A tile is 16 weight rows × 32 bf16, loaded straight from the
//! mapped checkpoint with the row stride (no repacking); the B tile is the activations' 16
//! pairs × R rows (`[block][pair][row]` u32, packed once per call by [`Packed`]); the C tile is
//! 16 outputs × R rows, stored as `y[o · R + r]`, the GEMV's own layout.
//!
//! Summation order: the hardware's own. It is none of the plain orders (each pair's products
//! in either order, pair sums sequential or as trees, wider accumulators: 13 candidates, none
//! bit-exact on random data here), so these outputs are tested against the exact sum within
//! f32 rounding, not bit for bit. What is exact: an output's bits depend only on its weight row
//! and its activation row — not on how many rows ride along, where the block starts or which
//! thread runs it — so a verify pass gives each token the bits of a one-token step, and
//! speculative greedy stays plain greedy. Inputs past the last whole 32 (widths not a multiple
//! of 32) are added after the tiles, in order, as the other kernels add their tails.

use std::sync::OnceLock;

/// Activation rows one tile pass serves (a C tile row is 64 bytes: 16 f32).
pub const MAX_ROWS: usize = 16;
/// Inputs per tile step (a tile row of 64 bytes: 32 bf16).
const K_STEP: usize = 32;
/// Output rows per tile.
const M: usize = 16;

/// Whether this CPU has AMX-BF16 and the kernel lets this process use the tile registers
/// (Linux asks each process to request them once: `arch_prctl(ARCH_REQ_XCOMP_PERM)`).
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        {
            x86::has_amx_bf16() && x86::request_tiles()
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
        {
            false
        }
    })
}

/// Activation rows rounded to bf16 and packed for the B tile: per 32-input block, 16 pairs of
/// `rows` u32 (the even input in the low half, as `tdpbf16ps` reads a pair).
pub struct Packed {
    rows: usize,
    n: usize,
    data: Vec<u32>,
}

impl Packed {
    /// `bits(r)` is activation row `r` as bf16 bits (at least `n` of them).
    pub fn new<'a>(rows: usize, n: usize, bits: impl Fn(usize) -> &'a [u16]) -> Packed {
        let blocks = n / K_STEP;
        let mut data = vec![0u32; blocks * (K_STEP / 2) * rows];
        for r in 0..rows {
            let x = bits(r);
            for p in 0..blocks * K_STEP / 2 {
                data[p * rows + r] = u32::from(x[2 * p]) | (u32::from(x[2 * p + 1]) << 16);
            }
        }
        Packed { rows, n, data }
    }
}

/// `y[o · g + i] = w[o] · x[rows.start + i]` over the whole 32-input blocks, for the `k` weight
/// rows of `n` in `w` and the `g = rows.len()` activation rows (g ≤ [`MAX_ROWS`]). Only where
/// [`available`] holds; the caller adds the tail past the last whole block.
pub fn gemv(w: &[u16], k: usize, x: &Packed, rows: std::ops::Range<usize>, y: &mut [f32]) {
    let (n, g) = (x.n, rows.len());
    assert!(available(), "the AMX GEMV needs AMX-BF16");
    assert!(w.len() == k * n && y.len() == k * g && (1..=MAX_ROWS).contains(&g) && rows.end <= x.rows);
    if n < K_STEP {
        y.fill(0.0);
        return;
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    // SAFETY: `available` checked the CPU and the OS permission; the lengths are asserted above
    // and `x86::gemv` reads only whole blocks inside them.
    unsafe {
        x86::gemv(w, k, n, x, rows.start, g, y)
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod x86 {
    use std::arch::asm;

    use super::{K_STEP, M, Packed};

    /// CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
    pub fn has_amx_bf16() -> bool {
        let leaf = std::arch::x86_64::__cpuid_count(7, 0);
        leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0
    }

    /// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: without it the first tile
    /// instruction kills the process (Linux 5.16+; older kernels refuse, and the caller falls
    /// back to `vdpbf16ps`).
    pub fn request_tiles() -> bool {
        const SYS_ARCH_PRCTL: i64 = 158;
        const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
        const XFEATURE_XTILEDATA: i64 = 18;
        let ret: i64;
        // SAFETY: a plain system call; it reads and writes no memory of ours.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") SYS_ARCH_PRCTL => ret,
                in("rdi") ARCH_REQ_XCOMP_PERM,
                in("rsi") XFEATURE_XTILEDATA,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack)
            );
        }
        ret == 0
    }

    /// The tile configuration (palette 1): tmm0 and tmm1 accumulate 16 × `g` f32, tmm2 and
    /// tmm3 hold 16 weight rows × 32 bf16, tmm4 the activations' 16 pairs × `g`.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    impl TileConfig {
        fn for_rows(g: usize) -> TileConfig {
            let mut c = TileConfig { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
            let out_bytes = (g * 4) as u16;
            for (t, bytes) in [(0, out_bytes), (1, out_bytes), (2, 64), (3, 64), (4, out_bytes)] {
                c.colsb[t] = bytes;
                c.rows[t] = 16;
            }
            c
        }
    }

    /// # Safety
    ///
    /// AMX-BF16 is present and permitted; `w` holds `k` rows of `n` ≥ 32 bf16, `y` `k · g`
    /// values; `first + g ≤ x.rows`, g ≤ 16.
    pub unsafe fn gemv(w: &[u16], k: usize, n: usize, x: &Packed, first: usize, g: usize, y: &mut [f32]) {
        let blocks = n / K_STEP;
        let cfg = TileConfig::for_rows(g);
        let w_stride = n * 2;
        let (x_stride, y_stride) = (x.rows * 4, g * 4);
        // One block of B per 32 inputs: 16 pairs of x.rows u32, starting at column `first`.
        let b_at = |blk: usize| x.data[blk * (K_STEP / 2) * x.rows + first..].as_ptr();
        // Two tiles of 16 weight rows (from `a0`, `a1`, rows `n` apart) against the activations,
        // stored as 16 × g outputs at `y0` and at `y1`.
        //
        // SAFETY: (for every call below) the A tiles read 16 rows of 64 bytes at the stride
        // inside `w` or `pad`, the B tile 16 rows of g u32 inside the packed activations, and the
        // stores write 16 × g f32 inside `y` or `pad_out`; the configuration is loaded first.
        let pass = |a0: *const u16, a1: *const u16, y0: *mut f32, y1: *mut f32| unsafe {
            asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
            for blk in 0..blocks {
                asm!(
                    "tileloadd tmm4, [{b} + {bs}*1]",
                    "tileloadd tmm2, [{a0} + {ws}*1]",
                    "tileloadd tmm3, [{a1} + {ws}*1]",
                    "tdpbf16ps tmm0, tmm2, tmm4",
                    "tdpbf16ps tmm1, tmm3, tmm4",
                    b = in(reg) b_at(blk),
                    bs = in(reg) x_stride,
                    a0 = in(reg) a0.add(blk * K_STEP),
                    a1 = in(reg) a1.add(blk * K_STEP),
                    ws = in(reg) w_stride,
                    options(nostack, readonly)
                );
            }
            asm!(
                "tilestored [{y0} + {ys}*1], tmm0",
                "tilestored [{y1} + {ys}*1], tmm1",
                y0 = in(reg) y0,
                y1 = in(reg) y1,
                ys = in(reg) y_stride,
                options(nostack)
            );
        };
        // SAFETY: loads the configuration `pass` runs under; the offsets stay inside `w` and `y`
        // (o + 32 ≤ k), and `pad` / `pad_out` hold two tiles.
        unsafe {
            asm!("ldtilecfg [{0}]", in(reg) &cfg, options(nostack, readonly));
            let mut o = 0;
            while o + 2 * M <= k {
                let (a, y) = (w.as_ptr().add(o * n), y.as_mut_ptr().add(o * g));
                pass(a, a.add(M * n), y, y.add(M * g));
                o += 2 * M;
            }
            if o < k {
                // The last rows copied into two zeroed tiles: every output is computed by the
                // same instructions on the same values wherever it falls.
                let take = k - o;
                let mut pad = vec![0u16; 2 * M * n];
                pad[..take * n].copy_from_slice(&w[o * n..k * n]);
                let mut pad_out = [0f32; 2 * M * 16];
                let (a, p) = (pad.as_ptr(), pad_out.as_mut_ptr());
                pass(a, a.add(M * n), p, p.add(M * g));
                y[o * g..k * g].copy_from_slice(&pad_out[..take * g]);
            }
            asm!("tilerelease", options(nostack, nomem));
        }
    }
}
