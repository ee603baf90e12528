//! Direct runs of a [`TaskGraph`] and the submission shared with capture: signal resets, the fork
//! of the lanes, every task in plan order with events for cross-lane edges, and host callbacks
//! behind an `extern "C"` trampoline that never unwinds.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::driver::{sys, CudaEvent};

use super::run::{GraphRun, PanicLog, RunState, RunTask};
use super::{HostTask, Op, TaskContext, TaskGraph};
use crate::device::Device;
use crate::driver::{graph as dg, memops};
use crate::error::{CudaCall, Error, Result};
use crate::ordering::check::{EdgeKind, Plan};
use crate::ordering::signal::Signal;
use crate::stream::Stream;
use crate::trace::{self, Stage};

/// What one `cuLaunchHostFunc` hands to the driver.
pub(crate) struct HostCall {
    task: Arc<HostTask>,
    panics: PanicLog,
}

/// How the tasks are submitted.
pub(super) enum Mode<'a> {
    /// A direct run: signal operations are tracked, each host call is owned by its callback.
    Direct,
    /// Stream capture: untracked signal operations (the captured graph keeps the signals), host
    /// calls kept in the list (the captured graph owns them), and signal edges become events.
    /// `user`: the lanes' own streams (what typed tasks' views are bound to); the tasks are
    /// queued on the private capture streams.
    Capture {
        #[allow(clippy::vec_box)] // boxed: the driver holds pointers to them
        host_calls: &'a mut Vec<Box<HostCall>>,
        user: &'a [Stream],
    },
}

pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Runs the callback, catching a panic and recording it in the call's log.
fn call_host(call: &HostCall) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // Every warpline call inside returns Error::InHostCallback (issue 19, item 9).
        let _scope = crate::device::HostCallbackScope::enter();
        let mut f = call.task.f.lock().unwrap_or_else(|e| e.into_inner());
        (*f)()
    }));
    if let Err(payload) = r {
        let msg = panic_message(&*payload);
        // A payload whose Drop panics must not unwind here either.
        if let Err(p) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
            std::mem::forget(p);
        }
        let mut log = call.panics.lock().unwrap_or_else(|e| e.into_inner());
        log.push((call.task.label.clone(), msg));
    }
}

/// Trampoline for direct runs: consumes the `Box<HostCall>`; the box is dropped on the reaper
/// thread (its closure may own things whose Drop calls CUDA, which a host callback must not).
unsafe extern "C" fn run_owned(data: *mut c_void) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `data` came from Box::into_raw in `launch_host` and is consumed exactly once.
        let call = unsafe { Box::from_raw(data as *mut HostCall) };
        call_host(&call);
        crate::reaper::defer(move || drop(call));
    }));
    if let Err(p) = r {
        std::mem::forget(p);
    }
}

/// Trampoline for captured graphs: the `HostCall` is owned by the captured graph, which outlives
/// every launch.
unsafe extern "C" fn run_kept(data: *mut c_void) {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: points into a Box kept by the CapturedGraph until its last launch completed.
        let call = unsafe { &*(data as *const HostCall) };
        call_host(call);
    }));
    if let Err(p) = r {
        std::mem::forget(p);
    }
}

fn launch_host(
    stream: &Stream,
    task: &Arc<HostTask>,
    panics: &PanicLog,
    mode: &mut Mode<'_>,
) -> Result<()> {
    let call = Box::new(HostCall {
        task: task.clone(),
        panics: panics.clone(),
    });
    match mode {
        Mode::Direct => {
            let data = Box::into_raw(call) as *mut c_void;
            // SAFETY: run_owned consumes `data` once and never unwinds.
            let r = unsafe { dg::launch_host_func(stream.raw(), run_owned, data) };
            if r.is_err() {
                // SAFETY: the driver did not take `data`.
                drop(unsafe { Box::from_raw(data as *mut HostCall) });
            }
            r
        }
        Mode::Capture {
            host_calls: keep, ..
        } => {
            let data = &*call as *const HostCall as *mut c_void;
            keep.push(call);
            // SAFETY: `data` stays valid while the CapturedGraph (which keeps the box) may run.
            unsafe { dg::launch_host_func(stream.raw(), run_kept, data) }
        }
    }
}

pub(super) fn record(s: &Stream) -> Result<CudaEvent> {
    s.cudarc()
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
        .call("cuEventRecord")
}

/// The streams other than `streams[0]`, each once.
pub(super) fn distinct_others(streams: &[Stream]) -> Vec<Stream> {
    let mut out: Vec<Stream> = Vec::new();
    for s in &streams[1..] {
        if *s != streams[0] && !out.contains(s) {
            out.push(s.clone());
        }
    }
    out
}

