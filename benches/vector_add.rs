//! `ws_vector_add` bandwidth at 2^28 floats next to a device-to-device copy (cuMemcpyDtoDAsync) of
//! the same number of floats, measured in the same run. Bytes counted: vector add reads A, B and
//! writes C (12 bytes per element); the copy reads and writes (8 bytes per element).
//!
//! Then every variant of issue 12 (`kernels::VectorAddVariant`, the default
//! first), each checked against the f32 sum once, then timed round-robin with the copy (each
//! round: every variant once, the copy once; medians of `ROUNDS`): one line per variant with ms,
//! GB/s and the ratio to the copy's GB/s from the same rounds; then `ws_vector_add` on other grids
//! (tiles per CTA, `WARPLINE_VA_GRID_ROWS`) in the same rounds.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use warpline::bandwidth::median;
use warpline::kernels::VectorAddVariant as Variant;
use warpline::{kernels, Device, MemPool};
use warpline_suite::support::{gpu_or_skip, random_f32};

const N: usize = 1 << 28;
/// Rounds of the variant table.
const ROUNDS: usize = 30;

struct Setup {
    dev: Device,
    stream: warpline::Stream,
    a: warpline::DeviceBuffer<f32>,
    b: warpline::DeviceBuffer<f32>,
    c: warpline::DeviceBuffer<f32>,
    /// Host copies of A and B, for the variants' check.
    host: (Vec<f32>, Vec<f32>),
}

fn setup() -> Option<Setup> {
    let dev = gpu_or_skip("vector_add bench")?;
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut a = pool.alloc_async::<f32>(&stream, N).unwrap();
    let mut b = pool.alloc_async::<f32>(&stream, N).unwrap();
    let c = pool.alloc_async::<f32>(&stream, N).unwrap();
    let host = (random_f32(N), random_f32(N));
    a.copy_from_host(&host.0).unwrap();
    b.copy_from_host(&host.1).unwrap();
    Some(Setup {
        dev,
        stream,
        a,
        b,
        c,
        host,
    })
}

/// Milliseconds of what `f` queues on the stream, timed with events.
fn timed(s: &mut Setup, f: impl FnOnce(&mut Setup)) -> f64 {
    let t0 = s.stream.record().unwrap();
    f(s);
    let t1 = s.stream.record().unwrap();
    t0.elapsed_ms(&t1).unwrap() as f64
}

/// Milliseconds of one default vector add: `ws_vector_add` on `kernels::vector_add`'s grid.
fn add_ms(s: &mut Setup) -> f64 {
    variant_ms(s, Variant::WarpSpecialized, None)
}

/// Milliseconds of one launch of `v` on `grid` CTAs (default: the variant's own grid).
fn variant_ms(s: &mut Setup, v: Variant, grid: Option<u32>) -> f64 {
    timed(s, |s| {
        let g = grid.unwrap_or_else(|| v.grid(&s.dev, N));
        kernels::vector_add_variant_with_grid(
            &s.dev,
            &s.stream,
            v,
            s.a.as_view(),
            s.b.as_view(),
            s.c.as_view_mut(),
            g,
        )
        .unwrap()
    })
}

/// Runs `v` once on a NaN-poisoned C and compares every element with the f32 sum.
fn check_variant(s: &mut Setup, v: Variant) {
    s.c.fill_async(f32::NAN).unwrap();
    variant_ms(s, v, None);
    let mut c = vec![0f32; N];
    s.c.copy_to_host(&mut c).unwrap();
    let (a, b) = &s.host;
    if let Some(i) = (0..N).find(|&i| c[i] != a[i] + b[i]) {
        panic!("{}: c[{i}] = {}, want {}", v.name(), c[i], a[i] + b[i]);
    }
}

/// Milliseconds of one D2D copy of N floats (A -> C), timed with events.
fn copy_ms(s: &mut Setup) -> f64 {
    timed(s, |s| s.c.copy_from_device(&s.a).unwrap())
}

