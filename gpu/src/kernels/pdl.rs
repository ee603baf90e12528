//! Programmatic Dependent Launch kernels (ch. 11, "Programmatic Dependent Launch" and "Combining
//! PDL and Thread Block Clusters with Warp Specialization"; PTX ISA §9.7.12.x `griddepcontrol`).
//!
//! The rule every kernel here follows (contract::pdl):
//! - `pdl::wait()` before the first access to memory that the previous kernel on the stream
//!   writes or reads (read-after-write *and* write-after-read); work before it (shared memory
//!   setup, mbarrier init, index arithmetic) overlaps the previous kernel's tail. A global load
//!   before the wait is allowed only of an input that the launch contract says the previous
//!   kernel does not write (secondary_gemm's B); any buffer a caller may chain behind a primary
//!   (pdl_consumer's `scale`, say) is read after the wait.
//! - `pdl::launch_dependents()` after the CTA's last store that the next kernel reads, behind a
//!   CTA barrier, because the first thread of a CTA to execute it triggers for the whole CTA.
//!
//! `wait` returns only once the previous grid has *completed* and its memory is visible, so the
//! trigger's position decides how early the next grid is scheduled, not what it reads.
//!
//! ```text
//!   pair:       pdl_producer  [wait | buf = 2 inp + 1 | sync | trigger]
//!               pdl_consumer       [index setup | wait | out = buf * scale | sync | trigger]
//!   GEMM pair:  primary_gemm   cluster of 2 CTAs: producer warp --cp.async/mbarrier--> 4 consumer
//!                              warps (each CTA half of K) -> DSMEM split-K reduction -> wait ->
//!                              store C -> cluster sync -> trigger
//!               secondary_gemm barriers + B tiles (independent) -> wait -> A tiles (= primary's C)
//! ```
//!
//! The GEMM pair is not a GEMM of its own: both entries run the split-K schedule of the FP32 GEMM
//! path in gemm.rs (the mainloop and epilogue of `cluster_tile_gemm`), with its PDL option
//! (`Pdl::WaitBeforeStore` for the primary, `Pdl::WaitBeforeA` for the secondary).

use super::gemm::{split_k_gemm, Pdl};
use crate::device::pdl;
use crate::device::thread::{block_dim_x, block_idx_x, grid_dim_x, sync_threads, thread_idx_x};

/// Global index of this thread.
#[inline(always)]
fn global_thread() -> u64 {
    block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64
}

/// Visits the indices `< n` this thread owns in a grid-stride loop.
#[inline(always)]
fn for_each_index(n: u64, mut f: impl FnMut(usize)) {
    let stride = grid_dim_x() as u64 * block_dim_x() as u64;
    let mut i = global_thread();
    while i < n {
        f(i as usize);
        i += stride;
    }
}

/// Trigger after every thread of the CTA has made its stores (the first trigger in a CTA counts).
///
/// # Safety
/// As [`sync_threads`]: every thread of the CTA calls it, each warp convergently.
#[inline(always)]
unsafe fn trigger_after_cta_stores() {
    // SAFETY: the caller's contract above.
    unsafe { sync_threads() };
    pdl::launch_dependents();
}

// ---------------------------------------------------------------------------------------------
// kernel_A / kernel_B pair
// ---------------------------------------------------------------------------------------------

/// Producer role of the pair: `buf[i] = 2 * inp[i] + 1`.
///
/// # Safety
/// `inp` readable and `buf` writable for `n` f32 each (4-byte aligned), not overlapping, and not
/// accessed by other kernels while this one runs (`pdl::wait` has returned).
#[inline(always)]
unsafe fn produce(inp: *const f32, buf: *mut f32, n: u64) {
    // SAFETY: i < n (contract above); each index is visited by one thread.
    for_each_index(n, |i| unsafe { *buf.add(i) = 2.0 * *inp.add(i) + 1.0 });
}

/// `pdl_producer`: waits for the previous kernel (which may still read `buf`), writes
/// `buf[i] = 2 * inp[i] + 1` for `i < n`, then triggers the dependent launch.
///
/// Launch: `PAIR_THREADS` threads, any grid, no shared memory, with or without PDL. `inp`, `buf`:
/// `n` f32 each, not overlapping.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn pdl_producer(inp: *const f32, buf: *mut f32, n: u64) {
    pdl::wait();
    // SAFETY: the launch contract; the previous kernel has completed (wait); every thread of the
    // CTA reaches the trigger (no early exits, the loop is not divergent at its end).
    unsafe {
        produce(inp, buf, n);
        trigger_after_cta_stores();
    }
}

/// Test-only negative control: as [`pdl_producer`] but triggers *before* its stores, breaking
/// the chapter's rule. A dependent that waits still reads the right data (`wait` waits for
/// completion); one that reads before waiting sees stale data.
///
/// # Safety
/// As [`pdl_producer`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn pdl_producer_early_trigger(
    inp: *const f32,
    buf: *mut f32,
    n: u64,
) {
    pdl::launch_dependents();
    pdl::wait();
    // SAFETY: the launch contract; the previous kernel has completed (wait).
    unsafe { produce(inp, buf, n) };
}

