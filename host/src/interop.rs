//! Interop with [cudarc](https://crates.io/crates/cudarc) (issue 22, item 10): bring a cudarc
//! `CudaStream` and `CudaSlice<T>` (what candle and other Rust stacks hand out) to warpline's
//! kernels and launchers, and hand warpline's streams and buffers to cudarc-based code.
//!
//! The rules are warpline's own (see `DeviceBuffer` and docs/safety.md):
//! - **Context.** Everything used together belongs to one CUDA context: a stream taken from
//!   cudarc must be of the [`Device`]'s context, a slice of its stream's context. The primary
//!   context of a GPU is one context however many `CudaContext` objects retain it, so
//!   `cudarc::driver::CudaContext::new(0)` and `warpline::Device::open(0)` work together.
//!   Checked: [`Error::WrongContext`].
//! - **Stream binding.** Memory is used on the stream it is bound to, so its stream-ordered free
//!   follows every use. A cudarc slice is bound to its own stream (`CudaSlice::stream`, on which
//!   cudarc frees it): it can be viewed by warpline only on that stream, i.e. on the warpline
//!   [`Stream`] made from that same `CudaStream` ([`Stream::from_cudarc`]). Checked:
//!   [`Error::WrongStream`].
//! - **cudarc's event tracking.** A [`CudarcView`] / [`CudarcViewMut`] holds the guard of
//!   cudarc's `DevicePtr::device_ptr` / `DevicePtrMut::device_ptr_mut` for as long as warpline may
//!   queue work on the memory, and drops it after: when the slice's context tracks events,
//!   cudarc records the read (write) on the slice's stream then, so cudarc's later uses of the
//!   slice on other streams are ordered after warpline's kernels, as after its own.
//! - **Streams warpline assumes** are non-blocking (never the legacy default stream or the
//!   per-thread stream) and not capturing. [`Stream::from_cudarc`] checks both at the
//!   conversion; that nobody *begins* a capture on the stream afterwards (cudarc's
//!   `begin_capture` is safe) cannot be checked, which is why it is `unsafe`.
//! - **The other way** ([`DeviceBuffer::cudarc_slice`], [`Stream::cudarc_stream`]) hands out
//!   objects of warpline's context, where cudarc's event tracking is off (warpline orders its
//!   memory by stream binding instead): cudarc then orders nothing across streams by itself, so
//!   both are `unsafe`, with the rule in their `# Safety`.
//!
//! `host/examples/cudarc_interop.rs` runs `TcGemm` on cudarc-allocated memory.

use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, SyncOnDrop};

use crate::device::Device;
use crate::driver::core as drv;
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, DeviceView, DeviceViewMut};
use crate::stream::Stream;

/// The legacy default stream's handle (`CU_STREAM_LEGACY`, also the null stream) and the
/// per-thread default stream's (`CU_STREAM_PER_THREAD`): streams warpline never takes.
const LEGACY: usize = 0x1;
const PER_THREAD: usize = 0x2;

impl Stream {
    /// Takes a cudarc stream as a warpline [`Stream`] of `dev` (the `Arc` is kept: the stream
    /// lives while either side holds it).
    ///
    /// Checked (errors before anything is used): the stream belongs to `dev`'s context
    /// ([`Error::WrongContext`]); it is a stream of its own, not the legacy default (null)
    /// stream or the per-thread stream, it was created non-blocking (`CU_STREAM_NON_BLOCKING`,
    /// what `CudaContext::new_stream` makes), and it is not capturing a graph
    /// ([`Error::CudarcInterop`]); [`Error::Cuda`] (`cuStreamGetFlags`, `cuStreamIsCapturing`).
    ///
    /// # Safety
    /// Nobody begins a stream capture on this stream (cudarc's `CudaStream::begin_capture`, or a
    /// raw `cuStreamBeginCapture`) while the returned [`Stream`], a clone of it, or anything
    /// bound to it (buffers, plans, task graphs) lives: warpline's safe API relies on its streams
    /// not capturing (issue 19, item 2). The stream is not destroyed while they live (an owned
    /// `CudaStream` is not; one made by `CudaContext::wrap_borrowed_stream` must be kept alive by
    /// its owner, as that function's contract already says).
    pub unsafe fn from_cudarc(dev: &Device, stream: Arc<CudaStream>) -> Result<Self> {
        if stream.context().cu_ctx() != dev.raw_context() {
            return Err(Error::WrongContext {
                what: "Stream::from_cudarc (the cudarc stream belongs to another context than the device's)",
            });
        }
        let raw = stream.cu_stream() as usize;
        if raw == 0 || raw == LEGACY || raw == PER_THREAD {
            return Err(Error::CudarcInterop {
                what: "Stream::from_cudarc",
                detail: "the stream is the legacy default (null) stream or the per-thread stream; allowed: a stream of its own, created non-blocking (CudaContext::new_stream)".into(),
            });
        }
        crate::device::bind_context(stream.context(), "cuStreamGetFlags")?;
        // Capture first: cuStreamGetFlags itself fails on a capturing stream (seen on the H100).
        // SAFETY: a live stream handle of the bound context (the Arc keeps it).
        if unsafe { crate::driver::graph::stream_is_capturing(stream.cu_stream()) }? {
            return Err(Error::CudarcInterop {
                what: "Stream::from_cudarc",
                detail: "the stream is capturing a graph; allowed: a stream that is not capturing (end the capture first)".into(),
            });
        }
        let flags = drv::stream_get_flags(stream.cu_stream())?;
        if flags & cudarc::driver::sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32 == 0 {
            return Err(Error::CudarcInterop {
                what: "Stream::from_cudarc",
                detail: format!(
                    "the stream was created blocking (flags {flags:#x}: it synchronises with the legacy default stream); allowed: CU_STREAM_NON_BLOCKING streams (CudaContext::new_stream)"
                ),
            });
        }
        Ok(Stream::new(stream))
    }
}

