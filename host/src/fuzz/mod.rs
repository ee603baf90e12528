//! `warpline fuzz`: a seeded fuzzer of warpline's safe API (issue 19, "the systematic guard").
//!
//! Each seed is a [`Program`]: `threads` op lists generated from the seed ([`program`]), run at
//! once on one device, one OS thread each, sharing the device, its default memory pool, one
//! [`crate::Fence`] and the tensor-core GEMM. Every op is judged against a CPU model of the
//! thread's state ([`model`]): the typed error it must return (bad input never launches), the
//! exact contents of every buffer read back, the signal's value, how often host callbacks and
//! kernel closures ran. Threads own their buffers, streams and signals, so the model is exact
//! whatever the interleaving; what crosses threads (the fence, the active trace recorder, module
//! loads refused while another thread's wait is pending) is modelled as such.
//!
//! Bounds: every wait is [`crate::synchronize_timeout`] with [`FuzzOptions::bound`] and
//! `OnTimeout::Release`; calls that block inside (`copy_to_host`, `BatchPipeline::run`) are
//! preceded by a bounded wait of their stream, and each seed has a watchdog
//! ([`FuzzOptions::seed_timeout`]): a seed that does not finish in time is reported as a hang and
//! ends the run (its threads are left behind, since they may hold the device).
//!
//! A failure (unexpected or missing error, wrong result, panic, hang) stops its thread and is
//! reported with its seed; the first one is minimised by delta debugging (ops dropped while the
//! same failure persists, each try re-run on the GPU) and printed as a program listing.

pub mod exec;
pub mod model;
mod ops;
pub mod program;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering as AtomicOrdering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::device::Device;
use crate::error::{Error, Result};

pub use exec::{FailKind, Shared};
pub use model::{Caps, Expect, ThreadModel};
pub use program::{generate, Op, Program};

/// Default `--seeds`.
pub const DEFAULT_SEEDS: u64 = 100;
/// Default `--ops` (per seed, over all threads).
pub const DEFAULT_OPS: usize = 200;
/// Default `--threads`.
pub const DEFAULT_THREADS: usize = 3;
/// Default bound of every wait.
pub const DEFAULT_BOUND: Duration = Duration::from_secs(10);
/// Default watchdog of one seed.
pub const DEFAULT_SEED_TIMEOUT: Duration = Duration::from_secs(120);
/// Most `--threads`.
pub const MAX_THREADS: usize = 16;
/// Most `--ops`.
pub const MAX_OPS: usize = 100_000;
/// Most `--seeds`.
pub const MAX_SEEDS: u64 = 100_000_000;
/// GPU re-runs the minimiser may spend on one failure.
pub const MINIMIZE_RUNS: usize = 400;
/// Wall time the minimiser may spend on one failure.
pub const MINIMIZE_TIME: Duration = Duration::from_secs(180);

/// What [`run`] does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuzzOptions {
    /// Seeds to run: `start_seed .. start_seed + seeds` (1 to [`MAX_SEEDS`]).
    pub seeds: u64,
    /// First seed.
    pub start_seed: u64,
    /// Ops per seed, over all threads (1 to [`MAX_OPS`]).
    pub ops: usize,
    /// Threads per seed (1 to [`MAX_THREADS`]).
    pub threads: usize,
    /// Bound of every wait (1 ms to 1 hour).
    pub bound: Duration,
    /// Watchdog of one seed (at least `bound`).
    pub seed_timeout: Duration,
    /// Minimise the first failure (re-runs on the GPU).
    pub minimize: bool,
    /// Progress lines on stderr (every 100 seeds, and each failure).
    pub progress: bool,
    /// When a seed's watchdog fires, print `warpline fuzz: HANG pid P seed S` on stderr and
    /// sleep this long before going on, so that a debugger can attach to the hung threads
    /// (`cuda-gdb -p P -batch -ex "thread apply all bt"`). Zero: no pause.
    pub pause_on_hang: Duration,
}

