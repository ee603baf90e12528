//! The kernels of the PTX module. Each file is one kernel (or one family), its roles as separate
//! functions so the kernel body reads like its role diagram.

mod gemm;
mod pdl;
mod signal;
mod vector_add;
