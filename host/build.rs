//! Embeds the PTX module that `cargo xtask build-ptx` writes. A missing module is a build error that
//! names that command.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=WARPLINE_PTX");
    let path = match std::env::var_os("WARPLINE_PTX") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap())
            .join("../target/ptx/warpline_gpu.ptx"),
    };
    println!("cargo:rerun-if-changed={}", path.display());
    if !path.exists() {
        panic!(
            "\n\nwarpline: the PTX module {} does not exist.\n\
             Build it first with `cargo xtask build-ptx` (after `cargo xtask setup` on a new machine),\n\
             or point WARPLINE_PTX at a prebuilt warpline_gpu.ptx.\n",
            path.display()
        );
    }
    let path = path.canonicalize().unwrap();
    println!("cargo:rustc-env=WARPLINE_PTX_PATH={}", path.display());
}
