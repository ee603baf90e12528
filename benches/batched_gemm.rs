//! Batched BF16 GEMM throughput (`BatchedGemm`: 3-D TMA, one CTA per 128 x 256 tile, a one-CTA
//! `TmaPipeline`, wgmma; issue 22 "3-D TMA") beside cuBLAS's strided-batched BF16 GEMM
//! (`cublasGemmStridedBatchedEx`, `CUBLAS_COMPUTE_32F`, BF16 out) on the same operands in the same
//! run. Shapes `batch x M x N x K` (A `M x K`, B stored `N x K`, C `M x N`, tight pitches):
//! 16 x 2048^3, 32 x 1024^3, 8 x 4096 x 4096 x 1024, 16 x 2000 x 2000 x 2048 (ragged tiles);
//! `WARPLINE_BATCHED_SHAPES=BxMxNxK,...` picks others.
//!
//! Random normal inputs. Per shape, after warm-up (3 launches of each, then `WARM_MS` of
//! cuBLAS), `REPS` rounds each time one batch of `BATCH` launches of each (CUDA events around
//! the batch; a prepared plan, so no tensor-map upload is timed), cuBLAS first; each row is the
//! median, the ratio is to cuBLAS's median. TFLOP/s = 2 batch M N K / time. A spot check of
//! both outputs against each other (sampled elements, the BF16 output bound) guards against
//! timing a wrong kernel. Without a driver, or on a device other than compute capability 9.0, it
//! prints why it skipped and exits 0.

use rand::{Rng, SeedableRng};
use warpline::kernels::batched_gemm::{
    BatchedGemm, BatchedMatrix, BatchedMatrixMut, CublasBatchedGemm,
};
use warpline::{bf16, Device, DeviceBuffer, MemPool, Stream};
use warpline_suite::support::gpu_or_skip;

const REPS: usize = 15;
const BATCH: usize = 10;
/// Milliseconds of cuBLAS launches before each shape's timed rounds, to settle the clocks.
const WARM_MS: f64 = 300.0;

fn median_ms(
    stream: &Stream,
    mut launch: impl FnMut() -> warpline::Result<()>,
) -> warpline::Result<f64> {
    for _ in 0..3 {
        launch()?;
    }
    stream.synchronize()?;
    let mut t = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let start = stream.record()?;
        for _ in 0..BATCH {
            launch()?;
        }
        let end = stream.record()?;
        end.synchronize()?;
        t.push(start.elapsed_ms(&end)? as f64 / BATCH as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[REPS / 2])
}

