//! Regression tests for issue 19, items 1, 2 and 9: captured graphs own (or borrow) every
//! allocation their nodes touch, captures run on streams no other thread can reach, and warpline
//! calls made inside a host callback are refused. CPU tests always run; GPU tests print
//! `SKIPPED ...` without a driver (the GEMM-task test is in `tests/tc_gemm.rs`, it needs sm_90a).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warpline::kernels::vector_add;
use warpline::launch::LaunchConfig;
use warpline::module::{View, ViewMut};
use warpline::ordering::{synchronize_timeout, Cmp, OnTimeout, Signal, TaskGraph};
use warpline::{Chain, DeviceBuffer, Error, MemPool, Stream};
use warpline_gpu::contract::signal as sigc;
use warpline_suite::support::{gpu_or_skip, random_f32};

const BOUND: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------- item 1 (CPU)

/// The issue's scenario: a kernel closure reaches a buffer through shared state that outside code
/// later frees. The safe capture refuses such a graph (the closure could touch anything), naming
/// the task; a graph of signal and host tasks only is accepted.
#[test]
fn issue19_item01_safe_capture_refuses_kernel_closures() {
    let shared: Arc<Mutex<Option<DeviceBuffer<f32>>>> = Arc::new(Mutex::new(None));
    let mut g = TaskGraph::new();
    let (a, b) = (g.lane("a"), g.lane("b"));
    let s = g.signal("s");
    g.set(b, "set", s, 1).unwrap();
    g.wait(a, "wait", s, Cmp::Geq, 1).unwrap();
    g.host(a, "host", || {}).unwrap();
    g.capturable().unwrap();
    let reach = shared.clone();
    g.kernel(a, "reaches shared state", move |c| {
        let guard = reach.lock().unwrap();
        let Some(buf) = guard.as_ref() else {
            return Ok(());
        };
        let (x, y) = (buf.as_view(), buf.as_view());
        let _ = (c, x, y);
        Ok(())
    })
    .unwrap();
    match g.capturable() {
        Err(Error::UncheckedCapture { task }) => assert_eq!(task, "reaches shared state"),
        other => panic!("expected UncheckedCapture, got {other:?}"),
    }
    let msg = g.capturable().unwrap_err().to_string();
    assert!(msg.contains("capture_unchecked"), "{msg}");
    // The check stays pure CPU and leaves the graph intact.
    g.check().unwrap();
    assert_eq!(g.len(), 4);
}

// ---------------------------------------------------------------- item 1 (GPU)

