//! Tensor-core GEMM for Hopper (sm_90a): `C = alpha * A * B + beta * C` with TMA loads into a
//! 4-stage ring of 128-byte-swizzled shared memory, `wgmma.m64n256k16` on two consumer
//! warpgroups, clusters of 1 or 2 CTAs multicasting B, a persistent grid over a grouped raster
//! of output tiles, and a TMA-store epilogue. Shapes, layouts and parameters: `contract::tc_gemm`.
//!
//! FP8 (issue 20) is the same template with an FP8 [`Input`] type (`E4m3`, `E4m3E5m2`): a
//! k-block is 128 one-byte elements, the same 128-byte swizzled row as 64 16-bit ones, so every
//! byte offset, box size, transaction count and the epilogue stay as they are; the producer's
//! K coordinate steps by `Input::BK_ELEMS` and the consumers issue `wgmma ... m64n256k32 .e4m3`
//! (K-major B only). The FP8 entries also read two per-tensor scales after
//! `griddepcontrol.wait` and fold them into `alpha`.
//!
//! Roles, one warpgroup each (chapter 11, Figures 11-10/11-11: a warp-specialized multistage
//! pipeline fed by TMA, in clusters, overlapped with its neighbours by PDL):
//!
//! ```text
//!   producer (warpgroup 0, one thread)   consumers (warpgroups 1, 2: rows 0..64, 64..128)
//!   per tile, per 64-deep k-block:       per tile, per k-block:
//!     producer_acquire(stage)  <-empty--   consumer_release(stage) on every CTA of the cluster
//!     TMA A (own rows), TMA B  --full-->   consumer_wait(stage); 4 x wgmma m64n256k16
//!   launch_dependents after the last load  epilogue: alpha/beta in registers -> swizzled smem
//!   producer_tail                            chunk -> TMA store (overlaps the next mainloop)
//! ```
//!
//! Clusters of 2 are two CTAs with adjacent M tiles and the same N tile: each CTA loads one
//! half of the shared B tile and multicasts it into both, so every stage's full barrier expects
//! the A tile plus the whole B tile, and every consumer warpgroup releases the stage on both
//! CTAs' empty barriers (`TmaPipeline`).

use crate::contract::tc_gemm::*;
use crate::device::bulk;
use crate::device::cluster;
use crate::device::math::{bf16_to_f32, f16_to_f32, fma, pack_bf16x2, pack_f16x2};
use crate::device::mbarrier;
use crate::device::pdl;
use crate::device::pipeline::{PipelineState, TmaPipeline};
use crate::device::smem::{dynamic_smem_base, Shared};
use crate::device::thread::{block_dim_x, thread_idx_x};
use crate::device::tma::TensorMap;
use crate::device::warpgroup::{
    setmaxnreg_dec, setmaxnreg_inc, thread_in_warpgroup, warpgroup_idx, NamedBarrier,
};
use crate::device::wgmma::{self, MatrixDescriptor, Swizzle};

const RING_STAGES: u32 = STAGES as u32;
type Ring = TmaPipeline<RING_STAGES>;
type State = PipelineState<RING_STAGES>;

/// FP32 accumulators per consumer thread: a 64 x 256 warpgroup tile over 128 threads.
const ACC: usize = WG_M * BN / WARPGROUP_THREADS as usize;
/// Bytes that land in one CTA's stage, cooperative: its A tile (`BM` rows) and the whole B tile.
const STAGE_TX_BYTES: u32 = (A_STAGE_BYTES + B_STAGE_BYTES) as u32;
/// The same for ping-pong: A is `WG_M` rows.
const STAGE_TX_BYTES_PINGPONG: u32 = (WG_M * BK * IN_BYTES + B_STAGE_BYTES) as u32;
/// Rows of a 128-byte-swizzle atom; wgmma's stride-dimension byte offset is one atom.
const ATOM_BYTES: u32 = 8 * 128;
/// Bytes of one 128-row half of a K-major B stage (one TMA box).
const B_HALF_BYTES: u32 = (B_STAGE_BYTES / 2) as u32;
/// Bytes of one 64-column box of an N-major B stage (`BK` rows x 128 bytes).
const B_NMAJOR_BOX_BYTES: u32 = (BK * 128) as u32;
/// wgmma-groups (one per k-block) a consumer leaves in flight while it releases the previous
/// stage: 1 keeps the tensor cores fed across k-blocks, 0 drains them every k-block.
const MMA_GROUPS_IN_FLIGHT: u32 = 1;
/// Number of `WGMMA_K` slices in a stage.
const K_SLICES: u32 = (BK / WGMMA_K) as u32;

const _: () = {
    assert!(ACC == 128 && K_SLICES == 4);
    assert!(B_NMAJOR_BOX_BYTES * 2 == B_HALF_BYTES);
    assert!(B_BOX_NMAJOR[0] * IN_BYTES as u32 == 128 && B_BOX_NMAJOR[1] == BK as u32);
};

/// Input element type: picks the wgmma instruction and widens C for `beta`.
trait Input {
    /// K elements of one k-block: one 128-byte row of a swizzled stage (`BK` for 16-bit
    /// inputs, `FP8_BK` for FP8). Every stage holds the same bytes whatever the type.
    const BK_ELEMS: u32;
    /// Per-tensor scales are read (the FP8 entries' `a_scale`, `b_scale`).
    const SCALED: bool = false;
    /// Block scales are applied between k-blocks (the block-scaled FP8 entry): the mainloop is
    /// [`mainloop_block_scaled`].
    const BLOCK_SCALED: bool = false;
    /// `wgmma.mma_async.m64n256k16.f32.<type>.<type>`.
    ///
    /// # Safety
    /// As [`wgmma::mma_async_m64n256k16_f32_bf16`].
    unsafe fn mma<const TRANS_B: u32>(
        d: &mut [f32; ACC],
        a: MatrixDescriptor,
        b: MatrixDescriptor,
        scale_d: u32,
    );
    /// The 16-bit value with these bits, as f32.
    fn widen(bits: u16) -> f32;
    /// Two f32 rounded to this type, packed low | high << 16.
    fn pack(lo: f32, hi: f32) -> u32;
}

struct Bf16;
struct F16;

impl Input for Bf16 {
    const BK_ELEMS: u32 = BK as u32;
    /// # Safety
    /// As the trait method.
    #[inline(always)]
    unsafe fn mma<const TRANS_B: u32>(
        d: &mut [f32; ACC],
        a: MatrixDescriptor,
        b: MatrixDescriptor,
        scale_d: u32,
    ) {
        // SAFETY: forwarded to the caller.
        unsafe { wgmma::mma_async_m64n256k16_f32_bf16::<TRANS_B>(d, a, b, scale_d) }
    }
    #[inline(always)]
    fn widen(bits: u16) -> f32 {
        bf16_to_f32(bits)
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        pack_bf16x2(lo, hi)
    }
}

impl Input for F16 {
    const BK_ELEMS: u32 = BK as u32;
    /// # Safety
    /// As the trait method.
    #[inline(always)]
    unsafe fn mma<const TRANS_B: u32>(
        d: &mut [f32; ACC],
        a: MatrixDescriptor,
        b: MatrixDescriptor,
        scale_d: u32,
    ) {
        // SAFETY: forwarded to the caller.
        unsafe { wgmma::mma_async_m64n256k16_f32_f16::<TRANS_B>(d, a, b, scale_d) }
    }
    #[inline(always)]
    fn widen(bits: u16) -> f32 {
        f16_to_f32(bits)
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        pack_f16x2(lo, hi)
    }
}

/// FP8 inputs, E4M3 A and E4M3 B (`wgmma ... k32.f32.e4m3.e4m3`); 16-bit output is BF16.
struct E4m3;
/// FP8 inputs, E4M3 A and E5M2 B (`wgmma ... k32.f32.e4m3.e5m2`); 16-bit output is BF16.
struct E4m3E5m2;

