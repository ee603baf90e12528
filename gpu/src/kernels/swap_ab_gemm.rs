//! Swap-AB tensor-core GEMM with split-K across a cluster (issue 20): `C = A * B` for few rows of
//! A (the tokens of LLM decoding, M from 1 to a few hundred), computed as `C^T = B^T A^T` so the
//! weights fill wgmma's 64-row M and the tokens become its N (8 to 128). Shapes, layouts and
//! parameters: `contract::swap_ab_gemm`.
//!
//! ```text
//!   producer (warp 4, one thread)              consumer (warpgroup 0: the tile's 64 weight rows)
//!   this CTA's k-blocks (its K slice):         per k-block:
//!     ring.producer_acquire(stage) <-empty--     ring.consumer_release_local(previous stage)
//!     [FLAG_WEIGHTS_EARLY: first stages' W       ring.consumer_wait(stage); 4 x wgmma m64nNTk16
//!      before griddepcontrol.wait;             [consumer named barrier] partial tile (f32)
//!      FLAG_TRIGGER_AT_WAIT: launch_dependents   -> own shared memory, over the ring's start
//!      right after it, else after the last load]
//!     TMA W {k, n0} (FLAG_W_TILED: {0, (tile * k_blocks + kb) * 64}), X {k, m0}  -full-->
//!   cluster barrier; CTA r adds the ksplit partials of its tokens r NT / ksplit ..
//!   (r + 1) NT / ksplit over DSMEM (ranks
//!   0, 1, .. in order), epilogue (alpha, bias, SiLU / GELU / SwiGLU, beta * C), stores; cluster
//!   barrier (no CTA exits while a peer reads its partials)
//! ```
//!
//! Why this form for small M: a 128 x 256 output tile wastes most of its rows at M <= 64 and the
//! grid has too few tiles to fill 132 SMs; here a CTA's tile is 64 weight rows by `NT` tokens,
//! and the `ksplit` CTAs of a cluster stream disjoint K slices of the same 64 weight rows, so
//! `ceil(N / 64) * ksplit * ceil(M / NT)` CTAs (two per SM up to 64 tokens) read each weight
//! byte once. The reduction stays
//! on chip (distributed shared memory, chapter 11's cluster tools) and is deterministic.

use crate::contract::swap_ab_gemm::*;
use crate::contract::F32_BYTES;
use crate::device::cluster;
use crate::device::math::{bf16_to_f32, exp_approx, pack_bf16x2, tanh_approx};
use crate::device::mbarrier;
use crate::device::pdl;
use crate::device::pipeline::{PipelineState, TmaPipeline};
use crate::device::smem::{
    dynamic_smem_base, store_global, store_global_b64, store_global_v2, store_global_v4, Shared,
};
use crate::device::thread::{block_dim_x, block_idx_x, thread_idx_x};
use crate::device::tma::TensorMap;
use crate::device::warpgroup::{thread_in_warpgroup, NamedBarrier};
use crate::device::wgmma::{self, Accumulators, MatrixDescriptor, Swizzle};

use super::qkv_store::QkvArgs;

/// `$body` once for each `$i` in the list, as a constant.
macro_rules! unroll {
    ($i:ident in [$($v:literal),*] $body:block) => {
        $( { const $i: usize = $v; $body } )*
    };
}

/// One 128-byte-swizzle atom (8 rows of 128 bytes): wgmma's stride-dimension byte offset.
const ATOM_BYTES: u32 = 8 * 128;
/// `WGMMA_K` slices per stage.
const K_SLICES: u32 = (BK / WGMMA_K) as u32;
/// Bytes between consecutive token rows of the partial tile.
const PARTIAL_ROW_BYTES: u32 = (PARTIAL_PITCH * F32_BYTES) as u32;
/// Consumer threads: they store the partials and run the reduction.
const CONSUMER_THREADS: u32 = CONSUMER_WARPGROUPS * WARPGROUP_THREADS;
/// Named barrier of the consumer threads before they write the partial tile over the ring.
const PARTIAL_BARRIER: u32 = 1;

/// The token tile `NT` of an entry: its wgmma and its accumulator fragment.
struct Tok<const NT: u32>;

/// What differs between token tiles: the accumulator array and the wgmma shape.
trait TokenTile {
    type Acc: Accumulators + Copy;
    const ZERO: Self::Acc;
    /// Independent accumulator chains of the mainloop (1, 2 or 4; `k`-slice `s` of a stage
    /// goes to chain `s % CHAINS`). One chain makes the stage's four wgmmas wait for each
    /// other (each accumulates into the registers the previous one writes), so at small `NT`
    /// a stage costs four wgmma latencies though the tensor core is idle most of it.
    const CHAINS: usize;
    /// `d += o`, element by element.
    fn add(d: &mut Self::Acc, o: &Self::Acc);
    /// `wgmma.m64nNTk16.f32.bf16.bf16`, A and B K-major.
    ///
    /// # Safety
    /// As the `wgmma::mma_async_*` functions.
    unsafe fn mma(d: &mut Self::Acc, a: MatrixDescriptor, b: MatrixDescriptor, scale_d: u32);
    /// Stores this thread's fragment into the partial tile. `base` is the shared address of
    /// (token `2 * (lane % 4)`, weight row `64 * wg + 16 * warp + lane / 4`).
    ///
    /// # Safety
    /// `base` as described, inside the partial tile, which no one else accesses meanwhile.
    unsafe fn store_partial(d: &Self::Acc, base: u32);
}