impl Default for FuzzOptions {
    fn default() -> Self {
        Self {
            seeds: DEFAULT_SEEDS,
            start_seed: 0,
            ops: DEFAULT_OPS,
            threads: DEFAULT_THREADS,
            bound: DEFAULT_BOUND,
            seed_timeout: DEFAULT_SEED_TIMEOUT,
            minimize: true,
            progress: false,
            pause_on_hang: Duration::ZERO,
        }
    }
}

fn bad_option(detail: String) -> Error {
    Error::BadShape {
        what: "fuzz options",
        detail,
    }
}

impl FuzzOptions {
    /// Checks every field (pure CPU, before the device is opened). Errors: [`Error::BadShape`]
    /// naming the flag, the value and what is allowed.
    pub fn validate(&self) -> Result<()> {
        if !(1..=MAX_SEEDS).contains(&self.seeds) {
            return Err(bad_option(format!(
                "--seeds {}: 1 to {MAX_SEEDS} seeds are allowed",
                self.seeds
            )));
        }
        if self.start_seed.checked_add(self.seeds - 1).is_none() {
            return Err(bad_option(format!(
                "--start-seed {} with --seeds {}: the last seed must fit in 64 bits",
                self.start_seed, self.seeds
            )));
        }
        if !(1..=MAX_OPS).contains(&self.ops) {
            return Err(bad_option(format!(
                "--ops {}: 1 to {MAX_OPS} ops per seed are allowed",
                self.ops
            )));
        }
        if !(1..=MAX_THREADS).contains(&self.threads) {
            return Err(bad_option(format!(
                "--threads {}: 1 to {MAX_THREADS} threads are allowed",
                self.threads
            )));
        }
        let max = Duration::from_secs(3600);
        if self.bound < Duration::from_millis(1) || self.bound > max {
            return Err(bad_option(format!(
                "--bound-ms {}: 1 to {} milliseconds are allowed",
                self.bound.as_millis(),
                max.as_millis()
            )));
        }
        if self.seed_timeout < self.bound || self.seed_timeout > 4 * max {
            return Err(bad_option(format!(
                "seed timeout {:?}: from the bound ({:?}) to 4 hours",
                self.seed_timeout, self.bound
            )));
        }
        if self.pause_on_hang > max {
            return Err(bad_option(format!(
                "--pause-on-hang-s {}: 0 to {} seconds are allowed",
                self.pause_on_hang.as_secs(),
                max.as_secs()
            )));
        }
        Ok(())
    }
}

/// One failure: where, what, and (for the first) the minimised program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub seed: u64,
    pub thread: usize,
    /// Index of the op in its thread (its op count for the clean-up).
    pub index: usize,
    /// [`Op::kind`] of the op.
    pub op: &'static str,
    pub kind: FailKind,
    pub detail: String,
    /// The program the failure was seen in (the minimised one when [`Failure::minimized`]).
    pub program: Program,
    /// True when `program` is minimised (every op left is needed for the failure).
    pub minimized: bool,
    /// What the minimiser said (re-runs, whether the failure reproduced).
    pub minimize_note: Option<String>,
}

impl Failure {
    /// `seed S thread T op I (kind): class: detail`, the one line that names the failure (the
    /// report's `FAIL` lines and the end of its summary).
    pub fn headline(&self) -> String {
        format!(
            "seed {} thread {} op {} ({}): {}: {}",
            self.seed,
            self.thread,
            self.index,
            self.op,
            self.kind.name(),
            self.detail
        )
    }
}

/// What a seed did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeedResult {
    pub ops: u64,
    pub skipped: u64,
    pub errors: BTreeMap<String, u64>,
    /// `(thread, index, op kind, class, detail)` of each thread's failure.
    pub failures: Vec<(usize, usize, &'static str, FailKind, String)>,
    /// The watchdog fired: these threads never reported.
    pub watchdog: Option<Vec<usize>>,
    /// When the watchdog fired: `(thread, op index)` each unfinished thread was in.
    pub stuck_at: Vec<(usize, usize)>,
}

