//! Launcher of `ws_vector_add` (gpu/src/kernels/vector_add.rs).

use warpline_gpu::contract::vector_add as contract;

use super::{check_grid, check_input, check_output};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::launch::{launch_raw, LaunchConfig};
use crate::memory::{DeviceView, DeviceViewMut};
use crate::params;
use crate::stream::Stream;

/// Largest `n`: tile indices must fit in 32 bits.
pub const MAX_ELEMS: u64 = (u32::MAX as u64) * contract::TILE_ELEMS as u64;

/// Grid of the persistent kernel for `n` elements: one CTA per tile up to `CTAS_PER_SM` per SM.
pub fn grid_for(dev: &Device, n: usize) -> u32 {
    let tiles = n.div_ceil(contract::TILE_ELEMS) as u64;
    let resident = (contract::CTAS_PER_SM * dev.capabilities().sm_count) as u64;
    tiles.min(resident).max(1) as u32
}

/// Queues `c = a + b` (f32, element-wise) on `stream` with the warp-specialized, double-buffered
/// kernel `ws_vector_add`.
///
/// Shapes: `a`, `b`, `c` of equal length `n >= 1` (any `n`, ragged last tile included), at most
/// [`MAX_ELEMS`]. Alignment: 16 bytes for all three (the kernel moves 16-byte vectors). Streams:
/// all three views must belong to buffers bound to `stream`.
///
/// Errors, all before launch: [`Error::LengthMismatch`], [`Error::Empty`], [`Error::TooLarge`],
/// [`Error::Misaligned`], [`Error::WrongStream`]; a failing launch gives [`Error::Launch`] ([`Error::ContextPoisoned`] after a sticky error).
pub fn vector_add(
    dev: &Device,
    stream: &Stream,
    a: DeviceView<'_, f32>,
    b: DeviceView<'_, f32>,
    c: DeviceViewMut<'_, f32>,
) -> Result<()> {
    let grid = grid_for(dev, a.len());
    vector_add_with_grid(dev, stream, a, b, c, grid)
}

/// [`vector_add`] with an explicit persistent grid of `grid` CTAs (1 to 2^31 - 1): any grid size is
/// correct; [`grid_for`] is the fast one. For tests and tuning.
pub fn vector_add_with_grid(
    dev: &Device,
    stream: &Stream,
    a: DeviceView<'_, f32>,
    b: DeviceView<'_, f32>,
    c: DeviceViewMut<'_, f32>,
    grid: u32,
) -> Result<()> {
    check_grid("vector_add grid", grid)?;
    let n = a.len();
    if b.len() != n || c.len() != n {
        return Err(Error::LengthMismatch {
            what: "vector_add",
            detail: format!(
                "a has {n} elements, b {}, c {}; all must be equal",
                b.len(),
                c.len()
            ),
        });
    }
    if n == 0 {
        return Err(Error::Empty { what: "vector_add" });
    }
    if n as u64 > MAX_ELEMS {
        return Err(Error::TooLarge {
            what: "vector_add elements",
            value: n as u64,
            max: MAX_ELEMS,
        });
    }
    check_input("vector_add input a", &a, stream, 16)?;
    check_input("vector_add input b", &b, stream, 16)?;
    check_output("vector_add output c", &c, stream, 16)?;
    let cfg = LaunchConfig::linear(grid, contract::THREADS_PER_CTA, contract::SMEM_BYTES as u32);
    cfg.validate(dev, contract::KERNEL)?;
    let kernel = dev.kernel(contract::KERNEL)?;
    let (pa, pb, pc, n64) = (a.device_ptr(), b.device_ptr(), c.device_ptr(), n as u64);
    // SAFETY: parameters match `ws_vector_add(*const f32, *const f32, *mut f32, u64)`; the views are
    // live allocations of n floats, 16-byte aligned, bound to `stream` (checked above); `c` is a
    // mutable view, so it cannot alias `a` or `b` (distinct borrows of distinct buffers or ranges).
    unsafe { launch_raw(dev, kernel, stream, &cfg, &mut params![pa, pb, pc, n64]) }
}