/// The FP8 `Input` items: K-major B only (FP8 wgmma has no transpose), BF16 for 16-bit C.
macro_rules! fp8_input {
    ($ty:ty, $mma:ident, per_tensor = $scaled:literal) => {
        impl Input for $ty {
            const BK_ELEMS: u32 = FP8_BK as u32;
            const SCALED: bool = $scaled;
            const BLOCK_SCALED: bool = !$scaled;
            /// # Safety
            /// As the trait method.
            #[inline(always)]
            unsafe fn mma<const TRANS_B: u32>(
                d: &mut [f32; ACC],
                a: MatrixDescriptor,
                b: MatrixDescriptor,
                scale_d: u32,
            ) {
                // FP8 wgmma reads K-major operands only: no entry pairs FP8 with `NMajor`.
                const { assert!(TRANS_B == 0) };
                // SAFETY: forwarded to the caller.
                unsafe { wgmma::$mma(d, a, b, scale_d) }
            }
            #[inline(always)]
            fn widen(bits: u16) -> f32 {
                bf16_to_f32(bits)
            }
            #[inline(always)]
            fn pack(lo: f32, hi: f32) -> u32 {
                pack_bf16x2(lo, hi)
            }
        }
    };
}

/// Block-scaled FP8 inputs, E4M3 A and B (`wgmma ... m64n128k32.f32.e4m3.e4m3` per tile half,
/// promoted in FP32 every k-block); 16-bit output is BF16.
struct E4m3Block;

fp8_input!(E4m3, mma_async_m64n256k32_f32_e4m3_e4m3, per_tensor = true);
fp8_input!(
    E4m3E5m2,
    mma_async_m64n256k32_f32_e4m3_e5m2,
    per_tensor = true
);
fp8_input!(
    E4m3Block,
    mma_async_m64n256k32_f32_e4m3_e4m3,
    per_tensor = false
);

/// B's layout: how the producer loads a stage of B and how wgmma reads it.
trait BLayout {
    /// One `wgmma.m64n256k16` with this layout's `imm-trans-b` (0: K-major B, 1: N-major B).
    ///
    /// # Safety
    /// As [`wgmma::mma_async_m64n256k16_f32_bf16`].
    unsafe fn mma<I: Input>(
        d: &mut [f32; ACC],
        a: MatrixDescriptor,
        b: MatrixDescriptor,
        scale_d: u32,
    );
    /// Descriptor of the stage's B tile starting at `b` (the first `WGMMA_K` slice).
    fn descriptor(b: u32) -> MatrixDescriptor;
    /// Bytes from one `WGMMA_K` slice of the B tile to the next.
    const SLICE_BYTES: u32;
    /// Loads half `half` (N columns `half*128..half*128+128` of the tile) of B for the k-block
    /// starting at element `k0` into the stage at `b`, multicast to the CTAs of `mask` (0: no
    /// multicast).
    ///
    /// # Safety
    /// As [`TensorMap::load_2d`] / [`TensorMap::load_2d_multicast`].
    unsafe fn load_half(
        map: TensorMap,
        b: u32,
        n0: u32,
        k0: u32,
        half: u32,
        full: mbarrier::Mbarrier,
        mask: u16,
    );
}

/// B column-major: N rows of K contiguous elements; tiles as N rows x 128 bytes.
struct KMajor;
/// B row-major: K rows of N contiguous elements; tiles as four 64-column boxes of `BK` rows.
struct NMajor;

/// Issues one 2-D TMA load, multicast when `mask != 0`.
///
/// # Safety
/// As [`TensorMap::load_2d`] (and [`TensorMap::load_2d_multicast`] when `mask != 0`).
#[inline(always)]
unsafe fn tma_load(
    map: TensorMap,
    dst: u32,
    c0: u32,
    c1: u32,
    full: mbarrier::Mbarrier,
    mask: u16,
) {
    // SAFETY: forwarded to the caller.
    unsafe {
        if mask == 0 {
            map.load_2d(dst, c0 as i32, c1 as i32, full)
        } else {
            map.load_2d_multicast(dst, c0 as i32, c1 as i32, full, mask)
        }
    }
}

impl BLayout for KMajor {
    /// # Safety
    /// As the trait method.
    #[inline(always)]
    unsafe fn mma<I: Input>(
        d: &mut [f32; ACC],
        a: MatrixDescriptor,
        b: MatrixDescriptor,
        scale_d: u32,
    ) {
        // SAFETY: forwarded to the caller.
        unsafe { I::mma::<0>(d, a, b, scale_d) }
    }
    const SLICE_BYTES: u32 = (WGMMA_K * IN_BYTES) as u32;
    #[inline(always)]
    fn descriptor(b: u32) -> MatrixDescriptor {
        MatrixDescriptor::new(b, 16, ATOM_BYTES, Swizzle::B128)
    }
    /// # Safety
    /// As the trait method.
    #[inline(always)]
    unsafe fn load_half(
        map: TensorMap,
        b: u32,
        n0: u32,
        k0: u32,
        half: u32,
        full: mbarrier::Mbarrier,
        mask: u16,
    ) {
        let n = n0 + half * B_BOX_KMAJOR[1];
        // SAFETY: forwarded to the caller; the half lies inside the stage's B tile.
        unsafe { tma_load(map, b + half * B_HALF_BYTES, k0, n, full, mask) }
    }
}

impl BLayout for NMajor {
    /// # Safety
    /// As the trait method.
    #[inline(always)]
    unsafe fn mma<I: Input>(
        d: &mut [f32; ACC],
        a: MatrixDescriptor,
        b: MatrixDescriptor,
        scale_d: u32,
    ) {
        // SAFETY: forwarded to the caller.
        unsafe { I::mma::<1>(d, a, b, scale_d) }
    }
    const SLICE_BYTES: u32 = (WGMMA_K * 128) as u32;
    #[inline(always)]
    fn descriptor(b: u32) -> MatrixDescriptor {
        // Leading byte offset: from one 64-column box to the next.
        MatrixDescriptor::new(b, B_NMAJOR_BOX_BYTES, ATOM_BYTES, Swizzle::B128)
    }
    /// # Safety
    /// As the trait method.
    #[inline(always)]
    unsafe fn load_half(
        map: TensorMap,
        b: u32,
        n0: u32,
        k0: u32,
        half: u32,
        full: mbarrier::Mbarrier,
        mask: u16,
    ) {
        let mut j = 0;
        while j < 2 {
            let box_ = half * 2 + j;
            // SAFETY: forwarded to the caller; the box lies inside the stage's B tile.
            unsafe {
                tma_load(
                    map,
                    b + box_ * B_NMAJOR_BOX_BYTES,
                    n0 + box_ * B_BOX_NMAJOR[0],
                    k0,
                    full,
                    mask,
                )
            };
            j += 1;
        }
    }
}

/// The persistent tile scheduler. Work units are cluster tiles: `cluster` M tiles (adjacent, one
/// per CTA) by one N tile. Cluster `c` of `clusters` takes units `c, c + clusters, ...`, so both
/// CTAs of a cluster walk the same units. Units map to tiles in groups (bands) of `group` unit
/// rows (RASTER_ALONG_M: consecutive units go down M within the band, then along N) or unit
/// columns (RASTER_ALONG_N), so the tiles in flight at once share A rows and B columns in L2.
#[derive(Clone, Copy)]
struct Scheduler {
    m_units: u32,
    n_tiles: u32,
    units: u32,
    first: u32,
    stride: u32,
    along_n: bool,
    group: u32,
}

