//! The f64 CPU reference of one decode layer and of a whole step (issue 21), in the layouts of
//! [`super`] (logical weight order; the GPU's packed orders are [`super::pack_qkv_rows`] and
//! [`super::pack_gate_up_rows`]).
//!
//! Inputs (weights, the token activations, the KV cache already written) are bf16 values held as
//! `f32`; everything is computed in f64. [`Rounding::Bf16`] rounds to bf16 exactly where the GPU
//! step stores a bf16 tensor (the normed activations, Q after RoPE, the K/V written into the
//! cache, the attention output, the residual stream after each add, SiLU(gate) * up), so a GPU
//! result can be held to a bound of a few bf16 ulps; [`Rounding::Exact`] rounds nothing.
//!
//! Sources: RMSNorm (Zhang and Sennrich, 2019), RoPE in the "rotate half" form of Hugging Face's
//! `LlamaRotaryEmbedding` / `apply_rotary_pos_emb`, GQA as `repeat_kv`, SwiGLU MLP
//! `down(silu(gate(x)) * up(x))`; the layer is `LlamaDecoderLayer`.

use super::{DecodeDims, KvLayout};

/// Where the reference rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// Nothing is rounded: the exact f64 result on the bf16 inputs.
    Exact,
    /// Round to bf16 where the GPU step stores bf16 (see the module docs).
    Bf16,
    /// As [`Rounding::Bf16`], with the RMSNorms fused into the GEMMs as the GPU step runs them
    /// by default (`StepConfig::fuse_norm`): the stored bf16 tensor is `x * gamma`, and `1 /
    /// rms(x)` multiplies the GEMM's f32 result ([`rmsnorm_rounded`]).
    Bf16FusedNorm,
}

impl Rounding {
    fn r(self, x: f64) -> f64 {
        match self {
            Rounding::Exact => x,
            Rounding::Bf16 | Rounding::Bf16FusedNorm => half::bf16::from_f64(x).to_f64(),
        }
    }
}

/// RMSNorm with `rnd`'s rounding: [`rmsnorm`] rounded by [`Rounding::Bf16`]; with
/// [`Rounding::Bf16FusedNorm`] `bf16(x * w) / rms(x)`, unrounded after the scale (the GPU scales
/// the GEMM's f32 result, which is the same product by linearity).
pub fn rmsnorm_rounded(rnd: Rounding, x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    match rnd {
        Rounding::Bf16FusedNorm => {
            let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            x.iter()
                .zip(w)
                .map(|(v, &w)| rnd.r(v * w as f64) * inv)
                .collect()
        }
        _ => rmsnorm(x, w, eps).into_iter().map(|v| rnd.r(v)).collect(),
    }
}

/// Rounds to the nearest bf16 value (as f32).
pub fn to_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// `n` values `scale * N(0, 1)` rounded to bf16, from `seed` (SplitMix64 and Box-Muller:
/// deterministic on every platform).
pub fn normal_bf16(seed: u64, n: usize, scale: f64) -> Vec<f32> {
    let mut s = seed ^ 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let u1 = ((next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        let u2 = (next() >> 11) as f64 / (1u64 << 53) as f64;
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        out.push(to_bf16((scale * r * t.cos()) as f32));
        if out.len() < n {
            out.push(to_bf16((scale * r * t.sin()) as f32));
        }
    }
    out
}

/// One layer's weights in the logical (PyTorch) layouts of [`super`], bf16 values as f32.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// `input_layernorm.weight`, `[hidden]`.
    pub attn_norm: Vec<f32>,
    /// `q_proj`, `k_proj`, `v_proj` stacked, `[(H + 2 Hkv) d][hidden]`.
    pub wqkv: Vec<f32>,
    /// `o_proj`, `[hidden][H d]`.
    pub wo: Vec<f32>,
    /// `post_attention_layernorm.weight`, `[hidden]`.
    pub ffn_norm: Vec<f32>,
    /// `gate_proj`, `[inter][hidden]`.
    pub w_gate: Vec<f32>,
    /// `up_proj`, `[inter][hidden]`.
    pub w_up: Vec<f32>,
    /// `down_proj`, `[hidden][inter]`.
    pub w_down: Vec<f32>,
}

