//! Trace recorder: where the time of a run went, per stream, on one clock (issue 12).
//!
//! Off by default. [`Recorder::new`] makes one for a device and [`Recorder::install`] makes it the
//! process's active recorder until the returned guard drops; while one is installed,
//!
//! - [`crate::BatchPipeline`] records each batch's stages (alloc, H2D, kernel, D2H, free) on its
//!   stream,
//! - [`crate::TaskGraph`] direct runs record every task (kernels, copies, signal waits, sets and
//!   adds, host callbacks) on its lane's stream, plus the cross-lane dependency waits before it,
//! - [`crate::Chain`] runs and replays of its captured graph record one span per run (events
//!   between PDL launches would serialise them, so a chain is one span, not one per launch),
//!
//! and code of your own adds spans with [`Recorder::mark`] / [`Recorder::span`] and
//! `%globaltimer` stamps with [`Recorder::device_stamps`]. When nothing is installed a hook costs
//! one relaxed atomic load ([`active`]). When one is, a traced stage costs one or two extra
//! `cuEventRecord`s (timing events, about 1-2 µs of host time each) and nothing on the GPU beyond
//! the event itself; spans are resolved as their events complete (polled as new spans come, and
//! in [`Recorder::finish`], which waits for the rest).
//!
//! # Bounded
//!
//! A recorder keeps at most [`DEFAULT_SPAN_LIMIT`] spans ([`Recorder::set_span_limit`]) and at
//! most [`MAX_PENDING_SPANS`] spans whose events have not completed; spans beyond either are
//! dropped and counted ([`Recorder::dropped_spans`], and in [`Trace::clock`]). A long-lived
//! recorder can be emptied with [`Recorder::drain`] (issue 19, item 17).
//!
//! # One clock
//!
//! Times are microseconds from the recorder's *origin*, a CUDA event recorded (and waited for) in
//! [`Recorder::new`] before any traced work: every span made from events is
//! `cuEventElapsedTime(origin, event)` (resolution about 0.5 µs per the CUDA driver API docs).
//! Events of another context (a [`crate::Fence`]'s private context) cannot be timed against the
//! origin and are counted in [`Trace::unanchored`], not drawn.
//!
//! `%globaltimer` (PTX ISA "Special registers": a GPU-wide nanosecond timer, updated about every
//! microsecond on the H100) is another clock. [`Recorder::calibrate_globaltimer`] puts it on the
//! event clock: it records event `A`, launches a kernel whose CTAs stamp `%globaltimer` at their
//! start and end, records event `B`, and takes the stamps' midpoint as the window's midpoint:
//! `offset = (s_start + s_end) / 2 - (t(A) + t(B)) / 2`. Repeated [`CALIBRATION_TRIALS`] times,
//! the trial with the narrowest window wins; its half-width minus half the kernel's own stamp
//! span is the bound of the error ([`GlobalTimerCalibration::error_us`], typically a few µs).
//! Stamps then map as `t = (stamp - offset) / 1000` µs.

#[cfg(feature = "timeline")]
pub mod timeline;

mod chrome;
mod model;

pub use chrome::{chrome_json, write_chrome_json};
pub use model::{Span, Stage, Trace, Track, TrackKind};

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::{Event, Stream};

/// Spans a recorder keeps by default (resolved and pending together; see
/// [`Recorder::set_span_limit`]). Spans beyond it are dropped and counted
/// ([`Recorder::dropped_spans`]).
pub const DEFAULT_SPAN_LIMIT: usize = 1 << 20;

/// Spans whose events a recorder keeps pending at most (two CUDA events each). Completed ones are
/// resolved as new ones come; beyond this many still incomplete, new spans are dropped and
/// counted ([`Recorder::dropped_spans`]).
pub const MAX_PENDING_SPANS: usize = 4096;

/// Calibration trials of [`Recorder::calibrate_globaltimer`].
pub const CALIBRATION_TRIALS: usize = 8;

