//! Measurements of `warpline mgpu`: peer-copy bandwidth (one way, both ways) with a same-run
//! baseline, NCCL all-reduce bus bandwidth, and the data-parallel step (overlapped, sequential,
//! and the ideal `max(compute, communication)`).
//!
//! Bandwidths are in GB/s (1e9 bytes per second), timed with CUDA events on the streams doing the
//! work (`cuEventElapsedTime`). All-reduce bus bandwidth follows nccl-tests:
//! `busbw = algbw x 2 (n - 1) / n` with `algbw = bytes / time` (for 2 ranks they are equal).

use std::time::Instant;

use crate::driver::{core as drv, peer};
use crate::error::{Error, Result};
use crate::memory::DeviceBuffer;
use crate::stream::Stream;

use super::graphs::{all_reduce_bucket, capture_on_own_threads, DpGpu};
use super::nccl::{all_reduce_sum_group, Communicator};
use super::DeviceSet;

/// Peer-copy bandwidth between two GPUs.
#[derive(Clone, Debug)]
pub struct PeerBandwidth {
    /// Bytes per copy.
    pub bytes: usize,
    /// `cuMemcpyPeerAsync` A -> B, GB/s.
    pub one_way: f64,
    /// `cuMemcpyPeerAsync` A -> B and B -> A at once (one stream per GPU), sum of both, GB/s.
    pub both_ways: f64,
    /// Baseline: `cuMemcpyDtoDAsync` on unified addresses across the peers (what
    /// `cudaMemcpyAsync(..., cudaMemcpyDefault)` does), A -> B, GB/s.
    pub baseline_one_way: f64,
    /// The baseline both ways, GB/s.
    pub baseline_both_ways: f64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum CopyKind {
    Peer,
    Dtod,
}

/// Queues one copy of `bytes` from `src` (GPU of `src_ctx`) to `dst` on `s`.
fn copy_once(
    kind: CopyKind,
    s: &Stream,
    dst: &DeviceBuffer<u8>,
    src: &DeviceBuffer<u8>,
    bytes: usize,
) -> Result<()> {
    crate::device::bind_context(s.ctx(), "cuMemcpyPeerAsync")?;
    // SAFETY: both buffers are live allocations of `bytes`; the caller drains every stream before
    // they are dropped, and nothing else uses them meanwhile.
    unsafe {
        match kind {
            CopyKind::Peer => peer::memcpy_peer_async(
                dst.device_ptr(),
                dst.stream().context_raw(),
                src.device_ptr(),
                src.stream().context_raw(),
                bytes,
                s.raw(),
            ),
            CopyKind::Dtod => {
                drv::memcpy_dtod_async(dst.device_ptr(), src.device_ptr(), bytes, s.raw())
            }
        }
    }
}

/// Measures peer copies of `bytes` between GPUs `a` and `b` of `set`, `iters` copies per figure
/// after 2 warm-up copies. Errors: [`Error::PeerAccessUnavailable`], [`Error::Empty`], CUDA errors.
pub fn peer_copy_bandwidth(
    set: &DeviceSet,
    a: usize,
    b: usize,
    bytes: usize,
    iters: usize,
) -> Result<PeerBandwidth> {
    if bytes == 0 || iters == 0 {
        return Err(Error::Empty {
            what: "peer copy bandwidth (bytes and iterations)",
        });
    }
    set.get(a)?;
    set.get(b)?;
    for (f, t) in [(a, b), (b, a)] {
        if a == b || !set.can_access(f, t) {
            return Err(Error::PeerAccessUnavailable {
                what: "peer_copy_bandwidth",
                from: set.device(f)?.ordinal(),
                to: set.device(t)?.ordinal(),
            });
        }
    }
    let (sa, sb) = (set.device(a)?.new_stream()?, set.device(b)?.new_stream()?);
    let (pa, pb) = (set.pool(a, 0)?, set.pool(b, 0)?);
    let mut buf_a = [
        pa.alloc_async::<u8>(&sa, bytes)?,
        pa.alloc_async::<u8>(&sa, bytes)?,
    ];
    let mut buf_b = [
        pb.alloc_async::<u8>(&sb, bytes)?,
        pb.alloc_async::<u8>(&sb, bytes)?,
    ];
    for x in buf_a.iter_mut().chain(buf_b.iter_mut()) {
        x.fill_async(1)?;
    }
    sa.synchronize()?;
    sb.synchronize()?;
    let measure = |kind: CopyKind, both: bool| -> Result<f64> {
        for _ in 0..2 {
            copy_once(kind, &sa, &buf_b[0], &buf_a[0], bytes)?;
            if both {
                copy_once(kind, &sb, &buf_a[1], &buf_b[1], bytes)?;
            }
        }
        let start = sa.record()?;
        sb.wait(&start)?;
        for _ in 0..iters {
            copy_once(kind, &sa, &buf_b[0], &buf_a[0], bytes)?;
            if both {
                copy_once(kind, &sb, &buf_a[1], &buf_b[1], bytes)?;
            }
        }
        let b_done = sb.record()?;
        sa.wait(&b_done)?;
        let end = sa.record()?;
        let ms = start.elapsed_ms(&end)? as f64;
        let moved = (bytes * iters * if both { 2 } else { 1 }) as f64;
        Ok(moved / (ms * 1e-3) / 1e9)
    };
    let r = (|| {
        Ok(PeerBandwidth {
            bytes,
            one_way: measure(CopyKind::Peer, false)?,
            both_ways: measure(CopyKind::Peer, true)?,
            baseline_one_way: measure(CopyKind::Dtod, false)?,
            baseline_both_ways: measure(CopyKind::Dtod, true)?,
        })
    })();
    // On every exit, success or error: the copies on `sb` write buffers freed on `sa` and the
    // other way round, so both streams drain before any buffer is dropped.
    let (da, db) = (sa.synchronize(), sb.synchronize());
    let r = r?;
    da?;
    db?;
    Ok(r)
}

/// One all-reduce size measured.
#[derive(Clone, Debug)]
pub struct AllReducePoint {
    /// Bytes per rank (f32 elements x 4).
    pub bytes: usize,
    /// Time per all-reduce, microseconds.
    pub micros: f64,
    /// Algorithm bandwidth, GB/s (`bytes / time`).
    pub algbw: f64,
    /// Bus bandwidth, GB/s (`algbw x 2 (n - 1) / n`).
    pub busbw: f64,
}

/// `bytes` to the bus bandwidth of `n` ranks (nccl-tests' definition), GB/s.
pub fn bus_bandwidth(bytes: usize, seconds: f64, n: usize) -> (f64, f64) {
    let alg = bytes as f64 / seconds / 1e9;
    (alg, alg * 2.0 * (n as f64 - 1.0) / n as f64)
}

/// The sizes of the sweep: 1 MiB, 4 MiB, ... 1 GiB (powers of 4), bytes.
pub fn sweep_sizes() -> Vec<usize> {
    (0..6).map(|k| (1usize << 20) << (2 * k)).collect()
}

/// All-reduce sweep with communicators of one process (all of `comms`, grouped), `iters` timed
/// all-reduces per size after 3 warm-ups, timed with events on rank 0's stream (the other ranks'
/// streams are joined to it). Also checks the first size against the CPU: rank r holds `r + 1`
/// everywhere, so every element must end as `n (n + 1) / 2`.
/// Errors: [`Error::Empty`], [`Error::LengthMismatch`] unless there is one communicator per GPU
/// of `set` (rank r on GPU r), those of [`all_reduce_sum_group`], [`Error::Verification`], CUDA
/// errors.
pub fn all_reduce_sweep(
    set: &DeviceSet,
    comms: &[Communicator],
    sizes: &[usize],
    iters: usize,
) -> Result<Vec<AllReducePoint>> {
    let n = comms.len();
    if n == 0 {
        return Err(Error::Empty {
            what: "all_reduce_sweep communicators",
        });
    }
    if iters == 0 {
        return Err(Error::Empty {
            what: "all_reduce_sweep iterations (a time per all-reduce needs at least 1)",
        });
    }
    if n != set.len() {
        return Err(Error::LengthMismatch {
            what: "all_reduce_sweep",
            detail: format!("{n} communicators for {} GPUs; one per GPU", set.len()),
        });
    }
    let mut out = Vec::new();
    for (k, &bytes) in sizes.iter().enumerate() {
        let elems = (bytes / 4).max(1);
        let mut bufs: Vec<DeviceBuffer<f32>> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let pool = set.pool(r, 0)?;
                let mut b = pool.alloc_async::<f32>(c.stream(), elems)?;
                b.fill_async((r + 1) as f32)?;
                Ok(b)
            })
            .collect::<Result<_>>()?;
        let group = |bufs: &mut Vec<DeviceBuffer<f32>>| {
            let mut refs: Vec<&mut DeviceBuffer<f32>> = bufs.iter_mut().collect();
            all_reduce_sum_group(comms, &mut refs)
        };
        if k == 0 {
            group(&mut bufs)?;
            let want = (n * (n + 1) / 2) as f32;
            for (r, b) in bufs.iter().enumerate() {
                let mut host = vec![0f32; elems];
                b.copy_to_host(&mut host)?;
                if let Some(i) = host.iter().position(|&v| v != want) {
                    return Err(Error::Verification {
                        detail: format!(
                            "all-reduce of {bytes} bytes: rank {r} element {i} is {}, the CPU sum is {want}",
                            host[i]
                        ),
                    });
                }
            }
        }
        for _ in 0..3 {
            group(&mut bufs)?;
        }
        let s0 = comms[0].stream();
        let start = s0.record()?;
        for c in &comms[1..] {
            c.stream().wait(&start)?;
        }
        for _ in 0..iters {
            group(&mut bufs)?;
        }
        for c in &comms[1..] {
            let e = c.stream().record()?;
            s0.wait(&e)?;
        }
        let end = s0.record()?;
        let secs = start.elapsed_ms(&end)? as f64 * 1e-3 / iters as f64;
        let (algbw, busbw) = bus_bandwidth(elems * 4, secs, n);
        out.push(AllReducePoint {
            bytes: elems * 4,
            micros: secs * 1e6,
            algbw,
            busbw,
        });
        // Only the communicators' streams (everything of this size ran there), each with the
        // communicator's bound: never the whole contexts (issue 24).
        for c in comms {
            c.synchronize()?;
        }
    }
    Ok(out)
}

