//! The non-GEMM kernels of one LLM decode step (issue 21; launch contract
//! [`crate::contract::decode_step`]): RMSNorm, paged GQA decode attention with split-KV
//! (flash-decoding) and its combine step. The projections are `decode_gemm`'s epilogue entries.
//!
//! PDL: each kernel reads what does not depend on the previous kernel before
//! `griddepcontrol.wait` (with `FLAG_EARLY`): RMSNorm its weight, attention the block table and
//! positions (written by the host only) and an L2 prefetch of its first KV pages (the cache rows
//! of earlier tokens; the new token's row, written by the QKV GEMM, is read only after the
//! wait, and a prefetch only warms L2, which is coherent). Everything the previous kernel
//! writes is read, and everything is written, after the wait. Each kernel triggers
//! `launch_dependents` right after its wait: the dependent grid is scheduled once every CTA of
//! this grid has triggered, and its own `griddepcontrol.wait` still waits for this grid to
//! complete and flush (PTX ISA `griddepcontrol`), so the trigger's place only decides how early
//! the dependent's CTAs may become resident.
//!
//! Attention, one CTA per (sequence, KV head, split): 4 warps, each warp 4 tokens at a time (8
//! lanes per token, `d / 8` elements per lane, 16-byte loads of a K and a V row), every query
//! head of the KV head (`G`) against each K row it loads, so K and V are read once per
//! sequence; an online softmax per (warp, token slot, head) in registers (base 2: Q is
//! pre-scaled by `log2(e) / sqrt(d)`), the next token's K and V loaded before the current one
//! is used; the 16 states of the CTA merged through shared memory at the end.

use crate::contract::decode_step::*;
use crate::device::math::{exp2_approx, pack_bf16x2};
use crate::device::mma::ld_global_nc_v4;
use crate::device::pdl;
use crate::device::smem::{dynamic_smem_base, dynamic_smem_size, Shared};
use crate::device::thread::{block_dim_x, block_idx_x, sync_threads, thread_idx_x};
use crate::device::warp::{reduce_sum_f32, shfl_xor_f32};

use super::decode_gemm::{prefetch_l2, stamp};

/// `$body` once for each `$i` in the list, as a constant.
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

/// `sqrt.rn.f32`.
#[inline(always)]
fn sqrt_rn(x: f32) -> f32 {
    let r: f32;
    // SAFETY: an arithmetic instruction on registers.
    unsafe {
        core::arch::asm!("sqrt.rn.f32 {r}, {x};", r = out(reg32) r, x = in(reg32) x,
            options(pure, nomem, nostack))
    };
    r
}

/// The 8 bf16 of a 16-byte vector, widened.
#[inline(always)]
fn unpack8(v: [u32; 4]) -> [f32; 8] {
    let mut o = [0.0f32; 8];
    unroll!(I in [0, 1, 2, 3] {
        o[2 * I] = f32::from_bits(v[I] << 16);
        o[2 * I + 1] = f32::from_bits(v[I] & 0xffff_0000);
    });
    o
}

