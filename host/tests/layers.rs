//! The layering of host/src (issue 22, item 11), checked on the source text without a GPU.
//!
//! Every top-level module of host/src (a file `x.rs` or a folder `x/`) has a place in [`LAYERS`],
//! lowest first, as cudarc layers `sys` -> `result` -> safe: the error type at the
//! bottom, then `driver/` (the one layer over raw `cu*` calls), then the safe types built on them.
//! A module may import (`crate::...`, `super::...` up to the crate root, or a name the crate root
//! re-exports) only modules below it. This test fails
//!
//! - when `error.rs` imports any other module of the crate, or `driver/` any module but `error`;
//! - when any other import goes up the order (there are no exceptions: host/src has no import
//!   cycle between its modules, and none may come back; move the item down, or invert the
//!   dependency, instead); the message says whether the new import closes a cycle;
//! - when a top-level module is missing from [`LAYERS`], or [`LAYERS`] names one that is gone.
//!
//! Imports inside `#[cfg(test)]` items do not count (tests may reach any module). Comments, string
//! and character literals are removed before the scan.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// host/src's top-level modules, lowest layer first.
const LAYERS: &[&str] = &[
    // The error type and its pieces: imports nothing of the crate.
    "error",
    // Raw driver calls, one `cu*` each; imports only `error`.
    "driver",
    // The reaper thread and its gate between blocking driver calls and on-stream waits (with the
    // list of pending waits the gate asks); imports only `error` and `driver`.
    "reaper",
    // Pure helpers (no CUDA).
    "contract_check",
    "reference",
    "npy",
    "rng",
    "ptx",
    // The per-context record (sticky errors, deferred errors, per-context state of the layers
    // above) and the binding of a context to the thread.
    "context",
    // The safe CUDA types.
    "stream",
    // A loaded PTX module, its kernels and its keep-alive (a `Device` owns one).
    "loaded",
    "device",
    "memory",
    "launch",
    "module",
    "tensor_map",
    "fp8",
    "kernels",
    "trace",
    "ordering",
    "multi",
    // What is built from all of them.
    "pipeline",
    "chain",
    "interop",
    "decode",
    "bandwidth",
    "fuzz",
];

/// An import of `to` by a file of top-level module `from`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Import {
    from: String,
    to: String,
    file: String,
}

