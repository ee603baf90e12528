//! Issue 22, items 5, 6 and 8 and the "3-D TMA" done-means, on the GPU (each test prints
//! SKIPPED without a driver; `WARPLINE_REQUIRE_GPU=1` turns that into a failure):
//!
//! - `batched_gemm_*`: the batched BF16 GEMM (3-D tensor maps, one CTA per tile, a `TmaPipeline`
//!   without a cluster, wgmma) against an f64 reference on the BF16-rounded inputs, batch 3,
//!   sizes that are multiples of no tile, K deep enough to wrap the 4-stage ring, padded pitches
//!   and batch strides whose padding holds NaN, C poisoned with NaN (its padding must stay NaN);
//!   cuBLAS's strided-batched GEMM (the bench's reference) on the same inputs against the same
//!   reference. Bound per element: `1e-3 * sum_k |a b| + |want| / 256 + 1e-6`
//!   (`batched_tolerance`: FP32 accumulation plus the BF16 output rounding).
//! - `tma_copy_rank{3,4,5}[_multicast]`: the device library's rank-3..5 TMA loads and stores
//!   (and the multicast loads, in clusters of 2; each box reaches the output only through the
//!   peer CTA's multicast), after `cp.async.bulk.prefetch.tensor` and `cp.async.bulk.prefetch.L2`:
//!   random f32 tensors with box grids that overhang every dimension; every element must arrive
//!   bit-exact and the output's padding must keep its sentinel, except each row's 16-byte
//!   overhang past dims[0] (a TMA store writes rows in whole 16-byte pieces), which may hold the
//!   sentinel or the load's +0.0. Each copy runs in a child process of this binary (killed
//!   after 240 s; the copy's own wait is bounded at 30 s), so a hang fails one test instead of
//!   hanging the binary. `tma_copy_layouts_without_a_gpu` checks the maps, extents, launch
//!   parameters and box tiling on the CPU.
//! - `math_functions_*`: `math::{sqrt, sqrt_approx, rsqrt_approx, tanh_approx, exp_approx,
//!   ln_approx, sin_approx, cos_approx}` against f64 with the bounds stated in their docs, written
//!   with the 8-byte stores.
//!
//! Seeds are printed (`WARPLINE_SEED=<n>` replays one).

use rand::{Rng, SeedableRng};
use std::time::Duration;
use warpline::kernels::batched_gemm::{
    batched_tolerance, reference_batched, BatchedGemm, BatchedMatrix, BatchedMatrixMut,
    CublasBatchedGemm,
};
use warpline::launch::LaunchConfig;
use warpline::module::{View, ViewMut};
use warpline::ordering::{synchronize_timeout, OnTimeout};
use warpline::tensor_map::{check_store_extent, L2Promotion, TmaDtype, TmaSwizzle};
use warpline::{bf16, Device, DeviceBuffer, MemPool, TensorMap, TensorMapDesc, TensorMapTable};
use warpline_gpu::contract::device_check as dc;
use warpline_suite::support::{gemm_seed, gpu_or_skip, normal, run_child_test};

/// The device, or `None` (skipped) without a driver; an sm_90a device is required otherwise.
fn sm90a_or_skip(test: &str) -> Option<Device> {
    let dev = gpu_or_skip(test)?;
    assert_eq!(
        dev.capabilities().compute_capability,
        (9, 0),
        "{test}: needs an sm_90a (compute capability 9.0) GPU"
    );
    Some(dev)
}

// ------------------------------------------------------------------------------------------------
// Batched GEMM
// ------------------------------------------------------------------------------------------------

