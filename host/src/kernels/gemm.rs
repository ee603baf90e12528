//! Launchers of `cluster_tile_gemm` and `tile_gemm` (gpu/src/kernels/gemm.rs): batched
//! `C_t = A_t x B_t` over 128x128 row-major f32 tiles, and the cuBLAS strided-batched SGEMM
//! baseline on the same buffers.

use std::ffi::c_int;

use cudarc::cublas::{result as cublas_result, sys as cublas_sys, CudaBlas};
use warpline_gpu::contract::gemm as contract;

use super::{check_grid, check_input, check_output};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::launch::{launch_raw, LaunchConfig};
use crate::memory::{DeviceView, DeviceViewMut};
use crate::params;
use crate::stream::Stream;

/// Checks the shapes of a batched tile GEMM without touching a device: `tiles` in
/// `1..=contract::MAX_TILES` and `a`, `b`, `c` each of exactly `tiles x 128 x 128` elements.
///
/// Errors: [`Error::Empty`] for 0 tiles, [`Error::TooLarge`], [`Error::LengthMismatch`].
pub fn check_gemm_shapes(tiles: usize, a_len: usize, b_len: usize, c_len: usize) -> Result<()> {
    if tiles == 0 {
        return Err(Error::Empty { what: "gemm tiles" });
    }
    if tiles > contract::MAX_TILES {
        return Err(Error::TooLarge {
            what: "gemm tiles",
            value: tiles as u64,
            max: contract::MAX_TILES as u64,
        });
    }
    let want = tiles * contract::TILE_ELEMS;
    if a_len != want || b_len != want || c_len != want {
        return Err(Error::LengthMismatch {
            what: "gemm",
            detail: format!(
                "{tiles} tiles of 128x128 need {want} elements each in a, b and c; got {a_len}, {b_len}, {c_len}"
            ),
        });
    }
    Ok(())
}

/// Checks that `cluster_tile_gemm` supports clusters of `cluster` CTAs (1, 2, 4 or 8: each CTA
/// computes `128 / cluster` rows with `8 / cluster` compute warps of 16 rows), without touching a
/// device. Errors: [`Error::UnsupportedClusterSize`].
pub fn check_gemm_cluster_size(cluster: u32) -> Result<()> {
    if !contract::CLUSTER_SIZES.contains(&cluster) {
        return Err(Error::UnsupportedClusterSize {
            kernel: contract::CLUSTER_KERNEL,
            cluster,
            supported: contract::CLUSTER_SIZES.to_vec(),
        });
    }
    Ok(())
}

/// Launch shape of `cluster_tile_gemm` for clusters of `cluster` CTAs (a supported size):
/// `contract::threads_per_cta(cluster)` threads (the loader warp plus `8 / cluster` compute warps)
/// and `contract::smem_bytes(cluster)` dynamic shared memory (A band of `128 / cluster` rows;
/// two CTAs per SM for clusters of 2 or more). The kernel's max dynamic shared memory attribute is
/// set by `Device::open` to the largest, `contract::SMEM_BYTES` (KERNEL_SPECS).
fn cluster_config(grid: u32, cluster: u32) -> LaunchConfig {
    LaunchConfig::linear(
        grid,
        contract::threads_per_cta(cluster),
        contract::smem_bytes(cluster) as u32,
    )
    .with_cluster_x(cluster)
}

/// Clusters of `cluster` CTAs of `cluster_tile_gemm` the device can run at once
/// (`cuOccupancyMaxActiveClusters` with this kernel's threads and shared memory; 0: does not fit).
/// Errors: [`Error::UnsupportedClusterSize`], [`Error::ClustersUnsupported`], [`Error::Cuda`].
pub fn gemm_max_active_clusters(dev: &Device, cluster: u32) -> Result<u32> {
    check_gemm_cluster_size(cluster)?;
    if !dev.capabilities().cluster_launch {
        return Err(Error::ClustersUnsupported);
    }
    let kernel = dev.kernel(contract::CLUSTER_KERNEL)?;
    cluster_config(cluster, cluster).max_active_clusters(dev, kernel)
}

