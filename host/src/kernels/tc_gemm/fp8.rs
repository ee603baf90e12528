//! The FP8 configuration of the tensor-core GEMM (issue 20): the same kernel template as BF16
//! (`gpu/src/kernels/tc_gemm.rs`, entries [`contract::KERNEL_E4M3_BCOL`] and
//! [`contract::KERNEL_E4M3_E5M2_BCOL`]) with an FP8 input type:
//!
//! `C[M,N] = alpha * a_scale * b_scale * A[M,K] * B[K,N] + beta * C`
//!
//! - A: [`F8E4M3`], row-major `M x K`, pitch a multiple of 16 elements (bytes);
//! - B: [`F8E4M3`] or [`F8E5M2`], **column-major only** ([`BLayout::ColMajor`]: stored `N x K`
//!   row-major, "TN" in BLAS terms), pitch a multiple of 16 elements. `wgmma` with `.e4m3`/`.e5m2`
//!   operands has no transpose (PTX ISA 8.3 §9.7.15.5.2), so both operands must be K-major in
//!   shared memory; a row-major B is refused with [`Error::Fp8Layout`]. cuBLASLt FP8 has the same
//!   rule ("TN" only);
//! - C: `bf16` or `f32`, row-major `M x N`, pitch a multiple of 16 bytes;
//! - accumulation in the tensor cores' FP32 accumulators (`wgmma ... k32.f32.e4m3.*`; see
//!   [`fp8_tolerance`] for the precision the hardware keeps);
//! - per-tensor scales ([`Fp8Scales`]): device pointers to one f32 each, read by the kernel after
//!   `griddepcontrol.wait` and applied in the epilogue with `alpha`, as cuBLASLt's
//!   `CUBLASLT_MATMUL_DESC_A_SCALE_POINTER` / `B_SCALE_POINTER` are.
//!
//! M, N, K are any values from 1 (TMA zero-fills the edges); only the pitches and base addresses
//! are constrained (16 bytes). [`CublasLtFp8`] is the same-run reference (cuBLASLt FP8 matmul,
//! cudarc's `cublaslt::result` layer: its safe `Matmul` has no FP8).

use std::ffi::c_void;
use std::marker::PhantomData;

use cudarc::cublaslt::{result as lt, sys as lt_sys};

use super::*;
use crate::fp8::{F8E4M3, F8E5M2};
use crate::memory::DeviceBuffer;

/// B element types of the FP8 GEMM (A is always [`F8E4M3`]): [`F8E4M3`] and [`F8E5M2`].
pub trait Fp8Input: TmaElement + sealed::Sealed {
    /// `"e4m3"` or `"e5m2"`.
    const NAME: &'static str;
    /// The sm_90a entry for an E4M3 A and this B.
    const ENTRY: &'static str;
    /// Its ping-pong entry, where the module has one.
    const PINGPONG_ENTRY: Option<&'static str>;
    /// cuBLASLt data type.
    const LT_TYPE: lt_sys::cudaDataType;
    /// Round to nearest even, saturating (`cvt.rn.satfinite`).
    fn from_f32(v: f32) -> Self;
    /// Exact widening.
    fn to_f32(self) -> f32;
}

impl Fp8Input for F8E4M3 {
    const NAME: &'static str = "e4m3";
    const ENTRY: &'static str = contract::KERNEL_E4M3_BCOL;
    const PINGPONG_ENTRY: Option<&'static str> = Some(contract::KERNEL_E4M3_BCOL_PINGPONG);
    const LT_TYPE: lt_sys::cudaDataType = lt_sys::cudaDataType::CUDA_R_8F_E4M3;
    fn from_f32(v: f32) -> Self {
        F8E4M3::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        F8E4M3::to_f32(self)
    }
}

impl Fp8Input for F8E5M2 {
    const NAME: &'static str = "e5m2";
    const ENTRY: &'static str = contract::KERNEL_E4M3_E5M2_BCOL;
    const PINGPONG_ENTRY: Option<&'static str> = None;
    const LT_TYPE: lt_sys::cudaDataType = lt_sys::cudaDataType::CUDA_R_8F_E5M2;
    fn from_f32(v: f32) -> Self {
        F8E5M2::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        F8E5M2::to_f32(self)
    }
}

/// Per-tensor scales of an FP8 GEMM: each `Some` is a view whose first element (an f32 in
/// device memory, bound to the GEMM's stream) multiplies the product; `None` is 1.0. The kernel
/// reads them when it runs (after `griddepcontrol.wait`), so a previous kernel on the stream may
/// compute them (dynamic quantization), as with cuBLASLt's scale pointers.
#[derive(Clone, Copy, Default)]
pub struct Fp8Scales<'a> {
    /// Scale of A (`a_scale`).
    pub a: Option<DeviceView<'a, f32>>,
    /// Scale of B (`b_scale`).
    pub b: Option<DeviceView<'a, f32>>,
}

impl<'a> Fp8Scales<'a> {
    /// Both scales from device memory.
    pub fn new(a: DeviceView<'a, f32>, b: DeviceView<'a, f32>) -> Self {
        Self {
            a: Some(a),
            b: Some(b),
        }
    }

    /// `[a, b]` device addresses (0 for `None`) after checking each view: at least one element
    /// ([`Error::LengthMismatch`]), 4-byte aligned ([`Error::Misaligned`]), bound to `stream`
    /// ([`Error::WrongStream`]).
    fn addresses(&self, stream: &Stream) -> Result<[u64; 2]> {
        let one = |v: &Option<DeviceView<'a, f32>>, what: &'static str| -> Result<u64> {
            let Some(v) = v else { return Ok(0) };
            if v.is_empty() {
                return Err(Error::LengthMismatch {
                    what,
                    detail: "the scale view is empty; one f32 is needed".into(),
                });
            }
            if !v.device_ptr().is_multiple_of(4) {
                return Err(Error::Misaligned {
                    what,
                    addr: v.device_ptr(),
                    align: 4,
                });
            }
            check_stream(what, v.stream(), stream)?;
            Ok(v.device_ptr())
        };
        Ok([one(&self.a, "fp8 a_scale")?, one(&self.b, "fp8 b_scale")?])
    }
}

/// [`Error::Fp8Layout`] unless B is column-major (K-major), the only layout FP8 wgmma and
/// cuBLASLt FP8 read.
pub fn check_fp8_layout(what: &'static str, layout: BLayout) -> Result<()> {
    match layout {
        BLayout::ColMajor => Ok(()),
        BLayout::RowMajor => Err(Error::Fp8Layout {
            what,
            layout: "row-major (N-major, K x N)".into(),
        }),
    }
}

/// Options an FP8 GEMM with B of type `B` cannot take: the decode and swap-AB configurations
/// (16-bit only), ping-pong consumers unless `B` has a ping-pong entry (E4M3). [`Error::BadShape`]
/// naming them.
fn check_fp8_options<B: Fp8Input>(opts: &TcGemmOptions) -> Result<()> {
    if matches!(opts.config, GemmConfig::Decode | GemmConfig::SwapAb) {
        return Err(Error::BadShape {
            what: "tc_gemm fp8 options",
            detail: "config decode or swapab; FP8 runs the 128 x 256 tensor-core kernel: allowed are config auto and coop128x256".into(),
        });
    }
    if opts.pingpong && B::PINGPONG_ENTRY.is_none() {
        return Err(Error::BadShape {
            what: "tc_gemm fp8 ping-pong",
            detail: format!(
                "B of {}; the FP8 ping-pong entry exists for an E4M3 B only",
                B::NAME
            ),
        });
    }
    Ok(())
}

