//! Launchers of the signal kernels and ordering probes (gpu/src/kernels/signal.rs). They take raw
//! device addresses because the probes deliberately use one allocation from several streams (the
//! ordering under test is what makes that safe), so they are `unsafe`: the caller guarantees the
//! addresses and the cross-stream ordering. None needs dynamic shared memory, so none is in
//! [`KERNEL_SPECS`](crate::kernels::KERNEL_SPECS); each is looked up by name.

use warpline_gpu::contract::signal as contract;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::launch::{launch_raw, LaunchConfig};
use crate::params;
use crate::stream::Stream;

fn single(dev: &Device, stream: &Stream, kernel: &str, a: u64, b: u64) -> Result<()> {
    let k = dev.kernel(kernel)?;
    let cfg = LaunchConfig::linear(1, 1, 0);
    // SAFETY: every single-thread signal kernel takes (pointer, u64); the caller of the public
    // wrapper guarantees the pointer (see each wrapper's contract).
    unsafe { launch_raw(dev, k, stream, &cfg, &mut params![a, b]) }
}

fn check_n(what: &'static str, n: u32) -> Result<()> {
    if n == 0 {
        return Err(Error::Empty { what });
    }
    Ok(())
}

fn grid_for(dev: &Device, n: u32) -> u32 {
    n.div_ceil(contract::THREADS_PER_CTA)
        .min(dev.capabilities().sm_count * 4)
        .max(1)
}

/// Queues `ws_signal_add`: one thread adds `value` to the u64 at `sig` (`atom.add.release.gpu`).
///
/// # Safety
/// `sig` is an 8-byte aligned live device address of a u64 that no plain (non-atomic) access
/// races with while the kernel runs.
pub unsafe fn signal_add(dev: &Device, stream: &Stream, sig: u64, value: u64) -> Result<()> {
    super::check_aligned("signal_add signal", sig, 8)?;
    single(dev, stream, contract::ADD_KERNEL, sig, value)
}

/// Queues `ws_signal_set`: one thread stores `value` to the u64 at `sig` (`st.release.gpu`).
///
/// # Safety
/// As [`signal_add`].
pub unsafe fn signal_set(dev: &Device, stream: &Stream, sig: u64, value: u64) -> Result<()> {
    super::check_aligned("signal_set signal", sig, 8)?;
    single(dev, stream, contract::SET_KERNEL, sig, value)
}

/// Queues `ws_signal_wait` with `ctas` CTAs: each spins (`ld.acquire.gpu`) until the u64 at `sig`
/// is `>= value`, holding its SM, like NVSHMEM's on-stream wait kernel (second seed).
///
/// # Safety
/// As [`signal_add`]; and something must eventually set the signal, or the kernel never ends.
pub unsafe fn signal_wait_kernel(
    dev: &Device,
    stream: &Stream,
    sig: u64,
    value: u64,
    ctas: u32,
) -> Result<()> {
    super::check_aligned("signal_wait signal", sig, 8)?;
    check_n("signal_wait CTAs", ctas)?;
    let k = dev.kernel(contract::WAIT_KERNEL)?;
    let cfg = LaunchConfig::linear(ctas, 32, 0);
    // SAFETY: parameters match `ws_signal_wait(*const u64, u64)`; the caller guarantees `sig`.
    unsafe { launch_raw(dev, k, stream, &cfg, &mut params![sig, value]) }
}

/// Queues `ws_busy_fill`: every thread spins `spin_ns` nanoseconds, then `out[i] =
/// warpline_gpu::contract::signal::pattern(seed, i)` for `i < n`.
///
/// # Safety
/// `out` is a live, 4-byte aligned device allocation of at least `n` u32, not accessed by other
/// work that may run concurrently.
pub unsafe fn busy_fill(
    dev: &Device,
    stream: &Stream,
    out: u64,
    n: u32,
    seed: u32,
    spin_ns: u64,
) -> Result<()> {
    check_n("busy_fill elements", n)?;
    super::check_aligned("busy_fill output", out, 4)?;
    let k = dev.kernel(contract::BUSY_FILL_KERNEL)?;
    let cfg = LaunchConfig::linear(grid_for(dev, n), contract::THREADS_PER_CTA, 0);
    // SAFETY: parameters match `ws_busy_fill(*mut u32, u32, u32, u64)`; caller guarantees `out`.
    unsafe { launch_raw(dev, k, stream, &cfg, &mut params![out, n, seed, spin_ns]) }
}

/// Queues `ws_copy_u32`: `dst[i] = src[i]` for `i < n`.
///
/// # Safety
/// `src` and `dst` are live, 4-byte aligned, non-overlapping device allocations of at least `n`
/// u32; `src` is not written and `dst` not accessed by work that may run concurrently.
pub unsafe fn copy_u32(dev: &Device, stream: &Stream, src: u64, dst: u64, n: u32) -> Result<()> {
    check_n("copy_u32 elements", n)?;
    super::check_aligned("copy_u32 source", src, 4)?;
    super::check_aligned("copy_u32 destination", dst, 4)?;
    let k = dev.kernel(contract::COPY_KERNEL)?;
    let cfg = LaunchConfig::linear(grid_for(dev, n), contract::THREADS_PER_CTA, 0);
    // SAFETY: parameters match `ws_copy_u32(*const u32, *mut u32, u32)`; caller guarantees them.
    unsafe { launch_raw(dev, k, stream, &cfg, &mut params![src, dst, n]) }
}

/// Queues `ws_record_arrival`: `*slot = atomicAdd(counter, 1)`, so kernels on several streams
/// record the order in which they ran.
///
/// # Safety
/// `counter` and `slot` are live, 4-byte aligned device addresses of u32; `slot` is not accessed
/// by work that may run concurrently.
pub unsafe fn record_arrival(dev: &Device, stream: &Stream, counter: u64, slot: u64) -> Result<()> {
    super::check_aligned("record_arrival counter", counter, 4)?;
    super::check_aligned("record_arrival slot", slot, 4)?;
    let k = dev.kernel(contract::ARRIVAL_KERNEL)?;
    let cfg = LaunchConfig::linear(1, 1, 0);
    // SAFETY: parameters match `ws_record_arrival(*mut u32, *mut u32)`; caller guarantees them.
    unsafe { launch_raw(dev, k, stream, &cfg, &mut params![counter, slot]) }
}
