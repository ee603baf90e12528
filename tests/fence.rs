//! `Fence` on the GPU (issue 9, findings 1-5 and 7; each test prints SKIPPED without a driver).
//!
//! The configuration matrix runs in child processes, because the driver reads
//! `CUDA_DEVICE_MAX_CONNECTIONS` and `CUDA_MODULE_LOADING` once, when it initialises:
//! connections 1, 2 and unset, each with LAZY and EAGER loading, and a run with 40 more live
//! streams than connections. Every child run is bounded by `synchronize_timeout`, and the parent
//! kills a child that outlives its deadline, so a hang is a failure, never a hung test.
//!
//! What would fail without the mechanism:
//! - without the fence, the user stream's copy runs before the (delayed, later submitted)
//!   internal fill and copies the poison;
//! - with the internal stream in the caller's context (the old design), the wait sits in front of
//!   the internal work in the only hardware queue when there is one connection:
//!   `one_context_design_hangs_with_one_connection` shows that hang (it times out and is
//!   released), which is why the fence has a private context.

use std::time::{Duration, Instant};

use rand::Rng;
use warpline::kernels::signal as probe;
use warpline::ordering::{synchronize_timeout, Cmp, Fence, OnTimeout, Signal};
use warpline::{Error, MemPool, PinnedBuffer, Stream};
use warpline_gpu::contract::signal::pattern;
use warpline_suite::support::gpu_or_skip;

const RUNS: usize = 200;
const BOUND: Duration = Duration::from_secs(10);
const POISON: u32 = 0xDEAD_BEEF;
const CHILD_ENV: &str = "WARPLINE_FENCE_CHILD";
/// Extra live streams a child creates before the runs (`WARPLINE_FENCE_EXTRA_STREAMS`).
const EXTRA_ENV: &str = "WARPLINE_FENCE_EXTRA_STREAMS";
/// Printed by the negative control once its hang was observed.
const NEGATIVE_MARKER: &str = "negative control: the one-context wait hung as expected";

fn expect_pattern(what: &str, got: &[u32], seed: u32) {
    for (i, &g) in got.iter().enumerate() {
        assert_eq!(
            g,
            pattern(seed, i as u32),
            "{what}: element {i} (seed {seed:#x})"
        );
    }
}

/// Runs the ignored test `name` of this binary in a child with `env`, killing it after 300 s.
fn run_child(name: &str, env: &[(&str, &str)]) {
    run_child_until(name, env, None)
}

/// As [`run_child`]; with `done_marker`, a child that printed that line counts as finished and
/// is killed if it has not exited 10 s later (a negative control whose stream stays blocked
/// cannot tear its context down).
fn run_child_until(name: &str, env: &[(&str, &str)], done_marker: Option<&str>) {
    let mut env = env.to_vec();
    env.push((CHILD_ENV, "1"));
    warpline_suite::support::run_child_test(name, &env, Duration::from_secs(300), done_marker);
}

fn in_child() -> bool {
    std::env::var(CHILD_ENV).as_deref() == Ok("1")
}

/// Finding 1: the fence stays live with 1, 2 or the default number of hardware queues, with lazy
/// and eager loading, and with more live streams than queues.
#[test]
fn finding_01_fence_is_live_in_every_queue_configuration() {
    if !warpline::device::driver_present() {
        warpline_suite::support::skip("finding_01 fence matrix", "no CUDA driver on this machine");
        return;
    }
    for conns in [Some("1"), Some("2"), None] {
        for loading in ["LAZY", "EAGER"] {
            let mut env = vec![("CUDA_MODULE_LOADING", loading)];
            if let Some(c) = conns {
                env.push(("CUDA_DEVICE_MAX_CONNECTIONS", c));
            }
            run_child("fence_child", &env);
        }
    }
    // More live streams than connections: 2 queues, 40 extra streams.
    run_child(
        "fence_child",
        &[
            ("CUDA_DEVICE_MAX_CONNECTIONS", "2"),
            ("CUDA_MODULE_LOADING", "LAZY"),
            (EXTRA_ENV, "40"),
        ],
    );
}

