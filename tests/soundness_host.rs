//! Regression tests of the host-side soundness findings (issue 9): one test per finding, named
//! after it. CPU tests always run; GPU tests print `SKIPPED ...` without a driver.
//!
//! Compile-time parts live in doctests: `Device::cudarc_context` and `Stream::cudarc_stream`
//! (finding 10) and `kernels::pdl::pdl_consumer_variant` (finding 12) must be called in `unsafe`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use warpline::kernels::{self, pdl as kpdl, signal};
use warpline::launch::{launch_raw, LaunchConfig, LaunchLimits};
use warpline::pipeline::IN_FLIGHT_PER_STREAM;
use warpline::{params, reference, BatchPipeline, Device, Error, MemPool, PinnedBuffer, Stream};
use warpline_gpu::contract::{signal as sigc, vector_add as vac};
use warpline_suite::support::{gpu_in_new_context_or_skip, gpu_or_skip, random_f32};

/// How long the busy kernels of the drain tests spin: long enough that a pipeline that returns
/// without draining is caught with its copies still pending.
const SPIN_NS: u64 = 300_000_000;

/// The bits `ws_busy_fill` writes at element `i` with `seed`, as f32.
fn pattern(seed: u32, i: usize) -> f32 {
    f32::from_bits(sigc::pattern(seed, i as u32))
}

/// Queues `ws_busy_fill` into `out` (spins `SPIN_NS`, then writes the pattern).
fn busy_fill_into(
    dev: &Device,
    s: &Stream,
    out: warpline::DeviceViewMut<'_, f32>,
    seed: u32,
) -> warpline::Result<()> {
    // SAFETY: `out` is a live, exclusively borrowed allocation of out.len() f32 (4-byte aligned)
    // bound to `s` (the pipeline hands out views of buffers on `s`).
    unsafe { signal::busy_fill(dev, s, out.device_ptr(), out.len() as u32, seed, SPIN_NS) }
}

// ------------------------------------------------------------------------------------------------
// Finding 10: cudarc interop
// ------------------------------------------------------------------------------------------------

#[test]
fn finding_10_interop_is_raw_handles_or_unsafe_cudarc() {
    let Some(dev) = gpu_or_skip("finding_10_interop_is_raw_handles_or_unsafe_cudarc") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    assert_eq!(s.context_raw(), dev.raw_context());
    assert!(!s.raw().is_null());
    // SAFETY: only reads handles; no CudaSlice is created.
    let (ctx, cs) = unsafe { (dev.cudarc_context(), s.cudarc_stream()) };
    assert_eq!(ctx.cu_ctx(), dev.raw_context());
    assert_eq!(cs.cu_stream(), s.raw());
    assert!(!ctx.is_event_tracking(), "warpline runs with tracking off");
}

// ------------------------------------------------------------------------------------------------
// Finding 11: the pipeline drains every stream on every exit
// ------------------------------------------------------------------------------------------------

/// Inputs and a NaN-poisoned output of `batches` batches of `batch` elements.
fn drain_setup(dev: &Device, batch: usize, batches: usize) -> [PinnedBuffer<f32>; 3] {
    let n = batch * batches;
    let a = PinnedBuffer::from_slice(dev, &random_f32(n)).unwrap();
    let b = PinnedBuffer::from_slice(dev, &random_f32(n)).unwrap();
    let mut c = PinnedBuffer::<f32>::new(dev, n).unwrap();
    c.fill(f32::NAN);
    [a, b, c]
}

/// Batch `i` of `c` holds the busy-fill pattern of seed `i` (its D2H completed).
fn assert_batch_landed(c: &[f32], batch: usize, i: usize) {
    for (j, &v) in c[i * batch..(i + 1) * batch].iter().enumerate() {
        assert_eq!(
            v.to_bits(),
            pattern(i as u32, j).to_bits(),
            "batch {i} element {j}: its D2H had not completed when run() returned"
        );
    }
}

#[test]
fn finding_11_pipeline_drains_before_a_kernel_panic_unwinds() {
    let Some(dev) = gpu_or_skip("finding_11_pipeline_drains_before_a_kernel_panic_unwinds") else {
        return;
    };
    let batch = 4096;
    let [a, b, mut c] = drain_setup(&dev, batch, 4);
    let pipe = BatchPipeline::new(&dev, 3).unwrap();
    let mut i = 0;
    let r = catch_unwind(AssertUnwindSafe(|| {
        pipe.run(
            &a,
            &b,
            &mut c,
            batch,
            |s, _x, _y, z| {
                i += 1;
                if i == 3 {
                    panic!("kernel closure panics at batch 2");
                }
                busy_fill_into(&dev, s, z, i - 1)
            },
            |_, _| {},
        )
    }));
    assert!(r.is_err(), "the closure panicked");
    // Batches 0 and 1 spin 300 ms before their D2H: without the drain they are still pending.
    assert_batch_landed(&c, batch, 0);
    assert_batch_landed(&c, batch, 1);
}

