//! Driver wrappers for mapped (zero-copy) host memory and the 64-bit stream memory operations on
//! it: see [`super`]. Each function wraps one `cu*` call.

use std::ffi::c_void;

use cudarc::driver::sys;

use crate::error::{CudaCall, Result};

/// `cuMemHostAlloc(bytes, CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP)`: page-locked
/// host memory that every context of the process may pin and map. Needs a current context.
pub(crate) fn mem_host_alloc_mapped(bytes: usize) -> Result<*mut c_void> {
    let mut p = std::ptr::null_mut();
    let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
    let _lock = super::resource_lock();
    // SAFETY: `p` is a valid out-pointer; the result is checked.
    unsafe { sys::cuMemHostAlloc(&mut p, bytes, flags) }.call("cuMemHostAlloc")?;
    Ok(p)
}

/// `cuMemHostGetDevicePointer`: the device address of mapped host memory in the current context.
pub(crate) fn mem_host_get_device_pointer(p: *mut c_void) -> Result<u64> {
    let mut d = 0;
    // SAFETY: `d` is a valid out-pointer; `p` is checked by the driver.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut d, p, 0) }.call("cuMemHostGetDevicePointer")?;
    Ok(d)
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `p` came from [`mem_host_alloc_mapped`], is freed once, and no queued GPU work uses it.
pub(crate) unsafe fn mem_free_host(p: *mut c_void) -> Result<()> {
    let _lock = super::resource_lock();
    // SAFETY: the caller's contract.
    unsafe { sys::cuMemFreeHost(p) }.call("cuMemFreeHost")
}

/// `cuStreamWaitValue64(stream, addr, value, GEQ)`: later work on `stream` waits until the 64-bit
/// word at `addr` is `>= value` (unsigned).
///
/// # Safety
/// `stream` is a live stream; `addr` is a device-visible 8-byte-aligned word that stays allocated
/// until the wait has executed.
pub(crate) unsafe fn stream_wait_value64_geq(
    stream: sys::CUstream,
    addr: u64,
    value: u64,
) -> Result<()> {
    let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: the caller's contract.
    unsafe { sys::cuStreamWaitValue64_v2(stream, addr, value, flags) }.call("cuStreamWaitValue64")
}

/// `cuStreamWriteValue64(stream, addr, value, DEFAULT)`: after all earlier work on `stream`, with
/// a memory barrier before the write, stores `value` at `addr`.
///
/// # Safety
/// As [`stream_wait_value64_geq`].
pub(crate) unsafe fn stream_write_value64(
    stream: sys::CUstream,
    addr: u64,
    value: u64,
) -> Result<()> {
    let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    // SAFETY: the caller's contract.
    unsafe { sys::cuStreamWriteValue64_v2(stream, addr, value, flags) }.call("cuStreamWriteValue64")
}
