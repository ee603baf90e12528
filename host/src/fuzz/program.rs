//! Seeded programs of safe warpline calls: the [`Op`]s each fuzz thread runs, and their
//! generation from a seed (pure CPU, deterministic: the same seed, op count and thread count give
//! the same [`Program`] on every machine).
//!
//! Generation keeps a [`ThreadModel`] of the thread's state so that most ops are valid (reads of
//! live buffers, adds of float buffers on one stream); a share of them are invalid on purpose
//! (wrong lengths, wrong streams, grid 0, misaligned views, waits that never fire, graphs that
//! `check` must refuse), and the model says which typed error each must return. Any op is
//! meaningful in any state (an op on an empty slot is skipped), so the minimiser may drop ops
//! freely.

use crate::ordering::Cmp;
use crate::rng::{rng_for, StdRng};

use super::model::{Caps, ThreadModel};

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

/// The program of `seed`: `threads` threads of `ops` ops each (`ops` split as evenly as
/// possible, every thread at least one op when `ops >= threads`).
pub fn generate(seed: u64, ops: usize, threads: usize) -> Program {
    let threads = threads.max(1);
    Program {
        seed,
        threads: (0..threads)
            .map(|t| {
                let n = ops / threads + usize::from(t < ops % threads);
                generate_thread(seed, t, n)
            })
            .collect(),
    }
}

/// Signal waits that never fire are generated in programs of any thread count: releasing one
/// (`synchronize_timeout`, `OnTimeout::Release`) makes driver calls, which on the H100 once
/// blocked behind another thread's synchronous copy queued behind the pending wait; host copies
/// now poll instead (`memory::staging`, issue 19).
fn generate_thread(seed: u64, t: usize, n: usize) -> Vec<Op> {
    let mut rng = rng_for(seed, 0xF022, t as u64);
    // The generator's view: every feature present (the executor's model knows the device).
    let mut model = ThreadModel::new(Caps::all());
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        let op = gen_op(&mut rng, &model);
        model.step(&op);
        ops.push(op);
    }
    ops
}

/// Weighted op kinds: (weight, kind index).
const WEIGHTS: [(u32, u8); 23] = [
    (12, 0), // alloc
    (4, 1),  // free
    (6, 2),  // fill
    (8, 3),  // upload
    (12, 4), // read
    (3, 5),  // view
    (5, 6),  // copy d2d
    (3, 7),  // move
    (12, 8), // vector add
    (2, 9),  // pipeline
    (4, 10), // chain
    (3, 11), // fence
    (2, 12), // signal set
    (2, 13), // signal add
    (2, 14), // signal wait
    (1, 15), // signal read
    (4, 16), // graph
    (2, 17), // capture
    (3, 18), // replay
    (1, 19), // drop captured
    (1, 20), // tc gemm
    (1, 21), // trace
    (2, 22), // module / sync
];

fn pick<T: Copy>(rng: &mut StdRng, items: &[T]) -> Option<T> {
    if items.is_empty() {
        None
    } else {
        Some(items[rng.random_range(0..items.len())])
    }
}

fn slot_any(rng: &mut StdRng) -> u8 {
    rng.random_range(0..SLOTS)
}

fn stream_any(rng: &mut StdRng) -> u8 {
    rng.random_range(0..STREAMS)
}

/// A live slot of `elem` (any live slot when `None`), else any slot.
fn slot_of(rng: &mut StdRng, model: &ThreadModel, elem: Option<Elem>) -> u8 {
    let live: Vec<u8> = (0..SLOTS)
        .filter(|&s| {
            model
                .buf(s)
                .is_some_and(|b| elem.is_none_or(|e| b.elem == e))
        })
        .collect();
    pick(rng, &live).unwrap_or_else(|| slot_any(rng))
}

