//! Float math `core` lacks without `std`: the SFU exponential (`ex2.approx`) and a fused
//! multiply-add.

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