impl TcGemm<'_> {
    /// Validates the FP8 GEMM `C = alpha * a_scale * b_scale * A * B + beta * C` and prepares its
    /// launch on `stream` (the cooperative 128 x 256 kernel, FP8 entry of B's type); nothing is
    /// launched until [`TcGemmPlan::launch`]. The plan borrows A, B, the scales (shared) and C
    /// (exclusively).
    ///
    /// Shapes and rules: as [`TcGemm::plan`] with one-byte A and B (pitches multiples of 16
    /// elements, base addresses 16-byte aligned; M, N, K any from 1), B column-major only (stored
    /// `N x K`, see the module docs), C `bf16` or `f32`. Options: as [`TcGemm::plan`] except
    /// [`GemmConfig::Decode`] (`Auto` is the 128 x 256 kernel for every shape), and `pingpong`
    /// (entry [`contract::KERNEL_E4M3_BCOL_PINGPONG`]) for an E4M3 B only.
    ///
    /// Errors, all before anything is queued: [`Error::Fp8Layout`] (row-major B),
    /// [`Error::BadShape`] (decode asked for; ping-pong with an E5M2 B), then those of
    /// [`TcGemm::plan`], and
    /// for each scale [`Error::LengthMismatch`] (empty view), [`Error::Misaligned`] (not 4-byte
    /// aligned), [`Error::WrongStream`].
    #[allow(clippy::too_many_arguments)]
    pub fn plan_fp8<'a, B: Fp8Input, O: TcOutput<bf16>>(
        &'a self,
        stream: &Stream,
        a: Matrix<'a, F8E4M3>,
        b: Matrix<'a, B>,
        layout: BLayout,
        c: MatrixMut<'a, O>,
        scales: Fp8Scales<'a>,
        alpha: f32,
        beta: f32,
        opts: &TcGemmOptions,
    ) -> Result<TcGemmPlan<'a>> {
        check_fp8_layout("tc_gemm fp8 B", layout)?;
        check_fp8_options::<B>(opts)?;
        let spec = || -> Result<EntrySpec> {
            let (name, a_box) = match B::PINGPONG_ENTRY {
                Some(p) if opts.pingpong => (p, contract::A_BOX_PINGPONG_FP8),
                _ => (B::ENTRY, contract::A_BOX_FP8),
            };
            Ok(EntrySpec {
                name,
                a_box,
                b_box: contract::B_BOX_KMAJOR_FP8,
                c_box: O::C_BOX,
                out_f32: O::IS_F32,
                scales: Some(scales.addresses(stream)?),
                scales_ld: None,
            })
        };
        let (p, shape, maps) = self.prepare_entry(
            stream, &a, &b, layout, &c, alpha, beta, opts, opts.pdl, spec,
        )?;
        self.finish(stream, vec![(p, maps)], vec![shape])
    }

    /// [`TcGemm::plan_fp8`] then [`TcGemmPlan::launch`] once. Errors: those of both.
    ///
    /// ```no_run
    /// use warpline::kernels::tc_gemm::{BLayout, Fp8Scales, Matrix, MatrixMut, TcGemm};
    /// use warpline::{bf16, F8E4M3};
    /// # fn main() -> warpline::Result<()> {
    /// let dev = warpline::Device::open(0)?;
    /// let (tc, stream) = (TcGemm::new(&dev)?, dev.new_stream()?);
    /// let pool = warpline::MemPool::device_default(&dev, 0)?;
    /// let (m, n, k) = (300, 500, 1000); // any sizes; pitches: K padded to 16 bytes
    /// let a = pool.alloc_async::<F8E4M3>(&stream, m * 1008)?; // A: M x K, pitch 1008
    /// let b = pool.alloc_async::<F8E4M3>(&stream, n * 1008)?; // B stored N x K ("TN")
    /// let scales = pool.alloc_async::<f32>(&stream, 2)?; // [a_scale, b_scale]
    /// let mut c = pool.alloc_async::<bf16>(&stream, m * 504)?;
    /// tc.gemm_fp8(
    ///     &stream,
    ///     Matrix::new(a.as_view(), m, k, 1008),
    ///     Matrix::new(b.as_view(), n, k, 1008),
    ///     BLayout::ColMajor,
    ///     MatrixMut::new(c.as_view_mut(), m, n, 504),
    ///     Fp8Scales::new(scales.view(0..1)?, scales.view(1..2)?),
    ///     1.0,
    ///     0.0,
    ///     &Default::default(),
    /// )?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A must be E4M3 and C bf16 or f32, checked at compile time:
    ///
    /// ```compile_fail
    /// use warpline::kernels::tc_gemm::{BLayout, Fp8Scales, Matrix, MatrixMut, TcGemm};
    /// fn f(tc: &TcGemm<'_>, s: &warpline::Stream, a: Matrix<'_, warpline::F8E5M2>,
    ///      b: Matrix<'_, warpline::F8E4M3>, c: MatrixMut<'_, f32>) {
    ///     let _ = tc.gemm_fp8(s, a, b, BLayout::ColMajor, c, Fp8Scales::default(), 1.0, 0.0,
    ///         &Default::default());
    /// }
    /// ```
    ///
    /// ```compile_fail
    /// use warpline::kernels::tc_gemm::{BLayout, Fp8Scales, Matrix, MatrixMut, TcGemm};
    /// fn f(tc: &TcGemm<'_>, s: &warpline::Stream, a: Matrix<'_, warpline::F8E4M3>,
    ///      b: Matrix<'_, warpline::F8E4M3>, c: MatrixMut<'_, warpline::f16>) {
    ///     let _ = tc.gemm_fp8(s, a, b, BLayout::ColMajor, c, Fp8Scales::default(), 1.0, 0.0,
    ///         &Default::default());
    /// }
    /// ```
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8<B: Fp8Input, O: TcOutput<bf16>>(
        &self,
        stream: &Stream,
        a: Matrix<'_, F8E4M3>,
        b: Matrix<'_, B>,
        layout: BLayout,
        c: MatrixMut<'_, O>,
        scales: Fp8Scales<'_>,
        alpha: f32,
        beta: f32,
        opts: &TcGemmOptions,
    ) -> Result<()> {
        self.plan_fp8(stream, a, b, layout, c, scales, alpha, beta, opts)?
            .launch()
    }
}

/// Side of a DeepSeek-V3 scale block ([`contract::SCALE_BLOCK`], 128): A has one scale per row
/// and 128-wide k-block, B one per 128 x 128 block of (N, K).
pub const FP8_SCALE_BLOCK: usize = contract::SCALE_BLOCK;

