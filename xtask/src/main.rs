//! warpline's project commands: `cargo xtask setup | build-ptx | clippy-ptx | test | gpu-bundle`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};

mod ptxas;

#[derive(Parser)]
#[command(name = "cargo xtask", about = "warpline project commands")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what building and linting PTX needs (Debian rustc-web, cargo-web, rust-web-src,
    /// rust-web-clippy; ptxas from the PyPI package nvidia-cuda-nvcc). Idempotent.
    Setup,
    /// Build `gpu/` for nvptx64-nvidia-cuda (sm_90, PTX ISA 8.0) into target/ptx/warpline_gpu.ptx
    /// and, where ptxas is present, assemble it for sm_90 and print each kernel's resources.
    BuildPtx {
        /// Fail if ptxas is not available (CI).
        #[arg(long)]
        require_ptxas: bool,
    },
    /// Lint the device crate on its own nvptx64 build with the device toolchain's clippy
    /// (rust-web-clippy), `-D warnings`; gpu/src/lib.rs denies unsafe_op_in_unsafe_fn,
    /// missing_docs, clippy::undocumented_unsafe_blocks and clippy::missing_safety_doc.
    ClippyPtx,
    /// The project's test command: build-ptx (ptxas required), clippy-ptx, cargo fmt --check,
    /// clippy with -D warnings, cargo test --workspace.
    Test,
    /// Release test binaries, the CLI and bench binaries, stripped, with the PTX and run.sh, in
    /// target/gpu-bundle: runs on a GPU host that has no Rust toolchain.
    GpuBundle,
}

type Result<T> = std::result::Result<T, String>;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Setup => setup(),
        Cmd::BuildPtx { require_ptxas } => build_ptx(require_ptxas),
        Cmd::ClippyPtx => clippy_ptx(),
        Cmd::Test => test(),
        Cmd::GpuBundle => gpu_bundle(),
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

