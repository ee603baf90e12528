//! The attention forward (`Attention`, kernels `attention_fwd_*` of the sm_90a module, issue 23)
//! on FlashAttention's forward test matrix (`tests/test_flash_attn.py` upstream, FA2's
//! `test_flash_attn_output` / `test_flash_attn_varlen_output` and FA3's `hopper/` tests): its
//! `(seqlen_q, seqlen_k)` pairs, head dims 64 and 128, causal and not, MHA / GQA / MQA (6 query
//! heads on 6, 2 or 1 KV heads), BF16 and FP16, and varlen batches with random lengths.
//!
//! Every case draws fresh standard-normal Q, K, V (rounded to the element type; the seed is
//! printed, `WARPLINE_SEED=<n>` replays it), poisons O and LSE with NaN (plus a NaN guard zone
//! past their ends that must stay NaN), launches, and compares with two f64 CPU references on
//! the same 16-bit inputs (`warpline::kernels::attention::reference`):
//!
//! - `O_exact`: softmax in f64, nothing rounded (FlashAttention's fp32 `out_ref`);
//! - `O_sp`: the same-precision reference, `P` rounded to the element type before `P V`, output
//!   rounded to the element type (FlashAttention's `out_pt`).
//!
//! Tolerance rule (FlashAttention's, FA3 `hopper/test_flash_attn.py`):
//! `max|O - O_exact| <= 2 * max|O_sp - O_exact| + fwd_atol`, where
//! `fwd_atol = 2 * max|(O_exact + 0.3 - 0.3) - O_exact|` with both operations rounded to the
//! element type: about one output ulp at magnitude 0.3-1 (BF16 ~0.002, FP16 ~0.0005). The slack
//! covers cases where the same-precision reference is almost exact by chance, while the kernel
//! rounds `P` relative to the running (not the final) row max and accumulates in FP32.
//! LSE: `|LSE - LSE_exact| <= 1e-3` (`reference::LSE_ATOL`; the same-precision LSE equals the
//! exact one, so there is nothing to scale), and `+inf` exactly where a row sees no key (then
//! O must be 0).
//!
//! Large cases compare sampled query rows (every `ceil(S_q / 64) | 1`-th row of each sequence,
//! an odd step so every row position mod 16 is hit, and its last row; all of O and LSE is still checked for NaN); the reference is f64 on the CPU,
//! so run the suite with `--release`.
//!
//! GPU tests skip without a driver or without an sm_90a device (unless `WARPLINE_REQUIRE_GPU=1`).

use rand::{Rng, SeedableRng};
use warpline::kernels::attention::reference::{
    attention_f64_multi, fwd_atol, max_abs_error, PRounding, RefProblem, LSE_ATOL,
};
use warpline::kernels::attention::{
    Attention, AttentionOptions, AttentionProblem, AttentionTensors, AttnElement, SeqLens,
};
use warpline::ordering::{synchronize_timeout, OnTimeout};
use warpline::{bf16, f16, Device, MemPool};
use warpline_suite::support::{gpu_or_skip, normal};

/// FlashAttention's `(seqlen_q, seqlen_k)` pairs (FA2 `test_flash_attn_output` and
/// `test_flash_attn_varlen_output`, plus FA3's small and lopsided ones).
const PAIRS: [(usize, usize); 15] = [
    (1, 1),
    (1, 147),
    (239, 1),
    (799, 3),
    (113, 203),
    (128, 217),
    (113, 211),
    (108, 256),
    (256, 512),
    (512, 256),
    (1024, 1024),
    (1023, 1024),
    (1024, 1023),
    (2048, 2048),
    (640, 128),
];

/// Query heads; MHA, GQA and MQA use 6, 2 and 1 KV heads (FA3's test).
const HEADS: usize = 6;
const KV_HEADS: [usize; 3] = [6, 2, 1];
/// NaN guard elements after O and after LSE.
const GUARD: usize = 64;

fn seed() -> u64 {
    warpline_suite::support::gemm_seed("attention")
}

fn att_or_skip(test: &str) -> Option<Device> {
    let dev = gpu_or_skip(test)?;
    if dev.capabilities().compute_capability != (9, 0) {
        warpline_suite::support::skip(test, "the device is not compute capability 9.0 (sm_90a)");
        return None;
    }
    Some(dev)
}

#[derive(Clone, Debug)]
struct Case {
    d: usize,
    heads: usize,
    kv_heads: usize,
    causal: bool,
    /// Per sequence (query rows, keys).
    lens: Vec<(usize, usize)>,
    varlen: bool,
    scale: Option<f32>,
    pdl: bool,
    no_pingpong: bool,
    no_overlap: bool,
    no_persistent: bool,
    /// Cap on the persistent grid's CTAs (so that each CTA works through several tiles).
    max_ctas: Option<u32>,
    no_tma_store: bool,
}

