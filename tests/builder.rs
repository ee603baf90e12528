//! Stale-PTX guards that CI sees:
//! - the builder rebuilds a kernel crate's PTX when its source changes (on a copy of the fixture
//!   kernel crate `builder/tests/fixtures/tiny-kernel`; SKIPPED where there is no device toolchain);
//! - host/build.rs's rerun-if-changed list covers gpu/ and device/ (edits there rebuild the PTX);
//! - the embedded PTX carries the contract hash of the host's `gpu/src/contract.rs`, and
//!   `check_contract` refuses a module whose hash differs or is absent.

use std::fs;
use std::path::{Path, PathBuf};

use warpline_builder::{DeviceToolchain, PtxBuilder};

// The host's check, compiled into this test crate (the host crate keeps it crate-private).
mod error {
    pub(crate) use warpline::error::Error;
}
// Its kernel table (`KERNEL_SPECS`) is the host's, unused here.
#[path = "../host/src/contract_check.rs"]
#[allow(dead_code)]
mod contract_check;

use contract_check::{check_contract, ptx_contract_hash};
use error::Error;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &dst);
        } else {
            fs::copy(e.path(), dst).unwrap();
        }
    }
}

#[test]
fn editing_a_kernel_rebuilds_its_ptx() {
    if let Err(e) = DeviceToolchain::discover() {
        println!("SKIPPED editing_a_kernel_rebuilds_its_ptx: no device toolchain ({e})");
        return;
    }
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let krate = tmp.join(format!("tiny-kernel-{}", std::process::id()));
    let _ = fs::remove_dir_all(&krate);
    copy_dir(
        &workspace().join("builder/tests/fixtures/tiny-kernel"),
        &krate,
    );
    // A persistent device target dir: core is compiled once across runs.
    let b = PtxBuilder::new(&krate)
        .out_dir(krate.join("out"))
        .target_dir(tmp.join("tiny-kernel-nvptx"));

    let first = b.build().expect("first build");
    assert_eq!(
        first.path,
        krate.join("out/tiny_kernel.ptx").canonicalize().unwrap()
    );
    assert_eq!(first.entries, ["fill"]);
    let ptx1 = fs::read_to_string(&first.path).unwrap();
    assert!(ptx1.contains("12345"), "FILL_VALUE not in the PTX:\n{ptx1}");
    let mtime1 = fs::metadata(&first.path).unwrap().modified().unwrap();

    // Nothing changed: same module, file not rewritten.
    let again = b.build().expect("unchanged rebuild");
    assert_eq!(fs::read_to_string(&again.path).unwrap(), ptx1);
    assert_eq!(
        fs::metadata(&again.path).unwrap().modified().unwrap(),
        mtime1
    );

    // Edit the kernel's constant: the PTX must follow.
    let src = krate.join("src/lib.rs");
    let text = fs::read_to_string(&src).unwrap();
    assert!(text.contains("FILL_VALUE: u32 = 12345"));
    fs::write(
        &src,
        text.replace("FILL_VALUE: u32 = 12345", "FILL_VALUE: u32 = 54321"),
    )
    .unwrap();
    let second = b.build().expect("rebuild after edit");
    let ptx2 = fs::read_to_string(&second.path).unwrap();
    assert_ne!(
        ptx1, ptx2,
        "the PTX did not change after editing the kernel"
    );
    assert!(ptx2.contains("54321") && !ptx2.contains("12345"), "{ptx2}");
    if let Some(r) = &second.resources {
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].name, "fill");
    }
    fs::remove_dir_all(&krate).unwrap();
}

#[test]
fn host_build_reruns_on_gpu_and_device_sources() {
    let root = workspace().canonicalize().unwrap();
    let paths = PtxBuilder::new(root.join("gpu"))
        .rerun_if_changed_paths()
        .unwrap();
    for want in [
        "gpu/Cargo.toml",
        "gpu/build.rs",
        "gpu/src",
        "gpu/src/lib.rs",
        "gpu/src/contract.rs",
        "device/Cargo.toml",
        "device/src",
        "device/src/lib.rs",
    ] {
        assert!(paths.contains(&root.join(want)), "{want} not in {paths:?}");
    }
    assert!(paths.iter().all(|p| p.exists()), "{paths:?}");
}

#[test]
fn embedded_ptx_carries_the_hosts_contract_hash() {
    assert_eq!(
        ptx_contract_hash(warpline::PTX),
        Some(warpline_gpu::CONTRACT_HASH),
        "the embedded PTX was built from another gpu/src/contract.rs"
    );
    check_contract(warpline::PTX, warpline_gpu::CONTRACT_HASH).unwrap();
}