fn gen_op(rng: &mut StdRng, model: &ThreadModel) -> Op {
    let total: u32 = WEIGHTS.iter().map(|w| w.0).sum();
    let mut r = rng.random_range(0..total);
    let mut kind = 0;
    for (w, k) in WEIGHTS {
        if r < w {
            kind = k;
            break;
        }
        r -= w;
    }
    match kind {
        0 => {
            let elem = if rng.random_bool(0.6) {
                Elem::F32
            } else {
                Elem::U32
            };
            let len = if rng.random_bool(0.02) {
                0
            } else if rng.random_bool(0.5) {
                rng.random_range(1..=64)
            } else {
                rng.random_range(1..=MAX_LEN)
            };
            Op::Alloc {
                slot: slot_any(rng),
                elem,
                len,
                stream: stream_any(rng),
            }
        }
        1 => Op::Free {
            slot: slot_of(rng, model, None),
        },
        2 => Op::Fill {
            slot: slot_of(rng, model, None),
            value: rng.random_range(0..=2000u32) as i32 - 1000,
        },
        3 => Op::Upload {
            slot: slot_of(rng, model, None),
            seed: rng.random(),
            extra: if rng.random_bool(0.05) {
                if rng.random_bool(0.5) {
                    1
                } else {
                    -1
                }
            } else {
                0
            },
        },
        4 => Op::Read {
            slot: slot_of(rng, model, None),
        },
        5 => {
            let slot = slot_of(rng, model, None);
            let len = model.buf(slot).map_or(16, |b| b.data.len() as u32);
            let start = rng.random_range(0..=len + 2);
            let end = rng.random_range(0..=len + 2);
            Op::View { slot, start, end }
        }
        6 => {
            let elem = if rng.random_bool(0.5) {
                Elem::F32
            } else {
                Elem::U32
            };
            Op::CopyD2D {
                dst: slot_of(rng, model, Some(elem)),
                src: slot_of(rng, model, Some(elem)),
            }
        }
        7 => Op::Move {
            slot: slot_of(rng, model, None),
            stream: stream_any(rng),
        },
        8 => gen_vector_add(rng, model),
        9 => {
            let n = rng.random_range(1..=MAX_PIPELINE_ELEMS);
            let batch_elems = if rng.random_bool(0.05) {
                0
            } else {
                rng.random_range(1..=n.min(2048))
            };
            Op::Pipeline {
                streams: rng.random_range(1..=4u8),
                n,
                batch_elems,
                c_extra: if rng.random_bool(0.05) { 1 } else { 0 },
                seed: rng.random(),
            }
        }
        10 => {
            let slot = slot_of(rng, model, Some(Elem::U32));
            let on = model.buf(slot).map(|b| b.stream);
            let stream = match on {
                Some(s) if rng.random_bool(0.9) => s,
                _ => stream_any(rng),
            };
            Op::Chain {
                slot,
                stream,
                steps: rng.random_range(1..=8u8),
                grid: if rng.random_bool(0.05) {
                    0
                } else {
                    rng.random_range(1..=4u32)
                },
                pdl: rng.random_bool(0.5),
                replays: rng.random_range(0..=3u8),
            }
        }
        11 => {
            let action = match rng.random_range(0..20u32) {
                0..=6 => TicketAction::Submit,
                7..=9 => TicketAction::SubmitElsewhere,
                10..=14 => TicketAction::Drop,
                15..=16 => TicketAction::SubmitErr,
                17..=18 => TicketAction::SubmitPanic,
                _ => TicketAction::Forget,
            };
            Op::Fence {
                stream: stream_any(rng),
                action,
            }
        }
        12 => Op::SignalSet {
            stream: stream_any(rng),
            value: rng.random_range(0..=100u64),
        },
        13 => Op::SignalAdd {
            stream: stream_any(rng),
            value: rng.random_range(0..=10u64),
        },
        14 => {
            let v = model.signal();
            // Mostly waits that fire; one in ten never fires (released on timeout; see
            // generate_thread).
            let (cmp, value) = if rng.random_bool(0.9) {
                match rng.random_range(0..3u32) {
                    0 => (Cmp::Geq, rng.random_range(0..=v)),
                    1 => (Cmp::Eq, v),
                    _ => (Cmp::Nor, 0),
                }
            } else {
                (Cmp::Geq, v + rng.random_range(1..=5u64))
            };
            Op::SignalWait {
                stream: stream_any(rng),
                cmp,
                value,
            }
        }
        15 => Op::SignalRead,
        16 => Op::Graph {
            spec: gen_graph(rng),
            mode: match rng.random_range(0..4u32) {
                0 => GraphMode::CheckOnly,
                1 => GraphMode::RunCaptured,
                _ => GraphMode::Enqueue,
            },
        },
        17 => {
            let mut spec = gen_graph(rng);
            if rng.random_bool(0.8) {
                spec = valid_graph(rng);
            }
            Op::Capture {
                gslot: rng.random_range(0..GRAPH_SLOTS),
                spec,
            }
        }
        18 => Op::Replay {
            gslot: rng.random_range(0..GRAPH_SLOTS),
            wait: rng.random_bool(0.6),
        },
        19 => Op::DropCaptured {
            gslot: rng.random_range(0..GRAPH_SLOTS),
        },
        20 => {
            let m = rng.random_range(1..=MAX_GEMM_DIM);
            let n = rng.random_range(1..=MAX_GEMM_DIM / 8) * 8;
            let k = rng.random_range(1..=MAX_GEMM_DIM / 8) * 8;
            Op::TcGemm {
                m,
                n,
                k,
                stream: stream_any(rng),
                seed: rng.random(),
                bad_pitch: rng.random_bool(0.1),
                fresh: rng.random_bool(0.1),
            }
        }
        21 => Op::Trace {
            install: rng.random_bool(0.5),
        },
        _ => {
            if rng.random_bool(0.5) {
                Op::Sync {
                    stream: stream_any(rng),
                }
            } else {
                Op::Module(match rng.random_range(0..10u32) {
                    0..=3 => ModuleAction::Load,
                    4 => ModuleAction::LoadNul,
                    5 => ModuleAction::LoadGarbage,
                    6..=7 => ModuleAction::Kernel {
                        missing: rng.random_bool(0.3),
                    },
                    _ => ModuleAction::Drop,
                })
            }
        }
    }
}

