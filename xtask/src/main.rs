//! warpline's project commands: `cargo xtask setup | build-ptx | build-kernel | clippy-ptx | test | run-main | gpu-bundle | sanitize`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};
use warpline_builder::toolchain::{DEBIAN_CARGO_CLIPPY, DEBIAN_CLIPPY_DRIVER, DEBIAN_RUSTC};
use warpline_builder::{ptxas, Arch, DeviceToolchain, PtxBuilder, PtxIsa};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "warpline project commands")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building and linting PTX needs (Debian rustc-web, cargo-web, rust-web-src,
    /// rust-web-clippy; ptxas from the PyPI package nvidia-cuda-nvcc, pinned to
    /// `warpline_builder::ptxas::PINNED_NVCC_VERSION`, the CUDA 13.0 of the GPU machines'
    /// driver, unless PTXAS names another). Idempotent.
    Setup,
    /// Build `gpu/` for nvptx64-nvidia-cuda into its two modules: sm_90 (PTX ISA 8.0) into
    /// target/ptx/warpline_gpu.ptx and sm_90a (PTX ISA 8.3, feature sm90a: the tensor-core
    /// kernels) into target/ptx-sm90a/warpline_gpu.ptx; where ptxas is present, assemble each and
    /// print each kernel's resources.
    BuildPtx {
        /// Fail if ptxas is not available (CI).
        #[arg(long)]
        require_ptxas: bool,
    },
    /// Build one kernel crate to PTX with warpline-builder, exactly as a build script's
    /// `PtxBuilder` does (flags, launch_bounds! rewrite, ptxas check), and print the ptxas
    /// report; the same as the `warpline-builder` binary. Arguments: `<crate dir>
    /// [--arch sm_90|sm_90a] [--ptx-isa 8.3] [--features a,b] [--out-dir DIR] [--target-dir DIR]
    /// [--allow-ptxas-warnings]`.
    BuildKernel {
        /// The kernel crate's folder and the options above.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<String>,
    },
    /// Lint the device crate on its own nvptx64 build with the device toolchain's clippy
    /// (rust-web-clippy), `-D warnings`; gpu/src/lib.rs denies unsafe_op_in_unsafe_fn,
    /// missing_docs, clippy::undocumented_unsafe_blocks and clippy::missing_safety_doc.
    ClippyPtx,
    /// The project's test command: setup when the device toolchain or ptxas is missing, build-ptx
    /// (ptxas required), clippy-ptx, cargo fmt --check, clippy with -D warnings, cargo test
    /// --workspace.
    Test,
    /// The main job from a fresh clone: setup when the device toolchain or ptxas is missing,
    /// build-ptx, then `cargo run --release -p warpline-cli -- pipeline --streams 3
    /// --batches 16 --batch-elems 16777216 --verify --compare-one-stream`.
    RunMain,
    /// Release test binaries, the CLI, the example programs (packages under examples/) and bench
    /// binaries, stripped, with the PTX and run.sh, in target/gpu-bundle: runs on a GPU host that
    /// has no Rust toolchain.
    GpuBundle,
    /// compute-sanitizer memcheck, racecheck, synccheck and initcheck over every kernel (the GPU
    /// tests and small CLI runs of a gpu-bundle, built first if absent): runs
    /// scripts/sanitize.sh, fails on any error or hazard. Needs a GPU and compute-sanitizer.
    Sanitize {
        /// The bundle to run (default target/gpu-bundle).
        #[arg(long)]
        bundle: Option<PathBuf>,
    },
}

type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Setup => setup(),
        Cmd::BuildPtx { require_ptxas } => build_ptx(require_ptxas),
        Cmd::BuildKernel { args } => warpline_builder::cli::run(args),
        Cmd::ClippyPtx => clippy_ptx(),
        Cmd::Test => test(),
        Cmd::RunMain => run_main(),
        Cmd::GpuBundle => gpu_bundle(),
        Cmd::Sanitize { bundle } => sanitize(bundle),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Workspace root (the parent of xtask/).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Where the device build's PTX module is written, and where the host build reads it.
fn ptx_path() -> PathBuf {
    root().join("target/ptx/warpline_gpu.ptx")
}

