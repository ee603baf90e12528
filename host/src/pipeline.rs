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

use std::collections::VecDeque;
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

/// Most batches in flight per stream: the pipeline keeps 4 timing events per in-flight batch and
/// reuses them once a batch has completed and its timings are read, so a run of any number of
/// batches holds at most `4 * IN_FLIGHT_PER_STREAM * streams + 1` events.
pub const IN_FLIGHT_PER_STREAM: usize = 4;

/// A multi-stream batch pipeline on one device, with its own non-blocking streams and a memory
/// pool of its own (`cuMemPoolCreate`, release threshold: keep everything, so steady-state batches
/// do no cuMemAlloc). The device's default pool is left as it is.
pub struct BatchPipeline<'d> {
    dev: &'d Device,
    streams: Vec<Stream>,
    pool: MemPool,
}

/// The four events of one batch.
struct Events {
    start: Event,
    h2d_done: Event,
    kernel_done: Event,
    d2h_done: Event,
}

struct Enqueued {
    batch: usize,
    range: Range<usize>,
    stream: usize,
    ev: Events,
}

/// Synchronises every stream of the pipeline when dropped, so no copy into or out of the
/// caller's pinned memory outlives `run`: on success, on an error after work was queued, and when
/// a closure panics. Errors met while draining in `Drop` are kept for
/// `Device::take_deferred_errors`; it never panics.
struct DrainGuard<'a> {
    streams: &'a [Stream],
    drained: bool,
}

impl DrainGuard<'_> {
    /// Synchronises every stream (all of them, even after an error) and returns the first error.
    fn drain(&mut self) -> Result<()> {
        let mut first = Ok(());
        for s in self.streams {
            let r = s.synchronize();
            if first.is_ok() {
                first = r;
            }
        }
        self.drained = true;
        first
    }
}

impl Drop for DrainGuard<'_> {
    fn drop(&mut self) {
        if !self.drained {
            for s in self.streams {
                if let Err(e) = s.synchronize() {
                    crate::device::defer_error(s.ctx(), &e);
                }
            }
        }
    }
}

