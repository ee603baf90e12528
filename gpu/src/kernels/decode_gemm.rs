//! `decode_gemm_*`: the memory-bound GEMM of LLM decoding, `C = alpha * A * B + beta * C` with
//! few tokens (`M <= 64`) and a column-major B (weights stored `N x K`, K contiguous). Launch
//! contract and design: [`crate::contract::decode_gemm`].
//!
//! One warp, one k-block (`U` k-steps of 32):
//!
//! ```text
//!   lane (g = lane / 4, t = lane % 4) loads, for each k-step j (k0 = 32 j + 8 t):
//!     w[2j]   = B[row g    ][k0 .. k0 + 8]   (16 bytes, streamed)
//!     w[2j+1] = B[row g + 8][k0 .. k0 + 8]
//!   and for token tile q: x = A[token 8 q + g][k0 .. k0 + 8]   (16 bytes, L1)
//!   mma #1: A-frag {w[2j][0], w[2j+1][0], w[2j][1], w[2j+1][1]}, B-frag {x[0], x[1]}
//!   mma #2: A-frag {w[2j][2], w[2j+1][2], w[2j][3], w[2j+1][3]}, B-frag {x[2], x[3]}
//! ```
//!
//! In MMA #1, logical k `2t, 2t+1` is physical `k0, k0+1` and logical `2t+8, 2t+9` is `k0+2,
//! k0+3`; MMA #2 takes `k0+4 .. k0+8` the same way. The A fragment (weights) and the B fragment
//! (tokens) of each lane use the same logical-to-physical map (PTX ISA 8.0 §9.7.13.4.8: lane
//! `(g, t)` holds A rows `g`, `g+8` and B column `g` at logical k `2t, 2t+1, 2t+8, 2t+9`), so
//! each MMA sums over 16 physical k exactly once and the pair covers the 32 of the k-step.
//! Accumulator `d[i]` of token tile `q` is output column (weight row) `g + 8 (i / 2)` of the
//! row tile and token `8 q + 2 t + i % 2`.
//!
//! Entries `..._r2` (issue 20, M = 16): a warp covers two row tiles (32 weight rows) and feeds
//! each token fragment `x` to the MMAs of both, so it reads A half as often per weight byte and
//! keeps twice the weight bytes in flight. Entries `..._pa`: the token fragments of the next
//! k-block are loaded with its weights (registers, one k-block ahead) instead of after the
//! current block's weights arrive, taking the A latency off each k-block's critical path. Both
//! read A only after `griddepcontrol.wait`.
//!
//! Tails: rows `>= N` and tokens `>= M` load zeros and store nothing; a 16-byte vector that
//! crosses K is loaded element by element (elements `>= K` are zero, in both operands, so
//! padding or NaN beyond K never enters the sum).

use crate::contract::decode_gemm::*;
use crate::device::math::{pack_bf16x2, pack_f16x2};
use crate::device::mma::{
    ld_global_cg_u16, ld_global_cg_v4, ld_global_nc_u16, ld_global_stream_v4,
    ld_global_stream_v4_l2_256, mma_m16n8k16_f32_bf16, mma_m16n8k16_f32_f16,
};
use crate::device::pdl;
use crate::device::smem::{dynamic_smem_base, dynamic_smem_size, Shared};
use crate::device::thread::{block_dim_x, block_idx_x, sync_threads, thread_idx_x};

use super::qkv_store::QkvArgs;

/// `$body` once for each `$i` in the list, as a constant (so arrays indexed by `$i` stay in
/// registers: no loop for LLVM to keep rolled).
macro_rules! unroll {
    ($i:ident in [$($v:literal),*] $body:block) => {
        $( { const $i: usize = $v; $body } )*
    };
}

/// Aborts the kernel (launch contract violated).
#[inline(always)]
fn trap() -> ! {
    // SAFETY: `trap` aborts the kernel; no preconditions.
    unsafe { core::arch::nvptx::trap() }
}

/// The kernel's parameters.
#[derive(Clone, Copy)]
struct Params {
    a: *const u16,
    b: *const u16,
    c: *mut u8,
    m: u32,
    n: u32,
    k: u32,
    lda: u32,
    ldb: u32,
    ldc: u32,
    alpha: f32,
    beta: f32,
    out_f32: bool,
    ksplit: u32,
    weights_early: bool,
    l2_prefetch: bool,
    /// Issue 21: k-blocks per warp prefetched into L2 before `griddepcontrol.wait` (0: none).
    pf_iters: u32,
    /// Issue 21: `%globaltimer` stamps (null: none) and this launch's slot.
    stamps: *mut u64,
    stamp_slot: u32,
    /// Issue 21: the QKV epilogue's argument block (`contract::decode_gemm::QKV_ARGS` words).
    epi: *const u64,
}

