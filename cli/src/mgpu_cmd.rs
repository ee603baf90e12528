//! What `warpline mgpu ...` runs (the CLI holds only the argument parsing): each function opens
//! the GPUs it needs, measures, and prints a plain-text report to stdout.

use std::process::Command;
use std::time::Duration;

use warpline::error::{Error, Result};
use warpline::multi::bench::{self, sweep_sizes};
use warpline::multi::nccl::{self, Communicator, NcclId, NCCL_ID_ENV};
use warpline::multi::{
    device_count, seeds, DeviceSet, LayerPipeline, LayerPipelineConfig, LayerPipelineReport,
    Placement,
};

/// Set when the CLI has re-run itself with [`nccl::override_library_dir`] on `LD_LIBRARY_PATH`.
pub const REEXEC_ENV: &str = "WARPLINE_NCCL_REEXEC";

/// When NCCL cannot be loaded but `WARPLINE_NCCL_LIB` names a library: re-runs this executable
/// with the same arguments and the override folder on `LD_LIBRARY_PATH`, and returns its exit
/// code. `Ok(None)` when no re-run is needed (or already done).
pub fn reexec_for_nccl_if_needed() -> Result<Option<i32>> {
    if nccl::library_available().is_ok() || std::env::var_os(REEXEC_ENV).is_some() {
        return Ok(None);
    }
    let Some(dir) = nccl::override_library_dir()? else {
        return Ok(None);
    };
    let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
    let path = if old.is_empty() {
        dir.display().to_string()
    } else {
        format!("{}:{old}", dir.display())
    };
    let exe = std::env::current_exe().map_err(|e| Error::BadShape {
        what: "re-running warpline for WARPLINE_NCCL_LIB",
        detail: e.to_string(),
    })?;
    let status = Command::new(exe)
        .args(std::env::args_os().skip(1))
        .env("LD_LIBRARY_PATH", path)
        .env(REEXEC_ENV, "1")
        .status()
        .map_err(|e| Error::BadShape {
            what: "re-running warpline for WARPLINE_NCCL_LIB",
            detail: e.to_string(),
        })?;
    Ok(Some(status.code().unwrap_or(1)))
}

/// `mgpu info`: GPUs, peer matrix, NCCL library and version, NCCL_NVLS_ENABLE.
pub fn info() -> Result<()> {
    let n = device_count()?;
    println!("GPUs: {n}");
    if n > 0 {
        let set = DeviceSet::open_first(n)?;
        for d in set.devices() {
            println!("  GPU {}: {}", d.ordinal(), d.capabilities().name);
        }
        println!("peer matrix (row can access column, cuDeviceCanAccessPeer):");
        for (i, row) in set.peer_matrix().iter().enumerate() {
            let cells: Vec<&str> = row.iter().map(|&b| if b { "1" } else { "." }).collect();
            println!("  {i}: {}", cells.join(" "));
        }
    }
    match nccl::version() {
        Ok(v) => println!("NCCL: version {v}"),
        Err(e) => println!("NCCL: {e}"),
    }
    println!(
        "NCCL_NVLS_ENABLE: {} (the CLI sets 0 unless the user set it; communicators need 0)",
        std::env::var(nccl::NVLS_ENV).unwrap_or_else(|_| "unset".into())
    );
    Ok(())
}

fn two_gpus(what: &'static str) -> Result<DeviceSet> {
    let n = device_count()?;
    if n < 2 {
        return Err(Error::NotEnoughDevices {
            what,
            needed: 2,
            available: n,
        });
    }
    DeviceSet::open(&[0, 1])
}

/// A count flag that must be at least 1 (checked before any GPU is opened).
fn at_least_one(what: &'static str, v: u64) -> Result<()> {
    if v == 0 {
        return Err(Error::BadShape {
            what,
            detail: "0; allowed: 1 or more".into(),
        });
    }
    Ok(())
}