impl SeedResult {
    /// True when nothing failed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty() && self.watchdog.is_none()
    }
}

/// Runs `program` on the GPU: one thread per op list, each judged against its model; waits at
/// most `timeout` for all of them (threads still running then are left behind and reported).
pub fn run_program(sh: &Arc<Shared>, program: &Program, timeout: Duration) -> SeedResult {
    let (tx, rx) = mpsc::channel();
    let mut res = SeedResult::default();
    let mut waiting: Vec<usize> = Vec::new();
    // The op each thread is in, for the watchdog's report.
    let at: Arc<Vec<AtomicUsize>> = Arc::new(
        (0..program.threads.len())
            .map(|_| AtomicUsize::new(0))
            .collect(),
    );
    // Every thread's streams are made here, before any thread runs (see ThreadState::streams).
    let mut all_streams = Vec::with_capacity(program.threads.len());
    for t in 0..program.threads.len() {
        match exec::ThreadState::streams(sh) {
            Ok(s) => all_streams.push(Some(s)),
            Err(e) => {
                all_streams.push(None);
                res.failures.push((
                    t,
                    0,
                    "setup",
                    FailKind::UnexpectedError,
                    format!("could not create the thread's streams: {e}"),
                ));
            }
        }
    }
    for ((t, ops), streams) in program.threads.iter().enumerate().zip(all_streams) {
        let Some(streams) = streams else { continue };
        let (sh, ops, tx, at) = (sh.clone(), ops.clone(), tx.clone(), at.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("warpline-fuzz-{t}"))
            .spawn(move || {
                let rep = exec::run_thread(&sh, streams, &ops, &at[t]);
                let _ = tx.send((t, rep));
            });
        match spawned {
            Ok(_) => waiting.push(t),
            Err(e) => res.failures.push((
                t,
                0,
                "setup",
                FailKind::UnexpectedError,
                format!("could not start the thread: {e}"),
            )),
        }
    }
    drop(tx);
    let deadline = Instant::now() + timeout;
    while !waiting.is_empty() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((t, rep)) => {
                waiting.retain(|&w| w != t);
                res.ops += rep.ops;
                res.skipped += rep.skipped;
                for (k, n) in rep.errors {
                    *res.errors.entry(k).or_default() += n;
                }
                if let Some((i, op, kind, what)) = rep.failure {
                    res.failures.push((t, i, op, kind, what));
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                res.stuck_at = waiting
                    .iter()
                    .map(|&t| (t, at[t].load(AtomicOrdering::Relaxed)))
                    .collect();
                res.watchdog = Some(waiting.clone());
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // A thread ended without reporting (it panicked outside the per-op catch).
                for &t in &waiting {
                    res.failures.push((
                        t,
                        0,
                        "thread",
                        FailKind::Panic,
                        "the thread ended without a report".into(),
                    ));
                }
                break;
            }
        }
    }
    res.failures.sort_by_key(|f| (f.0, f.1));
    res
}

/// Everything a fuzz run found. `Display` prints the summary; [`FuzzReport::to_json`] one JSON
/// value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FuzzReport {
    pub device: String,
    pub caps: Caps,
    /// Why a shared feature is off (the fence, the tensor-core GEMM), if any.
    pub notes: Vec<String>,
    pub options: FuzzOptions,
    /// Seeds run (fewer than asked when a hang stopped the run).
    pub seeds_run: u64,
    pub ops: u64,
    pub skipped: u64,
    /// Expected typed errors by kind.
    pub errors: BTreeMap<String, u64>,
    /// Failures by class.
    pub failures_by_kind: BTreeMap<&'static str, u64>,
    /// Seeds with a failure.
    pub failed_seeds: Vec<u64>,
    /// The first failures (at most 20), the first one minimised.
    pub failures: Vec<Failure>,
    /// True when a hang (the watchdog) stopped the run.
    pub stopped_early: bool,
    pub time: Duration,
}

