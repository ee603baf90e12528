//! `PinnedBuffer<T>`: page-locked host memory (`cuMemHostAlloc`) for truly asynchronous copies.

use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{result, CudaContext};

use crate::device::Device;
use crate::error::{CudaCall, Error, Result};

/// `len` elements of `T` in page-locked host memory, zero-initialised.
///
/// Allocated with `cuMemHostAlloc(flags = CU_MEMHOSTALLOC_PORTABLE)`, i.e. *not* write-combined:
/// write-combined memory is fast for the GPU to read but very slow for the CPU to read, and
/// D2H destinations are read by the CPU. (cudarc's `alloc_pinned` asks for write-combined memory.)
pub struct PinnedBuffer<T: Pod> {
    ptr: *mut T,
    len: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the buffer owns its memory exclusively, like a Box<[T]>.
unsafe impl<T: Pod + Send> Send for PinnedBuffer<T> {}
unsafe impl<T: Pod + Sync> Sync for PinnedBuffer<T> {}

/// `CU_MEMHOSTALLOC_PORTABLE`: pinned for every context, not only the allocating one.
const CU_MEMHOSTALLOC_PORTABLE: u32 = 0x01;

impl<T: Pod> PinnedBuffer<T> {
    /// Allocates and zero-fills `len` elements. Errors: [`Error::Empty`] for `len == 0`.
    pub fn new(dev: &Device, len: usize) -> Result<Self> {
        if len == 0 {
            return Err(Error::Empty {
                what: "pinned host allocation",
            });
        }
        let bytes = len.checked_mul(size_of::<T>()).ok_or(Error::TooLarge {
            what: "pinned host allocation (elements)",
            value: len as u64,
            max: (usize::MAX / size_of::<T>()) as u64,
        })?;
        dev.bind()?;
        // SAFETY: plain allocation call; the result is checked.
        let ptr = unsafe { result::malloc_host(bytes, CU_MEMHOSTALLOC_PORTABLE) }
            .call("cuMemHostAlloc")? as *mut T;
        // SAFETY: `ptr` points to `bytes` writable bytes; zero is a valid T (Pod).
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        Ok(Self {
            ptr,
            len,
            ctx: dev.context().clone(),
        })
    }

    /// Allocates and copies `src` in.
    pub fn from_slice(dev: &Device, src: &[T]) -> Result<Self> {
        let mut b = Self::new(dev, src.len())?;
        b.copy_from_slice(src);
        Ok(b)
    }
}

impl<T: Pod> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        // `cuMemFreeHost` blocks while any stream sits on a stream memory wait (a Fence guard, a
        // Signal wait): free on the reaper thread so that this thread never blocks on its own
        // wait. No copy can still be in flight: the async copy APIs that take pinned memory are
        // unsafe and require completion.
        let (ptr, ctx) = (self.ptr as usize, self.ctx.clone());
        super::reaper::defer(move || {
            if ctx.bind_to_thread().is_ok() {
                // SAFETY: allocated by cuMemHostAlloc in `new`, freed once, unused by any copy.
                let _ = unsafe { result::free_host(ptr as *mut std::ffi::c_void) };
            }
        });
    }
}

impl<T: Pod> std::ops::Deref for PinnedBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: ptr/len describe our initialised allocation.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: Pod> std::ops::DerefMut for PinnedBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in deref; &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}
