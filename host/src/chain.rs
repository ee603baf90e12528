//! `Chain`: a sequence of dependent kernel launches on one stream, each launched with
//! Programmatic Dependent Launch (or not, per chain), runnable directly or captured into a CUDA
//! graph and replayed.
//!
//! Direct runs issue one `cuLaunchKernelEx` per step with the configurations built once at push
//! time. [`Chain::capture`] records the same launches with stream capture
//! (`cuStreamBeginCapture_v2` / `cuStreamEndCapture`, thread-local mode) and instantiates them
//! (`cuGraphInstantiateWithFlags`); a launch with
//! `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION` becomes a graph edge of type
//! `CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC` (CUDA driver API, "Graph Management"; counted by
//! [`Graph::programmatic_edges`]), so PDL survives capture.
//!
//! Every kernel of a PDL chain must `griddepcontrol.wait` before touching memory the previous
//! step touches (see `gpu/src/device/pdl.rs`); warpline's `chain_step` does.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr::null_mut;

use cudarc::driver::sys;

use crate::device::Device;
use crate::driver::graph::{self as dg, CaptureGuard, CudaGraph, GraphExec};
use crate::error::{Error, Result};
use crate::kernels::pdl::{chain_step_checked, require_pdl};
use crate::launch::{LaunchConfig, LaunchLimits};
use crate::loaded::Kernel;
use crate::memory::DeviceViewMut;
use crate::stream::Stream;
use crate::trace::Stage;
use warpline_gpu::contract::pdl as contract;

/// Most kernel parameters a step may have.
pub const MAX_ARGS: usize = 24;

/// Most launches a chain may hold (each is one node of a captured graph).
pub const MAX_STEPS: usize = 1 << 20;

/// One kernel parameter of a [`Chain`] step, passed by value: `U32` for 32-bit scalars, `U64`
/// for 64-bit scalars and device pointers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelArg {
    /// A 32-bit parameter (`u32`, `i32`, `f32` bits).
    U32(u32),
    /// A 64-bit parameter (`u64`, device pointer).
    U64(u64),
}

impl KernelArg {
    fn as_param(&self) -> *mut c_void {
        match self {
            KernelArg::U32(v) => v as *const u32 as *mut c_void,
            KernelArg::U64(v) => v as *const u64 as *mut c_void,
        }
    }
}

/// One launch of a chain, in the driver's layout, built once.
struct Step {
    func: sys::CUfunction,
    /// `config.attrs` points into `attrs`' heap buffer, which never changes after construction.
    config: sys::CUlaunchConfig,
    _attrs: Vec<sys::CUlaunchAttribute>,
    args: Vec<KernelArg>,
    /// The kernel of a module other than the device's ([`Chain::push_kernel`]): keeps that
    /// module loaded while the step (or a graph captured from it) may launch `func`.
    _keep: Option<Kernel>,
}

impl Step {
    fn new(func: sys::CUfunction, cfg: &LaunchConfig, stream: &Stream, args: &[KernelArg]) -> Self {
        let mut attrs = cfg.attributes();
        let config = cfg.driver_config(stream.raw(), &mut attrs);
        Self {
            func,
            config,
            _attrs: attrs,
            args: args.to_vec(),
            _keep: None,
        }
    }

    /// Launches the step on `stream` (the chain's, or the private stream of a capture whose
    /// graph is replayed only on the chain's stream).
    ///
    /// # Safety
    /// The step's kernel, arguments and configuration form a valid launch (the constructors'
    /// contract) for the chain's stream, `stream` is it or such a capture stream, and the context
    /// is current.
    unsafe fn launch(&self, stream: sys::CUstream) -> Result<()> {
        let mut params = [null_mut::<c_void>(); MAX_ARGS];
        for (p, a) in params.iter_mut().zip(&self.args) {
            *p = a.as_param();
        }
        let n = self.args.len();
        // A copy: `attrs` still points into `_attrs`, alive for the call.
        let mut config = self.config;
        config.hStream = stream;
        crate::driver::core::launch_kernel_ex(&config, self.func, &mut params[..n])
    }
}

