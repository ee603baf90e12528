//! `MultiTaskGraph`: a [`TaskGraph`] whose lanes are streams on several GPUs and whose signals
//! live in one GPU's memory, reached by the others through peer access (issue 13; the NVSHMEM
//! seeds: on-stream waits of two streams of one GPU serialise behind each other, and a cyclic data
//! dependency between GPUs deadlocks).
//!
//! Why it cannot deadlock: the check is the one of [`TaskGraph::check`], over all GPUs at once:
//! the full graph (explicit dependencies, each stream's order, every signal set/add -> each wait
//! it can satisfy, whichever GPU the lanes are on) must be acyclic, before anything is enqueued,
//! and tasks are submitted in one topological order across the GPUs. Every signal's producer is
//! thus enqueued before its waiter, whatever GPU either runs on, so no FIFO merging of streams
//! that CUDA may choose on any GPU can close a cycle; a truly cyclic dependency between GPUs is
//! [`Error::Cycle`]. Signals are placed on a *home* GPU; every GPU with a lane that waits on,
//! sets or adds to a signal must have peer access to its home ([`Error::PeerAccessUnavailable`]
//! otherwise, checked by [`MultiTaskGraph::check`] against the peer matrix).
//!
//! The watchdog covers every GPU: the [`GraphRun`](super::GraphRun) of
//! [`MultiTaskGraph::enqueue`] holds an event after every task on whatever GPU it ran, so
//! [`super::synchronize_timeout`] polls all of them and can release pending waits on any GPU.
//! `enqueue`, which takes a [`DeviceSet`](crate::multi::DeviceSet), is defined in `multi` (the
//! layer above), so that `ordering` imports nothing of `multi`.

use super::check::{Plan, TaskId};
use super::graph::{Lane, SignalRef, TaskContext, TaskGraph};
use super::types::Cmp;
use crate::error::{Error, Result};

/// A task graph over streams of several GPUs (positions in a
/// [`DeviceSet`](crate::multi::DeviceSet)). Build and check it without a GPU;
/// [`MultiTaskGraph::enqueue`] binds lanes to streams and signal slots to
/// [`Signal`](super::Signal)s made on their home GPU.
pub struct MultiTaskGraph {
    pub(crate) graph: TaskGraph<'static>,
    /// (lane, GPU of the lane), in lane order.
    pub(crate) lanes: Vec<(Lane, usize)>,
    /// (signal slot, home GPU), in slot order.
    pub(crate) signals: Vec<(SignalRef, usize)>,
    /// (GPU of the lane, signal index) for every signal operation.
    touches: Vec<(usize, usize, String)>,
}

impl Default for MultiTaskGraph {
    fn default() -> Self {
        Self::new()
    }
}

impl MultiTaskGraph {
    /// An empty graph.
    pub fn new() -> Self {
        Self {
            graph: TaskGraph::new(),
            lanes: Vec::new(),
            signals: Vec::new(),
            touches: Vec::new(),
        }
    }

