//! The model's elementwise functions — `exp` (and so sigmoid and SiLU) and rounding to bf16 —
//! written in plain IEEE operations and selects, without branches or library calls, so that a
//! loop over them compiles to vector instructions (the row kernels below, through
//! `simd_dispatch!`) and gives the same bits as the scalar code on every CPU.
//!
//! Why: libm's `expf` is a call per value. A 512-token prefill of the 0.8B shape evaluates about
//! 120 million of them (SiLU in the MLP, the GDN convolution and its gated norm), a sixth of
//! the prefill once the GEMMs ran on AMX tiles.

use super::precision::Precision;
pub(crate) use super::precision::round_bf16;
use super::simd::simd_dispatch;

/// Below this `exp` is zero: its true value would be subnormal (under 1.2e-38).
const EXP_MIN: f32 = -87.336_55;
/// Above this the exponent would pass 127; `exp` saturates at e^88.376 ≈ 2.4e38 up to
/// [`EXP_OVERFLOW`].
const EXP_MAX: f32 = 88.376_26;
/// Above this e^x is past f32's range: infinity.
const EXP_OVERFLOW: f32 = 88.722_84;

/// e^x within 2 ulp (Cephes' `expf`: x = n·ln2 + r with |r| ≤ ln2/2, a degree-6 polynomial in
/// r, times 2ⁿ built from its bits). Subnormal results are zero (they are below anything the
/// model adds them to); NaN stays NaN.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // `clamp` keeps a NaN.
    let xc = x.clamp(EXP_MIN, EXP_MAX);
    // n = round(x·log2 e), ties to even: adding 1.5·2²³ leaves the integer in the low mantissa
    // bits (no rounding call: baseline x86-64 has no rounding instruction).
    const SHIFT: f32 = 12_582_912.0;
    let t = xc * std::f32::consts::LOG2_E + SHIFT;
    let n = t - SHIFT;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let p = (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r + 1.666_666_5e-1)
        * r
        + 0.5)
        * (r * r)
        + r
        + 1.0;
    // 2ⁿ: t + 127 holds n + 127 (1 to 254 here) in its low bits, and shifting those into the
    // exponent field drops the rest (a float-to-int conversion does not vectorise). A NaN
    // gives 0 and stays NaN through p.
    let y = p * f32::from_bits((t + 127.0).to_bits() << 23);
    if x < EXP_MIN {
        0.0
    } else if x > EXP_OVERFLOW {
        f32::INFINITY
    } else {
        y
    }
}

#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x * sigmoid(x)
}

simd_dispatch! {
    /// `x = round(silu(round(x)))` over a row (the GDN convolution's output: PyTorch rounds the
    /// convolution, then the SiLU).
    pub(crate) fn silu_rounded(x: &mut [f32], prec: Precision) => silu_rounded_body
}

#[inline(always)]
fn silu_rounded_body(x: &mut [f32], prec: Precision) {
    match prec {
        Precision::F32 => x.iter_mut().for_each(|v| *v = silu(*v)),
        Precision::Bf16 => x.iter_mut().for_each(|v| *v = round_bf16(silu(round_bf16(*v)))),
    }
}

simd_dispatch! {
    /// `out = round(round(silu(g)) · u)` over a row (the MLP's gate times its up projection).
    pub(crate) fn silu_times(out: &mut [f32], g: &[f32], u: &[f32], prec: Precision) => silu_times_body
}

#[inline(always)]
fn silu_times_body(out: &mut [f32], g: &[f32], u: &[f32], prec: Precision) {
    let it = out.iter_mut().zip(g.iter().zip(u));
    match prec {
        Precision::F32 => it.for_each(|(o, (g, u))| *o = silu(*g) * u),
        Precision::Bf16 => it.for_each(|(o, (g, u))| *o = round_bf16(round_bf16(silu(*g)) * u)),
    }
}

simd_dispatch! {
    /// `x = round(round(w · round(x · inv)) · silu(z))` over a head's row (the GDN output's
    /// gated RMS norm, after its mean square gave `inv`).
    pub(crate) fn gated_norm(x: &mut [f32], w: &[f32], inv: f32, z: &[f32], prec: Precision) => gated_norm_body
}

