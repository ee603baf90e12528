//! Host side of the batched BF16 GEMM on 3-D TMA (issue 22, "3-D TMA"; kernel
//! `batched_gemm_bf16` of the sm_90a module [`crate::SM90A_PTX`], built from
//! `gpu/src/kernels/batched_gemm.rs`; launch contract `warpline_gpu::contract::batched_gemm`):
//!
//! `C[b] = A[b] * B[b]` for `b < batch`, BF16 inputs, FP32 accumulation, BF16 output, where
//! A is `batch x M x K` (K contiguous), B is `batch x N x K` (K contiguous: B column-major per
//! batch, cuBLAS's `op(B) = B^T` of a row-major `N x K`) and C is `batch x M x N` (N contiguous).
//! Each operand has a row pitch and a batch stride in elements, both multiples of 8 (16 bytes);
//! M, N, K may be anything from 1.
//!
//! A and B are read through 3-D tensor maps (dims `{K, rows, batch}`), so a tile that hangs over
//! the last row of one batch reads zeros rather than the next batch's rows; the kernel runs one
//! CTA per `128 x 256` output tile (grid `(ceil(N / 256), ceil(M / 128), batch)`).
//! [`CublasBatchedGemm`] is cuBLAS's `cublasGemmStridedBatchedEx` on the same operands, the
//! reference of `benches/batched_gemm.rs` and the GPU test.

use std::ffi::{c_int, c_longlong};

use cudarc::cublas::{result as cublas_result, sys as cublas_sys, CudaBlas};
use half::bf16;
use warpline_gpu::contract::batched_gemm as contract;

use super::check_stream;
use super::tc_gemm::{check_matrix, MatrixDims};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::launch::{LaunchConfig, LaunchLimits};
use crate::memory::{DeviceView, DeviceViewMut, MemPool};
use crate::module::{Module, TypedKernel, ViewMut};
use crate::stream::Stream;
use crate::tensor_map::{L2Promotion, TensorMap, TensorMapDesc, TensorMapTable, TmaSwizzle};

/// A read-only batch of row-major matrices in device memory: matrix `b`, row `r` starts at
/// element `b * batch_stride + r * pitch` of `view` (elements; padding is never read).
#[derive(Clone, Copy)]
pub struct BatchedMatrix<'a, T> {
    /// The memory.
    pub view: DeviceView<'a, T>,
    /// Matrices.
    pub batch: usize,
    /// Rows per matrix.
    pub rows: usize,
    /// Columns per matrix.
    pub cols: usize,
    /// Row pitch, elements.
    pub pitch: usize,
    /// Elements from one matrix to the next.
    pub batch_stride: usize,
}

/// A writable batch of row-major matrices (as [`BatchedMatrix`]).
pub struct BatchedMatrixMut<'a, T> {
    /// The memory.
    pub view: DeviceViewMut<'a, T>,
    /// Matrices.
    pub batch: usize,
    /// Rows per matrix.
    pub rows: usize,
    /// Columns per matrix.
    pub cols: usize,
    /// Row pitch, elements.
    pub pitch: usize,
    /// Elements from one matrix to the next.
    pub batch_stride: usize,
}

/// A batched operand as plain numbers, for [`check_batched_shapes`] (no device needed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchedDims {
    /// Matrices.
    pub batch: usize,
    /// Rows, columns, row pitch, view length, address and element size, as [`MatrixDims`].
    pub matrix: MatrixDims,
    /// Elements from one matrix to the next.
    pub batch_stride: usize,
}

impl<T> BatchedMatrix<'_, T> {
    /// The operand as numbers.
    pub fn dims(&self) -> BatchedDims {
        dims(
            self.batch,
            self.rows,
            self.cols,
            self.pitch,
            self.batch_stride,
            self.view.len(),
            self.view.device_ptr(),
            size_of::<T>(),
        )
    }
}

