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

impl Accumulators for [f32; 32] {
    #[inline(always)]
    fn fence_operands(&mut self) {
        let d = self;
        // SAFETY: an empty template; the operands only pin the values in registers here.
        unsafe {
            asm!(
                "/* wgmma accumulators: {0} {1} {2} {3} {4} {5} {6} {7} {8} {9} {10} {11} {12} {13} {14} {15} {16} {17} {18} {19} {20} {21} {22} {23} {24} {25} {26} {27} {28} {29} {30} {31} */",
                inout(reg32) d[0],
                inout(reg32) d[1],
                inout(reg32) d[2],
                inout(reg32) d[3],
                inout(reg32) d[4],
                inout(reg32) d[5],
                inout(reg32) d[6],
                inout(reg32) d[7],
                inout(reg32) d[8],
                inout(reg32) d[9],
                inout(reg32) d[10],
                inout(reg32) d[11],
                inout(reg32) d[12],
                inout(reg32) d[13],
                inout(reg32) d[14],
                inout(reg32) d[15],
                inout(reg32) d[16],
                inout(reg32) d[17],
                inout(reg32) d[18],
                inout(reg32) d[19],
                inout(reg32) d[20],
                inout(reg32) d[21],
                inout(reg32) d[22],
                inout(reg32) d[23],
                inout(reg32) d[24],
                inout(reg32) d[25],
                inout(reg32) d[26],
                inout(reg32) d[27],
                inout(reg32) d[28],
                inout(reg32) d[29],
                inout(reg32) d[30],
                inout(reg32) d[31],
                options(nostack, nomem, preserves_flags)
            )
        };
    }
}

impl Accumulators for [f32; 64] {
    #[inline(always)]
    fn fence_operands(&mut self) {
        let d = self;
        // SAFETY: an empty template; the operands only pin the values in registers here.
        unsafe {
            asm!(
                "/* wgmma accumulators: {0} {1} {2} {3} {4} {5} {6} {7} {8} {9} {10} {11} {12} {13} {14} {15} {16} {17} {18} {19} {20} {21} {22} {23} {24} {25} {26} {27} {28} {29} {30} {31} {32} {33} {34} {35} {36} {37} {38} {39} {40} {41} {42} {43} {44} {45} {46} {47} {48} {49} {50} {51} {52} {53} {54} {55} {56} {57} {58} {59} {60} {61} {62} {63} */",
                inout(reg32) d[0],
                inout(reg32) d[1],
                inout(reg32) d[2],
                inout(reg32) d[3],
                inout(reg32) d[4],
                inout(reg32) d[5],
                inout(reg32) d[6],
                inout(reg32) d[7],
                inout(reg32) d[8],
                inout(reg32) d[9],
                inout(reg32) d[10],
                inout(reg32) d[11],
                inout(reg32) d[12],
                inout(reg32) d[13],
                inout(reg32) d[14],
                inout(reg32) d[15],
                inout(reg32) d[16],
                inout(reg32) d[17],
                inout(reg32) d[18],
                inout(reg32) d[19],
                inout(reg32) d[20],
                inout(reg32) d[21],
                inout(reg32) d[22],
                inout(reg32) d[23],
                inout(reg32) d[24],
                inout(reg32) d[25],
                inout(reg32) d[26],
                inout(reg32) d[27],
                inout(reg32) d[28],
                inout(reg32) d[29],
                inout(reg32) d[30],
                inout(reg32) d[31],
                inout(reg32) d[32],
                inout(reg32) d[33],
                inout(reg32) d[34],
                inout(reg32) d[35],
                inout(reg32) d[36],
                inout(reg32) d[37],
                inout(reg32) d[38],
                inout(reg32) d[39],
                inout(reg32) d[40],
                inout(reg32) d[41],
                inout(reg32) d[42],
                inout(reg32) d[43],
                inout(reg32) d[44],
                inout(reg32) d[45],
                inout(reg32) d[46],
                inout(reg32) d[47],
                inout(reg32) d[48],
                inout(reg32) d[49],
                inout(reg32) d[50],
                inout(reg32) d[51],
                inout(reg32) d[52],
                inout(reg32) d[53],
                inout(reg32) d[54],
                inout(reg32) d[55],
                inout(reg32) d[56],
                inout(reg32) d[57],
                inout(reg32) d[58],
                inout(reg32) d[59],
                inout(reg32) d[60],
                inout(reg32) d[61],
                inout(reg32) d[62],
                inout(reg32) d[63],
                options(nostack, nomem, preserves_flags)
            )
        };
    }
}

