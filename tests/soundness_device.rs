//! Finding 14 (issue 9): the device library's soundness contract, checked on its source (the
//! device crate is only compiled for nvptx64, so host tests cannot call it; `cargo xtask
//! clippy-ptx`, part of `cargo xtask test`, lints that build with these lints denied).
//!
//! - constructors over raw shared-window addresses are `unsafe` with a `# Safety` section;
//! - `.aligned` / CTA / warp barriers are `unsafe` (convergence is the caller's contract);
//! - every `unsafe fn` of `gpu/src` documents its contract in `# Safety`;
//! - `PipelineState` has no public fields (its stage is always `< STAGES`);
//! - the crate denies `unsafe_op_in_unsafe_fn`, `missing_docs`,
//!   `clippy::undocumented_unsafe_blocks`, `clippy::missing_safety_doc`.

use std::path::{Path, PathBuf};

/// The source folders of the device code: the device library and warpline's kernel crate.
fn device_srcs() -> [PathBuf; 2] {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    [root.join("device/src"), root.join("gpu/src")]
}

/// A file of the device code: `device/...` is in the device library (`device/src`), anything
/// else in the kernel crate (`gpu/src`).
fn read(rel: &str) -> String {
    let [device, gpu] = device_srcs();
    let path = match rel.strip_prefix("device/") {
        Some(rest) => device.join(rest),
        None => gpu.join(rel),
    };
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every `.rs` file under `dir`, recursively.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The doc comment (`///` lines, attributes skipped) right above line `i`.
fn doc_above(lines: &[&str], i: usize) -> String {
    let mut doc = Vec::new();
    let mut j = i;
    while j > 0 {
        j -= 1;
        let l = lines[j].trim();
        if l.starts_with("///") {
            doc.push(l);
        } else if l.starts_with("#[") || l.starts_with("//") {
            continue;
        } else {
            break;
        }
    }
    doc.reverse();
    doc.join("\n")
}

/// The line declaring `fn name` in `src` (`pub`, `const`, `unsafe` as written).
fn signature<'a>(src: &'a str, name: &str) -> &'a str {
    src.lines()
        .find(|l| l.contains(&format!("fn {name}(")) || l.contains(&format!("fn {name}<")))
        .unwrap_or_else(|| panic!("fn {name} not found"))
}

#[test]
fn finding_14_raw_shared_address_constructors_are_unsafe_with_safety_docs() {
    for (file, name) in [
        ("device/mbarrier.rs", "at"),
        ("device/pipeline.rs", "at"),
        ("device/cluster.rs", "remote_arrive"),
        ("device/cp_async.rs", "arrive_on"),
    ] {
        let src = read(file);
        let sig = signature(&src, name);
        assert!(
            sig.contains("unsafe fn"),
            "{file}: `{}` must be unsafe",
            sig.trim()
        );
        let lines: Vec<&str> = src.lines().collect();
        let i = lines.iter().position(|l| *l == sig).unwrap();
        let doc = doc_above(&lines, i);
        assert!(
            doc.contains("# Safety"),
            "{file}: {name} lacks # Safety:\n{doc}"
        );
    }
}

#[test]
fn finding_14_aligned_and_cta_barriers_are_unsafe_and_state_convergence() {
    for (file, name) in [
        ("device/thread.rs", "sync_threads"),
        ("device/warp.rs", "sync_warp"),
        ("device/cluster.rs", "arrive_release"),
        ("device/cluster.rs", "wait_acquire"),
        ("device/cluster.rs", "sync_cluster"),
    ] {
        let src = read(file);
        let sig = signature(&src, name);
        assert!(
            sig.contains("unsafe fn"),
            "{file}: `{}` must be unsafe",
            sig.trim()
        );
        let lines: Vec<&str> = src.lines().collect();
        let i = lines.iter().position(|l| *l == sig).unwrap();
        let doc = doc_above(&lines, i);
        assert!(doc.contains("# Safety"), "{file}: {name} lacks # Safety");
        assert!(
            doc.contains("convergent")
                || doc.contains("every thread")
                || doc.contains("All 32 lanes"),
            "{file}: {name}'s # Safety does not state who must execute it:\n{doc}"
        );
    }
    // No safe function of the device library issues an aligned barrier itself.
    for f in ["device/thread.rs", "device/warp.rs", "device/cluster.rs"] {
        let src = read(f);
        let lines: Vec<&str> = src.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            if l.trim_start().starts_with("//") {
                continue;
            }
            if l.contains(".aligned") || l.contains("_syncthreads") || l.contains("bar.warp.sync") {
                let decl = lines[..i]
                    .iter()
                    .rev()
                    .find(|d| d.contains(" fn "))
                    .unwrap_or_else(|| panic!("{f}:{}: barrier outside a fn", i + 1));
                assert!(
                    decl.contains("unsafe fn"),
                    "{f}:{}: `{}` is safe",
                    i + 1,
                    decl.trim()
                );
            }
        }
    }
}

#[test]
fn finding_14_every_unsafe_fn_of_the_device_crate_has_a_safety_section() {
    let mut files = Vec::new();
    for dir in device_srcs() {
        rust_files(&dir, &mut files);
    }
    let mut missing = Vec::new();
    let mut seen = 0;
    for f in files {
        let src = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = src.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let t = l.trim_start();
            if t.starts_with("//") || !t.contains("unsafe fn ") && !t.contains("unsafe extern") {
                continue;
            }
            seen += 1;
            if !doc_above(&lines, i).contains("# Safety") {
                missing.push(format!("{}:{}: {}", f.display(), i + 1, t));
            }
        }
    }
    assert!(
        seen > 30,
        "only {seen} unsafe fns found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "unsafe fns without # Safety:\n{}",
        missing.join("\n")
    );
}

#[test]
fn finding_14_pipeline_state_fields_are_private() {
    let src = read("device/pipeline.rs");
    let start = src.find("pub struct PipelineState").unwrap();
    let body = &src[start..start + src[start..].find('}').unwrap()];
    assert!(
        !body.contains("pub stage") && !body.contains("pub phase"),
        "{body}"
    );
    for accessor in [
        "pub const fn stage(self)",
        "pub const fn phase(self)",
        "pub fn advance(&mut self)",
    ] {
        assert!(src.contains(accessor), "PipelineState lacks `{accessor}`");
    }
}

#[test]
fn finding_14_device_crate_denies_the_unsafe_and_doc_lints() {
    for lib in [read("device/lib.rs"), read("lib.rs")] {
        check_denies(&lib);
    }
    // ... and the project's test command lints the device build with them, warnings denied.
    let xtask =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("xtask/src/main.rs"))
            .unwrap();
    let test_fn = &xtask[xtask.find("fn test()").unwrap()..];
    let test_fn = &test_fn[..test_fn.find("\n}\n").unwrap()];
    assert!(
        test_fn.contains("clippy_ptx()"),
        "cargo xtask test does not run clippy-ptx"
    );
    assert!(
        !xtask.contains("-A warnings"),
        "the device build still allows every warning"
    );
    assert!(
        xtask.contains("\"rust-web-clippy\""),
        "setup does not install the device clippy"
    );
}

fn check_denies(lib: &str) {
    for lint in [
        "unsafe_op_in_unsafe_fn",
        "missing_docs",
        "clippy::undocumented_unsafe_blocks",
        "clippy::missing_safety_doc",
    ] {
        let denied = lib
            .lines()
            .any(|l| l.trim_start().starts_with("#![deny(") && l.contains(lint));
        assert!(denied, "a device crate's lib.rs does not deny {lint}");
    }
}
