//! The one thin layer over raw CUDA driver calls, in cudarc's `result` style.
//!
//! Every function here wraps exactly one `cu*` call of `cudarc::driver::sys` and returns
//! [`crate::Result`], whose [`crate::Error::Cuda`] names that call. No other module of the host
//! crate calls `sys::cu*` directly: sticky-error recognition and deferred-error handling happen
//! once, in [`crate::error::CudaCall`], for every call that passes through here.
//!
//! Rooms, one per area of the driver API:
//! - [`graph`]: CUDA graphs (capture, instantiate, launch, destroy).
//! - [`memops`]: stream memory operations (`cuStreamWaitValue*`, `cuStreamWriteValue*`).
//! - [`hostmem`]: mapped host memory and 64-bit stream memory operations on it (Fence slots).
//! - [`core`]: contexts, functions, launches, streams, events, memory.
//! - [`peer`]: peer access between GPUs, peer copies, pool access for peers, stream priorities.
//! - [`nccl`]: NCCL (cudarc `nccl`, loaded at run time) communicators and collectives.
//! - [`tensor_map`]: TMA tensor maps (`cuTensorMapEncodeTiled`).
//! - [`callback`]: the thread-local "inside a host callback" flag (no CUDA call there).
//!
//! Layering (cudarc's `sys` -> `result` -> safe): this layer imports only [`crate::error`] and
//! itself, never a module above it (host/tests/layers.rs checks it).

pub(crate) mod callback;
pub(crate) mod core;
pub(crate) mod graph;
pub(crate) mod hostmem;
pub(crate) mod memops;
pub(crate) mod nccl;
pub(crate) mod peer;
pub(crate) mod tensor_map;

/// One lock for the driver calls that create or destroy code and memory resources
/// (`cuModuleLoadData`, `cuModuleGetFunction`, `cuFuncLoad`, `cuFuncIsLoaded`, `cuModuleUnload`,
/// `cuMemPoolCreate`, `cuMemPoolDestroy`, `cuMemHostAlloc`, `cuMemFreeHost`).
///
/// Each call is thread-safe by the CUDA driver API's contract, and none is on a hot path. Under
/// compute-sanitizer memcheck, though, two of them on different threads (`cuMemPoolDestroy`
/// beside `cuMemFreeHost` or `cuFuncIsLoaded`, `cuModuleUnload` beside `cuFuncIsLoaded`) crashed
/// inside `libcuda` beneath the sanitizer's hooks (H100, 2026-11-25, core stacks; 5 of 24
/// processes): serialising them costs nothing measurable and removes the interleaving. The lock
/// is a leaf: nothing holding it takes another warpline lock or waits for a host thread (the
/// reaper's gate keeps on-stream waits out of these calls, see [`crate::reaper`]).
pub(crate) fn resource_lock() -> std::sync::MutexGuard<'static, ()> {
    static RESOURCE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    RESOURCE.lock().unwrap_or_else(|e| e.into_inner())
}
