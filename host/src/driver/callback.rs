//! Whether this thread is running a task graph host callback (issue 19, item 9): the driver's
//! callback thread, where no CUDA call may be made (CUDA driver API, `cuLaunchHostFunc`: "The
//! host function must not make any CUDA API calls") and a wait for GPU work never returns.
//! A thread-local flag, set by the callback trampolines ([`HostCallbackScope`]) and read by
//! every warpline path that binds a context, enqueues, waits or destroys a driver object. It lives
//! in the driver layer because the driver wrappers' own `Drop`s ([`super::graph`]) read it.

use crate::error::{Error, Result};

thread_local! {
    /// True while this thread runs a task graph host callback (issue 19, item 9).
    static IN_HOST_CALLBACK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// [`Error::InHostCallback`] naming `call` when this thread is running a task graph host
/// callback (the driver's callback thread, where CUDA calls are forbidden and a wait for GPU
/// work never returns). Every warpline path that binds a context, enqueues or waits checks it.
pub(crate) fn refuse_in_host_callback(call: &'static str) -> Result<()> {
    if IN_HOST_CALLBACK.with(|f| f.get()) {
        return Err(Error::InHostCallback { call });
    }
    Ok(())
}

/// True while this thread runs a task graph host callback (issue 19, item 9).
pub(crate) fn in_host_callback() -> bool {
    IN_HOST_CALLBACK.with(|f| f.get())
}

/// Marks this thread as running a host callback until dropped (set by the callback
/// trampolines around the user's closure; nesting restores the previous value).
pub(crate) struct HostCallbackScope {
    was: bool,
}

impl HostCallbackScope {
    pub(crate) fn enter() -> Self {
        Self {
            was: IN_HOST_CALLBACK.with(|f| f.replace(true)),
        }
    }
}

impl Drop for HostCallbackScope {
    fn drop(&mut self) {
        let was = self.was;
        IN_HOST_CALLBACK.with(|f| f.set(was));
    }
}