#[test]
fn check_contract_refuses_a_ptx_with_another_contract_hash() {
    let host = warpline_gpu::CONTRACT_HASH;
    let line = warpline::PTX
        .lines()
        .find(|l| l.contains("warpline_contract_hash"))
        .expect("no warpline_contract_hash in the PTX");
    let other = host ^ 1;
    let bytes: Vec<String> = other.to_le_bytes().iter().map(|b| b.to_string()).collect();
    let forged_line = format!(
        ".visible .global .align 8 .b8 warpline_contract_hash[8] = {{{}}};",
        bytes.join(", ")
    );
    let stale = warpline::PTX.replace(line, &forged_line);
    match check_contract(&stale, host) {
        Err(Error::ContractMismatch {
            ptx_hash,
            host_hash,
        }) => assert_eq!((ptx_hash, host_hash), (Some(other), host)),
        r => panic!("a stale PTX was accepted: {r:?}"),
    }
    let without = warpline::PTX.replace(line, "");
    let e = check_contract(&without, host).unwrap_err();
    assert!(matches!(e, Error::ContractMismatch { ptx_hash: None, .. }));
    assert!(e.to_string().contains("rebuild"), "{e}");
}

/// Where the fixture kernel crates live.
fn fixture(name: &str) -> PathBuf {
    workspace().join("builder/tests/fixtures").join(name)
}

/// The committed PTX of `builder/tests/fixtures/panic-kernel`, which the GPU test below loads
/// (the GPU machine has no Rust toolchain). `issue22_item01_panics_compile_to_trap` checks it is
/// what the builder makes of the fixture today (`WARPLINE_BLESS=1` rewrites it).
const PANIC_KERNEL_PTX: &str = include_str!("data/issue22_panic_kernel.ptx");

#[test]
fn issue22_item01_panics_compile_to_trap() {
    if let Err(e) = DeviceToolchain::discover() {
        println!("SKIPPED issue22_item01_panics_compile_to_trap: no device toolchain ({e})");
        return;
    }
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let out = tmp.join(format!("panic-kernel-out-{}", std::process::id()));
    // The same device target dir as the tiny-kernel test: core is compiled once for both.
    let built = PtxBuilder::new(fixture("panic-kernel"))
        .out_dir(&out)
        .target_dir(tmp.join("tiny-kernel-nvptx"))
        .build()
        .unwrap_or_else(|e| panic!("safe Rust with panics did not build: {e}"));
    assert_eq!(built.entries, ["gather_mod_kernel"]);
    let ptx = fs::read_to_string(&built.path).unwrap();
    assert!(
        !ptx.contains("panicking") && !ptx.contains(".extern .func"),
        "core's panic machinery reached the PTX:\n{ptx}"
    );
    // The bounds checks, the `m == 0` check and the assert each end in a trap.
    let body = ptx.split(".entry gather_mod_kernel").nth(1).unwrap();
    assert!(
        body.matches("trap;").count() >= 2,
        "no trap for the panics:\n{ptx}"
    );
    // ptxas (where installed) assembled it: the builder returns its resources only then.
    if warpline_builder::ptxas::find().is_some() {
        let r = built.resources.as_ref().expect("ptxas ran");
        assert_eq!(r[0].name, "gather_mod_kernel");
    } else {
        println!("issue22_item01_panics_compile_to_trap: no ptxas here; PTX not assembled");
    }
    let committed = workspace().join("tests/data/issue22_panic_kernel.ptx");
    let debian = DeviceToolchain::discover()
        .is_ok_and(|t| t.source == warpline_builder::ToolchainSource::Debian);
    if !debian {
        println!("issue22_item01_panics_compile_to_trap: not Debian's rustc-web 1.96; the committed PTX is not compared");
    } else if std::env::var("WARPLINE_BLESS").is_ok_and(|v| v == "1") {
        fs::write(&committed, &ptx).unwrap();
    } else {
        assert!(
            ptx == PANIC_KERNEL_PTX,
            "tests/data/issue22_panic_kernel.ptx is stale: rerun this test with WARPLINE_BLESS=1"
        );
    }
    fs::remove_dir_all(&out).unwrap();
}

