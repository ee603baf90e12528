//! `warpline ordering-demo`: the seeds' three ordering scenarios (tests/ordering.rs and
//! tests/fence.rs run them 200 times each; this runs them a few times, checks every result, and
//! traces them so the timeline shows why each piece of work ran when it did).
//!
//! - fence (stream-wait-value fence seed): the caller's copy, queued after `Fence::guard`, waits
//!   for internal work submitted later from another thread. The internal work runs in the
//!   fence's private context, which the recorder's clock cannot see; the caller's stream shows
//!   the wait and the copy after it.
//! - reverse (NVSHMEM wait-until seed): two streams wait on two signals that a third stream sets
//!   in the reverse order; the second wait's stream must go first. As a task graph.
//! - exchange (NVSHMEM "CUDA model" seed): two PEs, each waits for the peer's message on stream
//!   A and produces its own on stream B, added in the seed's naive order; the task graph submits
//!   producers first.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use warpline::kernels::signal as probe;
use warpline::ordering::{synchronize_timeout, Cmp, Fence, OnTimeout, Signal, TaskGraph};
use warpline::trace::{Recorder, Stage};
use warpline::{Device, Error, MemPool, Result, Stream};
use warpline_gpu::contract::signal::pattern;

use super::{cli_json, say, usage, CliResult, Ctx};

const BOUND: Duration = Duration::from_secs(10);
const POISON: u32 = 0xDEAD_BEEF;
/// Longest `--spin-us`.
const MAX_SPIN_US: u64 = 1_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    Fence,
    Reverse,
    Exchange,
    All,
}

#[derive(Args)]
pub struct DemoArgs {
    /// Which scenario(s).
    #[arg(long, value_enum, default_value_t = Scenario::All)]
    scenario: Scenario,
    /// Runs of each scenario (1..=100).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Spin of each producer kernel, microseconds (makes the waits visible; 0 to 1,000,000).
    #[arg(long, default_value_t = 500)]
    spin_us: u64,
}

fn check(what: &str, got: &[u32], seed: u32) -> Result<()> {
    match got
        .iter()
        .enumerate()
        .find(|(i, &g)| g != pattern(seed, *i as u32))
    {
        None => Ok(()),
        Some((i, g)) => Err(Error::Verification {
            detail: format!(
                "{what}: element {i} is {g:#x}, expected {:#x} (seed {seed:#x})",
                pattern(seed, i as u32)
            ),
        }),
    }
}

pub fn run(ctx: &Ctx, args: DemoArgs) -> CliResult<Value> {
    if args.runs == 0 || args.runs > 100 {
        return Err(usage(format!(
            "--runs {}: between 1 and 100 runs per scenario",
            args.runs
        )));
    }
    // At most 1 s: each run is bounded by BOUND (10 s), and `spin_us * 1000` (ns) must not
    // overflow (issue 19 item 15).
    if args.spin_us > MAX_SPIN_US {
        return Err(usage(format!(
            "--spin-us {}: between 0 and {MAX_SPIN_US} microseconds (each run must finish within {} s)",
            args.spin_us,
            BOUND.as_secs()
        )));
    }
    let dev = ctx.open()?;
    let rec = ctx.recorder(&dev)?;
    let installed = rec.as_ref().map(|r| r.install());
    let mut rng = rand::rngs::StdRng::seed_from_u64(ctx.seed);
    let spin = args.spin_us * 1000;
    let mut out = serde_json::Map::new();
    let all = args.scenario == Scenario::All;
    if all || args.scenario == Scenario::Fence {
        let r = fence(&dev, rec.as_ref(), args.runs, spin, &mut rng)?;
        out.insert("fence".into(), r);
    }
    if all || args.scenario == Scenario::Reverse {
        let r = reverse(&dev, args.runs, spin, &mut rng)?;
        out.insert("reverse_order_signals".into(), r);
    }
    if all || args.scenario == Scenario::Exchange {
        let r = exchange(&dev, args.runs, spin, &mut rng)?;
        out.insert("message_exchange".into(), r);
    }
    drop(installed);
    let trace = ctx.write_trace(
        rec.as_ref(),
        &format!(
            "warpline ordering-demo: {:?}, {} run(s) each",
            args.scenario, args.runs
        ),
    )?;
    Ok(json!({
        "device": cli_json::device(&dev),
        "options": {"scenario": format!("{:?}", args.scenario), "runs": args.runs, "spin_us": args.spin_us},
        "scenarios": out,
        "trace": trace,
    }))
}

