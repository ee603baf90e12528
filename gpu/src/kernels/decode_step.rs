//! The non-GEMM kernels of one LLM decode step (issue 21; launch contract
//! [`crate::contract::decode_step`]): RMSNorm, paged GQA decode attention with split-KV
//! (flash-decoding) whose last CTA per (sequence, KV head) combines the splits. The projections
//! are GEMM epilogue entries.
//!
//! PDL: each kernel reads what does not depend on the previous kernel before
//! `griddepcontrol.wait` (with `FLAG_EARLY`): RMSNorm its weight, attention the block table and
//! positions (written by the host only) and the chunks of earlier tokens' KV rows, copied into
//! its ring (no kernel of the step writes them; the chunk holding the new token's row, written
//! by the QKV GEMM, is copied only after the wait). Everything the previous kernel writes is
//! read, and everything is written, after the wait. The attention's consumers trigger
//! `launch_dependents` right after their wait, RMSNorm and the attention's loader warp at their
//! start: the dependent grid is scheduled once every CTA of
//! this grid has triggered, and its own `griddepcontrol.wait` still waits for this grid to
//! complete and flush (PTX ISA `griddepcontrol`), so the trigger's place only decides how early
//! the dependent's CTAs may become resident.
//!
//! Attention, two forms with one parameter list: the tensor-core form ([`attn_tc`], the host's
//! default where its TMA boxes tile the pages) and the CUDA-core form described here. One CTA
//! per (sequence, KV head, split), warp-specialized: a loader warp streams the
//! split's KV cache into shared memory by `cp.async.bulk` (chunks of up to 32 rows of one page,
//! K and V, an `ATTN_STAGES`-deep ring of full/empty mbarriers, so ~64 KiB per CTA are in
//! flight); 8 consumer warps score each chunk, 8 lanes per row, `d / 8` elements per lane, every
//! query head of the KV head (`G`) against each K row, so K and V are read once per sequence; an
//! online softmax per (warp, row slot, head) in registers (base 2: Q is pre-scaled by
//! `log2(e) / sqrt(d)`); the 32 states of the CTA merged through shared memory at the end. With
//! `FLAG_EARLY` the loader copies the chunks of earlier tokens before `griddepcontrol.wait` (the
//! chunk holding the new token's row, which the QKV GEMM writes, only after it).

use crate::contract::decode_step::*;
use crate::device::bulk;
use crate::device::math::{exp2_approx, pack_bf16x2};
use crate::device::mma::{
    ld_global_cg_v4, ld_global_nc_v4, ldmatrix_x4, ldmatrix_x4_trans, mma_m16n8k16_f32_bf16,
    mma_m16n8k8_f32_bf16,
};
use crate::device::pdl;
use crate::device::pipeline::{PipelineState, TmaPipeline};
use crate::device::signal::{count_arrival, fence_gpu};
use crate::device::smem::{dynamic_smem_base, dynamic_smem_size, Shared};
use crate::device::thread::{block_dim_x, block_idx_x, sync_threads, thread_idx_x};
use crate::device::tma::TensorMap;
use crate::device::warp::{reduce_sum_f32, shfl_xor_f32, sync_warp};

use super::decode_gemm::stamp;

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
/// With `partials` non-null, the first half of a fused RMSNorm instead
/// (`contract::swap_ab_gemm::FLAG_NORM_IN`): `out = bf16(x * w)`, unscaled, and the sums of
/// squares of each 64 columns of x into `partials[row][ceil(n / 64)]`.
///
/// # Safety
/// `x` and `out` hold `rows x n` bf16, `w` `n` bf16, `resid` is null or `rows x n` bf16, all
/// 16-byte aligned; `out` and `resid` alias nothing else; `w` is not written by the previous
/// kernel (read before `griddepcontrol.wait` with `FLAG_EARLY`); the kernel launched after this
/// one reads nothing before its own wait that the kernel before this one writes (this kernel
/// triggers `launch_dependents` at its start, so both may run at once); `stamps` as in
/// `decode_gemm`;
/// `partials` is null or holds `rows x ceil(n / 64)` f32 that alias nothing else.
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
    partials: *mut f32,
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
    // The GEMM after this kernel may be scheduled at once: its CTAs then load their first
    // weight tiles beside this tiny grid and the kernel before it (its own wait still waits
    // for this grid, which completes only after its own wait).
    pdl::launch_dependents();
    if early {
        load_w(&mut wv);
    }
    pdl::wait();
    // SAFETY: as above.
    unsafe {
        stamp(stamps, slot, 1);
        stamp(stamps, slot, 2);
    }
    if !early {
        load_w(&mut wv);
    }
    let base = row as usize * n as usize;
    let mut xv = [[0u32; 4]; RMSNORM_VECS];
    let mut ssv = [0.0f32; RMSNORM_VECS];
    unroll!(I in [0, 1, 2, 3] {
        let v = tid + (I as u32) * RMSNORM_THREADS;
        if v < nv {
            // SAFETY: row < rows, vector v < n / 8: inside x (launch contract).
            // `.cg`: x may be h, written by the previous kernel (PDL: not read-only for this
            // kernel's lifetime).
            xv[I] = unsafe { ld_global_cg_v4(x.add(base + 8 * v as usize) as *const u32) };
            for e in unpack8(xv[I]) {
                ssv[I] = crate::device::math::fma(e, e, ssv[I]);
            }
        }
    });
    let fused = !partials.is_null();
    if fused {
        // Each 64 columns are the vectors of 8 consecutive threads: their sum of squares, in
        // the first of them.
        let parts = nv.div_ceil(8);
        unroll!(I in [0, 1, 2, 3] {
            let mut p = ssv[I];
            // SAFETY: every lane runs these shuffles (uniform trip counts, no divergence).
            unsafe {
                p += crate::device::warp::shfl_xor_f32(p, 1);
                p += crate::device::warp::shfl_xor_f32(p, 2);
                p += crate::device::warp::shfl_xor_f32(p, 4);
            }
            let v = tid + (I as u32) * RMSNORM_THREADS;
            if v < nv && v.is_multiple_of(8) {
                // SAFETY: row < rows, part v / 8 < ceil(n / 64) (launch contract).
                unsafe {
                    crate::device::smem::store_global(
                        partials.add((row * parts + v / 8) as usize),
                        p,
                    )
                };
            }
        });
    }
    let mut ss = (ssv[0] + ssv[1]) + (ssv[2] + ssv[3]);
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
    // Fused: the consumer applies the row scale (from the partials).
    let inv = if fused {
        1.0
    } else {
        1.0 / sqrt_rn(total / n as f32 + eps)
    };
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
    kv_maps: u64,
    counters: *mut u32,
    flags: u32,
}

