//! Regression tests for issue 19, items 4, 8, 10, 16, 17, 18 and 19 (lifetimes, the reaper's
//! gate, trace bounds, errors). CPU tests always run; GPU tests print `SKIPPED ...` without a
//! driver (and fail with `WARPLINE_REQUIRE_GPU=1`). Each names the item it guards.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use warpline::launch::LaunchConfig;
use warpline::module::{TypedKernel, View, ViewMut};
use warpline::ordering::{synchronize_timeout, Cmp, OnTimeout, Signal};
use warpline::tensor_map::TmaSwizzle;
use warpline::trace::{Recorder, Stage};
use warpline::{BatchPipeline, Device, Error, MemPool, PinnedBuffer, TensorMap, TensorMapTable};
use warpline_suite::support::{gpu_or_skip, random_f32, SAXPY_PTX};

const BOUND: Duration = Duration::from_secs(10);

type SaxpySig = (View<f32>, ViewMut<f32>, f32, u32);

/// Random `x` and `y` of `n` floats on one stream, with their host copies, for `y = 3x + y`.
struct SaxpyData {
    x: warpline::DeviceBuffer<f32>,
    y: warpline::DeviceBuffer<f32>,
    xs: Vec<f32>,
    ys: Vec<f32>,
}

impl SaxpyData {
    fn new(dev: &Device, s: &warpline::Stream) -> Self {
        let pool = MemPool::new(dev, 0).unwrap();
        let n = 1 << 16;
        let (xs, ys) = (random_f32(n), random_f32(n));
        let mut x = pool.alloc_async::<f32>(s, n).unwrap();
        let mut y = pool.alloc_async::<f32>(s, n).unwrap();
        x.copy_from_host(&xs).unwrap();
        y.copy_from_host(&ys).unwrap();
        Self { x, y, xs, ys }
    }

    /// Queues `y = 3x + y` on `s` (the buffers' stream).
    fn queue(&mut self, saxpy: &TypedKernel<SaxpySig>, s: &warpline::Stream) {
        let n = self.xs.len() as u32;
        let cfg = LaunchConfig::linear(n.div_ceil(256), 256, 0);
        // SAFETY: saxpy reads x[i] and writes y[i] for i < n only; both hold n elements on `s`.
        unsafe { saxpy.launch(s, &cfg, (self.x.as_view(), self.y.as_view_mut(), 3.0, n)) }.unwrap();
    }

    /// Checks every element of `y` against `3x + y` (after the stream drained).
    fn check(&self) {
        let mut out = vec![0f32; self.xs.len()];
        self.y.copy_to_host(&mut out).unwrap();
        for (i, o) in out.iter().enumerate() {
            assert_eq!(*o, 3.0f32.mul_add(self.xs[i], self.ys[i]), "element {i}");
        }
    }
}

/// Runs `f` on a thread of its own; `None` if it did not return within `bound`.
fn within<T: Send + 'static>(bound: Duration, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(bound).ok()
}

/// `dev.load_module` until no registered wait is pending any more (at most `BOUND`); `why` says
/// why none should be.
fn load_module_once_no_wait_pending(dev: &Device, why: &str) {
    let t0 = Instant::now();
    loop {
        match dev.load_module(SAXPY_PTX) {
            Ok(_) => break,
            Err(Error::WaitPending { .. }) if t0.elapsed() < BOUND => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("{why}, yet: {e}"),
        }
    }
}

