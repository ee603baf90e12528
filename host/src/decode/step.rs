//! The GPU decode step (issue 21): [`DecodeStep`] runs `NL` Llama-shaped layers (see
//! [`super`]) for a batch of `B` sequences from warpline's kernels, as one chain of launches on
//! one stream, in the five variants of [`Variant`].
//!
//! Per layer (`gpu/src/kernels/decode_step.rs` of the sm_90 module; each GEMM either the swap-AB
//! GEMM of the sm_90a module, `gpu/src/kernels/swap_ab_gemm.rs`, the default, or an epilogue
//! entry of `gpu/src/kernels/decode_gemm.rs`, per [`StepConfig::swap_ab`]):
//!
//! ```text
//!  rmsnorm(x or h) -> normed            [layer 0 also copies x into h, the residual stream]
//!  GEMM, QKV epilogue  normed x Wqkv^T -> RoPE -> q, K/V rows into the paged caches
//!  decode_attn         q, caches, block table -> attn (with KV splits: partials, which each
//!                      (sequence, KV head)'s last CTA combines into attn)
//!  GEMM, residual      attn x Wo^T + h -> h           (beta = 1: the residual add, in place)
//!  rmsnorm(h) -> normed
//!  GEMM, SwiGLU        normed x Wgu^T -> silu(gate) * up -> act
//!  GEMM, residual      act x Wdown^T + h -> h
//! ```
//!
//! With the fused RMSNorm ([`StepConfig::fuse_norm`], the default up to 32 sequences) only
//! layer 0's first rmsnorm is a kernel (writing `x * gamma` and per-tile sums of squares
//! `ss`); o_proj and down also write `normed = h * gamma` and `ss`, and qkv and gate_up scale
//! their outputs by `1 / rms(h)` from `ss`: five launches per layer.
//!
//! The output of the step is `h` (`[B][hidden]`, bf16) after the last layer.
//!
//! PDL contract of the chain: every kernel reads the previous kernel's outputs, and writes
//! anything, only after `griddepcontrol.wait`; before it, with the prefetch flags, a kernel
//! reads only its weights (never written by the step), the block table and positions (written
//! only by the host between runs, stream-ordered), the fused RMSNorm's `gamma` and argument
//! blocks (written once by [`DecodeStep::new`]), and the attention copies the KV rows of
//! earlier tokens (written by earlier steps, never by a kernel of this one) into its ring.
//!
//! Errors are typed and raised before anything is queued (see [`DecodeStep::new`] and
//! [`DecodeStep::set_inputs`]).

use std::sync::Mutex;

use half::bf16;
use warpline_gpu::contract::decode_gemm as gc;
use warpline_gpu::contract::decode_step as sc;

use super::reference::{normal_bf16, LayerWeights};
use super::{
    check_batch, pack_gate_up_pairs, pack_gate_up_rows, pack_qkv_pairs, pack_qkv_rows,
    tile_weights, DecodeDims, KvLayout,
};
use crate::chain::{Chain, Graph, KernelArg};
use crate::device::Device;
use crate::error::{CudaCall, Error, Result};
use crate::kernels::decode_gemm::{launch_shape, DecodeConfig, DecodeLaunchShape};
use crate::kernels::tc_gemm::{GemmShape, SwapAbConfig, SwapAbShape, TcGemm};
use crate::launch::LaunchConfig;
use crate::loaded::Kernel;
use crate::memory::{DeviceBuffer, MemPool};
use crate::stream::Stream;
use crate::tensor_map::{TensorMap, TmaSwizzle};
use warpline_gpu::contract::swap_ab_gemm as wc;

/// How the step's kernels are launched (the issue's variants a to e).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Variant {
    /// (a) plain stream launches.
    Plain,
    /// (b) PDL launches; each kernel waits before any load of data a kernel writes (with the
    /// fused RMSNorm, o_proj and down read their constant `gamma` and argument block before it).
    Pdl,
    /// (c) PDL launches; weights (registers and an L2 prefetch), KV pages (L2) and norm weights
    /// are loaded before `griddepcontrol.wait`.
    PdlPrefetch,
    /// (d) the plain launches captured into one CUDA graph.
    Graph,
    /// (e) the PDL + prefetch launches captured into one CUDA graph (programmatic edges).
    GraphPdlPrefetch,
}

impl Variant {
    /// All five, in the issue's order.
    pub const ALL: [Variant; 5] = [
        Variant::Plain,
        Variant::Pdl,
        Variant::PdlPrefetch,
        Variant::Graph,
        Variant::GraphPdlPrefetch,
    ];

    /// `a`..`e` and a name, for tables.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Plain => "a plain",
            Variant::Pdl => "b pdl",
            Variant::PdlPrefetch => "c pdl+prefetch",
            Variant::Graph => "d graph",
            Variant::GraphPdlPrefetch => "e graph+pdl+prefetch",
        }
    }

    /// Parses `a`..`e`. Errors: [`Error::BadShape`] naming the allowed letters.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "a" => Variant::Plain,
            "b" => Variant::Pdl,
            "c" => Variant::PdlPrefetch,
            "d" => Variant::Graph,
            "e" => Variant::GraphPdlPrefetch,
            other => {
                return Err(Error::BadShape {
                    what: "decode variant",
                    detail: format!("{other:?}; allowed: a, b, c, d, e"),
                })
            }
        })
    }

    /// Parses a set of variants: `all`, or letters of `abcde` (e.g. `ce`), in the order given,
    /// each once. Errors: [`Error::BadShape`] naming what is allowed (also for an empty set).
    pub fn parse_set(s: &str) -> Result<Vec<Self>> {
        if s == "all" {
            return Ok(Self::ALL.to_vec());
        }
        let bad = || Error::BadShape {
            what: "decode variants",
            detail: format!("{s:?}; allowed: letters of abcde (e.g. ce) or all"),
        };
        let mut out = Vec::new();
        for c in s.chars() {
            let v = Self::parse(c.encode_utf8(&mut [0; 4])).map_err(|_| bad())?;
            if !out.contains(&v) {
                out.push(v);
            }
        }
        if out.is_empty() {
            return Err(bad());
        }
        Ok(out)
    }

    /// Whether the variant replays a captured graph.
    pub fn graph(self) -> bool {
        matches!(self, Variant::Graph | Variant::GraphPdlPrefetch)
    }

    /// The chain the variant launches (or captures): 0 plain, 1 PDL, 2 PDL + prefetch.
    fn chain(self) -> usize {
        match self {
            Variant::Plain | Variant::Graph => 0,
            Variant::Pdl => 1,
            Variant::PdlPrefetch | Variant::GraphPdlPrefetch => 2,
        }
    }
}

/// The step's options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepConfig {
    /// Sequences `B`, 1 to 64 (the decode GEMM's M).
    pub batch: usize,
    /// Layers `NL` (each with its own weights and caches), at least 1.
    pub layers: usize,
    /// The paged caches and block tables.
    pub layout: KvLayout,
    /// Positions the RoPE table covers (every `position + 1` must be at most this).
    pub max_pos: usize,
    /// KV splits of the attention (`None`: the count with the least estimated time, whole
    /// waves of CTA slots times pages per split plus a fixed cost, with at least 4 pages per
    /// split). With several, the last CTA of each (sequence, KV head) combines the splits.
    pub splits: Option<u32>,
    /// The decode GEMMs' configuration (issue 20's tunables). Epilogue entries exist for
    /// unroll 4 (one row tile, no A prefetch), unroll 2 with the A prefetch (one row tile), and
    /// unroll 2 with the A prefetch and two row tiles (up to 32 sequences); `l2_prefetch` is the
    /// `.L2::256B` hint of the weight loads.
    pub gemm: DecodeConfig,
    /// Per-GEMM overrides of [`Self::gemm`], in step order: qkv, o_proj, gate_up, down (`None`:
    /// `gemm`). The GEMMs differ in N (6144, 4096, 28672, 4096 at Llama-8B sizes), so the best
    /// form and k-split differ too; the same epilogue-entry rules apply to each.
    pub gemm_roles: [Option<DecodeConfig>; 4],
    /// The GEMMs, in step order (qkv, o_proj, gate_up, down), that run as issue 20's swap-AB
    /// tensor-core configuration (`TcGemm`'s `GemmConfig::SwapAb`: wgmma with the tokens as N,
    /// split-K over a cluster, the residual add and SwiGLU fused) instead of the decode GEMM of
    /// [`Self::gemm_for`]; launch shape by `swap_ab_shape`'s rule, weights loaded before
    /// `griddepcontrol.wait` in variants (c) and (e). The qkv GEMM's RoPE and paged-cache
    /// epilogue is shared by both forms (`gpu/src/kernels/qkv_store.rs`). Needs an sm_90a device
    /// (compute capability 9.0).
    pub swap_ab: [bool; 4],
    /// Bytes of each GEMM's weights that variant (c)/(e) prefetches into L2 before
    /// `griddepcontrol.wait`, beyond the first k-block every warp loads into registers, in whole
    /// k-blocks per warp (`(N K 2) / iterations` bytes each; rounded down, so a budget below
    /// one block prefetches nothing).
    pub prefetch_bytes: usize,
    /// Stamp `%globaltimer` per kernel ([`DecodeStep::stamps`]); costs a few atomics per CTA.
    pub stamps: bool,
    /// The decode attention's form ([`AttnForm::for_page`]: the tensor-core form wherever its
    /// TMA boxes tile the pages; it streams the KV cache at copy speed on the H200,
    /// docs/perf-notes.md, session 15).
    pub attention: AttnForm,
    /// Fuse each RMSNorm into the GEMM that reads its output (in effect only when all four
    /// GEMMs are swap-AB GEMMs, [`Self::swap_ab`]; [`DecodeStep::norm_fused`] says whether it
    /// is): the residual GEMM before it (o_proj, down) writes `bf16(h * gamma)` and the sums of
    /// squares of `h` per 64-column tile (`contract::swap_ab_gemm::FLAG_NORM_OUT`), and the
    /// GEMM after it (qkv, gate_up) multiplies each output by the row's `1 / rms(h)`
    /// (`FLAG_NORM_IN`). Only the first layer's first RMSNorm stays a kernel (it copies x
    /// into h too), so a layer is five launches instead of seven.
    pub fuse_norm: bool,
    /// Per swap-AB GEMM (qkv, o_proj, gate_up, down) the cluster size splitting K (`None`:
    /// `swap_ab_shape`'s rule; a bad one is the rule's typed error at [`DecodeStep::new`]).
    pub swap_ab_ksplit: [Option<u32>; 4],
    /// Store the swap-AB GEMMs' weights tiled (`decode::tile_weights`,
    /// `contract::swap_ab_gemm::FLAG_W_TILED`): each CTA's 64 x 64 weight tile is 8 KiB of
    /// contiguous memory instead of 64 rows' 128-byte pieces 8 KiB or more apart. The default:
    /// measured on the H200 (session 18, variant e, us per layer, A/B twice in one call):
    /// 8 x 4096 159.5 and 159.0 against 160.4 and 160.2 row-major, 32 x 4096 274.4 and 274.1
    /// against 275.5 and 276.0, 64 x 2048 290.4 and 289.9 against 294.3 and 292.9.
    pub swap_ab_tiled: bool,
    /// Where the swap-AB GEMMs trigger `griddepcontrol.launch_dependents`
    /// (`contract::swap_ab_gemm::FLAG_TRIGGER_AT_WAIT`): `true`, right after their
    /// `griddepcontrol.wait`, so the next kernel's CTAs may take the SM room each CTA of this
    /// one leaves as soon as every CTA of it has passed its wait; `false`, after each CTA's last
    /// mainloop load (the next kernel can then start no earlier than the last-scheduled CTA's
    /// last load). The default: measured on the H200 (session 19, variant e, us per layer,
    /// interleaved twice in one call): 8 x 4096 157.2 and 157.0 against 161.1 and 161.1 at the
    /// last load, 32 x 4096 271.3 and 272.1 against 273.9 and 273.3; the first down CTA then
    /// passes its wait 0.6 us after gate_up's last CTA ends instead of 4.1 us.
    pub swap_ab_trigger_at_wait: bool,
}

