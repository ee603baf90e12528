//! `Fence`: "everything the caller enqueues later on its stream waits for internal work that may
//! be submitted *after* that" (the stream-wait-value fence seed). CUDA events cannot express it: a
//! `cuStreamWaitEvent` on an event that is recorded later waits for nothing. A stream memory
//! operation can: the caller's stream gets `cuStreamWaitValue64(slot >= generation)` now, and the
//! internal stream writes `generation` (`cuStreamWriteValue64`) after the internal work whenever
//! that is submitted.
//!
//! # Why the internal stream lives in a context of its own
//!
//! Such a wait is enqueued *before* its producer. CUDA may funnel the streams of one context into
//! fewer hardware queues than there are streams (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 by default, 1
//! in Megatron-style stacks; more live streams than queues; MPS; WDDM), and a hardware queue is a
//! FIFO: once the caller's wait and the internal work share one, the internal work sits behind
//! the wait it must satisfy, and nothing ever runs again (measured on the H100 with one
//! connection: the wait never fires; `../shared/docs/fence-one-queue.md`). No protocol inside one
//! context can avoid that, because the caller's later work is ahead of the internal work in the
//! only FIFO. So a `Fence` opens warpline's module in a fresh, private, non-primary context
//! ([`Device::open_in_new_context_with_ptx`]) and runs the internal stream there: a context has
//! channels of its own, whatever the connection count, and nothing else uses this one. The
//! slots live in mapped, portable pinned host memory, which both contexts see at the same address.
//! The price: kernels of two contexts time-slice instead of running concurrently.
//!
//! # Slots and generations
//!
//! Each [`Fence::guard`] takes a slot (one u64 word) and the slot's next generation; the caller
//! waits for `slot >= generation`. Tickets are independent: a ticket that is never released
//! (`std::mem::forget`) holds only its own caller, and leaks only its slot. A slot is reused only
//! after its previous release has been *observed* in memory, so a slot's value only grows and a
//! new waiter is never satisfied by an old write. Releases are stream writes after the internal
//! work; if enqueueing the write fails, a helper thread waits for the internal stream to drain
//! and then stores the generation from the host, so the caller is released after the work either
//! way. [`crate::synchronize_timeout`] with [`crate::OnTimeout::Release`] releases a stuck fence
//! waiter by storing its own slot's generation: it releases that one wait and nothing else.
//!
//! The lazy-loading hang of the seed (the first launch of an unloaded kernel needs the device
//! idle, which a pending wait prevents) cannot occur either: both the caller's module and the
//! private context's are loaded eagerly, and [`Fence::new`] refuses a [`Device`] whose kernels
//! are not all loaded ([`Error::ModuleNotFullyLoaded`]).

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cudarc::driver::CudaContext;

use super::registry;
use super::types::{Cmp, Releasable, Release};
use crate::device::Device;
use crate::driver::hostmem;
use crate::error::{Error, Result};
use crate::stream::{Event, Stream};

/// Slots a fence has unless [`Fence::with_capacity`] says otherwise (8 bytes each).
pub const DEFAULT_SLOTS: usize = 4096;

/// The slot bookkeeping, pure CPU (checked with loom in the tests).
///
/// Slot `s` was last handed out with generation `gens[s]`. A slot is in `free` once its last
/// release was observed in memory (value `>= gens[s]`), in `releasing` once that release has been
/// enqueued or stored, and in neither while a ticket holds it (or after the ticket was forgotten).
#[derive(Debug)]
pub(crate) struct SlotTable {
    gens: Vec<u64>,
    free: Vec<usize>,
    releasing: Vec<usize>,
    capacity: usize,
}

impl SlotTable {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            gens: Vec::new(),
            free: Vec::new(),
            releasing: Vec::new(),
            capacity,
        }
    }

    /// A slot and its next generation, or `None` when every slot is held or still releasing.
    /// `observed(s)` reads slot `s`'s current value from memory.
    pub(crate) fn take(&mut self, observed: impl Fn(usize) -> u64) -> Option<(usize, u64)> {
        if self.free.is_empty() {
            let gens = &self.gens;
            let free = &mut self.free;
            self.releasing.retain(|&s| {
                let done = observed(s) >= gens[s];
                if done {
                    free.push(s);
                }
                !done
            });
        }
        let slot = match self.free.pop() {
            Some(s) => s,
            None if self.gens.len() < self.capacity => {
                self.gens.push(0);
                self.gens.len() - 1
            }
            None => return None,
        };
        self.gens[slot] += 1;
        Some((slot, self.gens[slot]))
    }

    /// The ticket holding `slot` has enqueued (or stored) its release.
    pub(crate) fn released(&mut self, slot: usize) {
        self.releasing.push(slot);
    }

    /// Slots currently held by tickets (including forgotten ones).
    pub(crate) fn held(&self) -> usize {
        self.gens.len() - self.free.len() - self.releasing.len()
    }
}

