//! The batch pipeline (16 batches of 2^24 floats, C = A + B) with 1, 2, 3, 4 streams next to the
//! pinned H2D bandwidth measured in the same run. Figure: bytes over PCIe (both directions) per
//! second; its upper limit is 1.5 x H2D because two of every three bytes go host to device.
//! Also in the same run (issue 12): the CUDA C++ pattern (buffers allocated once per stream, no
//! per-stage events; `pipeline::cxx_pattern_vector_add`) and the tail-split schedules, so both
//! ratios (x 1.5 H2D and x C++ pattern) are reported. `WARPLINE_PIPELINE_TAIL=B,P` adds a split
//! of the last B batches into P pieces to the table.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use warpline::{bandwidth, BatchPipeline, PinnedBuffer};
use warpline_suite::support::{gpu_or_skip, random_f32};

const BATCH: usize = 1 << 24;
const BATCHES: usize = 16;

fn bench(c: &mut Criterion) {
    let Some(dev) = gpu_or_skip("pipeline bench") else {
        return;
    };
    let n = BATCH * BATCHES;
    let a = PinnedBuffer::from_slice(&dev, &random_f32(n)).unwrap();
    let b = PinnedBuffer::from_slice(&dev, &random_f32(n)).unwrap();
    let mut out = PinnedBuffer::<f32>::new(&dev, n).unwrap();
    let h2d = bandwidth::pinned_h2d_gbps(&dev, 256 << 20, 5).unwrap();
    // Both directions at once in the pipeline's 2 : 1 proportion: what PCIe and the host give
    // a pipeline with no kernels and no gaps.
    let duplex = bandwidth::pinned_duplex_gbps(&dev, 512 << 20, 256 << 20, 5).unwrap();
    let pipes: Vec<BatchPipeline> = (1..=4)
        .map(|s| BatchPipeline::new(&dev, s).unwrap())
        .collect();

    let mut g = c.benchmark_group("pipeline_16x2^24");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Bytes((12 * n) as u64));
    for p in &pipes {
        g.bench_function(format!("{}_streams", p.streams().len()), |bch| {
            bch.iter_custom(|iters| {
                let ms: f64 = (0..iters)
                    .map(|_| {
                        p.run_vector_add(&a, &b, &mut out, BATCH, |_, _| {})
                            .unwrap()
                            .span_ms
                    })
                    .sum();
                Duration::from_secs_f64(ms * 1e-3)
            })
        });
    }
    g.finish();

    println!(
        "\n{:>8} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "streams", "ms", "GB/s", "x 1-stream", "x 1.5 H2D", "overlap"
    );
    let mut one = 0.0;
    for p in &pipes {
        let mut runs: Vec<_> = (0..5)
            .map(|_| {
                p.run_vector_add(&a, &b, &mut out, BATCH, |_, _| {})
                    .unwrap()
            })
            .collect();
        runs.sort_by(|x, y| x.span_ms.total_cmp(&y.span_ms));
        let r = &runs[2];
        if one == 0.0 {
            one = r.pcie_gbps();
        }
        println!(
            "{:>8} {:>10.2} {:>10.1} {:>10.2} {:>12.3} {:>10.2}",
            r.streams,
            r.span_ms,
            r.pcie_gbps(),
            r.pcie_gbps() / one,
            r.pcie_gbps() / (1.5 * h2d),
            r.overlap()
        );
    }
    println!(
        "pinned H2D measured in this run: {h2d:.1} GB/s; 1.5 x H2D = {:.1} GB/s",
        1.5 * h2d
    );

    // 3 streams: the default pipeline, tail splits and the C++ pattern, median of 5 each.
    use warpline::pipeline::{cxx_pattern_vector_add, Schedule};
    let mut tails = vec![(1, 4)];
    if let Some((b, p)) = std::env::var("WARPLINE_PIPELINE_TAIL")
        .ok()
        .and_then(|v| {
            v.split_once(',')
                .map(|(b, p)| (b.parse().ok(), p.parse().ok()))
        })
        .and_then(|(b, p)| Some((b?, p?)))
    {
        tails.push((b, p));
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let cxx = median(
        (0..5)
            .map(|_| {
                cxx_pattern_vector_add(&dev, 3, &a, &b, &mut out, BATCH)
                    .unwrap()
                    .pcie_gbps()
            })
            .collect(),
    );
    println!(
        "both directions at once (512 MiB H2D + 256 MiB D2H): {duplex:.1} GB/s = {:.3} x 1.5 H2D",
        duplex / (1.5 * h2d)
    );
    println!(
        "\n{:>22} {:>10} {:>12} {:>14} {:>12}",
        "3 streams", "GB/s", "x 1.5 H2D", "x C++ pattern", "x duplex"
    );
    let mut rows = vec![
        ("tail 2 x 4".to_string(), Schedule::TAIL_SPLIT),
        ("plain (default)".to_string(), Schedule::PLAIN),
    ];
    for (tb, tp) in tails {
        let s = Schedule {
            tail_batches: tb,
            tail_pieces: tp,
            ..Schedule::default()
        };
        rows.push((format!("tail {tb} x {tp}"), s));
    }
    for (name, sched) in rows {
        let p = BatchPipeline::with_schedule(&dev, 3, sched).unwrap();
        let g = median(
            (0..5)
                .map(|_| {
                    p.run_vector_add(&a, &b, &mut out, BATCH, |_, _| {})
                        .unwrap()
                        .pcie_gbps()
                })
                .collect(),
        );
        println!(
            "{name:>22} {g:>10.1} {:>12.3} {:>14.3} {:>12.3}",
            g / (1.5 * h2d),
            g / cxx,
            g / duplex
        );
    }
    println!(
        "{:>22} {cxx:>10.1} {:>12.3} {:>14.3} {:>12.3}",
        "CUDA C++ pattern",
        cxx / (1.5 * h2d),
        1.0,
        cxx / duplex
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
