//! The chapter's two-GPU layer pipeline ("Multi-GPU Compute and Data Transfer Overlap with CUDA
//! Streams"): GPU A runs stage 1 (the first `layers` layers) of each microbatch on its compute
//! stream, a high-priority communication stream of A waits on an event and copies the activations
//! to GPU B with `cuMemcpyPeerAsync` (copy engines, NVLink), and GPU B runs stage 2 (the other
//! `layers` layers). Microbatches overlap: while n+1 computes on A, n moves and n-1 computes on B.
//! The next microbatch's H2D is staged from pinned memory on a copy stream of A, results go back
//! to pinned memory on a copy stream of B, and every buffer comes from a pool of its GPU allocated
//! in stream order ([`DeviceSet::pool`], `cuMemAllocFromPoolAsync`).
//!
//! A layer is the batched FP32 GEMM `tile_gemm` (`H_t <- H_t x W`, 128x128 row-major tiles,
//! `tiles` tiles per microbatch, one 128x128 weight per stage). [`Placement::OneGpu`] runs both
//! stages on GPU A (same streams, same buffers, no peer copy): the baseline of the >= 1.8x goal.
//!
//! Ordering: a ring of `slots` microbatch slots, each with its own buffers. Every reuse of a slot
//! waits for an event of the last user of each buffer (the H2D waits until stage 1 read the input,
//! stage 1 waits until the previous copy read its output, the copy waits until stage 2 read the
//! previous activations, stage 2 waits until the D2H read its previous result). Events of one GPU
//! are waited on by streams of the other (`cuStreamWaitEvent` accepts an event of another
//! context). All buffers are freed only after both GPUs have drained.
//!
//! **CUDA graphs** ([`LayerPipeline::capture_graphs`]): each GPU's compute of each slot is
//! captured into a graph of its own on that GPU's compute stream (GPU A: stage 1, and stage 2 too
//! with [`Placement::OneGpu`]; GPU B: stage 2), each GPU's graphs from a scoped thread of its own
//! with its context bound (thread-local capture), instantiated once and replayed with
//! `cuGraphLaunch`. The peer copy, the H2D and the D2H stay outside the graphs, on their own
//! streams, ordered by the same events: a copy inside A's graph would make the graph (and so
//! stage 1 of the next microbatch, queued behind it on A's compute stream) wait for the copy, and
//! the copy of n would no longer overlap the compute of n+1. The only ordering change is that
//! "the input may be reused" (`x_free`, `r_free`) is recorded after a stage's graph rather than
//! after its first layer; a slot is reused only `slots` microbatches later.

use std::time::Instant;

use crate::device::Device;
use crate::driver::graph::{CaptureGuard, CudaGraph, GraphExec};
use crate::error::{Error, Result};
use crate::kernels::tile_gemm;
use crate::memory::{DeviceBuffer, PinnedBuffer};
use crate::reference;
use crate::stream::{Event, Stream};

use super::DeviceSet;
use crate::driver::{core as drv, peer};

/// Elements of one 128x128 tile.
const TILE_ELEMS: usize = 128 * 128;
/// FLOPs of one 128x128x128 tile GEMM.
const TILE_FLOPS: f64 = 2.0 * 128.0 * 128.0 * 128.0;

/// Where the two stages run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Stage 1 on GPU A, stage 2 on GPU B, activations copied peer to peer.
    TwoGpus,
    /// Both stages on GPU A (the one-GPU baseline).
    OneGpu,
}

/// Shape of a [`LayerPipeline`] run.
#[derive(Clone, Copy, Debug)]
pub struct LayerPipelineConfig {
    /// 128x128 f32 tiles per microbatch (activations: `tiles x 64 KiB`), 1 to
    /// `warpline_gpu::contract::gemm::MAX_TILES`.
    pub tiles: usize,
    /// GEMM layers per stage (>= 1).
    pub layers: usize,
    /// Microbatch slots in flight (2 to 8).
    pub slots: usize,
}

impl Default for LayerPipelineConfig {
    fn default() -> Self {
        Self {
            tiles: 264,
            layers: 16,
            slots: 3,
        }
    }
}

impl LayerPipelineConfig {
    /// Checks the shape without a GPU. Errors: [`Error::Empty`], [`Error::TooLarge`],
    /// [`Error::BadShape`].
    pub fn check(&self) -> Result<()> {
        // Saturating: check_gemm_shapes refuses tiles above MAX_TILES before using the lengths.
        let elems = self.tiles.saturating_mul(TILE_ELEMS);
        crate::kernels::check_gemm_shapes(self.tiles, elems, elems, elems)?;
        if self.layers == 0 {
            return Err(Error::Empty {
                what: "layer pipeline layers per stage",
            });
        }
        if !(2..=8).contains(&self.slots) {
            return Err(Error::BadShape {
                what: "layer pipeline slots",
                detail: format!("{} slots; allowed: 2 to 8", self.slots),
            });
        }
        Ok(())
    }

