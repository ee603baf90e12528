//! Regression tests for issue 9's ordering findings (6, 8, 9, 13, 16, 20). CPU tests always run;
//! GPU tests print `SKIPPED ...` without a driver. Each test names the finding it guards and
//! fails (or does not compile) on the code before the fix.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use warpline::kernels::signal as probe;
use warpline::ordering::{synchronize_timeout, CapturedGraph, Cmp, OnTimeout, Signal, TaskGraph};
use warpline::{Chain, Error, MemPool, Stream};
use warpline_gpu::contract::signal::pattern;
use warpline_suite::support::gpu_or_skip;

const BOUND: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- finding 6 (CPU)

#[test]
fn finding_06_add_below_the_wait_value_is_unmatched() {
    let mut g = TaskGraph::new();
    let (a, b) = (g.lane("a"), g.lane("b"));
    let s = g.signal("s");
    g.add(a, "add 1", s, 1).unwrap();
    g.wait(b, "wait >= 2", s, Cmp::Geq, 2).unwrap();
    match g.check() {
        Err(Error::UnmatchedWait {
            task, condition, ..
        }) => {
            assert_eq!(task, "wait >= 2");
            assert!(condition.contains(">= 2"), "{condition}");
        }
        other => panic!("expected UnmatchedWait, got {:?}", other.map(|_| ())),
    }
    g.add(a, "add 1 more", s, 1).unwrap();
    g.check().unwrap();
}

// ---------------------------------------------------------------- finding 9 (compile time)