impl Case {
    fn fixed(batch: usize, sq: usize, sk: usize, d: usize, kv_heads: usize, causal: bool) -> Self {
        Self {
            d,
            heads: HEADS,
            kv_heads,
            causal,
            lens: vec![(sq, sk); batch],
            varlen: false,
            scale: None,
            pdl: false,
            no_pingpong: false,
            no_overlap: false,
            no_persistent: false,
            max_ctas: None,
            no_tma_store: false,
        }
    }
}

/// Standard-normal values rounded to `T`, and their f64 widening.
fn draw<T: AttnElement>(rng: &mut rand::rngs::StdRng, n: usize) -> (Vec<T>, Vec<f64>) {
    let t: Vec<T> = normal(rng, n)
        .into_iter()
        .map(|x| T::from_f64(x as f64))
        .collect();
    let f = t.iter().map(|&x| x.to_f64()).collect();
    (t, f)
}

fn run_case<T: AttnElement>(att: &Attention<'_>, case: &Case, rng: &mut rand::rngs::StdRng) {
    let dev = att.device();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(dev, 0).unwrap();
    let (h, hk, d) = (case.heads, case.kv_heads, case.d);
    let batch = case.lens.len();
    let mut cu_q = vec![0usize];
    let mut cu_k = vec![0usize];
    for &(q, k) in &case.lens {
        cu_q.push(cu_q.last().unwrap() + q);
        cu_k.push(cu_k.last().unwrap() + k);
    }
    let (tq, tk) = (*cu_q.last().unwrap(), *cu_k.last().unwrap());
    let (q, qf) = draw::<T>(rng, tq * h * d);
    let (k, kf) = draw::<T>(rng, tk * hk * d);
    let (v, vf) = draw::<T>(rng, tk * hk * d);
    let up = |x: &[T]| {
        let mut b = pool.alloc_async::<T>(&stream, x.len()).unwrap();
        b.copy_from_host(x).unwrap();
        b
    };
    let (dq, dk, dv) = (up(&q), up(&k), up(&v));
    let o_len = tq * h * d;
    let mut dout = up(&vec![T::from_f64(f64::NAN); o_len + GUARD]);
    let mut dlse = pool.alloc_async::<f32>(&stream, tq * h + GUARD).unwrap();
    dlse.copy_from_host(&vec![f32::NAN; tq * h + GUARD])
        .unwrap();
    let cq: Vec<i32> = cu_q.iter().map(|&x| x as i32).collect();
    let ck: Vec<i32> = cu_k.iter().map(|&x| x as i32).collect();
    let problem = AttentionProblem {
        batch,
        heads: h,
        kv_heads: hk,
        head_dim: d,
        seqlens: if case.varlen {
            SeqLens::Varlen {
                cu_q: &cq,
                cu_k: &ck,
            }
        } else {
            SeqLens::Fixed {
                q: case.lens[0].0,
                k: case.lens[0].1,
            }
        },
        causal: case.causal,
        softmax_scale: case.scale,
    };
    let shape = {
        let plan = att
            .plan(
                &stream,
                &problem,
                AttentionTensors {
                    q: dq.as_view(),
                    k: dk.as_view(),
                    v: dv.as_view(),
                    o: dout.view_mut(0..o_len).unwrap(),
                    lse: dlse.view_mut(0..tq * h).unwrap(),
                },
                AttentionOptions {
                    pdl: case.pdl,
                    no_pingpong: case.no_pingpong,
                    no_overlap: case.no_overlap,
                    no_persistent: case.no_persistent,
                    max_ctas: case.max_ctas.and_then(std::num::NonZeroU32::new),
                    hb_group: None,
                    no_tma_store: case.no_tma_store,
                },
            )
            .unwrap_or_else(|e| panic!("{case:?}: {e}"));
        plan.launch().unwrap();
        if case.pdl {
            // A second launch right behind the first (PDL): same result.
            plan.launch().unwrap();
        }
        synchronize_timeout(
            &stream,
            std::time::Duration::from_secs(20),
            OnTimeout::Abandon,
        )
        .unwrap_or_else(|e| panic!("{case:?}: the kernel did not finish: {e}"));
        plan.shape().clone()
    };
    let mut o = vec![T::from_f64(0.0); o_len + GUARD];
    dout.copy_to_host(&mut o).unwrap();
    let mut lse = vec![0f32; tq * h + GUARD];
    dlse.copy_to_host(&mut lse).unwrap();
    assert!(
        o[o_len..].iter().all(|x| x.to_f64().is_nan()) && lse[tq * h..].iter().all(|x| x.is_nan()),
        "{case:?}: the kernel wrote past the end of O or LSE"
    );
    let max_sq = case.lens.iter().map(|l| l.0).max().unwrap();
    // Odd, so the sampled rows hit every residue mod 16 (every lane quad and both accumulator
    // row halves of a warp's 16 rows) over a long sequence.
    let row_step = max_sq.div_ceil(64) | 1;
    let rp = RefProblem {
        q: &qf,
        k: &kf,
        v: &vf,
        cu_q: &cu_q,
        cu_k: &cu_k,
        heads: h,
        kv_heads: hk,
        head_dim: d,
        causal: case.causal,
        scale: shape.softmax_scale as f64,
        row_step,
    };
    let (os, lse_ref) = attention_f64_multi(&rp, &[PRounding::Exact, T::P_ROUNDING]);
    let (o_exact, o_sp) = (&os[0], &os[1]);
    // Gather the computed rows (the reference marks the others NaN).
    let (mut got, mut exact, mut sp, mut at) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let place = |i: usize| {
        // (sequence, row in it, head, column) of O element i.
        let (row, head, col) = (i / (h * d), (i / d) % h, i % d);
        let b = cu_q.partition_point(|&c| c <= row) - 1;
        format!(
            "sequence {b} row {} head {head} column {col}",
            row - cu_q[b]
        )
    };
    for i in 0..o_len {
        let g = o[i].to_f64();
        assert!(
            !g.is_nan(),
            "{case:?}: O at {} is NaN (not written?)",
            place(i)
        );
        if !o_exact[i].is_nan() {
            got.push(g);
            exact.push(o_exact[i]);
            sp.push(T::from_f64(o_sp[i]).to_f64());
            at.push(i);
        }
    }
    let worst = (0..got.len())
        .max_by(|&a, &b| {
            (got[a] - exact[a])
                .abs()
                .total_cmp(&(got[b] - exact[b]).abs())
        })
        .unwrap_or(0);
    let err = max_abs_error(&got, &exact);
    let err_sp = max_abs_error(&sp, &exact);
    let atol = fwd_atol(&exact, T::P_ROUNDING);
    assert!(
        err <= 2.0 * err_sp + atol,
        "{case:?} {}: max|O - O_exact| = {err:e} > 2 * {err_sp:e} (same-precision) + {atol:e}; \
         worst at {}: got {}, want {}",
        T::NAME,
        place(at[worst]),
        got[worst],
        exact[worst]
    );
    // LSE: kernel [B, H, S_q] (fixed) or [H, total_q] (varlen); reference [H, total_q].
    let mut lse_err = 0f64;
    for b in 0..batch {
        for head in 0..h {
            for i in 0..cu_q[b + 1] - cu_q[b] {
                let kidx = if case.varlen {
                    head * tq + cu_q[b] + i
                } else {
                    (b * h + head) * (cu_q[b + 1] - cu_q[b]) + i
                };
                let g = lse[kidx] as f64;
                assert!(
                    !g.is_nan(),
                    "{case:?}: LSE (b {b}, head {head}, row {i}) is NaN"
                );
                let w = lse_ref[head * tq + cu_q[b] + i];
                if w.is_nan() {
                    continue; // row not computed by the reference
                }
                if w.is_infinite() || g.is_infinite() {
                    assert_eq!(g, w, "{case:?}: LSE (b {b}, head {head}, row {i})");
                    let row = &o[((cu_q[b] + i) * h + head) * d..][..d];
                    assert!(
                        row.iter().all(|x| x.to_f64() == 0.0),
                        "{case:?}: empty row not 0"
                    );
                } else {
                    lse_err = lse_err.max((g - w).abs());
                }
            }
        }
    }
    assert!(
        lse_err <= LSE_ATOL,
        "{case:?} {}: max|LSE - LSE_exact| = {lse_err:e} > {LSE_ATOL:e}",
        T::NAME
    );
    eprintln!(
        "ok {} d{} {:?} H{h}/{hk} causal={} varlen={}: err {err:.2e} <= 2 * {err_sp:.2e} + {atol:.1e}, lse err {lse_err:.1e}",
        T::NAME,
        d,
        if case.varlen { vec![] } else { vec![case.lens.len(), case.lens[0].0, case.lens[0].1] },
        case.causal,
        case.varlen
    );
}

