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
//! The reaper's gate ([`any_wait_pending`]) does not use these queues: a queue is swept when its
//! stream handle is dropped (or its handle reused), while the wait on it may still be pending
//! (a dropped `Stream` keeps running its work). Every registered wait is therefore also kept in
//! one process-wide list, [`PendingWaits`], until its own `done` event has completed, whatever
//! becomes of the stream handle (issue 19, item 8).

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

/// Something that completes once: a wait's `done` event.
pub(crate) trait Completion {
    /// True once completed (or no longer queryable: a poisoned context runs no more work).
    fn finished(&self) -> bool;
}

impl Completion for Arc<Event> {
    fn finished(&self) -> bool {
        !matches!(self.is_complete(), Ok(false))
    }
}

/// The waits the reaper's gate must respect: every registered wait until its own completion,
/// independent of any stream handle. Completed entries are dropped from the end as
/// [`Self::any_pending`] looks, and all of them whenever the list doubles (amortised O(1)).
#[derive(Debug)]
pub(crate) struct PendingWaits<D> {
    waits: Vec<D>,
    sweep_at: usize,
}

impl<D> Default for PendingWaits<D> {
    fn default() -> Self {
        Self {
            waits: Vec::new(),
            sweep_at: 16,
        }
    }
}

impl<D: Completion> PendingWaits<D> {
    /// Keeps `done` until it has completed.
    pub(crate) fn push(&mut self, done: D) {
        if self.waits.len() >= self.sweep_at {
            self.waits.retain(|d| !d.finished());
            self.sweep_at = (2 * self.waits.len()).max(16);
        }
        self.waits.push(done);
    }

    /// True while some kept wait has not completed.
    pub(crate) fn any_pending(&mut self) -> bool {
        while let Some(last) = self.waits.last() {
            if !last.finished() {
                return true;
            }
            self.waits.pop();
        }
        false
    }

    /// Entries kept (completed ones not yet dropped included).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.waits.len()
    }
}

#[derive(Default)]
struct Registry {
    queues: HashMap<usize, Queue>,
    sweep_at: usize,
    /// Every registered wait until it completed, for the reaper's gate.
    gate: PendingWaits<Arc<Event>>,
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
    reg.gate.push(done);
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
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    reg.gate.push(done);
}

/// True while some registered wait has not completed (its `done` event), whether or not a
/// handle of its stream is still alive.
pub(crate) fn any_wait_pending() -> bool {
    let mut reg = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    reg.gate.any_pending()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::reaper::GateState;

    /// A `done` event as a flag "the GPU" sets.
    struct Flag(loom::sync::Arc<loom::sync::atomic::AtomicBool>);
    impl Completion for Flag {
        fn finished(&self) -> bool {
            self.0.load(loom::sync::atomic::Ordering::SeqCst)
        }
    }

    /// Plain (non-loom) flags for the CPU test.
    struct Plain(std::rc::Rc<std::cell::Cell<bool>>);
    impl Completion for Plain {
        fn finished(&self) -> bool {
            self.0.get()
        }
    }

    #[test]
    fn issue19_item08_pending_waits_are_kept_until_their_own_completion() {
        let mut w = PendingWaits::default();
        let flags: Vec<_> = (0..100)
            .map(|_| std::rc::Rc::new(std::cell::Cell::new(false)))
            .collect();
        for f in &flags {
            w.push(Plain(f.clone()));
        }
        assert!(w.any_pending());
        // The newest completes first (another stream): the older ones still hold the gate.
        flags[99].set(true);
        assert!(w.any_pending());
        for f in &flags[1..] {
            f.set(true);
        }
        assert!(w.any_pending(), "wait 0 is still pending");
        flags[0].set(true);
        assert!(!w.any_pending());
        assert_eq!(w.len(), 0);
        // Completed entries are swept as new ones come: the list stays bounded.
        for _ in 0..1000 {
            w.push(Plain(std::rc::Rc::new(std::cell::Cell::new(true))));
        }
        assert!(w.len() <= 32, "{} entries kept", w.len());
    }

    /// loom explores every interleaving of the reaper/registry handshake: a thread enters the
    /// gate, enqueues an on-stream wait, registers it and leaves, drops its stream handle (which
    /// must not unregister anything), and "the GPU" later releases the wait and completes its
    /// marker; the reaper closes the gate only when no wait is entering or pending. The blocking
    /// free must never run while the wait is enqueued and unreleased.
    #[test]
    fn issue19_item08_loom_reaper_never_frees_behind_a_registered_wait() {
        use loom::sync::atomic::{AtomicBool, Ordering::SeqCst};
        use loom::sync::{Arc, Mutex};
        loom::model(|| {
            let gate = Arc::new(Mutex::new(GateState::default()));
            let reg = Arc::new(Mutex::new(PendingWaits::<Flag>::default()));
            // The wait is on the stream and not released.
            let blocking = Arc::new(AtomicBool::new(false));
            // The marker recorded after the wait has completed.
            let done = Arc::new(AtomicBool::new(false));
            let waiter = {
                let (gate, reg, blocking, done) =
                    (gate.clone(), reg.clone(), blocking.clone(), done.clone());
                loom::thread::spawn(move || {
                    loop {
                        let mut g = gate.lock().unwrap();
                        if g.may_enter() {
                            g.enter();
                            break;
                        }
                        drop(g);
                        loom::thread::yield_now();
                    }
                    blocking.store(true, SeqCst);
                    reg.lock().unwrap().push(Flag(done.clone()));
                    gate.lock().unwrap().leave();
                    // The stream handle is dropped here: nothing happens to the registration.
                    // The GPU: the host releases the wait, the stream moves past it.
                    blocking.store(false, SeqCst);
                    done.store(true, SeqCst);
                })
            };
            let reaper = {
                let (gate, reg, blocking) = (gate.clone(), reg.clone(), blocking.clone());
                loom::thread::spawn(move || {
                    loop {
                        let closed = gate
                            .lock()
                            .unwrap()
                            .try_close(|| reg.lock().unwrap().any_pending());
                        if closed {
                            break;
                        }
                        loom::thread::yield_now();
                    }
                    assert!(
                        !blocking.load(SeqCst),
                        "a blocking free ran behind a pending on-stream wait"
                    );
                    gate.lock().unwrap().open();
                })
            };
            waiter.join().unwrap();
            reaper.join().unwrap();
        });
    }
}
