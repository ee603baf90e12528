//! `MemPool`: the stream-ordered allocator's pool (CUDA driver API, "Stream Ordered Memory
//! Allocator": cuMemAllocFromPoolAsync / cuMemFreeAsync / cuMemPoolSetAttribute).

use std::sync::Arc;

use bytemuck::Pod;
use cudarc::driver::{result, sys};

use super::DeviceBuffer;
use crate::device::Device;
use crate::error::{CudaCall, Error, Result};
use crate::stream::Stream;

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
    ctx: Arc<cudarc::driver::CudaContext>,
}

// SAFETY: a CUmemoryPool handle may be used from any thread of the process (driver API objects
// are thread-safe); the context is bound before each use.
unsafe impl Send for PoolHandle {}
unsafe impl Sync for PoolHandle {}

impl Drop for PoolHandle {
    fn drop(&mut self) {
        if self.owned && self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the pool was created by us; buffers hold an Arc to it, so none is alive.
            let _ = unsafe { result::mem_pool::destroy(self.pool) };
        }
    }
}

impl std::fmt::Debug for MemPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPool")
            .field("owned", &self.inner.owned)
            .finish()
    }
}

impl MemPool {
    /// The device's default pool (`cuDeviceGetDefaultMemPool`), with its release threshold set to
    /// `release_threshold` bytes: memory up to that amount stays in the pool across
    /// synchronisations instead of going back to the OS, so steady-state allocations cost no
    /// `cuMemAlloc`. `u64::MAX` keeps everything.
    ///
    /// Errors: [`Error::MemoryPoolsUnsupported`] where the device has no pools.
    pub fn device_default(dev: &Device, release_threshold: u64) -> Result<Self> {
        if !dev.capabilities().memory_pools {
            return Err(Error::MemoryPoolsUnsupported);
        }
        dev.bind()?;
        let cu_dev = dev.context().cu_device();
        // SAFETY: valid device handle.
        let pool = unsafe { result::device::get_default_mem_pool(cu_dev) }
            .call("cuDeviceGetDefaultMemPool")?;
        let p = Self {
            inner: Arc::new(PoolHandle {
                pool,
                owned: false,
                ctx: dev.context().clone(),
            }),
        };
        p.set_release_threshold(release_threshold)?;
        Ok(p)
    }

    /// A new pool of device memory on `dev` with the given release threshold (bytes).
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
        // SAFETY: props is fully initialised.
        let pool = unsafe { result::mem_pool::create(&props) }.call("cuMemPoolCreate")?;
        let p = Self {
            inner: Arc::new(PoolHandle {
                pool,
                owned: true,
                ctx: dev.context().clone(),
            }),
        };
        p.set_release_threshold(release_threshold)?;
        Ok(p)
    }

    /// Sets `CU_MEMPOOL_ATTR_RELEASE_THRESHOLD` (bytes kept reserved across synchronisations).
    pub fn set_release_threshold(&self, bytes: u64) -> Result<()> {
        self.inner.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let mut v = bytes;
        // SAFETY: the attribute takes a cuuint64_t, which `v` is.
        unsafe {
            result::mem_pool::set_attribute(
                self.inner.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut v as *mut u64 as *mut std::ffi::c_void,
            )
        }
        .call("cuMemPoolSetAttribute")
    }

    /// Bytes the pool currently holds from the device (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn reserved_bytes(&self) -> Result<u64> {
        self.inner.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let mut v = 0u64;
        // SAFETY: the attribute is a cuuint64_t.
        unsafe {
            result::mem_pool::get_attribute(
                self.inner.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT,
                &mut v as *mut u64 as *mut std::ffi::c_void,
            )
        }
        .call("cuMemPoolGetAttribute")?;
        Ok(v)
    }

    /// Allocates `len` elements of `T` on `stream` (`cuMemAllocFromPoolAsync`); the buffer is bound
    /// to `stream` and freed on it when dropped. Contents are uninitialised device memory (never
    /// read by the host before a write: reading it back gives whatever bytes were there).
    ///
    /// Errors: [`Error::Empty`] for `len == 0`, [`Error::TooLarge`] beyond device memory.
    pub fn alloc_async<T: Pod>(&self, stream: &Stream, len: usize) -> Result<DeviceBuffer<T>> {
        if len == 0 {
            return Err(Error::Empty {
                what: "device allocation",
            });
        }
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or(Error::TooLarge {
                what: "device allocation (elements)",
                value: len as u64,
                max: (usize::MAX / std::mem::size_of::<T>()) as u64,
            })?;
        let total = self.inner.ctx.total_mem().call("cuDeviceTotalMem")?;
        if bytes > total {
            return Err(Error::TooLarge {
                what: "device allocation (bytes)",
                value: bytes as u64,
                max: total as u64,
            });
        }
        self.inner.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid pool and stream; out-pointer is a local.
        unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, bytes, self.inner.pool, stream.raw()) }
            .call("cuMemAllocFromPoolAsync")?;
        // SAFETY: `ptr` is a fresh stream-ordered allocation of `len` T on `stream`.
        Ok(unsafe { DeviceBuffer::from_raw(ptr, len, stream.clone(), self.inner.ctx.clone()) })
    }
}