/// The supported cluster sizes for which the device can run at least one cluster.
pub fn gemm_cluster_sizes_that_fit(dev: &Device) -> Result<Vec<u32>> {
    let mut fits = Vec::new();
    for s in contract::CLUSTER_SIZES {
        if gemm_max_active_clusters(dev, s)? > 0 {
            fits.push(s);
        }
    }
    Ok(fits)
}

/// Persistent grid (CTAs) of `cluster_tile_gemm` for `tiles` tiles: as many clusters as can be
/// resident at once (occupancy query), at most one per tile, times `cluster`.
///
/// Errors: [`Error::UnsupportedClusterSize`], [`Error::ClustersUnsupported`],
/// [`Error::ClusterDoesNotFit`] (with the sizes that would fit) when the device cannot run a
/// single cluster of this size, [`Error::Cuda`].
pub fn gemm_cluster_grid(dev: &Device, tiles: usize, cluster: u32) -> Result<u32> {
    let resident = gemm_max_active_clusters(dev, cluster)?;
    if resident == 0 {
        return Err(Error::ClusterDoesNotFit {
            kernel: contract::CLUSTER_KERNEL,
            cluster,
            reason: format!(
                "cuOccupancyMaxActiveClusters is 0 for {} threads and {} bytes of shared memory per CTA",
                contract::threads_per_cta(cluster),
                contract::smem_bytes(cluster)
            ),
            fits: gemm_cluster_sizes_that_fit(dev)?,
        });
    }
    let clusters = (tiles.max(1) as u64).min(resident as u64) as u32;
    Ok(clusters * cluster)
}

/// Queues `C_t = A_t x B_t` for `t < tiles` on `stream` with `cluster_tile_gemm`: clusters of
/// `cluster` CTAs (1, 2, 4 or 8) split each tile's 128 rows; the leader CTA loads each 64-row
/// chunk of `B_t` once and multicasts it into every CTA's shared memory (DSMEM), each CTA loads
/// its own rows of `A_t`. Each CTA has `8 / cluster` compute warps (an 8x8 block of C per thread)
/// and shared memory sized by the cluster, so clusters of 2 or more run two CTAs per SM.
/// Persistent grid from [`gemm_cluster_grid`].
///
/// Shapes: `a`, `b`, `c` each `tiles x 128 x 128` f32, row-major tiles back to back (the layout of
/// a C-order `(tiles, 128, 128)` array); `tiles >= 1`. Alignment: 16 bytes for all three. Streams:
/// all three views bound to `stream`. FP32 FMA throughout (no TF32).
///
/// Errors, all before launch: [`Error::Empty`], [`Error::TooLarge`], [`Error::LengthMismatch`],
/// [`Error::UnsupportedClusterSize`], [`Error::Misaligned`], [`Error::WrongStream`],
/// [`Error::ClustersUnsupported`], [`Error::ClusterDoesNotFit`], [`Error::SharedMemory`]; a
/// failing launch gives [`Error::Launch`]. Source: CUDA driver API `cuLaunchKernelEx` with
/// `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`, `cuOccupancyMaxActiveClusters`.
pub fn cluster_tile_gemm(
    dev: &Device,
    stream: &Stream,
    a: DeviceView<'_, f32>,
    b: DeviceView<'_, f32>,
    c: DeviceViewMut<'_, f32>,
    tiles: usize,
    cluster: u32,
) -> Result<()> {
    check_gemm_shapes(tiles, a.len(), b.len(), c.len())?;
    check_gemm_cluster_size(cluster)?;
    let grid = gemm_cluster_grid(dev, tiles, cluster)?;
    cluster_tile_gemm_with_grid(dev, stream, a, b, c, tiles, cluster, grid / cluster)
}

