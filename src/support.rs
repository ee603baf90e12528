//! Helpers for tests and benches: GPU discovery that skips with a reason, fresh random inputs.

use rand::Rng;

/// Opens GPU 0, or prints why the GPU part of `test` is skipped and returns `None`
/// (no CUDA driver on this machine, or no device).
pub fn gpu_or_skip(test: &str) -> Option<warpline::Device> {
    match warpline::Device::open(0) {
        Ok(dev) => Some(dev),
        Err(e @ (warpline::Error::NoDriver | warpline::Error::NoDevice { .. })) => {
            eprintln!("SKIPPED {test}: {e}");
            None
        }
        Err(e) => panic!("{test}: opening GPU 0 failed: {e}"),
    }
}

/// `n` fresh uniform random floats in [-1, 1).
pub fn random_f32(n: usize) -> Vec<f32> {
    let mut rng = rand::rng();
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}
