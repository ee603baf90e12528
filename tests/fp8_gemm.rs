//! FP8 tensor-core GEMM (issue 20): `TcGemm::plan_fp8` against an f64 CPU reference computed from
//! the exact decoded FP8 values, with the bound of `fp8_tolerance` (ceil(K / 32) * 2^-12 of
//! `|alpha * a_scale * b_scale| * sum_k |a b|` for the FP8 tensor cores' accumulation, plus the
//! output's half ulp), on fresh random inputs (seed printed, `WARPLINE_SEED` replays it), NaN
//! poisoned outputs and padding, shapes that are multiples of no tile; cuBLASLt FP8 in the same
//! run; typed errors before anything is launched. GPU tests skip without a driver
//! (`WARPLINE_REQUIRE_GPU=1` makes a skip fail); the PTX checks always run.

use rand::SeedableRng;
use warpline::kernels::tc_gemm::{
    fp8_tolerance, reference_entry, BLayout, CublasLtFp8, Fp8Input, Fp8Scales, HostB, Matrix,
    MatrixMut, TcGemm, TcGemmOptions, TcOutput,
};
use warpline::kernels::GemmConfig;
use warpline::{bf16, Device, DeviceBuffer, Error, MemPool, Stream, F8E4M3, F8E5M2};
use warpline_suite::support::{fp8_matrix, gpu_or_skip, pitch8, pitch_out, upload_c};

fn seed() -> u64 {
    warpline_suite::support::gemm_seed("fp8_gemm")
}

/// A `rows x cols` FP8 matrix of `spread * N(0, 1)` values rounded to `T`, with row pitch
/// `pitch`; the padding holds the NaN code 0x7F (a kernel that read it would produce NaN).
/// Returns the buffer and the decoded values (padding NaN).
fn upload_fp8<T: Fp8Input>(
    pool: &MemPool,
    stream: &Stream,
    rng: &mut rand::rngs::StdRng,
    rows: usize,
    cols: usize,
    pitch: usize,
    spread: f32,
) -> (DeviceBuffer<T>, Vec<f32>) {
    let (typed, host) = fp8_matrix::<T>(rng, rows, cols, pitch, spread);
    let mut buf = pool.alloc_async::<T>(stream, typed.len()).unwrap();
    buf.copy_from_host(&typed).unwrap();
    (buf, host)
}

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
    /// Per-tensor scales (None: no scale pointer, 1.0).
    a_scale: Option<f32>,
    b_scale: Option<f32>,
    cluster: Option<u32>,
    pdl: bool,
    /// The ping-pong entry (E4M3 B only).
    pingpong: bool,
    /// Rows and columns checked (None: all).
    sample: Option<usize>,
}

impl Case {
    fn new(m: usize, n: usize, k: usize) -> Self {
        Self {
            m,
            n,
            k,
            alpha: 1.0,
            beta: 0.0,
            a_scale: None,
            b_scale: None,
            cluster: None,
            pdl: false,
            pingpong: false,
            sample: (m * n * k > 1 << 24).then_some(12),
        }
    }
}

/// Rows (or columns) to check out of `n`: all, or `s` of them (first, last, random).
fn picks(rng: &mut rand::rngs::StdRng, n: usize, s: Option<usize>) -> Vec<usize> {
    use rand::Rng;
    match s {
        Some(s) if s < n => {
            let mut v = vec![0, n - 1];
            v.extend((0..s - 2).map(|_| rng.random_range(0..n)));
            v
        }
        _ => (0..n).collect(),
    }
}