/// `token_tile!(NT, ACC, mma fn, [n8 blocks])`: [`TokenTile`] for `Tok<NT>` with literal indices
/// only, so the fragment stays in registers. Fragment layout (`m64nNk16`, PTX ISA §9.7.15.5.1):
/// `d[4 i + j]` is weight row `l / 4 + 8 (j / 2)` (within the warp's 16), token `8 i + 2 (l % 4)
/// + j % 2`.
macro_rules! token_tile {
    ($nt:literal, $acc:literal, $chains:literal, $mma:ident, [$($i:literal)*]) => {
        impl TokenTile for Tok<$nt> {
            type Acc = [f32; $acc];
            const ZERO: [f32; $acc] = [0.0; $acc];
            const CHAINS: usize = $chains;
            #[inline(always)]
            fn add(d: &mut [f32; $acc], o: &[f32; $acc]) {
                let mut j = 0;
                while j < $acc {
                    d[j] += o[j];
                    j += 1;
                }
            }
            /// # Safety
            /// As [`TokenTile::mma`].
            #[inline(always)]
            unsafe fn mma(d: &mut [f32; $acc], a: MatrixDescriptor, b: MatrixDescriptor, scale_d: u32) {
                // SAFETY: the caller's contract; both operands K-major (TRANS_B = 0).
                unsafe { wgmma::$mma::<0>(d, a, b, scale_d) }
            }
            /// # Safety
            /// As [`TokenTile::store_partial`].
            #[inline(always)]
            unsafe fn store_partial(d: &[f32; $acc], base: u32) {
                $(
                    let row = base + 8 * $i * PARTIAL_ROW_BYTES;
                    // SAFETY: tokens 8 i + {0, 1} (+ 2 (lane % 4)) < NT and weight rows
                    // {0, 8} + the thread's row < W_ROWS: inside the partial tile (caller).
                    unsafe {
                        Shared::<f32>::at(row).store(d[4 * $i]);
                        Shared::<f32>::at(row + PARTIAL_ROW_BYTES).store(d[4 * $i + 1]);
                        Shared::<f32>::at(row + 8 * 4).store(d[4 * $i + 2]);
                        Shared::<f32>::at(row + PARTIAL_ROW_BYTES + 8 * 4).store(d[4 * $i + 3]);
                    }
                )*
            }
        }
    };
}

// Chains: four (one per k-slice) up to 32 tokens, where a wgmma's latency dwarfs its tensor-core
// time; two at 64 and one at 128 tokens (the registers: 64 f32 per chain there).
token_tile!(8, 4, 4, mma_async_m64n8k16_f32_bf16, [0]);
token_tile!(16, 8, 4, mma_async_m64n16k16_f32_bf16, [0 1]);
token_tile!(32, 16, 4, mma_async_m64n32k16_f32_bf16, [0 1 2 3]);
token_tile!(64, 32, 2, mma_async_m64n64k16_f32_bf16, [0 1 2 3 4 5 6 7]);
token_tile!(128, 64, 1, mma_async_m64n128k16_f32_bf16, [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]);

/// What every role of the CTA knows.
#[derive(Clone, Copy)]
struct Gemm<const NT: u32, const S: u32> {
    w: TensorMap,
    x: TensorMap,
    c: u64,
    bias: u64,
    m: u32,
    n: u32,
    ldc: u32,
    alpha: f32,
    beta: f32,
    out_f32: bool,
    epilogue: u32,
    flags: u32,
    /// `%globaltimer` stamp buffer (null: none); slot `flags >> STAMP_SLOT_SHIFT`.
    stamps: *mut u64,
    /// The fused RMSNorm's argument block (`NORM_ARGS_WORDS` u64; with `FLAG_NORM_IN` or
    /// `FLAG_NORM_OUT`).
    norm: u64,
    /// `ceil(K / BK)`.
    k_blocks: u32,
    /// This CTA's K slice: k-blocks `kb0 .. kb0 + kbs`.
    kb0: u32,
    kbs: u32,
    /// First weight row (column of C) and first token of the tile.
    n0: u32,
    m0: u32,
    rank: u32,
    ksplit: u32,
    /// 1024-byte aligned shared-window base of the layout.
    smem: u32,
    ring: TmaPipeline<S>,
}

impl<const NT: u32, const S: u32> Gemm<NT, S> {
    #[inline(always)]
    fn w_stage(self, s: PipelineState<S>) -> u32 {
        self.smem + s.stage() * W_STAGE_BYTES as u32
    }
    #[inline(always)]
    fn x_stage(self, s: PipelineState<S>) -> u32 {
        self.smem + (x_offset(NT) + s.stage() as usize * x_stage_bytes(NT)) as u32
    }
    #[inline(always)]
    fn partial(self) -> u32 {
        self.smem + partial_offset(NT) as u32
    }
    /// Shared copy of argument word `i` of the fused RMSNorm's block.
    #[inline(always)]
    fn norm_word(self, i: u32) -> u32 {
        self.smem + norm_offset(NT) as u32 + 8 * i
    }
    /// Argument word `i` of the fused RMSNorm's block, from its shared copy.
    ///
    /// # Safety
    /// The prologue copied word `i` before a barrier this thread passed.
    #[inline(always)]
    unsafe fn norm_u64(self, i: u32) -> u64 {
        // SAFETY: the caller's contract; two u32 inside norm_bytes(NT).
        unsafe {
            Shared::<u32>::at(self.norm_word(i)).load() as u64
                | (Shared::<u32>::at(self.norm_word(i) + 4).load() as u64) << 32
        }
    }
    /// Shared row scale of the tile's token `t`.
    #[inline(always)]
    fn row_scale(self, t: u32) -> Shared<f32> {
        Shared::<f32>::at(self.smem + (norm_offset(NT) + NORM_ARGS_WORDS * 8) as u32 + 4 * t)
    }
    /// Shared copy of `gamma[n0 + 4 j .. n0 + 4 j + 4]` (8 bytes; zeros past N).
    #[inline(always)]
    fn gamma_word(self, j: u32) -> u32 {
        self.smem + (norm_offset(NT) + NORM_ARGS_WORDS * 8) as u32 + 4 * NT + 8 * j
    }
}

