//! Measuring the decode step (issue 21): the variant table (µs per layer, ratio to the HBM
//! floor measured in the same run), a `%globaltimer` timeline of one step, and the .npy export
//! for the PyTorch check (`scripts/torch_decode.py --check DIR`). `benches/decode_step.rs`
//! prints it; a `warpline decode` command can be a thin wrapper over [`run_case`] and
//! [`export_npy`].

use std::path::Path;

use half::bf16;

use super::reference::normal_bf16;
use super::step::{DecodeStep, HostLayer, KernelStamps, StepConfig, Variant};
use super::DecodeDims;
use crate::device::Device;
use crate::error::Result;
use crate::kernels::decode_gemm::DecodeConfig;

/// One measured case: `batch` sequences, each at KV length `kv_len` (position `kv_len - 1`;
/// the step attends over `kv_len` tokens), `layers` layers with their own weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Case {
    /// Sequences.
    pub batch: usize,
    /// Tokens attended per sequence (including the new one).
    pub kv_len: usize,
}

impl Case {
    /// Parses `BxL` (e.g. `8x4096`). Errors: [`crate::Error::BadShape`].
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || crate::Error::BadShape {
            what: "decode case",
            detail: format!("{s:?}; allowed: BxL with B in 1..=64 and L >= 1, e.g. 8x4096"),
        };
        let (b, l) = s.trim().split_once('x').ok_or_else(bad)?;
        let batch: usize = b.parse().map_err(|_| bad())?;
        let kv_len: usize = l.parse().map_err(|_| bad())?;
        if batch == 0 || batch > 64 || kv_len == 0 {
            return Err(bad());
        }
        Ok(Self { batch, kv_len })
    }

    /// The issue's cases: 1x1024, 8x1024, 8x4096, 32x4096, 64x2048.
    pub fn issue_cases() -> Vec<Self> {
        [(1, 1024), (8, 1024), (8, 4096), (32, 4096), (64, 2048)]
            .into_iter()
            .map(|(batch, kv_len)| Self { batch, kv_len })
            .collect()
    }
}

/// One row of the table.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    /// The case.
    pub case: Case,
    /// Layers per step.
    pub layers: usize,
    /// Variant label (`a plain` .. `e graph+pdl+prefetch`).
    pub variant: &'static str,
    /// Median µs per step.
    pub us_per_step: f64,
    /// `us_per_step / layers`.
    pub us_per_layer: f64,
    /// The HBM floor per layer: weight + KV bytes over the copy bandwidth.
    pub floor_us_per_layer: f64,
    /// `floor / measured` (1 = at the floor).
    pub floor_ratio: f64,
    /// KV splits of the attention.
    pub splits: u32,
}

/// Median of `reps` timings (µs per step) of `iters` steps each, after 3 warm-up steps.
fn median_us(
    step: &DecodeStep<'_>,
    reps: usize,
    iters: usize,
    mut launch: impl FnMut() -> Result<()>,
) -> Result<f64> {
    let s = step.stream();
    for _ in 0..3 {
        launch()?;
    }
    s.synchronize()?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        let a = s.record()?;
        for _ in 0..iters {
            launch()?;
        }
        let b = s.record()?;
        b.synchronize()?;
        t.push(a.elapsed_ms(&b)? as f64 * 1e3 / iters as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[reps / 2])
}

/// Builds the step for `case` (caches filled with a constant, every sequence at position
/// `kv_len - 1`, block tables `b * pages + i`) with `weights` (one per layer); `tune` adjusts
/// the [`StepConfig`] (stamps, prefetch budget, GEMM configuration) before the step is made.
pub fn build_step<'d>(
    dev: &'d Device,
    dims: &DecodeDims,
    case: Case,
    weights: &[HostLayer],
    tune: impl FnOnce(&mut StepConfig),
) -> Result<DecodeStep<'d>> {
    let stream = dev.new_stream()?;
    let mut cfg = StepConfig::new(dims, case.batch, weights.len(), case.kv_len);
    tune(&mut cfg);
    let mut step = DecodeStep::new(dev, &stream, *dims, cfg, weights)?;
    step.fill_caches(bf16::from_f32(0.01))?;
    let x: Vec<bf16> = normal_bf16(5, case.batch * dims.hidden, 1.0)
        .into_iter()
        .map(bf16::from_f32)
        .collect();
    let positions = vec![case.kv_len as u32 - 1; case.batch];
    let bt: Vec<u32> = (0..case.batch * cfg.layout.max_pages_per_seq)
        .map(|i| i as u32)
        .collect();
    step.set_inputs(&x, &positions, &bt)?;
    Ok(step)
}

