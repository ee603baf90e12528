//! The swap-AB configuration's launch data (issue 20), below `tc_gemm.rs` and `swap_ab.rs`:
//! its options ([`SwapAbConfig`], [`Epilogue`]), the rule that sizes a launch
//! ([`swap_ab_shape`], pure: unit-tested without a device) and one validated launch
//! ([`SwapAbLaunch`]). It imports nothing of `tc_gemm`, so the module file can hold these types
//! while `swap_ab.rs`, which plans launches for [`TcGemm`](super::TcGemm), imports both.

use warpline_gpu::contract::swap_ab_gemm as contract;

use crate::device::{Device, Kernel};
use crate::error::{Error, Result};
use crate::kernels::operands::GemmShape;
use crate::launch::{launch_raw, LaunchConfig, ParamValue};
use crate::memory::DeviceView;
use crate::module::{RustParam, RustParamKind};
use crate::stream::Stream;
pub use contract::{KERNELS as SWAP_AB_ENTRIES, KSPLITS, TOKEN_TILES};

/// Tunables of the swap-AB configuration; `None` picks by [`swap_ab_shape`]'s rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SwapAbConfig {
    /// Tokens per CTA, one of [`TOKEN_TILES`] (8, 16, 32, 64, 128).
    pub tokens: Option<u32>,
    /// CTAs per cluster splitting K, one of [`KSPLITS`] (1, 2, 3, 4, 8), at most `ceil(K / 64)`.
    pub ksplit: Option<u32>,
    /// Load the first stages' weight tiles (B) before `griddepcontrol.wait`, so that with PDL
    /// they stream in under the previous kernel's tail (../shared/docs/pdl-prefetch.md). Only
    /// [`WeightsBeforeWait::promise`] (unsafe) makes one.
    pub weights_before_wait: Option<WeightsBeforeWait>,
}

/// The caller's promise behind [`SwapAbConfig::weights_before_wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WeightsBeforeWait(());

impl WeightsBeforeWait {
    /// The promise.
    ///
    /// # Safety
    /// No kernel that may still be running when a launch of the plan starts (the preceding
    /// kernel on the stream, when the plan launches with PDL) writes B: the early weight reads
    /// are not ordered after it.
    pub unsafe fn promise() -> Self {
        Self(())
    }
}

/// The activation of a fused epilogue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// None: `alpha * acc (+ bias) + beta * C`.
    #[default]
    None,
    /// `silu(x) = x / (1 + e^-x)`.
    Silu,
    /// GELU, tanh form: `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
    Gelu,
    /// SwiGLU of column pairs: B's rows `2j` (gate) and `2j + 1` (up) give C's column `j`,
    /// `silu(gate) * up`; N must be even and C has `N / 2` columns.
    SwiGlu,
}

impl std::fmt::Debug for Epilogue<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Epilogue")
            .field("activation", &self.activation)
            .field("bias", &self.bias.map(|b| b.len()))
            .finish()
    }
}

impl Activation {
    pub(super) fn code(self) -> u32 {
        match self {
            Self::None => contract::EPI_NONE,
            Self::Silu => contract::EPI_SILU,
            Self::Gelu => contract::EPI_GELU,
            Self::SwiGlu => contract::EPI_SWIGLU,
        }
    }
}

/// A fused epilogue: `activation(alpha * acc + bias) + beta * C`.
#[derive(Clone, Copy, Default)]
pub struct Epilogue<'a> {
    /// The activation.
    pub activation: Activation,
    /// `N` f32, one per column of `A * B` (before SwiGLU pairs them); bound to the plan's stream.
    pub bias: Option<DeviceView<'a, f32>>,
}

/// How one swap-AB launch covers its problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwapAbShape {
    /// Tokens per CTA (the wgmma N).
    pub tokens: u32,
    /// CTAs per cluster, each a slice of K.
    pub ksplit: u32,
    /// 64-row weight tiles: `ceil(N / 64)`.
    pub n_tiles: u32,
    /// Token tiles: `ceil(M / tokens)`.
    pub m_tiles: u32,
    /// The entry.
    pub kernel: &'static str,
    /// Dynamic shared memory per CTA, bytes.
    pub smem_bytes: u32,
}