/// The consumer warpgroup's prologue of the fused RMSNorm (`FLAG_NORM_OUT`, `FLAG_NORM_IN`),
/// before the mainloop, while the first stages are in flight (shared memory written here is
/// read only after the cluster barrier that ends the mainloop):
/// - `FLAG_NORM_OUT`: threads 0..16 copy the tile's 64 `gamma` values and threads 16..20 the
///   argument block's output words into shared memory. Both are written by no kernel (the host
///   wrote the block, gamma is a weight), so this runs before `griddepcontrol.wait`.
/// - `FLAG_NORM_IN`: after `griddepcontrol.wait` (the previous kernel wrote the sums of
///   squares; the consumers have nothing to do before the first token tile, which follows that
///   wait too), 16 threads per token add its partials (4 at a time when `parts_in % 4 == 0`;
///   the first 64 partials of every token of the tile loaded before any is added: one L2 round
///   trip), a butterfly over the 16 gives the row's sum, and the first writes the token's row
///   scale `1 / sqrt(sum / n_in + eps)` (0 past M).
///
/// Every consumer thread runs the same trip counts, so all 32 lanes reach each shuffle.
///
/// # Safety
/// `g.norm` is the address of an argument block as `contract::swap_ab_gemm::NORM_ARGS_WORDS`
/// says; with `FLAG_NORM_IN` its `ss_in` holds `M x parts_in` f32 (16-byte aligned); `tid` is
/// the thread's index in the consumer warpgroup.
#[inline(always)]
unsafe fn norm_prologue<const NT: u32, const S: u32>(g: Gemm<NT, S>, tid: u32) {
    let blk = g.norm as *const u64;
    if g.flags & FLAG_NORM_OUT != 0 {
        const GAMMA_THREADS: u32 = (W_ROWS / 4) as u32;
        if tid < GAMMA_THREADS {
            // SAFETY: word 3 of the block: gamma, N bf16.
            let gamma = unsafe { blk.add(3).read() } as *const u16;
            let mut v = [0u16; 4];
            let mut e = 0;
            while e < 4 {
                let n = g.n0 + 4 * tid + e;
                if n < g.n {
                    // SAFETY: n < N: inside gamma.
                    v[e as usize] = unsafe { gamma.add(n as usize).read() };
                }
                e += 1;
            }
            // SAFETY: 8 bytes of the tile's gamma words (norm_bytes(NT)), one writer each.
            unsafe {
                Shared::<u32>::at(g.gamma_word(tid)).store(v[0] as u32 | (v[1] as u32) << 16);
                Shared::<u32>::at(g.gamma_word(tid) + 4).store(v[2] as u32 | (v[3] as u32) << 16);
            }
        } else if tid < GAMMA_THREADS + 4 {
            let i = tid - GAMMA_THREADS + 4;
            // SAFETY: word i (4..8) of the block (caller).
            let w = unsafe { blk.add(i as usize).read() };
            // `normed` 8-byte aligned and `ld_out` a multiple of 4: the epilogue's 8-byte
            // stores of 4 bf16 (the launch contract; a violation traps).
            if (i == 4 && !w.is_multiple_of(8)) || (i == 6 && !(w as u32).is_multiple_of(4)) {
                // SAFETY: `trap` aborts the kernel; no preconditions.
                unsafe { core::arch::nvptx::trap() };
            }
            // SAFETY: the shared word lies in norm_bytes(NT), one writer.
            unsafe {
                Shared::<u32>::at(g.norm_word(i)).store(w as u32);
                Shared::<u32>::at(g.norm_word(i) + 4).store((w >> 32) as u32);
            }
        }
    }
    if g.flags & FLAG_NORM_IN == 0 {
        return;
    }
    pdl::wait();
    // SAFETY: words 0..3 of the block (caller).
    let (ss, parts, w2) = unsafe { (blk.read(), blk.add(1).read() as u32, blk.add(2).read()) };
    let n_in = (w2 as u32) as f32;
    let eps = f32::from_bits((w2 >> 32) as u32);
    const GROUP: u32 = (W_ROWS / 4) as u32;
    // Rounds of 8 tokens (CONSUMER_THREADS / GROUP); at most 16 (NT = 128).
    const MAX_ROUNDS: usize = 16;
    let rounds = NT * GROUP / CONSUMER_THREADS;
    let vec4 = parts.is_multiple_of(4) && (ss as usize).is_multiple_of(16);
    let lane16 = tid % GROUP;
    let row_of = |round: u32| -> (u32, *const f32) {
        let t = (round * CONSUMER_THREADS + tid) / GROUP;
        let m = g.m0 + t;
        (
            m,
            (ss as *const f32).wrapping_add(m as usize * parts as usize),
        )
    };
    // Every round's first chunk (partials 4 lane16 .. + 4: all of a row up to 64 partials, a
    // hidden size up to 4096) is loaded before any is added: one L2 round trip for the tile.
    // Constant indices only (`unroll!`), so `first` stays in registers.
    let mut first = [[0u32; 4]; MAX_ROUNDS];
    if vec4 && 4 * lane16 < parts {
        unroll!(R in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            let (m, row) = row_of(R as u32);
            if (R as u32) < rounds && m < g.m {
                // SAFETY: partials 4 lane16 .. + 4 of row m < M (caller), 16-byte aligned
                // (checked above).
                first[R] = unsafe {
                    crate::device::mma::ld_global_cg_v4(row.add(4 * lane16 as usize) as *const u32)
                };
            }
        });
    }
    // Then each round's sums: constant round indices again, so `first[R]` is a register.
    unroll!(R in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
        if (R as u32) < rounds {
            let (m, row) = row_of(R as u32);
            let t = (R as u32 * CONSUMER_THREADS + tid) / GROUP;
            let mut sum = 0.0f32;
            if m < g.m {
                if vec4 {
                    let q = first[R];
                    sum = (f32::from_bits(q[0]) + f32::from_bits(q[1]))
                        + (f32::from_bits(q[2]) + f32::from_bits(q[3]));
                    // Rows of more than 64 partials: the further chunks, one at a time.
                    let mut c = lane16 + GROUP;
                    while 4 * c < parts {
                        // SAFETY: as above, chunk c of row m.
                        let q = unsafe {
                            crate::device::mma::ld_global_cg_v4(row.add(4 * c as usize) as *const u32)
                        };
                        sum += (f32::from_bits(q[0]) + f32::from_bits(q[1]))
                            + (f32::from_bits(q[2]) + f32::from_bits(q[3]));
                        c += GROUP;
                    }
                } else {
                    let mut p = lane16;
                    while p < parts {
                        // SAFETY: partial p of row m < M (caller).
                        sum += unsafe { row.add(p as usize).read() };
                        p += GROUP;
                    }
                }
            }
            let mut mask = 1;
            while mask < GROUP {
                // SAFETY: every lane of the warpgroup runs the same rounds and this loop (uniform
                // bounds); masks below 16 keep each token's 16 aligned lanes together.
                sum += unsafe { crate::device::warp::shfl_xor_f32(sum, mask) };
                mask <<= 1;
            }
            if lane16 == 0 {
                let scale = if m < g.m {
                    1.0 / crate::device::math::sqrt(sum / n_in + eps)
                } else {
                    0.0
                };
                // SAFETY: t < NT: inside the row-scale words; one writer per token.
                unsafe { g.row_scale(t).store(scale) };
            }
        }
    });
}

