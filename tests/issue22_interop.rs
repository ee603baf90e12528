//! Issue 22, item 10 on the GPU: cudarc streams and slices used by warpline and warpline's
//! buffers used by cudarc (`warpline::interop`). Each test prints SKIPPED without a driver.
//!
//! - a kernel launched by warpline (the hand-written saxpy module of `support.rs`) on slices a
//!   cudarc program allocated, on the program's stream, read back through cudarc: fresh random
//!   inputs, exact f32 results (one FMA-free multiply-add per element, compared with the same
//!   f32 arithmetic on the host);
//! - a warpline buffer written by warpline, read by cudarc through `DeviceBuffer::cudarc_slice`,
//!   then written by cudarc and read by warpline;
//! - the checks: another context's stream, the null stream and a capturing stream are refused
//!   by `Stream::from_cudarc`; a slice of another stream (`WrongStream`), of another element
//!   size (`CudarcInterop`) and of another context (`WrongContext`) by `CudarcView::new`.

use cudarc::driver::{CudaContext, CudaSlice};
use warpline::interop::{CudarcView, CudarcViewMut};
use warpline::launch::LaunchConfig;
use warpline::module::{View, ViewMut};
use warpline::{Error, MemPool, Stream};
use warpline_suite::support::{device_ordinal, gpu_or_skip, random_f32, SAXPY_PTX};

#[test]
fn issue22_item10_warpline_kernel_on_cudarc_slices() {
    let Some(dev) = gpu_or_skip("issue22_item10_warpline_kernel_on_cudarc_slices") else {
        return;
    };
    let ctx = CudaContext::new(device_ordinal()).unwrap();
    let cs = ctx.new_stream().unwrap();
    let n = 100_003usize;
    let (x, y) = (random_f32(n), random_f32(n));
    let x_dev: CudaSlice<f32> = cs.clone_htod(&x).unwrap();
    let mut y_dev: CudaSlice<f32> = cs.clone_htod(&y).unwrap();
    // SAFETY: this test never begins a capture on `cs`.
    let stream = unsafe { Stream::from_cudarc(&dev, cs.clone()) }.unwrap();
    let module = dev.load_module(SAXPY_PTX).unwrap();
    let saxpy = module
        .kernel::<(View<f32>, ViewMut<f32>, f32, u32)>("saxpy")
        .unwrap();
    let a = 1.75f32;
    {
        let xv = CudarcView::<f32>::new(&x_dev, &stream).unwrap();
        let mut yv = CudarcViewMut::<f32>::new(&mut y_dev, &stream).unwrap();
        // SAFETY: saxpy reads x[..n] and writes y[..n]; both views hold n elements.
        unsafe {
            saxpy.launch(
                &stream,
                &LaunchConfig::linear((n as u32).div_ceil(256), 256, 0),
                (xv.view(), yv.view_mut(), a, n as u32),
            )
        }
        .unwrap();
    }
    let got: Vec<f32> = cs.clone_dtoh(&y_dev).unwrap();
    for i in 0..n {
        // The module's saxpy is `mul.f32` then `add.f32`, which ptxas may contract into one
        // FMA (the H100 run showed a 1-ulp difference): either rounding is exact.
        let (separate, fused) = (a * x[i] + y[i], a.mul_add(x[i], y[i]));
        assert!(
            got[i] == separate || got[i] == fused,
            "y[{i}] = {}, expected {separate} (mul, add) or {fused} (fma)",
            got[i]
        );
    }
}

#[test]
fn issue22_item10_warpline_buffer_as_cudarc_slice() {
    let Some(dev) = gpu_or_skip("issue22_item10_warpline_buffer_as_cudarc_slice") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let n = 4099usize;
    let v = random_f32(n);
    let mut buf = pool.alloc_async::<f32>(&s, n).unwrap();
    buf.copy_from_host(&v).unwrap();
    {
        // SAFETY: used with cudarc only on the buffer's own stream (the slice's), no capture.
        let mut slice = unsafe { buf.cudarc_slice() };
        let cs = slice.stream().clone();
        let read: Vec<f32> = cs.clone_dtoh(&*slice).unwrap();
        assert_eq!(read, v, "cudarc read of a warpline buffer");
        let w = random_f32(n);
        cs.memcpy_htod(&w, &mut slice.view_mut()).unwrap();
        cs.synchronize().unwrap();
        drop(slice);
        let mut back = vec![0f32; n];
        buf.copy_to_host(&mut back).unwrap();
        assert_eq!(back, w, "warpline read of what cudarc wrote");
    }
    // The buffer still owns (and frees) its memory.
    drop(buf);
    s.synchronize().unwrap();
    assert!(dev.take_deferred_errors().is_empty());
}

#[test]
fn issue22_item10_conversions_refuse_what_breaks_the_rules() {
    let Some(dev) = gpu_or_skip("issue22_item10_conversions_refuse_what_breaks_the_rules") else {
        return;
    };
    let ctx = CudaContext::new(device_ordinal()).unwrap();
    // The legacy default stream.
    // SAFETY: the call fails before the stream is used.
    let r = unsafe { Stream::from_cudarc(&dev, ctx.default_stream()) };
    assert!(matches!(r, Err(Error::CudarcInterop { .. })), "{r:?}");
    // Another context's stream.
    let other = CudaContext::new_non_primary(device_ordinal(), 0).unwrap();
    let os = other.new_stream().unwrap();
    // SAFETY: as above.
    let r = unsafe { Stream::from_cudarc(&dev, os.clone()) };
    assert!(matches!(r, Err(Error::WrongContext { .. })), "{r:?}");

    let cs1 = ctx.new_stream().unwrap();
    let cs2 = ctx.new_stream().unwrap();
    // SAFETY: no capture is begun on cs1 while `s1` lives (the capture below is on cs2).
    let s1 = unsafe { Stream::from_cudarc(&dev, cs1.clone()) }.unwrap();
    let on1: CudaSlice<f32> = cs1.alloc_zeros(64).unwrap();
    let on2: CudaSlice<f32> = cs2.alloc_zeros(64).unwrap();
    // A slice of another stream.
    let r = CudarcView::<f32>::new(&on2, &s1).map(|_| ());
    assert!(matches!(r, Err(Error::WrongStream { .. })), "{r:?}");
    // Another element size.
    let r = CudarcView::<u16>::new(&on1, &s1).map(|_| ());
    assert!(matches!(r, Err(Error::CudarcInterop { .. })), "{r:?}");
    // The same size is fine (f32 bits as u32).
    assert_eq!(CudarcView::<u32>::new(&on1, &s1).unwrap().view().len(), 64);
    // A slice of another context.
    let on_other: CudaSlice<f32> = os.alloc_zeros(64).unwrap();
    let r = CudarcView::<f32>::new(&on_other, &s1).map(|_| ());
    assert!(matches!(r, Err(Error::WrongContext { .. })), "{r:?}");
    // A capturing stream.
    cs2.begin_capture(
        cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    )
    .unwrap();
    // SAFETY: the call fails before the stream is used.
    let r = unsafe { Stream::from_cudarc(&dev, cs2.clone()) };
    assert!(matches!(r, Err(Error::CudarcInterop { .. })), "{r:?}");
    let _ = cs2.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH);
    drop(on2);
    cs1.synchronize().unwrap();
}
