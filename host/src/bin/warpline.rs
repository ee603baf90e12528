//! `warpline`: run warpline's kernels and pipelines on GPU 0 from the command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use warpline::stress::{self, StressOptions};
use warpline::{
    bandwidth, npy, reference, BatchPipeline, Device, Error, PinnedBuffer, PipelineReport, Result,
};

#[derive(Parser)]
#[command(
    name = "warpline",
    version,
    about = "Rust-built Hopper kernels streamed over CUDA streams"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Stream batches of C = A + B through the multi-stream pipeline
    /// (alloc-async -> H2D -> ws_vector_add -> D2H -> free-async per batch).
    Pipeline(PipelineArgs),
    /// Print the device's capabilities and the module's kernels.
    Info,
    /// GEMM. `--dtype f32` (default): batched 128x128x128 FP32 GEMM C_t = A_t x B_t with
    /// cluster_tile_gemm, tile_gemm and cuBLAS strided-batched SGEMM, CPU-verified, with a
    /// throughput table. `--dtype bf16|fp16`: the tensor-core GEMM C[M,N] = A[M,K] B[K,N]
    /// (FP32 accumulation, f32 output) against cuBLAS GemmEx in the same run.
    Gemm(GemmArgs),
    /// Bounded stress run: pipeline batches against the CPU reference, fences from many threads,
    /// random task graphs (direct and captured) and host callbacks, every wait bounded; prints
    /// runs, hangs, wrong results and time per section. Exit status 1 on any hang, wrong result
    /// or error.
    Stress(StressArgs),
}

#[derive(Args)]
struct StressArgs {
    /// Fence tickets in all, spread over --fence-threads threads (0 skips the fences).
    #[arg(long, default_value_t = stress::DEFAULT_FENCE_TICKETS)]
    fence_tickets: usize,
    /// Threads taking fence tickets (1..=64); every fourth has a fence of its own, the others
    /// share one.
    #[arg(long, default_value_t = stress::DEFAULT_FENCE_THREADS)]
    fence_threads: usize,
    /// Pipeline batches in all, checked against the f64 CPU reference (0 skips the pipeline).
    #[arg(long, default_value_t = stress::DEFAULT_BATCHES)]
    batches: usize,
    /// Floats per pipeline batch.
    #[arg(long, default_value_t = stress::DEFAULT_BATCH_ELEMS)]
    batch_elems: usize,
    /// Streams of the pipeline (1..=32).
    #[arg(long, default_value_t = stress::DEFAULT_PIPELINE_STREAMS)]
    pipeline_streams: usize,
    /// Random task graphs, and as many host-callback graphs (0 skips both).
    #[arg(long, default_value_t = stress::DEFAULT_GRAPHS)]
    graphs: usize,
    /// Bound of every wait, milliseconds: a wait that takes longer is a counted hang.
    #[arg(long, default_value_t = stress::DEFAULT_BOUND.as_millis() as u64)]
    bound_ms: u64,
    /// Seed of the random choices (default: a fresh one; it is printed, so a failure can be
    /// repeated).
    #[arg(long)]
    seed: Option<u64>,
    /// Print the report as one JSON object.
    #[arg(long)]
    json: bool,
    /// Progress lines on stderr (where a run is, should it hang outside its bounded waits).
    #[arg(long)]
    progress: bool,
}

#[derive(Args)]
struct PipelineArgs {
    /// Non-blocking streams the batches go round-robin over (1..=32).
    #[arg(long, default_value_t = 3)]
    streams: usize,
    /// Batches (without --a/--b: inputs are batches x batch-elems random floats).
    #[arg(long, default_value_t = 16)]
    batches: usize,
    /// Elements (f32) per batch; with --a/--b it defaults to ceil(len / batches).
    #[arg(long)]
    batch_elems: Option<usize>,
    /// Input A, a 1-D float32 .npy file (needs --b).
    #[arg(long, requires = "b")]
    a: Option<PathBuf>,
    /// Input B, a 1-D float32 .npy file of A's length (needs --a).
    #[arg(long, requires = "a")]
    b: Option<PathBuf>,
    /// Write C here as a 1-D float32 .npy file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Check every element against the f64 CPU reference.
    #[arg(long)]
    verify: bool,
    /// Also run the same batches on 1 stream in this run and print the speed-up.
    #[arg(long)]
    compare_one_stream: bool,
}

/// Why a command failed: bad flags (exit 2, like clap's own usage errors, reported before the
/// device is opened) or an error of the run (exit 2 when there is no GPU, 1 otherwise).
#[derive(Debug)]
enum CliError {
    /// A flag value that is not allowed: what was given and what is allowed.
    Usage(String),
    /// An error of warpline (device, files, memory, verification).
    Run(Error),
}

impl From<Error> for CliError {
    fn from(e: Error) -> Self {
        CliError::Run(e)
    }
}

type CliResult<T = ()> = std::result::Result<T, CliError>;

