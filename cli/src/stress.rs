//! A bounded stress run of warpline's scheduling and ordering (`warpline stress`, issue 9).
//!
//! [`run`] goes through four sections, each of which counts runs, hangs, wrong results and errors:
//!
//! - **pipeline**: [`BatchPipeline`] over several streams, `--batches` batches of
//!   `--batch-elems` floats in several `run` calls (at most 256 batches and 2^24 floats of pinned
//!   input per call), each batch checked against the f64 CPU reference;
//! - **fences**: `--fence-tickets` tickets from `--fence-threads` threads. Each thread guards its
//!   own stream, queues a copy that reads what the fence's internal work writes, submits the
//!   internal work (`busy_fill` in the fence's private context) on the same thread or from a
//!   helper thread after a random delay, and checks the copy against
//!   [`warpline_gpu::contract::signal::pattern`]. One fence is shared by most threads; every
//!   fourth thread (3, 7, ...) has a fence of its own;
//! - **task graphs**: `--graphs` random acyclic [`TaskGraph`]s over 1 to 4 lanes with signal
//!   sets, adds and waits whose values are satisfiable by construction, each enqueued twice, every
//!   fourth also captured and launched twice; data written before each set/add is copied after
//!   each wait and checked;
//! - **host callbacks**: as many graphs again with host tasks, each of which must have run
//!   exactly once per run.
//!
//! Every wait is bounded: task-graph runs, fence runs and read-backs go through
//! [`synchronize_timeout`] with `--bound-ms`; `BatchPipeline::run` blocks inside, so the pipeline
//! runs on a worker thread (with its own [`Device`] handle on the same GPU) and the caller waits
//! for each `run` call with the same bound. A timeout is a counted hang, never a hung process:
//! what the stuck work may still use is leaked (never freed under it), the section continues on
//! fresh streams and buffers, and stops after [`MAX_HANGS_PER_SECTION`] hangs.

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use warpline::device::Device;
use warpline::error::{Error, Result};
use warpline::kernels::signal as probe;
use warpline::memory::{DeviceBuffer, MemPool, PinnedBuffer};
use warpline::ordering::{synchronize_timeout, Cmp, Fence, OnTimeout, Signal, TaskGraph};
use warpline::pipeline::{BatchPipeline, MAX_STREAMS};
use warpline::reference;
use warpline::rng::{mix64, rng_for, StdRng};
use warpline::stream::Stream;
use warpline_gpu::contract::signal::pattern;

/// Default `--fence-tickets`.
pub const DEFAULT_FENCE_TICKETS: usize = 1000;
/// Default `--fence-threads`.
pub const DEFAULT_FENCE_THREADS: usize = 8;
/// Default `--batches`.
pub const DEFAULT_BATCHES: usize = 10_000;
/// Default `--batch-elems` (2^16 floats: 10k batches take seconds).
pub const DEFAULT_BATCH_ELEMS: usize = 1 << 16;
/// Default `--pipeline-streams`.
pub const DEFAULT_PIPELINE_STREAMS: usize = 4;
/// Default `--graphs`.
pub const DEFAULT_GRAPHS: usize = 200;
/// Default `--bound-ms`.
pub const DEFAULT_BOUND: Duration = Duration::from_secs(10);

/// Most `--fence-threads`.
pub const MAX_FENCE_THREADS: usize = 64;
/// Most `--fence-tickets`.
pub const MAX_FENCE_TICKETS: usize = 10_000_000;
/// Most `--batches`.
pub const MAX_BATCHES: usize = 100_000_000;
/// Most `--batch-elems`.
pub const MAX_BATCH_ELEMS: usize = 1 << 26;
/// Most `--graphs`.
pub const MAX_GRAPHS: usize = 1_000_000;
/// Longest `--bound-ms` (one hour).
pub const MAX_BOUND: Duration = Duration::from_secs(3600);
/// A section stops after this many hangs (each costs up to the bound).
pub const MAX_HANGS_PER_SECTION: u64 = 4;

/// Batches per `BatchPipeline::run` call at most.
const MAX_BATCHES_PER_CALL: usize = 256;
/// Floats per input per `BatchPipeline::run` call at most (unless one batch is larger).
const MAX_ELEMS_PER_CALL: usize = 1 << 24;
/// u32 written by each fence's internal work and copied by the caller.
const FENCE_ELEMS: u32 = 1 << 14;
/// Longest busy time of a fence's internal work.
const FENCE_MAX_SPIN_NS: u64 = 200_000;
/// Longest delay before a helper thread submits a ticket.
const FENCE_MAX_DELAY_US: u64 = 500;
/// u32 per signal's data and per wait's output in the task graphs.
const GRAPH_ELEMS: u32 = 4096;
/// Lanes (streams) a random graph uses at most.
const MAX_LANES: usize = 4;
/// Signal slots of every random graph.
const SIGNALS: usize = 3;
/// Steps (1 or 2 tasks each) of a random graph at most.
const MAX_STEPS: usize = 14;
/// Waits of a random graph at most (each has an output slice).
const MAX_WAITS: usize = MAX_STEPS;
/// Longest busy time of a graph kernel.
const GRAPH_MAX_SPIN_NS: u64 = 20_000;
/// What outputs hold before the work that should overwrite them.
const POISON: u32 = 0xDEAD_BEEF;
/// Longest time the pipeline worker may spend on host work (inputs, verification) between two
/// bounded GPU waits before the caller gives up on it.
const PIPELINE_HOST_PHASE_LIMIT: Duration = Duration::from_secs(600);

/// What [`run`] does. `Default` gives the CLI's defaults with seed 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StressOptions {
    /// Fence tickets in all (0 skips the section).
    pub fence_tickets: usize,
    /// Threads taking fence tickets (1 to [`MAX_FENCE_THREADS`]).
    pub fence_threads: usize,
    /// Pipeline batches in all (0 skips the section).
    pub batches: usize,
    /// Floats per pipeline batch (1 to [`MAX_BATCH_ELEMS`]).
    pub batch_elems: usize,
    /// Streams of the pipeline (1 to [`MAX_STREAMS`]).
    pub pipeline_streams: usize,
    /// Random task graphs, and as many host-callback graphs (0 skips both sections).
    pub graphs: usize,
    /// Bound of every wait (1 ms to [`MAX_BOUND`]).
    pub bound: Duration,
    /// Seed of every random choice (inputs, graphs, fence seeds and delays).
    pub seed: u64,
    /// Print progress lines to stderr (section starts and ends, every pipeline call, every 100
    /// fence tickets of a thread, every 50 graphs), so a run that hangs outside its bounded
    /// waits shows where.
    pub progress: bool,
}

/// A progress line on stderr when `opts.progress`.
macro_rules! progress {
    ($opts:expr, $($arg:tt)*) => {
        if $opts.progress {
            eprintln!("stress: {}", format_args!($($arg)*));
        }
    };
}

impl Default for StressOptions {
    fn default() -> Self {
        Self {
            fence_tickets: DEFAULT_FENCE_TICKETS,
            fence_threads: DEFAULT_FENCE_THREADS,
            batches: DEFAULT_BATCHES,
            batch_elems: DEFAULT_BATCH_ELEMS,
            pipeline_streams: DEFAULT_PIPELINE_STREAMS,
            graphs: DEFAULT_GRAPHS,
            bound: DEFAULT_BOUND,
            seed: 0,
            progress: false,
        }
    }
}

fn bad_option(detail: String) -> Error {
    Error::BadShape {
        what: "stress options",
        detail,
    }
}

