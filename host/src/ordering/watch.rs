//! `synchronize_timeout`: waiting for a stream or a task-graph run with a bound, so that a signal
//! wait that never fires becomes a typed [`Error::Timeout`] listing what is pending instead of a
//! hang. Host-side polling only (`cuStreamQuery`, `cuEventQuery`), which never blocks behind GPU
//! work.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::{sys, CudaEvent};

use super::graph::{GraphRun, Release};
use super::signal::{Cmp, Releasable};
use crate::error::{CudaCall, Error, Result};
use crate::stream::Stream;

/// What [`synchronize_timeout`] does when the bound passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnTimeout {
    /// Release every pending signal wait by writing a value that satisfies it
    /// ([`Cmp::satisfying_value`]) from a fresh stream, then wait up to the same bound again for
    /// the work to drain. The work after the waits runs (on whatever its inputs hold); the
    /// streams and signals stay usable; the error says `released: true` if everything drained.
    Release,
    /// Leave everything as it is: the streams stay blocked (abandoned) and must not be reused;
    /// other streams may be serialised behind them by the hardware.
    Abandon,
}

/// A stream or a task-graph run to wait for.
pub enum Watched<'a> {
    /// All work queued on a stream.
    Stream(&'a Stream),
    /// One run of a [`super::TaskGraph`].
    Run(&'a GraphRun),
}

impl<'a> From<&'a Stream> for Watched<'a> {
    fn from(s: &'a Stream) -> Self {
        Watched::Stream(s)
    }
}

impl<'a> From<&'a GraphRun> for Watched<'a> {
    fn from(r: &'a GraphRun) -> Self {
        Watched::Run(r)
    }
}

/// An operation that had not completed when the bound passed.
pub(crate) struct PendingOp {
    pub what: String,
    pub release: Option<Release>,
}

/// A signal wait enqueued by [`super::Signal::wait_until`], until it is seen complete.
struct StreamWait {
    /// Held so the handle cannot be reused by a new stream while the entry exists.
    stream: Stream,
    what: String,
    release: Release,
    done: CudaEvent,
}

static STREAM_WAITS: Mutex<Vec<StreamWait>> = Mutex::new(Vec::new());

pub(crate) fn register_stream_wait(
    stream: &Stream,
    what: String,
    signal: Arc<dyn Releasable>,
    cmp: Cmp,
    value: u64,
    done: CudaEvent,
) {
    let mut waits = STREAM_WAITS.lock().unwrap_or_else(|e| e.into_inner());
    waits.retain(|w| !matches!(w.done.try_is_complete(), Ok(true)));
    waits.push(StreamWait {
        stream: stream.clone(),
        what,
        release: Release { signal, cmp, value },
        done,
    });
}

impl Watched<'_> {
    fn describe(&self) -> String {
        match self {
            Watched::Stream(s) => format!("stream {:p}", s.raw()),
            Watched::Run(r) => r.describe().to_string(),
        }
    }

    fn is_complete(&self) -> Result<bool> {
        match self {
            Watched::Stream(s) => {
                // SAFETY: a live stream handle.
                match unsafe { sys::cuStreamQuery(s.raw()) } {
                    sys::CUresult::CUDA_SUCCESS => Ok(true),
                    sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
                    e => e.call("cuStreamQuery").map(|_| false),
                }
            }
            Watched::Run(r) => r.is_complete(),
        }
    }

    fn pending(&self) -> Result<Vec<PendingOp>> {
        match self {
            Watched::Run(r) => r.pending(),
            Watched::Stream(s) => {
                let waits = STREAM_WAITS.lock().unwrap_or_else(|e| e.into_inner());
                let mut out = Vec::new();
                for w in waits.iter().filter(|w| w.stream == **s) {
                    if !w.done.try_is_complete().call("cuEventQuery")? {
                        out.push(PendingOp {
                            what: format!("{} never fired", w.what),
                            release: Some(w.release.clone()),
                        });
                    }
                }
                if out.is_empty() {
                    out.push(PendingOp {
                        what: "work queued on the stream (no warpline signal wait is pending)"
                            .into(),
                        release: None,
                    });
                }
                Ok(out)
            }
        }
    }
}

/// Polls `done` with a short back-off until it is true or `deadline` passes.
fn poll_until(deadline: Instant, mut done: impl FnMut() -> Result<bool>) -> Result<bool> {
    let mut sleep = Duration::from_micros(20);
    loop {
        if done()? {
            return Ok(true);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        std::thread::sleep(sleep.min(deadline - now));
        sleep = (sleep * 2).min(Duration::from_millis(2));
    }
}

/// Fresh streams tried in turn when releasing: CUDA maps streams onto a limited set of hardware
/// queues; a release written into the queue of the blocked wait would never run, so each attempt
/// uses a new stream (likely another queue).
const RELEASE_ATTEMPTS: u32 = 4;

/// Waits until `target` (a [`Stream`] or a [`GraphRun`]) has completed, or `bound` has passed.
///
/// On time: `Ok(())`. After `bound`: [`Error::Timeout`] listing the pending operations (signal
/// waits that never fired first; for a stream, the waits enqueued by [`super::Signal::wait_until`]
/// on it), after applying `on_timeout` ([`OnTimeout::Release`]: pending waits are released by
/// writing their signals from fresh streams and the call waits up to `bound` again for the work to
/// drain; [`OnTimeout::Abandon`]: nothing is touched). Also [`Error::Cuda`] for an asynchronous
/// error reported by `cuStreamQuery` / `cuEventQuery`.
pub fn synchronize_timeout<'a>(
    target: impl Into<Watched<'a>>,
    bound: Duration,
    on_timeout: OnTimeout,
) -> Result<()> {
    let target = target.into();
    let deadline = Instant::now() + bound;
    if poll_until(deadline, || target.is_complete())? {
        return Ok(());
    }
    let pending = target.pending()?;
    let mut released = false;
    if on_timeout == OnTimeout::Release {
        released = release(&target, &pending, bound)?;
    }
    Err(Error::Timeout {
        what: target.describe(),
        waited: bound,
        pending: pending.into_iter().map(|p| p.what).collect(),
        released,
    })
}

/// Writes a satisfying value to every pending wait's signal, from up to [`RELEASE_ATTEMPTS`] fresh
/// streams, until `target` drains; true if it did.
fn release(target: &Watched<'_>, pending: &[PendingOp], bound: Duration) -> Result<bool> {
    let writes: Vec<(&Release, u64)> = pending
        .iter()
        .filter_map(|p| p.release.as_ref())
        .filter_map(|r| r.cmp.satisfying_value(r.value).map(|v| (r, v)))
        .collect();
    let Some((first, _)) = writes.first() else {
        return Ok(false);
    };
    let ctx = first.signal.context().clone();
    let per_attempt = bound / RELEASE_ATTEMPTS;
    for _ in 0..RELEASE_ATTEMPTS {
        let rescue = Stream::new(ctx.new_stream().call("cuStreamCreate")?);
        for (r, v) in &writes {
            r.signal.write_on(&rescue, *v)?;
        }
        if poll_until(Instant::now() + per_attempt, || target.is_complete())? {
            return Ok(true);
        }
    }
    Ok(false)
}