#[inline(always)]
fn gated_norm_body(x: &mut [f32], w: &[f32], inv: f32, z: &[f32], prec: Precision) {
    let it = x.iter_mut().zip(w.iter().zip(z));
    match prec {
        Precision::F32 => it.for_each(|(x, (w, z))| *x = w * (*x * inv) * silu(*z)),
        Precision::Bf16 => it.for_each(|(x, (w, z))| {
            *x = round_bf16(round_bf16(w * round_bf16(*x * inv)) * silu(*z));
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within 2 ulp of the exact value over the whole normal range, 0 where the result would
    /// be subnormal, infinity past f32's range, NaN for NaN.
    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0f64;
        let n = 2_000_000;
        for i in 0..=n {
            let x = EXP_MIN + (EXP_MAX - EXP_MIN) * (i as f32 / n as f32);
            let want = f64::from(x).exp();
            let got = f64::from(exp(x));
            let ulp = (want as f32).abs() * f32::EPSILON;
            worst = worst.max((got - want).abs() / f64::from(ulp));
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        for x in [0.0f32, -0.0, 1.0, -1.0, 1e-8, -1e-8, 10.0, -10.0] {
            let (got, want) = (f64::from(exp(x)), f64::from(x).exp());
            assert!((got - want).abs() <= want * 2.0 * f64::from(f32::EPSILON), "exp({x}) = {got}, want {want}");
        }
        assert_eq!(exp(-88.0), 0.0);
        assert_eq!(exp(-1e30), 0.0);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp(88.8), f32::INFINITY);
        assert_eq!(exp(f32::INFINITY), f32::INFINITY);
        assert!(exp(f32::NAN).is_nan());
        assert!(exp(88.5).is_finite() && exp(88.5) > 2e38);
        assert_eq!(sigmoid(-100.0), 0.0);
        assert_eq!(sigmoid(100.0), 1.0);
        assert!(silu(f32::NAN).is_nan());
    }

    /// The bits `half` gives, on edge cases and a few million values spread over all exponents.
    #[test]
    fn round_bf16_has_the_bits_of_half() {
        let check = |b: u32| {
            let x = f32::from_bits(b);
            let want = half::bf16::from_f32(x).to_f32().to_bits();
            assert_eq!(round_bf16(x).to_bits(), want, "{b:#010x}");
        };
        for b in [0u32, 0x8000_0000, 0x7f80_0000, 0xff80_0000, 0x7f7f_ffff, 0xff7f_ffff, 0x7f7f_8000, 0x7fc0_0000] {
            check(b);
        }
        for b in [0x7f80_0001u32, 0xff80_0001, 0x7fff_ffff, 0x0000_8000, 0x0001_8000, 0x3f80_8000, 0x3f81_8000] {
            check(b);
        }
        let mut s = 0x9E37_79B9u32;
        for _ in 0..4_000_000 {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            check(s);
            check(s & 0xffff_8000);
        }
    }

    /// The row kernels give the scalar functions' bits on every instruction set the CPU has.
    #[test]
    fn row_kernels_give_the_scalar_bits() {
        let g: Vec<f32> = (0..1037).map(|i| ((i * 37 % 1000) as f32 - 500.0) * 0.031).collect();
        let u: Vec<f32> = (0..1037).map(|i| ((i * 11) as f32 * 0.13).sin()).collect();
        for prec in [Precision::F32, Precision::Bf16] {
            let mut a = g.clone();
            silu_rounded(&mut a, prec);
            let mut b = vec![0f32; g.len()];
            silu_times(&mut b, &g, &u, prec);
            let mut c = u.clone();
            gated_norm(&mut c, &g, 0.7, &u, prec);
            for i in 0..g.len() {
                let r = |v: f32| prec.round(v);
                assert_eq!(a[i].to_bits(), r(silu(r(g[i]))).to_bits(), "silu_rounded {prec:?} {i}");
                assert_eq!(b[i].to_bits(), r(r(silu(g[i])) * u[i]).to_bits(), "silu_times {prec:?} {i}");
                let want = r(r(g[i] * r(u[i] * 0.7)) * silu(u[i]));
                assert_eq!(c[i].to_bits(), want.to_bits(), "gated_norm {prec:?} {i}");
            }
        }
    }
}
