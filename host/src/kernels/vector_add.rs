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

/// The default grid of `ws_vector_add` for `n` elements: one CTA per `TILES_PER_CTA` tiles
/// (`ceil(n / (TILE_ELEMS x TILES_PER_CTA))`, at least 1, at most 2^31 - 1), not the persistent
/// `CTAS_PER_SM x SMs`: each CTA fills its ring once and the block scheduler balances the rest
/// (contract `vector_add::TILES_PER_CTA` has the measurement).
pub fn grid_for(n: usize) -> u32 {
    let tiles = n.div_ceil(contract::TILE_ELEMS) as u64;
    tiles
        .div_ceil(contract::TILES_PER_CTA as u64)
        .clamp(1, super::MAX_GRID as u64) as u32
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
    let grid = grid_for(a.len());
    vector_add_with_grid(dev, stream, a, b, c, grid)
}

/// [`vector_add`] with an explicit grid of `grid` CTAs (1 to 2^31 - 1; CTA `b` takes tiles
/// `b, b + grid, ...`): any grid size is correct; [`grid_for`] is the fast one,
/// `CTAS_PER_SM x SMs` the persistent one ([`Variant::WarpSpecializedPersistent`]). For tests
/// and tuning.
pub fn vector_add_with_grid(
    dev: &Device,
    stream: &Stream,
    a: DeviceView<'_, f32>,
    b: DeviceView<'_, f32>,
    c: DeviceViewMut<'_, f32>,
    grid: u32,
) -> Result<()> {
    launch(dev, stream, Variant::WarpSpecialized, a, b, c, grid)
}

/// Validates and queues `variant` on `grid` CTAs (the checks and errors of
/// [`vector_add_with_grid`]).
fn launch(
    dev: &Device,
    stream: &Stream,
    variant: Variant,
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
    if n as u64 > variant.max_elems() {
        return Err(Error::TooLarge {
            what: "vector_add elements",
            value: n as u64,
            max: variant.max_elems(),
        });
    }
    check_input("vector_add input a", &a, stream, 16)?;
    check_input("vector_add input b", &b, stream, 16)?;
    check_output("vector_add output c", &c, stream, 16)?;
    let (name, threads, smem) = (variant.kernel(), variant.threads(), variant.smem_bytes());
    let kernel = dev.kernel(name)?;
    // The candidates are not in KERNEL_SPECS: their shared-memory limit is raised here (a no-op
    // for `ws_vector_add`, raised at open).
    kernel.raise_max_dynamic_shared_memory(smem)?;
    let cfg = LaunchConfig::linear(grid, threads, smem as u32);
    cfg.validate(dev, name)?;
    let (pa, pb, pc, n64) = (a.device_ptr(), b.device_ptr(), c.device_ptr(), n as u64);
    // SAFETY: parameters match every variant's entry, `(*const f32, *const f32, *mut f32, u64)`;
    // the launch shape (block, shared memory) is the variant's contract; the views are live
    // allocations of n floats (n at most the variant's tile limit), 16-byte aligned, bound to
    // `stream` (checked above); `c` is a mutable view, so it cannot alias `a` or `b` (distinct
    // borrows of distinct buffers or ranges), and `a`, `b` are shared views nobody writes while
    // the launch is queued on their stream.
    unsafe { launch_raw(dev, kernel, stream, &cfg, &mut params![pa, pb, pc, n64]) }
}

