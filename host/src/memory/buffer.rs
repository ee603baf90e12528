//! `DeviceBuffer<T>`: a stream-ordered device allocation bound to one stream, and views into it.
//!
//! Binding a buffer to a stream is what makes the asynchronous API safe: every kernel and copy
//! that touches the buffer is queued on that stream (launchers check it and return
//! [`Error::WrongStream`] otherwise), so the stream-ordered free in `Drop` comes after all of them.
//! To use a buffer on another stream, move it there with [`DeviceBuffer::move_to_stream`], which
//! orders the new stream after the old one with an event.

use std::marker::PhantomData;
use std::ops::Range;
use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{result, sys, CudaContext};

use crate::error::{CudaCall, Error, Result};
use crate::stream::Stream;

/// `len` elements of `T` in device memory, allocated from a [`super::MemPool`] on `stream` and freed
/// on it (`cuMemFreeAsync`) when dropped.
pub struct DeviceBuffer<T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Stream,
    ctx: Arc<CudaContext>,
    _t: PhantomData<T>,
}

// SAFETY: the buffer owns device memory; moving the handle between threads is fine, and all access
// goes through stream-ordered driver calls.
unsafe impl<T: Send> Send for DeviceBuffer<T> {}
unsafe impl<T: Sync> Sync for DeviceBuffer<T> {}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the allocation is ours; every use of it was queued on `self.stream` (type
            // invariant), so the stream-ordered free follows them. A failure cannot be reported from
            // drop; the memory then stays in the pool until the context goes.
            let _ = unsafe { result::free_async(self.ptr, self.stream.raw()) };
        }
    }
}

impl<T> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "DeviceBuffer<{}>[{}] at {:#x}",
            std::any::type_name::<T>(),
            self.len,
            self.ptr
        )
    }
}

impl<T: Pod> DeviceBuffer<T> {
    /// # Safety
    /// `ptr` is a live stream-ordered allocation of at least `len` T, usable on `stream`, owned by
    /// the returned buffer.
    pub(crate) unsafe fn from_raw(
        ptr: sys::CUdeviceptr,
        len: usize,
        stream: Stream,
        ctx: Arc<CudaContext>,
    ) -> Self {
        Self {
            ptr,
            len,
            stream,
            ctx,
            _t: PhantomData,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: allocations have at least one element.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stream this buffer is bound to.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Device address of element 0 (at least 256-byte aligned for pool allocations).
    pub fn device_ptr(&self) -> u64 {
        self.ptr
    }

    /// Binds the buffer to `to`: work queued on `to` from now on runs after all work queued so far
    /// on the old stream (event record + cuStreamWaitEvent).
    pub fn move_to_stream(&mut self, to: &Stream) -> Result<()> {
        if *to != self.stream {
            let ev = self.stream.record()?;
            to.wait(&ev)?;
            self.stream = to.clone();
        }
        Ok(())
    }

    /// A read-only view of `range` (elements).
    pub fn view(&self, range: Range<usize>) -> Result<DeviceView<'_, T>> {
        self.check_range(&range)?;
        Ok(DeviceView {
            ptr: self.ptr + (range.start * size_of::<T>()) as u64,
            len: range.len(),
            stream: &self.stream,
            _b: PhantomData,
        })
    }

    /// A mutable view of `range` (elements).
    pub fn view_mut(&mut self, range: Range<usize>) -> Result<DeviceViewMut<'_, T>> {
        self.check_range(&range)?;
        Ok(DeviceViewMut {
            ptr: self.ptr + (range.start * size_of::<T>()) as u64,
            len: range.len(),
            stream: &self.stream,
            _b: PhantomData,
        })
    }