impl StressOptions {
    /// Checks every field against its range (pure CPU; the CLI calls it before opening the
    /// device). Errors: [`Error::BadShape`] naming the flag, the value and what is allowed.
    pub fn validate(&self) -> Result<()> {
        let range = |flag: &str, v: usize, lo: usize, hi: usize, what: &str| {
            if (lo..=hi).contains(&v) {
                Ok(())
            } else {
                Err(bad_option(format!(
                    "{flag} {v}: {what} must be between {lo} and {hi}"
                )))
            }
        };
        range(
            "--fence-threads",
            self.fence_threads,
            1,
            MAX_FENCE_THREADS,
            "the number of fence threads",
        )?;
        range(
            "--fence-tickets",
            self.fence_tickets,
            0,
            MAX_FENCE_TICKETS,
            "the number of fence tickets (0 skips the fences)",
        )?;
        range(
            "--batches",
            self.batches,
            0,
            MAX_BATCHES,
            "the number of pipeline batches (0 skips the pipeline)",
        )?;
        range(
            "--batch-elems",
            self.batch_elems,
            1,
            MAX_BATCH_ELEMS,
            "the number of floats per batch",
        )?;
        range(
            "--pipeline-streams",
            self.pipeline_streams,
            1,
            MAX_STREAMS,
            "the number of pipeline streams",
        )?;
        range(
            "--graphs",
            self.graphs,
            0,
            MAX_GRAPHS,
            "the number of task graphs (0 skips the graphs and host callbacks)",
        )?;
        if self.bound < Duration::from_millis(1) || self.bound > MAX_BOUND {
            return Err(bad_option(format!(
                "--bound-ms {}: the bound must be between 1 and {} milliseconds",
                self.bound.as_millis(),
                MAX_BOUND.as_millis()
            )));
        }
        Ok(())
    }

    /// Batches per `BatchPipeline::run` call.
    fn batches_per_call(&self) -> usize {
        (MAX_ELEMS_PER_CALL / self.batch_elems.max(1))
            .clamp(1, MAX_BATCHES_PER_CALL)
            .min(self.batches.max(1))
    }

    /// Bytes of pinned host memory the pipeline section holds at once (A, B and C of one `run`
    /// call), for checking against the host's memory before starting. 0 when it is skipped.
    pub fn pipeline_host_bytes(&self) -> u64 {
        if self.batches == 0 {
            return 0;
        }
        let elems = self.batches_per_call() as u64 * self.batch_elems as u64;
        3 * 4 * elems
    }
}

/// Counts of one section of a stress run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SectionReport {
    /// `pipeline`, `fences`, `task graphs` or `host callbacks`.
    pub name: &'static str,
    /// Runs attempted: pipeline batches, fence tickets, graph runs (enqueues and launches).
    pub runs: u64,
    /// Runs whose bounded wait timed out (must be 0).
    pub hangs: u64,
    /// Runs with a wrong result (must be 0): batches off the CPU reference, fence copies or
    /// graph outputs that differ from the pattern, host callbacks not run exactly once per run,
    /// generated graphs that `TaskGraph::check` rejected, fence tickets left open.
    pub wrong: u64,
    /// Errors other than timeouts (must be 0); a section stops at its first.
    pub errors: u64,
    /// True when the section stopped early (an error, or [`MAX_HANGS_PER_SECTION`] hangs).
    pub aborted: bool,
    /// Wall time of the section.
    pub time: Duration,
    /// What was run, in words.
    pub detail: String,
    /// The first hang, wrong result or error, in words.
    pub first_problem: Option<String>,
}

impl SectionReport {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            ..Self::default()
        }
    }

    /// No hang, no wrong result, no error.
    pub fn passed(&self) -> bool {
        self.hangs == 0 && self.wrong == 0 && self.errors == 0
    }

    fn problem(&mut self, what: impl FnOnce() -> String) {
        if self.first_problem.is_none() {
            self.first_problem = Some(what());
        }
    }

    fn hang(&mut self, e: &Error) {
        self.hang_at(String::new(), e);
    }

    /// A hang at `at` (a place such as `"graph 3: "`, or empty).
    fn hang_at(&mut self, at: String, e: &Error) {
        self.hangs += 1;
        self.problem(|| format!("{at}hang: {e}"));
    }

    fn wrong_result(&mut self, what: impl FnOnce() -> String) {
        self.wrong += 1;
        self.problem(|| format!("wrong result: {}", what()));
    }

    fn error(&mut self, e: &Error) {
        self.error_at(String::new(), e);
    }

    /// An error at `at` (a place, or empty); the section stops.
    fn error_at(&mut self, at: String, e: &Error) {
        self.errors += 1;
        self.aborted = true;
        self.problem(|| format!("{at}error: {e}"));
    }

    fn merge(&mut self, other: SectionReport) {
        self.runs += other.runs;
        self.hangs += other.hangs;
        self.wrong += other.wrong;
        self.errors += other.errors;
        self.aborted |= other.aborted;
        if self.first_problem.is_none() {
            self.first_problem = other.first_problem;
        }
    }
}

/// Memory-pool figures before and after the run, bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolReport {
    /// The device's default pool, which the fence and graph sections allocate from
    /// (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT` before the first section).
    pub default_reserved_before: u64,
    /// The same after the last section (its buffers freed and their streams drained).
    pub default_reserved_after: u64,
    /// `CU_MEMPOOL_ATTR_USED_MEM_CURRENT` of the default pool before the first section.
    pub default_used_before: u64,
    /// The same after the last section: above `default_used_before` means memory still
    /// allocated (leaked on purpose after a hang, or a leak).
    pub default_used_after: u64,
    /// `CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH` of the default pool after the last section.
    pub default_reserved_high: u64,
    /// The release threshold of the default pool (left as it was).
    pub default_release_threshold: u64,
    /// The pipeline's own pool (release threshold: keep everything), reserved bytes after its
    /// first `run` call; `None` when the section was skipped or did not get there.
    pub pipeline_reserved_first: Option<u64>,
    /// The same after its last `run` call (equal to the first in a steady state).
    pub pipeline_reserved_last: Option<u64>,
}

/// The environment variables that change how CUDA schedules streams and loads modules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    /// `CUDA_DEVICE_MAX_CONNECTIONS` (hardware queues per context), if set.
    pub device_max_connections: Option<String>,
    /// `CUDA_MODULE_LOADING` (`LAZY` or `EAGER`), if set.
    pub module_loading: Option<String>,
}

impl Environment {
    /// Reads the variables of this process.
    pub fn from_process() -> Self {
        let var = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
        Self {
            device_max_connections: var("CUDA_DEVICE_MAX_CONNECTIONS"),
            module_loading: var("CUDA_MODULE_LOADING"),
        }
    }
}

/// Everything a stress run found. `Display` prints the table; [`StressReport::to_json`] one JSON
/// object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StressReport {
    /// The seed (rerun with `--seed` to repeat the random choices).
    pub seed: u64,
    /// The bound of every wait.
    pub bound: Duration,
    /// The device's name.
    pub device: String,
    /// CUDA environment variables.
    pub env: Environment,
    /// The pipeline section.
    pub pipeline: SectionReport,
    /// The fence section.
    pub fences: SectionReport,
    /// The task-graph section.
    pub graphs: SectionReport,
    /// The host-callback section.
    pub host_callbacks: SectionReport,
    /// Pool figures.
    pub pools: PoolReport,
}

impl StressReport {
    /// The four sections, in the order they ran.
    pub fn sections(&self) -> [&SectionReport; 4] {
        [
            &self.pipeline,
            &self.fences,
            &self.graphs,
            &self.host_callbacks,
        ]
    }

    /// True when no section had a hang, a wrong result or an error.
    pub fn passed(&self) -> bool {
        self.sections().iter().all(|s| s.passed())
    }

