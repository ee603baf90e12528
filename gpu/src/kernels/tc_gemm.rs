//! Tensor-core GEMM (sm_90a): see `contract::tc_gemm`.