/// A sequence of dependent kernel launches on one stream.
///
/// Lifetime `'a`: the device and every buffer the steps use are borrowed for the chain's life,
/// so neither a direct run nor a replay of a captured [`Graph`] can outlive them.
pub struct Chain<'a> {
    dev: &'a Device,
    stream: Stream,
    pdl: bool,
    steps: Vec<Step>,
    _buffers: PhantomData<&'a mut ()>,
}

impl<'a> Chain<'a> {
    /// An empty chain on `stream`; `pdl`: launch every step with the PDL attribute.
    ///
    /// Errors: [`Error::WrongContext`] for a stream of another context than `dev`'s;
    /// [`Error::PdlUnsupported`] when `pdl` is asked on a device below compute capability 9.0.
    pub fn new(dev: &'a Device, stream: &Stream, pdl: bool) -> Result<Self> {
        if stream.context_raw() != dev.raw_context() {
            return Err(Error::WrongContext {
                what: "Chain::new (the stream belongs to another context than the device's)",
            });
        }
        require_pdl(dev, pdl)?;
        Ok(Self {
            dev,
            stream: stream.clone(),
            pdl,
            steps: Vec::new(),
            _buffers: PhantomData,
        })
    }

    /// Whether the steps are launched with PDL.
    pub fn pdl(&self) -> bool {
        self.pdl
    }

    /// Launches in the chain.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// True for a chain without launches.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The chain's stream.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Appends `count` `chain_step` kernels over `x` (`x[i] += 1` each, so a run adds `count`
    /// to every element, wrapping), each `grid` CTAs of `CHAIN_STEP_THREADS` threads.
    ///
    /// Errors: [`Error::TooLarge`] when the chain would hold more than [`MAX_STEPS`] launches
    /// (checked before anything is reserved), [`Error::Empty`] (empty `x`), [`Error::BadShape`]
    /// (grid 0 or above 2^31 - 1), [`Error::WrongStream`] (`x` not on the chain's stream).
    pub fn push_chain_steps(
        &mut self,
        x: DeviceViewMut<'a, u32>,
        count: usize,
        grid: u32,
    ) -> Result<()> {
        self.check_room(count)?;
        let cfg = chain_step_checked(self.dev, &self.stream, &x, grid, self.pdl)?;
        let func = self.dev.kernel(contract::CHAIN_STEP_KERNEL)?.cu_function();
        let args = [
            KernelArg::U64(x.device_ptr()),
            KernelArg::U64(x.len() as u64),
        ];
        self.steps.reserve(count);
        for _ in 0..count {
            self.steps.push(Step::new(func, &cfg, &self.stream, &args));
        }
        Ok(())
    }

    /// [`Error::TooLarge`] unless `more` launches fit under [`MAX_STEPS`].
    fn check_room(&self, more: usize) -> Result<()> {
        let total = self.steps.len().checked_add(more);
        match total {
            Some(t) if t <= MAX_STEPS => Ok(()),
            _ => Err(Error::TooLarge {
                what: "chain launches",
                value: u64::try_from(total.unwrap_or(usize::MAX)).unwrap_or(u64::MAX),
                max: MAX_STEPS as u64,
            }),
        }
    }

    /// Appends a launch of `kernel` with `cfg` (its `pdl` flag is replaced by the chain's) and
    /// `args`.
    ///
    /// Errors: [`Error::MissingKernel`], [`Error::TooLarge`] (more than [`MAX_ARGS`]
    /// arguments, or more than [`MAX_STEPS`] launches), the errors of [`LaunchConfig::validate`].
    ///
    /// # Safety
    /// `args` match the kernel's parameters in number, order and size; every memory access of
    /// the kernel with them stays in allocations that live for `'a`, are used on the chain's
    /// stream, and are not accessed by the host while the chain or its graph runs; when the
    /// chain uses PDL, the kernel may start while its predecessors still run, so before its
    /// `griddepcontrol.wait` it neither reads memory they write, nor writes memory they read or
    /// write (as [`crate::launch::launch_raw`]'s PDL clause).
    pub unsafe fn push_raw(
        &mut self,
        kernel: &'static str,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        let dev = self.dev;
        let k = dev.kernel(kernel)?;
        self.push_step(kernel, k, None, cfg, args)
    }