impl Scheduler {
    /// `(m unit, n tile)` of unit `u`.
    #[inline(always)]
    fn unit(self, u: u32) -> (u32, u32) {
        let (major, minor) = if self.along_n {
            (self.m_units, self.n_tiles)
        } else {
            (self.n_tiles, self.m_units)
        };
        // Bands of `group` along the minor dimension; in a band, consecutive units walk the minor
        // dimension first.
        let band_units = (self.group * major).max(1);
        let band = u / band_units;
        let first = band * self.group;
        let width = (if minor - first < self.group {
            minor - first
        } else {
            self.group
        })
        .max(1);
        let local = u - band * band_units;
        let mi = first + local % width;
        let ma = local / width;
        if self.along_n {
            (ma, mi)
        } else {
            (mi, ma)
        }
    }
}

/// Everything the roles share.
#[derive(Clone, Copy)]
struct Gemm {
    map_a: TensorMap,
    map_b: TensorMap,
    map_c: TensorMap,
    c: u64,
    m: u32,
    n: u32,
    ldc: u32,
    alpha: f32,
    beta: f32,
    /// K elements per k-block (`Input::BK_ELEMS`).
    bk: u32,
    k_blocks: u32,
    /// FP8 entries: device addresses of the per-tensor scales of A and B (0: 1.0); the
    /// block-scaled entry: of the A and B scale arrays.
    scales: [u64; 2],
    /// Block-scaled entry: `a_scales_ld`, `b_scales_ld` (elements; 0 elsewhere).
    scales_ld: [u32; 2],
    sched: Scheduler,
    /// 1024-byte aligned shared-window base of the layout.
    smem: u32,
    ring: Ring,
    rank: u32,
    cluster: u32,
    /// Ping-pong consumers: each warpgroup computes whole `WG_M x BN` tiles, the two taking
    /// alternate tiles (so one's epilogue overlaps the other's mainloop); otherwise cooperative:
    /// both split each `BM x BN` tile's rows.
    pingpong: bool,
}

impl Gemm {
    #[inline(always)]
    fn a_stage(self, stage: u32) -> u32 {
        self.smem + (A_OFFSET + stage as usize * A_STAGE_BYTES) as u32
    }
    #[inline(always)]
    fn b_stage(self, stage: u32) -> u32 {
        self.smem + (B_OFFSET + stage as usize * B_STAGE_BYTES) as u32
    }
    #[inline(always)]
    fn c_chunk(self, consumer: u32, buf: u32) -> u32 {
        self.smem
            + (C_OFFSET + (consumer as usize * C_CHUNKS + buf as usize) * C_CHUNK_BYTES) as u32
    }
    /// Ping-pong: the barrier that consumer warpgroup `c`'s mainloop waits on, completed (one
    /// arrival) when the other warpgroup's mainloop of the previous tile is done.
    #[inline(always)]
    fn order(self, c: u32) -> mbarrier::Mbarrier {
        // SAFETY: inside the launch's shared memory at the contract's offset, initialised by
        // thread 0 (count 1) and published before use; one arrival per phase (the other
        // warpgroup's thread 0 after each of its mainloops), waits alternate with arrivals.
        unsafe {
            mbarrier::Mbarrier::at(
                self.smem
                    + (ORDER_BARRIERS_OFFSET + c as usize * crate::contract::MBARRIER_BYTES) as u32,
            )
        }
    }
    /// Rows of a CTA tile.
    #[inline(always)]
    fn tile_m(self) -> u32 {
        if self.pingpong {
            WG_M as u32
        } else {
            BM as u32
        }
    }
    /// Consumer releases per stage and CTA: every consumer warpgroup reads every stage when
    /// cooperative, one reads each stage in ping-pong.
    #[inline(always)]
    fn readers_per_stage(self) -> u32 {
        if self.pingpong {
            1
        } else {
            CONSUMER_WARPGROUPS
        }
    }
    /// First row and column of this CTA's tile of unit `u`.
    #[inline(always)]
    fn tile_origin(self, u: u32) -> (u32, u32) {
        let (mu, nt) = self.sched.unit(u);
        (
            (mu * self.cluster + self.rank) * self.tile_m(),
            nt * BN as u32,
        )
    }
}

/// Producer role (one thread of warpgroup 0): walks the tiles and k-blocks, TMA-loading A (this
/// CTA's rows) and B (both halves alone, or its half multicast to the pair) into the ring.
#[inline(always)]
fn producer<L: BLayout>(g: Gemm) {
    g.map_a.acquire();
    g.map_b.acquire();
    // A and B may be written by the previous kernel on the stream (PDL).
    pdl::wait();
    let mut state = State::new();
    let mut u = g.sched.first;
    while u < g.sched.units {
        let (m0, n0) = g.tile_origin(u);
        let mut kb = 0;
        while kb < g.k_blocks {
            let tx = if g.pingpong {
                STAGE_TX_BYTES_PINGPONG
            } else {
                STAGE_TX_BYTES
            };
            let full = g.ring.producer_acquire(state, tx);
            let (a, b) = (g.a_stage(state.stage()), g.b_stage(state.stage()));
            let k0 = kb * g.bk;
            // SAFETY: the stage is free in every CTA of the cluster (producer_acquire), 1024-byte
            // aligned, and its full barrier is armed for A plus the whole B tile, which the loads
            // below (and, in a pair, the peer's multicast half) deliver.
            unsafe {
                g.map_a.load_2d(a, k0 as i32, m0 as i32, full);
                if g.cluster == 1 {
                    L::load_half(g.map_b, b, n0, k0, 0, full, 0);
                    L::load_half(g.map_b, b, n0, k0, 1, full, 0);
                } else {
                    L::load_half(g.map_b, b, n0, k0, g.rank, full, 0b11);
                }
            }
            state.advance();
            kb += 1;
        }
        u += g.sched.stride;
    }
    // Every load is issued: the next kernel's prologue may start (its `griddepcontrol.wait`
    // still waits for this grid to finish).
    pdl::launch_dependents();
    g.ring.producer_tail(state);
}

/// Consumer role (warpgroup `1 + consumer`): rows `64 * consumer ..` of every tile.
#[inline(always)]
fn consumer<I: Input, L: BLayout, const OUT_F32: bool>(g: Gemm, consumer: u32) {
    // C may be read (beta) and is written: after the previous kernel completes (PDL).
    pdl::wait();
    // The per-tensor scales may be written by the previous kernel too: read after the wait.
    let g = if I::SCALED {
        Gemm {
            alpha: g.alpha * read_scale(g.scales[0]) * read_scale(g.scales[1]),
            ..g
        }
    } else {
        g
    };
    let tid = thread_in_warpgroup();
    // SAFETY: barrier 1 + consumer is used only by this warpgroup's 128 threads, convergently.
    let bar = unsafe { NamedBarrier::new(1 + consumer, WARPGROUP_THREADS) };
    // From a constant (not a repeat expression, which rustc lowers to a store loop that keeps the
    // array out of registers); the first wgmma of each tile overwrites it (scale_d = 0) anyway.
    const ZERO: [f32; ACC] = [0.0; ACC];
    let mut acc = ZERO;
    let mut state = State::new();
    let mut chunk = 0u32;
    // Not the value computed before the role split (its live range would span both roles).
    let mut u = fresh::<I>(g.sched.first);
    let mut turn = 0u32; // this CTA's unit count so far (ping-pong: whose turn)
    let mut order_waits = 0u32; // ping-pong: waits on this warpgroup's order barrier so far
    while u < g.sched.units {
        let (m0, n0) = g.tile_origin(u);
        if g.pingpong && turn % CONSUMER_WARPGROUPS != consumer {
            // The other warpgroup's tile: skip its stages.
            let mut kb = 0;
            while kb < g.k_blocks {
                state.advance();
                kb += 1;
            }
        } else {
            let row0 = if g.pingpong {
                m0
            } else {
                m0 + consumer * WG_M as u32
            };
            if g.pingpong && turn > 0 {
                // The other warpgroup's mainloop of the previous tile is over: this warpgroup's
                // stages are now at most one phase ahead of its waits (mbarrier parity cannot
                // tell further phases apart), and the two mainloops alternate.
                g.order(consumer).wait_parity(order_waits & 1);
                order_waits += 1;
            }
            if I::BLOCK_SCALED {
                mainloop_block_scaled(g, consumer, &mut acc, &mut state, row0, n0);
            } else {
                mainloop::<I, L>(g, consumer, &mut acc, &mut state);
            }
            if g.pingpong && tid == 0 {
                g.order(1 - consumer).arrive();
            }
            epilogue::<I, OUT_F32>(g, consumer, &acc, row0, n0, &mut chunk, bar);
        }
        turn += 1;
        u += g.sched.stride;
    }
    if tid == 0 {
        // The last TMA stores have read their shared chunks before the CTA may exit.
        bulk::wait_group::<0>();
    }
}