impl LayerWeights {
    /// Random weights from `seed`: projections `N(0, 1/in)` (so activations stay of order 1),
    /// norm weights `1 + N(0, 0.1^2)`, all rounded to bf16.
    pub fn random(dims: &DecodeDims, seed: u64) -> Self {
        let (h, q, i) = (dims.hidden, dims.q_width(), dims.intermediate);
        let s = |fan_in: usize| 1.0 / (fan_in as f64).sqrt();
        let norm = |seed: u64| {
            normal_bf16(seed, h, 0.1)
                .into_iter()
                .map(|v| to_bf16(1.0 + v))
                .collect::<Vec<_>>()
        };
        Self {
            attn_norm: norm(seed.wrapping_mul(7) + 1),
            wqkv: normal_bf16(seed.wrapping_mul(7) + 2, dims.qkv_rows() * h, s(h)),
            wo: normal_bf16(seed.wrapping_mul(7) + 3, h * q, s(q)),
            ffn_norm: norm(seed.wrapping_mul(7) + 4),
            w_gate: normal_bf16(seed.wrapping_mul(7) + 5, i * h, s(h)),
            w_up: normal_bf16(seed.wrapping_mul(7) + 6, i * h, s(h)),
            w_down: normal_bf16(seed.wrapping_mul(7) + 7, h * i, s(i)),
        }
    }
}

/// One layer's paged K and V caches (layout [`KvLayout::offset`]), in f64.
#[derive(Clone, Debug)]
pub struct RefCache {
    /// K cache, `KvLayout::cache_elems` elements.
    pub k: Vec<f64>,
    /// V cache.
    pub v: Vec<f64>,
}

impl RefCache {
    /// A cache from bf16 values (as the GPU holds it).
    pub fn from_f32(k: &[f32], v: &[f32]) -> Self {
        Self {
            k: k.iter().map(|&x| x as f64).collect(),
            v: v.iter().map(|&x| x as f64).collect(),
        }
    }
}

/// `x / sqrt(mean(x^2) + eps) * w` (RMSNorm).
pub fn rmsnorm(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let inv = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, &w)| v * inv * w as f64).collect()
}

/// `y[n] = sum_k w[n][k] x[k]` for `w` of `n x k` (row-major).
pub fn matvec(w: &[f32], x: &[f64]) -> Vec<f64> {
    w.chunks_exact(x.len())
        .map(|row| row.iter().zip(x).map(|(&a, b)| a as f64 * b).sum())
        .collect()
}

/// Rotates one head (`d` values) in place at position `pos` (rotate-half RoPE).
pub fn rope(dims: &DecodeDims, head: &mut [f64], pos: usize) {
    let half = dims.head_dim / 2;
    for j in 0..half {
        let a = dims.rope_angle(pos, j);
        let (c, s) = (a.cos(), a.sin());
        let (x0, x1) = (head[j], head[j + half]);
        head[j] = x0 * c - x1 * s;
        head[j + half] = x1 * c + x0 * s;
    }
}

