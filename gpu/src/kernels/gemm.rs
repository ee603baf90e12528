//! The FP32 GEMMs on the CUDA cores: one path (stage ring, compute role with its mainloop,
//! epilogue, PDL option) under two schedules.
//!
//! - **Tile schedule**, `cluster_tile_gemm` and `tile_gemm`: batched `C_t = A_t x B_t` over
//!   128x128 row-major f32 tiles, persistent, clusters of 1, 2, 4 or 8 CTAs splitting each tile's
//!   rows, B multicast by bulk copies (contract::gemm).
//! - **Split-K schedule**, `primary_gemm` and `secondary_gemm` (entries in `pdl.rs`): `C = A · B`
//!   for any `m x n x k` (`n`, `k` multiples of [`VEC`]), one `TILE_M x TILE_N` tile of C per
//!   cluster of 2 CTAs, each CTA half of K with cp.async + zero fill, reduced through DSMEM
//!   (contract::pdl).
//!
//! Both run the same compute role ([`mainloop`]: wait for a stage, [`mma_chunk`], release it) and
//! the same epilogue ([`store_c`]), with the register tile of contract::gemm: compute thread `t`
//! is in row group `g = t / COL_GROUPS` and owns rows `row0 + g + ROW_STEP i` (`i < THREAD_ROWS`,
//! `ROW_STEP` = row groups of the CTA) and the `VEC`-float column vectors at
//! `VEC (t % COL_GROUPS) + COL_SPAN v` (`v < COLS / COL_SPAN`: 2 for a 128-wide tile, an 8x8 block;
//! 1 for the split-K tile, 8x4). Per `VEC`-deep k-step a thread reads one vector of A per row (a
//! row of the stage's A chunk, pitch `K_CHUNK + A_PAD` floats so a warp's two row groups hit
//! different banks, the `COL_GROUPS` lanes of a group broadcast) and its column vectors of B per k
//! (the row groups broadcast), then `VEC` FMAs per accumulator in k order; the k loop over a
//! chunk is unrolled by [`K_UNROLL`] (full unrolling spills). Every accumulator sums its k terms
//! in increasing k with one `fma.rn.f32` each.
//!
//! [`Pdl`] is an option of the path: `Off` (the tile kernels), wait before the first store of C
//! (inputs independent of the previous kernel), or wait before the first load of A (A is the
//! previous kernel's output); every thread that stores C waits first, and the CTA triggers
//! `launch_dependents` after its last store of C, behind a CTA or cluster barrier.
//!
//! Tile schedule, stage ring of `stages(N)` k-chunk stages `[A band chunk | B chunk]`, a "full"
//! and an "empty" mbarrier per stage (the device `TmaPipeline`: the loader's `producer_acquire`
//! arms the full barrier with the bytes that land in this CTA, multicast included, and each
//! compute thread's `consumer_release` arrives on the empty barrier of every CTA of the cluster;
//! the split-K schedule's cp.async ring is the device `Pipeline`):
//!
//! ```text
//!   leader CTA (rank 0)                                every CTA r of the cluster
//!   loader: B[k0..k0+K_CHUNK, :] --multicast------->  stage s: B chunk   (same offset in each CTA)
//!   loader (each CTA): A[band r, k0..k0+K_CHUNK] -->  stage s: A chunk   (own band only)
//!                      full[s] (local, tx bytes) ->   compute warps: C[band r] += A chunk x B chunk
//!   empty[s] of EVERY CTA <--remote arrive--------    each compute thread of every CTA, per stage
//! ```
//!
//! Cluster of `N` CTAs (1, 2, 4 or 8, `%cluster_nctarank`): CTA `r` computes rows
//! `r*128/N .. (r+1)*128/N` of each tile with `8/N` compute warps (`32 x (1 + 8/N)` threads: 288,
//! 160, 96, 64). The leader loads each chunk of `B_t` from global memory once and the bulk copy
//! engine multicasts it into the shared memory of all `N` CTAs (the `.shared::cluster` window, i.e.
//! DSMEM); each CTA's loader loads its own rows of `A_t` (each row of A is needed by exactly one
//! CTA, so A, too, is read from DRAM once per cluster). Shared memory is sized by `N` (the A band
//! is `128/N` rows; `contract::gemm::smem_bytes`), so for `N >= 2` two CTAs fit on an SM. A stage
//! may be refilled only when every compute thread of every CTA of the cluster has released it:
//! each thread arrives (release, cluster scope) on the empty barrier of every CTA, count
//! `32 x 8/N x N = 256`. Each CTA waits on its own full barrier, armed by its own loader with the
//! bytes it will receive (its A rows plus the multicast B chunk). The kernel begins and ends with
//! a cluster barrier, so no multicast or remote arrive reaches a CTA before its barriers exist or
//! after it exited.
//!
//! Racecheck: every compute thread releases a stage itself (no lane-0 arrival after
//! `bar.warp.sync`: compute-sanitizer's racecheck credits only a thread's own arrival for its
//! reads), and the split-K loader commits a stage with `cp.async.wait_group` + `mbarrier.arrive`
//! (racecheck does not model `cp.async.mbarrier.arrive.noinc`).
//!
//! Persistent: cluster `c` takes tiles `c, c + clusters, ...` (`tile_gemm`: CTA `b` takes
//! `b, b + gridDim.x, ...`), every role walks the same sequence with its own `PipelineState`, so any
//! grid size works. Chapter 11, "Warp Specialization with Thread Block Clusters and CUDA Streams",
//! ported with per-role mbarrier arrivals; PTX ISA §9.7.9.25.4 (cp.async.bulk), §9.7.13.15
//! (mbarrier), §9.7.13.4 (barrier.cluster), §9.7.9.21 (mapa), §9.7.12.x (griddepcontrol).

use core::arch::asm;
use core::marker::PhantomData;

use crate::contract::gemm::*;
use crate::contract::pdl as split;
use crate::contract::{F32_BYTES, WARP_SIZE};
use crate::device::clock::global_timer_ns;
use crate::device::mbarrier::fence_init;
use crate::device::pipeline::{Pipeline, PipelineState, TmaPipeline};
use crate::device::smem::{dynamic_smem_base, store_global_v4, Shared};
use crate::device::thread::{block_dim_x, block_idx_x, grid_dim_x, sync_threads, thread_idx_x};
use crate::device::warp::sync_warp;
use crate::device::{bulk, cluster, cp_async, pdl};

