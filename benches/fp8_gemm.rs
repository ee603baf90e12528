//! FP8 tensor-core GEMM throughput (issue 20): `TcGemm::plan_fp8` (E4M3 A and B, B column-major
//! "TN", per-tensor scales from device memory, FP32 accumulation, BF16 output) side by side with
//! cuBLASLt FP8 (`cublasLtMatmul`, E4M3, the same scale pointers, BF16 D), in the same process
//! and the same rounds, at 4096^3, 8192^3 and 4096x7168x16384 (M x N x K).
//!
//! cuBLASLt runs twice: its default (the FP8 accumulators promoted to FP32 periodically) and
//! with `CUBLASLT_MATMUL_DESC_FAST_ACCUM` (no promotion, which is what tc_gemm does). Each
//! tc_gemm row prints its ratio to both; the figure is the ratio to the faster of the two.
//! tc_gemm variants: cooperative and ping-pong consumers, clusters 1 and 2, raster along M and
//! along N.
//!
//! Block-scaled rows (DeepSeek-V3 scales, `TcGemm::plan_fp8_block_scaled`: `1 x 128` on A,
//! `128 x 128` on B, promoted to FP32 every 128-deep k-block): clusters 1 and 2, raster along M
//! and N, beside the per-tensor rows and cuBLASLt block-scaled (`CublasLtFp8::plan_block_scaled`:
//! `CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F` on our B, `VEC128_32F` on our A, which cudarc
//! 0.19.10's cublaslt exposes; cuBLAS 12.9+; timed last in each round). After the rounds the
//! cuBLASLt block-scaled output is compared with tc_gemm's (`max |diff| / max |C|`: about 1e-2 for
//! bf16 C when both read the scales alike, order 1 when cuBLASLt expects another scale layout).
//!
//! Random normal inputs scaled into E4M3's range (input data changes power draw and so clocks).
//! Per shape, after warm-up (3 launches of each kernel, then `WARM_MS` of cuBLASLt), `REPS`
//! rounds each time one batch of `BATCH` launches of every kernel, cuBLASLt first (CUDA events
//! around each batch; prepared plans, so neither tensor-map uploads nor cuBLASLt's heuristic are
//! timed); each row is the median. TFLOP/s = 2 M N K / time. Environment:
//! `WARPLINE_FP8_SHAPES=MxNxK,...` (only these), `WARPLINE_FP8_OUT=bf16|f32` (default bf16).
//! Without a driver, or on a device other than compute capability 9.0, it prints why it skipped
//! and exits 0.

use rand::{Rng, SeedableRng};
use warpline::kernels::tc_gemm::{
    BLayout, CublasLtFp8, Fp8BlockScales, Fp8Scales, Matrix, MatrixMut, Raster, TcGemm,
    TcGemmOptions, TcOutput,
};
use warpline::{bf16, Device, DeviceBuffer, MemPool, Stream, F8E4M3};
use warpline_suite::support::gpu_or_skip;

const REPS: usize = 15;
const BATCH: usize = 10;
/// Milliseconds of cuBLASLt launches before each shape's timed rounds, to settle the clocks.
const WARM_MS: f64 = 300.0;

fn random_fp8(
    pool: &MemPool,
    stream: &Stream,
    rng: &mut rand::rngs::StdRng,
    n: usize,
    spread: f64,
) -> warpline::Result<DeviceBuffer<F8E4M3>> {
    let v: Vec<F8E4M3> = (0..n)
        .map(|_| {
            let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.random();
            let x = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
            F8E4M3::from_f32((spread * x) as f32)
        })
        .collect();
    let mut b = pool.alloc_async::<F8E4M3>(stream, n)?;
    b.copy_from_host(&v)?;
    Ok(b)
}

