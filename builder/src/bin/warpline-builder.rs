//! `warpline-builder <kernel crate dir> [options]`: builds a kernel crate to PTX exactly as a
//! build script's `PtxBuilder` does, and prints the ptxas report. See `warpline_builder::cli`.

fn main() -> std::process::ExitCode {
    match warpline_builder::cli::run(std::env::args().skip(1)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}