fn gen_vector_add(rng: &mut StdRng, model: &ThreadModel) -> Op {
    let a = slot_of(rng, model, Some(Elem::F32));
    let b = if rng.random_bool(0.2) {
        a
    } else {
        slot_of(rng, model, Some(Elem::F32))
    };
    let c = slot_of(rng, model, Some(Elem::F32));
    let min_len = [a, b, c]
        .iter()
        .map(|&s| model.buf(s).map_or(0, |b| b.data.len() as u32))
        .min()
        .unwrap_or(0);
    let stream = match model.buf(a) {
        Some(buf) if rng.random_bool(0.9) => buf.stream,
        _ => stream_any(rng),
    };
    // Offsets in whole 16-byte vectors, except 5% misaligned ones.
    let mut off = if min_len > 4 && rng.random_bool(0.3) {
        rng.random_range(0..min_len / 4) * 4
    } else {
        0
    };
    if rng.random_bool(0.05) {
        off += 1;
    }
    let room = min_len.saturating_sub(off);
    let len = if rng.random_bool(0.03) {
        room + 1 // out of range
    } else if rng.random_bool(0.03) || room == 0 {
        0
    } else {
        rng.random_range(1..=room)
    };
    let c_len = if rng.random_bool(0.04) && len > 1 {
        len - 1
    } else {
        len
    };
    let grid = match rng.random_range(0..20u32) {
        0 => Some(0),
        1..=4 => Some(rng.random_range(1..=3u32)),
        _ => None,
    };
    Op::VectorAdd {
        a,
        b,
        c,
        off,
        len,
        c_len,
        grid,
        stream,
    }
}

/// A random graph: valid four times in five, else one of the refused classes.
pub(crate) fn gen_graph(rng: &mut StdRng) -> GraphSpec {
    if rng.random_bool(0.8) {
        return valid_graph(rng);
    }
    let class = match rng.random_range(0..6u32) {
        0 => GraphClass::Unreachable,
        1 => GraphClass::ProducerAfterWait,
        2 => GraphClass::Cycle,
        3 => GraphClass::Overwritten,
        4 => GraphClass::OverwrittenEq,
        _ => GraphClass::WrappingAdd,
    };
    refused_graph(rng, class)
}

