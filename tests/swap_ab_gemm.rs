//! The swap-AB tensor-core GEMM (issue 20; `TcGemm` with `GemmConfig::SwapAb`, kernels
//! `swap_ab_gemm_bf16_n{8,16,32,64,128}` of the sm_90a module) against an f64 CPU reference on
//! the BF16-rounded inputs: fresh seeded random normal inputs (seed printed; `WARPLINE_SEED=<n>`
//! replays it), C poisoned with NaN for `beta = 0`, row pitches padded with NaN (a kernel that
//! reads past K or N fails), M in {1, 2, 7, 16, 33, 64, 127, 128, 129}, N = 1003 (not a multiple
//! of the 128-row weight tile) and K = 2056 / 2050 (not multiples of the 64-deep k-block; 2050
//! not even of 8), every token tile and cluster size (ksplit 1, 2, 3, 4, 8), and every fused
//! epilogue (bias, SiLU, GELU, SwiGLU, beta != 0 as a residual add), f32 and BF16 out.
//!
//! Error bound, per element, before the activation: tests/tc_gemm.rs's (`tolerance`: `1e-3 *
//! (|alpha| sum |a b| + |beta c0|) + half an ulp of the output * |want| + 1e-6`; the split-K sum
//! adds at most 7 FP32 roundings of partial sums, far inside 1e-3). Through an activation `f` the
//! pre-activation bound `e` becomes `max|f'| * e` (SiLU 1.1, GELU 1.13) plus the kernel's
//! approximation: `ex2.approx` (2^-22 relative) and, for GELU, `tanh.approx` (absolute error
//! below 2^-10.9, times `|x| / 2`). For SwiGLU `silu(g) * u`: `1.1 |u| e_g + |silu(g)| e_u` plus
//! the same approximation terms.
//!
//! The GPU tests skip without a driver or sm_90 (`WARPLINE_REQUIRE_GPU=1` makes a skip fail).

use rand::SeedableRng;
use warpline::kernels::decode_gemm::GemmConfig;
use warpline::kernels::tc_gemm::{
    reference_entry, tolerance, Activation, BLayout, Epilogue, HostB, Matrix, MatrixMut,
    SwapAbConfig, TcGemm, TcGemmOptions, TcOutput, WeightsBeforeWait,
};
use warpline::{bf16, Device, Error, MemPool};
use warpline_suite::support::{gpu_or_skip, normal, upload, upload_c};

fn seed() -> u64 {
    warpline_suite::support::gemm_seed("swap_ab_gemm")
}

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
    cfg: SwapAbConfig,
    act: Activation,
    bias: bool,
    /// Through `TcGemm::plan` with `GemmConfig::Auto` (no epilogue) instead of `plan_fused`.
    via_auto: bool,
    /// PDL with the weights before `griddepcontrol.wait`, two launches back to back (beta 0).
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
            cfg: SwapAbConfig::default(),
            act: Activation::None,
            bias: false,
            via_auto: false,
            pdl_early: false,
        }
    }
}

fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + (0.797_884_560_802_865_4 * (x + 0.044715 * x * x * x)).tanh())
}

/// Absolute error of the kernel's GELU beyond the pre-activation error: `tanh.approx`.
fn gelu_approx(x: f64) -> f64 {
    0.5 * x.abs() * 2f64.powf(-10.9)
}

fn tc_or_skip(test: &str) -> Option<(Device, ())> {
    let dev = gpu_or_skip(test)?;
    if dev.capabilities().compute_capability != (9, 0) {
        warpline_suite::support::skip(test, "the swap-AB GEMM needs compute capability 9.0");
        return None;
    }
    Some((dev, ()))
}

