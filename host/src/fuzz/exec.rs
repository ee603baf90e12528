//! The GPU executor: runs one thread's ops with the safe API and judges each against the
//! [`ThreadModel`]. Every API call of an op is in `exec_op` (one match arm per op), so an API
//! change touches one place.
//!
//! Every wait is bounded ([`synchronize_timeout`] with [`OnTimeout::Release`]): a wait that does
//! not fire is a counted hang and is released, so the thread goes on. A thread stops at its first
//! failure (its state may no longer match the model) and cleans up with bounded waits.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::chain::Chain;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::kernels::tc_gemm::{BLayout, Matrix, MatrixMut, TcGemm, TcGemmOptions};
use crate::memory::{DeviceBuffer, MemPool, PinnedBuffer};
use crate::module::Module;
use crate::ordering::{
    synchronize_timeout, CapturedGraph, Fence, GraphRun, OnTimeout, Signal, TaskGraph,
};
use crate::pipeline::BatchPipeline;
use crate::stream::Stream;
use crate::trace::{Installed, Recorder};
use crate::{bf16, kernels};

use super::model::{
    add_bits, gemm_inputs, gemm_reference, pipeline_inputs, same_f32, upload_values, Caps, Expect,
    Step, ThreadModel,
};
use super::program::{
    Elem, GTask, GraphMode, GraphSpec, ModuleAction, Op, TicketAction, GRAPH_SLOTS, SLOTS, STREAMS,
};

/// Bound of the waits that must time out (a never-firing signal wait, a forgotten fence
/// ticket): the stream is drained before, so the release drains it at once.
pub const RELEASE_BOUND: Duration = Duration::from_millis(5);

/// The one-entry PTX that module ops load (tiny: loads in a moment; sm_90, like warpline's).
pub const FUZZ_PTX: &str = ".version 8.0\n.target sm_90\n.address_size 64\n\n.visible .entry warpline_fuzz_noop()\n{\n\tret;\n}\n";
/// Its entry.
pub const FUZZ_ENTRY: &str = "warpline_fuzz_noop";
/// The payload of the panics the fuzzer causes on purpose (the run's panic hook keeps them
/// quiet).
pub const EXPECTED_PANIC: &str = "warpline fuzz: a closure that panics on purpose";

/// What a whole run shares between its threads and seeds.
pub struct Shared {
    pub dev: &'static Device,
    /// The device's default pool (release threshold left as it is).
    pub pool: MemPool,
    /// One fence for every thread (`None` when it could not be made: fence ops are skipped).
    pub fence: Option<Fence>,
    /// The tensor-core GEMM (`Err`: why not, e.g. not sm_90).
    pub tc: std::result::Result<TcGemm<'static>, (String, String)>,
    pub caps: Caps,
    /// Bound of every other wait.
    pub bound: Duration,
}

/// Fence slots of the shared fence: forgotten tickets hold theirs for the rest of the run.
pub const FENCE_SLOTS: usize = 1 << 16;

impl Shared {
    /// Opens what the run shares on `dev` (kept for the rest of the process: threads of a hung
    /// seed may still use it). Errors: the default pool's ([`MemPool::device_default`]).
    pub fn new(dev: &'static Device, bound: Duration) -> Result<Self> {
        let threshold = MemPool::default_pool_release_threshold(dev)?;
        let pool = MemPool::device_default(dev, threshold)?;
        let fence = Fence::with_capacity(dev, FENCE_SLOTS).ok();
        let signals = fence.is_some() && Signal::<u64>::new(dev, "fuzz probe").is_ok();
        let cc = dev.capabilities().compute_capability;
        let tc = TcGemm::new(dev).map_err(|e| (error_kind(&e), e.to_string()));
        Ok(Self {
            dev,
            pool,
            fence,
            caps: Caps {
                tc_gemm: cc == (9, 0),
                pdl: cc.0 >= 9,
                signals,
            },
            tc,
            bound,
        })
    }
}

/// The variant name of an error (`"LengthMismatch"`, ...), from its `Debug` form.
pub fn error_kind(e: &Error) -> String {
    let d = format!("{e:?}");
    d.split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
        .next()
        .unwrap_or("")
        .to_string()
}

/// What the fuzzer's own failing closures return.
fn own_error(what: &str) -> Error {
    Error::Verification {
        detail: format!("warpline fuzz: {what} fails on purpose"),
    }
}

/// What an op did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Obs {
    Ok,
    /// A typed error: its kind and message.
    Err(String, String),
    /// A bounded wait timed out and the release drained it.
    Released,
    /// Nothing was called.
    Skipped,
    /// A result differs from the model.
    Wrong(String),
    /// A bounded wait that should have completed timed out.
    Hang(String),
    /// A panic reached the op (message).
    Panic(String),
}