/// Measures every variant of `variants` for one case; `copy_gbps` is the device-copy bandwidth
/// measured in the same run (bytes read + written per second, as `bandwidth::d2d_copy_gbps`);
/// the floor counts each byte that must be read once at that rate.
pub fn run_case(
    step: &DecodeStep<'_>,
    case: Case,
    variants: &[Variant],
    copy_gbps: f64,
    reps: usize,
    iters: usize,
) -> Result<Vec<Row>> {
    let layers = step.config().layers;
    let floor_us = step.floor_bytes() as f64 / (copy_gbps * 1e9) * 1e6 / layers as f64;
    let mut rows = Vec::new();
    for &v in variants {
        let us = if v.graph() {
            let g = step.capture(v)?;
            median_us(step, reps, iters, || g.launch())?
        } else {
            median_us(step, reps, iters, || step.run(v))?
        };
        rows.push(Row {
            case,
            layers,
            variant: v.label(),
            us_per_step: us,
            us_per_layer: us / layers as f64,
            floor_us_per_layer: floor_us,
            floor_ratio: floor_us * layers as f64 / us,
            splits: step.splits(),
        });
    }
    Ok(rows)
}

/// Parses a GEMM configuration label into `base`: `_`-separated tokens `w4|w8|w16` (warps),
/// `ks1..ks16` (k-split), `u2|u4` (unroll), `r1|r2` (row tiles), `pa|nopa` (A prefetch),
/// `pf|nopf` (`.L2::256B` hint), e.g. `w8_u2_r2_pa`. Errors: [`crate::Error::BadShape`] naming
/// the token.
pub fn parse_gemm_config(label: &str, base: DecodeConfig) -> Result<DecodeConfig> {
    let mut c = base;
    for tok in label.split('_').filter(|t| !t.is_empty()) {
        let num = |p: &str| tok.strip_prefix(p).and_then(|v| v.parse::<u32>().ok());
        match tok {
            "pa" => c.prefetch_a = true,
            "nopa" => c.prefetch_a = false,
            "pf" => c.l2_prefetch = true,
            "nopf" => c.l2_prefetch = false,
            _ if tok.starts_with("ks") && num("ks").is_some() => c.ksplit = num("ks"),
            _ if tok.starts_with('w') && num("w").is_some() => c.warps = num("w").unwrap_or(8),
            _ if tok.starts_with('u') && num("u").is_some() => c.unroll = num("u").unwrap_or(4),
            _ if tok.starts_with('r') && num("r").is_some() => {
                c.row_tiles = num("r").unwrap_or(1)
            }
            _ => {
                return Err(crate::Error::BadShape {
                    what: "decode GEMM configuration",
                    detail: format!(
                        "token {tok:?} of {label:?}; allowed: wN, ksN, uN, rN, pa, nopa, pf, nopf joined by _"
                    ),
                })
            }
        }
    }
    Ok(c)
}

/// One kernel on the timeline, µs from the first kernel's start.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TimelineRow {
    /// Layer and role.
    pub layer: usize,
    /// Role.
    pub role: &'static str,
    /// First CTA start.
    pub start_us: f64,
    /// First CTA past `griddepcontrol.wait`.
    pub wait_us: f64,
    /// Last CTA end.
    pub end_us: f64,
    /// How long this kernel's CTAs ran before the previous kernel's end (prologue overlap).
    pub overlap_us: f64,
}

