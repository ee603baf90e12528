//! Two GPUs (issue 13): device set, peer copies, the layer pipeline and NCCL all-reduce against
//! CPU results. Every test skips with the reason when there are fewer than 2 GPUs
//! (`WARPLINE_REQUIRE_GPUS=2` makes the skip a failure); the NCCL tests also skip, with the reason,
//! when no libnccl can be loaded.

use std::time::{Duration, Instant};

use warpline::multi::bench::{
    all_reduce_sweep, data_parallel_step, data_parallel_step_with, peer_copy_bandwidth,
    DataParallelConfig,
};
use warpline::multi::nccl::{self, Communicator};
use warpline::multi::{check_ordinals, DeviceSet, LayerPipeline, LayerPipelineConfig, Placement};
use warpline::{Error, MemPool};
use warpline_suite::support::{random_f32, skip, two_gpus_or_skip};

#[test]
fn ordinals_are_checked_without_a_gpu() {
    assert!(matches!(check_ordinals(&[], 2), Err(Error::Empty { .. })));
    assert!(matches!(
        check_ordinals(&[0, 0], 2),
        Err(Error::BadShape { .. })
    ));
    assert!(matches!(
        check_ordinals(&[0, 2], 2),
        Err(Error::NoDevice { ordinal: 2, .. })
    ));
    assert!(check_ordinals(&[1, 0], 2).is_ok());
}

#[test]
fn nccl_id_hex_round_trips_and_bad_text_is_refused() {
    let id = nccl::NcclId([7u8; 128]);
    assert_eq!(nccl::NcclId::from_hex(&id.to_hex()).unwrap(), id);
    assert!(matches!(
        nccl::NcclId::from_hex("00"),
        Err(Error::BadShape { .. })
    ));
    assert!(matches!(
        nccl::NcclId::from_hex(&"zz".repeat(128)),
        Err(Error::BadShape { .. })
    ));
}

