//! `Signal`: a u32 or u64 flag in device memory that streams wait on and write without holding an
//! SM, like NVSHMEM's `signal_wait_until_on_stream` / `signal_op_on_stream`, built on the CUDA
//! driver's stream memory operations (`cuStreamWaitValue32/64`, `cuStreamWriteValue32/64`).
//! Kernels reach the same word through `warpline_gpu::device::signal` (acquire/release at GPU
//! scope).

use std::ffi::c_uint;
use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use bytemuck::Pod;
use cudarc::driver::{result, sys, CudaContext};

use super::watch;
use crate::device::Device;
use crate::error::{CudaCall, Error, Result};
use crate::memory::DeviceBuffer;
use crate::stream::Stream;

/// The condition of an on-stream wait (`CUstreamWaitValue_flags`): the stream continues once the
/// signal's value `s` satisfies it against the operand `v`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cmp {
    /// `s == v` (`CU_STREAM_WAIT_VALUE_EQ`).
    Eq,
    /// `s >= v`, unsigned (`CU_STREAM_WAIT_VALUE_GEQ`; compared as if the values did not wrap).
    Geq,
    /// `(s & v) != 0` (`CU_STREAM_WAIT_VALUE_AND`).
    And,
    /// `!(s | v) != 0` (`CU_STREAM_WAIT_VALUE_NOR`).
    Nor,
}

impl Cmp {
    /// Whether value `s` satisfies the condition against operand `v` (the driver's rule).
    pub fn holds(self, s: u64, v: u64) -> bool {
        match self {
            Cmp::Eq => s == v,
            Cmp::Geq => s >= v,
            Cmp::And => s & v != 0,
            Cmp::Nor => !(s | v) != 0,
        }
    }

    /// A value that satisfies the condition against `v`, if one exists (used to release a wait
    /// that timed out).
    pub fn satisfying_value(self, v: u64) -> Option<u64> {
        match self {
            Cmp::Eq | Cmp::Geq => Some(v),
            Cmp::And => (v != 0).then_some(v),
            Cmp::Nor => (v != u64::MAX).then_some(0),
        }
    }

    fn flags(self) -> c_uint {
        use sys::CUstreamWaitValue_flags as F;
        (match self {
            Cmp::Eq => F::CU_STREAM_WAIT_VALUE_EQ,
            Cmp::Geq => F::CU_STREAM_WAIT_VALUE_GEQ,
            Cmp::And => F::CU_STREAM_WAIT_VALUE_AND,
            Cmp::Nor => F::CU_STREAM_WAIT_VALUE_NOR,
        }) as c_uint
    }
}

impl std::fmt::Display for Cmp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Cmp::Eq => "==",
            Cmp::Geq => ">=",
            Cmp::And => "& !=0",
            Cmp::Nor => "nor !=0",
        })
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
}

/// The word widths stream memory operations support: `u32` and `u64`.
pub trait SignalWord: Pod + Debug + Send + Sync + Into<u64> + sealed::Sealed {
    /// `cuStreamWaitValue32` or `cuStreamWaitValue64`.
    #[doc(hidden)]
    unsafe fn wait_value(s: sys::CUstream, addr: u64, v: Self, flags: c_uint) -> sys::CUresult;
    /// `cuStreamWriteValue32` or `cuStreamWriteValue64`.
    #[doc(hidden)]
    unsafe fn write_value(s: sys::CUstream, addr: u64, v: Self, flags: c_uint) -> sys::CUresult;
    /// The value truncated from u64 (release values come from [`Cmp::satisfying_value`]).
    #[doc(hidden)]
    fn from_u64(v: u64) -> Self;
    /// Whether the device must report 64-bit stream memory operations.
    #[doc(hidden)]
    const NEEDS_64: bool;
}

impl SignalWord for u32 {
    unsafe fn wait_value(s: sys::CUstream, addr: u64, v: u32, flags: c_uint) -> sys::CUresult {
        sys::cuStreamWaitValue32_v2(s, addr, v, flags)
    }
    unsafe fn write_value(s: sys::CUstream, addr: u64, v: u32, flags: c_uint) -> sys::CUresult {
        sys::cuStreamWriteValue32_v2(s, addr, v, flags)
    }
    fn from_u64(v: u64) -> u32 {
        v as u32
    }
    const NEEDS_64: bool = false;
}

impl SignalWord for u64 {
    unsafe fn wait_value(s: sys::CUstream, addr: u64, v: u64, flags: c_uint) -> sys::CUresult {
        sys::cuStreamWaitValue64_v2(s, addr, v, flags)
    }
    unsafe fn write_value(s: sys::CUstream, addr: u64, v: u64, flags: c_uint) -> sys::CUresult {
        sys::cuStreamWriteValue64_v2(s, addr, v, flags)
    }
    fn from_u64(v: u64) -> u64 {
        v
    }
    const NEEDS_64: bool = true;
}