/// 8 elements of row `row` of a row-major matrix (`base`, pitch `ld` elements) from column
/// `k0`, as 4 words (two elements each, lower column in the low half): one 16-byte load when
/// the 8 lie within the `k` columns, element-wise loads with zeros beyond `k`, zeros when
/// `!row_ok` or `k0 >= k`. `STREAM` (the weights): the read-only streaming path (`.nc`);
/// otherwise (A, which the previous kernel on the stream may have written: under PDL it may
/// still run when this kernel starts, so A is not read-only for this kernel's lifetime) `.cg`,
/// after `griddepcontrol.wait`.
///
/// # Safety
/// `base` is 16-byte aligned, `ld` a multiple of 8, and when `row_ok` the elements
/// `[row * ld, row * ld + k)` are readable and, with `STREAM`, not written during the kernel,
/// without it not written after this kernel's `griddepcontrol.wait`; `k0` is a multiple of 8.
#[inline(always)]
unsafe fn load8<const STREAM: bool>(
    base: *const u16,
    ld: u32,
    row: u32,
    row_ok: bool,
    k0: u32,
    k: u32,
) -> [u32; 4] {
    if !row_ok || k0 >= k {
        return [0; 4];
    }
    let off = row as usize * ld as usize + k0 as usize;
    // SAFETY: row_ok and k0 < k, so element `off` lies within the readable row (caller's
    // contract).
    let p = unsafe { base.add(off) };
    if k - k0 >= 8 {
        // 16-byte aligned: base, ld * 2 and k0 * 2 are multiples of 16.
        if STREAM {
            // SAFETY: [k0, k0 + 8) within the row's k columns (caller's contract).
            unsafe { ld_global_stream_v4(p as *const u32) }
        } else {
            // SAFETY: as above.
            unsafe { ld_global_cg_v4(p as *const u32) }
        }
    } else {
        let mut h = [0u32; 8];
        let mut e = 0;
        while e < 8 {
            if k0 + (e as u32) < k {
                // SAFETY: column k0 + e < k of a readable row (read-only for the kernel when
                // STREAM, caller's contract).
                h[e] = unsafe {
                    if STREAM {
                        ld_global_nc_u16(p.add(e))
                    } else {
                        ld_global_cg_u16(p.add(e))
                    }
                } as u32;
            }
            e += 1;
        }
        [
            h[0] | h[1] << 16,
            h[2] | h[3] << 16,
            h[4] | h[5] << 16,
            h[6] | h[7] << 16,
        ]
    }
}

/// The weights of one k-block for this lane: `2 * U` vectors (rows `g` and `g + 8`).
///
/// # Safety
/// The launch contract (B readable for rows `< n`, columns `< k`).
#[inline(always)]
unsafe fn load_block<const U: usize>(
    p: &Params,
    block: u32,
    rows: [u32; 2],
    ok: [bool; 2],
    t: u32,
) -> [[u32; 4]; 8] {
    let mut w = [[0u32; 4]; 8];
    let base = block * (U * K_STEP) as u32 + 8 * t;
    // Fast path (every k-block but the last, every row tile but the last): whole vectors only.
    if ok[0] && ok[1] && (block + 1) * (U * K_STEP) as u32 <= p.k {
        let p0 =
            p.b.wrapping_add(rows[0] as usize * p.ldb as usize + base as usize);
        let p1 =
            p.b.wrapping_add(rows[1] as usize * p.ldb as usize + base as usize);
        if p.l2_prefetch {
            unroll!(J in [0, 1, 2, 3] {
                if J < U {
                    // SAFETY: as the loads below.
                    w[2 * J] = unsafe { ld_global_stream_v4_l2_256(p0.add(J * K_STEP) as *const u32) };
                    // SAFETY: as the loads below.
                    w[2 * J + 1] =
                        unsafe { ld_global_stream_v4_l2_256(p1.add(J * K_STEP) as *const u32) };
                }
            });
            return w;
        }
        unroll!(J in [0, 1, 2, 3] {
            if J < U {
                // SAFETY: rows < n and columns [base + 32 J, base + 32 J + 8) < k are within
                // B (launch contract); 16-byte aligned (base, ldb multiples of 8).
                w[2 * J] = unsafe { ld_global_stream_v4(p0.add(J * K_STEP) as *const u32) };
                // SAFETY: as above.
                w[2 * J + 1] = unsafe { ld_global_stream_v4(p1.add(J * K_STEP) as *const u32) };
            }
        });
        return w;
    }
    unroll!(J in [0, 1, 2, 3] {
        if J < U {
            let k0 = base + (J * K_STEP) as u32;
            // SAFETY: the launch contract.
            w[2 * J] = unsafe { load8::<true>(p.b, p.ldb, rows[0], ok[0], k0, p.k) };
            // SAFETY: as above.
            w[2 * J + 1] = unsafe { load8::<true>(p.b, p.ldb, rows[1], ok[1], k0, p.k) };
        }
    });
    w
}

/// The token fragments of one k-block for this lane: `x[j][q]` = 8 elements of token
/// `8 q + g` from column `32 (U block + j) + 8 t` (zeros past M or K).
///
/// # Safety
/// The launch contract (A readable for rows `< m`, columns `< k`); only after
/// `griddepcontrol.wait`.
#[inline(always)]
unsafe fn load_a<const T: usize, const U: usize>(
    p: &Params,
    block: u32,
    g: u32,
    t: u32,
) -> [[[u32; 4]; 8]; 4] {
    let mut x = [[[0u32; 4]; 8]; 4];
    let base = block * (U * K_STEP) as u32 + 8 * t;
    unroll!(J in [0, 1, 2, 3] {
        if J < U {
            let k0 = base + (J * K_STEP) as u32;
            unroll!(Q in [0, 1, 2, 3, 4, 5, 6, 7] {
                if Q < T {
                    let tok = (Q * TOKENS_PER_TILE) as u32 + g;
                    // SAFETY: the launch contract.
                    x[J][Q] = unsafe { load8::<false>(p.a, p.lda, tok, tok < p.m, k0, p.k) };
                }
            });
        }
    });
    x
}

