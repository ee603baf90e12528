//! Host side of the tensor-core GEMM (issue 11; kernels `tc_gemm_*` of the sm_90a module
//! [`crate::SM90A_PTX`], built from `gpu/src/kernels/tc_gemm.rs`; launch contract
//! `warpline_gpu::contract::tc_gemm`):
//!
//! `C[M,N] = alpha * A[M,K] * B[K,N] + beta * C`, BF16 or FP16 inputs, FP32 accumulation, FP32
//! or 16-bit (the input type) output; and FP8 (E4M3 A, E4M3 or E5M2 B, column-major B only,
//! per-tensor scales, BF16 or FP32 output): [`TcGemm::plan_fp8`] (issue 20; submodule `fp8`).
//!
//! Layouts (all with an explicit row pitch in elements, any M, N, K >= 1):
//! - A: row-major `M x K`, pitch `lda >= K`;
//! - B: [`BLayout::ColMajor`] ("K-major": stored as `N` rows of `K`, pitch `ldb >= K`) or
//!   [`BLayout::RowMajor`] ("N-major": `K` rows of `N`, pitch `ldb >= N`);
//! - C: row-major `M x N`, pitch `ldc >= N`.
//!
//! TMA zero-fills the parts of a load box outside the matrix and clips stores, so nothing is
//! padded or copied; but TMA addresses rows with byte strides that are multiples of 16, so every
//! row pitch must be a multiple of 16 bytes (8 BF16/FP16 elements, 4 f32) and every base address
//! 16-byte aligned ([`Error::PitchAlignment`], [`Error::Misaligned`]). The logical sizes may be
//! anything.
//!
//! How a launch is built: [`TcGemm::plan`] validates everything (shapes, pitches, alignment,
//! sizes within the views, streams, cluster size, launch limits), encodes the three tensor maps
//! (A: dims `{K, M}`, box `A_BOX`; B: `{K, N}` box `B_BOX_KMAJOR` or `{N, K}` box
//! `B_BOX_NMAJOR`; C: `{N, M}`, box `C_BOX_F32` or `C_BOX_16`; all 128-byte swizzle, L2
//! promotion 256 B, no interleave, element strides 1, out-of-bounds fill NONE = zeros) and
//! uploads them stream-ordered into a [`TensorMapTable`](crate::TensorMapTable) in device global memory; the kernel
//! gets the three map addresses as `u64` parameters. [`TcGemmPlan::launch`] then launches with
//! no further copies (so PDL overlaps consecutive launches), as often as wanted; dropping the
//! plan frees the table stream-ordered after the last launch. [`TcGemm::gemm`] is plan + launch.
//!
//! Grid: persistent. Work units are cluster tiles (`cluster` M tiles of `BM` rows by one N tile
//! of `BN` columns): `units = ceil(ceil(M / BM) / cluster) * ceil(N / BN)`; the grid is
//! `min(units, cuOccupancyMaxActiveClusters) * cluster` CTAs of `THREADS_PER_CTA` threads with
//! `SMEM_BYTES` of dynamic shared memory, cluster dims `(cluster, 1, 1)`.

use std::collections::HashMap;
use std::ffi::c_int;
use std::sync::Mutex;

use cudarc::cublas::{result as cublas_result, sys as cublas_sys, CudaBlas};
use half::bf16;
use warpline_gpu::contract::tc_gemm as contract;

use super::check_stream;
use super::decode_gemm::{
    auto_pingpong, select_config, select_config_f16, DecodeConfig, DecodeGemm, DecodeGemmOptions,
    DecodeLaunch, GemmConfig,
};
use crate::device::{Device, Kernel};
use crate::error::{Error, Result};
use crate::launch::{launch_raw, LaunchConfig, LaunchLimits, ParamValue};
use crate::memory::{DeviceView, MemPool};
use crate::module::{check_entry, Module, RustParam, RustParamKind};
use crate::stream::Stream;
use crate::tensor_map::{TensorMap, TensorMapTable, TmaElement, TmaSwizzle};

mod fp8;
mod swap_ab;
mod swap_ab_launch;
pub use fp8::{
    block_scaled_reference_entry, check_fp8_block_scales, fp8_block_tolerance, Fp8BlockScales,
    ScaleDims, FP8_SCALE_BLOCK,
};
pub use fp8::{
    check_fp8_layout, check_fp8_shapes, fp8_tolerance, CublasLtFp8, CublasLtFp8Plan, Fp8Input,
    Fp8Scales, FP8_STEP_REL,
};
use swap_ab_launch::SwapAbLaunch;
pub use swap_ab_launch::{
    swap_ab_shape, Activation, Epilogue, SwapAbConfig, SwapAbShape, WeightsBeforeWait,
    AUTO_MAX_KSPLIT, KSPLITS, KSPLIT_FIXED_KBLOCKS, SWAP_AB_ENTRIES, TOKEN_TILES,
};

// The operand types and their checks are shared with the decode GEMM: they live in
// `kernels/operands.rs`, below both, so that `tc_gemm` and `decode_gemm` do not import each
// other; re-exported here, their public path.
use super::operands::sealed;
pub use super::operands::{
    check_matrix, check_shapes, BLayout, GemmShape, Matrix, MatrixDims, MatrixMut, Raster, TcInput,
    TcOutput,
};

/// The default persistent grid, in clusters, for `units` work units when `resident` clusters fit
/// on the device: as few clusters as finish in the same number of rounds (`ceil(units /
/// resident)`) as every resident cluster would, so each cluster takes the same number of units
/// (4096^3 with clusters of 2 on the H100: 256 units, 66 resident, 4 rounds: 64 clusters). The
/// SMs left idle hold no tile that would finish late; measured on the H100 (docs/perf-notes.md)
/// it was faster than the full grid at 4096^3 and 8192^3.
pub fn balanced_clusters(units: u64, resident: u64) -> u64 {
    let (units, resident) = (units.max(1), resident.max(1));
    units.div_ceil(units.div_ceil(resident))
}

/// Launch options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcGemmOptions {
    /// CTAs per cluster, 1 or 2 (`None`: 2 when `cuOccupancyMaxActiveClusters` can place a
    /// cluster of 2, else 1).
    pub cluster: Option<u32>,
    /// Tile raster order.
    pub raster: Raster,
    /// Tiles per raster band (>= 1; a value above the raster's minor dimension, in units, acts as
    /// that dimension).
    pub group: u32,
    /// Launch with Programmatic Dependent Launch (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_
    /// SERIALIZATION`): the kernel may start while the previous kernel on the stream finishes;
    /// it waits (`griddepcontrol.wait`) before reading A, B or C.
    pub pdl: bool,
    /// Number of clusters in the persistent grid (`None`: [`balanced_clusters`] of the work units
    /// and the clusters that can be resident). Any number >= 1 is correct; for tests and tuning.
    pub clusters: Option<u32>,
    /// Ping-pong consumers (`contract::KERNEL_BF16_BCOL_PINGPONG`: each consumer warpgroup takes
    /// whole 64 x 256 tiles in turn) instead of cooperative ones (both split each 128 x 256
    /// tile). BF16 with a column-major B only; otherwise [`Error::BadShape`].
    pub pingpong: bool,
    /// Kernel configuration (issue 20): [`GemmConfig::Auto`] follows [`select_config`] (BF16:
    /// the swap-AB kernel for `M <= 128`, FP16: the decode kernel for `M <= 64`, each with a
    /// column-major B and none of `pingpong`, `cluster`, `clusters` set; else the cooperative
    /// kernel, in its ping-pong form where [`auto_pingpong`] holds: BF16, 65 to 128 rows, N of
    /// 12288 or more; BF16 problems of at most 8 rows and 4096 columns get the decode kernel,
    /// [`crate::kernels::decode_gemm::auto_decode_bf16`]). [`TcGemm::plan_chain2`] always uses the cooperative kernel.
    pub config: GemmConfig,
    /// Tunables of the decode configuration.
    pub decode: DecodeConfig,
    /// Tunables of the swap-AB configuration.
    pub swap_ab: SwapAbConfig,
}

impl TcGemmOptions {
    /// Whether an option of the cooperative kernel alone is set (`pingpong`, `cluster`,
    /// `clusters`): [`select_config`] then keeps `Auto` on that kernel, and the decode and
    /// swap-AB configurations refuse the options.
    pub fn cooperative_knobs(&self) -> bool {
        self.pingpong || self.cluster.is_some() || self.clusters.is_some()
    }
}

impl Default for TcGemmOptions {
    fn default() -> Self {
        Self {
            cluster: None,
            // Along N measured better on 4 of the 6 bench shapes (H100, docs/perf-notes.md).
            raster: Raster::AlongN,
            group: contract::DEFAULT_GROUP,
            pdl: false,
            clusters: None,
            pingpong: false,
            config: GemmConfig::Auto,
            decode: DecodeConfig::default(),
            swap_ab: SwapAbConfig::default(),
        }
    }
}