/// Producer (one thread): this CTA's k-blocks of W and X. With [`FLAG_WEIGHTS_EARLY`] the first
/// stages' weight tiles are requested before `griddepcontrol.wait` (their full barriers armed
/// for W and X together) and the token tiles follow the wait.
#[inline(always)]
fn producer<const NT: u32, const S: u32>(g: Gemm<NT, S>) {
    g.w.acquire();
    g.x.acquire();
    let tx = (W_STAGE_BYTES + x_stage_bytes(NT)) as u32;
    let k0 = |i: u32| ((g.kb0 + i) * BK as u32) as i32;
    // The weight tile of this CTA's k-block `i`: `{k, n0}` of B, or with FLAG_W_TILED row
    // `(tile * k_blocks + kb) * W_ROWS` of the tiled buffer.
    let tiled = g.flags & FLAG_W_TILED != 0;
    let w_at = |i: u32| -> (i32, i32) {
        if tiled {
            let row = ((g.n0 / W_ROWS as u32) * g.k_blocks + g.kb0 + i) * W_ROWS as u32;
            (0, row as i32)
        } else {
            (k0(i), g.n0 as i32)
        }
    };
    let mut st = PipelineState::<S>::new();
    let early = if g.flags & FLAG_WEIGHTS_EARLY != 0 {
        g.kbs.min(S)
    } else {
        0
    };
    let mut i = 0;
    while i < early {
        let full = g.ring.producer_acquire(st, tx);
        // SAFETY: the stage is free (first use), 1024-byte aligned; its full barrier is armed for
        // W and X, and X follows below; the launcher vouched that no earlier kernel writes W.
        unsafe {
            let (c0, c1) = w_at(i);
            g.w.load_2d(g.w_stage(st), c0, c1, full)
        };
        st.advance();
        i += 1;
    }
    // X (and W without the flag) may be written by the previous kernel on the stream (PDL).
    pdl::wait();
    // SAFETY: stamps is null or the launch's stamp buffer (launch contract).
    unsafe {
        stamp_by(g.stamps, g.flags >> STAMP_SLOT_SHIFT, 1);
        stamp_by(g.stamps, g.flags >> STAMP_SLOT_SHIFT, 2);
    }
    let trigger_at_wait = g.flags & FLAG_TRIGGER_AT_WAIT != 0;
    if trigger_at_wait {
        pdl::launch_dependents();
    }
    let mut early_st = PipelineState::<S>::new();
    let mut j = 0;
    while j < early {
        // SAFETY: the stage's full barrier was armed above for this X box too.
        unsafe {
            g.x.load_2d(
                g.x_stage(early_st),
                k0(j),
                g.m0 as i32,
                g.ring.full(early_st),
            )
        };
        early_st.advance();
        j += 1;
    }
    while i < g.kbs {
        let full = g.ring.producer_acquire(st, tx);
        // SAFETY: the stage is free (producer_acquire), 1024-byte aligned, and its full barrier
        // is armed for exactly these two boxes; boxes past N, M or K read zeros (row-major W;
        // with FLAG_W_TILED every W box lies inside the map and the padding past N and K is
        // zeros by the flag's contract).
        unsafe {
            let (c0, c1) = w_at(i);
            g.w.load_2d(g.w_stage(st), c0, c1, full);
            g.x.load_2d(g.x_stage(st), k0(i), g.m0 as i32, full);
        }
        st.advance();
        i += 1;
    }
    // Every load is issued: the next kernel's prologue may start.
    if !trigger_at_wait {
        pdl::launch_dependents();
    }
}

/// `fence_operands` on the accumulator chains in use (`TokenTile::CHAINS`), each a constant
/// index so the arrays stay in registers.
#[inline(always)]
fn fence_chains<const NT: u32>(acc: &mut [<Tok<NT> as TokenTile>::Acc; 4])
where
    Tok<NT>: TokenTile,
{
    unroll!(C in [0, 1, 2, 3] {
        if C < <Tok<NT> as TokenTile>::CHAINS {
            acc[C].fence_operands();
        }
    });
}

