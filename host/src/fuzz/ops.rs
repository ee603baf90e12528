//! The vocabulary of the fuzz programs: the [`Op`]s a fuzz thread runs, a seed's [`Program`],
//! and the limits the generator keeps to. Re-exported by `fuzz::program` (their public path),
//! which generates them; `fuzz::model` simulates them.

use crate::ordering::Cmp;

/// Buffer slots per thread.
pub const SLOTS: u8 = 6;
/// Streams per thread (lanes of its task graphs).
pub const STREAMS: u8 = 3;
/// Captured-graph slots per thread.
pub const GRAPH_SLOTS: u8 = 2;
/// Longest buffer (elements): small, so a seed of 200 ops takes milliseconds.
pub const MAX_LEN: u32 = 4096;
/// Most elements of one pipeline run.
pub const MAX_PIPELINE_ELEMS: u32 = 8192;
/// Largest tensor-core GEMM dimension generated.
pub const MAX_GEMM_DIM: u16 = 192;

/// Element type of a buffer slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    /// `DeviceBuffer<f32>`: holds integer-valued floats (exact sums).
    F32,
    /// `DeviceBuffer<u32>`.
    U32,
}

/// What happens to a fence ticket.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TicketAction {
    /// `submit` with work that succeeds.
    Submit,
    /// `submit` with work that returns an error (the error comes back; the ticket is released).
    SubmitErr,
    /// `submit` with work that panics (the panic propagates; the ticket is released).
    SubmitPanic,
    /// `submit` from a second thread.
    SubmitElsewhere,
    /// Dropped unsubmitted (releases the caller).
    Drop,
    /// `mem::forget`: the caller stays blocked until `synchronize_timeout(.., Release)`.
    Forget,
}

/// One task of a generated [`GraphSpec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GTask {
    /// `TaskGraph::set`.
    Set { lane: u8, sig: u8, value: u64 },
    /// `TaskGraph::add`.
    Add { lane: u8, sig: u8, value: u64 },
    /// `TaskGraph::wait`.
    Wait {
        lane: u8,
        sig: u8,
        cmp: Cmp,
        value: u64,
    },
    /// `TaskGraph::host`: counts its runs.
    Host { lane: u8 },
    /// `TaskGraph::kernel`: a closure that counts its calls and enqueues nothing, or fails.
    Kernel { lane: u8, fail: bool },
}

/// What a generated graph is, by construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphClass {
    /// Every wait fires in every legal interleaving: `check` must accept it.
    Valid,
    /// A wait on a signal nothing writes.
    Unreachable,
    /// A wait whose only producer comes after it on the same lane.
    ProducerAfterWait,
    /// Two tasks that depend on each other.
    Cycle,
    /// Item 7: set 5, set 0, then a wait >= 5 ordered after both.
    Overwritten,
    /// Item 7: set 5, set 7, then a wait == 5 ordered after both.
    OverwrittenEq,
    /// Item 7: add 1, add u64::MAX, add 1 (wrapping to 1), then a wait >= 2 after all (on one
    /// lane, or spread over lanes with dependencies).
    WrappingAdd,
}

impl GraphClass {
    /// True for the graphs `TaskGraph::check` must refuse (a wait that can never fire, or a
    /// cycle).
    pub fn must_refuse(self) -> bool {
        self != GraphClass::Valid
    }

    /// True for the classes of issue 19 item 7 (overwrites and wrapping adds).
    pub fn is_item7(self) -> bool {
        matches!(
            self,
            GraphClass::Overwritten | GraphClass::OverwrittenEq | GraphClass::WrappingAdd
        )
    }
}

/// A task graph to build: `lanes` lanes (thread streams `0..lanes`), `signals` signal slots,
/// tasks in creation order and explicit dependencies `(before, after)` between task indices.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GraphSpec {
    pub lanes: u8,
    pub signals: u8,
    pub tasks: Vec<GTask>,
    pub deps: Vec<(u16, u16)>,
    pub class: GraphClass,
}

