//! The swap-AB configuration of [`TcGemm`] (issue 20; kernels `swap_ab_gemm_bf16_n*` of the
//! sm_90a module, `gpu/src/kernels/swap_ab_gemm.rs`; contract `warpline_gpu::contract::swap_ab_gemm`):
//! `C = epilogue(alpha * A * B) + beta * C` for few rows of A, BF16 inputs, B column-major (the
//! weights, `N x K`), f32 or BF16 output, computed as `C^T = B^T A^T` on `wgmma.m64nNTk16` with
//! the K of each 64-row weight tile split between the CTAs of a cluster and reduced through
//! distributed shared memory (deterministic: the same bits on every run of the same shape and
//! [`SwapAbConfig`]).
//!
//! Fused epilogues ([`Epilogue`]): an f32 bias per output column, then SiLU, GELU (tanh form) or
//! SwiGLU of interleaved (gate, up) column pairs, then `+ beta * C` (a residual add with
//! `beta = 1` and C holding the residual). [`TcGemm::plan_fused`].

use half::bf16;
use warpline_gpu::contract::swap_ab_gemm as contract;

use super::super::check_stream;
use super::swap_ab_launch::{
    swap_ab_shape, Activation, Epilogue, SwapAbConfig, SwapAbLaunch, SwapAbShape, TOKEN_TILES,
};
use super::{BLayout, GemmShape, Matrix, MatrixMut, TcGemm, TcGemmOptions, TcGemmPlan, TcOutput};
use crate::error::{Error, Result};
use crate::kernels::decode_gemm::GemmConfig;
use crate::kernels::operands::check_matrix;
use crate::launch::{LaunchConfig, LaunchLimits, ParamValue};
use crate::stream::Stream;
use crate::tensor_map::{TensorMap, TensorMapTable, TmaElement, TmaSwizzle};