/// The f32 at device address `at`, or 1.0 when `at` is 0 (no scale).
#[inline(always)]
fn read_scale(at: u64) -> f32 {
    if at == 0 {
        1.0
    } else {
        // SAFETY: the launch contract: a nonzero scale address is a 4-byte aligned f32 in device
        // memory, valid and unwritten until the kernel completes (read after griddepcontrol.wait).
        unsafe { (at as *const f32).read() }
    }
}

/// The mainloop of one tile: per k-block, wait for the stage, issue four `m64n256k16` wgmmas as
/// one wgmma-group, then wait until at most [`MMA_GROUPS_IN_FLIGHT`] groups are pending and
/// release the stage the completed group read, on every CTA that wrote into it. With one group in
/// flight, the tensor cores already have the next k-block's MMAs while this warpgroup waits for
/// and releases the previous stage.
#[inline(always)]
fn mainloop<I: Input, L: BLayout>(g: Gemm, consumer: u32, acc: &mut [f32; ACC], state: &mut State) {
    let release = |stage: State| release_stage(g, stage);
    let mut reading = *state; // the stage of the wgmma-group still in flight
    let mut kb = 0;
    while kb < g.k_blocks {
        g.ring.consumer_wait(*state);
        let a = a_descriptor(g, consumer, *state);
        let b = L::descriptor(g.b_stage(state.stage()));
        wgmma::fence_operands(acc);
        // SAFETY: all 128 threads of the warpgroup run this loop with the same trip count and
        // descriptors; the stage holds A and B as the descriptors say (TMA completion observed by
        // consumer_wait) and is released only after a wait_group that covers these wgmmas.
        unsafe {
            wgmma::fence();
            let mut s = 0;
            while s < K_SLICES {
                let scale_d = (kb != 0 || s != 0) as u32;
                L::mma::<I>(acc, a.offset(s * 32), b.offset(s * L::SLICE_BYTES), scale_d);
                s += 1;
            }
            wgmma::commit_group();
            wgmma::wait_group::<MMA_GROUPS_IN_FLIGHT>();
        }
        if MMA_GROUPS_IN_FLIGHT == 0 {
            release(*state);
        } else if kb > 0 {
            release(reading);
        }
        reading = *state;
        state.advance();
        kb += 1;
    }
    if MMA_GROUPS_IN_FLIGHT > 0 {
        // SAFETY: warpgroup-collective, as above.
        unsafe { wgmma::wait_group::<0>() };
        release(reading);
    }
    wgmma::fence_operands(acc);
}

/// Releases `stage` (its wgmmas complete) on every CTA of the cluster that wrote into it.
#[inline(always)]
fn release_stage(g: Gemm, stage: State) {
    let tid = thread_in_warpgroup();
    if tid < g.cluster {
        // SAFETY: thread `r < cluster` of each reading warpgroup releases the stage once on
        // CTA `r`, matching the init count readers_per_stage * cluster; every CTA's producer runs
        // producer_tail before the final cluster barrier, so the target is live; the callers
        // release a stage once per k-block, after a wait_group that covers the wgmmas reading it.
        unsafe { g.ring.consumer_release(stage, tid) };
    }
}

/// Descriptor of consumer `consumer`'s A rows (the whole A tile in ping-pong) in `stage`.
#[inline(always)]
fn a_descriptor(g: Gemm, consumer: u32, stage: State) -> MatrixDescriptor {
    MatrixDescriptor::new(
        g.a_stage(stage.stage())
            + if g.pingpong {
                0
            } else {
                consumer * (WG_M * BK * IN_BYTES) as u32
            },
        16,
        ATOM_BYTES,
        Swizzle::B128,
    )
}

/// FP32 accumulators per consumer thread of one 64 x 128 half of a warpgroup tile (the
/// block-scaled mainloop's temporary).
const HALF_ACC: usize = ACC / 2;
/// Bytes of one `FP8_WGMMA_K` slice of a 128-byte K-major row.
const FP8_SLICE_BYTES: u32 = (FP8_WGMMA_K * FP8_IN_BYTES) as u32;

const _: () = assert!(SCALE_BLOCK == FP8_BK && BN == 2 * SCALE_BLOCK && B_HALF_BYTES == 128 * 128);

/// The block-scaled mainloop of one warpgroup tile (rows `row0..row0 + 64`, columns
/// `n0..n0 + 256`), DeepSeek-V3's fine-grained FP8 scaling with promotion (arXiv 2412.19437,
/// §3.3.2; DeepGEMM): the FP8 tensor cores' accumulation keeps only about 14 bits, so no sum
/// runs longer than one 128-deep k-block in them. Per k-block (one stage), for each 128-column
/// half `h` of the tile: four `wgmma m64n128k32` into the temporary `tmp` (the first
/// overwriting it), `wait_group 0`, then in FP32 registers
/// `acc[h] += tmp * (a_scale[row, kb] * b_scale[n0 / 128 + h, kb])`; the stage is released
/// once both halves' wgmmas are complete. The temporary holds one half so that `acc` (128) and
/// `tmp` (64) fit the consumer's registers. The scales of the next k-block are loaded from
/// global memory (L2) while this one's wgmmas run. The other consumer
/// warpgroup's wgmmas keep the tensor cores busy while this one promotes.
#[inline(always)]
fn mainloop_block_scaled(
    g: Gemm,
    consumer: u32,
    acc: &mut [f32; ACC],
    state: &mut State,
    row0: u32,
    n0: u32,
) {
    let rows = row0 + ChunkLanes::new(thread_in_warpgroup()).row; // this thread's rows: `rows` and `rows + 8`
    let nb0 = n0 / SCALE_BLOCK as u32;
    let n_blocks = g.n.div_ceil(SCALE_BLOCK as u32);
    // [a(row), a(row + 8), b(half 0), b(half 1)] of k-block `kb`. Rows at or past M and N
    // blocks past the last read the last row's or block's scale instead: their outputs are
    // never stored, and a clamped index needs no predicate registers across the mainloop.
    let a_rows = [rows.min(g.m - 1) as usize, (rows + 8).min(g.m - 1) as usize];
    let b_blocks = [nb0 as usize, (nb0 + 1).min(n_blocks - 1) as usize];
    let scales = |kb: u32| -> [f32; 4] {
        let a = |row: usize| {
            let i = kb as usize * g.scales_ld[0] as usize + row;
            // SAFETY: the launch contract: `a_scales` holds `[ceil(K / 128)][a_scales_ld]` f32
            // (row < M <= a_scales_ld, kb < ceil(K / 128)), unwritten until the kernel
            // completes and read after griddepcontrol.wait.
            unsafe { (g.scales[0] as *const f32).add(i).read() }
        };
        let b = |nb: usize| {
            let i = nb * g.scales_ld[1] as usize + kb as usize;
            // SAFETY: as above for `b_scales`, `[ceil(N / 128)][b_scales_ld]` (nb <
            // ceil(N / 128): n0 < N; kb < ceil(K / 128) <= b_scales_ld).
            unsafe { (g.scales[1] as *const f32).add(i).read() }
        };
        [a(a_rows[0]), a(a_rows[1]), b(b_blocks[0]), b(b_blocks[1])]
    };
    const ZERO: [f32; ACC] = [0.0; ACC];
    const ZERO_HALF: [f32; HALF_ACC] = [0.0; HALF_ACC];
    *acc = ZERO;
    let mut tmp = ZERO_HALF;
    let mut next = scales(0);
    let mut kb = 0;
    while kb < g.k_blocks {
        let s = next;
        if kb + 1 < g.k_blocks {
            next = scales(kb + 1);
        }
        g.ring.consumer_wait(*state);
        let a = a_descriptor(g, consumer, *state);
        let b = KMajor::descriptor(g.b_stage(state.stage()));
        // SAFETY: all 128 threads of the warpgroup run this loop with the same trip count and
        // descriptors; the stage holds A and both B halves (TMA completion observed by
        // consumer_wait) and is released only after both halves' wait_group 0.
        unsafe {
            block_half::<0>(acc, &mut tmp, a, b, s[0] * s[2], s[1] * s[2]);
            block_half::<1>(
                acc,
                &mut tmp,
                a,
                b.offset(B_HALF_BYTES),
                s[0] * s[3],
                s[1] * s[3],
            );
        }
        release_stage(g, *state);
        state.advance();
        kb += 1;
    }
}

