//! Row-wise softmax on the GPU over a `[rows, cols]` f32 matrix (default 1000 x 1003: rows start
//! at every alignment, and neither size is a multiple of a tile), checked against an f64 CPU
//! reference, timed with events next to a device-to-device copy.
//!
//!     cargo run --release -p softmax -- [--rows R] [--cols C] [--seed S]
//!
//! `cols` may be 1..=4096 (`softmax_kernel::MAX_COLS`); more is an error here, before any launch.
//! Exit status: 0 PASS, 1 FAIL or error, 2 no GPU.

use std::process::ExitCode;

use rand::{rngs::StdRng, Rng, SeedableRng};
use softmax_kernel::{CTAS_PER_SM, MAX_COLS, ROWS_PER_STAGE, SMEM_BYTES, THREADS_PER_CTA};
use warpline::launch::LaunchConfig;
use warpline::module::{View, ViewMut};

/// The PTX of `../kernel`, built by build.rs.
const PTX: &str = include_str!(env!("KERNEL_PTX"));

/// Timed launches (after one untimed warm-up).
const REPS: usize = 20;

/// Error bound, relative to the reference element: `ex2.approx` (2^-22 relative), the rounding
/// of `(x - max) * log2(e)` (below 2^-24 * 16 * 1.5 for inputs in [-8, 8]), the f32 sum of up to
/// 4096 terms and the reciprocal stay well below 1e-5; allow 1e-4.
const REL_BOUND: f64 = 1e-4;

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
                eprintln!("softmax: error: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `--rows R --cols C --seed S`, all optional.
fn args() -> Result<(usize, usize, u64), String> {
    let (mut rows, mut cols, mut seed) = (1000usize, 1003usize, None);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        let parse = |v: &str| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--rows" => rows = parse(&value)? as usize,
            "--cols" => cols = parse(&value)? as usize,
            "--seed" => seed = Some(parse(&value)?),
            _ => {
                return Err(format!(
                    "unknown flag {flag} (use --rows R, --cols C, --seed S)"
                ))
            }
        }
    }
    if cols == 0 || cols > MAX_COLS as usize {
        return Err(format!(
            "--cols {cols}: the kernel takes 1..={MAX_COLS} columns"
        ));
    }
    if rows == 0 || rows.checked_mul(cols).is_none_or(|e| e > u32::MAX as usize) {
        return Err(format!(
            "--rows {rows}: need 1 <= rows and rows * cols <= u32::MAX"
        ));
    }
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    Ok((rows, cols, seed))
}

/// Softmax of each row in f64, subtracting the row maximum.
fn reference(x: &[f32], cols: usize) -> Vec<f64> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks(cols) {
        let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
        let e: Vec<f64> = row.iter().map(|&v| (v as f64 - m).exp()).collect();
        let s: f64 = e.iter().sum();
        out.extend(e.iter().map(|v| v / s));
    }
    out
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let (rows, cols, seed) = args()?;
    let n = rows * cols;
    println!("softmax: {rows} x {cols}, seed = {seed} (rerun with --seed {seed})");
    let mut rng = StdRng::seed_from_u64(seed);
    let host_x: Vec<f32> = (0..n).map(|_| rng.random_range(-8.0..8.0)).collect();

    let dev = warpline::Device::open(0)?;
    let module = dev.load_module(PTX)?;
    let softmax = module.kernel::<(View<f32>, ViewMut<f32>, u32, u32)>("softmax")?;
    let stream = dev.new_stream()?;
    let pool = warpline::MemPool::device_default(&dev, 0)?;
    let mut x = pool.alloc_async::<f32>(&stream, n)?;
    let mut y = pool.alloc_async::<f32>(&stream, n)?;
    x.copy_from_host(&host_x)?;
    y.fill_async(f32::NAN)?; // poison: an element the kernel does not write stays NaN and fails

    // Persistent grid: as many CTAs as fit (CTAS_PER_SM per SM), no more than there are items.
    let items = (rows as u32).div_ceil(ROWS_PER_STAGE);
    let grid = items.min(CTAS_PER_SM * dev.capabilities().sm_count);
    let config = LaunchConfig::linear(grid, THREADS_PER_CTA, SMEM_BYTES);
    let (r, c) = (rows as u32, cols as u32);
    // SAFETY: the kernel reads x[0..rows*cols) and writes y[0..rows*cols) (its launch contract),
    // both buffers are that long and bound to `stream`, y does not overlap x (two allocations),
    // and 1 <= cols <= MAX_COLS (checked in `args`); block and shared memory are the kernel's.
    unsafe { softmax.launch(&stream, &config, (x.as_view(), y.as_view_mut(), r, c)) }?;
    let mut out = vec![0.0f32; n];
    y.copy_to_host(&mut out)?;

    let want = reference(&host_x, cols);
    let (mut max_abs, mut max_rel) = (0.0f64, 0.0f64);
    for (&got, &w) in out.iter().zip(&want) {
        let err = (got as f64 - w).abs();
        let rel = if err.is_nan() { f64::INFINITY } else { err / w };
        max_abs = max_abs.max(if err.is_nan() { f64::INFINITY } else { err });
        max_rel = max_rel.max(rel);
    }
    let pass = max_rel <= REL_BOUND;

    let mut time = |reps: usize| -> Result<f64, warpline::Error> {
        let start = stream.record()?;
        for _ in 0..reps {
            // SAFETY: as above.
            unsafe { softmax.launch(&stream, &config, (x.as_view(), y.as_view_mut(), r, c)) }?;
        }
        let end = stream.record()?;
        end.synchronize()?;
        Ok(start.elapsed_ms(&end)? as f64 / reps as f64)
    };
    time(1)?;
    let ms = time(REPS)?;
    let bytes = 2 * n * std::mem::size_of::<f32>(); // read x, write y
    let gbps = bytes as f64 / (ms * 1e-3) / 1e9;
    let copy_gbps = warpline::bandwidth::d2d_copy_gbps(&dev, n * 4, REPS)?;
    println!(
        "softmax: grid {grid} x {THREADS_PER_CTA} threads, {SMEM_BYTES} B shared, {ms:.4} ms, {gbps:.1} GB/s (device-to-device copy of the same bytes: {copy_gbps:.1} GB/s, ratio {:.2})",
        gbps / copy_gbps
    );
    println!(
        "softmax: max |error| = {max_abs:.3e}, max relative error = {max_rel:.3e} (bound {REL_BOUND:.0e})"
    );
    println!("{}", if pass { "PASS" } else { "FAIL" });
    Ok(pass)
}
