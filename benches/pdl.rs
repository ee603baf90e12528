//! Programmatic Dependent Launch bench (issue 4), one run, one table per part:
//!
//! 1. A chain of 1000 dependent `chain_step` kernels (132 CTAs x 256 threads, x[i] += 1), per
//!    kernel time for plain stream launches, PDL launches, CUDA-graph replay, graph replay with
//!    PDL. CUDA events around the whole chain, divided by 1000; median of `REPS` repetitions, the
//!    four modes interleaved per repetition so drift hits all alike.
//! 2. The primary + secondary GEMM pair (clusters of 2 CTAs, warp-specialized) end to end, without
//!    PDL, with PDL on the secondary (the chapter's setup), and a chain of pairs with PDL on every
//!    launch; plus the overlap evidence from per-CTA `%globaltimer` stamps: whether the
//!    secondary's CTAs started before the primary's last CTA finished.
//!
//! Without a CUDA driver or device it prints the reason and exits 0.
//! Run: `cargo bench --bench pdl` (or the built binary with `--bench`).

use warpline::kernels::pdl::{self as kpdl, GemmDims, GemmKernel};
use warpline::{Chain, Device, DeviceBuffer, Error, MemPool, Result, Stream};
use warpline_gpu::contract::pdl as contract;
use warpline_suite::support::random_f32;

/// [`kpdl::gemm_with_pdl`] for this file's launches.
///
/// SAFETY (of every call here): a PDL launch is either a secondary right after its primary (the
/// secondary reads `b` before its wait, which the primary does not write; `a` = the primary's C
/// is read after the wait), or a primary whose `a`/`b` no earlier kernel of the stream writes
/// (the benches never write A or B on the stream after setup).
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

const CHAIN_LEN: usize = 1000;
const CHAIN_GRID: u32 = 132;
const REPS: usize = 11;
const GEMM_REPS: usize = 21;
const PAIRS_IN_CHAIN: usize = 20;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Milliseconds of the work `f` queues on `stream`, between two events.
fn timed(stream: &Stream, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let start = stream.record()?;
    f()?;
    let end = stream.record()?;
    end.synchronize()?;
    Ok(start.elapsed_ms(&end)? as f64)
}

fn chain_part(dev: &Device, stream: &Stream, pool: &MemPool) -> Result<()> {
    let n = CHAIN_GRID as usize * contract::CHAIN_STEP_THREADS as usize;
    let names = [
        "plain stream launches",
        "PDL stream launches",
        "graph replay",
        "graph replay + PDL",
    ];
    let mut xs: Vec<DeviceBuffer<u32>> = (0..4)
        .map(|_| pool.alloc_async::<u32>(stream, n))
        .collect::<Result<_>>()?;
    for x in xs.iter_mut() {
        x.copy_from_host(&vec![0u32; n])?;
    }
    let mut it = xs.iter_mut();
    let mut chains = Vec::new();
    for pdl in [false, true, false, true] {
        let x = it.next().expect("four buffers");
        let mut chain = Chain::new(dev, stream, pdl)?;
        chain.push_chain_steps(x.as_view_mut(), CHAIN_LEN, CHAIN_GRID)?;
        chains.push(chain);
    }
    let g_plain = chains[2].capture()?;
    let g_pdl = chains[3].capture()?;
    let edges = (g_plain.programmatic_edges()?, g_pdl.programmatic_edges()?);

    let mut runs = [0u32; 4];
    let mut us = vec![Vec::new(); 4];
    for rep in 0..=REPS {
        for mode in 0..4 {
            let ms = timed(stream, || match mode {
                0 | 1 => chains[mode].run(),
                2 => g_plain.launch(),
                _ => g_pdl.launch(),
            })?;
            runs[mode] += 1;
            if rep > 0 {
                // rep 0 is the warm-up.
                us[mode].push(ms * 1000.0 / CHAIN_LEN as f64);
            }
        }
    }
    drop((g_plain, g_pdl));
    drop(chains);
    // Correctness of what was timed: every element was incremented once per kernel.
    for (mode, x) in xs.iter().enumerate() {
        let mut host = vec![0u32; n];
        x.copy_to_host(&mut host)?;
        let want = runs[mode] * CHAIN_LEN as u32;
        if host.iter().any(|&v| v != want) {
            return Err(Error::Verification {
                detail: format!("{}: x != {want} after the runs", names[mode]),
            });
        }
    }

    println!(
        "\n## Chain of {CHAIN_LEN} dependent chain_step kernels ({CHAIN_GRID} CTAs x {} threads), \
         CUDA events, median of {REPS}",
        contract::CHAIN_STEP_THREADS
    );
    println!("| mode | us per kernel (median) | min | max |");
    println!("| --- | --- | --- | --- |");
    let mut med = [0.0; 4];
    for mode in 0..4 {
        let v = &mut us[mode];
        med[mode] = median(v);
        println!(
            "| {} | {:.3} | {:.3} | {:.3} |",
            names[mode],
            med[mode],
            v[0],
            v[v.len() - 1]
        );
    }
    println!(
        "PDL / plain launches: {:.2}x; graph+PDL / graph: {:.2}x; programmatic graph edges: \
         plain {} , PDL {} (of {})",
        med[1] / med[0],
        med[3] / med[2],
        edges.0,
        edges.1,
        CHAIN_LEN - 1
    );
    println!(
        "reference (docs/anchors.md, CUDA C++ on the H100): plain 3.87, PDL 3.26, graph (no PDL) \
         1.14 us per kernel; targets: PDL <= 3.26, graph + PDL <= 1.0"
    );
    Ok(())
}

