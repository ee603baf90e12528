//! `warpline`: run warpline's kernels and pipelines from the command line.
//!
//! Global flags (every subcommand): `--json` (one JSON object on stdout: figures, references,
//! ratios, device, driver, versions, options, seed; human-readable lines go to stderr),
//! `--seed N` (all random inputs; printed in every run), `--device N` (default
//! `$WARPLINE_DEVICE`, else 0), `--trace run.json` (Chrome trace / Perfetto) and `--timeline
//! run.png|run.svg` (pipeline, gemm --streams, ordering-demo).
//!
//! With `--json`, failures print `{"ok": false, "error": {"kind": "usage" | "no_gpu" | "run",
//! "message": ...}, "exit_code": ...}` on stdout too (flag errors clap finds included), so a
//! caller can always parse stdout; `--help` and `--version` stay text.

mod attention_cmd;
mod cli_json;
mod decode_cmd;
mod demo;
mod fuzz_cmd;
mod mgpu_cmd;
mod stress;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use stress::StressOptions;
use warpline::multi::bench::DataParallelConfig;
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
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    cmd: Cmd,
}

/// Flags every subcommand takes (issue 12): machine-readable output, reproducibility, device
/// choice and trace outputs. Kept in one struct so subcommands stay independent of them.
#[derive(Args, Clone, Debug)]
struct Global {
    /// Print the results as one JSON object on stdout (text goes to stderr).
    #[arg(long, global = true)]
    json: bool,
    /// Seed of every random input (default: a fresh one); printed in every run.
    #[arg(long, global = true)]
    seed: Option<u64>,
    /// GPU ordinal (default: $WARPLINE_DEVICE, else 0).
    #[arg(long, global = true)]
    device: Option<usize>,
    /// Write a Chrome trace / Perfetto JSON of the run here (pipeline, gemm --streams,
    /// ordering-demo).
    #[arg(long, global = true)]
    trace: Option<PathBuf>,
    /// Draw the run's stream timeline here, PNG or SVG by extension (pipeline, gemm --streams,
    /// ordering-demo).
    #[arg(long, global = true)]
    timeline: Option<PathBuf>,
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
    /// (FP32 accumulation, f32 output) against cuBLAS GemmEx in the same run. `--dtype fp8`:
    /// the same GEMM on E4M3 inputs (per-tensor quantized, B column-major) against cuBLASLt FP8.
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
    /// The seeds' ordering scenarios on the GPU, traced: the fence (caller's copy after internal
    /// work submitted later), two waits released in reverse order, and the message exchange
    /// (task graph, producers first). Checks each result; with --trace/--timeline shows why
    /// each ran when it did.
    OrderingDemo(demo::DemoArgs),
    /// Seeded fuzzer of the safe API (issue 19): random programs of safe calls from several
    /// threads, every result checked against a CPU model, every wait bounded. Prints failing
    /// seeds with a minimised program and a summary line; exit status 1 on any failure.
    Fuzz(fuzz_cmd::FuzzArgs),
    /// Attention forward (issue 23; sm_90a, FlashAttention-3 style) on random inputs: time,
    /// TFLOP/s (FlashAttention's count: causal is half), `--verify` against the f64 references.
    Attention(attention_cmd::AttentionArgs),
    /// One LLM decode step (issue 21; Llama-3.1-8B layer shapes, paged KV cache, one stream):
    /// microseconds per layer and the ratio to the HBM floor for the variants a plain, b PDL,
    /// c PDL + weight prefetch, d CUDA graph, e graph + PDL + prefetch; `--timeline`/`--trace`
    /// show each kernel's prologue against its predecessor's tail (`%globaltimer` stamps);
    /// `--verify` checks one step against the f64 reference.
    Decode(decode_cmd::DecodeArgs),
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
        /// Check the first and last tile of every slot against the f64 CPU reference (and,
        /// with --graphs, the graph-replayed outputs against the eager ones, bit for bit).
        #[arg(long)]
        verify: bool,
        /// Also capture each GPU's compute of every slot into CUDA graphs (peer copy, H2D and
        /// D2H outside) and print eager vs graph-replay throughput, same run.
        #[arg(long)]
        graphs: bool,
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
    DpStep(DpStepArgs),
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

/// The flags of `mgpu dp-step`: [`DataParallelConfig`]'s fields, defaults from
/// [`DataParallelConfig::default`].
#[derive(Args, Clone, Copy, Debug)]
struct DpStepArgs {
    /// Gradient buckets per step (>= 1).
    #[arg(long, default_value_t = DataParallelConfig::default().buckets)]
    buckets: usize,
    /// 128x128 f32 tiles per bucket (bucket = `tiles` x 64 KiB per GPU).
    #[arg(long, default_value_t = DataParallelConfig::default().tiles)]
    tiles: usize,
    /// GEMM layers per bucket (>= 1).
    #[arg(long, default_value_t = DataParallelConfig::default().layers)]
    layers: usize,
    /// Timed steps per mode, after one warm-up step (>= 1).
    #[arg(long, default_value_t = DataParallelConfig::default().steps)]
    steps: usize,
    /// Also capture each GPU's compute into CUDA graphs (one per bucket), replay them with
    /// `cuGraphLaunch` (NCCL outside the graphs), and time the graph-replayed step next to the
    /// eager one in the same run.
    #[arg(long)]
    graphs: bool,
    /// Check the step's result: every bucket of every GPU against the f64 CPU reference (first
    /// and last tile, bound 1e-4), and, with `--graphs`, the graph-replayed step bit for bit
    /// against the eager step.
    #[arg(long)]
    verify: bool,
}

impl DpStepArgs {
    fn config(self) -> DataParallelConfig {
        let DpStepArgs {
            buckets,
            tiles,
            layers,
            steps,
            graphs,
            verify,
        } = self;
        DataParallelConfig {
            buckets,
            tiles,
            layers,
            steps,
            graphs,
            verify,
        }
    }
}

fn mgpu(cmd: MgpuCmd) -> CliResult<Value> {
    use mgpu_cmd as c;
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
            graphs,
        } => {
            let cfg = warpline::multi::LayerPipelineConfig {
                tiles,
                layers,
                slots,
            };
            // Under --json stdout holds only the JSON object: the text goes to stderr.
            let r = if cli_json::enabled() {
                c::pipeline(cfg, microbatches, verify, graphs, &mut std::io::stderr())?
            } else {
                c::pipeline(cfg, microbatches, verify, graphs, &mut std::io::stdout())?
            };
            return Ok(pipeline_json(&cfg, microbatches, verify, graphs, &r));
        }
        MgpuCmd::Allreduce { iters, procs } => c::allreduce(iters, procs)?,
        // SAFETY: the hidden subcommand is started only by `mgpu allreduce --procs N`
        // (`c::allreduce`), which passes the same `--world` and `--iters` to every rank.
        MgpuCmd::NcclRank { rank, world, iters } => unsafe { c::nccl_rank(rank, world, iters)? },
        MgpuCmd::DpStep(args) => {
            let cfg = args.config();
            // Under --json stdout holds only the JSON object: the text goes to stderr.
            let r = if cli_json::enabled() {
                c::dp_step(&cfg, &mut std::io::stderr())?
            } else {
                c::dp_step(&cfg, &mut std::io::stdout())?
            };
            return Ok(dp_step_json(&cfg, &r));
        }
        MgpuCmd::Seeds { runs, bound_ms } => c::seeds(runs, bound_ms)?,
    }
    Ok(Value::Null)
}

/// `mgpu pipeline --json`: options, each placement eager and (with --graphs) graph-replayed,
/// ratios and the verification.
fn pipeline_json(
    cfg: &warpline::multi::LayerPipelineConfig,
    microbatches: usize,
    verify: bool,
    graphs: bool,
    r: &mgpu_cmd::PipelineRun,
) -> Value {
    let one = |p: &warpline::multi::LayerPipelineReport| {
        json!({
            "seconds": p.seconds,
            "microbatches_per_s": p.microbatches_per_s(),
            "gflops": p.gflops(),
            "graphs": p.graphs,
            "worst_tile_rel_error": p.max_rel_error,
            "graph_matches_eager_bitwise": p.graph_matches_eager,
        })
    };
    let ratio = |g: &Option<warpline::multi::LayerPipelineReport>,
                 e: &warpline::multi::LayerPipelineReport| {
        g.as_ref()
            .map(|g| g.microbatches_per_s() / e.microbatches_per_s())
    };
    json!({
        "options": {
            "tiles": cfg.tiles, "layers": cfg.layers, "slots": cfg.slots,
            "microbatches": microbatches, "verify": verify, "graphs": graphs,
        },
        "activation_bytes": cfg.activation_bytes(),
        "one_gpu": { "eager": one(&r.one), "graph": r.one_graph.as_ref().map(one) },
        "two_gpus": { "eager": one(&r.two), "graph": r.two_graph.as_ref().map(one) },
        "ratios": {
            "two_over_one": r.ratio(),
            "two_over_one_graphs": r.graph_ratio(),
            "one_gpu_graph_over_eager": ratio(&r.one_graph, &r.one),
            "two_gpus_graph_over_eager": ratio(&r.two_graph, &r.two),
        },
        "goal_two_over_one": 1.8,
        "goal_met": r.ratio() >= 1.8,
        "graphs": graphs.then_some(
            "one CUDA graph per GPU and slot (GPU 0: stage 1, or both stages on one GPU; GPU 1: stage 2), captured on the GPU's compute stream from a thread of its own; peer copy, H2D and D2H outside the graphs, ordered by events"
        ),
        "verified": verify.then_some(
            "first and last tile of every slot against the f64 CPU reference, bound 1e-4; with graphs, graph outputs against eager bit for bit"
        ),
    })
}

