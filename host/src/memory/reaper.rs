//! Frees that may block run off the caller's thread.
//!
//! `cuMemFreeHost` and `cuMemFree` synchronise with the device: they block while any stream is
//! blocked on a stream memory wait (`cuStreamWaitValue*`). A thread that holds an open
//! [`crate::Fence`] guard (or any unreleased on-stream wait) and drops a [`crate::PinnedBuffer`]
//! would block forever on its own wait. So every such free is handed to one background thread:
//! `Drop` returns at once, and the free runs as soon as the device lets it.
//!
//! Handing the free to another thread is not enough on its own: while `cuMemFreeHost` blocks it
//! holds a lock inside the driver, and every other driver call of the process (event creation,
//! launches, copies) waits for it (measured on the H100: a stress run's fence threads all stopped
//! in the driver behind the reaper's `cuMemFreeHost`, so no ticket was ever submitted). So the
//! reaper runs a free only through a *gate*: when no registered on-stream wait (a fence guard, a
//! `Signal::wait_until`) is pending and none is being enqueued, and it keeps new waits out until
//! the free has returned. Such a free then waits for running GPU work only, which needs no host
//! thread to finish. The price: while some wait stays pending (a ticket held for long, or
//! forgotten), frees are postponed, not lost.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::Duration;

type Job = Box<dyn FnOnce() + Send + 'static>;

static REAPER: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();

fn sender() -> &'static Mutex<Sender<Job>> {
    REAPER.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        // If the thread cannot be spawned, jobs stay queued in the channel (leaked, never run on
        // the caller's thread, so never a hang).
        let _ = std::thread::Builder::new()
            .name("warpline-reaper".into())
            .spawn(move || {
                for job in rx {
                    let _free = Gate::close_for_free();
                    job();
                }
            });
        Mutex::new(tx)
    })
}

/// Runs `free` on the reaper thread. Never blocks on the device; never panics.
pub(crate) fn defer(free: impl FnOnce() + Send + 'static) {
    let tx = sender().lock().unwrap_or_else(|e| e.into_inner());
    // A send error means the reaper thread is gone: the memory leaks rather than risk a hang.
    let _ = tx.send(Box::new(free));
}

/// Blocks until every free handed over before this call has run (tests, and callers that want
/// the memory back). Do not call while holding an unreleased on-stream wait. Inside a task graph
/// host callback it returns at once without waiting (a free behind that callback's stream could
/// never run; issue 19, item 9).
pub fn flush() {
    if crate::device::refuse_in_host_callback("reaper::flush").is_err() {
        return;
    }
    let (tx, rx) = channel::<()>();
    defer(move || {
        let _ = tx.send(());
    });
    let _ = rx.recv();
}

/// The gate between blocking frees and on-stream waits (see the module docs).
#[derive(Default)]
struct GateState {
    /// Threads between [`enter_wait`] and the drop of its [`WaitEntry`].
    entering: usize,
    /// The reaper is running a free.
    freeing: bool,
}

static GATE: Mutex<GateState> = Mutex::new(GateState {
    entering: 0,
    freeing: false,
});
static GATE_CV: Condvar = Condvar::new();

fn gate() -> std::sync::MutexGuard<'static, GateState> {
    GATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Held by a thread while it enqueues and registers an on-stream wait.
pub(crate) struct WaitEntry(());

/// Call before enqueueing an on-stream wait whose release may need a host thread (a fence guard,
/// a signal wait); hold the result until the wait is registered. Blocks only while a free is
/// running, which waits for GPU work alone.
pub(crate) fn enter_wait() -> WaitEntry {
    let mut g = gate();
    while g.freeing {
        g = GATE_CV.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    g.entering += 1;
    WaitEntry(())
}

impl Drop for WaitEntry {
    fn drop(&mut self) {
        gate().entering -= 1;
        GATE_CV.notify_all();
    }
}

struct Gate;

impl Gate {
    /// Waits until no wait is pending or being enqueued, then keeps new ones out until dropped.
    fn close_for_free() -> Gate {
        let mut sleep = Duration::from_micros(100);
        loop {
            {
                let mut g = gate();
                if g.entering == 0 && !crate::ordering::any_wait_pending() {
                    g.freeing = true;
                    return Gate;
                }
            }
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(Duration::from_millis(10));
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        gate().freeing = false;
        GATE_CV.notify_all();
    }
}
