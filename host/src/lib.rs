//! # warpline
//!
//! Host side of warpline: opens a Hopper GPU through the CUDA driver API (via `cudarc`), loads the
//! PTX module built from `gpu/` by `cargo xtask build-ptx`, and launches its kernels with typed,
//! validated arguments; schedules batches over non-blocking streams with stream-ordered allocation.
//!
//! Rooms: [`device`] (context, module, capabilities), [`module`] (your own PTX modules and
//! typed kernel handles), [`launch`] (cuLaunchKernelEx configurations),
//! [`memory`] (memory pools, stream-bound device buffers, pinned host buffers), [`stream`] (streams
//! and events), [`kernels`] (one typed launcher per kernel), [`pipeline`] (the multi-stream batch
//! pipeline), [`bandwidth`] (reference copy measurements), [`reference`](mod@reference) (CPU references), [`npy`].

pub mod bandwidth;
pub mod chain;
mod context;
mod contract_check;
pub mod decode;
pub mod device;
pub(crate) mod driver;
pub mod error;
pub mod fp8;
pub mod fuzz;
pub mod interop;
pub mod kernels;
pub mod launch;
mod loaded;
pub mod memory;
pub mod module;
pub mod multi;
pub mod npy;
pub mod ordering;
pub mod pipeline;
mod ptx;
mod reaper;
pub mod reference;
pub mod rng;
pub mod stream;
pub mod tensor_map;
pub mod trace;

pub use chain::{Chain, Graph, KernelArg};
pub use device::{Capabilities, Device};
pub use error::{Error, Result};
/// BF16 and FP16 host element types (the `half` crate), for the tensor-core GEMM's inputs.
pub use fp8::{F8E4M3, F8E5M2};
pub use half::{bf16, f16};
pub use memory::{DeviceBuffer, DeviceView, DeviceViewMut, MemPool, PinnedBuffer};
pub use module::{Module, TypedKernel};
pub use ordering::{synchronize_timeout, Cmp, Fence, OnTimeout, Signal, TaskGraph};
pub use pipeline::{BatchPipeline, BatchTiming, PipelineReport};
pub use stream::{Event, Stream};
pub use tensor_map::{TensorMap, TensorMapDesc, TensorMapTable};

/// The PTX module built from `gpu/` (sm_90, PTX ISA 8.0), embedded at build time.
pub const PTX: &str = include_str!(env!("WARPLINE_PTX_PATH"));

/// The sm_90a module built from `gpu/` with its feature `sm90a` (PTX ISA 8.3): the tensor-core
/// kernels (wgmma, TMA tensor copies, setmaxnreg), which only compute capability 9.0 runs.
/// Loaded on first use by the tensor-core GEMM.
pub const SM90A_PTX: &str = include_str!(env!("WARPLINE_SM90A_PTX_PATH"));
