//! `synchronize_timeout`: waiting for a stream or a task-graph run with a bound, so that a signal
//! wait that never fires becomes a typed [`Error::Timeout`] listing what is pending instead of a
//! hang. Host-side polling only (`cuStreamQuery`, `cuEventQuery`), which never blocks behind GPU
//! work.

use std::time::{Duration, Instant};

use super::graph::GraphRun;
use super::registry;
use super::types::{PendingOp, Release};
use crate::driver::memops;
use crate::error::{Error, Result};
use crate::stream::Stream;

/// What [`synchronize_timeout`] does when the bound passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnTimeout {
    /// Release every pending signal wait by writing a value that satisfies it
    /// ([`Cmp::satisfying_value`](crate::Cmp::satisfying_value)) from a fresh stream, then wait up to the same bound again for
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

impl Watched<'_> {
    fn describe(&self) -> String {
        match self {
            Watched::Stream(s) => format!("stream {:p}", s.raw()),
            Watched::Run(r) => r.describe().to_string(),
        }
    }

    fn is_complete(&self) -> Result<bool> {
        match self {
            // SAFETY: a live stream handle (borrowed for the call).
            Watched::Stream(s) => unsafe { memops::stream_query(s.raw()) },
            Watched::Run(r) => r.is_complete(),
        }
    }

    fn pending(&self) -> Result<Vec<PendingOp>> {
        match self {
            Watched::Run(r) => r.pending(),
            Watched::Stream(s) => {
                let mut out = registry::pending_on(s)?;
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

    fn take_panic(&self) -> Option<Error> {
        match self {
            Watched::Run(r) => r.take_panic(),
            Watched::Stream(_) => None,
        }
    }
}

/// `now + bound`, or `None` (no deadline) when that is past what `Instant` can represent
/// (`Duration::MAX`, say).
fn deadline_after(now: Instant, bound: Duration) -> Option<Instant> {
    now.checked_add(bound)
}

/// Polls `done` with a short back-off until it is true or `deadline` (if any) passes.
fn poll_until(deadline: Option<Instant>, mut done: impl FnMut() -> Result<bool>) -> Result<bool> {
    let mut sleep = Duration::from_micros(20);
    loop {
        if done()? {
            return Ok(true);
        }
        let now = Instant::now();
        let nap = match deadline {
            Some(d) if now >= d => return Ok(false),
            Some(d) => sleep.min(d - now),
            None => sleep,
        };
        std::thread::sleep(nap);
        sleep = (sleep * 2).min(Duration::from_millis(2));
    }
}
/// Fresh streams tried in turn when releasing: CUDA maps streams onto a limited set of hardware
/// queues; a release written into the queue of the blocked wait would never run, so each attempt
/// uses a new stream (likely another queue).
const RELEASE_ATTEMPTS: u32 = 4;

/// Waits until `target` (a [`Stream`] or a [`GraphRun`]) has completed, or `bound` has passed.
///
/// `bound` may be [`Duration::MAX`] (or anything past what [`Instant`] can represent): no
/// deadline. On time: `Ok(())`, or [`Error::HostCallbackPanicked`] when a host callback of the run
/// panicked (caught on the driver thread). After `bound`: [`Error::Timeout`] listing the pending operations (signal
/// waits that never fired first; for a stream, the waits enqueued by [`super::Signal::wait_until`]
/// on it), after applying `on_timeout` ([`OnTimeout::Release`]: pending waits are released by
/// writing their signals from fresh streams (waits registered without a release, such as a
/// fence's, are listed but never written) and the call waits up to `bound` again for the work to
/// drain; [`OnTimeout::Abandon`]: nothing is touched). Also [`Error::Cuda`] for an asynchronous
/// error reported by `cuStreamQuery` / `cuEventQuery`. Inside a task graph host callback:
/// [`Error::InHostCallback`] at once (the run cannot complete while the callback waits).
pub fn synchronize_timeout<'a>(
    target: impl Into<Watched<'a>>,
    bound: Duration,
    on_timeout: OnTimeout,
) -> Result<()> {
    // Inside a host callback the run cannot complete while the callback waits (issue 19, item 9).
    crate::device::refuse_in_host_callback("synchronize_timeout")?;
    let target = target.into();
    let deadline = deadline_after(Instant::now(), bound);
    if poll_until(deadline, || target.is_complete())? {
        return match target.take_panic() {
            Some(e) => Err(e),
            None => Ok(()),
        };
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
    if writes.is_empty() {
        return Ok(false);
    }
    // Words the host can store (fence slots) need no stream, hence no hardware queue.
    let stream_writes: Vec<(&Release, u64)> = writes
        .into_iter()
        .filter(|(r, v)| !r.signal.store_from_host(*v))
        .collect();
    let Some((first, _)) = stream_writes.first() else {
        return poll_until(deadline_after(Instant::now(), bound), || {
            target.is_complete()
        });
    };
    let ctx = first.signal.context().clone();
    // The context's rescue streams, made when its device opened: no stream is created here,
    // behind the pending wait (cuStreamCreate can block there holding a driver lock; issue 19).
    let rescue = crate::device::state_for(ctx.cu_ctx())
        .ext::<crate::stream::StreamStock>()
        .rescue();
    if rescue.is_empty() {
        return Ok(false);
    }
    let per_attempt = bound / RELEASE_ATTEMPTS;
    for attempt in 0..RELEASE_ATTEMPTS {
        crate::device::bind_context(&ctx, "cuStreamWriteValue")?;
        let rescue = &rescue[attempt as usize % rescue.len()];
        for (r, v) in &stream_writes {
            r.signal.write_on(rescue, *v)?;
        }
        if poll_until(deadline_after(Instant::now(), per_attempt), || {
            target.is_complete()
        })? {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finding_16_duration_max_means_no_deadline() {
        let now = Instant::now();
        assert_eq!(deadline_after(now, Duration::MAX), None);
        assert_eq!(
            deadline_after(now, Duration::from_millis(5)),
            Some(now + Duration::from_millis(5))
        );
        // With no deadline, polling ends when the work does (not by overflowing).
        let mut calls = 0;
        let done = poll_until(None, || {
            calls += 1;
            Ok(calls == 3)
        })
        .unwrap();
        assert!(done && calls == 3);
        // A passed deadline gives up after one query.
        let mut calls = 0;
        let done = poll_until(Some(now), || {
            calls += 1;
            Ok(false)
        })
        .unwrap();
        assert!(!done && calls == 1);
    }
}
