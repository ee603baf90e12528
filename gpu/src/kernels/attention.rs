//! Attention forward for Hopper (sm_90a, issue 23), FlashAttention-3's structure:
//! `O = softmax(Q K^T * scale [+ causal mask]) V` and the row log-sum-exp. Layouts, parameters
//! and the shared-memory layout: `contract::attention`.
//!
//! A persistent grid: CTA `x` of `G` works on tiles `x, x + G, ...` (a tile: 128 Q rows of one
//! query head of one sequence), in `contract::attention::tile_coords`'s order (L2 sections of
//! (head, batch) pairs, the heaviest causal tiles of a section first). The producer publishes
//! each tile (its info words, then Q) once the consumers released the previous tile's Q, and its
//! K and V rings run on across tiles, so a tile's first blocks load under the previous tile's
//! last `O += P V` and epilogue. With `G` = the tile count it is one tile per CTA.
//!
//! ```text
//!   producer (warpgroup 0, one thread)     consumers (warpgroups 1, 2: Q rows 0..64, 64..128)
//!   per tile: wait q_empty; info words;
//!   TMA Q                   --q_full-->      wait Q; read info (DONE: exit)
//!   per key block n:                         prologue: S_0 = Q K_0^T; softmax -> P_0
//!     acquire K stage; TMA K --k full-->     per n >= 1: [turn] S_n = Q K_n^T; O += P_{n-1} V_{n-1}
//!     acquire V stage; TMA V --v full-->       [pass turn]; wait S_n; release K_n; softmax(S_n)
//!                          <--k/v empty--      wait O; release V_{n-1}; O *= correction; P_n
//!                                          <--q_empty-- (all S of the tile retired)
//!                                          tail: [turn] O += P_last V_last [pass turn]
//!                                          epilogue: O / rowsum -> st.global (bounds-checked),
//!                                          LSE = ln(rowsum) + max * scale
//! ```
//!
//! The K and V rings are separate `TmaPipeline`s (2 stages each), so `S = Q K^T` starts as soon
//! as K has landed. Both consumer warpgroups read every stage (2 releases per stage).
//!
//! **Ping-pong** (FA3 §3.1): named barriers [`PINGPONG_BARRIER`] `+ w` (256 threads) give the
//! tensor cores to one consumer warpgroup at a time: warpgroup `w` syncs on its own barrier
//! before issuing its GEMMs and arrives on the other's barrier after issuing them, so one
//! warpgroup's softmax runs under the other's GEMMs. Warpgroup 1 arrives once up front (0 goes
//! first) and skips its arrival after its last GEMMs, so every use of each barrier completes
//! (both warpgroups take `n_blocks + 1` turns).
//!
//! **In-warpgroup overlap** (FA3 §3.2) is the order of the GEMMs: `S_n` and `P_{n-1} V_{n-1}`
//! are issued together as two wgmma-groups; `wait_group 1` retires `S_n`, the softmax of block
//! `n` runs while `P_{n-1} V_{n-1}` is still on the tensor cores, and `O` is rescaled and `P_n`
//! packed only after `wait_group 0`.
//!
//! **Softmax** in base 2 with FP32 running max `m` and sum `l` per row; `P` rounded to the input
//! type in registers and fed to `wgmma` as A ([`AFragment`]: the FP32 accumulator layout of
//! two n8 blocks is the 16-bit A layout of one k16 slice). A row with no visible key keeps
//! `m = -inf`: the exponent's offset is then 0 (no `-inf - -inf`), `P = 0`, and the epilogue
//! writes `O = 0`, `LSE = +inf` (FlashAttention's convention).
//!
//! **Masks**: a key block is masked (scores set to `-inf` element-wise) when it reaches past
//! `seqlen_k` or, causal, past the diagonal of the tile's first row; causal launches skip the
//! key blocks wholly above the diagonal (`n_blocks` ends at the tile's last row's diagonal).
//! Q rows past `seqlen_q` are computed (on zeros, or the next sequence's rows in a varlen
//! batch) but never stored.
//!
//! **Epilogue**: fixed-length batches stage O in shared memory and store it by TMA; varlen
//! batches (whose boxes would cross into the next sequence) use bounds-checked stores.
//!
//! Not done yet (notes for later): 3 stages for head dim 64, larger
//! `BLOCK_N` (FA3 uses 176 for d = 128), a third consumer warpgroup, a dynamic (atomic) tile
//! scheduler.

use core::ops::IndexMut;

use crate::contract::attention::*;
use crate::device::math::{exp2_approx, fma, log2_approx, pack_bf16x2, pack_f16x2};
use crate::device::mbarrier::{self, Mbarrier};
use crate::device::pdl;
use crate::device::pipeline::{PipelineState, TmaPipeline};
use crate::device::smem::{dynamic_smem_base, Shared};
use crate::device::thread::{block_dim_x, block_idx_x, grid_dim_x, thread_idx_x};
use crate::device::tma::TensorMap;
use crate::device::warp::{quad_max_f32, quad_sum_f32};
use crate::device::warpgroup::{
    setmaxnreg_dec, setmaxnreg_inc, thread_in_warpgroup, warpgroup_idx, NamedBarrier,
};
use crate::device::wgmma::{self, AFragment, Accumulators, MatrixDescriptor, Swizzle};

type Ring = TmaPipeline<{ STAGES as u32 }>;
type State = PipelineState<{ STAGES as u32 }>;

/// FP32 accumulators of `S` per consumer thread: a 64 x `BLOCK_N` tile over 128 threads.
const S_ACC: usize = WG_M * BLOCK_N / WARPGROUP_THREADS as usize;
/// k16 slices of `O += P V` (keys of a block / 16).
const PV_SLICES: usize = BLOCK_N / 16;
/// One 128-byte-swizzle atom (8 rows of 128 bytes): wgmma's stride-dimension byte offset.
const ATOM_BYTES: u32 = 8 * 128;
/// Bytes from one k16 slice of an MN-major operand to the next (16 rows of 128 bytes).
const MN_SLICE_BYTES: u32 = 16 * 128;

const _: () = {
    assert!(S_ACC == 64 && PV_SLICES == 8);
};

/// `unroll!(i in [0 1 ...] { body })`: the body once per literal, with `i` a `usize` constant,
/// so every accumulator index is a constant and the arrays stay in registers (a loop that LLVM
/// leaves rolled would put them in local memory).
macro_rules! unroll {
    ($i:ident in [$($n:literal)*] $body:block) => {
        $({
            const $i: usize = $n;
            $body
        })*
    };
}

/// The 16 n8 blocks of a 128-column accumulator tile (`S`, or `O` of head dim 128).
macro_rules! blocks16 {
    ($i:ident $body:block) => {
        unroll!($i in [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15] $body)
    };
}

/// Element type: the wgmma instructions and the rounding of `P` and `O`.
trait Elem {
    /// `S = Q K^T` for one k16 slice: `wgmma.m64n128k16` from shared memory, K-major B.
    ///
    /// # Safety
    /// As [`wgmma::mma_async_m64n128k16_f32_bf16`].
    unsafe fn mma_qk(d: &mut [f32; S_ACC], a: MatrixDescriptor, b: MatrixDescriptor, sd: u32);
    /// `O += P V` for head dim 64 and one k16 slice, P in registers, MN-major V.
    ///
    /// # Safety
    /// As [`wgmma::mma_async_rs_m64n64k16_f32_bf16`].
    unsafe fn mma_pv64(d: &mut [f32; 32], a: AFragment, b: MatrixDescriptor, sd: u32);
    /// As [`Self::mma_pv64`] for head dim 128.
    ///
    /// # Safety
    /// As [`wgmma::mma_async_rs_m64n128k16_f32_bf16`].
    unsafe fn mma_pv128(d: &mut [f32; 64], a: AFragment, b: MatrixDescriptor, sd: u32);
    /// The A fragment of k16 slice `s` of the `P` accumulators.
    fn fragment(p: &[f32; S_ACC], s: usize) -> AFragment;
    /// Two f32 rounded to this type, packed low | high << 16.
    fn pack(lo: f32, hi: f32) -> u32;
}