/// The two forms of the paged GQA decode attention (`gpu/src/kernels/decode_step.rs`; the same
/// parameters, grid and outputs, so every test and variant runs either).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnForm {
    /// 8 consumer warps score each row on CUDA cores (8 lanes per row, FMAs), the KV ring
    /// filled by `cp.async.bulk` (`AttnVariant::kernel`, `ATTN_THREADS`, 1 CTA per SM). Any
    /// page size.
    CudaCores,
    /// 4 consumer warps score 8 rows each by `mma.m16n8k16` and fold them into the output by
    /// `mma.m16n8k8` (P from the scores' registers, as FlashAttention-2), the ring filled by TMA
    /// through tensor maps over the caches with the 128-byte swizzle `ldmatrix` needs
    /// (`AttnVariant::tc_kernel`, `ATTN_TC_THREADS`, 2 CTAs per SM). Page sizes 8, 16, 32 or a
    /// multiple of 32 (`sc::attn_tc_box_rows`); others are refused.
    TensorCores,
}

impl AttnForm {
    /// The names `warpline decode --attn` and `WARPLINE_DECODE_ATTN` take: `tc`, `cuda`.
    pub const NAMES: [&'static str; 2] = ["tc", "cuda"];

    /// The default form for `page_size`-token pages: [`Self::TensorCores`] where its TMA boxes
    /// tile the pages (`sc::attn_tc_box_rows`: 8, 16, 32 or a multiple of 32), else
    /// [`Self::CudaCores`].
    pub fn for_page(page_size: usize) -> Self {
        if sc::attn_tc_box_rows(page_size) > 0 {
            Self::TensorCores
        } else {
            Self::CudaCores
        }
    }

    /// Parses [`Self::NAMES`]. Errors: [`Error::BadShape`] naming the allowed values.
    pub fn parse(name: &str) -> Result<Self> {
        match name {
            "tc" => Ok(Self::TensorCores),
            "cuda" => Ok(Self::CudaCores),
            other => Err(Error::BadShape {
                what: "decode attention form",
                detail: format!("{other:?}; allowed: {}", Self::NAMES.join(", ")),
            }),
        }
    }

    /// The CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Self::TensorCores => "tc",
            Self::CudaCores => "cuda",
        }
    }

    /// Entry point, threads per CTA and dynamic shared memory bytes of `v` in this form.
    pub fn launch(self, v: &sc::AttnVariant) -> (&'static str, u32, usize) {
        match self {
            Self::CudaCores => (
                v.kernel,
                sc::ATTN_THREADS,
                sc::attn_smem_bytes(v.head_dim, v.group),
            ),
            Self::TensorCores => (
                v.tc_kernel,
                sc::ATTN_TC_THREADS,
                sc::attn_tc_smem_bytes(v.head_dim, v.group),
            ),
        }
    }

    /// CTAs per SM of this form's entry for head dim `head_dim` and `group` query heads per KV
    /// head (its launch bound), for [`attention_splits`]' estimate.
    pub fn ctas_per_sm(self, head_dim: usize, group: usize) -> u32 {
        match self {
            Self::CudaCores => sc::attn_ctas_per_sm(head_dim, group),
            Self::TensorCores => sc::ATTN_TC_CTAS_PER_SM,
        }
    }
}

impl StepConfig {
    /// `batch` sequences of up to `max_len` tokens each, `layers` layers: one block-table row
    /// of `ceil(max_len / page)` pages per sequence and a cache of exactly `batch` such rows.
    pub fn new(dims: &DecodeDims, batch: usize, layers: usize, max_len: usize) -> Self {
        let pages = max_len.div_ceil(dims.page_size).max(1);
        Self {
            batch,
            layers,
            layout: KvLayout {
                num_pages: batch * pages,
                max_pages_per_seq: pages,
            },
            max_pos: pages * dims.page_size,
            splits: None,
            gemm: Self::default_gemm(batch),
            gemm_roles: Self::default_roles(batch),
            swap_ab: Self::default_swap_ab(batch),
            prefetch_bytes: 4 << 20,
            stamps: false,
            attention: AttnForm::for_page(dims.page_size),
            // Measured on the H200 (session 16, variant e): fused 3.5% faster at 8 x 4096 and
            // 8 x 1024, 0.5% at 32 x 4096, 1.3% at 1 x 1024; 1.2% slower at 64 x 2048. (Session
            // 16's failure at 20 sequences was the test's two-layer amplification, not the
            // fused path: session 17, `layerwise_reference` in tests/decode_step.rs.)
            fuse_norm: batch <= 32,
            swap_ab_ksplit: Self::default_swap_ab_ksplit(dims, batch),
            swap_ab_tiled: true,
            swap_ab_trigger_at_wait: true,
        }
    }

    /// Each swap-AB GEMM's ksplit by default:
    /// - gate_up in clusters of 2 up to 32 sequences (the rule alone picks 1 there: 448 CTAs, 1.7 waves of two per
    ///   SM; in the PDL chain 896 CTAs of half the K each balance better, measured on the H200 in
    ///   session 16, variant e: 8 x 4096 161.7 against 163.8-164.7 us per layer, 32 x 4096 276.8
    ///   against 277.4-277.6, also faster at 1 x 1024 and 8 x 1024; clusters of 4 were slower,
    ///   171.8 and 287.6);
    /// - o_proj and down in clusters of 3 (the rule's 2 gives 128 CTAs of 64 weight rows, one
    ///   per SM, each reading at ~28 GB/s; 3 gives 192; session 18, variant e, twice each in one
    ///   call: 8 x 4096 160.2 and 160.5 against 162.2 and 162.7, 32 x 4096 273.4 and 273.4
    ///   against 275.2 and 275.0; clusters of 4 were slower, 172.5 and 283.9; qkv in 3 too
    ///   lost at 8 x 4096, 163.8); above 32 sequences too (token tiles of 64, where gate_up
    ///   and qkv keep the rule's). There the rule's 2 gives 128 CTAs, which with PDL become
    ///   resident wherever the kernel before them has freed room, before it ends: down's CTAs
    ///   were resident 27 us before gate_up (1.7 waves) ended and read 2.7 TB/s after their
    ///   wait, against 3.3 TB/s in the graph without PDL, where all 128 start on an idle GPU
    ///   (H200, session 20, 64 x 2048, the timelines of variants d and e; that the early CTAs
    ///   doubled up on the SMs gate_up freed first is our reading, not measured). With 192
    ///   CTAs, interleaved twice in one call (variant e, us per layer): 279.9 and 279.9 against
    ///   the rule's 288.9 and 288.7 (e vs d +4.7% against +0.5%); clusters of 4 293.0, qkv in 3
    ///   too 286.8, gate_up in 2 too 286.5.
    ///
    /// Each only where its K has enough 64-column k-blocks (gate_up's K is the hidden size,
    /// o_proj's the query width, down's the intermediate size).
    pub fn default_swap_ab_ksplit(dims: &DecodeDims, batch: usize) -> [Option<u32>; 4] {
        let at_least = |ks: u32, k: usize| (k.div_ceil(wc::BK) >= ks as usize).then_some(ks);
        [
            None,
            at_least(3, dims.q_width()),
            if batch > 32 {
                None
            } else {
                at_least(2, dims.hidden)
            },
            at_least(3, dims.intermediate),
        ]
    }

    /// The GEMM form every GEMM of the step takes unless [`Self::gemm_roles`] overrides it.
    /// Measured on the H100 (2026-11-25, benches/decode_step, variant e): the A-prefetch forms
    /// beat the default `u4` at every batch, two row tiles up to 32 sequences (8 x 4096: 258.8
    /// vs 278.9 us per layer; 32 x 4096: 577 vs 716), one above (64 x 2048: 749 vs 1387).
    pub fn default_gemm(batch: usize) -> DecodeConfig {
        DecodeConfig {
            warps: 8,
            ksplit: None,
            unroll: 2,
            l2_prefetch: true,
            row_tiles: if batch <= 32 { 2 } else { 1 },
            prefetch_a: true,
        }
    }

    /// The per-GEMM forms that differ from [`Self::gemm`] by default. From 17 to 32 sequences
    /// (two row tiles of 16 tokens), measured on the H200 (2026-11-28, benches/decode_step,
    /// 32 x 4096, 4 layers, the per-kernel weight GB/s of the variant-c timeline): qkv on 4
    /// warps (two CTAs per SM; 42 -> 26 us, 1.19 -> 1.94 TB/s) and gate_up with a k-split of 2
    /// (86 -> 75 us, 2.74 -> 3.15 TB/s); together 401 -> 375 us per layer in variant e. o_proj
    /// and down kept the shared form (no swept form was faster). Fewer sequences keep
    /// [`Self::gemm`] for every GEMM (not swept there).
    pub fn default_roles(batch: usize) -> [Option<DecodeConfig>; 4] {
        let base = Self::default_gemm(batch);
        if (17..=32).contains(&batch) {
            [
                Some(DecodeConfig { warps: 4, ..base }),
                None,
                Some(DecodeConfig {
                    ksplit: Some(2),
                    ..base
                }),
                None,
            ]
        } else {
            [None; 4]
        }
    }

    /// The GEMMs that take the swap-AB form by default ([`Self::swap_ab`]): all four, at every
    /// batch. Measured on the H200 (2026-11-29, benches/decode_step, variant e, us per layer,
    /// each pair in one call): o_proj, gate_up and down as swap-AB against the decode GEMM's best
    /// forms, 8 x 4096 191.0 -> 187.9, 32 x 4096 376.8 -> 342.4, 64 x 2048 578.2 -> 400.2; then
    /// qkv too, 8 x 4096 188.4 -> 186.0, 32 x 4096 343.5 -> 334.0 (qkv 26.6 -> 16.8 us), 64 x
    /// 2048 401.8 -> 362.2.
    pub fn default_swap_ab(_batch: usize) -> [bool; 4] {
        [true; 4]
    }

    /// The GEMM role names of [`Self::swap_ab`] and [`Self::gemm_roles`], in step order.
    pub const GEMM_ROLES: [&'static str; 4] = ["qkv", "o_proj", "gate_up", "down"];

    /// Parses a set of swap-AB GEMMs for [`Self::swap_ab`]: `none`, `all`, or a
    /// comma-separated list of `qkv`, `o_proj`, `gate_up`, `down`. Errors: [`Error::BadShape`]
    /// naming the allowed values.
    pub fn parse_swap_ab(list: &str) -> Result<[bool; 4]> {
        match list {
            "none" => return Ok([false; 4]),
            "all" => return Ok([true; 4]),
            _ => {}
        }
        let mut set = [false; 4];
        for name in list.split(',') {
            match Self::GEMM_ROLES.iter().position(|&r| r == name.trim()) {
                Some(r) => set[r] = true,
                None => {
                    return Err(Error::BadShape {
                        what: "decode step swap-AB GEMMs",
                        detail: format!(
                            "{name:?} in {list:?}; allowed: none, all, or a comma-separated list of qkv, o_proj, gate_up, down"
                        ),
                    })
                }
            }
        }
        Ok(set)
    }

    /// The swap-AB GEMMs as [`Self::parse_swap_ab`] reads them (`none` or a list).
    pub fn swap_ab_label(&self) -> String {
        let names: Vec<&str> = (0..4)
            .filter(|&r| self.swap_ab[r])
            .map(|r| Self::GEMM_ROLES[r])
            .collect();
        if names.is_empty() {
            "none".into()
        } else {
            names.join(",")
        }
    }

    /// Sets the GEMM forms a caller chose: `all` (if any) for every GEMM, the default per-GEMM
    /// forms stepping aside, then each `Some` of `roles` (0 qkv, 1 o_proj, 2 gate_up, 3 down)
    /// for its GEMM. A GEMM given a decode-GEMM form this way is a decode GEMM ([`Self::swap_ab`]
    /// cleared for it; `all` clears every one). For the bench's and the CLI's form flags.
    pub fn set_gemm_forms(&mut self, all: Option<DecodeConfig>, roles: [Option<DecodeConfig>; 4]) {
        if let Some(g) = all {
            self.gemm = g;
            self.gemm_roles = [None; 4];
            self.swap_ab = [false; 4];
        }
        for ((slot, form), swap) in self.gemm_roles.iter_mut().zip(roles).zip(&mut self.swap_ab) {
            if form.is_some() {
                *slot = form;
                *swap = false;
            }
        }
    }

    /// The configuration of GEMM `role` (0 qkv, 1 o_proj, 2 gate_up, 3 down): its override in
    /// [`Self::gemm_roles`], else [`Self::gemm`].
    pub fn gemm_for(&self, role: usize) -> DecodeConfig {
        self.gemm_roles
            .get(role)
            .copied()
            .flatten()
            .unwrap_or(self.gemm)
    }
}

/// One layer's weights on the host in bf16, logical layouts of [`super`].
#[derive(Clone, Debug)]
pub struct HostLayer {
    /// `[hidden]`.
    pub attn_norm: Vec<bf16>,
    /// `[(H + 2 Hkv) d][hidden]`.
    pub wqkv: Vec<bf16>,
    /// `[hidden][H d]`.
    pub wo: Vec<bf16>,
    /// `[hidden]`.
    pub ffn_norm: Vec<bf16>,
    /// `[inter][hidden]`.
    pub w_gate: Vec<bf16>,
    /// `[inter][hidden]`.
    pub w_up: Vec<bf16>,
    /// `[hidden][inter]`.
    pub w_down: Vec<bf16>,
}

fn to_bf16(v: &[f32]) -> Vec<bf16> {
    v.iter().map(|&x| bf16::from_f32(x)).collect()
}

impl HostLayer {
    /// The reference's weights in bf16 (exact: they are bf16 values).
    pub fn from_reference(w: &LayerWeights) -> Self {
        Self {
            attn_norm: to_bf16(&w.attn_norm),
            wqkv: to_bf16(&w.wqkv),
            wo: to_bf16(&w.wo),
            ffn_norm: to_bf16(&w.ffn_norm),
            w_gate: to_bf16(&w.w_gate),
            w_up: to_bf16(&w.w_up),
            w_down: to_bf16(&w.w_down),
        }
    }

