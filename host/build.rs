//! Builds warpline's two PTX modules from `../gpu` with warpline-builder into `$OUT_DIR`:
//! - `WARPLINE_PTX_PATH`: the sm_90 module (PTX ISA 8.0), every kernel that runs on any Hopper;
//! - `WARPLINE_SM90A_PTX_PATH`: the sm_90a module (PTX ISA 8.3, feature `sm90a` of the kernel
//!   crate): the tensor-core kernels (wgmma, setmaxnreg), which run on compute capability 9.0
//!   exactly.
//!
//! Both are embedded by `include_str!` in `src/lib.rs`. Everything this script writes (the
//! modules and the device cargo's target directories) is under `$OUT_DIR`. Editing `gpu/` or `device/` and running
//! `cargo build`/`cargo run` rebuilds them: the rerun-if-changed list covers both crates' `src/`
//! and manifests.
//!
//! `WARPLINE_PTX=/path/to/warpline_gpu.ptx` and `WARPLINE_SM90A_PTX=/path/to/warpline_gpu.ptx`
//! use prebuilt modules as they are (no device toolchain needed for that module). Without them and
//! without a device toolchain the build stops with a message naming `cargo xtask setup`.

use std::path::{Path, PathBuf};
use std::process::exit;

use warpline_builder::{
    Arch, BuildError, DeviceToolchain, PtxBuilder, PtxIsa, ENV_DEVICE_CARGO, ENV_DEVICE_RUSTC,
};

fn fail(msg: &str) -> ! {
    eprintln!("\nwarpline (host/build.rs): {msg}\n");
    exit(1)
}

/// One of the two modules: how it is built and which variables name it.
struct ModuleSpec {
    /// Prebuilt-module override variable.
    override_var: &'static str,
    /// Variable `src/lib.rs` reads.
    path_var: &'static str,
    arch: Arch,
    isa: PtxIsa,
    features: &'static [&'static str],
    /// Sub-folder of `$OUT_DIR` for this module and its device cargo target directory (one per
    /// feature set).
    target_subdir: &'static str,
    /// Where `cargo xtask build-ptx` writes this module.
    xtask_path: &'static str,
}

const MODULES: [ModuleSpec; 2] = [
    ModuleSpec {
        override_var: "WARPLINE_PTX",
        path_var: "WARPLINE_PTX_PATH",
        arch: Arch::Sm90,
        isa: PtxIsa::V8_0,
        features: &[],
        target_subdir: "nvptx",
        xtask_path: "target/ptx/warpline_gpu.ptx",
    },
    ModuleSpec {
        override_var: "WARPLINE_SM90A_PTX",
        path_var: "WARPLINE_SM90A_PTX_PATH",
        arch: Arch::Sm90a,
        isa: PtxIsa::V8_3,
        features: &["sm90a"],
        target_subdir: "nvptx-sm90a",
        xtask_path: "target/ptx-sm90a/warpline_gpu.ptx",
    },
];

fn main() {
    // Before any early exit: a later toolchain install or override must rerun this script.
    for v in [ENV_DEVICE_RUSTC, ENV_DEVICE_CARGO] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest_dir
        .parent()
        .unwrap_or(Path::new(".."))
        .to_path_buf();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    for spec in &MODULES {
        let path = match prebuilt(spec, &workspace, &manifest_dir) {
            Some(p) => p,
            None => build(spec, &workspace, &out_dir),
        };
        println!("cargo:rustc-env={}={}", spec.path_var, path.display());
    }
}

/// The module named by `spec.override_var`, if set.
fn prebuilt(spec: &ModuleSpec, workspace: &Path, manifest_dir: &Path) -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed={}", spec.override_var);
    let p = std::env::var_os(spec.override_var).filter(|p| !p.is_empty())?;
    // A relative path is taken from the workspace root (where cargo is usually run), else from
    // host/ (this script's working directory).
    let given = PathBuf::from(p);
    let path = [
        workspace.join(&given),
        manifest_dir.join(&given),
        given.clone(),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or(given);
    println!("cargo:rerun-if-changed={}", path.display());
    match path.canonicalize() {
        Ok(p) => Some(p),
        Err(_) => fail(&format!(
            "{}={} does not exist; point it at a prebuilt module ({} from `cargo xtask build-ptx`), or unset it to build the PTX from gpu/",
            spec.override_var,
            path.display(),
            spec.xtask_path
        )),
    }
}

fn build(spec: &ModuleSpec, workspace: &Path, out_dir: &Path) -> PathBuf {
    let missing_toolchain = |e: &BuildError| -> ! {
        fail(&format!(
            "cannot build the {} PTX module of gpu/.\n{e}\n\
             Or build without a device toolchain from a prebuilt module:\n\
             \x20   {}=/path/to/warpline_gpu.ptx cargo build ...\n\
             (`cargo xtask build-ptx` writes one to {} on a machine that has the toolchain).",
            spec.arch.name(),
            spec.override_var,
            spec.xtask_path
        ))
    };
    // The device cargo's own target directory (the calling cargo holds the lock of its own),
    // under OUT_DIR: a build script writes nowhere else (issue 22, item 4), so a crate that
    // depends on warpline never writes into the warpline checkout. `cargo xtask test` builds the
    // modules once with `cargo xtask build-ptx` and hands them in through WARPLINE_PTX /
    // WARPLINE_SM90A_PTX, so CI does not build them twice.
    let target_dir = out_dir.join(format!("{}-target", spec.target_subdir));
    let toolchain = match DeviceToolchain::discover() {
        Ok(t) => t,
        Err(e) => missing_toolchain(&e),
    };
    let builder = PtxBuilder::new(workspace.join("gpu"))
        .toolchain(toolchain)
        .arch(spec.arch)
        .ptx_isa(spec.isa)
        .features(spec.features.iter().copied())
        .out_dir(out_dir.join(spec.target_subdir))
        .target_dir(target_dir)
        // The resource table is `cargo xtask build-ptx`'s; tests/ptx.rs assembles the module itself.
        .ptxas(false);
    if let Err(e) = builder.emit_rerun_if_changed() {
        fail(&e.to_string());
    }
    match builder.build() {
        Ok(built) => built.path,
        Err(e @ BuildError::ToolchainMissing { .. }) => missing_toolchain(&e),
        Err(e) => fail(&format!(
            "building the {} PTX module of gpu/ failed:\n{e}\n\
             (set {}=/path/to/warpline_gpu.ptx to use a prebuilt module instead)",
            spec.arch.name(),
            spec.override_var
        )),
    }
}
