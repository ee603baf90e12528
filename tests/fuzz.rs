//! `warpline fuzz` on the GPU (issue 19, the systematic guard); prints SKIPPED without a driver.
//! The CPU parts (generation, the model, the judge, the minimiser, the graph classes against an
//! interleaving simulator) are unit tests in `host/src/fuzz/tests.rs`.

use std::time::Duration;

use warpline::fuzz::{self, FuzzOptions};
use warpline_suite::support::gpu_or_skip;

/// A smoke run: 20 seeds x 50 ops on 3 threads, every result against the CPU model; no failure
/// of any kind. A failure prints its seed and minimised program.
#[test]
fn issue19_fuzz_smoke_20_seeds_x_50_ops() {
    let Some(dev) = gpu_or_skip("issue19_fuzz_smoke_20_seeds_x_50_ops") else {
        return;
    };
    let opts = FuzzOptions {
        seeds: 20,
        start_seed: 1900,
        ops: 50,
        threads: 3,
        bound: Duration::from_secs(10),
        seed_timeout: Duration::from_secs(120),
        minimize: true,
        progress: false,
        pause_on_hang: Duration::ZERO,
    };
    let rep = fuzz::run(dev, &opts).expect("fuzz setup");
    println!("{rep}");
    assert!(rep.passed(), "{rep}");
    assert_eq!(rep.seeds_run, 20);
    // The programs really ran: most ops called the API, and bad input gave typed errors.
    assert!(rep.ops > 500, "{rep}");
    assert!(rep.errors.values().sum::<u64>() > 10, "{rep}");
}