/// One half `H` (columns `128 H ..`) of a block-scaled k-block: `tmp = A * B_H` with four
/// `wgmma m64n128k32.e4m3`, waited for, then `acc[64 H + i] = fma(tmp[i], scale, acc[..])` in
/// FP32, with
/// `top` for this thread's row `r` (accumulator elements `4 i`, `4 i + 1`) and `bottom` for row
/// `r + 8` (`4 i + 2`, `4 i + 3`; wgmma.rs's accumulator layout).
///
/// # Safety
/// Warpgroup-collective; `a` and `b` describe a stage this warpgroup waited for and has not
/// released (as [`wgmma::mma_async_m64n128k32_f32_e4m3_e4m3`]).
#[inline(always)]
unsafe fn block_half<const H: usize>(
    acc: &mut [f32; ACC],
    tmp: &mut [f32; HALF_ACC],
    a: MatrixDescriptor,
    b: MatrixDescriptor,
    top: f32,
    bottom: f32,
) {
    wgmma::fence_operands(tmp);
    // SAFETY: forwarded to the caller; the fence orders the promotion's reads of `tmp` before
    // the wgmmas overwrite it, and wait_group 0 completes them before `tmp` is read.
    unsafe {
        wgmma::fence();
        let mut s = 0;
        while s < K_SLICES {
            wgmma::mma_async_m64n128k32_f32_e4m3_e4m3(
                tmp,
                a.offset(s * FP8_SLICE_BYTES),
                b.offset(s * FP8_SLICE_BYTES),
                (s != 0) as u32,
            );
            s += 1;
        }
        wgmma::commit_group();
        wgmma::wait_group::<0>();
    }
    wgmma::fence_operands(tmp);
    // Literal indices only, so both arrays stay in registers; one fma.rn each (rustc does not
    // contract `a * b + c`).
    macro_rules! promote {
        ($($i:literal)*) => {$(
            let j = H * HALF_ACC + 4 * $i;
            acc[j] = fma(tmp[4 * $i], top, acc[j]);
            acc[j + 1] = fma(tmp[4 * $i + 1], top, acc[j + 1]);
            acc[j + 2] = fma(tmp[4 * $i + 2], bottom, acc[j + 2]);
            acc[j + 3] = fma(tmp[4 * $i + 3], bottom, acc[j + 3]);
        )*};
    }
    promote!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    // The sums are computed here, before the next wgmma overwrites `tmp`: without this pin the
    // compiler may delay them and keep the old `tmp` alive across it (ptxas then spills).
    wgmma::fence_operands(acc);
}

/// Byte address of (row, byte column) in a 128-byte-swizzled chunk of 128-byte rows.
#[inline(always)]
fn swizzled(chunk: u32, row: u32, byte: u32) -> u32 {
    chunk + row * 128 + ((((byte >> 4) ^ (row & 7)) << 4) | (byte & 15))
}

/// Epilogue of one warpgroup tile (rows `row0..row0 + 64`, columns `n0..n0 + 256`): `alpha * acc + beta * C` into swizzled shared chunks of 128-byte rows,
/// each TMA-stored as soon as it is complete (double-buffered: a chunk's buffer is reused once
/// the store two chunks back has read it). The stores run while the next tile's mainloop does.
#[inline(always)]
fn epilogue<I: Input, const OUT_F32: bool>(
    g: Gemm,
    consumer: u32,
    acc: &[f32; ACC],
    row0: u32,
    n0: u32,
    chunk: &mut u32,
    bar: NamedBarrier,
) {
    if g.beta == 0.0 && row0 + WG_M as u32 <= g.m && n0 + BN as u32 <= g.n {
        // The common case, kept apart from the general path so the code every tile runs is
        // short: ncu showed the fully unrolled general path stalling on instruction fetch
        // ("no instruction") once per tile.
        let lanes = ChunkLanes::new(epilogue_tid::<I>());
        macro_rules! chunks_interior {
            ($($ch:literal)*) => {
                $(epilogue_chunk_interior::<I, OUT_F32, $ch>(g, consumer, acc, row0, n0, chunk, bar, lanes);)*
            };
        }
        chunks_interior!(0 1 2 3 4 5 6 7);
        return;
    }
    macro_rules! chunks {
        ($($ch:literal)*) => {
            $(epilogue_chunk::<I, OUT_F32, $ch>(g, consumer, acc, row0, n0, chunk, bar);)*
        };
    }
    chunks!(0 1 2 3 4 5 6 7);
}

/// The thread's index in its warpgroup, for the epilogue's addresses, through [`fresh`]: so the
/// block-scaled consumer computes the addresses in the tile loop instead of the compiler
/// hoisting them out of it (that consumer has no registers to keep them live across its
/// mainloop: 128 accumulators + the 64 of the k-block's temporary; hoisted, ptxas spilled them).
#[inline(always)]
fn epilogue_tid<I: Input>() -> u32 {
    fresh::<I>(thread_in_warpgroup())
}

/// `v` itself; for the block-scaled input, through an opaque (volatile) register move, which
/// the compiler cannot hoist or merge with an earlier computation of `v`: a new value whose
/// live range starts here (register pressure of the block-scaled consumer).
#[inline(always)]
fn fresh<I: Input>(v: u32) -> u32 {
    let mut v = v;
    if I::BLOCK_SCALED {
        // SAFETY: a register move: no memory, no side effects (volatile only to stay in place).
        unsafe {
            core::arch::asm!(
                "mov.b32 {0}, {0};",
                inout(reg32) v,
                options(nomem, nostack, preserves_flags)
            )
        };
    }
    v
}

/// This thread's place in a 128-byte-swizzled C chunk, for [`epilogue_chunk_interior`]: its row
/// `r` (and `r + 8`) of the warpgroup's 64. The thread holds columns `8 i + 2 (lane % 4) ..+ 2`
/// of each n8 block `i` (wgmma's accumulator layout).
#[derive(Clone, Copy)]
struct ChunkLanes {
    /// Row `r` of the warpgroup's 64.
    row: u32,
    /// `lane % 4`.
    quad: u32,
}