/// RMSNorm of one row per CTA (`RMSNORM_THREADS` threads, `n <= RMSNORM_MAX_N`, `n % 8 == 0`).
///
/// # Safety
/// `x` and `out` hold `rows x n` bf16, `w` `n` bf16, `resid` is null or `rows x n` bf16, all
/// 16-byte aligned; `out` and `resid` alias nothing else; `w` is not written by the previous
/// kernel (read before `griddepcontrol.wait` with `FLAG_EARLY`); `stamps` as in `decode_gemm`.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn decode_rmsnorm_bf16(
    x: *const u16,
    w: *const u16,
    out: *mut u16,
    resid: *mut u16,
    rows: u32,
    n: u32,
    eps: f32,
    stamps: *mut u64,
    flags: u32,
) {
    let slot = flags >> STAMP_SLOT_SHIFT;
    // SAFETY: the launch contract (stamps).
    unsafe { stamp(stamps, slot, 0) };
    let tid = thread_idx_x();
    if block_dim_x() != RMSNORM_THREADS
        || !n.is_multiple_of(8)
        || n as usize > RMSNORM_MAX_N
        || dynamic_smem_size() < 32 * 4
    {
        trap();
    }
    let row = block_idx_x();
    if row >= rows {
        return;
    }
    let nv = n / 8;
    let mut wv = [[0u32; 4]; RMSNORM_VECS];
    let early = flags & FLAG_EARLY != 0;
    let load_w = |wv: &mut [[u32; 4]; RMSNORM_VECS]| {
        unroll!(I in [0, 1, 2, 3] {
            let v = tid + (I as u32) * RMSNORM_THREADS;
            if v < nv {
                // SAFETY: vector v < n / 8 of the weight (launch contract), 16-byte aligned.
                wv[I] = unsafe { ld_global_nc_v4(w.add(8 * v as usize) as *const u32) };
            }
        });
    };
    if early {
        load_w(&mut wv);
    }
    pdl::wait();
    // SAFETY: as above.
    unsafe {
        stamp(stamps, slot, 1);
        stamp(stamps, slot, 2);
    }
    pdl::launch_dependents();
    if !early {
        load_w(&mut wv);
    }
    let base = row as usize * n as usize;
    let mut xv = [[0u32; 4]; RMSNORM_VECS];
    let mut ss = 0.0f32;
    unroll!(I in [0, 1, 2, 3] {
        let v = tid + (I as u32) * RMSNORM_THREADS;
        if v < nv {
            // SAFETY: row < rows, vector v < n / 8: inside x (launch contract).
            xv[I] = unsafe { ld_global_nc_v4(x.add(base + 8 * v as usize) as *const u32) };
            for e in unpack8(xv[I]) {
                ss = crate::device::math::fma(e, e, ss);
            }
        }
    });
    // SAFETY: all threads of every warp reach this reduction (no divergence above it).
    ss = unsafe { reduce_sum_f32(ss) };
    let smem = Shared::<f32>::at(dynamic_smem_base());
    let warp = tid / 32;
    if tid.is_multiple_of(32) {
        // SAFETY: warp < 8 <= 32 floats of dynamic shared memory (checked).
        unsafe { smem.add(warp).store(ss) };
    }
    // SAFETY: every thread of the CTA reaches this barrier.
    unsafe { sync_threads() };
    let mut total = 0.0f32;
    let mut i = 0;
    while i < RMSNORM_THREADS / 32 {
        // SAFETY: written before the barrier.
        total += unsafe { smem.add(i).load() };
        i += 1;
    }
    let inv = 1.0 / sqrt_rn(total / n as f32 + eps);
    unroll!(I in [0, 1, 2, 3] {
        let v = tid + (I as u32) * RMSNORM_THREADS;
        if v < nv {
            let xs = unpack8(xv[I]);
            let ws = unpack8(wv[I]);
            let mut o = [0u32; 4];
            unroll!(J in [0, 1, 2, 3] {
                o[J] = pack_bf16x2(xs[2 * J] * inv * ws[2 * J], xs[2 * J + 1] * inv * ws[2 * J + 1]);
            });
            let off = base + 8 * v as usize;
            // SAFETY: inside out (and resid) as above; one writer per vector.
            unsafe {
                crate::device::smem::store_global_v4(
                    out.add(off) as *mut f32,
                    [f32::from_bits(o[0]), f32::from_bits(o[1]), f32::from_bits(o[2]), f32::from_bits(o[3])],
                );
                if !resid.is_null() {
                    crate::device::smem::store_global_v4(
                        resid.add(off) as *mut f32,
                        [
                            f32::from_bits(xv[I][0]),
                            f32::from_bits(xv[I][1]),
                            f32::from_bits(xv[I][2]),
                            f32::from_bits(xv[I][3]),
                        ],
                    );
                }
            }
        }
    });
    // SAFETY: as above.
    unsafe { stamp(stamps, slot, 3) };
}