struct Bf16;
struct F16;

macro_rules! elem {
    ($ty:ident, $qk:ident, $pv64:ident, $pv128:ident, $frag:ident, $pack:ident) => {
        impl Elem for $ty {
            /// # Safety
            /// As the trait method.
            #[inline(always)]
            unsafe fn mma_qk(
                d: &mut [f32; S_ACC],
                a: MatrixDescriptor,
                b: MatrixDescriptor,
                sd: u32,
            ) {
                // SAFETY: forwarded to the caller.
                unsafe { wgmma::$qk::<0>(d, a, b, sd) }
            }
            /// # Safety
            /// As the trait method.
            #[inline(always)]
            unsafe fn mma_pv64(d: &mut [f32; 32], a: AFragment, b: MatrixDescriptor, sd: u32) {
                // SAFETY: forwarded to the caller; V is MN-major (imm-trans-b = 1).
                unsafe { wgmma::$pv64::<1>(d, a, b, sd) }
            }
            /// # Safety
            /// As the trait method.
            #[inline(always)]
            unsafe fn mma_pv128(d: &mut [f32; 64], a: AFragment, b: MatrixDescriptor, sd: u32) {
                // SAFETY: forwarded to the caller; V is MN-major (imm-trans-b = 1).
                unsafe { wgmma::$pv128::<1>(d, a, b, sd) }
            }
            #[inline(always)]
            fn fragment(p: &[f32; S_ACC], s: usize) -> AFragment {
                AFragment::$frag(p, s)
            }
            #[inline(always)]
            fn pack(lo: f32, hi: f32) -> u32 {
                $pack(lo, hi)
            }
        }
    };
}

elem!(
    Bf16,
    mma_async_m64n128k16_f32_bf16,
    mma_async_rs_m64n64k16_f32_bf16,
    mma_async_rs_m64n128k16_f32_bf16,
    from_acc_bf16,
    pack_bf16x2
);
elem!(
    F16,
    mma_async_m64n128k16_f32_f16,
    mma_async_rs_m64n64k16_f32_f16,
    mma_async_rs_m64n128k16_f32_f16,
    from_acc_f16,
    pack_f16x2
);

/// Head dimension: the `O` accumulators and the `P V` instruction.
trait HeadDim {
    /// D.
    const D: usize;
    /// FP32 accumulators of `O` per consumer thread (`D / 2`).
    type O: Accumulators + IndexMut<usize, Output = f32> + Copy;
    /// All zeros (a constant, so the array stays in registers).
    const ZERO: Self::O;
    /// `O += P V` for one k16 slice.
    ///
    /// # Safety
    /// As [`wgmma::mma_async_rs_m64n128k16_f32_bf16`].
    unsafe fn mma_pv<I: Elem>(o: &mut Self::O, a: AFragment, b: MatrixDescriptor, sd: u32);
}

struct D64;
struct D128;

impl HeadDim for D64 {
    const D: usize = 64;
    type O = [f32; 32];
    const ZERO: [f32; 32] = [0.0; 32];
    /// # Safety
    /// As the trait method.
    #[inline(always)]
    unsafe fn mma_pv<I: Elem>(o: &mut [f32; 32], a: AFragment, b: MatrixDescriptor, sd: u32) {
        // SAFETY: forwarded to the caller.
        unsafe { I::mma_pv64(o, a, b, sd) }
    }
}

impl HeadDim for D128 {
    const D: usize = 128;
    type O = [f32; 64];
    const ZERO: [f32; 64] = [0.0; 64];
    /// # Safety
    /// As the trait method.
    #[inline(always)]
    unsafe fn mma_pv<I: Elem>(o: &mut [f32; 64], a: AFragment, b: MatrixDescriptor, sd: u32) {
        // SAFETY: forwarded to the caller.
        unsafe { I::mma_pv128(o, a, b, sd) }
    }
}

/// The words of a tile-info slot (`contract::INFO_WORDS`, two slots): the producer thread
/// writes a tile's words before it arms `q_full` for that tile (its arrive releases them, the
/// consumers' wait on `q_full` acquires them), and the consumers read them where they need them
/// (`ld.shared` that the compiler does not hoist, so nothing of a tile stays in registers across
/// the main loop but `n_blocks`). Slot `i % 2` holds the CTA's `i`-th tile; the
/// producer rewrites it for tile `i + 2` only after both consumer warpgroups released Q of tile
/// `i + 1` (`q_empty`), which they do after tile `i`'s epilogue.
mod info {
    /// Key blocks to visit (`0..n_blocks`), or [`DONE`]: the CTA has no tile left.
    pub const N_BLOCKS: u32 = 0;
    /// First key block that needs the element-wise mask (past `S_k`, or past the diagonal of
    /// the tile's first row).
    pub const MASK_FROM: u32 = 1;
    /// Keys of the sequence.
    pub const SEQLEN_K: u32 = 2;
    /// Row `r` of the tile sees key `j` iff `j <= r + DIAG` (`i32`; causal: `m0 + S_k - S_q`,
    /// else a value no key index reaches).
    pub const DIAG: u32 = 3;
    /// Rows of the sequence from the tile's first (`S_q - m0`): rows at or past it are not stored.
    pub const ROWS: u32 = 4;
    /// Row of O (`[rows, heads, D]`) of the tile's first Q row.
    pub const O_ROW: u32 = 5;
    /// Index into LSE of (head, the tile's first Q row); a head's rows are contiguous.
    pub const LSE_INDEX: u32 = 6;
    /// For the producer's own loads, read back after it wrote them (so that nothing computed
    /// for the info words stays live in its 24 registers across the loads): Q's row coordinate
    /// in its tensor map, the query head, the KV head, K's and V's first row, the batch
    /// coordinate.
    pub const Q_ROW: u32 = 10;
    pub const HEAD: u32 = 11;
    pub const KV_HEAD: u32 = 12;
    pub const K_ROW: u32 = 13;
    pub const BATCH: u32 = 14;
    /// `N_BLOCKS` of the end marker.
    pub const DONE: u32 = u32::MAX;
}

/// One tile-info slot in shared memory.
#[derive(Clone, Copy)]
struct Info(u32);

impl Info {
    #[inline(always)]
    fn get(self, word: u32) -> u32 {
        // SAFETY: the slot lies inside the launch's shared memory (contract::info_offset) and
        // is written only by the producer thread, for a tile whose q_full phase the reader has
        // waited on and which the producer does not rewrite before the reader is done with it
        // (see `info`).
        unsafe { Shared::<u32>::at(self.0 + 4 * word).load() }
    }
    /// # Safety
    /// The producer thread, before it arms `q_full` for the slot's tile; no consumer reads the
    /// slot now (see `info`).
    #[inline(always)]
    unsafe fn set(self, word: u32, v: u32) {
        // SAFETY: inside the launch's shared memory; the caller's contract.
        unsafe { Shared::<u32>::at(self.0 + 4 * word).store(v) }
    }
}

/// What every role of the CTA shares over all its tiles: the shared-memory layout, its
/// barriers, the options.
#[derive(Clone, Copy)]
struct Cta {
    /// 1024-byte aligned shared-window base of the layout.
    smem: u32,
    /// Q of the current tile has landed (count 1: the producer's arrive, with Q's bytes).
    q_full: Mbarrier,
    /// Both consumer warpgroups are done with Q of the current tile (count: every consumer
    /// thread): the scheduler may publish the next tile.
    q_empty: Mbarrier,
    /// The scheduler wrote the next tile's info words (count 1).
    info_full: Mbarrier,
    k_ring: Ring,
    v_ring: Ring,
    /// Ping-pong between the consumer warpgroups (not `FLAG_NO_PINGPONG`; only with overlap).
    pingpong: bool,
    /// `S_n` issued with `P_{n-1} V_{n-1}` (not `FLAG_NO_OVERLAP`).
    overlap: bool,
    scale_log2: f32,
}

