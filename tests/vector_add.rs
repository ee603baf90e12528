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

// ------------------------------------------------------------------------------------------------
// Issue 12 candidates: every variant against the f32 CPU sum, exactly (one correctly rounded f32
// add per element on both sides), on sizes that are multiples of no tile (4096, 8192, 1024 and
// 512 elements), tiny ones and ragged tails of 1 to 3 elements, and on persistent grids of any
// size.
// ------------------------------------------------------------------------------------------------

use warpline::kernels::{
    vector_add_variant as launch, vector_add_variant_with_grid as launch_with_grid,
    VectorAddVariant as Variant,
};

const VARIANT_SIZES: &[usize] = &[
    1,
    2,
    3,
    4,
    5,
    17,
    511,
    513,
    1023,
    1025,
    4095,
    4097,
    4096 * 3 + 6,
    8191,
    8193,
    8192 * 7 + 3,
    (1 << 22) + 5,
];

fn check_variant(dev: &Device, variant: Variant, n: usize, grid: Option<u32>) {
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(dev, 0).unwrap();
    let (a, b) = (random_f32(n), random_f32(n));
    let mut da = pool.alloc_async::<f32>(&stream, n).unwrap();
    let mut db = pool.alloc_async::<f32>(&stream, n).unwrap();
    let mut dc = pool.alloc_async::<f32>(&stream, n).unwrap();
    da.copy_from_host(&a).unwrap();
    db.copy_from_host(&b).unwrap();
    dc.fill_async(f32::NAN).unwrap();
    let (va, vb, vc) = (da.as_view(), db.as_view(), dc.as_view_mut());
    match grid {
        None => launch(dev, &stream, variant, va, vb, vc).unwrap(),
        Some(g) => launch_with_grid(dev, &stream, variant, va, vb, vc, g).unwrap(),
    }
    let mut c = vec![0f32; n];
    dc.copy_to_host(&mut c).unwrap();
    for i in 0..n {
        let want = a[i] + b[i];
        assert!(
            c[i] == want,
            "{} n = {n}, grid = {grid:?}: c[{i}] = {}, want {want} = {} + {}",
            variant.name(),
            c[i],
            a[i],
            b[i]
        );
    }
}

#[test]
fn every_variant_matches_the_f32_sum_exactly_at_every_size() {
    let Some(dev) = gpu_or_skip("vector_add variants, sizes") else {
        return;
    };
    for variant in Variant::ALL {
        for &n in VARIANT_SIZES {
            check_variant(&dev, variant, n, None);
        }
    }
}

#[test]
fn every_variant_is_correct_on_any_grid() {
    let Some(dev) = gpu_or_skip("vector_add variants, grids") else {
        return;
    };
    let n = 8192 * 37 + 9; // 38 tiles of 8192, 75 of 4096, ...
    for variant in Variant::ALL {
        for grid in [1, 2, 3, 37, 38, 75, 264, 5000] {
            check_variant(&dev, variant, n, Some(grid));
        }
    }
}

#[test]
fn variants_reject_bad_arguments_before_launch() {
    let Some(dev) = gpu_or_skip("vector_add variants, validation") else {
        return;
    };
    let s = dev.new_stream().unwrap();
    let pool = MemPool::device_default(&dev, 0).unwrap();
    let a = pool.alloc_async::<f32>(&s, 100).unwrap();
    let short = pool.alloc_async::<f32>(&s, 99).unwrap();
    let mut c = pool.alloc_async::<f32>(&s, 100).unwrap();
    for variant in Variant::ALL {
        let e = launch(
            &dev,
            &s,
            variant,
            a.as_view(),
            short.as_view(),
            c.as_view_mut(),
        );
        assert!(
            matches!(e, Err(warpline::Error::LengthMismatch { .. })),
            "{}: {e:?}",
            variant.name()
        );
        let e = launch_with_grid(
            &dev,
            &s,
            variant,
            a.as_view(),
            a.as_view(),
            c.as_view_mut(),
            0,
        );
        assert!(
            matches!(e, Err(warpline::Error::BadShape { .. })),
            "{}: {e:?}",
            variant.name()
        );
        // Misaligned views (one float in) are refused.
        let e = launch(
            &dev,
            &s,
            variant,
            a.view(1..97).unwrap(),
            a.view(1..97).unwrap(),
            c.view_mut(1..97).unwrap(),
        );
        assert!(
            matches!(e, Err(warpline::Error::Misaligned { .. })),
            "{}: {e:?}",
            variant.name()
        );
    }
}