/// All-reduce sweep of one rank of a one-process-per-GPU communicator: the same sizes and
/// iterations on every rank; timed with events on this rank's stream. Checks the first size
/// (rank r holds `r + 1`). Errors as [`all_reduce_sweep`].
///
/// # Safety
/// Every rank of `comm` runs this function with the same `sizes` and `iters`, so that every
/// all-reduce has the same length on every rank ([`Communicator::all_reduce_sum`]'s contract).
pub unsafe fn all_reduce_sweep_rank(
    dev: &crate::Device,
    comm: &Communicator,
    sizes: &[usize],
    iters: usize,
) -> Result<Vec<AllReducePoint>> {
    if iters == 0 {
        return Err(Error::Empty {
            what: "all_reduce_sweep_rank iterations (a time per all-reduce needs at least 1)",
        });
    }
    let n = comm.world_size();
    let pool = crate::MemPool::new(dev, 0)?;
    let mut out = Vec::new();
    for (k, &bytes) in sizes.iter().enumerate() {
        let elems = (bytes / 4).max(1);
        let mut b = pool.alloc_async::<f32>(comm.stream(), elems)?;
        b.fill_async((comm.rank() + 1) as f32)?;
        // SAFETY (every all_reduce_sum below): the caller's contract gives every rank the same
        // sequence of lengths (`sizes`, `iters`).
        if k == 0 {
            unsafe { comm.all_reduce_sum(&mut b)? };
            let want = (n * (n + 1) / 2) as f32;
            let mut host = vec![0f32; elems];
            b.copy_to_host(&mut host)?;
            if let Some(i) = host.iter().position(|&v| v != want) {
                return Err(Error::Verification {
                    detail: format!(
                        "all-reduce of {bytes} bytes: rank {} element {i} is {}, the CPU sum is {want}",
                        comm.rank(),
                        host[i]
                    ),
                });
            }
        }
        for _ in 0..3 {
            unsafe { comm.all_reduce_sum(&mut b)? };
        }
        let start = comm.stream().record()?;
        for _ in 0..iters {
            unsafe { comm.all_reduce_sum(&mut b)? };
        }
        let end = comm.stream().record()?;
        let secs = start.elapsed_ms(&end)? as f64 * 1e-3 / iters as f64;
        let (algbw, busbw) = bus_bandwidth(elems * 4, secs, n);
        out.push(AllReducePoint {
            bytes: elems * 4,
            micros: secs * 1e6,
            algbw,
            busbw,
        });
        comm.synchronize()?;
    }
    Ok(out)
}

