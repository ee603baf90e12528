//! Capturing a [`TaskGraph`] into a CUDA graph, and [`CapturedGraph`], which owns everything its
//! nodes use until its last launch has completed.

use std::any::Any;
use std::cell::Cell;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use super::enqueue::{distinct_others, record, HostCall, Mode, PanicLog};
use super::run::{GraphRun, RunState};
use super::{LaunchFn, Op, TaskGraph};
use crate::device::Device;
use crate::driver::graph::{self as dg, CaptureGuard, CudaGraph, GraphExec};
use crate::error::{CudaCall, Result};
use crate::ordering::signal::Signal;
use crate::ordering::types::Release;
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
            crate::memory::reaper::defer(move || {
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
/// thread). `Send` but not `Sync`, and [`CapturedGraph::launch`] takes `&mut self`: CUDA graph
/// objects are not internally synchronised, so launches of one executable graph must not race.
///
/// ```compile_fail
/// // Not Sync: a shared reference cannot cross threads.
/// fn needs_sync<T: Sync>() {}
/// needs_sync::<warpline::ordering::CapturedGraph>();
/// ```
pub struct CapturedGraph {
    keep: Arc<Keep>,
    streams: Vec<Stream>,
    waits: Vec<(String, Release)>,
    panics: PanicLog,
    tasks: usize,
    _not_sync: PhantomData<Cell<()>>,
}

impl TaskGraph {
    /// Checks the graph and captures one run into a CUDA graph (`cuStreamBeginCapture_v2` on
    /// `streams[0]`, thread-local mode, the other lanes forked from it with events,
    /// `cuStreamEndCapture`, `cuGraphInstantiateWithFlags`). Every edge is an edge of the CUDA
    /// graph: explicit dependencies *and* signal set -> wait edges become events, so CUDA sees the
    /// whole order and the signal waits are satisfied by the time they run. Kernel closures run
    /// once, now. Launch it with [`CapturedGraph::launch`].
    ///
    /// If a kernel closure fails or panics, the capture is ended and the partial graph destroyed
    /// before the error (or the panic) leaves this call, so no stream stays in capture mode.
    /// Errors: as [`TaskGraph::enqueue`].
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
        for s in signals {
            // Outside the capture: every launch on `origin` comes after the signals' zeroing.
            s.order_after_init(origin)?;
        }
        let guard = CaptureGuard::begin(origin, distinct_others(streams))?;
        let mut host_calls = Vec::new();
        let panics = PanicLog::default();
        // A failure or panic here drops `guard`, which ends the capture.
        self.submit(
            &vec![dev; self.lanes.len()],
            &plan,
            streams,
            signals,
            &panics,
            Mode::Capture(&mut host_calls),
        )?;
        let graph = guard.end()?;
        let exec = GraphExec::instantiate(&graph)?;
        let kernels = self
            .tasks
            .iter()
            .filter_map(|t| match &t.op {
                Op::Kernel(f) => Some(f.clone()),
                _ => None,
            })
            .collect();
        let keep = Keep {
            inner: Some(KeepInner {
                ctx: dev.context().clone(),
                exec: Mutex::new(exec),
                graph: Mutex::new(graph),
                _host_calls: host_calls,
                _kernels: kernels,
                signals: signals.iter().map(|s| (*s).clone()).collect(),
                _keep_alive: self.keep.clone(),
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
            _not_sync: PhantomData,
        })
    }

    /// [`TaskGraph::capture`] then one [`CapturedGraph::launch`]; the captured graph is released
    /// once that launch has completed.
    pub fn run_captured(
        &self,
        dev: &Device,
        streams: &[Stream],
        signals: &[&Signal<u64>],
    ) -> Result<GraphRun> {
        self.capture(dev, streams, signals)?.launch()
    }
}

impl CapturedGraph {
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
        {
            let exec = inner.exec.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: a live stream of the graph's context; `Keep` holds everything the nodes
            // use until the host callback queued below has run.
            unsafe { exec.launch(origin.raw()) }?;
        }
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
