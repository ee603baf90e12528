//! `Fence`: "everything the caller enqueues later on its stream waits for internal work that may
//! be submitted *after* that" (the stream-wait-value fence seed). CUDA events cannot express it: a
//! `cuStreamWaitEvent` on an event that is recorded later waits for nothing. A stream memory
//! operation can: the caller's stream gets `cuStreamWaitValue64(flag >= epoch)` now, and the
//! internal stream writes `epoch` (`cuStreamWriteValue64`) after the internal work whenever that
//! is submitted.
//!
//! The seed's hang: with lazy module loading (`CUDA_MODULE_LOADING=LAZY`, the default since CUDA
//! 12.2) the first launch of a kernel loads it, which needs the device idle; the pending wait
//! keeps it busy, and the launch that would satisfy the wait blocks forever. A `Fence` can only be
//! made on a [`Device`] whose kernels are all loaded ([`Device::all_kernels_loaded`]; warpline
//! loads every kernel at open with `cuFuncLoad`), and refuses otherwise with
//! [`Error::ModuleNotFullyLoaded`].
//!
//! Epochs: each [`Fence::guard`] takes the next u64 epoch and waits with `>=`, so the flag is never
//! reset and never wraps. Tickets may be released in any order: the flag is advanced only to the
//! highest epoch whose tickets, and all earlier ones, have released, so `>=` never lets a caller
//! through before its own internal work.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::signal::{Cmp, Signal};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::stream::Stream;

/// Epoch bookkeeping (pure CPU): tickets are numbered 1, 2, ...; the flag may advance to `e` only
/// once every ticket `<= e` has released.
#[derive(Debug)]
struct FenceState {
    next: u64,
    released: BTreeSet<u64>,
    written: u64,
}

impl FenceState {
    fn new() -> Self {
        Self {
            next: 1,
            released: BTreeSet::new(),
            written: 0,
        }
    }

    fn take(&mut self) -> u64 {
        let e = self.next;
        self.next += 1;
        e
    }

    /// Marks `epoch` released; returns the new flag value if the contiguous prefix grew.
    fn release(&mut self, epoch: u64) -> Option<u64> {
        self.released.insert(epoch);
        let mut to = self.written;
        while self.released.remove(&(to + 1)) {
            to += 1;
        }
        (to > self.written).then(|| {
            self.written = to;
            to
        })
    }
}

struct Shared {
    internal: Stream,
    flag: Signal<u64>,
    state: Mutex<FenceState>,
}

/// An asynchronous fence between warpline's internal stream and callers' streams.
///
/// ```text
/// let ticket = fence.guard(&user_stream)?;   // user_stream: [wait flag >= e]  (returns at once)
/// launch(&user_stream, ...);                 // runs only after the internal work below
/// // later, maybe on another thread:
/// ticket.submit(|internal| { launch(internal, ...); Ok(()) })?; // internal: [work, write e]
/// ```
#[derive(Clone)]
pub struct Fence {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence")
            .field("flag", &self.shared.flag)
            .finish()
    }
}

impl Fence {
    /// A fence with its own internal stream and flag.
    ///
    /// Errors: [`Error::ModuleNotFullyLoaded`] unless every kernel of `dev`'s module is loaded
    /// (`cuFuncIsLoaded`), [`Error::StreamMemOps64Unsupported`], [`Error::Cuda`].
    pub fn new(dev: &Device) -> Result<Self> {
        if !dev.all_kernels_loaded()? {
            return Err(Error::ModuleNotFullyLoaded { what: "Fence::new" });
        }
        Ok(Self {
            shared: Arc::new(Shared {
                internal: dev.new_stream()?,
                flag: Signal::new(dev, "fence")?,
                state: Mutex::new(FenceState::new()),
            }),
        })
    }

    /// The internal stream that [`FenceTicket::submit`] enqueues on.
    pub fn internal_stream(&self) -> &Stream {
        &self.shared.internal
    }

    /// Takes the next epoch and makes everything enqueued on `caller` after this call wait until
    /// the ticket (and every earlier ticket) is released (`cuStreamWaitValue64`, `>=`). Returns at
    /// once. Dropping the ticket releases it with no work, so a forgotten ticket cannot hang the
    /// caller's stream. Errors: [`Error::Cuda`].
    pub fn guard(&self, caller: &Stream) -> Result<FenceTicket> {
        let epoch = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let ticket = FenceTicket {
            shared: self.shared.clone(),
            epoch,
            open: true,
        };
        self.shared.flag.wait_until(caller, Cmp::Geq, epoch)?;
        Ok(ticket)
    }

    /// The highest epoch written to the flag's stream so far (tests, diagnostics).
    pub fn released_epoch(&self) -> u64 {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .written
    }
}

/// The obligation to release one [`Fence::guard`]. `Send`: hand it to the thread that submits
/// the internal work.
pub struct FenceTicket {
    shared: Arc<Shared>,
    epoch: u64,
    open: bool,
}

impl FenceTicket {
    /// The epoch this ticket releases.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Enqueues `work` on the internal stream, then releases the ticket: the flag is written after
    /// the work (stream order, with a memory barrier), so the guarded caller work sees its results.
    /// The ticket is released even if `work` fails (the caller's stream must not hang); the error
    /// is returned. Errors: `work`'s, [`Error::Cuda`].
    pub fn submit(mut self, work: impl FnOnce(&Stream) -> Result<()>) -> Result<()> {
        let r = work(&self.shared.internal);
        let rel = self.release_now();
        r.and(rel)
    }

    fn release_now(&mut self) -> Result<()> {
        if !self.open {
            return Ok(());
        }
        self.open = false;
        let mut st = self.shared.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(to) = st.release(self.epoch) {
            // Under the lock: writes reach the internal stream in increasing epoch order.
            self.shared.flag.set(&self.shared.internal, to)?;
        }
        Ok(())
    }
}

impl Drop for FenceTicket {
    fn drop(&mut self) {
        // A failure here means the driver failed; it cannot be reported from drop.
        let _ = self.release_now();
    }
}

#[cfg(test)]
mod tests {
    use super::FenceState;
    use rand::seq::SliceRandom;

    #[test]
    fn flag_advances_only_over_released_prefixes_in_any_release_order() {
        let mut rng = rand::rng();
        for _ in 0..200 {
            let mut st = FenceState::new();
            let n = 12;
            let mut epochs: Vec<u64> = (0..n).map(|_| st.take()).collect();
            epochs.shuffle(&mut rng);
            let mut released = std::collections::BTreeSet::new();
            let mut last = 0;
            for e in epochs {
                released.insert(e);
                let prefix = (1..=n).take_while(|k| released.contains(k)).count() as u64;
                match st.release(e) {
                    Some(to) => {
                        assert_eq!(to, prefix);
                        assert!(to > last, "flag values strictly increase");
                        last = to;
                    }
                    None => assert_eq!(prefix, last, "no write while the prefix is unchanged"),
                }
            }
            assert_eq!(last, n);
        }
    }
}
