//! Batched BF16 GEMM on 3-D TMA (issue 22, "3-D TMA"): `C[b] = A[b] * B[b]`, one CTA per
//! `BM x BN` output tile of one batch, no cluster. Shapes, layouts, parameters:
//! `contract::batched_gemm`.
//!
//! ```text
//!   producer (warpgroup 0, one thread)        consumers (warpgroups 1, 2: rows 0..64, 64..128)
//!   per 64-deep k-block:                      per k-block:
//!     ring.producer_acquire(stage) <-empty--    ring.consumer_release_local(previous stage)
//!     TMA 3-D: A {k, m0, b}, B {k, n0, b} -full-> ring.consumer_wait(stage); 4 x wgmma m64n256k16
//!                                             epilogue: BF16 pairs straight from registers
//! ```
//!
//! The template owns the barriers: a `TmaPipeline` used by one CTA (`init_cta`: thread 0
//! initialises, `fence_init` + `bar.sync` publish; consumers release locally), so the roles below
//! only say which tile goes where.

use crate::contract::batched_gemm::*;
use crate::device::math::pack_bf16x2;
use crate::device::pipeline::{PipelineState, TmaPipeline};
use crate::device::smem::dynamic_smem_base;
use crate::device::thread::{block_dim_x, thread_idx_x};
use crate::device::tma::TensorMap;
use crate::device::warpgroup::{
    setmaxnreg_dec, setmaxnreg_inc, thread_in_warpgroup, warpgroup_idx,
};
use crate::device::wgmma::{self, MatrixDescriptor, Swizzle};

type Ring = TmaPipeline<{ STAGES as u32 }>;
type State = PipelineState<{ STAGES as u32 }>;

/// FP32 accumulators per consumer thread: a 64 x 256 warpgroup tile over 128 threads.
const ACC: usize = WG_M * BN / WARPGROUP_THREADS as usize;
/// Bytes that land in a stage: the A and B boxes.
const STAGE_TX_BYTES: u32 = (A_STAGE_BYTES + B_STAGE_BYTES) as u32;
/// One 128-byte-swizzle atom (8 rows of 128 bytes): wgmma's stride-dimension byte offset.
const ATOM_BYTES: u32 = 8 * 128;

/// One output tile: what every role of the CTA knows.
#[derive(Clone, Copy)]
struct Tile {
    a: TensorMap,
    b: TensorMap,
    c: *mut u16,
    m: u32,
    n: u32,
    ldc: u32,
    stride_c: u64,
    k_blocks: u32,
    /// First row, first column, batch of the tile.
    m0: u32,
    n0: u32,
    batch: u32,
    /// 1024-byte aligned shared-window base of the layout.
    smem: u32,
    ring: Ring,
}

impl Tile {
    #[inline(always)]
    fn a_stage(self, s: State) -> u32 {
        self.smem + (A_OFFSET + s.stage() as usize * A_STAGE_BYTES) as u32
    }
    #[inline(always)]
    fn b_stage(self, s: State) -> u32 {
        self.smem + (B_OFFSET + s.stage() as usize * B_STAGE_BYTES) as u32
    }
}

/// Producer (one thread): the tile's k-blocks of A and B, each a 3-D box `{k, row, batch}`.
#[inline(always)]
fn producer(t: Tile) {
    t.a.acquire();
    t.b.acquire();
    let mut st = State::new();
    let mut kb = 0;
    while kb < t.k_blocks {
        let full = t.ring.producer_acquire(st, STAGE_TX_BYTES);
        let k0 = (kb * BK as u32) as i32;
        let (m0, n0, b) = (t.m0 as i32, t.n0 as i32, t.batch as i32);
        // SAFETY: the stage is free (producer_acquire), 1024-byte aligned and holds both boxes;
        // its full barrier is armed for exactly their bytes; boxes past M, N or K read zeros.
        unsafe {
            t.a.load_3d(t.a_stage(st), [k0, m0, b], full);
            t.b.load_3d(t.b_stage(st), [k0, n0, b], full);
        }
        st.advance();
        kb += 1;
    }
}

/// Consumer warpgroup `wg` (0 or 1): rows `64 * wg ..` of the tile. Keeps one wgmma-group in
/// flight and releases the stage the previous group read.
#[inline(always)]
fn consumer(t: Tile, wg: u32) {
    const ZERO: [f32; ACC] = [0.0; ACC];
    let mut acc = ZERO;
    let leader = thread_in_warpgroup() == 0;
    let mut st = State::new();
    let mut reading = st;
    let mut kb = 0;
    while kb < t.k_blocks {
        t.ring.consumer_wait(st);
        let a = MatrixDescriptor::new(
            t.a_stage(st) + wg * (WG_M * BK * IN_BYTES) as u32,
            16,
            ATOM_BYTES,
            Swizzle::B128,
        );
        let b = MatrixDescriptor::new(t.b_stage(st), 16, ATOM_BYTES, Swizzle::B128);
        wgmma::fence_operands(&mut acc);
        // SAFETY: all 128 threads run this loop with the same trip count and descriptors; the
        // stage holds A and B as the descriptors say (consumer_wait) and is released only after
        // a wait_group that covers these wgmmas.
        unsafe {
            wgmma::fence();
            let mut s = 0;
            while s < (BK / WGMMA_K) as u32 {
                let scale_d = (kb != 0 || s != 0) as u32;
                wgmma::mma_async_m64n256k16_f32_bf16::<0>(
                    &mut acc,
                    a.offset(s * 32),
                    b.offset(s * 32),
                    scale_d,
                );
                s += 1;
            }
            wgmma::commit_group();
            wgmma::wait_group::<1>();
        }
        if kb > 0 && leader {
            t.ring.consumer_release_local(reading);
        }
        reading = st;
        st.advance();
        kb += 1;
    }
    // SAFETY: warpgroup-collective, as above.
    unsafe { wgmma::wait_group::<0>() };
    wgmma::fence_operands(&mut acc);
    // The last stage needs no release: nobody refills it.
    let tid = thread_in_warpgroup();
    let row = t.m0 + wg * WG_M as u32 + (tid / 32) * 16 + (tid % 32) / 4;
    let col = t.n0 + 2 * (tid % 4);
    // Literal indices only, so the accumulators stay in registers (n8 block i: rows row and
    // row + 8, columns col + 8 i and the next).
    macro_rules! store_blocks {
        ($($i:literal)*) => {$(
            store_pair(t, row, col + 8 * $i, acc[4 * $i], acc[4 * $i + 1]);
            store_pair(t, row + 8, col + 8 * $i, acc[4 * $i + 2], acc[4 * $i + 3]);
        )*};
    }
    store_blocks!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);
}