impl Cta {
    /// The 1024-byte aligned shared-window base, read again where it is called.
    #[inline(always)]
    fn base() -> u32 {
        let base: u32;
        // SAFETY: takes the address of the dynamic shared-memory symbol; no memory is touched.
        // Not `pure`: the compiler emits it where it stands instead of reusing an earlier value.
        unsafe {
            core::arch::asm!("mov.u32 {a}, warpline_dyn_smem;", a = out(reg32) base, options(nomem, nostack))
        };
        (base + SWIZZLE_ALIGN as u32 - 1) & !(SWIZZLE_ALIGN as u32 - 1)
    }
    /// The layout of this launch. Each role builds its own after the role split (from a base
    /// address read again, not carried over), so that no address is live across `setmaxnreg`.
    #[inline(always)]
    fn new<H: HeadDim>(p: &Params) -> Self {
        let smem = Self::base();
        Self {
            smem,
            // SAFETY: inside the launch's smem_bytes(D), used for nothing else; thread 0
            // initialises it (count 1: the producer's arrive) and fence_init + bar.sync publish
            // that; the producer arms it once per tile after q_empty, so no phase is skipped.
            q_full: unsafe { Mbarrier::at(smem + barriers_offset(H::D) as u32) },
            // SAFETY: as above; count CONSUMER_WARPGROUPS * WARPGROUP_THREADS (one arrival per
            // consumer thread per tile).
            q_empty: unsafe {
                Mbarrier::at(
                    smem + (barriers_offset(H::D) + crate::contract::MBARRIER_BYTES) as u32,
                )
            },
            // SAFETY: as above; count 1 (the scheduler's arrival per tile and for the end
            // marker), armed for tile i only after q_empty of tile i - 1, so after the loader
            // waited on tile i - 1's phase.
            info_full: unsafe {
                Mbarrier::at(
                    smem + (barriers_offset(H::D) + 2 * crate::contract::MBARRIER_BYTES) as u32,
                )
            },
            // SAFETY: the rings' barriers lie inside the launch's shared memory, used for
            // nothing else; initialised by thread 0 and published by fence_init + bar.sync; per
            // stage and phase one producer_acquire arms the stage's bytes and each consumer
            // warpgroup releases once (count CONSUMER_WARPGROUPS).
            k_ring: unsafe { Ring::at(smem + k_ring_offset(H::D) as u32) },
            // SAFETY: as above.
            v_ring: unsafe { Ring::at(smem + v_ring_offset(H::D) as u32) },
            pingpong: p.flags & FLAG_NO_PINGPONG == 0,
            overlap: p.flags & FLAG_NO_OVERLAP == 0,
            scale_log2: p.scale_log2,
        }
    }
    #[inline(always)]
    fn k_stage<H: HeadDim>(self, s: State) -> u32 {
        self.smem + (k_offset(H::D) + s.stage() as usize * kv_stage_bytes(H::D)) as u32
    }
    #[inline(always)]
    fn v_stage<H: HeadDim>(self, s: State) -> u32 {
        self.smem + (v_offset(H::D) + s.stage() as usize * kv_stage_bytes(H::D)) as u32
    }
    /// The info slot of the CTA's `i`-th tile.
    #[inline(always)]
    fn info<H: HeadDim>(self, i: u32) -> Info {
        Info(self.smem + info_offset(H::D) as u32 + (i & 1) * (INFO_WORDS * 4) as u32)
    }
}

/// One tile as the producer finds it: its coordinates in the tensor maps and its key blocks.
#[derive(Clone, Copy)]
struct Found {
    m0: u32,
    head: u32,
    seqlen_q: u32,
    seqlen_k: u32,
    q_start: u32,
    k_start: u32,
    batch: u32,
}

/// The CTA's next tile with rows from tile index `*tile` on (tiles of a varlen batch past their
/// sequence's end are skipped), advancing `*tile` past it; `None` when none is left.
#[inline(always)]
fn next_tile(p: &Params, tile: &mut u32) -> Option<Found> {
    let varlen = p.flags & FLAG_VARLEN != 0;
    // Launch invariants are read from the parameters at each use (constant bank), not kept
    // in the producer's 24 registers.
    while *tile < p.tiles {
        let (m_block, head, batch) = tile_coords(*tile, p.n_m, p.heads, p.batch, p.hb_group);
        *tile += grid_dim_x();
        let (seqlen_q, seqlen_k, q_start, k_start) = if varlen {
            // SAFETY: the launch contract: cu_seqlens_* are B + 1 i32 each, monotone from 0,
            // checked by the launcher, not written while the kernel runs; batch < B.
            unsafe {
                let q = p.cu_seqlens_q as *const i32;
                let k = p.cu_seqlens_k as *const i32;
                let (q0, q1) = (
                    q.add(batch as usize).read() as u32,
                    q.add(batch as usize + 1).read() as u32,
                );
                let (k0, k1) = (
                    k.add(batch as usize).read() as u32,
                    k.add(batch as usize + 1).read() as u32,
                );
                (q1 - q0, k1 - k0, q0, k0)
            }
        } else {
            (p.seqlen_q, p.seqlen_k, 0, 0)
        };
        let m0 = m_block * BLOCK_M as u32;
        if m0 < seqlen_q {
            return Some(Found {
                m0,
                head,
                seqlen_q,
                seqlen_k,
                q_start,
                k_start,
                batch,
            });
        }
    }
    None
}

/// Scheduler (thread 32, warp 1 of the producer warpgroup): for each of the CTA's tiles, once
/// both consumer warpgroups released the previous tile's Q (`q_empty`: they are done with the
/// info slot written two tiles ago), the tile's info words, then `info_full`; at the end the
/// [`info::DONE`] marker. Apart from the loader so that each fits in the producer's 24
/// registers.
#[inline(always)]
fn scheduler<H: HeadDim>(c: Cta, p: &Params) {
    let causal = p.flags & FLAG_CAUSAL != 0;
    let varlen = p.flags & FLAG_VARLEN != 0;
    let mut tile = block_idx_x();
    let mut published = 0u32;
    loop {
        let found = next_tile(p, &mut tile);
        if published > 0 {
            c.q_empty.wait_parity((published - 1) & 1);
        }
        let slot = c.info::<H>(published);
        published += 1;
        let Some(f) = found else {
            // SAFETY: the scheduler, before arming info_full; no one reads the slot now
            // (q_empty above; the loader reads it after info_full).
            unsafe { slot.set(info::N_BLOCKS, info::DONE) };
            c.info_full.arrive();
            break;
        };
        // Each word is stored as soon as it is known, so that little stays live at once.
        // SAFETY: as above (every `set` of this tile: the scheduler, before info_full).
        unsafe {
            slot.set(info::Q_ROW, f.q_start + f.m0);
            slot.set(info::HEAD, f.head);
            slot.set(info::K_ROW, f.k_start);
            slot.set(info::BATCH, if varlen { 0 } else { f.batch });
            slot.set(info::ROWS, f.seqlen_q - f.m0);
            slot.set(info::SEQLEN_K, f.seqlen_k);
            slot.set(
                info::O_ROW,
                if varlen {
                    f.q_start
                } else {
                    f.batch * f.seqlen_q
                } + f.m0,
            );
            // At most B * H * S_q < 2^31 (the launcher's bound).
            slot.set(
                info::LSE_INDEX,
                if varlen {
                    f.head * p.total_q + f.q_start
                } else {
                    (f.batch * p.heads + f.head) * f.seqlen_q
                } + f.m0,
            );
        }
        let diag = f.seqlen_k as i32 - f.seqlen_q as i32;
        // Keys any row of the tile may see: causal stops at the last stored row's diagonal.
        let last_row = (f.m0 + BLOCK_M as u32).min(f.seqlen_q) as i32 - 1;
        let key_end = if causal {
            (last_row + diag + 1).clamp(0, f.seqlen_k as i32) as u32
        } else {
            f.seqlen_k
        };
        // Row r of the tile sees key j iff j <= r + diag_t.
        let diag_t = if causal {
            f.m0 as i32 + diag
        } else {
            i32::MAX - 2 * BLOCK_M as i32
        };
        let past_k = f.seqlen_k / BLOCK_N as u32;
        let past_diag = if diag_t < BLOCK_N as i32 - 1 {
            0
        } else {
            (diag_t - (BLOCK_N as i32 - 1)) as u32 / BLOCK_N as u32 + 1
        };
        // SAFETY: as above.
        unsafe {
            slot.set(info::N_BLOCKS, key_end.div_ceil(BLOCK_N as u32));
            slot.set(info::DIAG, diag_t as u32);
            slot.set(info::MASK_FROM, past_k.min(past_diag));
            slot.set(info::KV_HEAD, f.head / (p.heads / p.kv_heads));
        }
        c.info_full.arrive();
    }
}

