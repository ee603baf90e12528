//! `MemPool`: the stream-ordered allocator's pool (CUDA driver API, "Stream Ordered Memory
//! Allocator": cuMemAllocFromPoolAsync / cuMemFreeAsync / cuMemPoolSetAttribute).

use std::sync::{Arc, Mutex};

use bytemuck::Pod;
use cudarc::driver::{sys, CudaContext};

use super::buffer::PoolFrees;
use super::DeviceBuffer;
use crate::device::{bind_context, bind_context_unchecked, defer_error, Device};
use crate::driver::core as drv;
use crate::error::{Error, Result};
use crate::stream::{Stream, StreamTrail};

/// A memory pool of one device. Allocation and free are ordered on streams: an allocation made on
/// stream S is usable by work queued on S after it, and its memory returns to the pool when S
/// reaches the free.
#[derive(Clone)]
pub struct MemPool {
    inner: Arc<PoolHandle>,
}

struct PoolHandle {
    pool: sys::CUmemoryPool,
    owned: bool,
    /// For the device's default pool: the release threshold it had before, put back on drop.
    restore_threshold: Option<u64>,
    ctx: Arc<CudaContext>,
    /// The streams frees of this pool's memory were queued on (owned pools): the destroy waits
    /// for events after them.
    frees: Mutex<StreamTrail>,
}

impl PoolFrees for PoolHandle {
    fn freed_on(&self, stream: &Stream) {
        self.frees
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .note(stream);
    }
}

// SAFETY: a CUmemoryPool handle may be used from any thread of the process (driver API objects
// are thread-safe); the context is bound before each use.
unsafe impl Send for PoolHandle {}
unsafe impl Sync for PoolHandle {}

const THRESHOLD: sys::CUmemPool_attribute =
    sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD;

/// An owned pool on its way to `cuMemPoolDestroy` on the reaper thread.
struct PoolDestroy {
    pool: sys::CUmemoryPool,
    ctx: Arc<CudaContext>,
}

// SAFETY: as for `PoolHandle`: the handle may be used from any thread.
unsafe impl Send for PoolDestroy {}

impl Drop for PoolHandle {
    fn drop(&mut self) {
        if self.owned {
            // Every buffer of the pool held a handle until its `cuMemFreeAsync` was queued, so
            // no allocation is left and the trail's streams hold every free: the destroy runs on
            // the reaper thread once those frees have run. Under compute-sanitizer memcheck
            // (H100, sessions 8 and 9) `cuMemPoolDestroy` with frees still queued crashed inside
            // the driver, while every other thread was outside it. It never blocks, so the gate
            // is not needed.
            let d = PoolDestroy {
                pool: self.pool,
                ctx: self.ctx.clone(),
            };
            let frees = std::mem::take(self.frees.get_mut().unwrap_or_else(|e| e.into_inner()));
            frees.then_on_reaper(false, move || {
                let d = d;
                let r = bind_context_unchecked(&d.ctx).and_then(|()| {
                    // SAFETY: the pool was created by us and nothing uses the handle after this
                    // (the `MemPool`, every clone of it and every buffer allocated from it are
                    // gone).
                    unsafe { drv::mem_pool_destroy(d.pool) }
                });
                if let Err(e) = r {
                    defer_error(&d.ctx, &e);
                }
            });
            return;
        }
        let r = bind_context_unchecked(&self.ctx).and_then(|()| {
            if let Some(old) = self.restore_threshold {
                drv::mem_pool_set_attribute_u64(self.pool, THRESHOLD, old)
            } else {
                Ok(())
            }
        });
        if let Err(e) = r {
            defer_error(&self.ctx, &e);
        }
    }
}

impl std::fmt::Debug for MemPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPool")
            .field("owned", &self.inner.owned)
            .field("restore_threshold", &self.inner.restore_threshold)
            .finish()
    }
}