    /// The whole buffer, read-only.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView {
            ptr: self.ptr,
            len: self.len,
            stream: &self.stream,
            _b: PhantomData,
        }
    }

    /// The whole buffer, mutable.
    pub fn as_view_mut(&mut self) -> DeviceViewMut<'_, T> {
        DeviceViewMut {
            ptr: self.ptr,
            len: self.len,
            stream: &self.stream,
            _b: PhantomData,
        }
    }

    fn check_range(&self, range: &Range<usize>) -> Result<()> {
        if range.start > range.end || range.end > self.len {
            return Err(Error::LengthMismatch {
                what: "buffer view",
                detail: format!(
                    "range {range:?} is outside the buffer of {} elements",
                    self.len
                ),
            });
        }
        Ok(())
    }

    /// Copies `src` into the buffer and waits for the copy (H2D on the buffer's stream).
    /// Errors: [`Error::LengthMismatch`] unless `src.len() == self.len()`.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        check_len("copy_from_host", self.len, src.len())?;
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: lengths match; the host slice is borrowed until the stream synchronises below.
        unsafe { self.copy_from_host_async(src) }?;
        self.stream.synchronize()
    }

    /// Copies the buffer into `dst` and waits (D2H on the buffer's stream).
    /// Errors: [`Error::LengthMismatch`] unless `dst.len() == self.len()`.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        check_len("copy_to_host", self.len, dst.len())?;
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: lengths match; the host slice is borrowed until the stream synchronises below.
        unsafe { self.copy_to_host_async(dst) }?;
        self.stream.synchronize()
    }

    /// Fills every element with `value`, queued on the buffer's stream (for poisoning outputs).
    pub fn fill_async(&mut self, value: T) -> Result<()>
    where
        T: Copy,
    {
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let stream = self.stream.raw();
        // SAFETY: ptr/len describe our allocation; the memset is stream-ordered.
        unsafe {
            match size_of::<T>() {
                4 => sys::cuMemsetD32Async(
                    self.ptr,
                    bytemuck::cast_slice::<T, u32>(&[value])[0],
                    self.len,
                    stream,
                )
                .call("cuMemsetD32Async"),
                2 => sys::cuMemsetD16Async(
                    self.ptr,
                    bytemuck::cast_slice::<T, u16>(&[value])[0],
                    self.len,
                    stream,
                )
                .call("cuMemsetD16Async"),
                1 => sys::cuMemsetD8Async(
                    self.ptr,
                    bytemuck::cast_slice::<T, u8>(&[value])[0],
                    self.len,
                    stream,
                )
                .call("cuMemsetD8Async"),
                n => Err(Error::BadShape {
                    what: "fill_async",
                    detail: format!("element size {n} bytes; 1, 2 or 4 are supported"),
                }),
            }
        }
    }

    /// Queues an H2D copy of `src` into the buffer on its stream.
    ///
    /// # Safety
    /// `src` must stay alive and unmodified until the copy completes on the buffer's stream; it
    /// should be pinned ([`super::PinnedBuffer`]) for the copy to be truly asynchronous.
    pub unsafe fn copy_from_host_async(&mut self, src: &[T]) -> Result<()> {
        check_len("copy_from_host_async", self.len, src.len())?;
        result::memcpy_htod_async(self.ptr, src, self.stream.raw()).call("cuMemcpyHtoDAsync")
    }

    /// Queues a D2H copy of the buffer into `dst` on its stream.
    ///
    /// # Safety
    /// `dst` must stay alive and not be read or written until the copy completes on the buffer's
    /// stream; it should be pinned for the copy to be truly asynchronous.
    pub unsafe fn copy_to_host_async(&self, dst: &mut [T]) -> Result<()> {
        check_len("copy_to_host_async", self.len, dst.len())?;
        result::memcpy_dtoh_async(dst, self.ptr, self.stream.raw()).call("cuMemcpyDtoHAsync")
    }

    /// Queues a device-to-device copy from `src` (same length, same stream).
    pub fn copy_from_device(&mut self, src: &DeviceBuffer<T>) -> Result<()> {
        check_len("copy_from_device", self.len, src.len)?;
        if src.stream != self.stream {
            return Err(Error::WrongStream {
                what: "copy_from_device source",
            });
        }
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: both allocations are live and of `len` T; ordered on the shared stream.
        unsafe {
            result::memcpy_dtod_async(
                self.ptr,
                src.ptr,
                self.len * size_of::<T>(),
                self.stream.raw(),
            )
        }
        .call("cuMemcpyDtoDAsync")
    }
}

fn check_len(what: &'static str, buffer: usize, host: usize) -> Result<()> {
    if buffer != host {
        return Err(Error::LengthMismatch {
            what,
            detail: format!("device buffer has {buffer} elements, host slice {host}"),
        });
    }
    Ok(())
}

/// A read-only window of a [`DeviceBuffer`]: device address, length, and the buffer's stream.
#[derive(Clone, Copy)]
pub struct DeviceView<'a, T> {
    ptr: u64,
    len: usize,
    stream: &'a Stream,
    _b: PhantomData<&'a T>,
}

/// A mutable window of a [`DeviceBuffer`].
pub struct DeviceViewMut<'a, T> {
    ptr: u64,
    len: usize,
    stream: &'a Stream,
    _b: PhantomData<&'a mut T>,
}

macro_rules! view_common {
    ($t:ident) => {
        impl<'a, T> $t<'a, T> {
            /// Elements.
            pub fn len(&self) -> usize {
                self.len
            }
            /// True for an empty view.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }
            /// Device address of the first element.
            pub fn device_ptr(&self) -> u64 {
                self.ptr
            }
            /// The stream of the underlying buffer.
            pub fn stream(&self) -> &Stream {
                self.stream
            }
        }
    };
}
view_common!(DeviceView);
view_common!(DeviceViewMut);

impl<'a, T: Pod> From<&'a DeviceBuffer<T>> for DeviceView<'a, T> {
    fn from(b: &'a DeviceBuffer<T>) -> Self {
        b.as_view()
    }
}
impl<'a, T: Pod> From<&'a mut DeviceBuffer<T>> for DeviceViewMut<'a, T> {
    fn from(b: &'a mut DeviceBuffer<T>) -> Self {
        b.as_view_mut()
    }
}
