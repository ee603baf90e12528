//! CPU references of the attention forward (f64), for the GPU tests, the CLI's `--verify` and
//! the tolerance rule of FlashAttention's tests (issue 23):
//!
//! - [`attention_f64`] with [`PRounding::Exact`]: the exact result on the given inputs (the
//!   inputs are the 16-bit values the kernel reads, widened exactly): softmax in f64, no
//!   rounding anywhere;
//! - [`attention_f64`] with [`PRounding::Bf16`] / [`PRounding::F16`]: the *same-precision
//!   reference*, which rounds `P` to the element type before `P V`, as the kernel does (the
//!   normaliser `l` is the sum of the unrounded `P`, as the kernel's FP32 row sum is), and whose
//!   output the caller rounds to the element type (FlashAttention's `attention_ref(...,
//!   upcast=False)` computed in the input precision).
//!
//! Layout: sequence `b` occupies rows `cu_q[b] .. cu_q[b + 1]` of Q (`[rows, heads, d]`) and O,
//! and rows `cu_k[b] .. cu_k[b + 1]` of K and V (`[rows, kv_heads, d]`); the fixed-length layout
//! `[B, S, H, D]` is the special case `cu[b] = b * S`. LSE is returned as `[heads, total_q]`
//! (natural log; `+inf` for a row that sees no key, whose O row is 0, FlashAttention's
//! convention).

/// How the reference rounds the probabilities `P` before `P V`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PRounding {
    /// No rounding (the exact reference).
    Exact,
    /// Round to BF16 (nearest even), as the BF16 kernel's `P` operand.
    Bf16,
    /// Round to FP16 (nearest even), as the FP16 kernel's `P` operand.
    F16,
}

impl PRounding {
    /// `x` rounded as this mode says.
    pub fn round(self, x: f64) -> f64 {
        match self {
            Self::Exact => x,
            Self::Bf16 => half::bf16::from_f64(x).to_f64(),
            Self::F16 => half::f16::from_f64(x).to_f64(),
        }
    }
}

/// The problem the reference computes, with the inputs already widened to f64.
#[derive(Clone, Copy, Debug)]
pub struct RefProblem<'a> {
    /// Q, `[total_q, heads, head_dim]`.
    pub q: &'a [f64],
    /// K, `[total_k, kv_heads, head_dim]`.
    pub k: &'a [f64],
    /// V, as K.
    pub v: &'a [f64],
    /// Sequence starts of Q (`B + 1` entries, from 0, non-decreasing).
    pub cu_q: &'a [usize],
    /// Sequence starts of K and V.
    pub cu_k: &'a [usize],
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (dividing `heads`; query head `h` reads KV head `h / (heads / kv_heads)`).
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Causal mask aligned to the bottom right: query `i` sees key `j` iff
    /// `j <= i + seqlen_k - seqlen_q`.
    pub causal: bool,
    /// Softmax scale (multiplies `Q K^T`).
    pub scale: f64,
    /// Compute every `row_step`-th query row of each sequence (and its last row); the other
    /// rows of O and LSE are NaN ("not computed"). 1: every row. For large GPU test cases,
    /// where the f64 reference of every row would take minutes.
    pub row_step: usize,
}

/// O (`[total_q, heads, head_dim]`, not rounded) and LSE (`[heads, total_q]`) of `p`, with `P`
/// rounded as `round` says (rows skipped by `row_step` are NaN). Panics on inconsistent sizes
/// (a test helper).
pub fn attention_f64(p: &RefProblem<'_>, round: PRounding) -> (Vec<f64>, Vec<f64>) {
    let (mut o, lse) = attention_f64_multi(p, &[round]);
    (o.pop().unwrap(), lse)
}

