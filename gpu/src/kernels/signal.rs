//! Small kernels around signals (gpu/src/device/signal.rs): a device-side set, add and wait, and the
//! probes the ordering tests use (timed busy work that writes a known pattern, a copy, an arrival
//! recorder). All are grid-stride or single-thread and need no shared memory.

use core::sync::atomic::Ordering::Relaxed;

use crate::device::signal::{global_timer_ns, signal_add, signal_set, signal_wait_geq};
use crate::device::thread::{block_dim_x, block_idx_x, grid_dim_x, sync_threads, thread_idx_x};

fn is_first_thread() -> bool {
    thread_idx_x() == 0 && block_idx_x() == 0
}

/// Thread 0 of CTA 0 sets `*sig = value` (release, GPU scope).
///
/// # Safety
/// `sig`: 8-byte aligned, live global memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ws_signal_set(sig: *mut u64, value: u64) {
    if is_first_thread() {
        // SAFETY: the contract above.
        unsafe { signal_set(sig, value) };
    }
}

/// Thread 0 of CTA 0 adds `value` to `*sig` (atomic, release, GPU scope).
///
/// # Safety
/// `sig`: 8-byte aligned, live global memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ws_signal_add(sig: *mut u64, value: u64) {
    if is_first_thread() {
        // SAFETY: the contract above.
        unsafe { signal_add(sig, value) };
    }
}

/// Every CTA's thread 0 spins until `*sig >= value` (acquire), then the CTA exits. A kernel-side
/// wait like NVSHMEM's `signal_wait_until_on_stream` kernel: it holds its SMs while waiting.
///
/// # Safety
/// `sig`: 8-byte aligned, live global memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ws_signal_wait(sig: *const u64, value: u64) {
    if thread_idx_x() == 0 {
        // SAFETY: the contract above.
        unsafe { signal_wait_geq(sig, value) };
    }
    // SAFETY: every thread of the CTA reaches it; thread 0's spin loop ends before it, and the
    // warp reconverges at the end of the `if` (no other lane loops).
    unsafe { sync_threads() };
}

/// Heavy work with a known result: every thread spins for `spin_ns` nanoseconds of
/// `%globaltimer`, then the grid writes `out[i] = pattern(seed, i)` for `i < n` (grid-stride).
///
/// # Safety
/// `out`: live global memory of `n` u32.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ws_busy_fill(out: *mut u32, n: u32, seed: u32, spin_ns: u64) {
    let start = global_timer_ns();
    while global_timer_ns().wrapping_sub(start) < spin_ns {}
    let stride = grid_dim_x() * block_dim_x();
    let mut i = block_idx_x() * block_dim_x() + thread_idx_x();
    while i < n {
        // SAFETY: i < n, `out` holds n u32 (contract above); one writer per index.
        unsafe { *out.add(i as usize) = crate::contract::signal::pattern(seed, i) };
        i += stride;
    }
}

/// `dst[i] = src[i]` for `i < n` (grid-stride).
///
/// # Safety
/// `src`, `dst`: live global memory of `n` u32 each, not overlapping.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ws_copy_u32(src: *const u32, dst: *mut u32, n: u32) {
    let stride = grid_dim_x() * block_dim_x();
    let mut i = block_idx_x() * block_dim_x() + thread_idx_x();
    while i < n {
        // SAFETY: i < n, both hold n u32 and do not overlap (contract above).
        unsafe { *dst.add(i as usize) = *src.add(i as usize) };
        i += stride;
    }
}

/// Thread 0 of CTA 0 takes the next arrival number: `*slot = atomicAdd(counter, 1)` (relaxed is
/// enough: stream order already orders the kernels whose arrivals are compared).
///
/// # Safety
/// `counter`, `slot`: 4-byte aligned, live global memory.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ws_record_arrival(counter: *mut u32, slot: *mut u32) {
    if is_first_thread() {
        // SAFETY: both live and 4-byte aligned (contract above); `counter` is only accessed
        // atomically while kernels run.
        unsafe { *slot = core::sync::atomic::AtomicU32::from_ptr(counter).fetch_add(1, Relaxed) };
    }
}
