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
    /// Batched 128x128x128 FP32 GEMM C_t = A_t x B_t: cluster_tile_gemm, tile_gemm and cuBLAS
    /// strided-batched SGEMM on the same data, CPU-verified, with a throughput table.
    Gemm(GemmArgs),
    /// Bounded stress run: pipeline batches against the CPU reference, fences from many threads,
    /// random task graphs (direct and captured) and host callbacks, every wait bounded; prints
    /// runs, hangs, wrong results and time per section. Exit status 1 on any hang, wrong result
    /// or error.
    Stress(StressArgs),
    /// Two or more GPUs (issue 13): peer copies, the two-GPU layer pipeline, NCCL all-reduce,
    /// the data-parallel step, the cross-GPU seed scenarios. NVLS stays off (NCCL_NVLS_ENABLE=0).
    #[command(subcommand)]
    Mgpu(MgpuCmd),
}

#[derive(Subcommand)]
enum MgpuCmd {
    /// GPUs, peer-access matrix, NCCL library and version.
    Info,
    /// Peer-copy bandwidth GPU 0 <-> GPU 1, one way and both ways, with the cuMemcpyDtoDAsync baseline.
    PeerBw {
        /// Bytes per copy (repeatable).
        #[arg(long, default_values_t = [1usize << 20, 64 << 20, 1 << 30])]
        bytes: Vec<usize>,
        #[arg(long, default_value_t = 20)]
        iters: usize,
    },
    /// The two-GPU layer pipeline against one GPU doing both stages (goal >= 1.8x).
    Pipeline {
        /// 128x128 f32 tiles per microbatch.
        #[arg(long, default_value_t = 264)]
        tiles: usize,
        /// GEMM layers per stage.
        #[arg(long, default_value_t = 16)]
        layers: usize,
        /// Microbatch slots in flight (2..=8).
        #[arg(long, default_value_t = 3)]
        slots: usize,
        #[arg(long, default_value_t = 60)]
        microbatches: usize,
        /// Check the first and last tile of every slot against the f64 CPU reference.
        #[arg(long)]
        verify: bool,
    },
    /// NCCL all-reduce bus bandwidth, 1 MiB to 1 GiB (checked against the CPU sum).
    Allreduce {
        #[arg(long, default_value_t = 20)]
        iters: usize,
        /// 0: one process driving every GPU (ncclCommInitAll); N >= 2: N processes, one GPU each
        /// (ncclCommInitRank, the id handed over in WARPLINE_NCCL_ID).
        #[arg(long, default_value_t = 0)]
        procs: usize,
    },
    /// One rank of `allreduce --procs N` (started by it).
    #[command(hide = true)]
    NcclRank {
        #[arg(long)]
        rank: usize,
        #[arg(long)]
        world: usize,
        #[arg(long, default_value_t = 20)]
        iters: usize,
    },
    /// Data-parallel step: bucket all-reduces overlapped with the next bucket's compute, against
    /// sequential and the ideal max(compute, communication).
    DpStep {
        #[arg(long, default_value_t = 8)]
        buckets: usize,
        /// 128x128 tiles per bucket (bucket = tiles x 64 KiB).
        #[arg(long, default_value_t = 400)]
        tiles: usize,
        /// GEMM layers per bucket.
        #[arg(long, default_value_t = 4)]
        layers: usize,
        #[arg(long, default_value_t = 10)]
        steps: usize,
    },
    /// The cross-GPU seed scenarios: opposite-order signals (must complete every run) and a
    /// cyclic dependency (must be rejected).
    Seeds {
        #[arg(long, default_value_t = 200)]
        runs: usize,
        /// Bound of each run, milliseconds.
        #[arg(long, default_value_t = 5000)]
        bound_ms: u64,
    },
}

fn mgpu(cmd: MgpuCmd) -> CliResult {
    use warpline::multi::commands as c;
    if let Some(code) = c::reexec_for_nccl_if_needed()? {
        std::process::exit(code);
    }
    match cmd {
        MgpuCmd::Info => c::info()?,
        MgpuCmd::PeerBw { bytes, iters } => c::peer_bw(&bytes, iters)?,
        MgpuCmd::Pipeline {
            tiles,
            layers,
            slots,
            microbatches,
            verify,
        } => c::pipeline(
            warpline::multi::LayerPipelineConfig {
                tiles,
                layers,
                slots,
            },
            microbatches,
            verify,
        )?,
        MgpuCmd::Allreduce { iters, procs } => c::allreduce(iters, procs)?,
        MgpuCmd::NcclRank { rank, world, iters } => c::nccl_rank(rank, world, iters)?,
        MgpuCmd::DpStep {
            buckets,
            tiles,
            layers,
            steps,
        } => c::dp_step(buckets, tiles, layers, steps)?,
        MgpuCmd::Seeds { runs, bound_ms } => c::seeds(runs, bound_ms)?,
    }
    Ok(())
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
        Cmd::Mgpu(cmd) => mgpu(cmd),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Usage(msg)) => {
            eprintln!("warpline: bad usage: {msg}");
            eprintln!("(see `warpline --help`)");
            ExitCode::from(2)
        }
        Err(CliError::Run(
            e @ (Error::NoDriver
            | Error::NoDevice { .. }
            | Error::NotEnoughDevices { .. }
            | Error::NcclUnavailable { .. }),
        )) => {
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

#[derive(Args)]
struct GemmArgs {
    /// Tiles T (without --a/--b: random inputs of T x 128 x 128 floats).
    #[arg(long, default_value_t = 4096)]
    tiles: usize,
    /// CTAs per cluster of cluster_tile_gemm: 1, 2, 4 or 8.
    #[arg(long, default_value_t = 4)]
    cluster: u32,
    /// Also stream the tiles host -> device -> cluster_tile_gemm -> host through the BatchPipeline
    /// over this many streams (4 batches per stream) and report it.
    #[arg(long)]
    streams: Option<usize>,
    /// Input A: float32 .npy of shape (T, 128, 128) or flat T x 16384 (needs --b; sets T).
    #[arg(long, requires = "b")]
    a: Option<PathBuf>,
    /// Input B, same shape as A (needs --a).
    #[arg(long, requires = "a")]
    b: Option<PathBuf>,
    /// Write C (of cluster_tile_gemm, or of --kernel) here as a (T, 128, 128) float32 .npy file.
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
    if !CLUSTER_SIZES.contains(&args.cluster) {
        return Err(usage(format!(
            "--cluster {}: cluster_tile_gemm supports clusters of {CLUSTER_SIZES:?} CTAs",
            args.cluster
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

fn gemm(args: GemmArgs) -> CliResult {
    use warpline::kernels;
    use warpline_gpu::contract::gemm::TILE_ELEMS;

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
    kernels::check_gemm_cluster_size(args.cluster)?;
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
    let cluster = args.cluster;
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
