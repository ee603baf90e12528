//! `mbarrier`: the shared-memory barrier object with arrival counts, transaction counts and phases
//! (PTX ISA 8.0 §9.7.13.15). A barrier completes a phase when the pending arrival count reaches zero
//! (and, with `expect_tx`, the pending transaction bytes too); the phase bit then flips.
//!
//! An [`Mbarrier`] is a token for one barrier object: it can only be made with the `unsafe`
//! [`Mbarrier::at`] (or handed out by a [`Pipeline`](super::pipeline::Pipeline), itself made
//! unsafely), whose caller vouches for the address, the initialisation and the arrival protocol;
//! the operations on the token are then safe.

use core::arch::asm;

/// An `mbarrier` object (8 bytes, 8-byte aligned) in this CTA's shared memory, by its 32-bit
/// shared-window address.
#[derive(Clone, Copy)]
pub struct Mbarrier {
    addr: u32,
}

impl Mbarrier {
    /// The barrier at shared-window byte address `addr`.
    ///
    /// # Safety
    /// For as long as the returned token (or a copy) is used:
    /// - `addr` is 8-byte aligned and `addr..addr + 8` lies inside this CTA's shared memory
    ///   (static or the launch's dynamic shared memory), used for nothing but this barrier;
    /// - every operation other than [`Self::init`] happens after the barrier was initialised by
    ///   exactly one thread with [`Self::init`] and that initialisation was published to the
    ///   using threads ([`fence_init`] then a CTA or cluster barrier);
    /// - the users keep to one arrival protocol: within a phase, arrivals (including
    ///   `cp.async.mbarrier.arrive` and remote arrivals) never exceed the count given to `init`,
    ///   and transaction bytes announced with [`Self::arrive_expect_tx`] match the bytes copied
    ///   (PTX ISA §9.7.13.15.1: exceeding either is undefined behaviour).
    #[inline(always)]
    pub const unsafe fn at(addr: u32) -> Self {
        Self { addr }
    }

    /// Shared-window byte address of the barrier (8-byte aligned).
    #[inline(always)]
    pub const fn addr(self) -> u32 {
        self.addr
    }

    /// `mbarrier.init.shared::cta.b64` (PTX ISA §9.7.13.15.9): expected arrivals per phase =
    /// `count`, current phase 0, no pending transactions.
    ///
    /// # Safety
    /// `1 <= count < 2^20` (PTX ISA §9.7.13.15.1). Exactly one thread initialises each barrier,
    /// while no other thread uses it (before first use, or after every use of a previous
    /// initialisation is over); publish the initialisation with [`fence_init`] and a CTA (or
    /// cluster) barrier before anyone else uses it.
    #[inline(always)]
    pub unsafe fn init(self, count: u32) {
        // SAFETY: the address is a barrier of this CTA (contract of `at`); the caller has exclusive
        // use of it (contract above).
        unsafe {
            asm!("mbarrier.init.shared::cta.b64 [{a}], {c};", a = in(reg32) self.addr, c = in(reg32) count,
                options(nostack));
        }
    }

    /// `mbarrier.arrive.shared::cta.b64` (release, CTA scope; PTX ISA §9.7.13.15.13): counts one
    /// arrival; this thread's earlier memory operations happen before the phase completes for the
    /// waiters.
    #[inline(always)]
    pub fn arrive(self) {
        // SAFETY: an initialised barrier of this CTA whose arrivals keep to the init count
        // (contract of `Mbarrier::at`).
        unsafe {
            asm!("mbarrier.arrive.shared::cta.b64 _, [{a}];", a = in(reg32) self.addr, options(nostack))
        };
    }

    /// `mbarrier.arrive.expect_tx.shared::cta.b64` (PTX ISA §9.7.13.15.13): one arrival plus
    /// `bytes` of pending transactions (the bytes that `cp.async.bulk` copies complete on this
    /// barrier, see [`super::bulk::load`]).
    #[inline(always)]
    pub fn arrive_expect_tx(self, bytes: u32) {
        // SAFETY: as in `arrive`; the announced bytes match the copies (contract of `at`).
        unsafe {
            asm!("mbarrier.arrive.expect_tx.shared::cta.b64 _, [{a}], {b};", a = in(reg32) self.addr,
                b = in(reg32) bytes, options(nostack))
        };
    }

    /// `mbarrier.try_wait.parity.shared::cta.b64` (acquire, CTA scope; PTX ISA §9.7.13.15.16): true
    /// once the phase with parity `parity` (0 or 1; only bit 0 is used) has completed. A fresh
    /// barrier is in phase 0, so `try_wait_parity(1)` succeeds at once.
    #[inline(always)]
    pub fn try_wait_parity(self, parity: u32) -> bool {
        let done: u32;
        // SAFETY: an initialised barrier of this CTA (contract of `Mbarrier::at`); waiting has no
        // effect on the barrier's counts.
        unsafe {
            asm!(
                "{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [{a}], {ph}; selp.u32 {d}, 1, 0, p; }}",
                a = in(reg32) self.addr, ph = in(reg32) parity & 1, d = out(reg32) done, options(nostack)
            )
        };
        done != 0
    }

    /// Spins on [`Self::try_wait_parity`] until the phase with parity `parity` has completed.
    /// Never returns if the arrivals of that phase never come (a protocol error, not UB).
    #[inline(always)]
    pub fn wait_parity(self, parity: u32) {
        while !self.try_wait_parity(parity) {}
    }
}

/// `fence.mbarrier_init.release.cluster` (PTX ISA §9.7.12.4): makes preceding `mbarrier.init`s
/// visible to the cluster (and so to the CTA) before a following barrier.
#[inline(always)]
pub fn fence_init() {
    // SAFETY: a fence has no operands and touches no memory itself.
    unsafe { asm!("fence.mbarrier_init.release.cluster;", options(nostack)) };
}
