//! BF16 tensor-core GEMM throughput (`TcGemm`, FP32 accumulation, BF16 and f32 output; B
//! column-major) side by side with cuBLAS `cublasGemmEx` (BF16 in, `CUBLAS_COMPUTE_32F`, the
//! same output type) in the same run, at the six shapes (M x N x K): 2048^3, 4096^3,
//! 8192^3, 8192x8192x1024, 4096x14336x4096, 16384x4096x4096, and issue 20's 3000x5000x2056,
//! 6144^3 and 128x12288x5376. Per shape: cluster 1 and 2, raster along M and along N, ping-pong
//! (options from the environment: `Knobs`); for M <= 512 also the swap-AB configuration
//! (automatic, ksplit 1, 2, 4; 64-token tiles). Then a chain of two
//! dependent GEMMs (`C1 = A B1`, `C2 = C1 B2`, 4096^3 each) launched back to back, with and
//! without PDL.
//!
//! Random normal inputs (input data changes power draw and so clocks). Per shape and output
//! type, after warm-up (3 launches of each kernel, then `WARM_MS` of cuBLAS), `REPS` rounds each
//! time one batch of `BATCH` launches of every kernel, cuBLAS first (CUDA events around the
//! batch; prepared plans, so no tensor-map upload is timed); each row is the median, and its
//! ratio is to cuBLAS's median of the same rounds. TFLOP/s = 2 M N K / time. Without a driver, or
//! on a device other than compute capability 9.0, it prints why it skipped and exits 0.

use rand::{Rng, SeedableRng};
use warpline::kernels::decode_gemm::GemmConfig;
use warpline::kernels::tc_gemm::{
    BLayout, CublasGemmEx, Matrix, MatrixMut, Raster, SwapAbConfig, TcGemm, TcGemmOptions,
    TcGemmPlan, TcOutput,
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

fn normal_bf16(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| {
            let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.random();
            bf16::from_f64((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos())
        })
        .collect()
}

fn random_buffer(
    pool: &MemPool,
    stream: &Stream,
    rng: &mut rand::rngs::StdRng,
    n: usize,
) -> warpline::Result<DeviceBuffer<bf16>> {
    let mut b = pool.alloc_async::<bf16>(stream, n)?;
    b.copy_from_host(&normal_bf16(rng, n))?;
    Ok(b)
}

fn run(dev: &Device) -> warpline::Result<()> {
    let caps = dev.capabilities();
    println!("device: {} ({} SMs)", caps.name, caps.sm_count);
    // WARPLINE_TC_PTX=file: another build of the sm_90a module (same contract), to compare kernel
    // variants in one run; WARPLINE_TC_SHAPES=MxNxK,...: only these shapes (any shape).
    let tc = match std::env::var("WARPLINE_TC_PTX") {
        Ok(path) => {
            let ptx = std::fs::read_to_string(&path).map_err(|e| warpline::Error::BadShape {
                what: "WARPLINE_TC_PTX",
                detail: format!("{path}: {e}"),
            })?;
            println!("sm_90a module: {path}");
            // SAFETY: WARPLINE_TC_PTX names another build of warpline's sm_90a module from
            // this checkout's gpu/src/contract.rs (the bench's documented use); the launcher
            // checks its contract hash and parameter lists.
            unsafe { TcGemm::with_ptx(dev, &ptx)? }
        }
        Err(_) => TcGemm::new(dev)?,
    };
    let only: Option<Vec<String>> = std::env::var("WARPLINE_TC_SHAPES")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    // WARPLINE_TC_OUT=f32,bf16: C's element types (default both; cuBLAS writes the same type).
    let outs: Vec<String> = std::env::var("WARPLINE_TC_OUT")
        .unwrap_or_else(|_| "bf16,f32".into())
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let knobs = Knobs::from_env();
    let stream = dev.new_stream()?;
    let pool = MemPool::device_default(dev, 0)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed);
    println!(
        "{:>22} {:>28} {:>10} {:>10} {:>10}",
        "M x N x K", "kernel", "ms", "TFLOP/s", "x cuBLAS"
    );
    // WARPLINE_TC_SHAPES names shapes outside this list too.
    let listed: Option<Vec<(usize, usize, usize)>> = only.as_ref().map(|v| {
        v.iter()
            .filter_map(|s| warpline_suite::support::parse_dims(s).map(|[m, n, k]| (m, n, k)))
            .collect()
    });
    let default_shapes = vec![
        (2048usize, 2048usize, 2048usize),
        (4096, 4096, 4096),
        (8192, 8192, 8192),
        (8192, 8192, 1024),
        (4096, 14336, 4096),
        (16384, 4096, 4096),
        // Issue 20's odd and skinny shapes.
        (3000, 5000, 2056),
        (6144, 6144, 6144),
        (128, 12288, 5376),
    ];
    for (m, n, k) in listed.unwrap_or(default_shapes) {
        if let Some(only) = &only {
            if !only.contains(&format!("{m}x{n}x{k}")) {
                continue;
            }
        }
        let a = random_buffer(&pool, &stream, &mut rng, m * k)?;
        let b = random_buffer(&pool, &stream, &mut rng, n * k)?;
        for out in &outs {
            match out.as_str() {
                "f32" => shape_rows::<f32>(&tc, dev, &pool, &stream, &a, &b, (m, n, k), &knobs)?,
                "bf16" => shape_rows::<bf16>(&tc, dev, &pool, &stream, &a, &b, (m, n, k), &knobs)?,
                other => println!("WARPLINE_TC_OUT: unknown output type {other:?} (f32, bf16)"),
            }
        }
        stream.synchronize()?;
    }
    // Two dependent GEMMs, with and without PDL on the second.
    let s = 4096usize;
    let a = random_buffer(&pool, &stream, &mut rng, s * s)?;
    let b1 = random_buffer(&pool, &stream, &mut rng, s * s)?;
    let b2 = random_buffer(&pool, &stream, &mut rng, s * s)?;
    let mut c1 = pool.alloc_async::<bf16>(&stream, s * s)?;
    let mut c2 = pool.alloc_async::<f32>(&stream, s * s)?;
    let mut times = Vec::new();
    for pdl in [false, true] {
        let opts = TcGemmOptions {
            pdl,
            ..Default::default()
        };
        let plan: TcGemmPlan<'_> = tc.plan_chain2(
            &stream,
            Matrix::new(a.as_view(), s, s, s),
            Matrix::new(b1.as_view(), s, s, s),
            BLayout::ColMajor,
            MatrixMut::new(c1.as_view_mut(), s, s, s),
            Matrix::new(b2.as_view(), s, s, s),
            BLayout::ColMajor,
            MatrixMut::new(c2.as_view_mut(), s, s, s),
            &opts,
        )?;
        let ms = median_ms(&stream, || plan.launch())?;
        println!(
            "chain of two {s}^3 GEMMs, PDL {pdl:>5}: {ms:.4} ms ({:.1} TFLOP/s)",
            plan.flops() / ms / 1e9
        );
        times.push(ms);
    }
    println!(
        "PDL saves {:.2} us per chain ({:.3}x)",
        (times[0] - times[1]) * 1e3,
        times[0] / times[1]
    );
    stream.synchronize()
}

