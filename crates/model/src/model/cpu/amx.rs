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

use rayon::prelude::*;

use super::gemm_bf16::OutPtr;

/// Activation rows one tile pass serves (a C tile row is 64 bytes: 16 f32).
pub(crate) const MAX_ROWS: usize = 16;
/// Inputs per tile step (a tile row of 64 bytes: 32 bf16).
const K_STEP: usize = 32;
/// Output rows per tile.
const M: usize = 16;

/// Whether this CPU has AMX-BF16 and the kernel lets this process use the tile registers
/// (Linux asks each process to request them once: `arch_prctl(ARCH_REQ_XCOMP_PERM)`).
pub(crate) fn available() -> bool {
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

/// Whether the CPU has AMX-BF16 (CPUID), whether or not the process may use the tiles.
pub(crate) fn cpu_has_amx_bf16() -> bool {
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    {
        x86::has_amx_bf16()
    }
    #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
    {
        false
    }
}

/// Activation rows rounded to bf16 and packed for the B tile: per 32-input block, 16 pairs of
/// `rows` u32 (the even input in the low half, as `tdpbf16ps` reads a pair).
pub(crate) struct Packed {
    rows: usize,
    n: usize,
    data: Vec<u32>,
}

impl Packed {
    /// `bits(r)` is activation row `r` as bf16 bits (at least `n` of them).
    pub(crate) fn new<'a>(rows: usize, n: usize, bits: impl Fn(usize) -> &'a [u16]) -> Packed {
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
pub(crate) fn gemv(w: &[u16], k: usize, x: &Packed, rows: std::ops::Range<usize>, y: &mut [f32]) {
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

/// Token rows per prefill tile pass (two A tiles of 16).
const TOKENS: usize = 2 * M;
/// Output features per prefill panel (two B tiles of 16).
const PANEL: usize = 2 * M;

/// A prefill's activations for [`gemm`]: each row rounded to bf16 and zero-padded to whole
/// 32-input blocks (the A tile loads 16 rows × 32 values straight from here), the row count
/// padded with zero rows to whole tile passes of [`TOKENS`].
pub(crate) struct Tokens {
    rows: usize,
    n: usize,
    stride: usize,
    data: Vec<u16>,
}

impl Tokens {
    /// `x` is `[rows, n]` row-major f32.
    pub(crate) fn new(x: &[f32], rows: usize, n: usize) -> Tokens {
        assert_eq!(x.len(), rows * n);
        let stride = n.div_ceil(K_STEP).max(1) * K_STEP;
        let mut data = vec![0u16; rows.div_ceil(TOKENS) * TOKENS * stride];
        data.par_chunks_mut(stride).zip(x.par_chunks(n.max(1))).for_each(|(d, s)| {
            d.iter_mut().zip(s).for_each(|(d, v)| *d = half::bf16::from_f32(*v).to_bits());
        });
        Tokens { rows, n, stride, data }
    }

    fn row(&self, r: usize) -> &[u16] {
        &self.data[r * self.stride..r * self.stride + self.n]
    }
}

/// The prefill GEMM: `y[t · out + o] = w[o] · x[t]` for every token row `t` and output feature
/// `o < out`, where `row(o)` is weight row `o` (`n` bf16 values as stored). Each output has the
/// bits [`gemv`] gives it (plus the same tail): a prompt's rows equal the decode step's, and no
/// output depends on the tiling, the panel or the thread. Only where [`available`] holds.
///
/// Threads take panels of 32 output features; a panel's weights are packed into the B tile's
/// pair-major layout (`[block][pair][32 features]`, 64 KiB for 1024 inputs: it stays in L2) and
/// swept by passes of 32 tokens, each four C tiles written straight into `y`.
pub(crate) fn gemm<'w, F>(x: &Tokens, out: usize, row: F, y: &mut [f32])
where
    F: Fn(usize) -> &'w [u16] + Sync,
{
    assert!(available(), "the AMX GEMM needs AMX-BF16");
    let (n, rows) = (x.n, x.rows);
    assert_eq!(y.len(), rows * out);
    let blocks = n / K_STEP;
    let from = blocks * K_STEP;
    let y_ptr = OutPtr(y.as_mut_ptr());
    (0..out.div_ceil(PANEL)).into_par_iter().for_each_init(
        || (vec![0u32; blocks * (K_STEP / 2) * PANEL], vec![0f32; TOKENS * PANEL]),
        |(packed, scratch), pi| {
            let n0 = pi * PANEL;
            let width = PANEL.min(out - n0);
            let weights: Vec<&[u16]> = (n0..n0 + width).map(&row).collect();
            pack_panel(&weights, n, packed);
            // Whole passes of a whole panel go straight into `y` under one tile configuration;
            // the rest (the last tokens, a panel past the last feature) through `scratch`.
            let direct = if width == PANEL { rows / TOKENS } else { 0 };
            // SAFETY: `available` held; the A tiles read 32 rows of `x` per pass (padded to
            // whole passes) and whole blocks of each; the B tiles read `packed` (blocks · 16
            // lines of 32 u32); the C tiles go to this panel's columns of the pass's rows of
            // `y` (whole passes of a whole panel: in bounds, and no other task writes them) or
            // to `scratch` (32 × 32).
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            unsafe {
                if direct > 0 {
                    x86::gemm_passes(x.data.as_ptr(), x.stride, direct, packed, blocks, y_ptr.at(n0), out);
                }
                for t0 in (direct * TOKENS..rows).step_by(TOKENS) {
                    let take = TOKENS.min(rows - t0);
                    let a = x.data.as_ptr().add(t0 * x.stride);
                    x86::gemm_passes(a, x.stride, 1, packed, blocks, scratch.as_mut_ptr(), PANEL);
                    for t in 0..take {
                        let dst = std::slice::from_raw_parts_mut(y_ptr.at((t0 + t) * out + n0), width);
                        dst.copy_from_slice(&scratch[t * PANEL..t * PANEL + width]);
                    }
                }
            }
            if from < n {
                for t in 0..rows {
                    for (f, w) in weights.iter().enumerate() {
                        // SAFETY: element (t, n0 + f) of `y`, this panel's own.
                        unsafe { *y_ptr.at(t * out + n0 + f) += super::pair_tail::pairs_tail(w, x.row(t), from) };
                    }
                }
            }
        },
    );
}

/// The panel's whole blocks in the B tile's layout: `packed[(blk · 16 + j) · 32 + f]` is pair
/// `j` of block `blk` of feature `f` (the even input in the low half), zero past the panel's
/// last feature. A transpose of the panel's rows read as u32 pairs, done 16 × 16 at a time in
/// AVX-512 registers (as scalar moves it was a third of the GEMM's time).
fn pack_panel(weights: &[&[u16]], n: usize, packed: &mut [u32]) {
    let blocks = n / K_STEP;
    assert!(weights.len() <= PANEL && packed.len() >= blocks * (K_STEP / 2) * PANEL);
    for w in weights {
        assert_eq!(w.len(), n, "weight row has {} values, expected {n}", w.len());
    }
    #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
    // SAFETY: AMX CPUs have AVX-512F (and `gemm`, the only caller, runs only where `available`
    // holds); the rows hold `n` ≥ blocks · 32 values each and `packed` the lines (asserted).
    unsafe {
        x86::pack_panel(weights, blocks, packed)
    };
}

/// [`pack_panel`] in plain moves: what the transpose is tested against.
#[cfg(test)]
fn pack_panel_scalar(weights: &[&[u16]], n: usize, packed: &mut [u32]) {
    let pairs = n / K_STEP * (K_STEP / 2);
    packed.fill(0);
    for (f, w) in weights.iter().enumerate() {
        for (p, pair) in w.as_chunks::<2>().0[..pairs].iter().enumerate() {
            packed[p * PANEL + f] = u32::from(pair[0]) | (u32::from(pair[1]) << 16);
        }
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod x86 {
    use std::arch::asm;

    use super::{K_STEP, M, Packed};

    /// CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
    pub(super) fn has_amx_bf16() -> bool {
        let leaf = std::arch::x86_64::__cpuid_count(7, 0);
        leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0
    }

    /// `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`: without it the first tile
    /// instruction kills the process (Linux 5.16+; older kernels refuse, and the caller falls
    /// back to `vdpbf16ps`).
    pub(super) fn request_tiles() -> bool {
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
    pub(super) unsafe fn gemv(w: &[u16], k: usize, n: usize, x: &Packed, first: usize, g: usize, y: &mut [f32]) {
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
    /// `passes` prefill passes, each 32 token rows (two A tiles, from `a`, `a_stride` bf16
    /// apart, the next pass 32 rows on) against a packed panel of 32 features (two B tiles)
    /// over `blocks` 32-input blocks, its four C tiles stored at `y` (row stride `y_stride`
    /// f32; the next pass 32 rows on): tokens 0–15 × features 0–15, 0–15 × 16–31, 16–31 ×
    /// 0–15, 16–31 × 16–31.
    ///
    /// # Safety
    ///
    /// AMX-BF16 is present and permitted; `a` holds 32 · `passes` rows of `blocks · 32` bf16 at
    /// the stride, `packed` `blocks · 16 · 32` u32, and `y` 32 · `passes` rows of 32 writable
    /// f32 at its stride.
    pub(super) unsafe fn gemm_passes(
        a: *const u16,
        a_stride: usize,
        passes: usize,
        packed: &[u32],
        blocks: usize,
        y: *mut f32,
        y_stride: usize,
    ) {
        debug_assert!(packed.len() >= blocks * 16 * 32);
        let mut cfg = TileConfig { palette: 1, start_row: 0, reserved: [0; 14], colsb: [0; 16], rows: [0; 16] };
        for t in 0..8 {
            cfg.colsb[t] = 64;
            cfg.rows[t] = 16;
        }
        let (a_bytes, y_bytes) = (a_stride * 2, y_stride * 4);
        let b = packed.as_ptr();
        // SAFETY: the caller's contract; every load and store stays inside the regions it names.
        unsafe {
            asm!("ldtilecfg [{cfg}]", cfg = in(reg) &cfg, options(nostack, readonly));
            for pass in 0..passes {
                let (a, y) = (a.add(pass * 2 * M * a_stride), y.add(pass * 2 * M * y_stride));
                asm!("tilezero tmm0", "tilezero tmm1", "tilezero tmm2", "tilezero tmm3", options(nostack, nomem));
                for blk in 0..blocks {
                    let (a0, b0) = (a.add(blk * K_STEP), b.add(blk * 16 * 32));
                    asm!(
                        "tileloadd tmm4, [{a0} + {as}*1]",
                        "tileloadd tmm6, [{b0} + {bs}*1]",
                        "tileloadd tmm7, [{b1} + {bs}*1]",
                        "tdpbf16ps tmm0, tmm4, tmm6",
                        "tdpbf16ps tmm1, tmm4, tmm7",
                        "tileloadd tmm5, [{a1} + {as}*1]",
                        "tdpbf16ps tmm2, tmm5, tmm6",
                        "tdpbf16ps tmm3, tmm5, tmm7",
                        a0 = in(reg) a0,
                        a1 = in(reg) a0.add(M * a_stride),
                        as = in(reg) a_bytes,
                        b0 = in(reg) b0,
                        b1 = in(reg) b0.add(M),
                        bs = in(reg) 128usize,
                        options(nostack, readonly)
                    );
                }
                asm!(
                    "tilestored [{y0} + {ys}*1], tmm0",
                    "tilestored [{y1} + {ys}*1], tmm1",
                    "tilestored [{y2} + {ys}*1], tmm2",
                    "tilestored [{y3} + {ys}*1], tmm3",
                    y0 = in(reg) y,
                    y1 = in(reg) y.add(M),
                    y2 = in(reg) y.add(M * y_stride),
                    y3 = in(reg) y.add(M * y_stride + M),
                    ys = in(reg) y_bytes,
                    options(nostack)
                );
            }
            asm!("tilerelease", options(nostack, nomem));
        }
    }

    /// [`super::pack_panel`]: per block of 32 inputs, the panel's rows (16 u32 pairs each) are
    /// transposed 16 rows at a time into the block's 16 lines of 32 features.
    ///
    /// # Safety
    ///
    /// AVX-512F; every row holds at least `blocks · 32` values, at most 32 rows, and `packed`
    /// holds `blocks · 16 · 32` values.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn pack_panel(weights: &[&[u16]], blocks: usize, packed: &mut [u32]) {
        use std::arch::x86_64::*;
        let zero = _mm512_setzero_si512();
        let out = packed.as_mut_ptr();
        for blk in 0..blocks {
            for half in 0..2 {
                let mut r = [zero; 16];
                for (i, v) in r.iter_mut().enumerate() {
                    if let Some(w) = weights.get(half * 16 + i) {
                        // SAFETY: 32 values (64 bytes) of block `blk`, inside the row.
                        *v = unsafe { _mm512_loadu_si512(w.as_ptr().add(blk * K_STEP).cast()) };
                    }
                }
                // Within each 128-bit lane L: u[4g + c] holds column 4L + c of rows 4g..4g + 3.
                let mut u = [zero; 16];
                for g in 0..4 {
                    let (r0, r1, r2, r3) = (r[4 * g], r[4 * g + 1], r[4 * g + 2], r[4 * g + 3]);
                    let (t0, t1) = (_mm512_unpacklo_epi32(r0, r1), _mm512_unpackhi_epi32(r0, r1));
                    let (t2, t3) = (_mm512_unpacklo_epi32(r2, r3), _mm512_unpackhi_epi32(r2, r3));
                    u[4 * g] = _mm512_unpacklo_epi64(t0, t2);
                    u[4 * g + 1] = _mm512_unpackhi_epi64(t0, t2);
                    u[4 * g + 2] = _mm512_unpacklo_epi64(t1, t3);
                    u[4 * g + 3] = _mm512_unpackhi_epi64(t1, t3);
                }
                // Column 4L + c is lane L of u[c], u[4 + c], u[8 + c], u[12 + c].
                for c in 0..4 {
                    let v_lo = _mm512_shuffle_i32x4::<0x44>(u[c], u[4 + c]);
                    let v_hi = _mm512_shuffle_i32x4::<0xEE>(u[c], u[4 + c]);
                    let w_lo = _mm512_shuffle_i32x4::<0x44>(u[8 + c], u[12 + c]);
                    let w_hi = _mm512_shuffle_i32x4::<0xEE>(u[8 + c], u[12 + c]);
                    let cols = [
                        (c, _mm512_shuffle_i32x4::<0x88>(v_lo, w_lo)),
                        (4 + c, _mm512_shuffle_i32x4::<0xDD>(v_lo, w_lo)),
                        (8 + c, _mm512_shuffle_i32x4::<0x88>(v_hi, w_hi)),
                        (12 + c, _mm512_shuffle_i32x4::<0xDD>(v_hi, w_hi)),
                    ];
                    for (j, col) in cols {
                        // SAFETY: line blk · 16 + j of 32 u32, its half `half`: inside `packed`.
                        unsafe { _mm512_storeu_si512(out.add((blk * 16 + j) * 32 + half * 16).cast(), col) };
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX-512 transpose packs what the plain moves pack: whole panels, short panels (zero
    /// features past the last), widths with a tail past the last whole block.
    #[test]
    fn the_panel_transpose_packs_the_plain_layout() {
        if !available() {
            // No AMX here: the packing is only used by the AMX GEMM (`gemv::tests` checks a CPU
            // listing amx_bf16 is granted the tiles). Say so rather than pass quietly.
            eprintln!("no AMX tiles on this CPU: the AMX panel packing is not exercised here");
            return;
        }
        let mut s = 0x2545_F491u32;
        for (width, n) in [(32usize, 64usize), (17, 1024), (1, 70), (32, 3584), (31, 33)] {
            let rows: Vec<Vec<u16>> = (0..width)
                .map(|_| {
                    (0..n)
                        .map(|_| {
                            s ^= s << 13;
                            s ^= s >> 17;
                            s ^= s << 5;
                            s as u16
                        })
                        .collect()
                })
                .collect();
            let weights: Vec<&[u16]> = rows.iter().map(|r| r.as_slice()).collect();
            let len = n / K_STEP * (K_STEP / 2) * PANEL;
            let (mut fast, mut plain) = (vec![0xDEAD_BEEFu32; len], vec![0u32; len]);
            pack_panel(&weights, n, &mut fast);
            pack_panel_scalar(&weights, n, &mut plain);
            assert_eq!(fast, plain, "width {width} n {n}");
        }
    }
}