/// The Rust view of the entries' parameter list (checked against the PTX at [`TcGemm::new`]).
fn rust_params() -> Vec<RustParam> {
    let p = |t: &str, size, kind| RustParam {
        rust_type: t.to_string(),
        size,
        kind,
    };
    use RustParamKind::{Address, Float, Int};
    vec![
        p("tmap_a: u64", 8, Address),
        p("tmap_b: u64", 8, Address),
        p("tmap_c: u64", 8, Address),
        p("c: u64", 8, Address),
        p("m: u32", 4, Int),
        p("n: u32", 4, Int),
        p("k: u32", 4, Int),
        p("ldc: u32", 4, Int),
        p("alpha: f32", 4, Float),
        p("beta: f32", 4, Float),
        p("out_f32: u32", 4, Int),
        p("raster: u32", 4, Int),
        p("group: u32", 4, Int),
    ]
}

/// The FP8 entries' parameter list: [`rust_params`] plus `a_scale: u64, b_scale: u64`.
fn rust_params_fp8() -> Vec<RustParam> {
    let mut v = rust_params();
    for name in ["a_scale: u64", "b_scale: u64"] {
        v.push(RustParam {
            rust_type: name.to_string(),
            size: 8,
            kind: RustParamKind::Address,
        });
    }
    debug_assert_eq!(v.len(), 13 + contract::FP8_EXTRA_PARAMS);
    v
}

/// The block-scaled FP8 entry's parameter list: [`rust_params`] plus `a_scale: u64,
/// b_scale: u64, a_scales_ld: u32, b_scales_ld: u32` (`contract::FP8_BLOCK_EXTRA_PARAMS`; the
/// two addresses are of the scale arrays).
fn rust_params_fp8_block() -> Vec<RustParam> {
    let mut v = rust_params();
    for (name, size, kind) in [
        ("a_scale: u64", 8, RustParamKind::Address),
        ("b_scale: u64", 8, RustParamKind::Address),
        ("a_scales_ld: u32", 4, RustParamKind::Int),
        ("b_scales_ld: u32", 4, RustParamKind::Int),
    ] {
        v.push(RustParam {
            rust_type: name.to_string(),
            size,
            kind,
        });
    }
    debug_assert_eq!(v.len(), 13 + contract::FP8_BLOCK_EXTRA_PARAMS);
    v
}

/// The block-scaled FP8 entry of the sm_90a module (issue 20): DeepSeek-V3 scales, the
/// parameter list of [`ENTRIES`] plus `a_scale, b_scale, a_scales_ld, b_scales_ld`.
pub const FP8_BLOCK_SCALED_ENTRY: &str = contract::KERNEL_E4M3_BCOL_BLOCK_SCALED;

/// The FP8 entries of the sm_90a module (issue 20), with the parameter list of
/// [`ENTRIES`] plus `a_scale: u64, b_scale: u64`.
pub const FP8_ENTRIES: [&str; 3] = [
    contract::KERNEL_E4M3_BCOL,
    contract::KERNEL_E4M3_E5M2_BCOL,
    contract::KERNEL_E4M3_BCOL_PINGPONG,
];

/// The entries of the sm_90a module the launcher uses.
pub const ENTRIES: [&str; 5] = [
    contract::KERNEL_BF16_BCOL,
    contract::KERNEL_BF16_BROW,
    contract::KERNEL_F16_BCOL,
    contract::KERNEL_F16_BROW,
    contract::KERNEL_BF16_BCOL_PINGPONG,
];

/// The raster band must hold at least one tile (`TcGemmOptions::group`), in every configuration.
fn check_group(opts: &TcGemmOptions) -> Result<()> {
    if opts.group == 0 {
        return Err(Error::BadShape {
            what: "tc_gemm raster group",
            detail: "0 tiles; allowed: 1 or more".into(),
        });
    }
    Ok(())
}

/// Checks that `ptx` has every entry of [`ENTRIES`] with the contract's parameter list
/// (`(u64, u64, u64, u64, u32, u32, u32, u32, f32, f32, u32, u32, u32)`), without a device.
/// Errors: [`Error::MissingKernel`], [`Error::KernelSignatureMismatch`], [`Error::PtxSignature`].
pub fn check_module_entries(ptx: &str) -> Result<()> {
    let entries = crate::module::ptx_signatures(ptx);
    let (rust, rust_fp8) = (rust_params(), rust_params_fp8());
    let rust_fp8_block = rust_params_fp8_block();
    let all = ENTRIES
        .iter()
        .map(|&n| (n, &rust))
        .chain(FP8_ENTRIES.iter().map(|&n| (n, &rust_fp8)))
        .chain([(FP8_BLOCK_SCALED_ENTRY, &rust_fp8_block)]);
    let rust_swap_ab = swap_ab_launch::rust_params();
    let all = all.chain(SWAP_AB_ENTRIES.iter().map(|&n| (n, &rust_swap_ab)));
    for (name, rust) in all {
        check_entry(&entries, name, rust)?;
    }
    Ok(())
}

/// The tensor-core GEMM launcher of one device: the sm_90a module loaded, the kernels' shared
/// memory limit raised to `SMEM_BYTES`, a memory pool for tensor-map tables.
pub struct TcGemm<'d> {
    dev: &'d Device,
    module: Module,
    /// The decode configuration's launcher, when the device's sm_90 module has its entries.
    decode: Option<DecodeGemm<'d>>,
    pool: MemPool,
    /// `cuOccupancyMaxActiveClusters` per (entry, cluster size).
    resident: Mutex<HashMap<(&'static str, u32), u32>>,
}

impl std::fmt::Debug for TcGemm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcGemm")
            .field("device", &self.dev.capabilities().name)
            .field("module", &self.module)
            .finish()
    }
}

impl<'d> TcGemm<'d> {
    /// Loads [`crate::SM90A_PTX`] into `dev`'s context ([`Device::load_module`]), checks that it
    /// has the five entries of [`ENTRIES`] with the contract's parameter list, and sets their
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` to `contract::SMEM_BYTES`.
    ///
    /// Errors, before anything is loaded: [`Error::Sm90aRequired`] unless the device's compute
    /// capability is exactly 9.0 (sm_90a code runs nowhere else); [`Error::ContractMismatch`]
    /// for a module built from another `gpu/src/contract.rs`; [`Error::MissingKernel`],
    /// [`Error::KernelSignatureMismatch`] (checked on the PTX text). Then: the errors of
    /// [`Device::load_module`] and [`MemPool::new`], [`Error::SharedMemory`] /
    /// [`Error::TooLarge`] if `SMEM_BYTES` exceeds the device's opt-in limit.
    pub fn new(dev: &'d Device) -> Result<Self> {
        Self::load(dev, crate::SM90A_PTX)
    }

    /// [`TcGemm::new`] with another build of the sm_90a module (same contract). Errors as
    /// [`TcGemm::new`].
    ///
    /// # Safety
    /// The launcher's safe methods ([`TcGemm::gemm`], [`TcGemmPlan::launch`]) launch the entries
    /// of [`ENTRIES`] with warpline's arguments, grids and shared memory, and trust what they do.
    /// Only the launch-contract hash embedded in the PTX and the entries' parameter lists are
    /// checked; any PTX can carry both. The caller guarantees that each entry of [`ENTRIES`] (and
    /// [`FP8_ENTRIES`]) in `ptx` is a build of warpline's kernel of that name (gpu/) from the same launch contract
    /// (`gpu/src/contract.rs`) as this host: the same shared-memory layout, tile sizes and memory
    /// accesses. [`TcGemm::new`] (the embedded module) needs no promise.
    ///
    /// ```compile_fail,E0133
    /// // issue 19, item 3: trusting foreign PTX as warpline's GEMM kernels needs `unsafe`.
    /// fn f(dev: &warpline::Device) { let _ = warpline::kernels::tc_gemm::TcGemm::with_ptx(dev, ""); }
    /// ```
    pub unsafe fn with_ptx(dev: &'d Device, ptx: &str) -> Result<Self> {
        Self::load(dev, ptx)
    }