/// Consumer warpgroup `wg`: weight rows `64 * wg ..` of the tile, all `NT` tokens, over this
/// CTA's K slice; then its partial tile into shared memory.
#[inline(always)]
fn consumer<const NT: u32, const S: u32>(g: Gemm<NT, S>, wg: u32)
where
    Tok<NT>: TokenTile,
{
    // The accumulator chains (`TokenTile::CHAINS` of them in use; the rest stay zero and are
    // optimised away).
    let mut acc = [<Tok<NT> as TokenTile>::ZERO; 4];
    let chains = <Tok<NT> as TokenTile>::CHAINS;
    let tid = thread_in_warpgroup();
    if g.flags & (FLAG_NORM_IN | FLAG_NORM_OUT) != 0 {
        // Not in the producer warp: a lane of it waiting in `griddepcontrol.wait` beside the
        // producer held the whole warp, so the early weight loads came after the previous
        // kernel's end (measured on the H200: qkv 18 instead of 12 us at 8 x 4096).
        // SAFETY: the launch contract of the flags (`norm` is an argument block); `tid` is the
        // thread's index in the (only) consumer warpgroup.
        unsafe { norm_prologue(g, tid) };
    }
    let mut st = PipelineState::<S>::new();
    let mut reading = st;
    let mut i = 0;
    while i < g.kbs {
        g.ring.consumer_wait(st);
        let a = MatrixDescriptor::new(
            g.w_stage(st) + wg * (WG_ROWS * BK * IN_BYTES) as u32,
            16,
            ATOM_BYTES,
            Swizzle::B128,
        );
        let b = MatrixDescriptor::new(g.x_stage(st), 16, ATOM_BYTES, Swizzle::B128);
        fence_chains::<NT>(&mut acc);
        // SAFETY: all 128 threads run this loop with the same trip count and descriptors; the
        // stage holds W and X as the descriptors say (consumer_wait) and is released only after
        // a wait_group that covers these wgmmas.
        unsafe {
            wgmma::fence();
            // k-slice K of the stage into chain K % chains, which starts (scale_d 0) at its
            // first slice of the first stage.
            const { assert!(K_SLICES == 4) };
            unroll!(K in [0, 1, 2, 3] {
                let scale_d = !(i == 0 && K < chains) as u32;
                let (ka, kb) = (a.offset(K as u32 * 32), b.offset(K as u32 * 32));
                <Tok<NT> as TokenTile>::mma(&mut acc[K % chains], ka, kb, scale_d);
            });
            wgmma::commit_group();
            wgmma::wait_group::<1>();
        }
        if i > 0 && tid == 0 {
            g.ring.consumer_release_local(reading);
        }
        reading = st;
        st.advance();
        i += 1;
    }
    // SAFETY: warpgroup-collective, as above. The last stage needs no release: nobody refills it.
    unsafe { wgmma::wait_group::<0>() };
    // The partial tile reuses the ring (`partial_offset`): every TMA write into the ring has
    // completed (each stage's full barrier was waited on, and the producer loads nothing past
    // `kbs`), and after this barrier no wgmma of any warp still reads it.
    // SAFETY: barrier PARTIAL_BARRIER is used only here, by the consumer threads, whole
    // warps convergently (every consumer thread runs the same mainloop trip count).
    unsafe { NamedBarrier::new(PARTIAL_BARRIER, CONSUMER_THREADS) }.sync();
    fence_chains::<NT>(&mut acc);
    // The chains' sum, in a fixed order: (0 + 1) + (2 + 3).
    let [mut acc, a1, mut a2, a3] = acc;
    if chains > 1 {
        <Tok<NT> as TokenTile>::add(&mut acc, &a1);
    }
    if chains > 2 {
        <Tok<NT> as TokenTile>::add(&mut a2, &a3);
        <Tok<NT> as TokenTile>::add(&mut acc, &a2);
    }
    let (warp, lane) = (tid / 32, tid % 32);
    let base = g.partial()
        + 2 * (lane % 4) * PARTIAL_ROW_BYTES
        + (wg * WG_ROWS as u32 + 16 * warp + lane / 4) * 4;
    // SAFETY: the base of this thread's fragment in the partial tile, which only the consumers
    // write (each element once) before the cluster barrier that precedes every read.
    unsafe { <Tok<NT> as TokenTile>::store_partial(&acc, base) };
}

/// Consumer thread `tid` (0..CONSUMER_THREADS) after the cluster barrier: sums the `ksplit` partials of
/// rank `r`'s tokens `r * NT / ksplit .. (r + 1) * NT / ksplit`, four weight rows at a time, and
/// stores the epilogue.
/// With `FLAG_NORM_OUT` it also stores `bf16(c * gamma)` and, per token, the sum of squares of
/// the tile's 64 BF16 outputs: the 16 threads of a token (aligned half-warps: 16 consecutive
/// `q`) add theirs by a butterfly and the first writes it. Every thread runs the same number of
/// rounds, so all 32 lanes reach each shuffle.
#[inline(always)]
fn reduce_store<const NT: u32, const S: u32>(g: Gemm<NT, S>, tid: u32) {
    // Rank r's tokens: [r NT / ksplit, (r + 1) NT / ksplit) (uneven for a cluster of 3).
    let tok0 = g.rank * NT / g.ksplit;
    let per = (g.rank + 1) * NT / g.ksplit - tok0;
    const ROW_GROUPS: u32 = (W_ROWS / 4) as u32;
    let groups = per * ROW_GROUPS;
    let norm_out = g.flags & FLAG_NORM_OUT != 0;
    // FLAG_NORM_OUT's `normed` (pitch `ld_out`) and `ss_out` (pitch `parts_out`), read once.
    let (normed, ld_out, ss_out, parts_out) = if norm_out {
        // SAFETY: words 4, 5 and 6, copied by the prologue before the cluster barrier.
        let (w4, w5, w6) = unsafe { (g.norm_u64(4), g.norm_u64(5), g.norm_u64(6)) };
        (w4 as *mut u16, w6 as u32, w5 as *mut f32, (w6 >> 32) as u32)
    } else {
        (core::ptr::null_mut(), 0, core::ptr::null_mut(), 0)
    };
    let rounds = groups.div_ceil(CONSUMER_THREADS);
    let mut round = 0;
    while round < rounds {
        let q = tid + round * CONSUMER_THREADS;
        let tok = tok0 + q / ROW_GROUPS;
        let row4 = (q % ROW_GROUPS) * 4;
        let (m, n) = (g.m0 + tok, g.n0 + row4);
        let mut sq = 0.0f32;
        if q < groups && m < g.m && n < g.n {
            let local = g.partial() + tok * PARTIAL_ROW_BYTES + row4 * 4;
            let mut v = [0.0f32; 4];
            let mut r = 0;
            while r < g.ksplit {
                // SAFETY: 16 aligned bytes of CTA r's partial tile (same layout), written before
                // the cluster barrier this thread passed; r does not exit before the next one.
                let p = unsafe { cluster::load_v4(cluster::map_shared_rank(local, r)) };
                v = [v[0] + p[0], v[1] + p[1], v[2] + p[2], v[3] + p[3]];
                r += 1;
            }
            // SAFETY: m < M, n < N, n a multiple of 4 (the launch contract for C and bias).
            let out = unsafe { epilogue(g, m, n, v) };
            if norm_out {
                // SAFETY: as above; FLAG_NORM_OUT's contract (EPI_NONE, BF16 C; `normed` and
                // `ld_out` from the block; the gamma words copied before the cluster barrier).
                sq = unsafe { norm_store(g, m, n, out, normed, ld_out) };
            }
        }
        if norm_out {
            let mut mask = 1;
            while mask < ROW_GROUPS {
                // SAFETY: every lane of the warp runs `rounds` rounds and this loop in each
                // (uniform bounds); lanes 16 apart are never combined (masks below 16).
                sq += unsafe { crate::device::warp::shfl_xor_f32(sq, mask) };
                mask <<= 1;
            }
            if q < groups && q.is_multiple_of(ROW_GROUPS) && m < g.m {
                let at = m as usize * parts_out as usize + (g.n0 / W_ROWS as u32) as usize;
                // SAFETY: ss_out holds M x parts_out f32 (the block); row m < M, tile n0 / 64 <
                // parts_out: one writer per (token, tile) over the grid.
                unsafe { store_global(ss_out.add(at), sq) };
            }
        }
        round += 1;
    }
}

