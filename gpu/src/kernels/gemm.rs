//! `cluster_tile_gemm` and `tile_gemm`: batched `C_t = A_t x B_t` over 128x128 row-major f32 tiles.
//!
//! Roles (contract::gemm): one loader warp (bulk copies global -> shared) and `8 / N` compute
//! warps for a cluster of `N` CTAs (8 for `tile_gemm`), so that every compute thread keeps an 8x8
//! block of C in registers whatever the cluster size (shared -> registers -> FMA, then the block
//! straight to global memory with 16-byte stores). One ring of `stages(N)` k-chunk stages, each
//! `[A band chunk | B chunk]`, with a "full" and an "empty" mbarrier per stage (the device
//! `Pipeline`):
//!
//! ```text
//!   leader CTA (rank 0)                            every CTA r of the cluster
//!   loader: B[k0..k0+64, :] --multicast--------->  stage s: B chunk   (same offset in each CTA)
//!   loader (each CTA): A[band r, k0..k0+64] ---->  stage s: A chunk   (own band only)
//!                      full[s] (local, tx bytes) -> compute warps: C[band r] += A chunk x B chunk
//!   empty[s] of EVERY CTA <--remote arrive------  each compute thread of every CTA, per stage
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
//! `32 x 8/N x N = 256`. Each CTA waits on its own full barrier, armed by its own loader with the bytes it
//! will receive (its A rows plus the multicast B chunk). The kernel begins and ends with a cluster
//! barrier, so no multicast or remote arrive reaches a CTA before its barriers exist or after it
//! exited.
//!
//! Register tile: with `G = 16/N` row groups (2 per compute warp), compute thread
//! `(warp w, lane l)` owns rows `band + g + G i` (`g = 2w + l/16`, `i < 8`) and columns
//! `4c..4c+4`, `64+4c..64+4c+4` (`c = l % 16`) of C. Per 4-deep k-step a thread reads one `float4`
//! of A per row (8 LDS.128: a row of the A chunk, padded pitch 68 floats so a warp's two row
//! groups hit different banks, the 16 lanes of a group broadcast) and two `float4`s of B per k (8
//! LDS.128: the 16 column groups read 256 contiguous bytes, the two row groups broadcast), i.e. 2 +
//! 2 LDS.128 per k for 64 FMAs; the k loop over a chunk is unrolled by 16 (full unrolling spills).
//!
//! Persistent: cluster `c` takes tiles `c, c + clusters, ...` (`tile_gemm`: CTA `b` takes
//! `b, b + gridDim.x, ...`), every role walks the same sequence with its own `PipelineState`, so any
//! grid size works. Chapter 11, "Warp Specialization with Thread Block Clusters and CUDA Streams",
//! ported with per-role mbarrier arrivals; PTX ISA §9.7.9.25.4 (cp.async.bulk), §9.7.13.15
//! (mbarrier), §9.7.13.4 (barrier.cluster), §9.7.9.21 (mapa).

use core::arch::asm;

use crate::contract::gemm::*;
use crate::contract::WARP_SIZE;
use crate::device::mbarrier::fence_init;
use crate::device::pipeline::{Pipeline, PipelineState};
use crate::device::smem::{dynamic_smem_base, store_global_v4, Shared};
use crate::device::thread::{block_dim_x, block_idx_x, grid_dim_x, sync_threads, thread_idx_x};
use crate::device::warp::sync_warp;
use crate::device::{bulk, cluster};

const LOADER_THREADS: u32 = LOADER_WARPS * WARP_SIZE;
const TILE_U: u32 = TILE as u32;

/// The shared-memory view every role shares, for a cluster of `N` CTAs and `S` stages.
#[derive(Clone, Copy)]
struct Smem<const N: u32, const S: u32> {
    pipe: Pipeline<S>,
    buffers: u32,
}

