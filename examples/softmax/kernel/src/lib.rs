//! Row-wise softmax over a row-major `[rows, cols]` f32 matrix, `y[r][c] = exp(x[r][c] - m_r) /
//! sum_c exp(x[r][c] - m_r)` with `m_r` the row's maximum (numerically stable), on the device
//! library's warp-specialized skeleton (`warpline_device::roles`):
//!
//! ```text
//!   loader warp 0 --cp.async--> 2-stage ring of ROWS_PER_STAGE rows --> compute warps 1..=2
//!   (rows of item k+1 in flight)                                      (warp w: row w of item k:
//!                                                                       max, sum, normalize, store)
//! ```
//!
//! Any `rows`, and `1 <= cols <= MAX_COLS`; a row may start at any 4-byte aligned address (the
//! loader shifts it in shared memory so its 16-byte aligned part is copied 16 bytes at a time).
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)
)]
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

use warpline_device::roles::{Layout, Roles, SmemAlloc, StageBuf};

// Module-scope PTX the device library needs (the dynamic shared-memory window); once per crate.
warpline_device::kernel_module!();

/// Largest row length the kernel takes (a row of the stage ring holds this many f32 plus 4 of
/// shift). Longer rows: the host reports an error before launching (the kernel would trap).
pub const MAX_COLS: u32 = 4096;
/// Rows per work item and per stage: one per compute warp.
pub const ROWS_PER_STAGE: u32 = 2;
/// Depth of the ring: double buffering.
pub const STAGES: u32 = 2;
/// Floats between rows of a stage: `MAX_COLS` plus up to 3 of shift (16-byte multiple).
pub const ROW_PITCH: u32 = MAX_COLS + 4;
/// One loader warp, one compute warp per row of a stage, no storers (compute warps write `y`).
pub const ROLES: Roles = Roles::new(1, ROWS_PER_STAGE);

/// The kernel's shared-memory regions.
#[derive(Clone, Copy)]
pub struct Parts {
    /// `STAGES x [ROWS_PER_STAGE x ROW_PITCH]` f32.
    pub rows: StageBuf<Softmax, f32>,
}

/// Shared-memory layout: the ring's barriers, then the staged rows (checked against the 227 KiB
/// budget at compile time).
pub const LAYOUT: Layout<Softmax, Parts> = {
    let mut a = SmemAlloc::new(ROLES, STAGES);
    let rows = a.stages::<f32>(ROWS_PER_STAGE * ROW_PITCH);
    a.finish(Parts { rows })
};
/// Dynamic shared memory per CTA, bytes (the launch's `shared_mem_bytes`).
pub const SMEM_BYTES: u32 = LAYOUT.bytes();
/// Threads per CTA (the launch's block size).
pub const THREADS_PER_CTA: u32 = ROLES.threads();
/// CTAs that fit on one SM by shared memory (228 KiB per SM, 1 KiB reserved per CTA): the
/// persistent grid is `CTAS_PER_SM x SMs` (or fewer when there are fewer items).
pub const CTAS_PER_SM: u32 = 3;

const _: () = assert!(CTAS_PER_SM * (SMEM_BYTES + 1024) <= 228 * 1024);
const _: () = assert!((ROW_PITCH * 4).is_multiple_of(16));

/// The kernel's arguments, as its hooks see them.
#[cfg_attr(not(target_arch = "nvptx64"), allow(dead_code))]
pub struct Softmax {
    x: *const f32,
    y: *mut f32,
    rows: u32,
    cols: u32,
}

#[cfg(target_arch = "nvptx64")]
mod device {
    use super::*;
    use warpline_device::cp_async;
    use warpline_device::math::exp_approx;
    use warpline_device::roles::{run, LoadCommit, RoleThread, Stage, WarpSpecialized};
    use warpline_device::smem::store_global;
    use warpline_device::warp::{reduce_max_f32, reduce_sum_f32};
    use warpline_device::WARP_SIZE;

    impl Softmax {
        /// Floats between row `row`'s first element and the 16-byte boundary below it (0..4):
        /// where the row starts inside its shared-memory row, so that both sides of its 16-byte
        /// copies are aligned.
        #[inline(always)]
        fn shift(&self, row: u32) -> u32 {
            ((self.x as usize >> 2) as u32).wrapping_add(row.wrapping_mul(self.cols)) & 3
        }

        /// Row `row` of `x` or `y` (`row < rows`).
        #[inline(always)]
        fn row_offset(&self, row: u32) -> usize {
            row as usize * self.cols as usize
        }
    }

    impl WarpSpecialized<STAGES> for Softmax {
        type Parts = Parts;
        const LAYOUT: Layout<Self, Parts> = LAYOUT;
        const LOAD_COMMIT: LoadCommit = LoadCommit::CpAsyncGroups;

        fn items(&self) -> u32 {
            self.rows.div_ceil(ROWS_PER_STAGE)
        }