/// `mgpu dp-step --json`: options, times per step (ms), ratios and the verification.
fn dp_step_json(cfg: &DataParallelConfig, r: &warpline::multi::bench::DataParallelReport) -> Value {
    json!({
        "options": {
            "buckets": cfg.buckets, "tiles": cfg.tiles, "layers": cfg.layers,
            "steps": cfg.steps, "graphs": cfg.graphs, "verify": cfg.verify,
        },
        "bucket_bytes": r.bucket_bytes,
        "ms_per_step": {
            "compute_only": r.compute_ms,
            "allreduce_only": r.comm_ms,
            "ideal_max_compute_comm": r.ideal_ms(),
            "sequential": r.sequential_ms,
            "overlapped": r.overlapped_ms,
            "graph_compute_only": r.graph_compute_ms,
            "graph_overlapped": r.graph_overlapped_ms,
        },
        "ratios": {
            "overlapped_over_ideal": r.overlapped_ms / r.ideal_ms(),
            "sequential_over_overlapped": r.sequential_ms / r.overlapped_ms,
            "eager_over_graph_overlapped": r.graph_overlapped_ms.map(|g| r.overlapped_ms / g),
            "eager_over_graph_compute": r.graph_compute_ms.map(|g| r.compute_ms / g),
        },
        "graphs": cfg.graphs.then_some(
            "one CUDA graph per GPU and bucket (the bucket's GEMM layers), captured on the GPU's compute stream from a thread of its own; NCCL all-reduces outside the graphs, ordered by events"
        ),
        "verified": r.max_rel_error.map(|e| json!({
            "reference": "f64 CPU sum over GPUs of x_i w_i, first and last tile of every bucket",
            "worst_tile_rel_error": e,
            "bound": 1e-4,
            "graph_matches_eager_bitwise": r.graph_matches_eager,
        })),
    })
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
    /// Split the last N batches into --tail-pieces pieces each (0: no split; default: the
    /// library's `Schedule::TAIL_SPLIT`).
    #[arg(long, default_value_t = warpline::pipeline::Schedule::TAIL_SPLIT.tail_batches)]
    tail_batches: usize,
    /// Pieces each of the last --tail-batches batches is split into.
    #[arg(long, default_value_t = warpline::pipeline::Schedule::TAIL_SPLIT.tail_pieces)]
    tail_pieces: usize,
    /// Stream priorities: equal (default), first-high or last-high.
    #[arg(long, value_enum, default_value_t = PriorityArg::Equal)]
    priorities: PriorityArg,
    /// Speed A/B in one run: the default pipeline, tail splits, stream priorities and the
    /// CUDA C++ pattern, 5 runs each (median), each against 1.5 x the pinned H2D of this run.
    #[arg(long)]
    ab: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum PriorityArg {
    Equal,
    FirstHigh,
    LastHigh,
}

impl PriorityArg {
    fn get(self) -> warpline::pipeline::Priorities {
        use warpline::pipeline::Priorities;
        match self {
            PriorityArg::Equal => Priorities::Equal,
            PriorityArg::FirstHigh => Priorities::FirstHigh,
            PriorityArg::LastHigh => Priorities::LastHigh,
        }
    }
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

/// `println!` in text mode; `eprintln!` with `--json`, so stdout holds only the JSON object.
macro_rules! say {
    ($($t:tt)*) => {
        if cli_json::enabled() {
            eprintln!($($t)*)
        } else {
            println!($($t)*)
        }
    };
}
pub(crate) use say;

/// What every command gets: the global flags resolved.
pub(crate) struct Ctx {
    seed: u64,
    device: usize,
    trace: Option<PathBuf>,
    timeline: Option<PathBuf>,
}

impl Ctx {
    /// Opens the device of `--device`.
    fn open(&self) -> Result<Device> {
        Device::open(self.device)
    }

    /// Whether a trace output was asked for.
    fn tracing(&self) -> bool {
        self.trace.is_some() || self.timeline.is_some()
    }

    /// Starts recording on `dev` when a trace output was asked for.
    fn recorder(&self, dev: &Device) -> Result<Option<warpline::trace::Recorder>> {
        if self.tracing() {
            Ok(Some(warpline::trace::Recorder::new(dev)?))
        } else {
            Ok(None)
        }
    }

    /// Writes the trace outputs asked for; returns their JSON description.
    fn write_trace(
        &self,
        rec: Option<&warpline::trace::Recorder>,
        title: &str,
    ) -> Result<serde_json::Value> {
        let Some(rec) = rec else {
            return Ok(serde_json::Value::Null);
        };
        self.write_trace_outputs(&rec.finish()?.with_copy_rows(), title)
    }

    /// Writes `trace` to the outputs asked for (`--trace` Chrome JSON, `--timeline` picture
    /// titled `title`); returns their JSON description.
    fn write_trace_outputs(
        &self,
        trace: &warpline::trace::Trace,
        title: &str,
    ) -> Result<serde_json::Value> {
        if let Some(p) = &self.trace {
            warpline::trace::write_chrome_json(trace, p)?;
            say!(
                "wrote trace {} ({} spans; open in ui.perfetto.dev)",
                p.display(),
                trace.spans.len()
            );
        }
        if let Some(p) = &self.timeline {
            let opts = warpline::trace::timeline::TimelineOptions {
                title: title.to_string(),
                ..Default::default()
            };
            warpline::trace::timeline::write_timeline(trace, p, &opts)?;
            say!("wrote timeline {}", p.display());
        }
        Ok(serde_json::json!({
            "trace": self.trace.as_ref().map(|p| p.display().to_string()),
            "timeline": self.timeline.as_ref().map(|p| p.display().to_string()),
            "spans": trace.spans.len(),
            "tracks": trace.tracks.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
            "unanchored_spans": trace.unanchored,
            "clock": trace.clock,
        }))
    }
}

fn main() -> ExitCode {
    // SAFETY: first thing in main, before any thread exists: nothing else reads or writes the
    // environment during the call. NVLink multicast stays off (docs/multi-gpu.md).
    unsafe { warpline::multi::nccl::disable_nvls_unless_set() };
    let argv: Vec<String> = std::env::args().collect();
    let wants_json = argv.iter().any(|a| a == "--json");
    let cli = match Cli::try_parse_from(&argv) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            let text_only = matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
                || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand;
            if wants_json && !text_only {
                let _ = e.print();
                cli_json::print_failure(None, None, "usage", &e.render().to_string(), 2);
                return ExitCode::from(2);
            }
            e.exit();
        }
    };
    cli_json::set_enabled(cli.global.json);
    let name = cli_json::command_name(&argv);
    let seed = cli.global.seed.unwrap_or_else(rand::random);
    let device = match cli.global.device {
        Some(d) => Ok(d),
        None => match std::env::var(DEVICE_ENV) {
            Ok(v) => v.trim().parse::<usize>().map_err(|_| {
                usage(format!(
                    "{DEVICE_ENV}={v:?}: a GPU ordinal (0, 1, ...) is expected"
                ))
            }),
            Err(_) => Ok(0),
        },
    };
    // Printed before anything runs, so every run (and a crash) can be repeated.
    eprintln!("warpline {name}: seed {seed} (repeat with --seed {seed})");
    let r = device.and_then(|device| {
        let ctx = Ctx {
            seed,
            device,
            trace: cli.global.trace.clone(),
            timeline: cli.global.timeline.clone(),
        };
        match cli.cmd {
            Cmd::Pipeline(args) => pipeline(&ctx, args),
            Cmd::Info => no_trace(&ctx, "info").and_then(|()| info(&ctx)),
            Cmd::Gemm(args) => gemm(&ctx, args),
            Cmd::Stress(args) => no_trace(&ctx, "stress").and_then(|()| stress_cmd(&ctx, args)),
            Cmd::OrderingDemo(args) => demo::run(&ctx, args),
            Cmd::Fuzz(args) => no_trace(&ctx, "fuzz").and_then(|()| fuzz_cmd::run(&ctx, args)),
            Cmd::Mgpu(cmd) => no_trace(&ctx, "mgpu").and_then(|()| mgpu(cmd)),
            Cmd::Attention(args) => {
                no_trace(&ctx, "attention").and_then(|()| attention_cmd::run(&ctx, args))
            }
            Cmd::Decode(args) => decode_cmd::run(&ctx, args),
        }
    });
    let (kind, msg, code) = match r {
        Ok(results) => {
            cli_json::print_success(&name, seed, &cli.global, results);
            return ExitCode::SUCCESS;
        }
        Err(CliError::Usage(msg)) => {
            eprintln!("warpline: bad usage: {msg}");
            eprintln!("(see `warpline --help`)");
            ("usage", msg, 2)
        }
        Err(CliError::Run(
            e @ (Error::NoDriver
            | Error::NoDevice { .. }
            | Error::NotEnoughDevices { .. }
            | Error::NcclUnavailable { .. }),
        )) => {
            eprintln!("warpline: no GPU: {e}");
            ("no_gpu", e.to_string(), 2)
        }
        Err(CliError::Run(e)) => {
            eprintln!("warpline: error: {e}");
            ("run", e.to_string(), 1)
        }
    };
    if cli_json::enabled() {
        cli_json::print_failure(Some(&name), Some(seed), kind, &msg, code);
    }
    ExitCode::from(code as u8)
}

