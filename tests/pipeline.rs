//! The multi-stream batch pipeline end to end on the GPU: 1, 2 and 3 streams, an uneven last
//! batch, output NaN-poisoned first, every element against the f64 reference (bound 2^-23).

use approx::relative_eq;
use warpline::{reference, BatchPipeline, PinnedBuffer};
use warpline_suite::support::{gpu_or_skip, random_f32};

#[test]
fn pipeline_matches_reference_with_1_2_3_streams_and_uneven_last_batch() {
    let Some(dev) = gpu_or_skip("pipeline") else {
        return;
    };
    let batch = 100_003;
    let n = 5 * batch + 77; // 6 batches, the last of 77 elements
    let a = PinnedBuffer::from_slice(&dev, &random_f32(n)).unwrap();
    let b = PinnedBuffer::from_slice(&dev, &random_f32(n)).unwrap();
    let want = reference::vector_add(&a, &b);
    for streams in 1..=3 {
        let mut c = PinnedBuffer::<f32>::new(&dev, n).unwrap();
        c.fill(f32::NAN);
        let pipe = BatchPipeline::new(&dev, streams).unwrap();
        let mut seen = 0;
        let report = pipe
            .run_vector_add(&a, &b, &mut c, batch, |done, total| {
                assert_eq!(total, 6);
                seen = done;
            })
            .unwrap();
        assert_eq!(seen, 6);
        assert_eq!(report.batches.len(), 6);
        assert_eq!(report.batches[5].elems, 77);
        assert_eq!(
            report.batches.iter().map(|t| t.stream).collect::<Vec<_>>(),
            (0..6).map(|i| i % streams).collect::<Vec<_>>()
        );
        assert_eq!(report.bytes_h2d, 2 * 4 * n as u64);
        assert!(report.span_ms > 0.0 && report.pcie_gbps() > 0.0);
        for (i, (&g, &w)) in c.iter().zip(&want).enumerate() {
            assert!(
                relative_eq!(
                    g as f64,
                    w,
                    epsilon = 0.0,
                    max_relative = reference::VECTOR_ADD_REL_BOUND
                ),
                "{streams} streams: c[{i}] = {g}, f64 reference {w}"
            );
        }
    }
}
