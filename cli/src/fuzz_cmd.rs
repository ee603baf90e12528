//! `warpline fuzz`: the seeded fuzzer of the safe API ([`warpline::fuzz`]). Flags are checked
//! before the device is opened; the exit status is 1 on any failure (unexpected or missing
//! error, wrong result, panic, hang), and the report lists each failing seed, the first one with
//! its minimised program.

use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};
use warpline::fuzz::{self, FuzzOptions};
use warpline::Error;

use super::{cli_json, say, usage, CliResult, Ctx};

#[derive(Args)]
pub struct FuzzArgs {
    /// Seeds to run: --start-seed, --start-seed + 1, ...
    #[arg(long, default_value_t = fuzz::DEFAULT_SEEDS)]
    seeds: u64,
    /// Ops per seed, over all threads.
    #[arg(long, default_value_t = fuzz::DEFAULT_OPS)]
    ops: usize,
    /// First seed (repeat a failure with `--start-seed SEED --seeds 1`).
    #[arg(long, default_value_t = 0)]
    start_seed: u64,
    /// Threads per seed, each with its own op list (1..=16).
    #[arg(long, default_value_t = fuzz::DEFAULT_THREADS)]
    threads: usize,
    /// Bound of every wait, milliseconds: a wait that takes longer is a hang.
    #[arg(long, default_value_t = fuzz::DEFAULT_BOUND.as_millis() as u64)]
    bound_ms: u64,
    /// Watchdog of one seed, seconds: a seed still running then is a hang and stops the run.
    #[arg(long, default_value_t = fuzz::DEFAULT_SEED_TIMEOUT.as_secs())]
    seed_timeout_s: u64,
    /// Do not minimise the first failure (minimising re-runs it on the GPU).
    #[arg(long)]
    no_minimize: bool,
    /// Progress lines on stderr (every 100 seeds, and each failure).
    #[arg(long)]
    progress: bool,
    /// On a hang, print `warpline fuzz: HANG pid P seed S` and pause this many seconds (for
    /// `cuda-gdb -p P`) before going on; 0: no pause.
    #[arg(long, default_value_t = 0)]
    pause_on_hang_s: u64,
}

pub fn run(ctx: &Ctx, args: FuzzArgs) -> CliResult<Value> {
    let opts = FuzzOptions {
        seeds: args.seeds,
        start_seed: args.start_seed,
        ops: args.ops,
        threads: args.threads,
        bound: Duration::from_millis(args.bound_ms),
        seed_timeout: Duration::from_secs(args.seed_timeout_s),
        minimize: !args.no_minimize,
        progress: args.progress,
        pause_on_hang: Duration::from_secs(args.pause_on_hang_s),
    };
    if let Err(e) = opts.validate() {
        return Err(usage(match e {
            Error::BadShape { detail, .. } => detail,
            e => e.to_string(),
        }));
    }
    let dev = ctx.open()?;
    let device = cli_json::device(&dev);
    let report = fuzz::run(dev, &opts)?;
    say!("{report}");
    if report.passed() {
        return Ok(json!({"device": device, "report": report.to_json()}));
    }
    if cli_json::enabled() {
        // The failure object carries the message only: the whole report goes to stderr.
        eprintln!("{}", report.to_json());
    }
    Err(Error::Verification {
        detail: report.summary(),
    }
    .into())
}