impl<T> BatchedMatrixMut<'_, T> {
    /// The operand as numbers.
    pub fn dims(&self) -> BatchedDims {
        dims(
            self.batch,
            self.rows,
            self.cols,
            self.pitch,
            self.batch_stride,
            self.view.len(),
            self.view.device_ptr(),
            size_of::<T>(),
        )
    }
}

#[allow(clippy::too_many_arguments)]
fn dims(
    batch: usize,
    rows: usize,
    cols: usize,
    pitch: usize,
    batch_stride: usize,
    len: usize,
    address: u64,
    elem_bytes: usize,
) -> BatchedDims {
    BatchedDims {
        batch,
        matrix: MatrixDims {
            rows,
            cols,
            pitch,
            len,
            address,
            elem_bytes,
        },
        batch_stride,
    }
}

/// The problem size of a batched GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchedShape {
    /// Matrices.
    pub batch: usize,
    /// Rows of A and C.
    pub m: usize,
    /// Columns of C (rows of the stored B).
    pub n: usize,
    /// Columns of A and of the stored B.
    pub k: usize,
}

impl BatchedShape {
    /// Floating-point operations, `2 batch M N K`.
    pub fn flops(&self) -> f64 {
        2.0 * self.batch as f64 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// The launch grid `(ceil(N / BN), ceil(M / BM), batch)`.
    pub fn grid(&self) -> [u32; 3] {
        [
            self.n.div_ceil(contract::BN) as u32,
            self.m.div_ceil(contract::BM) as u32,
            self.batch as u32,
        ]
    }
}

/// Checks one batched operand: the matrix of batch 0 as [`check_matrix`] (with the whole view),
/// then `1 <= batch <= MAX_GRID_YZ`, a batch stride that is a multiple of
/// [`contract::PITCH_ALIGN`] elements and at least `rows * pitch` (batches do not overlap, as TMA
/// and C's writes need), a row pitch that is a multiple of `PITCH_ALIGN`, and
/// `(batch - 1) * batch_stride + (rows - 1) * pitch + cols` elements within the view.
pub fn check_batched(what: &'static str, d: &BatchedDims) -> Result<()> {
    check_matrix(what, &d.matrix)?;
    let m = &d.matrix;
    if d.batch == 0 || d.batch > contract::MAX_GRID_YZ as usize {
        return Err(Error::BadShape {
            what,
            detail: format!(
                "batch {}; allowed: 1 to {} (the grid's z)",
                d.batch,
                contract::MAX_GRID_YZ
            ),
        });
    }
    if !m.pitch.is_multiple_of(contract::PITCH_ALIGN)
        || !d.batch_stride.is_multiple_of(contract::PITCH_ALIGN)
    {
        return Err(Error::BadShape {
            what,
            detail: format!(
                "row pitch {} and batch stride {} elements; allowed: multiples of {} elements",
                m.pitch,
                d.batch_stride,
                contract::PITCH_ALIGN
            ),
        });
    }
    let matrix = (m.rows as u64).saturating_mul(m.pitch as u64);
    if (d.batch_stride as u64) < matrix {
        return Err(Error::BadShape {
            what,
            detail: format!(
                "batch stride {} elements is less than rows * pitch = {matrix}; allowed: batches that do not overlap",
                d.batch_stride
            ),
        });
    }
    let need = (d.batch as u64 - 1)
        .checked_mul(d.batch_stride as u64)
        .and_then(|v| v.checked_add((m.rows as u64 - 1) * m.pitch as u64 + m.cols as u64));
    if need.is_none_or(|n| n > m.len as u64) {
        return Err(Error::LengthMismatch {
            what,
            detail: format!(
                "{} matrices of {} x {} (pitch {}, batch stride {}) need (batch - 1) * stride + (rows - 1) * pitch + cols = {} elements, the view has {}",
                d.batch,
                m.rows,
                m.cols,
                m.pitch,
                d.batch_stride,
                need.map_or("more than 2^64".to_string(), |n| n.to_string()),
                m.len
            ),
        });
    }
    Ok(())
}

/// Checks the operands of `C[b] = A[b] B[b]` without a device and returns the shape: each as
/// [`check_batched`]; A is `batch x M x K`, B `batch x N x K`, C `batch x M x N`; at most
/// `MAX_GRID_YZ` row tiles of 128.
///
/// Errors: [`Error::BadShape`], [`Error::PitchAlignment`], [`Error::Misaligned`],
/// [`Error::LengthMismatch`] (memory too small, or batch / M / N / K disagree).
pub fn check_batched_shapes(
    a: &BatchedDims,
    b: &BatchedDims,
    c: &BatchedDims,
) -> Result<BatchedShape> {
    check_batched("batched_gemm A (batch x M x K)", a)?;
    check_batched("batched_gemm B (batch x N x K, column-major per batch)", b)?;
    check_batched("batched_gemm C (batch x M x N)", c)?;
    let (m, k, n) = (a.matrix.rows, a.matrix.cols, b.matrix.rows);
    if a.batch != b.batch
        || a.batch != c.batch
        || b.matrix.cols != k
        || c.matrix.rows != m
        || c.matrix.cols != n
    {
        return Err(Error::LengthMismatch {
            what: "batched_gemm shapes",
            detail: format!(
                "A is {} x {m} x {k}, B {} x {n} x {}, C {} x {} x {}; batch, M (A, C), N (B, C) and K (A, B) must agree",
                a.batch, b.batch, b.matrix.cols, c.batch, c.matrix.rows, c.matrix.cols
            ),
        });
    }
    if m.div_ceil(contract::BM) > contract::MAX_GRID_YZ as usize {
        return Err(Error::TooLarge {
            what: "batched_gemm row tiles (ceil(M / 128), the grid's y)",
            value: m.div_ceil(contract::BM) as u64,
            max: contract::MAX_GRID_YZ as u64,
        });
    }
    Ok(BatchedShape {
        batch: a.batch,
        m,
        n,
        k,
    })
}

/// The 3-D tensor-map description of a batched operand: dims `{cols, rows, batch}`, strides
/// `{pitch, batch_stride}` (bytes), box `box_dims`, 128-byte swizzle.
pub fn batched_desc(d: &BatchedDims, box_dims: [u32; 3]) -> TensorMapDesc {
    let e = d.matrix.elem_bytes as u64;
    TensorMapDesc {
        dtype: crate::tensor_map::TmaDtype::Bf16,
        address: d.matrix.address,
        dims: vec![d.matrix.cols as u64, d.matrix.rows as u64, d.batch as u64],
        strides: vec![d.matrix.pitch as u64 * e, d.batch_stride as u64 * e],
        box_dims: box_dims.to_vec(),
        swizzle: TmaSwizzle::B128,
        l2_promotion: L2Promotion::B256,
    }
}

/// The entry's parameters: `(tmap_a, tmap_b, c, m, n, k, ldc, stride_c)`.
type Sig = (u64, u64, ViewMut<bf16>, u32, u32, u32, u32, u64);

/// The batched GEMM launcher of one device: the sm_90a module loaded, the entry's shared memory
/// limit raised, a pool for the tensor-map tables.
pub struct BatchedGemm<'d> {
    dev: &'d Device,
    _module: Module,
    kernel: TypedKernel<Sig>,
    pool: MemPool,
}

