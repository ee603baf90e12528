//! Block-scaled FP8 GEMM (issue 20, DeepSeek-V3 scales: `1 x 128` on A, `128 x 128` on B, applied
//! in FP32 between k-blocks): `TcGemm::plan_fp8_block_scaled` against an f64 CPU reference on the
//! dequantized inputs (`block_scaled_reference_entry`: the sum of `sa * sb * a * b`), with the
//! bound of `fp8_block_tolerance` (`(4 * 2^-12 + (ceil(K / 128) + 3) * 2^-24) * |alpha| *
//! sum_k |sa sb a b|`: at most four k32 steps in the FP8 tensor cores per k-block, then FP32;
//! plus the output's half ulp and `1e-3 |beta c0|`), on fresh random inputs (seed printed,
//! `WARPLINE_SEED` replays it) with per-block scales spanning 2^-8 .. 2^8 (so a missing,
//! transposed or shifted scale is far outside the bound: `the_bound_catches_misplaced_scales`
//! checks that on the CPU), NaN in every output, pitch and scale padding, and shapes that are
//! multiples of no tile (M in {1, 7, 64, 129, 300}, N = 391, K = 1000: a 104-deep last k-block
//! and a 7-wide last N block). GPU tests skip without a driver (`WARPLINE_REQUIRE_GPU=1` makes a
//! skip fail); the CPU tests always run.

use rand::{Rng, SeedableRng};
use warpline::kernels::tc_gemm::{
    block_scaled_reference_entry, fp8_block_tolerance, BLayout, Fp8BlockScales, Matrix, MatrixMut,
    TcGemm, TcGemmOptions, TcOutput, FP8_SCALE_BLOCK,
};
use warpline::{bf16, Device, DeviceBuffer, Error, MemPool, F8E4M3};
use warpline_suite::support::{fp8_matrix, gpu_or_skip, pitch8, pitch_out, upload_c};

fn seed() -> u64 {
    warpline_suite::support::gemm_seed("fp8_block_gemm")
}

/// Host copies of one problem: decoded FP8 A (`m x k`, pitch `lda`) and B (stored `n x k`,
/// pitch `ldb`), their raw codes, and the block scales in `Fp8BlockScales`'s layouts, every
/// padding element NaN.
struct Problem {
    k: usize,
    lda: usize,
    ldb: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    a_codes: Vec<F8E4M3>,
    b_codes: Vec<F8E4M3>,
    a_ld: usize,
    b_ld: usize,
    a_scales: Vec<f32>,
    b_scales: Vec<f32>,
}

/// `2^e * (1 + u / 2)` with `e` uniform in -8..=8 and `u` in [0, 1): scales over 2^-8 .. 2^8.5,
/// not all powers of two.
fn scale(rng: &mut rand::rngs::StdRng) -> f32 {
    let e: i32 = rng.random_range(-8..=8);
    2f32.powi(e) * (1.0 + rng.random::<f32>() / 2.0)
}

impl Problem {
    fn new(rng: &mut rand::rngs::StdRng, m: usize, n: usize, k: usize) -> Self {
        let (lda, ldb) = (pitch8(k, 1), pitch8(k, 0));
        // Spreads that use E4M3's exponent range (|x| up to ~30), as tests/fp8_gemm.rs.
        let (a_codes, a) = fp8_matrix::<F8E4M3>(rng, m, k, lda, 8.0);
        let (b_codes, b) = fp8_matrix::<F8E4M3>(rng, n, k, ldb, 0.5);
        let (kb, nb) = (k.div_ceil(FP8_SCALE_BLOCK), n.div_ceil(FP8_SCALE_BLOCK));
        // DeepGEMM's TMA-aligned pitch (a multiple of 4) plus 4, and a padded B pitch: the
        // kernel must use the pitches, and padding it reads would be NaN.
        let (a_ld, b_ld) = (m.next_multiple_of(4) + 4, kb + 3);
        let mut a_scales = vec![f32::NAN; (kb - 1) * a_ld + m];
        for kk in 0..kb {
            for i in 0..m {
                a_scales[kk * a_ld + i] = scale(rng);
            }
        }
        let mut b_scales = vec![f32::NAN; (nb - 1) * b_ld + kb];
        for j in 0..nb {
            for kk in 0..kb {
                b_scales[j * b_ld + kk] = scale(rng);
            }
        }
        Self {
            k,
            lda,
            ldb,
            a,
            b,
            a_codes,
            b_codes,
            a_ld,
            b_ld,
            a_scales,
            b_scales,
        }
    }

