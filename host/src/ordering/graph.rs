//! `TaskGraph`: kernels, copies, signal waits/sets/adds and host callbacks on logical streams
//! ("lanes") with explicit dependencies, checked for cycles (including the signal edges CUDA cannot
//! see) before anything is enqueued, then enqueued producer-first with events for cross-stream
//! dependencies, or captured into a CUDA graph in which every edge is CUDA-visible.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaEvent};

use super::check::{self, EdgeKind, Plan, Shape, TaskId, TaskView};
use super::signal::{Cmp, Releasable, Signal};
use super::watch::PendingOp;
use crate::device::Device;
use crate::error::{CudaCall, Error, Result};
use crate::stream::Stream;

/// A logical stream of a [`TaskGraph`]; bound to a real [`Stream`] when the graph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lane(usize);

/// A logical signal of a [`TaskGraph`]; bound to a real [`Signal`] when the graph runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SignalRef(usize);

/// What a kernel task's closure gets: the device, its stream, and the bound signals.
pub struct TaskContext<'a> {
    /// The device.
    pub dev: &'a Device,
    /// The stream the task's lane is bound to: enqueue on this one only.
    pub stream: &'a Stream,
    signals: &'a [&'a Signal<u64>],
}

impl TaskContext<'_> {
    /// The signal bound to `s` (for kernels that use signals device-side).
    pub fn signal(&self, s: SignalRef) -> &Signal<u64> {
        self.signals[s.0]
    }
}