impl Accumulators for [f32; 128] {
    #[inline(always)]
    fn fence_operands(&mut self) {
        let d = self;
        // SAFETY: an empty template; the operands only pin the values in registers here.
        unsafe {
            asm!(
                "/* wgmma accumulators: {0} {1} {2} {3} {4} {5} {6} {7} {8} {9} {10} {11} {12} {13} {14} {15} {16} {17} {18} {19} {20} {21} {22} {23} {24} {25} {26} {27} {28} {29} {30} {31} {32} {33} {34} {35} {36} {37} {38} {39} {40} {41} {42} {43} {44} {45} {46} {47} {48} {49} {50} {51} {52} {53} {54} {55} {56} {57} {58} {59} {60} {61} {62} {63} {64} {65} {66} {67} {68} {69} {70} {71} {72} {73} {74} {75} {76} {77} {78} {79} {80} {81} {82} {83} {84} {85} {86} {87} {88} {89} {90} {91} {92} {93} {94} {95} {96} {97} {98} {99} {100} {101} {102} {103} {104} {105} {106} {107} {108} {109} {110} {111} {112} {113} {114} {115} {116} {117} {118} {119} {120} {121} {122} {123} {124} {125} {126} {127} */",
                inout(reg32) d[0],
                inout(reg32) d[1],
                inout(reg32) d[2],
                inout(reg32) d[3],
                inout(reg32) d[4],
                inout(reg32) d[5],
                inout(reg32) d[6],
                inout(reg32) d[7],
                inout(reg32) d[8],
                inout(reg32) d[9],
                inout(reg32) d[10],
                inout(reg32) d[11],
                inout(reg32) d[12],
                inout(reg32) d[13],
                inout(reg32) d[14],
                inout(reg32) d[15],
                inout(reg32) d[16],
                inout(reg32) d[17],
                inout(reg32) d[18],
                inout(reg32) d[19],
                inout(reg32) d[20],
                inout(reg32) d[21],
                inout(reg32) d[22],
                inout(reg32) d[23],
                inout(reg32) d[24],
                inout(reg32) d[25],
                inout(reg32) d[26],
                inout(reg32) d[27],
                inout(reg32) d[28],
                inout(reg32) d[29],
                inout(reg32) d[30],
                inout(reg32) d[31],
                inout(reg32) d[32],
                inout(reg32) d[33],
                inout(reg32) d[34],
                inout(reg32) d[35],
                inout(reg32) d[36],
                inout(reg32) d[37],
                inout(reg32) d[38],
                inout(reg32) d[39],
                inout(reg32) d[40],
                inout(reg32) d[41],
                inout(reg32) d[42],
                inout(reg32) d[43],
                inout(reg32) d[44],
                inout(reg32) d[45],
                inout(reg32) d[46],
                inout(reg32) d[47],
                inout(reg32) d[48],
                inout(reg32) d[49],
                inout(reg32) d[50],
                inout(reg32) d[51],
                inout(reg32) d[52],
                inout(reg32) d[53],
                inout(reg32) d[54],
                inout(reg32) d[55],
                inout(reg32) d[56],
                inout(reg32) d[57],
                inout(reg32) d[58],
                inout(reg32) d[59],
                inout(reg32) d[60],
                inout(reg32) d[61],
                inout(reg32) d[62],
                inout(reg32) d[63],
                inout(reg32) d[64],
                inout(reg32) d[65],
                inout(reg32) d[66],
                inout(reg32) d[67],
                inout(reg32) d[68],
                inout(reg32) d[69],
                inout(reg32) d[70],
                inout(reg32) d[71],
                inout(reg32) d[72],
                inout(reg32) d[73],
                inout(reg32) d[74],
                inout(reg32) d[75],
                inout(reg32) d[76],
                inout(reg32) d[77],
                inout(reg32) d[78],
                inout(reg32) d[79],
                inout(reg32) d[80],
                inout(reg32) d[81],
                inout(reg32) d[82],
                inout(reg32) d[83],
                inout(reg32) d[84],
                inout(reg32) d[85],
                inout(reg32) d[86],
                inout(reg32) d[87],
                inout(reg32) d[88],
                inout(reg32) d[89],
                inout(reg32) d[90],
                inout(reg32) d[91],
                inout(reg32) d[92],
                inout(reg32) d[93],
                inout(reg32) d[94],
                inout(reg32) d[95],
                inout(reg32) d[96],
                inout(reg32) d[97],
                inout(reg32) d[98],
                inout(reg32) d[99],
                inout(reg32) d[100],
                inout(reg32) d[101],
                inout(reg32) d[102],
                inout(reg32) d[103],
                inout(reg32) d[104],
                inout(reg32) d[105],
                inout(reg32) d[106],
                inout(reg32) d[107],
                inout(reg32) d[108],
                inout(reg32) d[109],
                inout(reg32) d[110],
                inout(reg32) d[111],
                inout(reg32) d[112],
                inout(reg32) d[113],
                inout(reg32) d[114],
                inout(reg32) d[115],
                inout(reg32) d[116],
                inout(reg32) d[117],
                inout(reg32) d[118],
                inout(reg32) d[119],
                inout(reg32) d[120],
                inout(reg32) d[121],
                inout(reg32) d[122],
                inout(reg32) d[123],
                inout(reg32) d[124],
                inout(reg32) d[125],
                inout(reg32) d[126],
                inout(reg32) d[127],
                options(nostack, nomem, preserves_flags)
            )
        };
    }
}

