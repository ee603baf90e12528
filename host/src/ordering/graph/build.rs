//! Building a [`TaskGraph`]: lanes, signal slots, tasks, dependencies, keep-alive objects.
//! Every handle is stamped with the graph's id; a handle of another graph is
//! [`Error::ForeignHandle`].

use std::any::Any;
use std::sync::{Arc, Mutex};

use super::{HostTask, Lane, Op, SignalRef, Task, TaskContext, TaskGraph, TypedTask};
use crate::error::{Error, Result};
use crate::kernels::TcGemmPlan;
use crate::launch::LaunchConfig;
use crate::module::{KernelSignature, TypedKernel};
use crate::ordering::check::TaskId;
use crate::ordering::types::Cmp;

impl<'g> TaskGraph<'g> {
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

    fn push(
        &mut self,
        what: &'static str,
        lane: Lane,
        label: String,
        op: Op<'g>,
    ) -> Result<TaskId> {
        let lane = self.lane_index(what, lane)?;
        self.tasks.push(Task { lane, label, op });
        Ok(TaskId {
            graph: self.id,
            index: self.tasks.len() - 1,
        })
    }

    /// A kernel launch (or any stream work): `launch` enqueues on `ctx.stream` with a typed
    /// launcher. It runs on the host at enqueue/capture time, once per [`TaskGraph::enqueue`] or
    /// [`TaskGraph::capture_unchecked`].
    ///
    /// A closure can reach any memory (through shared state, a `static`, its own allocations), so
    /// a graph with kernel closures runs safely only directly ([`TaskGraph::enqueue`], where each
    /// run is ordered with the buffers' stream-ordered frees by the launchers' stream checks):
    /// the safe [`TaskGraph::capture`] refuses it ([`Error::UncheckedCapture`]), and capturing it
    /// is the `unsafe` [`TaskGraph::capture_unchecked`] (issue 19, item 1). A captured graph keeps
    /// the closure (and what it owns) alive until its last launch has completed.
    /// Errors: [`Error::ForeignHandle`].
    pub fn kernel(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        launch: impl Fn(&TaskContext<'_>) -> Result<()> + Send + Sync + 'static,
    ) -> Result<TaskId> {
        let op = Op::Kernel(Arc::new(launch));
        self.push("TaskGraph::kernel", lane, label.into(), op)
    }

    /// The launches of a [`TcGemmPlan`] ([`TcGemm::plan`](crate::kernels::TcGemm::plan) /
    /// `plan_chain2`), owned by the graph: a task that [`TaskGraph::capture`] may capture. The plan
    /// (its tensor-map table in device memory) lives as long as this graph and every
    /// [`super::CapturedGraph`] captured from it, and the operands it borrows for `'g` outlive
    /// both; its table is freed, stream-ordered on the plan's stream, only when the last of them
    /// is dropped, after every launch and replay already queued (issue 19, item 1).
    ///
    /// The plan must be made on the stream that `lane` is bound to when the graph runs
    /// ([`Error::WrongStream`] at [`TaskGraph::enqueue`] / [`TaskGraph::capture`] otherwise), so
    /// the operands' and the table's stream-ordered frees come after every run.
    /// Errors: [`Error::ForeignHandle`].
    ///
    /// Capture and replay, the operands dropped after the captured graph:
    ///
    /// ```no_run
    /// use warpline::kernels::{BLayout, Matrix, MatrixMut, TcGemm};
    /// use warpline::ordering::{synchronize_timeout, OnTimeout, TaskGraph};
    /// fn f(dev: &warpline::Device, tc: &TcGemm<'_>, s: &warpline::Stream,
    ///      pool: &warpline::MemPool) -> warpline::Result<()> {
    ///     let a = pool.alloc_async::<warpline::bf16>(s, 64 * 64)?;
    ///     let b = pool.alloc_async::<warpline::bf16>(s, 64 * 64)?;
    ///     let mut c = pool.alloc_async::<f32>(s, 64 * 64)?;
    ///     let plan = tc.plan(s, Matrix::new(a.as_view(), 64, 64, 64),
    ///         Matrix::new(b.as_view(), 64, 64, 64), BLayout::ColMajor,
    ///         MatrixMut::new(c.as_view_mut(), 64, 64, 64), 1.0, 0.0, &Default::default())?;
    ///     let mut g = TaskGraph::new();
    ///     let l = g.lane("l");
    ///     g.gemm(l, "gemm", plan)?;
    ///     let mut captured = g.capture(dev, &[s.clone()], &[])?;
    ///     drop(g);
    ///     let run = captured.launch()?;
    ///     synchronize_timeout(&run, std::time::Duration::from_secs(10), OnTimeout::Abandon)?;
    ///     drop(captured);
    ///     drop(c);
    ///     Ok(())
    /// }
    /// ```
    ///
    /// The plan's operands cannot be dropped while a captured graph that replays it lives:
    ///
    /// ```compile_fail,E0505
    /// use warpline::kernels::{BLayout, Matrix, MatrixMut, TcGemm};
    /// use warpline::ordering::TaskGraph;
    /// fn f(dev: &warpline::Device, tc: &TcGemm<'_>, s: &warpline::Stream,
    ///      pool: &warpline::MemPool) -> warpline::Result<()> {
    ///     let a = pool.alloc_async::<warpline::bf16>(s, 64 * 64)?;
    ///     let b = pool.alloc_async::<warpline::bf16>(s, 64 * 64)?;
    ///     let mut c = pool.alloc_async::<f32>(s, 64 * 64)?;
    ///     let plan = tc.plan(s, Matrix::new(a.as_view(), 64, 64, 64),
    ///         Matrix::new(b.as_view(), 64, 64, 64), BLayout::ColMajor,
    ///         MatrixMut::new(c.as_view_mut(), 64, 64, 64), 1.0, 0.0, &Default::default())?;
    ///     let mut g = TaskGraph::new();
    ///     let l = g.lane("l");
    ///     g.gemm(l, "gemm", plan)?;
    ///     let mut captured = g.capture(dev, &[s.clone()], &[])?;
    ///     drop(g);
    ///     drop(c); // error: `c` is still borrowed by the captured graph
    ///     captured.launch()?;
    ///     Ok(())
    /// }
    /// ```
    pub fn gemm(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        plan: TcGemmPlan<'g>,
    ) -> Result<TaskId> {
        let op = Op::Gemm(Arc::new(plan));
        self.push("TaskGraph::gemm", lane, label.into(), op)
    }

    /// A launch of a typed kernel ([`crate::Module::kernel`]) with `config` and `args`, the graph
    /// holding the arguments: a task that [`TaskGraph::capture`] may capture. The views in
    /// `args` borrow their buffers for `'g`, so the buffers outlive this graph and every
    /// [`super::CapturedGraph`] made from it (safe code cannot drop them earlier), and a captured
    /// graph keeps the kernel's module loaded until its last launch has completed.
    ///
    /// Every view must be bound to the stream of `lane` when the graph runs
    /// ([`Error::WrongStream`] at [`TaskGraph::enqueue`] / [`TaskGraph::capture`], before
    /// anything is queued), so the buffers' stream-ordered frees come after every run and replay.
    /// Configuration and limits are checked at each run or capture as [`crate::TypedKernel::launch`]
    /// checks them. The borrows follow Rust's rules across tasks: a buffer written by one task
    /// (a `ViewMut`) cannot also be read by another task of the same graph; chain such kernels
    /// in one plan ([`crate::kernels::TcGemm::plan_chain2`]) or use
    /// [`TaskGraph::capture_unchecked`]. Errors: [`Error::ForeignHandle`].
    ///
    /// # Safety
    /// As [`crate::TypedKernel::launch`], for every run and replay: the kernel's memory accesses
    /// with these arguments stay inside the views passed (reads through `View`s, writes through
    /// `ViewMut`s) and, for raw addresses, inside allocations that outlive every replay; with
    /// `config.pdl` it reads nothing the previous kernel on the lane writes before
    /// `griddepcontrol.wait`.
    pub unsafe fn typed<Sig: KernelSignature>(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        kernel: &TypedKernel<Sig>,
        config: LaunchConfig,
        args: Sig::Args<'g>,
    ) -> Result<TaskId>
    where
        Sig::Args<'g>: Send + Sync + 'g,
        TypedKernel<Sig>: Send + Sync,
    {
        let task = TypedTask {
            kernel: kernel.clone(),
            config,
            args,
        };
        let op = Op::Typed(Arc::new(task));
        self.push("TaskGraph::typed", lane, label.into(), op)
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
    /// is done and blocks the lane until it returns. It must not call CUDA or wait for GPU work:
    /// warpline enforces this for its own API (issue 19, item 9): while the callback runs, every
    /// warpline call that would call CUDA, enqueue or wait for GPU work (stream and event
    /// synchronisation, [`super::super::synchronize_timeout`], launches, copies, allocations,
    /// frees, anything that binds a context) returns [`Error::InHostCallback`] instead, and a
    /// warpline object dropped inside the callback is handed to the reaper thread rather than
    /// freed there. Raw driver calls (cudarc, `Stream::raw` handles) are not seen: they remain
    /// forbidden. A panic is caught on the driver thread and reported by
    /// [`super::super::synchronize_timeout`] on the run as [`Error::HostCallbackPanicked`].
    /// Errors: [`Error::ForeignHandle`].
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
