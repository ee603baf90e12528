//! The memory-bound decode GEMM (issue 20; `DecodeGemm`, kernels `decode_gemm_*`) side by side
//! with cuBLAS `cublasGemmEx` (BF16 in, `CUBLAS_COMPUTE_32F`, f32 out, same layouts) in the same
//! run, at the decode shapes: M (tokens) in {1, 2, 7, 8, 16, 32, 64, 128} x weights (N, K) in
//! {(4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (28672, 4096)}; and the swap-AB
//! tensor-core configuration (`TcGemm` with `GemmConfig::SwapAb`: its automatic tile and ksplit,
//! the same with PDL and the weights before `griddepcontrol.wait`, then each ksplit of `KSPLITS`
//! unless `WARPLINE_SWAPAB_KS=0`), whose best automatic row goes into the summary's right half
//! with its max relative difference from cuBLAS.
//!
//! Every launch, ours and cuBLAS's, reads the next of several weight buffers in turn (together at
//! least 3 x the 50 MB L2), so the weights come from DRAM as in a real decode step. Per shape:
//! cuBLAS, our default configuration, the same with PDL and the weights loaded before
//! `griddepcontrol.wait` (back-to-back launches), `w16_u2_pf_r2` and `w16_u2_pf_r2_pa` (two row
//! tiles per warp, default ksplit, without and with the A prefetch) with PDL and early weights,
//! then every tunable combination
//! (`DecodeConfig::sweep()`: warps per CTA, warps splitting K, k-steps per k-block, L2
//! prefetch, row tiles per warp, A prefetch). Each row: median microseconds of `REPS` rounds of `BATCH` launches (CUDA
//! events), TB/s of weight reads (`N * K * 2` bytes / time), the ratio to cuBLAS of the same rounds (> 1: faster) and the
//! fraction of the device-copy bandwidth measured at the start of the run. The best row of each
//! shape is marked `*`; a summary table follows, with the max relative difference between the
//! best configuration's C and cuBLAS's.
//!
//! Environment: `WARPLINE_DECODE_SWEEP=0` (default and PDL rows only); `WARPLINE_SWAPAB_TOKENS=t`
//! (the swap-AB ksplit rows' token tile); `WARPLINE_DECODE_SHAPES=
//! MxNxK,...` (only these; any M over the bench's five (N, K)); `WARPLINE_DECODE_CONFIGS=ITEM,...` (only the swept configs that
//! match an item; an item is tokens joined by `+`, all of which must match: an exact label such
//! as `w16_ks8_u2_pf`, `r1`/`r2`, `u2`/`u4`, `w4`/`w8`/`w16`, `pf`/`nopf`, `pa`/`nopa`; e.g.
//! `pf+u2,w16_ks8_u2_pf`). Without a driver it prints why it skipped and exits 0.

use rand::{Rng, SeedableRng};
use warpline::bandwidth::d2d_copy_gbps;
use warpline::kernels::decode_gemm::GemmConfig;
use warpline::kernels::decode_gemm::{DecodeConfig, DecodeGemm, DecodeGemmOptions, DecodePlan};
use warpline::kernels::tc_gemm::{
    BLayout, CublasGemmEx, Matrix, MatrixMut, SwapAbConfig, TcGemm, TcGemmOptions, TcGemmPlan,
    WeightsBeforeWait,
};
use warpline::{bf16, Device, DeviceBuffer, MemPool, Stream};
use warpline_suite::support::{gpu_or_skip, parse_dims};

const REPS: usize = 15;
const BATCH: usize = 20;
/// Bytes the rotating weight buffers must add up to (3 x the H100's 50 MB L2).
const ROTATE_BYTES: usize = 150 << 20;

