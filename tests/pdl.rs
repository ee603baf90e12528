//! Programmatic Dependent Launch (issue 4): the kernel_A / kernel_B pair, the negative control,
//! `Chain` direct runs vs CUDA-graph replays, the primary / secondary GEMM pair, validation.
//!
//! GPU tests (skip without a driver): fresh random inputs every run, outputs NaN-poisoned before
//! launch, f64 CPU references. CI tests (no GPU): the PTX of each PDL kernel puts
//! `griddepcontrol.wait` / `launch_dependents` where the design says, ptxas accepts every PDL
//! entry without spills, PDL is refused below compute capability 9.0.
//!
//! Error bounds (u = 2^-24, f32 unit roundoff):
//! - pair: `out = fl(fl(2 a + 1) * s)`, two roundings: relative error <= 2u (+u^2); checked
//!   against `2^-22`.
//! - GEMM: an FMA dot product of length L split in two halves then added has
//!   `|err| <= (L + 1) u sum|a||b|` (Higham, Accuracy and Stability, §3.1). C1 = A·B1 is checked
//!   with `|c1 - ref| <= 2 (k + 2) u mag1`, `mag1 = |A|·|B1|`; C2 = C1·B2 carries C1's error:
//!   `|c2 - ref| <= 2 (k + n + 4) u mag2`, `mag2 = mag1·|B2|` (reference C2 from the f64 C1).

use rand::Rng;
use warpline::kernels::pdl::{
    self as kpdl, check_pdl_support, Consumer, GemmDims, GemmKernel, Producer,
};
use warpline::{Chain, DeviceBuffer, Error, MemPool, Stream};
use warpline_gpu::contract::pdl as contract;
use warpline_suite::support::{
    assert_compiled_without_spills, entry_body, gpu_or_skip, ptxas_report, random_f32,
};

/// [`kpdl::gemm_with_pdl`] for this file's launches.
///
/// SAFETY (of every call here): a PDL launch is either a secondary right after its primary (the
/// secondary reads `b` before its wait, which the primary does not write; `a` = the primary's C
/// is read after the wait), or a primary whose `a`/`b` no earlier kernel of the stream writes
/// (the loops use a fresh slice of A and B per pair; stamps are written only after the wait by
/// kernels that do not share them). Validation calls fail before anything is launched.
#[allow(clippy::too_many_arguments)]
fn kpdl_gemm(
    dev: &warpline::Device,
    stream: &Stream,
    which: GemmKernel,
    a: warpline::DeviceView<'_, f32>,
    b: warpline::DeviceView<'_, f32>,
    c: warpline::DeviceViewMut<'_, f32>,
    dims: GemmDims,
    pdl: bool,
    stamps: Option<warpline::DeviceViewMut<'_, u64>>,
) -> warpline::Result<()> {
    // SAFETY: see above.
    unsafe { kpdl::gemm_with_pdl(dev, stream, which, a, b, c, dims, pdl, stamps) }
}

