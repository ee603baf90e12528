//! Host side of the memory-bound decode GEMM (issue 20; kernels `decode_gemm_*` of the sm_90
//! module [`crate::PTX`], built from `gpu/src/kernels/decode_gemm.rs`; launch contract
//! `warpline_gpu::contract::decode_gemm`):
//!
//! `C[M,N] = alpha * A[M,K] * B[K,N] + beta * C` for few tokens, `1 <= M <= 64`, with B
//! column-major (the weights, stored as `N` rows of `K`: a PyTorch `Linear` weight), BF16 or
//! FP16 inputs, FP32 accumulation, FP32 or 16-bit (the input type) output. Layouts and pitch
//! rules are [`tc_gemm`](crate::kernels::tc_gemm)'s ([`check_shapes`](crate::kernels::tc_gemm::check_shapes)): every row pitch a multiple of 16 bytes,
//! every base 16-byte aligned, any M (up to 64), N, K >= 1.
//!
//! The kernel streams the weights once from DRAM with 16-byte loads, `mma.sync.m16n8k16` in
//! swap-AB form (16 weight rows x 8 tokens per MMA), and splits K between the warps of a CTA
//! with a deterministic shared-memory reduction (fixed order): the result is bitwise the same
//! from run to run for the same [`DecodeConfig`].
//!
//! [`TcGemm`](crate::kernels::TcGemm) uses it through [`GemmConfig`] (see
//! [`select_config`](crate::kernels::decode_gemm::select_config) for the rule
//! `Auto` follows); [`DecodeGemm`] is the launcher on its own.

use cudarc::cublas::sys as cublas_sys;
use warpline_gpu::contract::decode_gemm as contract;

use super::check_stream;
use super::operands::{check_shapes, BLayout, GemmShape, Matrix, MatrixMut, TcInput, TcOutput};
use crate::device::{Device, Kernel};
use crate::error::{CudaCall, Error, Result};
use crate::launch::{launch_raw, LaunchConfig, LaunchLimits, ParamValue};
use crate::module::{check_entry, RustParam, RustParamKind};
use crate::stream::Stream;

/// Which kernel configuration a [`TcGemm`](super::TcGemm) launch uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum GemmConfig {
    /// Chosen by [`select_config`] from the shape and the other options.
    #[default]
    Auto,
    /// The 128 x 256 cooperative (or, with `TcGemmOptions::pingpong`, ping-pong) tensor-core
    /// kernel of the sm_90a module.
    Cooperative128x256,
    /// The memory-bound decode kernel ([`DecodeGemm`]): `M <= 64`, B column-major.
    Decode,
    /// The swap-AB tensor-core kernel with split-K across a cluster
    /// ([`TcGemm::plan_fused`](super::TcGemm::plan_fused), `tc_gemm::swap_ab`): BF16, B
    /// column-major, any M (tiles of 8 to 128 tokens); fused epilogues.
    SwapAb,
}

impl GemmConfig {
    /// The names the CLI accepts (`--config NAME`): `auto`, `coop128x256`, `decode`, `swapab`.
    pub const NAMES: [&'static str; 4] = ["auto", "coop128x256", "decode", "swapab"];

    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Cooperative128x256 => "coop128x256",
            Self::Decode => "decode",
            Self::SwapAb => "swapab",
        }
    }

    /// Parses a CLI name ([`GemmConfig::NAMES`]). Errors: [`Error::BadShape`] naming the
    /// allowed values.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "auto" => Ok(Self::Auto),
            "coop128x256" | "cooperative" => Ok(Self::Cooperative128x256),
            "decode" => Ok(Self::Decode),
            "swapab" | "swap-ab" => Ok(Self::SwapAb),
            other => Err(Error::BadShape {
                what: "gemm --config",
                detail: format!("{other:?}; allowed: {}", Self::NAMES.join(", ")),
            }),
        }
    }
}

/// Largest M that [`GemmConfig::Auto`] sends to the decode kernel, for FP16 inputs (BF16 goes
/// to the swap-AB kernel, which was faster than the decode kernel's default configuration at
/// every decode shape, 1 to 64 tokens: H200, session 13, docs/perf-notes.md).
pub const AUTO_DECODE_MAX_M: usize = contract::MAX_M;

/// Largest M that [`GemmConfig::Auto`] sends to the swap-AB kernel (BF16 only; FP16 keeps the
/// decode kernel up to 64 rows and the cooperative kernel above).
pub const AUTO_SWAP_AB_MAX_M: usize = 128;

/// Largest M, and largest N, for which [`GemmConfig::Auto`] gives BF16 problems the decode
/// kernel ([`auto_decode_bf16`]) rather than the swap-AB kernel.
pub const AUTO_DECODE_BF16_MAX_M: usize = 8;
/// See [`AUTO_DECODE_BF16_MAX_M`].
pub const AUTO_DECODE_BF16_MAX_N: usize = 4096;

/// Whether [`GemmConfig::Auto`] runs a BF16 `shape` (B column-major, no cooperative knob set) on
/// the decode kernel, with [`DecodeConfig::auto_bf16`] unless the caller set `opts.decode`: at
/// most 8 rows and at most 4096 columns. There each CTA's 16 warps stream weight rows in
/// `mma.sync` tiles with the next k-block's tokens in registers, and nothing waits on a
/// cluster's DSMEM reduction (H200, session 21, `benches/decode_gemm`, the same run: 1 x 4096 x
/// 4096 13.01 us against the swap-AB kernel's 14.18 plain, 10.64 against 11.96 with PDL and
/// early weights; 8 x 4096 x 14336 33.80 against 34.56 and 31.04 against 34.07); with more
/// columns the swap-AB kernel is as fast or faster (1 x 6144 x 4096 with PDL: 17.52 against
/// 16.58; 8 x 14336 x 4096: 36.08 against 35.31 plain), and from 16 rows it is faster. The
/// measurement reads the weights from DRAM, as a decode step does; with one 32 MB weight matrix
/// left in L2 (`benches/tc_gemm`, same session) the swap-AB kernel was faster at 8 x 4096 x 4096
/// (10.3 against 11.4 us) and about even at 1 x 4096 x 4096 (10.1 against 9.8 us).
pub fn auto_decode_bf16(shape: GemmShape) -> bool {
    shape.m <= AUTO_DECODE_BF16_MAX_M && shape.n <= AUTO_DECODE_BF16_MAX_N
}

/// Smallest N for which [`GemmConfig::Auto`] gives BF16 problems of `AUTO_DECODE_MAX_M < M <=
/// AUTO_SWAP_AB_MAX_M` rows (65 to 128) the cooperative kernel in its ping-pong form rather than
/// the swap-AB kernel ([`auto_pingpong`]).
pub const AUTO_PINGPONG_MIN_N: usize = 12288;

