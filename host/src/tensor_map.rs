//! TMA tensor maps: the 128-byte `CUtensorMap` descriptors that `cp.async.bulk.tensor` loads and
//! stores use (PTX ISA 8.3, §9.7.9.25 "Data Movement and Conversion Instructions:
//! cp.async.bulk.tensor"; §5.5 "Tensors"), encoded on the host by `cuTensorMapEncodeTiled` (CUDA
//! driver API, "Tensor Map Object Management").
//!
//! Three layers:
//! - [`TensorMapDesc`]: a plain description (dtype, address, dims, byte strides, box, swizzle,
//!   L2 promotion). [`TensorMapDesc::validate`] checks every rule the driver documents before
//!   the driver is called, each failure an [`Error::TensorMap`] naming the [`TensorMapRule`],
//!   what was given and what is allowed. Pure: unit-tested without a GPU.
//! - [`TensorMap`]: a validated, encoded map of a typed device view ([`TensorMap::new`],
//!   [`TensorMap::matrix`]), which also checks that every element the map can address lies in
//!   the view. It borrows the view's buffer for `'a`, so it cannot outlive the memory it names.
//! - [`TensorMapTable`]: where maps live for a kernel. A kernel cannot take a `CUtensorMap` by
//!   value from Rust (rustc's nvptx call ABI caps parameter alignment at 16 bytes, and the map
//!   needs 64; see ../shared/docs/hopper-tensor-cores.md, pitfall 1), so the maps are copied into
//!   a small table in device **global memory** (stream-ordered, on the launch stream) and each
//!   kernel receives the **device address of its map as a `u64` parameter**. The kernel reads the
//!   map through `fence.proxy.tensormap::generic.acquire` / `prefetch.tensormap` before its first
//!   TMA operation. The table is freed stream-ordered on its stream when dropped, so it stays
//!   alive for every kernel queued on that stream before the drop.

use std::marker::PhantomData;

use bytemuck::Pod;
use cudarc::driver::sys;

use crate::driver::tensor_map::{encode_tiled, EncodeTiled};
use crate::error::{Error, Result};
use crate::memory::{DeviceBuffer, DeviceView, DeviceViewMut, MemPool};
use crate::stream::{Event, Stream};

/// Bytes of a `CUtensorMap`.
pub const TENSOR_MAP_BYTES: usize = 128;
/// Alignment a `CUtensorMap` needs in memory, bytes (the CUDA 13 headers declare 128; the
/// hardware needs 64). Table slots are 128 bytes apart from a 256-byte aligned base.
pub const TENSOR_MAP_ALIGN: usize = 64;
/// Largest tensor rank of a tiled map.
pub const MAX_RANK: usize = 5;
/// Largest box extent per dimension, elements.
pub const MAX_BOX: u32 = 256;
/// Global strides are multiples of this many bytes, and so is the base address.
pub const GLOBAL_ALIGN: u64 = 16;
/// Global strides are below this many bytes (2^40).
pub const MAX_STRIDE: u64 = 1 << 40;
/// Global dimensions are below this many elements (2^32).
pub const MAX_DIM: u64 = 1 << 32;

/// Defined in [`crate::error`] (the error type's layer, below this one); re-exported here, its
/// documented path.
pub use crate::error::TensorMapRule;

/// Element types of a tensor map (`CUtensorMapDataType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmaDtype {
    /// `CU_TENSOR_MAP_DATA_TYPE_UINT8`.
    U8,
    /// `CU_TENSOR_MAP_DATA_TYPE_UINT16`.
    U16,
    /// `CU_TENSOR_MAP_DATA_TYPE_UINT32`.
    U32,
    /// `CU_TENSOR_MAP_DATA_TYPE_INT32`.
    I32,
    /// `CU_TENSOR_MAP_DATA_TYPE_UINT64`.
    U64,
    /// `CU_TENSOR_MAP_DATA_TYPE_INT64`.
    I64,
    /// `CU_TENSOR_MAP_DATA_TYPE_FLOAT16`.
    F16,
    /// `CU_TENSOR_MAP_DATA_TYPE_BFLOAT16`.
    Bf16,
    /// `CU_TENSOR_MAP_DATA_TYPE_FLOAT32`.
    F32,
    /// `CU_TENSOR_MAP_DATA_TYPE_FLOAT64`.
    F64,
}