/// Element `half` (0: low, 1: high) of a packed bf16 pair, widened to f32, by an `asm!` that
/// LLVM treats as having effects: so the attention's packed Q is unpacked at each use inside the
/// chunk loop rather than hoisted out of it as 64 live floats (which spilled).
#[inline(always)]
fn q_el(x: u32, half: usize) -> f32 {
    let r: u32;
    // SAFETY: register arithmetic only.
    unsafe {
        if half == 0 {
            core::arch::asm!("shl.b32 {r}, {x}, 16;", r = out(reg32) r, x = in(reg32) x,
                options(nomem, nostack));
        } else {
            core::arch::asm!("and.b32 {r}, {x}, 0xffff0000;", r = out(reg32) r, x = in(reg32) x,
                options(nomem, nostack));
        }
    }
    f32::from_bits(r)
}

/// Token rows of chunk `k` of a split `[t_begin, t_end)`: [`ATTN_CHUNK_ROWS`] consecutive tokens
/// (the last chunk fewer), gathered from as many pages as they span. Returns (first token, rows).
#[inline(always)]
fn chunk_of(k: u32, t_begin: u32, t_end: u32) -> (u32, u32) {
    let tok = t_begin + k * ATTN_CHUNK_ROWS;
    let rows = t_end - tok;
    (
        tok,
        if rows < ATTN_CHUNK_ROWS {
            rows
        } else {
            ATTN_CHUNK_ROWS
        },
    )
}