impl From<Error> for Obs {
    fn from(e: Error) -> Self {
        match e {
            Error::Timeout { .. } => Obs::Hang(e.to_string()),
            e => Obs::Err(error_kind(&e), e.to_string()),
        }
    }
}

/// Failure classes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FailKind {
    /// An error where the model expects success, or another kind than expected.
    UnexpectedError,
    /// Success where the model expects a typed error (or a refusal).
    MissingError,
    /// A result that differs from the model.
    WrongResult,
    /// A panic the model does not expect (or none where it does).
    Panic,
    /// A bounded wait timed out (or a release did not drain), or the seed's watchdog fired.
    Hang,
}

impl FailKind {
    pub fn name(self) -> &'static str {
        match self {
            FailKind::UnexpectedError => "unexpected_error",
            FailKind::MissingError => "missing_error",
            FailKind::WrongResult => "wrong_result",
            FailKind::Panic => "panic",
            FailKind::Hang => "hang",
        }
    }
}

/// The verdict on one op: `Ok(Some(kind))` for an expected error of `kind`.
pub type Verdict = std::result::Result<Option<String>, (FailKind, String)>;

/// Judges `obs` against `step`.
pub fn judge(op: &Op, step: &Step, obs: &Obs) -> Verdict {
    let fail = |k: FailKind, what: String| Err((k, what));
    match (obs, &step.expect) {
        (Obs::Wrong(w), _) => fail(FailKind::WrongResult, w.clone()),
        (Obs::Hang(h), Expect::Released) => fail(
            FailKind::Hang,
            format!("the release did not drain the stream: {h}"),
        ),
        (Obs::Hang(h), _) => fail(FailKind::Hang, h.clone()),
        // A module load or a capture may have been refused with WaitPending (the model allows
        // it), so a later op on its module or graph slot may find nothing to run.
        (Obs::Skipped, _) if matches!(op, Op::Module(_) | Op::Replay { .. }) => Ok(None),
        (Obs::Skipped, Expect::Skip) => Ok(None),
        (Obs::Skipped, e) => fail(
            FailKind::UnexpectedError,
            format!("the executor skipped an op the model expects to give {e:?}"),
        ),
        (Obs::Ok, Expect::Ok | Expect::OkOr(_)) => Ok(None),
        (Obs::Released, Expect::Released) => Ok(None),
        (Obs::Err(k, _), Expect::Err(kinds) | Expect::OkOr(kinds))
            if kinds.contains(&k.as_str()) =>
        {
            Ok(Some(k.clone()))
        }
        (Obs::Err(k, _), Expect::Refused) => Ok(Some(k.clone())),
        (Obs::Panic(p), Expect::Panic) if p.contains(EXPECTED_PANIC) => Ok(None),
        (Obs::Panic(p), _) => fail(FailKind::Panic, p.clone()),
        (_, Expect::Panic) => fail(
            FailKind::Panic,
            format!("the closure's panic did not reach the caller (got {obs:?})"),
        ),
        (Obs::Ok, Expect::Refused) => fail(
            FailKind::MissingError,
            "TaskGraph::check accepted a graph with a wait that never fires (or a cycle)".into(),
        ),
        (Obs::Ok | Obs::Released, e) => fail(
            FailKind::MissingError,
            format!("expected {e:?}, got {obs:?}"),
        ),
        (Obs::Err(k, m), e) => fail(
            FailKind::UnexpectedError,
            format!("expected {e:?}, got {k}: {m}"),
        ),
    }
}

enum Buf {
    F32(DeviceBuffer<f32>),
    U32(DeviceBuffer<u32>),
}

impl Buf {
    fn stream(&self) -> &Stream {
        match self {
            Buf::F32(b) => b.stream(),
            Buf::U32(b) => b.stream(),
        }
    }
}

struct GraphSlot {
    graph: CapturedGraph<'static>,
    hosts: Arc<AtomicU64>,
    runs: Vec<GraphRun>,
}

/// One thread's GPU state, in step with its [`ThreadModel`].
pub struct ThreadState<'s> {
    sh: &'s Shared,
    streams: Vec<Stream>,
    bufs: Vec<Option<Buf>>,
    signal: Option<Signal<u64>>,
    graphs: Vec<Option<GraphSlot>>,
    /// Runs of dropped captured graphs, waited for at the end.
    runs: Vec<GraphRun>,
    module: Option<Module>,
    trace: Option<(Recorder, Installed)>,
}

/// Counts of one thread.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThreadReport {
    /// Ops that called the API.
    pub ops: u64,
    /// Ops skipped (nothing to call in that state).
    pub skipped: u64,
    /// Expected typed errors by kind.
    pub errors: std::collections::BTreeMap<String, u64>,
    /// The first failure: op index (`ops.len()` for the clean-up), op kind, class, detail.
    pub failure: Option<(usize, &'static str, FailKind, String)>,
}