impl TmaDtype {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            Self::U8 => 1,
            Self::U16 | Self::F16 | Self::Bf16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 => 8,
        }
    }

    fn to_driver(self) -> sys::CUtensorMapDataType {
        use sys::CUtensorMapDataType as D;
        match self {
            Self::U8 => D::CU_TENSOR_MAP_DATA_TYPE_UINT8,
            Self::U16 => D::CU_TENSOR_MAP_DATA_TYPE_UINT16,
            Self::U32 => D::CU_TENSOR_MAP_DATA_TYPE_UINT32,
            Self::I32 => D::CU_TENSOR_MAP_DATA_TYPE_INT32,
            Self::U64 => D::CU_TENSOR_MAP_DATA_TYPE_UINT64,
            Self::I64 => D::CU_TENSOR_MAP_DATA_TYPE_INT64,
            Self::F16 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
            Self::Bf16 => D::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            Self::F32 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            Self::F64 => D::CU_TENSOR_MAP_DATA_TYPE_FLOAT64,
        }
    }
}

/// Host element types with a TMA data type. Implemented for the integer and float types TMA
/// knows, and for `half::bf16` / `half::f16`.
pub trait TmaElement: Pod {
    /// The tensor map's data type for this element type.
    const DTYPE: TmaDtype;
}

macro_rules! tma_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl TmaElement for $t {
            const DTYPE: TmaDtype = TmaDtype::$d;
        }
    )*};
}
tma_element!(
    u8 => U8, u16 => U16, u32 => U32, i32 => I32, u64 => U64, i64 => I64,
    half::f16 => F16, half::bf16 => Bf16, f32 => F32, f64 => F64,
);

/// Shared-memory swizzle of the box (`CUtensorMapSwizzle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmaSwizzle {
    /// No swizzle.
    None,
    /// 32-byte swizzle span.
    B32,
    /// 64-byte swizzle span.
    B64,
    /// 128-byte swizzle span (what wgmma's 128B shared-memory layout wants).
    B128,
}

impl TmaSwizzle {
    /// The swizzle span in bytes (`None`: no limit).
    pub fn span(self) -> Option<u64> {
        match self {
            Self::None => None,
            Self::B32 => Some(32),
            Self::B64 => Some(64),
            Self::B128 => Some(128),
        }
    }

    fn to_driver(self) -> sys::CUtensorMapSwizzle {
        use sys::CUtensorMapSwizzle as S;
        match self {
            Self::None => S::CU_TENSOR_MAP_SWIZZLE_NONE,
            Self::B32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
            Self::B64 => S::CU_TENSOR_MAP_SWIZZLE_64B,
            Self::B128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
        }
    }
}

/// L2 promotion of the loads (`CUtensorMapL2promotion`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L2Promotion {
    /// No promotion.
    None,
    /// 64-byte sectors.
    B64,
    /// 128-byte lines.
    B128,
    /// 256 bytes.
    B256,
}

impl L2Promotion {
    fn to_driver(self) -> sys::CUtensorMapL2promotion {
        use sys::CUtensorMapL2promotion as L;
        match self {
            Self::None => L::CU_TENSOR_MAP_L2_PROMOTION_NONE,
            Self::B64 => L::CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
            Self::B128 => L::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            Self::B256 => L::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        }
    }
}

/// A tiled tensor map as plain data: what `cuTensorMapEncodeTiled` is asked for. Interleave is
/// always `NONE`, element strides are all 1 and the out-of-bounds fill is `NONE` (zeros on load;
/// stores are clipped to the global dims).
///
/// All arrays are innermost dimension first (for a row-major matrix: `dims = [cols, rows]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorMapDesc {
    /// Element type.
    pub dtype: TmaDtype,
    /// Device address of element `[0, 0, ...]`; 16-byte aligned.
    pub address: u64,
    /// Global dimensions, elements; each 1 to 2^32 - 1; 1 to 5 of them.
    pub dims: Vec<u64>,
    /// Byte strides of dimensions 1 and up (`dims.len() - 1` of them): multiples of 16 below
    /// 2^40, each at least the byte extent of the dimension below (`dims[0] * elem` for the
    /// first).
    pub strides: Vec<u64>,
    /// Box (the tile one TMA operation moves), elements per dimension, 1 to 256 each; the inner
    /// dimension spans a multiple of 16 bytes and at most the swizzle span.
    pub box_dims: Vec<u32>,
    /// Shared-memory swizzle.
    pub swizzle: TmaSwizzle,
    /// L2 promotion.
    pub l2_promotion: L2Promotion,
}

fn tm_err(rule: TensorMapRule, detail: String) -> Error {
    Error::TensorMap { rule, detail }
}