fn usage(msg: impl Into<String>) -> CliError {
    CliError::Usage(msg.into())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Pipeline(args) => pipeline(args),
        Cmd::Info => info().map_err(CliError::from),
        Cmd::Gemm(args) => gemm(args),
        Cmd::Stress(args) => stress_cmd(args),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(msg)) => {
            eprintln!("warpline: bad usage: {msg}");
            eprintln!("(see `warpline --help`)");
            ExitCode::from(2)
        }
        Err(CliError::Run(e @ (Error::NoDriver | Error::NoDevice { .. }))) => {
            eprintln!("warpline: no GPU: {e}");
            ExitCode::from(2)
        }
        Err(CliError::Run(e)) => {
            eprintln!("warpline: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Most streams a pipeline takes ([`warpline::pipeline::MAX_STREAMS`]).
const MAX_STREAMS: usize = warpline::pipeline::MAX_STREAMS;

/// `--streams` is in `1..=MAX_STREAMS`.
fn check_streams(flag: &str, streams: usize) -> CliResult {
    if (1..=MAX_STREAMS).contains(&streams) {
        Ok(())
    } else {
        Err(usage(format!(
            "{flag} {streams}: the number of streams must be between 1 and {MAX_STREAMS}"
        )))
    }
}

/// `count x bytes_each` summed over `parts`, with checked arithmetic; `None` on overflow.
fn bytes_of(parts: &[(usize, usize)]) -> Option<u64> {
    parts.iter().try_fold(0u64, |acc, &(count, each)| {
        acc.checked_add((count as u64).checked_mul(each as u64)?)
    })
}

/// Bytes of memory the kernel says are available to new allocations (`MemAvailable` of
/// /proc/meminfo), if it says.
fn host_available_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Checks that `needed` bytes of host memory (`None`: more than 2^64) for `what` can be had.
fn check_host_memory(what: &str, needed: Option<u64>) -> CliResult {
    let Some(needed) = needed else {
        return Err(usage(format!(
            "{what} needs more than 2^64 bytes of host memory"
        )));
    };
    match host_available_bytes() {
        Some(avail) if needed > avail => Err(usage(format!(
            "{what} needs {needed} bytes ({:.1} GiB) of host memory; this machine has {avail} bytes ({:.1} GiB) available",
            gib(needed),
            gib(avail)
        ))),
        _ => Ok(()),
    }
}

/// Checks that `needed` bytes of device memory for `what` are free on `dev` (cuMemGetInfo).
fn check_device_memory(dev: &Device, what: &str, needed: u64) -> CliResult {
    let (free, total) = dev.memory_info()?;
    if needed > free as u64 {
        return Err(usage(format!(
            "{what} needs {needed} bytes ({:.1} GiB) of device memory; {} has {free} bytes ({:.1} GiB) free of {total} ({:.1} GiB)",
            gib(needed),
            dev.capabilities().name,
            gib(free as u64),
            gib(total as u64)
        )));
    }
    Ok(())
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn info() -> Result<()> {
    let dev = Device::open(0)?;
    println!("{:#?}", dev.capabilities());
    println!(
        "kernels: {}",
        dev.kernel_names().collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} {elapsed}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

fn fill_random(dst: &mut [f32], pb: &ProgressBar) {
    use rand::Rng;
    let mut rng = rand::rng();
    for chunk in dst.chunks_mut(1 << 20) {
        chunk
            .iter_mut()
            .for_each(|x| *x = rng.random_range(-1.0f32..1.0));
        pb.inc(1);
    }
}

/// The pipeline's flags, checked before anything is opened or allocated; returns the input
/// length when the inputs are random (`batches x batch-elems`).
fn check_pipeline_args(args: &PipelineArgs) -> CliResult<Option<usize>> {
    check_streams("--streams", args.streams)?;
    if args.batches == 0 {
        return Err(usage("--batches 0: at least 1 batch is needed"));
    }
    if args.batch_elems == Some(0) {
        return Err(usage("--batch-elems 0: a batch needs at least 1 element"));
    }
    if args.a.is_some() {
        return Ok(None);
    }
    let be = args.batch_elems.unwrap_or(1 << 24);
    let n = be.checked_mul(args.batches).ok_or_else(|| {
        usage(format!(
            "--batches {} x --batch-elems {be} overflows the address space",
            args.batches
        ))
    })?;
    Ok(Some(n))
}

/// Host bytes of a pipeline run over `n` elements: pinned A, B, C (f32).
fn pipeline_host_bytes(n: usize) -> Option<u64> {
    bytes_of(&[(3 * 4, n)])
}

fn pipeline(args: PipelineArgs) -> CliResult {
    let random_n = check_pipeline_args(&args)?;
    if let Some(n) = random_n {
        check_host_memory(
            &format!(
                "--batches {} x --batch-elems {} (pinned A, B and C: 3 x {n} floats)",
                args.batches,
                args.batch_elems.unwrap_or(1 << 24)
            ),
            pipeline_host_bytes(n),
        )?;
    }
    // Inputs from files are read (and checked) before the device is opened, too.
    let files = match (&args.a, &args.b) {
        (Some(pa), Some(pb)) => {
            let a = npy::read_f32_1d(pa)?;
            let b = npy::read_f32_1d(pb)?;
            if a.len() != b.len() {
                return Err(Error::LengthMismatch {
                    what: "--a/--b",
                    detail: format!(
                        "{} has {} elements, {} has {}",
                        pa.display(),
                        a.len(),
                        pb.display(),
                        b.len()
                    ),
                }
                .into());
            }
            if a.is_empty() {
                return Err(Error::Empty { what: "--a" }.into());
            }
            check_host_memory(
                "--a/--b (pinned copies of A and B, and C)",
                pipeline_host_bytes(a.len()),
            )?;
            Some((a, b))
        }
        _ => None,
    };
    let dev = Device::open(0)?;
    let caps = dev.capabilities();
    println!(
        "device: {} (sm_{}{}, {} SMs, {} copy engines)",
        caps.name,
        caps.compute_capability.0,
        caps.compute_capability.1,
        caps.sm_count,
        caps.async_engines
    );
    let (a, b) = match (files, random_n) {
        (Some((a, b)), _) => (
            PinnedBuffer::from_slice(&dev, &a)?,
            PinnedBuffer::from_slice(&dev, &b)?,
        ),
        (None, n) => {
            let n = n.expect("checked: random inputs without --a/--b");
            let mut a = PinnedBuffer::<f32>::new(&dev, n)?;
            let mut b = PinnedBuffer::<f32>::new(&dev, n)?;
            let pb = bar(2 * n.div_ceil(1 << 20) as u64, "inputs");
            fill_random(&mut a, &pb);
            fill_random(&mut b, &pb);
            pb.finish_and_clear();
            (a, b)
        }
    };
    let n = a.len();
    // Both at least 1 (checked above), so no division by zero.
    let batch_elems = args.batch_elems.unwrap_or_else(|| n.div_ceil(args.batches));
    // Device memory: up to one batch in flight per stream, A, B and C of each, plus the
    // bandwidth probe's 256 MiB buffer.
    let in_flight = args.streams.min(n.div_ceil(batch_elems));
    let device_bytes = bytes_of(&[(in_flight * 3 * 4, batch_elems.min(n)), (1, 256 << 20)])
        .ok_or_else(|| usage("--batch-elems x --streams overflows"))?;
    check_device_memory(
        &dev,
        &format!("{in_flight} batches in flight (A, B, C of {batch_elems} floats each)"),
        device_bytes,
    )?;
    let mut c = PinnedBuffer::<f32>::new(&dev, n)?;

    let h2d = bandwidth::pinned_h2d_gbps(&dev, 256 << 20, 5)?;
    let run = |streams: usize, c: &mut PinnedBuffer<f32>| -> Result<PipelineReport> {
        c.fill(f32::NAN);
        let pipe = BatchPipeline::new(&dev, streams)?;
        let batches = n.div_ceil(batch_elems);
        let pb = bar(batches as u64, &format!("{streams} stream(s)"));
        let report = pipe.run_vector_add(&a, &b, c, batch_elems, |done, _| {
            pb.set_position(done as u64)
        })?;
        pb.finish_and_clear();
        Ok(report)
    };
    let baseline = if args.compare_one_stream && args.streams != 1 {
        Some(run(1, &mut c)?)
    } else {
        None
    };
    let report = run(args.streams, &mut c)?;

    if args.verify {
        let pb = bar(n.div_ceil(1 << 22) as u64, "verify");
        let mut worst = 0f64;
        for ((ca, cb), cc) in a
            .chunks(1 << 22)
            .zip(b.chunks(1 << 22))
            .zip(c.chunks(1 << 22))
        {
            let want = reference::vector_add(ca, cb);
            worst = worst.max(reference::verify(
                "pipeline C",
                cc,
                &want,
                reference::VECTOR_ADD_REL_BOUND,
            )?);
            pb.inc(1);
        }
        pb.finish_and_clear();
        println!("verified: {n} elements against the f64 CPU reference, max relative error {worst:.2e} (bound {:.2e})", reference::VECTOR_ADD_REL_BOUND);
    }
    if let Some(path) = &args.out {
        npy::write_f32(path, &[n as u64], &c)?;
        println!("wrote {}", path.display());
    }

    let bytes = report.bytes_h2d + report.bytes_d2h;
    println!();
    println!(
        "{:>8} {:>8} {:>12} {:>10} {:>10} {:>12} {:>12} {:>9}",
        "streams", "batches", "MiB moved", "time ms", "GB/s", "x H2D", "x 1.5 H2D", "overlap"
    );
    let row = |r: &PipelineReport| {
        println!(
            "{:>8} {:>8} {:>12.0} {:>10.2} {:>10.1} {:>12.3} {:>12.3} {:>9.2}",
            r.streams,
            r.batches.len(),
            bytes as f64 / (1 << 20) as f64,
            r.span_ms,
            r.pcie_gbps(),
            r.pcie_gbps() / h2d,
            r.pcie_gbps() / (1.5 * h2d),
            r.overlap()
        )
    };
    if let Some(b) = &baseline {
        row(b);
    }
    row(&report);
    println!("pinned H2D bandwidth measured in this run: {h2d:.1} GB/s (upper limit of the pipeline: 1.5 x H2D = {:.1} GB/s, two of every three bytes go host to device)", 1.5 * h2d);
    if let Some(b) = &baseline {
        println!(
            "speed-up of {} streams over 1 stream: {:.2}x",
            report.streams,
            report.pcie_gbps() / b.pcie_gbps()
        );
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum GemmKernel {
    /// cluster_tile_gemm with --cluster CTAs per cluster.
    Cluster,
    /// tile_gemm (no clusters).
    Plain,
    /// cuBLAS strided-batched SGEMM (FP32, no TF32).
    Cublas,
    /// All three.
    All,
}

/// Element type of the `gemm` subcommand's inputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum GemmDtype {
    /// FP32 batched tile GEMM (CUDA cores).
    F32,
    /// BF16 inputs, tensor cores (sm_90a).
    Bf16,
    /// FP16 inputs, tensor cores (sm_90a).
    Fp16,
}

/// `--b-layout` of the tensor-core GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum BLayoutArg {
    /// Column-major B (K-major): stored as N rows of K; a .npy B has shape (N, K).
    Col,
    /// Row-major B: K rows of N; a .npy B has shape (K, N).
    Row,
}

/// `--raster` of the tensor-core GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RasterArg {
    /// Tiles walk down M within bands of tile rows.
    M,
    /// Tiles walk along N within bands of tile columns.
    N,
}

#[derive(Args)]
struct GemmArgs {
    /// Input type: f32 (batched FP32 tile GEMM) or bf16 / fp16 (tensor-core GEMM; .npy inputs
    /// are float32 '<f4' files, rounded to the input type to nearest even; the output is float32).
    #[arg(long, value_enum, default_value_t = GemmDtype::F32)]
    dtype: GemmDtype,
    /// bf16/fp16: rows of A and C (without --a/--b: random normal inputs).
    #[arg(long)]
    m: Option<usize>,
    /// bf16/fp16: columns of B and C.
    #[arg(long)]
    n: Option<usize>,
    /// bf16/fp16: columns of A, rows of B.
    #[arg(long)]
    k: Option<usize>,
    /// bf16/fp16: layout of B (col: .npy shape (N, K); row: (K, N)).
    #[arg(long, value_enum, default_value_t = BLayoutArg::Col)]
    b_layout: BLayoutArg,
    /// bf16/fp16: tile raster order.
    #[arg(long, value_enum, default_value_t = RasterArg::M)]
    raster: RasterArg,
    /// bf16/fp16: check sampled rows and columns against the f64 CPU reference.
    #[arg(long)]
    verify: bool,
    /// Tiles T (f32; without --a/--b: random inputs of T x 128 x 128 floats).
    #[arg(long, default_value_t = 4096)]
    tiles: usize,
    /// CTAs per cluster: f32 (cluster_tile_gemm) 1, 2, 4 or 8 (default 4); bf16/fp16 1 or 2
    /// (default: 2 where the device can run it).
    #[arg(long)]
    cluster: Option<u32>,
    /// Also stream the tiles host -> device -> cluster_tile_gemm -> host through the BatchPipeline
    /// over this many streams (4 batches per stream) and report it.
    #[arg(long)]
    streams: Option<usize>,
    /// Input A: float32 .npy; f32: shape (T, 128, 128) or flat T x 16384 (sets T); bf16/fp16:
    /// shape (M, K) (needs --b).
    #[arg(long, requires = "b")]
    a: Option<PathBuf>,
    /// Input B (needs --a): f32: same shape as A; bf16/fp16: (N, K) for --b-layout col,
    /// (K, N) for row.
    #[arg(long, requires = "a")]
    b: Option<PathBuf>,
    /// Write C here as a float32 .npy file: f32: (T, 128, 128) of cluster_tile_gemm (or of
    /// --kernel); bf16/fp16: (M, N) of the tensor-core GEMM.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Which kernel(s) to run.
    #[arg(long, value_enum, default_value_t = GemmKernel::All)]
    kernel: GemmKernel,
    /// Launch the selected kernel exactly once, no warm-up, no timing loop (for
    /// `ncu --metrics dram__bytes_read.sum`).
    #[arg(long)]
    once: bool,
    /// Timed repetitions per kernel (median reported).
    #[arg(long, default_value_t = 20)]
    reps: usize,
    /// Skip the f64 CPU verification.
    #[arg(long)]
    no_verify: bool,
}

/// Host bytes of a GEMM run over `n` floats of A (and of B and C): A, B, a C read-back per kernel
/// and the kept C (f32), the f64 reference unless `--no-verify`, pinned A, B, C with `--streams`.
fn gemm_host_bytes(n: usize, verify: bool, streams: bool) -> Option<u64> {
    bytes_of(&[
        (4 * 4, n),
        (if verify { 8 } else { 0 }, n),
        (if streams { 3 * 4 } else { 0 }, n),
    ])
}

/// The GEMM's flags, checked before anything is opened or allocated.
fn check_gemm_args(args: &GemmArgs) -> CliResult {
    use warpline_gpu::contract::gemm::{CLUSTER_SIZES, MAX_TILES, TILE_ELEMS};
    let cluster = args.cluster.unwrap_or(F32_DEFAULT_CLUSTER);
    if !CLUSTER_SIZES.contains(&cluster) {
        return Err(usage(format!(
            "--cluster {cluster}: cluster_tile_gemm supports clusters of {CLUSTER_SIZES:?} CTAs"
        )));
    }
    if let Some(s) = args.streams {
        check_streams("--streams", s)?;
    }
    if args.reps == 0 {
        return Err(usage("--reps 0: at least 1 timed repetition is needed"));
    }
    if args.a.is_none() {
        if args.tiles == 0 || args.tiles > MAX_TILES {
            return Err(usage(format!(
                "--tiles {}: the number of 128x128 tiles must be between 1 and {MAX_TILES}",
                args.tiles
            )));
        }
        let n = args.tiles * TILE_ELEMS; // <= MAX_TILES x 16384 < 2^46
        check_host_memory(
            &format!("--tiles {}", args.tiles),
            gemm_host_bytes(n, !args.no_verify, args.streams.is_some()),
        )?;
    }
    Ok(())
}

/// Default `--cluster` of the FP32 mode.
const F32_DEFAULT_CLUSTER: u32 = 4;

fn gemm(args: GemmArgs) -> CliResult {
    use warpline::kernels;
    use warpline_gpu::contract::gemm::TILE_ELEMS;

    match args.dtype {
        GemmDtype::Bf16 => return tc_gemm_cmd::<warpline::bf16>(&args),
        GemmDtype::Fp16 => return tc_gemm_cmd::<warpline::f16>(&args),
        GemmDtype::F32 => {}
    }
    check_gemm_args(&args)?;
    let files = match (&args.a, &args.b) {
        (Some(pa), Some(pb)) => {
            let (a, b) = (npy::read_f32(pa)?.1, npy::read_f32(pb)?.1);
            check_host_memory(
                "--a/--b",
                gemm_host_bytes(a.len(), !args.no_verify, args.streams.is_some()),
            )?;
            Some((a, b))
        }
        _ => None,
    };
    let dev = Device::open(0)?;
    let caps = dev.capabilities();
    println!("device: {} ({} SMs)", caps.name, caps.sm_count);
    kernels::check_gemm_cluster_size(args.cluster.unwrap_or(F32_DEFAULT_CLUSTER))?;
    let (a, b) = match files {
        Some(ab) => ab,
        None => {
            let n = args.tiles * TILE_ELEMS; // checked in check_gemm_args
                                             // A, B and C on the device, checked before the host allocates and fills the inputs.
            check_device_memory(
                &dev,
                &format!("--tiles {} (A, B and C: 3 x {n} floats)", args.tiles),
                3 * 4 * n as u64,
            )?;
            let pb = bar(2 * n.div_ceil(1 << 20) as u64, "inputs");
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            fill_random(&mut a, &pb);
            fill_random(&mut b, &pb);
            pb.finish_and_clear();
            (a, b)
        }
    };
    if !a.len().is_multiple_of(TILE_ELEMS) {
        return Err(Error::BadShape {
            what: "--a",
            detail: format!("{} floats is not a whole number of 128x128 tiles", a.len()),
        }
        .into());
    }
    let tiles = a.len() / TILE_ELEMS;
    kernels::check_gemm_shapes(tiles, a.len(), b.len(), a.len())?;
    check_device_memory(
        &dev,
        &format!("{tiles} tiles (A, B and C: 3 x {} floats)", a.len()),
        3 * 4 * a.len() as u64,
    )?;

    let stream = dev.new_stream()?;
    let pool = warpline::MemPool::device_default(&dev, 0)?;
    let n = a.len();
    let mut da = pool.alloc_async::<f32>(&stream, n)?;
    let mut db = pool.alloc_async::<f32>(&stream, n)?;
    let mut dc = pool.alloc_async::<f32>(&stream, n)?;
    da.copy_from_host(&a)?;
    db.copy_from_host(&b)?;
    let blas = kernels::CublasSgemm::new(&dev, &stream)?;
    let want = if args.no_verify {
        None
    } else {
        let pb = bar(1, "f64 reference");
        let w = reference::gemm_tiles_f64(&a, &b, tiles);
        pb.finish_and_clear();
        Some(w)
    };
    let cluster = args.cluster.unwrap_or(F32_DEFAULT_CLUSTER);
    let kinds: Vec<GemmKernel> = match args.kernel {
        GemmKernel::All => vec![GemmKernel::Cublas, GemmKernel::Plain, GemmKernel::Cluster],
        k => vec![k],
    };
    let flop = 2.0 * 128f64.powi(3) * tiles as f64;
    let mut rows = Vec::new();
    let mut out_c = None;
    for kind in kinds {
        let name = match kind {
            GemmKernel::Cluster => format!("cluster_tile_gemm x{cluster}"),
            GemmKernel::Plain => "tile_gemm".to_string(),
            _ => "cuBLAS SgemmStridedBatched".to_string(),
        };
        dc.fill_async(f32::NAN)?;
        let launch = |dc: &mut warpline::DeviceBuffer<f32>| -> Result<()> {
            let (x, y, z) = (da.as_view(), db.as_view(), dc.as_view_mut());
            match kind {
                GemmKernel::Cluster => {
                    kernels::cluster_tile_gemm(&dev, &stream, x, y, z, tiles, cluster)
                }
                GemmKernel::Plain => kernels::tile_gemm(&dev, &stream, x, y, z, tiles),
                _ => blas.gemm_tiles(x, y, z, tiles),
            }
        };
        launch(&mut dc)?;
        stream.synchronize()?;
        let mut c = vec![0f32; n];
        dc.copy_to_host(&mut c)?;
        if let Some(w) = &want {
            let err = reference::verify_gemm(&name, &c, w, reference::GEMM_REL_BOUND)?;
            println!("verified {name}: {tiles} tiles, worst per-tile relative error {err:.2e} (Frobenius, bound {:.0e})", reference::GEMM_REL_BOUND);
        }
        if !args.once {
            let mut t = Vec::new();
            for _ in 0..args.reps.max(1) {
                let start = stream.record()?;
                launch(&mut dc)?;
                let end = stream.record()?;
                end.synchronize()?;
                t.push(start.elapsed_ms(&end)? as f64);
            }
            t.sort_by(f64::total_cmp);
            rows.push((name, t[t.len() / 2], kind));
        }
        if out_c.is_none() || kind == GemmKernel::Cluster {
            out_c = Some(c);
        }
    }
    if !rows.is_empty() {
        let cublas = rows.iter().find(|r| r.2 == GemmKernel::Cublas).map(|r| r.1);
        println!();
        println!(
            "{:>28} {:>10} {:>10} {:>10}",
            "kernel", "ms", "TFLOP/s", "x cuBLAS"
        );
        for (name, ms, _) in &rows {
            let ratio = cublas.map_or("-".to_string(), |c| format!("{:.3}", c / ms));
            println!(
                "{name:>28} {ms:>10.4} {:>10.2} {ratio:>10}",
                flop / ms / 1e9
            );
        }
        println!(
            "({tiles} tiles of 128x128x128, FP32, median of {} launches, CUDA events)",
            args.reps.max(1)
        );
    }
    if let (Some(path), Some(c)) = (&args.out, &out_c) {
        npy::write_f32(path, &[tiles as u64, 128, 128], c)?;
        println!("wrote {}", path.display());
    }
    if let Some(streams) = args.streams {
        let pa = PinnedBuffer::from_slice(&dev, &a)?;
        let pb = PinnedBuffer::from_slice(&dev, &b)?;
        let mut pc = PinnedBuffer::<f32>::new(&dev, n)?;
        pc.fill(f32::NAN);
        let pipe = BatchPipeline::new(&dev, streams)?;
        let batch_tiles = tiles.div_ceil(4 * streams).max(1);
        let report = pipe.run(
            &pa,
            &pb,
            &mut pc,
            batch_tiles * TILE_ELEMS,
            |s, x, y, z| {
                let t = x.len() / TILE_ELEMS;
                kernels::cluster_tile_gemm(&dev, s, x, y, z, t, cluster)
            },
            |_, _| {},
        )?;
        if let Some(w) = &want {
            reference::verify_gemm("pipeline C", &pc, w, reference::GEMM_REL_BOUND)?;
            println!("verified pipeline output");
        }
        let kernel_ms: f64 = report.batches.iter().map(|b| b.kernel_ms).sum();
        println!(
            "pipeline: {streams} stream(s), {} batches of {batch_tiles} tiles, span {:.2} ms, {:.1} GB/s over PCIe, overlap {:.2}, kernel time {:.2} ms",
            report.batches.len(),
            report.span_ms,
            report.pcie_gbps(),
            report.overlap(),
            kernel_ms
        );
    }
    Ok(())
}

/// `warpline stress`: flags checked before the device is opened, then [`stress::run`].
fn stress_cmd(args: StressArgs) -> CliResult {
    let seed = args.seed.unwrap_or_else(rand::random);
    let opts = StressOptions {
        fence_tickets: args.fence_tickets,
        fence_threads: args.fence_threads,
        batches: args.batches,
        batch_elems: args.batch_elems,
        pipeline_streams: args.pipeline_streams,
        graphs: args.graphs,
        bound: Duration::from_millis(args.bound_ms),
        seed,
        progress: args.progress,
    };
    if let Err(e) = opts.validate() {
        return Err(usage(match e {
            Error::BadShape { detail, .. } => detail,
            e => e.to_string(),
        }));
    }
    check_host_memory(
        &format!(
            "--batch-elems {} (pinned A, B and C of one pipeline run call)",
            opts.batch_elems
        ),
        Some(opts.pipeline_host_bytes()),
    )?;
    // Printed before anything runs, so a crash can be repeated too.
    eprintln!("warpline stress: seed {seed} (repeat with --seed {seed})");
    let dev = Device::open(0)?;
    let report = stress::run(&dev, &opts)?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        println!("{report}");
    }
    if report.passed() {
        return Ok(());
    }
    let [hangs, wrong, errors] = report.sections().iter().fold([0u64; 3], |acc, s| {
        [acc[0] + s.hangs, acc[1] + s.wrong, acc[2] + s.errors]
    });
    Err(Error::Verification {
        detail: format!(
            "stress run (seed {seed}): {hangs} hangs, {wrong} wrong results, {errors} errors"
        ),
    }
    .into())
}

// ------------------------------------------------------------------------------------------------
// gemm --dtype bf16|fp16: the tensor-core GEMM
// ------------------------------------------------------------------------------------------------

/// The tensor-core GEMM's flags and inputs, checked before the device is opened: `(M, N, K)`,
/// and the host A (`M x K`) and B (as stored) as float32 when read from files.
#[allow(clippy::type_complexity)]
fn check_tc_gemm_args(
    args: &GemmArgs,
) -> CliResult<((usize, usize, usize), Option<(Vec<f32>, Vec<f32>)>)> {
    if let Some(c) = args.cluster {
        if !warpline_gpu::contract::tc_gemm::CLUSTER_SIZES.contains(&c) {
            return Err(usage(format!(
                "--cluster {c}: the tensor-core GEMM supports clusters of 1 or 2 CTAs"
            )));
        }
    }
    if args.reps == 0 {
        return Err(usage("--reps 0: at least 1 timed repetition is needed"));
    }
    if args.streams.is_some() {
        return Err(usage(
            "--streams: only the f32 mode streams through the pipeline",
        ));
    }
    let col = args.b_layout == BLayoutArg::Col;
    if let (Some(pa), Some(pb)) = (&args.a, &args.b) {
        let (sa, a) = npy::read_f32(pa)?;
        let (sb, b) = npy::read_f32(pb)?;
        let (&[m, k], &[b0, b1]) = (sa.as_slice(), sb.as_slice()) else {
            return Err(usage(format!(
                "--a has shape {sa:?} and --b {sb:?}; 2-D arrays are needed: A (M, K), B (N, K) for --b-layout col or (K, N) for row"
            )));
        };
        let (bk, n) = if col { (b1, b0) } else { (b0, b1) };
        if bk != k {
            return Err(usage(format!(
                "--a is (M, K) = {sa:?} but --b ({}) {sb:?} has K = {bk}",
                if col { "col: (N, K)" } else { "row: (K, N)" }
            )));
        }
        let dims = (m as usize, n as usize, k as usize);
        for (flag, given, have) in [
            ("--m", args.m, dims.0),
            ("--n", args.n, dims.1),
            ("--k", args.k, dims.2),
        ] {
            if given.is_some_and(|g| g != have) {
                return Err(usage(format!(
                    "{flag} {} disagrees with the .npy inputs ({have})",
                    given.unwrap_or(0)
                )));
            }
        }
        return Ok((dims, Some((a, b))));
    }
    let (Some(m), Some(n), Some(k)) = (args.m, args.n, args.k) else {
        return Err(usage(
            "--dtype bf16/fp16 needs --m, --n and --k (or --a and --b .npy inputs)",
        ));
    };
    if m == 0 || n == 0 || k == 0 || [m, n, k].iter().any(|&v| v > i32::MAX as usize) {
        return Err(usage(format!(
            "--m {m} --n {n} --k {k}: each must be between 1 and 2^31 - 1"
        )));
    }
    // Host: A, B (f32 and 16-bit), C read back (f32).
    check_host_memory(
        &format!("--m {m} --n {n} --k {k}"),
        bytes_of(&[(6, m * k), (6, n * k), (4, m * n)]),
    )?;
    Ok(((m, n, k), None))
}

/// Random normal values (Box-Muller).
fn normal_f32(n: usize) -> Vec<f32> {
    use rand::Rng;
    let mut rng = rand::rng();
    (0..n)
        .map(|_| {
            let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.random();
            ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}

/// `rows x cols` values (row-major, packed) into a pitch of `pitch`, rounded to `T`; the
/// padding is zero. Also returns the rounded values widened (same layout) for the reference.
fn pitched<T: warpline::kernels::tc_gemm::TcInput>(
    v: &[f32],
    rows: usize,
    cols: usize,
    pitch: usize,
) -> (Vec<T>, Vec<f32>) {
    let mut t = vec![T::from_f32(0.0); rows * pitch];
    let mut w = vec![0f32; rows * pitch];
    for r in 0..rows {
        for c in 0..cols {
            let x = T::from_f32(v[r * cols + c]);
            t[r * pitch + c] = x;
            w[r * pitch + c] = x.to_f32();
        }
    }
    (t, w)
}

fn tc_gemm_cmd<T: warpline::kernels::tc_gemm::TcInput>(args: &GemmArgs) -> CliResult {
    use warpline::kernels::tc_gemm::{
        reference_entry, tolerance, BLayout, CublasGemmEx, HostB, Matrix, MatrixMut, Raster,
        TcGemm, TcGemmOptions,
    };
    let ((m, n, k), files) = check_tc_gemm_args(args)?;
    let layout = match args.b_layout {
        BLayoutArg::Col => BLayout::ColMajor,
        BLayoutArg::Row => BLayout::RowMajor,
    };
    let dev = Device::open(0)?;
    let caps = dev.capabilities();
    println!("device: {} ({} SMs)", caps.name, caps.sm_count);
    let tc = TcGemm::new(&dev)?;
    let (br, bc) = layout.stored(k, n);
    // Row pitches padded to 16 bytes (TMA); the logical sizes stay as given.
    let (lda, ldb, ldc) = (
        k.next_multiple_of(8),
        bc.next_multiple_of(8),
        n.next_multiple_of(4),
    );
    check_device_memory(
        &dev,
        &format!("M x N x K = {m} x {n} x {k} (A, B, C of ours and cuBLAS's)"),
        (2 * m * lda + 2 * br * ldb + 2 * 4 * m * ldc) as u64,
    )?;
    let (a32, b32) = match files {
        Some(ab) => ab,
        None => (normal_f32(m * k), normal_f32(br * bc)),
    };
    let (at, aw) = pitched::<T>(&a32, m, k, lda);
    let (bt, bw) = pitched::<T>(&b32, br, bc, ldb);
    drop((a32, b32));
    let stream = dev.new_stream()?;
    let pool = warpline::MemPool::device_default(&dev, 0)?;
    let mut da = pool.alloc_async::<T>(&stream, at.len())?;
    let mut db = pool.alloc_async::<T>(&stream, bt.len())?;
    let mut dc = pool.alloc_async::<f32>(&stream, m * ldc)?;
    let mut dref = pool.alloc_async::<f32>(&stream, m * ldc)?;
    da.copy_from_host(&at)?;
    db.copy_from_host(&bt)?;
    dc.fill_async(f32::NAN)?;
    let opts = TcGemmOptions {
        cluster: args.cluster,
        raster: match args.raster {
            RasterArg::M => Raster::AlongM,
            RasterArg::N => Raster::AlongN,
        },
        ..Default::default()
    };
    let flop = 2.0 * m as f64 * n as f64 * k as f64;
    let time = |launch: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        launch()?;
        if args.once {
            stream.synchronize()?;
            return Ok(f64::NAN);
        }
        for _ in 0..2 {
            launch()?;
        }
        let mut t = Vec::new();
        for _ in 0..args.reps {
            let start = stream.record()?;
            launch()?;
            let end = stream.record()?;
            end.synchronize()?;
            t.push(start.elapsed_ms(&end)? as f64);
        }
        t.sort_by(f64::total_cmp);
        Ok(t[t.len() / 2])
    };
    let (ours_ms, config) = {
        let plan = tc.plan(
            &stream,
            Matrix::new(da.as_view(), m, k, lda),
            Matrix::new(db.as_view(), br, bc, ldb),
            layout,
            MatrixMut::new(dc.as_view_mut(), m, n, ldc),
            1.0,
            0.0,
            &opts,
        )?;
        let config = plan.configs()[0].describe();
        (time(&mut || plan.launch())?, config)
    };
    let cublas_ms = {
        let blas = CublasGemmEx::new(&dev, &stream)?;
        let a = Matrix::new(da.as_view(), m, k, lda);
        let b = Matrix::new(db.as_view(), br, bc, ldb);
        let mut c = MatrixMut::new(dref.as_view_mut(), m, n, ldc);
        time(&mut || blas.gemm(&a, &b, layout, &mut c, 1.0, 0.0))?
    };
    let mut c = vec![0f32; m * ldc];
    dc.copy_to_host(&mut c)?;
    if !args.once {
        println!(
            "{:>28} {:>10} {:>10} {:>10}",
            "kernel", "ms", "TFLOP/s", "x cuBLAS"
        );
        for (name, ms) in [
            (format!("cuBLAS GemmEx {}", T::NAME), cublas_ms),
            (format!("tc_gemm {}", T::NAME), ours_ms),
        ] {
            println!(
                "{name:>28} {ms:>10.4} {:>10.1} {:>10.3}",
                flop / ms / 1e9,
                cublas_ms / ms
            );
        }
        println!(
            "(M x N x K = {m} x {n} x {k}, B {layout:?}, FP32 accumulation, f32 output; tc_gemm {config}; median of {} launches, CUDA events)",
            args.reps
        );
    }
    if args.verify {
        let b = HostB {
            data: &bw,
            pitch: ldb,
            layout,
        };
        let pick = |len: usize| -> Vec<usize> {
            let mut v: Vec<usize> = (0..len).step_by(len.div_ceil(6).max(1)).collect();
            v.push(len - 1);
            v
        };
        let mut checked = 0usize;
        let mut worst = 0f64;
        let mut check = |i: usize, j: usize| -> Result<()> {
            let (want, abs) = reference_entry(&aw, lda, &b, k, i, j);
            let got = c[i * ldc + j] as f64;
            let tol = tolerance(want, abs, 1.0, 0.0, 0.0);
            worst = worst.max((got - want).abs() / tol);
            checked += 1;
            if (got - want).abs() > tol || got.is_nan() {
                return Err(Error::Verification {
                    detail: format!("C[{i}][{j}] = {got}, want {want} (tolerance {tol:.3e})"),
                });
            }
            Ok(())
        };
        for i in pick(m) {
            for j in 0..n {
                check(i, j)?;
            }
        }
        for j in pick(n) {
            for i in 0..m {
                check(i, j)?;
            }
        }
        println!(
            "verified tc_gemm: {checked} elements of sampled rows and columns against the f64 reference; worst error {worst:.3} of the bound (1e-3 x sum |a b| + 1e-6)"
        );
    }
    if let Some(path) = &args.out {
        let packed: Vec<f32> = (0..m)
            .flat_map(|i| c[i * ldc..i * ldc + n].to_vec())
            .collect();
        npy::write_f32(path, &[m as u64, n as u64], &packed)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
