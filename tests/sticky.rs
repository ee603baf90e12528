//! Finding 19 of issue 9 in a binary of its own: an illegal address is sticky for the whole device
//! in this process (measured on the H100: after it, even `cuDevicePrimaryCtxRetain` reports
//! `CUDA_ERROR_ILLEGAL_ADDRESS`), so no other test may share the process. Prints SKIPPED without a
//! driver.

use warpline::kernels::signal;
use warpline::{Error, MemPool};
use warpline_gpu::contract::signal as sigc;
use warpline_suite::support::gpu_in_new_context_or_skip;

#[test]
fn finding_19_sticky_error_poisons_the_device_and_names_the_launch() {
    // A context of its own: the illegal address poisons only it, not the primary context the
    // other tests of this binary use.
    let Some(dev) = gpu_in_new_context_or_skip(
        "finding_19_sticky_error_poisons_the_device_and_names_the_launch",
    ) else {
        return;
    };
    let s = dev.new_stream().unwrap();
    // SAFETY: deliberately not a live device address: the point is the illegal-address fault,
    // confined to this test's own context.
    unsafe { signal::signal_set(&dev, &s, 0x1000, 1) }.unwrap();
    let e = s.synchronize().unwrap_err();
    let Error::ContextPoisoned {
        first,
        recent_launches,
        ..
    } = &e
    else {
        panic!("expected ContextPoisoned, got {e}")
    };
    assert!(first.contains("ILLEGAL_ADDRESS"), "{first}");
    assert!(
        recent_launches
            .last()
            .is_some_and(|l| l.contains(sigc::SET_KERNEL) && l.contains("grid [1, 1, 1]")),
        "{recent_launches:?}"
    );
    assert!(e.to_string().contains("restart"), "{e}");
    // Every later call on the device is refused with the first error.
    for e in [
        dev.new_stream().map(|_| ()).unwrap_err(),
        MemPool::new(&dev, 0).map(|_| ()).unwrap_err(),
        dev.check_healthy().unwrap_err(),
        dev.synchronize().unwrap_err(),
    ] {
        assert!(
            matches!(&e, Error::ContextPoisoned { first: f, .. } if f == first),
            "{e}"
        );
    }
}
