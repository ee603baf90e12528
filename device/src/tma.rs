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
//!
//! **Stores clip dimension 0 at 16-byte granularity.** A TMA store writes each row of the box in
//! whole 16-byte pieces: where the tensor's row ends inside a piece (`dims[0] * elem` not a
//! multiple of 16 bytes), the piece is written whole, so the bytes from the row's end up to the
//! next 16-byte boundary (at most 15) receive what the box holds there: zeros, for a box that a
//! load filled. Outer dimensions are clipped exactly. Seen on the H100 (tc_gemm's ragged C
//! chunks, and `tma_copy_rank3` of issue 22 writing zeros into its rows' padding past
//! `dims[0] = 37` f32) and reported for Triton's descriptor stores (triton-lang/triton#11583).
//! A kernel that must not touch those bytes stores such edge pieces with `st.global` (as
//! tc_gemm does); the host side gives the reach as `TensorMapDesc::store_extent_bytes`.

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
    /// at `bar`'s offset and published that to the cluster (`fence_init`, then a cluster barrier
    /// before this copy is issued), expects these bytes in its barrier's current phase (each
    /// receiving CTA arms its own barrier with the bytes of every copy that lands in it, its own
    /// and its peers'; the bytes may arrive before it arms), and stays resident until they have
    /// landed (it waits on its barrier, or a cluster barrier precedes every exit). `cta_mask`
    /// names only CTAs of this cluster (bit `i`: `%cluster_ctarank` `i`), and the kernel runs in
    /// clusters (a launch without cluster dimensions is a cluster of one).
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
    /// elements outside the tensor are not written, except that dimension 0 is clipped at
    /// 16-byte granularity (see the module docs: up to 15 bytes past a row's end are written when
    /// `dims[0] * elem` is not a multiple of 16). Tracked by this thread's bulk groups: close
    /// the group with [`super::bulk::commit_group`], and wait with
    /// [`super::bulk::wait_group_read`] before overwriting `src` or exiting.
    ///
    /// # Safety
    /// `src` aligned as in [`Self::load_2d`], holding the box; the writes of `src` by other
    /// threads happen before (their [`super::bulk::fence_proxy_async_shared`], then a barrier);
    /// nobody accesses the box's global elements concurrently, nor, for a row whose end falls
    /// inside the box, the bytes from the row's end to the next 16-byte boundary, which must be
    /// memory the kernel may write (the row padding of a pitched tensor).
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