/// The fixed-length matrix for one element type and head dim: every pair, causal and not,
/// MHA / GQA / MQA; batch 2 up to 512 rows, 1 beyond.
fn fixed_matrix<T: AttnElement>(test: &str, d: usize, kv: &[usize]) {
    let Some(dev) = att_or_skip(test) else {
        return;
    };
    let att = Attention::new(&dev).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    for (sq, sk) in PAIRS {
        let batch = if sq.max(sk) <= 512 { 2 } else { 1 };
        for causal in [false, true] {
            for &hk in kv {
                run_case::<T>(&att, &Case::fixed(batch, sq, sk, d, hk, causal), &mut rng);
            }
        }
    }
}

#[test]
fn fa_matrix_bf16_d128() {
    fixed_matrix::<bf16>("attention bf16 d128", 128, &KV_HEADS);
}

#[test]
fn fa_matrix_bf16_d64() {
    fixed_matrix::<bf16>("attention bf16 d64", 64, &KV_HEADS);
}

#[test]
fn fa_matrix_fp16_d128() {
    fixed_matrix::<f16>("attention fp16 d128", 128, &[6, 1]);
}

#[test]
fn fa_matrix_fp16_d64() {
    fixed_matrix::<f16>("attention fp16 d64", 64, &[6, 2]);
}