impl TcGemm<'_> {
    /// Clusters of `ksplit` CTAs of swap-AB entry `ti` that fit at once (cached).
    fn swap_ab_resident(&self, ti: usize, ksplit: u32) -> u32 {
        let name = contract::KERNELS[ti];
        let key = (name, ksplit);
        if let Some(&n) = self
            .resident
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
        {
            return n;
        }
        let n = (|| -> Result<u32> {
            let kernel = self.kernel(name)?;
            let nt = TOKEN_TILES[ti];
            LaunchConfig::linear(
                ksplit,
                contract::THREADS_PER_CTA,
                contract::smem_bytes(nt) as u32,
            )
            .with_cluster_x(ksplit)
            .max_active_clusters(self.dev, kernel)
        })()
        .unwrap_or(0);
        self.resident
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, n);
        n
    }

    /// The swap-AB launch `shape` would get with `cfg` on this device (see [`swap_ab_shape`]).
    /// Errors: those of [`swap_ab_shape`].
    pub fn swap_ab_shape(&self, shape: GemmShape, cfg: SwapAbConfig) -> Result<SwapAbShape> {
        swap_ab_shape(shape, cfg, |ti, ks| self.swap_ab_resident(ti, ks))
    }

    /// `C = activation(alpha * A * B + bias) + beta * C` as one launch of the swap-AB
    /// configuration, validated; nothing is queued until [`TcGemmPlan::launch`].
    ///
    /// Shapes: A `M x K` BF16 row-major; B BF16 column-major (stored `N x K`); C `M x N` (f32 or
    /// BF16, row-major), or `M x N / 2` for [`Activation::SwiGlu`] (N even); bias `N` f32. Rules
    /// for pitches and alignment as [`TcGemm::plan`]; `opts.config` must be `Auto` or
    /// [`GemmConfig::SwapAb`]; `opts.swap_ab` picks the tile and ksplit; `opts.pdl` launches
    /// with PDL (everything is read after `griddepcontrol.wait`).
    ///
    /// Errors, before anything is queued: [`Error::WrongContext`], [`Error::WrongStream`], those
    /// of [`check_matrix`], [`Error::LengthMismatch`] (shapes disagree, bias shorter than N),
    /// [`Error::BadShape`] (row-major B, odd N with SwiGLU, another configuration, a cooperative
    /// option set), those of [`swap_ab_shape`] and [`LaunchConfig::check`], [`Error::TensorMap`];
    /// then the upload errors of [`TensorMapTable::upload`].
    #[allow(clippy::too_many_arguments)]
    pub fn plan_fused<'a, O: TcOutput<bf16>>(
        &'a self,
        stream: &Stream,
        a: Matrix<'a, bf16>,
        b: Matrix<'a, bf16>,
        layout: BLayout,
        c: MatrixMut<'a, O>,
        alpha: f32,
        beta: f32,
        epilogue: Epilogue<'a>,
        opts: &TcGemmOptions,
    ) -> Result<TcGemmPlan<'a>> {
        if !matches!(opts.config, GemmConfig::Auto | GemmConfig::SwapAb) {
            return Err(Error::BadShape {
                what: "tc_gemm fused epilogue",
                detail: format!(
                    "config {}; fused epilogues run in the swap-AB configuration: allowed auto or swapab",
                    opts.config.name()
                ),
            });
        }
        self.plan_swap_ab(
            stream,
            a,
            b,
            layout,
            c,
            O::IS_F32,
            alpha,
            beta,
            epilogue,
            opts,
        )
    }

    /// Validates and plans one swap-AB launch (see [`TcGemm::plan_fused`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan_swap_ab<'a, O: TmaElement>(
        &'a self,
        stream: &Stream,
        a: Matrix<'a, bf16>,
        b: Matrix<'a, bf16>,
        layout: BLayout,
        c: MatrixMut<'a, O>,
        out_f32: bool,
        alpha: f32,
        beta: f32,
        epilogue: Epilogue<'a>,
        opts: &TcGemmOptions,
    ) -> Result<TcGemmPlan<'a>> {
        if stream.context_raw() != self.dev.raw_context() {
            return Err(Error::WrongContext {
                what: "tc_gemm stream",
            });
        }
        if opts.cooperative_knobs() {
            return Err(Error::BadShape {
                what: "tc_gemm config swapab",
                detail: "ping-pong, cluster and clusters are options of the cooperative kernel; allowed with the swap-AB configuration: none of them (its cluster is SwapAbConfig::ksplit)".into(),
            });
        }
        if layout != BLayout::ColMajor {
            return Err(Error::BadShape {
                what: "tc_gemm swap-AB B layout",
                detail: format!(
                    "{layout:?}; the swap-AB configuration reads B column-major only (weights stored N x K, K contiguous)"
                ),
            });
        }
        let ad = a.dims(size_of::<bf16>());
        let bd = b.dims(size_of::<bf16>());
        let cd = c.dims(size_of::<O>());
        check_matrix("tc_gemm A (M x K, row-major)", &ad)?;
        check_matrix("tc_gemm B (column-major: stored N x K)", &bd)?;
        check_matrix("tc_gemm C (row-major)", &cd)?;
        let (m, k, n) = (a.rows, a.cols, b.rows);
        let swiglu = epilogue.activation == Activation::SwiGlu;
        if swiglu && n % 2 != 0 {
            return Err(Error::BadShape {
                what: "tc_gemm SwiGLU epilogue",
                detail: format!(
                    "N = {n} is odd; SwiGLU pairs columns (2j, 2j + 1): N must be even"
                ),
            });
        }
        let c_cols = if swiglu { n / 2 } else { n };
        if b.cols != k || c.rows != m || c.cols != c_cols {
            return Err(Error::LengthMismatch {
                what: "tc_gemm shapes",
                detail: format!(
                    "A is {m} x {k} (M x K), B (stored N x K) is {} x {}, C is {} x {}; K of A and B must agree and C must be M x {}",
                    b.rows,
                    b.cols,
                    c.rows,
                    c.cols,
                    if swiglu { "N / 2 (SwiGLU)" } else { "N" }
                ),
            });
        }
        let bias = match epilogue.bias {
            Some(v) => {
                check_stream("tc_gemm bias", v.stream(), stream)?;
                if v.len() < n {
                    return Err(Error::LengthMismatch {
                        what: "tc_gemm bias",
                        detail: format!("{} f32 for N = {n} columns; allowed: at least N", v.len()),
                    });
                }
                v.device_ptr()
            }
            None => 0,
        };
        check_stream("tc_gemm A", a.view.stream(), stream)?;
        check_stream("tc_gemm B", b.view.stream(), stream)?;
        check_stream("tc_gemm C", c.view.stream(), stream)?;
        let shape = GemmShape { m, n, k };
        let ls = self.swap_ab_shape(shape, opts.swap_ab)?;
        let kernel = self.kernel(ls.kernel)?;
        let mut cfg = LaunchConfig::linear(1, contract::THREADS_PER_CTA, ls.smem_bytes)
            .with_cluster_x(ls.ksplit)
            .with_pdl(opts.pdl);
        cfg.grid = ls.grid();
        cfg.check(ls.kernel, &LaunchLimits::of(self.dev, kernel))?;
        let sw = TmaSwizzle::B128;
        let map_w = TensorMap::matrix(&b.view, b.rows, b.cols, b.pitch, contract::W_BOX, sw)?;
        let map_x = TensorMap::matrix(
            &a.view,
            a.rows,
            a.cols,
            a.pitch,
            contract::x_box(ls.tokens),
            sw,
        )?;
        let table = TensorMapTable::upload(&self.pool, stream, &[map_w, map_x])?;
        let maps = [
            table.address(0).ok_or(Error::Empty {
                what: "tensor map table slot",
            })?,
            table.address(1).ok_or(Error::Empty {
                what: "tensor map table slot",
            })?,
        ];
        let launch = SwapAbLaunch {
            kernel: kernel.clone(),
            cfg,
            shape: ls,
            params: [
                ParamValue::new(c.view.device_ptr()),
                ParamValue::new(bias),
                ParamValue::new(m as u32),
                ParamValue::new(n as u32),
                ParamValue::new(k as u32),
                ParamValue::new(c.pitch as u32),
                ParamValue::new(alpha),
                ParamValue::new(beta),
                ParamValue::new(out_f32 as u32),
                ParamValue::new(epilogue.activation.code()),
                ParamValue::new(if opts.swap_ab.weights_before_wait.is_some() {
                    contract::FLAG_WEIGHTS_EARLY
                } else {
                    0
                }),
                ParamValue::new(0u64),
                ParamValue::new(0u64),
            ],
            maps,
        };
        Ok(TcGemmPlan {
            dev: self.dev,
            stream: stream.clone(),
            table: Some(table),
            launches: Vec::new(),
            decode: Vec::new(),
            swap_ab: vec![launch],
            shapes: vec![shape],
        })
    }
}
