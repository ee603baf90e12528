//! One LLM decode step (issue 21): Llama-shaped layers (RMSNorm, QKV projection with RoPE, a
//! paged KV cache, GQA decode attention, O projection + residual, RMSNorm, gate/up with
//! SiLU(gate) * up, down projection + residual), bf16 weights and activations, f32 accumulation
//! on the GPU.
//!
//! - [`DecodeDims`]: the model shape (all configurable; [`DecodeDims::llama3_8b`] and
//!   [`DecodeDims::small`] for tests), checked by [`DecodeDims::validate`].
//! - [`KvLayout`] and [`check_batch`]: the paged KV cache (pages of `page_size` tokens, one block
//!   table row per sequence, ragged lengths), validated on the host before anything is launched.
//! - [`reference`](mod@reference): the f64 CPU reference of a layer and a step.
//! - [`bench`](mod@bench): the variant table, the timeline and the .npy export for the PyTorch check.
//! - [`step`]: the GPU step ([`step::DecodeStep`]) from warpline's kernels, chained with PDL, with
//!   weight loads before `griddepcontrol.wait`, and as one CUDA graph.
//!
//! # Layouts (shared by the reference, the kernels and the PyTorch script)
//!
//! - Activations: row-major `[B][hidden]`, one row per sequence (one new token each).
//! - Weights (PyTorch `Linear` layout, `out x in`, K contiguous): `wqkv` is `[(H + 2 Hkv) d][hidden]`
//!   (the rows of `q_proj`, then `k_proj`, then `v_proj`), `wo` `[hidden][H d]`, `w_gate` and
//!   `w_up` `[inter][hidden]`, `w_down` `[hidden][inter]`; RMSNorm weights `[hidden]`.
//! - KV cache, per layer, K and V each: `[num_pages][Hkv][page_size][d]` (a page of one KV head
//!   is `page_size * d` contiguous elements). Token `t` of sequence `b` lives in page
//!   `block_table[b][t / page_size]`, row `t % page_size`.
//! - `positions[b]`: the position of the new token = the tokens already cached for sequence `b`;
//!   the step writes its K/V at that position and attends over `positions[b] + 1` tokens.
//! - RoPE: the Llama / Hugging Face "rotate half" form: dims `j` and `j + d/2` of a head are
//!   rotated by `pos * theta^(-2j/d)`.
//! - Query head `h` reads KV head `h / (H / Hkv)` (`repeat_kv`).

pub mod bench;
pub mod reference;
pub mod step;

use crate::error::{Error, Result};

/// The shape of one decode layer (and of its KV cache pages).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeDims {
    /// Model width (`hidden_size`).
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// KV heads (GQA: `heads` is a multiple of it).
    pub kv_heads: usize,
    /// Head dimension `d`.
    pub head_dim: usize,
    /// MLP width (`intermediate_size`).
    pub intermediate: usize,
    /// Tokens per KV cache page.
    pub page_size: usize,
    /// RoPE base (`rope_theta`).
    pub rope_theta: f64,
    /// RMSNorm epsilon.
    pub eps: f64,
}

impl DecodeDims {
    /// Llama-3.1-8B: hidden 4096, 32 query heads, 8 KV heads, head dim 128, intermediate 14336,
    /// RMSNorm eps 1e-5, RoPE theta 500000, pages of 16 tokens.
    pub fn llama3_8b() -> Self {
        Self {
            hidden: 4096,
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            intermediate: 14336,
            page_size: 16,
            rope_theta: 500000.0,
            eps: 1e-5,
        }
    }

    /// The tests' shape: hidden 256, 4 heads, 2 KV heads, head dim 64, intermediate 512, pages
    /// of 16.
    pub fn small() -> Self {
        Self {
            hidden: 256,
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
            intermediate: 512,
            page_size: 16,
            rope_theta: 500000.0,
            eps: 1e-5,
        }
    }