    fn load(dev: &'d Device, ptx: &str) -> Result<Self> {
        let caps = dev.capabilities();
        if caps.compute_capability != (9, 0) {
            return Err(Error::Sm90aRequired {
                device: caps.name.clone(),
                major: caps.compute_capability.0,
                minor: caps.compute_capability.1,
            });
        }
        crate::contract_check::check_contract(ptx, warpline_gpu::CONTRACT_HASH)?;
        check_module_entries(ptx)?;
        if contract::SMEM_BYTES > caps.max_shared_mem_per_block_optin {
            return Err(Error::SharedMemory {
                kernel: contract::KERNEL_BF16_BCOL,
                requested: contract::SMEM_BYTES,
                max: caps.max_shared_mem_per_block_optin,
            });
        }
        let module = dev.load_module(ptx)?;
        for name in ENTRIES
            .into_iter()
            .chain(FP8_ENTRIES)
            .chain([FP8_BLOCK_SCALED_ENTRY])
        {
            module
                .untyped_kernel(name)?
                .raise_max_dynamic_shared_memory(contract::SMEM_BYTES)?;
        }
        for (name, &nt) in SWAP_AB_ENTRIES.iter().zip(TOKEN_TILES.iter()) {
            module
                .untyped_kernel(name)?
                .raise_max_dynamic_shared_memory(
                    warpline_gpu::contract::swap_ab_gemm::smem_bytes(nt),
                )?;
        }
        let pool = MemPool::new(dev, 1 << 20)?;
        Ok(Self {
            dev,
            module,
            decode: DecodeGemm::new(dev).ok(),
            pool,
            resident: Mutex::new(HashMap::new()),
        })
    }

