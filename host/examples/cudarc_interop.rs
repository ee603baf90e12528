//! warpline's `TcGemm` on memory that cudarc allocated (issue 22, item 10), the way a candle (or
//! any cudarc-based) program would call it: the program owns a cudarc `CudaContext`, a
//! `CudaStream` and `CudaSlice`s; warpline takes the stream (`Stream::from_cudarc`, checked: same
//! context, non-blocking, not capturing) and views the slices on it (`CudarcView`,
//! `CudarcViewMut`: checked context and stream binding, cudarc's event tracking kept), runs the
//! GEMM, and the program reads the result back with cudarc's own API.
//!
//!     cargo run --release -p warpline --example cudarc_interop [-- --seed S]
//!
//! `C = A B` with A `300 x 520` (row-major BF16), B column-major (stored `257 x 520`), C f32
//! `300 x 257`, random normal inputs from a printed seed, C poisoned with NaN through cudarc
//! first; every element is checked against an f64 CPU reference with `TcGemm`'s bound
//! (`warpline::kernels::tc_gemm::tolerance`). Prints PASS and exits 0, FAIL and exits 1; without
//! a driver or a device it says so and exits 0 (nothing to run), as on a GPU other than
//! compute capability 9.0 (TcGemm needs sm_90a).

use std::process::ExitCode;

use cudarc::driver::{CudaContext, CudaSlice};
use rand::{Rng, SeedableRng};
use warpline::interop::{CudarcView, CudarcViewMut};
use warpline::kernels::tc_gemm::{tolerance, BLayout, Matrix, MatrixMut, TcGemm, TcGemmOptions};
use warpline::{bf16, Device, Error, Stream};

fn main() -> ExitCode {
    let seed: u64 = std::env::args()
        .skip_while(|a| a != "--seed")
        .nth(1)
        .map(|s| s.parse().expect("--seed takes an integer"))
        .unwrap_or_else(|| rand::rng().random());
    let ordinal = std::env::var("WARPLINE_DEVICE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0usize);
    let dev = match Device::open(ordinal) {
        Ok(d) => d,
        Err(e @ (Error::NoDriver | Error::NoDevice { .. })) => {
            println!("cudarc_interop: no GPU ({e}); nothing to run");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("cudarc_interop: opening GPU {ordinal}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if dev.capabilities().compute_capability != (9, 0) {
        println!(
            "cudarc_interop: {} is not compute capability 9.0 (TcGemm needs sm_90a); nothing to run",
            dev.capabilities().name
        );
        return ExitCode::SUCCESS;
    }
    println!("cudarc_interop: seed {seed} (--seed {seed} replays it)");
    match run(&dev, ordinal, seed) {
        Ok(true) => {
            println!("PASS");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            println!("FAIL");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("cudarc_interop: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Standard normal samples rounded to BF16.
fn normal_bf16(rng: &mut rand::rngs::StdRng, n: usize) -> Vec<bf16> {
    (0..n)
        .map(|_| {
            let u1: f64 = rng.random_range(f64::MIN_POSITIVE..1.0);
            let u2: f64 = rng.random();
            bf16::from_f64((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos())
        })
        .collect()
}

fn run(dev: &Device, ordinal: usize, seed: u64) -> Result<bool, Box<dyn std::error::Error>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (m, n, k) = (300usize, 257usize, 520usize);
    // Row pitches: multiples of 16 bytes (8 BF16, 4 f32), as TMA needs.
    let (lda, ldb, ldc) = (k, k, n.next_multiple_of(4));
    let a = normal_bf16(&mut rng, m * lda);
    let b = normal_bf16(&mut rng, n * ldb);

    // --- The program's own cudarc stack (what candle hands out). cudarc 0.19 without its `f16`
    // feature has no `DeviceRepr` for `half::bf16`, so the BF16 operands travel as u16 bits;
    // warpline views them as bf16 (same size, plain data: checked).
    let ctx = CudaContext::new(ordinal)?;
    let cs = ctx.new_stream()?;
    let bits = |v: &[bf16]| v.iter().map(|x| x.to_bits()).collect::<Vec<u16>>();
    let a_dev: CudaSlice<u16> = cs.clone_htod(&bits(&a))?;
    let b_dev: CudaSlice<u16> = cs.clone_htod(&bits(&b))?;
    let mut c_dev: CudaSlice<f32> = cs.clone_htod(&vec![f32::NAN; m * ldc])?;

    // --- Into warpline. SAFETY: this program never begins a stream capture on `cs`.
    let stream = unsafe { Stream::from_cudarc(dev, cs.clone()) }?;
    let tc = TcGemm::new(dev)?;
    {
        let a_v = CudarcView::<bf16>::new(&a_dev, &stream)?;
        let b_v = CudarcView::<bf16>::new(&b_dev, &stream)?;
        let mut c_v = CudarcViewMut::<f32>::new(&mut c_dev, &stream)?;
        tc.gemm(
            &stream,
            Matrix::new(a_v.view(), m, k, lda),
            Matrix::new(b_v.view(), n, k, ldb),
            BLayout::ColMajor,
            MatrixMut::new(c_v.view_mut(), m, n, ldc),
            1.0,
            0.0,
            &TcGemmOptions::default(),
        )?;
        // The views drop here: cudarc records the GEMM's reads and write on the slices' stream.
    }

    // --- Back in cudarc: its own copy to the host, ordered after the GEMM on the same stream.
    let c: Vec<f32> = cs.clone_dtoh(&c_dev)?;
    cs.synchronize()?;
    let mut worst = 0.0f64;
    let mut bad = 0usize;
    for i in 0..m {
        for j in 0..n {
            let (mut want, mut abs) = (0.0f64, 0.0f64);
            for kk in 0..k {
                let p = a[i * lda + kk].to_f64() * b[j * ldb + kk].to_f64();
                want += p;
                abs += p.abs();
            }
            let got = c[i * ldc + j] as f64;
            let tol = tolerance(want, abs, 1.0, 0.0, 2f64.powi(-24));
            let err = (got - want).abs();
            if err.is_nan() || err > tol {
                if bad < 5 {
                    eprintln!("C[{i}][{j}] = {got}, want {want} (bound {tol:e})");
                }
                bad += 1;
            } else {
                worst = worst.max(err / tol);
            }
        }
    }
    for i in 0..m {
        for j in n..ldc {
            if !c[i * ldc + j].is_nan() {
                eprintln!("C padding [{i}][{j}] was written");
                bad += 1;
            }
        }
    }
    println!(
        "cudarc_interop: TcGemm {m} x {n} x {k} on cudarc memory: {} of {} elements outside the bound, worst error {worst:.3} of the bound",
        bad,
        m * n
    );
    Ok(bad == 0)
}