impl FuzzReport {
    /// No failure of any kind.
    pub fn passed(&self) -> bool {
        self.failed_seeds.is_empty() && !self.stopped_early
    }

    /// The report as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "device": self.device,
            "caps": {"tc_gemm": self.caps.tc_gemm, "pdl": self.caps.pdl, "signals": self.caps.signals},
            "notes": self.notes,
            "start_seed": self.options.start_seed,
            "seeds": self.options.seeds,
            "seeds_run": self.seeds_run,
            "ops_per_seed": self.options.ops,
            "threads": self.options.threads,
            "ops": self.ops,
            "skipped": self.skipped,
            "expected_errors": self.errors,
            "failures_by_kind": self.failures_by_kind,
            "failed_seeds": self.failed_seeds,
            "failures": self.failures.iter().map(|f| serde_json::json!({
                "seed": f.seed,
                "thread": f.thread,
                "index": f.index,
                "op": f.op,
                "kind": f.kind.name(),
                "detail": f.detail,
                "minimized": f.minimized,
                "minimize_note": f.minimize_note,
                "program": f.program.listing(),
            })).collect::<Vec<_>>(),
            "stopped_early": self.stopped_early,
            "time_s": self.time.as_secs_f64(),
            "passed": self.passed(),
        })
    }

    /// The one summary line; with a failure it ends with the first one (seed, thread, op,
    /// class and what happened), so that the last line of a run's log says what failed.
    pub fn summary(&self) -> String {
        let map = |m: &BTreeMap<String, u64>| {
            m.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let fails: BTreeMap<String, u64> = self
            .failures_by_kind
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect();
        format!(
            "warpline fuzz: {} seeds ({}..{}) x {} ops on {} threads: {} ops run, {} skipped, expected errors: [{}]; failures: {} ({}){}; {:.1} s",
            self.seeds_run,
            self.options.start_seed,
            self.options.start_seed + self.seeds_run.saturating_sub(1),
            self.options.ops,
            self.options.threads,
            self.ops,
            self.skipped,
            map(&self.errors),
            self.failed_seeds.len(),
            if fails.is_empty() { "none".into() } else { map(&fails) },
            if self.stopped_early { "; stopped early by a hang" } else { "" },
            self.time.as_secs_f64()
        ) + &self
            .failures
            .first()
            .map_or(String::new(), |x| format!("; first: {}", x.headline()))
    }
}

impl fmt::Display for FuzzReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for n in &self.notes {
            writeln!(f, "note: {n}")?;
        }
        for x in &self.failures {
            writeln!(f, "FAIL {}", x.headline())?;
            if x.minimized || x.minimize_note.is_some() {
                if let Some(n) = &x.minimize_note {
                    writeln!(f, "  minimiser: {n}")?;
                }
                write!(f, "{}", x.program.listing())?;
                writeln!(
                    f,
                    "  repeat: warpline fuzz --start-seed {} --seeds 1 --ops {} --threads {}",
                    x.seed, self.options.ops, self.options.threads
                )?;
            }
        }
        write!(f, "{}", self.summary())
    }
}

/// Keeps the fuzzer's intended panics off stderr while it runs (other panics print as before);
/// the previous hook is restored on drop.
struct QuietPanics {
    prev: Option<Arc<PanicHook>>,
}

/// A panic hook, as `std::panic::take_hook` returns it.
type PanicHook = dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send + 'static;

impl QuietPanics {
    fn install() -> Self {
        let prev: Arc<PanicHook> = Arc::from(std::panic::take_hook());
        let inner = prev.clone();
        std::panic::set_hook(Box::new(move |info| {
            if !info
                .payload_as_str()
                .is_some_and(|p| p.contains(exec::EXPECTED_PANIC))
            {
                inner(info);
            }
        }));
        Self { prev: Some(prev) }
    }
}

impl Drop for QuietPanics {
    fn drop(&mut self) {
        drop(std::panic::take_hook());
        if let Some(prev) = self.prev.take() {
            std::panic::set_hook(Box::new(move |info| prev(info)));
        }
    }
}