/// `mgpu peer-bw`: peer-copy bandwidth GPU 0 <-> GPU 1 for each size.
///
/// Errors, before any GPU is opened: [`Error::BadShape`] for `iters == 0`, no sizes or a size
/// of 0 bytes.
pub fn peer_bw(sizes: &[usize], iters: usize) -> Result<()> {
    at_least_one("mgpu peer-bw --iters", iters as u64)?;
    at_least_one("mgpu peer-bw --bytes (number of sizes)", sizes.len() as u64)?;
    for &b in sizes {
        at_least_one("mgpu peer-bw --bytes", b as u64)?;
    }
    let set = two_gpus("mgpu peer-bw")?;
    println!(
        "peer copies GPU 0 <-> GPU 1, {iters} copies per figure, GB/s (1e9 B/s), CUDA-event timed"
    );
    println!(
        "{:>12} {:>10} {:>10} {:>14} {:>14} {:>8}",
        "bytes", "peer 1-way", "peer both", "dtod 1-way", "dtod both", "ratio"
    );
    for &b in sizes {
        let r = bench::peer_copy_bandwidth(&set, 0, 1, b, iters)?;
        println!(
            "{:>12} {:>10.1} {:>10.1} {:>14.1} {:>14.1} {:>8.3}",
            r.bytes,
            r.one_way,
            r.both_ways,
            r.baseline_one_way,
            r.baseline_both_ways,
            r.one_way / r.baseline_one_way
        );
    }
    println!("peer = cuMemcpyPeerAsync (copy engines); dtod = cuMemcpyDtoDAsync on unified addresses (cudaMemcpyAsync default-kind equivalent), the same-run baseline; ratio = peer / dtod one way");
    Ok(())
}

/// What `mgpu pipeline` measured: each placement eager and, with `graphs`, replayed from CUDA
/// graphs in the same run.
#[derive(Clone, Debug)]
pub struct PipelineRun {
    /// Both stages on GPU 0, kernel by kernel.
    pub one: LayerPipelineReport,
    /// Stage 1 on GPU 0, stage 2 on GPU 1, kernel by kernel.
    pub two: LayerPipelineReport,
    /// One GPU, each slot's compute replayed from a CUDA graph (with `graphs`).
    pub one_graph: Option<LayerPipelineReport>,
    /// Two GPUs, per-GPU graphs (with `graphs`).
    pub two_graph: Option<LayerPipelineReport>,
}

impl PipelineRun {
    /// Two GPUs over one GPU, microbatches per second, eager (the goal: >= 1.8).
    pub fn ratio(&self) -> f64 {
        self.two.microbatches_per_s() / self.one.microbatches_per_s()
    }

    /// The same ratio with both placements replayed from graphs.
    pub fn graph_ratio(&self) -> Option<f64> {
        Some(
            self.two_graph.as_ref()?.microbatches_per_s()
                / self.one_graph.as_ref()?.microbatches_per_s(),
        )
    }
}

/// `mgpu pipeline`: the two-GPU layer pipeline against one GPU doing both stages; with `graphs`,
/// each placement also replayed from per-GPU CUDA graphs in the same run
/// ([`LayerPipeline::run_eager_then_graphs`]); with `verify`, checked against the CPU (and graph
/// outputs against eager, bit for bit). Writes the text report to `out` (the CLI passes stderr
/// under `--json`) and returns the figures.
///
/// Errors, before any GPU is opened: those of [`LayerPipelineConfig::check`], and
/// [`Error::BadShape`] for `microbatches == 0`.
pub fn pipeline(
    cfg: LayerPipelineConfig,
    microbatches: usize,
    verify: bool,
    graphs: bool,
    out: &mut dyn std::io::Write,
) -> Result<PipelineRun> {
    cfg.check()?;
    at_least_one("mgpu pipeline --microbatches", microbatches as u64)?;
    let set = two_gpus("mgpu pipeline")?;
    let measure = |placement, b| -> Result<(LayerPipelineReport, Option<LayerPipelineReport>)> {
        let mut p = LayerPipeline::new(&set, 0, b, placement, cfg)?;
        if graphs {
            let (e, g) = p.run_eager_then_graphs(microbatches, verify)?;
            Ok((e, Some(g)))
        } else {
            Ok((p.run(microbatches, verify)?, None))
        }
    };
    let (one, one_graph) = measure(Placement::OneGpu, 0)?;
    let (two, two_graph) = measure(Placement::TwoGpus, 1)?;
    let r = PipelineRun {
        one,
        two,
        one_graph,
        two_graph,
    };
    let _ = write_pipeline(out, &cfg, microbatches, &r);
    Ok(r)
}