/// [`attention_f64`] for several roundings of `P` in one pass over the scores (the scores, the
/// max, the sum and the LSE are the same for all): one O per entry of `rounds`, and the LSE.
pub fn attention_f64_multi(p: &RefProblem<'_>, rounds: &[PRounding]) -> (Vec<Vec<f64>>, Vec<f64>) {
    let (h, hk, d) = (p.heads, p.kv_heads, p.head_dim);
    assert!(hk > 0 && h % hk == 0 && p.cu_q.len() == p.cu_k.len() && !p.cu_q.is_empty());
    let total_q = *p.cu_q.last().unwrap();
    let total_k = *p.cu_k.last().unwrap();
    assert!(p.q.len() >= total_q * h * d && p.k.len() >= total_k * hk * d);
    assert!(p.v.len() >= total_k * hk * d);
    let step = p.row_step.max(1);
    let mut os = vec![vec![f64::NAN; total_q * h * d]; rounds.len()];
    let mut lse = vec![f64::NAN; h * total_q];
    let mut s = Vec::new();
    for b in 0..p.cu_q.len() - 1 {
        let (q0, q1, k0, k1) = (p.cu_q[b], p.cu_q[b + 1], p.cu_k[b], p.cu_k[b + 1]);
        let (sq, sk) = ((q1 - q0) as i64, (k1 - k0) as i64);
        for head in 0..h {
            let kvh = head / (h / hk);
            for i in 0..sq {
                if i % step as i64 != 0 && i != sq - 1 {
                    continue;
                }
                let at = ((q0 + i as usize) * h + head) * d;
                for o in os.iter_mut() {
                    o[at..at + d].fill(0.0);
                }
                lse[head * total_q + q0 + i as usize] = f64::INFINITY;
                let qrow = &p.q[at..][..d];
                let visible = if p.causal {
                    (i + sk - sq + 1).clamp(0, sk)
                } else {
                    sk
                } as usize;
                if visible == 0 {
                    continue; // O = 0, LSE = +inf
                }
                s.clear();
                for j in 0..visible {
                    let krow = &p.k[((k0 + j) * hk + kvh) * d..][..d];
                    let dot: f64 = qrow.iter().zip(krow).map(|(a, b)| a * b).sum();
                    s.push(dot * p.scale);
                }
                let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let mut l = 0.0;
                for (j, &sj) in s.iter().enumerate() {
                    let e = (sj - max).exp();
                    l += e;
                    let vrow = &p.v[((k0 + j) * hk + kvh) * d..][..d];
                    for (o, round) in os.iter_mut().zip(rounds) {
                        let pe = round.round(e);
                        for (acc, &vv) in o[at..at + d].iter_mut().zip(vrow) {
                            *acc += pe * vv;
                        }
                    }
                }
                for o in os.iter_mut() {
                    for acc in o[at..at + d].iter_mut() {
                        *acc /= l;
                    }
                }
                lse[head * total_q + q0 + i as usize] = max + l.ln();
            }
        }
    }
    (os, lse)
}

/// `max |got - want|` over all elements, with a non-finite `got` (or a NaN anywhere) counting as
/// an infinite error, so an element the kernel never wrote (poisoned with NaN) fails any bound.
pub fn max_abs_error(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            if g.is_nan() || w.is_nan() {
                f64::INFINITY
            } else if g.is_infinite() || w.is_infinite() {
                if g == w {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                (g - w).abs()
            }
        })
        .fold(0.0, f64::max)
}

/// FlashAttention-3's absolute slack of the forward tolerance (`hopper/test_flash_attn.py`:
/// `fwd_atol = 2 * (out_ref + 0.3 - 0.3 - out_ref).abs().max()` in the output type): twice the
/// largest error of rounding `o + 0.3` and then `- 0.3` to the element type, i.e. about one
/// output ulp at magnitude 0.3 to 1 (0.002 for BF16, 0.0005 for FP16). It covers the cases where
/// the same-precision reference happens to be almost exact, while the kernel's `P` (rounded
/// relative to the running, not the final, row max) and FP32 accumulation differ from it by an
/// output rounding.
pub fn fwd_atol(o_exact: &[f64], round: PRounding) -> f64 {
    2.0 * o_exact
        .iter()
        .map(|&x| (round.round(round.round(x + 0.3) - 0.3) - x).abs())
        .fold(0.0, f64::max)
}

/// Absolute bound on the kernel's LSE error against the exact reference (natural-log units):
/// the FP32 scores (products of 16-bit values are exact; FP32 accumulation of `D <= 128` terms),
/// `ex2.approx` (relative 2^-22 a term), an FP32 row sum of up to a few thousand terms (relative
/// error below `n * 2^-24`, 1.2e-4 at n = 2048) and `lg2.approx` (absolute 2^-22); the
/// same-precision reference's LSE equals the exact one (rounding `P` does not touch the sum),
/// so FlashAttention's "2x the same-precision error" has nothing to scale and a fixed bound is
/// used.
pub const LSE_ATOL: f64 = 1e-3;