/// A batch of `rows x cols` BF16 matrices with row pitch `pitch` and batch stride `stride`,
/// random normal values, padding NaN; returns the buffer and the host values (BF16-rounded).
fn upload_batched(
    pool: &MemPool,
    s: &warpline::Stream,
    rng: &mut rand::rngs::StdRng,
    (batch, rows, cols, pitch, stride): (usize, usize, usize, usize, usize),
) -> (DeviceBuffer<bf16>, Vec<f32>) {
    let len = (batch - 1) * stride + (rows - 1) * pitch + cols;
    let mut host = vec![f32::NAN; len];
    let vals = normal(rng, batch * rows * cols);
    for b in 0..batch {
        for r in 0..rows {
            for c in 0..cols {
                host[b * stride + r * pitch + c] =
                    bf16::from_f32(vals[(b * rows + r) * cols + c]).to_f32();
            }
        }
    }
    let typed: Vec<bf16> = host.iter().map(|&v| bf16::from_f32(v)).collect();
    let mut buf = pool.alloc_async::<bf16>(s, len).unwrap();
    buf.copy_from_host(&typed).unwrap();
    (buf, host)
}

/// Checks `got` (C as read back) against the f64 reference: in-bounds elements within the bound,
/// padding still NaN. Returns the largest error relative to its bound.
#[allow(clippy::too_many_arguments)]
fn check_c(
    what: &str,
    got: &[bf16],
    a: &[f32],
    b: &[f32],
    (batch, m, n, k): (usize, usize, usize, usize),
    (lda, sa): (usize, usize),
    (ldb, sb): (usize, usize),
    (ldc, sc): (usize, usize),
) -> f64 {
    let mut inside = vec![false; got.len()];
    let mut worst = 0.0f64;
    for bt in 0..batch {
        for i in 0..m {
            for j in 0..n {
                let at = bt * sc + i * ldc + j;
                inside[at] = true;
                let (want, abs) = reference_batched(a, b, (lda, sa), (ldb, sb), k, bt, i, j);
                let g = got[at].to_f64();
                let tol = batched_tolerance(want, abs);
                let err = (g - want).abs();
                assert!(
                    err <= tol,
                    "{what}: C[{bt}][{i}][{j}] = {g}, want {want} (error {err:e} > bound {tol:e})"
                );
                worst = worst.max(err / tol);
            }
        }
    }
    for (at, v) in got.iter().enumerate() {
        if !inside[at] {
            assert!(
                v.is_nan(),
                "{what}: padding element {at} of C was written ({v})"
            );
        }
    }
    worst
}

fn batched_case(test: &str, batch: usize, m: usize, n: usize, k: usize, pad: usize) {
    let Some(dev) = sm90a_or_skip(test) else {
        return;
    };
    let seed = gemm_seed(test);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let gemm = BatchedGemm::new(&dev).unwrap();
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let p8 = |v: usize| v.next_multiple_of(8) + 8 * pad;
    let (lda, ldb, ldc) = (p8(k), p8(k), p8(n));
    let (sa, sb, sc) = (m * lda + 8 * pad, n * ldb + 16 * pad, m * ldc + 8 * pad);
    let (da, ha) = upload_batched(&pool, &s, &mut rng, (batch, m, k, lda, sa));
    let (db, hb) = upload_batched(&pool, &s, &mut rng, (batch, n, k, ldb, sb));
    let c_len = (batch - 1) * sc + (m - 1) * ldc + n;
    let mut dc = pool.alloc_async::<bf16>(&s, c_len).unwrap();
    let a = BatchedMatrix {
        view: da.as_view(),
        batch,
        rows: m,
        cols: k,
        pitch: lda,
        batch_stride: sa,
    };
    let b = BatchedMatrix {
        view: db.as_view(),
        batch,
        rows: n,
        cols: k,
        pitch: ldb,
        batch_stride: sb,
    };
    let dims = (batch, m, n, k);
    for (name, cublas) in [("warpline", false), ("cuBLAS", true)] {
        dc.fill_async(bf16::NAN).unwrap();
        let c = BatchedMatrixMut {
            view: dc.as_view_mut(),
            batch,
            rows: m,
            cols: n,
            pitch: ldc,
            batch_stride: sc,
        };
        if cublas {
            CublasBatchedGemm::new(&dev, &s)
                .unwrap()
                .gemm(&a, &b, &mut { c })
                .unwrap();
        } else {
            gemm.gemm(&s, a, b, c).unwrap();
        }
        let mut got = vec![bf16::ZERO; c_len];
        dc.copy_to_host(&mut got).unwrap();
        let worst = check_c(
            &format!("{test} ({name})"),
            &got,
            &ha,
            &hb,
            dims,
            (lda, sa),
            (ldb, sb),
            (ldc, sc),
        );
        eprintln!("{test}: {name} {batch} x {m} x {n} x {k}: worst error {worst:.3} of the bound");
    }
}