/// A graph whose waits fire in every interleaving: per signal either exactly one set (waits `==`
/// or `>=` its value, each ordered after it), or only adds of 1..=5 (each wait `>=` the sum of
/// the adds it is ordered after), every producer of a signal created before its first wait;
/// host and kernel tasks anywhere; extra dependencies only from
/// earlier to later tasks (acyclic). One graph in twenty has a kernel closure that fails.
pub(crate) fn valid_graph(rng: &mut StdRng) -> GraphSpec {
    let lanes = rng.random_range(1..=STREAMS);
    let signals = rng.random_range(1..=2u8);
    // Per signal: Some(set value) for set-once signals, None for add signals.
    let set_once: Vec<Option<u64>> = (0..signals)
        .map(|_| rng.random_bool(0.3).then(|| rng.random_range(1..=50u64)))
        .collect();
    let mut set_done: Vec<Option<u16>> = vec![None; signals as usize];
    let mut adds: Vec<Vec<(u16, u64)>> = vec![Vec::new(); signals as usize];
    // Once a signal has a waiter it gets no more producers: `check` draws an edge from every
    // producer to every wait it could help, so a later producer would close a cycle.
    let mut waited = vec![false; signals as usize];
    let mut tasks = Vec::new();
    let mut deps = Vec::new();
    let n = rng.random_range(1..=12usize);
    let fail_at = rng.random_bool(0.05).then(|| rng.random_range(0..n));
    for i in 0..n {
        let id = tasks.len() as u16;
        let lane = rng.random_range(0..lanes);
        if fail_at == Some(i) {
            tasks.push(GTask::Kernel { lane, fail: true });
            continue;
        }
        let sig = rng.random_range(0..signals);
        let s = sig as usize;
        match rng.random_range(0..10u32) {
            0..=2 => match set_once[s] {
                Some(v) if set_done[s].is_none() => {
                    tasks.push(GTask::Set {
                        lane,
                        sig,
                        value: v,
                    });
                    set_done[s] = Some(id);
                }
                Some(_) => tasks.push(GTask::Host { lane }),
                None if waited[s] => tasks.push(GTask::Host { lane }),
                None => {
                    let value = rng.random_range(1..=5u64);
                    tasks.push(GTask::Add { lane, sig, value });
                    adds[s].push((id, value));
                }
            },
            3..=5 => match set_once[s] {
                Some(v) => match set_done[s] {
                    Some(p) => {
                        let cmp = if rng.random_bool(0.5) {
                            Cmp::Eq
                        } else {
                            Cmp::Geq
                        };
                        tasks.push(GTask::Wait {
                            lane,
                            sig,
                            cmp,
                            value: v,
                        });
                        deps.push((p, id));
                        waited[s] = true;
                    }
                    None => tasks.push(GTask::Host { lane }),
                },
                None => {
                    // Ordered after a random subset of the adds so far.
                    let mut value = 0;
                    for &(p, v) in &adds[s] {
                        if rng.random_bool(0.6) {
                            value += v;
                            deps.push((p, id));
                        }
                    }
                    tasks.push(GTask::Wait {
                        lane,
                        sig,
                        cmp: Cmp::Geq,
                        value,
                    });
                    waited[s] = true;
                }
            },
            6..=7 => tasks.push(GTask::Host { lane }),
            _ => tasks.push(GTask::Kernel { lane, fail: false }),
        }
    }
    // A few extra forward dependencies.
    let len = tasks.len() as u16;
    if len >= 2 {
        for _ in 0..rng.random_range(0..=3u32) {
            let a = rng.random_range(0..len - 1);
            let b = rng.random_range(a + 1..len);
            deps.push((a, b));
        }
    }
    GraphSpec {
        lanes,
        signals,
        tasks,
        deps,
        class: GraphClass::Valid,
    }
}

/// A small graph of `class` (which must refuse), with a host task or two as noise.
pub(crate) fn refused_graph(rng: &mut StdRng, class: GraphClass) -> GraphSpec {
    let lanes = rng.random_range(2..=STREAMS);
    let other = rng.random_range(1..lanes);
    let mut tasks = Vec::new();
    let mut deps = Vec::new();
    if rng.random_bool(0.5) {
        tasks.push(GTask::Host { lane: other });
    }
    let base = tasks.len() as u16;
    let wait = |cmp, value| GTask::Wait {
        lane: other,
        sig: 0,
        cmp,
        value,
    };
    match class {
        GraphClass::Valid => return valid_graph(rng),
        GraphClass::Unreachable => {
            tasks.push(wait(Cmp::Geq, rng.random_range(1..=9u64)));
        }
        GraphClass::ProducerAfterWait => {
            let v = rng.random_range(1..=9u64);
            tasks.push(GTask::Wait {
                lane: 0,
                sig: 0,
                cmp: Cmp::Geq,
                value: v,
            });
            tasks.push(GTask::Add {
                lane: 0,
                sig: 0,
                value: v,
            });
        }
        GraphClass::Cycle => {
            tasks.push(GTask::Host { lane: 0 });
            tasks.push(GTask::Host { lane: other });
            deps.push((base, base + 1));
            deps.push((base + 1, base));
        }
        // Two sets on lane 0, then a wait ordered after the second that only the first satisfies.
        GraphClass::Overwritten | GraphClass::OverwrittenEq => {
            let (second, cmp) = if class == GraphClass::Overwritten {
                (0, Cmp::Geq)
            } else {
                (7, Cmp::Eq)
            };
            for value in [5, second] {
                tasks.push(GTask::Set {
                    lane: 0,
                    sig: 0,
                    value,
                });
            }
            tasks.push(wait(cmp, 5));
            deps.push((base + 1, base + 2));
        }
        GraphClass::WrappingAdd => {
            // One lane, or spread over two lanes ordered by dependencies.
            let spread = rng.random_bool(0.5);
            let l = |i: u8| if spread { i % 2 } else { 0 };
            for (i, value) in [1u64, u64::MAX, 1].into_iter().enumerate() {
                tasks.push(GTask::Add {
                    lane: l(i as u8),
                    sig: 0,
                    value,
                });
                if i > 0 && spread {
                    deps.push((base + i as u16 - 1, base + i as u16));
                }
            }
            tasks.push(wait(Cmp::Geq, 2));
            deps.push((base + 2, base + 3));
        }
    }
    if rng.random_bool(0.5) {
        tasks.push(GTask::Host { lane: 0 });
    }
    GraphSpec {
        lanes,
        signals: 1,
        tasks,
        deps,
        class,
    }
}
