//! Thread, block and grid indices (PTX ISA §10, special registers `%tid`, `%ctaid`, `%ntid`,
//! `%nctaid`) and the CTA-wide barrier.

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

/// `__syncthreads()` (`bar.sync 0`): every thread of the CTA must reach it.
#[inline(always)]
pub fn sync_threads() {
    // SAFETY: a CTA barrier; callers keep it out of divergent code.
    unsafe { nvptx::_syncthreads() }
}