const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Chained iterations of the long tests: 10,000, or `WARPLINE_PDL_ITERS` (for slow tools such as
/// compute-sanitizer; rounded up to whole batches of 100).
fn chained_iterations() -> usize {
    std::env::var("WARPLINE_PDL_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000)
}
const PAIR_REL_BOUND: f64 = 4.0 * U;

// ------------------------------------------------------------------------------------------------
// CI: no GPU needed
// ------------------------------------------------------------------------------------------------

fn first(body: &str, what: &str) -> usize {
    body.find(what)
        .unwrap_or_else(|| panic!("`{what}` not found in:\n{body}"))
}

fn last(body: &str, what: &str) -> usize {
    body.rfind(what)
        .unwrap_or_else(|| panic!("`{what}` not found in:\n{body}"))
}

#[test]
fn ptx_places_wait_and_trigger_as_designed() {
    // Producer: wait (WAR on buf) before its stores; trigger after the last store and a CTA barrier.
    let p = entry_body(contract::PRODUCER_KERNEL);
    assert!(first(p, "griddepcontrol.wait") < first(p, "st.global"));
    assert!(last(p, "st.global") < first(p, "bar.sync"));
    assert!(last(p, "bar.sync") < first(p, "griddepcontrol.launch_dependents"));
    // The negative control really triggers before it stores.
    let e = entry_body(contract::EARLY_TRIGGER_KERNEL);
    assert!(first(e, "griddepcontrol.launch_dependents") < first(e, "st.global"));
    // Consumer: no global load before the wait (finding 12); the no-wait variant has no wait.
    let c = entry_body(contract::CONSUMER_KERNEL);
    assert!(!c[..first(c, "griddepcontrol.wait")].contains("ld.global"));
    assert!(!entry_body(contract::CONSUMER_NO_WAIT_KERNEL).contains("griddepcontrol.wait"));
    // chain_step: wait before the first load of x, trigger after its last store.
    let s = entry_body(contract::CHAIN_STEP_KERNEL);
    assert!(first(s, "griddepcontrol.wait") < first(s, "ld.global"));
    assert!(last(s, "st.global") < first(s, "griddepcontrol.launch_dependents"));
    // Secondary GEMM: barrier init and the first (B) tile copies are its prologue, before the wait.
    let g2 = entry_body(contract::SECONDARY_GEMM_KERNEL);
    assert!(first(g2, "mbarrier.init") < first(g2, "griddepcontrol.wait"));
    assert!(first(g2, "cp.async.cg.shared.global") < first(g2, "griddepcontrol.wait"));
    // Primary GEMM: loads before any wait (its inputs are independent), trigger after every store
    // of C and after the cluster barrier; DSMEM split-K reduction through mapa.
    let g1 = entry_body(contract::PRIMARY_GEMM_KERNEL);
    assert!(first(g1, "cp.async.cg.shared.global") < first(g1, "griddepcontrol.wait"));
    assert!(last(g1, "st.global.v4.f32") < first(g1, "griddepcontrol.launch_dependents"));
    assert!(
        last(g1, "barrier.cluster.wait.acquire") < first(g1, "griddepcontrol.launch_dependents")
    );
    for g in [g1, g2] {
        assert!(g.contains("mapa.shared::cluster"));
        assert!(g.contains("cp.async.wait_group"));
        assert!(g.contains("%globaltimer"));
    }
}

#[test]
fn ptxas_accepts_every_pdl_kernel_without_spills() {
    let report = ptxas_report();
    for k in [
        contract::PRODUCER_KERNEL,
        contract::EARLY_TRIGGER_KERNEL,
        contract::CONSUMER_KERNEL,
        contract::CONSUMER_NO_WAIT_KERNEL,
        contract::CHAIN_STEP_KERNEL,
        contract::PRIMARY_GEMM_KERNEL,
        contract::SECONDARY_GEMM_KERNEL,
    ] {
        assert_compiled_without_spills(&report, k);
    }
}

#[test]
fn pdl_is_refused_below_compute_capability_9() {
    let e = check_pdl_support("Tesla V100", (7, 0)).unwrap_err();
    assert!(
        matches!(
            e,
            Error::PdlUnsupported {
                major: 7,
                minor: 0,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("PDL"), "{e}");
    assert!(check_pdl_support("H100", (9, 0)).is_ok());
}

// ------------------------------------------------------------------------------------------------
// GPU: the kernel_A / kernel_B pair
// ------------------------------------------------------------------------------------------------

/// Elements of the pair's buffers in the chained test: not a multiple of the CTA.
const PAIR_N: usize = 4099;
/// Iterations (producer + consumer) per batch; each batch is one PDL chain of 2 x this kernels.
const PAIR_BATCH: usize = 100;

/// Mismatches of `out` against the f64 reference `(2 a + 1) s` (NaN counts as a mismatch).
fn pair_mismatches(inp: &[f32], scale: &[f32], out: &[f32]) -> usize {
    inp.iter()
        .zip(scale)
        .zip(out)
        .filter(|((&a, &s), &o)| {
            let want = (2.0 * a as f64 + 1.0) * s as f64;
            let err = (o as f64 - want).abs();
            err.is_nan() || err > PAIR_REL_BOUND * want.abs()
        })
        .count()
}

struct PairBuffers {
    inp: DeviceBuffer<f32>,
    scale: DeviceBuffer<f32>,
    out: DeviceBuffer<f32>,
    buf: DeviceBuffer<f32>,
}

/// Runs `batch` chained iterations: per iteration j, the producer writes `buf` from slot j of
/// `inp`, the consumer (PDL) reads `buf` and slot j of `scale` into slot j of `out`. Every launch
/// carries the PDL attribute. Returns the mismatches of the whole batch.
#[allow(clippy::too_many_arguments)]
fn run_pair_batch(
    dev: &warpline::Device,
    stream: &Stream,
    b: &mut PairBuffers,
    n: usize,
    batch: usize,
    grid: u32,
    producer: Producer,
    consumer: Consumer,
) -> usize {
    let inp = random_f32(n * batch);
    let scale = random_f32(n * batch);
    b.inp.copy_from_host(&inp).unwrap();
    b.scale.copy_from_host(&scale).unwrap();
    b.out.fill_async(f32::NAN).unwrap();
    b.buf.fill_async(f32::NAN).unwrap();
    for j in 0..batch {
        let r = j * n..(j + 1) * n;
        // SAFETY: negative-control test of the pair; the consumer's pre-wait input `scale` is not
        // written by the producer (it writes only `buf`).
        unsafe {
            kpdl::pdl_producer_variant(
                dev,
                stream,
                producer,
                b.inp.view(r.clone()).unwrap(),
                b.buf.as_view_mut(),
                grid,
                true,
            )
        }
        .unwrap();
        // SAFETY: as above.
        unsafe {
            kpdl::pdl_consumer_variant(
                dev,
                stream,
                consumer,
                b.buf.as_view(),
                b.scale.view(r.clone()).unwrap(),
                b.out.view_mut(r).unwrap(),
                grid,
                true,
            )
        }
        .unwrap();
    }
    let mut out = vec![0f32; n * batch];
    b.out.copy_to_host(&mut out).unwrap();
    pair_mismatches(&inp, &scale, &out)
}

fn pair_buffers(pool: &MemPool, stream: &Stream, n: usize, batch: usize) -> PairBuffers {
    PairBuffers {
        inp: pool.alloc_async(stream, n * batch).unwrap(),
        scale: pool.alloc_async(stream, n * batch).unwrap(),
        out: pool.alloc_async(stream, n * batch).unwrap(),
        buf: pool.alloc_async(stream, n).unwrap(),
    }
}

#[test]
fn consumer_reads_what_producer_wrote_over_10000_chained_iterations() {
    let Some(dev) = gpu_or_skip("pdl pair 10000 iterations") else {
        return;
    };
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut b = pair_buffers(&pool, &stream, PAIR_N, PAIR_BATCH);
    // grid 5 x 256 threads: a grid-stride loop of ~3 elements per thread.
    for batch in 0..chained_iterations().div_ceil(PAIR_BATCH) {
        let bad = run_pair_batch(
            &dev,
            &stream,
            &mut b,
            PAIR_N,
            PAIR_BATCH,
            5,
            Producer::Correct,
            Consumer::Waits,
        );
        assert_eq!(bad, 0, "batch {batch}: {bad} mismatching elements");
    }
}

/// The negative control. `griddepcontrol.wait` waits for the *completion* of the prerequisite
/// grid (PTX ISA, griddepcontrol), so an early trigger alone cannot corrupt a consumer that
/// waits: with `pdl_producer_early_trigger` + `pdl_consumer` every element must still be right,
/// and that is checked. What the early trigger does change is *when* the consumer starts; a
/// consumer that reads before waiting (`pdl_consumer_no_wait`) then races with the producer's
/// stores, and the comparison must catch it (stale or NaN data) at least once over up to 10,000
/// iterations. If the GPU never started the consumer early, this test fails: then PDL gave no
/// overlap at all, which is itself worth knowing.
#[test]
fn early_trigger_race_is_caught_and_waiting_consumer_stays_correct() {
    let Some(dev) = gpu_or_skip("pdl negative control") else {
        return;
    };
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    // Large enough that the producer's stores take several microseconds.
    let n = (1 << 20) + 3;
    let batch = 10;
    let grid = dev.capabilities().sm_count;
    let mut b = pair_buffers(&pool, &stream, n, batch);

    let mut caught = 0;
    let mut iterations = 0;
    while caught == 0 && iterations < chained_iterations().max(batch) {
        caught += run_pair_batch(
            &dev,
            &stream,
            &mut b,
            n,
            batch,
            grid,
            Producer::EarlyTrigger,
            Consumer::NoWait,
        );
        iterations += batch;
    }
    eprintln!("negative control: {caught} stale elements caught within {iterations} iterations");
    assert!(
        caught > 0,
        "an early trigger with a consumer that does not wait was never observed in {iterations} iterations"
    );

    for _ in 0..5 {
        let bad = run_pair_batch(
            &dev,
            &stream,
            &mut b,
            n,
            batch,
            grid,
            Producer::EarlyTrigger,
            Consumer::Waits,
        );
        assert_eq!(
            bad, 0,
            "griddepcontrol.wait must wait for the producer's completion"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// GPU: Chain, direct and graph replay
// ------------------------------------------------------------------------------------------------

fn random_u32(n: usize) -> Vec<u32> {
    let mut rng = rand::rng();
    (0..n).map(|_| rng.random()).collect()
}

#[test]
fn chain_direct_and_graph_replay_agree_with_and_without_pdl() {
    let Some(dev) = gpu_or_skip("pdl chain") else {
        return;
    };
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 132 * 256 + 5;
    let steps = 1000;
    let reps = 3u32;
    for pdl in [false, true] {
        let x0 = random_u32(n);
        let want: Vec<u32> = x0
            .iter()
            .map(|v| v.wrapping_add(reps * steps as u32))
            .collect();

        let mut direct = pool.alloc_async::<u32>(&stream, n).unwrap();
        direct.copy_from_host(&x0).unwrap();
        {
            let mut chain = Chain::new(&dev, &stream, pdl).unwrap();
            chain
                .push_chain_steps(direct.as_view_mut(), steps, 132)
                .unwrap();
            assert_eq!(chain.len(), steps);
            for _ in 0..reps {
                chain.run().unwrap();
            }
            stream.synchronize().unwrap();
        }
        let mut got_direct = vec![0u32; n];
        direct.copy_to_host(&mut got_direct).unwrap();

        let mut replayed = pool.alloc_async::<u32>(&stream, n).unwrap();
        replayed.copy_from_host(&x0).unwrap();
        {
            let mut chain = Chain::new(&dev, &stream, pdl).unwrap();
            chain
                .push_chain_steps(replayed.as_view_mut(), steps, 132)
                .unwrap();
            let graph = chain.capture().unwrap();
            assert_eq!(graph.nodes(), steps);
            let edges = graph.programmatic_edges().unwrap();
            let want_edges = if pdl { steps - 1 } else { 0 };
            assert_eq!(
                edges, want_edges,
                "pdl = {pdl}: programmatic edges after capture"
            );
            for _ in 0..reps {
                graph.launch().unwrap();
            }
            stream.synchronize().unwrap();
        }
        let mut got_replay = vec![0u32; n];
        replayed.copy_to_host(&mut got_replay).unwrap();

        assert!(got_direct == want, "pdl = {pdl}: direct run is wrong");
        assert!(
            got_replay == got_direct,
            "pdl = {pdl}: graph replay differs from the direct run"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// GPU: primary / secondary GEMM
// ------------------------------------------------------------------------------------------------

/// f64 `C = A · B` and `|A| · |B|` (row-major).
fn matmul_f64(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0.0; m * n];
    let mut mag = vec![0.0; m * n];
    for i in 0..m {
        for p in 0..k {
            let (x, ax) = (a[i * k + p], a[i * k + p].abs());
            for j in 0..n {
                c[i * n + j] += x * b[p * n + j];
                mag[i * n + j] += ax * b[p * n + j].abs();
            }
        }
    }
    (c, mag)
}

/// Dims of one pair: C1[m x n] = A[m x k] · B1[k x n]; C2[m x p] = C1 · B2[n x p].
#[derive(Clone, Copy, Debug)]
struct PairDims {
    m: usize,
    k: usize,
    n: usize,
    p: usize,
}

struct GemmRef {
    c1: Vec<f64>,
    c1_bound: Vec<f64>,
    c2: Vec<f64>,
    c2_bound: Vec<f64>,
}

fn gemm_reference(d: PairDims, a: &[f32], b1: &[f32], b2: &[f32]) -> GemmRef {
    let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let (c1, mag1) = matmul_f64(&f(a), &f(b1), d.m, d.k, d.n);
    let b2 = f(b2);
    let (c2, _) = matmul_f64(&c1, &b2, d.m, d.n, d.p);
    let (mag2, _) = matmul_f64(
        &mag1,
        &b2.iter().map(|x| x.abs()).collect::<Vec<_>>(),
        d.m,
        d.n,
        d.p,
    );
    let t1 = 2.0 * (d.k as f64 + 2.0) * U;
    let t2 = 2.0 * (d.k as f64 + d.n as f64 + 4.0) * U;
    GemmRef {
        c1_bound: mag1.iter().map(|m| t1 * m).collect(),
        c1,
        c2_bound: mag2.iter().map(|m| t2 * m).collect(),
        c2,
    }
}

fn check_within(what: &str, got: &[f32], want: &[f64], bound: &[f64]) {
    for (i, ((&g, &w), &b)) in got.iter().zip(want).zip(bound).enumerate() {
        assert!(
            (g as f64 - w).abs() <= b,
            "{what}: element {i} = {g}, f64 reference {w}, bound {b:e}"
        );
    }
}

struct GemmSlots {
    a: DeviceBuffer<f32>,
    b1: DeviceBuffer<f32>,
    b2: DeviceBuffer<f32>,
    c1: DeviceBuffer<f32>,
    c2: DeviceBuffer<f32>,
}

/// `slots` independent pairs chained on one stream (shared C1, one C2 slot each); the primary
/// and the secondary both launched with PDL when `pdl`. Checks C2 of every slot (and C1 of the
/// last) against the f64 reference.
fn run_gemm_chain(
    dev: &warpline::Device,
    stream: &Stream,
    pool: &MemPool,
    d: PairDims,
    slots: usize,
    pdl: bool,
) {
    let (sa, sb1, sb2, sc2) = (d.m * d.k, d.k * d.n, d.n * d.p, d.m * d.p);
    let a = random_f32(sa * slots);
    let b1 = random_f32(sb1 * slots);
    let b2 = random_f32(sb2 * slots);
    let mut s = GemmSlots {
        a: pool.alloc_async(stream, sa * slots).unwrap(),
        b1: pool.alloc_async(stream, sb1 * slots).unwrap(),
        b2: pool.alloc_async(stream, sb2 * slots).unwrap(),
        c1: pool.alloc_async(stream, d.m * d.n).unwrap(),
        c2: pool.alloc_async(stream, sc2 * slots).unwrap(),
    };
    s.a.copy_from_host(&a).unwrap();
    s.b1.copy_from_host(&b1).unwrap();
    s.b2.copy_from_host(&b2).unwrap();
    s.c1.fill_async(f32::NAN).unwrap();
    s.c2.fill_async(f32::NAN).unwrap();
    let dims1 = GemmDims {
        m: d.m as u32,
        n: d.n as u32,
        k: d.k as u32,
    };
    let dims2 = GemmDims {
        m: d.m as u32,
        n: d.p as u32,
        k: d.n as u32,
    };
    for j in 0..slots {
        kpdl_gemm(
            dev,
            stream,
            GemmKernel::Primary,
            s.a.view(j * sa..(j + 1) * sa).unwrap(),
            s.b1.view(j * sb1..(j + 1) * sb1).unwrap(),
            s.c1.as_view_mut(),
            dims1,
            pdl,
            None,
        )
        .unwrap();
        kpdl_gemm(
            dev,
            stream,
            GemmKernel::Secondary,
            s.c1.as_view(),
            s.b2.view(j * sb2..(j + 1) * sb2).unwrap(),
            s.c2.view_mut(j * sc2..(j + 1) * sc2).unwrap(),
            dims2,
            pdl,
            None,
        )
        .unwrap();
    }
    let mut c1 = vec![0f32; d.m * d.n];
    let mut c2 = vec![0f32; sc2 * slots];
    s.c1.copy_to_host(&mut c1).unwrap();
    s.c2.copy_to_host(&mut c2).unwrap();
    for j in 0..slots {
        let r = gemm_reference(
            d,
            &a[j * sa..(j + 1) * sa],
            &b1[j * sb1..(j + 1) * sb1],
            &b2[j * sb2..(j + 1) * sb2],
        );
        if j == slots - 1 {
            check_within(&format!("{d:?} C1"), &c1, &r.c1, &r.c1_bound);
        }
        check_within(
            &format!("{d:?} pdl={pdl} slot {j} C2"),
            &c2[j * sc2..(j + 1) * sc2],
            &r.c2,
            &r.c2_bound,
        );
    }
}

#[test]
fn gemm_pair_matches_f64_reference_at_ragged_shapes() {
    let Some(dev) = gpu_or_skip("pdl gemm shapes") else {
        return;
    };
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let shapes = [
        PairDims {
            m: 197,
            k: 300,
            n: 132,
            p: 76,
        },
        PairDims {
            m: 1,
            k: 4,
            n: 4,
            p: 4,
        },
        PairDims {
            m: 64,
            k: 64,
            n: 64,
            p: 64,
        },
        // k fits one K tile: CTA rank 1 of each cluster has no K tiles.
        PairDims {
            m: 65,
            k: 20,
            n: 68,
            p: 132,
        },
        PairDims {
            m: 130,
            k: 1028,
            n: 200,
            p: 36,
        },
    ];
    for d in shapes {
        for pdl in [false, true] {
            run_gemm_chain(&dev, &stream, &pool, d, 3, pdl);
        }
    }
}

#[test]
fn secondary_reads_what_primary_wrote_over_10000_chained_iterations() {
    let Some(dev) = gpu_or_skip("pdl gemm 10000 iterations") else {
        return;
    };
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    // 2 x 2 C1 tiles (8 CTAs, 4 clusters), 2 K tiles (one per CTA of a cluster).
    let d = PairDims {
        m: 65,
        k: 36,
        n: 68,
        p: 8,
    };
    for _ in 0..chained_iterations().div_ceil(100) {
        run_gemm_chain(&dev, &stream, &pool, d, 100, true);
    }
}

/// The stamps are consistent per CTA, and every secondary CTA's `griddepcontrol.wait` returned
/// no earlier than the primary's last CTA end stamp (wait = completion of the primary), even
/// though the secondary was launched with PDL and may have started earlier.
#[test]
fn gemm_stamps_show_wait_returns_after_primary_completion() {
    let Some(dev) = gpu_or_skip("pdl gemm stamps") else {
        return;
    };
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let d1 = GemmDims {
        m: 256,
        n: 256,
        k: 1024,
    };
    let d2 = GemmDims {
        m: 256,
        n: 132,
        k: 256,
    };
    let (m, n, k, p) = (256usize, 256usize, 1024usize, 132usize);
    let (g1, g2) = (kpdl::gemm_grid(d1) as usize, kpdl::gemm_grid(d2) as usize);
    let alloc = |len| pool.alloc_async::<f32>(&stream, len).unwrap();
    let (mut a, mut b1, mut b2) = (alloc(m * k), alloc(k * n), alloc(n * p));
    let (mut c1, mut c2) = (alloc(m * n), alloc(m * p));
    a.copy_from_host(&random_f32(m * k)).unwrap();
    b1.copy_from_host(&random_f32(k * n)).unwrap();
    b2.copy_from_host(&random_f32(n * p)).unwrap();
    c1.fill_async(f32::NAN).unwrap();
    c2.fill_async(f32::NAN).unwrap();
    let k3 = contract::STAMPS_PER_CTA;
    let mut st1 = pool.alloc_async::<u64>(&stream, g1 * k3).unwrap();
    let mut st2 = pool.alloc_async::<u64>(&stream, g2 * k3).unwrap();
    for _ in 0..20 {
        st1.copy_from_host(&vec![0u64; g1 * k3]).unwrap();
        st2.copy_from_host(&vec![0u64; g2 * k3]).unwrap();
        kpdl_gemm(
            &dev,
            &stream,
            GemmKernel::Primary,
            a.as_view(),
            b1.as_view(),
            c1.as_view_mut(),
            d1,
            false,
            Some(st1.as_view_mut()),
        )
        .unwrap();
        kpdl_gemm(
            &dev,
            &stream,
            GemmKernel::Secondary,
            c1.as_view(),
            b2.as_view(),
            c2.as_view_mut(),
            d2,
            true,
            Some(st2.as_view_mut()),
        )
        .unwrap();
        let mut s1 = vec![0u64; g1 * k3];
        let mut s2 = vec![0u64; g2 * k3];
        st1.copy_to_host(&mut s1).unwrap();
        st2.copy_to_host(&mut s2).unwrap();
        for cta in s1.chunks(k3).chain(s2.chunks(k3)) {
            assert!(
                cta[0] > 0 && cta[0] <= cta[1] && cta[1] <= cta[2],
                "{cta:?}"
            );
        }
        let primary_end = s1.chunks(k3).map(|c| c[2]).max().unwrap();
        let first_wait_return = s2.chunks(k3).map(|c| c[1]).min().unwrap();
        assert!(
            first_wait_return >= primary_end,
            "a secondary CTA passed griddepcontrol.wait at {first_wait_return} ns, before the \
             primary's last CTA ended at {primary_end} ns"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// GPU: validation
// ------------------------------------------------------------------------------------------------

/// A secondary GEMM launch that must fail validation; its error.
fn gemm_err(
    dev: &warpline::Device,
    s: &Stream,
    a: warpline::DeviceView<'_, f32>,
    b: &DeviceBuffer<f32>,
    c: &mut DeviceBuffer<f32>,
    d: GemmDims,
    stamps: Option<&mut DeviceBuffer<u64>>,
) -> Error {
    kpdl_gemm(
        dev,
        s,
        GemmKernel::Secondary,
        a,
        b.as_view(),
        c.as_view_mut(),
        d,
        true,
        stamps.map(|st| st.as_view_mut()),
    )
    .unwrap_err()
}

#[test]
fn pdl_launchers_reject_bad_arguments_before_launch() {
    let Some(dev) = gpu_or_skip("pdl validation") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let other = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 4099;
    let inp = pool.alloc_async::<f32>(&s, n).unwrap();
    let mut buf = pool.alloc_async::<f32>(&s, n).unwrap();
    let short = pool.alloc_async::<f32>(&s, n - 1).unwrap();
    let on_other = pool.alloc_async::<f32>(&other, n).unwrap();
    let mut out = pool.alloc_async::<f32>(&s, n).unwrap();
    out.fill_async(f32::NAN).unwrap();

    let e = kpdl::pdl_producer(&dev, &s, short.as_view(), buf.as_view_mut(), 4, true).unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    let e = kpdl::pdl_producer(
        &dev,
        &s,
        inp.view(0..0).unwrap(),
        buf.view_mut(0..0).unwrap(),
        4,
        true,
    )
    .unwrap_err();
    assert!(matches!(e, Error::Empty { .. }), "{e}");
    let e = kpdl::pdl_producer(&dev, &s, inp.as_view(), buf.as_view_mut(), 0, true).unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    let e = kpdl::pdl_consumer(
        &dev,
        &s,
        buf.as_view(),
        on_other.as_view(),
        out.as_view_mut(),
        4,
    )
    .unwrap_err();
    assert!(matches!(e, Error::WrongStream { .. }), "{e}");
    let e = kpdl::pdl_consumer(
        &dev,
        &s,
        buf.as_view(),
        short.as_view(),
        out.as_view_mut(),
        4,
    )
    .unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");

    // GEMM: n, k multiples of 4; lengths; 16-byte alignment; stamps length; empty.
    let d = GemmDims { m: 5, n: 8, k: 8 };
    let a = pool.alloc_async::<f32>(&s, 5 * 8 + 1).unwrap();
    let b = pool.alloc_async::<f32>(&s, 8 * 8).unwrap();
    let mut c = pool.alloc_async::<f32>(&s, 5 * 8).unwrap();
    c.fill_async(f32::NAN).unwrap();
    let e = gemm_err(
        &dev,
        &s,
        a.view(0..40).unwrap(),
        &b,
        &mut c,
        GemmDims { k: 6, ..d },
        None,
    );
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    let e = gemm_err(
        &dev,
        &s,
        a.view(0..40).unwrap(),
        &b,
        &mut c,
        GemmDims { m: 4, ..d },
        None,
    );
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    let e = gemm_err(&dev, &s, a.view(1..41).unwrap(), &b, &mut c, d, None);
    assert!(matches!(e, Error::Misaligned { align: 16, .. }), "{e}");
    let e = gemm_err(
        &dev,
        &s,
        a.view(0..40).unwrap(),
        &b,
        &mut c,
        GemmDims { m: 0, ..d },
        None,
    );
    assert!(matches!(e, Error::Empty { .. }), "{e}");
    let big = GemmDims { m: 1 << 25, ..d };
    let e = gemm_err(&dev, &s, a.view(0..40).unwrap(), &b, &mut c, big, None);
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    let mut st = pool.alloc_async::<u64>(&s, 5).unwrap();
    let e = gemm_err(
        &dev,
        &s,
        a.view(0..40).unwrap(),
        &b,
        &mut c,
        d,
        Some(&mut st),
    );
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");

    // Chain: the buffer must be on the chain's stream; grid 0 is refused.
    let mut x = pool.alloc_async::<u32>(&other, 64).unwrap();
    let mut chain = Chain::new(&dev, &s, true).unwrap();
    let e = chain.push_chain_steps(x.as_view_mut(), 3, 1).unwrap_err();
    assert!(matches!(e, Error::WrongStream { .. }), "{e}");
    let mut y = pool.alloc_async::<u32>(&s, 64).unwrap();
    let e = chain.push_chain_steps(y.as_view_mut(), 3, 0).unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    assert!(chain.is_empty());
    drop(chain);

    // Nothing was launched: the poisoned outputs are untouched.
    let mut o = vec![0f32; n];
    out.copy_to_host(&mut o).unwrap();
    assert!(o.iter().all(|v| v.is_nan()));
    let mut cc = vec![0f32; 40];
    c.copy_to_host(&mut cc).unwrap();
    assert!(cc.iter().all(|v| v.is_nan()));
}