fn run_case<O: TcOutput<bf16>>(dev: &Device, tc: &TcGemm<'_>, case: Case) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(dev, 0).unwrap();
    let (m, n, k) = (case.m, case.n, case.k);
    let swiglu = case.act == Activation::SwiGlu;
    let nc = if swiglu { n / 2 } else { n };
    let lda = k.next_multiple_of(8);
    let ldb = k.next_multiple_of(8) + 8; // one 16-byte unit of NaN padding per weight row
    let step = 16 / size_of::<O>();
    let ldc = nc.next_multiple_of(step) + step;
    let (da, ha) = upload::<bf16>(&pool, &stream, &mut rng, m, k, lda);
    let (db, hb) = upload::<bf16>(&pool, &stream, &mut rng, n, k, ldb);
    let bias_host: Vec<f32> = normal(&mut rng, n);
    let mut dbias = pool.alloc_async::<f32>(&stream, n).unwrap();
    dbias.copy_from_host(&bias_host).unwrap();
    let c_len = m * ldc;
    let (mut dc, c0) = upload_c::<bf16, O>(
        &pool,
        &stream,
        &mut rng,
        m,
        nc,
        ldc,
        c_len,
        case.beta != 0.0,
    );
    {
        let a = Matrix::new(da.as_view(), m, k, lda);
        let b = Matrix::new(db.as_view(), n, k, ldb);
        let c = MatrixMut::new(dc.as_view_mut(), m, nc, ldc);
        let mut cfg = case.cfg;
        if case.pdl_early {
            // SAFETY: no kernel on this fresh stream writes B (it was written by a copy).
            cfg.weights_before_wait = Some(unsafe { WeightsBeforeWait::promise() });
        }
        let opts = TcGemmOptions {
            swap_ab: cfg,
            pdl: case.pdl_early,
            config: if case.via_auto {
                GemmConfig::Auto
            } else {
                GemmConfig::SwapAb
            },
            ..Default::default()
        };
        let plan = if case.via_auto {
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
        } else {
            let epi = Epilogue {
                activation: case.act,
                bias: case.bias.then(|| dbias.as_view()),
            };
            tc.plan_fused(
                &stream,
                a,
                b,
                BLayout::ColMajor,
                c,
                case.alpha,
                case.beta,
                epi,
                &opts,
            )
        }
        .unwrap_or_else(|e| panic!("{case:?}: {e}"));
        assert_eq!(plan.gemm_config(), GemmConfig::SwapAb, "{case:?}");
        let shape = plan.swap_ab_shapes()[0];
        if let Some(t) = case.cfg.tokens {
            assert_eq!(shape.tokens, t);
        }
        if let Some(s) = case.cfg.ksplit {
            assert_eq!(shape.ksplit, s);
        }
        plan.launch().unwrap();
        if case.pdl_early {
            assert_eq!(
                case.beta, 0.0,
                "two launches compute the same C only at beta = 0"
            );
            plan.launch().unwrap();
        }
    }
    let mut got = vec![O::from_f32(0.0); c_len];
    dc.copy_to_host(&mut got).unwrap();
    let hb = HostB {
        data: &hb,
        pitch: ldb,
        layout: BLayout::ColMajor,
    };
    let rounding = O::ROUNDING;
    // Pre-activation value and its bound for weight row j of token i.
    let pre = |i: usize, j: usize| -> (f64, f64) {
        let (s, abs) = reference_entry(&ha, lda, &hb, k, i, j).unwrap();
        let b = if case.bias { bias_host[j] as f64 } else { 0.0 };
        let v = case.alpha as f64 * s + b;
        (v, tolerance(v, abs, case.alpha as f64, b, 0.0))
    };
    for i in 0..m {
        for j in 0..nc {
            let old = if case.beta != 0.0 {
                c0[i * ldc + j] as f64
            } else {
                0.0
            };
            let (y, e) = match case.act {
                Activation::None => pre(i, j),
                Activation::Silu => {
                    let (x, e) = pre(i, j);
                    (silu(x), 1.1 * e + 1e-6 * x.abs())
                }
                Activation::Gelu => {
                    let (x, e) = pre(i, j);
                    (gelu(x), 1.13 * e + gelu_approx(x) + 1e-6 * x.abs())
                }
                Activation::SwiGlu => {
                    let ((g, eg), (u, eu)) = (pre(i, 2 * j), pre(i, 2 * j + 1));
                    let y = silu(g) * u;
                    (y, 1.1 * u.abs() * eg + silu(g).abs() * eu + 1e-6 * y.abs())
                }
            };
            let want = y + case.beta as f64 * old;
            let tol = e + 1e-3 * (case.beta as f64 * old).abs() + rounding * want.abs() + 1e-6;
            let g = got[i * ldc + j].to_f32() as f64;
            assert!(
                (g - want).abs() <= tol,
                "{} {case:?}: C[{i}][{j}] = {g}, want {want} (tolerance {tol})",
                std::any::type_name::<O>()
            );
        }
        for j in nc..ldc {
            assert!(
                got[i * ldc + j].to_f32().is_nan(),
                "{case:?}: C padding [{i}][{j}] was written"
            );
        }
    }
}