/// `silu(x) = x / (1 + e^-x)`.
pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// Decode attention of one sequence over the paged cache: `q` is `[H][d]` (after RoPE), the
/// sequence's keys and values are its first `len` tokens through `block_row` (its block-table
/// row); returns `[H][d]`: `softmax(q k^T / sqrt(d)) v` per query head, query head `h` on KV
/// head `h / group`.
pub fn attention_paged(
    dims: &DecodeDims,
    layout: &KvLayout,
    cache: &RefCache,
    q: &[f64],
    block_row: &[u32],
    len: usize,
) -> Vec<f64> {
    let (d, p) = (dims.head_dim, dims.page_size);
    let row = |c: &[f64], kvh: usize, t: usize| -> Vec<f64> {
        let o = layout.offset(dims, block_row[t / p] as usize, kvh, t % p);
        c[o..o + d].to_vec()
    };
    let keys: Vec<Vec<Vec<f64>>> = (0..len)
        .map(|t| (0..dims.kv_heads).map(|h| row(&cache.k, h, t)).collect())
        .collect();
    let values: Vec<Vec<Vec<f64>>> = (0..len)
        .map(|t| (0..dims.kv_heads).map(|h| row(&cache.v, h, t)).collect())
        .collect();
    attention_contiguous(dims, q, &keys, &values)
}

/// Decode attention over contiguous keys and values (`[t][kv head][d]`), one softmax per query
/// head with the maximum subtracted.
pub fn attention_contiguous(
    dims: &DecodeDims,
    q: &[f64],
    keys: &[Vec<Vec<f64>>],
    values: &[Vec<Vec<f64>>],
) -> Vec<f64> {
    let d = dims.head_dim;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; dims.heads * d];
    for h in 0..dims.heads {
        let kvh = h / dims.group();
        let qh = &q[h * d..(h + 1) * d];
        let s: Vec<f64> = keys
            .iter()
            .map(|k| k[kvh].iter().zip(qh).map(|(a, b)| a * b).sum::<f64>() * scale)
            .collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
        let l: f64 = e.iter().sum();
        for (t, w) in e.iter().enumerate() {
            for j in 0..d {
                out[h * d + j] += w / l * values[t][kvh][j];
            }
        }
    }
    out
}

/// What one layer produced for one sequence (for testing the kernels one by one).
#[derive(Clone, Debug, Default)]
pub struct LayerTrace {
    /// RMSNorm of the input, `[hidden]`.
    pub normed: Vec<f64>,
    /// Q after RoPE, `[H d]`.
    pub q: Vec<f64>,
    /// K after RoPE, `[Hkv d]` (what was written into the cache).
    pub k: Vec<f64>,
    /// V, `[Hkv d]`.
    pub v: Vec<f64>,
    /// Attention output, `[H d]`.
    pub attn: Vec<f64>,
    /// Residual after the O projection, `[hidden]`.
    pub h1: Vec<f64>,
    /// RMSNorm of `h1`.
    pub normed2: Vec<f64>,
    /// `silu(gate) * up`, `[inter]`.
    pub act: Vec<f64>,
    /// The layer's output, `[hidden]`.
    pub out: Vec<f64>,
}

