//! Attention forward for Hopper (sm_90a, issue 23), FlashAttention-3's structure:
//! `O = softmax(Q K^T * scale [+ causal mask]) V` and the row log-sum-exp. Layouts, parameters
//! and the shared-memory layout: `contract::attention`.
//!
//! One CTA per (128-row Q tile, query head, batch); heavier (later) Q tiles are launched first
//! (`m_block = gridDim.x - 1 - blockIdx.x`), which helps causal launches.
//!
//! ```text
//!   producer (warpgroup 0, one thread)     consumers (warpgroups 1, 2: Q rows 0..64, 64..128)
//!   TMA Q (once)            --q_full-->      wait Q
//!   per key block n:                         prologue: S_0 = Q K_0^T; softmax -> P_0
//!     acquire K stage; TMA K --k full-->     per n >= 1: [turn] S_n = Q K_n^T; O += P_{n-1} V_{n-1}
//!     acquire V stage; TMA V --v full-->       [pass turn]; wait S_n; release K_n; softmax(S_n)
//!                          <--k/v empty--      wait O; release V_{n-1}; O *= correction; P_n
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
//! Not done yet (notes for later): a persistent grid with a longest-first tile scheduler, a TMA
//! store epilogue, 3 stages for head dim 64, larger `BLOCK_N` (FA3 uses 176 for d = 128), a
//! third consumer warpgroup, intra-warpgroup overlap of the epilogue with the next tile.

use core::ops::IndexMut;

use crate::contract::attention::*;
use crate::device::math::{exp2_approx, fma, log2_approx, pack_bf16x2, pack_f16x2};
use crate::device::mbarrier::{self, Mbarrier};
use crate::device::pdl;
use crate::device::pipeline::{PipelineState, TmaPipeline};
use crate::device::smem::dynamic_smem_base;
use crate::device::thread::{block_dim_x, thread_idx_x};
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

/// What every role of the CTA knows about its tile.
#[derive(Clone, Copy)]
struct Tile {
    q: TensorMap,
    k: TensorMap,
    v: TensorMap,
    o: *mut u16,
    lse: *mut f32,
    /// Rows of this batch's Q and K sequences.
    seqlen_q: u32,
    seqlen_k: u32,
    /// First Q row of the tile in its sequence.
    m0: u32,
    head: u32,
    kv_head: u32,
    heads: u32,
    /// Row coordinate of the sequence's first row in the tensor maps (varlen: `cu_seqlens`; else
    /// 0) and batch coordinate (varlen: 0; else the batch).
    q_row_tma: u32,
    k_row_tma: u32,
    batch_tma: u32,
    /// Global row (in `[rows, H, D]`) of the sequence's first Q row, for O.
    q_row_base: u32,
    /// LSE index of (head 0, row 0) of the sequence and the step between heads.
    lse_base: u32,
    lse_head_stride: u32,
    causal: bool,
    /// Ping-pong between the consumer warpgroups (not `FLAG_NO_PINGPONG`; only with overlap).
    pingpong: bool,
    /// `S_n` issued with `P_{n-1} V_{n-1}` (not `FLAG_NO_OVERLAP`).
    overlap: bool,
    /// `seqlen_k - seqlen_q`: query `i` sees key `j` iff `j <= i + diag` (causal).
    diag: i32,
    /// Key blocks to visit (`0..n_blocks`).
    n_blocks: u32,
    scale_log2: f32,
    /// 1024-byte aligned shared-window base of the layout.
    smem: u32,
    q_full: Mbarrier,
    k_ring: Ring,
    v_ring: Ring,
}

impl Tile {
    #[inline(always)]
    fn k_stage<H: HeadDim>(self, s: State) -> u32 {
        self.smem + (k_offset(H::D) + s.stage() as usize * kv_stage_bytes(H::D)) as u32
    }
    #[inline(always)]
    fn v_stage<H: HeadDim>(self, s: State) -> u32 {
        self.smem + (v_offset(H::D) + s.stage() as usize * kv_stage_bytes(H::D)) as u32
    }
}