    /// Query heads per KV head.
    pub fn group(&self) -> usize {
        self.heads / self.kv_heads.max(1)
    }

    /// Rows of the fused QKV weight: `(heads + 2 kv_heads) * head_dim`.
    pub fn qkv_rows(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * self.head_dim
    }

    /// Width of the attention output: `heads * head_dim`.
    pub fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Weight elements of one layer (the four projections and the two norms).
    pub fn layer_weight_elems(&self) -> usize {
        self.qkv_rows() * self.hidden
            + self.hidden * self.q_width()
            + 3 * self.intermediate * self.hidden
            + 2 * self.hidden
    }

    /// Checks what the reference and the kernels need. Errors: [`Error::BadShape`] naming the
    /// rule: every dimension >= 1; `heads` a multiple of `kv_heads`; `head_dim` 64 or 128 (the
    /// attention kernel's entries; also a multiple of 16, so a RoPE pair stays in one row tile of
    /// the QKV GEMM); `heads / kv_heads` 1, 2, 4 or 8 with `group * head_dim <= 512`; `hidden`
    /// and `intermediate` multiples of 8 (16-byte rows) and `hidden <= 8192` (the RMSNorm CTA);
    /// `intermediate` a multiple of 8 (gate/up interleave by 8 rows); `page_size` 1 to 256;
    /// `rope_theta > 1`, `eps > 0`, both finite.
    pub fn validate(&self) -> Result<()> {
        let bad = |detail: String| {
            Err(Error::BadShape {
                what: "decode dims",
                detail,
            })
        };
        if self.hidden == 0
            || self.heads == 0
            || self.kv_heads == 0
            || self.head_dim == 0
            || self.intermediate == 0
            || self.page_size == 0
        {
            return bad(format!("{self:?}: every dimension must be at least 1"));
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads over {} KV heads; allowed: a multiple",
                self.heads, self.kv_heads
            ));
        }
        if self.head_dim != 64 && self.head_dim != 128 {
            return bad(format!("head dim {}; allowed: 64 or 128", self.head_dim));
        }
        let g = self.group();
        if ![1, 2, 4, 8].contains(&g) || g * self.head_dim > 512 {
            return bad(format!(
                "{g} query heads per KV head at head dim {}; allowed: 1, 2, 4 or 8 with group * head dim <= 512",
                self.head_dim
            ));
        }
        if !self.hidden.is_multiple_of(8) || self.hidden > 8192 {
            return bad(format!(
                "hidden {}; allowed: a multiple of 8, at most 8192",
                self.hidden
            ));
        }
        if !self.intermediate.is_multiple_of(8) {
            return bad(format!(
                "intermediate {}; allowed: a multiple of 8",
                self.intermediate
            ));
        }
        if self.page_size > 256 {
            return bad(format!("page size {}; allowed: 1 to 256", self.page_size));
        }
        let finite = self.rope_theta.is_finite() && self.eps.is_finite();
        if !(finite && self.rope_theta > 1.0 && self.eps > 0.0) {
            return bad(format!(
                "rope theta {} and eps {}; allowed: theta > 1, eps > 0, finite",
                self.rope_theta, self.eps
            ));
        }
        Ok(())
    }

    /// RoPE angle of dimension pair `j` (`0 <= j < d/2`) at position `pos`, in f64:
    /// `pos * theta^(-2j/d)`.
    pub fn rope_angle(&self, pos: usize, j: usize) -> f64 {
        pos as f64 * self.rope_theta.powf(-2.0 * j as f64 / self.head_dim as f64)
    }

    /// The cos/sin table the QKV epilogue reads: `[max_pos][d/2][2]` f32 (`cos`, `sin` of
    /// [`DecodeDims::rope_angle`], computed in f64 and rounded once), as serving engines keep it.
    pub fn rope_table(&self, max_pos: usize) -> Vec<f32> {
        let half = self.head_dim / 2;
        let mut t = Vec::with_capacity(max_pos * half * 2);
        for pos in 0..max_pos {
            for j in 0..half {
                let a = self.rope_angle(pos, j);
                t.push(a.cos() as f32);
                t.push(a.sin() as f32);
            }
        }
        t
    }
}

