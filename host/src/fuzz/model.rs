//! The CPU model of a fuzz thread: its buffers element by element, its signal's value, its
//! captured graphs and loaded module, and for every [`Op`] the outcome the safe API must give
//! ([`Expect`]) and the data it must produce. Pure CPU and deterministic: the oracle of the GPU
//! executor, and the generator's view of the state.
//!
//! Results are exact: float buffers hold integer-valued floats, and `f32` addition of the same
//! inputs is the same IEEE-754 round-to-nearest operation on the CPU and the GPU (no subnormals
//! arise from integer values), so sums compare bit for bit (NaN equal to NaN). The tensor-core
//! GEMM multiplies bf16 integers in -3..=3 with f32 accumulation: every partial sum is an integer
//! below 2^24, so it is exact too.

use crate::rng::mix64;

use super::ops::{Elem, GraphMode, ModuleAction, Op, TicketAction, GRAPH_SLOTS, SLOTS, STREAMS};

/// What the device offers, as far as the model needs to know.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Compute capability exactly 9.0 (the sm_90a tensor-core GEMM runs).
    pub tc_gemm: bool,
    /// Programmatic Dependent Launch (compute capability 9.0 or later).
    pub pdl: bool,
    /// `Signal<u64>` and the shared `Fence` could be made (64-bit stream memory operations, every
    /// kernel loaded); without them signal, fence and graph ops are skipped.
    pub signals: bool,
}

impl Caps {
    /// Everything supported (what generation assumes).
    pub fn all() -> Self {
        Self {
            tc_gemm: true,
            pdl: true,
            signals: true,
        }
    }
}

/// Error kinds of the [`crate::Error`] variants the model expects, by name.
pub mod kinds {
    pub const EMPTY: &str = "Empty";
    pub const LENGTH: &str = "LengthMismatch";
    pub const WRONG_STREAM: &str = "WrongStream";
    pub const BAD_SHAPE: &str = "BadShape";
    pub const MISALIGNED: &str = "Misaligned";
    pub const PDL: &str = "PdlUnsupported";
    pub const SM90A: &str = "Sm90aRequired";
    pub const PITCH: &str = "PitchAlignment";
    pub const PTX_NUL: &str = "PtxNul";
    pub const CUDA: &str = "Cuda";
    pub const WAIT_PENDING: &str = "WaitPending";
    pub const MISSING_KERNEL: &str = "MissingKernel";
    /// What the fuzzer's own failing closures return ([`crate::Error::Verification`]).
    pub const OWN: &str = "Verification";
}

/// The outcome an op must have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Success.
    Ok,
    /// A typed error of one of these kinds (variant names of [`crate::Error`]).
    Err(&'static [&'static str]),
    /// Success, or an error of one of these kinds (a race with another thread's pending wait,
    /// which the model cannot order).
    OkOr(&'static [&'static str]),
    /// `TaskGraph::check` must refuse the graph (any error; the kind is counted).
    Refused,
    /// The op's own closure panics and the panic reaches the caller.
    Panic,
    /// A bounded wait times out, and `OnTimeout::Release` drains the stream (`released: true`).
    Released,
    /// Not expressible in safe code in this state (empty slot, a buffer both read and written):
    /// nothing is called.
    Skip,
}

/// What the model says about one op.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    pub expect: Expect,
    /// For reads: the element type and every element (`None`: unknown, never written).
    pub data: Option<(Elem, Vec<Option<u32>>)>,
    /// For signal reads: the value.
    pub signal: Option<u64>,
    /// For graph runs and waited replays: host callbacks run so far by this graph.
    pub host_runs: Option<u64>,
    /// Kernel-task closure calls of this op (graph enqueue or capture).
    pub kernel_calls: Option<u64>,
}

impl Step {
    fn new(expect: Expect) -> Self {
        Self {
            expect,
            data: None,
            signal: None,
            host_runs: None,
            kernel_calls: None,
        }
    }
}

fn ok() -> Step {
    Step::new(Expect::Ok)
}

fn skip() -> Step {
    Step::new(Expect::Skip)
}

fn err(kind: &'static [&'static str]) -> Step {
    Step::new(Expect::Err(kind))
}