/// Loader (thread 0): for each tile the scheduler published (`info_full`), arms `q_full` (with
/// Q's bytes, or without for a tile with no key block and the end marker), loads Q, then per key
/// block its K tile and its V tile, each `D / 64` boxes of 64 columns (one 128-byte-swizzled
/// chunk each). The K and V rings go on from tile to tile, so the next tile's first blocks load
/// while the consumers finish the current one (its last `O += P V` and its epilogue).
#[inline(always)]
fn loader<H: HeadDim>(c: Cta, p: &Params) {
    // SAFETY: the launch contract: device addresses of valid tensor maps.
    let (q, k, v) = unsafe {
        (
            TensorMap::at(p.tmap_q),
            TensorMap::at(p.tmap_k),
            TensorMap::at(p.tmap_v),
        )
    };
    q.acquire();
    k.acquire();
    v.acquire();
    let chunks = (H::D / CHUNK_COLS) as u32;
    let kv_tx = kv_stage_bytes(H::D) as u32;
    let (mut ks, mut vs) = (State::new(), State::new());
    let mut tiles = 0u32;
    loop {
        // The scheduler wrote the slot, after both consumer warpgroups retired every wgmma
        // reading the previous tile's Q (q_empty): Q may be overwritten.
        c.info_full.wait_parity(tiles & 1);
        let slot = c.info::<H>(tiles);
        tiles += 1;
        let n_blocks = slot.get(info::N_BLOCKS);
        if n_blocks == 0 || n_blocks == info::DONE {
            // No key to see (the consumers write O = 0, LSE = +inf without Q), or the end.
            c.q_full.arrive();
            if n_blocks == info::DONE {
                break;
            }
            continue;
        }
        let kv_head = slot.get(info::KV_HEAD) as i32;
        let batch_tma = slot.get(info::BATCH) as i32;
        c.q_full.arrive_expect_tx(q_bytes(H::D) as u32);
        let mut ch = 0;
        while ch < chunks {
            // SAFETY: the Q region is 1024-byte aligned, holds the chunks, and no wgmma reads it
            // now (info_full, after q_empty); q_full is armed for exactly these bytes
            // (out-of-bounds zeros included).
            unsafe {
                q.load_4d(
                    c.smem + (Q_OFFSET + ch as usize * Q_CHUNK_BYTES) as u32,
                    [
                        (ch * CHUNK_COLS as u32) as i32,
                        slot.get(info::HEAD) as i32,
                        slot.get(info::Q_ROW) as i32,
                        batch_tma,
                    ],
                    c.q_full,
                )
            };
            ch += 1;
        }
        let k_row = slot.get(info::K_ROW);
        let mut n = 0;
        while n < n_blocks {
            let row = (k_row + n * BLOCK_N as u32) as i32;
            let full = c.k_ring.producer_acquire(ks, kv_tx);
            let mut ch = 0;
            while ch < chunks {
                // SAFETY: the stage is free (producer_acquire), 1024-byte aligned, the chunk lies
                // inside it; the full barrier is armed for the stage's bytes.
                unsafe {
                    k.load_4d(
                        c.k_stage::<H>(ks) + ch * KV_CHUNK_BYTES as u32,
                        [(ch * CHUNK_COLS as u32) as i32, kv_head, row, batch_tma],
                        full,
                    )
                };
                ch += 1;
            }
            ks.advance();
            let full = c.v_ring.producer_acquire(vs, kv_tx);
            let mut ch = 0;
            while ch < chunks {
                // SAFETY: as for K.
                unsafe {
                    v.load_4d(
                        c.v_stage::<H>(vs) + ch * KV_CHUNK_BYTES as u32,
                        [(ch * CHUNK_COLS as u32) as i32, kv_head, row, batch_tma],
                        full,
                    )
                };
                ch += 1;
            }
            vs.advance();
            n += 1;
        }
    }
    // Every load is issued; the next kernel's griddepcontrol.wait still waits for this grid.
    pdl::launch_dependents();
}

/// The ping-pong turn of one consumer warpgroup: its own barrier and the other's.
#[derive(Clone, Copy)]
struct Turns {
    mine: NamedBarrier,
    other: NamedBarrier,
    /// Warpgroup 1: skips its arrival after its last GEMMs.
    second: bool,
    /// Ping-pong on (off: every method is a no-op; `FLAG_NO_PINGPONG`, CTA-uniform).
    on: bool,
}

impl Turns {
    #[inline(always)]
    fn new(wg: u32, on: bool) -> Self {
        // SAFETY: barriers PINGPONG_BARRIER + {0, 1} are used by the two consumer warpgroups
        // alone (256 threads: one warpgroup syncs, the other arrives, whole warps convergently);
        // every use completes: warpgroup w syncs n_blocks + 1 times on its barrier, the other
        // arrives n_blocks + 1 times on it (warpgroup 1: once up front, then after each turn but
        // the last); a warpgroup arrives on the other's barrier at most once per use: its next
        // arrival follows its own next sync, which completes only after the other warpgroup
        // synced (and passed) in between. With ping-pong off nobody uses the barriers.
        unsafe {
            Self {
                mine: NamedBarrier::new(PINGPONG_BARRIER + wg, 2 * WARPGROUP_THREADS),
                other: NamedBarrier::new(PINGPONG_BARRIER + (1 - wg), 2 * WARPGROUP_THREADS),
                second: wg == 1,
                on,
            }
        }
    }
    /// Warpgroup 1 lets warpgroup 0 go first.
    #[inline(always)]
    fn start(self) {
        if self.on && self.second {
            // SAFETY: see `new`.
            unsafe { self.other.arrive() };
        }
    }
    #[inline(always)]
    fn take(self) {
        if self.on {
            self.mine.sync();
        }
    }
    #[inline(always)]
    fn pass(self, last: bool) {
        if self.on && !(last && self.second) {
            // SAFETY: see `new`.
            unsafe { self.other.arrive() };
        }
    }
}

/// This thread's rows and columns in the wgmma accumulator layout (module docs of `wgmma`).
#[derive(Clone, Copy)]
struct Lanes {
    /// Row of the warpgroup's 64 (and `row + 8`).
    row: u32,
    /// Column of the n8 block (and `col + 1`).
    col: u32,
    /// Lane % 4 == 0: the quad's leader (writes the LSE).
    leader: bool,
}