// =============================================================================================
// The shared path: tiling, stage ring, compute role (mainloop), epilogue, PDL option
// =============================================================================================

/// The shape of one FP32 GEMM configuration: a CTA's compute role produces `ROWS x COLS` of C
/// from stages `[A: ROWS x A_PITCH | B: K_CHUNK x COLS]` (row-major f32), each of its
/// `COMPUTE_THREADS` threads `THREAD_ROWS` rows (`ROW_STEP` apart) by `COLS / COL_SPAN` column
/// vectors (`COL_SPAN` apart) of it (see [`Owner`]).
pub(super) trait Tiling: Copy {
    /// Rows of a stage's A chunk (= rows of C the CTA computes).
    const ROWS: u32;
    /// Columns of a stage's B chunk (= columns of C the CTA computes; B's pitch in the stage).
    const COLS: u32;
    /// Depth of a stage.
    const K_CHUNK: u32;
    /// Row pitch of the A chunk, floats: `K_CHUNK + A_PAD`.
    const A_PITCH: u32;
    /// Bytes of a stage's A chunk; the B chunk follows it.
    const A_BYTES: u32;
    /// Bytes of one stage.
    const STAGE_BYTES: u32;
    /// Threads of the compute role.
    const COMPUTE_THREADS: u32;
    /// Row groups of the CTA: the distance between a compute thread's rows.
    const ROW_STEP: u32 = Self::COMPUTE_THREADS / COL_GROUPS;
}

/// The tile schedule's CTA of a cluster of `N`: a band of `128 / N` rows of a 128x128 tile.
#[derive(Clone, Copy)]
struct Band<const N: u32>;

impl<const N: u32> Tiling for Band<N> {
    const ROWS: u32 = band_rows(N);
    const COLS: u32 = TILE as u32;
    const K_CHUNK: u32 = K_CHUNK as u32;
    const A_PITCH: u32 = A_PITCH as u32;
    const A_BYTES: u32 = a_stage_bytes(N) as u32;
    const STAGE_BYTES: u32 = stage_bytes(N) as u32;
    const COMPUTE_THREADS: u32 = compute_warps(N) * WARP_SIZE;
}

/// The split-K schedule's CTA: a `TILE_M x TILE_N` tile of C over its half of K.
#[derive(Clone, Copy)]
struct SplitTile;

impl Tiling for SplitTile {
    const ROWS: u32 = split::TILE_M as u32;
    const COLS: u32 = split::TILE_N as u32;
    const K_CHUNK: u32 = split::K_CHUNK as u32;
    const A_PITCH: u32 = split::A_PITCH as u32;
    const A_BYTES: u32 = split::A_TILE_BYTES as u32;
    const STAGE_BYTES: u32 = split::STAGE_BYTES as u32;
    const COMPUTE_THREADS: u32 = split::CONSUMER_WARPS * WARP_SIZE;
}

/// A compute thread's block of C: `R` rows of `CV` vectors of `VEC` floats.
type Acc<const R: usize, const CV: usize> = [[[f32; VEC]; CV]; R];

/// Checks at compile time that `Acc<R, CV>` is the register tile of `T` (evaluated where used).
struct Fits<T, const R: usize, const CV: usize>(PhantomData<T>);

impl<T: Tiling, const R: usize, const CV: usize> Fits<T, R, CV> {
    const OK: () = {
        assert!(R == THREAD_ROWS && R as u32 * T::ROW_STEP == T::ROWS);
        assert!(CV * COL_SPAN == T::COLS as usize);
        assert!(T::COMPUTE_THREADS.is_multiple_of(WARP_SIZE));
        assert!(T::A_PITCH == T::K_CHUNK + A_PAD as u32);
        assert!(T::K_CHUNK.is_multiple_of(K_UNROLL as u32) && K_UNROLL == 4 * VEC);
        assert!(T::A_BYTES >= T::ROWS * T::A_PITCH * F32_BYTES as u32);
        assert!(T::STAGE_BYTES >= T::A_BYTES + T::K_CHUNK * T::COLS * F32_BYTES as u32);
    };
}

/// The consumer side of a stage ring as the shared compute role uses it: wait until a stage is
/// filled, release it.
trait Ring<const S: u32>: Copy {
    /// Waits until `st`'s stage is filled.
    fn wait(self, st: PipelineState<S>);
    /// This compute thread is done reading `st`'s stage: its release(s) of it. Every thread
    /// releases itself rather than one lane per warp after `bar.warp.sync`: compute-sanitizer's
    /// racecheck only credits a thread's own arrival for its reads.
    ///
    /// # Safety
    /// The ring's protocol: one call per compute thread, stage and phase, after its reads of the
    /// stage; the ring's own contract (see the implementations).
    unsafe fn release(self, st: PipelineState<S>);
}

/// The split-K schedule's ring: this CTA's cp.async producer warp fills each stage and commits it
/// with one arrival per producer thread; each compute thread releases it locally.
impl<const S: u32> Ring<S> for Pipeline<S> {
    #[inline(always)]
    fn wait(self, st: PipelineState<S>) {
        self.consumer_wait(st);
    }
    /// One local arrival on `st`'s empty barrier.
    ///
    /// # Safety
    /// [`Ring::release`]'s (the empty barriers count one release per compute thread and phase).
    #[inline(always)]
    unsafe fn release(self, st: PipelineState<S>) {
        self.consumer_release(st);
    }
}

/// The tile schedule's ring: a [`TmaPipeline`] whose full barriers the loader arms with the bytes
/// its bulk copies (and, in a cluster of `N`, the leader's multicast) deliver into this CTA's
/// stage, and whose empty barriers count a release from every compute thread of every CTA that
/// reads what the leader multicast (the whole cluster).
#[derive(Clone, Copy)]
struct McastRing<const N: u32, const S: u32> {
    pipe: TmaPipeline<S>,
    /// Launched as a cluster kernel: release on each of the `N` CTAs' empty barriers (otherwise on
    /// this CTA's, `N = 1`).
    clustered: bool,
}

