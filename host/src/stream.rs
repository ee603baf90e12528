//! Streams and events. Every stream warpline creates is non-blocking: nothing is ever queued on,
//! or implicitly ordered with, the legacy default stream.

use std::sync::Arc;

use cudarc::driver::sys;
use cudarc::driver::{CudaEvent, CudaStream};

use crate::error::{CudaCall, Result};

/// A non-blocking CUDA stream. Clones share the same stream.
#[derive(Clone, Debug)]
pub struct Stream {
    inner: Arc<CudaStream>,
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

    /// The driver handle.
    pub fn raw(&self) -> sys::CUstream {
        self.inner.cu_stream()
    }

    /// The driver handle of the stream's context (for identity checks).
    pub(crate) fn context_raw(&self) -> sys::CUcontext {
        self.inner.context().cu_ctx()
    }

    /// The cudarc stream (for interop, e.g. cuBLAS baselines).
    pub fn cudarc(&self) -> &Arc<CudaStream> {
        &self.inner
    }

    /// Blocks the host until all work queued on the stream has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize().call("cuStreamSynchronize")
    }

    /// Records a timing event at this point of the stream.
    pub fn record(&self) -> Result<Event> {
        let ev = self
            .inner
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .call("cuEventRecord")?;
        Ok(Event { inner: ev })
    }

    /// Makes later work on this stream wait for `event` (cuStreamWaitEvent).
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.inner.wait(&event.inner).call("cuStreamWaitEvent")
    }
}

/// A CUDA event recorded on a stream (timing enabled).
#[derive(Debug)]
pub struct Event {
    inner: CudaEvent,
}

impl Event {
    /// Milliseconds from `self` to `later` (both completed; cuEventElapsedTime).
    pub fn elapsed_ms(&self, later: &Event) -> Result<f32> {
        self.inner
            .elapsed_ms(&later.inner)
            .call("cuEventElapsedTime")
    }

    /// Blocks the host until the event has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.inner.synchronize().call("cuEventSynchronize")
    }

    /// True once the event has completed.
    pub fn is_complete(&self) -> Result<bool> {
        self.inner.try_is_complete().call("cuEventQuery")
    }
}