    /// The report as one JSON object (no trailing newline).
    pub fn to_json(&self) -> String {
        let opt_str = |v: &Option<String>| v.as_deref().map_or("null".to_string(), json_string);
        let opt_u64 = |v: Option<u64>| v.map_or("null".to_string(), |v| v.to_string());
        let sections: Vec<String> = self
            .sections()
            .iter()
            .map(|s| {
                format!(
                    "{}:{{\"runs\":{},\"hangs\":{},\"wrong\":{},\"errors\":{},\"aborted\":{},\"time_ms\":{:.3},\"passed\":{},\"detail\":{},\"first_problem\":{}}}",
                    json_string(s.name),
                    s.runs,
                    s.hangs,
                    s.wrong,
                    s.errors,
                    s.aborted,
                    s.time.as_secs_f64() * 1e3,
                    s.passed(),
                    json_string(&s.detail),
                    opt_str(&s.first_problem)
                )
            })
            .collect();
        let p = &self.pools;
        format!(
            "{{\"seed\":{},\"bound_ms\":{},\"device\":{},\"env\":{{\"CUDA_DEVICE_MAX_CONNECTIONS\":{},\"CUDA_MODULE_LOADING\":{}}},\"sections\":{{{}}},\"pools\":{{\"default_reserved_before\":{},\"default_reserved_after\":{},\"default_used_before\":{},\"default_used_after\":{},\"default_reserved_high\":{},\"default_release_threshold\":{},\"pipeline_reserved_first\":{},\"pipeline_reserved_last\":{}}},\"passed\":{}}}",
            self.seed,
            self.bound.as_millis(),
            json_string(&self.device),
            opt_str(&self.env.device_max_connections),
            opt_str(&self.env.module_loading),
            sections.join(","),
            p.default_reserved_before,
            p.default_reserved_after,
            p.default_used_before,
            p.default_used_after,
            p.default_reserved_high,
            p.default_release_threshold,
            opt_u64(p.pipeline_reserved_first),
            opt_u64(p.pipeline_reserved_last),
            self.passed()
        )
    }
}

/// `s` as a JSON string literal.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

impl fmt::Display for StressReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let env = |v: &Option<String>| v.clone().unwrap_or_else(|| "unset".to_string());
        writeln!(
            f,
            "warpline stress on {}: seed {} (repeat with --seed {}), bound {} ms per wait",
            self.device,
            self.seed,
            self.seed,
            self.bound.as_millis()
        )?;
        writeln!(
            f,
            "environment: CUDA_DEVICE_MAX_CONNECTIONS={} CUDA_MODULE_LOADING={}",
            env(&self.env.device_max_connections),
            env(&self.env.module_loading)
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "{:<15} {:>9} {:>6} {:>6} {:>7} {:>11}  {:<6} what",
            "section", "runs", "hangs", "wrong", "errors", "time ms", "result"
        )?;
        for s in self.sections() {
            let result = match (s.passed(), s.aborted) {
                (true, _) => "ok",
                (false, true) => "FAIL*",
                (false, false) => "FAIL",
            };
            writeln!(
                f,
                "{:<15} {:>9} {:>6} {:>6} {:>7} {:>11.1}  {:<6} {}",
                s.name,
                s.runs,
                s.hangs,
                s.wrong,
                s.errors,
                s.time.as_secs_f64() * 1e3,
                result,
                s.detail
            )?;
        }
        for s in self.sections() {
            if let Some(p) = &s.first_problem {
                writeln!(f, "{}: first problem: {p}", s.name)?;
            }
        }
        if self.sections().iter().any(|s| s.aborted) {
            writeln!(
                f,
                "(* stopped early: after an error, or after {MAX_HANGS_PER_SECTION} hangs)"
            )?;
        }
        let p = &self.pools;
        let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        writeln!(f)?;
        writeln!(
            f,
            "default pool (fences, graphs; release threshold {}): reserved {} -> {} bytes (high {}), used {} -> {} bytes",
            p.default_release_threshold,
            p.default_reserved_before,
            p.default_reserved_after,
            p.default_reserved_high,
            p.default_used_before,
            p.default_used_after
        )?;
        writeln!(
            f,
            "pipeline pool: reserved {} bytes after the first run call, {} after the last",
            opt(p.pipeline_reserved_first),
            opt(p.pipeline_reserved_last)
        )?;
        write!(
            f,
            "result: {}",
            if self.passed() {
                "PASS (no hangs, no wrong results, no errors)"
            } else {
                "FAIL"
            }
        )
    }
}

/// Runs the stress program on `dev` (see the module docs) and reports what it found. Hangs,
/// wrong results and errors of single runs are counted in the report, not returned: check
/// [`StressReport::passed`].
///
/// Errors (nothing counted yet, or setup of a section failed): [`Error::BadShape`] for options
/// out of range ([`StressOptions::validate`]); setup errors of the sections, such as
/// [`Error::ModuleNotFullyLoaded`], [`Error::StreamMemOps64Unsupported`],
/// [`Error::MemoryPoolsUnsupported`], [`Error::OutOfMemory`], [`Error::Cuda`].
pub fn run(dev: &Device, opts: &StressOptions) -> Result<StressReport> {
    opts.validate()?;
    let env = Environment::from_process();
    let threshold = MemPool::default_pool_release_threshold(dev)?;
    // The default pool, with its release threshold left as it is.
    let pool = MemPool::device_default(dev, threshold)?;
    let mut pools = PoolReport {
        default_reserved_before: pool.reserved_bytes()?,
        default_used_before: pool.used_bytes()?,
        default_release_threshold: threshold,
        ..PoolReport::default()
    };
    progress!(opts, "pipeline section: {} batches", opts.batches);
    let pipeline = pipeline_section(dev, opts, &mut pools)?;
    progress!(opts, "fence section: {} tickets", opts.fence_tickets);
    let fences = fence_section(dev, &pool, opts)?;
    progress!(opts, "task graph section: {} graphs", opts.graphs);
    let graphs = graph_section(dev, &pool, opts, GraphKind::Data)?;
    progress!(opts, "host callback section: {} graphs", opts.graphs);
    let host_callbacks = graph_section(dev, &pool, opts, GraphKind::HostCallbacks)?;
    progress!(opts, "sections done");
    pools.default_reserved_after = pool.reserved_bytes()?;
    pools.default_used_after = pool.used_bytes()?;
    pools.default_reserved_high = pool.reserved_high_bytes()?;
    Ok(StressReport {
        seed: opts.seed,
        bound: opts.bound,
        device: dev.capabilities().name.clone(),
        env,
        pipeline,
        fences,
        graphs,
        host_callbacks,
        pools,
    })
}

/// A float in [-1, 1) with 24 bits of `v` (exact in f32).
fn unit_f32(v: u32) -> f32 {
    (v >> 8) as f32 * (1.0 / (1u32 << 23) as f32) - 1.0
}

// ------------------------------------------------------------------------------------ pipeline

/// What the pipeline worker tells the caller.
enum PipeMsg {
    /// Inputs are ready; a `BatchPipeline::run` call starts now (a bounded GPU phase).
    Started,
    /// The call returned (and its streams were seen drained): span ms and bytes moved.
    Ran(Result<(f64, u64)>),
    /// Its batches were checked against the CPU reference.
    Checked {
        batches: u64,
        wrong: u64,
        first: Option<String>,
    },
    /// All calls done.
    Done {
        calls: usize,
        reserved_first: Option<u64>,
        reserved_last: u64,
    },
    /// Setup or host work failed.
    Failed(Error),
}