/// The paged KV cache of one layer and the batch's block tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    /// Pages in the cache (per layer, for K and for V each).
    pub num_pages: usize,
    /// Columns of the block table: the most pages one sequence can hold. A sequence's capacity
    /// is `max_pages_per_seq * page_size` tokens.
    pub max_pages_per_seq: usize,
}

impl KvLayout {
    /// Elements of one layer's K (or V) cache: `num_pages * kv_heads * page_size * head_dim`.
    pub fn cache_elems(&self, dims: &DecodeDims) -> usize {
        self.num_pages * dims.kv_heads * dims.page_size * dims.head_dim
    }

    /// Element offset of token row `row` (`< page_size`) of KV head `kvh` in page `page`.
    pub fn offset(&self, dims: &DecodeDims, page: usize, kvh: usize, row: usize) -> usize {
        ((page * dims.kv_heads + kvh) * dims.page_size + row) * dims.head_dim
    }
}

/// Validates one step's batch before anything is launched: `positions` has one entry per
/// sequence (`B = positions.len() >= 1`), `block_table` is `B x max_pages_per_seq`, every
/// sequence's new length `positions[b] + 1` fits its capacity (`max_pages_per_seq * page_size`)
/// and `max_pos` (the RoPE table), every block-table entry the sequence uses (`t / page_size`
/// for `t <= positions[b]`) is a page of the cache (`< num_pages`), and no sequence writes a
/// cache slot that another sequence of the batch reads or writes (the kernels would race).
///
/// Errors: [`Error::LengthMismatch`] (table size), [`Error::TooLarge`] (length over capacity or
/// over `max_pos`), [`Error::BlockTable`] (entry outside the cache, or a shared written slot).
pub fn check_batch(
    dims: &DecodeDims,
    layout: &KvLayout,
    max_pos: usize,
    positions: &[u32],
    block_table: &[u32],
) -> Result<()> {
    let b = positions.len();
    if b == 0 {
        return Err(Error::Empty {
            what: "decode batch (positions)",
        });
    }
    if block_table.len() != b * layout.max_pages_per_seq {
        return Err(Error::LengthMismatch {
            what: "decode block table",
            detail: format!(
                "{} entries for {b} sequences x {} pages; allowed: exactly {}",
                block_table.len(),
                layout.max_pages_per_seq,
                b * layout.max_pages_per_seq
            ),
        });
    }
    let cap = layout.max_pages_per_seq * dims.page_size;
    for (s, &pos) in positions.iter().enumerate() {
        let len = pos as u64 + 1;
        if len > cap as u64 {
            return Err(Error::TooLarge {
                what: "decode sequence length (position + 1) over the block table's capacity",
                value: len,
                max: cap as u64,
            });
        }
        if len > max_pos as u64 {
            return Err(Error::TooLarge {
                what: "decode sequence length (position + 1) over the RoPE table",
                value: len,
                max: max_pos as u64,
            });
        }
        let pages = (len as usize).div_ceil(dims.page_size);
        for (i, &p) in block_table[s * layout.max_pages_per_seq..][..pages]
            .iter()
            .enumerate()
        {
            if p as usize >= layout.num_pages {
                return Err(Error::BlockTable {
                    seq: s,
                    detail: format!(
                        "entry {i} is page {p}; the cache has pages 0 to {}",
                        layout.num_pages - 1
                    ),
                });
            }
        }
    }
    // Written slots (page, row) must not be read or written by another sequence.
    let mut written = std::collections::HashMap::new();
    for (s, &pos) in positions.iter().enumerate() {
        let pos = pos as usize;
        let page = block_table[s * layout.max_pages_per_seq + pos / dims.page_size];
        if let Some(o) = written.insert((page, pos % dims.page_size), s) {
            return Err(Error::BlockTable {
                seq: s,
                detail: format!(
                    "writes row {} of page {page}, which sequence {o} writes too",
                    pos % dims.page_size
                ),
            });
        }
    }
    let written_pages: std::collections::HashSet<u32> = written.keys().map(|k| k.0).collect();
    for (s, &pos) in positions.iter().enumerate() {
        let len = pos as usize + 1;
        for i in 0..len.div_ceil(dims.page_size) {
            let page = block_table[s * layout.max_pages_per_seq + i];
            if !written_pages.contains(&page) {
                continue;
            }
            let rows = (len - i * dims.page_size).min(dims.page_size);
            for row in 0..rows {
                if let Some(&o) = written.get(&(page, row)) {
                    if o != s {
                        return Err(Error::BlockTable {
                            seq: s,
                            detail: format!(
                                "reads row {row} of page {page}, which sequence {o} writes in this step"
                            ),
                        });
                    }
                }
            }
        }
    }
    Ok(())
}