/// Mapped pinned host memory holding the slots; freed with its context.
struct SlotArena {
    base: *mut u64,
    len: usize,
}

// SAFETY: the arena is a plain array of u64 words accessed only through atomics (host) and stream
// memory operations (device); the pointer is valid for the arena's lifetime.
unsafe impl Send for SlotArena {}
// SAFETY: as above; shared access is through `AtomicU64` only.
unsafe impl Sync for SlotArena {}

impl SlotArena {
    fn word(&self, slot: usize) -> &AtomicU64 {
        assert!(slot < self.len, "slot index out of range");
        // SAFETY: `slot < len` words were allocated, 8-byte aligned (page-aligned allocation), and
        // live as long as `self`; every host access is atomic.
        unsafe { AtomicU64::from_ptr(self.base.add(slot)) }
    }

    fn addr(&self, slot: usize) -> u64 {
        assert!(slot < self.len, "slot index out of range");
        // With unified addressing (checked in `new`), the device address is the host address.
        self.base as u64 + 8 * slot as u64
    }
}

struct Core {
    /// The private context with warpline's module, and its one stream.
    internal: ManuallyDrop<Stream>,
    internal_dev: ManuallyDrop<Device>,
    arena: SlotArena,
    table: Mutex<SlotTable>,
    /// Events recorded after each caller wait that had not completed at the last look: the
    /// arena must outlive every wait that reads it.
    waits: Mutex<Vec<Arc<Event>>>,
}

impl Core {
    fn table(&self) -> std::sync::MutexGuard<'_, SlotTable> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn store_from_host(&self, slot: usize, generation: u64) {
        self.arena
            .word(slot)
            .fetch_max(generation, Ordering::AcqRel);
    }

    /// Releases `slot` after the internal work: a stream write, or, if that cannot be enqueued,
    /// a host store once the internal stream has drained (on a helper thread, so that the caller
    /// never blocks). Returns the enqueue error, if any.
    fn release(self: &Arc<Self>, slot: usize, generation: u64) -> Result<()> {
        // SAFETY: the internal stream is live; the slot word lives as long as `self`, which the
        // caller's pending wait keeps alive through `waits` (see `Drop for Core`).
        let r = unsafe {
            hostmem::stream_write_value64(self.internal.raw(), self.arena.addr(slot), generation)
        };
        if r.is_err() {
            let core = self.clone();
            let spawned = std::thread::Builder::new()
                .name("warpline-fence-release".into())
                .spawn(move || {
                    // Whatever the outcome (drained, or the context failed), release the caller.
                    let _ = core.internal.synchronize();
                    core.store_from_host(slot, generation);
                });
            if spawned.is_err() {
                // No thread: store now rather than risk a hang (the work may still be running).
                self.store_from_host(slot, generation);
            }
        }
        self.table().released(slot);
        r
    }
}

impl Drop for Core {
    fn drop(&mut self) {
        // The arena is freed with the private context; caller streams may still have waits queued
        // that read it. Hand the context to the reaper, which frees it once every recorded wait
        // has completed (or leaks it if one never does, rather than free memory a queue reads).
        let waits = std::mem::take(&mut *self.waits.lock().unwrap_or_else(|e| e.into_inner()));
        // SAFETY: taken once, here; `self` is not used after `drop`.
        let (dev, stream) = unsafe {
            (
                ManuallyDrop::take(&mut self.internal_dev),
                ManuallyDrop::take(&mut self.internal),
            )
        };
        let base = self.arena.base as usize;
        crate::reaper::defer(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let all_done = waits.iter().all(|w| loop {
                match w.is_complete() {
                    Ok(true) | Err(_) => break true,
                    Ok(false) if Instant::now() >= deadline => break false,
                    Ok(false) => std::thread::sleep(Duration::from_millis(1)),
                }
            });
            if all_done {
                let _ = stream.synchronize();
                // SAFETY: allocated by `mem_host_alloc_mapped` in `Fence::with_capacity`, freed
                // once, and no queued wait reads it any more (all recorded waits completed).
                let _ = unsafe { hostmem::mem_free_host(base as *mut c_void) };
                drop(stream);
                drop(dev);
            } else {
                std::mem::forget(stream);
                std::mem::forget(dev);
            }
        });
    }
}

