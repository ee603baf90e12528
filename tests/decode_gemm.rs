//! The memory-bound decode GEMM (issue 20; `DecodeGemm`, kernels `decode_gemm_*` of the sm_90
//! module, and `TcGemm` with `GemmConfig::Decode` / `Auto`) against an f64 CPU reference on the
//! 16-bit-rounded inputs: fresh seeded random normal inputs (seed printed; `WARPLINE_SEED=<n>`
//! replays it), C poisoned with NaN for `beta = 0`, row pitches padded with NaN (a kernel that
//! reads past K or N fails), M in {1, 2, 7, 16, 33, 64}, N = 1003 and K in {2056 (a multiple of 8
//! but not of the 64- or 128-element k-blocks), 2050 (not even a multiple of 8: the element-wise
//! tail)}.
//!
//! Error bound, per element (the one of tests/tc_gemm.rs, `warpline::kernels::tc_gemm::ACC_REL`):
//! `|got - want| <= 1e-3 * (|alpha| * sum_k |a_ik b_kj| + |beta * c0_ij|) + r * |want| + 1e-6`,
//! `r` half an ulp of the output type. Products of 16-bit inputs are exact in FP32; the kernel
//! accumulates in FP32 (per-warp MMA chains, then a fixed-order sum of at most 16 warp partials),
//! so the error is about K * 2^-24 of sum |a b| (1.2e-4 at K = 2056), well inside 1e-3.
//!
//! The GPU tests skip without a driver (`WARPLINE_REQUIRE_GPU=1` makes a skip fail).

use rand::SeedableRng;
use warpline::kernels::decode_gemm::{DecodeConfig, DecodeGemm, DecodeGemmOptions, GemmConfig};
use warpline::kernels::tc_gemm::{
    reference_entry, tolerance, BLayout, HostB, Matrix, MatrixMut, TcGemm, TcGemmOptions, TcInput,
    TcOutput,
};
use warpline::{bf16, f16, Device, Error, MemPool};
use warpline_suite::support::{gpu_or_skip, upload, upload_c};

fn seed() -> u64 {
    warpline_suite::support::gemm_seed("decode_gemm")
}

/// Pitch of `cols` elements of `bytes` bytes rounded up to 16 bytes.
fn pitch16(cols: usize, bytes: usize) -> usize {
    cols.next_multiple_of(16 / bytes)
}

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
    cfg: DecodeConfig,
    /// Through `TcGemm` (`GemmConfig::Decode` for BF16, `Auto` for FP16) instead of `DecodeGemm`.
    via_tc: bool,
    /// PDL with the weights loaded before `griddepcontrol.wait`.
    pdl_early: bool,
}

impl Case {
    fn new(m: usize, n: usize, k: usize) -> Self {
        Self {
            m,
            n,
            k,
            alpha: 1.0,
            beta: 0.0,
            cfg: DecodeConfig::default(),
            via_tc: false,
            pdl_early: false,
        }
    }
}