fn fence(
    dev: &Device,
    rec: Option<&Recorder>,
    runs: usize,
    spin: u64,
    rng: &mut rand::rngs::StdRng,
) -> Result<Value> {
    let fence = Fence::new(dev)?;
    let user = dev.new_stream()?;
    if let Some(r) = rec {
        r.name_stream(&user, "fence: caller's stream");
    }
    let pool = MemPool::device_default(dev, 0)?;
    let n = 1usize << 16;
    let mut data = pool.alloc_async::<u32>(&user, n)?;
    let mut out = pool.alloc_async::<u32>(&user, n)?;
    let mut worst = Duration::ZERO;
    for run in 0..runs {
        data.fill_async(POISON)?;
        out.fill_async(POISON)?;
        user.synchronize()?;
        let seed: u32 = rng.random();
        let delay = Duration::from_micros(rng.random_range(0..2000));
        let t0 = std::time::Instant::now();
        let marks = |k: usize| -> Result<Vec<warpline::Event>> {
            rec.map_or(Ok(Vec::new()), |r| (0..k).map(|_| r.mark(&user)).collect())
        };
        let mut before = marks(1)?;
        let ticket = fence.guard(&user)?;
        // Two events at the same point: the end of the wait and the start of the copy.
        let mut after = marks(2)?;
        // SAFETY: both allocations hold n u32 and live to the end of the function; the fence
        // orders this copy after the internal fill.
        unsafe { probe::copy_u32(dev, &user, data.device_ptr(), out.device_ptr(), n as u32) }?;
        let mut copied = marks(1)?;
        let data_ptr = data.device_ptr();
        std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(delay);
                ticket.submit(|idev, internal| {
                    // SAFETY: `data` holds n u32 (pool memory, visible from the fence's
                    // context); the caller's copy waits on the fence.
                    unsafe { probe::busy_fill(idev, internal, data_ptr, n as u32, seed, spin) }
                })
            })
            .join()
            .unwrap_or_else(|_| {
                Err(Error::Verification {
                    detail: "the fence's submitting thread panicked".into(),
                })
            })
        })?;
        synchronize_timeout(&user, BOUND, OnTimeout::Abandon)?;
        worst = worst.max(t0.elapsed());
        if let Some(r) = rec {
            let (Some(b0), Some(a1), Some(a0), Some(c0)) =
                (before.pop(), after.pop(), after.pop(), copied.pop())
            else {
                unreachable!("marks(k) returns k events with a recorder");
            };
            let args = vec![("submit_delay_us".to_string(), delay.as_micros().to_string())];
            r.span(
                &user,
                Stage::Wait,
                format!("fence wait, run {run}"),
                b0,
                a0,
                args,
            );
            let name = format!("caller's copy after the fence, run {run}");
            r.span(&user, Stage::Kernel, name, a1, c0, vec![]);
        }
        let mut got = vec![0u32; n];
        out.copy_to_host(&mut got)?;
        check(&format!("fence run {run}"), &got, seed)?;
    }
    say!("fence: {runs} run(s), every copy saw the internal fill, worst {worst:?}");
    Ok(json!({"runs": runs, "correct": runs, "worst_ms": worst.as_secs_f64() * 1e3}))
}

fn reverse(dev: &Device, runs: usize, spin: u64, rng: &mut rand::rngs::StdRng) -> Result<Value> {
    let setup = dev.new_stream()?;
    let pool = MemPool::device_default(dev, 0)?;
    let n = 1u32 << 12;
    let mut order = pool.alloc_async::<u32>(&setup, 4)?; // [counter, arrival 1, arrival 2, -]
    let scratch = pool.alloc_async::<u32>(&setup, n as usize)?;
    setup.synchronize()?;
    let (counter, slot1, slot2) = (
        order.device_ptr(),
        order.device_ptr() + 4,
        order.device_ptr() + 8,
    );
    let sp = scratch.device_ptr();
    let mut g = TaskGraph::new();
    let (l1, l2, l3) = (
        g.lane("waits on sig0"),
        g.lane("waits on sig1"),
        g.lane("producer"),
    );
    let (sig0, sig1) = (g.signal("sig0"), g.signal("sig1"));
    let seed: u32 = rng.random();
    // SAFETY (all kernels below): scratch holds n u32 and only the producer lane writes it;
    // counter and slots are live u32 words, each slot with one writer; all live until the end.
    g.kernel(l3, "heavy work 1", move |c| unsafe {
        probe::busy_fill(c.dev, c.stream, sp, n, seed, spin)
    })?;
    g.set(l3, "set sig1", sig1, 1)?;
    g.kernel(l3, "heavy work 2", move |c| unsafe {
        probe::busy_fill(c.dev, c.stream, sp, n, seed ^ 1, spin)
    })?;
    g.set(l3, "set sig0", sig0, 1)?;
    g.wait(l1, "wait sig0", sig0, Cmp::Geq, 1)?;
    g.kernel(l1, "arrive (sig0)", move |c| unsafe {
        probe::record_arrival(c.dev, c.stream, counter, slot1)
    })?;
    g.wait(l2, "wait sig1", sig1, Cmp::Geq, 1)?;
    g.kernel(l2, "arrive (sig1)", move |c| unsafe {
        probe::record_arrival(c.dev, c.stream, counter, slot2)
    })?;
    let streams: Vec<Stream> = (0..3).map(|_| dev.new_stream()).collect::<Result<_>>()?;
    let sigs = [
        Signal::<u64>::new(dev, "sig0")?,
        Signal::<u64>::new(dev, "sig1")?,
    ];
    for run in 0..runs {
        order.fill_async(0)?;
        setup.synchronize()?;
        let r = g.enqueue(dev, &streams, &[&sigs[0], &sigs[1]])?;
        synchronize_timeout(&r, BOUND, OnTimeout::Abandon)?;
        let mut got = [0u32; 4];
        order.copy_to_host(&mut got)?;
        if got[0] != 2 || (got[2], got[1]) != (0, 1) {
            return Err(Error::Verification {
                detail: format!(
                    "reverse-order signals run {run}: arrivals {got:?}; the sig1 waiter must arrive first"
                ),
            });
        }
    }
    say!("reverse-order signals: {runs} run(s), each completed in signal order (sig1's waiter first)");
    Ok(json!({"runs": runs, "in_signal_order": runs}))
}

