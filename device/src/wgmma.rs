//! Warpgroup matrix multiply-accumulate, PTX ISA 8.3 §9.7.15 (`wgmma`, sm_90a): the four warps
//! of a warpgroup (128 threads) issue one asynchronous `m64nNk16` MMA together, reading A and B
//! from shared memory through [`MatrixDescriptor`]s and accumulating into FP32 registers spread
//! over the warpgroup.
//!
//! The protocol (§9.7.15.6): [`fence_operands`] + [`fence`] before the first `mma_async` that
//! touches accumulators other instructions wrote; the `mma_async`s; [`commit_group`];
//! [`wait_group`] before the accumulators (or the shared memory read) are used; then
//! [`fence_operands`] again so the compiler reads the accumulators only after the wait. Shared
//! memory written through the generic proxy must be fenced with
//! [`super::bulk::fence_proxy_async_shared`] before wgmma reads it (TMA writes need no fence).
//!
//! Accumulator layout of `m64nNk16` with FP32 `d` (§9.7.15.5.1, "Matrix fragments for
//! wgmma.m64nNk16"): thread `t` of the warpgroup, warp `w = t / 32`, lane `l = t % 32`, holds
//! `d[4*i + j]` for `i in 0..N/8` at row `16*w + l/4 + 8*(j/2)`, column `8*i + 2*(l%4) + j%2`.
//!
//! Every function here needs `.target sm_90a`; all of them are warpgroup-collective and
//! `.aligned`: all 128 threads of the warpgroup execute the same call convergently.

use core::arch::asm;

/// Shared-memory layout swizzle of a wgmma operand (bits 62-63 of the descriptor).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Swizzle {
    /// No swizzle (interleaved 8x16-byte core matrices).
    None = 0,
    /// 128-byte swizzle: 16-byte chunk `c` of 128-byte row `r` sits at chunk `c ^ (r % 8)`;
    /// the operand's base is 1024-byte aligned.
    B128 = 1,
    /// 64-byte swizzle (512-byte aligned base).
    B64 = 2,
    /// 32-byte swizzle (256-byte aligned base).
    B32 = 3,
}

/// A wgmma shared-memory matrix descriptor (PTX ISA 8.3 §9.7.15.5.1.1, "Matrix Descriptor
/// Format"): bits 0-13 start address >> 4, 16-29 leading-dimension byte offset >> 4, 32-45
/// stride-dimension byte offset >> 4, 49-51 base offset (0: the operand's swizzle pattern starts
/// at an aligned address), 62-63 the [`Swizzle`].
///
/// For the 128-byte swizzle with 16-bit elements:
/// - K-major operand (rows of 64 K-elements, 128 bytes each): `stride = 1024` (from one group of
///   8 rows to the next), `leading` unused (16); the k-th `k16` slice starts `32 * k` bytes in.
/// - MN-major operand (rows of 64 MN-elements, one per k): `stride = 1024` (8 k-rows to the
///   next 8), `leading` = bytes from one 64-element MN block to the next; the k-th `k16` slice
///   starts `16 * 128 * k` bytes in.
#[derive(Clone, Copy)]
pub struct MatrixDescriptor(u64);

impl MatrixDescriptor {
    /// Descriptor of the operand at shared-window address `start` (16-byte aligned, below 256 KiB),
    /// with byte offsets `leading` and `stride` (multiples of 16, below 256 KiB).
    #[inline(always)]
    pub const fn new(start: u32, leading: u32, stride: u32, swizzle: Swizzle) -> Self {
        const fn enc(bytes: u32) -> u64 {
            ((bytes >> 4) & 0x3FFF) as u64
        }
        Self(enc(start) | enc(leading) << 16 | enc(stride) << 32 | (swizzle as u64) << 62)
    }

    /// The same operand layout `bytes` further on (a multiple of 16): moves the start address.
    #[inline(always)]
    pub const fn offset(self, bytes: u32) -> Self {
        Self(self.0 + (bytes >> 4) as u64)
    }

    /// The 64-bit descriptor.
    #[inline(always)]
    pub const fn bits(self) -> u64 {
        self.0
    }
}

