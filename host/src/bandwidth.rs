//! Reference copy bandwidths measured in the same process as the figure they are compared with:
//! pinned H2D, D2H and device-to-device copies, timed with events, best of several repetitions.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::memory::{MemPool, PinnedBuffer};

/// Bytes per second of one measurement, as GB/s (1e9 bytes).
fn gbps(bytes: usize, ms: f32) -> f64 {
    bytes as f64 / (ms as f64 * 1e-3) / 1e9
}

/// Pinned host -> device bandwidth, GB/s, for `bytes` per copy; best of `reps`.
pub fn pinned_h2d_gbps(dev: &Device, bytes: usize, reps: usize) -> Result<f64> {
    let stream = dev.new_stream()?;
    let pool = MemPool::new(dev, u64::MAX)?;
    let host = PinnedBuffer::<u8>::new(dev, bytes)?;
    let mut d = pool.alloc_async::<u8>(&stream, bytes)?;
    let mut best = 0.0f64;
    for _ in 0..reps.max(1) {
        let t0 = stream.record()?;
        // SAFETY: `host` lives until after the stream synchronises below.
        unsafe { d.copy_from_host_async(&host)? };
        let t1 = stream.record()?;
        stream.synchronize()?;
        best = best.max(gbps(bytes, t0.elapsed_ms(&t1)?));
    }
    Ok(best)
}

/// Device -> pinned host bandwidth, GB/s; best of `reps`.
pub fn pinned_d2h_gbps(dev: &Device, bytes: usize, reps: usize) -> Result<f64> {
    let stream = dev.new_stream()?;
    let pool = MemPool::new(dev, u64::MAX)?;
    let mut host = PinnedBuffer::<u8>::new(dev, bytes)?;
    let mut d = pool.alloc_async::<u8>(&stream, bytes)?;
    d.fill_async(7)?;
    let mut best = 0.0f64;
    for _ in 0..reps.max(1) {
        let t0 = stream.record()?;
        // SAFETY: `host` lives until after the stream synchronises below.
        unsafe { d.copy_to_host_async(&mut host)? };
        let t1 = stream.record()?;
        stream.synchronize()?;
        best = best.max(gbps(bytes, t0.elapsed_ms(&t1)?));
    }
    Ok(best)
}

/// Pinned host <-> device bandwidth with both directions at once, GB/s counting the bytes of both:
/// an H2D copy of `h2d_bytes` on one stream and a D2H copy of `d2h_bytes` on another, started
/// together (the second stream waits on the first's start event) and timed from that start to
/// the later end; best of `reps`. With `h2d_bytes = 2 d2h_bytes` it is the ceiling of a pipeline
/// that moves two inputs in and one result out, kernels aside.
pub fn pinned_duplex_gbps(
    dev: &Device,
    h2d_bytes: usize,
    d2h_bytes: usize,
    reps: usize,
) -> Result<f64> {
    let (up, down) = (dev.new_stream()?, dev.new_stream()?);
    let pool = MemPool::new(dev, u64::MAX)?;
    let src = PinnedBuffer::<u8>::new(dev, h2d_bytes)?;
    let mut dst = PinnedBuffer::<u8>::new(dev, d2h_bytes)?;
    let mut d_in = pool.alloc_async::<u8>(&up, h2d_bytes)?;
    let mut d_out = pool.alloc_async::<u8>(&down, d2h_bytes)?;
    d_out.fill_async(5)?;
    down.synchronize()?;
    let mut best = 0.0f64;
    for _ in 0..reps.max(1) {
        let t0 = up.record()?;
        down.wait(&t0)?;
        // SAFETY: `src` and `dst` live until after both streams synchronise below.
        unsafe {
            d_in.copy_from_host_async(&src)?;
            d_out.copy_to_host_async(&mut dst)?;
        }
        let down_done = down.record()?;
        up.wait(&down_done)?;
        let t1 = up.record()?;
        up.synchronize()?;
        down.synchronize()?;
        best = best.max(gbps(h2d_bytes + d2h_bytes, t0.elapsed_ms(&t1)?));
    }
    Ok(best)
}

/// Device-to-device copy bandwidth, GB/s counting bytes read plus bytes written (2 x `bytes`),
/// median of `reps` (cuMemcpyDtoDAsync).
pub fn d2d_copy_gbps(dev: &Device, bytes: usize, reps: usize) -> Result<f64> {
    let stream = dev.new_stream()?;
    let pool = MemPool::new(dev, u64::MAX)?;
    let mut src = pool.alloc_async::<u8>(&stream, bytes)?;
    src.fill_async(3)?;
    let mut dst = pool.alloc_async::<u8>(&stream, bytes)?;
    dst.copy_from_device(&src)?; // warm-up
    let mut all = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = stream.record()?;
        dst.copy_from_device(&src)?;
        let t1 = stream.record()?;
        stream.synchronize()?;
        all.push(gbps(2 * bytes, t0.elapsed_ms(&t1)?));
    }
    median(&mut all).ok_or(Error::Empty {
        what: "d2d_copy_gbps repetitions",
    })
}

/// Median of `v` (sorts it by `f64::total_cmp`; of an even count, the upper middle value);
/// `None` for an empty slice.
pub fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn issue19_item14_median_of_nothing_is_none_not_a_panic() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0]), Some(3.0));
        assert_eq!(median(&mut [5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(3.0));
    }
}
