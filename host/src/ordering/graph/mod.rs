//! `TaskGraph`: kernels, copies, signal waits/sets/adds and host callbacks on logical streams
//! ("lanes") with explicit dependencies, checked for cycles and unsatisfiable waits (including the
//! signal edges CUDA cannot see) before anything is enqueued, then enqueued producer-first with
//! events for cross-stream dependencies, or captured into a CUDA graph in which every edge is
//! CUDA-visible.
//!
//! Seams: [`build`] (adding lanes, signals, tasks, dependencies), this file (the graph, handles,
//! the check), [`enqueue`] (direct runs and the submission shared with capture, host callbacks),
//! [`capture`] (CUDA graph capture and [`CapturedGraph`]), [`run`] ([`GraphRun`]).
//! Files import each other one way only: `run` <- `enqueue` <- `capture` (`run` holds a captured
//! graph's keep-alive type-erased, and owns the panic log type both others use).

mod build;
mod capture;
mod enqueue;
mod run;

use std::any::Any;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::check::{self, Plan, Shape, TaskId, TaskView};
use super::signal::Signal;
use super::types::{Cmp, Release};
use crate::device::Device;
use crate::error::{Error, Result};
use crate::kernels::TcGemmPlan;
use crate::launch::LaunchConfig;
use crate::module::{KernelSignature, TypedKernel};
use crate::stream::Stream;

pub use capture::CapturedGraph;
pub use run::GraphRun;

/// A logical stream of a [`TaskGraph`]; bound to a real [`Stream`] when the graph runs. Valid
/// only in the graph that made it ([`Error::ForeignHandle`] otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lane {
    graph: u64,
    index: usize,
}

/// A logical signal of a [`TaskGraph`]; bound to a real [`Signal`] when the graph runs. Valid
/// only in the graph that made it ([`Error::ForeignHandle`] otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SignalRef {
    graph: u64,
    index: usize,
}

/// What a kernel task's closure gets: the device, its stream, and the bound signals.
pub struct TaskContext<'a> {
    /// The device.
    pub dev: &'a Device,
    /// The stream to enqueue on, and on this one only: in a direct run ([`TaskGraph::enqueue`])
    /// the stream the task's lane is bound to; during [`TaskGraph::capture_unchecked`] a private
    /// capture stream made for the capture, which must not leave the closure (see its contract).
    pub stream: &'a Stream,
    graph: u64,
    signals: &'a [&'a Signal<u64>],
}

impl TaskContext<'_> {
    /// The signal bound to `s` (for kernels that use signals device-side).
    /// Errors: [`Error::ForeignHandle`] for a slot of another graph.
    pub fn signal(&self, s: SignalRef) -> Result<&Signal<u64>> {
        if s.graph != self.graph {
            return Err(foreign(
                "TaskContext::signal",
                "signal slot",
                s.graph,
                self.graph,
            ));
        }
        Ok(self.signals[s.index])
    }
}

type LaunchFn = dyn Fn(&TaskContext<'_>) -> Result<()> + Send + Sync;

/// A [`TaskGraph::typed`] task: a checked kernel handle, its configuration and its arguments.
pub(crate) trait TypedLaunch: Send + Sync {
    /// Checks the views against `bound` (the lane's stream) and queues the launch on `on`.
    ///
    /// # Safety
    /// As [`crate::TypedKernel::launch_bound`].
    unsafe fn launch(&self, bound: &Stream, on: &Stream) -> Result<()>;
    /// [`Error::WrongStream`] unless every view is bound to `bound` (nothing is queued).
    fn check(&self, bound: &Stream) -> Result<()>;
    /// The kernel handle (keeps its module loaded), for a captured graph to keep.
    fn keep(&self) -> Arc<dyn Any + Send + Sync>;
}

pub(crate) struct TypedTask<'g, Sig: KernelSignature> {
    pub(crate) kernel: TypedKernel<Sig>,
    pub(crate) config: LaunchConfig,
    pub(crate) args: Sig::Args<'g>,
}