    /// The device.
    pub fn device(&self) -> &'d Device {
        self.dev
    }

    fn kernel(&self, name: &str) -> Result<&Kernel> {
        self.module.untyped_kernel(name)
    }

    /// The loaded entry `name` of the sm_90a module (its dynamic shared memory limit raised as
    /// [`TcGemm::new`] says), for launches the caller builds itself, e.g. the decode step's
    /// chain. Errors: [`Error::MissingKernel`].
    pub(crate) fn entry(&self, name: &str) -> Result<&Kernel> {
        self.kernel(name)
    }

    fn config(grid: u32, cluster: u32, pdl: bool) -> LaunchConfig {
        LaunchConfig::linear(grid, contract::THREADS_PER_CTA, contract::SMEM_BYTES as u32)
            .with_cluster_x(cluster)
            .with_pdl(pdl)
    }

    /// Clusters of `cluster` CTAs (1 or 2) of entry `name` the device can run at once
    /// (`cuOccupancyMaxActiveClusters`, cached). Errors: [`Error::UnsupportedClusterSize`],
    /// [`Error::MissingKernel`], [`Error::Cuda`].
    pub fn max_active_clusters(&self, name: &'static str, cluster: u32) -> Result<u32> {
        check_cluster(name, cluster)?;
        let key = (name, cluster);
        if let Some(&n) = self
            .resident
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return Ok(n);
        }
        let kernel = self.kernel(name)?;
        let n = Self::config(cluster, cluster, false).max_active_clusters(self.dev, kernel)?;
        self.resident
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, n);
        Ok(n)
    }

    /// The cluster size a launch of `name` uses by default: 2 when the device can run a cluster
    /// of 2, else 1. Errors: [`Error::ClusterDoesNotFit`] when neither fits, [`Error::Cuda`].
    pub fn default_cluster(&self, name: &'static str) -> Result<u32> {
        if self.dev.capabilities().cluster_launch && self.max_active_clusters(name, 2)? > 0 {
            return Ok(2);
        }
        if self.max_active_clusters(name, 1)? > 0 {
            return Ok(1);
        }
        Err(self.does_not_fit(name, 1))
    }

    fn does_not_fit(&self, name: &'static str, cluster: u32) -> Error {
        let fits = contract::CLUSTER_SIZES
            .iter()
            .copied()
            .filter(|&s| self.max_active_clusters(name, s).unwrap_or(0) > 0)
            .collect();
        Error::ClusterDoesNotFit {
            kernel: name,
            cluster,
            reason: format!(
                "cuOccupancyMaxActiveClusters is 0 for {} threads and {} bytes of shared memory per CTA",
                contract::THREADS_PER_CTA,
                contract::SMEM_BYTES
            ),
            fits,
        }
    }

    /// Validates one GEMM and returns its launch (map addresses still to fill in) and its maps.
    #[allow(clippy::too_many_arguments)]
    fn prepare<'a, T: TcInput, O: TcOutput<T>>(
        &self,
        stream: &Stream,
        a: &Matrix<'a, T>,
        b: &Matrix<'a, T>,
        layout: BLayout,
        c: &MatrixMut<'a, O>,
        alpha: f32,
        beta: f32,
        opts: &TcGemmOptions,
        pdl: bool,
    ) -> Result<(Prepared, GemmShape, [TensorMap<'a>; 3])> {
        let spec = || -> Result<EntrySpec> {
            let name = if opts.pingpong {
                T::pingpong_entry(layout).ok_or_else(|| Error::BadShape {
                    what: "tc_gemm ping-pong",
                    detail: format!(
                        "{} with B {layout:?}; the ping-pong entry exists for bf16 with a column-major B only",
                        T::NAME
                    ),
                })?
            } else {
                T::entry(layout)
            };
            Ok(EntrySpec {
                name,
                a_box: if opts.pingpong {
                    contract::A_BOX_PINGPONG
                } else {
                    contract::A_BOX
                },
                b_box: match layout {
                    BLayout::ColMajor => contract::B_BOX_KMAJOR,
                    BLayout::RowMajor => contract::B_BOX_NMAJOR,
                },
                c_box: O::C_BOX,
                out_f32: O::IS_F32,
                scales: None,
                scales_ld: None,
            })
        };
        self.prepare_entry(stream, a, b, layout, c, alpha, beta, opts, pdl, spec)
    }

    /// [`TcGemm::prepare`] for any element types: checks everything, then asks `spec` for the
    /// entry (its errors come after the shape, stream and group checks).
    #[allow(clippy::too_many_arguments)]
    fn prepare_entry<'a, TA: TmaElement, TB: TmaElement, O: TmaElement>(
        &self,
        stream: &Stream,
        a: &Matrix<'a, TA>,
        b: &Matrix<'a, TB>,
        layout: BLayout,
        c: &MatrixMut<'a, O>,
        alpha: f32,
        beta: f32,
        opts: &TcGemmOptions,
        pdl: bool,
        spec: impl FnOnce() -> Result<EntrySpec>,
    ) -> Result<(Prepared, GemmShape, [TensorMap<'a>; 3])> {
        if stream.context_raw() != self.dev.raw_context() {
            return Err(Error::WrongContext {
                what: "tc_gemm stream",
            });
        }
        let shape = check_shapes(
            &a.dims(size_of::<TA>()),
            &b.dims(size_of::<TB>()),
            layout,
            &c.dims(size_of::<O>()),
        )?;
        check_stream("tc_gemm A", a.view.stream(), stream)?;
        check_stream("tc_gemm B", b.view.stream(), stream)?;
        check_stream("tc_gemm C", c.view.stream(), stream)?;
        check_group(opts)?;
        let spec = spec()?;
        let name = spec.name;
        let cluster = match opts.cluster {
            Some(s) => {
                check_cluster(name, s)?;
                if s > 1 && !self.dev.capabilities().cluster_launch {
                    return Err(Error::ClustersUnsupported);
                }
                s
            }
            None => self.default_cluster(name)?,
        };
        // check_shapes bounds M and N by 2^31 - 1, so the product fits; u64::MAX stands for
        // an overflow all the same.
        let units = shape.units_of(cluster, opts.pingpong).unwrap_or(u64::MAX);
        let group = shape.band_group(cluster, opts.pingpong, opts.raster, opts.group);
        if units > contract::MAX_UNITS {
            return Err(Error::TooLarge {
                what: "tc_gemm work units (ceil(ceil(M / 128) / cluster) * ceil(N / 256))",
                value: units,
                max: contract::MAX_UNITS,
            });
        }
        let resident = self.max_active_clusters(name, cluster)?;
        if resident == 0 {
            return Err(self.does_not_fit(name, cluster));
        }
        let clusters = match opts.clusters {
            Some(0) => {
                return Err(Error::BadShape {
                    what: "tc_gemm clusters",
                    detail: "0 clusters; allowed: 1 or more".into(),
                })
            }
            Some(n) => n as u64,
            None => balanced_clusters(units, resident as u64),
        };
        let grid = clusters
            .checked_mul(cluster as u64)
            .filter(|&g| g <= super::MAX_GRID as u64)
            .ok_or_else(|| Error::BadShape {
                what: "tc_gemm grid",
                detail: format!("{clusters} clusters of {cluster}; 1 to 2^31 - 1 CTAs are allowed"),
            })? as u32;
        let kernel = self.kernel(name)?;
        let cfg = Self::config(grid, cluster, pdl);
        cfg.check(name, &LaunchLimits::of(self.dev, kernel))?;
        let sw = TmaSwizzle::B128;
        let map_a = TensorMap::matrix(&a.view, a.rows, a.cols, a.pitch, spec.a_box, sw)?;
        let map_b = TensorMap::matrix(&b.view, b.rows, b.cols, b.pitch, spec.b_box, sw)?;
        let map_c = TensorMap::matrix_mut(&c.view, c.rows, c.cols, c.pitch, spec.c_box, sw)?;
        let prepared = Prepared {
            kernel: kernel.clone(),
            cfg,
            c: c.view.device_ptr(),
            scalars: [
                ParamValue::new(shape.m as u32),
                ParamValue::new(shape.n as u32),
                ParamValue::new(shape.k as u32),
                ParamValue::new(c.pitch as u32),
                ParamValue::new(alpha),
                ParamValue::new(beta),
                ParamValue::new(spec.out_f32 as u32),
                ParamValue::new(opts.raster.code()),
                ParamValue::new(group),
            ],
            scales: spec.scales,
            scales_ld: spec.scales_ld,
            maps: [0; 3],
        };
        Ok((prepared, shape, [map_a, map_b, map_c]))
    }

    /// Validates `C = alpha * A * B + beta * C` and prepares its launch on `stream`: tensor maps
    /// encoded and uploaded (stream-ordered) into a table in device memory; nothing is launched
    /// until [`TcGemmPlan::launch`]. The plan borrows A, B (shared) and C (exclusively) for its
    /// lifetime, so the memory outlives every launch and C is aliased by nothing.
    ///
    /// Shapes: A `M x K` row-major; B `K x N` in `layout` (stored `N x K` for
    /// [`BLayout::ColMajor`], `K x N` for [`BLayout::RowMajor`]); C `M x N` row-major; M, N, K
    /// from 1 to 2^31 - 1; pitches in elements, `>= ` the row length, each a multiple of 16
    /// bytes; `(rows - 1) * pitch + cols` elements within each view; base addresses 16-byte
    /// aligned. C is read only when `beta != 0` (then it must hold values; NaN in C with
    /// `beta == 0` is ignored). Streams: A, B, C bound to `stream`, of this device's context.
    ///
    /// Errors, all before anything is queued: [`Error::WrongContext`], [`Error::WrongStream`],
    /// those of [`check_shapes`], [`Error::UnsupportedClusterSize`] (cluster not 1 or 2),
    /// [`Error::ClustersUnsupported`], [`Error::ClusterDoesNotFit`], [`Error::BadShape`] (group
    /// or clusters 0, grid too large), [`Error::TooLarge`] (work units above
    /// `contract::MAX_UNITS`), the launch-limit errors of [`LaunchConfig::check`],
    /// [`Error::TensorMap`] / [`Error::Cuda`] (`cuTensorMapEncodeTiled`); then the allocation and
    /// copy errors of [`TensorMapTable::upload`].
    #[allow(clippy::too_many_arguments)]
    pub fn plan<'a, T: TcInput, O: TcOutput<T>>(
        &'a self,
        stream: &Stream,
        a: Matrix<'a, T>,
        b: Matrix<'a, T>,
        layout: BLayout,
        c: MatrixMut<'a, O>,
        alpha: f32,
        beta: f32,
        opts: &TcGemmOptions,
    ) -> Result<TcGemmPlan<'a>> {
        let shape = check_shapes(
            &a.dims(size_of::<T>()),
            &b.dims(size_of::<T>()),
            layout,
            &c.dims(size_of::<O>()),
        )?;
        // Options of every configuration are checked before one is chosen.
        check_group(opts)?;
        let config = if T::IS_BF16 {
            self.select(shape, layout, opts)
        } else {
            self.select_f16(shape, layout, opts)
        };
        // Auto's ping-pong form of the cooperative kernel (`auto_pingpong`; BF16 only).
        let pingpong_opts;
        let opts = if T::IS_BF16
            && opts.config == GemmConfig::Auto
            && config == GemmConfig::Cooperative128x256
            && layout == BLayout::ColMajor
            && !opts.cooperative_knobs()
            && auto_pingpong(shape)
        {
            pingpong_opts = TcGemmOptions {
                pingpong: true,
                ..*opts
            };
            &pingpong_opts
        } else {
            opts
        };
        // Auto's decode kernel for BF16 (`auto_decode_bf16`) runs its own configuration unless
        // the caller set one; where the decode kernel refuses the problem (or this module lacks
        // it), the swap-AB kernel that Auto would pick otherwise.
        let auto_bf16_decode =
            T::IS_BF16 && opts.config == GemmConfig::Auto && config == GemmConfig::Decode;
        if config == GemmConfig::Decode {
            if opts.cooperative_knobs() {
                return Err(Error::BadShape {
                    what: "tc_gemm config decode",
                    detail: "ping-pong, cluster and clusters are options of the cooperative kernel; allowed with GemmConfig::Decode: none of them".into(),
                });
            }
            let decode_cfg = if auto_bf16_decode && opts.decode == DecodeConfig::default() {
                DecodeConfig::auto_bf16()
            } else {
                opts.decode
            };
            let prepared = match &self.decode {
                Some(d) => d.prepare(
                    stream,
                    &a,
                    &b,
                    layout,
                    &c,
                    alpha,
                    beta,
                    &DecodeGemmOptions::new(decode_cfg, opts.pdl),
                ),
                // Report why the launcher is missing.
                None => Err(DecodeGemm::new(self.dev).err().unwrap_or(Error::Empty {
                    what: "decode gemm launcher",
                })),
            };
            match prepared {
                Ok(l) => {
                    return Ok(TcGemmPlan {
                        dev: self.dev,
                        stream: stream.clone(),
                        table: None,
                        launches: Vec::new(),
                        decode: vec![l],
                        swap_ab: Vec::new(),
                        shapes: vec![shape],
                    })
                }
                Err(e) if !auto_bf16_decode => return Err(e),
                Err(_) => {}
            }
        }
        if config == GemmConfig::SwapAb || auto_bf16_decode {
            let (Some(a), Some(b)) = (T::bf16_matrix(a), T::bf16_matrix(b)) else {
                return Err(Error::BadShape {
                    what: "tc_gemm config swapab",
                    detail: format!("{} inputs; the swap-AB kernel takes bf16 only", T::NAME),
                });
            };
            return self.plan_swap_ab(
                stream,
                a,
                b,
                layout,
                c,
                O::IS_F32,
                alpha,
                beta,
                Epilogue::default(),
                opts,
            );
        }
        let (p, shape, maps) =
            self.prepare(stream, &a, &b, layout, &c, alpha, beta, opts, opts.pdl)?;
        self.finish(stream, vec![(p, maps)], vec![shape])
    }

    /// The configuration a BF16 [`TcGemm::plan`] of `shape` with `opts` uses: `opts.config`,
    /// with [`GemmConfig::Auto`] resolved by [`select_config`] (and to the swap-AB kernel when
    /// this device's module lacks the decode entries; [`TcGemm::plan`] also falls back to it
    /// where the decode kernel refuses the problem).
    pub fn select(&self, shape: GemmShape, layout: BLayout, opts: &TcGemmOptions) -> GemmConfig {
        let knobs = opts.cooperative_knobs();
        let chosen = select_config(opts.config, shape, layout, knobs);
        self.resolve(opts, chosen, GemmConfig::SwapAb)
    }

    /// [`TcGemm::select`] for FP16 inputs ([`select_config_f16`]: no swap-AB kernel).
    pub fn select_f16(
        &self,
        shape: GemmShape,
        layout: BLayout,
        opts: &TcGemmOptions,
    ) -> GemmConfig {
        let knobs = opts.cooperative_knobs();
        let chosen = select_config_f16(opts.config, shape, layout, knobs);
        self.resolve(opts, chosen, GemmConfig::Cooperative128x256)
    }

    /// `chosen`, except that Auto's decode choice becomes `fallback` when this device's module
    /// lacks the decode entries (BF16: the swap-AB kernel; FP16: the cooperative kernel).
    fn resolve(
        &self,
        opts: &TcGemmOptions,
        chosen: GemmConfig,
        fallback: GemmConfig,
    ) -> GemmConfig {
        match chosen {
            GemmConfig::Decode if opts.config == GemmConfig::Auto && self.decode.is_none() => {
                fallback
            }
            c => c,
        }
    }

    /// Two dependent GEMMs, `C1 = A * B1` then `C2 = C1 * B2` (alpha 1, beta 0), as one plan:
    /// both validated and both launches' maps uploaded before anything is launched, so with
    /// `opts.pdl` the second kernel is launched with PDL right behind the first (no copy in
    /// between) and overlaps its prologue with the first's epilogue; it reads C1 only after its
    /// `griddepcontrol.wait`. C1 has the input type (it is the second GEMM's A).
    ///
    /// Shapes: A `M x K`, B1 `K x N1` (`layout1`), C1 `M x N1`, B2 `N1 x N2` (`layout2`), C2
    /// `M x N2`; rules and errors as [`TcGemm::plan`] for each.
    #[allow(clippy::too_many_arguments)]
    pub fn plan_chain2<'a, T: TcInput + TcOutput<T>, O: TcOutput<T>>(
        &'a self,
        stream: &Stream,
        a: Matrix<'a, T>,
        b1: Matrix<'a, T>,
        layout1: BLayout,
        c1: MatrixMut<'a, T>,
        b2: Matrix<'a, T>,
        layout2: BLayout,
        c2: MatrixMut<'a, O>,
        opts: &TcGemmOptions,
    ) -> Result<TcGemmPlan<'a>> {
        let (p1, s1, maps1) =
            self.prepare(stream, &a, &b1, layout1, &c1, 1.0, 0.0, opts, opts.pdl)?;
        let c1 = c1.into_matrix();
        let (p2, s2, maps2) =
            self.prepare(stream, &c1, &b2, layout2, &c2, 1.0, 0.0, opts, opts.pdl)?;
        self.finish(stream, vec![(p1, maps1), (p2, maps2)], vec![s1, s2])
    }

    fn finish<'a>(
        &'a self,
        stream: &Stream,
        parts: Vec<(Prepared, [TensorMap<'a>; 3])>,
        shapes: Vec<GemmShape>,
    ) -> Result<TcGemmPlan<'a>> {
        let all: Vec<TensorMap<'a>> = parts.iter().flat_map(|(_, m)| m.clone()).collect();
        let table = TensorMapTable::upload(&self.pool, stream, &all)?;
        let mut launches = Vec::with_capacity(parts.len());
        for (i, (mut p, _)) in parts.into_iter().enumerate() {
            for j in 0..3 {
                p.maps[j] = table.address(3 * i + j).ok_or(Error::Empty {
                    what: "tensor map table slot",
                })?;
            }
            launches.push(p);
        }
        Ok(TcGemmPlan {
            dev: self.dev,
            stream: stream.clone(),
            table: Some(table),
            launches,
            decode: Vec::new(),
            swap_ab: Vec::new(),
            shapes,
        })
    }

    /// `C = alpha * A * B + beta * C` on `stream`: [`TcGemm::plan`] then [`TcGemmPlan::launch`]
    /// once (the map table is freed stream-ordered after the kernel). Errors: those of both.
    ///
    /// Input and output types are checked at compile time: A and B of one input type, C of f32
    /// or that type. Mixing BF16 and FP16 does not build:
    ///
    /// ```compile_fail
    /// use warpline::kernels::{BLayout, Matrix, MatrixMut, TcGemm};
    /// fn f(tc: &TcGemm<'_>, s: &warpline::Stream, a: Matrix<'_, warpline::bf16>,
    ///      b: Matrix<'_, warpline::f16>, c: MatrixMut<'_, f32>) {
    ///     let _ = tc.gemm(s, a, b, BLayout::ColMajor, c, 1.0, 0.0, &Default::default());
    /// }
    /// ```
    ///
    /// ```compile_fail
    /// use warpline::kernels::{BLayout, Matrix, MatrixMut, TcGemm};
    /// fn f(tc: &TcGemm<'_>, s: &warpline::Stream, a: Matrix<'_, warpline::bf16>,
    ///      b: Matrix<'_, warpline::bf16>, c: MatrixMut<'_, warpline::f16>) {
    ///     let _ = tc.gemm(s, a, b, BLayout::ColMajor, c, 1.0, 0.0, &Default::default());
    /// }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn gemm<T: TcInput, O: TcOutput<T>>(
        &self,
        stream: &Stream,
        a: Matrix<'_, T>,
        b: Matrix<'_, T>,
        layout: BLayout,
        c: MatrixMut<'_, O>,
        alpha: f32,
        beta: f32,
        opts: &TcGemmOptions,
    ) -> Result<()> {
        self.plan(stream, a, b, layout, c, alpha, beta, opts)?
            .launch()
    }
}