    /// Random weights of the same distribution as [`LayerWeights::random`] (not the same
    /// values), generated in chunks of 4 Mi elements on all cores (full-size layers are
    /// 218 M parameters).
    pub fn random(dims: &DecodeDims, seed: u64) -> Self {
        let (h, q, i) = (dims.hidden, dims.q_width(), dims.intermediate);
        let s = |fan_in: usize| 1.0 / (fan_in as f64).sqrt();
        let norm = |seed: u64| -> Vec<bf16> {
            normal_bf16(seed, h, 0.1)
                .into_iter()
                .map(|v| bf16::from_f32(1.0 + v))
                .collect()
        };
        let mat = |seed: u64, n: usize, sc: f64| -> Vec<bf16> {
            const CHUNK: usize = 1 << 22;
            let mut out = vec![bf16::ZERO; n];
            let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
            let chunks: Vec<(usize, &mut [bf16])> = out.chunks_mut(CHUNK).enumerate().collect();
            let per = chunks.len().div_ceil(threads).max(1);
            let mut groups: Vec<Vec<(usize, &mut [bf16])>> = Vec::new();
            let mut it = chunks.into_iter().peekable();
            while it.peek().is_some() {
                groups.push(it.by_ref().take(per).collect());
            }
            std::thread::scope(|s| {
                for g in groups {
                    s.spawn(move || {
                        for (i, c) in g {
                            let seed = seed.wrapping_mul(1_000_003).wrapping_add(i as u64);
                            let vals = normal_bf16(seed, c.len(), sc);
                            for (d, v) in c.iter_mut().zip(vals) {
                                *d = bf16::from_f32(v);
                            }
                        }
                    });
                }
            });
            out
        };
        let k = seed.wrapping_mul(7);
        Self {
            attn_norm: norm(k + 1),
            wqkv: mat(k + 2, dims.qkv_rows() * h, s(h)),
            wo: mat(k + 3, h * q, s(q)),
            ffn_norm: norm(k + 4),
            w_gate: mat(k + 5, i * h, s(h)),
            w_up: mat(k + 6, i * h, s(h)),
            w_down: mat(k + 7, h * i, s(i)),
        }
    }

    fn check(&self, dims: &DecodeDims, layer: usize) -> Result<()> {
        let (h, q, i) = (dims.hidden, dims.q_width(), dims.intermediate);
        for (name, len, want) in [
            ("attn_norm", self.attn_norm.len(), h),
            ("wqkv", self.wqkv.len(), dims.qkv_rows() * h),
            ("wo", self.wo.len(), h * q),
            ("ffn_norm", self.ffn_norm.len(), h),
            ("w_gate", self.w_gate.len(), i * h),
            ("w_up", self.w_up.len(), i * h),
            ("w_down", self.w_down.len(), h * i),
        ] {
            if len != want {
                return Err(Error::LengthMismatch {
                    what: "decode layer weights",
                    detail: format!("layer {layer} {name}: {len} elements; the dims need {want}"),
                });
            }
        }
        Ok(())
    }
}

/// One launch of a chain: entry, configuration, arguments.
/// One launch of a chain: entry name, the kernel when it is not of the device's own module
/// (the swap-AB GEMM's sm_90a entries), configuration, arguments.
type Launch = (&'static str, Option<Kernel>, LaunchConfig, Vec<KernelArg>);

/// One layer on the device.
struct DeviceLayer {
    attn_norm: DeviceBuffer<bf16>,
    wqkv: DeviceBuffer<bf16>,
    wo: DeviceBuffer<bf16>,
    ffn_norm: DeviceBuffer<bf16>,
    wgu: DeviceBuffer<bf16>,
    w_down: DeviceBuffer<bf16>,
    k_cache: DeviceBuffer<bf16>,
    v_cache: DeviceBuffer<bf16>,
    qkv_args: DeviceBuffer<u64>,
}

/// The inputs the host updates between runs.
struct Inputs {
    x: DeviceBuffer<bf16>,
    positions: DeviceBuffer<u32>,
    block_table: DeviceBuffer<u32>,
    host_positions: Vec<u32>,
    host_block_table: Vec<u32>,
}

/// One kernel of the step, for stamps and reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepKernel {
    /// Layer.
    pub layer: usize,
    /// Role (`rmsnorm1`, `qkv`, `attn`, `o_proj`, `rmsnorm2`, `gate_up`, `down`).
    pub role: &'static str,
    /// Entry name.
    pub kernel: &'static str,
    /// CTAs.
    pub grid: u32,
    /// Threads per CTA.
    pub block: u32,
    /// Bytes of weights (or, for the attention, KV cache at full capacity) the kernel reads.
    pub bytes: u64,
    /// CTAs of this launch that fit on one SM at once (registers, shared memory, threads;
    /// `cuOccupancyMaxActiveBlocksPerMultiprocessor`). With `grid < ctas_per_sm * SMs` the
    /// kernel leaves room on the SMs for its successor's CTAs (PDL overlap).
    pub ctas_per_sm: u32,
}

/// `%globaltimer` stamps of one kernel of a run (ns).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct KernelStamps {
    /// Layer.
    pub layer: usize,
    /// Role.
    pub role: &'static str,
    /// First CTA start.
    pub start: u64,
    /// First CTA past `griddepcontrol.wait`.
    pub wait_first: u64,
    /// Last CTA past it.
    pub wait_last: u64,
    /// Last CTA end (thread 0 of the CTA; the `decode_gemm` CTAs stamp after their epilogue).
    pub end: u64,
}

/// A validated, allocated decode step (see the module docs).
pub struct DecodeStep<'d> {
    // Declared first: dropped before the buffers their launches point into.
    chains: Vec<Chain<'d>>,
    /// The sm_90a module of the swap-AB GEMMs (when [`StepConfig::swap_ab`] names any); the
    /// chains' steps hold clones of its kernels, which keep it loaded.
    tc: Option<TcGemm<'d>>,
    /// Launch shape of each swap-AB GEMM (`None`: the decode GEMM).
    swap: [Option<SwapAbShape>; 4],
    /// RMSNorm fused into the GEMMs ([`StepConfig::fuse_norm`] with every GEMM swap-AB).
    fused: bool,
    /// The fused RMSNorm's per-row partial sums of squares (`B x ceil(hidden / 64)` f32).
    ss: DeviceBuffer<f32>,
    /// The fused RMSNorm's argument blocks (`NORM_ARGS_WORDS` u64 each): block 0 the input
    /// side (qkv, gate_up), block `1 + 2 l` o_proj's output side (layer l's `ffn_norm`),
    /// block `2 + 2 l` down's (layer l + 1's `attn_norm`; unused for the last layer).
    norm_args: DeviceBuffer<u64>,
    /// The swap-AB GEMMs' and the tensor-core attention's tensor maps (see [`map_slots`]), over
    /// the step's own buffers.
    tmaps: Option<DeviceBuffer<[u64; 16]>>,
    /// The launches of each chain (entry, configuration, arguments), for
    /// [`DecodeStep::run_kernels`].
    launches: Vec<Vec<Launch>>,
    dev: &'d Device,
    stream: Stream,
    dims: DecodeDims,
    cfg: StepConfig,
    kernels: Vec<StepKernel>,
    splits: u32,
    layers: Vec<DeviceLayer>,
    inputs: Mutex<Inputs>,
    h: DeviceBuffer<bf16>,
    normed: DeviceBuffer<bf16>,
    q: DeviceBuffer<bf16>,
    attn: DeviceBuffer<bf16>,
    act: DeviceBuffer<bf16>,
    part_o: DeviceBuffer<f32>,
    part_ml: DeviceBuffer<f32>,
    /// The attention's split-KV combine counters (`batch x kv_heads` u32, zero between launches).
    counters: DeviceBuffer<u32>,
    rope: DeviceBuffer<f32>,
    stamps: DeviceBuffer<u64>,
    // Last: the pool outlives the buffers allocated from it.
    _pool: MemPool,
}

impl std::fmt::Debug for DecodeStep<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeStep")
            .field("dims", &self.dims)
            .field("cfg", &self.cfg)
            .field("splits", &self.splits)
            .field("kernels", &self.kernels.len())
            .finish()
    }
}

/// Fewest KV pages per split that [`attention_splits`] picks by itself.
const MIN_PAGES_PER_SPLIT: u32 = 4;
/// A decode-attention CTA's fixed cost (Q load, barrier setup, merge, stores) in pages of
/// streaming, for [`attention_splits`]' estimate.
const CTA_COST_PAGES: u32 = 4;

/// Tensor-map slots of the step's table: the swap-AB GEMMs' `4 * layers` weight maps, then one
/// activation-input map per GEMM, then the tensor-core attention's K and V cache maps of each
/// layer.
fn map_slots(layers: usize) -> usize {
    6 * layers + 4
}

/// The slot of `layer`'s K cache map (its V cache map follows).
fn kv_map_slot(layers: usize, layer: usize) -> usize {
    4 * layers + 4 + 2 * layer
}

/// The slot of GEMM `role`'s (0 qkv, 1 o_proj, 2 gate_up, 3 down) weight map of `layer`
/// (`4 * layer + role`), or with `None` its activation-input map (`4 * layers + role`).
fn map_slot(layers: usize, layer: Option<usize>, role: usize) -> usize {
    4 * layer.unwrap_or(layers) + role
}

/// The attention's KV splits for `cfg` on `sms` SMs (see [`StepConfig::splits`]): returns
/// `(splits, pages_per_split)`, every split non-empty at full capacity.
pub fn attention_splits(dims: &DecodeDims, cfg: &StepConfig, sms: u32) -> Result<(u32, u32)> {
    let pages = cfg.layout.max_pages_per_seq as u32;
    let want = match cfg.splits {
        Some(s) => {
            if s == 0 || s > sc::MAX_SPLITS {
                return Err(Error::BadShape {
                    what: "decode attention splits",
                    detail: format!("{s}; allowed: 1 to {}", sc::MAX_SPLITS),
                });
            }
            s
        }
        None => {
            // The split count with the least estimated time: waves of CTA slots (rounded up:
            // the attention streams, so a partial last wave idles the other SMs) times a CTA's
            // time, its pages plus a fixed cost of `CTA_COST_PAGES` (prologue, merge); at least
            // `MIN_PAGES_PER_SPLIT` pages per split; ties go to fewer splits (less combine).
            let slots = sms.max(1) * cfg.attention.ctas_per_sm(dims.head_dim, dims.group());
            let base = (cfg.batch * dims.kv_heads).max(1) as u32;
            let mut best = (u64::MAX, 1u32);
            for s in 1..=pages.clamp(1, sc::MAX_SPLITS) {
                let pps = pages.div_ceil(s).max(1);
                if s > 1 && pps < MIN_PAGES_PER_SPLIT {
                    break;
                }
                let waves = (base * pages.div_ceil(pps)).div_ceil(slots) as u64;
                let est = waves * (CTA_COST_PAGES + pps) as u64;
                if est < best.0 {
                    best = (est, s);
                }
            }
            best.1
        }
    };
    let want = want.min(pages.max(1));
    let pps = pages.div_ceil(want).max(1);
    if pps > 0xffff {
        return Err(Error::TooLarge {
            what: "decode attention pages per split",
            value: pps as u64,
            max: 0xffff,
        });
    }
    Ok((pages.div_ceil(pps).max(1), pps))
}