/// Whether [`GemmConfig::Auto`] runs a BF16 `shape` (B column-major, no cooperative knob set)
/// on the cooperative kernel's ping-pong form ([`TcGemm::plan`](super::TcGemm::plan) then sets
/// `pingpong`; the cluster stays the default, 2 where it fits): 65 to 128 rows with `N >=
/// AUTO_PINGPONG_MIN_N`. There each consumer warpgroup's 64 x 256 tiles keep the tensor cores
/// fed, while the swap-AB kernel's 128-token tiles read slower than the ping-pong kernel per SM
/// (H200, session 21, `benches/tc_gemm`, x cuBLAS in the same run: 128 x 14336 x 4096 ping-pong
/// 1.000, swap-AB 0.769; 128 x 28672 x 4096 1.042 against 0.774; 128 x 12288 x 5376 0.86-0.975
/// against 0.70-0.80; 96 x 14336 x 4096 0.925 against 0.641; 65 x 14336 x 4096 0.853 against
/// 0.539), and narrower N leaves the ping-pong grid too few tiles (128 x 6144 x 4096: 0.62
/// against 0.80; 128 x 4096 x 4096 0.59 against 1.04).
pub fn auto_pingpong(shape: GemmShape) -> bool {
    shape.m > AUTO_DECODE_MAX_M && shape.m <= AUTO_SWAP_AB_MAX_M && shape.n >= AUTO_PINGPONG_MIN_N
}

/// The selection rule of [`GemmConfig::Auto`] (explicit choices are returned unchanged). With B
/// column-major and none of the cooperative kernel's own knobs set (`cooperative_knobs`:
/// ping-pong, cluster size, cluster count):
/// - [`GemmConfig::SwapAb`] when `M <= AUTO_SWAP_AB_MAX_M` (128): too few 128-row tiles for the
///   cooperative kernel to fill the SMs, while 64 weight rows x M tokens, split along K over a
///   cluster, do. It beat the decode kernel's default configuration at every decode shape from
///   1 token up (H200, session 13: 13.8 against 14.6 us at 1 x 4096 x 4096, 66.0 against 78.2 at
///   8 x 28672 x 4096). A BF16-only kernel: for FP16, [`select_config_f16`] sends `M <=
///   AUTO_DECODE_MAX_M` (64) to [`GemmConfig::Decode`] instead. Except where [`auto_pingpong`]
///   holds (65 to 128 rows, `N >= AUTO_PINGPONG_MIN_N`): the cooperative kernel, ping-pong;
///   and where [`auto_decode_bf16`] holds (at most 8 rows and 4096 columns): the decode kernel;
/// - otherwise [`GemmConfig::Cooperative128x256`].
///
/// A row-major B always gets the cooperative kernel. Pure: no device needed.
pub fn select_config(
    requested: GemmConfig,
    shape: GemmShape,
    layout: BLayout,
    cooperative_knobs: bool,
) -> GemmConfig {
    let skinny = layout == BLayout::ColMajor && !cooperative_knobs;
    match requested {
        GemmConfig::Auto if skinny && auto_decode_bf16(shape) => GemmConfig::Decode,
        GemmConfig::Auto if skinny && shape.m <= AUTO_SWAP_AB_MAX_M && !auto_pingpong(shape) => {
            GemmConfig::SwapAb
        }
        GemmConfig::Auto => GemmConfig::Cooperative128x256,
        explicit => explicit,
    }
}

/// [`select_config`] for FP16 inputs, which the swap-AB kernel does not take: the decode kernel
/// up to its 64 rows, else the cooperative kernel.
pub fn select_config_f16(
    requested: GemmConfig,
    shape: GemmShape,
    layout: BLayout,
    cooperative_knobs: bool,
) -> GemmConfig {
    match select_config(requested, shape, layout, cooperative_knobs) {
        GemmConfig::SwapAb if requested == GemmConfig::Auto => {
            if shape.m <= AUTO_DECODE_MAX_M {
                GemmConfig::Decode
            } else {
                GemmConfig::Cooperative128x256
            }
        }
        c => c,
    }
}

/// The tunables of one decode launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DecodeConfig {
    /// Warps per CTA: one of `contract::WARPS` (4, 8, 16).
    pub warps: u32,
    /// Warps that split the K of one row tile (16 output columns): 1, 2, 4, 8 or 16, dividing
    /// `warps`; `None`: [`default_ksplit`].
    pub ksplit: Option<u32>,
    /// k-steps of 32 per k-block (loads in flight per lane: `2 * unroll` 16-byte vectors, twice
    /// that with the double buffer): 2 or 4.
    pub unroll: u32,
    /// Stream the weights with the `.L2::256B` prefetch-size hint (`ld.global.nc.L1::no_allocate
    /// .L2::256B`): L2 fetches 256-byte blocks of a weight row from DRAM.
    pub l2_prefetch: bool,
    /// Row tiles (16 output columns each) per warp: 1, or 2 (`contract::MAX_ROW_TILES`; entries
    /// `..._r2`, up to 32 tokens): each token fragment a warp loads feeds the MMAs of both
    /// tiles, halving the token (A) reads per weight byte, and each lane keeps twice the weight
    /// bytes in flight (issue 20, notes/decode-m16.md).
    pub row_tiles: u32,
    /// Load the token (A) fragments of the next k-block one k-block ahead, with its weights
    /// (entries `..._pa`; `unroll` 2 only; with 2 row tiles up to 32 tokens), so the A latency
    /// leaves each
    /// k-block's critical path (issue 20, notes/decode-m16.md). Still after
    /// `griddepcontrol.wait`.
    pub prefetch_a: bool,
}

impl Default for DecodeConfig {
    fn default() -> Self {
        Self {
            warps: 8,
            ksplit: None,
            unroll: 4,
            l2_prefetch: true,
            row_tiles: 1,
            prefetch_a: false,
        }
    }
}

impl DecodeConfig {
    /// The configuration [`GemmConfig::Auto`] gives BF16 problems it sends to the decode kernel
    /// ([`auto_decode_bf16`]) when the caller left `TcGemmOptions::decode` at its default: 16
    /// warps, the launcher's ksplit, unroll 2, the L2 prefetch hint, two row tiles per warp and
    /// the tokens one k-block ahead (entries `..._r2_pa`; measured fastest at 1 to 8 tokens,
    /// `benches/decode_gemm`).
    pub const fn auto_bf16() -> Self {
        Self {
            warps: 16,
            ksplit: None,
            unroll: 2,
            l2_prefetch: true,
            row_tiles: 2,
            prefetch_a: true,
        }
    }