    /// Bytes of activations per microbatch (saturating at `usize::MAX` for shapes that
    /// [`Self::check`] refuses).
    pub fn activation_bytes(&self) -> usize {
        self.tiles.saturating_mul(TILE_ELEMS * 4)
    }

    /// FLOPs of one microbatch (both stages).
    pub fn flops_per_microbatch(&self) -> f64 {
        2.0 * self.layers as f64 * self.tiles as f64 * TILE_FLOPS
    }
}

/// What a [`LayerPipeline::run`] measured.
#[derive(Clone, Debug)]
pub struct LayerPipelineReport {
    /// Where the stages ran.
    pub placement: Placement,
    /// Microbatches timed (after one warm-up round of `slots`).
    pub microbatches: usize,
    /// Whether each GPU's compute was replayed from CUDA graphs
    /// ([`LayerPipeline::capture_graphs`]) rather than launched kernel by kernel.
    pub graphs: bool,
    /// Wall time of the timed microbatches, seconds (host clock, both GPUs drained).
    pub seconds: f64,
    /// Worst per-tile relative error of the checked tiles against the f64 CPU reference
    /// (`None` when not verified).
    pub max_rel_error: Option<f64>,
    /// From [`LayerPipeline::run_eager_then_graphs`] with `verify`: every slot's output of the
    /// graph-replayed run equals the eager run's bit for bit (a mismatch is an
    /// [`Error::Verification`], so this is `Some(true)`); `None` otherwise.
    pub graph_matches_eager: Option<bool>,
    /// The configuration.
    pub config: LayerPipelineConfig,
}

impl LayerPipelineReport {
    /// Microbatches per second.
    pub fn microbatches_per_s(&self) -> f64 {
        self.microbatches as f64 / self.seconds
    }

    /// GEMM throughput, GFLOP/s (both stages).
    pub fn gflops(&self) -> f64 {
        self.config.flops_per_microbatch() * self.microbatches as f64 / self.seconds / 1e9
    }
}

/// Buffers of one microbatch slot.
struct Slot {
    input: PinnedBuffer<f32>,
    output: PinnedBuffer<f32>,
    /// GPU A: input, then ping-pong activations of stage 1 (and stage 2 for one GPU).
    x: DeviceBuffer<f32>,
    a: [DeviceBuffer<f32>; 2],
    /// GPU B: received activations and ping-pong of stage 2 (unused for one GPU).
    b: Option<(DeviceBuffer<f32>, [DeviceBuffer<f32>; 2])>,
    ev: SlotEvents,
}

#[derive(Default)]
struct SlotEvents {
    x_free: Option<Event>,
    x_ready: Option<Event>,
    h_ready: Option<Event>,
    h_sent: Option<Event>,
    r_free: Option<Event>,
    y_ready: Option<Event>,
    y_out: Option<Event>,
}

fn wait_opt(s: &Stream, e: &Option<Event>) -> Result<()> {
    match e {
        Some(e) => s.wait(e),
        None => Ok(()),
    }
}

/// One GPU's captured compute of one slot: the instantiated graph and the index in the slot's
/// ping-pong pair that holds the result. Field order: the executable graph is destroyed before
/// the graph it came from.
struct StageGraph {
    exec: GraphExec,
    _graph: CudaGraph,
    out: usize,
}

/// The graphs of [`LayerPipeline::capture_graphs`], one per slot and GPU.
struct PipelineGraphs {
    /// GPU A, per slot: stage 1 (both stages with [`Placement::OneGpu`]), captured on `ca`.
    a: Vec<StageGraph>,
    /// GPU B, per slot: stage 2, captured on `cb` (empty with [`Placement::OneGpu`]).
    b: Vec<StageGraph>,
}

/// The two-GPU layer pipeline over GPUs `a` and `b` of a [`DeviceSet`] (see the module docs).
///
/// Optionally replays each GPU's compute from CUDA graphs ([`LayerPipeline::capture_graphs`]).
/// The graphs capture device pointers of the pipeline's own buffers; they are owned by the
/// pipeline next to those buffers (private fields, never replaced while the graphs live) and
/// destroyed before them, so no graph outlives what it touches.
pub struct LayerPipeline<'s> {
    // Declared first: destroyed (in `Drop`, each GPU's context bound) before the buffers they
    // captured.
    graphs: Option<PipelineGraphs>,
    set: &'s DeviceSet,
    a: usize,
    b: usize,
    placement: Placement,
    cfg: LayerPipelineConfig,
    h2d: Stream,
    ca: Stream,
    comm: Stream,
    cb: Stream,
    d2h: Stream,
    w1: DeviceBuffer<f32>,
    w2: DeviceBuffer<f32>,
    /// One weight tile per stage (host copies, for the reference).
    w_host: [Vec<f32>; 2],
    slots: Vec<Slot>,
    /// Test hook: the enqueue step that fails next (issue 19, item 6).
    #[cfg(test)]
    fail_at: Option<usize>,
    #[cfg(not(test))]
    fail_at: (),
}