/// [`cluster_tile_gemm`] with an explicit number of clusters (grid = `clusters x cluster` CTAs):
/// any number >= 1 is correct (clusters beyond the tiles only take part in the barriers). For
/// tests and tuning. Errors as [`cluster_tile_gemm`], plus [`Error::BadShape`] for 0 clusters or
/// a grid above 2^31 - 1.
#[allow(clippy::too_many_arguments)]
pub fn cluster_tile_gemm_with_grid(
    dev: &Device,
    stream: &Stream,
    a: DeviceView<'_, f32>,
    b: DeviceView<'_, f32>,
    c: DeviceViewMut<'_, f32>,
    tiles: usize,
    cluster: u32,
    clusters: u32,
) -> Result<()> {
    check_gemm_shapes(tiles, a.len(), b.len(), c.len())?;
    check_gemm_cluster_size(cluster)?;
    let grid = clusters
        .checked_mul(cluster)
        .filter(|&g| g > 0 && g <= i32::MAX as u32)
        .ok_or_else(|| Error::BadShape {
            what: "cluster_tile_gemm grid",
            detail: format!("{clusters} clusters of {cluster}; 1 to 2^31 - 1 CTAs are allowed"),
        })?;
    check_input("cluster_tile_gemm input a", &a, stream, 16)?;
    check_input("cluster_tile_gemm input b", &b, stream, 16)?;
    check_output("cluster_tile_gemm output c", &c, stream, 16)?;
    let cfg = cluster_config(grid, cluster);
    cfg.validate(dev, contract::CLUSTER_KERNEL)?;
    if gemm_max_active_clusters(dev, cluster)? == 0 {
        return Err(Error::ClusterDoesNotFit {
            kernel: contract::CLUSTER_KERNEL,
            cluster,
            reason: "cuOccupancyMaxActiveClusters is 0".to_string(),
            fits: gemm_cluster_sizes_that_fit(dev)?,
        });
    }
    let kernel = dev.kernel(contract::CLUSTER_KERNEL)?;
    let (pa, pb, pc, t) = (a.device_ptr(), b.device_ptr(), c.device_ptr(), tiles as u32);
    // SAFETY: parameters match `cluster_tile_gemm(*const f32, *const f32, *mut f32, u32)`; the
    // views are live allocations of tiles x 128 x 128 floats, 16-byte aligned, bound to `stream`
    // (checked above); `c` is a mutable view, so it cannot alias `a` or `b`; the cluster size is
    // one the kernel supports and divides the grid (checked above).
    unsafe { launch_raw(dev, kernel, stream, &cfg, &mut params![pa, pb, pc, t]) }
}

/// Queues `C_t = A_t x B_t` for `t < tiles` on `stream` with `tile_gemm` (no clusters: each CTA
/// loads its own tiles' A and B; same roles and 8x8 register tile as a cluster of 1). Persistent
/// grid: one CTA per SM (shared memory allows one), at most one per tile.
///
/// Shapes, alignment, streams as [`cluster_tile_gemm`]. Errors, before launch: [`Error::Empty`],
/// [`Error::TooLarge`], [`Error::LengthMismatch`], [`Error::Misaligned`], [`Error::WrongStream`],
/// [`Error::SharedMemory`]; a failing launch gives [`Error::Launch`] ([`Error::ContextPoisoned`] after a sticky error).
pub fn tile_gemm(
    dev: &Device,
    stream: &Stream,
    a: DeviceView<'_, f32>,
    b: DeviceView<'_, f32>,
    c: DeviceViewMut<'_, f32>,
    tiles: usize,
) -> Result<()> {
    let grid = (tiles.max(1) as u64).min(dev.capabilities().sm_count.max(1) as u64) as u32;
    tile_gemm_with_grid(dev, stream, a, b, c, tiles, grid)
}

/// [`tile_gemm`] with an explicit persistent grid of `grid` CTAs (1 to 2^31 - 1; any size is
/// correct). For tests and tuning. Errors as [`tile_gemm`], plus [`Error::BadShape`] for the grid.
pub fn tile_gemm_with_grid(
    dev: &Device,
    stream: &Stream,
    a: DeviceView<'_, f32>,
    b: DeviceView<'_, f32>,
    c: DeviceViewMut<'_, f32>,
    tiles: usize,
    grid: u32,
) -> Result<()> {
    check_gemm_shapes(tiles, a.len(), b.len(), c.len())?;
    check_grid("tile_gemm grid", grid)?;
    check_input("tile_gemm input a", &a, stream, 16)?;
    check_input("tile_gemm input b", &b, stream, 16)?;
    check_output("tile_gemm output c", &c, stream, 16)?;
    let cfg = LaunchConfig::linear(grid, contract::THREADS_PER_CTA, contract::SMEM_BYTES as u32);
    cfg.validate(dev, contract::PLAIN_KERNEL)?;
    let kernel = dev.kernel(contract::PLAIN_KERNEL)?;
    let (pa, pb, pc, t) = (a.device_ptr(), b.device_ptr(), c.device_ptr(), tiles as u32);
    // SAFETY: as in `cluster_tile_gemm_with_grid`, without clusters.
    unsafe { launch_raw(dev, kernel, stream, &cfg, &mut params![pa, pb, pc, t]) }
}