/// Runs one case (E4M3 A, B of `B`, C of `O`) and checks every sampled element against the f64
/// reference with `fp8_tolerance`, and that C's padding is still NaN.
fn run_case<B: Fp8Input, O: TcOutput<bf16>>(tc: &TcGemm<'_>, case: Case) {
    let dev = tc.device();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(dev, 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let Case { m, n, k, .. } = case;
    let (lda, ldb, ldc) = (pitch8(k, 1), pitch8(k, 0), pitch_out::<O>(n));
    // Spreads that use E4M3's exponent range (|x| up to ~30) and E5M2's coarser steps.
    let (da, ha) = upload_fp8::<F8E4M3>(&pool, &stream, &mut rng, m, k, lda, 8.0);
    let (db, hb) = upload_fp8::<B>(&pool, &stream, &mut rng, n, k, ldb, 0.5);
    let c_len = (m - 1) * ldc + n;
    let (mut dc, c0) =
        upload_c::<bf16, O>(&pool, &stream, &mut rng, m, n, ldc, c_len, case.beta != 0.0);
    let scale_buf = |v: Option<f32>| {
        v.map(|v| {
            let mut b = pool.alloc_async::<f32>(&stream, 1).unwrap();
            b.copy_from_host(&[v]).unwrap();
            b
        })
    };
    let (sa, sb) = (scale_buf(case.a_scale), scale_buf(case.b_scale));
    let scales = Fp8Scales {
        a: sa.as_ref().map(|b| b.as_view()),
        b: sb.as_ref().map(|b| b.as_view()),
    };
    let opts = TcGemmOptions {
        cluster: case.cluster,
        pdl: case.pdl,
        pingpong: case.pingpong,
        ..Default::default()
    };
    tc.gemm_fp8(
        &stream,
        Matrix::new(da.as_view(), m, k, lda),
        Matrix::new(db.as_view(), n, k, ldb),
        BLayout::ColMajor,
        MatrixMut::new(dc.as_view_mut(), m, n, ldc),
        scales,
        case.alpha,
        case.beta,
        &opts,
    )
    .unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let mut got = vec![O::from_f32(0.0); c_len];
    dc.copy_to_host(&mut got).unwrap();
    let b = HostB {
        data: &hb,
        pitch: ldb,
        layout: BLayout::ColMajor,
    };
    let alpha_s =
        case.alpha as f64 * case.a_scale.unwrap_or(1.0) as f64 * case.b_scale.unwrap_or(1.0) as f64;
    let rows = picks(&mut rng, m, case.sample);
    let cols = picks(&mut rng, n, case.sample);
    let check = |i: usize, j: usize| {
        let (s, abs) = reference_entry(&ha, lda, &b, k, i, j).unwrap();
        let old = if case.beta != 0.0 {
            c0[i * ldc + j] as f64
        } else {
            0.0
        };
        let want = alpha_s * s + case.beta as f64 * old;
        let g = got[i * ldc + j].to_f32() as f64;
        let tol = fp8_tolerance(want, abs, k, alpha_s, case.beta as f64 * old, O::ROUNDING);
        assert!(
            (g - want).abs() <= tol,
            "e4m3 x {} -> {}, {case:?}: C[{i}][{j}] = {g}, want {want} (tolerance {tol})",
            B::NAME,
            std::any::type_name::<O>()
        );
    };
    for &i in &rows {
        for j in 0..n {
            check(i, j);
        }
    }
    if case.sample.is_some() {
        for &j in &cols {
            for i in 0..m {
                check(i, j);
            }
        }
    }
    for r in 0..m - 1 {
        for c in n..ldc {
            assert!(
                got[r * ldc + c].to_f32().is_nan(),
                "{case:?}: C padding [{r}][{c}] was written"
            );
        }
    }
}

fn tc_or_skip(test: &str) -> Option<Device> {
    let dev = gpu_or_skip(test)?;
    if dev.capabilities().compute_capability != (9, 0) {
        warpline_suite::support::skip(test, "the device is not compute capability 9.0 (sm_90a)");
        return None;
    }
    Some(dev)
}

/// M, N, K that are multiples of no tile (128 x 256, k-block 128): 1 x 1 x 1, a partial
/// k-block, several k-blocks with a tail, many tiles with edges on every side.
const SIZES: [(usize, usize, usize); 5] = [
    (1, 1, 1),
    (127, 129, 65),
    (129, 300, 1000),
    (1000, 1000, 1040),
    (4097, 257, 4099),
];

// ------------------------------------------------------------------------------------------------
// GPU tests
// ------------------------------------------------------------------------------------------------

#[test]
fn e4m3_f32_and_bf16_out_all_sizes_both_clusters() {
    let Some(dev) = tc_or_skip("fp8 e4m3 sizes") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for (m, n, k) in SIZES {
        for cluster in [Some(1), Some(2)] {
            let case = Case {
                cluster,
                ..Case::new(m, n, k)
            };
            run_case::<F8E4M3, f32>(&tc, case);
            run_case::<F8E4M3, bf16>(&tc, case);
            let pp = Case {
                pingpong: true,
                ..case
            };
            run_case::<F8E4M3, f32>(&tc, pp);
            run_case::<F8E4M3, bf16>(&tc, pp);
        }
    }
}

#[test]
fn e5m2_b_all_sizes() {
    let Some(dev) = tc_or_skip("fp8 e5m2 B") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for (m, n, k) in SIZES {
        run_case::<F8E5M2, f32>(&tc, Case::new(m, n, k));
        run_case::<F8E5M2, bf16>(&tc, Case::new(m, n, k));
    }
}

/// Per-tensor scales from device memory (powers of two and not), alpha, beta != 0 (C read
/// back, in f32 and bf16), PDL launches.
#[test]
fn scales_alpha_beta_and_pdl() {
    let Some(dev) = tc_or_skip("fp8 scales") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for (m, n, k) in [(127, 129, 65), (300, 520, 272), (1000, 1000, 1040)] {
        for (a_scale, b_scale, alpha, beta) in [
            (Some(0.5), Some(4.0), 1.0, 0.0),
            (Some(0.013), None, -1.5, 0.0),
            (None, Some(3.7), 1.0, 0.5),
            (Some(1.25), Some(0.75), 0.5, -2.0),
        ] {
            let case = Case {
                a_scale,
                b_scale,
                alpha,
                beta,
                pdl: true,
                ..Case::new(m, n, k)
            };
            run_case::<F8E4M3, f32>(&tc, case);
            run_case::<F8E4M3, bf16>(&tc, case);
            run_case::<F8E5M2, bf16>(&tc, case);
        }
    }
}

/// Small cases for compute-sanitizer (`scripts/sanitize.sh`, label `fp8_gemm`): every FP8
/// entry (ping-pong included), clusters 1 and 2, f32 and bf16 C (N = 302: a ragged f32 row end, the direct-store
/// chunk), beta and scales, PDL.
#[test]
fn sanitizer_sized_cases() {
    let Some(dev) = tc_or_skip("fp8 sanitizer cases") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for cluster in [Some(1), Some(2)] {
        let case = Case {
            cluster,
            a_scale: Some(0.5),
            b_scale: Some(1.5),
            beta: 0.5,
            pdl: true,
            ..Case::new(300, 302, 200)
        };
        run_case::<F8E4M3, f32>(&tc, case);
        run_case::<F8E4M3, bf16>(&tc, Case { beta: 0.0, ..case });
        run_case::<F8E5M2, bf16>(&tc, case);
        run_case::<F8E4M3, f32>(
            &tc,
            Case {
                pingpong: true,
                ..case
            },
        );
    }
}

/// The scales are read when the kernel runs, not when the plan is made: one plan launched
/// twice with the scale changed in between (stream-ordered copy) gives both results.
#[test]
fn scales_are_read_at_run_time() {
    let Some(dev) = tc_or_skip("fp8 scales at run time") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let (m, n, k) = (130, 260, 200);
    let (lda, ldb) = (pitch8(k, 0), pitch8(k, 0));
    let (da, _) = upload_fp8::<F8E4M3>(&pool, &stream, &mut rng, m, k, lda, 4.0);
    let (db, _) = upload_fp8::<F8E4M3>(&pool, &stream, &mut rng, n, k, ldb, 1.0);
    let mut sa = pool.alloc_async::<f32>(&stream, 1).unwrap();
    let mut sb = pool.alloc_async::<f32>(&stream, 1).unwrap();
    sa.copy_from_host(&[1.0]).unwrap();
    sb.copy_from_host(&[1.0]).unwrap();
    let mut c = pool.alloc_async::<f32>(&stream, m * n).unwrap();
    c.fill_async(f32::NAN).unwrap();
    let mut first = vec![0f32; m * n];
    let mut second = vec![0f32; m * n];
    {
        let plan = tc
            .plan_fp8(
                &stream,
                Matrix::new(da.as_view(), m, k, lda),
                Matrix::new(db.as_view(), n, k, ldb),
                BLayout::ColMajor,
                MatrixMut::new(c.as_view_mut(), m, n, n),
                Fp8Scales::new(sa.as_view(), sb.as_view()),
                1.0,
                0.0,
                &TcGemmOptions::default(),
            )
            .unwrap();
        plan.launch().unwrap();
        drop(plan);
    }
    c.copy_to_host(&mut first).unwrap();
    sb.copy_from_host(&[-0.25]).unwrap();
    tc.gemm_fp8(
        &stream,
        Matrix::new(da.as_view(), m, k, lda),
        Matrix::new(db.as_view(), n, k, ldb),
        BLayout::ColMajor,
        MatrixMut::new(c.as_view_mut(), m, n, n),
        Fp8Scales::new(sa.as_view(), sb.as_view()),
        1.0,
        0.0,
        &TcGemmOptions::default(),
    )
    .unwrap();
    c.copy_to_host(&mut second).unwrap();
    // -0.25 is a power of two: the products scale exactly.
    for (i, (x, y)) in first.iter().zip(&second).enumerate() {
        assert!(x.is_finite(), "[{i}] {x}");
        assert_eq!(*y, -0.25 * x, "[{i}]: {x} then {y}");
    }
}

/// cuBLASLt FP8 (TN, scale pointers, with and without FAST_ACCUM) in the same run: both within
/// the f64 bound, and within twice the bound of each other.
#[test]
fn matches_cublaslt_fp8() {
    let Some(dev) = tc_or_skip("fp8 vs cuBLASLt") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let (m, n, k) = (320, 528, 1024);
    let (da, ha) = upload_fp8::<F8E4M3>(&pool, &stream, &mut rng, m, k, k, 8.0);
    let (db, hb) = upload_fp8::<F8E4M3>(&pool, &stream, &mut rng, n, k, k, 0.5);
    let mut sa = pool.alloc_async::<f32>(&stream, 1).unwrap();
    let mut sb = pool.alloc_async::<f32>(&stream, 1).unwrap();
    sa.copy_from_host(&[0.75]).unwrap();
    sb.copy_from_host(&[0.5]).unwrap();
    let lt = CublasLtFp8::new(&dev, &stream).unwrap();
    let a = Matrix::new(da.as_view(), m, k, k);
    let b = Matrix::new(db.as_view(), n, k, k);
    let scales = Fp8Scales::new(sa.as_view(), sb.as_view());
    let mut ours = pool.alloc_async::<bf16>(&stream, m * n).unwrap();
    ours.fill_async(bf16::NAN).unwrap();
    tc.gemm_fp8(
        &stream,
        a,
        b,
        BLayout::ColMajor,
        MatrixMut::new(ours.as_view_mut(), m, n, n),
        scales,
        1.0,
        0.0,
        &TcGemmOptions::default(),
    )
    .unwrap();
    let mut x = vec![bf16::ZERO; m * n];
    ours.copy_to_host(&mut x).unwrap();
    let hbm = HostB {
        data: &hb,
        pitch: k,
        layout: BLayout::ColMajor,
    };
    for fast_accum in [false, true] {
        let mut theirs = pool.alloc_async::<bf16>(&stream, m * n).unwrap();
        theirs.fill_async(bf16::NAN).unwrap();
        lt.plan(
            a,
            b,
            BLayout::ColMajor,
            MatrixMut::new(theirs.as_view_mut(), m, n, n),
            scales,
            1.0,
            0.0,
            fast_accum,
        )
        .unwrap()
        .launch()
        .unwrap();
        let mut y = vec![bf16::ZERO; m * n];
        theirs.copy_to_host(&mut y).unwrap();
        for i in 0..m {
            for j in 0..n {
                let (s, abs) = reference_entry(&ha, k, &hbm, k, i, j).unwrap();
                let want = 0.375 * s;
                let tol = fp8_tolerance(want, abs, k, 0.375, 0.0, 1.0 / 256.0);
                let (p, q) = (x[i * n + j].to_f64(), y[i * n + j].to_f64());
                assert!(
                    (p - want).abs() <= tol,
                    "ours [{i}][{j}] {p}, want {want} ({tol})"
                );
                assert!(
                    (q - want).abs() <= tol,
                    "cuBLASLt (fast_accum {fast_accum}) [{i}][{j}] {q}, want {want} ({tol})"
                );
                assert!(
                    (p - q).abs() <= 2.0 * tol,
                    "[{i}][{j}]: ours {p}, cuBLASLt {q}"
                );
            }
        }
    }
}

/// Typed errors with nothing launched: the NaN poison in C stays.
#[test]
fn bad_input_is_refused_before_launch() {
    let Some(dev) = tc_or_skip("fp8 errors") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let other = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let a = pool.alloc_async::<F8E4M3>(&stream, 64 * 64).unwrap();
    let b = pool.alloc_async::<F8E4M3>(&stream, 64 * 64).unwrap();
    let b5 = pool.alloc_async::<F8E5M2>(&stream, 64 * 64).unwrap();
    let s_empty = pool.alloc_async::<f32>(&stream, 0).ok();
    let s_other = pool.alloc_async::<f32>(&other, 1).unwrap();
    let mut c = pool.alloc_async::<f32>(&stream, 64 * 64).unwrap();
    c.fill_async(f32::NAN).unwrap();
    let am = Matrix::new(a.as_view(), 64, 64, 64);
    let bm = Matrix::new(b.as_view(), 64, 64, 64);
    let opts = TcGemmOptions::default();
    // Row-major B.
    let e = tc
        .gemm_fp8(
            &stream,
            am,
            bm,
            BLayout::RowMajor,
            MatrixMut::new(c.as_view_mut(), 64, 64, 64),
            Fp8Scales::default(),
            1.0,
            0.0,
            &opts,
        )
        .unwrap_err();
    assert!(matches!(e, Error::Fp8Layout { .. }), "{e}");
    // K pitch of 40 bytes.
    let e = tc
        .gemm_fp8(
            &stream,
            Matrix::new(a.as_view(), 64, 40, 40),
            Matrix::new(b.as_view(), 64, 40, 48),
            BLayout::ColMajor,
            MatrixMut::new(c.as_view_mut(), 64, 64, 64),
            Fp8Scales::default(),
            1.0,
            0.0,
            &opts,
        )
        .unwrap_err();
    assert!(matches!(e, Error::PitchAlignment { pitch: 40, .. }), "{e}");
    // Decode; ping-pong with an E5M2 B (no such entry).
    let e = tc
        .gemm_fp8(
            &stream,
            am,
            bm,
            BLayout::ColMajor,
            MatrixMut::new(c.as_view_mut(), 64, 64, 64),
            Fp8Scales::default(),
            1.0,
            0.0,
            &TcGemmOptions {
                config: GemmConfig::Decode,
                ..opts
            },
        )
        .unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    let e = tc
        .gemm_fp8(
            &stream,
            am,
            Matrix::new(b5.as_view(), 64, 64, 64),
            BLayout::ColMajor,
            MatrixMut::new(c.as_view_mut(), 64, 64, 64),
            Fp8Scales::default(),
            1.0,
            0.0,
            &TcGemmOptions {
                pingpong: true,
                ..opts
            },
        )
        .unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    // A scale on another stream; an empty scale.
    let e = tc
        .gemm_fp8(
            &stream,
            am,
            bm,
            BLayout::ColMajor,
            MatrixMut::new(c.as_view_mut(), 64, 64, 64),
            Fp8Scales {
                a: Some(s_other.as_view()),
                b: None,
            },
            1.0,
            0.0,
            &opts,
        )
        .unwrap_err();
    assert!(matches!(e, Error::WrongStream { .. }), "{e}");
    if let Some(s) = &s_empty {
        let e = tc
            .gemm_fp8(
                &stream,
                am,
                bm,
                BLayout::ColMajor,
                MatrixMut::new(c.as_view_mut(), 64, 64, 64),
                Fp8Scales {
                    a: None,
                    b: Some(s.as_view()),
                },
                1.0,
                0.0,
                &opts,
            )
            .unwrap_err();
        assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    }
    // cuBLASLt refuses a row-major B the same way.
    let lt = CublasLtFp8::new(&dev, &stream).unwrap();
    let e = lt
        .plan(
            am,
            bm,
            BLayout::RowMajor,
            MatrixMut::new(c.as_view_mut(), 64, 64, 64),
            Fp8Scales::default(),
            1.0,
            0.0,
            false,
        )
        .err()
        .unwrap();
    assert!(matches!(e, Error::Fp8Layout { .. }), "{e}");
    let mut host = vec![0f32; 64 * 64];
    c.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|v| v.is_nan()), "C was written");
}