/// `FLAG_NORM_OUT`: stores `bf16(bf16(c) * gamma)` of outputs `n .. n + 4` (those below N) of
/// token `m` into `normed` and returns the sum of their BF16 values' squares.
///
/// # Safety
/// As [`epilogue`]; the tile's gamma is in shared memory; `normed` holds M rows of pitch `ld`,
/// 8-byte aligned, `ld % 4 == 0`.
#[inline(always)]
unsafe fn norm_store<const NT: u32, const S: u32>(
    g: Gemm<NT, S>,
    m: u32,
    n: u32,
    c: [f32; 4],
    normed: *mut u16,
    ld: u32,
) -> f32 {
    // SAFETY: the tile's gamma words (caller: copied before the cluster barrier).
    let gw = unsafe {
        let at = g.gamma_word((n - g.n0) / 4);
        [
            Shared::<u32>::at(at).load(),
            Shared::<u32>::at(at + 4).load(),
        ]
    };
    let gamma = [
        bf16_to_f32(gw[0] as u16),
        bf16_to_f32((gw[0] >> 16) as u16),
        bf16_to_f32(gw[1] as u16),
        bf16_to_f32((gw[1] >> 16) as u16),
    ];
    let valid = (g.n - n).min(4) as usize;
    let mut y = [0.0f32; 4];
    let mut sq = 0.0f32;
    let mut e = 0;
    while e < valid {
        let cb = bf16_to_f32(pack_bf16x2(c[e], 0.0) as u16);
        sq += cb * cb;
        y[e] = cb * gamma[e];
        e += 1;
    }
    // SAFETY: row m, columns n .. n + valid of normed (caller), one writer, 8-byte aligned
    // (n % 4 == 0, ld % 4 == 0, base 8-byte aligned).
    unsafe {
        store_bf16(
            normed.add(m as usize * ld as usize + n as usize),
            &y,
            valid as u32,
        )
    };
    sq
}

/// `p[e] = bf16(y[e])` for `e < count`: one vector store when all `L` (2 or 4) are written,
/// else element by element.
///
/// # Safety
/// `p .. p + count` are writable by this thread only; `p` is `2 L`-byte aligned.
#[inline(always)]
unsafe fn store_bf16<const L: usize>(p: *mut u16, y: &[f32; L], count: u32) {
    // SAFETY: the caller's contract in every arm.
    unsafe {
        if count as usize == L && L == 4 {
            let lo = pack_bf16x2(y[0], y[1 % L]) as u64;
            let hi = pack_bf16x2(y[2 % L], y[3 % L]) as u64;
            store_global_b64(p as *mut u64, lo | hi << 32);
        } else if count as usize == L && L == 2 {
            (p as *mut u32).write(pack_bf16x2(y[0], y[1 % L]));
        } else {
            let mut e = 0;
            while e < count as usize {
                p.add(e).write(pack_bf16x2(y[e], 0.0) as u16);
                e += 1;
            }
        }
    }
}

#[inline(always)]
fn silu(x: f32) -> f32 {
    x / (1.0 + exp_approx(-x))
}

#[inline(always)]
fn gelu(x: f32) -> f32 {
    // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), Hendrycks and Gimpel's tanh form.
    0.5 * x * (1.0 + tanh_approx(0.797_884_6 * (x + 0.044_715 * x * x * x)))
}

/// Output of weight rows `n .. n + 4` (those below N) for token `m`: `alpha * v` (times the
/// token's row scale with `FLAG_NORM_IN`) `(+ bias)`, the activation, `+ beta * C`, stored as
/// f32 or BF16. Returns the stored values (before rounding) of the plain and SiLU / GELU
/// epilogues, zeros for the others.
///
/// # Safety
/// `m < M`, `n < N`, `n % 4 == 0`; C, `ldc` and `bias` as the launch contract says; with
/// `FLAG_NORM_IN` the row scales are in shared memory.
#[inline(always)]
unsafe fn epilogue<const NT: u32, const S: u32>(
    g: Gemm<NT, S>,
    m: u32,
    n: u32,
    v: [f32; 4],
) -> [f32; 4] {
    let mut a = g.alpha;
    if g.flags & FLAG_NORM_IN != 0 {
        // SAFETY: m - m0 < NT; written by the consumer warpgroup's prologue before the
        // cluster barrier.
        a *= unsafe { g.row_scale(m - g.m0).load() };
    }
    let mut x = [a * v[0], a * v[1], a * v[2], a * v[3]];
    if g.epilogue == EPI_QKV {
        // SAFETY: the launch contract of EPI_QKV: `bias` is the QKV argument block, C is Q
        // (bf16, pitch ldc), the weight rows are packed in RoPE pairs (rows 2i, 2i + 1 of a
        // head: dims i and i + d/2), d a multiple of 4 and N = (heads + 2 kv_heads) d, so rows
        // n .. n + 4 are the pairs i, i + 1 of one head; m < M; one writer per element.
        unsafe {
            let a = QkvArgs::load(g.bias as *const u64);
            let (head, i) = (n as u64 / a.d, (n as u64 % a.d) / 2);
            a.store_pair(g.c as *mut u16, g.ldc as u64, m, head, i, x[0], x[1]);
            a.store_pair(g.c as *mut u16, g.ldc as u64, m, head, i + 1, x[2], x[3]);
        }
        return [0.0; 4];
    }
    let valid = (g.n - n).min(4);
    if g.bias != 0 {
        let mut e = 0;
        while e < valid {
            // SAFETY: n + e < N: inside the bias vector (launch contract).
            x[e as usize] += unsafe { (g.bias as *const f32).add((n + e) as usize).read() };
            e += 1;
        }
    }
    let row = m as u64 * g.ldc as u64;
    if g.epilogue == EPI_SWIGLU {
        // Columns (n, n + 1) and (n + 2, n + 3) are (gate, up) pairs: outputs n / 2, n / 2 + 1
        // (N is even, so a pair is whole when its gate row is inside).
        let y = [silu(x[0]) * x[1], silu(x[2]) * x[3]];
        let count = valid.div_ceil(2);
        // SAFETY: the caller's contract; C has N / 2 columns.
        unsafe { store(g, row + (n / 2) as u64, &y, count) };
        [0.0; 4]
    } else {
        if g.epilogue == EPI_SILU {
            x = [silu(x[0]), silu(x[1]), silu(x[2]), silu(x[3])];
        } else if g.epilogue == EPI_GELU {
            x = [gelu(x[0]), gelu(x[1]), gelu(x[2]), gelu(x[3])];
        }
        // SAFETY: the caller's contract.
        unsafe { store(g, row + n as u64, &x, valid) }
    }
}