/// Runs one step of `variant` with stamps (the step must have been built with
/// [`StepConfig::stamps`]) and returns its timeline.
pub fn timeline(step: &mut DecodeStep<'_>, variant: Variant) -> Result<Vec<TimelineRow>> {
    step.reset_stamps()?;
    if variant.graph() {
        let g = step.capture(variant)?;
        g.launch()?;
    } else {
        step.run(variant)?;
    }
    step.stream().synchronize()?;
    Ok(timeline_rows(&step.stamps()?))
}

/// The rows of [`timeline`] from raw stamps.
pub fn timeline_rows(st: &[KernelStamps]) -> Vec<TimelineRow> {
    let t0 = st.iter().map(|k| k.start).min().unwrap_or(0);
    let us = |t: u64| t.saturating_sub(t0) as f64 / 1e3;
    st.iter()
        .enumerate()
        .map(|(i, k)| TimelineRow {
            layer: k.layer,
            role: k.role,
            start_us: us(k.start),
            wait_us: us(k.wait_first),
            end_us: us(k.end),
            overlap_us: if i > 0 {
                (us(st[i - 1].end) - us(k.start)).max(0.0)
            } else {
                0.0
            },
        })
        .collect()
}

/// The timeline as a [`crate::trace::Trace`] with one row per kernel (`L{layer} {role}`): the
/// span before `griddepcontrol.wait` (stage `wait`: the CTAs are resident, may prefetch, and
/// wait for the predecessor) and the span after it (stage `kernel`), for
/// `trace::timeline::write_timeline` (feature `timeline`) or `trace::write_chrome_json`.
pub fn timeline_trace(rows: &[TimelineRow], title: &str) -> Result<crate::trace::Trace> {
    use crate::trace::{Span, Stage, Trace, TrackKind};
    let mut t = Trace {
        clock: format!(
            "%globaltimer stamps of one step ({title}), µs from the first kernel's start"
        ),
        ..Default::default()
    };
    for r in rows {
        let track = t.add_track(
            1,
            title,
            &format!("L{} {}", r.layer, r.role),
            TrackKind::DeviceStamps,
        )?;
        if r.wait_us > r.start_us {
            t.spans.push(Span {
                track,
                stage: Stage::Wait,
                name: format!("L{} {} before griddepcontrol.wait", r.layer, r.role),
                start_us: r.start_us,
                dur_us: r.wait_us - r.start_us,
                args: vec![("overlap_us".into(), format!("{:.2}", r.overlap_us))],
            });
        }
        t.spans.push(Span {
            track,
            stage: Stage::Kernel,
            name: format!("L{} {}", r.layer, r.role),
            start_us: r.wait_us,
            dur_us: (r.end_us - r.wait_us).max(0.0),
            args: vec![],
        });
    }
    t.spans.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
    Ok(t)
}