/// Bench options from the environment.
struct Knobs {
    /// WARPLINE_TC_GROUPS=4,16: also these raster band widths (cluster 2, both orders).
    groups: Vec<u32>,
    /// WARPLINE_TC_CLUSTERS=64,...: also cluster 2 along N with these persistent grid sizes (in
    /// clusters) instead of every resident cluster.
    clusters: Vec<u32>,
    /// WARPLINE_TC_PINGPONG=0: leave out the ping-pong rows.
    pingpong: bool,
}

impl Knobs {
    fn from_env() -> Self {
        let list = |var: &str| -> Vec<u32> {
            std::env::var(var)
                .ok()
                .map(|v| v.split(',').filter_map(|g| g.trim().parse().ok()).collect())
                .unwrap_or_default()
        };
        Self {
            groups: list("WARPLINE_TC_GROUPS"),
            clusters: list("WARPLINE_TC_CLUSTERS"),
            pingpong: std::env::var("WARPLINE_TC_PINGPONG").map_or(true, |v| v != "0"),
        }
    }
}

/// One shape with output type `O`: cuBLAS and every tc_gemm variant, timed round-robin (each
/// round: one batch of each, cuBLAS first) so all see the same clocks and temperature; one row
/// per kernel with the median batch time and its ratio to cuBLAS's median.
#[allow(clippy::too_many_arguments)]
fn shape_rows<O: TcOutput<bf16>>(
    tc: &TcGemm<'_>,
    dev: &Device,
    pool: &MemPool,
    stream: &Stream,
    a: &DeviceBuffer<bf16>,
    b: &DeviceBuffer<bf16>,
    (m, n, k): (usize, usize, usize),
    knobs: &Knobs,
) -> warpline::Result<()> {
    let flop = 2.0 * m as f64 * n as f64 * k as f64;
    let out = if O::IS_F32 { "f32" } else { "bf16" };
    let shape = format!("{m}x{n}x{k} {out}");
    let default_group = TcGemmOptions::default().group;
    let base = |cluster, raster, pingpong, group, clusters| TcGemmOptions {
        cluster: Some(cluster),
        raster,
        pingpong,
        group,
        clusters,
        ..Default::default()
    };
    let mut variants = Vec::new();
    for c in [1u32, 2] {
        for r in [Raster::AlongM, Raster::AlongN] {
            variants.push(base(c, r, false, default_group, None));
        }
    }
    if knobs.pingpong {
        for c in [1u32, 2] {
            variants.push(base(c, Raster::AlongM, true, default_group, None));
        }
    }
    for &g in &knobs.groups {
        for r in [Raster::AlongM, Raster::AlongN] {
            variants.push(base(2, r, false, g, None));
        }
    }
    for &n in &knobs.clusters {
        variants.push(base(2, Raster::AlongN, false, default_group, Some(n)));
    }
    // Skinny problems: GemmConfig::Auto's choice, then the swap-AB configuration, automatic and
    // with each ksplit.
    if m <= 512 {
        variants.push(TcGemmOptions::default());
        for (tokens, ks) in [
            (None, None),
            (None, Some(1u32)),
            (None, Some(2)),
            (None, Some(4)),
            (Some(64u32), None),
            (Some(64), Some(1)),
            (Some(64), Some(2)),
        ] {
            variants.push(TcGemmOptions {
                config: GemmConfig::SwapAb,
                swap_ab: SwapAbConfig {
                    tokens,
                    ksplit: ks,
                    ..Default::default()
                },
                ..Default::default()
            });
        }
    }
    // One C per kernel: a plan borrows its C exclusively for its lifetime.
    let mut outs = (0..=variants.len())
        .map(|_| pool.alloc_async::<O>(stream, m * n))
        .collect::<warpline::Result<Vec<_>>>()?;
    let (c_blas, c_ours) = outs.split_first_mut().expect("one C per kernel");
    let blas = CublasGemmEx::new(dev, stream)?;
    let (am, bm) = (
        Matrix::new(a.as_view(), m, k, k),
        Matrix::new(b.as_view(), n, k, k),
    );
    let mut cm = MatrixMut::new(c_blas.as_view_mut(), m, n, n);
    let mut names = vec!["cuBLAS GemmEx bf16".to_string()];
    let mut plans = Vec::new();
    for (opts, c) in variants.iter().zip(c_ours.iter_mut()) {
        let x = opts.cluster.unwrap_or(0);
        let r = opts.raster;
        let cv = MatrixMut::new(c.as_view_mut(), m, n, n);
        match tc.plan(stream, am, bm, BLayout::ColMajor, cv, 1.0, 0.0, opts) {
            Ok(plan) if opts.config == GemmConfig::Auto && !opts.cooperative_knobs() => {
                let k = plan.kernel_names().join(",");
                names.push(format!("auto {}", k.trim_start_matches("tc_gemm_bf16_")));
                plans.push(plan);
            }
            Ok(plan) if opts.config == GemmConfig::SwapAb => {
                let sh = plan.swap_ab_shapes()[0];
                names.push(format!("swapab n{} ks{}", sh.tokens, sh.ksplit));
                plans.push(plan);
            }
            Ok(plan) => {
                let kind = if opts.pingpong { "ping-pong" } else { "coop" };
                let g = if opts.group == default_group {
                    String::new()
                } else {
                    format!(" g{}", opts.group)
                };
                let grid = opts.clusters.map_or(String::new(), |n| format!(" {n}cl"));
                names.push(format!("tc_gemm {kind} x{x} {r:?}{g}{grid}"));
                plans.push(plan);
            }
            Err(e) => println!("{shape:>22} tc_gemm x{x} {r:?}: {e}"),
        }
    }
    let mut launch = |i: usize| -> warpline::Result<()> {
        if i == 0 {
            blas.gemm(&am, &bm, BLayout::ColMajor, &mut cm, 1.0, 0.0)
        } else {
            plans[i - 1].launch()
        }
    };
    let kernels = names.len();
    // Warm-up: every kernel, then about WARM_MS of cuBLAS so the clocks settle.
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
            "{shape:>22} {name:>28} {ms:>10.4} {:>10.1} {:>10.3}",
            flop / ms / 1e9,
            med[0] / ms
        );
    }
    stream.synchronize()
}

fn main() {
    let Some(dev) = gpu_or_skip("bench tc_gemm") else {
        return;
    };
    if dev.capabilities().compute_capability != (9, 0) {
        eprintln!("SKIPPED bench tc_gemm: not a compute capability 9.0 device (sm_90a)");
        return;
    }
    if let Err(e) = run(&dev) {
        eprintln!("bench tc_gemm: {e}");
        std::process::exit(1);
    }
}