impl SwapAbShape {
    /// CTAs of the launch.
    pub fn ctas(&self) -> u64 {
        self.n_tiles as u64 * self.ksplit as u64 * self.m_tiles as u64
    }

    /// The grid: `(n_tiles * ksplit, m_tiles, 1)`.
    pub fn grid(&self) -> [u32; 3] {
        [self.n_tiles * self.ksplit, self.m_tiles, 1]
    }
}

/// Index of `tokens` in [`TOKEN_TILES`].
fn tile_index(tokens: u32) -> Option<usize> {
    TOKEN_TILES.iter().position(|&t| t == tokens)
}

/// Fixed cost of a CTA in k-blocks (prologue, ring fill, reduction, epilogue) in the ksplit rule.
pub const KSPLIT_FIXED_KBLOCKS: u64 = 4;

/// Largest ksplit the automatic rule picks. Clusters of 4 and 8 measured slower than 1 or 2 at
/// every decode shape (H200, session 13: e.g. 4096 x 14336, 1 token: 34.1 us with 2, 40.5
/// with 4, 39.2 with 8), although they give more CTAs.
pub const AUTO_MAX_KSPLIT: u32 = 2;

/// The launch of `shape` under `cfg` (pure: `resident(tile_index, ksplit)` is the number of
/// clusters of `ksplit` CTAs of that entry that fit on the device at once, 0 if none).
///
/// Rule: the token tile is the smallest of [`TOKEN_TILES`] holding M (128 above 128 rows:
/// several token tiles). `ksplit` minimises `waves * (k_blocks / ksplit + KSPLIT_FIXED_KBLOCKS)`
/// over the sizes up to [`AUTO_MAX_KSPLIT`] that fit (`waves` = CTAs over resident CTAs,
/// rounded up), the smaller on a tie: enough CTAs to fill the SMs, no more slices than pay for
/// their fixed cost.
///
/// Errors: [`Error::BadShape`] for a token tile or ksplit not in the lists, a ksplit above
/// `ceil(K / 64)`, or a ksplit whose cluster does not fit; [`Error::TooLarge`] for more than
/// 65535 token tiles or 2^31 - 1 CTAs along x.
pub fn swap_ab_shape(
    shape: GemmShape,
    cfg: SwapAbConfig,
    resident: impl Fn(usize, u32) -> u32,
) -> Result<SwapAbShape> {
    let tokens = match cfg.tokens {
        Some(t) => {
            tile_index(t).ok_or_else(|| Error::BadShape {
                what: "swap-AB token tile",
                detail: format!("{t}; allowed: {TOKEN_TILES:?}"),
            })?;
            t
        }
        None => TOKEN_TILES
            .iter()
            .copied()
            .find(|&t| t as usize >= shape.m)
            .unwrap_or(TOKEN_TILES[TOKEN_TILES.len() - 1]),
    };
    let ti = tile_index(tokens).unwrap_or(0);
    let m_tiles = shape.m.div_ceil(tokens as usize);
    if m_tiles > 65535 {
        return Err(Error::TooLarge {
            what: "swap-AB token tiles (grid y)",
            value: m_tiles as u64,
            max: 65535,
        });
    }
    let n_tiles = shape.n.div_ceil(contract::W_ROWS) as u64;
    let k_blocks = shape.k.div_ceil(contract::BK) as u64;
    let ctas_x = |ks: u32| n_tiles * ks as u64;
    let ksplit = match cfg.ksplit {
        Some(ks) => {
            if !KSPLITS.contains(&ks) || ks as u64 > k_blocks {
                return Err(Error::BadShape {
                    what: "swap-AB ksplit",
                    detail: format!(
                        "{ks}; allowed: one of {KSPLITS:?} and at most ceil(K / 64) = {k_blocks}"
                    ),
                });
            }
            if resident(ti, ks) == 0 {
                return Err(Error::BadShape {
                    what: "swap-AB ksplit",
                    detail: format!(
                        "a cluster of {ks} CTAs of {} bytes of shared memory does not fit on this device",
                        contract::smem_bytes(tokens)
                    ),
                });
            }
            ks
        }
        None => {
            let mut best: Option<(u64, u32)> = None;
            for &ks in KSPLITS
                .iter()
                .filter(|&&ks| ks <= AUTO_MAX_KSPLIT && ks as u64 <= k_blocks.max(1))
            {
                let slots = resident(ti, ks) as u64 * ks as u64;
                if slots == 0 {
                    continue;
                }
                let ctas = ctas_x(ks) * m_tiles as u64;
                let waves = ctas.div_ceil(slots);
                // In units of 1/8 k-block, so the comparison is exact.
                let cost = waves * (8 * k_blocks.div_ceil(ks as u64) + 8 * KSPLIT_FIXED_KBLOCKS);
                if best.is_none_or(|(c, _)| cost < c) {
                    best = Some((cost, ks));
                }
            }
            best.map(|(_, ks)| ks).ok_or_else(|| Error::BadShape {
                what: "swap-AB ksplit",
                detail: format!(
                    "no cluster size of {KSPLITS:?} fits on this device with {} bytes of shared memory per CTA",
                    contract::smem_bytes(tokens)
                ),
            })?
        }
    };
    if ctas_x(ksplit) > crate::kernels::MAX_GRID as u64 {
        return Err(Error::TooLarge {
            what: "swap-AB grid x (ceil(N / 64) * ksplit CTAs)",
            value: ctas_x(ksplit),
            max: crate::kernels::MAX_GRID as u64,
        });
    }
    Ok(SwapAbShape {
        tokens,
        ksplit,
        n_tiles: n_tiles as u32,
        m_tiles: m_tiles as u32,
        kernel: contract::KERNELS[ti],
        smem_bytes: contract::smem_bytes(tokens) as u32,
    })
}