struct GemmBufs {
    a: DeviceBuffer<f32>,
    b1: DeviceBuffer<f32>,
    b2: DeviceBuffer<f32>,
    c1: DeviceBuffer<f32>,
    c2: DeviceBuffer<f32>,
    st1: DeviceBuffer<u64>,
    st2: DeviceBuffer<u64>,
}

/// One primary + secondary pair; `pdl.0` on the primary's launch, `pdl.1` on the secondary's.
fn pair(
    dev: &Device,
    s: &Stream,
    g: &mut GemmBufs,
    d1: GemmDims,
    d2: GemmDims,
    pdl: (bool, bool),
    stamps: bool,
) -> Result<()> {
    let st1 = stamps.then(|| g.st1.as_view_mut());
    kpdl_gemm(
        dev,
        s,
        GemmKernel::Primary,
        g.a.as_view(),
        g.b1.as_view(),
        g.c1.as_view_mut(),
        d1,
        pdl.0,
        st1,
    )?;
    let st2 = stamps.then(|| g.st2.as_view_mut());
    kpdl_gemm(
        dev,
        s,
        GemmKernel::Secondary,
        g.c1.as_view(),
        g.b2.as_view(),
        g.c2.as_view_mut(),
        d2,
        pdl.1,
        st2,
    )
}

/// Overlap of the secondary with the primary from the stamps of one pair (times relative to the
/// primary's first CTA start, microseconds).
fn overlap_line(what: &str, s1: &[u64], s2: &[u64]) -> String {
    let k = contract::STAMPS_PER_CTA;
    let min = |s: &[u64], i: usize| s.chunks(k).map(|c| c[i]).min().unwrap_or(0);
    let max = |s: &[u64], i: usize| s.chunks(k).map(|c| c[i]).max().unwrap_or(0);
    let t0 = min(s1, 0) as f64;
    let rel = |t: u64| (t as f64 - t0) / 1000.0;
    let p_last_end = max(s1, 2);
    let early = s2.chunks(k).filter(|c| c[0] < p_last_end).count();
    let gap = (min(s2, 0) as f64 - p_last_end as f64) / 1000.0;
    format!(
        "| {what} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {gap:+.2} | {early} of {} |",
        rel(max(s1, 1)),
        rel(p_last_end),
        rel(min(s2, 0)),
        rel(min(s2, 1)),
        rel(max(s2, 2)),
        s2.len() / k,
    )
}

