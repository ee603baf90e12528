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
    /// Stream-ordered allocation of the batch's three buffers, when a trace recorder was active
    /// (it adds the event before the allocations).
    pub alloc_ms: Option<f64>,
    /// Stream-ordered free of the three buffers, when a trace recorder was active.
    pub free_ms: Option<f64>,
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

/// Stream priorities of a pipeline's streams (`cuStreamCreateWithPriority`). Priorities order the
/// dispatch of kernels' CTAs when kernels of several streams compete (CUDA Programming Guide,
/// "Stream Priorities"); copies are not prioritised. Whether either order helps the pipeline is
/// for the measurement (`warpline pipeline --priorities ...`); the default is [`Self::Equal`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Priorities {
    /// Every stream at the default priority (today's pipeline).
    #[default]
    Equal,
    /// Stream 0 highest, the last stream lowest.
    FirstHigh,
    /// Stream 0 lowest, the last stream highest.
    LastHigh,
}

/// How a pipeline cuts its input into batches and prioritises its streams (issue 12's A/B
/// options). The default ([`Schedule::PLAIN`]) is equal batches at equal priorities, so a kernel
/// given to [`BatchPipeline::run`] sees exactly `batch_elems` per batch (the last may be
/// shorter). [`Schedule::TAIL_SPLIT`] splits the last 2 batches into 4 pieces each, at element
/// granularity: for element-wise kernels such as the vector add (the `warpline pipeline`
/// default); a kernel that needs whole tiles must not be given pieces.
///
/// The last batch's kernel and D2H overlap nothing (about 1.3 ms of a 43 ms run at 16 x 2^24
/// floats on the H100); splitting the last batches into pieces shortens that tail: the last
/// piece's D2H is `1 / tail_pieces` of a batch's. Pieces continue the round-robin over the
/// streams. Measured on the H100 at 3 streams, 16 x 2^24 floats (docs/perf-notes.md): tail 2 x 4
/// at 0.930 and 0.931 of 1.5 x pinned H2D in two sessions' runs, the plain pipeline at 0.894 to
/// 0.920.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Batches at the end that are split (0: none).
    pub tail_batches: usize,
    /// Pieces each of those batches is split into (0 or 1: not split).
    pub tail_pieces: usize,
    /// Stream priorities.
    pub priorities: Priorities,
}

impl Schedule {
    /// The last 2 batches split into 4 pieces each, equal priorities (element-wise kernels).
    pub const TAIL_SPLIT: Schedule = Schedule {
        tail_batches: 2,
        tail_pieces: 4,
        priorities: Priorities::Equal,
    };
    /// Equal batches, none split, equal priorities (the default).
    pub const PLAIN: Schedule = Schedule {
        tail_batches: 0,
        tail_pieces: 0,
        priorities: Priorities::Equal,
    };

    /// The element ranges of the batches of an input of `n` elements: batches of `batch_elems`
    /// (the last may be shorter), the last `tail_batches` of them split into `tail_pieces`
    /// nearly equal pieces (no piece is empty). A `batch_elems` of 0 counts as 1.
    ///
    /// Total for every `n`, `batch_elems` and field value (issue 19 item 11): the ranges are made
    /// lazily (nothing is allocated), cover `0..n` exactly, in order, without overlap or empty
    /// pieces, and there are at most `n` of them ([`ExactSizeIterator::len`]). The arithmetic is
    /// checked: no intermediate value exceeds `n` (piece bounds use u128).
    pub fn ranges(&self, n: usize, batch_elems: usize) -> Ranges {
        let batch_elems = batch_elems.max(1);
        let count = n.div_ceil(batch_elems);
        let split_from = count.saturating_sub(self.tail_batches);
        let pieces_of = |i: usize| -> usize {
            // Batch i (< count) starts at i * batch_elems < n: no overflow.
            let len = batch_elems.min(n - i * batch_elems);
            if i >= split_from && self.tail_pieces > 1 {
                self.tail_pieces.min(len)
            } else {
                1
            }
        };
        // Pieces: one per unsplit batch, `pieces_of` per split one. Every piece is non-empty and
        // they are disjoint within 0..n, so the sum is at most n (no overflow).
        let split = count - split_from;
        let len = if split == 0 {
            count
        } else {
            // Split batches: all full but possibly the last.
            let full_split = split - 1;
            split_from + full_split * pieces_of(split_from) + pieces_of(count - 1)
        };
        Ranges {
            n,
            batch_elems,
            count,
            split_from,
            tail_pieces: self.tail_pieces,
            batch: 0,
            piece: 0,
            left: len,
        }
    }
}

