//! Attention forward throughput (`Attention`, kernels `attention_fwd_*`, issue 23) on the issue's
//! shapes `B x H x S x D`: 16 x 16 x 2048 x 128, 4 x 16 x 8192 x 128, 16 x 32 x 2048 x 64, causal
//! and not, BF16 (`WARPLINE_ATTN_DTYPE=fp16` for FP16; `WARPLINE_ATTN_SHAPES=BxHxSxD,...` for
//! other shapes; `WARPLINE_ATTN_VARIANTS=1` adds rows with the consumer ping-pong off and with
//! the in-warpgroup overlap off).
//! Layout `[B, S, H, D]`, `HK = H`, scale `1 / sqrt(D)`.
//!
//! cuDNN is the reference: `scripts/torch_attention.py` runs torch SDPA with the cuDNN backend on
//! the same shapes and prints rows in this format. After its own rows the bench runs that script
//! (`python3`, or `$WARPLINE_PYTHON`; `WARPLINE_ATTN_TORCH=0` skips it) in the same GPU session,
//! once the GPU is idle, and prints warpline / cuDNN per shape; without torch it says why and
//! ends normally. By hand:
//!
//! ```text
//! cargo bench --bench attention && python3 scripts/torch_attention.py
//! ```
//!
//! TFLOP/s counts FLOPs as FlashAttention does: `4 B H S^2 D`, halved for causal. Per shape,
//! after warm-up (`WARM_MS` of launches), `REPS` rounds each time `BATCH` launches of a prepared
//! plan (CUDA events around the batch, no tensor-map upload timed); the row is the median. A spot
//! check of 32 rows of (batch 0, head 0) against the f64 reference guards against timing a wrong
//! kernel. Without a driver, or on a device other than compute capability 9.0, it prints why it
//! skipped and exits 0.

use rand::{Rng, SeedableRng};
use warpline::kernels::attention::reference::{
    attention_f64, max_abs_error, PRounding, RefProblem,
};
use warpline::kernels::attention::{
    Attention, AttentionOptions, AttentionProblem, AttentionTensors, AttnElement,
};
use warpline::{bf16, f16, Device, DeviceBuffer, MemPool, Stream};
use warpline_suite::support::gpu_or_skip;

const REPS: usize = 15;
const BATCH: usize = 10;
/// Milliseconds of launches before each shape's timed rounds, to settle the clocks.
const WARM_MS: f64 = 300.0;

fn median_ms(
    stream: &Stream,
    mut launch: impl FnMut() -> warpline::Result<()>,
) -> warpline::Result<f64> {
    let warm = std::time::Instant::now();
    while warm.elapsed().as_secs_f64() * 1e3 < WARM_MS {
        launch()?;
        stream.synchronize()?;
    }
    let mut t = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let start = stream.record()?;
        for _ in 0..BATCH {
            launch()?;
        }
        let end = stream.record()?;
        end.synchronize()?;
        t.push(start.elapsed_ms(&end)? as f64 / BATCH as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[REPS / 2])
}

fn random_buffer<T: AttnElement>(
    pool: &MemPool,
    stream: &Stream,
    rng: &mut rand::rngs::StdRng,
    n: usize,
) -> warpline::Result<(DeviceBuffer<T>, Vec<T>)> {
    let host: Vec<T> = (0..n)
        .map(|_| {
            let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.random();
            T::from_f64((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos())
        })
        .collect();
    let mut b = pool.alloc_async::<T>(stream, n)?;
    b.copy_from_host(&host)?;
    Ok((b, host))
}

/// The kernel's structure variants (`AttentionOptions`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Variant {
    Full,
    NoPingpong,
    /// One CTA per tile (`AttentionOptions::no_persistent`).
    NoPersistent,
    /// Bounds-checked stores instead of the TMA-store epilogue.
    NoTmaStore,
    NoOverlap,
}

/// Rows without the ping-pong and without the in-warpgroup overlap too
/// (`WARPLINE_ATTN_VARIANTS=1`), to measure what each brings.
fn variant_rows() -> bool {
    std::env::var("WARPLINE_ATTN_VARIANTS").is_ok_and(|v| v == "1")
}

