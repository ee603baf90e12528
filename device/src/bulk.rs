//! The bulk copy engine (TMA, non-tensor form), PTX ISA §9.7.9.25.4: `cp.async.bulk`.
//! Global -> shared copies complete on an mbarrier's transaction count; shared -> global copies
//! are tracked by bulk groups.

use core::arch::asm;

use super::mbarrier::Mbarrier;

/// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes`: copies `bytes` from
/// global `src` to this CTA's shared `dst`; the bytes count down `bar`'s transaction count (arm it
/// first with [`Mbarrier::arrive_expect_tx`]).
///
/// # Safety
/// `dst` and `src` 16-byte aligned, `bytes` a non-zero multiple of 16, both ranges valid and not
/// touched by others until `bar`'s phase completes.
#[inline(always)]
pub unsafe fn load(dst: u32, src: *const u8, bytes: u32, bar: Mbarrier) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{s}], {n}, [{b}];",
            d = in(reg32) dst, s = in(reg64) src, n = in(reg32) bytes, b = in(reg32) bar.addr(), options(nostack));
    }
}

/// `cp.async.bulk.global.shared::cta.bulk_group`: copies `bytes` from shared `src` to global `dst`.
///
/// # Safety
/// As [`load`]; `src` must not be overwritten before [`wait_group_read`] says it was read.
#[inline(always)]
pub unsafe fn store(dst: *mut u8, src: u32, bytes: u32) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("cp.async.bulk.global.shared::cta.bulk_group [{d}], [{s}], {n};",
            d = in(reg64) dst, s = in(reg32) src, n = in(reg32) bytes, options(nostack));
    }
}

/// `cp.async.bulk.commit_group`: closes this thread's current bulk group.
#[inline(always)]
pub fn commit_group() {
    // SAFETY: no operands.
    unsafe { asm!("cp.async.bulk.commit_group;", options(nostack)) };
}

/// `cp.async.bulk.wait_group.read N`: waits until at most `N` of this thread's bulk groups still
/// have to *read* their shared-memory source.
#[inline(always)]
pub fn wait_group_read<const N: u32>() {
    // SAFETY: immediate operand only.
    unsafe { asm!("cp.async.bulk.wait_group.read {n};", n = const N, options(nostack)) };
}

/// `cp.async.bulk.wait_group N`: waits until at most `N` bulk groups are pending (writes visible).
#[inline(always)]
pub fn wait_group<const N: u32>() {
    // SAFETY: immediate operand only.
    unsafe { asm!("cp.async.bulk.wait_group {n};", n = const N, options(nostack)) };
}

/// `fence.proxy.async.shared::cta`: orders this thread's generic-proxy shared-memory accesses with
/// later async-proxy (bulk copy) accesses, e.g. before a bulk store reads what threads wrote.
#[inline(always)]
pub fn fence_proxy_async_shared() {
    // SAFETY: no operands.
    unsafe { asm!("fence.proxy.async.shared::cta;", options(nostack)) };
}

/// `cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster`: copies
/// `bytes` from global `src` into the shared memory of every CTA of the cluster whose bit is set in
/// `cta_mask`, at the same offset `dst` in each; each destination CTA's barrier at offset `bar`
/// counts the bytes down (each arms its own with [`Mbarrier::arrive_expect_tx`]).
/// PTX ISA §9.7.9.25.4.1. ptxas advises `.target sm_90a` for `.multicast::cluster`.
///
/// # Safety
/// As [`load`], for every destination CTA; every CTA of `cta_mask` is live and has initialised
/// its barrier at `bar` (published to the cluster before the copy is issued).
#[inline(always)]
pub unsafe fn load_multicast(dst: u32, src: *const u8, bytes: u32, bar: Mbarrier, cta_mask: u16) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [{d}], [{s}], {n}, [{b}], {m};",
            d = in(reg32) dst, s = in(reg64) src, n = in(reg32) bytes, b = in(reg32) bar.addr(),
            m = in(reg16) cta_mask, options(nostack));
    }
}

/// `cp.async.bulk.prefetch.L2.global [src], bytes` (PTX ISA 8.3 §9.7.9.25.4.2, sm_90): brings
/// `bytes` of global memory from `src` into L2 ahead of a later load (a bulk or TMA copy, or plain
/// loads). A hint: nothing to wait for, no shared memory, no barrier.
///
/// # Safety
/// `src` is 16-byte aligned, `bytes` a multiple of 16, and `src..src + bytes` lies inside one
/// live global-memory allocation (unlike the tensor form, which clips to the map's tensor, this
/// form has no bounds of its own: treat an address outside the allocation as an invalid access).
#[inline(always)]
pub unsafe fn prefetch_l2(src: *const u8, bytes: u32) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("cp.async.bulk.prefetch.L2.global [{s}], {n};", s = in(reg64) src, n = in(reg32) bytes,
            options(nostack));
    }
}