/// The entries' parameter list (checked against the PTX at [`TcGemm::new`]).
pub(crate) fn rust_params() -> Vec<RustParam> {
    let p = |t: &str, size, kind| RustParam {
        rust_type: t.to_string(),
        size,
        kind,
    };
    use RustParamKind::{Address, Float, Int};
    vec![
        p("tmap_w: u64", 8, Address),
        p("tmap_x: u64", 8, Address),
        p("c: u64", 8, Address),
        p("bias: u64", 8, Address),
        p("m: u32", 4, Int),
        p("n: u32", 4, Int),
        p("k: u32", 4, Int),
        p("ldc: u32", 4, Int),
        p("alpha: f32", 4, Float),
        p("beta: f32", 4, Float),
        p("out_f32: u32", 4, Int),
        p("epilogue: u32", 4, Int),
        p("flags: u32", 4, Int),
        p("stamps: u64", 8, Address),
        p("norm: u64", 8, Address),
    ]
}

/// One validated swap-AB launch; the two map addresses are filled in from the plan's table.
pub(super) struct SwapAbLaunch {
    pub(super) kernel: Kernel,
    pub(super) cfg: LaunchConfig,
    pub(super) shape: SwapAbShape,
    /// `c, bias, m, n, k, ldc, alpha, beta, out_f32, epilogue, flags, stamps, norm` (the last
    /// two 0: none).
    pub(super) params: [ParamValue; 13],
    pub(super) maps: [u64; 2],
}

impl SwapAbLaunch {
    pub(super) fn kernel(&self) -> &Kernel {
        &self.kernel
    }