/// Runs the seeds of `opts` on `dev` (kept for the rest of the process: the threads of a seed
/// that hangs may still use it) and reports what they found. Failures are in the report, not
/// the result: check [`FuzzReport::passed`].
///
/// Errors: [`Error::BadShape`] for options out of range ([`FuzzOptions::validate`]); the setup
/// errors of [`Shared::new`].
pub fn run(dev: Device, opts: &FuzzOptions) -> Result<FuzzReport> {
    opts.validate()?;
    let dev: &'static Device = Box::leak(Box::new(dev));
    let sh = Arc::new(Shared::new(dev, opts.bound)?);
    Ok(run_shared(&sh, opts))
}

/// [`run`] on an already opened [`Shared`] (options assumed valid).
pub fn run_shared(sh: &Arc<Shared>, opts: &FuzzOptions) -> FuzzReport {
    let _quiet = QuietPanics::install();
    let t0 = Instant::now();
    let mut notes = Vec::new();
    if sh.fence.is_none() || !sh.caps.signals {
        notes.push("signals or the shared fence could not be made: signal, fence and task-graph ops are skipped".into());
    }
    if let Err((kind, msg)) = &sh.tc {
        notes.push(format!(
            "tensor-core GEMM unavailable ({kind}: {msg}): its ops expect that error"
        ));
    }
    let mut rep = FuzzReport {
        device: sh.dev.capabilities().name.clone(),
        caps: sh.caps,
        notes,
        options: opts.clone(),
        seeds_run: 0,
        ops: 0,
        skipped: 0,
        errors: BTreeMap::new(),
        failures_by_kind: BTreeMap::new(),
        failed_seeds: Vec::new(),
        failures: Vec::new(),
        stopped_early: false,
        time: Duration::ZERO,
    };
    for i in 0..opts.seeds {
        let seed = opts.start_seed + i;
        let program = generate(seed, opts.ops, opts.threads);
        let res = run_program(sh, &program, opts.seed_timeout);
        if res.watchdog.is_some() && !opts.pause_on_hang.is_zero() {
            eprintln!(
                "warpline fuzz: HANG pid {} seed {seed}; pausing {:?} for a debugger",
                std::process::id(),
                opts.pause_on_hang
            );
            std::thread::sleep(opts.pause_on_hang);
        }
        rep.seeds_run += 1;
        rep.ops += res.ops;
        rep.skipped += res.skipped;
        for (k, n) in &res.errors {
            *rep.errors.entry(k.clone()).or_default() += n;
        }
        if opts.progress && (i + 1) % 100 == 0 {
            eprintln!(
                "fuzz: {} seeds done, {} failed, {:.1} s",
                i + 1,
                rep.failed_seeds.len(),
                t0.elapsed().as_secs_f64()
            );
        }
        if res.passed() {
            continue;
        }
        rep.failed_seeds.push(seed);
        for f in &res.failures {
            *rep.failures_by_kind.entry(f.3.name()).or_default() += 1;
        }
        if let Some(threads) = &res.watchdog {
            *rep.failures_by_kind
                .entry(FailKind::Hang.name())
                .or_default() += 1;
            rep.failures.push(Failure {
                seed,
                thread: threads[0],
                index: 0,
                op: "seed",
                kind: FailKind::Hang,
                detail: format!(
                    "the seed's watchdog ({:?}) fired: threads {threads:?} never finished (a call blocked outside the bounded waits; (thread, op) each was in: {:?}); the run stops",
                    opts.seed_timeout, res.stuck_at
                ),
                program: program.clone(),
                minimized: false,
                minimize_note: Some("not minimised: the device may still be blocked".into()),
            });
            rep.stopped_early = true;
            break;
        }
        for (t, index, op, kind, detail) in res.failures {
            if opts.progress {
                eprintln!(
                    "fuzz: seed {seed} thread {t} op {index} ({op}): {}: {detail}",
                    kind.name()
                );
            }
            if rep.failures.len() >= 20 {
                break;
            }
            let first = rep.failures.is_empty();
            let mut f = Failure {
                seed,
                thread: t,
                index,
                op,
                kind,
                detail,
                program: program.clone(),
                minimized: false,
                minimize_note: None,
            };
            if first && opts.minimize {
                minimize(sh, &mut f, opts);
            }
            rep.failures.push(f);
        }
    }
    rep.time = t0.elapsed();
    rep
}

