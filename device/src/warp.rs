//! Warp and lane indices, the warp barrier and warp shuffles (`shfl.sync`) with reductions.

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

/// `shfl.sync.bfly.b32` with the full mask (PTX ISA 8.0, data-movement instructions:
/// `shfl.sync`): the value of lane
/// `lane_id() ^ lane_mask` (`lane_mask < 32`), as an `f32`.
///
/// # Safety
/// All 32 lanes of the warp are active and each executes this same shuffle (the full
/// `membermask`: a lane of the mask that does not execute it is undefined behaviour, PTX ISA
/// `shfl.sync`). The lanes need not arrive convergently: `shfl.sync` waits for all of them.
#[inline(always)]
pub unsafe fn shfl_xor_f32(v: f32, lane_mask: u32) -> f32 {
    let r: f32;
    // SAFETY: the caller's contract above (all 32 lanes, full mask).
    unsafe {
        asm!("shfl.sync.bfly.b32 {r}, {v}, {m}, 0x1f, 0xffffffff;", r = out(reg32) r,
            v = in(reg32) v, m = in(reg32) lane_mask, options(nomem, nostack))
    };
    r
}

/// `shfl.sync.idx.b32` with the full mask (PTX ISA 8.0, `shfl.sync`): the value of lane `src`
/// (`src < 32`; higher bits are ignored by the hardware's 0x1f clamp), as an `f32`: a broadcast.
///
/// # Safety
/// As [`shfl_xor_f32`]: all 32 lanes of the warp are active and execute this same shuffle.
#[inline(always)]
pub unsafe fn shfl_idx_f32(v: f32, src: u32) -> f32 {
    let r: f32;
    // SAFETY: the caller's contract above (all 32 lanes, full mask).
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {s}, 0x1f, 0xffffffff;", r = out(reg32) r,
            v = in(reg32) v, s = in(reg32) src, options(nomem, nostack))
    };
    r
}

/// The maximum of `v` over the 32 lanes of the warp, in every lane (a butterfly of five
/// [`shfl_xor_f32`]; `f32::max`, so a NaN lane is ignored unless all are NaN).
///
/// # Safety
/// As [`shfl_xor_f32`]: all 32 lanes of the warp call it together.
#[inline(always)]
pub unsafe fn reduce_max_f32(mut v: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        // SAFETY: the caller's contract (all 32 lanes execute every step of this loop, whose
        // trip count is the same constant in every lane).
        v = v.max(unsafe { shfl_xor_f32(v, m) });
        m >>= 1;
    }
    v
}

/// The sum of `v` over the 32 lanes of the warp, in every lane (butterfly order: every lane
/// gets the bit-identical result).
///
/// # Safety
/// As [`shfl_xor_f32`]: all 32 lanes of the warp call it together.
#[inline(always)]
pub unsafe fn reduce_sum_f32(mut v: f32) -> f32 {
    let mut m = 16;
    while m > 0 {
        // SAFETY: as in `reduce_max_f32`.
        v += unsafe { shfl_xor_f32(v, m) };
        m >>= 1;
    }
    v
}

/// The maximum of `v` over the quad of lanes `4 (l / 4) .. 4 (l / 4) + 4` holding one row of a
/// `wgmma`/`mma` accumulator (module docs of [`super::wgmma`]: lanes `l` with the same `l / 4`
/// share rows), in each of them: two [`shfl_xor_f32`] steps (lane masks 1 and 2), `f32::max` (a
/// NaN is ignored unless all four are NaN; `-inf` stays `-inf` only if all four are). The
/// row-max step of an online softmax (FlashAttention's `Allreduce<4>`).
///
/// # Safety
/// As [`shfl_xor_f32`]: all 32 lanes of the warp call it together.
#[inline(always)]
pub unsafe fn quad_max_f32(v: f32) -> f32 {
    // SAFETY: the caller's contract (every lane runs both steps).
    let v = v.max(unsafe { shfl_xor_f32(v, 1) });
    // SAFETY: as above.
    v.max(unsafe { shfl_xor_f32(v, 2) })
}

/// The sum of `v` over the quad of lanes holding one accumulator row (as [`quad_max_f32`]), in
/// each of them; butterfly order, so all four lanes get the bit-identical sum.
///
/// # Safety
/// As [`shfl_xor_f32`]: all 32 lanes of the warp call it together.
#[inline(always)]
pub unsafe fn quad_sum_f32(v: f32) -> f32 {
    // SAFETY: the caller's contract (every lane runs both steps).
    let v = v + unsafe { shfl_xor_f32(v, 1) };
    // SAFETY: as above.
    v + unsafe { shfl_xor_f32(v, 2) }
}