/// k-blocks per warp to prefetch into L2 for `bytes` of a GEMM's weights (0 to 255).
fn pf_iters(ls: &DecodeLaunchShape, shape: GemmShape, bytes: usize) -> u32 {
    let kb = gc::K_STEP * ls.unroll as usize;
    let nblk = shape.k.div_ceil(kb);
    let iters = nblk.div_ceil(ls.ksplit as usize).max(1);
    let per_iter = (shape.n * shape.k * 2).div_ceil(iters).max(1);
    ((bytes / per_iter).min(iters - 1)).min(255) as u32
}

impl<'d> DecodeStep<'d> {
    /// Validates everything, uploads the weights (QKV and gate/up rows packed for the
    /// epilogues), allocates the caches (zeroed), activations and inputs once from a memory pool
    /// of the device, and builds the three launch chains. Inputs start as zeros at position 0
    /// with block-table entry `i` of the table (row-major) equal to `i % num_pages` (checked
    /// with [`check_batch`] like any input); set them with [`DecodeStep::set_inputs`].
    ///
    /// Errors, before anything is queued: [`Error::BadShape`] (dims, see
    /// [`DecodeDims::validate`]; batch outside 1..=64; no layers; an empty layout; splits;
    /// GEMM warps), [`Error::LengthMismatch`] (weights for another shape or another layer
    /// count), [`Error::TooLarge`]; then allocation and launch-configuration errors.
    pub fn new(
        dev: &'d Device,
        stream: &Stream,
        dims: DecodeDims,
        cfg: StepConfig,
        weights: &[HostLayer],
    ) -> Result<Self> {
        dims.validate()?;
        if cfg.batch == 0 || cfg.batch > gc::MAX_M {
            return Err(Error::BadShape {
                what: "decode batch",
                detail: format!("{} sequences; allowed: 1 to {}", cfg.batch, gc::MAX_M),
            });
        }
        if cfg.layers == 0 || weights.len() != cfg.layers {
            return Err(Error::LengthMismatch {
                what: "decode layers",
                detail: format!(
                    "{} layers configured, weights for {}; allowed: equal and at least 1",
                    cfg.layers,
                    weights.len()
                ),
            });
        }
        if cfg.layout.num_pages == 0 || cfg.layout.max_pages_per_seq == 0 || cfg.max_pos == 0 {
            return Err(Error::BadShape {
                what: "decode KV layout",
                detail: format!(
                    "{:?}, max_pos {}; allowed: at least one page, one block-table column and one position",
                    cfg.layout, cfg.max_pos
                ),
            });
        }
        if cfg.layout.num_pages > u32::MAX as usize || cfg.max_pos > u32::MAX as usize {
            return Err(Error::TooLarge {
                what: "decode KV pages or positions",
                value: cfg.layout.num_pages.max(cfg.max_pos) as u64,
                max: u32::MAX as u64,
            });
        }
        for (l, w) in weights.iter().enumerate() {
            w.check(&dims, l)?;
        }
        if cfg.attention == AttnForm::TensorCores {
            if sc::attn_tc_box_rows(dims.page_size) == 0 {
                return Err(Error::BadShape {
                    what: "decode page size for the tensor-core attention (TMA boxes of one page)",
                    detail: format!(
                        "{} tokens; allowed: 8, 16, 32 or a multiple of 32 (or --attn cuda)",
                        dims.page_size
                    ),
                });
            }
            let rows = cfg.layout.num_pages as u64 * (dims.kv_heads * dims.page_size) as u64;
            if rows > i32::MAX as u64 {
                return Err(Error::TooLarge {
                    what: "decode KV cache rows for the tensor-core attention (pages x KV heads x page size; TMA coordinates are signed 32-bit)",
                    value: rows,
                    max: i32::MAX as u64,
                });
            }
        }
        let sms = dev.capabilities().sm_count;
        let (splits, pps) = attention_splits(&dims, &cfg, sms)?;
        let b = cfg.batch;
        let shape = |n, k| GemmShape { m: b, n, k };
        let s_qkv = shape(dims.qkv_rows(), dims.hidden);
        let s_o = shape(dims.hidden, dims.q_width());
        let s_gu = shape(2 * dims.intermediate, dims.hidden);
        let s_down = shape(dims.hidden, dims.intermediate);
        let ls = |s, role: usize| launch_shape(s, true, &cfg.gemm_for(role), sms);
        let (ls_qkv, ls_o, ls_gu, ls_down) =
            (ls(s_qkv, 0)?, ls(s_o, 1)?, ls(s_gu, 2)?, ls(s_down, 3)?);
        let epi_kernel = |ls: &DecodeLaunchShape, epi: u32, role: usize| -> Result<&'static str> {
            gc::EPI_VARIANTS
                .iter()
                .find(|v| {
                    v.token_tiles == ls.token_tiles
                        && v.unroll == ls.unroll as usize
                        && v.row_tiles == ls.row_tiles as usize
                        && v.prefetch_a == ls.prefetch_a
                        && v.epilogue == epi
                })
                .map(|v| v.kernel)
                .ok_or_else(|| Error::BadShape {
                    what: "decode step GEMM configuration",
                    detail: format!(
                        "{} for {} sequences has no epilogue entry; allowed: unroll 4 (one row tile, no A prefetch), unroll 2 + A prefetch (one row tile), unroll 2 + A prefetch + two row tiles (up to 32 sequences)",
                        cfg.gemm_for(role).label(),
                        b
                    ),
                })
        };
        let epi_kernels = [
            epi_kernel(&ls_qkv, gc::EPI_QKV, 0)?,
            epi_kernel(&ls_o, gc::EPI_STORE, 1)?,
            epi_kernel(&ls_gu, gc::EPI_SWIGLU, 2)?,
            epi_kernel(&ls_down, gc::EPI_STORE, 3)?,
        ];
        let shapes4 = [s_qkv, s_o, s_gu, s_down];
        let tc = if cfg.swap_ab.iter().any(|&on| on) {
            Some(TcGemm::new(dev)?)
        } else {
            None
        };
        let mut swap: [Option<SwapAbShape>; 4] = [None; 4];
        if let Some(tc) = &tc {
            for (r, slot) in swap.iter_mut().enumerate() {
                if cfg.swap_ab[r] {
                    *slot = Some(tc.swap_ab_shape(
                        shapes4[r],
                        SwapAbConfig {
                            ksplit: cfg.swap_ab_ksplit[r],
                            ..SwapAbConfig::default()
                        },
                    )?);
                }
            }
        }
        let attn_variant = sc::ATTN_VARIANTS
            .iter()
            .find(|v| v.head_dim == dims.head_dim && v.group == dims.group())
            .ok_or_else(|| Error::BadShape {
                what: "decode attention entry",
                detail: format!(
                    "head dim {} with {} query heads per KV head; allowed: {:?}",
                    dims.head_dim,
                    dims.group(),
                    sc::ATTN_VARIANTS
                        .iter()
                        .map(|v| (v.head_dim, v.group))
                        .collect::<Vec<_>>()
                ),
            })?;