/// Issues `S = Q K^T` (`D / 16` k16 slices) as one wgmma-group.
///
/// # Safety
/// Warpgroup-collective; Q and the K stage `k` have landed; `wgmma::fence` was called since `s`
/// was last written.
#[inline(always)]
unsafe fn issue_qk<I: Elem, H: HeadDim>(c: Cta, wg: u32, k: u32, s: &mut [f32; S_ACC]) {
    let q = c.smem + (Q_OFFSET + wg as usize * WG_M * 128) as u32;
    unroll!(SL in [0 1 2 3 4 5 6 7] {
        if SL < H::D / 16 {
        let sl = SL as u32;
        let chunk = sl / 4;
        let a = MatrixDescriptor::new(
            q + chunk * Q_CHUNK_BYTES as u32 + (sl % 4) * 32,
            16,
            ATOM_BYTES,
            Swizzle::B128,
        );
        let b = MatrixDescriptor::new(
            k + chunk * KV_CHUNK_BYTES as u32 + (sl % 4) * 32,
            16,
            ATOM_BYTES,
            Swizzle::B128,
        );
        // SAFETY: the caller's contract; the descriptors address the Q rows of this warpgroup
        // and the K stage, as TMA wrote them (K-major, 128-byte swizzle).
        unsafe { I::mma_qk(s, a, b, (sl != 0) as u32) };
        }
    });
    // SAFETY: warpgroup-collective (caller).
    unsafe { wgmma::commit_group() };
}

/// Issues `O += P V` (`BLOCK_N / 16` k16 slices) as one wgmma-group; `first`: `O = P V`.
///
/// # Safety
/// Warpgroup-collective; the V stage `v` has landed; `wgmma::fence` was called since `o` and
/// `p` were last written.
#[inline(always)]
unsafe fn issue_pv<I: Elem, H: HeadDim>(
    o: &mut H::O,
    p: &[AFragment; PV_SLICES],
    v: u32,
    first: bool,
) {
    unroll!(SL in [0 1 2 3 4 5 6 7] {
        let sl = SL;
        // MN-major V: 16 key rows per slice; 64-column chunks KV_CHUNK_BYTES apart (the leading
        // byte offset).
        let b = MatrixDescriptor::new(
            v + sl as u32 * MN_SLICE_BYTES,
            KV_CHUNK_BYTES as u32,
            ATOM_BYTES,
            Swizzle::B128,
        );
        // SAFETY: the caller's contract.
        unsafe { H::mma_pv::<I>(o, p[SL], b, (!first || sl != 0) as u32) };
    });
    // SAFETY: warpgroup-collective (caller).
    unsafe { wgmma::commit_group() };
}

/// Online softmax of key block `n` on the scores `s` (in place: `s` becomes `P`, unnormalised,
/// relative to the new running max): masks (blocks from `mask_from` on, with the tile's
/// `SEQLEN_K` and `DIAG`), updates the running max `m` (raw scores) and sum `l` (this thread's
/// share of the row; the quad's shares are added in the epilogue) of the thread's two rows,
/// returns the factors by which `O` must be rescaled.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn softmax(
    info: Info,
    mask_from: u32,
    scale_log2: f32,
    wg: u32,
    lanes: Lanes,
    n: u32,
    s: &mut [f32; S_ACC],
    m: &mut [f32; 2],
    l: &mut [f32; 2],
) -> [f32; 2] {
    if n >= mask_from {
        let n0 = n * BLOCK_N as u32;
        let seqlen_k = info.get(info::SEQLEN_K);
        let diag = info.get(info::DIAG) as i32;
        let row0 = (wg * WG_M as u32 + lanes.row) as i32 + diag;
        blocks16!(I {
            unroll!(J in [0 1 2 3] {
                let col = n0 + 8 * I as u32 + lanes.col + (J & 1) as u32;
                let last_seen = row0 + 8 * (J >> 1) as i32;
                if col >= seqlen_k || col as i32 > last_seen {
                    s[4 * I + J] = f32::NEG_INFINITY;
                }
            });
        });
    }
    let mut corr = [0.0f32; 2];
    unroll!(R in [0 1] {
        let r = R;
        let mut mx = m[r];
        blocks16!(I {
            mx = mx.max(s[4 * I + 2 * R]).max(s[4 * I + 2 * R + 1]);
        });
        // SAFETY: every lane of the warp runs this (the consumer code has no lane divergence).
        mx = unsafe { quad_max_f32(mx) };
        // A row with no visible key so far: offset 0, so exp2(-inf - 0) = 0, never NaN.
        let max_scaled = if mx == f32::NEG_INFINITY {
            0.0
        } else {
            mx * scale_log2
        };
        corr[r] = exp2_approx(m[r] * scale_log2 - max_scaled);
        let mut sum = 0.0f32;
        blocks16!(I {
            unroll!(J in [0 1] {
                const E: usize = 4 * I + 2 * R + J;
                let p = exp2_approx(fma(s[E], scale_log2, -max_scaled));
                s[E] = p;
                sum += p;
            });
        });
        l[r] = l[r] * corr[r] + sum;
        m[r] = mx;
    });
    corr
}

/// `P` (in `s`) rounded to the element type, as the A fragments of the `PV_SLICES` k16 slices.
#[inline(always)]
fn pack_p<I: Elem>(s: &[f32; S_ACC], p: &mut [AFragment; PV_SLICES]) {
    unroll!(SL in [0 1 2 3 4 5 6 7] {
        p[SL] = I::fragment(s, SL);
    });
}

/// `O *= corr` row-wise.
#[inline(always)]
fn rescale<H: HeadDim>(o: &mut H::O, corr: [f32; 2]) {
    blocks16!(I {
        if I < H::D / 8 {
            o[4 * I] *= corr[0];
            o[4 * I + 1] *= corr[0];
            o[4 * I + 2] *= corr[1];
            o[4 * I + 3] *= corr[1];
        }
    });
}

/// Consumer warpgroup `wg` (0 or 1): Q rows `64 wg ..` of each of the CTA's tiles, in the order
/// the producer publishes them, until [`info::DONE`].
#[inline(always)]
fn consumer<I: Elem, H: HeadDim>(c: Cta, p: &Params, wg: u32) {
    let tid = thread_in_warpgroup();
    let lane = tid % 32;
    let lanes = Lanes {
        row: (tid / 32) * 16 + lane / 4,
        col: 2 * (lane % 4),
        leader: lane.is_multiple_of(4),
    };
    let turns = Turns::new(wg, c.pingpong && c.overlap);
    let (mut ks, mut vs) = (State::new(), State::new());
    let mut tiles = 0u32;
    loop {
        c.q_full.wait_parity(tiles & 1);
        let info = c.info::<H>(tiles);
        let n_blocks = info.get(info::N_BLOCKS);
        if n_blocks == info::DONE {
            if thread_in_warpgroup() == 0 {
                // This warpgroup's TMA stores of O are complete before the CTA exits.
                crate::device::bulk::wait_group::<0>();
            }
            break;
        }
        let (o, m, l) =
            tile_mainloop::<I, H>(c, wg, lanes, info, n_blocks, turns, &mut ks, &mut vs);
        epilogue::<I, H>(p, info, wg, lanes, &o, m, l);
        tiles += 1;
    }
}

