//! Programmatic Dependent Launch kernels (ch. 11, "Programmatic Dependent Launch" and "Combining
//! PDL and Thread Block Clusters with Warp Specialization"; PTX ISA §9.7.12.x `griddepcontrol`).
//!
//! The rule every kernel here follows (contract::pdl):
//! - `pdl::wait()` before the first access to memory that the previous kernel on the stream
//!   writes or reads (read-after-write *and* write-after-read); work before it (shared memory
//!   setup, mbarrier init, index arithmetic) overlaps the previous kernel's tail. A global load
//!   before the wait is allowed only of an input that the launch contract says the previous
//!   kernel does not write (secondary_gemm's B); any buffer a caller may chain behind a primary
//!   (pdl_consumer's `scale`, say) is read after the wait.
//! - `pdl::launch_dependents()` after the CTA's last store that the next kernel reads, behind a
//!   CTA barrier, because the first thread of a CTA to execute it triggers for the whole CTA.
//!
//! `wait` returns only once the previous grid has *completed* and its memory is visible, so the
//! trigger's position decides how early the next grid is scheduled, not what it reads.
//!
//! ```text
//!   pair:       pdl_producer  [wait | buf = 2 inp + 1 | sync | trigger]
//!               pdl_consumer       [index setup | wait | out = buf * scale | sync | trigger]
//!   GEMM pair:  primary_gemm   cluster of 2 CTAs: producer warp --cp.async/mbarrier--> 4 consumer
//!                              warps (each CTA half of K) -> DSMEM split-K reduction -> wait ->
//!                              store C -> cluster sync -> trigger
//!               secondary_gemm barriers + B tiles (independent) -> wait -> A tiles (= primary's C)
//! ```

use core::arch::asm;

use crate::contract::pdl::*;
use crate::contract::WARP_SIZE;
use crate::device::clock::global_timer_ns;
use crate::device::mbarrier::fence_init;
use crate::device::pipeline::{Pipeline, PipelineState};
use crate::device::smem::{dynamic_smem_base, store_global_v4, Shared};
use crate::device::thread::{block_dim_x, block_idx_x, grid_dim_x, sync_threads, thread_idx_x};
use crate::device::warp::sync_warp;
use crate::device::{cluster, cp_async, pdl};

type Pipe = Pipeline<{ STAGES as u32 }>;
type State = PipelineState<{ STAGES as u32 }>;

const PRODUCER_THREADS: u32 = PRODUCER_WARPS * WARP_SIZE;
const CONSUMER_THREADS: u32 = CONSUMER_WARPS * WARP_SIZE;

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
        unsafe { *stamps.add(block_idx_x() as usize * STAMPS_PER_CTA + slot) = global_timer_ns() };
    }
}

/// Global index of this thread.
#[inline(always)]
fn global_thread() -> u64 {
    block_idx_x() as u64 * block_dim_x() as u64 + thread_idx_x() as u64
}

/// Visits the indices `< n` this thread owns in a grid-stride loop.
#[inline(always)]
fn for_each_index(n: u64, mut f: impl FnMut(usize)) {
    let stride = grid_dim_x() as u64 * block_dim_x() as u64;
    let mut i = global_thread();
    while i < n {
        f(i as usize);
        i += stride;
    }
}

/// Trigger after every thread of the CTA has made its stores (the first trigger in a CTA counts).
///
/// # Safety
/// As [`sync_threads`]: every thread of the CTA calls it, each warp convergently.
#[inline(always)]
unsafe fn trigger_after_cta_stores() {
    // SAFETY: the caller's contract above.
    unsafe { sync_threads() };
    pdl::launch_dependents();
}

// ---------------------------------------------------------------------------------------------
// kernel_A / kernel_B pair
// ---------------------------------------------------------------------------------------------

/// Producer role of the pair: `buf[i] = 2 * inp[i] + 1`.
///
/// # Safety
/// `inp` readable and `buf` writable for `n` f32 each (4-byte aligned), not overlapping, and not
/// accessed by other kernels while this one runs (`pdl::wait` has returned).
#[inline(always)]
unsafe fn produce(inp: *const f32, buf: *mut f32, n: u64) {
    // SAFETY: i < n (contract above); each index is visited by one thread.
    for_each_index(n, |i| unsafe { *buf.add(i) = 2.0 * *inp.add(i) + 1.0 });
}