/// `wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16` (§9.7.15.5.2): `d += A * B` (or
/// `d = A * B` when `scale_d` is 0) for a 64x16 A and a 16x64 B in shared memory, BF16
/// inputs, FP32 accumulators `d` (32 per thread, layout in the module docs). A is K-major;
/// `TRANS_B` = 0 for a K-major B, 1 for an MN-major B.
///
/// # Safety
/// Warpgroup-collective (all 128 threads, convergently, with the same descriptors). The
/// descriptors describe shared memory of this CTA holding the operands in the layout they encode,
/// written before the call (TMA completion observed on its mbarrier, or generic writes followed
/// by [`super::bulk::fence_proxy_async_shared`]) and not written until a [`wait_group`] covering
/// this MMA returns. [`fence`] was called since `d` was last written by other instructions.
#[inline(always)]
pub unsafe fn mma_async_m64n64k16_f32_bf16<const TRANS_B: u32>(
    d: &mut [f32; 32],
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
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}, {29}, {30}, {31}}}, {da}, {db}, p, 1, 1, 0, {tb};",
            "}}",
            inout(reg32) d[0],
            inout(reg32) d[1],
            inout(reg32) d[2],
            inout(reg32) d[3],
            inout(reg32) d[4],
            inout(reg32) d[5],
            inout(reg32) d[6],
            inout(reg32) d[7],
            inout(reg32) d[8],
            inout(reg32) d[9],
            inout(reg32) d[10],
            inout(reg32) d[11],
            inout(reg32) d[12],
            inout(reg32) d[13],
            inout(reg32) d[14],
            inout(reg32) d[15],
            inout(reg32) d[16],
            inout(reg32) d[17],
            inout(reg32) d[18],
            inout(reg32) d[19],
            inout(reg32) d[20],
            inout(reg32) d[21],
            inout(reg32) d[22],
            inout(reg32) d[23],
            inout(reg32) d[24],
            inout(reg32) d[25],
            inout(reg32) d[26],
            inout(reg32) d[27],
            inout(reg32) d[28],
            inout(reg32) d[29],
            inout(reg32) d[30],
            inout(reg32) d[31],
            da = in(reg64) a.bits(),
            db = in(reg64) b.bits(),
            sd = in(reg32) scale_d,
            tb = const TRANS_B,
            options(nostack)
        );
    }
}

