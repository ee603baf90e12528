//! `mbarrier`: the shared-memory barrier object with arrival counts, transaction counts and phases
//! (PTX ISA §9.7.13.15). A barrier completes a phase when the pending arrival count reaches zero
//! (and, with `expect_tx`, the pending transaction bytes too); the phase bit then flips.

use core::arch::asm;

/// An `mbarrier` object at an 8-byte aligned shared-window address.
#[derive(Clone, Copy)]
pub struct Mbarrier {
    addr: u32,
}

impl Mbarrier {
    /// The barrier at shared-window byte address `addr` (8-byte aligned).
    #[inline(always)]
    pub const fn at(addr: u32) -> Self {
        Self { addr }
    }

    /// Shared-window byte address of the barrier.
    #[inline(always)]
    pub const fn addr(self) -> u32 {
        self.addr
    }

    /// `mbarrier.init`: expected arrivals per phase = `count`, current phase 0.
    ///
    /// # Safety
    /// One thread initialises each barrier, before any other thread uses it; publish the
    /// initialisation with [`fence_init`] and a CTA (or cluster) barrier.
    #[inline(always)]
    pub unsafe fn init(self, count: u32) {
        asm!("mbarrier.init.shared::cta.b64 [{a}], {c};", a = in(reg32) self.addr, c = in(reg32) count,
            options(nostack));
    }

    /// `mbarrier.arrive` (release, CTA scope): counts one arrival; this thread's earlier memory
    /// operations happen before the phase completes for the waiters.
    #[inline(always)]
    pub fn arrive(self) {
        // SAFETY: the barrier was initialised (type invariant of pipelines that hand these out).
        unsafe {
            asm!("mbarrier.arrive.shared::cta.b64 _, [{a}];", a = in(reg32) self.addr, options(nostack))
        };
    }

    /// `mbarrier.arrive.expect_tx`: one arrival plus `bytes` of pending transactions (the bytes that
    /// `cp.async.bulk` copies complete on this barrier).
    #[inline(always)]
    pub fn arrive_expect_tx(self, bytes: u32) {
        // SAFETY: as in `arrive`.
        unsafe {
            asm!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{a}], {b};", a = in(reg32) self.addr,
                b = in(reg32) bytes, options(nostack))
        };
    }

    /// `mbarrier.try_wait.parity` (acquire, CTA scope): true once the phase with parity `parity`
    /// has completed. A fresh barrier is in phase 0, so `try_wait_parity(1)` succeeds at once.
    #[inline(always)]
    pub fn try_wait_parity(self, parity: u32) -> bool {
        let done: u32;
        // SAFETY: as in `arrive`.
        unsafe {
            asm!(
                "{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{a}], {ph}; selp.u32 {d}, 1, 0, p; }}",
                a = in(reg32) self.addr, ph = in(reg32) parity, d = out(reg32) done, options(nostack)
            )
        };
        done != 0
    }

    /// Spins on [`Self::try_wait_parity`] until the phase with parity `parity` has completed.
    #[inline(always)]
    pub fn wait_parity(self, parity: u32) {
        while !self.try_wait_parity(parity) {}
    }
}

/// `fence.mbarrier_init.release.cluster`: makes preceding `mbarrier.init`s visible to the cluster
/// (and so to the CTA) before a following barrier.
#[inline(always)]
pub fn fence_init() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}