/// How the data-parallel step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepMode {
    /// Bucket k's all-reduce (communication stream) overlaps bucket k+1's compute.
    Overlapped,
    /// Compute waits for each all-reduce before the next bucket.
    Sequential,
    /// Compute only (no all-reduce).
    ComputeOnly,
    /// All-reduces only (no compute).
    CommOnly,
}

/// SMs the data-parallel step's GEMM leaves free for NCCL's all-reduce kernels.
pub const DP_NCCL_SMS: u32 = 16;

/// Options of the data-parallel step ([`data_parallel_step_with`]), also the flags of
/// `warpline mgpu dp-step` (defaults as [`DataParallelConfig::default`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataParallelConfig {
    /// Gradient buckets per step (>= 1).
    pub buckets: usize,
    /// 128x128 f32 tiles per bucket (bucket = `tiles` x 64 KiB per GPU).
    pub tiles: usize,
    /// GEMM layers per bucket (>= 1).
    pub layers: usize,
    /// Timed steps per mode, after one warm-up step (>= 1).
    pub steps: usize,
    /// Also capture each GPU's compute into CUDA graphs (one per bucket, see
    /// `multi::graphs`), replay them with `cuGraphLaunch` (NCCL outside the graphs), and time
    /// the graph-replayed step next to the eager one in the same run.
    pub graphs: bool,
    /// Check the step's result: every bucket of every GPU against the f64 CPU reference (first
    /// and last tile, bound 1e-4), and, with `graphs`, the graph-replayed step bit for bit
    /// against the eager step.
    pub verify: bool,
}