/// `wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16` (§9.7.15.5.2): `d += A * B` (or
/// `d = A * B` when `scale_d` is 0) for a 64x16 A and a 16x64 B in shared memory, F16
/// inputs, FP32 accumulators `d` (32 per thread, layout in the module docs). A is K-major;
/// `TRANS_B` = 0 for a K-major B, 1 for an MN-major B.
///
/// # Safety
/// Warpgroup-collective (all 128 threads, convergently, with the same descriptors). The
/// descriptors describe shared memory of this CTA holding the operands in the layout they encode,
/// written before the call (TMA completion observed on its mbarrier, or generic writes followed
/// by [`super::bulk::fence_proxy_async_shared`]) and not written until a [`wait_group`] covering
/// this MMA returns. [`fence`] was called since `d` was last written by other instructions.
#[inline(always)]
pub unsafe fn mma_async_m64n64k16_f32_f16<const TRANS_B: u32>(
    d: &mut [f32; 32],
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
            "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}, {29}, {30}, {31}}}, {da}, {db}, p, 1, 1, 0, {tb};",
            "}}",
            inout(reg32) d[0],
            inout(reg32) d[1],
            inout(reg32) d[2],
            inout(reg32) d[3],
            inout(reg32) d[4],
            inout(reg32) d[5],
            inout(reg32) d[6],
            inout(reg32) d[7],
            inout(reg32) d[8],
            inout(reg32) d[9],
            inout(reg32) d[10],
            inout(reg32) d[11],
            inout(reg32) d[12],
            inout(reg32) d[13],
            inout(reg32) d[14],
            inout(reg32) d[15],
            inout(reg32) d[16],
            inout(reg32) d[17],
            inout(reg32) d[18],
            inout(reg32) d[19],
            inout(reg32) d[20],
            inout(reg32) d[21],
            inout(reg32) d[22],
            inout(reg32) d[23],
            inout(reg32) d[24],
            inout(reg32) d[25],
            inout(reg32) d[26],
            inout(reg32) d[27],
            inout(reg32) d[28],
            inout(reg32) d[29],
            inout(reg32) d[30],
            inout(reg32) d[31],
            da = in(reg64) a.bits(),
            db = in(reg64) b.bits(),
            sd = in(reg32) scale_d,
            tb = const TRANS_B,
            options(nostack)
        );
    }
}

/// `wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16` (§9.7.15.5.2): `d += A * B` (or
/// `d = A * B` when `scale_d` is 0) for a 64x16 A and a 16x128 B in shared memory, BF16
/// inputs, FP32 accumulators `d` (64 per thread, layout in the module docs). A is K-major;
/// `TRANS_B` = 0 for a K-major B, 1 for an MN-major B.
///
/// # Safety
/// Warpgroup-collective (all 128 threads, convergently, with the same descriptors). The
/// descriptors describe shared memory of this CTA holding the operands in the layout they encode,
/// written before the call (TMA completion observed on its mbarrier, or generic writes followed
/// by [`super::bulk::fence_proxy_async_shared`]) and not written until a [`wait_group`] covering
/// this MMA returns. [`fence`] was called since `d` was last written by other instructions.
#[inline(always)]
pub unsafe fn mma_async_m64n128k16_f32_bf16<const TRANS_B: u32>(
    d: &mut [f32; 64],
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
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}, {29}, {30}, {31}, {32}, {33}, {34}, {35}, {36}, {37}, {38}, {39}, {40}, {41}, {42}, {43}, {44}, {45}, {46}, {47}, {48}, {49}, {50}, {51}, {52}, {53}, {54}, {55}, {56}, {57}, {58}, {59}, {60}, {61}, {62}, {63}}}, {da}, {db}, p, 1, 1, 0, {tb};",
            "}}",
            inout(reg32) d[0],
            inout(reg32) d[1],
            inout(reg32) d[2],
            inout(reg32) d[3],
            inout(reg32) d[4],
            inout(reg32) d[5],
            inout(reg32) d[6],
            inout(reg32) d[7],
            inout(reg32) d[8],
            inout(reg32) d[9],
            inout(reg32) d[10],
            inout(reg32) d[11],
            inout(reg32) d[12],
            inout(reg32) d[13],
            inout(reg32) d[14],
            inout(reg32) d[15],
            inout(reg32) d[16],
            inout(reg32) d[17],
            inout(reg32) d[18],
            inout(reg32) d[19],
            inout(reg32) d[20],
            inout(reg32) d[21],
            inout(reg32) d[22],
            inout(reg32) d[23],
            inout(reg32) d[24],
            inout(reg32) d[25],
            inout(reg32) d[26],
            inout(reg32) d[27],
            inout(reg32) d[28],
            inout(reg32) d[29],
            inout(reg32) d[30],
            inout(reg32) d[31],
            inout(reg32) d[32],
            inout(reg32) d[33],
            inout(reg32) d[34],
            inout(reg32) d[35],
            inout(reg32) d[36],
            inout(reg32) d[37],
            inout(reg32) d[38],
            inout(reg32) d[39],
            inout(reg32) d[40],
            inout(reg32) d[41],
            inout(reg32) d[42],
            inout(reg32) d[43],
            inout(reg32) d[44],
            inout(reg32) d[45],
            inout(reg32) d[46],
            inout(reg32) d[47],
            inout(reg32) d[48],
            inout(reg32) d[49],
            inout(reg32) d[50],
            inout(reg32) d[51],
            inout(reg32) d[52],
            inout(reg32) d[53],
            inout(reg32) d[54],
            inout(reg32) d[55],
            inout(reg32) d[56],
            inout(reg32) d[57],
            inout(reg32) d[58],
            inout(reg32) d[59],
            inout(reg32) d[60],
            inout(reg32) d[61],
            inout(reg32) d[62],
            inout(reg32) d[63],
            da = in(reg64) a.bits(),
            db = in(reg64) b.bits(),
            sd = in(reg32) scale_d,
            tb = const TRANS_B,
            options(nostack)
        );
    }
}