fn exchange(dev: &Device, runs: usize, spin: u64, rng: &mut rand::rngs::StdRng) -> Result<Value> {
    let n = 1usize << 14;
    let setup = dev.new_stream()?;
    let pool = MemPool::device_default(dev, 0)?;
    let mut bufs = (0..4)
        .map(|_| pool.alloc_async::<u32>(&setup, n))
        .collect::<Result<Vec<_>>>()?;
    let msg = [bufs[0].device_ptr(), bufs[1].device_ptr()];
    let recv = [bufs[2].device_ptr(), bufs[3].device_ptr()];
    let seeds = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
    let mut g = TaskGraph::new();
    let sig = [g.signal("to_pe0"), g.signal("to_pe1")];
    let lanes = [
        [g.lane("pe0.A"), g.lane("pe0.B")],
        [g.lane("pe1.A"), g.lane("pe1.B")],
    ];
    for pe in 0..2 {
        let peer = 1 - pe;
        g.wait(lanes[pe][0], format!("pe{pe} wait"), sig[pe], Cmp::Geq, 1)?;
        let (src, dst) = (msg[pe], recv[pe]);
        g.kernel(lanes[pe][0], format!("pe{pe} consume"), move |c| {
            // SAFETY: msg/recv hold n u32 until the end of the function; the wait orders the read.
            unsafe { probe::copy_u32(c.dev, c.stream, src, dst, n as u32) }
        })?;
        let (out, seeds) = (msg[peer], seeds.clone());
        g.kernel(lanes[pe][1], format!("pe{pe} payload"), move |c| {
            let seed = seeds[peer].load(Ordering::Relaxed);
            // SAFETY: the peer's message buffer holds n u32; its reader waits on the signal.
            unsafe { probe::busy_fill(c.dev, c.stream, out, n as u32, seed, spin) }
        })?;
        g.set(lanes[pe][1], format!("pe{pe} notify"), sig[peer], 1)?;
    }
    let plan = g.check()?;
    let order: Vec<String> = plan
        .order()
        .iter()
        .map(|&t| g.label(t).map(str::to_string))
        .collect::<Result<_>>()?;
    say!("message exchange: the seed's order is submitted producer-first as {order:?}");
    let streams: Vec<Stream> = (0..4).map(|_| dev.new_stream()).collect::<Result<_>>()?;
    let sigs = [
        Signal::<u64>::new(dev, "to_pe0")?,
        Signal::<u64>::new(dev, "to_pe1")?,
    ];
    for run in 0..runs {
        for b in bufs.iter_mut() {
            b.fill_async(POISON)?;
        }
        setup.synchronize()?;
        let s: [u32; 2] = [rng.random(), rng.random()];
        seeds[0].store(s[0], Ordering::Relaxed);
        seeds[1].store(s[1], Ordering::Relaxed);
        let r = g.enqueue(dev, &streams, &[&sigs[0], &sigs[1]])?;
        synchronize_timeout(&r, BOUND, OnTimeout::Abandon)?;
        let mut got = vec![0u32; n];
        for pe in 0..2 {
            bufs[2 + pe].copy_to_host(&mut got)?;
            check(&format!("exchange run {run}: pe{pe} received"), &got, s[pe])?;
        }
    }
    say!("message exchange: {runs} run(s), both PEs received the peer's message");
    Ok(json!({"runs": runs, "correct": runs, "submission_order": order}))
}
