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

/// Tile edge of the batched GEMM (`C_t = A_t x B_t`, 128x128 row-major f32 tiles).
pub const GEMM_TILE: usize = 128;

/// Relative error bound per tile of the f32 GEMM kernels against [`gemm_tiles_f64`], as a
/// Frobenius-norm ratio `||C - C_ref||_F / ||C_ref||_F`: 128-term f32 FMA chains stay far below it
/// (about 1e-7 on uniform inputs).
pub const GEMM_REL_BOUND: f64 = 1e-5;

/// `C_t = A_t x B_t` in f64 for each of `tiles` 128x128 row-major tiles laid back to back.
///
/// Errors: [`Error::LengthMismatch`] unless `a` and `b` hold exactly `tiles x 128 x 128`
/// elements (checked arithmetic: a `tiles` whose element count overflows is refused the same
/// way).
pub fn gemm_tiles_f64(a: &[f32], b: &[f32], tiles: usize) -> Result<Vec<f64>> {
    const N: usize = GEMM_TILE;
    let want = tiles.checked_mul(N * N);
    if want != Some(a.len()) || want != Some(b.len()) {
        return Err(Error::LengthMismatch {
            what: "gemm_tiles_f64 inputs",
            detail: format!(
                "a has {} elements, b {}; {tiles} tiles of 128 x 128 need {} each",
                a.len(),
                b.len(),
                want.map_or("more than 2^64".to_string(), |w| w.to_string())
            ),
        });
    }
    let mut c = vec![0f64; tiles * N * N];
    for t in 0..tiles {
        let (at, bt) = (&a[t * N * N..][..N * N], &b[t * N * N..][..N * N]);
        let ct = &mut c[t * N * N..][..N * N];
        for i in 0..N {
            let row = &mut ct[i * N..][..N];
            for k in 0..N {
                let x = at[i * N + k] as f64;
                for (r, &y) in row.iter_mut().zip(&bt[k * N..][..N]) {
                    *r += x * y as f64;
                }
            }
        }
    }
    Ok(c)
}

/// Per-tile relative error `||got_t - want_t||_F / ||want_t||_F` (NaN anywhere in a tile gives
/// NaN; a zero reference tile counts 0 if `got_t` is zero too, else infinite).
pub fn gemm_tile_rel_errors(got: &[f32], want: &[f64]) -> Vec<f64> {
    const E: usize = GEMM_TILE * GEMM_TILE;
    got.chunks(E)
        .zip(want.chunks(E))
        .map(|(g, w)| {
            let (mut num, mut den) = (0f64, 0f64);
            for (&g, &w) in g.iter().zip(w) {
                let d = g as f64 - w;
                num += d * d;
                den += w * w;
            }
            if num.is_nan() {
                f64::NAN
            } else if den == 0.0 {
                if num == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (num / den).sqrt()
            }
        })
        .collect()
}

/// Checks every tile of `got` against `want` with [`gemm_tile_rel_errors`] and `bound`; returns
/// the worst tile error. Errors: [`Error::Verification`] naming the worst tile (NaN included).
pub fn verify_gemm(what: &str, got: &[f32], want: &[f64], bound: f64) -> Result<f64> {
    if got.len() != want.len() || !got.len().is_multiple_of(GEMM_TILE * GEMM_TILE) {
        return Err(Error::Verification {
            detail: format!(
                "{what}: {} results for {} references (whole 128x128 tiles expected)",
                got.len(),
                want.len()
            ),
        });
    }
    let errs = gemm_tile_rel_errors(got, want);
    let mut worst = (0f64, 0usize);
    for (t, &e) in errs.iter().enumerate() {
        if e.is_nan() || e > worst.0 {
            worst = (e, t);
            if e.is_nan() {
                break;
            }
        }
    }
    if worst.0.is_nan() || worst.0 > bound {
        return Err(Error::Verification {
            detail: format!(
                "{what}: tile {} has relative error {:e} (Frobenius norm ratio) > bound {bound:e}",
                worst.1, worst.0
            ),
        });
    }
    Ok(worst.0)
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

    #[test]
    fn issue19_item14_gemm_reference_refuses_wrong_lengths_instead_of_panicking() {
        let tile = vec![1.0f32; GEMM_TILE * GEMM_TILE];
        assert!(matches!(
            gemm_tiles_f64(&tile, &tile[1..], 1),
            Err(Error::LengthMismatch { .. })
        ));
        assert!(matches!(
            gemm_tiles_f64(&tile, &tile, 2),
            Err(Error::LengthMismatch { .. })
        ));
        // tiles x 16384 overflows usize: refused, not wrapped to a matching length.
        assert!(matches!(
            gemm_tiles_f64(&[], &[], usize::MAX / 4096),
            Err(Error::LengthMismatch { .. })
        ));
        assert_eq!(gemm_tiles_f64(&[], &[], 0).unwrap(), Vec::<f64>::new());
        let c = gemm_tiles_f64(&tile, &tile, 1).unwrap();
        assert!(c.iter().all(|&x| x == GEMM_TILE as f64));
    }

    #[test]
    fn gemm_reference_matches_naive_and_verify_catches_errors() {
        let n = GEMM_TILE;
        let a: Vec<f32> = (0..2 * n * n)
            .map(|i| ((i * 7919) % 13) as f32 - 6.0)
            .collect();
        let b: Vec<f32> = (0..2 * n * n)
            .map(|i| ((i * 104729) % 11) as f32 - 5.0)
            .collect();
        let c = gemm_tiles_f64(&a, &b, 2).unwrap();
        for &(t, i, j) in &[(0, 0, 0), (1, 127, 127), (1, 5, 77)] {
            let want: f64 = (0..n)
                .map(|k| a[t * n * n + i * n + k] as f64 * b[t * n * n + k * n + j] as f64)
                .sum();
            assert_eq!(c[t * n * n + i * n + j], want);
        }
        let mut got: Vec<f32> = c.iter().map(|&x| x as f32).collect();
        assert!(verify_gemm("exact", &got, &c, GEMM_REL_BOUND).is_ok());
        got[n * n + 3] += 1000.0;
        assert!(verify_gemm("off", &got, &c, GEMM_REL_BOUND).is_err());
        got[n * n + 3] = f32::NAN;
        assert!(verify_gemm("nan", &got, &c, GEMM_REL_BOUND).is_err());
        assert!(verify_gemm("len", &got[..n * n], &c, GEMM_REL_BOUND).is_err());
    }
}
