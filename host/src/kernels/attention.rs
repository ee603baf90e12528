//! Host side of the attention forward (issue 23; kernels `attention_fwd_{bf16,f16}_d{64,128}`
//! of the sm_90a module [`crate::SM90A_PTX`], built from `gpu/src/kernels/attention.rs`; launch
//! contract `warpline_gpu::contract::attention`):
//!
//! `O = softmax(Q K^T * softmax_scale [+ causal mask]) V` and `LSE` (the row log-sum-exp of the
//! scaled, masked scores, natural log, f32), FlashAttention's forward:
//!
//! - layouts as FlashAttention's: fixed length Q, O `[B, S_q, H, D]`, K, V `[B, S_k, HK, D]`,
//!   LSE `[B, H, S_q]`; variable length ([`SeqLens::Varlen`]) Q, O `[total_q, H, D]`, K, V
//!   `[total_k, HK, D]`, LSE `[H, total_q]`, sequence `b` at rows `cu_seqlens[b] ..
//!   cu_seqlens[b + 1]`; all contiguous, row-major;
//! - BF16 or FP16 (Q, K, V, O of one type), head dim 64 or 128;
//! - GQA/MQA: `H % HK == 0`, query head `h` reads KV head `h / (H / HK)`;
//! - causal mask aligned to the bottom right (query `i` sees key `j` iff `j <= i + S_k - S_q`);
//!   a row that sees no key gets `O = 0` and `LSE = +inf` (FlashAttention's convention).
//!
//! [`Attention::plan`] validates everything on the host before anything is queued
//! ([`check_problem`], no device needed), including the varlen offsets, which it then copies to
//! the device itself (so the kernel reads exactly the values that were checked); encodes three
//! rank-4 tensor maps `{D, heads, rows, batch}` (128-byte swizzle; varlen: `batch` = 1) and
//! uploads them stream-ordered. [`AttentionPlan::launch`] launches with no further copies, with
//! PDL when asked ([`AttentionOptions::pdl`]). Grid `(ceil(S_q / 128), H, B)` (varlen: the
//! longest `S_q`), 384 threads (a TMA producer warpgroup and two ping-pong consumer
//! warpgroups), `smem_bytes(D)` of dynamic shared memory.

use half::{bf16, f16};
use warpline_gpu::contract::attention as contract;

use super::check_stream;
use crate::device::{Device, Kernel};
use crate::error::{Error, Result};
use crate::launch::{launch_raw, LaunchConfig, LaunchLimits, ParamValue};
use crate::memory::{DeviceBuffer, DeviceView, DeviceViewMut, MemPool};
use crate::module::{check_entry, Module, RustParam, RustParamKind};
use crate::stream::Stream;
use crate::tensor_map::{
    L2Promotion, TensorMap, TensorMapDesc, TensorMapTable, TmaElement, TmaSwizzle,
};

pub mod reference;

mod sealed {
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// Element types of the attention kernels: `half::bf16` and `half::f16`.
pub trait AttnElement: TmaElement + sealed::Sealed {
    /// `"bf16"` or `"fp16"`.
    const NAME: &'static str;
    /// How the kernel rounds `P` (for the same-precision reference).
    const P_ROUNDING: reference::PRounding;
    /// The entry for head dim `d` (64 or 128; `None` otherwise).
    fn entry(d: usize) -> Option<&'static str>;
    /// The value widened to f64 (exact).
    fn to_f64(self) -> f64;
    /// `x` rounded to this type (nearest even).
    fn from_f64(x: f64) -> Self;
}

impl AttnElement for bf16 {
    const NAME: &'static str = "bf16";
    const P_ROUNDING: reference::PRounding = reference::PRounding::Bf16;
    fn entry(d: usize) -> Option<&'static str> {
        match d {
            64 => Some(contract::KERNEL_BF16_D64),
            128 => Some(contract::KERNEL_BF16_D128),
            _ => None,
        }
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    fn from_f64(x: f64) -> Self {
        bf16::from_f64(x)
    }
}

impl AttnElement for f16 {
    const NAME: &'static str = "fp16";
    const P_ROUNDING: reference::PRounding = reference::PRounding::F16;
    fn entry(d: usize) -> Option<&'static str> {
        match d {
            64 => Some(contract::KERNEL_F16_D64),
            128 => Some(contract::KERNEL_F16_D128),
            _ => None,
        }
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    fn from_f64(x: f64) -> Self {
        f16::from_f64(x)
    }
}

/// Every entry of the attention kernels.
pub const ENTRIES: [&str; 4] = [
    contract::KERNEL_BF16_D64,
    contract::KERNEL_BF16_D128,
    contract::KERNEL_F16_D64,
    contract::KERNEL_F16_D128,
];

/// Sequence lengths of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqLens<'s> {
    /// Every sequence has `q` query rows and `k` keys (both at least 1).
    Fixed {
        /// Query rows per sequence.
        q: usize,
        /// Keys per sequence.
        k: usize,
    },
    /// Variable lengths as FlashAttention's varlen API: `cu_q`, `cu_k` hold `B + 1`
    /// non-decreasing offsets from 0 (host values: the plan checks them and copies them to the
    /// device); sequence `b` is rows `cu_q[b] .. cu_q[b + 1]` of Q and O and `cu_k[b] ..
    /// cu_k[b + 1]` of K and V. A sequence may be empty; at least one must have a query row.
    Varlen {
        /// Query offsets.
        cu_q: &'s [i32],
        /// Key offsets.
        cu_k: &'s [i32],
    },
}

