//! Capturing a [`TaskGraph`] into a CUDA graph, and [`CapturedGraph`], which owns everything its
//! nodes use until its last launch has completed.

use std::any::Any;
use std::cell::Cell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use super::enqueue::{distinct_others, record, HostCall, Mode};
use super::run::{GraphRun, PanicLog, RunState};
use super::{LaunchFn, Op, TaskGraph};
use crate::device::Device;
use crate::driver::graph::{self as dg, CaptureGuard, CudaGraph, GraphExec};
use crate::error::{CudaCall, Error, Result};
use crate::kernels::TcGemmPlan;
use crate::ordering::signal::Signal;
use crate::ordering::types::Release;
use crate::stream::SpareStream;
use crate::stream::Stream;

/// Everything a captured graph's nodes use. Dropped only once no launch can still run (the last
/// `Arc` is held by [`CapturedGraph`], its runs, and a host callback queued after each launch);
/// the drop itself only hands the contents to the reaper thread, so it may happen on a driver
/// callback thread (no CUDA call there).
pub(crate) struct Keep {
    inner: Option<KeepInner>,
}

struct KeepInner {
    ctx: Arc<CudaContext>,
    /// `Mutex` for `Sync` only: launches happen through `&mut CapturedGraph`.
    exec: Mutex<GraphExec>,
    graph: Mutex<CudaGraph>,
    #[allow(clippy::vec_box)] // boxed: the driver holds pointers to them
    _host_calls: Vec<Box<HostCall>>,
    _kernels: Vec<Arc<LaunchFn>>,
    signals: Vec<Signal<u64>>,
    _keep_alive: Vec<Arc<dyn Any + Send + Sync>>,
}

impl Drop for Keep {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            crate::reaper::defer(move || {
                let _ = crate::device::bind_context_unchecked(&inner.ctx);
                // Executable graph, graph, host calls, closures, signals, keep-alive objects.
                drop(inner);
            });
        }
    }
}

/// Host callback queued after each launch: drops one `Arc<Keep>` (never unwinds, no CUDA call).
unsafe extern "C" fn release_keep(data: *mut c_void) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: from Arc::into_raw in CapturedGraph::launch, consumed exactly once.
        drop(unsafe { Arc::from_raw(data as *const Keep) });
    }));
    if let Err(p) = r {
        std::mem::forget(p);
    }
}

/// A [`TaskGraph`] captured as an instantiated CUDA graph, bound to the lanes' streams it was
/// captured with.
///
/// It owns its executable graph, host callbacks, kernel closures, signals and the graph's
/// [`TaskGraph::keep_alive`] objects; they are released only after its last launch has completed
/// (a host callback after each launch holds a reference; the final drop runs on the reaper
/// thread). It also owns the graph's [`TaskGraph::gemm`] plans, whose operands it borrows for
/// `'g`: their tensor-map tables are freed, stream-ordered on their lanes' streams, when it is
/// dropped (after every replay already queued, since each launch orders the lane streams' later
/// work after it). `Send` but not `Sync`, and [`CapturedGraph::launch`] takes `&mut self`: CUDA
/// graph objects are not internally synchronised, so launches of one executable graph must not
/// race.
///
/// ```compile_fail
/// // Not Sync: a shared reference cannot cross threads.
/// fn needs_sync<T: Sync>() {}
/// needs_sync::<warpline::ordering::CapturedGraph<'static>>();
/// ```
pub struct CapturedGraph<'g> {
    keep: Arc<Keep>,
    streams: Vec<Stream>,
    waits: Vec<(String, Release)>,
    panics: PanicLog,
    tasks: usize,
    /// The graph has signal waits (`cuStreamWaitValue` nodes): each launch registers them for the
    /// reaper's gate (issue 19, item 8).
    gated: bool,
    /// The GEMM plans the nodes replay (their map tables); dropped with the captured graph.
    _plans: Vec<Arc<TcGemmPlan<'g>>>,
    _not_sync: PhantomData<Cell<()>>,
}