/// `wgmma.fence.sync.aligned`: orders this warpgroup's earlier register and shared-memory
/// accesses before the following `mma_async`s (§9.7.15.7.1).
///
/// # Safety
/// Warpgroup-collective: all 128 threads of the warpgroup call it convergently.
#[inline(always)]
pub unsafe fn fence() {
    // SAFETY: no operands; the caller guarantees warpgroup convergence.
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
}

/// `wgmma.commit_group.sync.aligned`: closes a wgmma-group of the `mma_async`s issued since the
/// last commit (§9.7.15.7.2).
///
/// # Safety
/// As [`fence`].
#[inline(always)]
pub unsafe fn commit_group() {
    // SAFETY: no operands; the caller guarantees warpgroup convergence.
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) };
}

/// `wgmma.wait_group.sync.aligned N`: waits until at most `N` wgmma-groups of this warpgroup are
/// pending (§9.7.15.7.3). Follow it with [`fence_operands`] on the accumulators it covers.
///
/// # Safety
/// As [`fence`].
#[inline(always)]
pub unsafe fn wait_group<const N: u32>() {
    // SAFETY: immediate operand only; the caller guarantees warpgroup convergence.
    unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const N, options(nostack)) };
}

/// A compiler-only fence on accumulator registers (no instruction is emitted): every register is
/// an in/out operand of one empty `asm!`, so the compiler cannot move reads or writes of the
/// accumulators across the neighbouring wgmma statements (all `asm!` here are volatile and keep
/// their order), and keeps them in registers. Use after [`wait_group`] and before [`fence`].
/// Implemented for the accumulator arrays of `m64n64`, `m64n128` and `m64n256` (32, 64, 128 f32).
#[inline(always)]
pub fn fence_operands<A: Accumulators>(d: &mut A) {
    d.fence_operands();
}

/// FP32 accumulator arrays of one thread for the `m64nNk16` shapes with N = 64, 128, 256.
pub trait Accumulators {
    /// See [`fence_operands`].
    fn fence_operands(&mut self);
}

// The register-heavy items below are generated: one list of accumulator indices, one macro for
// the operand fence and one for `mma_async`, one line per array size and per shape and type. The
// generated `asm!` templates and operand lists are the same, token for token, as written out.

/// `with_indices!(callback!{args}, R)` expands to `callback!{args [0 1 ... R-1]}` for R = 4, 8,
/// 16 (N = 8, 16, 32: written out), 32, 64 or 128 (the FP32 accumulators of one thread for N =
/// 64, 128, 256): those indices are written once, in quarters of 32, and `@take` appends one
/// quarter a `q`.
macro_rules! with_indices {
    ($cb:ident!{$($a:tt)*}, 4) => { $cb!{$($a)* [0 1 2 3]} };
    ($cb:ident!{$($a:tt)*}, 8) => { $cb!{$($a)* [0 1 2 3 4 5 6 7]} };
    ($cb:ident!{$($a:tt)*}, 16) => { $cb!{$($a)* [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15]} };
    ($cb:ident!{$($a:tt)*}, 32) => { with_indices!(@ $cb {$($a)*} [q]); };
    ($cb:ident!{$($a:tt)*}, 64) => { with_indices!(@ $cb {$($a)*} [q q]); };
    ($cb:ident!{$($a:tt)*}, 128) => { with_indices!(@ $cb {$($a)*} [q q q q]); };
    (@take $cb:ident {$($a:tt)*} [$($i:literal)*] [] $($rest:tt)*) => { $cb!{$($a)* [$($i)*]} };
    (@take $cb:ident {$($a:tt)*} [$($i:literal)*] [q $($q:ident)*]
        [$($c:literal)*] $($rest:tt)*) => {
        with_indices!(@take $cb {$($a)*} [$($i)* $($c)*] [$($q)*] $($rest)*);
    };
    (@ $cb:ident {$($a:tt)*} $quarters:tt) => {
        with_indices!(@take $cb {$($a)*} [] $quarters
            [0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15
             16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31]
            [32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47
             48 49 50 51 52 53 54 55 56 57 58 59 60 61 62 63]
            [64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79
             80 81 82 83 84 85 86 87 88 89 90 91 92 93 94 95]
            [96 97 98 99 100 101 102 103 104 105 106 107 108 109 110 111
             112 113 114 115 116 117 118 119 120 121 122 123 124 125 126 127]
        );
    };
}

