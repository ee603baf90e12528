//! Two GPUs, round 2 (issue 24): no whole-context waits in `multi`, no half-launched NCCL group,
//! communicators on non-primary contexts, and the collectives mode switch.
//!
//! Every GPU test runs its body in a child process of this binary (an `#[ignore]`d test started
//! by `support::run_child_test`), killed after a bound, so that a regression (a hang) fails the
//! test instead of hanging the run. Each test skips with the reason when there are fewer than 2
//! GPUs (`WARPLINE_REQUIRE_GPUS=2` makes the skip a failure) or no libnccl can be loaded.
//! `NCCL_NVLS_ENABLE=0` is set in every child (NVLink multicast stays off).

use std::time::{Duration, Instant};

use warpline::multi::bench::{all_reduce_sweep, data_parallel_step_with, DataParallelConfig};
use warpline::multi::nccl::{self, CollectivesMode, Communicator};
use warpline::multi::DeviceSet;
use warpline::ordering::{synchronize_timeout, Fence, OnTimeout};
use warpline::{Device, DeviceBuffer, Error};
use warpline_suite::support::{random_f32, skip, two_gpus_or_skip};

/// Set in the children (the ignored tests), so that they know they run under a parent's bound.
const CHILD_ENV: &str = "WARPLINE_ISSUE24_CHILD";

/// Bound of each child process.
const CHILD_LIMIT: Duration = Duration::from_secs(120);

/// Runs the ignored test `name` in a child with `env` (plus `NCCL_NVLS_ENABLE=0`), killed after
/// [`CHILD_LIMIT`] (a kill fails the test).
fn run_child(name: &str, env: &[(&str, &str)]) {
    let mut env = env.to_vec();
    env.push((CHILD_ENV, "1"));
    env.push(("NCCL_NVLS_ENABLE", "0"));
    warpline_suite::support::run_child_test(name, &env, CHILD_LIMIT, None);
}

/// True when the test may run its GPU part: two GPUs and libnccl (otherwise a printed skip, or a
/// failure under `WARPLINE_REQUIRE_GPUS=2`). The set is dropped again: the child opens its own.
fn two_gpus_and_nccl(test: &str) -> bool {
    let Some(set) = two_gpus_or_skip(test) else {
        return false;
    };
    drop(set);
    if let Err(e) = nccl::library_available() {
        skip(test, e);
        return false;
    }
    true
}

/// `NCCL_NVLS_ENABLE=0` must hold in every process that makes communicators.
fn assert_nvls_off() {
    assert_eq!(
        std::env::var("NCCL_NVLS_ENABLE").as_deref(),
        Ok("0"),
        "NVLink multicast must stay off"
    );
}

/// One buffer of `data[r]` per rank, on the rank's GPU and its communicator's stream.
fn upload(set: &DeviceSet, comms: &[Communicator], data: &[Vec<f32>]) -> Vec<DeviceBuffer<f32>> {
    comms
        .iter()
        .enumerate()
        .map(|(r, c)| {
            let pool = set.pool(r, 0).unwrap();
            let mut b = pool.alloc_async::<f32>(c.stream(), data[r].len()).unwrap();
            b.copy_from_host(&data[r]).unwrap();
            b
        })
        .collect()
}

/// Checks `got` against the f64 sum of `data` (bound: 1e-6 relative, at least 1e-6 absolute:
/// two f32 terms, so the f32 sum is the correctly rounded one up to one ulp).
fn expect_sum(what: &str, got: &[f32], data: &[Vec<f32>]) {
    for (i, &g) in got.iter().enumerate() {
        let want: f64 = data.iter().map(|d| d[i] as f64).sum();
        assert!(
            (g as f64 - want).abs() <= 1e-6 * want.abs().max(1.0),
            "{what}: element {i} is {g}, the CPU sum is {want}"
        );
    }
}