/// Debian packages of the device toolchain, with the device clippy (same list as
/// `warpline_builder::toolchain::DEBIAN_PACKAGES`).
const DEVICE_PACKAGES: [&str; 4] = ["rustc-web", "cargo-web", "rust-web-src", "rust-web-clippy"];

/// The kernel crate's builder as warpline uses it (sm_90, PTX ISA 8.0), with the device cargo's
/// target directory `target/nvptx`: the same settings and folder as host/build.rs, so the two share
/// one device build.
fn gpu_builder() -> PtxBuilder {
    PtxBuilder::new(root().join("gpu"))
        .arch(Arch::Sm90)
        .ptx_isa(PtxIsa::V8_0)
        .out_dir(root().join("target/ptx"))
        .target_dir(root().join("target/nvptx"))
}

fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("could not start {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed with {status}"))
    }
}

fn setup() -> Result<()> {
    let have_clippy = [DEBIAN_CARGO_CLIPPY, DEBIAN_CLIPPY_DRIVER]
        .iter()
        .all(|p| Path::new(p).exists());
    if let (Ok(t), true) = (DeviceToolchain::discover(), have_clippy) {
        println!(
            "setup: device toolchain already there ({}, {}, {:?}; {DEBIAN_CARGO_CLIPPY})",
            t.rustc.display(),
            t.cargo.display(),
            t.source
        );
    } else {
        println!("setup: installing Debian {}", DEVICE_PACKAGES.join(" "));
        let sudo = !is_root();
        let apt = |args: &[&str]| {
            let mut c = if sudo {
                Command::new("sudo")
            } else {
                Command::new("apt-get")
            };
            if sudo {
                c.arg("apt-get");
            }
            c.args(args).env("DEBIAN_FRONTEND", "noninteractive");
            run(&mut c)
        };
        apt(&["update", "-qq"])?;
        let mut args = vec!["install", "-y", "-qq"];
        args.extend(DEVICE_PACKAGES);
        apt(&args)?;
    }
    if let Some(p) = std::env::var_os(ptxas::ENV_PTXAS).filter(|p| !p.is_empty()) {
        println!(
            "setup: using PTXAS={} (not installing nvidia-cuda-nvcc {})",
            Path::new(&p).display(),
            ptxas::PINNED_NVCC_VERSION
        );
        return Ok(());
    }
    match ptxas::release(&ptxas::pinned_path()) {
        Some(r) => println!(
            "setup: ptxas {r} already there ({})",
            ptxas::pinned_path().display()
        ),
        None => {
            let dir = ptxas::install_dir();
            let pin = format!("nvidia-cuda-nvcc=={}", ptxas::PINNED_NVCC_VERSION);
            println!(
                "setup: installing ptxas (PyPI {pin}) into {}",
                dir.display()
            );
            run(Command::new("python3")
                .args([
                    "-m",
                    "pip",
                    "install",
                    "-q",
                    "--no-deps",
                    "--upgrade",
                    "--target",
                ])
                .arg(&dir)
                .arg(&pin))?;
            let r = ptxas::release(&ptxas::pinned_path())
                .ok_or_else(|| format!("ptxas still not found after installing {pin}"))?;
            println!("setup: ptxas {r} at {}", ptxas::pinned_path().display());
        }
    }
    Ok(())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout.starts_with(b"0"))
        .unwrap_or(false)
}

/// Whether `setup` has something to install: the device toolchain (with Debian's clippy for
/// clippy-ptx) or ptxas is missing.
fn needs_setup() -> bool {
    let clippy = [DEBIAN_CARGO_CLIPPY, DEBIAN_CLIPPY_DRIVER]
        .iter()
        .all(|p| Path::new(p).exists());
    let pinned_ptxas = std::env::var_os(ptxas::ENV_PTXAS).is_some_and(|p| !p.is_empty())
        || ptxas::release(&ptxas::pinned_path()).is_some();
    DeviceToolchain::discover().is_err() || !clippy || !pinned_ptxas
}

/// `setup` when something is missing (what a fresh clone needs before building PTX).
fn setup_if_needed(what: &str) -> Result<()> {
    if needs_setup() {
        println!("{what}: the device toolchain or ptxas is missing; running `cargo xtask setup`");
        setup()?;
    }
    Ok(())
}

