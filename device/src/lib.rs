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
///
/// With `setmaxnreg = [r0, r1, ..]` (one per-thread budget per warpgroup, in warpgroup order,
/// e.g. `[40, 232, 232]` for a producer and two consumers), it also checks at compile time, on
/// every target, that the budgets fit the registers the entry starts with ([`check_setmaxnreg`]):
/// a split that asks for more than the CTA has makes `setmaxnreg.inc` wait forever (a hung GPU,
/// not an error).
///
/// Choosing the budgets: with `.maxntid T` and `.minnctapersm 1` every thread starts with
/// [`entry_registers`]`(T, 1)` registers (168 for 384 threads, 240 for 256), and the CTA's pool
/// is that times `T`. Give the producer warpgroup what its loop needs (24 to 40: it only issues
/// TMA copies; ptxas reports spills if it is too few, and the builder fails on spills), and
/// split the rest among the consumers, each a multiple of 8 and at most 256: for one producer
/// and two consumers, `(168 * 384 - 40 * 128) / 256 = 232` (CUTLASS's and warpline's
/// `tc_gemm`'s 40/232). A consumer holding a 64 x 256 FP32 wgmma accumulator needs 128
/// registers for it alone, so 232 leaves about 100 for addresses and the epilogue.
///
/// ```
/// // One producer and two consumer warpgroups: 40 + 2 x 232 fits 168 x 384.
/// warpline_device::launch_bounds!(my_gemm, 384, 1, setmaxnreg = [40, 232, 232]);
/// ```
///
/// ```compile_fail
/// // 40 + 2 x 240 registers per thread of a warpgroup do not fit: the build fails.
/// warpline_device::launch_bounds!(my_gemm, 384, 1, setmaxnreg = [40, 240, 240]);
/// ```
#[macro_export]
macro_rules! launch_bounds {
    ($entry:ident, $max_threads:expr, $min_ctas:expr, setmaxnreg = [$($regs:expr),+ $(,)?]) => {
        const _: () = $crate::check_setmaxnreg($max_threads, $min_ctas, &[$($regs),+]);
        $crate::launch_bounds!($entry, $max_threads, $min_ctas);
    };
    ($entry:ident, $max_threads:expr, $min_ctas:expr) => {
        #[cfg(target_arch = "nvptx64")]
        const _: () = {
            #[used]
            #[unsafe(export_name = concat!("warpline_launch_bounds__", stringify!($entry)))]
            static BOUNDS: [u32; 2] = [$max_threads, $min_ctas];
        };
    };
}

/// Registers per SM (and the most one CTA may hold) on sm_90.
pub const REGISTERS_PER_SM: u32 = 65536;

/// Registers per thread that ptxas gives an entry with `.maxntid max_threads` and
/// `.minnctapersm min_ctas` when it uses `setmaxnreg` (ptxas then allocates the most the bounds
/// allow): `REGISTERS_PER_SM / (warps * 32 * min_ctas)` rounded down to the allocation unit of
/// 8, at most 255 (CUDA C++ Programming Guide, "Compute Capabilities", table of technical
/// specifications: 64 K registers per SM, 255 per thread).
pub const fn entry_registers(max_threads: u32, min_ctas: u32) -> u32 {
    assert!(
        max_threads >= 1 && max_threads <= 1024,
        "max_threads out of 1..=1024"
    );
    assert!(min_ctas >= 1, "min_ctas must be at least 1");
    let threads = max_threads.div_ceil(WARP_SIZE) * WARP_SIZE;
    let per_thread = REGISTERS_PER_SM / (threads * min_ctas) / 8 * 8;
    if per_thread > 255 {
        255
    } else {
        per_thread
    }
}

/// Compile-time check of a `setmaxnreg` split (PTX ISA 8.3 §9.7.17.1), one per-thread budget per
/// warpgroup of a CTA of `max_threads` threads (128 each) launched with launch bounds
/// `(max_threads, min_ctas)`: each budget is 24..=256 and a multiple of 8, there is one per
/// warpgroup, and together they fit the CTA's pool, `entry_registers(max_threads, min_ctas)`
/// (rounded up to the allocation unit) times `max_threads`. Panics (in a `const`: fails the
/// build) otherwise. [`launch_bounds!`] with `setmaxnreg = [..]` calls it.
pub const fn check_setmaxnreg(max_threads: u32, min_ctas: u32, budgets: &[u32]) {
    assert!(
        max_threads.is_multiple_of(128),
        "setmaxnreg needs whole warpgroups: max_threads must be a multiple of 128"
    );
    assert!(
        budgets.len() as u32 * 128 == max_threads,
        "setmaxnreg: give one budget per warpgroup (max_threads / 128 of them)"
    );
    let entry = entry_registers(max_threads, min_ctas);
    let pool = entry.div_ceil(8) * 8 * max_threads;
    let mut sum = 0u32;
    let mut i = 0;
    while i < budgets.len() {
        let r = budgets[i];
        assert!(
            r >= 24 && r <= 256 && r.is_multiple_of(8),
            "setmaxnreg budget out of 24..=256 or not a multiple of 8"
        );
        sum += r * 128;
        i += 1;
    }
    assert!(
        sum <= pool,
        "setmaxnreg budgets ask for more registers than the CTA starts with: setmaxnreg.inc would wait forever"
    );
}

#[cfg(all(target_arch = "nvptx64", feature = "panic-handler"))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // A device panic traps the kernel; the host sees CUDA_ERROR_LAUNCH_FAILED.
    // SAFETY: `trap` aborts the kernel; it has no preconditions.
    unsafe { core::arch::nvptx::trap() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_registers_follow_the_launch_bounds() {
        assert_eq!(entry_registers(384, 1), 168);
        assert_eq!(entry_registers(256, 1), 255);
        assert_eq!(entry_registers(512, 1), 128);
        assert_eq!(entry_registers(128, 2), 255);
        assert_eq!(entry_registers(1024, 1), 64);
        // 300 threads launch as 10 warps.
        assert_eq!(entry_registers(300, 1), 200);
    }

    #[test]
    fn setmaxnreg_splits_that_fit_pass() {
        check_setmaxnreg(384, 1, &[40, 232, 232]);
        check_setmaxnreg(384, 1, &[24, 240, 240]);
        check_setmaxnreg(256, 1, &[24, 256]);
        check_setmaxnreg(512, 1, &[56, 152, 152, 152]);
    }

    #[test]
    #[should_panic(expected = "more registers than the CTA starts with")]
    fn setmaxnreg_split_over_the_pool_is_refused() {
        check_setmaxnreg(384, 1, &[40, 240, 240]);
    }

    #[test]
    #[should_panic(expected = "one budget per warpgroup")]
    fn setmaxnreg_needs_one_budget_per_warpgroup() {
        check_setmaxnreg(384, 1, &[40, 232]);
    }

    #[test]
    #[should_panic(expected = "multiple of 8")]
    fn setmaxnreg_budget_must_be_a_multiple_of_8() {
        check_setmaxnreg(256, 1, &[100, 100]);
    }
}