impl<'s> ThreadState<'s> {
    /// The thread's streams, made before any thread of the seed starts (no stream is created
    /// while another thread's wait may be pending: `Device::new_stream` would wait for it).
    pub fn streams(sh: &Shared) -> Result<Vec<Stream>> {
        (0..STREAMS).map(|_| sh.dev.new_stream()).collect()
    }

    /// The thread's state over `streams` (from [`ThreadState::streams`]), and its signal when
    /// signals work.
    pub fn new(sh: &'s Shared, streams: Vec<Stream>) -> Result<Self> {
        let signal = if sh.caps.signals {
            Some(Signal::new(sh.dev, "fuzz thread signal")?)
        } else {
            None
        };
        Ok(Self {
            sh,
            streams,
            bufs: (0..SLOTS).map(|_| None).collect(),
            signal,
            graphs: (0..GRAPH_SLOTS).map(|_| None).collect(),
            runs: Vec::new(),
            module: None,
            trace: None,
        })
    }

    fn wait(&self, s: &Stream) -> Result<()> {
        synchronize_timeout(s, self.sh.bound, OnTimeout::Release)
    }

    fn wait_run(&self, r: &GraphRun) -> Result<()> {
        synchronize_timeout(r, self.sh.bound, OnTimeout::Release)
    }

    /// A wait that must time out and be released. A release whose drain takes longer than
    /// [`RELEASE_BOUND`] (a slow machine, a sanitizer) gets the full bound to drain.
    fn released(&self, s: &Stream) -> Obs {
        match synchronize_timeout(s, RELEASE_BOUND, OnTimeout::Release) {
            Ok(()) => Obs::Ok,
            Err(Error::Timeout { released: true, .. }) => Obs::Released,
            Err(Error::Timeout { pending, .. }) => match self.wait(s) {
                Ok(()) => Obs::Released,
                Err(e) => Obs::Hang(format!(
                    "{e} (after a release of {pending:?} that did not drain)"
                )),
            },
            Err(e) => e.into(),
        }
    }

    /// Drops everything with bounded waits; `Err` names what did not drain.
    pub fn finish(mut self) -> Obs {
        for g in self.graphs.iter_mut().filter_map(Option::take) {
            self.runs.extend(g.runs);
        }
        let runs = std::mem::take(&mut self.runs);
        for r in &runs {
            if let Err(e) = self.wait_run(r) {
                return e.into();
            }
        }
        drop(runs);
        self.module = None;
        self.trace = None;
        self.bufs.iter_mut().for_each(|b| *b = None);
        for s in &self.streams {
            if let Err(e) = self.wait(s) {
                return e.into();
            }
        }
        Obs::Ok
    }
}

/// Runs `ops` on a fresh [`ThreadState`], judging each against a fresh model; stops at the
/// first failure.
/// `at` is set to each op's index as it starts (the watchdog reports it).
pub fn run_thread(
    sh: &Shared,
    streams: Vec<Stream>,
    ops: &[Op],
    at: &std::sync::atomic::AtomicUsize,
) -> ThreadReport {
    let mut rep = ThreadReport::default();
    let mut st = match ThreadState::new(sh, streams) {
        Ok(s) => s,
        Err(e) => {
            rep.failure = Some((
                0,
                "setup",
                FailKind::UnexpectedError,
                format!("thread setup: {e}"),
            ));
            return rep;
        }
    };
    let mut model = ThreadModel::new(sh.caps);
    for (i, op) in ops.iter().enumerate() {
        at.store(i, std::sync::atomic::Ordering::Relaxed);
        let step = model.step(op);
        let obs = if step.expect == Expect::Skip {
            Obs::Skipped
        } else {
            caught(|| exec_op(&mut st, op, &step))
        };
        if obs == Obs::Skipped {
            rep.skipped += 1;
        } else {
            rep.ops += 1;
        }
        match judge(op, &step, &obs) {
            Ok(Some(kind)) => *rep.errors.entry(kind).or_default() += 1,
            Ok(None) => {}
            Err((kind, what)) => {
                rep.failure = Some((i, op.kind(), kind, what));
                // The state may no longer match the model: stop here.
                break;
            }
        }
    }
    at.store(ops.len(), std::sync::atomic::Ordering::Relaxed);
    let fin = caught(|| st.finish());
    if rep.failure.is_none() && fin != Obs::Ok {
        let (kind, what) = match fin {
            Obs::Panic(p) => (FailKind::Panic, p),
            Obs::Hang(h) => (FailKind::Hang, h),
            o => (FailKind::UnexpectedError, format!("{o:?}")),
        };
        rep.failure = Some((ops.len(), "clean-up", kind, what));
    }
    rep
}

/// Runs `f`, turning a panic into [`Obs::Panic`] with its message.
pub fn caught(f: impl FnOnce() -> Obs) -> Obs {
    // `&*p`: the payload inside the box (`&p` would make the Box itself the `Any`, and every
    // message "non-string"; seen on the fuzzer's first H100 run).
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| Obs::Panic(panic_message(&*p)))
}

