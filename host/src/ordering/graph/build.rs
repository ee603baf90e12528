//! Building a [`TaskGraph`]: lanes, signal slots, tasks, dependencies, keep-alive objects.
//! Every handle is stamped with the graph's id; a handle of another graph is
//! [`Error::ForeignHandle`].

use std::any::Any;
use std::sync::{Arc, Mutex};

use super::{HostTask, Lane, Op, SignalRef, Task, TaskContext, TaskGraph};
use crate::error::{Error, Result};
use crate::ordering::check::TaskId;
use crate::ordering::types::Cmp;

impl TaskGraph {
    /// A new lane named `name` (bound to `streams[lane index]` at run time, in creation order).
    pub fn lane(&mut self, name: impl Into<String>) -> Lane {
        self.lanes.push(name.into());
        Lane {
            graph: self.id,
            index: self.lanes.len() - 1,
        }
    }

    /// A new signal slot named `name` (bound to `signals[index]` at run time, in creation order).
    pub fn signal(&mut self, name: impl Into<String>) -> SignalRef {
        self.signals.push(name.into());
        SignalRef {
            graph: self.id,
            index: self.signals.len() - 1,
        }
    }

    fn push(&mut self, what: &'static str, lane: Lane, label: String, op: Op) -> Result<TaskId> {
        let lane = self.lane_index(what, lane)?;
        self.tasks.push(Task { lane, label, op });
        Ok(TaskId {
            graph: self.id,
            index: self.tasks.len() - 1,
        })
    }

    /// A kernel launch (or any stream work): `launch` enqueues on `ctx.stream` with a typed
    /// launcher. It runs on the host at enqueue/capture time, once per [`TaskGraph::enqueue`] or
    /// [`TaskGraph::capture`]; a captured graph keeps the closure (and what it owns) alive until
    /// its last launch has completed. Errors: [`Error::ForeignHandle`].
    pub fn kernel(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        launch: impl Fn(&TaskContext<'_>) -> Result<()> + Send + Sync + 'static,
    ) -> Result<TaskId> {
        let op = Op::Kernel(Arc::new(launch));
        self.push("TaskGraph::kernel", lane, label.into(), op)
    }

    /// A device-to-device copy of `bytes` bytes (`cuMemcpyDtoDAsync`).
    /// Errors: [`Error::ForeignHandle`].
    ///
    /// # Safety
    /// `dst` and `src` are live device allocations of at least `bytes` bytes, not overlapping, for
    /// as long as any run of the graph (or its captured form) may execute (hand their owners to
    /// [`TaskGraph::keep_alive`] to tie them to captured graphs), and the graph's dependencies
    /// order every other access to them.
    pub unsafe fn copy(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        dst: u64,
        src: u64,
        bytes: usize,
    ) -> Result<TaskId> {
        let op = Op::Copy { dst, src, bytes };
        self.push("TaskGraph::copy", lane, label.into(), op)
    }

    /// An on-stream wait until `signal` satisfies `cmp` against `value` ([`super::Signal::wait_until`]).
    /// Errors: [`Error::ForeignHandle`].
    pub fn wait(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        signal: SignalRef,
        cmp: Cmp,
        value: u64,
    ) -> Result<TaskId> {
        let signal = self.signal_index("TaskGraph::wait", signal)?;
        let op = Op::Wait { signal, cmp, value };
        self.push("TaskGraph::wait", lane, label.into(), op)
    }

    /// An on-stream write of `value` to `signal` ([`super::Signal::set`]).
    /// Errors: [`Error::ForeignHandle`].
    pub fn set(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        signal: SignalRef,
        value: u64,
    ) -> Result<TaskId> {
        let signal = self.signal_index("TaskGraph::set", signal)?;
        self.push(
            "TaskGraph::set",
            lane,
            label.into(),
            Op::Set { signal, value },
        )
    }

    /// An on-stream atomic add of `value` to `signal` ([`super::Signal::add`]; `atom.add.u64`,
    /// wrapping at 2^64). The checker counts its value: a wait is accepted only if every value
    /// its producers can leave satisfies it ([`TaskGraph::check`]). Errors:
    /// [`Error::ForeignHandle`].
    pub fn add(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        signal: SignalRef,
        value: u64,
    ) -> Result<TaskId> {
        let signal = self.signal_index("TaskGraph::add", signal)?;
        self.push(
            "TaskGraph::add",
            lane,
            label.into(),
            Op::Add { signal, value },
        )
    }

    /// A host callback (`cuLaunchHostFunc`): runs on a driver thread once the lane's earlier work
    /// is done and blocks the lane until it returns. It must not call CUDA or wait for GPU work.
    /// A panic is caught on the driver thread and reported by [`super::super::synchronize_timeout`]
    /// on the run as [`Error::HostCallbackPanicked`]. Errors: [`Error::ForeignHandle`].
    pub fn host(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        f: impl FnMut() + Send + 'static,
    ) -> Result<TaskId> {
        let label = label.into();
        let op = Op::Host(Arc::new(HostTask {
            label: label.clone(),
            f: Mutex::new(Box::new(f)),
        }));
        self.push("TaskGraph::host", lane, label, op)
    }

    /// Keeps `value` (say, an `Arc` of the buffers that [`TaskGraph::copy`] tasks or kernel
    /// closures use by address) alive as long as this graph and every [`super::CapturedGraph`]
    /// captured from it, until the captured graph's last launch has completed.
    pub fn keep_alive(&mut self, value: impl Any + Send + Sync) {
        self.keep.push(Arc::new(value));
    }

    /// `after` does not start before `before` has completed (an event across lanes).
    /// Errors: [`Error::ForeignHandle`] for a task of another graph, [`Error::BadShape`] for a
    /// self-edge.
    pub fn depend(&mut self, before: TaskId, after: TaskId) -> Result<()> {
        let b = self.task_index("TaskGraph::depend", before)?;
        let a = self.task_index("TaskGraph::depend", after)?;
        if b == a {
            return Err(Error::BadShape {
                what: "task graph dependency",
                detail: format!("task {b} cannot depend on itself; allowed: two distinct tasks"),
            });
        }
        self.deps.push((b, a));
        Ok(())
    }
}