#[test]
fn missing_nccl_is_a_typed_error_not_a_panic() {
    // Without libnccl (CI), every entry point returns NcclUnavailable; with it, a version.
    match nccl::version() {
        Ok(v) => assert!(v > 0),
        Err(Error::NcclUnavailable { tried, hint }) => {
            assert!(tried.contains("libnccl.so"), "{tried}");
            assert!(hint.contains(nccl::NCCL_LIB_ENV), "{hint}");
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn device_set_peer_matrix_and_peer_copy_match_the_cpu() {
    let Some(set) = two_gpus_or_skip("device_set_peer_matrix_and_peer_copy_match_the_cpu") else {
        return;
    };
    let m = set.peer_matrix();
    assert!(m[0][0] && m[1][1]);
    assert!(
        m[0][1] && m[1][0],
        "the two-GPU machine has NVLink peer access"
    );
    // Again: PEER_ACCESS_ALREADY_ENABLED is not an error.
    let again = DeviceSet::open(&[0, 1]).unwrap();
    assert_eq!(again.peer_matrix(), m);
    let n = (1 << 22) + 3;
    let host = random_f32(n);
    let (s0, s1) = (
        set.device(0).unwrap().new_stream().unwrap(),
        set.device(1).unwrap().new_stream().unwrap(),
    );
    let (p0, p1) = (set.pool(0, 0).unwrap(), set.pool(1, 0).unwrap());
    let mut a = p0.alloc_async::<f32>(&s0, n).unwrap();
    a.copy_from_host(&host).unwrap();
    let mut b = p1.alloc_async::<f32>(&s1, n).unwrap();
    b.fill_async(0.0).unwrap();
    let comm = set.high_priority_stream(0).unwrap();
    set.copy_peer(&comm, &a, &mut b).unwrap();
    let mut back = vec![0f32; n];
    b.copy_to_host(&mut back).unwrap();
    assert_eq!(back, host);
    // And back the other way on the destination's own stream.
    let mut c = p0.alloc_async::<f32>(&s0, n).unwrap();
    let s1c = b.stream().clone();
    set.copy_peer(&s1c, &b, &mut c).unwrap();
    let mut back2 = vec![0f32; n];
    c.copy_to_host(&mut back2).unwrap();
    assert_eq!(back2, host);
    // A length mismatch is refused before anything is queued.
    let mut short = p1.alloc_async::<f32>(&s1, n - 1).unwrap();
    assert!(matches!(
        set.copy_peer(&comm, &a, &mut short),
        Err(Error::LengthMismatch { .. })
    ));
    // Default-pool memory of another process-wide pool still copies (grant covers set pools).
    let _ = MemPool::default_pool_release_threshold(set.device(0).unwrap()).unwrap();
    let bw = peer_copy_bandwidth(&set, 0, 1, 64 << 20, 4).unwrap();
    assert!(bw.one_way > 1.0 && bw.both_ways > 1.0, "{bw:?}");
}

/// Runs `f` on a small layer pipeline (8 tiles, 3 layers, 3 slots) of each placement over GPUs
/// 0 and 1, or prints a skip.
fn each_layer_pipeline(
    test: &str,
    mut f: impl FnMut(Placement, &LayerPipelineConfig, &mut LayerPipeline<'_>),
) {
    let Some(set) = two_gpus_or_skip(test) else {
        return;
    };
    let cfg = LayerPipelineConfig {
        tiles: 8,
        layers: 3,
        slots: 3,
    };
    for placement in [Placement::TwoGpus, Placement::OneGpu] {
        let mut p = LayerPipeline::new(&set, 0, 1, placement, cfg).unwrap();
        f(placement, &cfg, &mut p);
    }
}

#[test]
fn layer_pipeline_two_gpus_and_one_gpu_match_the_cpu() {
    each_layer_pipeline(
        "layer_pipeline_two_gpus_and_one_gpu_match_the_cpu",
        |placement, _, p| {
            let r = p.run(10, true).unwrap();
            assert!(r.max_rel_error.unwrap() < 1e-4, "{placement:?}: {r:?}");
        },
    );
}

#[test]
fn layer_pipeline_graph_replay_equals_the_eager_run_and_the_cpu() {
    let test = "layer_pipeline_graph_replay_equals_the_eager_run_and_the_cpu";
    each_layer_pipeline(test, |placement, cfg, p| {
        let eager = p.run(10, true).unwrap();
        assert!(!eager.graphs && !p.has_graphs());
        assert!(
            eager.max_rel_error.unwrap() < 1e-4,
            "{placement:?}: {eager:?}"
        );
        let want: Vec<Vec<f32>> = p.outputs().unwrap().iter().map(|o| o.to_vec()).collect();
        p.capture_graphs().unwrap();
        assert!(p.has_graphs());
        // Replayed from the per-GPU graphs: against the f64 CPU reference (first and last tile
        // of every slot), then every element of every slot against the eager run, bit for bit.
        let replay = p.run(10, true).unwrap();
        assert!(replay.graphs, "{placement:?}: {replay:?}");
        assert!(
            replay.max_rel_error.unwrap() < 1e-4,
            "{placement:?}: {replay:?}"
        );
        let got = p.outputs().unwrap();
        assert_eq!(got.len(), cfg.slots);
        for (s, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                g.iter().any(|&v| v != 0.0),
                "{placement:?} slot {s}: all zero"
            );
            let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "{placement:?} slot {s}: graph replay differs from eager"
            );
        }
        // Captured again (replaces the graphs), then released: eager again, same results.
        p.capture_graphs().unwrap();
        p.release_graphs();
        let again = p.run(4, true).unwrap();
        assert!(!again.graphs && again.max_rel_error.unwrap() < 1e-4);
        // The library path the CLI uses: eager then graphs, compared bit for bit.
        let (e, g) = p.run_eager_then_graphs(5, true).unwrap();
        assert!(
            !e.graphs && g.graphs && g.graph_matches_eager == Some(true),
            "{g:?}"
        );
    });
}

/// Two GPUs and an `init_all` set on them, or a printed skip.
fn set_and_comms_or_skip(test: &str) -> Option<(DeviceSet, Vec<Communicator>)> {
    let set = two_gpus_or_skip(test)?;
    let comms = comms_or_skip(test, &set)?;
    Some((set, comms))
}

fn comms_or_skip(test: &str, set: &DeviceSet) -> Option<Vec<Communicator>> {
    if let Err(e) = nccl::library_available() {
        skip(test, e);
        return None;
    }
    let streams: Vec<_> = (0..set.len())
        .map(|i| set.high_priority_stream(i).unwrap())
        .collect();
    Some(Communicator::init_all(set, &streams).unwrap())
}

/// One buffer of `n` floats per rank, on the rank's GPU and stream, filled by `fill(rank, buf)`.
fn rank_buffers(
    set: &DeviceSet,
    comms: &[Communicator],
    n: usize,
    fill: impl Fn(usize, &mut warpline::DeviceBuffer<f32>),
) -> Vec<warpline::DeviceBuffer<f32>> {
    comms
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let pool = set.pool(r, 0).unwrap();
            let mut b = pool.alloc_async::<f32>(c.stream(), n).unwrap();
            fill(r, &mut b);
            b
        })
        .collect()
}