/// The attention body for head dim `64 * NV` and `G` query heads per KV head.
///
/// Roles: warp [`ATTN_WARPS`] is the loader (lane 0 walks the split's chunks and bulk-copies
/// each chunk's K and V rows into the next stage of an [`ATTN_STAGES`]-deep ring, `cp.async.bulk`
/// completing on the stage's full mbarrier); warps `0..ATTN_WARPS` are the consumers (each
/// 8-lane group scores one row of the chunk against all `G` query heads and folds it into its
/// online softmax, then every lane of the warp releases the stage on its empty mbarrier).
///
/// # Safety
/// The launch contract of [`crate::contract::decode_step`] attention entries.
#[inline(always)]
unsafe fn attn<const NV: usize, const G: usize>(p: Attn) {
    const { assert!(NV >= 1 && NV <= 2 && G >= 1 && G <= 8 && G * NV <= 8) };
    let d = 64 * NV as u32;
    // SAFETY: the launch contract.
    let c = unsafe { attn_cta::<G>(&p, ATTN_THREADS, attn_smem_bytes(d as usize, G)) };
    let AttnCta {
        slot,
        b,
        kvh,
        heads,
        pos,
        t_begin,
        t_end,
        chunks,
        ..
    } = c;
    let tid = thread_idx_x();
    let (warp, lane) = (tid / 32, tid % 32);
    let (grp, sub) = (lane / 8, lane % 8);

    let base = dynamic_smem_base();
    // SAFETY: the barriers take the first `TmaPipeline::BYTES` (< ATTN_RING_OFFSET) bytes of
    // the dynamic shared memory (size checked above), used for nothing else; one release per
    // consumer lane per stage and phase; one producer arming exactly the bytes it copies.
    let pipe = unsafe { TmaPipeline::<ATTN_STAGES>::at(base) };
    // SAFETY: every thread, convergently, before any other use.
    unsafe { pipe.init_cta(ATTN_WARPS * 32) };
    let ring = base + ATTN_RING_OFFSET as u32;
    let row_bytes = d * 2;
    let half = ATTN_CHUNK_ROWS * row_bytes;
    let stage_bytes = 2 * half;

    let mut m = [M_INIT; 8];
    let mut l = [0.0f32; 8];
    let mut acc = [[0.0f32; 16]; 8];
    if warp == ATTN_WARPS {
        // Loader. The dependents may be scheduled once every CTA triggered (PTX ISA
        // `griddepcontrol`); the consumers trigger right after their wait.
        pdl::launch_dependents();
        if lane == 0 {
            // Without FLAG_EARLY every load waits for the predecessor. With it, the chunks of
            // earlier tokens (written by earlier steps, complete before this grid started) are
            // copied before the wait; the chunk holding row `pos`, which the QKV GEMM writes,
            // only after it.
            let mut waited = p.flags & FLAG_EARLY == 0;
            if waited {
                pdl::wait();
            }
            let mut st = PipelineState::<ATTN_STAGES>::new();
            let mut k = 0;
            while k < chunks {
                let (tok, rows) = chunk_of(k, t_begin, t_end);
                if !waited && tok + rows > pos {
                    pdl::wait();
                    waited = true;
                }
                let full = pipe.producer_acquire(st, 2 * rows * row_bytes);
                let dst = ring + st.stage() * stage_bytes;
                // One bulk copy of K and one of V per page the chunk spans.
                let mut t = tok;
                while t < tok + rows {
                    // SAFETY: t < t_end <= len.
                    let off = unsafe { cache_row(&p, &c, t, d) };
                    let in_page = t % p.page_size;
                    let left = p.page_size - in_page;
                    let seg = if left < tok + rows - t {
                        left
                    } else {
                        tok + rows - t
                    };
                    let at = dst + (t - tok) * row_bytes;
                    // SAFETY: `seg` rows of one page of one KV head: inside the caches (pg <
                    // num_pages), 16-byte aligned (d * 2 is a multiple of 16), a non-zero
                    // multiple of 16 bytes; the stage is free (acquired) and holds
                    // ATTN_CHUNK_ROWS rows per cache; the full barrier expects every byte.
                    unsafe {
                        bulk::load(at, p.k_cache.add(off) as *const u8, seg * row_bytes, full);
                        bulk::load(
                            at + half,
                            p.v_cache.add(off) as *const u8,
                            seg * row_bytes,
                            full,
                        );
                    }
                    t += seg;
                }
                st.advance();
                k += 1;
            }
        }
        // SAFETY: reconverges the loader warp before the CTA barrier below.
        unsafe { sync_warp() };
    } else {
        pdl::wait();
        // SAFETY: as above.
        unsafe {
            stamp(p.stamps, slot, 1);
            stamp(p.stamps, slot, 2);
        }
        pdl::launch_dependents();
        // Q of the G heads, this lane's elements (16-byte chunks `8 I + sub`), kept packed
        // (bf16 pairs, exact); the scale is applied to each score after its reduction.
        let mut q = [[[0u32; 4]; 2]; 8];
        unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
            if J < G {
                let qh = kvh * G as u32 + J as u32;
                let off = (b as usize * heads as usize + qh as usize) * d as usize;
                unroll!(I in [0, 1] {
                    if I < NV {
                        // SAFETY: q holds batch x heads x d bf16 (launch contract).
                        q[J][I] = unsafe {
                            ld_global_cg_v4(p.q.add(off + 64 * I + 8 * sub as usize) as *const u32)
                        };
                    }
                });
            }
        });
        let r = warp * ATTN_TOKENS_PER_WARP + grp;
        let mut st = PipelineState::<ATTN_STAGES>::new();
        let mut k = 0;
        while k < chunks {
            let (tok, rows) = chunk_of(k, t_begin, t_end);
            pipe.consumer_wait(st);
            let valid = r < rows && tok + r < t_end;
            // This lane's K and V elements of row r, still packed (bf16 pairs): widened where
            // used, so the registers hold 16 words instead of 32 floats.
            let mut kw = [[0u32; 4]; 2];
            let mut vw = [[0u32; 4]; 2];
            if r < rows {
                let row = ring + st.stage() * stage_bytes + r * row_bytes + 16 * sub;
                unroll!(I in [0, 1] {
                    if I < NV {
                        // SAFETY: row r < rows of the stage, which the loader filled and the
                        // full barrier completed; 16-byte aligned; 8 lanes read 128 contiguous
                        // bytes (no bank conflict).
                        unsafe {
                            kw[I] = Shared::<f32>::at(row + 128 * I as u32).load_v4().map(f32::to_bits);
                            vw[I] = Shared::<f32>::at(row + half + 128 * I as u32)
                                .load_v4()
                                .map(f32::to_bits);
                        }
                    }
                });
            }
            // Element 8 I + E of a packed row.
            let el = |w: &[[u32; 4]; 2], i: usize, e: usize| -> f32 {
                let x = w[i][e / 2];
                f32::from_bits(if e.is_multiple_of(2) {
                    x << 16
                } else {
                    x & 0xffff_0000
                })
            };
            // The G heads side by side at every step (independent chains, so one warp keeps
            // several FMAs, shuffles and ex2 in flight).
            let mut sc = [0.0f32; 8];
            unroll!(I in [0, 1] {
                if I < NV {
                    unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                        let kx = el(&kw, I, E);
                        unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                            if J < G {
                                sc[J] = crate::device::math::fma(q_el(q[J][I][E / 2], E % 2), kx, sc[J]);
                            }
                        });
                    });
                }
            });
            unroll!(X in [1, 2, 4] {
                unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if J < G {
                        // SAFETY: every lane of the warp runs every chunk (`chunks` is
                        // CTA-uniform) and every J: full-mask shuffles within the 8-lane group.
                        sc[J] += unsafe { shfl_xor_f32(sc[J], X as u32) };
                    }
                });
            });
            unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                if J < G {
                    sc[J] *= p.scale_log2;
                }
            });
            if valid {
                // Per head, 16 independent FMAs: enough in flight without interleaving heads.
                // The accumulators are rescaled only when the running maximum grows (after the
                // first rows of a split, rarely).
                unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
                    if J < G {
                        if sc[J] > m[J] {
                            let corr = exp2_approx(m[J] - sc[J]);
                            m[J] = sc[J];
                            l[J] = l[J] * corr + 1.0;
                            unroll!(I in [0, 1] {
                                if I < NV {
                                    unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                                        acc[J][8 * I + E] = crate::device::math::fma(
                                            acc[J][8 * I + E],
                                            corr,
                                            el(&vw, I, E),
                                        );
                                    });
                                }
                            });
                        } else {
                            let pj = exp2_approx(sc[J] - m[J]);
                            l[J] += pj;
                            unroll!(I in [0, 1] {
                                if I < NV {
                                    unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                                        acc[J][8 * I + E] = crate::device::math::fma(
                                            pj,
                                            el(&vw, I, E),
                                            acc[J][8 * I + E],
                                        );
                                    });
                                }
                            });
                        }
                    }
                });
            }
            // SAFETY: the whole warp reconverges. Then every lane releases the stage itself
            // (the empty barrier counts 32 per consumer warp): a release by lane 0 alone after
            // `bar.warp.sync` left the other lanes' reads outside the barrier's ordering for
            // racecheck, which reported hazards once the ring wrapped (head dims 128/g4 and
            // 64/g8 over 10 chunks, H200, session 11).
            unsafe { sync_warp() };
            pipe.consumer_release_local(st);
            st.advance();
            k += 1;
        }
    }
    // Every chunk the loader issued was waited for by the consumers: no copy is in flight, and
    // the merge area (over the ring) is free once every warp is past this barrier.
    // SAFETY: every thread of the CTA reaches it, warp-convergent (the loader warp reconverged).
    unsafe { sync_threads() };

    // Merge the ATTN_CHUNK_ROWS states of the CTA: smem [state][head][d + 2] f32 (acc, then m, l).
    let smem = Shared::<f32>::at(ring);
    let row_len = d + 2;
    if warp < ATTN_WARPS {
        let state = warp * ATTN_TOKENS_PER_WARP + grp;
        unroll!(J in [0, 1, 2, 3, 4, 5, 6, 7] {
            if J < G {
                let base = (state * G as u32 + J as u32) * row_len;
                unroll!(I in [0, 1] {
                    if I < NV {
                        unroll!(E in [0, 1, 2, 3, 4, 5, 6, 7] {
                            // SAFETY: inside attn_smem_bytes (checked); each lane its own
                            // elements (64 I + 8 sub + E).
                            unsafe {
                                smem.add(base + 64 * I as u32 + 8 * sub + E as u32)
                                    .store(acc[J][8 * I + E])
                            };
                        });
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
    }
    // SAFETY: every thread of the CTA reaches it; the states are written.
    unsafe { attn_merge::<G>(&p, &c, ring, d, ATTN_WARPS * ATTN_TOKENS_PER_WARP) };
}

/// Where one attention CTA works (both attention forms): its sequence `b`, KV head `kvh`, split,
/// the sequence's last position `pos`, its block-table row, and the split's tokens `[t_begin,
/// t_end)` in `chunks` chunks of [`ATTN_CHUNK_ROWS`].
#[derive(Clone, Copy)]
struct AttnCta {
    slot: u32,
    b: u32,
    kvh: u32,
    split: u32,
    heads: u32,
    pos: u32,
    bt_row: *const u32,
    t_begin: u32,
    t_end: u32,
    chunks: u32,
}

/// Stamps the CTA's start, checks the launch shape (`threads` per CTA, at least `smem` bytes of
/// dynamic shared memory, 1 to `MAX_SPLITS` splits, a non-zero page size, a length inside the
/// block table; traps
/// otherwise) and finds the CTA's work. Positions and block tables are written by the host only,
/// so this runs before `griddepcontrol.wait`.
///
/// # Safety
/// The launch contract of the attention entries.
#[inline(always)]
unsafe fn attn_cta<const G: usize>(p: &Attn, threads: u32, smem: usize) -> AttnCta {
    let slot = p.flags >> STAMP_SLOT_SHIFT;
    // SAFETY: the launch contract (stamps).
    unsafe { stamp(p.stamps, slot, 0) };
    if block_dim_x() != threads
        || p.splits == 0
        || p.splits > MAX_SPLITS
        || p.page_size == 0
        || (dynamic_smem_size() as usize) < smem
    {
        trap();
    }
    let cta = block_idx_x();
    let split = cta % p.splits;
    let rest = cta / p.splits;
    let kvh = rest % p.n_kv;
    let b = rest / p.n_kv;
    // SAFETY: b < batch (grid = batch * n_kv * splits; launch contract).
    let pos = unsafe { p.positions.add(b as usize).read() };
    let len = pos + 1;
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
    AttnCta {
        slot,
        b,
        kvh,
        split,
        heads: p.n_kv * G as u32,
        pos,
        bt_row: p
            .block_table
            .wrapping_add(b as usize * p.bt_stride as usize),
        t_begin,
        t_end,
        chunks: if t_end > t_begin {
            (t_end - t_begin).div_ceil(ATTN_CHUNK_ROWS)
        } else {
            0
        },
    }
}

/// Element offset of token `t`'s row (head dim `d`) of the CTA's KV head in either cache: the
/// page from the block table (a page `>= num_pages` traps).
///
/// # Safety
/// `t < len` of the CTA's sequence (so `t / page_size < bt_stride`, checked by [`attn_cta`]).
#[inline(always)]
unsafe fn cache_row(p: &Attn, c: &AttnCta, t: u32, d: u32) -> usize {
    // SAFETY: t < len, so t / page_size < bt_stride (checked): inside the row.
    let pg = unsafe { c.bt_row.add((t / p.page_size) as usize).read() };
    if pg >= p.num_pages {
        trap();
    }
    ((pg as usize * p.n_kv as usize + c.kvh as usize) * p.page_size as usize
        + (t % p.page_size) as usize)
        * d as usize
}

/// The end of both attention forms: merges the CTA's `states` online-softmax states, stored at
/// `ring` as `[state][head][d + 2]` f32 (accumulators, then running max and sum), into the
/// output (one split) or the split's partial output, max and sum; with several splits the CTA
/// that counts its (sequence, KV head)'s last split then combines them all ([`attn_combine`]);
/// stamps the CTA's end.
///
/// # Safety
/// Every thread of the CTA calls it, convergently, after writing its states (it starts with a
/// CTA barrier); the launch contract; at least `16 + 8 * G * splits` bytes from `ring` lie in
/// the dynamic shared memory.
#[inline(always)]
unsafe fn attn_merge<const G: usize>(p: &Attn, c: &AttnCta, ring: u32, d: u32, states: u32) {
    let smem = Shared::<f32>::at(ring);
    let row_len = d + 2;
    let (b, kvh, split, heads, slot) = (c.b, c.kvh, c.split, c.heads, c.slot);
    let tid = thread_idx_x();
    // SAFETY: every thread of the CTA reaches this barrier.
    unsafe { sync_threads() };
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
    if p.splits > 1 {
        // SAFETY: every thread, convergently; the launch contract.
        unsafe { attn_combine::<G>(p, c, ring, d) };
    }
    // SAFETY: as above.
    unsafe { stamp(p.stamps, slot, 3) };
}

/// The split-KV combine, fused into the attention (flash-decoding's reduction, done by the last
/// CTA of each (sequence, KV head) instead of a kernel of its own): each CTA publishes its
/// split's partials (every thread `fence.acq_rel.gpu` after its writes, then a CTA barrier) and
/// counts itself on its (sequence, KV head)'s counter (`atom.acq_rel.gpu.add`, thread 0). The
/// CTA that counts `splits - 1` resets the counter to 0 for the next launch and merges the
/// splits: every (head, split)'s (m, l) into shared memory at once, per head the weights `w_s =
/// l_s 2^(m_s - max m) / sum`, then `out = sum_s w_s o_s` per element, the partials read from L2
/// (`ld.global.cg`) 8 splits at a time: a few dependent L2 round trips in all.
///
/// # Safety
/// Every thread of the CTA calls it, convergently, after writing its split's partials; more
/// than one split; `p.counters` holds `batch x n_kv` u32, 0 before the launch and written by nothing else
/// during it; `16 + 8 * G * splits` bytes from `ring` lie in the dynamic shared memory, whose
/// earlier contents are no longer needed once every thread passed the first barrier.
#[inline(always)]
unsafe fn attn_combine<const G: usize>(p: &Attn, c: &AttnCta, ring: u32, d: u32) {
    let tid = thread_idx_x();
    let splits = p.splits;
    let flag = Shared::<u32>::at(ring);
    let wts = Shared::<f32>::at(ring + 16);
    fence_gpu();
    // SAFETY: every thread of the CTA reaches it (contract).
    unsafe { sync_threads() };
    if tid == 0 {
        // SAFETY: b < batch, kvh < n_kv: inside the counters (contract), which only this
        // launch's `splits` CTAs of this (sequence, KV head) touch, each once (a counter not 0
        // at the launch traps rather than merging splits not yet written).
        let last =
            unsafe { count_arrival(p.counters.add((c.b * p.n_kv + c.kvh) as usize), splits) };
        // SAFETY: inside the dynamic shared memory (contract); read after the barrier below.
        unsafe { flag.store(last as u32) };
    }
    // SAFETY: as above.
    unsafe { sync_threads() };
    // SAFETY: written before the barrier.
    if unsafe { flag.load() } == 0 {
        return;
    }
    fence_gpu();
    let row0 = (c.b * c.heads + c.kvh * G as u32) as usize;
    let nt = block_dim_x();
    // Every (head, split)'s (m, l) at once, one pair per thread: `[G][splits]` maxima at `wts`,
    // sums after them.
    let n = G as u32 * splits;
    let mut i = tid;
    while i < n {
        let (j, sp) = (i / splits, i % splits);
        let at = p
            .part_ml
            .wrapping_add(2 * ((row0 + j as usize) * splits as usize + sp as usize));
        // SAFETY: inside part_ml (j < G, sp < splits), written by this launch's CTAs before their
        // counts, which this CTA's count acquired; inside 16 + 8 G splits bytes (contract).
        unsafe {
            wts.add(i).store(ld_cg_f32(at));
            wts.add(n + i).store(ld_cg_f32(at.add(1)));
        }
        i += nt;
    }
    // SAFETY: every thread of the CTA reaches it.
    unsafe { sync_threads() };
    if tid < G as u32 {
        // Head tid's weights `w_s = l_s 2^(m_s - max m) / sum`, over its maxima in place.
        let (ms, ls) = (wts.add(tid * splits), wts.add(n + tid * splits));
        let mut mm = M_INIT;
        let mut sp = 0;
        while sp < splits {
            // SAFETY: written before the barrier.
            let (m, l) = unsafe { (ms.add(sp).load(), ls.add(sp).load()) };
            if l > 0.0 && m > mm {
                mm = m;
            }
            sp += 1;
        }
        let mut den = 0.0f32;
        let mut sp = 0;
        while sp < splits {
            // SAFETY: as above; only this thread touches head tid's entries now.
            unsafe {
                let (m, l) = (ms.add(sp).load(), ls.add(sp).load());
                let w = if l > 0.0 {
                    l * exp2_approx(m - mm)
                } else {
                    0.0
                };
                den += w;
                ms.add(sp).store(w);
            }
            sp += 1;
        }
        let inv = if den > 0.0 { 1.0 / den } else { 0.0 };
        let mut sp = 0;
        while sp < splits {
            // SAFETY: as above.
            unsafe { ms.add(sp).store(ms.add(sp).load() * inv) };
            sp += 1;
        }
    }
    // SAFETY: every thread of the CTA reaches it (the branch above holds no barrier).
    unsafe { sync_threads() };
    // One output element per thread and pass; its splits' partials in batches of 8 independent
    // L2 loads.
    let mut idx = tid;
    while idx < G as u32 * d {
        let (j, e) = (idx / d, idx % d);
        let row = row0 + j as usize;
        let po = p
            .part_o
            .wrapping_add(row * splits as usize * d as usize + e as usize);
        let mut o = 0.0f32;
        let mut s0 = 0;
        while s0 < splits {
            let mut v = [0.0f32; 8];
            unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
                if s0 + (U as u32) < splits {
                    // SAFETY: split s0 + U < splits, e < d: inside part_o; published as the
                    // (m, l) were.
                    v[U] = unsafe { ld_cg_f32(po.add((s0 as usize + U) * d as usize)) };
                }
            });
            unroll!(U in [0, 1, 2, 3, 4, 5, 6, 7] {
                if s0 + (U as u32) < splits {
                    // SAFETY: written before the barrier.
                    o += unsafe { wts.add(j * splits + s0 + U as u32).load() } * v[U];
                }
            });
            s0 += 8;
        }
        // SAFETY: out holds batch x heads x d bf16; one writer per element.
        unsafe {
            p.out
                .add(row * d as usize + e as usize)
                .write_volatile(pack_bf16x2(o, 0.0) as u16)
        };
        idx += nt;
    }
}

/// The tensor-core attention body for head dim `64 * NV` and `G` query heads per KV head (the
/// `tc_kernel` of each `AttnVariant`; same parameters, grid and outputs as [`attn`]).
///
/// Roles: warp [`ATTN_TC_WARPS`] is the loader: its lane 0 copies each chunk's K and V rows by
/// TMA (`cp.async.bulk.tensor.2d`, the `kv_maps` tensor maps, boxes of 64 columns by
/// [`attn_tc_box_rows`] rows of one page, so a chunk is one box per page and column half per
/// cache) into the next stage of an [`ATTN_TC_STAGES`]-deep ring; TMA's 128-byte swizzle puts
/// 16-byte piece `j` of a 128-byte row `r` at slot `j ^ (r % 8)`, so the 8 rows an `ldmatrix`
/// reads lie in distinct bank groups. Warps `0..ATTN_TC_WARPS` are the consumers: warp `w` takes
/// rows `8 w .. 8 w + 8` of every chunk:
/// - `S = Q K^T` by `mma.m16n8k16` (A: the `G` query heads as rows `0..G` of 16, the rest zero,
///   held in registers for the whole split; B: the 8 K rows by `ldmatrix`), two accumulators over
///   alternate k-steps;
/// - the online softmax per head in base 2 on the accumulator fragment (each quad of lanes holds
///   one head's 8 scores; max by two shuffles; the sum kept per lane and reduced at the end);
///   rows past the split are masked (their boxes hold other tokens' rows, or nothing yet);
/// - `O += P V` by `mma.m16n8k8`: P is the scores' fragment packed to bf16 (as FlashAttention-2
///   does), V's rows by `ldmatrix.trans`, one n-tile per 8 output columns; in a chunk of fewer
///   rows the warp first zeroes its V rows past the split, since a zero probability times a
///   stale NaN would still be NaN.
///
/// Each warp's state (per head, `d` accumulators, max, sum) is merged through shared memory at
/// the end, as in [`attn`].
///
/// # Safety
/// The launch contract of [`crate::contract::decode_step`] attention entries, with
/// [`ATTN_TC_THREADS`] threads, [`attn_tc_smem_bytes`] bytes and `kv_maps` the two tensor maps
/// of [`ATTN_TC_BOX_COLS`] over this launch's caches (a page size without box rows traps).
#[inline(always)]
unsafe fn attn_tc<const NV: usize, const G: usize>(p: Attn) {
    const { assert!(NV >= 1 && NV <= 2 && G >= 1 && G <= 8) };
    let d = 64 * NV as u32;
    // SAFETY: the launch contract.
    let c = unsafe { attn_cta::<G>(&p, ATTN_TC_THREADS, attn_tc_smem_bytes(d as usize, G)) };
    let box_rows = attn_tc_box_rows(p.page_size as usize) as u32;
    if box_rows == 0 {
        trap();
    }
    let tid = thread_idx_x();
    let (warp, lane) = (tid / 32, tid % 32);
    let base = dynamic_smem_base();
    // SAFETY: the barriers take the first `TmaPipeline::BYTES` (< ATTN_RING_OFFSET) bytes of the
    // dynamic shared memory (size checked), used for nothing else; one producer arming exactly
    // the bytes it copies; every consumer lane releases once per stage and phase.
    let pipe = unsafe { TmaPipeline::<ATTN_TC_STAGES>::at(base) };
    // SAFETY: every thread, convergently, before any other use.
    unsafe { pipe.init_cta(ATTN_TC_WARPS * 32) };
    // The ring, aligned to the swizzle's 1024-byte period (attn_tc_smem_bytes leaves room).
    let align = ATTN_TC_RING_ALIGN as u32;
    let ring = (base + ATTN_RING_OFFSET as u32 + align - 1) & !(align - 1);
    // One cache's rows in a stage: NV column halves, each ATTN_CHUNK_ROWS rows of 128 bytes.
    let region = ATTN_CHUNK_ROWS * 128;
    let half = NV as u32 * region;
    let stage_bytes = 2 * half;
    // Per lane: quad `g = lane / 4` is head g (rows >= G are padding), `t = lane % 4`.
    let (g, t) = (lane / 4, lane % 4);
    let mut m = M_INIT;
    let mut l = 0.0f32;
    let mut acc = [[0.0f32; 2]; 16];
    if warp == ATTN_TC_WARPS {
        pdl::launch_dependents();
        if lane == 0 {
            // SAFETY: the launch contract: two valid maps over this launch's caches.
            let (kmap, vmap) =
                unsafe { (TensorMap::at(p.kv_maps), TensorMap::at(p.kv_maps + 128)) };
            kmap.prefetch();
            vmap.prefetch();
            // Without FLAG_EARLY every copy waits for the predecessor; with it, only the chunk
            // holding row `pos` (written by the QKV GEMM), as in `attn`.
            let mut waited = p.flags & FLAG_EARLY == 0;
            if waited {
                pdl::wait();
            }
            let box_bytes = box_rows * 128;
            let mut st = PipelineState::<ATTN_TC_STAGES>::new();
            let mut k = 0;
            while k < c.chunks {
                let (tok, rows) = chunk_of(k, c.t_begin, c.t_end);
                if !waited && tok + rows > c.pos {
                    pdl::wait();
                    waited = true;
                }
                let boxes = rows.div_ceil(box_rows);
                let full = pipe.producer_acquire(st, 2 * NV as u32 * boxes * box_bytes);
                let kst = ring + st.stage() * stage_bytes;
                let mut i = 0;
                while i < boxes {
                    let tt = tok + i * box_rows;
                    // SAFETY: tt < tok + rows <= t_end <= len. The chunk starts on a box
                    // boundary of its page (splits start on pages, chunks are whole boxes), so
                    // the box's rows lie in tt's page.
                    let row = unsafe { cache_row(&p, &c, tt, d) } / d as usize;
                    unroll!(H in [0, 1] {
                        if H < NV {
                            let at = kst + H as u32 * region + (tt - tok) * 128;
                            // SAFETY: box `(64 H, row)` of each map (inside its cache: row +
                            // box_rows <= the page's end) into the acquired stage at a multiple
                            // of box_bytes (>= 1024) from the 1024-aligned ring, inside the
                            // stage's region; the full barrier expects every box's bytes.
                            unsafe {
                                kmap.load_2d(at, 64 * H as i32, row as i32, full);
                                vmap.load_2d(at + half, 64 * H as i32, row as i32, full);
                            }
                        }
                    });
                    i += 1;
                }
                st.advance();
                k += 1;
            }
        }
        // SAFETY: reconverges the loader warp before the CTA barrier below.
        unsafe { sync_warp() };
    } else {
        pdl::wait();
        // SAFETY: as in `attn`.
        unsafe {
            stamp(p.stamps, c.slot, 1);
            stamp(p.stamps, c.slot, 2);
        }
        pdl::launch_dependents();
        // Q as the A fragment of m16n8k16 for each k-step: row g (head g < G) cols 2t, 2t+1 and
        // 2t+8, 2t+9; rows g + 8 are zero.
        let mut qa = [[0u32; 2]; 8];
        if g < G as u32 {
            let off =
                (c.b as usize * c.heads as usize + (c.kvh * G as u32 + g) as usize) * d as usize;
            unroll!(KS in [0, 1, 2, 3, 4, 5, 6, 7] {
                if KS < 4 * NV {
                    // SAFETY: q holds batch x heads x d bf16 (launch contract); 4-byte aligned.
                    unsafe {
                        let at = p.q.add(off + 16 * KS + 2 * t as usize) as *const u32;
                        qa[KS] = [at.read(), at.add(4).read()];
                    }
                }
            });
        }
        let i8 = lane % 8;
        let quarter = lane / 8;
        let row = warp * 8 + i8;
        // Piece `4 J + quarter` of row `row` (column half J / 2, piece 4 (J % 2) + quarter of
        // its 128-byte row) at its swizzled slot, from the stage's K or V base.
        let at = |j: u32| (j / 2) * region + row * 128 + 16 * ((4 * (j % 2) + quarter) ^ i8);
        let mut st = PipelineState::<ATTN_TC_STAGES>::new();
        let mut k = 0;
        while k < c.chunks {
            let (_, rows) = chunk_of(k, c.t_begin, c.t_end);
            pipe.consumer_wait(st);
            let kst = ring + st.stage() * stage_bytes;
            if rows < warp * 8 + 8 {
                // A short last chunk (the split's last): zero this warp's V rows past the split
                // (whatever the boxes or earlier chunks left there), then order those writes
                // before the warp's reads (and, by the proxy fence, before any later TMA write
                // to the stage, though none follows in this CTA).
                let mut idx = lane;
                while idx < 64 * NV as u32 {
                    let (rr, pc) = (idx / (8 * NV as u32), idx % (8 * NV as u32));
                    let r = warp * 8 + rr;
                    if r >= rows {
                        // SAFETY: row r of this warp's 8 rows of the filled stage (only this
                        // warp reads them), 16-byte aligned, inside the ring.
                        unsafe {
                            Shared::<f32>::at(
                                kst + half + (pc / 8) * region + r * 128 + 16 * (pc % 8),
                            )
                            .store_v4([0.0; 4])
                        };
                    }
                    idx += 32;
                }
                bulk::fence_proxy_async_shared();
                // SAFETY: the whole warp (the condition is warp-uniform), converged.
                unsafe { sync_warp() };
            }
            // S = Q K^T: ldmatrix j gives B of k-steps 2j (regs 0, 1) and 2j + 1 (regs 2, 3).
            let mut s0 = [0.0f32; 4];
            let mut s1 = [0.0f32; 4];
            unroll!(J in [0, 1, 2, 3] {
                if J < 2 * NV {
                    // SAFETY: rows of the stage the full barrier completed; 16-byte pieces at
                    // their swizzled slots; the whole warp, converged.
                    let kf = unsafe { ldmatrix_x4(kst + at(J as u32)) };
                    s0 = mma_m16n8k16_f32_bf16([qa[2 * J][0], 0, qa[2 * J][1], 0], [kf[0], kf[1]], s0);
                    s1 = mma_m16n8k16_f32_bf16(
                        [qa[2 * J + 1][0], 0, qa[2 * J + 1][1], 0],
                        [kf[2], kf[3]],
                        s1,
                    );
                }
            });
            // Scores of tokens 8 w + 2t and 8 w + 2t + 1 for head g (base 2); rows past the
            // chunk are masked.
            let tok0 = warp * 8 + 2 * t;
            let mut x0 = (s0[0] + s1[0]) * p.scale_log2;
            let mut x1 = (s0[1] + s1[1]) * p.scale_log2;
            if tok0 >= rows {
                x0 = f32::NEG_INFINITY;
            }
            if tok0 + 1 >= rows {
                x1 = f32::NEG_INFINITY;
            }
            let mut mx = if x0 > x1 { x0 } else { x1 };
            unroll!(X in [1, 2] {
                // SAFETY: every lane of the warp runs every chunk; full-mask shuffle in the quad.
                let o = unsafe { shfl_xor_f32(mx, X as u32) };
                mx = if o > mx { o } else { mx };
            });
            let m_new = if mx > m { mx } else { m };
            let p0 = exp2_approx(x0 - m_new);
            let p1 = exp2_approx(x1 - m_new);
            // Rescaled on every chunk (1 when the maximum stays): no branch around the MMAs,
            // which the whole warp must reach converged.
            let corr = exp2_approx(m - m_new);
            m = m_new;
            l = l * corr + (p0 + p1);
            unroll!(N in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
                if N < 8 * NV {
                    acc[N][0] *= corr;
                    acc[N][1] *= corr;
                }
            });
            let pa = [pack_bf16x2(p0, p1), 0u32];
            // O += P V: ldmatrix.trans j gives B of n-tiles 4j .. 4j + 3 (8 columns each).
            unroll!(J in [0, 1, 2, 3] {
                if J < 2 * NV {
                    // SAFETY: as above.
                    let vf = unsafe { ldmatrix_x4_trans(kst + half + at(J as u32)) };
                    unroll!(Q in [0, 1, 2, 3] {
                        let n = 4 * J + Q;
                        let o = mma_m16n8k8_f32_bf16(pa, vf[Q], [acc[n][0], acc[n][1], 0.0, 0.0]);
                        acc[n] = [o[0], o[1]];
                    });
                }
            });
            // SAFETY: the whole warp reconverges; every lane releases (as in `attn`).
            unsafe { sync_warp() };
            pipe.consumer_release_local(st);
            st.advance();
            k += 1;
        }
        // The quad's sum.
        unroll!(X in [1, 2] {
            // SAFETY: as above.
            l += unsafe { shfl_xor_f32(l, X as u32) };
        });
    }
    // Every chunk the loader issued was waited for by the consumers: no copy is in flight, and
    // the merge area over the ring is free once every warp is past this barrier.
    // SAFETY: every thread of the CTA reaches it, warp-convergent.
    unsafe { sync_threads() };
    let smem = Shared::<f32>::at(ring);
    let row_len = d + 2;
    if warp < ATTN_TC_WARPS && g < G as u32 {
        let sbase = (warp * G as u32 + g) * row_len;
        unroll!(N in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
            if N < 8 * NV {
                // SAFETY: inside attn_tc_smem_bytes (checked); columns 8 N + 2t, + 1 of head g.
                unsafe {
                    smem.add(sbase + 8 * N as u32 + 2 * t).store(acc[N][0]);
                    smem.add(sbase + 8 * N as u32 + 2 * t + 1).store(acc[N][1]);
                }
            }
        });
        if t == 0 {
            // SAFETY: as above.
            unsafe {
                smem.add(sbase + d).store(m);
                smem.add(sbase + d + 1).store(l);
            }
        }
    }
    // SAFETY: every thread of the CTA calls it; the states are written.
    unsafe { attn_merge::<G>(&p, &c, ring, d, ATTN_TC_WARPS) };
}

macro_rules! attn_entry {
    ($name:ident, $nv:literal, $g:literal) => {
        attn_entry!(
            $name,
            attn,
            $nv,
            $g,
            ATTN_THREADS,
            attn_ctas_per_sm(64 * $nv, $g)
        );
    };
    ($name:ident, $body:ident, $nv:literal, $g:literal, $threads:expr, $ctas:expr) => {
        /// Decode attention entry of [`crate::contract::decode_step`] (`ATTN_VARIANTS`).
        ///
        /// # Safety
        /// Grid `batch * n_kv * splits` CTAs of `ATTN_THREADS` threads with `attn_smem_bytes`
        /// of dynamic shared memory (the tensor-core entries: `ATTN_TC_THREADS`,
        /// `attn_tc_smem_bytes`, and `kv_maps` the two tensor maps of `ATTN_TC_BOX_COLS` over
        /// these caches); `q` `batch x heads x d` bf16 (`heads = n_kv * G`); caches `num_pages
        /// x n_kv x page_size x d` bf16; `block_table` `batch x bt_stride` u32, `positions`
        /// `batch` u32 (`splits_pps = splits | pages_per_split << 16`) (both not written by any
        /// kernel while this one may run); `out` `batch x heads x d` bf16; with `splits > 1`
        /// also `part_o` `batch x heads x splits x d` f32, `part_ml` `batch x heads x splits x
        /// 2` f32 and `counters` `batch x n_kv` u32, all 0 before the launch (left 0 after
        /// it); outputs alias nothing. A page `>= num_pages`, a length beyond the table, more
        /// than `MAX_SPLITS` splits or a non-zero counter traps.
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
            kv_maps: u64,
            counters: *mut u32,
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
                kv_maps,
                counters,
                flags,
            };
            // SAFETY: the caller's launch contract.
            unsafe { $body::<$nv, $g>(p) }
        }
        // `$ctas` CTAs per SM: ptxas keeps the entry within 65536 / (that * `$threads`)
        // registers; the ring keeps its loads in flight whatever the count.
        crate::device::launch_bounds!($name, $threads, $ctas);
    };
}