const MS: [usize; 9] = [1, 2, 7, 16, 33, 64, 127, 128, 129];

/// Every M of the issue through the automatic tile and ksplit, f32 out, beta 0 and not, K a
/// multiple of 8 (2056) and not (2050).
#[test]
fn issue20_swap_ab_gemm_all_m_auto_tiles() {
    let Some((dev, ())) = tc_or_skip("swap_ab_gemm all M") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for m in MS {
        for k in [2056, 2050] {
            for (alpha, beta) in [(1.0, 0.0), (0.75, -1.5)] {
                run_case::<f32>(
                    &dev,
                    &tc,
                    Case {
                        alpha,
                        beta,
                        ..Case::new(m, 1003, k)
                    },
                );
            }
        }
    }
}

/// Every token tile with every cluster size (the DSMEM reduction over 1, 2, 3, 4, 8 CTAs), BF16
/// and f32 out; M = 1 and a tail of the tile.
#[test]
fn issue20_swap_ab_gemm_every_tile_and_ksplit() {
    let Some((dev, ())) = tc_or_skip("swap_ab_gemm tiles") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    // WARPLINE_SWAPAB_QUICK=1 (the sanitizer runs): one M per tile and cluster size.
    let quick = std::env::var("WARPLINE_SWAPAB_QUICK").as_deref() == Ok("1");
    for tokens in [8u32, 16, 32, 64, 128] {
        for ksplit in [1u32, 2, 3, 4, 8] {
            let ms = [tokens as usize + 5, 1, tokens as usize - 3];
            for &m in &ms[..if quick { 1 } else { 3 }] {
                let case = Case {
                    cfg: SwapAbConfig {
                        tokens: Some(tokens),
                        ksplit: Some(ksplit),
                        ..Default::default()
                    },
                    beta: 0.5,
                    ..Case::new(m.max(1), 333, 1100)
                };
                run_case::<f32>(&dev, &tc, case);
                run_case::<bf16>(&dev, &tc, case);
            }
        }
    }
}

/// Every fused epilogue, with and without bias, residual (beta = 1) or not, both outputs.
#[test]
fn issue20_swap_ab_gemm_fused_epilogues() {
    let Some((dev, ())) = tc_or_skip("swap_ab_gemm epilogues") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for act in [
        Activation::None,
        Activation::Silu,
        Activation::Gelu,
        Activation::SwiGlu,
    ] {
        for (bias, beta) in [(false, 0.0), (true, 0.0), (true, 1.0)] {
            for m in [3, 40] {
                let case = Case {
                    act,
                    bias,
                    beta,
                    alpha: 0.125,
                    ..Case::new(m, 1002, 2056)
                };
                run_case::<f32>(&dev, &tc, case);
                run_case::<bf16>(&dev, &tc, case);
            }
        }
    }
}

/// PDL with the weights loaded before `griddepcontrol.wait`, launched back to back (the second
/// launch's early weight reads overlap the first; both write the same C at beta = 0).
#[test]
fn issue20_swap_ab_gemm_pdl_weights_before_wait() {
    let Some((dev, ())) = tc_or_skip("swap_ab_gemm pdl") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for m in [1, 16, 64] {
        run_case::<f32>(
            &dev,
            &tc,
            Case {
                pdl_early: true,
                ..Case::new(m, 1003, 2056)
            },
        );
    }
}

/// `GemmConfig::Auto` sends 1..=128 rows with a column-major BF16 B to the swap-AB kernel, except
/// at most 8 rows with at most 4096 columns (the decode kernel) and 65 to 128 rows with 12288
/// columns or more (the ping-pong kernel; both in tests/tc_gemm.rs): one token with 4100 columns.
#[test]
fn issue20_swap_ab_gemm_through_auto() {
    let Some((dev, ())) = tc_or_skip("swap_ab_gemm auto") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for (m, n) in [(1, 4100), (17, 1003), (64, 1003), (128, 1003)] {
        run_case::<bf16>(
            &dev,
            &tc,
            Case {
                via_auto: true,
                beta: -1.0,
                ..Case::new(m, n, 2056)
            },
        );
    }
}

