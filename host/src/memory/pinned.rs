//! `PinnedBuffer<T>`: page-locked host memory (`cuMemHostAlloc`) for truly asynchronous copies.

use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{sys, CudaContext};

use crate::device::{bind_context, bind_context_unchecked, defer_error, Device};
use crate::driver::core as drv;
use crate::error::{Error, Result};

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
    /// Allocates and zero-fills `len` elements (`cuMemHostAlloc`, portable, not write-combined).
    ///
    /// Errors: [`Error::Empty`] for `len == 0`, [`Error::ZeroSizedType`] for a `T` of size 0,
    /// [`Error::TooLarge`] when the byte count overflows, [`Error::OutOfMemory`] (bytes asked for,
    /// host memory available from `/proc/meminfo`), [`Error::ContextPoisoned`], [`Error::Cuda`].
    pub fn new(dev: &Device, len: usize) -> Result<Self> {
        Self::new_in(dev.context(), len)
    }

    /// As [`PinnedBuffer::new`], in context `ctx` (bound here).
    pub(crate) fn new_in(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        let size = size_of::<T>();
        if size == 0 {
            return Err(Error::ZeroSizedType {
                what: "pinned host allocation",
                ty: std::any::type_name::<T>(),
            });
        }
        if len == 0 {
            return Err(Error::Empty {
                what: "pinned host allocation",
            });
        }
        let bytes = len.checked_mul(size).ok_or(Error::TooLarge {
            what: "pinned host allocation (elements)",
            value: len as u64,
            max: (usize::MAX / size) as u64,
        })?;
        bind_context(ctx, "cuMemHostAlloc")?;
        let ptr = match drv::mem_host_alloc(bytes, CU_MEMHOSTALLOC_PORTABLE) {
            Err(Error::Cuda { source, .. })
                if source.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY =>
            {
                let (free, total) = host_meminfo();
                return Err(Error::OutOfMemory {
                    what: "pinned host allocation (cuMemHostAlloc)",
                    requested: bytes as u64,
                    free,
                    total,
                    source_of_figures: "host memory, /proc/meminfo MemAvailable/MemTotal",
                });
            }
            r => r? as *mut T,
        };
        // SAFETY: `ptr` points to `bytes` writable bytes; zero is a valid T (Pod).
        unsafe { std::ptr::write_bytes(ptr as *mut u8, 0, bytes) };
        Ok(Self {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    /// Allocates and copies `src` in.
    pub fn from_slice(dev: &Device, src: &[T]) -> Result<Self> {
        let mut b = Self::new(dev, src.len())?;
        b.copy_from_slice(src);
        Ok(b)
    }
}

impl<T: Pod> PinnedBuffer<T> {
    /// Gives up the memory without `cuMemFreeHost` (it stays allocated until its context is
    /// destroyed) but releases the context handle, so the context can still be destroyed.
    pub(crate) fn leak_to_context(self) {
        let me = std::mem::ManuallyDrop::new(self);
        // SAFETY: `me` is never dropped or used again; the context Arc is read out once and
        // dropped, the memory is left allocated on purpose.
        drop(unsafe { std::ptr::read(&me.ctx) });
    }
}

impl<T: Pod> Drop for PinnedBuffer<T> {
    fn drop(&mut self) {
        // cuMemFreeHost synchronises with the device and blocks behind pending on-stream waits,
        // so it runs on the reaper thread (see `super::reaper`); errors are kept for
        // Device::take_deferred_errors.
        let ctx = self.ctx.clone();
        let ptr = self.ptr as usize;
        crate::reaper::defer(move || {
            let r = bind_context_unchecked(&ctx).and_then(|()| {
                // SAFETY: allocated by cuMemHostAlloc in `new` and freed once; no copy can still
                // be in flight because the async copy APIs that take pinned memory are unsafe and
                // require completion before the memory is dropped.
                unsafe { drv::mem_free_host(ptr as *mut std::ffi::c_void) }
            });
            if let Err(e) = r {
                defer_error(&ctx, &e);
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

/// (MemAvailable, MemTotal) of the host in bytes, where `/proc/meminfo` has them.
fn host_meminfo() -> (Option<u64>, Option<u64>) {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
    };
    (field("MemAvailable:"), field("MemTotal:"))
}
