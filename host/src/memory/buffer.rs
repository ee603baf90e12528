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
use cudarc::driver::{sys, CudaContext};

use crate::device::{bind_context, bind_context_unchecked, defer_error};
use crate::driver::core as drv;
use crate::error::{Error, Result};
use crate::stream::Stream;

/// `len` elements of `T` in device memory, allocated from a [`super::MemPool`] on `stream` and freed
/// on it (`cuMemFreeAsync`) when dropped.
pub struct DeviceBuffer<T> {
    ptr: sys::CUdeviceptr,
    len: usize,
    stream: Stream,
    ctx: Arc<CudaContext>,
    /// The owned pool the memory came from, kept alive until this buffer's free is queued and
    /// told where (`None` for the device's default pool, which is never destroyed).
    pool: Option<Arc<dyn PoolFrees>>,
    _t: PhantomData<T>,
}

/// What a pool of warpline's own ([`super::MemPool::new`]) learns of the frees of its memory: each
/// buffer holds its pool until its `cuMemFreeAsync` is queued and reports the stream, and the
/// pool's `cuMemPoolDestroy` waits for events after those frees (issue 19: a destroy while frees
/// of the pool's memory were still queued crashed inside the driver under compute-sanitizer
/// memcheck, H100, sessions 8 and 9).
pub(crate) trait PoolFrees: Send + Sync {
    /// A free of the pool's memory was queued on `stream`.
    fn freed_on(&self, stream: &Stream);
}

// SAFETY: the buffer owns device memory; moving the handle between threads is fine, and all access
// goes through stream-ordered driver calls.
unsafe impl<T: Send> Send for DeviceBuffer<T> {}
unsafe impl<T: Sync> Sync for DeviceBuffer<T> {}