attn_entry!(decode_attn_bf16_d64_g1, 1, 1);
attn_entry!(decode_attn_bf16_d64_g2, 1, 2);
attn_entry!(decode_attn_bf16_d64_g4, 1, 4);
attn_entry!(decode_attn_bf16_d64_g8, 1, 8);
attn_entry!(decode_attn_bf16_d128_g1, 2, 1);
attn_entry!(decode_attn_bf16_d128_g2, 2, 2);
attn_entry!(decode_attn_bf16_d128_g4, 2, 4);
attn_entry!(
    decode_attn_tc_bf16_d64_g1,
    attn_tc,
    1,
    1,
    ATTN_TC_THREADS,
    ATTN_TC_CTAS_PER_SM
);
attn_entry!(
    decode_attn_tc_bf16_d64_g2,
    attn_tc,
    1,
    2,
    ATTN_TC_THREADS,
    ATTN_TC_CTAS_PER_SM
);
attn_entry!(
    decode_attn_tc_bf16_d64_g4,
    attn_tc,
    1,
    4,
    ATTN_TC_THREADS,
    ATTN_TC_CTAS_PER_SM
);
attn_entry!(
    decode_attn_tc_bf16_d64_g8,
    attn_tc,
    1,
    8,
    ATTN_TC_THREADS,
    ATTN_TC_CTAS_PER_SM
);
attn_entry!(
    decode_attn_tc_bf16_d128_g1,
    attn_tc,
    2,
    1,
    ATTN_TC_THREADS,
    ATTN_TC_CTAS_PER_SM
);
attn_entry!(
    decode_attn_tc_bf16_d128_g2,
    attn_tc,
    2,
    2,
    ATTN_TC_THREADS,
    ATTN_TC_CTAS_PER_SM
);
attn_entry!(
    decode_attn_tc_bf16_d128_g4,
    attn_tc,
    2,
    4,
    ATTN_TC_THREADS,
    ATTN_TC_CTAS_PER_SM
);

/// `ld.global.cg.f32`: a load cached in L2 only (PTX ISA §9.7.9.8), so a line another CTA
/// wrote is never read stale from this SM's L1; weak, so the compiler may batch independent
/// loads (a `volatile` load may not be reordered, which serialised the combine's split loop).
///
/// # Safety
/// `p` is a valid, 4-byte aligned global address whose writes happen before this read (an
/// earlier kernel's, or another CTA's published by a fence and acquired) and that nothing
/// writes while it is read.
#[inline(always)]
unsafe fn ld_cg_f32(p: *const f32) -> f32 {
    let v: f32;
    // SAFETY: the caller's contract.
    unsafe {
        core::arch::asm!("ld.global.cg.f32 {v}, [{p}];", v = out(reg32) v, p = in(reg64) p,
            options(pure, readonly, nostack))
    };
    v
}