/// The MMAs of one k-block: `acc[r][q] += W(block, row tile r) * X(block, token tile q)`. Each
/// token fragment is loaded once per k-step and feeds the `R` row tiles of the warp. With `PA`
/// the fragments are `xs` (loaded by [`load_a`] one k-block ahead, with the weights); without,
/// they are loaded here.
///
/// # Safety
/// The launch contract (A readable for rows `< m`, columns `< k`); called by all 32 lanes of
/// the warp together (warp-uniform control flow).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn mma_block<
    const BF16: bool,
    const T: usize,
    const U: usize,
    const R: usize,
    const PA: bool,
>(
    p: &Params,
    block: u32,
    w: &[[[u32; 4]; 8]; MAX_ROW_TILES],
    xs: &[[[u32; 4]; 8]; 4],
    acc: &mut [[[f32; 4]; 8]; MAX_ROW_TILES],
    g: u32,
    t: u32,
) {
    let base = block * (U * K_STEP) as u32 + 8 * t;
    unroll!(J in [0, 1, 2, 3] {
        if J < U {
            let k0 = base + (J * K_STEP) as u32;
            unroll!(Q in [0, 1, 2, 3, 4, 5, 6, 7] {
                if Q < T {
                    let tok = (Q * TOKENS_PER_TILE) as u32 + g;
                    let x = if PA {
                        xs[J][Q]
                    } else {
                        // SAFETY: the launch contract.
                        unsafe { load8::<false>(p.a, p.lda, tok, tok < p.m, k0, p.k) }
                    };
                    unroll!(RT in [0, 1] {
                        if RT < R {
                            let (w0, w1) = (w[RT][2 * J], w[RT][2 * J + 1]);
                            let a1 = [w0[0], w1[0], w0[1], w1[1]];
                            let a2 = [w0[2], w1[2], w0[3], w1[3]];
                            let d = &mut acc[RT][Q];
                            if BF16 {
                                *d = mma_m16n8k16_f32_bf16(a1, [x[0], x[1]], *d);
                                *d = mma_m16n8k16_f32_bf16(a2, [x[2], x[3]], *d);
                            } else {
                                *d = mma_m16n8k16_f32_f16(a1, [x[0], x[1]], *d);
                                *d = mma_m16n8k16_f32_f16(a2, [x[2], x[3]], *d);
                            }
                        }
                    });
                }
            });
        }
    });
}

/// The weights of one k-block for the `R` row tiles of the warp.
///
/// # Safety
/// As [`load_block`].
#[inline(always)]
unsafe fn load_blocks<const U: usize, const R: usize>(
    p: &Params,
    block: u32,
    rows: &[[u32; 2]; MAX_ROW_TILES],
    ok: &[[bool; 2]; MAX_ROW_TILES],
    t: u32,
) -> [[[u32; 4]; 8]; MAX_ROW_TILES] {
    let mut w = [[[0u32; 4]; 8]; MAX_ROW_TILES];
    unroll!(RT in [0, 1] {
        if RT < R {
            // SAFETY: the caller's contract.
            w[RT] = unsafe { load_block::<U>(p, block, rows[RT], ok[RT], t) };
        }
    });
    w
}

/// The kernel body of entry `decode_gemm_{bf16|f16}_t{T}_u{U}` (`R = 1`) or
/// `decode_gemm_{bf16|f16}_t{T}_u{U}_r{R}`: each warp covers `R` row tiles (`16 R` output
/// columns) and reuses every token fragment it loads for all of them; `..._pa` (`PA`): the token
/// fragments of the next k-block are loaded with its weights, one k-block ahead.
///
/// # Safety
/// The launch contract of [`crate::contract::decode_gemm`]; every thread of the CTA calls it.
#[inline(always)]
unsafe fn decode<
    const BF16: bool,
    const T: usize,
    const U: usize,
    const R: usize,
    const PA: bool,
    const EPI: u32,
