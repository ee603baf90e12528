//! Warp-level tensor-core MMA (`mma.sync`, sm_80+, so usable in the sm_90 module) and the
//! 16-byte read-only global loads the memory-bound decode GEMM streams its weights with.
//!
//! PTX ISA 8.0 references: §9.7.13.4.8 "Matrix Fragments for `mma.m16n8k16` with floating point
//! type" (the fragment layouts below; §9.7.14.5.8 in later ISA versions), §9.7.13.4 `mma` (the
//! instruction), §9.7.9.8 `ld` with the `.nc` (non-coherent, read-only) qualifier and the
//! `.L1::no_allocate` eviction priority.
//!
//! Fragment layout of `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` for lane
//! `l`, with `g = l / 4` (groupID) and `t = l % 4` (thread in group); each `u32` holds two 16-bit
//! elements, the lower-numbered column (A) / row (B) in the low half:
//! - A (16 x 16, row-major): `a[0]` = row `g`, cols `2t, 2t+1`; `a[1]` = row `g+8`, cols `2t,
//!   2t+1`; `a[2]` = row `g`, cols `2t+8, 2t+9`; `a[3]` = row `g+8`, cols `2t+8, 2t+9`;
//! - B (16 x 8, "col": K contiguous per column): `b[0]` = rows `2t, 2t+1` of column `g`; `b[1]` =
//!   rows `2t+8, 2t+9` of column `g`;
//! - C/D (16 x 8, f32): `d[0], d[1]` = row `g`, cols `2t, 2t+1`; `d[2], d[3]` = row `g+8`, cols
//!   `2t, 2t+1`.

use core::arch::asm;

/// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`: `d = A * B + c` on one warp, fragments
/// as in the module documentation. All 32 lanes of the warp must execute it together
/// (`.aligned`), with converged control flow.
#[inline(always)]
pub fn mma_m16n8k16_f32_bf16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let mut d = c;
    // SAFETY: a register-only warp instruction; the caller's warp executes it converged (the
    // function is called from warp-uniform code, see the module documentation).
    unsafe {
        asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) d[0], d1 = inout(reg32) d[1], d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1],
            options(pure, nomem, nostack)
        )
    };
    d
}

/// `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`: as [`mma_m16n8k16_f32_bf16`] for FP16.
#[inline(always)]
pub fn mma_m16n8k16_f32_f16(a: [u32; 4], b: [u32; 2], c: [f32; 4]) -> [f32; 4] {
    let mut d = c;
    // SAFETY: as mma_m16n8k16_f32_bf16.
    unsafe {
        asm!(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}, {a2}, {a3}}}, {{{b0}, {b1}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) d[0], d1 = inout(reg32) d[1], d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
            b0 = in(reg32) b[0], b1 = in(reg32) b[1],
            options(pure, nomem, nostack)
        )
    };
    d
}