impl ChunkLanes {
    /// From `tid`, the thread's index in its warpgroup.
    #[inline(always)]
    fn new(tid: u32) -> Self {
        let (warp, lane) = (tid / 32, tid % 32);
        Self {
            row: warp * 16 + lane / 4,
            quad: lane % 4,
        }
    }

    /// Byte address in `buf` of this thread's pair in n8 block `i` of the chunk, row `r` (row
    /// `r + 8` is 1024 bytes further, with the same swizzle phase).
    #[inline(always)]
    fn pair(self, buf: u32, i: u32, out_bytes: u32) -> u32 {
        swizzled(buf, self.row, (8 * i + 2 * self.quad) * out_bytes)
    }
}

/// Chunk `CH` of the epilogue of a warpgroup tile that lies wholly inside C, with `beta == 0`:
/// `alpha * acc` into the swizzled chunk buffer, then one TMA store. As [`epilogue_chunk`] minus
/// C reads, bounds checks and the direct-store case, none of which such a tile needs.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn epilogue_chunk_interior<I: Input, const OUT_F32: bool, const CH: usize>(
    g: Gemm,
    consumer: u32,
    acc: &[f32; ACC],
    row0: u32,
    n0: u32,
    chunk: &mut u32,
    bar: NamedBarrier,
    lanes: ChunkLanes,
) {
    let out_bytes: usize = if OUT_F32 { 4 } else { 2 };
    let cols = C_CHUNK_ROW_BYTES / out_bytes;
    if CH >= BN / cols {
        return;
    }
    let buf = chunk_acquire(g, consumer, *chunk, bar);
    // Literal indices only, so the accumulators stay in registers.
    macro_rules! n8_blocks {
        ($($i:literal)*) => {$(
            if $i < cols / 8 {
                let nb = CH * (cols / 8) + $i; // n8 block of the warpgroup tile
                let at = lanes.pair(buf, $i, out_bytes as u32);
                let (top, bottom) = (
                    [g.alpha * acc[4 * nb], g.alpha * acc[4 * nb + 1]],
                    [g.alpha * acc[4 * nb + 2], g.alpha * acc[4 * nb + 3]],
                );
                // SAFETY: `at` and `at + 1024` lie in this warpgroup's chunk buffer (rows r and
                // r + 8 < 64, byte column < 128, aligned for the store), which no TMA store reads
                // any more (wait_group_read + barrier above).
                unsafe {
                    if OUT_F32 {
                        Shared::<f32>::at(at).store_v2(top);
                        Shared::<f32>::at(at + 1024).store_v2(bottom);
                    } else {
                        Shared::<u32>::at(at).store(I::pack(top[0], top[1]));
                        Shared::<u32>::at(at + 1024).store(I::pack(bottom[0], bottom[1]));
                    }
                }
            }
        )*};
    }
    n8_blocks!(0 1 2 3 4 5 6 7);
    chunk_store(g, buf, n0 + (CH * cols) as u32, row0, chunk, bar);
}

/// Chunk `CH` of the epilogue (f32 output: 32 columns, 8 chunks; 16-bit: 64 columns, 4 chunks).
#[inline(always)]
fn epilogue_chunk<I: Input, const OUT_F32: bool, const CH: usize>(
    g: Gemm,
    consumer: u32,
    acc: &[f32; ACC],
    row0: u32,
    n0: u32,
    chunk: &mut u32,
    bar: NamedBarrier,
) {
    let out_bytes: usize = if OUT_F32 { 4 } else { 2 };
    let cols = C_CHUNK_ROW_BYTES / out_bytes;
    if CH >= BN / cols {
        return;
    }
    let first_col = n0 + (CH * cols) as u32;
    if first_col >= g.n || row0 >= g.m {
        return; // the chunk lies wholly outside C
    }
    let tid = epilogue_tid::<I>();
    let (warp, lane) = (tid / 32, tid % 32);
    let r = warp * 16 + lane / 4; // row in the warpgroup's 64 (and r + 8)
    let col = 2 * (lane % 4); // column in the n8 block
                              // A TMA store writes whole 16-byte pieces of a row: where C's last column ends inside one,
                              // the store would also write the row's padding after column N. Such a chunk is stored with
                              // bounds-checked st.global from registers instead.
    let direct = first_col + cols as u32 > g.n && !(g.n * out_bytes as u32).is_multiple_of(16);
    if direct {
        macro_rules! n8_blocks_direct {
            ($($i:literal)*) => {$(
                if $i < cols / 8 {
                    let nb = CH * (cols / 8) + $i;
                    let c = (nb * 8) as u32 + col;
                    store_pair_global::<I, OUT_F32>(g, row0, n0, r, c, [acc[4 * nb], acc[4 * nb + 1]]);
                    store_pair_global::<I, OUT_F32>(g, row0, n0, r + 8, c, [acc[4 * nb + 2], acc[4 * nb + 3]]);
                }
            )*};
        }
        n8_blocks_direct!(0 1 2 3 4 5 6 7);
        return;
    }
    let buf = chunk_acquire(g, consumer, *chunk, bar);
    // Literal indices only, so the accumulators stay in registers.
    macro_rules! n8_blocks {
        ($($i:literal)*) => {$(
            if $i < cols / 8 {
                let nb = CH * (cols / 8) + $i; // n8 block of the tile
                let c = (nb * 8) as u32 + col; // column in the tile
                let byte = (c - (CH * cols) as u32) * out_bytes as u32;
                store_pair::<I, OUT_F32>(g, buf, row0, n0, r, c, byte, [acc[4 * nb], acc[4 * nb + 1]]);
                store_pair::<I, OUT_F32>(g, buf, row0, n0, r + 8, c, byte, [acc[4 * nb + 2], acc[4 * nb + 3]]);
            }
        )*};
    }
    n8_blocks!(0 1 2 3 4 5 6 7);
    chunk_store(g, buf, n0 + (CH * cols) as u32, row0, chunk, bar);
}

/// The shared buffer of epilogue chunk number `chunk` of warpgroup `consumer`, once the TMA store
/// that last used it (two chunks ago) has read it; the whole warpgroup returns together.
#[inline(always)]
fn chunk_acquire(g: Gemm, consumer: u32, chunk: u32, bar: NamedBarrier) -> u32 {
    let buf = g.c_chunk(consumer, chunk & (C_CHUNKS as u32 - 1));
    if thread_in_warpgroup() == 0 {
        bulk::wait_group_read::<{ C_CHUNKS as u32 - 1 }>();
    }
    bar.sync();
    buf
}

/// Publishes the chunk the warpgroup wrote into `buf`: fences its generic-proxy writes for the
/// async proxy, waits for the whole warpgroup, and has one thread TMA-store it at (`col0`,
/// `row0`) of C in a new bulk group; counts the chunk.
#[inline(always)]
fn chunk_store(g: Gemm, buf: u32, col0: u32, row0: u32, chunk: &mut u32, bar: NamedBarrier) {
    bulk::fence_proxy_async_shared();
    bar.sync();
    if thread_in_warpgroup() == 0 {
        // SAFETY: the chunk is complete (bar), fenced, 1024-byte aligned and in C's box layout;
        // the callers store only chunks whose TMA store writes elements of C alone (a chunk
        // whose 16-byte pieces would reach C's row padding goes out with st.global instead);
        // only this warpgroup writes these rows of C.
        unsafe { g.map_c.store_2d(buf, col0 as i32, row0 as i32) };
        bulk::commit_group();
    }
    *chunk += 1;
}