/// A host callback that returns once `go` is set (at most `BOUND`), holding its lane meanwhile.
fn held_until(go: Arc<AtomicBool>) -> impl FnMut() + Send + 'static {
    move || {
        let t0 = Instant::now();
        while !go.load(Ordering::Acquire) && t0.elapsed() < BOUND {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

// ---------------------------------------------------------------------------------- item 4

/// Item 4: dropping the last handle of a module while a launch of it is still queued (here
/// behind a signal wait) used to unload the module under the launch. Now the drop returns at
/// once, the module stays loaded until the launch completed, and the launch computes the right
/// result.
#[test]
fn issue19_item04_module_outlives_its_queued_launches() {
    let Some(dev) = gpu_or_skip("issue19 item 4") else {
        return;
    };
    let module = dev.load_module(SAXPY_PTX).unwrap();
    let saxpy: TypedKernel<SaxpySig> = module.kernel("saxpy").unwrap();
    let s = dev.new_stream().unwrap();
    let mut data = SaxpyData::new(&dev, &s);
    let gate = Signal::<u64>::new(&dev, "item 4 gate").unwrap();
    let user = dev.new_stream().unwrap();
    gate.wait_until(&s, Cmp::Geq, 1).unwrap();
    data.queue(&saxpy, &s);
    // The launch is queued behind the wait: drop every handle of the module now.
    let dropped = within(BOUND, move || {
        drop(saxpy);
        drop(module);
    });
    gate.set(&user, 1).unwrap();
    assert!(
        dropped.is_some(),
        "dropping the module blocked behind its queued launch"
    );
    synchronize_timeout(&s, BOUND, OnTimeout::Abandon).unwrap();
    data.check();
    warpline::memory::reaper::flush();
    assert!(dev.take_deferred_errors().is_empty());
    dev.check_healthy().unwrap();
}

/// Item 4 (review): the last handles of a module dropped inside a host callback could record no
/// event there, so the unload did not wait for a launch of it still queued on another stream
/// (behind a held host callback here). Now the reaper drops the keep-alive, recording the events
/// itself, and the queued launch computes the right result.
#[test]
fn issue19_review_item04_module_dropped_in_a_host_callback_outlives_its_launches() {
    let Some(dev) = gpu_or_skip("issue19 review item 4 (callback)") else {
        return;
    };
    let module = dev.load_module(SAXPY_PTX).unwrap();
    let saxpy: TypedKernel<SaxpySig> = module.kernel("saxpy").unwrap();
    let s2 = dev.new_stream().unwrap();
    let mut data = SaxpyData::new(&dev, &s2);
    // The launch is held behind a signal wait, not a held host callback: CUDA runs host
    // callbacks one at a time, so a held one would also hold the callback that drops the module
    // (the first H100 run of this test timed out that way).
    let hold = Signal::<u64>::new(&dev, "review item 4 hold").unwrap();
    let s = dev.new_stream().unwrap();
    let user = dev.new_stream().unwrap();
    hold.wait_until(&s2, Cmp::Geq, 1).unwrap();
    data.queue(&saxpy, &s2);
    let handles = Arc::new(std::sync::Mutex::new(Some((module, saxpy))));
    let in_callback = handles.clone();
    let mut g = warpline::TaskGraph::new();
    let l = g.lane("drops");
    g.host(l, "drops the module", move || {
        drop(in_callback.lock().unwrap().take());
    })
    .unwrap();
    let run = g.enqueue(&dev, std::slice::from_ref(&s), &[]).unwrap();
    synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
    assert!(
        handles.lock().unwrap().is_none(),
        "the callback did not run"
    );
    // Time for the reaper to unload the module if nothing kept it.
    std::thread::sleep(Duration::from_millis(100));
    hold.set(&user, 1).unwrap();
    synchronize_timeout(&s2, BOUND, OnTimeout::Abandon).unwrap();
    data.check();
    warpline::memory::reaper::flush();
    assert!(dev.take_deferred_errors().is_empty());
    dev.check_healthy().unwrap();
}

/// Item 4: the same for a `Device` dropped while its streams and buffers live on and a launch
/// of its module is queued.
#[test]
fn issue19_item04_device_drop_keeps_its_module_for_queued_launches() {
    let Some(dev) = gpu_or_skip("issue19 item 4 (device)") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let n = 1 << 16;
    let (a, b) = (random_f32(n), random_f32(n));
    let mut da = pool.alloc_async::<f32>(&s, n).unwrap();
    let mut db = pool.alloc_async::<f32>(&s, n).unwrap();
    let mut dc = pool.alloc_async::<f32>(&s, n).unwrap();
    da.copy_from_host(&a).unwrap();
    db.copy_from_host(&b).unwrap();
    let gate = Signal::<u64>::new(&dev, "item 4 device gate").unwrap();
    // Made before the wait: no stream is created while a wait is pending (Device::new_stream).
    let user = dev.new_stream().unwrap();
    gate.wait_until(&s, Cmp::Geq, 1).unwrap();
    warpline::kernels::vector_add(&dev, &s, da.as_view(), db.as_view(), dc.as_view_mut()).unwrap();
    assert!(
        within(BOUND, move || drop(dev)).is_some(),
        "Device drop blocked"
    );
    gate.set(&user, 1).unwrap();
    synchronize_timeout(&s, BOUND, OnTimeout::Abandon).unwrap();
    let mut c = vec![0f32; n];
    dc.copy_to_host(&mut c).unwrap();
    for i in 0..n {
        assert_eq!(c[i], a[i] + b[i], "element {i}");
    }
}

/// Item 4 (review): a chain's direct runs and graph replays launch the device's own kernels
/// without `launch_raw`, and used not to note their stream on the module's keep: dropping the
/// chain and the `Device` while they were queued (here behind a host callback, which launches
/// nothing) unloaded the module under them. Now the module stays loaded until they completed,
/// and they compute the right result.
#[test]
fn issue19_review_item04_chain_launches_keep_the_module_after_device_drop() {
    let Some(dev) = gpu_or_skip("issue19 review item 4 (chain)") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let n = 1 << 12;
    let x0: Vec<u32> = random_f32(n).iter().map(|v| v.to_bits()).collect();
    let mut x = pool.alloc_async::<u32>(&s, n).unwrap();
    x.copy_from_host(&x0).unwrap();
    let go = Arc::new(AtomicBool::new(false));
    let hold = go.clone();
    let mut g = warpline::TaskGraph::new();
    let lane = g.lane("hold");
    g.host(lane, "held", held_until(hold)).unwrap();
    let run = g.enqueue(&dev, std::slice::from_ref(&s), &[]).unwrap();
    {
        let mut chain = warpline::Chain::new(&dev, &s, false).unwrap();
        chain.push_chain_steps(x.as_view_mut(), 3, 4).unwrap();
        chain.run().unwrap();
        let graph = chain.capture().unwrap();
        graph.launch().unwrap();
    }
    assert!(
        within(BOUND, move || drop(dev)).is_some(),
        "Device drop blocked"
    );
    // Time for the reaper to unload the module if nothing kept it.
    std::thread::sleep(Duration::from_millis(100));
    go.store(true, Ordering::Release);
    synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
    synchronize_timeout(&s, BOUND, OnTimeout::Abandon).unwrap();
    let mut out = vec![0u32; n];
    x.copy_to_host(&mut out).unwrap();
    for i in 0..n {
        assert_eq!(out[i], x0[i].wrapping_add(6), "element {i}");
    }
}

/// Item 4 (review): a captured task graph's signal adds are kernel nodes of the device's own
/// module, which the captured graph did not keep: replaying it after the `Device` was dropped
/// ran a kernel of an unloaded module. Now the captured graph keeps that module loaded.
#[test]
fn issue19_review_item04_captured_graph_keeps_the_device_module() {
    let Some(dev) = gpu_or_skip("issue19 review item 4 (captured add)") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let signal = Signal::<u64>::new(&dev, "review item 4").unwrap();
    let mut g = warpline::TaskGraph::new();
    let lane = g.lane("only");
    let sig = g.signal("s");
    g.add(lane, "add 5", sig, 5).unwrap();
    g.add(lane, "add 7", sig, 7).unwrap();
    g.wait(lane, "wait 12", sig, Cmp::Geq, 12).unwrap();
    let mut captured = g
        .capture(&dev, std::slice::from_ref(&s), &[&signal])
        .unwrap();
    drop(dev);
    std::thread::sleep(Duration::from_millis(100));
    for _ in 0..3 {
        let run = captured.launch().unwrap();
        synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
        assert_eq!(signal.read().unwrap(), 12);
    }
}

// ---------------------------------------------------------------------------------- item 8

/// Item 8: a registered wait on a stream whose last handle was dropped is still pending on the
/// GPU; the registry used to forget it with the handle, and the reaper's gate then let blocking
/// frees (and module loads) run behind it. Now `load_module` is still refused while it is
/// pending, and allowed once it fired.
#[test]
fn issue19_item08_gate_keeps_the_wait_of_a_dropped_stream_handle() {
    let Some(dev) = gpu_or_skip("issue19 item 8") else {
        return;
    };
    let gate = Signal::<u64>::new(&dev, "item 8 gate").unwrap();
    let waiter = dev.new_stream().unwrap();
    let user = dev.new_stream().unwrap();
    gate.wait_until(&waiter, Cmp::Geq, 1).unwrap();
    drop(waiter);
    let e = dev.load_module(SAXPY_PTX).unwrap_err();
    assert!(matches!(e, Error::WaitPending { .. }), "{e}");
    gate.set(&user, 1).unwrap();
    user.synchronize().unwrap();
    load_module_once_no_wait_pending(&dev, "the wait fired");
}

/// Item 8 (review): the signal waits of a replayed `CapturedGraph` are `cuStreamWaitValue` nodes,
/// on-stream waits like any other; a launch used to leave them out of the reaper's gate, so a
/// blocking free (or a module load) could run behind a pending replay. Now, while a replay with
/// a wait is held up (a host callback before it blocks until the test lets it go),
/// `load_module` is refused with `WaitPending`, and allowed once the replay completed.
#[test]
fn issue19_review_item08_captured_replay_waits_hold_the_gate() {
    let Some(dev) = gpu_or_skip("issue19 review item 8 (captured waits)") else {
        return;
    };
    let go = Arc::new(AtomicBool::new(false));
    let mut g = warpline::TaskGraph::new();
    let lane = g.lane("only");
    let sig = g.signal("s");
    let hold = go.clone();
    g.host(lane, "held", held_until(hold)).unwrap();
    g.set(lane, "set", sig, 1).unwrap();
    g.wait(lane, "wait", sig, Cmp::Geq, 1).unwrap();
    let signal = Signal::<u64>::new(&dev, "review item 8").unwrap();
    let s = dev.new_stream().unwrap();
    let mut captured = g
        .capture(&dev, std::slice::from_ref(&s), &[&signal])
        .unwrap();
    let run = captured.launch().unwrap();
    let e = dev.load_module(SAXPY_PTX).unwrap_err();
    assert!(matches!(e, Error::WaitPending { .. }), "{e}");
    go.store(true, Ordering::Release);
    synchronize_timeout(&run, BOUND, OnTimeout::Abandon).unwrap();
    load_module_once_no_wait_pending(&dev, "the replay completed");
}

// --------------------------------------------------------------------------------- item 10

/// Item 10: a `TensorMapTable` dropped while its upload is still queued (behind a 2 s kernel)
/// used to have the reaper synchronise on the copy with the wait gate closed, blocking every
/// `Signal::wait_until` and `Fence::guard` of the process for as long. Now a wait is enqueued at
/// once meanwhile.
#[test]
fn issue19_item10_deferred_table_free_does_not_hold_the_wait_gate() {
    let Some(dev) = gpu_or_skip("issue19 item 10") else {
        return;
    };
    wait_gate_stays_open_behind_a_busy_stream(&dev, "the deferred table free", |pool, s| {
        let m = pool.alloc_async::<f32>(s, 64 * 64).unwrap();
        let view = m.as_view();
        let map = TensorMap::matrix(&view, 64, 64, 64, [32, 32], TmaSwizzle::None).unwrap();
        let table = TensorMapTable::upload(pool, s, &[map]).unwrap();
        drop(table);
    });
}

/// Item 10 (review): a `Signal` dropped while its last use is still queued (behind a 2 s kernel)
/// had the reaper synchronise on that use's event with the wait gate closed, as the tensor-map
/// table did. Now the event is polled, and a wait is enqueued at once meanwhile.
#[test]
fn issue19_review_item10_signal_drop_does_not_hold_the_wait_gate() {
    let Some(dev) = gpu_or_skip("issue19 review item 10 (signal)") else {
        return;
    };
    wait_gate_stays_open_behind_a_busy_stream(&dev, "the deferred signal free", |_, s| {
        let sig = Signal::<u64>::new(&dev, "dropped behind a busy kernel").unwrap();
        sig.set(s, 1).unwrap();
        drop(sig);
    });
}

/// Queues a 2 s kernel on a new stream `s`, runs `drop_behind(pool, s)` (which queues work on
/// `s` and drops its owner, handing a deferred free to the reaper), then checks that a
/// `Signal::wait_until` on another stream is enqueued at once (under 500 ms) meanwhile.
fn wait_gate_stays_open_behind_a_busy_stream(
    dev: &Device,
    what: &str,
    drop_behind: impl FnOnce(&MemPool, &warpline::Stream),
) {
    let pool = MemPool::new(dev, 0).unwrap();
    let s = dev.new_stream().unwrap();
    let busy = pool.alloc_async::<u32>(&s, 32).unwrap();
    s.synchronize().unwrap();
    // SAFETY: `busy` holds 32 u32 on `s`, used by nothing else.
    unsafe {
        warpline::kernels::signal::busy_fill(dev, &s, busy.device_ptr(), 32, 1, 2_000_000_000)
    }
    .unwrap();
    drop_behind(&pool, &s);
    // Give the reaper time to take the job.
    std::thread::sleep(Duration::from_millis(200));
    let other = dev.new_stream().unwrap();
    let sig = Signal::<u64>::new(dev, "item 10").unwrap();
    let t0 = Instant::now();
    sig.wait_until(&other, Cmp::Geq, 0).unwrap();
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "Signal::wait_until took {took:?} behind {what}"
    );
    synchronize_timeout(&s, BOUND, OnTimeout::Abandon).unwrap();
    synchronize_timeout(&other, BOUND, OnTimeout::Abandon).unwrap();
    drop(busy);
    warpline::memory::reaper::flush();
}

// ------------------------------------------------------------------- owned pools (memcheck)

/// Issue 19, memcheck crashes (sessions 8 and 9): `cuMemPoolDestroy` of a pool of warpline's own
/// while frees of its memory were still queued crashed inside the driver under compute-sanitizer.
/// Buffers now keep their pool, and the destroy waits for events after their frees. Here the
/// pool handle goes first, its buffers (on three streams) must keep working, and then they are
/// dropped with their launches and frees still queued, fifty times over; every result is
/// checked, nothing is deferred as an error, and the context stays healthy. Run under memcheck
/// by scripts/sanitize.sh (label issue19_lifetimes).
#[test]
fn issue19_owned_pool_outlives_its_buffers_and_their_queued_frees() {
    let Some(dev) = gpu_or_skip("issue19 owned pool") else {
        return;
    };
    let module = dev.load_module(SAXPY_PTX).unwrap();
    let saxpy: TypedKernel<SaxpySig> = module.kernel("saxpy").unwrap();
    let streams: Vec<_> = (0..3).map(|_| dev.new_stream().unwrap()).collect();
    for round in 0..50 {
        let pool = MemPool::new(&dev, 0).unwrap();
        let n = 1000 + 37 * round;
        let mut sets = Vec::new();
        for s in &streams {
            let (xs, ys) = (random_f32(n), random_f32(n));
            let mut x = pool.alloc_async::<f32>(s, n).unwrap();
            let mut y = pool.alloc_async::<f32>(s, n).unwrap();
            x.copy_from_host(&xs).unwrap();
            y.copy_from_host(&ys).unwrap();
            sets.push(SaxpyData { x, y, xs, ys });
        }
        // The last pool handle goes while its buffers live.
        drop(pool);
        for (d, s) in sets.iter_mut().zip(&streams) {
            d.queue(&saxpy, s);
        }
        if round % 10 == 0 {
            for d in &sets {
                d.check();
            }
        }
        for (d, s) in sets.iter_mut().zip(&streams) {
            d.queue(&saxpy, s);
        }
        // Dropped with two launches and the frees still queued.
        drop(sets);
    }
    for s in &streams {
        synchronize_timeout(s, BOUND, OnTimeout::Abandon).unwrap();
    }
    warpline::memory::reaper::flush();
    assert!(dev.take_deferred_errors().is_empty());
    dev.check_healthy().unwrap();
}

// ------------------------------------------------------------------------------ items 16-18

/// Item 16: `calibrate_globaltimer` set the default pool's release threshold (process-wide
/// state) while it ran. A thread watching the threshold during the calibration now never sees
/// it change.
#[test]
fn issue19_item16_calibration_leaves_the_default_pool_alone() {
    let Some(dev) = gpu_or_skip("issue19 item 16") else {
        return;
    };
    let before = MemPool::default_pool_release_threshold(&dev).unwrap();
    let dev = Arc::new(dev);
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (dev, stop) = (dev.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut seen = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = MemPool::default_pool_release_threshold(&dev).unwrap();
                if t != before {
                    seen.push(t);
                }
            }
            seen
        })
    };
    let rec = Recorder::new(&dev).unwrap();
    let cal = rec.calibrate_globaltimer(&dev).unwrap();
    assert!(cal.error_us.is_finite());
    stop.store(true, Ordering::Relaxed);
    let seen = watcher.join().unwrap();
    assert!(
        seen.is_empty(),
        "the default pool's threshold changed to {seen:?}"
    );
    assert_eq!(
        MemPool::default_pool_release_threshold(&dev).unwrap(),
        before
    );
}