impl<'s> LayerPipeline<'s> {
    /// Sets up the pipeline: streams, pools, weights and the ring of slots (pinned inputs filled
    /// with a different pattern per slot). For [`Placement::TwoGpus`] `a != b` and each must be
    /// able to access the other ([`Error::PeerAccessUnavailable`]); for [`Placement::OneGpu`] `b`
    /// is ignored. Errors: those of [`LayerPipelineConfig::check`], [`Error::BadShape`] for
    /// positions outside the set or `a == b` with two GPUs, allocation and CUDA errors.
    pub fn new(
        set: &'s DeviceSet,
        a: usize,
        b: usize,
        placement: Placement,
        cfg: LayerPipelineConfig,
    ) -> Result<Self> {
        cfg.check()?;
        let b = if placement == Placement::OneGpu { a } else { b };
        if a >= set.len() || b >= set.len() || (placement == Placement::TwoGpus && a == b) {
            return Err(Error::BadShape {
                what: "LayerPipeline GPUs",
                detail: format!(
                    "GPUs {a} and {b} of a set of {}; allowed: two distinct positions of the set (one for Placement::OneGpu)",
                    set.len()
                ),
            });
        }
        if placement == Placement::TwoGpus {
            for (f, t) in [(a, b), (b, a)] {
                if !set.can_access(f, t) {
                    return Err(Error::PeerAccessUnavailable {
                        what: "LayerPipeline",
                        from: set.device(f)?.ordinal(),
                        to: set.device(t)?.ordinal(),
                    });
                }
            }
        }
        let (da, db) = (set.device(a)?, set.device(b)?);
        let h2d = da.new_stream()?;
        let ca = da.new_stream()?;
        let comm = set.high_priority_stream(a)?;
        let cb = if placement == Placement::TwoGpus {
            db.new_stream()?
        } else {
            ca.clone()
        };
        let d2h = db.new_stream()?;
        let n = cfg.tiles * TILE_ELEMS;
        let pool_a = set.pool(a, u64::MAX)?;
        let pool_b = if placement == Placement::TwoGpus {
            set.pool(b, u64::MAX)?
        } else {
            pool_a.clone()
        };
        let scale = (3.0f32 / 128.0).sqrt();
        let w_host = [weight_tile(1, scale), weight_tile(2, scale)];
        let mut w1 = pool_a.alloc_async::<f32>(&ca, n)?;
        let mut w2 = pool_b.alloc_async::<f32>(&cb, n)?;
        w1.copy_from_host(&w_host[0].repeat(cfg.tiles))?;
        w2.copy_from_host(&w_host[1].repeat(cfg.tiles))?;
        let mut slots = Vec::with_capacity(cfg.slots);
        for s in 0..cfg.slots {
            let input = PinnedBuffer::from_slice(da, &input_pattern(s, n))?;
            let output = PinnedBuffer::<f32>::new(db, n)?;
            let x = pool_a.alloc_async::<f32>(&ca, n)?;
            let a2 = [
                pool_a.alloc_async::<f32>(&ca, n)?,
                pool_a.alloc_async::<f32>(&ca, n)?,
            ];
            let b3 = if placement == Placement::TwoGpus {
                Some((
                    pool_b.alloc_async::<f32>(&cb, n)?,
                    [
                        pool_b.alloc_async::<f32>(&cb, n)?,
                        pool_b.alloc_async::<f32>(&cb, n)?,
                    ],
                ))
            } else {
                None
            };
            slots.push(Slot {
                input,
                output,
                x,
                a: a2,
                b: b3,
                ev: SlotEvents::default(),
            });
        }
        // Allocations (stream-ordered on ca/cb) come before any use on the copy streams.
        ca.synchronize()?;
        cb.synchronize()?;
        Ok(Self {
            graphs: None,
            set,
            a,
            b,
            placement,
            cfg,
            h2d,
            ca,
            comm,
            cb,
            d2h,
            w1,
            w2,
            w_host,
            slots,
            fail_at: Default::default(),
        })
    }

    /// Queues microbatch `n` (slot `n % slots`). On an error part of it may be queued while the
    /// slot's events still mark the previous microbatch: a later H2D would wait for a stale
    /// `x_free` and overwrite an input a queued kernel still reads (issue 19, item 6). So every
    /// error path drains the pipeline's streams (everything queued has then completed) and
    /// forgets every slot's events (nothing is in flight for them to order) before returning
    /// the error.
    fn enqueue(&mut self, n: usize) -> Result<()> {
        let r = self.enqueue_unchecked(n);
        if r.is_err() {
            let _ = self.drain();
            for sl in &mut self.slots {
                sl.ev = SlotEvents::default();
            }
        }
        r
    }

