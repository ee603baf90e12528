//! Driver wrappers: see [`super`]. Each function wraps one `cu*` call (contexts, functions,
//! launches, streams, events, memory) and names it in its error; sticky errors become
//! [`crate::Error::ContextPoisoned`] through [`crate::error::CudaCall`].

use std::ffi::{c_int, c_void};

use cudarc::driver::sys;

use crate::error::{CudaCall, Result};

/// `cuInit(0)`.
pub(crate) fn init() -> Result<()> {
    // SAFETY: plain call without pointers.
    unsafe { sys::cuInit(0) }.call("cuInit")
}

/// `cuDeviceGetCount`.
pub(crate) fn device_get_count() -> Result<i32> {
    let mut n: c_int = 0;
    // SAFETY: valid out-pointer.
    unsafe { sys::cuDeviceGetCount(&mut n) }.call("cuDeviceGetCount")?;
    Ok(n)
}

/// `cuDeviceGetAttribute`.
pub(crate) fn device_get_attribute(
    dev: sys::CUdevice,
    attr: sys::CUdevice_attribute,
) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer; the device handle comes from the driver.
    unsafe { sys::cuDeviceGetAttribute(&mut v, attr, dev) }.call("cuDeviceGetAttribute")?;
    Ok(v)
}

/// `cuDeviceTotalMem`, bytes.
pub(crate) fn device_total_mem(dev: sys::CUdevice) -> Result<usize> {
    let mut v = 0usize;
    // SAFETY: valid out-pointer; the device handle comes from the driver.
    unsafe { sys::cuDeviceTotalMem_v2(&mut v, dev) }.call("cuDeviceTotalMem")?;
    Ok(v)
}

/// `cuCtxSetCurrent`.
pub(crate) fn ctx_set_current(ctx: sys::CUcontext) -> Result<()> {
    // SAFETY: `ctx` is a live context handle owned by a `CudaContext` the caller holds.
    unsafe { sys::cuCtxSetCurrent(ctx) }.call("cuCtxSetCurrent")
}

/// `cuCtxGetCurrent`, without error classification (used by the classification itself): `None`
/// when no context is current or the call fails.
pub(crate) fn ctx_get_current_unclassified() -> Option<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    let r = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    (r == sys::CUresult::CUDA_SUCCESS && !ctx.is_null()).then_some(ctx)
}

/// `cuCtxSynchronize` (current context).
pub(crate) fn ctx_synchronize() -> Result<()> {
    // SAFETY: plain call.
    unsafe { sys::cuCtxSynchronize() }.call("cuCtxSynchronize")
}

/// `cuFuncLoad`.
pub(crate) fn func_load(f: sys::CUfunction) -> Result<()> {
    let _lock = super::resource_lock();
    // SAFETY: `f` is a function handle of a module loaded in the current context.
    unsafe { sys::cuFuncLoad(f) }.call("cuFuncLoad")
}

/// `cuFuncIsLoaded`.
pub(crate) fn func_is_loaded(f: sys::CUfunction) -> Result<bool> {
    let mut state = sys::CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_UNLOADED;
    let _lock = super::resource_lock();
    // SAFETY: valid function handle and out-pointer.
    unsafe { sys::cuFuncIsLoaded(&mut state, f) }.call("cuFuncIsLoaded")?;
    Ok(state == sys::CUfunctionLoadingState::CU_FUNCTION_LOADING_STATE_LOADED)
}

/// `cuFuncGetAttribute`.
pub(crate) fn func_get_attribute(
    f: sys::CUfunction,
    attr: sys::CUfunction_attribute,
) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: valid function handle and out-pointer.
    unsafe { sys::cuFuncGetAttribute(&mut v, attr, f) }.call("cuFuncGetAttribute")?;
    Ok(v)
}

/// `cuFuncSetAttribute`.
pub(crate) fn func_set_attribute(
    f: sys::CUfunction,
    attr: sys::CUfunction_attribute,
    value: i32,
) -> Result<()> {
    // SAFETY: valid function handle; the driver validates the value.
    unsafe { sys::cuFuncSetAttribute(f, attr, value) }.call("cuFuncSetAttribute")
}