fn pipeline_section(
    dev: &Device,
    opts: &StressOptions,
    pools: &mut PoolReport,
) -> Result<SectionReport> {
    let mut rep = SectionReport::new("pipeline");
    if opts.batches == 0 {
        rep.detail = "skipped (--batches 0)".into();
        return Ok(rep);
    }
    let t0 = Instant::now();
    let (tx, rx) = mpsc::channel();
    let (ordinal, ptx, own_context) = (dev.ordinal(), dev.ptx().to_string(), dev.is_own_context());
    let worker_opts = opts.clone();
    // Not scoped: if a call hangs, the worker stays blocked in the driver and is left behind
    // (with everything it holds) instead of being joined.
    std::thread::Builder::new()
        .name("warpline-stress-pipeline".into())
        .spawn(move || {
            // `Done` is sent once the worker's device, pipeline and buffers are dropped.
            let msg = match pipeline_worker(ordinal, &ptx, own_context, &worker_opts, &tx) {
                Ok(Some((calls, reserved_first, reserved_last))) => PipeMsg::Done {
                    calls,
                    reserved_first,
                    reserved_last,
                },
                Ok(None) => return, // the caller stopped listening
                Err(e) => PipeMsg::Failed(e),
            };
            let _ = tx.send(msg);
        })
        .map_err(|e| Error::BadShape {
            what: "stress pipeline",
            detail: format!("could not start the worker thread: {e}"),
        })?;
    let (mut span_ms, mut bytes, mut calls) = (0f64, 0u64, 0usize);
    let gone = || Error::BadShape {
        what: "stress pipeline",
        detail: "the worker thread ended without a report (it panicked)".into(),
    };
    loop {
        let msg = match rx.recv_timeout(PIPELINE_HOST_PHASE_LIMIT) {
            Ok(m) => m,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                rep.hang(&Error::BadShape {
                    what: "stress pipeline",
                    detail: format!(
                        "the worker made no progress in host work for {PIPELINE_HOST_PHASE_LIMIT:?}"
                    ),
                });
                rep.aborted = true;
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                rep.error(&gone());
                break;
            }
        };
        match msg {
            PipeMsg::Started => match rx.recv_timeout(opts.bound) {
                Ok(PipeMsg::Ran(Ok((ms, b)))) => {
                    span_ms += ms;
                    bytes += b;
                    calls += 1;
                }
                Ok(PipeMsg::Ran(Err(e))) | Ok(PipeMsg::Failed(e)) => {
                    if matches!(e, Error::Timeout { .. }) {
                        rep.hang(&e);
                        rep.aborted = true;
                    } else {
                        rep.error(&e);
                    }
                    break;
                }
                Ok(_) => {
                    rep.error(&Error::BadShape {
                        what: "stress pipeline",
                        detail: "the worker sent messages out of order".into(),
                    });
                    break;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    // The call is stuck in the driver: count it and leave the worker behind.
                    rep.hang(&Error::Timeout {
                        what: format!("BatchPipeline::run call {calls}"),
                        waited: opts.bound,
                        pending: vec![
                            "batches queued on the pipeline's streams (the worker thread is left blocked)".into(),
                        ],
                        released: false,
                    });
                    rep.aborted = true;
                    break;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    rep.error(&gone());
                    break;
                }
            },
            PipeMsg::Checked {
                batches,
                wrong,
                first,
            } => {
                rep.runs += batches;
                if wrong > 0 {
                    rep.wrong += wrong - 1;
                    rep.wrong_result(|| first.unwrap_or_default());
                }
            }
            PipeMsg::Done {
                calls: c,
                reserved_first,
                reserved_last,
            } => {
                calls = c;
                pools.pipeline_reserved_first = reserved_first;
                pools.pipeline_reserved_last = Some(reserved_last);
                break;
            }
            PipeMsg::Failed(e) => {
                rep.error(&e);
                break;
            }
            PipeMsg::Ran(_) => {
                rep.error(&Error::BadShape {
                    what: "stress pipeline",
                    detail: "the worker sent messages out of order".into(),
                });
                break;
            }
        }
    }
    rep.time = t0.elapsed();
    let gbps = if span_ms > 0.0 {
        bytes as f64 / (span_ms * 1e-3) / 1e9
    } else {
        0.0
    };
    rep.detail = format!(
        "{} streams, {} batches of {} floats in {calls} run calls, each batch against the f64 reference; {gbps:.1} GB/s over PCIe (both directions)",
        opts.pipeline_streams, opts.batches, opts.batch_elems
    );
    Ok(rep)
}

/// The pipeline section's thread: its own device handle, pipeline and pinned buffers. Returns
/// the number of `run` calls and the pipeline pool's reserved bytes after the first and the last,
/// or `None` when the caller stopped listening (or a call failed, which was sent as `Ran`).
fn pipeline_worker(
    ordinal: usize,
    ptx: &str,
    own_context: bool,
    opts: &StressOptions,
    tx: &mpsc::Sender<PipeMsg>,
) -> Result<Option<(usize, Option<u64>, u64)>> {
    // SAFETY: `ptx` is the module of the caller's opened `Device` (`Device::ptx`): the embedded
    // one, or one whose warpline entries its opener vouched for (`Device::open_with_ptx`).
    let dev = unsafe {
        if own_context {
            Device::open_in_new_context_with_ptx(ordinal, ptx)?
        } else {
            Device::open_with_ptx(ordinal, ptx)?
        }
    };
    let pipe = BatchPipeline::new(&dev, opts.pipeline_streams)?;
    let per_call = opts.batches_per_call();
    let be = opts.batch_elems;
    let mut bufs: Option<[PinnedBuffer<f32>; 3]> = None;
    let (mut done, mut call, mut reserved_first) = (0usize, 0usize, None);
    while done < opts.batches {
        let nb = per_call.min(opts.batches - done);
        let n = nb * be; // <= max(2^24, 2^26) floats
        let fresh = match bufs.take() {
            Some(kept) if kept[0].len() == n => kept,
            old => {
                drop(old); // free the old ones first
                [
                    PinnedBuffer::new(&dev, n)?,
                    PinnedBuffer::new(&dev, n)?,
                    PinnedBuffer::new(&dev, n)?,
                ]
            }
        };
        let [a, b, c] = bufs.insert(fresh);
        let base = mix64(opts.seed ^ mix64(0x919E ^ mix64(call as u64)));
        for (i, (x, y)) in a.iter_mut().zip(b.iter_mut()).enumerate() {
            let h = mix64(base.wrapping_add(i as u64));
            *x = unit_f32(h as u32);
            *y = unit_f32((h >> 32) as u32);
        }
        c.fill(f32::NAN);
        if tx.send(PipeMsg::Started).is_err() {
            return Ok(None); // the caller gave up
        }
        let ran = pipe.run_vector_add(a, b, c, be, |_, _| {}).and_then(|r| {
            // `run` waits for every stream before it returns; confirm it, bounded.
            for s in pipe.streams() {
                synchronize_timeout(s, opts.bound, OnTimeout::Abandon)?;
            }
            Ok((r.span_ms, r.bytes_h2d + r.bytes_d2h))
        });
        let failed = ran.is_err();
        if tx.send(PipeMsg::Ran(ran)).is_err() || failed {
            return Ok(None);
        }
        let (mut wrong, mut first) = (0u64, None);
        for (i, ((ca, cb), cc)) in a.chunks(be).zip(b.chunks(be)).zip(c.chunks(be)).enumerate() {
            let want = reference::vector_add(ca, cb);
            let (err, at) = reference::max_rel_error(cc, &want);
            if err.is_nan() || err > reference::VECTOR_ADD_REL_BOUND {
                wrong += 1;
                first.get_or_insert_with(|| {
                    format!(
                        "pipeline batch {}: element {at} is {} but the f64 reference is {} (relative error {err:e} > {:e})",
                        done + i,
                        cc[at],
                        want[at],
                        reference::VECTOR_ADD_REL_BOUND
                    )
                });
            }
        }
        if call == 0 {
            reserved_first = Some(pipe.pool().reserved_bytes()?);
        }
        let checked = PipeMsg::Checked {
            batches: nb as u64,
            wrong,
            first,
        };
        if tx.send(checked).is_err() {
            return Ok(None);
        }
        done += nb;
        call += 1;
        progress!(opts, "pipeline call {call} done ({done} batches)");
    }
    let reserved_last = pipe.pool().reserved_bytes()?;
    Ok(Some((call, reserved_first, reserved_last)))
}