    /// Fails step `step` of an enqueue when the test hook asks for it.
    #[cfg(test)]
    fn fault(fail_at: &mut Option<usize>, step: usize) -> Result<()> {
        if *fail_at == Some(step) {
            *fail_at = None;
            return Err(Error::BadShape {
                what: "layer pipeline (injected fault)",
                detail: format!("step {step}"),
            });
        }
        Ok(())
    }

    #[cfg(not(test))]
    #[inline(always)]
    fn fault(_: &mut (), _: usize) -> Result<()> {
        Ok(())
    }

    fn enqueue_unchecked(&mut self, n: usize) -> Result<()> {
        let Self {
            graphs,
            set,
            a,
            b,
            placement,
            cfg,
            h2d,
            ca,
            comm,
            cb,
            d2h,
            w1,
            w2,
            slots,
            fail_at,
            ..
        } = self;
        let (da, db) = (set.device(*a)?, set.device(*b)?);
        let slot = n % cfg.slots;
        let sl = &mut slots[slot];
        let bytes = cfg.activation_bytes();
        let two = *placement == Placement::TwoGpus;
        let ev = &mut sl.ev;
        // H2D of the staged input once stage 1 has read the slot's previous input.
        wait_opt(h2d, &ev.x_free)?;
        da.bind()?;
        // SAFETY: the pinned input and x are live allocations of `bytes`; x is read only by
        // stage 1, which waits for x_ready; the pinned input is never written again.
        unsafe {
            drv::memcpy_htod_async(
                sl.x.device_ptr(),
                sl.input.as_ptr().cast(),
                bytes,
                h2d.raw(),
            )
        }?;
        Self::fault(fail_at, 0)?;
        ev.x_ready = Some(h2d.record_marker()?);
        // Stage 1 on A (both stages for one GPU), once the slot's previous activations were sent
        // (two GPUs) or copied back (one GPU).
        wait_opt(ca, &ev.x_ready)?;
        wait_opt(ca, &ev.h_sent)?;
        if !two {
            wait_opt(ca, &ev.y_out)?;
        }
        let cur = if let Some(g) = graphs.as_ref() {
            // The slot's captured stage 1 (both stages for one GPU); x is free after it.
            let cur = launch_stage(da, ca, &g.a[slot])?;
            ev.x_free = Some(ca.record_marker()?);
            cur
        } else {
            let (mut cur, first) = run_layers(
                da,
                ca,
                cfg.tiles,
                Some(&sl.x),
                &mut sl.a,
                w1,
                cfg.layers,
                0,
                true,
            )?;
            Self::fault(fail_at, 1)?;
            ev.x_free = first;
            if !two {
                cur = run_layers(
                    da, ca, cfg.tiles, None, &mut sl.a, w2, cfg.layers, cur, false,
                )?
                .0;
            }
            cur
        };
        ev.h_ready = Some(ca.record_marker()?);
        let out_dev = if let Some((r, pp)) = sl.b.as_mut() {
            // Communication stream of A: after stage 1, and after B read the slot's last input.
            wait_opt(comm, &ev.h_ready)?;
            wait_opt(comm, &ev.r_free)?;
            crate::device::bind_context(comm.ctx(), "cuMemcpyPeerAsync")?;
            // SAFETY: both are live allocations of `bytes` in their contexts; the events order
            // every other access (stage 1 before, stage 2 after, reuse after r_free).
            unsafe {
                peer::memcpy_peer_async(
                    r.device_ptr(),
                    r.stream().context_raw(),
                    sl.a[cur].device_ptr(),
                    sl.a[cur].stream().context_raw(),
                    bytes,
                    comm.raw(),
                )
            }?;
            ev.h_sent = Some(comm.record_marker()?);
            // Stage 2 on B, once the slot's previous result was copied out.
            wait_opt(cb, &ev.h_sent)?;
            wait_opt(cb, &ev.y_out)?;
            let cur_b = if let Some(g) = graphs.as_ref() {
                let cur_b = launch_stage(db, cb, &g.b[slot])?;
                ev.r_free = Some(cb.record_marker()?);
                cur_b
            } else {
                let (cur_b, first_b) =
                    run_layers(db, cb, cfg.tiles, Some(r), pp, w2, cfg.layers, 0, true)?;
                ev.r_free = first_b;
                cur_b
            };
            ev.y_ready = Some(cb.record_marker()?);
            pp[cur_b].device_ptr()
        } else {
            ev.y_ready = ev.h_ready.take();
            sl.a[cur].device_ptr()
        };
        // D2H of the result into the slot's pinned output.
        wait_opt(d2h, &ev.y_ready)?;
        db.bind()?;
        // SAFETY: the result buffer is live and not rewritten before y_out (the stages wait for
        // it); the pinned output is read by the host only after the GPUs drained.
        unsafe {
            drv::memcpy_dtoh_async(sl.output.as_mut_ptr().cast(), out_dev, bytes, d2h.raw())
        }?;
        ev.y_out = Some(d2h.record_marker()?);
        Ok(())
    }

