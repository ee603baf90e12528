//! CPU references in f64 and the comparison used by the CLI and the tests.

use crate::error::{Error, Result};

/// `a + b` element-wise, in f64.
pub fn vector_add(a: &[f32], b: &[f32]) -> Vec<f64> {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| x as f64 + y as f64)
        .collect()
}

/// Relative error bound of an f32 add against its f64 reference: the f32 sum is the exact sum
/// rounded once, so the error is at most 2^-24 of the result (2^-23 leaves room for nothing else).
pub const VECTOR_ADD_REL_BOUND: f64 = 1.0 / (1u64 << 23) as f64;

/// Largest per-element relative error `|got - want| / |want|` (an exact match counts 0, also for
/// `want == 0`; NaN or a nonzero result where `want == 0` counts as infinite), and its index.
pub fn max_rel_error(got: &[f32], want: &[f64]) -> (f64, usize) {
    let mut worst = (0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        let e = if g == w {
            0.0
        } else if w == 0.0 || g.is_nan() {
            f64::INFINITY
        } else {
            (g - w).abs() / w.abs()
        };
        if e > worst.0 || e.is_nan() {
            worst = (e, i);
        }
    }
    worst
}

/// Checks `got` against `want` element-wise with relative bound `bound`.
/// Errors: [`Error::Verification`] naming the worst element.
pub fn verify(what: &str, got: &[f32], want: &[f64], bound: f64) -> Result<f64> {
    if got.len() != want.len() {
        return Err(Error::Verification {
            detail: format!(
                "{what}: {} results for {} references",
                got.len(),
                want.len()
            ),
        });
    }
    let (err, i) = max_rel_error(got, want);
    if err.is_nan() || err > bound {
        return Err(Error::Verification {
            detail: format!("{what}: element {i} is {} but the f64 reference is {} (relative error {err:e} > bound {bound:e})", got[i], want[i]),
        });
    }
    Ok(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_catches_nan_and_small_errors() {
        let want = vec![1.0, -2.0, 0.0];
        assert!(verify("ok", &[1.0, -2.0, 0.0], &want, 1e-7).is_ok());
        assert!(verify("nan", &[1.0, f32::NAN, 0.0], &want, 1e-7).is_err());
        assert!(verify("off", &[1.0 + 1e-5, -2.0, 0.0], &want, 1e-7).is_err());
        assert!(verify("zero", &[1.0, -2.0, 1e-30], &want, 1e-7).is_err());
        assert!(verify("len", &[1.0], &want, 1e-7).is_err());
    }

    #[test]
    fn f32_add_stays_within_its_bound() {
        let a: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.11).cos()).collect();
        let got: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
        verify(
            "cpu f32 add",
            &got,
            &vector_add(&a, &b),
            VECTOR_ADD_REL_BOUND,
        )
        .unwrap();
    }
}