/// An asynchronous fence between an internal stream and callers' streams, live in every
/// hardware-queue configuration.
///
/// ```text
/// let ticket = fence.guard(&user_stream)?;   // user_stream: [wait slot >= g]  (returns at once)
/// launch(&dev, &user_stream, ...);           // runs only after the internal work below
/// // later, maybe on another thread:
/// ticket.submit(|idev, internal| { launch(idev, internal, ...) })?; // internal: [work, write g]
/// ```
///
/// The internal work runs in the fence's private context: launch it with the [`Device`] handed to
/// the closure (warpline's module, loaded in that context) on the stream handed to it. Memory it
/// shares with the caller must be visible from both contexts (stream-ordered pool allocations and
/// mapped host memory are; see `docs/safety.md`).
#[derive(Clone)]
pub struct Fence {
    core: Arc<Core>,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("slots", &self.core.arena.len)
            .field("held", &self.core.table().held())
            .finish()
    }
}

impl Fence {
    /// A fence with `DEFAULT_SLOTS` (4096) slots; see [`Fence::with_capacity`].
    pub fn new(dev: &Device) -> Result<Self> {
        Self::with_capacity(dev, DEFAULT_SLOTS)
    }

    /// A fence whose internal stream lives in a new private context on `dev`'s GPU, with `slots`
    /// tickets open at most (8 bytes of pinned host memory each). Opening the context and loading
    /// the module takes tens to hundreds of milliseconds: make fences once, not per use.
    ///
    /// Errors: [`Error::ModuleNotFullyLoaded`] unless every kernel of `dev`'s module is loaded
    /// (`cuFuncIsLoaded`); [`Error::Empty`] for `slots == 0`; [`Error::TooLarge`] above 2^20
    /// slots; [`Error::StreamMemOps64Unsupported`]; [`Error::Cuda`].
    pub fn with_capacity(dev: &Device, slots: usize) -> Result<Self> {
        if !dev.all_kernels_loaded()? {
            return Err(Error::ModuleNotFullyLoaded { what: "Fence::new" });
        }
        if !dev.capabilities().stream_mem_ops_64 {
            return Err(Error::StreamMemOps64Unsupported { what: "Fence::new" });
        }
        if slots == 0 {
            return Err(Error::Empty {
                what: "Fence slots",
            });
        }
        const MAX_SLOTS: usize = 1 << 20;
        if slots > MAX_SLOTS {
            return Err(Error::TooLarge {
                what: "Fence slots",
                value: slots as u64,
                max: MAX_SLOTS as u64,
            });
        }
        let internal_dev = dev.reopen(dev.ordinal(), true)?;
        let internal = internal_dev.new_stream()?;
        internal_dev.bind()?;
        let bytes = slots * 8;
        let base = hostmem::mem_host_alloc_mapped(bytes)? as *mut u64;
        let arena = SlotArena { base, len: slots };
        let dptr = hostmem::mem_host_get_device_pointer(base as *mut c_void);
        if dptr.as_ref().ok() != Some(&(base as u64)) {
            // SAFETY: just allocated, never used by any stream.
            let _ = unsafe { hostmem::mem_free_host(base as *mut c_void) };
            dptr?;
            return Err(Error::BadShape {
                what: "Fence::new",
                detail: "mapped host memory has a different device address (no unified addressing); fences need unified addressing (64-bit Linux, compute capability 9.0)".into(),
            });
        }
        // SAFETY: `bytes` writable bytes at `base`; no GPU work uses them yet.
        unsafe { std::ptr::write_bytes(base as *mut u8, 0, bytes) };
        Ok(Self {
            core: Arc::new(Core {
                internal: ManuallyDrop::new(internal),
                internal_dev: ManuallyDrop::new(internal_dev),
                arena,
                table: Mutex::new(SlotTable::new(slots)),
                waits: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Makes everything enqueued on `caller` after this call wait until the returned ticket is
    /// released (`cuStreamWaitValue64`, GEQ, on the ticket's own slot). Returns at once.
    /// Dropping the ticket releases it with no work; a forgotten ticket holds only its caller.
    ///
    /// Errors: [`Error::FenceWaitsOnItself`] if `caller` belongs to the fence's own context (the
    /// stream handed to [`FenceTicket::submit`]: it would wait for itself);
    /// [`Error::TooManyOpenTickets`] when every slot is held; [`Error::Cuda`].
    pub fn guard(&self, caller: &Stream) -> Result<FenceTicket> {
        // Before the wait gate, which may block (issue 19, item 9).
        crate::device::refuse_in_host_callback("Fence::guard")?;
        let core = &self.core;
        if caller.context_raw() == core.internal_dev.raw_context() {
            return Err(Error::FenceWaitsOnItself);
        }
        // Keeps the reaper's blocking frees out until this wait is registered (memory::reaper).
        let _entry = crate::reaper::enter_wait();
        let taken = core
            .table()
            .take(|s| core.arena.word(s).load(Ordering::Acquire));
        let Some((slot, generation)) = taken else {
            return Err(Error::TooManyOpenTickets {
                slots: core.arena.len,
            });
        };
        // SAFETY: `caller` is live; the slot word outlives the wait (`Drop for Core`).
        let waited = unsafe {
            hostmem::stream_wait_value64_geq(caller.raw(), core.arena.addr(slot), generation)
        };
        if let Err(e) = waited {
            // Nothing waits on this generation: release it at once.
            core.store_from_host(slot, generation);
            core.table().released(slot);
            return Err(e);
        }
        let marker = caller.record_marker();
        let ticket = FenceTicket {
            core: core.clone(),
            slot,
            generation,
            open: true,
        };
        let marker = Arc::new(marker?);
        {
            let mut waits = core.waits.lock().unwrap_or_else(|e| e.into_inner());
            waits.retain(|w| !matches!(w.is_complete(), Ok(true)));
            waits.push(marker.clone());
        }
        // The watchdog may release this one wait (and nothing else) by storing its generation.
        let release = Release {
            signal: Arc::new(SlotRelease {
                core: core.clone(),
                slot,
            }),
            cmp: Cmp::Geq,
            value: generation,
        };
        let what = format!("fence wait (slot {slot}, generation {generation}: its ticket was neither submitted nor dropped)");
        registry::register_stream_wait(caller, what, Some(release), marker);
        Ok(ticket)
    }

    /// Tickets currently open (taken and neither submitted nor dropped), forgotten ones included.
    pub fn open_tickets(&self) -> usize {
        self.core.table().held()
    }
}

/// One fence slot as the watchdog sees it: released by a host store of the waiter's own
/// generation, which lets through that wait alone (finding 7: the old shared flag released every
/// lower epoch too).
struct SlotRelease {
    core: Arc<Core>,
    slot: usize,
}

impl Releasable for SlotRelease {
    fn write_on(&self, _stream: &Stream, value: u64) -> Result<()> {
        self.core.store_from_host(self.slot, value);
        Ok(())
    }
    fn context(&self) -> &Arc<CudaContext> {
        self.core.internal_dev.context()
    }
    fn store_from_host(&self, value: u64) -> bool {
        self.core.store_from_host(self.slot, value);
        true
    }
}

/// The obligation to release one [`Fence::guard`]. `Send`: hand it to the thread that submits
/// the internal work. Dropping it releases the caller with no work.
pub struct FenceTicket {
    core: Arc<Core>,
    slot: usize,
    generation: u64,
    open: bool,
}

impl std::fmt::Debug for FenceTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FenceTicket")
            .field("slot", &self.slot)
            .field("generation", &self.generation)
            .finish()
    }
}

impl FenceTicket {
    /// Enqueues `work` on the internal stream (in the fence's private context: launch with the
    /// `&Device` it is given), then releases the ticket: the slot is written after the work
    /// (stream order, with a system-wide memory barrier), so the guarded caller work sees its
    /// results. The ticket is released even if `work` fails or panics (the caller's stream must
    /// not hang); the error is returned. Errors: `work`'s, [`Error::Cuda`].
    pub fn submit(mut self, work: impl FnOnce(&Device, &Stream) -> Result<()>) -> Result<()> {
        let r = work(&self.core.internal_dev, &self.core.internal);
        let rel = self.release_now();
        r.and(rel)
    }

    fn release_now(&mut self) -> Result<()> {
        if !std::mem::take(&mut self.open) {
            return Ok(());
        }
        self.core.release(self.slot, self.generation)
    }
}

impl Drop for FenceTicket {
    fn drop(&mut self) {
        // A failed enqueue is already handled inside `release` (host store after the drain);
        // the error itself cannot be reported from drop.
        let _ = self.release_now();
    }
}

#[cfg(test)]
mod tests {
    use super::SlotTable;

    /// Simulated slot memory: writes land when "the GPU" gets to them.
    fn run_random_schedule(seed: u64) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let cap = 8;
        let mut t = SlotTable::new(cap);
        let mut mem = vec![0u64; cap];
        let mut held: Vec<(usize, u64)> = Vec::new();
        let mut pending_writes: Vec<(usize, u64)> = Vec::new();
        for _ in 0..500 {
            match rng.random_range(0..4) {
                0 => {
                    if let Some((s, g)) = t.take(|s| mem[s]) {
                        assert!(mem[s] < g, "a new waiter must not be satisfied already");
                        assert!(
                            pending_writes.iter().all(|&(ps, _)| ps != s),
                            "a slot with a write in flight must not be reused"
                        );
                        assert!(held.iter().all(|&(hs, _)| hs != s), "slot held twice");
                        held.push((s, g));
                    } else {
                        assert_eq!(held.len() + pending_writes.len(), cap);
                    }
                }
                1 if !held.is_empty() => {
                    let (s, g) = held.swap_remove(rng.random_range(0..held.len()));
                    pending_writes.push((s, g));
                    t.released(s);
                }
                2 if !pending_writes.is_empty() => {
                    let (s, g) =
                        pending_writes.swap_remove(rng.random_range(0..pending_writes.len()));
                    assert!(g > mem[s], "slot values only grow");
                    mem[s] = g;
                }
                _ => {}
            }
            assert_eq!(t.held(), held.len());
        }
    }

    #[test]
    fn slots_are_reused_only_after_their_release_is_observed() {
        for seed in 0..200 {
            run_random_schedule(seed);
        }
    }

    #[test]
    fn finding_02_a_forgotten_ticket_holds_only_its_own_slot() {
        let mut t = SlotTable::new(4);
        let mem = [0u64; 4];
        let (forgotten, _) = t.take(|s| mem[s]).unwrap();
        // Later tickets are independent of the forgotten one: each has its own slot, released on
        // its own (the old design advanced one flag over a contiguous prefix and stalled them).
        for _ in 0..3 {
            let (s, g) = t.take(|s| mem[s]).unwrap();
            assert_ne!(s, forgotten);
            assert_eq!(g, 1);
            t.released(s);
        }
        assert_eq!(t.held(), 1);
    }

    #[test]
    fn full_table_reports_none_instead_of_reusing_a_live_slot() {
        let mut t = SlotTable::new(2);
        let mem = [0u64; 2];
        assert!(t.take(|s| mem[s]).is_some());
        let (s, _) = t.take(|s| mem[s]).unwrap();
        assert!(t.take(|s| mem[s]).is_none());
        t.released(s);
        assert!(t.take(|s| mem[s]).is_none(), "release not yet observed");
        let mem = [0u64, 1];
        assert_eq!(t.take(|s| mem[s]), Some((1, 2)));
    }

    /// loom explores every interleaving of two threads taking and releasing slots while "the
    /// GPU" applies the release writes, with the table behind a mutex as in `Fence`.
    #[test]
    fn loom_concurrent_guards_never_share_or_presatisfy_a_slot() {
        use loom::sync::atomic::{AtomicU64, Ordering};
        use loom::sync::{Arc, Mutex};
        loom::model(|| {
            let table = Arc::new(Mutex::new(SlotTable::new(2)));
            let mem: Arc<[AtomicU64; 2]> = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
            let handles: Vec<_> = (0..2)
                .map(|_| {
                    let (table, mem) = (table.clone(), mem.clone());
                    loom::thread::spawn(move || {
                        for _ in 0..2 {
                            let taken = table
                                .lock()
                                .unwrap()
                                .take(|s| mem[s].load(Ordering::Acquire));
                            let Some((s, g)) = taken else { continue };
                            // The waiter is not satisfied by any earlier write.
                            assert!(mem[s].load(Ordering::Acquire) < g);
                            // Release: enqueue (mark), then the GPU write lands.
                            table.lock().unwrap().released(s);
                            let prev = mem[s].fetch_max(g, Ordering::AcqRel);
                            assert!(prev < g, "two tickets released one generation");
                        }
                    })
                })
                .collect();
            for h in handles {
                h.join().unwrap();
            }
            assert_eq!(table.lock().unwrap().held(), 0);
        });
    }
}
