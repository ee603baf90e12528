//! Driver wrapper: `cuTensorMapEncodeTiled` (CUDA driver API, "Tensor Map Object Management"),
//! which cudarc exposes only in `cudarc::driver::sys`. It only encodes a 128-byte descriptor on
//! the host (no device work, no context needed), and names itself in its error.

use cudarc::driver::sys;

use crate::error::{CudaCall, Result};

/// The arguments of one `cuTensorMapEncodeTiled` call, already validated by
/// [`crate::tensor_map::TensorMapDesc::validate`]. Slices are innermost dimension first; `dims`,
/// `box_dims` and `element_strides` have `rank` entries, `strides` `rank - 1` (bytes, dimension 1
/// upward).
pub(crate) struct EncodeTiled<'a> {
    pub(crate) dtype: sys::CUtensorMapDataType,
    pub(crate) rank: u32,
    pub(crate) global_address: u64,
    pub(crate) dims: &'a [u64],
    pub(crate) strides: &'a [u64],
    pub(crate) box_dims: &'a [u32],
    pub(crate) element_strides: &'a [u32],
    pub(crate) interleave: sys::CUtensorMapInterleave,
    pub(crate) swizzle: sys::CUtensorMapSwizzle,
    pub(crate) l2_promotion: sys::CUtensorMapL2promotion,
    pub(crate) oob_fill: sys::CUtensorMapFloatOOBfill,
}

/// `cuTensorMapEncodeTiled`: the 128-byte `CUtensorMap` for `args`.
///
/// The driver reads the slices only during the call and keeps no pointer; the global address is
/// recorded in the descriptor, not dereferenced. Errors: [`crate::Error::Cuda`] naming the call
/// (`CUDA_ERROR_INVALID_VALUE` for arguments the driver rejects).
pub(crate) fn encode_tiled(args: &EncodeTiled<'_>) -> Result<sys::CUtensorMap> {
    let rank = args.rank as usize;
    // The slices must hold what the driver reads (the validation guarantees it; checked again
    // here because the driver would read out of bounds otherwise).
    if !((1..=5).contains(&rank)
        && args.dims.len() == rank
        && args.box_dims.len() == rank
        && args.element_strides.len() == rank
        && args.strides.len() + 1 == rank)
    {
        return Err(crate::Error::TensorMap {
            rule: crate::error::TensorMapRule::Rank,
            detail: format!(
                "rank {rank} with {} dims, {} strides, {} box dims, {} element strides; allowed: rank 1 to 5 with rank values each (rank - 1 strides)",
                args.dims.len(),
                args.strides.len(),
                args.box_dims.len(),
                args.element_strides.len()
            ),
        });
    }
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: `map` is a writable, correctly aligned CUtensorMap; the slices hold `rank`
    // (`rank - 1` for the strides) readable values (asserted above) and outlive the call; the
    // driver does not keep the pointers. The global address is only recorded.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            args.dtype,
            args.rank,
            args.global_address as *mut std::ffi::c_void,
            args.dims.as_ptr(),
            args.strides.as_ptr(),
            args.box_dims.as_ptr(),
            args.element_strides.as_ptr(),
            args.interleave,
            args.swizzle,
            args.l2_promotion,
            args.oob_fill,
        )
    }
    .call("cuTensorMapEncodeTiled")?;
    Ok(map)
}