    /// Runs one warm-up round (`slots` microbatches), then times `microbatches` more; with
    /// `verify`, checks the first and last tile of every slot's output against the f64 CPU
    /// reference (bound `1e-4` per tile, relative Frobenius norm). Each GPU's compute is
    /// replayed from its graphs once [`LayerPipeline::capture_graphs`] has run (the report's
    /// `graphs`), else launched kernel by kernel. Time: host wall clock, both GPUs drained
    /// before and after the timed microbatches.
    /// Errors: [`Error::Empty`] for 0 microbatches, [`Error::Verification`], CUDA errors
    /// ([`Error::Cuda`] names the call, e.g. `cuGraphLaunch`).
    pub fn run(&mut self, microbatches: usize, verify: bool) -> Result<LayerPipelineReport> {
        if microbatches == 0 {
            return Err(Error::Empty {
                what: "layer pipeline microbatches",
            });
        }
        for n in 0..self.cfg.slots {
            self.enqueue(n)?;
        }
        self.drain()?;
        let t0 = Instant::now();
        for n in 0..microbatches {
            self.enqueue(self.cfg.slots + n)?;
        }
        self.drain()?;
        let seconds = t0.elapsed().as_secs_f64();
        let max_rel_error = if verify { Some(self.verify()?) } else { None };
        Ok(LayerPipelineReport {
            placement: self.placement,
            microbatches,
            graphs: self.graphs.is_some(),
            seconds,
            max_rel_error,
            graph_matches_eager: None,
            config: self.cfg,
        })
    }

    /// Eager, then graphs, in one run of the same pipeline: [`LayerPipeline::run`] kernel by
    /// kernel (graphs released first), then [`LayerPipeline::capture_graphs`] and `run` again
    /// with replays. With `verify` both runs are checked against the f64 CPU reference and the
    /// graph run's outputs against the eager run's, bit for bit (the same kernels on the same
    /// inputs). Returns `(eager, graph)`; the graphs stay captured.
    /// Errors: as [`LayerPipeline::run`] and [`LayerPipeline::capture_graphs`];
    /// [`Error::Verification`] naming the first differing slot and element.
    pub fn run_eager_then_graphs(
        &mut self,
        microbatches: usize,
        verify: bool,
    ) -> Result<(LayerPipelineReport, LayerPipelineReport)> {
        self.release_graphs();
        let eager = self.run(microbatches, verify)?;
        let before: Vec<Vec<f32>> = if verify {
            self.outputs()?.iter().map(|o| o.to_vec()).collect()
        } else {
            Vec::new()
        };
        self.capture_graphs()?;
        let mut graph = self.run(microbatches, verify)?;
        if verify {
            for (slot, (e, g)) in before.iter().zip(self.outputs()?).enumerate() {
                if let Some(i) = super::first_bit_difference(e, g) {
                    return Err(Error::Verification {
                        detail: format!(
                            "layer pipeline ({:?}): graph replay differs from the eager run at \
                             slot {slot} element {i}: {} (graph) vs {} (eager)",
                            self.placement, g[i], e[i]
                        ),
                    });
                }
            }
            graph.graph_matches_eager = Some(true);
        }
        Ok((eager, graph))
    }