/// One buffer slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufModel {
    pub elem: Elem,
    /// Index of the thread stream it is bound to.
    pub stream: u8,
    /// Element bits (`None`: never written since the allocation).
    pub data: Vec<Option<u32>>,
}

/// One captured-graph slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedModel {
    /// Host tasks per launch.
    pub hosts: u64,
    /// Launches so far.
    pub launches: u64,
}

/// The state of one fuzz thread.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadModel {
    caps: Caps,
    bufs: Vec<Option<BufModel>>,
    signal: u64,
    graphs: Vec<Option<CapturedModel>>,
    /// A module may be loaded (its load can be refused by another thread's pending wait).
    module: bool,
    trace: bool,
}

/// The bits of `value` as an element of `elem` (`value as f32` for floats).
pub fn elem_bits(elem: Elem, value: i32) -> u32 {
    match elem {
        Elem::F32 => (value as f32).to_bits(),
        Elem::U32 => value as u32,
    }
}

/// The `len` values an upload of `seed` writes: integer-valued floats in [-1000, 1000] for
/// floats, any 32 bits for u32.
pub fn upload_values(elem: Elem, seed: u32, len: usize) -> Vec<u32> {
    (0..len as u64)
        .map(|i| {
            let h = mix64(((seed as u64) << 32) ^ i);
            match elem {
                Elem::F32 => ((h % 2001) as i32 - 1000) as f32,
                Elem::U32 => return h as u32,
            }
            .to_bits()
        })
        .collect()
}

/// The pipeline's inputs for `seed`: `a`, `b` of `n` integer-valued floats.
pub fn pipeline_inputs(seed: u32, n: usize) -> (Vec<f32>, Vec<f32>) {
    let a = upload_values(Elem::F32, seed, n);
    let b = upload_values(Elem::F32, seed ^ 0x5A5A_5A5A, n);
    let f = |v: Vec<u32>| v.into_iter().map(f32::from_bits).collect();
    (f(a), f(b))
}

/// `a + b` in f32, as bits.
pub fn add_bits(a: u32, b: u32) -> u32 {
    (f32::from_bits(a) + f32::from_bits(b)).to_bits()
}

/// True when two f32 bit patterns are the same value (NaN equals NaN).
pub fn same_f32(a: u32, b: u32) -> bool {
    a == b || (f32::from_bits(a).is_nan() && f32::from_bits(b).is_nan())
}

/// The tensor-core GEMM's inputs for `seed`: A `m x k` and B stored `n x k`, integers in
/// -3..=3 (exact in bf16).
pub fn gemm_inputs(seed: u32, m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>) {
    let val = |s: u64, i: u64| (mix64((s << 32) ^ i) % 7) as f32 - 3.0;
    let a = (0..(m * k) as u64).map(|i| val(seed as u64, i)).collect();
    let b = (0..(n * k) as u64)
        .map(|i| val(seed as u64 ^ 0xB, i))
        .collect();
    (a, b)
}

/// `C = A B` for A `m x k` row-major and B stored `n x k` (column-major `k x n`), exact.
pub fn gemm_reference(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|kk| a[i * k + kk] * b[j * k + kk]).sum();
        }
    }
    c
}

impl ThreadModel {
    /// A thread with no buffers, its signal at 0, no graphs, no module, no recorder.
    pub fn new(caps: Caps) -> Self {
        Self {
            caps,
            bufs: vec![None; SLOTS as usize],
            signal: 0,
            graphs: vec![None; GRAPH_SLOTS as usize],
            module: false,
            trace: false,
        }
    }

    /// The buffer in `slot`, if any.
    pub fn buf(&self, slot: u8) -> Option<&BufModel> {
        self.bufs.get(slot as usize).and_then(Option::as_ref)
    }

    /// The signal's value.
    pub fn signal(&self) -> u64 {
        self.signal
    }

    /// The captured graph in `gslot`, if any.
    pub fn graph(&self, gslot: u8) -> Option<&CapturedModel> {
        self.graphs.get(gslot as usize).and_then(Option::as_ref)
    }

    /// Whether a recorder of this thread is installed.
    pub fn tracing(&self) -> bool {
        self.trace
    }