/// A flag in device memory (one `T`, zero at creation) for cross-stream and device-side ordering.
///
/// - [`Signal::wait_until`] makes later work on a stream wait until the value satisfies a
///   [`Cmp`]; the wait is executed by the GPU's front end, so a waiting stream holds no SM.
/// - [`Signal::set`] writes a value from a stream, after all earlier work of that stream (with a
///   memory barrier: that work's writes are visible to whoever observes the value).
/// - [`Signal::add`] (u64) adds atomically from a stream, through the one-thread kernel
///   `ws_signal_add` (`atom.add.release.gpu`), because the CUDA 12 driver API has no on-stream
///   atomic add.
/// - Kernels use `warpline_gpu::device::signal::{signal_wait_geq, signal_set, signal_add}` on
///   [`Signal::device_ptr`].
///
/// Rules (from the seeds; `docs/ordering.md`): values are best used as monotonic epochs with
/// [`Cmp::Geq`], so a signal never needs resetting; every on-stream wait needs its producer to be
/// enqueued *before* it (CUDA may funnel streams into one FIFO hardware queue), which
/// [`super::TaskGraph`] guarantees; bound waits with [`super::synchronize_timeout`].
///
/// Lifetime: the word is a cuMemAlloc allocation freed in the order of a private stream. Dropping the last clone
/// orders that stream after every stream the signal was used on (events) before the
/// stream-ordered free, so pending waits never read freed memory; a wait that never fires keeps the
/// word allocated (leaked, not freed under it).
pub struct Signal<T: SignalWord = u64> {
    pub(crate) inner: Arc<SignalInner<T>>,
}

impl<T: SignalWord> Clone for Signal<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T: SignalWord> Debug for Signal<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Signal<{}>(`{}` at {:#x})",
            std::any::type_name::<T>(),
            self.inner.label,
            self.device_ptr()
        )
    }
}

pub(crate) struct SignalInner<T: SignalWord> {
    label: String,
    ctx: Arc<CudaContext>,
    home: Stream,
    users: Mutex<Vec<Stream>>,
    // Dropped after `Drop::drop` has ordered `home` after every user stream.
    word: DeviceBuffer<T>,
}

impl<T: SignalWord> Drop for SignalInner<T> {
    fn drop(&mut self) {
        let users = self.users.get_mut().map(std::mem::take).unwrap_or_default();
        for s in users.iter().filter(|s| **s != self.home) {
            // Errors cannot be reported from drop; on failure the free below may run early only if
            // the driver itself failed, in which case the context is unusable anyway.
            if let Ok(ev) = s.record() {
                let _ = self.home.wait(&ev);
            }
        }
    }
}

impl<T: SignalWord> Signal<T> {
    /// A new signal named `label` (used in errors and timeouts), value 0.
    ///
    /// Errors: [`Error::ModuleNotFullyLoaded`] unless every kernel of the module is loaded
    /// (`cuFuncIsLoaded`; the lazy-loading hang of the stream-wait-value fence seed),
    /// [`Error::StreamMemOps64Unsupported`] for `u64` on a device without 64-bit stream memory
    /// operations, [`Error::Cuda`] (`cuMemAlloc`, `cuMemsetD32Async`, `cuStreamSynchronize`).
    pub fn new(dev: &Device, label: impl Into<String>) -> Result<Self> {
        if !dev.all_kernels_loaded()? {
            return Err(Error::ModuleNotFullyLoaded {
                what: "Signal::new",
            });
        }
        if T::NEEDS_64 && !dev.capabilities().stream_mem_ops_64 {
            return Err(Error::StreamMemOps64Unsupported {
                what: "Signal<u64>",
            });
        }
        let home = dev.new_stream()?;
        dev.bind()?;
        let bytes = size_of::<T>();
        // A plain cuMemAlloc, not the stream-ordered pool: on the H100 (driver 580) stream memory
        // operations on pool memory failed with CUDA_ERROR_INVALID_VALUE.
        // SAFETY: an allocation of one word, owned by the buffer below.
        let ptr = unsafe { result::malloc_sync(bytes) }.call("cuMemAlloc")?;
        // SAFETY: ptr/bytes describe the allocation just made; ordered on `home`.
        let word = unsafe { DeviceBuffer::from_raw(ptr, 1, home.clone(), dev.context().clone()) };
        // SAFETY: the allocation holds bytes/4 words of 32 bits; ordered after the allocation.
        unsafe { sys::cuMemsetD32Async(ptr, 0, bytes / 4, home.raw()) }.call("cuMemsetD32Async")?;
        home.synchronize()?;
        Ok(Self {
            inner: Arc::new(SignalInner {
                label: label.into(),
                ctx: dev.context().clone(),
                home,
                users: Mutex::new(Vec::new()),
                word,
            }),
        })
    }

