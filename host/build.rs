//! Builds the PTX module of `../gpu` (warpline's kernels) with warpline-builder into `$OUT_DIR` and
//! points `WARPLINE_PTX_PATH` at it (embedded by `include_str!` in `src/lib.rs`). Editing `gpu/` or
//! `device/` and running `cargo build`/`cargo run` rebuilds the PTX: the rerun-if-changed list
//! covers both crates' `src/` and manifests.
//!
//! `WARPLINE_PTX=/path/to/module.ptx` uses a prebuilt module as is (no device toolchain needed).
//! Without it and without a device toolchain the build stops with a message naming
//! `cargo xtask setup` and `WARPLINE_PTX`.

use std::path::{Path, PathBuf};
use std::process::exit;

use warpline_builder::{
    Arch, BuildError, DeviceToolchain, PtxBuilder, PtxIsa, ENV_DEVICE_CARGO, ENV_DEVICE_RUSTC,
};

fn fail(msg: &str) -> ! {
    eprintln!("\nwarpline (host/build.rs): {msg}\n");
    exit(1)
}

fn missing_toolchain(e: &BuildError) -> ! {
    fail(&format!(
        "cannot build the PTX module of gpu/.\n{e}\n\
         Or build without a device toolchain from a prebuilt module:\n\
         \x20   WARPLINE_PTX=/path/to/warpline_gpu.ptx cargo build ...\n\
         (`cargo xtask build-ptx` writes one to target/ptx/warpline_gpu.ptx on a machine that has the toolchain)."
    ))
}

fn main() {
    // Before any early exit: a later toolchain install or override must rerun this script.
    for v in [ENV_DEVICE_RUSTC, ENV_DEVICE_CARGO] {
        println!("cargo:rerun-if-env-changed={v}");
    }
    println!("cargo:rerun-if-env-changed=WARPLINE_PTX");
    if let Some(p) = std::env::var_os("WARPLINE_PTX").filter(|p| !p.is_empty()) {
        // A relative path is taken from the workspace root (where cargo is usually run), else
        // from host/ (this script's working directory).
        let given = PathBuf::from(p);
        let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
        let path = [manifest_dir.join("..").join(&given), given.clone()]
            .into_iter()
            .find(|p| p.exists())
            .unwrap_or(given);
        println!("cargo:rerun-if-changed={}", path.display());
        let Ok(path) = path.canonicalize() else {
            fail(&format!(
                "WARPLINE_PTX={} does not exist; point it at a prebuilt warpline_gpu.ptx, or unset it to build the PTX from gpu/",
                path.display()
            ));
        };
        println!("cargo:rustc-env=WARPLINE_PTX_PATH={}", path.display());
        return;
    }

    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest_dir.parent().unwrap_or(Path::new(".."));
    // The device cargo's own target directory (the calling cargo holds the lock of its own), the
    // same one `cargo xtask build-ptx` uses, so core and the kernels are compiled once for both.
    let target_dir = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => PathBuf::from(d).join("nvptx"),
        None => workspace.join("target/nvptx"),
    };
    let toolchain = match DeviceToolchain::discover() {
        Ok(t) => t,
        Err(e) => missing_toolchain(&e),
    };
    let builder = PtxBuilder::new(workspace.join("gpu"))
        .toolchain(toolchain)
        .arch(Arch::Sm90)
        .ptx_isa(PtxIsa::V8_0)
        .target_dir(target_dir)
        // The resource table is `cargo xtask build-ptx`'s; tests/ptx.rs assembles the module itself.
        .ptxas(false);
    if let Err(e) = builder.emit_rerun_if_changed() {
        fail(&e.to_string());
    }
    match builder.build() {
        Ok(built) => println!("cargo:rustc-env=WARPLINE_PTX_PATH={}", built.path.display()),
        Err(e @ BuildError::ToolchainMissing { .. }) => missing_toolchain(&e),
        Err(e) => fail(&format!(
            "building the PTX module of gpu/ failed:\n{e}\n\
             (set WARPLINE_PTX=/path/to/warpline_gpu.ptx to use a prebuilt module instead)"
        )),
    }
}
