//! Warp and lane indices and the warp barrier.

use core::arch::asm;

use super::thread::thread_idx_x;
use crate::contract::WARP_SIZE;

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

/// `__syncwarp()` for a full warp (`bar.warp.sync 0xffffffff`).
#[inline(always)]
pub fn sync_warp() {
    // SAFETY: all 32 lanes call it together.
    unsafe { asm!("bar.warp.sync 0xffffffff;", options(nostack)) };
}