/// `C[batch][r][c..c + 2] = (lo, hi)` rounded to BF16, for the elements inside C (`c` is even).
#[inline(always)]
fn store_pair(t: Tile, r: u32, c: u32, lo: f32, hi: f32) {
    if r >= t.m || c >= t.n {
        return;
    }
    let idx = t.batch as u64 * t.stride_c + r as u64 * t.ldc as u64 + c as u64;
    let v = pack_bf16x2(lo, hi);
    // SAFETY: (batch, r, c) lies inside C (checked against m, n; the launcher validated the
    // pitch, the batch stride and the view's length), and only this thread writes it; `idx` is
    // even (c, ldc and stride_c are even) and C is 16-byte aligned, so the pair is 4-byte
    // aligned.
    unsafe {
        if c + 1 < t.n {
            (t.c.add(idx as usize) as *mut u32).write(v);
        } else {
            t.c.add(idx as usize).write(v as u16);
        }
    }
}

/// The entry (see `contract::batched_gemm`).
///
/// Launch: grid `(ceil(N / BN), ceil(M / BM), batch)`, `THREADS_PER_CTA` threads, `SMEM_BYTES`
/// of dynamic shared memory, no cluster dimensions; another block size traps.
///
/// # Safety
/// `tmap_a` / `tmap_b` are device addresses of tensor maps made as the contract says (BF16, dims
/// `{K, M, batch}` / `{K, N, batch}`, boxes `A_BOX` / `B_BOX`, 128-byte swizzle), valid until
/// the kernel completes; `c` addresses `batch` matrices of `m x n` BF16 with row pitch `ldc` and
/// batch stride `stride_c` (both even, C 16-byte aligned), overlapping neither A nor B; the grid
/// is as above (its z is the batch count).
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn batched_gemm_bf16(
    tmap_a: u64,
    tmap_b: u64,
    c: u64,
    m: u32,
    n: u32,
    k: u32,
    ldc: u32,
    stride_c: u64,
) {
    if block_dim_x() != THREADS_PER_CTA {
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    let smem = (dynamic_smem_base() + SWIZZLE_ALIGN as u32 - 1) & !(SWIZZLE_ALIGN as u32 - 1);
    // SAFETY: reading special registers has no preconditions.
    let (bx, by, bz) = unsafe {
        (
            core::arch::nvptx::_block_idx_x(),
            core::arch::nvptx::_block_idx_y(),
            core::arch::nvptx::_block_idx_z(),
        )
    };
    let t = Tile {
        // SAFETY: the launch contract: device addresses of valid tensor maps.
        a: unsafe { TensorMap::at(tmap_a) },
        // SAFETY: as above.
        b: unsafe { TensorMap::at(tmap_b) },
        c: c as *mut u16,
        m,
        n,
        ldc,
        stride_c,
        k_blocks: k.div_ceil(BK as u32),
        m0: by * BM as u32,
        n0: bx * BN as u32,
        batch: bz,
        smem,
        // SAFETY: the barriers lie inside the launch's SMEM_BYTES, used for nothing else; thread
        // 0 initialises them below and fence_init + bar.sync publish that before any use; per
        // stage and phase one producer_acquire arms the two boxes' bytes and each consumer
        // warpgroup releases once (init count CONSUMER_WARPGROUPS).
        ring: unsafe { Ring::at(smem + BARRIERS_OFFSET as u32) },
    };
    if thread_idx_x() == 0 {
        t.a.prefetch();
        t.b.prefetch();
    }
    // SAFETY: every thread of the CTA, converged (only thread 0's branch above), before any use
    // of the ring; no cluster; one release per consumer warpgroup per stage and phase.
    unsafe { t.ring.init_cta(CONSUMER_WARPGROUPS) };
    if warpgroup_idx() == 0 {
        // SAFETY: the whole producer warpgroup, convergently; launch bounds with this split.
        unsafe { setmaxnreg_dec::<PRODUCER_REGS>() };
        if thread_idx_x() == 0 {
            producer(t);
        }
    } else {
        // SAFETY: the whole consumer warpgroup, convergently; the split fits the CTA's registers
        // (checked by launch_bounds! below).
        unsafe { setmaxnreg_inc::<CONSUMER_REGS>() };
        consumer(t, warpgroup_idx() - 1);
    }
}
crate::device::launch_bounds!(
    batched_gemm_bf16,
    THREADS_PER_CTA,
    1,
    setmaxnreg = [PRODUCER_REGS, CONSUMER_REGS, CONSUMER_REGS]
);