/// `pdl_producer`: waits for the previous kernel (which may still read `buf`), writes
/// `buf[i] = 2 * inp[i] + 1` for `i < n`, then triggers the dependent launch.
///
/// Launch: `PAIR_THREADS` threads, any grid, no shared memory, with or without PDL. `inp`, `buf`:
/// `n` f32 each, not overlapping.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn pdl_producer(inp: *const f32, buf: *mut f32, n: u64) {
    pdl::wait();
    // SAFETY: the launch contract; the previous kernel has completed (wait); every thread of the
    // CTA reaches the trigger (no early exits, the loop is not divergent at its end).
    unsafe {
        produce(inp, buf, n);
        trigger_after_cta_stores();
    }
}

/// Test-only negative control: as [`pdl_producer`] but triggers *before* its stores, breaking
/// the chapter's rule. A dependent that waits still reads the right data (`wait` waits for
/// completion); one that reads before waiting sees stale data.
///
/// # Safety
/// As [`pdl_producer`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn pdl_producer_early_trigger(
    inp: *const f32,
    buf: *mut f32,
    n: u64,
) {
    pdl::launch_dependents();
    pdl::wait();
    // SAFETY: the launch contract; the previous kernel has completed (wait).
    unsafe { produce(inp, buf, n) };
}

/// Consumer role of the pair: `out[i] = buf[i] * scale[i]`.
///
/// # Safety
/// `buf`, `scale` readable and `out` writable for `n` f32 each (4-byte aligned), `out` overlapping
/// neither; for a correct result, called after `pdl::wait` (the producer wrote `buf`).
#[inline(always)]
unsafe fn consume(buf: *const f32, scale: *const f32, out: *mut f32, n: u64) {
    // SAFETY: i < n (contract above); each index is visited by one thread.
    for_each_index(n, |i| unsafe { *out.add(i) = *buf.add(i) * *scale.add(i) });
}

/// `pdl_consumer`: waits for the previous kernel, then `out[i] = buf[i] * scale[i]` for `i < n`,
/// then triggers. Nothing is read from global memory before the wait: the previous kernel on the
/// stream may write `scale` as well as `buf` (a caller may chain any kernel in front), so the only
/// work that overlaps its tail is this kernel's launch and index setup.
///
/// Launch: `PAIR_THREADS` threads, any grid, no shared memory, with PDL after `pdl_producer`.
/// `buf`, `scale`, `out`: `n` f32 each; `out` overlaps neither.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn pdl_consumer(
    buf: *const f32,
    scale: *const f32,
    out: *mut f32,
    n: u64,
) {
    // Every global read (buf and scale) after the wait: see the doc comment.
    pdl::wait();
    // SAFETY: the launch contract; the previous kernel has completed (wait); every thread of the
    // CTA reaches the trigger.
    unsafe {
        consume(buf, scale, out, n);
        trigger_after_cta_stores();
    }
}

/// Test-only negative control: [`pdl_consumer`] without the `wait` (reads `buf` while the
/// producer may still be writing it).
///
/// # Safety
/// As [`pdl_consumer`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn pdl_consumer_no_wait(
    buf: *const f32,
    scale: *const f32,
    out: *mut f32,
    n: u64,
) {
    // SAFETY: the launch contract (memory safe; the result is racy by design).
    unsafe { consume(buf, scale, out, n) };
}

// ---------------------------------------------------------------------------------------------
// chain_step
// ---------------------------------------------------------------------------------------------

/// `chain_step`: `x[i] += 1` (wrapping u32) for `i < n`. Waits at start (the previous step wrote
/// `x`), triggers after its stores, so a chain of them launched with PDL is correct.
///
/// Launch: `CHAIN_STEP_THREADS` threads, any grid, no shared memory; `x`: `n` u32.
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn chain_step(x: *mut u32, n: u64) {
    pdl::wait();
    // SAFETY: i < n, `x` holds n u32 (launch contract); each index is visited by one thread.
    for_each_index(n, |i| unsafe { *x.add(i) = (*x.add(i)).wrapping_add(1) });
    // SAFETY: every thread of the CTA reaches the trigger.
    unsafe { trigger_after_cta_stores() };
}