    /// The name given at creation.
    pub fn label(&self) -> &str {
        &self.inner.label
    }

    /// Device address of the word (8-byte aligned), for kernels that wait on or set it
    /// (`warpline_gpu::device::signal`). Kernels using it are not tracked: they must have
    /// completed before the last clone of the signal is dropped.
    pub fn device_ptr(&self) -> u64 {
        self.inner.word.device_ptr()
    }

    /// Makes every operation enqueued on `stream` after this call wait until the signal's value
    /// satisfies `cmp` against `value` (`cuStreamWaitValue32/64`). Returns at once; the stream holds
    /// no SM while it waits. The wait is recorded for [`super::synchronize_timeout`].
    ///
    /// Deadlock rule: enqueue the operation that will satisfy the wait *before* this call (or
    /// make it independent of every stream that CUDA may serialise with `stream`); see
    /// `docs/ordering.md`. Errors: [`Error::Cuda`].
    pub fn wait_until(&self, stream: &Stream, cmp: Cmp, value: T) -> Result<()> {
        self.enqueue_wait(stream, cmp, value)?;
        let done = stream
            .cudarc()
            .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
            .call("cuEventRecord")?;
        watch::register_stream_wait(
            stream,
            format!("signal wait `{}` {cmp} {value:?}", self.inner.label),
            Arc::new(self.clone()),
            cmp,
            value.into(),
            done,
        );
        Ok(())
    }

    /// Writes `value` from `stream` once all earlier work of `stream` has completed, with a
    /// memory barrier before the write (`cuStreamWriteValue32/64`, `CU_STREAM_WRITE_VALUE_DEFAULT`).
    /// Errors: [`Error::Cuda`].
    pub fn set(&self, stream: &Stream, value: T) -> Result<()> {
        self.enqueue_write(stream, value)
    }

    /// Reads the current value from the host (a D2H copy on the signal's private stream, then a
    /// synchronize). For tests and diagnostics; it does not order anything.
    pub fn read(&self) -> Result<T> {
        let mut v = [T::zeroed()];
        self.inner.word.copy_to_host(&mut v)?;
        Ok(v[0])
    }

    pub(crate) fn enqueue_wait(&self, stream: &Stream, cmp: Cmp, value: T) -> Result<()> {
        self.note_user(stream);
        self.inner.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: the word is a live device allocation of one T, kept alive until every user
        // stream has passed this point (Drop of SignalInner).
        unsafe { T::wait_value(stream.raw(), self.device_ptr(), value, cmp.flags()) }.call(
            if T::NEEDS_64 {
                "cuStreamWaitValue64_v2"
            } else {
                "cuStreamWaitValue32_v2"
            },
        )
    }

    pub(crate) fn enqueue_write(&self, stream: &Stream, value: T) -> Result<()> {
        self.note_user(stream);
        self.inner.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as c_uint;
        // SAFETY: as in enqueue_wait.
        unsafe { T::write_value(stream.raw(), self.device_ptr(), value, flags) }.call(
            if T::NEEDS_64 {
                "cuStreamWriteValue64_v2"
            } else {
                "cuStreamWriteValue32_v2"
            },
        )
    }

    fn note_user(&self, stream: &Stream) {
        let mut users = self.inner.users.lock().unwrap_or_else(|e| e.into_inner());
        if !users.contains(stream) {
            users.push(stream.clone());
        }
    }

    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }
}

impl Signal<u64> {
    /// Adds `value` from `stream` after its earlier work (one-thread kernel `ws_signal_add`,
    /// `atom.add.release.gpu`: a release, so the stream's earlier writes are visible to a waiter
    /// that observes the sum). Unlike [`Signal::set`] it occupies an SM for a moment.
    /// Errors: [`Error::Cuda`] (`cuLaunchKernelEx`), [`Error::MissingKernel`].
    pub fn add(&self, dev: &Device, stream: &Stream, value: u64) -> Result<()> {
        self.note_user(stream);
        // SAFETY: the word is a live, 8-byte aligned u64 allocation kept alive past this use
        // (Drop of SignalInner orders the free after `stream`); signal words are accessed only
        // by stream memory operations and atomics.
        unsafe { crate::kernels::signal::signal_add(dev, stream, self.device_ptr(), value) }
    }
}

/// A signal that a timed-out wait can be released on (object-safe view for the watchdog).
pub(crate) trait Releasable: Send + Sync {
    /// Enqueues a write of `value` on `stream` (which becomes one of the signal's users).
    fn write_on(&self, stream: &Stream, value: u64) -> Result<()>;
    fn context(&self) -> &Arc<CudaContext>;
}

impl<T: SignalWord> Releasable for Signal<T> {
    fn write_on(&self, stream: &Stream, value: u64) -> Result<()> {
        self.enqueue_write(stream, T::from_u64(value))
    }
    fn context(&self) -> &Arc<CudaContext> {
        Signal::context(self)
    }
}
