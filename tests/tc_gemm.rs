//! The tensor-core GEMM (`TcGemm`, kernels `tc_gemm_*` of the sm_90a module) against an f64 CPU
//! reference on the 16-bit-rounded inputs: fresh seeded random normal inputs (the seed is
//! printed; `WARPLINE_SEED=<n>` replays one), C poisoned with NaN before each launch, row pitches
//! padded to a multiple of 16 bytes with the padding filled with NaN (so a kernel that reads past
//! the logical sizes fails), sizes that are multiples of no tile: 1x1x1, 127x129x65, 1000^3,
//! 4097x257x4099 (sampled rows and columns for the large ones).
//!
//! Error bound (see `warpline::kernels::tc_gemm::ACC_REL`): per element,
//! `|got - want| <= 1e-3 * (|alpha| * sum_k |a_ik b_kj| + |beta * c0_ij|) + r * |want| + 1e-6`,
//! where `r` is half an ulp of the output type (2^-24 for f32, 2^-9 for bf16, 2^-11 for f16):
//! products of 16-bit inputs are exact in FP32, so the error is FP32 accumulation (at most about
//! K * 2^-24 = 2.4e-4 of sum |a b| at K = 4099 for a serial sum; 1e-3 leaves room for the tensor
//! cores' truncating accumulation), plus the output rounding of a 16-bit C.
//!
//! CPU-only tests (shape and pitch validation, compile-time dtype rules) run in CI without a GPU.

use rand::{Rng, SeedableRng};
use warpline::kernels::tc_gemm::{
    check_shapes, reference_entry, tolerance, BLayout, CublasGemmEx, HostB, Matrix, MatrixDims,
    MatrixMut, Raster, TcGemm, TcGemmOptions, TcInput, TcOutput,
};
use warpline::ordering::{synchronize_timeout, OnTimeout, TaskGraph};
use warpline::{bf16, f16, Device, DeviceBuffer, Error, MemPool};
use warpline_suite::support::{gpu_or_skip, upload, upload_c};

// ------------------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------------------

fn seed() -> u64 {
    warpline_suite::support::gemm_seed("tc_gemm")
}

/// Pitch of `cols` elements of `bytes` bytes rounded up to 16 bytes, plus `extra` 16-byte units.
fn pitch(cols: usize, bytes: usize, extra: usize) -> usize {
    cols.next_multiple_of(16 / bytes) + extra * (16 / bytes)
}

#[derive(Clone, Copy, Debug)]
struct Case {
    m: usize,
    n: usize,
    k: usize,
    layout: BLayout,
    cluster: Option<u32>,
    raster: Raster,
    beta: f32,
    alpha: f32,
    /// The ping-pong entry (bf16, column-major B).
    pingpong: bool,
    /// Raster band (None: the default).
    group: Option<u32>,
    /// Rows and columns checked (None: all).
    sample: Option<usize>,
    /// `GemmConfig::Auto` (with the other knobs at their defaults) instead of the cooperative
    /// kernel with these knobs.
    auto: bool,
}

impl Case {
    fn new(m: usize, n: usize, k: usize) -> Self {
        Self {
            m,
            n,
            k,
            layout: BLayout::ColMajor,
            cluster: None,
            raster: Raster::AlongM,
            beta: 0.0,
            alpha: 1.0,
            pingpong: false,
            group: None,
            sample: (m * n * k > 1 << 24).then_some(12),
            auto: false,
        }
    }
}

/// Rows (or columns) to check out of `n`: all, or `s` of them (first, last, random).
fn picks(rng: &mut rand::rngs::StdRng, n: usize, s: Option<usize>) -> Vec<usize> {
    match s {
        Some(s) if s < n => {
            let mut v = vec![0, n - 1];
            v.extend((0..s - 2).map(|_| rng.random_range(0..n)));
            v
        }
        _ => (0..n).collect(),
    }
}