/// The kernels of issue 12 ("speed to close"): `ws_vector_add` and the candidates to measure
/// against it in one run (benches/vector_add.rs). Every variant computes the same `c = a + b`
/// with the same argument checks as [`vector_add`]; only the kernel and launch shape differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// `ws_vector_add`, the default ([`vector_add`]): cp.async loader, compute and storer warps
    /// over shared `[A | B | C]` stages, `TILES_PER_CTA` tiles per CTA ([`grid_for`]).
    WarpSpecialized,
    /// `ws_vector_add` on the persistent grid (`CTAS_PER_SM` CTAs per SM,
    /// each walking its fixed share of the tiles through its ring).
    WarpSpecializedPersistent,
    /// `ws_vector_add_bulk` (contract `vector_add::bulk`): one bulk copy per operand per tile
    /// completing on the stage's mbarrier, compute warps store to global from registers.
    Bulk,
    /// `ws_vector_add_bulk_deep` (contract `vector_add::bulk_deep`): [`Variant::Bulk`] with
    /// 8192-element tiles, 4 compute warps, 1 CTA per SM.
    BulkDeep,
    /// `vector_add_flat` (contract `vector_add::flat`), one CTA per tile.
    Flat,
    /// `vector_add_flat` on a persistent grid of `flat::CTAS_PER_SM` CTAs per SM.
    FlatPersistent,
    /// `vector_add_flat_cs`: [`Variant::Flat`] with streaming (`.cs`) stores, one CTA per tile.
    FlatCs,
    /// `vector_add_flat_v1` (contract `vector_add::flat_v1`), PyTorch-like: 128 threads, one
    /// vector per thread, one CTA per tile.
    FlatV1,
}

impl Variant {
    /// Every variant, the default first.
    pub const ALL: [Variant; 8] = [
        Variant::WarpSpecialized,
        Variant::WarpSpecializedPersistent,
        Variant::Bulk,
        Variant::BulkDeep,
        Variant::Flat,
        Variant::FlatPersistent,
        Variant::FlatCs,
        Variant::FlatV1,
    ];

    /// A short label (the entry name, plus the launch shape where two share an entry).
    pub fn name(self) -> &'static str {
        match self {
            Variant::WarpSpecialized => "ws_vector_add",
            Variant::WarpSpecializedPersistent => "ws_vector_add (persistent)",
            Variant::Bulk => "ws_vector_add_bulk",
            Variant::BulkDeep => "ws_vector_add_bulk_deep",
            Variant::Flat => "vector_add_flat",
            Variant::FlatPersistent => "vector_add_flat (persistent)",
            Variant::FlatCs => "vector_add_flat_cs",
            Variant::FlatV1 => "vector_add_flat_v1",
        }
    }

    /// The entry point in the PTX module.
    pub fn kernel(self) -> &'static str {
        use warpline_gpu::contract::vector_add::{bulk, bulk_deep, flat, flat_v1};
        match self {
            Variant::WarpSpecialized | Variant::WarpSpecializedPersistent => contract::KERNEL,
            Variant::Bulk => bulk::KERNEL,
            Variant::BulkDeep => bulk_deep::KERNEL,
            Variant::Flat | Variant::FlatPersistent => flat::KERNEL,
            Variant::FlatCs => flat::CS_KERNEL,
            Variant::FlatV1 => flat_v1::KERNEL,
        }
    }

    /// Threads per CTA.
    pub fn threads(self) -> u32 {
        use warpline_gpu::contract::vector_add::{bulk, bulk_deep, flat, flat_v1};
        match self {
            Variant::WarpSpecialized | Variant::WarpSpecializedPersistent => {
                contract::THREADS_PER_CTA
            }
            Variant::Bulk => bulk::THREADS_PER_CTA,
            Variant::BulkDeep => bulk_deep::THREADS_PER_CTA,
            Variant::Flat | Variant::FlatPersistent | Variant::FlatCs => flat::THREADS_PER_CTA,
            Variant::FlatV1 => flat_v1::THREADS_PER_CTA,
        }
    }

    /// Dynamic shared memory per CTA, bytes.
    pub fn smem_bytes(self) -> usize {
        use warpline_gpu::contract::vector_add::{bulk, bulk_deep};
        match self {
            Variant::WarpSpecialized | Variant::WarpSpecializedPersistent => contract::SMEM_BYTES,
            Variant::Bulk => bulk::SMEM_BYTES,
            Variant::BulkDeep => bulk_deep::SMEM_BYTES,
            Variant::Flat | Variant::FlatPersistent | Variant::FlatCs | Variant::FlatV1 => 0,
        }
    }

    /// Elements per tile (a CTA's unit of work).
    pub fn tile_elems(self) -> usize {
        use warpline_gpu::contract::vector_add::{bulk, bulk_deep, flat, flat_v1};
        match self {
            Variant::WarpSpecialized | Variant::WarpSpecializedPersistent => contract::TILE_ELEMS,
            Variant::Bulk => bulk::TILE_ELEMS,
            Variant::BulkDeep => bulk_deep::TILE_ELEMS,
            Variant::Flat | Variant::FlatPersistent | Variant::FlatCs => flat::TILE_ELEMS,
            Variant::FlatV1 => flat_v1::TILE_ELEMS,
        }
    }

    /// CTAs per SM of a persistent launch shape; `None` for the others (one CTA per tile, or
    /// for `ws_vector_add`, one per `TILES_PER_CTA` tiles).
    pub fn ctas_per_sm(self) -> Option<u32> {
        use warpline_gpu::contract::vector_add::{bulk, bulk_deep, flat};
        match self {
            Variant::WarpSpecialized => None,
            Variant::WarpSpecializedPersistent => Some(contract::CTAS_PER_SM),
            Variant::Bulk => Some(bulk::CTAS_PER_SM),
            Variant::BulkDeep => Some(bulk_deep::CTAS_PER_SM),
            Variant::FlatPersistent => Some(flat::CTAS_PER_SM),
            Variant::Flat | Variant::FlatCs | Variant::FlatV1 => None,
        }
    }

    /// Largest `n`: the warp-specialized kernels index tiles with 32 bits; the flat ones are
    /// held to the same bound.
    pub fn max_elems(self) -> u64 {
        (u32::MAX as u64) * self.tile_elems() as u64
    }

    /// The variant's grid for `n` elements: [`grid_for`] for `ws_vector_add`; otherwise one CTA
    /// per tile, capped at `ctas_per_sm x SMs` for the persistent shapes and at 2^31 - 1 CTAs.
    pub fn grid(self, dev: &Device, n: usize) -> u32 {
        if self == Variant::WarpSpecialized {
            return grid_for(n);
        }
        let tiles = n.div_ceil(self.tile_elems()) as u64;
        let cap = match self.ctas_per_sm() {
            Some(per_sm) => (per_sm * dev.capabilities().sm_count) as u64,
            None => super::MAX_GRID as u64,
        };
        tiles.min(cap).max(1) as u32
    }
}