/// The element-type and binding checks shared by both view kinds; returns the element count of
/// `T` (cudarc's element is `U`).
fn check_slice<T: Pod, U>(
    what: &'static str,
    s: &CudaStream,
    len: usize,
    stream: &Stream,
) -> Result<usize> {
    if size_of::<U>() != size_of::<T>() || align_of::<U>() > 256 || size_of::<T>() == 0 {
        return Err(Error::CudarcInterop {
            what,
            detail: format!(
                "the slice holds {} ({} bytes), the view {} ({} bytes); allowed: element types of the same non-zero size (e.g. u16 as bf16)",
                std::any::type_name::<U>(),
                size_of::<U>(),
                std::any::type_name::<T>(),
                size_of::<T>()
            ),
        });
    }
    if s.context().cu_ctx() != stream.context_raw() {
        return Err(Error::WrongContext { what });
    }
    if s.cu_stream() != stream.raw() {
        return Err(Error::WrongStream { what });
    }
    Ok(len)
}

/// A cudarc slice (or view) seen as a warpline [`DeviceView`] on its own stream, for as long
/// as this value lives. See the module docs for the rules it checks.
pub struct CudarcView<'a, T> {
    ptr: u64,
    len: usize,
    stream: &'a Stream,
    /// cudarc's read guard: records the read on the slice's stream when this value drops.
    _sync: SyncOnDrop<'a>,
    _t: PhantomData<&'a T>,
}

impl<'a, T: Pod> CudarcView<'a, T> {
    /// Views `slice` (a `CudaSlice<U>`, `CudaView<U>` or `CudaViewMut<U>`) as `len` elements of
    /// `T` on `stream`, which must be the slice's own stream (the same `CudaStream`, taken with
    /// [`Stream::from_cudarc`]). `U` and `T` are plain data of the same size (`u16` may be seen as
    /// `bf16`).
    ///
    /// Errors: [`Error::CudarcInterop`] (element sizes differ), [`Error::WrongContext`],
    /// [`Error::WrongStream`] (the slice is bound to another stream: use it there, or copy it).
    pub fn new<U, S: DevicePtr<U>>(slice: &'a S, stream: &'a Stream) -> Result<Self> {
        let s = slice.stream();
        let len = check_slice::<T, U>("CudarcView::new", s, slice.len(), stream)?;
        // Through the slice's own CudaStream (the same CUstream as `stream`): cudarc makes it
        // wait for the slice's last write and records the read with the slice's context's
        // tracking settings.
        let (ptr, sync) = slice.device_ptr(s);
        Ok(Self {
            ptr,
            len,
            stream,
            _sync: sync,
            _t: PhantomData,
        })
    }

    /// The warpline view (for a launcher or a typed kernel launch on the stream).
    pub fn view(&self) -> DeviceView<'_, T> {
        // SAFETY: `ptr` addresses `len` elements of T of a live cudarc allocation (borrowed for
        // 'a, longer than the returned view), bound to `stream` (checked in `new`).
        unsafe { DeviceView::from_raw_parts(self.ptr, self.len, self.stream) }
    }
}

/// A cudarc slice (or mutable view) seen as a warpline [`DeviceViewMut`] on its own stream, for
/// as long as this value lives (as [`CudarcView`], for writing).
pub struct CudarcViewMut<'a, T> {
    ptr: u64,
    len: usize,
    stream: &'a Stream,
    /// cudarc's write guard: records the write on the slice's stream when this value drops.
    _sync: SyncOnDrop<'a>,
    _t: PhantomData<&'a mut T>,
}