/// One layer for the batch: `x` is `[B][hidden]`, updated in place to the layer's output; the
/// new K/V of every sequence are written into `cache` at `positions[b]` (page
/// `block_table[b][pos / page_size]`). Returns the per-sequence intermediates. The batch must
/// have passed [`super::check_batch`].
#[allow(clippy::too_many_arguments)]
pub fn layer(
    dims: &DecodeDims,
    layout: &KvLayout,
    w: &LayerWeights,
    cache: &mut RefCache,
    x: &mut [f64],
    positions: &[u32],
    block_table: &[u32],
    rnd: Rounding,
) -> Vec<LayerTrace> {
    let (hd, d, p) = (dims.hidden, dims.head_dim, dims.page_size);
    let r = |v: Vec<f64>| v.into_iter().map(|x| rnd.r(x)).collect::<Vec<_>>();
    let nb = positions.len();
    let mut traces = Vec::with_capacity(nb);
    // QKV, RoPE, cache writes first for all sequences (the GPU writes every sequence's K/V
    // before any attention reads).
    for b in 0..nb {
        let pos = positions[b] as usize;
        let xb = &x[b * hd..(b + 1) * hd];
        let normed = rmsnorm_rounded(rnd, xb, &w.attn_norm, dims.eps);
        let qkv = matvec(&w.wqkv, &normed);
        let mut q = qkv[..dims.q_width()].to_vec();
        let mut k = qkv[dims.q_width()..dims.q_width() + dims.kv_heads * d].to_vec();
        let v = r(qkv[dims.q_width() + dims.kv_heads * d..].to_vec());
        for h in q.chunks_exact_mut(d) {
            rope(dims, h, pos);
        }
        for h in k.chunks_exact_mut(d) {
            rope(dims, h, pos);
        }
        let (q, k) = (r(q), r(k));
        let page = block_table[b * layout.max_pages_per_seq + pos / p] as usize;
        for kvh in 0..dims.kv_heads {
            let o = layout.offset(dims, page, kvh, pos % p);
            cache.k[o..o + d].copy_from_slice(&k[kvh * d..(kvh + 1) * d]);
            cache.v[o..o + d].copy_from_slice(&v[kvh * d..(kvh + 1) * d]);
        }
        traces.push(LayerTrace {
            normed,
            q,
            k,
            v,
            ..Default::default()
        });
    }
    for (b, t) in traces.iter_mut().enumerate() {
        let pos = positions[b] as usize;
        let row = &block_table[b * layout.max_pages_per_seq..(b + 1) * layout.max_pages_per_seq];
        t.attn = r(attention_paged(dims, layout, cache, &t.q, row, pos + 1));
        let o = matvec(&w.wo, &t.attn);
        let xb = &mut x[b * hd..(b + 1) * hd];
        t.h1 = r(xb.iter().zip(&o).map(|(a, b)| a + b).collect());
        t.normed2 = rmsnorm_rounded(rnd, &t.h1, &w.ffn_norm, dims.eps);
        let g = matvec(&w.w_gate, &t.normed2);
        let u = matvec(&w.w_up, &t.normed2);
        t.act = r(g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect());
        let dn = matvec(&w.w_down, &t.act);
        t.out = r(t.h1.iter().zip(&dn).map(|(a, b)| a + b).collect());
        xb.copy_from_slice(&t.out);
    }
    traces
}