        // The attention's KV ring takes more than the default 48 KiB.
        let (attn_kernel, _, attn_smem) = cfg.attention.launch(attn_variant);
        dev.kernel(attn_kernel)?
            .raise_max_dynamic_shared_memory(attn_smem)?;
        // 16-warp CTAs with 8 token tiles need 64 KiB for the split-K exchange.
        for v in gc::EPI_VARIANTS {
            dev.kernel(v.kernel)?
                .raise_max_dynamic_shared_memory(gc::MAX_SMEM_BYTES)?;
        }
        let pool = MemPool::new(dev, u64::MAX)?;
        let alloc_bf16 = |n: usize| pool.alloc_async::<bf16>(stream, n);
        let upload = |v: &[bf16]| -> Result<DeviceBuffer<bf16>> {
            let mut d = pool.alloc_async::<bf16>(stream, v.len())?;
            d.copy_from_host(v)?;
            Ok(d)
        };
        let mut rope = pool.alloc_async::<f32>(stream, cfg.max_pos * dims.head_dim)?;
        rope.copy_from_host(&dims.rope_table(cfg.max_pos))?;
        let bt_cols = cfg.layout.max_pages_per_seq;
        let host_block_table: Vec<u32> = (0..b * bt_cols)
            .map(|i| (i % cfg.layout.num_pages) as u32)
            .collect();
        let host_positions = vec![0u32; b];
        check_batch(
            &dims,
            &cfg.layout,
            cfg.max_pos,
            &host_positions,
            &host_block_table,
        )?;
        let mut positions = pool.alloc_async::<u32>(stream, b)?;
        positions.copy_from_host(&host_positions)?;
        let mut block_table = pool.alloc_async::<u32>(stream, b * bt_cols)?;
        block_table.copy_from_host(&host_block_table)?;
        let mut x = alloc_bf16(b * dims.hidden)?;
        x.fill_async(bf16::ZERO)?;
        let cache_elems = cfg.layout.cache_elems(&dims);
        let mut layers = Vec::with_capacity(cfg.layers);
        for w in weights {
            let mut k_cache = alloc_bf16(cache_elems)?;
            let mut v_cache = alloc_bf16(cache_elems)?;
            k_cache.fill_async(bf16::ZERO)?;
            v_cache.fill_async(bf16::ZERO)?;
            let mut qkv_args = pool.alloc_async::<u64>(stream, gc::QKV_ARGS)?;
            let args: [u64; gc::QKV_ARGS] = [
                positions.device_ptr(),
                block_table.device_ptr(),
                k_cache.device_ptr(),
                v_cache.device_ptr(),
                rope.device_ptr(),
                dims.heads as u64 | (dims.kv_heads as u64) << 32,
                dims.head_dim as u64 | (dims.page_size as u64) << 32,
                bt_cols as u64 | (cfg.layout.num_pages as u64) << 32,
                cfg.max_pos as u64,
            ];
            qkv_args.copy_from_host(&args)?;
            // GEMM r's weights as its kernel reads them: tiled for a swap-AB GEMM with
            // `swap_ab_tiled`, else row-major.
            let upload_w = |r: usize, rows: &[bf16]| -> Result<DeviceBuffer<bf16>> {
                if swap[r].is_some() && cfg.swap_ab_tiled {
                    upload(&tile_weights(rows, shapes4[r].n, shapes4[r].k)?)
                } else {
                    upload(rows)
                }
            };
            layers.push(DeviceLayer {
                attn_norm: upload(&w.attn_norm)?,
                wqkv: upload_w(
                    0,
                    &if cfg.swap_ab[0] {
                        pack_qkv_pairs(&dims, &w.wqkv)?
                    } else {
                        pack_qkv_rows(&dims, &w.wqkv)?
                    },
                )?,
                wo: upload_w(1, &w.wo)?,
                ffn_norm: upload(&w.ffn_norm)?,
                wgu: upload_w(
                    2,
                    &if cfg.swap_ab[2] {
                        pack_gate_up_pairs(&dims, &w.w_gate, &w.w_up)?
                    } else {
                        pack_gate_up_rows(&dims, &w.w_gate, &w.w_up)?
                    },
                )?,
                w_down: upload_w(3, &w.w_down)?,
                k_cache,
                v_cache,
                qkv_args,
            });
        }
        let h = alloc_bf16(b * dims.hidden)?;
        let normed = alloc_bf16(b * dims.hidden)?;
        let q = alloc_bf16(b * dims.q_width())?;
        let attn = alloc_bf16(b * dims.q_width())?;
        let act = alloc_bf16(b * dims.intermediate)?;
        let fused = cfg.fuse_norm && swap.iter().all(Option::is_some);
        let parts = dims.hidden.div_ceil(wc::W_ROWS);
        let ss = pool.alloc_async::<f32>(stream, b * parts)?;
        let mut norm_args =
            pool.alloc_async::<u64>(stream, (1 + 2 * cfg.layers) * wc::NORM_ARGS_WORDS)?;
        {
            let mut blocks = wc::norm_args(
                Some((
                    ss.device_ptr(),
                    parts as u32,
                    dims.hidden as u32,
                    dims.eps as f32,
                )),
                None,
            )
            .to_vec();
            for l in 0..cfg.layers {
                let out = |gamma: &DeviceBuffer<bf16>| {
                    wc::norm_args(
                        None,
                        Some((
                            gamma.device_ptr(),
                            normed.device_ptr(),
                            ss.device_ptr(),
                            dims.hidden as u32,
                            parts as u32,
                        )),
                    )
                };
                blocks.extend(out(&layers[l].ffn_norm));
                blocks.extend(out(&layers[(l + 1) % cfg.layers].attn_norm));
            }
            norm_args.copy_from_host(&blocks)?;
        }
        let part_len = b * dims.heads * splits as usize * dims.head_dim;
        let part_o = pool.alloc_async::<f32>(stream, part_len.max(1))?;
        let part_ml = pool.alloc_async::<f32>(stream, (2 * part_len / dims.head_dim).max(1))?;
        // The fused combine's arrival counters: zero, and left zero by every launch.
        let mut counters = pool.alloc_async::<u32>(stream, (b * dims.kv_heads).max(1))?;
        counters.fill_async(0)?;
        // The swap-AB GEMMs' tensor maps: per layer its weights (W_BOX boxes), then per GEMM its
        // activation input (x_box(tokens) boxes), all over buffers of this step, in one table.
        let tc_attn = cfg.attention == AttnForm::TensorCores;
        let tmaps = if tc_attn || swap.iter().any(Option::is_some) {
            let sw = TmaSwizzle::B128;
            let mut raw = vec![[0u64; 16]; map_slots(cfg.layers)];
            let mut put = |slot: usize, map: TensorMap<'_>| {
                for (w, c) in raw[slot].iter_mut().zip(map.bytes().chunks_exact(8)) {
                    *w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
                }
            };
            let x_in = [&normed, &attn, &normed, &act];
            for r in 0..4 {
                let Some(ls) = swap[r] else {
                    continue;
                };
                let x = x_in[r];
                let s = shapes4[r];
                let xm = TensorMap::matrix(
                    &x.view(0..x.len())?,
                    s.m,
                    s.k,
                    s.k,
                    wc::x_box(ls.tokens),
                    sw,
                )?;
                put(map_slot(cfg.layers, None, r), xm);
                for (l, layer) in layers.iter().enumerate() {
                    let w = [&layer.wqkv, &layer.wo, &layer.wgu, &layer.w_down][r];
                    // Tiled: rows of one k-block's 64 elements, tile after tile.
                    let (rows, cols) = if cfg.swap_ab_tiled {
                        (wc::tiled_weight_elems(s.n, s.k) / wc::BK, wc::BK)
                    } else {
                        (s.n, s.k)
                    };
                    let wm =
                        TensorMap::matrix(&w.view(0..w.len())?, rows, cols, cols, wc::W_BOX, sw)?;
                    put(map_slot(cfg.layers, Some(l), r), wm);
                }
            }
            if tc_attn {
                // Rows of 64 columns (128 bytes, the swizzle's span), box rows of one page.
                let box_rows = sc::attn_tc_box_rows(dims.page_size) as u32;
                let rows = cfg.layout.num_pages * dims.kv_heads * dims.page_size;
                for (l, layer) in layers.iter().enumerate() {
                    for (i, cache) in [&layer.k_cache, &layer.v_cache].into_iter().enumerate() {
                        let m = TensorMap::matrix(
                            &cache.view(0..cache.len())?,
                            rows,
                            dims.head_dim,
                            dims.head_dim,
                            [sc::ATTN_TC_BOX_COLS, box_rows],
                            sw,
                        )?;
                        put(kv_map_slot(cfg.layers, l) + i, m);
                    }
                }
            }
            let mut t = pool.alloc_async::<[u64; 16]>(stream, raw.len())?;
            t.copy_from_host(&raw)?;
            Some(t)
        } else {
            None
        };
        let mut stamps = pool.alloc_async::<u64>(stream, cfg.layers * 8 * sc::STAMP_WORDS)?;
        // (u64 elements: no memset pattern; an H2D copy of the reset values.)
        let n_slots = stamps.len() / sc::STAMP_WORDS;
        stamps.copy_from_host(
            &(0..n_slots)
                .flat_map(|_| [u64::MAX, u64::MAX, 0, 0])
                .collect::<Vec<u64>>(),
        )?;
        stream.synchronize()?;

        let mut step = Self {
            chains: Vec::new(),
            tc,
            swap,
            fused,
            ss,
            norm_args,
            tmaps,
            launches: Vec::new(),
            dev,
            stream: stream.clone(),
            dims,
            cfg,
            kernels: Vec::new(),
            splits,
            _pool: pool,
            layers,
            inputs: Mutex::new(Inputs {
                x,
                positions,
                block_table,
                host_positions,
                host_block_table,
            }),
            h,
            normed,
            q,
            attn,
            act,
            part_o,
            part_ml,
            counters,
            rope,
            stamps,
        };
        let gemms = [ls_qkv, ls_o, ls_gu, ls_down];
        let shapes = [s_qkv, s_o, s_gu, s_down];
        for (ci, (pdl, early)) in [(false, false), (true, false), (true, true)]
            .into_iter()
            .enumerate()
        {
            let mut chain = Chain::new(dev, stream, pdl)?;
            let (kernels, launches) = step.push_all(
                &mut chain,
                early,
                &epi_kernels,
                &gemms,
                &shapes,
                attn_variant,
                pps,
            )?;
            if ci == 0 {
                step.kernels = kernels;
            }
            step.launches.push(launches);
            step.chains.push(chain);
        }
        Ok(step)
    }

    /// Appends every launch of the step to `chain`; returns the kernel list.
    #[allow(clippy::too_many_arguments)]
    fn push_all(
        &self,
        chain: &mut Chain<'d>,
        early: bool,
        epi_kernels: &[&'static str; 4],
        gemms: &[DecodeLaunchShape; 4],
        shapes: &[GemmShape; 4],
        attn_variant: &sc::AttnVariant,
        pps: u32,
    ) -> Result<(Vec<StepKernel>, Vec<Launch>)> {
        let d = &self.dims;
        let b = self.cfg.batch as u32;
        let stamps = if self.cfg.stamps {
            self.stamps.device_ptr()
        } else {
            0
        };
        let inputs = self.inputs.lock().expect("decode inputs lock");
        let (x_ptr, pos_ptr, bt_ptr) = (
            inputs.x.device_ptr(),
            inputs.positions.device_ptr(),
            inputs.block_table.device_ptr(),
        );
        drop(inputs);
        let mut kernels = Vec::new();
        let mut launches = Vec::new();
        let u32a = KernelArg::U32;
        let u64a = KernelArg::U64;
        let f32a = |v: f32| KernelArg::U32(v.to_bits());
        for (l, layer) in self.layers.iter().enumerate() {
            let base_slot = (l * 8) as u32;
            let mut slot = base_slot;
            let mut push = |chain: &mut Chain<'d>,
                            role: &'static str,
                            (kernel, foreign, cfg, args): Launch,
                            bytes: u64|
             -> Result<()> {
                let entry = match &foreign {
                    Some(k) => k,
                    None => self.dev.kernel(kernel)?,
                };
                // Registers limit the CTA size per entry (e.g. 245 registers: at most 256
                // threads): refuse before anything is queued.
                let max_threads = entry
                    .func
                    .max_threads_per_block()
                    .call("cuFuncGetAttribute")?;
                if cfg.block[0] as i64 > max_threads as i64 {
                    return Err(Error::TooLarge {
                        what: "decode step threads per CTA (the entry's register-limited maximum; use fewer GEMM warps)",
                        value: cfg.block[0] as u64,
                        max: max_threads.max(0) as u64,
                    });
                }
                // SAFETY: every argument list below matches its entry's parameters (checked
                // against the PTX by the tests, `check_step_entries`); every pointer is a buffer
                // of this step (owned by it, so alive as long as the chain, which is dropped
                // first) sized by the validated dims and config as the launch contracts ask
                // (gpu/src/contract.rs `decode_gemm`, `decode_step`); the kernels touch the
                // previous kernel's data only after griddepcontrol.wait, and before it read
                // only weights (never written by the step), positions and block tables (written
                // only by the host, stream-ordered) and the KV rows of earlier tokens; the block
                // table is validated on every host update (set_inputs) and the kernels trap on
                // an entry outside the cache rather than access it. The tensor maps of the
                // step's table cover exactly the swap-AB GEMMs' A and B buffers and each layer's
                // K and V caches; the GEMMs load weights before the wait only, which the step
                // never writes. With KV splits the attention's counters are zero before each
                // launch and left zero by it (every CTA counts once; the last resets). The fused
                // RMSNorm's argument blocks (norm_args) point at this step's `normed` (hidden
                // bf16 per row, 16-byte aligned, pitch hidden, a multiple of 8), `ss` (B x
                // ceil(hidden / 64) f32) and the layers' norm weights, as
                // contract::swap_ab_gemm::NORM_ARGS_WORDS says; FLAG_NORM_OUT only on the
                // plain bf16 residual epilogue (o_proj, down).
                unsafe {
                    match &foreign {
                        Some(k) => chain.push_kernel(kernel, k, cfg, &args),
                        None => chain.push_raw(kernel, cfg, &args),
                    }
                }?;
                self.dev.bind()?;
                // SAFETY: a function of a module of the device; its context was bound above.
                let ctas_per_sm = unsafe {
                    crate::driver::core::occupancy_max_blocks_per_sm(
                        entry.cu_function(),
                        cfg.block[0],
                        cfg.shared_mem_bytes as usize,
                    )
                }?;
                kernels.push(StepKernel {
                    layer: l,
                    role,
                    kernel,
                    grid: cfg.grid[0] * cfg.grid[1],
                    block: cfg.block[0],
                    bytes,
                    ctas_per_sm: ctas_per_sm.max(0) as u32,
                });
                launches.push((kernel, foreign, cfg, args));
                Ok(())
            };
            let flags_s = |slot: u32| -> u32 {
                (slot << sc::STAMP_SLOT_SHIFT) | if early { sc::FLAG_EARLY } else { 0 }
            };
            let hidden = d.hidden as u32;
            let norm_cfg = LaunchConfig::linear(b, sc::RMSNORM_THREADS, 128);
            let norm_bytes = 2 * d.hidden as u64;
            // 1. RMSNorm of x (layer 0, also copying x into h) or h. Fused: only layer 0's, as
            // the first half of the fused norm (x * gamma and the partial sums of squares).
            let (src, resid) = if l == 0 {
                (x_ptr, self.h.device_ptr())
            } else {
                (self.h.device_ptr(), 0)
            };
            if !self.fused || l == 0 {
                push(
                    chain,
                    "rmsnorm1",
                    (
                        sc::RMSNORM_KERNEL,
                        None,
                        norm_cfg,
                        vec![
                            u64a(src),
                            u64a(layer.attn_norm.device_ptr()),
                            u64a(self.normed.device_ptr()),
                            u64a(resid),
                            u32a(b),
                            u32a(hidden),
                            f32a(d.eps as f32),
                            u64a(stamps),
                            u32a(flags_s(slot)),
                            u64a(if self.fused { self.ss.device_ptr() } else { 0 }),
                        ],
                    ),
                    norm_bytes,
                )?;
                // (Slots are consecutive per layer over the kernels pushed: `stamps`.)
                slot += 1;
            }
            // The fused norm's flags and argument block of GEMM `i` of this layer.
            let norm_block =
                |blk: usize| self.norm_args.device_ptr() + (blk * wc::NORM_ARGS_WORDS * 8) as u64;
            let fused_norm = |i: usize| -> (u32, u64) {
                if !self.fused {
                    return (0, 0);
                }
                match i {
                    0 | 2 => (wc::FLAG_NORM_IN, norm_block(0)),
                    1 => (wc::FLAG_NORM_OUT, norm_block(1 + 2 * l)),
                    _ if l + 1 < self.cfg.layers => (wc::FLAG_NORM_OUT, norm_block(2 + 2 * l)),
                    _ => (0, 0),
                }
            };
            // GEMM `i` (0 qkv, 1 o_proj, 2 gate_up, 3 down) of this layer: `C = A W^T + beta C`
            // (or its epilogue) as the decode GEMM or, per StepConfig::swap_ab, the swap-AB GEMM.
            #[allow(clippy::too_many_arguments)]
            let gemm = |i: usize,
                        slot: u32,
                        a: u64,
                        w: u64,
                        c: u64,
                        ldc: usize,
                        beta: f32,
                        epi: u64|
             -> Result<Launch> {
                let s = shapes[i];
                if let (Some(ls), Some(tc), Some(maps)) = (self.swap[i], &self.tc, &self.tmaps) {
                    let map = |layer| {
                        maps.device_ptr() + (map_slot(self.cfg.layers, layer, i) * 128) as u64
                    };
                    let mut cfg = LaunchConfig::linear(1, wc::THREADS_PER_CTA, ls.smem_bytes)
                        .with_cluster_x(ls.ksplit);
                    cfg.grid = ls.grid();
                    let (norm_flags, norm) = fused_norm(i);
                    let flags = (slot << wc::STAMP_SLOT_SHIFT)
                        | norm_flags
                        | if self.cfg.swap_ab_tiled {
                            wc::FLAG_W_TILED
                        } else {
                            0
                        }
                        | if early { wc::FLAG_WEIGHTS_EARLY } else { 0 }
                        | if self.cfg.swap_ab_trigger_at_wait {
                            wc::FLAG_TRIGGER_AT_WAIT
                        } else {
                            0
                        };
                    let (epilogue, bias) = match i {
                        0 => (wc::EPI_QKV, epi),
                        2 => (wc::EPI_SWIGLU, 0),
                        _ => (wc::EPI_NONE, 0),
                    };
                    let args = vec![
                        u64a(map(Some(l))),
                        u64a(map(None)),
                        u64a(c),
                        u64a(bias),
                        u32a(s.m as u32),
                        u32a(s.n as u32),
                        u32a(s.k as u32),
                        u32a(ldc as u32),
                        f32a(1.0),
                        f32a(beta),
                        u32a(0),
                        u32a(epilogue),
                        u32a(flags),
                        u64a(stamps),
                        u64a(norm),
                    ];
                    return Ok((ls.kernel, Some(tc.entry(ls.kernel)?.clone()), cfg, args));
                }
                let ls = &gemms[i];
                let mut flags = (slot << gc::STAMP_SLOT_SHIFT)
                    | if self.cfg.gemm_for(i).l2_prefetch {
                        gc::FLAG_L2_PREFETCH_256
                    } else {
                        0
                    };
                if early {
                    let pf = pf_iters(ls, s, self.cfg.prefetch_bytes);
                    flags |= gc::FLAG_WEIGHTS_EARLY;
                    if pf > 0 {
                        flags |= gc::FLAG_PREFETCH_L2_BULK | (pf << gc::PF_ITERS_SHIFT);
                    }
                }
                let args = vec![
                    u64a(a),
                    u64a(w),
                    u64a(c),
                    u32a(s.m as u32),
                    u32a(s.n as u32),
                    u32a(s.k as u32),
                    u32a(s.k as u32),
                    u32a(s.k as u32),
                    u32a(ldc as u32),
                    f32a(1.0),
                    f32a(beta),
                    u32a(0),
                    u32a(ls.ksplit),
                    u32a(flags),
                    u64a(stamps),
                    u64a(epi),
                ];
                Ok((
                    epi_kernels[i],
                    None,
                    LaunchConfig::linear(ls.grid, ls.warps * 32, ls.smem_bytes),
                    args,
                ))
            };
            // 2. QKV + RoPE + cache append.
            push(
                chain,
                "qkv",
                gemm(
                    0,
                    slot,
                    self.normed.device_ptr(),
                    layer.wqkv.device_ptr(),
                    self.q.device_ptr(),
                    d.q_width(),
                    0.0,
                    layer.qkv_args.device_ptr(),
                )?,
                (shapes[0].n * shapes[0].k * 2) as u64,
            )?;
            slot += 1;
            // 3. Attention (with KV splits, its last CTAs combine them).
            let kv_bytes = 2
                * (self.cfg.batch * self.cfg.layout.max_pages_per_seq * d.page_size) as u64
                * (d.kv_heads * d.head_dim * 2) as u64;
            let scale_log2 = (std::f64::consts::LOG2_E / (d.head_dim as f64).sqrt()) as f32;
            let (attn_kernel, attn_threads, attn_smem) = self.cfg.attention.launch(attn_variant);
            // The tensor-core form's K and V tensor maps (adjacent slots of the table).
            let kv_maps = match (&self.tmaps, self.cfg.attention) {
                (Some(maps), AttnForm::TensorCores) => {
                    maps.device_ptr() + (kv_map_slot(self.cfg.layers, l) * 128) as u64
                }
                _ => 0,
            };
            push(
                chain,
                "attn",
                (
                    attn_kernel,
                    None,
                    LaunchConfig::linear(
                        b * d.kv_heads as u32 * self.splits,
                        attn_threads,
                        attn_smem as u32,
                    ),
                    vec![
                        u64a(self.q.device_ptr()),
                        u64a(layer.k_cache.device_ptr()),
                        u64a(layer.v_cache.device_ptr()),
                        u64a(bt_ptr),
                        u64a(pos_ptr),
                        u64a(self.attn.device_ptr()),
                        u64a(self.part_o.device_ptr()),
                        u64a(self.part_ml.device_ptr()),
                        u32a(d.kv_heads as u32),
                        u32a(d.page_size as u32),
                        u32a(self.cfg.layout.max_pages_per_seq as u32),
                        u32a(self.cfg.layout.num_pages as u32),
                        u32a(self.splits | pps << 16),
                        f32a(scale_log2),
                        u64a(stamps),
                        u64a(kv_maps),
                        u64a(self.counters.device_ptr()),
                        u32a(flags_s(slot)),
                    ],
                ),
                kv_bytes,
            )?;
            slot += 1;
            // 5. O projection + residual (in place into h).
            push(
                chain,
                "o_proj",
                gemm(
                    1,
                    slot,
                    self.attn.device_ptr(),
                    layer.wo.device_ptr(),
                    self.h.device_ptr(),
                    d.hidden,
                    1.0,
                    0,
                )?,
                (shapes[1].n * shapes[1].k * 2) as u64,
            )?;
            slot += 1;
            // 6. RMSNorm of h (fused: o_proj wrote h * gamma and the sums of squares).
            if !self.fused {
                push(
                    chain,
                    "rmsnorm2",
                    (
                        sc::RMSNORM_KERNEL,
                        None,
                        norm_cfg,
                        vec![
                            u64a(self.h.device_ptr()),
                            u64a(layer.ffn_norm.device_ptr()),
                            u64a(self.normed.device_ptr()),
                            u64a(0),
                            u32a(b),
                            u32a(hidden),
                            f32a(d.eps as f32),
                            u64a(stamps),
                            u32a(flags_s(slot)),
                            u64a(0),
                        ],
                    ),
                    norm_bytes,
                )?;
                slot += 1;
            }
            // 7. gate/up + SiLU(gate) * up.
            push(
                chain,
                "gate_up",
                gemm(
                    2,
                    slot,
                    self.normed.device_ptr(),
                    layer.wgu.device_ptr(),
                    self.act.device_ptr(),
                    d.intermediate,
                    0.0,
                    0,
                )?,
                (shapes[2].n * shapes[2].k * 2) as u64,
            )?;
            slot += 1;
            // 8. down + residual.
            push(
                chain,
                "down",
                gemm(
                    3,
                    slot,
                    self.act.device_ptr(),
                    layer.w_down.device_ptr(),
                    self.h.device_ptr(),
                    d.hidden,
                    1.0,
                    0,
                )?,
                (shapes[3].n * shapes[3].k * 2) as u64,
            )?;
            debug_assert!(slot < base_slot + 8);
        }
        Ok((kernels, launches))
    }

    /// Queues only the launches `range` of [`DecodeStep::kernels`] (in order, with
    /// `variant`'s launch flags; a graph variant runs its chain's launches eagerly): for testing
    /// a kernel alone on inputs written with [`DecodeStep::write_activation`]. Errors:
    /// [`Error::BadShape`] for a range outside the kernel list; launch errors.
    pub fn run_kernels(&self, variant: Variant, range: std::ops::Range<usize>) -> Result<()> {
        let all = &self.launches[variant.chain()];
        if range.start > range.end || range.end > all.len() {
            return Err(Error::BadShape {
                what: "DecodeStep::run_kernels range",
                detail: format!("{range:?}; the step has kernels 0..{}", all.len()),
            });
        }
        let mut chain = Chain::new(self.dev, &self.stream, self.chains[variant.chain()].pdl())?;
        for (kernel, foreign, cfg, args) in &all[range] {
            // SAFETY: the same launches as the step's own chain (see push_all): arguments
            // checked against the entries, buffers owned by the step, which outlives the
            // queued work's use of them (buffers are freed stream-ordered on drop).
            unsafe {
                match foreign {
                    Some(k) => chain.push_kernel(kernel, k, *cfg, args),
                    None => chain.push_raw(kernel, *cfg, args),
                }
            }?;
        }
        chain.run()
    }

    /// Overwrites one activation buffer (stream-ordered, waits): for testing a kernel alone.
    /// Errors: [`Error::LengthMismatch`] (the buffer's size: `h`, `normed` `B x hidden`; `q`,
    /// `attn` `B x H d`; `act` `B x inter`).
    pub fn write_activation(&mut self, which: Activation, data: &[bf16]) -> Result<()> {
        let buf = match which {
            Activation::H => &mut self.h,
            Activation::Normed => &mut self.normed,
            Activation::Q => &mut self.q,
            Activation::Attn => &mut self.attn,
            Activation::Act => &mut self.act,
        };
        buf.copy_from_host(data)
    }

    /// The model shape.
    pub fn dims(&self) -> &DecodeDims {
        &self.dims
    }

    /// The configuration.
    pub fn config(&self) -> &StepConfig {
        &self.cfg
    }

    /// The attention's KV splits.
    pub fn splits(&self) -> u32 {
        self.splits
    }

    /// Every kernel of one step, in launch order.
    pub fn kernels(&self) -> &[StepKernel] {
        &self.kernels
    }

    /// Bytes one step must read at least: every layer's weights, plus the KV cache rows of
    /// every sequence at the current positions (`positions[b] + 1` tokens, K and V).
    pub fn floor_bytes(&self) -> u64 {
        let d = &self.dims;
        let inputs = self.inputs.lock().expect("decode inputs lock");
        let tokens: u64 = inputs.host_positions.iter().map(|&p| p as u64 + 1).sum();
        let kv = tokens * (2 * d.kv_heads * d.head_dim * 2) as u64;
        self.cfg.layers as u64 * (d.layer_weight_elems() as u64 * 2 + kv)
    }

    /// Sets the next run's inputs in place (stream-ordered H2D copies into the buffers the
    /// chains and graphs read): `x` (`[B][hidden]` bf16), `positions` (`[B]`), `block_table`
    /// (`[B][max_pages_per_seq]`). Waits for the copies.
    ///
    /// Errors, before anything is copied: [`Error::LengthMismatch`] (sizes), those of
    /// [`check_batch`] (entry outside the cache, length over capacity or over `max_pos`, a
    /// cache slot written by two sequences or written by one and read by another).
    pub fn set_inputs(&self, x: &[bf16], positions: &[u32], block_table: &[u32]) -> Result<()> {
        if x.len() != self.cfg.batch * self.dims.hidden || positions.len() != self.cfg.batch {
            return Err(Error::LengthMismatch {
                what: "decode step inputs",
                detail: format!(
                    "x has {} elements and positions {}; the step needs {} x {} and {}",
                    x.len(),
                    positions.len(),
                    self.cfg.batch,
                    self.dims.hidden,
                    self.cfg.batch
                ),
            });
        }
        check_batch(
            &self.dims,
            &self.cfg.layout,
            self.cfg.max_pos,
            positions,
            block_table,
        )?;
        let mut inp = self.inputs.lock().expect("decode inputs lock");
        inp.x.copy_from_host(x)?;
        inp.positions.copy_from_host(positions)?;
        inp.block_table.copy_from_host(block_table)?;
        inp.host_positions = positions.to_vec();
        inp.host_block_table = block_table.to_vec();
        Ok(())
    }

    /// Uploads layer `layer`'s K and V caches (`KvLayout::cache_elems` bf16 each). Errors:
    /// [`Error::BadShape`] (no such layer), [`Error::LengthMismatch`].
    pub fn upload_cache(&mut self, layer: usize, k: &[bf16], v: &[bf16]) -> Result<()> {
        let n = self.layers.len();
        let l = self.layers.get_mut(layer).ok_or_else(|| Error::BadShape {
            what: "decode cache layer",
            detail: format!("layer {layer}; allowed: 0 to {}", n - 1),
        })?;
        l.k_cache.copy_from_host(k)?;
        l.v_cache.copy_from_host(v)
    }

    /// Fills every layer's caches with `value` (the bench's cache contents).
    pub fn fill_caches(&mut self, value: bf16) -> Result<()> {
        for l in &mut self.layers {
            l.k_cache.fill_async(value)?;
            l.v_cache.fill_async(value)?;
        }
        self.stream.synchronize()
    }

    /// Layer `layer`'s K and V caches. Errors: [`Error::BadShape`] (no such layer).
    pub fn read_cache(&self, layer: usize) -> Result<(Vec<bf16>, Vec<bf16>)> {
        let l = self.layers.get(layer).ok_or_else(|| Error::BadShape {
            what: "decode cache layer",
            detail: format!("layer {layer}; allowed: 0 to {}", self.layers.len() - 1),
        })?;
        let mut k = vec![bf16::ZERO; l.k_cache.len()];
        let mut v = vec![bf16::ZERO; l.v_cache.len()];
        l.k_cache.copy_to_host(&mut k)?;
        l.v_cache.copy_to_host(&mut v)?;
        Ok((k, v))
    }

    /// Fills every activation buffer (h, normed, q, attn, act, split partials) with NaN, so a
    /// value a kernel fails to write shows.
    pub fn poison(&mut self) -> Result<()> {
        let nan = bf16::NAN;
        self.h.fill_async(nan)?;
        self.normed.fill_async(nan)?;
        self.q.fill_async(nan)?;
        self.attn.fill_async(nan)?;
        self.act.fill_async(nan)?;
        self.part_o.fill_async(f32::NAN)?;
        self.part_ml.fill_async(f32::NAN)?;
        self.ss.fill_async(f32::NAN)?;
        self.stream.synchronize()
    }

    /// Queues one step with `variant`'s chain (the graph variants: use [`DecodeStep::capture`]
    /// and [`Graph::launch`]). Errors: [`Error::BadShape`] for a graph variant; launch errors.
    pub fn run(&self, variant: Variant) -> Result<()> {
        if variant.graph() {
            return Err(Error::BadShape {
                what: "DecodeStep::run variant",
                detail: format!(
                    "{variant:?} is a graph variant; capture it with DecodeStep::capture"
                ),
            });
        }
        self.chains[variant.chain()].run()
    }

    /// Captures `variant`'s chain (plain for [`Variant::Graph`], PDL + prefetch for
    /// [`Variant::GraphPdlPrefetch`]; the others are captured as they are) into a CUDA graph
    /// whose replays read the step's inputs in place. Errors: those of [`Chain::capture`].
    pub fn capture(&self, variant: Variant) -> Result<Graph<'_>> {
        self.chains[variant.chain()].capture()
    }

    /// Whether the RMSNorms are fused into the GEMMs ([`StepConfig::fuse_norm`]): then
    /// [`Intermediates::normed`] holds `bf16(h * ffn_norm)` of the last layer, not yet scaled
    /// by `1 / rms(h)`.
    pub fn norm_fused(&self) -> bool {
        self.fused
    }

    /// The step's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The output `h` (`[B][hidden]` bf16) after the last run (waits for the stream).
    pub fn output(&self) -> Result<Vec<bf16>> {
        read(&self.h)
    }

    /// The intermediates of the last layer of the last run, for per-kernel checks: the second
    /// RMSNorm's output (`normed`; with the fused RMSNorm `bf16(h * ffn_norm)`, not yet scaled
    /// by `1 / rms(h)`), Q after RoPE (`q`), the attention output (`attn`) and SiLU(gate) * up
    /// (`act`), and with the fused RMSNorm the partial sums of squares the last writer left
    /// (`ss`).
    pub fn intermediates(&self) -> Result<Intermediates> {
        let ss = if self.fused {
            read(&self.ss)?
        } else {
            Vec::new()
        };
        Ok(Intermediates {
            normed: read(&self.normed)?,
            q: read(&self.q)?,
            attn: read(&self.attn)?,
            act: read(&self.act)?,
            ss,
        })
    }

    /// Resets the stamp slots (min words to `u64::MAX`, max words to 0), stream-ordered.
    pub fn reset_stamps(&mut self) -> Result<()> {
        let n = self.stamps.len() / sc::STAMP_WORDS;
        let init: Vec<u64> = (0..n).flat_map(|_| [u64::MAX, u64::MAX, 0, 0]).collect();
        self.stamps.copy_from_host(&init)
    }

    /// The stamps of the last run's kernels (with [`StepConfig::stamps`]), in launch order.
    pub fn stamps(&self) -> Result<Vec<KernelStamps>> {
        let mut raw = vec![0u64; self.stamps.len()];
        self.stamps.copy_to_host(&mut raw)?;
        let mut out = Vec::new();
        let mut last_layer = usize::MAX;
        let mut slot = 0;
        for k in &self.kernels {
            if k.layer != last_layer {
                slot = k.layer * 8;
                last_layer = k.layer;
            }
            let w = &raw[slot * sc::STAMP_WORDS..][..sc::STAMP_WORDS];
            out.push(KernelStamps {
                layer: k.layer,
                role: k.role,
                start: w[0],
                wait_first: w[1],
                wait_last: w[2],
                end: w[3],
            });
            slot += 1;
        }
        Ok(out)
    }

    /// The device.
    pub fn device(&self) -> &'d Device {
        self.dev
    }

    /// The RoPE table buffer's length (`max_pos * head_dim` f32).
    pub fn rope_len(&self) -> usize {
        self.rope.len()
    }
}