    /// Every combination the bench sweeps: warps {4, 8, 16} x ksplit {1, 2, 4, 8, 16 dividing
    /// warps} x unroll {2, 4} x L2 prefetch {on, off} x row tiles {1, 2} x A prefetch {off, on
    /// (unroll 2 only)}. (Row tiles 2 has entries for up to 32 tokens only: [`launch_shape`]
    /// refuses it above.)
    pub fn sweep() -> Vec<Self> {
        let mut v = Vec::new();
        for row_tiles in [1u32, 2] {
            for warps in contract::WARPS {
                for ks in [1u32, 2, 4, 8, 16] {
                    if ks <= warps && warps.is_multiple_of(ks) {
                        for unroll in [2u32, 4] {
                            for prefetch_a in [false, true] {
                                if prefetch_a && unroll != 2 {
                                    continue;
                                }
                                for l2_prefetch in [true, false] {
                                    v.push(Self {
                                        warps,
                                        ksplit: Some(ks),
                                        unroll,
                                        l2_prefetch,
                                        row_tiles,
                                        prefetch_a,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        v
    }

    /// `w{warps}_ks{ksplit|auto}_u{unroll}` plus `_pf` with the L2 prefetch, `_r{row_tiles}`
    /// for more than one row tile per warp and `_pa` with the A prefetch, for tables.
    pub fn label(&self) -> String {
        let ks = self.ksplit.map_or("auto".to_string(), |k| k.to_string());
        let pf = if self.l2_prefetch { "_pf" } else { "" };
        let r = if self.row_tiles == 1 {
            String::new()
        } else {
            format!("_r{}", self.row_tiles)
        };
        let pa = if self.prefetch_a { "_pa" } else { "" };
        format!("w{}_ks{ks}_u{}{pf}{r}{pa}", self.warps, self.unroll)
    }
}

/// Options of a decode launch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DecodeGemmOptions {
    /// The tunables.
    pub config: DecodeConfig,
    /// Launch with Programmatic Dependent Launch: the kernel may start while the previous
    /// kernel on the stream finishes; it reads A and C (and, unless
    /// [`DecodeGemmOptions::with_weights_before_wait`], B) only after `griddepcontrol.wait`.
    pub pdl: bool,
    weights_early: bool,
}

impl DecodeGemmOptions {
    /// Options with `config` and `pdl` (weights read after `griddepcontrol.wait`).
    pub fn new(config: DecodeConfig, pdl: bool) -> Self {
        Self {
            config,
            pdl,
            weights_early: false,
        }
    }

    /// The same options, but the kernel loads its first k-block of weights (B) *before*
    /// `griddepcontrol.wait`, overlapping the weight stream with the predecessor's tail (what
    /// a PDL decode chain gains from; ../shared/docs/pdl-prefetch.md).
    ///
    /// # Safety
    /// No kernel that may still be running when a launch of this plan starts (the preceding
    /// kernel on the stream, when launched with PDL) writes B: those early reads are not
    /// ordered after it.
    pub unsafe fn with_weights_before_wait(mut self) -> Self {
        self.weights_early = true;
        self
    }

    /// Whether [`DecodeGemmOptions::with_weights_before_wait`] was applied.
    pub fn weights_before_wait(&self) -> bool {
        self.weights_early
    }
}

/// Token tiles (of 8) the entry for `m` tokens has: the smallest of 1, 2, 4, 8 with `8 * tiles
/// >= m`; `None` for `m == 0` or `m > 64`.
pub fn token_tiles(m: usize) -> Option<usize> {
    [1usize, 2, 4, 8]
        .into_iter()
        .find(|&t| m >= 1 && m <= t * contract::TOKENS_PER_TILE)
}

/// The k-split the launcher uses when [`DecodeConfig::ksplit`] is `None`, for `n x k` weights
/// on `sms` SMs with CTAs of `warps` warps and k-blocks of `32 * unroll`: the smallest power of
/// two (dividing `warps`) that gives at least 16 warps per SM over the grid
/// (`ceil(n / 16) * ksplit >= 16 * sms`), but never more than there are k-blocks.
pub fn default_ksplit(n: usize, k: usize, sms: u32, warps: u32, unroll: u32) -> u32 {
    let tiles = n.div_ceil(contract::ROWS) as u64;
    let target = 16 * sms.max(1) as u64;
    let blocks = k.div_ceil(contract::K_STEP * unroll.max(1) as usize) as u64;
    let mut ks = 1u32;
    while ks < warps && tiles * (ks as u64) < target && (2 * ks as u64) <= blocks {
        ks *= 2;
    }
    ks
}

/// One checked launch shape (no device needed to compute it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeLaunchShape {
    /// Entry name.
    pub kernel: &'static str,
    /// Token tiles of the entry.
    pub token_tiles: usize,
    /// Warps per CTA.
    pub warps: u32,
    /// Warps per row tile.
    pub ksplit: u32,
    /// k-steps per k-block.
    pub unroll: u32,
    /// Row tiles (16 output columns) per warp.
    pub row_tiles: u32,
    /// Token fragments loaded one k-block ahead.
    pub prefetch_a: bool,
    /// CTAs: `ceil(ceil(N / (16 * row_tiles)) / (warps / ksplit))`.
    pub grid: u32,
    /// Dynamic shared memory, bytes.
    pub smem_bytes: u32,
}

/// Picks and checks the entry and the launch shape for `shape` with inputs of BF16 (`bf16`) or
/// FP16, without a device (`sms`: SM count, for [`default_ksplit`]).
///
/// Errors: [`Error::BadShape`] for `M` above 64 (the decode kernel's limit; use the cooperative
/// configuration), warps not in `contract::WARPS`, `ksplit` 0 or not dividing `warps`, `unroll`
/// not 2 or 4, `row_tiles` not 1 or 2, no entry for the combination (2 row tiles serve at most
/// 32 tokens; the A prefetch needs unroll 2), or a grid above `MAX_GRID`.
pub fn launch_shape(
    shape: GemmShape,
    bf16: bool,
    cfg: &DecodeConfig,
    sms: u32,
) -> Result<DecodeLaunchShape> {
    let tiles = token_tiles(shape.m).ok_or_else(|| Error::BadShape {
        what: "decode gemm M (tokens)",
        detail: format!(
            "M = {}; the decode configuration serves 1 to {} tokens (use the cooperative configuration)",
            shape.m,
            contract::MAX_M
        ),
    })?;
    if !contract::WARPS.contains(&cfg.warps) {
        return Err(Error::BadShape {
            what: "decode gemm warps per CTA",
            detail: format!("{}; allowed: {:?}", cfg.warps, contract::WARPS),
        });
    }
    if cfg.unroll != 2 && cfg.unroll != 4 {
        return Err(Error::BadShape {
            what: "decode gemm unroll (k-steps per k-block)",
            detail: format!("{}; allowed: 2 or 4", cfg.unroll),
        });
    }
    if cfg.row_tiles == 0 || cfg.row_tiles as usize > contract::MAX_ROW_TILES {
        return Err(Error::BadShape {
            what: "decode gemm row tiles per warp",
            detail: format!(
                "{}; allowed: 1 to {}",
                cfg.row_tiles,
                contract::MAX_ROW_TILES
            ),
        });
    }
    let row_tiles = cfg.row_tiles as usize;
    let ksplit = match cfg.ksplit {
        Some(ks) => {
            if ks == 0 || !cfg.warps.is_multiple_of(ks) {
                return Err(Error::BadShape {
                    what: "decode gemm ksplit",
                    detail: format!(
                        "{ks} warps per row tile with {} warps per CTA; allowed: a divisor of the warps (1 .. {})",
                        cfg.warps, cfg.warps
                    ),
                });
            }
            ks
        }
        // ceil(ceil(N / R) / 16) = ceil(N / (16 R)): the warps' tiles of 16 R columns.
        None => default_ksplit(
            shape.n.div_ceil(row_tiles),
            shape.k,
            sms,
            cfg.warps,
            cfg.unroll,
        ),
    };
    let variant = contract::VARIANTS
        .iter()
        .find(|v| {
            v.bf16 == bf16
                && v.token_tiles == tiles
                && v.unroll == cfg.unroll as usize
                && v.row_tiles == row_tiles
                && v.prefetch_a == cfg.prefetch_a
        })
        .ok_or_else(|| Error::BadShape {
            what: "decode gemm variant",
            detail: format!(
                "no entry for bf16 = {bf16}, {tiles} token tiles (M = {}), unroll {}, {row_tiles} row tiles per warp, A prefetch {}; 2 row tiles serve at most 32 tokens, the A prefetch needs unroll 2",
                shape.m, cfg.unroll, cfg.prefetch_a
            ),
        })?;
    let warp_tiles = shape.n.div_ceil(contract::ROWS * row_tiles) as u64;
    let per_cta = (cfg.warps / ksplit) as u64;
    let grid = warp_tiles.div_ceil(per_cta);
    if grid == 0 || grid > super::MAX_GRID as u64 {
        return Err(Error::BadShape {
            what: "decode gemm grid",
            detail: format!("{grid} CTAs; 1 to 2^31 - 1 are allowed"),
        });
    }
    Ok(DecodeLaunchShape {
        kernel: variant.kernel,
        token_tiles: tiles,
        warps: cfg.warps,
        ksplit,
        unroll: cfg.unroll,
        row_tiles: cfg.row_tiles,
        prefetch_a: cfg.prefetch_a,
        grid: grid as u32,
        smem_bytes: contract::smem_bytes(cfg.warps, tiles * row_tiles) as u32,
    })
}

/// The Rust view of the entries' parameter list (checked against the PTX at
/// [`DecodeGemm::new`]).
fn rust_params() -> Vec<RustParam> {
    let p = |t: &str, size, kind| RustParam {
        rust_type: t.to_string(),
        size,
        kind,
    };
    use RustParamKind::{Address, Float, Int};
    vec![
        p("a: u64", 8, Address),
        p("b: u64", 8, Address),
        p("c: u64", 8, Address),
        p("m: u32", 4, Int),
        p("n: u32", 4, Int),
        p("k: u32", 4, Int),
        p("lda: u32", 4, Int),
        p("ldb: u32", 4, Int),
        p("ldc: u32", 4, Int),
        p("alpha: f32", 4, Float),
        p("beta: f32", 4, Float),
        p("out_f32: u32", 4, Int),
        p("ksplit: u32", 4, Int),
        p("flags: u32", 4, Int),
    ]
}

/// Checks that `ptx` has every entry of `contract::VARIANTS` with the contract's parameter list,
/// without a device. Errors: [`Error::MissingKernel`], [`Error::KernelSignatureMismatch`],
/// [`Error::PtxSignature`].
pub fn check_module_entries(ptx: &str) -> Result<()> {
    let entries = crate::module::ptx_signatures(ptx);
    let rust = rust_params();
    for v in contract::VARIANTS {
        check_entry(&entries, v.kernel, &rust)?;
    }
    Ok(())
}

fn is_bf16<T: TcInput>() -> bool {
    matches!(T::CUDA_TYPE, cublas_sys::cudaDataType::CUDA_R_16BF)
}

/// The decode GEMM launcher of one device: the entries of the device's sm_90 module, their
/// shared-memory limit raised to `contract::MAX_SMEM_BYTES`.
#[derive(Debug)]
pub struct DecodeGemm<'d> {
    dev: &'d Device,
}

impl<'d> DecodeGemm<'d> {
    /// Checks that `dev`'s module ([`Device::ptx`]) has every `decode_gemm_*` entry with the
    /// contract's parameter list and raises their dynamic shared-memory limit.
    ///
    /// Errors: [`Error::MissingKernel`], [`Error::KernelSignatureMismatch`],
    /// [`Error::PtxSignature`] (checked on the PTX text); [`Error::TooLarge`], [`Error::Cuda`]
    /// from the attribute.
    pub fn new(dev: &'d Device) -> Result<Self> {
        check_module_entries(dev.ptx())?;
        for v in contract::VARIANTS {
            dev.kernel(v.kernel)?
                .raise_max_dynamic_shared_memory(contract::MAX_SMEM_BYTES)?;
        }
        Ok(Self { dev })
    }

    /// The device.
    pub fn device(&self) -> &'d Device {
        self.dev
    }

    /// Validates `C = alpha * A * B + beta * C` for the decode kernel and prepares its launch
    /// on `stream`; nothing is queued until [`DecodePlan::launch`]. The plan borrows A, B
    /// (shared) and C (exclusively) for its lifetime.
    ///
    /// Shapes: A `M x K` row-major with `1 <= M <= 64`; B column-major (`layout` must be
    /// [`BLayout::ColMajor`]: stored `N x K`); C `M x N` row-major; pitches in elements, each a
    /// multiple of 16 bytes and at least the row; bases 16-byte aligned (the rules of
    /// [`check_shapes`]). C is read only when `beta != 0`.
    ///
    /// Errors, all before anything is queued: [`Error::WrongContext`], [`Error::WrongStream`],
    /// those of [`check_shapes`], [`Error::BadShape`] (row-major B, M above 64, a bad
    /// [`DecodeConfig`], grid too large), [`Error::TooLarge`] (CTA larger than the entry's
    /// register-limited maximum), the launch-limit errors of [`LaunchConfig::check`],
    /// [`Error::MissingKernel`].
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
        opts: &DecodeGemmOptions,
    ) -> Result<DecodePlan<'a>> {
        let launch = self.prepare(stream, &a, &b, layout, &c, alpha, beta, opts)?;
        Ok(DecodePlan {
            dev: self.dev,
            stream: stream.clone(),
            launch,
            _borrows: std::marker::PhantomData,
        })
    }

    /// Validates one launch (see [`DecodeGemm::plan`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prepare<T: TcInput, O: TcOutput<T>>(
        &self,
        stream: &Stream,
        a: &Matrix<'_, T>,
        b: &Matrix<'_, T>,
        layout: BLayout,
        c: &MatrixMut<'_, O>,
        alpha: f32,
        beta: f32,
        opts: &DecodeGemmOptions,
    ) -> Result<DecodeLaunch> {
        if stream.context_raw() != self.dev.raw_context() {
            return Err(Error::WrongContext {
                what: "decode gemm stream",
            });
        }
        if layout != BLayout::ColMajor {
            return Err(Error::BadShape {
                what: "decode gemm B layout",
                detail: format!(
                    "{layout:?}; the decode configuration reads B column-major only (weights stored N x K, K contiguous); use the cooperative configuration for a row-major B"
                ),
            });
        }
        let shape = check_shapes(
            &dims(&a.view, a.rows, a.cols, a.pitch, size_of::<T>()),
            &dims(&b.view, b.rows, b.cols, b.pitch, size_of::<T>()),
            layout,
            &dims_mut(&c.view, c.rows, c.cols, c.pitch, size_of::<O>()),
        )?;
        check_stream("decode gemm A", a.view.stream(), stream)?;
        check_stream("decode gemm B", b.view.stream(), stream)?;
        check_stream("decode gemm C", c.view.stream(), stream)?;
        let ls = launch_shape(
            shape,
            is_bf16::<T>(),
            &opts.config,
            self.dev.capabilities().sm_count,
        )?;
        let kernel = self.dev.kernel(ls.kernel)?;
        let threads = ls.warps * 32;
        // Registers limit the CTA size per entry (e.g. 153 registers: at most 384 threads).
        let max_threads = kernel
            .func
            .max_threads_per_block()
            .call("cuFuncGetAttribute")?;
        if threads as i64 > max_threads as i64 {
            return Err(Error::TooLarge {
                what: "decode gemm threads per CTA (the entry's register-limited maximum)",
                value: threads as u64,
                max: max_threads.max(0) as u64,
            });
        }
        let cfg = LaunchConfig::linear(ls.grid, threads, ls.smem_bytes).with_pdl(opts.pdl);
        cfg.check(ls.kernel, &LaunchLimits::of(self.dev, kernel))?;
        Ok(DecodeLaunch {
            kernel: kernel.clone(),
            cfg,
            shape,
            launch_shape: ls,
            params: [
                ParamValue::new(a.view.device_ptr()),
                ParamValue::new(b.view.device_ptr()),
                ParamValue::new(c.view.device_ptr()),
                ParamValue::new(shape.m as u32),
                ParamValue::new(shape.n as u32),
                ParamValue::new(shape.k as u32),
                ParamValue::new(a.pitch as u32),
                ParamValue::new(b.pitch as u32),
                ParamValue::new(c.pitch as u32),
                ParamValue::new(alpha),
                ParamValue::new(beta),
                ParamValue::new(O::IS_F32 as u32),
                ParamValue::new(ls.ksplit),
                ParamValue::new(
                    if opts.weights_early {
                        contract::FLAG_WEIGHTS_EARLY
                    } else {
                        0
                    } | if opts.config.l2_prefetch {
                        contract::FLAG_L2_PREFETCH_256
                    } else {
                        0
                    },
                ),
            ],
        })
    }
}

fn dims<T>(
    view: &crate::memory::DeviceView<'_, T>,
    rows: usize,
    cols: usize,
    pitch: usize,
    elem_bytes: usize,
) -> super::operands::MatrixDims {
    super::operands::MatrixDims {
        rows,
        cols,
        pitch,
        len: view.len(),
        address: view.device_ptr(),
        elem_bytes,
    }
}

fn dims_mut<T>(
    view: &crate::memory::DeviceViewMut<'_, T>,
    rows: usize,
    cols: usize,
    pitch: usize,
    elem_bytes: usize,
) -> super::operands::MatrixDims {
    super::operands::MatrixDims {
        rows,
        cols,
        pitch,
        len: view.len(),
        address: view.device_ptr(),
        elem_bytes,
    }
}

/// One validated decode launch.
#[derive(Clone, Debug)]
pub(crate) struct DecodeLaunch {
    kernel: Kernel,
    pub(crate) cfg: LaunchConfig,
    pub(crate) shape: GemmShape,
    pub(crate) launch_shape: DecodeLaunchShape,
    params: [ParamValue; 14],
}

impl DecodeLaunch {
    /// # Safety
    /// The addresses in `params` are still valid (the views it was prepared from are borrowed
    /// by the caller's plan) and `stream` is the stream they are bound to.
    pub(crate) unsafe fn launch(&self, dev: &Device, stream: &Stream) -> Result<()> {
        // SAFETY: the parameter list matches the entry (checked against the PTX at
        // DecodeGemm::new: 3 x u64, 6 x u32, 2 x f32, 3 x u32). A, B, C were checked by
        // check_shapes: `(rows - 1) * pitch + cols` elements within each view, pitches and
        // bases 16-byte aligned, so the kernel's reads (rows < m of A, rows < n of B, columns
        // < k) and writes (C rows < m, columns < n) stay inside them; C is an exclusive view,
        // aliasing neither A nor B; m <= 8 * token tiles of the entry; the block is 32 * warps
        // threads with ksplit dividing warps and the entry's smem_bytes of dynamic shared
        // memory (the kernel traps otherwise); the L2 prefetch-size hint never reads outside
        // the 256-byte block of an address the kernel loads and never faults; with
        // FLAG_WEIGHTS_EARLY the caller vouched (unsafe
        // DecodeGemmOptions::with_weights_before_wait) that no running kernel writes B. The
        // views stay borrowed by the plan (caller's contract), bound to `stream`.
        unsafe { launch_raw(dev, &self.kernel, stream, &self.cfg, &self.params) }
    }

    /// Entry name.
    pub(crate) fn kernel_name(&self) -> &str {
        self.kernel.name()
    }
}

/// A validated decode GEMM launch ([`DecodeGemm::plan`]). Borrows the operands: while it lives,
/// A and B cannot be written and C cannot be touched from the host API.
pub struct DecodePlan<'a> {
    dev: &'a Device,
    stream: Stream,
    launch: DecodeLaunch,
    _borrows: std::marker::PhantomData<&'a mut ()>,
}

impl std::fmt::Debug for DecodePlan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodePlan")
            .field("shape", &self.launch.shape)
            .field("kernel", &self.launch.kernel_name())
            .field("launch", &self.launch.launch_shape)
            .field("config", &self.launch.cfg.describe())
            .finish()
    }
}