fn write_pipeline(
    out: &mut dyn std::io::Write,
    cfg: &LayerPipelineConfig,
    microbatches: usize,
    r: &PipelineRun,
) -> std::io::Result<()> {
    writeln!(
        out,
        "layer pipeline: {} tiles x 128x128 f32 per microbatch ({:.1} MiB activations), {} GEMM layers per stage, {} slots, {} microbatches",
        cfg.tiles,
        cfg.activation_bytes() as f64 / (1 << 20) as f64,
        cfg.layers,
        cfg.slots,
        microbatches
    )?;
    let line = |out: &mut dyn std::io::Write,
                what: &str,
                p: &LayerPipelineReport,
                eager: Option<&LayerPipelineReport>|
     -> std::io::Result<()> {
        writeln!(
            out,
            "  {what}: {:.3} s, {:.1} microbatches/s, {:.0} GFLOP/s{}{}{}",
            p.seconds,
            p.microbatches_per_s(),
            p.gflops(),
            eager.map_or(String::new(), |e| format!(
                " ({:.3}x eager)",
                p.microbatches_per_s() / e.microbatches_per_s()
            )),
            p.max_rel_error.map_or(String::new(), |e| format!(
                ", verified (worst tile rel. error {e:.2e})"
            )),
            if p.graph_matches_eager == Some(true) {
                ", equals the eager run bit for bit"
            } else {
                ""
            }
        )
    };
    line(out, "OneGpu", &r.one, None)?;
    if let Some(g) = &r.one_graph {
        line(out, "OneGpu, CUDA graphs", g, Some(&r.one))?;
    }
    line(out, "TwoGpus", &r.two, None)?;
    if let Some(g) = &r.two_graph {
        line(
            out,
            "TwoGpus, CUDA graphs (per GPU and slot, peer copy outside)",
            g,
            Some(&r.two),
        )?;
    }
    let ratio = r.ratio();
    writeln!(
        out,
        "  two GPUs / one GPU: {ratio:.3}x (goal >= 1.8x: {})",
        if ratio >= 1.8 { "met" } else { "NOT met" }
    )?;
    if let Some(g) = r.graph_ratio() {
        writeln!(out, "  two GPUs / one GPU, both from graphs: {g:.3}x")?;
    }
    Ok(())
}