// -------------------------------------------------------------------------------------- fences

/// One fence thread's stream, buffers (default pool) and pinned read-back buffer.
struct FenceRig {
    stream: Stream,
    data: DeviceBuffer<u32>,
    out: DeviceBuffer<u32>,
    host: PinnedBuffer<u32>,
}

impl FenceRig {
    fn new(dev: &Device, pool: &MemPool) -> Result<Self> {
        let stream = dev.new_stream()?;
        let data = pool.alloc_async::<u32>(&stream, FENCE_ELEMS as usize)?;
        let out = pool.alloc_async::<u32>(&stream, FENCE_ELEMS as usize)?;
        let host = PinnedBuffer::new(dev, FENCE_ELEMS as usize)?;
        Ok(Self {
            stream,
            data,
            out,
            host,
        })
    }

    /// Frees the buffers on the stream and waits (bounded) for the frees.
    fn finish(self, bound: Duration) -> Result<()> {
        let Self {
            stream,
            data,
            out,
            host,
        } = self;
        drop((data, out));
        synchronize_timeout(&stream, bound, OnTimeout::Abandon)?;
        drop(host);
        Ok(())
    }
}

/// Whether fence thread `t` has a fence of its own (every fourth thread: 3, 7, ...).
fn owns_fence(t: usize) -> bool {
    t % 4 == 3
}

fn fence_section(dev: &Device, pool: &MemPool, opts: &StressOptions) -> Result<SectionReport> {
    let mut rep = SectionReport::new("fences");
    let threads = opts.fence_threads;
    let own = (0..threads).filter(|&t| owns_fence(t)).count();
    if opts.fence_tickets == 0 {
        rep.detail = "skipped (--fence-tickets 0)".into();
        return Ok(rep);
    }
    let t0 = Instant::now();
    let shared = Fence::new(dev)?;
    let fences: Vec<Fence> = (0..threads)
        .map(|t| {
            if owns_fence(t) {
                Fence::new(dev)
            } else {
                Ok(shared.clone())
            }
        })
        .collect::<Result<_>>()?;
    let hangs = AtomicU64::new(0);
    let reports: Vec<SectionReport> = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (t, fence) in fences.iter().enumerate() {
            let tickets =
                opts.fence_tickets / threads + usize::from(t < opts.fence_tickets % threads);
            let hangs = &hangs;
            let spawned = std::thread::Builder::new()
                .name(format!("warpline-stress-fence-{t}"))
                .spawn_scoped(s, move || {
                    fence_worker(dev, pool, fence, t, tickets, opts, hangs)
                });
            handles.push(spawned);
        }
        handles
            .into_iter()
            .map(|h| {
                let mut r = SectionReport::new("fences");
                match h {
                    Ok(h) => match h.join() {
                        Ok(r) => return r,
                        Err(_) => r.error(&Error::BadShape {
                            what: "stress fences",
                            detail: "a fence thread panicked".into(),
                        }),
                    },
                    Err(e) => r.error(&Error::BadShape {
                        what: "stress fences",
                        detail: format!("could not start a fence thread: {e}"),
                    }),
                }
                r
            })
            .collect()
    });
    for r in reports {
        rep.merge(r);
    }
    if rep.hangs == 0 && rep.errors == 0 {
        // Every ticket was submitted: none may be left open.
        let open: usize = std::iter::once(&shared)
            .chain(
                fences
                    .iter()
                    .enumerate()
                    .filter(|(t, _)| owns_fence(*t))
                    .map(|(_, f)| f),
            )
            .map(Fence::open_tickets)
            .sum();
        if open > 0 {
            rep.wrong_result(|| {
                format!("{open} fence tickets are still open after every ticket was submitted")
            });
        }
    }
    rep.time = t0.elapsed();
    rep.detail = format!(
        "{} tickets from {threads} threads ({} on one shared fence, {own} with fences of their own), {FENCE_ELEMS} u32 copied after each ticket's internal work",
        opts.fence_tickets,
        threads - own
    );
    Ok(rep)
}

/// One fence thread: `tickets` runs on its own stream; stops when the section has
/// [`MAX_HANGS_PER_SECTION`] hangs.
fn fence_worker(
    dev: &Device,
    pool: &MemPool,
    fence: &Fence,
    t: usize,
    tickets: usize,
    opts: &StressOptions,
    hangs: &AtomicU64,
) -> SectionReport {
    let mut rep = SectionReport::new("fences");
    let mut rng = rng_for(opts.seed, 0xFE7CE, t as u64);
    let mut rig = match FenceRig::new(dev, pool) {
        Ok(r) => r,
        Err(e) => {
            rep.error(&e);
            return rep;
        }
    };
    for k in 0..tickets {
        if k % 100 == 0 {
            progress!(opts, "fence thread {t}: ticket {k}");
        }
        if hangs.load(Ordering::Relaxed) >= MAX_HANGS_PER_SECTION {
            rep.aborted = true;
            break;
        }
        rep.runs += 1;
        match fence_run(dev, fence, &mut rig, &mut rng, opts) {
            Ok(None) => {}
            Ok(Some(msg)) => rep.wrong_result(|| format!("fence thread {t}, ticket {k}: {msg}")),
            Err(e) => {
                // The stream may still be blocked, or the internal work may still write `data`:
                // leak everything the run used rather than free it under that work.
                std::mem::forget(rig);
                let at = format!("fence thread {t}, ticket {k}: ");
                if matches!(e, Error::Timeout { .. }) {
                    hangs.fetch_add(1, Ordering::Relaxed);
                    rep.hang_at(at, &e);
                    match FenceRig::new(dev, pool) {
                        Ok(r) => {
                            rig = r;
                            continue;
                        }
                        Err(e) => rep.error(&e),
                    }
                } else {
                    rep.error_at(at, &e);
                }
                return rep;
            }
        }
    }
    match rig.finish(opts.bound) {
        Ok(()) => {}
        Err(e @ Error::Timeout { .. }) => rep.hang(&e),
        Err(e) => rep.error(&e),
    }
    rep
}

