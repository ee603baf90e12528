//! The batch pipeline (16 batches of 2^24 floats, C = A + B) with 1, 2, 3, 4 streams next to the
//! pinned H2D bandwidth measured in the same run. Figure: bytes over PCIe (both directions) per
//! second; its upper limit is 1.5 x H2D because two of every three bytes go host to device.

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
}

criterion_group!(benches, bench);
criterion_main!(benches);
