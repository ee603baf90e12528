//! Builds the kernel crate `../kernel` to PTX (sm_90) with warpline's builder and hands its path
//! to main.rs as `KERNEL_PTX`.
fn main() {
    let built = warpline_builder::PtxBuilder::new("../kernel")
        .arch(warpline_builder::Arch::Sm90)
        .build()
        .unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(1)
        });
    warpline_builder::emit_rerun_if_changed("../kernel");
    println!("cargo:rustc-env=KERNEL_PTX={}", built.path.display());
}