    /// The checks and the step of [`Chain::push_raw`] and [`Chain::push_kernel`]: at most
    /// [`MAX_ARGS`] arguments, room for one more step, `cfg` (with the chain's PDL flag) within
    /// `kernel`'s limits; `keep` is held by the step.
    fn push_step(
        &mut self,
        name: &'static str,
        kernel: &Kernel,
        keep: Option<Kernel>,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        if args.len() > MAX_ARGS {
            return Err(Error::TooLarge {
                what: "chain step arguments",
                value: args.len() as u64,
                max: MAX_ARGS as u64,
            });
        }
        self.check_room(1)?;
        let cfg = cfg.with_pdl(self.pdl);
        cfg.check(name, &LaunchLimits::of(self.dev, kernel))?;
        let mut step = Step::new(kernel.cu_function(), &cfg, &self.stream, args);
        step._keep = keep;
        self.steps.push(step);
        Ok(())
    }

    /// Appends a launch of `kernel`, an entry of any module loaded into the chain's device
    /// context (e.g. [`crate::kernels::tc_gemm::TcGemm`]'s sm_90a module), with `cfg` (its
    /// `pdl` flag replaced by the chain's; clusters allowed) and `args`. The step holds a clone
    /// of `kernel`, so its module stays loaded while the chain or a graph captured from it lives.
    ///
    /// Errors: [`Error::WrongContext`] (a kernel of another context), [`Error::TooLarge`] (as
    /// [`Chain::push_raw`]), the errors of [`LaunchConfig::check`] against the kernel's limits.
    ///
    /// # Safety
    /// As [`Chain::push_raw`].
    pub unsafe fn push_kernel(
        &mut self,
        name: &'static str,
        kernel: &Kernel,
        cfg: LaunchConfig,
        args: &[KernelArg],
    ) -> Result<()> {
        if kernel.context_raw() != self.dev.raw_context() {
            return Err(Error::WrongContext {
                what: "Chain::push_kernel (a kernel of another context's module)",
            });
        }
        self.push_step(name, kernel, Some(kernel.clone()), cfg, args)
    }

    /// # Safety
    /// `stream` is the chain's stream, or a private stream capturing a graph that is replayed
    /// only on the chain's stream.
    unsafe fn launch_all(&self, stream: &Stream) -> Result<()> {
        for step in &self.steps {
            // SAFETY: steps are built by the checked constructors above (typed or `push_raw`'s
            // contract); the context was bound by the caller; `stream` as this fn's contract.
            unsafe { step.launch(stream.raw()) }?;
        }
        Ok(())
    }

    /// Queues every launch of the chain on its stream, in order (no host synchronisation).
    pub fn run(&self) -> Result<()> {
        self.dev.bind()?;
        // Trace hook (issue 12): one span per run; events between PDL launches would serialise them.
        let name = || format!("chain: {} launches, pdl {}", self.steps.len(), self.pdl);
        let tr = crate::trace::active();
        let r = crate::trace::traced(tr.as_ref(), &self.stream, Stage::Launch, name, || {
            // SAFETY: the chain's own stream.
            unsafe { self.launch_all(&self.stream) }
        });
        // Every step is a kernel of the device's module: it stays loaded until they completed,
        // even if the device is dropped first (issue 19, item 4).
        self.dev.module().inner.launched_on(&self.stream);
        r
    }

    /// Captures the chain into a CUDA graph and instantiates it; [`Graph::launch`] replays it on
    /// the chain's stream. PDL launches become programmatic edges.
    ///
    /// The capture runs on a private stream made for it (issue 19, item 2), never on the chain's
    /// stream: work that another thread queues on the chain's stream meanwhile runs normally and
    /// is not captured, and the chain's stream may itself be capturing elsewhere.
    ///
    /// Errors: [`Error::Cuda`] naming the failing call (`cuStreamCreate`,
    /// `cuStreamBeginCapture`, `cuLaunchKernelEx`, `cuStreamEndCapture`,
    /// `cuGraphInstantiateWithFlags`); [`Error::WaitPending`] when an on-stream wait stayed
    /// pending for `Device::STREAM_CREATE_WAIT` (the instantiation, which can wait for the device
    /// inside the driver, runs only while none is); capture is ended and the partial graph freed
    /// on every error path.
    pub fn capture(&self) -> Result<Graph<'_>> {
        self.dev.bind()?;
        // A spare stream of the context's stock (no cuStreamCreate behind a pending wait).
        let spare = crate::stream::SpareStream::take_in(self.dev.context())?;
        let private = spare.stream().clone();
        let guard = CaptureGuard::begin(private.cudarc(), Vec::new())?;
        // An error (or a panic) here drops `guard`, which ends the capture.
        // SAFETY: a private stream nobody else reaches, capturing a graph replayed only on the
        // chain's stream (Graph::launch).
        unsafe { self.launch_all(&private) }?;
        let graph = guard.end()?;
        let exec =
            crate::reaper::without_pending_waits("Chain::capture (cuGraphInstantiate)", || {
                GraphExec::instantiate(&graph)
            })?;
        Ok(Graph {
            dev: self.dev,
            stream: self.stream.clone(),
            exec,
            graph,
            nodes: self.steps.len(),
            _chain: PhantomData,
        })
    }
}