#[test]
fn batched_gemm_batch3_ragged_tiles_deep_k() {
    // M, N, K multiples of no tile (128, 256, 64); K = 520 is 9 k-blocks, wrapping the 4-stage
    // ring twice; padded pitches and batch strides.
    batched_case(
        "batched_gemm_batch3_ragged_tiles_deep_k",
        3,
        200,
        300,
        520,
        1,
    );
}

#[test]
fn batched_gemm_batch3_tiny_and_tight() {
    // One partial tile per batch, one partial k-block, tight pitches (M rows end inside the
    // first tile: a 2-D map over [batch * M, K] would read the next batch's rows there).
    batched_case("batched_gemm_batch3_tiny_and_tight", 3, 5, 17, 9, 0);
}

// ------------------------------------------------------------------------------------------------
// TMA copies of rank 3 to 5
// ------------------------------------------------------------------------------------------------
//
// Two H100 findings (2026-11-25) shaped these tests:
// - A TMA store clips dimension 0 at 16-byte granularity: a row that ends inside a 16-byte piece
//   is written to the piece's end (here: the load's zeros into the row padding past dims[0] = 37
//   f32). That is the hardware, not the copy: the check accepts the sentinel or +0.0 in those
//   bytes (`TensorMapDesc::store_overhang_bytes`) and nowhere else, and dst reaches the last
//   row's piece (`check_store_extent`).
// - `tma_copy_rank3_multicast` hung the binary: LLVM had copied the `.aligned` cluster barrier
//   into both arms of the kernel's `if tid == 0` (divergent `.aligned` barrier, undefined);
//   `cluster::sync_cluster` is now the per-thread form, and tests/ptx.rs checks the entries.
// Each copy runs in a child process of this binary, killed after CHILD_LIMIT, and bounds its own
// wait with `synchronize_timeout`: a hung kernel fails its test instead of hanging the binary.

/// `(src, dst, box, boxes, box_bytes, l2_src, l2_bytes)`.
type CopySig = (u64, u64, u64, u64, u32, View<f32>, u32);

/// Marks the child processes (see `run_child_test`).
const CHILD_ENV: &str = "WARPLINE_ISSUE22_TMA_CHILD";
/// A child that has not exited by then hung (module load, JIT of the sm_90a module, copy).
const CHILD_LIMIT: Duration = Duration::from_secs(240);
/// The copy's own bound inside the child (microseconds of work).
const COPY_BOUND: Duration = Duration::from_secs(30);

/// The three cases: dims and box, innermost first; every dimension overhung by the box grid,
/// dims[0] * 4 bytes a multiple of 16 in none of them.
const CASES: [(&[u64], &[u32]); 3] = [
    (&[37, 13, 5], &[8, 4, 2]),
    (&[21, 7, 3, 5], &[4, 3, 2, 2]),
    (&[19, 5, 3, 4, 3], &[4, 2, 2, 3, 2]),
];

/// The memory layout and launch parameters of one copy case (pure, checked without a GPU in
/// `tma_copy_layouts_without_a_gpu`).
struct CopyLayout {
    /// Element strides per dimension: the row pitch is dims[0] rounded up to 4 elements (16
    /// bytes) plus 4; each outer dimension adds one extra row of padding.
    estrides: Vec<u64>,
    /// Elements of src: the map's extent, `1 + sum (dims[d] - 1) * estrides[d]`.
    len: usize,
    /// Elements of dst: the TMA stores' reach, the last row's 16-byte overhang included.
    dst_len: usize,
    /// The row's elements past dims[0] that a store may write (its 16-byte overhang).
    overhang: u64,
    /// Boxes per dimension (1 past the rank) and the box, for `dc::pack`.
    boxes: [u32; 5],
    box5: [u32; 5],
    /// Box count (the grid) and bytes per box (the expect-tx count per box).
    total: u32,
    box_bytes: u32,
    /// The maps' description (address filled in by `TensorMap::new`).
    desc: TensorMapDesc,
}

