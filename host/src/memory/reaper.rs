//! Frees that may block run off the caller's thread.
//!
//! `cuMemFreeHost` and `cuMemFree` synchronise with the device: they block while any stream is
//! blocked on a stream memory wait (`cuStreamWaitValue*`). A thread that holds an open
//! [`crate::Fence`] guard (or any unreleased on-stream wait) and drops a [`crate::PinnedBuffer`]
//! would block forever on its own wait. So every such free is handed to one background thread:
//! `Drop` returns at once, and the free runs as soon as the device lets it.

use std::sync::mpsc::{channel, Sender};
use std::sync::{Mutex, OnceLock};

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
/// the memory back). Do not call while holding an unreleased on-stream wait.
pub fn flush() {
    let (tx, rx) = channel::<()>();
    defer(move || {
        let _ = tx.send(());
    });
    let _ = rx.recv();
}