/// Item 17: an installed recorder kept every span and two events per traced stage until
/// `finish`. Now completed spans are resolved as new ones come (pending spans stay bounded),
/// the span limit drops and counts the rest, and `drain` empties the recorder.
#[test]
fn issue19_item17_recorder_stays_bounded() {
    let Some(dev) = gpu_or_skip("issue19 item 17") else {
        return;
    };
    let rec = Recorder::new(&dev).unwrap();
    let s = dev.new_stream().unwrap();
    let events_before = warpline::stream::live_events();
    for i in 0..3000 {
        let a = rec.mark(&s).unwrap();
        let b = rec.mark(&s).unwrap();
        rec.span(&s, Stage::Kernel, format!("span {i}"), a, b, Vec::new());
        if i % 500 == 499 {
            s.synchronize().unwrap();
        }
    }
    assert!(
        rec.pending_spans() <= 1100,
        "{} spans pending",
        rec.pending_spans()
    );
    assert!(
        warpline::stream::live_events() <= events_before + 2 * 1100,
        "{} events live",
        warpline::stream::live_events() - events_before
    );
    let t = rec.drain().unwrap();
    assert_eq!(t.spans.len(), 3000);
    assert!(t
        .spans
        .iter()
        .all(|sp| sp.dur_us >= 0.0 && sp.start_us >= 0.0));
    assert_eq!(rec.pending_spans(), 0);
    assert!(
        rec.finish().unwrap().spans.is_empty(),
        "drain emptied the recorder"
    );
    rec.set_span_limit(10);
    for _ in 0..25 {
        let a = rec.mark(&s).unwrap();
        let b = rec.mark(&s).unwrap();
        rec.span(&s, Stage::Copy, "capped", a, b, Vec::new());
    }
    let t = rec.finish().unwrap();
    assert_eq!(t.spans.len(), 10);
    assert_eq!(rec.dropped_spans(), 15);
    assert!(t.clock.contains("15 span(s) dropped"), "{}", t.clock);
}