/// One tile's key blocks for consumer warpgroup `wg`: returns `O` (unnormalised), the running
/// max and this thread's share of the row sums. Every wgmma it issued has retired on return,
/// and every K and V stage it consumed is released; so is Q (`q_empty`), as soon as the tile's
/// last `S = Q K^T` retired, so that the producer loads the next tile's Q under this one's tail
/// and epilogue.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn tile_mainloop<I: Elem, H: HeadDim>(
    c: Cta,
    wg: u32,
    lanes: Lanes,
    info: Info,
    n_blocks: u32,
    turns: Turns,
    ks: &mut State,
    vs: &mut State,
) -> (H::O, [f32; 2], [f32; 2]) {
    const S_ZERO: [f32; S_ACC] = [0.0; S_ACC];
    const P_ZERO: [AFragment; PV_SLICES] = [AFragment([0; 4]); PV_SLICES];
    let leader = thread_in_warpgroup() == 0;
    let mut s = S_ZERO;
    let mut o = H::ZERO;
    let mut p = P_ZERO;
    let mut m = [f32::NEG_INFINITY; 2];
    let mut l = [0.0f32; 2];
    // Every wgmma of this warpgroup reading Q has retired. Every thread arrives (count 256),
    // after its own reads of the previous tile's info slot, so that the scheduler's rewrite of
    // that slot is ordered after each of them (not only through the warpgroup's collectives).
    let release_q = || c.q_empty.arrive();
    if n_blocks == 0 {
        release_q();
        return (o, m, l);
    }
    let mask_from = info.get(info::MASK_FROM);
    if !c.overlap {
        // FLAG_NO_OVERLAP: per block S = Q K^T, wait, softmax, O *= correction, O += P V, wait
        // (no ping-pong). The plain order, for measuring the overlap and for diagnosis.
        let mut n = 0;
        while n < n_blocks {
            c.k_ring.consumer_wait(*ks);
            wgmma::fence_operands(&mut s);
            // SAFETY: as in the overlapped path below: warpgroup-uniform, Q and K landed, the
            // stage released after the wait_group that retires the group.
            unsafe {
                wgmma::fence();
                issue_qk::<I, H>(c, wg, c.k_stage::<H>(*ks), &mut s);
                wgmma::wait_group::<0>();
            }
            wgmma::fence_operands(&mut s);
            if leader {
                c.k_ring.consumer_release_local(*ks);
            }
            ks.advance();
            let corr = softmax(
                info,
                mask_from,
                c.scale_log2,
                wg,
                lanes,
                n,
                &mut s,
                &mut m,
                &mut l,
            );
            wgmma::fence_operands(&mut o);
            wgmma::fence_fragments(&mut p);
            rescale::<H>(&mut o, corr);
            pack_p::<I>(&s, &mut p);
            c.v_ring.consumer_wait(*vs);
            wgmma::fence_operands(&mut o);
            wgmma::fence_fragments(&mut p);
            // SAFETY: as above; V stage vs has landed.
            unsafe {
                wgmma::fence();
                issue_pv::<I, H>(&mut o, &p, c.v_stage::<H>(*vs), n == 0);
                wgmma::wait_group::<0>();
            }
            wgmma::fence_operands(&mut o);
            wgmma::fence_fragments(&mut p);
            if leader {
                c.v_ring.consumer_release_local(*vs);
            }
            vs.advance();
            n += 1;
        }
        release_q();
        return (o, m, l);
    }
    turns.start();
    // Prologue: S_0, softmax -> P_0.
    c.k_ring.consumer_wait(*ks);
    turns.take();
    wgmma::fence_operands(&mut s);
    // SAFETY: all 128 threads of the warpgroup run the consumer with the same trip counts (the
    // tile's n_blocks, read by all from the same slot); Q has landed (q_full) and K stage ks
    // too (consumer_wait); released only after the wait_group that retires this group.
    unsafe {
        wgmma::fence();
        issue_qk::<I, H>(c, wg, c.k_stage::<H>(*ks), &mut s);
    }
    turns.pass(false);
    // SAFETY: warpgroup-collective.
    unsafe { wgmma::wait_group::<0>() };
    wgmma::fence_operands(&mut s);
    if leader {
        c.k_ring.consumer_release_local(*ks);
    }
    ks.advance();
    softmax(
        info,
        mask_from,
        c.scale_log2,
        wg,
        lanes,
        0,
        &mut s,
        &mut m,
        &mut l,
    );
    pack_p::<I>(&s, &mut p);
    // Steady state: S_n and P_{n-1} V_{n-1} on the tensor cores together.
    let mut n = 1;
    while n < n_blocks {
        c.k_ring.consumer_wait(*ks);
        c.v_ring.consumer_wait(*vs);
        turns.take();
        wgmma::fence_operands(&mut s);
        wgmma::fence_operands(&mut o);
        wgmma::fence_fragments(&mut p);
        // SAFETY: as in the prologue; V stage vs has landed; P_{n-1} and O are not written
        // until the wait_group::<0> below retires the PV group.
        unsafe {
            wgmma::fence();
            issue_qk::<I, H>(c, wg, c.k_stage::<H>(*ks), &mut s);
            issue_pv::<I, H>(&mut o, &p, c.v_stage::<H>(*vs), n == 1);
        }
        turns.pass(false);
        // SAFETY: warpgroup-collective; retires the QK group (the older one).
        unsafe { wgmma::wait_group::<1>() };
        wgmma::fence_operands(&mut s);
        if leader {
            c.k_ring.consumer_release_local(*ks);
        }
        ks.advance();
        let corr = softmax(
            info,
            mask_from,
            c.scale_log2,
            wg,
            lanes,
            n,
            &mut s,
            &mut m,
            &mut l,
        );
        // SAFETY: warpgroup-collective; retires the PV group.
        unsafe { wgmma::wait_group::<0>() };
        wgmma::fence_operands(&mut o);
        wgmma::fence_fragments(&mut p);
        if leader {
            c.v_ring.consumer_release_local(*vs);
        }
        vs.advance();
        rescale::<H>(&mut o, corr);
        pack_p::<I>(&s, &mut p);
        n += 1;
    }
    release_q();
    // Tail: O += P_last V_last.
    c.v_ring.consumer_wait(*vs);
    turns.take();
    wgmma::fence_operands(&mut o);
    wgmma::fence_fragments(&mut p);
    // SAFETY: as above.
    unsafe {
        wgmma::fence();
        issue_pv::<I, H>(&mut o, &p, c.v_stage::<H>(*vs), n_blocks == 1);
    }
    turns.pass(true);
    // SAFETY: warpgroup-collective.
    unsafe { wgmma::wait_group::<0>() };
    wgmma::fence_operands(&mut o);
    wgmma::fence_fragments(&mut p);
    // The next tile's blocks go on in this ring.
    if leader {
        c.v_ring.consumer_release_local(*vs);
    }
    vs.advance();
    (o, m, l)
}

/// `O / rowsum` rounded to the element type, stored with bounds-checked 4-byte stores (rows
/// past the sequence's end are skipped), and `LSE = max * scale + ln(rowsum)` (natural log;
/// `+inf` for a row that saw no key, whose `O` is 0). Addresses from the tile's info slot.
#[inline(always)]
fn epilogue<E: Elem, H: HeadDim>(
    p: &Params,
    info: Info,
    wg: u32,
    lanes: Lanes,
    o: &H::O,
    m: [f32; 2],
    l: [f32; 2],
) {
    if p.flags & (FLAG_VARLEN | FLAG_NO_TMA_STORE) == 0 {
        epilogue_tma::<E, H>(p, info, wg, lanes, o, m, l);
        return;
    }
    let rows = info.get(info::ROWS);
    let row_bytes = 2 * p.heads as u64 * H::D as u64;
    let o_tile = p.o
        + info.get(info::O_ROW) as u64 * row_bytes
        + 2 * (info.get(info::HEAD) * H::D as u32) as u64;
    let lse_tile = p.lse + 4 * info.get(info::LSE_INDEX) as u64;
    unroll!(R in [0 1] {
        let r = R;
        // SAFETY: every lane of the warp runs this.
        let sum = unsafe { quad_sum_f32(l[r]) };
        let empty = sum.is_nan() || sum <= 0.0; // no visible key (or NaN)
        let inv = if empty { 0.0 } else { 1.0 / sum };
        let row = wg * WG_M as u32 + lanes.row + 8 * r as u32;
        if row < rows {
            let base = o_tile + row as u64 * row_bytes + 2 * lanes.col as u64;
            blocks16!(I {
                if I < H::D / 8 {
                let v = E::pack(o[4 * I + 2 * R] * inv, o[4 * I + 2 * R + 1] * inv);
                // SAFETY: (row m0 + row, head, 8 I + col) lies inside O: m0 + row < S_q of this
                // sequence (the launcher checked O holds every sequence's rows of heads x D),
                // head < heads, 8 I + col + 1 < D; the element index is even and O 16-byte
                // aligned, so the 4-byte store is aligned; only this thread writes these two
                // elements.
                unsafe { ((base + 16 * I as u64) as *mut u32).write(v) };
                }
            });
            if lanes.leader {
                let lse = if empty {
                    f32::INFINITY
                } else {
                    (m[r] * p.scale_log2 + log2_approx(sum)) * core::f32::consts::LN_2
                };
                // SAFETY: inside LSE ([B, H, S_q] or [H, total_q], checked by the launcher; a
                // head's rows are contiguous); one writer per (head, row).
                unsafe { ((lse_tile + 4 * row as u64) as *mut f32).write(lse) };
            }
        }
    });
}