/// `accumulators!(R)`: [`Accumulators`] for `[f32; R]`, an empty `asm!` with every element an
/// in/out operand (template `/* wgmma accumulators: {0} {1} ... */`).
macro_rules! accumulators {
    ($r:tt) => {
        with_indices!(accumulators!{@impl $r}, $r);
    };
    (@impl $r:tt [$($i:literal)*]) => {
        impl Accumulators for [f32; $r] {
            #[inline(always)]
            fn fence_operands(&mut self) {
                let d = self;
                // SAFETY: an empty template; the operands only pin the values in registers here.
                unsafe {
                    asm!(
                        concat!("/* wgmma accumulators:", $(" {", $i, "}",)* " */"),
                        $(inout(reg32) d[$i],)*
                        options(nostack, nomem, preserves_flags)
                    )
                };
            }
        }
    };
}

accumulators!(4);
accumulators!(8);
accumulators!(16);
accumulators!(32);
accumulators!(64);
accumulators!(128);

/// `mma_async!(name, N, R, type, TYPE)`: `name`, the `m64nNk16` FP32-accumulator `mma_async` with
/// A and B of `type` (`bf16` or `f16`; `TYPE` as the docs spell it) and R accumulators a thread.
macro_rules! mma_async {
    ($name:ident, $n:tt, $r:tt, $ty:ident, $doc_ty:literal) => {
        with_indices!(mma_async!{@fn $name, $n, $r, $ty, $doc_ty}, $r);
    };
    (@fn $name:ident, $n:tt, $r:tt, $ty:ident, $doc_ty:literal [$i0:literal $($i:literal)*]) => {
        #[doc = concat!(
            " `wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", stringify!($ty), ".",
            stringify!($ty), "` (§9.7.15.5.2): `d += A * B` (or"
        )]
        #[doc = concat!(
            " `d = A * B` when `scale_d` is 0) for a 64x16 A and a 16x", $n,
            " B in shared memory, ", $doc_ty
        )]
        #[doc = concat!(
            " inputs, FP32 accumulators `d` (", $r,
            " per thread, layout in the module docs). A is K-major;"
        )]
        /// `TRANS_B` = 0 for a K-major B, 1 for an MN-major B.
        ///
        /// # Safety
        /// Warpgroup-collective (all 128 threads, convergently, with the same descriptors). The
        /// descriptors describe shared memory of this CTA holding the operands in the layout they encode,
        /// written before the call (TMA completion observed on its mbarrier, or generic writes followed
        /// by [`super::bulk::fence_proxy_async_shared`]) and not written until a [`wait_group`] covering
        /// this MMA returns. [`fence`] was called since `d` was last written by other instructions.
        #[inline(always)]
        pub unsafe fn $name<const TRANS_B: u32>(
            d: &mut [f32; $r],
            a: MatrixDescriptor,
            b: MatrixDescriptor,
            scale_d: u32,
        ) {
            // SAFETY: the caller upholds the contract above; TRANS_B is an immediate 0 or 1.
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "setp.ne.b32 p, {sd}, 0;",
                    concat!(
                        "wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", stringify!($ty), ".",
                        stringify!($ty), " {{{", $i0, "}", $(", {", $i, "}",)*
                        "}}, {da}, {db}, p, 1, 1, 0, {tb};"
                    ),
                    "}}",
                    inout(reg32) d[$i0],
                    $(inout(reg32) d[$i],)*
                    da = in(reg64) a.bits(),
                    db = in(reg64) b.bits(),
                    sd = in(reg32) scale_d,
                    tb = const TRANS_B,
                    options(nostack)
                );
            }
        }
    };
}