/// The attention kernel's parameters.
#[derive(Clone, Copy)]
struct Attn {
    q: *const u16,
    k_cache: *const u16,
    v_cache: *const u16,
    block_table: *const u32,
    positions: *const u32,
    out: *mut u16,
    part_o: *mut f32,
    part_ml: *mut f32,
    n_kv: u32,
    page_size: u32,
    bt_stride: u32,
    num_pages: u32,
    splits: u32,
    pages_per_split: u32,
    scale_log2: f32,
    stamps: *mut u64,
    flags: u32,
}

/// K or V of one token for this lane: `NV` 16-byte vectors (`d / 8` elements from `8 sub * NV`).
///
/// # Safety
/// `cache` is a cache of the launch contract and `page < num_pages`.
#[inline(always)]
unsafe fn load_row<const NV: usize>(
    cache: *const u16,
    p: &Attn,
    page: u32,
    kvh: u32,
    row: u32,
    sub: u32,
) -> [[u32; 4]; 2] {
    let d = 64 * NV;
    let off = ((page as usize * p.n_kv as usize + kvh as usize) * p.page_size as usize
        + row as usize)
        * d
        + sub as usize * 8 * NV;
    let mut v = [[0u32; 4]; 2];
    unroll!(I in [0, 1] {
        if I < NV {
            // SAFETY: the caller's contract; 16-byte aligned (d and 8 NV multiples of 8).
            v[I] = unsafe { ld_global_nc_v4(cache.add(off + 8 * I) as *const u32) };
        }
    });
    v
}