/// The table and timeline as one pretty JSON object (`dims`, `copy_gbps`, `rows`, `timeline`).
pub fn to_json(
    dims: &DecodeDims,
    copy_gbps: f64,
    rows: &[Row],
    timeline: Option<&[TimelineRow]>,
) -> String {
    let v = serde_json::json!({
        "dims": format!("{dims:?}"),
        "copy_gbps": copy_gbps,
        "rows": rows,
        "timeline": timeline,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

/// Writes one step's inputs, weights, caches (before the step) and output as float32 .npy
/// files into `dir` for `scripts/torch_decode.py --check DIR`: `x.npy` `[B, hidden]`,
/// `positions.npy`, `block_table.npy` (as float32), `dims.npy` (`[hidden, heads, kv_heads,
/// head_dim, intermediate, page_size, rope_theta, eps, layers]`), per layer `l{i}_{name}.npy`
/// for the weights (logical layouts), `l{i}_k_cache.npy` / `l{i}_v_cache.npy` (`[pages, kv_heads,
/// page, d]`), and `out.npy` (warpline's output). Runs the step once with `variant`.
pub fn export_npy(
    dir: &Path,
    step: &DecodeStep<'_>,
    weights: &[HostLayer],
    x: &[bf16],
    positions: &[u32],
    block_table: &[u32],
    variant: Variant,
) -> Result<()> {
    use crate::npy::write_f32;
    std::fs::create_dir_all(dir).map_err(|e| crate::Error::Npy {
        path: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    let d = step.dims();
    let cfg = step.config();
    let f = |v: &[bf16]| v.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
    let u = |v: &[u32]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
    let p = |name: &str| dir.join(format!("{name}.npy"));
    let b = cfg.batch as u64;
    step.set_inputs(x, positions, block_table)?;
    write_f32(&p("x"), &[b, d.hidden as u64], &f(x))?;
    write_f32(&p("positions"), &[b], &u(positions))?;
    write_f32(
        &p("block_table"),
        &[b, cfg.layout.max_pages_per_seq as u64],
        &u(block_table),
    )?;
    let dims = [
        d.hidden as f32,
        d.heads as f32,
        d.kv_heads as f32,
        d.head_dim as f32,
        d.intermediate as f32,
        d.page_size as f32,
        d.rope_theta as f32,
        d.eps as f32,
        cfg.layers as f32,
    ];
    write_f32(&p("dims"), &[dims.len() as u64], &dims)?;
    let cache_shape = [
        cfg.layout.num_pages as u64,
        d.kv_heads as u64,
        d.page_size as u64,
        d.head_dim as u64,
    ];
    for (l, w) in weights.iter().enumerate() {
        let (h, q, i) = (d.hidden as u64, d.q_width() as u64, d.intermediate as u64);
        for (name, shape, data) in [
            ("attn_norm", vec![h], &w.attn_norm),
            ("wqkv", vec![d.qkv_rows() as u64, h], &w.wqkv),
            ("wo", vec![h, q], &w.wo),
            ("ffn_norm", vec![h], &w.ffn_norm),
            ("w_gate", vec![i, h], &w.w_gate),
            ("w_up", vec![i, h], &w.w_up),
            ("w_down", vec![h, i], &w.w_down),
        ] {
            write_f32(&p(&format!("l{l}_{name}")), &shape, &f(data))?;
        }
        let (k, v) = step.read_cache(l)?;
        write_f32(&p(&format!("l{l}_k_cache")), &cache_shape, &f(&k))?;
        write_f32(&p(&format!("l{l}_v_cache")), &cache_shape, &f(&v))?;
    }
    if variant.graph() {
        let g = step.capture(variant)?;
        g.launch()?;
    } else {
        step.run(variant)?;
    }
    step.stream().synchronize()?;
    write_f32(&p("out"), &[b, d.hidden as u64], &f(&step.output()?))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue21_case_parse_and_timeline_rows() {
        assert_eq!(
            Case::parse("8x4096").unwrap(),
            Case {
                batch: 8,
                kv_len: 4096
            }
        );
        for bad in ["8", "0x10", "65x1", "8x0", "ax1"] {
            assert!(Case::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Case::issue_cases().len(), 5);
        let base = DecodeConfig::default();
        let c = parse_gemm_config("w16_ks8_u2_r2_pa_nopf", base).unwrap();
        assert_eq!(
            (
                c.warps,
                c.ksplit,
                c.unroll,
                c.row_tiles,
                c.prefetch_a,
                c.l2_prefetch
            ),
            (16, Some(8), 2, 2, true, false)
        );
        assert!(parse_gemm_config("w8_fast", base).is_err());
        let st = vec![
            KernelStamps {
                layer: 0,
                role: "a",
                start: 1000,
                wait_first: 1500,
                wait_last: 1600,
                end: 5000,
            },
            KernelStamps {
                layer: 0,
                role: "b",
                start: 4000,
                wait_first: 5100,
                wait_last: 5200,
                end: 9000,
            },
        ];
        let r = timeline_rows(&st);
        assert_eq!(r[0].start_us, 0.0);
        assert_eq!(r[1].start_us, 3.0);
        assert_eq!(r[1].overlap_us, 1.0);
        assert_eq!(r[1].end_us, 8.0);
        let t = timeline_trace(&r, "test").unwrap();
        assert_eq!(t.tracks.len(), 2);
        // Both kernels have a pre-wait span and a kernel span.
        assert_eq!(t.spans.len(), 4);
        assert_eq!(t.extent_us(), (0.0, 8.0));
    }
}
