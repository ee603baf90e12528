//! Streams and events. Every stream warpline creates is non-blocking: nothing is ever queued on,
//! or implicitly ordered with, the legacy default stream.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaStream};

use crate::device::{bind_context, bind_context_unchecked, defer_error, state_for};
use crate::driver::core as drv;
use crate::error::Result;

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
        if crate::device::in_host_callback() {
            let s = self.inner.clone();
            crate::memory::reaper::defer_after(Vec::<Event>::new(), false, move || drop(s));
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

    /// Blocks the host until all work queued on the stream has finished (`cuStreamSynchronize`).
    ///
    /// It really waits before returning any error: errors cudarc left over from earlier `Drop`s
    /// are not returned in place of the wait (see [`crate::Device::take_deferred_errors`]), and a
    /// poisoned context still gets the synchronise call (which then returns its sticky error as
    /// [`crate::Error::ContextPoisoned`]). Inside a task graph host callback it returns
    /// [`crate::Error::InHostCallback`] at once (the wait could never end there).
    pub fn synchronize(&self) -> Result<()> {
        // Inside a host callback the wait would never return (issue 19, item 9).
        crate::device::refuse_in_host_callback("Stream::synchronize")?;
        let bound = bind_context_unchecked(self.ctx());
        // cuStreamSynchronize takes the stream's own context; it is called even if binding failed.
        let synced = drv::stream_synchronize(self.raw());
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

/// Events warpline holds at the moment, process-wide (created by [`Stream::record`], not yet
/// dropped). For tests and leak checks.
pub fn live_events() -> usize {
    LIVE_EVENTS.load(Ordering::Relaxed)
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

    /// Blocks the host until the event has completed (`cuEventSynchronize`); it really waits
    /// before returning any error, as [`Stream::synchronize`] (and, like it, refuses to wait
    /// inside a task graph host callback: [`crate::Error::InHostCallback`]).
    pub fn synchronize(&self) -> Result<()> {
        crate::device::refuse_in_host_callback("Event::synchronize")?;
        let bound = bind_context_unchecked(&self.ctx);
        drv::event_synchronize(self.raw)?;
        bound?;
        state_for(self.ctx.cu_ctx()).check("cuEventSynchronize")
    }

    /// True once the event has completed (`cuEventQuery`).
    pub fn is_complete(&self) -> Result<bool> {
        bind_context(&self.ctx, "cuEventQuery")?;
        drv::event_query(self.raw)
    }
}
