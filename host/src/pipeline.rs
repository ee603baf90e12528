//! `BatchPipeline`: the chapter's inter-kernel pipeline (ch. 11, "Using Streams to Overlap Compute
//! with Data Transfers"). Batches go round-robin over N non-blocking streams; each batch is
//!
//! ```text
//!   alloc-async (pool) -> H2D a, b -> kernel -> D2H c -> free-async      (all on one stream)
//! ```
//!
//! so while one stream's kernel runs, another's H2D and a third's D2H use the copy engines.
//! Host memory is pinned, nothing touches the legacy default stream, and events around each stage
//! give per-batch timings.

use std::ops::Range;
use std::time::Instant;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::{DeviceView, DeviceViewMut, MemPool, PinnedBuffer};
use crate::stream::{Event, Stream};

/// Most streams a pipeline takes.
pub const MAX_STREAMS: usize = 32;

/// Timings of one batch, milliseconds, from its events.
#[derive(Clone, Debug)]
pub struct BatchTiming {
    /// Batch index.
    pub batch: usize,
    /// Stream index (batch % streams).
    pub stream: usize,
    /// Elements in the batch.
    pub elems: usize,
    /// When the batch's H2D began, from the first batch's start.
    pub start_ms: f64,
    /// When the batch's D2H ended, from the first batch's start.
    pub end_ms: f64,
    /// H2D of both inputs.
    pub h2d_ms: f64,
    /// Kernel.
    pub kernel_ms: f64,
    /// D2H of the output.
    pub d2h_ms: f64,
}

/// What a pipeline run did and how fast.
#[derive(Clone, Debug)]
pub struct PipelineReport {
    /// Streams used.
    pub streams: usize,
    /// Per-batch timings, in batch order.
    pub batches: Vec<BatchTiming>,
    /// Bytes copied host to device.
    pub bytes_h2d: u64,
    /// Bytes copied device to host.
    pub bytes_d2h: u64,
    /// From the first batch's first event to the last batch's last event, ms (device clock).
    pub span_ms: f64,
    /// Host wall time from the first enqueue to the last completion, ms.
    pub wall_ms: f64,
}

impl PipelineReport {
    /// Bytes over PCIe (both directions) per second of the span, GB/s.
    pub fn pcie_gbps(&self) -> f64 {
        (self.bytes_h2d + self.bytes_d2h) as f64 / (self.span_ms * 1e-3) / 1e9
    }

    /// Sum of all stage times over the span: 1.0 means no overlap, higher means stages of
    /// different batches ran at the same time.
    pub fn overlap(&self) -> f64 {
        let busy: f64 = self
            .batches
            .iter()
            .map(|b| b.h2d_ms + b.kernel_ms + b.d2h_ms)
            .sum();
        busy / self.span_ms
    }
}

/// A multi-stream batch pipeline on one device, with its own non-blocking streams and the
/// device's default memory pool (release threshold: keep everything, so steady-state batches do no
/// cuMemAlloc).
pub struct BatchPipeline<'d> {
    dev: &'d Device,
    streams: Vec<Stream>,
    pool: MemPool,
}

struct Enqueued {
    range: Range<usize>,
    stream: usize,
    start: Event,
    h2d_done: Event,
    kernel_done: Event,
    d2h_done: Event,
}

impl<'d> BatchPipeline<'d> {
    /// A pipeline over `streams` new non-blocking streams (1 to [`MAX_STREAMS`]).
    pub fn new(dev: &'d Device, streams: usize) -> Result<Self> {
        if streams == 0 {
            return Err(Error::Empty {
                what: "pipeline streams",
            });
        }
        if streams > MAX_STREAMS {
            return Err(Error::TooLarge {
                what: "pipeline streams",
                value: streams as u64,
                max: MAX_STREAMS as u64,
            });
        }
        let streams = (0..streams)
            .map(|_| dev.new_stream())
            .collect::<Result<Vec<_>>>()?;
        let pool = MemPool::device_default(dev, u64::MAX)?;
        Ok(Self { dev, streams, pool })
    }

    /// The pipeline's streams.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }

    /// Runs `c = a + b` through the pipeline with `ws_vector_add`. See [`Self::run`].
    pub fn run_vector_add(
        &self,
        a: &PinnedBuffer<f32>,
        b: &PinnedBuffer<f32>,
        c: &mut PinnedBuffer<f32>,
        batch_elems: usize,
        progress: impl FnMut(usize, usize),
    ) -> Result<PipelineReport> {
        let dev = self.dev;
        self.run(
            a,
            b,
            c,
            batch_elems,
            |s, x, y, z| crate::kernels::vector_add(dev, s, x, y, z),
            progress,
        )
    }