    /// # Safety
    /// The plan that holds this launch still borrows its views and the map table, and `stream`
    /// is the plan's stream (or captured and replayed as if it were).
    pub(super) unsafe fn launch(&self, dev: &Device, stream: &Stream) -> Result<()> {
        let mut params = Vec::with_capacity(15);
        params.push(ParamValue::new(self.maps[0]));
        params.push(ParamValue::new(self.maps[1]));
        params.extend_from_slice(&self.params);
        // SAFETY: the list matches the entry (checked against the PTX at TcGemm::new: 4 x u64,
        // 4 x u32, 2 x f32, 3 x u32, u64 stamps and u64 norm, here 0: none; flags has neither
        // FLAG_NORM_IN nor FLAG_NORM_OUT, so `norm` is not read, nor FLAG_W_TILED: the weight map
        // is `{K, N}` over B's row-major view). The maps were encoded over views
        // the plan borrows (A, B shared, C exclusively) with the logical sizes as global dims,
        // so TMA reads stay inside A and B; `c`/`ldc` address C, whose rows < m and columns
        // < n (n / 2 for SwiGLU) are the only ones written; the bias view holds n f32; the grid,
        // cluster (ksplit <= ceil(K / 64)), block and shared memory are the contract's (checked
        // against the launch limits); flags has FLAG_WEIGHTS_EARLY only when the caller promised
        // (unsafe WeightsBeforeWait::promise) that no kernel running beside this one writes B.
        unsafe { launch_raw(dev, &self.kernel, stream, &self.cfg, &params) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Any shape and request: a typed error or a launch that covers the problem with an
        /// entry that exists, never a panic; explicit choices are kept.
        #[test]
        fn issue20_swap_ab_shape_fuzz(
            m in 1usize..100_000_000,
            n in 1usize..(1usize << 31),
            k in 1usize..(1usize << 31),
            tokens in proptest::option::of(proptest::sample::select(vec![1u32, 8, 16, 24, 32, 64, 128, 256])),
            ksplit in proptest::option::of(0u32..10),
            fits in 0u32..3,
        ) {
            let cfg = SwapAbConfig { tokens, ksplit, ..Default::default() };
            let res = |_: usize, ks: u32| if fits == 0 && ks > 2 { 0 } else { 132 / ks };
            if let Ok(s) = swap_ab_shape(shape(m, n, k), cfg, res) {
                proptest::prop_assert!(TOKEN_TILES.contains(&s.tokens));
                proptest::prop_assert!(KSPLITS.contains(&s.ksplit));
                proptest::prop_assert!(s.m_tiles as u64 * s.tokens as u64 >= m as u64);
                proptest::prop_assert!(s.n_tiles as u64 * contract::W_ROWS as u64 >= n as u64);
                proptest::prop_assert!(s.ksplit as usize <= k.div_ceil(contract::BK));
                proptest::prop_assert!(s.grid()[0] as u64 == s.n_tiles as u64 * s.ksplit as u64);
                proptest::prop_assert!(s.m_tiles <= 65535);
                if let Some(t) = tokens { proptest::prop_assert_eq!(s.tokens, t); }
                if let Some(ks) = ksplit { proptest::prop_assert_eq!(s.ksplit, ks); }
                else { proptest::prop_assert!(s.ksplit <= AUTO_MAX_KSPLIT); }
            }
        }
    }

    fn shape(m: usize, n: usize, k: usize) -> GemmShape {
        GemmShape { m, n, k }
    }

    /// An H100/H200-like device: 132 SMs, two CTAs per SM up to 64 tokens (one above),
    /// clusters of 8 fit 16 per CTA slot at once.
    fn resident(ti: usize, ks: u32) -> u32 {
        let per_sm = if TOKEN_TILES[ti] <= 64 { 2 } else { 1 };
        per_sm
            * match ks {
                1 => 132,
                2 => 66,
                3 => 44,
                4 => 32,
                8 => 16,
                _ => 0,
            }
    }

    #[test]
    fn issue20_swap_ab_token_tile_and_ksplit_rule() {
        let auto = SwapAbConfig::default();
        // (M, N, K) -> (tokens, ksplit, ctas)
        for (m, n, k, tokens, ksplit) in [
            // decode: 64 weight tiles of 4096 rows leave SMs idle: split K in two.
            (1, 4096, 4096, 8, 2),
            (16, 4096, 4096, 16, 2),
            (33, 4096, 4096, 64, 2),
            (64, 4096, 14336, 64, 2),
            (1, 6144, 4096, 8, 2),
            // enough weight tiles to fill the CTA slots: no split.
            (16, 14336, 4096, 16, 1),
            (16, 28672, 4096, 16, 1),
            // 128 tokens: one CTA per SM, 192 tiles: two waves either way, halve each.
            (128, 12288, 5376, 128, 2),
            // K = 64: one k-block, nothing to split.
            (8, 4096, 64, 8, 1),
            // more than 128 tokens: several token tiles.
            (200, 4096, 4096, 128, 1),
        ] {
            let s = swap_ab_shape(shape(m, n, k), auto, resident).unwrap();
            assert_eq!(
                (s.tokens, s.ksplit),
                (tokens, ksplit),
                "{m} x {n} x {k}: {s:?}"
            );
            assert_eq!(s.m_tiles as usize, m.div_ceil(tokens as usize));
            assert_eq!(s.n_tiles as usize, n.div_ceil(64));
            assert_eq!(s.kernel, contract::KERNELS[tile_index(tokens).unwrap()]);
            assert!(s.smem_bytes as usize <= contract::SMEM_LIMIT);
        }
        // Explicit choices are kept, and refused with a typed error when impossible.
        let s = swap_ab_shape(
            shape(5, 1000, 3000),
            SwapAbConfig {
                tokens: Some(32),
                ksplit: Some(8),
                ..Default::default()
            },
            resident,
        )
        .unwrap();
        assert_eq!((s.tokens, s.ksplit, s.grid()), (32, 8, [128, 1, 1]));
        // A cluster of 3 (tokens split 2, 3, 3 at 8 per tile): 64 tiles x 3 CTAs.
        let s = swap_ab_shape(
            shape(8, 4096, 4096),
            SwapAbConfig {
                ksplit: Some(3),
                ..Default::default()
            },
            resident,
        )
        .unwrap();
        assert_eq!((s.tokens, s.ksplit, s.grid()), (8, 3, [192, 1, 1]));
        for cfg in [
            SwapAbConfig {
                tokens: Some(24),
                ksplit: None,
                ..Default::default()
            },
            SwapAbConfig {
                tokens: None,
                ksplit: Some(5),
                ..Default::default()
            },
            SwapAbConfig {
                tokens: None,
                ksplit: Some(16),
                ..Default::default()
            },
        ] {
            assert!(matches!(
                swap_ab_shape(shape(5, 1000, 3000), cfg, resident),
                Err(Error::BadShape { .. })
            ));
        }
        // ksplit above the k-blocks: K = 100 has 2.
        assert!(matches!(
            swap_ab_shape(
                shape(5, 1000, 100),
                SwapAbConfig {
                    tokens: None,
                    ksplit: Some(4),
                    ..Default::default()
                },
                resident
            ),
            Err(Error::BadShape { .. })
        ));
        // A cluster that does not fit.
        assert!(matches!(
            swap_ab_shape(
                shape(5, 1000, 3000),
                SwapAbConfig {
                    tokens: None,
                    ksplit: Some(8),
                    ..Default::default()
                },
                |_, ks| if ks == 8 { 0 } else { 10 }
            ),
            Err(Error::BadShape { .. })
        ));
        // Nothing fits at all.
        assert!(swap_ab_shape(shape(5, 1000, 3000), auto, |_, _| 0).is_err());
        // Too many token tiles for grid y.
        assert!(matches!(
            swap_ab_shape(shape(128 * 65536, 128, 64), auto, resident),
            Err(Error::TooLarge { .. })
        ));
    }
}