/// Item 18: with a recorder of another context installed, `BatchPipeline::run` did all its work
/// and then returned `Err(TraceClock)`, losing the report. Now it returns the report (checked
/// against the CPU sum) and the recorder counts the untraced batches as unanchored.
#[test]
fn issue19_item18_pipeline_report_survives_a_foreign_recorder() {
    let Some(dev) = gpu_or_skip("issue19 item 18") else {
        return;
    };
    let other = Device::open_in_new_context(dev.ordinal()).unwrap();
    let rec = Recorder::new(&other).unwrap();
    let _installed = rec.install();
    let n = 1 << 16;
    let a = PinnedBuffer::from_slice(&dev, &random_f32(n)).unwrap();
    let b = PinnedBuffer::from_slice(&dev, &random_f32(n)).unwrap();
    let mut c = PinnedBuffer::<f32>::new(&dev, n).unwrap();
    let pipe = BatchPipeline::new(&dev, 2).unwrap();
    let rep = pipe
        .run_vector_add(&a, &b, &mut c, n / 8, |_, _| {})
        .unwrap();
    assert_eq!(rep.batches.len(), 8);
    for i in 0..n {
        assert_eq!(c[i], a[i] + b[i], "element {i}");
    }
    let t = rec.finish().unwrap();
    assert!(t.unanchored >= 8, "{} unanchored", t.unanchored);
    assert!(t.spans.is_empty());
}