/// The sm_90a module's builder (sm_90a, PTX ISA 8.3, feature `sm90a`: the tensor-core kernels),
/// with the same settings and folders as host/build.rs's MODULES table.
fn gpu_builder_sm90a() -> PtxBuilder {
    let mut b = PtxBuilder::new(root().join("gpu"))
        .arch(Arch::Sm90a)
        .ptx_isa(PtxIsa::V8_3)
        .features(["sm90a"])
        .out_dir(root().join("target/ptx-sm90a"))
        .target_dir(root().join("target/nvptx-sm90a"));
    // The attention entries' few spills around tile boundaries (the reason is at the constant).
    for kernel in warpline_gpu::contract::attention::ENTRIES {
        b = b.allow_spills(
            kernel,
            warpline_gpu::contract::attention::SPILL_ALLOWANCE_BYTES,
        );
    }
    b
}

/// Builds both PTX modules (sm_90 into target/ptx, sm_90a into target/ptx-sm90a) and prints
/// each one's ptxas resource table.
fn build_ptx(require_ptxas: bool) -> Result<()> {
    for (b, arch, what) in [
        (gpu_builder(), Arch::Sm90, "sm_90, PTX ISA 8.0"),
        (
            gpu_builder_sm90a(),
            Arch::Sm90a,
            "sm_90a, PTX ISA 8.3, feature sm90a",
        ),
    ] {
        println!("build-ptx: building gpu/ for nvptx64-nvidia-cuda ({what})");
        let built = b.build().map_err(|e| e.to_string())?;
        let size = fs::metadata(&built.path).map(|m| m.len()).unwrap_or(0);
        println!(
            "build-ptx: wrote {} ({size} bytes; kernels: {})",
            built.path.display(),
            built.entries.join(", ")
        );
        println!("build-ptx: device {}", built.rustc_version);
        if let Some(r) = &built.ptxas_release {
            let note = if r == ptxas::TESTED_PTXAS_RELEASE {
                String::new()
            } else {
                format!(
                    " (note: tested with {}; `cargo xtask setup` installs it)",
                    ptxas::TESTED_PTXAS_RELEASE
                )
            };
            println!("build-ptx: ptxas release {r}{note}");
        }
        for d in &built.ptxas_diagnostics {
            println!("build-ptx: ptxas: {}", d.text);
        }
        match built.resources {
            Some(r) => print!("{}", ptxas::table(arch, &r)),
            None if require_ptxas => {
                return Err("ptxas not found (set PTXAS or run `cargo xtask setup`)".into());
            }
            None => {
                println!("build-ptx: ptxas not found; PTX not assembled (run `cargo xtask setup`)")
            }
        }
    }
    Ok(())
}

/// Clippy over the nvptx64 build of `device/` and `gpu/` (the device code is cfg'd out of the host build, so the
/// workspace clippy never sees it), every warning an error, with Debian's clippy (rust-web-clippy)
/// in the builder's clean environment. Its own target directory, as the flags differ from
/// build-ptx's.
fn clippy_ptx() -> Result<()> {
    let toolchain = DeviceToolchain::discover().map_err(|e| e.to_string())?;
    if !Path::new(DEBIAN_CARGO_CLIPPY).exists() || !Path::new(DEBIAN_CLIPPY_DRIVER).exists() {
        return Err(format!(
            "{DEBIAN_CARGO_CLIPPY} is missing (Debian packages {}); run `cargo xtask setup`",
            DEVICE_PACKAGES.join(" ")
        ));
    }
    if toolchain.rustc != Path::new(DEBIAN_RUSTC) {
        println!(
            "clippy-ptx: note: clippy-driver is Debian's; the device rustc is {}",
            toolchain.rustc.display()
        );
    }
    // Both modules' builds: sm_90 (every kernel but the tensor-core ones) and sm_90a with
    // feature `sm90a` (the tensor-core kernels), as host/build.rs builds them.
    let configs = [
        (gpu_builder(), None, "target/nvptx-clippy"),
        (
            PtxBuilder::new(root().join("gpu"))
                .arch(Arch::Sm90a)
                .ptx_isa(PtxIsa::V8_3),
            Some("sm90a"),
            "target/nvptx-clippy-sm90a",
        ),
    ];
    for (b, feature, dir) in configs {
        let mut cmd = toolchain.command(Some(Path::new(DEBIAN_CARGO_CLIPPY)));
        cmd.current_dir(root())
            .env("RUSTFLAGS", b.rustflags())
            .envs(warpline_builder::PROFILE_ENV)
            .args(["clippy", "--release", "--target", warpline_builder::TARGET])
            .args([
                "-Zbuild-std=core",
                "-p",
                "warpline-gpu",
                "-p",
                "warpline-device",
            ]);
        if let Some(f) = feature {
            cmd.args(["--features", &format!("warpline-gpu/{f}")]);
        }
        cmd.arg("--target-dir")
            .arg(root().join(dir))
            .args(["--", "-D", "warnings"]);
        println!(
            "clippy-ptx: clippy on device/ and gpu/ for nvptx64-nvidia-cuda ({}{}), -D warnings",
            b.rustflags().split_whitespace().nth(1).unwrap_or(""),
            feature
                .map(|f| format!(", feature {f}"))
                .unwrap_or_default()
        );
        run(&mut cmd)?;
    }
    Ok(())
}