impl DataParallelConfig {
    /// Checks the options without a GPU (issue 19 item 15: the CLI calls it before opening
    /// any). Errors: the GEMM's shape errors for `tiles` ([`Error::Empty`], [`Error::TooLarge`]),
    /// [`Error::Empty`] for zero buckets, layers or steps.
    pub fn check(&self) -> Result<()> {
        // Saturating: check_gemm_shapes refuses tiles above MAX_TILES before using the lengths.
        let elems = self.tiles.saturating_mul(128 * 128);
        crate::kernels::check_gemm_shapes(self.tiles, elems, elems, elems)?;
        if self.buckets == 0 || self.layers == 0 || self.steps == 0 {
            return Err(Error::Empty {
                what: "data-parallel step (buckets, layers, steps)",
            });
        }
        Ok(())
    }
}

impl Default for DataParallelConfig {
    /// 8 buckets of 400 tiles, 4 layers, 10 steps, no graphs, no verification (the CLI's
    /// defaults).
    fn default() -> Self {
        Self {
            buckets: 8,
            tiles: 400,
            layers: 4,
            steps: 10,
            graphs: false,
            verify: false,
        }
    }
}

/// Times per step of the data-parallel step, milliseconds.
#[derive(Clone, Debug)]
pub struct DataParallelReport {
    /// Buckets per step.
    pub buckets: usize,
    /// Bytes per bucket (per GPU).
    pub bucket_bytes: usize,
    /// Overlapped step.
    pub overlapped_ms: f64,
    /// Sequential step.
    pub sequential_ms: f64,
    /// Compute alone.
    pub compute_ms: f64,
    /// All-reduces alone.
    pub comm_ms: f64,
    /// Overlapped step with each GPU's compute replayed from CUDA graphs (with `graphs`).
    pub graph_overlapped_ms: Option<f64>,
    /// Compute alone, replayed from CUDA graphs (with `graphs`).
    pub graph_compute_ms: Option<f64>,
    /// Worst tile relative error against the CPU reference (with `verify`; eager and, with
    /// `graphs`, graph-replayed steps).
    pub max_rel_error: Option<f64>,
    /// With `verify` and `graphs`: the graph-replayed step's buckets equal the eager step's,
    /// bit for bit (a mismatch is an [`Error::Verification`], so this is `Some(true)`).
    pub graph_matches_eager: Option<bool>,
}