/// Runs one case; returns false when the configuration does not fit the entry (its
/// register-limited CTA size), after checking that the refusal is the typed one.
fn run_case<T: TcInput, O: TcOutput<T>>(
    dev: &Device,
    dg: &DecodeGemm<'_>,
    tc: Option<&TcGemm<'_>>,
    case: Case,
) -> bool {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(dev, 0).unwrap();
    let (m, n, k) = (case.m, case.n, case.k);
    let lda = pitch16(k, 2);
    let ldb = pitch16(k, 2) + 8; // one extra 16-byte unit of NaN padding per weight row
    let ldc = pitch16(n, size_of::<O>()) + 16 / size_of::<O>();
    let (da, ha) = upload::<T>(&pool, &stream, &mut rng, m, k, lda);
    let (db, hb) = upload::<T>(&pool, &stream, &mut rng, n, k, ldb);
    let c_len = m * ldc;
    let (mut dc, c0) =
        upload_c::<T, O>(&pool, &stream, &mut rng, m, n, ldc, c_len, case.beta != 0.0);
    let a = Matrix::new(da.as_view(), m, k, lda);
    let b = Matrix::new(db.as_view(), n, k, ldb);
    let c = MatrixMut::new(dc.as_view_mut(), m, n, ldc);
    let result = if case.via_tc {
        let tc = tc.expect("TcGemm for via_tc");
        // BF16 Auto picks the swap-AB kernel at these sizes (tests/swap_ab_gemm.rs); FP16
        // Auto picks this one. Ask for it.
        let opts = TcGemmOptions {
            decode: case.cfg,
            config: if T::IS_BF16 {
                GemmConfig::Decode
            } else {
                GemmConfig::Auto
            },
            ..Default::default()
        };
        tc.plan(
            &stream,
            a,
            b,
            BLayout::ColMajor,
            c,
            case.alpha,
            case.beta,
            &opts,
        )
        .and_then(|p| {
            assert_eq!(p.gemm_config(), GemmConfig::Decode, "{case:?}");
            p.launch()
        })
    } else {
        let mut opts = DecodeGemmOptions::new(case.cfg, case.pdl_early);
        if case.pdl_early {
            // SAFETY: no kernel on this fresh stream writes B (it was written by a copy).
            opts = unsafe { opts.with_weights_before_wait() };
        }
        dg.plan(
            &stream,
            a,
            b,
            BLayout::ColMajor,
            c,
            case.alpha,
            case.beta,
            &opts,
        )
        .and_then(|p| {
            p.launch()?;
            if case.pdl_early {
                // Back to back with PDL: the second launch's early weight reads overlap
                // the first; both compute the same C only when beta == 0.
                if case.beta == 0.0 {
                    p.launch()?;
                }
            }
            Ok(())
        })
    };
    match result {
        Ok(()) => {}
        Err(Error::TooLarge { what, .. }) if what.contains("register-limited") => {
            eprintln!("{case:?}: does not fit the entry ({what}), skipped");
            return false;
        }
        Err(e) => panic!("{case:?}: {e}"),
    }
    let mut got = vec![O::from_f32(0.0); c_len];
    dc.copy_to_host(&mut got).unwrap();
    let hb = HostB {
        data: &hb,
        pitch: ldb,
        layout: BLayout::ColMajor,
    };
    for i in 0..m {
        for j in 0..n {
            let (s, abs) = reference_entry(&ha, lda, &hb, k, i, j).unwrap();
            let old = if case.beta != 0.0 {
                c0[i * ldc + j] as f64
            } else {
                0.0
            };
            let want = case.alpha as f64 * s + case.beta as f64 * old;
            let g = got[i * ldc + j].to_f32() as f64;
            let tol = tolerance(
                want,
                abs,
                case.alpha as f64,
                case.beta as f64 * old,
                O::ROUNDING,
            );
            assert!(
                (g - want).abs() <= tol,
                "{} -> {}, {case:?}: C[{i}][{j}] = {g}, want {want} (tolerance {tol})",
                T::NAME,
                std::any::type_name::<O>()
            );
        }
        // The padding of C is untouched.
        if i + 1 < m {
            for j in n..ldc {
                assert!(
                    got[i * ldc + j].to_f32().is_nan(),
                    "{case:?}: C padding [{i}][{j}] was written"
                );
            }
        }
    }
    true
}

const MS: [usize; 6] = [1, 2, 7, 16, 33, 64];

#[test]
fn issue20_decode_gemm_bf16_f32_out_all_m_tails_beta() {
    let Some(dev) = gpu_or_skip("decode_gemm bf16") else {
        return;
    };
    let dg = DecodeGemm::new(&dev).unwrap();
    for m in MS {
        for k in [2056, 2050] {
            for (alpha, beta) in [(1.0, 0.0), (0.75, -1.5)] {
                let case = Case {
                    alpha,
                    beta,
                    ..Case::new(m, 1003, k)
                };
                assert!(run_case::<bf16, f32>(&dev, &dg, None, case));
            }
        }
    }
}

