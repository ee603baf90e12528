//! Which on-stream waits are pending on which stream, for [`super::synchronize_timeout`].
//!
//! One queue per stream, keyed by the stream handle and holding only a weak reference to the
//! stream, so the registry keeps no stream alive. Waits on one stream complete in stream order,
//! so completed entries are popped from the front of their queue: a registration costs amortised
//! O(1) event queries under the lock, whatever the number of open waits. Queues of dropped
//! streams (and empty ones) are swept whenever the number of queues doubles, which is amortised
//! O(1) too. An entry whose event query fails is treated as done (the error surfaces from the
//! stream itself).
//!
//! The reaper's gate (`reaper::any_wait_pending`) does not use these queues: a queue is swept
//! when its stream handle is dropped (or its handle reused), while the wait on it may still be
//! pending (a dropped `Stream` keeps running its work). Every registered wait is therefore also
//! handed to the reaper (`reaper::register_pending`), which keeps it in one process-wide list
//! until its own `done` event has completed, whatever becomes of the stream handle (issue 19,
//! item 8). That list lives in the reaper, the lower layer that asks it, so that the reaper
//! imports nothing of `ordering` (issue 22, item 11).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use cudarc::driver::CudaStream;

use super::types::{PendingOp, Release};
use crate::error::Result;
use crate::stream::{Event, Stream};

struct Entry {
    what: String,
    release: Option<Release>,
    done: Arc<Event>,
}

struct Queue {
    stream: Weak<CudaStream>,
    entries: VecDeque<Entry>,
}

impl Queue {
    fn belongs_to(&self, stream: &Stream) -> bool {
        self.stream
            .upgrade()
            .is_some_and(|s| Arc::ptr_eq(&s, stream.cudarc()))
    }

    fn prune(&mut self) {
        while let Some(e) = self.entries.front() {
            if matches!(e.done.is_complete(), Ok(false)) {
                break;
            }
            self.entries.pop_front();
        }
    }
}

#[derive(Default)]
struct Registry {
    queues: HashMap<usize, Queue>,
    sweep_at: usize,
}

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Mutex::default);

fn key(stream: &Stream) -> usize {
    stream.raw() as usize
}

/// Registers an on-stream wait the caller has enqueued on `stream`, so that
/// [`super::synchronize_timeout`] on that stream can report it (as `"{what} never fired"`) while
/// `done` (an event recorded on `stream` right after the wait) has not completed.
///
/// `release`: how [`super::OnTimeout::Release`] may satisfy the wait (write `release.cmp`'s
/// satisfying value to `release.signal`), or `None` for a wait the watchdog must never release
/// because its memory is shared with other waiters (a fence's flag, whose early write would let
/// other epochs through). Usable for any wait the caller enqueued itself on raw memory.
pub(crate) fn register_stream_wait(
    stream: &Stream,
    what: String,
    release: Option<Release>,
    done: Arc<Event>,
) {
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let queue = reg.queues.entry(key(stream)).or_insert_with(|| Queue {
        stream: Arc::downgrade(stream.cudarc()),
        entries: VecDeque::new(),
    });
    if !queue.belongs_to(stream) {
        // The handle was reused by a new stream: the old queue's stream is gone.
        *queue = Queue {
            stream: Arc::downgrade(stream.cudarc()),
            entries: VecDeque::new(),
        };
    }
    queue.prune();
    queue.entries.push_back(Entry {
        what,
        release,
        done: done.clone(),
    });
    // Every registered wait is also kept for the reaper's gate until it completed.
    crate::reaper::register_pending(done);
    if reg.queues.len() >= reg.sweep_at {
        reg.queues.retain(|_, q| {
            if q.stream.strong_count() == 0 {
                return false;
            }
            q.prune();
            !q.entries.is_empty()
        });
        reg.sweep_at = (2 * reg.queues.len()).max(16);
    }
}

/// The registered waits on `stream` that have not completed, in enqueue order.
pub(crate) fn pending_on(stream: &Stream) -> Result<Vec<PendingOp>> {
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    let mut out = Vec::new();
    if let Some(q) = reg.queues.get_mut(&key(stream)) {
        if q.belongs_to(stream) {
            q.prune();
            for e in &q.entries {
                if !e.done.is_complete()? {
                    out.push(PendingOp {
                        what: format!("{} never fired", e.what),
                        release: e.release.clone(),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// Number of streams with a queue and entries in all queues (tests).
#[cfg(test)]
pub(crate) fn sizes() -> (usize, usize) {
    let reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    (
        reg.queues.len(),
        reg.queues.values().map(|q| q.entries.len()).sum(),
    )
}

/// Registers a wait only for the reaper's gate (not for the watchdog): `done` is an event
/// recorded right after the wait on its stream. For waits whose runs report themselves
/// ([`crate::ordering::GraphRun`] for a task graph's waits).
pub(crate) fn register_gate_wait(done: Arc<Event>) {
    crate::reaper::register_pending(done);
}