impl TensorMapDesc {
    /// A row-major matrix of `rows x cols` elements with a row pitch of `pitch` elements at
    /// `address`: dims `[cols, rows]`, stride `[pitch * elem]` bytes. Not validated yet.
    pub fn matrix(
        dtype: TmaDtype,
        address: u64,
        cols: u64,
        rows: u64,
        pitch: u64,
        box_dims: [u32; 2],
        swizzle: TmaSwizzle,
    ) -> Self {
        Self {
            dtype,
            address,
            dims: vec![cols, rows],
            strides: vec![pitch.saturating_mul(dtype.bytes() as u64)],
            box_dims: box_dims.to_vec(),
            swizzle,
            l2_promotion: L2Promotion::B256,
        }
    }

    /// Checks the description against the rules of `cuTensorMapEncodeTiled` (CUDA driver API,
    /// interleave `NONE`), in this order: rank (1 to 5; `dims`, `box_dims` of rank entries,
    /// `strides` of rank - 1), base address (16-byte aligned), dims (1 to 2^32 - 1), strides
    /// (multiples of 16 bytes, below 2^40, each at least the extent of the dimension below),
    /// box (1 to 256 per dimension; inner box a multiple of 16 bytes), swizzle (inner box bytes
    /// at most the span: 32, 64 or 128).
    ///
    /// Errors: [`Error::TensorMap`] with the [`TensorMapRule`] broken, what was given and what is
    /// allowed.
    pub fn validate(&self) -> Result<()> {
        let rank = self.dims.len();
        if !(1..=MAX_RANK).contains(&rank)
            || self.box_dims.len() != rank
            || self.strides.len() + 1 != rank
        {
            return Err(tm_err(
                TensorMapRule::Rank,
                format!(
                    "{rank} dims, {} box dims, {} strides; allowed: rank 1 to {MAX_RANK}, with as many box dims and rank - 1 strides",
                    self.box_dims.len(),
                    self.strides.len()
                ),
            ));
        }
        if !self.address.is_multiple_of(GLOBAL_ALIGN) {
            return Err(tm_err(
                TensorMapRule::BaseAlignment,
                format!(
                    "global address {:#x} is not 16-byte aligned; allowed: multiples of 16 bytes",
                    self.address
                ),
            ));
        }
        for (i, &d) in self.dims.iter().enumerate() {
            if d == 0 || d >= MAX_DIM {
                return Err(tm_err(
                    TensorMapRule::Dim,
                    format!("dim {i} is {d} elements; allowed: 1 to 2^32 - 1"),
                ));
            }
        }
        let elem = self.dtype.bytes() as u64;
        let mut below = self.dims[0].saturating_mul(elem);
        for (i, &s) in self.strides.iter().enumerate() {
            let dim = i + 1;
            if !s.is_multiple_of(GLOBAL_ALIGN) || s >= MAX_STRIDE {
                return Err(tm_err(
                    TensorMapRule::Stride,
                    format!(
                        "stride of dim {dim} is {s} bytes; allowed: multiples of 16 bytes below 2^40 (pad the row pitch to a multiple of {} elements of {elem} bytes)",
                        (GLOBAL_ALIGN / elem).max(1)
                    ),
                ));
            }
            if s < below {
                return Err(tm_err(
                    TensorMapRule::Stride,
                    format!(
                        "stride of dim {dim} is {s} bytes, less than the {below} bytes dim {} spans; allowed: at least the extent of the dimension below (a row pitch >= the row length)",
                        dim - 1
                    ),
                ));
            }
            below = s.saturating_mul(self.dims[dim]);
        }
        for (i, &b) in self.box_dims.iter().enumerate() {
            if b == 0 || b > MAX_BOX {
                return Err(tm_err(
                    TensorMapRule::Box,
                    format!("box dim {i} is {b} elements; allowed: 1 to {MAX_BOX}"),
                ));
            }
        }
        let inner = self.box_dims[0] as u64 * elem;
        if !inner.is_multiple_of(GLOBAL_ALIGN) {
            return Err(tm_err(
                TensorMapRule::Box,
                format!(
                    "inner box dim spans {inner} bytes ({} elements of {elem} bytes); allowed: multiples of 16 bytes",
                    self.box_dims[0]
                ),
            ));
        }
        if let Some(span) = self.swizzle.span() {
            if inner > span {
                return Err(tm_err(
                    TensorMapRule::SwizzleSpan,
                    format!(
                        "inner box dim spans {inner} bytes but the {span}-byte swizzle spans {span}; allowed: at most {span} bytes ({} elements of {elem} bytes)",
                        span / elem
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Bytes from `address` to one past the last element the map can address:
    /// `dims[0] * elem + sum_i (dims[i] - 1) * strides[i - 1]` (saturating). Call after
    /// [`TensorMapDesc::validate`].
    pub fn extent_bytes(&self) -> u64 {
        let elem = self.dtype.bytes() as u64;
        let mut end = self.dims.first().copied().unwrap_or(0).saturating_mul(elem);
        for (s, d) in self.strides.iter().zip(self.dims.iter().skip(1)) {
            end = end.saturating_add(s.saturating_mul(d.saturating_sub(1)));
        }
        end
    }

    /// Bytes past the end of each row (dimension 0) that a TMA store through this map may write:
    /// `dims[0] * elem` rounded up to a multiple of 16, minus `dims[0] * elem` (0 to 15). A TMA
    /// store writes each row of its box in whole 16-byte pieces, so where a row ends inside a
    /// piece the rest of the piece is written too, with what the shared-memory box holds there
    /// (observed on the H100: tc_gemm's ragged C chunks, and issue 22's rank-3 TMA copy writing
    /// zeros past `dims[0] = 37` f32; reported for Triton's descriptor stores,
    /// triton-lang/triton#11583). Rows start 16-byte aligned (base and strides are multiples of
    /// 16), so the piece ends at the next 16-byte boundary. Loads are clipped exactly.
    pub fn store_overhang_bytes(&self) -> u64 {
        let row = self
            .dims
            .first()
            .copied()
            .unwrap_or(0)
            .saturating_mul(self.dtype.bytes() as u64);
        row.next_multiple_of(GLOBAL_ALIGN) - row
    }

    /// Bytes from `address` to one past the last byte a TMA *store* through the map can write:
    /// [`TensorMapDesc::extent_bytes`] plus [`TensorMapDesc::store_overhang_bytes`] (the last
    /// row's 16-byte overhang). A kernel that TMA-stores boxes reaching a row's end needs its
    /// memory to reach this far, with the rows' overhang bytes (their padding) free to be
    /// overwritten; [`check_store_extent`] checks the first part. Call after
    /// [`TensorMapDesc::validate`].
    pub fn store_extent_bytes(&self) -> u64 {
        self.extent_bytes()
            .saturating_add(self.store_overhang_bytes())
    }
}

/// An encoded tensor map of memory borrowed for `'a` (128 bytes, `CUtensorMap`).
#[derive(Clone)]
pub struct TensorMap<'a> {
    raw: [u64; 16],
    desc: TensorMapDesc,
    _mem: PhantomData<&'a ()>,
}

impl std::fmt::Debug for TensorMap<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorMap")
            .field("desc", &self.desc)
            .finish()
    }
}

impl<'a> TensorMap<'a> {
    /// Encodes `desc` over the memory of `view` (`desc.address` is taken from the view, and its
    /// dtype must be `T`'s): validates the description ([`TensorMapDesc::validate`]), checks
    /// that every element it addresses lies in the view, then calls `cuTensorMapEncodeTiled`.
    ///
    /// Errors: [`Error::TensorMap`] (rule [`TensorMapRule::Dtype`] when `desc.dtype` is not
    /// `T::DTYPE`, [`TensorMapRule::Extent`] when the map reaches past the view, the others from
    /// validation); [`Error::Cuda`] naming `cuTensorMapEncodeTiled` if the driver rejects it.
    pub fn new<T: TmaElement>(view: &DeviceView<'a, T>, desc: TensorMapDesc) -> Result<Self> {
        Self::over(view.device_ptr(), view.len(), desc, T::DTYPE)
    }

    /// As [`TensorMap::new`] over a mutable view (for TMA stores into it). The view must hold
    /// [`TensorMapDesc::extent_bytes`]; a kernel that TMA-stores through the map writes rows in
    /// whole 16-byte pieces, up to [`TensorMapDesc::store_overhang_bytes`] past each row's end
    /// (see there), which its launch contract must allow: check [`check_store_extent`] where
    /// boxes reach a row's end, or store such edges with plain stores (as tc_gemm does).
    pub fn new_mut<T: TmaElement>(
        view: &DeviceViewMut<'a, T>,
        desc: TensorMapDesc,
    ) -> Result<Self> {
        Self::over(view.device_ptr(), view.len(), desc, T::DTYPE)
    }

    /// A 2-D map of a row-major `rows x cols` matrix with a row pitch of `pitch` elements in
    /// `view` (dims `[cols, rows]`, stride `pitch * size_of::<T>()` bytes), box `box_dims`
    /// (`[inner, outer]`), `swizzle`, 256-byte L2 promotion. Errors as [`TensorMap::new`].
    pub fn matrix<T: TmaElement>(
        view: &DeviceView<'a, T>,
        rows: usize,
        cols: usize,
        pitch: usize,
        box_dims: [u32; 2],
        swizzle: TmaSwizzle,
    ) -> Result<Self> {
        let desc = matrix_desc::<T>(view.device_ptr(), rows, cols, pitch, box_dims, swizzle);
        Self::new(view, desc)
    }

    /// [`TensorMap::matrix`] over a mutable view.
    pub fn matrix_mut<T: TmaElement>(
        view: &DeviceViewMut<'a, T>,
        rows: usize,
        cols: usize,
        pitch: usize,
        box_dims: [u32; 2],
        swizzle: TmaSwizzle,
    ) -> Result<Self> {
        let desc = matrix_desc::<T>(view.device_ptr(), rows, cols, pitch, box_dims, swizzle);
        Self::new_mut(view, desc)
    }

    fn over(address: u64, len: usize, mut desc: TensorMapDesc, dtype: TmaDtype) -> Result<Self> {
        if desc.dtype != dtype {
            return Err(tm_err(
                TensorMapRule::Dtype,
                format!(
                    "the description says {:?} but the memory holds {dtype:?}; allowed: the view's own element type",
                    desc.dtype
                ),
            ));
        }
        desc.address = address;
        desc.validate()?;
        check_extent(&desc, len)?;
        let rank = desc.dims.len();
        let ones = [1u32; MAX_RANK];
        let map = encode_tiled(&EncodeTiled {
            dtype: desc.dtype.to_driver(),
            rank: rank as u32,
            global_address: desc.address,
            dims: &desc.dims,
            strides: &desc.strides,
            box_dims: &desc.box_dims,
            element_strides: &ones[..rank],
            interleave: sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle: desc.swizzle.to_driver(),
            l2_promotion: desc.l2_promotion.to_driver(),
            oob_fill: sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        })?;
        Ok(Self {
            raw: map.opaque,
            desc,
            _mem: PhantomData,
        })
    }

    /// The description the map was encoded from.
    pub fn desc(&self) -> &TensorMapDesc {
        &self.desc
    }

    /// The 128 bytes of the `CUtensorMap`.
    pub fn bytes(&self) -> &[u8; TENSOR_MAP_BYTES] {
        bytemuck::cast_ref(&self.raw)
    }
}

/// [`Error::TensorMap`] ([`TensorMapRule::Extent`]) unless the map of `desc` stays inside a view
/// of `len` elements starting at `desc.address`. `desc` is valid.
pub fn check_extent(desc: &TensorMapDesc, len: usize) -> Result<()> {
    let have = (len as u64).saturating_mul(desc.dtype.bytes() as u64);
    let need = desc.extent_bytes();
    if need > have {
        return Err(tm_err(
            TensorMapRule::Extent,
            format!(
                "dims {:?} with strides {:?} reach {need} bytes from the base, but the view holds {have} bytes ({len} elements); allowed: (rows - 1) * pitch + cols elements within the view",
                desc.dims, desc.strides
            ),
        ));
    }
    Ok(())
}

/// [`Error::TensorMap`] ([`TensorMapRule::Extent`]) unless every byte a TMA store through the map
/// of `desc` can write ([`TensorMapDesc::store_extent_bytes`]: the extent plus the last row's
/// 16-byte overhang) lies inside a view of `len` elements starting at `desc.address`. `desc` is
/// valid.
pub fn check_store_extent(desc: &TensorMapDesc, len: usize) -> Result<()> {
    let have = (len as u64).saturating_mul(desc.dtype.bytes() as u64);
    let need = desc.store_extent_bytes();
    if need > have {
        return Err(tm_err(
            TensorMapRule::Extent,
            format!(
                "TMA stores through dims {:?} with strides {:?} reach {need} bytes from the base (rows are written in whole 16-byte pieces: {} bytes past each row's end), but the view holds {have} bytes ({len} elements); allowed: the extent rounded up to the last row's next 16-byte boundary",
                desc.dims,
                desc.strides,
                desc.store_overhang_bytes()
            ),
        ));
    }
    Ok(())
}

/// Tensor maps in device global memory for the kernels that use them (see the module docs):
/// slot `i` holds map `i` at [`TensorMapTable::address`]`(i)`, 128-byte aligned.
///
/// Made by [`TensorMapTable::upload`]: a stream-ordered allocation (`cuMemAllocFromPoolAsync`)
/// and copy (`cuMemcpyHtoDAsync`) on `stream`. Kernels on `stream` queued after the upload see
/// the maps. Dropping the table frees the memory stream-ordered on `stream` (`cuMemFreeAsync`),
/// after every kernel queued on `stream` before the drop; kernels that use it must therefore be
/// queued on `stream` (the launchers check). The host copy the upload reads from is kept until
/// the copy has completed (an event marks it; if it is still pending at drop, warpline's reaper
/// thread frees the host copy once the event has completed, polling it without blocking
/// anything else). The table borrows the maps' memory for `'a`.
pub struct TensorMapTable<'a> {
    buf: DeviceBuffer<[u64; 16]>,
    staged: Option<Box<[[u64; 16]]>>,
    copied: Option<Event>,
    _mem: PhantomData<&'a ()>,
}

impl std::fmt::Debug for TensorMapTable<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "TensorMapTable[{}] at {:#x}",
            self.buf.len(),
            self.buf.device_ptr()
        )
    }
}

