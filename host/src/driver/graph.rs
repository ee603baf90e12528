//! Driver wrappers: see [`super`]. Each function wraps one `cu*` call: CUDA graphs (stream
//! capture, instantiate, launch, destroy, edges), host callbacks (`cuLaunchHostFunc`), and the
//! one RAII owner of each graph handle ([`CudaGraph`], [`GraphExec`]) plus the capture guard
//! ([`CaptureGuard`]) that `chain.rs` and `ordering/graph` share.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::Arc;

use cudarc::driver::{sys, CudaStream};

use crate::error::{CudaCall, Result};

/// `cuStreamBeginCapture_v2` in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL` mode.
///
/// # Safety
/// `stream` is a live stream of the current context.
pub(crate) unsafe fn stream_begin_capture(stream: sys::CUstream) -> Result<()> {
    let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
    capture_opens();
    if let Err(e) = sys::cuStreamBeginCapture_v2(stream, mode).call("cuStreamBeginCapture_v2") {
        capture_closes();
        return Err(e);
    }
    CAPTURES_OPEN.with(|n| n.set(n.get() + 1));
    Ok(())
}

/// Process-wide: how many captures begun through [`stream_begin_capture`] are open in any
/// thread, and whether a call that may synchronise the whole context is running
/// ([`CapturesExcluded`]).
struct CaptureCensus {
    open: usize,
    excluded: bool,
}

static CENSUS: std::sync::Mutex<CaptureCensus> = std::sync::Mutex::new(CaptureCensus {
    open: 0,
    excluded: false,
});
static CENSUS_CV: std::sync::Condvar = std::sync::Condvar::new();