/// `alpha * v + beta * C[row0 + r][n0 + c ..= n0 + c + 1]` straight into C (elements inside C
/// only), for the chunk that a TMA store cannot write without touching C's row padding.
#[inline(always)]
fn store_pair_global<I: Input, const OUT_F32: bool>(
    g: Gemm,
    row0: u32,
    n0: u32,
    r: u32,
    c: u32,
    acc: [f32; 2],
) {
    let v = scaled::<I, OUT_F32>(g, row0, n0, r, c, acc);
    let (gr, gc) = (row0 + r, n0 + c);
    if gr >= g.m {
        return;
    }
    let packed = I::pack(v[0], v[1]);
    let mut j = 0;
    while j < 2 {
        if gc + j < g.n {
            let idx = (gr as u64 * g.ldc as u64 + (gc + j) as u64) as usize;
            // SAFETY: (gr, gc + j) is inside C (checked against m, n; pitch ldc >= n validated by
            // the launcher); this warpgroup alone writes these rows of this tile.
            unsafe {
                if OUT_F32 {
                    (g.c as *mut f32).add(idx).write(v[j as usize]);
                } else {
                    (g.c as *mut u16)
                        .add(idx)
                        .write((packed >> (16 * j)) as u16);
                }
            }
        }
        j += 1;
    }
}

/// `alpha * acc + beta * C[row0 + r][n0 + c ..= n0 + c + 1]` (C read only where `beta != 0`
/// and the element lies inside C).
#[inline(always)]
fn scaled<I: Input, const OUT_F32: bool>(
    g: Gemm,
    row0: u32,
    n0: u32,
    r: u32,
    c: u32,
    acc: [f32; 2],
) -> [f32; 2] {
    let mut v = [g.alpha * acc[0], g.alpha * acc[1]];
    if g.beta != 0.0 {
        let (gr, gc) = (row0 + r, n0 + c);
        let old = |j: u32| -> f32 {
            let idx = gr as u64 * g.ldc as u64 + (gc + j) as u64;
            // SAFETY: callers check (gr, gc + j) is inside C (m, n), whose pitch ldc >= n the
            // launcher validated; nobody else writes this element of C now (this CTA owns the
            // tile).
            unsafe {
                if OUT_F32 {
                    (g.c as *const f32).add(idx as usize).read()
                } else {
                    I::widen((g.c as *const u16).add(idx as usize).read())
                }
            }
        };
        if gr < g.m && gc < g.n {
            v[0] += g.beta * old(0);
        }
        if gr < g.m && gc + 1 < g.n {
            v[1] += g.beta * old(1);
        }
    }
    v
}

/// `alpha * v + beta * C[row0 + r][n0 + c ..= n0 + c + 1]` into the swizzled chunk `buf` at row
/// `r`, byte column `byte`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn store_pair<I: Input, const OUT_F32: bool>(
    g: Gemm,
    buf: u32,
    row0: u32,
    n0: u32,
    r: u32,
    c: u32,
    byte: u32,
    acc: [f32; 2],
) {
    let v = scaled::<I, OUT_F32>(g, row0, n0, r, c, acc);
    // SAFETY: the address lies in this warpgroup's chunk buffer (r < 64, byte < 128, aligned for
    // the store), which no TMA store reads any more (wait_group_read + barrier in the caller).
    unsafe {
        if OUT_F32 {
            Shared::<f32>::at(swizzled(buf, r, byte)).store_v2(v);
        } else {
            Shared::<u32>::at(swizzled(buf, r, byte)).store(I::pack(v[0], v[1]));
        }
    }
}

/// The kernel body shared by every entry.
///
/// # Safety
/// The launch contract of the entries.
#[inline(always)]
unsafe fn tc_gemm<I: Input, L: BLayout, const PINGPONG: bool>(p: Params) {
    let cluster = cluster::cluster_size();
    if block_dim_x() != THREADS_PER_CTA || !(cluster == 1 || cluster == 2) || p.group == 0 {
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    let smem = (dynamic_smem_base() + SWIZZLE_ALIGN as u32 - 1) & !(SWIZZLE_ALIGN as u32 - 1);
    // SAFETY: the barriers lie inside the launch's SMEM_BYTES of dynamic shared memory, used for
    // nothing else; init below is published by fence_init + the cluster barrier before any use,
    // and the roles keep to the counts (1 producer arrival + the stage's bytes; readers per stage
    // x cluster releases).
    let ring = unsafe { Ring::at(smem + BARRIERS_OFFSET as u32) };
    let m_tiles = p.m.div_ceil(if PINGPONG { WG_M } else { BM } as u32);
    let m_units = m_tiles.div_ceil(cluster.max(1));
    let n_tiles = p.n.div_ceil(BN as u32);
    let g = Gemm {
        // SAFETY: the launch contract: device addresses of valid tensor maps.
        map_a: unsafe { TensorMap::at(p.tmap_a) },
        // SAFETY: as above.
        map_b: unsafe { TensorMap::at(p.tmap_b) },
        // SAFETY: as above.
        map_c: unsafe { TensorMap::at(p.tmap_c) },
        c: p.c,
        m: p.m,
        n: p.n,
        ldc: p.ldc,
        alpha: p.alpha,
        beta: p.beta,
        bk: I::BK_ELEMS,
        k_blocks: p.k.div_ceil(I::BK_ELEMS),
        scales: [p.a_scale, p.b_scale],
        scales_ld: [p.a_scales_ld, p.b_scales_ld],
        sched: Scheduler {
            m_units,
            n_tiles,
            units: m_units * n_tiles,
            first: cluster::cluster_idx_x(),
            stride: cluster::cluster_count_x(),
            along_n: p.raster == RASTER_ALONG_N,
            group: p.group,
        },
        smem,
        ring,
        rank: cluster::cta_rank(),
        cluster,
        pingpong: PINGPONG,
    };
    let tid = thread_idx_x();
    if tid == 0 {
        // SAFETY: one thread initialises the barriers before anyone uses them.
        unsafe {
            ring.init(g.readers_per_stage() * cluster);
            g.order(0).init(1);
            g.order(1).init(1);
        }
        mbarrier::fence_init();
        g.map_a.prefetch();
        g.map_b.prefetch();
        g.map_c.prefetch();
    }
    // SAFETY: every thread of the cluster, convergent (no divergence since entry but the
    // reconverged `if` above).
    unsafe { cluster::sync_cluster() };

    if warpgroup_idx() == 0 {
        // SAFETY: the whole producer warpgroup, convergently; launch bounds are declared.
        unsafe { setmaxnreg_dec::<PRODUCER_REGS>() };
        if tid == 0 {
            producer::<L>(g);
        }
    } else {
        // SAFETY: the whole consumer warpgroup, convergently; PRODUCER_REGS + 2 * CONSUMER_REGS
        // warpgroup budgets fit the CTA's registers (contract assertion).
        unsafe { setmaxnreg_inc::<CONSUMER_REGS>() };
        let consumer_idx = warpgroup_idx() - 1;
        if p.out_f32 != 0 {
            consumer::<I, L, true>(g, consumer_idx);
        } else {
            consumer::<I, L, false>(g, consumer_idx);
        }
    }
    // SAFETY: every lane of every warp reaches this point (the roles above return), full mask.
    unsafe { crate::device::warp::sync_warp() };
    // No CTA exits while its peer may still multicast into it or release its barriers.
    // SAFETY: every thread of the cluster, warps reconverged by sync_warp.
    unsafe { cluster::sync_cluster() };
}

/// The entry parameters (see `contract::tc_gemm`).
struct Params {
    tmap_a: u64,
    tmap_b: u64,
    tmap_c: u64,
    c: u64,
    m: u32,
    n: u32,
    k: u32,
    ldc: u32,
    alpha: f32,
    beta: f32,
    out_f32: u32,
    raster: u32,
    group: u32,
    /// FP8 entries: scale addresses (0 for the 16-bit entries).
    a_scale: u64,
    b_scale: u64,
    /// Block-scaled entry: the scale arrays' pitches (0 elsewhere).
    a_scales_ld: u32,
    b_scales_ld: u32,
}

macro_rules! entry {
    ($name:ident, $input:ty, $layout:ty, $pingpong:literal, $doc:literal) => {
        #[doc = $doc]
        ///
        /// Launch: `THREADS_PER_CTA` threads, `SMEM_BYTES` dynamic shared memory, cluster dims
        /// `(1|2, 1, 1)`, a grid of whole clusters (persistent: any count >= 1 is correct).
        /// Parameters and layouts: `contract::tc_gemm`; another block or cluster size traps.
        ///
        /// # Safety
        /// The tensor maps describe A, B and C as the contract says (dtype, dims `{K, M}`,
        /// `{K, N}` or `{N, K}`, `{N, M}`, boxes, 128-byte swizzle) and stay valid until the
        /// kernel completes; `c`/`ldc` address C (which overlaps neither A nor B) when
        /// `beta != 0`.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            tmap_a: u64,
            tmap_b: u64,
            tmap_c: u64,
            c: u64,
            m: u32,
            n: u32,
            k: u32,
            ldc: u32,
            alpha: f32,
            beta: f32,
            out_f32: u32,
            raster: u32,
            group: u32,
        ) {
            let p = Params {
                tmap_a,
                tmap_b,
                tmap_c,
                c,
                m,
                n,
                k,
                ldc,
                alpha,
                beta,
                out_f32,
                raster,
                group,
                a_scale: 0,
                b_scale: 0,
                a_scales_ld: 0,
                b_scales_ld: 0,
            };
            // SAFETY: the launch contract above.
            unsafe { tc_gemm::<$input, $layout, $pingpong>(p) }
        }
        crate::device::launch_bounds!(
            $name,
            THREADS_PER_CTA,
            1,
            setmaxnreg = [PRODUCER_REGS, CONSUMER_REGS, CONSUMER_REGS]
        );
    };
}