// ---------------------------------------------------------------------------------------------
// primary_gemm / secondary_gemm
// ---------------------------------------------------------------------------------------------

/// Which kernel of the GEMM pair a CTA runs: where its `wait` goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Reads only independent inputs; waits before its stores of C (the previous kernel may read C).
    Primary,
    /// Reads A = the primary's C: B tiles and barriers before the wait, A tiles after.
    Secondary,
}

/// `fma.rn.f32`: `a * b + c` rounded once.
#[inline(always)]
fn fma(a: f32, b: f32, c: f32) -> f32 {
    let d: f32;
    // SAFETY: register arithmetic only.
    unsafe {
        asm!("fma.rn.f32 {d}, {a}, {b}, {c};", d = out(reg32) d, a = in(reg32) a, b = in(reg32) b,
            c = in(reg32) c, options(pure, nomem, nostack))
    };
    d
}

/// The shared-memory view of a GEMM CTA.
#[derive(Clone, Copy)]
struct GemmSmem {
    pipe: Pipe,
    buffers: u32,
    partial: Shared<f32>,
}

impl GemmSmem {
    fn a(self, stage: u32) -> Shared<f32> {
        Shared::at(self.buffers + stage * STAGE_BYTES as u32)
    }
    fn b(self, stage: u32) -> Shared<f32> {
        Shared::at(self.buffers + stage * STAGE_BYTES as u32 + A_TILE_BYTES as u32)
    }
}