impl<T> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        // Raw bind: an error cudarc left in its slot must not make us skip the free.
        let r = bind_context_unchecked(&self.ctx).and_then(|()| {
            // SAFETY: the allocation is ours; every use of it was queued on `self.stream` (type
            // invariant), so the stream-ordered free follows them.
            unsafe { drv::mem_free_async(self.ptr, self.stream.raw()) }
        });
        match r {
            Ok(()) => {
                if let Some(pool) = self.pool.take() {
                    // Before the (maybe last) pool handle goes: its destroy waits for this free.
                    pool.freed_on(&self.stream);
                }
            }
            // Cannot be returned from drop: kept for Device::take_deferred_errors. The memory then
            // stays in the pool until the context goes.
            Err(e) => defer_error(&self.ctx, &e),
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
    /// the returned buffer; `pool` is the pool it came from if that pool is ever destroyed.
    pub(crate) unsafe fn from_raw(
        ptr: sys::CUdeviceptr,
        len: usize,
        stream: Stream,
        ctx: Arc<CudaContext>,
        pool: Option<Arc<dyn PoolFrees>>,
    ) -> Self {
        Self {
            ptr,
            len,
            stream,
            ctx,
            pool,
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
    ///
    /// Errors: [`Error::WrongContext`] for a stream of another context (the memory belongs to
    /// this buffer's context).
    pub fn move_to_stream(&mut self, to: &Stream) -> Result<()> {
        if to.context_raw() != self.ctx.cu_ctx() {
            return Err(Error::WrongContext {
                what: "DeviceBuffer::move_to_stream",
            });
        }
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

    /// Copies `src` into the buffer and waits for the copy (H2D on the buffer's stream, after its
    /// earlier work). The copy goes through warpline's pinned staging memory and the wait polls
    /// an event (`cuMemcpyHtoDAsync` + `cuEventQuery`), so this thread never blocks inside the
    /// driver, where it would hold a lock that other threads' release calls need (issue 19,
    /// `memory::staging`). Returns only after the copy finished or, on error, with nothing in
    /// flight that reads `src`.
    /// Errors: [`Error::LengthMismatch`] unless `src.len() == self.len()`; [`Error::Cuda`],
    /// [`Error::ContextPoisoned`]; [`Error::InHostCallback`] inside a task graph host callback.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        check_len("copy_from_host", self.len, src.len())?;
        // SAFETY: the allocation holds `len` elements, all of its uses are ordered on its stream
        // (type invariant), and `&mut self` keeps other host-side users out until we return.
        unsafe {
            super::staging::copy_htod_polled(
                &self.ctx,
                self.stream.raw(),
                bytemuck::cast_slice(src),
                self.ptr,
                "copy_from_host",
            )
        }
    }

    /// Copies the buffer into `dst` and waits (D2H on the buffer's stream, after its earlier
    /// work), through pinned staging with event polling like [`DeviceBuffer::copy_from_host`]:
    /// the GPU never writes `dst` itself. Returns only after the copy finished.
    /// Errors: [`Error::LengthMismatch`] unless `dst.len() == self.len()`; [`Error::Cuda`],
    /// [`Error::ContextPoisoned`]; [`Error::InHostCallback`] inside a task graph host callback.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        check_len("copy_to_host", self.len, dst.len())?;
        // SAFETY: the allocation holds `len` elements and all of its uses are ordered on its
        // stream, so the copy reads it after every earlier write.
        unsafe {
            super::staging::copy_dtoh_polled(
                &self.ctx,
                self.stream.raw(),
                self.ptr,
                bytemuck::cast_slice_mut(dst),
                "copy_to_host",
            )
        }
    }

    /// Fills every element with `value`, queued on the buffer's stream (for poisoning outputs):
    /// `cuMemsetD32Async` / `D16` / `D8` for elements of 4, 2 or 1 bytes (any alignment of `T`).
    /// Errors: [`Error::BadShape`] for other element sizes; [`Error::Cuda`].
    pub fn fill_async(&mut self, value: T) -> Result<()>
    where
        T: Copy,
    {
        let pattern = memset_pattern(value)?;
        bind_context(&self.ctx, "cuMemsetAsync")?;
        let stream = self.stream.raw();
        // SAFETY: ptr/len describe our allocation (pool allocations are 256-byte aligned, and
        // elements of 2 or 4 bytes keep 2- or 4-byte alignment); the memset is stream-ordered.
        unsafe {
            match pattern {
                MemsetPattern::D32(v) => drv::memset_d32_async(self.ptr, v, self.len, stream),
                MemsetPattern::D16(v) => drv::memset_d16_async(self.ptr, v, self.len, stream),
                MemsetPattern::D8(v) => drv::memset_d8_async(self.ptr, v, self.len, stream),
            }
        }
    }

    /// Queues an H2D copy of `src` into the buffer on its stream (`cuMemcpyHtoDAsync`).
    ///
    /// # Safety
    /// `src` must stay alive and unmodified until the copy completes on the buffer's stream; it
    /// should be pinned ([`super::PinnedBuffer`]) for the copy to be truly asynchronous.
    pub unsafe fn copy_from_host_async(&mut self, src: &[T]) -> Result<()> {
        check_len("copy_from_host_async", self.len, src.len())?;
        bind_context(&self.ctx, "cuMemcpyHtoDAsync")?;
        drv::memcpy_htod_async(
            self.ptr,
            src.as_ptr().cast(),
            std::mem::size_of_val(src),
            self.stream.raw(),
        )
    }

    /// Queues a D2H copy of the buffer into `dst` on its stream (`cuMemcpyDtoHAsync`).
    ///
    /// # Safety
    /// `dst` must stay alive and not be read or written until the copy completes on the buffer's
    /// stream; it should be pinned for the copy to be truly asynchronous.
    pub unsafe fn copy_to_host_async(&self, dst: &mut [T]) -> Result<()> {
        check_len("copy_to_host_async", self.len, dst.len())?;
        bind_context(&self.ctx, "cuMemcpyDtoHAsync")?;
        drv::memcpy_dtoh_async(
            dst.as_mut_ptr().cast(),
            self.ptr,
            std::mem::size_of_val(dst),
            self.stream.raw(),
        )
    }

    /// Queues a device-to-device copy from `src` (same length, same stream;
    /// `cuMemcpyDtoDAsync`). Errors: [`Error::LengthMismatch`], [`Error::WrongStream`].
    pub fn copy_from_device(&mut self, src: &DeviceBuffer<T>) -> Result<()> {
        check_len("copy_from_device", self.len, src.len)?;
        if src.stream != self.stream {
            return Err(Error::WrongStream {
                what: "copy_from_device source",
            });
        }
        bind_context(&self.ctx, "cuMemcpyDtoDAsync")?;
        // SAFETY: both allocations are live and of `len` T; ordered on the shared stream.
        unsafe {
            drv::memcpy_dtod_async(
                self.ptr,
                src.ptr,
                self.len * size_of::<T>(),
                self.stream.raw(),
            )
        }
    }
}

/// The memset of one element value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MemsetPattern {
    D32(u32),
    D16(u16),
    D8(u8),
}