impl DataParallelReport {
    /// The ideal step, `max(compute, communication)`, ms.
    pub fn ideal_ms(&self) -> f64 {
        self.compute_ms.max(self.comm_ms)
    }
}

/// The data-parallel step over every GPU of `set` (one process, communicators of
/// [`Communicator::init_all`] on high-priority streams): per bucket, each GPU computes a gradient
/// bucket (`layers` batched GEMMs of `tiles` tiles on its compute stream), moves it to the
/// communication stream (event), and the buckets are all-reduced there (grouped). Each mode runs
/// `steps` steps after one warm-up step; times are host wall-clock per step with the step's own streams drained (never whole contexts).
/// The same as [`data_parallel_step_with`] without graphs or verification.
pub fn data_parallel_step(
    set: &DeviceSet,
    comms: &[Communicator],
    buckets: usize,
    tiles: usize,
    layers: usize,
    steps: usize,
) -> Result<DataParallelReport> {
    data_parallel_step_with(
        set,
        comms,
        &DataParallelConfig {
            buckets,
            tiles,
            layers,
            steps,
            graphs: false,
            verify: false,
        },
    )
}

/// [`data_parallel_step`] with options: with `cfg.graphs`, each GPU's per-bucket GEMM layers are
/// also captured into CUDA graphs on that GPU's compute stream (stream capture from a thread of
/// its own, with its context bound; one graph per GPU and bucket) and the overlapped and
/// compute-only steps are timed again with `cuGraphLaunch` replays; the NCCL all-reduces stay
/// outside the graphs, ordered by events as in the eager step (NCCL's user guide warns that
/// graphs with collectives of several GPUs of one process may deadlock; see `multi::graphs`).
/// With `cfg.verify`, results are checked (see [`DataParallelConfig::verify`]).
///
/// Times: host wall-clock per step, ms, the step's streams (compute and communicators') drained
/// before and after the timed steps; no whole-context wait (issue 24).
/// Inputs: GPU i holds its own deterministic `x_i`, `w_i`; after a step every bucket of every GPU
/// holds `sum_i x_i w_i` (per 128x128 tile).
/// Errors: [`Error::Empty`] (zero buckets, layers or steps), the GEMM's shape errors,
/// [`Error::Verification`], [`Error::Nccl`], [`Error::Cuda`] (capture, instantiate, launch).
pub fn data_parallel_step_with(
    set: &DeviceSet,
    comms: &[Communicator],
    cfg: &DataParallelConfig,
) -> Result<DataParallelReport> {
    let DataParallelConfig {
        buckets,
        tiles,
        layers,
        steps,
        ..
    } = *cfg;
    cfg.check()?;
    // tiles <= MAX_TILES (checked), so the product fits.
    let elems = tiles * 128 * 128;
    let n = set.len();
    if comms.len() != n {
        return Err(Error::LengthMismatch {
            what: "data_parallel_step communicators",
            detail: format!("{} communicators for {n} GPUs; one per GPU", comms.len()),
        });
    }
    // The GEMM is persistent (one 200 KiB CTA per SM): on every SM it leaves NCCL's kernels no
    // SM until a layer ends. Leave DP_NCCL_SMS SMs free for them, in every mode, so compute-only
    // and overlapped run the same GEMM. (On its own this did not make the step overlap on two
    // H200s; the per-step buffer move below did.)
    // Compute streams come from each context's stock of spare streams (made when the device
    // opened), so the step creates no stream while another thread's on-stream wait (a fence
    // guard, a signal wait) is pending: stream creation is gated then and would fail with
    // Error::WaitPending (issue 24). Declared before `gpus`, so dropped after them.
    let mut spares: Vec<crate::stream::SpareStream> = Vec::with_capacity(n);
    let mut gpus: Vec<DpGpu<'_>> = Vec::with_capacity(n);
    for i in 0..n {
        let dev = set.device(i)?;
        let sms = dev.capabilities().sm_count;
        let ctas = sms
            .saturating_sub(DP_NCCL_SMS)
            .max(1)
            .min(tiles.max(1) as u32);
        let spare = crate::stream::SpareStream::take_in(dev.context())?;
        let compute = spare.stream().clone();
        spares.push(spare);
        let pool = set.pool(i, u64::MAX)?;
        gpus.push(DpGpu::new(
            dev,
            compute,
            &pool,
            i,
            (buckets, tiles, layers, ctas),
        )?);
    }
    // Waits for the step's own streams only, never whole contexts: a caller's stream that waits
    // on a fence ticket never submitted would otherwise make the step wait forever (issue 24).
    // The communicators' streams first, each with its bound (a compute stream may wait on their
    // events, in the sequential mode); the compute streams only if those drained.
    let drain = |gpus: &[DpGpu<'_>]| -> Result<()> {
        for c in comms {
            c.synchronize()?;
        }
        let mut first = Ok(());
        for g in gpus {
            let r = g.compute().synchronize();
            if first.is_ok() {
                first = r;
            }
        }
        first
    };
    drain(&gpus)?;
    let step = |gpus: &mut [DpGpu<'_>], mode: StepMode, graph: bool| -> Result<()> {
        // The gradient buffers come back to the compute streams once per step (after the
        // previous step's all-reduces, as an optimizer step would). Moving each bucket back at
        // its turn instead records the event on the communication stream *then*, behind the
        // all-reduce just queued for the previous bucket, which serialized compute and
        // communication completely (measured: overlapped = sequential on two H200s).
        for g in gpus.iter_mut() {
            g.grads_to_compute()?;
        }
        for k in 0..buckets {
            for (i, g) in gpus.iter_mut().enumerate() {
                if mode != StepMode::CommOnly {
                    g.compute_bucket(k, graph)?;
                }
                g.grad_to(k, comms[i].stream())?;
            }
            if mode != StepMode::ComputeOnly {
                all_reduce_bucket(gpus, comms, k)?;
            }
            if mode == StepMode::Sequential {
                for (i, g) in gpus.iter().enumerate() {
                    let e = comms[i].stream().record_marker()?;
                    g.compute().wait(&e)?;
                }
            }
        }
        Ok(())
    };
    let time = |gpus: &mut [DpGpu<'_>], mode: StepMode, graph: bool| -> Result<f64> {
        step(gpus, mode, graph)?;
        drain(gpus)?;
        let t0 = Instant::now();
        for _ in 0..steps {
            step(gpus, mode, graph)?;
        }
        drain(gpus)?;
        Ok(t0.elapsed().as_secs_f64() * 1e3 / steps as f64)
    };
    let overlapped_ms = time(&mut gpus, StepMode::Overlapped, false)?;
    let sequential_ms = time(&mut gpus, StepMode::Sequential, false)?;
    let compute_ms = time(&mut gpus, StepMode::ComputeOnly, false)?;
    let comm_ms = time(&mut gpus, StepMode::CommOnly, false)?;
    let mut report = DataParallelReport {
        buckets,
        bucket_bytes: elems * 4,
        overlapped_ms,
        sequential_ms,
        compute_ms,
        comm_ms,
        graph_overlapped_ms: None,
        graph_compute_ms: None,
        max_rel_error: None,
        graph_matches_eager: None,
    };
    // One checked step: its buckets (every GPU, every bucket) against the CPU reference.
    let mut checked_step = |gpus: &mut [DpGpu<'_>], graph: bool| -> Result<Vec<Vec<Vec<f32>>>> {
        step(gpus, StepMode::Overlapped, graph)?;
        drain(gpus)?;
        let got: Vec<Vec<Vec<f32>>> = gpus
            .iter()
            .map(|g| (0..g.buckets()).map(|k| g.read_grad(k)).collect())
            .collect::<Result<_>>()?;
        let e = verify_step(gpus, &got, tiles, if graph { "graph" } else { "eager" })?;
        report.max_rel_error = Some(report.max_rel_error.unwrap_or(0.0).max(e));
        Ok(got)
    };
    let eager = if cfg.verify {
        Some(checked_step(&mut gpus, false)?)
    } else {
        None
    };
    if cfg.graphs {
        capture_on_own_threads(&mut gpus)?;
        debug_assert!(gpus.iter().all(DpGpu::has_graphs));
        report.graph_overlapped_ms = Some(time(&mut gpus, StepMode::Overlapped, true)?);
        report.graph_compute_ms = Some(time(&mut gpus, StepMode::ComputeOnly, true)?);
        if let Some(eager) = &eager {
            let replayed = checked_step(&mut gpus, true)?;
            compare_bitwise(eager, &replayed)?;
            report.graph_matches_eager = Some(true);
        }
    }
    drain(&gpus)?;
    Ok(report)
}

