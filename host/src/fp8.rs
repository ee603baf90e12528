//! 8-bit floating-point element types of the FP8 GEMM (issue 20): [`F8E4M3`] and [`F8E5M2`], the
//! two formats of the OCP 8-bit Floating Point Specification (OFP8, v1.0, 2023) that Hopper's
//! tensor cores read (PTX ISA 8.3 §5.2.5.1 "Alternate floating point data formats"; CUDA's
//! `__nv_fp8_e4m3` / `__nv_fp8_e5m2`).
//!
//! | format | bias | largest finite | smallest normal | smallest subnormal | inf | NaN |
//! | --- | --- | --- | --- | --- | --- | --- |
//! | E4M3 | 7 | 448 (`0x7E`) | 2^-6 | 2^-9 | none | `S.1111.111` (`0x7F`, `0xFF`) |
//! | E5M2 | 15 | 57344 (`0x7B`) | 2^-14 | 2^-16 | `S.11111.00` | `S.11111.{01,10,11}` |
//!
//! Encoding ([`F8E4M3::from_f32`], [`F8E5M2::from_f32`]) rounds to nearest, ties to even, and
//! saturates as CUDA's `__NV_SATFINITE` and PTX `cvt.rn.satfinite.{e4m3x2,e5m2x2}.f32` do (what
//! cuBLASLt uses for FP8 outputs): a finite or infinite magnitude above the largest finite value
//! becomes the largest finite value of its sign, NaN stays NaN (`0x7F`, or `0xFF` with the sign
//! bit). Decoding ([`F8E4M3::to_f32`]) is exact: every FP8 value is an f32.
//!
//! No crate on crates.io was used: the `half` crate has no 8-bit types, and the conversions are
//! short and tested exhaustively (all 256 codes, every rounding boundary) in this module.

use bytemuck::{Pod, Zeroable};

use crate::tensor_map::{TmaDtype, TmaElement};

/// One format's parameters, and the conversions every 8-bit format here shares.
trait Format {
    /// Exponent bits.
    const EXP: u32;
    /// Mantissa bits.
    const MAN: u32;
    /// Exponent bias.
    const BIAS: i32;
    /// Largest finite magnitude.
    const MAX: f32;
    /// The code of NaN with sign bit clear.
    const NAN: u8;
    /// Is `bits` (sign clear) NaN; is it infinity.
    fn special(bits: u8) -> Option<f32>;

    /// Exact decoding (see the module docs).
    fn decode(bits: u8) -> f32 {
        let sign = if bits & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let mag = bits & 0x7F;
        if let Some(v) = Self::special(mag) {
            return if v.is_nan() { f32::NAN } else { sign * v };
        }
        let e = (mag >> Self::MAN) as i32;
        let m = (mag & ((1 << Self::MAN) - 1)) as f32;
        let scale = (1u32 << Self::MAN) as f32;
        let v = if e == 0 {
            m / scale * pow2(1 - Self::BIAS)
        } else {
            (1.0 + m / scale) * pow2(e - Self::BIAS)
        };
        sign * v
    }

    /// Round to nearest even, saturating (see the module docs).
    fn encode(v: f32) -> u8 {
        let sign = if v.is_sign_negative() { 0x80u8 } else { 0 };
        if v.is_nan() {
            return sign | Self::NAN;
        }
        let a = v.abs().min(Self::MAX); // satfinite: inf and overflow become MAX
        let min_normal_exp = 1 - Self::BIAS;
        // The quantum (ulp) at `a`: 2^(e - MAN) for a normal `a` with exponent `e`, the
        // subnormal step below the smallest normal. Dividing and multiplying by a power of two
        // are exact in f32 for these ranges, so only `round_ties_even` rounds.
        let e = if a == 0.0 {
            min_normal_exp
        } else {
            exponent(a).max(min_normal_exp)
        };
        let quantum = pow2(e - Self::MAN as i32);
        let q = (a / quantum).round_ties_even() * quantum;
        if q == 0.0 {
            return sign;
        }
        // `q` is representable (a multiple of its quantum; rounding up to 2^(e+1) is too); a
        // value <= MAX rounds to at most MAX, as MAX is a multiple of its quantum.
        let qe = exponent(q);
        let code = if qe < min_normal_exp {
            (q / pow2(min_normal_exp - Self::MAN as i32)) as u8
        } else {
            let field = (qe + Self::BIAS) as u8;
            let man = ((q / pow2(qe) - 1.0) * (1u32 << Self::MAN) as f32) as u8;
            (field << Self::MAN) | man
        };
        sign | code
    }
}

/// 2^e for the exponents used here (-30..30), exact.
fn pow2(e: i32) -> f32 {
    f32::from_bits(((e + 127) as u32) << 23)
}