/// [`Error::UnsupportedClusterSize`] naming `kernel` (the entry the launch would use) unless
/// `cluster` is one of the contract's sizes.
fn check_cluster(kernel: &'static str, cluster: u32) -> Result<()> {
    if !contract::CLUSTER_SIZES.contains(&cluster) {
        return Err(Error::UnsupportedClusterSize {
            kernel,
            cluster,
            supported: contract::CLUSTER_SIZES.to_vec(),
        });
    }
    Ok(())
}

/// The entry of one launch and what depends on it.
struct EntrySpec {
    name: &'static str,
    a_box: [u32; 2],
    b_box: [u32; 2],
    c_box: [u32; 2],
    out_f32: bool,
    /// FP8 entries: the `a_scale`, `b_scale` parameters (device addresses, 0 for none); the
    /// block-scaled entry: `a_scales`, `b_scales`.
    scales: Option<[u64; 2]>,
    /// The block-scaled entry: `a_scales_ld`, `b_scales_ld` (appended after `scales`).
    scales_ld: Option<[u32; 2]>,
}

/// One validated kernel launch.
struct Prepared {
    kernel: Kernel,
    cfg: LaunchConfig,
    c: u64,
    /// `m, n, k, ldc, alpha, beta, out_f32, raster, group`.
    scalars: [ParamValue; 9],
    /// FP8 entries: `a_scale, b_scale` (appended to the parameters).
    scales: Option<[u64; 2]>,
    /// The block-scaled entry: `a_scales_ld, b_scales_ld` (appended after `scales`).
    scales_ld: Option<[u32; 2]>,
    /// Device addresses of the A, B, C maps.
    maps: [u64; 3],
}

/// Validated GEMM launches with their tensor maps in device memory ([`TcGemm::plan`],
/// [`TcGemm::plan_chain2`]). Borrows the operands: while it lives, A and B cannot be written
/// and C cannot be touched from the host API. Dropping it frees the map table stream-ordered
/// after every launch queued so far. To replay it from a CUDA graph, hand it to
/// [`crate::ordering::TaskGraph::gemm`]: the graph then owns it (issue 19, item 1).
pub struct TcGemmPlan<'a> {
    dev: &'a Device,
    stream: Stream,
    /// The tensor maps of the cooperative launches (none for a decode plan).
    table: Option<TensorMapTable<'a>>,
    launches: Vec<Prepared>,
    /// Decode-configuration launches (issue 20), queued after `launches`.
    decode: Vec<DecodeLaunch>,
    /// Swap-AB launches (issue 20; maps in `table`), queued last.
    swap_ab: Vec<SwapAbLaunch>,
    shapes: Vec<GemmShape>,
}

impl std::fmt::Debug for TcGemmPlan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcGemmPlan")
            .field("shapes", &self.shapes)
            .field(
                "launches",
                &self
                    .launches
                    .iter()
                    .map(|p| format!("{} {}", p.kernel.name(), p.cfg.describe()))
                    .chain(
                        self.decode
                            .iter()
                            .map(|d| format!("{} {}", d.kernel_name(), d.cfg.describe())),
                    )
                    .chain(self.swap_ab.iter().map(|s| {
                        format!("{} {} {:?}", s.kernel().name(), s.cfg.describe(), s.shape)
                    }))
                    .collect::<Vec<_>>(),
            )
            .field("table", &self.table)
            .finish()
    }
}

