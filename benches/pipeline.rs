//! The batch pipeline (16 batches of 2^24 floats, C = A + B) with 1, 2, 3, 4 streams next to the
//! pinned H2D bandwidth measured in the same run. Figure: bytes over PCIe (both directions) per
//! second; its upper limit is 1.5 x H2D because two of every three bytes go host to device.
//! Also in the same run (issue 12): the CUDA C++ pattern (buffers allocated once per stream, no
//! per-stage events; `pipeline::cxx_pattern_vector_add`) and the tail-split schedules, so both
//! ratios (x 1.5 H2D and x C++ pattern) are reported. `WARPLINE_PIPELINE_TAIL=B,P` adds a split
//! of the last B batches into P pieces to the table. Last, a zero-copy probe: the same traffic
//! moved by the SMs' own loads and stores of pinned host memory, alone and next to a copy-engine
//! H2D, to see whether anything beats the copy engines' both-directions ceiling.

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
    zero_copy_probe(&dev, h2d);
}

/// Issue 12 probe: PCIe moved by the SMs themselves (zero-copy: kernels dereference pinned host
/// memory, mapped at the same address under unified addressing) next to the copy engines, same
/// run. `vector_add_flat_v1` with 2^26 floats per operand (256 MiB), best of 5 each:
/// - `zc read`: A, B pinned host, C device: 512 MiB host -> device;
/// - `zc write`: A, B device, C pinned host: 256 MiB device -> host;
/// - `zc all`: A, B, C pinned host: the whole pipeline's traffic in one kernel;
/// - `H2D copy + zc write`: a 512 MiB copy-engine H2D on one stream while the `zc write` kernel
///   runs on another (the pipeline with its D2H done by the kernel's stores).
fn zero_copy_probe(dev: &warpline::Device, h2d: f64) {
    use warpline::kernels::VectorAddVariant as V;
    use warpline::launch::{launch_raw, LaunchConfig};
    use warpline::{params, MemPool};
    const N: usize = 1 << 26;
    let v = V::FlatV1;
    let kernel = dev.kernel(v.kernel()).unwrap();
    let cfg = LaunchConfig::linear(N.div_ceil(v.tile_elems()) as u32, v.threads(), 0);
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    let pool = MemPool::new(dev, u64::MAX).unwrap();
    let ha = PinnedBuffer::from_slice(dev, &random_f32(N)).unwrap();
    let hb = PinnedBuffer::from_slice(dev, &random_f32(N)).unwrap();
    let mut hc = PinnedBuffer::<f32>::new(dev, N).unwrap();
    let hbig = PinnedBuffer::<f32>::new(dev, 2 * N).unwrap();
    let mut da = pool.alloc_async::<f32>(&s1, N).unwrap();
    let mut db = pool.alloc_async::<f32>(&s1, N).unwrap();
    let dc = pool.alloc_async::<f32>(&s1, N).unwrap();
    let mut dbig = pool.alloc_async::<f32>(&s2, 2 * N).unwrap();
    da.copy_from_host(&ha).unwrap();
    db.copy_from_host(&hb).unwrap();
    s2.synchronize().unwrap();
    let (pha, phb, phc) = (
        ha.as_ptr() as u64,
        hb.as_ptr() as u64,
        hc.as_mut_ptr() as u64,
    );
    let (pda, pdb, pdc) = (da.device_ptr(), db.device_ptr(), dc.device_ptr());
    let launch = |s: &warpline::Stream, a: u64, b: u64, c: u64| {
        // SAFETY: flat_v1's signature (a, b, c, n); every pointer is a live allocation of N
        // floats (pinned host memory is device-accessible at its host address under unified
        // addressing), 16-byte aligned, c distinct from a and b; all are synchronised before
        // they are dropped.
        unsafe { launch_raw(dev, kernel, s, &cfg, &params![a, b, c, N as u64]).unwrap() }
    };
    let best = |f: &mut dyn FnMut() -> f64| (0..5).map(|_| f()).fold(0.0f64, f64::max);
    let timed = |bytes: usize, f: &mut dyn FnMut()| {
        let t0 = s1.record().unwrap();
        s2.wait(&t0).unwrap();
        f();
        let t2 = s2.record().unwrap();
        s1.wait(&t2).unwrap();
        let t1 = s1.record().unwrap();
        s1.synchronize().unwrap();
        bytes as f64 / (t0.elapsed_ms(&t1).unwrap() as f64 * 1e-3) / 1e9
    };
    let read = best(&mut || timed(8 * N, &mut || launch(&s1, pha, phb, pdc)));
    let write = best(&mut || timed(4 * N, &mut || launch(&s1, pda, pdb, phc)));
    let all = best(&mut || timed(12 * N, &mut || launch(&s1, pha, phb, phc)));
    let mixed = best(&mut || {
        timed(12 * N, &mut || {
            // SAFETY: hbig outlives the synchronised streams (dbig is bound to s2).
            unsafe { dbig.copy_from_host_async(&hbig).unwrap() };
            launch(&s1, pda, pdb, phc)
        })
    });
    for i in (0..N).step_by(4093) {
        assert_eq!(hc[i], ha[i] + hb[i], "zero-copy probe c[{i}]");
    }
    // Copy engines only, on three streams: two H2D copies at once, then with a D2H as well.
    let s3 = dev.new_stream().unwrap();
    let mut d1 = pool.alloc_async::<f32>(&s1, N).unwrap();
    let mut d2 = pool.alloc_async::<f32>(&s2, N).unwrap();
    let d3 = pool.alloc_async::<f32>(&s3, N).unwrap();
    s1.synchronize().unwrap();
    let mut three = |bytes: usize, with_d2h: bool| {
        let t0 = s1.record().unwrap();
        s2.wait(&t0).unwrap();
        s3.wait(&t0).unwrap();
        // SAFETY: the host buffers outlive the synchronised streams; each device buffer is
        // bound to the stream its copy runs on.
        unsafe {
            d1.copy_from_host_async(&ha).unwrap();
            d2.copy_from_host_async(&hb).unwrap();
            if with_d2h {
                d3.copy_to_host_async(&mut hc).unwrap();
            }
        }
        for s in [&s2, &s3] {
            let e = s.record().unwrap();
            s1.wait(&e).unwrap();
        }
        let t1 = s1.record().unwrap();
        s1.synchronize().unwrap();
        bytes as f64 / (t0.elapsed_ms(&t1).unwrap() as f64 * 1e-3) / 1e9
    };
    let h2d2 = (0..5).map(|_| three(8 * N, false)).fold(0.0f64, f64::max);
    let h2d2_d2h = (0..5).map(|_| three(12 * N, true)).fold(0.0f64, f64::max);
    println!("\nzero-copy probe (SM-driven PCIe), 2^26 floats per operand, best of 5:");
    println!(
        "  zc read  (512 MiB H2D by loads):  {read:.1} GB/s = {:.3} x copy-engine H2D",
        read / h2d
    );
    println!("  zc write (256 MiB D2H by stores): {write:.1} GB/s");
    println!(
        "  zc all   (A, B, C host, 768 MiB):  {all:.1} GB/s = {:.3} x 1.5 H2D",
        all / (1.5 * h2d)
    );
    println!(
        "  H2D copy 512 MiB + zc write 256 MiB: {mixed:.1} GB/s = {:.3} x 1.5 H2D",
        mixed / (1.5 * h2d)
    );
    println!(
        "copy engines, 3 streams: 2 H2D at once (512 MiB): {h2d2:.1} GB/s = {:.3} x one H2D; \
         with a 256 MiB D2H: {h2d2_d2h:.1} GB/s = {:.3} x 1.5 H2D",
        h2d2 / h2d,
        h2d2_d2h / (1.5 * h2d)
    );
    drop(dbig);
}

criterion_group!(benches, bench);
criterion_main!(benches);
