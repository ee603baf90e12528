//! Programmatic Dependent Launch, PTX ISA §9.7.12.x `griddepcontrol` (sm_90).
//!
//! A kernel launched with the PDL attribute may begin while the previous kernel on its stream is
//! still running. The rule (chapter 11, "Programmatic Dependent Launch"): the primary calls
//! [`launch_dependents`] only after every write the dependent kernel reads has been made; the
//! dependent calls [`wait`] before reading anything the primary wrote. Work before `wait` (shared
//! memory setup, barrier init, loads of independent data) overlaps the primary's tail.

use core::arch::asm;

/// `griddepcontrol.launch_dependents`: lets the dependent grid start once every CTA of this grid
/// has called it (or exited). Call after the last store the dependent reads. The first thread of a
/// CTA to execute it triggers for the whole CTA (later calls in the CTA have no effect), so put it
/// behind a CTA (or cluster) barrier that follows every thread's stores. It does not make those
/// stores visible: the dependent's [`wait`] does.
#[inline(always)]
pub fn launch_dependents() {
    // SAFETY: no operands; a memory clobber keeps earlier stores before it in program order.
    unsafe { asm!("griddepcontrol.launch_dependents;", options(nostack)) };
}

/// `griddepcontrol.wait`: blocks until the prerequisite grids have completed and their memory is
/// visible. Also a compiler memory barrier: no load is hoisted above it. Returns at once when the
/// kernel was launched without the PDL attribute. Wait before the first access (read *or* write)
/// to memory the previous kernel on the stream touches.
#[inline(always)]
pub fn wait() {
    // SAFETY: no operands.
    unsafe { asm!("griddepcontrol.wait;", options(nostack)) };
}
