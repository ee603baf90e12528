//! Driver wrappers: see [`super`]. Each function wraps one `cu*` call: stream memory operations
//! (`cuStreamWaitValue*`, `cuStreamWriteValue*`), stream queries, and the plain allocations of
//! signal words (`cuMemAlloc`, `cuMemsetD32`, `cuMemcpyDtoH`, `cuMemFree`) plus the device copy
//! of task graphs (`cuMemcpyDtoDAsync`).

use std::ffi::c_uint;

use cudarc::driver::sys;

use crate::error::{CudaCall, Result};

/// `cuStreamWaitValue32_v2`.
///
/// # Safety
/// `stream` is live; `addr` is a live, 4-byte aligned device word until the wait has completed.
pub(crate) unsafe fn stream_wait_value32(
    stream: sys::CUstream,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> Result<()> {
    sys::cuStreamWaitValue32_v2(stream, addr, value, flags).call("cuStreamWaitValue32_v2")
}

/// `cuStreamWaitValue64_v2`.
///
/// # Safety
/// As [`stream_wait_value32`], 8-byte aligned.
pub(crate) unsafe fn stream_wait_value64(
    stream: sys::CUstream,
    addr: u64,
    value: u64,
    flags: c_uint,
) -> Result<()> {
    sys::cuStreamWaitValue64_v2(stream, addr, value, flags).call("cuStreamWaitValue64_v2")
}

/// `cuStreamWriteValue32_v2`.
///
/// # Safety
/// `stream` is live; `addr` is a live, 4-byte aligned device word until the write has completed.
pub(crate) unsafe fn stream_write_value32(
    stream: sys::CUstream,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> Result<()> {
    sys::cuStreamWriteValue32_v2(stream, addr, value, flags).call("cuStreamWriteValue32_v2")
}

/// `cuStreamWriteValue64_v2`.
///
/// # Safety
/// As [`stream_write_value32`], 8-byte aligned.
pub(crate) unsafe fn stream_write_value64(
    stream: sys::CUstream,
    addr: u64,
    value: u64,
    flags: c_uint,
) -> Result<()> {
    sys::cuStreamWriteValue64_v2(stream, addr, value, flags).call("cuStreamWriteValue64_v2")
}

/// `cuStreamQuery`: `Ok(true)` once all work queued on `stream` completed, `Ok(false)` while
/// some is pending (`CUDA_ERROR_NOT_READY`), an error otherwise.
///
/// # Safety
/// `stream` is a live stream.
pub(crate) unsafe fn stream_query(stream: sys::CUstream) -> Result<bool> {
    match sys::cuStreamQuery(stream) {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        e => e.call("cuStreamQuery").map(|_| false),
    }
}

/// `cuMemAlloc_v2`: `bytes` of device memory (not from a stream-ordered pool) in the current
/// context.
pub(crate) fn mem_alloc(bytes: usize) -> Result<u64> {
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: the out-pointer is valid; the driver checks the size and the context.
    unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }.call("cuMemAlloc_v2")?;
    Ok(ptr)
}

/// `cuMemFree_v2`. Blocks while any stream sits on a stream memory wait: call it through
/// [`crate::reaper::defer`].
///
/// # Safety
/// `ptr` came from [`mem_alloc`] and no pending or later work uses it.
pub(crate) unsafe fn mem_free(ptr: u64) -> Result<()> {
    sys::cuMemFree_v2(ptr).call("cuMemFree_v2")
}

/// `cuMemsetD32_v2`: sets `count` 32-bit words at `ptr` to `value` (queued on the legacy default
/// stream; asynchronous to the host for device memory).
///
/// # Safety
/// `ptr` is a live device allocation of at least `4 * count` bytes, 4-byte aligned.
pub(crate) unsafe fn memset_d32(ptr: u64, value: u32, count: usize) -> Result<()> {
    sys::cuMemsetD32_v2(ptr, value, count).call("cuMemsetD32_v2")
}

/// `cuMemcpyDtoDAsync_v2`.
///
/// # Safety
/// `dst` and `src` are live, non-overlapping device allocations of at least `bytes` bytes until
/// the copy has completed; `stream` is live.
pub(crate) unsafe fn memcpy_dtod_async(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: sys::CUstream,
) -> Result<()> {
    sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream).call("cuMemcpyDtoDAsync_v2")
}