impl<'a, T: Pod> CudarcViewMut<'a, T> {
    /// As [`CudarcView::new`], borrowing the slice exclusively (cudarc's `DevicePtrMut`).
    /// Errors as [`CudarcView::new`].
    pub fn new<U, S: DevicePtrMut<U>>(slice: &'a mut S, stream: &'a Stream) -> Result<Self> {
        let s = slice.stream().clone();
        let len = check_slice::<T, U>("CudarcViewMut::new", &s, slice.len(), stream)?;
        // The guard must borrow a CudaStream that lives for 'a: warpline's Stream holds the same
        // CudaStream (the Arc `from_cudarc` took, or a clone of it) for 'a.
        let own = stream.cudarc();
        if !Arc::ptr_eq(own, &s) && **own != *s {
            return Err(Error::WrongStream {
                what: "CudarcViewMut::new",
            });
        }
        let (ptr, sync) = slice.device_ptr_mut(own);
        Ok(Self {
            ptr,
            len,
            stream,
            _sync: sync,
            _t: PhantomData,
        })
    }

    /// The warpline view.
    pub fn view(&self) -> DeviceView<'_, T> {
        // SAFETY: as in `CudarcView::view`; a shared view of memory this value borrows
        // exclusively, for the shared borrow of self.
        unsafe { DeviceView::from_raw_parts(self.ptr, self.len, self.stream) }
    }

    /// The warpline mutable view (for a launcher's output or a typed kernel launch).
    pub fn view_mut(&mut self) -> DeviceViewMut<'_, T> {
        // SAFETY: as in `CudarcView::view`; the slice is borrowed exclusively for 'a and the
        // returned view borrows self mutably, so it is the only access.
        unsafe { DeviceViewMut::from_raw_parts(self.ptr, self.len, self.stream) }
    }
}

/// A warpline buffer seen as a cudarc `CudaSlice<T>` on the buffer's stream, for as long as
/// this value lives ([`DeviceBuffer::cudarc_slice`]). Dereferences to `&CudaSlice<T>` (and
/// [`Self::view_mut`] gives a `CudaViewMut`); never frees the memory, which stays the buffer's.
pub struct CudarcSlice<'a, T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    _b: PhantomData<&'a mut DeviceBuffer<T>>,
}

impl<T> std::ops::Deref for CudarcSlice<'_, T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> CudarcSlice<'_, T> {
    /// A cudarc mutable view of the whole buffer (no `DerefMut`: a `&mut CudaSlice` could be
    /// swapped with an owned one, handing the buffer's memory to cudarc's `Drop`).
    pub fn view_mut(&mut self) -> cudarc::driver::CudaViewMut<'_, T> {
        self.slice.as_view_mut()
    }

    /// A cudarc view of the whole buffer.
    pub fn view(&self) -> CudaView<'_, T> {
        self.slice.as_view()
    }
}

impl<T> Drop for CudarcSlice<'_, T> {
    fn drop(&mut self) {
        // SAFETY: taken once, here; the slice is not used after.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // Gives the memory back without freeing it (the buffer frees it); drops cudarc's stream
        // handle and events.
        let _ = slice.leak();
    }
}

impl<T: Pod> DeviceBuffer<T> {
    /// The buffer as a cudarc `CudaSlice<T>` bound to the buffer's stream (the same
    /// `CudaStream`), borrowing the buffer exclusively while it lives: for cudarc-based code
    /// (cuBLAS through cudarc, candle's kernels) to read or write warpline's memory.
    ///
    /// # Safety
    /// The slice belongs to warpline's context, where cudarc's event tracking is off, so cudarc
    /// orders nothing across streams for it: use it with cudarc only on the buffer's stream (the
    /// slice's own, `CudaSlice::stream`), or order any other stream after the buffer's stream
    /// yourself before and the buffer's stream after it (events), so that the buffer's
    /// stream-ordered free follows every use. Do not begin a stream capture on it (as
    /// [`Stream::cudarc_stream`]).
    pub unsafe fn cudarc_slice(&mut self) -> CudarcSlice<'_, T> {
        let stream = self.stream().cudarc().clone();
        // SAFETY: the buffer's live allocation of `len` initialised (Pod) elements, borrowed
        // exclusively for the returned value's life; `CudarcSlice` never frees it (leak on drop)
        // and cannot hand the CudaSlice out by value or by `&mut`.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(self.device_ptr(), self.len()) };
        CudarcSlice {
            slice: ManuallyDrop::new(slice),
            _b: PhantomData,
        }
    }
}