#[cfg(test)]
mod tests {
    use super::*;

    /// softmax(q k^T * scale) v by the textbook formula, for one head, no mask.
    fn naive(
        q: &[f64],
        k: &[f64],
        v: &[f64],
        sq: usize,
        sk: usize,
        d: usize,
        scale: f64,
    ) -> Vec<f64> {
        let mut o = vec![0.0; sq * d];
        for i in 0..sq {
            let s: Vec<f64> = (0..sk)
                .map(|j| (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>() * scale)
                .collect();
            let z: f64 = s.iter().map(|x| x.exp()).sum();
            for j in 0..sk {
                for c in 0..d {
                    o[i * d + c] += s[j].exp() / z * v[j * d + c];
                }
            }
        }
        o
    }

    fn vals(n: usize, seed: u64) -> Vec<f64> {
        let mut r = crate::rng::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| (r.random() as f64 / u32::MAX as f64) * 2.0 - 1.0)
            .collect()
    }

    #[test]
    fn exact_matches_the_textbook_softmax() {
        let (sq, sk, d) = (5, 7, 4);
        let (q, k, v) = (vals(sq * d, 1), vals(sk * d, 2), vals(sk * d, 3));
        let p = RefProblem {
            q: &q,
            k: &k,
            v: &v,
            cu_q: &[0, sq],
            cu_k: &[0, sk],
            heads: 1,
            kv_heads: 1,
            head_dim: d,
            causal: false,
            scale: 0.7,
            row_step: 1,
        };
        let (o, lse) = attention_f64(&p, PRounding::Exact);
        let want = naive(&q, &k, &v, sq, sk, d, 0.7);
        assert!(max_abs_error(&o, &want) < 1e-12);
        for i in 0..sq {
            let z: f64 = (0..sk)
                .map(|j| ((0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>() * 0.7).exp())
                .sum();
            assert!((lse[i] - z.ln()).abs() < 1e-12);
        }
    }

    #[test]
    fn causal_is_bottom_right_aligned_and_empty_rows_are_zero_with_infinite_lse() {
        // seqlen_q = 4 > seqlen_k = 2: rows 0 and 1 see nothing, row 2 sees key 0, row 3 both.
        let (sq, sk, d) = (4, 2, 2);
        let (q, k, v) = (vals(sq * d, 4), vals(sk * d, 5), vals(sk * d, 6));
        let p = RefProblem {
            q: &q,
            k: &k,
            v: &v,
            cu_q: &[0, sq],
            cu_k: &[0, sk],
            heads: 1,
            kv_heads: 1,
            head_dim: d,
            causal: true,
            scale: 1.0,
            row_step: 1,
        };
        let (o, lse) = attention_f64(&p, PRounding::Exact);
        assert_eq!(&o[..4], &[0.0; 4]);
        assert_eq!(&lse[..2], &[f64::INFINITY; 2]);
        // Row 2 sees key 0 only: O = v[0], LSE = s_00.
        assert!((o[4] - v[0]).abs() < 1e-15 && (o[5] - v[1]).abs() < 1e-15);
        let s00 = q[4] * k[0] + q[5] * k[1];
        assert!((lse[2] - s00).abs() < 1e-12);
        // Row 3 sees both: the unmasked softmax of its row.
        let full = naive(&q[6..8], &k, &v, 1, sk, d, 1.0);
        assert!(max_abs_error(&o[6..8], &full) < 1e-12);
    }

    #[test]
    fn gqa_and_varlen_split_into_independent_problems() {
        // Two sequences (3 and 2 query rows, 4 and 1 keys), 4 query heads on 2 KV heads.
        let (h, hk, d) = (4, 2, 3);
        let cu_q = [0, 3, 5];
        let cu_k = [0, 4, 5];
        let (q, k, v) = (vals(5 * h * d, 7), vals(5 * hk * d, 8), vals(5 * hk * d, 9));
        let p = RefProblem {
            q: &q,
            k: &k,
            v: &v,
            cu_q: &cu_q,
            cu_k: &cu_k,
            heads: h,
            kv_heads: hk,
            head_dim: d,
            causal: false,
            scale: 0.5,
            row_step: 1,
        };
        let (o, _) = attention_f64(&p, PRounding::Exact);
        for b in 0..2 {
            let (sq, sk) = (cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]);
            for head in 0..h {
                let kvh = head / 2;
                let gather = |x: &[f64], rows: std::ops::Range<usize>, heads: usize, hh: usize| {
                    rows.flat_map(|r| x[(r * heads + hh) * d..][..d].to_vec())
                        .collect::<Vec<_>>()
                };
                let qs = gather(&q, cu_q[b]..cu_q[b + 1], h, head);
                let ks = gather(&k, cu_k[b]..cu_k[b + 1], hk, kvh);
                let vs = gather(&v, cu_k[b]..cu_k[b + 1], hk, kvh);
                let want = naive(&qs, &ks, &vs, sq, sk, d, 0.5);
                let got = gather(&o, cu_q[b]..cu_q[b + 1], h, head);
                assert!(max_abs_error(&got, &want) < 1e-12, "b {b} head {head}");
            }
        }
    }

