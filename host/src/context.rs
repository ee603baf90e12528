//! The per-context record (a sticky error turns into [`Error::ContextPoisoned`], naming the
//! first error and the launches that preceded it; errors deferred from `Drop`s; per-context
//! state of higher layers) and the binding of a context to the calling thread.
//!
//! It sits below `stream` and `device` (both use it) and imports only `error` and `driver`
//! (issue 22, item 11); `device` re-exports it for the layers above.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::sys;
use cudarc::driver::{CudaContext, DriverError};

use crate::driver::core as drv;
use crate::error::{Error, Result};

/// One launch as remembered for error reports.
#[derive(Clone, Debug)]
pub(crate) struct LaunchRecord {
    pub(crate) kernel: String,
    pub(crate) config: String,
}

/// How many launches each context remembers for [`Error::ContextPoisoned`].
pub(crate) const LAUNCH_HISTORY: usize = 8;

/// What warpline knows about one CUDA context: whether a sticky error poisoned it, the last
/// launches queued on it, and errors cudarc deferred from `Drop`s.
#[derive(Debug)]
pub(crate) struct ContextState {
    ctx: usize,
    poison: Mutex<Option<(String, Vec<String>)>>,
    launches: Mutex<VecDeque<LaunchRecord>>,
    deferred: Mutex<Vec<String>>,
    /// Per-context state of higher layers, one value per type (the streams of
    /// `stream::StreamStock`, the modules `device` loaded, the staging buffers of
    /// `memory::staging`): kept here, type-erased, so that this module imports none of them.
    ext: Mutex<Vec<Arc<dyn std::any::Any + Send + Sync>>>,
}

impl ContextState {
    /// The context's value of type `T` (made with `T::default()` on first use).
    pub(crate) fn ext<T: std::any::Any + Send + Sync + Default>(&self) -> Arc<T> {
        let mut ext = self.ext.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = ext.iter().find_map(|v| v.clone().downcast::<T>().ok()) {
            return found;
        }
        let made = Arc::new(T::default());
        ext.push(made.clone());
        made
    }

    fn new(ctx: sys::CUcontext) -> Self {
        Self {
            ctx: ctx as usize,
            poison: Mutex::new(None),
            launches: Mutex::new(VecDeque::with_capacity(LAUNCH_HISTORY)),
            deferred: Mutex::new(Vec::new()),
            ext: Mutex::new(Vec::new()),
        }
    }

    /// Remembers a launch (the newest [`LAUNCH_HISTORY`] are kept).
    pub(crate) fn record_launch(&self, rec: LaunchRecord) {
        let mut l = self.launches.lock().unwrap_or_else(|e| e.into_inner());
        if l.len() == LAUNCH_HISTORY {
            l.pop_front();
        }
        l.push_back(rec);
    }

    /// Marks the context poisoned (the first error wins) and returns the error for `call`.
    pub(crate) fn poison(&self, call: &'static str, source: DriverError) -> Error {
        let mut p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
        if p.is_none() {
            let launches = self
                .launches
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .iter()
                .map(|r| format!("`{}` {}", r.kernel, r.config))
                .collect();
            *p = Some((format!("{:?} reported by {call}", source.0), launches));
        }
        let (first, recent_launches) = p.clone().unwrap_or_default();
        Error::ContextPoisoned {
            call,
            first,
            recent_launches,
        }
    }

    /// [`Error::ContextPoisoned`] for `call` once a sticky error was seen.
    pub(crate) fn check(&self, call: &'static str) -> Result<()> {
        let p = self.poison.lock().unwrap_or_else(|e| e.into_inner());
        match &*p {
            None => Ok(()),
            Some((first, recent_launches)) => Err(Error::ContextPoisoned {
                call,
                first: first.clone(),
                recent_launches: recent_launches.clone(),
            }),
        }
    }