#[test]
#[ignore = "run by finding_01_fence_is_live_in_every_queue_configuration in a child process"]
fn fence_child() {
    assert!(in_child(), "run through the parent test");
    let Some(dev) = gpu_or_skip("fence child") else {
        return;
    };
    assert!(
        dev.all_kernels_loaded().unwrap(),
        "Device::open must load every kernel"
    );
    let extra: usize = std::env::var(EXTRA_ENV)
        .ok()
        .map_or(0, |v| v.parse().unwrap());
    let _extra: Vec<Stream> = (0..extra).map(|_| dev.new_stream().unwrap()).collect();
    let t_new = Instant::now();
    let fence = Fence::new(&dev).unwrap();
    let new_time = t_new.elapsed();
    let user = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 1 << 16;
    let mut data = pool.alloc_async::<u32>(&user, n).unwrap();
    let mut out = pool.alloc_async::<u32>(&user, n).unwrap();
    let mut rng = rand::rng();
    let mut worst = Duration::ZERO;
    let mut total = Duration::ZERO;
    for run in 0..RUNS {
        data.fill_async(POISON).unwrap();
        out.fill_async(POISON).unwrap();
        user.synchronize().unwrap();
        let seed: u32 = rng.random();
        let delay = Duration::from_micros(rng.random_range(0..2000));
        let t0 = Instant::now();
        let ticket = fence.guard(&user).unwrap();
        // The caller's later work: reads what the internal work writes.
        // SAFETY: both allocations hold n u32 and live to the end of the test; the fence orders
        // this copy after the internal fill (the property under test).
        unsafe { probe::copy_u32(&dev, &user, data.device_ptr(), out.device_ptr(), n as u32) }
            .unwrap();
        let data_ptr = data.device_ptr();
        std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(delay);
                ticket
                    .submit(|idev, internal| {
                        // SAFETY: `data` holds n u32 (pool memory, visible from the fence's
                        // context); the user stream's copy waits on the fence.
                        unsafe {
                            probe::busy_fill(idev, internal, data_ptr, n as u32, seed, 200_000)
                        }
                    })
                    .unwrap();
            });
        });
        synchronize_timeout(&user, BOUND, OnTimeout::Abandon)
            .unwrap_or_else(|e| panic!("run {run}: {e}"));
        let t = t0.elapsed();
        worst = worst.max(t);
        total += t;
        let mut got = vec![0u32; n];
        out.copy_to_host(&mut got).unwrap();
        expect_pattern(&format!("fence run {run}"), &got, seed);
    }
    assert_eq!(fence.open_tickets(), 0);
    println!(
        "fence child (connections {:?}, loading {:?}, extra streams {extra}): {RUNS} runs, {RUNS} completed and correct, mean {:?}, worst {worst:?}, Fence::new {new_time:?}",
        std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok(),
        std::env::var("CUDA_MODULE_LOADING").ok(),
        total / RUNS as u32,
    );
}

/// Negative control for finding 1: the old design (internal stream in the caller's context, flag
/// written after internal work submitted later) hangs with one hardware queue. Bounded: the wait
/// times out and is released.
#[test]
fn one_context_design_hangs_with_one_connection() {
    if !warpline::device::driver_present() {
        warpline_suite::support::skip(
            "one-context fence negative control",
            "no CUDA driver on this machine",
        );
        return;
    }
    run_child("one_context_child", &[("CUDA_DEVICE_MAX_CONNECTIONS", "1")]);
}

#[test]
#[ignore = "run by one_context_design_hangs_with_one_connection in a child process"]
fn one_context_child() {
    assert!(in_child(), "run through the parent test");
    let Some(dev) = gpu_or_skip("one-context child") else {
        return;
    };
    let user = dev.new_stream().unwrap();
    let internal = dev.new_stream().unwrap();
    let flag = Signal::<u64>::new(&dev, "one-context flag").unwrap();
    flag.wait_until(&user, Cmp::Geq, 1).unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let out = pool.alloc_async::<u32>(&user, 1024).unwrap();
    // SAFETY: `out` holds 1024 u32 and lives to the end of the test.
    unsafe { probe::busy_fill(&dev, &user, out.device_ptr(), 1024, 7, 1000) }.unwrap();
    std::thread::sleep(Duration::from_millis(20));
    flag.set(&internal, 1).unwrap();
    let r = synchronize_timeout(&user, Duration::from_secs(3), OnTimeout::Release);
    println!("one context, one connection: {r:?}");
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "expected the one-context design to hang with one connection, got {r:?}"
    );
    // The user stream stays blocked (the rescue writes share its only queue), so the context
    // cannot be torn down: report and leave; the parent kills this process if exit blocks.
    println!("{NEGATIVE_MARKER}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::process::exit(0);
}