/// DeepSeek-V3-style block scales of an FP8 GEMM (arXiv 2412.19437, §3.3.2; the layouts of
/// DeepGEMM's `fp8_gemm_nt`), f32 in device memory, bound to the GEMM's stream; `kb = ceil(K /
/// 128)` k-blocks, `nb = ceil(N / 128)` N blocks:
///
/// - `a`: `1 x 128` scales of A, **M-major** ("transposed": DeepGEMM's TMA-aligned layout, the
///   order in which a CTA tile's rows are contiguous): the scale of row `i` (0..M) and k-block
///   `kk` (0..kb) is `a[kk * a_ld + i]`; `a_ld >= M` (DeepGEMM pads it to a multiple of 4);
///   `(kb - 1) * a_ld + M` elements at least;
/// - `b`: `128 x 128` scales of B, **K-major**: the scale of N block `j` (columns `128 j ..
///   128 j + 128`) and k-block `kk` is `b[j * b_ld + kk]`; `b_ld >= kb`; `(nb - 1) * b_ld + kb`
///   elements at least.
///
/// The GEMM computes `C = alpha * sum_kk (A_kk B_kk) * a[., kk] * b[., kk] + beta * C` where
/// `A_kk B_kk` is the k-block's product of the raw FP8 values: the dequantized inputs are
/// `A[i][k] * a_scale(i, k / 128)` and `B[k][j] * b_scale(j / 128, k / 128)`. The last k-block
/// and N block may be partial; their scales apply as to any other. The kernel reads the scales
/// when it runs (after `griddepcontrol.wait`), so a previous kernel on the stream may write them.
#[derive(Clone, Copy)]
pub struct Fp8BlockScales<'a> {
    /// A scales, `[ceil(K / 128)][a_ld]`, M-major.
    pub a: DeviceView<'a, f32>,
    /// Elements from one k-block's A scales to the next (`>= M`).
    pub a_ld: usize,
    /// B scales, `[ceil(N / 128)][b_ld]`, K-major.
    pub b: DeviceView<'a, f32>,
    /// Elements from one N block's B scales to the next (`>= ceil(K / 128)`).
    pub b_ld: usize,
}

impl<'a> Fp8BlockScales<'a> {
    /// Scales with explicit pitches (see the type's docs).
    pub fn new(a: DeviceView<'a, f32>, a_ld: usize, b: DeviceView<'a, f32>, b_ld: usize) -> Self {
        Self { a, a_ld, b, b_ld }
    }

    /// Densely packed scales for a GEMM of `m x n x k`: `a_ld = m`, `b_ld = ceil(k / 128)`.
    pub fn packed(a: DeviceView<'a, f32>, b: DeviceView<'a, f32>, m: usize, k: usize) -> Self {
        Self::new(a, m, b, k.div_ceil(FP8_SCALE_BLOCK))
    }

    /// `([a, b] addresses, [a_ld, b_ld])` after [`check_fp8_block_scales`] and the stream checks
    /// ([`Error::WrongStream`]).
    fn params(&self, shape: GemmShape, stream: &Stream) -> Result<([u64; 2], [u32; 2])> {
        let dims = |v: &DeviceView<'a, f32>, ld| ScaleDims {
            len: v.len(),
            ld,
            address: v.device_ptr(),
        };
        let lds =
            check_fp8_block_scales(shape, &dims(&self.a, self.a_ld), &dims(&self.b, self.b_ld))?;
        check_stream("fp8 block scales A", self.a.stream(), stream)?;
        check_stream("fp8 block scales B", self.b.stream(), stream)?;
        Ok(([self.a.device_ptr(), self.b.device_ptr()], lds))
    }
}

/// One block-scale array as plain numbers, for [`check_fp8_block_scales`] (no device needed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleDims {
    /// f32 elements in the view.
    pub len: usize,
    /// Pitch, elements: `a_ld` or `b_ld` of [`Fp8BlockScales`].
    pub ld: usize,
    /// Device address of the first element.
    pub address: u64,
}

/// Checks the block scales of an FP8 GEMM of `shape` (layouts: [`Fp8BlockScales`]) and returns
/// `[a_ld, b_ld]` as the kernel takes them. Errors, A first: [`Error::BadShape`] (a pitch below
/// its minimum: `a_ld < M`, `b_ld < ceil(K / 128)`), [`Error::TooLarge`] (a pitch above
/// `u32::MAX`), [`Error::LengthMismatch`] (fewer elements than the layout addresses:
/// `(ceil(K / 128) - 1) * a_ld + M` for A, `(ceil(N / 128) - 1) * b_ld + ceil(K / 128)` for
/// B), [`Error::Misaligned`] (an address not 4-byte aligned).
pub fn check_fp8_block_scales(shape: GemmShape, a: &ScaleDims, b: &ScaleDims) -> Result<[u32; 2]> {
    let kb = shape.k.div_ceil(FP8_SCALE_BLOCK);
    let nb = shape.n.div_ceil(FP8_SCALE_BLOCK);
    let one = |d: &ScaleDims,
               what: &'static str,
               outer: usize,
               inner: usize,
               layout: &str,
               inner_name: &str|
     -> Result<u32> {
        if d.ld < inner {
            return Err(Error::BadShape {
                what,
                detail: format!(
                    "pitch {} < {inner_name} = {inner}; the layout is {layout}: the pitch must be at least {inner_name}",
                    d.ld
                ),
            });
        }
        let ld = u32::try_from(d.ld).map_err(|_| Error::TooLarge {
            what,
            value: d.ld as u64,
            max: u32::MAX as u64,
        })?;
        let need = (outer - 1)
            .checked_mul(d.ld)
            .and_then(|v| v.checked_add(inner));
        if need.is_none_or(|need| d.len < need) {
            return Err(Error::LengthMismatch {
                what,
                detail: format!(
                    "{} f32 in the view; the layout {layout} with pitch {} addresses {} ({outer} x pitch, the last row {inner} long)",
                    d.len,
                    d.ld,
                    need.map_or("more than usize::MAX".to_string(), |n| n.to_string())
                ),
            });
        }
        if !d.address.is_multiple_of(4) {
            return Err(Error::Misaligned {
                what,
                addr: d.address,
                align: 4,
            });
        }
        Ok(ld)
    };
    Ok([
        one(
            a,
            "fp8 block scales A",
            kb,
            shape.m,
            "[ceil(K / 128)][a_ld] (M-major: row i, k-block kk at kk * a_ld + i)",
            "M",
        )?,
        one(
            b,
            "fp8 block scales B",
            nb,
            kb,
            "[ceil(N / 128)][b_ld] (K-major: N block j, k-block kk at j * b_ld + kk)",
            "ceil(K / 128)",
        )?,
    ])
}

/// Options a block-scaled FP8 GEMM cannot take: the decode configuration and ping-pong
/// consumers (it has the cooperative 128 x 256 entry only). [`Error::BadShape`] naming them.
fn check_fp8_block_options(opts: &TcGemmOptions) -> Result<()> {
    if matches!(opts.config, GemmConfig::Decode | GemmConfig::SwapAb) || opts.pingpong {
        return Err(Error::BadShape {
            what: "tc_gemm fp8 block-scaled options",
            detail: format!(
                "config {:?}, pingpong {}; the block-scaled FP8 GEMM runs the cooperative 128 x 256 kernel: allowed are config auto or coop128x256, pingpong false",
                opts.config, opts.pingpong
            ),
        });
    }
    Ok(())
}