/// `Error::LengthMismatch` unless `w` holds `rows x cols` elements.
fn check_weight_len<T>(what: &'static str, w: &[T], rows: usize, cols: usize) -> Result<()> {
    if rows.checked_mul(cols) != Some(w.len()) {
        return Err(Error::LengthMismatch {
            what,
            detail: format!(
                "{} elements; allowed: exactly {rows} x {cols} (the layer's dims)",
                w.len()
            ),
        });
    }
    Ok(())
}

/// The QKV packers' checks: `dims` valid, `(H + 2 Hkv) d` without overflow, `wqkv` that many
/// rows of `hidden`. Returns `(d, hidden, rows)`.
fn qkv_checked<T>(dims: &DecodeDims, wqkv: &[T]) -> Result<(usize, usize, usize)> {
    dims.validate()?;
    let rows = dims
        .kv_heads
        .checked_mul(2)
        .and_then(|r| r.checked_add(dims.heads))
        .and_then(|r| r.checked_mul(dims.head_dim))
        .ok_or_else(|| Error::BadShape {
            what: "decode dims",
            detail: format!("{dims:?}: (heads + 2 kv_heads) head_dim overflows usize"),
        })?;
    check_weight_len("wqkv", wqkv, rows, dims.hidden)?;
    Ok((dims.head_dim, dims.hidden, rows))
}

/// The gate/up packers' checks: `dims` valid, both weights `inter x hidden`, twice that
/// within `usize`. Returns `(inter, hidden, an empty output with room for both)`.
fn gate_up_checked<T>(
    dims: &DecodeDims,
    w_gate: &[T],
    w_up: &[T],
) -> Result<(usize, usize, Vec<T>)> {
    let (n, k) = (dims.intermediate, dims.hidden);
    dims.validate()?;
    check_weight_len("w_gate", w_gate, n, k)?;
    check_weight_len("w_up", w_up, n, k)?;
    let cap = w_gate.len().checked_mul(2).ok_or(Error::TooLarge {
        what: "packed gate/up weight elements",
        value: u64::MAX,
        max: usize::MAX as u64,
    })?;
    Ok((n, k, Vec::with_capacity(cap)))
}