impl MemPool {
    /// The device's default pool (`cuDeviceGetDefaultMemPool`), with its release threshold set to
    /// `release_threshold` bytes while this handle (or a clone) lives: memory up to that amount
    /// stays in the pool across synchronisations instead of going back to the OS. `u64::MAX`
    /// keeps everything.
    ///
    /// The default pool is process-wide state shared with every other user of the device
    /// (cudaMallocAsync in other libraries, say). The threshold it had before is read here and
    /// put back when the last clone of this handle is dropped; handles that overlap restore in
    /// reverse order of creation only if dropped in that order. Prefer [`MemPool::new`] (a pool of
    /// warpline's own) where a threshold is wanted; warpline itself does.
    ///
    /// Errors: [`Error::MemoryPoolsUnsupported`] where the device has no pools; [`Error::Cuda`].
    pub fn device_default(dev: &Device, release_threshold: u64) -> Result<Self> {
        if !dev.capabilities().memory_pools {
            return Err(Error::MemoryPoolsUnsupported);
        }
        dev.bind()?;
        let pool = drv::device_get_default_mem_pool(dev.context().cu_device())?;
        let old = drv::mem_pool_get_attribute_u64(pool, THRESHOLD)?;
        let p = Self {
            inner: Arc::new(PoolHandle {
                pool,
                owned: false,
                restore_threshold: Some(old),
                ctx: dev.context().clone(),
                frees: Mutex::default(),
            }),
        };
        p.set_release_threshold(release_threshold)?;
        Ok(p)
    }

    /// A new pool of device memory on `dev` (`cuMemPoolCreate`, device-located, pinned
    /// allocation type) with the given release threshold (bytes). Every buffer allocated from it
    /// keeps it alive: it is destroyed (`cuMemPoolDestroy`, on the reaper thread) once the last
    /// clone and the last buffer are dropped and every free of its memory has run on the GPU.
    ///
    /// Errors: [`Error::MemoryPoolsUnsupported`]; [`Error::Cuda`].
    pub fn new(dev: &Device, release_threshold: u64) -> Result<Self> {
        if !dev.capabilities().memory_pools {
            return Err(Error::MemoryPoolsUnsupported);
        }
        dev.bind()?;
        // SAFETY: zero is a valid bit pattern for this plain C struct; the fields that matter are
        // set below.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = dev.context().ordinal() as i32;
        let pool = drv::mem_pool_create(&props)?;
        let p = Self {
            inner: Arc::new(PoolHandle {
                pool,
                owned: true,
                restore_threshold: None,
                ctx: dev.context().clone(),
                frees: Mutex::default(),
            }),
        };
        p.set_release_threshold(release_threshold)?;
        Ok(p)
    }

    /// The driver handle (`CUmemoryPool`), for [`crate::multi::DeviceSet`] (peer access).
    pub(crate) fn raw_pool(&self) -> sys::CUmemoryPool {
        self.inner.pool
    }

    /// The context the pool belongs to (`CUcontext`).
    pub(crate) fn context_raw(&self) -> sys::CUcontext {
        self.inner.ctx.cu_ctx()
    }

    /// True for a pool warpline created ([`MemPool::new`]), false for the device's default pool.
    pub fn is_owned(&self) -> bool {
        self.inner.owned
    }