/// `%globaltimer` on the event clock (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct GlobalTimerCalibration {
    /// `%globaltimer` nanoseconds at the recorder's origin.
    pub offset_ns: f64,
    /// Bound of the alignment error, µs.
    pub error_us: f64,
}

/// One span waiting for its events to complete.
struct Pending {
    track: usize,
    stage: Stage,
    name: String,
    start: Event,
    end: Event,
    args: Vec<(String, String)>,
}

struct State {
    tracks: Vec<Track>,
    by_stream: HashMap<usize, usize>,
    pending: Vec<Pending>,
    spans: Vec<Span>,
    unanchored: usize,
    globaltimer: Option<GlobalTimerCalibration>,
    /// Spans dropped beyond the limits.
    dropped: usize,
    /// Most spans kept (resolved + pending).
    limit: usize,
    /// Pending spans at which completed ones are resolved next.
    resolve_at: usize,
}

impl State {
    /// Room for `n` more spans under the limit; counts the ones that do not fit as dropped and
    /// returns how many do.
    fn room(&mut self, n: usize) -> usize {
        let kept = self.spans.len() + self.pending.len();
        let fit = self.limit.saturating_sub(kept).min(n);
        self.dropped += n - fit;
        fit
    }
}

/// The span of `p` on the clock of `origin`; errors when its events cannot be timed.
fn resolve(origin: &Event, p: Pending) -> Result<Span> {
    let start = origin.elapsed_ms(&p.start)?;
    let dur = p.start.elapsed_ms(&p.end)?;
    Ok(Span {
        track: p.track,
        stage: p.stage,
        name: p.name,
        start_us: f64::from(start) * 1e3,
        dur_us: f64::from(dur).max(0.0) * 1e3,
        args: p.args,
    })
}

struct Inner {
    ordinal: usize,
    device: String,
    ctx: usize,
    origin: Event,
    host_origin: Instant,
    state: Mutex<State>,
}

/// A trace recorder for one device (cheap to clone: clones share the recording).
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<Inner>,
}

static ACTIVE: AtomicBool = AtomicBool::new(false);
static CURRENT: Mutex<Option<Recorder>> = Mutex::new(None);