/// `cuLaunchKernelEx`.
///
/// # Safety
/// `config` (and the attributes it points to) is valid for the call; `params` holds one pointer
/// per kernel parameter to a value of its exact type; the kernel's memory accesses stay inside
/// live allocations ordered on `config.hStream`.
pub(crate) unsafe fn launch_kernel_ex(
    config: &sys::CUlaunchConfig,
    f: sys::CUfunction,
    params: &mut [*mut c_void],
) -> Result<()> {
    sys::cuLaunchKernelEx(config, f, params.as_mut_ptr(), std::ptr::null_mut())
        .call("cuLaunchKernelEx")
}

/// `cuOccupancyMaxActiveClusters`.
///
/// # Safety
/// `config` (and the attributes it points to) is valid for the call.
pub(crate) unsafe fn occupancy_max_active_clusters(
    f: sys::CUfunction,
    config: &sys::CUlaunchConfig,
) -> Result<i32> {
    let mut n: c_int = 0;
    sys::cuOccupancyMaxActiveClusters(&mut n, f, config).call("cuOccupancyMaxActiveClusters")?;
    Ok(n)
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor`: CTAs of `block` threads with `smem` bytes of
/// dynamic shared memory that fit on one SM at once.
///
/// # Safety
/// `f` is a live function handle of the current context.
pub(crate) unsafe fn occupancy_max_blocks_per_sm(
    f: sys::CUfunction,
    block: u32,
    smem: usize,
) -> Result<i32> {
    let mut n: c_int = 0;
    sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut n, f, block as c_int, smem)
        .call("cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
    Ok(n)
}

/// `cuStreamSynchronize`.
pub(crate) fn stream_synchronize(s: sys::CUstream) -> Result<()> {
    // SAFETY: `s` is a live stream handle held by the caller.
    unsafe { sys::cuStreamSynchronize(s) }.call("cuStreamSynchronize")
}

/// `cuStreamQuery`: `Ok(true)` when all queued work has completed, `Ok(false)` while
/// `CUDA_ERROR_NOT_READY`.
pub(crate) fn stream_query(s: sys::CUstream) -> Result<bool> {
    // SAFETY: `s` is a live stream handle held by the caller.
    match unsafe { sys::cuStreamQuery(s) } {
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => r.call("cuStreamQuery").map(|()| true),
    }
}

/// `cuStreamGetFlags`.
pub(crate) fn stream_get_flags(s: sys::CUstream) -> Result<u32> {
    let mut flags: std::ffi::c_uint = 0;
    // SAFETY: valid out-pointer; `s` is a live stream handle held by the caller.
    unsafe { sys::cuStreamGetFlags(s, &mut flags) }.call("cuStreamGetFlags")?;
    Ok(flags)
}

/// `cuStreamWaitEvent`.
pub(crate) fn stream_wait_event(s: sys::CUstream, e: sys::CUevent) -> Result<()> {
    // SAFETY: live stream and event handles held by the caller.
    unsafe { sys::cuStreamWaitEvent(s, e, 0) }.call("cuStreamWaitEvent")
}

/// `cuEventCreate` with `CU_EVENT_DEFAULT` (timing enabled).
pub(crate) fn event_create() -> Result<sys::CUevent> {
    event_create_with(sys::CUevent_flags::CU_EVENT_DEFAULT)
}

/// `cuEventCreate` with `flags`.
pub(crate) fn event_create_with(flags: sys::CUevent_flags) -> Result<sys::CUevent> {
    let mut e: sys::CUevent = std::ptr::null_mut();
    // SAFETY: valid out-pointer; flags are a valid value.
    unsafe { sys::cuEventCreate(&mut e, flags as u32) }.call("cuEventCreate")?;
    Ok(e)
}

/// `cuEventRecord`.
pub(crate) fn event_record(e: sys::CUevent, s: sys::CUstream) -> Result<()> {
    // SAFETY: live handles held by the caller.
    unsafe { sys::cuEventRecord(e, s) }.call("cuEventRecord")
}

/// `cuEventDestroy`.
pub(crate) fn event_destroy(e: sys::CUevent) -> Result<()> {
    // SAFETY: the caller owns `e` and does not use it afterwards.
    unsafe { sys::cuEventDestroy_v2(e) }.call("cuEventDestroy")
}

/// `cuEventQuery`: `Ok(true)` once complete, `Ok(false)` while `CUDA_ERROR_NOT_READY`.
pub(crate) fn event_query(e: sys::CUevent) -> Result<bool> {
    // SAFETY: live event handle.
    match unsafe { sys::cuEventQuery(e) } {
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => r.call("cuEventQuery").map(|()| true),
    }
}

/// Waits until `e` has completed by polling `cuEventQuery`, a short call that returns at once,
/// instead of blocking in `cuEventSynchronize`: a thread blocked inside the driver can hold a
/// lock that other threads' calls (`cuStreamCreate`, `cuEventCreate`) need, and when what it
/// waits for is released by one of those threads the process hangs (issue 19, found by
/// `warpline fuzz` on the H100). Backoff: 64 `yield_now` spins, then sleeps doubling from 20 us to
/// 200 us (so a wait overshoots the event by at most about 200 us). Errors: the event's
/// `cuEventQuery` error (a sticky error of its context, say).
pub(crate) fn event_wait_polled(e: sys::CUevent) -> Result<()> {
    let mut spins = 0u32;
    let mut sleep = std::time::Duration::from_micros(20);
    loop {
        if event_query(e)? {
            return Ok(());
        }
        if spins < 64 {
            spins += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(std::time::Duration::from_micros(200));
        }
    }
}

/// `cuEventElapsedTime`, milliseconds.
pub(crate) fn event_elapsed_ms(start: sys::CUevent, end: sys::CUevent) -> Result<f32> {
    // SAFETY: live event handles.
    unsafe { cudarc::driver::result::event::elapsed(start, end) }
        .map_err(|source| crate::error::classify("cuEventElapsedTime", source))
}

/// `cuMemGetInfo` for the current context: (free, total) bytes.
pub(crate) fn mem_get_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }.call("cuMemGetInfo")?;
    Ok((free, total))
}

/// `cuMemHostAlloc`.
pub(crate) fn mem_host_alloc(bytes: usize, flags: u32) -> Result<*mut c_void> {
    let mut p: *mut c_void = std::ptr::null_mut();
    let _lock = super::resource_lock();
    // SAFETY: valid out-pointer.
    unsafe { sys::cuMemHostAlloc(&mut p, bytes, flags) }.call("cuMemHostAlloc")?;
    Ok(p)
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `p` came from `cuMemHostAlloc`, is freed once, and no copy using it is in flight.
pub(crate) unsafe fn mem_free_host(p: *mut c_void) -> Result<()> {
    let _lock = super::resource_lock();
    sys::cuMemFreeHost(p).call("cuMemFreeHost")
}

/// `cuMemAllocFromPoolAsync`.
pub(crate) fn mem_alloc_from_pool_async(
    bytes: usize,
    pool: sys::CUmemoryPool,
    s: sys::CUstream,
) -> Result<sys::CUdeviceptr> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: live pool and stream handles; valid out-pointer.
    unsafe { sys::cuMemAllocFromPoolAsync(&mut p, bytes, pool, s) }
        .call("cuMemAllocFromPoolAsync")?;
    Ok(p)
}

/// `cuMemFreeAsync`.
///
/// # Safety
/// `p` is a live stream-ordered allocation, freed once, after every use in `s`'s order.
pub(crate) unsafe fn mem_free_async(p: sys::CUdeviceptr, s: sys::CUstream) -> Result<()> {
    sys::cuMemFreeAsync(p, s).call("cuMemFreeAsync")
}

/// `cuMemcpyHtoDAsync`.
///
/// # Safety
/// `dst` holds `bytes` device bytes; `src` holds `bytes` readable host bytes that stay alive and
/// unmodified until the copy completes on `s`.
pub(crate) unsafe fn memcpy_htod_async(
    dst: sys::CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    s: sys::CUstream,
) -> Result<()> {
    sys::cuMemcpyHtoDAsync_v2(dst, src, bytes, s).call("cuMemcpyHtoDAsync")
}

/// `cuMemcpyDtoHAsync`.
///
/// # Safety
/// `src` holds `bytes` device bytes; `dst` holds `bytes` writable host bytes that stay alive and
/// are not accessed until the copy completes on `s`.
pub(crate) unsafe fn memcpy_dtoh_async(
    dst: *mut c_void,
    src: sys::CUdeviceptr,
    bytes: usize,
    s: sys::CUstream,
) -> Result<()> {
    sys::cuMemcpyDtoHAsync_v2(dst, src, bytes, s).call("cuMemcpyDtoHAsync")
}

/// `cuMemcpyDtoDAsync`.
///
/// # Safety
/// Both ranges are live device allocations of `bytes` bytes, ordered on `s`.
pub(crate) unsafe fn memcpy_dtod_async(
    dst: sys::CUdeviceptr,
    src: sys::CUdeviceptr,
    bytes: usize,
    s: sys::CUstream,
) -> Result<()> {
    sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, s).call("cuMemcpyDtoDAsync")
}

/// `cuMemsetD32Async`.
///
/// # Safety
/// `dst` holds `n` live, 4-byte aligned u32 ordered on `s`.
pub(crate) unsafe fn memset_d32_async(
    dst: sys::CUdeviceptr,
    v: u32,
    n: usize,
    s: sys::CUstream,
) -> Result<()> {
    sys::cuMemsetD32Async(dst, v, n, s).call("cuMemsetD32Async")
}

/// `cuMemsetD16Async`.
///
/// # Safety
/// `dst` holds `n` live, 2-byte aligned u16 ordered on `s`.
pub(crate) unsafe fn memset_d16_async(
    dst: sys::CUdeviceptr,
    v: u16,
    n: usize,
    s: sys::CUstream,
) -> Result<()> {
    sys::cuMemsetD16Async(dst, v, n, s).call("cuMemsetD16Async")
}

/// `cuMemsetD8Async`.
///
/// # Safety
/// `dst` holds `n` live bytes ordered on `s`.
pub(crate) unsafe fn memset_d8_async(
    dst: sys::CUdeviceptr,
    v: u8,
    n: usize,
    s: sys::CUstream,
) -> Result<()> {
    sys::cuMemsetD8Async(dst, v, n, s).call("cuMemsetD8Async")
}

/// `cuDeviceGetDefaultMemPool`.
pub(crate) fn device_get_default_mem_pool(dev: sys::CUdevice) -> Result<sys::CUmemoryPool> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: valid device handle and out-pointer.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, dev) }.call("cuDeviceGetDefaultMemPool")?;
    Ok(pool)
}

/// `cuMemPoolCreate`.
pub(crate) fn mem_pool_create(props: &sys::CUmemPoolProps) -> Result<sys::CUmemoryPool> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let _lock = super::resource_lock();
    // SAFETY: `props` is a fully initialised struct; valid out-pointer.
    unsafe { sys::cuMemPoolCreate(&mut pool, props) }.call("cuMemPoolCreate")?;
    Ok(pool)
}

/// `cuMemPoolDestroy`.
///
/// # Safety
/// The caller created `pool` and does not use it afterwards (outstanding allocations are released
/// by the driver once freed).
pub(crate) unsafe fn mem_pool_destroy(pool: sys::CUmemoryPool) -> Result<()> {
    let _lock = super::resource_lock();
    sys::cuMemPoolDestroy(pool).call("cuMemPoolDestroy")
}

/// `cuMemPoolSetAttribute` for a `cuuint64_t` attribute.
pub(crate) fn mem_pool_set_attribute_u64(
    pool: sys::CUmemoryPool,
    attr: sys::CUmemPool_attribute,
    value: u64,
) -> Result<()> {
    let mut v = value;
    // SAFETY: live pool; the attributes used with this wrapper take a cuuint64_t.
    unsafe { sys::cuMemPoolSetAttribute(pool, attr, &mut v as *mut u64 as *mut c_void) }
        .call("cuMemPoolSetAttribute")
}

/// `cuMemPoolGetAttribute` for a `cuuint64_t` attribute.
pub(crate) fn mem_pool_get_attribute_u64(
    pool: sys::CUmemoryPool,
    attr: sys::CUmemPool_attribute,
) -> Result<u64> {
    let mut v = 0u64;
    // SAFETY: live pool; the attributes used with this wrapper are cuuint64_t.
    unsafe { sys::cuMemPoolGetAttribute(pool, attr, &mut v as *mut u64 as *mut c_void) }
        .call("cuMemPoolGetAttribute")?;
    Ok(v)
}
