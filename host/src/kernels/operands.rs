//! The operands of the tensor-core GEMMs (re-exported by `kernels::tc_gemm`, their public
//! path): the input and output element types, [`Matrix`] / [`MatrixMut`] views with a row pitch,
//! B's [`BLayout`], the [`GemmShape`], and the device-free checks of the operands
//! ([`check_matrix`], [`check_shapes`]). Shared by `tc_gemm` and `decode_gemm`, and below both,
//! so that neither imports the other for them.

use cudarc::cublas::sys as cublas_sys;
use half::{bf16, f16};
use warpline_gpu::contract::tc_gemm as contract;

use crate::error::{Error, Result};
use crate::memory::{DeviceView, DeviceViewMut};
use crate::tensor_map::TmaElement;

pub(super) mod sealed {
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
    impl Sealed for f32 {}
    impl Sealed for crate::fp8::F8E4M3 {}
    impl Sealed for crate::fp8::F8E5M2 {}
}

/// Layout of B in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BLayout {
    /// Column-major `K x N` ("K-major", the `_bcol` entries): stored as `N` rows of `K` elements
    /// with pitch `ldb >= K` (B transposed, row-major).
    ColMajor,
    /// Row-major `K x N` ("N-major", the `_brow` entries): `K` rows of `N` with pitch `ldb >= N`.
    RowMajor,
}

impl BLayout {
    /// `(rows, cols)` of B as stored, for a `K x N` B.
    pub fn stored(self, k: usize, n: usize) -> (usize, usize) {
        match self {
            Self::ColMajor => (n, k),
            Self::RowMajor => (k, n),
        }
    }
}

/// Order in which the persistent grid walks output tiles (L2 reuse).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Raster {
    /// Consecutive tiles go down M within a band of `group` tile rows
    /// (`contract::RASTER_ALONG_M`).
    #[default]
    AlongM,
    /// Consecutive tiles go along N within a band of `group` tile columns
    /// (`contract::RASTER_ALONG_N`).
    AlongN,
}

impl Raster {
    /// The kernel's `raster` parameter.
    pub fn code(self) -> u32 {
        match self {
            Self::AlongM => contract::RASTER_ALONG_M,
            Self::AlongN => contract::RASTER_ALONG_N,
        }
    }
}

/// Input element types of the tensor-core GEMM: `half::bf16` and `half::f16`.
pub trait TcInput: TmaElement + sealed::Sealed {
    /// `"bf16"` or `"fp16"`.
    const NAME: &'static str;
    /// cuBLAS data type.
    const CUDA_TYPE: cublas_sys::cudaDataType;
    /// The kernel entry for B in `layout`.
    fn entry(layout: BLayout) -> &'static str;
    /// The ping-pong entry for B in `layout`, where the module has one.
    fn pingpong_entry(_layout: BLayout) -> Option<&'static str> {
        None
    }
    /// Rounds to nearest even.
    fn from_f32(v: f32) -> Self;
    /// Exact widening.
    fn to_f32(self) -> f32;
    /// True for BF16 (the swap-AB kernel's only input type).
    const IS_BF16: bool = false;
    /// `m` itself when `Self` is BF16 (for the BF16-only swap-AB kernel), else `None`.
    fn bf16_matrix(_m: Matrix<'_, Self>) -> Option<Matrix<'_, bf16>>
    where
        Self: Sized,
    {
        None
    }
}

impl TcInput for bf16 {
    const NAME: &'static str = "bf16";
    const CUDA_TYPE: cublas_sys::cudaDataType = cublas_sys::cudaDataType::CUDA_R_16BF;
    fn entry(layout: BLayout) -> &'static str {
        match layout {
            BLayout::ColMajor => contract::KERNEL_BF16_BCOL,
            BLayout::RowMajor => contract::KERNEL_BF16_BROW,
        }
    }
    fn pingpong_entry(layout: BLayout) -> Option<&'static str> {
        (layout == BLayout::ColMajor).then_some(contract::KERNEL_BF16_BCOL_PINGPONG)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    const IS_BF16: bool = true;
    fn bf16_matrix(m: Matrix<'_, Self>) -> Option<Matrix<'_, bf16>> {
        Some(m)
    }
}