>(
    p: Params,
) {
    // SAFETY: stamps is null or the launch's stamp buffer (launch contract).
    unsafe { stamp(p.stamps, p.stamp_slot, 0) };
    const { assert!(T >= 1 && T <= 8 && U >= 1 && U <= 4 && R >= 1 && R <= MAX_ROW_TILES) };
    const { assert!(T * R <= 8) };
    let tid = thread_idx_x();
    let threads = block_dim_x();
    let warps = threads / 32;
    if !threads.is_multiple_of(32)
        || warps == 0
        || p.ksplit == 0
        || !warps.is_multiple_of(p.ksplit)
        || (dynamic_smem_size() as usize) < smem_bytes(warps, T * R)
    {
        trap();
    }
    let (warp, lane) = (tid / 32, tid % 32);
    let (g, t) = (lane / 4, lane % 4);
    let tiles_per_cta = warps / p.ksplit;
    let tile = block_idx_x() as u64 * tiles_per_cta as u64 + (warp / p.ksplit) as u64;
    let ks = warp % p.ksplit;
    // Rows (output columns) of this lane: `r0[rt]` and `r0[rt] + 8` for row tile `rt` of the
    // warp; u64 first so a last CTA past N cannot wrap.
    let mut r0 = [0u64; MAX_ROW_TILES];
    let mut ok = [[false; 2]; MAX_ROW_TILES];
    let mut rows = [[0u32; 2]; MAX_ROW_TILES];
    unroll!(RT in [0, 1] {
        if RT < R {
            r0[RT] = (tile * R as u64 + RT as u64) * ROWS as u64 + g as u64;
            ok[RT] = [r0[RT] < p.n as u64, r0[RT] + 8 < p.n as u64];
            rows[RT] = [
                if ok[RT][0] { r0[RT] as u32 } else { 0 },
                if ok[RT][1] { (r0[RT] + 8) as u32 } else { 0 },
            ];
        }
    });
    let kblock = (U * K_STEP) as u32;
    let nblk = p.k.div_ceil(kblock);

    let mut acc = [[[0.0f32; 4]; 8]; MAX_ROW_TILES];
    let mut b = ks;
    let mut cur = [[[0u32; 4]; 8]; MAX_ROW_TILES];
    if p.weights_early && b < nblk {
        // SAFETY: the launch contract; weights_early promises B is not written by the
        // preceding kernel, so it may be read before griddepcontrol.wait.
        cur = unsafe { load_blocks::<U, R>(&p, b, &rows, &ok, t) };
    }
    if p.pf_iters > 0 && p.weights_early {
        // SAFETY: the launch contract; as the early loads above (B is not written by the
        // preceding kernel), and a prefetch never faults or changes memory.
        unsafe { prefetch_blocks::<U, R>(&p, b, nblk, &rows, &ok, t) };
    }
    pdl::wait();
    // SAFETY: as above.
    unsafe {
        stamp(p.stamps, p.stamp_slot, 1);
        stamp(p.stamps, p.stamp_slot, 2);
    }
    if !p.weights_early && b < nblk {
        // SAFETY: the launch contract.
        cur = unsafe { load_blocks::<U, R>(&p, b, &rows, &ok, t) };
    }
    let mut xa = [[[0u32; 4]; 8]; 4];
    if PA && b < nblk {
        // SAFETY: the launch contract; after griddepcontrol.wait.
        xa = unsafe { load_a::<T, U>(&p, b, g, t) };
    }
    let mut signalled = false;
    while b < nblk {
        let nb = b + p.ksplit;
        let mut nxt = [[[0u32; 4]; 8]; MAX_ROW_TILES];
        let mut xn = [[[0u32; 4]; 8]; 4];
        if nb < nblk {
            // SAFETY: the launch contract.
            nxt = unsafe { load_blocks::<U, R>(&p, nb, &rows, &ok, t) };
            if PA {
                // SAFETY: the launch contract; after griddepcontrol.wait.
                xn = unsafe { load_a::<T, U>(&p, nb, g, t) };
            }
        } else {
            pdl::launch_dependents();
            signalled = true;
        }
        // SAFETY: the launch contract; b, ks and nblk are warp-uniform, so all 32 lanes run
        // the MMAs together.
        unsafe { mma_block::<BF16, T, U, R, PA>(&p, b, &cur, &xa, &mut acc, g, t) };
        cur = nxt;
        xa = xn;
        b = nb;
    }
    if !signalled {
        pdl::launch_dependents();
    }

    // Split-K exchange: [warp][row tile][q][i][lane] f32, conflict-free.
    let smem = Shared::<f32>::at(dynamic_smem_base());
    let slot = |w: u32, rt: usize, q: usize, i: usize| {
        smem.add((((w * R as u32 + rt as u32) * T as u32 + q as u32) * 4 + i as u32) * 32 + lane)
    };
    if ks != 0 {
        unroll!(RT in [0, 1] {
            unroll!(Q in [0, 1, 2, 3, 4, 5, 6, 7] {
                if RT < R && Q < T {
                    unroll!(I in [0, 1, 2, 3] {
                        // SAFETY: slot < warps * R * T * 4 * 32 floats <= dynamic_smem_size
                        // (checked above); each thread writes only its own lane's slots.
                        unsafe { slot(warp, RT, Q, I).store(acc[RT][Q][I]) };
                    });
                }
            });
        });
    }
    // SAFETY: every thread of the CTA reaches this barrier once (no early return above).
    unsafe { sync_threads() };
    if ks != 0 {
        return;
    }
    let mut s = 1;
    while s < p.ksplit {
        unroll!(RT in [0, 1] {
            unroll!(Q in [0, 1, 2, 3, 4, 5, 6, 7] {
                if RT < R && Q < T {
                    unroll!(I in [0, 1, 2, 3] {
                        // SAFETY: written before the barrier by warp `warp + s` of this row
                        // tile.
                        acc[RT][Q][I] += unsafe { slot(warp + s, RT, Q, I).load() };
                    });
                }
            });
        });
        s += 1;
    }

    if EPI == EPI_SWIGLU {
        // SAFETY: the launch contract of the swiglu entries (C holds m rows of pitch ldc >= n / 2
        // bf16).
        unsafe { epilogue_swiglu::<T, R>(&p, &acc, &r0, t) };
    } else if EPI == EPI_QKV {
        // SAFETY: the launch contract of the qkv entries.
        unsafe { epilogue_qkv::<T, R>(&p, &acc, &r0, t) };
    } else {
        // SAFETY: the launch contract.
        unsafe { epilogue_store::<BF16, T, R>(&p, &acc, &r0, t) };
    }
    if tid == 0 {
        // SAFETY: as above.
        unsafe { stamp(p.stamps, p.stamp_slot, 3) };
    }
}