    #[test]
    fn rounding_p_moves_o_by_about_a_p_ulp() {
        let (sq, sk, d) = (8, 64, 16);
        let (q, k, v) = (vals(sq * d, 10), vals(sk * d, 11), vals(sk * d, 12));
        let p = RefProblem {
            q: &q,
            k: &k,
            v: &v,
            cu_q: &[0, sq],
            cu_k: &[0, sk],
            heads: 1,
            kv_heads: 1,
            head_dim: d,
            causal: false,
            scale: 1.0,
            row_step: 1,
        };
        let (exact, lse_e) = attention_f64(&p, PRounding::Exact);
        let (bf, lse_b) = attention_f64(&p, PRounding::Bf16);
        let (hf, _) = attention_f64(&p, PRounding::F16);
        let (eb, eh) = (max_abs_error(&bf, &exact), max_abs_error(&hf, &exact));
        // P <= 1 rounded with relative 2^-9 (bf16) / 2^-12 (f16); |v| < 1.
        assert!(eb > 0.0 && eb < 4.0 * 2f64.powi(-9), "{eb}");
        assert!(eh < eb && eh < 4.0 * 2f64.powi(-12), "{eh}");
        assert_eq!(lse_e, lse_b);
        assert!(fwd_atol(&exact, PRounding::Bf16) > 4.0 * fwd_atol(&exact, PRounding::F16));
    }

    #[test]
    fn row_step_computes_the_same_rows_and_marks_the_others() {
        let (sq, sk, d) = (10, 6, 4);
        let (q, k, v) = (vals(sq * d, 13), vals(sk * d, 14), vals(sk * d, 15));
        let mut p = RefProblem {
            q: &q,
            k: &k,
            v: &v,
            cu_q: &[0, sq],
            cu_k: &[0, sk],
            heads: 1,
            kv_heads: 1,
            head_dim: d,
            causal: true,
            scale: 1.0,
            row_step: 1,
        };
        let (all, lse_all) = attention_f64(&p, PRounding::Exact);
        p.row_step = 4;
        let (some, lse_some) = attention_f64(&p, PRounding::Exact);
        for i in 0..sq {
            let computed = i % 4 == 0 || i == sq - 1;
            assert_eq!(lse_some[i].is_nan(), !computed, "row {i}");
            if computed {
                assert_eq!(&some[i * d..][..d], &all[i * d..][..d]);
                assert_eq!(lse_some[i], lse_all[i]);
            }
        }
    }

