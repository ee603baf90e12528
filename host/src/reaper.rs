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
//!
//! Some jobs must also wait for GPU work first (`defer_after`): a module is unloaded only once
//! every launch from it has completed, a host staging copy is freed only once the copy that reads
//! it has, a signal's word only once every use of it has. The reaper polls their events (`cuEventQuery`, which never blocks) instead of
//! synchronising on them, so it never sleeps in the driver, and a job that needs no gate (freeing
//! host memory warpline allocated itself) runs without closing it: no job blocks on the device
//! while it holds the gate shut.
//!
//! The gate's view of pending waits ([`any_wait_pending`]) is kept here too: `ordering`'s
//! registry hands every registered wait's `done` event over ([`register_pending`]), and the
//! reaper, `Device::load_module` and stream creation ask this module, which imports no layer
//! above the driver (issue 22, item 11). The public entry point is `memory::reaper::flush`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Condvar, Mutex, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use cudarc::driver::CudaEvent;

use crate::driver::callback::refuse_in_host_callback;
use crate::error::{Error, Result};

type Work = Box<dyn FnOnce() + Send + 'static>;

/// How long stream creation (`Device::new_stream`) and graph instantiation
/// ([`without_pending_waits`]) wait for pending on-stream waits to clear before they return
/// [`Error::WaitPending`] (`Device::STREAM_CREATE_WAIT`).
pub(crate) const STREAM_CREATE_WAIT: Duration = Duration::from_secs(2);

/// An event the reaper polls (`cuEventQuery`, which never blocks) before a job runs.
pub(crate) trait Polled: Send + 'static {
    /// True once completed or no longer queryable (a poisoned context runs no more work).
    fn finished(&self) -> bool;
}

impl Polled for CudaEvent {
    fn finished(&self) -> bool {
        !matches!(self.try_is_complete(), Ok(false))
    }
}

/// One job of the reaper thread.
struct Job {
    /// Runs once every one of these has completed (or reports an error: its stream's context is
    /// poisoned, no more work runs there).
    after: Vec<Box<dyn Polled>>,
    /// Run with the gate closed (a free or unload that may synchronise with the device).
    gated: bool,
    /// Runs only after every job handed over before it ([`flush`]).
    barrier: bool,
    work: Work,
}

static REAPER: OnceLock<Mutex<Sender<Job>>> = OnceLock::new();

/// Set at process exit ([`quiesce_at_exit`]): the reaper makes no more driver calls.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Held by the reaper thread for each pass that may call the driver (polling events, running
/// jobs); taken for good by [`quiesce_at_exit`].
static PASS: Mutex<()> = Mutex::new(());

/// How long the exit hook waits for a running pass (a free, an unload, a context's teardown) to
/// return before letting the exit go on.
const EXIT_WAIT: Duration = Duration::from_secs(5);