    /// What `op` must do in the current state; advances the state as if it did.
    pub fn step(&mut self, op: &Op) -> Step {
        let mut step = self.step_inner(op);
        // Instantiating a captured graph waits for pending on-stream waits (this thread's or
        // another's) and then refuses with WaitPending (`reaper::without_pending_waits`): a
        // capture the model expects to succeed may be refused, leaving its graph slot empty
        // (a later replay of it is skipped; see `exec::judge`).
        let instantiates = matches!(
            op,
            Op::Capture { .. }
                | Op::Graph {
                    mode: GraphMode::RunCaptured,
                    ..
                }
        );
        if instantiates && step.expect == Expect::Ok {
            step.expect = Expect::OkOr(&[kinds::WAIT_PENDING]);
        }
        step
    }

    fn step_inner(&mut self, op: &Op) -> Step {
        let s = |v: u8| v as usize;
        // Out-of-range indices (never generated) are skipped rather than trusted.
        let in_range = match op {
            Op::Alloc { slot, stream, .. } => *slot < SLOTS && *stream < STREAMS,
            Op::Move { slot, stream } => *slot < SLOTS && *stream < STREAMS,
            Op::Free { slot }
            | Op::Fill { slot, .. }
            | Op::Upload { slot, .. }
            | Op::Read { slot }
            | Op::View { slot, .. } => *slot < SLOTS,
            Op::CopyD2D { dst, src } => *dst < SLOTS && *src < SLOTS,
            Op::VectorAdd {
                a, b, c, stream, ..
            } => *a < SLOTS && *b < SLOTS && *c < SLOTS && *stream < STREAMS,
            Op::Chain { slot, stream, .. } => *slot < SLOTS && *stream < STREAMS,
            Op::Fence { stream, .. }
            | Op::SignalSet { stream, .. }
            | Op::SignalAdd { stream, .. }
            | Op::SignalWait { stream, .. }
            | Op::Sync { stream }
            | Op::TcGemm { stream, .. } => *stream < STREAMS,
            Op::Graph { spec, .. } | Op::Capture { spec, .. } => {
                spec.lanes >= 1 && spec.lanes <= STREAMS
            }
            Op::Replay { gslot, .. } | Op::DropCaptured { gslot } => *gslot < GRAPH_SLOTS,
            _ => true,
        };
        let in_range = in_range
            && match op {
                Op::Capture { gslot, .. } => *gslot < GRAPH_SLOTS,
                _ => true,
            };
        if !in_range {
            return skip();
        }
        match op {
            Op::Alloc {
                slot,
                elem,
                len,
                stream,
            } => {
                self.bufs[s(*slot)] = None;
                if *len == 0 {
                    return err(&[kinds::EMPTY]);
                }
                self.bufs[s(*slot)] = Some(BufModel {
                    elem: *elem,
                    stream: *stream,
                    data: vec![None; *len as usize],
                });
                ok()
            }
            Op::Free { slot } => match self.bufs[s(*slot)].take() {
                Some(_) => ok(),
                None => skip(),
            },
            Op::Fill { slot, value } => match &mut self.bufs[s(*slot)] {
                Some(b) => {
                    let bits = elem_bits(b.elem, *value);
                    b.data.iter_mut().for_each(|x| *x = Some(bits));
                    ok()
                }
                None => skip(),
            },
            Op::Upload { slot, seed, extra } => match &mut self.bufs[s(*slot)] {
                Some(b) => {
                    if *extra != 0 {
                        return err(&[kinds::LENGTH]);
                    }
                    let v = upload_values(b.elem, *seed, b.data.len());
                    b.data = v.into_iter().map(Some).collect();
                    ok()
                }
                None => skip(),
            },
            Op::Read { slot } => match &self.bufs[s(*slot)] {
                Some(b) => Step {
                    data: Some((b.elem, b.data.clone())),
                    ..ok()
                },
                None => skip(),
            },
            Op::View { slot, start, end } => match &self.bufs[s(*slot)] {
                Some(b) => {
                    if start > end || *end as usize > b.data.len() {
                        err(&[kinds::LENGTH])
                    } else {
                        ok()
                    }
                }
                None => skip(),
            },
            Op::CopyD2D { dst, src } => {
                let (Some(d), Some(sb)) = (self.buf(*dst), self.buf(*src)) else {
                    return skip();
                };
                if dst == src || d.elem != sb.elem {
                    return skip();
                }
                if d.data.len() != sb.data.len() {
                    return err(&[kinds::LENGTH]);
                }
                if d.stream != sb.stream {
                    return err(&[kinds::WRONG_STREAM]);
                }
                let data = sb.data.clone();
                self.bufs[s(*dst)].as_mut().expect("checked above").data = data;
                ok()
            }
            Op::Move { slot, stream } => match &mut self.bufs[s(*slot)] {
                Some(b) => {
                    b.stream = *stream;
                    ok()
                }
                None => skip(),
            },
            Op::VectorAdd {
                a,
                b,
                c,
                off,
                len,
                c_len,
                grid,
                stream,
            } => self.vector_add(*a, *b, *c, *off, *len, *c_len, *grid, *stream),
            Op::Pipeline {
                batch_elems,
                c_extra,
                ..
            } => {
                if *c_extra != 0 {
                    err(&[kinds::LENGTH])
                } else if *batch_elems == 0 {
                    err(&[kinds::EMPTY])
                } else {
                    // The pipeline makes its streams (Device::new_stream), which waits for
                    // pending on-stream waits (this thread's or another's) and then refuses.
                    Step::new(Expect::OkOr(&[kinds::WAIT_PENDING]))
                }
            }
            Op::Chain {
                slot,
                stream,
                steps,
                grid,
                pdl,
                replays,
            } => {
                let Some(b) = &mut self.bufs[s(*slot)] else {
                    return skip();
                };
                if b.elem != Elem::U32 {
                    return skip();
                }
                if *pdl && !self.caps.pdl {
                    return err(&[kinds::PDL]);
                }
                if *grid == 0 {
                    return err(&[kinds::BAD_SHAPE]);
                }
                if b.stream != *stream {
                    return err(&[kinds::WRONG_STREAM]);
                }
                let runs = (*replays).max(1) as u32;
                let add = (*steps as u32).wrapping_mul(runs);
                b.data
                    .iter_mut()
                    .for_each(|x| *x = x.map(|v| v.wrapping_add(add)));
                ok()
            }
            Op::Fence { action, .. } => {
                if !self.caps.signals {
                    return skip();
                }
                match action {
                    TicketAction::Submit | TicketAction::SubmitElsewhere | TicketAction::Drop => {
                        ok()
                    }
                    TicketAction::SubmitErr => err(&[kinds::OWN]),
                    TicketAction::SubmitPanic => Step::new(Expect::Panic),
                    TicketAction::Forget => Step::new(Expect::Released),
                }
            }
            Op::SignalSet { value, .. } => {
                if !self.caps.signals {
                    return skip();
                }
                self.signal = *value;
                ok()
            }
            Op::SignalAdd { value, .. } => {
                if !self.caps.signals {
                    return skip();
                }
                self.signal = self.signal.wrapping_add(*value);
                ok()
            }
            Op::SignalWait { cmp, value, .. } => {
                if !self.caps.signals {
                    return skip();
                }
                if cmp.holds(self.signal, *value) {
                    ok()
                } else {
                    match cmp.satisfying_value(*value) {
                        Some(v) => {
                            self.signal = v;
                            Step::new(Expect::Released)
                        }
                        None => skip(),
                    }
                }
            }
            Op::SignalRead => {
                if !self.caps.signals {
                    return skip();
                }
                Step {
                    signal: Some(self.signal),
                    ..ok()
                }
            }
            Op::Graph { spec, mode } => {
                if !self.caps.signals {
                    return skip();
                }
                if spec.class.must_refuse() {
                    return Step::new(Expect::Refused);
                }
                match mode {
                    GraphMode::CheckOnly => ok(),
                    _ if spec.fails() => err(&[kinds::OWN]),
                    _ => Step {
                        host_runs: Some(spec.hosts()),
                        kernel_calls: Some(spec.kernels()),
                        ..ok()
                    },
                }
            }
            Op::Capture { gslot, spec } => {
                if !self.caps.signals {
                    return skip();
                }
                self.graphs[s(*gslot)] = None;
                if spec.class.must_refuse() {
                    return Step::new(Expect::Refused);
                }
                if spec.fails() {
                    return err(&[kinds::OWN]);
                }
                self.graphs[s(*gslot)] = Some(CapturedModel {
                    hosts: spec.hosts(),
                    launches: 0,
                });
                Step {
                    kernel_calls: Some(spec.kernels()),
                    ..ok()
                }
            }
            Op::Replay { gslot, wait } => match &mut self.graphs[s(*gslot)] {
                Some(g) => {
                    g.launches += 1;
                    Step {
                        host_runs: wait.then_some(g.hosts * g.launches),
                        ..ok()
                    }
                }
                None => skip(),
            },
            Op::DropCaptured { gslot } => match self.graphs[s(*gslot)].take() {
                Some(_) => ok(),
                None => skip(),
            },
            Op::TcGemm {
                bad_pitch, fresh, ..
            } => match (self.caps.tc_gemm, *bad_pitch, *fresh) {
                (false, ..) => err(&[kinds::SM90A]),
                // A TcGemm of its own loads a module: refused while another thread's wait is
                // pending.
                (true, true, true) => err(&[kinds::PITCH, kinds::WAIT_PENDING]),
                (true, true, false) => err(&[kinds::PITCH]),
                (true, false, true) => Step::new(Expect::OkOr(&[kinds::WAIT_PENDING])),
                (true, false, false) => ok(),
            },
            Op::Trace { install } => {
                self.trace = *install;
                ok()
            }
            Op::Module(action) => match action {
                ModuleAction::Load => {
                    self.module = true;
                    Step::new(Expect::OkOr(&[kinds::WAIT_PENDING]))
                }
                ModuleAction::LoadNul => err(&[kinds::PTX_NUL]),
                ModuleAction::LoadGarbage => err(&[kinds::CUDA, kinds::WAIT_PENDING]),
                ModuleAction::Kernel { missing } => {
                    if !self.module {
                        skip()
                    } else if *missing {
                        err(&[kinds::MISSING_KERNEL])
                    } else {
                        ok()
                    }
                }
                ModuleAction::Drop => {
                    if std::mem::take(&mut self.module) {
                        ok()
                    } else {
                        skip()
                    }
                }
            },
            Op::Sync { .. } => ok(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn vector_add(
        &mut self,
        a: u8,
        b: u8,
        c: u8,
        off: u32,
        len: u32,
        c_len: u32,
        grid: Option<u32>,
        stream: u8,
    ) -> Step {
        let (Some(ab), Some(bb), Some(cb)) = (self.buf(a), self.buf(b), self.buf(c)) else {
            return skip();
        };
        if c == a || c == b || [ab.elem, bb.elem, cb.elem] != [Elem::F32; 3] {
            return skip();
        }
        let (off, len, c_len) = (off as usize, len as usize, c_len as usize);
        // Views first (`view` / `view_mut`), in the order a, b, c.
        if off + len > ab.data.len() || off + len > bb.data.len() || off + c_len > cb.data.len() {
            return err(&[kinds::LENGTH]);
        }
        // Then `vector_add`'s checks, in its order.
        if grid == Some(0) {
            return err(&[kinds::BAD_SHAPE]);
        }
        if len != c_len {
            return err(&[kinds::LENGTH]);
        }
        if len == 0 {
            return err(&[kinds::EMPTY]);
        }
        let aligned = off % 4 == 0;
        for buf in [ab, bb, cb] {
            if buf.stream != stream {
                return err(&[kinds::WRONG_STREAM]);
            }
            if !aligned {
                return err(&[kinds::MISALIGNED]);
            }
        }
        let sum: Vec<Option<u32>> = (off..off + len)
            .map(|i| match (ab.data[i], bb.data[i]) {
                (Some(x), Some(y)) => Some(add_bits(x, y)),
                _ => None,
            })
            .collect();
        let cb = self.bufs[c as usize].as_mut().expect("checked above");
        cb.data[off..off + len].copy_from_slice(&sum);
        ok()
    }
}