mma_async!(mma_async_m64n8k16_f32_bf16, 8, 4, bf16, "BF16");
mma_async!(mma_async_m64n16k16_f32_bf16, 16, 8, bf16, "BF16");
mma_async!(mma_async_m64n32k16_f32_bf16, 32, 16, bf16, "BF16");
mma_async!(mma_async_m64n64k16_f32_bf16, 64, 32, bf16, "BF16");
mma_async!(mma_async_m64n64k16_f32_f16, 64, 32, f16, "F16");
mma_async!(mma_async_m64n128k16_f32_bf16, 128, 64, bf16, "BF16");
mma_async!(mma_async_m64n128k16_f32_f16, 128, 64, f16, "F16");
mma_async!(mma_async_m64n256k16_f32_bf16, 256, 128, bf16, "BF16");
mma_async!(mma_async_m64n256k16_f32_f16, 256, 128, f16, "F16");

/// `mma_async_fp8!(name, N, R, atype, btype)`: `name`, the `m64nNk32` FP32-accumulator
/// `mma_async` with 8-bit floating-point A of `atype` and B of `btype` (`e4m3` or `e5m2`) and R
/// accumulators a thread. PTX ISA 8.3 §9.7.15.5.2: for `.e4m3`/`.e5m2` the instruction has no
/// `imm-trans-a`/`imm-trans-b` operands: both A and B must be K-major in shared memory.
macro_rules! mma_async_fp8 {
    ($name:ident, $n:tt, $r:tt, $at:ident, $bt:ident) => {
        with_indices!(mma_async_fp8!{@fn $name, $n, $r, $at, $bt}, $r);
    };
    (@fn $name:ident, $n:tt, $r:tt, $at:ident, $bt:ident [$i0:literal $($i:literal)*]) => {
        #[doc = concat!(
            " `wgmma.mma_async.sync.aligned.m64n", $n, "k32.f32.", stringify!($at), ".",
            stringify!($bt), "` (§9.7.15.5.2): `d += A * B` (or `d = A * B` when `scale_d` is 0)"
        )]
        #[doc = concat!(
            " for a 64x32 A of `", stringify!($at), "` and a 32x", $n, " B of `",
            stringify!($bt), "` (FP8, one byte per element)"
        )]
        #[doc = concat!(
            " in shared memory, FP32 accumulators `d` (", $r,
            " per thread, the same layout as `m64nNk16`, module docs)."
        )]
        /// Both operands are K-major (FP8 wgmma has no transpose): with the 128-byte swizzle a
        /// row of the operand is 128 K-elements, so `stride = 1024` and the k-th `k32` slice
        /// starts `32 * k` bytes in, exactly as for a 16-bit `k16` slice.
        ///
        /// # Safety
        /// Warpgroup-collective (all 128 threads, convergently, with the same descriptors). The
        /// descriptors describe shared memory of this CTA holding the operands in the layout they
        /// encode, written before the call (TMA completion observed on its mbarrier, or generic
        /// writes followed by [`super::bulk::fence_proxy_async_shared`]) and not written until a
        /// [`wait_group`] covering this MMA returns. [`fence`] was called since `d` was last
        /// written by other instructions.
        #[inline(always)]
        pub unsafe fn $name(
            d: &mut [f32; $r],
            a: MatrixDescriptor,
            b: MatrixDescriptor,
            scale_d: u32,
        ) {
            // SAFETY: the caller upholds the contract above.
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "setp.ne.b32 p, {sd}, 0;",
                    concat!(
                        "wgmma.mma_async.sync.aligned.m64n", $n, "k32.f32.", stringify!($at), ".",
                        stringify!($bt), " {{{", $i0, "}", $(", {", $i, "}",)*
                        "}}, {da}, {db}, p, 1, 1;"
                    ),
                    "}}",
                    inout(reg32) d[$i0],
                    $(inout(reg32) d[$i],)*
                    da = in(reg64) a.bits(),
                    db = in(reg64) b.bits(),
                    sd = in(reg32) scale_d,
                    options(nostack)
                );
            }
        }
    };
}