        /// The loader warp copies the item's rows into the stage: up to 3 leading floats with
        /// 4-byte `cp.async`, the 16-byte aligned body with 16-byte ones, then the tail.
        unsafe fn load(&self, me: RoleThread, stage: Stage<Self>, item: u32) {
            let tile = LAYOUT.parts().rows.at(stage);
            let (t, n, cols) = (me.thread(), me.threads(), self.cols);
            let mut r = 0;
            while r < ROWS_PER_STAGE {
                let row = item * ROWS_PER_STAGE + r;
                if row < self.rows {
                    // SAFETY: row < rows: the row's cols floats are inside `x` (launch contract).
                    let src = unsafe { self.x.add(self.row_offset(row)) };
                    let shift = self.shift(row);
                    let dst = r * ROW_PITCH + shift;
                    let head = core::cmp::min((4 - shift) & 3, cols);
                    let vecs = (cols - head) / 4;
                    let tail = head + 4 * vecs;
                    // SAFETY: (all three copies) the stage is this role's (acquired); element
                    // indices stay below cols <= MAX_COLS, so inside row r of the stage
                    // (shift + cols <= ROW_PITCH) and inside the global row; `src + head` and
                    // `dst + head` are 16-byte aligned (shift + head is 0 or 4, rows are 16-byte
                    // multiples apart in a 128-byte aligned stage) for the 16-byte form.
                    unsafe {
                        if t < head {
                            cp_async::copy_4(tile.at(dst + t).addr(), src.add(t as usize));
                        }
                        let mut v = t;
                        while v < vecs {
                            let i = head + 4 * v;
                            cp_async::copy_16(tile.at(dst + i).addr(), src.add(i as usize));
                            v += n;
                        }
                        if tail + t < cols {
                            let i = tail + t;
                            cp_async::copy_4(tile.at(dst + i).addr(), src.add(i as usize));
                        }
                    }
                }
                r += 1;
            }
        }

        /// Compute warp `w` normalises row `w` of the item: the maximum, then `e = exp(x - max)`
        /// written back in place and summed, then `y = e / sum`; warp shuffles combine the lanes.
        unsafe fn compute(&self, me: RoleThread, stage: Stage<Self>, item: u32) {
            let row = item * ROWS_PER_STAGE + me.warp();
            if row >= self.rows {
                // Warp-uniform: the whole warp skips (no shuffle is left half-executed).
                return;
            }
            let tile = LAYOUT.parts().rows.at(stage);
            let base = me.warp() * ROW_PITCH + self.shift(row);
            let (lane, cols) = (me.lane(), self.cols);
            // SAFETY (the shared accesses below): the stage is filled and this role's to read;
            // indices base + c with c < cols lie inside row `me.warp()` of the stage, which only
            // this warp touches, and each lane rewrites and rereads only its own elements.
            let mut m = f32::NEG_INFINITY;
            let mut c = lane;
            while c < cols {
                // SAFETY: see above.
                m = m.max(unsafe { tile.at(base + c).load() });
                c += WARP_SIZE;
            }
            // SAFETY: all 32 lanes of this warp reach the reductions (the row test above is
            // per warp; every lane leaves its loop).
            let m = unsafe { reduce_max_f32(m) };
            let mut s = 0.0f32;
            c = lane;
            while c < cols {
                let at = tile.at(base + c);
                // SAFETY: see above.
                let e = exp_approx(unsafe { at.load() } - m);
                // SAFETY: see above.
                unsafe { at.store(e) };
                s += e;
                c += WARP_SIZE;
            }
            // SAFETY: as for the maximum.
            let inv = 1.0 / unsafe { reduce_sum_f32(s) };
            // SAFETY: row < rows: the row is inside `y` (launch contract).
            let dst = unsafe { self.y.add(self.row_offset(row)) };
            c = lane;
            while c < cols {
                // SAFETY: shared as above; c < cols inside the row of `y`, written by this lane
                // only.
                unsafe { store_global(dst.add(c as usize), tile.at(base + c).load() * inv) };
                c += WARP_SIZE;
            }
        }
    }

    /// `y = softmax(x)` row by row over a row-major `[rows, cols]` matrix.
    ///
    /// Launch: `THREADS_PER_CTA` x 1 x 1 threads, `SMEM_BYTES` of dynamic shared memory, any
    /// grid (persistent: `CTAS_PER_SM x SMs` fills the device). Traps if `cols` is 0 or above
    /// `MAX_COLS`, or the block or shared memory differ.
    ///
    /// # Safety
    /// `x` points to `rows * cols` readable f32 and `y` to as many writable f32 in device
    /// memory, both 4-byte aligned; `y` does not overlap `x`.
    #[unsafe(no_mangle)]
    pub unsafe extern "ptx-kernel" fn softmax(x: *const f32, y: *mut f32, rows: u32, cols: u32) {
        if cols == 0 || cols > MAX_COLS {
            // SAFETY: `trap` aborts the kernel; no preconditions.
            unsafe { core::arch::nvptx::trap() };
        }
        let k = Softmax { x, y, rows, cols };
        // SAFETY: every thread of the CTA, at the top of the kernel; the hooks' launch contract
        // is this kernel's, which its caller upholds.
        unsafe { run::<Softmax, STAGES>(&k) };
    }
}
