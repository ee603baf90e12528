//! The kernels of the PTX module. Each file is one kernel (or one family), its roles as separate
//! functions so the kernel body reads like its role diagram.

//!
//! The crate is built into two modules: without feature `sm90a` (sm_90, every kernel below but
//! the tensor-core ones) and with it (sm_90a: `tc_gemm` and `batched_gemm`, which need wgmma and
//! setmaxnreg, and the instruction checks of `device_check`).

#[cfg(feature = "sm90a")]
mod attention;
#[cfg(feature = "sm90a")]
mod batched_gemm;
#[cfg(not(feature = "sm90a"))]
mod decode_gemm;
#[cfg(not(feature = "sm90a"))]
mod decode_step;
#[cfg(feature = "sm90a")]
mod device_check;
#[cfg(not(feature = "sm90a"))]
mod gemm;
#[cfg(not(feature = "sm90a"))]
mod pdl;
mod qkv_store;
#[cfg(not(feature = "sm90a"))]
mod signal;
#[cfg(feature = "sm90a")]
mod swap_ab_gemm;
#[cfg(feature = "sm90a")]
mod tc_gemm;
#[cfg(not(feature = "sm90a"))]
mod vector_add;