/// One rank of the N-D forms: `load_Nd`, `load_Nd_multicast`, `store_Nd`, `prefetch_Nd`, with
/// the coordinates as an array (innermost dimension first, in elements, signed).
macro_rules! tma_rank {
    ($n:literal, $dim:literal, $load:ident, $load_mc:ident, $store:ident, $prefetch:ident, $coords:literal,
     [$($i:literal => $c:ident),+]) => {
        impl TensorMap {
            #[doc = concat!("`cp.async.bulk.tensor.", $dim, ".shared::cluster.global.mbarrier::complete_tx::bytes` ",
                "(PTX ISA 8.3 §9.7.9.25.5.1, tile mode): as [`Self::load_2d`] for a rank-", $n,
                " map; `c` holds the box's coordinates, innermost dimension first, in elements. ",
                "A coordinate may lie outside the tensor in any dimension (loads fill zeros there); ",
                "the box's bytes (the product of the map's box dimensions times the element size, ",
                "out-of-bounds zeros included) count down `bar`'s transaction count.")]
            ///
            /// # Safety
            /// As [`Self::load_2d`]; the map's rank is this function's.
            #[inline(always)]
            pub unsafe fn $load(self, dst: u32, c: [i32; $n], bar: Mbarrier) {
                $(let $c = c[$i];)+
                // SAFETY: the caller upholds this function's `# Safety` contract; the map is valid.
                unsafe {
                    asm!(concat!("cp.async.bulk.tensor.", $dim, ".shared::cluster.global.mbarrier::complete_tx::bytes [{d}], [{m}, {{", $coords, "}}], [{b}];"),
                        d = in(reg32) dst, m = in(reg64) self.addr, $($c = in(reg32) $c,)+
                        b = in(reg32) bar.addr(), options(nostack));
                }
            }

            #[doc = concat!("As [`Self::", stringify!($load), "`], but `.multicast::cluster` (PTX ISA 8.3 ",
                "§9.7.9.25.5.1): the box lands at offset `dst` in the shared memory of every CTA of ",
                "the cluster whose bit is set in `cta_mask`, and completes on the barrier at `bar`'s ",
                "offset in each of them (sm_90a advised by ptxas).")]
            ///
            /// # Safety
            /// As [`Self::load_2d_multicast`] for every destination CTA; the map's rank is this
            /// function's.
            #[inline(always)]
            pub unsafe fn $load_mc(self, dst: u32, c: [i32; $n], bar: Mbarrier, cta_mask: u16) {
                $(let $c = c[$i];)+
                // SAFETY: the caller upholds this function's `# Safety` contract; the map is valid.
                unsafe {
                    asm!(concat!("cp.async.bulk.tensor.", $dim, ".shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [{d}], [{m}, {{", $coords, "}}], [{b}], {k};"),
                        d = in(reg32) dst, m = in(reg64) self.addr, $($c = in(reg32) $c,)+
                        b = in(reg32) bar.addr(), k = in(reg16) cta_mask, options(nostack));
                }
            }

            #[doc = concat!("`cp.async.bulk.tensor.", $dim, ".global.shared::cta.bulk_group` (PTX ISA 8.3 ",
                "§9.7.9.25.5.1): as [`Self::store_2d`] for a rank-", $n, " map; elements of the box ",
                "outside the tensor are not written, in any dimension, except that dimension 0 is ",
                "clipped at 16-byte granularity (see the module docs).")]
            ///
            /// # Safety
            /// As [`Self::store_2d`]; the map's rank is this function's.
            #[inline(always)]
            pub unsafe fn $store(self, src: u32, c: [i32; $n]) {
                $(let $c = c[$i];)+
                // SAFETY: the caller upholds this function's `# Safety` contract; the map is valid.
                unsafe {
                    asm!(concat!("cp.async.bulk.tensor.", $dim, ".global.shared::cta.bulk_group [{m}, {{", $coords, "}}], [{s}];"),
                        m = in(reg64) self.addr, $($c = in(reg32) $c,)+ s = in(reg32) src,
                        options(nostack));
                }
            }

            #[doc = concat!("`cp.async.bulk.prefetch.tensor.", $dim, ".L2.global.tile` (PTX ISA 8.3 ",
                "§9.7.9.25.5.2): brings the box at `c` (innermost first, in elements; may hang over ",
                "any edge) of a rank-", $n, " map into L2 ahead of a load. A hint: no shared memory, ",
                "no barrier, nothing to wait for; the L2 lines are the only effect.")]
            #[inline(always)]
            pub fn $prefetch(self, c: [i32; $n]) {
                $(let $c = c[$i];)+
                // SAFETY: a prefetch reads through a valid map (contract of `at`) into L2 only; it
                // writes no memory the program can observe.
                unsafe {
                    asm!(concat!("cp.async.bulk.prefetch.tensor.", $dim, ".L2.global.tile [{m}, {{", $coords, "}}];"),
                        m = in(reg64) self.addr, $($c = in(reg32) $c,)+ options(nostack));
                }
            }
        }
    };
}

tma_rank!(3, "3d", load_3d, load_3d_multicast, store_3d, prefetch_3d,
    "{c0}, {c1}, {c2}", [0 => c0, 1 => c1, 2 => c2]);
tma_rank!(4, "4d", load_4d, load_4d_multicast, store_4d, prefetch_4d,
    "{c0}, {c1}, {c2}, {c3}", [0 => c0, 1 => c1, 2 => c2, 3 => c3]);
tma_rank!(5, "5d", load_5d, load_5d_multicast, store_5d, prefetch_5d,
    "{c0}, {c1}, {c2}, {c3}, {c4}", [0 => c0, 1 => c1, 2 => c2, 3 => c3, 4 => c4]);

impl TensorMap {
    /// `cp.async.bulk.prefetch.tensor.2d.L2.global.tile` (PTX ISA 8.3 §9.7.9.25.5.2): the rank-2
    /// form of [`Self::prefetch_3d`], at `(c0, c1)`.
    #[inline(always)]
    pub fn prefetch_2d(self, c0: i32, c1: i32) {
        // SAFETY: as in `prefetch_3d`: an L2 hint through a valid map.
        unsafe {
            asm!("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [{m}, {{{x}, {y}}}];",
                m = in(reg64) self.addr, x = in(reg32) c0, y = in(reg32) c1, options(nostack));
        }
    }
}