/// Grouped all-reduce of fresh random data over an `init_all` set, checked against the CPU.
fn grouped_all_reduce_matches_the_cpu(what: &str, set: &DeviceSet, comms: &[Communicator]) {
    // Not a multiple of any tile or NCCL chunk size.
    let n = 1_000_003;
    let data: Vec<Vec<f32>> = (0..comms.len()).map(|_| random_f32(n)).collect();
    let mut bufs = upload(set, comms, &data);
    let mut refs: Vec<_> = bufs.iter_mut().collect();
    nccl::all_reduce_sum_group(comms, &mut refs).unwrap();
    for (r, b) in bufs.iter().enumerate() {
        let mut got = vec![f32::NAN; n];
        b.copy_to_host(&mut got).unwrap();
        expect_sum(&format!("{what}, rank {r}"), &got, &data);
    }
}

#[test]
fn collectives_mode_is_parsed_and_bad_values_are_refused() {
    assert_eq!(
        nccl::parse_collectives_mode(None).unwrap(),
        CollectivesMode::Blocking
    );
    assert_eq!(
        nccl::parse_collectives_mode(Some(" NonBlocking ")).unwrap(),
        CollectivesMode::Nonblocking
    );
    match nccl::parse_collectives_mode(Some("fast")) {
        Err(Error::BadShape { what, detail }) => {
            assert_eq!(what, nccl::COLLECTIVES_ENV);
            assert!(detail.contains("blocking") && detail.contains("nonblocking"));
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Item 1: a caller's fenced stream does not block the data-parallel step or the sweep.

/// The caller's stream on GPU 0 waits on a `Fence` ticket that is submitted (dropped) only after
/// the step has returned. Before issue 24 the step and the sweep synchronised whole contexts
/// (`DeviceSet::synchronize`), which waits for that stream too (`Device::synchronize` refuses
/// with `Error::WaitPending` while a registered wait is pending; a wait the driver does not know
/// of, say a spinning kernel, made it hang), and the step created its compute streams with
/// `cuStreamCreate`, which is refused the same way. Now the step takes its compute streams from
/// the contexts' stock and waits for its own streams only: the eager step (checked against the
/// f64 CPU reference) and the sweep (checked against the CPU sum) complete while the caller's
/// stream stays blocked. Graph capture still needs `cuGraphInstantiate`, which stays gated: with
/// the fence held the graph step may return `Error::WaitPending` (bounded), never hang.
#[test]
fn issue24_item1_a_fenced_caller_stream_does_not_block_the_dp_step() {
    let test = "issue24_item1_a_fenced_caller_stream_does_not_block_the_dp_step";
    if two_gpus_and_nccl(test) {
        run_child("fenced_dp_step_child", &[]);
    }
}

#[test]
#[ignore = "run by issue24_item1_a_fenced_caller_stream_does_not_block_the_dp_step in a child"]
fn fenced_dp_step_child() {
    let Some(set) = two_gpus_or_skip("fenced_dp_step_child") else {
        return;
    };
    assert_nvls_off();
    let streams: Vec<_> = (0..2)
        .map(|i| set.high_priority_stream(i).unwrap())
        .collect();
    let comms = Communicator::init_all(&set, &streams).unwrap();
    let cfg = DataParallelConfig {
        buckets: 3,
        tiles: 16,
        layers: 2,
        steps: 2,
        graphs: false,
        verify: true,
    };
    // Warm-up before the fence: NCCL connects its channels and allocates at a communicator's
    // first collectives (device-wide synchronising driver calls inside NCCL, which no warpline
    // gate can see); the step itself is what must not wait for the caller's stream.
    data_parallel_step_with(&set, &comms, &cfg).unwrap();
    all_reduce_sweep(&set, &comms, &[1 << 20, (16 << 20) + 4], 1).unwrap();
    let dev0 = set.device(0).unwrap();
    let fence = Fence::new(dev0).unwrap();
    let user = dev0.new_stream().unwrap();
    // The caller's stream on GPU 0 now waits for a ticket that is not submitted until the step
    // has returned.
    let ticket = fence.guard(&user).unwrap();
    eprintln!("fenced child: fence held, eager dp step");
    let t0 = Instant::now();
    let r = data_parallel_step_with(&set, &comms, &cfg).unwrap();
    assert!(r.max_rel_error.unwrap() < 1e-4, "{r:?}");
    eprintln!("fenced child: eager dp step done, sweep");
    let pts = all_reduce_sweep(&set, &comms, &[1 << 20, (16 << 20) + 4], 3).unwrap();
    assert_eq!(pts.len(), 2);
    eprintln!("fenced child: sweep done, graph dp step");
    let took = t0.elapsed();
    // With graphs: instantiation is gated while the fence's wait is pending.
    let t1 = Instant::now();
    let graphs = data_parallel_step_with(
        &set,
        &comms,
        &DataParallelConfig {
            graphs: true,
            ..cfg
        },
    );
    let graph_took = t1.elapsed();
    let graph_outcome = match &graphs {
        Ok(g) => {
            assert_eq!(g.graph_matches_eager, Some(true), "{g:?}");
            "completed and verified".to_string()
        }
        Err(e @ Error::WaitPending { .. }) => format!("refused: {e}"),
        Err(e) => panic!("graph step with the fence held: {e}"),
    };
    assert!(graph_took < Duration::from_secs(60), "{graph_took:?}");
    // The caller's stream is still held: nothing above waited for it.
    let probe = user.record().unwrap();
    assert!(!probe.is_complete().unwrap(), "the fence should still hold");
    drop(ticket);
    synchronize_timeout(&user, Duration::from_secs(30), OnTimeout::Abandon).unwrap();
    // After the release the graph step runs as before.
    let g = data_parallel_step_with(
        &set,
        &comms,
        &DataParallelConfig {
            graphs: true,
            ..cfg
        },
    )
    .unwrap();
    assert_eq!(g.graph_matches_eager, Some(true), "{g:?}");
    println!(
        "with GPU 0's caller stream held by a fence: eager dp step + sweep returned in {took:?}; \
         graph dp step {graph_outcome} in {graph_took:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Item 2: a rank failing between the pre-check and the launch.

/// A rank of the group fails inside `ncclGroupStart`/`ncclGroupEnd` (injected after the
/// pre-check, as a context poisoned then would). Before issue 24 the other rank's collective
/// launched alone and waited forever, and dropping its communicator blocked in
/// `stream.synchronize()`. Now: a typed error within a bound, every communicator aborted and
/// refused afterwards, bounded drops, and a new set with new communicators all-reduces correctly.
#[test]
fn issue24_item2_a_rank_failing_inside_the_group_aborts_the_group() {
    let test = "issue24_item2_a_rank_failing_inside_the_group_aborts_the_group";
    if two_gpus_and_nccl(test) {
        run_child("group_fault_child", &[]);
    }
}

#[test]
#[ignore = "run by issue24_item2_a_rank_failing_inside_the_group_aborts_the_group in a child"]
fn group_fault_child() {
    if two_gpus_or_skip("group_fault_child").is_none() {
        return;
    }
    assert_nvls_off();
    // Rank 1 fails after rank 0 was queued in the group (the half-group case); rank 0 fails
    // first (nothing queued yet).
    for failing in [1usize, 0] {
        let what = format!("fault injected on rank {failing}");
        let set = DeviceSet::open(&[0, 1]).unwrap();
        let streams: Vec<_> = (0..2)
            .map(|i| set.high_priority_stream(i).unwrap())
            .collect();
        let comms = Communicator::init_all(&set, &streams).unwrap();
        let n = 1 << 20;
        let data: Vec<Vec<f32>> = (0..2).map(|_| random_f32(n)).collect();
        let mut bufs = upload(&set, &comms, &data);
        nccl::inject_group_fault_once(&comms[failing]);
        let t0 = Instant::now();
        let mut refs: Vec<_> = bufs.iter_mut().collect();
        let e = nccl::all_reduce_sum_group(&comms, &mut refs).unwrap_err();
        let took = t0.elapsed();
        match &e {
            Error::NcclAborted {
                world: 2, cause, ..
            } => {
                assert!(cause.contains("injected"), "{what}: {e}")
            }
            other => panic!("{what}: expected NcclAborted, got {other:?}"),
        }
        assert!(took < Duration::from_secs(30), "{what}: took {took:?}");
        assert!(comms.iter().all(Communicator::is_aborted), "{what}");
        // Later use: refused with the typed error, before NCCL.
        let mut refs: Vec<_> = bufs.iter_mut().collect();
        assert!(
            matches!(
                nccl::all_reduce_sum_group(&comms, &mut refs),
                Err(Error::NcclAborted { .. })
            ),
            "{what}"
        );
        // Bounded drops: the communicators (drain, no second abort), then buffers and the set.
        let t0 = Instant::now();
        drop(comms);
        drop(bufs);
        for s in &streams {
            synchronize_timeout(s, Duration::from_secs(30), OnTimeout::Abandon).unwrap();
        }
        drop(streams);
        drop(set);
        let took = t0.elapsed();
        assert!(
            took < Duration::from_secs(60),
            "{what}: drops took {took:?}"
        );
        println!("{what}: NcclAborted after {took:?} of drops; error: {e}");
        // The process goes on: a new set and new communicators give the CPU's sum.
        let set = DeviceSet::open(&[0, 1]).unwrap();
        let streams: Vec<_> = (0..2)
            .map(|i| set.high_priority_stream(i).unwrap())
            .collect();
        let comms = Communicator::init_all(&set, &streams).unwrap();
        grouped_all_reduce_matches_the_cpu(&format!("{what}, new set"), &set, &comms);
        for d in set.devices() {
            assert!(d.take_deferred_errors().is_empty(), "{what}");
            d.check_healthy().unwrap();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Item 4: communicators on non-primary contexts (`Device::open_in_new_context`).

/// Marker the child prints when every all-reduce on own contexts matched the CPU.
const OWN_CONTEXTS_WORK: &str = "non-primary contexts: all-reduces match the CPU";
/// Marker the child prints when NCCL refused them with a typed error (see below).
const OWN_CONTEXTS_REFUSED: &str = "non-primary contexts: refused with a typed error";

/// NCCL documents that "the context current when creating a communicator must be the current
/// context for all operations involving that communicator", and its grouped calls and
/// `ncclCommInitAll` switch to the primary context with `cudaSetDevice` (NVIDIA/nccl#565), so
/// communicators on non-primary contexts may well not work. What must hold either way: no hang,
/// no crash, no wrong sum. The child passes with [`OWN_CONTEXTS_WORK`] (every all-reduce equals
/// the CPU sum) or with [`OWN_CONTEXTS_REFUSED`] (a typed error, bounded, printed); read which
/// one in the output.
#[test]
fn issue24_item4_communicators_on_non_primary_contexts() {
    let test = "issue24_item4_communicators_on_non_primary_contexts";
    if two_gpus_and_nccl(test) {
        for mode in ["blocking", "nonblocking"] {
            run_child(
                "non_primary_contexts_child",
                &[(nccl::COLLECTIVES_ENV, mode)],
            );
        }
    }
}

/// Grouped all-reduce of random data over an `init_all` set: `Ok` when it matches the CPU, `Err`
/// for a typed error (a wrong sum panics).
fn try_grouped_all_reduce(set: &DeviceSet, comms: &[Communicator]) -> warpline::Result<()> {
    let n = 1_000_003;
    let data: Vec<Vec<f32>> = (0..comms.len()).map(|_| random_f32(n)).collect();
    let mut bufs = upload(set, comms, &data);
    let mut refs: Vec<_> = bufs.iter_mut().collect();
    nccl::all_reduce_sum_group(comms, &mut refs)?;
    for c in comms {
        c.synchronize()?;
    }
    for (r, b) in bufs.iter().enumerate() {
        let mut got = vec![f32::NAN; n];
        b.copy_to_host(&mut got)?;
        expect_sum(&format!("init_all on own contexts, rank {r}"), &got, &data);
    }
    Ok(())
}

/// One rank per thread: `init_rank` on GPU `r`'s own context, then (only if both ranks joined)
/// two all-reduces of `data[r]`, each waited for with the communicator's bound.
fn rank_on_own_thread(
    set: &DeviceSet,
    r: usize,
    id: &nccl::NcclId,
    data: &[Vec<f32>],
    joined: &std::sync::Barrier,
    ok: &std::sync::Mutex<[bool; 2]>,
    mode: CollectivesMode,
) -> warpline::Result<Option<Vec<f32>>> {
    let n = data[r].len();
    // Nothing may return before the barrier: the other rank would wait there forever.
    let comm = set.high_priority_stream(r).and_then(|stream| {
        Communicator::init_rank_with_timeout(
            set.device(r)?,
            &stream,
            r,
            2,
            id,
            Duration::from_secs(60),
        )
    });
    ok.lock().unwrap()[r] = comm.is_ok();
    joined.wait();
    let comm = comm?;
    if !ok.lock().unwrap().iter().all(|&b| b) {
        return Ok(None); // the other rank failed: no collective (it would wait for it)
    }
    assert_eq!(comm.is_nonblocking(), mode == CollectivesMode::Nonblocking);
    let pool = set.pool(r, 0)?;
    let mut b = pool.alloc_async::<f32>(comm.stream(), n)?;
    let mut out = Vec::new();
    for _ in 0..2 {
        b.copy_from_host(&data[r])?;
        // SAFETY: both ranks make the same two all-reduces of `n` floats.
        unsafe { comm.all_reduce_sum(&mut b) }?;
        comm.synchronize()?;
        out = vec![f32::NAN; n];
        b.copy_to_host(&mut out)?;
    }
    Ok(Some(out))
}

#[test]
#[ignore = "run by issue24_item4_communicators_on_non_primary_contexts in a child"]
fn non_primary_contexts_child() {
    if two_gpus_or_skip("non_primary_contexts_child").is_none() {
        return;
    }
    assert_nvls_off();
    let mode = nccl::collectives_mode().unwrap();
    let devices = vec![
        Device::open_in_new_context(0).unwrap(),
        Device::open_in_new_context(1).unwrap(),
    ];
    assert!(devices.iter().all(Device::is_own_context));
    let set = DeviceSet::from_devices(devices).unwrap();
    let t0 = Instant::now();
    let mut refused = Vec::new();
    // One process, both GPUs: ncclCommInitAll + a group.
    let streams: Vec<_> = (0..2)
        .map(|i| set.high_priority_stream(i).unwrap())
        .collect();
    match Communicator::init_all(&set, &streams) {
        Ok(comms) => {
            if let Err(e) = try_grouped_all_reduce(&set, &comms) {
                refused.push(format!("init_all + group: {e}"));
            }
        }
        Err(e) => refused.push(format!("init_all: {e}")),
    }
    // One rank per thread: ncclCommInitRankConfig (+ the split in blocking mode) on each GPU's
    // own context, both ranks joining at once.
    let id = nccl::NcclId::new().unwrap();
    let n = 777_777;
    let data: Vec<Vec<f32>> = (0..2).map(|_| random_f32(n)).collect();
    let joined = std::sync::Barrier::new(2);
    let ok = std::sync::Mutex::new([false; 2]);
    let results: Vec<warpline::Result<Option<Vec<f32>>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2)
            .map(|r| {
                let (set, data, id, joined, ok) = (&set, &data, &id, &joined, &ok);
                s.spawn(move || rank_on_own_thread(set, r, id, data, joined, ok, mode))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Ok(Some(got)) => expect_sum(&format!("init_rank ({mode:?}) rank {r}"), &got, &data),
            Ok(None) => refused.push(format!("init_rank rank {r}: the other rank failed")),
            Err(e) => refused.push(format!("init_rank ({mode:?}) rank {r}: {e}")),
        }
    }
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(240), "took {took:?}");
    if refused.is_empty() {
        println!("{OWN_CONTEXTS_WORK} (init_all + group, init_rank {mode:?}; {took:?})");
        for d in set.devices() {
            assert!(d.take_deferred_errors().is_empty());
            d.check_healthy().unwrap();
        }
    } else {
        println!(
            "{OWN_CONTEXTS_REFUSED} ({mode:?}; {took:?}): {}",
            refused.join("; ")
        );
    }
}
