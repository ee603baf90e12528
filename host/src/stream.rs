//! Streams and events. Every stream warpline creates is non-blocking: nothing is ever queued on,
//! or implicitly ordered with, the legacy default stream.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};

use crate::context::{
    bind_context, bind_context_unchecked, defer_error, in_host_callback, refuse_in_host_callback,
    state_for, ContextState,
};
use crate::driver::core as drv;
use crate::error::{CudaCall, Result};

/// A non-blocking CUDA stream. Clones share the same stream.
#[derive(Clone, Debug)]
pub struct Stream {
    inner: Arc<CudaStream>,
}

impl Drop for Stream {
    fn drop(&mut self) {
        // Inside a task graph host callback no CUDA call may be made (issue 19, item 9), and the
        // last handle's drop destroys the stream (`cuStreamDestroy`): the reaper thread drops a
        // handle of its own instead, so this one is never the last.
        if in_host_callback() {
            let s = self.inner.clone();
            crate::reaper::defer_after(Vec::<Event>::new(), false, move || drop(s));
        }
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.raw() == other.raw()
    }
}
impl Eq for Stream {}

impl Stream {
    pub(crate) fn new(inner: Arc<CudaStream>) -> Self {
        Self { inner }
    }

    /// The driver handle (`CUstream`), for driver-API interop. Valid while a clone of this
    /// stream lives; do not destroy it.
    pub fn raw(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }

    /// The driver handle of the stream's context (`CUcontext`). Valid while the stream lives.
    pub fn context_raw(&self) -> sys::CUcontext {
        self.inner.context().cu_ctx()
    }

    /// The cudarc context of the stream, for warpline's own modules.
    pub(crate) fn ctx(&self) -> &Arc<CudaContext> {
        self.inner.context()
    }

    /// The cudarc stream, for warpline's own modules.
    pub(crate) fn cudarc(&self) -> &Arc<CudaStream> {
        &self.inner
    }

    /// The cudarc stream, for interop with cudarc-based libraries (a cuBLAS handle, say).
    ///
    /// # Safety
    /// The stream's context has cudarc's event tracking disabled (see
    /// [`crate::Device::cudarc_context`]); cudarc's safe `CudaSlice` API relies on it and races
    /// without it. The caller must not allocate or use `CudaSlice`s (or other tracking-dependent
    /// cudarc APIs) through this stream, and must not re-enable tracking. It must not begin a
    /// stream capture on it (cudarc's `begin_capture` is safe): warpline's safe API assumes the
    /// streams it is handed are not capturing (issue 19, item 2). Raw handle for driver-API
    /// interop: [`Stream::raw`].
    ///
    /// ```compile_fail,E0133
    /// // finding 10: handing out the tracking-disabled cudarc stream needs `unsafe`.
    /// fn f(s: &warpline::Stream) { let _ = s.cudarc_stream(); }
    /// ```
    pub unsafe fn cudarc_stream(&self) -> &Arc<CudaStream> {
        &self.inner
    }

    /// Blocks the host until all work queued on the stream has finished. The wait never blocks
    /// inside the driver: it records an event (`cuEventRecord`, no timing) and polls it with
    /// `cuEventQuery` (`driver::core::event_wait_polled`), because a thread blocked in
    /// `cuStreamSynchronize` behind another thread's on-stream wait can hold a driver lock that the
    /// releasing thread needs (issue 19). If the event cannot be created or recorded for a reason
    /// other than a sticky error, it falls back to `cuStreamSynchronize`.
    ///
    /// It really waits before returning any error: errors cudarc left over from earlier `Drop`s
    /// are not returned in place of the wait (see [`crate::Device::take_deferred_errors`]), and a
    /// poisoned context still gets the synchronise call (which then returns its sticky error as
    /// [`crate::Error::ContextPoisoned`]). Inside a task graph host callback it returns
    /// [`crate::Error::InHostCallback`] at once (the wait could never end there).
    pub fn synchronize(&self) -> Result<()> {
        // Inside a host callback the wait would never return (issue 19, item 9).
        refuse_in_host_callback("Stream::synchronize")?;
        let bound = bind_context_unchecked(self.ctx());
        let synced = match bound.as_ref().map(|()| self.record_marker()) {
            Ok(Ok(marker)) => drv::event_wait_polled(marker.raw),
            // cuStreamSynchronize takes the stream's own context; it is called even if binding
            // or the marker failed (on a poisoned context it returns the sticky error at once).
            _ => drv::stream_synchronize(self.raw()),
        };
        synced?;
        bound?;
        state_for(self.context_raw()).check("cuStreamSynchronize")
    }