/// Runs at `exit` (registered with `atexit` when the reaper thread starts, which is after
/// `cuInit`, so it runs before the driver's own exit handlers): stops the reaper between two
/// driver calls, so that it is never inside the driver while the driver (or compute-sanitizer's
/// injected library) tears itself down. Without it, a test binary whose last `Device` was
/// dropped just before `main` returned had the reaper destroying that context's streams while
/// the driver unloaded: processes under compute-sanitizer ended with SIGSEGV after all their
/// work passed (H100, 2026-11-25). Jobs still queued at exit never run; the process is ending
/// and the OS takes the memory back. Never panics, never blocks for more than [`EXIT_WAIT`].
extern "C" fn quiesce_at_exit() {
    EXITING.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + EXIT_WAIT;
    loop {
        match PASS.try_lock() {
            Ok(pass) => return std::mem::forget(pass),
            Err(TryLockError::Poisoned(p)) => return std::mem::forget(p.into_inner()),
            Err(TryLockError::WouldBlock) if Instant::now() >= deadline => return,
            Err(TryLockError::WouldBlock) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

unsafe extern "C" {
    /// C's `atexit` (ISO C 7.22.4.2): registers a function that `exit` calls, last registered
    /// first.
    fn atexit(f: extern "C" fn()) -> core::ffi::c_int;
}

/// Runs `job`, or hands it back when it must wait: a gated job (a free or unload that may
/// synchronise the context) runs with the gate closed and only while no stream capture is open
/// in any thread ([`crate::driver::graph::CapturesExcluded`]); a barrier needs the gate alone.
fn try_run(job: Job) -> Option<Job> {
    if job.gated {
        let free = Gate::close_for_free();
        if job.barrier {
            (job.work)();
            return None;
        }
        let Some(_excluded) = crate::driver::graph::exclude_captures() else {
            drop(free);
            return Some(job);
        };
        (job.work)();
    } else {
        (job.work)();
    }
    None
}

fn sender() -> &'static Mutex<Sender<Job>> {
    REAPER.get_or_init(|| {
        let (tx, rx) = channel::<Job>();
        // SAFETY: `quiesce_at_exit` is a plain `extern "C" fn()` that never unwinds; registering
        // it has no other effect. A failed registration (the C library's table is full) only
        // loses the exit-time quiescing.
        let _ = unsafe { atexit(quiesce_at_exit) };
        // If the thread cannot be spawned, jobs stay queued in the channel (leaked, never run on
        // the caller's thread, so never a hang).
        let _ = std::thread::Builder::new()
            .name("warpline-reaper".into())
            .spawn(move || {
                // Jobs whose events have not completed yet, in arrival order. A barrier job
                // (`flush`) runs only after every earlier job did.
                let mut waiting: std::collections::VecDeque<Job> = Default::default();
                let mut sleep = Duration::from_micros(50);
                loop {
                    let next = if waiting.is_empty() {
                        rx.recv().map_err(|_| RecvTimeoutError::Disconnected)
                    } else {
                        rx.recv_timeout(sleep)
                    };
                    match next {
                        Ok(job) => {
                            waiting.push_back(job);
                            waiting.extend(rx.try_iter());
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) if waiting.is_empty() => return,
                        Err(RecvTimeoutError::Disconnected) => std::thread::sleep(sleep),
                    }
                    // Driver calls follow: none once the process is exiting.
                    let pass = PASS.lock().unwrap_or_else(|e| e.into_inner());
                    if EXITING.load(Ordering::SeqCst) {
                        drop(pass);
                        loop {
                            std::thread::park();
                        }
                    }
                    let mut progressed = false;
                    // Run every job whose events completed; a barrier waits for those queued
                    // before it.
                    let mut blocked = false;
                    let mut i = 0;
                    while i < waiting.len() {
                        let ready = if waiting[i].barrier {
                            !blocked
                        } else {
                            waiting[i].after.retain(|e| !e.finished());
                            waiting[i].after.is_empty()
                        };
                        if ready {
                            if let Some(job) = waiting.remove(i) {
                                match try_run(job) {
                                    None => progressed = true,
                                    Some(job) => {
                                        // A capture is open: retried on a later pass.
                                        waiting.insert(i, job);
                                        blocked = true;
                                        i += 1;
                                    }
                                }
                            }
                        } else {
                            blocked = true;
                            i += 1;
                        }
                    }
                    sleep = if progressed {
                        Duration::from_micros(50)
                    } else {
                        (sleep * 2).min(Duration::from_millis(5))
                    };
                }
            });
        Mutex::new(tx)
    })
}

fn submit(job: Job) {
    let tx = sender().lock().unwrap_or_else(|e| e.into_inner());
    // A send error means the reaper thread is gone: the memory leaks rather than risk a hang.
    let _ = tx.send(job);
}

/// Runs `free` on the reaper thread with the gate closed. Never blocks on the device; never
/// panics.
pub(crate) fn defer(free: impl FnOnce() + Send + 'static) {
    submit(Job {
        after: Vec::new(),
        gated: true,
        barrier: false,
        work: Box::new(free),
    });
}

/// Runs `work` on the reaper thread once every event of `after` has completed (polled, never
/// synchronised on); with `gated`, with the gate closed (for frees and unloads that may
/// synchronise with the device). Never blocks the caller; never panics.
pub(crate) fn defer_after<E: Polled>(
    after: Vec<E>,
    gated: bool,
    work: impl FnOnce() + Send + 'static,
) {
    submit(Job {
        after: after
            .into_iter()
            .map(|e| Box::new(e) as Box<dyn Polled>)
            .collect(),
        gated,
        barrier: false,
        work: Box::new(work),
    });
}

/// Blocks until every job handed over before this call has run (tests, and callers that want
/// the memory back), including jobs that wait for GPU work (`defer_after`). Do not call while
/// holding an unreleased on-stream wait. Inside a task graph host callback it returns at once
/// without waiting (a free behind that callback's stream could never run; issue 19, item 9), and
/// so it does while this thread has a stream capture open (frees wait for every capture of the
/// process to end).
pub fn flush() {
    if refuse_in_host_callback("reaper::flush").is_err() {
        return;
    }
    // Frees wait for every open capture to end; this thread's own could never end meanwhile.
    if crate::driver::graph::thread_is_capturing() {
        return;
    }
    let (tx, rx) = channel::<()>();
    submit(Job {
        after: Vec::new(),
        gated: true,
        barrier: true,
        work: Box::new(move || {
            let _ = tx.send(());
        }),
    });
    let _ = rx.recv();
}

/// The gate between blocking frees and on-stream waits (see the module docs): a pure state
/// machine, so that the handshake can be model-checked (loom, in the tests).
#[derive(Default, Debug)]
pub(crate) struct GateState {
    /// Threads between [`enter_wait`] and the drop of its [`WaitEntry`].
    entering: usize,
    /// The reaper is running a free.
    freeing: bool,
}

impl GateState {
    /// A thread may start enqueueing a wait (no free is running).
    pub(crate) fn may_enter(&self) -> bool {
        !self.freeing
    }
    /// A thread starts enqueueing a wait; call only when [`Self::may_enter`].
    pub(crate) fn enter(&mut self) {
        self.entering += 1;
    }
    /// The wait was registered (or given up).
    pub(crate) fn leave(&mut self) {
        self.entering = self.entering.saturating_sub(1);
    }
    /// Closes the gate for a free when no wait is being enqueued and `wait_pending()` (the
    /// registry) reports none pending; true when closed.
    pub(crate) fn try_close(&mut self, wait_pending: impl FnOnce() -> bool) -> bool {
        if self.entering == 0 && !self.freeing && !wait_pending() {
            self.freeing = true;
            true
        } else {
            false
        }
    }
    /// The free has returned.
    pub(crate) fn open(&mut self) {
        self.freeing = false;
    }
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
/// a signal wait, a task graph's wait); hold the result until the wait is registered. Blocks
/// only while a free is running, which waits for GPU work alone.
pub(crate) fn enter_wait() -> WaitEntry {
    let mut g = gate();
    while !g.may_enter() {
        g = GATE_CV.wait(g).unwrap_or_else(|e| e.into_inner());
    }
    g.enter();
    WaitEntry(())
}

impl Drop for WaitEntry {
    fn drop(&mut self) {
        gate().leave();
        GATE_CV.notify_all();
    }
}

/// The closed gate: no on-stream wait can be enqueued until it drops.
pub(crate) struct Gate;

/// Closes the gate for a module load, which (like a blocking free) may wait for the device to
/// go idle: `None` while a registered wait is pending or being enqueued (the load would hang
/// behind it). Another holder of the gate (a running free or module load: it waits for GPU work
/// alone, and no wait can be registered while it holds the gate) is waited out, however long it
/// takes. Found by `warpline fuzz` on the H100 (issue 19): a load in one thread raced a fence
/// guard enqueued by another after the load's check, and the process hung. Until session 12
/// the wait for another holder gave up after a second, so two threads loading modules at once
/// (a PTX JIT takes seconds) failed with a spurious `WaitPending` (the attention tests on two
/// threads, H200).
pub(crate) fn close_for_load() -> Option<Gate> {
    let mut sleep = Duration::from_micros(100);
    loop {
        {
            let mut g = gate();
            if g.entering > 0 || any_wait_pending() {
                return None;
            }
            if g.try_close(|| false) {
                return Some(Gate);
            }
        }
        std::thread::sleep(sleep);
        sleep = (sleep * 2).min(Duration::from_millis(5));
    }
}

/// Closes the gate for a stream creation: `cuStreamCreate` can wait for the device while it holds
/// a driver lock (stacks of hung `warpline fuzz` runs on the H100 showed it deep in the driver,
/// with every other thread waiting on that lock, while a signal wait whose release needed one of
/// them was pending; yaksa reports the same behind a running wait kernel). Waits up to `bound`
/// for registered waits to clear (other threads' releases go on meanwhile: this thread holds no
/// driver lock), then [`Error::WaitPending`].
pub(crate) fn close_for_create(what: &'static str, bound: Duration) -> Result<Gate> {
    let deadline = Instant::now() + bound;
    let mut sleep = Duration::from_micros(50);
    loop {
        {
            let mut g = gate();
            if g.entering == 0 && g.try_close(any_wait_pending) {
                return Ok(Gate);
            }
        }
        if Instant::now() >= deadline {
            return Err(Error::WaitPending { what });
        }
        std::thread::sleep(sleep);
        sleep = (sleep * 2).min(Duration::from_millis(5));
    }
}

/// Runs `f` (a driver call that may wait for the device while holding a driver lock: graph
/// instantiation) with the gate closed as for a stream creation ([`close_for_create`], bounded
/// by [`STREAM_CREATE_WAIT`]). Errors: [`Error::WaitPending`], or `f`'s.
pub(crate) fn without_pending_waits<T>(
    what: &'static str,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let _gate = close_for_create(what, STREAM_CREATE_WAIT)?;
    f()
}

impl Gate {
    /// Waits until no wait is pending or being enqueued, then keeps new ones out until dropped.
    fn close_for_free() -> Gate {
        let mut sleep = Duration::from_micros(100);
        loop {
            if gate().try_close(any_wait_pending) {
                return Gate;
            }
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(Duration::from_millis(10));
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        gate().open();
        GATE_CV.notify_all();
    }
}

impl<P: Polled + Sync> Polled for std::sync::Arc<P> {
    fn finished(&self) -> bool {
        (**self).finished()
    }
}

/// Something that completes once: a registered wait's `done` event.
pub(crate) trait Completion {
    /// True once completed (or no longer queryable: a poisoned context runs no more work).
    fn finished(&self) -> bool;
}

impl Completion for Box<dyn Polled> {
    fn finished(&self) -> bool {
        (**self).finished()
    }
}

/// The waits the reaper's gate must respect: every registered wait until its own completion,
/// independent of any stream handle (issue 19, item 8). Completed entries are dropped from the
/// end as [`Self::any_pending`] looks, and all of them whenever the list doubles (amortised O(1)).
#[derive(Debug)]
pub(crate) struct PendingWaits<D> {
    waits: Vec<D>,
    sweep_at: usize,
}

impl<D> PendingWaits<D> {
    const fn new() -> Self {
        Self {
            waits: Vec::new(),
            sweep_at: 16,
        }
    }
}

impl<D> Default for PendingWaits<D> {
    fn default() -> Self {
        Self::new()
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

/// Every registered wait until it completed, for the gate.
static PENDING: Mutex<PendingWaits<Box<dyn Polled>>> = Mutex::new(PendingWaits::new());

/// Keeps a registered on-stream wait for the gate until `done` (an event recorded on the wait's
/// stream right after it) has completed, whatever becomes of the stream handle. Called by
/// `ordering`'s registry for every wait it registers.
pub(crate) fn register_pending(done: impl Polled) {
    let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    p.push(Box::new(done));
}

/// True while some registered wait ([`register_pending`]) has not completed, whether or not a
/// handle of its stream is still alive.
pub(crate) fn any_wait_pending() -> bool {
    let mut p = PENDING.lock().unwrap_or_else(|e| e.into_inner());
    p.any_pending()
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn session12_a_module_load_waits_out_another_holder_of_the_gate_however_long() {
        // Another load (or free) holds the gate for longer than the old one-second bound.
        assert!(gate().try_close(|| false));
        let loader = std::thread::spawn(|| close_for_load().is_some());
        std::thread::sleep(Duration::from_millis(1500));
        assert!(
            !loader.is_finished(),
            "the load must wait while the gate is held"
        );
        gate().open();
        GATE_CV.notify_all();
        assert!(
            loader.join().unwrap(),
            "the load gets the gate once it is free"
        );
        // close_for_load's gate dropped with the thread's result.
        assert!(gate().try_close(|| false));
        gate().open();
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