impl<'a> TensorMapTable<'a> {
    /// Allocates `maps.len()` slots from `pool` on `stream` and queues the copy of the maps into
    /// them. Errors: [`Error::Empty`] for no maps, [`Error::BadShape`] on a stream that is
    /// capturing a graph (a captured copy would read the host staging buffer at every replay,
    /// long after the table is gone: make the GEMM plan before the capture and hand it to
    /// [`crate::ordering::TaskGraph::gemm`]), the
    /// allocation errors of [`MemPool::alloc_async`], [`Error::Cuda`] (`cuStreamIsCapturing`,
    /// `cuMemcpyHtoDAsync`, `cuEventRecord`).
    pub fn upload(pool: &MemPool, stream: &Stream, maps: &[TensorMap<'a>]) -> Result<Self> {
        if maps.is_empty() {
            return Err(Error::Empty {
                what: "tensor map table",
            });
        }
        crate::device::bind_context(stream.ctx(), "cuStreamIsCapturing")?;
        // Not a check-then-act race (issue 19, item 2): warpline's safe API never captures on a
        // stream that other code can reach (TaskGraph and Chain capture on private streams made
        // for the capture), so `stream` can be capturing only through this thread's own
        // `TaskGraph::capture_unchecked` closure (whose contract keeps the capture stream in the
        // closure) or foreign unsafe code on `Stream::raw`; no other thread can start a capture
        // on it between this check and the enqueue below.
        // SAFETY: a live stream of the context bound just above.
        if unsafe { crate::driver::graph::stream_is_capturing(stream.raw()) }? {
            return Err(Error::BadShape {
                what: "tensor map table upload",
                detail: "the stream is capturing a graph; allowed: a stream outside any capture \
                         (make the GEMM plan first, then hand it to TaskGraph::gemm, whose captured graphs own it)"
                    .into(),
            });
        }
        let mut buf = pool.alloc_async::<[u64; 16]>(stream, maps.len())?;
        let staged: Box<[[u64; 16]]> = maps.iter().map(|m| m.raw).collect();
        // SAFETY: `staged` is kept in the table until the event recorded right after the copy
        // has completed (see Drop), and is never written after this point.
        unsafe { buf.copy_from_host_async(&staged) }?;
        let copied = stream.record_marker().inspect_err(|_| {
            // No event to wait for: finish the copy before `staged` is freed below.
            let _ = stream.synchronize();
        })?;
        Ok(Self {
            buf,
            staged: Some(staged),
            copied: Some(copied),
            _mem: PhantomData,
        })
    }

    /// Number of maps.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Always false: a table has at least one map.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Device (global-memory) address of map `i`, the `u64` a kernel takes; `None` past the end.
    pub fn address(&self, i: usize) -> Option<u64> {
        (i < self.buf.len()).then(|| self.buf.device_ptr() + (i * TENSOR_MAP_BYTES) as u64)
    }

    /// The stream the table was uploaded on and is freed on.
    pub fn stream(&self) -> &Stream {
        self.buf.stream()
    }
}

impl Drop for TensorMapTable<'_> {
    fn drop(&mut self) {
        let (Some(staged), Some(copied)) = (self.staged.take(), self.copied.take()) else {
            return;
        };
        if copied.is_complete().unwrap_or(false) {
            return;
        }
        // The copy may still read `staged`: free it once the copy is done, off this thread. The
        // reaper polls the event and frees host memory of its own without closing the wait gate,
        // so no `Fence::guard` or `Signal::wait_until` waits meanwhile (issue 19, item 10).
        crate::reaper::defer_after(vec![copied], false, move || drop(staged));
    }
}