// ------------------------------------------------------------------------------------------------
// No GPU needed
// ------------------------------------------------------------------------------------------------

/// The text of entry `name` of the sm_90a module.
fn sm90a_entry(name: &str) -> &'static str {
    let ptx = warpline::SM90A_PTX;
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("{name} is not an entry of the sm_90a module"));
    let rest = &ptx[start..];
    let end = rest[1..].find(".entry ").map_or(rest.len(), |i| i + 1);
    &rest[..end]
}

/// The FP8 entries issue the FP8 wgmma (QGMMA in SASS; `scripts/fp8-sass.sh` checks the SASS
/// where cuobjdump is installed), k32 steps on 128-byte k-blocks, and no 16-bit wgmma.
#[test]
fn fp8_entries_use_the_e4m3_wgmma() {
    for (name, inst) in [
        (
            "tc_gemm_e4m3_bcol",
            "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3",
        ),
        (
            "tc_gemm_e4m3_bcol_pingpong",
            "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3",
        ),
        (
            "tc_gemm_e4m3_e5m2_bcol",
            "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e5m2",
        ),
    ] {
        let body = sm90a_entry(name);
        assert!(body.contains(inst), "{name} has no {inst}");
        assert!(!body.contains("k16.f32.bf16"), "{name} has a bf16 wgmma");
        assert!(body.contains("setmaxnreg"), "{name} lost setmaxnreg");
        assert!(
            body.contains(".maxntid 384, 1, 1"),
            "{name} lost its launch bounds"
        );
    }
    warpline::kernels::tc_gemm::check_module_entries(warpline::SM90A_PTX).unwrap();
}

