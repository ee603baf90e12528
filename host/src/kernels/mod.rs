//! Typed launchers, one module per kernel family. Each validates its arguments (lengths, zero
//! sizes, alignment, streams, sizes the kernel can index) before anything is launched.

/// Attention forward (sm_90a, FlashAttention-3 style; issue 23) and its CPU references.
pub mod attention;
pub mod batched_gemm;
/// The memory-bound decode GEMM (sm_90; M <= 64 tokens, BF16/FP16 weights; issue 20).
pub mod decode_gemm;
mod gemm;
mod operands;
pub mod pdl;
/// Signal kernels and ordering probes (raw device addresses; `unsafe`).
pub mod signal;
/// The tensor-core GEMM (sm_90a; BF16/FP16 in, FP32 accumulate) and its cuBLAS reference.
pub mod tc_gemm;
mod vector_add;

pub use vector_add::{
    grid_for as vector_add_grid, vector_add, vector_add_variant, vector_add_variant_with_grid,
    vector_add_with_grid, Variant as VectorAddVariant, MAX_ELEMS as VECTOR_ADD_MAX_ELEMS,
};

pub use decode_gemm::{DecodeConfig, DecodeGemm, DecodeGemmOptions, DecodePlan, GemmConfig};
pub use gemm::{
    check_gemm_cluster_size, check_gemm_shapes, cluster_tile_gemm, cluster_tile_gemm_with_grid,
    gemm_cluster_grid, gemm_cluster_sizes_that_fit, gemm_max_active_clusters, tile_gemm,
    tile_gemm_with_grid, CublasSgemm,
};
pub use tc_gemm::{
    BLayout, CublasGemmEx, GemmShape, Matrix, MatrixMut, Raster, TcGemm, TcGemmOptions, TcGemmPlan,
};
pub use tc_gemm::{CublasLtFp8, CublasLtFp8Plan, Fp8Input, Fp8Scales};

use crate::error::{Error, Result};
use crate::memory::{DeviceView, DeviceViewMut};
use crate::stream::Stream;

// The table of the kernels the host launches is pure data of the launch contract: it lives with
// the contract check, below `device` (whose `open` reads it), and is re-exported here.
pub use crate::contract_check::{KernelSpec, KERNEL_SPECS};

pub(crate) fn check_aligned(what: &'static str, addr: u64, align: u64) -> Result<()> {
    if !addr.is_multiple_of(align) {
        return Err(Error::Misaligned { what, addr, align });
    }
    Ok(())
}

pub(crate) fn check_stream(
    what: &'static str,
    view_stream: &Stream,
    stream: &Stream,
) -> Result<()> {
    if view_stream != stream {
        return Err(Error::WrongStream { what });
    }
    Ok(())
}

/// Input view helper: stream and alignment checks in one place.
/// Largest grid along x a launch may use: `gridDim.x <= 2^31 - 1`.
pub const MAX_GRID: u32 = i32::MAX as u32;

/// [`Error::BadShape`] unless `1 <= grid <= MAX_GRID` CTAs.
pub(crate) fn check_grid(what: &'static str, grid: u32) -> Result<()> {
    if grid == 0 || grid > MAX_GRID {
        return Err(Error::BadShape {
            what,
            detail: format!("{grid} CTAs; 1 to 2^31 - 1 are allowed"),
        });
    }
    Ok(())
}

pub(crate) fn check_input<T>(
    what: &'static str,
    v: &DeviceView<'_, T>,
    stream: &Stream,
    align: u64,
) -> Result<()> {
    check_stream(what, v.stream(), stream)?;
    check_aligned(what, v.device_ptr(), align)
}

/// Output view helper: stream and alignment checks in one place.
pub(crate) fn check_output<T>(
    what: &'static str,
    v: &DeviceViewMut<'_, T>,
    stream: &Stream,
    align: u64,
) -> Result<()> {
    check_stream(what, v.stream(), stream)?;
    check_aligned(what, v.device_ptr(), align)
}