fn copy_layout(dims: &[u64], box_dims: &[u32]) -> CopyLayout {
    let rank = dims.len();
    let mut estrides = vec![1u64; rank];
    estrides[1] = dims[0].next_multiple_of(4) + 4;
    for d in 2..rank {
        estrides[d] = estrides[d - 1] * dims[d - 1] + estrides[1];
    }
    let len = (0..rank).map(|d| (dims[d] - 1) * estrides[d]).sum::<u64>() as usize + 1;
    let desc = TensorMapDesc {
        dtype: TmaDtype::F32,
        address: 0,
        dims: dims.to_vec(),
        strides: estrides[1..].iter().map(|e| e * 4).collect(),
        box_dims: box_dims.to_vec(),
        swizzle: TmaSwizzle::None,
        l2_promotion: L2Promotion::B128,
    };
    let overhang = desc.store_overhang_bytes() / 4;
    let dst_len = (desc.store_extent_bytes() / 4) as usize;
    let mut boxes = [1u32; 5];
    let mut box5 = [0u32; 5];
    for d in 0..rank {
        boxes[d] = dims[d].div_ceil(box_dims[d] as u64) as u32;
        box5[d] = box_dims[d];
    }
    CopyLayout {
        estrides,
        len,
        dst_len,
        overhang,
        boxes,
        box5,
        total: boxes.iter().product(),
        box_bytes: box_dims.iter().product::<u32>() * 4,
        desc,
    }
}

/// The box coordinates of box `b` as the copy kernels compute them (`coords` in
/// gpu/src/kernels/device_check.rs): `b`'s digits in the mixed radix of the box counts, times
/// the box.
fn box_coords(mut b: u32, boxes: &[u32; 5], box5: &[u32; 5], rank: usize) -> Vec<u64> {
    (0..rank)
        .map(|d| {
            let n = boxes[d].max(1);
            let c = (b % n) * box5[d];
            b /= n;
            c as u64
        })
        .collect()
}

/// Runs `child` (this binary's ignored test running one copy case) in a child process killed
/// after `CHILD_LIMIT`, after checking here that an sm_90a device is there (skip without one).
fn tma_copy_in_child(test: &str, child: &str) {
    if sm90a_or_skip(test).is_none() {
        return;
    }
    run_child_test(child, &[(CHILD_ENV, "1")], CHILD_LIMIT, None);
}