/// Epilogue [`EPI_STORE`]: `C[token][row] = alpha * acc + beta * C`.
///
/// # Safety
/// The launch contract; called by the `ks == 0` warps after the split-K reduction.
#[inline(always)]
unsafe fn epilogue_store<const BF16: bool, const T: usize, const R: usize>(
    p: &Params,
    acc: &[[[f32; 4]; 8]; MAX_ROW_TILES],
    r0: &[u64; MAX_ROW_TILES],
    t: u32,
) {
    unroll!(RT in [0, 1] {
    unroll!(Q in [0, 1, 2, 3, 4, 5, 6, 7] {
        unroll!(I in [0, 1, 2, 3] {
            let row = r0[RT] + 8 * (I as u64 / 2);
            let tok = (Q * TOKENS_PER_TILE) as u32 + 2 * t + (I as u32 % 2);
            if RT < R && Q < T && row < p.n as u64 && tok < p.m {
                let idx = tok as usize * p.ldc as usize + row as usize;
                let mut v = p.alpha * acc[RT][Q][I];
                if p.out_f32 {
                    // SAFETY: C holds m rows of pitch ldc >= n f32 (launch contract).
                    let cp = unsafe { (p.c as *mut f32).add(idx) };
                    if p.beta != 0.0 {
                        // SAFETY: as above; this thread is the only one touching C[tok][row].
                        v += p.beta * unsafe { cp.read_volatile() };
                    }
                    // SAFETY: as above.
                    unsafe { cp.write_volatile(v) };
                } else {
                    // SAFETY: C holds m rows of pitch ldc >= n 16-bit elements.
                    let cp = unsafe { (p.c as *mut u16).add(idx) };
                    if p.beta != 0.0 {
                        // SAFETY: as above.
                        let old = unsafe { cp.read_volatile() };
                        let old = if BF16 {
                            f32::from_bits((old as u32) << 16)
                        } else {
                            crate::device::math::f16_to_f32(old)
                        };
                        v += p.beta * old;
                    }
                    let bits = if BF16 {
                        pack_bf16x2(v, 0.0)
                    } else {
                        pack_f16x2(v, 0.0)
                    } & 0xffff;
                    // SAFETY: as above.
                    unsafe { cp.write_volatile(bits as u16) };
                }
            }
        });
    });
    });
}

/// Stamps `%globaltimer` into word `word` of slot `slot` (`contract::decode_step::STAMP_WORDS`
/// words per slot): words 0 and 1 take the minimum over CTAs, 2 and 3 the maximum. Thread 0 of
/// the CTA only; nothing when `stamps` is null.
///
/// # Safety
/// `stamps` is null or points to at least `(slot + 1) * STAMP_WORDS` u64 that only stamps touch
/// during the kernel.
#[inline(always)]
pub(crate) unsafe fn stamp(stamps: *mut u64, slot: u32, word: u32) {
    if stamps.is_null() || thread_idx_x() != 0 {
        return;
    }
    let a = stamps
        .wrapping_add(slot as usize * crate::contract::decode_step::STAMP_WORDS + word as usize);
    // SAFETY: the caller's contract: a u64 of the stamp buffer that only stamps touch.
    unsafe { crate::device::clock::stamp_word(a, word >= 2) };
}

/// `cp.async.bulk.prefetch.L2.global [p], bytes` (PTX ISA 8.0, sm_90): a hint to bring `bytes`
/// (a multiple of 16, `p` 16-byte aligned) into L2; never faults, changes nothing.
///
/// # Safety
/// `p` is 16-byte aligned and `[p, p + bytes)` lies in one allocation.
#[inline(always)]
pub(crate) unsafe fn prefetch_l2(p: *const u8, bytes: u32) {
    // SAFETY: the caller's contract.
    unsafe {
        core::arch::asm!("cp.async.bulk.prefetch.L2.global [{p}], {n};", p = in(reg64) p,
            n = in(reg32) bytes, options(nostack, readonly))
    };
}

/// Prefetches into L2 the weights of the warp's k-blocks `first + i * ksplit`, `i = 1 ..=
/// pf_iters` (whole blocks within K only): lanes with `t == 0` prefetch their rows' `U * 64`
/// bytes each.
///
/// # Safety
/// The launch contract (B readable for rows `< n`, columns `< k`).
#[inline(always)]
unsafe fn prefetch_blocks<const U: usize, const R: usize>(
    p: &Params,
    first: u32,
    nblk: u32,
    rows: &[[u32; 2]; MAX_ROW_TILES],
    ok: &[[bool; 2]; MAX_ROW_TILES],
    t: u32,
) {
    if t != 0 {
        return;
    }
    let kb = (U * K_STEP) as u32;
    let mut i = 1;
    while i <= p.pf_iters {
        let blk = first + i * p.ksplit;
        if blk >= nblk || (blk + 1) * kb > p.k {
            break;
        }
        unroll!(RT in [0, 1] {
            unroll!(H in [0, 1] {
                if RT < R && ok[RT][H] {
                    let e = rows[RT][H] as usize * p.ldb as usize + (blk * kb) as usize;
                    // SAFETY: row < n, columns [blk * kb, (blk + 1) * kb) <= k: inside B;
                    // 16-byte aligned (ldb and kb multiples of 8 elements).
                    unsafe { prefetch_l2(p.b.wrapping_add(e) as *const u8, kb * 2) };
                }
            });
        });
        i += 1;
    }
}