/// Compile-time checks: this file does not build if `CapturedGraph` is `Sync` or not `Send`, or if
/// launching takes less than exclusive access.
#[test]
fn finding_09_captured_graph_is_send_but_not_sync() {
    static_assertions::assert_not_impl_any!(CapturedGraph<'static>: Sync);
    static_assertions::assert_impl_all!(CapturedGraph<'static>: Send);
    // Launching needs exclusive access.
    let _: fn(&mut CapturedGraph<'static>) -> warpline::Result<warpline::ordering::GraphRun> =
        CapturedGraph::launch;
}

// ---------------------------------------------------------------- finding 16 (CPU)

#[test]
fn finding_16_handles_of_another_graph_are_a_typed_error() {
    let mut g1 = TaskGraph::new();
    let mut g2 = TaskGraph::new();
    let l1 = g1.lane("l1");
    let s1 = g1.signal("s1");
    let l2 = g2.lane("l2");
    let s2 = g2.signal("s2");
    let t1 = g1.set(l1, "set", s1, 1).unwrap();
    let t2 = g2.set(l2, "set", s2, 1).unwrap();
    let foreign = |r: warpline::Result<_>| matches!(r, Err(Error::ForeignHandle { .. }));
    assert!(foreign(g2.wait(l1, "w", s2, Cmp::Geq, 1).map(|_| ())));
    assert!(foreign(g2.wait(l2, "w", s1, Cmp::Geq, 1).map(|_| ())));
    assert!(foreign(g2.host(l1, "h", || {}).map(|_| ())));
    assert!(foreign(g2.depend(t1, t2)));
    assert!(foreign(g2.label(t1).map(|_| ())));
    assert_eq!(g2.label(t2).unwrap(), "set");
    // Nothing was added to g2 by the failed calls.
    assert_eq!(g2.len(), 1);
    g2.check().unwrap();
}

// ---------------------------------------------------------------- GPU

/// Finding 8: `run_captured` dropped the CUDA graph right after `cuGraphLaunch`, and the host
/// node dereferenced an `Arc` kept only by the `TaskGraph`. Here the task graph and the captured
/// graph are both dropped while the launch is still running behind a slow kernel; the host
/// callback must still see its data intact and the kernel's buffer (kept alive only by the graph)
/// must still be valid.
#[test]
fn finding_08_captured_graph_keeps_what_its_nodes_use_until_the_launch_completed() {
    let Some(dev) = gpu_or_skip("finding 8") else {
        return;
    };
    let streams: Vec<Stream> = (0..2).map(|_| dev.new_stream().unwrap()).collect();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 1 << 16;
    let out = pool.alloc_async::<u32>(&streams[0], n).unwrap();
    streams[0].synchronize().unwrap();
    let sums = Arc::new(AtomicUsize::new(0));
    let run = {
        let mut g = TaskGraph::new();
        let (a, b) = (g.lane("a"), g.lane("b"));
        let s = g.signal("go");
        let scratch = Arc::new(pool.alloc_async::<u32>(&streams[1], n).unwrap());
        let (scratch_ptr, out_ptr) = (scratch.device_ptr(), out.device_ptr());
        g.keep_alive(scratch);
        g.kernel(b, "slow fill", move |c| {
            // SAFETY: scratch holds n u32 and is kept alive by the graph.
            unsafe { probe::busy_fill(c.dev, c.stream, scratch_ptr, n as u32, 0x51, 2_000_000) }
        })
        .unwrap();
        g.set(b, "go", s, 1).unwrap();
        g.wait(a, "wait go", s, Cmp::Geq, 1).unwrap();
        g.kernel(a, "copy", move |c| {
            // SAFETY: both hold n u32; scratch is kept alive by the graph.
            unsafe { probe::copy_u32(c.dev, c.stream, scratch_ptr, out_ptr, n as u32) }
        })
        .unwrap();
        let data: Vec<u64> = (0..1 << 16).collect();
        let expect: u64 = data.iter().sum();
        let sums2 = sums.clone();
        g.host(a, "sum", move || {
            if data.iter().sum::<u64>() == expect {
                sums2.fetch_add(1, Ordering::SeqCst);
            }
        })
        .unwrap();
        let sig = Signal::<u64>::new(&dev, "go").unwrap();
        // SAFETY: the kernels touch scratch (kept by the graph) and out (alive until after the
        // synchronisation below); the closures allocate nothing and keep the capture stream.
        unsafe { g.run_captured_unchecked(&dev, &streams, &[&sig]) }.unwrap()
        // g, sig and the captured graph are dropped here, the launch still running.
    };
    synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
    assert_eq!(sums.load(Ordering::SeqCst), 1, "host callback saw its data");
    let mut got = vec![0u32; n];
    out.copy_to_host(&mut got).unwrap();
    for (i, &v) in got.iter().enumerate() {
        assert_eq!(v, pattern(0x51, i as u32), "element {i}");
    }
}

/// Finding 13: a panic in a kernel closure during capture left the stream capturing, so later
/// stream-ordered work (allocations, frees) failed. After the panic both lane streams work.
#[test]
fn finding_13_panic_during_capture_ends_the_capture() {
    let Some(dev) = gpu_or_skip("finding 13") else {
        return;
    };
    let streams: Vec<Stream> = (0..2).map(|_| dev.new_stream().unwrap()).collect();
    let mut g = TaskGraph::new();
    let (a, b) = (g.lane("a"), g.lane("b"));
    g.host(b, "fine", || {}).unwrap();
    g.kernel(a, "panics", |_| panic!("closure panics during capture"))
        .unwrap();
    // SAFETY: the closure panics before enqueueing anything.
    let r = catch_unwind(AssertUnwindSafe(|| unsafe {
        g.capture_unchecked(&dev, &streams, &[])
    }));
    assert!(r.is_err(), "the closure's panic propagates");
    let pool = MemPool::device_default(&dev, 0).unwrap();
    for s in &streams {
        let mut buf = pool.alloc_async::<u32>(s, 1024).unwrap();
        buf.fill_async(7).unwrap();
        let mut got = vec![0u32; 1024];
        buf.copy_to_host(&mut got).unwrap();
        assert!(got.iter().all(|&v| v == 7));
        drop(buf); // cuMemFreeAsync: fails on a capturing stream
        synchronize_timeout(s, BOUND, OnTimeout::Abandon).unwrap();
    }
    // The stream can be captured again.
    let mut g = TaskGraph::new();
    let l = g.lane("a");
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    g.host(l, "count", move || {
        c.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    let mut captured = g.capture(&dev, &streams[..1], &[]).unwrap();
    let run = captured.launch().unwrap();
    synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

/// Finding 16: `Duration::MAX` overflowed `Instant` (a panic); it means "no deadline".
#[test]
fn finding_16_duration_max_bound_waits_without_deadline() {
    let Some(dev) = gpu_or_skip("finding 16 Duration::MAX") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let buf = pool.alloc_async::<u32>(&s, 1024).unwrap();
    // SAFETY: buf holds 1024 u32 on s.
    unsafe { probe::busy_fill(&dev, &s, buf.device_ptr(), 1024, 3, 100_000) }.unwrap();
    synchronize_timeout(&s, Duration::MAX, OnTimeout::Abandon).unwrap();
}

/// Finding 16: `push_chain_steps(.., usize::MAX, ..)` panicked in `reserve`.
#[test]
fn finding_16_push_chain_steps_usize_max_is_too_large() {
    let Some(dev) = gpu_or_skip("finding 16 chain steps") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut x = pool.alloc_async::<u32>(&s, 1024).unwrap();
    let mut chain = Chain::new(&dev, &s, false).unwrap();
    let e = chain
        .push_chain_steps(x.as_view_mut(), usize::MAX, 1)
        .unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    assert!(chain.is_empty(), "nothing was reserved or pushed");
}

/// Finding 16: a panicking host callback aborted the process (unwinding across `extern "C"`).
/// Now the panic is caught on the driver thread and reported by `synchronize_timeout`, for a
/// direct run and for a captured launch, and the streams stay usable.
#[test]
fn finding_16_host_callback_panic_is_an_error_not_an_abort() {
    let Some(dev) = gpu_or_skip("finding 16 host panic") else {
        return;
    };
    let streams: Vec<Stream> = vec![dev.new_stream().unwrap()];
    let after = Arc::new(AtomicUsize::new(0));
    let mut g = TaskGraph::new();
    let l = g.lane("a");
    g.host(l, "boom", || panic!("host callback panics"))
        .unwrap();
    let a2 = after.clone();
    g.host(l, "after", move || {
        a2.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    let run = g.enqueue(&dev, &streams, &[]).unwrap();
    match synchronize_timeout(&run, BOUND, OnTimeout::Abandon) {
        Err(Error::HostCallbackPanicked { task, message }) => {
            assert_eq!(task, "boom");
            assert!(message.contains("host callback panics"), "{message}");
        }
        other => panic!("expected HostCallbackPanicked, got {other:?}"),
    }
    assert_eq!(after.load(Ordering::SeqCst), 1, "the run went on");
    let mut captured = g.capture(&dev, &streams, &[]).unwrap();
    let run = captured.launch().unwrap();
    let r = synchronize_timeout(&run, BOUND, OnTimeout::Abandon);
    assert!(
        matches!(r, Err(Error::HostCallbackPanicked { .. })),
        "{r:?}"
    );
    assert_eq!(after.load(Ordering::SeqCst), 2);
    synchronize_timeout(&streams[0], BOUND, OnTimeout::Abandon).unwrap();
}

/// Finding 20: `Signal::new` made a private stream and synchronised it. Now creation never
/// blocks the host, even while a stream sits on a wait that nothing has satisfied yet; new
/// signals read 0; and a stream wait registered on a dropped stream does not keep anything
/// alive (covered in the library's unit tests).
#[test]
fn finding_20_signal_creation_never_blocks_behind_a_pending_wait() {
    let Some(dev) = gpu_or_skip("finding 20") else {
        return;
    };
    let blocked = dev.new_stream().unwrap();
    // Made before the wait: no stream is created while a wait is pending (Device::new_stream).
    let user = dev.new_stream().unwrap();
    let gate = Signal::<u64>::new(&dev, "gate").unwrap();
    gate.wait_until(&blocked, Cmp::Geq, 1).unwrap();
    let t0 = Instant::now();
    let sigs: Vec<Signal<u64>> = (0..64)
        .map(|i| Signal::new(&dev, format!("s{i}")).unwrap())
        .collect();
    assert!(t0.elapsed() < BOUND, "creation took {:?}", t0.elapsed());
    for (i, s) in sigs.iter().enumerate() {
        s.set(&user, i as u64 + 1).unwrap();
    }
    synchronize_timeout(&user, BOUND, OnTimeout::Abandon).unwrap();
    for (i, s) in sigs.iter().enumerate() {
        assert_eq!(s.read().unwrap(), i as u64 + 1);
    }
    let fresh = Signal::<u32>::new(&dev, "fresh").unwrap();
    assert_eq!(fresh.read().unwrap(), 0);
    gate.set(&user, 1).unwrap();
    synchronize_timeout(&blocked, BOUND, OnTimeout::Abandon).unwrap();
    drop(sigs);
    drop(gate);
    warpline::memory::reaper::flush();
}