impl std::fmt::Debug for BatchedGemm<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchedGemm")
            .field("device", &self.dev.capabilities().name)
            .finish()
    }
}

impl<'d> BatchedGemm<'d> {
    /// Loads [`crate::SM90A_PTX`] into `dev`'s context, checks the entry's parameter list, and
    /// raises its dynamic shared-memory limit to `contract::SMEM_BYTES`.
    ///
    /// Errors: [`Error::Sm90aRequired`] unless the device is compute capability 9.0;
    /// [`Error::ContractMismatch`], [`Error::SharedMemory`]; those of [`Device::load_module`],
    /// [`Module::kernel`] and [`MemPool::new`].
    pub fn new(dev: &'d Device) -> Result<Self> {
        let caps = dev.capabilities();
        if caps.compute_capability != (9, 0) {
            return Err(Error::Sm90aRequired {
                device: caps.name.clone(),
                major: caps.compute_capability.0,
                minor: caps.compute_capability.1,
            });
        }
        crate::contract_check::check_contract(crate::SM90A_PTX, warpline_gpu::CONTRACT_HASH)?;
        if contract::SMEM_BYTES > caps.max_shared_mem_per_block_optin {
            return Err(Error::SharedMemory {
                kernel: contract::KERNEL,
                requested: contract::SMEM_BYTES,
                max: caps.max_shared_mem_per_block_optin,
            });
        }
        let module = dev.load_module(crate::SM90A_PTX)?;
        module
            .untyped_kernel(contract::KERNEL)?
            .raise_max_dynamic_shared_memory(contract::SMEM_BYTES)?;
        let kernel = module.kernel::<Sig>(contract::KERNEL)?;
        let pool = MemPool::new(dev, 1 << 20)?;
        Ok(Self {
            dev,
            _module: module,
            kernel,
            pool,
        })
    }

