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
use crate::device::thread::{block_idx_x, grid_dim_x, sync_threads, thread_idx_x};

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
fn loader(s: Smem, tiles: Tiles, t: u32, a: *const f32, b: *const f32) {
    let mut st = State::new();
    let mut pending: Option<State> = None;
    tiles.for_each(|start, len| {
        s.lc.producer_acquire(st);
        // SAFETY: the stage is free (acquired); offsets stay inside the tile's buffers and the
        // global tile (len elements from start < n); host validated 16-byte alignment of a and b.
        unsafe {
            let (ga, gb) = (a.add(start as usize), b.add(start as usize));
            for_each_owned(
                len,
                t,
                LOADER_THREADS,
                |i| {
                    cp_async::copy_16(s.a(st.stage).add(i).addr(), ga.add(i as usize));
                    cp_async::copy_16(s.b(st.stage).add(i).addr(), gb.add(i as usize));
                },
                |i| {
                    cp_async::copy_4(s.a(st.stage).add(i).addr(), ga.add(i as usize));
                    cp_async::copy_4(s.b(st.stage).add(i).addr(), gb.add(i as usize));
                },
            );
        }
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
        // SAFETY: A and B of the stage are filled (consumer_wait) and C is free (producer_acquire);
        // offsets stay inside the stage's buffers and are 16-byte aligned for the vector forms.
        unsafe {
            for_each_owned(
                len,
                t,
                COMPUTE_THREADS,
                |i| {
                    let x = s.a(st.stage).add(i).load_v4();
                    let y = s.b(st.stage).add(i).load_v4();
                    s.c(st.stage).add(i).store_v4([
                        x[0] + y[0],
                        x[1] + y[1],
                        x[2] + y[2],
                        x[3] + y[3],
                    ]);
                },
                |i| {
                    let v = s.a(st.stage).add(i).load() + s.b(st.stage).add(i).load();
                    s.c(st.stage).add(i).store(v);
                },
            );
        }
        s.lc.consumer_release(st);
        s.cs.producer_commit(st);
        st.advance();
    });
}

/// Storer role: shared C -> global C with 16-byte stores; releases C to the compute role.
fn storer(s: Smem, tiles: Tiles, t: u32, c: *mut f32) {
    let mut st = State::new();
    tiles.for_each(|start, len| {
        s.cs.consumer_wait(st);
        // SAFETY: C of the stage is filled (consumer_wait); global offsets stay inside the tile and
        // c is 16-byte aligned (validated by the host).
        unsafe {
            let gc = c.add(start as usize);
            for_each_owned(
                len,
                t,
                STORER_THREADS,
                |i| store_global_v4(gc.add(i as usize), s.c(st.stage).add(i).load_v4()),
                |i| store_global(gc.add(i as usize), s.c(st.stage).add(i).load()),
            );
        }
        s.cs.consumer_release(st);
        st.advance();
    });
}

/// C[i] = A[i] + B[i] for i < n.
///
/// Launch: `THREADS_PER_CTA` threads, `SMEM_BYTES` dynamic shared memory, any grid size >= 1
/// (persistent; `CTAS_PER_SM x SMs` fills the device). `a`, `b`, `c`: 16-byte aligned device
/// pointers of at least `n` floats; `c` must not overlap `a` or `b`.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn ws_vector_add(a: *const f32, b: *const f32, c: *mut f32, n: u64) {
    let base = dynamic_smem_base();
    let s = Smem {
        lc: Pipe::at(base + LC_BARRIERS_OFFSET as u32),
        cs: Pipe::at(base + CS_BARRIERS_OFFSET as u32),
        buffers: base + BUFFERS_OFFSET as u32,
    };
    if thread_idx_x() == 0 {
        s.lc.init(LOADER_THREADS, COMPUTE_THREADS);
        s.cs.init(COMPUTE_THREADS, STORER_THREADS);
        fence_init();
    }
    sync_threads();

    let tiles = Tiles { n };
    let tid = thread_idx_x();
    if tid < LOADER_THREADS {
        loader(s, tiles, tid, a, b);
    } else if tid < LOADER_THREADS + COMPUTE_THREADS {
        compute(s, tiles, tid - LOADER_THREADS);
    } else {
        storer(s, tiles, tid - LOADER_THREADS - COMPUTE_THREADS, c);
    }
}