impl TcGemmPlan<'_> {
    /// Queues the plan's kernels on its stream, in order (`cuLaunchKernelEx`), each with the
    /// cluster dimension and, when asked, the PDL attribute. No copies: repeated launches
    /// overlap through PDL. Errors: [`Error::Launch`], [`Error::ContextPoisoned`].
    pub fn launch(&self) -> Result<()> {
        // SAFETY: the plan's own stream.
        unsafe { self.launch_on(&self.stream) }
    }

    /// [`TcGemmPlan::launch`] on `stream` (a task graph's private capture stream).
    ///
    /// # Safety
    /// `stream` is the plan's stream, or a stream capturing a graph that is launched only on the
    /// plan's stream (or ordered after that stream's earlier work and before its later work) while
    /// the plan lives, so the reasoning below holds for every replay.
    pub(crate) unsafe fn launch_on(&self, stream: &Stream) -> Result<()> {
        for p in &self.launches {
            let [sa, sb] = p.scales.unwrap_or([0; 2]);
            let [la, lb] = p.scales_ld.unwrap_or([0; 2]);
            let params = [
                ParamValue::new(p.maps[0]),
                ParamValue::new(p.maps[1]),
                ParamValue::new(p.maps[2]),
                ParamValue::new(p.c),
                p.scalars[0],
                p.scalars[1],
                p.scalars[2],
                p.scalars[3],
                p.scalars[4],
                p.scalars[5],
                p.scalars[6],
                p.scalars[7],
                p.scalars[8],
                ParamValue::new(sa),
                ParamValue::new(sb),
                ParamValue::new(la),
                ParamValue::new(lb),
            ];
            let params = match (p.scales, p.scales_ld) {
                (Some(_), Some(_)) => &params[..],
                (Some(_), None) => &params[..15],
                _ => &params[..13],
            };
            // SAFETY: the parameter list matches the entry (checked against the PTX at
            // TcGemm::new: 4 x u64, 4 x u32, 2 x f32, 3 x u32, in the contract's order, plus
            // 2 x u64 for the FP8 entries, which alone have `scales`: each scale address is 0 or
            // an f32 of a view the plan borrows, bound to this stream, so it is written by
            // nothing while the kernel may read it; plus 2 x u32 for the block-scaled entry,
            // which alone has `scales_ld`: its scale views were checked to hold the
            // `[ceil(K / 128)][a_scales_ld]` and `[ceil(N / 128)][b_scales_ld]` f32 it reads). The map
            // addresses point into the table, uploaded on this stream before any launch and
            // freed on it after the last; each map was encoded over a view the plan borrows
            // (A, B shared; C exclusively, so C aliases neither), with global dims equal to the
            // logical sizes, so TMA loads stay inside A and B (out-of-bounds boxes are zero-
            // filled) and stores inside C; `c`/`ldc` address the same C (the kernel reads
            // rows < m, columns < n only). The configuration was checked against the launch
            // limits (THREADS_PER_CTA threads, SMEM_BYTES, cluster 1 or 2 dividing the grid).
            // With PDL the kernel reads A, B and C only after `griddepcontrol.wait` (contract);
            // the table, which it reads before, was written by a copy that precedes every
            // launch of the plan on this stream and is never written again.
            // `stream` is the plan's stream or captured and replayed as if it were (contract).
            unsafe {
                launch_raw(self.dev, &p.kernel, stream, &p.cfg, params)?;
            }
        }
        for d in &self.decode {
            // SAFETY: prepared by DecodeGemm::prepare from views this plan borrows for 'a (A,
            // B shared, C exclusively), bound to this stream.
            unsafe { d.launch(self.dev, &self.stream)? };
        }
        for s in &self.swap_ab {
            // SAFETY: prepared by TcGemm::plan_swap_ab from views this plan borrows for 'a (A,
            // B, bias shared, C exclusively), bound to the plan's stream; its maps live in
            // `self.table`, uploaded on that stream before any launch and freed after the last;
            // `stream` is the plan's stream or captured and replayed as if it were (contract).
            unsafe { s.launch(self.dev, stream)? };
        }
        Ok(())
    }

    /// The configuration the plan runs ([`GemmConfig::Decode`] or
    /// [`GemmConfig::Cooperative128x256`]; never `Auto`).
    pub fn gemm_config(&self) -> GemmConfig {
        if !self.swap_ab.is_empty() {
            GemmConfig::SwapAb
        } else if self.decode.is_empty() {
            GemmConfig::Cooperative128x256
        } else {
            GemmConfig::Decode
        }
    }

    /// The swap-AB launch shapes (token tile, ksplit, grid), one per swap-AB launch.
    pub fn swap_ab_shapes(&self) -> Vec<SwapAbShape> {
        self.swap_ab.iter().map(|s| s.shape).collect()
    }

    /// Entry names of the plan's launches, in launch order.
    pub fn kernel_names(&self) -> Vec<String> {
        self.launches
            .iter()
            .map(|p| p.kernel.name().to_string())
            .chain(self.decode.iter().map(|d| d.kernel_name().to_string()))
            .chain(self.swap_ab.iter().map(|s| s.kernel().name().to_string()))
            .collect()
    }

    /// Problem size of each launch.
    pub fn shapes(&self) -> &[GemmShape] {
        &self.shapes
    }

    /// Launch configuration of each launch (grid, block, shared memory, cluster, PDL).
    pub fn configs(&self) -> Vec<LaunchConfig> {
        self.launches
            .iter()
            .map(|p| p.cfg)
            .chain(self.decode.iter().map(|d| d.cfg))
            .chain(self.swap_ab.iter().map(|s| s.cfg))
            .collect()
    }

    /// Floating-point operations of one [`TcGemmPlan::launch`].
    pub fn flops(&self) -> f64 {
        self.shapes.iter().map(GemmShape::flops).sum()
    }

    /// The stream the plan launches on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The kernel handles of the launches (each keeps the module loaded), for a captured graph
    /// to keep until its last replay completed.
    pub(crate) fn kernels(&self) -> Vec<Kernel> {
        self.launches
            .iter()
            .map(|p| p.kernel.clone())
            .chain(self.swap_ab.iter().map(|s| s.kernel().clone()))
            .collect()
    }
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

/// cuBLAS `cublasGemmEx` on one stream as the reference for the tensor-core GEMM: BF16/FP16
/// inputs, FP32 compute (`CUBLAS_COMPUTE_32F`, default math: tensor cores), f32 or 16-bit output,
/// with the same row-major layouts as [`TcGemm`]. cuBLAS is column-major: row-major
/// `C = A B` is computed as `C^T = B^T A^T` (B passed first: `N` for a row-major B, `T` for a
/// column-major one; A with `N`).
pub struct CublasGemmEx {
    blas: CudaBlas,
    stream: Stream,
}

impl CublasGemmEx {
    /// A cuBLAS handle bound to `stream` (a stream of `dev`). Errors: [`Error::WrongContext`],
    /// [`Error::Cublas`] (`cublasCreate`, `cublasSetStream`), [`Error::ContextPoisoned`].
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
        Ok(Self {
            blas,
            stream: stream.clone(),
        })
    }

    /// Queues `C = alpha * A * B + beta * C` (`cublasGemmEx`). Shapes and rules as
    /// [`TcGemm::plan`] (the same validation, though cuBLAS would not need 16-byte pitches), plus
    /// every size and pitch at most `i32::MAX`. Errors: those of [`check_shapes`],
    /// [`Error::WrongStream`], [`Error::TooLarge`], [`Error::Cublas`].
    #[allow(clippy::too_many_arguments)]
    pub fn gemm<T: TcInput, O: TcOutput<T>>(
        &self,
        a: &Matrix<'_, T>,
        b: &Matrix<'_, T>,
        layout: BLayout,
        c: &mut MatrixMut<'_, O>,
        alpha: f32,
        beta: f32,
    ) -> Result<()> {
        let shape = check_shapes(
            &a.dims(size_of::<T>()),
            &b.dims(size_of::<T>()),
            layout,
            &c.dims(size_of::<O>()),
        )?;
        check_stream("cublas A", a.view.stream(), &self.stream)?;
        check_stream("cublas B", b.view.stream(), &self.stream)?;
        check_stream("cublas C", c.view.stream(), &self.stream)?;
        let int = |v: usize, what: &'static str| -> Result<c_int> {
            c_int::try_from(v).map_err(|_| Error::TooLarge {
                what,
                value: v as u64,
                max: i32::MAX as u64,
            })
        };
        let (m, n, k) = (
            int(shape.m, "cublas M")?,
            int(shape.n, "cublas N")?,
            int(shape.k, "cublas K")?,
        );
        let (lda, ldb, ldc) = (
            int(a.pitch, "cublas lda")?,
            int(b.pitch, "cublas ldb")?,
            int(c.pitch, "cublas ldc")?,
        );
        use cublas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let op_b = match layout {
            BLayout::RowMajor => CUBLAS_OP_N,
            BLayout::ColMajor => CUBLAS_OP_T,
        };
        // cuBLAS runs in the current context: make it the handle's.
        crate::device::bind_context(self.stream.ctx(), "cublasGemmEx")?;
        // SAFETY: the operands were validated: each view holds (rows - 1) * pitch + cols
        // elements of its type, which is what cuBLAS reads/writes for these (m, n, k, ld); they
        // are bound to the handle's stream, so the call is ordered after their writers; alpha
        // and beta are host f32 (the handle's default pointer mode, CUBLAS_COMPUTE_32F) alive
        // for the call.
        let r = unsafe {
            cublas_result::gemm_ex(
                *self.blas.handle(),
                op_b,
                CUBLAS_OP_N,
                n,
                m,
                k,
                (&alpha as *const f32).cast(),
                b.view.device_ptr() as *const std::ffi::c_void,
                T::CUDA_TYPE,
                ldb,
                a.view.device_ptr() as *const std::ffi::c_void,
                T::CUDA_TYPE,
                lda,
                (&beta as *const f32).cast(),
                c.view.device_ptr() as *mut std::ffi::c_void,
                O::CUDA_TYPE,
                ldc,
                cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        cublas_call("cublasGemmEx", r)
    }
}