/// The calling cargo, with `WARPLINE_PTX` / `WARPLINE_SM90A_PTX` pointing at `build-ptx`'s
/// modules (target/ptx, target/ptx-sm90a) where they exist and the caller has not set them:
/// host/build.rs then embeds those instead of building gpu/ a second time in its own `OUT_DIR`.
/// Every command that builds through this runs `build_ptx` first, so the modules are current.
fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    for (var, path) in [
        ("WARPLINE_PTX", ptx_path()),
        (
            "WARPLINE_SM90A_PTX",
            root().join("target/ptx-sm90a/warpline_gpu.ptx"),
        ),
    ] {
        if std::env::var_os(var).is_none() && path.exists() {
            c.env(var, path);
        }
    }
    c
}

fn test() -> Result<()> {
    setup_if_needed("test")?;
    build_ptx(true)?;
    clippy_ptx()?;
    let root = root();
    println!("test: cargo fmt --check");
    run(cargo()
        .current_dir(&root)
        .args(["fmt", "--all", "--", "--check"]))?;
    println!("test: cargo clippy --workspace --all-targets -D warnings");
    run(cargo().current_dir(&root).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    println!("test: cargo test --workspace");
    run(cargo().current_dir(&root).args(["test", "--workspace"]))?;
    Ok(())
}

fn run_main() -> Result<()> {
    setup_if_needed("run-main")?;
    build_ptx(false)?;
    let args = [
        "pipeline",
        "--streams",
        "3",
        "--batches",
        "16",
        "--batch-elems",
        "16777216",
        "--verify",
        "--compare-one-stream",
    ];
    println!(
        "run-main: cargo run --release -p warpline-cli -- {}",
        args.join(" ")
    );
    run(cargo()
        .current_dir(root())
        .args(["run", "--release", "-p", "warpline-cli", "--"])
        .args(args))
}

/// Executables a cargo command builds, from its JSON messages, each with its bundle name:
/// the target's name for binaries and integration tests/benches, `<target>-unit-<kind>` for
/// unit-test harnesses. With `test`/`bench`, binaries built only for integration tests are skipped.
fn built_executables(args: &[&str]) -> Result<Vec<(String, PathBuf)>> {
    let out = cargo()
        .current_dir(root())
        .args(args)
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(format!("cargo {} failed", args.join(" ")));
    }
    let mut exes = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let is_test = msg["profile"]["test"].as_bool().unwrap_or(false);
        if args[0] != "build" && !is_test {
            continue;
        }
        let target = msg["target"]["name"].as_str().unwrap_or("unknown");
        let kinds: Vec<&str> = msg["target"]["kind"]
            .as_array()
            .map(|k| k.iter().filter_map(|v| v.as_str()).collect())
            .unwrap_or_default();
        let integration = kinds == ["test"] || kinds == ["bench"];
        let name = if !is_test || integration {
            target.to_string()
        } else {
            format!("{target}-unit-{}", kinds.first().copied().unwrap_or("lib"))
        };
        exes.push((name, PathBuf::from(exe)));
    }
    Ok(exes)
}