impl TcGemm<'_> {
    /// Validates the block-scaled FP8 GEMM (DeepSeek-V3 fine-grained scaling, see
    /// [`Fp8BlockScales`] for the scale layouts and the formula) and prepares its launch on
    /// `stream`: entry [`contract::KERNEL_E4M3_BCOL_BLOCK_SCALED`], cooperative 128 x 256 tiles,
    /// cluster 1 or 2; each 128-deep k-block is summed by the FP8 tensor cores alone and then
    /// scaled and added in FP32 registers ("promotion", as DeepGEMM), so the accuracy does not
    /// degrade with K ([`fp8_block_tolerance`]). Nothing is launched until
    /// [`TcGemmPlan::launch`]; the plan borrows A, B, the scales (shared) and C (exclusively).
    ///
    /// Shapes and rules: as [`TcGemm::plan_fp8`] with an E4M3 B; options: as there, except
    /// ping-pong (no such entry).
    ///
    /// Errors, all before anything is queued: [`Error::Fp8Layout`] (row-major B),
    /// [`Error::BadShape`] (decode or ping-pong asked for), those of [`check_shapes`], then
    /// those of [`TcGemm::plan`], then the scale errors of [`check_fp8_block_scales`] and
    /// [`Error::WrongStream`] (a scale view bound to another stream).
    #[allow(clippy::too_many_arguments)]
    pub fn plan_fp8_block_scaled<'a, O: TcOutput<bf16>>(
        &'a self,
        stream: &Stream,
        a: Matrix<'a, F8E4M3>,
        b: Matrix<'a, F8E4M3>,
        layout: BLayout,
        c: MatrixMut<'a, O>,
        scales: Fp8BlockScales<'a>,
        alpha: f32,
        beta: f32,
        opts: &TcGemmOptions,
    ) -> Result<TcGemmPlan<'a>> {
        check_fp8_layout("tc_gemm fp8 B", layout)?;
        check_fp8_block_options(opts)?;
        let shape = check_shapes(&a.dims(1), &b.dims(1), layout, &c.dims(size_of::<O>()))?;
        let spec = || -> Result<EntrySpec> {
            let (addresses, lds) = scales.params(shape, stream)?;
            Ok(EntrySpec {
                name: contract::KERNEL_E4M3_BCOL_BLOCK_SCALED,
                a_box: contract::A_BOX_FP8,
                b_box: contract::B_BOX_KMAJOR_FP8,
                c_box: O::C_BOX,
                out_f32: O::IS_F32,
                scales: Some(addresses),
                scales_ld: Some(lds),
            })
        };
        let (p, shape, maps) = self.prepare_entry(
            stream, &a, &b, layout, &c, alpha, beta, opts, opts.pdl, spec,
        )?;
        self.finish(stream, vec![(p, maps)], vec![shape])
    }

    /// [`TcGemm::plan_fp8_block_scaled`] then [`TcGemmPlan::launch`] once. Errors: those of both.
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_fp8_block_scaled<O: TcOutput<bf16>>(
        &self,
        stream: &Stream,
        a: Matrix<'_, F8E4M3>,
        b: Matrix<'_, F8E4M3>,
        layout: BLayout,
        c: MatrixMut<'_, O>,
        scales: Fp8BlockScales<'_>,
        alpha: f32,
        beta: f32,
        opts: &TcGemmOptions,
    ) -> Result<()> {
        self.plan_fp8_block_scaled(stream, a, b, layout, c, scales, alpha, beta, opts)?
            .launch()
    }
}

/// Allowed error of one element of a block-scaled FP8 GEMM against the f64 sum over the
/// dequantized inputs (`want = alpha * sum_k sa(i, k) sb(j, k) a_ik b_kj + beta * c0`,
/// `abs_scaled = sum_k |sa(i, k) sb(j, k) a_ik b_kj|`):
///
/// `|got - want| <= (4 * FP8_STEP_REL + (ceil(K / 128) + 3) * 2^-24) * |alpha| * abs_scaled +
/// ACC_REL * |beta * c0| + rounding * |want| + ABS_FLOOR`.
///
/// Derivation: FP8 products are exact; inside one k-block the tensor cores add at most
/// `128 / 32 = 4` k32 steps, each erring by at most [`FP8_STEP_REL`] of the block's
/// `sum |a b|` (see there), and every k-block starts from zero, so the blocks' errors, scaled
/// by `|sa sb|`, add up to `4 * FP8_STEP_REL * abs_scaled` whatever K is (the per-tensor path's
/// bound grows with `ceil(K / 32)`). The FP32 promotion rounds `sa * sb` and each of the
/// `ceil(K / 128)` `fma(tmp, sa sb, acc)` once, each by at most 2^-24 of a partial sum bounded
/// by `abs_scaled`, and the epilogue's `alpha *` once more (one term of slack); `rounding` is
/// the output's half ulp ([`TcOutput::ROUNDING`]).
pub fn fp8_block_tolerance(
    want: f64,
    abs_scaled: f64,
    k: usize,
    alpha: f64,
    beta_c0: f64,
    rounding: f64,
) -> f64 {
    let steps = (contract::FP8_BK / contract::FP8_WGMMA_K) as f64;
    let fp32 = (k.div_ceil(FP8_SCALE_BLOCK) + 3) as f64 * f64::powi(2.0, -24);
    (steps * FP8_STEP_REL + fp32) * alpha.abs() * abs_scaled
        + ACC_REL * beta_c0.abs()
        + rounding * want.abs()
        + ABS_FLOOR
}

/// The f64 reference of one element of a block-scaled FP8 GEMM on the host: `(sum, abs_sum)` of
/// `sa(i, kk) * sb(j / 128, kk) * A[i][k] * B[k][j]` over k (`kk = k / 128`), from the decoded
/// FP8 values of A (`M x K` row-major, pitch `lda`), B (stored `N x K`, pitch `ldb`) and the
/// scales in the layouts of [`Fp8BlockScales`]. `None` if an index falls outside a slice.
#[allow(clippy::too_many_arguments)]
pub fn block_scaled_reference_entry(
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    a_scales: &[f32],
    a_ld: usize,
    b_scales: &[f32],
    b_ld: usize,
    k: usize,
    i: usize,
    j: usize,
) -> Option<(f64, f64)> {
    let a_row = a.get(i.checked_mul(lda)?..i.checked_mul(lda)?.checked_add(k)?)?;
    let b_row = b.get(j.checked_mul(ldb)?..j.checked_mul(ldb)?.checked_add(k)?)?;
    let jb = j / FP8_SCALE_BLOCK;
    let (mut s, mut abs) = (0f64, 0f64);
    for (kk, (a_blk, b_blk)) in a_row
        .chunks(FP8_SCALE_BLOCK)
        .zip(b_row.chunks(FP8_SCALE_BLOCK))
        .enumerate()
    {
        let sa = *a_scales.get(kk.checked_mul(a_ld)?.checked_add(i)?)? as f64;
        let sb = *b_scales.get(jb.checked_mul(b_ld)?.checked_add(kk)?)? as f64;
        for (&x, &y) in a_blk.iter().zip(b_blk) {
            let p = sa * sb * x as f64 * y as f64;
            s += p;
            abs += p.abs();
        }
    }
    Some((s, abs))
}

/// Checks the operands of an FP8 GEMM without a device and returns `M, N, K`: B column-major
/// ([`Error::Fp8Layout`]), then [`check_shapes`] with one-byte A and B and `c_bytes`-byte C.
pub fn check_fp8_shapes(
    a: &MatrixDims,
    b: &MatrixDims,
    layout: BLayout,
    c: &MatrixDims,
) -> Result<GemmShape> {
    check_fp8_layout("tc_gemm fp8 B", layout)?;
    for (d, what) in [(a, "tc_gemm fp8 A"), (b, "tc_gemm fp8 B")] {
        if d.elem_bytes != 1 {
            return Err(Error::BadShape {
                what,
                detail: format!("{} bytes per element; FP8 is 1", d.elem_bytes),
            });
        }
    }
    check_shapes(a, b, layout, c)
}