/// The problem and this CTA's share of it: C[m0.., n0..] over K tiles `kt_begin..kt_end`.
#[derive(Clone, Copy)]
struct Gemm {
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

impl Gemm {
    /// Cluster `clusterid.x` computes C tile (row-major over the tile grid); CTA rank r of the
    /// cluster takes half r of the K tiles (rank 1 may have none when K fits one tile).
    fn new(a: *const f32, b: *const f32, c: *mut f32, m: u32, n: u32, k: u32) -> Self {
        // max(1): the host rejects n = 0; this keeps the division free of a panic path.
        let tiles_n = n.div_ceil(TILE_N as u32).max(1);
        let tile = cluster::cluster_idx_x();
        let k_tiles = k.div_ceil(TILE_K as u32);
        let half = k_tiles.div_ceil(CLUSTER_CTAS);
        let rank = cluster::cta_rank();
        Self {
            a,
            b,
            c,
            m,
            n,
            k,
            m0: (tile / tiles_n) * TILE_M as u32,
            n0: (tile % tiles_n) * TILE_N as u32,
            kt_begin: core::cmp::min(rank * half, k_tiles),
            kt_end: core::cmp::min((rank + 1) * half, k_tiles),
        }
    }
}

/// Copies the `TILE_M x TILE_K` A tile at K tile `kt` into `stage` (zeros outside the matrix):
/// 16-byte chunks, `lane` takes every 32nd.
///
/// # Safety
/// `stage < STAGES` is free (no thread reads it until the copies are waited for and committed);
/// `g.a` is a 16-byte aligned `m x k` f32 matrix with `k` a multiple of 4 (launch contract).
#[inline(always)]
unsafe fn load_a_tile(s: GemmSmem, g: Gemm, stage: u32, kt: u32, lane: u32) {
    const CHUNKS_PER_ROW: u32 = (TILE_K / 4) as u32;
    let k0 = kt * TILE_K as u32;
    let mut c = lane;
    while c < TILE_M as u32 * CHUNKS_PER_ROW {
        let (r, col) = (c / CHUNKS_PER_ROW, (c % CHUNKS_PER_ROW) * 4);
        let (gr, gc) = (g.m0 + r, k0 + col);
        let inside = gr < g.m && gc < g.k;
        // SAFETY: the chunk is inside A when `inside` (k a multiple of 4, so all 16 bytes are),
        // else 0 bytes are read from the valid base; the destination lies inside the free stage,
        // 16-byte aligned (contract above).
        unsafe {
            let src = if inside {
                g.a.add(gr as usize * g.k as usize + gc as usize)
            } else {
                g.a
            };
            let dst = s.a(stage).add(r * A_ROW_STRIDE as u32 + col);
            cp_async::copy_16_zfill(dst.addr(), src, if inside { 16 } else { 0 });
        }
        c += WARP_SIZE;
    }
}

/// Copies the `TILE_K x TILE_N` B tile at K tile `kt` into `stage` (zeros outside the matrix).
///
/// # Safety
/// As [`load_a_tile`], for `g.b`, a `k x n` matrix with `n` a multiple of 4.
#[inline(always)]
unsafe fn load_b_tile(s: GemmSmem, g: Gemm, stage: u32, kt: u32, lane: u32) {
    const CHUNKS_PER_ROW: u32 = (TILE_N / 4) as u32;
    let k0 = kt * TILE_K as u32;
    let mut c = lane;
    while c < TILE_K as u32 * CHUNKS_PER_ROW {
        let (r, col) = (c / CHUNKS_PER_ROW, (c % CHUNKS_PER_ROW) * 4);
        let (gr, gc) = (k0 + r, g.n0 + col);
        let inside = gr < g.k && gc < g.n;
        // SAFETY: as in `load_a_tile`.
        unsafe {
            let src = if inside {
                g.b.add(gr as usize * g.n as usize + gc as usize)
            } else {
                g.b
            };
            let dst = s.b(stage).add(r * TILE_N as u32 + col);
            cp_async::copy_16_zfill(dst.addr(), src, if inside { 16 } else { 0 });
        }
        c += WARP_SIZE;
    }
}

/// Producer warp: stages A and B tiles with cp.async, one commit group per stage; a stage is
/// committed to its full mbarrier once its group has landed (`wait_group 1` after issuing the
/// next stage), as in `ws_vector_add` (racecheck does not model `cp.async.mbarrier.arrive.noinc`). The secondary issues the B tiles of the first
/// stages (independent data: the launch contract says the previous kernel does not write B)
/// before `pdl::wait()` and every A tile (the primary's output) after.
///
/// # Safety
/// The launch contract of [`primary_gemm`] / [`secondary_gemm`]; called by the producer warp
/// after the pipeline's barriers were initialised and published.
unsafe fn producer(s: GemmSmem, g: Gemm, lane: u32, role: Role, stamps: *mut u64) {
    let tiles = g.kt_end - g.kt_begin;
    let prefetched = if role == Role::Secondary {
        core::cmp::min(STAGES as u32, tiles)
    } else {
        0
    };
    // SAFETY (all copies below): stages are free (fresh barriers for the first STAGES, then
    // producer_acquire); tile offsets stay inside the stage buffers; global chunks are inside the
    // matrices or zero-filled from the valid base pointer; rows are 16-byte aligned (host checks).
    let mut i = 0;
    while i < prefetched {
        // SAFETY: see above; stage i < STAGES is fresh.
        unsafe { load_b_tile(s, g, i, g.kt_begin + i, lane) };
        i += 1;
    }
    if role == Role::Secondary {
        pdl::wait();
        // SAFETY: `stamps` as the launch contract says.
        unsafe { stamp(stamps, STAMP_MID) };
    }
    let mut st = State::new();
    let mut pending: Option<State> = None;
    let mut i = 0;
    while i < tiles {
        s.pipe.producer_acquire(st);
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
            s.pipe.producer_commit(prev);
        }
        pending = Some(st);
        st.advance();
        i += 1;
    }
    if let Some(last) = pending {
        cp_async::wait_group::<0>();
        s.pipe.producer_commit(last);
    }
}

/// Accumulators of one consumer thread: rows `ty + 8 i`, columns `4 tx .. 4 tx + 4` of the tile.
type Acc = [[f32; THREAD_COLS]; THREAD_ROWS];

/// (row of the first owned row, first owned column) of consumer thread `t`.
#[inline(always)]
fn owned(t: u32) -> (u32, u32) {
    let cols_threads = (TILE_N / THREAD_COLS) as u32;
    (t / cols_threads, (t % cols_threads) * THREAD_COLS as u32)
}