/// The installed recorder, if any: one relaxed atomic load when none is.
pub fn active() -> Option<Recorder> {
    if !ACTIVE.load(Ordering::Relaxed) {
        return None;
    }
    CURRENT.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Uninstalls the recorder it was made for when dropped (only if that recorder is still the
/// installed one: a later `install` that replaced it is left in place).
pub struct Installed {
    recorder: Arc<Inner>,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let mut cur = CURRENT.lock().unwrap_or_else(|e| e.into_inner());
        if cur
            .as_ref()
            .is_some_and(|r| Arc::ptr_eq(&r.inner, &self.recorder))
        {
            *cur = None;
            ACTIVE.store(false, Ordering::Relaxed);
        }
    }
}

impl Recorder {
    /// A recorder for `dev`: records the origin event on a new stream of `dev` and waits for it
    /// (so it completes before any work traced later). Errors: [`Error::Cuda`].
    pub fn new(dev: &Device) -> Result<Self> {
        // A spare stream of the device's stock: no stream creation behind a pending wait.
        let spare = crate::stream::SpareStream::take_in(dev.context())?;
        let s = spare.stream();
        let origin = s.record()?;
        origin.synchronize()?;
        let host_origin = Instant::now();
        Ok(Self {
            inner: Arc::new(Inner {
                ordinal: dev.ordinal(),
                device: dev.capabilities().name.clone(),
                ctx: s.context_raw() as usize,
                origin,
                host_origin,
                state: Mutex::new(State {
                    tracks: Vec::new(),
                    by_stream: HashMap::new(),
                    pending: Vec::new(),
                    spans: Vec::new(),
                    unanchored: 0,
                    globaltimer: None,
                    dropped: 0,
                    limit: DEFAULT_SPAN_LIMIT,
                    resolve_at: 64,
                }),
            }),
        })
    }

    /// Makes this the process's active recorder (the one the hooks of the pipeline, task graphs
    /// and chains use) until the guard drops. A later `install` replaces an earlier one.
    pub fn install(&self) -> Installed {
        *CURRENT.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.clone());
        ACTIVE.store(true, Ordering::Relaxed);
        Installed {
            recorder: self.inner.clone(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Microseconds of host time since the origin (`Instant`, for host-side spans).
    pub fn host_now_us(&self) -> f64 {
        self.inner.host_origin.elapsed().as_secs_f64() * 1e6
    }

    /// True when spans of `stream` can be put on this recorder's clock (the stream is of the
    /// recorder's context).
    pub fn owns(&self, stream: &Stream) -> bool {
        stream.context_raw() as usize == self.inner.ctx
    }

    /// Counts `n` spans that could not be put on the clock (another context) in
    /// [`Trace::unanchored`].
    pub(crate) fn note_unanchored(&self, n: usize) {
        self.state().unanchored += n;
    }

    /// Keeps at most `max_spans` spans (resolved and pending; default [`DEFAULT_SPAN_LIMIT`]);
    /// spans beyond it are dropped and counted ([`Self::dropped_spans`]). Spans already kept
    /// stay. Use [`Self::drain`] to take the spans out and make room.
    pub fn set_span_limit(&self, max_spans: usize) {
        self.state().limit = max_spans;
    }

    /// Spans dropped so far because the recorder was full (the span limit, or more than
    /// [`MAX_PENDING_SPANS`] spans whose events had not completed).
    pub fn dropped_spans(&self) -> usize {
        self.state().dropped
    }

    /// Spans whose events are still held (two CUDA events each), at most [`MAX_PENDING_SPANS`].
    pub fn pending_spans(&self) -> usize {
        self.state().pending.len()
    }

    /// Resolves the pending spans whose events have completed (`cuEventQuery`, no waiting),
    /// releasing their events; a span whose events cannot be timed is counted as unanchored.
    fn resolve_completed(&self, st: &mut State) {
        let pending = std::mem::take(&mut st.pending);
        for p in pending {
            // An event that cannot be queried (poisoned context) is not waited for either.
            let done = |e: &Event| !matches!(e.is_complete(), Ok(false));
            if !(done(&p.end) && done(&p.start)) {
                st.pending.push(p);
                continue;
            }
            match resolve(&self.inner.origin, p) {
                Ok(span) => st.spans.push(span),
                Err(_) => st.unanchored += 1,
            }
        }
        st.resolve_at = (2 * st.pending.len()).clamp(64, MAX_PENDING_SPANS);
    }

    /// The track of `stream`, made on first use as "stream N" (N in order of first use).
    fn track_of(&self, st: &mut State, stream: &Stream) -> usize {
        let key = stream.raw() as usize;
        if let Some(&t) = st.by_stream.get(&key) {
            return t;
        }
        let n = st
            .tracks
            .iter()
            .filter(|t| t.kind == TrackKind::Stream)
            .count();
        let t = st.tracks.len();
        st.tracks.push(Track {
            pid: self.inner.ordinal as u32,
            process: format!("GPU {}: {}", self.inner.ordinal, self.inner.device),
            tid: t as u32 + 1,
            name: format!("stream {n}"),
            kind: TrackKind::Stream,
        });
        st.by_stream.insert(key, t);
        t
    }

    /// Names `stream`'s track (for example "pipeline stream 0" or a task graph lane's name).
    pub fn name_stream(&self, stream: &Stream, name: impl Into<String>) {
        if !self.owns(stream) {
            return;
        }
        let mut st = self.state();
        let t = self.track_of(&mut st, stream);
        st.tracks[t].name = name.into();
    }

    /// A timing event at this point of `stream`, to start or end a span.
    pub fn mark(&self, stream: &Stream) -> Result<Event> {
        stream.record()
    }

    /// A span on `stream`'s track from event `start` to event `end` (both recorded on `stream`
    /// or ordered with it), resolved once both have completed (at the latest in
    /// [`Self::finish`]). Events of another context are counted as unanchored and dropped; a span
    /// beyond the recorder's bounds (see the module docs) is dropped and counted in
    /// [`Self::dropped_spans`].
    pub fn span(
        &self,
        stream: &Stream,
        stage: Stage,
        name: impl Into<String>,
        start: Event,
        end: Event,
        args: Vec<(String, String)>,
    ) {
        let mut st = self.state();
        if !self.owns(stream) {
            st.unanchored += 1;
            return;
        }
        if st.pending.len() >= st.resolve_at {
            self.resolve_completed(&mut st);
        }
        if st.pending.len() >= MAX_PENDING_SPANS || st.room(1) == 0 {
            // Dropped (and counted): the recorder's memory and event count stay bounded.
            if st.pending.len() >= MAX_PENDING_SPANS {
                st.dropped += 1;
            }
            return;
        }
        let track = self.track_of(&mut st, stream);
        st.pending.push(Pending {
            track,
            stage,
            name: name.into(),
            start,
            end,
            args,
        });
    }

    /// Milliseconds from the origin to `event` (waits for it). Errors: [`Error::TraceClock`] for
    /// an event of another context, [`Error::Cuda`].
    pub fn offset_ms(&self, event: &Event, stream: &Stream) -> Result<f64> {
        if !self.owns(stream) {
            return Err(Error::TraceClock {
                detail: "the event belongs to another CUDA context than the recorder's origin"
                    .into(),
            });
        }
        Ok(f64::from(self.inner.origin.elapsed_ms(event)?))
    }

    /// Spans already on the clock: `start_ms` and `dur_ms` relative to `anchor_ms` (an
    /// [`Self::offset_ms`]), on `stream`'s track.
    pub fn spans_at(&self, stream: &Stream, anchor_ms: f64, spans: Vec<TimedSpan>) {
        let mut st = self.state();
        if !self.owns(stream) {
            st.unanchored += spans.len();
            return;
        }
        let fit = st.room(spans.len());
        let track = self.track_of(&mut st, stream);
        for s in spans.into_iter().take(fit) {
            st.spans.push(Span {
                track,
                stage: s.stage,
                name: s.name,
                start_us: (anchor_ms + s.start_ms) * 1e3,
                dur_us: s.dur_ms.max(0.0) * 1e3,
                args: s.args,
            });
        }
    }

    /// Puts `%globaltimer` on the event clock with `probe` (see the module docs): `probe` queues
    /// on `s` a kernel that stamps `%globaltimer` and returns, after waiting for it, the earliest
    /// start and latest end stamp, ns. Errors: [`Error::TraceClock`] when the stamps are not
    /// ordered or `s` is of another context, the probe's errors.
    pub fn calibrate_globaltimer_with(
        &self,
        s: &Stream,
        mut probe: impl FnMut(&Stream) -> Result<(u64, u64)>,
    ) -> Result<GlobalTimerCalibration> {
        let mut best: Option<(f64, GlobalTimerCalibration)> = None;
        for _ in 0..CALIBRATION_TRIALS {
            let a = s.record()?;
            let (s0, s1) = probe(s)?;
            let b = s.record()?;
            b.synchronize()?;
            if s1 < s0 {
                return Err(Error::TraceClock {
                    detail: format!("calibration stamps out of order: start {s0} ns, end {s1} ns"),
                });
            }
            let ta = self.offset_ms(&a, s)? * 1e3;
            let tb = self.offset_ms(&b, s)? * 1e3;
            let window = tb - ta;
            let own = (s1 - s0) as f64 * 1e-3;
            let cal = GlobalTimerCalibration {
                offset_ns: (s0 as f64 + s1 as f64) / 2.0 - (ta + tb) / 2.0 * 1e3,
                error_us: ((window - own) / 2.0).max(0.0),
            };
            if best.is_none_or(|(w, _)| window < w) {
                best = Some((window, cal));
            }
        }
        let cal = best.map(|b| b.1).ok_or_else(|| Error::TraceClock {
            detail: "no calibration trial ran".into(),
        })?;
        self.state().globaltimer = Some(cal);
        Ok(cal)
    }

    /// [`Self::calibrate_globaltimer_with`] using warpline's `primary_gemm` with `%globaltimer`
    /// stamps (a 64 x 64 x 4 product, one cluster of 2 CTAs) as the probe.
    pub fn calibrate_globaltimer(&self, dev: &Device) -> Result<GlobalTimerCalibration> {
        use crate::kernels::pdl::{gemm, gemm_grid, GemmDims, GemmKernel};
        use warpline_gpu::contract::pdl::STAMPS_PER_CTA;
        let dims = GemmDims { m: 64, n: 64, k: 4 };
        let s0 = dev.new_stream()?;
        // A pool of its own: the device's default pool is process-wide state (issue 19, item 16).
        let pool = crate::memory::MemPool::new(dev, 0)?;
        let grid = gemm_grid(dims) as usize;
        let mut a = pool.alloc_async::<f32>(&s0, 64 * 4)?;
        let mut b = pool.alloc_async::<f32>(&s0, 4 * 64)?;
        let mut c = pool.alloc_async::<f32>(&s0, 64 * 64)?;
        let mut stamps = pool.alloc_async::<u64>(&s0, grid * STAMPS_PER_CTA)?;
        a.fill_async(1.0)?;
        b.fill_async(1.0)?;
        // Zeroed from the host: `fill_async` takes 1-, 2- or 4-byte elements, and the stamps
        // are u64 (this call failed with BadShape until the issue-19 test ran it on the H100).
        stamps.copy_from_host(&vec![0u64; grid * STAMPS_PER_CTA])?;
        s0.synchronize()?;
        self.calibrate_globaltimer_with(&s0, |s| {
            gemm(
                dev,
                s,
                GemmKernel::Primary,
                a.as_view(),
                b.as_view(),
                c.as_view_mut(),
                dims,
                Some(stamps.as_view_mut()),
            )?;
            s.synchronize()?;
            let mut host = vec![0u64; grid * STAMPS_PER_CTA];
            stamps.copy_to_host(&mut host)?;
            let starts = host.iter().step_by(STAMPS_PER_CTA).copied();
            let ends = host
                .iter()
                .skip(STAMPS_PER_CTA - 1)
                .step_by(STAMPS_PER_CTA)
                .copied();
            Ok((starts.min().unwrap_or(0), ends.max().unwrap_or(0)))
        })
    }

    /// The `%globaltimer` calibration, if one was made.
    pub fn globaltimer(&self) -> Option<GlobalTimerCalibration> {
        self.state().globaltimer
    }

    /// Adds `%globaltimer` stamps (ns) as spans on a track of their own named `track` (for
    /// example "primary_gemm CTAs"): each item is a name, a start and an end stamp. Errors:
    /// [`Error::TraceClock`] without a calibration ([`Self::calibrate_globaltimer`]).
    pub fn device_stamps(&self, track: &str, stage: Stage, items: &[DeviceStamp]) -> Result<()> {
        let mut st = self.state();
        let cal = st.globaltimer.ok_or_else(|| Error::TraceClock {
            detail: "device stamps need a %globaltimer calibration first (Recorder::calibrate_globaltimer)".into(),
        })?;
        let fit = st.room(items.len());
        let t = st.tracks.len();
        st.tracks.push(Track {
            pid: self.inner.ordinal as u32,
            process: format!("GPU {}: {}", self.inner.ordinal, self.inner.device),
            tid: t as u32 + 1,
            name: track.to_string(),
            kind: TrackKind::DeviceStamps,
        });
        for it in items.iter().take(fit) {
            st.spans.push(Span {
                track: t,
                stage,
                name: it.name.clone(),
                start_us: (it.start_ns as f64 - cal.offset_ns) * 1e-3,
                dur_us: it.end_ns.saturating_sub(it.start_ns) as f64 * 1e-3,
                args: vec![(
                    "clock".into(),
                    format!("%globaltimer, aligned within ±{:.1} us", cal.error_us),
                )],
            });
        }
        Ok(())
    }

    /// Waits for every pending span's events and returns the trace so far (the recorder keeps
    /// recording; a later `finish` returns the earlier spans again with the new ones). A span
    /// whose events cannot be read is counted in [`Trace::unanchored`] instead of failing the
    /// others. Never fails today; the `Result` leaves room for outputs that can.
    pub fn finish(&self) -> Result<Trace> {
        self.collect(false)
    }

    /// As [`Self::finish`], but the returned spans are removed from the recorder (tracks,
    /// counts and the calibration stay): a long-lived recorder drained now and then keeps
    /// memory and events bounded by what happens between two drains.
    pub fn drain(&self) -> Result<Trace> {
        self.collect(true)
    }

    fn collect(&self, take: bool) -> Result<Trace> {
        // Resolve outside the lock: the event waits may be long, and hooks on other threads
        // record spans meanwhile. A span whose events cannot be timed (another context, an
        // event of a failed stream) is counted as unanchored; the others are kept.
        let pending = std::mem::take(&mut self.state().pending);
        let mut resolved = Vec::with_capacity(pending.len());
        let mut lost = 0;
        for p in pending {
            match resolve(&self.inner.origin, p) {
                Ok(span) => resolved.push(span),
                Err(_) => lost += 1,
            }
        }
        let mut st = self.state();
        st.spans.extend(resolved);
        st.unanchored += lost;
        let mut spans = if take {
            std::mem::take(&mut st.spans)
        } else {
            st.spans.clone()
        };
        spans.sort_by(|a, b| a.start_us.total_cmp(&b.start_us));
        let mut clock = clock_note(st.globaltimer);
        if st.dropped > 0 {
            clock.push_str(&format!(
                "; {} span(s) dropped: the recorder was full (span limit {}, at most {} pending)",
                st.dropped, st.limit, MAX_PENDING_SPANS
            ));
        }
        Ok(Trace {
            tracks: st.tracks.clone(),
            spans,
            unanchored: st.unanchored,
            clock,
        })
    }
}

fn clock_note(cal: Option<GlobalTimerCalibration>) -> String {
    let mut s = "µs from the recorder's origin CUDA event (cuEventElapsedTime)".to_string();
    if let Some(c) = cal {
        s.push_str(&format!(
            "; %globaltimer stamps aligned by an event-bracketed probe kernel, offset {:.0} ns, within ±{:.1} µs",
            c.offset_ns, c.error_us
        ));
    }
    s
}

/// A span already timed relative to some anchor (see [`Recorder::spans_at`]), ms.
#[derive(Clone, Debug)]
pub struct TimedSpan {
    /// Stage (colour).
    pub stage: Stage,
    /// Name shown in the trace.
    pub name: String,
    /// Start, ms from the anchor.
    pub start_ms: f64,
    /// Duration, ms.
    pub dur_ms: f64,
    /// Extra key/value pairs shown in the trace viewer.
    pub args: Vec<(String, String)>,
}

/// One interval of `%globaltimer` stamps, nanoseconds (see [`Recorder::device_stamps`]).
#[derive(Clone, Debug)]
pub struct DeviceStamp {
    /// Name (for example "CTA 5" or "tiles first start .. last end").
    pub name: String,
    /// `%globaltimer` at the start, ns.
    pub start_ns: u64,
    /// `%globaltimer` at the end, ns.
    pub end_ns: u64,
}

/// Runs `f` (which queues work on `stream`) between two timing events and records the span
/// `name` when `tr` is a recorder; without one it only runs `f`. The hook of task graphs and
/// chains.
pub(crate) fn traced<T>(
    tr: Option<&Recorder>,
    stream: &Stream,
    stage: Stage,
    name: impl FnOnce() -> String,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let Some(tr) = tr else {
        return f();
    };
    let start = tr.mark(stream)?;
    let out = f()?;
    let end = tr.mark(stream)?;
    tr.span(stream, stage, name(), start, end, Vec::new());
    Ok(out)
}