impl DecodePlan<'_> {
    /// Queues the kernel on the plan's stream (with the PDL attribute when asked), as often as
    /// wanted. Errors: [`Error::Launch`], [`Error::ContextPoisoned`].
    pub fn launch(&self) -> Result<()> {
        // SAFETY: the plan borrows A, B and C for its lifetime ('a), so the addresses stay
        // valid and C unaliased; the stream is the one the views are bound to (checked).
        unsafe { self.launch.launch(self.dev, &self.stream) }
    }

    /// The problem size.
    pub fn shape(&self) -> GemmShape {
        self.launch.shape
    }

    /// The entry and launch shape.
    pub fn launch_shape(&self) -> DecodeLaunchShape {
        self.launch.launch_shape
    }

    /// The launch configuration (grid, block, shared memory, PDL).
    pub fn config(&self) -> LaunchConfig {
        self.launch.cfg
    }

    /// Bytes of weights one launch reads (`N * K * 2`).
    pub fn weight_bytes(&self) -> f64 {
        let s = self.launch.shape;
        s.n as f64 * s.k as f64 * contract::IN_BYTES as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(m: usize, n: usize, k: usize) -> GemmShape {
        GemmShape { m, n, k }
    }

    #[test]
    fn issue20_decode_entries_in_embedded_ptx() {
        check_module_entries(crate::PTX).unwrap();
        // A module without them is refused with a typed error.
        assert!(matches!(
            check_module_entries(".version 8.0\n.target sm_90\n"),
            Err(Error::MissingKernel { .. })
        ));
    }

    #[test]
    fn issue20_decode_selection_rule() {
        let col = BLayout::ColMajor;
        for m in [1, 2, 7, 8, 9, 16, 17, 33, 64, 65, 127, 128] {
            // BF16: the decode kernel up to 8 rows at 4096 columns, then the swap-AB kernel.
            assert_eq!(
                select_config(GemmConfig::Auto, shape(m, 4096, 4096), col, false),
                if m <= 8 {
                    GemmConfig::Decode
                } else {
                    GemmConfig::SwapAb
                },
                "M = {m}"
            );
            assert_eq!(
                select_config(GemmConfig::Auto, shape(m, 4097, 4096), col, false),
                GemmConfig::SwapAb,
                "M = {m}"
            );
            // FP16: the decode kernel up to 64 rows, then the cooperative one.
            assert_eq!(
                select_config_f16(GemmConfig::Auto, shape(m, 4096, 4096), col, false),
                if m <= 64 {
                    GemmConfig::Decode
                } else {
                    GemmConfig::Cooperative128x256
                },
                "M = {m}"
            );
        }
        for m in [129, 4096] {
            assert_eq!(
                select_config(GemmConfig::Auto, shape(m, 4096, 4096), col, false),
                GemmConfig::Cooperative128x256,
                "M = {m}"
            );
        }
        // Auto's BF16 decode configuration has an entry at every shape the rule sends it.
        for m in 1..=AUTO_DECODE_BF16_MAX_M {
            for (n, k) in [(1, 8), (1003, 2056), (4096, 4096), (4096, 14336)] {
                assert!(auto_decode_bf16(shape(m, n, k)));
                let ls = launch_shape(shape(m, n, k), true, &DecodeConfig::auto_bf16(), 132)
                    .unwrap_or_else(|e| panic!("{m} x {n} x {k}: {e}"));
                assert_eq!(ls.kernel, "decode_gemm_bf16_t1_u2_r2_pa", "{m} x {n} x {k}");
            }
        }
        // 65 to 128 rows with N >= 12288: the cooperative kernel (ping-pong, set by the plan).
        for (m, n, coop) in [
            (64, 28672, false),
            (65, 12288, true),
            (128, 14336, true),
            (128, 12287, false),
            (128, 6144, false),
            (129, 28672, true),
        ] {
            assert_eq!(
                auto_pingpong(shape(m, n, 4096)),
                coop && m <= 128,
                "{m} x {n}"
            );
            assert_eq!(
                select_config(GemmConfig::Auto, shape(m, n, 4096), col, false),
                if coop {
                    GemmConfig::Cooperative128x256
                } else {
                    GemmConfig::SwapAb
                },
                "{m} x {n}"
            );
        }
        // Row-major B, or cooperative knobs: never decode under Auto.
        assert_eq!(
            select_config(
                GemmConfig::Auto,
                shape(1, 4096, 4096),
                BLayout::RowMajor,
                false
            ),
            GemmConfig::Cooperative128x256
        );
        assert_eq!(
            select_config(GemmConfig::Auto, shape(1, 4096, 4096), col, true),
            GemmConfig::Cooperative128x256
        );
        // Explicit choices stay.
        for c in [
            GemmConfig::Decode,
            GemmConfig::Cooperative128x256,
            GemmConfig::SwapAb,
        ] {
            for m in [1, 1000] {
                assert_eq!(select_config(c, shape(m, 64, 64), col, false), c);
            }
        }
        for name in GemmConfig::NAMES {
            assert_eq!(GemmConfig::parse(name).unwrap().name(), name);
        }
        assert!(matches!(
            GemmConfig::parse("fast"),
            Err(Error::BadShape { .. })
        ));
    }

    #[test]
    fn issue20_decode_token_tiles_and_variants() {
        assert_eq!(token_tiles(0), None);
        assert_eq!(token_tiles(65), None);
        for (m, t) in [
            (1, 1),
            (8, 1),
            (9, 2),
            (16, 2),
            (17, 4),
            (32, 4),
            (33, 8),
            (64, 8),
        ] {
            assert_eq!(token_tiles(m), Some(t), "M = {m}");
        }
        // Every (type, tiles, unroll) the launcher can ask for has an entry, named as such.
        for bf16 in [true, false] {
            for m in [1, 9, 17, 33] {
                for unroll in [2, 4] {
                    let cfg = DecodeConfig {
                        warps: 8,
                        ksplit: Some(4),
                        unroll,
                        ..Default::default()
                    };
                    let ls = launch_shape(shape(m, 1003, 2056), bf16, &cfg, 132).unwrap();
                    let ty = if bf16 { "bf16" } else { "f16" };
                    assert_eq!(
                        ls.kernel,
                        format!("decode_gemm_{ty}_t{}_u{unroll}", ls.token_tiles)
                    );
                    assert!(ls.token_tiles * 8 >= m);
                    // 1003 columns: 63 row tiles, 2 per CTA.
                    assert_eq!(ls.grid, 32);
                    assert_eq!(ls.smem_bytes as usize, 8 * ls.token_tiles * 512);
                }
            }
        }
    }

    #[test]
    fn issue20_decode_launch_shape_refuses_bad_configs() {
        let s = shape(16, 4096, 4096);
        let bad = |cfg: DecodeConfig| launch_shape(s, true, &cfg, 132).unwrap_err();
        for cfg in [
            DecodeConfig {
                warps: 6,
                ..Default::default()
            },
            DecodeConfig {
                ksplit: Some(0),
                ..Default::default()
            },
            DecodeConfig {
                ksplit: Some(3),
                ..Default::default()
            },
            DecodeConfig {
                ksplit: Some(16),
                ..Default::default()
            },
            DecodeConfig {
                unroll: 3,
                ..Default::default()
            },
        ] {
            assert!(matches!(bad(cfg), Error::BadShape { .. }), "{cfg:?}");
        }
        for m in [0, 65, 1000] {
            assert!(matches!(
                launch_shape(shape(m, 64, 64), true, &DecodeConfig::default(), 132),
                Err(Error::BadShape { .. })
            ));
        }
        // Every swept config is accepted (M = 16) and its grid covers N.
        for cfg in DecodeConfig::sweep() {
            let ls = launch_shape(s, false, &cfg, 132).unwrap();
            let ks = cfg.ksplit.unwrap();
            assert_eq!(ls.ksplit, ks);
            let cols_per_cta = (cfg.warps / ks * cfg.row_tiles) as usize * 16;
            assert!(ls.grid as usize * cols_per_cta >= 4096);
            assert!((ls.grid as usize - 1) * cols_per_cta < 4096);
            assert!(ls.smem_bytes as usize <= contract::MAX_SMEM_BYTES);
        }
    }

    #[test]
    fn issue20_decode_default_ksplit() {
        // 4096 columns = 256 row tiles: 8 warps per tile reach 2048 >= 16 * 132 / ... (power of
        // two, capped by warps).
        assert_eq!(default_ksplit(4096, 4096, 132, 8, 4), 8);
        assert_eq!(default_ksplit(4096, 4096, 132, 16, 4), 16);
        assert_eq!(default_ksplit(28672, 4096, 132, 8, 4), 2);
        assert_eq!(default_ksplit(14336, 4096, 132, 8, 4), 4);
        // Never more warps than k-blocks: K = 256 is 2 blocks of 128.
        assert_eq!(default_ksplit(16, 256, 132, 16, 4), 2);
        assert_eq!(default_ksplit(16, 8, 132, 16, 4), 1);
        for n in [1, 15, 16, 1003, 4096, 1 << 20] {
            for k in [8, 64, 2056, 14336] {
                for w in contract::WARPS {
                    let ks = default_ksplit(n, k, 132, w, 2);
                    assert!(ks >= 1 && w.is_multiple_of(ks), "{n} {k} {w} -> {ks}");
                }
            }
        }
    }

    /// Issue 20 (M = 16): the two-row-tile entries exist for 1 to 32 tokens, a warp covers 32
    /// columns (so the grid halves), the split-K exchange holds both tiles, 2 row tiles above
    /// 32 tokens and 0 or 3 row tiles are refused with typed errors, and the label says `_r2`.
    #[test]
    fn issue20_decode_two_row_tiles_launch_shape() {
        for bf16 in [true, false] {
            for m in [1, 7, 16, 17, 32] {
                for unroll in [2, 4] {
                    let cfg = DecodeConfig {
                        warps: 8,
                        ksplit: Some(4),
                        unroll,
                        row_tiles: 2,
                        ..Default::default()
                    };
                    let ls = launch_shape(shape(m, 1003, 2056), bf16, &cfg, 132).unwrap();
                    let ty = if bf16 { "bf16" } else { "f16" };
                    assert_eq!(
                        ls.kernel,
                        format!("decode_gemm_{ty}_t{}_u{unroll}_r2", ls.token_tiles)
                    );
                    assert_eq!(ls.row_tiles, 2);
                    // 1003 columns: 32 warp tiles of 32 columns, 2 per CTA.
                    assert_eq!(ls.grid, 16);
                    assert_eq!(ls.smem_bytes as usize, 8 * ls.token_tiles * 2 * 512);
                    assert_eq!(cfg.label(), format!("w8_ks4_u{unroll}_pf_r2"));
                }
            }
            for m in [33, 64] {
                let cfg = DecodeConfig {
                    row_tiles: 2,
                    ..Default::default()
                };
                assert!(matches!(
                    launch_shape(shape(m, 4096, 4096), bf16, &cfg, 132),
                    Err(Error::BadShape {
                        what: "decode gemm variant",
                        ..
                    })
                ));
            }
            for row_tiles in [0, 3] {
                let cfg = DecodeConfig {
                    row_tiles,
                    ..Default::default()
                };
                assert!(matches!(
                    launch_shape(shape(16, 4096, 4096), bf16, &cfg, 132),
                    Err(Error::BadShape {
                        what: "decode gemm row tiles per warp",
                        ..
                    })
                ));
            }
        }
        // The default ksplit counts the warps' 32-column tiles: 4096 columns = 128 of them.
        let cfg = DecodeConfig {
            row_tiles: 2,
            ..Default::default()
        };
        let ls = launch_shape(shape(16, 28672, 4096), true, &cfg, 132).unwrap();
        assert_eq!(ls.ksplit, default_ksplit(14336, 4096, 132, 8, 4));
        // Every variant's accumulator tiles fit the raised shared-memory limit at 16 warps.
        for v in contract::VARIANTS {
            assert!(
                contract::smem_bytes(16, v.token_tiles * v.row_tiles) <= contract::MAX_SMEM_BYTES
            );
        }
    }

    /// Issue 20: the A-prefetch entries (`..._u2[_r2]_pa`) exist for unroll 2, with one row tile
    /// for 1 to 64 tokens and two for 1 to 32; unroll 4, or two row tiles above 32 tokens, is
    /// refused (typed).
    #[test]
    fn issue20_decode_prefetch_a_launch_shape() {
        for row_tiles in [1u32, 2] {
            let ms: &[usize] = if row_tiles == 1 {
                &[1, 9, 17, 32, 33, 64]
            } else {
                &[1, 9, 17, 32]
            };
            for &m in ms {
                let cfg = DecodeConfig {
                    unroll: 2,
                    row_tiles,
                    prefetch_a: true,
                    ..Default::default()
                };
                let ls = launch_shape(shape(m, 4096, 4096), true, &cfg, 132).unwrap();
                let r = if row_tiles == 2 { "_r2" } else { "" };
                assert_eq!(
                    ls.kernel,
                    format!("decode_gemm_bf16_t{}_u2{r}_pa", ls.token_tiles)
                );
                assert!(ls.prefetch_a);
                assert!(cfg.label().ends_with("_pa"));
            }
            let bad: &[(usize, u32)] = if row_tiles == 1 {
                &[(16, 4), (64, 4)]
            } else {
                &[(16, 4), (33, 2), (64, 2)]
            };
            for &(m, unroll) in bad {
                let cfg = DecodeConfig {
                    unroll,
                    row_tiles,
                    prefetch_a: true,
                    ..Default::default()
                };
                assert!(matches!(
                    launch_shape(shape(m, 4096, 4096), false, &cfg, 132),
                    Err(Error::BadShape {
                        what: "decode gemm variant",
                        ..
                    })
                ));
            }
        }
        // The sweep never asks for an A prefetch with unroll 4 (no such entry).
        assert!(DecodeConfig::sweep()
            .iter()
            .all(|c| !c.prefetch_a || c.unroll == 2));
    }

    /// CPU model of one warp's k-step of `decode_gemm_*` (gpu/src/kernels/decode_gemm.rs,
    /// `load_block` + `mma_block`): lane `(g, t)` loads `w0 = W[g][8t..8t+8]`, `w1 =
    /// W[g+8][8t..8t+8]` (weights, 16 rows) and `x = X[g][8t..8t+8]` (8 tokens), and feeds MMA
    /// `j` (0, 1) the A registers `[w0 pair 2j, w1 pair 2j, w0 pair 2j+1, w1 pair 2j+1]` and the
    /// B registers `[x pair 2j, x pair 2j+1]`. The MMA is modelled from the PTX ISA fragment
    /// tables of `mma.m16n8k16` (A: element `a_i` of lane `(g, t)` at row `g + 8 ((i / 2) % 2)`,
    /// column `2t + (i & 1) + 8 (i / 4)`; B: `b_i` at row `2t + (i & 1) + 8 (i / 2)`, column `g`;
    /// D: `d_i` at row `g + 8 (i / 2)`, column `2t + (i & 1)`). Checks that each MMA's logical A
    /// and B are fully and singly covered, that A's rows are the rows each lane loaded, and that
    /// the two MMAs give `D = W X^T` over all 32 k of the step (integer data: exact).
    #[test]
    fn issue20_decode_swap_ab_fragment_mapping_computes_w_times_x() {
        let w: Vec<Vec<i64>> = (0..16)
            .map(|r| {
                (0..32)
                    .map(|k| ((r * 37 + k * 11) % 17) as i64 - 8)
                    .collect()
            })
            .collect();
        let x: Vec<Vec<i64>> = (0..8)
            .map(|c| {
                (0..32)
                    .map(|k| ((c * 13 + k * 7) % 19) as i64 - 9)
                    .collect()
            })
            .collect();
        let mut d = [[0i64; 8]; 16];
        for j in 0..2 {
            let mut a = [[None::<i64>; 16]; 16];
            let mut b = [[None::<i64>; 8]; 16];
            for lane in 0..32usize {
                let (g, t) = (lane / 4, lane % 4);
                // Physical k of element e (0..8) of this lane's 16-byte vectors.
                let k = |e: usize| 8 * t + e;
                // A registers: (loaded row, first element of the pair).
                let a_regs = [
                    (g, 4 * j),
                    (g + 8, 4 * j),
                    (g, 4 * j + 2),
                    (g + 8, 4 * j + 2),
                ];
                for (r, &(row, e0)) in a_regs.iter().enumerate() {
                    for e in 0..2 {
                        let i = 2 * r + e;
                        let lrow = g + 8 * ((i / 2) % 2);
                        let lcol = 2 * t + (i & 1) + 8 * (i / 4);
                        assert_eq!(lrow, row, "a{i} of lane {lane}: row");
                        assert!(a[lrow][lcol].is_none(), "A[{lrow}][{lcol}] twice");
                        // Logical column lcol of MMA j carries physical k(e0 + e).
                        a[lrow][lcol] = Some(w[row][k(e0 + e)]);
                    }
                }
                let b_regs = [4 * j, 4 * j + 2];
                for (r, &e0) in b_regs.iter().enumerate() {
                    for e in 0..2 {
                        let i = 2 * r + e;
                        let lrow = 2 * t + (i & 1) + 8 * (i / 2);
                        assert!(b[lrow][g].is_none(), "B[{lrow}][{g}] twice");
                        b[lrow][g] = Some(x[g][k(e0 + e)]);
                    }
                }
            }
            for row in 0..16 {
                for col in 0..8 {
                    let s: i64 = (0..16)
                        .map(|kk| a[row][kk].expect("A covered") * b[kk][col].expect("B covered"))
                        .sum();
                    d[row][col] += s;
                }
            }
        }
        for lane in 0..32usize {
            let (g, t) = (lane / 4, lane % 4);
            for i in 0..4 {
                let (row, tok) = (g + 8 * (i / 2), 2 * t + (i & 1));
                let want: i64 = (0..32).map(|k| w[row][k] * x[tok][k]).sum();
                assert_eq!(d[row][tok], want, "lane {lane} d{i}: C[{tok}][{row}]");
            }
        }
    }

    proptest::proptest! {
        /// Any accepted launch shape covers every output column exactly with its grid, uses an
        /// entry that holds M tokens, a ksplit dividing the warps, and at most the shared memory
        /// the launcher raised the entries to.
        #[test]
        fn issue20_decode_launch_shape_covers_n(
            m in 1usize..=64,
            n in 1usize..(1 << 20),
            k in 1usize..(1 << 16),
            warps_i in 0usize..3,
            ks_log in proptest::option::of(0u32..5),
            unroll in proptest::sample::select(vec![2u32, 4]),
            row_tiles in 1u32..=2,
            prefetch_a: bool,
            sms in 1u32..200,
        ) {
            let warps = contract::WARPS[warps_i];
            let ksplit = ks_log.map(|l| 1u32 << l);
            let cfg = DecodeConfig { warps, ksplit, unroll, l2_prefetch: true, row_tiles, prefetch_a };
            match launch_shape(shape(m, n, k), true, &cfg, sms) {
                Ok(ls) => {
                    proptest::prop_assert!(ls.token_tiles * 8 >= m);
                    proptest::prop_assert!(warps.is_multiple_of(ls.ksplit));
                    proptest::prop_assert_eq!(ls.row_tiles, row_tiles);
                    let cols = (warps / ls.ksplit * row_tiles) as usize * 16;
                    proptest::prop_assert!(ls.grid as usize * cols >= n);
                    proptest::prop_assert!((ls.grid as usize - 1) * cols < n);
                    proptest::prop_assert!(ls.smem_bytes as usize <= contract::MAX_SMEM_BYTES);
                    let v = contract::VARIANTS.iter().find(|v| v.kernel == ls.kernel).unwrap();
                    proptest::prop_assert_eq!(v.row_tiles as u32, row_tiles);
                    proptest::prop_assert_eq!(v.token_tiles, ls.token_tiles);
                    proptest::prop_assert_eq!(v.prefetch_a, prefetch_a);
                }
                Err(e) => {
                    // Only an explicit ksplit that does not divide the warps, 2 row tiles with
                    // more than 32 tokens, or the A prefetch with unroll 4 is refused here.
                    let bad_shape = matches!(e, Error::BadShape { .. });
                    proptest::prop_assert!(bad_shape, "{}", e);
                    proptest::prop_assert!(
                        ksplit.is_some_and(|ks| ks > warps)
                            || (row_tiles == 2 && m > 32)
                            || (prefetch_a && unroll == 4)
                    );
                }
            }
        }
    }
}