/// Consumer warps: for each staged K tile, acc += A_tile · B_tile (FMA, f32), then release it.
fn consumer(s: GemmSmem, g: Gemm, t: u32) -> Acc {
    let (ty, tx) = owned(t);
    let mut acc: Acc = [[0.0; THREAD_COLS]; THREAD_ROWS];
    let mut st = State::new();
    let mut kt = g.kt_begin;
    while kt < g.kt_end {
        s.pipe.consumer_wait(st);
        let (a, b) = (s.a(st.stage()), s.b(st.stage()));
        for kk in 0..TILE_K as u32 {
            // SAFETY: the stage is full (consumer_wait); offsets inside the tiles, B 16-byte aligned.
            let bv = unsafe { b.add(kk * TILE_N as u32 + tx).load_v4() };
            for (i, row) in acc.iter_mut().enumerate() {
                let r = ty + 8 * i as u32;
                // SAFETY: as above.
                let av = unsafe { a.add(r * A_ROW_STRIDE as u32 + kk).load() };
                for (j, x) in row.iter_mut().enumerate() {
                    *x = fma(av, bv[j], *x);
                }
            }
        }
        s.pipe.consumer_release(st);
        st.advance();
        kt += 1;
    }
    acc
}

/// Split-K reduction and store: rank 1 parks its partial tile in its shared memory, rank 0 adds
/// it through DSMEM and stores C after `pdl::wait()`; two cluster barriers order the hand-off and
/// keep rank 1 resident while rank 0 reads.
///
/// # Safety
/// Every thread of both CTAs of the cluster calls this (it holds two cluster barriers), after its
/// role finished with the pipeline; `g.c` is the launch contract's `m x n` output, 16-byte
/// aligned, `n` a multiple of 4.
unsafe fn reduce_and_store(s: GemmSmem, g: Gemm, consumer_t: Option<u32>, acc: &Acc) {
    // The cluster barriers are `.aligned`: reconverge the warp after the roles' spin loops.
    // SAFETY: every lane of every warp calls this function (contract above), none has exited.
    unsafe { sync_warp() };
    let rank = cluster::cta_rank();
    if let (Some(t), 1) = (consumer_t, rank) {
        let (ty, tx) = owned(t);
        for (i, row) in acc.iter().enumerate() {
            let r = ty + 8 * i as u32;
            // SAFETY: inside the partial tile, 16-byte aligned; only this thread writes it.
            unsafe { s.partial.add(r * TILE_N as u32 + tx).store_v4(*row) };
        }
    }
    // SAFETY: every thread of the cluster, warps reconverged above.
    unsafe { cluster::sync_cluster() };
    if let (Some(t), 0) = (consumer_t, rank) {
        let (ty, tx) = owned(t);
        let remote = cluster::map_shared_rank(s.partial.addr(), 1);
        // The previous kernel on the stream may still read C: wait before the first store.
        pdl::wait();
        for (i, row) in acc.iter().enumerate() {
            let r = ty + 8 * i as u32;
            let off = (r * TILE_N as u32 + tx) * 4;
            // SAFETY: rank 1's partial is complete (cluster barrier) and rank 1 stays resident until
            // the next cluster barrier; 16-byte aligned.
            let p = unsafe { cluster::load_v4(remote + off) };
            let (gr, gc) = (g.m0 + r, g.n0 + tx);
            if gr < g.m && gc < g.n {
                let v = [row[0] + p[0], row[1] + p[1], row[2] + p[2], row[3] + p[3]];
                // SAFETY: inside C (n is a multiple of 4, so the whole vector is); 16-byte aligned.
                unsafe { store_global_v4(g.c.add(gr as usize * g.n as usize + gc as usize), v) };
            }
        }
    }
    // SAFETY: every thread of the cluster; the branches above hold no barrier, so each warp is
    // converged again here (the same barrier, reached by all lanes of both roles).
    unsafe { cluster::sync_cluster() };
}