/// The problem without its memory: what [`check_problem`] validates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionProblem<'s> {
    /// Sequences in the batch (`B`).
    pub batch: usize,
    /// Query heads (`H`).
    pub heads: usize,
    /// Key/value heads (`HK`, dividing `H`; `H` for MHA, 1 for MQA).
    pub kv_heads: usize,
    /// Head dimension (`D`): 64 or 128.
    pub head_dim: usize,
    /// Sequence lengths.
    pub seqlens: SeqLens<'s>,
    /// Causal mask (bottom-right aligned).
    pub causal: bool,
    /// Scale of `Q K^T`; `None`: `1 / sqrt(D)`. Finite and positive.
    pub softmax_scale: Option<f32>,
}

impl AttentionProblem<'_> {
    /// Fixed-length problem `B x H x S x D` (self-attention shapes, `HK = H`, default scale).
    pub fn fixed(batch: usize, heads: usize, seqlen: usize, head_dim: usize, causal: bool) -> Self {
        AttentionProblem {
            batch,
            heads,
            kv_heads: heads,
            head_dim,
            seqlens: SeqLens::Fixed {
                q: seqlen,
                k: seqlen,
            },
            causal,
            softmax_scale: None,
        }
    }
}

/// The memory of one attention call: element counts (and addresses) of the five tensors, for
/// [`check_problem`] without a device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionMemory {
    /// Elements and device address of Q, K, V, O (16-bit) and LSE (f32).
    pub q: (usize, u64),
    /// K.
    pub k: (usize, u64),
    /// V.
    pub v: (usize, u64),
    /// O.
    pub o: (usize, u64),
    /// LSE.
    pub lse: (usize, u64),
}

/// What [`check_problem`] derives: the sizes the launch needs.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionShape {
    /// `B`, `H`, `HK`, `D`.
    pub batch: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads.
    pub kv_heads: usize,
    /// Head dim.
    pub head_dim: usize,
    /// Fixed: the sequence length; varlen: the longest query sequence (the grid's x).
    pub max_seqlen_q: usize,
    /// Fixed: the sequence length; varlen: the longest key sequence.
    pub max_seqlen_k: usize,
    /// Rows of Q / O (`B * S_q` or `total_q`) and of K / V.
    pub rows_q: usize,
    /// Rows of K and V.
    pub rows_k: usize,
    /// Varlen.
    pub varlen: bool,
    /// Causal.
    pub causal: bool,
    /// The softmax scale used.
    pub softmax_scale: f32,
    /// Per-sequence (query rows, keys), for FLOP counts.
    pub lengths: Vec<(usize, usize)>,
}

impl AttentionShape {
    /// Forward FLOPs as FlashAttention counts them: `4 * S_q * S_k * D * H` per sequence (two
    /// GEMMs), halved for causal (its benchmark's convention, also for `S_q != S_k`).
    pub fn flops(&self) -> f64 {
        let per: f64 = self
            .lengths
            .iter()
            .map(|&(q, k)| 4.0 * q as f64 * k as f64 * self.head_dim as f64)
            .sum();
        per * self.heads as f64 / if self.causal { 2.0 } else { 1.0 }
    }

    /// Q tiles per (head, sequence): `ceil(max S_q / 128)`.
    pub fn q_tiles(&self) -> u32 {
        self.max_seqlen_q.div_ceil(contract::BLOCK_M) as u32
    }

    /// Tiles of the launch (`contract::tile_count`): Q tiles x heads x sequences. At most
    /// `2^31 - 1` ([`check_problem`] bounds `B * H * S_q`).
    pub fn tiles(&self) -> u32 {
        contract::tile_count(
            self.max_seqlen_q as u32,
            self.heads as u32,
            self.batch as u32,
        ) as u32
    }

    /// (head, sequence) pairs per L2 section of the tile order (`contract::tile_coords`): as
    /// many as keep their K and V within [`L2_SECTION_BYTES`], at least 1.
    pub fn hb_group(&self) -> u32 {
        // K and V bytes one query head reads (GQA: shared by the heads of its KV head).
        let group = (self.heads / self.kv_heads.max(1)).max(1);
        let per_head = (2 * self.max_seqlen_k * self.head_dim * 2)
            .div_ceil(group)
            .max(1);
        let pairs = self.heads * self.batch;
        (L2_SECTION_BYTES / per_head).clamp(1, pairs.max(1)) as u32
    }

    /// The kernel's `hb_group`: `requested` ([`AttentionOptions::hb_group`]) or
    /// [`Self::hb_group`], at most the (head, sequence) pairs. A larger section orders the tiles
    /// exactly as one of all the pairs does, and the bound keeps the kernel's `hb_group * n_m`
    /// within the tile count (below 2^31), so any requested value is safe.
    pub fn section_pairs(&self, requested: Option<std::num::NonZeroU32>) -> u32 {
        let pairs = (self.heads * self.batch).max(1) as u32;
        requested.map_or(self.hb_group(), |g| g.get()).min(pairs)
    }

    /// The launch grid `(G, 1, 1)`: with `persistent`, `min(tiles, sms)` CTAs (one per SM, each
    /// working through its share of the tiles), else one CTA per tile.
    pub fn grid(&self, persistent: bool, sms: u32) -> [u32; 3] {
        let tiles = self.tiles().max(1);
        [
            if persistent {
                tiles.min(sms.max(1))
            } else {
                tiles
            },
            1,
            1,
        ]
    }
}