#[test]
fn finding_11_pipeline_drains_before_returning_an_error() {
    let Some(dev) = gpu_or_skip("finding_11_pipeline_drains_before_returning_an_error") else {
        return;
    };
    let batch = 4096;
    let [a, b, mut c] = drain_setup(&dev, batch, 4);
    let pipe = BatchPipeline::new(&dev, 3).unwrap();
    let mut i = 0;
    let e = pipe
        .run(
            &a,
            &b,
            &mut c,
            batch,
            |s, _x, _y, z| {
                i += 1;
                if i == 3 {
                    return Err(Error::Empty { what: "injected" });
                }
                busy_fill_into(&dev, s, z, i - 1)
            },
            |_, _| {},
        )
        .unwrap_err();
    assert!(matches!(e, Error::Empty { what: "injected" }), "{e}");
    assert_batch_landed(&c, batch, 0);
    assert_batch_landed(&c, batch, 1);
}

#[test]
fn finding_11_pipeline_drains_before_a_progress_panic_unwinds() {
    let Some(dev) = gpu_or_skip("finding_11_pipeline_drains_before_a_progress_panic_unwinds")
    else {
        return;
    };
    let batch = 4096;
    let [a, b, mut c] = drain_setup(&dev, batch, 3);
    let pipe = BatchPipeline::new(&dev, 3).unwrap();
    let mut i = 0;
    let r = catch_unwind(AssertUnwindSafe(|| {
        pipe.run(
            &a,
            &b,
            &mut c,
            batch,
            |s, _x, _y, z| {
                i += 1;
                busy_fill_into(&dev, s, z, i - 1)
            },
            |_, _| panic!("progress panics at the first completed batch"),
        )
    }));
    assert!(r.is_err());
    for k in 0..3 {
        assert_batch_landed(&c, batch, k);
    }
}

#[test]
fn finding_11_21_pipeline_holds_a_bounded_number_of_events() {
    let Some(dev) = gpu_or_skip("finding_11_21_pipeline_holds_a_bounded_number_of_events") else {
        return;
    };
    let (batch, batches, streams) = (1024, 300, 2);
    let n = batch * batches - 5; // uneven last batch
    let a = PinnedBuffer::from_slice(&dev, &random_f32(n)).unwrap();
    let b = PinnedBuffer::from_slice(&dev, &random_f32(n)).unwrap();
    let want = reference::vector_add(&a, &b);
    let mut c = PinnedBuffer::<f32>::new(&dev, n).unwrap();
    c.fill(f32::NAN);
    let pipe = BatchPipeline::new(&dev, streams).unwrap();
    let mut max_live = 0;
    let report = pipe
        .run_vector_add(&a, &b, &mut c, batch, |_, _| {
            max_live = max_live.max(warpline::stream::live_events());
        })
        .unwrap();
    // Own events: 4 per in-flight batch + the origin; other tests of this binary may hold a few.
    let bound = 4 * IN_FLIGHT_PER_STREAM * streams + 1 + 32;
    assert!(
        max_live <= bound,
        "{max_live} events alive during a {batches}-batch run; at most {bound} expected (the old pipeline kept 4 per batch)"
    );
    assert_eq!(report.batches.len(), batches);
    for (i, t) in report.batches.iter().enumerate() {
        assert_eq!(t.batch, i);
        assert!(
            t.end_ms >= t.start_ms && t.h2d_ms >= 0.0 && t.d2h_ms >= 0.0,
            "{t:?}"
        );
    }
    for (i, (&g, &w)) in c.iter().zip(&want).enumerate() {
        assert!(
            ((g as f64) - w).abs() <= w.abs() * f32::EPSILON as f64,
            "element {i}: {g} vs {w}"
        );
    }
}

// ------------------------------------------------------------------------------------------------
// Finding 12: PDL negative controls are unsafe; the safe pair is correct
// ------------------------------------------------------------------------------------------------