#[test]
fn issue22_item02_a_ptxas_warning_fails_the_build_and_is_named() {
    if let Err(e) = DeviceToolchain::discover() {
        println!("SKIPPED issue22_item02_a_ptxas_warning_fails_the_build_and_is_named: no device toolchain ({e})");
        return;
    }
    if warpline_builder::ptxas::find().is_none() {
        println!("SKIPPED issue22_item02_a_ptxas_warning_fails_the_build_and_is_named: no ptxas");
        return;
    }
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let out = tmp.join(format!("warn-kernel-out-{}", std::process::id()));
    let b = PtxBuilder::new(fixture("warn-kernel"))
        .arch(warpline_builder::Arch::Sm90a)
        .out_dir(&out)
        .target_dir(tmp.join("warn-kernel-nvptx-sm90a"));
    match b.build() {
        Err(e @ warpline_builder::BuildError::PtxasWarnings { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("C7508") && msg.contains("setmaxnreg"), "{msg}");
            assert!(
                msg.contains("deny_ptxas_warnings(false)")
                    && msg.contains(warpline_builder::ENV_ALLOW_PTXAS_WARNINGS),
                "the opt-out is not named: {msg}"
            );
        }
        r => panic!("a module ptxas warns about built: {r:?}"),
    }
    // The opt-out: the build succeeds and the report still carries the warning.
    let built = b.deny_ptxas_warnings(false).build().unwrap();
    assert!(
        built
            .ptxas_diagnostics
            .iter()
            .any(|d| d.code.as_deref() == Some("C7508") && d.is_harmful()),
        "{:?}",
        built.ptxas_diagnostics
    );
    fs::remove_dir_all(&out).unwrap();
}

/// Issue 22, item 2, the wgmma case: a deliberate C7515 (builder/tests/fixtures/
/// wgmma-serialized-kernel, a mainloop whose zero-trip path re-zeroes the accumulators before the
/// final `wgmma.wait_group`, so ptxas serializes the wgmmas) fails the build with the warning
/// named, and with the opt-out it builds and the report still carries C7515.
#[test]
fn issue22_item02_a_deliberate_c7515_fails_the_build_and_is_named() {
    const NAME: &str = "issue22_item02_a_deliberate_c7515_fails_the_build_and_is_named";
    if let Err(e) = DeviceToolchain::discover() {
        println!("SKIPPED {NAME}: no device toolchain ({e})");
        return;
    }
    if warpline_builder::ptxas::find().is_none() {
        println!("SKIPPED {NAME}: no ptxas");
        return;
    }
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let out = tmp.join(format!(
        "wgmma-serialized-kernel-out-{}",
        std::process::id()
    ));
    let b = PtxBuilder::new(fixture("wgmma-serialized-kernel"))
        .arch(warpline_builder::Arch::Sm90a)
        .out_dir(&out)
        .target_dir(tmp.join("wgmma-serialized-kernel-nvptx-sm90a"));
    match b.build() {
        Err(e @ warpline_builder::BuildError::PtxasWarnings { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("C7515")
                    && msg.contains("wgmma.mma_async instructions are serialized")
                    && msg.contains("'serialized'"),
                "{msg}"
            );
            assert!(
                msg.contains("deny_ptxas_warnings(false)")
                    && msg.contains(warpline_builder::ENV_ALLOW_PTXAS_WARNINGS),
                "the opt-out is not named: {msg}"
            );
        }
        r => panic!("a module whose wgmmas ptxas serializes (C7515) built: {r:?}"),
    }
    // The opt-out: the build succeeds and the report still carries the warning.
    let built = b.deny_ptxas_warnings(false).build().unwrap();
    assert!(
        built
            .ptxas_diagnostics
            .iter()
            .any(|d| d.code.as_deref() == Some("C7515") && d.is_harmful()),
        "{:?}",
        built.ptxas_diagnostics
    );
    assert!(built.path.exists(), "{}", built.path.display());
    fs::remove_dir_all(&out).unwrap();
}

/// Issue 22, item 4: a build script writes only under `OUT_DIR`. host/build.rs hands the builder
/// only folders under `out_dir` (the module and the device cargo's target directory), never the
/// checkout's `target/` or `CARGO_TARGET_DIR`.
#[test]
fn issue22_item04_host_build_script_writes_only_under_out_dir() {
    let src = fs::read_to_string(workspace().join("host/build.rs")).unwrap();
    let code: String = src
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    for forbidden in ["CARGO_TARGET_DIR", "join(\"target\")", "\"target/"] {
        let hits: Vec<&str> = code
            .lines()
            .filter(|l| l.contains(forbidden) && !l.contains("xtask_path"))
            .collect();
        assert!(
            hits.is_empty(),
            "host/build.rs uses `{forbidden}`: {hits:?}"
        );
    }
    for call in [".out_dir(", ".target_dir("] {
        let line = code
            .lines()
            .find(|l| l.contains(call))
            .unwrap_or_else(|| panic!("host/build.rs sets no {call}"));
        assert!(
            line.contains("out_dir") || line.contains("target_dir"),
            "{line}"
        );
    }
    let target_dir_def = code
        .lines()
        .find(|l| l.contains("let target_dir"))
        .expect("no `let target_dir` in host/build.rs");
    assert!(
        target_dir_def.contains("out_dir.join("),
        "the device target dir is not under OUT_DIR: {target_dir_def}"
    );
}