fn median_us(
    stream: &Stream,
    mut launch: impl FnMut(usize) -> warpline::Result<()>,
) -> warpline::Result<f64> {
    for i in 0..3 {
        launch(i)?;
    }
    stream.synchronize()?;
    let mut t = Vec::with_capacity(REPS);
    let mut i = 0;
    for _ in 0..REPS {
        let start = stream.record()?;
        for _ in 0..BATCH {
            launch(i)?;
            i += 1;
        }
        let end = stream.record()?;
        end.synchronize()?;
        t.push(start.elapsed_ms(&end)? as f64 * 1e3 / BATCH as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[REPS / 2])
}

fn random_buffer(
    pool: &MemPool,
    stream: &Stream,
    rng: &mut rand::rngs::StdRng,
    n: usize,
) -> warpline::Result<DeviceBuffer<bf16>> {
    let v: Vec<bf16> = (0..n)
        .map(|_| {
            let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.random();
            bf16::from_f64((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos())
        })
        .collect();
    let mut b = pool.alloc_async::<bf16>(stream, n)?;
    b.copy_from_host(&v)?;
    Ok(b)
}

/// cuBLAS's `C = A B` (column-major B) into `c_blas`, then max |ours - cuBLAS| / max |cuBLAS|
/// over the `M x N` of `ours` (both row-major with pitch N). Synchronises through the copies.
fn rel_diff_vs_cublas(
    blas: &CublasGemmEx,
    a: &Matrix<'_, bf16>,
    b: &Matrix<'_, bf16>,
    c_blas: &mut DeviceBuffer<f32>,
    ours: &DeviceBuffer<f32>,
) -> warpline::Result<f32> {
    let (m, n) = (a.rows, b.rows);
    {
        let mut cm = MatrixMut::new(c_blas.as_view_mut(), m, n, n);
        blas.gemm(a, b, BLayout::ColMajor, &mut cm, 1.0, 0.0)?;
    }
    let mut got = vec![0f32; m * n];
    let mut want = vec![0f32; m * n];
    ours.copy_to_host(&mut got)?;
    c_blas.copy_to_host(&mut want)?;
    let scale = want.iter().fold(0f32, |s, v| s.max(v.abs())).max(1e-30);
    let diff = got
        .iter()
        .zip(&want)
        .fold(0f32, |s, (x, y)| s.max((x - y).abs()));
    Ok(diff / scale)
}

struct Row {
    label: String,
    us: f64,
}

fn run(dev: &Device) -> warpline::Result<()> {
    let caps = dev.capabilities();
    println!("device: {} ({} SMs)", caps.name, caps.sm_count);
    let copy = d2d_copy_gbps(dev, 512 << 20, 20)?;
    println!(
        "device copy (cuMemcpyDtoD, 512 MiB, read + write): {:.0} GB/s = {:.3} TB/s",
        copy,
        copy / 1e3
    );
    let dg = DecodeGemm::new(dev)?;
    // The swap-AB tensor-core configuration (sm_90a only).
    let tc = TcGemm::new(dev).ok();
    let swap_ab_ks = std::env::var("WARPLINE_SWAPAB_KS").as_deref() != Ok("0");
    // WARPLINE_SWAPAB_TOKENS=t: the token tile of the ksplit rows (default the rule's).
    let swap_ab_tokens: Option<u32> = std::env::var("WARPLINE_SWAPAB_TOKENS")
        .ok()
        .map(|v| v.parse().expect("WARPLINE_SWAPAB_TOKENS: a token tile"));
    let sweep = std::env::var("WARPLINE_DECODE_SWEEP").as_deref() != Ok("0");
    let config_filter: Option<Vec<String>> = std::env::var("WARPLINE_DECODE_CONFIGS")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let swept: Vec<DecodeConfig> = DecodeConfig::sweep()
        .into_iter()
        .filter(|cfg| {
            config_filter.as_ref().is_none_or(|items| {
                items
                    .iter()
                    .any(|it| it.split('+').all(|tok| config_token(tok, cfg)))
            })
        })
        .collect();
    let only: Option<Vec<String>> = std::env::var("WARPLINE_DECODE_SHAPES")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect());
    let stream = dev.new_stream()?;
    let pool = MemPool::device_default(dev, 0)?;
    let blas = CublasGemmEx::new(dev, &stream)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xdec0de);
    let mut summary = Vec::new();
    println!(
        "{:>20} {:>28} {:>9} {:>8} {:>9} {:>7}",
        "M x N x K", "kernel", "us", "TB/s", "x cuBLAS", "x copy"
    );
    for (n, k) in [
        (4096usize, 4096usize),
        (6144, 4096),
        (14336, 4096),
        (4096, 14336),
        (28672, 4096),
    ] {
        // The bench's M values, and with WARPLINE_DECODE_SHAPES any M it names for this (N, K).
        let mut ms = vec![1usize, 2, 7, 8, 16, 32, 64, 128];
        if let Some(only) = &only {
            for [m, sn, sk] in only.iter().filter_map(|s| parse_dims(s)) {
                if (sn, sk) == (n, k) && !ms.contains(&m) {
                    ms.push(m);
                }
            }
        }
        if let Some(only) = &only {
            // No weights to make for a weight shape none of the chosen shapes uses.
            if !ms.iter().any(|m| only.contains(&format!("{m}x{n}x{k}"))) {
                continue;
            }
        }
        let wbytes = n * k * 2;
        let nbuf = ROTATE_BYTES.div_ceil(wbytes).max(3);
        let weights = (0..nbuf)
            .map(|_| random_buffer(&pool, &stream, &mut rng, n * k))
            .collect::<warpline::Result<Vec<_>>>()?;
        for m in ms {
            let shape = format!("{m}x{n}x{k}");
            if let Some(only) = &only {
                if !only.contains(&shape) {
                    continue;
                }
            }
            let a = random_buffer(&pool, &stream, &mut rng, m * k)?;
            let am = Matrix::new(a.as_view(), m, k, k);
            let mut cs = (0..nbuf)
                .map(|_| pool.alloc_async::<f32>(&stream, m * n))
                .collect::<warpline::Result<Vec<_>>>()?;
            let mut c_blas = pool.alloc_async::<f32>(&stream, m * n)?;
            let mut rows = Vec::new();
            // cuBLAS.
            let blas_us = {
                let mut cm = MatrixMut::new(c_blas.as_view_mut(), m, n, n);
                median_us(&stream, |i| {
                    let bm = Matrix::new(weights[i % nbuf].as_view(), n, k, k);
                    blas.gemm(&am, &bm, BLayout::ColMajor, &mut cm, 1.0, 0.0)
                })?
            };
            rows.push(Row {
                label: "cuBLAS GemmEx".into(),
                us: blas_us,
            });
            // Ours: default, default + PDL (weights before the wait), the sweep.
            // Two row tiles per warp, 16 warps, the launcher's default ksplit, PDL with the
            // weights before the wait; refused (printed as skipped) above 32 tokens.
            let r2_pdl = |label: &str, prefetch_a: bool| {
                let cfg = DecodeConfig {
                    warps: 16,
                    ksplit: None,
                    unroll: 2,
                    l2_prefetch: true,
                    row_tiles: 2,
                    prefetch_a,
                };
                // SAFETY: no kernel of this bench writes the weight buffers (they are written
                // by copies before the first launch).
                let opts = unsafe { DecodeGemmOptions::new(cfg, true).with_weights_before_wait() };
                (label.to_string(), opts)
            };
            let mut configs: Vec<(String, DecodeGemmOptions)> = vec![
                (
                    "default".into(),
                    DecodeGemmOptions::new(DecodeConfig::default(), false),
                ),
                (
                    "default pdl+early".into(),
                    // SAFETY: no kernel of this bench writes the weight buffers (they are
                    // written by copies before the first launch).
                    unsafe {
                        DecodeGemmOptions::new(DecodeConfig::default(), true)
                            .with_weights_before_wait()
                    },
                ),
                r2_pdl("w16_u2_pf_r2 pdl+early", false),
                r2_pdl("w16_u2_pf_r2_pa pdl+early", true),
            ];
            if sweep {
                for &cfg in &swept {
                    configs.push((cfg.label(), DecodeGemmOptions::new(cfg, false)));
                }
            }
            let mut best: Option<(f64, String, DecodeGemmOptions)> = None;
            for (label, opts) in &configs {
                let plans: warpline::Result<Vec<DecodePlan<'_>>> = weights
                    .iter()
                    .zip(cs.iter_mut())
                    .map(|(w, c)| {
                        dg.plan(
                            &stream,
                            am,
                            Matrix::new(w.as_view(), n, k, k),
                            BLayout::ColMajor,
                            MatrixMut::new(c.as_view_mut(), m, n, n),
                            1.0,
                            0.0,
                            opts,
                        )
                    })
                    .collect();
                let plans = match plans {
                    Ok(p) => p,
                    Err(e) => {
                        println!("{shape:>20} {label:>28} skipped: {e}");
                        continue;
                    }
                };
                let ls = plans[0].launch_shape();
                let us = median_us(&stream, |i| plans[i % nbuf].launch())?;
                let name = format!("{label} ({}, ks{})", &ls.kernel[12..], ls.ksplit);
                if best.as_ref().is_none_or(|b| us < b.0) {
                    best = Some((us, label.clone(), *opts));
                }
                rows.push(Row { label: name, us });
            }
            // Swap-AB: the automatic tile and ksplit, then each ksplit (WARPLINE_SWAPAB_KS=0:
            // automatic only). The automatic row's C is compared with cuBLAS's below.
            let mut swap_auto: Option<(f64, f32)> = None;
            if let Some(tc) = &tc {
                let mut variants = vec![
                    ("swapab auto".to_string(), SwapAbConfig::default(), false),
                    (
                        "swapab pdl+early".to_string(),
                        SwapAbConfig {
                            // SAFETY: no kernel of this bench writes the weight buffers (they
                            // are written by copies before the first launch).
                            weights_before_wait: Some(unsafe { WeightsBeforeWait::promise() }),
                            ..Default::default()
                        },
                        true,
                    ),
                ];
                if swap_ab_ks {
                    for ks in warpline::kernels::tc_gemm::KSPLITS {
                        variants.push((
                            format!("swapab ks{ks}"),
                            SwapAbConfig {
                                tokens: swap_ab_tokens,
                                ksplit: Some(ks),
                                ..Default::default()
                            },
                            false,
                        ));
                    }
                }
                for (vi, (label, cfg, pdl)) in variants.into_iter().enumerate() {
                    let opts = TcGemmOptions {
                        config: GemmConfig::SwapAb,
                        swap_ab: cfg,
                        pdl,
                        ..Default::default()
                    };
                    let plans: warpline::Result<Vec<TcGemmPlan<'_>>> = weights
                        .iter()
                        .zip(cs.iter_mut())
                        .map(|(w, c)| {
                            tc.plan(
                                &stream,
                                am,
                                Matrix::new(w.as_view(), n, k, k),
                                BLayout::ColMajor,
                                MatrixMut::new(c.as_view_mut(), m, n, n),
                                1.0,
                                0.0,
                                &opts,
                            )
                        })
                        .collect();
                    let plans = match plans {
                        Ok(p) => p,
                        Err(e) => {
                            println!("{shape:>20} {label:>28} skipped: {e}");
                            continue;
                        }
                    };
                    let sh = plans[0].swap_ab_shapes()[0];
                    let us = median_us(&stream, |i| plans[i % nbuf].launch())?;
                    if vi < 2 && swap_auto.is_none_or(|(b, _)| us < b) {
                        swap_auto = Some((us, f32::NAN));
                    }
                    rows.push(Row {
                        label: format!("{label} (n{}, ks{})", sh.tokens, sh.ksplit),
                        us,
                    });
                }
            }
            if let (Some(tc), Some((us, _))) = (&tc, swap_auto) {
                let opts = TcGemmOptions {
                    config: GemmConfig::SwapAb,
                    ..Default::default()
                };
                tc.plan(
                    &stream,
                    am,
                    Matrix::new(weights[0].as_view(), n, k, k),
                    BLayout::ColMajor,
                    MatrixMut::new(cs[0].as_view_mut(), m, n, n),
                    1.0,
                    0.0,
                    &opts,
                )?
                .launch()?;
                let bm = Matrix::new(weights[0].as_view(), n, k, k);
                let rel = rel_diff_vs_cublas(&blas, &am, &bm, &mut c_blas, &cs[0])?;
                swap_auto = Some((us, rel));
            }
            let best_us = best.as_ref().map_or(f64::INFINITY, |b| b.0);
            for r in &rows {
                let tbs = wbytes as f64 / (r.us * 1e-6) / 1e12;
                let mark = if r.us == best_us { "*" } else { " " };
                println!(
                    "{shape:>20} {:>28}{mark} {:>9.2} {:>8.3} {:>9.3} {:>7.3}",
                    r.label,
                    r.us,
                    tbs,
                    blas_us / r.us,
                    tbs * 1e3 / copy
                );
            }
            // Correctness of the best configuration against cuBLAS (same inputs, buffer 0).
            if let Some((us, label, opts)) = best {
                dg.plan(
                    &stream,
                    am,
                    Matrix::new(weights[0].as_view(), n, k, k),
                    BLayout::ColMajor,
                    MatrixMut::new(cs[0].as_view_mut(), m, n, n),
                    1.0,
                    0.0,
                    &opts,
                )?
                .launch()?;
                let bm = Matrix::new(weights[0].as_view(), n, k, k);
                let rel = rel_diff_vs_cublas(&blas, &am, &bm, &mut c_blas, &cs[0])?;
                summary.push((shape.clone(), label, us, blas_us, wbytes, rel, swap_auto));
            }
            stream.synchronize()?;
        }
    }
    println!();
    println!(
        "{:>20} {:>18} {:>9} {:>9} {:>8} {:>9} {:>7} {:>10} | {:>9} {:>9} {:>7} {:>10}",
        "M x N x K",
        "best decode",
        "us",
        "cuBLAS",
        "TB/s",
        "x cuBLAS",
        "x copy",
        "max rel d",
        "swapab us",
        "x cuBLAS",
        "x copy",
        "max rel d"
    );
    for (shape, label, us, blas_us, wbytes, rel, swap) in summary {
        let tbs = wbytes as f64 / (us * 1e-6) / 1e12;
        let swap = swap.map_or(String::from("-"), |(s, r)| {
            let t = wbytes as f64 / (s * 1e-6) / 1e12;
            format!(
                "{s:>9.2} {:>9.3} {:>7.3} {r:>10.2e}",
                blas_us / s,
                t * 1e3 / copy
            )
        });
        println!(
            "{shape:>20} {label:>18} {us:>9.2} {blas_us:>9.2} {tbs:>8.3} {:>9.3} {:>7.3} {rel:>10.2e} | {swap}",
            blas_us / us,
            tbs * 1e3 / copy
        );
    }
    Ok(())
}

/// Whether `cfg` matches one token of `WARPLINE_DECODE_CONFIGS`: its exact label, or one of
/// `r1`/`r2` (row tiles per warp), `u2`/`u4` (unroll), `w4`/`w8`/`w16` (warps), `pf`/`nopf` (L2
/// prefetch hint), `pa`/`nopa` (A prefetch).
fn config_token(tok: &str, cfg: &DecodeConfig) -> bool {
    match tok {
        "pf" => cfg.l2_prefetch,
        "nopf" => !cfg.l2_prefetch,
        "pa" => cfg.prefetch_a,
        "nopa" => !cfg.prefetch_a,
        _ => {
            let num = |p: &str| tok.strip_prefix(p).and_then(|v| v.parse::<u32>().ok());
            if let Some(r) = num("r") {
                cfg.row_tiles == r
            } else if let Some(u) = num("u") {
                cfg.unroll == u
            } else if let Some(w) = num("w") {
                cfg.warps == w
            } else {
                tok == cfg.label()
            }
        }
    }
}

fn main() {
    let Some(dev) = gpu_or_skip("decode_gemm bench") else {
        return;
    };
    if let Err(e) = run(&dev) {
        eprintln!("decode_gemm bench: {e}");
        std::process::exit(1);
    }
}