    /// Runs `kernel(stream, a_batch, b_batch, c_batch)` over batches of `batch_elems` elements
    /// (the last may be shorter): alloc-async -> H2D -> kernel -> D2H -> free-async per batch,
    /// batch `i` on stream `i % streams`. Returns when every batch is back in `c`; `progress(done,
    /// total)` is called as batches complete, in order.
    ///
    /// Errors, before anything is queued: [`Error::LengthMismatch`] unless `a`, `b`, `c` have equal
    /// lengths; [`Error::Empty`] for `batch_elems == 0`. A failure while queuing waits for the work
    /// already queued before returning, so no copy into `c` outlives the call.
    pub fn run<K>(
        &self,
        a: &PinnedBuffer<f32>,
        b: &PinnedBuffer<f32>,
        c: &mut PinnedBuffer<f32>,
        batch_elems: usize,
        mut kernel: K,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<PipelineReport>
    where
        K: FnMut(
            &Stream,
            DeviceView<'_, f32>,
            DeviceView<'_, f32>,
            DeviceViewMut<'_, f32>,
        ) -> Result<()>,
    {
        let n = a.len();
        if b.len() != n || c.len() != n {
            return Err(Error::LengthMismatch {
                what: "pipeline inputs",
                detail: format!(
                    "a has {n} elements, b {}, c {}; all must be equal",
                    b.len(),
                    c.len()
                ),
            });
        }
        if batch_elems == 0 {
            return Err(Error::Empty {
                what: "pipeline batch size",
            });
        }
        self.prewarm_pool(batch_elems.min(n))?;
        let wall = Instant::now();
        let mut queued = Vec::new();
        let outcome = self.enqueue_all(a, b, c, batch_elems, &mut kernel, &mut queued);
        if let Err(e) = outcome {
            // Copies into `c` may be in flight: wait before handing `c` back.
            for s in &self.streams {
                let _ = s.synchronize();
            }
            return Err(e);
        }
        let total = queued.len();
        for (i, q) in queued.iter().enumerate() {
            q.d2h_done.synchronize()?;
            progress(i + 1, total);
        }
        for s in &self.streams {
            s.synchronize()?;
        }
        let wall_ms = wall.elapsed().as_secs_f64() * 1e3;
        let origin = &queued[0].start;
        let mut batches = Vec::with_capacity(total);
        let mut span_ms = 0f64;
        for (i, q) in queued.iter().enumerate() {
            let end_ms = origin.elapsed_ms(&q.d2h_done)? as f64;
            span_ms = span_ms.max(end_ms);
            batches.push(BatchTiming {
                batch: i,
                stream: q.stream,
                elems: q.range.len(),
                start_ms: origin.elapsed_ms(&q.start)? as f64,
                end_ms,
                h2d_ms: q.start.elapsed_ms(&q.h2d_done)? as f64,
                kernel_ms: q.h2d_done.elapsed_ms(&q.kernel_done)? as f64,
                d2h_ms: q.kernel_done.elapsed_ms(&q.d2h_done)? as f64,
            });
        }
        let bytes = (n * size_of::<f32>()) as u64;
        Ok(PipelineReport {
            streams: self.streams.len(),
            batches,
            bytes_h2d: 2 * bytes,
            bytes_d2h: bytes,
            span_ms,
            wall_ms,
        })
    }

    fn enqueue_all<K>(
        &self,
        a: &PinnedBuffer<f32>,
        b: &PinnedBuffer<f32>,
        c: &mut PinnedBuffer<f32>,
        batch_elems: usize,
        kernel: &mut K,
        queued: &mut Vec<Enqueued>,
    ) -> Result<()>
    where
        K: FnMut(
            &Stream,
            DeviceView<'_, f32>,
            DeviceView<'_, f32>,
            DeviceViewMut<'_, f32>,
        ) -> Result<()>,
    {
        let n = a.len();
        for (i, c_batch) in c.chunks_mut(batch_elems).enumerate() {
            let range = i * batch_elems..(i * batch_elems + c_batch.len()).min(n);
            let si = i % self.streams.len();
            let s = &self.streams[si];
            let mut da = self.pool.alloc_async::<f32>(s, range.len())?;
            let mut db = self.pool.alloc_async::<f32>(s, range.len())?;
            let mut dc = self.pool.alloc_async::<f32>(s, range.len())?;
            let start = s.record()?;
            // SAFETY: `a`, `b` and `c` are borrowed for the whole of `run`, which waits for every
            // stream before returning (also on error), so the host memory outlives the copies, and
            // no one reads `c` meanwhile. All three are pinned.
            unsafe {
                da.copy_from_host_async(&a[range.clone()])?;
                db.copy_from_host_async(&b[range.clone()])?;
            }
            let h2d_done = s.record()?;
            kernel(s, da.as_view(), db.as_view(), dc.as_view_mut())?;
            let kernel_done = s.record()?;
            // SAFETY: as above.
            unsafe { dc.copy_to_host_async(c_batch)? };
            let d2h_done = s.record()?;
            // da, db, dc drop here: cuMemFreeAsync on `s`, after the D2H in stream order.
            queued.push(Enqueued {
                range,
                stream: si,
                start,
                h2d_done,
                kernel_done,
                d2h_done,
            });
        }
        Ok(())
    }

    /// Grows the pool to what one round of batches needs, so the timed run does no cuMemAlloc.
    fn prewarm_pool(&self, batch_elems: usize) -> Result<()> {
        let s = &self.streams[0];
        let bufs = (0..3 * self.streams.len())
            .map(|_| self.pool.alloc_async::<f32>(s, batch_elems))
            .collect::<Result<Vec<_>>>()?;
        drop(bufs);
        s.synchronize()
    }
}