/// `wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16` (§9.7.15.5.2): `d += A * B` (or
/// `d = A * B` when `scale_d` is 0) for a 64x16 A and a 16x128 B in shared memory, F16
/// inputs, FP32 accumulators `d` (64 per thread, layout in the module docs). A is K-major;
/// `TRANS_B` = 0 for a K-major B, 1 for an MN-major B.
///
/// # Safety
/// Warpgroup-collective (all 128 threads, convergently, with the same descriptors). The
/// descriptors describe shared memory of this CTA holding the operands in the layout they encode,
/// written before the call (TMA completion observed on its mbarrier, or generic writes followed
/// by [`super::bulk::fence_proxy_async_shared`]) and not written until a [`wait_group`] covering
/// this MMA returns. [`fence`] was called since `d` was last written by other instructions.
#[inline(always)]
pub unsafe fn mma_async_m64n128k16_f32_f16<const TRANS_B: u32>(
    d: &mut [f32; 64],
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
            "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}, {29}, {30}, {31}, {32}, {33}, {34}, {35}, {36}, {37}, {38}, {39}, {40}, {41}, {42}, {43}, {44}, {45}, {46}, {47}, {48}, {49}, {50}, {51}, {52}, {53}, {54}, {55}, {56}, {57}, {58}, {59}, {60}, {61}, {62}, {63}}}, {da}, {db}, p, 1, 1, 0, {tb};",
            "}}",
            inout(reg32) d[0],
            inout(reg32) d[1],
            inout(reg32) d[2],
            inout(reg32) d[3],
            inout(reg32) d[4],
            inout(reg32) d[5],
            inout(reg32) d[6],
            inout(reg32) d[7],
            inout(reg32) d[8],
            inout(reg32) d[9],
            inout(reg32) d[10],
            inout(reg32) d[11],
            inout(reg32) d[12],
            inout(reg32) d[13],
            inout(reg32) d[14],
            inout(reg32) d[15],
            inout(reg32) d[16],
            inout(reg32) d[17],
            inout(reg32) d[18],
            inout(reg32) d[19],
            inout(reg32) d[20],
            inout(reg32) d[21],
            inout(reg32) d[22],
            inout(reg32) d[23],
            inout(reg32) d[24],
            inout(reg32) d[25],
            inout(reg32) d[26],
            inout(reg32) d[27],
            inout(reg32) d[28],
            inout(reg32) d[29],
            inout(reg32) d[30],
            inout(reg32) d[31],
            inout(reg32) d[32],
            inout(reg32) d[33],
            inout(reg32) d[34],
            inout(reg32) d[35],
            inout(reg32) d[36],
            inout(reg32) d[37],
            inout(reg32) d[38],
            inout(reg32) d[39],
            inout(reg32) d[40],
            inout(reg32) d[41],
            inout(reg32) d[42],
            inout(reg32) d[43],
            inout(reg32) d[44],
            inout(reg32) d[45],
            inout(reg32) d[46],
            inout(reg32) d[47],
            inout(reg32) d[48],
            inout(reg32) d[49],
            inout(reg32) d[50],
            inout(reg32) d[51],
            inout(reg32) d[52],
            inout(reg32) d[53],
            inout(reg32) d[54],
            inout(reg32) d[55],
            inout(reg32) d[56],
            inout(reg32) d[57],
            inout(reg32) d[58],
            inout(reg32) d[59],
            inout(reg32) d[60],
            inout(reg32) d[61],
            inout(reg32) d[62],
            inout(reg32) d[63],
            da = in(reg64) a.bits(),
            db = in(reg64) b.bits(),
            sd = in(reg32) scale_d,
            tb = const TRANS_B,
            options(nostack)
        );
    }
}

