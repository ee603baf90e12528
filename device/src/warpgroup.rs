//! Warpgroups (four consecutive warps, 128 threads: the unit that issues `wgmma`), register
//! reallocation between them (`setmaxnreg`, PTX ISA 8.3 §9.7.17.1, sm_90a) and named barriers
//! scoped to a set of warps (`bar.sync id, count`, §9.7.13.1).

use core::arch::asm;

use super::thread::thread_idx_x;

/// Threads per warpgroup.
pub const WARPGROUP_THREADS: u32 = 128;

/// Index of this thread's warpgroup in a 1-D CTA (`threadIdx.x / 128`).
#[inline(always)]
pub fn warpgroup_idx() -> u32 {
    thread_idx_x() / WARPGROUP_THREADS
}

/// This thread's index within its warpgroup, `0..128`.
#[inline(always)]
pub fn thread_in_warpgroup() -> u32 {
    thread_idx_x() % WARPGROUP_THREADS
}

/// `setmaxnreg.inc.sync.aligned.u32 REGS`: raises this warpgroup's per-thread register limit to
/// `REGS` (24..=256, a multiple of 8), blocking until the CTA's register pool has them (registers
/// other warpgroups released with [`setmaxnreg_dec`]).
///
/// # Safety
/// Warpgroup-collective (all 128 threads, convergently). The kernel's entry has launch bounds
/// (`warpline_device::launch_bounds!`) so ptxas knows the register count at entry, and the
/// CTA's warpgroups together never ask for more registers than the CTA was launched with, or the
/// call blocks forever.
#[inline(always)]
pub unsafe fn setmaxnreg_inc<const REGS: u32>() {
    const { assert!(REGS >= 24 && REGS <= 256 && REGS.is_multiple_of(8)) };
    // SAFETY: immediate operand; the caller's contract above.
    unsafe { asm!("setmaxnreg.inc.sync.aligned.u32 {r};", r = const REGS, options(nostack)) };
}

/// `setmaxnreg.dec.sync.aligned.u32 REGS`: lowers this warpgroup's per-thread register limit to
/// `REGS` (24..=256, a multiple of 8) and returns the rest to the CTA's pool.
///
/// # Safety
/// As [`setmaxnreg_inc`]; the warpgroup's live values fit in `REGS` registers from here on
/// (ptxas allocates accordingly).
#[inline(always)]
pub unsafe fn setmaxnreg_dec<const REGS: u32>() {
    const { assert!(REGS >= 24 && REGS <= 256 && REGS.is_multiple_of(8)) };
    // SAFETY: immediate operand; the caller's contract above.
    unsafe { asm!("setmaxnreg.dec.sync.aligned.u32 {r};", r = const REGS, options(nostack)) };
}

/// A named barrier (`bar.sync id, threads`): hardware barrier `id` (1..=15; 0 is
/// `__syncthreads`'s) that completes when `threads` threads (a multiple of 32, whole warps) have
/// arrived, e.g. the 128 threads of one warpgroup.
#[derive(Clone, Copy)]
pub struct NamedBarrier {
    id: u32,
    threads: u32,
}

impl NamedBarrier {
    /// Barrier `id` for `threads` threads.
    ///
    /// # Safety
    /// `1 <= id <= 15`, `threads` a non-zero multiple of 32 not above the CTA's size; in each
    /// use exactly `threads` threads, whole warps executing convergently, call [`Self::sync`] on
    /// this id, and no other barrier use of `id` overlaps (otherwise the CTA hangs or the
    /// behaviour is undefined, PTX ISA §9.7.13.1).
    #[inline(always)]
    pub const unsafe fn new(id: u32, threads: u32) -> Self {
        Self { id, threads }
    }

    /// `bar.arrive id, threads` (PTX ISA 8.3 §9.7.13.1 `bar.arrive`): counts this warp's
    /// threads towards the barrier without waiting. The producer half of a producer/consumer
    /// use of a named barrier, e.g. FlashAttention-3's ping-pong between consumer warpgroups
    /// (one warpgroup arrives, the other [`Self::sync`]s, `threads` = both warpgroups).
    /// `bar.arrive` has no memory ordering of its own.
    ///
    /// # Safety
    /// As [`Self::new`]: in each use of the barrier the threads that arrive plus those that
    /// sync are exactly `threads`, whole warps convergently; a warp does not arrive twice on
    /// the same use (every arrival is matched by a completed use before the next).
    #[inline(always)]
    pub unsafe fn arrive(self) {
        // SAFETY: id and count are valid; the caller keeps the arrival protocol above.
        unsafe {
            asm!("bar.arrive {i}, {n};", i = in(reg32) self.id, n = in(reg32) self.threads, options(nostack))
        };
    }

    /// `bar.sync id, threads`: waits for the barrier's threads; orders their shared-memory
    /// accesses before it with those after it (CTA scope).
    #[inline(always)]
    pub fn sync(self) {
        // SAFETY: id and count are valid and the participants keep to them (contract of `new`).
        unsafe {
            asm!("bar.sync {i}, {n};", i = in(reg32) self.id, n = in(reg32) self.threads, options(nostack))
        };
    }
}