    /// Captures each GPU's compute of every slot into CUDA graphs and makes [`LayerPipeline::run`]
    /// replay them (`cuGraphLaunch`); replaces graphs captured before.
    ///
    /// Per slot: GPU A's graph holds stage 1's `layers` GEMMs (both stages' `2 x layers` with
    /// [`Placement::OneGpu`]), captured on A's compute stream; GPU B's holds stage 2's, captured
    /// on B's. Each GPU is captured from a scoped thread of its own with its context bound
    /// (`cuStreamBeginCapture_v2` in `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`, `cuStreamEndCapture`,
    /// through the capture guard shared with `chain` and `ordering`), then instantiated
    /// (`cuGraphInstantiateWithFlags`). The peer copy, H2D and D2H are not captured (module
    /// docs).
    ///
    /// Errors: [`Error::Cuda`] naming the failing call, [`Error::Launch`], the GEMM's checks; on
    /// any error the capture is ended, partial graphs are destroyed, and the pipeline runs
    /// eagerly (no graphs). A panic on a capture thread is resumed here.
    pub fn capture_graphs(&mut self) -> Result<()> {
        self.release_graphs();
        let Self {
            set,
            a,
            b,
            placement,
            cfg,
            ca,
            cb,
            w1,
            w2,
            slots,
            ..
        } = self;
        let two = *placement == Placement::TwoGpus;
        let (da, db) = (set.device(*a)?, set.device(*b)?);
        let (w1, w2) = (&*w1, &*w2);
        // Disjoint borrows of each slot: GPU A's buffers for A's thread, GPU B's for B's.
        let mut on_a = Vec::with_capacity(slots.len());
        let mut on_b = Vec::with_capacity(slots.len());
        for sl in slots.iter_mut() {
            let Slot {
                x, a: pp, b: recv, ..
            } = sl;
            on_a.push((&*x, pp));
            if let Some((r, ppb)) = recv.as_mut() {
                on_b.push((&*r, ppb));
            }
        }
        let weights_a: Vec<&DeviceBuffer<f32>> = if two { vec![w1] } else { vec![w1, w2] };
        let (tiles, layers) = (cfg.tiles, cfg.layers);
        let (ga, gb) = std::thread::scope(|s| {
            let ta = s.spawn(|| capture_stages(da, ca, tiles, layers, on_a, &weights_a));
            let tb = s.spawn(|| capture_stages(db, cb, tiles, layers, on_b, &[w2]));
            let (ra, rb) = (ta.join(), tb.join());
            match (ra, rb) {
                (Ok(ga), Ok(gb)) => (ga, gb),
                (Err(p), _) | (_, Err(p)) => std::panic::resume_unwind(p),
            }
        });
        let graphs = match (ga, gb) {
            (Ok(a), Ok(b)) => PipelineGraphs { a, b },
            (ra, rb) => {
                // Destroy what one GPU captured with its own context bound; report the first error.
                let _ = db.bind();
                let eb = rb.err();
                let _ = da.bind();
                let ea = ra.err();
                return Err(ea.or(eb).expect("one capture failed"));
            }
        };
        if graphs.a.len() != slots.len() || (two && graphs.b.len() != slots.len()) {
            return Err(Error::BadShape {
                what: "layer pipeline graphs",
                detail: format!(
                    "{} graphs on GPU A and {} on GPU B for {} slots",
                    graphs.a.len(),
                    graphs.b.len(),
                    slots.len()
                ),
            });
        }
        self.graphs = Some(graphs);
        Ok(())
    }

    /// Whether [`LayerPipeline::run`] replays captured graphs.
    pub fn has_graphs(&self) -> bool {
        self.graphs.is_some()
    }

    /// Destroys the captured graphs (`cuGraphExecDestroy`, `cuGraphDestroy`, each GPU's context
    /// bound; a replay still running completes first, and the buffers it uses stay owned by the
    /// pipeline); [`LayerPipeline::run`] launches kernel by kernel again.
    pub fn release_graphs(&mut self) {
        if let Some(PipelineGraphs { a, b }) = self.graphs.take() {
            if let Ok(d) = self.set.device(self.a) {
                let _ = d.bind();
            }
            drop(a);
            if let Ok(d) = self.set.device(self.b) {
                let _ = d.bind();
            }
            drop(b);
        }
    }

    /// Waits for the pipeline's own five streams (not the whole contexts: a stream of the user's
    /// that holds a fence guard or an on-stream wait is not waited for). Every stream is waited
    /// for before the first error is returned.
    fn drain(&self) -> Result<()> {
        let mut first = Ok(());
        for s in [&self.h2d, &self.ca, &self.comm, &self.cb, &self.d2h] {
            let r = s.synchronize();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }

    /// Each slot's last result as copied back to pinned host memory, slot order, `tiles x 128 x
    /// 128` f32 each (row-major tiles). Waits for the pipeline's streams first, so no copy is
    /// still writing them; with `&self` borrowed nothing new can be queued.
    /// Errors: [`Error::Cuda`] from the synchronisation.
    pub fn outputs(&self) -> Result<Vec<&[f32]>> {
        self.drain()?;
        Ok(self.slots.iter().map(|sl| &sl.output[..]).collect())
    }

    /// Checks the first and last tile of every slot's pinned output (after a drained run).
    fn verify(&self) -> Result<f64> {
        let mut worst = 0f64;
        let n = self.cfg.tiles * TILE_ELEMS;
        for (s, sl) in self.slots.iter().enumerate() {
            let input = input_pattern(s, n);
            for t in [0, self.cfg.tiles - 1] {
                let x = &input[t * TILE_ELEMS..][..TILE_ELEMS];
                let want = reference_chain(x, &self.w_host, self.cfg.layers);
                let got = &sl.output[t * TILE_ELEMS..][..TILE_ELEMS];
                let e = reference::verify_gemm(
                    &format!("layer pipeline slot {s} tile {t}"),
                    got,
                    &want,
                    1e-4,
                )?;
                worst = worst.max(e);
            }
        }
        Ok(worst)
    }
}

impl Drop for LayerPipeline<'_> {
    fn drop(&mut self) {
        // Buffers are freed on their own streams; the copy streams used them too: drain first.
        let _ = self.drain();
        // Then the graphs, before the buffers they captured (fields are dropped after this).
        self.release_graphs();
    }
}