    /// Validates `C[b] = A[b] * B[b]` for every batch and prepares its launch on `stream`: the two
    /// 3-D tensor maps encoded and uploaded (stream-ordered) into a table in device memory;
    /// nothing is launched until [`BatchedGemmPlan::launch`], which may run as often as wanted
    /// (no further copies); dropping the plan frees the table on the stream after the last
    /// launch. The plan borrows A and B (shared) and C (exclusively, so C overlaps neither).
    /// Shapes and rules: [`check_batched_shapes`]; A, B, C bound to `stream`, of this device's
    /// context.
    ///
    /// Errors, before anything is queued: [`Error::WrongContext`], [`Error::WrongStream`], those
    /// of [`check_batched_shapes`], the launch-limit errors of [`LaunchConfig::check`],
    /// [`Error::TensorMap`] / [`Error::Cuda`] (`cuTensorMapEncodeTiled`); then those of
    /// [`TensorMapTable::upload`].
    pub fn plan<'a>(
        &'a self,
        stream: &Stream,
        a: BatchedMatrix<'a, bf16>,
        b: BatchedMatrix<'a, bf16>,
        c: BatchedMatrixMut<'a, bf16>,
    ) -> Result<BatchedGemmPlan<'a>> {
        if stream.context_raw() != self.dev.raw_context() {
            return Err(Error::WrongContext {
                what: "batched_gemm stream",
            });
        }
        let shape = check_batched_shapes(&a.dims(), &b.dims(), &c.dims())?;
        check_stream("batched_gemm A", a.view.stream(), stream)?;
        check_stream("batched_gemm B", b.view.stream(), stream)?;
        check_stream("batched_gemm C", c.view.stream(), stream)?;
        // check_matrix bounds the pitch by u32::MAX.
        let (ldc, stride_c) = (c.pitch as u32, c.batch_stride as u64);
        let mut cfg =
            LaunchConfig::linear(1, contract::THREADS_PER_CTA, contract::SMEM_BYTES as u32);
        cfg.grid = shape.grid();
        cfg.check(
            contract::KERNEL,
            &LaunchLimits::of(self.dev, self.kernel.untyped()),
        )?;
        let map_a = TensorMap::new(&a.view, batched_desc(&a.dims(), contract::A_BOX))?;
        let map_b = TensorMap::new(&b.view, batched_desc(&b.dims(), contract::B_BOX))?;
        let table = TensorMapTable::upload(&self.pool, stream, &[map_a, map_b])?;
        let addr = |i| {
            table.address(i).ok_or(Error::Empty {
                what: "batched_gemm tensor-map table",
            })
        };
        let maps = [addr(0)?, addr(1)?];
        Ok(BatchedGemmPlan {
            kernel: &self.kernel,
            stream: stream.clone(),
            table,
            maps,
            c: c.view,
            cfg,
            shape,
            ldc,
            stride_c,
        })
    }

    /// [`Self::plan`] then one [`BatchedGemmPlan::launch`]; returns the shape. Errors: those of
    /// both.
    pub fn gemm<'a>(
        &'a self,
        stream: &Stream,
        a: BatchedMatrix<'a, bf16>,
        b: BatchedMatrix<'a, bf16>,
        c: BatchedMatrixMut<'a, bf16>,
    ) -> Result<BatchedShape> {
        let mut plan = self.plan(stream, a, b, c)?;
        plan.launch()?;
        Ok(plan.shape())
    }
}