/// `C[idx + e] = y[e] + beta * C[idx + e]` for `e < count`: one vector store when all `L` are
/// inside (f32: `L * 4` bytes, BF16: `L * 2` bytes, aligned since `idx` is a multiple of `L`
/// and every row pitch a multiple of 8 elements), else element by element. Returns the stored
/// values (before rounding).
///
/// # Safety
/// Elements `idx .. idx + count` are inside C, `idx % L == 0`, and only this thread writes them.
#[inline(always)]
unsafe fn store<const NT: u32, const S: u32, const L: usize>(
    g: Gemm<NT, S>,
    idx: u64,
    y: &[f32; L],
    count: u32,
) -> [f32; L] {
    let mut out = *y;
    if g.beta != 0.0 {
        let mut e = 0;
        while e < count as usize {
            let at = idx as usize + e;
            // SAFETY: inside C (caller); C holds values when beta != 0 (launch contract).
            let old = unsafe {
                if g.out_f32 {
                    (g.c as *const f32).add(at).read()
                } else {
                    bf16_to_f32((g.c as *const u16).add(at).read())
                }
            };
            out[e] += g.beta * old;
            e += 1;
        }
    }
    // SAFETY: in every arm the elements are inside C with one writer (caller), aligned as
    // documented above.
    unsafe {
        if g.out_f32 {
            let p = (g.c as *mut f32).add(idx as usize);
            if count as usize == L && L == 4 {
                store_global_v4(p, [out[0], out[1 % L], out[2 % L], out[3 % L]]);
            } else if count as usize == L && L == 2 {
                store_global_v2(p, [out[0], out[1 % L]]);
            } else {
                let mut e = 0;
                while e < count as usize {
                    store_global(p.add(e), out[e]);
                    e += 1;
                }
            }
        } else {
            store_bf16((g.c as *mut u16).add(idx as usize), &out, count);
        }
    }
    out
}

/// The entry parameters (see `contract::swap_ab_gemm`).
struct Params {
    tmap_w: u64,
    tmap_x: u64,
    c: u64,
    bias: u64,
    m: u32,
    n: u32,
    k: u32,
    ldc: u32,
    alpha: f32,
    beta: f32,
    out_f32: u32,
    epilogue: u32,
    flags: u32,
    stamps: *mut u64,
    norm: u64,
}

