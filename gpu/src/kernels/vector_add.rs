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
//! tile loop (CTA `b` takes tiles `b, b + gridDim.x, ...`, so any grid size works, persistent or
//! not; a CTA with no tile exits after setup) and the stage/phase bookkeeping; the hooks below only move
//! one tile's data. The last tile may be ragged: whole 16-byte vectors, then up to 3 scalars.

use core::arch::asm;

use crate::contract::vector_add::*;
use crate::contract::vector_add::{bulk as bulk_c, bulk_deep as deep_c, flat as flat_c, flat_v1};
use crate::device::roles::{
    run, Layout, LoadCommit, RoleThread, Roles, SmemAlloc, Stage, StageBuf, Tile, WarpSpecialized,
};
use crate::device::smem::{store_global, store_global_v4, Shared};
use crate::device::thread::{block_dim_x, block_idx_x, grid_dim_x, thread_idx_x};
use crate::device::{bulk, cp_async};

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
/// least one CTA, any size (CTA `b` takes tiles `b, b + gridDim.x, ...`: `CTAS_PER_SM x SMs` is
/// the persistent grid; the host's default is one CTA per `TILES_PER_CTA` tiles, faster). `a`, `b`, `c`:
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

// ------------------------------------------------------------------------------------------------
// Issue 12 candidates (to be measured against `ws_vector_add` and the D2D copy; contract modules
// `vector_add::{bulk, bulk_deep, flat, flat_v1}`).
// ------------------------------------------------------------------------------------------------

/// The regions of a bulk variant: `STAGES x [A | B]`, each buffer `TILE` f32.
struct BulkParts<K> {
    ab: StageBuf<K, f32>,
}

impl<K> Clone for BulkParts<K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for BulkParts<K> {}

/// `ws_vector_add_bulk*`: one loader warp whose thread 0 fills each stage with two bulk copies
/// (A and B of the tile, `16 * (len / 4)` bytes each) completing on the stage's full barrier
/// ([`LoadCommit::BulkTx`]); `W` compute warps add from shared memory and store 16-byte vectors
/// straight to global C (no C buffer, no storers). `TILE` elements per tile (a multiple of 4),
/// `S` stages. The ragged last tile's last `len % 4` elements are not copied: the compute warps
/// read them from global.
struct BulkAdd<const TILE: u32, const S: u32, const W: u32> {
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    n: u64,
    /// `ceil(n / TILE)` (fits in 32 bits; checked at entry).
    tiles: u32,
}

impl<const TILE: u32, const S: u32, const W: u32> BulkAdd<TILE, S, W> {
    /// Tile `item`: its first element and its length (`TILE`, or less for the last tile).
    #[inline(always)]
    fn tile(&self, item: u32) -> (u64, u32) {
        let start = item as u64 * TILE as u64;
        let len = core::cmp::min(TILE as u64, self.n - start) as u32;
        (start, len)
    }

    /// Bytes of one operand's bulk copy for a tile of `len` elements: its whole 16-byte vectors.
    #[inline(always)]
    const fn copy_bytes(len: u32) -> u32 {
        16 * (len / 4)
    }
}

impl<const TILE: u32, const S: u32, const W: u32> WarpSpecialized<S> for BulkAdd<TILE, S, W> {
    type Parts = BulkParts<Self>;
    const LAYOUT: Layout<Self, BulkParts<Self>> = {
        assert!(TILE.is_multiple_of(4), "tiles of whole 16-byte vectors");
        let mut a = SmemAlloc::new(Roles::new(1, W), S);
        let ab = a.stages::<f32>(2 * TILE);
        a.finish(BulkParts { ab })
    };
    const LOAD_COMMIT: LoadCommit = LoadCommit::BulkTx;

    #[inline(always)]
    fn items(&self) -> u32 {
        self.tiles
    }

    #[inline(always)]
    fn load_tx_bytes(&self, item: u32) -> u32 {
        let (_, len) = self.tile(item);
        2 * Self::copy_bytes(len)
    }