/// The attention body for head dim `64 * NV` and `G` query heads per KV head.
///
/// # Safety
/// The launch contract of [`crate::contract::decode_step`] attention entries.
#[inline(always)]
unsafe fn attn<const NV: usize, const G: usize>(p: Attn) {
    const { assert!(NV >= 1 && NV <= 2 && G >= 1 && G <= 8 && G * NV <= 8) };
    let d = 64 * NV as u32;
    let per_lane = 8 * NV; // elements of d per lane
    let slot = p.flags >> STAMP_SLOT_SHIFT;
    // SAFETY: the launch contract (stamps).
    unsafe { stamp(p.stamps, slot, 0) };
    let tid = thread_idx_x();
    if block_dim_x() != ATTN_WARPS * 32
        || p.splits == 0
        || p.page_size == 0
        || (dynamic_smem_size() as usize) < attn_smem_bytes(d as usize, G)
    {
        trap();
    }
    let (warp, lane) = (tid / 32, tid % 32);
    let (grp, sub) = (lane / 8, lane % 8);
    let cta = block_idx_x();
    let split = cta % p.splits;
    let rest = cta / p.splits;
    let kvh = rest % p.n_kv;
    let b = rest / p.n_kv;
    let heads = p.n_kv * G as u32;
    // Positions and block tables are written by the host only: readable before the wait.
    // SAFETY: b < batch (grid = batch * n_kv * splits; launch contract).
    let pos = unsafe { p.positions.add(b as usize).read() };
    let len = pos + 1;
    let bt_row = p
        .block_table
        .wrapping_add(b as usize * p.bt_stride as usize);
    let span = p.pages_per_split * p.page_size;
    let t_begin = split * span;
    let t_end = if t_begin + span < len {
        t_begin + span
    } else {
        len
    };
    if len.div_ceil(p.page_size) > p.bt_stride {
        trap();
    }
    let page_of = |t: u32| -> u32 {
        // SAFETY: t < len, so t / page_size < bt_stride (checked): inside the table row.
        let pg = unsafe { bt_row.add((t / p.page_size) as usize).read() };
        if pg >= p.num_pages {
            trap();
        }
        pg
    };
    if p.flags & FLAG_EARLY != 0 && t_begin < t_end {
        let first = t_begin / p.page_size;
        let last = (t_end - 1) / p.page_size;
        let n = last - first + 1;
        let n = if n < ATTN_PREFETCH_PAGES {
            n
        } else {
            ATTN_PREFETCH_PAGES
        };
        if tid < 2 * n {
            let pg = page_of((first + tid / 2) * p.page_size);
            let cache = if tid.is_multiple_of(2) {
                p.k_cache
            } else {
                p.v_cache
            };
            let off =
                (pg as usize * p.n_kv as usize + kvh as usize) * p.page_size as usize * d as usize;
            // SAFETY: one page of one KV head: page_size * d bf16 inside the cache, 16-byte
            // aligned, a multiple of 16 bytes; a prefetch changes nothing.
            unsafe { prefetch_l2(cache.add(off) as *const u8, p.page_size * d * 2) };
        }
    }
    pdl::wait();
    // SAFETY: as above.
    unsafe {
        stamp(p.stamps, slot, 1);
        stamp(p.stamps, slot, 2);
    }
    pdl::launch_dependents();

    // Q of the G heads, this lane's elements, pre-scaled.
    let mut q = [[0.0f32; 16]; 8];
    unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
        if J < G {
            let qh = kvh * G as u32 + J as u32;
            let off = (b as usize * heads as usize + qh as usize) * d as usize
                + sub as usize * per_lane;
            unroll!(I in [0, 1] {
                if I < NV {
                    // SAFETY: q holds batch x heads x d bf16 (launch contract).
                    let v = unsafe { ld_global_nc_v4(p.q.add(off + 8 * I) as *const u32) };
                    let e = unpack8(v);
                    unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                        q[J][8 * I + E] = e[E] * p.scale_log2;
                    });
                }
            });
        }
    });
    let mut m = [M_INIT; 8];
    let mut l = [0.0f32; 8];
    let mut acc = [[0.0f32; 16]; 8];
    let tokens_per_iter = ATTN_WARPS * ATTN_TOKENS_PER_WARP;
    let iters = if t_end > t_begin {
        (t_end - t_begin).div_ceil(tokens_per_iter)
    } else {
        0
    };
    let my = |it: u32| t_begin + it * tokens_per_iter + warp * ATTN_TOKENS_PER_WARP + grp;
    let load = |it: u32| -> (bool, [[u32; 4]; 2], [[u32; 4]; 2]) {
        let t = my(it);
        if it < iters && t < t_end {
            let pg = page_of(t);
            let row = t % p.page_size;
            // SAFETY: pg < num_pages (checked in page_of).
            unsafe {
                (
                    true,
                    load_row::<NV>(p.k_cache, &p, pg, kvh, row, sub),
                    load_row::<NV>(p.v_cache, &p, pg, kvh, row, sub),
                )
            }
        } else {
            (false, [[0; 4]; 2], [[0; 4]; 2])
        }
    };
    let mut cur = load(0);
    let mut it = 0;
    while it < iters {
        let nxt = load(it + 1);
        let (valid, kv, vv) = cur;
        let mut kf = [0.0f32; 16];
        let mut vf = [0.0f32; 16];
        unroll!(I in [0, 1] {
            if I < NV {
                let ke = unpack8(kv[I]);
                let ve = unpack8(vv[I]);
                unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                    kf[8 * I + E] = ke[E];
                    vf[8 * I + E] = ve[E];
                });
            }
        });
        unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
            if J < G {
                let mut s = 0.0f32;
                unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                    if E < 8 * NV {
                        s = crate::device::math::fma(q[J][E], kf[E], s);
                    }
                });
                // SAFETY: every lane of the warp runs every iteration (iters is CTA-uniform)
                // and every J: full-mask shuffles within the 8-lane group.
                unsafe {
                    s += shfl_xor_f32(s, 1);
                    s += shfl_xor_f32(s, 2);
                    s += shfl_xor_f32(s, 4);
                }
                if valid {
                    let m_new = if s > m[J] { s } else { m[J] };
                    let corr = exp2_approx(m[J] - m_new);
                    let pj = exp2_approx(s - m_new);
                    l[J] = l[J] * corr + pj;
                    unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                        if E < 8 * NV {
                            acc[J][E] = crate::device::math::fma(pj, vf[E], acc[J][E] * corr);
                        }
                    });
                    m[J] = m_new;
                }
            }
        });
        cur = nxt;
        it += 1;
    }

    // Merge the 16 states of the CTA: smem [state][head][d + 2] f32 (acc, then m, l).
    let smem = Shared::<f32>::at(dynamic_smem_base());
    let state = warp * ATTN_TOKENS_PER_WARP + grp;
    let row_len = d + 2;
    unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
        if J < G {
            let base = (state * G as u32 + J as u32) * row_len;
            unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                if E < 8 * NV {
                    // SAFETY: inside attn_smem_bytes (checked); each lane its own elements.
                    unsafe { smem.add(base + sub * per_lane as u32 + E as u32).store(acc[J][E]) };
                }
            });
            if sub == 0 {
                // SAFETY: as above.
                unsafe {
                    smem.add(base + d).store(m[J]);
                    smem.add(base + d + 1).store(l[J]);
                }
            }
        }
    });
    // SAFETY: every thread of the CTA reaches this barrier.
    unsafe { sync_threads() };
    let states = ATTN_WARPS * ATTN_TOKENS_PER_WARP;
    let mut idx = tid;
    while idx < G as u32 * d {
        let (j, e) = (idx / d, idx % d);
        let mut mm = M_INIT;
        let mut st = 0;
        while st < states {
            // SAFETY: written before the barrier.
            let v = unsafe { smem.add((st * G as u32 + j) * row_len + d).load() };
            mm = if v > mm { v } else { mm };
            st += 1;
        }
        let (mut lsum, mut o) = (0.0f32, 0.0f32);
        let mut st = 0;
        while st < states {
            let base = (st * G as u32 + j) * row_len;
            // SAFETY: as above.
            let (ms, ls, a) = unsafe {
                (
                    smem.add(base + d).load(),
                    smem.add(base + d + 1).load(),
                    smem.add(base + e).load(),
                )
            };
            let w = exp2_approx(ms - mm);
            lsum += ls * w;
            o += a * w;
            st += 1;
        }
        let qh = kvh * G as u32 + j;
        let row = b as usize * heads as usize + qh as usize;
        if p.splits == 1 {
            let v = if lsum > 0.0 { o / lsum } else { 0.0 };
            // SAFETY: out holds batch x heads x d bf16; one writer per element.
            unsafe {
                p.out
                    .add(row * d as usize + e as usize)
                    .write_volatile(pack_bf16x2(v, 0.0) as u16)
            };
        } else {
            let ps = row * p.splits as usize + split as usize;
            let v = if lsum > 0.0 { o / lsum } else { 0.0 };
            // SAFETY: part_o holds batch x heads x splits x d f32, part_ml x 2; one writer.
            unsafe {
                p.part_o.add(ps * d as usize + e as usize).write_volatile(v);
                if e == 0 {
                    p.part_ml.add(2 * ps).write_volatile(mm);
                    p.part_ml.add(2 * ps + 1).write_volatile(lsum);
                }
            }
        }
        idx += block_dim_x();
    }
    // SAFETY: as above.
    unsafe { stamp(p.stamps, slot, 3) };
}

