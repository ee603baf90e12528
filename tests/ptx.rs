//! Checks on the PTX module that need no GPU: it assembles for sm_90 with ptxas, and each kernel
//! uses the instructions its design rests on.

use std::path::PathBuf;
use std::process::Command;

fn ptxas() -> PathBuf {
    let candidates = [
        std::env::var("PTXAS").ok().map(PathBuf::from),
        std::env::var("HOME")
            .ok()
            .map(|h| PathBuf::from(h).join(".cache/warpline/cuda-nvcc/nvidia/cu13/bin/ptxas")),
        Some(PathBuf::from("ptxas")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| Command::new(p).arg("--version").output().map(|o| o.status.success()).unwrap_or(false))
        .expect("ptxas not found: run `cargo xtask setup` (installs it from PyPI nvidia-cuda-nvcc) or set PTXAS")
}

/// The text of one `.entry` of the module, up to the next entry.
fn entry_body(name: &str) -> &'static str {
    let ptx = warpline::PTX;
    let start = ptx
        .find(&format!(".entry {name}("))
        .unwrap_or_else(|| panic!("{name} is not an entry of the module"));
    let rest = &ptx[start..];
    let end = rest[1..]
        .find(".entry ")
        .map(|i| i + 1)
        .unwrap_or(rest.len());
    &rest[..end]
}

#[test]
fn module_assembles_for_sm_90() {
    let dir = std::env::temp_dir().join(format!("warpline-ptx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("warpline_gpu.ptx");
    std::fs::write(&file, warpline::PTX).unwrap();
    let out = Command::new(ptxas())
        .args(["-arch=sm_90", "-v", "-o", "/dev/null"])
        .arg(&file)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ptxas failed:\n{log}");
    assert!(
        log.contains("Compiling entry function 'ws_vector_add' for 'sm_90'"),
        "{log}"
    );
    assert!(
        !log.contains("bytes spill stores") || log.contains(" 0 bytes spill stores"),
        "{log}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ws_vector_add_uses_cp_async_and_mbarriers() {
    let body = entry_body("ws_vector_add");
    for needle in [
        "cp.async.cg.shared.global",
        "cp.async.commit_group",
        "cp.async.wait_group",
        "mbarrier.init",
        "mbarrier.try_wait.parity",
        "mbarrier.arrive",
        "st.global.v4.f32",
        "ld.shared.v4.f32",
    ] {
        assert!(body.contains(needle), "ws_vector_add lacks `{needle}`");
    }
}
