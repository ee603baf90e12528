//! saxpy on the GPU: `y = a * x + y` over n f32 (default 1,000,003: a multiple of no block),
//! checked against an f64 CPU reference, timed with events next to a device-to-device copy.
//!
//!     cargo run --release -p saxpy -- [--n N] [--seed S]
//!
//! Exit status: 0 PASS, 1 FAIL or error, 2 no GPU.

use std::process::ExitCode;

use rand::{rngs::StdRng, Rng, SeedableRng};
use warpline::launch::LaunchConfig;
use warpline::module::{View, ViewMut};

/// The PTX of `../kernel`, built by build.rs.
const PTX: &str = include_str!(env!("KERNEL_PTX"));

/// Timed launches (after one untimed warm-up).
const REPS: usize = 20;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => match e.downcast_ref::<warpline::Error>() {
            Some(warpline::Error::NoDriver) => {
                println!("no GPU: {e}");
                ExitCode::from(2)
            }
            _ => {
                eprintln!("saxpy: error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `--n N --seed S`, both optional.
fn args() -> Result<(usize, u64), String> {
    let (mut n, mut seed) = (1_000_003usize, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--n" => n = value.parse().map_err(|e| format!("--n {value}: {e}"))?,
            "--seed" => seed = Some(value.parse().map_err(|e| format!("--seed {value}: {e}"))?),
            _ => return Err(format!("unknown flag {flag} (use --n N, --seed S)")),
        }
    }
    if n == 0 || n > u32::MAX as usize {
        return Err(format!("--n {n}: must be in 1..=u32::MAX"));
    }
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    Ok((n, seed))
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let (n, seed) = args()?;
    println!("saxpy: n = {n}, seed = {seed} (rerun with --seed {seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let a: f32 = rng.random_range(-2.0..2.0);
    let host_x: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let host_y: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();

    let dev = warpline::Device::open(0)?;
    let module = dev.load_module(PTX)?;
    let saxpy = module.kernel::<(View<f32>, ViewMut<f32>, f32, u32)>("saxpy")?;
    let stream = dev.new_stream()?;
    let pool = warpline::MemPool::device_default(&dev, 0)?;
    let mut x = pool.alloc_async::<f32>(&stream, n)?;
    let mut y = pool.alloc_async::<f32>(&stream, n)?;
    x.copy_from_host(&host_x)?;
    // y is read and written: it holds the input (nothing to poison); any element the kernel
    // skipped keeps y instead of a*x+y and fails the check below.
    y.copy_from_host(&host_y)?;

    let threads = saxpy_kernel::THREADS_PER_CTA;
    let sms = dev.capabilities().sm_count;
    let grid = (n as u32).div_ceil(threads).min(sms * 8);
    let config = LaunchConfig::linear(grid, threads, 0);
    // SAFETY: the kernel reads x[0..n) and reads and writes y[0..n) (its launch contract), both
    // buffers are n long and bound to `stream`, and y does not overlap x (two allocations).
    unsafe {
        saxpy.launch(
            &stream,
            &config,
            (x.as_view(), y.as_view_mut(), a, n as u32),
        )
    }?;
    let mut out = vec![f32::NAN; n];
    y.copy_to_host(&mut out)?;

    // Bound: fma.rn rounds once, so |y - ref| <= 2^-24 |ref| (half an ulp); the f64 reference is
    // exact to far below that. Allow one ulp, plus the smallest normal for results near zero.
    let mut max_err = 0.0f64;
    let mut worst_ratio = 0.0f64;
    for ((&got, &xi), &yi) in out.iter().zip(&host_x).zip(&host_y) {
        let reference = a as f64 * xi as f64 + yi as f64;
        let err = (got as f64 - reference).abs();
        let bound = f32::EPSILON as f64 * reference.abs() + f32::MIN_POSITIVE as f64;
        let ratio = if err.is_nan() {
            f64::INFINITY
        } else {
            err / bound
        };
        max_err = max_err.max(if err.is_nan() { f64::INFINITY } else { err });
        worst_ratio = worst_ratio.max(ratio);
    }
    let pass = worst_ratio <= 1.0;

    // Timing: REPS launches between two events (y keeps changing; only the time matters now).
    let mut time = |reps: usize| -> Result<f64, warpline::Error> {
        let start = stream.record()?;
        for _ in 0..reps {
            // SAFETY: as above.
            unsafe {
                saxpy.launch(
                    &stream,
                    &config,
                    (x.as_view(), y.as_view_mut(), a, n as u32),
                )
            }?;
        }
        let end = stream.record()?;
        end.synchronize()?;
        Ok(start.elapsed_ms(&end)? as f64 / reps as f64)
    };
    time(1)?;
    let ms = time(REPS)?;
    let bytes = 3 * n * std::mem::size_of::<f32>(); // read x, read y, write y
    let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
    // A copy of bytes / 2 moves the same bytes (read + write).
    let copy_gbps = warpline::bandwidth::d2d_copy_gbps(&dev, bytes / 2, REPS)?;
    println!(
        "saxpy: grid {grid} x {threads}, {ms:.4} ms, {gbps:.1} GB/s (device-to-device copy moving the same bytes: {copy_gbps:.1} GB/s, ratio {:.2})",
        gbps / copy_gbps
    );
    println!(
        "saxpy: max |error| = {max_err:.3e}, worst error / bound = {worst_ratio:.3} (bound: eps * |ref| + f32::MIN_POSITIVE)"
    );
    println!("{}", if pass { "PASS" } else { "FAIL" });
    Ok(pass)
}
