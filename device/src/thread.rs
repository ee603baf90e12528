//! Thread, block and grid indices (PTX ISA §10, special registers `%tid`, `%ctaid`, `%ntid`,
//! `%nctaid`) and the CTA-wide barrier.

// A module-level import is resolved even under rustdoc (unlike paths in function bodies).
#[cfg(target_arch = "nvptx64")]
use core::arch::nvptx;

/// `threadIdx.x`.
#[inline(always)]
pub fn thread_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_thread_idx_x() as u32 }
}

/// `blockIdx.x`: index of this CTA in the grid.
#[inline(always)]
pub fn block_idx_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_idx_x() as u32 }
}

/// `blockDim.x`: threads per CTA along x.
#[inline(always)]
pub fn block_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_block_dim_x() as u32 }
}

/// `gridDim.x`: CTAs in the grid along x.
#[inline(always)]
pub fn grid_dim_x() -> u32 {
    // SAFETY: reading a special register has no preconditions.
    unsafe { nvptx::_grid_dim_x() as u32 }
}

/// `__syncthreads()` (`bar.sync 0`, i.e. `barrier.sync.aligned 0`, PTX ISA 8.0 §9.7.13.1): waits
/// until every thread of the CTA arrived; orders their earlier shared and global memory accesses
/// before everyone's later ones (CTA scope).
///
/// # Safety
/// `.aligned`: every non-exited thread of the CTA executes this same barrier, and each warp
/// executes it convergently (all its active threads together, not from divergent branches or
/// spin loops that have not reconverged; [`super::warp::sync_warp`] reconverges a warp).
/// Otherwise the CTA hangs or the behaviour is undefined.
#[inline(always)]
pub unsafe fn sync_threads() {
    // SAFETY: the caller's contract above (every thread of the CTA, warp-convergent).
    unsafe { nvptx::_syncthreads() }
}