/// `wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16` (§9.7.15.5.2): `d += A * B` (or
/// `d = A * B` when `scale_d` is 0) for a 64x16 A and a 16x256 B in shared memory, BF16
/// inputs, FP32 accumulators `d` (128 per thread, layout in the module docs). A is K-major;
/// `TRANS_B` = 0 for a K-major B, 1 for an MN-major B.
///
/// # Safety
/// Warpgroup-collective (all 128 threads, convergently, with the same descriptors). The
/// descriptors describe shared memory of this CTA holding the operands in the layout they encode,
/// written before the call (TMA completion observed on its mbarrier, or generic writes followed
/// by [`super::bulk::fence_proxy_async_shared`]) and not written until a [`wait_group`] covering
/// this MMA returns. [`fence`] was called since `d` was last written by other instructions.
#[inline(always)]
pub unsafe fn mma_async_m64n256k16_f32_bf16<const TRANS_B: u32>(
    d: &mut [f32; 128],
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
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}, {29}, {30}, {31}, {32}, {33}, {34}, {35}, {36}, {37}, {38}, {39}, {40}, {41}, {42}, {43}, {44}, {45}, {46}, {47}, {48}, {49}, {50}, {51}, {52}, {53}, {54}, {55}, {56}, {57}, {58}, {59}, {60}, {61}, {62}, {63}, {64}, {65}, {66}, {67}, {68}, {69}, {70}, {71}, {72}, {73}, {74}, {75}, {76}, {77}, {78}, {79}, {80}, {81}, {82}, {83}, {84}, {85}, {86}, {87}, {88}, {89}, {90}, {91}, {92}, {93}, {94}, {95}, {96}, {97}, {98}, {99}, {100}, {101}, {102}, {103}, {104}, {105}, {106}, {107}, {108}, {109}, {110}, {111}, {112}, {113}, {114}, {115}, {116}, {117}, {118}, {119}, {120}, {121}, {122}, {123}, {124}, {125}, {126}, {127}}}, {da}, {db}, p, 1, 1, 0, {tb};",
            "}}",
            inout(reg32) d[0],
            inout(reg32) d[1],
            inout(reg32) d[2],
            inout(reg32) d[3],
            inout(reg32) d[4],
            inout(reg32) d[5],
            inout(reg32) d[6],
            inout(reg32) d[7],
            inout(reg32) d[8],
            inout(reg32) d[9],
            inout(reg32) d[10],
            inout(reg32) d[11],
            inout(reg32) d[12],
            inout(reg32) d[13],
            inout(reg32) d[14],
            inout(reg32) d[15],
            inout(reg32) d[16],
            inout(reg32) d[17],
            inout(reg32) d[18],
            inout(reg32) d[19],
            inout(reg32) d[20],
            inout(reg32) d[21],
            inout(reg32) d[22],
            inout(reg32) d[23],
            inout(reg32) d[24],
            inout(reg32) d[25],
            inout(reg32) d[26],
            inout(reg32) d[27],
            inout(reg32) d[28],
            inout(reg32) d[29],
            inout(reg32) d[30],
            inout(reg32) d[31],
            inout(reg32) d[32],
            inout(reg32) d[33],
            inout(reg32) d[34],
            inout(reg32) d[35],
            inout(reg32) d[36],
            inout(reg32) d[37],
            inout(reg32) d[38],
            inout(reg32) d[39],
            inout(reg32) d[40],
            inout(reg32) d[41],
            inout(reg32) d[42],
            inout(reg32) d[43],
            inout(reg32) d[44],
            inout(reg32) d[45],
            inout(reg32) d[46],
            inout(reg32) d[47],
            inout(reg32) d[48],
            inout(reg32) d[49],
            inout(reg32) d[50],
            inout(reg32) d[51],
            inout(reg32) d[52],
            inout(reg32) d[53],
            inout(reg32) d[54],
            inout(reg32) d[55],
            inout(reg32) d[56],
            inout(reg32) d[57],
            inout(reg32) d[58],
            inout(reg32) d[59],
            inout(reg32) d[60],
            inout(reg32) d[61],
            inout(reg32) d[62],
            inout(reg32) d[63],
            inout(reg32) d[64],
            inout(reg32) d[65],
            inout(reg32) d[66],
            inout(reg32) d[67],
            inout(reg32) d[68],
            inout(reg32) d[69],
            inout(reg32) d[70],
            inout(reg32) d[71],
            inout(reg32) d[72],
            inout(reg32) d[73],
            inout(reg32) d[74],
            inout(reg32) d[75],
            inout(reg32) d[76],
            inout(reg32) d[77],
            inout(reg32) d[78],
            inout(reg32) d[79],
            inout(reg32) d[80],
            inout(reg32) d[81],
            inout(reg32) d[82],
            inout(reg32) d[83],
            inout(reg32) d[84],
            inout(reg32) d[85],
            inout(reg32) d[86],
            inout(reg32) d[87],
            inout(reg32) d[88],
            inout(reg32) d[89],
            inout(reg32) d[90],
            inout(reg32) d[91],
            inout(reg32) d[92],
            inout(reg32) d[93],
            inout(reg32) d[94],
            inout(reg32) d[95],
            inout(reg32) d[96],
            inout(reg32) d[97],
            inout(reg32) d[98],
            inout(reg32) d[99],
            inout(reg32) d[100],
            inout(reg32) d[101],
            inout(reg32) d[102],
            inout(reg32) d[103],
            inout(reg32) d[104],
            inout(reg32) d[105],
            inout(reg32) d[106],
            inout(reg32) d[107],
            inout(reg32) d[108],
            inout(reg32) d[109],
            inout(reg32) d[110],
            inout(reg32) d[111],
            inout(reg32) d[112],
            inout(reg32) d[113],
            inout(reg32) d[114],
            inout(reg32) d[115],
            inout(reg32) d[116],
            inout(reg32) d[117],
            inout(reg32) d[118],
            inout(reg32) d[119],
            inout(reg32) d[120],
            inout(reg32) d[121],
            inout(reg32) d[122],
            inout(reg32) d[123],
            inout(reg32) d[124],
            inout(reg32) d[125],
            inout(reg32) d[126],
            inout(reg32) d[127],
            da = in(reg64) a.bits(),
            db = in(reg64) b.bits(),
            sd = in(reg32) scale_d,
            tb = const TRANS_B,
            options(nostack)
        );
    }
}

