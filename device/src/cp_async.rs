//! `cp.async`: asynchronous copies from global to shared memory (PTX ISA §9.7.9.25), tracked by
//! commit groups or by an mbarrier.

use core::arch::asm;

use super::mbarrier::Mbarrier;

/// `cp.async.cg.shared.global` of 16 bytes (L2 only, bypasses L1).
///
/// # Safety
/// `dst` is a 16-byte aligned shared-window address inside the CTA's shared memory; `src` is a
/// 16-byte aligned global address of 16 readable bytes. Neither is touched by others until the copy
/// is known complete (wait_group or an mbarrier).
#[inline(always)]
pub unsafe fn copy_16(dst: u32, src: *const f32) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16;", d = in(reg32) dst, s = in(reg64) src,
            options(nostack));
    }
}

/// `cp.async.ca.shared.global` of 4 bytes (for ragged tails).
///
/// # Safety
/// As [`copy_16`], with 4-byte alignment and size.
#[inline(always)]
pub unsafe fn copy_4(dst: u32, src: *const f32) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("cp.async.ca.shared.global [{d}], [{s}], 4;", d = in(reg32) dst, s = in(reg64) src,
            options(nostack));
    }
}

/// `cp.async.commit_group`: closes the group of this thread's copies issued since the last commit.
#[inline(always)]
pub fn commit_group() {
    // SAFETY: no operands.
    unsafe { asm!("cp.async.commit_group;", options(nostack)) };
}

/// `cp.async.wait_group N`: waits until at most `N` of this thread's committed groups are pending.
#[inline(always)]
pub fn wait_group<const N: u32>() {
    // SAFETY: no operands besides the immediate.
    unsafe { asm!("cp.async.wait_group {n};", n = const N, options(nostack)) };
}

/// `cp.async.wait_all`: waits for all of this thread's copies.
#[inline(always)]
pub fn wait_all() {
    // SAFETY: no operands.
    unsafe { asm!("cp.async.wait_all;", options(nostack)) };
}

/// `cp.async.mbarrier.arrive.noinc.shared::cta.b64` (PTX ISA 8.0 §9.7.9.25.3.1): the barrier
/// receives one arrival from this thread once all of this thread's earlier `cp.async` copies have
/// completed. `noinc`: the arrival is one of the counts given at `mbarrier.init`, so count one per
/// calling thread.
///
/// # Safety
/// The arrival is one of the counts `bar` expects in its current phase (the arrival protocol of
/// [`Mbarrier::at`]; the pending count is not incremented, so an arrival nobody counted
/// completes the phase early or over-arrives, which is undefined behaviour). `bar` stays a live
/// barrier of this CTA until the copies complete.
#[inline(always)]
pub unsafe fn arrive_on(bar: Mbarrier) {
    // SAFETY: an initialised barrier of this CTA (the token's contract) and a counted arrival
    // (the caller's contract above).
    unsafe {
        asm!("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [{a}];", a = in(reg32) bar.addr(),
            options(nostack))
    };
}

/// `cp.async.cg.shared.global` of 16 bytes with a source size: copies `src_bytes` (0 or 16) bytes
/// and zero-fills the rest of the 16, so out-of-range tile chunks become zeros without a branch
/// around the copy (PTX ISA §9.7.9.25.3, `cp-size` / `src-size`).
///
/// # Safety
/// As [`copy_16`]; `src` must be a valid global address even when `src_bytes` is 0.
#[inline(always)]
pub unsafe fn copy_16_zfill(dst: u32, src: *const f32, src_bytes: u32) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("cp.async.cg.shared.global [{d}], [{s}], 16, {n};", d = in(reg32) dst, s = in(reg64) src,
            n = in(reg32) src_bytes, options(nostack));
    }
}