/// The ranges of [`Schedule::ranges`], made lazily: batches in order, each split batch's pieces in
/// order. Exact size; at most `n` ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ranges {
    n: usize,
    batch_elems: usize,
    count: usize,
    split_from: usize,
    tail_pieces: usize,
    /// Next batch.
    batch: usize,
    /// Next piece of `batch`.
    piece: usize,
    /// Ranges not yet returned.
    left: usize,
}

impl Iterator for Ranges {
    type Item = Range<usize>;

    fn next(&mut self) -> Option<Range<usize>> {
        if self.batch >= self.count {
            return None;
        }
        // batch < count = ceil(n / batch_elems), so start < n and `n - start` is exact.
        let start = self.batch * self.batch_elems;
        let len = self.batch_elems.min(self.n - start);
        let pieces = if self.batch >= self.split_from && self.tail_pieces > 1 {
            self.tail_pieces.min(len)
        } else {
            1
        };
        // u128: `p * len` may exceed usize; the result is at most `len`.
        let at = |p: usize| start + (p as u128 * len as u128 / pieces as u128) as usize;
        let r = at(self.piece)..at(self.piece + 1);
        self.piece += 1;
        if self.piece == pieces {
            self.piece = 0;
            self.batch += 1;
        }
        self.left = self.left.saturating_sub(1);
        Some(r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Ranges {}

impl std::iter::FusedIterator for Ranges {}

/// A multi-stream batch pipeline on one device, with its own non-blocking streams and a memory
/// pool of its own (`cuMemPoolCreate`, release threshold: keep everything, so steady-state batches
/// do no cuMemAlloc). The device's default pool is left as it is.
pub struct BatchPipeline<'d> {
    dev: &'d Device,
    streams: Vec<Stream>,
    pool: MemPool,
    schedule: Schedule,
}

/// The four events of one batch.
struct Events {
    start: Event,
    h2d_done: Event,
    kernel_done: Event,
    d2h_done: Event,
    /// Before the allocations and after the frees: only while a trace recorder is active.
    alloc_start: Option<Event>,
    free_done: Option<Event>,
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
        Self::with_schedule(dev, streams, Schedule::default())
    }

    /// A pipeline with `schedule` (tail splitting, stream priorities). Errors as [`Self::new`].
    pub fn with_schedule(dev: &'d Device, streams: usize, schedule: Schedule) -> Result<Self> {
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
        let count = streams;
        let streams = match schedule.priorities {
            Priorities::Equal => (0..count)
                .map(|_| dev.new_stream())
                .collect::<Result<Vec<_>>>()?,
            p => {
                // Lower numbers are higher priorities; `greatest` is the highest.
                let (least, greatest) = dev.stream_priority_range()?;
                let levels = (least - greatest).unsigned_abs() as usize + 1;
                (0..count)
                    .map(|i| {
                        let rank = match p {
                            Priorities::FirstHigh => i,
                            _ => count - 1 - i,
                        };
                        let step = (rank * (levels - 1)) / (count - 1).max(1);
                        dev.new_stream_with_priority(greatest + step as i32)
                    })
                    .collect::<Result<Vec<_>>>()?
            }
        };
        let pool = MemPool::new(dev, u64::MAX)?;
        Ok(Self {
            dev,
            streams,
            pool,
            schedule,
        })
    }

    /// The pipeline's schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
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
    /// Tracing never fails the run: with an installed [`crate::trace::Recorder`] of another
    /// context the run is not traced and its batches are counted in the trace's `unanchored`
    /// (decided before anything is queued), and spans that cannot be timed after the work are
    /// counted there too.
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
        let ranges = self.schedule.ranges(n, batch_elems);
        let total = ranges.len();
        let cap = IN_FLIGHT_PER_STREAM * self.streams.len();
        self.prewarm_pool(batch_elems.min(n), cap.min(total))?;
        // Trace hook (issue 12): two more events per batch while a recorder is active. A
        // recorder of another context cannot time these streams: checked before any work, the
        // run is then not traced and its spans are counted as unanchored (issue 19, item 18).
        let tracer = crate::trace::active().filter(|tr| {
            let ok = tr.owns(&self.streams[0]);
            if !ok {
                tr.note_unanchored(total);
            }
            ok
        });
        let wall = Instant::now();
        let origin = self.streams[0].record()?;
        let mut in_flight: VecDeque<Enqueued> = VecDeque::with_capacity(cap);
        let mut spare: Vec<Events> = Vec::with_capacity(cap);
        let mut batches = Vec::with_capacity(report_capacity(total));
        let mut span_ms = 0f64;
        for (i, range) in ranges.into_iter().enumerate() {
            if in_flight.len() == cap {
                let q = in_flight.pop_front().expect("in-flight queue is full");
                let t = complete(&origin, &q)?;
                span_ms = span_ms.max(t.end_ms);
                batches.push(t);
                spare.push(q.ev);
                progress(batches.len(), total);
            }
            let si = i % self.streams.len();
            let s = &self.streams[si];
            let mut ev = match spare.pop() {
                Some(ev) => ev,
                None => Events {
                    start: s.record()?,
                    h2d_done: s.record()?,
                    kernel_done: s.record()?,
                    d2h_done: s.record()?,
                    alloc_start: None,
                    free_done: None,
                },
            };
            if tracer.is_some() {
                record_opt(s, &mut ev.alloc_start)?;
            }
            let mut da = self.pool.alloc_async::<f32>(s, range.len())?;
            let mut db = self.pool.alloc_async::<f32>(s, range.len())?;
            let mut dc = self.pool.alloc_async::<f32>(s, range.len())?;
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
            unsafe { dc.copy_to_host_async(&mut c[range.clone()])? };
            s.record_into(&mut ev.d2h_done)?;
            // cuMemFreeAsync on `s`, after the D2H in stream order.
            drop((da, db, dc));
            if tracer.is_some() {
                record_opt(s, &mut ev.free_done)?;
            }
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
        if let Some(tr) = &tracer {
            // The work is done: a trace that cannot be made loses the spans, not the report.
            if self.trace_batches(tr, &origin, &batches).is_err() {
                tr.note_unanchored(batches.len());
            }
        }
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

    /// Hands the batches' stage timings to the trace recorder, on the recorder's clock.
    fn trace_batches(
        &self,
        tr: &crate::trace::Recorder,
        origin: &Event,
        batches: &[BatchTiming],
    ) -> Result<()> {
        use crate::trace::{Stage, TimedSpan};
        let anchor = tr.offset_ms(origin, &self.streams[0])?;
        for (i, s) in self.streams.iter().enumerate() {
            tr.name_stream(s, format!("pipeline stream {i}"));
        }
        for b in batches {
            let mut spans = Vec::with_capacity(5);
            let mut push = |stage: Stage, what: &str, start: f64, dur: f64| {
                spans.push(TimedSpan {
                    stage,
                    name: format!("{what} batch {}", b.batch),
                    start_ms: start,
                    dur_ms: dur,
                    args: vec![
                        ("batch".into(), b.batch.to_string()),
                        ("elements".into(), b.elems.to_string()),
                    ],
                })
            };
            let mut t = b.start_ms;
            if let Some(ms) = b.alloc_ms {
                push(Stage::Alloc, "alloc", t - ms, ms);
            }
            push(Stage::H2d, "H2D", t, b.h2d_ms);
            t += b.h2d_ms;
            push(Stage::Kernel, "kernel", t, b.kernel_ms);
            t += b.kernel_ms;
            push(Stage::D2h, "D2H", t, b.d2h_ms);
            t += b.d2h_ms;
            if let Some(ms) = b.free_ms {
                push(Stage::Free, "free", t, ms);
            }
            tr.spans_at(&self.streams[b.stream], anchor, spans);
        }
        Ok(())
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

/// Records `slot`'s event on `s`, creating it on first use.
fn record_opt(s: &Stream, slot: &mut Option<Event>) -> Result<()> {
    match slot {
        Some(e) => s.record_into(e),
        None => {
            *slot = Some(s.record()?);
            Ok(())
        }
    }
}

/// Waits for batch `q` and reads its timings (its events can be reused afterwards).
fn complete(origin: &Event, q: &Enqueued) -> Result<BatchTiming> {
    q.ev.d2h_done.synchronize()?;
    if let Some(f) = &q.ev.free_done {
        f.synchronize()?;
    }
    let ms = |a: &Event, b: &Event| a.elapsed_ms(b).map(f64::from);
    // The optional events are only read when both were recorded for this batch.
    let (alloc_ms, free_ms) = match (&q.ev.alloc_start, &q.ev.free_done) {
        (Some(a), Some(f)) => (Some(ms(a, &q.ev.start)?), Some(ms(&q.ev.d2h_done, f)?)),
        _ => (None, None),
    };
    Ok(BatchTiming {
        batch: q.batch,
        stream: q.stream,
        elems: q.range.len(),
        start_ms: ms(origin, &q.ev.start)?,
        end_ms: ms(origin, &q.ev.d2h_done)?,
        h2d_ms: ms(&q.ev.start, &q.ev.h2d_done)?,
        kernel_ms: ms(&q.ev.h2d_done, &q.ev.kernel_done)?,
        d2h_ms: ms(&q.ev.kernel_done, &q.ev.d2h_done)?,
        alloc_ms,
        free_ms,
    })
}

/// The chapter's CUDA C++ pattern as a baseline for [`BatchPipeline`] (issue 12): device buffers
/// allocated once per stream before the timed part (`cudaMalloc` in the C++ listing), then per
/// batch `i` on stream `i % streams`: H2D a, b -> `ws_vector_add` -> D2H c, with no per-batch
/// allocation, no per-stage events and no in-flight window. Timed from an event that every stream
/// waits for to the last stream's end. `batches` of the report is empty (no per-batch events).
///
/// Errors: as [`BatchPipeline::run`], plus [`Error::TooLarge`] for more than [`MAX_STREAMS`].
pub fn cxx_pattern_vector_add(
    dev: &Device,
    streams: usize,
    a: &PinnedBuffer<f32>,
    b: &PinnedBuffer<f32>,
    c: &mut PinnedBuffer<f32>,
    batch_elems: usize,
) -> Result<PipelineReport> {
    let n = a.len();
    if b.len() != n || c.len() != n {
        return Err(Error::LengthMismatch {
            what: "C++-pattern pipeline inputs",
            detail: format!("a has {n} elements, b {}, c {}", b.len(), c.len()),
        });
    }
    if batch_elems == 0 || streams == 0 {
        return Err(Error::Empty {
            what: "C++-pattern batch size or streams",
        });
    }
    if streams > MAX_STREAMS {
        return Err(Error::TooLarge {
            what: "C++-pattern streams",
            value: streams as u64,
            max: MAX_STREAMS as u64,
        });
    }
    let ss = (0..streams)
        .map(|_| dev.new_stream())
        .collect::<Result<Vec<_>>>()?;
    // Declared before the buffers and copies, so every stream is drained before they go.
    let mut guard = DrainGuard {
        streams: &ss,
        drained: false,
    };
    let pool = MemPool::new(dev, u64::MAX)?;
    let be = batch_elems.min(n);
    let mut bufs = ss
        .iter()
        .map(|s| {
            Ok((
                pool.alloc_async::<f32>(s, be)?,
                pool.alloc_async::<f32>(s, be)?,
                pool.alloc_async::<f32>(s, be)?,
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    // The last batch may be shorter: buffers of its size on its stream, made before timing.
    let last = n - (n.div_ceil(be) - 1) * be;
    let last_stream = (n.div_ceil(be) - 1) % streams;
    let s_last = &ss[last_stream];
    let mut tail = (
        pool.alloc_async::<f32>(s_last, last)?,
        pool.alloc_async::<f32>(s_last, last)?,
        pool.alloc_async::<f32>(s_last, last)?,
    );
    for s in &ss {
        s.synchronize()?;
    }
    let wall = Instant::now();
    let start = ss[0].record()?;
    for s in &ss[1..] {
        s.wait(&start)?;
    }
    for (i, chunk) in c.chunks_mut(be).enumerate() {
        let si = i % streams;
        let s = &ss[si];
        let range = i * be..i * be + chunk.len();
        let (da, db, dc) = if chunk.len() == be {
            let t = &mut bufs[si];
            (&mut t.0, &mut t.1, &mut t.2)
        } else {
            (&mut tail.0, &mut tail.1, &mut tail.2)
        };
        // SAFETY: `a`, `b`, `c` are borrowed for the whole call and `guard` drains every stream
        // before it returns or unwinds; stream order puts each buffer's reuse after its D2H.
        unsafe {
            da.copy_from_host_async(&a[range.clone()])?;
            db.copy_from_host_async(&b[range])?;
        }
        crate::kernels::vector_add(dev, s, da.as_view(), db.as_view(), dc.as_view_mut())?;
        // SAFETY: as above.
        unsafe { dc.copy_to_host_async(chunk)? };
    }
    for s in &ss[1..] {
        ss[0].wait(&s.record()?)?;
    }
    let end = ss[0].record()?;
    let span_ms = f64::from(start.elapsed_ms(&end)?);
    guard.drain()?;
    let wall_ms = wall.elapsed().as_secs_f64() * 1e3;
    let bytes = (n * size_of::<f32>()) as u64;
    Ok(PipelineReport {
        streams,
        batches: Vec::new(),
        bytes_h2d: 2 * bytes,
        bytes_d2h: bytes,
        span_ms,
        wall_ms,
    })
}

/// Batch timings reserved up front: at most [`REPORT_RESERVE`], so that a tiny batch size over a
/// large input (up to one batch per element) never asks the allocator for many times the input's
/// size before any work runs (an allocation failure aborts the process); the report grows as
/// batches complete.
fn report_capacity(total: usize) -> usize {
    total.min(REPORT_RESERVE)
}

/// See [`report_capacity`].
const REPORT_RESERVE: usize = 4096;

#[cfg(test)]
mod schedule_tests {
    use super::*;

    /// Review of issue 19 (hostile input): `batch_elems = 1` over 2^30 pinned elements reserved
    /// 2^30 batch timings (tens of GiB) up front, an allocation failure that aborts.
    #[test]
    fn issue19_review_report_reserve_is_bounded() {
        assert_eq!(report_capacity(3), 3);
        assert_eq!(report_capacity(1 << 30), REPORT_RESERVE);
        assert_eq!(report_capacity(usize::MAX), REPORT_RESERVE);
    }

    #[test]
    fn plain_schedule_is_equal_batches() {
        let r = Schedule::PLAIN.ranges(10, 4).collect::<Vec<_>>();
        assert_eq!(r, vec![0..4, 4..8, 8..10]);
    }

    #[test]
    fn tail_split_splits_the_last_two_batches_in_four() {
        assert_eq!(Schedule::default(), Schedule::PLAIN);
        let r = Schedule::TAIL_SPLIT
            .ranges(16 * 100, 100)
            .collect::<Vec<_>>();
        assert_eq!(r.len(), 14 + 2 * 4);
        assert_eq!(r[13], 1300..1400);
        assert_eq!(r[14], 1400..1425);
        assert_eq!(r[21], 1575..1600);
    }

    #[test]
    fn tail_batches_are_split_into_pieces_covering_them_exactly() {
        let s = Schedule {
            tail_batches: 2,
            tail_pieces: 4,
            ..Schedule::default()
        };
        let r = s.ranges(16 * 100, 100).collect::<Vec<_>>();
        assert_eq!(r.len(), 14 + 8);
        assert_eq!(r[13], 1300..1400);
        assert_eq!(r[14], 1400..1425);
        assert_eq!(r.last(), Some(&(1575..1600)));
        for w in r.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
        // More pieces than elements: no empty piece.
        let r = s.ranges(3, 2).collect::<Vec<_>>();
        assert!(r.iter().all(|x| !x.is_empty()), "{r:?}");
        assert_eq!(r.iter().map(|x| x.len()).sum::<usize>(), 3);
    }

    #[test]
    fn huge_tail_fields_and_batches_neither_panic_nor_overflow() {
        let s = Schedule {
            tail_batches: 1 << 31,
            tail_pieces: 1 << 31,
            ..Schedule::default()
        };
        let r = s.ranges(10, 4).collect::<Vec<_>>();
        assert_eq!(r.len(), 10, "{r:?}");
        // One batch of 2^40 elements in 3 pieces: the pieces cover the batch exactly.
        let s = Schedule {
            tail_batches: 1,
            tail_pieces: 3,
            ..Schedule::default()
        };
        let n = 1usize << 40;
        let r = s.ranges(n, n).collect::<Vec<_>>();
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].start, r[2].end), (0, n));
        for w in r.windows(2) {
            assert_eq!(w[0].end, w[1].start);
        }
    }

    /// Checks that `s.ranges(n, b)` covers `0..n` exactly, in order, without overlap or empty
    /// pieces, and that its length is exact: fully when it has at most `FULL` ranges, else its
    /// first `FULL` ranges (contiguous from 0) and its length bound.
    fn check_cover(s: &Schedule, n: usize, b: usize) -> Result<(), String> {
        const FULL: usize = 20_000;
        let r = s.ranges(n, b);
        let len = r.len();
        if len > n {
            return Err(format!("{len} ranges for {n} elements"));
        }
        let mut next = 0usize;
        let mut seen = 0usize;
        for x in r.take(FULL) {
            if x.start != next || x.is_empty() || x.end > n {
                return Err(format!(
                    "range {seen} is {x:?}, expected to start at {next}"
                ));
            }
            next = x.end;
            seen += 1;
        }
        if len <= FULL && (seen != len || next != n) {
            return Err(format!(
                "{seen} ranges (len() says {len}) cover 0..{next}, not 0..{n}"
            ));
        }
        // Pieces never exceed a batch: with unsplit batches, every range is a batch.
        if s.tail_pieces <= 1 || s.tail_batches == 0 {
            let want = n.div_ceil(b.max(1));
            if len != want {
                return Err(format!("{len} ranges, {want} batches"));
            }
        }
        Ok(())
    }

    #[test]
    fn issue19_item11_huge_inputs_are_covered_exactly() {
        // (i + 1) * batch_elems overflowed here: 2 batches of 2^63 + 1 over usize::MAX elements.
        let b = (usize::MAX / 2) + 1;
        let r: Vec<_> = Schedule::PLAIN.ranges(usize::MAX, b).collect();
        assert_eq!(r, vec![0..b, b..usize::MAX]);
        let r: Vec<_> = Schedule::TAIL_SPLIT
            .ranges(usize::MAX, usize::MAX)
            .collect();
        assert_eq!(r.len(), 4);
        assert_eq!((r[0].start, r[3].end), (0, usize::MAX));
        // One element per batch over usize::MAX elements: exact length, nothing allocated.
        let r = Schedule::TAIL_SPLIT.ranges(usize::MAX, 1);
        assert_eq!(r.len(), usize::MAX);
        for (s, b) in [
            (Schedule::PLAIN, 0),
            (Schedule::TAIL_SPLIT, usize::MAX),
            (
                Schedule {
                    tail_batches: usize::MAX,
                    tail_pieces: usize::MAX,
                    ..Schedule::default()
                },
                usize::MAX / 3,
            ),
        ] {
            check_cover(&s, usize::MAX, b).unwrap();
            check_cover(&s, 0, b).unwrap();
        }
    }

    use proptest::prelude::*;

    /// Sizes near the edges of usize as well as small ones.
    fn size() -> impl Strategy<Value = usize> {
        prop_oneof![
            0usize..64,
            any::<usize>(),
            (0usize..64).prop_map(|d| usize::MAX - d),
            (1u32..64).prop_map(|e| 1usize << (e % usize::BITS)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn issue19_item11_ranges_cover_any_input_exactly(
            n in size(),
            b in size(),
            tail_batches in size(),
            tail_pieces in size(),
        ) {
            let s = Schedule { tail_batches, tail_pieces, ..Schedule::default() };
            if let Err(e) = check_cover(&s, n, b) {
                return Err(TestCaseError::fail(format!("{s:?}, n {n}, batch {b}: {e}")));
            }
        }

        #[test]
        fn issue19_item11_small_ranges_match_a_naive_oracle(
            n in 0usize..5000,
            b in 0usize..700,
            tail_batches in 0usize..12,
            tail_pieces in 0usize..40,
        ) {
            // Oracle: batches of b (0 counts as 1), the last tail_batches split into
            // min(pieces, len) parts of floor(p * len / pieces).
            let bb = b.max(1);
            let batches: Vec<(usize, usize)> =
                (0..n.div_ceil(bb)).map(|i| (i * bb, ((i + 1) * bb).min(n))).collect();
            let from = batches.len().saturating_sub(tail_batches);
            let mut want = Vec::new();
            for (i, &(lo, hi)) in batches.iter().enumerate() {
                let len = hi - lo;
                let p = if i >= from && tail_pieces > 1 { tail_pieces.min(len) } else { 1 };
                for k in 0..p {
                    want.push(lo + k * len / p..lo + (k + 1) * len / p);
                }
            }
            let s = Schedule { tail_batches, tail_pieces, ..Schedule::default() };
            let r = s.ranges(n, b);
            prop_assert_eq!(r.len(), want.len());
            prop_assert_eq!(r.collect::<Vec<_>>(), want);
        }
    }
}