/// `wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16` (§9.7.15.5.2): `d += A * B` (or
/// `d = A * B` when `scale_d` is 0) for a 64x16 A and a 16x256 B in shared memory, F16
/// inputs, FP32 accumulators `d` (128 per thread, layout in the module docs). A is K-major;
/// `TRANS_B` = 0 for a K-major B, 1 for an MN-major B.
///
/// # Safety
/// Warpgroup-collective (all 128 threads, convergently, with the same descriptors). The
/// descriptors describe shared memory of this CTA holding the operands in the layout they encode,
/// written before the call (TMA completion observed on its mbarrier, or generic writes followed
/// by [`super::bulk::fence_proxy_async_shared`]) and not written until a [`wait_group`] covering
/// this MMA returns. [`fence`] was called since `d` was last written by other instructions.
#[inline(always)]
pub unsafe fn mma_async_m64n256k16_f32_f16<const TRANS_B: u32>(
    d: &mut [f32; 128],
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
            "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}, {8}, {9}, {10}, {11}, {12}, {13}, {14}, {15}, {16}, {17}, {18}, {19}, {20}, {21}, {22}, {23}, {24}, {25}, {26}, {27}, {28}, {29}, {30}, {31}, {32}, {33}, {34}, {35}, {36}, {37}, {38}, {39}, {40}, {41}, {42}, {43}, {44}, {45}, {46}, {47}, {48}, {49}, {50}, {51}, {52}, {53}, {54}, {55}, {56}, {57}, {58}, {59}, {60}, {61}, {62}, {63}, {64}, {65}, {66}, {67}, {68}, {69}, {70}, {71}, {72}, {73}, {74}, {75}, {76}, {77}, {78}, {79}, {80}, {81}, {82}, {83}, {84}, {85}, {86}, {87}, {88}, {89}, {90}, {91}, {92}, {93}, {94}, {95}, {96}, {97}, {98}, {99}, {100}, {101}, {102}, {103}, {104}, {105}, {106}, {107}, {108}, {109}, {110}, {111}, {112}, {113}, {114}, {115}, {116}, {117}, {118}, {119}, {120}, {121}, {122}, {123}, {124}, {125}, {126}, {127}}}, {da}, {db}, p, 1, 1, 0, {tb};",
            "}}",
            inout(reg32) d[0],
            inout(reg32) d[1],
            inout(reg32) d[2],
            inout(reg32) d[3],
            inout(reg32) d[4],
            inout(reg32) d[5],
            inout(reg32) d[6],
            inout(reg32) d[7],
            inout(reg32) d[8],
            inout(reg32) d[9],
            inout(reg32) d[10],
            inout(reg32) d[11],
            inout(reg32) d[12],
            inout(reg32) d[13],
            inout(reg32) d[14],
            inout(reg32) d[15],
            inout(reg32) d[16],
            inout(reg32) d[17],
            inout(reg32) d[18],
            inout(reg32) d[19],
            inout(reg32) d[20],
            inout(reg32) d[21],
            inout(reg32) d[22],
            inout(reg32) d[23],
            inout(reg32) d[24],
            inout(reg32) d[25],
            inout(reg32) d[26],
            inout(reg32) d[27],
            inout(reg32) d[28],
            inout(reg32) d[29],
            inout(reg32) d[30],
            inout(reg32) d[31],
            inout(reg32) d[32],
            inout(reg32) d[33],
            inout(reg32) d[34],
            inout(reg32) d[35],
            inout(reg32) d[36],
            inout(reg32) d[37],
            inout(reg32) d[38],
            inout(reg32) d[39],
            inout(reg32) d[40],
            inout(reg32) d[41],
            inout(reg32) d[42],
            inout(reg32) d[43],
            inout(reg32) d[44],
            inout(reg32) d[45],
            inout(reg32) d[46],
            inout(reg32) d[47],
            inout(reg32) d[48],
            inout(reg32) d[49],
            inout(reg32) d[50],
            inout(reg32) d[51],
            inout(reg32) d[52],
            inout(reg32) d[53],
            inout(reg32) d[54],
            inout(reg32) d[55],
            inout(reg32) d[56],
            inout(reg32) d[57],
            inout(reg32) d[58],
            inout(reg32) d[59],
            inout(reg32) d[60],
            inout(reg32) d[61],
            inout(reg32) d[62],
            inout(reg32) d[63],
            inout(reg32) d[64],
            inout(reg32) d[65],
            inout(reg32) d[66],
            inout(reg32) d[67],
            inout(reg32) d[68],
            inout(reg32) d[69],
            inout(reg32) d[70],
            inout(reg32) d[71],
            inout(reg32) d[72],
            inout(reg32) d[73],
            inout(reg32) d[74],
            inout(reg32) d[75],
            inout(reg32) d[76],
            inout(reg32) d[77],
            inout(reg32) d[78],
            inout(reg32) d[79],
            inout(reg32) d[80],
            inout(reg32) d[81],
            inout(reg32) d[82],
            inout(reg32) d[83],
            inout(reg32) d[84],
            inout(reg32) d[85],
            inout(reg32) d[86],
            inout(reg32) d[87],
            inout(reg32) d[88],
            inout(reg32) d[89],
            inout(reg32) d[90],
            inout(reg32) d[91],
            inout(reg32) d[92],
            inout(reg32) d[93],
            inout(reg32) d[94],
            inout(reg32) d[95],
            inout(reg32) d[96],
            inout(reg32) d[97],
            inout(reg32) d[98],
            inout(reg32) d[99],
            inout(reg32) d[100],
            inout(reg32) d[101],
            inout(reg32) d[102],
            inout(reg32) d[103],
            inout(reg32) d[104],
            inout(reg32) d[105],
            inout(reg32) d[106],
            inout(reg32) d[107],
            inout(reg32) d[108],
            inout(reg32) d[109],
            inout(reg32) d[110],
            inout(reg32) d[111],
            inout(reg32) d[112],
            inout(reg32) d[113],
            inout(reg32) d[114],
            inout(reg32) d[115],
            inout(reg32) d[116],
            inout(reg32) d[117],
            inout(reg32) d[118],
            inout(reg32) d[119],
            inout(reg32) d[120],
            inout(reg32) d[121],
            inout(reg32) d[122],
            inout(reg32) d[123],
            inout(reg32) d[124],
            inout(reg32) d[125],
            inout(reg32) d[126],
            inout(reg32) d[127],
            da = in(reg64) a.bits(),
            db = in(reg64) b.bits(),
            sd = in(reg32) scale_d,
            tb = const TRANS_B,
            options(nostack)
        );
    }
}
