//! `cluster_tile_gemm` and `tile_gemm` against the f64 CPU reference: fresh random inputs,
//! NaN-poisoned outputs, tiles = 1, 3, 132 x 4 + 1, cluster sizes 1, 2, 4 (and 8 where it fits),
//! persistent grids of any size; relative error per tile (Frobenius norm ratio) below 1e-5.
//! Shape and cluster-size errors are checked without a GPU; launch-path errors with one.

use warpline::reference::{gemm_tiles_f64, verify_gemm, GEMM_REL_BOUND};
use warpline::{kernels, DeviceBuffer, Error, MemPool, Stream};
use warpline_gpu::contract::gemm::TILE_ELEMS;
use warpline_suite::support::{entry_body, gpu_or_skip, random_f32};

const TILES: &[usize] = &[1, 3, 132 * 4 + 1];

#[derive(Clone, Copy, Debug)]
enum Kernel {
    Plain { grid: Option<u32> },
    Cluster { size: u32, clusters: Option<u32> },
}

struct Case {
    stream: Stream,
    a: Vec<f32>,
    b: Vec<f32>,
    da: DeviceBuffer<f32>,
    db: DeviceBuffer<f32>,
    dc: DeviceBuffer<f32>,
}

fn case(dev: &warpline::Device, tiles: usize) -> Case {
    let stream = dev.new_stream().unwrap();
    let pool = MemPool::device_default(dev, 0).unwrap();
    let n = tiles * TILE_ELEMS;
    let (a, b) = (random_f32(n), random_f32(n));
    let mut da = pool.alloc_async::<f32>(&stream, n).unwrap();
    let mut db = pool.alloc_async::<f32>(&stream, n).unwrap();
    let dc = pool.alloc_async::<f32>(&stream, n).unwrap();
    da.copy_from_host(&a).unwrap();
    db.copy_from_host(&b).unwrap();
    Case {
        stream,
        a,
        b,
        da,
        db,
        dc,
    }
}

fn check(dev: &warpline::Device, tiles: usize, kernel: Kernel) {
    let mut c = case(dev, tiles);
    c.dc.fill_async(f32::NAN).unwrap();
    let (a, b, out) = (c.da.as_view(), c.db.as_view(), c.dc.as_view_mut());
    match kernel {
        Kernel::Plain { grid: None } => kernels::tile_gemm(dev, &c.stream, a, b, out, tiles),
        Kernel::Plain { grid: Some(g) } => {
            kernels::tile_gemm_with_grid(dev, &c.stream, a, b, out, tiles, g)
        }
        Kernel::Cluster {
            size,
            clusters: None,
        } => kernels::cluster_tile_gemm(dev, &c.stream, a, b, out, tiles, size),
        Kernel::Cluster {
            size,
            clusters: Some(n),
        } => kernels::cluster_tile_gemm_with_grid(dev, &c.stream, a, b, out, tiles, size, n),
    }
    .unwrap_or_else(|e| panic!("{kernel:?}, {tiles} tiles: {e}"));
    let mut got = vec![0f32; tiles * TILE_ELEMS];
    c.dc.copy_to_host(&mut got).unwrap();
    let want = gemm_tiles_f64(&c.a, &c.b, tiles).unwrap();
    verify_gemm(
        &format!("{kernel:?}, {tiles} tiles"),
        &got,
        &want,
        GEMM_REL_BOUND,
    )
    .unwrap();
}

#[test]
fn shape_errors_are_typed_without_a_gpu() {
    let e = TILE_ELEMS;
    assert!(kernels::check_gemm_shapes(3, 3 * e, 3 * e, 3 * e).is_ok());
    assert!(matches!(
        kernels::check_gemm_shapes(0, 0, 0, 0),
        Err(Error::Empty { .. })
    ));
    for (a, b, c) in [
        (3 * e - 1, 3 * e, 3 * e),
        (3 * e, 2 * e, 3 * e),
        (3 * e, 3 * e, 4 * e),
    ] {
        assert!(matches!(
            kernels::check_gemm_shapes(3, a, b, c),
            Err(Error::LengthMismatch { .. })
        ));
    }
    assert!(matches!(
        kernels::check_gemm_shapes(usize::MAX / e, 0, 0, 0),
        Err(Error::TooLarge { .. })
    ));
}

