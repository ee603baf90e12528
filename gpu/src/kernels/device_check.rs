//! Kernels that exercise device-library instructions one by one, for the GPU tests of issue 22
//! (`tests/issue22_device.rs`) and for ptxas to check at every build: TMA copies of rank 3 to 5
//! (plain and multicast), the TMA and bulk L2 prefetches, and the `math` functions with the
//! 8-byte global stores. Layouts and parameters: `contract::device_check`.

use crate::contract::device_check::*;
use crate::device::bulk;
use crate::device::cluster;
use crate::device::math;
use crate::device::mbarrier::{fence_init, Mbarrier};
use crate::device::smem::{dynamic_smem_base, store_global_b64, store_global_v2};
use crate::device::thread::{block_dim_x, block_idx_x, grid_dim_x, sync_threads, thread_idx_x};
use crate::device::tma::TensorMap;
use crate::device::warp::sync_warp;

/// Field `i` of a packed `[u12; 5]`.
#[inline(always)]
fn field(packed: u64, i: u32) -> u32 {
    ((packed >> (FIELD_BITS * i)) & FIELD_MASK) as u32
}

/// Box coordinates of box number `b` (innermost dimension first): its digits in the mixed radix
/// of the box counts, times the box sizes.
#[inline(always)]
fn coords<const R: usize>(mut b: u32, boxes: u64, box_: u64) -> [i32; R] {
    let mut c = [0i32; R];
    let mut i = 0;
    while i < R {
        let n = field(boxes, i as u32).max(1);
        c[i] = ((b % n) * field(box_, i as u32)) as i32;
        b /= n;
        i += 1;
    }
    c
}

/// One rank's TMA operations, so one body serves ranks 3 to 5.
trait Rank<const R: usize> {
    /// # Safety
    /// As [`TensorMap::load_3d`].
    unsafe fn load(m: TensorMap, dst: u32, c: [i32; R], bar: Mbarrier);
    /// # Safety
    /// As [`TensorMap::load_3d_multicast`].
    unsafe fn load_mc(m: TensorMap, dst: u32, c: [i32; R], bar: Mbarrier, mask: u16);
    /// # Safety
    /// As [`TensorMap::store_3d`].
    unsafe fn store(m: TensorMap, src: u32, c: [i32; R]);
    fn prefetch(m: TensorMap, c: [i32; R]);
}

struct Ranks;

macro_rules! rank {
    ($r:literal, $load:ident, $mc:ident, $store:ident, $pf:ident) => {
        impl Rank<$r> for Ranks {
            /// # Safety
            /// As [`Rank::load`] (forwarded).
            #[inline(always)]
            unsafe fn load(m: TensorMap, dst: u32, c: [i32; $r], bar: Mbarrier) {
                // SAFETY: forwarded to the caller.
                unsafe { m.$load(dst, c, bar) }
            }
            /// # Safety
            /// As [`Rank::load_mc`] (forwarded).
            #[inline(always)]
            unsafe fn load_mc(m: TensorMap, dst: u32, c: [i32; $r], bar: Mbarrier, mask: u16) {
                // SAFETY: forwarded to the caller.
                unsafe { m.$mc(dst, c, bar, mask) }
            }
            /// # Safety
            /// As [`Rank::store`] (forwarded).
            #[inline(always)]
            unsafe fn store(m: TensorMap, src: u32, c: [i32; $r]) {
                // SAFETY: forwarded to the caller.
                unsafe { m.$store(src, c) }
            }
            #[inline(always)]
            fn prefetch(m: TensorMap, c: [i32; $r]) {
                m.$pf(c)
            }
        }
    };
}
rank!(3, load_3d, load_3d_multicast, store_3d, prefetch_3d);
rank!(4, load_4d, load_4d_multicast, store_4d, prefetch_4d);
rank!(5, load_5d, load_5d_multicast, store_5d, prefetch_5d);