entry!(
    tc_gemm_bf16_bcol,
    Bf16,
    KMajor,
    false,
    "BF16 GEMM, B column-major (K-major)."
);
entry!(
    tc_gemm_bf16_brow,
    Bf16,
    NMajor,
    false,
    "BF16 GEMM, B row-major (N-major)."
);
entry!(
    tc_gemm_f16_bcol,
    F16,
    KMajor,
    false,
    "FP16 GEMM, B column-major (K-major)."
);
entry!(
    tc_gemm_f16_brow,
    F16,
    NMajor,
    false,
    "FP16 GEMM, B row-major (N-major)."
);
entry!(
    tc_gemm_bf16_bcol_pingpong,
    Bf16,
    KMajor,
    true,
    "BF16 GEMM, B column-major, ping-pong consumers (each warpgroup takes whole 64 x 256 tiles, \
     alternating; A box `A_BOX_PINGPONG`)."
);

macro_rules! entry_fp8 {
    ($name:ident, $input:ty, $pingpong:literal, $doc:literal) => {
        entry_fp8!(
            @entry $name,
            $input,
            $pingpong,
            $doc,
            "Launch: as the 16-bit entries. Parameters: the common list (`contract::tc_gemm`) plus \
             `a_scale`, `b_scale` (device addresses of one f32 each, or 0 for 1.0); C is BF16 \
             (`out_f32 = 0`) or f32.",
            "As the 16-bit entries, with A and B of FP8 (one byte per element; tensor maps of \
             `UINT8` with boxes `A_BOX_FP8`, `B_BOX_KMAJOR_FP8`, B K-major `{K, N}`), and each \
             nonzero scale address a 4-byte aligned f32 in device memory that is not written until \
             the kernel completes.",
            []
        );
    };
    // The block-scaled entry: `a_scale`/`b_scale` address the scale arrays, whose pitches follow.
    (
        $name:ident, $input:ty, $doc:literal, launch = $launch:literal, safety = $safety:literal,
        pitches = [$a_ld:ident, $b_ld:ident]
    ) => {
        entry_fp8!(@entry $name, $input, false, $doc, $launch, $safety, [$a_ld, $b_ld]);
    };
    (
        @entry $name:ident, $input:ty, $pingpong:literal, $doc:literal, $launch:literal,
        $safety:literal, [$($a_ld:ident, $b_ld:ident)?]
    ) => {
        #[doc = $doc]
        ///
        #[doc = $launch]
        ///
        /// # Safety
        #[doc = $safety]
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            tmap_a: u64,
            tmap_b: u64,
            tmap_c: u64,
            c: u64,
            m: u32,
            n: u32,
            k: u32,
            ldc: u32,
            alpha: f32,
            beta: f32,
            out_f32: u32,
            raster: u32,
            group: u32,
            a_scale: u64,
            b_scale: u64,
            $($a_ld: u32, $b_ld: u32,)?
        ) {
            let p = Params {
                tmap_a,
                tmap_b,
                tmap_c,
                c,
                m,
                n,
                k,
                ldc,
                alpha,
                beta,
                out_f32,
                raster,
                group,
                a_scale,
                b_scale,
                a_scales_ld: 0,
                b_scales_ld: 0,
            };
            $(let p = Params {
                a_scales_ld: $a_ld,
                b_scales_ld: $b_ld,
                ..p
            };)?
            // SAFETY: the launch contract above.
            unsafe { tc_gemm::<$input, KMajor, $pingpong>(p) }
        }
        crate::device::launch_bounds!(
            $name,
            THREADS_PER_CTA,
            1,
            setmaxnreg = [PRODUCER_REGS, CONSUMER_REGS, CONSUMER_REGS]
        );
    };
}

entry_fp8!(
    tc_gemm_e4m3_bcol,
    E4m3,
    false,
    "FP8 GEMM, A and B E4M3, B column-major (K-major), per-tensor scales (issue 20)."
);
entry_fp8!(
    tc_gemm_e4m3_e5m2_bcol,
    E4m3E5m2,
    false,
    "FP8 GEMM, A E4M3, B E5M2, B column-major (K-major), per-tensor scales (issue 20)."
);
entry_fp8!(
    tc_gemm_e4m3_bcol_pingpong,
    E4m3,
    true,
    "FP8 GEMM, A and B E4M3, B column-major, ping-pong consumers (A box `A_BOX_PINGPONG_FP8`)."
);

entry_fp8!(
    tc_gemm_e4m3_bcol_block_scaled,
    E4m3Block,
    "Block-scaled FP8 GEMM (issue 20): A and B E4M3, B column-major (K-major), DeepSeek-V3 \
     scales (A `1 x 128`, B `128 x 128`) applied in FP32 between k-blocks \
     (`mainloop_block_scaled`), cooperative `BM x BN` tiles, cluster 1 or 2.",
    launch = "Launch: as the 16-bit entries. Parameters: the common list (`contract::tc_gemm`) \
              plus `a_scale` (the A scales' address), `b_scale` (the B scales'), `a_scales_ld`, \
              `b_scales_ld` (`contract::tc_gemm::FP8_BLOCK_EXTRA_PARAMS` gives the layouts); C is \
              BF16 (`out_f32 = 0`) or f32.",
    safety = "As the per-tensor FP8 entries, with `a_scale` the device address of \
              `(ceil(K / 128) - 1) * a_scales_ld + M` f32 (`a_scales_ld >= M`) and `b_scale` of \
              `(ceil(N / 128) - 1) * b_scales_ld + ceil(K / 128)` f32 \
              (`b_scales_ld >= ceil(K / 128)`), both 4-byte aligned and not written until the \
              kernel completes.",
    pitches = [a_scales_ld, b_scales_ld]
);