fn census() -> std::sync::MutexGuard<'static, CaptureCensus> {
    CENSUS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Counts a capture about to begin; waits while a [`CapturesExcluded`] is held (a free or an
/// unload on the reaper thread, which waits for GPU work alone).
fn capture_opens() {
    let mut c = census();
    while c.excluded {
        c = CENSUS_CV.wait(c).unwrap_or_else(|e| e.into_inner());
    }
    c.open += 1;
}

/// A capture counted by [`capture_opens`] has ended (or never began).
fn capture_closes() {
    {
        let mut c = census();
        c.open = c.open.saturating_sub(1);
    }
    CENSUS_CV.notify_all();
}

/// Held while a driver call that may synchronise the context runs (`cuMemFreeHost`,
/// `cuMemPoolDestroy`, `cuModuleUnload` on the reaper thread): [`exclude_captures`] gives one only
/// while no capture is open in any thread of the process, and no capture begins until it drops.
/// Under compute-sanitizer memcheck such a call on the reaper thread invalidated another thread's
/// thread-local capture (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` at the next `cuEventRecord` of a
/// task-graph capture; `warpline fuzz` on the H200, issue 19). Captures begun outside warpline
/// (a raw `cuStreamBeginCapture` through interop) are not counted.
pub(crate) struct CapturesExcluded(());

/// A [`CapturesExcluded`], or `None` at once while a capture is open (the caller retries later:
/// it never waits on a capture, which may itself wait on the caller).
pub(crate) fn exclude_captures() -> Option<CapturesExcluded> {
    let mut c = census();
    if c.open > 0 || c.excluded {
        return None;
    }
    c.excluded = true;
    Some(CapturesExcluded(()))
}

impl Drop for CapturesExcluded {
    fn drop(&mut self) {
        census().excluded = false;
        CENSUS_CV.notify_all();
    }
}

thread_local! {
    /// Captures this thread has begun and not yet ended ([`stream_begin_capture`],
    /// [`stream_end_capture`]).
    static CAPTURES_OPEN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// True while this thread has a stream capture open. Such a thread must not query events or
/// streams (`cuEventQuery`, `cuStreamQuery`): in `THREAD_LOCAL` capture mode those calls are
/// prohibited and invalidate the capture (`CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`; found by
/// `warpline fuzz` on the H100, issue 19).
pub(crate) fn thread_is_capturing() -> bool {
    CAPTURES_OPEN.with(|n| n.get() > 0)
}

/// `cuStreamEndCapture`: ends the capture begun on `stream` and returns the captured graph
/// (null when the capture was invalidated; the caller owns a non-null one).
///
/// # Safety
/// `stream` is a live stream of the current context that is capturing.
pub(crate) unsafe fn stream_end_capture(stream: sys::CUstream) -> (sys::CUgraph, Result<()>) {
    let mut graph: sys::CUgraph = null_mut();
    let r = sys::cuStreamEndCapture(stream, &mut graph).call("cuStreamEndCapture");
    CAPTURES_OPEN.with(|n| n.set(n.get().saturating_sub(1)));
    capture_closes();
    (graph, r)
}

/// `cuStreamIsCapturing`: true while `stream` is capturing (active or invalidated capture).
///
/// # Safety
/// `stream` is a live stream of the current context.
pub(crate) unsafe fn stream_is_capturing(stream: sys::CUstream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    sys::cuStreamIsCapturing(stream, &mut status).call("cuStreamIsCapturing")?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// `cuGraphInstantiateWithFlags` with flags 0.
///
/// # Safety
/// `graph` is a live graph of the current context.
pub(crate) unsafe fn graph_instantiate(graph: sys::CUgraph) -> Result<sys::CUgraphExec> {
    let mut exec: sys::CUgraphExec = null_mut();
    sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0).call("cuGraphInstantiateWithFlags")?;
    Ok(exec)
}

/// `cuGraphLaunch`.
///
/// # Safety
/// `exec` and `stream` are live handles of the current context; no other thread uses `exec`
/// concurrently; everything the graph's nodes touch stays alive until the launch completes.
pub(crate) unsafe fn graph_launch(exec: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
    sys::cuGraphLaunch(exec, stream).call("cuGraphLaunch")
}

/// `cuGraphExecDestroy`.
///
/// # Safety
/// `exec` is a live executable graph, not used afterwards.
pub(crate) unsafe fn graph_exec_destroy(exec: sys::CUgraphExec) -> Result<()> {
    sys::cuGraphExecDestroy(exec).call("cuGraphExecDestroy")
}

/// `cuGraphDestroy`.
///
/// # Safety
/// `graph` is a live graph, not used afterwards.
pub(crate) unsafe fn graph_destroy(graph: sys::CUgraph) -> Result<()> {
    sys::cuGraphDestroy(graph).call("cuGraphDestroy")
}

/// `cuGraphGetEdges_v2`: with null arrays, only the count; otherwise fills up to `*count` edges.
///
/// # Safety
/// `graph` is live; each non-null array holds at least `*count` entries.
pub(crate) unsafe fn graph_get_edges(
    graph: sys::CUgraph,
    from: *mut sys::CUgraphNode,
    to: *mut sys::CUgraphNode,
    data: *mut sys::CUgraphEdgeData,
    count: &mut usize,
) -> Result<()> {
    sys::cuGraphGetEdges_v2(graph, from, to, data, count).call("cuGraphGetEdges_v2")
}

/// `cuLaunchHostFunc`: `f(data)` runs on a driver thread once the stream's earlier work is done.
///
/// # Safety
/// `stream` is live; `data` stays valid until `f` has run (or, on error, was never handed over);
/// `f` never unwinds and makes no CUDA call.
pub(crate) unsafe fn launch_host_func(
    stream: sys::CUstream,
    f: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
) -> Result<()> {
    sys::cuLaunchHostFunc(stream, Some(f), data).call("cuLaunchHostFunc")
}

/// An owned `CUgraph`, destroyed on drop (`cuGraphDestroy`). `Send`, not `Sync`: CUDA graph
/// objects are not internally synchronised.
pub(crate) struct CudaGraph(sys::CUgraph);

// SAFETY: a graph handle may be used from any thread, one at a time (no `Sync`).
unsafe impl Send for CudaGraph {}

impl CudaGraph {
    pub(crate) fn raw(&self) -> sys::CUgraph {
        self.0
    }
}

impl Drop for CudaGraph {
    fn drop(&mut self) {
        // No CUDA call inside a task graph host callback (issue 19, item 9): leaked there.
        if !self.0.is_null() && !super::callback::in_host_callback() {
            // SAFETY: the graph is ours and used by no one else; failures cannot be reported.
            let _ = unsafe { graph_destroy(self.0) };
        }
    }
}

/// An owned `CUgraphExec`, destroyed on drop (`cuGraphExecDestroy`; a launch in flight completes
/// first, per the CUDA documentation, but what its nodes touch must still be kept alive by the
/// owner). `Send`, not `Sync`: launches of one executable graph must not race.
pub(crate) struct GraphExec(sys::CUgraphExec);

// SAFETY: an executable graph may be used from any thread, one at a time (no `Sync`).
unsafe impl Send for GraphExec {}

impl GraphExec {
    /// Instantiates `graph` (`cuGraphInstantiateWithFlags`).
    pub(crate) fn instantiate(graph: &CudaGraph) -> Result<Self> {
        // SAFETY: a live graph owned by `graph`.
        unsafe { graph_instantiate(graph.raw()) }.map(GraphExec)
    }

    /// `cuGraphLaunch` on `stream`. `&self` is enough: the type is not `Sync`, so launches
    /// through it never race across threads.
    ///
    /// # Safety
    /// `stream` is a live stream of the graph's context; everything the nodes touch stays alive
    /// until the launch completes.
    pub(crate) unsafe fn launch(&self, stream: sys::CUstream) -> Result<()> {
        graph_launch(self.0, stream)
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // No CUDA call inside a task graph host callback (issue 19, item 9): leaked there (a
        // launch in flight keeps running; what its nodes touch is its owner's to keep).
        if !self.0.is_null() && !super::callback::in_host_callback() {
            // SAFETY: ours, not used afterwards; failures cannot be reported.
            let _ = unsafe { graph_exec_destroy(self.0) };
        }
    }
}

/// A stream capture in progress. [`CaptureGuard::end`] ends it and returns the graph; dropping
/// the guard instead (an error path or a panic unwinding through the capture) joins the forked
/// streams back, ends the capture and destroys the partial graph, so no stream is left in capture
/// mode (where stream-ordered frees fail).
///
/// It holds the cudarc streams (`Arc<CudaStream>`, what [`crate::Stream`] wraps) so that this
/// layer imports nothing above it; callers pass `Stream::cudarc()` and keep their `Stream`s
/// alive past the guard.
pub(crate) struct CaptureGuard {
    origin: Arc<CudaStream>,
    forked: Vec<Arc<CudaStream>>,
    active: bool,
}

impl CaptureGuard {
    /// Begins a thread-local capture on `origin`; `forked` are the streams the capture will fork
    /// to (joined back on every path).
    pub(crate) fn begin(origin: &Arc<CudaStream>, forked: Vec<Arc<CudaStream>>) -> Result<Self> {
        // SAFETY: a live stream; the caller bound its context.
        if unsafe { stream_is_capturing(origin.cu_stream()) }? {
            return Err(crate::error::Error::BadShape {
                what: "stream capture",
                detail: "the stream is already capturing; allowed: a stream outside any capture"
                    .into(),
            });
        }
        // SAFETY: as above.
        unsafe { stream_begin_capture(origin.cu_stream()) }?;
        Ok(Self {
            origin: origin.clone(),
            forked,
            active: true,
        })
    }

    fn join_forked(&self) -> Result<()> {
        for s in &self.forked {
            self.origin.join(s).call("cuStreamWaitEvent")?;
        }
        Ok(())
    }

    /// Joins the forked streams and ends the capture: the captured graph.
    pub(crate) fn end(mut self) -> Result<CudaGraph> {
        let joined = self.join_forked();
        self.active = false;
        // SAFETY: the capture begun in `begin` on a live stream.
        let (graph, ended) = unsafe { stream_end_capture(self.origin.cu_stream()) };
        let graph = CudaGraph(graph);
        joined?;
        ended?;
        Ok(graph)
    }
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        if self.active {
            let _ = self.join_forked();
            // SAFETY: the capture begun in `begin`; the partial graph (if any) is destroyed.
            let (graph, _) = unsafe { stream_end_capture(self.origin.cu_stream()) };
            drop(CudaGraph(graph));
        }
    }
}

/// Finding 9 (issue 9), checked at compile time: CUDA forbids unsynchronised concurrent use of
/// one graph, so the handles move between threads but are never shared.
#[cfg(test)]
mod finding_09_graph_handles_are_send_but_not_sync {
    use static_assertions::{assert_impl_all, assert_not_impl_any};

    assert_impl_all!(super::GraphExec: Send);
    assert_impl_all!(super::CudaGraph: Send);
    assert_not_impl_any!(super::GraphExec: Sync);
    assert_not_impl_any!(super::CudaGraph: Sync);
}

/// The capture census (issue 19): a context-synchronising call is excluded while any capture is
/// open, and a capture that begins while one runs waits for it.
#[cfg(test)]
mod capture_census {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    #[test]
    fn issue19_frees_wait_for_open_captures_and_captures_wait_for_running_frees() {
        capture_opens();
        assert!(exclude_captures().is_none(), "a free ran during a capture");
        capture_opens();
        capture_closes();
        assert!(exclude_captures().is_none(), "one capture is still open");
        capture_closes();
        let excluded = exclude_captures().expect("no capture is open");
        assert!(exclude_captures().is_none(), "two frees at once");
        let begun = Arc::new(AtomicBool::new(false));
        let b = begun.clone();
        let t = std::thread::spawn(move || {
            capture_opens();
            b.store(true, Ordering::SeqCst);
            capture_closes();
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !begun.load(Ordering::SeqCst),
            "a capture began during a free"
        );
        drop(excluded);
        t.join().unwrap();
        assert!(begun.load(Ordering::SeqCst));
        assert!(exclude_captures().is_some(), "the census is back to zero");
    }
}