/// The program with thread `t`'s ops after `index` dropped (they never ran).
fn truncated(p: &Program, t: usize, index: usize) -> Program {
    let mut q = p.clone();
    if let Some(ops) = q.threads.get_mut(t) {
        ops.truncate(index + 1);
    }
    q
}

/// The program without the flattened ops `from..to` (ops numbered thread by thread).
fn without(p: &Program, from: usize, to: usize) -> Program {
    let mut k = 0;
    let threads = p
        .threads
        .iter()
        .map(|ops| {
            ops.iter()
                .filter(|_| {
                    let keep = k < from || k >= to;
                    k += 1;
                    keep
                })
                .cloned()
                .collect()
        })
        .collect();
    Program {
        seed: p.seed,
        threads,
    }
}

/// Delta debugging: drops chunks of ops (halving the chunk size down to single ops) while
/// `fails` says the smaller program still fails; `fails` returns `None` to stop (a budget, a
/// hang). Returns the smallest failing program found and the number of `fails` calls.
pub fn ddmin(start: &Program, mut fails: impl FnMut(&Program) -> Option<bool>) -> (Program, usize) {
    let mut cur = start.clone();
    let mut calls = 0usize;
    let mut chunk = cur.len().div_ceil(2).max(1);
    loop {
        let mut i = 0;
        while i < cur.len() {
            let cand = without(&cur, i, i + chunk);
            calls += 1;
            match (cand.is_empty(), fails(&cand)) {
                (_, None) => return (cur, calls),
                (false, Some(true)) => cur = cand,
                _ => i += chunk,
            }
        }
        if chunk == 1 {
            return (cur, calls);
        }
        chunk = chunk.div_ceil(2);
    }
}

/// Minimises `f` on the GPU with [`ddmin`]: a candidate fails the same way when a re-run has a
/// failure of the same class at an op of the same kind; bounded by [`MINIMIZE_RUNS`] re-runs and
/// [`MINIMIZE_TIME`], and stopped by a re-run that hangs.
fn minimize(sh: &Arc<Shared>, f: &mut Failure, opts: &FuzzOptions) {
    let t0 = Instant::now();
    let (kind, op) = (f.kind, f.op);
    let mut runs = 0usize;
    let mut stop: Option<&str> = None;
    let mut same = |p: &Program| -> Option<bool> {
        if runs >= MINIMIZE_RUNS || t0.elapsed() > MINIMIZE_TIME {
            stop.get_or_insert("stopped at the minimiser's budget");
            return None;
        }
        runs += 1;
        let r = run_program(sh, p, opts.seed_timeout);
        if r.watchdog.is_some() {
            stop = Some("stopped: a re-run hung");
            return None;
        }
        Some(r.failures.iter().any(|x| x.3 == kind && x.2 == op))
    };
    // The failing thread's ops after the failure never ran.
    let mut start = truncated(&f.program, f.thread, f.index);
    if same(&start) != Some(true) {
        start = f.program.clone();
        if same(&start) != Some(true) {
            f.minimize_note = Some(
                "the failure did not reproduce on a re-run (timing-dependent); the full program is listed"
                    .into(),
            );
            return;
        }
    }
    let (cur, _) = ddmin(&start, &mut same);
    let note = format!(
        "{} ops left of {} after {runs} re-runs in {:.1} s{}",
        cur.len(),
        f.program.len(),
        t0.elapsed().as_secs_f64(),
        stop.map(|s| format!("; {s}")).unwrap_or_default()
    );
    f.program = cur;
    f.minimized = true;
    f.minimize_note = Some(note);
}

#[cfg(test)]
mod tests;