fn gemm_part(dev: &Device, s: &Stream, pool: &MemPool) -> Result<()> {
    // One wave: 8 x 8 tiles = 128 CTAs (64 clusters) on 132 SMs; short kernels (tens of us) so
    // the kernel boundary that PDL hides is a visible part of the pair's time.
    let (m, k, n, p) = (512usize, 512usize, 512usize, 512usize);
    let d1 = GemmDims {
        m: m as u32,
        n: n as u32,
        k: k as u32,
    };
    let d2 = GemmDims {
        m: m as u32,
        n: p as u32,
        k: n as u32,
    };
    let (g1, g2) = (kpdl::gemm_grid(d1) as usize, kpdl::gemm_grid(d2) as usize);
    let mut g = GemmBufs {
        a: pool.alloc_async(s, m * k)?,
        b1: pool.alloc_async(s, k * n)?,
        b2: pool.alloc_async(s, n * p)?,
        c1: pool.alloc_async(s, m * n)?,
        c2: pool.alloc_async(s, m * p)?,
        st1: pool.alloc_async(s, g1 * contract::STAMPS_PER_CTA)?,
        st2: pool.alloc_async(s, g2 * contract::STAMPS_PER_CTA)?,
    };
    g.a.copy_from_host(&random_f32(m * k))?;
    g.b1.copy_from_host(&random_f32(k * n))?;
    g.b2.copy_from_host(&random_f32(n * p))?;

    let modes: [(&str, (bool, bool)); 3] = [
        ("no PDL", (false, false)),
        ("PDL on the secondary", (false, true)),
        ("PDL on both", (true, true)),
    ];
    let mut single = vec![Vec::new(); 3];
    let mut chained = vec![Vec::new(); 3];
    for rep in 0..=GEMM_REPS {
        for (i, &(_, pdl)) in modes.iter().enumerate() {
            let ms1 = timed(s, || pair(dev, s, &mut g, d1, d2, pdl, false))?;
            let msn = timed(s, || {
                for _ in 0..PAIRS_IN_CHAIN {
                    pair(dev, s, &mut g, d1, d2, pdl, false)?;
                }
                Ok(())
            })?;
            if rep > 0 {
                single[i].push(ms1 * 1000.0);
                chained[i].push(msn * 1000.0 / PAIRS_IN_CHAIN as f64);
            }
        }
    }
    println!(
        "\n## GEMM pair: primary C1[{m}x{n}] = A[{m}x{k}] B1[{k}x{n}], secondary C2[{m}x{p}] = \
         C1 B2[{n}x{p}]; {g1} + {g2} CTAs, clusters of {}, CUDA events, median of {GEMM_REPS}",
        contract::CLUSTER_CTAS
    );
    println!(
        "| mode | us per pair (one pair) | us per pair ({PAIRS_IN_CHAIN} pairs back to back) |"
    );
    println!("| --- | --- | --- |");
    let mut med = [(0.0, 0.0); 3];
    for (i, (name, _)) in modes.iter().enumerate() {
        med[i] = (median(&mut single[i]), median(&mut chained[i]));
        println!("| {name} | {:.2} | {:.2} |", med[i].0, med[i].1);
    }
    println!(
        "PDL on the secondary vs no PDL: {:+.2} us per pair ({:+.2} us back to back); \
         PDL on both vs no PDL: {:+.2} us back to back",
        med[1].0 - med[0].0,
        med[1].1 - med[0].1,
        med[2].1 - med[0].1
    );

    // Overlap evidence: one stamped pair per mode (%globaltimer; its resolution is about 1 us).
    println!(
        "\n%globaltimer stamps of one pair, us from the primary's first CTA start; gap = secondary's \
         first CTA start - primary's last CTA end (negative: the secondary ran its prologue while \
         the primary was still running)"
    );
    println!(
        "| mode | primary last trigger | primary last CTA end | secondary first CTA start | \
         secondary first wait return | secondary end | gap | secondary CTAs started before the \
         primary's last CTA ended |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- |");
    for (name, pdl) in [modes[0], modes[1]] {
        pair(dev, s, &mut g, d1, d2, pdl, true)?;
        let mut s1 = vec![0u64; g1 * contract::STAMPS_PER_CTA];
        let mut s2 = vec![0u64; g2 * contract::STAMPS_PER_CTA];
        g.st1.copy_to_host(&mut s1)?;
        g.st2.copy_to_host(&mut s2)?;
        println!("{}", overlap_line(name, &s1, &s2));
    }
    Ok(())
}

fn main() {
    let dev = match Device::open(warpline_suite::support::device_ordinal()) {
        Ok(d) => d,
        Err(e @ (Error::NoDriver | Error::NoDevice { .. })) => {
            warpline_suite::support::skip("pdl bench", e);
            return;
        }
        Err(e) => {
            eprintln!("pdl bench: opening GPU 0 failed: {e}");
            std::process::exit(1);
        }
    };
    let caps = dev.capabilities();
    println!(
        "# PDL bench on {} (compute capability {}.{}, {} SMs)",
        caps.name, caps.compute_capability.0, caps.compute_capability.1, caps.sm_count
    );
    let run = || -> Result<()> {
        let stream = dev.new_stream()?;
        let pool = MemPool::device_default(&dev, 0)?;
        chain_part(&dev, &stream, &pool)?;
        gemm_part(&dev, &stream, &pool)?;
        stream.synchronize()
    };
    if let Err(e) = run() {
        eprintln!("pdl bench failed: {e}");
        std::process::exit(1);
    }
}
