//! Time stamps: `%globaltimer`, the GPU-wide nanosecond timer (PTX ISA §10.29), comparable across
//! SMs and kernels, used to show kernel overlap (PDL) without a profiler.

use core::arch::asm;

/// `mov.u64 %globaltimer`: nanoseconds of the GPU's global timer (its resolution is set by the
/// driver, typically about 1 µs on Hopper, finer under a profiler).
#[inline(always)]
pub fn global_timer_ns() -> u64 {
    let t: u64;
    // SAFETY: reads a special register; volatile (no `pure`) so each call reads it anew.
    unsafe { asm!("mov.u64 {t}, %globaltimer;", t = out(reg64) t, options(nomem, nostack)) };
    t
}