impl<const N: u32, const S: u32> Smem<N, S> {
    /// The layout of `contract::gemm` over this CTA's dynamic shared memory.
    ///
    /// # Safety
    /// The launch gave `smem_bytes(N)` bytes of dynamic shared memory; one thread initialises the
    /// pipeline and publishes it (cluster barrier) before any other use; the roles keep to the
    /// counts given to `init` (see [`Pipeline::at`]).
    unsafe fn new() -> Self {
        let base = dynamic_smem_base();
        Self {
            // SAFETY: BARRIERS_OFFSET.. (8-byte aligned) holds only the 2 x S barriers inside
            // smem_bytes(N); initialisation and protocol are the caller's contract above.
            pipe: unsafe { Pipeline::at(base + BARRIERS_OFFSET as u32) },
            buffers: base + BUFFERS_OFFSET as u32,
        }
    }
    /// A chunk of `stage`: rows of this CTA's band, pitch `A_PITCH` floats.
    fn a(self, stage: u32) -> Shared<f32> {
        Shared::at(self.buffers + stage * stage_bytes(N) as u32)
    }
    /// B chunk of `stage`: `K_CHUNK` rows of `TILE` floats.
    fn b(self, stage: u32) -> Shared<f32> {
        Shared::at(self.buffers + stage * stage_bytes(N) as u32 + a_stage_bytes(N) as u32)
    }
}

/// Where this CTA sits and which tiles its cluster walks.
#[derive(Clone, Copy)]
struct Place {
    /// Launched as a cluster kernel (remote arrivals, multicast when the cluster has > 1 CTA).
    clustered: bool,
    rank: u32,
    first_tile: u32,
    tile_stride: u32,
    tiles: u32,
}