impl TcInput for f16 {
    const NAME: &'static str = "fp16";
    const CUDA_TYPE: cublas_sys::cudaDataType = cublas_sys::cudaDataType::CUDA_R_16F;
    fn entry(layout: BLayout) -> &'static str {
        match layout {
            BLayout::ColMajor => contract::KERNEL_F16_BCOL,
            BLayout::RowMajor => contract::KERNEL_F16_BROW,
        }
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

/// Output element types for inputs `I`: `f32`, or `I` itself.
pub trait TcOutput<I: TcInput>: TmaElement + sealed::Sealed {
    /// True for f32 (the kernel's `out_f32`).
    const IS_F32: bool;
    /// cuBLAS data type.
    const CUDA_TYPE: cublas_sys::cudaDataType;
    /// TMA box of C.
    const C_BOX: [u32; 2];
    /// Exact widening.
    fn to_f32(self) -> f32;
    /// Rounds to nearest even.
    fn from_f32(v: f32) -> Self;
    /// Relative rounding error of one output element (half an ulp): 2^-24, 2^-8 (bf16), 2^-11.
    const ROUNDING: f64;
}

impl<I: TcInput> TcOutput<I> for f32 {
    const IS_F32: bool = true;
    const CUDA_TYPE: cublas_sys::cudaDataType = cublas_sys::cudaDataType::CUDA_R_32F;
    const C_BOX: [u32; 2] = contract::C_BOX_F32;
    const ROUNDING: f64 = 1.0 / (1u64 << 24) as f64;
    fn to_f32(self) -> f32 {
        self
    }
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl TcOutput<bf16> for bf16 {
    const IS_F32: bool = false;
    const CUDA_TYPE: cublas_sys::cudaDataType = cublas_sys::cudaDataType::CUDA_R_16BF;
    const C_BOX: [u32; 2] = contract::C_BOX_16;
    // 8 significant bits: half an ulp is 2^(e-8) for |v| in [2^e, 2^(e+1)), up to 2^-8 |v| (a
    // 2^-9 bound failed on the H100: -32.384 rounds to -32.5).
    const ROUNDING: f64 = 1.0 / 256.0;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

impl TcOutput<f16> for f16 {
    const IS_F32: bool = false;
    const CUDA_TYPE: cublas_sys::cudaDataType = cublas_sys::cudaDataType::CUDA_R_16F;
    const C_BOX: [u32; 2] = contract::C_BOX_16;
    const ROUNDING: f64 = 1.0 / 2048.0;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

/// A read-only row-major matrix in device memory: `rows x cols` elements, row `r` starting at
/// element `r * pitch` of `view` (pitch in elements, `>= cols`; padding elements are never read).
#[derive(Clone, Copy)]
pub struct Matrix<'a, T> {
    /// The memory.
    pub view: DeviceView<'a, T>,
    /// Rows.
    pub rows: usize,
    /// Columns (elements per row that belong to the matrix).
    pub cols: usize,
    /// Row pitch, elements.
    pub pitch: usize,
}

impl<'a, T> Matrix<'a, T> {
    /// `rows x cols` with row pitch `pitch` (checked at launch).
    pub fn new(view: DeviceView<'a, T>, rows: usize, cols: usize, pitch: usize) -> Self {
        Self {
            view,
            rows,
            cols,
            pitch,
        }
    }

    pub(crate) fn dims(&self, elem_bytes: usize) -> MatrixDims {
        MatrixDims {
            rows: self.rows,
            cols: self.cols,
            pitch: self.pitch,
            len: self.view.len(),
            address: self.view.device_ptr(),
            elem_bytes,
        }
    }
}

/// A writable row-major matrix in device memory (as [`Matrix`]).
pub struct MatrixMut<'a, T> {
    /// The memory.
    pub view: DeviceViewMut<'a, T>,
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Row pitch, elements.
    pub pitch: usize,
}

impl<'a, T> MatrixMut<'a, T> {
    /// `rows x cols` with row pitch `pitch` (checked at launch).
    pub fn new(view: DeviceViewMut<'a, T>, rows: usize, cols: usize, pitch: usize) -> Self {
        Self {
            view,
            rows,
            cols,
            pitch,
        }
    }