    /// Loader thread 0: bulk copies of A and B of the tile into the stage, on its full barrier
    /// (armed by the skeleton with [`Self::load_tx_bytes`]).
    ///
    /// # Safety
    /// [`WarpSpecialized::load`]'s: called by [`run`] in the loader warp under the launch
    /// contract of the `ws_vector_add_bulk*` entries, with `stage` of the load ring acquired.
    #[inline(always)]
    unsafe fn load(&self, me: RoleThread, stage: Stage<Self>, item: u32) {
        let (start, len) = self.tile(item);
        let bytes = Self::copy_bytes(len);
        if me.thread() != 0 || bytes == 0 {
            return;
        }
        let t: Tile<f32> = <Self as WarpSpecialized<S>>::LAYOUT.parts().ab.at(stage);
        let full = stage.load_full::<S>();
        // SAFETY: item < tiles, so start < n and `bytes` (whole vectors of the tile, at most
        // len elements) stay inside `a` and `b` (launch contract); start is a multiple of 4
        // elements and a, b are 16-byte aligned (host), so the sources are 16-byte aligned; the
        // destinations are the stage's A and B buffers (128-byte aligned, TILE elements each),
        // owned by the loaders until the copies complete on `full`, which the skeleton armed
        // with exactly these 2 * bytes (load_tx_bytes).
        unsafe {
            bulk::load(
                t.at(0).addr(),
                self.a.add(start as usize).cast(),
                bytes,
                full,
            );
            bulk::load(
                t.at(TILE).addr(),
                self.b.add(start as usize).cast(),
                bytes,
                full,
            );
        }
    }

    /// Compute: C = A + B from the stage's buffers to global memory (16-byte stores); the ragged
    /// tail straight from global memory.
    ///
    /// # Safety
    /// [`WarpSpecialized::compute`]'s: called by [`run`] in the compute warps under the launch
    /// contract of the `ws_vector_add_bulk*` entries, with `stage` of the load ring filled.
    #[inline(always)]
    unsafe fn compute(&self, me: RoleThread, stage: Stage<Self>, item: u32) {
        let (start, len) = self.tile(item);
        let t: Tile<f32> = <Self as WarpSpecialized<S>>::LAYOUT.parts().ab.at(stage);
        // SAFETY: item < tiles, so start < n: the tile's first element is inside a, b and c
        // (launch contract).
        let (ga, gb, gc) = unsafe {
            (
                self.a.add(start as usize),
                self.b.add(start as usize),
                self.c.add(start as usize),
            )
        };
        // SAFETY (both closures): the stage's whole vectors are filled (load ring); offsets stay
        // inside the stage's buffers and the global tile (len elements from start < n); c is
        // 16-byte aligned (host) and start a multiple of 4; each element is one thread's.
        for_each_owned(
            len,
            me,
            // SAFETY: see above (i + 4 <= len).
            |i| unsafe {
                let x = t.at(i).load_v4();
                let y = t.at(TILE + i).load_v4();
                store_global_v4(
                    gc.add(i as usize),
                    [x[0] + y[0], x[1] + y[1], x[2] + y[2], x[3] + y[3]],
                );
            },
            // SAFETY: see above (i < len; the tail was not copied, so it is read from global,
            // which nobody writes during the kernel).
            |i| unsafe {
                let v = *ga.add(i as usize) + *gb.add(i as usize);
                store_global(gc.add(i as usize), v);
            },
        );
    }
}

/// Runs [`BulkAdd`] in this CTA.
///
/// # Safety
/// The launch contract of the `ws_vector_add_bulk*` entries for this `TILE`, `S`, `W`; called by
/// every thread of the CTA at the top of the kernel.
#[inline(always)]
unsafe fn bulk_add<const TILE: u32, const S: u32, const W: u32>(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    n: u64,
) {
    let Ok(tiles) = u32::try_from(n.div_ceil(TILE as u64)) else {
        // Work items are 32-bit tile indices.
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() }
    };
    let k = BulkAdd::<TILE, S, W> { a, b, c, n, tiles };
    // SAFETY: every thread of the CTA, at the top of the kernel; the hooks' launch contract is
    // the calling entry's, which its caller upholds.
    unsafe { run::<BulkAdd<TILE, S, W>, S>(&k) };
}

/// `ws_vector_add_bulk`'s configuration.
type Bulk =
    BulkAdd<{ bulk_c::TILE_ELEMS as u32 }, { bulk_c::STAGES as u32 }, { bulk_c::COMPUTE_WARPS }>;
/// `ws_vector_add_bulk_deep`'s configuration.
type BulkDeep =
    BulkAdd<{ deep_c::TILE_ELEMS as u32 }, { deep_c::STAGES as u32 }, { deep_c::COMPUTE_WARPS }>;