/// Loader role (one warp): per stage, arm the full barrier with the bytes this CTA receives, bulk
/// copy this CTA's A rows (one 128-byte copy per row), and on the leader the B chunk, multicast
/// to the cluster.
///
/// # Safety
/// The launch contract of [`cluster_tile_gemm`]; called by the loader warp (all 32 lanes) after
/// every CTA of the cluster initialised and published its barriers.
#[inline(always)]
unsafe fn loader<const N: u32, const S: u32>(
    s: Smem<N, S>,
    p: Place,
    lane: u32,
    a: *const f32,
    b: *const f32,
) {
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
            s.pipe.producer_acquire(st);
            let full = s.pipe.full(st);
            if lane == 0 {
                full.arrive_expect_tx(tx);
            }
            // SAFETY: all 32 lanes of the loader warp run this loop the same number of times.
            unsafe { sync_warp() };
            let k0 = chunk as usize * K_CHUNK;
            // SAFETY: the stage is free in every CTA of the cluster (empty barrier, counting all
            // CTAs' compute warps); sources lie inside tile `tile < tiles` of A and B (host checked
            // lengths = tiles x 128 x 128 and 16-byte alignment; rows are 512 bytes, k0 a multiple
            // of 64 floats); destinations lie inside the stage, 16-byte aligned (pitch 272 bytes).
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

/// `acc += A[:, kk..kk+4] x B[kk..kk+4, :]` for this thread's 8x8 block: 8 LDS.128 of A (one
/// per row) and 8 of B (two per k), 128 FMAs. `a`: this thread's first A row in the stage (rows
/// `ROW_STEP` apart); `b`: this thread's first column in the stage's B chunk.
///
/// # Safety
/// The stage is filled (full barrier observed) and not refilled until this warp releases it.
#[inline(always)]
unsafe fn mma_step<const ROW_STEP: u32>(
    acc: &mut [[f32; 8]; 8],
    a: Shared<f32>,
    b: Shared<f32>,
    kk: u32,
) {
    let mut af = [[0f32; 4]; 8];
    for (i, f) in af.iter_mut().enumerate() {
        // SAFETY: inside the filled stage (contract above), 16-byte aligned (pitch 272 bytes).
        *f = unsafe { a.add(ROW_STEP * i as u32 * A_PITCH as u32 + kk).load_v4() };
    }
    for j in 0..4 {
        let brow = b.add((kk + j as u32) * TILE_U);
        // SAFETY: inside the filled stage (contract above), 16-byte aligned.
        let (b0, b1) = unsafe { (brow.load_v4(), brow.add(64).load_v4()) };
        for (i, row) in af.iter().enumerate() {
            let x = row[j];
            for q in 0..4 {
                acc[i][q] = fma(x, b0[q], acc[i][q]);
                acc[i][4 + q] = fma(x, b1[q], acc[i][4 + q]);
            }
        }
    }
}

/// `acc += A chunk x B chunk` for this thread's 8x8 block: 2 + 2 LDS.128 per k, the 16 k-steps
/// of the 64-deep chunk unrolled by 4 (LLVM keeps a plain `for` over them rolled; written out in
/// full, ptxas spills: 255 registers).
///
/// # Safety
/// As [`mma_step`].
#[inline(always)]
unsafe fn mma_chunk<const ROW_STEP: u32>(acc: &mut [[f32; 8]; 8], a: Shared<f32>, b: Shared<f32>) {
    const _: () = assert!(K_CHUNK.is_multiple_of(16));
    let mut kk = 0;
    while kk < K_CHUNK as u32 {
        // SAFETY: forwarded; kk + 15 < K_CHUNK.
        unsafe {
            mma_step::<ROW_STEP>(acc, a, b, kk);
            mma_step::<ROW_STEP>(acc, a, b, kk + 4);
            mma_step::<ROW_STEP>(acc, a, b, kk + 8);
            mma_step::<ROW_STEP>(acc, a, b, kk + 12);
        }
        kk += 16;
    }
}

/// Compute thread: done reading the stage; one arrival per compute thread on the empty barrier
/// of every CTA of the cluster (release at cluster scope covers this thread's reads). Every thread
/// arrives itself rather than one lane per warp after `bar.warp.sync`: compute-sanitizer's
/// racecheck only credits a thread's own arrival for its reads.
///
/// # Safety
/// When `p.clustered`, the launch is a cluster of `N` CTAs that all initialised and published
/// their barriers and stay resident until the kernel's final cluster barrier.
#[inline(always)]
unsafe fn release<const N: u32, const S: u32>(s: Smem<N, S>, p: Place, st: PipelineState<S>) {
    let empty = s.pipe.empty(st);
    if p.clustered {
        let mut r = 0;
        while r < N {
            // SAFETY: CTA r < N of this cluster has its empty barrier at the same offset,
            // initialised and published (cluster barrier at the start of `run`), and stays
            // resident until the cluster barrier at the end of `run` (contract above); its init
            // count is one arrival per compute thread of the cluster and phase.
            unsafe { cluster::remote_arrive(cluster::map_shared_rank(empty.addr(), r)) };
            r += 1;
        }
    } else {
        empty.arrive();
    }
}

/// Compute role, 8x8 register block per thread: accumulate over the tile's k-chunks, then store
/// the block to C with 16-byte stores. `ROW_STEP` = row groups of the CTA = `16 / N`.
///
/// # Safety
/// The launch contract of [`cluster_tile_gemm`] (as [`release`]); called by a compute warp.
#[inline(always)]
unsafe fn compute<const N: u32, const S: u32, const ROW_STEP: u32>(
    s: Smem<N, S>,
    p: Place,
    warp: u32,
    lane: u32,
    c: *mut f32,
) {
    let group = warp * 2 + lane / 16;
    let col = (lane % 16) * 4;
    let mut st = PipelineState::<S>::new();
    let mut tile = p.first_tile;
    while tile < p.tiles {
        let mut acc = [[0f32; 8]; 8];
        let mut chunk = 0;
        while chunk < CHUNKS_PER_TILE as u32 {
            s.pipe.consumer_wait(st);
            // SAFETY: the stage is filled (consumer_wait) and stays so until `release`; rows
            // `group + ROW_STEP i < band_rows(N)` and columns `col + 64 + 3 < 128` stay inside
            // the stage.
            unsafe {
                mma_chunk::<ROW_STEP>(
                    &mut acc,
                    s.a(st.stage()).add(group * A_PITCH as u32),
                    s.b(st.stage()).add(col),
                );
            }
            // SAFETY: the contract above.
            unsafe { release(s, p, st) };
            st.advance();
            chunk += 1;
        }
        let row0 = p.rank * band_rows(N) + group;
        for (i, r) in acc.iter().enumerate() {
            let row = row0 + ROW_STEP * i as u32;
            // SAFETY: row < 128, col + 68 <= 128 inside tile `tile < tiles` of C (host checked the
            // length and 16-byte alignment); each element of C is written by exactly one thread.
            unsafe {
                let dst = c.add(tile as usize * TILE_ELEMS + (row * TILE_U + col) as usize);
                store_global_v4(dst, [r[0], r[1], r[2], r[3]]);
                store_global_v4(dst.add(64), [r[4], r[5], r[6], r[7]]);
            }
        }
        tile += p.tile_stride;
    }
}

/// One CTA of a cluster of `N` (`S = stages(N)`, `ROW_STEP = 16 / N`): initialise the barriers
/// (empty count: `compute_warps(N) x 32 x N` = 256 arrivals, one per compute thread of the cluster), sync,
/// split into the roles (the loader warp first).
///
/// # Safety
/// The launch contract of [`cluster_tile_gemm`] for cluster size `N` (or of [`tile_gemm`] when
/// `!p.clustered`, `N = 1`): block size `threads_per_cta(N)`, `smem_bytes(N)` dynamic shared
/// memory, every thread of the CTA calls this.
#[inline(always)]
unsafe fn run<const N: u32, const S: u32, const ROW_STEP: u32>(
    p: Place,
    a: *const f32,
    b: *const f32,
    c: *mut f32,
) {
    // SAFETY: shared memory sized by the launch contract; thread 0 initialises the pipeline and
    // publishes it below before any role uses it; the counts match the roles (1 expect_tx arrival
    // per stage phase; one release per compute thread of the cluster).
    let s = unsafe { Smem::<N, S>::new() };
    if thread_idx_x() == 0 {
        // SAFETY: one thread, before any use, then fence_init and a CTA/cluster barrier.
        unsafe { s.pipe.init(1, compute_warps(N) * WARP_SIZE * N) };
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
            loader(s, p, tid, a, b);
        } else {
            let warp = (tid - LOADER_THREADS) / WARP_SIZE;
            let lane = tid % WARP_SIZE;
            compute::<N, S, ROW_STEP>(s, p, warp, lane, c);
        }
    }
    // SAFETY: every lane of every warp reaches this point (no lane exits early).
    unsafe { sync_warp() };
    if p.clustered {
        // No CTA exits while a peer may still arrive on its barriers.
        // SAFETY: every thread of the cluster, warps reconverged by sync_warp.
        unsafe { cluster::sync_cluster() };
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
    };
    // SAFETY: the launch contract above, cluster size and block size checked.
    unsafe {
        match size {
            1 => run::<1, { stages(1) as u32 }, 16>(p, a, b, c),
            2 => run::<2, { stages(2) as u32 }, 8>(p, a, b, c),
            4 => run::<4, { stages(4) as u32 }, 4>(p, a, b, c),
            // 8; other sizes trapped above.
            _ => run::<8, { stages(8) as u32 }, 2>(p, a, b, c),
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
    };
    // SAFETY: the launch contract above (that of a cluster of 1 without cluster barriers).
    unsafe { run::<1, { stages(1) as u32 }, 16>(p, a, b, c) };
}