    /// The underlying single-list graph (lanes of every GPU), for inspection.
    pub fn graph(&self) -> &TaskGraph<'static> {
        &self.graph
    }

    /// A lane on GPU `gpu` of the set (bound to a stream of that GPU at run time).
    pub fn lane(&mut self, name: impl Into<String>, gpu: usize) -> Lane {
        let name = name.into();
        let l = self.graph.lane(format!("{name} (GPU {gpu})"));
        self.lanes.push((l, gpu));
        l
    }

    /// A signal slot whose word lives on GPU `home` of the set.
    pub fn signal(&mut self, name: impl Into<String>, home: usize) -> SignalRef {
        let s = self.graph.signal(name);
        self.signals.push((s, home));
        s
    }

    fn gpu_of(&self, what: &'static str, lane: Lane) -> Result<usize> {
        self.lanes
            .iter()
            .find(|(l, _)| *l == lane)
            .map(|(_, g)| *g)
            .ok_or_else(|| Error::ForeignHandle {
                what,
                detail: "the lane was not made by this MultiTaskGraph".into(),
            })
    }

    fn signal_index(&self, what: &'static str, s: SignalRef) -> Result<usize> {
        self.signals
            .iter()
            .position(|(r, _)| *r == s)
            .ok_or_else(|| Error::ForeignHandle {
                what,
                detail: "the signal slot was not made by this MultiTaskGraph".into(),
            })
    }

    fn touch(&mut self, what: &'static str, lane: Lane, s: SignalRef, label: &str) -> Result<()> {
        let g = self.gpu_of(what, lane)?;
        let i = self.signal_index(what, s)?;
        self.touches.push((g, i, label.to_string()));
        Ok(())
    }

    /// A kernel (or any stream work) on `lane`; see [`TaskGraph::kernel`]. The closure gets the
    /// lane's GPU in [`TaskContext::dev`] and its stream.
    pub fn kernel(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        launch: impl Fn(&TaskContext<'_>) -> Result<()> + Send + Sync + 'static,
    ) -> Result<TaskId> {
        self.gpu_of("MultiTaskGraph::kernel", lane)?;
        self.graph.kernel(lane, label, launch)
    }

    /// An on-stream wait on `signal` ([`TaskGraph::wait`]); the lane's GPU reads the word on the
    /// signal's home GPU.
    pub fn wait(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        signal: SignalRef,
        cmp: Cmp,
        value: u64,
    ) -> Result<TaskId> {
        let label = label.into();
        self.touch("MultiTaskGraph::wait", lane, signal, &label)?;
        self.graph.wait(lane, label, signal, cmp, value)
    }

    /// An on-stream write to `signal` ([`TaskGraph::set`]), possibly to a peer's memory.
    pub fn set(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        signal: SignalRef,
        value: u64,
    ) -> Result<TaskId> {
        let label = label.into();
        self.touch("MultiTaskGraph::set", lane, signal, &label)?;
        self.graph.set(lane, label, signal, value)
    }

    /// An on-stream atomic add to `signal` ([`TaskGraph::add`]), possibly to a peer's memory.
    pub fn add(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        signal: SignalRef,
        value: u64,
    ) -> Result<TaskId> {
        let label = label.into();
        self.touch("MultiTaskGraph::add", lane, signal, &label)?;
        self.graph.add(lane, label, signal, value)
    }

    /// A host callback on `lane` ([`TaskGraph::host`]).
    pub fn graph_host(
        &mut self,
        lane: Lane,
        label: impl Into<String>,
        f: impl FnMut() + Send + 'static,
    ) -> Result<TaskId> {
        self.gpu_of("MultiTaskGraph::host", lane)?;
        self.graph.host(lane, label, f)
    }

    /// `after` does not start before `before` has completed (an event, also across GPUs).
    pub fn depend(&mut self, before: TaskId, after: TaskId) -> Result<()> {
        self.graph.depend(before, after)
    }

    /// Pure-CPU check against a peer matrix (`peer[i][j]`: GPU i can access GPU j's memory, as
    /// [`DeviceSet::peer_matrix`](crate::multi::DeviceSet::peer_matrix)): every signal
    /// operation's GPU can reach the signal's home, then the cross-GPU cycle check and submission
    /// order of [`TaskGraph::check`].
    /// Errors: [`Error::BadShape`] for a GPU outside the matrix, [`Error::PeerAccessUnavailable`],
    /// [`Error::Cycle`], [`Error::UnmatchedWait`], [`Error::WaitMayNotFire`].
    pub fn check(&self, peer: &[Vec<bool>]) -> Result<Plan> {
        let n = peer.len();
        let bad_gpu = |g: usize| Error::BadShape {
            what: "MultiTaskGraph GPUs",
            detail: format!("GPU {g} is used, but the peer matrix has {n} GPUs"),
        };
        for &(_, g) in &self.lanes {
            if g >= n {
                return Err(bad_gpu(g));
            }
        }
        for &(_, g) in &self.signals {
            if g >= n {
                return Err(bad_gpu(g));
            }
        }
        for (g, i, _) in &self.touches {
            let home = self.signals[*i].1;
            if *g != home && !peer[*g][home] {
                return Err(Error::PeerAccessUnavailable {
                    what: "MultiTaskGraph signal operation",
                    from: *g,
                    to: home,
                });
            }
        }
        self.graph.check()
    }
}