/// One ticket: poison, guard, copy, submit the internal fill (here or from a helper thread after
/// a delay), wait (bounded), read back (bounded), compare. `Ok(Some(what))` for a wrong copy.
fn fence_run(
    dev: &Device,
    fence: &Fence,
    rig: &mut FenceRig,
    rng: &mut StdRng,
    opts: &StressOptions,
) -> Result<Option<String>> {
    let n = FENCE_ELEMS;
    rig.data.fill_async(POISON)?;
    rig.out.fill_async(POISON)?;
    // The internal stream is not ordered after this stream: the poison must land first.
    synchronize_timeout(&rig.stream, opts.bound, OnTimeout::Abandon)?;
    let seed: u32 = rng.random();
    let spin_ns = rng.random_range(0..=FENCE_MAX_SPIN_NS);
    let delay = Duration::from_micros(rng.random_range(0..=FENCE_MAX_DELAY_US));
    let elsewhere = rng.random_bool(0.5);
    let (data, out) = (rig.data.device_ptr(), rig.out.device_ptr());
    let ticket = fence.guard(&rig.stream)?;
    // SAFETY: `data` and `out` are live allocations of n u32 (freed only on this stream, after
    // this copy, or leaked); the fence orders the copy after the internal fill of `data`, and
    // nothing else writes `out`. On an error the ticket is dropped, which releases the wait.
    unsafe { probe::copy_u32(dev, &rig.stream, data, out, n) }?;
    // The internal work runs in the fence's private context: launch with the device it gives.
    // SAFETY: `data` holds n u32 of pool memory (visible from both contexts); the caller's copy
    // waits for this fill through the fence, and nothing else touches `data` meanwhile.
    let internal = move |idev: &Device, s: &Stream| unsafe {
        probe::busy_fill(idev, s, data, n, seed, spin_ns)
    };
    if elsewhere {
        std::thread::scope(|s| {
            // If the helper cannot start, the closure and the ticket in it are dropped, which
            // releases the wait.
            let helper = std::thread::Builder::new()
                .name("warpline-stress-submit".into())
                .spawn_scoped(s, move || {
                    std::thread::sleep(delay);
                    ticket.submit(internal)
                })
                .map_err(|e| Error::BadShape {
                    what: "stress fences",
                    detail: format!("could not start a submitting thread: {e}"),
                })?;
            let waited = synchronize_timeout(&rig.stream, opts.bound, OnTimeout::Abandon);
            let submitted = helper.join().unwrap_or_else(|_| {
                Err(Error::BadShape {
                    what: "stress fences",
                    detail: "the submitting thread panicked".into(),
                })
            });
            submitted.and(waited)
        })?;
    } else {
        ticket.submit(internal)?;
        synchronize_timeout(&rig.stream, opts.bound, OnTimeout::Abandon)?;
    }
    // SAFETY: `host` is pinned memory of n u32, not touched until the copy is seen complete
    // below; if that wait fails the caller leaks the rig (and `host` with it).
    unsafe { rig.out.copy_to_host_async(&mut rig.host[..]) }?;
    synchronize_timeout(&rig.stream, opts.bound, OnTimeout::Abandon)?;
    Ok(first_mismatch(&rig.host, seed).map(|(i, got, want)| {
        let why = if got == POISON {
            " (poison: the copy did not see the internal work)"
        } else {
            ""
        };
        format!("element {i} is {got:#010x}, expected {want:#010x} (pattern seed {seed:#x}){why}")
    }))
}

/// The first `(index, got, expected)` where `got` differs from `pattern(seed, index)`.
fn first_mismatch(got: &[u32], seed: u32) -> Option<(usize, u32, u32)> {
    got.iter()
        .enumerate()
        .map(|(i, &g)| (i, g, pattern(seed, i as u32)))
        .find(|&(_, g, w)| g != w)
}

// --------------------------------------------------------------------------------- task graphs

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GraphKind {
    /// Kernels, signal sets/adds/waits, data checked after each wait.
    Data,
    /// The same with host callbacks, counted per run.
    HostCallbacks,
}

/// Streams, signals and buffers of the graph sections. Buffers are bound to `setup`; lane
/// kernels use them by address, ordered by the host (setup work is seen complete before a run
/// is enqueued, and the run before the read-back is enqueued).
struct GraphRig {
    setup: Stream,
    lanes: Vec<Stream>,
    signals: Vec<Signal<u64>>,
    /// `SIGNALS x GRAPH_ELEMS`: what the producers of signal `s` write before they set/add it.
    data: DeviceBuffer<u32>,
    /// `MAX_WAITS x GRAPH_ELEMS`: what the copy after wait `w` read.
    outs: DeviceBuffer<u32>,
    /// `MAX_LANES x GRAPH_ELEMS`: scratch of the other kernels, one slice per lane.
    scratch: DeviceBuffer<u32>,
    host: PinnedBuffer<u32>,
}

impl GraphRig {
    fn new(dev: &Device, pool: &MemPool) -> Result<Self> {
        let setup = dev.new_stream()?;
        let lanes = (0..MAX_LANES)
            .map(|_| dev.new_stream())
            .collect::<Result<Vec<_>>>()?;
        let signals = (0..SIGNALS)
            .map(|i| Signal::new(dev, format!("stress s{i}")))
            .collect::<Result<Vec<_>>>()?;
        let n = GRAPH_ELEMS as usize;
        Ok(Self {
            data: pool.alloc_async(&setup, SIGNALS * n)?,
            outs: pool.alloc_async(&setup, MAX_WAITS * n)?,
            scratch: pool.alloc_async(&setup, MAX_LANES * n)?,
            host: PinnedBuffer::new(dev, MAX_WAITS * n)?,
            setup,
            lanes,
            signals,
        })
    }

    /// Poisons data and outputs and waits for it (bounded).
    fn poison(&mut self, bound: Duration) -> Result<()> {
        self.data.fill_async(POISON)?;
        self.outs.fill_async(POISON)?;
        synchronize_timeout(&self.setup, bound, OnTimeout::Abandon)
    }

    /// Reads the outputs back (bounded).
    fn read_outs(&mut self, bound: Duration) -> Result<()> {
        // SAFETY: `host` is pinned and as long as `outs`; it is not touched until the copy is
        // seen complete; if that wait fails the caller leaks the rig.
        unsafe { self.outs.copy_to_host_async(&mut self.host[..]) }?;
        synchronize_timeout(&self.setup, bound, OnTimeout::Abandon)
    }

    /// Frees the buffers on `setup` and waits (bounded) for the frees.
    fn finish(self, bound: Duration) -> Result<()> {
        let Self {
            setup,
            lanes,
            signals,
            data,
            outs,
            scratch,
            host,
        } = self;
        drop((data, outs, scratch));
        synchronize_timeout(&setup, bound, OnTimeout::Abandon)?;
        drop((host, signals, lanes));
        Ok(())
    }
}

/// A random graph and what its runs must produce.
struct Generated {
    graph: TaskGraph<'static>,
    lanes: usize,
    /// The pattern seed of each signal's data, read by the kernels when they are enqueued.
    seeds: Arc<[AtomicU32; SIGNALS]>,
    /// For each wait, the signal whose data its copy must hold.
    waits: Vec<usize>,
    /// Runs of each host callback so far.
    host_calls: Arc<Vec<AtomicU64>>,
    host_tasks: usize,
    tasks: usize,
}