/// Relative accumulation error per k32 wgmma step that [`fp8_tolerance`] allows: 2^-12.
///
/// Why: the products of two FP8 values are exact (at most 4 x 4 significant bits), but Hopper's
/// FP8 tensor cores do not keep FP32 precision when they add a k32 step's products into the
/// accumulator: DeepSeek-V3 (arXiv 2412.19437, §3.3.2) measured "around 14 bits" of precision
/// on H800 and a relative error near 2% at K = 4096 on their data, which is why DeepGEMM
/// promotes the accumulators to FP32 registers every 128 k. This kernel (like cuBLASLt with
/// `CUBLASLT_MATMUL_DESC_FAST_ACCUM`) does not promote: every one of the `ceil(K / 32)` steps
/// may err by up to `2^-12` (14 bits, less 2 bits of margin for truncation instead of rounding)
/// of the running sum's magnitude, which is at most `sum_k |a_ik b_kj|`.
pub const FP8_STEP_REL: f64 = 1.0 / 4096.0;

/// Allowed error of one element of an FP8 GEMM, against the f64 sum over the decoded FP8 values
/// (`want = alpha_s * sum_k a_ik b_kj + beta * c0`, `alpha_s = alpha * a_scale * b_scale`):
///
/// `|got - want| <= ceil(K / 32) * FP8_STEP_REL * |alpha_s| * sum_k |a_ik b_kj| + ACC_REL *
/// |beta * c0| + rounding * |want| + ABS_FLOOR`,
///
/// with `rounding` the output's half ulp ([`TcOutput::ROUNDING`]: 2^-8 for bf16, 2^-24 for
/// f32). See [`FP8_STEP_REL`] for the accumulation term.
pub fn fp8_tolerance(
    want: f64,
    abs_sum: f64,
    k: usize,
    alpha_s: f64,
    beta_c0: f64,
    rounding: f64,
) -> f64 {
    k.div_ceil(contract::FP8_WGMMA_K) as f64 * FP8_STEP_REL * alpha_s.abs() * abs_sum
        + ACC_REL * beta_c0.abs()
        + rounding * want.abs()
        + ABS_FLOOR
}

// ------------------------------------------------------------------------------------------------
// cuBLASLt FP8 reference
// ------------------------------------------------------------------------------------------------

fn lt_call<T>(call: &'static str, r: std::result::Result<T, lt::CublasError>) -> Result<T> {
    r.map_err(|e| Error::Cublas {
        call,
        status: format!("{:?}", e.0),
    })
}

/// cuBLASLt FP8 matmul (`cublasLtMatmul`, E4M3 A, E4M3/E5M2 B, `CUBLAS_COMPUTE_32F`, f32 scale
/// type, bf16 or f32 C/D) on one stream, as the reference of [`TcGemm::plan_fp8`], with the
/// same row-major layouts and scales. cuBLASLt is column-major: row-major `C = A B` with B
/// stored `N x K` is `C^T = B^T A^T` with cuBLASLt's A := our B (`TRANSA = T`, the "TN" that
/// cuBLASLt FP8 requires), its B := our A (`N`); its A scale pointer is our `b_scale`, its B
/// scale pointer our `a_scale`. A 32 MiB workspace (NVIDIA's recommendation for Hopper).
pub struct CublasLtFp8 {
    handle: lt_sys::cublasLtHandle_t,
    workspace: DeviceBuffer<u8>,
    stream: Stream,
}

impl std::fmt::Debug for CublasLtFp8 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CublasLtFp8")
            .field("workspace", &self.workspace.len())
            .finish()
    }
}

impl CublasLtFp8 {
    /// Workspace bytes.
    pub const WORKSPACE_BYTES: usize = 32 << 20;

    /// A cuBLASLt handle and workspace for `stream` (a stream of `dev`). Errors:
    /// [`Error::WrongContext`], [`Error::Cublas`] (libcublasLt missing, `cublasLtCreate`), the
    /// allocation errors of [`MemPool::alloc_async`].
    pub fn new(dev: &Device, stream: &Stream) -> Result<Self> {
        if stream.context_raw() != dev.raw_context() {
            return Err(Error::WrongContext {
                what: "cuBLASLt handle (the stream belongs to another context than the device's)",
            });
        }
        // SAFETY: only tries to open the library.
        if !unsafe { lt_sys::is_culib_present() } {
            return Err(Error::Cublas {
                call: "cublasLtCreate",
                status: "libcublasLt was not found (install the CUDA cuBLAS runtime)".into(),
            });
        }
        dev.bind()?;
        let pool = MemPool::device_default(dev, 0)?;
        let workspace = pool.alloc_async::<u8>(stream, Self::WORKSPACE_BYTES)?;
        let handle = lt_call("cublasLtCreate", lt::create_handle())?;
        Ok(Self {
            handle,
            workspace,
            stream: stream.clone(),
        })
    }