// --------------------------------------------------------------------------------- item 19

/// Item 19: `MissingKernel` told users of their own modules to rebuild warpline's PTX, and
/// `WrongContext` spoke only of streams created by the same Device.
#[test]
fn issue19_item19_error_messages_say_what_applies() {
    let own = Error::MissingKernel {
        kernel: "saxpy".into(),
        entries: "axpy".into(),
    }
    .to_string();
    assert!(!own.contains("xtask"), "{own}");
    assert!(own.contains("load a module that defines it"), "{own}");
    let ours = Error::MissingKernel {
        kernel: warpline_gpu::contract::vector_add::KERNEL.into(),
        entries: String::new(),
    }
    .to_string();
    assert!(ours.contains("rebuild"), "{ours}");
    let wc = Error::WrongContext {
        what: "MultiTaskGraph: a signal is not on its slot's home GPU",
    }
    .to_string();
    assert!(
        wc.contains("signals") && wc.contains("communicators"),
        "{wc}"
    );
}

// --------------------------------------------------------------------------------- item 20

/// Item 20: the docs say exactly what the typed-kernel check sees. This pins it: PTX declares
/// no element types and no read/write intent, so a view of another element type, a `ViewMut`
/// for a read, a `DevicePtr` or a plain `u64` all pass for saxpy's pointer parameters; what PTX
/// does declare (count, size, float versus integer) is refused.
#[test]
fn issue19_item20_the_signature_check_sees_count_size_and_class_only() {
    use warpline::module::{check_signature, ptx_signatures, DevicePtr, KernelSignature};
    let entries = ptx_signatures(SAXPY_PTX);
    let saxpy = entries.iter().find(|e| e.name == "saxpy").unwrap();
    let ok = |p: Vec<warpline::module::RustParam>| check_signature(saxpy, &p);
    ok(<(View<f32>, ViewMut<f32>, f32, u32)>::params()).unwrap();
    // Cannot see: element types, read versus write, pointer versus integer.
    ok(<(View<u8>, ViewMut<u64>, f32, u32)>::params()).unwrap();
    ok(<(ViewMut<f32>, View<f32>, f32, u32)>::params()).unwrap();
    ok(<(u64, DevicePtr<i16>, f32, i32)>::params()).unwrap();
    // Sees: count, size, class.
    for bad in [
        <(View<f32>, ViewMut<f32>, f32)>::params(),
        <(View<f32>, ViewMut<f32>, f64, u32)>::params(),
        <(View<f32>, ViewMut<f32>, u32, u32)>::params(),
        <(View<f32>, u32, f32, u32)>::params(),
    ] {
        let e = ok(bad).unwrap_err();
        assert!(matches!(e, Error::KernelSignatureMismatch { .. }), "{e}");
    }
}

// --------------------------------------------------------------------------------- item 21

/// Item 21: the README repeated a garbled fragment of the GEMM paragraph.
#[test]
fn issue19_item21_readme_has_no_repeated_fragment() {
    let readme = include_str!("../README.md");
    assert_eq!(
        readme
            .matches("reference and prints TFLOP/s and ratios.")
            .count(),
        1
    );
    assert_eq!(
        readme
            .matches("`warpline info` prints the device's capabilities and kernels.")
            .count(),
        1
    );
}