/// A random graph over the rig's buffers, acyclic and satisfiable by construction:
///
/// - every explicit dependency goes from an earlier task to a later one, and so does stream
///   order; signal `s` gets no producer after its first wait, so its signal edges go forward
///   too: the full graph is acyclic, and every producer of a wait is "before" it;
/// - a producer writes `data[s]` (pattern of the run's seed) and then sets `s` to its fixed
///   value `V[s]` or adds 1..=3; a wait is `>= v` with `v` at most the value every order of the
///   producers ends with (`V[s]` if `s` has a set, else the sum of its adds), or `== V[s]` when
///   `s` has only sets; so each wait fires, after at least one producer's data is written.
///
/// `addrs`: the device addresses of the rig's `data`, `outs` and `scratch`.
fn generate(rng: &mut StdRng, addrs: (u64, u64, u64), kind: GraphKind) -> Result<Generated> {
    let n = GRAPH_ELEMS;
    let words = |i: usize| 4 * (i * n as usize) as u64;
    let (data, outs, scratch) = addrs;
    let seeds: Arc<[AtomicU32; SIGNALS]> = Arc::new(std::array::from_fn(|_| AtomicU32::new(0)));
    let host_calls: Arc<Vec<AtomicU64>> =
        Arc::new((0..MAX_STEPS).map(|_| AtomicU64::new(0)).collect());
    let mut g = TaskGraph::new();
    let lanes_n = rng.random_range(1..=MAX_LANES);
    let lanes: Vec<_> = (0..lanes_n).map(|i| g.lane(format!("lane{i}"))).collect();
    let sigs: Vec<_> = (0..SIGNALS).map(|i| g.signal(format!("s{i}"))).collect();
    let set_value: [u64; SIGNALS] = std::array::from_fn(|_| rng.random_range(1..=4));
    let (mut has_set, mut add_sum, mut waited) =
        ([false; SIGNALS], [0u64; SIGNALS], [false; SIGNALS]);
    let mut waits = Vec::new();
    let mut host_tasks = 0usize;
    let mut ids = Vec::new();
    let choices: u32 = if kind == GraphKind::HostCallbacks {
        5
    } else {
        3
    };
    for step in 0..rng.random_range(2..=MAX_STEPS) {
        let li = rng.random_range(0..lanes_n);
        let lane = lanes[li];
        let s = rng.random_range(0..SIGNALS);
        let spin = rng.random_range(0..=GRAPH_MAX_SPIN_NS);
        let produced = has_set[s] || add_sum[s] > 0;
        let (first, last) = match rng.random_range(0..choices) {
            0 if !waited[s] => {
                let (dst, seeds) = (data + words(s), seeds.clone());
                let fill = g.kernel(lane, format!("t{step} fill s{s}"), move |c| {
                    let seed = seeds[s].load(Ordering::Relaxed);
                    // SAFETY: data[s] is a live slice of n u32 of the rig; other writers of it
                    // in the run write the same values (same seed), readers wait for a producer.
                    unsafe { probe::busy_fill(c.dev, c.stream, dst, n, seed, spin) }
                })?;
                let produce = if rng.random_bool(0.5) {
                    has_set[s] = true;
                    g.set(
                        lane,
                        format!("t{step} set s{s}={}", set_value[s]),
                        sigs[s],
                        set_value[s],
                    )?
                } else {
                    let a = rng.random_range(1..=3);
                    add_sum[s] += a;
                    g.add(lane, format!("t{step} add s{s}+{a}"), sigs[s], a)?
                };
                (fill, produce)
            }
            1 if produced && waits.len() < MAX_WAITS => {
                let floor = if has_set[s] { set_value[s] } else { add_sum[s] };
                let (cmp, v) = if has_set[s] && add_sum[s] == 0 && rng.random_bool(0.3) {
                    (Cmp::Eq, set_value[s])
                } else {
                    (Cmp::Geq, rng.random_range(1..=floor))
                };
                waited[s] = true;
                let w = waits.len();
                waits.push(s);
                let wait = g.wait(
                    lane,
                    format!("t{step} wait s{s} {cmp} {v}"),
                    sigs[s],
                    cmp,
                    v,
                )?;
                let (src, dst) = (data + words(s), outs + words(w));
                let copy = g.kernel(lane, format!("t{step} read s{s}"), move |c| {
                    // SAFETY: data[s] and outs[w] are live, disjoint slices of n u32; the wait
                    // orders this copy after a producer's fill; outs[w] has no other writer.
                    unsafe { probe::copy_u32(c.dev, c.stream, src, dst, n) }
                })?;
                (wait, copy)
            }
            3 | 4 if kind == GraphKind::HostCallbacks => {
                let (k, calls) = (host_tasks, host_calls.clone());
                host_tasks += 1;
                let h = g.host(lane, format!("t{step} host h{k}"), move || {
                    calls[k].fetch_add(1, Ordering::Relaxed);
                })?;
                (h, h)
            }
            _ => {
                let dst = scratch + words(li);
                let k = g.kernel(lane, format!("t{step} work"), move |c| {
                    // SAFETY: scratch[lane] is a live slice of n u32 used only by this lane's
                    // kernels, which its stream runs one after another.
                    unsafe { probe::busy_fill(c.dev, c.stream, dst, n, step as u32, spin) }
                })?;
                (k, k)
            }
        };
        if !ids.is_empty() && rng.random_bool(0.3) {
            let before = ids[rng.random_range(0..ids.len())];
            g.depend(before, first)?;
        }
        ids.push(first);
        if last != first {
            ids.push(last);
        }
    }
    Ok(Generated {
        tasks: g.len(),
        graph: g,
        lanes: lanes_n,
        seeds,
        waits,
        host_calls,
        host_tasks,
    })
}

fn graph_section(
    dev: &Device,
    pool: &MemPool,
    opts: &StressOptions,
    kind: GraphKind,
) -> Result<SectionReport> {
    let name = match kind {
        GraphKind::Data => "task graphs",
        GraphKind::HostCallbacks => "host callbacks",
    };
    let mut rep = SectionReport::new(name);
    if opts.graphs == 0 {
        rep.detail = "skipped (--graphs 0)".into();
        return Ok(rep);
    }
    let t0 = Instant::now();
    let mut rng = rng_for(
        opts.seed,
        if kind == GraphKind::Data {
            0x6BA9
        } else {
            0x4057
        },
        0,
    );
    let mut rig = GraphRig::new(dev, pool)?;
    let mut stats = GraphStats::default();
    for gi in 0..opts.graphs {
        if gi % 50 == 0 {
            progress!(opts, "{kind:?} graph {gi}");
        }
        if rep.hangs >= MAX_HANGS_PER_SECTION {
            rep.aborted = true;
            break;
        }
        match graph_case(
            dev, &mut rig, &mut rng, kind, gi, opts, &mut rep, &mut stats,
        ) {
            Ok(()) => {}
            Err(e) => {
                // Lane work may still be pending on the rig's streams and buffers: leak them.
                std::mem::forget(rig);
                let at = format!("graph {gi}: ");
                if matches!(e, Error::Timeout { .. }) {
                    rep.hang_at(at, &e);
                    match GraphRig::new(dev, pool) {
                        Ok(r) => {
                            rig = r;
                            continue;
                        }
                        Err(e) => rep.error(&e),
                    }
                } else {
                    rep.error_at(at, &e);
                }
                rep.time = t0.elapsed();
                rep.detail = stats.describe(kind);
                return Ok(rep);
            }
        }
    }
    match rig.finish(opts.bound) {
        Ok(()) => {}
        Err(e @ Error::Timeout { .. }) => rep.hang(&e),
        Err(e) => rep.error(&e),
    }
    rep.time = t0.elapsed();
    rep.detail = stats.describe(kind);
    Ok(rep)
}

#[derive(Default)]
struct GraphStats {
    graphs: u64,
    captured: u64,
    tasks: u64,
    waits_checked: u64,
    host_calls_checked: u64,
}

impl GraphStats {
    fn describe(&self, kind: GraphKind) -> String {
        let what = match kind {
            GraphKind::Data => format!("{} wait outputs checked", self.waits_checked),
            GraphKind::HostCallbacks => format!(
                "{} host callback runs checked (each exactly once per run), {} wait outputs checked",
                self.host_calls_checked, self.waits_checked
            ),
        };
        format!(
            "{} random acyclic graphs ({} tasks, 1-{MAX_LANES} lanes, {SIGNALS} signals), each enqueued twice, {} also captured and launched twice; {what}",
            self.graphs, self.tasks, self.captured
        )
    }
}

