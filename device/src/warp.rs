//! Warp and lane indices and the warp barrier.

use core::arch::asm;

use super::thread::thread_idx_x;
use crate::WARP_SIZE;

/// Lane of this thread in its warp, 0..32 (`%laneid`).
#[inline(always)]
pub fn lane_id() -> u32 {
    let lane: u32;
    // SAFETY: reading a special register.
    unsafe { asm!("mov.u32 {l}, %laneid;", l = out(reg32) lane, options(nomem, nostack, pure)) };
    lane
}

/// Warp of this thread in its CTA (1-D CTAs): `threadIdx.x / 32`.
#[inline(always)]
pub fn warp_id() -> u32 {
    thread_idx_x() / WARP_SIZE
}

/// `__syncwarp()` for a full warp (`bar.warp.sync 0xffffffff`, PTX ISA 8.0 §9.7.13.2): waits
/// until all 32 lanes of the warp reach it (reconverging them) and orders their memory accesses.
///
/// # Safety
/// All 32 lanes of the warp are active (none exited) and each executes a `bar.warp.sync` with the
/// full mask (PTX ISA: every thread of `membermask` must execute it, otherwise the behaviour is
/// undefined); on sm_70+ the lanes need not arrive convergently, this call reconverges them.
#[inline(always)]
pub unsafe fn sync_warp() {
    // SAFETY: the caller's contract above (all 32 lanes, full mask).
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) };
}