    /// Records a timing event at this point of the stream (`cuEventCreate` + `cuEventRecord`).
    pub fn record(&self) -> Result<Event> {
        bind_context(self.ctx(), "cuEventRecord")?;
        let ev = Event {
            raw: drv::event_create()?,
            ctx: self.ctx().clone(),
        };
        LIVE_EVENTS.fetch_add(1, Ordering::Relaxed);
        drv::event_record(ev.raw, self.raw())?;
        Ok(ev)
    }

    /// Records an event without timing (`CU_EVENT_DISABLE_TIMING`: cheaper) at this point of the
    /// stream, to learn when the work before it has completed.
    pub(crate) fn record_marker(&self) -> Result<Event> {
        bind_context(self.ctx(), "cuEventRecord")?;
        let ev = Event {
            raw: drv::event_create_with(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)?,
            ctx: self.ctx().clone(),
        };
        LIVE_EVENTS.fetch_add(1, Ordering::Relaxed);
        drv::event_record(ev.raw, self.raw())?;
        Ok(ev)
    }

    /// Records `event` again at this point of the stream (reuses its driver event).
    pub fn record_into(&self, event: &mut Event) -> Result<()> {
        bind_context(self.ctx(), "cuEventRecord")?;
        drv::event_record(event.raw, self.raw())
    }

    /// Makes later work on this stream wait for `event` (`cuStreamWaitEvent`).
    pub fn wait(&self, event: &Event) -> Result<()> {
        bind_context(self.ctx(), "cuStreamWaitEvent")?;
        drv::stream_wait_event(self.raw(), event.raw)
    }
}

static LIVE_EVENTS: AtomicUsize = AtomicUsize::new(0);

/// How many streams a [`StreamTrail`] keeps before it lets the oldest go (marked by an event).
const TRAIL_STREAMS: usize = 8;

/// The streams a resource's work was queued on, so that the resource is destroyed only after
/// that work has completed: a module's launches (`loaded::ModuleKeep`, issue 19 item 4) or an
/// owned pool's stream-ordered frees (`memory::MemPool`, issue 19: `cuMemPoolDestroy` while frees
/// of its memory were still queued crashed inside the driver under compute-sanitizer). It keeps
/// the last [`TRAIL_STREAMS`] streams; an older one is let go with an event after everything
/// queued on it so far. [`StreamTrail::then_on_reaper`] runs the destroy once that work has
/// completed.
#[derive(Default)]
pub(crate) struct StreamTrail {
    /// Streams work was queued on, most recent last.
    streams: Vec<Stream>,
    /// Events after the last work on streams let go; pruned as they complete.
    events: Vec<Event>,
}

impl StreamTrail {
    /// Notes work queued on `stream` (after it was queued).
    pub(crate) fn note(&mut self, stream: &Stream) {
        if let Some(last) = self.streams.last() {
            if last.raw() == stream.raw() {
                return;
            }
        }
        if let Some(i) = self.streams.iter().position(|s| s.raw() == stream.raw()) {
            let s = self.streams.remove(i);
            self.streams.push(s);
            return;
        }
        // A thread with a capture open must not query events (the capture would be
        // invalidated), so the oldest stream is let go only outside captures; the list grows by
        // at most the streams one capture queues work on.
        if self.streams.len() >= TRAIL_STREAMS && !crate::driver::graph::thread_is_capturing() {
            let old = self.streams.remove(0);
            self.events.retain(|e| matches!(e.is_complete(), Ok(false)));
            if let Some(e) = marker_after(&old) {
                self.events.push(e);
            }
        }
        self.streams.push(stream.clone());
    }

    /// Runs `work` on the reaper thread ([`crate::reaper::defer_after`], with its gate closed
    /// when `gated`) once everything queued so far on every stream of the trail (the noted work
    /// included) has completed, marked by an event per stream; a stream that is capturing or
    /// whose context is poisoned gives none (see [`marker_after`]). Never blocks. Inside a task
    /// graph host callback no event may be recorded (issue 19, item 9): the reaper thread
    /// records them first.
    pub(crate) fn then_on_reaper(self, gated: bool, work: impl FnOnce() + Send + 'static) {
        if in_host_callback() {
            crate::reaper::defer_after(Vec::<Event>::new(), false, move || {
                self.then_on_reaper(gated, work)
            });
            return;
        }
        let mut after = self.events;
        after.extend(self.streams.iter().filter_map(marker_after));
        crate::reaper::defer_after(after, gated, work);
    }
}