/// The binaries of the workspace packages whose manifest lies under `examples` (built with
/// `cargo build --release --bins --workspace`), each with its target name. None when there is no
/// such folder.
fn example_executables(examples: &Path) -> Result<Vec<(String, PathBuf)>> {
    if !examples.is_dir() {
        return Ok(Vec::new());
    }
    let out = cargo()
        .current_dir(root())
        .args(["build", "--release", "--bins", "--workspace"])
        .arg("--message-format=json-render-diagnostics")
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err("cargo build --release --bins --workspace failed".into());
    }
    let examples = examples.canonicalize().map_err(|e| e.to_string())?;
    let mut exes = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(exe), Some(manifest)) =
            (msg["executable"].as_str(), msg["manifest_path"].as_str())
        else {
            continue;
        };
        let is_bin = msg["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|v| v == "bin"));
        if is_bin && Path::new(manifest).starts_with(&examples) {
            let name = msg["target"]["name"]
                .as_str()
                .unwrap_or("unknown")
                .to_string();
            exes.push((name, PathBuf::from(exe)));
        }
    }
    Ok(exes)
}

fn gpu_bundle() -> Result<()> {
    build_ptx(false)?;
    let root = root();
    let dir = root.join("target/gpu-bundle");
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(dir.join("tests")).map_err(|e| e.to_string())?;
    fs::create_dir_all(dir.join("benches")).map_err(|e| e.to_string())?;
    let copy = |name: &str, exe: &Path, sub: &str| -> Result<()> {
        let dst = dir.join(sub).join(name);
        fs::copy(exe, &dst).map_err(|e| format!("copying {}: {e}", exe.display()))?;
        run(Command::new("strip").arg(&dst))?;
        println!("gpu-bundle: {sub}/{name}");
        Ok(())
    };
    for (name, exe) in built_executables(&["test", "--workspace", "--release", "--no-run"])? {
        copy(&name, &exe, "tests")?;
    }
    for (name, exe) in built_executables(&["bench", "--bench", "*", "--no-run"])? {
        copy(&name, &exe, "benches")?;
    }
    // The CLI: package warpline-cli (cli/), binary `warpline`.
    let cli = [
        "build",
        "--release",
        "-p",
        "warpline-cli",
        "--bin",
        "warpline",
    ];
    for (name, exe) in built_executables(&cli)? {
        copy(&name, &exe, ".")?;
    }
    // The example programs (workspace members under examples/, e.g. saxpy and softmax), if any.
    let examples = root.join("examples");
    let mut example_bins = example_executables(&examples)?;
    // The host crate's own examples (host/examples: the cudarc interop example, issue 22).
    example_bins.extend(built_executables(&[
        "build",
        "--release",
        "-p",
        "warpline",
        "--examples",
    ])?);
    if !example_bins.is_empty() {
        fs::create_dir_all(dir.join("examples")).map_err(|e| e.to_string())?;
    }
    for (name, exe) in example_bins {
        copy(&name, &exe, "examples")?;
    }
    fs::copy(ptx_path(), dir.join("warpline_gpu.ptx")).map_err(|e| e.to_string())?;
    fs::copy(
        root.join("target/ptx-sm90a/warpline_gpu.ptx"),
        dir.join("warpline_gpu_sm90a.ptx"),
    )
    .map_err(|e| e.to_string())?;
    fs::write(dir.join("run.sh"), RUN_SH).map_err(|e| e.to_string())?;
    run(Command::new("chmod").arg("+x").arg(dir.join("run.sh")))?;
    let size: u64 = fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .chain(fs::read_dir(dir.join("tests")).map_err(|e| e.to_string())?)
        .chain(fs::read_dir(dir.join("benches")).map_err(|e| e.to_string())?)
        .chain(fs::read_dir(dir.join("examples")).into_iter().flatten())
        .filter_map(|e| e.ok()?.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    println!(
        "gpu-bundle: {} ({:.1} MiB)",
        dir.display(),
        size as f64 / (1 << 20) as f64
    );
    // The device tool carries at most 64 MiB: ship the bundle as one xz archive
    // (`tar xJf .gpu/gpu-bundle.tar.xz -C target` on the GPU host recreates target/gpu-bundle).
    // Preset 9's 64 MiB dictionary spans several binaries, so the PTX every one of them embeds
    // (15 MiB since the decode step's entries) is stored about once: 14 binaries packed to
    // 7.7 MiB with it, the whole 1.3 GiB bundle would not fit in 64 MiB at preset 6.
    let carry = root.join(".gpu");
    fs::create_dir_all(&carry).map_err(|e| e.to_string())?;
    let archive = carry.join("gpu-bundle.tar.xz");
    run(Command::new("tar")
        .env("XZ_OPT", "-T0 -9")
        .arg("cJf")
        .arg(&archive)
        .arg("-C")
        .arg(root.join("target"))
        .arg("gpu-bundle"))?;
    let packed = fs::metadata(&archive).map_err(|e| e.to_string())?.len();
    println!(
        "gpu-bundle: {} ({:.1} MiB; carry .gpu, then `tar xJf .gpu/gpu-bundle.tar.xz -C target` on the GPU host)",
        archive.display(),
        packed as f64 / (1 << 20) as f64
    );
    if packed > 60 << 20 {
        return Err(format!(
            "bundle archive is {packed} bytes, over the 60 MiB budget"
        ));
    }
    Ok(())
}

/// `cargo xtask sanitize`: scripts/sanitize.sh over `bundle` (built when it is the default and
/// missing).
fn sanitize(bundle: Option<PathBuf>) -> Result<()> {
    let root = root();
    let dir = match bundle {
        Some(b) => b,
        None => {
            let d = root.join("target/gpu-bundle");
            if !d.join("warpline").exists() {
                gpu_bundle()?;
            }
            d
        }
    };
    run(Command::new("bash")
        .current_dir(&root)
        .arg("scripts/sanitize.sh")
        .env("BUNDLE", &dir))
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs warpline's GPU tests, the CLI and the benches from this folder (no Rust toolchain needed).
# Usage: ./run.sh [tests|cli|examples|bench|fuzz|all] ; logs go to $LOGS (default ./logs).
# fuzz: `warpline fuzz` over $FUZZ_SEEDS seeds (default 2000) x $FUZZ_OPS ops (default 200) on
# $FUZZ_THREADS threads (default 3) from $FUZZ_START (default 0).
set -uo pipefail
cd "$(dirname "$0")"
export WARPLINE_BIN="$PWD/warpline"
# On a GPU host a skipped GPU test is a failure.
export WARPLINE_REQUIRE_GPU=1
# NVLink multicast stays off; warpline makes no NCCL communicator without this.
export NCCL_NVLS_ENABLE=0
LOGS=${LOGS:-./logs}; mkdir -p "$LOGS"
what=${1:-all}
rc=0
if [[ $what == tests || $what == all ]]; then
  for t in tests/*; do
    echo "== $t"; "$t" --test-threads=1 2>&1 | tee "$LOGS/$(basename "$t").log" || rc=1
  done
fi
if [[ $what == cli || $what == all ]]; then
  for s in 1 3; do
    ./warpline pipeline --streams $s --batches 16 --batch-elems 16777216 --verify 2>&1 | tee -a "$LOGS/cli.log" || rc=1
  done
  for d in bf16 fp16; do
    ./warpline gemm --dtype $d --m 4096 --n 4096 --k 4096 --verify 2>&1 | tee -a "$LOGS/cli.log" || rc=1
  done
fi
if [[ $what == fuzz || $what == all ]]; then
  ./warpline fuzz --seeds "${FUZZ_SEEDS:-2000}" --ops "${FUZZ_OPS:-200}" --threads "${FUZZ_THREADS:-3}" \
    --start-seed "${FUZZ_START:-0}" --progress 2>&1 | tee "$LOGS/fuzz.log" || rc=1
fi
if [[ $what == examples || $what == all ]] && [[ -d examples ]]; then
  for x in examples/*; do
    echo "== $x"; "$x" 2>&1 | tee "$LOGS/example-$(basename "$x").log" || rc=1
  done
fi
if [[ $what == bench || $what == all ]]; then
  for b in benches/*; do
    echo "== $b"; "$b" --bench 2>&1 | tee "$LOGS/$(basename "$b").log" || rc=1
  done
fi
exit $rc
"#;