/// Item 1 on the GPU: `capture` returns `UncheckedCapture` before anything is captured, so the
/// lane streams stay usable and nothing of the closure ran; the direct run of the same graph is
/// still allowed (each run is ordered with the buffers' stream-ordered frees).
#[test]
fn issue19_item01_capture_of_a_kernel_closure_is_refused_before_anything_runs() {
    let Some(dev) = gpu_or_skip("issue 19 item 1 refused capture") else {
        return;
    };
    let streams: Vec<Stream> = (0..2).map(|_| dev.new_stream().unwrap()).collect();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 1 << 16;
    let (ha, hb) = (random_f32(n), random_f32(n));
    let mut a = pool.alloc_async::<f32>(&streams[0], n).unwrap();
    let mut b = pool.alloc_async::<f32>(&streams[0], n).unwrap();
    a.copy_from_host(&ha).unwrap();
    b.copy_from_host(&hb).unwrap();
    let c = pool.alloc_async::<f32>(&streams[0], n).unwrap();
    let shared = Arc::new(Mutex::new(Some((a, b, c))));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut g = TaskGraph::new();
    let l = g.lane("l");
    let (reach, count) = (shared.clone(), calls.clone());
    g.kernel(l, "vector_add via shared state", move |ctx| {
        count.fetch_add(1, Ordering::SeqCst);
        let mut guard = reach.lock().unwrap();
        let (a, b, c) = guard.as_mut().expect("buffers present");
        vector_add(
            ctx.dev,
            ctx.stream,
            a.as_view(),
            b.as_view(),
            c.as_view_mut(),
        )
    })
    .unwrap();
    match g.capture(&dev, &streams[..1], &[]) {
        Err(Error::UncheckedCapture { task }) => assert_eq!(task, "vector_add via shared state"),
        Err(e) => panic!("expected UncheckedCapture, got {e}"),
        Ok(_) => panic!("a kernel closure was captured by the safe capture"),
    }
    assert!(matches!(
        g.run_captured(&dev, &streams[..1], &[]),
        Err(Error::UncheckedCapture { .. })
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 0, "no closure ran");
    // The direct run is fine and computes the sum.
    let run = g.enqueue(&dev, &streams[..1], &[]).unwrap();
    synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
    let mut got = vec![0f32; n];
    let (_, _, c) = shared.lock().unwrap().take().unwrap();
    c.copy_to_host(&mut got).unwrap();
    for i in 0..n {
        assert_eq!(got[i], ha[i] + hb[i], "element {i}");
    }
}

// ---------------------------------------------------------------- item 2 (GPU)

/// Item 2: another thread's `vector_add` on a lane stream while that lane's graph is being
/// captured used to be captured (it returned `Ok` but never ran). Captures now run on private
/// streams: the other thread's work runs at once, and its result is there after a plain
/// synchronisation; the captured graph still replays correctly.
#[test]
fn issue19_item02_other_threads_work_during_a_capture_runs_and_is_not_captured() {
    let Some(dev) = gpu_or_skip("issue 19 item 2 capture isolation") else {
        return;
    };
    let streams: Vec<Stream> = (0..2).map(|_| dev.new_stream().unwrap()).collect();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 1 << 20;
    let (ha, hb) = (random_f32(n), random_f32(n));
    let mut a = pool.alloc_async::<f32>(&streams[0], n).unwrap();
    let mut b = pool.alloc_async::<f32>(&streams[0], n).unwrap();
    a.copy_from_host(&ha).unwrap();
    b.copy_from_host(&hb).unwrap();
    let mut c = pool.alloc_async::<f32>(&streams[0], n).unwrap();
    c.fill_async(f32::NAN).unwrap();
    streams[0].synchronize().unwrap();
    let dev = Arc::new(dev);
    let other = Arc::new(Mutex::new(Some((a, b, c))));
    let user = streams[0].clone();
    let hosts = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let mut g = TaskGraph::new();
    let l = g.lane("l");
    let h = hosts.clone();
    g.host(l, "count", move || {
        h.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    let (other2, user2, dev2, seen2) = (other.clone(), user.clone(), dev.clone(), seen.clone());
    g.kernel(
        l,
        "another thread enqueues on the lane's stream",
        move |_ctx| {
            let (other, user, dev, seen) =
                (other2.clone(), user2.clone(), dev2.clone(), seen2.clone());
            // Joined inside the closure, so the other thread's launch happens during the capture.
            std::thread::spawn(move || {
                let mut guard = other.lock().unwrap();
                let (a, b, c) = guard.as_mut().unwrap();
                vector_add(&dev, &user, a.as_view(), b.as_view(), c.as_view_mut()).unwrap();
                seen.fetch_add(1, Ordering::SeqCst);
            })
            .join()
            .unwrap();
            Ok(())
        },
    )
    .unwrap();
    // SAFETY: the closure enqueues nothing on the capture stream and allocates nothing.
    let mut captured = unsafe { g.capture_unchecked(&dev, &streams[..1], &[]) }.unwrap();
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "the other thread ran during the capture"
    );
    // The other thread's work ran on the user stream, not into the graph.
    user.synchronize().unwrap();
    let mut got = vec![0f32; n];
    {
        let guard = other.lock().unwrap();
        let (_, _, c) = guard.as_ref().unwrap();
        c.copy_to_host(&mut got).unwrap();
    }
    for i in 0..n {
        assert_eq!(
            got[i],
            ha[i] + hb[i],
            "element {i}: the other thread's add was captured"
        );
    }
    for _ in 0..2 {
        let run = captured.launch().unwrap();
        synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
    }
    assert_eq!(
        hosts.load(Ordering::SeqCst),
        2,
        "the graph replays its host task"
    );
}

/// Item 2 for `Chain`: another thread keeps launching `vector_add` on the chain's stream while
/// the chain is captured again and again; every one of its results is there (none was captured),
/// and every captured graph replays the chain correctly.
#[test]
fn issue19_item02_chain_capture_does_not_take_other_threads_work() {
    let Some(dev) = gpu_or_skip("issue 19 item 2 chain capture") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 4096;
    let mut x = pool.alloc_async::<u32>(&s, n).unwrap();
    x.fill_async(0).unwrap();
    let (ha, hb) = (random_f32(n), random_f32(n));
    let mut a = pool.alloc_async::<f32>(&s, n).unwrap();
    let mut b = pool.alloc_async::<f32>(&s, n).unwrap();
    a.copy_from_host(&ha).unwrap();
    b.copy_from_host(&hb).unwrap();
    let mut c = pool.alloc_async::<f32>(&s, n).unwrap();
    s.synchronize().unwrap();
    let rounds = 50;
    std::thread::scope(|scope| {
        let (dev2, s2) = (&dev, s.clone());
        let (a, b, c) = (&a, &b, &mut c);
        let (ha, hb) = (&ha, &hb);
        let worker = scope.spawn(move || {
            let mut got = vec![0f32; n];
            for r in 0..rounds {
                c.fill_async(f32::NAN).unwrap();
                vector_add(dev2, &s2, a.as_view(), b.as_view(), c.as_view_mut()).unwrap();
                s2.synchronize().unwrap();
                c.copy_to_host(&mut got).unwrap();
                for i in 0..n {
                    assert_eq!(got[i], ha[i] + hb[i], "round {r}, element {i}");
                }
            }
        });
        let mut chain = Chain::new(&dev, &s, false).unwrap();
        chain.push_chain_steps(x.as_view_mut(), 3, 4).unwrap();
        let mut replays = 0u32;
        let t0 = Instant::now();
        while !worker.is_finished() && t0.elapsed() < BOUND {
            let graph = chain.capture().unwrap();
            graph.launch().unwrap();
            replays += 1;
        }
        worker.join().unwrap();
        drop(chain);
        s.synchronize().unwrap();
        let mut got = vec![0u32; n];
        x.copy_to_host(&mut got).unwrap();
        assert!(got.iter().all(|&v| v == 3 * replays), "{replays} replays");
    });
}

// ---------------------------------------------------------------- item 9 (GPU)

/// Item 9: a host callback that synchronises its own stream never returned (the callback holds
/// the stream). Now every warpline call inside a callback is `InHostCallback`, the run completes,
/// and the calls work again outside the callback.
#[test]
fn issue19_item09_warpline_calls_inside_a_host_callback_are_refused() {
    let Some(dev) = gpu_or_skip("issue 19 item 9") else {
        return;
    };
    let streams: Vec<Stream> = vec![dev.new_stream().unwrap()];
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let sig = Signal::<u64>::new(&dev, "s").unwrap();
    let results: Arc<Mutex<Vec<(String, String)>>> = Arc::new(Mutex::new(Vec::new()));
    let mut g = TaskGraph::new();
    let l = g.lane("l");
    let (s, out, pool2, sig2) = (
        streams[0].clone(),
        results.clone(),
        pool.clone(),
        sig.clone(),
    );
    let ev = streams[0].record().unwrap();
    let dev = Arc::new(dev);
    let dev2 = dev.clone();
    let n = 1024;
    let (a, b) = (
        pool.alloc_async::<f32>(&streams[0], n).unwrap(),
        pool.alloc_async::<f32>(&streams[0], n).unwrap(),
    );
    let mut c = pool.alloc_async::<f32>(&streams[0], n).unwrap();
    g.host(l, "calls warpline", move || {
        let mut log = out.lock().unwrap();
        let mut note = |what: &str, r: warpline::Result<()>| {
            log.push((what.to_string(), format!("{r:?}")));
        };
        note("Stream::synchronize", s.synchronize());
        note("Event::synchronize", ev.synchronize());
        note(
            "synchronize_timeout",
            synchronize_timeout(&s, Duration::from_millis(50), OnTimeout::Abandon),
        );
        note("alloc_async", pool2.alloc_async::<u32>(&s, 16).map(drop));
        note("Signal::set", sig2.set(&s, 1));
        note("Stream::record", s.record().map(drop));
        note("Signal::wait_until", sig2.wait_until(&s, Cmp::Geq, 0));
        note(
            "vector_add",
            vector_add(&dev2, &s, a.as_view(), b.as_view(), c.as_view_mut()),
        );
        let mut host = vec![0f32; n];
        note("copy_to_host", c.copy_to_host(&mut host));
    })
    .unwrap();
    for round in 0..2 {
        let t0 = Instant::now();
        let run = if round == 0 {
            g.enqueue(&dev, &streams, &[]).unwrap()
        } else {
            g.run_captured(&dev, &streams, &[]).unwrap()
        };
        synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
        assert!(t0.elapsed() < BOUND);
        let log = std::mem::take(&mut *results.lock().unwrap());
        assert_eq!(log.len(), 9, "round {round}: {log:?}");
        for (what, r) in &log {
            assert!(
                r.contains("InHostCallback"),
                "round {round}: {what} gave {r}"
            );
        }
    }
    // Outside the callback the same calls work.
    streams[0].synchronize().unwrap();
    sig.set(&streams[0], 1).unwrap();
    synchronize_timeout(&streams[0], BOUND, OnTimeout::Abandon).unwrap();
    assert_eq!(sig.read().unwrap(), 1);
}

/// Item 9 (review): dropping the last handle of a `Stream` inside a host callback used to
/// destroy the stream there (cudarc: `cuStreamDestroy` on the driver's callback thread, where
/// CUDA calls are forbidden). Now the reaper thread drops the last handle: the run completes,
/// and no driver error is left behind.
#[test]
fn issue19_review_item09_last_stream_handle_dropped_in_a_host_callback() {
    let Some(dev) = gpu_or_skip("issue 19 review item 9 (stream drop)") else {
        return;
    };
    let streams: Vec<Stream> = vec![dev.new_stream().unwrap()];
    let extra = Arc::new(Mutex::new(Some(dev.new_stream().unwrap())));
    let held = extra.clone();
    let mut g = TaskGraph::new();
    let l = g.lane("l");
    g.host(l, "drops the last stream handle", move || {
        drop(held.lock().unwrap().take());
    })
    .unwrap();
    let run = g.enqueue(&dev, &streams, &[]).unwrap();
    synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
    assert!(extra.lock().unwrap().is_none(), "the callback did not run");
    warpline::memory::reaper::flush();
    streams[0].synchronize().unwrap();
    assert!(dev.take_deferred_errors().is_empty());
    dev.check_healthy().unwrap();
}

/// Item 9 (review): a chain's captured `Graph` dropped inside a host callback used to call
/// `cuGraphExecDestroy` and `cuGraphDestroy` on the driver's callback thread. Now both are left
/// alone there (leaked): the run completes and the device stays healthy.
#[test]
fn issue19_review_item09_chain_graph_dropped_in_a_host_callback() {
    let Some(dev) = gpu_or_skip("issue 19 review item 9 (graph drop)") else {
        return;
    };
    // 'static borrows, so that the graph can move into the callback.
    let dev: &'static warpline::Device = Box::leak(Box::new(dev));
    let streams: Vec<Stream> = vec![dev.new_stream().unwrap()];
    let pool = MemPool::new(dev, 0).unwrap();
    let x: &'static mut DeviceBuffer<u32> =
        Box::leak(Box::new(pool.alloc_async::<u32>(&streams[0], 256).unwrap()));
    x.copy_from_host(&[0u32; 256]).unwrap();
    let mut chain = Chain::new(dev, &streams[0], false).unwrap();
    chain.push_chain_steps(x.as_view_mut(), 2, 1).unwrap();
    let chain: &'static Chain<'static> = Box::leak(Box::new(chain));
    let graph = chain.capture().unwrap();
    graph.launch().unwrap();
    let held = Arc::new(Mutex::new(Some(graph)));
    let in_callback = held.clone();
    let mut g = TaskGraph::new();
    let l = g.lane("l");
    g.host(l, "drops the chain graph", move || {
        drop(in_callback.lock().unwrap().take());
    })
    .unwrap();
    let run = g.enqueue(dev, &streams, &[]).unwrap();
    synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
    assert!(held.lock().unwrap().is_none(), "the callback did not run");
    streams[0].synchronize().unwrap();
    assert!(dev.take_deferred_errors().is_empty());
    dev.check_healthy().unwrap();
}

// ---------------------------------------------------------------- item 1: typed tasks (GPU)

type CopySig = (View<u32>, ViewMut<u32>, u32);
type FillSig = (ViewMut<u32>, u32, u32, u64);
const POISON: u32 = 0xDEAD_BEEF;

/// Item 1: typed kernel tasks hold their views, which borrow the buffers for the graph's
/// lifetime, so a captured graph's buffers cannot be freed while it lives (the compile-fail
/// doctest of `TaskGraph::gemm` shows the same borrow); a view of another stream than its lane's
/// is `WrongStream` before anything is captured; and the replays write what the kernels compute.
#[test]
fn issue19_item01_typed_tasks_capture_with_borrowed_buffers() {
    let Some(dev) = gpu_or_skip("issue 19 item 1 typed tasks") else {
        return;
    };
    let module = dev.load_module(warpline::PTX).unwrap();
    let fill = module.kernel::<FillSig>(sigc::BUSY_FILL_KERNEL).unwrap();
    let copy = module.kernel::<CopySig>(sigc::COPY_KERNEL).unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let streams: Vec<Stream> = (0..2).map(|_| dev.new_stream().unwrap()).collect();
    let (n, seed) = (100_003usize, rand::random::<u32>());
    let src_host: Vec<u32> = (0..n).map(|_| rand::random()).collect();
    let mut src = pool.alloc_async::<u32>(&streams[1], n).unwrap();
    src.copy_from_host(&src_host).unwrap();
    let mut filled = pool.alloc_async::<u32>(&streams[0], n).unwrap();
    let mut copied = pool.alloc_async::<u32>(&streams[1], n).unwrap();
    filled.fill_async(POISON).unwrap();
    copied.fill_async(POISON).unwrap();
    let cfg = LaunchConfig::linear(
        (n as u32).div_ceil(sigc::THREADS_PER_CTA),
        sigc::THREADS_PER_CTA,
        0,
    );
    {
        // A view bound to lane 1's stream on lane 0: refused before the capture.
        let mut g = TaskGraph::new();
        let (l0, _l1) = (g.lane("a"), g.lane("b"));
        // SAFETY: ws_busy_fill writes out[i] for i < n, inside the view.
        unsafe {
            g.typed(
                l0,
                "fill",
                &fill,
                cfg,
                (copied.as_view_mut(), n as u32, seed, 0),
            )
        }
        .unwrap();
        assert!(matches!(
            g.capture(&dev, &streams, &[]),
            Err(Error::WrongStream { .. })
        ));
        assert!(matches!(
            g.enqueue(&dev, &streams, &[]),
            Err(Error::WrongStream { .. })
        ));
    }
    let mut g = TaskGraph::new();
    let (l0, l1) = (g.lane("a"), g.lane("b"));
    // SAFETY: ws_busy_fill writes out[i] for i < n and ws_copy_u32 reads src[i], writes dst[i]
    // for i < n: inside the views.
    unsafe {
        g.typed(
            l0,
            "fill",
            &fill,
            cfg,
            (filled.as_view_mut(), n as u32, seed, 0),
        )
        .unwrap();
        g.typed(
            l1,
            "copy",
            &copy,
            cfg,
            (src.as_view(), copied.as_view_mut(), n as u32),
        )
        .unwrap();
    }
    let mut captured = g.capture(&dev, &streams, &[]).unwrap();
    drop(g);
    drop(module);
    drop((fill, copy));
    for _ in 0..2 {
        let run = captured.launch().unwrap();
        synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
    }
    drop(captured);
    let mut got = vec![0u32; n];
    filled.copy_to_host(&mut got).unwrap();
    for (i, &v) in got.iter().enumerate() {
        assert_eq!(v, sigc::pattern(seed, i as u32), "filled[{i}]");
    }
    copied.copy_to_host(&mut got).unwrap();
    assert_eq!(got, src_host, "copied");
}

// ------------------------------------------- found by `warpline fuzz` on the H100 (issue 19)

/// The fuzzer's first H100 run: after kernels of one module had been launched on more than 8
/// streams, every capture that launched a kernel of that module (a signal add) failed with
/// `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`: the module's keep-alive (item 4) pruned its events
/// with `cuEventQuery` from the capturing thread, which invalidates a THREAD_LOCAL capture.
/// Launches on 12 streams, then a captured graph with adds on two lanes, replayed twice, must
/// succeed and leave the counted value.
#[test]
fn issue19_fuzz_capture_after_launches_on_many_streams_is_not_invalidated() {
    let Some(dev) = gpu_or_skip("issue 19 capture after many streams") else {
        return;
    };
    let pool = MemPool::new(&dev, 0).unwrap();
    let many: Vec<Stream> = (0..12).map(|_| dev.new_stream().unwrap()).collect();
    for s in &many {
        let n = 1000;
        let mut a = pool.alloc_async::<f32>(s, n).unwrap();
        a.fill_async(1.0).unwrap();
        let mut c = pool.alloc_async::<f32>(s, n).unwrap();
        vector_add(&dev, s, a.as_view(), a.as_view(), c.as_view_mut()).unwrap();
    }
    let sig = Signal::<u64>::new(&dev, "fuzz regression").unwrap();
    let lanes: Vec<Stream> = (0..2).map(|_| dev.new_stream().unwrap()).collect();
    let mut g = TaskGraph::new();
    let (l0, l1) = (g.lane("a"), g.lane("b"));
    let s = g.signal("s");
    let a0 = g.add(l0, "add 2", s, 2).unwrap();
    let a1 = g.add(l1, "add 5", s, 5).unwrap();
    let w = g.wait(l1, "wait 7", s, Cmp::Geq, 7).unwrap();
    g.depend(a0, w).unwrap();
    g.depend(a1, w).unwrap();
    for round in 0..2 {
        // Each round launches on fresh streams too, so the keep lets streams go meanwhile.
        let fresh = dev.new_stream().unwrap();
        let n = 10;
        let mut a = pool.alloc_async::<f32>(&fresh, n).unwrap();
        a.fill_async(1.0).unwrap();
        let mut c = pool.alloc_async::<f32>(&fresh, n).unwrap();
        vector_add(&dev, &fresh, a.as_view(), a.as_view(), c.as_view_mut()).unwrap();
        let mut captured = g
            .capture(&dev, &lanes, &[&sig])
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        for _ in 0..2 {
            let run = captured.launch().unwrap();
            synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
            assert_eq!(sig.read().unwrap(), 7, "round {round}");
        }
        fresh.synchronize().unwrap();
    }
}

/// `warpline fuzz` under memcheck on the H200 (issue 19): a task-graph capture was invalidated
/// (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` at its next `cuEventRecord`) while the reaper thread
/// destroyed a pool or freed pinned memory. Such frees now wait until no capture is open in any
/// thread, and a capture waits for a free that is running. Here a kernel closure (run during the
/// capture) has another thread drop pinned buffers and an owned pool with its buffers, and calls
/// `reaper::flush` itself (which returns at once in a capturing thread instead of waiting for
/// frees that wait for its capture). The capture must succeed and replay correctly, and every
/// deferred free must run after it (the final `flush` returns within the bound). Run under
/// memcheck by scripts/sanitize.sh (label soundness_graphs).
#[test]
fn issue19_fuzz_frees_during_a_capture_do_not_invalidate_it() {
    let Some(dev) = gpu_or_skip("issue 19 frees during a capture") else {
        return;
    };
    let dev = Arc::new(dev);
    let streams: Vec<Stream> = (0..2).map(|_| dev.new_stream().unwrap()).collect();
    let sig = Signal::<u64>::new(&dev, "frees during a capture").unwrap();
    for round in 0..20 {
        let mut g = TaskGraph::new();
        let l = g.lane("l");
        let s = g.signal("s");
        g.add(l, "add before", s, 1).unwrap();
        let dev2 = dev.clone();
        let stream2 = streams[1].clone();
        g.kernel(
            l,
            "frees on another thread, flush on this one",
            move |_ctx| {
                let (dev, stream) = (dev2.clone(), stream2.clone());
                std::thread::spawn(move || {
                    let pinned: Vec<_> = (0..4)
                        .map(|i| warpline::PinnedBuffer::<f32>::new(&dev, 1000 + i).unwrap())
                        .collect();
                    let pool = MemPool::new(&dev, 0).unwrap();
                    let mut bufs = Vec::new();
                    for _ in 0..3 {
                        let mut b = pool.alloc_async::<f32>(&stream, 4096).unwrap();
                        b.fill_async(2.0).unwrap();
                        bufs.push(b);
                    }
                    drop(pool);
                    drop(bufs);
                    drop(pinned);
                })
                .join()
                .unwrap();
                let t0 = Instant::now();
                warpline::memory::reaper::flush();
                assert!(
                    t0.elapsed() < Duration::from_secs(1),
                    "flush inside a capture waited"
                );
                // Give the reaper time to reach the frees while the capture is still open.
                std::thread::sleep(Duration::from_millis(5));
                Ok(())
            },
        )
        .unwrap();
        g.add(l, "add after", s, 2).unwrap();
        // SAFETY: the closure enqueues nothing on the capture's streams and allocates nothing
        // that the graph touches (its allocations are on another stream and freed inside it).
        let mut captured = unsafe { g.capture_unchecked(&dev, &streams[..1], &[&sig]) }
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
        let run = captured.launch().unwrap();
        synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
        assert_eq!(sig.read().unwrap(), 3, "round {round}");
    }
    let t0 = Instant::now();
    warpline::memory::reaper::flush();
    assert!(t0.elapsed() < BOUND, "the deferred frees never ran");
    streams[1].synchronize().unwrap();
    assert!(dev.take_deferred_errors().is_empty());
    dev.check_healthy().unwrap();
}
