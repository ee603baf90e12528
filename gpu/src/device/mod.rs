//! A small device library named the way CUDA programmers expect (after Rust-CUDA's `cuda_std` and
//! CUDA C++): thread and warp indices, shared memory addressed by 32-bit shared-window addresses,
//! `cp.async`, `mbarrier`, a stage/phase pipeline, clusters and DSMEM, the bulk copy engine, PDL.
//!
//! Every function is a thin wrapper over one PTX instruction (PTX ISA 8.0 section named in its docs);
//! the `unsafe` ones take raw shared or global addresses whose validity the caller guarantees.

pub mod bulk;
pub mod clock;
pub mod cluster;
pub mod cp_async;
pub mod mbarrier;
pub mod pdl;
pub mod pipeline;
pub mod signal;
pub mod smem;
pub mod thread;
pub mod warp;