/// Launches a slot's captured stage graph on `stream` (the compute stream it was captured on)
/// and returns the ping-pong index of its result.
fn launch_stage(dev: &Device, stream: &Stream, g: &StageGraph) -> Result<usize> {
    dev.bind()?;
    // SAFETY: a live executable graph of `dev`'s context, launched on the stream it was captured
    // on. Its nodes touch only buffers owned by the `LayerPipeline` that owns the graph (private
    // fields, never replaced while the graph lives, freed only after it is destroyed), all bound
    // to this stream, so their frees come after the replay; the copy streams' uses are ordered
    // by the events recorded around it, as for the eager launches.
    unsafe { g.exec.launch(stream.raw()) }?;
    Ok(g.out)
}

/// Captures, for each `(src, pp)` of `parts` (one per slot), the GEMM layers of every weight in
/// `weights` (`layers` each: first from `src` into `pp`, then ping-pong) on `stream` and
/// instantiates it. Binds `dev`'s context on the calling thread first.
fn capture_stages(
    dev: &Device,
    stream: &Stream,
    tiles: usize,
    layers: usize,
    parts: Vec<(&DeviceBuffer<f32>, &mut [DeviceBuffer<f32>; 2])>,
    weights: &[&DeviceBuffer<f32>],
) -> Result<Vec<StageGraph>> {
    if parts.is_empty() {
        return Ok(Vec::new());
    }
    dev.bind()?;
    let mut out = Vec::with_capacity(parts.len());
    for (src, pp) in parts {
        let guard = CaptureGuard::begin(stream.cudarc(), Vec::new())?;
        // An error (or a panic) here drops `guard`, which ends the capture.
        let mut cur = 0;
        for (k, w) in weights.iter().enumerate() {
            let from = (k == 0).then_some(src);
            cur = run_layers(dev, stream, tiles, from, pp, w, layers, cur, false)?.0;
        }
        let graph = guard.end()?;
        let exec = crate::reaper::without_pending_waits(
            "LayerPipeline graph (cuGraphInstantiate)",
            || GraphExec::instantiate(&graph),
        )?;
        out.push(StageGraph {
            exec,
            _graph: graph,
            out: cur,
        });
    }
    Ok(out)
}

/// `layers` GEMM layers on `stream`: from `src` into `pp[0]` first when given, else from
/// `pp[start]`; then ping-pong. Returns the index in `pp` of the result and, with `src` and
/// `mark_first`, an event after the first layer (the input may be reused then). Under stream
/// capture pass `mark_first = false`: an event recorded inside a capture cannot be waited on
/// outside it.
#[allow(clippy::too_many_arguments)]
fn run_layers(
    dev: &crate::Device,
    stream: &Stream,
    tiles: usize,
    src: Option<&DeviceBuffer<f32>>,
    pp: &mut [DeviceBuffer<f32>; 2],
    w: &DeviceBuffer<f32>,
    layers: usize,
    start: usize,
    mark_first: bool,
) -> Result<(usize, Option<Event>)> {
    let mut cur = start;
    let mut after_first = None;
    for l in 0..layers {
        let [p0, p1] = pp;
        match (l, src) {
            (0, Some(x)) => {
                tile_gemm(
                    dev,
                    stream,
                    x.as_view(),
                    w.as_view(),
                    p0.as_view_mut(),
                    tiles,
                )?;
                if mark_first {
                    after_first = Some(stream.record_marker()?);
                }
                cur = 0;
            }
            _ => {
                let (i, o) = if cur == 0 { (p0, p1) } else { (p1, p0) };
                tile_gemm(
                    dev,
                    stream,
                    i.as_view(),
                    w.as_view(),
                    o.as_view_mut(),
                    tiles,
                )?;
                cur = 1 - cur;
            }
        }
    }
    Ok((cur, after_first))
}

/// The weight tile of stage `k` (deterministic, uniform in `[-scale, scale)`).
fn weight_tile(k: u64, scale: f32) -> Vec<f32> {
    lcg_values(0x9e37_79b9_7f4a_7c15 ^ k, TILE_ELEMS, scale)
}

