//! # warpline-device
//!
//! A small device library for Hopper (sm_90) kernels written in Rust and compiled for
//! `nvptx64-nvidia-cuda`, named the way CUDA programmers expect (after Rust-CUDA's `cuda_std` and
//! CUDA C++): thread and warp indices, shared memory addressed by 32-bit shared-window addresses,
//! `cp.async`, `mbarrier`, a stage/phase pipeline, clusters and DSMEM, the bulk copy engine, PDL.
//!
//! Every function is a thin wrapper over one PTX instruction (PTX ISA 8.0; the section is named in
//! its docs). The `unsafe` ones take raw shared or global addresses, or need convergent execution,
//! and their `# Safety` sections say what the caller guarantees.
//!
//! [`roles`] is the skeleton of a warp-specialized kernel (after ThunderKittens' `lcsf`
//! template): a struct of role hooks, with the stage rings, their barriers and the role dispatch
//! owned by [`roles::run`].
//!
//! The crate has no kernels. A kernel crate depends on it, enables the `panic-handler` feature (or
//! defines its own `#[panic_handler]`), and is built to PTX by `warpline`'s builder or
//! `cargo xtask build-ptx`. On the host the instruction wrappers are compiled out; the constants
//! below are available everywhere. `cargo doc` on the host documents the device-only modules too
//! (they are also compiled under `cfg(doc)`, where rustdoc does not type-check function bodies,
//! so the nvptx inline assembly and intrinsics in them need no host stand-ins).
#![cfg_attr(target_arch = "nvptx64", no_std)]
// Device code is linted on its own build (`cargo xtask clippy-ptx`, part of `cargo xtask test`):
// every unsafe operation in its own documented block, every public item documented.
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]
#![cfg_attr(target_arch = "nvptx64", feature(stdarch_nvptx, asm_experimental_arch))]

/// Threads per warp.
pub const WARP_SIZE: u32 = 32;
/// Bytes of one `mbarrier` object in shared memory (PTX ISA §9.7.13.15: 8 bytes, 8-byte aligned).
pub const MBARRIER_BYTES: usize = 8;

#[cfg(any(target_arch = "nvptx64", doc))]
pub mod bulk;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod clock;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod cluster;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod cp_async;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod math;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod mbarrier;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod mma;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod pdl;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod pipeline;
pub mod roles;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod signal;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod smem;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod thread;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod tma;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod warp;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod warpgroup;
#[cfg(any(target_arch = "nvptx64", doc))]
pub mod wgmma;

/// Declares, in the invoking kernel crate, the module-scope PTX the device library needs: the
/// dynamic shared-memory window `warpline_dyn_smem` (`.extern .shared .align 128`, PTX ISA
/// §5.1.5) that [`smem::dynamic_smem_base`] addresses. Invoke it once at the root of every kernel
/// crate (module-level assembly of a dependency does not survive the LTO build that emits PTX).
#[macro_export]
macro_rules! kernel_module {
    () => {
        #[cfg(target_arch = "nvptx64")]
        ::core::arch::global_asm!(".extern .shared .align 128 .b8 warpline_dyn_smem[];");
    };
}

/// Declares launch bounds for kernel entry `$entry`: at most `$max_threads` threads per CTA and at
/// least `$min_ctas` CTAs per SM. rustc emits no launch bounds, so this puts a marker global
/// `warpline_launch_bounds__<entry>` (two little-endian u32) in the module, and
/// `warpline-builder` turns it into `.maxntid $max_threads, 1, 1` and `.minnctapersm $min_ctas`
/// on the entry (PTX ISA §11.4). Kernels that use `setmaxnreg` need it: without bounds ptxas
/// cannot tell the register count at entry and ignores `setmaxnreg` (warning C7508).
#[macro_export]
macro_rules! launch_bounds {
    ($entry:ident, $max_threads:expr, $min_ctas:expr) => {
        #[cfg(target_arch = "nvptx64")]
        const _: () = {
            #[used]
            #[unsafe(export_name = concat!("warpline_launch_bounds__", stringify!($entry)))]
            static BOUNDS: [u32; 2] = [$max_threads, $min_ctas];
        };
    };
}

#[cfg(all(target_arch = "nvptx64", feature = "panic-handler"))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // A device panic traps the kernel; the host sees CUDA_ERROR_LAUNCH_FAILED.
    // SAFETY: `trap` aborts the kernel; it has no preconditions.
    unsafe { core::arch::nvptx::trap() }
}