/// The body shared by both GEMM kernels; `role` places the wait.
///
/// # Safety
/// The launch contract of [`primary_gemm`]; for the secondary, B is not written by the previous
/// kernel on the stream.
#[inline(always)]
#[allow(clippy::too_many_arguments)] // the kernel's parameters plus the role
unsafe fn gemm(
    role: Role,
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
    let s = GemmSmem {
        // SAFETY: the launch gives GEMM_SMEM_BYTES of dynamic shared memory, whose
        // BARRIERS_OFFSET.. region (8-byte aligned) holds the barriers only; thread 0 initialises
        // them below before the CTA barrier; producer and consumers keep to the counts.
        pipe: unsafe { Pipe::at(base + BARRIERS_OFFSET as u32) },
        buffers: base + BUFFERS_OFFSET as u32,
        partial: Shared::at(base + PARTIAL_OFFSET as u32),
    };
    if thread_idx_x() == 0 {
        // SAFETY: one thread, before any use; published by fence_init and the CTA barrier.
        unsafe { s.pipe.init(PRODUCER_THREADS, CONSUMER_THREADS) };
        fence_init();
    }
    // SAFETY: every thread of the CTA, converged (only thread 0's branch above, no loop).
    unsafe { sync_threads() };

    let g = Gemm::new(a, b, c, m, n, k);
    let tid = thread_idx_x();
    let zero: Acc = [[0.0; THREAD_COLS]; THREAD_ROWS];
    // SAFETY: the launch contract; barriers initialised and published above; every thread of the
    // CTA (of both CTAs of the cluster) reaches `reduce_and_store`.
    unsafe {
        if tid < PRODUCER_THREADS {
            producer(s, g, tid, role, stamps);
            reduce_and_store(s, g, None, &zero);
        } else {
            let acc = consumer(s, g, tid - PRODUCER_THREADS);
            reduce_and_store(s, g, Some(tid - PRODUCER_THREADS), &acc);
        }
    }
    // Every store of C by this CTA precedes the cluster barrier above: trigger the dependent.
    pdl::launch_dependents();
    // SAFETY: `stamps` as the launch contract says.
    unsafe {
        if role == Role::Primary {
            stamp(stamps, STAMP_MID);
        }
        stamp(stamps, STAMP_END);
    }
}

/// `primary_gemm`: `C = A · B`, f32, row-major; A `m x k`, B `k x n`, C `m x n`. Clusters of
/// `CLUSTER_CTAS` CTAs; cluster `x` computes the `TILE_M x TILE_N` tile `x` of C (row-major over
/// tiles), each CTA half of K, reduced through DSMEM. Waits (PDL) only before storing C, triggers
/// after its last store of C.
///
/// Launch: grid `CLUSTER_CTAS x ceil(m/TILE_M) x ceil(n/TILE_N)` CTAs with cluster dimension
/// `CLUSTER_CTAS`, `GEMM_THREADS` threads, `GEMM_SMEM_BYTES` dynamic shared memory. `k`, `n`
/// multiples of 4, pointers 16-byte aligned, `m, n, k >= 1`; `stamps` null or
/// `grid x STAMPS_PER_CTA` u64 (start, trigger, end). With PDL, the previous kernel on the stream
/// must write neither `a` nor `b` (both are read before `pdl::wait()`).
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn primary_gemm(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    m: u32,
    n: u32,
    k: u32,
    stamps: *mut u64,
) {
    // SAFETY: the launch contract above.
    unsafe { gemm(Role::Primary, a, b, c, m, n, k, stamps) };
}

/// `secondary_gemm`: as [`primary_gemm`] where A is the primary's output. Its prologue (mbarrier
/// init, the B tiles of the first `STAGES` stages) runs before `pdl::wait()`; A tiles are loaded
/// after it. `stamps`: start, wait returned, end.
///
/// Launch: as [`primary_gemm`]; in addition the previous kernel on the stream must not write `b`
/// (it is read before `pdl::wait()`), only `a` (= its C).
///
/// # Safety
/// The launch contract above.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn secondary_gemm(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    m: u32,
    n: u32,
    k: u32,
    stamps: *mut u64,
) {
    // SAFETY: the launch contract above.
    unsafe { gemm(Role::Secondary, a, b, c, m, n, k, stamps) };
}