/// An event after everything queued on `s` so far; `None` on a poisoned context (which runs no
/// more work) and on a stream that is capturing a graph (a record there would become a node of
/// the user's graph: the captured work is the graph's to keep, see docs/safety.md).
fn marker_after(s: &Stream) -> Option<Event> {
    bind_context(s.ctx(), "cuStreamIsCapturing").ok()?;
    // SAFETY: a live stream of the context bound just above.
    if unsafe { crate::driver::graph::stream_is_capturing(s.raw()) }.unwrap_or(true) {
        return None;
    }
    s.record_marker().ok()
}

/// Events warpline holds at the moment, process-wide (created by [`Stream::record`], not yet
/// dropped). For tests and leak checks.
pub fn live_events() -> usize {
    LIVE_EVENTS.load(Ordering::Relaxed)
}

/// The reaper polls events (never synchronises on them) before the jobs that wait for them.
impl crate::reaper::Polled for Event {
    fn finished(&self) -> bool {
        !matches!(self.is_complete(), Ok(false))
    }
}

/// A CUDA event recorded on a stream (timing enabled). Destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUevent handle may be used from any thread (driver API objects are thread-safe); the
// event owns it exclusively.
unsafe impl Send for Event {}
unsafe impl Sync for Event {}

impl Drop for Event {
    fn drop(&mut self) {
        LIVE_EVENTS.fetch_sub(1, Ordering::Relaxed);
        let r = bind_context_unchecked(&self.ctx).and_then(|()| drv::event_destroy(self.raw));
        if let Err(e) = r {
            defer_error(&self.ctx, &e);
        }
    }
}

impl Event {
    /// Milliseconds from `self` to `later` (`cuEventElapsedTime`), after waiting for both to
    /// complete. Errors: [`Error::Cuda`](crate::Error::Cuda), or the poisoned-context error.
    pub fn elapsed_ms(&self, later: &Event) -> Result<f32> {
        // cuEventElapsedTime returns NOT_READY while either event is pending: wait for both
        // first (as cudarc's CudaEvent::elapsed_ms did), so a timing read right after the
        // recording works.
        self.synchronize()?;
        later.synchronize()?;
        bind_context(&self.ctx, "cuEventElapsedTime")?;
        drv::event_elapsed_ms(self.raw, later.raw)
    }

    /// Blocks the host until the event has completed, polling `cuEventQuery` rather than
    /// blocking in `cuEventSynchronize` (see [`Stream::synchronize`]); it really waits before
    /// returning any error, as [`Stream::synchronize`] (and, like it, refuses to wait inside a
    /// task graph host callback: [`crate::Error::InHostCallback`]).
    pub fn synchronize(&self) -> Result<()> {
        refuse_in_host_callback("Event::synchronize")?;
        let bound = bind_context_unchecked(&self.ctx);
        drv::event_wait_polled(self.raw)?;
        bound?;
        state_for(self.ctx.cu_ctx()).check("cuEventSynchronize")
    }

    /// True once the event has completed (`cuEventQuery`).
    pub fn is_complete(&self) -> Result<bool> {
        bind_context(&self.ctx, "cuEventQuery")?;
        drv::event_query(self.raw)
    }
}

/// Streams a context keeps for warpline's own short-lived uses, created when a [`crate::Device`]
/// opens, so that no `cuStreamCreate` runs while an on-stream wait may be pending (it can wait
/// for the device inside the driver holding a lock the wait's release needs; issue 19):
/// - `rescue`: the streams [`crate::ordering::synchronize_timeout`] writes release values from
///   (several, so that one lands on a hardware queue the pending wait does not block);
/// - `spare`: private capture streams (task graphs, chains) and `Signal::read`, taken and given
///   back ([`SpareStream`]).
#[derive(Debug, Default)]
pub(crate) struct StreamStock {
    rescue: Mutex<Vec<Stream>>,
    spare: Mutex<Vec<Stream>>,
}