fn shapes() -> Vec<[usize; 4]> {
    match std::env::var("WARPLINE_ATTN_SHAPES") {
        Ok(v) => v
            .split(',')
            .map(|s| {
                warpline_suite::support::parse_dims::<4>(s)
                    .expect("WARPLINE_ATTN_SHAPES: BxHxSxD,...")
            })
            .collect(),
        Err(_) => vec![[16, 16, 2048, 128], [4, 16, 8192, 128], [16, 32, 2048, 64]],
    }
}

/// Head `head` of `[B, S, H, D]` batch 0 as `[S, 1, D]` f64.
fn head_of<T: AttnElement>(x: &[T], s: usize, h: usize, d: usize, head: usize) -> Vec<f64> {
    (0..s)
        .flat_map(|r| x[(r * h + head) * d..][..d].iter().map(|v| v.to_f64()))
        .collect()
}

/// One timed row: shape, causal, TFLOP/s.
type Row = ([usize; 4], bool, f64);

/// Runs `scripts/torch_attention.py --csv` on the same shapes and prints warpline / cuDNN for
/// each of `rows`; says why when the script cannot run.
fn compare_with_cudnn(rows: &[Row], dtype: &str) {
    if std::env::var("WARPLINE_ATTN_TORCH").is_ok_and(|v| v == "0") {
        return;
    }
    let mut shapes: Vec<String> = rows
        .iter()
        .map(|(s, _, _)| format!("{}x{}x{}x{}", s[0], s[1], s[2], s[3]))
        .collect();
    shapes.dedup();
    let python = std::env::var("WARPLINE_PYTHON").unwrap_or_else(|_| "python3".into());
    // The checkout's script, else one under the working directory (a gpu-bundle run).
    let built = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/torch_attention.py");
    let script = if std::path::Path::new(built).exists() {
        built
    } else {
        "scripts/torch_attention.py"
    };
    let out = std::process::Command::new(&python)
        .args([
            script,
            "--csv",
            "--dtype",
            dtype,
            "--shapes",
            &shapes.join(","),
        ])
        .output();
    let text = match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).to_string(),
        Ok(o) => {
            println!(
                "cuDNN reference: {script} failed: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            return;
        }
        Err(e) => {
            println!("cuDNN reference: SKIPPED ({python} {script}: {e})");
            return;
        }
    };
    let mut cudnn = Vec::new();
    for line in text.lines() {
        if line.starts_with("SKIPPED") || line.contains("SKIPPED (") {
            println!("cuDNN reference: {line}");
        }
        let f: Vec<&str> = line.split(',').collect();
        if f.len() == 9 && f[0] == "csv" && f[6] == "cuDNN" {
            let n = |i: usize| f[i].parse::<usize>().unwrap_or(0);
            cudnn.push((
                [n(1), n(2), n(3), n(4)],
                f[5] == "true",
                f[8].parse::<f64>().unwrap_or(f64::NAN),
            ));
        }
    }
    println!(
        "{:>22} {:>7} {:>10} {:>10} {:>8}   (cuDNN: torch SDPA, same session)",
        "B x H x S x D", "causal", "warpline", "cuDNN", "ratio"
    );
    for (shape, causal, ours) in rows {
        let theirs = cudnn
            .iter()
            .find(|(s, c, _)| s == shape && c == causal)
            .map_or(f64::NAN, |r| r.2);
        println!(
            "{:>22} {:>7} {ours:>10.1} {theirs:>10.1} {:>8.3}",
            format!("{} x {} x {} x {}", shape[0], shape[1], shape[2], shape[3]),
            causal,
            ours / theirs
        );
    }
}