/// Epilogue [`EPI_SWIGLU`]: lane `(g, t)` holds gate (`d[0], d[1]`, row `g`) and up (`d[2],
/// d[3]`, row `g + 8`) of output column `8 p + g` (`p` the row tile) for tokens `2t, 2t + 1`.
///
/// # Safety
/// The launch contract: C holds `m` rows of pitch `ldc >= n / 2` bf16, `n` a multiple of 16.
#[inline(always)]
unsafe fn epilogue_swiglu<const T: usize, const R: usize>(
    p: &Params,
    acc: &[[[f32; 4]; 8]; MAX_ROW_TILES],
    r0: &[u64; MAX_ROW_TILES],
    t: u32,
) {
    unroll!(RT in [0, 1] {
        unroll!(Q in [0, 1, 2, 3, 4, 5, 6, 7] {
            unroll!(I in [0, 1] {
                let tok = (Q * TOKENS_PER_TILE) as u32 + 2 * t + I as u32;
                // r0 = 16 p + g: both rows g and g + 8 of the tile are < n (n % 16 == 0).
                if RT < R && Q < T && r0[RT] < p.n as u64 && tok < p.m {
                    let col = (r0[RT] / 16) * 8 + r0[RT] % 16;
                    let gate = p.alpha * acc[RT][Q][I];
                    let up = p.alpha * acc[RT][Q][2 + I];
                    let v = gate / (1.0 + crate::device::math::exp_approx(-gate)) * up;
                    let idx = tok as usize * p.ldc as usize + col as usize;
                    // SAFETY: tok < m, col < n / 2 <= ldc (launch contract); one writer.
                    unsafe {
                        (p.c as *mut u16).add(idx).write_volatile(pack_bf16x2(v, 0.0) as u16)
                    };
                }
            });
        });
    });
}

/// Epilogue [`EPI_QKV`]: RoPE on the Q and K heads (rotate half: the lane holds dim `j = 8 p' +
/// g` in `d[0..2]` and `j + d/2` in `d[2..4]`, `p'` the row tile within the head), Q to C, K and
/// V into the paged caches at each token's position (`qkv_store`, shared with the swap-AB GEMM).
///
/// # Safety
/// The launch contract of the qkv entries: the argument block (`QKV_ARGS` words) describes a
/// positions array of `m` u32, a block table of `m` rows of `bt_stride` u32, K and V caches of
/// `num_pages * kv_heads * page_size * head_dim` bf16, a RoPE table of `max_pos * head_dim`
/// f32; C holds `m` rows of pitch `ldc >= heads * head_dim` bf16; `n = (heads + 2 kv_heads) *
/// head_dim`, `head_dim` a multiple of 16. A position `>= max_pos`, a page `>= num_pages` or a
/// position beyond the block table traps.
#[inline(always)]
unsafe fn epilogue_qkv<const T: usize, const R: usize>(
    p: &Params,
    acc: &[[[f32; 4]; 8]; MAX_ROW_TILES],
    r0: &[u64; MAX_ROW_TILES],
    t: u32,
) {
    // SAFETY: the launch contract (QKV_ARGS readable words describing the buffers).
    let a = unsafe { QkvArgs::load(p.epi) };
    unroll!(RT in [0, 1] {
        unroll!(Q in [0, 1, 2, 3, 4, 5, 6, 7] {
            unroll!(I in [0, 1] {
                let tok = (Q * TOKENS_PER_TILE) as u32 + 2 * t + I as u32;
                if RT < R && Q < T && r0[RT] < p.n as u64 && tok < p.m {
                    let base = r0[RT] - r0[RT] % 16; // first row of the tile
                    let g = r0[RT] % 16;
                    let head = base / a.d;
                    let j = (base % a.d) / 2 + g; // 8 p' + g
                    let x0 = p.alpha * acc[RT][Q][I];
                    let x1 = p.alpha * acc[RT][Q][2 + I];
                    // SAFETY: tok < m, head < n / d, j < d / 2 (the packed rows); C holds m rows
                    // of pitch ldc >= heads * d (launch contract); one writer per element.
                    unsafe { a.store_pair(p.c as *mut u16, p.ldc as u64, tok, head, j, x0, x1) };
                }
            });
        });
    });
}

macro_rules! entry {
    ($name:ident, $bf16:literal, $t:literal, $u:literal) => {
        entry!($name, $bf16, $t, $u, 1, false);
    };
    ($name:ident, $bf16:literal, $t:literal, $u:literal, $r:literal, $pa:literal) => {
        /// Entry of [`crate::contract::decode_gemm`] (input type, token tiles, unroll, row tiles
        /// and A prefetch in the name; see `contract::decode_gemm::VARIANTS`).
        ///
        /// # Safety
        /// The launch contract of [`crate::contract::decode_gemm`]: `a` is `m x k` (pitch `lda`),
        /// `b` is `n x k` (pitch `ldb`), both 16-byte aligned with pitches multiple of 8
        /// elements and not written during the kernel (nor, with `FLAG_WEIGHTS_EARLY` in
        /// `flags`, by the preceding kernel); `c` is `m x n` (pitch `ldc`) of f32 (`out_f32 != 0`) or the input
        /// type, aliasing neither; `m <= 8 * token tiles`.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            a: *const u16,
            b: *const u16,
            c: *mut u8,
            m: u32,
            n: u32,
            k: u32,
            lda: u32,
            ldb: u32,
            ldc: u32,
            alpha: f32,
            beta: f32,
            out_f32: u32,
            ksplit: u32,
            flags: u32,
        ) {
            if m as usize > $t * TOKENS_PER_TILE {
                trap();
            }
            let p = Params {
                a,
                b,
                c,
                m,
                n,
                k,
                lda,
                ldb,
                ldc,
                alpha,
                beta,
                out_f32: out_f32 != 0,
                ksplit,
                weights_early: flags & FLAG_WEIGHTS_EARLY != 0,
                l2_prefetch: flags & FLAG_L2_PREFETCH_256 != 0,
                pf_iters: 0,
                stamps: core::ptr::null_mut(),
                stamp_slot: 0,
                epi: core::ptr::null(),
            };
            // SAFETY: the caller's launch contract.
            unsafe { decode::<$bf16, $t, $u, $r, $pa, EPI_STORE>(p) }
        }
    };
}

