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

/// FNV-1a 64 of the bytes of `src/contract.rs` this crate was compiled with (computed by
/// `build.rs`). The host compares its own value with the one in the PTX module
/// (`warpline_contract_hash`), so a module built from another contract is refused.
pub const CONTRACT_HASH: u64 = parse_u64(env!("WARPLINE_CONTRACT_HASH"));

/// [`CONTRACT_HASH`] in the PTX module, as `.visible .global .align 8 .b8
/// warpline_contract_hash[8] = {...}` (little-endian bytes); `#[used]` keeps it through fat LTO.
#[cfg(target_arch = "nvptx64")]
#[used]
#[unsafe(export_name = "warpline_contract_hash")]
pub static WARPLINE_CONTRACT_HASH: u64 = CONTRACT_HASH;

/// A decimal `u64` at compile time (the build script writes the hash in decimal).
const fn parse_u64(s: &str) -> u64 {
    let b = s.as_bytes();
    let mut i = 0;
    let mut v: u64 = 0;
    while i < b.len() {
        assert!(
            b[i].is_ascii_digit(),
            "WARPLINE_CONTRACT_HASH is not decimal"
        );
        v = v * 10 + (b[i] - b'0') as u64;
        i += 1;
    }
    v
}

/// The device library (crate `warpline-device`), which warpline's kernels use like any user's.
#[cfg(target_arch = "nvptx64")]
pub use warpline_device as device;

warpline_device::kernel_module!();
#[cfg(target_arch = "nvptx64")]
mod kernels;