fn run<T: AttnElement>(dev: &Device) -> warpline::Result<()> {
    let caps = dev.capabilities();
    println!("device: {} ({} SMs), {}", caps.name, caps.sm_count, T::NAME);
    let att = Attention::new(dev)?;
    let stream = dev.new_stream()?;
    let pool = MemPool::new(dev, 0)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    println!(
        "{:>22} {:>7} {:>10} {:>10} {:>10}",
        "B x H x S x D", "causal", "kernel", "ms", "TFLOP/s"
    );
    let mut rows: Vec<Row> = Vec::new();
    for [b, h, s, d] in shapes() {
        let n = b * s * h * d;
        let (dq, hq) = random_buffer::<T>(&pool, &stream, &mut rng, n)?;
        let (dk, hk) = random_buffer::<T>(&pool, &stream, &mut rng, n)?;
        let (dv, hv) = random_buffer::<T>(&pool, &stream, &mut rng, n)?;
        let mut dout = pool.alloc_async::<T>(&stream, n)?;
        let mut dlse = pool.alloc_async::<f32>(&stream, b * h * s)?;
        for (causal, variant) in [
            (false, Variant::Full),
            (true, Variant::Full),
            (false, Variant::NoPingpong),
            (true, Variant::NoPingpong),
            (false, Variant::NoOverlap),
            (true, Variant::NoOverlap),
            (false, Variant::NoPersistent),
            (true, Variant::NoPersistent),
            (false, Variant::NoTmaStore),
            (true, Variant::NoTmaStore),
        ] {
            if variant != Variant::Full && !variant_rows() {
                continue;
            }
            let problem = AttentionProblem::fixed(b, h, s, d, causal);
            let plan = att.plan(
                &stream,
                &problem,
                AttentionTensors {
                    q: dq.as_view(),
                    k: dk.as_view(),
                    v: dv.as_view(),
                    o: dout.as_view_mut(),
                    lse: dlse.as_view_mut(),
                },
                AttentionOptions {
                    pdl: false,
                    no_pingpong: variant == Variant::NoPingpong,
                    no_overlap: variant == Variant::NoOverlap,
                    no_persistent: variant == Variant::NoPersistent,
                    no_tma_store: variant == Variant::NoTmaStore,
                    max_ctas: None,
                    hb_group: std::env::var("WARPLINE_ATTN_HB_GROUP")
                        .ok()
                        .and_then(|v| v.parse().ok()),
                },
            )?;
            let flops = plan.shape().flops();
            let t = median_ms(&stream, || plan.launch())?;
            drop(plan);
            if variant == Variant::Full {
                rows.push(([b, h, s, d], causal, flops / t / 1e9));
            }
            println!(
                "{:>22} {:>7} {:>10} {t:>10.3} {:>10.1}",
                format!("{b} x {h} x {s} x {d}"),
                causal,
                match variant {
                    Variant::Full => "warpline",
                    Variant::NoPingpong => "no-pingpong",
                    Variant::NoOverlap => "no-overlap",
                    Variant::NoPersistent => "no-persistent",
                    Variant::NoTmaStore => "no-tma-store",
                },
                flops / t / 1e9
            );
            // Spot check: 32 rows of (batch 0, head 0) against the exact f64 reference.
            let mut out = vec![T::from_f64(0.0); n];
            dout.copy_to_host(&mut out)?;
            let (q0, k0, v0) = (
                head_of(&hq, s, h, d, 0),
                head_of(&hk, s, h, d, 0),
                head_of(&hv, s, h, d, 0),
            );
            let rp = RefProblem {
                q: &q0,
                k: &k0,
                v: &v0,
                cu_q: &[0, s],
                cu_k: &[0, s],
                heads: 1,
                kv_heads: 1,
                head_dim: d,
                causal,
                scale: 1.0 / (d as f64).sqrt(),
                row_step: s.div_ceil(32) | 1,
            };
            let (want, _) = attention_f64(&rp, PRounding::Exact);
            let got = head_of(&out, s, h, d, 0);
            let (g, w): (Vec<f64>, Vec<f64>) = got
                .iter()
                .zip(&want)
                .filter(|(_, w)| !w.is_nan())
                .map(|(g, w)| (*g, *w))
                .unzip();
            let err = max_abs_error(&g, &w);
            // Several BF16 roundings of P and O at |O| < 1 (the tests hold the exact rule).
            if err > 2e-2 {
                println!("{b} x {h} x {s} x {d} causal={causal}: MISMATCH, max error {err:e}");
                std::process::exit(1);
            }
        }
    }
    // The GPU is idle from here: the buffers above are freed; the script has it to itself.
    stream.synchronize()?;
    compare_with_cudnn(&rows, if T::NAME == "bf16" { "bf16" } else { "fp16" });
    Ok(())
}

fn main() {
    let Some(dev) = gpu_or_skip("bench attention") else {
        return;
    };
    if dev.capabilities().compute_capability != (9, 0) {
        eprintln!("SKIPPED bench attention: not a compute capability 9.0 device (sm_90a)");
        return;
    }
    let r = match std::env::var("WARPLINE_ATTN_DTYPE").as_deref() {
        Ok("fp16") | Ok("f16") => run::<f16>(&dev),
        _ => run::<bf16>(&dev),
    };
    if let Err(e) = r {
        eprintln!("bench attention: {e}");
        std::process::exit(1);
    }
}