/// Finding 2: a forgotten ticket holds only its own caller; later tickets release theirs.
#[test]
fn finding_02_forgotten_ticket_does_not_stall_later_tickets() {
    let Some(dev) = gpu_or_skip("finding_02") else {
        return;
    };
    let fence = Fence::new(&dev).unwrap();
    let (a, b) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let t1 = fence.guard(&a).unwrap();
    let t2 = fence.guard(&b).unwrap();
    std::mem::forget(t1);
    t2.submit(|_, _| Ok(())).unwrap();
    synchronize_timeout(&b, BOUND, OnTimeout::Abandon).unwrap();
    // The forgotten ticket's caller is still held, and can be released by the watchdog.
    let r = synchronize_timeout(&a, Duration::from_millis(200), OnTimeout::Release);
    assert!(
        matches!(r, Err(Error::Timeout { released: true, .. })),
        "{r:?}"
    );
    assert_eq!(
        fence.open_tickets(),
        1,
        "the forgotten ticket still holds its slot"
    );
}

/// Finding 3: a fence refuses to make its own internal stream wait on itself.
#[test]
fn finding_03_guard_on_the_internal_stream_is_refused() {
    let Some(dev) = gpu_or_skip("finding_03") else {
        return;
    };
    let fence = Fence::new(&dev).unwrap();
    let user = dev.new_stream().unwrap();
    let mut kept = None;
    fence
        .guard(&user)
        .unwrap()
        .submit(|_, internal| {
            kept = Some(internal.clone());
            Ok(())
        })
        .unwrap();
    let internal = kept.unwrap();
    let r = fence.guard(&internal);
    assert!(matches!(r, Err(Error::FenceWaitsOnItself)), "{r:?}");
    synchronize_timeout(&user, BOUND, OnTimeout::Abandon).unwrap();
}

/// Finding 5: freeing pinned memory on the thread that holds an open guard returns at once
/// (`cuMemFreeHost` blocks while any stream waits on a stream memory operation; the free runs on
/// warpline's reaper thread instead).
#[test]
fn finding_05_dropping_pinned_memory_under_an_open_guard_does_not_block() {
    let Some(dev) = gpu_or_skip("finding_05") else {
        return;
    };
    let fence = Fence::new(&dev).unwrap();
    let user = dev.new_stream().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let ticket = std::thread::scope(|s| {
        let h = s.spawn(|| {
            let ticket = fence.guard(&user).unwrap();
            let pinned = PinnedBuffer::<f32>::new(&dev, 1 << 20).unwrap();
            drop(pinned);
            tx.send(()).unwrap();
            ticket
        });
        let done = rx.recv_timeout(Duration::from_secs(10));
        // Release the guard whatever happened, so the thread can finish either way.
        let ticket = h.join().unwrap();
        assert!(
            done.is_ok(),
            "dropping a PinnedBuffer blocked under an open guard"
        );
        ticket
    });
    drop(ticket);
    synchronize_timeout(&user, BOUND, OnTimeout::Abandon).unwrap();
    warpline::memory::reaper::flush();
}

/// Finding 7: releasing one stuck fence waiter through the watchdog does not release the others
/// before their internal work.
#[test]
fn finding_07_timeout_release_frees_only_its_own_waiter() {
    let Some(dev) = gpu_or_skip("finding_07") else {
        return;
    };
    let fence = Fence::new(&dev).unwrap();
    let (a, b) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let t_b = fence.guard(&b).unwrap();
    let t_a = fence.guard(&a).unwrap();
    let r = synchronize_timeout(&a, Duration::from_millis(200), OnTimeout::Release);
    assert!(
        matches!(r, Err(Error::Timeout { released: true, .. })),
        "{r:?}"
    );
    let r = synchronize_timeout(&b, Duration::from_millis(200), OnTimeout::Abandon);
    assert!(
        matches!(
            r,
            Err(Error::Timeout {
                released: false,
                ..
            })
        ),
        "releasing a's waiter must not release b's: {r:?}"
    );
    t_b.submit(|_, _| Ok(())).unwrap();
    synchronize_timeout(&b, BOUND, OnTimeout::Abandon).unwrap();
    drop(t_a);
}