/// The message of a caught panic.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-string payload".into()
    }
}

/// The first element where `got` differs from the model's `want` (unknown elements match).
fn first_diff(elem: Elem, got: &[u32], want: &[Option<u32>]) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!(
            "read {} elements, the model has {}",
            got.len(),
            want.len()
        ));
    }
    got.iter().zip(want).enumerate().find_map(|(i, (&g, w))| {
        let w = (*w)?;
        let same = match elem {
            Elem::F32 => same_f32(g, w),
            Elem::U32 => g == w,
        };
        (!same).then(|| format!("element {i} is {g:#010x}, the model says {w:#010x} ({elem:?})"))
    })
}

/// Runs one op: every API call of the fuzzer is here. Errors of the calls become
/// [`Obs::Err`] (or [`Obs::Hang`] for timeouts); comparisons with the model become
/// [`Obs::Wrong`].
fn exec_op(st: &mut ThreadState<'_>, op: &Op, step: &Step) -> Obs {
    match exec_inner(st, op, step) {
        Ok(obs) => obs,
        Err(e) => e.into(),
    }
}

fn exec_inner(st: &mut ThreadState<'_>, op: &Op, step: &Step) -> Result<Obs> {
    let sh = st.sh;
    let dev = sh.dev;
    let s = |i: u8| i as usize;
    match op {
        Op::Alloc {
            slot,
            elem,
            len,
            stream,
        } => {
            st.bufs[s(*slot)] = None;
            let on = &st.streams[s(*stream)];
            let len = *len as usize;
            st.bufs[s(*slot)] = Some(match elem {
                Elem::F32 => Buf::F32(sh.pool.alloc_async::<f32>(on, len)?),
                Elem::U32 => Buf::U32(sh.pool.alloc_async::<u32>(on, len)?),
            });
        }
        Op::Free { slot } => st.bufs[s(*slot)] = None,
        Op::Fill { slot, value } => match st.bufs[s(*slot)].as_mut() {
            Some(Buf::F32(b)) => b.fill_async(*value as f32)?,
            Some(Buf::U32(b)) => b.fill_async(*value as u32)?,
            None => return Ok(Obs::Skipped),
        },
        Op::Upload { slot, seed, extra } => {
            let Some(buf) = st.bufs[s(*slot)].as_mut() else {
                return Ok(Obs::Skipped);
            };
            synchronize_timeout(buf.stream(), sh.bound, OnTimeout::Release)?;
            match buf {
                Buf::F32(b) => {
                    let n = (b.len() as i64 + *extra as i64).max(0) as usize;
                    let v: Vec<f32> = upload_values(Elem::F32, *seed, n)
                        .into_iter()
                        .map(f32::from_bits)
                        .collect();
                    b.copy_from_host(&v)?;
                }
                Buf::U32(b) => {
                    let n = (b.len() as i64 + *extra as i64).max(0) as usize;
                    b.copy_from_host(&upload_values(Elem::U32, *seed, n))?;
                }
            }
        }
        Op::Read { slot } => {
            let Some(buf) = st.bufs[s(*slot)].as_ref() else {
                return Ok(Obs::Skipped);
            };
            st.wait(buf.stream())?;
            let (elem, got) = match buf {
                Buf::F32(b) => {
                    let mut h = vec![0f32; b.len()];
                    b.copy_to_host(&mut h)?;
                    (
                        Elem::F32,
                        h.into_iter().map(f32::to_bits).collect::<Vec<_>>(),
                    )
                }
                Buf::U32(b) => {
                    let mut h = vec![0u32; b.len()];
                    b.copy_to_host(&mut h)?;
                    (Elem::U32, h)
                }
            };
            if let Some((_, want)) = &step.data {
                if let Some(d) = first_diff(elem, &got, want) {
                    return Ok(Obs::Wrong(format!("slot {slot}: {d}")));
                }
            }
        }
        Op::View { slot, start, end } => {
            let r = *start as usize..*end as usize;
            match st.bufs[s(*slot)].as_ref() {
                Some(Buf::F32(b)) => drop(b.view(r)?),
                Some(Buf::U32(b)) => drop(b.view(r)?),
                None => return Ok(Obs::Skipped),
            }
        }
        Op::CopyD2D { dst, src } => {
            if dst == src {
                return Ok(Obs::Skipped);
            }
            let [d, sr] = st
                .bufs
                .get_disjoint_mut([s(*dst), s(*src)])
                .map_err(|_| own_error("slot indexing"))?;
            match (d.as_mut(), sr.as_ref()) {
                (Some(Buf::F32(d)), Some(Buf::F32(sr))) => d.copy_from_device(sr)?,
                (Some(Buf::U32(d)), Some(Buf::U32(sr))) => d.copy_from_device(sr)?,
                _ => return Ok(Obs::Skipped),
            }
        }
        Op::Move { slot, stream } => {
            let to = st.streams[s(*stream)].clone();
            match st.bufs[s(*slot)].as_mut() {
                Some(Buf::F32(b)) => b.move_to_stream(&to)?,
                Some(Buf::U32(b)) => b.move_to_stream(&to)?,
                None => return Ok(Obs::Skipped),
            }
        }
        Op::VectorAdd {
            a,
            b,
            c,
            off,
            len,
            c_len,
            grid,
            stream,
        } => {
            let on = st.streams[s(*stream)].clone();
            let (off, len, c_len) = (*off as usize, *len as usize, *c_len as usize);
            // c differs from a and b (the model skips the op otherwise).
            let mut cbuf = match st.bufs[s(*c)].take() {
                Some(Buf::F32(cb)) => cb,
                other => {
                    st.bufs[s(*c)] = other;
                    return Ok(Obs::Skipped);
                }
            };
            let r = (|| {
                let (Some(Buf::F32(ab)), Some(Buf::F32(bb))) =
                    (st.bufs[s(*a)].as_ref(), st.bufs[s(*b)].as_ref())
                else {
                    return Ok(Obs::Skipped);
                };
                let va = ab.view(off..off + len)?;
                let vb = bb.view(off..off + len)?;
                let vc = cbuf.view_mut(off..off + c_len)?;
                match grid {
                    None => kernels::vector_add(dev, &on, va, vb, vc)?,
                    Some(g) => kernels::vector_add_with_grid(dev, &on, va, vb, vc, *g)?,
                }
                Ok(Obs::Ok)
            })();
            st.bufs[s(*c)] = Some(Buf::F32(cbuf));
            return r;
        }
        Op::Pipeline {
            streams,
            n,
            batch_elems,
            c_extra,
            seed,
        } => {
            let n = *n as usize;
            let pipe = BatchPipeline::new(dev, *streams as usize)?;
            let (a, b) = pipeline_inputs(*seed, n);
            let pa = PinnedBuffer::from_slice(dev, &a)?;
            let pb = PinnedBuffer::from_slice(dev, &b)?;
            let mut pc = PinnedBuffer::new(dev, (n as i64 + *c_extra as i64).max(1) as usize)?;
            pc.fill(f32::NAN);
            pipe.run_vector_add(&pa, &pb, &mut pc, *batch_elems as usize, |_, _| {})?;
            for s in pipe.streams() {
                st.wait(s)?;
            }
            for i in 0..n {
                let want = add_bits(a[i].to_bits(), b[i].to_bits());
                if !same_f32(pc[i].to_bits(), want) {
                    return Ok(Obs::Wrong(format!(
                        "pipeline element {i} is {}, the model says {}",
                        pc[i],
                        f32::from_bits(want)
                    )));
                }
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
            let Some(Buf::U32(buf)) = st.bufs[s(*slot)].as_mut() else {
                return Ok(Obs::Skipped);
            };
            let mut chain = Chain::new(dev, &st.streams[s(*stream)], *pdl)?;
            chain.push_chain_steps(buf.as_view_mut(), *steps as usize, *grid)?;
            if *replays == 0 {
                chain.run()?;
            } else {
                match chain.capture() {
                    Ok(graph) => {
                        for _ in 0..*replays {
                            graph.launch()?;
                        }
                    }
                    // The instantiation was refused behind a pending wait (nothing was
                    // launched): the same steps run eagerly, as the model expects.
                    Err(Error::WaitPending { .. }) => {
                        for _ in 0..*replays {
                            chain.run()?;
                        }
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Op::Fence { stream, action } => {
            let Some(fence) = sh.fence.as_ref() else {
                return Ok(Obs::Skipped);
            };
            let on = &st.streams[s(*stream)];
            // Drained first, so a forgotten ticket's release drains at once.
            st.wait(on)?;
            let ticket = fence.guard(on)?;
            match action {
                TicketAction::Submit => ticket.submit(|_, _| Ok(()))?,
                TicketAction::SubmitErr => ticket.submit(|_, _| Err(own_error("fence work")))?,
                TicketAction::SubmitPanic => ticket.submit(|_, _| panic!("{EXPECTED_PANIC}"))?,
                TicketAction::SubmitElsewhere => std::thread::scope(|sc| {
                    sc.spawn(move || ticket.submit(|_, _| Ok(())))
                        .join()
                        .unwrap_or_else(|_| Err(own_error("the submitting thread")))
                })?,
                TicketAction::Drop => drop(ticket),
                TicketAction::Forget => {
                    std::mem::forget(ticket);
                    return Ok(st.released(on));
                }
            }
            st.wait(on)?;
        }
        Op::SignalSet { stream, value } => {
            let (Some(sig), on) = (st.signal.as_ref(), &st.streams[s(*stream)]) else {
                return Ok(Obs::Skipped);
            };
            sig.set(on, *value)?;
            st.wait(on)?;
        }
        Op::SignalAdd { stream, value } => {
            let (Some(sig), on) = (st.signal.as_ref(), &st.streams[s(*stream)]) else {
                return Ok(Obs::Skipped);
            };
            sig.add(dev, on, *value)?;
            st.wait(on)?;
        }
        Op::SignalWait { stream, cmp, value } => {
            let (Some(sig), on) = (st.signal.as_ref(), &st.streams[s(*stream)]) else {
                return Ok(Obs::Skipped);
            };
            st.wait(on)?;
            sig.wait_until(on, *cmp, *value)?;
            if step.expect == Expect::Released {
                return Ok(st.released(on));
            }
            st.wait(on)?;
        }
        Op::SignalRead => {
            let Some(sig) = st.signal.as_ref() else {
                return Ok(Obs::Skipped);
            };
            let v = sig.read()?;
            if let Some(want) = step.signal {
                if v != want {
                    return Ok(Obs::Wrong(format!(
                        "the signal reads {v}, the model says {want}"
                    )));
                }
            }
        }
        Op::Graph { spec, mode } => return run_graph(st, spec, *mode, step),
        Op::Capture { gslot, spec } => {
            // Earlier replays of the replaced graph are waited for at the end.
            if let Some(old) = st.graphs[s(*gslot)].take() {
                st.runs.extend(old.runs);
            }
            let hosts = Arc::new(AtomicU64::new(0));
            let calls = Arc::new(AtomicU64::new(0));
            let g = build_graph(spec, &hosts, &calls)?;
            let signals = new_signals(dev, spec.signals)?;
            let refs: Vec<&Signal<u64>> = signals.iter().collect();
            let lanes = &st.streams[..spec.lanes as usize];
            if spec.class.must_refuse() {
                // Never captured once `check` accepts it (judged as a missing refusal); once
                // refused, `capture` must refuse it too.
                let Err(e) = g.check() else {
                    return Ok(Obs::Ok);
                };
                return match g.capture(dev, lanes, &refs) {
                    Err(_) => Err(e),
                    Ok(_) => Ok(Obs::Ok),
                };
            }
            let graph = match capture(&g, spec, dev, lanes, &refs)? {
                Ok(graph) => graph,
                Err(wrong) => return Ok(wrong),
            };
            if let Some(w) = check_count("kernel closure calls", &calls, step.kernel_calls) {
                return Ok(w);
            }
            st.graphs[s(*gslot)] = Some(GraphSlot {
                graph,
                hosts,
                runs: Vec::new(),
            });
        }
        Op::Replay { gslot, wait } => {
            let Some(slot) = st.graphs[s(*gslot)].as_mut() else {
                return Ok(Obs::Skipped);
            };
            let run = slot.graph.launch()?;
            slot.runs.push(run);
            if *wait {
                let runs = std::mem::take(&mut slot.runs);
                let hosts = slot.hosts.clone();
                for r in &runs {
                    st.wait_run(r)?;
                }
                if let Some(w) = check_count("host callback runs", &hosts, step.host_runs) {
                    return Ok(w);
                }
            }
        }
        Op::DropCaptured { gslot } => match st.graphs[s(*gslot)].take() {
            Some(g) => {
                drop(g.graph);
                st.runs.extend(g.runs);
            }
            None => return Ok(Obs::Skipped),
        },
        Op::TcGemm {
            m,
            n,
            k,
            stream,
            seed,
            bad_pitch,
            fresh,
        } => {
            let gemm = |tc: &TcGemm<'_>| {
                tc_gemm_launch(st, tc, (*m, *n, *k), s(*stream), *seed, *bad_pitch)
            };
            let launched = if *fresh {
                // A TcGemm of its own, dropped (its module unloaded) right after the launch is
                // queued, before the result is waited for (issue 19 item 4).
                let own = TcGemm::new(dev)?;
                gemm(&own)?
            } else {
                match &sh.tc {
                    Ok(tc) => gemm(tc)?,
                    Err((kind, msg)) => return Ok(Obs::Err(kind.clone(), msg.clone())),
                }
            };
            return tc_gemm_check(st, launched);
        }
        Op::Trace { install } => {
            if *install {
                let rec = Recorder::new(dev)?;
                let guard = rec.install();
                st.trace = Some((rec, guard));
            } else {
                st.trace = None;
            }
        }
        Op::Module(action) => match action {
            ModuleAction::Load => {
                st.module = None;
                st.module = Some(dev.load_module(FUZZ_PTX)?);
            }
            ModuleAction::LoadNul => drop(dev.load_module(".version 7.0\0")?),
            ModuleAction::LoadGarbage => drop(dev.load_module("this is not PTX")?),
            ModuleAction::Kernel { missing } => {
                let Some(m) = st.module.as_ref() else {
                    return Ok(Obs::Skipped);
                };
                let name = if *missing {
                    "no_such_entry"
                } else {
                    FUZZ_ENTRY
                };
                m.untyped_kernel(name)?;
            }
            ModuleAction::Drop => {
                if st.module.take().is_none() {
                    return Ok(Obs::Skipped);
                }
            }
        },
        Op::Sync { stream } => st.wait(&st.streams[s(*stream)])?,
    }
    Ok(Obs::Ok)
}

/// `Obs::Wrong` unless `counter` holds `want` (when the model gives one).
fn check_count(what: &str, counter: &AtomicU64, want: Option<u64>) -> Option<Obs> {
    let want = want?;
    let got = counter.load(Ordering::SeqCst);
    (got != want).then(|| Obs::Wrong(format!("{what}: {got}, the model says {want}")))
}

fn new_signals(dev: &Device, n: u8) -> Result<Vec<Signal<u64>>> {
    (0..n)
        .map(|i| Signal::new(dev, format!("fuzz graph signal {i}")))
        .collect()
}

/// Captures `g` (issue 19, item 1): the safe `capture` must refuse a graph with kernel closures
/// (`Error::UncheckedCapture`, checked here), which then goes through `capture_unchecked`.
/// `Ok(Err(obs))` is a wrong result: the safe capture accepted a kernel closure.
fn capture(
    g: &TaskGraph<'static>,
    spec: &GraphSpec,
    dev: &Device,
    lanes: &[Stream],
    refs: &[&Signal<u64>],
) -> Result<std::result::Result<CapturedGraph<'static>, Obs>> {
    if spec.kernels() == 0 {
        return g.capture(dev, lanes, refs).map(Ok);
    }
    match g.capture(dev, lanes, refs) {
        Err(Error::UncheckedCapture { .. }) => {}
        Err(e) => return Err(e),
        Ok(_) => {
            return Ok(Err(Obs::Wrong(
                "the safe TaskGraph::capture accepted a kernel closure".into(),
            )))
        }
    }
    // SAFETY: the fuzzer's kernel closures only count their calls or return an error: they
    // enqueue nothing and touch no device memory, so nothing a replay touches can be freed, and
    // nothing allocated during the capture escapes.
    unsafe { g.capture_unchecked(dev, lanes, refs) }.map(Ok)
}

/// The [`TaskGraph`] of `spec`: host tasks count into `hosts`, kernel closures into `calls`
/// (and enqueue nothing, or fail on purpose).
pub fn build_graph(
    spec: &GraphSpec,
    hosts: &Arc<AtomicU64>,
    calls: &Arc<AtomicU64>,
) -> Result<TaskGraph<'static>> {
    let mut g = TaskGraph::new();
    let lanes: Vec<_> = (0..spec.lanes)
        .map(|i| g.lane(format!("lane {i}")))
        .collect();
    let sigs: Vec<_> = (0..spec.signals)
        .map(|i| g.signal(format!("signal {i}")))
        .collect();
    let bad = || own_error("a graph spec with an index out of range");
    let lane = |l: u8| lanes.get(l as usize).copied().ok_or_else(bad);
    let sig = |x: u8| sigs.get(x as usize).copied().ok_or_else(bad);
    let mut ids = Vec::with_capacity(spec.tasks.len());
    for (i, t) in spec.tasks.iter().enumerate() {
        let label = format!("task {i}");
        let id = match *t {
            GTask::Set {
                lane: l,
                sig: x,
                value,
            } => g.set(lane(l)?, label, sig(x)?, value)?,
            GTask::Add {
                lane: l,
                sig: x,
                value,
            } => g.add(lane(l)?, label, sig(x)?, value)?,
            GTask::Wait {
                lane: l,
                sig: x,
                cmp,
                value,
            } => g.wait(lane(l)?, label, sig(x)?, cmp, value)?,
            GTask::Host { lane: l } => {
                let hosts = hosts.clone();
                g.host(lane(l)?, label, move || {
                    hosts.fetch_add(1, Ordering::SeqCst);
                })?
            }
            GTask::Kernel { lane: l, fail } => {
                let calls = calls.clone();
                g.kernel(lane(l)?, label, move |_ctx| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    if fail {
                        Err(own_error("a kernel task"))
                    } else {
                        Ok(())
                    }
                })?
            }
        };
        ids.push(id);
    }
    for &(a, b) in &spec.deps {
        let (Some(&a), Some(&b)) = (ids.get(a as usize), ids.get(b as usize)) else {
            return Err(bad());
        };
        g.depend(a, b)?;
    }
    Ok(g)
}

/// A one-off graph op. A graph that must be refused is only checked (and, once refused, run,
/// which must refuse it too): an accepted one is never enqueued, since its wait never fires.
fn run_graph(
    st: &mut ThreadState<'_>,
    spec: &GraphSpec,
    mode: GraphMode,
    step: &Step,
) -> Result<Obs> {
    let dev = st.sh.dev;
    let hosts = Arc::new(AtomicU64::new(0));
    let calls = Arc::new(AtomicU64::new(0));
    let g = build_graph(spec, &hosts, &calls)?;
    if spec.class.must_refuse() || mode == GraphMode::CheckOnly {
        if let Err(e) = g.check() {
            if mode == GraphMode::CheckOnly {
                return Err(e);
            }
        } else {
            return Ok(Obs::Ok);
        }
    }
    let signals = new_signals(dev, spec.signals)?;
    let refs: Vec<&Signal<u64>> = signals.iter().collect();
    let streams = &st.streams[..spec.lanes as usize];
    let run = match mode {
        GraphMode::Enqueue => g.enqueue(dev, streams, &refs),
        _ => match capture(&g, spec, dev, streams, &refs) {
            Ok(Ok(mut graph)) => graph.launch(),
            Ok(Err(wrong)) => return Ok(wrong),
            Err(e) => Err(e),
        },
    };
    let run = match run {
        Ok(r) => r,
        Err(e) => {
            // Whatever a failing closure left queued must still drain.
            for s in streams {
                st.wait(s)?;
            }
            return Err(e);
        }
    };
    st.wait_run(&run)?;
    if let Some(w) = check_count("host callback runs", &hosts, step.host_runs) {
        return Ok(w);
    }
    if let Some(w) = check_count("kernel closure calls", &calls, step.kernel_calls) {
        return Ok(w);
    }
    Ok(Obs::Ok)
}

/// A queued tensor-core GEMM: its buffers and the exact product to compare with.
struct GemmLaunched {
    stream: usize,
    dims: (usize, usize, usize),
    _inputs: (DeviceBuffer<bf16>, DeviceBuffer<bf16>),
    c: DeviceBuffer<f32>,
    want: Vec<f32>,
}

/// The tensor-core GEMM op up to the launch: inputs uploaded, planned, launched (the plan is
/// dropped, the result not waited for).
fn tc_gemm_launch(
    st: &ThreadState<'_>,
    tc: &TcGemm<'_>,
    (m, n, k): (u16, u16, u16),
    stream: usize,
    seed: u32,
    bad_pitch: bool,
) -> Result<GemmLaunched> {
    let (m, n, k) = (m as usize, n as usize, k as usize);
    let sh = st.sh;
    let on = &st.streams[stream];
    let (a, b) = gemm_inputs(seed, m, n, k);
    let a_pitch = if bad_pitch { k + 1 } else { k };
    let mut da = sh.pool.alloc_async::<bf16>(on, m * a_pitch)?;
    let mut db = sh.pool.alloc_async::<bf16>(on, n * k)?;
    let mut dc = sh.pool.alloc_async::<f32>(on, m * n)?;
    st.wait(on)?;
    let mut ha = vec![bf16::ZERO; m * a_pitch];
    for i in 0..m {
        for kk in 0..k {
            ha[i * a_pitch + kk] = bf16::from_f32(a[i * k + kk]);
        }
    }
    da.copy_from_host(&ha)?;
    let hb: Vec<bf16> = b.iter().map(|&x| bf16::from_f32(x)).collect();
    db.copy_from_host(&hb)?;
    dc.fill_async(f32::NAN)?;
    {
        let plan = tc.plan(
            on,
            Matrix::new(da.as_view(), m, k, a_pitch),
            Matrix::new(db.as_view(), n, k, k),
            BLayout::ColMajor,
            MatrixMut::new(dc.as_view_mut(), m, n, n),
            1.0,
            0.0,
            &TcGemmOptions::default(),
        )?;
        plan.launch()?;
    }
    Ok(GemmLaunched {
        stream,
        dims: (m, n, k),
        _inputs: (da, db),
        c: dc,
        want: gemm_reference(&a, &b, m, n, k),
    })
}

/// Waits for a queued GEMM (bounded), reads C back and compares it exactly.
fn tc_gemm_check(st: &ThreadState<'_>, g: GemmLaunched) -> Result<Obs> {
    let (m, n, k) = g.dims;
    st.wait(&st.streams[g.stream])?;
    let mut hc = vec![0f32; m * n];
    g.c.copy_to_host(&mut hc)?;
    if let Some(i) = (0..m * n).find(|&i| hc[i] != g.want[i]) {
        return Ok(Obs::Wrong(format!(
            "tc_gemm {m}x{n}x{k}: C[{}][{}] is {}, the exact product is {}",
            i / n,
            i % n,
            hc[i],
            g.want[i]
        )));
    }
    Ok(Obs::Ok)
}