/// The unbiased exponent of a positive normal f32 (floor(log2 a)); subnormal f32 inputs (below
/// 2^-126, far below every FP8 subnormal) report -127, which the callers clamp.
fn exponent(a: f32) -> i32 {
    ((a.to_bits() >> 23) & 0xFF) as i32 - 127
}

struct E4m3;
struct E5m2;

impl Format for E4m3 {
    const EXP: u32 = 4;
    const MAN: u32 = 3;
    const BIAS: i32 = 7;
    const MAX: f32 = 448.0;
    const NAN: u8 = 0x7F;
    fn special(bits: u8) -> Option<f32> {
        (bits == 0x7F).then_some(f32::NAN)
    }
}

impl Format for E5m2 {
    const EXP: u32 = 5;
    const MAN: u32 = 2;
    const BIAS: i32 = 15;
    const MAX: f32 = 57344.0;
    const NAN: u8 = 0x7F;
    fn special(bits: u8) -> Option<f32> {
        match bits {
            0x7C => Some(f32::INFINITY),
            0x7D..=0x7F => Some(f32::NAN),
            _ => None,
        }
    }
}

const _: () = {
    assert!(E4m3::EXP + E4m3::MAN == 7 && E5m2::EXP + E5m2::MAN == 7);
};

macro_rules! fp8_type {
    ($(#[$doc:meta])* $name:ident, $fmt:ty, $label:literal) => {
        $(#[$doc])*
        #[repr(transparent)]
        #[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
        pub struct $name(pub u8);

        impl $name {
            /// The format's name, as cuBLASLt and PTX spell it.
            pub const NAME: &'static str = $label;
            /// The largest finite value.
            pub const MAX: f32 = <$fmt>::MAX;
            /// The code with these bits.
            pub const fn from_bits(bits: u8) -> Self {
                Self(bits)
            }
            /// The bits.
            pub const fn to_bits(self) -> u8 {
                self.0
            }
            /// `v` rounded to nearest (ties to even), saturated to `±MAX` (NaN stays NaN): the
            /// conversion of `cvt.rn.satfinite` (see the module docs).
            pub fn from_f32(v: f32) -> Self {
                Self(<$fmt>::encode(v))
            }
            /// The value, exactly.
            pub fn to_f32(self) -> f32 {
                <$fmt>::decode(self.0)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({:#04x} = {})", $label, self.0, self.to_f32())
            }
        }

        impl From<$name> for f32 {
            fn from(v: $name) -> f32 {
                v.to_f32()
            }
        }

        impl TmaElement for $name {
            const DTYPE: TmaDtype = TmaDtype::U8;
        }
    };
}

fp8_type!(
    /// OCP FP8 E4M3 (`__nv_fp8_e4m3`, PTX `.e4m3`): 1 sign, 4 exponent (bias 7), 3 mantissa
    /// bits; finite range ±448, no infinity, NaN `0x7F`/`0xFF`.
    F8E4M3,
    E4m3,
    "e4m3"
);
fp8_type!(
    /// OCP FP8 E5M2 (`__nv_fp8_e5m2`, PTX `.e5m2`): 1 sign, 5 exponent (bias 15), 2 mantissa
    /// bits; finite range ±57344, infinities `0x7C`/`0xFC`, NaN `0x7D..=0x7F` and `0xFD..=0xFF`.
    F8E5M2,
    E5m2,
    "e5m2"
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Every non-NaN code decodes to a value that encodes back to the same code (−0 included);
    /// NaN codes decode to NaN and re-encode to the canonical NaN of their sign.
    #[test]
    fn all_256_codes_round_trip() {
        for b in 0..=255u8 {
            let (v4, v5) = (F8E4M3(b).to_f32(), F8E5M2(b).to_f32());
            if v4.is_nan() {
                assert!(b & 0x7F == 0x7F, "e4m3 {b:#x}");
                assert_eq!(F8E4M3::from_f32(v4).0 & 0x7F, 0x7F);
            } else {
                assert_eq!(F8E4M3::from_f32(v4).0, b, "e4m3 {b:#x} = {v4}");
            }
            if v5.is_nan() {
                assert!((0x7D..=0x7F).contains(&(b & 0x7F)), "e5m2 {b:#x}");
                assert_eq!(F8E5M2::from_f32(v5).0 & 0x7F, 0x7F);
            } else if v5.is_infinite() {
                assert_eq!(b & 0x7F, 0x7C);
                // satfinite: infinity saturates to the largest finite value.
                assert_eq!(F8E5M2::from_f32(v5).to_f32(), v5.signum() * F8E5M2::MAX);
            } else {
                assert_eq!(F8E5M2::from_f32(v5).0, b, "e5m2 {b:#x} = {v5}");
            }
        }
    }

    #[test]
    fn known_values() {
        assert_eq!(F8E4M3(0x7E).to_f32(), 448.0);
        assert_eq!(F8E4M3(0x08).to_f32(), 2f32.powi(-6));
        assert_eq!(F8E4M3(0x01).to_f32(), 2f32.powi(-9));
        assert_eq!(F8E4M3(0x38).to_f32(), 1.0);
        assert_eq!(F8E4M3(0xB8).to_f32(), -1.0);
        assert_eq!(F8E5M2(0x7B).to_f32(), 57344.0);
        assert_eq!(F8E5M2(0x3C).to_f32(), 1.0);
        assert_eq!(F8E5M2(0x01).to_f32(), 2f32.powi(-16));
        assert_eq!(F8E5M2(0x7C).to_f32(), f32::INFINITY);
        assert_eq!(F8E5M2(0xFC).to_f32(), f32::NEG_INFINITY);
        assert_eq!(F8E4M3(0x80).to_f32().to_bits(), (-0.0f32).to_bits());
        assert_eq!(F8E4M3::from_f32(-0.0).0, 0x80);
    }

    /// Sorted finite non-negative values of a format, with their codes.
    fn ladder(decode: fn(u8) -> f32) -> Vec<(f32, u8)> {
        let mut v: Vec<(f32, u8)> = (0..0x80u8)
            .map(|b| (decode(b), b))
            .filter(|(x, _)| x.is_finite())
            .collect();
        v.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
        v
    }

    /// Between every two neighbouring values: below the midpoint rounds down, above rounds up,
    /// at the midpoint to the even code (mantissa LSB 0); both signs; f64 midpoints are exact
    /// in f32 here (one more bit than the format).
    fn check_rounding(decode: fn(u8) -> f32, encode: fn(f32) -> u8) {
        let l = ladder(decode);
        for w in l.windows(2) {
            let ((lo, lc), (hi, hc)) = (w[0], w[1]);
            let mid = (lo + hi) / 2.0;
            assert_eq!(
                (mid as f64),
                (lo as f64 + hi as f64) / 2.0,
                "midpoint exact"
            );
            let even = if lc & 1 == 0 { lc } else { hc };
            for (sign, sbit) in [(1.0f32, 0u8), (-1.0, 0x80)] {
                assert_eq!(encode(sign * mid), sbit | even, "tie {lo}..{hi}");
                let below = f32::from_bits(mid.to_bits() - 1);
                let above = f32::from_bits(mid.to_bits() + 1);
                assert_eq!(encode(sign * below), sbit | lc, "below mid {lo}..{hi}");
                assert_eq!(encode(sign * above), sbit | hc, "above mid {lo}..{hi}");
                assert_eq!(encode(sign * lo), sbit | lc);
            }
        }
    }

    #[test]
    fn encode_rounds_to_nearest_even_at_every_boundary() {
        check_rounding(|b| F8E4M3(b).to_f32(), |v| F8E4M3::from_f32(v).0);
        check_rounding(|b| F8E5M2(b).to_f32(), |v| F8E5M2::from_f32(v).0);
    }

    #[test]
    fn encode_saturates_like_satfinite_and_keeps_nan() {
        for v in [449.0f32, 464.0, 480.0, 1e6, f32::INFINITY, f32::MAX] {
            assert_eq!(F8E4M3::from_f32(v).0, 0x7E, "{v}");
            assert_eq!(F8E4M3::from_f32(-v).0, 0xFE, "-{v}");
        }
        for v in [57345.0f32, 61440.0, 1e9, f32::INFINITY] {
            assert_eq!(F8E5M2::from_f32(v).0, 0x7B, "{v}");
            assert_eq!(F8E5M2::from_f32(-v).0, 0xFB, "-{v}");
        }
        assert!(F8E4M3::from_f32(f32::NAN).to_f32().is_nan());
        assert!(F8E5M2::from_f32(-f32::NAN).to_f32().is_nan());
        // Underflow: half the smallest subnormal is a tie and rounds to (signed) zero; just
        // above it rounds to the smallest subnormal.
        let tiny4 = 2f32.powi(-10);
        assert_eq!(F8E4M3::from_f32(tiny4).0, 0x00);
        assert_eq!(F8E4M3::from_f32(-tiny4).0, 0x80);
        assert_eq!(F8E4M3::from_f32(tiny4 * 1.001).0, 0x01);
        assert_eq!(F8E4M3::from_f32(1e-30).0, 0x00);
        assert_eq!(F8E4M3::from_f32(f32::from_bits(1)).0, 0x00);
    }

    #[test]
    fn encode_is_monotonic_over_many_f32s() {
        let mut prev = f32::NEG_INFINITY;
        let mut x = -600.0f32;
        while x < 600.0 {
            let v = F8E4M3::from_f32(x).to_f32();
            assert!(v >= prev, "{x}: {v} < {prev}");
            assert!((v - x.clamp(-448.0, 448.0)).abs() <= x.abs().max(2f32.powi(-6)) / 16.0 + 1e-9);
            prev = v;
            x += 0.0137;
        }
    }
}
