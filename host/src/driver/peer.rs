//! Driver wrappers: see [`super`]. Each function wraps one `cu*` call of peer access between GPUs
//! (CUDA driver API, "Peer Context Memory Access": `cuDeviceCanAccessPeer`,
//! `cuCtxEnablePeerAccess`), copies between contexts (`cuMemcpyPeerAsync`, "Memory Management"),
//! access to stream-ordered pool memory from peers (`cuMemPoolSetAccess`, "Stream Ordered Memory
//! Allocator") and stream priorities (`cuCtxGetStreamPriorityRange`).
//!
//! Nothing here creates multicast objects: `cuMulticastCreate` (NVLink SHARP) must never be
//! called by warpline (safety rule of `docs/multi-gpu.md`).

use std::ffi::c_int;

use cudarc::driver::sys;

use crate::error::{CudaCall, Result};

/// `cuDeviceCanAccessPeer`: whether `dev` can map memory of `peer` (both driver device handles).
pub(crate) fn device_can_access_peer(dev: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer; the handles come from the driver.
    unsafe { sys::cuDeviceCanAccessPeer(&mut v, dev, peer) }.call("cuDeviceCanAccessPeer")?;
    Ok(v != 0)
}

/// `cuCtxEnablePeerAccess(peer, 0)` from the current context. `Ok(true)` when access was enabled
/// now, `Ok(false)` for `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` (NCCL and other libraries
/// enable it too; that is not an error).
pub(crate) fn ctx_enable_peer_access(peer: sys::CUcontext) -> Result<bool> {
    // SAFETY: `peer` is a live context handle owned by a `CudaContext` the caller holds.
    match unsafe { sys::cuCtxEnablePeerAccess(peer, 0) } {
        sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(false),
        r => r.call("cuCtxEnablePeerAccess").map(|()| true),
    }
}

/// `cuMemcpyPeerAsync`: `bytes` from `src` in `src_ctx` to `dst` in `dst_ctx`, ordered on `s`
/// (runs on the copy engines; over NVLink when peer access is enabled).
///
/// # Safety
/// Both ranges are live device allocations of at least `bytes` bytes in their contexts, not
/// written by other work while the copy runs, and stay allocated until it completes on `s`.
pub(crate) unsafe fn memcpy_peer_async(
    dst: sys::CUdeviceptr,
    dst_ctx: sys::CUcontext,
    src: sys::CUdeviceptr,
    src_ctx: sys::CUcontext,
    bytes: usize,
    s: sys::CUstream,
) -> Result<()> {
    sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, bytes, s).call("cuMemcpyPeerAsync")
}

/// `cuMemPoolSetAccess`: read-write access to `pool`'s memory for device ordinal `peer`.
pub(crate) fn mem_pool_set_access_rw(pool: sys::CUmemoryPool, peer: i32) -> Result<()> {
    // SAFETY: zero is a valid bit pattern for this plain C struct; the fields used are set.
    let mut desc: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    desc.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = peer;
    desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    // SAFETY: live pool; one valid descriptor.
    unsafe { sys::cuMemPoolSetAccess(pool, &desc, 1) }.call("cuMemPoolSetAccess")
}

/// `cuCtxGetStreamPriorityRange` of the current context: (least, greatest) priority; numerically
/// lower is higher priority.
pub(crate) fn ctx_stream_priority_range() -> Result<(i32, i32)> {
    let (mut least, mut greatest): (c_int, c_int) = (0, 0);
    // SAFETY: valid out-pointers.
    unsafe { sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest) }
        .call("cuCtxGetStreamPriorityRange")?;
    Ok((least, greatest))
}
