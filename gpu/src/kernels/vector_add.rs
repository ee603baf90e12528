//! `ws_vector_add`: C = A + B over f32, warp-specialized and double-buffered, on the device
//! library's skeleton ([`crate::device::roles`]).
//!
//! Roles (contract::vector_add): loader warps (cp.async global -> shared A, B), compute warps
//! (shared A + B -> shared C), storer warps (shared C -> global), over the skeleton's two rings of
//! `STAGES` stages, each stage one `[A | B | C]` region of the contract's layout:
//!
//! ```text
//!   loader --load ring (lc: full/empty)--> compute --store ring (cs: full/empty)--> storer
//!   load(tile i+1): A, B in flight        compute(tile i): C = A + B              store(tile i-1)
//! ```
//!
//! [`run`] owns the rings (init, fence, CTA barrier), the dispatch of each warp to its role, the
//! persistent loop (CTA `b` takes tiles `b, b + gridDim.x, ...`, so any grid size works; a CTA
//! with no tile exits after setup) and the stage/phase bookkeeping; the hooks below only move
//! one tile's data. The last tile may be ragged: whole 16-byte vectors, then up to 3 scalars.

use crate::contract::vector_add::*;
use crate::device::cp_async;
use crate::device::roles::{
    run, Layout, LoadCommit, RoleThread, Roles, SmemAlloc, Stage, StageBuf, Tile, WarpSpecialized,
};
use crate::device::smem::{store_global, store_global_v4, Shared};

/// Warps per role: loaders `[0, LOADER_WARPS)`, then compute, then storers.
const ROLES: Roles = Roles::new(LOADER_WARPS, COMPUTE_WARPS).with_storers(STORER_WARPS);

/// The kernel's shared-memory regions.
#[derive(Clone, Copy)]
struct Parts {
    /// `STAGES x [A | B | C]`, each buffer `TILE_ELEMS` f32.
    abc: StageBuf<VectorAdd, f32>,
}

/// The rings' barriers (load ring at `LC_BARRIERS_OFFSET`, store ring at `CS_BARRIERS_OFFSET`),
/// then the staged `[A | B | C]` buffers at `BUFFERS_OFFSET`: the contract's layout, checked
/// below.
const LAYOUT: Layout<VectorAdd, Parts> = {
    let mut a = SmemAlloc::new(ROLES, STAGES as u32);
    let abc = a.stages::<f32>(3 * TILE_ELEMS as u32);
    a.finish(Parts { abc })
};

// The skeleton's layout and launch shape are the contract's, byte for byte.
const _: () = {
    assert!(ROLES.threads() == THREADS_PER_CTA);
    assert!(LAYOUT.bytes() as usize == SMEM_BYTES);
    assert!(LAYOUT.load_ring_offset() as usize == LC_BARRIERS_OFFSET);
    assert!(LAYOUT.store_ring_offset() as usize == CS_BARRIERS_OFFSET);
    assert!(LAYOUT.parts().abc.offset() as usize == BUFFERS_OFFSET);
    assert!(LAYOUT.parts().abc.stage_bytes() as usize == STAGE_BYTES);
};

/// The kernel's arguments, as its hooks see them.
struct VectorAdd {
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    n: u64,
    /// Tiles of the whole grid, `ceil(n / TILE_ELEMS)` (fits in 32 bits; checked at entry).
    tiles: u32,
}

/// The three buffers of one stage.
#[derive(Clone, Copy)]
struct Abc {
    a: Shared<f32>,
    b: Shared<f32>,
    c: Shared<f32>,
}

impl VectorAdd {
    /// Tile `item`: its first element and its length (`TILE_ELEMS`, or less for the last tile).
    #[inline(always)]
    fn tile(&self, item: u32) -> (u64, u32) {
        let start = item as u64 * TILE_ELEMS as u64;
        let len = core::cmp::min(TILE_ELEMS as u64, self.n - start) as u32;
        (start, len)
    }

    /// A, B and C of `stage`.
    #[inline(always)]
    fn abc(stage: Stage<Self>) -> Abc {
        let t: Tile<f32> = LAYOUT.parts().abc.at(stage);
        Abc {
            a: t.at(0),
            b: t.at(TILE_ELEMS as u32),
            c: t.at(2 * TILE_ELEMS as u32),
        }
    }
}

/// Visits the tile's elements owned by thread `me.thread()` of its role: whole 4-element vectors
/// (index of the first element), then the ragged scalars.
#[inline(always)]
fn for_each_owned(
    len: u32,
    me: RoleThread,
    mut vec4: impl FnMut(u32),
    mut scalar: impl FnMut(u32),
) {
    let (t, threads) = (me.thread(), me.threads());
    let vecs = len / 4;
    let mut v = t;
    while v < vecs {
        vec4(4 * v);
        v += threads;
    }
    let tail = 4 * vecs + t;
    if tail < len {
        scalar(tail);
    }
}

impl WarpSpecialized<{ STAGES as u32 }> for VectorAdd {
    type Parts = Parts;
    const LAYOUT: Layout<Self, Parts> = LAYOUT;
    /// One commit group per tile; the stage of tile k-1 is committed to the compute role once its
    /// group has landed (`wait_group 1` after issuing tile k), so two tiles' copies are in flight
    /// while the loader never blocks on the newest.
    ///
    /// (`LoadCommit::CpAsyncBarrier`, i.e. `cp.async.mbarrier.arrive.noinc`, would let the
    /// hardware do the commit, but compute-sanitizer's racecheck does not model it and reports
    /// every tile as a race; explicit groups keep the kernel checkable at the same speed.)
    const LOAD_COMMIT: LoadCommit = LoadCommit::CpAsyncGroups;

