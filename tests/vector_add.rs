//! `ws_vector_add` against the f64 CPU reference on the GPU: fresh random inputs, NaN-poisoned
//! outputs, sizes around and off the 4096-element tile, and persistent grids of any size.
//! Relative error bound: 2^-23 per element (the f32 sum is the exact sum rounded once, <= 2^-24).

use approx::relative_eq;
use warpline::{kernels, reference, Device, MemPool};
use warpline_suite::support::{gpu_or_skip, random_f32};

const SIZES: &[usize] = &[1, 31, 1023, 1024, 1025, 4096 * 7 + 3, (1 << 24) + 5];

fn check(dev: &Device, n: usize, grid: Option<u32>) {
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(dev, 0).unwrap();
    let (a, b) = (random_f32(n), random_f32(n));
    let mut da = pool.alloc_async::<f32>(&stream, n).unwrap();
    let mut db = pool.alloc_async::<f32>(&stream, n).unwrap();
    let mut dc = pool.alloc_async::<f32>(&stream, n).unwrap();
    da.copy_from_host(&a).unwrap();
    db.copy_from_host(&b).unwrap();
    dc.fill_async(f32::NAN).unwrap();
    match grid {
        None => {
            kernels::vector_add(dev, &stream, da.as_view(), db.as_view(), dc.as_view_mut()).unwrap()
        }
        Some(g) => kernels::vector_add_with_grid(
            dev,
            &stream,
            da.as_view(),
            db.as_view(),
            dc.as_view_mut(),
            g,
        )
        .unwrap(),
    }
    let mut c = vec![0f32; n];
    dc.copy_to_host(&mut c).unwrap();
    let want = reference::vector_add(&a, &b);
    for (i, (&g, &w)) in c.iter().zip(&want).enumerate() {
        assert!(
            relative_eq!(
                g as f64,
                w,
                epsilon = 0.0,
                max_relative = reference::VECTOR_ADD_REL_BOUND
            ),
            "n = {n}, grid = {grid:?}: c[{i}] = {g}, f64 reference {w}"
        );
    }
}

#[test]
fn matches_cpu_reference_at_every_size() {
    let Some(dev) = gpu_or_skip("vector_add sizes") else {
        return;
    };
    for &n in SIZES {
        check(&dev, n, None);
    }
}

#[test]
fn any_persistent_grid_size_completes_and_is_correct() {
    let Some(dev) = gpu_or_skip("vector_add grids") else {
        return;
    };
    let n = 4096 * 37 + 9; // 38 tiles
    for grid in [1, 2, 3, 37, 38, 39, 264, 5000] {
        check(&dev, n, Some(grid));
    }
}