macro_rules! attn_entry {
    ($name:ident, $nv:literal, $g:literal) => {
        /// Decode attention entry of [`crate::contract::decode_step`] (`ATTN_VARIANTS`).
        ///
        /// # Safety
        /// Grid `batch * n_kv * splits` CTAs of `ATTN_WARPS * 32` threads with
        /// `attn_smem_bytes` of dynamic shared memory; `q` `batch x heads x d` bf16 (`heads =
        /// n_kv * G`); caches `num_pages x n_kv x page_size x d` bf16; `block_table` `batch x
        /// bt_stride` u32, `positions` `batch` u32 (`splits_pps = splits | pages_per_split << 16`) (both not written by any kernel while this
        /// one may run); with `splits == 1` `out` `batch x heads x d` bf16, else `part_o`
        /// `batch x heads x splits x d` f32 and `part_ml` `batch x heads x splits x 2` f32;
        /// outputs alias nothing. A page `>= num_pages` or a length beyond the table traps.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $name(
            q: *const u16,
            k_cache: *const u16,
            v_cache: *const u16,
            block_table: *const u32,
            positions: *const u32,
            out: *mut u16,
            part_o: *mut f32,
            part_ml: *mut f32,
            n_kv: u32,
            page_size: u32,
            bt_stride: u32,
            num_pages: u32,
            splits_pps: u32,
            scale_log2: f32,
            stamps: *mut u64,
            flags: u32,
        ) {
            let (splits, pages_per_split) = (splits_pps & 0xffff, splits_pps >> 16);
            let p = Attn {
                q,
                k_cache,
                v_cache,
                block_table,
                positions,
                out,
                part_o,
                part_ml,
                n_kv,
                page_size,
                bt_stride,
                num_pages,
                splits,
                pages_per_split,
                scale_log2,
                stamps,
                flags,
            };
            // SAFETY: the caller's launch contract.
            unsafe { attn::<$nv, $g>(p) }
        }
    };
}