    /// The same matrix, read-only (ends the mutable borrow).
    pub fn into_matrix(self) -> Matrix<'a, T> {
        Matrix {
            view: self.view.into_view(),
            rows: self.rows,
            cols: self.cols,
            pitch: self.pitch,
        }
    }

    pub(crate) fn dims(&self, elem_bytes: usize) -> MatrixDims {
        MatrixDims {
            rows: self.rows,
            cols: self.cols,
            pitch: self.pitch,
            len: self.view.len(),
            address: self.view.device_ptr(),
            elem_bytes,
        }
    }
}

/// A matrix operand as plain numbers, for [`check_shapes`] (no device needed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MatrixDims {
    /// Rows.
    pub rows: usize,
    /// Columns.
    pub cols: usize,
    /// Row pitch, elements.
    pub pitch: usize,
    /// Elements in the memory (view length).
    pub len: usize,
    /// Device address of element `[0, 0]`.
    pub address: u64,
    /// Bytes per element.
    pub elem_bytes: usize,
}

/// The problem size of a GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmShape {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Columns of A, rows of B.
    pub k: usize,
}

impl GemmShape {
    /// Floating-point operations of one GEMM, `2 M N K`.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// Work units of the persistent scheduler for clusters of `cluster` (0 counts as 1):
    /// `ceil(ceil(M / BM) / cluster) * ceil(N / BN)` (`WG_M` instead of `BM` for ping-pong).
    /// `None` when the product exceeds `u64::MAX` (shapes far beyond what [`check_shapes`]
    /// accepts).
    pub fn units(&self, cluster: u32) -> Option<u64> {
        self.units_of(cluster, false)
    }

    /// [`GemmShape::units`] for the cooperative (`pingpong = false`) or ping-pong entries.
    pub fn units_of(&self, cluster: u32, pingpong: bool) -> Option<u64> {
        let (m_units, n_tiles) = self.unit_grid(cluster, pingpong);
        m_units.checked_mul(n_tiles)
    }

    /// The raster band the kernel is given for `group`: at most the raster's minor dimension (in
    /// units). A wider band maps units exactly as that dimension does, and the clamp keeps the
    /// kernel's u32 `group x major` within the unit count (<= `MAX_UNITS`).
    pub(crate) fn band_group(
        &self,
        cluster: u32,
        pingpong: bool,
        raster: Raster,
        group: u32,
    ) -> u32 {
        let (m_units, n_tiles) = self.unit_grid(cluster, pingpong);
        let minor = match raster {
            Raster::AlongN => n_tiles,
            Raster::AlongM => m_units,
        };
        (group as u64).min(minor.max(1)) as u32
    }

    /// `(M units, N tiles)`: the kernel's work-unit grid, `ceil(ceil(M / rows) / cluster)` by
    /// `ceil(N / BN)` (rows: `BM`, or `WG_M` for ping-pong).
    pub(crate) fn unit_grid(&self, cluster: u32, pingpong: bool) -> (u64, u64) {
        let rows = if pingpong {
            contract::WG_M
        } else {
            contract::BM
        };
        let m_tiles = self.m.div_ceil(rows) as u64;
        (
            m_tiles.div_ceil(cluster.max(1) as u64),
            self.n.div_ceil(contract::BN) as u64,
        )
    }
}