/// `mgpu allreduce`: NCCL all-reduce bus bandwidth, 1 MiB to 1 GiB; `procs == 0`: one process
/// (ncclCommInitAll, grouped); `procs >= 2`: that many processes, one per GPU (ncclCommInitRank),
/// started from this executable with the id in [`NCCL_ID_ENV`].
///
/// Errors, before any GPU is opened or process started: [`Error::BadShape`] for `iters == 0`
/// (no time per all-reduce) or `procs == 1`; [`Error::NotEnoughDevices`] when `procs` exceeds the
/// GPUs the driver reports (each rank needs its own GPU; the ranks would otherwise wait out
/// NCCL's init timeout).
pub fn allreduce(iters: usize, procs: usize) -> Result<()> {
    at_least_one("mgpu allreduce --iters", iters as u64)?;
    if procs == 1 {
        return Err(Error::BadShape {
            what: "mgpu allreduce --procs",
            detail:
                "1; allowed: 0 (one process driving every GPU) or 2 or more (one process per GPU)"
                    .into(),
        });
    }
    nccl::library_available()?;
    nccl::require_nvls_off()?;
    if procs >= 2 {
        let n = device_count()?;
        if procs > n {
            return Err(Error::NotEnoughDevices {
                what: "mgpu allreduce --procs (one GPU per process)",
                needed: procs,
                available: n,
            });
        }
    }
    if procs == 0 {
        let n = device_count()?;
        if n < 2 {
            return Err(Error::NotEnoughDevices {
                what: "mgpu allreduce",
                needed: 2,
                available: n,
            });
        }
        let set = DeviceSet::open_first(n)?;
        let streams = (0..n)
            .map(|i| set.high_priority_stream(i))
            .collect::<Result<Vec<_>>>()?;
        let comms = Communicator::init_all(&set, &streams)?;
        let pts = bench::all_reduce_sweep(&set, &comms, &sweep_sizes(), iters)?;
        print_sweep(
            &format!("one process, {n} GPUs (ncclCommInitAll + group calls)"),
            &pts,
        );
        return Ok(());
    }
    // A bad WARPLINE_NCCL_COLLECTIVES is refused here, before any rank starts.
    nccl::collectives_mode()?;
    let id = NcclId::new()?;
    let exe = std::env::current_exe().map_err(|e| Error::BadShape {
        what: "mgpu allreduce",
        detail: e.to_string(),
    })?;
    let children: Vec<_> = (0..procs)
        .map(|r| {
            Command::new(&exe)
                .args([
                    "mgpu",
                    "nccl-rank",
                    "--rank",
                    &r.to_string(),
                    "--world",
                    &procs.to_string(),
                    "--iters",
                    &iters.to_string(),
                ])
                .env(NCCL_ID_ENV, id.to_hex())
                .env(
                    nccl::NVLS_ENV,
                    std::env::var(nccl::NVLS_ENV).unwrap_or_else(|_| "0".into()),
                )
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
        })
        .collect();
    // Every rank's pipes are drained at once (one waiting thread per child): draining them one
    // child after another could leave a later rank blocked on a full pipe while rank 0's
    // collective waits for it.
    let outputs: Vec<_> = std::thread::scope(|scope| {
        let waiting: Vec<_> = children
            .into_iter()
            .map(|c| scope.spawn(move || c.and_then(|c| c.wait_with_output())))
            .collect();
        waiting
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("the waiting thread panicked")))
            })
            .collect()
    });
    let mut failed = false;
    for (r, out) in outputs.into_iter().enumerate() {
        let out = out.map_err(|e| Error::BadShape {
            what: "mgpu allreduce: running a rank",
            detail: e.to_string(),
        })?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        if !out.status.success() {
            eprintln!("rank {r} exited with {}", out.status);
            failed = true;
        }
    }
    if failed {
        return Err(Error::Verification {
            detail: "a rank of the multi-process all-reduce failed".into(),
        });
    }
    Ok(())
}

fn print_sweep(what: &str, pts: &[bench::AllReducePoint]) {
    println!("NCCL all-reduce f32 sum, {what}; busbw = algbw x 2(n-1)/n, GB/s");
    println!(
        "{:>12} {:>12} {:>10} {:>10}",
        "bytes", "time us", "algbw", "busbw"
    );
    for p in pts {
        println!(
            "{:>12} {:>12.1} {:>10.1} {:>10.1}",
            p.bytes, p.micros, p.algbw, p.busbw
        );
    }
}

/// `mgpu nccl-rank` (started by `mgpu allreduce --procs N`): one rank on GPU `rank`.
///
/// # Safety
/// Every rank of the communicator runs this with the same `world` and `iters` (the launching
/// `mgpu allreduce` passes the same arguments to each child), so their all-reduces have equal
/// lengths ([`bench::all_reduce_sweep_rank`]'s contract).
pub unsafe fn nccl_rank(rank: usize, world: usize, iters: usize) -> Result<()> {
    at_least_one("mgpu nccl-rank --iters", iters as u64)?;
    if rank >= world {
        return Err(Error::BadShape {
            what: "mgpu nccl-rank --rank",
            detail: format!("{rank} with --world {world}; allowed: 0 to world - 1"),
        });
    }
    let hex = std::env::var(NCCL_ID_ENV).map_err(|_| Error::BadShape {
        what: "mgpu nccl-rank",
        detail: format!("{NCCL_ID_ENV} is not set; allowed: the 256 hex digits of the NCCL id from the launching process"),
    })?;
    let id = NcclId::from_hex(&hex)?;
    let dev = warpline::Device::open(rank)?;
    let set = DeviceSet::from_devices(vec![dev])?;
    let stream = set.high_priority_stream(0)?;
    let comm = Communicator::init_rank(set.device(0)?, &stream, rank, world, &id)?;
    // SAFETY: this function's contract; `sweep_sizes()` is the same constant on every rank.
    let pts =
        unsafe { bench::all_reduce_sweep_rank(set.device(0)?, &comm, &sweep_sizes(), iters)? };
    if rank == 0 {
        print_sweep(
            &format!(
                "{world} processes, one GPU each (ncclCommInitRank), collectives {:?} \
                 ({}), rank 0's timing",
                nccl::collectives_mode()?,
                nccl::COLLECTIVES_ENV
            ),
            &pts,
        );
    }
    Ok(())
}

