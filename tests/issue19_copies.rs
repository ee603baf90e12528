//! Issue 19: host copies never block inside the driver (`memory::staging`).
//!
//! A blocking copy (`cuMemcpyDtoH`, or `cuMemcpyDtoHAsync` into pageable memory) waits inside the
//! driver for its stream while holding a lock that `cuStreamCreate` and `cuEventCreate` need; if
//! its stream was behind an on-stream wait whose release needs those calls from another thread,
//! the process hung (`warpline fuzz` on the H100, cuda-gdb stacks in docs/safety.md). The copies
//! now go through pinned staging with event polling. Each test prints SKIPPED without a driver.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use warpline::kernels::signal as probe;
use warpline::ordering::{synchronize_timeout, Fence, OnTimeout, Signal};
use warpline::MemPool;
use warpline_suite::support::{gpu_or_skip, run_child_test};

const CHILD_ENV: &str = "WARPLINE_COPIES_CHILD";
const DONE: &str = "copy behind a pending wait: released and correct";
/// Half of warpline's staging buffer (`memory::staging::STAGING_BYTES / 2`), the piece size.
const PIECE: usize = 2 << 20;

/// Byte counts around the staging pieces: 1, just under and over one piece, several pieces with
/// a ragged tail.
const SIZES: [usize; 6] = [1, 7, PIECE - 3, PIECE + 5, 3 * PIECE + 11, 5 * PIECE + 1];

/// Round trips through the staging pieces: D2H alone (a device fill read back), H2D then a
/// device-side copy kernel then D2H, with fresh random data and a poisoned destination.
#[test]
fn issue19_fuzzhang_staged_copies_are_exact_at_every_piece_boundary() {
    let Some(dev) = gpu_or_skip("issue19_item22 staged copies") else {
        return;
    };
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::rng().random());
    for bytes in SIZES {
        let n = bytes.div_ceil(4);
        // D2H alone.
        let fill: u32 = rng.random();
        let mut a = pool.alloc_async::<u32>(&stream, n).unwrap();
        a.fill_async(fill).unwrap();
        let mut got = vec![0xDEAD_BEEFu32 ^ fill; n];
        a.copy_to_host(&mut got).unwrap();
        assert!(
            got.iter().all(|&g| g == fill),
            "{n} u32: fill {fill:#x} not read back"
        );
        // H2D, device copy, D2H.
        let data: Vec<u32> = (0..n).map(|_| rng.random()).collect();
        let mut b = pool.alloc_async::<u32>(&stream, n).unwrap();
        a.copy_from_host(&data).unwrap();
        b.fill_async(0xDEAD_BEEF).unwrap();
        // SAFETY: both allocations hold n u32 on `stream` and live until the copy below returned.
        unsafe { probe::copy_u32(&dev, &stream, a.device_ptr(), b.device_ptr(), n as u32) }
            .unwrap();
        let mut back = vec![0u32; n];
        b.copy_to_host(&mut back).unwrap();
        if let Some(i) = (0..n).find(|&i| back[i] != data[i]) {
            panic!(
                "{n} u32: element {i} is {:#x}, wrote {:#x}",
                back[i], data[i]
            );
        }
        // Bytes: a length that is no multiple of 4.
        let bytes_in: Vec<u8> = (0..bytes).map(|_| rng.random()).collect();
        let mut c = pool.alloc_async::<u8>(&stream, bytes).unwrap();
        c.copy_from_host(&bytes_in).unwrap();
        let mut bytes_out = vec![0u8; bytes];
        c.copy_to_host(&mut bytes_out).unwrap();
        assert!(bytes_out == bytes_in, "{bytes} bytes: round trip differs");
    }
}

/// The H100 hang: a copy queued behind a fence guard's on-stream wait, while another thread
/// takes a second guard (`cuEventCreate`) and then releases the first. With
/// blocking copies this hung; now the reader polls and the release goes through. Run in child
/// processes (default queues and one hardware queue), killed after 120 s: a hang fails the test.
#[test]
fn issue19_fuzzhang_copy_behind_a_pending_wait_lets_the_release_through() {
    if !warpline::device::driver_present() {
        warpline_suite::support::skip("issue19_item22 copy behind a wait", "no CUDA driver");
        return;
    }
    for conns in [None, Some("1")] {
        let mut env = vec![(CHILD_ENV, "1")];
        if let Some(c) = conns {
            env.push(("CUDA_DEVICE_MAX_CONNECTIONS", c));
        }
        run_child_test(
            "copy_behind_wait_child",
            &env,
            Duration::from_secs(120),
            None,
        );
    }
}