#[test]
fn issue20_decode_gemm_16_bit_outputs_and_fp16() {
    let Some(dev) = gpu_or_skip("decode_gemm 16-bit") else {
        return;
    };
    let dg = DecodeGemm::new(&dev).unwrap();
    for m in [1, 7, 16, 33] {
        for (alpha, beta) in [(1.0, 0.0), (0.5, 2.0)] {
            let case = Case {
                alpha,
                beta,
                ..Case::new(m, 1003, 2056)
            };
            assert!(run_case::<bf16, bf16>(&dev, &dg, None, case));
            assert!(run_case::<f16, f32>(&dev, &dg, None, case));
            assert!(run_case::<f16, f16>(&dev, &dg, None, case));
        }
    }
}

#[test]
fn issue20_decode_gemm_every_swept_config() {
    let Some(dev) = gpu_or_skip("decode_gemm configs") else {
        return;
    };
    let dg = DecodeGemm::new(&dev).unwrap();
    for cfg in DecodeConfig::sweep() {
        // Two row tiles per warp serve at most 32 tokens (issue20_decode_gemm_two_row_tiles
        // checks the refusal above).
        let ms = if cfg.row_tiles == 1 {
            [2, 16, 64]
        } else {
            [2, 16, 32]
        };
        for m in ms {
            let case = Case {
                cfg,
                beta: 0.5,
                ..Case::new(m, 77, 1032)
            };
            let ran = run_case::<bf16, f32>(&dev, &dg, None, case);
            // The default CTA size (8 warps) fits every entry.
            assert!(ran || cfg.warps > 8, "{cfg:?} M = {m} did not fit");
        }
    }
}

#[test]
fn issue20_decode_gemm_pdl_weights_before_wait() {
    let Some(dev) = gpu_or_skip("decode_gemm pdl") else {
        return;
    };
    let dg = DecodeGemm::new(&dev).unwrap();
    // The default config, and (issue 20, M = 16) two row tiles with the A prefetch: A is
    // still read only after griddepcontrol.wait.
    let r2_pa = DecodeConfig {
        unroll: 2,
        row_tiles: 2,
        prefetch_a: true,
        ..Default::default()
    };
    for cfg in [DecodeConfig::default(), r2_pa] {
        for m in [1, 16] {
            let case = Case {
                pdl_early: true,
                cfg,
                ..Case::new(m, 1003, 2056)
            };
            assert!(run_case::<bf16, f32>(&dev, &dg, None, case));
        }
    }
}

#[test]
fn issue20_decode_gemm_through_tc_gemm_auto() {
    let Some(dev) = gpu_or_skip("decode_gemm via TcGemm") else {
        return;
    };
    if dev.capabilities().compute_capability != (9, 0) {
        warpline_suite::support::skip(
            "decode_gemm via TcGemm",
            "TcGemm needs compute capability 9.0",
        );
        return;
    }
    let tc = TcGemm::new(&dev).unwrap();
    let dg = DecodeGemm::new(&dev).unwrap();
    for m in [1, 16, 64] {
        let case = Case {
            via_tc: true,
            beta: -1.0,
            ..Case::new(m, 1003, 2056)
        };
        assert!(run_case::<bf16, f32>(&dev, &dg, Some(&tc), case));
    }
}