/// `mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32` (PTX ISA 8.0 §9.7.13.4.7, fragments of
/// `m16n8k8` with `.bf16`): `d = A * B + c` on one warp. A (16 x 8, row-major): `a[0]` = row `g`,
/// cols `2t, 2t+1`; `a[1]` = row `g+8`, the same cols. B (8 x 8, "col"): `b` = rows `2t, 2t+1` of
/// column `g`. C/D as for `m16n8k16`. The accumulator fragment of an `m16n8k*` product (cols
/// `2t, 2t+1` of rows `g`, `g+8`), packed to bf16 pairs, is exactly this A fragment: how
/// attention feeds the probabilities of `S = Q K^T` into `P V` without shared memory
/// (FlashAttention-2 §3.3). All 32 lanes execute it together, converged.
#[inline(always)]
pub fn mma_m16n8k8_f32_bf16(a: [u32; 2], b: u32, c: [f32; 4]) -> [f32; 4] {
    let mut d = c;
    // SAFETY: a register-only warp instruction; the caller's warp executes it converged.
    unsafe {
        asm!(
            "mma.sync.aligned.m16n8k8.row.col.f32.bf16.bf16.f32 {{{d0}, {d1}, {d2}, {d3}}}, {{{a0}, {a1}}}, {{{b0}}}, {{{d0}, {d1}, {d2}, {d3}}};",
            d0 = inout(reg32) d[0], d1 = inout(reg32) d[1], d2 = inout(reg32) d[2], d3 = inout(reg32) d[3],
            a0 = in(reg32) a[0], a1 = in(reg32) a[1], b0 = in(reg32) b,
            options(pure, nomem, nostack)
        )
    };
    d
}

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16` (PTX ISA 8.0 §9.7.13.4.15): four 8 x 8 matrices of
/// 16-bit elements from shared memory. Lane `8 i + r` gives the shared-window address of row `r`
/// of matrix `i` (16 contiguous bytes, 16-byte aligned); register `i` of lane `l` receives
/// elements `2 (l % 4)` and `2 (l % 4) + 1` of row `l / 4` of matrix `i` (low half first): the B
/// fragment of `mma.m16n8k*` when the matrix rows are B's columns (K contiguous). Rows whose
/// addresses fall in distinct 16-byte bank groups are read in one pass (8 rows of one matrix at a
/// stride of 128 bytes or a multiple collide: swizzle them).
///
/// # Safety
/// Every lane's address is a 16-byte aligned shared-window address of 16 bytes of this CTA's
/// shared memory that no thread writes concurrently; all 32 lanes execute it together, converged.
#[inline(always)]
pub unsafe fn ldmatrix_x4(addr: u32) -> [u32; 4] {
    let r: [u32; 4];
    // SAFETY: the caller's contract above.
    unsafe {
        let (r0, r1, r2, r3): (u32, u32, u32, u32);
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{r0}, {r1}, {r2}, {r3}}}, [{a}];",
            r0 = out(reg32) r0, r1 = out(reg32) r1, r2 = out(reg32) r2, r3 = out(reg32) r3,
            a = in(reg32) addr, options(readonly, nostack)
        );
        r = [r0, r1, r2, r3];
    }
    r
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`: as [`ldmatrix_x4`], each matrix transposed:
/// register `i` of lane `l` receives rows `2 (l % 4)` and `2 (l % 4) + 1` of column `l / 4` of
/// matrix `i` (low half first): the B fragment of `mma.m16n8k8` (or half of `m16n8k16`'s) when
/// the matrix rows are B's rows (N contiguous), as V's rows are in `P V`.
///
/// # Safety
/// As [`ldmatrix_x4`].
#[inline(always)]
pub unsafe fn ldmatrix_x4_trans(addr: u32) -> [u32; 4] {
    let r: [u32; 4];
    // SAFETY: the caller's contract (as ldmatrix_x4).
    unsafe {
        let (r0, r1, r2, r3): (u32, u32, u32, u32);
        asm!(
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{r0}, {r1}, {r2}, {r3}}}, [{a}];",
            r0 = out(reg32) r0, r1 = out(reg32) r1, r2 = out(reg32) r2, r3 = out(reg32) r3,
            a = in(reg32) addr, options(readonly, nostack)
        );
        r = [r0, r1, r2, r3];
    }
    r
}

/// `ld.global.nc.L1::no_allocate.v4.b32`: 16 bytes from global memory through the read-only
/// path without allocating in L1 (data read once: streamed weights).
///
/// # Safety
/// `p` is a 16-byte aligned device address of 16 readable bytes that no thread writes during the
/// kernel (the `.nc` path is not coherent with writes of the same kernel).
#[inline(always)]
pub unsafe fn ld_global_stream_v4(p: *const u32) -> [u32; 4] {
    let (x, y, z, w): (u32, u32, u32, u32);
    // SAFETY: the caller's contract (aligned, readable, read-only for the kernel). Not `pure`:
    // the loads stay in program order relative to the other asm of the kernel, so a kernel
    // issues its next loads before it consumes the previous ones.
    unsafe {
        asm!("ld.global.nc.L1::no_allocate.v4.b32 {{{x}, {y}, {z}, {w}}}, [{p}];",
            x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
            p = in(reg64) p, options(nostack, readonly))
    };
    [x, y, z, w]
}