/// Producer (one thread): Q once, then per key block its K tile and its V tile, each `D / 64`
/// boxes of 64 columns (one 128-byte-swizzled chunk each).
#[inline(always)]
fn producer<H: HeadDim>(t: Tile) {
    t.q.acquire();
    t.k.acquire();
    t.v.acquire();
    if t.n_blocks == 0 {
        return;
    }
    let chunks = (H::D / CHUNK_COLS) as u32;
    t.q_full.arrive_expect_tx(q_bytes(H::D) as u32);
    let mut c = 0;
    while c < chunks {
        // SAFETY: the Q region is 1024-byte aligned, holds the chunks, and is written only by
        // these loads (once); q_full is armed for exactly their bytes (out-of-bounds zeros
        // included).
        unsafe {
            t.q.load_4d(
                t.smem + (Q_OFFSET + c as usize * Q_CHUNK_BYTES) as u32,
                [
                    (c * CHUNK_COLS as u32) as i32,
                    t.head as i32,
                    (t.q_row_tma + t.m0) as i32,
                    t.batch_tma as i32,
                ],
                t.q_full,
            )
        };
        c += 1;
    }
    let (mut ks, mut vs) = (State::new(), State::new());
    let kv_tx = kv_stage_bytes(H::D) as u32;
    let mut n = 0;
    while n < t.n_blocks {
        let row = (t.k_row_tma + n * BLOCK_N as u32) as i32;
        let full = t.k_ring.producer_acquire(ks, kv_tx);
        let mut c = 0;
        while c < chunks {
            // SAFETY: the stage is free (producer_acquire), 1024-byte aligned, the chunk lies
            // inside it; the full barrier is armed for the stage's bytes.
            unsafe {
                t.k.load_4d(
                    t.k_stage::<H>(ks) + c * KV_CHUNK_BYTES as u32,
                    [
                        (c * CHUNK_COLS as u32) as i32,
                        t.kv_head as i32,
                        row,
                        t.batch_tma as i32,
                    ],
                    full,
                )
            };
            c += 1;
        }
        ks.advance();
        let full = t.v_ring.producer_acquire(vs, kv_tx);
        let mut c = 0;
        while c < chunks {
            // SAFETY: as for K.
            unsafe {
                t.v.load_4d(
                    t.v_stage::<H>(vs) + c * KV_CHUNK_BYTES as u32,
                    [
                        (c * CHUNK_COLS as u32) as i32,
                        t.kv_head as i32,
                        row,
                        t.batch_tma as i32,
                    ],
                    full,
                )
            };
            c += 1;
        }
        vs.advance();
        n += 1;
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
unsafe fn issue_qk<I: Elem, H: HeadDim>(t: Tile, wg: u32, k: u32, s: &mut [f32; S_ACC]) {
    let q = t.smem + (Q_OFFSET + wg as usize * WG_M * 128) as u32;
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
/// relative to the new running max): masks, updates the running max `m` (raw scores) and sum
/// `l` (this thread's share of the row; the quad's shares are added in the epilogue) of the
/// thread's two rows, returns the factors by which `O` must be rescaled.
#[inline(always)]
fn softmax(
    t: Tile,
    wg: u32,
    lanes: Lanes,
    n: u32,
    s: &mut [f32; S_ACC],
    m: &mut [f32; 2],
    l: &mut [f32; 2],
) -> [f32; 2] {
    let n0 = n * BLOCK_N as u32;
    let row0 = t.m0 + wg * WG_M as u32 + lanes.row;
    let needs_mask = n0 + BLOCK_N as u32 > t.seqlen_k
        || (t.causal && (n0 + BLOCK_N as u32 - 1) as i32 > t.m0 as i32 + t.diag);
    if needs_mask {
        blocks16!(I {
            unroll!(J in [0 1 2 3] {
                let col = n0 + 8 * I as u32 + lanes.col + (J & 1) as u32;
                let row = row0 + 8 * (J >> 1) as u32;
                if col >= t.seqlen_k || (t.causal && col as i32 > row as i32 + t.diag) {
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
            mx * t.scale_log2
        };
        corr[r] = exp2_approx(m[r] * t.scale_log2 - max_scaled);
        let mut sum = 0.0f32;
        blocks16!(I {
            unroll!(J in [0 1] {
                const E: usize = 4 * I + 2 * R + J;
                let p = exp2_approx(fma(s[E], t.scale_log2, -max_scaled));
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

/// Consumer warpgroup `wg` (0 or 1): Q rows `64 wg ..` of the tile.
#[inline(always)]
fn consumer<I: Elem, H: HeadDim>(t: Tile, wg: u32) {
    let tid = thread_in_warpgroup();
    let lane = tid % 32;
    let lanes = Lanes {
        row: (tid / 32) * 16 + lane / 4,
        col: 2 * (lane % 4),
        leader: lane.is_multiple_of(4),
    };
    let leader = tid == 0;
    const S_ZERO: [f32; S_ACC] = [0.0; S_ACC];
    const P_ZERO: [AFragment; PV_SLICES] = [AFragment([0; 4]); PV_SLICES];
    let mut s = S_ZERO;
    let mut o = H::ZERO;
    let mut p = P_ZERO;
    let mut m = [f32::NEG_INFINITY; 2];
    let mut l = [0.0f32; 2];
    let turns = Turns::new(wg, t.pingpong && t.overlap);
    let n_blocks = t.n_blocks;
    if n_blocks > 0 && !t.overlap {
        // FLAG_NO_OVERLAP: per block S = Q K^T, wait, softmax, O *= correction, O += P V, wait
        // (no ping-pong). The plain order, for measuring the overlap and for diagnosis.
        t.q_full.wait_parity(0);
        let (mut ks, mut vs) = (State::new(), State::new());
        let mut n = 0;
        while n < n_blocks {
            t.k_ring.consumer_wait(ks);
            wgmma::fence_operands(&mut s);
            // SAFETY: as in the overlapped path below: warpgroup-uniform, Q and K landed, the
            // stage released after the wait_group that retires the group.
            unsafe {
                wgmma::fence();
                issue_qk::<I, H>(t, wg, t.k_stage::<H>(ks), &mut s);
                wgmma::wait_group::<0>();
            }
            wgmma::fence_operands(&mut s);
            if leader {
                t.k_ring.consumer_release_local(ks);
            }
            ks.advance();
            let corr = softmax(t, wg, lanes, n, &mut s, &mut m, &mut l);
            wgmma::fence_operands(&mut o);
            wgmma::fence_fragments(&mut p);
            rescale::<H>(&mut o, corr);
            pack_p::<I>(&s, &mut p);
            t.v_ring.consumer_wait(vs);
            wgmma::fence_operands(&mut o);
            wgmma::fence_fragments(&mut p);
            // SAFETY: as above; V stage vs has landed.
            unsafe {
                wgmma::fence();
                issue_pv::<I, H>(&mut o, &p, t.v_stage::<H>(vs), n == 0);
                wgmma::wait_group::<0>();
            }
            wgmma::fence_operands(&mut o);
            wgmma::fence_fragments(&mut p);
            if leader {
                t.v_ring.consumer_release_local(vs);
            }
            vs.advance();
            n += 1;
        }
    } else if n_blocks > 0 {
        turns.start();
        t.q_full.wait_parity(0);
        let (mut ks, mut vs) = (State::new(), State::new());
        // Prologue: S_0, softmax -> P_0.
        t.k_ring.consumer_wait(ks);
        turns.take();
        wgmma::fence_operands(&mut s);
        // SAFETY: all 128 threads of the warpgroup run the consumer with the same trip counts;
        // Q has landed (q_full) and K stage ks too (consumer_wait); released only after the
        // wait_group that retires this group.
        unsafe {
            wgmma::fence();
            issue_qk::<I, H>(t, wg, t.k_stage::<H>(ks), &mut s);
        }
        turns.pass(false);
        // SAFETY: warpgroup-collective.
        unsafe { wgmma::wait_group::<0>() };
        wgmma::fence_operands(&mut s);
        if leader {
            t.k_ring.consumer_release_local(ks);
        }
        ks.advance();
        softmax(t, wg, lanes, 0, &mut s, &mut m, &mut l);
        pack_p::<I>(&s, &mut p);
        // Steady state: S_n and P_{n-1} V_{n-1} on the tensor cores together.
        let mut n = 1;
        while n < n_blocks {
            t.k_ring.consumer_wait(ks);
            t.v_ring.consumer_wait(vs);
            turns.take();
            wgmma::fence_operands(&mut s);
            wgmma::fence_operands(&mut o);
            wgmma::fence_fragments(&mut p);
            // SAFETY: as in the prologue; V stage vs has landed; P_{n-1} and O are not
            // written until the wait_group::<0> below retires the PV group.
            unsafe {
                wgmma::fence();
                issue_qk::<I, H>(t, wg, t.k_stage::<H>(ks), &mut s);
                issue_pv::<I, H>(&mut o, &p, t.v_stage::<H>(vs), n == 1);
            }
            turns.pass(false);
            // SAFETY: warpgroup-collective; retires the QK group (the older one).
            unsafe { wgmma::wait_group::<1>() };
            wgmma::fence_operands(&mut s);
            if leader {
                t.k_ring.consumer_release_local(ks);
            }
            ks.advance();
            let corr = softmax(t, wg, lanes, n, &mut s, &mut m, &mut l);
            // SAFETY: warpgroup-collective; retires the PV group.
            unsafe { wgmma::wait_group::<0>() };
            wgmma::fence_operands(&mut o);
            wgmma::fence_fragments(&mut p);
            if leader {
                t.v_ring.consumer_release_local(vs);
            }
            vs.advance();
            rescale::<H>(&mut o, corr);
            pack_p::<I>(&s, &mut p);
            n += 1;
        }
        // Tail: O += P_last V_last.
        t.v_ring.consumer_wait(vs);
        turns.take();
        wgmma::fence_operands(&mut o);
        wgmma::fence_fragments(&mut p);
        // SAFETY: as above.
        unsafe {
            wgmma::fence();
            issue_pv::<I, H>(&mut o, &p, t.v_stage::<H>(vs), n_blocks == 1);
        }
        turns.pass(true);
        // SAFETY: warpgroup-collective.
        unsafe { wgmma::wait_group::<0>() };
        wgmma::fence_operands(&mut o);
        wgmma::fence_fragments(&mut p);
        // The last V stage needs no release: nobody refills it.
    }
    epilogue::<I, H>(t, wg, lanes, &o, m, l);
}

/// `O / rowsum` rounded to the element type, stored with bounds-checked 4-byte stores (rows
/// past `seqlen_q` are skipped), and `LSE = max * scale + ln(rowsum)` (natural log; `+inf`
/// for a row that saw no key, whose `O` is 0).
#[inline(always)]
fn epilogue<E: Elem, H: HeadDim>(
    t: Tile,
    wg: u32,
    lanes: Lanes,
    o: &H::O,
    m: [f32; 2],
    l: [f32; 2],
) {
    unroll!(R in [0 1] {
        let r = R;
        // SAFETY: every lane of the warp runs this.
        let sum = unsafe { quad_sum_f32(l[r]) };
        let empty = sum.is_nan() || sum <= 0.0; // no visible key (or NaN)
        let inv = if empty { 0.0 } else { 1.0 / sum };
        let row = t.m0 + wg * WG_M as u32 + lanes.row + 8 * r as u32;
        if row < t.seqlen_q {
            let base = ((t.q_row_base + row) as u64 * t.heads as u64 + t.head as u64)
                * H::D as u64
                + lanes.col as u64;
            blocks16!(I {
                if I < H::D / 8 {
                let i = I;
                let v = E::pack(o[4 * I + 2 * R] * inv, o[4 * I + 2 * R + 1] * inv);
                // SAFETY: (row, head, 8 i + col) lies inside O: row < seqlen_q of this sequence
                // (the launcher checked O holds q_row_base + seqlen_q rows of heads x D), head <
                // heads, 8 i + col + 1 < D; the index is even and O 16-byte aligned, so the
                // 4-byte store is aligned; only this thread writes these two elements.
                unsafe { (t.o.add((base + 8 * i as u64) as usize) as *mut u32).write(v) };
                }
            });
            if lanes.leader {
                let lse = if empty {
                    f32::INFINITY
                } else {
                    (m[r] * t.scale_log2 + log2_approx(sum)) * core::f32::consts::LN_2
                };
                let idx = t.lse_base as u64 + t.head as u64 * t.lse_head_stride as u64 + row as u64;
                // SAFETY: inside LSE ([B, H, S_q] or [H, total_q], checked by the launcher);
                // one writer per (head, row).
                unsafe { t.lse.add(idx as usize).write(lse) };
            }
        }
    });
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
}

/// The kernel body of every entry.
///
/// # Safety
/// The launch contract of the entries.
#[inline(always)]
unsafe fn attention<I: Elem, H: HeadDim>(p: Params) {
    if block_dim_x() != THREADS_PER_CTA || p.kv_heads == 0 || !p.heads.is_multiple_of(p.kv_heads) {
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    // SAFETY: reading special registers has no preconditions.
    let (bx, gx, head, batch) = unsafe {
        (
            core::arch::nvptx::_block_idx_x(),
            core::arch::nvptx::_grid_dim_x(),
            core::arch::nvptx::_block_idx_y(),
            core::arch::nvptx::_block_idx_z(),
        )
    };
    // Q, K, V and cu_seqlens may be written by the previous kernel on the stream (PDL), and O
    // and LSE read by it: wait before touching any of them.
    pdl::wait();
    let causal = p.flags & FLAG_CAUSAL != 0;
    let varlen = p.flags & FLAG_VARLEN != 0;
    let m_block = gx - 1 - bx;
    let (seqlen_q, seqlen_k, q_start, k_start) = if varlen {
        // SAFETY: the launch contract: cu_seqlens_* are B + 1 i32 each (B = gridDim.z),
        // monotone from 0, checked by the launcher, not written while the kernel runs.
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
    if m0 >= seqlen_q {
        // A tile past this (shorter) sequence of a varlen batch: the whole CTA leaves before
        // any barrier.
        return;
    }
    let diag = seqlen_k as i32 - seqlen_q as i32;
    // Keys any row of the tile may see: causal stops at the last stored row's diagonal.
    let last_row = (m0 + BLOCK_M as u32).min(seqlen_q) as i32 - 1;
    let key_end = if causal {
        (last_row + diag + 1).clamp(0, seqlen_k as i32) as u32
    } else {
        seqlen_k
    };
    let smem = (dynamic_smem_base() + SWIZZLE_ALIGN as u32 - 1) & !(SWIZZLE_ALIGN as u32 - 1);
    let t = Tile {
        // SAFETY: the launch contract: device addresses of valid tensor maps.
        q: unsafe { TensorMap::at(p.tmap_q) },
        // SAFETY: as above.
        k: unsafe { TensorMap::at(p.tmap_k) },
        // SAFETY: as above.
        v: unsafe { TensorMap::at(p.tmap_v) },
        o: p.o as *mut u16,
        lse: p.lse as *mut f32,
        seqlen_q,
        seqlen_k,
        m0,
        head,
        kv_head: head / (p.heads / p.kv_heads),
        heads: p.heads,
        q_row_tma: q_start,
        k_row_tma: k_start,
        batch_tma: if varlen { 0 } else { batch },
        q_row_base: if varlen { q_start } else { batch * seqlen_q },
        lse_base: if varlen {
            q_start
        } else {
            batch * p.heads * seqlen_q
        },
        lse_head_stride: if varlen { p.total_q } else { seqlen_q },
        causal,
        pingpong: p.flags & FLAG_NO_PINGPONG == 0,
        overlap: p.flags & FLAG_NO_OVERLAP == 0,
        diag,
        n_blocks: key_end.div_ceil(BLOCK_N as u32),
        scale_log2: p.scale_log2,
        smem,
        // SAFETY: inside the launch's smem_bytes(D), used for nothing else; thread 0
        // initialises it (count 1: the producer's arrive_expect_tx) and fence_init + bar.sync
        // publish that; one phase only (parity 0).
        q_full: unsafe { Mbarrier::at(smem + barriers_offset(H::D) as u32) },
        // SAFETY: the rings' barriers lie inside the launch's shared memory, used for nothing
        // else; initialised below by thread 0 and published by fence_init + bar.sync; per stage
        // and phase one producer_acquire arms the stage's bytes and each consumer warpgroup
        // releases once (count CONSUMER_WARPGROUPS).
        k_ring: unsafe { Ring::at(smem + k_ring_offset(H::D) as u32) },
        // SAFETY: as above.
        v_ring: unsafe { Ring::at(smem + v_ring_offset(H::D) as u32) },
    };
    if thread_idx_x() == 0 {
        // SAFETY: one thread, before any use; published by fence_init and the bar.sync below.
        unsafe {
            t.q_full.init(1);
            t.k_ring.init(CONSUMER_WARPGROUPS);
            t.v_ring.init(CONSUMER_WARPGROUPS);
        }
        mbarrier::fence_init();
        t.q.prefetch();
        t.k.prefetch();
        t.v.prefetch();
    }
    // SAFETY: every thread of the CTA, converged (the early return above is CTA-uniform).
    unsafe { crate::device::thread::sync_threads() };
    if warpgroup_idx() == 0 {
        // SAFETY: the whole producer warpgroup, convergently; launch bounds with this split.
        unsafe { setmaxnreg_dec::<PRODUCER_REGS>() };
        if thread_idx_x() == 0 {
            producer::<H>(t);
        }
    } else {
        // SAFETY: the whole consumer warpgroup, convergently; the split fits the CTA's registers
        // (checked by launch_bounds! below).
        unsafe { setmaxnreg_inc::<CONSUMER_REGS>() };
        consumer::<I, H>(t, warpgroup_idx() - 1);
    }
}

macro_rules! entry {
    ($name:ident, $elem:ty, $hd:ty, $doc:literal) => {
        #[doc = $doc]
        ///
        /// Launch and parameters: `contract::attention`; another block size, `kv_heads == 0`
        /// or `heads % kv_heads != 0` traps.
        ///
        /// # Safety
        /// The tensor maps describe Q, K, V as the contract says (dtype, rank-4 dims, boxes,
        /// 128-byte swizzle) and stay valid until the kernel completes; `o` addresses O (`[rows,
        /// heads, D]` of the element type, 16-byte aligned, rows = `B * seqlen_q` or total_q)
        /// and `lse` the LSE (f32, `[B, heads, seqlen_q]` or `[heads, total_q]`), overlapping
        /// nothing else; with `FLAG_VARLEN`, `cu_seqlens_q` / `cu_seqlens_k` address `B + 1`
        /// monotone `i32` from 0 up to the packed row counts (`total_q` for Q), each sequence's
        /// length at most the grid's `ceil(seqlen / BLOCK_M)` Q tiles; `scale_log2 > 0`; the
        /// grid is `(ceil(seqlen_q / BLOCK_M), heads, B)`.
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