mma_async_fp8!(mma_async_m64n128k32_f32_e4m3_e4m3, 128, 64, e4m3, e4m3);
mma_async_fp8!(mma_async_m64n256k32_f32_e4m3_e4m3, 256, 128, e4m3, e4m3);
mma_async_fp8!(mma_async_m64n256k32_f32_e4m3_e5m2, 256, 128, e4m3, e5m2);

/// `mma_async_rs!(name, N, R, type, TYPE)`: `name`, the `m64nNk16` FP32-accumulator `mma_async`
/// with A of `type` in registers (four `.b32` a thread, [`AFragment`]) and B in shared memory.
macro_rules! mma_async_rs {
    ($name:ident, $n:tt, $r:tt, $ty:ident, $doc_ty:literal) => {
        with_indices!(mma_async_rs!{@fn $name, $n, $r, $ty, $doc_ty}, $r);
    };
    (@fn $name:ident, $n:tt, $r:tt, $ty:ident, $doc_ty:literal [$i0:literal $($i:literal)*]) => {
        #[doc = concat!(
            " `wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", stringify!($ty), ".",
            stringify!($ty), "` with A in registers (PTX ISA 8.3 §9.7.15.5.2, the `a` operand"
        )]
        #[doc = concat!(
            " as a vector of four `.b32`): `d += A * B` (or `d = A * B` when `scale_d` is 0) for",
            " a 64x16 A of ", $doc_ty, " held by the warpgroup as [`AFragment`]s and a 16x", $n,
        )]
        #[doc = concat!(
            " B in shared memory (descriptor `b`), FP32 accumulators `d` (", $r,
            " per thread, layout in the module docs)."
        )]
        /// `TRANS_B` = 0 for a K-major B, 1 for an MN-major B (e.g. V of attention's `P V`,
        /// stored key-major with the head dimension contiguous). There is no `imm-trans-a`: a
        /// register A has one layout.
        ///
        /// # Safety
        /// Warpgroup-collective (all 128 threads, convergently, with the same descriptor). The
        /// descriptor describes shared memory of this CTA holding B in the layout it encodes,
        /// written before the call (TMA completion observed on its mbarrier, or generic writes
        /// followed by [`super::bulk::fence_proxy_async_shared`]) and not written until a
        /// [`wait_group`] covering this MMA returns. [`fence`] was called since `d` (or `a`) was
        /// last written by other instructions. `a` is read asynchronously: its registers are not
        /// written until a [`wait_group`] covering this MMA returns (ptxas tracks the registers
        /// and serializes, with warning C751x, where the program breaks this).
        #[inline(always)]
        pub unsafe fn $name<const TRANS_B: u32>(
            d: &mut [f32; $r],
            a: AFragment,
            b: MatrixDescriptor,
            scale_d: u32,
        ) {
            // SAFETY: the caller upholds the contract above; TRANS_B is an immediate 0 or 1.
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "setp.ne.b32 p, {sd}, 0;",
                    concat!(
                        "wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", stringify!($ty), ".",
                        stringify!($ty), " {{{", $i0, "}", $(", {", $i, "}",)*
                        "}}, {{{a0}, {a1}, {a2}, {a3}}}, {db}, p, 1, 1, {tb};"
                    ),
                    "}}",
                    inout(reg32) d[$i0],
                    $(inout(reg32) d[$i],)*
                    a0 = in(reg32) a.0[0],
                    a1 = in(reg32) a.0[1],
                    a2 = in(reg32) a.0[2],
                    a3 = in(reg32) a.0[3],
                    db = in(reg64) b.bits(),
                    sd = in(reg32) scale_d,
                    tb = const TRANS_B,
                    options(nostack)
                );
            }
        }
    };
}