// ------------------------------------------------------------------------------------------------
// CPU reference
// ------------------------------------------------------------------------------------------------

/// Host copy of B with its layout, for [`reference_entry`].
#[derive(Clone, Copy, Debug)]
pub struct HostB<'h> {
    /// Elements as stored (see [`BLayout`]), widened to f32.
    pub data: &'h [f32],
    /// Row pitch, elements.
    pub pitch: usize,
    /// Layout.
    pub layout: BLayout,
}

impl HostB<'_> {
    /// `B[kk][j]` (logical `K x N`), or `None` if the element lies outside `data` (or its index
    /// overflows usize).
    pub fn at(&self, kk: usize, j: usize) -> Option<f32> {
        let (row, col) = match self.layout {
            BLayout::ColMajor => (j, kk),
            BLayout::RowMajor => (kk, j),
        };
        let at = row.checked_mul(self.pitch)?.checked_add(col)?;
        self.data.get(at).copied()
    }
}

/// `(sum_k A[i][k] B[k][j], sum_k |A[i][k] B[k][j]|)` in f64, for row `i` of a row-major A
/// (pitch `lda`, `k` columns; values already rounded to the input type and widened).
///
/// `None` if an element of row `i` of A or column `j` of B lies outside its slice (checked
/// index arithmetic: nothing is read out of bounds and nothing overflows).
pub fn reference_entry(
    a: &[f32],
    lda: usize,
    b: &HostB<'_>,
    k: usize,
    i: usize,
    j: usize,
) -> Option<(f64, f64)> {
    let row = i.checked_mul(lda)?;
    // The whole row first, so a `k` beyond the data fails fast instead of after k steps.
    let a_row = a.get(row..row.checked_add(k)?)?;
    let (mut s, mut abs) = (0f64, 0f64);
    for (kk, &x) in a_row.iter().enumerate() {
        let p = x as f64 * b.at(kk, j)? as f64;
        s += p;
        abs += p.abs();
    }
    Some((s, abs))
}

/// The relative bound the tests and `warpline gemm --verify` use for one element of
/// `alpha * A B + beta * C0` with BF16/FP16 inputs and FP32 accumulation:
/// `|got - want| <= ACC_REL * (|alpha| * sum_k |a_ik b_kj| + |beta * c0|)
/// + rounding * |want| + ABS_FLOOR`, with `rounding` the output type's half ulp.
///
/// Why: products of two BF16 (8-bit significands) or FP16 (11-bit) are exact in FP32, so the
/// error is the FP32 summation's: at most `K * 2^-24` relative to `sum |a b|` for a serial sum
/// (2.4e-4 at K = 4099), less for the tensor cores' tree of k16 blocks; the tensor cores' internal
/// accumulation truncates rather than rounds, which the factor of 4 over the serial bound at the
/// largest K tested covers. The epilogue's `alpha * acc + beta * c0` adds 2 FP32 roundings.
pub const ACC_REL: f64 = 1e-3;
/// Absolute floor of the bound (sums that cancel to about 0).
pub const ABS_FLOOR: f64 = 1e-6;

