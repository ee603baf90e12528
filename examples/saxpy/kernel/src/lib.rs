//! saxpy: `y = a * x + y` over `n` f32, grid-stride, any `n` and any grid.
//!
//! The smallest warpline kernel crate: copy this folder to start your own.
#![cfg_attr(target_arch = "nvptx64", no_std)]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, asm_experimental_arch))]
#![deny(unsafe_op_in_unsafe_fn, missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks, clippy::missing_safety_doc)]

// Module-scope PTX the device library needs (the dynamic shared-memory window); once per crate.
warpline_device::kernel_module!();

/// Threads per CTA the host launches with (any block size works; this one is the example's).
pub const THREADS_PER_CTA: u32 = 256;

#[cfg(target_arch = "nvptx64")]
mod kernels {
    use warpline_device::math::fma;
    use warpline_device::thread::{block_dim_x, block_idx_x, grid_dim_x, thread_idx_x};

    /// `y[i] = a * x[i] + y[i]` for `i < n` (one `fma.rn.f32` per element: a single rounding).
    ///
    /// Launch: any grid and block size (grid-stride loop).
    ///
    /// # Safety
    /// `x` points to `n` readable f32 and `y` to `n` writable f32 in device memory, 4-byte
    /// aligned; `y` does not overlap `x` (the host's typed launch checks lengths and streams, the
    /// caller vouches for this contract in its `unsafe` block).
    #[unsafe(no_mangle)]
    pub unsafe extern "ptx-kernel" fn saxpy(x: *const f32, y: *mut f32, a: f32, n: u32) {
        let stride = block_dim_x() * grid_dim_x();
        let mut i = block_idx_x() * block_dim_x() + thread_idx_x();
        while i < n {
            // SAFETY: i < n, inside both arrays (launch contract); each i is visited by one thread.
            unsafe {
                let yi = y.add(i as usize);
                *yi = fma(a, *x.add(i as usize), *yi);
            }
            i = match i.checked_add(stride) {
                Some(next) => next,
                None => break,
            };
        }
    }
}