    /// Validates `C = alpha * a_scale * b_scale * A * B + beta * C` and picks cuBLASLt's
    /// heuristic algorithm for it (`cublasLtMatmulAlgoGetHeuristic`, one result); the plan then
    /// launches with no further host work but `cublasLtMatmul`. `fast_accum` sets
    /// `CUBLASLT_MATMUL_DESC_FAST_ACCUM` (no periodic promotion of the FP8 accumulators, which is
    /// what [`TcGemm::plan_fp8`] does too); without it cuBLASLt promotes, which costs speed.
    ///
    /// Shapes and rules: as [`TcGemm::plan_fp8`], plus every size and pitch at most
    /// `i32::MAX`; cuBLASLt may refuse shapes it has no FP8 kernel for
    /// (`CUBLAS_STATUS_NOT_SUPPORTED`, as [`Error::Cublas`]). Errors: [`Error::Fp8Layout`],
    /// those of [`check_shapes`], [`Error::WrongStream`], the scale errors of
    /// [`TcGemm::plan_fp8`], [`Error::TooLarge`], [`Error::Cublas`].
    #[allow(clippy::too_many_arguments)]
    pub fn plan<'a, B: Fp8Input, O: TcOutput<bf16>>(
        &'a self,
        a: Matrix<'a, F8E4M3>,
        b: Matrix<'a, B>,
        layout: BLayout,
        c: MatrixMut<'a, O>,
        scales: Fp8Scales<'a>,
        alpha: f32,
        beta: f32,
        fast_accum: bool,
    ) -> Result<CublasLtFp8Plan<'a>> {
        check_fp8_layout("cublasLt fp8 B", layout)?;
        let shape = check_shapes(&a.dims(1), &b.dims(1), layout, &c.dims(size_of::<O>()))?;
        let addresses = scales.addresses(&self.stream)?;
        self.plan_with(a, b, c, shape, addresses, false, alpha, beta, fast_accum)
    }

    /// Block-scaled cuBLASLt FP8 matmul, the reference of [`TcGemm::plan_fp8_block_scaled`]:
    /// `CUBLASLT_MATMUL_DESC_{A,B}_SCALE_MODE` set to `CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F`
    /// for cuBLASLt's A (our B) and `CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F` for its B (our A),
    /// cuBLAS 12.9+ on compute capability 9.0 (cuBLAS docs, "Scaling factors layouts"), no fast
    /// accumulation (cuBLASLt refuses it with block scales). The scales are passed as they are:
    /// this assumes cuBLASLt reads the layouts of [`Fp8BlockScales`] packed (`a_ld = M`, A scales
    /// M-major as DeepGEMM's, PyTorch's 1 x 128 "outer-dim-major"; `b_ld = ceil(K / 128)`), which
    /// the bench and tests check by comparing the outputs. A padded `a_ld` or `b_ld` is refused
    /// ([`Error::BadShape`]): cuBLASLt takes no pitch for scales.
    ///
    /// Errors: as [`CublasLtFp8::plan`], the scale errors of [`check_fp8_block_scales`],
    /// [`Error::BadShape`] for padded scale pitches; cuBLASLt builds without block-scaled FP8
    /// (before 12.9) answer [`Error::Cublas`].
    #[allow(clippy::too_many_arguments)]
    pub fn plan_block_scaled<'a, O: TcOutput<bf16>>(
        &'a self,
        a: Matrix<'a, F8E4M3>,
        b: Matrix<'a, F8E4M3>,
        layout: BLayout,
        c: MatrixMut<'a, O>,
        scales: Fp8BlockScales<'a>,
        alpha: f32,
        beta: f32,
    ) -> Result<CublasLtFp8Plan<'a>> {
        check_fp8_layout("cublasLt fp8 B", layout)?;
        let shape = check_shapes(&a.dims(1), &b.dims(1), layout, &c.dims(size_of::<O>()))?;
        let (addresses, _) = scales.params(shape, &self.stream)?;
        let kb = shape.k.div_ceil(FP8_SCALE_BLOCK);
        if scales.a_ld != shape.m || scales.b_ld != kb {
            return Err(Error::BadShape {
                what: "cublasLt fp8 block scales",
                detail: format!(
                    "a_ld {}, b_ld {}; cuBLASLt reads packed scales: a_ld = M = {}, b_ld = ceil(K / 128) = {kb}",
                    scales.a_ld, scales.b_ld, shape.m
                ),
            });
        }
        self.plan_with(a, b, c, shape, addresses, true, alpha, beta, false)
    }

    /// The common part of [`CublasLtFp8::plan`] and [`CublasLtFp8::plan_block_scaled`]:
    /// `[a_scale, b_scale]` are device addresses (0: none), validated by the caller; `block`
    /// sets the block scale modes.
    #[allow(clippy::too_many_arguments)]
    fn plan_with<'a, B: Fp8Input, O: TcOutput<bf16>>(
        &'a self,
        a: Matrix<'a, F8E4M3>,
        b: Matrix<'a, B>,
        c: MatrixMut<'a, O>,
        shape: GemmShape,
        [a_scale, b_scale]: [u64; 2],
        block: bool,
        alpha: f32,
        beta: f32,
        fast_accum: bool,
    ) -> Result<CublasLtFp8Plan<'a>> {
        check_stream("cublasLt A", a.view.stream(), &self.stream)?;
        check_stream("cublasLt B", b.view.stream(), &self.stream)?;
        check_stream("cublasLt C", c.view.stream(), &self.stream)?;
        let int = |v: usize, what: &'static str| -> Result<i64> {
            i32::try_from(v)
                .map(i64::from)
                .map_err(|_| Error::TooLarge {
                    what,
                    value: v as u64,
                    max: i32::MAX as u64,
                })
        };
        let (m, n, k) = (
            int(shape.m, "cublasLt M")?,
            int(shape.n, "cublasLt N")?,
            int(shape.k, "cublasLt K")?,
        );
        let (lda, ldb, ldc) = (
            int(a.pitch, "cublasLt lda")?,
            int(b.pitch, "cublasLt ldb")?,
            int(c.pitch, "cublasLt ldc")?,
        );
        let out_type = if O::IS_F32 {
            lt_sys::cudaDataType::CUDA_R_32F
        } else {
            lt_sys::cudaDataType::CUDA_R_16BF
        };
        crate::device::bind_context(self.stream.ctx(), "cublasLtMatmulDescCreate")?;
        let mut plan = CublasLtFp8Plan {
            lt: self,
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            algo: None,
            alpha,
            beta,
            ptrs: [
                b.view.device_ptr(),
                a.view.device_ptr(),
                c.view.device_ptr(),
            ],
            _operands: PhantomData,
        };
        // Descriptors are stored in `plan` as soon as they exist, so its Drop frees them on
        // every error path below.
        plan.desc = lt_call(
            "cublasLtMatmulDescCreate",
            lt::create_matmul_desc(
                lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                lt_sys::cudaDataType::CUDA_R_32F,
            ),
        )?;
        use lt_sys::cublasLtMatmulDescAttributes_t as D;
        let set = |attr: D, value: *const c_void, size: usize| -> Result<()> {
            // SAFETY: `plan.desc` is a live descriptor; `value` points at `size` bytes of the
            // attribute's type (i32 for TRANSA/TRANSB and the scale modes, a device pointer for
            // the scale pointers, i8 for FAST_ACCUM), alive for the call (cuBLASLt copies it).
            lt_call("cublasLtMatmulDescSetAttribute", unsafe {
                lt::set_matmul_desc_attribute(plan.desc, attr, value, size)
            })
        };
        let (op_t, op_n) = (1i32, 0i32); // CUBLAS_OP_T, CUBLAS_OP_N
        set(
            D::CUBLASLT_MATMUL_DESC_TRANSA,
            (&op_t as *const i32).cast(),
            4,
        )?;
        set(
            D::CUBLASLT_MATMUL_DESC_TRANSB,
            (&op_n as *const i32).cast(),
            4,
        )?;
        // cuBLASLt's A is our B, its B our A.
        if b_scale != 0 {
            set(
                D::CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                (&b_scale as *const u64).cast(),
                8,
            )?;
        }
        if a_scale != 0 {
            set(
                D::CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                (&a_scale as *const u64).cast(),
                8,
            )?;
        }
        if block {
            use lt_sys::cublasLtMatmulMatrixScale_t as S;
            // cuBLASLt's A is our B (128 x 128 blocks), its B our A (1 x 128).
            for (attr, mode) in [
                (
                    D::CUBLASLT_MATMUL_DESC_A_SCALE_MODE,
                    S::CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F as i32,
                ),
                (
                    D::CUBLASLT_MATMUL_DESC_B_SCALE_MODE,
                    S::CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F as i32,
                ),
            ] {
                set(attr, (&mode as *const i32).cast(), 4)?;
            }
        }
        let fast = fast_accum as i8;
        set(
            D::CUBLASLT_MATMUL_DESC_FAST_ACCUM,
            (&fast as *const i8).cast(),
            1,
        )?;
        // Column-major layouts as stored: our B (N x K row-major) is K x N with ld ldb, our A
        // (M x K row-major) is K x M with ld lda, C (M x N row-major) is N x M with ld ldc.
        plan.layouts[0] = lt_call(
            "cublasLtMatrixLayoutCreate",
            lt::create_matrix_layout(B::LT_TYPE, k as u64, n as u64, ldb),
        )?;
        plan.layouts[1] = lt_call(
            "cublasLtMatrixLayoutCreate",
            lt::create_matrix_layout(
                lt_sys::cudaDataType::CUDA_R_8F_E4M3,
                k as u64,
                m as u64,
                lda,
            ),
        )?;
        plan.layouts[2] = lt_call(
            "cublasLtMatrixLayoutCreate",
            lt::create_matrix_layout(out_type, n as u64, m as u64, ldc),
        )?;
        let pref = lt_call("cublasLtMatmulPreferenceCreate", lt::create_matmul_pref())?;
        let ws = Self::WORKSPACE_BYTES as u64;
        // SAFETY: `pref` is live; the attribute is a u64 (uint64_t), alive for the call.
        let r = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                8,
            )
        }
        .and_then(|()| {
            // SAFETY: every descriptor is live (created above, freed only by the plan's Drop).
            unsafe {
                lt::get_matmul_algo_heuristic(
                    self.handle,
                    plan.desc,
                    plan.layouts[0],
                    plan.layouts[1],
                    plan.layouts[2],
                    plan.layouts[2],
                    pref,
                )
            }
        });
        // SAFETY: created above, not used after.
        let _ = unsafe { lt::destroy_matmul_pref(pref) };
        plan.algo = Some(lt_call("cublasLtMatmulAlgoGetHeuristic", r)?.algo);
        Ok(plan)
    }
}