// The skeleton's layouts and launch shapes are the contract's.
const _: () = {
    let l = <Bulk as WarpSpecialized<{ bulk_c::STAGES as u32 }>>::LAYOUT;
    assert!(l.roles().threads() == bulk_c::THREADS_PER_CTA);
    assert!(l.roles().warps_of(crate::device::roles::Role::Producer) == bulk_c::LOADER_WARPS);
    assert!(l.bytes() as usize == bulk_c::SMEM_BYTES);
    assert!(l.parts().ab.offset() as usize == bulk_c::BUFFERS_OFFSET);
    assert!(l.parts().ab.stage_bytes() as usize == bulk_c::STAGE_BYTES);
    let l = <BulkDeep as WarpSpecialized<{ deep_c::STAGES as u32 }>>::LAYOUT;
    assert!(l.roles().threads() == deep_c::THREADS_PER_CTA);
    assert!(l.roles().warps_of(crate::device::roles::Role::Producer) == deep_c::LOADER_WARPS);
    assert!(l.bytes() as usize == deep_c::SMEM_BYTES);
    assert!(l.parts().ab.offset() as usize == deep_c::BUFFERS_OFFSET);
    assert!(l.parts().ab.stage_bytes() as usize == deep_c::STAGE_BYTES);
};

/// C[i] = A[i] + B[i] for i < n, with bulk-copy loads (contract `vector_add::bulk`).
///
/// Launch: `bulk::THREADS_PER_CTA` x 1 x 1 threads, `bulk::SMEM_BYTES` dynamic shared memory, a
/// grid of at least one CTA, any size (persistent; `bulk::CTAS_PER_SM x SMs` fills the device).
/// `a`, `b`, `c`: 16-byte aligned device pointers of at least `n` floats; `c` must not overlap
/// `a` or `b`, which nobody writes during the kernel; `n` at most `u32::MAX` tiles. Another block
/// shape, less shared memory or a larger `n` traps.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ws_vector_add_bulk(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    n: u64,
) {
    // SAFETY: this entry's launch contract is bulk_add's for Bulk's parameters.
    unsafe {
        bulk_add::<
            { bulk_c::TILE_ELEMS as u32 },
            { bulk_c::STAGES as u32 },
            { bulk_c::COMPUTE_WARPS },
        >(a, b, c, n)
    };
}

/// [`ws_vector_add_bulk`] with the `vector_add::bulk_deep` contract (8192-element tiles, four
/// compute warps, one CTA per SM).
///
/// # Safety
/// [`ws_vector_add_bulk`]'s launch contract with `bulk_deep`'s constants.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ws_vector_add_bulk_deep(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    n: u64,
) {
    // SAFETY: this entry's launch contract is bulk_add's for BulkDeep's parameters.
    unsafe {
        bulk_add::<
            { deep_c::TILE_ELEMS as u32 },
            { deep_c::STAGES as u32 },
            { deep_c::COMPUTE_WARPS },
        >(a, b, c, n)
    };
}

/// `ld.global.nc.L1::no_allocate.v4.f32`: a 16-byte load through the non-coherent (read-only)
/// path, not kept in L1.
///
/// # Safety
/// `p` is a 16-byte aligned global address of 4 readable floats that nobody writes while the
/// kernel runs.
#[inline(always)]
unsafe fn load_global_nc_v4(p: *const f32) -> [f32; 4] {
    let (x, y, z, w): (f32, f32, f32, f32);
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("ld.global.nc.L1::no_allocate.v4.f32 {{{x}, {y}, {z}, {w}}}, [{p}];",
            x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
            p = in(reg64) p, options(pure, readonly, nostack));
    }
    [x, y, z, w]
}

/// `st.global.cs.v4.f32`: a 16-byte streaming store (evict-first in L2).
///
/// # Safety
/// `dst` is a 16-byte aligned global address of 4 writable floats.
#[inline(always)]
unsafe fn store_global_cs_v4(dst: *mut f32, v: [f32; 4]) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("st.global.cs.v4.f32 [{p}], {{{x}, {y}, {z}, {w}}};",
            x = in(reg32) v[0], y = in(reg32) v[1], z = in(reg32) v[2], w = in(reg32) v[3],
            p = in(reg64) dst, options(nostack));
    }
}