    /// The errors kept by [`Self::defer`], oldest first; the list is emptied.
    pub(crate) fn take_deferred(&self) -> Vec<String> {
        std::mem::take(&mut *self.deferred.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Keeps an error that could not be returned (from a `Drop`).
    pub(crate) fn defer(&self, what: String) {
        let mut d = self.deferred.lock().unwrap_or_else(|e| e.into_inner());
        if d.len() < 64 {
            d.push(what);
        }
    }
}

static STATES: Mutex<Vec<Weak<ContextState>>> = Mutex::new(Vec::new());

/// The record of context `ctx`, created on first use.
pub(crate) fn state_for(ctx: sys::CUcontext) -> Arc<ContextState> {
    // `error::classify` (below this layer) poisons records through this from now on.
    crate::error::set_poison_current(poison_current);
    let mut all = STATES.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|w| w.strong_count() > 0);
    if let Some(s) = all
        .iter()
        .filter_map(Weak::upgrade)
        .find(|s| s.ctx == ctx as usize)
    {
        return s;
    }
    let s = Arc::new(ContextState::new(ctx));
    all.push(Arc::downgrade(&s));
    s
}

/// The record of `ctx` if one is alive (no allocation).
fn existing_state(ctx: sys::CUcontext) -> Option<Arc<ContextState>> {
    let all = STATES.lock().unwrap_or_else(|e| e.into_inner());
    all.iter()
        .filter_map(Weak::upgrade)
        .find(|s| s.ctx == ctx as usize)
}

/// Sticky `source` seen by `call`: poisons the current context's record and returns
/// [`Error::ContextPoisoned`].
pub(crate) fn poison_current(call: &'static str, source: DriverError) -> Error {
    match drv::ctx_get_current_unclassified().and_then(existing_state) {
        Some(s) => s.poison(call, source),
        None => crate::error::poisoned_without_record(call, source),
    }
}

/// Drains cudarc's deferred-error slot of `ctx` (errors its `Drop`s recorded) into warpline's
/// record, so they are neither lost nor reported later under an unrelated call's name.
pub(crate) fn drain_deferred(ctx: &CudaContext, state: &ContextState) {
    if let Err(e) = ctx.check_err() {
        if crate::error::is_sticky(e.0) {
            let _ = state.poison("a cudarc Drop (deferred)", e);
        }
        state.defer(format!("{:?} from a cudarc Drop", e.0));
    }
}

/// Makes `ctx` current on this thread with the raw `cuCtxSetCurrent` (not cudarc's
/// `bind_to_thread`, which returns errors left over from earlier `Drop`s instead of binding).
/// Refuses with [`Error::ContextPoisoned`] once a sticky error was seen on the context.
pub(crate) fn bind_context(ctx: &CudaContext, call: &'static str) -> Result<()> {
    refuse_in_host_callback(call)?;
    let state = state_for(ctx.cu_ctx());
    drain_deferred(ctx, &state);
    state.check(call)?;
    drv::ctx_set_current(ctx.cu_ctx())
}

/// As [`bind_context`] but also on a poisoned context: for synchronisation and frees, which must
/// still be attempted (they return at once with the sticky error).
pub(crate) fn bind_context_unchecked(ctx: &CudaContext) -> Result<()> {
    refuse_in_host_callback("a warpline CUDA call (synchronisation or free)")?;
    let state = state_for(ctx.cu_ctx());
    drain_deferred(ctx, &state);
    drv::ctx_set_current(ctx.cu_ctx())
}

// The host-callback flag lives in the driver layer (`driver::callback`), whose graph handles'
// drops read it; re-exported here (and from `device`), where the rest of the crate finds it.
pub(crate) use crate::driver::callback::{
    in_host_callback, refuse_in_host_callback, HostCallbackScope,
};

/// Keeps an error from a `Drop` in the record of `ctx`.
pub(crate) fn defer_error(ctx: &CudaContext, e: &Error) {
    state_for(ctx.cu_ctx()).defer(e.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 19, item 9: inside a host-callback scope every context bind (the path of every
    /// warpline CUDA call) is `InHostCallback`; the flag is per thread and restored on exit,
    /// also when the callback panics, and nested scopes restore the outer value.
    #[test]
    fn issue19_item09_host_callback_scope_refuses_warpline_calls() {
        refuse_in_host_callback("outside").unwrap();
        {
            let _outer = HostCallbackScope::enter();
            match refuse_in_host_callback("Stream::synchronize") {
                Err(Error::InHostCallback { call }) => assert_eq!(call, "Stream::synchronize"),
                other => panic!("expected InHostCallback, got {other:?}"),
            }
            // Another thread is not in a callback.
            std::thread::spawn(|| refuse_in_host_callback("other thread").unwrap())
                .join()
                .unwrap();
            {
                let _inner = HostCallbackScope::enter();
                assert!(refuse_in_host_callback("nested").is_err());
            }
            assert!(refuse_in_host_callback("after nested").is_err());
        }
        refuse_in_host_callback("after").unwrap();
        let r = std::panic::catch_unwind(|| {
            let _scope = HostCallbackScope::enter();
            panic!("callback panics");
        });
        assert!(r.is_err());
        refuse_in_host_callback("after a panic").unwrap();
        let msg = Error::InHostCallback { call: "x" }.to_string();
        assert!(msg.contains("allowed"), "{msg}");
    }

    #[test]
    fn finding_19_poison_names_recent_launches_and_refuses_work() {
        let st = ContextState::new(0x1234 as sys::CUcontext);
        for i in 0..LAUNCH_HISTORY + 2 {
            st.record_launch(LaunchRecord {
                kernel: format!("k{i}"),
                config: "grid [1, 1, 1] block [32, 1, 1]".into(),
            });
        }
        assert!(st.check("x").is_ok());
        let e = st.poison(
            "cuStreamSynchronize",
            DriverError(sys::CUresult::CUDA_ERROR_ILLEGAL_ADDRESS),
        );
        let Error::ContextPoisoned {
            first,
            recent_launches,
            ..
        } = &e
        else {
            panic!("{e}")
        };
        assert!(first.contains("ILLEGAL_ADDRESS") && first.contains("cuStreamSynchronize"));
        assert_eq!(recent_launches.len(), LAUNCH_HISTORY);
        assert!(recent_launches.last().unwrap().contains("`k9`"));
        // A later error does not replace the first; later calls are refused with it.
        let _ = st.poison(
            "cuLaunchKernelEx",
            DriverError(sys::CUresult::CUDA_ERROR_LAUNCH_FAILED),
        );
        let e = st.check("cuMemAllocFromPoolAsync").unwrap_err();
        let m = e.to_string();
        assert!(
            m.contains("ILLEGAL_ADDRESS") && m.contains("cuMemAllocFromPoolAsync"),
            "{m}"
        );
    }
}