/// A validated batched GEMM, ready to launch (see [`BatchedGemm::plan`]).
pub struct BatchedGemmPlan<'a> {
    kernel: &'a TypedKernel<Sig>,
    stream: Stream,
    /// Holds the maps (and so the borrows of A and B) until the plan is dropped.
    table: TensorMapTable<'a>,
    maps: [u64; 2],
    c: DeviceViewMut<'a, bf16>,
    cfg: LaunchConfig,
    shape: BatchedShape,
    ldc: u32,
    stride_c: u64,
}

impl std::fmt::Debug for BatchedGemmPlan<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchedGemmPlan")
            .field("shape", &self.shape)
            .field("grid", &self.cfg.grid)
            .field("maps", &self.table.len())
            .finish()
    }
}

impl BatchedGemmPlan<'_> {
    /// Queues the kernel on the plan's stream. Errors: [`Error::Launch`],
    /// [`Error::ContextPoisoned`].
    pub fn launch(&mut self) -> Result<()> {
        // SAFETY: the maps were encoded over A and B (borrowed by the plan, bound to its
        // stream) with the logical dims, so TMA reads stay inside them (boxes past the edges
        // read zeros); the table lives until the plan is dropped and is freed on this stream
        // after the last launch. The kernel writes C only at (b, r, c) with b < batch, r < M,
        // c < N, i.e. element b * stride_c + r * ldc + c, inside the view (check_batched), and
        // reads nothing of C; C is exclusively borrowed, so it overlaps neither A nor B. ldc and
        // stride_c are multiples of 8 and C 16-byte aligned (its paired 4-byte stores). Grid,
        // block and shared memory are the contract's, checked against the launch limits.
        unsafe {
            self.kernel.launch(
                &self.stream,
                &self.cfg,
                (
                    self.maps[0],
                    self.maps[1],
                    self.c.reborrow(),
                    self.shape.m as u32,
                    self.shape.n as u32,
                    self.shape.k as u32,
                    self.ldc,
                    self.stride_c,
                ),
            )
        }
    }

    /// The problem size.
    pub fn shape(&self) -> BatchedShape {
        self.shape
    }

    /// The plan's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
}

/// cuBLAS strided-batched BF16 GEMM (`cublasGemmStridedBatchedEx`, FP32 compute, BF16 out) on
/// the same operands as [`BatchedGemm::gemm`]: the reference it is measured against.
pub struct CublasBatchedGemm {
    blas: CudaBlas,
    stream: Stream,
}

impl CublasBatchedGemm {
    /// A cuBLAS handle bound to `stream` (a stream of `dev`). Errors: [`Error::WrongContext`],
    /// [`Error::Cublas`], [`Error::ContextPoisoned`].
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

