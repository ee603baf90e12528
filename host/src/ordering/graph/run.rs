//! [`GraphRun`]: one enqueued run of a task graph (direct or a captured launch), as seen by
//! [`crate::ordering::synchronize_timeout`].

use std::any::Any;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaEvent;

use crate::error::{CudaCall, Error, Result};
use crate::ordering::types::{PendingOp, Release};
use crate::stream::Stream;

/// Panics caught in host callbacks: (task label, message).
pub(crate) type PanicLog = Arc<Mutex<Vec<(String, String)>>>;

pub(super) struct RunTask {
    pub what: String,
    pub release: Option<Release>,
    pub done: CudaEvent,
}

pub(super) enum RunState {
    Direct {
        tasks: Vec<RunTask>,
        tails: Vec<CudaEvent>,
    },
    Captured {
        /// Keeps the captured graph and everything its nodes use alive (also kept by the host
        /// callback after the launch, so dropping this run early is fine): the `capture::Keep`
        /// of the graph, held type-erased so that this file imports nothing of `capture`.
        _keep: Arc<dyn Any + Send + Sync>,
        waits: Vec<(String, Release)>,
        done: CudaEvent,
    },
}

/// One enqueued run of a [`super::TaskGraph`] (direct or captured): wait for it with
/// [`crate::ordering::synchronize_timeout`], which also reports a host callback that panicked.
pub struct GraphRun {
    what: String,
    state: RunState,
    panics: PanicLog,
    /// Keeps the run's streams alive while it may be pending.
    _streams: Vec<Stream>,
}

impl GraphRun {
    pub(super) fn new(
        what: String,
        state: RunState,
        panics: PanicLog,
        streams: Vec<Stream>,
    ) -> Self {
        Self {
            what,
            state,
            panics,
            _streams: streams,
        }
    }

    pub(crate) fn describe(&self) -> &str {
        &self.what
    }

    /// True once every task has completed (`cuEventQuery`). Errors: [`Error::Cuda`],
    /// [`Error::InHostCallback`] inside a host callback.
    pub fn is_complete(&self) -> Result<bool> {
        crate::device::refuse_in_host_callback("GraphRun::is_complete")?;
        let evs: Vec<&CudaEvent> = match &self.state {
            RunState::Direct { tails, .. } => tails.iter().collect(),
            RunState::Captured { done, .. } => vec![done],
        };
        for e in evs {
            if !e.try_is_complete().call("cuEventQuery")? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// The first host-callback panic recorded (and not reported yet) for this run, as
    /// [`Error::HostCallbackPanicked`]; the log is drained. For a captured graph the log is shared
    /// by its launches: a panic is reported by the first completed run that is asked.
    pub(crate) fn take_panic(&self) -> Option<Error> {
        let mut log = self.panics.lock().unwrap_or_else(|e| e.into_inner());
        if log.is_empty() {
            return None;
        }
        let (task, message) = log.remove(0);
        log.clear();
        Some(Error::HostCallbackPanicked { task, message })
    }

    /// What has not completed: signal waits first. For a captured launch the driver does not
    /// report node progress, so every signal wait of the graph is listed as possibly pending.
    pub(crate) fn pending(&self) -> Result<Vec<PendingOp>> {
        let mut out = Vec::new();
        match &self.state {
            RunState::Direct { tasks, .. } => {
                for t in tasks {
                    if !t.done.try_is_complete().call("cuEventQuery")? {
                        out.push(PendingOp {
                            what: t.what.clone(),
                            release: t.release.clone(),
                        });
                    }
                }
            }
            RunState::Captured { waits, .. } => {
                for (what, r) in waits {
                    out.push(PendingOp {
                        what: format!("(captured, possibly) {what}"),
                        release: Some(r.clone()),
                    });
                }
            }
        }
        out.sort_by_key(|p| p.release.is_none());
        Ok(out)
    }
}