#[test]
fn unsupported_cluster_sizes_are_typed_without_a_gpu() {
    for ok in [1, 2, 4, 8] {
        assert!(kernels::check_gemm_cluster_size(ok).is_ok(), "{ok}");
    }
    for bad in [0, 3, 5, 6, 16, 32] {
        match kernels::check_gemm_cluster_size(bad) {
            Err(Error::UnsupportedClusterSize {
                cluster, supported, ..
            }) => {
                assert_eq!(cluster, bad);
                assert_eq!(supported, vec![1, 2, 4, 8]);
            }
            other => panic!("cluster {bad}: {other:?}"),
        }
    }
}

#[test]
fn cluster_kernel_ptx_uses_multicast_dsmem_and_cluster_barriers() {
    let body = entry_body("cluster_tile_gemm");
    for needle in [
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster",
        "mapa.shared::cluster",
        "mbarrier.arrive.shared::cluster.b64",
        "mbarrier.arrive.expect_tx",
        "barrier.cluster.arrive.release",
        "barrier.cluster.wait.acquire",
        "fma.rn.f32",
        "ld.shared.v4.f32",
        "st.global.v4.f32",
    ] {
        assert!(body.contains(needle), "cluster_tile_gemm lacks `{needle}`");
    }
}

/// One FP32 GEMM path (issue 11): the tile kernels and the split-K pair run the same mainloop
/// (A and B from shared memory in 16-byte vectors, FMA into registers, no local memory) and the
/// same 16-byte-store epilogue; PDL is an option of the path, off in the tile kernels.
#[test]
fn every_fp32_gemm_runs_the_shared_mainloop_and_epilogue() {
    use warpline_gpu::contract::{gemm, pdl};
    for k in [
        gemm::CLUSTER_KERNEL,
        gemm::PLAIN_KERNEL,
        pdl::PRIMARY_GEMM_KERNEL,
        pdl::SECONDARY_GEMM_KERNEL,
    ] {
        let body = entry_body(k);
        for needle in ["ld.shared.v4.f32", "fma.rn.f32", "st.global.v4.f32"] {
            assert!(body.contains(needle), "{k} lacks `{needle}`");
        }
        // A is read as vectors too (no scalar shared loads), and the register tile stays in
        // registers (no local-memory depot).
        assert!(
            !body.contains("ld.shared.f32"),
            "{k} has scalar shared loads"
        );
        assert!(!body.contains(".local"), "{k} uses local memory");
    }
    for k in [gemm::CLUSTER_KERNEL, gemm::PLAIN_KERNEL] {
        assert!(!entry_body(k).contains("griddepcontrol"), "{k}: PDL is off");
    }
    // The register tile: 8 rows per thread in both, 2 column vectors of the 128-wide tile and 1
    // of the split-K 64-wide tile.
    assert_eq!(
        (gemm::THREAD_ROWS, gemm::COL_VECS, pdl::COL_VECS),
        (8, 2, 1)
    );
    assert_eq!(gemm::A_PITCH, gemm::K_CHUNK + gemm::A_PAD);
    assert_eq!(pdl::A_PITCH, pdl::K_CHUNK + pdl::A_PAD);
}

#[test]
fn tile_gemm_matches_cpu_reference() {
    let Some(dev) = gpu_or_skip("tile_gemm vs f64 reference") else {
        return;
    };
    for &t in TILES {
        check(&dev, t, Kernel::Plain { grid: None });
    }
}

#[test]
fn cluster_tile_gemm_matches_cpu_reference_for_cluster_sizes_1_2_4() {
    let Some(dev) = gpu_or_skip("cluster_tile_gemm vs f64 reference") else {
        return;
    };
    for size in [1, 2, 4] {
        for &t in TILES {
            check(
                &dev,
                t,
                Kernel::Cluster {
                    size,
                    clusters: None,
                },
            );
        }
    }
}