/// Consumer role of the pair: `out[i] = buf[i] * scale[i]`.
///
/// # Safety
/// `buf`, `scale` readable and `out` writable for `n` f32 each (4-byte aligned), `out` overlapping
/// neither; for a correct result, called after `pdl::wait` (the producer wrote `buf`).
#[inline(always)]
unsafe fn consume(buf: *const f32, scale: *const f32, out: *mut f32, n: u64) {
    // SAFETY: i < n (contract above); each index is visited by one thread.
    for_each_index(n, |i| unsafe { *out.add(i) = *buf.add(i) * *scale.add(i) });
}

/// `pdl_consumer`: waits for the previous kernel, then `out[i] = buf[i] * scale[i]` for `i < n`,
/// then triggers. Nothing is read from global memory before the wait: the previous kernel on the
/// stream may write `scale` as well as `buf` (a caller may chain any kernel in front), so the only
/// work that overlaps its tail is this kernel's launch and index setup.
///
/// Launch: `PAIR_THREADS` threads, any grid, no shared memory, with PDL after `pdl_producer`.
/// `buf`, `scale`, `out`: `n` f32 each; `out` overlaps neither.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn pdl_consumer(
    buf: *const f32,
    scale: *const f32,
    out: *mut f32,
    n: u64,
) {
    // Every global read (buf and scale) after the wait: see the doc comment.
    pdl::wait();
    // SAFETY: the launch contract; the previous kernel has completed (wait); every thread of the
    // CTA reaches the trigger.
    unsafe {
        consume(buf, scale, out, n);
        trigger_after_cta_stores();
    }
}

/// Test-only negative control: [`pdl_consumer`] without the `wait` (reads `buf` while the
/// producer may still be writing it).
///
/// # Safety
/// As [`pdl_consumer`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn pdl_consumer_no_wait(
    buf: *const f32,
    scale: *const f32,
    out: *mut f32,
    n: u64,
) {
    // SAFETY: the launch contract (memory safe; the result is racy by design).
    unsafe { consume(buf, scale, out, n) };
}

// ---------------------------------------------------------------------------------------------
// chain_step
// ---------------------------------------------------------------------------------------------

/// `chain_step`: `x[i] += 1` (wrapping u32) for `i < n`. Waits at start (the previous step wrote
/// `x`), triggers after its stores, so a chain of them launched with PDL is correct.
///
/// Launch: `CHAIN_STEP_THREADS` threads, any grid, no shared memory; `x`: `n` u32.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn chain_step(x: *mut u32, n: u64) {
    pdl::wait();
    // SAFETY: i < n, `x` holds n u32 (launch contract); each index is visited by one thread.
    for_each_index(n, |i| unsafe { *x.add(i) = (*x.add(i)).wrapping_add(1) });
    // SAFETY: every thread of the CTA reaches the trigger.
    unsafe { trigger_after_cta_stores() };
}

// ---------------------------------------------------------------------------------------------
// primary_gemm / secondary_gemm: the split-K FP32 GEMM of gemm.rs with its PDL option
// ---------------------------------------------------------------------------------------------

/// `primary_gemm`: `C = A · B`, f32, row-major; A `m x k`, B `k x n`, C `m x n`. Clusters of
/// `CLUSTER_CTAS` CTAs; cluster `x` computes the `TILE_M x TILE_N` tile `x` of C (row-major over
/// tiles), each CTA half of K, reduced through DSMEM. Waits (PDL) only before storing C, triggers
/// after its last store of C.
///
/// Launch: grid `CLUSTER_CTAS x ceil(m/TILE_M) x ceil(n/TILE_N)` CTAs with cluster dimension
/// `CLUSTER_CTAS`, `GEMM_THREADS` threads, `GEMM_SMEM_BYTES` dynamic shared memory. `k`, `n`
/// multiples of 4, pointers 16-byte aligned, `m, n, k >= 1`; `stamps` null or
/// `grid x STAMPS_PER_CTA` u64 (start, trigger, end). With PDL, the previous kernel on the stream
/// must write neither `a` nor `b` (both are read before `pdl::wait()`).
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn primary_gemm(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    m: u32,
    n: u32,
    k: u32,
    stamps: *mut u64,
) {
    // SAFETY: the launch contract above (A and B independent of the previous kernel).
    unsafe { split_k_gemm(Pdl::WaitBeforeStore, a, b, c, m, n, k, stamps) };
}

/// `secondary_gemm`: as [`primary_gemm`] where A is the primary's output. Its prologue (mbarrier
/// init, the B tiles of the first `STAGES` stages) runs before `pdl::wait()`; A tiles are loaded
/// after it. `stamps`: start, wait returned, end.
///
/// Launch: as [`primary_gemm`]; in addition the previous kernel on the stream must not write `b`
/// (it is read before `pdl::wait()`), only `a` (= its C).
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn secondary_gemm(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    m: u32,
    n: u32,
    k: u32,
    stamps: *mut u64,
) {
    // SAFETY: the launch contract above (B independent of the previous kernel).
    unsafe { split_k_gemm(Pdl::WaitBeforeA, a, b, c, m, n, k, stamps) };
}