/// The `vector_add_flat*` kernels: CTA `b` takes tiles `b, b + gridDim.x, ...` of
/// `4 x VECS x THREADS` elements; in a whole tile, thread `t` loads vectors `t + j THREADS`
/// (`j < VECS`) of A and B (all `2 VECS` loads issued before the first add), adds, and stores
/// (`st.global.cs` if `CS`). The ragged last tile checks each vector and finishes with scalars.
///
/// # Safety
/// Every thread of the CTA; the block is `THREADS` x 1 x 1 (traps otherwise); `a`, `b`, `c`
/// 16-byte aligned device pointers of at least `n` floats; `c` does not overlap `a` or `b`, and
/// nobody writes `a` or `b` while the kernel runs.
#[inline(always)]
unsafe fn flat<const THREADS: u32, const VECS: usize, const CS: bool>(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    n: u64,
) {
    if block_dim_x() != THREADS {
        // The tiling assumes exactly THREADS threads.
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    let tile_elems = 4 * VECS as u64 * THREADS as u64;
    let tiles = n.div_ceil(tile_elems);
    let t = thread_idx_x() as u64;
    let step = grid_dim_x() as u64;
    let mut tile = block_idx_x() as u64;
    while tile < tiles {
        let start = tile * tile_elems;
        if start + tile_elems <= n {
            let mut x = [[0f32; 4]; VECS];
            let mut y = [[0f32; 4]; VECS];
            let mut j = 0;
            while j < VECS {
                let e = (start + 4 * (t + j as u64 * THREADS as u64)) as usize;
                // SAFETY: e + 4 <= start + tile_elems <= n; e is a multiple of 4 and a, b are
                // 16-byte aligned; read-only during the kernel (contract).
                unsafe {
                    x[j] = load_global_nc_v4(a.add(e));
                    y[j] = load_global_nc_v4(b.add(e));
                }
                j += 1;
            }
            let mut j = 0;
            while j < VECS {
                let e = (start + 4 * (t + j as u64 * THREADS as u64)) as usize;
                let (p, q) = (x[j], y[j]);
                let v = [p[0] + q[0], p[1] + q[1], p[2] + q[2], p[3] + q[3]];
                // SAFETY: as for the loads; c is 16-byte aligned and this thread's alone.
                unsafe {
                    if CS {
                        store_global_cs_v4(c.add(e), v);
                    } else {
                        store_global_v4(c.add(e), v);
                    }
                }
                j += 1;
            }
        } else {
            let mut j = 0;
            while j < VECS {
                let e = start + 4 * (t + j as u64 * THREADS as u64);
                if e + 4 <= n {
                    let e = e as usize;
                    // SAFETY: e + 4 <= n, aligned as above.
                    unsafe {
                        let (p, q) = (load_global_nc_v4(a.add(e)), load_global_nc_v4(b.add(e)));
                        store_global_v4(
                            c.add(e),
                            [p[0] + q[0], p[1] + q[1], p[2] + q[2], p[3] + q[3]],
                        );
                    }
                } else {
                    let mut k = e;
                    while k < n {
                        let i = k as usize;
                        // SAFETY: i < n; this thread's element.
                        unsafe { store_global(c.add(i), *a.add(i) + *b.add(i)) };
                        k += 1;
                    }
                }
                j += 1;
            }
        }
        tile += step;
    }
}

/// C[i] = A[i] + B[i] for i < n without warp specialization or shared memory (contract
/// `vector_add::flat`): any grid (one CTA per tile, or persistent).
///
/// Launch: `flat::THREADS_PER_CTA` x 1 x 1 threads (another block shape traps), no shared
/// memory, any grid of at least one CTA. `a`, `b`, `c`: 16-byte aligned device pointers of at
/// least `n` floats; `c` must not overlap `a` or `b`, which nobody writes during the kernel.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn vector_add_flat(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    n: u64,
) {
    // SAFETY: this entry's launch contract is flat's.
    unsafe {
        flat::<{ flat_c::THREADS_PER_CTA }, { flat_c::VECS_PER_THREAD as usize }, false>(a, b, c, n)
    };
}

/// [`vector_add_flat`] with streaming stores (`st.global.cs.v4`) in whole tiles.
///
/// # Safety
/// [`vector_add_flat`]'s launch contract.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn vector_add_flat_cs(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    n: u64,
) {
    // SAFETY: this entry's launch contract is flat's.
    unsafe {
        flat::<{ flat_c::THREADS_PER_CTA }, { flat_c::VECS_PER_THREAD as usize }, true>(a, b, c, n)
    };
}

/// [`vector_add_flat`] shaped like PyTorch's vectorized elementwise kernel (contract
/// `vector_add::flat_v1`: `flat_v1::THREADS_PER_CTA` threads, one vector of A and B per thread
/// per tile).
///
/// # Safety
/// [`vector_add_flat`]'s launch contract with `flat_v1::THREADS_PER_CTA` threads.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn vector_add_flat_v1(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    n: u64,
) {
    // SAFETY: this entry's launch contract is flat's.
    unsafe {
        flat::<{ flat_v1::THREADS_PER_CTA }, { flat_v1::VECS_PER_THREAD as usize }, false>(
            a, b, c, n,
        )
    };
}