/// An instantiated CUDA graph of a [`Chain`], replayed on the chain's stream. Borrows the chain,
/// so the buffers its kernels use outlive it. Drop destroys the executable graph and the graph
/// (`cuGraphExecDestroy`, `cuGraphDestroy`; replays in flight complete first). Not `Sync`: one
/// executable graph must not be launched from two threads at once.
pub struct Graph<'c> {
    dev: &'c Device,
    stream: Stream,
    // Field order: the executable graph is destroyed before the graph it came from.
    exec: GraphExec,
    graph: CudaGraph,
    nodes: usize,
    _chain: PhantomData<&'c ()>,
}

impl Graph<'_> {
    /// Queues one replay of the whole chain on the chain's stream (`cuGraphLaunch`).
    pub fn launch(&self) -> Result<()> {
        self.dev.bind()?;
        let name = || format!("chain graph replay: {} kernel nodes", self.nodes);
        let tr = crate::trace::active();
        let r = crate::trace::traced(tr.as_ref(), &self.stream, Stage::Launch, name, || {
            // SAFETY: a valid executable graph; its kernels' buffers outlive `self` (borrow of
            // the chain, which borrows them).
            unsafe { self.exec.launch(self.stream.raw()) }
        });
        // The nodes are kernels of the device's module: it stays loaded until the replay
        // completed, even if the graph and the device are dropped first (issue 19, item 4).
        self.dev.module().inner.launched_on(&self.stream);
        r
    }

    /// Kernel nodes captured (one per chain step).
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// Edges of the graph of type `CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC` (`cuGraphGetEdges_v2`):
    /// `len - 1` for a PDL chain, 0 for a plain one.
    pub fn programmatic_edges(&self) -> Result<usize> {
        self.dev.bind()?;
        let mut count = 0usize;
        // SAFETY: null arrays ask for the count only.
        unsafe {
            dg::graph_get_edges(
                self.graph.raw(),
                null_mut(),
                null_mut(),
                null_mut(),
                &mut count,
            )
        }?;
        let mut from = vec![null_mut(); count];
        let mut to = vec![null_mut(); count];
        // SAFETY: zero is a valid edge-data value; arrays of `count` entries.
        let mut data: Vec<sys::CUgraphEdgeData> = vec![unsafe { std::mem::zeroed() }; count];
        // SAFETY: three arrays of `count` entries each.
        unsafe {
            dg::graph_get_edges(
                self.graph.raw(),
                from.as_mut_ptr(),
                to.as_mut_ptr(),
                data.as_mut_ptr(),
                &mut count,
            )
        }?;
        let programmatic = sys::CUgraphDependencyType::CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC as u8;
        Ok(data[..count]
            .iter()
            .filter(|d| d.type_ == programmatic)
            .count())
    }
}

impl Drop for Graph<'_> {
    fn drop(&mut self) {
        // Bind the context for the handles' own drops (executable graph first, then the graph);
        // replays in flight complete first (cuGraphExecDestroy). Failures cannot be reported.
        let _ = self.dev.bind();
    }
}

/// Finding 9 (issue 9), checked at compile time: a captured chain is launched from one thread at a
/// time.
#[cfg(test)]
mod finding_09_chain_graph_is_not_sync {
    static_assertions::assert_not_impl_any!(super::Graph<'static>: Sync);
}
