//! Batched 128x128x128 FP32 GEMM throughput: `cluster_tile_gemm` (clusters of 2 and 4),
//! `tile_gemm`, and cuBLAS `cublasSgemmStridedBatched` (pedantic FP32 math, no TF32) on the same
//! device buffers in the same run, at T = 528 and T = 4096 tiles. CUDA events around each launch,
//! median of `REPS` after warm-up; TFLOP/s = 2 x 128^3 x T / time. Prints a table with the ratio
//! of each kernel to cuBLAS. Without a driver it prints why it skipped and exits 0.
//!
//! For DRAM bytes (ncu), profile one launch of each kernel through the CLI instead:
//! `ncu --metrics dram__bytes_read.sum warpline gemm --tiles 4096 --cluster 4 --kernel cluster --once`.

use warpline::{kernels, Device, MemPool};
use warpline_gpu::contract::gemm::TILE_ELEMS;
use warpline_suite::support::{gpu_or_skip, random_f32};

const REPS: usize = 20;

fn median_ms(
    stream: &warpline::Stream,
    mut launch: impl FnMut() -> warpline::Result<()>,
) -> warpline::Result<f64> {
    for _ in 0..3 {
        launch()?;
    }
    let mut t = Vec::with_capacity(REPS);
    for _ in 0..REPS {
        let start = stream.record()?;
        launch()?;
        let end = stream.record()?;
        end.synchronize()?;
        t.push(start.elapsed_ms(&end)? as f64);
    }
    t.sort_by(f64::total_cmp);
    Ok(t[REPS / 2])
}

fn run(dev: &Device) -> warpline::Result<()> {
    let caps = dev.capabilities();
    println!("device: {} ({} SMs)", caps.name, caps.sm_count);
    println!(
        "{:>6} {:>26} {:>10} {:>10} {:>10}",
        "tiles", "kernel", "ms", "TFLOP/s", "x cuBLAS"
    );
    for tiles in [528usize, 4096] {
        let stream = dev.new_stream()?;
        let pool = MemPool::device_default(dev, 0)?;
        let n = tiles * TILE_ELEMS;
        let mut a = pool.alloc_async::<f32>(&stream, n)?;
        let mut b = pool.alloc_async::<f32>(&stream, n)?;
        let mut c = pool.alloc_async::<f32>(&stream, n)?;
        a.copy_from_host(&random_f32(n))?;
        b.copy_from_host(&random_f32(n))?;
        c.fill_async(f32::NAN)?;
        let flop = 2.0 * 128f64.powi(3) * tiles as f64;
        let blas = kernels::CublasSgemm::new(dev, &stream)?;
        let cublas_ms = median_ms(&stream, || {
            blas.gemm_tiles(a.as_view(), b.as_view(), c.as_view_mut(), tiles)
        })?;
        let row = |name: &str, ms: f64| {
            println!(
                "{tiles:>6} {name:>26} {ms:>10.4} {:>10.2} {:>10.3}",
                flop / ms / 1e9,
                cublas_ms / ms
            )
        };
        row("cuBLAS SgemmStridedBatched", cublas_ms);
        let plain = median_ms(&stream, || {
            kernels::tile_gemm(
                dev,
                &stream,
                a.as_view(),
                b.as_view(),
                c.as_view_mut(),
                tiles,
            )
        })?;
        row("tile_gemm", plain);
        for size in [2u32, 4] {
            let name = format!("cluster_tile_gemm x{size}");
            match kernels::gemm_max_active_clusters(dev, size) {
                Ok(0) | Err(_) => println!("{tiles:>6} {name:>26}   does not fit on this device"),
                Ok(_) => {
                    let ms = median_ms(&stream, || {
                        kernels::cluster_tile_gemm(
                            dev,
                            &stream,
                            a.as_view(),
                            b.as_view(),
                            c.as_view_mut(),
                            tiles,
                            size,
                        )
                    })?;
                    row(&name, ms);
                }
            }
        }
        stream.synchronize()?;
    }
    Ok(())
}

fn main() {
    let Some(dev) = gpu_or_skip("bench gemm") else {
        return;
    };
    if let Err(e) = run(&dev) {
        eprintln!("bench gemm: {e}");
        std::process::exit(1);
    }
}
