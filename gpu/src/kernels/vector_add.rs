//! `ws_vector_add`: C = A + B over f32, warp-specialized and double-buffered.
//!
//! Roles (contract::vector_add): a loader warp (cp.async global -> shared A, B), compute warps
//! (shared A + B -> shared C), storer warps (shared C -> global). Two pipelines of `STAGES` stages
//! over `STAGES x [A | B | C]` shared memory:
//!
//! ```text
//!   loader --(lc: full/empty)--> compute --(cs: full/empty)--> storer
//!   tile i+1 in flight          tile i                         tile i-1
//! ```
//!
//! The grid is persistent: CTA `b` takes tiles `b, b + gridDim.x, ...`, every role walks the same
//! sequence with its own [`PipelineState`], so any grid size works (a CTA with no tile exits after
//! setup). The last tile may be ragged: whole 16-byte vectors, then up to 3 scalars.

use crate::contract::vector_add::*;
use crate::contract::WARP_SIZE;
use crate::device::cp_async;
use crate::device::mbarrier::fence_init;
use crate::device::pipeline::{Pipeline, PipelineState};
use crate::device::smem::{dynamic_smem_base, store_global, store_global_v4, Shared};
use crate::device::thread::{block_dim_x, block_idx_x, grid_dim_x, sync_threads, thread_idx_x};

type Pipe = Pipeline<{ STAGES as u32 }>;
type State = PipelineState<{ STAGES as u32 }>;

const LOADER_THREADS: u32 = LOADER_WARPS * WARP_SIZE;
const COMPUTE_THREADS: u32 = COMPUTE_WARPS * WARP_SIZE;
const STORER_THREADS: u32 = STORER_WARPS * WARP_SIZE;

/// The shared-memory view every role shares.
#[derive(Clone, Copy)]
struct Smem {
    /// loader -> compute.
    lc: Pipe,
    /// compute -> storer.
    cs: Pipe,
    buffers: u32,
}

impl Smem {
    fn a(self, stage: u32) -> Shared<f32> {
        Shared::at(self.buffers + stage * STAGE_BYTES as u32)
    }
    fn b(self, stage: u32) -> Shared<f32> {
        self.a(stage).add(TILE_ELEMS as u32)
    }
    fn c(self, stage: u32) -> Shared<f32> {
        self.a(stage).add(2 * TILE_ELEMS as u32)
    }
}

/// The tiles of this CTA, in order: (first element, elements in this tile).
#[derive(Clone, Copy)]
struct Tiles {
    n: u64,
}

impl Tiles {
    fn for_each(self, mut f: impl FnMut(u64, u32)) {
        let num_tiles = self.n.div_ceil(TILE_ELEMS as u64);
        let mut tile = block_idx_x() as u64;
        while tile < num_tiles {
            let start = tile * TILE_ELEMS as u64;
            let len = core::cmp::min(TILE_ELEMS as u64, self.n - start) as u32;
            f(start, len);
            tile += grid_dim_x() as u64;
        }
    }
}