impl Drop for CublasLtFp8 {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once; every plan borrows `self`, so none is left.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// One validated cuBLASLt FP8 matmul with its descriptors and algorithm ([`CublasLtFp8::plan`]);
/// borrows the operands (A, B, scales shared, C exclusively) for its lifetime.
pub struct CublasLtFp8Plan<'a> {
    lt: &'a CublasLtFp8,
    desc: lt_sys::cublasLtMatmulDesc_t,
    /// cuBLASLt's A (our B), B (our A), C = D.
    layouts: [lt_sys::cublasLtMatrixLayout_t; 3],
    algo: Option<lt_sys::cublasLtMatmulAlgo_t>,
    alpha: f32,
    beta: f32,
    /// Device addresses of cuBLASLt's A (our B), B (our A), C = D.
    ptrs: [u64; 3],
    _operands: PhantomData<&'a mut ()>,
}

impl CublasLtFp8Plan<'_> {
    /// Queues the matmul on the handle's stream (`cublasLtMatmul`). Errors: [`Error::Cublas`],
    /// [`Error::ContextPoisoned`].
    pub fn launch(&self) -> Result<()> {
        let Some(algo) = self.algo.as_ref() else {
            return Err(Error::Empty {
                what: "cuBLASLt algorithm",
            });
        };
        let lt = self.lt;
        crate::device::bind_context(lt.stream.ctx(), "cublasLtMatmul")?;
        let [pa, pb, pc] = self.ptrs.map(|p| p as *mut c_void);
        // SAFETY: the descriptors are live (freed by Drop); the operands were validated (each view
        // holds (rows - 1) * pitch + cols elements of its type, which is what these layouts
        // address), are borrowed by the plan (C exclusively) and bound to the handle's stream,
        // so the call is ordered after their writers; alpha/beta are host f32 (default pointer
        // mode, f32 scale type) alive for the call; the workspace holds WORKSPACE_BYTES, the
        // limit the algorithm was chosen under, and is used only on this stream.
        let r = unsafe {
            lt::matmul(
                lt.handle,
                self.desc,
                (&self.alpha as *const f32).cast(),
                (&self.beta as *const f32).cast(),
                pa,
                self.layouts[0],
                pb,
                self.layouts[1],
                pc,
                self.layouts[2],
                pc,
                self.layouts[2],
                algo,
                lt.workspace.device_ptr() as *mut c_void,
                CublasLtFp8::WORKSPACE_BYTES,
                lt.stream.raw() as lt_sys::cudaStream_t,
            )
        };
        lt_call("cublasLtMatmul", r)
    }
}