impl<const N: u32, const S: u32> Ring<S> for McastRing<N, S> {
    #[inline(always)]
    fn wait(self, st: PipelineState<S>) {
        self.pipe.consumer_wait(st);
    }
    /// # Safety
    /// When `clustered`: the launch is a cluster of `N` CTAs that all initialised and published
    /// their barriers (same layout) and stay resident until the kernel's final cluster barrier,
    /// each empty barrier counting one release per compute thread of the cluster and phase.
    #[inline(always)]
    unsafe fn release(self, st: PipelineState<S>) {
        if self.clustered {
            let mut r = 0;
            while r < N {
                // SAFETY: CTA r < N of this cluster multicast into (or, r = this rank, filled)
                // this stage, is live until the final cluster barrier, and counts this release
                // (contract above).
                unsafe { self.pipe.consumer_release(st, r) };
                r += 1;
            }
        } else {
            self.pipe.empty(st).arrive();
        }
    }
}

/// A CTA's stage ring: its barriers (`R`) and the stages of `T` behind them.
struct Stages<T, R> {
    ring: R,
    buffers: u32,
    tiling: PhantomData<T>,
}

impl<T, R: Copy> Clone for Stages<T, R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T, R: Copy> Copy for Stages<T, R> {}

impl<T: Tiling, R: Copy> Stages<T, R> {
    /// The ring `ring` with stage 0 at shared address `buffers`.
    ///
    /// # Safety
    /// `buffers` is 128-byte aligned with `stages x T::STAGE_BYTES` bytes of this CTA's shared
    /// memory behind it, used for nothing but the stages of `ring`.
    #[inline(always)]
    unsafe fn new(ring: R, buffers: u32) -> Self {
        Self {
            ring,
            buffers,
            tiling: PhantomData,
        }
    }
    /// A chunk of `stage`: `T::ROWS` rows, pitch `T::A_PITCH` floats.
    #[inline(always)]
    fn a(self, stage: u32) -> Shared<f32> {
        Shared::at(self.buffers + stage * T::STAGE_BYTES)
    }
    /// B chunk of `stage`: `T::K_CHUNK` rows of `T::COLS` floats.
    #[inline(always)]
    fn b(self, stage: u32) -> Shared<f32> {
        Shared::at(self.buffers + stage * T::STAGE_BYTES + T::A_BYTES)
    }
}

/// Compute thread `t`'s place in the register tile: its row group and its first column.
#[derive(Clone, Copy)]
struct Owner {
    group: u32,
    col: u32,
}

impl Owner {
    /// Compute thread `t` (counted from the first compute thread of the CTA).
    #[inline(always)]
    fn new(t: u32) -> Self {
        Self {
            group: t / COL_GROUPS,
            col: (t % COL_GROUPS) * VEC as u32,
        }
    }
}

/// Where a GEMM of this path meets Programmatic Dependent Launch (contract::pdl's rule).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Pdl {
    /// No `griddepcontrol`: the launch is in plain stream order.
    Off,
    /// A and B are independent of the previous kernel on the stream, which may still read C: every
    /// thread that stores C waits first; the CTA triggers after its last store.
    WaitBeforeStore,
    /// A is the previous kernel's output (B is not written by it): the loader may load B before
    /// the wait, every A after it; stores and trigger as `WaitBeforeStore`.
    WaitBeforeA,
}

/// `fma.rn.f32`: `x * y + z` rounded once.
#[inline(always)]
fn fma(x: f32, y: f32, z: f32) -> f32 {
    let d: f32;
    // SAFETY: register arithmetic only.
    unsafe {
        asm!("fma.rn.f32 {d}, {x}, {y}, {z};", d = out(reg32) d, x = in(reg32) x, y = in(reg32) y,
            z = in(reg32) z, options(pure, nomem, nostack))
    };
    d
}

/// `acc += A[:, kk + j] x B[kk + j, :]` for this thread's block: `CV` LDS.128 of B row `kk + j`,
/// `R x CV x VEC` FMAs with column `j` of the A vectors `af` (rows of `A[:, kk..kk+VEC]`). `j` is
/// a constant at every call (written out in [`mma_step`]: LLVM leaves a `for j` rolled, which
/// indexes `af` dynamically and puts it in local memory).
///
/// # Safety
/// As [`mma_step`]; `j < VEC`.
#[inline(always)]
unsafe fn mma_k<T: Tiling, const R: usize, const CV: usize>(
    acc: &mut Acc<R, CV>,
    af: &[[f32; VEC]; R],
    b: Shared<f32>,
    kk: u32,
    j: usize,
) {
    let brow = b.add((kk + j as u32) * T::COLS);
    let mut bv = [[0f32; VEC]; CV];
    for (v, x) in bv.iter_mut().enumerate() {
        // SAFETY: inside the filled stage (contract of `mma_step`), 16-byte aligned.
        *x = unsafe { brow.add(v as u32 * COL_SPAN as u32).load_v4() };
    }
    for (i, row) in af.iter().enumerate() {
        let x = row[j];
        for q in 0..VEC {
            for v in 0..CV {
                acc[i][v][q] = fma(x, bv[v][q], acc[i][v][q]);
            }
        }
    }
}

/// `acc += A[:, kk..kk+VEC] x B[kk..kk+VEC, :]` for this thread's block: `R` LDS.128 of A (one
/// per row) and `VEC x CV` of B, `R x CV x VEC x VEC` FMAs. `a`: this thread's first A row in the
/// stage (rows `T::ROW_STEP` apart); `b`: this thread's first column in the stage's B chunk.
///
/// # Safety
/// The stage is filled (full barrier observed) and not refilled until this thread releases it;
/// `kk + VEC <= T::K_CHUNK` and `kk` a multiple of `VEC`.
#[inline(always)]
unsafe fn mma_step<T: Tiling, const R: usize, const CV: usize>(
    acc: &mut Acc<R, CV>,
    a: Shared<f32>,
    b: Shared<f32>,
    kk: u32,
) {
    let mut af = [[0f32; VEC]; R];
    for (i, f) in af.iter_mut().enumerate() {
        // SAFETY: inside the filled stage (contract above), 16-byte aligned (the pitch is a
        // multiple of VEC floats).
        *f = unsafe { a.add(T::ROW_STEP * i as u32 * T::A_PITCH + kk).load_v4() };
    }
    // SAFETY: the contract above; j < VEC = 4 (Fits).
    unsafe {
        mma_k::<T, R, CV>(acc, &af, b, kk, 0);
        mma_k::<T, R, CV>(acc, &af, b, kk, 1);
        mma_k::<T, R, CV>(acc, &af, b, kk, 2);
        mma_k::<T, R, CV>(acc, &af, b, kk, 3);
    }
}