    /// `(sum, abs_sum)` of element (i, j) with the given scale arrays and pitches.
    fn reference_with(
        &self,
        a_scales: &[f32],
        a_ld: usize,
        b_scales: &[f32],
        b_ld: usize,
        i: usize,
        j: usize,
    ) -> (f64, f64) {
        block_scaled_reference_entry(
            &self.a, self.lda, &self.b, self.ldb, a_scales, a_ld, b_scales, b_ld, self.k, i, j,
        )
        .expect("reference indices inside the host copies")
    }

    fn reference(&self, i: usize, j: usize) -> (f64, f64) {
        self.reference_with(&self.a_scales, self.a_ld, &self.b_scales, self.b_ld, i, j)
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    beta: f32,
    cluster: Option<u32>,
    pdl: bool,
    /// Rows checked (None: all); every column of a checked row is checked.
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
            cluster: None,
            pdl: false,
            sample: (m * n * k > 1 << 26).then_some(24),
        }
    }
}

/// Runs one case with C of `O` and checks every checked element against the f64 reference with
/// `fp8_block_tolerance`, and that C's padding is still NaN.
fn run_case<O: TcOutput<bf16>>(tc: &TcGemm<'_>, case: Case) {
    let dev = tc.device();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(dev, 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let Case { m, n, k, .. } = case;
    let p = Problem::new(&mut rng, m, n, k);
    let ldc = pitch_out::<O>(n);
    let upload = |v: &[F8E4M3]| -> DeviceBuffer<F8E4M3> {
        let mut b = pool.alloc_async::<F8E4M3>(&stream, v.len()).unwrap();
        b.copy_from_host(v).unwrap();
        b
    };
    let upload_f32 = |v: &[f32]| -> DeviceBuffer<f32> {
        let mut b = pool.alloc_async::<f32>(&stream, v.len()).unwrap();
        b.copy_from_host(v).unwrap();
        b
    };
    let (da, db) = (upload(&p.a_codes), upload(&p.b_codes));
    let (dsa, dsb) = (upload_f32(&p.a_scales), upload_f32(&p.b_scales));
    let c_len = (m - 1) * ldc + n;
    let (mut dc, c0) =
        upload_c::<bf16, O>(&pool, &stream, &mut rng, m, n, ldc, c_len, case.beta != 0.0);
    let opts = TcGemmOptions {
        cluster: case.cluster,
        pdl: case.pdl,
        ..Default::default()
    };
    tc.gemm_fp8_block_scaled(
        &stream,
        Matrix::new(da.as_view(), m, k, p.lda),
        Matrix::new(db.as_view(), n, k, p.ldb),
        BLayout::ColMajor,
        MatrixMut::new(dc.as_view_mut(), m, n, ldc),
        Fp8BlockScales::new(dsa.as_view(), p.a_ld, dsb.as_view(), p.b_ld),
        case.alpha,
        case.beta,
        &opts,
    )
    .unwrap_or_else(|e| panic!("{case:?}: {e}"));
    let mut got = vec![O::from_f32(0.0); c_len];
    dc.copy_to_host(&mut got).unwrap();
    let rows: Vec<usize> = match case.sample {
        Some(s) if s < m => {
            let mut v = vec![0, m - 1];
            v.extend((0..s - 2).map(|_| rng.random_range(0..m)));
            v
        }
        _ => (0..m).collect(),
    };
    for &i in &rows {
        for j in 0..n {
            let (s, abs) = p.reference(i, j);
            let old = if case.beta != 0.0 {
                c0[i * ldc + j] as f64
            } else {
                0.0
            };
            let want = case.alpha as f64 * s + case.beta as f64 * old;
            let g = got[i * ldc + j].to_f32() as f64;
            let tol = fp8_block_tolerance(
                want,
                abs,
                k,
                case.alpha as f64,
                case.beta as f64 * old,
                O::ROUNDING,
            );
            assert!(
                (g - want).abs() <= tol,
                "block-scaled e4m3 -> {}, {case:?}: C[{i}][{j}] = {g}, want {want} (tolerance {tol})",
                std::any::type_name::<O>()
            );
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

// ------------------------------------------------------------------------------------------------
// GPU tests
// ------------------------------------------------------------------------------------------------

/// M in {1, 7, 64, 129, 300} x N = 391 x K = 1000 (partial last k-block and N block), f32 and
/// bf16 C, clusters 1 and 2; plus 1 x 1 x 1 and a tile edge on every side.
#[test]
fn block_scaled_ragged_sizes_both_outputs_both_clusters() {
    let Some(dev) = tc_or_skip("fp8 block-scaled sizes") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let mut shapes: Vec<(usize, usize, usize)> = [1, 7, 64, 129, 300]
        .iter()
        .map(|&m| (m, 391, 1000))
        .collect();
    shapes.extend([(1, 1, 1), (127, 257, 129), (257, 513, 200)]);
    for (m, n, k) in shapes {
        for cluster in [Some(1), Some(2)] {
            let case = Case {
                cluster,
                ..Case::new(m, n, k)
            };
            run_case::<f32>(&tc, case);
            run_case::<bf16>(&tc, case);
        }
    }
}

/// A long K (the promotion keeps the error independent of K; the per-tensor path's bound
/// would be 128x looser here) and many tiles, rows sampled.
#[test]
fn block_scaled_long_k_many_tiles() {
    let Some(dev) = tc_or_skip("fp8 block-scaled long K") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    run_case::<f32>(&tc, Case::new(1000, 1030, 16_400));
    run_case::<bf16>(&tc, Case::new(4097, 777, 4099));
}

/// alpha, beta != 0 (C read back, f32 and bf16), PDL launches.
#[test]
fn block_scaled_alpha_beta_and_pdl() {
    let Some(dev) = tc_or_skip("fp8 block-scaled alpha beta") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for (alpha, beta) in [(-1.5, 0.0), (0.5, 0.75), (1.0, -2.0)] {
        let case = Case {
            alpha,
            beta,
            pdl: true,
            ..Case::new(129, 391, 1000)
        };
        run_case::<f32>(&tc, case);
        run_case::<bf16>(&tc, case);
    }
}

/// Small cases for compute-sanitizer (`scripts/sanitize.sh`, label `fp8_block_gemm`): clusters
/// 1 and 2, f32 (N = 302: a ragged f32 row end, the direct-store chunk) and bf16 C, beta, PDL.
#[test]
fn sanitizer_sized_cases() {
    let Some(dev) = tc_or_skip("fp8 block-scaled sanitizer cases") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for cluster in [Some(1), Some(2)] {
        let case = Case {
            cluster,
            beta: 0.5,
            pdl: true,
            ..Case::new(300, 302, 200)
        };
        run_case::<f32>(&tc, case);
        run_case::<bf16>(&tc, Case { beta: 0.0, ..case });
    }
}

/// cuBLASLt's block-scaled FP8 (`CublasLtFp8::plan_block_scaled`, cuBLAS 12.9+) reads the
/// scales in `Fp8BlockScales`'s packed layouts: its output matches the f64 reference within the
/// per-tensor FP8 bound (`fp8_tolerance`: ceil(K / 32) x 2^-12 of the scaled `sum |a b|`, which
/// does not assume how often cuBLASLt promotes; a scale read from the wrong place is off by up
/// to 2^16). A cuBLASLt without block-scaled FP8 (`Error::Cublas`) skips with the reason.
#[test]
fn cublaslt_block_scaled_reads_the_same_layouts() {
    use warpline::kernels::tc_gemm::{fp8_tolerance, CublasLtFp8};
    let Some(dev) = tc_or_skip("cuBLASLt fp8 block-scaled") else {
        return;
    };
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let lt = match CublasLtFp8::new(&dev, &stream) {
        Ok(lt) => lt,
        Err(e) => {
            warpline_suite::support::skip("cuBLASLt fp8 block-scaled", e);
            return;
        }
    };
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let (m, n, k) = (256, 384, 1024);
    let mut p = Problem::new(&mut rng, m, n, k);
    // cuBLASLt takes no scale pitch: repack densely (a_ld = M, b_ld = ceil(K / 128)), and
    // unpadded operand pitches (K is a multiple of 16).
    let (kb, nb) = (k / 128, n / 128);
    let a_packed: Vec<f32> = (0..kb * m)
        .map(|x| p.a_scales[(x / m) * p.a_ld + x % m])
        .collect();
    let b_packed: Vec<f32> = (0..nb * kb)
        .map(|x| p.b_scales[(x / kb) * p.b_ld + x % kb])
        .collect();
    (p.a_scales, p.a_ld, p.b_scales, p.b_ld) = (a_packed, m, b_packed, kb);
    let a_codes: Vec<F8E4M3> = (0..m * k)
        .map(|x| p.a_codes[(x / k) * p.lda + x % k])
        .collect();
    let a_dec: Vec<f32> = (0..m * k).map(|x| p.a[(x / k) * p.lda + x % k]).collect();
    (p.a_codes, p.a, p.lda) = (a_codes, a_dec, k);
    assert_eq!(p.ldb, k);
    let upload = |v: &[F8E4M3]| {
        let mut b = pool.alloc_async::<F8E4M3>(&stream, v.len()).unwrap();
        b.copy_from_host(v).unwrap();
        b
    };
    let upload_f32 = |v: &[f32]| {
        let mut b = pool.alloc_async::<f32>(&stream, v.len()).unwrap();
        b.copy_from_host(v).unwrap();
        b
    };
    let (da, db) = (upload(&p.a_codes), upload(&p.b_codes));
    let (dsa, dsb) = (upload_f32(&p.a_scales), upload_f32(&p.b_scales));
    let mut dc = upload_f32(&vec![f32::NAN; m * n]);
    let plan = match lt.plan_block_scaled(
        Matrix::new(da.as_view(), m, k, k),
        Matrix::new(db.as_view(), n, k, k),
        BLayout::ColMajor,
        MatrixMut::new(dc.as_view_mut(), m, n, n),
        Fp8BlockScales::packed(dsa.as_view(), dsb.as_view(), m, k),
        1.0,
        0.0,
    ) {
        Ok(plan) => plan,
        Err(e @ Error::Cublas { .. }) => {
            warpline_suite::support::skip("cuBLASLt fp8 block-scaled", e);
            return;
        }
        Err(e) => panic!("{e}"),
    };
    plan.launch().unwrap();
    drop(plan);
    let mut got = vec![0f32; m * n];
    dc.copy_to_host(&mut got).unwrap();
    for i in 0..m {
        for j in 0..n {
            let (want, abs) = p.reference(i, j);
            let tol = fp8_tolerance(want, abs, k, 1.0, 0.0, 2f64.powi(-24));
            let g = got[i * n + j] as f64;
            assert!(
                (g - want).abs() <= tol,
                "cuBLASLt block-scaled C[{i}][{j}] = {g}, want {want} (tolerance {tol}): cuBLASLt does not read the scales as Fp8BlockScales lays them out (A M-major, B K-major); fix CublasLtFp8::plan_block_scaled's docs and repack there"
            );
        }
    }
}

/// Bad scales are refused with typed errors before anything is launched (C keeps its NaN).
#[test]
fn bad_block_scales_are_refused_before_launch() {
    let Some(dev) = tc_or_skip("fp8 block-scaled refusals") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let other = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let (m, n, k) = (129, 391, 1000);
    let (lda, ldb, ldc) = (pitch8(k, 0), pitch8(k, 0), pitch_out::<f32>(n));
    let a = pool.alloc_async::<F8E4M3>(&stream, m * lda).unwrap();
    let b = pool.alloc_async::<F8E4M3>(&stream, n * ldb).unwrap();
    let mut c = pool.alloc_async::<f32>(&stream, m * ldc).unwrap();
    c.copy_from_host(&vec![f32::NAN; m * ldc]).unwrap();
    let (kb, nb) = (k.div_ceil(128), n.div_ceil(128));
    let sa = pool.alloc_async::<f32>(&stream, kb * m).unwrap();
    let sb = pool.alloc_async::<f32>(&stream, nb * kb).unwrap();
    let sa_other = pool.alloc_async::<f32>(&other, kb * m).unwrap();
    let plan = |scales: Fp8BlockScales<'_>, c: &mut DeviceBuffer<f32>| -> Result<(), Error> {
        tc.plan_fp8_block_scaled(
            &stream,
            Matrix::new(a.as_view(), m, k, lda),
            Matrix::new(b.as_view(), n, k, ldb),
            BLayout::ColMajor,
            MatrixMut::new(c.as_view_mut(), m, n, ldc),
            scales,
            1.0,
            0.0,
            &TcGemmOptions::default(),
        )
        .map(|_| ())
    };
    // Packed scales are accepted (the plan is dropped unlaunched).
    plan(
        Fp8BlockScales::packed(sa.as_view(), sb.as_view(), m, k),
        &mut c,
    )
    .unwrap();
    let short_a = sa.view(0..kb * m - 1).unwrap();
    for (scales, want) in [
        (
            Fp8BlockScales::new(sa.as_view(), m - 1, sb.as_view(), kb),
            "BadShape",
        ),
        (
            Fp8BlockScales::new(short_a, m, sb.as_view(), kb),
            "LengthMismatch",
        ),
        (
            Fp8BlockScales::new(sa.as_view(), m, sb.as_view(), kb - 1),
            "BadShape",
        ),
        (
            Fp8BlockScales::new(sa_other.as_view(), m, sb.as_view(), kb),
            "WrongStream",
        ),
    ] {
        let e = plan(scales, &mut c).unwrap_err();
        let got = match e {
            Error::BadShape { .. } => "BadShape",
            Error::LengthMismatch { .. } => "LengthMismatch",
            Error::WrongStream { .. } => "WrongStream",
            _ => "other",
        };
        assert_eq!(got, want, "{e}");
    }
    // Ping-pong has no block-scaled entry.
    let e = tc
        .plan_fp8_block_scaled(
            &stream,
            Matrix::new(a.as_view(), m, k, lda),
            Matrix::new(b.as_view(), n, k, ldb),
            BLayout::ColMajor,
            MatrixMut::new(c.as_view_mut(), m, n, ldc),
            Fp8BlockScales::packed(sa.as_view(), sb.as_view(), m, k),
            1.0,
            0.0,
            &TcGemmOptions {
                pingpong: true,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    stream.synchronize().unwrap();
    let mut host = vec![0f32; m * ldc];
    c.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|v| v.is_nan()), "C was written");
}

// ------------------------------------------------------------------------------------------------
// No GPU needed
// ------------------------------------------------------------------------------------------------

/// The test's power: on the problem the GPU tests use, a kernel that dropped a scale, read the A
/// scales K-major instead of M-major, took the wrong N block's B scale, or skipped the last
/// partial k-block's scales would put some element far outside `fp8_block_tolerance` (scales span
/// 2^-8 .. 2^8).
#[test]
fn the_bound_catches_misplaced_scales() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let (m, n, k) = (7, 391, 1000);
    let p = Problem::new(&mut rng, m, n, k);
    let (kb, nb) = (k.div_ceil(128), n.div_ceil(128));
    let outside = |a_scales: &[f32], a_ld: usize, b_scales: &[f32], b_ld: usize| -> bool {
        (0..m).any(|i| {
            (0..n).any(|j| {
                let (want, abs) = p.reference(i, j);
                let (wrong, _) = p.reference_with(a_scales, a_ld, b_scales, b_ld, i, j);
                (wrong - want).abs() > fp8_block_tolerance(want, abs, k, 1.0, 0.0, 2f64.powi(-8))
            })
        })
    };
    // No A scales (all 1).
    let ones_a = vec![1.0; p.a_scales.len()];
    assert!(outside(&ones_a, p.a_ld, &p.b_scales, p.b_ld));
    // No B scales.
    let ones_b = vec![1.0; p.b_scales.len()];
    assert!(outside(&p.a_scales, p.a_ld, &ones_b, p.b_ld));
    // A scales read K-major (row i, k-block kk at i * kb + kk) from the same memory.
    let mut k_major = vec![f32::NAN; (kb - 1) * p.a_ld + m];
    for i in 0..m {
        for kk in 0..kb {
            let t = i * kb + kk;
            k_major[kk * p.a_ld + i] = p.a_scales[(t / m) * p.a_ld + t % m];
        }
    }
    assert!(outside(&k_major, p.a_ld, &p.b_scales, p.b_ld));
    // B scales of the neighbouring N block.
    let mut shifted = p.b_scales.clone();
    for j in 0..nb {
        for kk in 0..kb {
            shifted[j * p.b_ld + kk] = p.b_scales[((j + 1) % nb) * p.b_ld + kk];
        }
    }
    assert!(outside(&p.a_scales, p.a_ld, &shifted, p.b_ld));
    // The last (partial) k-block's scales left at 1.
    let (mut last_a, mut last_b) = (p.a_scales.clone(), p.b_scales.clone());
    for i in 0..m {
        last_a[(kb - 1) * p.a_ld + i] = 1.0;
    }
    for j in 0..nb {
        last_b[j * p.b_ld + kb - 1] = 1.0;
    }
    assert!(outside(&last_a, p.a_ld, &last_b, p.b_ld));
}

/// The block-scaled entry issues `wgmma m64n128k32.e4m3` (two per tile half and k32 step) and
/// no 16-bit or n256 wgmma; ptxas built it without spills (the module's build fails otherwise).
#[test]
fn block_scaled_entry_uses_the_e4m3_n128_wgmma() {
    let ptx = warpline::SM90A_PTX;
    let name = warpline::kernels::tc_gemm::FP8_BLOCK_SCALED_ENTRY;
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("{name} is not an entry of the sm_90a module"));
    let rest = &ptx[start..];
    let body = &rest[..rest[1..].find(".entry ").map_or(rest.len(), |i| i + 1)];
    assert!(body.contains("wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3"));
    assert!(
        !body.contains("m64n256k32"),
        "the n256 wgmma is in the block-scaled entry"
    );
    assert!(!body.contains("k16.f32.bf16"));
    assert!(body.contains("setmaxnreg") && body.contains(".maxntid 384, 1, 1"));
    warpline::kernels::tc_gemm::check_module_entries(ptx).unwrap();
}