/// Checks the first and last tile of every bucket of every GPU against `sum_i x_i w_i` (f64),
/// bound 1e-4 per tile (relative Frobenius norm). Returns the worst tile error.
fn verify_step(gpus: &[DpGpu<'_>], got: &[Vec<Vec<f32>>], tiles: usize, what: &str) -> Result<f64> {
    const TILE: usize = 128 * 128;
    let mut worst = 0f64;
    let picks: Vec<usize> = if tiles > 1 {
        vec![0, tiles - 1]
    } else {
        vec![0]
    };
    for &t in &picks {
        let mut want = vec![0f64; TILE];
        for g in gpus {
            let (x, w) = g.inputs();
            let part = crate::reference::gemm_tiles_f64(
                &x[t * TILE..][..TILE],
                &w[t * TILE..][..TILE],
                1,
            )?;
            for (o, p) in want.iter_mut().zip(part) {
                *o += p;
            }
        }
        for (i, buckets) in got.iter().enumerate() {
            for (k, b) in buckets.iter().enumerate() {
                let e = crate::reference::verify_gemm(
                    &format!("data-parallel step ({what}) GPU {i} bucket {k} tile {t}"),
                    &b[t * TILE..][..TILE],
                    &want,
                    1e-4,
                )?;
                worst = worst.max(e);
            }
        }
    }
    Ok(worst)
}

/// [`Error::Verification`] unless the graph-replayed buckets equal the eager ones bit for bit.
fn compare_bitwise(eager: &[Vec<Vec<f32>>], replayed: &[Vec<Vec<f32>>]) -> Result<()> {
    for (i, (ge, gr)) in eager.iter().zip(replayed).enumerate() {
        for (k, (be, br)) in ge.iter().zip(gr).enumerate() {
            if let Some(j) = super::first_bit_difference(be, br) {
                return Err(Error::Verification {
                    detail: format!(
                        "data-parallel step: graph replay differs from the eager step at GPU {i} \
                         bucket {k} element {j}: {} (graph) vs {} (eager)",
                        br[j], be[j]
                    ),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_bandwidth_of_two_ranks_equals_algorithm_bandwidth() {
        let (alg, bus) = bus_bandwidth(1 << 30, 1.0, 2);
        assert!((alg - bus).abs() < 1e-12);
        let (alg, bus) = bus_bandwidth(1 << 30, 1.0, 4);
        assert!((bus / alg - 1.5).abs() < 1e-12);
        assert_eq!(sweep_sizes().first(), Some(&(1 << 20)));
        assert_eq!(sweep_sizes().last(), Some(&(1 << 30)));
    }
}