/// The TMA-store epilogue (fixed-length batches): `O / rowsum` rounded to the element type into
/// this warpgroup's staging tile (128-byte swizzled, `contract::o_offset`), then one thread
/// stores its `D / 64` boxes ([`O_BOX`]) by TMA, which clips the rows past `S_q` (the map's rows
/// are one sequence's). The thread waits for its previous tile's stores to have read the
/// staging tile before anyone rewrites it. The LSE as in [`epilogue`].
#[inline(always)]
fn epilogue_tma<E: Elem, H: HeadDim>(
    p: &Params,
    info: Info,
    wg: u32,
    lanes: Lanes,
    o: &H::O,
    m: [f32; 2],
    l: [f32; 2],
) {
    let leader = thread_in_warpgroup() == 0;
    // SAFETY: barrier O_STAGE_BARRIER + wg (not a ping-pong id) is used by this warpgroup's 128
    // threads alone, all of them convergently, twice per tile.
    let stage_bar = unsafe { NamedBarrier::new(O_STAGE_BARRIER + wg, WARPGROUP_THREADS) };
    let stage = Cta::base() + (o_offset(H::D) + wg as usize * WG_M * H::D * IN_BYTES) as u32;
    if leader {
        // The previous tile's TMA stores have read the staging tile.
        crate::device::bulk::wait_group_read::<0>();
    }
    stage_bar.sync();
    let rows = info.get(info::ROWS);
    let lse_tile = p.lse + 4 * info.get(info::LSE_INDEX) as u64;
    unroll!(R in [0 1] {
        let r = R;
        // SAFETY: every lane of the warp runs this.
        let sum = unsafe { quad_sum_f32(l[r]) };
        let empty = sum.is_nan() || sum <= 0.0; // no visible key (or NaN)
        let inv = if empty { 0.0 } else { 1.0 / sum };
        let row = lanes.row + 8 * r as u32;
        blocks16!(I {
            if I < H::D / 8 {
            let v = E::pack(o[4 * I + 2 * R] * inv, o[4 * I + 2 * R + 1] * inv);
            // Column 8 I + col: chunk I / 8, 16-byte piece I % 8 (swizzled by the row), byte
            // 2 col within it.
            let at = stage
                + (I / 8) as u32 * O_CHUNK_BYTES as u32
                + row * 128
                + (((I % 8) as u32 ^ (row % 8)) * 16)
                + 2 * lanes.col;
            // SAFETY: inside this warpgroup's staging tile (row < 64, column < D); one writer
            // per element; no TMA store reads it now (wait_group_read + barrier above).
            unsafe { Shared::<u32>::at(at).store(v) };
            }
        });
        let row_t = wg * WG_M as u32 + row;
        if lanes.leader && row_t < rows {
            let lse = if empty {
                f32::INFINITY
            } else {
                (m[r] * p.scale_log2 + log2_approx(sum)) * core::f32::consts::LN_2
            };
            // SAFETY: inside LSE ([B, H, S_q], checked by the launcher; a head's rows are
            // contiguous); one writer per (head, row).
            unsafe { ((lse_tile + 4 * row_t as u64) as *mut f32).write(lse) };
        }
    });
    crate::device::bulk::fence_proxy_async_shared();
    stage_bar.sync();
    if leader {
        // SAFETY: the launch contract: a valid map of O (fixed-length: rows = S_q per batch).
        let map = unsafe { TensorMap::at(p.tmap_o) };
        let (head, row, batch) = (
            info.get(info::HEAD) as i32,
            (info.get(info::Q_ROW) + wg * WG_M as u32) as i32,
            info.get(info::BATCH) as i32,
        );
        let mut ch = 0;
        while ch < (H::D / CHUNK_COLS) as u32 {
            // SAFETY: the staging chunk is 1024-byte aligned and holds the box, written by this
            // warpgroup's generic stores before fence_proxy_async_shared and the barrier; the
            // box's global rows (past S_q clipped by the map) are this tile's, written by no one
            // else.
            unsafe {
                map.store_4d(
                    stage + ch * O_CHUNK_BYTES as u32,
                    [(ch * CHUNK_COLS as u32) as i32, head, row, batch],
                )
            };
            ch += 1;
        }
        crate::device::bulk::commit_group();
    }
}

/// The entry parameters (see `contract::attention`).
#[derive(Clone, Copy)]
struct Params {
    tmap_q: u64,
    tmap_k: u64,
    tmap_v: u64,
    o: u64,
    lse: u64,
    cu_seqlens_q: u64,
    cu_seqlens_k: u64,
    seqlen_q: u32,
    seqlen_k: u32,
    heads: u32,
    kv_heads: u32,
    total_q: u32,
    scale_log2: f32,
    flags: u32,
    batch: u32,
    hb_group: u32,
    n_m: u32,
    tiles: u32,
    tmap_o: u64,
}