impl Drop for StreamStock {
    fn drop(&mut self) {
        // cuStreamDestroy can block (on the H100, a device drop behind a held host callback
        // did): the stock's streams are destroyed on the reaper thread, never the caller's.
        let mut streams = std::mem::take(self.rescue.get_mut().unwrap_or_else(|e| e.into_inner()));
        streams.append(self.spare.get_mut().unwrap_or_else(|e| e.into_inner()));
        if !streams.is_empty() {
            crate::reaper::defer_after(Vec::<Event>::new(), false, move || drop(streams));
        }
    }
}

/// Rescue streams made when a context's first device opens.
pub(crate) const RESCUE_STREAMS: usize = 4;
/// Spare streams made when a context's first device opens; at most [`SPARE_KEPT`] are kept.
const SPARE_STREAMS: usize = 16;
const SPARE_KEPT: usize = 32;

impl StreamStock {
    /// Fills the stock once (no-op when it already holds streams), creating streams with
    /// `create` (the gated `Device::new_stream`).
    pub(crate) fn fill(&self, mut create: impl FnMut() -> Result<Stream>) -> Result<()> {
        {
            let mut rescue = self.rescue.lock().unwrap_or_else(|e| e.into_inner());
            while rescue.len() < RESCUE_STREAMS {
                rescue.push(create()?);
            }
        }
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if spare.is_empty() {
            for _ in 0..SPARE_STREAMS {
                spare.push(create()?);
            }
        }
        Ok(())
    }

    /// The rescue streams (clones).
    pub(crate) fn rescue(&self) -> Vec<Stream> {
        self.rescue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn take_spare(&self) -> Option<Stream> {
        self.spare.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn give_back(&self, s: Stream) {
        let mut spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        if spare.len() < SPARE_KEPT {
            spare.push(s);
        }
    }
}

/// A stream taken from the context's [`StreamStock`] (or created when the stock is empty), given
/// back on drop if nothing else holds it and its queued work has completed; otherwise dropped.
pub(crate) struct SpareStream {
    stream: Option<Stream>,
    state: Arc<ContextState>,
}

impl SpareStream {
    /// A spare stream of context `ctx` (a device's: `Device::context`): from the stock, else a
    /// new one (gated: see `Device::new_stream`).
    pub(crate) fn take_in(ctx: &Arc<CudaContext>) -> Result<Self> {
        let state = state_for(ctx.cu_ctx());
        let stream = match state.ext::<StreamStock>().take_spare() {
            Some(s) => s,
            None => gated_new_stream(ctx, None, "a spare stream (cuStreamCreate)")?,
        };
        Ok(Self {
            stream: Some(stream),
            state,
        })
    }

    /// The stream (a clone: a clone kept past this guard's drop keeps the stream out of the
    /// stock).
    pub(crate) fn stream(&self) -> &Stream {
        self.stream.as_ref().expect("present until drop")
    }
}

impl Drop for SpareStream {
    fn drop(&mut self) {
        let Some(s) = self.stream.take() else { return };
        if in_host_callback() {
            return; // Stream's own drop defers the destroy
        }
        // Only a stream nobody else holds and with nothing queued goes back: its next user must
        // not wait for this one's work or share it with code that kept a clone.
        let alone = Arc::strong_count(&s.inner) == 1;
        if alone && drv::stream_query(s.raw()).unwrap_or(false) {
            self.state.ext::<StreamStock>().give_back(s);
        }
    }
}

/// A new non-blocking stream of `ctx` (with `priority` if given), created only while no
/// registered on-stream wait is pending: waits up to `Device::STREAM_CREATE_WAIT` for them to
/// clear (see `Device::new_stream`), else [`crate::Error::WaitPending`].
pub(crate) fn gated_new_stream(
    ctx: &Arc<CudaContext>,
    priority: Option<i32>,
    what: &'static str,
) -> Result<Stream> {
    bind_context(ctx, "cuStreamCreate")?;
    let _gate = crate::reaper::close_for_create(what, crate::reaper::STREAM_CREATE_WAIT)?;
    let s = match priority {
        None => ctx.new_stream().call("cuStreamCreate")?,
        Some(p) => ctx
            .new_stream_with_priority(p)
            .call("cuStreamCreateWithPriority")?,
    };
    Ok(Stream::new(s))
}