#[test]
fn finding_12_safe_pdl_pair_matches_reference() {
    let Some(dev) = gpu_or_skip("finding_12_safe_pdl_pair_matches_reference") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let n = 100_003;
    let (inp_h, scale_h) = (random_f32(n), random_f32(n));
    let mut inp = pool.alloc_async::<f32>(&s, n).unwrap();
    let mut scale = pool.alloc_async::<f32>(&s, n).unwrap();
    let mut buf = pool.alloc_async::<f32>(&s, n).unwrap();
    let mut out = pool.alloc_async::<f32>(&s, n).unwrap();
    inp.copy_from_host(&inp_h).unwrap();
    scale.copy_from_host(&scale_h).unwrap();
    for pdl in [false, true] {
        buf.fill_async(f32::NAN).unwrap();
        out.fill_async(f32::NAN).unwrap();
        kpdl::pdl_pair(
            &dev,
            &s,
            inp.as_view(),
            buf.as_view_mut(),
            scale.as_view(),
            out.as_view_mut(),
            64,
            pdl,
        )
        .unwrap();
        let mut got = vec![0f32; n];
        out.copy_to_host(&mut got).unwrap();
        for i in 0..n {
            let buf_i = (2.0 * inp_h[i] as f64 + 1.0) as f32 as f64;
            let want = buf_i * scale_h[i] as f64;
            assert!(
                (got[i] as f64 - want).abs() <= 2.0 * want.abs() * f32::EPSILON as f64 + 1e-30,
                "pdl {pdl} element {i}: {} vs {want}",
                got[i]
            );
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Finding 15: launch validation
// ------------------------------------------------------------------------------------------------

#[test]
fn finding_15_cpu_limits_reject_overflow_and_oversized_dimensions() {
    let l = LaunchLimits::SM90;
    let mut cfg = LaunchConfig::linear(1, 1, 0);
    cfg.block = [65536, 65536, 1];
    assert!(matches!(cfg.check("k", &l), Err(Error::TooLarge { .. })));
    cfg.block = [1, 1, 1];
    cfg.grid = [1, 65536, 1];
    assert!(matches!(
        cfg.check("k", &l),
        Err(Error::TooLarge {
            what: "grid y (CTAs)",
            ..
        })
    ));
    let big_cluster = LaunchConfig::linear(32, 32, 0).with_cluster_x(16);
    assert!(matches!(
        big_cluster.check("k", &l),
        Err(Error::TooLarge { .. })
    ));
}

#[test]
fn finding_15_validate_uses_the_kernels_own_shared_memory_limit() {
    let Some(dev) = gpu_or_skip("finding_15_validate_uses_the_kernels_own_shared_memory_limit")
    else {
        return;
    };
    let caps = dev.capabilities();
    assert_eq!(caps.max_grid_dim, [i32::MAX as u32, 65535, 65535]);
    assert_eq!(caps.max_block_dim, [1024, 1024, 64]);
    // A kernel without shared memory in its spec keeps the 48 KiB default.
    let k = dev.kernel(sigc::COPY_KERNEL).unwrap();
    assert_eq!(k.max_dynamic_shared_memory(), 48 * 1024);
    let over = LaunchConfig::linear(1, 32, 48 * 1024 + 16);
    let e = over.validate(&dev, sigc::COPY_KERNEL).unwrap_err();
    assert!(
        matches!(e, Error::SharedMemory { max, .. } if max == 48 * 1024),
        "{e}"
    );
    // Raising it is allowed up to the opt-in limit and then validates.
    let optin = caps.max_shared_mem_per_block_optin;
    let e = k
        .set_max_dynamic_shared_memory(optin - k.static_shared_memory() + 1)
        .unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    k.set_max_dynamic_shared_memory(64 * 1024).unwrap();
    assert_eq!(k.max_dynamic_shared_memory(), 64 * 1024);
    over.validate(&dev, sigc::COPY_KERNEL).unwrap();
    // The vector_add kernel's limit was raised at open to what it needs.
    let v = dev.kernel(vac::KERNEL).unwrap();
    assert!(v.max_dynamic_shared_memory() >= vac::SMEM_BYTES);
}

// ------------------------------------------------------------------------------------------------
// Finding 16: zero-sized types, misaligned fill values, NUL in PTX
// ------------------------------------------------------------------------------------------------

#[test]
fn finding_16_nul_in_ptx_is_a_typed_error_before_the_driver() {
    // SAFETY: the PTX is refused before anything is loaded (no entry is ever launched).
    let e = unsafe { Device::open_with_ptx(0, ".version 8.0\n\0") }.unwrap_err();
    assert!(matches!(e, Error::PtxNul { offset: 13 }), "{e}");
    // SAFETY: as above.
    let e = unsafe { Device::open_in_new_context_with_ptx(0, "\0") }.unwrap_err();
    assert!(matches!(e, Error::PtxNul { offset: 0 }), "{e}");
}

#[test]
fn finding_16_zero_sized_types_are_rejected() {
    let Some(dev) = gpu_or_skip("finding_16_zero_sized_types_are_rejected") else {
        return;
    };
    let e = PinnedBuffer::<()>::new(&dev, 8).map(|_| ()).unwrap_err();
    assert!(matches!(e, Error::ZeroSizedType { .. }), "{e}");
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let e = pool.alloc_async::<()>(&s, 8).unwrap_err();
    assert!(matches!(e, Error::ZeroSizedType { .. }), "{e}");
}

#[test]
fn finding_16_fill_with_an_align_1_four_byte_type() {
    let Some(dev) = gpu_or_skip("finding_16_fill_with_an_align_1_four_byte_type") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let n = 1001;
    let mut d = pool.alloc_async::<[u8; 4]>(&s, n).unwrap();
    let v: [u8; 4] = rand::random();
    d.fill_async(v).unwrap();
    let mut host = vec![[0u8; 4]; n];
    d.copy_to_host(&mut host).unwrap();
    assert!(host.iter().all(|&h| h == v), "{v:?}");
}

// ------------------------------------------------------------------------------------------------
// Finding 18: a stale cudarc error does not replace the wait
// ------------------------------------------------------------------------------------------------

#[test]
fn finding_18_synchronize_waits_despite_a_deferred_cudarc_error() {
    let Some(dev) =
        gpu_in_new_context_or_skip("finding_18_synchronize_waits_despite_a_deferred_cudarc_error")
    else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let n = 1 << 16;
    let mut d = pool.alloc_async::<f32>(&s, n).unwrap();
    busy_fill_into(&dev, &s, d.as_view_mut(), 7).unwrap();
    let done = s.record().unwrap();
    // What cudarc does when one of its Drops fails: the error lands in the context's slot.
    // SAFETY: only records an error value; no CudaSlice is involved.
    unsafe { dev.cudarc_context() }.record_err::<()>(Err(cudarc::driver::DriverError(
        cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
    )));
    let t = Instant::now();
    s.synchronize()
        .expect("the stale error is not this synchronize's");
    assert!(
        done.is_complete().unwrap(),
        "synchronize returned before the work finished"
    );
    assert!(
        t.elapsed() >= Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    let deferred = dev.take_deferred_errors();
    assert!(
        deferred.iter().any(|e| e.contains("INVALID_VALUE")),
        "the stale error is reported separately: {deferred:?}"
    );
    // A drop after a stale error still frees (no new deferred error), and the data is right.
    let mut host = vec![0f32; n];
    d.copy_to_host(&mut host).unwrap();
    for (i, &h) in host.iter().enumerate() {
        assert_eq!(h.to_bits(), pattern(7, i).to_bits(), "element {i}");
    }
    // SAFETY: as above.
    unsafe { dev.cudarc_context() }.record_err::<()>(Err(cudarc::driver::DriverError(
        cudarc::driver::sys::CUresult::CUDA_ERROR_INVALID_VALUE,
    )));
    drop(d);
    s.synchronize().unwrap();
    let deferred = dev.take_deferred_errors();
    assert!(
        deferred.iter().all(|e| e.contains("INVALID_VALUE")),
        "the free after a stale error failed: {deferred:?}"
    );
}

// ------------------------------------------------------------------------------------------------
// Finding 19: sticky errors, launch errors, out of memory
// ------------------------------------------------------------------------------------------------

#[test]
fn finding_19_launch_errors_name_the_kernel_and_configuration() {
    let Some(dev) = gpu_or_skip("finding_19_launch_errors_name_the_kernel_and_configuration")
    else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let k = dev.kernel(sigc::SET_KERNEL).unwrap();
    let mut cfg = LaunchConfig::linear(1, 1, 0);
    cfg.block = [2048, 1, 1]; // not validated: the driver rejects it
    let (p, v) = (0u64, 0u64);
    // SAFETY: the driver rejects the configuration before anything runs.
    let e = unsafe { launch_raw(&dev, k, &s, &cfg, &mut params![p, v]) }.unwrap_err();
    let Error::Launch { kernel, config, .. } = &e else {
        panic!("expected Error::Launch, got {e}")
    };
    assert_eq!(kernel, sigc::SET_KERNEL);
    assert!(config.contains("block [2048, 1, 1]"), "{config}");
    dev.check_healthy().unwrap();
}

#[test]
fn finding_19_out_of_memory_names_bytes_asked_and_free() {
    let Some(dev) = gpu_or_skip("finding_19_out_of_memory_names_bytes_asked_and_free") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    // All of the device's memory minus 1 MiB: more than is free (the context itself uses some).
    let want = dev.capabilities().total_mem - (1 << 20);
    let e = pool.alloc_async::<u8>(&s, want).unwrap_err();
    let Error::OutOfMemory {
        requested, free, ..
    } = &e
    else {
        panic!("expected OutOfMemory, got {e}")
    };
    assert_eq!(*requested, want as u64);
    assert!(free.is_some_and(|f| f < want as u64), "{e}");
    assert!(e.to_string().contains(&want.to_string()), "{e}");
    // Not sticky: the device still works.
    let mut d = pool.alloc_async::<f32>(&s, 16).unwrap();
    d.copy_from_host(&[1.0; 16]).unwrap();
}

// ------------------------------------------------------------------------------------------------
// Finding 21: the process-wide default pool is left as it was
// ------------------------------------------------------------------------------------------------

#[test]
fn finding_21_default_pool_threshold_is_not_changed_behind_the_users_back() {
    let Some(dev) =
        gpu_or_skip("finding_21_default_pool_threshold_is_not_changed_behind_the_users_back")
    else {
        return;
    };
    let before = MemPool::default_pool_release_threshold(&dev).unwrap();
    {
        let pipe = BatchPipeline::new(&dev, 2).unwrap();
        assert!(pipe.pool().is_owned());
        let a = PinnedBuffer::from_slice(&dev, &random_f32(10_000)).unwrap();
        let b = PinnedBuffer::from_slice(&dev, &random_f32(10_000)).unwrap();
        let mut c = PinnedBuffer::<f32>::new(&dev, 10_000).unwrap();
        pipe.run_vector_add(&a, &b, &mut c, 3000, |_, _| {})
            .unwrap();
        warpline::bandwidth::pinned_h2d_gbps(&dev, 1 << 20, 2).unwrap();
    }
    assert_eq!(
        MemPool::default_pool_release_threshold(&dev).unwrap(),
        before
    );
    // An explicit default-pool handle changes it while it lives and restores it on drop.
    let other = before.wrapping_add(12345);
    let p = MemPool::device_default(&dev, other).unwrap();
    let q = p.clone();
    drop(p);
    assert_eq!(q.release_threshold().unwrap(), other);
    drop(q);
    assert_eq!(
        MemPool::default_pool_release_threshold(&dev).unwrap(),
        before
    );
}

// ------------------------------------------------------------------------------------------------
// Device::open_in_new_context and Error::WrongContext
// ------------------------------------------------------------------------------------------------

#[test]
fn open_in_new_context_loads_every_kernel_and_rejects_foreign_streams() {
    let Some(dev) =
        gpu_or_skip("open_in_new_context_loads_every_kernel_and_rejects_foreign_streams")
    else {
        return;
    };
    let own = Device::open_in_new_context(warpline_suite::support::device_ordinal()).unwrap();
    assert!(own.is_own_context() && !dev.is_own_context());
    assert_ne!(own.raw_context(), dev.raw_context());
    assert!(own.all_kernels_loaded().unwrap());

    // It computes on its own context.
    let s2 = own.new_stream().unwrap();
    let pool2 = MemPool::new(&own, 0).unwrap();
    let n = 50_001;
    let (ah, bh) = (random_f32(n), random_f32(n));
    let mut a = pool2.alloc_async::<f32>(&s2, n).unwrap();
    let mut b = pool2.alloc_async::<f32>(&s2, n).unwrap();
    let mut c = pool2.alloc_async::<f32>(&s2, n).unwrap();
    a.copy_from_host(&ah).unwrap();
    b.copy_from_host(&bh).unwrap();
    c.fill_async(f32::NAN).unwrap();
    kernels::vector_add(&own, &s2, a.as_view(), b.as_view(), c.as_view_mut()).unwrap();
    let mut got = vec![0f32; n];
    c.copy_to_host(&mut got).unwrap();
    for i in 0..n {
        assert_eq!(got[i], ah[i] + bh[i], "element {i}");
    }

    // Streams of one context with the device, pool or buffers of another: typed errors.
    let e = kernels::vector_add(&dev, &s2, a.as_view(), b.as_view(), c.as_view_mut()).unwrap_err();
    assert!(matches!(e, Error::WrongContext { .. }), "{e}");
    let pool1 = MemPool::new(&dev, 0).unwrap();
    let e = pool1.alloc_async::<f32>(&s2, 16).unwrap_err();
    assert!(matches!(e, Error::WrongContext { .. }), "{e}");
    let s1 = dev.new_stream().unwrap();
    let e = a.move_to_stream(&s1).unwrap_err();
    assert!(matches!(e, Error::WrongContext { .. }), "{e}");
}