/// Reorders the rows of a logical `wqkv` (`[(H + 2 Hkv) d][hidden]`) into the order the QKV
/// GEMM's epilogue reads: within each head, row tile `p` (16 rows) holds logical dims
/// `8p .. 8p + 8` in its first 8 rows and `d/2 + 8p .. d/2 + 8p + 8` in its last 8, so the two
/// halves of every RoPE pair land in one lane (accumulators `g` and `g + 8` of
/// `mma.m16n8k16`). [`qkv_logical_dim`] is the inverse map of a packed row.
///
/// Errors: [`Error::BadShape`] for dims that [`DecodeDims::validate`] refuses (or whose
/// `(H + 2 Hkv) d` overflows); [`Error::LengthMismatch`] unless `wqkv` holds
/// `(H + 2 Hkv) d x hidden` elements.
pub fn pack_qkv_rows<T: Copy>(dims: &DecodeDims, wqkv: &[T]) -> Result<Vec<T>> {
    let (d, k, rows) = qkv_checked(dims, wqkv)?;
    let mut out = Vec::with_capacity(wqkv.len());
    for packed in 0..rows {
        let head = packed / d;
        let logical = head * d + qkv_logical_dim(d, packed % d);
        out.extend_from_slice(&wqkv[logical * k..][..k]);
    }
    Ok(out)
}

/// The logical dim (within a head of `d`) of packed row `r` (within the head) of
/// [`pack_qkv_rows`]: `8 (r / 16) + r % 8`, plus `d/2` for the last 8 rows of a tile.
pub fn qkv_logical_dim(d: usize, r: usize) -> usize {
    let (p, w) = (r / 16, r % 16);
    8 * p + (w % 8) + (w / 8) * (d / 2)
}

/// Interleaves `w_gate` and `w_up` (`[inter][hidden]` each) into one `[2 inter][hidden]` weight:
/// row tile `p` (16 rows) holds gate rows `8p .. 8p + 8` then up rows `8p .. 8p + 8`, so the
/// gate/up GEMM's lane holds `gate[j]` and `up[j]` of the same `j` and writes `silu(gate) * up`.
///
/// Errors: [`Error::BadShape`] for dims that [`DecodeDims::validate`] refuses;
/// [`Error::LengthMismatch`] unless both hold `inter x hidden` elements; [`Error::TooLarge`]
/// if the packed length passes `usize` (zero-sized `T` only).
pub fn pack_gate_up_rows<T: Copy>(dims: &DecodeDims, w_gate: &[T], w_up: &[T]) -> Result<Vec<T>> {
    let (n, k, mut out) = gate_up_checked(dims, w_gate, w_up)?;
    for p in 0..n / 8 {
        for r in 0..8 {
            out.extend_from_slice(&w_gate[(8 * p + r) * k..][..k]);
        }
        for r in 0..8 {
            out.extend_from_slice(&w_up[(8 * p + r) * k..][..k]);
        }
    }
    Ok(out)
}

/// Reorders the rows of a logical `wqkv` (`[(H + 2 Hkv) d][hidden]`) into the order the swap-AB
/// GEMM's QKV epilogue reads (`contract::swap_ab_gemm::EPI_QKV`): within each head, packed rows
/// `2 i` and `2 i + 1` are dims `i` and `i + d/2`, so each 4-row group of the epilogue holds two
/// whole RoPE pairs.
///
/// Errors: [`Error::BadShape`] for dims that [`DecodeDims::validate`] refuses (or whose
/// `(H + 2 Hkv) d` overflows); [`Error::LengthMismatch`] unless `wqkv` holds
/// `(H + 2 Hkv) d x hidden` elements.
pub fn pack_qkv_pairs<T: Copy>(dims: &DecodeDims, wqkv: &[T]) -> Result<Vec<T>> {
    let (d, k, rows) = qkv_checked(dims, wqkv)?;
    let mut out = Vec::with_capacity(wqkv.len());
    for packed in 0..rows {
        let (head, r) = (packed / d, packed % d);
        let logical = head * d + r / 2 + (r % 2) * (d / 2);
        out.extend_from_slice(&wqkv[logical * k..][..k]);
    }
    Ok(out)
}

