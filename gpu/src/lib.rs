//! warpline's kernel crate.
//!
//! Built twice from one source:
//! - for `nvptx64-nvidia-cuda` (sm_90, PTX ISA 8.0) by `cargo xtask build-ptx`: the kernels in
//!   `kernels`, built on the device library `warpline-device` (re-exported as `device`, with its
//!   panic handler), emitted as one PTX module;
//! - for the host as an ordinary rlib that exposes [`contract`] only, so the host launchers and the
//!   kernels read the same tile sizes, warp roles and shared-memory layout.
#![cfg_attr(target_arch = "nvptx64", no_std)]
// Device code is linted on its own build (`cargo xtask clippy-ptx`, part of `cargo xtask test`):
// every unsafe operation in its own documented block, every public item documented.
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch)
)]

pub mod contract;

/// The device library (crate `warpline-device`), which warpline's kernels use like any user's.
#[cfg(target_arch = "nvptx64")]
pub use warpline_device as device;

warpline_device::kernel_module!();
#[cfg(target_arch = "nvptx64")]
mod kernels;