/// Debian's rustc-web and cargo (the device toolchain: rustc with the nvptx64 target and library
/// source for -Zbuild-std).
const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
const DEBIAN_CARGO: &str = "/usr/bin/cargo";
const DEBIAN_RUST_SRC: &str = "/usr/lib/rustlib/src/rust/library/core";
/// Debian's clippy for the same rustc (package rust-web-clippy).
const DEBIAN_CARGO_CLIPPY: &str = "/usr/bin/cargo-clippy";
const DEBIAN_CLIPPY_DRIVER: &str = "/usr/bin/clippy-driver";
/// Code generation flags of the device build (sm_90, PTX ISA 8.0; the "linker" is a no-op: the
/// PTX is the post-LTO assembly).
const DEVICE_RUSTFLAGS: &str = "-C target-cpu=sm_90 -C target-feature=+ptx80 -C linker=/bin/true";
/// Debian packages of the device toolchain.
const DEVICE_PACKAGES: [&str; 4] = ["rustc-web", "cargo-web", "rust-web-src", "rust-web-clippy"];

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
    let have_rustc = [
        DEBIAN_RUSTC,
        DEBIAN_CARGO,
        DEBIAN_RUST_SRC,
        DEBIAN_CARGO_CLIPPY,
        DEBIAN_CLIPPY_DRIVER,
    ]
    .iter()
    .all(|p| Path::new(p).exists());
    if have_rustc {
        println!(
            "setup: device toolchain already there ({DEBIAN_RUSTC}, {DEBIAN_CARGO}, rust-web-src, {DEBIAN_CARGO_CLIPPY})"
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
    match ptxas::find() {
        Some(p) => println!("setup: ptxas already there ({})", p.display()),
        None => {
            let dir = ptxas::install_dir();
            println!(
                "setup: installing ptxas (PyPI nvidia-cuda-nvcc) into {}",
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
                .arg("nvidia-cuda-nvcc"))?;
            let p =
                ptxas::find().ok_or("ptxas still not found after installing nvidia-cuda-nvcc")?;
            println!("setup: ptxas at {}", p.display());
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

/// A command of the device toolchain (`program`: Debian's cargo or cargo-clippy) for the nvptx64
/// build of `gpu/`, with the variables of this (rustup) process cleared so that the device build
/// is the same from xtask, CI and a shell.
fn device_cargo(program: &str, rustflags: &str) -> Result<Command> {
    if !Path::new(DEBIAN_RUSTC).exists() || !Path::new(DEBIAN_RUST_SRC).exists() {
        return Err(format!(
            "the device toolchain is missing ({DEBIAN_RUSTC} with rust-web-src); run `cargo xtask setup`"
        ));
    }
    if !Path::new(program).exists() {
        return Err(format!(
            "{program} is missing (Debian packages {}); run `cargo xtask setup`",
            DEVICE_PACKAGES.join(" ")
        ));
    }
    let root = root();
    let mut cmd = Command::new(program);
    // Start from a clean slate: this process runs under rustup's cargo, whose variables must not
    // leak into the device build (toolchain pin, wrappers, flags, target dir).
    for var in [
        "RUSTUP_TOOLCHAIN",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTDOCFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO",
        "RUSTC_LINKER",
    ] {
        cmd.env_remove(var);
    }
    // cargo-clippy runs `$CARGO` and finds clippy-driver next to itself; rustup's proxies
    // (~/.cargo/bin) must not come first on PATH.
    let path = std::env::var("PATH").unwrap_or_default();
    let path: Vec<&str> = path
        .split(':')
        .filter(|d| !d.ends_with("/.cargo/bin"))
        .collect();
    cmd.current_dir(&root)
        .env("PATH", format!("/usr/bin:{}", path.join(":")))
        .env("CARGO", DEBIAN_CARGO)
        .env("RUSTC", DEBIAN_RUSTC)
        .env("RUSTC_BOOTSTRAP", "1")
        .env("RUSTFLAGS", rustflags)
        .env("CARGO_PROFILE_RELEASE_LTO", "fat")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "1")
        .env("CARGO_PROFILE_RELEASE_PANIC", "abort")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3")
        .env("CARGO_PROFILE_RELEASE_DEBUG", "false");
    Ok(cmd)
}

/// The cargo arguments (after the subcommand) of the device build.
const DEVICE_ARGS: [&str; 7] = [
    "--release",
    "--target",
    "nvptx64-nvidia-cuda",
    "-Zbuild-std=core",
    "-p",
    "warpline-gpu",
    "--target-dir",
];

fn build_ptx(require_ptxas: bool) -> Result<()> {
    let target_dir = root().join("target/nvptx");
    // Warnings are shown (not allowed away); `clippy-ptx` denies them.
    let mut cmd = device_cargo(DEBIAN_CARGO, &format!("{DEVICE_RUSTFLAGS} --emit=asm"))?;
    cmd.arg("build").args(DEVICE_ARGS).arg(&target_dir);
    println!("build-ptx: building gpu/ for nvptx64-nvidia-cuda (sm_90, PTX ISA 8.0)");
    run(&mut cmd)?;
    let built = target_dir.join("nvptx64-nvidia-cuda/release/deps/warpline_gpu.s");
    let ptx =
        fs::read_to_string(&built).map_err(|e| format!("reading {}: {e}", built.display()))?;
    let out = ptx_path();
    fs::create_dir_all(out.parent().unwrap()).map_err(|e| e.to_string())?;
    // Write only on change, so the host build is not redone needlessly.
    if fs::read_to_string(&out).ok().as_deref() != Some(ptx.as_str()) {
        fs::write(&out, &ptx).map_err(|e| format!("writing {}: {e}", out.display()))?;
    }
    println!("build-ptx: wrote {} ({} bytes)", out.display(), ptx.len());
    match ptxas::find() {
        Some(ptxas) => {
            let report = ptxas::assemble(&ptxas, &out)?;
            print!("{}", ptxas::table(&report));
        }
        None if require_ptxas => {
            return Err("ptxas not found (set PTXAS or run `cargo xtask setup`)".into());
        }
        None => println!("build-ptx: ptxas not found; PTX not assembled (run `cargo xtask setup`)"),
    }
    Ok(())
}

/// Clippy over the nvptx64 build of `device/` and `gpu/` (the device code is cfg'd out of the host build, so the
/// workspace clippy never sees it), every warning an error. Its own target directory, as the
/// flags differ from build-ptx's.
fn clippy_ptx() -> Result<()> {
    let target_dir = root().join("target/nvptx-clippy");
    let mut cmd = device_cargo(DEBIAN_CARGO_CLIPPY, DEVICE_RUSTFLAGS)?;
    cmd.arg("clippy")
        .args(DEVICE_ARGS)
        .arg(&target_dir)
        .args(["-p", "warpline-device"])
        .args(["--", "-D", "warnings"]);
    println!("clippy-ptx: clippy on device/ and gpu/ for nvptx64-nvidia-cuda, -D warnings");
    run(&mut cmd)
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn test() -> Result<()> {
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
    for (name, exe) in
        built_executables(&["build", "--release", "-p", "warpline", "--bin", "warpline"])?
    {
        copy(&name, &exe, ".")?;
    }
    fs::copy(ptx_path(), dir.join("warpline_gpu.ptx")).map_err(|e| e.to_string())?;
    fs::write(dir.join("run.sh"), RUN_SH).map_err(|e| e.to_string())?;
    run(Command::new("chmod").arg("+x").arg(dir.join("run.sh")))?;
    let size: u64 = fs::read_dir(&dir)
        .map_err(|e| e.to_string())?
        .chain(fs::read_dir(dir.join("tests")).map_err(|e| e.to_string())?)
        .chain(fs::read_dir(dir.join("benches")).map_err(|e| e.to_string())?)
        .filter_map(|e| e.ok()?.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| m.len())
        .sum();
    println!(
        "gpu-bundle: {} ({:.1} MiB)",
        dir.display(),
        size as f64 / (1 << 20) as f64
    );
    if size > 60 << 20 {
        return Err(format!("bundle is {size} bytes, over the 60 MiB budget"));
    }
    Ok(())
}

const RUN_SH: &str = r#"#!/usr/bin/env bash
# Runs warpline's GPU tests, the CLI and the benches from this folder (no Rust toolchain needed).
# Usage: ./run.sh [tests|cli|bench|all] ; logs go to $LOGS (default ./logs).
set -uo pipefail
cd "$(dirname "$0")"
export WARPLINE_BIN="$PWD/warpline"
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
fi
if [[ $what == bench || $what == all ]]; then
  for b in benches/*; do
    echo "== $b"; "$b" --bench 2>&1 | tee "$LOGS/$(basename "$b").log" || rc=1
  done
fi
exit $rc
"#;