/// Checks one matrix operand: non-empty, rows and columns at most 2^31 - 1 (TMA coordinates are
/// signed 32-bit), pitch at most 2^32 - 1, `pitch >= cols`, pitch a multiple of
/// 16 bytes, base 16-byte aligned, `(rows - 1) * pitch + cols` elements within the memory.
pub fn check_matrix(what: &'static str, d: &MatrixDims) -> Result<()> {
    if d.rows == 0 || d.cols == 0 {
        return Err(Error::BadShape {
            what,
            detail: format!(
                "{} x {} matrix; at least 1 x 1 is needed (any M, N, K >= 1)",
                d.rows, d.cols
            ),
        });
    }
    // Rows and columns are TMA coordinates, which are signed 32-bit; the pitch is a u32
    // kernel parameter.
    for (v, name, max) in [
        (d.rows, "rows", i32::MAX as u64),
        (d.cols, "cols", i32::MAX as u64),
        (d.pitch, "row pitch", u32::MAX as u64),
    ] {
        if v as u64 > max {
            return Err(Error::BadShape {
                what,
                detail: format!("{name} = {v} is too large: at most {max} is allowed"),
            });
        }
    }
    if d.pitch < d.cols {
        return Err(Error::BadShape {
            what,
            detail: format!(
                "row pitch {} elements is less than the {} columns; allowed: pitch >= columns",
                d.pitch, d.cols
            ),
        });
    }
    // Checked: `elem_bytes` is a plain number of the caller's; a product that overflows is no
    // multiple of 16 bytes a kernel could use.
    if !d
        .pitch
        .checked_mul(d.elem_bytes)
        .is_some_and(|b| b.is_multiple_of(16))
    {
        return Err(Error::PitchAlignment {
            what,
            pitch: d.pitch,
            elem_bytes: d.elem_bytes,
        });
    }
    if !d.address.is_multiple_of(16) {
        return Err(Error::Misaligned {
            what,
            addr: d.address,
            align: 16,
        });
    }
    let need = (d.rows as u64 - 1) * d.pitch as u64 + d.cols as u64;
    if need > d.len as u64 {
        return Err(Error::LengthMismatch {
            what,
            detail: format!(
                "{} x {} with row pitch {} needs (rows - 1) * pitch + cols = {need} elements, the view has {}",
                d.rows, d.cols, d.pitch, d.len
            ),
        });
    }
    Ok(())
}

/// Checks the operands of `C = alpha A B + beta C` without a device and returns `M, N, K`:
/// each matrix as [`check_matrix`]; A is `M x K`, B stored as `layout` says (`N x K` for
/// [`BLayout::ColMajor`], `K x N` for [`BLayout::RowMajor`]), C is `M x N`.
///
/// Errors: [`Error::BadShape`] (empty, pitch below the row, too large), [`Error::PitchAlignment`],
/// [`Error::Misaligned`], [`Error::LengthMismatch`] (memory too small, or the operands'
/// `M`/`N`/`K` disagree).
pub fn check_shapes(
    a: &MatrixDims,
    b: &MatrixDims,
    layout: BLayout,
    c: &MatrixDims,
) -> Result<GemmShape> {
    check_matrix("tc_gemm A (M x K, row-major)", a)?;
    check_matrix(
        match layout {
            BLayout::ColMajor => "tc_gemm B (column-major: stored N x K)",
            BLayout::RowMajor => "tc_gemm B (row-major: K x N)",
        },
        b,
    )?;
    check_matrix("tc_gemm C (M x N, row-major)", c)?;
    let (m, k) = (a.rows, a.cols);
    let (bk, n) = match layout {
        BLayout::ColMajor => (b.cols, b.rows),
        BLayout::RowMajor => (b.rows, b.cols),
    };
    if bk != k || c.rows != m || c.cols != n {
        return Err(Error::LengthMismatch {
            what: "tc_gemm shapes",
            detail: format!(
                "A is {m} x {k} (M x K), B ({layout:?}, stored {} x {}) is {bk} x {n} (K x N), C is {} x {} (M x N); K of A and B, and M, N of C must agree",
                b.rows, b.cols, c.rows, c.cols
            ),
        });
    }
    Ok(GemmShape { m, n, k })
}