    /// Sets `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (bytes kept reserved across synchronisations).
    /// On the default pool this changes process-wide state until this handle is dropped (see
    /// [`MemPool::device_default`]).
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        bind_context(&self.inner.ctx, "cuMemPoolSetAttribute")?;
        drv::mem_pool_set_attribute_u64(self.inner.pool, THRESHOLD, bytes)
    }

    /// `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, bytes.
    pub fn release_threshold(&self) -> Result<u64> {
        bind_context(&self.inner.ctx, "cuMemPoolGetAttribute")?;
        drv::mem_pool_get_attribute_u64(self.inner.pool, THRESHOLD)
    }

    /// The release threshold of `dev`'s default pool, bytes (read only; for checking that
    /// nothing changed it).
    pub fn default_pool_release_threshold(dev: &Device) -> Result<u64> {
        dev.bind()?;
        let pool = drv::device_get_default_mem_pool(dev.context().cu_device())?;
        drv::mem_pool_get_attribute_u64(pool, THRESHOLD)
    }

    /// Bytes the pool currently holds from the device (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn reserved_bytes(&self) -> Result<u64> {
        bind_context(&self.inner.ctx, "cuMemPoolGetAttribute")?;
        drv::mem_pool_get_attribute_u64(
            self.inner.pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
        )
    }

    /// Bytes of the pool's allocations not yet freed (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`; a
    /// stream-ordered free counts once the driver has run it).
    pub fn used_bytes(&self) -> Result<u64> {
        bind_context(&self.inner.ctx, "cuMemPoolGetAttribute")?;
        drv::mem_pool_get_attribute_u64(
            self.inner.pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        )
    }

    /// The most bytes the pool has held from the device since it was created or this watermark
    /// was last reset (`CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH`).
    pub fn reserved_high_bytes(&self) -> Result<u64> {
        bind_context(&self.inner.ctx, "cuMemPoolGetAttribute")?;
        drv::mem_pool_get_attribute_u64(
            self.inner.pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
        )
    }

    /// Allocates `len` elements of `T` on `stream` (`cuMemAllocFromPoolAsync`); the buffer is bound
    /// to `stream` and freed on it when dropped. Contents are uninitialised device memory (never
    /// read by the host before a write: reading it back gives whatever bytes were there).
    /// Pool allocations are at least 256-byte aligned.
    ///
    /// Errors: [`Error::Empty`] for `len == 0`, [`Error::ZeroSizedType`] for a `T` of size 0,
    /// [`Error::TooLarge`] beyond device memory, [`Error::WrongContext`] for a stream of another
    /// context, [`Error::OutOfMemory`] (bytes asked for, bytes free from `cuMemGetInfo`),
    /// [`Error::ContextPoisoned`], [`Error::Cuda`].
    pub fn alloc_async<T: Pod>(&self, stream: &Stream, len: usize) -> Result<DeviceBuffer<T>> {
        let size = std::mem::size_of::<T>();
        if size == 0 {
            return Err(Error::ZeroSizedType {
                what: "device allocation",
                ty: std::any::type_name::<T>(),
            });
        }
        if len == 0 {
            return Err(Error::Empty {
                what: "device allocation",
            });
        }
        if stream.context_raw() != self.inner.ctx.cu_ctx() {
            return Err(Error::WrongContext {
                what: "MemPool::alloc_async stream",
            });
        }
        let bytes = len.checked_mul(size).ok_or(Error::TooLarge {
            what: "device allocation (elements)",
            value: len as u64,
            max: (usize::MAX / size) as u64,
        })?;
        bind_context(&self.inner.ctx, "cuMemAllocFromPoolAsync")?;
        let total = drv::device_total_mem(self.inner.ctx.cu_device())?;
        if bytes > total {
            return Err(Error::TooLarge {
                what: "device allocation (bytes)",
                value: bytes as u64,
                max: total as u64,
            });
        }
        let ptr = match drv::mem_alloc_from_pool_async(bytes, self.inner.pool, stream.raw()) {
            Err(Error::Cuda { source, .. })
                if source.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY =>
            {
                let info = drv::mem_get_info().ok();
                return Err(Error::OutOfMemory {
                    what: "device allocation (cuMemAllocFromPoolAsync)",
                    requested: bytes as u64,
                    free: info.map(|(f, _)| f as u64),
                    total: Some(info.map_or(total, |(_, t)| t) as u64),
                    source_of_figures: "cuMemGetInfo",
                });
            }
            r => r?,
        };
        // An owned pool is destroyed only after this buffer's free (see `PoolHandle`'s `Drop`).
        let keep = self
            .inner
            .owned
            .then(|| self.inner.clone() as Arc<dyn PoolFrees>);
        // SAFETY: `ptr` is a fresh stream-ordered allocation of `len` T on `stream`, whose context
        // is the pool's (checked above).
        Ok(unsafe {
            DeviceBuffer::from_raw(ptr, len, stream.clone(), self.inner.ctx.clone(), keep)
        })
    }
}