impl GraphSpec {
    /// Host tasks (each runs once per run).
    pub fn hosts(&self) -> u64 {
        self.tasks
            .iter()
            .filter(|t| matches!(t, GTask::Host { .. }))
            .count() as u64
    }

    /// Kernel tasks.
    pub fn kernels(&self) -> u64 {
        self.tasks
            .iter()
            .filter(|t| matches!(t, GTask::Kernel { .. }))
            .count() as u64
    }

    /// True if a kernel task fails on purpose.
    pub fn fails(&self) -> bool {
        self.tasks
            .iter()
            .any(|t| matches!(t, GTask::Kernel { fail: true, .. }))
    }
}

/// How a one-off graph op runs its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GraphMode {
    /// `TaskGraph::check` only.
    CheckOnly,
    /// `TaskGraph::enqueue`, then a bounded wait on the run.
    Enqueue,
    /// `TaskGraph::run_captured`, then a bounded wait on the run.
    RunCaptured,
}

/// What a module op does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ModuleAction {
    /// `Device::load_module` of a one-entry PTX into the thread's module slot (replacing it).
    Load,
    /// `Device::load_module` of text with a NUL byte (`PtxNul`).
    LoadNul,
    /// `Device::load_module` of text that is not PTX (`Cuda`, or `WaitPending`).
    LoadGarbage,
    /// `Module::untyped_kernel` of its entry (`Ok`) or of a missing name (`MissingKernel`).
    Kernel { missing: bool },
    /// Drops the module.
    Drop,
}

/// One safe call (or a few that belong together) of a fuzz thread. Slots, streams and graph
/// slots are indices into the thread's own tables; an op on an empty slot is skipped.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `MemPool::alloc_async` of `len` elements on stream `stream` into `slot` (the old buffer
    /// is dropped first). `len == 0` must give `Empty`.
    Alloc {
        slot: u8,
        elem: Elem,
        len: u32,
        stream: u8,
    },
    /// Drops the buffer (a stream-ordered free).
    Free { slot: u8 },
    /// `fill_async(value)` (`value as f32` for float buffers).
    Fill { slot: u8, value: i32 },
    /// `copy_from_host` of `len + extra` generated values (`extra != 0`: `LengthMismatch`).
    Upload { slot: u8, seed: u32, extra: i8 },
    /// Bounded wait, `copy_to_host`, compare every known element with the model.
    Read { slot: u8 },
    /// `view(start..end)` (`LengthMismatch` out of range).
    View { slot: u8, start: u32, end: u32 },
    /// `dst.copy_from_device(src)` (`LengthMismatch`, `WrongStream`).
    CopyD2D { dst: u8, src: u8 },
    /// `move_to_stream`.
    Move { slot: u8, stream: u8 },
    /// `vector_add` (`grid: None`) or `vector_add_with_grid` on stream `stream` over
    /// `a[off..off+len]`, `b[off..off+len]`, `c[off..off+c_len]`.
    VectorAdd {
        a: u8,
        b: u8,
        c: u8,
        off: u32,
        len: u32,
        c_len: u32,
        grid: Option<u32>,
        stream: u8,
    },
    /// `BatchPipeline::new(streams)` and `run_vector_add` over `n` generated floats in batches of
    /// `batch_elems`, into a C of `n + c_extra` elements.
    Pipeline {
        streams: u8,
        n: u32,
        batch_elems: u32,
        c_extra: i8,
        seed: u32,
    },
    /// A `Chain` of `steps` `chain_step`s over the u32 buffer in `slot` on stream `stream`: run
    /// once (`replays == 0`) or captured and replayed `replays` times.
    Chain {
        slot: u8,
        stream: u8,
        steps: u8,
        grid: u32,
        pdl: bool,
        replays: u8,
    },
    /// `Fence::guard` on stream `stream` of the run's shared fence, then `action`, then a bounded
    /// wait on the stream.
    Fence { stream: u8, action: TicketAction },
    /// `Signal::set` of the thread's signal on `stream`, then a bounded wait.
    SignalSet { stream: u8, value: u64 },
    /// `Signal::add`, then a bounded wait.
    SignalAdd { stream: u8, value: u64 },
    /// `Signal::wait_until`, then a bounded wait: `Ok` if the model's value satisfies it, else a
    /// `Timeout` released by `OnTimeout::Release` (which writes a satisfying value).
    SignalWait { stream: u8, cmp: Cmp, value: u64 },
    /// `Signal::read`, compared with the model.
    SignalRead,
    /// A one-off task graph on the thread's streams and fresh signals.
    Graph { spec: GraphSpec, mode: GraphMode },
    /// `TaskGraph::capture` into graph slot `gslot` (replacing it).
    Capture { gslot: u8, spec: GraphSpec },
    /// `CapturedGraph::launch`; `wait`: bounded wait for this and earlier replays, then the
    /// host-callback count is compared.
    Replay { gslot: u8, wait: bool },
    /// Drops the captured graph (replays may still be in flight).
    DropCaptured { gslot: u8 },
    /// Tensor-core GEMM `C (m x n, f32) = A (m x k, bf16) B (n x k stored, bf16)` on stream
    /// `stream`; `bad_pitch`: A's pitch is `k + 1` (`PitchAlignment`); `fresh`: a `TcGemm` of its
    /// own (module load and unload) instead of the run's shared one.
    TcGemm {
        m: u16,
        n: u16,
        k: u16,
        stream: u8,
        seed: u32,
        bad_pitch: bool,
        fresh: bool,
    },
    /// `trace::Recorder::new` + `install` (kept by the thread), or dropping the guard.
    Trace { install: bool },
    /// A module load, lookup or drop.
    Module(ModuleAction),
    /// `synchronize_timeout` of one stream.
    Sync { stream: u8 },
}