/// Varlen batches with random lengths (FlashAttention's `generate_random_padding_mask` draws
/// lengths between S/3 and S; here 0 to S, so empty sequences occur too), for each FA pair's
/// maxima, both head dims, causal and not, GQA.
#[test]
fn varlen_random_lengths() {
    let Some(dev) = att_or_skip("attention varlen") else {
        return;
    };
    let att = Attention::new(&dev).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    for (sq, sk) in [
        (113, 203),
        (128, 217),
        (108, 256),
        (512, 256),
        (1023, 1024),
        (239, 1),
    ] {
        for d in [64, 128] {
            for causal in [false, true] {
                let batch = 4;
                let mut lens: Vec<(usize, usize)> = (0..batch)
                    .map(|_| (rng.random_range(0..=sq), rng.random_range(0..=sk)))
                    .collect();
                // At least one query row and one key overall; one sequence at the maxima.
                lens[0] = (sq, sk);
                let case = Case {
                    d,
                    heads: HEADS,
                    kv_heads: 2,
                    causal,
                    lens,
                    varlen: true,
                    scale: None,
                    pdl: false,
                    no_pingpong: false,
                    no_overlap: false,
                    no_persistent: false,
                    max_ctas: None,
                    no_tma_store: false,
                };
                run_case::<bf16>(&att, &case, &mut rng);
            }
        }
    }
    // FP16, MQA, a scale other than the default.
    let case = Case {
        d: 128,
        heads: HEADS,
        kv_heads: 1,
        causal: true,
        lens: vec![(300, 500), (0, 17), (77, 0), (129, 128)],
        varlen: true,
        scale: Some(0.3),
        pdl: false,
        no_pingpong: false,
        no_overlap: false,
        no_persistent: false,
        max_ctas: None,
        no_tma_store: false,
    };
    run_case::<f16>(&att, &case, &mut rng);
}

/// Launched with PDL twice back to back; non-default softmax scales, large logits.
#[test]
fn pdl_and_scale() {
    let Some(dev) = att_or_skip("attention PDL") else {
        return;
    };
    let att = Attention::new(&dev).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    for d in [64, 128] {
        let case = Case {
            pdl: true,
            scale: Some(0.05),
            ..Case::fixed(2, 333, 444, d, 2, true)
        };
        run_case::<bf16>(&att, &case, &mut rng);
        // Large logits (scale 1: scores ~ N(0, D)): the running max moves far between key
        // blocks and P is peaky, which exercises the rescaling.
        let case = Case {
            scale: Some(1.0),
            ..Case::fixed(2, 300, 700, d, 6, false)
        };
        run_case::<bf16>(&att, &case, &mut rng);
        run_case::<f16>(
            &att,
            &Case {
                causal: true,
                ..case
            },
            &mut rng,
        );
    }
}

/// The ping-pong off (`AttentionOptions::no_pingpong`) gives results within the same rule.
#[test]
fn without_pingpong() {
    let Some(dev) = att_or_skip("attention without ping-pong") else {
        return;
    };
    let att = Attention::new(&dev).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    for (d, causal) in [(64, false), (128, true)] {
        let case = Case {
            no_pingpong: true,
            ..Case::fixed(2, 1023, 1024, d, 2, causal)
        };
        run_case::<bf16>(&att, &case, &mut rng);
    }
}