/// The activation buffers of a step ([`DecodeStep::write_activation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// The residual stream and output, `[B][hidden]`.
    H,
    /// RMSNorm output, `[B][hidden]`.
    Normed,
    /// Q after RoPE, `[B][H d]`.
    Q,
    /// Attention output, `[B][H d]`.
    Attn,
    /// SiLU(gate) * up, `[B][inter]`.
    Act,
}

/// See [`DecodeStep::intermediates`].
#[derive(Clone, Debug)]
pub struct Intermediates {
    /// `[B][hidden]`.
    pub normed: Vec<bf16>,
    /// `[B][H d]`.
    pub q: Vec<bf16>,
    /// `[B][H d]`.
    pub attn: Vec<bf16>,
    /// `[B][inter]`.
    pub act: Vec<bf16>,
    /// The fused RMSNorm's partial sums of squares, `[B][ceil(hidden / 64)]` f32: the sum of
    /// the squares of the BF16 values of each 64 columns of the row they were written for (the
    /// last writer's: o_proj's `h` in the last layer). Empty without the fused RMSNorm.
    pub ss: Vec<f32>,
}

fn read<T: bytemuck::Pod>(b: &DeviceBuffer<T>) -> Result<Vec<T>> {
    let mut v = vec![T::zeroed(); b.len()];
    b.copy_to_host(&mut v)?;
    Ok(v)
}

