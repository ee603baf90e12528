//! Builds the kernel crate `../kernel` to PTX (sm_90) with warpline's builder and hands its path
//! to main.rs as `KERNEL_PTX`.
fn main() {
    let fail = |e: warpline_builder::BuildError| -> ! {
        eprintln!("{e}");
        std::process::exit(1)
    };
    let builder = warpline_builder::PtxBuilder::new("../kernel").arch(warpline_builder::Arch::Sm90);
    // Rebuild when the kernel crate (or the device library it depends on) changes.
    builder.emit_rerun_if_changed().unwrap_or_else(|e| fail(e));
    let built = builder.build().unwrap_or_else(|e| fail(e));
    println!("cargo:rustc-env=KERNEL_PTX={}", built.path.display());
}