/// One thread's share of a 64x16 A operand of 16-bit elements in registers, for the `_rs` forms
/// ([`mma_async_rs_m64n64k16_f32_bf16`] etc.): four `.b32` registers, each two elements packed
/// low column first (`lo | hi << 16`).
///
/// Layout (PTX ISA 8.3 §9.7.15.5.1, "Register Fragments": matrix A of `wgmma.m64nNk16` with
/// `.f16`/`.bf16`; warp `w` of the warpgroup holds rows `16 w .. 16 w + 16`, each warp as the A
/// of `mma.m16n8k16`): lane `l`, `g = l / 4`, `q = l % 4`:
///
/// | register | row        | columns (k)          |
/// | -------- | ---------- | -------------------- |
/// | `a[0]`   | `16w + g`     | `2q, 2q + 1`      |
/// | `a[1]`   | `16w + g + 8` | `2q, 2q + 1`      |
/// | `a[2]`   | `16w + g`     | `2q + 8, 2q + 9`  |
/// | `a[3]`   | `16w + g + 8` | `2q + 8, 2q + 9`  |
///
/// This is the FP32 accumulator layout (module docs) of two neighbouring n8 blocks: accumulators
/// `d[8 s .. 8 s + 8]` of an `m64nNk16` result hold exactly the elements of columns
/// `16 s .. 16 s + 16` that the A fragment of the k16 slice `s` needs, in this order, so
/// [`AFragment::from_acc_bf16`] packs them pairwise with no data movement between threads (how
/// FlashAttention-3 feeds `P = softmax(S)` to `O += P V`: `convert_layout_acc_Aregs` is a
/// relabelling for 16-bit types).
#[derive(Clone, Copy)]
pub struct AFragment(pub [u32; 4]);

impl AFragment {
    /// The A fragment of k16 slice `s` (columns `16 s .. 16 s + 16`) of an FP32 accumulator
    /// array `d` of `m64nNk16` (`d.len() >= 8 s + 8`), rounded to BF16 (nearest even).
    /// Use constant `s` (unrolled loops or literals) so `d` stays in registers.
    #[inline(always)]
    pub fn from_acc_bf16(d: &[f32], s: usize) -> Self {
        let b = 8 * s;
        Self([
            super::math::pack_bf16x2(d[b], d[b + 1]),
            super::math::pack_bf16x2(d[b + 2], d[b + 3]),
            super::math::pack_bf16x2(d[b + 4], d[b + 5]),
            super::math::pack_bf16x2(d[b + 6], d[b + 7]),
        ])
    }

    /// As [`Self::from_acc_bf16`], rounded to FP16 (nearest even; beyond 65504 gives infinity).
    #[inline(always)]
    pub fn from_acc_f16(d: &[f32], s: usize) -> Self {
        let b = 8 * s;
        Self([
            super::math::pack_f16x2(d[b], d[b + 1]),
            super::math::pack_f16x2(d[b + 2], d[b + 3]),
            super::math::pack_f16x2(d[b + 4], d[b + 5]),
            super::math::pack_f16x2(d[b + 6], d[b + 7]),
        ])
    }
}

/// A compiler-only fence on A-fragment registers, as [`fence_operands`] for accumulators: use it
/// after the [`wait_group`] that retires the MMAs reading `a`, before writing the fragments
/// again, so the compiler keeps them in place while the MMAs may still read them.
#[inline(always)]
pub fn fence_fragments<const K: usize>(a: &mut [AFragment; K]) {
    let mut i = 0;
    while i < K {
        // SAFETY: an empty template; the operands only pin the values in registers here.
        unsafe {
            asm!(
                "/* wgmma A fragment: {0} {1} {2} {3} */",
                inout(reg32) a[i].0[0],
                inout(reg32) a[i].0[1],
                inout(reg32) a[i].0[2],
                inout(reg32) a[i].0[3],
                options(nostack, nomem, preserves_flags)
            )
        };
        i += 1;
    }
}

mma_async_rs!(mma_async_rs_m64n64k16_f32_bf16, 64, 32, bf16, "BF16");
mma_async_rs!(mma_async_rs_m64n64k16_f32_f16, 64, 32, f16, "F16");
mma_async_rs!(mma_async_rs_m64n128k16_f32_bf16, 128, 64, bf16, "BF16");
mma_async_rs!(mma_async_rs_m64n128k16_f32_f16, 128, 64, f16, "F16");
mma_async_rs!(mma_async_rs_m64n256k16_f32_bf16, 256, 128, bf16, "BF16");
mma_async_rs!(mma_async_rs_m64n256k16_f32_f16, 256, 128, f16, "F16");