/// The pinned input of slot `s` (deterministic, uniform in `[-1, 1)`).
fn input_pattern(s: usize, n: usize) -> Vec<f32> {
    lcg_values(0x2545_f491_4f6c_dd1d ^ (s as u64 + 1), n, 1.0)
}

fn lcg_values(seed: u64, n: usize, scale: f32) -> Vec<f32> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

/// f64 reference of one tile through `layers` layers of each stage's weight.
fn reference_chain(x: &[f32], w: &[Vec<f32>; 2], layers: usize) -> Vec<f64> {
    let mut h: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for wk in w {
        for _ in 0..layers {
            let mut o = vec![0f64; TILE_ELEMS];
            for i in 0..128 {
                for k in 0..128 {
                    let a = h[i * 128 + k];
                    for (j, r) in o[i * 128..][..128].iter_mut().enumerate() {
                        *r += a * wk[k * 128 + j] as f64;
                    }
                }
            }
            h = o;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_checked_without_a_gpu() {
        assert!(LayerPipelineConfig::default().check().is_ok());
        let bad = |c: LayerPipelineConfig| c.check().unwrap_err();
        let d = LayerPipelineConfig::default();
        assert!(matches!(
            bad(LayerPipelineConfig { tiles: 0, ..d }),
            Error::Empty { .. }
        ));
        assert!(matches!(
            bad(LayerPipelineConfig { layers: 0, ..d }),
            Error::Empty { .. }
        ));
        assert!(matches!(
            bad(LayerPipelineConfig { slots: 1, ..d }),
            Error::BadShape { .. }
        ));
    }

    /// The graphs are declared before every buffer they captured, so even without the explicit
    /// release in `Drop` they would be destroyed first.
    #[test]
    fn graphs_field_is_declared_before_the_buffers() {
        crate::multi::assert_declared_before(
            include_str!("pipeline.rs"),
            "pub struct LayerPipeline<'s>",
            "graphs: Option<PipelineGraphs>",
            &["w1: DeviceBuffer", "w2: DeviceBuffer", "slots: Vec<Slot>"],
        );
    }

    // Graph handles are not Sync, so neither is the pipeline: launches never race.
    static_assertions::assert_not_impl_any!(LayerPipeline<'static>: Sync);

    /// Issue 19, item 6: an error in the middle of an enqueue (after the H2D, or after stage 1
    /// was queued, before their events were recorded) used to leave the slot's previous events
    /// in place. Now the error path drains the streams and forgets every event; the pipeline
    /// then still runs and verifies. GPU test (one GPU); skips without a driver.
    #[test]
    fn issue19_item06_an_enqueue_error_leaves_no_stale_event() {
        let set = match DeviceSet::open(&[0]) {
            Ok(s) => s,
            Err(e @ (Error::NoDriver | Error::NoDevice { .. })) => {
                assert!(
                    std::env::var("WARPLINE_REQUIRE_GPU").as_deref() != Ok("1"),
                    "issue19 item 6 would be skipped ({e}), but WARPLINE_REQUIRE_GPU=1"
                );
                eprintln!("SKIPPED issue19 item 6: {e}");
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let cfg = LayerPipelineConfig {
            tiles: 2,
            layers: 4,
            ..LayerPipelineConfig::default()
        };
        let mut p = LayerPipeline::new(&set, 0, 0, Placement::OneGpu, cfg).unwrap();
        p.run(cfg.slots, false).unwrap();
        for (n, step) in [0usize, 1, 0, 1].into_iter().enumerate() {
            p.fail_at = Some(step);
            let e = p.enqueue(n).unwrap_err();
            assert!(matches!(e, Error::BadShape { .. }), "{e}");
            for (i, sl) in p.slots.iter().enumerate() {
                let ev = &sl.ev;
                let kept = [
                    &ev.x_free,
                    &ev.x_ready,
                    &ev.h_ready,
                    &ev.h_sent,
                    &ev.r_free,
                    &ev.y_ready,
                    &ev.y_out,
                ]
                .iter()
                .filter(|e| e.is_some())
                .count();
                assert_eq!(
                    kept, 0,
                    "slot {i} kept {kept} events after step {step} failed"
                );
            }
        }
        let rep = p.run(2 * cfg.slots, true).unwrap();
        let err = rep.max_rel_error.unwrap();
        assert!(err < 1e-4, "{err}");
    }

    #[test]
    fn reference_chain_keeps_the_scale() {
        let w = [
            weight_tile(1, (3.0f32 / 128.0).sqrt()),
            weight_tile(2, (3.0f32 / 128.0).sqrt()),
        ];
        let x = input_pattern(0, TILE_ELEMS);
        let y = reference_chain(&x, &w, 8);
        let rms = (y.iter().map(|v| v * v).sum::<f64>() / y.len() as f64).sqrt();
        assert!(rms > 1e-3 && rms < 1e3, "{rms}");
    }
}