#[test]
fn all_reduce_matches_the_cpu_sum() {
    let test = "all_reduce_matches_the_cpu_sum";
    let Some((set, comms)) = set_and_comms_or_skip(test) else {
        return;
    };
    assert_eq!(std::env::var("NCCL_NVLS_ENABLE").unwrap(), "0");
    let n = 1_000_003;
    let data: Vec<Vec<f32>> = (0..2).map(|_| random_f32(n)).collect();
    let mut bufs = rank_buffers(&set, &comms, n, |r, b| b.copy_from_host(&data[r]).unwrap());
    let mut refs: Vec<_> = bufs.iter_mut().collect();
    nccl::all_reduce_sum_group(&comms, &mut refs).unwrap();
    for b in &bufs {
        let mut got = vec![0f32; n];
        b.copy_to_host(&mut got).unwrap();
        for i in 0..n {
            let want = data[0][i] + data[1][i];
            assert!(
                (got[i] - want).abs() <= 1e-6 * want.abs().max(1.0),
                "{i}: {} vs {want}",
                got[i]
            );
        }
    }
    // The sweep verifies its first size too; keep it small here.
    let pts = all_reduce_sweep(&set, &comms, &[1 << 20, 16 << 20], 3).unwrap();
    assert_eq!(pts.len(), 2);
    let r = data_parallel_step(&set, &comms, 3, 16, 1, 2).unwrap();
    assert!(r.overlapped_ms > 0.0 && r.ideal_ms() > 0.0, "{r:?}");
}

#[test]
fn collectives_of_an_init_all_set_need_the_whole_set() {
    let test = "collectives_of_an_init_all_set_need_the_whole_set";
    let Some((set, comms)) = set_and_comms_or_skip(test) else {
        return;
    };
    let n = 1000;
    let mut bufs = rank_buffers(&set, &comms, n, |r, b| {
        b.fill_async(r as f32 + 1.0).unwrap()
    });
    // One rank alone would wait for the other forever: refused before NCCL.
    // SAFETY: refused before any NCCL call (the rank belongs to an init_all set of two).
    let e = unsafe { comms[0].all_reduce_sum(&mut bufs[0]) }.unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    // Half of the set: refused (the missing rank would never join).
    let e = nccl::all_reduce_sum_group(&comms[..1], &mut [&mut bufs[0]]).unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    // The whole set, in either order: 1 + 2 on both ranks.
    let (b0, b1) = bufs.split_at_mut(1);
    let rev: Vec<_> = comms.into_iter().rev().collect();
    nccl::all_reduce_sum_group(&rev, &mut [&mut b1[0], &mut b0[0]]).unwrap();
    for b in &bufs {
        let mut host = vec![0f32; n];
        b.copy_to_host(&mut host).unwrap();
        assert!(host.iter().all(|&v| v == 3.0), "1 + 2 on both ranks");
    }
}