/// A whole step: every layer in turn on `x` (`[B][hidden]` bf16 values); returns the last
/// layer's output `[B][hidden]` and updates every layer's cache.
#[allow(clippy::too_many_arguments)]
pub fn step(
    dims: &DecodeDims,
    layout: &KvLayout,
    layers: &[LayerWeights],
    caches: &mut [RefCache],
    x: &[f32],
    positions: &[u32],
    block_table: &[u32],
    rnd: Rounding,
) -> Vec<f64> {
    let mut h: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for (w, c) in layers.iter().zip(caches.iter_mut()) {
        layer(dims, layout, w, c, &mut h, positions, block_table, rnd);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims() -> DecodeDims {
        DecodeDims::small()
    }

    /// The fused RMSNorm's rounding: `bf16(x * w) / rms(x)`, within one bf16 rounding of the
    /// plain RMSNorm, and not equal to it after rounding in general.
    #[test]
    fn issue21_fused_norm_rounding() {
        let x: Vec<f64> = normal_bf16(3, 256, 1.0).iter().map(|&v| v as f64).collect();
        let w = normal_bf16(4, 256, 1.0);
        let exact = rmsnorm(&x, &w, 1e-5);
        let fused = rmsnorm_rounded(Rounding::Bf16FusedNorm, &x, &w, 1e-5);
        let plain = rmsnorm_rounded(Rounding::Bf16, &x, &w, 1e-5);
        for ((e, f), p) in exact.iter().zip(&fused).zip(&plain) {
            assert!((e - f).abs() <= e.abs() / 256.0 + 1e-30, "{e} vs {f}");
            assert!((e - p).abs() <= e.abs() / 256.0 + 1e-30, "{e} vs {p}");
        }
        assert_ne!(fused, plain);
        assert_eq!(rmsnorm_rounded(Rounding::Exact, &x, &w, 1e-5), exact);
    }

    /// Attention over a paged cache whose pages are scattered equals attention over the same
    /// tokens held contiguously, and both equal an explicit `softmax(QK^T/sqrt d) V` computed
    /// head by head with repeated KV heads (naive GQA), for lengths 1, 15, 16, 17 and 40.
    #[test]
    fn issue21_reference_attention_paged_equals_contiguous_and_naive() {
        let d = dims();
        let layout = KvLayout {
            num_pages: 9,
            max_pages_per_seq: 3,
        };
        let n = layout.cache_elems(&d);
        let cache = RefCache::from_f32(&normal_bf16(1, n, 1.0), &normal_bf16(2, n, 1.0));
        let row = [7u32, 2, 5];
        for len in [1, 15, 16, 17, 40] {
            let q: Vec<f64> = normal_bf16(3 + len as u64, d.q_width(), 1.0)
                .iter()
                .map(|&v| v as f64)
                .collect();
            let paged = attention_paged(&d, &layout, &cache, &q, &row, len);
            let mut keys = vec![];
            let mut values = vec![];
            for t in 0..len {
                let page = row[t / d.page_size] as usize;
                let kk: Vec<Vec<f64>> = (0..d.kv_heads)
                    .map(|h| {
                        let o = layout.offset(&d, page, h, t % d.page_size);
                        cache.k[o..o + d.head_dim].to_vec()
                    })
                    .collect();
                let vv: Vec<Vec<f64>> = (0..d.kv_heads)
                    .map(|h| {
                        let o = layout.offset(&d, page, h, t % d.page_size);
                        cache.v[o..o + d.head_dim].to_vec()
                    })
                    .collect();
                keys.push(kk);
                values.push(vv);
            }
            let contiguous = attention_contiguous(&d, &q, &keys, &values);
            assert_eq!(paged, contiguous, "len {len}");
            // Naive: no max subtraction, weights normalised at the end, KV head repeated.
            for h in 0..d.heads {
                let kvh = h * d.kv_heads / d.heads;
                let mut num = vec![0.0f64; d.head_dim];
                let mut den = 0.0;
                for t in 0..len {
                    let s: f64 = (0..d.head_dim)
                        .map(|j| q[h * d.head_dim + j] * keys[t][kvh][j])
                        .sum::<f64>()
                        / (d.head_dim as f64).sqrt();
                    let e = s.exp();
                    den += e;
                    for j in 0..d.head_dim {
                        num[j] += e * values[t][kvh][j];
                    }
                }
                for j in 0..d.head_dim {
                    let want = num[j] / den;
                    let got = paged[h * d.head_dim + j];
                    assert!((got - want).abs() < 1e-12, "len {len} h {h} j {j}");
                }
            }
            if len == 1 {
                // One token: the output is that token's V.
                for h in 0..d.heads {
                    let kvh = h / d.group();
                    for j in 0..d.head_dim {
                        assert!((paged[h * d.head_dim + j] - values[0][kvh][j]).abs() < 1e-12);
                    }
                }
            }
        }
    }

    /// RoPE is a rotation (norm kept), the identity at position 0, and `q(m) . k(n)` depends on
    /// `m - n` only.
    #[test]
    fn issue21_reference_rope_properties() {
        let d = dims();
        let base: Vec<f64> = normal_bf16(9, d.head_dim, 1.0)
            .iter()
            .map(|&v| v as f64)
            .collect();
        let other: Vec<f64> = normal_bf16(10, d.head_dim, 1.0)
            .iter()
            .map(|&v| v as f64)
            .collect();
        let mut x = base.clone();
        rope(&d, &mut x, 0);
        assert_eq!(x, base);
        let rot = |v: &[f64], p| {
            let mut v = v.to_vec();
            rope(&d, &mut v, p);
            v
        };
        let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>();
        assert!((norm(&rot(&base, 1234)) - norm(&base)).abs() < 1e-9);
        let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
        let d1 = dot(&rot(&base, 100), &rot(&other, 90));
        let d2 = dot(&rot(&base, 1010), &rot(&other, 1000));
        assert!((d1 - d2).abs() < 1e-8, "{d1} {d2}");
        // The table matches the angle.
        let t = d.rope_table(5);
        assert_eq!(
            t[(3 * d.head_dim / 2 + 2) * 2],
            d.rope_angle(3, 2).cos() as f32
        );
    }

    /// RMSNorm of a constant vector is the weight (up to eps); layer and step run, keep values
    /// finite, write K/V at the position only, and the bf16-rounding reference stays within a
    /// few bf16 ulps of the exact one.
    #[test]
    fn issue21_reference_layer_and_step() {
        let d = dims();
        let w = vec![1.5f32; 8];
        let y = rmsnorm(&[2.0; 8], &w, 0.0);
        assert!(y.iter().all(|v| (v - 1.5).abs() < 1e-12));
        // Five sequences (lengths 1, 16, 17, 34, 48: page boundaries), pages scattered in
        // reverse order over a cache of 20.
        let layout = KvLayout {
            num_pages: 20,
            max_pages_per_seq: 4,
        };
        let n = layout.cache_elems(&d);
        let layers: Vec<LayerWeights> = (0..2).map(|l| LayerWeights::random(&d, l)).collect();
        let positions = [0u32, 15, 16, 33, 47];
        let bt: Vec<u32> = (0..20u32).rev().collect();
        super::super::check_batch(&d, &layout, 4096, &positions, &bt).unwrap();
        let x = normal_bf16(77, positions.len() * d.hidden, 1.0);
        let mk = |_| RefCache::from_f32(&normal_bf16(5, n, 1.0), &normal_bf16(6, n, 1.0));
        let mut c_exact: Vec<RefCache> = (0..2).map(mk).collect();
        let mut c_bf16: Vec<RefCache> = (0..2).map(mk).collect();
        let before = c_exact[0].k.clone();
        let exact = step(
            &d,
            &layout,
            &layers,
            &mut c_exact,
            &x,
            &positions,
            &bt,
            Rounding::Exact,
        );
        let rounded = step(
            &d,
            &layout,
            &layers,
            &mut c_bf16,
            &x,
            &positions,
            &bt,
            Rounding::Bf16,
        );
        assert!(exact.iter().all(|v| v.is_finite()));
        let rms = (exact.iter().map(|v| v * v).sum::<f64>() / exact.len() as f64).sqrt();
        assert!(rms > 0.1 && rms < 100.0, "rms {rms}");
        let max_err = exact
            .iter()
            .zip(&rounded)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(
            max_err < 0.05 * rms,
            "bf16 rounding moved the output by {max_err} (rms {rms})"
        );
        // Only the written slots changed.
        let changed: Vec<usize> = (0..before.len())
            .filter(|&i| before[i] != c_exact[0].k[i])
            .collect();
        assert_eq!(changed.len(), positions.len() * d.kv_heads * d.head_dim);
        for (b, &pos) in positions.iter().enumerate() {
            let page = bt[b * layout.max_pages_per_seq + pos as usize / d.page_size] as usize;
            let o = layout.offset(&d, page, 0, pos as usize % d.page_size);
            assert!(changed.contains(&o));
        }
    }

    #[test]
    fn issue21_normal_bf16_is_deterministic_and_scaled() {
        let a = normal_bf16(3, 10001, 2.0);
        assert_eq!(a, normal_bf16(3, 10001, 2.0));
        assert_ne!(a, normal_bf16(4, 10001, 2.0));
        let m = a.iter().map(|&v| v as f64).sum::<f64>() / a.len() as f64;
        let v = a.iter().map(|&x| (x as f64 - m).powi(2)).sum::<f64>() / a.len() as f64;
        assert!(m.abs() < 0.1 && (v.sqrt() - 2.0).abs() < 0.1, "{m} {v}");
        assert!(a.iter().all(|&x| to_bf16(x) == x));
    }
}
