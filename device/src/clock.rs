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

/// Folds `%globaltimer` into the u64 at `word`: `red.relaxed.gpu.global.min.u64` (`max` false:
/// the earliest stamp of all callers) or `.max.u64` (`max` true: the latest). One atomic per call,
/// so many CTAs may stamp the same word; the timeline's kernel stamps (issue 21) start each word
/// at `u64::MAX` (minima) or 0 (maxima).
///
/// # Safety
/// `word` is an 8-byte aligned global address of a u64 that only such stamps touch while
/// callers run.
#[inline(always)]
pub unsafe fn stamp_word(word: *mut u64, max: bool) {
    let now = global_timer_ns();
    // SAFETY: the caller's contract; a relaxed atomic reduction.
    unsafe {
        if max {
            asm!("red.relaxed.gpu.global.max.u64 [{a}], {v};", a = in(reg64) word,
                v = in(reg64) now, options(nostack));
        } else {
            asm!("red.relaxed.gpu.global.min.u64 [{a}], {v};", a = in(reg64) word,
                v = in(reg64) now, options(nostack));
        }
    }
}
