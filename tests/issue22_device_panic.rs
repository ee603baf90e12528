//! Issue 22, item 1 on the GPU: a kernel written in ordinary safe Rust (slice indexing, `%` and
//! `/` by a run-time value, `assert!`; `builder/tests/fixtures/panic-kernel`, built by
//! warpline-builder into `tests/data/issue22_panic_kernel.ptx`) computes the right values, and an
//! out-of-bounds index at run time traps the kernel, which comes back to the host as the typed
//! sticky error `Error::ContextPoisoned`. A binary of its own: the trap poisons the context it
//! runs in (a context of its own here). Prints SKIPPED without a driver.

use rand::{Rng, SeedableRng};
use warpline::launch::LaunchConfig;
use warpline::module::{View, ViewMut};
use warpline::{Error, MemPool};
use warpline_suite::support::gpu_in_new_context_or_skip;

const PTX: &str = include_str!("data/issue22_panic_kernel.ptx");

/// `gather_mod_kernel(out, out_len, data, data_len, idx, m, n)`.
type GatherSig = (ViewMut<u32>, u64, View<u32>, u64, View<u32>, u32, u64);

/// The fixture's `gather_mod`, on the host: `out[i] = data[idx[i]] % m + data[i] / m`.
fn reference(data: &[u32], idx: &[u32], m: u32, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| data[idx[i] as usize] % m + data[i] / m)
        .collect()
}

#[test]
fn issue22_item01_out_of_bounds_index_is_a_typed_error() {
    let Some(dev) =
        gpu_in_new_context_or_skip("issue22_item01_out_of_bounds_index_is_a_typed_error")
    else {
        return;
    };
    let module = dev.load_module(PTX).unwrap();
    let k = module.kernel::<GatherSig>("gather_mod_kernel").unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let s = dev.new_stream().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(rand::random());
    // data_len >= n (the kernel also reads data[i] for i < n); the allocation is 64 elements
    // longer, so an index just past data_len stays inside it and only the bounds check sees it.
    let (n, data_len) = (4_099usize, 10_007usize);
    let alloc_len = data_len + 64;
    let data: Vec<u32> = (0..data_len).map(|_| rng.random()).collect();
    let mut idx: Vec<u32> = (0..n)
        .map(|_| rng.random_range(0..data_len as u32))
        .collect();
    let m = rng.random_range(1..=u32::MAX);
    let mut d_data = pool.alloc_async::<u32>(&s, alloc_len).unwrap();
    let mut host_data = data.clone();
    host_data.resize(alloc_len, 0);
    d_data.copy_from_host(&host_data).unwrap();
    let mut d_idx = pool.alloc_async::<u32>(&s, n).unwrap();
    d_idx.copy_from_host(&idx).unwrap();
    let mut d_out = pool.alloc_async::<u32>(&s, n).unwrap();
    d_out.fill_async(0xDEAD_BEEF).unwrap();
    let cfg = LaunchConfig::linear((n as u32).div_ceil(128), 128, 0);
    let launch = |out: &mut warpline::DeviceBuffer<u32>,
                  data: &warpline::DeviceBuffer<u32>,
                  idx: &warpline::DeviceBuffer<u32>| {
        // SAFETY: the kernel reads data[..data_len] and idx[..n] and writes out[..n], all inside
        // the views (its slices are built from these lengths and every index is bounds-checked:
        // an index outside them traps instead of reading).
        unsafe {
            k.launch(
                &s,
                &cfg,
                (
                    out.as_view_mut(),
                    n as u64,
                    data.as_view(),
                    data_len as u64,
                    idx.as_view(),
                    m,
                    n as u64,
                ),
            )
        }
    };

    // In bounds: the values of the host reference.
    launch(&mut d_out, &d_data, &d_idx).unwrap();
    let mut got = vec![0u32; n];
    d_out.copy_to_host(&mut got).unwrap();
    assert_eq!(got, reference(&data, &idx, m, n));

    // One index past the end of `data` (but inside its allocation, so only the bounds check can
    // catch it): the kernel traps and the host gets the typed sticky error.
    let bad = rng.random_range(0..n);
    idx[bad] = rng.random_range(data_len as u32..alloc_len as u32);
    d_idx.copy_from_host(&idx).unwrap();
    launch(&mut d_out, &d_data, &d_idx).unwrap();
    let e = s.synchronize().unwrap_err();
    let Error::ContextPoisoned {
        first,
        recent_launches,
        ..
    } = &e
    else {
        panic!("expected ContextPoisoned after a device panic, got {e}")
    };
    assert!(
        first.contains("ILLEGAL_INSTRUCTION") || first.contains("LAUNCH_FAILED"),
        "{first}"
    );
    assert!(
        recent_launches
            .last()
            .is_some_and(|l| l.contains("gather_mod_kernel")),
        "{recent_launches:?}"
    );
}

#[test]
fn issue22_item01_panic_kernel_signature_matches_its_ptx() {
    use warpline::module::{check_signature, ptx_signatures, KernelSignature};
    let entries = ptx_signatures(PTX);
    let e = entries
        .iter()
        .find(|e| e.name == "gather_mod_kernel")
        .expect("gather_mod_kernel not in the committed PTX");
    check_signature(e, &GatherSig::params()).unwrap();
    assert!(PTX.contains("trap;"));
}