/// `acc += A chunk x B chunk` for this thread's block: the `VEC`-deep k-steps of the chunk,
/// [`K_UNROLL`] k per iteration (LLVM keeps a plain `for` over them rolled; written out in full,
/// ptxas spills: 255 registers).
///
/// # Safety
/// As [`mma_step`], for the whole chunk.
#[inline(always)]
unsafe fn mma_chunk<T: Tiling, const R: usize, const CV: usize>(
    acc: &mut Acc<R, CV>,
    a: Shared<f32>,
    b: Shared<f32>,
) {
    let () = Fits::<T, R, CV>::OK;
    const V: u32 = VEC as u32;
    let mut kk = 0;
    while kk < T::K_CHUNK {
        // SAFETY: forwarded; kk + K_UNROLL <= K_CHUNK (K_CHUNK a multiple of K_UNROLL = 4 VEC).
        unsafe {
            mma_step::<T, R, CV>(acc, a, b, kk);
            mma_step::<T, R, CV>(acc, a, b, kk + V);
            mma_step::<T, R, CV>(acc, a, b, kk + 2 * V);
            mma_step::<T, R, CV>(acc, a, b, kk + 3 * V);
        }
        kk += K_UNROLL as u32;
    }
}

/// Compute role, one output block: `chunks` stages from `st` on, each waited for, multiplied into
/// a fresh register block ([`mma_chunk`]) and released ([`Ring::release`]); returns the block.
///
/// # Safety
/// Called by every thread of whole compute warps (`o` from its index in the role) with the
/// launch's stage ring, after its barriers were published; the loaders fill the same `chunks`
/// stages in the same order; the ring's release contract.
#[inline(always)]
unsafe fn mainloop<T: Tiling, R: Ring<S>, const S: u32, const ROWS: usize, const CV: usize>(
    s: Stages<T, R>,
    st: &mut PipelineState<S>,
    chunks: u32,
    o: Owner,
) -> Acc<ROWS, CV> {
    let mut acc = [[[0f32; VEC]; CV]; ROWS];
    let mut chunk = 0;
    while chunk < chunks {
        s.ring.wait(*st);
        // SAFETY: the stage is filled (wait) and stays so until `release`; rows
        // `group + ROW_STEP i < ROWS` and columns `col + COL_SPAN (CV - 1) + VEC <= COLS` stay
        // inside it (Fits).
        unsafe {
            mma_chunk::<T, ROWS, CV>(
                &mut acc,
                s.a(st.stage()).add(o.group * T::A_PITCH),
                s.b(st.stage()).add(o.col),
            );
        }
        // SAFETY: the contract above.
        unsafe { s.ring.release(*st) };
        st.advance();
        chunk += 1;
    }
    acc
}

/// Epilogue: waits (unless `Pdl::Off`: the previous kernel may still read C), then stores this
/// thread's block to C (row-major, pitch `ldc` floats): rows `row0 + ROW_STEP i`, columns
/// `col0 + COL_SPAN v .. + VEC`, one 16-byte store each. `CHECKED`: vectors in rows `>= m` or
/// starting at columns `>= n` are skipped (`m`, `n` unused otherwise).
///
/// # Safety
/// `c` 16-byte aligned; every stored vector lies inside C (for `CHECKED`, C is `m x n` with `ldc =
/// n` a multiple of `VEC`); no other thread writes these elements.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the block, where it goes, its bounds and the PDL option
unsafe fn store_c<T: Tiling, const R: usize, const CV: usize, const CHECKED: bool>(
    acc: &Acc<R, CV>,
    c: *mut f32,
    ldc: u32,
    row0: u32,
    col0: u32,
    m: u32,
    n: u32,
    pdl: Pdl,
) {
    if pdl != Pdl::Off {
        pdl::wait();
    }
    for (i, r) in acc.iter().enumerate() {
        let row = row0 + T::ROW_STEP * i as u32;
        for (v, x) in r.iter().enumerate() {
            let col = col0 + (v * COL_SPAN) as u32;
            if !CHECKED || (row < m && col < n) {
                // SAFETY: inside C, 16-byte aligned (contract above).
                unsafe { store_global_v4(c.add(row as usize * ldc as usize + col as usize), *x) };
            }
        }
    }
}

// =============================================================================================
// Tile schedule: cluster_tile_gemm, tile_gemm
// =============================================================================================

const LOADER_THREADS: u32 = LOADER_WARPS * WARP_SIZE;

/// Where this CTA sits and which tiles its cluster walks.
#[derive(Clone, Copy)]
struct Place {
    /// Launched as a cluster kernel (remote arrivals, multicast when the cluster has > 1 CTA).
    clustered: bool,
    rank: u32,
    first_tile: u32,
    tile_stride: u32,
    tiles: u32,
    pdl: Pdl,
}

