//! TMA tensor copies (PTX ISA 8.3 §9.7.9.25.5, `cp.async.bulk.tensor`) and the tensor-map fences
//! and prefetch (§9.7.12.4 `fence.proxy.tensormap`, §9.7.3.x `prefetch.tensormap`).
//!
//! A tensor map (`CUtensorMap`, 128 bytes, 64-byte aligned) describes a global tensor: its base,
//! dimensions, strides, the box a copy moves, the shared-memory swizzle and the out-of-bounds fill.
//! The host encodes it with `cuTensorMapEncodeTiled` (CUDA driver API, "Tensor Map Object
//! Management") and, in warpline, keeps it in global memory: the kernel receives its generic
//! address as a `u64` parameter ([`TensorMap`]). (A by-value `__grid_constant__` parameter, as
//! CUDA C++ uses, needs 64-byte parameter alignment, which rustc's nvptx ABI does not give.)
//!
//! Coordinates are in elements, innermost dimension first, signed: a box may hang over any edge
//! of the tensor. Loads fill the outside with zeros and stores skip it (clipping), which is how
//! a kernel handles sizes that are not multiples of its tile without padding copies.

use core::arch::asm;

use super::mbarrier::Mbarrier;

/// Generic (global-memory) address of a `CUtensorMap`.
#[derive(Clone, Copy)]
pub struct TensorMap {
    addr: u64,
}

impl TensorMap {
    /// The tensor map at generic address `addr`.
    ///
    /// # Safety
    /// `addr` is the generic address of a 64-byte aligned, 128-byte `CUtensorMap` in global (or
    /// constant) memory made by `cuTensorMapEncodeTiled`, valid and unchanged while the kernel
    /// runs, and describing memory the kernel may access as the copies using it do.
    #[inline(always)]
    pub const unsafe fn at(addr: u64) -> Self {
        Self { addr }
    }

    /// Generic address of the map.
    #[inline(always)]
    pub const fn addr(self) -> u64 {
        self.addr
    }

    /// `prefetch.tensormap [addr]`: brings the map into the TMA unit's cache ahead of first use.
    #[inline(always)]
    pub fn prefetch(self) {
        // SAFETY: a prefetch of a valid map (contract of `at`) has no architectural effect.
        unsafe { asm!("prefetch.tensormap [{a}];", a = in(reg64) self.addr, options(nostack)) };
    }

    /// `fence.proxy.tensormap::generic.acquire.gpu [addr], 128`: makes the map's bytes as written
    /// through the generic proxy (e.g. by `cuMemcpy` before the launch, or by an earlier kernel)
    /// visible to this thread's later TMA operations that use it (PTX ISA 8.3 §9.7.12.4).
    #[inline(always)]
    pub fn acquire(self) {
        // SAFETY: a fence on a valid map (contract of `at`).
        unsafe {
            asm!("fence.proxy.tensormap::generic.acquire.gpu [{a}], 128;", a = in(reg64) self.addr,
                options(nostack))
        };
    }

    /// `cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes`: copies the
    /// box at coordinates `(c0, c1)` (innermost first, in elements) into this CTA's shared memory
    /// at `dst`, laid out and swizzled as the map says; the box's bytes (all of them, out-of-bounds
    /// zeros included) count down `bar`'s transaction count.
    ///
    /// # Safety
    /// `dst` is a shared-window address aligned as the map's swizzle needs (1024 bytes for the
    /// 128-byte swizzle, else 128), the box's bytes from `dst` lie in this CTA's shared memory and
    /// nobody else touches them until `bar`'s phase completes; `bar`'s current phase was armed
    /// (e.g. [`Mbarrier::arrive_expect_tx`]) for these bytes, as [`Mbarrier::at`] requires.
    #[inline(always)]
    pub unsafe fn load_2d(self, dst: u32, c0: i32, c1: i32, bar: Mbarrier) {
        // SAFETY: the caller upholds this function's `# Safety` contract; the map is valid.
        unsafe {
            asm!("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{{x}, {y}}}], [{b}];",
                d = in(reg32) dst, m = in(reg64) self.addr, x = in(reg32) c0, y = in(reg32) c1,
                b = in(reg32) bar.addr(), options(nostack));
        }
    }

    /// As [`Self::load_2d`], but `.multicast::cluster`: the box lands at offset `dst` in the
    /// shared memory of every CTA of the cluster whose bit is set in `cta_mask`, and completes on
    /// the barrier at `bar`'s offset in each of them.
    ///
    /// # Safety
    /// As [`Self::load_2d`] for every destination CTA: each is live, has initialised its barrier
    /// at `bar`'s offset and published that to the cluster, and expects these bytes in its
    /// barrier's current phase.
    #[inline(always)]
    pub unsafe fn load_2d_multicast(
        self,
        dst: u32,
        c0: i32,
        c1: i32,
        bar: Mbarrier,
        cta_mask: u16,
    ) {
        // SAFETY: the caller upholds this function's `# Safety` contract; the map is valid.
        unsafe {
            asm!("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [{d}], [{m}, {{{x}, {y}}}], [{b}], {k};",
                d = in(reg32) dst, m = in(reg64) self.addr, x = in(reg32) c0, y = in(reg32) c1,
                b = in(reg32) bar.addr(), k = in(reg16) cta_mask, options(nostack));
        }
    }

    /// `cp.async.bulk.tensor.2d.global.shared::cta.bulk_group`: copies the box at `src` in shared
    /// memory (laid out and swizzled as the map says) to coordinates `(c0, c1)` of the tensor;
    /// elements outside the tensor are not written. Tracked by this thread's bulk groups: close
    /// the group with [`super::bulk::commit_group`], and wait with
    /// [`super::bulk::wait_group_read`] before overwriting `src`.
    ///
    /// # Safety
    /// `src` aligned as in [`Self::load_2d`], holding the box; the writes of `src` by other
    /// threads happen before (their [`super::bulk::fence_proxy_async_shared`], then a barrier);
    /// nobody writes the box's global elements concurrently.
    #[inline(always)]
    pub unsafe fn store_2d(self, src: u32, c0: i32, c1: i32) {
        // SAFETY: the caller upholds this function's `# Safety` contract; the map is valid.
        unsafe {
            asm!("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [{m}, {{{x}, {y}}}], [{s}];",
                m = in(reg64) self.addr, x = in(reg32) c0, y = in(reg32) c1, s = in(reg32) src,
                options(nostack));
        }
    }
}