/// The SASS of the FP8 entries holds QGMMA and no HGMMA (what `scripts/fp8-sass.sh` checks):
/// ptxas `-arch=sm_90a` on the embedded module, then `cuobjdump -sass`. Runs where cuobjdump is
/// found (`$CUOBJDUMP`, PATH, or `~/.cache/warpline/cuda-tools`, where `INSTALL=1
/// scripts/fp8-sass.sh` puts it); otherwise prints why it is skipped (no GPU is involved).
#[test]
fn fp8_sass_has_qgmma_where_cuobjdump_is_installed() {
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    let cuobjdump = std::env::var_os("CUOBJDUMP")
        .map(std::path::PathBuf::from)
        .or_else(|| {
            std::env::var_os("PATH").and_then(|p| {
                std::env::split_paths(&p)
                    .map(|d| d.join("cuobjdump"))
                    .find(|c| c.is_file())
            })
        })
        .or_else(|| {
            let c = std::path::PathBuf::from(home)
                .join(".cache/warpline/cuda-tools/nvidia/cu13/bin/cuobjdump");
            c.is_file().then_some(c)
        });
    let (Some(cuobjdump), Some(ptxas)) = (cuobjdump, warpline_builder::ptxas::find()) else {
        eprintln!("SKIPPED fp8 SASS check: cuobjdump or ptxas not found (INSTALL=1 bash scripts/fp8-sass.sh installs cuobjdump)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("warpline-fp8-sass-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ptx, cubin) = (dir.join("sm90a.ptx"), dir.join("sm90a.cubin"));
    std::fs::write(&ptx, warpline::SM90A_PTX).unwrap();
    let st = std::process::Command::new(&ptxas)
        .args(["-arch=sm_90a", "-o"])
        .arg(&cubin)
        .arg(&ptx)
        .status()
        .unwrap();
    assert!(st.success(), "ptxas failed");
    let mut path = std::ffi::OsString::from(cuobjdump.parent().unwrap());
    path.push(":");
    path.push(std::env::var_os("PATH").unwrap_or_default());
    for (entry, want) in [
        ("tc_gemm_e4m3_bcol", "QGMMA.64x256x32.F32.E4M3.E4M3"),
        (
            "tc_gemm_e4m3_bcol_pingpong",
            "QGMMA.64x256x32.F32.E4M3.E4M3",
        ),
        ("tc_gemm_e4m3_e5m2_bcol", "QGMMA.64x256x32.F32.E4M3.E5M2"),
        (
            "tc_gemm_e4m3_bcol_block_scaled",
            "QGMMA.64x128x32.F32.E4M3.E4M3",
        ),
    ] {
        let out = std::process::Command::new(&cuobjdump)
            .args(["-sass", "-fun", entry])
            .arg(&cubin)
            .env("PATH", &path)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cuobjdump: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let sass = String::from_utf8_lossy(&out.stdout);
        assert!(sass.contains(want), "{entry}: no {want} in its SASS");
        assert!(!sass.contains("HGMMA"), "{entry}: HGMMA in its SASS");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