entry!(decode_gemm_bf16_t1_u2, true, 1, 2);
entry!(decode_gemm_bf16_t1_u4, true, 1, 4);
entry!(decode_gemm_bf16_t2_u2, true, 2, 2);
entry!(decode_gemm_bf16_t2_u4, true, 2, 4);
entry!(decode_gemm_bf16_t4_u2, true, 4, 2);
entry!(decode_gemm_bf16_t4_u4, true, 4, 4);
entry!(decode_gemm_bf16_t8_u2, true, 8, 2);
entry!(decode_gemm_bf16_t8_u4, true, 8, 4);
entry!(decode_gemm_f16_t1_u2, false, 1, 2);
entry!(decode_gemm_f16_t1_u4, false, 1, 4);
entry!(decode_gemm_f16_t2_u2, false, 2, 2);
entry!(decode_gemm_f16_t2_u4, false, 2, 4);
entry!(decode_gemm_f16_t4_u2, false, 4, 2);
entry!(decode_gemm_f16_t4_u4, false, 4, 4);
entry!(decode_gemm_f16_t8_u2, false, 8, 2);
entry!(decode_gemm_f16_t8_u4, false, 8, 4);
entry!(decode_gemm_bf16_t1_u2_r2, true, 1, 2, 2, false);
entry!(decode_gemm_bf16_t1_u4_r2, true, 1, 4, 2, false);
entry!(decode_gemm_bf16_t2_u2_r2, true, 2, 2, 2, false);
entry!(decode_gemm_bf16_t2_u4_r2, true, 2, 4, 2, false);
entry!(decode_gemm_bf16_t4_u2_r2, true, 4, 2, 2, false);
entry!(decode_gemm_bf16_t4_u4_r2, true, 4, 4, 2, false);
entry!(decode_gemm_f16_t1_u2_r2, false, 1, 2, 2, false);
entry!(decode_gemm_f16_t1_u4_r2, false, 1, 4, 2, false);
entry!(decode_gemm_f16_t2_u2_r2, false, 2, 2, 2, false);
entry!(decode_gemm_f16_t2_u4_r2, false, 2, 4, 2, false);
entry!(decode_gemm_f16_t4_u2_r2, false, 4, 2, 2, false);
entry!(decode_gemm_f16_t4_u4_r2, false, 4, 4, 2, false);
entry!(decode_gemm_bf16_t1_u2_pa, true, 1, 2, 1, true);
entry!(decode_gemm_bf16_t2_u2_pa, true, 2, 2, 1, true);
entry!(decode_gemm_bf16_t4_u2_pa, true, 4, 2, 1, true);
entry!(decode_gemm_bf16_t8_u2_pa, true, 8, 2, 1, true);
entry!(decode_gemm_bf16_t1_u2_r2_pa, true, 1, 2, 2, true);
entry!(decode_gemm_bf16_t2_u2_r2_pa, true, 2, 2, 2, true);
entry!(decode_gemm_bf16_t4_u2_r2_pa, true, 4, 2, 2, true);
entry!(decode_gemm_f16_t1_u2_pa, false, 1, 2, 1, true);
entry!(decode_gemm_f16_t2_u2_pa, false, 2, 2, 1, true);
entry!(decode_gemm_f16_t4_u2_pa, false, 4, 2, 1, true);
entry!(decode_gemm_f16_t8_u2_pa, false, 8, 2, 1, true);
entry!(decode_gemm_f16_t1_u2_r2_pa, false, 1, 2, 2, true);
entry!(decode_gemm_f16_t2_u2_r2_pa, false, 2, 2, 2, true);
entry!(decode_gemm_f16_t4_u2_r2_pa, false, 4, 2, 2, true);

