//! Float math `core` lacks without `std`: square roots, the SFU's approximate transcendentals
//! (`ex2`, `lg2`, `sin`, `cos`, `tanh`, `rsqrt`, PTX ISA 8.3 §9.7.3, floating-point
//! instructions), a fused multiply-add and BF16/FP16 conversions. The `_approx` functions are one
//! SFU instruction each (plus a multiply where said); their error bounds are the PTX ISA's.

use core::arch::asm;

/// `ex2.approx.ftz.f32` (PTX ISA 8.0, floating-point instructions: `ex2`): 2^x, maximum relative error 2^-22 (about 2
/// ulp) over the full range; subnormal inputs and results flush to zero.
#[inline(always)]
pub fn exp2_approx(x: f32) -> f32 {
    let r: f32;
    // SAFETY: an arithmetic instruction on registers.
    unsafe {
        asm!("ex2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
            options(pure, nomem, nostack))
    };
    r
}

/// e^x as `exp2_approx(x * log2(e))`: the relative error is that of [`exp2_approx`] plus
/// `|x| * log2(e) * 2^-24 * ln 2` from rounding the product (about 1e-6 at |x| = 16).
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    exp2_approx(x * core::f32::consts::LOG2_E)
}

/// `fma.rn.f32` (PTX ISA 8.0, floating-point instructions: `fma`): `a * b + c` with one rounding
/// (round to nearest even). `core` has no `f32::mul_add` without `std`, and rustc never contracts
/// `a * b + c` into an fma by itself.
#[inline(always)]
pub fn fma(a: f32, b: f32, c: f32) -> f32 {
    let r: f32;
    // SAFETY: an arithmetic instruction on registers.
    unsafe {
        asm!("fma.rn.f32 {r}, {a}, {b}, {c};", r = out(reg32) r, a = in(reg32) a, b = in(reg32) b,
            c = in(reg32) c, options(pure, nomem, nostack))
    };
    r
}

/// `cvt.rn.bf16x2.f32`: `lo` and `hi` rounded to BF16 (nearest even), packed as `lo | hi << 16`
/// (PTX ISA §9.7.9.21, `cvt` with `.bf16x2`: the first source goes to the upper half).
#[inline(always)]
pub fn pack_bf16x2(lo: f32, hi: f32) -> u32 {
    let d: u32;
    // SAFETY: register-only conversion.
    unsafe {
        core::arch::asm!("cvt.rn.bf16x2.f32 {d}, {h}, {l};", d = out(reg32) d, h = in(reg32) hi,
            l = in(reg32) lo, options(pure, nomem, nostack))
    };
    d
}

/// `cvt.rn.f16x2.f32`: `lo` and `hi` rounded to FP16 (nearest even), packed as `lo | hi << 16`.
#[inline(always)]
pub fn pack_f16x2(lo: f32, hi: f32) -> u32 {
    let d: u32;
    // SAFETY: register-only conversion.
    unsafe {
        core::arch::asm!("cvt.rn.f16x2.f32 {d}, {h}, {l};", d = out(reg32) d, h = in(reg32) hi,
            l = in(reg32) lo, options(pure, nomem, nostack))
    };
    d
}

/// The BF16 value with bits `bits`, widened to f32 (exact).
#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `cvt.f32.f16`: the FP16 value with bits `bits`, widened to f32 (exact).
#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    let d: f32;
    // SAFETY: register-only conversion.
    unsafe {
        core::arch::asm!("cvt.f32.f16 {d}, {h};", d = out(reg32) d, h = in(reg16) bits,
            options(pure, nomem, nostack))
    };
    d
}

/// `sqrt.rn.f32` (PTX ISA 8.3 §9.7.3.15 `sqrt`): the correctly rounded square root (IEEE 754,
/// round to nearest even; subnormals kept); NaN for negative inputs, `-0.0` for `-0.0`.
#[inline(always)]
pub fn sqrt(x: f32) -> f32 {
    let r: f32;
    // SAFETY: an arithmetic instruction on registers.
    unsafe {
        asm!("sqrt.rn.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
            options(pure, nomem, nostack))
    };
    r
}