fn bench(c: &mut Criterion) {
    let Some(mut s) = setup() else { return };
    add_ms(&mut s);
    copy_ms(&mut s);
    let mut g = c.benchmark_group("vector_add_2^28");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Bytes((12 * N) as u64));
    g.bench_function("ws_vector_add", |bch| {
        bch.iter_custom(|iters| {
            Duration::from_secs_f64((0..iters).map(|_| add_ms(&mut s)).sum::<f64>() * 1e-3)
        })
    });
    g.throughput(Throughput::Bytes((8 * N) as u64));
    g.bench_function("d2d_copy", |bch| {
        bch.iter_custom(|iters| {
            Duration::from_secs_f64((0..iters).map(|_| copy_ms(&mut s)).sum::<f64>() * 1e-3)
        })
    });
    g.finish();

    // Side by side, interleaved so both see the same machine state; medians of 30.
    let (mut adds, mut copies) = (Vec::new(), Vec::new());
    for _ in 0..30 {
        adds.push(add_ms(&mut s));
        copies.push(copy_ms(&mut s));
    }
    let add = median(&mut adds).expect("30 samples");
    let copy = median(&mut copies).expect("30 samples");
    let add_gbps = 12.0 * N as f64 / (add * 1e-3) / 1e9;
    let copy_gbps = 8.0 * N as f64 / (copy * 1e-3) / 1e9;
    println!(
        "\n{:<28} {:>10} {:>10}",
        "2^28 floats (median of 30)", "ms", "GB/s"
    );
    println!(
        "{:<28} {:>10.3} {:>10.1}",
        "ws_vector_add (12 B/elem)", add, add_gbps
    );
    println!(
        "{:<28} {:>10.3} {:>10.1}",
        "D2D copy (8 B/elem)", copy, copy_gbps
    );
    println!(
        "ratio ws_vector_add / D2D copy bandwidth: {:.3}",
        add_gbps / copy_gbps
    );

    variants(&mut s);
}

/// The issue-12 table: every variant next to the copy, round-robin in the same rounds; then
/// variants on other grids: `WARPLINE_VA_GRID_ROWS`, comma-separated `name:m` (m x the variant's
/// grid) or `name/k` (k tiles per CTA); default `ws_vector_add/1,ws_vector_add/4` (the default
/// grid is 2 tiles per CTA).
fn variants(s: &mut Setup) {
    let extra = std::env::var("WARPLINE_VA_GRID_ROWS")
        .unwrap_or_else(|_| "ws_vector_add/1,ws_vector_add/4".to_string());
    let mut rows: Vec<(String, Variant, Option<u32>)> = Variant::ALL
        .into_iter()
        .map(|v| (v.name().to_string(), v, None))
        .collect();
    for spec in extra.split(',').filter(|s| !s.is_empty()) {
        fn bad<T>(spec: &str) -> T {
            panic!("WARPLINE_VA_GRID_ROWS: `{spec}` is not `name:m` or `name/k` (variant name, m, k >= 1)")
        }
        let i = spec.find([':', '/']).unwrap_or_else(|| bad(spec));
        let (name, per_cta, x) = (&spec[..i], &spec[i..=i] == "/", &spec[i + 1..]);
        let v = Variant::ALL
            .into_iter()
            .find(|v| v.name() == name)
            .unwrap_or_else(|| bad(spec));
        let x: u32 = x
            .parse()
            .ok()
            .filter(|&x| x > 0)
            .unwrap_or_else(|| bad(spec));
        let tiles = N.div_ceil(v.tile_elems()) as u32;
        let g = if per_cta {
            tiles.div_ceil(x)
        } else {
            (x * v.grid(&s.dev, N)).min(tiles)
        };
        rows.push((format!("{spec} grid {g}"), v, Some(g)));
    }
    for v in Variant::ALL {
        check_variant(s, v);
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut copies = Vec::new();
    for _ in 0..3 {
        // Warm-up round.
        for (_, v, g) in &rows {
            variant_ms(s, *v, *g);
        }
        copy_ms(s);
    }
    for _ in 0..ROUNDS {
        for (k, (_, v, g)) in rows.iter().enumerate() {
            times[k].push(variant_ms(s, *v, *g));
        }
        copies.push(copy_ms(s));
    }
    let copy = median(&mut copies).expect("samples were taken");
    let copy_gbps = 8.0 * N as f64 / (copy * 1e-3) / 1e9;
    println!(
        "\nissue 12: 2^28 floats, median of {ROUNDS} round-robin rounds (all variants checked exactly)"
    );
    println!(
        "{:<30} {:>8} {:>10} {:>10}",
        "variant", "ms", "GB/s", "x D2D"
    );
    println!(
        "{:<30} {:>8.3} {:>10.1} {:>10.3}",
        "D2D copy (8 B/elem)", copy, copy_gbps, 1.0
    );
    for (k, (name, _, _)) in rows.iter().enumerate() {
        let ms = median(&mut times[k]).expect("samples were taken");
        let gbps = 12.0 * N as f64 / (ms * 1e-3) / 1e9;
        println!(
            "{:<30} {:>8.3} {:>10.1} {:>10.3}",
            name,
            ms,
            gbps,
            gbps / copy_gbps
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