#[test]
fn cluster_tile_gemm_size_8_where_it_fits() {
    let Some(dev) = gpu_or_skip("cluster_tile_gemm cluster 8") else {
        return;
    };
    if kernels::gemm_max_active_clusters(&dev, 8).unwrap() == 0 {
        warpline_suite::support::skip("cluster 8", "the device cannot schedule it");
        return;
    }
    check(
        &dev,
        3,
        Kernel::Cluster {
            size: 8,
            clusters: None,
        },
    );
}

#[test]
fn any_persistent_grid_is_correct() {
    let Some(dev) = gpu_or_skip("gemm persistent grids") else {
        return;
    };
    let tiles = 7;
    for grid in [1, 2, 6, 7, 8, 200] {
        check(&dev, tiles, Kernel::Plain { grid: Some(grid) });
    }
    for size in [2, 4] {
        for clusters in [1, 3, 7, 9] {
            check(
                &dev,
                tiles,
                Kernel::Cluster {
                    size,
                    clusters: Some(clusters),
                },
            );
        }
    }
}

#[test]
fn launchers_reject_bad_arguments_before_launch() {
    let Some(dev) = gpu_or_skip("gemm launch errors") else {
        return;
    };
    let mut c = case(&dev, 2);
    c.dc.fill_async(f32::NAN).unwrap();
    let s = c.stream.clone();
    for bad in [3, 16] {
        let r = kernels::cluster_tile_gemm(
            &dev,
            &s,
            c.da.as_view(),
            c.db.as_view(),
            c.dc.as_view_mut(),
            2,
            bad,
        );
        assert!(
            matches!(r, Err(Error::UnsupportedClusterSize { .. })),
            "{r:?}"
        );
    }
    let r = kernels::cluster_tile_gemm(
        &dev,
        &s,
        c.da.as_view(),
        c.db.as_view(),
        c.dc.as_view_mut(),
        3,
        2,
    );
    assert!(matches!(r, Err(Error::LengthMismatch { .. })), "{r:?}");
    let r = kernels::tile_gemm(
        &dev,
        &s,
        c.da.view(1..TILE_ELEMS + 1).unwrap(),
        c.db.view(0..TILE_ELEMS).unwrap(),
        c.dc.view_mut(0..TILE_ELEMS).unwrap(),
        1,
    );
    assert!(matches!(r, Err(Error::Misaligned { .. })), "{r:?}");
    let other = dev.new_stream().unwrap();
    let r = kernels::tile_gemm(
        &dev,
        &other,
        c.da.as_view(),
        c.db.as_view(),
        c.dc.as_view_mut(),
        2,
    );
    assert!(matches!(r, Err(Error::WrongStream { .. })), "{r:?}");
    // Nothing was launched: C is still all NaN.
    let mut got = vec![0f32; 2 * TILE_ELEMS];
    c.dc.copy_to_host(&mut got).unwrap();
    assert!(got.iter().all(|x| x.is_nan()));
    assert!(!kernels::gemm_cluster_sizes_that_fit(&dev)
        .unwrap()
        .is_empty());
}

#[test]
fn cublas_baseline_matches_cpu_reference() {
    let Some(dev) = gpu_or_skip("cuBLAS strided-batched SGEMM baseline") else {
        return;
    };
    let mut c = case(&dev, 3);
    c.dc.fill_async(f32::NAN).unwrap();
    let blas = kernels::CublasSgemm::new(&dev, &c.stream).unwrap();
    blas.gemm_tiles(c.da.as_view(), c.db.as_view(), c.dc.as_view_mut(), 3)
        .unwrap();
    let mut got = vec![0f32; 3 * TILE_ELEMS];
    c.dc.copy_to_host(&mut got).unwrap();
    verify_gemm(
        "cublas",
        &got,
        &gemm_tiles_f64(&c.a, &c.b, 3).unwrap(),
        GEMM_REL_BOUND,
    )
    .unwrap();
}