/// Visits the tile's elements owned by thread `t` of `threads`: whole 4-element vectors (index of
/// the first element), then the ragged scalars.
#[inline(always)]
fn for_each_owned(
    len: u32,
    t: u32,
    threads: u32,
    mut vec4: impl FnMut(u32),
    mut scalar: impl FnMut(u32),
) {
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

/// Loader role: cp.async A and B of each tile into the stage, one commit group per tile. The stage
/// of tile k-1 is committed to the compute role once its group has landed (`wait_group 1` after
/// issuing tile k), so two tiles' copies are in flight while the loader never blocks on the newest.
///
/// (`cp.async.mbarrier.arrive.noinc` would let the hardware do the commit, but compute-sanitizer's
/// racecheck does not model it and reports every tile as a race; explicit groups keep the kernel
/// checkable at the same speed.)
///
/// # Safety
/// The launch contract of [`ws_vector_add`]; called by the loader warps after the pipelines were
/// initialised and published.
unsafe fn loader(s: Smem, tiles: Tiles, t: u32, a: *const f32, b: *const f32) {
    let mut st = State::new();
    let mut pending: Option<State> = None;
    tiles.for_each(|start, len| {
        s.lc.producer_acquire(st);
        let stage = st.stage();
        // SAFETY: start < n, so the tile's first elements are inside `a` and `b` (launch contract).
        let (ga, gb) = unsafe { (a.add(start as usize), b.add(start as usize)) };
        // SAFETY (both closures): the stage is free (acquired); offsets stay inside the tile's
        // buffers and the global tile (len elements from start < n); the host validated 16-byte
        // alignment of a and b.
        for_each_owned(
            len,
            t,
            LOADER_THREADS,
            // SAFETY: see above (i + 4 <= len for the vector form).
            |i| unsafe {
                cp_async::copy_16(s.a(stage).add(i).addr(), ga.add(i as usize));
                cp_async::copy_16(s.b(stage).add(i).addr(), gb.add(i as usize));
            },
            // SAFETY: see above (i < len).
            |i| unsafe {
                cp_async::copy_4(s.a(stage).add(i).addr(), ga.add(i as usize));
                cp_async::copy_4(s.b(stage).add(i).addr(), gb.add(i as usize));
            },
        );
        cp_async::commit_group();
        if let Some(prev) = pending {
            cp_async::wait_group::<1>();
            s.lc.producer_commit(prev);
        }
        pending = Some(st);
        st.advance();
    });
    if let Some(last) = pending {
        cp_async::wait_group::<0>();
        s.lc.producer_commit(last);
    }
}

/// Compute role: C = A + B in shared memory; releases A, B to the loader and hands C to the storer.
fn compute(s: Smem, tiles: Tiles, t: u32) {
    let mut st = State::new();
    tiles.for_each(|_, len| {
        s.lc.consumer_wait(st);
        s.cs.producer_acquire(st);
        let stage = st.stage();
        // SAFETY (both closures): A and B of the stage are filled (consumer_wait) and C is free
        // (producer_acquire); offsets stay inside the stage's buffers and are 16-byte aligned for
        // the vector forms; each element is touched by one thread.
        for_each_owned(
            len,
            t,
            COMPUTE_THREADS,
            // SAFETY: see above.
            |i| unsafe {
                let x = s.a(stage).add(i).load_v4();
                let y = s.b(stage).add(i).load_v4();
                s.c(stage)
                    .add(i)
                    .store_v4([x[0] + y[0], x[1] + y[1], x[2] + y[2], x[3] + y[3]]);
            },
            // SAFETY: see above.
            |i| unsafe {
                let v = s.a(stage).add(i).load() + s.b(stage).add(i).load();
                s.c(stage).add(i).store(v);
            },
        );
        s.lc.consumer_release(st);
        s.cs.producer_commit(st);
        st.advance();
    });
}

/// Storer role: shared C -> global C with 16-byte stores; releases C to the compute role.
///
/// # Safety
/// The launch contract of [`ws_vector_add`]; called by the storer warps after the pipelines were
/// initialised and published.
unsafe fn storer(s: Smem, tiles: Tiles, t: u32, c: *mut f32) {
    let mut st = State::new();
    tiles.for_each(|start, len| {
        s.cs.consumer_wait(st);
        let stage = st.stage();
        // SAFETY: start < n, so the tile's first element is inside `c` (launch contract).
        let gc = unsafe { c.add(start as usize) };
        // SAFETY (both closures): C of the stage is filled (consumer_wait); global offsets stay
        // inside the tile and c is 16-byte aligned (validated by the host).
        for_each_owned(
            len,
            t,
            STORER_THREADS,
            // SAFETY: see above.
            |i| unsafe { store_global_v4(gc.add(i as usize), s.c(stage).add(i).load_v4()) },
            // SAFETY: see above.
            |i| unsafe { store_global(gc.add(i as usize), s.c(stage).add(i).load()) },
        );
        s.cs.consumer_release(st);
        st.advance();
    });
}

/// C[i] = A[i] + B[i] for i < n.
///
/// Launch: `THREADS_PER_CTA` threads, `SMEM_BYTES` dynamic shared memory, any grid size >= 1
/// (persistent; `CTAS_PER_SM x SMs` fills the device). `a`, `b`, `c`: 16-byte aligned device
/// pointers of at least `n` floats; `c` must not overlap `a` or `b`. Another block size traps.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ws_vector_add(a: *const f32, b: *const f32, c: *mut f32, n: u64) {
    if block_dim_x() != THREADS_PER_CTA {
        // The roles and the barriers' arrival counts assume exactly THREADS_PER_CTA threads.
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    let base = dynamic_smem_base();
    // SAFETY: the launch gives SMEM_BYTES of dynamic shared memory; the two barrier regions
    // (8-byte aligned, disjoint from the buffers) hold the barriers only; thread 0 initialises
    // them below before the CTA barrier; each role arrives once per thread and stage phase, which
    // is what the init counts say.
    let s = unsafe {
        Smem {
            lc: Pipe::at(base + LC_BARRIERS_OFFSET as u32),
            cs: Pipe::at(base + CS_BARRIERS_OFFSET as u32),
            buffers: base + BUFFERS_OFFSET as u32,
        }
    };
    if thread_idx_x() == 0 {
        // SAFETY: one thread, before any use; published by fence_init and the CTA barrier.
        unsafe {
            s.lc.init(LOADER_THREADS, COMPUTE_THREADS);
            s.cs.init(COMPUTE_THREADS, STORER_THREADS);
        }
        fence_init();
    }
    // SAFETY: every thread of the CTA, converged (only thread 0's branch above, no loop).
    unsafe { sync_threads() };

    let tiles = Tiles { n };
    let tid = thread_idx_x();
    // SAFETY: the launch contract; pipelines initialised and published above.
    unsafe {
        if tid < LOADER_THREADS {
            loader(s, tiles, tid, a, b);
        } else if tid < LOADER_THREADS + COMPUTE_THREADS {
            compute(s, tiles, tid - LOADER_THREADS);
        } else {
            storer(s, tiles, tid - LOADER_THREADS - COMPUTE_THREADS, c);
        }
    }
}