/// The description [`TensorMap::matrix`] and [`TensorMap::matrix_mut`] build: a row-major
/// `rows x cols` matrix of `T` at `address` with a row pitch of `pitch` elements.
fn matrix_desc<T: TmaElement>(
    address: u64,
    rows: usize,
    cols: usize,
    pitch: usize,
    box_dims: [u32; 2],
    swizzle: TmaSwizzle,
) -> TensorMapDesc {
    TensorMapDesc::matrix(
        T::DTYPE,
        address,
        cols as u64,
        rows as u64,
        pitch as u64,
        box_dims,
        swizzle,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok_desc() -> TensorMapDesc {
        // A 1000 x 1000 bf16 matrix with a pitch of 1024, 64 x 128 boxes, 128-byte swizzle.
        TensorMapDesc::matrix(
            TmaDtype::Bf16,
            0x7f00_0000_0000,
            1000,
            1000,
            1024,
            [64, 128],
            TmaSwizzle::B128,
        )
    }

    fn rule(d: &TensorMapDesc) -> TensorMapRule {
        match d.validate() {
            Err(Error::TensorMap { rule, detail }) => {
                assert!(detail.contains("allowed"), "{detail}");
                rule
            }
            other => panic!("expected a tensor map error, got {other:?}"),
        }
    }

    #[test]
    fn a_good_description_validates() {
        ok_desc().validate().unwrap();
        let mut d = ok_desc();
        d.swizzle = TmaSwizzle::None;
        d.box_dims = vec![256, 256];
        d.validate().unwrap();
        // Rank 1 and rank 5.
        let one = TensorMapDesc {
            dtype: TmaDtype::F32,
            address: 256,
            dims: vec![7],
            strides: vec![],
            box_dims: vec![4],
            swizzle: TmaSwizzle::None,
            l2_promotion: L2Promotion::None,
        };
        one.validate().unwrap();
        let five = TensorMapDesc {
            dims: vec![4; 5],
            strides: vec![16, 64, 256, 1024],
            box_dims: vec![4; 5],
            ..one
        };
        five.validate().unwrap();
    }

    #[test]
    fn rank_rules() {
        let mut d = ok_desc();
        d.dims = vec![];
        d.box_dims = vec![];
        d.strides = vec![];
        assert_eq!(rule(&d), TensorMapRule::Rank);
        let mut d = ok_desc();
        d.dims = vec![16; 6];
        d.box_dims = vec![8; 6];
        d.strides = vec![32; 5];
        assert_eq!(rule(&d), TensorMapRule::Rank);
        let mut d = ok_desc();
        d.strides = vec![];
        assert_eq!(rule(&d), TensorMapRule::Rank);
        let mut d = ok_desc();
        d.box_dims = vec![64];
        assert_eq!(rule(&d), TensorMapRule::Rank);
    }

    #[test]
    fn base_address_must_be_16_byte_aligned() {
        for a in [1u64, 2, 8, 0x1008] {
            let mut d = ok_desc();
            d.address = a;
            assert_eq!(rule(&d), TensorMapRule::BaseAlignment, "{a:#x}");
        }
        let mut d = ok_desc();
        d.address = 0x1010;
        d.validate().unwrap();
    }

    #[test]
    fn dims_are_1_to_2_pow_32_minus_1() {
        let mut d = ok_desc();
        d.dims[1] = 0;
        assert_eq!(rule(&d), TensorMapRule::Dim);
        let mut d = ok_desc();
        d.dims[1] = 1 << 32;
        assert_eq!(rule(&d), TensorMapRule::Dim);
        let mut d = ok_desc();
        d.dims[1] = (1 << 32) - 1;
        d.validate().unwrap();
    }

    #[test]
    fn strides_are_16_byte_multiples_below_2_pow_40_covering_the_row() {
        // A bf16 pitch of 1001 elements: 2002 bytes.
        let mut d = ok_desc();
        d.strides = vec![2002];
        let e = d.validate().unwrap_err();
        assert!(
            matches!(&e, Error::TensorMap { rule: TensorMapRule::Stride, detail } if detail.contains("multiple of 8 elements")),
            "{e}"
        );
        let mut d = ok_desc();
        d.strides = vec![1 << 40];
        assert_eq!(rule(&d), TensorMapRule::Stride);
        // A pitch below the row length (1000 bf16 = 2000 bytes).
        let mut d = ok_desc();
        d.strides = vec![1984];
        assert_eq!(rule(&d), TensorMapRule::Stride);
        // Exactly the row (pitch 1000 = 2000 bytes, a multiple of 16): fine.
        let mut d = ok_desc();
        d.strides = vec![2000];
        d.validate().unwrap();
    }

    #[test]
    fn box_is_1_to_256_with_a_16_byte_inner_span() {
        let mut d = ok_desc();
        d.box_dims[1] = 257;
        assert_eq!(rule(&d), TensorMapRule::Box);
        let mut d = ok_desc();
        d.box_dims[1] = 0;
        assert_eq!(rule(&d), TensorMapRule::Box);
        // 12 bf16 = 24 bytes: not a multiple of 16.
        let mut d = ok_desc();
        d.box_dims[0] = 12;
        assert_eq!(rule(&d), TensorMapRule::Box);
    }

    #[test]
    fn inner_box_fits_the_swizzle_span() {
        // 128 bf16 = 256 bytes > 128.
        let mut d = ok_desc();
        d.box_dims[0] = 128;
        assert_eq!(rule(&d), TensorMapRule::SwizzleSpan);
        for (sw, max_elems) in [
            (TmaSwizzle::B32, 16u32),
            (TmaSwizzle::B64, 32),
            (TmaSwizzle::B128, 64),
        ] {
            let mut d = ok_desc();
            d.swizzle = sw;
            d.box_dims[0] = max_elems;
            d.validate().unwrap();
            d.box_dims[0] = max_elems + 8;
            assert_eq!(rule(&d), TensorMapRule::SwizzleSpan, "{sw:?}");
        }
        // f32 with 128-byte swizzle: 32 elements at most.
        let mut d = ok_desc();
        d.dtype = TmaDtype::F32;
        d.strides = vec![4096];
        d.box_dims[0] = 32;
        d.validate().unwrap();
        d.box_dims[0] = 64;
        assert_eq!(rule(&d), TensorMapRule::SwizzleSpan);
    }

    #[test]
    fn extent_is_checked_against_the_view() {
        let d = ok_desc();
        // (rows - 1) * pitch + cols elements.
        let need = 999 * 1024 + 1000;
        assert_eq!(d.extent_bytes(), need as u64 * 2);
        check_extent(&d, need).unwrap();
        let e = check_extent(&d, need - 1).unwrap_err();
        assert!(
            matches!(
                e,
                Error::TensorMap {
                    rule: TensorMapRule::Extent,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn stores_reach_the_next_16_byte_boundary_of_a_row() {
        // Issue 22's rank-3 copy: 37 f32 per row (148 bytes), pitch 44, 13 rows + 1 padding row
        // per plane, 5 planes: a store may write 12 bytes past each row's end.
        let d = TensorMapDesc {
            dtype: TmaDtype::F32,
            address: 0x7f00_0000_0000,
            dims: vec![37, 13, 5],
            strides: vec![44 * 4, 616 * 4],
            box_dims: vec![8, 4, 2],
            swizzle: TmaSwizzle::None,
            l2_promotion: L2Promotion::B128,
        };
        d.validate().unwrap();
        assert_eq!(d.store_overhang_bytes(), 12);
        let len = 36 + 12 * 44 + 4 * 616 + 1;
        assert_eq!(d.extent_bytes(), len as u64 * 4);
        assert_eq!(d.store_extent_bytes(), (len as u64 + 3) * 4);
        check_extent(&d, len).unwrap();
        let e = check_store_extent(&d, len + 2).unwrap_err();
        assert!(
            matches!(&e, Error::TensorMap { rule: TensorMapRule::Extent, detail } if detail.contains("16-byte pieces") && detail.contains("allowed")),
            "{e}"
        );
        check_store_extent(&d, len + 3).unwrap();
        // Rows of whole 16-byte pieces: no overhang (bf16 x 1000 = 2000 bytes; u8 x 48).
        assert_eq!(ok_desc().store_overhang_bytes(), 0);
        assert_eq!(ok_desc().store_extent_bytes(), ok_desc().extent_bytes());
        for (dtype, cols, over) in [
            (TmaDtype::U8, 48u64, 0u64),
            (TmaDtype::U8, 49, 15),
            (TmaDtype::Bf16, 17, 14),
            (TmaDtype::F32, 19, 4),
            (TmaDtype::F32, 21, 12),
            (TmaDtype::F64, 3, 8),
        ] {
            let d = TensorMapDesc {
                dtype,
                dims: vec![cols],
                strides: vec![],
                box_dims: vec![16],
                ..ok_desc()
            };
            assert_eq!(d.store_overhang_bytes(), over, "{dtype:?} x {cols}");
        }
    }

    #[test]
    fn dtype_sizes() {
        assert_eq!(<half::bf16 as TmaElement>::DTYPE.bytes(), 2);
        assert_eq!(<half::f16 as TmaElement>::DTYPE.bytes(), 2);
        assert_eq!(<f32 as TmaElement>::DTYPE.bytes(), 4);
        assert_eq!(<u8 as TmaElement>::DTYPE.bytes(), 1);
        assert_eq!(<f64 as TmaElement>::DTYPE.bytes(), 8);
    }
}