/// Runs one case with inputs `T`, output `O` and checks it; returns the first failure.
fn run_case<T: TcInput, O: TcOutput<T>>(tc: &TcGemm<'_>, case: Case) {
    let dev = tc.device();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(dev, 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let Case {
        m, n, k, layout, ..
    } = case;
    let (lda, (br, bc)) = (pitch(k, 2, 1), layout.stored(k, n));
    let ldb = pitch(bc, 2, 0);
    let ldc = pitch(n, size_of::<O>(), 1);
    let (da, ha) = upload::<T>(&pool, &stream, &mut rng, m, k, lda);
    let (db, hb) = upload::<T>(&pool, &stream, &mut rng, br, bc, ldb);
    // C: old values for beta != 0 (rounded to O), NaN padding; else all NaN.
    let c_len = (m - 1) * ldc + n;
    let (mut dc, c0) =
        upload_c::<T, O>(&pool, &stream, &mut rng, m, n, ldc, c_len, case.beta != 0.0);
    let defaults = TcGemmOptions::default();
    let opts = if case.auto {
        defaults
    } else {
        TcGemmOptions {
            cluster: case.cluster,
            raster: case.raster,
            pingpong: case.pingpong,
            group: case.group.unwrap_or(defaults.group),
            // These cases test the cooperative / ping-pong kernels (tests/decode_gemm.rs tests the
            // decode configuration that Auto would pick for M <= 64).
            config: warpline::kernels::GemmConfig::Cooperative128x256,
            ..defaults
        }
    };
    tc.gemm(
        &stream,
        Matrix::new(da.as_view(), m, k, lda),
        Matrix::new(db.as_view(), br, bc, ldb),
        layout,
        MatrixMut::new(dc.as_view_mut(), m, n, ldc),
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
        layout,
    };
    let rows = picks(&mut rng, m, case.sample);
    let cols = picks(&mut rng, n, case.sample);
    let check = |i: usize, j: usize| {
        let (s, abs) = reference_entry(&ha, lda, &b, k, i, j).unwrap();
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
    // The padding of C is untouched.
    for r in 0..m - 1 {
        for c in n..ldc {
            assert!(
                got[r * ldc + c].to_f32().is_nan(),
                "{case:?}: C padding [{r}][{c}] was written"
            );
        }
    }
}

fn tc_or_skip(test: &str) -> Option<(Device, ())> {
    let dev = gpu_or_skip(test)?;
    if dev.capabilities().compute_capability != (9, 0) {
        warpline_suite::support::skip(test, "the device is not compute capability 9.0 (sm_90a)");
        return None;
    }
    Some((dev, ()))
}

// ------------------------------------------------------------------------------------------------
// GPU tests
// ------------------------------------------------------------------------------------------------

const SIZES: [(usize, usize, usize); 4] = [
    (1, 1, 1),
    (127, 129, 65),
    (1000, 1000, 1000),
    (4097, 257, 4099),
];

#[test]
fn bf16_f32_out_all_sizes_both_layouts_both_clusters() {
    let Some((dev, ())) = tc_or_skip("tc_gemm bf16 sizes") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for (m, n, k) in SIZES {
        for layout in [BLayout::ColMajor, BLayout::RowMajor] {
            for cluster in [1, 2] {
                let case = Case {
                    layout,
                    cluster: Some(cluster),
                    ..Case::new(m, n, k)
                };
                run_case::<bf16, f32>(&tc, case);
            }
        }
    }
}

#[test]
fn pingpong_consumers_all_sizes_both_clusters_beta() {
    let Some((dev, ())) = tc_or_skip("tc_gemm ping-pong") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for (m, n, k) in SIZES {
        for cluster in [1, 2] {
            for (alpha, beta) in [(1.0, 0.0), (0.5, -1.25)] {
                let case = Case {
                    cluster: Some(cluster),
                    pingpong: true,
                    alpha,
                    beta,
                    raster: if cluster == 1 {
                        Raster::AlongM
                    } else {
                        Raster::AlongN
                    },
                    ..Case::new(m, n, k)
                };
                run_case::<bf16, f32>(&tc, case);
                run_case::<bf16, bf16>(&tc, case);
            }
        }
    }
}

/// `GemmConfig::Auto`'s BF16 choices by shape, each checked against the f64 reference (N and K
/// of no tile): the ping-pong kernel for 65 to 128 rows with N >= 12288
/// (`decode_gemm::auto_pingpong`), the decode kernel's `r2_pa` entries for at most 8 rows and
/// 4096 columns (`decode_gemm::auto_decode_bf16`), the swap-AB kernel between.
#[test]
fn issue20_auto_choices_by_shape() {
    let Some((dev, ())) = tc_or_skip("tc_gemm auto choices") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    for (m, n, want) in [
        (65usize, 12289usize, "tc_gemm_bf16_bcol_pingpong"),
        (128, 12300, "tc_gemm_bf16_bcol_pingpong"),
        (100, 6150, "swap_ab_gemm_bf16_n128"),
        (1, 4000, "decode_gemm_bf16_t1_u2_r2_pa"),
        (7, 4096, "decode_gemm_bf16_t1_u2_r2_pa"),
        (8, 4097, "swap_ab_gemm_bf16_n8"),
        (9, 3000, "swap_ab_gemm_bf16_n16"),
    ] {
        let (k, ldc) = (520, n.next_multiple_of(4));
        let a = pool.alloc_async::<bf16>(&stream, m * k).unwrap();
        let b = pool.alloc_async::<bf16>(&stream, n * k).unwrap();
        let mut c = pool.alloc_async::<f32>(&stream, m * ldc).unwrap();
        let plan = tc
            .plan(
                &stream,
                Matrix::new(a.as_view(), m, k, k),
                Matrix::new(b.as_view(), n, k, k),
                BLayout::ColMajor,
                MatrixMut::new(c.as_view_mut(), m, n, ldc),
                1.0,
                0.0,
                &TcGemmOptions::default(),
            )
            .unwrap();
        assert_eq!(plan.kernel_names(), [want], "{m} x {n} x {k}");
        drop(plan);
        let case = Case {
            auto: true,
            ..Case::new(m, n, k)
        };
        run_case::<bf16, f32>(&tc, case);
        run_case::<bf16, bf16>(
            &tc,
            Case {
                alpha: 0.5,
                beta: -0.75,
                ..case
            },
        );
    }
}

#[test]
fn fp16_and_16_bit_outputs() {
    let Some((dev, ())) = tc_or_skip("tc_gemm fp16 / 16-bit out") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for (m, n, k) in [(1, 1, 1), (127, 129, 65), (1000, 1000, 1000)] {
        for layout in [BLayout::ColMajor, BLayout::RowMajor] {
            let case = Case {
                layout,
                ..Case::new(m, n, k)
            };
            run_case::<f16, f32>(&tc, case);
            run_case::<f16, f16>(&tc, case);
            run_case::<bf16, bf16>(&tc, case);
        }
    }
}

#[test]
fn raster_orders_beta_and_alpha() {
    let Some((dev, ())) = tc_or_skip("tc_gemm raster/beta") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    for raster in [Raster::AlongM, Raster::AlongN] {
        for cluster in [1, 2] {
            for (alpha, beta) in [(1.0, 0.0), (0.5, -1.25)] {
                let case = Case {
                    raster,
                    cluster: Some(cluster),
                    alpha,
                    beta,
                    ..Case::new(1000, 1000, 1000)
                };
                run_case::<bf16, f32>(&tc, case);
                run_case::<bf16, bf16>(
                    &tc,
                    Case {
                        layout: BLayout::RowMajor,
                        ..case
                    },
                );
            }
        }
    }
    // A band far wider than the grid (it once wrapped the kernel's u32 scheduler: tiles left
    // unwritten, one tile raced): every element is checked.
    for raster in [Raster::AlongM, Raster::AlongN] {
        for group in [3, 1 << 31, u32::MAX] {
            let case = Case {
                raster,
                group: Some(group),
                beta: 0.5,
                sample: None,
                ..Case::new(1000, 700, 300)
            };
            run_case::<bf16, f32>(&tc, case);
        }
    }
    // beta != 0 on the odd sizes, both outputs.
    for (m, n, k) in [(1, 1, 1), (127, 129, 65), (4097, 257, 4099)] {
        let case = Case {
            beta: 2.0,
            ..Case::new(m, n, k)
        };
        run_case::<bf16, f32>(&tc, case);
        run_case::<f16, f16>(&tc, case);
    }
}

#[test]
fn persistent_grids_of_any_size_are_correct() {
    let Some((dev, ())) = tc_or_skip("tc_gemm grids") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let (m, n, k) = (1000, 600, 300);
    let (da, ha) = upload::<bf16>(&pool, &stream, &mut rng, m, k, k.next_multiple_of(8));
    let (db, hb) = upload::<bf16>(&pool, &stream, &mut rng, n, k, k.next_multiple_of(8));
    let ldc = n;
    let mut dc = pool.alloc_async::<f32>(&stream, m * ldc).unwrap();
    for (cluster, clusters) in [(1, 1), (2, 1), (1, 7), (2, 3), (2, 1000)] {
        dc.fill_async(f32::NAN).unwrap();
        let opts = TcGemmOptions {
            cluster: Some(cluster),
            clusters: Some(clusters),
            ..Default::default()
        };
        tc.gemm(
            &stream,
            Matrix::new(da.as_view(), m, k, k.next_multiple_of(8)),
            Matrix::new(db.as_view(), n, k, k.next_multiple_of(8)),
            BLayout::ColMajor,
            MatrixMut::new(dc.as_view_mut(), m, n, ldc),
            1.0,
            0.0,
            &opts,
        )
        .unwrap();
        let mut got = vec![0f32; m * ldc];
        dc.copy_to_host(&mut got).unwrap();
        let b = HostB {
            data: &hb,
            pitch: k.next_multiple_of(8),
            layout: BLayout::ColMajor,
        };
        for i in (0..m).step_by(37).chain([m - 1]) {
            for j in 0..n {
                let (s, abs) = reference_entry(&ha, k.next_multiple_of(8), &b, k, i, j).unwrap();
                let tol = tolerance(s, abs, 1.0, 0.0, 0.0);
                assert!(
                    (got[i * ldc + j] as f64 - s).abs() <= tol,
                    "cluster {cluster} x {clusters}: C[{i}][{j}] = {} want {s}",
                    got[i * ldc + j]
                );
            }
        }
    }
}

/// `C1 = A B1; C2 = C1 B2` with PDL on the second, 1000 times in a row on one stream; every
/// iteration's C2 is the same, checked fully on a few iterations (C2 poisoned before them) and
/// against the CPU reference (sampled) at the end.
#[test]
fn pdl_pair_is_correct_over_1000_iterations() {
    let Some((dev, ())) = tc_or_skip("tc_gemm PDL pair") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let (m, k, n1, n2) = (515, 264, 392, 200);
    let (da, ha) = upload::<bf16>(&pool, &stream, &mut rng, m, k, k);
    let (db1, hb1) = upload::<bf16>(&pool, &stream, &mut rng, n1, k, k);
    let (db2, hb2) = upload::<bf16>(&pool, &stream, &mut rng, n1, n2, n2);
    let mut dc1 = pool.alloc_async::<bf16>(&stream, m * n1).unwrap();
    let mut dc2 = pool.alloc_async::<f32>(&stream, m * n2).unwrap();
    dc1.fill_async(bf16::NAN).unwrap();
    let mut first = vec![0f32; m * n2];
    {
        let opts = TcGemmOptions {
            pdl: true,
            ..Default::default()
        };
        let check_every = [0usize, 1, 2, 499, 998];
        for it in 0..1000 {
            if check_every.contains(&it) {
                dc2.fill_async(f32::NAN).unwrap();
            }
            {
                let plan = tc
                    .plan_chain2(
                        &stream,
                        Matrix::new(da.as_view(), m, k, k),
                        Matrix::new(db1.as_view(), n1, k, k),
                        BLayout::ColMajor,
                        MatrixMut::new(dc1.as_view_mut(), m, n1, n1),
                        Matrix::new(db2.as_view(), n1, n2, n2),
                        BLayout::RowMajor,
                        MatrixMut::new(dc2.as_view_mut(), m, n2, n2),
                        &opts,
                    )
                    .unwrap();
                assert!(plan.configs()[1].pdl);
                plan.launch().unwrap();
            }
            if check_every.contains(&it) {
                let mut got = vec![0f32; m * n2];
                dc2.copy_to_host(&mut got).unwrap();
                assert!(
                    got.iter().all(|v| v.is_finite()),
                    "iteration {it}: NaN left"
                );
                if it == 0 {
                    first = got;
                } else {
                    assert_eq!(got, first, "iteration {it} differs from iteration 0");
                }
            }
        }
    }
    let mut got = vec![0f32; m * n2];
    dc2.copy_to_host(&mut got).unwrap();
    assert_eq!(got, first, "final C2 differs from iteration 0");
    // Reference: C1 = bf16(A B1) as the kernel rounds it, then C2 = C1 B2.
    let mut c1 = vec![0f32; m * n1];
    dc1.copy_to_host_bf16(&mut c1);
    let b1 = HostB {
        data: &hb1,
        pitch: k,
        layout: BLayout::ColMajor,
    };
    let b2 = HostB {
        data: &hb2,
        pitch: n2,
        layout: BLayout::RowMajor,
    };
    for i in (0..m).step_by(51).chain([m - 1]) {
        for j in 0..n1 {
            let (s, abs) = reference_entry(&ha, k, &b1, k, i, j).unwrap();
            let tol = tolerance(s, abs, 1.0, 0.0, 1.0 / 512.0);
            assert!((c1[i * n1 + j] as f64 - s).abs() <= tol, "C1[{i}][{j}]");
        }
        for j in 0..n2 {
            let (s, abs) = reference_entry(&c1, n1, &b2, n1, i, j).unwrap();
            let tol = tolerance(s, abs, 1.0, 0.0, 0.0);
            assert!((got[i * n2 + j] as f64 - s).abs() <= tol, "C2[{i}][{j}]");
        }
    }
}

trait CopyBf16 {
    fn copy_to_host_bf16(&self, dst: &mut [f32]);
}

impl CopyBf16 for DeviceBuffer<bf16> {
    fn copy_to_host_bf16(&self, dst: &mut [f32]) {
        let mut tmp = vec![bf16::ZERO; self.len()];
        self.copy_to_host(&mut tmp).unwrap();
        for (d, s) in dst.iter_mut().zip(tmp) {
            *d = s.to_f32();
        }
    }
}

#[test]
fn matches_cublas_gemm_ex() {
    let Some((dev, ())) = tc_or_skip("tc_gemm vs cuBLAS") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    let (m, n, k) = (300, 520, 136);
    for layout in [BLayout::ColMajor, BLayout::RowMajor] {
        let (br, bc) = layout.stored(k, n);
        let (da, _) = upload::<bf16>(&pool, &stream, &mut rng, m, k, k);
        let (db, _) = upload::<bf16>(&pool, &stream, &mut rng, br, bc, bc);
        let mut ours = pool.alloc_async::<f32>(&stream, m * n).unwrap();
        let mut theirs = pool.alloc_async::<f32>(&stream, m * n).unwrap();
        ours.fill_async(f32::NAN).unwrap();
        theirs.fill_async(f32::NAN).unwrap();
        let a = Matrix::new(da.as_view(), m, k, k);
        let b = Matrix::new(db.as_view(), br, bc, bc);
        tc.gemm(
            &stream,
            a,
            b,
            layout,
            MatrixMut::new(ours.as_view_mut(), m, n, n),
            1.0,
            0.0,
            &TcGemmOptions::default(),
        )
        .unwrap();
        let blas = CublasGemmEx::new(&dev, &stream).unwrap();
        blas.gemm(
            &a,
            &b,
            layout,
            &mut MatrixMut::new(theirs.as_view_mut(), m, n, n),
            1.0,
            0.0,
        )
        .unwrap();
        let (mut x, mut y) = (vec![0f32; m * n], vec![0f32; m * n]);
        ours.copy_to_host(&mut x).unwrap();
        theirs.copy_to_host(&mut y).unwrap();
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            assert!(
                (p - q).abs() <= 1e-3 * (1.0 + q.abs()) * (k as f32).sqrt(),
                "{layout:?} [{i}]: ours {p}, cuBLAS {q}"
            );
        }
    }
}

/// Typed errors with nothing launched: the NaN poison in C stays.
#[test]
fn bad_input_is_refused_before_launch() {
    let Some((dev, ())) = tc_or_skip("tc_gemm errors") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let a = pool.alloc_async::<bf16>(&stream, 64 * 64 + 8).unwrap();
    let b = pool.alloc_async::<bf16>(&stream, 64 * 64).unwrap();
    let mut c = pool.alloc_async::<f32>(&stream, 64 * 64).unwrap();
    c.fill_async(f32::NAN).unwrap();
    let opts = TcGemmOptions::default();
    let mut attempt =
        |a: Matrix<'_, bf16>, b: Matrix<'_, bf16>, cm: (usize, usize, usize), o: TcGemmOptions| {
            tc.gemm(
                &stream,
                a,
                b,
                BLayout::ColMajor,
                MatrixMut::new(c.as_view_mut(), cm.0, cm.1, cm.2),
                1.0,
                0.0,
                &o,
            )
            .unwrap_err()
        };
    let av = a.as_view();
    let bv = b.as_view();
    // Pitch not a multiple of 16 bytes.
    let e = attempt(
        Matrix::new(av, 64, 60, 63),
        Matrix::new(bv, 64, 60, 64),
        (64, 64, 64),
        opts,
    );
    assert!(matches!(e, Error::PitchAlignment { pitch: 63, .. }), "{e}");
    // Misaligned base (a view starting 1 element in).
    let shifted = a.view(1..64 * 64 + 1).unwrap();
    let e = attempt(
        Matrix::new(shifted, 64, 64, 64),
        Matrix::new(bv, 64, 64, 64),
        (64, 64, 64),
        opts,
    );
    assert!(matches!(e, Error::Misaligned { .. }), "{e}");
    // Bad shapes: K mismatch, C too small, empty.
    let e = attempt(
        Matrix::new(av, 64, 64, 64),
        Matrix::new(bv, 64, 32, 32),
        (64, 64, 64),
        opts,
    );
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    let e = attempt(
        Matrix::new(av, 64, 64, 64),
        Matrix::new(bv, 64, 64, 64),
        (64, 64, 72),
        opts,
    );
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    let e = attempt(
        Matrix::new(av, 0, 64, 64),
        Matrix::new(bv, 64, 64, 64),
        (64, 64, 64),
        opts,
    );
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    // Unsupported cluster, zero group.
    let bad = TcGemmOptions {
        cluster: Some(4),
        ..opts
    };
    let e = attempt(
        Matrix::new(av, 64, 64, 64),
        Matrix::new(bv, 64, 64, 64),
        (64, 64, 64),
        bad,
    );
    assert!(
        matches!(e, Error::UnsupportedClusterSize { cluster: 4, .. }),
        "{e}"
    );
    let bad = TcGemmOptions { group: 0, ..opts };
    let e = attempt(
        Matrix::new(av, 64, 64, 64),
        Matrix::new(bv, 64, 64, 64),
        (64, 64, 64),
        bad,
    );
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    // Buffers of another stream.
    let other = dev.new_stream().unwrap();
    let foreign = pool.alloc_async::<bf16>(&other, 64 * 64).unwrap();
    let e = attempt(
        Matrix::new(foreign.as_view(), 64, 64, 64),
        Matrix::new(bv, 64, 64, 64),
        (64, 64, 64),
        opts,
    );
    assert!(matches!(e, Error::WrongStream { .. }), "{e}");
    // Nothing ran: C is still all NaN.
    let mut got = vec![0f32; 64 * 64];
    c.copy_to_host(&mut got).unwrap();
    assert!(got.iter().all(|v| v.is_nan()));
    // A stream of another context (another device object on its own context).
    let Some(dev2) = warpline_suite::support::gpu_in_new_context_or_skip("tc_gemm wrong device")
    else {
        return;
    };
    let s2 = dev2.new_stream().unwrap();
    let e = tc
        .gemm(
            &s2,
            Matrix::new(av, 64, 64, 64),
            Matrix::new(bv, 64, 64, 64),
            BLayout::ColMajor,
            MatrixMut::new(c.as_view_mut(), 64, 64, 64),
            1.0,
            0.0,
            &opts,
        )
        .unwrap_err();
    assert!(matches!(e, Error::WrongContext { .. }), "{e}");
}

// ------------------------------------------------------------------------------------------------
// CPU-only tests (CI)
// ------------------------------------------------------------------------------------------------

#[test]
fn shape_and_pitch_validation_without_a_gpu() {
    let d = |rows: usize, cols: usize, pitch: usize, elem: usize| MatrixDims {
        rows,
        cols,
        pitch,
        len: (rows - 1) * pitch + cols,
        address: 0x10000,
        elem_bytes: elem,
    };
    // 4097 x 257 x 4099 with bf16 pitches 4104 / 4104 and f32 C pitch 260.
    let s = check_shapes(
        &d(4097, 4099, 4104, 2),
        &d(257, 4099, 4104, 2),
        BLayout::ColMajor,
        &d(4097, 257, 260, 4),
    )
    .unwrap();
    assert_eq!((s.m, s.n, s.k), (4097, 257, 4099));
    // The unpadded pitch 4099 is refused with the advice to pad it.
    let e = check_shapes(
        &d(4097, 4099, 4099, 2),
        &d(257, 4099, 4104, 2),
        BLayout::ColMajor,
        &d(4097, 257, 260, 4),
    )
    .unwrap_err();
    assert!(e.to_string().contains("pad the row pitch"), "{e}");
    // Row-major B: K x N.
    assert!(check_shapes(
        &d(127, 65, 72, 2),
        &d(65, 129, 136, 2),
        BLayout::RowMajor,
        &d(127, 129, 136, 2),
    )
    .is_ok());
}

#[test]
fn the_sm90a_module_declares_the_launch_contract() {
    warpline::kernels::tc_gemm::check_module_entries(warpline::SM90A_PTX).unwrap();
}

/// Issue 19, item 1: a `TcGemmPlan` made before a capture and dropped after it freed the
/// tensor-map table that the replays read. Now the plan is a graph task the graph owns
/// (`TaskGraph::gemm`): the task graph is dropped right after the capture, a second plan's table
/// is allocated (it would reuse the freed table's memory), and every replay still computes
/// `C = A B` exactly as the eager launch does (bit for bit) and as the CPU reference says. A plan
/// made on another stream than its lane's is `WrongStream` before anything is captured.
#[test]
fn issue19_item01_gemm_task_owns_its_plan_across_replays() {
    let Some((dev, ())) = tc_or_skip("issue 19 item 1 gemm task") else {
        return;
    };
    let tc = TcGemm::new(&dev).unwrap();
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed());
    // M = 260, N = 132: both serve as f32 row pitches of a C (multiples of 16 bytes), and
    // neither is a tile multiple.
    let (m, n, k) = (260, 132, 200);
    let (da, ha) = upload::<bf16>(&pool, &stream, &mut rng, m, k, k);
    let (db, hb) = upload::<bf16>(&pool, &stream, &mut rng, n, k, k);
    let mut eager = pool.alloc_async::<f32>(&stream, m * n).unwrap();
    let mut dc = pool.alloc_async::<f32>(&stream, m * n).unwrap();
    let opts = TcGemmOptions::default();
    tc.gemm(
        &stream,
        Matrix::new(da.as_view(), m, k, k),
        Matrix::new(db.as_view(), n, k, k),
        BLayout::ColMajor,
        MatrixMut::new(eager.as_view_mut(), m, n, n),
        1.0,
        0.0,
        &opts,
    )
    .unwrap();
    let mut want = vec![0f32; m * n];
    eager.copy_to_host(&mut want).unwrap();
    // Wrong stream: refused before the capture.
    {
        let other = dev.new_stream().unwrap();
        let plan = tc
            .plan(
                &stream,
                Matrix::new(da.as_view(), m, k, k),
                Matrix::new(db.as_view(), n, k, k),
                BLayout::ColMajor,
                MatrixMut::new(dc.as_view_mut(), m, n, n),
                1.0,
                0.0,
                &opts,
            )
            .unwrap();
        let mut g = TaskGraph::new();
        let l = g.lane("l");
        g.gemm(l, "gemm", plan).unwrap();
        assert!(matches!(
            g.capture(&dev, &[other], &[]),
            Err(Error::WrongStream { .. })
        ));
    }
    // Only the replays write C after this: the capture runs nothing.
    dc.fill_async(f32::NAN).unwrap();
    let plan = tc
        .plan(
            &stream,
            Matrix::new(da.as_view(), m, k, k),
            Matrix::new(db.as_view(), n, k, k),
            BLayout::ColMajor,
            MatrixMut::new(dc.as_view_mut(), m, n, n),
            1.0,
            0.0,
            &opts,
        )
        .unwrap();
    let mut g = TaskGraph::new();
    let l = g.lane("l");
    g.gemm(l, "gemm", plan).unwrap();
    let mut captured = g.capture(&dev, std::slice::from_ref(&stream), &[]).unwrap();
    drop(g);
    stream.synchronize().unwrap();
    // Another table now; before the fix it could reuse the first one's freed memory, and the
    // replays then read the decoy's maps (C' = B A into `scratch_c`), leaving C NaN.
    let mut scratch_c = pool.alloc_async::<f32>(&stream, n * m).unwrap();
    let decoy = tc
        .plan(
            &stream,
            Matrix::new(db.as_view(), n, k, k),
            Matrix::new(da.as_view(), m, k, k),
            BLayout::ColMajor,
            MatrixMut::new(scratch_c.as_view_mut(), n, m, m),
            1.0,
            0.0,
            &opts,
        )
        .unwrap();
    stream.synchronize().unwrap();
    for _ in 0..3 {
        let run = captured.launch().unwrap();
        synchronize_timeout(&run, std::time::Duration::from_secs(10), OnTimeout::Abandon).unwrap();
    }
    drop(captured);
    drop(decoy);
    let mut got = vec![0f32; m * n];
    dc.copy_to_host(&mut got).unwrap();
    assert_eq!(
        got, want,
        "the replayed GEMM equals the eager one bit for bit"
    );
    let b = HostB {
        data: &hb,
        pitch: k,
        layout: BLayout::ColMajor,
    };
    for i in (0..m).step_by(17).chain([m - 1]) {
        for j in 0..n {
            let (s, abs) = reference_entry(&ha, k, &b, k, i, j).unwrap();
            let tol = tolerance(s, abs, 1.0, 0.0, 0.0);
            assert!((got[i * n + j] as f64 - s).abs() <= tol, "C[{i}][{j}]");
        }
    }
}