fn run(dev: &Device) -> warpline::Result<()> {
    let caps = dev.capabilities();
    println!("device: {} ({} SMs)", caps.name, caps.sm_count);
    let tc = TcGemm::new(dev)?;
    let only: Option<Vec<String>> = std::env::var("WARPLINE_FP8_SHAPES")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let out = std::env::var("WARPLINE_FP8_OUT").unwrap_or_else(|_| "bf16".into());
    let stream = dev.new_stream()?;
    let pool = MemPool::device_default(dev, 0)?;
    let lt = CublasLtFp8::new(dev, &stream)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xf8);
    // Per-tensor scales as a quantizer would produce them (not powers of two).
    let mut sa = pool.alloc_async::<f32>(&stream, 1)?;
    let mut sb = pool.alloc_async::<f32>(&stream, 1)?;
    sa.copy_from_host(&[0.37])?;
    sb.copy_from_host(&[1.9])?;
    let scales = Fp8Scales::new(sa.as_view(), sb.as_view());
    println!(
        "{:>24} {:>30} {:>10} {:>10} {:>12} {:>12}",
        "M x N x K", "kernel", "ms", "TFLOP/s", "x cuBLASLt", "x Lt fast"
    );
    let mut worst: Option<(String, f64)> = None;
    for (m, n, k) in [
        (4096usize, 4096usize, 4096usize),
        (8192, 8192, 8192),
        (4096, 7168, 16384),
    ] {
        if let Some(only) = &only {
            if !only.contains(&format!("{m}x{n}x{k}")) {
                continue;
            }
        }
        let a = random_fp8(&pool, &stream, &mut rng, m * k, 8.0)?;
        let b = random_fp8(&pool, &stream, &mut rng, n * k, 0.5)?;
        // Block scales as a 1 x 128 / 128 x 128 quantizer would produce them: 0.5 .. 2.
        let (kb, nb) = (k.div_ceil(128), n.div_ceil(128));
        let mut random_scales = |len: usize| -> warpline::Result<DeviceBuffer<f32>> {
            let v: Vec<f32> = (0..len).map(|_| rng.random_range(0.5f32..2.0)).collect();
            let mut d = pool.alloc_async::<f32>(&stream, len)?;
            d.copy_from_host(&v)?;
            Ok(d)
        };
        let (bsa, bsb) = (random_scales(kb * m)?, random_scales(nb * kb)?);
        let block = Fp8BlockScales::packed(bsa.as_view(), bsb.as_view(), m, k);
        let best = match out.as_str() {
            "f32" => shape_rows::<f32>(&tc, &lt, &pool, &stream, &a, &b, (m, n, k), scales, block)?,
            _ => shape_rows::<bf16>(&tc, &lt, &pool, &stream, &a, &b, (m, n, k), scales, block)?,
        };
        let name = format!("{m}x{n}x{k}");
        if worst.as_ref().is_none_or(|(_, r)| best < *r) {
            worst = Some((name, best));
        }
        stream.synchronize()?;
    }
    if let Some((name, r)) = worst {
        println!(
            "fp8 worst shape: {name}, best tc_gemm variant at {r:.3}x the faster cuBLASLt mode"
        );
    }
    stream.synchronize()
}