/// Loader role of the tile schedule (one warp): per stage, acquire it and arm the full barrier
/// with the bytes this CTA receives ([`TmaPipeline::producer_acquire`]), bulk copy this CTA's A rows (one `A_ROW_CHUNK_BYTES` copy per row), and on
/// the leader the B chunk, multicast to the cluster. With `Pdl::WaitBeforeA`, waits before the
/// first copy.
///
/// # Safety
/// The launch contract of [`cluster_tile_gemm`]; called by the loader warp (all 32 lanes) after
/// every CTA of the cluster initialised and published its barriers.
#[inline(always)]
unsafe fn tile_loader<const N: u32, const S: u32>(
    s: Stages<Band<N>, McastRing<N, S>>,
    p: Place,
    lane: u32,
    a: *const f32,
    b: *const f32,
) {
    if p.pdl == Pdl::WaitBeforeA {
        pdl::wait();
    }
    let mut st = PipelineState::<S>::new();
    let rows = band_rows(N);
    let band_start = p.rank * rows;
    let tx = rows * A_ROW_CHUNK_BYTES as u32 + B_STAGE_BYTES as u32;
    let mask = ((1u32 << N) - 1) as u16;
    // Plain loops over the tiles (a closure's captures would be kept in local memory: the asm
    // statements are memory clobbers).
    let mut tile = p.first_tile;
    while tile < p.tiles {
        let tile_off = tile as usize * TILE_ELEMS;
        let mut chunk = 0;
        while chunk < CHUNKS_PER_TILE as u32 {
            // Lane 0 acquires the stage and arms this CTA's full barrier with every byte that lands
            // in it; the other lanes wait for the same releases themselves, so each lane's copies
            // follow its own observation of the consumers' releases (as racecheck wants it).
            let full = if lane == 0 {
                s.ring.pipe.producer_acquire(st, tx)
            } else {
                s.ring.pipe.empty(st).wait_parity(st.phase() ^ 1);
                s.ring.pipe.full(st)
            };
            // SAFETY: all 32 lanes of the loader warp run this loop the same number of times.
            unsafe { sync_warp() };
            let k0 = chunk as usize * K_CHUNK;
            // SAFETY: the stage is free in every CTA of the cluster (empty barrier, counting all
            // CTAs' compute threads); sources lie inside tile `tile < tiles` of A and B (host
            // checked lengths = tiles x 128 x 128 and 16-byte alignment; rows are 512 bytes, k0 a
            // multiple of K_CHUNK floats); destinations lie inside the stage, 16-byte aligned
            // (pitch A_PITCH floats, a multiple of VEC).
            unsafe {
                let mut r = lane;
                while r < rows {
                    let src = a.add(tile_off + (band_start + r) as usize * TILE + k0);
                    let dst = s.a(st.stage()).add(r * A_PITCH as u32);
                    bulk::load(dst.addr(), src as *const u8, A_ROW_CHUNK_BYTES as u32, full);
                    r += WARP_SIZE;
                }
                if lane == 0 && p.rank == 0 {
                    let src = b.add(tile_off + k0 * TILE) as *const u8;
                    let dst = s.b(st.stage()).addr();
                    if p.clustered && N > 1 {
                        bulk::load_multicast(dst, src, B_STAGE_BYTES as u32, full, mask);
                    } else {
                        bulk::load(dst, src, B_STAGE_BYTES as u32, full);
                    }
                }
            }
            st.advance();
            chunk += 1;
        }
        tile += p.tile_stride;
    }
}

/// Compute role of the tile schedule: per tile, the [`mainloop`] over its `CHUNKS_PER_TILE`
/// stages, then the [`store_c`] epilogue of this thread's 8x8 block.
///
/// # Safety
/// The launch contract of [`cluster_tile_gemm`] (as [`McastRing::release`]); called by every
/// thread of the compute warps, `t` its index among them.
#[inline(always)]
unsafe fn tile_compute<const N: u32, const S: u32>(
    s: Stages<Band<N>, McastRing<N, S>>,
    p: Place,
    t: u32,
    c: *mut f32,
) {
    let o = Owner::new(t);
    let mut st = PipelineState::<S>::new();
    let mut tile = p.first_tile;
    while tile < p.tiles {
        // SAFETY: the contract above; the loader fills CHUNKS_PER_TILE stages per tile, in order.
        let acc = unsafe {
            mainloop::<Band<N>, _, S, THREAD_ROWS, COL_VECS>(s, &mut st, CHUNKS_PER_TILE as u32, o)
        };
        // SAFETY: rows `rank x band + group + ROW_STEP i < 128`, columns `col + COL_SPAN + VEC <=
        // 128` inside tile `tile < tiles` of C (host checked the length and 16-byte alignment);
        // each element of C is written by exactly one thread.
        unsafe {
            store_c::<Band<N>, THREAD_ROWS, COL_VECS, false>(
                &acc,
                c.add(tile as usize * TILE_ELEMS),
                TILE as u32,
                p.rank * band_rows(N) + o.group,
                o.col,
                0,
                0,
                p.pdl,
            );
        }
        tile += p.tile_stride;
    }
}

/// One CTA of a cluster of `N` (`S = stages(N)`): initialise the barriers (empty count:
/// `compute_warps(N) x 32 x N` = 256 arrivals, one per compute thread of the cluster), sync, split
/// into the roles (the loader warp first), sync, and trigger the dependent launch unless
/// `Pdl::Off`.
///
/// # Safety
/// The launch contract of [`cluster_tile_gemm`] for cluster size `N` (or of [`tile_gemm`] when
/// `!p.clustered`, `N = 1`): block size `threads_per_cta(N)`, `smem_bytes(N)` dynamic shared
/// memory, every thread of the CTA calls this.
#[inline(always)]
unsafe fn run<const N: u32, const S: u32>(p: Place, a: *const f32, b: *const f32, c: *mut f32) {
    let base = dynamic_smem_base();
    // SAFETY: shared memory sized by the launch contract (barriers at BARRIERS_OFFSET, stages at
    // BUFFERS_OFFSET); thread 0 initialises the pipeline and publishes it to the cluster below
    // before any role uses it; the protocol is TmaPipeline's (one producer_acquire per stage phase
    // arming every byte that lands in this CTA's stage: its A rows plus the B chunk, multicast or
    // not; one release per compute thread of the cluster). No CTA exits before the final cluster
    // barrier, so no release or multicast reaches an exited CTA (instead of producer_tail).
    let s = unsafe {
        let ring = McastRing::<N, S> {
            pipe: TmaPipeline::at(base + BARRIERS_OFFSET as u32),
            clustered: p.clustered,
        };
        Stages::<Band<N>, _>::new(ring, base + BUFFERS_OFFSET as u32)
    };
    if thread_idx_x() == 0 {
        // SAFETY: one thread, before any use, then fence_init and a CTA/cluster barrier.
        unsafe { s.ring.pipe.init(Band::<N>::COMPUTE_THREADS * N) };
        fence_init();
    }
    // SAFETY: every thread of the CTA (and of the cluster) gets here, warps converged (only
    // thread 0's branch above, no loop).
    unsafe {
        if p.clustered {
            // Every CTA's barriers exist before any multicast or remote arrive targets them.
            cluster::sync_cluster();
        } else {
            sync_threads();
        }
    }
    let tid = thread_idx_x();
    // SAFETY: the launch contract; barriers initialised and published above; the loader is one
    // whole warp, the compute roles whole warps (block size threads_per_cta(N)).
    unsafe {
        if tid < LOADER_THREADS {
            tile_loader(s, p, tid, a, b);
        } else {
            tile_compute(s, p, tid - LOADER_THREADS, c);
        }
    }
    // SAFETY: every lane of every warp reaches this point (no lane exits early).
    unsafe { sync_warp() };
    if p.clustered {
        // No CTA exits while a peer may still arrive on its barriers.
        // SAFETY: every thread of the cluster, warps reconverged by sync_warp.
        unsafe { cluster::sync_cluster() };
    } else if p.pdl != Pdl::Off {
        // SAFETY: every thread of the CTA, warps reconverged by sync_warp.
        unsafe { sync_threads() };
    }
    if p.pdl != Pdl::Off {
        // Every store of C by this CTA precedes the barrier above.
        pdl::launch_dependents();
    }
}