impl<'g> TaskGraph<'g> {
    /// Checks the graph, then enqueues one run: resets the bound signals to 0 on `streams[0]`
    /// after every lane's earlier work (runs never overlap), submits the tasks in
    /// [`Plan::order`] with an event for each explicit dependency across streams, and records an
    /// event after every task (for [`crate::ordering::synchronize_timeout`], which also reports a
    /// panicking host callback). Returns at once.
    ///
    /// `streams[i]` is lane `i`, `signals[j]` signal slot `j`; they must not be used by other work
    /// while the run is pending. Errors: [`Error::Cycle`], [`Error::UnmatchedWait`],
    /// [`Error::WaitMayNotFire`], [`Error::LengthMismatch`] for wrong bindings,
    /// [`Error::BadShape`] for one signal bound to two slots, [`Error::WrongStream`] (before
    /// anything is queued) for a [`TaskGraph::gemm`] plan or a [`TaskGraph::typed`] view not bound
    /// to its lane's stream, errors of kernel closures and launches, [`Error::Cuda`].
    pub fn enqueue(
        &self,
        dev: &Device,
        streams: &[Stream],
        signals: &[&Signal<u64>],
    ) -> Result<GraphRun> {
        let devs = vec![dev; self.lanes.len()];
        self.enqueue_on(&devs, streams, signals)
    }

    /// [`TaskGraph::enqueue`] with `devs[lane]` the device of each lane's stream (several GPUs:
    /// [`crate::ordering::MultiTaskGraph`], which checks the bindings first).
    pub(crate) fn enqueue_on(
        &self,
        devs: &[&Device],
        streams: &[Stream],
        signals: &[&Signal<u64>],
    ) -> Result<GraphRun> {
        let plan = self.check()?;
        self.check_bindings(streams, signals)?;
        self.check_gemm_streams(streams)?;
        if devs.len() != self.lanes.len() {
            return Err(Error::LengthMismatch {
                what: "task graph devices",
                detail: format!(
                    "{} devices for {} lanes; one per lane",
                    devs.len(),
                    self.lanes.len()
                ),
            });
        }
        devs[0].bind()?;
        let origin = &streams[0];
        let others = distinct_others(streams);
        for s in &others {
            origin.cudarc().join(s.cudarc()).call("cuStreamWaitEvent")?;
        }
        let panics = PanicLog::default();
        let done = self.submit(devs, &plan, streams, signals, &panics, Mode::Direct)?;
        let mut tails = Vec::new();
        for s in std::iter::once(origin).chain(others.iter()) {
            tails.push(record(s)?);
        }
        let tasks = self
            .tasks
            .iter()
            .zip(done)
            .map(|(t, ev)| RunTask {
                what: self.describe(t, signals),
                release: self.release_of(t, signals),
                done: ev,
            })
            .collect();
        Ok(GraphRun::new(
            format!("task graph run ({} tasks)", self.tasks.len()),
            RunState::Direct { tasks, tails },
            panics,
            streams.to_vec(),
        ))
    }

    /// Resets the signals, forks the lanes from `streams[0]` and submits every task in plan order.
    /// `devs[lane]` is the device of each lane's stream (all the same on one GPU; see
    /// [`crate::ordering::MultiTaskGraph`]). Returns the event recorded after each task.
    pub(super) fn submit(
        &self,
        devs: &[&Device],
        plan: &Plan,
        streams: &[Stream],
        signals: &[&Signal<u64>],
        panics: &PanicLog,
        mut mode: Mode<'_>,
    ) -> Result<Vec<CudaEvent>> {
        let capturing = matches!(mode, Mode::Capture { .. });
        let origin = &streams[0];
        for s in signals {
            if capturing {
                // SAFETY: the captured graph keeps the signal; the caller ordered `origin` after
                // its zeroing before the capture began.
                unsafe { s.write_untracked(origin, 0) }?
            } else {
                s.enqueue_write(origin, 0)?
            }
        }
        let fork = record(origin)?;
        for s in distinct_others(streams) {
            s.cudarc().wait(&fork).call("cuStreamWaitEvent")?;
        }
        let mut incoming: Vec<Vec<usize>> = vec![Vec::new(); self.tasks.len()];
        for e in plan.edges() {
            if e.kind == EdgeKind::Dependency || (capturing && e.kind == EdgeKind::Signal) {
                incoming[e.to.index()].push(e.from.index());
            }
        }
        let mut done: Vec<Option<CudaEvent>> = (0..self.tasks.len()).map(|_| None).collect();
        // Trace hook (issue 12): direct runs only (events cannot be timed inside a capture).
        let tracer = if capturing { None } else { trace::active() };
        if let Some(tr) = &tracer {
            for (s, name) in streams.iter().zip(&self.lanes) {
                tr.name_stream(s, format!("lane {name}"));
            }
        }
        for &id in plan.order() {
            let task = &self.tasks[id.index()];
            let stream = &streams[task.lane];
            let dev = devs[task.lane];
            let cross: Vec<usize> = incoming[id.index()]
                .iter()
                .copied()
                .filter(|&from| streams[self.tasks[from].lane] != *stream)
                .collect();
            let deps_name = || format!("{} waits for its dependencies", task.label);
            let tr = tracer.as_ref().filter(|_| !cross.is_empty());
            trace::traced(tr, stream, Stage::Wait, deps_name, || {
                for &from in &cross {
                    let ev = done[from].as_ref().ok_or_else(|| Error::BadShape {
                        what: "task graph plan",
                        detail: format!("task {from} is not submitted before its successor"),
                    })?;
                    stream.cudarc().wait(ev).call("cuStreamWaitEvent")?;
                }
                Ok(())
            })?;
            let stage = match &task.op {
                Op::Kernel(_) | Op::Gemm(_) | Op::Typed(_) => Stage::Kernel,
                Op::Copy { .. } => Stage::Copy,
                Op::Wait { .. } => Stage::Wait,
                Op::Set { .. } | Op::Add { .. } => Stage::Signal,
                Op::Host(_) => Stage::Host,
            };
            let name = || task.label.clone();
            trace::traced(tracer.as_ref(), stream, stage, name, || {
                self.submit_op(dev, task, stream, signals, panics, &mut mode)
            })?;
            done[id.index()] = Some(record(stream)?);
        }
        done.into_iter()
            .enumerate()
            .map(|(i, e)| {
                e.ok_or_else(|| Error::BadShape {
                    what: "task graph plan",
                    detail: format!("task {i} is missing from the submission order"),
                })
            })
            .collect()
    }