/// Generates graph `gi`, checks it, runs it (twice directly; every fourth also captured and
/// launched twice) and checks every run. A timeout or error is returned (the caller leaks the
/// rig); wrong results are counted in `rep`.
#[allow(clippy::too_many_arguments)]
fn graph_case(
    dev: &Device,
    rig: &mut GraphRig,
    rng: &mut StdRng,
    kind: GraphKind,
    gi: usize,
    opts: &StressOptions,
    rep: &mut SectionReport,
    stats: &mut GraphStats,
) -> Result<()> {
    let addrs = (
        rig.data.device_ptr(),
        rig.outs.device_ptr(),
        rig.scratch.device_ptr(),
    );
    let gen = generate(rng, addrs, kind)?;
    stats.graphs += 1;
    stats.tasks += gen.tasks as u64;
    if let Err(e) = gen.graph.check() {
        rep.wrong_result(|| {
            format!(
                "graph {gi}: TaskGraph::check rejected a graph built acyclic and satisfiable: {e}"
            )
        });
        return Ok(());
    }
    let lanes = &rig.lanes[..gen.lanes];
    let lanes = lanes.to_vec();
    let bound_signals = rig.signals.clone();
    let signals: Vec<&Signal<u64>> = bound_signals.iter().collect();
    let mut runs_of_graph = 0u64;
    let mut check_run = |rig: &mut GraphRig,
                         rep: &mut SectionReport,
                         stats: &mut GraphStats,
                         what: &str,
                         seeds: [u32; SIGNALS]|
     -> Result<()> {
        runs_of_graph += 1;
        rig.read_outs(opts.bound)?;
        let n = GRAPH_ELEMS as usize;
        for (w, &s) in gen.waits.iter().enumerate() {
            stats.waits_checked += 1;
            if let Some((i, got, want)) = first_mismatch(&rig.host[w * n..(w + 1) * n], seeds[s]) {
                rep.wrong_result(|| {
                    format!("graph {gi} {what}: the copy after wait {w} (signal s{s}) has element {i} = {got:#010x}, expected {want:#010x}")
                });
            }
        }
        for k in 0..gen.host_tasks {
            stats.host_calls_checked += 1;
            let calls = gen.host_calls[k].load(Ordering::Relaxed);
            if calls != runs_of_graph {
                rep.wrong_result(|| {
                    format!("graph {gi} {what}: host callback h{k} ran {calls} times in {runs_of_graph} runs")
                });
            }
        }
        Ok(())
    };
    let new_seeds = |rng: &mut StdRng| -> [u32; SIGNALS] {
        let s: [u32; SIGNALS] = std::array::from_fn(|_| rng.random());
        for (a, v) in gen.seeds.iter().zip(s) {
            a.store(v, Ordering::Relaxed);
        }
        s
    };
    for r in 0..2 {
        let seeds = new_seeds(rng);
        rig.poison(opts.bound)?;
        rep.runs += 1;
        let run = gen.graph.enqueue(dev, &lanes, &signals)?;
        synchronize_timeout(&run, opts.bound, OnTimeout::Release)?;
        check_run(rig, rep, stats, &format!("direct run {r}"), seeds)?;
    }
    if gi % 4 == 3 {
        stats.captured += 1;
        // Kernel closures run once, at capture: the seeds are fixed for every launch, and the
        // poison between launches shows stale data.
        let seeds = new_seeds(rng);
        // SAFETY: the closures' kernels touch only the rig's data, outs and scratch buffers,
        // which outlive `captured` (dropped, after its launches completed, at the end of this
        // block); the closures allocate nothing and do not let the capture stream leave them.
        let mut captured = unsafe { gen.graph.capture_unchecked(dev, &lanes, &signals) }?;
        for r in 0..2 {
            rig.poison(opts.bound)?;
            rep.runs += 1;
            let run = captured.launch()?;
            synchronize_timeout(&run, opts.bound, OnTimeout::Release)?;
            check_run(rig, rep, stats, &format!("captured launch {r}"), seeds)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_name_their_flag() {
        let ok = StressOptions::default();
        ok.validate().unwrap();
        for (opts, flag) in [
            (
                StressOptions {
                    fence_threads: 0,
                    ..ok.clone()
                },
                "--fence-threads 0",
            ),
            (
                StressOptions {
                    fence_threads: 65,
                    ..ok.clone()
                },
                "--fence-threads 65",
            ),
            (
                StressOptions {
                    batch_elems: 0,
                    ..ok.clone()
                },
                "--batch-elems 0",
            ),
            (
                StressOptions {
                    pipeline_streams: 33,
                    ..ok.clone()
                },
                "--pipeline-streams 33",
            ),
            (
                StressOptions {
                    bound: Duration::ZERO,
                    ..ok.clone()
                },
                "--bound-ms 0",
            ),
        ] {
            let e = opts.validate().unwrap_err().to_string();
            assert!(e.contains(flag), "{e}");
        }
        // 0 skips a section.
        StressOptions {
            fence_tickets: 0,
            batches: 0,
            graphs: 0,
            ..ok
        }
        .validate()
        .unwrap();
    }

    #[test]
    fn pipeline_calls_stay_small() {
        let o = StressOptions::default();
        assert_eq!(o.batches_per_call(), 256);
        assert_eq!(o.pipeline_host_bytes(), 3 * 4 * 256 * 65536);
        let big = StressOptions {
            batch_elems: MAX_BATCH_ELEMS,
            ..o.clone()
        };
        assert_eq!(big.batches_per_call(), 1);
        let few = StressOptions { batches: 3, ..o };
        assert_eq!(few.batches_per_call(), 3);
    }

    #[test]
    fn inputs_are_exact_floats_in_range() {
        for v in [0u32, 1, 255, 256, u32::MAX, 0x8000_0000] {
            let x = unit_f32(v);
            assert!((-1.0..1.0).contains(&x), "{v}: {x}");
            assert_eq!(x as f64, (v >> 8) as f64 / (1u64 << 23) as f64 - 1.0);
        }
    }

    #[test]
    fn json_is_one_object_with_escaped_strings() {
        assert_eq!(json_string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
        let mut pipeline = SectionReport::new("pipeline");
        pipeline.runs = 3;
        pipeline.first_problem = Some("x \"y\"".into());
        pipeline.wrong = 1;
        let r = StressReport {
            seed: 42,
            bound: Duration::from_millis(1500),
            device: "GPU \"0\"".into(),
            env: Environment {
                device_max_connections: Some("1".into()),
                module_loading: None,
            },
            pipeline,
            fences: SectionReport::new("fences"),
            graphs: SectionReport::new("task graphs"),
            host_callbacks: SectionReport::new("host callbacks"),
            pools: PoolReport::default(),
        };
        let j = r.to_json();
        assert!(j.starts_with('{') && j.ends_with('}'), "{j}");
        assert!(j.contains("\"seed\":42"), "{j}");
        assert!(j.contains("\"bound_ms\":1500"), "{j}");
        assert!(j.contains("\"CUDA_DEVICE_MAX_CONNECTIONS\":\"1\""), "{j}");
        assert!(j.contains("\"CUDA_MODULE_LOADING\":null"), "{j}");
        assert!(j.contains("\"pipeline\":{\"runs\":3"), "{j}");
        assert!(j.contains("\"first_problem\":\"x \\\"y\\\"\""), "{j}");
        assert!(j.contains("\"passed\":false}"), "{j}");
        assert!(!r.passed());
        let text = r.to_string();
        assert!(
            text.contains("--seed 42") && text.contains("FAIL"),
            "{text}"
        );
        // Balanced braces outside strings.
        let (mut depth, mut in_str, mut esc) = (0i32, false, false);
        for c in j.chars() {
            match (in_str, esc, c) {
                (true, true, _) => esc = false,
                (true, false, '\\') => esc = true,
                (true, false, '"') => in_str = false,
                (false, _, '"') => in_str = true,
                (false, _, '{') => depth += 1,
                (false, _, '}') => depth -= 1,
                _ => {}
            }
            assert!(depth >= 0);
        }
        assert_eq!(depth, 0);
    }

    #[test]
    fn generated_graphs_pass_the_checker() {
        // Without a GPU: the generator's shape rules, on a checker-only copy (addresses unused).
        for seed in 0..300u64 {
            let mut rng = rng_for(seed, 1, 2);
            for kind in [GraphKind::Data, GraphKind::HostCallbacks] {
                let g = generate_cpu(&mut rng, kind);
                if let Err(e) = g.check() {
                    panic!("seed {seed}: {e}");
                }
            }
        }
    }

    /// [`generate`] without a rig (null addresses; the graph is only checked, never run).
    fn generate_cpu(rng: &mut StdRng, kind: GraphKind) -> TaskGraph<'static> {
        generate(rng, (0, 0, 0), kind).unwrap().graph
    }
}