/// The environment variable naming the GPU when `--device` is not given (tests and benches
/// honour it too, through `warpline_suite::support`).
const DEVICE_ENV: &str = "WARPLINE_DEVICE";

/// `--trace`/`--timeline` are refused where nothing is traced.
fn no_trace(ctx: &Ctx, cmd: &str) -> CliResult {
    if ctx.tracing() {
        return Err(usage(format!(
            "--trace/--timeline: `{cmd}` records no trace (pipeline, gemm --streams and ordering-demo do)"
        )));
    }
    Ok(())
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

fn info(ctx: &Ctx) -> CliResult<Value> {
    let dev = ctx.open()?;
    say!("{:#?}", dev.capabilities());
    let kernels: Vec<&str> = dev.kernel_names().collect();
    say!("kernels: {}", kernels.join(", "));
    Ok(json!({"device": cli_json::device(&dev), "kernels": kernels}))
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

/// Fills `dst` with uniform floats in [-1, 1) from `rng` (seeded from `--seed`).
fn fill_random(dst: &mut [f32], pb: &ProgressBar, rng: &mut rand::rngs::StdRng) {
    use rand::Rng;
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

/// Device memory of a pipeline run: `(batches in flight, bytes)`. Up to
/// [`warpline::pipeline::IN_FLIGHT_PER_STREAM`] batches in flight per stream (BatchPipeline's
/// cap, issue 19 item 15: not 1), at most all of them, A, B and C of each, plus the bandwidth
/// probe's 256 MiB buffer. `None` on overflow.
fn pipeline_device_bytes(streams: usize, n: usize, batch_elems: usize) -> Option<(usize, u64)> {
    let batches = n.div_ceil(batch_elems.max(1));
    let in_flight = warpline::pipeline::IN_FLIGHT_PER_STREAM
        .checked_mul(streams)?
        .min(batches);
    let bytes = bytes_of(&[
        (in_flight.checked_mul(3 * 4)?, batch_elems.min(n)),
        (1, 256 << 20),
    ])?;
    Some((in_flight, bytes))
}

/// Host bytes of a pipeline run over `n` elements: pinned A, B, C (f32).
fn pipeline_host_bytes(n: usize) -> Option<u64> {
    bytes_of(&[(3 * 4, n)])
}

fn pipeline(ctx: &Ctx, args: PipelineArgs) -> CliResult<Value> {
    use rand::SeedableRng;
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
    // Inputs from files are checked (headers, then host memory) and read before the device is
    // opened, too.
    let files = match (&args.a, &args.b) {
        (Some(pa), Some(pb)) => {
            let (ha, hb) = (npy::read_header(pa)?, npy::read_header(pb)?);
            if ha.elements != hb.elements {
                return Err(Error::LengthMismatch {
                    what: "--a/--b",
                    detail: format!(
                        "{} has {} elements, {} has {}",
                        pa.display(),
                        ha.elements,
                        pb.display(),
                        hb.elements
                    ),
                }
                .into());
            }
            if ha.elements == 0 {
                return Err(Error::Empty { what: "--a" }.into());
            }
            // The files' own copies, then pinned A, B and C (issue 19 item 15: checked before
            // anything is read).
            let files = bytes_of(&[(2 * 4, usize::try_from(ha.elements).unwrap_or(usize::MAX))]);
            let pinned = usize::try_from(ha.elements)
                .ok()
                .and_then(pipeline_host_bytes);
            check_host_memory(
                "--a/--b (the files' data, pinned copies of A and B, and C)",
                files.zip(pinned).and_then(|(f, p)| f.checked_add(p)),
            )?;
            let a = npy::read_f32_1d(pa)?;
            let b = npy::read_f32_1d(pb)?;
            Some((a, b))
        }
        _ => None,
    };
    let dev = ctx.open()?;
    let caps = dev.capabilities();
    say!(
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
            let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed);
            fill_random(&mut a, &pb, &mut rng);
            fill_random(&mut b, &pb, &mut rng);
            pb.finish_and_clear();
            (a, b)
        }
    };
    let n = a.len();
    // Both at least 1 (checked above), so no division by zero.
    let batch_elems = args.batch_elems.unwrap_or_else(|| n.div_ceil(args.batches));
    let (in_flight, device_bytes) = pipeline_device_bytes(args.streams, n, batch_elems)
        .ok_or_else(|| usage("--batch-elems x --streams overflows"))?;
    check_device_memory(
        &dev,
        &format!("{in_flight} batches in flight (A, B, C of {batch_elems} floats each)"),
        device_bytes,
    )?;
    let mut c = PinnedBuffer::<f32>::new(&dev, n)?;

    let h2d = bandwidth::pinned_h2d_gbps(&dev, 256 << 20, 5)?;
    let schedule = warpline::pipeline::Schedule {
        tail_batches: args.tail_batches,
        tail_pieces: args.tail_pieces,
        priorities: args.priorities.get(),
    };
    let run = |streams: usize, c: &mut PinnedBuffer<f32>| -> Result<PipelineReport> {
        c.fill(f32::NAN);
        let pipe = BatchPipeline::with_schedule(&dev, streams, schedule)?;
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
    let ab = if args.ab {
        Some(ab_runs(
            &dev,
            args.streams,
            &a,
            &b,
            &mut c,
            batch_elems,
            h2d,
        )?)
    } else {
        None
    };
    // Only the main run is traced.
    let rec = ctx.recorder(&dev)?;
    let installed = rec.as_ref().map(|r| r.install());
    let report = run(args.streams, &mut c)?;
    drop(installed);

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
        say!("verified: {n} elements against the f64 CPU reference, max relative error {worst:.2e} (bound {:.2e})", reference::VECTOR_ADD_REL_BOUND);
    }
    if let Some(path) = &args.out {
        npy::write_f32(path, &[n as u64], &c)?;
        say!("wrote {}", path.display());
    }

    let bytes = report.bytes_h2d + report.bytes_d2h;
    say!();
    say!(
        "{:>8} {:>8} {:>12} {:>10} {:>10} {:>12} {:>12} {:>9}",
        "streams",
        "batches",
        "MiB moved",
        "time ms",
        "GB/s",
        "x H2D",
        "x 1.5 H2D",
        "overlap"
    );
    let row = |r: &PipelineReport| {
        say!(
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
    say!("pinned H2D bandwidth measured in this run: {h2d:.1} GB/s (upper limit of the pipeline: 1.5 x H2D = {:.1} GB/s, two of every three bytes go host to device)", 1.5 * h2d);
    if let Some(b) = &baseline {
        say!(
            "speed-up of {} streams over 1 stream: {:.2}x",
            report.streams,
            report.pcie_gbps() / b.pcie_gbps()
        );
    }
    let title = format!(
        "warpline pipeline: {} streams, {} batches of {batch_elems} floats, {:.1} GB/s = {:.3} x 1.5 H2D",
        report.streams,
        report.batches.len(),
        report.pcie_gbps(),
        report.pcie_gbps() / (1.5 * h2d)
    );
    let trace = ctx.write_trace(rec.as_ref(), &title)?;
    let row = |r: &PipelineReport| {
        json!({
            "streams": r.streams,
            "batches": r.batches.len(),
            "span_ms": r.span_ms,
            "wall_ms": r.wall_ms,
            "pcie_gbps": r.pcie_gbps(),
            "ratio_to_h2d": r.pcie_gbps() / h2d,
            "ratio_to_1_5_h2d": r.pcie_gbps() / (1.5 * h2d),
            "overlap": r.overlap(),
        })
    };
    Ok(json!({
        "device": cli_json::device(&dev),
        "options": {
            "streams": args.streams, "batches": args.batches, "batch_elems": batch_elems,
            "elements": n, "inputs": if args.a.is_some() { "files" } else { "random (seeded)" },
            "verify": args.verify, "compare_one_stream": args.compare_one_stream,
            "tail_batches": args.tail_batches, "tail_pieces": args.tail_pieces,
            "priorities": format!("{:?}", args.priorities),
        },
        "reference": {"pinned_h2d_gbps": h2d, "limit_gbps": 1.5 * h2d,
            "what": "pinned H2D bandwidth measured in this run (256 MiB copies, best of 5); limit = 1.5 x H2D"},
        "run": row(&report),
        "one_stream": baseline.as_ref().map(row),
        "speedup_over_one_stream": baseline.as_ref().map(|b| report.pcie_gbps() / b.pcie_gbps()),
        "verified": args.verify,
        "ab": ab,
        "trace": trace,
    }))
}

/// `--ab`: the speed variants of issue 12 in one run, 5 runs each (median span), each against
/// 1.5 x the pinned H2D of this run; the CUDA C++ pattern as the second reference.
fn ab_runs(
    dev: &Device,
    streams: usize,
    a: &PinnedBuffer<f32>,
    b: &PinnedBuffer<f32>,
    c: &mut PinnedBuffer<f32>,
    batch_elems: usize,
    h2d: f64,
) -> Result<Value> {
    use warpline::pipeline::{Priorities, Schedule};
    let sched = |tail_batches, tail_pieces, priorities| Schedule {
        tail_batches,
        tail_pieces,
        priorities,
    };
    let variants: [(&str, Option<Schedule>); 9] = [
        ("tail 2 x 4 (CLI default)", Some(Schedule::TAIL_SPLIT)),
        ("plain (library default)", Some(Schedule::PLAIN)),
        ("tail 1 x 2", Some(sched(1, 2, Priorities::Equal))),
        ("tail 1 x 4", Some(sched(1, 4, Priorities::Equal))),
        ("tail 1 x 8", Some(sched(1, 8, Priorities::Equal))),
        ("first-high", Some(sched(0, 0, Priorities::FirstHigh))),
        ("last-high", Some(sched(0, 0, Priorities::LastHigh))),
        (
            "tail 1 x 4 + first-high",
            Some(sched(1, 4, Priorities::FirstHigh)),
        ),
        ("C++ pattern", None),
    ];
    let mut rows = Vec::new();
    let mut cxx = None;
    say!();
    say!(
        "{:>26} {:>10} {:>10} {:>12} {:>12}",
        "variant",
        "ms",
        "GB/s",
        "x 1.5 H2D",
        "x C++ patt."
    );
    let mut results = Vec::new();
    for (name, schedule) in variants {
        let mut spans = Vec::new();
        for _ in 0..5 {
            let r = match schedule {
                Some(sch) => BatchPipeline::with_schedule(dev, streams, sch)?.run_vector_add(
                    a,
                    b,
                    c,
                    batch_elems,
                    |_, _| {},
                )?,
                None => {
                    warpline::pipeline::cxx_pattern_vector_add(dev, streams, a, b, c, batch_elems)?
                }
            };
            spans.push(r.pcie_gbps());
        }
        let gbps = bandwidth::median(&mut spans).ok_or(Error::Empty {
            what: "--reps (timed repetitions)",
        })?;
        if schedule.is_none() {
            cxx = Some(gbps);
        }
        results.push((name, gbps));
    }
    let cxx = cxx.unwrap_or(f64::NAN);
    for (name, gbps) in results {
        let ms = (3 * 4 * a.len()) as f64 / (gbps * 1e9) * 1e3;
        say!(
            "{name:>26} {ms:>10.2} {gbps:>10.1} {:>12.3} {:>12.3}",
            gbps / (1.5 * h2d),
            gbps / cxx
        );
        rows.push(json!({"variant": name, "span_ms": ms, "pcie_gbps": gbps,
            "ratio_to_1_5_h2d": gbps / (1.5 * h2d), "ratio_to_cxx_pattern": gbps / cxx}));
    }
    say!("(median of 5 runs each; {streams} streams; pinned H2D {h2d:.1} GB/s in this run)");
    Ok(
        json!({"runs_per_variant": 5, "statistic": "median", "variants": rows, "cxx_pattern_gbps": cxx}),
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
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
    /// FP8 E4M3 inputs (per-tensor quantized from the f32 inputs, scales passed as device
    /// pointers), tensor cores (sm_90a), B column-major only; reference cuBLASLt FP8 (issue 20).
    Fp8,
}

/// `--scales` of `gemm --dtype fp8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ScalesArg {
    /// One f32 scale per tensor.
    Tensor,
    /// DeepSeek-V3 block scales: 1 x 128 on A, 128 x 128 on B.
    Block,
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
    #[arg(long, value_enum, default_value_t = RasterArg::N)]
    raster: RasterArg,
    /// Tensor-core GEMM: ping-pong consumer warpgroups (bf16, --b-layout col) instead of
    /// cooperative ones.
    #[arg(long)]
    pingpong: bool,
    /// bf16/fp16: kernel configuration (issue 20): auto (with a column-major B and no
    /// --pingpong/--cluster: swapab for bf16 with M <= 128, decode for fp16 with M <= 64; else
    /// coop128x256), coop128x256, decode, or swapab (bf16). The chosen one is printed.
    #[arg(long, default_value = "auto")]
    config: String,
    /// fp8: scale granularity: tensor (one f32 per tensor) or block (DeepSeek-V3: 1 x 128 on A,
    /// 128 x 128 on B, promoted to FP32 every 128 k; `TcGemm::plan_fp8_block_scaled`).
    #[arg(long, value_enum, default_value_t = ScalesArg::Tensor)]
    scales: ScalesArg,
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

fn gemm(ctx: &Ctx, args: GemmArgs) -> CliResult<Value> {
    use rand::SeedableRng;
    use warpline::kernels;
    use warpline_gpu::contract::gemm::TILE_ELEMS;

    match args.dtype {
        GemmDtype::Bf16 => return tc_gemm_cmd::<warpline::bf16>(ctx, &args),
        GemmDtype::Fp16 => return tc_gemm_cmd::<warpline::f16>(ctx, &args),
        GemmDtype::Fp8 => return fp8_gemm_cmd(ctx, &args),
        GemmDtype::F32 => {}
    }
    check_gemm_args(&args)?;
    let files = match (&args.a, &args.b) {
        (Some(pa), Some(pb)) => {
            // Headers first: host memory is checked before the data is read (issue 19 item 15).
            let (ha, hb) = (npy::read_header(pa)?, npy::read_header(pb)?);
            let n = usize::try_from(ha.elements.max(hb.elements)).unwrap_or(usize::MAX);
            check_host_memory(
                "--a/--b",
                gemm_host_bytes(n, !args.no_verify, args.streams.is_some()),
            )?;
            let (a, b) = (npy::read_f32(pa)?.1, npy::read_f32(pb)?.1);
            Some((a, b))
        }
        _ => None,
    };
    if ctx.tracing() && args.streams.is_none() {
        return Err(usage(
            "--trace/--timeline with gemm trace the --streams pipeline: add --streams S",
        ));
    }
    let dev = ctx.open()?;
    let caps = dev.capabilities();
    say!("device: {} ({} SMs)", caps.name, caps.sm_count);
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
            let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed);
            fill_random(&mut a, &pb, &mut rng);
            fill_random(&mut b, &pb, &mut rng);
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
        let w = reference::gemm_tiles_f64(&a, &b, tiles)?;
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
            say!("verified {name}: {tiles} tiles, worst per-tile relative error {err:.2e} (Frobenius, bound {:.0e})", reference::GEMM_REL_BOUND);
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
        say!();
        say!(
            "{:>28} {:>10} {:>10} {:>10}",
            "kernel",
            "ms",
            "TFLOP/s",
            "x cuBLAS"
        );
        for (name, ms, _) in &rows {
            let ratio = cublas.map_or("-".to_string(), |c| format!("{:.3}", c / ms));
            say!(
                "{name:>28} {ms:>10.4} {:>10.2} {ratio:>10}",
                flop / ms / 1e9
            );
        }
        say!(
            "({tiles} tiles of 128x128x128, FP32, median of {} launches, CUDA events)",
            args.reps.max(1)
        );
    }
    if let (Some(path), Some(c)) = (&args.out, &out_c) {
        npy::write_f32(path, &[tiles as u64, 128, 128], c)?;
        say!("wrote {}", path.display());
    }
    let mut stream_json = Value::Null;
    if let Some(streams) = args.streams {
        let rec = ctx.recorder(&dev)?;
        let pa = PinnedBuffer::from_slice(&dev, &a)?;
        let pb = PinnedBuffer::from_slice(&dev, &b)?;
        let mut pc = PinnedBuffer::<f32>::new(&dev, n)?;
        pc.fill(f32::NAN);
        let pipe = BatchPipeline::new(&dev, streams)?;
        let batch_tiles = tiles.div_ceil(4 * streams).max(1);
        let installed = rec.as_ref().map(|r| r.install());
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
        drop(installed);
        if let Some(w) = &want {
            reference::verify_gemm("pipeline C", &pc, w, reference::GEMM_REL_BOUND)?;
            say!("verified pipeline output");
        }
        let kernel_ms: f64 = report.batches.iter().map(|b| b.kernel_ms).sum();
        say!(
            "pipeline: {streams} stream(s), {} batches of {batch_tiles} tiles, span {:.2} ms, {:.1} GB/s over PCIe, overlap {:.2}, kernel time {:.2} ms",
            report.batches.len(),
            report.span_ms,
            report.pcie_gbps(),
            report.overlap(),
            kernel_ms
        );
        let title = format!(
            "warpline gemm --streams {streams}: {} batches of {batch_tiles} tiles (cluster_tile_gemm x{cluster}), {:.1} GB/s",
            report.batches.len(),
            report.pcie_gbps()
        );
        let trace = ctx.write_trace(rec.as_ref(), &title)?;
        stream_json = json!({
            "streams": streams, "batches": report.batches.len(), "batch_tiles": batch_tiles,
            "span_ms": report.span_ms, "pcie_gbps": report.pcie_gbps(), "overlap": report.overlap(),
            "kernel_ms": kernel_ms, "verified": want.is_some(), "trace": trace,
        });
    }
    let cublas_ms = rows.iter().find(|r| r.2 == GemmKernel::Cublas).map(|r| r.1);
    Ok(json!({
        "device": cli_json::device(&dev),
        "options": {"tiles": tiles, "cluster": cluster, "kernel": format!("{:?}", args.kernel),
            "once": args.once, "reps": args.reps, "verify": !args.no_verify,
            "inputs": if args.a.is_some() { "files" } else { "random (seeded)" }},
        "reference": {"kernel": "cuBLAS SgemmStridedBatched (FP32, no TF32)", "ms": cublas_ms},
        "kernels": rows.iter().map(|(name, ms, _)| json!({
            "kernel": name, "median_ms": ms, "tflops": flop / ms / 1e9,
            "ratio_to_cublas": cublas_ms.map(|c| c / ms),
        })).collect::<Vec<_>>(),
        "flop_per_launch": flop,
        "pipeline": stream_json,
    }))
}

/// `warpline stress`: flags checked before the device is opened, then [`stress::run`].
fn stress_cmd(ctx: &Ctx, args: StressArgs) -> CliResult<Value> {
    let seed = ctx.seed;
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
    let dev = ctx.open()?;
    let report = stress::run(&dev, &opts)?;
    say!("{report}");
    if report.passed() {
        let parsed: Value = serde_json::from_str(&report.to_json()).unwrap_or(Value::Null);
        return Ok(json!({"device": cli_json::device(&dev), "report": parsed}));
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
        // Headers first: shapes and host memory are checked before the data is read.
        let (sa, sb) = (npy::read_header(pa)?.shape, npy::read_header(pb)?.shape);
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
        if [m, n, k].iter().any(|&v| v == 0 || v > i32::MAX as u64) {
            return Err(usage(format!(
                "--a {sa:?} and --b {sb:?} give M = {m}, N = {n}, K = {k}; each must be between 1 and 2^31 - 1"
            )));
        }
        // Each at most 2^31 - 1 (checked), so the casts and products fit.
        let dims = (m as usize, n as usize, k as usize);
        // Host: the files' data (f32), A and B (16-bit), C read back (f32) (issue 19 item 15:
        // this path skipped the check).
        check_host_memory(
            &format!("--a/--b (M x N x K = {m} x {n} x {k})"),
            bytes_of(&[
                (6, dims.0 * dims.2),
                (6, dims.1 * dims.2),
                (4, dims.0 * dims.1),
            ]),
        )?;
        let (a, b) = (npy::read_f32(pa)?.1, npy::read_f32(pb)?.1);
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
fn normal_f32(rng: &mut impl rand::Rng, n: usize) -> Vec<f32> {
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

fn tc_gemm_cmd<T: warpline::kernels::tc_gemm::TcInput>(
    ctx: &Ctx,
    args: &GemmArgs,
) -> CliResult<Value> {
    use warpline::kernels::tc_gemm::{
        reference_entry, tolerance, BLayout, CublasGemmEx, HostB, Matrix, MatrixMut, Raster,
        TcGemm, TcGemmOptions,
    };
    let ((m, n, k), files) = check_tc_gemm_args(args)?;
    let gemm_config = warpline::kernels::GemmConfig::parse(&args.config).map_err(|_| {
        usage(format!(
            "--config {:?}: allowed: {}",
            args.config,
            warpline::kernels::GemmConfig::NAMES.join(", ")
        ))
    })?;
    let layout = match args.b_layout {
        BLayoutArg::Col => BLayout::ColMajor,
        BLayoutArg::Row => BLayout::RowMajor,
    };
    let dev = ctx.open()?;
    let caps = dev.capabilities();
    say!("device: {} ({} SMs)", caps.name, caps.sm_count);
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
        None => {
            use rand::SeedableRng;
            let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed);
            (normal_f32(&mut rng, m * k), normal_f32(&mut rng, br * bc))
        }
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
        pingpong: args.pingpong,
        config: gemm_config,
        ..Default::default()
    };
    let flop = 2.0 * m as f64 * n as f64 * k as f64;
    let time = |launch: &mut dyn FnMut() -> Result<()>| {
        median_launch_ms(&stream, args.once, args.reps, launch)
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
        // The swap-AB configuration's token tile and ksplit.
        let swap = plan.swap_ab_shapes().first().map_or(String::new(), |s| {
            format!(" (tokens {}, ksplit {})", s.tokens, s.ksplit)
        });
        let config = format!(
            "config {} (--config {}): {} {}{swap}",
            plan.gemm_config().name(),
            gemm_config.name(),
            plan.kernel_names().join(", "),
            plan.configs()[0].describe()
        );
        say!("{config}");
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
        say!(
            "{:>28} {:>10} {:>10} {:>10}",
            "kernel",
            "ms",
            "TFLOP/s",
            "x cuBLAS"
        );
        for (name, ms) in [
            (format!("cuBLAS GemmEx {}", T::NAME), cublas_ms),
            (format!("tc_gemm {}", T::NAME), ours_ms),
        ] {
            say!(
                "{name:>28} {ms:>10.4} {:>10.1} {:>10.3}",
                flop / ms / 1e9,
                cublas_ms / ms
            );
        }
        say!(
            "(M x N x K = {m} x {n} x {k}, B {layout:?}, FP32 accumulation, f32 output; tc_gemm {config}; median of {} launches, CUDA events)",
            args.reps
        );
    }
    let mut verified = Value::Null;
    if args.verify {
        let b = HostB {
            data: &bw,
            pitch: ldb,
            layout,
        };
        let (checked, worst) = verify_sampled_rows_and_columns(m, n, |i, j| {
            let (want, abs) =
                reference_entry(&aw, lda, &b, k, i, j).ok_or_else(|| Error::LengthMismatch {
                    what: "tc_gemm --verify reference",
                    detail: format!("C[{i}][{j}] needs elements outside the host copies of A or B"),
                })?;
            Ok((
                c[i * ldc + j] as f64,
                want,
                tolerance(want, abs, 1.0, 0.0, 0.0),
            ))
        })?;
        say!(
            "verified tc_gemm: {checked} elements of sampled rows and columns against the f64 reference; worst error {worst:.3} of the bound (1e-3 x sum |a b| + 1e-6)"
        );
        verified = serde_json::json!({ "elements": checked, "worst_of_bound": worst });
    }
    if let Some(path) = &args.out {
        write_c_npy(path, &c, m, n, ldc)?;
    }
    let tflops = |ms: f64| flop / ms / 1e9;
    Ok(serde_json::json!({
        "dtype": T::NAME,
        "m": m, "n": n, "k": k,
        "b_layout": format!("{layout:?}"),
        "config": config,
        "tc_gemm": { "ms": ours_ms, "tflops": tflops(ours_ms) },
        "reference": { "name": "cuBLAS cublasGemmEx (FP32 compute)", "ms": cublas_ms, "tflops": tflops(cublas_ms) },
        "ratio_to_cublas": cublas_ms / ours_ms,
        "verified": verified,
    }))
}

// ------------------------------------------------------------------------------------------------
// gemm --dtype fp8: the FP8 configuration of the tensor-core GEMM (issue 20)
// ------------------------------------------------------------------------------------------------

/// Per-tensor E4M3 quantization of `rows x cols` packed values into a pitch of `pitch`: the
/// scale is `amax / 448` (1 for an all-zero tensor), the stored codes `v / scale` rounded to
/// nearest even; also the decoded codes (same layout, padding 0) for the reference.
fn quantize_e4m3(
    v: &[f32],
    rows: usize,
    cols: usize,
    pitch: usize,
) -> (Vec<warpline::F8E4M3>, Vec<f32>, f32) {
    let amax = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = if amax > 0.0 && amax.is_finite() {
        amax / warpline::F8E4M3::MAX
    } else {
        1.0
    };
    let mut q = vec![warpline::F8E4M3::default(); rows * pitch];
    let mut w = vec![0f32; rows * pitch];
    for r in 0..rows {
        for c in 0..cols {
            let x = warpline::F8E4M3::from_f32(v[r * cols + c] / scale);
            q[r * pitch + c] = x;
            w[r * pitch + c] = x.to_f32();
        }
    }
    (q, w, scale)
}

/// `gemm --dtype fp8`: E4M3 A and B quantized per tensor from the f32 inputs (random normal or
/// .npy), the scales in device memory, `TcGemm::plan_fp8` (f32 C) next to cuBLASLt FP8 (default
/// and fast accumulation) in the same run; `--verify` checks sampled rows and columns against the
/// f64 product of the decoded codes times the scales, with `fp8_tolerance`.
/// What both FP8 commands set up before quantizing: row pitches padded to 16 bytes (TMA; the
/// logical sizes stay as given), and the f32 inputs (from the `--a`/`--b` files, else normal
/// from the seed).
struct Fp8Problem {
    lda: usize,
    ldb: usize,
    ldc: usize,
    a32: Vec<f32>,
    b32: Vec<f32>,
}

/// [`Fp8Problem`] for `M x N x K`, after checking that A, B and `c_buffers` f32 C buffers (ours
/// and cuBLASLt's) fit in the device's free memory.
fn fp8_problem(
    ctx: &Ctx,
    dev: &Device,
    (m, n, k): (usize, usize, usize),
    files: Option<(Vec<f32>, Vec<f32>)>,
    c_buffers: usize,
) -> CliResult<Fp8Problem> {
    let (lda, ldb, ldc) = (
        k.next_multiple_of(16),
        k.next_multiple_of(16),
        n.next_multiple_of(4),
    );
    check_device_memory(
        dev,
        &format!("M x N x K = {m} x {n} x {k} (A, B, C of ours and cuBLASLt's)"),
        (m * lda + n * ldb + c_buffers * 4 * m * ldc) as u64 + (32 << 20),
    )?;
    let (a32, b32) = match files {
        Some(ab) => ab,
        None => {
            use rand::SeedableRng;
            let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed);
            (normal_f32(&mut rng, m * k), normal_f32(&mut rng, n * k))
        }
    };
    Ok(Fp8Problem {
        lda,
        ldb,
        ldc,
        a32,
        b32,
    })
}

fn fp8_gemm_cmd(ctx: &Ctx, args: &GemmArgs) -> CliResult<Value> {
    use warpline::kernels::tc_gemm::{
        fp8_tolerance, reference_entry, BLayout, CublasLtFp8, Fp8Scales, HostB, Matrix, MatrixMut,
        Raster, TcGemm, TcGemmOptions,
    };
    if args.b_layout != BLayoutArg::Col {
        return Err(usage(
            "--dtype fp8 --b-layout row: FP8 wgmma (and cuBLASLt FP8) read a K-major B only; use --b-layout col (B of shape (N, K))",
        ));
    }
    if args.scales == ScalesArg::Block {
        return fp8_block_gemm_cmd(ctx, args);
    }
    let gemm_config = warpline::kernels::GemmConfig::parse(&args.config)
        .ok()
        .filter(|c| {
            !matches!(
                c,
                warpline::kernels::GemmConfig::Decode | warpline::kernels::GemmConfig::SwapAb
            )
        })
        .ok_or_else(|| {
            usage(format!(
                "--dtype fp8 --config {:?}: allowed: auto, coop128x256",
                args.config
            ))
        })?;
    let ((m, n, k), files) = check_tc_gemm_args(args)?;
    let dev = ctx.open()?;
    let caps = dev.capabilities();
    say!("device: {} ({} SMs)", caps.name, caps.sm_count);
    let tc = TcGemm::new(&dev)?;
    let Fp8Problem {
        lda,
        ldb,
        ldc,
        a32,
        b32,
    } = fp8_problem(ctx, &dev, (m, n, k), files, 3)?;
    let (aq, aw, sa) = quantize_e4m3(&a32, m, k, lda);
    let (bq, bw, sb) = quantize_e4m3(&b32, n, k, ldb);
    drop((a32, b32));
    let stream = dev.new_stream()?;
    let pool = warpline::MemPool::device_default(&dev, 0)?;
    let mut da = pool.alloc_async::<warpline::F8E4M3>(&stream, aq.len())?;
    let mut db = pool.alloc_async::<warpline::F8E4M3>(&stream, bq.len())?;
    let mut dsa = pool.alloc_async::<f32>(&stream, 1)?;
    let mut dsb = pool.alloc_async::<f32>(&stream, 1)?;
    let mut dc = pool.alloc_async::<f32>(&stream, m * ldc)?;
    let mut dref = pool.alloc_async::<f32>(&stream, m * ldc)?;
    let mut dfast = pool.alloc_async::<f32>(&stream, m * ldc)?;
    da.copy_from_host(&aq)?;
    db.copy_from_host(&bq)?;
    dsa.copy_from_host(&[sa])?;
    dsb.copy_from_host(&[sb])?;
    dc.fill_async(f32::NAN)?;
    let scales = Fp8Scales::new(dsa.as_view(), dsb.as_view());
    let opts = TcGemmOptions {
        cluster: args.cluster,
        raster: match args.raster {
            RasterArg::M => Raster::AlongM,
            RasterArg::N => Raster::AlongN,
        },
        config: gemm_config,
        pingpong: args.pingpong,
        ..Default::default()
    };
    let flop = 2.0 * m as f64 * n as f64 * k as f64;
    let time = |launch: &mut dyn FnMut() -> Result<()>| {
        median_launch_ms(&stream, args.once, args.reps, launch)
    };
    let a = Matrix::new(da.as_view(), m, k, lda);
    let b = Matrix::new(db.as_view(), n, k, ldb);
    let (ours_ms, config) = {
        let plan = tc.plan_fp8(
            &stream,
            a,
            b,
            BLayout::ColMajor,
            MatrixMut::new(dc.as_view_mut(), m, n, ldc),
            scales,
            1.0,
            0.0,
            &opts,
        )?;
        let config = format!(
            "config {} (--config {}): {} {}",
            plan.gemm_config().name(),
            gemm_config.name(),
            plan.kernel_names().join(", "),
            plan.configs()[0].describe()
        );
        say!("{config}");
        (time(&mut || plan.launch())?, config)
    };
    let lt = CublasLtFp8::new(&dev, &stream)?;
    // NaN where cuBLASLt has no FP8 kernel for the shape (it wants pitches of 16 elements and
    // may refuse other shapes): said, and the run goes on without the ratio.
    let mut lt_ms = [f64::NAN; 2];
    for (i, (buf, fast)) in [(&mut dref, false), (&mut dfast, true)]
        .into_iter()
        .enumerate()
    {
        let c = MatrixMut::new(buf.as_view_mut(), m, n, ldc);
        match lt.plan(a, b, BLayout::ColMajor, c, scales, 1.0, 0.0, fast) {
            Ok(plan) => lt_ms[i] = time(&mut || plan.launch())?,
            Err(e @ Error::Cublas { .. }) => say!("cuBLASLt fp8 (fast accum {fast}): {e}"),
            Err(e) => return Err(e.into()),
        }
    }
    let mut c = vec![0f32; m * ldc];
    dc.copy_to_host(&mut c)?;
    if !args.once {
        say!(
            "{:>28} {:>10} {:>10} {:>12}",
            "kernel",
            "ms",
            "TFLOP/s",
            "x cuBLASLt"
        );
        for (name, ms) in [
            ("cuBLASLt fp8", lt_ms[0]),
            ("cuBLASLt fp8 fast-accum", lt_ms[1]),
            ("tc_gemm e4m3", ours_ms),
        ] {
            say!(
                "{name:>28} {ms:>10.4} {:>10.1} {:>12.3}",
                flop / ms / 1e9,
                lt_ms[0].min(lt_ms[1]) / ms
            );
        }
        say!(
            "(M x N x K = {m} x {n} x {k}, E4M3 A and B (B column-major), scales {sa:.4e} x {sb:.4e}, f32 output; ratio to the faster cuBLASLt mode; tc_gemm {config}; median of {} launches, CUDA events)",
            args.reps
        );
    }
    let mut verified = Value::Null;
    if args.verify {
        let hb = HostB {
            data: &bw,
            pitch: ldb,
            layout: BLayout::ColMajor,
        };
        let alpha_s = sa as f64 * sb as f64;
        let (checked, worst) = verify_sampled_rows_and_columns(m, n, |i, j| {
            let (s, abs) =
                reference_entry(&aw, lda, &hb, k, i, j).ok_or_else(|| Error::LengthMismatch {
                    what: "fp8 gemm --verify reference",
                    detail: format!("C[{i}][{j}] needs elements outside the host copies of A or B"),
                })?;
            let want = alpha_s * s;
            let tol = fp8_tolerance(want, abs, k, alpha_s, 0.0, 1.0 / (1u64 << 24) as f64);
            Ok((c[i * ldc + j] as f64, want, tol))
        })?;
        say!(
            "verified tc_gemm fp8: {checked} elements of sampled rows and columns against the f64 reference on the decoded E4M3 values; worst error {worst:.3} of the bound (ceil(K/32) x 2^-12 x scales x sum |a b|)"
        );
        verified = serde_json::json!({ "elements": checked, "worst_of_bound": worst });
    }
    if let Some(path) = &args.out {
        write_c_npy(path, &c, m, n, ldc)?;
    }
    let tflops = |ms: f64| flop / ms / 1e9;
    Ok(serde_json::json!({
        "dtype": "fp8",
        "m": m, "n": n, "k": k,
        "b_layout": "ColMajor",
        "scales": [sa, sb],
        "config": config,
        "tc_gemm": { "ms": ours_ms, "tflops": tflops(ours_ms) },
        "reference": { "name": "cuBLASLt FP8 (E4M3, FP32 compute)", "ms": lt_ms[0], "tflops": tflops(lt_ms[0]) },
        "reference_fast_accum": { "ms": lt_ms[1], "tflops": tflops(lt_ms[1]) },
        "ratio_to_cublaslt": lt_ms[0].min(lt_ms[1]) / ours_ms,
        "verified": verified,
    }))
}

/// E4M3 quantization of `rows x cols` packed values into a pitch of `pitch` with one scale per
/// `block_rows x 128` block (`amax / 448`, 1 for an all-zero block): returns the codes, the
/// decoded codes (padding 0) and the scales: the scale of block (row block `rb`, k-block `kb`)
/// at `scales[kb * row_blocks + rb]` when `kb_major` is false (A's M-major layout), at
/// `scales[rb * k_blocks + kb]` when true (B's K-major layout).
fn quantize_e4m3_blocks(
    v: &[f32],
    (rows, cols, pitch): (usize, usize, usize),
    block_rows: usize,
    kb_major: bool,
) -> (Vec<warpline::F8E4M3>, Vec<f32>, Vec<f32>) {
    let (rb_n, kb_n) = (rows.div_ceil(block_rows), cols.div_ceil(128));
    let at = |rb: usize, kb: usize| {
        if kb_major {
            rb * kb_n + kb
        } else {
            kb * rb_n + rb
        }
    };
    let mut amax = vec![0f32; rb_n * kb_n];
    for r in 0..rows {
        for c in 0..cols {
            let s = &mut amax[at(r / block_rows, c / 128)];
            *s = s.max(v[r * cols + c].abs());
        }
    }
    let scales: Vec<f32> = amax
        .iter()
        .map(|&a| {
            if a > 0.0 && a.is_finite() {
                a / warpline::F8E4M3::MAX
            } else {
                1.0
            }
        })
        .collect();
    let mut q = vec![warpline::F8E4M3::default(); rows * pitch];
    let mut w = vec![0f32; rows * pitch];
    for r in 0..rows {
        for c in 0..cols {
            let x =
                warpline::F8E4M3::from_f32(v[r * cols + c] / scales[at(r / block_rows, c / 128)]);
            q[r * pitch + c] = x;
            w[r * pitch + c] = x.to_f32();
        }
    }
    (q, w, scales)
}

/// `gemm --dtype fp8 --scales block`: E4M3 A and B quantized with DeepSeek-V3 block scales
/// (`1 x 128` on A, `128 x 128` on B) from the f32 inputs, `TcGemm::plan_fp8_block_scaled` (f32
/// C) next to cuBLASLt block-scaled FP8 in the same run; `--verify` checks sampled rows and
/// columns against the f64 reference on the dequantized inputs with `fp8_block_tolerance`.
fn fp8_block_gemm_cmd(ctx: &Ctx, args: &GemmArgs) -> CliResult<Value> {
    use warpline::kernels::tc_gemm::{
        block_scaled_reference_entry, fp8_block_tolerance, BLayout, CublasLtFp8, Fp8BlockScales,
        Matrix, MatrixMut, Raster, TcGemm, TcGemmOptions,
    };
    if args.pingpong {
        return Err(usage(
            "--dtype fp8 --scales block --pingpong: the block-scaled kernel is cooperative only",
        ));
    }
    let ((m, n, k), files) = check_tc_gemm_args(args)?;
    let dev = ctx.open()?;
    let caps = dev.capabilities();
    say!("device: {} ({} SMs)", caps.name, caps.sm_count);
    let tc = TcGemm::new(&dev)?;
    let Fp8Problem {
        lda,
        ldb,
        ldc,
        a32,
        b32,
    } = fp8_problem(ctx, &dev, (m, n, k), files, 2)?;
    let (aq, aw, sa) = quantize_e4m3_blocks(&a32, (m, k, lda), 1, false);
    let (bq, bw, sb) = quantize_e4m3_blocks(&b32, (n, k, ldb), 128, true);
    drop((a32, b32));
    let stream = dev.new_stream()?;
    let pool = warpline::MemPool::device_default(&dev, 0)?;
    let upload_f32 = |v: &[f32]| -> Result<warpline::DeviceBuffer<f32>> {
        let mut d = pool.alloc_async::<f32>(&stream, v.len())?;
        d.copy_from_host(v)?;
        Ok(d)
    };
    let mut da = pool.alloc_async::<warpline::F8E4M3>(&stream, aq.len())?;
    let mut db = pool.alloc_async::<warpline::F8E4M3>(&stream, bq.len())?;
    da.copy_from_host(&aq)?;
    db.copy_from_host(&bq)?;
    let (dsa, dsb) = (upload_f32(&sa)?, upload_f32(&sb)?);
    let mut dc = pool.alloc_async::<f32>(&stream, m * ldc)?;
    let mut dref = pool.alloc_async::<f32>(&stream, m * ldc)?;
    dc.fill_async(f32::NAN)?;
    let scales = Fp8BlockScales::packed(dsa.as_view(), dsb.as_view(), m, k);
    let opts = TcGemmOptions {
        cluster: args.cluster,
        raster: match args.raster {
            RasterArg::M => Raster::AlongM,
            RasterArg::N => Raster::AlongN,
        },
        ..Default::default()
    };
    let flop = 2.0 * m as f64 * n as f64 * k as f64;
    let time = |launch: &mut dyn FnMut() -> Result<()>| {
        median_launch_ms(&stream, args.once, args.reps, launch)
    };
    let a = Matrix::new(da.as_view(), m, k, lda);
    let b = Matrix::new(db.as_view(), n, k, ldb);
    let (ours_ms, config) = {
        let plan = tc.plan_fp8_block_scaled(
            &stream,
            a,
            b,
            BLayout::ColMajor,
            MatrixMut::new(dc.as_view_mut(), m, n, ldc),
            scales,
            1.0,
            0.0,
            &opts,
        )?;
        let config = format!(
            "{} {}",
            plan.kernel_names().join(", "),
            plan.configs()[0].describe()
        );
        say!("config: {config}");
        (time(&mut || plan.launch())?, config)
    };
    let lt = CublasLtFp8::new(&dev, &stream)?;
    let c_ref = MatrixMut::new(dref.as_view_mut(), m, n, ldc);
    let lt_ms = match lt.plan_block_scaled(a, b, BLayout::ColMajor, c_ref, scales, 1.0, 0.0) {
        Ok(plan) => time(&mut || plan.launch())?,
        Err(e @ (Error::Cublas { .. } | Error::BadShape { .. })) => {
            say!("cuBLASLt fp8 block-scaled: {e}");
            f64::NAN
        }
        Err(e) => return Err(e.into()),
    };
    let mut c = vec![0f32; m * ldc];
    dc.copy_to_host(&mut c)?;
    if !args.once {
        say!(
            "{:>32} {:>10} {:>10} {:>12}",
            "kernel",
            "ms",
            "TFLOP/s",
            "x cuBLASLt"
        );
        for (name, ms) in [
            ("cuBLASLt fp8 block-scaled", lt_ms),
            ("tc_gemm e4m3 block-scaled", ours_ms),
        ] {
            say!(
                "{name:>32} {ms:>10.4} {:>10.1} {:>12.3}",
                flop / ms / 1e9,
                lt_ms / ms
            );
        }
        say!(
            "(M x N x K = {m} x {n} x {k}, E4M3 A and B (B column-major), DeepSeek-V3 block scales, f32 output; tc_gemm {config}; median of {} launches, CUDA events)",
            args.reps
        );
    }
    let mut verified = Value::Null;
    if args.verify {
        let (kb, a_ld) = (k.div_ceil(128), m);
        let (checked, worst) = verify_sampled_rows_and_columns(m, n, |i, j| {
            let (s, abs) =
                block_scaled_reference_entry(&aw, lda, &bw, ldb, &sa, a_ld, &sb, kb, k, i, j)
                    .ok_or_else(|| Error::LengthMismatch {
                        what: "fp8 block gemm --verify reference",
                        detail: format!("C[{i}][{j}] needs elements outside the host copies"),
                    })?;
            let tol = fp8_block_tolerance(s, abs, k, 1.0, 0.0, 1.0 / (1u64 << 24) as f64);
            Ok((c[i * ldc + j] as f64, s, tol))
        })?;
        say!(
            "verified tc_gemm fp8 block-scaled: {checked} elements of sampled rows and columns against the f64 reference on the dequantized inputs; worst error {worst:.3} of the bound (4 x 2^-12 x sum |sa sb a b|)"
        );
        verified = serde_json::json!({ "elements": checked, "worst_of_bound": worst });
    }
    if let Some(path) = &args.out {
        write_c_npy(path, &c, m, n, ldc)?;
    }
    let tflops = |ms: f64| flop / ms / 1e9;
    Ok(serde_json::json!({
        "dtype": "fp8",
        "scales": "block",
        "m": m, "n": n, "k": k,
        "b_layout": "ColMajor",
        "config": config,
        "tc_gemm": { "ms": ours_ms, "tflops": tflops(ours_ms) },
        "reference": { "name": "cuBLASLt FP8 block-scaled (VEC128 / BLK128x128)", "ms": lt_ms, "tflops": tflops(lt_ms) },
        "ratio_to_cublaslt": lt_ms / ours_ms,
        "verified": verified,
    }))
}

/// The median of `reps` launches timed with CUDA events on `stream`, after one launch and two
/// warm-up launches; with `once`, that one launch only (synchronised) and NaN (for `ncu`).
/// Errors: the launch's, the events', or [`Error::Empty`] for `reps == 0`.
fn median_launch_ms(
    stream: &warpline::Stream,
    once: bool,
    reps: usize,
    launch: &mut dyn FnMut() -> Result<()>,
) -> Result<f64> {
    launch()?;
    if once {
        stream.synchronize()?;
        return Ok(f64::NAN);
    }
    for _ in 0..2 {
        launch()?;
    }
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let start = stream.record()?;
        launch()?;
        let end = stream.record()?;
        end.synchronize()?;
        t.push(start.elapsed_ms(&end)? as f64);
    }
    warpline::bandwidth::median(&mut t).ok_or(Error::Empty {
        what: "gemm --reps (timed launches)",
    })
}

/// Checks C at every element of about six sampled rows and six sampled columns (always the last
/// of each): `entry(i, j)` gives (got, want, tolerance). Returns (elements checked, worst error as
/// a fraction of its tolerance), or [`Error::Verification`] naming the first element outside
/// its tolerance (or NaN).
fn verify_sampled_rows_and_columns(
    m: usize,
    n: usize,
    mut entry: impl FnMut(usize, usize) -> Result<(f64, f64, f64)>,
) -> Result<(usize, f64)> {
    let pick = |len: usize| -> Vec<usize> {
        let mut v: Vec<usize> = (0..len).step_by(len.div_ceil(6).max(1)).collect();
        v.push(len - 1);
        v
    };
    let (mut checked, mut worst) = (0usize, 0f64);
    let mut check = |i: usize, j: usize| -> Result<()> {
        let (got, want, tol) = entry(i, j)?;
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
    Ok((checked, worst))
}

/// Writes the `m x n` result (row pitch `ldc` elements) as a packed f32 `.npy` and says so.
fn write_c_npy(path: &std::path::Path, c: &[f32], m: usize, n: usize, ldc: usize) -> Result<()> {
    let packed: Vec<f32> = (0..m)
        .flat_map(|i| c[i * ldc..i * ldc + n].to_vec())
        .collect();
    npy::write_f32(path, &[m as u64, n as u64], &packed)?;
    say!("wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--scales block` quantization: each block's scale is its amax / 448, stored in A's
    /// M-major / B's K-major layout, and the dequantized codes stay within E4M3's half ulp
    /// (2^-4 relative) of the inputs, whatever the block's magnitude.
    #[test]
    fn fp8_block_quantization_uses_the_documented_layouts() {
        let (rows, cols, pitch) = (3usize, 300usize, 304usize);
        // Column block kb scaled by 4^kb, row r by 2^r: every block has its own amax.
        let v: Vec<f32> = (0..rows * cols)
            .map(|x| {
                let (r, c) = (x / cols, x % cols);
                (1.0 + (c % 7) as f32) * 2f32.powi(r as i32) * 4f32.powi((c / 128) as i32)
            })
            .collect();
        let (q, _, sa) = quantize_e4m3_blocks(&v, (rows, cols, pitch), 1, false);
        let (_, _, sb) = quantize_e4m3_blocks(&v, (rows, cols, pitch), 128, true);
        let amax = |r: usize, kb: usize| 7.0 * 2f32.powi(r as i32) * 4f32.powi(kb as i32);
        for kb in 0..3 {
            for r in 0..rows {
                // A: M-major, scale of (row r, k-block kb) at kb * rows + r.
                assert_eq!(sa[kb * rows + r], amax(r, kb) / warpline::F8E4M3::MAX);
            }
            // B: one 128-row block here; K-major, at rb * 3 + kb.
            assert_eq!(sb[kb], amax(rows - 1, kb) / warpline::F8E4M3::MAX);
        }
        for r in 0..rows {
            for c in 0..cols {
                let back = q[r * pitch + c].to_f32() * sa[(c / 128) * rows + r];
                let x = v[r * cols + c];
                assert!(
                    (back - x).abs() <= x.abs() / 16.0,
                    "[{r}][{c}]: {back} vs {x}"
                );
            }
        }
    }

    #[test]
    fn issue19_item15_pipeline_device_memory_counts_every_batch_in_flight() {
        use warpline::pipeline::IN_FLIGHT_PER_STREAM;
        let probe = 256u64 << 20;
        // 3 streams, 16 batches of 2^24 floats: 4 in flight per stream, 12 batches x A, B, C.
        let (k, bytes) = pipeline_device_bytes(3, 16 << 24, 1 << 24).unwrap();
        assert_eq!(k, IN_FLIGHT_PER_STREAM * 3);
        assert_eq!(bytes, (k as u64) * 12 * (1 << 24) + probe);
        // Fewer batches than the cap: all of them.
        assert_eq!(pipeline_device_bytes(8, 10 << 20, 1 << 20).unwrap().0, 10);
        // One batch shorter than batch_elems.
        assert_eq!(
            pipeline_device_bytes(2, 100, 1 << 20).unwrap(),
            (1, 1200 + probe)
        );
        assert_eq!(pipeline_device_bytes(usize::MAX, 10, 1), None);
        assert_eq!(pipeline_device_bytes(2, usize::MAX, usize::MAX / 2), None);
    }
}