impl<'d> BatchPipeline<'d> {
    /// A pipeline over `streams` new non-blocking streams (1 to [`MAX_STREAMS`]).
    ///
    /// Errors: [`Error::Empty`], [`Error::TooLarge`], [`Error::MemoryPoolsUnsupported`],
    /// [`Error::Cuda`].
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
        let pool = MemPool::new(dev, u64::MAX)?;
        Ok(Self { dev, streams, pool })
    }

    /// The pipeline's streams.
    pub fn streams(&self) -> &[Stream] {
        &self.streams
    }

    /// The pipeline's own memory pool.
    pub fn pool(&self) -> &MemPool {
        &self.pool
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
    /// batch `i` on stream `i % streams`, at most [`IN_FLIGHT_PER_STREAM`] batches per stream in
    /// flight. Returns when every batch is back in `c`; `progress(done, total)` is called as
    /// batches complete, in order.
    ///
    /// Every exit waits for every stream first: success, an error after work was queued, and a
    /// panic in `kernel` or `progress` (the unwinding drains the streams before `a`, `b`, `c` are
    /// released), so no copy into or out of the caller's memory outlives the call.
    ///
    /// Errors, before anything is queued: [`Error::LengthMismatch`] unless `a`, `b`, `c` have equal
    /// lengths; [`Error::Empty`] for `batch_elems == 0`. Later: the kernel closure's error, and
    /// [`Error::Cuda`] / [`Error::ContextPoisoned`] / [`Error::OutOfMemory`] from the driver.
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
        // Declared before anything that borrows `c` for copies, so it drops (drains) last.
        let mut guard = DrainGuard {
            streams: &self.streams,
            drained: false,
        };
        let total = n.div_ceil(batch_elems);
        let cap = IN_FLIGHT_PER_STREAM * self.streams.len();
        self.prewarm_pool(batch_elems.min(n), cap.min(total))?;
        let wall = Instant::now();
        let origin = self.streams[0].record()?;
        let mut in_flight: VecDeque<Enqueued> = VecDeque::with_capacity(cap);
        let mut spare: Vec<Events> = Vec::with_capacity(cap);
        let mut batches = Vec::with_capacity(total);
        let mut span_ms = 0f64;
        for (i, c_batch) in c.chunks_mut(batch_elems).enumerate() {
            if in_flight.len() == cap {
                let q = in_flight.pop_front().expect("in-flight queue is full");
                let t = complete(&origin, &q)?;
                span_ms = span_ms.max(t.end_ms);
                batches.push(t);
                spare.push(q.ev);
                progress(batches.len(), total);
            }
            let range = i * batch_elems..i * batch_elems + c_batch.len();
            let si = i % self.streams.len();
            let s = &self.streams[si];
            let mut da = self.pool.alloc_async::<f32>(s, range.len())?;
            let mut db = self.pool.alloc_async::<f32>(s, range.len())?;
            let mut dc = self.pool.alloc_async::<f32>(s, range.len())?;
            let mut ev = match spare.pop() {
                Some(ev) => ev,
                None => Events {
                    start: s.record()?,
                    h2d_done: s.record()?,
                    kernel_done: s.record()?,
                    d2h_done: s.record()?,
                },
            };
            s.record_into(&mut ev.start)?;
            // SAFETY: `a`, `b` and `c` are borrowed for the whole of `run`, and `guard` waits for
            // every stream before `run` returns or unwinds, so the host memory outlives the
            // copies, and no one reads `c` meanwhile. All three are pinned.
            unsafe {
                da.copy_from_host_async(&a[range.clone()])?;
                db.copy_from_host_async(&b[range.clone()])?;
            }
            s.record_into(&mut ev.h2d_done)?;
            kernel(s, da.as_view(), db.as_view(), dc.as_view_mut())?;
            s.record_into(&mut ev.kernel_done)?;
            // SAFETY: as above.
            unsafe { dc.copy_to_host_async(c_batch)? };
            s.record_into(&mut ev.d2h_done)?;
            // da, db, dc drop here: cuMemFreeAsync on `s`, after the D2H in stream order.
            in_flight.push_back(Enqueued {
                batch: i,
                range,
                stream: si,
                ev,
            });
        }
        while let Some(q) = in_flight.pop_front() {
            let t = complete(&origin, &q)?;
            span_ms = span_ms.max(t.end_ms);
            batches.push(t);
            progress(batches.len(), total);
        }
        guard.drain()?;
        let wall_ms = wall.elapsed().as_secs_f64() * 1e3;
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

    /// Grows the pool to what the in-flight window of `batches` batches needs (three buffers of
    /// `batch_elems` floats each), so the timed run does no `cuMemAlloc`: the pool keeps what it
    /// reserved (release threshold `u64::MAX`).
    fn prewarm_pool(&self, batch_elems: usize, batches: usize) -> Result<()> {
        let s = &self.streams[0];
        let bufs = (0..3 * batches)
            .map(|_| self.pool.alloc_async::<f32>(s, batch_elems))
            .collect::<Result<Vec<_>>>()?;
        drop(bufs);
        s.synchronize()
    }
}

/// Waits for batch `q` and reads its timings (its events can be reused afterwards).
fn complete(origin: &Event, q: &Enqueued) -> Result<BatchTiming> {
    q.ev.d2h_done.synchronize()?;
    let ms = |a: &Event, b: &Event| a.elapsed_ms(b).map(f64::from);
    Ok(BatchTiming {
        batch: q.batch,
        stream: q.stream,
        elems: q.range.len(),
        start_ms: ms(origin, &q.ev.start)?,
        end_ms: ms(origin, &q.ev.d2h_done)?,
        h2d_ms: ms(&q.ev.start, &q.ev.h2d_done)?,
        kernel_ms: ms(&q.ev.h2d_done, &q.ev.kernel_done)?,
        d2h_ms: ms(&q.ev.kernel_done, &q.ev.d2h_done)?,
    })
}