/// Issue 20, M = 16: the entries with two row tiles per warp (`DecodeConfig::row_tiles = 2`,
/// `decode_gemm_*_t{1,2,4}_u{2,4}_r2`) and those that load A one k-block ahead
/// (`DecodeConfig::prefetch_a`, `decode_gemm_*_t{1,2,4,8}_u2_pa`, `..._t{1,2,4}_u2_r2_pa`)
/// against the reference: M in {1, 2, 7, 16, 17, 32, 33} (33 with one row tile only), odd N
/// (1003; and 45, a warp tile and a half of 32 columns, so the second warp's first row tile is
/// partly and its second wholly past N), K a multiple of 8 but not of the k-block (2056) and not
/// of 8 (2050), C poisoned with NaN at beta = 0 and random at beta != 0, BF16 -> f32 and FP16 ->
/// FP16, CTA shapes with and without split-K. Two row tiles at M = 33 and 64 (no entry) are
/// refused with the typed error before any launch.
#[test]
fn issue20_decode_gemm_two_row_tiles() {
    let Some(dev) = gpu_or_skip("decode_gemm two row tiles") else {
        return;
    };
    let dg = DecodeGemm::new(&dev).unwrap();
    let cfg = |warps, ks, unroll, row_tiles, prefetch_a| DecodeConfig {
        warps,
        ksplit: Some(ks),
        unroll,
        l2_prefetch: true,
        row_tiles,
        prefetch_a,
    };
    let cfgs = [
        cfg(8, 4, 2, 2, false),
        cfg(16, 16, 2, 2, false),
        cfg(4, 1, 4, 2, false),
        cfg(8, 8, 4, 2, false),
        cfg(8, 4, 2, 2, true),
        cfg(16, 8, 2, 1, true),
        cfg(4, 2, 2, 1, true),
    ];
    for m in [1, 2, 7, 16, 17, 32, 33] {
        for (n, k) in [(1003, 2056), (1003, 2050), (45, 2056)] {
            for (ab, (alpha, beta)) in [(1.0, 0.0), (0.75, -1.5)].into_iter().enumerate() {
                for (i, c) in cfgs.into_iter().enumerate() {
                    // Every config at both (alpha, beta) over the Ms, half of the cases each
                    // (the CPU reference is the cost); two row tiles serve up to 32 tokens.
                    if (i + m + ab) % 2 == 1 || (c.row_tiles == 2 && m > 32) {
                        continue;
                    }
                    let case = Case {
                        alpha,
                        beta,
                        cfg: c,
                        ..Case::new(m, n, k)
                    };
                    let ran = run_case::<bf16, f32>(&dev, &dg, None, case);
                    assert!(ran || c.warps > 8, "{case:?} did not fit");
                }
                for (i, c) in [cfgs[0], cfgs[4], cfgs[5]].into_iter().enumerate() {
                    if (i + m + ab) % 2 == 1 || (c.row_tiles == 2 && m > 32) {
                        continue;
                    }
                    let case = Case {
                        alpha,
                        beta,
                        cfg: c,
                        ..Case::new(m, n, k)
                    };
                    // As above: a 16-warp CTA may exceed the entry's register-limited size
                    // (a typed refusal, reported by run_case as not run).
                    let ran = run_case::<f16, f16>(&dev, &dg, None, case);
                    assert!(ran || c.warps > 8, "{case:?} did not fit");
                }
            }
        }
    }
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let a = pool.alloc_async::<bf16>(&stream, 64 * 64).unwrap();
    let b = pool.alloc_async::<bf16>(&stream, 64 * 64).unwrap();
    let mut c = pool.alloc_async::<f32>(&stream, 64 * 64).unwrap();
    for (m, bad_cfg) in [(33, cfgs[0]), (64, cfgs[0]), (33, cfgs[4])] {
        let e = dg
            .plan(
                &stream,
                Matrix::new(a.as_view(), m, 64, 64),
                Matrix::new(b.as_view(), 64, 64, 64),
                BLayout::ColMajor,
                MatrixMut::new(c.as_view_mut(), m, 64, 64),
                1.0,
                0.0,
                &DecodeGemmOptions::new(bad_cfg, false),
            )
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadShape {
                    what: "decode gemm variant",
                    ..
                }
            ),
            "M = {m}: {e}"
        );
    }
}