/// Queues `c = a + b` with `variant` on its own grid ([`Variant::grid`]). Arguments and errors as
/// [`vector_add`]; also [`Error::MissingKernel`] if the module lacks the variant's entry.
pub fn vector_add_variant(
    dev: &Device,
    stream: &Stream,
    variant: Variant,
    a: DeviceView<'_, f32>,
    b: DeviceView<'_, f32>,
    c: DeviceViewMut<'_, f32>,
) -> Result<()> {
    let grid = variant.grid(dev, a.len());
    launch(dev, stream, variant, a, b, c, grid)
}

/// [`vector_add_variant`] on an explicit grid of `grid` CTAs (1 to 2^31 - 1; every variant is
/// correct on any grid).
pub fn vector_add_variant_with_grid(
    dev: &Device,
    stream: &Stream,
    variant: Variant,
    a: DeviceView<'_, f32>,
    b: DeviceView<'_, f32>,
    c: DeviceViewMut<'_, f32>,
    grid: u32,
) -> Result<()> {
    launch(dev, stream, variant, a, b, c, grid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_grid_is_one_cta_per_tiles_per_cta_tiles() {
        let (tile, per) = (contract::TILE_ELEMS, contract::TILES_PER_CTA);
        assert_eq!(grid_for(0), 1);
        assert_eq!(grid_for(1), 1);
        assert_eq!(grid_for(tile * per), 1);
        assert_eq!(grid_for(tile * per + 1), 2);
        assert_eq!(grid_for(1 << 28), ((1 << 28) / (tile * per)) as u32);
        assert_eq!(grid_for(usize::MAX), crate::kernels::MAX_GRID);
    }
}