    #[inline(always)]
    fn items(&self) -> u32 {
        self.tiles
    }

    /// Loader: cp.async A and B of the tile into the stage (the skeleton closes the group).
    ///
    /// # Safety
    /// [`WarpSpecialized::load`]'s: called by [`run`] in the loader warps under
    /// [`ws_vector_add`]'s launch contract, with `stage` of the load ring acquired.
    #[inline(always)]
    unsafe fn load(&self, me: RoleThread, stage: Stage<Self>, item: u32) {
        let (start, len) = self.tile(item);
        let s = Self::abc(stage);
        // SAFETY: item < tiles, so start < n and the tile's first elements are inside `a` and
        // `b` (launch contract).
        let (ga, gb) = unsafe { (self.a.add(start as usize), self.b.add(start as usize)) };
        // SAFETY (both closures): the stage is the loaders' (acquired); offsets stay inside the
        // stage's buffers and the global tile (len elements from start < n); the host validated
        // 16-byte alignment of a and b.
        for_each_owned(
            len,
            me,
            // SAFETY: see above (i + 4 <= len for the vector form).
            |i| unsafe {
                cp_async::copy_16(s.a.add(i).addr(), ga.add(i as usize));
                cp_async::copy_16(s.b.add(i).addr(), gb.add(i as usize));
            },
            // SAFETY: see above (i < len).
            |i| unsafe {
                cp_async::copy_4(s.a.add(i).addr(), ga.add(i as usize));
                cp_async::copy_4(s.b.add(i).addr(), gb.add(i as usize));
            },
        );
    }

    /// Compute: C = A + B in shared memory (the skeleton releases A, B to the loaders and hands
    /// C to the storers).
    ///
    /// # Safety
    /// [`WarpSpecialized::compute`]'s: called by [`run`] in the compute warps under
    /// [`ws_vector_add`]'s launch contract, with `stage` of the load ring filled and `stage` of
    /// the store ring acquired.
    #[inline(always)]
    unsafe fn compute(&self, me: RoleThread, stage: Stage<Self>, item: u32) {
        let (_, len) = self.tile(item);
        let s = Self::abc(stage);
        // SAFETY (both closures): A and B of the stage are filled (load ring) and C is free
        // (store ring); offsets stay inside the stage's buffers and are 16-byte aligned for the
        // vector forms; each element is touched by one thread.
        for_each_owned(
            len,
            me,
            // SAFETY: see above.
            |i| unsafe {
                let x = s.a.add(i).load_v4();
                let y = s.b.add(i).load_v4();
                s.c.add(i)
                    .store_v4([x[0] + y[0], x[1] + y[1], x[2] + y[2], x[3] + y[3]]);
            },
            // SAFETY: see above.
            |i| unsafe {
                let v = s.a.add(i).load() + s.b.add(i).load();
                s.c.add(i).store(v);
            },
        );
    }

    /// Storer: shared C -> global C with 16-byte stores (the skeleton releases C to compute).
    ///
    /// # Safety
    /// [`WarpSpecialized::store`]'s: called by [`run`] in the storer warps under
    /// [`ws_vector_add`]'s launch contract, with `stage` of the store ring filled.
    #[inline(always)]
    unsafe fn store(&self, me: RoleThread, stage: Stage<Self>, item: u32) {
        let (start, len) = self.tile(item);
        let s = Self::abc(stage);
        // SAFETY: item < tiles, so start < n and the tile's first element is inside `c`
        // (launch contract).
        let gc = unsafe { self.c.add(start as usize) };
        // SAFETY (both closures): C of the stage is filled (store ring); global offsets stay
        // inside the tile and c is 16-byte aligned (validated by the host).
        for_each_owned(
            len,
            me,
            // SAFETY: see above.
            |i| unsafe { store_global_v4(gc.add(i as usize), s.c.add(i).load_v4()) },
            // SAFETY: see above.
            |i| unsafe { store_global(gc.add(i as usize), s.c.add(i).load()) },
        );
    }
}

/// C[i] = A[i] + B[i] for i < n.
///
/// Launch: `THREADS_PER_CTA` x 1 x 1 threads, `SMEM_BYTES` dynamic shared memory, a grid of at
/// least one CTA, any size (persistent; `CTAS_PER_SM x SMs` fills the device). `a`, `b`, `c`:
/// 16-byte aligned device pointers of at least `n` floats; `c` must not overlap `a` or `b`; `n`
/// at most `u32::MAX` tiles (the host's `MAX_ELEMS`). Another block shape, less shared memory or
/// a larger `n` traps.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ws_vector_add(a: *const f32, b: *const f32, c: *mut f32, n: u64) {
    let Ok(tiles) = u32::try_from(n.div_ceil(TILE_ELEMS as u64)) else {
        // Work items are 32-bit tile indices.
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() }
    };
    let k = VectorAdd { a, b, c, n, tiles };
    // SAFETY: every thread of the CTA, at the top of the kernel; the hooks' launch contract is
    // this kernel's, which its caller upholds.
    unsafe { run::<VectorAdd, { STAGES as u32 }>(&k) };
}
