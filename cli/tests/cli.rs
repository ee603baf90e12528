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
    ran_or_no_gpu(&out, &["verified: 300003 elements", "GB/s"]);
}

/// A run that must succeed and print each of `stdout_has` on a machine with a CUDA driver, and
/// say "no GPU" with exit status 2 on one without; never a panic.
fn ran_or_no_gpu(out: &std::process::Output, stdout_has: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if warpline::device::driver_present() {
        assert!(out.status.success(), "{stdout}\n{stderr}");
        for want in stdout_has {
            assert!(stdout.contains(want), "{stdout}");
        }
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

// ------------------------------------------------------------------------------------------------
// Finding 17 (issue 9): flags are checked before the device is opened (exit 2, a message naming
// the flag and what is allowed), sizes against memory before allocating, .npy errors say what is
// wrong. These run the same with and without a GPU.
// ------------------------------------------------------------------------------------------------

fn run(args: &[&str]) -> (Option<i32>, String) {
    let out = warpline().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    (out.status.code(), stderr)
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("warpline-cli-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn finding_17_pipeline_batch_elems_zero_with_input_files_is_bad_usage_not_a_division_by_zero() {
    let d = temp_dir("be0");
    let (a, b) = (d.join("a.npy"), d.join("b.npy"));
    let data: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    warpline::npy::write_f32(&a, &[1000], &data).unwrap();
    warpline::npy::write_f32(&b, &[1000], &data).unwrap();
    let (code, stderr) = run(&[
        "pipeline",
        "--a",
        a.to_str().unwrap(),
        "--b",
        b.to_str().unwrap(),
        "--batch-elems",
        "0",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("bad usage"), "{stderr}");
    assert!(stderr.contains("--batch-elems 0"), "{stderr}");
    assert!(stderr.contains("at least 1"), "{stderr}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn finding_17_gemm_huge_tiles_is_refused_naming_bytes_needed_and_available() {
    // 10^9 tiles: A, B, C read-back, kept C (4 x 4 bytes) + f64 reference (8 bytes) per float.
    let (code, stderr) = run(&["gemm", "--tiles", "1000000000"]);
    let needed = 1_000_000_000u64 * 16384 * 24;
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--tiles 1000000000"), "{stderr}");
    assert!(stderr.contains(&format!("{needed} bytes")), "{stderr}");
    assert!(stderr.contains("host memory"), "{stderr}");
    assert!(stderr.contains("available"), "{stderr}");
    // Beyond what the kernel's u32 tile count allows: refused by range, not by memory.
    let (code, stderr) = run(&["gemm", "--tiles", "99999999999"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("between 1 and"), "{stderr}");
}

#[test]
fn finding_17_bad_flags_are_reported_before_the_device_is_opened() {
    for (args, flag) in [
        (&["pipeline", "--streams", "0"][..], "--streams 0"),
        (&["pipeline", "--streams", "33"][..], "--streams 33"),
        (&["pipeline", "--batches", "0"][..], "--batches 0"),
        (&["pipeline", "--batch-elems", "0"][..], "--batch-elems 0"),
        (
            &[
                "pipeline",
                "--batches",
                "4294967296",
                "--batch-elems",
                "4294967296",
            ][..],
            "overflows",
        ),
        (&["gemm", "--cluster", "3"][..], "--cluster 3"),
        (&["gemm", "--tiles", "0"][..], "--tiles 0"),
        (&["gemm", "--streams", "0"][..], "--streams 0"),
        (&["gemm", "--reps", "0"][..], "--reps 0"),
    ] {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("bad usage"), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(!stderr.contains("no GPU"), "{args:?}: {stderr}");
    }
}

#[test]
fn finding_17_truncated_npy_input_is_reported_as_truncated_before_the_device() {
    let d = temp_dir("trunc");
    let a = d.join("a.npy");
    let data: Vec<f32> = (0..1000).map(|i| i as f32).collect();
    warpline::npy::write_f32(&a, &[1000], &data).unwrap();
    let len = std::fs::metadata(&a).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&a)
        .unwrap()
        .set_len(len - 400)
        .unwrap();
    let (code, stderr) = run(&[
        "pipeline",
        "--a",
        a.to_str().unwrap(),
        "--b",
        a.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("truncated"), "{stderr}");
    assert!(stderr.contains("4000 bytes"), "{stderr}");
    assert!(stderr.contains("3600 bytes"), "{stderr}");
    assert!(!stderr.contains("dtype"), "{stderr}");
    std::fs::remove_dir_all(&d).unwrap();
}

// ------------------------------------------------------------------------------------------------
// `warpline stress` (issue 9, "Stress run"): no GPU is exit 2 with the no-GPU message; bad flags
// are usage errors before the device is opened; with a GPU a small run passes.
// ------------------------------------------------------------------------------------------------

#[test]
fn stress_reports_no_gpu_or_passes_a_small_run() {
    let args: &[&str] = if warpline::device::driver_present() {
        &[
            "stress",
            "--fence-tickets",
            "64",
            "--fence-threads",
            "4",
            "--batches",
            "40",
            "--graphs",
            "8",
            "--bound-ms",
            "10000",
            "--seed",
            "7",
            "--json",
        ]
    } else {
        &["stress"]
    };
    let out = warpline().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stderr.contains("panicked"), "{stderr}");
    if warpline::device::driver_present() {
        assert!(out.status.success(), "{stdout}\n{stderr}");
        assert!(stdout.trim_start().starts_with('{'), "{stdout}");
        assert!(stdout.contains("\"seed\":7"), "{stdout}");
        // serde_json orders keys, so `passed` is not the last field of the report.
        assert!(stdout.contains("\"passed\":true"), "{stdout}");
        assert!(!stdout.contains("\"passed\":false"), "{stdout}");
        assert!(stderr.contains("--seed 7"), "{stderr}");
    } else {
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("no GPU"), "{stderr}");
        assert!(stderr.contains("warpline stress: seed"), "{stderr}");
    }
}

#[test]
fn stress_bad_flags_are_reported_before_the_device_is_opened() {
    for (args, flag) in [
        (&["stress", "--fence-threads", "0"][..], "--fence-threads 0"),
        (
            &["stress", "--fence-threads", "65"][..],
            "--fence-threads 65",
        ),
        (&["stress", "--batch-elems", "0"][..], "--batch-elems 0"),
        (
            &["stress", "--pipeline-streams", "0"][..],
            "--pipeline-streams 0",
        ),
        (&["stress", "--bound-ms", "0"][..], "--bound-ms 0"),
        (
            &["stress", "--bound-ms", "3600001"][..],
            "--bound-ms 3600001",
        ),
        (&["stress", "--graphs", "1000001"][..], "--graphs 1000001"),
    ] {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("bad usage"), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(stderr.contains("between"), "{args:?}: {stderr}");
        assert!(!stderr.contains("no GPU"), "{args:?}: {stderr}");
    }
    // Not a number: clap's own usage error (exit 2).
    let (code, stderr) = run(&["stress", "--seed", "x"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("--seed"), "{stderr}");
}

// ------------------------------------------------------------------------------------------------
// Issue 12: `--json` output parses for every subcommand. Without a GPU the run's outcome is the
// "no GPU" failure object (exit 2); flag errors are usage objects (exit 2), clap's own included.
// With a GPU the small runs succeed and report their figures.
// ------------------------------------------------------------------------------------------------

fn json_of(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    let out = warpline().args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    let v: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{args:?}: stdout is not one JSON object ({e}):\n{stdout}"));
    assert!(
        stderr.contains("seed "),
        "{args:?}: the seed must be printed: {stderr}"
    );
    (out.status.code(), v)
}

#[test]
fn json_output_parses_for_every_subcommand() {
    let gpu = warpline::device::driver_present() && warpline::Device::open(0).is_ok();
    let runs: [&[&str]; 5] = [
        &["info", "--json"],
        &[
            "pipeline",
            "--json",
            "--streams",
            "2",
            "--batches",
            "3",
            "--batch-elems",
            "4096",
            "--verify",
        ],
        &[
            "gemm",
            "--json",
            "--tiles",
            "8",
            "--cluster",
            "2",
            "--reps",
            "2",
        ],
        &[
            "stress",
            "--json",
            "--batches",
            "8",
            "--batch-elems",
            "4096",
            "--fence-tickets",
            "8",
            "--graphs",
            "4",
        ],
        &["ordering-demo", "--json", "--runs", "1"],
    ];
    for args in runs {
        let (code, v) = json_of(args);
        assert_eq!(v["command"], args[0], "{v}");
        assert!(v["versions"]["warpline"].is_string(), "{v}");
        assert!(v["seed"].is_u64(), "{v}");
        if gpu {
            assert_eq!(code, Some(0), "{v}");
            assert_eq!(v["ok"], true, "{v}");
            assert!(v["results"]["device"]["name"].is_string(), "{v}");
        } else {
            assert_eq!(code, Some(2), "{v}");
            assert_eq!(v["ok"], false, "{v}");
            assert_eq!(v["error"]["kind"], "no_gpu", "{v}");
            assert_eq!(v["exit_code"], 2, "{v}");
        }
    }
}

#[test]
fn json_usage_errors_parse_too() {
    let (code, v) = json_of(&["pipeline", "--json", "--streams", "0"]);
    assert_eq!(code, Some(2));
    assert_eq!(v["error"]["kind"], "usage", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--streams 0"),
        "{v}"
    );
    // clap's own errors (an unknown flag) are JSON with --json as well; no seed yet.
    let out = warpline()
        .args(["gemm", "--json", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["error"]["kind"], "usage");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--no-such-flag"),
        "{v}"
    );
    // A bad WARPLINE_DEVICE is a usage error, not GPU 0.
    let out = warpline()
        .args(["info", "--json"])
        .env("WARPLINE_DEVICE", "first")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("WARPLINE_DEVICE"),
        "{v}"
    );
    // --trace where nothing is traced.
    let (code, v) = json_of(&["info", "--json", "--trace", "/tmp/never.json"]);
    assert_eq!(code, Some(2));
    assert_eq!(v["error"]["kind"], "usage", "{v}");
}

#[test]
fn the_seed_given_is_the_seed_reported() {
    let (_, v) = json_of(&[
        "--seed",
        "42",
        "pipeline",
        "--json",
        "--batches",
        "1",
        "--batch-elems",
        "1024",
    ]);
    assert_eq!(v["seed"], 42, "{v}");
    assert_eq!(v["command"], "pipeline", "{v}");
}

// ------------------------------------------------------------------------------------------------
// gemm --dtype bf16|fp16 (issue 11): the tensor-core GEMM's flags are checked before the device;
// without a GPU it says so and exits 2; with one, a small verified run prints the cuBLAS ratio.
// ------------------------------------------------------------------------------------------------

#[test]
fn tc_gemm_reports_no_gpu_or_runs_verified() {
    for dtype in ["bf16", "fp16"] {
        let out = warpline()
            .args([
                "gemm",
                "--dtype",
                dtype,
                "--m",
                "257",
                "--n",
                "300",
                "--k",
                "129",
                "--cluster",
                "1",
                "--b-layout",
                "row",
                "--raster",
                "n",
                "--reps",
                "2",
                "--verify",
            ])
            .output()
            .unwrap();
        ran_or_no_gpu(&out, &["verified tc_gemm", "x cuBLAS"]);
    }
}

/// Issue 20: `--config auto` at a decode shape picks the decode kernel and says so; the run is
/// verified against the f64 reference.
#[test]
fn issue20_gemm_config_auto_picks_decode_and_prints_it() {
    for config in ["auto", "decode"] {
        let out = warpline()
            .args([
                "gemm", "--dtype", "bf16", "--m", "7", "--n", "1003", "--k", "2056", "--config",
                config, "--reps", "2", "--verify",
            ])
            .output()
            .unwrap();
        ran_or_no_gpu(&out, &["config decode", "verified tc_gemm", "x cuBLAS"]);
    }
}

/// Issue 20: `--dtype fp8` quantizes per tensor, runs the FP8 entry next to cuBLASLt FP8 and
/// verifies against the f64 reference on the decoded values.
#[test]
fn issue20_fp8_gemm_reports_no_gpu_or_runs_verified() {
    let out = warpline()
        .args([
            // Multiples of 16 (cuBLASLt FP8's rule for its pitches) but of no tile.
            "gemm", "--dtype", "fp8", "--m", "272", "--n", "304", "--k", "144", "--reps", "2",
            "--verify",
        ])
        .output()
        .unwrap();
    ran_or_no_gpu(
        &out,
        &["verified tc_gemm fp8", "x cuBLASLt", "tc_gemm_e4m3_bcol"],
    );
}

/// Issue 20: what FP8 cannot do is refused before the device is opened.
#[test]
fn issue20_fp8_gemm_bad_arguments_are_refused_before_the_device() {
    for (args, says) in [
        (&["--b-layout", "row"][..], "K-major"),
        (&["--config", "decode"][..], "--config"),
    ] {
        let mut all = vec![
            "gemm", "--dtype", "fp8", "--m", "8", "--n", "8", "--k", "32",
        ];
        all.extend_from_slice(args);
        let (code, stderr) = run(&all);
        assert_eq!(code, Some(2), "{all:?}: {stderr}");
        assert!(
            stderr.contains("bad usage") && stderr.contains(says),
            "{all:?}: {stderr}"
        );
        assert!(!stderr.contains("no GPU"), "{all:?}: {stderr}");
    }
}

#[test]
fn tc_gemm_bad_arguments_are_refused_before_the_device() {
    for (args, flag) in [
        (
            &["gemm", "--dtype", "bf16", "--m", "8", "--n", "8"][..],
            "--k",
        ),
        (
            &[
                "gemm", "--dtype", "bf16", "--m", "0", "--n", "8", "--k", "8",
            ][..],
            "--m 0",
        ),
        (
            &[
                "gemm",
                "--dtype",
                "fp16",
                "--m",
                "8",
                "--n",
                "8",
                "--k",
                "8",
                "--cluster",
                "4",
            ][..],
            "--cluster 4",
        ),
        (
            &[
                "gemm", "--dtype", "bf16", "--m", "8", "--n", "8", "--k", "8", "--reps", "0",
            ][..],
            "--reps 0",
        ),
        (
            &[
                "gemm", "--dtype", "bf16", "--m", "8", "--n", "8", "--k", "8", "--config",
                "fastest",
            ][..],
            "--config",
        ),
    ] {
        let (code, stderr) = run(args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("bad usage"), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(!stderr.contains("no GPU"), "{args:?}: {stderr}");
    }
    // An unknown dtype is clap's own usage error (exit 2).
    let (code, stderr) = run(&["gemm", "--dtype", "int8"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("int8"), "{stderr}");
}

#[test]
fn tc_gemm_npy_shapes_are_checked_before_the_device() {
    let d = temp_dir("tcshape");
    let (a, b) = (d.join("a.npy"), d.join("b.npy"));
    warpline::npy::write_f32(&a, &[4, 8], &[0.5; 32]).unwrap();
    // Column-major B is (N, K): K = 6 disagrees with A's 8.
    warpline::npy::write_f32(&b, &[3, 6], &[0.5; 18]).unwrap();
    let (code, stderr) = run(&[
        "gemm",
        "--dtype",
        "bf16",
        "--a",
        a.to_str().unwrap(),
        "--b",
        b.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("K = 6"), "{stderr}");
    // A 1-D input is refused with the shapes that are allowed.
    warpline::npy::write_f32(&b, &[18], &[0.5; 18]).unwrap();
    let (code, stderr) = run(&[
        "gemm",
        "--dtype",
        "fp16",
        "--a",
        a.to_str().unwrap(),
        "--b",
        b.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("2-D arrays are needed"), "{stderr}");
}

// ------------------------------------------------------------------------------------------------
// Issue 19 item 15: hostile flags are refused before any device is opened (so these run the same
// with and without a GPU), sizes against host memory before anything is read.
// ------------------------------------------------------------------------------------------------

#[test]
fn issue19_item15_ordering_demo_spin_that_overflows_is_refused_before_the_device() {
    for spin in ["18446744073709552", "1000001"] {
        let (code, stderr) = run(&["ordering-demo", "--spin-us", spin]);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains("--spin-us"), "{stderr}");
        assert!(!stderr.contains("no GPU"), "{stderr}");
    }
}

#[test]
fn issue19_item15_mgpu_flags_are_checked_before_the_gpus_are_opened() {
    let cases: &[(&[&str], &str)] = &[
        (&["mgpu", "allreduce", "--iters", "0"], "--iters"),
        (&["mgpu", "allreduce", "--procs", "1"], "--procs"),
        (&["mgpu", "peer-bw", "--iters", "0"], "--iters"),
        (&["mgpu", "peer-bw", "--bytes", "0"], "--bytes"),
        (&["mgpu", "pipeline", "--slots", "1"], "slots"),
        (&["mgpu", "pipeline", "--layers", "0"], "layers"),
        (
            &["mgpu", "pipeline", "--microbatches", "0"],
            "--microbatches",
        ),
        (&["mgpu", "dp-step", "--buckets", "0"], "buckets"),
        (&["mgpu", "dp-step", "--tiles", "0"], "tiles"),
        (&["mgpu", "seeds", "--runs", "0"], "--runs"),
        (&["mgpu", "seeds", "--bound-ms", "0"], "--bound-ms"),
        (
            &["mgpu", "nccl-rank", "--rank", "2", "--world", "2"],
            "--rank",
        ),
        (
            &[
                "mgpu",
                "nccl-rank",
                "--rank",
                "0",
                "--world",
                "1",
                "--iters",
                "0",
            ],
            "--iters",
        ),
    ];
    for (args, flag) in cases {
        let (code, stderr) = run(args);
        assert!(matches!(code, Some(1) | Some(2)), "{args:?}: {stderr}");
        assert!(stderr.contains(flag), "{args:?}: {stderr}");
        assert!(
            !stderr.contains("no GPU"),
            "{args:?} must fail on its flag first: {stderr}"
        );
    }
}

#[test]
fn issue19_item15_allreduce_procs_above_the_gpu_count_fails_fast() {
    let t = std::time::Instant::now();
    let (code, stderr) = run(&["mgpu", "allreduce", "--procs", "64"]);
    // No GPU or NCCL here: "no GPU"; with GPUs: fewer than 64, refused before any rank starts
    // (it waited out the 120 s NCCL init timeout).
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("no GPU"), "{stderr}");
    if warpline::device::driver_present() && stderr.contains("--procs") {
        assert!(stderr.contains("needs 64 GPUs"), "{stderr}");
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(60), "{stderr}");
}

/// A sparse float32 .npy file of `shape` (its data holes of zeros): a valid file of any size
/// that costs no disk. `None` where the file system cannot hold it.
fn sparse_npy(path: &std::path::Path, shape: &[u64]) -> Option<()> {
    use std::io::Write;
    let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
    let mut dict = format!(
        "{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}",
        dims.join(", ")
    );
    while !(10 + dict.len() + 1).is_multiple_of(64) {
        dict.push(' ');
    }
    dict.push('\n');
    let mut f = std::fs::File::create(path).ok()?;
    f.write_all(b"\x93NUMPY\x01\x00").ok()?;
    f.write_all(&(dict.len() as u16).to_le_bytes()).ok()?;
    f.write_all(dict.as_bytes()).ok()?;
    let data: u64 = shape.iter().product::<u64>() * 4;
    f.set_len(10 + dict.len() as u64 + data).ok()
}

#[test]
fn issue19_item15_npy_inputs_are_checked_against_host_memory_before_they_are_read() {
    let d = temp_dir("i19-15");
    // 2^38 floats each (1 TiB of data per file, sparse): reading them would exhaust memory.
    let (a, b) = (d.join("a.npy"), d.join("b.npy"));
    let (a2, b2) = (d.join("a2.npy"), d.join("b2.npy"));
    if sparse_npy(&a, &[1 << 38]).is_none()
        || sparse_npy(&b, &[1 << 38]).is_none()
        || sparse_npy(&a2, &[1 << 19, 1 << 19]).is_none()
        || sparse_npy(&b2, &[1 << 19, 1 << 19]).is_none()
    {
        eprintln!("skipped: this file system cannot hold 1 TiB sparse files");
        std::fs::remove_dir_all(&d).unwrap();
        return;
    }
    let (a, b, a2, b2) = (
        a.to_str().unwrap(),
        b.to_str().unwrap(),
        a2.to_str().unwrap(),
        b2.to_str().unwrap(),
    );
    for args in [
        vec!["pipeline", "--a", a, "--b", b],
        vec!["gemm", "--a", a, "--b", b],
        vec!["gemm", "--dtype", "bf16", "--a", a2, "--b", b2],
    ] {
        let t = std::time::Instant::now();
        let (code, stderr) = run(&args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("of host memory"), "{args:?}: {stderr}");
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "{args:?}: read the data first"
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn issue19_item12_evil_npy_headers_through_the_cli_are_errors_not_panics() {
    let d = temp_dir("i19-12");
    let evil = d.join("evil.npy");
    // A duplicated 'shape': the first is harmless, the second overflows the element count.
    let mut dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'shape': (4294967296, 4294967296, 16), }".to_string();
    while !(10 + dict.len() + 1).is_multiple_of(64) {
        dict.push(' ');
    }
    dict.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend((dict.len() as u16).to_le_bytes());
    bytes.extend(dict.as_bytes());
    bytes.extend([0u8; 8]);
    std::fs::write(&evil, bytes).unwrap();
    let e = evil.to_str().unwrap();
    for args in [
        vec!["gemm", "--a", e, "--b", e],
        vec!["gemm", "--dtype", "bf16", "--a", e, "--b", e],
        vec!["pipeline", "--a", e, "--b", e],
    ] {
        let (code, stderr) = run(&args);
        assert_eq!(code, Some(1), "{args:?}: {stderr}");
        assert!(
            stderr.contains("'shape' appears twice"),
            "{args:?}: {stderr}"
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// `warpline fuzz` (issue 19): bad flags are usage errors before the device is opened; without a
/// GPU it says so (exit 2); with one, a small run passes and prints its summary line.
#[test]
fn issue19_fuzz_reports_no_gpu_or_passes_a_small_run() {
    for (args, flag) in [
        (&["fuzz", "--threads", "0"][..], "--threads 0"),
        (&["fuzz", "--seeds", "0"][..], "--seeds 0"),
        (&["fuzz", "--ops", "0"][..], "--ops 0"),
    ] {
        let out = warpline().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains(flag), "{stderr}");
    }
    let out = warpline()
        .args(["fuzz", "--seeds", "3", "--ops", "60", "--start-seed", "19"])
        .output()
        .unwrap();
    ran_or_no_gpu(
        &out,
        &["warpline fuzz: 3 seeds (19..21) x 60 ops", "failures: 0"],
    );
}

/// Issue 23: `warpline attention` runs verified (fixed and varlen, causal, GQA) or says "no GPU";
/// bad shapes are usage errors (exit 2) before the device opens.
#[test]
fn issue23_attention_reports_no_gpu_or_runs_verified() {
    for extra in [&["--causal"][..], &["--varlen", "--kv-heads", "2"][..]] {
        let mut args = vec![
            "attention",
            "--batch",
            "2",
            "--heads",
            "4",
            "--seqlen",
            "300",
            "--seqlen-k",
            "333",
            "--head-dim",
            "128",
            "--reps",
            "2",
            "--verify",
        ];
        args.extend_from_slice(extra);
        let out = warpline().args(&args).output().unwrap();
        ran_or_no_gpu(&out, &["TFLOP/s", "ok; max|LSE"]);
    }
    for (args, says) in [
        (&["--head-dim", "96"][..], "head_dim"),
        (&["--head-dim", "64", "--kv-heads", "3"][..], "kv_heads"),
    ] {
        let mut all = vec![
            "attention",
            "--batch",
            "1",
            "--heads",
            "4",
            "--seqlen",
            "64",
        ];
        all.extend_from_slice(args);
        let (code, stderr) = run(&all);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
    }
}

/// Issue 21: `warpline decode` runs (small dims, every variant, verified, timeline) or says "no
/// GPU"; bad flags are usage errors (exit 2) before the device opens, absurd sizes included.
#[test]
fn issue21_decode_reports_no_gpu_or_runs_verified() {
    let png = std::env::temp_dir().join(format!("warpline-decode-{}.png", std::process::id()));
    let out = warpline()
        .args([
            "decode",
            "--batch",
            "5",
            "--kv-len",
            "41",
            "--layers",
            "2",
            "--small",
            "--reps",
            "2",
            "--verify",
            "--gemm-gu",
            "w8_u2_r2_pa_ks2",
            "--timeline",
        ])
        .arg(&png)
        .output()
        .unwrap();
    ran_or_no_gpu(
        &out,
        &[
            "gate_up w8_ks2_u2_pf_r2_pa",
            "e graph+pdl+prefetch",
            "verified: one step",
            "wrote timeline",
        ],
    );
    let _ = std::fs::remove_file(&png);
    for (args, says) in [
        (&["--batch", "0", "--kv-len", "10"][..], "--batch 0"),
        (&["--batch", "65", "--kv-len", "10"][..], "--batch 65"),
        (&["--batch", "1", "--kv-len", "0"][..], "--kv-len 0"),
        (
            &["--batch", "1", "--kv-len", "18446744073709551615"][..],
            "--kv-len",
        ),
        (
            &["--batch", "1", "--kv-len", "8", "--layers", "0"][..],
            "--layers 0",
        ),
        (
            &["--batch", "1", "--kv-len", "8", "--variant", "abz"][..],
            "--variant",
        ),
        (
            &["--batch", "1", "--kv-len", "8", "--page", "0"][..],
            "page",
        ),
        (
            &["--batch", "1", "--kv-len", "8", "--page", "4096"][..],
            "page",
        ),
        (
            &["--batch", "1", "--kv-len", "8", "--reps", "0"][..],
            "--reps 0",
        ),
        (
            &["--batch", "24", "--kv-len", "8", "--gemm-qkv", "w4_bogus"][..],
            "--gemm-qkv \"w4_bogus\"",
        ),
        (
            &["--batch", "24", "--kv-len", "8", "--gemm", "u2_zz"][..],
            "allowed: wN, ksN",
        ),
        (
            &[
                "--batch", "64", "--kv-len", "1048576", "--layers", "256", "--verify",
            ][..],
            "host memory",
        ),
    ] {
        let mut all = vec!["decode"];
        all.extend_from_slice(args);
        let (code, stderr) = run(&all);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}