#[test]
#[ignore = "run by issue19_fuzzhang_copy_behind_a_pending_wait_lets_the_release_through"]
fn copy_behind_wait_child() {
    assert_eq!(
        std::env::var(CHILD_ENV).as_deref(),
        Ok("1"),
        "run through the parent test"
    );
    let Some(dev) = gpu_or_skip("copy behind wait child") else {
        return;
    };
    let fence = Fence::new(&dev).unwrap();
    let held = dev.new_stream().unwrap();
    let other = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let n = 4 << 20; // 16 MiB of u32: a pageable copy of this size is staged by the driver
    let fill = 0x1234_5678u32;
    let mut buf = pool.alloc_async::<u32>(&other, n).unwrap();
    buf.fill_async(fill).unwrap();
    let signal = Signal::<u64>::new(&dev, "copies probe").unwrap();
    signal.set(&other, 41).unwrap();
    other.synchronize().unwrap();
    let extra = dev.new_stream().unwrap();
    let ticket = fence.guard(&held).unwrap();
    // `other` is ordered after `held`'s wait, so its copy cannot run before the release.
    let mark = held.record().unwrap();
    other.wait(&mark).unwrap();
    let t0 = std::time::Instant::now();
    let (got, waited) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut v = vec![0u32; n];
            buf.copy_to_host(&mut v).map(|()| (v, t0.elapsed()))
        });
        std::thread::sleep(Duration::from_millis(300));
        // Calls that queued behind the blocking copy on the H100 (cuEventCreate, launches).
        let second = fence.guard(&extra).unwrap();
        ticket.submit(|_, _| Ok(())).unwrap();
        second.submit(|_, _| Ok(())).unwrap();
        synchronize_timeout(&extra, Duration::from_secs(30), OnTimeout::Abandon).unwrap();
        reader.join().unwrap().unwrap()
    });
    assert!(
        waited >= Duration::from_millis(250),
        "the copy returned after {waited:?}, before the release: it was not behind the wait"
    );
    if let Some(i) = got.iter().position(|&g| g != fill) {
        panic!("element {i} is {:#x}, expected {fill:#x}", got[i]);
    }
    assert_eq!(signal.read().unwrap(), 41);
    synchronize_timeout(&held, Duration::from_secs(30), OnTimeout::Abandon).unwrap();
    println!(
        "{DONE} (connections {:?}, copy returned after {waited:?})",
        std::env::var("CUDA_DEVICE_MAX_CONNECTIONS").ok()
    );
}

/// `cuStreamCreate` can wait for the device inside the driver, holding a lock that a pending
/// wait's release needs (cuda-gdb stacks of hung `warpline fuzz` runs on the H100), so
/// `Device::new_stream` waits for registered waits to clear: it returns once another thread
/// releases the wait, and refuses with `WaitPending` after `STREAM_CREATE_WAIT` when nobody does.
#[test]
fn issue19_fuzzhang_stream_creation_waits_for_pending_waits() {
    let Some(dev) = gpu_or_skip("issue19 stream creation gate") else {
        return;
    };
    let fence = Fence::new(&dev).unwrap();
    let held = dev.new_stream().unwrap();
    // Released by another thread while this one waits to create a stream.
    let ticket = fence.guard(&held).unwrap();
    let t0 = std::time::Instant::now();
    let made = std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            ticket.submit(|_, _| Ok(())).unwrap();
        });
        dev.new_stream()
    });
    let waited = t0.elapsed();
    made.unwrap();
    assert!(
        waited >= Duration::from_millis(250),
        "the stream was created after {waited:?}, while the guard's wait was pending"
    );
    synchronize_timeout(&held, Duration::from_secs(10), OnTimeout::Abandon).unwrap();
    // Held by this thread itself: refused after the bound instead of a hang.
    let ticket = fence.guard(&held).unwrap();
    let t0 = std::time::Instant::now();
    let r = dev.new_stream();
    let waited = t0.elapsed();
    assert!(
        matches!(r, Err(warpline::Error::WaitPending { .. })),
        "expected WaitPending, got {r:?}"
    );
    assert!(
        waited >= warpline::Device::STREAM_CREATE_WAIT,
        "refused after {waited:?}"
    );
    // `Device::synchronize` (cuCtxSynchronize, which blocks inside the driver) is gated the same
    // way: refused after the bound while this thread's own wait is pending, instead of a hang.
    let t0 = std::time::Instant::now();
    let r = dev.synchronize();
    let waited = t0.elapsed();
    assert!(
        matches!(r, Err(warpline::Error::WaitPending { .. })),
        "Device::synchronize behind a pending wait: expected WaitPending, got {r:?}"
    );
    assert!(
        waited >= warpline::Device::STREAM_CREATE_WAIT,
        "Device::synchronize refused after {waited:?}"
    );
    ticket.submit(|_, _| Ok(())).unwrap();
    synchronize_timeout(&held, Duration::from_secs(10), OnTimeout::Abandon).unwrap();
    dev.new_stream().unwrap();
    // Released by another thread while this one waits: it synchronizes once the wait is gone.
    let ticket = fence.guard(&held).unwrap();
    let t0 = std::time::Instant::now();
    let synced = std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            ticket.submit(|_, _| Ok(())).unwrap();
        });
        dev.synchronize()
    });
    let waited = t0.elapsed();
    synced.unwrap();
    assert!(
        waited >= Duration::from_millis(250),
        "Device::synchronize returned after {waited:?}, while the guard's wait was pending"
    );
}