/// `ld.global.nc.v4.b32`: 16 bytes from global memory through the read-only path, cached in L1
/// (data read by many warps of the SM: the tokens of a decode GEMM).
///
/// # Safety
/// As [`ld_global_stream_v4`].
#[inline(always)]
pub unsafe fn ld_global_nc_v4(p: *const u32) -> [u32; 4] {
    let (x, y, z, w): (u32, u32, u32, u32);
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.global.nc.v4.b32 {{{x}, {y}, {z}, {w}}}, [{p}];",
            x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
            p = in(reg64) p, options(nostack, readonly))
    };
    [x, y, z, w]
}

/// `ld.global.cg.v4.b32`: 16 bytes from global memory cached in L2 only (PTX ISA 8.0 §9.7.9.8,
/// `.cg`): coherent with the writes of earlier kernels, so for data the previous kernel on the
/// stream wrote, read after `griddepcontrol.wait` (under PDL the writer may still run when this
/// kernel starts, so its data is not read-only for this kernel's lifetime and the `.nc` path
/// does not apply).
///
/// # Safety
/// `p` is a 16-byte aligned device address of 16 readable bytes.
#[inline(always)]
pub unsafe fn ld_global_cg_v4(p: *const u32) -> [u32; 4] {
    let (x, y, z, w): (u32, u32, u32, u32);
    // SAFETY: the caller's contract. `readonly`, not `pure`: kept after asm that may write
    // memory (e.g. `griddepcontrol.wait`, which has a memory clobber).
    unsafe {
        asm!("ld.global.cg.v4.b32 {{{x}, {y}, {z}, {w}}}, [{p}];",
            x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
            p = in(reg64) p, options(nostack, readonly))
    };
    [x, y, z, w]
}

/// `ld.global.cg.u16`: one 16-bit element, cached in L2 only, as [`ld_global_cg_v4`] (ragged K
/// tails of data the previous kernel on the stream wrote).
///
/// # Safety
/// `p` is a 2-byte aligned device address of 2 readable bytes.
#[inline(always)]
pub unsafe fn ld_global_cg_u16(p: *const u16) -> u16 {
    let v: u16;
    // SAFETY: the caller's contract. `readonly`, not `pure`, as ld_global_cg_v4.
    unsafe {
        asm!("ld.global.cg.u16 {v}, [{p}];", v = out(reg16) v, p = in(reg64) p,
            options(nostack, readonly))
    };
    v
}

/// `ld.global.nc.u16`: one 16-bit element through the read-only path (ragged K tails).
///
/// # Safety
/// `p` is a 2-byte aligned device address of 2 readable bytes, read-only for the kernel.
#[inline(always)]
pub unsafe fn ld_global_nc_u16(p: *const u16) -> u16 {
    let v: u16;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("ld.global.nc.u16 {v}, [{p}];", v = out(reg16) v, p = in(reg64) p,
            options(nostack, readonly))
    };
    v
}

/// `ld.global.nc.L1::no_allocate.L2::256B.v4.b32`: as [`ld_global_stream_v4`], with the hint that
/// L2 fetch the whole 256-byte aligned block holding the address (PTX ISA 8.0 §9.7.9.8,
/// `.level::prefetch_size`): a streamed weight row is then read from DRAM in 256-byte pieces
/// even when one instruction asks for 64 bytes of it. The hint never faults and never changes
/// the loaded value.
///
/// # Safety
/// As [`ld_global_stream_v4`].
#[inline(always)]
pub unsafe fn ld_global_stream_v4_l2_256(p: *const u32) -> [u32; 4] {
    let (x, y, z, w): (u32, u32, u32, u32);
    // SAFETY: the caller's contract (aligned, readable, read-only for the kernel).
    unsafe {
        asm!("ld.global.nc.L1::no_allocate.L2::256B.v4.b32 {{{x}, {y}, {z}, {w}}}, [{p}];",
            x = out(reg32) x, y = out(reg32) y, z = out(reg32) z, w = out(reg32) w,
            p = in(reg64) p, options(nostack, readonly))
    };
    [x, y, z, w]
}
