//! Signals: 64-bit flags in global memory that one agent sets and another waits on, with
//! acquire/release semantics at GPU scope (PTX ISA 8.0 §8 "Memory Consistency Model", §9.7.9.8
//! `ld` with `.acquire`, §9.7.9.10 `st` with `.release`, §9.7.13.5 `atom` with `.release`,
//! §9.7.9.26 `nanosleep`). The host side is `warpline::ordering::Signal`, whose on-stream
//! operations (`cuStreamWaitValue64` / `cuStreamWriteValue64`) act on the same word.
//!
//! Semantics: a [`signal_set`] / [`signal_add`] is a *release*: every memory operation this thread
//! performed before it becomes visible, at GPU scope, to any thread whose [`signal_wait_geq`] /
//! [`signal_wait_eq`] / [`signal_load`] (an *acquire*) observes the value written (or a later
//! value). So the producer writes its data, then sets the signal; the consumer waits, then reads the
//! data. Release covers only the calling thread's own writes: when a whole CTA produced the data,
//! synchronise the CTA (`bar.sync`) before one thread sets the signal. Scope is `.gpu`: host and
//! peer-GPU observers need `.sys`, which warpline does not offer.
//!
//! A spinning wait holds its SM: a kernel that waits on a signal set by a kernel that cannot start
//! until the waiter exits deadlocks (the NVSHMEM "CUDA stream order and execution resources"
//! seed). Order such kernels with events (warpline's `TaskGraph` dependencies) or wait on the
//! stream with `Signal::wait_until`, which holds no SM.

use core::arch::asm;

/// `ld.acquire.gpu.global.u64`: the signal's current value, as an acquire.
///
/// # Safety
/// `sig` is an 8-byte aligned pointer into live global memory.
#[inline(always)]
pub unsafe fn signal_load(sig: *const u64) -> u64 {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let v: u64;
        asm!("ld.acquire.gpu.global.u64 {v}, [{p}];", v = out(reg64) v, p = in(reg64) sig,
            options(nostack));
        v
    }
}

/// `st.release.gpu.global.u64`: sets the signal to `value`, as a release.
///
/// # Safety
/// `sig` is an 8-byte aligned pointer into live global memory.
#[inline(always)]
pub unsafe fn signal_set(sig: *mut u64, value: u64) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        asm!("st.release.gpu.global.u64 [{p}], {v};", p = in(reg64) sig, v = in(reg64) value,
            options(nostack));
    }
}

/// `atom.release.gpu.global.add.u64`: adds `value` to the signal as a release; returns the old
/// value.
///
/// # Safety
/// `sig` is an 8-byte aligned pointer into live global memory.
#[inline(always)]
pub unsafe fn signal_add(sig: *mut u64, value: u64) -> u64 {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let old: u64;
        asm!("atom.release.gpu.global.add.u64 {o}, [{p}], {v};", o = out(reg64) old,
            p = in(reg64) sig, v = in(reg64) value, options(nostack));
        old
    }
}

/// `nanosleep.u32`: suspends the thread for about `ns` nanoseconds (at most 1 ms), so spinning
/// waiters leave issue slots to the threads that will set the signal.
#[inline(always)]
pub fn nanosleep(ns: u32) {
    // SAFETY: no memory operands.
    unsafe { asm!("nanosleep.u32 {n};", n = in(reg32) ns, options(nostack, nomem)) };
}

/// `%globaltimer`: a nanosecond wall clock shared by all SMs (PTX ISA §10.32).
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let t: u64;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nostack, nomem)) };
    t
}

/// Spins (acquire loads, backing off with `nanosleep`) until the signal is `>= value`; returns
/// the value observed. Never returns if no one sets it.
///
/// # Safety
/// As [`signal_load`].
#[inline(always)]
pub unsafe fn signal_wait_geq(sig: *const u64, value: u64) -> u64 {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let mut backoff = 32;
        loop {
            let v = signal_load(sig);
            if v >= value {
                return v;
            }
            nanosleep(backoff);
            backoff = core::cmp::min(backoff * 2, 1024);
        }
    }
}

/// Spins until the signal is `== value` (acquire), as [`signal_wait_geq`].
///
/// # Safety
/// As [`signal_load`].
#[inline(always)]
pub unsafe fn signal_wait_eq(sig: *const u64, value: u64) {
    // SAFETY: the caller upholds this function's `# Safety` contract.
    unsafe {
        let mut backoff = 32;
        while signal_load(sig) != value {
            nanosleep(backoff);
            backoff = core::cmp::min(backoff * 2, 1024);
        }
    }
}

/// `fence.acq_rel.gpu` (PTX ISA 8.3 §9.7.12.4, `membar.gl`): this thread's memory operations
/// before it are ordered before its operations after it, for every thread of the device. The
/// writer side of [`count_arrival`] runs it after its writes, the last arriver before its reads.
#[inline(always)]
pub fn fence_gpu() {
    // SAFETY: a fence only orders memory operations.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) };
}

/// Counts one arrival of `expected` on a last-arriver counter (`atom.acq_rel.gpu.global.add.u32`,
/// PTX ISA §9.7.13.5) and returns whether this one was the last. The last arriver writes 0 back,
/// so the counter is zero again for the next launch. Flash-decoding's combine (the decode
/// attention's split-KV merge) ends this way, as a stream-K fix-up would
/// (`notes/stream-k-attempt.diff`); no CTA ever waits for a peer (no spin, so no deadlock
/// whatever the residency). A counter that already held `expected` or more (not zero at the
/// launch, or more arrivals than `expected`) traps instead of letting anyone read partials that
/// were never written.
///
/// Pattern: every writer thread writes its partials and runs [`fence_gpu`], the CTA (or the
/// writing threads) synchronise, one thread calls this and broadcasts the answer, and the last
/// arriver's threads run [`fence_gpu`] before reading the others' partials.
///
/// # Safety
/// `ctr` is a 4-byte aligned global u32 that, during the launch, only the `expected` arrivals
/// touch, each once.
#[inline(always)]
pub unsafe fn count_arrival(ctr: *mut u32, expected: u32) -> bool {
    let old: u32;
    // SAFETY: the caller's contract.
    unsafe {
        asm!("atom.acq_rel.gpu.global.add.u32 {o}, [{p}], 1;", o = out(reg32) old,
            p = in(reg64) ctr, options(nostack));
    }
    if old >= expected {
        // SAFETY: `trap` aborts the kernel; no preconditions.
        unsafe { core::arch::nvptx::trap() };
    }
    let last = old == expected - 1;
    if last {
        // SAFETY: every arrival counted: nobody else touches the counter in this launch.
        unsafe { ctr.write_volatile(0) };
    }
    last
}