/// The memset pattern of `value`, from its bytes (no cast of `T` itself, so any alignment of
/// `T` works). [`Error::BadShape`] unless `T` has 1, 2 or 4 bytes.
pub(crate) fn memset_pattern<T: Pod>(value: T) -> Result<MemsetPattern> {
    let bytes = bytemuck::bytes_of(&value);
    match *bytes {
        [a, b, c, d] => Ok(MemsetPattern::D32(u32::from_ne_bytes([a, b, c, d]))),
        [a, b] => Ok(MemsetPattern::D16(u16::from_ne_bytes([a, b]))),
        [a] => Ok(MemsetPattern::D8(a)),
        _ => Err(Error::BadShape {
            what: "fill_async",
            detail: format!(
                "element size {} bytes; 1, 2 or 4 are supported",
                bytes.len()
            ),
        }),
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

impl<'a, T> DeviceView<'a, T> {
    /// # Safety
    /// `ptr` addresses `len` initialised elements of `T` in device memory of `stream`'s context
    /// that stay allocated, and are not written except through work queued on `stream`, for
    /// `'a`; the memory's stream-ordered free (if any) is queued on `stream` after every use
    /// (the binding rule of [`DeviceBuffer`]).
    pub(crate) unsafe fn from_raw_parts(ptr: u64, len: usize, stream: &'a Stream) -> Self {
        Self {
            ptr,
            len,
            stream,
            _b: PhantomData,
        }
    }
}

impl<'a, T> DeviceViewMut<'a, T> {
    /// # Safety
    /// As [`DeviceView::from_raw_parts`], and nothing else accesses the elements for `'a`
    /// except through work queued on `stream` with this view.
    pub(crate) unsafe fn from_raw_parts(ptr: u64, len: usize, stream: &'a Stream) -> Self {
        Self {
            ptr,
            len,
            stream,
            _b: PhantomData,
        }
    }

    /// A shorter-lived mutable view of the same elements (to pass the view on and use it again).
    pub fn reborrow(&mut self) -> DeviceViewMut<'_, T> {
        DeviceViewMut {
            ptr: self.ptr,
            len: self.len,
            stream: self.stream,
            _b: PhantomData,
        }
    }

    /// The same elements, read-only, for the rest of the borrow.
    pub fn into_view(self) -> DeviceView<'a, T> {
        DeviceView {
            ptr: self.ptr,
            len: self.len,
            stream: self.stream,
            _b: PhantomData,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finding_16_fill_pattern_of_align_1_four_byte_type() {
        // [u8; 4] has size 4 and alignment 1: bytemuck::cast_slice::<[u8; 4], u32> panicked.
        let v = [1u8, 2, 3, 4];
        assert_eq!(
            memset_pattern(v).unwrap(),
            MemsetPattern::D32(u32::from_ne_bytes(v))
        );
        assert_eq!(
            memset_pattern([7u8, 9]).unwrap(),
            MemsetPattern::D16(u16::from_ne_bytes([7, 9]))
        );
        assert_eq!(
            memset_pattern(f32::NAN).unwrap(),
            MemsetPattern::D32(f32::NAN.to_bits())
        );
        assert_eq!(memset_pattern(5u8).unwrap(), MemsetPattern::D8(5));
        assert!(matches!(memset_pattern(1u64), Err(Error::BadShape { .. })));
        assert!(matches!(memset_pattern(()), Err(Error::BadShape { .. })));
    }
}