/// One shape: cuBLASLt (default, fast accumulation), every per-tensor tc_gemm variant and the
/// block-scaled variants, timed round-robin. Returns the best per-tensor tc_gemm variant's ratio
/// to the faster cuBLASLt mode; prints the best block-scaled variant's.
#[allow(clippy::too_many_arguments)]
fn shape_rows<O: TcOutput<bf16>>(
    tc: &TcGemm<'_>,
    lt: &CublasLtFp8,
    pool: &MemPool,
    stream: &Stream,
    a: &DeviceBuffer<F8E4M3>,
    b: &DeviceBuffer<F8E4M3>,
    (m, n, k): (usize, usize, usize),
    scales: Fp8Scales<'_>,
    block: Fp8BlockScales<'_>,
) -> warpline::Result<f64> {
    let flop = 2.0 * m as f64 * n as f64 * k as f64;
    let shape = format!("{m}x{n}x{k} {}", if O::IS_F32 { "f32" } else { "bf16" });
    let mut variants = Vec::new();
    for pingpong in [false, true] {
        for cluster in [1u32, 2] {
            for raster in [Raster::AlongM, Raster::AlongN] {
                variants.push(TcGemmOptions {
                    cluster: Some(cluster),
                    raster,
                    pingpong,
                    ..Default::default()
                });
            }
        }
    }
    let block_variants: Vec<TcGemmOptions> = [1u32, 2]
        .into_iter()
        .flat_map(|cluster| {
            [Raster::AlongM, Raster::AlongN].map(|raster| TcGemmOptions {
                cluster: Some(cluster),
                raster,
                ..Default::default()
            })
        })
        .collect();
    // One C per kernel: a plan borrows its C exclusively.
    let mut outs = (0..variants.len() + block_variants.len() + 3)
        .map(|_| pool.alloc_async::<O>(stream, m * n))
        .collect::<warpline::Result<Vec<_>>>()?;
    let (am, bm) = (
        Matrix::new(a.as_view(), m, k, k),
        Matrix::new(b.as_view(), n, k, k),
    );
    let (lt_outs, tc_outs) = outs.split_at_mut(3);
    let [lt_c, lt_fast_c, lt_block_c] = lt_outs else {
        unreachable!("three cuBLASLt outputs")
    };
    let lt_plan = lt.plan(
        am,
        bm,
        BLayout::ColMajor,
        MatrixMut::new(lt_c.as_view_mut(), m, n, n),
        scales,
        1.0,
        0.0,
        false,
    )?;
    let lt_fast = lt.plan(
        am,
        bm,
        BLayout::ColMajor,
        MatrixMut::new(lt_fast_c.as_view_mut(), m, n, n),
        scales,
        1.0,
        0.0,
        true,
    )?;
    let mut names = vec![
        "cuBLASLt fp8".to_string(),
        "cuBLASLt fp8 fast-accum".to_string(),
    ];
    let mut plans = Vec::new();
    let (tc_outs, block_outs) = tc_outs.split_at_mut(variants.len());
    for (opts, c) in variants.iter().zip(tc_outs.iter_mut()) {
        let cv = MatrixMut::new(c.as_view_mut(), m, n, n);
        let (x, r) = (opts.cluster.unwrap_or(0), opts.raster);
        let kind = if opts.pingpong { "ping-pong" } else { "coop" };
        match tc.plan_fp8(
            stream,
            am,
            bm,
            BLayout::ColMajor,
            cv,
            scales,
            1.0,
            0.0,
            opts,
        ) {
            Ok(plan) => {
                names.push(format!("tc_gemm e4m3 {kind} x{x} {r:?}"));
                plans.push(plan);
            }
            Err(e) => println!("{shape:>24} tc_gemm e4m3 x{x} {r:?}: {e}"),
        }
    }
    // Kernels from here on are block-scaled.
    let first_block = names.len();
    for (opts, c) in block_variants.iter().zip(block_outs.iter_mut()) {
        let cv = MatrixMut::new(c.as_view_mut(), m, n, n);
        let (x, r) = (opts.cluster.unwrap_or(0), opts.raster);
        match tc.plan_fp8_block_scaled(stream, am, bm, BLayout::ColMajor, cv, block, 1.0, 0.0, opts)
        {
            Ok(plan) => {
                names.push(format!("tc_gemm e4m3 block-scaled x{x} {r:?}"));
                plans.push(plan);
            }
            Err(e) => println!("{shape:>24} tc_gemm e4m3 block-scaled x{x} {r:?}: {e}"),
        }
    }
    let block_end = names.len();
    // cuBLASLt block-scaled (cuBLAS 12.9+), last; its output is compared with tc_gemm's below.
    let lt_block = match lt.plan_block_scaled(
        am,
        bm,
        BLayout::ColMajor,
        MatrixMut::new(lt_block_c.as_view_mut(), m, n, n),
        block,
        1.0,
        0.0,
    ) {
        Ok(p) => {
            names.push("cuBLASLt fp8 block-scaled".to_string());
            Some(p)
        }
        Err(e) => {
            println!("{shape:>24} cuBLASLt fp8 block-scaled: {e}");
            None
        }
    };
    let launch = |i: usize| -> warpline::Result<()> {
        match i {
            0 => lt_plan.launch(),
            1 => lt_fast.launch(),
            _ if i - 2 < plans.len() => plans[i - 2].launch(),
            _ => lt_block.as_ref().map_or(Ok(()), |p| p.launch()),
        }
    };
    let kernels = names.len();
    for i in 0..kernels {
        for _ in 0..3 {
            launch(i)?;
        }
    }
    let t0 = stream.record()?;
    launch(0)?;
    let t1 = stream.record()?;
    t1.synchronize()?;
    let one = (t0.elapsed_ms(&t1)? as f64).max(1e-3);
    for _ in 0..((WARM_MS / one) as usize).min(100_000) {
        launch(0)?;
    }
    stream.synchronize()?;
    let mut times = vec![Vec::with_capacity(REPS); kernels];
    for _ in 0..REPS {
        for (i, t) in times.iter_mut().enumerate() {
            let start = stream.record()?;
            for _ in 0..BATCH {
                launch(i)?;
            }
            let end = stream.record()?;
            end.synchronize()?;
            t.push(start.elapsed_ms(&end)? as f64 / BATCH as f64);
        }
    }
    let med: Vec<f64> = times
        .into_iter()
        .map(|mut t| {
            t.sort_by(f64::total_cmp);
            t[t.len() / 2]
        })
        .collect();
    for (name, ms) in names.iter().zip(&med) {
        println!(
            "{shape:>24} {name:>30} {ms:>10.4} {:>10.1} {:>12.3} {:>12.3}",
            flop / ms / 1e9,
            med[0] / ms,
            med[1] / ms
        );
    }
    let lt_best = med[0].min(med[1]);
    let ours_best = med[2..first_block]
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let block_best = med[first_block..block_end]
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min);
    println!(
        "{shape:>24} block-scaled best: {:.1} TFLOP/s, {:.3}x the best per-tensor tc_gemm, {:.3}x cuBLASLt (promoting), {:.3}x the faster cuBLASLt mode",
        flop / block_best / 1e9,
        ours_best / block_best,
        med[0] / block_best,
        lt_best / block_best
    );
    let lt_block_ms = lt_block.as_ref().map(|_| med[block_end]);
    // The plans borrow their C exclusively: end them before reading C back.
    drop(plans);
    drop(lt_block);
    stream.synchronize()?;
    if let (Some(lt_ms), true) = (lt_block_ms, block_end > first_block) {
        // Same inputs and scales: cuBLASLt's block-scaled D against the first block-scaled
        // tc_gemm C (both launched and synchronized above). A disagreement of order 1 means
        // cuBLASLt reads the scales in another layout than `Fp8BlockScales`'s.
        let mut ours = vec![O::from_f32(0.0); m * n];
        let mut theirs = vec![O::from_f32(0.0); m * n];
        block_outs[0].copy_to_host(&mut ours)?;
        lt_block_c.copy_to_host(&mut theirs)?;
        let (mut diff, mut mag) = (0f64, 0f64);
        for (x, y) in ours.iter().zip(&theirs) {
            let (x, y) = (x.to_f32() as f64, y.to_f32() as f64);
            diff = diff.max((x - y).abs());
            mag = mag.max(x.abs());
        }
        println!(
            "{shape:>24} cuBLASLt block-scaled {lt_ms:.4} ms; block-scaled tc_gemm vs cuBLASLt: max |diff| / max |C| = {:.2e}",
            diff / mag.max(f64::MIN_POSITIVE)
        );
    }
    stream.synchronize()?;
    Ok(lt_best / ours_best)
}

fn main() {
    let Some(dev) = gpu_or_skip("bench fp8_gemm") else {
        return;
    };
    if dev.capabilities().compute_capability != (9, 0) {
        eprintln!("SKIPPED bench fp8_gemm: not a compute capability 9.0 device (sm_90a)");
        return;
    }
    if let Err(e) = run(&dev) {
        eprintln!("bench fp8_gemm: {e}");
        std::process::exit(1);
    }
}