/// The in-warpgroup overlap off (`AttentionOptions::no_overlap`, the plain per-block order)
/// gives results within the same rule; varlen and fixed.
#[test]
fn without_overlap() {
    let Some(dev) = att_or_skip("attention without overlap") else {
        return;
    };
    let att = Attention::new(&dev).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    for (d, causal) in [(64, true), (128, false)] {
        let case = Case {
            no_overlap: true,
            ..Case::fixed(2, 113, 211, d, 6, causal)
        };
        run_case::<bf16>(&att, &case, &mut rng);
        let case = Case {
            no_overlap: true,
            varlen: true,
            lens: vec![(300, 500), (0, 17), (77, 0), (129, 128)],
            ..Case::fixed(1, 1, 1, d, 2, causal)
        };
        run_case::<f16>(&att, &case, &mut rng);
    }
}

/// The persistent grid capped at a few CTAs, so that each works through many tiles: its K and
/// V rings, Q buffer and info slots wrap over tiles of different lengths, varlen tiles past their
/// sequence are skipped, causal tiles that see no key (S_k < S_q) are written without Q, and the
/// end marker comes after a ragged number of tiles per CTA. Also one CTA per tile
/// (`no_persistent`). All within the same rule.
#[test]
fn persistent_grid_over_many_tiles_per_cta() {
    let Some(dev) = att_or_skip("attention persistent grid") else {
        return;
    };
    let att = Attention::new(&dev).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    for (d, causal, ctas) in [
        (64, true, 1),
        (128, false, 3),
        (128, true, 5),
        (64, false, 2),
    ] {
        let case = Case {
            max_ctas: Some(ctas),
            ..Case::fixed(3, 333, 211, d, 2, causal)
        };
        run_case::<bf16>(&att, &case, &mut rng);
        let case = Case {
            max_ctas: Some(ctas),
            varlen: true,
            lens: vec![
                (300, 500),
                (0, 17),
                (77, 0),
                (129, 128),
                (513, 257),
                (5, 900),
            ],
            ..Case::fixed(1, 1, 1, d, 6, causal)
        };
        run_case::<f16>(&att, &case, &mut rng);
        let case = Case {
            max_ctas: Some(ctas),
            no_overlap: true,
            ..Case::fixed(2, 200, 150, d, 6, causal)
        };
        run_case::<bf16>(&att, &case, &mut rng);
    }
    for d in [64, 128] {
        let case = Case {
            no_persistent: true,
            ..Case::fixed(2, 1023, 1024, d, 2, d == 128)
        };
        run_case::<bf16>(&att, &case, &mut rng);
        // The plain-store epilogue (the TMA store is the default for fixed lengths).
        let case = Case {
            no_tma_store: true,
            max_ctas: Some(3),
            ..Case::fixed(2, 333, 211, d, 2, d == 64)
        };
        run_case::<bf16>(&att, &case, &mut rng);
    }
}

/// Bad input is refused with a typed error before anything is launched (on the device: the
/// views' streams; the shape rules are CPU-tested in the library).
#[test]
fn refuses_foreign_streams_and_bad_offsets() {
    let Some(dev) = att_or_skip("attention refusals") else {
        return;
    };
    let att = Attention::new(&dev).unwrap();
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 2 * 64 * 6 * 128;
    let q = pool.alloc_async::<bf16>(&s1, n).unwrap();
    let k = pool.alloc_async::<bf16>(&s1, n).unwrap();
    let v = pool.alloc_async::<bf16>(&s2, n).unwrap();
    let mut o = pool.alloc_async::<bf16>(&s1, n).unwrap();
    let mut lse = pool.alloc_async::<f32>(&s1, 2 * 6 * 64).unwrap();
    let problem = AttentionProblem {
        kv_heads: 6,
        ..AttentionProblem::fixed(2, 6, 64, 128, false)
    };
    let e = att
        .plan(
            &s1,
            &problem,
            AttentionTensors {
                q: q.as_view(),
                k: k.as_view(),
                v: v.as_view(),
                o: o.as_view_mut(),
                lse: lse.as_view_mut(),
            },
            AttentionOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(e, warpline::Error::WrongStream { .. }), "{e}");
    let (cq, ck) = ([0, 64, 60], [0, 64, 128]);
    let bad = AttentionProblem {
        seqlens: SeqLens::Varlen {
            cu_q: &cq,
            cu_k: &ck,
        },
        ..problem
    };
    let e = att
        .plan(
            &s1,
            &bad,
            AttentionTensors {
                q: q.as_view(),
                k: k.as_view(),
                v: k.as_view(),
                o: o.as_view_mut(),
                lse: lse.as_view_mut(),
            },
            AttentionOptions::default(),
        )
        .unwrap_err();
    assert!(matches!(e, warpline::Error::BadSeqlens { .. }), "{e}");
}