/// Checks that `ptx` has every entry the step launches with the parameter counts and sizes
/// the host passes (without a device). Errors: [`Error::MissingKernel`],
/// [`Error::KernelSignatureMismatch`].
pub fn check_step_entries(ptx: &str) -> Result<()> {
    use crate::module::{check_entry, RustParam, RustParamKind};
    let entries = crate::module::ptx_signatures(ptx);
    let p = |t: &str, size, kind| RustParam {
        rust_type: t.to_string(),
        size,
        kind,
    };
    use RustParamKind::{Address, Float, Int};
    let ptr = |n: &str| p(&format!("{n}: u64"), 8, Address);
    let int = |n: &str| p(&format!("{n}: u32"), 4, Int);
    let flt = |n: &str| p(&format!("{n}: f32"), 4, Float);
    let gemm: Vec<RustParam> = vec![
        ptr("a"),
        ptr("b"),
        ptr("c"),
        int("m"),
        int("n"),
        int("k"),
        int("lda"),
        int("ldb"),
        int("ldc"),
        flt("alpha"),
        flt("beta"),
        int("out_f32"),
        int("ksplit"),
        int("flags"),
        ptr("stamps"),
        ptr("epi"),
    ];
    let norm = vec![
        ptr("x"),
        ptr("w"),
        ptr("out"),
        ptr("resid"),
        int("rows"),
        int("n"),
        flt("eps"),
        ptr("stamps"),
        int("flags"),
        ptr("partials"),
    ];
    let attn = vec![
        ptr("q"),
        ptr("k_cache"),
        ptr("v_cache"),
        ptr("block_table"),
        ptr("positions"),
        ptr("out"),
        ptr("part_o"),
        ptr("part_ml"),
        int("n_kv"),
        int("page_size"),
        int("bt_stride"),
        int("num_pages"),
        int("splits_pps"),
        flt("scale_log2"),
        ptr("stamps"),
        ptr("kv_maps"),
        ptr("counters"),
        int("flags"),
    ];
    let mut want: Vec<(&str, &Vec<RustParam>)> = vec![(sc::RMSNORM_KERNEL, &norm)];
    for v in gc::EPI_VARIANTS {
        want.push((v.kernel, &gemm));
    }
    for v in sc::ATTN_VARIANTS {
        want.push((v.kernel, &attn));
        want.push((v.tc_kernel, &attn));
    }
    for (name, params) in want {
        check_entry(&entries, name, params)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue21_step_entries_in_embedded_ptx() {
        check_step_entries(crate::PTX).unwrap();
        assert!(matches!(
            check_step_entries(".version 8.0\n.target sm_90\n"),
            Err(Error::MissingKernel { .. })
        ));
    }

    #[test]
    fn issue21_gemm_roles_override_the_step_form_one_gemm_at_a_time() {
        let d = DecodeDims::llama3_8b();
        let mut cfg = StepConfig::new(&d, 16, 1, 4096);
        // Up to 32 sequences the default is u2 + A prefetch + two row tiles; above, one tile.
        assert_eq!(
            (cfg.gemm.unroll, cfg.gemm.row_tiles, cfg.gemm.prefetch_a),
            (2, 2, true)
        );
        assert_eq!(StepConfig::new(&d, 33, 1, 4096).gemm.row_tiles, 1);
        // Up to 16 sequences no GEMM has a form of its own by default.
        assert_eq!(cfg.gemm_roles, [None; 4]);
        let o = DecodeConfig {
            ksplit: Some(4),
            ..cfg.gemm
        };
        cfg.gemm_roles[1] = Some(o);
        for role in 0..4 {
            let want = if role == 1 { o } else { cfg.gemm };
            assert_eq!(cfg.gemm_for(role), want, "role {role}");
        }
        assert_eq!(cfg.gemm_for(7), cfg.gemm);
    }

    #[test]
    fn issue21_default_roles_from_17_to_32_sequences() {
        let d = DecodeDims::llama3_8b();
        for batch in [1, 8, 16, 33, 64] {
            assert_eq!(
                StepConfig::new(&d, batch, 1, 64).gemm_roles,
                [None; 4],
                "{batch}"
            );
        }
        for batch in [17, 24, 32] {
            let cfg = StepConfig::new(&d, batch, 1, 64);
            let qkv = cfg.gemm_for(0);
            assert_eq!((qkv.warps, qkv.ksplit), (4, None), "{batch}");
            assert_eq!(cfg.gemm_for(1), cfg.gemm, "{batch}");
            let gu = cfg.gemm_for(2);
            assert_eq!((gu.warps, gu.ksplit), (8, Some(2)), "{batch}");
            assert_eq!(cfg.gemm_for(3), cfg.gemm, "{batch}");
        }
    }

    #[test]
    fn issue21_set_gemm_forms_all_then_roles() {
        let d = DecodeDims::llama3_8b();
        let mut cfg = StepConfig::new(&d, 24, 1, 64);
        let o = DecodeConfig {
            ksplit: Some(4),
            ..cfg.gemm
        };
        // Roles only: the defaults of the other GEMMs stay; a GEMM given a decode form is a
        // decode GEMM.
        assert_eq!(cfg.swap_ab, [true; 4]);
        cfg.set_gemm_forms(None, [None, Some(o), None, None]);
        assert_eq!(cfg.gemm_for(0).warps, 4);
        assert_eq!(cfg.gemm_for(1), o);
        assert_eq!(cfg.gemm_for(2).ksplit, Some(2));
        assert_eq!(cfg.swap_ab, [true, false, true, true]);
        // One form for all: the default per-GEMM forms step aside, roles still apply.
        let all = DecodeConfig {
            unroll: 4,
            ..cfg.gemm
        };
        cfg.set_gemm_forms(Some(all), [None, None, None, Some(o)]);
        assert_eq!(cfg.gemm, all);
        for role in 0..3 {
            assert_eq!(cfg.gemm_for(role), all, "role {role}");
        }
        assert_eq!(cfg.gemm_for(3), o);
        assert_eq!(cfg.swap_ab, [false; 4]);
    }

    /// The fused RMSNorm is the default up to 32 sequences, gate_up's ksplit 2 up to 32 and
    /// o_proj's and down's 3 at every batch (where they measured faster), the RMSNorm kernels
    /// and the rule's ksplit for qkv and gate_up above; the fused norm's argument block packs
    /// its words where the kernel reads them.
    #[test]
    fn issue21_fused_norm_defaults_and_argument_block() {
        let d = DecodeDims::llama3_8b();
        let ks3 = [None, Some(3), Some(2), Some(3)];
        for (batch, fused, ks) in [
            (1, true, ks3),
            (8, true, ks3),
            (9, true, ks3),
            (32, true, ks3),
            (33, false, [None, Some(3), None, Some(3)]),
            (64, false, [None, Some(3), None, Some(3)]),
        ] {
            let c = StepConfig::new(&d, batch, 4, 4096);
            assert_eq!(c.fuse_norm, fused, "batch {batch}");
            assert_eq!(c.swap_ab_ksplit, ks, "batch {batch}");
        }
        // gate_up's K (the hidden size) of one k-block: no cluster of 2; o_proj's K (4 x 64)
        // and down's (512) take their clusters of 3; a query width of two k-blocks does not.
        let tiny = DecodeDims {
            hidden: 64,
            ..DecodeDims::small()
        };
        assert_eq!(
            StepConfig::default_swap_ab_ksplit(&tiny, 8),
            [None, Some(3), None, Some(3)]
        );
        let narrow = DecodeDims {
            heads: 2,
            kv_heads: 2,
            ..tiny
        };
        assert_eq!(
            StepConfig::default_swap_ab_ksplit(&narrow, 8),
            [None, None, None, Some(3)]
        );
        let a = wc::norm_args(
            Some((0x1000, 64, 4096, 1e-5)),
            Some((0x2000, 0x3000, 0x4000, 4096, 64)),
        );
        assert_eq!(a.len(), wc::NORM_ARGS_WORDS);
        assert_eq!(a[0], 0x1000);
        assert_eq!(a[1], 64);
        assert_eq!(a[2], 4096 | ((1e-5f32).to_bits() as u64) << 32);
        assert_eq!(&a[3..6], &[0x2000, 0x3000, 0x4000]);
        assert_eq!(a[6], 4096 | 64 << 32);
        assert_eq!(a[7], 0);
        assert_eq!(wc::norm_args(None, None), [0; wc::NORM_ARGS_WORDS]);
    }

    #[test]
    fn issue21_swap_ab_sets_parse() {
        assert_eq!(StepConfig::parse_swap_ab("none").unwrap(), [false; 4]);
        assert_eq!(StepConfig::parse_swap_ab("all").unwrap(), [true; 4]);
        assert_eq!(
            StepConfig::parse_swap_ab("down, o_proj").unwrap(),
            [false, true, false, true]
        );
        assert_eq!(
            StepConfig::parse_swap_ab("qkv").unwrap(),
            [true, false, false, false]
        );
        for bad in ["q", "", "o_proj,", "gate", "all,down"] {
            assert!(
                matches!(StepConfig::parse_swap_ab(bad), Err(Error::BadShape { .. })),
                "{bad:?}"
            );
        }
        let d = DecodeDims::small();
        let mut cfg = StepConfig::new(&d, 5, 1, 64);
        for list in ["none", "gate_up", "o_proj,down", "qkv,o_proj,gate_up,down"] {
            cfg.swap_ab = StepConfig::parse_swap_ab(list).unwrap();
            assert_eq!(cfg.swap_ab_label(), list);
        }
    }

    #[test]
    fn issue21_attention_splits() {
        let d = DecodeDims::llama3_8b();
        let mut cfg = StepConfig::new(&d, 1, 1, 1024);
        // The tensor-core form: two CTAs per SM, so at 8 x 8 CTAs 4 splits fill 256 of 264
        // slots in one wave of 20 page-costs (2 splits: one wave of 36).
        cfg.attention = AttnForm::TensorCores;
        cfg.batch = 8;
        assert_eq!(attention_splits(&d, &cfg, 132).unwrap(), (4, 16));
        cfg.batch = 1;
        assert_eq!(attention_splits(&d, &cfg, 132).unwrap(), (16, 4));
        cfg.attention = AttnForm::CudaCores;
        // 1 x 8 CTAs per split, one CTA per SM (d 128, 4 heads per KV head): 16 splits of 4
        // pages fill 128 of 132 slots in one wave.
        let (s, pps) = attention_splits(&d, &cfg, 132).unwrap();
        assert_eq!((s, pps), (16, 4));
        cfg.batch = 64;
        assert_eq!(attention_splits(&d, &cfg, 132).unwrap(), (1, 64));
        // 8 x 8 CTAs: 2 splits, one wave of 36 page-costs (4 splits: two waves of 20).
        cfg.batch = 8;
        assert_eq!(attention_splits(&d, &cfg, 132).unwrap(), (2, 32));
        cfg.batch = 64;
        cfg.splits = Some(3);
        let (s, pps) = attention_splits(&d, &cfg, 132).unwrap();
        assert_eq!((s, pps), (3, 22));
        cfg.splits = Some(0);
        assert!(matches!(
            attention_splits(&d, &cfg, 132),
            Err(Error::BadShape { .. })
        ));
        // Every split non-empty, covering all pages.
        for pages in 1..70u32 {
            for want in 1..80u32 {
                let c = StepConfig {
                    splits: Some(want),
                    layout: KvLayout {
                        num_pages: pages as usize,
                        max_pages_per_seq: pages as usize,
                    },
                    ..cfg
                };
                let (s, pps) = attention_splits(&d, &c, 132).unwrap();
                assert!(s * pps >= pages && (s - 1) * pps < pages, "{pages} {want}");
            }
        }
    }

    /// A CPU model of the attention kernel's algorithm (gpu/src/kernels/decode_step.rs, f32 as
    /// the kernel): token `t` of split `s` goes to state `(t - t_begin) % 16` (warp x token
    /// slot), each state keeps a base-2 online softmax from `M_INIT`, the CTA merges its 16
    /// states, and with several splits the combine step merges the normalised partials with
    /// their (m, l); empty states and empty splits included. Matches the f64 reference.
    #[test]
    fn issue21_attention_kernel_model_matches_reference() {
        use crate::decode::reference::{attention_paged, normal_bf16, RefCache};
        let d = DecodeDims::small();
        let layout = KvLayout {
            num_pages: 4,
            max_pages_per_seq: 4,
        };
        let n = layout.cache_elems(&d);
        let cache = RefCache::from_f32(&normal_bf16(1, n, 1.0), &normal_bf16(2, n, 1.0));
        let row = [2u32, 0, 3, 1];
        let hd = d.head_dim;
        let scale = (std::f64::consts::LOG2_E / (hd as f64).sqrt()) as f32;
        let states = (sc::ATTN_WARPS * sc::ATTN_TOKENS_PER_WARP) as usize;
        for len in [1usize, 15, 16, 17, 40, 64] {
            let q: Vec<f64> = normal_bf16(3, d.q_width(), 1.0)
                .iter()
                .map(|&v| v as f64)
                .collect();
            let want = attention_paged(&d, &layout, &cache, &q, &row, len);
            for want_splits in [1u32, 2, 3, 4] {
                let cfg = StepConfig {
                    splits: Some(want_splits),
                    layout,
                    ..StepConfig::new(&d, 1, 1, 64)
                };
                let (splits, pps) = attention_splits(&d, &cfg, 132).unwrap();
                let span = (pps as usize) * d.page_size;
                for h in 0..d.heads {
                    let kvh = h / d.group();
                    // Per split: (o normalised, m, l).
                    let mut parts = vec![];
                    for s in 0..splits as usize {
                        let (tb, te) = (s * span, ((s + 1) * span).min(len));
                        let mut st = vec![(sc::M_INIT, 0.0f32, vec![0.0f32; hd]); states];
                        for t in tb..te.max(tb) {
                            let (m, l, acc) = &mut st[(t - tb) % states];
                            let o = layout.offset(
                                &d,
                                row[t / d.page_size] as usize,
                                kvh,
                                t % d.page_size,
                            );
                            let sc2: f32 = (0..hd)
                                .map(|e| q[h * hd + e] as f32 * scale * cache.k[o + e] as f32)
                                .sum();
                            let mn = sc2.max(*m);
                            let corr = (*m - mn).exp2();
                            let p = (sc2 - mn).exp2();
                            *l = *l * corr + p;
                            for (a, v) in acc.iter_mut().zip(&cache.v[o..o + hd]) {
                                *a = *a * corr + p * *v as f32;
                            }
                            *m = mn;
                        }
                        let mm = st.iter().map(|x| x.0).fold(sc::M_INIT, f32::max);
                        let l: f32 = st.iter().map(|x| x.1 * (x.0 - mm).exp2()).sum();
                        let o: Vec<f32> = (0..hd)
                            .map(|e| {
                                let a: f32 = st.iter().map(|x| x.2[e] * (x.0 - mm).exp2()).sum();
                                if l > 0.0 {
                                    a / l
                                } else {
                                    0.0
                                }
                            })
                            .collect();
                        parts.push((o, mm, l));
                    }
                    let mm = parts
                        .iter()
                        .filter(|p| p.2 > 0.0)
                        .map(|p| p.1)
                        .fold(sc::M_INIT, f32::max);
                    for e in 0..hd {
                        let (mut num, mut den) = (0.0f32, 0.0f32);
                        for p in parts.iter().filter(|p| p.2 > 0.0) {
                            let w = p.2 * (p.1 - mm).exp2();
                            num += w * p.0[e];
                            den += w;
                        }
                        let got = (num / den) as f64;
                        let w = want[h * hd + e];
                        assert!(
                            (got - w).abs() <= 1e-5 * (1.0 + w.abs()),
                            "len {len} splits {splits} head {h} e {e}: {got} vs {w}"
                        );
                    }
                }
            }
        }
    }

    /// The L2 prefetch depth: whole k-blocks per warp within the budget, never the last.
    #[test]
    fn issue21_prefetch_iters() {
        let d = DecodeDims::small();
        let cfg = DecodeConfig {
            warps: 8,
            ksplit: Some(1),
            unroll: 4,
            l2_prefetch: true,
            row_tiles: 1,
            prefetch_a: false,
        };
        let sh = |n, k| GemmShape { m: 5, n, k };
        for (s, want) in [
            (sh(d.qkv_rows(), d.hidden), 1),
            (sh(d.hidden, d.intermediate), 3),
        ] {
            let ls = launch_shape(s, true, &cfg, 132).unwrap();
            assert_eq!(pf_iters(&ls, s, 1 << 20), want, "{s:?}");
            assert_eq!(pf_iters(&ls, s, 0), 0);
        }
        // Llama-8B QKV with the default k-split: 4 iterations of 12 MiB per warp.
        let l = DecodeDims::llama3_8b();
        let s = GemmShape {
            m: 8,
            n: l.qkv_rows(),
            k: l.hidden,
        };
        let ls = launch_shape(
            s,
            true,
            &DecodeConfig {
                ksplit: None,
                ..cfg
            },
            132,
        )
        .unwrap();
        assert_eq!(pf_iters(&ls, s, 4 << 20), 0);
        assert_eq!(pf_iters(&ls, s, 24 << 20), 2);
        assert_eq!(pf_iters(&ls, s, 1 << 30), 3);
    }

    #[test]
    fn issue21_variants_parse() {
        for (v, l) in Variant::ALL.iter().zip(["a", "b", "c", "d", "e"]) {
            assert_eq!(Variant::parse(l).unwrap(), *v);
            assert!(v.label().starts_with(l));
        }
        assert!(Variant::parse("f").is_err());
        assert_eq!(Variant::parse_set("all").unwrap(), Variant::ALL.to_vec());
        assert_eq!(
            Variant::parse_set("ece").unwrap(),
            vec![Variant::GraphPdlPrefetch, Variant::PdlPrefetch]
        );
        for bad in ["", "abz", "All", "a b"] {
            assert!(
                matches!(Variant::parse_set(bad), Err(Error::BadShape { .. })),
                "{bad:?}"
            );
        }
    }
}