fn tma_copy(test: &str, case: usize, multicast: bool) {
    assert_eq!(
        std::env::var(CHILD_ENV).as_deref(),
        Ok("1"),
        "{test}: run through its parent test"
    );
    let Some(dev) = sm90a_or_skip(test) else {
        return;
    };
    let (dims, box_dims) = CASES[case];
    let rank = dims.len();
    let l = copy_layout(dims, box_dims);
    let seed = gemm_seed(test);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let module = dev.load_module(warpline::SM90A_PTX).unwrap();
    let name = if multicast {
        dc::COPY_MULTICAST_KERNELS[rank - 3]
    } else {
        dc::COPY_KERNELS[rank - 3]
    };
    let k = module.kernel::<CopySig>(name).unwrap();
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let src_host: Vec<f32> = (0..l.len).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let mut src = pool.alloc_async::<f32>(&s, l.len).unwrap();
    src.copy_from_host(&src_host).unwrap();
    let sentinel = f32::from_bits(0x7fc0_dead);
    let mut dst = pool.alloc_async::<f32>(&s, l.dst_len).unwrap();
    dst.fill_async(sentinel).unwrap();
    assert!(
        !multicast || l.total.is_multiple_of(2),
        "{test}: odd box count"
    );
    let l2_bytes = ((l.len * 4) as u32).min(4096) / 16 * 16;
    {
        let src_view = src.as_view();
        let dst_view = dst.as_view_mut();
        let map_src = TensorMap::new(&src_view, l.desc.clone()).unwrap();
        let map_dst = TensorMap::new_mut(&dst_view, l.desc.clone()).unwrap();
        check_store_extent(map_dst.desc(), dst_view.len()).unwrap();
        let table = TensorMapTable::upload(&pool, &s, &[map_src, map_dst]).unwrap();
        let mut cfg =
            LaunchConfig::linear(l.total, dc::COPY_THREADS, dc::copy_smem_bytes(l.box_bytes));
        if multicast {
            cfg = cfg.with_cluster_x(2);
        }
        // SAFETY: the maps describe src and dst (rank `rank`, the same dims and box, no swizzle),
        // live in the table on this stream until after the kernel; dst holds the stores' reach
        // (the last row's 16-byte overhang, checked above) and the rows' overhang lies in their
        // padding (pitch >= dims[0] rounded up to 4 elements); the grid is the box count (even
        // for the multicast entry, in clusters of 2), so each box of dst is written once; the L2
        // prefetch covers the first l2_bytes (a multiple of 16) of src, 256-byte aligned.
        unsafe {
            k.launch(
                &s,
                &cfg,
                (
                    table.address(0).unwrap(),
                    table.address(1).unwrap(),
                    dc::pack(l.box5).unwrap(),
                    dc::pack(l.boxes).unwrap(),
                    l.box_bytes,
                    src.as_view(),
                    l2_bytes,
                ),
            )
        }
        .unwrap();
        if let Err(e) = synchronize_timeout(&s, COPY_BOUND, OnTimeout::Abandon) {
            // The kernel hangs: leave at once (dropping its buffers, module and stream could
            // block behind it); the parent reports the failure.
            eprintln!("{test}: the copy did not finish within {COPY_BOUND:?}: {e}");
            std::process::exit(3);
        }
    }
    let mut got = vec![0f32; l.dst_len];
    dst.copy_to_host(&mut got).unwrap();
    // 0: padding (must keep the sentinel), 1: element, 2: a row's 16-byte overhang past dims[0]
    // (sentinel, or the +0.0 the load filled there).
    let mut class = vec![0u8; l.dst_len];
    let mut idx = vec![0u64; rank];
    loop {
        let at = (0..rank).map(|d| idx[d] * l.estrides[d]).sum::<u64>() as usize;
        class[at] = 1;
        assert_eq!(
            got[at].to_bits(),
            src_host[at].to_bits(),
            "{test}: element {idx:?} (offset {at})"
        );
        if idx[0] == dims[0] - 1 {
            for x in 1..=l.overhang as usize {
                class[at + x] = 2;
            }
        }
        let mut d = 0;
        while d < rank {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
            d += 1;
        }
        if d == rank {
            break;
        }
    }
    let mut overhang_written = 0usize;
    for (at, v) in got.iter().enumerate() {
        match class[at] {
            0 => assert_eq!(
                v.to_bits(),
                sentinel.to_bits(),
                "{test}: padding {at} written ({v})"
            ),
            2 => {
                assert!(
                    v.to_bits() == sentinel.to_bits() || v.to_bits() == 0,
                    "{test}: row overhang {at} holds {v} ({:#x}); allowed: the sentinel or +0.0",
                    v.to_bits()
                );
                overhang_written += usize::from(v.to_bits() == 0);
            }
            _ => {}
        }
    }
    let rows: u64 = dims[1..].iter().product();
    eprintln!(
        "{test}: {} boxes of {box_dims:?} over {dims:?} copied bit-exact; {overhang_written} of {} row-overhang elements (16-byte store granularity) written with zeros, all other padding untouched",
        l.total,
        rows * l.overhang
    );
}

