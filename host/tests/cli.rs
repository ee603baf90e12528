//! The `warpline` binary: on a machine without a GPU it says so and exits 2 without panicking; with
//! a GPU, a small verified pipeline run succeeds and prints its table.

use std::process::Command;

/// The CLI under test: `$WARPLINE_BIN` (set by the gpu-bundle's run.sh, where the build tree is
/// absent), else the binary cargo built.
fn warpline() -> Command {
    Command::new(
        std::env::var("WARPLINE_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_warpline").to_string()),
    )
}

#[test]
fn pipeline_command_reports_no_gpu_or_runs_verified() {
    let out = warpline()
        .args([
            "pipeline",
            "--streams",
            "2",
            "--batches",
            "3",
            "--batch-elems",
            "100001",
            "--verify",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if warpline::device::driver_present() {
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.contains("verified: 300003 elements"), "{stdout}");
        assert!(stdout.contains("GB/s"), "{stdout}");
    } else {
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("no GPU"), "{stderr}");
    }
}

#[test]
fn bad_arguments_are_rejected_with_a_message() {
    let out = warpline()
        .args(["pipeline", "--a", "x.npy"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--b"));
}