impl Op {
    /// Short name of the op's kind (counts, minimiser).
    pub fn kind(&self) -> &'static str {
        match self {
            Op::Alloc { .. } => "alloc",
            Op::Free { .. } => "free",
            Op::Fill { .. } => "fill",
            Op::Upload { .. } => "upload",
            Op::Read { .. } => "read",
            Op::View { .. } => "view",
            Op::CopyD2D { .. } => "copy_d2d",
            Op::Move { .. } => "move",
            Op::VectorAdd { .. } => "vector_add",
            Op::Pipeline { .. } => "pipeline",
            Op::Chain { .. } => "chain",
            Op::Fence { .. } => "fence",
            Op::SignalSet { .. } => "signal_set",
            Op::SignalAdd { .. } => "signal_add",
            Op::SignalWait { .. } => "signal_wait",
            Op::SignalRead => "signal_read",
            Op::Graph { .. } => "graph",
            Op::Capture { .. } => "capture",
            Op::Replay { .. } => "replay",
            Op::DropCaptured { .. } => "drop_captured",
            Op::TcGemm { .. } => "tc_gemm",
            Op::Trace { .. } => "trace",
            Op::Module(_) => "module",
            Op::Sync { .. } => "sync",
        }
    }
}

/// A seed's program: one op list per thread.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Program {
    pub seed: u64,
    pub threads: Vec<Vec<Op>>,
}

impl Program {
    /// Ops in all threads.
    pub fn len(&self) -> usize {
        self.threads.iter().map(Vec::len).sum()
    }

    /// True when no thread has an op.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The program as text, one op per line, grouped by thread (what a failure prints).
    pub fn listing(&self) -> String {
        let mut s = format!("program of seed {}:\n", self.seed);
        for (t, ops) in self.threads.iter().enumerate() {
            s.push_str(&format!("  thread {t}: {} ops\n", ops.len()));
            for (i, op) in ops.iter().enumerate() {
                s.push_str(&format!("    {i:>3}: {op:?}\n"));
            }
        }
        s
    }
}