#[test]
fn tma_copy_layouts_without_a_gpu() {
    for (dims, box_dims) in CASES {
        let rank = dims.len();
        let l = copy_layout(dims, box_dims);
        // The map: valid for the driver's rules (strides multiples of 16, box inner span 16n).
        l.desc.validate().unwrap();
        assert!(l.desc.strides.iter().all(|s| s % 16 == 0), "{dims:?}");
        assert_eq!(l.desc.extent_bytes(), l.len as u64 * 4, "{dims:?}");
        warpline::tensor_map::check_extent(&l.desc, l.len).unwrap();
        // dims[0] is ragged in 16-byte units: the stores overhang every row, inside its pitch.
        assert!(l.overhang > 0, "{dims:?}");
        assert!(
            dims[0] + l.overhang <= l.estrides[1],
            "{dims:?}: the overhang leaves the row padding"
        );
        assert_eq!(l.dst_len, l.len + l.overhang as usize, "{dims:?}");
        check_store_extent(&l.desc, l.dst_len).unwrap();
        check_store_extent(&l.desc, l.len).unwrap_err();
        // The launch: even grid for clusters of 2, packed fields fit, smem under 48 KiB.
        assert!(l.total.is_multiple_of(2), "{dims:?}");
        dc::pack(l.box5).unwrap();
        dc::pack(l.boxes).unwrap();
        assert!(dc::copy_smem_bytes(l.box_bytes) <= 48 * 1024);
        // The boxes tile the tensor: every element in exactly one box, every box starts inside.
        let mut cover = vec![0u32; l.len];
        for b in 0..l.total {
            let c = box_coords(b, &l.boxes, &l.box5, rank);
            assert!(
                (0..rank).all(|d| c[d] < dims[d]),
                "{dims:?}: box {b} at {c:?}"
            );
            let mut off = vec![0u64; rank];
            loop {
                let e: Vec<u64> = (0..rank).map(|d| c[d] + off[d]).collect();
                if (0..rank).all(|d| e[d] < dims[d]) {
                    let at = (0..rank).map(|d| e[d] * l.estrides[d]).sum::<u64>() as usize;
                    cover[at] += 1;
                }
                let mut d = 0;
                while d < rank {
                    off[d] += 1;
                    if off[d] < box_dims[d] as u64 {
                        break;
                    }
                    off[d] = 0;
                    d += 1;
                }
                if d == rank {
                    break;
                }
            }
        }
        let elements: u64 = dims.iter().product();
        assert_eq!(
            cover.iter().filter(|&&n| n == 1).count() as u64,
            elements,
            "{dims:?}"
        );
        assert!(cover.iter().all(|&n| n <= 1), "{dims:?}");
        // The multicast pairs: box b's peer b ^ 1 is in the same cluster of 2.
        for b in 0..l.total {
            assert_eq!(b / 2, (b ^ 1) / 2);
        }
    }
}

#[test]
fn tma_copy_rank3() {
    tma_copy_in_child("tma_copy_rank3", "tma_copy_rank3_child");
}

#[test]
fn tma_copy_rank4() {
    tma_copy_in_child("tma_copy_rank4", "tma_copy_rank4_child");
}

#[test]
fn tma_copy_rank5() {
    tma_copy_in_child("tma_copy_rank5", "tma_copy_rank5_child");
}

#[test]
fn tma_copy_rank3_multicast() {
    tma_copy_in_child("tma_copy_rank3_multicast", "tma_copy_rank3_multicast_child");
}

#[test]
fn tma_copy_rank4_multicast() {
    tma_copy_in_child("tma_copy_rank4_multicast", "tma_copy_rank4_multicast_child");
}

#[test]
fn tma_copy_rank5_multicast() {
    tma_copy_in_child("tma_copy_rank5_multicast", "tma_copy_rank5_multicast_child");
}

#[test]
#[ignore = "run by tma_copy_rank3 in a child process"]
fn tma_copy_rank3_child() {
    tma_copy("tma_copy_rank3", 0, false);
}

#[test]
#[ignore = "run by tma_copy_rank4 in a child process"]
fn tma_copy_rank4_child() {
    tma_copy("tma_copy_rank4", 1, false);
}