    /// Queues one task's operation on `stream`.
    fn submit_op(
        &self,
        dev: &Device,
        task: &super::Task<'g>,
        stream: &Stream,
        signals: &[&Signal<u64>],
        panics: &PanicLog,
        mode: &mut Mode<'_>,
    ) -> Result<()> {
        let capturing = matches!(mode, Mode::Capture { .. });
        let lane_stream = match mode {
            Mode::Capture { user, .. } => &user[task.lane],
            Mode::Direct => stream,
        };
        {
            match &task.op {
                Op::Kernel(f) => f(&TaskContext {
                    dev,
                    stream,
                    graph: self.id,
                    signals,
                })?,
                Op::Gemm(p) => {
                    if capturing {
                        // SAFETY: `stream` is the private capture stream of the plan's lane, whose
                        // stream is the plan's (check_gemm_streams); the captured graph is
                        // launched only on the lane streams, ordered after every lane stream's
                        // earlier work (the table's upload) and before its later work (the
                        // table's free), and it keeps the plan until it is dropped.
                        unsafe { p.launch_on(stream) }?
                    } else {
                        p.launch()?
                    }
                }
                Op::Typed(t) => {
                    // SAFETY: TaskGraph::typed's contract for the accesses; the views are checked
                    // against the lane's stream, and `stream` is it (a direct run) or the lane's
                    // private capture stream, whose graph is launched only on the lane streams,
                    // after their earlier work and before their later work (the buffers' frees),
                    // and while the views' borrows (for 'g) hold.
                    unsafe { t.launch(lane_stream, stream) }?
                }
                // SAFETY: TaskGraph::copy's contract: live, non-overlapping allocations.
                Op::Copy { dst, src, bytes } => {
                    unsafe { memops::memcpy_dtod_async(*dst, *src, *bytes, stream.raw()) }?
                }
                Op::Wait { signal, cmp, value } => {
                    let s = signals[*signal];
                    if capturing {
                        // SAFETY: as for the resets above.
                        unsafe { s.wait_untracked(stream, *cmp, *value) }?
                    } else {
                        // Registered for the reaper's gate, so no blocking free runs behind it
                        // (issue 19, item 8); the run's watchdog reports it.
                        let _entry = crate::reaper::enter_wait();
                        s.enqueue_wait(stream, *cmp, *value)?;
                        let done = std::sync::Arc::new(stream.record_marker()?);
                        crate::ordering::registry::register_gate_wait(done);
                    }
                }
                Op::Set { signal, value } => {
                    let s = signals[*signal];
                    if capturing {
                        // SAFETY: as for the resets above.
                        unsafe { s.write_untracked(stream, *value) }?
                    } else {
                        s.enqueue_write(stream, *value)?
                    }
                }
                Op::Add { signal, value } => {
                    let s = signals[*signal];
                    if capturing {
                        // SAFETY: as for the resets above.
                        unsafe { s.add_untracked(dev, stream, *value) }?
                    } else {
                        s.add(dev, stream, *value)?
                    }
                }
                Op::Host(f) => launch_host(stream, f, panics, mode)?,
            }
        }
        Ok(())
    }
}