/// The K and V bytes one L2 section of the tile order may read (`AttentionShape::hb_group`).
/// Measured on the H200 (session 12, sections of 1, 4, 8, 16 and 24 pairs at the bench's
/// shapes): a few MiB, far below the 50 MiB L2, keeps the K and V blocks that the CTAs in
/// flight read shared by more of them; 24 MiB was 3-5% slower.
pub const L2_SECTION_BYTES: usize = 4 << 20;

/// Largest row count of any tensor (TMA coordinates and the kernel's row arithmetic are 32-bit
/// signed).
pub const MAX_ROWS: usize = i32::MAX as usize;

fn bad(what: &'static str, detail: String) -> Error {
    Error::BadShape { what, detail }
}

/// Checks the varlen offsets: `B + 1` entries, `cu[0] == 0`, non-decreasing, last `<=
/// MAX_ROWS`. Returns the lengths.
fn check_offsets(what: &'static str, cu: &[i32], batch: usize) -> Result<Vec<usize>> {
    if cu.len() != batch + 1 {
        return Err(Error::BadSeqlens {
            what,
            detail: format!(
                "{} offsets for a batch of {batch}; allowed: exactly batch + 1 = {}",
                cu.len(),
                batch + 1
            ),
        });
    }
    if cu[0] != 0 {
        return Err(Error::BadSeqlens {
            what,
            detail: format!("the first offset is {}; allowed: 0", cu[0]),
        });
    }
    let mut lens = Vec::with_capacity(batch);
    for (b, w) in cu.windows(2).enumerate() {
        if w[1] < w[0] {
            return Err(Error::BadSeqlens {
                what,
                detail: format!(
                    "offset {} = {} is below offset {b} = {}; allowed: non-decreasing offsets",
                    b + 1,
                    w[1],
                    w[0]
                ),
            });
        }
        lens.push((w[1] - w[0]) as usize);
    }
    Ok(lens)
}

/// Checks one tensor: at least `need` elements, 16-byte aligned base (`align`).
fn check_tensor(what: &'static str, have: (usize, u64), need: u64, align: u64) -> Result<()> {
    if (have.0 as u64) < need {
        return Err(Error::LengthMismatch {
            what,
            detail: format!("the view has {} elements; the problem needs {need}", have.0),
        });
    }
    super::check_aligned(what, have.1, align)
}

/// Validates an attention problem and its memory without a device; returns the launch's sizes.
///
/// Rules: `1 <= B, H <= 65535` (the grid's z and y); `1 <= HK`, `H % HK == 0`; `D` 64 or 128;
/// fixed lengths `S_q, S_k >= 1`; varlen offsets as [`SeqLens::Varlen`] says, at least one
/// query row and one key in total; every row count (`B * S_q`, `B * S_k`, totals) and `B * H *
/// S_q` (the LSE) at most [`MAX_ROWS`]; `softmax_scale` finite and positive; Q at least
/// `rows_q * H * D` elements, K and V `rows_k * HK * D`, O `rows_q * H * D`, LSE `rows_q * H`;
/// Q, K, V, O 16-byte aligned, LSE 4-byte aligned.
///
/// Errors: [`Error::BadShape`] (sizes, head dim, heads, scale), [`Error::BadSeqlens`] (varlen
/// offsets), [`Error::TooLarge`] (row counts), [`Error::LengthMismatch`] (a view too small),
/// [`Error::Misaligned`].
pub fn check_problem(p: &AttentionProblem<'_>, mem: &AttentionMemory) -> Result<AttentionShape> {
    let max_yz = contract::MAX_GRID_YZ as usize;
    if p.batch == 0 || p.batch > max_yz {
        return Err(bad(
            "attention batch",
            format!("{}; allowed: 1 to {max_yz} (the grid's z)", p.batch),
        ));
    }
    if p.heads == 0 || p.heads > max_yz {
        return Err(bad(
            "attention heads",
            format!("{}; allowed: 1 to {max_yz} (the grid's y)", p.heads),
        ));
    }
    if p.kv_heads == 0 || !p.heads.is_multiple_of(p.kv_heads) {
        return Err(bad(
            "attention kv_heads",
            format!(
                "{} KV heads for {} query heads; allowed: a divisor of the query heads (GQA/MQA)",
                p.kv_heads, p.heads
            ),
        ));
    }
    if !contract::HEAD_DIMS.contains(&p.head_dim) {
        return Err(bad(
            "attention head_dim",
            format!("{}; allowed: {:?}", p.head_dim, contract::HEAD_DIMS),
        ));
    }
    let scale = p.softmax_scale.unwrap_or(1.0 / (p.head_dim as f32).sqrt());
    if !(scale.is_finite() && scale > 0.0) {
        return Err(bad(
            "attention softmax_scale",
            format!("{scale}; allowed: finite and positive"),
        ));
    }
    let (lengths, rows_q, rows_k, varlen) = match p.seqlens {
        SeqLens::Fixed { q, k } => {
            if q == 0 || k == 0 {
                return Err(bad(
                    "attention sequence lengths",
                    format!("seqlen_q {q}, seqlen_k {k}; allowed: 1 or more each"),
                ));
            }
            let rq = (p.batch as u64).saturating_mul(q as u64);
            let rk = (p.batch as u64).saturating_mul(k as u64);
            for (what, v) in [
                ("attention Q rows (batch * seqlen_q)", rq),
                ("attention K rows (batch * seqlen_k)", rk),
            ] {
                if v > MAX_ROWS as u64 {
                    return Err(Error::TooLarge {
                        what,
                        value: v,
                        max: MAX_ROWS as u64,
                    });
                }
            }
            (vec![(q, k); p.batch], rq as usize, rk as usize, false)
        }
        SeqLens::Varlen { cu_q, cu_k } => {
            let lq = check_offsets("attention cu_seqlens_q", cu_q, p.batch)?;
            let lk = check_offsets("attention cu_seqlens_k", cu_k, p.batch)?;
            let (tq, tk) = (cu_q[p.batch] as usize, cu_k[p.batch] as usize);
            if tq == 0 || tk == 0 {
                return Err(Error::BadSeqlens {
                    what: "attention varlen totals",
                    detail: format!(
                        "{tq} query rows and {tk} keys in total; allowed: at least 1 of each"
                    ),
                });
            }
            (lq.into_iter().zip(lk).collect(), tq, tk, true)
        }
    };
    let lse_len = (rows_q as u64) * p.heads as u64;
    if lse_len > MAX_ROWS as u64 {
        return Err(Error::TooLarge {
            what: "attention LSE elements (rows_q * heads)",
            value: lse_len,
            max: MAX_ROWS as u64,
        });
    }
    let (h, hk, d) = (p.heads as u64, p.kv_heads as u64, p.head_dim as u64);
    check_tensor("attention Q", mem.q, rows_q as u64 * h * d, 16)?;
    check_tensor("attention K", mem.k, rows_k as u64 * hk * d, 16)?;
    check_tensor("attention V", mem.v, rows_k as u64 * hk * d, 16)?;
    check_tensor("attention O", mem.o, rows_q as u64 * h * d, 16)?;
    check_tensor("attention LSE", mem.lse, lse_len, 4)?;
    Ok(AttentionShape {
        batch: p.batch,
        heads: p.heads,
        kv_heads: p.kv_heads,
        head_dim: p.head_dim,
        max_seqlen_q: lengths.iter().map(|l| l.0).max().unwrap_or(0),
        max_seqlen_k: lengths.iter().map(|l| l.1).max().unwrap_or(0),
        rows_q,
        rows_k,
        varlen,
        causal: p.causal,
        softmax_scale: scale,
        lengths,
    })
}