/// The copy: CTA `b` moves box `b` from `src` to `dst` through shared memory (one thread). With
/// `MULTICAST`, CTAs come in clusters of 2: each loads its box into slot `rank` of *both* CTAs
/// (multicast) and stores the slot its peer filled to the peer's box, so every box reaches `dst`
/// only through the other CTA's multicast.
///
/// # Safety
/// The launch contract of the entries.
#[inline(always)]
unsafe fn tma_copy<const R: usize, const MULTICAST: bool>(p: CopyParams)
where
    Ranks: Rank<R>,
{
    if block_dim_x() != COPY_THREADS {
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    let base = (dynamic_smem_base() + SLOT_ALIGN - 1) & !(SLOT_ALIGN - 1);
    let slot_bytes = p.box_bytes.div_ceil(SLOT_ALIGN) * SLOT_ALIGN;
    // SAFETY: the barrier takes the first 8 bytes of the aligned base, inside the launch's
    // dynamic shared memory (contract: SLOT_ALIGN + 2 slots + slack), used for nothing else;
    // thread 0 initialises it before the barrier below; one arrival (thread 0's expect-tx) per
    // phase plus the bytes of the loads that target it.
    let bar = unsafe { Mbarrier::at(base) };
    let slot = |i: u32| base + SLOT_ALIGN + i * slot_bytes;
    let (src, dst) = (
        // SAFETY: the launch contract: device addresses of valid rank-R maps.
        unsafe { TensorMap::at(p.src) },
        // SAFETY: as above.
        unsafe { TensorMap::at(p.dst) },
    );
    let tid = thread_idx_x();
    if tid == 0 {
        // SAFETY: one thread, before any use; published below.
        unsafe { bar.init(1) };
        fence_init();
    }
    if MULTICAST {
        // Both CTAs' barriers exist (init + fence_init) before either multicasts into them.
        // `sync_cluster` is the per-thread (non-`.aligned`) barrier: LLVM threads the two
        // `if tid == 0` through it (the `.aligned` form, copied into both arms, hung the H100).
        // SAFETY: every thread of the cluster calls it once here and once at the end.
        unsafe { cluster::sync_cluster() };
    } else {
        // SAFETY: every thread of the CTA, converged.
        unsafe { sync_threads() };
    }
    if tid == 0 {
        let b = block_idx_x();
        let mine: [i32; R] = coords(b, p.boxes, p.box_);
        // The maps' bytes (copied in before the launch) for this thread's TMA operations.
        src.acquire();
        dst.acquire();
        Ranks::prefetch(src, mine);
        if b == 0 && p.l2_bytes > 0 {
            // SAFETY: the contract: l2_src..+l2_bytes lies in one allocation, both aligned.
            unsafe { bulk::prefetch_l2(p.l2_src as *const u8, p.l2_bytes) };
        }
        if MULTICAST {
            let rank = cluster::cta_rank();
            bar.arrive_expect_tx(2 * p.box_bytes);
            // SAFETY: slot `rank` of both CTAs is written only by this load; both barriers were
            // initialised and published (cluster barrier above) and each expects both slots'
            // bytes (its own box and the peer's; the peer's may land before this arm); the peer
            // stays resident until its barrier has counted them (its wait, then the final
            // cluster barrier).
            unsafe { Ranks::load_mc(src, slot(rank), mine, bar, 0b11) };
            bar.wait_parity(0);
            let peer: [i32; R] = coords(b ^ 1, p.boxes, p.box_);
            // SAFETY: the peer's slot holds its box (barrier complete), written by the async
            // proxy only (no generic-proxy writes to fence); only this CTA writes the peer's box
            // of dst; the rows' 16-byte overhang past dims[0] lies in dst's padding (contract).
            unsafe { Ranks::store(dst, slot(1 - rank), peer) };
        } else {
            bar.arrive_expect_tx(p.box_bytes);
            // SAFETY: slot 0 is written only by this load, the barrier expects its bytes.
            unsafe { Ranks::load(src, slot(0), mine, bar) };
            bar.wait_parity(0);
            // SAFETY: the slot holds the box (async-proxy writes only); only this CTA writes
            // box b of dst; the rows' 16-byte overhang past dims[0] lies in dst's padding
            // (contract).
            unsafe { Ranks::store(dst, slot(0), mine) };
        }
        bulk::commit_group();
        // The store has read the slot before the CTA may exit.
        bulk::wait_group_read::<0>();
    }
    if MULTICAST {
        // SAFETY: every lane reaches this point; full mask.
        unsafe { sync_warp() };
        // No CTA exits while its peer may still multicast into it.
        // SAFETY: every thread of the cluster, the second of its two calls.
        unsafe { cluster::sync_cluster() };
    }
}

/// The copy entries' parameters.
struct CopyParams {
    src: u64,
    dst: u64,
    box_: u64,
    boxes: u64,
    box_bytes: u32,
    l2_src: u64,
    l2_bytes: u32,
}

macro_rules! copy_entry {
    ($name:ident, $r:literal, $mc:literal) => {
        /// TMA copy of a rank-`R` tensor box by box through shared memory (see
        /// `contract::device_check`).
        ///
        /// # Safety
        /// The launch contract of `contract::device_check`.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $name(
            src: u64,
            dst: u64,
            box_: u64,
            boxes: u64,
            box_bytes: u32,
            l2_src: u64,
            l2_bytes: u32,
        ) {
            let p = CopyParams {
                src,
                dst,
                box_,
                boxes,
                box_bytes,
                l2_src,
                l2_bytes,
            };
            // SAFETY: the launch contract above.
            unsafe { tma_copy::<$r, $mc>(p) }
        }
    };
}
copy_entry!(tma_copy_3d, 3, false);
copy_entry!(tma_copy_4d, 4, false);
copy_entry!(tma_copy_5d, 5, false);
copy_entry!(tma_copy_3d_multicast, 3, true);
copy_entry!(tma_copy_4d_multicast, 4, true);
copy_entry!(tma_copy_5d_multicast, 5, true);

/// `y[MATH_FUNCS * i ..][..MATH_FUNCS]` = the `math` functions of `x[i]` for `i < n`, in the
/// order of `contract::device_check::MATH_FUNCS_NAMES`, written with 8-byte stores.
///
/// # Safety
/// `x`: `n` readable f32; `y`: `MATH_FUNCS * n` writable f32, 8-byte aligned; not overlapping.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn math_check(x: *const f32, y: *mut f32, n: u32) {
    let mut i = block_idx_x() * block_dim_x() + thread_idx_x();
    let stride = block_dim_x() * grid_dim_x();
    while i < n {
        // SAFETY: i < n (contract).
        let v = unsafe { x.add(i as usize).read() };
        let out = (i as usize) * MATH_FUNCS;
        // SAFETY: y[out..out + 8] is inside y (contract) and 8-byte aligned (out is a multiple of
        // 8 floats); only this thread writes it.
        unsafe {
            store_global_v2(y.add(out), [math::sqrt(v), math::sqrt_approx(v)]);
            store_global_v2(
                y.add(out + 2),
                [math::rsqrt_approx(v), math::tanh_approx(v)],
            );
            store_global_v2(y.add(out + 4), [math::exp_approx(v), math::ln_approx(v)]);
            let (s, c) = (math::sin_approx(v), math::cos_approx(v));
            let bits = s.to_bits() as u64 | (c.to_bits() as u64) << 32;
            store_global_b64(y.add(out + 6) as *mut u64, bits);
        }
        i = match i.checked_add(stride) {
            Some(v) => v,
            None => break,
        };
    }
}
