//! `warpline`: run warpline's kernels and pipelines on GPU 0 from the command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use warpline::{
    bandwidth, npy, reference, BatchPipeline, Device, Error, PinnedBuffer, PipelineReport, Result,
};

#[derive(Parser)]
#[command(
    name = "warpline",
    version,
    about = "Rust-built Hopper kernels streamed over CUDA streams"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Stream batches of C = A + B through the multi-stream pipeline
    /// (alloc-async -> H2D -> ws_vector_add -> D2H -> free-async per batch).
    Pipeline(PipelineArgs),
    /// Print the device's capabilities and the module's kernels.
    Info,
}

#[derive(Args)]
struct PipelineArgs {
    /// Non-blocking streams the batches go round-robin over (1..=32).
    #[arg(long, default_value_t = 3)]
    streams: usize,
    /// Batches (without --a/--b: inputs are batches x batch-elems random floats).
    #[arg(long, default_value_t = 16)]
    batches: usize,
    /// Elements (f32) per batch; with --a/--b it defaults to ceil(len / batches).
    #[arg(long)]
    batch_elems: Option<usize>,
    /// Input A, a 1-D float32 .npy file (needs --b).
    #[arg(long, requires = "b")]
    a: Option<PathBuf>,
    /// Input B, a 1-D float32 .npy file of A's length (needs --a).
    #[arg(long, requires = "a")]
    b: Option<PathBuf>,
    /// Write C here as a 1-D float32 .npy file.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Check every element against the f64 CPU reference.
    #[arg(long)]
    verify: bool,
    /// Also run the same batches on 1 stream in this run and print the speed-up.
    #[arg(long)]
    compare_one_stream: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Pipeline(args) => pipeline(args),
        Cmd::Info => info(),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ (Error::NoDriver | Error::NoDevice { .. })) => {
            eprintln!("warpline: no GPU: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("warpline: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn info() -> Result<()> {
    let dev = Device::open(0)?;
    println!("{:#?}", dev.capabilities());
    println!(
        "kernels: {}",
        dev.kernel_names().collect::<Vec<_>>().join(", ")
    );
    Ok(())
}

fn bar(len: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:40}] {pos}/{len} {elapsed}")
            .expect("static template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

fn fill_random(dst: &mut [f32], pb: &ProgressBar) {
    use rand::Rng;
    let mut rng = rand::rng();
    for chunk in dst.chunks_mut(1 << 20) {
        chunk
            .iter_mut()
            .for_each(|x| *x = rng.random_range(-1.0f32..1.0));
        pb.inc(1);
    }
}

fn pipeline(args: PipelineArgs) -> Result<()> {
    let dev = Device::open(0)?;
    let caps = dev.capabilities();
    println!(
        "device: {} (sm_{}{}, {} SMs, {} copy engines)",
        caps.name,
        caps.compute_capability.0,
        caps.compute_capability.1,
        caps.sm_count,
        caps.async_engines
    );
    if args.batches == 0 {
        return Err(Error::Empty { what: "--batches" });
    }
    let (a, b) = match (&args.a, &args.b) {
        (Some(pa), Some(pb)) => {
            let a = npy::read_f32_1d(pa)?;
            let b = npy::read_f32_1d(pb)?;
            if a.len() != b.len() {
                return Err(Error::LengthMismatch {
                    what: "--a/--b",
                    detail: format!(
                        "{} has {} elements, {} has {}",
                        pa.display(),
                        a.len(),
                        pb.display(),
                        b.len()
                    ),
                });
            }
            if a.is_empty() {
                return Err(Error::Empty { what: "--a" });
            }
            (
                PinnedBuffer::from_slice(&dev, &a)?,
                PinnedBuffer::from_slice(&dev, &b)?,
            )
        }
        _ => {
            let be = args.batch_elems.unwrap_or(1 << 24);
            let n = be
                .checked_mul(args.batches)
                .filter(|&n| n > 0)
                .ok_or(Error::BadShape {
                    what: "--batches x --batch-elems",
                    detail: format!(
                        "{} x {be} must be at least 1 and fit in memory",
                        args.batches
                    ),
                })?;
            let mut a = PinnedBuffer::<f32>::new(&dev, n)?;
            let mut b = PinnedBuffer::<f32>::new(&dev, n)?;
            let pb = bar(2 * n.div_ceil(1 << 20) as u64, "inputs");
            fill_random(&mut a, &pb);
            fill_random(&mut b, &pb);
            pb.finish_and_clear();
            (a, b)
        }
    };
    let n = a.len();
    let batch_elems = args.batch_elems.unwrap_or_else(|| n.div_ceil(args.batches));
    let mut c = PinnedBuffer::<f32>::new(&dev, n)?;

    let h2d = bandwidth::pinned_h2d_gbps(&dev, 256 << 20, 5)?;
    let run = |streams: usize, c: &mut PinnedBuffer<f32>| -> Result<PipelineReport> {
        c.fill(f32::NAN);
        let pipe = BatchPipeline::new(&dev, streams)?;
        let batches = n.div_ceil(batch_elems);
        let pb = bar(batches as u64, &format!("{streams} stream(s)"));
        let report = pipe.run_vector_add(&a, &b, c, batch_elems, |done, _| {
            pb.set_position(done as u64)
        })?;
        pb.finish_and_clear();
        Ok(report)
    };
    let baseline = if args.compare_one_stream && args.streams != 1 {
        Some(run(1, &mut c)?)
    } else {
        None
    };
    let report = run(args.streams, &mut c)?;

    if args.verify {
        let pb = bar(n.div_ceil(1 << 22) as u64, "verify");
        let mut worst = 0f64;
        for ((ca, cb), cc) in a
            .chunks(1 << 22)
            .zip(b.chunks(1 << 22))
            .zip(c.chunks(1 << 22))
        {
            let want = reference::vector_add(ca, cb);
            worst = worst.max(reference::verify(
                "pipeline C",
                cc,
                &want,
                reference::VECTOR_ADD_REL_BOUND,
            )?);
            pb.inc(1);
        }
        pb.finish_and_clear();
        println!("verified: {n} elements against the f64 CPU reference, max relative error {worst:.2e} (bound {:.2e})", reference::VECTOR_ADD_REL_BOUND);
    }
    if let Some(path) = &args.out {
        npy::write_f32(path, &[n as u64], &c)?;
        println!("wrote {}", path.display());
    }

    let bytes = report.bytes_h2d + report.bytes_d2h;
    println!();
    println!(
        "{:>8} {:>8} {:>12} {:>10} {:>10} {:>12} {:>12} {:>9}",
        "streams", "batches", "MiB moved", "time ms", "GB/s", "x H2D", "x 1.5 H2D", "overlap"
    );
    let row = |r: &PipelineReport| {
        println!(
            "{:>8} {:>8} {:>12.0} {:>10.2} {:>10.1} {:>12.3} {:>12.3} {:>9.2}",
            r.streams,
            r.batches.len(),
            bytes as f64 / (1 << 20) as f64,
            r.span_ms,
            r.pcie_gbps(),
            r.pcie_gbps() / h2d,
            r.pcie_gbps() / (1.5 * h2d),
            r.overlap()
        )
    };
    if let Some(b) = &baseline {
        row(b);
    }
    row(&report);
    println!("pinned H2D bandwidth measured in this run: {h2d:.1} GB/s (upper limit of the pipeline: 1.5 x H2D = {:.1} GB/s, two of every three bytes go host to device)", 1.5 * h2d);
    if let Some(b) = &baseline {
        println!(
            "speed-up of {} streams over 1 stream: {:.2}x",
            report.streams,
            report.pcie_gbps() / b.pcie_gbps()
        );
    }
    Ok(())
}