#[test]
fn dp_step_graph_replay_equals_the_eager_step_and_the_cpu() {
    let test = "dp_step_graph_replay_equals_the_eager_step_and_the_cpu";
    let Some((set, comms)) = set_and_comms_or_skip(test) else {
        return;
    };
    let cfg = DataParallelConfig {
        buckets: 3,
        tiles: 16,
        layers: 2,
        steps: 2,
        graphs: true,
        verify: true,
    };
    let r = data_parallel_step_with(&set, &comms, &cfg).unwrap();
    // Every bucket of both GPUs equals the f64 CPU sum over GPUs of x_i w_i (eager and graph
    // steps), and the graph-replayed buckets equal the eager ones bit for bit.
    assert!(r.max_rel_error.unwrap() < 1e-4, "{r:?}");
    assert_eq!(r.graph_matches_eager, Some(true), "{r:?}");
    assert!(
        r.graph_overlapped_ms.unwrap() > 0.0 && r.graph_compute_ms.unwrap() > 0.0,
        "{r:?}"
    );
    // Without graphs nothing graph-related is reported.
    let eager = data_parallel_step_with(
        &set,
        &comms,
        &DataParallelConfig {
            graphs: false,
            ..cfg
        },
    )
    .unwrap();
    assert!(eager.graph_overlapped_ms.is_none() && eager.graph_matches_eager.is_none());
    assert!(eager.max_rel_error.unwrap() < 1e-4);
}

#[test]
fn init_rank_times_out_and_aborts_when_the_other_rank_never_joins() {
    let test = "init_rank_times_out_and_aborts_when_the_other_rank_never_joins";
    let Some(set) = two_gpus_or_skip(test) else {
        return;
    };
    if let Err(e) = nccl::library_available() {
        skip(test, e);
        return;
    }
    // Rank 0 of 2 joins; rank 1 never does. Before: ncclCommInitRank blocked forever.
    let id = nccl::NcclId::new().unwrap();
    let stream = set.high_priority_stream(0).unwrap();
    let t0 = Instant::now();
    let r = Communicator::init_rank_with_timeout(
        set.device(0).unwrap(),
        &stream,
        0,
        2,
        &id,
        Duration::from_secs(3),
    );
    let took = t0.elapsed();
    match r {
        Err(Error::NcclTimeout {
            call,
            rank: 0,
            world: 2,
            waited,
            env,
            ..
        }) => {
            assert_eq!(call, "ncclCommInitRankConfig");
            assert_eq!(env, nccl::INIT_TIMEOUT_ENV);
            assert!(waited >= Duration::from_secs(3), "{waited:?}");
        }
        other => panic!("expected NcclTimeout, got {other:?}"),
    }
    assert!(took < Duration::from_secs(60), "abort took {took:?}");
    // A zero bound is refused before NCCL is called.
    assert!(matches!(
        Communicator::init_rank_with_timeout(
            set.device(0).unwrap(),
            &stream,
            0,
            2,
            &id,
            Duration::ZERO
        ),
        Err(Error::BadShape { .. })
    ));
}

/// Issue 19 item 9 (review): a `Communicator` dropped inside a task graph host callback used to
/// drain its stream and call `ncclCommAbort` on the driver's callback thread, where CUDA calls
/// are forbidden. Now the drop runs on a thread of its own: the run completes, and the
/// communicator's GPU stays healthy with no driver error left behind.
#[test]
fn issue19_review_item09_communicator_dropped_in_a_host_callback() {
    let test = "issue19_review_item09_communicator_dropped_in_a_host_callback";
    let Some(dev) = warpline_suite::support::gpu_or_skip(test) else {
        return;
    };
    drop(dev);
    let set = DeviceSet::open(&[warpline_suite::support::device_ordinal()]).unwrap();
    let Some(mut comms) = comms_or_skip(test, &set) else {
        return;
    };
    let held = std::sync::Arc::new(std::sync::Mutex::new(comms.pop()));
    let in_callback = held.clone();
    let mut g = warpline::TaskGraph::new();
    let l = g.lane("l");
    g.host(l, "drops the communicator", move || {
        drop(in_callback.lock().unwrap().take());
    })
    .unwrap();
    let dev = set.get(0).unwrap();
    let s = dev.new_stream().unwrap();
    let run = g.enqueue(dev, std::slice::from_ref(&s), &[]).unwrap();
    let bound = Duration::from_secs(30);
    warpline::ordering::synchronize_timeout(&run, bound, warpline::OnTimeout::Abandon).unwrap();
    assert!(held.lock().unwrap().is_none(), "the callback did not run");
    // Time for the drop's thread to drain the communicator's (idle) stream and abort it.
    std::thread::sleep(Duration::from_millis(200));
    s.synchronize().unwrap();
    warpline::memory::reaper::flush();
    assert!(dev.take_deferred_errors().is_empty());
    dev.check_healthy().unwrap();
}