/// Same inputs, two launches: bitwise equal outputs (the split-K reduction has a fixed order).
#[test]
fn issue20_decode_gemm_is_deterministic() {
    let Some(dev) = gpu_or_skip("decode_gemm determinism") else {
        return;
    };
    let dg = DecodeGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let (m, n, k) = (16, 4096, 4096);
    let (da, _) = upload::<bf16>(&pool, &stream, &mut rng, m, k, k);
    let (db, _) = upload::<bf16>(&pool, &stream, &mut rng, n, k, k);
    for row_tiles in [1, 2] {
        let mut outs = Vec::new();
        for _ in 0..2 {
            let mut dc = pool.alloc_async::<f32>(&stream, m * n).unwrap();
            dc.fill_async(f32::NAN).unwrap();
            // 8 warps: the two-row-tile entries with A prefetch fit at most 384 threads per CTA
            // (their register-limited maximum; 16 warps was refused on the H100 with TooLarge).
            let cfg = DecodeConfig {
                warps: 8,
                ksplit: Some(8),
                unroll: 2,
                l2_prefetch: true,
                row_tiles,
                prefetch_a: row_tiles == 2,
            };
            dg.plan(
                &stream,
                Matrix::new(da.as_view(), m, k, k),
                Matrix::new(db.as_view(), n, k, k),
                BLayout::ColMajor,
                MatrixMut::new(dc.as_view_mut(), m, n, n),
                1.0,
                0.0,
                &DecodeGemmOptions::new(cfg, false),
            )
            .and_then(|p| p.launch())
            .unwrap();
            let mut got = vec![0f32; m * n];
            dc.copy_to_host(&mut got).unwrap();
            outs.push(got.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
        }
        assert!(
            outs[0] == outs[1],
            "two launches differ ({row_tiles} row tiles)"
        );
    }
}

/// Bad input is refused before any launch, with typed errors.
#[test]
fn issue20_decode_gemm_refuses_bad_input() {
    let Some(dev) = gpu_or_skip("decode_gemm validation") else {
        return;
    };
    let dg = DecodeGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let other = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let a = pool.alloc_async::<bf16>(&stream, 65 * 64).unwrap();
    let b = pool.alloc_async::<bf16>(&stream, 64 * 64).unwrap();
    let b_other = pool.alloc_async::<bf16>(&other, 64 * 64).unwrap();
    let mut c = pool.alloc_async::<f32>(&stream, 65 * 64).unwrap();
    let opts = DecodeGemmOptions::default();
    let mut attempt = |m: usize, layout: BLayout, lda: usize, b_on_other: bool| {
        let bv = if b_on_other {
            b_other.as_view()
        } else {
            b.as_view()
        };
        dg.plan(
            &stream,
            Matrix::new(a.as_view(), m, 64, lda),
            Matrix::new(bv, 64, 64, 64),
            layout,
            MatrixMut::new(c.as_view_mut(), m, 64, 64),
            1.0,
            0.0,
            &opts,
        )
        .map(|_| ())
        .unwrap_err()
    };
    // M above 64.
    assert!(matches!(
        attempt(65, BLayout::ColMajor, 64, false),
        Error::BadShape { .. }
    ));
    // Row-major B.
    assert!(matches!(
        attempt(4, BLayout::RowMajor, 64, false),
        Error::BadShape { .. }
    ));
    // Pitch not a multiple of 16 bytes.
    assert!(matches!(
        attempt(4, BLayout::ColMajor, 65, false),
        Error::PitchAlignment { .. }
    ));
    // B bound to another stream.
    assert!(matches!(
        attempt(4, BLayout::ColMajor, 64, true),
        Error::WrongStream { .. }
    ));
    // Bad tunables.
    let bad = DecodeGemmOptions::new(
        DecodeConfig {
            warps: 8,
            ksplit: Some(3),
            unroll: 4,
            l2_prefetch: false,
            row_tiles: 1,
            prefetch_a: false,
        },
        false,
    );
    let e = dg
        .plan(
            &stream,
            Matrix::new(a.as_view(), 4, 64, 64),
            Matrix::new(b.as_view(), 64, 64, 64),
            BLayout::ColMajor,
            MatrixMut::new(c.as_view_mut(), 4, 64, 64),
            1.0,
            0.0,
            &bad,
        )
        .map(|_| ())
        .unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
}
