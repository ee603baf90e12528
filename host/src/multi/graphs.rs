//! CUDA graphs of the data-parallel step (issue 13, "Graphs"): each GPU's compute, captured on
//! that GPU's compute stream with its context bound, from a thread of its own, replayed with
//! `cuGraphLaunch`; the NCCL all-reduces stay outside every graph.
//!
//! **Which of NCCL's two options, and why.** The issue allows capturing each GPU from its own
//! thread, or keeping NCCL outside the graph. warpline keeps NCCL outside. NCCL's user guide
//! ("Using NCCL with CUDA Graphs", "Requirements and Limitations") warns that graph capture with
//! several GPUs per process may deadlock, "likely" with one thread: `cudaGraphLaunch` of a graph
//! holding a collective may block and so keep the other GPUs' launches from being issued.
//! warpline replays the step from one thread (both GPUs' launches, as it issues the grouped
//! all-reduces), and the step's overlap needs the all-reduce of bucket k to start while bucket
//! k+1 computes; with collectives out of the graphs no `cuGraphLaunch` can wait on another GPU.
//! Graphs hold only GEMM kernels; the all-reduces are issued between graph launches, ordered with
//! events exactly as in the eager step.
//!
//! **Capture, one thread per GPU.** [`capture_on_own_threads`] captures each GPU's graphs on a
//! scoped thread of its own (its context bound on that thread, capture mode
//! `CU_STREAM_CAPTURE_MODE_THREAD_LOCAL`, as NCCL's guide asks of multi-threaded capture), so no
//! GPU's capture can be invalidated by a call another thread makes. With NCCL outside the graphs
//! this is not needed to avoid a deadlock; it keeps each capture isolated and costs one thread
//! per GPU once.
//!
//! **What one graph holds.** One graph per (GPU, bucket): the `layers` GEMMs of that bucket on
//! that GPU. One graph of a GPU's whole step would make every bucket's all-reduce wait for the
//! whole step's compute (no overlap); a replayed step launches `buckets` graphs per GPU instead of
//! `buckets x layers` kernels. The graphs are captured with the existing capture guard
//! (`driver::graph::CaptureGuard`, thread-local `cuStreamBeginCapture_v2` /
//! `cuStreamEndCapture`) and instantiated once (`cuGraphInstantiateWithFlags`).
//!
//! **Why replay is sound.** [`DpGpu`] owns the buffers its graphs captured (inputs and gradient
//! buckets) in private fields that nothing outside this module can replace or free, and its
//! graphs are declared before the buffers, so they are destroyed first (executable graph, then
//! graph; `cuGraphExecDestroy` lets a launch in flight finish). A bucket's graph is launched only
//! on the compute stream it was captured on, and only while every buffer it touches is bound to
//! that stream (checked; `Error::WrongStream` otherwise), so each buffer's stream-ordered free and
//! every use on another stream (the NCCL stream, after `DeviceBuffer::move_to_stream`'s event)
//! come after the replay. `DpGpu` is not `Sync` (the graph handles are not), and launches take
//! `&mut self`.

use crate::device::Device;
use crate::driver::graph::{CaptureGuard, CudaGraph, GraphExec};
use crate::error::{Error, Result};
use crate::kernels::tile_gemm_with_grid;
use crate::memory::{DeviceBuffer, MemPool};
use crate::stream::Stream;

use super::nccl::{all_reduce_sum_group, Communicator};

/// One bucket's instantiated graph. Field order: the executable graph is destroyed before the
/// graph it came from.
struct BucketGraph {
    exec: GraphExec,
    _graph: CudaGraph,
}

/// One GPU's part of the data-parallel step: its compute stream, inputs `x` and `w`
/// (`tiles` 128x128 f32 tiles each), one gradient bucket per bucket (`g_k = x * w` per tile,
/// `layers` times), and optionally the captured graph of each bucket's GEMM layers.
pub(crate) struct DpGpu<'d> {
    // Declared first: dropped before the buffers they captured.
    graphs: Vec<BucketGraph>,
    dev: &'d Device,
    compute: Stream,
    x: DeviceBuffer<f32>,
    w: DeviceBuffer<f32>,
    grads: Vec<DeviceBuffer<f32>>,
    x_host: Vec<f32>,
    w_host: Vec<f32>,
    tiles: usize,
    layers: usize,
    ctas: u32,
}