/// The rank-4 tensor-map description `{D, heads, rows, batch}` of Q, K or V (`rows` per batch
/// entry; varlen: all rows, batch 1), box `box_dims`, 128-byte swizzle.
pub fn attention_desc<T: TmaElement>(
    address: u64,
    batch: usize,
    rows: usize,
    heads: usize,
    d: usize,
    box_dims: [u32; 4],
) -> TensorMapDesc {
    let e = size_of::<T>() as u64;
    let (d, heads, rows) = (d as u64, heads as u64, rows as u64);
    TensorMapDesc {
        dtype: T::DTYPE,
        address,
        dims: vec![d, heads, rows, batch as u64],
        strides: vec![d * e, heads * d * e, rows * heads * d * e],
        box_dims: box_dims.to_vec(),
        swizzle: TmaSwizzle::B128,
        l2_promotion: L2Promotion::B256,
    }
}

/// The entries' parameter list (see `contract::attention`).
fn rust_params() -> Vec<RustParam> {
    let p = |t: &str, size, kind| RustParam {
        rust_type: t.to_string(),
        size,
        kind,
    };
    use RustParamKind::{Address, Float, Int};
    vec![
        p("tmap_q: u64", 8, Address),
        p("tmap_k: u64", 8, Address),
        p("tmap_v: u64", 8, Address),
        p("o: u64", 8, Address),
        p("lse: u64", 8, Address),
        p("cu_seqlens_q: u64", 8, Address),
        p("cu_seqlens_k: u64", 8, Address),
        p("seqlen_q: u32", 4, Int),
        p("seqlen_k: u32", 4, Int),
        p("heads: u32", 4, Int),
        p("kv_heads: u32", 4, Int),
        p("total_q: u32", 4, Int),
        p("scale_log2: f32", 4, Float),
        p("flags: u32", 4, Int),
        p("batch: u32", 4, Int),
        p("hb_group: u32", 4, Int),
        p("n_m: u32", 4, Int),
        p("tiles: u32", 4, Int),
        p("tmap_o: u64", 8, Address),
    ]
}

/// Checks that `ptx` has every entry of [`ENTRIES`] with the contract's parameter list, without
/// a device. Errors: [`Error::MissingKernel`], [`Error::KernelSignatureMismatch`],
/// [`Error::PtxSignature`].
pub fn check_module_entries(ptx: &str) -> Result<()> {
    let entries = crate::module::ptx_signatures(ptx);
    let rust = rust_params();
    for name in ENTRIES {
        check_entry(&entries, name, &rust)?;
    }
    Ok(())
}

/// Launch options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttentionOptions {
    /// Launch with the PDL attribute (the kernel waits with `griddepcontrol.wait` before it
    /// touches Q, K, V, O, LSE or the offsets, and lets its dependents launch after its last
    /// load).
    pub pdl: bool,
    /// Turn the ping-pong between the two consumer warpgroups off (`FLAG_NO_PINGPONG`): each
    /// issues its GEMMs as soon as its data is there. For measuring what the ping-pong brings
    /// (and for diagnosis); the result is the same.
    pub no_pingpong: bool,
    /// Turn the in-warpgroup overlap off (`FLAG_NO_OVERLAP`): per key block `S = Q K^T`, wait,
    /// softmax, `O += P V`, wait, with no ping-pong either. For measuring and diagnosis; the
    /// result is the same.
    pub no_overlap: bool,
    /// One CTA per tile instead of the persistent grid (one CTA per SM working through the
    /// tiles, the next tile's loads under the current one's epilogue). For measuring what the
    /// persistent grid brings; the result is the same.
    pub no_persistent: bool,
    /// At most this many CTAs in the persistent grid (default: one per SM), so that each works
    /// through more tiles; for tests and measurement. Ignored with `no_persistent`.
    pub max_ctas: Option<std::num::NonZeroU32>,
    /// (head, sequence) pairs per L2 section of the tile order (default
    /// [`AttentionShape::hb_group`]); for measuring the order.
    pub hb_group: Option<std::num::NonZeroU32>,
    /// Store O with bounds-checked 4-byte stores instead of the TMA-store epilogue
    /// (`FLAG_NO_TMA_STORE`; varlen batches always do). For measuring; the result is the same.
    pub no_tma_store: bool,
}