    /// The kernel's arithmetic on the CPU, one head, fixed length: FP32 scores, key blocks of
    /// 128 with a running max, `exp2` of `s * scale * log2(e) - m * scale * log2(e)`, `P`
    /// rounded to `round` relative to the running max, FP32 `O` rescaled per block, FP32 row
    /// sum, output rounded. Checks that FlashAttention's tolerance rule, as the GPU test applies
    /// it, holds for this algorithm (so a failing GPU test points at the kernel, not the rule).
    fn kernel_model(p: &RefProblem<'_>, round: PRounding) -> (Vec<f64>, Vec<f64>) {
        let d = p.head_dim;
        let (sq, sk) = (p.cu_q[1], p.cu_k[1]);
        let c = (p.scale * std::f64::consts::LOG2_E) as f32;
        let mut o = vec![0.0; sq * d];
        let mut lse = vec![0.0; sq];
        for i in 0..sq {
            let (mut m, mut l) = (f32::NEG_INFINITY, 0f32);
            let mut acc = vec![0f32; d];
            let visible = if p.causal {
                (i + sk).saturating_sub(sq - 1).min(sk)
            } else {
                sk
            };
            let mut n0 = 0;
            while n0 < visible {
                let n1 = (n0 + 128).min(visible);
                let s: Vec<f32> = (n0..n1)
                    .map(|j| (0..d).fold(0f32, |a, x| a + (p.q[i * d + x] * p.k[j * d + x]) as f32))
                    .collect();
                let mx = s.iter().copied().fold(m, f32::max);
                let ms = mx * c;
                let corr = (m * c - ms).exp2();
                let mut sum = 0f32;
                for a in acc.iter_mut() {
                    *a *= corr;
                }
                for (jj, &sj) in s.iter().enumerate() {
                    let e = (sj * c - ms).exp2();
                    sum += e;
                    let pe = round.round(e as f64) as f32;
                    for (a, &vv) in acc.iter_mut().zip(&p.v[(n0 + jj) * d..][..d]) {
                        *a += pe * vv as f32;
                    }
                }
                l = l * corr + sum;
                m = mx;
                n0 = n1;
            }
            for (ox, a) in o[i * d..][..d].iter_mut().zip(&acc) {
                *ox = round.round((a / l) as f64);
            }
            lse[i] = ((m * c + l.log2()) * std::f32::consts::LN_2) as f64;
        }
        (o, lse)
    }

    fn normal(n: usize, seed: u64) -> Vec<f64> {
        let mut r = crate::rng::StdRng::seed_from_u64(seed);
        (0..n)
            .map(|_| {
                let u1 = (r.random() as f64 + 1.0) / (u32::MAX as f64 + 2.0);
                let u2 = r.random() as f64 / u32::MAX as f64;
                (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
            })
            .collect()
    }

    #[test]
    fn kernel_model_meets_the_tolerance_rule() {
        for (sq, sk, d, causal, round, scale) in [
            (64, 1000, 64, false, PRounding::Bf16, None),
            (100, 700, 128, true, PRounding::Bf16, None),
            (64, 513, 128, false, PRounding::F16, None),
            (33, 33, 64, true, PRounding::F16, None),
            // Large logits (scale 1 at d = 128: scores ~ N(0, 128)): the running max moves by
            // many units between blocks, P is peaky.
            (64, 700, 128, false, PRounding::Bf16, Some(1.0)),
            (70, 300, 64, true, PRounding::F16, Some(1.0)),
        ] {
            let r16 = |x: Vec<f64>| -> Vec<f64> { x.into_iter().map(|v| round.round(v)).collect() };
            let (q, k, v) = (
                r16(normal(sq * d, 20)),
                r16(normal(sk * d, 21)),
                r16(normal(sk * d, 22)),
            );
            let p = RefProblem {
                q: &q,
                k: &k,
                v: &v,
                cu_q: &[0, sq],
                cu_k: &[0, sk],
                heads: 1,
                kv_heads: 1,
                head_dim: d,
                causal,
                scale: scale.unwrap_or(1.0 / (d as f64).sqrt()),
                row_step: 1,
            };
            let (os, lse) = attention_f64_multi(&p, &[PRounding::Exact, round]);
            let sp: Vec<f64> = os[1].iter().map(|&x| round.round(x)).collect();
            let (got, got_lse) = kernel_model(&p, round);
            let (err, err_sp) = (max_abs_error(&got, &os[0]), max_abs_error(&sp, &os[0]));
            let atol = fwd_atol(&os[0], round);
            assert!(
                err <= 2.0 * err_sp + atol,
                "{sq}x{sk} d{d}: {err} > 2 * {err_sp} + {atol}"
            );
            assert!(max_abs_error(&got_lse, &lse) <= LSE_ATOL);
        }
    }

    #[test]
    fn max_abs_error_fails_nan_and_mismatched_infinities() {
        assert_eq!(max_abs_error(&[f64::NAN], &[0.0]), f64::INFINITY);
        assert_eq!(max_abs_error(&[f64::INFINITY], &[f64::INFINITY]), 0.0);
        assert_eq!(max_abs_error(&[1.0], &[f64::INFINITY]), f64::INFINITY);
        assert_eq!(max_abs_error(&[1.0, 2.5], &[1.5, 2.0]), 0.5);
    }
}