impl<'g, Sig: KernelSignature> TypedLaunch for TypedTask<'g, Sig>
where
    Sig::Args<'g>: Send + Sync,
    TypedKernel<Sig>: Send + Sync,
{
    unsafe fn launch(&self, bound: &Stream, on: &Stream) -> Result<()> {
        // SAFETY: the caller's contract, and TaskGraph::typed's for the kernel's accesses.
        unsafe {
            self.kernel
                .launch_bound(bound, on, &self.config, &self.args)
        }
    }

    fn check(&self, bound: &Stream) -> Result<()> {
        let mut values = [crate::launch::ParamValue::new(0u8); crate::module::MAX_PARAMS];
        Sig::prepare(&self.args, bound, &mut values).map(drop)
    }

    fn keep(&self) -> Arc<dyn Any + Send + Sync> {
        Arc::new(self.kernel.clone())
    }
}

/// A host callback task's closure and label (for panic reports).
pub(crate) struct HostTask {
    label: String,
    f: Mutex<Box<dyn FnMut() + Send>>,
}

enum Op<'g> {
    Kernel(Arc<LaunchFn>),
    /// A GEMM plan the graph owns (issue 19, item 1): its map table lives as long as the graph
    /// and every captured graph made from it; its operands are borrowed for `'g`.
    Gemm(Arc<TcGemmPlan<'g>>),
    /// A typed kernel launch whose views borrow their buffers for `'g` (issue 19, item 1).
    Typed(Arc<dyn TypedLaunch + 'g>),
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
    },
    Wait {
        signal: usize,
        cmp: Cmp,
        value: u64,
    },
    Set {
        signal: usize,
        value: u64,
    },
    Add {
        signal: usize,
        value: u64,
    },
    Host(Arc<HostTask>),
}

struct Task<'g> {
    lane: usize,
    label: String,
    op: Op<'g>,
}

static NEXT_GRAPH: AtomicU64 = AtomicU64::new(1);

fn foreign(what: &'static str, kind: &str, got: u64, this: u64) -> Error {
    Error::ForeignHandle {
        what,
        detail: format!("the {kind} belongs to task graph #{got}, not to this one (#{this})"),
    }
}

/// Tasks on lanes with explicit dependencies. Build it without a GPU; [`TaskGraph::check`] is pure
/// CPU code. Signals start every run at 0 (the run resets them), so set/wait values are per run.
///
/// Rules enforced (`docs/safety.md`, "Signal and TaskGraph", rule 4): every wait must fire in
/// every legal execution (any interleaving of the lanes that keeps each lane's order and the
/// explicit dependencies): every value its producers can leave (sets overwrite, adds wrap at
/// 2^64, `>=` is the driver's cyclic comparison) must satisfy it, since a value that holds only
/// for a moment can be missed ([`Error::WaitMayNotFire`]; [`Error::UnmatchedWait`] when no value
/// ever does). The full graph (explicit dependencies, each lane's order, an edge from each
/// producer a wait relies on) must be acyclic ([`Error::Cycle`] names a cycle); tasks are
/// submitted in a topological order of it, so those producers are enqueued before their waiter
/// and no FIFO merging of streams that CUDA may choose can block them. The check is conservative:
/// some live graphs are refused, none that can hang is accepted. Kernels that spin on signals device-side hold SMs: give
/// them an explicit dependency on their producer.
///
/// Lifetime `'g`: what [`TaskGraph::gemm`] tasks borrow (the GEMM operands); the graph and every
/// [`CapturedGraph`] made from it live within `'g`. Graphs without GEMM tasks are
/// `TaskGraph<'static>`.
pub struct TaskGraph<'g> {
    id: u64,
    lanes: Vec<String>,
    signals: Vec<String>,
    tasks: Vec<Task<'g>>,
    deps: Vec<(usize, usize)>,
    keep: Vec<Arc<dyn Any + Send + Sync>>,
}