/// The tensors of one call. Q, K, V are read; O and LSE written (exclusively borrowed, so they
/// alias nothing).
pub struct AttentionTensors<'a, T> {
    /// Q (`[B, S_q, H, D]` or `[total_q, H, D]`).
    pub q: DeviceView<'a, T>,
    /// K (`[B, S_k, HK, D]` or `[total_k, HK, D]`).
    pub k: DeviceView<'a, T>,
    /// V (as K).
    pub v: DeviceView<'a, T>,
    /// O (as Q).
    pub o: DeviceViewMut<'a, T>,
    /// LSE (`[B, H, S_q]` or `[H, total_q]`, f32).
    pub lse: DeviceViewMut<'a, f32>,
}

/// The attention launcher of one device: the sm_90a module loaded and checked, the entries'
/// shared-memory limit raised, a pool for tensor-map tables and offsets.
pub struct Attention<'d> {
    dev: &'d Device,
    module: Module,
    pool: MemPool,
}

impl std::fmt::Debug for Attention<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attention")
            .field("device", &self.dev.capabilities().name)
            .finish()
    }
}

impl<'d> Attention<'d> {
    /// Loads [`crate::SM90A_PTX`] into `dev`'s context, checks its launch contract and the four
    /// entries' parameter lists, and raises each entry's dynamic shared-memory limit to
    /// `contract::smem_bytes(D)`.
    ///
    /// Errors: [`Error::Sm90aRequired`] unless the device is compute capability 9.0;
    /// [`Error::ContractMismatch`], [`Error::MissingKernel`], [`Error::KernelSignatureMismatch`];
    /// [`Error::SharedMemory`]; those of [`Device::load_module`] and [`MemPool::new`].
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
        check_module_entries(crate::SM90A_PTX)?;
        let module = dev.load_module(crate::SM90A_PTX)?;
        for d in contract::HEAD_DIMS {
            let smem = contract::smem_bytes(d);
            if smem > caps.max_shared_mem_per_block_optin {
                return Err(Error::SharedMemory {
                    kernel: contract::KERNEL_BF16_D128,
                    requested: smem,
                    max: caps.max_shared_mem_per_block_optin,
                });
            }
            for name in [bf16::entry(d), f16::entry(d)].into_iter().flatten() {
                module
                    .untyped_kernel(name)?
                    .raise_max_dynamic_shared_memory(smem)?;
            }
        }
        let pool = MemPool::new(dev, 1 << 20)?;
        Ok(Self { dev, module, pool })
    }

    /// The device.
    pub fn device(&self) -> &'d Device {
        self.dev
    }

    /// Validates one attention forward and prepares its launch on `stream`: the problem and
    /// memory as [`check_problem`] (before anything is queued), the tensors bound to `stream`;
    /// then the varlen offsets are copied into device memory of the plan and the three tensor
    /// maps encoded and uploaded (stream-ordered). Nothing is launched until
    /// [`AttentionPlan::launch`], which may run as often as wanted.
    ///
    /// Errors, before anything is queued: [`Error::WrongContext`], [`Error::WrongStream`], those
    /// of [`check_problem`], the launch-limit errors of [`LaunchConfig::check`],
    /// [`Error::TensorMap`] (`cuTensorMapEncodeTiled`'s rules, e.g. strides of 2^40 bytes or
    /// more); then the allocation and copy errors of [`MemPool::alloc_async`],
    /// [`DeviceBuffer::copy_from_host`] and [`TensorMapTable::upload`].
    pub fn plan<'a, T: AttnElement>(
        &'a self,
        stream: &Stream,
        problem: &AttentionProblem<'_>,
        t: AttentionTensors<'a, T>,
        opts: AttentionOptions,
    ) -> Result<AttentionPlan<'a, T>> {
        if stream.context_raw() != self.dev.raw_context() {
            return Err(Error::WrongContext {
                what: "attention stream",
            });
        }
        let mem = AttentionMemory {
            q: (t.q.len(), t.q.device_ptr()),
            k: (t.k.len(), t.k.device_ptr()),
            v: (t.v.len(), t.v.device_ptr()),
            o: (t.o.len(), t.o.device_ptr()),
            lse: (t.lse.len(), t.lse.device_ptr()),
        };
        let shape = check_problem(problem, &mem)?;
        check_stream("attention Q", t.q.stream(), stream)?;
        check_stream("attention K", t.k.stream(), stream)?;
        check_stream("attention V", t.v.stream(), stream)?;
        check_stream("attention O", t.o.stream(), stream)?;
        check_stream("attention LSE", t.lse.stream(), stream)?;
        let name = T::entry(shape.head_dim).ok_or_else(|| {
            bad(
                "attention head_dim",
                format!("{}; allowed: {:?}", shape.head_dim, contract::HEAD_DIMS),
            )
        })?;
        let kernel = self.module.untyped_kernel(name)?.clone();
        let smem = contract::smem_bytes(shape.head_dim) as u32;
        let mut cfg = LaunchConfig::linear(1, contract::THREADS_PER_CTA, smem).with_pdl(opts.pdl);
        let sms = self.dev.capabilities().sm_count;
        cfg.grid = shape.grid(
            !opts.no_persistent,
            opts.max_ctas.map_or(sms, |m| m.get().min(sms)),
        );
        cfg.check(name, &LaunchLimits::of(self.dev, &kernel))?;
        let (batch_maps, rows_q, rows_k) = if shape.varlen {
            (1, shape.rows_q, shape.rows_k)
        } else {
            (shape.batch, shape.max_seqlen_q, shape.max_seqlen_k)
        };
        let (h, hk, d) = (shape.heads, shape.kv_heads, shape.head_dim);
        let map_q = TensorMap::new(
            &t.q,
            attention_desc::<T>(t.q.device_ptr(), batch_maps, rows_q, h, d, contract::Q_BOX),
        )?;
        let map_k = TensorMap::new(
            &t.k,
            attention_desc::<T>(
                t.k.device_ptr(),
                batch_maps,
                rows_k,
                hk,
                d,
                contract::KV_BOX,
            ),
        )?;
        let map_v = TensorMap::new(
            &t.v,
            attention_desc::<T>(
                t.v.device_ptr(),
                batch_maps,
                rows_k,
                hk,
                d,
                contract::KV_BOX,
            ),
        )?;
        // O for the TMA-store epilogue: the same shape as Q's map, boxes of one warpgroup's
        // rows. Rows of D * 2 bytes (128 or 256) end on 16-byte boundaries: no store overhang.
        let map_o = TensorMap::new_mut(
            &t.o,
            attention_desc::<T>(t.o.device_ptr(), batch_maps, rows_q, h, d, contract::O_BOX),
        )?;
        let offsets = match problem.seqlens {
            SeqLens::Varlen { cu_q, cu_k } => {
                let mut buf = self
                    .pool
                    .alloc_async::<i32>(stream, 2 * (shape.batch + 1))?;
                let all: Vec<i32> = cu_q.iter().chain(cu_k).copied().collect();
                buf.copy_from_host(&all)?;
                Some(buf)
            }
            SeqLens::Fixed { .. } => None,
        };
        let table = TensorMapTable::upload(&self.pool, stream, &[map_q, map_k, map_v, map_o])?;
        let addr = |i| {
            table.address(i).ok_or(Error::Empty {
                what: "attention tensor-map table",
            })
        };
        let maps = [addr(0)?, addr(1)?, addr(2)?, addr(3)?];
        let (cu_q, cu_k) = match &offsets {
            Some(b) => (
                b.device_ptr(),
                b.device_ptr() + (4 * (shape.batch + 1)) as u64,
            ),
            None => (0, 0),
        };
        let flags = if shape.causal {
            contract::FLAG_CAUSAL
        } else {
            0
        } | if shape.varlen {
            contract::FLAG_VARLEN
        } else {
            0
        } | if opts.no_pingpong {
            contract::FLAG_NO_PINGPONG
        } else {
            0
        } | if opts.no_overlap {
            contract::FLAG_NO_OVERLAP
        } else {
            0
        } | if opts.no_tma_store {
            contract::FLAG_NO_TMA_STORE
        } else {
            0
        };
        // check_problem bounds every row count, and B * H * S_q, by 2^31 - 1.
        let params = [
            ParamValue::new(maps[0]),
            ParamValue::new(maps[1]),
            ParamValue::new(maps[2]),
            ParamValue::new(t.o.device_ptr()),
            ParamValue::new(t.lse.device_ptr()),
            ParamValue::new(cu_q),
            ParamValue::new(cu_k),
            ParamValue::new(shape.max_seqlen_q as u32),
            ParamValue::new(shape.max_seqlen_k as u32),
            ParamValue::new(h as u32),
            ParamValue::new(hk as u32),
            ParamValue::new(shape.rows_q as u32),
            ParamValue::new(shape.softmax_scale * std::f32::consts::LOG2_E),
            ParamValue::new(flags),
            ParamValue::new(shape.batch as u32),
            ParamValue::new(shape.section_pairs(opts.hb_group)),
            ParamValue::new(shape.q_tiles()),
            ParamValue::new(shape.tiles()),
            ParamValue::new(maps[3]),
        ];
        Ok(AttentionPlan {
            dev: self.dev,
            kernel,
            stream: stream.clone(),
            _table: table,
            _offsets: offsets,
            _o: t.o,
            _lse: t.lse,
            cfg,
            params,
            shape,
        })
    }

    /// [`Self::plan`] then one [`AttentionPlan::launch`]; returns the shape. Errors: those of
    /// both.
    pub fn forward<'a, T: AttnElement>(
        &'a self,
        stream: &Stream,
        problem: &AttentionProblem<'_>,
        t: AttentionTensors<'a, T>,
        opts: AttentionOptions,
    ) -> Result<AttentionShape> {
        let plan = self.plan(stream, problem, t, opts)?;
        plan.launch()?;
        Ok(plan.shape)
    }
}