impl Drop for CublasLtFp8Plan<'_> {
    fn drop(&mut self) {
        // SAFETY: each descriptor was created by `CublasLtFp8::plan` (or is null), destroyed
        // once here; cuBLASLt does not need them once cublasLtMatmul has returned.
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
        }
    }
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
    fn fp8_needs_a_column_major_b_and_says_so() {
        let (a, c) = (dims(3, 40, 48, 1), dims(3, 5, 8, 4));
        let e = check_fp8_shapes(&a, &dims(40, 5, 16, 1), BLayout::RowMajor, &c).unwrap_err();
        assert!(matches!(e, Error::Fp8Layout { .. }), "{e}");
        let m = e.to_string();
        assert!(m.contains("column-major") && m.contains("TN"), "{m}");
        assert_eq!(
            check_fp8_shapes(&a, &dims(5, 40, 48, 1), BLayout::ColMajor, &c).unwrap(),
            GemmShape { m: 3, n: 5, k: 40 }
        );
    }

    #[test]
    fn fp8_pitches_are_multiples_of_16_elements_and_k_is_free() {
        // K = 17: pitch 32 passes, pitch 24 (24 bytes) does not.
        let c = dims(2, 3, 4, 4);
        assert!(check_fp8_shapes(
            &dims(2, 17, 32, 1),
            &dims(3, 17, 16 * 2, 1),
            BLayout::ColMajor,
            &c
        )
        .is_ok());
        let e = check_fp8_shapes(
            &dims(2, 17, 24, 1),
            &dims(3, 17, 32, 1),
            BLayout::ColMajor,
            &c,
        )
        .unwrap_err();
        assert!(
            matches!(
                e,
                Error::PitchAlignment {
                    pitch: 24,
                    elem_bytes: 1,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("multiple of 16 elements"), "{e}");
        // Two-byte "FP8" is refused.
        assert!(matches!(
            check_fp8_shapes(
                &dims(2, 17, 32, 2),
                &dims(3, 17, 32, 1),
                BLayout::ColMajor,
                &c
            ),
            Err(Error::BadShape { .. })
        ));
    }

    #[test]
    fn fp8_options_refuse_decode_and_e5m2_pingpong() {
        assert!(check_fp8_options::<F8E4M3>(&TcGemmOptions::default()).is_ok());
        let o = TcGemmOptions {
            config: GemmConfig::Cooperative128x256,
            ..Default::default()
        };
        assert!(check_fp8_options::<F8E5M2>(&o).is_ok());
        let pp = TcGemmOptions {
            pingpong: true,
            ..Default::default()
        };
        assert!(check_fp8_options::<F8E4M3>(&pp).is_ok());
        assert!(matches!(
            check_fp8_options::<F8E5M2>(&pp),
            Err(Error::BadShape { .. })
        ));
        let decode = TcGemmOptions {
            config: GemmConfig::Decode,
            ..Default::default()
        };
        for e in [
            check_fp8_options::<F8E4M3>(&decode),
            check_fp8_options::<F8E5M2>(&decode),
        ] {
            assert!(matches!(e, Err(Error::BadShape { .. })));
        }
    }

    #[test]
    fn fp8_entries_and_boxes_follow_the_contract() {
        assert_eq!(<F8E4M3 as Fp8Input>::ENTRY, "tc_gemm_e4m3_bcol");
        assert_eq!(<F8E5M2 as Fp8Input>::ENTRY, "tc_gemm_e4m3_e5m2_bcol");
        // One 128-byte row per box, as the 16-bit boxes: the shared-memory layout is the same.
        assert_eq!(contract::A_BOX_FP8[0] as usize, 128);
        assert_eq!(contract::A_BOX[0] as usize * 2, 128);
        assert_eq!(contract::A_BOX_FP8[1], contract::A_BOX[1]);
        assert_eq!(contract::A_BOX_PINGPONG_FP8[1], contract::A_BOX_PINGPONG[1]);
        assert_eq!(contract::A_BOX_PINGPONG_FP8[0], contract::A_BOX_FP8[0]);
        assert_eq!(contract::B_BOX_KMAJOR_FP8[1], contract::B_BOX_KMAJOR[1]);
        assert_eq!(rust_params_fp8().len(), 15);
    }

    const SHAPE: GemmShape = GemmShape {
        m: 300,
        n: 391,
        k: 1000,
    };

    fn sd(len: usize, ld: usize) -> ScaleDims {
        ScaleDims {
            len,
            ld,
            address: 1 << 20,
        }
    }

    #[test]
    fn block_scales_accept_the_documented_layouts() {
        // K = 1000: 8 k-blocks (the last 104 deep); N = 391: 4 N blocks (the last 7 wide).
        let (a, b) = (sd(7 * 300 + 300, 300), sd(3 * 8 + 8, 8));
        assert_eq!(check_fp8_block_scales(SHAPE, &a, &b).unwrap(), [300, 8]);
        // Padded pitches (DeepGEMM pads a_ld to a multiple of 4) and longer views pass.
        let (a, b) = (sd(7 * 304 + 300 + 5, 304), sd(3 * 16 + 8, 16));
        assert_eq!(check_fp8_block_scales(SHAPE, &a, &b).unwrap(), [304, 16]);
        // One k-block, one N block, M = 1.
        let tiny = GemmShape { m: 1, n: 1, k: 1 };
        assert_eq!(
            check_fp8_block_scales(tiny, &sd(1, 1), &sd(1, 1)).unwrap(),
            [1, 1]
        );
    }

    #[test]
    fn block_scales_refuse_bad_pitches_lengths_and_alignment() {
        let (a, b) = (sd(2400, 300), sd(32, 8));
        // a_ld < M.
        let e = check_fp8_block_scales(SHAPE, &sd(2400, 299), &b).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadShape {
                    what: "fp8 block scales A",
                    ..
                }
            ),
            "{e}"
        );
        let m = e.to_string();
        assert!(
            m.contains("299") && m.contains("M = 300") && m.contains("M-major"),
            "{m}"
        );
        // A one element short.
        let e = check_fp8_block_scales(SHAPE, &sd(2399, 300), &b).unwrap_err();
        assert!(
            matches!(
                e,
                Error::LengthMismatch {
                    what: "fp8 block scales A",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("2400"), "{e}");
        // a_ld beyond u32.
        let huge = sd(usize::MAX, u32::MAX as usize + 1);
        assert!(matches!(
            check_fp8_block_scales(SHAPE, &huge, &b),
            Err(Error::TooLarge {
                what: "fp8 block scales A",
                ..
            })
        ));
        // Overflowing length arithmetic is a length error, not a panic.
        let wide = GemmShape {
            m: 1,
            n: 1,
            k: usize::MAX / 2,
        };
        assert!(matches!(
            check_fp8_block_scales(wide, &sd(10, u32::MAX as usize), &sd(10, usize::MAX / 256)),
            Err(Error::LengthMismatch { .. })
        ));
        // Misaligned A.
        let mis = ScaleDims {
            address: (1 << 20) + 2,
            ..a
        };
        assert!(matches!(
            check_fp8_block_scales(SHAPE, &mis, &b),
            Err(Error::Misaligned { align: 4, .. })
        ));
        // b_ld < ceil(K / 128) = 8.
        let e = check_fp8_block_scales(SHAPE, &a, &sd(32, 7)).unwrap_err();
        assert!(
            matches!(
                e,
                Error::BadShape {
                    what: "fp8 block scales B",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("ceil(K / 128) = 8"), "{e}");
        // B one element short: (4 - 1) * 8 + 8 = 32 needed.
        let e = check_fp8_block_scales(SHAPE, &a, &sd(31, 8)).unwrap_err();
        assert!(
            matches!(
                e,
                Error::LengthMismatch {
                    what: "fp8 block scales B",
                    ..
                }
            ),
            "{e}"
        );
        // Misaligned B.
        let mis = ScaleDims {
            address: (1 << 20) + 1,
            ..b
        };
        assert!(matches!(
            check_fp8_block_scales(SHAPE, &a, &mis),
            Err(Error::Misaligned { .. })
        ));
    }

    #[test]
    fn block_scaled_options_refuse_decode_and_pingpong() {
        assert!(check_fp8_block_options(&TcGemmOptions::default()).is_ok());
        for o in [
            TcGemmOptions {
                config: GemmConfig::Decode,
                ..Default::default()
            },
            TcGemmOptions {
                pingpong: true,
                ..Default::default()
            },
        ] {
            assert!(matches!(
                check_fp8_block_options(&o),
                Err(Error::BadShape { .. })
            ));
        }
        assert_eq!(FP8_BLOCK_SCALED_ENTRY, "tc_gemm_e4m3_bcol_block_scaled");
        assert_eq!(rust_params_fp8_block().len(), 17);
        assert_eq!(FP8_SCALE_BLOCK, 128);
    }

    #[test]
    fn block_scaled_reference_applies_each_blocks_scales() {
        // M = 2, N = 300 (3 N blocks, the last partial), K = 200 (2 k-blocks, the last 72 deep).
        let (m, n, k) = (2usize, 300usize, 200usize);
        let (lda, ldb) = (208, 208);
        let val = |r: usize, c: usize| ((r * 7 + c * 3) % 11) as f32 - 5.0;
        let a: Vec<f32> = (0..m * lda).map(|x| val(x / lda, x % lda)).collect();
        let b: Vec<f32> = (0..n * ldb).map(|x| val(x % ldb, x / ldb + 1)).collect();
        let (a_ld, b_ld) = (3, 2); // a_ld > M, b_ld = ceil(K / 128)
        let a_scales: Vec<f32> = (0..2 * a_ld).map(|x| 2f32.powi(x as i32 - 3)).collect();
        let b_scales: Vec<f32> = (0..3 * b_ld).map(|x| 2f32.powi(4 - x as i32)).collect();
        for (i, j) in [(0, 0), (1, 127), (1, 128), (0, 299)] {
            let mut want = (0f64, 0f64);
            for kk in 0..k {
                let p = a_scales[(kk / 128) * a_ld + i] as f64
                    * b_scales[(j / 128) * b_ld + kk / 128] as f64
                    * a[i * lda + kk] as f64
                    * b[j * ldb + kk] as f64;
                want.0 += p;
                want.1 += p.abs();
            }
            let got = block_scaled_reference_entry(
                &a, lda, &b, ldb, &a_scales, a_ld, &b_scales, b_ld, k, i, j,
            )
            .unwrap();
            assert_eq!(got, want, "({i}, {j})");
        }
        // Out of range: None, no panic.
        assert!(block_scaled_reference_entry(
            &a,
            lda,
            &b,
            ldb,
            &a_scales,
            a_ld,
            &b_scales[..5], // the last N block's second k-block is missing
            b_ld,
            k,
            0,
            299
        )
        .is_none());
    }

    #[test]
    fn block_tolerance_does_not_grow_with_k() {
        let t1 = fp8_block_tolerance(0.0, 1000.0, 128, 1.0, 0.0, 0.0);
        let t2 = fp8_block_tolerance(0.0, 1000.0, 16384, 1.0, 0.0, 0.0);
        assert!(t2 < t1 * 1.01, "{t1} {t2}");
        // 4 k32 steps of 2^-12 per block: 2^-10 of the scaled |sum|, plus FP32 terms.
        assert!((t1 - 1000.0 / 1024.0).abs() < 1e-3, "{t1}");
        // The per-tensor bound at K = 16384 is 128 times looser.
        assert!(fp8_tolerance(0.0, 1000.0, 16384, 1.0, 0.0, 0.0) > 100.0 * t2);
    }

    #[test]
    fn fp8_tolerance_grows_with_k32_steps() {
        let t = fp8_tolerance(0.0, 1000.0, 64, 1.0, 0.0, 0.0);
        assert!((t - (2.0 * 1000.0 / 4096.0 + ABS_FLOOR)).abs() < 1e-12);
        let t1 = fp8_tolerance(0.0, 1000.0, 65, 1.0, 0.0, 0.0);
        assert!(t1 > t);
        // bf16 output rounding term.
        let t2 = fp8_tolerance(256.0, 0.0, 1, 1.0, 0.0, 1.0 / 256.0);
        assert!((t2 - (1.0 + ABS_FLOOR)).abs() < 1e-12);
    }
}