/// `C_t = A_t x B_t` for `t < tiles`, clusters of 1, 2, 4 or 8 CTAs along x sharing each tile.
///
/// Launch, for cluster size `N` in `CLUSTER_SIZES`: `threads_per_cta(N)` threads (`32 x (1 + 8/N)`),
/// `smem_bytes(N)` dynamic shared memory, cluster dims `(N,1,1)`, grid `(G,1,1)` with `G` a
/// multiple of `N` (persistent: any number of clusters >= 1 is correct). `a`, `b`, `c`: 16-byte
/// aligned device pointers of `tiles x 128 x 128` floats, row-major tiles; `c` must not overlap
/// `a` or `b`. Another cluster size or block size traps.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn cluster_tile_gemm(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    tiles: u32,
) {
    let size = cluster::cluster_size();
    if !matches!(size, 1 | 2 | 4 | 8) || block_dim_x() != threads_per_cta(size) {
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    let p = Place {
        clustered: true,
        rank: cluster::cta_rank(),
        first_tile: cluster::cluster_idx_x(),
        tile_stride: cluster::cluster_count_x(),
        tiles,
        pdl: Pdl::Off,
    };
    // SAFETY: the launch contract above, cluster size and block size checked.
    unsafe {
        match size {
            1 => run::<1, { stages(1) as u32 }>(p, a, b, c),
            2 => run::<2, { stages(2) as u32 }>(p, a, b, c),
            4 => run::<4, { stages(4) as u32 }>(p, a, b, c),
            // 8; other sizes trapped above.
            _ => run::<8, { stages(8) as u32 }>(p, a, b, c),
        }
    }
}

/// `C_t = A_t x B_t` for `t < tiles` without clusters: each CTA loads all of its tiles' A and B
/// itself (same roles, stages and register tile as [`cluster_tile_gemm`] with a cluster of 1).
///
/// Launch: `THREADS_PER_CTA` threads, `SMEM_BYTES` dynamic shared memory, any grid `(G,1,1)`
/// (persistent). Pointers as for [`cluster_tile_gemm`]. Another block size traps.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn tile_gemm(a: *const f32, b: *const f32, c: *mut f32, tiles: u32) {
    if block_dim_x() != threads_per_cta(1) {
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    let p = Place {
        clustered: false,
        rank: 0,
        first_tile: block_idx_x(),
        tile_stride: grid_dim_x(),
        tiles,
        pdl: Pdl::Off,
    };
    // SAFETY: the launch contract above (that of a cluster of 1 without cluster barriers).
    unsafe { run::<1, { stages(1) as u32 }>(p, a, b, c) };
}

// =============================================================================================
// Split-K schedule: the general GEMM of primary_gemm / secondary_gemm (entries in pdl.rs)
// =============================================================================================

const SPLIT_STAGES: u32 = split::STAGES as u32;
const SPLIT_PRODUCER_THREADS: u32 = split::PRODUCER_WARPS * WARP_SIZE;

/// The split-K schedule's stage ring.
type SplitStages = Stages<SplitTile, Pipeline<SPLIT_STAGES>>;

/// A split-K consumer thread's block of C.
type SplitAcc = Acc<THREAD_ROWS, { split::COL_VECS }>;

/// Slots of a CTA's time stamps (contract::pdl::STAMPS_PER_CTA).
const STAMP_START: usize = 0;
const STAMP_MID: usize = 1;
const STAMP_END: usize = 2;

/// Thread 0 of the CTA writes `%globaltimer` (ns) to `stamps[cta * STAMPS_PER_CTA + slot]`;
/// nothing when `stamps` is null.
///
/// # Safety
/// `stamps` is null or points to `gridDim.x x STAMPS_PER_CTA` writable, 8-byte aligned u64 that
/// nothing else accesses during the kernel; `slot < STAMPS_PER_CTA`.
#[inline(always)]
unsafe fn stamp(stamps: *mut u64, slot: usize) {
    if !stamps.is_null() && thread_idx_x() == 0 {
        // SAFETY: inside the grid x STAMPS_PER_CTA array (contract above); one writer per slot.
        unsafe {
            *stamps.add(block_idx_x() as usize * split::STAMPS_PER_CTA + slot) = global_timer_ns()
        };
    }
}

/// The problem and this CTA's share of it: C[m0.., n0..] over K chunks `kt_begin..kt_end`.
#[derive(Clone, Copy)]
struct Problem {
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    m: u32,
    n: u32,
    k: u32,
    m0: u32,
    n0: u32,
    kt_begin: u32,
    kt_end: u32,
}

impl Problem {
    /// Cluster `clusterid.x` computes C tile (row-major over the tile grid); CTA rank r of the
    /// cluster takes half r of the K chunks (rank 1 may have none when K fits one chunk).
    #[inline(always)]
    fn new(a: *const f32, b: *const f32, c: *mut f32, m: u32, n: u32, k: u32) -> Self {
        // max(1): the host rejects n = 0; this keeps the division free of a panic path.
        let tiles_n = n.div_ceil(SplitTile::COLS).max(1);
        let tile = cluster::cluster_idx_x();
        let k_chunks = k.div_ceil(SplitTile::K_CHUNK);
        let half = k_chunks.div_ceil(split::CLUSTER_CTAS);
        let rank = cluster::cta_rank();
        Self {
            a,
            b,
            c,
            m,
            n,
            k,
            m0: (tile / tiles_n) * SplitTile::ROWS,
            n0: (tile % tiles_n) * SplitTile::COLS,
            kt_begin: core::cmp::min(rank * half, k_chunks),
            kt_end: core::cmp::min((rank + 1) * half, k_chunks),
        }
    }
}

/// Copies the `TILE_M x K_CHUNK` A tile at K chunk `kt` into `stage` (zeros outside the matrix):
/// 16-byte pieces, `lane` takes every 32nd.
///
/// # Safety
/// `stage < STAGES` is free (no thread reads it until the copies are waited for and committed);
/// `g.a` is a 16-byte aligned `m x k` f32 matrix with `k` a multiple of `VEC` (launch contract).
#[inline(always)]
unsafe fn load_a_tile(s: SplitStages, g: Problem, stage: u32, kt: u32, lane: u32) {
    const VECS_PER_ROW: u32 = SplitTile::K_CHUNK / VEC as u32;
    const BYTES: u32 = (VEC * F32_BYTES) as u32;
    let k0 = kt * SplitTile::K_CHUNK;
    let mut c = lane;
    while c < SplitTile::ROWS * VECS_PER_ROW {
        let (r, col) = (c / VECS_PER_ROW, (c % VECS_PER_ROW) * VEC as u32);
        let (gr, gc) = (g.m0 + r, k0 + col);
        let inside = gr < g.m && gc < g.k;
        // SAFETY: the piece is inside A when `inside` (k a multiple of VEC, so all 16 bytes are),
        // else 0 bytes are read from the valid base; the destination lies inside the free stage,
        // 16-byte aligned (contract above).
        unsafe {
            let src = if inside {
                g.a.add(gr as usize * g.k as usize + gc as usize)
            } else {
                g.a
            };
            let dst = s.a(stage).add(r * SplitTile::A_PITCH + col);
            cp_async::copy_16_zfill(dst.addr(), src, if inside { BYTES } else { 0 });
        }
        c += WARP_SIZE;
    }
}

/// Copies the `K_CHUNK x TILE_N` B tile at K chunk `kt` into `stage` (zeros outside the matrix).
///
/// # Safety
/// As [`load_a_tile`], for `g.b`, a `k x n` matrix with `n` a multiple of `VEC`.
#[inline(always)]
unsafe fn load_b_tile(s: SplitStages, g: Problem, stage: u32, kt: u32, lane: u32) {
    const VECS_PER_ROW: u32 = SplitTile::COLS / VEC as u32;
    const BYTES: u32 = (VEC * F32_BYTES) as u32;
    let k0 = kt * SplitTile::K_CHUNK;
    let mut c = lane;
    while c < SplitTile::K_CHUNK * VECS_PER_ROW {
        let (r, col) = (c / VECS_PER_ROW, (c % VECS_PER_ROW) * VEC as u32);
        let (gr, gc) = (k0 + r, g.n0 + col);
        let inside = gr < g.k && gc < g.n;
        // SAFETY: as in `load_a_tile`.
        unsafe {
            let src = if inside {
                g.b.add(gr as usize * g.n as usize + gc as usize)
            } else {
                g.b
            };
            let dst = s.b(stage).add(r * SplitTile::COLS + col);
            cp_async::copy_16_zfill(dst.addr(), src, if inside { BYTES } else { 0 });
        }
        c += WARP_SIZE;
    }
}

/// Loader role of the split-K schedule (one warp): stages A and B tiles with cp.async, one commit
/// group per stage; a stage is committed to its full mbarrier once its group has landed
/// (`wait_group 1` after issuing the next stage), as in `ws_vector_add` (racecheck does not model
/// `cp.async.mbarrier.arrive.noinc`). With `Pdl::WaitBeforeA` it issues the B tiles of the first
/// stages (independent data: the launch contract says the previous kernel does not write B)
/// before `pdl::wait()` and every A tile (the previous kernel's output) after.
///
/// # Safety
/// The launch contract of `primary_gemm` / `secondary_gemm`; called by the producer warp after
/// the pipeline's barriers were initialised and published.
#[inline(always)]
unsafe fn split_k_loader(s: SplitStages, g: Problem, lane: u32, pdl: Pdl, stamps: *mut u64) {
    let tiles = g.kt_end - g.kt_begin;
    let prefetched = if pdl == Pdl::WaitBeforeA {
        core::cmp::min(SPLIT_STAGES, tiles)
    } else {
        0
    };
    // SAFETY (all copies below): stages are free (fresh barriers for the first STAGES, then
    // producer_acquire); tile offsets stay inside the stage buffers; global pieces are inside the
    // matrices or zero-filled from the valid base pointer; rows are 16-byte aligned (host checks).
    let mut i = 0;
    while i < prefetched {
        // SAFETY: see above; stage i < STAGES is fresh.
        unsafe { load_b_tile(s, g, i, g.kt_begin + i, lane) };
        i += 1;
    }
    if pdl == Pdl::WaitBeforeA {
        pdl::wait();
        // SAFETY: `stamps` as the launch contract says.
        unsafe { stamp(stamps, STAMP_MID) };
    }
    let mut st = PipelineState::<SPLIT_STAGES>::new();
    let mut pending: Option<PipelineState<SPLIT_STAGES>> = None;
    let mut i = 0;
    while i < tiles {
        s.ring.producer_acquire(st);
        // SAFETY: see above; the stage is acquired.
        unsafe {
            if i >= prefetched {
                load_b_tile(s, g, st.stage(), g.kt_begin + i, lane);
            }
            load_a_tile(s, g, st.stage(), g.kt_begin + i, lane);
        }
        cp_async::commit_group();
        if let Some(prev) = pending {
            cp_async::wait_group::<1>();
            s.ring.producer_commit(prev);
        }
        pending = Some(st);
        st.advance();
        i += 1;
    }
    if let Some(last) = pending {
        cp_async::wait_group::<0>();
        s.ring.producer_commit(last);
    }
}

/// Split-K: this thread's block into this CTA's `TILE_M x TILE_N` partial tile in shared memory,
/// at the positions it has in the C tile.
///
/// # Safety
/// `partial` is this CTA's partial tile (16-byte aligned, nothing else uses it meanwhile).
#[inline(always)]
unsafe fn park_partial(acc: &SplitAcc, partial: Shared<f32>, o: Owner) {
    for (i, r) in acc.iter().enumerate() {
        let row = o.group + SplitTile::ROW_STEP * i as u32;
        for (v, x) in r.iter().enumerate() {
            let col = o.col + (v * COL_SPAN) as u32;
            // SAFETY: inside the partial tile, 16-byte aligned; only this thread writes it.
            unsafe { partial.add(row * SplitTile::COLS + col).store_v4(*x) };
        }
    }
}

/// Split-K: adds what the peer parked at the same positions of its partial tile (`.shared::cluster`
/// address `remote`) to this thread's block.
///
/// # Safety
/// The peer's partial tile is complete (cluster barrier after its stores) and the peer stays
/// resident until a later cluster barrier.
#[inline(always)]
unsafe fn add_partial(acc: &mut SplitAcc, remote: u32, o: Owner) {
    for (i, r) in acc.iter_mut().enumerate() {
        let row = o.group + SplitTile::ROW_STEP * i as u32;
        for (v, x) in r.iter_mut().enumerate() {
            let col = o.col + (v * COL_SPAN) as u32;
            // SAFETY: the contract above; 16-byte aligned, inside the peer's partial tile.
            let p = unsafe { cluster::load_v4(remote + (row * SplitTile::COLS + col) * 4) };
            for q in 0..VEC {
                x[q] += p[q];
            }
        }
    }
}

/// Split-K epilogue: rank 1 parks its block in its shared memory, rank 0 adds it through DSMEM
/// and stores C ([`store_c`], bounds-checked, waiting first unless `Pdl::Off`); two cluster
/// barriers order the hand-off and keep rank 1 resident while rank 0 reads.
///
/// # Safety
/// Every thread of both CTAs of the cluster calls this (it holds two cluster barriers), after its
/// role finished with the pipeline; `owner` is `Some` exactly for the consumer threads; `g.c` is
/// the launch contract's `m x n` output, 16-byte aligned, `n` a multiple of `VEC`.
#[inline(always)]
unsafe fn split_k_epilogue(
    partial: Shared<f32>,
    g: Problem,
    owner: Option<Owner>,
    acc: &SplitAcc,
    pdl: Pdl,
) {
    // The cluster barriers are `.aligned`: reconverge the warp after the roles' spin loops.
    // SAFETY: every lane of every warp calls this function (contract above), none has exited.
    unsafe { sync_warp() };
    let rank = cluster::cta_rank();
    if let (Some(o), 1) = (owner, rank) {
        // SAFETY: the partial tile is this CTA's and only the consumer threads write it.
        unsafe { park_partial(acc, partial, o) };
    }
    // SAFETY: every thread of the cluster, warps reconverged above.
    unsafe { cluster::sync_cluster() };
    if let (Some(o), 0) = (owner, rank) {
        let mut sum = *acc;
        // SAFETY: rank 1's partial is complete (cluster barrier above) and rank 1 stays resident
        // until the next cluster barrier; C as the contract above says, rows and columns checked
        // against m and n; each element of C is written by exactly one thread.
        unsafe {
            add_partial(&mut sum, cluster::map_shared_rank(partial.addr(), 1), o);
            store_c::<SplitTile, THREAD_ROWS, { split::COL_VECS }, true>(
                &sum,
                g.c,
                g.n,
                g.m0 + o.group,
                g.n0 + o.col,
                g.m,
                g.n,
                pdl,
            );
        }
    }
    // SAFETY: every thread of the cluster; the branches above hold no barrier, so each warp is
    // converged again here (the same barrier, reached by all lanes of both roles).
    unsafe { cluster::sync_cluster() };
}

/// The split-K GEMM `C = A · B` (the body of `primary_gemm` and `secondary_gemm`): stage ring
/// init, the loader and compute roles, the split-K epilogue, then the trigger (unless
/// `Pdl::Off`). `stamps`: start, middle (`WaitBeforeA`: the wait returned; otherwise the trigger),
/// end.
///
/// # Safety
/// The launch contract of `primary_gemm` (contract::pdl); with `Pdl::WaitBeforeA`, B is not
/// written by the previous kernel on the stream; with `Pdl::Off`, the launch has no PDL attribute.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the kernel's parameters plus the PDL option
pub(super) unsafe fn split_k_gemm(
    pdl: Pdl,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    m: u32,
    n: u32,
    k: u32,
    stamps: *mut u64,
) {
    // SAFETY: `stamps` as the launch contract says.
    unsafe { stamp(stamps, STAMP_START) };
    let base = dynamic_smem_base();
    // SAFETY: the launch gives GEMM_SMEM_BYTES of dynamic shared memory, whose
    // BARRIERS_OFFSET.. region (8-byte aligned) holds the barriers only and BUFFERS_OFFSET.. the
    // stages; thread 0 initialises them below before the CTA barrier; producer and consumers keep
    // to the counts.
    let s = unsafe {
        let pipe = Pipeline::<SPLIT_STAGES>::at(base + split::BARRIERS_OFFSET as u32);
        SplitStages::new(pipe, base + split::BUFFERS_OFFSET as u32)
    };
    let partial = Shared::at(base + split::PARTIAL_OFFSET as u32);
    if thread_idx_x() == 0 {
        // SAFETY: one thread, before any use; published by fence_init and the CTA barrier.
        unsafe {
            s.ring
                .init(SPLIT_PRODUCER_THREADS, SplitTile::COMPUTE_THREADS)
        };
        fence_init();
    }
    // SAFETY: every thread of the CTA, converged (only thread 0's branch above, no loop).
    unsafe { sync_threads() };

    let g = Problem::new(a, b, c, m, n, k);
    let tid = thread_idx_x();
    // SAFETY: the launch contract; barriers initialised and published above; every thread of the
    // CTA (of both CTAs of the cluster) reaches `split_k_epilogue`.
    unsafe {
        if tid < SPLIT_PRODUCER_THREADS {
            split_k_loader(s, g, tid, pdl, stamps);
            let zero: SplitAcc = [[[0.0; VEC]; split::COL_VECS]; THREAD_ROWS];
            split_k_epilogue(partial, g, None, &zero, pdl);
        } else {
            let o = Owner::new(tid - SPLIT_PRODUCER_THREADS);
            let mut st = PipelineState::<SPLIT_STAGES>::new();
            let acc = mainloop::<SplitTile, _, SPLIT_STAGES, THREAD_ROWS, { split::COL_VECS }>(
                s,
                &mut st,
                g.kt_end - g.kt_begin,
                o,
            );
            split_k_epilogue(partial, g, Some(o), &acc, pdl);
        }
    }
    if pdl != Pdl::Off {
        // Every store of C by this CTA precedes the cluster barrier above: trigger the dependent.
        pdl::launch_dependents();
    }
    // SAFETY: `stamps` as the launch contract says.
    unsafe {
        if pdl != Pdl::WaitBeforeA {
            stamp(stamps, STAMP_MID);
        }
        stamp(stamps, STAMP_END);
    }
}