type LaunchFn = dyn Fn(&TaskContext<'_>) -> Result<()> + Send + Sync;
type HostFn = Mutex<Box<dyn FnMut() + Send>>;

enum Op {
    Kernel(Arc<LaunchFn>),
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    Wait {
        signal: SignalRef,
        cmp: Cmp,
        value: u64,
    },
    Set {
        signal: SignalRef,
        value: u64,
    },
    Add {
        signal: SignalRef,
        value: u64,
    },
    Host(Arc<HostFn>),
}

struct Task {
    lane: Lane,
    label: String,
    op: Op,
}

/// Tasks on lanes with explicit dependencies. Build it without a GPU; [`TaskGraph::check`] is pure
/// CPU code. Signals start every run at 0 (the run resets them), so set/wait values are per run.
///
/// Rules enforced (`docs/ordering.md`): the full graph (explicit dependencies, each lane's order,
/// every signal set/add -> each wait it can satisfy) must be acyclic ([`Error::Cycle`] names a
/// cycle); every wait must have a producer in the graph unless 0 already satisfies it
/// ([`Error::UnmatchedWait`]); tasks are submitted in a topological order of the full graph, so
/// every signal's producer is enqueued before its waiter and no FIFO merging of streams that CUDA
/// may choose can close a cycle. Kernels that spin on signals device-side hold SMs: give them an
/// explicit dependency on their producer.
#[derive(Default)]
pub struct TaskGraph {
    lanes: Vec<String>,
    signals: Vec<String>,
    tasks: Vec<Task>,
    deps: Vec<(TaskId, TaskId)>,
}

impl TaskGraph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new lane named `name` (bound to `streams[lane index]` at run time, in creation order).
    pub fn lane(&mut self, name: impl Into<String>) -> Lane {
        self.lanes.push(name.into());
        Lane(self.lanes.len() - 1)
    }

    /// A new signal slot named `name` (bound to `signals[index]` at run time, in creation order).
    pub fn signal(&mut self, name: impl Into<String>) -> SignalRef {
        self.signals.push(name.into());
        SignalRef(self.signals.len() - 1)
    }

    fn push(&mut self, lane: Lane, label: impl Into<String>, op: Op) -> TaskId {
        assert!(lane.0 < self.lanes.len(), "lane of another graph");
        if let Op::Wait { signal, .. } | Op::Set { signal, .. } | Op::Add { signal, .. } = &op {
            assert!(signal.0 < self.signals.len(), "signal of another graph");
        }
        self.tasks.push(Task {
            lane,
            label: label.into(),
            op,
        });
        TaskId(self.tasks.len() - 1)
    }

    /// A kernel launch (or any stream work): `launch` enqueues on `ctx.stream` with a typed
    /// launcher. It runs on the host at enqueue/capture time, once per [`TaskGraph::enqueue`].
    pub fn kernel(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        launch: impl Fn(&TaskContext<'_>) -> Result<()> + Send + Sync + 'static,
    ) -> TaskId {
        self.push(lane, label, Op::Kernel(Arc::new(launch)))
    }

    /// A device-to-device copy of `bytes` bytes (`cuMemcpyDtoDAsync`).
    ///
    /// # Safety
    /// `dst` and `src` are live device allocations of at least `bytes` bytes, not overlapping, for
    /// as long as any run of the graph (or its captured form) may execute, and the graph's
    /// dependencies order every other access to them.
    pub unsafe fn copy(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        dst: u64,
        src: u64,
        bytes: usize,
    ) -> TaskId {
        self.push(lane, label, Op::Copy { dst, src, bytes })
    }

    /// An on-stream wait until `signal` satisfies `cmp` against `value` ([`Signal::wait_until`]).
    pub fn wait(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        signal: SignalRef,
        cmp: Cmp,
        value: u64,
    ) -> TaskId {
        self.push(lane, label, Op::Wait { signal, cmp, value })
    }

    /// An on-stream write of `value` to `signal` ([`Signal::set`]).
    pub fn set(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        signal: SignalRef,
        value: u64,
    ) -> TaskId {
        self.push(lane, label, Op::Set { signal, value })
    }

    /// An on-stream atomic add of `value` to `signal` ([`Signal::add`]). The checker treats every
    /// add of a signal as a producer of each of its waits.
    pub fn add(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        signal: SignalRef,
        value: u64,
    ) -> TaskId {
        self.push(lane, label, Op::Add { signal, value })
    }

    /// A host callback (`cuLaunchHostFunc`): runs on a driver thread once the lane's earlier work
    /// is done and blocks the lane until it returns. It must not call CUDA or wait for GPU work.
    pub fn host(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        f: impl FnMut() + Send + 'static,
    ) -> TaskId {
        self.push(lane, label, Op::Host(Arc::new(Mutex::new(Box::new(f)))))
    }

    /// `after` does not start before `before` has completed (an event across lanes).
    /// Errors: [`Error::BadShape`] for an id that is not a task of this graph or a self-edge.
    pub fn depend(&mut self, before: TaskId, after: TaskId) -> Result<()> {
        let n = self.tasks.len();
        if before.0 >= n || after.0 >= n || before == after {
            return Err(Error::BadShape {
                what: "task graph dependency",
                detail: format!(
                    "{before:?} -> {after:?}: both must be distinct tasks of this graph ({n} tasks)"
                ),
            });
        }
        self.deps.push((before, after));
        Ok(())
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// True without tasks.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Label of task `t`.
    pub fn label(&self, t: TaskId) -> &str {
        &self.tasks[t.0].label
    }

    /// Pure-CPU check: builds the full graph and returns the submission order.
    /// Errors: [`Error::Cycle`], [`Error::UnmatchedWait`].
    pub fn check(&self) -> Result<Plan> {
        let views: Vec<TaskView<'_>> = self
            .tasks
            .iter()
            .map(|t| TaskView {
                lane: t.lane.0,
                label: &t.label,
                shape: match t.op {
                    Op::Wait { signal, cmp, value } => Shape::Wait {
                        signal: signal.0,
                        cmp,
                        value,
                    },
                    Op::Set { signal, value } => Shape::Set {
                        signal: signal.0,
                        value,
                    },
                    Op::Add { signal, .. } => Shape::Add { signal: signal.0 },
                    _ => Shape::Work,
                },
            })
            .collect();
        check::plan(&views, &self.deps, &self.lanes, &self.signals)
    }

    fn check_bindings(&self, streams: &[Stream], signals: &[&Signal<u64>]) -> Result<()> {
        if streams.len() != self.lanes.len() || signals.len() != self.signals.len() {
            return Err(Error::LengthMismatch {
                what: "task graph bindings",
                detail: format!(
                    "{} streams for {} lanes and {} signals for {} signal slots; one each is needed",
                    streams.len(),
                    self.lanes.len(),
                    signals.len(),
                    self.signals.len()
                ),
            });
        }
        if streams.is_empty() {
            return Err(Error::Empty {
                what: "task graph lanes",
            });
        }
        Ok(())
    }

    /// Checks the graph, then enqueues one run: resets the bound signals to 0 on `streams[0]`
    /// after every lane's earlier work (runs never overlap), submits the tasks in
    /// [`Plan::order`] with an event for each explicit dependency across streams, and records an
    /// event after every task (for [`super::synchronize_timeout`]). Returns at once.
    ///
    /// `streams[i]` is lane `i`, `signals[j]` signal slot `j`; they must not be used by other work
    /// while the run is pending. Errors: [`Error::Cycle`], [`Error::UnmatchedWait`],
    /// [`Error::LengthMismatch`] for wrong bindings, errors of kernel closures, [`Error::Cuda`].
    pub fn enqueue(
        &self,
        dev: &Device,
        streams: &[Stream],
        signals: &[&Signal<u64>],
    ) -> Result<GraphRun> {
        let plan = self.check()?;
        self.check_bindings(streams, signals)?;
        dev.bind()?;
        let origin = &streams[0];
        let others = distinct_others(streams);
        for s in &others {
            origin.cudarc().join(s.cudarc()).call("cuStreamWaitEvent")?;
        }
        let done = self.submit(dev, &plan, streams, signals, false, Callbacks::Owned)?;
        let mut tails = Vec::new();
        for s in std::iter::once(origin).chain(others.iter()) {
            tails.push(record(s)?);
        }
        let tasks = self
            .tasks
            .iter()
            .zip(done)
            .map(|(t, ev)| RunTask {
                what: self.describe(t, signals),
                release: self.release_of(t, signals),
                done: ev,
            })
            .collect();
        Ok(GraphRun {
            what: format!("task graph run ({} tasks)", self.tasks.len()),
            state: RunState::Direct { tasks, tails },
            _streams: streams.to_vec(),
        })
    }

    /// Checks the graph and captures one run into a CUDA graph (`cuStreamBeginCapture_v2` on
    /// `streams[0]`, the other lanes forked from it with events, `cuStreamEndCapture`,
    /// `cuGraphInstantiateWithFlags`). Every edge is an edge of the CUDA graph: explicit
    /// dependencies *and* signal set -> wait edges become events, so CUDA sees the whole order and
    /// the signal waits are satisfied by the time they run. Launch it with
    /// [`CapturedGraph::launch`]. Errors: as [`TaskGraph::enqueue`].
    pub fn capture(
        &self,
        dev: &Device,
        streams: &[Stream],
        signals: &[&Signal<u64>],
    ) -> Result<CapturedGraph> {
        let plan = self.check()?;
        self.check_bindings(streams, signals)?;
        dev.bind()?;
        let origin = &streams[0];
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: a stream of this context, not already capturing (the driver checks).
        unsafe { sys::cuStreamBeginCapture_v2(origin.raw(), mode) }
            .call("cuStreamBeginCapture_v2")?;
        let mut keep = Vec::new();
        let body = self.submit(
            dev,
            &plan,
            streams,
            signals,
            true,
            Callbacks::Kept(&mut keep),
        );
        let body = body.and_then(|_| {
            for s in distinct_others(streams) {
                origin.cudarc().join(s.cudarc()).call("cuStreamWaitEvent")?;
            }
            Ok(())
        });
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: ends the capture begun above (also on the error path, so the stream is usable).
        let end =
            unsafe { sys::cuStreamEndCapture(origin.raw(), &mut graph) }.call("cuStreamEndCapture");
        let owned = GraphHandle {
            graph,
            exec: std::ptr::null_mut(),
        };
        body?;
        end?;
        let mut owned = owned;
        // SAFETY: a valid graph from the capture; out-pointer valid.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut owned.exec, owned.graph, 0) }
            .call("cuGraphInstantiateWithFlags")?;
        Ok(CapturedGraph {
            handle: Arc::new(owned),
            _callbacks: keep,
            _signals: signals.iter().map(|s| (*s).clone()).collect(),
            waits: self
                .tasks
                .iter()
                .filter_map(|t| {
                    self.release_of(t, signals)
                        .map(|r| (self.describe(t, signals), r))
                })
                .collect(),
            tasks: self.tasks.len(),
        })
    }

    /// [`TaskGraph::capture`] then [`CapturedGraph::launch`] on `streams[0]`.
    pub fn run_captured(
        &self,
        dev: &Device,
        streams: &[Stream],
        signals: &[&Signal<u64>],
    ) -> Result<GraphRun> {
        self.capture(dev, streams, signals)?.launch(&streams[0])
    }

    fn describe(&self, t: &Task, signals: &[&Signal<u64>]) -> String {
        let lane = &self.lanes[t.lane.0];
        match &t.op {
            Op::Wait { signal, cmp, value } => format!(
                "signal wait `{}` on stream `{lane}`: `{}` {cmp} {value} never fired",
                t.label,
                signals[signal.0].label()
            ),
            _ => format!("task `{}` on stream `{lane}`", t.label),
        }
    }

    fn release_of(&self, t: &Task, signals: &[&Signal<u64>]) -> Option<Release> {
        match t.op {
            Op::Wait { signal, cmp, value } => Some(Release {
                signal: Arc::new(signals[signal.0].clone()),
                cmp,
                value,
            }),
            _ => None,
        }
    }

    /// Resets the signals, forks the lanes from `streams[0]` and submits every task in plan order.
    /// `signal_events`: also turn signal edges into events (captured graphs).
    fn submit(
        &self,
        dev: &Device,
        plan: &Plan,
        streams: &[Stream],
        signals: &[&Signal<u64>],
        signal_events: bool,
        mut callbacks: Callbacks<'_>,
    ) -> Result<Vec<CudaEvent>> {
        let origin = &streams[0];
        for s in signals {
            s.enqueue_write(origin, 0)?;
        }
        let fork = record(origin)?;
        for s in distinct_others(streams) {
            s.cudarc().wait(&fork).call("cuStreamWaitEvent")?;
        }
        let mut incoming: Vec<Vec<usize>> = vec![Vec::new(); self.tasks.len()];
        for e in plan.edges() {
            if e.kind == EdgeKind::Dependency || (signal_events && e.kind == EdgeKind::Signal) {
                incoming[e.to.0].push(e.from.0);
            }
        }
        let mut done: Vec<Option<CudaEvent>> = (0..self.tasks.len()).map(|_| None).collect();
        for &id in plan.order() {
            let task = &self.tasks[id.0];
            let stream = &streams[task.lane.0];
            for &from in &incoming[id.0] {
                if streams[self.tasks[from].lane.0] != *stream {
                    let ev = done[from]
                        .as_ref()
                        .expect("plan order puts predecessors first");
                    stream.cudarc().wait(ev).call("cuStreamWaitEvent")?;
                }
            }
            match &task.op {
                Op::Kernel(f) => f(&TaskContext {
                    dev,
                    stream,
                    signals,
                })?,
                Op::Copy { dst, src, bytes } => {
                    // SAFETY: TaskGraph::copy's contract: live, non-overlapping allocations.
                    unsafe { sys::cuMemcpyDtoDAsync_v2(*dst, *src, *bytes, stream.raw()) }
                        .call("cuMemcpyDtoDAsync")?
                }
                Op::Wait { signal, cmp, value } => {
                    signals[signal.0].enqueue_wait(stream, *cmp, *value)?
                }
                Op::Set { signal, value } => signals[signal.0].enqueue_write(stream, *value)?,
                Op::Add { signal, value } => signals[signal.0].add(dev, stream, *value)?,
                Op::Host(f) => callbacks.launch(stream, f)?,
            }
            done[id.0] = Some(record(stream)?);
        }
        Ok(done
            .into_iter()
            .map(|e| e.expect("every task submitted"))
            .collect())
    }
}

fn record(s: &Stream) -> Result<CudaEvent> {
    s.cudarc()
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .call("cuEventRecord")
}

/// The streams other than `streams[0]`, each once.
fn distinct_others(streams: &[Stream]) -> Vec<Stream> {
    let mut out: Vec<Stream> = Vec::new();
    for s in &streams[1..] {
        if *s != streams[0] && !out.contains(s) {
            out.push(s.clone());
        }
    }
    out
}

/// How host callbacks' closures are kept alive: one `Arc` per call given to the driver and
/// dropped by the callback (direct runs), or kept by the captured graph (graph replays).
enum Callbacks<'a> {
    Owned,
    Kept(&'a mut Vec<Arc<HostFn>>),
}

unsafe extern "C" fn run_owned(data: *mut c_void) {
    // SAFETY: `data` came from Arc::into_raw in Callbacks::launch and is consumed exactly once.
    let f = unsafe { Arc::from_raw(data as *const HostFn) };
    let mut g = f.lock().unwrap_or_else(|e| e.into_inner());
    (*g)();
}

unsafe extern "C" fn run_kept(data: *mut c_void) {
    // SAFETY: `data` points into an Arc kept by the CapturedGraph for as long as it can run.
    let f = unsafe { &*(data as *const HostFn) };
    let mut g = f.lock().unwrap_or_else(|e| e.into_inner());
    (*g)();
}

impl Callbacks<'_> {
    fn launch(&mut self, stream: &Stream, f: &Arc<HostFn>) -> Result<()> {
        match self {
            Callbacks::Owned => {
                let data = Arc::into_raw(f.clone()) as *mut c_void;
                // SAFETY: run_owned consumes `data` once; if the launch fails it is reclaimed.
                let r = unsafe { sys::cuLaunchHostFunc(stream.raw(), Some(run_owned), data) };
                if r != sys::CUresult::CUDA_SUCCESS {
                    // SAFETY: the driver did not take `data`.
                    drop(unsafe { Arc::from_raw(data as *const HostFn) });
                }
                r.call("cuLaunchHostFunc")
            }
            Callbacks::Kept(keep) => {
                keep.push(f.clone());
                let data = Arc::as_ptr(f) as *mut c_void;
                // SAFETY: `data` stays valid while the CapturedGraph (which keeps `f`) exists.
                unsafe { sys::cuLaunchHostFunc(stream.raw(), Some(run_kept), data) }
                    .call("cuLaunchHostFunc")
            }
        }
    }
}

struct GraphHandle {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: CUDA graph handles may be used from any thread of the context's process.
unsafe impl Send for GraphHandle {}
unsafe impl Sync for GraphHandle {}

impl Drop for GraphHandle {
    fn drop(&mut self) {
        // SAFETY: handles from capture/instantiate, destroyed once. An executable graph that is
        // still running is freed by the driver when it completes (cuGraphExecDestroy).
        unsafe {
            if !self.exec.is_null() {
                let _ = sys::cuGraphExecDestroy(self.exec);
            }
            if !self.graph.is_null() {
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

/// A [`TaskGraph`] captured as an instantiated CUDA graph. It keeps its signals and host
/// callbacks alive; replays must not overlap (each resets the signals first).
pub struct CapturedGraph {
    handle: Arc<GraphHandle>,
    _callbacks: Vec<Arc<HostFn>>,
    _signals: Vec<Signal<u64>>,
    waits: Vec<(String, Release)>,
    tasks: usize,
}

impl CapturedGraph {
    /// Launches one replay on `stream` (`cuGraphLaunch`); returns at once.
    pub fn launch(&self, stream: &Stream) -> Result<GraphRun> {
        // SAFETY: a valid executable graph and stream of the same context.
        unsafe { sys::cuGraphLaunch(self.handle.exec, stream.raw()) }.call("cuGraphLaunch")?;
        Ok(GraphRun {
            what: format!("captured task graph launch ({} tasks)", self.tasks),
            state: RunState::Captured {
                _handle: self.handle.clone(),
                waits: self.waits.clone(),
                done: record(stream)?,
            },
            _streams: vec![stream.clone()],
        })
    }
}

#[derive(Clone)]
pub(crate) struct Release {
    pub signal: Arc<dyn Releasable>,
    pub cmp: Cmp,
    pub value: u64,
}

struct RunTask {
    what: String,
    release: Option<Release>,
    done: CudaEvent,
}

enum RunState {
    Direct {
        tasks: Vec<RunTask>,
        tails: Vec<CudaEvent>,
    },
    Captured {
        _handle: Arc<GraphHandle>,
        waits: Vec<(String, Release)>,
        done: CudaEvent,
    },
}

/// One enqueued run of a [`TaskGraph`] (direct or captured): wait for it with
/// [`super::synchronize_timeout`].
pub struct GraphRun {
    what: String,
    state: RunState,
    /// Keeps the run's streams alive while it may be pending.
    _streams: Vec<Stream>,
}

impl GraphRun {
    pub(crate) fn describe(&self) -> &str {
        &self.what
    }

    /// True once every task has completed (`cuEventQuery`).
    pub fn is_complete(&self) -> Result<bool> {
        let evs: Vec<&CudaEvent> = match &self.state {
            RunState::Direct { tails, .. } => tails.iter().collect(),
            RunState::Captured { done, .. } => vec![done],
        };
        for e in evs {
            if !e.try_is_complete().call("cuEventQuery")? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// What has not completed: signal waits first. For a captured launch the driver does not
    /// report node progress, so every signal wait of the graph is listed as possibly pending.
    pub(crate) fn pending(&self) -> Result<Vec<PendingOp>> {
        let mut out = Vec::new();
        match &self.state {
            RunState::Direct { tasks, .. } => {
                for t in tasks {
                    if !t.done.try_is_complete().call("cuEventQuery")? {
                        out.push(PendingOp {
                            what: t.what.clone(),
                            release: t.release.clone(),
                        });
                    }
                }
            }
            RunState::Captured { waits, .. } => {
                for (what, r) in waits {
                    out.push(PendingOp {
                        what: format!("(captured, possibly) {what}"),
                        release: Some(r.clone()),
                    });
                }
            }
        }
        out.sort_by_key(|p| p.release.is_none());
        Ok(out)
    }
}