    /// Queues `C[b] = A[b] B[b]` (alpha 1, beta 0). Rules as [`BatchedGemm::gemm`] plus every size,
    /// pitch and the batch at most `i32::MAX`. Errors: those of [`check_batched_shapes`],
    /// [`Error::WrongStream`], [`Error::TooLarge`], [`Error::Cublas`].
    pub fn gemm(
        &self,
        a: &BatchedMatrix<'_, bf16>,
        b: &BatchedMatrix<'_, bf16>,
        c: &mut BatchedMatrixMut<'_, bf16>,
    ) -> Result<()> {
        let shape = check_batched_shapes(&a.dims(), &b.dims(), &c.dims())?;
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
        let (m, n, k, batch) = (
            int(shape.m, "cublas M")?,
            int(shape.n, "cublas N")?,
            int(shape.k, "cublas K")?,
            int(shape.batch, "cublas batch")?,
        );
        let (lda, ldb, ldc) = (
            int(a.pitch, "cublas lda")?,
            int(b.pitch, "cublas ldb")?,
            int(c.pitch, "cublas ldc")?,
        );
        let (alpha, beta) = (1.0f32, 0.0f32);
        use cublas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let bf = cublas_sys::cudaDataType::CUDA_R_16BF;
        crate::device::bind_context(self.stream.ctx(), "cublasGemmStridedBatchedEx")?;
        // SAFETY: the operands were validated (each view holds (batch - 1) * stride + (rows - 1)
        // * pitch + cols elements, which is what cuBLAS touches for these sizes); they are bound
        // to the handle's stream; alpha and beta are host f32 alive for the call. Column-major
        // view: C^T (N x M, ldc) = op_T(B stored N x K, ldb) * A^T (K x M, lda).
        let r = unsafe {
            cublas_result::gemm_strided_batched_ex(
                *self.blas.handle(),
                CUBLAS_OP_T,
                CUBLAS_OP_N,
                n,
                m,
                k,
                (&alpha as *const f32).cast(),
                b.view.device_ptr() as *const std::ffi::c_void,
                bf,
                ldb,
                b.batch_stride as c_longlong,
                a.view.device_ptr() as *const std::ffi::c_void,
                bf,
                lda,
                a.batch_stride as c_longlong,
                (&beta as *const f32).cast(),
                c.view.device_ptr() as *mut std::ffi::c_void,
                bf,
                ldc,
                c.batch_stride as c_longlong,
                batch,
                cublas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        };
        r.map_err(|e| Error::Cublas {
            call: "cublasGemmStridedBatchedEx",
            status: format!("{:?}", e.0),
        })
    }
}

/// f64 reference of element `(batch, i, j)` of `C = A B` from host copies (A: `a[b * sa + i * lda
/// + kk]`, B: `b[b * sb + j * ldb + kk]`), and the sum of `|a * b|` over k (for the tolerance).
#[allow(clippy::too_many_arguments)]
pub fn reference_batched(
    a: &[f32],
    b: &[f32],
    (lda, sa): (usize, usize),
    (ldb, sb): (usize, usize),
    k: usize,
    batch: usize,
    i: usize,
    j: usize,
) -> (f64, f64) {
    let (mut s, mut abs) = (0.0f64, 0.0f64);
    for kk in 0..k {
        let p = a[batch * sa + i * lda + kk] as f64 * b[batch * sb + j * ldb + kk] as f64;
        s += p;
        abs += p.abs();
    }
    (s, abs)
}

/// The error bound the GPU test allows for an element with reference `want` and `sum |a b|` =
/// `abs_sum`: FP32 accumulation (`1e-3` relative to `abs_sum`, far above its `K 2^-24`) plus the
/// BF16 rounding of the output (`2^-8` relative), plus a floor of `1e-6`.
pub fn batched_tolerance(want: f64, abs_sum: f64) -> f64 {
    1e-3 * abs_sum + want.abs() / 256.0 + 1e-6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(batch: usize, rows: usize, cols: usize, pitch: usize, stride: usize) -> BatchedDims {
        let len = (batch - 1) * stride + (rows - 1) * pitch + cols;
        dims(batch, rows, cols, pitch, stride, len, 0x1000, 2)
    }

    #[test]
    fn batched_shapes_of_a_valid_problem() {
        let (b, m, n, k) = (3, 200, 300, 100);
        let s = check_batched_shapes(
            &d(b, m, k, 104, 104 * 200),
            &d(b, n, k, 104, 104 * 304),
            &d(b, m, n, 304, 304 * 208),
        )
        .unwrap();
        assert_eq!(s, BatchedShape { batch: 3, m, n, k });
        assert_eq!(s.grid(), [2, 2, 3]);
        assert_eq!(s.flops(), 2.0 * 3.0 * 200.0 * 300.0 * 100.0);
    }

    #[test]
    fn batched_shapes_refuse_bad_operands() {
        let good_a = d(2, 64, 32, 32, 64 * 32);
        let good_b = d(2, 48, 32, 32, 48 * 32);
        let good_c = d(2, 64, 48, 48, 64 * 48);
        assert!(check_batched_shapes(&good_a, &good_b, &good_c).is_ok());
        // Batch disagrees.
        let c3 = d(3, 64, 48, 48, 64 * 48);
        assert!(matches!(
            check_batched_shapes(&good_a, &good_b, &c3),
            Err(Error::LengthMismatch { .. })
        ));
        // K disagrees.
        let b_k = d(2, 48, 40, 40, 48 * 40);
        assert!(matches!(
            check_batched_shapes(&good_a, &b_k, &good_c),
            Err(Error::LengthMismatch { .. })
        ));
        // Overlapping batches.
        let overlap = d(2, 64, 32, 32, 63 * 32);
        assert!(matches!(
            check_batched_shapes(&overlap, &good_b, &good_c),
            Err(Error::BadShape { .. })
        ));
        // Batch stride not a multiple of 8 elements.
        let odd = d(2, 64, 32, 32, 64 * 32 + 4);
        assert!(matches!(
            check_batched_shapes(&odd, &good_b, &good_c),
            Err(Error::BadShape { .. })
        ));
        // Pitch not a multiple of 16 bytes.
        let pitch = d(2, 64, 30, 30, 64 * 32);
        assert!(matches!(
            check_batched_shapes(&pitch, &good_b, &good_c),
            Err(Error::PitchAlignment { .. })
        ));
        // View too short by one element.
        let mut short = good_c;
        short.matrix.len -= 1;
        assert!(matches!(
            check_batched_shapes(&good_a, &good_b, &short),
            Err(Error::LengthMismatch { .. })
        ));
        // Batch 0 and batch above the grid's z.
        let mut zero = good_a;
        zero.batch = 0;
        assert!(matches!(
            check_batched("A", &zero),
            Err(Error::BadShape { .. })
        ));
        let big = d(65536, 1, 8, 8, 8);
        assert!(matches!(
            check_batched("A", &big),
            Err(Error::BadShape { .. })
        ));
        // Misaligned base.
        let mut mis = good_a;
        mis.matrix.address += 2;
        assert!(matches!(
            check_batched("A", &mis),
            Err(Error::Misaligned { .. })
        ));
        // A stride product that overflows is refused, not wrapped.
        let huge = BatchedDims {
            batch: 65535,
            matrix: MatrixDims {
                rows: 1,
                cols: 8,
                pitch: 8,
                len: usize::MAX,
                address: 0x1000,
                elem_bytes: 2,
            },
            batch_stride: usize::MAX / 8 * 8,
        };
        assert!(matches!(
            check_batched("A", &huge),
            Err(Error::LengthMismatch { .. })
        ));
    }

    #[test]
    fn batched_desc_is_a_valid_3d_map() {
        let a = d(3, 200, 100, 104, 104 * 200);
        let desc = batched_desc(&a, contract::A_BOX);
        assert_eq!(desc.dims, vec![100, 200, 3]);
        assert_eq!(desc.strides, vec![208, 208 * 200]);
        desc.validate().unwrap();
    }

    #[test]
    fn reference_and_tolerance() {
        // batch 1 of 2, 1 x 2 times (1 x 2)^T.
        let a = [0.0, 0.0, 1.0, -2.0];
        let b = [0.0, 0.0, 3.0, 4.0];
        let (v, abs) = reference_batched(&a, &b, (2, 2), (2, 2), 2, 1, 0, 0);
        assert_eq!((v, abs), (-5.0, 11.0));
        assert!(batched_tolerance(v, abs) > 0.0);
    }
}
