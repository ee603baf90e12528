//! `WARPLINE_REQUIRE_GPU=1` turns a GPU test's skip into a failure (issue 12), shown on purpose:
//! this test runs the GPU test below in a child process, once with the variable and once without.
//! On a machine without a GPU (CI) the first child must fail naming the skip reason and the
//! second must pass with `SKIPPED`; on a GPU host both pass (the GPU opens).

use std::process::Command;

use warpline_suite::support::{gpu_or_skip, REQUIRE_GPU_ENV};

const CHILD: &str = "child_gpu_test_opens_the_gpu_or_skips";

/// The GPU test the parent runs as a child (ignored in normal runs).
#[test]
#[ignore = "run by require_gpu_turns_a_skip_into_a_failure as a child process"]
fn child_gpu_test_opens_the_gpu_or_skips() {
    let Some(dev) = gpu_or_skip(CHILD) else {
        return;
    };
    assert!(dev.capabilities().sm_count > 0);
}

fn run_child(require: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        CHILD,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ]);
    match require {
        Some(v) => cmd.env(REQUIRE_GPU_ENV, v),
        None => cmd.env_remove(REQUIRE_GPU_ENV),
    };
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn require_gpu_turns_a_skip_into_a_failure() {
    let (ok_required, required) = run_child(Some("1"));
    let (ok_plain, plain) = run_child(None);
    if warpline::device::driver_present() && warpline::Device::open(0).is_ok() {
        assert!(ok_required, "with a GPU the child must pass:\n{required}");
        assert!(ok_plain, "with a GPU the child must pass:\n{plain}");
        return;
    }
    assert!(
        !ok_required,
        "{REQUIRE_GPU_ENV}=1 without a GPU must fail the child:\n{required}"
    );
    assert!(
        required.contains("requires the GPU") && required.contains("no CUDA"),
        "the failure must name the requirement and the skip reason:\n{required}"
    );
    assert!(
        ok_plain,
        "without {REQUIRE_GPU_ENV} the child skips and passes:\n{plain}"
    );
    assert!(plain.contains(&format!("SKIPPED {CHILD}")), "{plain}");
}