#[test]
#[ignore = "run by tma_copy_rank5 in a child process"]
fn tma_copy_rank5_child() {
    tma_copy("tma_copy_rank5", 2, false);
}

#[test]
#[ignore = "run by tma_copy_rank3_multicast in a child process"]
fn tma_copy_rank3_multicast_child() {
    tma_copy("tma_copy_rank3_multicast", 0, true);
}

#[test]
#[ignore = "run by tma_copy_rank4_multicast in a child process"]
fn tma_copy_rank4_multicast_child() {
    tma_copy("tma_copy_rank4_multicast", 1, true);
}

#[test]
#[ignore = "run by tma_copy_rank5_multicast in a child process"]
fn tma_copy_rank5_multicast_child() {
    tma_copy("tma_copy_rank5_multicast", 2, true);
}

// ------------------------------------------------------------------------------------------------
// math
// ------------------------------------------------------------------------------------------------

#[test]
fn math_functions_against_f64() {
    let test = "math_functions_against_f64";
    let Some(dev) = sm90a_or_skip(test) else {
        return;
    };
    let seed = gemm_seed(test);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let module = dev.load_module(warpline::SM90A_PTX).unwrap();
    let k = module
        .kernel::<(View<f32>, ViewMut<f32>, u32)>(dc::MATH_KERNEL)
        .unwrap();
    let s = dev.new_stream().unwrap();
    let pool = MemPool::new(&dev, 0).unwrap();
    let n = 100_003usize;
    // Positive, inside every function's documented range: (0.01, 3.1) ⊂ (0, pi].
    let x: Vec<f32> = (0..n).map(|_| rng.random_range(0.01f32..3.1)).collect();
    let mut dx = pool.alloc_async::<f32>(&s, n).unwrap();
    dx.copy_from_host(&x).unwrap();
    let mut dy = pool.alloc_async::<f32>(&s, n * dc::MATH_FUNCS).unwrap();
    dy.fill_async(f32::NAN).unwrap();
    // SAFETY: math_check reads x[..n] and writes y[..8 n] (8-byte aligned pool memory).
    unsafe {
        k.launch(
            &s,
            &LaunchConfig::linear((n as u32).div_ceil(256), 256, 0),
            (dx.as_view(), dy.as_view_mut(), n as u32),
        )
    }
    .unwrap();
    let mut y = vec![0f32; n * dc::MATH_FUNCS];
    dy.copy_to_host(&mut y).unwrap();
    // (reference, relative bound, absolute bound) per function, in MATH_FUNCS_NAMES order.
    type Check = (fn(f64) -> f64, f64, f64);
    let checks: [Check; dc::MATH_FUNCS] = [
        (f64::sqrt, 0.0, 0.0), // exact (correctly rounded): compared below
        (f64::sqrt, 2f64.powi(-21), 0.0),
        (|v| 1.0 / v.sqrt(), 2f64.powi(-21), 0.0),
        (f64::tanh, 2f64.powi(-10), 0.0),
        (f64::exp, 2f64.powi(-20), 0.0),
        (f64::ln, 0.0, 2f64.powi(-20)),
        (f64::sin, 0.0, 2f64.powi(-19)),
        (f64::cos, 0.0, 2f64.powi(-19)),
    ];
    for (j, (f, rel, abs)) in checks.iter().enumerate() {
        let name = dc::MATH_FUNCS_NAMES[j];
        let mut worst = 0.0f64;
        for i in 0..n {
            let got = y[i * dc::MATH_FUNCS + j];
            let want = f(x[i] as f64);
            if j == 0 {
                assert_eq!(got, want as f32, "sqrt({}) not correctly rounded", x[i]);
                continue;
            }
            let bound = rel * want.abs() + abs;
            let err = (got as f64 - want).abs();
            assert!(
                err <= bound,
                "{name}({}) = {got}, want {want} (error {err:e} > {bound:e})",
                x[i]
            );
            worst = worst.max(err / bound);
        }
        eprintln!("{test}: {name}: worst error {worst:.3} of the bound over {n} inputs");
    }
}