/// Gate and up weights (`[inter][hidden]` each) as the swap-AB GEMM's SwiGLU epilogue pairs
/// them: row `2 j` is gate row `j`, row `2 j + 1` up row `j` (`[2 inter][hidden]`;
/// `contract::swap_ab_gemm::EPI_SWIGLU`).
///
/// Errors: [`Error::BadShape`] for dims that [`DecodeDims::validate`] refuses;
/// [`Error::LengthMismatch`] unless both hold `inter x hidden` elements; [`Error::TooLarge`]
/// if the packed length passes `usize` (zero-sized `T` only).
pub fn pack_gate_up_pairs<T: Copy>(dims: &DecodeDims, w_gate: &[T], w_up: &[T]) -> Result<Vec<T>> {
    let (n, k, mut out) = gate_up_checked(dims, w_gate, w_up)?;
    for j in 0..n {
        out.extend_from_slice(&w_gate[j * k..][..k]);
        out.extend_from_slice(&w_up[j * k..][..k]);
    }
    Ok(out)
}

/// An `n x k` row-major weight matrix in the swap-AB GEMM's tiled layout
/// (`contract::swap_ab_gemm::FLAG_W_TILED`): tile `(t, kb)` (rows `64 t ..`, columns `64 kb ..`)
/// is 64 rows of 64 consecutive elements at element `(t * ceil(k / 64) + kb) * 4096`, zeros past
/// `n` and `k` (`tiled_weight_elems(n, k)` elements).
///
/// Errors: [`Error::LengthMismatch`] unless `w` holds exactly `n * k` elements;
/// [`Error::TooLarge`] when the tiled size does not fit in `usize`.
pub fn tile_weights<T: Copy + Default>(w: &[T], n: usize, k: usize) -> Result<Vec<T>> {
    use warpline_gpu::contract::swap_ab_gemm::{BK, W_ROWS};
    if n.checked_mul(k) != Some(w.len()) {
        return Err(Error::LengthMismatch {
            what: "weights to tile",
            detail: format!("{} elements for {n} x {k}; allowed: exactly n x k", w.len()),
        });
    }
    let kb = k.div_ceil(BK);
    let len = n
        .div_ceil(W_ROWS)
        .checked_mul(kb)
        .and_then(|t| t.checked_mul(W_ROWS * BK))
        .ok_or_else(|| Error::TooLarge {
            what: "tiled weight elements (ceil(n / 64) x ceil(k / 64) x 4096)",
            value: (n.div_ceil(W_ROWS) as u128 * kb as u128 * (W_ROWS * BK) as u128)
                .min(u64::MAX as u128) as u64,
            max: usize::MAX as u64,
        })?;
    let mut out = vec![T::default(); len];
    for (r, row) in w.chunks_exact(k.max(1)).enumerate() {
        let (t, rr) = (r / W_ROWS, r % W_ROWS);
        for (b, piece) in row.chunks(BK).enumerate() {
            let at = ((t * kb + b) * W_ROWS + rr) * BK;
            out[at..at + piece.len()].copy_from_slice(piece);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue21_tiled_weights_put_each_element_in_its_tile() {
        use warpline_gpu::contract::swap_ab_gemm::tiled_weight_elems;
        // Sizes that are multiples of no tile: 70 rows (two tiles, the second ragged), 130
        // columns (three k-blocks, the last of 2).
        let (n, k) = (70, 130);
        let w: Vec<u32> = (0..n * k).map(|i| i as u32 + 1).collect();
        let t = tile_weights(&w, n, k).unwrap();
        assert_eq!(t.len(), tiled_weight_elems(n, k));
        assert_eq!(t.len(), 2 * 3 * 64 * 64);
        let mut seen = 0;
        for tile in 0..2 {
            for kb in 0..3 {
                for r in 0..64 {
                    for c in 0..64 {
                        let got = t[((tile * 3 + kb) * 64 + r) * 64 + c];
                        let (row, col) = (64 * tile + r, 64 * kb + c);
                        if row < n && col < k {
                            assert_eq!(got, w[row * k + col], "({row}, {col})");
                            seen += 1;
                        } else {
                            assert_eq!(got, 0, "padding at ({row}, {col})");
                        }
                    }
                }
            }
        }
        assert_eq!(seen, n * k);
        // A size that is not n x k, and a product that passes usize: typed errors.
        assert!(matches!(
            tile_weights(&w[1..], n, k),
            Err(Error::LengthMismatch { .. })
        ));
        assert!(matches!(
            tile_weights(&w, usize::MAX, 2),
            Err(Error::LengthMismatch { .. })
        ));
    }

    #[test]
    fn issue21_weight_packing_refuses_wrong_sizes_and_dims_with_typed_errors() {
        let d = DecodeDims::small();
        let (n, k) = (d.intermediate, d.hidden);
        let qkv = vec![0u16; d.qkv_rows() * k];
        let g = vec![0u16; n * k];
        for short in [&qkv[1..], &qkv[..0]] {
            assert!(matches!(
                pack_qkv_rows(&d, short),
                Err(Error::LengthMismatch { .. })
            ));
            assert!(matches!(
                pack_qkv_pairs(&d, short),
                Err(Error::LengthMismatch { .. })
            ));
        }
        assert!(matches!(
            pack_gate_up_rows(&d, &g[1..], &g),
            Err(Error::LengthMismatch { .. })
        ));
        assert!(matches!(
            pack_gate_up_pairs(&d, &g, &g[..n * k - k]),
            Err(Error::LengthMismatch { .. })
        ));
        // Dims the kernels cannot run, or whose row count overflows: refused, not packed.
        let mut bad = d;
        bad.head_dim = 20;
        assert!(matches!(
            pack_qkv_rows(&bad, &qkv),
            Err(Error::BadShape { .. })
        ));
        let mut huge = d;
        huge.kv_heads = usize::MAX / 2;
        huge.heads = huge.kv_heads;
        assert!(matches!(
            pack_qkv_pairs(&huge, &qkv),
            Err(Error::BadShape { .. })
        ));
        let mut odd = d;
        odd.intermediate = 12;
        assert!(matches!(
            pack_gate_up_rows(&odd, &g[..12 * k], &g[..12 * k]),
            Err(Error::BadShape { .. })
        ));
        assert!(matches!(
            pack_gate_up_pairs(&odd, &g[..12 * k], &g[..12 * k]),
            Err(Error::BadShape { .. })
        ));
        // The right sizes pack.
        assert_eq!(pack_qkv_pairs(&d, &qkv).unwrap().len(), qkv.len());
        assert_eq!(pack_gate_up_pairs(&d, &g, &g).unwrap().len(), 2 * n * k);
    }

    #[test]
    fn issue21_qkv_pairs_packing_is_a_permutation_of_rope_pairs() {
        let d = DecodeDims::small();
        let k = d.hidden;
        // Row r of the logical weight holds r in every element.
        let w: Vec<u32> = (0..d.qkv_rows() * k).map(|i| (i / k) as u32).collect();
        let p = pack_qkv_pairs(&d, &w).unwrap();
        let hd = d.head_dim;
        let mut seen = vec![false; d.qkv_rows()];
        for packed in 0..d.qkv_rows() {
            let logical = p[packed * k] as usize;
            assert!(p[packed * k..][..k].iter().all(|&v| v as usize == logical));
            assert!(!std::mem::replace(&mut seen[logical], true));
            let (head, r) = (packed / hd, packed % hd);
            assert_eq!(logical / hd, head);
            // Rows 2i, 2i + 1 of a head: dims i and i + d/2 (one RoPE pair).
            assert_eq!(logical % hd, r / 2 + (r % 2) * hd / 2);
        }
    }

    fn layout() -> KvLayout {
        KvLayout {
            num_pages: 10,
            max_pages_per_seq: 3,
        }
    }

    #[test]
    fn issue21_dims_validate() {
        DecodeDims::llama3_8b().validate().unwrap();
        DecodeDims::small().validate().unwrap();
        let s = DecodeDims::small();
        for bad in [
            DecodeDims { heads: 3, ..s },
            DecodeDims { head_dim: 96, ..s },
            DecodeDims { hidden: 250, ..s },
            DecodeDims {
                intermediate: 0,
                ..s
            },
            DecodeDims {
                heads: 16,
                kv_heads: 1,
                ..s
            },
            DecodeDims { eps: 0.0, ..s },
        ] {
            assert!(
                matches!(bad.validate(), Err(Error::BadShape { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn issue21_check_batch_refuses_bad_tables() {
        let d = DecodeDims::small();
        let l = layout();
        // Two sequences: lengths 1 and 33 (pages 0 / 1, 2, 3).
        let pos = [0u32, 32];
        let bt = [0u32, 99, 99, 1, 2, 3];
        check_batch(&d, &l, 4096, &pos, &bt).unwrap();
        // Entry outside the cache (a used one).
        let bt_bad = [0u32, 99, 99, 1, 10, 3];
        assert!(matches!(
            check_batch(&d, &l, 4096, &pos, &bt_bad),
            Err(Error::BlockTable { seq: 1, .. })
        ));
        // Length over capacity (48 tokens).
        assert!(matches!(
            check_batch(&d, &l, 4096, &[0, 48], &bt),
            Err(Error::TooLarge { .. })
        ));
        // Over the RoPE table.
        assert!(matches!(
            check_batch(&d, &l, 20, &pos, &bt),
            Err(Error::TooLarge { .. })
        ));
        // Table size.
        assert!(matches!(
            check_batch(&d, &l, 4096, &pos, &bt[..5]),
            Err(Error::LengthMismatch { .. })
        ));
        // Sequence 1 reads row 0 of page 0, which sequence 0 writes.
        let shared = [0u32, 99, 99, 0, 2, 3];
        assert!(matches!(
            check_batch(&d, &l, 4096, &pos, &shared),
            Err(Error::BlockTable { .. })
        ));
        // A shared prefix page that nobody writes is fine.
        let prefix = [4u32, 5, 99, 4, 2, 3];
        check_batch(&d, &l, 4096, &[16, 32], &prefix).unwrap();
        assert!(matches!(
            check_batch(&d, &l, 4096, &[], &[]),
            Err(Error::Empty { .. })
        ));
    }

    #[test]
    fn issue21_qkv_packing_puts_rope_pairs_in_one_lane() {
        let d = DecodeDims::small();
        let rows: Vec<usize> = (0..d.qkv_rows()).collect();
        let w: Vec<usize> = rows.iter().flat_map(|&r| vec![r; d.hidden]).collect();
        let packed = pack_qkv_rows(&d, &w).unwrap();
        let hd = d.head_dim;
        for r in 0..d.qkv_rows() {
            let logical = packed[r * d.hidden];
            assert_eq!(logical / hd, r / hd, "same head");
            assert_eq!(logical % hd, qkv_logical_dim(hd, r % hd));
            // Rows g and g + 8 of a tile: dims j and j + d/2.
            if r % 16 < 8 {
                assert_eq!(packed[(r + 8) * d.hidden], logical + hd / 2);
            }
        }
        // A permutation.
        let mut seen: Vec<usize> = (0..d.qkv_rows()).map(|r| packed[r * d.hidden]).collect();
        seen.sort();
        assert_eq!(seen, rows);
        let gu = pack_gate_up_rows(
            &d,
            &w[..d.intermediate * d.hidden],
            &w[..d.intermediate * d.hidden],
        )
        .unwrap();
        assert_eq!(gu.len(), 2 * d.intermediate * d.hidden);
        assert_eq!(gu[8 * d.hidden], 0);
        assert_eq!(gu[16 * d.hidden], 8);
    }
}