impl Drop for DpGpu<'_> {
    fn drop(&mut self) {
        // The graph handles are destroyed right after this body, with this GPU's context
        // current; failures cannot be reported.
        let _ = self.dev.bind();
    }
}

/// Deterministic inputs in [-0.5, 0.5): `seed` selects GPU and operand.
pub(crate) fn input_pattern(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32) / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

impl<'d> DpGpu<'d> {
    /// Allocates and fills GPU `index`'s buffers from `pool` on `compute` (a stream of `dev`).
    pub(crate) fn new(
        dev: &'d Device,
        compute: Stream,
        pool: &MemPool,
        index: usize,
        (buckets, tiles, layers, ctas): (usize, usize, usize, u32),
    ) -> Result<Self> {
        let elems = tiles * 128 * 128;
        let x_host = input_pattern(2 * index as u64 + 1, elems);
        let w_host = input_pattern(2 * index as u64 + 2, elems);
        let mut x = pool.alloc_async::<f32>(&compute, elems)?;
        x.copy_from_host(&x_host)?;
        let mut w = pool.alloc_async::<f32>(&compute, elems)?;
        w.copy_from_host(&w_host)?;
        let mut grads = Vec::with_capacity(buckets);
        for _ in 0..buckets {
            let mut g = pool.alloc_async::<f32>(&compute, elems)?;
            g.fill_async(0.0)?;
            grads.push(g);
        }
        Ok(Self {
            graphs: Vec::new(),
            dev,
            compute,
            x,
            w,
            grads,
            x_host,
            w_host,
            tiles,
            layers,
            ctas,
        })
    }

    /// The compute stream.
    pub(crate) fn compute(&self) -> &Stream {
        &self.compute
    }

    /// Host copies of the inputs `(x, w)`.
    pub(crate) fn inputs(&self) -> (&[f32], &[f32]) {
        (&self.x_host, &self.w_host)
    }

    /// Number of gradient buckets.
    pub(crate) fn buckets(&self) -> usize {
        self.grads.len()
    }

    /// Whether the graphs are captured.
    pub(crate) fn has_graphs(&self) -> bool {
        !self.graphs.is_empty()
    }

    /// Moves every gradient bucket to the compute stream (event after its current stream).
    pub(crate) fn grads_to_compute(&mut self) -> Result<()> {
        for g in &mut self.grads {
            g.move_to_stream(&self.compute)?;
        }
        Ok(())
    }

    /// Moves bucket `k` to `to` (event after the compute stream's work so far).
    pub(crate) fn grad_to(&mut self, k: usize, to: &Stream) -> Result<()> {
        self.grads[k].move_to_stream(to)
    }

    /// Queues bucket `k`'s GEMM layers eagerly (`tile_gemm_with_grid`, `layers` launches).
    fn gemms(&mut self, k: usize) -> Result<()> {
        for _ in 0..self.layers {
            tile_gemm_with_grid(
                self.dev,
                &self.compute,
                self.x.as_view(),
                self.w.as_view(),
                self.grads[k].as_view_mut(),
                self.tiles,
                self.ctas,
            )?;
        }
        Ok(())
    }

    /// Captures each bucket's GEMM layers into a graph on the compute stream (this GPU's context
    /// bound; thread-local capture mode) and instantiates it. Replaces graphs captured before.
    /// Errors: [`Error::Cuda`] naming the failing call (`cuStreamBeginCapture_v2`,
    /// `cuStreamEndCapture`, `cuGraphInstantiateWithFlags`), [`Error::Launch`], the GEMM's
    /// checks; on every error the capture is ended and the partial graph destroyed.
    pub(crate) fn capture(&mut self) -> Result<()> {
        self.graphs.clear();
        // Outside the capture: the buckets' events go on the stream before capture begins.
        self.grads_to_compute()?;
        self.dev.bind()?;
        let mut graphs = Vec::with_capacity(self.grads.len());
        for k in 0..self.grads.len() {
            let guard = CaptureGuard::begin(self.compute.cudarc(), Vec::new())?;
            // An error (or a panic) here drops `guard`, which ends the capture.
            self.gemms(k)?;
            let graph = guard.end()?;
            let exec = crate::reaper::without_pending_waits(
                "data-parallel graph (cuGraphInstantiate)",
                || GraphExec::instantiate(&graph),
            )?;
            graphs.push(BucketGraph {
                exec,
                _graph: graph,
            });
        }
        self.graphs = graphs;
        Ok(())
    }