/// Allowed error of one output element (see [`ACC_REL`]).
pub fn tolerance(want: f64, abs_sum: f64, alpha: f64, beta_c0: f64, rounding: f64) -> f64 {
    ACC_REL * (alpha.abs() * abs_sum + beta_c0.abs()) + rounding * want.abs() + ABS_FLOOR
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(rows: usize, cols: usize, pitch: usize, elem: usize) -> MatrixDims {
        MatrixDims {
            rows,
            cols,
            pitch,
            len: (rows - 1) * pitch + cols,
            address: 1 << 20,
            elem_bytes: elem,
        }
    }

    #[test]
    fn balanced_grid_keeps_the_rounds_and_evens_the_units() {
        // 4096^3, clusters of 2 on 132 SMs: 256 units, 66 resident -> 4 rounds of 64.
        assert_eq!(balanced_clusters(256, 66), 64);
        // 8192^3: 1024 units -> 16 rounds of 64.
        assert_eq!(balanced_clusters(1024, 66), 64);
        // Fewer units than clusters: one cluster per unit.
        assert_eq!(balanced_clusters(5, 66), 5);
        for units in 1..2000u64 {
            for resident in [1u64, 7, 64, 66, 132] {
                let c = balanced_clusters(units, resident);
                assert!(
                    c >= 1 && c <= resident.min(units),
                    "{units} {resident} -> {c}"
                );
                assert_eq!(units.div_ceil(c), units.div_ceil(resident.min(units)));
            }
        }
    }

    #[test]
    fn rows_and_columns_stop_at_the_signed_32_bit_tma_coordinates() {
        let big = i32::MAX as usize;
        assert!(check_matrix("A", &dims(big, 8, 8, 2)).is_ok());
        assert!(matches!(
            check_matrix("A", &dims(big + 1, 8, 8, 2)),
            Err(Error::BadShape { .. })
        ));
        assert!(matches!(
            check_matrix("A", &dims(1, big + 1, big + 9, 2)),
            Err(Error::BadShape { .. })
        ));
    }

    #[test]
    fn a_band_wider_than_the_minor_dimension_is_clamped_to_it() {
        let shape = GemmShape {
            m: 1000,
            n: 700,
            k: 64,
        };
        // 1000 rows: 8 tiles of 128, 4 units of a cluster of 2; 700 columns: 3 tiles of 256.
        assert_eq!(shape.unit_grid(2, false), (4, 3));
        assert_eq!(shape.units_of(2, false), Some(12));
        assert_eq!(shape.band_group(2, false, Raster::AlongN, 1 << 31), 3);
        assert_eq!(shape.band_group(2, false, Raster::AlongM, 1 << 31), 4);
        assert_eq!(shape.band_group(2, false, Raster::AlongM, 2), 2);
    }

    #[test]
    fn shapes_of_any_size_with_16_byte_pitches_pass() {
        for (m, n, k) in [(1, 1, 1), (127, 129, 65), (4097, 257, 4099)] {
            let p16 = |c: usize| c.next_multiple_of(8);
            let p32 = |c: usize| c.next_multiple_of(4);
            let a = dims(m, k, p16(k), 2);
            for layout in [BLayout::ColMajor, BLayout::RowMajor] {
                let (r, c) = layout.stored(k, n);
                let b = dims(r, c, p16(c), 2);
                let out = dims(m, n, p32(n), 4);
                assert_eq!(
                    check_shapes(&a, &b, layout, &out).unwrap(),
                    GemmShape { m, n, k }
                );
            }
        }
    }

    #[test]
    fn pitch_alignment_is_a_typed_error_that_says_what_to_do() {
        let a = dims(4, 65, 65, 2);
        let b = dims(8, 72, 72, 2);
        let c = dims(4, 8, 8, 4);
        let e = check_shapes(&a, &b, BLayout::ColMajor, &c).unwrap_err();
        assert!(
            matches!(
                e,
                Error::PitchAlignment {
                    pitch: 65,
                    elem_bytes: 2,
                    ..
                }
            ),
            "{e}"
        );
        let m = e.to_string();
        assert!(
            m.contains("pad the row pitch") && m.contains("multiple of 8 elements"),
            "{m}"
        );
        // f32 C with pitch 6: 24 bytes.
        let a = dims(4, 72, 72, 2);
        let c = dims(4, 6, 6, 4);
        let b = dims(6, 72, 72, 2);
        let e = check_shapes(&a, &b, BLayout::ColMajor, &c).unwrap_err();
        assert!(
            matches!(
                e,
                Error::PitchAlignment {
                    pitch: 6,
                    elem_bytes: 4,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn misaligned_base_empty_short_and_mismatched_shapes() {
        let good = (dims(4, 8, 8, 2), dims(8, 8, 8, 2), dims(4, 8, 8, 4));
        let mut a = good.0;
        a.address += 2;
        assert!(matches!(
            check_shapes(&a, &good.1, BLayout::ColMajor, &good.2),
            Err(Error::Misaligned { align: 16, .. })
        ));
        let mut a = good.0;
        a.rows = 0;
        assert!(matches!(
            check_shapes(&a, &good.1, BLayout::ColMajor, &good.2),
            Err(Error::BadShape { .. })
        ));
        let mut a = good.0;
        a.len -= 1;
        assert!(matches!(
            check_shapes(&a, &good.1, BLayout::ColMajor, &good.2),
            Err(Error::LengthMismatch { .. })
        ));
        // pitch below the row.
        let a = MatrixDims { pitch: 0, ..good.0 };
        assert!(matches!(
            check_shapes(&a, &good.1, BLayout::ColMajor, &good.2),
            Err(Error::BadShape { .. })
        ));
        // K disagrees (B column-major is N x K: 8 x 16).
        let b = dims(8, 16, 16, 2);
        assert!(matches!(
            check_shapes(&good.0, &b, BLayout::ColMajor, &good.2),
            Err(Error::LengthMismatch { .. })
        ));
        // C of the wrong shape.
        let c = dims(5, 8, 8, 4);
        assert!(matches!(
            check_shapes(&good.0, &good.1, BLayout::ColMajor, &c),
            Err(Error::LengthMismatch { .. })
        ));
        // Sizes of 2^32 and more.
        let a = dims(1 << 32, 8, 8, 2);
        assert!(matches!(
            check_shapes(&a, &good.1, BLayout::ColMajor, &good.2),
            Err(Error::BadShape { .. })
        ));
    }

    #[test]
    fn units_and_cluster_rules() {
        let s = GemmShape {
            m: 4097,
            n: 257,
            k: 1,
        };
        // 33 M tiles, 2 N tiles.
        assert_eq!(s.units(1), Some(66));
        assert_eq!(s.units(2), Some(34));
        let k = contract::KERNEL_BF16_BCOL;
        assert!(check_cluster(k, 1).is_ok() && check_cluster(k, 2).is_ok());
        assert!(matches!(
            check_cluster(k, 4),
            Err(Error::UnsupportedClusterSize { cluster: 4, .. })
        ));
        assert_eq!(Raster::AlongM.code(), contract::RASTER_ALONG_M);
        assert_eq!(Raster::AlongN.code(), contract::RASTER_ALONG_N);
    }

    #[test]
    fn the_sm90a_module_has_the_contracts_entries_and_parameters() {
        // Fails until the lead's kernels are in the module (then: entries and parameter lists).
        check_module_entries(crate::SM90A_PTX).unwrap();
        crate::contract_check::check_contract(crate::SM90A_PTX, warpline_gpu::CONTRACT_HASH)
            .unwrap();
    }

    #[test]
    fn a_changed_parameter_list_is_caught() {
        let ptx = ".visible .entry tc_gemm_bf16_bcol(\n\t.param .u64 p0\n)\n{\n}\n";
        let e = check_module_entries(ptx).unwrap_err();
        assert!(matches!(e, Error::KernelSignatureMismatch { .. }), "{e}");
        let e = check_module_entries("").unwrap_err();
        assert!(matches!(e, Error::MissingKernel { .. }), "{e}");
    }

    #[test]
    fn reference_and_tolerance() {
        // A 2 x 3 (pitch 4), B column-major N=2 x K=3 (pitch 3).
        let a = [1.0, 2.0, 3.0, 9.0, -1.0, 0.5, 0.25, 9.0];
        let b = [1.0, 1.0, 1.0, 2.0, -2.0, 4.0];
        let hb = HostB {
            data: &b,
            pitch: 3,
            layout: BLayout::ColMajor,
        };
        assert_eq!(reference_entry(&a, 4, &hb, 3, 0, 0), Some((6.0, 6.0)));
        assert_eq!(
            reference_entry(&a, 4, &hb, 3, 1, 1),
            Some((-2.0 - 1.0 + 1.0, 2.0 + 1.0 + 1.0))
        );
        let t = tolerance(10.0, 100.0, 1.0, 0.0, 0.0);
        assert!((t - (0.1 + ABS_FLOOR)).abs() < 1e-12);
    }

    #[test]
    fn issue19_item14_reference_helpers_return_none_outside_their_slices() {
        let a = [1.0f32; 8];
        let b = [1.0f32; 6];
        let hb = HostB {
            data: &b,
            pitch: 3,
            layout: BLayout::ColMajor,
        };
        assert_eq!(hb.at(2, 1), Some(1.0));
        assert_eq!(hb.at(3, 1), None);
        assert_eq!(hb.at(0, usize::MAX), None);
        assert_eq!(
            reference_entry(&a, 4, &hb, 3, 2, 0),
            None,
            "row 2 of A is outside"
        );
        assert_eq!(
            reference_entry(&a, 4, &hb, 3, 0, 2),
            None,
            "column 2 of B is outside"
        );
        assert_eq!(reference_entry(&a, usize::MAX, &hb, 3, 2, 0), None);
        assert_eq!(reference_entry(&a, 4, &hb, usize::MAX, 0, 0), None);
        assert_eq!(reference_entry(&a, 4, &hb, 0, 1, 1), Some((0.0, 0.0)));
    }

    #[test]
    fn issue19_item14_units_and_check_matrix_do_not_overflow_on_absurd_sizes() {
        let s = GemmShape {
            m: usize::MAX,
            n: usize::MAX,
            k: usize::MAX,
        };
        assert_eq!(s.units(1), None);
        assert_eq!(s.units_of(u32::MAX, true), None);
        assert!(s.flops().is_finite());
        // 2^31 - 1 rows and columns: the largest check_shapes accepts, the product fits.
        let big = GemmShape {
            m: i32::MAX as usize,
            n: i32::MAX as usize,
            k: 1,
        };
        assert_eq!(big.units(1), Some((1u64 << 24) * (1 << 23)));
        // pitch x elem_bytes overflowed here.
        let e = check_matrix("A", &dims(1, 8, 8, usize::MAX)).unwrap_err();
        assert!(matches!(e, Error::PitchAlignment { .. }), "{e}");
    }

    use proptest::prelude::*;

    fn edge() -> impl Strategy<Value = usize> {
        prop_oneof![
            0usize..300,
            any::<usize>(),
            (0usize..4).prop_map(|d| i32::MAX as usize - 1 + d),
            (0usize..4).prop_map(|d| u32::MAX as usize - 1 + d),
            (0usize..4).prop_map(|d| usize::MAX - d),
        ]
    }

    fn any_dims() -> impl Strategy<Value = MatrixDims> {
        (
            edge(),
            edge(),
            edge(),
            edge(),
            any::<u64>(),
            prop_oneof![Just(2usize), Just(4), edge()],
        )
            .prop_map(|(rows, cols, pitch, len, address, elem_bytes)| MatrixDims {
                rows,
                cols,
                pitch,
                len,
                address: address & !0xf,
                elem_bytes,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn issue19_item14_shape_validation_is_total_and_sound(
            a in any_dims(),
            b in any_dims(),
            c in any_dims(),
            col in any::<bool>(),
            cluster in any::<u32>(),
        ) {
            let layout = if col { BLayout::ColMajor } else { BLayout::RowMajor };
            for d in [&a, &b, &c] {
                if check_matrix("x", d).is_ok() {
                    // What an accepted operand guarantees, in u128 arithmetic.
                    prop_assert!(d.rows >= 1 && d.cols >= 1);
                    prop_assert!(d.rows <= i32::MAX as usize && d.cols <= i32::MAX as usize);
                    prop_assert!(d.pitch >= d.cols && d.pitch <= u32::MAX as usize);
                    prop_assert_eq!((d.pitch as u128 * d.elem_bytes as u128) % 16, 0);
                    let need = (d.rows as u128 - 1) * d.pitch as u128 + d.cols as u128;
                    prop_assert!(need <= d.len as u128);
                }
            }
            if let Ok(s) = check_shapes(&a, &b, layout, &c) {
                prop_assert_eq!((s.m, s.k), (a.rows, a.cols));
                prop_assert_eq!((s.m, s.n), (c.rows, c.cols));
                let units = s.units_of(cluster, false);
                prop_assert!(units.is_some());
            }
            // Any shape: the units are the u128 product, or None when it does not fit u64.
            let s = GemmShape { m: a.rows, n: b.cols, k: c.pitch };
            for pingpong in [false, true] {
                let rows = if pingpong { contract::WG_M } else { contract::BM } as u128;
                let m_units = (s.m as u128).div_ceil(rows).div_ceil(cluster.max(1) as u128);
                let want = m_units * (s.n as u128).div_ceil(contract::BN as u128);
                prop_assert_eq!(s.units_of(cluster, pingpong).map(u128::from), u64::try_from(want).ok().map(u128::from));
            }
        }
    }

    /// Issue 19, item 19: the cluster error names the entry the launch would use, not always
    /// the bf16 one.
    #[test]
    fn issue19_item19_unsupported_cluster_names_the_kernel_used() {
        for name in ENTRIES {
            let e = check_cluster(name, 3).unwrap_err();
            let Error::UnsupportedClusterSize { kernel, .. } = &e else {
                panic!("{e}")
            };
            assert_eq!(*kernel, name);
            assert!(e.to_string().contains(name), "{e}");
        }
    }
}