macro_rules! epi_entry {
    ($name:ident, $t:literal, $epi:expr) => {
        epi_entry!($name, $t, 4, 1, false, $epi);
    };
    ($name:ident, $t:literal, $u:literal, $r:literal, $pa:literal, $epi:expr) => {
        /// Epilogue entry of [`crate::contract::decode_gemm`] (issue 21; `EPI_VARIANTS`): bf16,
        /// unroll, row tiles, A prefetch and the epilogue in the name.
        ///
        /// # Safety
        /// The launch contract of the plain entries (C of bf16), plus: `stamps` is 0 or a stamp
        /// buffer of `(slot + 1) * STAMP_WORDS` u64 (slot = `flags >> STAMP_SLOT_SHIFT`); for
        /// `_swiglu`, `n` is a multiple of 16 and C has `n / 2` columns; for `_qkv`, `epi` is
        /// the argument block of `EPI_QKV` (see `epilogue_qkv`); with `FLAG_PREFETCH_L2_BULK`
        /// also `FLAG_WEIGHTS_EARLY`'s promise.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            a: *const u16,
            b: *const u16,
            c: *mut u8,
            m: u32,
            n: u32,
            k: u32,
            lda: u32,
            ldb: u32,
            ldc: u32,
            alpha: f32,
            beta: f32,
            out_f32: u32,
            ksplit: u32,
            flags: u32,
            stamps: *mut u64,
            epi: *const u64,
        ) {
            if m as usize > $t * TOKENS_PER_TILE || out_f32 != 0 {
                trap();
            }
            if $epi == EPI_QKV && epi.is_null() {
                trap();
            }
            let p = Params {
                a,
                b,
                c,
                m,
                n,
                k,
                lda,
                ldb,
                ldc,
                alpha,
                beta,
                out_f32: false,
                ksplit,
                weights_early: flags & FLAG_WEIGHTS_EARLY != 0,
                l2_prefetch: flags & FLAG_L2_PREFETCH_256 != 0,
                pf_iters: if flags & FLAG_PREFETCH_L2_BULK != 0 {
                    (flags >> PF_ITERS_SHIFT) & 0xff
                } else {
                    0
                },
                stamps,
                stamp_slot: flags >> STAMP_SLOT_SHIFT,
                epi,
            };
            // SAFETY: the caller's launch contract.
            unsafe { decode::<true, $t, $u, $r, $pa, { $epi }>(p) }
        }
    };
}

epi_entry!(decode_gemm_bf16_t1_u4_store, 1, EPI_STORE);
epi_entry!(decode_gemm_bf16_t2_u4_store, 2, EPI_STORE);
epi_entry!(decode_gemm_bf16_t4_u4_store, 4, EPI_STORE);
epi_entry!(decode_gemm_bf16_t8_u4_store, 8, EPI_STORE);
epi_entry!(decode_gemm_bf16_t1_u4_swiglu, 1, EPI_SWIGLU);
epi_entry!(decode_gemm_bf16_t2_u4_swiglu, 2, EPI_SWIGLU);
epi_entry!(decode_gemm_bf16_t4_u4_swiglu, 4, EPI_SWIGLU);
epi_entry!(decode_gemm_bf16_t8_u4_swiglu, 8, EPI_SWIGLU);
epi_entry!(decode_gemm_bf16_t1_u4_qkv, 1, EPI_QKV);
epi_entry!(decode_gemm_bf16_t2_u4_qkv, 2, EPI_QKV);
epi_entry!(decode_gemm_bf16_t4_u4_qkv, 4, EPI_QKV);
epi_entry!(decode_gemm_bf16_t8_u4_qkv, 8, EPI_QKV);
epi_entry!(decode_gemm_bf16_t1_u2_pa_store, 1, 2, 1, true, EPI_STORE);
epi_entry!(decode_gemm_bf16_t2_u2_pa_store, 2, 2, 1, true, EPI_STORE);
epi_entry!(decode_gemm_bf16_t4_u2_pa_store, 4, 2, 1, true, EPI_STORE);
epi_entry!(decode_gemm_bf16_t8_u2_pa_store, 8, 2, 1, true, EPI_STORE);
epi_entry!(decode_gemm_bf16_t1_u2_pa_swiglu, 1, 2, 1, true, EPI_SWIGLU);
epi_entry!(decode_gemm_bf16_t2_u2_pa_swiglu, 2, 2, 1, true, EPI_SWIGLU);
epi_entry!(decode_gemm_bf16_t4_u2_pa_swiglu, 4, 2, 1, true, EPI_SWIGLU);
epi_entry!(decode_gemm_bf16_t8_u2_pa_swiglu, 8, 2, 1, true, EPI_SWIGLU);
epi_entry!(decode_gemm_bf16_t1_u2_pa_qkv, 1, 2, 1, true, EPI_QKV);
epi_entry!(decode_gemm_bf16_t2_u2_pa_qkv, 2, 2, 1, true, EPI_QKV);
epi_entry!(decode_gemm_bf16_t4_u2_pa_qkv, 4, 2, 1, true, EPI_QKV);
epi_entry!(decode_gemm_bf16_t8_u2_pa_qkv, 8, 2, 1, true, EPI_QKV);
epi_entry!(decode_gemm_bf16_t1_u2_r2_pa_store, 1, 2, 2, true, EPI_STORE);
epi_entry!(decode_gemm_bf16_t2_u2_r2_pa_store, 2, 2, 2, true, EPI_STORE);
epi_entry!(decode_gemm_bf16_t4_u2_r2_pa_store, 4, 2, 2, true, EPI_STORE);
epi_entry!(
    decode_gemm_bf16_t1_u2_r2_pa_swiglu,
    1,
    2,
    2,
    true,
    EPI_SWIGLU
);
epi_entry!(
    decode_gemm_bf16_t2_u2_r2_pa_swiglu,
    2,
    2,
    2,
    true,
    EPI_SWIGLU
);
epi_entry!(
    decode_gemm_bf16_t4_u2_r2_pa_swiglu,
    4,
    2,
    2,
    true,
    EPI_SWIGLU
);
epi_entry!(decode_gemm_bf16_t1_u2_r2_pa_qkv, 1, 2, 2, true, EPI_QKV);
epi_entry!(decode_gemm_bf16_t2_u2_r2_pa_qkv, 2, 2, 2, true, EPI_QKV);
epi_entry!(decode_gemm_bf16_t4_u2_r2_pa_qkv, 4, 2, 2, true, EPI_QKV);