/// Bad input gets a typed error before anything is launched: odd N with SwiGLU, a C of the
/// wrong width, a short bias, a row-major B, a ksplit above the k-blocks, cooperative options.
#[test]
fn issue20_swap_ab_gemm_refuses_bad_input() {
    let Some((dev, ())) = tc_or_skip("swap_ab_gemm validation") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let (m, n, k) = (4, 101, 128);
    let a = pool.alloc_async::<bf16>(&stream, m * k).unwrap();
    let b = pool.alloc_async::<bf16>(&stream, n * k).unwrap();
    let bias = pool.alloc_async::<f32>(&stream, n - 1).unwrap();
    let mut c = pool.alloc_async::<f32>(&stream, m * 112).unwrap();
    let opts = TcGemmOptions {
        config: GemmConfig::SwapAb,
        ..Default::default()
    };
    fn mk(c: &mut warpline::DeviceBuffer<f32>, cols: usize) -> MatrixMut<'_, f32> {
        MatrixMut::new(c.as_view_mut(), 4, cols, 112)
    }
    let am = || Matrix::new(a.as_view(), m, k, k);
    let bm = || Matrix::new(b.as_view(), n, k, k);
    let epi = |act| Epilogue {
        activation: act,
        bias: None,
    };
    // The error of `plan_fused` on A and these operands (each case must be refused).
    let mut refused = |b: Matrix<'_, bf16>,
                       layout: BLayout,
                       c_cols: usize,
                       epilogue: Epilogue<'_>,
                       opts: &TcGemmOptions|
     -> Error {
        tc.plan_fused(
            &stream,
            am(),
            b,
            layout,
            mk(&mut c, c_cols),
            1.0,
            0.0,
            epilogue,
            opts,
        )
        .unwrap_err()
    };
    // SwiGLU with odd N.
    assert!(matches!(
        refused(
            bm(),
            BLayout::ColMajor,
            n / 2,
            epi(Activation::SwiGlu),
            &opts
        ),
        Error::BadShape { .. }
    ));
    // C as wide as N with SwiGLU (even N), and C of the wrong width without it.
    let b100 = || Matrix::new(b.as_view(), 100, k, k);
    assert!(matches!(
        refused(
            b100(),
            BLayout::ColMajor,
            100,
            epi(Activation::SwiGlu),
            &opts
        ),
        Error::LengthMismatch { .. }
    ));
    assert!(matches!(
        refused(bm(), BLayout::ColMajor, 100, epi(Activation::None), &opts),
        Error::LengthMismatch { .. }
    ));
    // A bias shorter than N.
    let short = Epilogue {
        activation: Activation::Silu,
        bias: Some(bias.as_view()),
    };
    assert!(matches!(
        refused(bm(), BLayout::ColMajor, n, short, &opts),
        Error::LengthMismatch { .. }
    ));
    // Row-major B.
    let brow = Matrix::new(b.as_view(), k, n, n);
    assert!(matches!(
        refused(brow, BLayout::RowMajor, n, epi(Activation::None), &opts),
        Error::BadShape { .. }
    ));
    // K = 128 has 2 k-blocks: ksplit 4 is refused; a cooperative knob too.
    let o4 = TcGemmOptions {
        swap_ab: SwapAbConfig {
            tokens: None,
            ksplit: Some(4),
            ..Default::default()
        },
        ..opts
    };
    assert!(matches!(
        refused(bm(), BLayout::ColMajor, n, epi(Activation::None), &o4),
        Error::BadShape { .. }
    ));
    let knob = TcGemmOptions {
        cluster: Some(2),
        ..opts
    };
    assert!(matches!(
        refused(bm(), BLayout::ColMajor, n, epi(Activation::None), &knob),
        Error::BadShape { .. }
    ));
    // Another configuration with a fused epilogue.
    let coop = TcGemmOptions {
        config: GemmConfig::Cooperative128x256,
        ..opts
    };
    assert!(matches!(
        refused(bm(), BLayout::ColMajor, n, epi(Activation::Gelu), &coop),
        Error::BadShape { .. }
    ));
    stream.synchronize().unwrap();
}