attn_entry!(decode_attn_bf16_d64_g1, 1, 1);
attn_entry!(decode_attn_bf16_d64_g2, 1, 2);
attn_entry!(decode_attn_bf16_d64_g4, 1, 4);
attn_entry!(decode_attn_bf16_d64_g8, 1, 8);
attn_entry!(decode_attn_bf16_d128_g1, 2, 1);
attn_entry!(decode_attn_bf16_d128_g2, 2, 2);
attn_entry!(decode_attn_bf16_d128_g4, 2, 4);

/// Merges the splits of one (sequence, query head) per CTA: `out = sum_s w_s o_s / sum_s w_s`
/// with `w_s = l_s 2^(m_s - max m)`.
///
/// # Safety
/// Grid `batch * heads` CTAs of `COMBINE_THREADS` threads; `part_o` `batch x heads x splits x
/// head_dim` f32 and `part_ml` `batch x heads x splits x 2` f32 written by the previous kernel;
/// `out` `batch x heads x head_dim` bf16, aliasing neither.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "ptx-kernel" fn decode_attn_combine_bf16(
    part_o: *const f32,
    part_ml: *const f32,
    out: *mut u16,
    head_dim: u32,
    splits: u32,
    stamps: *mut u64,
    flags: u32,
) {
    let slot = flags >> STAMP_SLOT_SHIFT;
    // SAFETY: the launch contract (stamps).
    unsafe { stamp(stamps, slot, 0) };
    pdl::wait();
    // SAFETY: as above.
    unsafe {
        stamp(stamps, slot, 1);
        stamp(stamps, slot, 2);
    }
    pdl::launch_dependents();
    let row = block_idx_x() as usize;
    let mut e = thread_idx_x();
    while e < head_dim {
        let mut mm = M_INIT;
        let mut s = 0;
        while s < splits {
            // SAFETY: row < batch * heads, s < splits (launch contract).
            let (ms, ls) = unsafe {
                let q = part_ml.add(2 * (row * splits as usize + s as usize));
                (q.read_volatile(), q.add(1).read_volatile())
            };
            if ls > 0.0 && ms > mm {
                mm = ms;
            }
            s += 1;
        }
        let (mut num, mut den) = (0.0f32, 0.0f32);
        let mut s = 0;
        while s < splits {
            let ps = row * splits as usize + s as usize;
            // SAFETY: as above.
            let (ms, ls, o) = unsafe {
                (
                    part_ml.add(2 * ps).read_volatile(),
                    part_ml.add(2 * ps + 1).read_volatile(),
                    part_o
                        .add(ps * head_dim as usize + e as usize)
                        .read_volatile(),
                )
            };
            if ls > 0.0 {
                let w = ls * exp2_approx(ms - mm);
                num += w * o;
                den += w;
            }
            s += 1;
        }
        let v = if den > 0.0 { num / den } else { 0.0 };
        // SAFETY: out holds batch x heads x head_dim bf16; one writer per element.
        unsafe {
            out.add(row * head_dim as usize + e as usize)
                .write_volatile(pack_bf16x2(v, 0.0) as u16)
        };
        e += block_dim_x();
    }
    // SAFETY: as above.
    unsafe { stamp(stamps, slot, 3) };
}