impl Default for TaskGraph<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'g> TaskGraph<'g> {
    /// An empty graph with a process-unique id (stamped into its lanes, signal slots and tasks).
    pub fn new() -> Self {
        Self {
            id: NEXT_GRAPH.fetch_add(1, Ordering::Relaxed),
            lanes: Vec::new(),
            signals: Vec::new(),
            tasks: Vec::new(),
            deps: Vec::new(),
            keep: Vec::new(),
        }
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// True without tasks.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Label of task `t`. Errors: [`Error::ForeignHandle`] for a task of another graph.
    pub fn label(&self, t: TaskId) -> Result<&str> {
        Ok(&self.tasks[self.task_index("TaskGraph::label", t)?].label)
    }

    fn lane_index(&self, what: &'static str, l: Lane) -> Result<usize> {
        if l.graph != self.id {
            return Err(foreign(what, "lane", l.graph, self.id));
        }
        Ok(l.index)
    }

    fn signal_index(&self, what: &'static str, s: SignalRef) -> Result<usize> {
        if s.graph != self.id {
            return Err(foreign(what, "signal slot", s.graph, self.id));
        }
        Ok(s.index)
    }

    fn task_index(&self, what: &'static str, t: TaskId) -> Result<usize> {
        if t.graph != self.id {
            return Err(foreign(what, "task id", t.graph, self.id));
        }
        Ok(t.index)
    }

    /// Pure-CPU check: builds the full graph and returns the submission order.
    /// Errors: [`Error::Cycle`], [`Error::UnmatchedWait`], [`Error::WaitMayNotFire`].
    pub fn check(&self) -> Result<Plan> {
        let views: Vec<TaskView<'_>> = self
            .tasks
            .iter()
            .map(|t| TaskView {
                lane: t.lane,
                label: &t.label,
                shape: match t.op {
                    Op::Wait { signal, cmp, value } => Shape::Wait { signal, cmp, value },
                    Op::Set { signal, value } => Shape::Set { signal, value },
                    Op::Add { signal, value } => Shape::Add { signal, value },
                    _ => Shape::Work,
                },
            })
            .collect();
        check::plan(self.id, &views, &self.deps, &self.lanes, &self.signals)
    }

    fn check_bindings(&self, streams: &[Stream], signals: &[&Signal<u64>]) -> Result<()> {
        if streams.len() != self.lanes.len() || signals.len() != self.signals.len() {
            return Err(Error::LengthMismatch {
                what: "task graph bindings",
                detail: format!(
                    "{} streams for {} lanes and {} signals for {} signal slots; one each is needed",
                    streams.len(),
                    self.lanes.len(),
                    signals.len(),
                    self.signals.len()
                ),
            });
        }
        if streams.is_empty() {
            return Err(Error::Empty {
                what: "task graph lanes",
            });
        }
        // Issue 19, item 7: the checker treats slots as distinct words; one word in two slots
        // would let one slot's producers undo the other's.
        for (j, s) in signals.iter().enumerate() {
            if let Some(k) = signals[..j]
                .iter()
                .position(|t| t.device_ptr() == s.device_ptr())
            {
                return Err(Error::BadShape {
                    what: "task graph bindings",
                    detail: format!(
                        "signal slots {k} (`{}`) and {j} (`{}`) are bound to the same signal `{}`; \
                         allowed: a distinct Signal per slot (the check treats slots as distinct words)",
                        self.signals[k], self.signals[j], s.label()
                    ),
                });
            }
        }
        Ok(())
    }

    /// [`Error::WrongStream`] unless every GEMM task's plan, and every view of a typed task, is
    /// bound to its lane's stream (their memory is freed on that stream, after every run and
    /// replay that lane stream orders). Queues nothing.
    fn check_gemm_streams(&self, streams: &[Stream]) -> Result<()> {
        for t in &self.tasks {
            match &t.op {
                Op::Gemm(p) if *p.stream() != streams[t.lane] => {
                    return Err(Error::WrongStream {
                        what: "TaskGraph::gemm (the plan's stream is not its lane's stream)",
                    });
                }
                Op::Typed(k) => k.check(&streams[t.lane])?,
                _ => {}
            }
        }
        Ok(())
    }

    /// The first kernel-closure task, which only [`TaskGraph::capture_unchecked`] may capture.
    fn first_closure(&self) -> Option<&str> {
        self.tasks.iter().find_map(|t| match t.op {
            Op::Kernel(_) => Some(t.label.as_str()),
            _ => None,
        })
    }

    fn describe(&self, t: &Task<'g>, signals: &[&Signal<u64>]) -> String {
        let lane = &self.lanes[t.lane];
        match &t.op {
            Op::Wait { signal, cmp, value } => format!(
                "signal wait `{}` on stream `{lane}`: `{}` {cmp} {value} never fired",
                t.label,
                signals[*signal].label()
            ),
            _ => format!("task `{}` on stream `{lane}`", t.label),
        }
    }

    fn release_of(&self, t: &Task<'g>, signals: &[&Signal<u64>]) -> Option<Release> {
        match t.op {
            Op::Wait { signal, cmp, value } => Some(Release {
                signal: Arc::new(signals[signal].clone()),
                cmp,
                value,
            }),
            _ => None,
        }
    }
}