fn random_buffer(
    pool: &MemPool,
    stream: &Stream,
    rng: &mut rand::rngs::StdRng,
    n: usize,
) -> warpline::Result<DeviceBuffer<bf16>> {
    let host: Vec<bf16> = (0..n)
        .map(|_| {
            let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.random();
            bf16::from_f64((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos())
        })
        .collect();
    let mut b = pool.alloc_async::<bf16>(stream, n)?;
    b.copy_from_host(&host)?;
    Ok(b)
}

fn shapes() -> Vec<[usize; 4]> {
    match std::env::var("WARPLINE_BATCHED_SHAPES") {
        Ok(v) => v
            .split(',')
            .map(|s| {
                warpline_suite::support::parse_dims::<4>(s)
                    .expect("WARPLINE_BATCHED_SHAPES: BxMxNxK,...")
            })
            .collect(),
        Err(_) => vec![
            [16, 2048, 2048, 2048],
            [32, 1024, 1024, 1024],
            [8, 4096, 4096, 1024],
            [16, 2000, 2000, 2048],
        ],
    }
}

fn run(dev: &Device) -> warpline::Result<()> {
    let caps = dev.capabilities();
    println!("device: {} ({} SMs)", caps.name, caps.sm_count);
    let gemm = BatchedGemm::new(dev)?;
    let stream = dev.new_stream()?;
    let pool = MemPool::new(dev, 0)?;
    let cublas = CublasBatchedGemm::new(dev, &stream)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(22);
    println!(
        "{:>24} {:>12} {:>10} {:>10} {:>8}",
        "batch x M x N x K", "kernel", "ms", "TFLOP/s", "ratio"
    );
    for [batch, m, n, k] in shapes() {
        // Tight pitches, rounded up to 8 elements (16 bytes).
        let (lda, ldc) = (k.next_multiple_of(8), n.next_multiple_of(8));
        let (sa, sb, sc) = (m * lda, n * lda, m * ldc);
        let da = random_buffer(&pool, &stream, &mut rng, batch * sa)?;
        let db = random_buffer(&pool, &stream, &mut rng, batch * sb)?;
        let mut dc = pool.alloc_async::<bf16>(&stream, batch * sc)?;
        let mut dc_ref = pool.alloc_async::<bf16>(&stream, batch * sc)?;
        let a = BatchedMatrix {
            view: da.as_view(),
            batch,
            rows: m,
            cols: k,
            pitch: lda,
            batch_stride: sa,
        };
        let b = BatchedMatrix {
            view: db.as_view(),
            batch,
            rows: n,
            cols: k,
            pitch: lda,
            batch_stride: sb,
        };
        let flops = 2.0 * (batch * m * n) as f64 * k as f64;
        let mut c_ref = BatchedMatrixMut {
            view: dc_ref.as_view_mut(),
            batch,
            rows: m,
            cols: n,
            pitch: ldc,
            batch_stride: sc,
        };
        let warm = std::time::Instant::now();
        while warm.elapsed().as_secs_f64() * 1e3 < WARM_MS {
            cublas.gemm(&a, &b, &mut c_ref)?;
            stream.synchronize()?;
        }
        let t_cublas = median_ms(&stream, || cublas.gemm(&a, &b, &mut c_ref))?;
        let c = BatchedMatrixMut {
            view: dc.as_view_mut(),
            batch,
            rows: m,
            cols: n,
            pitch: ldc,
            batch_stride: sc,
        };
        let mut plan = gemm.plan(&stream, a, b, c)?;
        let t_ours = median_ms(&stream, || plan.launch())?;
        drop(plan);
        let shape = format!("{batch} x {m} x {n} x {k}");
        for (name, t) in [("cuBLAS", t_cublas), ("warpline", t_ours)] {
            println!(
                "{shape:>24} {name:>12} {t:>10.3} {:>10.1} {:>8.3}",
                flops / t / 1e9,
                t_cublas / t
            );
        }
        // Spot check: the two outputs agree within two BF16 roundings of the larger value plus
        // the FP32 accumulation bound (1e-3 of sum |a b| ~ K for unit normals: 1e-3 * 0.8 K).
        let mut ours = vec![bf16::ZERO; batch * sc];
        let mut theirs = vec![bf16::ZERO; batch * sc];
        dc.copy_to_host(&mut ours)?;
        dc_ref.copy_to_host(&mut theirs)?;
        let mut bad = 0usize;
        for _ in 0..4096 {
            let (bt, i, j) = (
                rng.random_range(0..batch),
                rng.random_range(0..m),
                rng.random_range(0..n),
            );
            let at = bt * sc + i * ldc + j;
            let (x, y) = (ours[at].to_f64(), theirs[at].to_f64());
            let bound = x.abs().max(y.abs()) / 128.0 + 1e-3 * 0.8 * k as f64;
            // NaN counts as a mismatch.
            use std::cmp::Ordering::{Equal, Less};
            if !matches!((x - y).abs().partial_cmp(&bound), Some(Less | Equal)) {
                bad += 1;
            }
        }
        if bad > 0 {
            println!("{shape:>24} MISMATCH: {bad} of 4096 sampled elements differ from cuBLAS");
            std::process::exit(1);
        }
    }
    Ok(())
}

fn main() {
    let Some(dev) = gpu_or_skip("bench batched_gemm") else {
        return;
    };
    if dev.capabilities().compute_capability != (9, 0) {
        eprintln!("SKIPPED bench batched_gemm: not a compute capability 9.0 device (sm_90a)");
        return;
    }
    if let Err(e) = run(&dev) {
        eprintln!("bench batched_gemm: {e}");
        std::process::exit(1);
    }
}