/// The kernel body of every entry.
///
/// # Safety
/// The launch contract of the entries.
#[inline(always)]
unsafe fn attention<I: Elem, H: HeadDim>(p: Params) {
    if block_dim_x() != THREADS_PER_CTA
        || p.kv_heads == 0
        || !p.heads.is_multiple_of(p.kv_heads)
        || p.hb_group == 0
        || p.n_m != p.seqlen_q.div_ceil(BLOCK_M as u32)
        || p.tiles as u64 != tile_count(p.seqlen_q, p.heads, p.batch)
    {
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    // Q, K, V and cu_seqlens may be written by the previous kernel on the stream (PDL), and O
    // and LSE read by it: wait before touching any of them.
    pdl::wait();
    let c = Cta::new::<H>(&p);
    if thread_idx_x() == 0 {
        // SAFETY: one thread, before any use; published by fence_init and the bar.sync below.
        unsafe {
            c.q_full.init(1);
            c.q_empty.init(CONSUMER_WARPGROUPS * WARPGROUP_THREADS);
            c.info_full.init(1);
            c.k_ring.init(CONSUMER_WARPGROUPS);
            c.v_ring.init(CONSUMER_WARPGROUPS);
        }
        mbarrier::fence_init();
        // SAFETY: the launch contract: device addresses of valid tensor maps.
        unsafe {
            TensorMap::at(p.tmap_q).prefetch();
            TensorMap::at(p.tmap_k).prefetch();
            TensorMap::at(p.tmap_v).prefetch();
        }
    }
    // SAFETY: every thread of the CTA, converged.
    unsafe { crate::device::thread::sync_threads() };
    if warpgroup_idx() == 0 {
        // SAFETY: the whole producer warpgroup, convergently; launch bounds with this split.
        unsafe { setmaxnreg_dec::<PRODUCER_REGS>() };
        if thread_idx_x() == 0 {
            loader::<H>(Cta::new::<H>(&p), &p);
        } else if thread_idx_x() == crate::contract::WARP_SIZE {
            scheduler::<H>(Cta::new::<H>(&p), &p);
        }
    } else {
        // SAFETY: the whole consumer warpgroup, convergently; the split fits the CTA's registers
        // (checked by launch_bounds! below).
        unsafe { setmaxnreg_inc::<CONSUMER_REGS>() };
        consumer::<I, H>(Cta::new::<H>(&p), &p, warpgroup_idx() - 1);
    }
}

macro_rules! entry {
    ($name:ident, $elem:ty, $hd:ty, $doc:literal) => {
        #[doc = $doc]
        ///
        /// Launch and parameters: `contract::attention`; another block size, `kv_heads == 0`,
        /// `heads % kv_heads != 0`, `hb_group == 0`, or `n_m` or `tiles` other than the
        /// contract's traps.
        ///
        /// # Safety
        /// The tensor maps describe Q, K, V as the contract says (dtype, rank-4 dims, boxes,
        /// 128-byte swizzle) and stay valid until the kernel completes; `o` addresses O (`[rows,
        /// heads, D]` of the element type, 16-byte aligned, rows = `B * seqlen_q` or total_q)
        /// and `lse` the LSE (f32, `[B, heads, seqlen_q]` or `[heads, total_q]`), overlapping
        /// nothing else; `tmap_o` maps O as the contract says (unused with `FLAG_VARLEN` or
        /// `FLAG_NO_TMA_STORE`); with `FLAG_VARLEN`, `cu_seqlens_q` / `cu_seqlens_k` address `B + 1`
        /// monotone `i32` from 0 up to the packed row counts (`total_q` for Q), each sequence's
        /// length at most `seqlen_q` (the longest); `scale_log2 > 0`; `batch` is B and
        /// `tile_count(seqlen_q, heads, batch) < 2^31`; the grid is `(G, 1, 1)`, any `G >= 1`.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            tmap_q: u64,
            tmap_k: u64,
            tmap_v: u64,
            o: u64,
            lse: u64,
            cu_seqlens_q: u64,
            cu_seqlens_k: u64,
            seqlen_q: u32,
            seqlen_k: u32,
            heads: u32,
            kv_heads: u32,
            total_q: u32,
            scale_log2: f32,
            flags: u32,
            batch: u32,
            hb_group: u32,
            n_m: u32,
            tiles: u32,
            tmap_o: u64,
        ) {
            let p = Params {
                tmap_q,
                tmap_k,
                tmap_v,
                o,
                lse,
                cu_seqlens_q,
                cu_seqlens_k,
                seqlen_q,
                seqlen_k,
                heads,
                kv_heads,
                total_q,
                scale_log2,
                flags,
                batch,
                hb_group,
                n_m,
                tiles,
                tmap_o,
            };
            // SAFETY: the launch contract above.
            unsafe { attention::<$elem, $hd>(p) }
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
    attention_fwd_bf16_d64,
    Bf16,
    D64,
    "Attention forward, BF16, head dim 64."
);
entry!(
    attention_fwd_bf16_d128,
    Bf16,
    D128,
    "Attention forward, BF16, head dim 128."
);
entry!(
    attention_fwd_f16_d64,
    F16,
    D64,
    "Attention forward, FP16, head dim 64."
);
entry!(
    attention_fwd_f16_d128,
    F16,
    D128,
    "Attention forward, FP16, head dim 128."
);

/// The register-A wgmma check (`contract::attention::RS_CHECK_KERNEL`): `D = A B` through the
/// accumulator -> A-fragment path and an MN-major, 128-byte-swizzled, two-chunk B, as the
/// kernel's `O += P V` uses them.
///
/// # Safety
/// `a`: 64 x 16 readable f32; `b`: 16 x 128 readable u16 (BF16 bits); `d`: 64 x 128 writable
/// f32; all 4-byte aligned, `d` overlapping neither. Launch: one CTA of `RS_CHECK_THREADS`
/// threads with `RS_CHECK_SMEM_BYTES` of dynamic shared memory (another block size traps).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn rs_wgmma_check(a: *const f32, b: *const u16, d: *mut f32) {
    if block_dim_x() != RS_CHECK_THREADS {
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    let smem = (dynamic_smem_base() + SWIZZLE_ALIGN as u32 - 1) & !(SWIZZLE_ALIGN as u32 - 1);
    let tid = thread_idx_x();
    // B into shared memory: row r (k), 16-byte piece p of chunk c at
    // c * CHUNK + r * 128 + ((p ^ (r % 8)) * 16), two 4-byte words at a time.
    let mut w = tid;
    while w < 16 * 128 / 2 {
        let (r, col) = (w / 64, (w % 64) * 2); // word w: columns col, col + 1 of row r
        let (c, p, within) = (col / 64, (col % 64) / 8, (col % 8) * 2);
        // SAFETY: r < 16, col + 1 < 128: inside B (contract).
        let (lo, hi) = unsafe {
            (
                b.add((r * 128 + col) as usize).read() as u32,
                b.add((r * 128 + col + 1) as usize).read() as u32,
            )
        };
        let at = smem + c * RS_CHECK_CHUNK_BYTES as u32 + r * 128 + ((p ^ (r % 8)) * 16) + within;
        // SAFETY: inside the launch's dynamic shared memory (2 chunks after the aligned base);
        // each word written by one thread.
        unsafe { crate::device::smem::Shared::<u32>::at(at).store(lo | hi << 16) };
        w += RS_CHECK_THREADS;
    }
    crate::device::bulk::fence_proxy_async_shared();
    // SAFETY: every thread of the CTA, converged.
    unsafe { crate::device::thread::sync_threads() };
    // A through the accumulator layout of m64nNk16 (n8 blocks 0 and 1 = columns 0..16).
    let (warp, lane) = (tid / 32, tid % 32);
    let row = 16 * warp + lane / 4;
    let col = 2 * (lane % 4);
    let at = |r: u32, c: u32| -> f32 {
        // SAFETY: r < 64, c < 16: inside A (contract).
        unsafe { a.add((r * 16 + c) as usize).read() }
    };
    let acc = [
        at(row, col),
        at(row, col + 1),
        at(row + 8, col),
        at(row + 8, col + 1),
        at(row, 8 + col),
        at(row, 8 + col + 1),
        at(row + 8, 8 + col),
        at(row + 8, 8 + col + 1),
    ];
    let frag = AFragment::from_acc_bf16(&acc, 0);
    const ZERO: [f32; 64] = [0.0; 64];
    let mut out = ZERO;
    let desc = MatrixDescriptor::new(smem, RS_CHECK_CHUNK_BYTES as u32, ATOM_BYTES, Swizzle::B128);
    wgmma::fence_operands(&mut out);
    // SAFETY: the whole warpgroup (the CTA), convergently; B was written by generic stores,
    // fenced for the async proxy and published by the barrier above; nothing writes it again.
    unsafe {
        wgmma::fence();
        wgmma::mma_async_rs_m64n128k16_f32_bf16::<1>(&mut out, frag, desc, 0);
        wgmma::commit_group();
        wgmma::wait_group::<0>();
    }
    wgmma::fence_operands(&mut out);
    blocks16!(I {
        unroll!(J in [0 1 2 3] {
            let r = row + 8 * (J as u32 / 2);
            let c = 8 * I as u32 + col + (J as u32 % 2);
            // SAFETY: r < 64, c < 128: inside D (contract); one writer per element.
            unsafe { d.add((r * 128 + c) as usize).write(out[4 * I + J]) };
        });
    });
}
crate::device::launch_bounds!(rs_wgmma_check, RS_CHECK_THREADS, 1);