    /// Queues bucket `k`'s compute on the compute stream: its captured graph (`cuGraphLaunch`)
    /// when `graph`, else the eager launches.
    /// Errors: [`Error::WrongStream`] unless bucket `k` is bound to the compute stream (move it
    /// with [`DpGpu::grads_to_compute`]); [`Error::BadShape`] when `graph` is asked before
    /// [`DpGpu::capture`]; [`Error::Cuda`] (`cuGraphLaunch`).
    pub(crate) fn compute_bucket(&mut self, k: usize, graph: bool) -> Result<()> {
        if *self.grads[k].stream() != self.compute {
            return Err(Error::WrongStream {
                what: "data-parallel step: bucket computed while bound to another stream",
            });
        }
        if !graph {
            return self.gemms(k);
        }
        let Some(g) = self.graphs.get(k) else {
            return Err(Error::BadShape {
                what: "data-parallel step graphs",
                detail: format!(
                    "bucket {k} has no captured graph ({} captured); capture first",
                    self.graphs.len()
                ),
            });
        };
        self.dev.bind()?;
        // SAFETY: a live executable graph of this context, launched on the stream it was
        // captured on; it touches x, w and grads[k], owned by `self` (not replaceable from
        // outside this module), all bound to this stream (checked above for grads[k]; x and w
        // never move), so their frees and other streams' uses are ordered after the replay.
        unsafe { g.exec.launch(self.compute.raw()) }
    }

    /// Copies bucket `k` to the host (on its stream, then synchronised).
    pub(crate) fn read_grad(&self, k: usize) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.grads[k].len()];
        self.grads[k].copy_to_host(&mut out)?;
        Ok(out)
    }
}

/// The all-reduce (sum) of bucket `k` over every GPU, grouped (`ncclGroupStart/End`), on the
/// communicators' streams; each bucket must have been moved to its communicator's stream.
/// Errors: as [`all_reduce_sum_group`].
pub(crate) fn all_reduce_bucket(
    gpus: &mut [DpGpu<'_>],
    comms: &[Communicator],
    k: usize,
) -> Result<()> {
    let mut refs: Vec<&mut DeviceBuffer<f32>> = gpus.iter_mut().map(|g| &mut g.grads[k]).collect();
    all_reduce_sum_group(comms, &mut refs)
}

/// Captures every GPU's graphs ([`DpGpu::capture`]), each GPU on a scoped thread of its own
/// (`std::thread::scope`; the GPU's context is bound on that thread and the capture is
/// thread-local), and returns once all have finished. Errors: the first GPU's error in order;
/// every thread is joined first. A panic on a capture thread is resumed on the caller's thread
/// (after the capture guard of that thread ended its capture).
pub(crate) fn capture_on_own_threads(gpus: &mut [DpGpu<'_>]) -> Result<()> {
    std::thread::scope(|s| {
        let handles: Vec<_> = gpus
            .iter_mut()
            .map(|g| s.spawn(move || g.capture()))
            .collect();
        let mut first = Ok(());
        let mut panic = None;
        for h in handles {
            match h.join() {
                Ok(r) => {
                    if first.is_ok() {
                        first = r;
                    }
                }
                Err(p) => panic = panic.or(Some(p)),
            }
        }
        if let Some(p) = panic {
            std::panic::resume_unwind(p);
        }
        first
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_pattern_is_deterministic_distinct_and_bounded() {
        let a = input_pattern(1, 1000);
        assert_eq!(a, input_pattern(1, 1000));
        assert_ne!(a, input_pattern(2, 1000));
        assert!(a.iter().all(|v| (-0.5..0.5).contains(v)));
        let mean = a.iter().map(|&v| v as f64).sum::<f64>() / a.len() as f64;
        assert!(mean.abs() < 0.05, "{mean}");
    }

    /// Graphs are declared before the buffers they captured, so they are dropped first.
    #[test]
    fn graphs_field_is_dropped_before_the_buffers() {
        crate::multi::assert_declared_before(
            include_str!("graphs.rs"),
            "pub(crate) struct DpGpu",
            "graphs: Vec<BucketGraph>",
            &[
                "x: DeviceBuffer",
                "w: DeviceBuffer",
                "grads: Vec<DeviceBuffer",
            ],
        );
    }

    static_assertions::assert_not_impl_any!(DpGpu<'static>: Sync);
    // Send: each GPU's part moves to its own capture thread (`capture_on_own_threads`).
    static_assertions::assert_impl_all!(DpGpu<'static>: Send);
}