fn cublas_call(
    call: &'static str,
    r: std::result::Result<(), cublas_result::CublasError>,
) -> Result<()> {
    r.map_err(|e| Error::Cublas {
        call,
        status: format!("{:?}", e.0),
    })
}

/// cuBLAS strided-batched SGEMM on one stream, FP32 math (`CUBLAS_PEDANTIC_MATH`: no TF32, no
/// other reduced precision), as the baseline for the tile GEMM kernels on the same buffers.
pub struct CublasSgemm {
    blas: CudaBlas,
    stream: Stream,
}

impl CublasSgemm {
    /// A cuBLAS handle bound to `stream` (a stream of `dev`), FP32 pedantic math.
    /// Errors: [`Error::WrongContext`], [`Error::Cublas`] (`cublasCreate`, `cublasSetStream`,
    /// `cublasSetMathMode`).
    pub fn new(dev: &Device, stream: &Stream) -> Result<Self> {
        if stream.context_raw() != dev.raw_context() {
            return Err(Error::WrongContext {
                what: "cuBLAS handle (the stream belongs to another context than the device's)",
            });
        }
        dev.bind()?;
        let blas = CudaBlas::new(stream.cudarc().clone()).map_err(|e| Error::Cublas {
            call: "cublasCreate",
            status: format!("{:?}", e.0),
        })?;
        // SAFETY: a live handle; the mode is a valid enum value.
        let r = unsafe {
            cublas_sys::cublasSetMathMode(
                *blas.handle(),
                cublas_sys::cublasMath_t::CUBLAS_PEDANTIC_MATH,
            )
        }
        .result();
        cublas_call("cublasSetMathMode", r)?;
        Ok(Self {
            blas,
            stream: stream.clone(),
        })
    }

    /// Queues `C_t = A_t x B_t` for `t < tiles` (row-major 128x128 f32 tiles, as
    /// [`cluster_tile_gemm`]) with `cublasSgemmStridedBatched`: column-major cuBLAS computes
    /// `C^T = B^T A^T`, so B is passed first. Errors: the shape, alignment and stream errors of
    /// [`cluster_tile_gemm`], [`Error::TooLarge`] above `i32::MAX` tiles, [`Error::Cublas`].
    pub fn gemm_tiles(
        &self,
        a: DeviceView<'_, f32>,
        b: DeviceView<'_, f32>,
        c: DeviceViewMut<'_, f32>,
        tiles: usize,
    ) -> Result<()> {
        check_gemm_shapes(tiles, a.len(), b.len(), c.len())?;
        check_input("cublas input a", &a, &self.stream, 16)?;
        check_input("cublas input b", &b, &self.stream, 16)?;
        check_output("cublas output c", &c, &self.stream, 16)?;
        let n = contract::TILE as c_int;
        let stride = contract::TILE_ELEMS as i64;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // cuBLAS runs in the current context: make it the handle's.
        crate::device::bind_context(self.stream.ctx(), "cublasSgemmStridedBatched")?;
        // SAFETY: the views hold tiles x 128 x 128 floats each and are bound to the handle's
        // stream (checked above), so the strided batch stays inside them and is stream-ordered;
        // alpha and beta are host scalars (the handle's default pointer mode) alive for the call.
        let r = unsafe {
            cublas_result::sgemm_strided_batched(
                *self.blas.handle(),
                cublas_sys::cublasOperation_t::CUBLAS_OP_N,
                cublas_sys::cublasOperation_t::CUBLAS_OP_N,
                n,
                n,
                n,
                &alpha,
                b.device_ptr() as *const f32,
                n,
                stride,
                a.device_ptr() as *const f32,
                n,
                stride,
                &beta,
                c.device_ptr() as *mut f32,
                n,
                stride,
                tiles as c_int,
            )
        };
        cublas_call("cublasSgemmStridedBatched", r)
    }
}