/// The kernel body of every entry.
///
/// # Safety
/// The launch contract of the entries.
#[inline(always)]
unsafe fn swap_ab_gemm<const NT: u32, const S: u32>(p: Params)
where
    Tok<NT>: TokenTile,
{
    let ksplit = cluster::cluster_size();
    // FLAG_NORM_OUT writes `normed` from the plain epilogue's BF16 outputs only.
    let norm_out_bad = p.flags & FLAG_NORM_OUT != 0 && (p.epilogue != EPI_NONE || p.out_f32 != 0);
    if block_dim_x() != THREADS_PER_CTA || !is_ksplit(ksplit) || norm_out_bad {
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    let smem = (dynamic_smem_base() + SWIZZLE_ALIGN as u32 - 1) & !(SWIZZLE_ALIGN as u32 - 1);
    let rank = cluster::cta_rank();
    let k_blocks = p.k.div_ceil(BK as u32);
    // Balanced K slices: rank r takes k-blocks [r * kb / ks, (r + 1) * kb / ks) (kb < 2^26).
    let kb0 = rank * k_blocks / ksplit;
    let kb1 = (rank + 1) * k_blocks / ksplit;
    // SAFETY: reading a special register has no preconditions.
    let by = unsafe { core::arch::nvptx::_block_idx_y() } as u32;
    let g = Gemm::<NT, S> {
        // SAFETY: the launch contract: device addresses of valid tensor maps.
        w: unsafe { TensorMap::at(p.tmap_w) },
        // SAFETY: as above.
        x: unsafe { TensorMap::at(p.tmap_x) },
        c: p.c,
        bias: p.bias,
        m: p.m,
        n: p.n,
        ldc: p.ldc,
        alpha: p.alpha,
        beta: p.beta,
        out_f32: p.out_f32 != 0,
        epilogue: p.epilogue,
        flags: p.flags,
        stamps: p.stamps,
        norm: p.norm,
        k_blocks,
        kb0,
        kbs: kb1 - kb0,
        n0: (block_idx_x() / ksplit) * W_ROWS as u32,
        m0: by * NT,
        rank,
        ksplit,
        smem,
        // SAFETY: the barriers lie inside the launch's smem_bytes(NT), used for nothing else;
        // thread 0 initialises them and fence_init + the cluster barrier publish that before any
        // use; per stage and phase one producer_acquire arms the two boxes' bytes (the early
        // path arms both before loading W, then loads X) and each consumer warpgroup releases
        // once (init count CONSUMER_WARPGROUPS); no other CTA touches this ring.
        ring: unsafe { TmaPipeline::<S>::at(smem + barriers_offset(NT) as u32) },
    };
    let tid = thread_idx_x();
    let slot = p.flags >> STAMP_SLOT_SHIFT;
    if tid == 0 {
        // SAFETY: stamps is null or the launch's stamp buffer (launch contract).
        unsafe { stamp_by(p.stamps, slot, 0) };
        // SAFETY: one thread initialises the barriers before anyone uses them.
        unsafe { g.ring.init(CONSUMER_WARPGROUPS) };
        mbarrier::fence_init();
        g.w.prefetch();
        g.x.prefetch();
    }
    // SAFETY: every thread of the cluster, once (the per-thread form needs no convergence).
    unsafe { cluster::sync_cluster() };
    if tid >= CONSUMER_THREADS {
        if tid == CONSUMER_THREADS {
            producer(g);
        }
    } else {
        consumer(g, tid / WARPGROUP_THREADS);
    }
    // Every CTA's partial tile is written: make them visible to the cluster.
    // SAFETY: every thread of the cluster, once more.
    unsafe { cluster::sync_cluster() };
    if tid < CONSUMER_THREADS {
        // C and the bias may be written by the previous kernel on the stream (PDL).
        pdl::wait();
        reduce_store(g, tid);
    }
    // No CTA exits while a peer may still read its partial tile.
    // SAFETY: every thread of the cluster, once more.
    unsafe { cluster::sync_cluster() };
    if tid == 0 {
        // SAFETY: stamps is null or the launch's stamp buffer (launch contract).
        unsafe { stamp_by(p.stamps, slot, 3) };
    }
}

/// Folds `%globaltimer` into word `word` of stamp slot `slot` (`decode_step::STAMP_WORDS` words
/// per slot: words 0 and 1 keep the minimum over callers, 2 and 3 the maximum); nothing when
/// `stamps` is null. The caller picks the one thread per CTA that stamps.
///
/// # Safety
/// `stamps` is null or holds at least `(slot + 1) * STAMP_WORDS` u64 that only stamps touch
/// during the kernel.
#[inline(always)]
unsafe fn stamp_by(stamps: *mut u64, slot: u32, word: u32) {
    if stamps.is_null() {
        return;
    }
    let a = stamps
        .wrapping_add(slot as usize * crate::contract::decode_step::STAMP_WORDS + word as usize);
    // SAFETY: the caller's contract: a u64 of the stamp buffer that only stamps touch.
    unsafe { crate::device::clock::stamp_word(a, word >= 2) };
}

macro_rules! entry {
    ($name:ident, $nt:literal) => {
        /// Swap-AB BF16 GEMM entry with token tile
        #[doc = concat!(" `NT = ", stringify!($nt), "`.")]
        ///
        /// Launch: grid `(ceil(N / W_ROWS) * ksplit, ceil(M / NT), 1)`, cluster `(ksplit, 1, 1)`
        /// with `ksplit` in `KSPLITS`, `THREADS_PER_CTA` threads, `smem_bytes(NT)` of dynamic
        /// shared memory (`contract::swap_ab_gemm`); another block or cluster size traps.
        ///
        /// # Safety
        /// `tmap_w` / `tmap_x` are device addresses of tensor maps made as the contract says
        /// (BF16, dims `{K, N}` / `{K, M}`, or with `FLAG_W_TILED` `{BK, ceil(N / W_ROWS) *
        /// ceil(K / BK) * W_ROWS}` over zero-padded tiles for `tmap_w`, boxes `W_BOX` /
        /// `x_box(NT)`, 128-byte swizzle),
        /// valid until the kernel completes; `c` / `ldc` address a row-major C of M rows and
        /// `N` (or `N / 2` for `EPI_SWIGLU`, N even) columns of f32 (`out_f32 != 0`) or BF16,
        /// 16-byte aligned, `ldc` a multiple of 8, overlapping neither A nor B; `bias` is 0 or
        /// the address of N f32; `epilogue` is one of the `EPI_*` codes (`EPI_QKV`: C, `bias`
        /// and the weights' row order as `contract::swap_ab_gemm::EPI_QKV` says); with
        /// `FLAG_WEIGHTS_EARLY` no kernel running before this one writes B; `ksplit <=
        /// ceil(K / BK)`; `stamps` is 0 or a stamp buffer of at least `(slot + 1) *
        /// decode_step::STAMP_WORDS` u64 (`slot = flags >> STAMP_SLOT_SHIFT`) that only stamps
        /// touch during the kernel; with `FLAG_NORM_IN` or `FLAG_NORM_OUT` (the decode step's
        /// fused RMSNorm) `norm` is the address of an argument block of `NORM_ARGS_WORDS` u64 as
        /// `contract::swap_ab_gemm::NORM_ARGS_WORDS` says, valid until the kernel completes
        /// (`FLAG_NORM_OUT`: `EPI_NONE` and BF16 C, else the kernel traps; `gamma` holds N
        /// bf16; `normed` holds M rows of `ld_out` bf16, 8-byte aligned, `ld_out` a multiple of
        /// 4 (else it traps); `ss_out` holds `M x ceil(N / 64)` f32; `normed` and `ss_out`
        /// overlap nothing the kernel reads), and with `FLAG_NORM_IN` `ss_in` holds the `M x
        /// parts_in` partials, written before this kernel's `griddepcontrol.wait` returns;
        /// with `FLAG_W_TILED` `tmap_w` maps B's tiled buffer as that flag's contract says.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            tmap_w: u64,
            tmap_x: u64,
            c: u64,
            bias: u64,
            m: u32,
            n: u32,
            k: u32,
            ldc: u32,
            alpha: f32,
            beta: f32,
            out_f32: u32,
            epilogue: u32,
            flags: u32,
            stamps: u64,
            norm: u64,
        ) {
            let p = Params {
                tmap_w,
                tmap_x,
                c,
                bias,
                m,
                n,
                k,
                ldc,
                alpha,
                beta,
                out_f32,
                epilogue,
                flags,
                stamps: stamps as *mut u64,
                norm,
            };
            // SAFETY: the launch contract above.
            unsafe { swap_ab_gemm::<$nt, { stages($nt) as u32 }>(p) }
        }
        crate::device::launch_bounds!($name, THREADS_PER_CTA, 1);
    };
}

entry!(swap_ab_gemm_bf16_n8, 8);
entry!(swap_ab_gemm_bf16_n16, 16);
entry!(swap_ab_gemm_bf16_n32, 32);
entry!(swap_ab_gemm_bf16_n64, 64);
entry!(swap_ab_gemm_bf16_n128, 128);
