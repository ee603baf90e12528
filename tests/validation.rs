//! Every validation error of the vector-add launcher, memory and pipeline APIs is returned before
//! anything is launched, and leaves the output untouched (GPU part), plus the checks that need no GPU.

use warpline::launch::LaunchConfig;
use warpline::{kernels, BatchPipeline, Error, MemPool, PinnedBuffer};
use warpline_gpu::contract::signal as sigc;
use warpline_suite::support::{gpu_or_skip, random_f32};

#[test]
fn vector_add_rejects_bad_arguments_before_launch() {
    let Some(dev) = gpu_or_skip("validation") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let other = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 4099;
    let mut a = pool.alloc_async::<f32>(&s, n).unwrap();
    a.copy_from_host(&random_f32(n)).unwrap();
    let b = pool.alloc_async::<f32>(&s, n).unwrap();
    let short = pool.alloc_async::<f32>(&s, n - 1).unwrap();
    let on_other = pool.alloc_async::<f32>(&other, n).unwrap();
    let mut c = pool.alloc_async::<f32>(&s, n).unwrap();
    c.fill_async(f32::NAN).unwrap();

    let e =
        kernels::vector_add(&dev, &s, a.as_view(), short.as_view(), c.as_view_mut()).unwrap_err();
    assert!(matches!(e, Error::LengthMismatch { .. }), "{e}");
    let e = kernels::vector_add(
        &dev,
        &s,
        a.view(0..0).unwrap(),
        b.view(0..0).unwrap(),
        c.view_mut(0..0).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::Empty { .. }), "{e}");
    let e = kernels::vector_add(
        &dev,
        &s,
        a.view(1..n).unwrap(),
        b.view(0..n - 1).unwrap(),
        c.view_mut(0..n - 1).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(e, Error::Misaligned { align: 16, .. }), "{e}");
    let e = kernels::vector_add(&dev, &s, a.as_view(), on_other.as_view(), c.as_view_mut())
        .unwrap_err();
    assert!(matches!(e, Error::WrongStream { .. }), "{e}");
    let e =
        kernels::vector_add(&dev, &other, a.as_view(), b.as_view(), c.as_view_mut()).unwrap_err();
    assert!(matches!(e, Error::WrongStream { .. }), "{e}");
    let e = kernels::vector_add_with_grid(&dev, &s, a.as_view(), b.as_view(), c.as_view_mut(), 0)
        .unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    assert!(matches!(
        a.view(5..n + 1),
        Err(Error::LengthMismatch { .. })
    ));

    // Nothing was launched: the poisoned output is still all NaN.
    let mut out = vec![0f32; n];
    c.copy_to_host(&mut out).unwrap();
    assert!(out.iter().all(|x| x.is_nan()));

    // Memory API errors.
    assert!(matches!(
        pool.alloc_async::<f32>(&s, 0),
        Err(Error::Empty { .. })
    ));
    assert!(matches!(
        pool.alloc_async::<f32>(&s, 1 << 50),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(
        pool.alloc_async::<f32>(&s, usize::MAX),
        Err(Error::TooLarge { .. })
    ));
    assert!(matches!(
        PinnedBuffer::<f32>::new(&dev, 0),
        Err(Error::Empty { .. })
    ));
    let mut host = vec![0f32; n - 1];
    assert!(matches!(
        a.copy_to_host(&mut host),
        Err(Error::LengthMismatch { .. })
    ));
    assert!(matches!(
        c.copy_from_host(&host),
        Err(Error::LengthMismatch { .. })
    ));

    // Moving a buffer to another stream makes it usable there.
    let mut moved = pool.alloc_async::<f32>(&other, n).unwrap();
    moved.copy_from_host(&random_f32(n)).unwrap();
    moved.move_to_stream(&s).unwrap();
    kernels::vector_add(&dev, &s, a.as_view(), moved.as_view(), c.as_view_mut()).unwrap();
    s.synchronize().unwrap();
}

#[test]
fn launch_configurations_are_checked_against_the_device() {
    let Some(dev) = gpu_or_skip("launch validation") else {
        return;
    };
    let max = dev.capabilities().max_shared_mem_per_block_optin as u32;
    let e = LaunchConfig::linear(1, 96, max + 1)
        .validate(&dev, sigc::BUSY_FILL_KERNEL)
        .unwrap_err();
    assert!(matches!(e, Error::SharedMemory { .. }), "{e}");
    let e = LaunchConfig::linear(0, 96, 0)
        .validate(&dev, sigc::BUSY_FILL_KERNEL)
        .unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    let e = LaunchConfig::linear(1, 2048, 0)
        .validate(&dev, sigc::BUSY_FILL_KERNEL)
        .unwrap_err();
    assert!(matches!(e, Error::TooLarge { .. }), "{e}");
    let e = LaunchConfig::linear(6, 96, 0)
        .with_cluster_x(4)
        .validate(&dev, sigc::BUSY_FILL_KERNEL)
        .unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
    LaunchConfig::linear(8, 96, 0)
        .with_cluster_x(4)
        .validate(&dev, sigc::BUSY_FILL_KERNEL)
        .unwrap();
}

#[test]
fn pipeline_rejects_bad_shapes() {
    let Some(dev) = gpu_or_skip("pipeline validation") else {
        return;
    };
    assert!(matches!(
        BatchPipeline::new(&dev, 0),
        Err(Error::Empty { .. })
    ));
    assert!(matches!(
        BatchPipeline::new(&dev, 33),
        Err(Error::TooLarge { .. })
    ));
    let pipe = BatchPipeline::new(&dev, 2).unwrap();
    let a = PinnedBuffer::<f32>::new(&dev, 100).unwrap();
    let b = PinnedBuffer::<f32>::new(&dev, 99).unwrap();
    let mut c = PinnedBuffer::<f32>::new(&dev, 100).unwrap();
    assert!(matches!(
        pipe.run_vector_add(&a, &b, &mut c, 10, |_, _| {}),
        Err(Error::LengthMismatch { .. })
    ));
    assert!(matches!(
        pipe.run_vector_add(&a, &a, &mut c, 0, |_, _| {}),
        Err(Error::Empty { .. })
    ));
}

#[test]
fn without_a_driver_open_says_so() {
    if warpline::device::driver_present() {
        // Not a GPU test: it checks the no-driver path, which exists only where there is none.
        eprintln!("without_a_driver_open_says_so: not applicable where a CUDA driver is present");
        return;
    }
    let e = warpline::Device::open(0).unwrap_err();
    assert!(matches!(e, Error::NoDriver));
    assert!(e.to_string().contains("no CUDA driver"));
}
