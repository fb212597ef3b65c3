//! The e4m3fn number format and FP8's block edge: each code's value, the NaN codes, and
//! rounding to the nearest code. A leaf below the FP8 weights (fp8.rs) and the CPU kernels that
//! widen them (cpu/dequant.rs), so neither has to import the other for it.

/// The block edge every FP8 checkpoint deltascope loads uses (`weight_block_size: [128, 128]`;
/// config.json's other sizes are refused by the config check).
pub const BLOCK: usize = 128;

/// The largest finite e4m3fn value (code 0x7E); 0x7F and 0xFF are NaN, and there is no infinity.
pub(crate) const E4M3_MAX: f32 = 448.0;

/// The value of an e4m3fn byte (`S EEEE MMM`, bias 7; subnormal when `E = 0`; NaN for 0x7F and
/// 0xFF).
pub(crate) const fn e4m3_to_f32(b: u8) -> f32 {
    let sign = ((b >> 7) as u32) << 31;
    let (e, m) = (((b >> 3) & 0xF) as u32, (b & 7) as u32);
    let bits = if e == 0xF && m == 7 {
        0x7FC0_0000
    } else if e == 0 && m == 0 {
        0
    } else if e == 0 {
        // m · 2⁻⁹: the leading bit of m becomes the implicit one.
        let p = 31 - m.leading_zeros();
        ((p + 127 - 9) << 23) | ((m - (1 << p)) << (23 - p))
    } else {
        ((e + 120) << 23) | (m << 20)
    };
    f32::from_bits(sign | bits)
}

/// Every byte's value, for the portable kernels and the widening of a panel for the GEMM.
pub(crate) static E4M3: [f32; 256] = {
    let mut t = [0f32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = e4m3_to_f32(i as u8);
        i += 1;
    }
    t
};

/// Whether a byte is one of e4m3fn's two NaN codes.
pub(crate) fn is_nan_code(b: u8) -> bool {
    b & 0x7F == 0x7F
}

/// The e4m3fn code nearest to `x`, ties to the even code, saturating at ±448 (what
/// `torch.Tensor.to(torch.float8_e4m3fn)` gives for the values a block scale brings into
/// range). `x` must not be NaN.
pub(crate) fn f32_to_e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    if a >= E4M3_MAX {
        return sign | 0x7E;
    }
    // The largest positive code whose value is at most `a` (values rise with the code).
    let below = E4M3[..0x7F].partition_point(|&v| v <= a) - 1;
    let (lo, hi) = (E4M3[below], E4M3[below + 1]);
    let code = match (a - lo).partial_cmp(&(hi - a)) {
        Some(std::cmp::Ordering::Less) => below,
        Some(std::cmp::Ordering::Greater) => below + 1,
        // A tie: the even code (its mantissa's last bit is the code's).
        _ if below % 2 == 0 => below,
        _ => below + 1,
    };
    sign | code as u8
}
