//! Issue 5 on the GPU (each test prints SKIPPED and returns without a driver): the three seeds'
//! programs rewritten with warpline's ordering, 200 runs each, random acyclic task graphs, and
//! `synchronize_timeout` on a wait that can never fire. Every run is bounded by
//! `synchronize_timeout`, so a regression shows up as a `Timeout` failure, not a hung test.
//!
//! What each test would do without its mechanism:
//! - fence: see tests/fence.rs.
//! - reverse-order signals: if the two on-stream waits were serialised, the wait on the signal set
//!   second would block the other and the arrival order would be wrong (or time out).
//! - message exchange: submitted in the seed's order the waits could sit in front of the
//!   notifies in a shared hardware queue; the graph submits producers first. The same-stream
//!   variant is a real cycle and is rejected (also checked in CI by tests/ordering_cycles.rs).
//! - timeout: without the watchdog `synchronize` never returns.

use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use warpline::kernels::signal as probe;
use warpline::ordering::{synchronize_timeout, Cmp, OnTimeout, Signal, TaskGraph};
use warpline::{Error, MemPool, Stream};
use warpline_gpu::contract::signal::pattern;
use warpline_suite::support::gpu_or_skip;

/// Repetitions of the seed scenarios: 200, or `WARPLINE_ORDERING_RUNS` (for slow tools such as
/// compute-sanitizer's initcheck, which scripts/sanitize.sh runs with fewer; the captured-graph
/// replays of the message exchange are `min(20, runs)`).
fn runs() -> usize {
    std::env::var("WARPLINE_ORDERING_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(200)
}
const BOUND: Duration = Duration::from_secs(10);
const POISON: u32 = 0xDEAD_BEEF;

fn expect_pattern(what: &str, got: &[u32], seed: u32) {
    for (i, &g) in got.iter().enumerate() {
        assert_eq!(
            g,
            pattern(seed, i as u32),
            "{what}: element {i} (seed {seed:#x})"
        );
    }
}

// ---------------------------------------------------------------- device-side signals

#[test]
fn device_side_set_and_wait_hand_over_data() {
    let Some(dev) = gpu_or_skip("device-side signals") else {
        return;
    };
    let (producer, consumer) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let sig = Signal::<u64>::new(&dev, "device").unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 1u32 << 16;
    let mut data = pool.alloc_async::<u32>(&producer, n as usize).unwrap();
    let mut out = pool.alloc_async::<u32>(&consumer, n as usize).unwrap();
    data.fill_async(POISON).unwrap();
    out.fill_async(POISON).unwrap();
    producer.synchronize().unwrap();
    consumer.synchronize().unwrap();
    let seed = rand::rng().random();
    // Producer first (the waiting kernel holds an SM), then the consumer.
    // SAFETY: data/out hold n u32 and the signal word lives to the end of the test, after both
    // streams are synchronised; the device-side release/acquire orders the copy after the fill.
    unsafe {
        probe::busy_fill(&dev, &producer, data.device_ptr(), n, seed, 1_000_000).unwrap();
        probe::signal_set(&dev, &producer, sig.device_ptr(), 1).unwrap();
        probe::signal_wait_kernel(&dev, &consumer, sig.device_ptr(), 1, 1).unwrap();
        probe::copy_u32(&dev, &consumer, data.device_ptr(), out.device_ptr(), n).unwrap();
    }
    synchronize_timeout(&consumer, BOUND, OnTimeout::Abandon).unwrap();
    synchronize_timeout(&producer, BOUND, OnTimeout::Abandon).unwrap();
    let mut got = vec![0u32; n as usize];
    out.copy_to_host(&mut got).unwrap();
    expect_pattern("copy after the device-side wait", &got, seed);
}

// ---------------------------------------------------------------- second seed

#[test]
fn u32_signal_orders_two_streams() {
    let Some(dev) = gpu_or_skip("u32 signal") else {
        return;
    };
    let (waiter, producer) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let sig = Signal::<u32>::new(&dev, "sig32").unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 4096u32;
    let mut data = pool.alloc_async::<u32>(&producer, n as usize).unwrap();
    let mut out = pool.alloc_async::<u32>(&waiter, n as usize).unwrap();
    data.fill_async(POISON).unwrap();
    out.fill_async(POISON).unwrap();
    producer.synchronize().unwrap();
    waiter.synchronize().unwrap();
    let seed = rand::rng().random();
    // SAFETY: data holds n u32 for the whole test.
    unsafe { probe::busy_fill(&dev, &producer, data.device_ptr(), n, seed, 1_000_000) }.unwrap();
    sig.set(&producer, 5).unwrap();
    sig.wait_until(&waiter, Cmp::Eq, 5).unwrap();
    // SAFETY: data and out hold n u32; the signal orders this copy after the fill (the property
    // under test).
    unsafe { probe::copy_u32(&dev, &waiter, data.device_ptr(), out.device_ptr(), n) }.unwrap();
    synchronize_timeout(&waiter, BOUND, OnTimeout::Abandon).unwrap();
    assert_eq!(sig.read().unwrap(), 5);
    let mut got = vec![0u32; n as usize];
    out.copy_to_host(&mut got).unwrap();
    expect_pattern("copy after the u32 wait", &got, seed);
}

#[test]
fn two_waits_released_in_reverse_order_complete_in_signal_order_200_times() {
    let Some(dev) = gpu_or_skip("reverse-order signals") else {
        return;
    };
    let (s1, s2, s3) = (
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
        dev.new_stream().unwrap(),
    );
    let sig0 = Signal::<u64>::new(&dev, "sig0").unwrap();
    let sig1 = Signal::<u64>::new(&dev, "sig1").unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 1 << 12;
    let mut order = pool.alloc_async::<u32>(&s3, 4).unwrap(); // [counter, arrival s1, arrival s2, -]
    let scratch = pool.alloc_async::<u32>(&s3, n).unwrap();
    s3.synchronize().unwrap();
    let (counter, slot1, slot2) = (
        order.device_ptr(),
        order.device_ptr() + 4,
        order.device_ptr() + 8,
    );
    let mut worst = Duration::ZERO;
    let runs = runs();
    for run in 0..runs {
        order.fill_async(0).unwrap();
        s3.synchronize().unwrap();
        let epoch = run as u64 + 1; // monotonic epochs with >=: the signals are never reset
        let t0 = Instant::now();
        // Producer first (warpline's rule), then the waits; the heavy work keeps both signals
        // unset until both waits are queued.
        // SAFETY: scratch holds n u32 and is only written by s3.
        unsafe { probe::busy_fill(&dev, &s3, scratch.device_ptr(), n as u32, 1, 2_000_000) }
            .unwrap();
        sig1.set(&s3, epoch).unwrap();
        unsafe { probe::busy_fill(&dev, &s3, scratch.device_ptr(), n as u32, 2, 2_000_000) }
            .unwrap();
        sig0.set(&s3, epoch).unwrap();
        sig0.wait_until(&s1, Cmp::Geq, epoch).unwrap();
        // SAFETY: counter and slots are live u32 words; each slot has one writer.
        unsafe { probe::record_arrival(&dev, &s1, counter, slot1) }.unwrap();
        sig1.wait_until(&s2, Cmp::Geq, epoch).unwrap();
        unsafe { probe::record_arrival(&dev, &s2, counter, slot2) }.unwrap();
        for s in [&s1, &s2, &s3] {
            synchronize_timeout(s, BOUND, OnTimeout::Abandon)
                .unwrap_or_else(|e| panic!("run {run}: {e}"));
        }
        worst = worst.max(t0.elapsed());
        let mut got = [0u32; 4];
        order.copy_to_host(&mut got).unwrap();
        assert_eq!(got[0], 2, "run {run}: both waits must complete");
        assert_eq!(
            (got[2], got[1]),
            (0, 1),
            "run {run}: s2 (sig1, set first) must go first"
        );
    }
    println!(
        "reverse-order signals: {runs} runs, {runs} completed in signal order, worst {worst:?}"
    );
}

// ---------------------------------------------------------------- third seed

struct Exchange {
    graph: TaskGraph<'static>,
    seeds: Arc<[AtomicU32; 2]>,
}

/// The seed's message exchange: per PE, stream A waits for the peer's message and consumes it,
/// stream B produces this PE's message and notifies the peer. Added in the seed's (naive) order.
fn exchange(msg: [u64; 2], recv: [u64; 2], n: u32) -> Exchange {
    let seeds = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
    let mut g = TaskGraph::new();
    let sig = [g.signal("to_pe0"), g.signal("to_pe1")];
    let lanes = [
        [g.lane("pe0.A"), g.lane("pe0.B")],
        [g.lane("pe1.A"), g.lane("pe1.B")],
    ];
    for pe in 0..2 {
        let peer = 1 - pe;
        g.wait(lanes[pe][0], format!("pe{pe} wait"), sig[pe], Cmp::Geq, 1)
            .unwrap();
        let (src, dst) = (msg[pe], recv[pe]);
        g.kernel(lanes[pe][0], format!("pe{pe} consume"), move |c| {
            // SAFETY: msg/recv hold n u32 for the test's lifetime; the wait orders the read.
            unsafe { probe::copy_u32(c.dev, c.stream, src, dst, n) }
        })
        .unwrap();
        let (out, seeds) = (msg[peer], seeds.clone());
        g.kernel(lanes[pe][1], format!("pe{pe} payload"), move |c| {
            let seed = seeds[peer].load(Ordering::Relaxed);
            // SAFETY: the peer's message buffer holds n u32; its reader waits on the signal.
            unsafe { probe::busy_fill(c.dev, c.stream, out, n, seed, 100_000) }
        })
        .unwrap();
        g.set(lanes[pe][1], format!("pe{pe} notify"), sig[peer], 1)
            .unwrap();
    }
    Exchange { graph: g, seeds }
}

/// CPU part (runs in CI): the seed's naive order is reordered producer-first, not rejected.
#[test]
fn message_exchange_is_reordered_so_each_notify_precedes_its_wait() {
    let ex = exchange([0, 0], [0, 0], 1);
    let plan = ex.graph.check().unwrap();
    let pos = |label: &str| {
        plan.order()
            .iter()
            .position(|&t| ex.graph.label(t).unwrap() == label)
            .unwrap()
    };
    assert!(pos("pe1 notify") < pos("pe0 wait"), "{:?}", plan.order());
    assert!(pos("pe0 notify") < pos("pe1 wait"), "{:?}", plan.order());
    assert!(pos("pe0 wait") < pos("pe0 consume") && pos("pe0 payload") < pos("pe0 notify"));
    let order: Vec<usize> = plan.order().iter().map(|t| t.index()).collect();
    assert_ne!(order, (0..ex.graph.len()).collect::<Vec<_>>());
}

#[test]
fn message_exchange_runs_200_times_as_a_task_graph() {
    let Some(dev) = gpu_or_skip("message exchange") else {
        return;
    };
    let n = 1 << 14;
    let setup = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut bufs: Vec<_> = (0..4)
        .map(|_| pool.alloc_async::<u32>(&setup, n).unwrap())
        .collect();
    let ptr = |i: usize, b: &Vec<warpline::DeviceBuffer<u32>>| b[i].device_ptr();
    let (msg, recv) = (
        [ptr(0, &bufs), ptr(1, &bufs)],
        [ptr(2, &bufs), ptr(3, &bufs)],
    );
    let ex = exchange(msg, recv, n as u32);
    let plan = ex.graph.check().unwrap();
    let order: Vec<usize> = plan.order().iter().map(|t| t.index()).collect();
    assert_ne!(
        order,
        (0..ex.graph.len()).collect::<Vec<_>>(),
        "the naive order must be reordered"
    );
    println!("message exchange: the seed's order is reordered (not rejected) to {order:?}");
    let streams: Vec<Stream> = (0..4).map(|_| dev.new_stream().unwrap()).collect();
    let sigs = [
        Signal::<u64>::new(&dev, "to_pe0").unwrap(),
        Signal::<u64>::new(&dev, "to_pe1").unwrap(),
    ];
    let sig_refs = [&sigs[0], &sigs[1]];
    let mut rng = rand::rng();
    let mut worst = Duration::ZERO;
    let runs = runs();
    for run in 0..runs {
        for b in bufs.iter_mut() {
            b.fill_async(POISON).unwrap();
        }
        setup.synchronize().unwrap();
        let seeds: [u32; 2] = [rng.random(), rng.random()];
        ex.seeds[0].store(seeds[0], Ordering::Relaxed);
        ex.seeds[1].store(seeds[1], Ordering::Relaxed);
        let t0 = Instant::now();
        let r = ex.graph.enqueue(&dev, &streams, &sig_refs).unwrap();
        synchronize_timeout(&r, BOUND, OnTimeout::Abandon)
            .unwrap_or_else(|e| panic!("run {run}: {e}"));
        worst = worst.max(t0.elapsed());
        let mut got = vec![0u32; n];
        for pe in 0..2 {
            bufs[2 + pe].copy_to_host(&mut got).unwrap();
            expect_pattern(&format!("run {run}: pe{pe} received"), &got, seeds[pe]);
        }
    }
    println!("message exchange (enqueue): {runs} runs, {runs} completed, worst {worst:?}");

    // The same graph as a captured CUDA graph (every edge CUDA-visible), replayed.
    let seeds = [0x1234_5678, 0x9abc_def0];
    ex.seeds[0].store(seeds[0], Ordering::Relaxed);
    ex.seeds[1].store(seeds[1], Ordering::Relaxed);
    // Launched on the capture's own lane-0 stream, ordered with every lane stream.
    // SAFETY: the closures' kernels touch only `bufs` (msg/recv), which outlive `captured`
    // (declared before it, dropped after); the closures allocate nothing and keep the stream.
    let mut captured = unsafe { ex.graph.capture_unchecked(&dev, &streams, &sig_refs) }.unwrap();
    let replays = runs.min(20); // 20, fewer only under a slow tool (WARPLINE_ORDERING_RUNS)
    for run in 0..replays {
        for b in bufs.iter_mut() {
            b.fill_async(POISON).unwrap();
        }
        setup.synchronize().unwrap();
        let r = captured.launch().unwrap();
        synchronize_timeout(&r, BOUND, OnTimeout::Abandon)
            .unwrap_or_else(|e| panic!("replay {run}: {e}"));
        let mut got = vec![0u32; n];
        for pe in 0..2 {
            bufs[2 + pe].copy_to_host(&mut got).unwrap();
            expect_pattern(&format!("replay {run}: pe{pe} received"), &got, seeds[pe]);
        }
    }
}

// ---------------------------------------------------------------- random acyclic graphs

#[test]
fn random_acyclic_task_graphs_run_to_completion() {
    let Some(dev) = gpu_or_skip("random task graphs") else {
        return;
    };
    let streams: Vec<Stream> = (0..4).map(|_| dev.new_stream().unwrap()).collect();
    let sigs: Vec<Signal<u64>> = (0..3)
        .map(|i| Signal::new(&dev, format!("s{i}")).unwrap())
        .collect();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let scratch = pool.alloc_async::<u32>(&streams[0], 4 * 256).unwrap();
    streams[0].synchronize().unwrap();
    let mut rng = rand::rng();
    for case in 0..50 {
        let lanes = rng.random_range(1..=4);
        let mut g = TaskGraph::new();
        let ls: Vec<_> = (0..lanes).map(|i| g.lane(format!("l{i}"))).collect();
        let ss: Vec<_> = (0..3).map(|i| g.signal(format!("s{i}"))).collect();
        let calls = Arc::new(AtomicUsize::new(0));
        let (mut hosts, mut set_seen, mut wait_seen, mut ids) =
            (0, [false; 3], [false; 3], Vec::new());
        for i in 0..rng.random_range(1..12) {
            let (l, s) = (rng.random_range(0..lanes), rng.random_range(0..3));
            let label = format!("t{i}");
            let id = match rng.random_range(0..5) {
                0 if !wait_seen[s] => {
                    set_seen[s] = true;
                    g.set(ls[l], label, ss[s], 1)
                }
                1 if !wait_seen[s] => {
                    set_seen[s] = true;
                    g.add(ls[l], label, ss[s], 1)
                }
                2 if set_seen[s] => {
                    wait_seen[s] = true;
                    g.wait(ls[l], label, ss[s], Cmp::Geq, 1)
                }
                3 => {
                    hosts += 1;
                    let c = calls.clone();
                    g.host(ls[l], label, move || {
                        c.fetch_add(1, Ordering::Relaxed);
                    })
                }
                _ => {
                    let out = scratch.device_ptr() + 4 * 256 * l as u64;
                    g.kernel(ls[l], label, move |c| {
                        // SAFETY: lane l owns its 256-word slice of scratch.
                        unsafe { probe::busy_fill(c.dev, c.stream, out, 256, 7, 10_000) }
                    })
                }
            }
            .unwrap();
            if let Some(&prev) = ids.last() {
                if rng.random_bool(0.3) {
                    g.depend(prev, id).unwrap();
                }
            }
            ids.push(id);
        }
        let r = g
            .enqueue(&dev, &streams[..lanes], &sigs.iter().collect::<Vec<_>>())
            .unwrap();
        synchronize_timeout(&r, BOUND, OnTimeout::Abandon)
            .unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert_eq!(
            calls.load(Ordering::Relaxed),
            hosts,
            "case {case}: every host callback ran once"
        );
    }
}

// ---------------------------------------------------------------- watchdog

#[test]
fn timeout_on_a_wait_that_never_fires_reports_it_and_releases_it() {
    let Some(dev) = gpu_or_skip("synchronize_timeout") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let sig = Signal::<u64>::new(&dev, "never").unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 1024u32;
    let mut out = pool.alloc_async::<u32>(&s, n as usize).unwrap();
    out.fill_async(POISON).unwrap();
    s.synchronize().unwrap();
    sig.wait_until(&s, Cmp::Eq, 42).unwrap();
    let seed = rand::rng().random();
    // SAFETY: out holds n u32, bound to s.
    unsafe { probe::busy_fill(&dev, &s, out.device_ptr(), n, seed, 0) }.unwrap();

    let bound = Duration::from_millis(200);
    let t0 = Instant::now();
    let r = synchronize_timeout(&s, bound, OnTimeout::Abandon);
    let waited = t0.elapsed();
    match &r {
        Err(Error::Timeout {
            pending,
            released: false,
            ..
        }) => {
            assert!(
                pending[0].contains("`never`") && pending[0].contains("42"),
                "{pending:?}"
            )
        }
        other => panic!("expected an abandoned Timeout, got {other:?}"),
    }
    assert!(
        waited >= bound && waited < bound + Duration::from_millis(100),
        "{waited:?}"
    );

    let t0 = Instant::now();
    let r = synchronize_timeout(&s, bound, OnTimeout::Release);
    assert!(
        matches!(r, Err(Error::Timeout { released: true, .. })),
        "{r:?}"
    );
    assert!(t0.elapsed() < 3 * bound, "release took {:?}", t0.elapsed());
    assert_eq!(sig.read().unwrap(), 42);
    // The process is usable: the stream drained, and the work behind the wait ran.
    synchronize_timeout(&s, BOUND, OnTimeout::Abandon).unwrap();
    let mut got = vec![0u32; n as usize];
    out.copy_to_host(&mut got).unwrap();
    expect_pattern("work after the released wait", &got, seed);
}