/// One private stream of `dev` per distinct stream of `streams`, in the same positions: a
/// capture runs on streams that no other code (no other thread) can reach (issue 19, item 2).
/// They are spare streams of the context's stock (made when the device opened, so that no
/// `cuStreamCreate` runs behind a pending wait); the guards give them back once the returned
/// clones are dropped (declare the guards first, so that they drop last).
fn private_streams(dev: &Device, streams: &[Stream]) -> Result<(Vec<SpareStream>, Vec<Stream>)> {
    let mut users: Vec<&Stream> = Vec::new();
    let mut spares: Vec<SpareStream> = Vec::new();
    let mut out = Vec::with_capacity(streams.len());
    for s in streams {
        match users.iter().position(|u| *u == s) {
            Some(i) => out.push(spares[i].stream().clone()),
            None => {
                users.push(s);
                let p = SpareStream::take_in(dev.context())?;
                out.push(p.stream().clone());
                spares.push(p);
            }
        }
    }
    Ok((spares, out))
}

impl<'g> TaskGraph<'g> {
    /// Checks the graph and captures one run into a CUDA graph; launch it with
    /// [`CapturedGraph::launch`], which replays it on `streams` (lane `i` on `streams[i]`).
    ///
    /// The graph may hold signal waits, sets and adds, host callbacks, copies
    /// ([`TaskGraph::copy`], whose contract covers captured graphs), GEMM plans
    /// ([`TaskGraph::gemm`]) and typed kernel launches ([`TaskGraph::typed`]): every allocation
    /// their nodes touch is then owned by the captured graph (signals, host closures, kept
    /// objects, plans' tables, kernels' modules) or borrowed by it for `'g` (plans' operands,
    /// typed tasks' views), so safe code cannot free memory a replay uses (issue 19, item 1). A
    /// kernel closure ([`TaskGraph::kernel`]) can reach memory the graph cannot see: such a
    /// graph is refused ([`Error::UncheckedCapture`](crate::Error::UncheckedCapture)); capture it
    /// with the `unsafe` [`TaskGraph::capture_unchecked`].
    ///
    /// The capture runs on private streams made for it (`cuStreamBeginCapture_v2` on lane 0's,
    /// thread-local mode, the other lanes' forked from it with events, `cuStreamEndCapture`,
    /// `cuGraphInstantiateWithFlags`), never on `streams`: work another thread queues on
    /// `streams` meanwhile runs normally and is not captured (issue 19, item 2). Every edge is an
    /// edge of the CUDA graph: explicit dependencies *and* signal set -> wait edges become events,
    /// so CUDA sees the whole order and the signal waits are satisfied by the time they run.
    ///
    /// On an error or a panic the capture is ended and the partial graph destroyed before it
    /// leaves this call. Errors: as [`TaskGraph::enqueue`], plus
    /// [`Error::UncheckedCapture`](crate::Error::UncheckedCapture), and
    /// [`Error::WaitPending`](crate::Error::WaitPending) when an on-stream wait stayed pending
    /// for `Device::STREAM_CREATE_WAIT`: `cuGraphInstantiate` can wait for the device inside the
    /// driver holding a lock the wait's release needs (seen on the H100), so it runs only while
    /// no registered wait is pending.
    pub fn capture(
        &self,
        dev: &Device,
        streams: &[Stream],
        signals: &[&Signal<u64>],
    ) -> Result<CapturedGraph<'g>> {
        self.capturable()?;
        // SAFETY: no kernel closures (checked above); every other task's allocations are owned
        // or borrowed for 'g by the captured graph, or covered by TaskGraph::copy's contract.
        unsafe { self.capture_unchecked(dev, streams, signals) }
    }

    /// Pure CPU: `Ok` when [`TaskGraph::capture`] accepts the graph's tasks (no kernel closure).
    /// Errors: [`Error::UncheckedCapture`](crate::Error::UncheckedCapture) naming the first
    /// kernel-closure task.
    pub fn capturable(&self) -> Result<()> {
        match self.first_closure() {
            Some(task) => Err(Error::UncheckedCapture {
                task: task.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// [`TaskGraph::capture`] for graphs with kernel closures ([`TaskGraph::kernel`]): each
    /// closure runs once, now, and gets a private capture stream as `ctx.stream`. No buffer is
    /// bound to that stream, so the launchers that check stream bindings refuse buffers there
    /// ([`Error::WrongStream`](crate::Error::WrongStream)): closures launch through the `unsafe`
    /// raw launchers (device addresses), whose contracts this one extends to every replay.
    ///
    /// # Safety
    /// What the closures enqueue is replayed at every [`CapturedGraph::launch`], long after they
    /// returned. The caller guarantees:
    /// - every allocation (device memory, tensor-map tables, signals, host memory) that the
    ///   closures' enqueued work touches stays allocated, and is not reused, until the last launch
    ///   of the returned [`CapturedGraph`] has completed (own it in the closure, or hand its owner
    ///   to [`TaskGraph::keep_alive`], so the captured graph keeps it; memory reached through
    ///   shared state or a `static` is not kept);
    /// - no allocation a closure makes during the capture leaves the closure (stream-ordered
    ///   allocations on the capture stream become memory the graph owns), and no table or plan
    ///   whose memory a closure's work reads is dropped before that last launch completed;
    /// - `ctx.stream` (the private capture stream) and events recorded on it do not leave the
    ///   closure, and no other thread enqueues on it while the capture runs;
    /// - every other access to that memory is ordered with the replays (on the lane streams);
    /// - the modules of the kernels the closures launch stay loaded until that last launch
    ///   completed (the device's own module is kept by the captured graph; for a module of your
    ///   own, let the closure own a [`crate::device::Kernel`] clone of it or hand one to
    ///   [`TaskGraph::keep_alive`]).
    ///
    /// Capturing a closure is not possible from safe code (issue 19, item 1):
    ///
    /// ```compile_fail,E0133
    /// fn f(g: &warpline::TaskGraph<'_>, dev: &warpline::Device, s: &[warpline::Stream]) {
    ///     let _ = g.capture_unchecked(dev, s, &[]);
    /// }
    /// ```
    pub unsafe fn capture_unchecked(
        &self,
        dev: &Device,
        streams: &[Stream],
        signals: &[&Signal<u64>],
    ) -> Result<CapturedGraph<'g>> {
        let plan = self.check()?;
        self.check_bindings(streams, signals)?;
        self.check_gemm_streams(streams)?;
        dev.bind()?;
        for s in signals {
            // Outside the capture: every launch on `streams[0]` comes after the signals' zeroing.
            s.order_after_init(&streams[0])?;
        }
        // `_spares` is declared first so that it drops after every clone of its streams.
        let (_spares, private) = private_streams(dev, streams)?;
        let forked = distinct_others(&private)
            .iter()
            .map(|s| s.cudarc().clone())
            .collect();
        let guard = CaptureGuard::begin(private[0].cudarc(), forked)?;
        let mut host_calls = Vec::new();
        let panics = PanicLog::default();
        // A failure or panic here drops `guard`, which ends the capture.
        self.submit(
            &vec![dev; self.lanes.len()],
            &plan,
            &private,
            signals,
            &panics,
            Mode::Capture {
                host_calls: &mut host_calls,
                user: streams,
            },
        )?;
        let graph = guard.end()?;
        let exec = crate::reaper::without_pending_waits(
            "TaskGraph::capture (cuGraphInstantiate)",
            || GraphExec::instantiate(&graph),
        )?;
        let kernels = self
            .tasks
            .iter()
            .filter_map(|t| match &t.op {
                Op::Kernel(f) => Some(f.clone()),
                _ => None,
            })
            .collect();
        let plans: Vec<Arc<TcGemmPlan<'g>>> = self
            .tasks
            .iter()
            .filter_map(|t| match &t.op {
                Op::Gemm(p) => Some(p.clone()),
                _ => None,
            })
            .collect();
        // The modules of the GEMM and typed tasks stay loaded until the last launch completed,
        // and so does the device's own (signal adds are its `ws_signal_add` kernel nodes), even
        // if the device is dropped before the captured graph (issue 19, item 4).
        let mut keep_alive = self.keep.clone();
        keep_alive.push(Arc::new(dev.module().clone()));
        for t in &self.tasks {
            match &t.op {
                Op::Gemm(p) => keep_alive.extend(
                    p.kernels()
                        .into_iter()
                        .map(|k| Arc::new(k) as Arc<dyn Any + Send + Sync>),
                ),
                Op::Typed(k) => keep_alive.push(k.keep()),
                _ => {}
            }
        }
        let keep = Keep {
            inner: Some(KeepInner {
                ctx: dev.context().clone(),
                exec: Mutex::new(exec),
                graph: Mutex::new(graph),
                _host_calls: host_calls,
                _kernels: kernels,
                signals: signals.iter().map(|s| (*s).clone()).collect(),
                _keep_alive: keep_alive,
            }),
        };
        Ok(CapturedGraph {
            keep: Arc::new(keep),
            streams: streams.to_vec(),
            waits: self
                .tasks
                .iter()
                .filter_map(|t| {
                    self.release_of(t, signals)
                        .map(|r| (self.describe(t, signals), r))
                })
                .collect(),
            panics,
            tasks: self.tasks.len(),
            gated: self.has_signal_waits(),
            _plans: plans,
            _not_sync: PhantomData,
        })
    }

    /// [`TaskGraph::capture`] then one [`CapturedGraph::launch`]; the captured graph is released
    /// once that launch has completed. Errors: those of both.
    pub fn run_captured(
        &self,
        dev: &Device,
        streams: &[Stream],
        signals: &[&Signal<u64>],
    ) -> Result<GraphRun> {
        self.capture(dev, streams, signals)?.launch()
    }

    /// True when some task is a signal wait: a replay then holds on-stream waits
    /// (`cuStreamWaitValue` nodes) that the reaper's gate must see (issue 19, item 8).
    fn has_signal_waits(&self) -> bool {
        self.tasks.iter().any(|t| matches!(t.op, Op::Wait { .. }))
    }

    /// [`TaskGraph::capture_unchecked`] then one [`CapturedGraph::launch`].
    ///
    /// # Safety
    /// As [`TaskGraph::capture_unchecked`], for that one launch.
    pub unsafe fn run_captured_unchecked(
        &self,
        dev: &Device,
        streams: &[Stream],
        signals: &[&Signal<u64>],
    ) -> Result<GraphRun> {
        // SAFETY: the caller's contract.
        unsafe { self.capture_unchecked(dev, streams, signals) }?.launch()
    }
}

impl CapturedGraph<'_> {
    /// Launches one replay (`cuGraphLaunch`) on the stream of lane 0 it was captured with, after
    /// the earlier work of every lane's stream, and orders every lane's later work after it (so a
    /// buffer bound to any lane stream is freed only after the replay). Replays never overlap;
    /// each resets the signals first. Returns at once; wait with
    /// [`crate::ordering::synchronize_timeout`].
    ///
    /// Errors: [`Error::Cuda`](crate::Error::Cuda) (`cuStreamWaitEvent`, `cuGraphLaunch`,
    /// `cuEventRecord`, `cuLaunchHostFunc`; if the last fails after the launch, what the graph
    /// owns is leaked rather than freed under the running launch).
    pub fn launch(&mut self) -> Result<GraphRun> {
        let inner = self
            .keep
            .inner
            .as_ref()
            .expect("Keep is full until dropped");
        crate::device::bind_context(&inner.ctx, "cuCtxSetCurrent")?;
        let origin = &self.streams[0];
        let others = distinct_others(&self.streams);
        for s in &others {
            origin.cudarc().join(s.cudarc()).call("cuStreamWaitEvent")?;
        }
        for s in &inner.signals {
            s.order_after_init(origin)?;
        }
        // A replay's signal waits are on-stream waits: no blocking free may run behind them
        // (the driver-lock hang the reaper's gate prevents). Enter the gate before the launch
        // and register a marker after it, as a direct run does for each wait (issue 19, item 8).
        let entry = self.gated.then(crate::reaper::enter_wait);
        {
            let exec = inner.exec.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: a live stream of the graph's context; `Keep` holds everything the nodes
            // use until the host callback queued below has run.
            unsafe { exec.launch(origin.raw()) }?;
        }
        if entry.is_some() {
            // The graph launch completes as a whole on `origin`: a marker there follows every
            // wait node of every lane.
            let marker = Arc::new(origin.record_marker()?);
            crate::ordering::registry::register_gate_wait(marker);
        }
        drop(entry);
        let data = Arc::into_raw(self.keep.clone()) as *mut c_void;
        // On error the driver did not take `data` and the launch may still run: the reference
        // is leaked so the graph's contents are never freed under it.
        // SAFETY: release_keep consumes `data` once, never unwinds and calls no CUDA.
        unsafe { dg::launch_host_func(origin.raw(), release_keep, data) }?;
        let done = record(origin)?;
        for s in &others {
            s.cudarc().wait(&done).call("cuStreamWaitEvent")?;
        }
        Ok(GraphRun::new(
            format!("captured task graph launch ({} tasks)", self.tasks),
            RunState::Captured {
                _keep: self.keep.clone(),
                waits: self.waits.clone(),
                done,
            },
            self.panics.clone(),
            self.streams.clone(),
        ))
    }

    /// Number of tasks captured.
    pub fn tasks(&self) -> usize {
        self.tasks
    }

    /// Edges of the captured CUDA graph (`cuGraphGetEdges_v2`), for tests and diagnostics.
    /// Errors: [`Error::Cuda`](crate::Error::Cuda).
    pub fn cuda_edges(&self) -> Result<usize> {
        let inner = self
            .keep
            .inner
            .as_ref()
            .expect("Keep is full until dropped");
        crate::device::bind_context(&inner.ctx, "cuCtxSetCurrent")?;
        let graph = inner.graph.lock().unwrap_or_else(|e| e.into_inner());
        let mut count = 0usize;
        // SAFETY: a live graph; null arrays ask for the count only.
        unsafe {
            dg::graph_get_edges(
                graph.raw(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut count,
            )
        }?;
        Ok(count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ordering::{Cmp, TaskId};

    /// Issue 19 item 8 (review): a captured graph registers its replays' waits for the reaper's
    /// gate exactly when it has signal waits; sets, adds and host callbacks are not waits.
    #[test]
    fn issue19_review_item08_replays_gate_exactly_the_graphs_with_waits() {
        let mut g = TaskGraph::new();
        let (a, b) = (g.lane("a"), g.lane("b"));
        let s = g.signal("s");
        g.set(a, "set", s, 1).unwrap();
        g.add(a, "add", s, 1).unwrap();
        g.host(b, "host", || {}).unwrap();
        assert!(!g.has_signal_waits());
        g.wait(b, "wait", s, Cmp::Geq, 2).unwrap();
        assert!(g.has_signal_waits());
        assert!(!TaskGraph::new().has_signal_waits());
    }

    /// One builder call of the proptest below: `foreign` picks a handle of another graph.
    #[derive(Clone, Debug)]
    enum Call {
        Lane,
        Signal,
        Set {
            lane: usize,
            sig: usize,
            value: u64,
            foreign: bool,
        },
        Add {
            lane: usize,
            sig: usize,
            value: u64,
            foreign: bool,
        },
        Wait {
            lane: usize,
            sig: usize,
            cmp: u8,
            value: u64,
            foreign: bool,
        },
        Host {
            lane: usize,
            foreign: bool,
        },
        Depend {
            before: usize,
            after: usize,
            foreign: bool,
        },
        Label {
            task: usize,
            foreign: bool,
        },
    }

    /// Element `i` (modulo the length) of `v`, `None` when empty.
    fn pick<T: Copy>(v: &[T], i: usize) -> Option<T> {
        v.get(i % v.len().max(1)).copied()
    }

    fn call() -> impl proptest::strategy::Strategy<Value = Call> {
        use proptest::prelude::*;
        let v = prop_oneof![
            Just(0u64),
            Just(1),
            Just(u64::MAX),
            Just(1 << 63),
            any::<u64>()
        ];
        let (i, f) = (0usize..6, proptest::bool::weighted(0.1));
        prop_oneof![
            Just(Call::Lane),
            Just(Call::Signal),
            (i.clone(), i.clone(), v.clone(), f).prop_map(|(lane, sig, value, foreign)| {
                Call::Set {
                    lane,
                    sig,
                    value,
                    foreign,
                }
            }),
            (i.clone(), i.clone(), v.clone(), f).prop_map(|(lane, sig, value, foreign)| {
                Call::Add {
                    lane,
                    sig,
                    value,
                    foreign,
                }
            }),
            (i.clone(), i.clone(), 0u8..4, v, f).prop_map(|(lane, sig, cmp, value, foreign)| {
                Call::Wait {
                    lane,
                    sig,
                    cmp,
                    value,
                    foreign,
                }
            }),
            (i.clone(), f).prop_map(|(lane, foreign)| Call::Host { lane, foreign }),
            (0usize..24, 0usize..24, f).prop_map(|(before, after, foreign)| Call::Depend {
                before,
                after,
                foreign
            }),
            (0usize..24, f).prop_map(|(task, foreign)| Call::Label { task, foreign }),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
        /// Review of issue 19 (safe code never panics): any sequence of `TaskGraph` builder calls,
        /// with handles of another graph mixed in and extreme values, gives `Ok` or the
        /// documented typed error, never a panic; `check` then accepts (a plan that orders every
        /// task once, each lane's tasks in order) or refuses with a typed error; `capturable`
        /// accepts every graph without kernel closures.
        #[test]
        fn issue19_review_task_graph_builder_never_panics(
            calls in proptest::collection::vec(call(), 0..24)
        ) {
            let mut g = TaskGraph::new();
            let mut other = TaskGraph::new();
            let (ol, os) = (other.lane("o"), other.signal("o"));
            let ot = other.set(ol, "o", os, 1).unwrap();
            let (mut lanes, mut sigs, mut tasks) = (Vec::new(), Vec::new(), Vec::new());
            let mut lane_of = Vec::new();
            for c in calls {
                let r = match c {
                    Call::Lane => {
                        lanes.push(g.lane("l"));
                        continue;
                    }
                    Call::Signal => {
                        sigs.push(g.signal("s"));
                        continue;
                    }
                    Call::Set { lane, sig, value, foreign } => {
                        let (Some(l), Some(s)) = (pick(&lanes, lane), pick(&sigs, sig)) else {
                            continue;
                        };
                        let (l, s) = if foreign { (ol, os) } else { (l, s) };
                        g.set(l, "set", s, value).map(|t| (t, l))
                    }
                    Call::Add { lane, sig, value, foreign } => {
                        let (Some(l), Some(s)) = (pick(&lanes, lane), pick(&sigs, sig)) else {
                            continue;
                        };
                        let s = if foreign { os } else { s };
                        g.add(l, "add", s, value).map(|t| (t, l))
                    }
                    Call::Wait { lane, sig, cmp, value, foreign } => {
                        let (Some(l), Some(s)) = (pick(&lanes, lane), pick(&sigs, sig)) else {
                            continue;
                        };
                        let l = if foreign { ol } else { l };
                        let cmp = [Cmp::Geq, Cmp::Eq, Cmp::And, Cmp::Nor][cmp as usize % 4];
                        g.wait(l, "wait", s, cmp, value).map(|t| (t, l))
                    }
                    Call::Host { lane, foreign } => {
                        let Some(l) = pick(&lanes, lane) else { continue };
                        let l = if foreign { ol } else { l };
                        g.host(l, "host", || {}).map(|t| (t, l))
                    }
                    Call::Depend { before, after, foreign } => {
                        let (Some(b), Some(a)) = (pick(&tasks, before), pick(&tasks, after)) else {
                            continue;
                        };
                        let b = if foreign { ot } else { b };
                        match g.depend(b, a) {
                            Ok(()) => continue,
                            Err(Error::ForeignHandle { .. } | Error::BadShape { .. }) => continue,
                            Err(e) => panic!("depend: {e}"),
                        }
                    }
                    Call::Label { task, foreign } => {
                        let Some(t) = pick(&tasks, task) else { continue };
                        let t = if foreign { ot } else { t };
                        match g.label(t) {
                            Ok(_) => continue,
                            Err(Error::ForeignHandle { .. }) => continue,
                            Err(e) => panic!("label: {e}"),
                        }
                    }
                };
                match r {
                    Ok((t, l)) => {
                        tasks.push(t);
                        lane_of.push(l);
                    }
                    Err(Error::ForeignHandle { .. }) => {}
                    Err(e) => panic!("builder: {e}"),
                }
            }
            proptest::prop_assert!(g.capturable().is_ok());
            match g.check() {
                Ok(plan) => {
                    let order = plan.order();
                    proptest::prop_assert_eq!(order.len(), tasks.len());
                    let pos = |t: &TaskId| order.iter().position(|o| o == t);
                    for (i, t) in tasks.iter().enumerate() {
                        let p = pos(t);
                        proptest::prop_assert!(p.is_some(), "task {} not in the plan", i);
                        for (j, u) in tasks.iter().enumerate().take(i) {
                            if lane_of[j] == lane_of[i] {
                                proptest::prop_assert!(pos(u) < p, "lane order of {} and {}", j, i);
                            }
                        }
                    }
                }
                Err(
                    Error::Cycle { .. }
                    | Error::UnmatchedWait { .. }
                    | Error::WaitMayNotFire { .. },
                ) => {}
                Err(e) => panic!("check: {e}"),
            }
        }
    }
}