#[test]
fn host_src_modules_import_only_lower_layers() {
    let Some(src) = host_src("host_src_modules_import_only_lower_layers") else {
        return;
    };
    let imports = crate_imports(&src);
    let tops = top_level_modules(&src);
    let pos: BTreeMap<&str, usize> = LAYERS.iter().enumerate().map(|(i, m)| (*m, i)).collect();

    let unplaced: Vec<&String> = tops
        .iter()
        .filter(|t| !pos.contains_key(t.as_str()))
        .collect();
    assert!(
        unplaced.is_empty(),
        "host/src modules {unplaced:?} have no place in LAYERS (host/tests/layers.rs): add each \
         above every module it imports and below every module that imports it"
    );
    let gone: Vec<&&str> = LAYERS.iter().filter(|m| !tops.contains(**m)).collect();
    assert!(
        gone.is_empty(),
        "LAYERS names {gone:?}, which host/src no longer has: remove them"
    );
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for i in &imports {
        graph.entry(&i.from).or_default().insert(&i.to);
    }
    let mut failures = Vec::new();
    for i in &imports {
        let (Some(&f), Some(&t)) = (pos.get(i.from.as_str()), pos.get(i.to.as_str())) else {
            continue;
        };
        if t > f {
            let cycle = if reaches(&graph, &i.to, &i.from) {
                format!("closes an import cycle ({} imports {} again)", i.to, i.from)
            } else {
                "no cycle yet: if it is right, move the importer above it in LAYERS".to_string()
            };
            failures.push(format!(
                "host/src/{} ({}) imports {}, a higher layer: {cycle}",
                i.file, i.from, i.to
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The two bottom layers, said on their own so a failure names them plainly.
#[test]
fn error_and_driver_import_nothing_above_them() {
    let Some(src) = host_src("error_and_driver_import_nothing_above_them") else {
        return;
    };
    let bad: Vec<Import> = crate_imports(&src)
        .into_iter()
        .filter(|i| match i.from.as_str() {
            "error" => true,
            "driver" => i.to != "error",
            _ => false,
        })
        .collect();
    assert!(
        bad.is_empty(),
        "error.rs imports nothing of the crate, driver/ only error.rs: {bad:#?}"
    );
}

/// The scanner on a hand-written sample: comments, strings, chars, lifetimes, raw strings,
/// `crate::{..}` groups, re-exported names, `super::` to the root, and `#[cfg(test)]` items.
#[test]
fn the_scanner_sees_imports_and_only_imports() {
    let tops: BTreeSet<String> = ["a", "b", "c", "d", "e", "f", "g", "h"]
        .map(String::from)
        .into();
    let reexports: BTreeMap<String, String> = [("Thing".to_string(), "h".to_string())].into();
    let text = r##"
        // crate::z in a comment /* crate::z */
        /// [`crate::z`]
        use crate::a::X;
        use crate::{b::{Y, Z}, c};
        fn f<'t>(x: &'t str) -> char { let _ = "crate::z {"; let _ = r#"crate::z "#; '{' }
        fn g() { super::d::run(); crate::Thing::new(); crate::PTX; }
        mod inner { fn k() { super::super::e::x(); super::local(); } }
        #[cfg(test)]
        mod tests { use crate::f::Q; fn t() { let _ = '}'; } }
        #[cfg(test)]
        fn only_in_tests() { crate::g::w() }
        fn after() { crate::e::y() }
    "##;
    let found = imports_of(text, &["a"], &tops, &reexports);
    assert_eq!(
        found,
        ["b", "c", "d", "e", "h"].map(String::from).into(),
        "a.rs imports"
    );
}

/// The files of every module folder of host/src (`memory/`, `ordering/`, `ordering/graph/`,
/// `kernels/tc_gemm/` next to `kernels/tc_gemm.rs`, ...) import each other without a cycle.
/// Within a folder each child (a file `x.rs`, a folder `x/`) is a node, and so is the folder's
/// own module file (`mod.rs` or the `x.rs` beside the folder), named `mod`. A child imports
/// another when its code names it (`super::x::..`, `crate::ordering::x::..`, in the module file
/// `x::..` or `self::x::..`) or names an item that the module file re-exports from it; an item of
/// the module file itself (also through `use super::*`) is an import of `mod`. The module file's
/// `mod x;` declarations and `pub use` re-exports of its children are its facade, not imports.
#[test]
fn files_within_a_module_folder_import_each_other_without_a_cycle() {
    let Some(src) = host_src("files_within_a_module_folder_import_each_other_without_a_cycle")
    else {
        return;
    };
    let (files, children) = load_tree(&src);
    let mut failures = Vec::new();
    for (folder, graph) in folder_graphs(&files, &children) {
        if let Some(cycle) = find_cycle(&graph) {
            failures.push(format!(
                "host/src/{}/: {} (each imports the next)",
                folder.join("/"),
                cycle.join(" -> ")
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "import cycles between the files of a module folder (move the shared item into the lower \
         file, or split it out into a file below both):\n{}",
        failures.join("\n")
    );
}

/// The folder scanner on a hand-written tree: `super::` and `crate::` paths, groups, an item
/// re-exported by `mod.rs`, an item of `mod.rs`, a glob of `mod.rs`, a bare child path in `mod.rs`,
/// the facade (`mod` and `pub use`) ignored, a nested folder's file, and `#[cfg(test)]` items
/// ignored.
#[test]
fn the_folder_scanner_sees_file_imports() {
    let m = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let files = vec![
        (
            m(&["o"]),
            true,
            "mod a; mod b; mod c; mod g; pub use a::A; pub(crate) use b::{B, Bee as Bz};\n\
             pub struct Top; fn f() { c::run(); }"
                .to_string(),
        ),
        (
            m(&["o", "a"]),
            false,
            "use super::{b::X, Top}; #[cfg(test)] mod tests { use super::super::c::Q; }"
                .to_string(),
        ),
        (
            m(&["o", "b"]),
            false,
            "fn f() { crate::o::A::new(); }".to_string(),
        ),
        (
            m(&["o", "c"]),
            false,
            "use crate::o::{Bz, g::h::H};".to_string(),
        ),
        (
            m(&["o", "g"]),
            true,
            "mod h; pub use h::H; pub use super::b::B;".to_string(),
        ),
        (
            m(&["o", "g", "h"]),
            false,
            "use super::super::a::A;".to_string(),
        ),
        (m(&["o", "d"]), false, "use super::*;".to_string()),
    ];
    let children: BTreeMap<Vec<String>, BTreeSet<String>> = [
        (
            m(&["o"]),
            ["a", "b", "c", "d", "g"].map(String::from).into(),
        ),
        (m(&["o", "g"]), ["h"].map(String::from).into()),
    ]
    .into();
    let graphs = folder_graphs(&files, &children);
    let o = &graphs[&m(&["o"])];
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    assert_eq!(o["mod"], set(&["c"]), "mod.rs");
    assert_eq!(o["a"], set(&["b", "mod"]), "a.rs");
    assert_eq!(o["b"], set(&["a"]), "b.rs");
    assert_eq!(o["c"], set(&["b", "g"]), "c.rs");
    assert_eq!(
        o["g"],
        set(&["a", "b"]),
        "g.rs re-exports b's B; g/h.rs imports a"
    );
    assert_eq!(o["d"], set(&["mod"]), "d.rs: a glob of the module file");
    assert_eq!(
        find_cycle(o),
        Some(vec!["a".into(), "b".into(), "a".into()])
    );
    assert_eq!(
        graphs[&m(&["o", "g"])].get("h"),
        None,
        "h imports nothing of g/"
    );
}

/// host/src, or `None` (after printing `SKIPPED`) where the sources are absent: the gpu-bundle
/// carries this test's binary to a GPU host without the checkout. The check needs no GPU, so it
/// always runs where the sources are (`cargo test`, CI).
fn host_src(test: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    if src.join("lib.rs").is_file() {
        Some(src)
    } else {
        eprintln!(
            "SKIPPED {test}: {} is not here (a gpu-bundle run); the layering is checked where the sources are",
            src.display()
        );
        None
    }
}

/// Whether `to` is reachable from `from` along imports.
fn reaches(graph: &BTreeMap<&str, BTreeSet<&str>>, from: &str, to: &str) -> bool {
    let mut seen = BTreeSet::new();
    let mut stack = vec![from];
    while let Some(m) = stack.pop() {
        if m == to {
            return true;
        }
        if seen.insert(m) {
            stack.extend(graph.get(m).into_iter().flatten().copied());
        }
    }
    false
}

/// host/src's top-level modules: `x.rs` files and `x/` folders, without lib.rs.
fn top_level_modules(src: &Path) -> BTreeSet<String> {
    std::fs::read_dir(src)
        .unwrap()
        .filter_map(|e| {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            if e.path().is_dir() {
                Some(name)
            } else {
                name.strip_suffix(".rs")
                    .filter(|n| *n != "lib")
                    .map(String::from)
            }
        })
        .collect()
}

/// Every import between different top-level modules of host/src, one per (module, module, file).
fn crate_imports(src: &Path) -> Vec<Import> {
    let tops = top_level_modules(src);
    let reexports = lib_reexports(&std::fs::read_to_string(src.join("lib.rs")).unwrap(), &tops);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut out = Vec::new();
    for path in files {
        let rel = path.strip_prefix(src).unwrap();
        if rel == Path::new("lib.rs") {
            continue;
        }
        // The module path: memory/pool.rs -> [memory, pool]; memory/mod.rs -> [memory].
        let mut modpath: Vec<String> = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if modpath.last().is_some_and(|m| m == "mod") {
            modpath.pop();
        }
        let modpath: Vec<&str> = modpath.iter().map(String::as_str).collect();
        let text = std::fs::read_to_string(&path).unwrap();
        for to in imports_of(&text, &modpath, &tops, &reexports) {
            out.push(Import {
                from: modpath[0].to_string(),
                to,
                file: rel.to_string_lossy().into_owned(),
            });
        }
    }
    out.sort();
    out
}

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

/// Names the crate root re-exports from its modules (`pub use device::{Capabilities, Device};`
/// maps `Device` to `device`).
fn lib_reexports(lib: &str, tops: &BTreeSet<String>) -> BTreeMap<String, String> {
    let code = strip(lib);
    let mut out = BTreeMap::new();
    for stmt in code.split(';') {
        let Some(path) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let module = path.split("::").next().unwrap_or("").trim();
        if !tops.contains(module) {
            continue;
        }
        for leaf in path.split(['{', '}', ',']) {
            let leaf = leaf.trim();
            let name = match leaf.split_once(" as ") {
                Some((_, alias)) => alias.trim(),
                None => leaf.rsplit("::").next().unwrap_or("").trim(),
            };
            if !name.is_empty() && name != "self" && name != module {
                out.insert(name.to_string(), module.to_string());
            }
        }
    }
    out
}

/// The other top-level modules that the file of module `modpath` imports.
fn imports_of(
    text: &str,
    modpath: &[&str],
    tops: &BTreeSet<String>,
    reexports: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let code = without_test_items(&strip(text));
    let b = code.as_bytes();
    let mut out = BTreeSet::new();
    let mut add = |root_name: &str| {
        let m = reexports
            .get(root_name)
            .map(String::as_str)
            .unwrap_or(root_name);
        if tops.contains(m) && m != modpath[0] {
            out.insert(m.to_string());
        }
    };
    let inline = inline_module_depths(&code);
    let mut i = 0;
    while i < b.len() {
        let boundary = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if boundary && code[i..].starts_with("crate::") {
            i += "crate::".len();
            if b.get(i) == Some(&b'{') {
                let end = matching(b, i);
                for item in split_top_level(&code[i + 1..end]) {
                    add(&ident_at(item.trim_start()));
                }
                i = end;
            } else {
                add(&ident_at(&code[i..]));
            }
            continue;
        }
        if boundary && code[i..].starts_with("super::") {
            let mut ups = 0;
            while code[i..].starts_with("super::") {
                ups += 1;
                i += "super::".len();
            }
            // Inline `mod x { .. }` blocks around this point deepen the module path.
            let depth = modpath.len() + inline[i];
            if ups >= depth {
                add(&ident_at(&code[i..]));
            }
            continue;
        }
        i += 1;
    }
    out
}

/// The identifier at the start of `s`.
fn ident_at(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The items of a `{a, b::{c, d}}` group's inside, split at its top-level commas.
fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// The index of the `}` that closes the `{` at `open` (or the end).
fn matching(b: &[u8], open: usize) -> usize {
    let mut depth = 0i32;
    for (i, &c) in b.iter().enumerate().skip(open) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    b.len()
}

/// For every byte of `code`, how many inline `mod name { .. }` blocks enclose it.
fn inline_module_depths(code: &str) -> Vec<usize> {
    let b = code.as_bytes();
    let mut depth = vec![0usize; b.len() + 1];
    let mut opens: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    while i + 4 <= b.len() {
        let boundary = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if boundary && code[i..].starts_with("mod ") {
            let name_at = i + 4;
            let name = ident_at(code[name_at..].trim_start());
            let after = code[name_at..].trim_start()[name.len()..].trim_start();
            if !name.is_empty() && after.starts_with('{') {
                let open = b.len() - after.len();
                opens.push((open, matching(b, open)));
            }
        }
        i += 1;
    }
    for (open, close) in opens {
        for d in &mut depth[open..=close.min(b.len())] {
            *d += 1;
        }
    }
    depth
}

/// `code` without the items marked `#[cfg(test)]` (a block item up to its closing brace, any
/// other item up to its semicolon).
fn without_test_items(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while let Some(rel) = code[i..].find("#[cfg(test)]") {
        let at = i + rel;
        out.push_str(&code[i..at]);
        let mut j = at + "#[cfg(test)]".len();
        while j < b.len() && b[j] != b'{' && b[j] != b';' {
            j += 1;
        }
        i = if j < b.len() && b[j] == b'{' {
            matching(b, j) + 1
        } else {
            j + 1
        }
        .min(b.len());
    }
    out.push_str(&code[i..]);
    out
}

/// `text` without comments, and with string, raw string and character literals emptied
/// (lifetimes stay), so that only code is scanned.
fn strip(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == 'r'
            && (next == Some('"') || next == Some('#'))
            && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_'))
        {
            // A raw string r#*"..."#*.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' {
            // A character literal ('x', '\n', '\u{..}'), or a lifetime / label ('a).
            let close = if next == Some('\\') {
                (i + 2..c.len().min(i + 12)).find(|&j| c[j] == '\'')
            } else if c.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(j) => {
                    out.push_str("' '");
                    i = j + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// A file of host/src: its module path (`ordering/graph/run.rs` -> `[ordering, graph, run]`,
/// `memory/mod.rs` -> `[memory]`), whether it is a folder's module file (`mod.rs`, or `x.rs`
/// beside a folder `x/`), and its code (comments, literals and `#[cfg(test)]` items removed).
type SourceFile = (Vec<String>, bool, String);

/// Every file of host/src but lib.rs, and every folder's children (its files but `mod.rs`, and
/// its sub-folders), keyed by the folder's module path.
fn load_tree(src: &Path) -> (Vec<SourceFile>, BTreeMap<Vec<String>, BTreeSet<String>>) {
    let mut paths = Vec::new();
    rust_files(src, &mut paths);
    let mut children: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    let mut files = Vec::new();
    for path in paths {
        let rel = path.strip_prefix(src).unwrap();
        if rel == Path::new("lib.rs") {
            continue;
        }
        let mut modpath: Vec<String> = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let is_mod_rs = modpath.last().is_some_and(|m| m == "mod");
        if is_mod_rs {
            modpath.pop();
        }
        let is_module_file = is_mod_rs || path.with_extension("").is_dir();
        if modpath.len() >= 2 {
            let (leaf, parent) = modpath.split_last().unwrap();
            children
                .entry(parent.to_vec())
                .or_default()
                .insert(leaf.clone());
        }
        let text = std::fs::read_to_string(&path).unwrap();
        files.push((modpath, is_module_file, text));
    }
    (files, children)
}

/// For every folder (module path), the imports between its children, as in
/// [`files_within_a_module_folder_import_each_other_without_a_cycle`].
fn folder_graphs(
    files: &[SourceFile],
    children: &BTreeMap<Vec<String>, BTreeSet<String>>,
) -> BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> {
    // The names each folder's module file re-exports from its children.
    let mut reexports: BTreeMap<Vec<String>, BTreeMap<String, String>> = BTreeMap::new();
    for (modpath, is_module_file, text) in files {
        if let (true, Some(kids)) = (*is_module_file, children.get(modpath)) {
            reexports.insert(modpath.clone(), child_reexports(&strip(text), kids));
        }
    }
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for folder in children.keys() {
        graphs.insert(folder.clone(), BTreeMap::new());
    }
    for (modpath, is_module_file, text) in files {
        let mut code = without_test_items(&strip(text));
        let kids = children.get(modpath).filter(|_| *is_module_file);
        if let Some(kids) = kids {
            code = without_facade(&code, kids);
        }
        for target in absolute_paths(&code, modpath, kids) {
            for (folder, graph) in graphs.iter_mut() {
                let n = folder.len();
                if modpath.len() < n || modpath[..n] != folder[..] {
                    continue;
                }
                if target.len() < n || target[..n] != folder[..] {
                    continue;
                }
                let kids = &children[folder];
                let from = modpath.get(n).cloned().unwrap_or_else(|| "mod".to_string());
                // `use super::*` (the folder itself): everything of the module file.
                let Some(x) = target.get(n) else {
                    if from != "mod" {
                        graph.entry(from).or_default().insert("mod".to_string());
                    }
                    continue;
                };
                let to = if kids.contains(x) {
                    x.clone()
                } else {
                    reexports
                        .get(folder)
                        .and_then(|r| r.get(x))
                        .cloned()
                        .unwrap_or_else(|| "mod".to_string())
                };
                if from != to {
                    graph.entry(from).or_default().insert(to);
                }
            }
        }
    }
    graphs
}

/// The names a module file re-exports from its children (`pub use a::{A, B as C};` maps `A`
/// and `C` to `a`).
fn child_reexports(code: &str, kids: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in code.split(';') {
        let Some(path) = reexport_path(stmt) else {
            continue;
        };
        for p in paths_at(path) {
            let p: Vec<&String> = p.iter().filter(|s| *s != "self").collect();
            if p.len() >= 2 && kids.contains(p[0].as_str()) {
                out.insert(p[p.len() - 1].clone(), p[0].clone());
            }
        }
    }
    // `pub use a::{B as C}`: the alias is the name the others use.
    for stmt in code.split(';') {
        let Some(path) = reexport_path(stmt) else {
            continue;
        };
        let first = ident_at(path.trim_start());
        if !kids.contains(&first) {
            continue;
        }
        for leaf in path.split(['{', '}', ',']) {
            if let Some((_, alias)) = leaf.split_once(" as ") {
                out.insert(alias.trim().to_string(), first.clone());
            }
        }
    }
    out
}

/// The path of a `pub use` / `pub(crate) use` statement (without `self::`), or `None`.
fn reexport_path(stmt: &str) -> Option<&str> {
    let t = stmt.trim();
    let k = t.rfind("use ")?;
    if k > 0 && !t.as_bytes()[k - 1].is_ascii_whitespace() {
        return None;
    }
    let before = t[..k].trim_end();
    if !(before.ends_with("pub")
        || before.ends_with("pub(crate)")
        || before.ends_with("pub(super)"))
    {
        return None;
    }
    let path = t[k + 4..].trim();
    Some(path.strip_prefix("self::").unwrap_or(path))
}

/// A module file's code without its facade: `mod x;` declarations and `pub use` re-exports of
/// its children (`kids`); a re-export from elsewhere (`pub use super::y::Z`) is an import.
fn without_facade(code: &str, kids: &BTreeSet<String>) -> String {
    let mut out = String::with_capacity(code.len());
    for stmt in code.split_inclusive(';') {
        let body = stmt.trim_end_matches(';');
        let start = statement_start(body);
        let own = body[start..].trim();
        let own_no_attr = own.rsplit(']').next().unwrap_or(own).trim();
        let is_mod_decl = own_no_attr.starts_with("mod ")
            || own_no_attr.starts_with("pub mod ")
            || own_no_attr.starts_with("pub(crate) mod ");
        let reexports_a_child =
            reexport_path(own_no_attr).is_some_and(|p| kids.contains(&ident_at(p.trim_start())));
        if is_mod_decl || reexports_a_child {
            out.push_str(&body[..start]);
            out.push(' ');
        } else {
            out.push_str(stmt);
        }
    }
    out
}

/// Where the last statement of `body` (code up to a `;`) starts: after the last `{` or `}` that
/// is not part of a `::{ .. }` group.
fn statement_start(body: &str) -> usize {
    let b = body.as_bytes();
    let mut k = b.len();
    while k > 0 {
        k -= 1;
        match b[k] {
            b'{' => return k + 1,
            b'}' => {
                let mut depth = 0;
                let mut j = k;
                loop {
                    match b[j] {
                        b'}' => depth += 1,
                        b'{' => depth -= 1,
                        _ => {}
                    }
                    if depth == 0 || j == 0 {
                        break;
                    }
                    j -= 1;
                }
                if body[..j].trim_end().ends_with("::") {
                    k = j;
                } else {
                    return k + 1;
                }
            }
            _ => {}
        }
    }
    0
}

/// Every path `code` names, as an absolute module path from the crate root: `crate::a::b`,
/// `super::..` and `self::..` relative to `modpath` (inline `mod x { .. }` blocks accounted
/// for), and in a folder's module file (`kids`: its children) bare paths `x::..` to a child.
fn absolute_paths(
    code: &str,
    modpath: &[String],
    kids: Option<&BTreeSet<String>>,
) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let inline = inline_module_depths(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let boundary =
            i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':');
        if !boundary {
            i += 1;
            continue;
        }
        let rest = &code[i..];
        if let Some(r) = rest.strip_prefix("crate::") {
            out.extend(paths_at(r));
            i += "crate::".len();
            continue;
        }
        if rest.starts_with("super::") {
            let mut ups = 0;
            let mut j = i;
            while code[j..].starts_with("super::") {
                ups += 1;
                j += "super::".len();
            }
            // Inside inline modules the first `super`s stay in this file.
            if ups > inline[i] && ups - inline[i] <= modpath.len() {
                let base = &modpath[..modpath.len() - (ups - inline[i])];
                for p in paths_at(&code[j..]) {
                    out.push(base.iter().cloned().chain(p).collect());
                }
            }
            i = j;
            continue;
        }
        if inline[i] == 0 {
            if let Some(r) = rest.strip_prefix("self::") {
                for p in paths_at(r) {
                    out.push(modpath.iter().cloned().chain(p).collect());
                }
                i += "self::".len();
                continue;
            }
            if let Some(kids) = kids {
                let id = ident_at(rest);
                if kids.contains(&id) && code[i + id.len()..].starts_with("::") {
                    for p in paths_at(rest) {
                        out.push(modpath.iter().cloned().chain(p).collect());
                    }
                    i += id.len();
                    continue;
                }
            }
        }
        i += 1;
    }
    for p in &mut out {
        p.retain(|s| s != "self" && !s.is_empty());
    }
    out
}

/// The paths at the start of `s` (`a::b::C`, `a::{b, c::D}`, `{a, b}`), as segment lists.
fn paths_at(s: &str) -> Vec<Vec<String>> {
    let s = s.trim_start();
    if s.starts_with('{') {
        let end = matching(s.as_bytes(), 0).min(s.len());
        return split_top_level(&s[1..end])
            .into_iter()
            .flat_map(paths_at)
            .collect();
    }
    let id = ident_at(s);
    if id.is_empty() {
        return vec![Vec::new()];
    }
    match s[id.len()..].strip_prefix("::") {
        Some(r) => paths_at(r)
            .into_iter()
            .map(|mut p| {
                p.insert(0, id.clone());
                p
            })
            .collect(),
        None => vec![vec![id]],
    }
}

/// A cycle of `graph` (its nodes in order, the first repeated at the end), or `None`.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        done: &mut BTreeSet<String>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|s| s == n) {
            let mut cycle = stack[at..].to_vec();
            cycle.push(n.to_string());
            return Some(cycle);
        }
        if done.contains(n) {
            return None;
        }
        stack.push(n.to_string());
        for next in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(next, graph, done, stack) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut done, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}