/// `sqrt.approx.ftz.f32` (PTX ISA 8.3 §9.7.3.15): the SFU's approximate square root (the ISA
/// gives its error bound; `tests/issue22_device.rs` checks relative error <= 2^-21 on the H100);
/// subnormal inputs and results flush to zero.
#[inline(always)]
pub fn sqrt_approx(x: f32) -> f32 {
    let r: f32;
    // SAFETY: an arithmetic instruction on registers.
    unsafe {
        asm!("sqrt.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
            options(pure, nomem, nostack))
    };
    r
}

/// `rsqrt.approx.ftz.f32` (PTX ISA 8.3 §9.7.3.16 `rsqrt`): 1 / sqrt(x) (the ISA gives the bound,
/// about 2^-23 relative; the GPU test checks <= 2^-21); `+inf` for `0.0`, NaN for negative
/// inputs; subnormals flush to zero. (LayerNorm's `1 / sqrt(var + eps)`.)
#[inline(always)]
pub fn rsqrt_approx(x: f32) -> f32 {
    let r: f32;
    // SAFETY: an arithmetic instruction on registers.
    unsafe {
        asm!("rsqrt.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
            options(pure, nomem, nostack))
    };
    r
}

/// `tanh.approx.f32` (PTX ISA 8.3 §9.7.3.22 `tanh`, sm_75+): hyperbolic tangent, relative error
/// about 2^-11 over the full range (the ISA's bound; a BF16-grade result: the GPU test checks
/// <= 2^-10); subnormal results flush to zero. (GELU's tanh form.)
#[inline(always)]
pub fn tanh_approx(x: f32) -> f32 {
    let r: f32;
    // SAFETY: an arithmetic instruction on registers.
    unsafe {
        asm!("tanh.approx.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
            options(pure, nomem, nostack))
    };
    r
}

/// `lg2.approx.ftz.f32` (PTX ISA 8.3 §9.7.3.20 `lg2`): log2(x) with an absolute error bound (the
/// ISA's, about 2^-22; the GPU test checks <= 2^-20); `-inf` for `0.0`, NaN for negative inputs;
/// subnormal inputs flush to zero.
#[inline(always)]
pub fn log2_approx(x: f32) -> f32 {
    let r: f32;
    // SAFETY: an arithmetic instruction on registers.
    unsafe {
        asm!("lg2.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
            options(pure, nomem, nostack))
    };
    r
}

/// ln(x) as `log2_approx(x) * ln(2)`: the absolute error of [`log2_approx`] times ln 2 plus one
/// rounding of the product (relative 2^-24).
#[inline(always)]
pub fn ln_approx(x: f32) -> f32 {
    log2_approx(x) * core::f32::consts::LN_2
}

/// `sin.approx.ftz.f32` (PTX ISA 8.3 §9.7.3.18 `sin`): sine of `x` radians, absolute error about
/// 2^-21 in -pi..pi (the ISA's bound; the GPU test checks <= 2^-19; larger outside, where the
/// SFU's argument reduction loses precision: reduce large arguments yourself); subnormals flush
/// to zero.
#[inline(always)]
pub fn sin_approx(x: f32) -> f32 {
    let r: f32;
    // SAFETY: an arithmetic instruction on registers.
    unsafe {
        asm!("sin.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
            options(pure, nomem, nostack))
    };
    r
}

/// `cos.approx.ftz.f32` (PTX ISA 8.3 §9.7.3.19 `cos`): cosine of `x` radians, with the error of
/// [`sin_approx`] in -pi..pi.
#[inline(always)]
pub fn cos_approx(x: f32) -> f32 {
    let r: f32;
    // SAFETY: an arithmetic instruction on registers.
    unsafe {
        asm!("cos.approx.ftz.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
            options(pure, nomem, nostack))
    };
    r
}