/// `mgpu dp-step`: the data-parallel step overlapped, sequential, and the ideal; with
/// `cfg.graphs` also the graph-replayed step (eager vs `cuGraphLaunch`, same run); with
/// `cfg.verify` checked against the CPU (and graph against eager, bit for bit). Writes the text
/// report to `out` (the CLI passes stderr under `--json`) and returns the report.
pub fn dp_step(
    cfg: &bench::DataParallelConfig,
    out: &mut dyn std::io::Write,
) -> Result<bench::DataParallelReport> {
    // The flags first: before NCCL and the GPUs.
    cfg.check()?;
    nccl::library_available()?;
    let set = two_gpus("mgpu dp-step")?;
    let n = set.len();
    let streams = (0..n)
        .map(|i| set.high_priority_stream(i))
        .collect::<Result<Vec<_>>>()?;
    let comms = Communicator::init_all(&set, &streams)?;
    let r = bench::data_parallel_step_with(&set, &comms, cfg)?;
    let _ = write_dp_step(out, cfg, n, &r);
    Ok(r)
}

fn write_dp_step(
    out: &mut dyn std::io::Write,
    cfg: &bench::DataParallelConfig,
    n: usize,
    r: &bench::DataParallelReport,
) -> std::io::Result<()> {
    writeln!(
        out,
        "data-parallel step on {n} GPUs: {} buckets of {:.1} MiB, {} GEMM layers of {} tiles per bucket, {} steps",
        r.buckets,
        r.bucket_bytes as f64 / (1 << 20) as f64,
        cfg.layers,
        cfg.tiles,
        cfg.steps
    )?;
    writeln!(out, "  compute only   {:>9.3} ms", r.compute_ms)?;
    writeln!(out, "  all-reduce only{:>9.3} ms", r.comm_ms)?;
    writeln!(out, "  ideal max(c,m) {:>9.3} ms", r.ideal_ms())?;
    writeln!(out, "  sequential     {:>9.3} ms", r.sequential_ms)?;
    writeln!(
        out,
        "  overlapped     {:>9.3} ms  ({:.3}x of ideal, {:.3}x faster than sequential)",
        r.overlapped_ms,
        r.overlapped_ms / r.ideal_ms(),
        r.sequential_ms / r.overlapped_ms
    )?;
    if let (Some(g), Some(gc)) = (r.graph_overlapped_ms, r.graph_compute_ms) {
        writeln!(
            out,
            "  CUDA graphs (per GPU and bucket, NCCL outside): compute only {gc:.3} ms (eager {:.3}, {:.3}x), overlapped step {g:.3} ms (eager {:.3}, {:.3}x)",
            r.compute_ms,
            r.compute_ms / gc,
            r.overlapped_ms,
            r.overlapped_ms / g
        )?;
    }
    if let Some(e) = r.max_rel_error {
        writeln!(
            out,
            "  verified: every bucket of every GPU against the CPU (worst tile rel. error {e:.2e}){}",
            if r.graph_matches_eager == Some(true) {
                "; graph replay equals the eager step bit for bit"
            } else {
                ""
            }
        )?;
    }
    Ok(())
}

/// `mgpu seeds`: the cross-GPU seed scenarios, `runs` bounded runs of seed 1.
///
/// Errors, before any GPU is opened: [`Error::BadShape`] for `runs == 0` or `bound_ms == 0`.
pub fn seeds(runs: usize, bound_ms: u64) -> Result<()> {
    at_least_one("mgpu seeds --runs", runs as u64)?;
    at_least_one("mgpu seeds --bound-ms", bound_ms)?;
    let set = two_gpus("mgpu seeds")?;
    let r = seeds::run_seeds(&set, runs, Duration::from_millis(bound_ms))?;
    println!(
        "seed 1 (opposite-order signals across GPUs): {} of {} runs completed",
        r.completed, r.runs
    );
    println!(
        "seed 2 (cyclic dependency between GPUs): rejected before enqueue: {}",
        r.cyclic_rejected
    );
    Ok(())
}
