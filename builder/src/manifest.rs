//! What the builder reads from a kernel crate's `Cargo.toml`: its package and library names and
//! its path dependencies (for the rerun-if-changed list).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

use toml::Table;

use crate::BuildError;

/// The names of a kernel crate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrateNames {
    /// `[package] name` (what `-p` takes).
    pub package: String,
    /// The library's name: `[lib] name`, else the package name with `-` as `_` (the stem of the
    /// emitted `.s` file).
    pub lib: String,
}

pub(crate) fn read_table(manifest: &Path) -> Result<Table, BuildError> {
    let text = fs::read_to_string(manifest).map_err(|e| BuildError::Io {
        path: manifest.to_path_buf(),
        source: e,
    })?;
    text.parse::<Table>().map_err(|e| BuildError::Manifest {
        path: manifest.to_path_buf(),
        message: e.to_string(),
    })
}

/// Reads the package and library names from the crate's `Cargo.toml`.
pub(crate) fn names(crate_dir: &Path) -> Result<CrateNames, BuildError> {
    let manifest = crate_dir.join("Cargo.toml");
    let t = read_table(&manifest)?;
    let package = t
        .get("package")
        .and_then(|p| p.get("name"))
        .and_then(|n| n.as_str())
        .ok_or_else(|| BuildError::Manifest {
            path: manifest.clone(),
            message: "no [package] name".into(),
        })?
        .to_string();
    let lib = t
        .get("lib")
        .and_then(|l| l.get("name"))
        .and_then(|n| n.as_str())
        .map(str::to_string)
        .unwrap_or_else(|| package.replace('-', "_"));
    Ok(CrateNames { package, lib })
}

/// The nearest ancestor folder (the crate's own included) whose `Cargo.toml` has `[workspace]`.
fn workspace_root(crate_dir: &Path) -> Option<(PathBuf, Table)> {
    crate_dir.ancestors().find_map(|d| {
        let t = read_table(&d.join("Cargo.toml")).ok()?;
        t.contains_key("workspace").then(|| (d.to_path_buf(), t))
    })
}

/// The folders of the path dependencies in `[dependencies]`, `[build-dependencies]` and
/// `[target.*.dependencies]`/`[target.*.build-dependencies]` (not dev-dependencies: they do not
/// reach the PTX), including `dep = { workspace = true }` entries whose workspace entry has a path.
pub(crate) fn path_dependencies(crate_dir: &Path) -> Result<Vec<PathBuf>, BuildError> {
    let t = read_table(&crate_dir.join("Cargo.toml"))?;
    let mut tables: Vec<&Table> = Vec::new();
    for key in ["dependencies", "build-dependencies"] {
        tables.extend(t.get(key).and_then(|v| v.as_table()));
    }
    if let Some(targets) = t.get("target").and_then(|v| v.as_table()) {
        for cfg in targets.values() {
            for key in ["dependencies", "build-dependencies"] {
                tables.extend(cfg.get(key).and_then(|v| v.as_table()));
            }
        }
    }
    let mut ws: Option<Option<(PathBuf, Table)>> = None;
    let mut out = Vec::new();
    for deps in tables {
        for (name, spec) in deps {
            if let Some(p) = spec.get("path").and_then(|p| p.as_str()) {
                out.push(crate_dir.join(p));
            } else if spec.get("workspace").and_then(|w| w.as_bool()) == Some(true) {
                let ws = ws.get_or_insert_with(|| workspace_root(crate_dir));
                if let Some((root, wt)) = ws {
                    let p = wt
                        .get("workspace")
                        .and_then(|w| w.get("dependencies"))
                        .and_then(|d| d.get(name))
                        .and_then(|d| d.get("path"))
                        .and_then(|p| p.as_str());
                    out.extend(p.map(|p| root.join(p)));
                }
            }
        }
    }
    Ok(out)
}

fn files_under(dir: &Path, out: &mut BTreeSet<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => files_under(&p, out),
            Ok(_) => {
                out.insert(p);
            }
            Err(_) => {}
        }
    }
}

fn normalize(p: &Path) -> PathBuf {
    p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
}

/// Everything a change of which must rebuild the PTX: for the kernel crate and, transitively, each
/// of its path dependencies, its `Cargo.toml`, its `build.rs` if any, its `src/` folder (so a new
/// file counts) and every file under `src/`. Sorted, without duplicates.
pub(crate) fn rerun_paths(crate_dir: &Path) -> Result<Vec<PathBuf>, BuildError> {
    let mut crates = vec![normalize(crate_dir)];
    let mut seen: BTreeSet<PathBuf> = crates.iter().cloned().collect();
    let mut out = BTreeSet::new();
    while let Some(dir) = crates.pop() {
        out.insert(dir.join("Cargo.toml"));
        if dir.join("build.rs").exists() {
            out.insert(dir.join("build.rs"));
        }
        let src = dir.join("src");
        if src.is_dir() {
            out.insert(src.clone());
            files_under(&src, &mut out);
        }
        for dep in path_dependencies(&dir)? {
            let dep = normalize(&dep);
            if seen.insert(dep.clone()) {
                crates.push(dep);
            }
        }
    }
    Ok(out.into_iter().collect())
}