/// A validated attention forward, ready to launch (see [`Attention::plan`]). Borrows Q, K, V
/// (shared) and O, LSE (exclusively) for its lifetime.
pub struct AttentionPlan<'a, T: AttnElement> {
    dev: &'a Device,
    kernel: Kernel,
    stream: Stream,
    /// Holds the maps (and so the borrows of Q, K and V) until the plan is dropped.
    _table: TensorMapTable<'a>,
    /// The checked varlen offsets (`cu_q` then `cu_k`), in device memory of the plan.
    _offsets: Option<DeviceBuffer<i32>>,
    _o: DeviceViewMut<'a, T>,
    _lse: DeviceViewMut<'a, f32>,
    cfg: LaunchConfig,
    params: [ParamValue; 19],
    shape: AttentionShape,
}

impl<T: AttnElement> std::fmt::Debug for AttentionPlan<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AttentionPlan")
            .field("kernel", &self.kernel.name())
            .field("config", &self.cfg.describe())
            .field("shape", &self.shape)
            .finish()
    }
}

impl<T: AttnElement> AttentionPlan<'_, T> {
    /// Queues the kernel on the plan's stream (`cuLaunchKernelEx`, with PDL when the options
    /// asked). Errors: [`Error::Launch`], [`Error::ContextPoisoned`].
    pub fn launch(&self) -> Result<()> {
        // SAFETY: the parameter list matches the entry (checked against the PTX at
        // Attention::new: 7 x u64, 5 x u32, f32, 5 x u32, u64 in the contract's order). The map addresses
        // point into the table, uploaded on this stream before any launch and freed on it after
        // the last; each map was encoded over a view the plan borrows (Q, K, V; O exclusively),
        // with the logical dims, so TMA loads stay inside them (boxes past an edge read zeros)
        // and TMA stores into O too (boxes past an edge are clipped; rows end on 16 bytes). O and LSE
        // are views the plan borrows exclusively (they alias nothing), of at least rows_q * H *
        // D and rows_q * H elements, 16- and 4-byte aligned (check_problem); the kernel writes O
        // at rows below each sequence's end (row < seqlen_q of sequence b, whose rows lie below
        // rows_q), heads < H, columns < D, and LSE at the matching (head, row): inside both. The
        // varlen offsets are the plan's own copy of the checked host values (B + 1 each,
        // non-decreasing from 0, last = rows), written before the first launch on this stream
        // and never again, so sequence b's rows are inside Q, O, K, V; n_m covers the longest
        // sequence and tiles = n_m * heads * B < 2^31 (check_problem), hb_group >= 1. heads %
        // kv_heads == 0, kv_heads >= 1, scale_log2 > 0. Any grid x >= 1 is valid. Grid, block and
        // shared memory are the contract's, checked against the launch limits. With PDL the
        // kernel runs griddepcontrol.wait before touching any of this memory (the table, read
        // before it by the prefetch, was written before every launch and is never rewritten).
        unsafe {
            launch_raw(
                self.dev,
                &self.kernel,
                &self.stream,
                &self.cfg,
                &self.params,
            )
        }
    }

    /// The problem's sizes.
    pub fn shape(&self) -> &AttentionShape {
        &self.shape
    }

    /// The plan's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: usize = 128;

    fn mem_for(p: &AttentionProblem<'_>) -> AttentionMemory {
        let (rq, rk) = match p.seqlens {
            SeqLens::Fixed { q, k } => (p.batch * q, p.batch * k),
            SeqLens::Varlen { cu_q, cu_k } => (
                *cu_q.last().unwrap() as usize,
                *cu_k.last().unwrap() as usize,
            ),
        };
        let at = 1 << 20;
        AttentionMemory {
            q: (rq * p.heads * p.head_dim, at),
            k: (rk * p.kv_heads * p.head_dim, at),
            v: (rk * p.kv_heads * p.head_dim, at),
            o: (rq * p.heads * p.head_dim, at),
            lse: (rq * p.heads, at),
        }
    }

    fn base() -> AttentionProblem<'static> {
        AttentionProblem {
            batch: 2,
            heads: 6,
            kv_heads: 3,
            head_dim: D,
            seqlens: SeqLens::Fixed { q: 113, k: 203 },
            causal: true,
            softmax_scale: None,
        }
    }

    /// `contract::tile_coords` visits every (Q tile, head, sequence) once; inside each L2
    /// section the Q tiles come heaviest first (non-increasing m_block), and a section's pairs
    /// are `hb_group` consecutive ones.
    #[test]
    fn tile_order_covers_every_tile_once_heaviest_first_per_section() {
        for (n_m, heads, batch, group) in [
            (1, 1, 1, 1),
            (3, 6, 3, 4),
            (16, 16, 2, 5),
            (7, 5, 3, 1),
            (4, 2, 2, 100),
        ] {
            let tiles = contract::tile_count(n_m * 128, heads, batch) as u32;
            assert_eq!(tiles, n_m * heads * batch);
            let mut seen = std::collections::HashSet::new();
            let mut last: Option<(u32, u32)> = None; // (section, m_block)
            for t in 0..tiles {
                let (m, h, b) = contract::tile_coords(t, n_m, heads, batch, group);
                assert!(m < n_m && h < heads && b < batch, "{t}: {m} {h} {b}");
                assert!(seen.insert((m, h, b)), "tile {t} repeats ({m}, {h}, {b})");
                let section = (h + heads * b) / group;
                if let Some((s0, m0)) = last {
                    assert!(section >= s0, "sections out of order at {t}");
                    if section == s0 {
                        assert!(m <= m0, "m_block rises inside a section at {t}");
                    }
                }
                last = Some((section, m));
            }
            assert_eq!(seen.len() as u32, tiles);
        }
    }

    #[test]
    fn valid_fixed_problem_gives_grid_flops_and_default_scale() {
        let p = base();
        let s = check_problem(&p, &mem_for(&p)).unwrap();
        assert_eq!(s.grid(false, 132), [12, 1, 1]);
        assert_eq!(s.grid(true, 132), [12, 1, 1]);
        assert_eq!(s.grid(true, 5), [5, 1, 1]);
        assert_eq!((s.q_tiles(), s.tiles()), (1, 12));
        // A requested L2 section is bounded by the 12 (head, sequence) pairs, so the kernel's
        // hb_group * n_m cannot wrap.
        let g = std::num::NonZeroU32::new;
        assert_eq!(s.section_pairs(g(u32::MAX)), 12);
        assert_eq!(s.section_pairs(g(5)), 5);
        assert!((1..=12).contains(&s.section_pairs(None)));
        assert_eq!((s.rows_q, s.rows_k, s.varlen), (226, 406, false));
        assert!((s.softmax_scale - 1.0 / (128f32).sqrt()).abs() < 1e-7);
        let want = 2.0 * 4.0 * 113.0 * 203.0 * 128.0 * 6.0 / 2.0;
        assert_eq!(s.flops(), want);
    }

    #[test]
    fn varlen_offsets_are_checked_on_the_host() {
        let cu_q = [0, 5, 5, 300];
        let cu_k = [0, 7, 9, 9];
        let p = AttentionProblem {
            batch: 3,
            seqlens: SeqLens::Varlen {
                cu_q: &cu_q,
                cu_k: &cu_k,
            },
            ..base()
        };
        let s = check_problem(&p, &mem_for(&p)).unwrap();
        assert_eq!(
            (s.max_seqlen_q, s.max_seqlen_k, s.rows_q, s.rows_k),
            (295, 7, 300, 9)
        );
        assert_eq!(s.grid(false, 132), [54, 1, 1]);
        assert_eq!((s.q_tiles(), s.tiles()), (3, 54));
        let m = mem_for(&p);
        for (cq, ck, why) in [
            (&[0, 5, 300][..], &cu_k[..], "length"),
            (&[1, 5, 5, 300][..], &cu_k[..], "first"),
            (&[0, 5, 4, 300][..], &cu_k[..], "monotone"),
            (&cu_q[..], &[0, 7, 6, 9][..], "monotone k"),
            (&[0, 0, 0, 0][..], &cu_k[..], "empty"),
        ] {
            let bad = AttentionProblem {
                seqlens: SeqLens::Varlen { cu_q: cq, cu_k: ck },
                ..p
            };
            let e = check_problem(&bad, &m).unwrap_err();
            assert!(matches!(e, Error::BadSeqlens { .. }), "{why}: {e}");
        }
        // Offsets past the memory: the views are too small.
        let big = [0, 5, 5, 301];
        let e = check_problem(
            &AttentionProblem {
                seqlens: SeqLens::Varlen {
                    cu_q: &big,
                    cu_k: &cu_k,
                },
                ..p
            },
            &m,
        )
        .unwrap_err();
        assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    }

    #[test]
    fn shapes_heads_dims_scale_memory_and_alignment_are_refused() {
        let p = base();
        let m = mem_for(&p);
        let cases: Vec<(AttentionProblem<'_>, &str)> = vec![
            (AttentionProblem { batch: 0, ..p }, "batch"),
            (AttentionProblem { heads: 0, ..p }, "heads"),
            (AttentionProblem { kv_heads: 4, ..p }, "kv_heads"),
            (AttentionProblem { kv_heads: 0, ..p }, "kv_heads"),
            (AttentionProblem { head_dim: 96, ..p }, "head_dim"),
            (
                AttentionProblem {
                    softmax_scale: Some(0.0),
                    ..p
                },
                "scale",
            ),
            (
                AttentionProblem {
                    softmax_scale: Some(f32::NAN),
                    ..p
                },
                "scale",
            ),
            (
                AttentionProblem {
                    seqlens: SeqLens::Fixed { q: 0, k: 5 },
                    ..p
                },
                "lengths",
            ),
        ];
        for (bad, what) in cases {
            let e = check_problem(&bad, &m).unwrap_err();
            assert!(matches!(e, Error::BadShape { .. }), "{what}: {e}");
        }
        let mut small = m;
        small.v.0 -= 1;
        assert!(matches!(
            check_problem(&p, &small).unwrap_err(),
            Error::LengthMismatch { .. }
        ));
        let mut misaligned = m;
        misaligned.o.1 += 8;
        assert!(matches!(
            check_problem(&p, &misaligned).unwrap_err(),
            Error::Misaligned { .. }
        ));
        let huge = AttentionProblem {
            batch: 65535,
            seqlens: SeqLens::Fixed { q: 1 << 16, k: 1 },
            ..p
        };
        assert!(matches!(
            check_problem(&huge, &m).unwrap_err(),
            Error::TooLarge { .. }
        ));
    }

    #[test]
    fn tensor_maps_are_rank_4_with_the_contract_boxes() {
        let d = attention_desc::<bf16>(1 << 20, 2, 113, 6, 128, contract::Q_BOX);
        assert_eq!(d.dims, vec![128, 6, 113, 2]);
        assert_eq!(d.strides, vec![256, 6 * 256, 113 * 6 * 256]);
        assert_eq!(d.box_dims, vec![64, 1, 128, 1]);
    }

    /// The embedded sm_90a module has the four entries with the contract's parameters.
    #[test]
    fn embedded_module_has_the_entries() {
        check_module_entries(crate::SM90A_PTX).unwrap();
    }
}
