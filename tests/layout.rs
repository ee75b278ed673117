//! The crate's structure, checked rather than hoped for:
//!
//! * **Layers.** Each top-level module of `src/` sits on a layer, and a file may import
//!   only from modules on lower layers (and from its own module). The persistence layer
//!   and the RL layer are siblings: neither imports the other.
//! * **No circles.** No file imports, directly or through other files, from a file that
//!   imports it. A module's own re-exports of its children (`mod.rs` naming
//!   `child::Item`) are its interface, not an import, and are left out.
//! * **Small files.** No source file passes 700 lines.
//! * **One place for synchronisation primitives.** Only `src/sync.rs` names `std::sync`,
//!   `tokio::sync`, `loom` or `parking_lot`.
//!
//! The import graph is read from `crate::`, `super::` and `self::` paths in the source
//! text (comments and `#[cfg(test)]` modules at the end of a file left out), which is all
//! a layering rule needs: a Rust path that names another module is how one module uses
//! another.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Top-level modules by layer, lowest first. A module may import from lower layers only.
const LAYERS: &[&[&str]] = &[
    &["sync", "deadline"],
    &["error", "exit"],
    &["tensor"],
    &["sample"],
    &["rpc_defs", "arrow"],
    &["state"],
    &["buffer"],
    &["persist", "rollout"],
];

/// The most lines a source file may have.
const MAX_LINES: usize = 700;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// A module path inside the crate, e.g. `["state", "table", "lease"]`.
type ModPath = Vec<String>;

/// Every `.rs` file under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "py") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The module a file under `src/` defines.
fn module_of(src: &Path, file: &Path) -> ModPath {
    let rel = file.strip_prefix(src).expect("file under src");
    let mut parts: ModPath = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The source without comments and without a trailing `#[cfg(test)] mod ... {` block
/// (whose `super::` means the file itself, not its parent).
fn code_of(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed == "#[cfg(test)]"
            && lines.peek().is_some_and(|next| {
                let n = next.trim_start();
                n.starts_with("mod ") && n.ends_with('{')
            })
        {
            break;
        }
        let without_comment = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        code.push_str(without_comment);
        code.push('\n');
    }
    code
}

/// The module paths `code` names, resolved from module `current`, each cut to the longest
/// prefix that is a known module. (`super` is the parent of the file's module, whether the
/// file is `foo.rs` or `foo/mod.rs`.)
fn imports(code: &str, current: &ModPath, modules: &BTreeSet<ModPath>) -> BTreeSet<ModPath> {
    // Expand `prefix::{a, b::c}` groups into `prefix::a`, `prefix::b::c` first.
    let mut paths: Vec<Vec<String>> = Vec::new();
    let bytes: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        let starts_path = ["crate::", "super::", "self::"].iter().any(|p| {
            let p: Vec<char> = p.chars().collect();
            bytes[i..].starts_with(&p)
                && (i == 0 || !(bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_'))
        });
        if !starts_path {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < bytes.len() && (bytes[j].is_alphanumeric() || bytes[j] == '_' || bytes[j] == ':')
        {
            j += 1;
        }
        let prefix: String = bytes[i..j].iter().collect();
        let segments: Vec<String> = prefix
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if j < bytes.len() && bytes[j] == '{' {
            // One level of braces is enough for this crate's imports; nested groups are
            // read as their leading path.
            let close = bytes[j..]
                .iter()
                .position(|&c| c == '}')
                .map_or(bytes.len(), |p| j + p);
            let inner: String = bytes[j + 1..close].iter().collect();
            for item in inner.split(',') {
                let item = item.trim().split(" as ").next().unwrap_or("").trim();
                let item = item.split('{').next().unwrap_or("").trim_end_matches("::");
                if item.is_empty() {
                    continue;
                }
                let mut full = segments.clone();
                full.extend(item.split("::").map(str::to_owned));
                paths.push(full);
            }
            i = close;
        } else {
            paths.push(segments);
            i = j;
        }
    }
    let mut out = BTreeSet::new();
    for path in paths {
        let mut base: ModPath = Vec::new();
        let mut rest = path.as_slice();
        match rest.first().map(String::as_str) {
            Some("crate") => rest = &rest[1..],
            Some("self" | "super") => {
                base = current.clone();
                while let Some(first) = rest.first().map(String::as_str) {
                    match first {
                        "self" => rest = &rest[1..],
                        "super" => {
                            base.pop();
                            rest = &rest[1..];
                        }
                        _ => break,
                    }
                }
            }
            _ => continue,
        }
        let mut full = base;
        full.extend(rest.iter().cloned());
        if let Some(n) = (0..=full.len())
            .rev()
            .find(|&n| modules.contains(&full[..n].to_vec()))
        {
            let target = full[..n].to_vec();
            // Imports of itself and of its own descendants (a module's re-exports of its
            // children) are not edges.
            if !target.starts_with(current) && !target.is_empty() {
                out.insert(target);
            }
        }
    }
    out
}

struct Crate {
    /// Module -> the modules it imports.
    edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
    /// Module -> its file, relative to the crate root.
    files: BTreeMap<ModPath, String>,
}

fn read_crate() -> Crate {
    let src = Path::new(ROOT).join("src");
    let files: Vec<PathBuf> = rust_files(&src)
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        .collect();
    let modules: BTreeSet<ModPath> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut edges = BTreeMap::new();
    let mut names = BTreeMap::new();
    for file in &files {
        let module = module_of(&src, file);
        let text = fs::read_to_string(file).expect("readable source");
        let found = imports(&code_of(&text), &module, &modules);
        names.insert(
            module.clone(),
            file.strip_prefix(ROOT)
                .unwrap_or(file)
                .display()
                .to_string(),
        );
        edges.insert(module, found);
    }
    Crate {
        edges,
        files: names,
    }
}

fn layer_of(module: &ModPath) -> Option<usize> {
    let top = module.first()?;
    LAYERS
        .iter()
        .position(|layer| layer.contains(&top.as_str()))
}

#[test]
fn every_top_level_module_has_a_layer() {
    let krate = read_crate();
    let unplaced: BTreeSet<&String> = krate
        .edges
        .keys()
        .filter(|m| !m.is_empty() && layer_of(m).is_none())
        .filter_map(|m| m.first())
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules with no layer in tests/layout.rs: {unplaced:?}"
    );
}

#[test]
fn layers_import_only_downward() {
    let krate = read_crate();
    let mut violations = Vec::new();
    for (module, targets) in &krate.edges {
        let Some(from) = layer_of(module) else {
            continue; // lib.rs sits on top of everything
        };
        for target in targets {
            let Some(to) = layer_of(target) else {
                continue;
            };
            let same_module = module.first() == target.first();
            if !same_module && to >= from {
                violations.push(format!(
                    "{} (layer {from}) imports {} (layer {to})",
                    krate.files[module],
                    target.join("::")
                ));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "upward or sideways imports:\n{}",
        violations.join("\n")
    );
}

#[test]
fn no_import_circles() {
    let krate = read_crate();
    // Tarjan's strongly connected components over the file graph.
    struct Walk<'a> {
        edges: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on_stack: BTreeSet<&'a ModPath>,
        circles: Vec<Vec<&'a ModPath>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, v: &'a ModPath) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                let Some((w, _)) = self.edges.get_key_value(w) else {
                    continue;
                };
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.on_stack.contains(w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let mut component = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                if component.len() > 1 {
                    self.circles.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        edges: &krate.edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        circles: Vec::new(),
    };
    for v in krate.edges.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    let circles: Vec<String> = walk
        .circles
        .iter()
        .map(|c| {
            let mut files: Vec<&str> = c.iter().map(|m| krate.files[*m].as_str()).collect();
            files.sort();
            files.join(" <-> ")
        })
        .collect();
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_checker_finds_circles_and_upward_imports() {
    // The resolver on a made-up pair: `a/x.rs` names `super::y`, `a/y.rs` names `crate::a::x`.
    let modules: BTreeSet<ModPath> = [vec![], vec!["a".into()], vec!["a".into(), "x".into()]]
        .into_iter()
        .chain([
            vec!["a".into(), "y".into()],
            vec!["state".into()],
            vec!["buffer".into()],
        ])
        .collect();
    let x: ModPath = vec!["a".into(), "x".into()];
    let y: ModPath = vec!["a".into(), "y".into()];
    assert_eq!(
        imports("use super::y::Thing;\n", &x, &modules),
        BTreeSet::from([y.clone()])
    );
    assert_eq!(
        imports("use crate::a::{x::One, y};\n", &y, &modules),
        BTreeSet::from([x.clone()]),
        "an import of itself is no edge"
    );
    let state: ModPath = vec!["state".into()];
    assert_eq!(
        imports(
            &code_of("fn f() { crate::buffer::go() }\n// crate::a::x\n"),
            &state,
            &modules
        ),
        BTreeSet::from([vec!["buffer".to_owned()]]),
        "paths in code count, paths in comments do not"
    );
    assert!(layer_of(&state) < layer_of(&vec!["buffer".to_owned()]));
}

#[test]
fn no_source_file_passes_the_line_limit() {
    let mut long = Vec::new();
    for dir in [
        "src",
        "tests",
        "benches",
        "examples",
        "loom_tests",
        "python",
        "server",
    ] {
        for file in rust_files(&Path::new(ROOT).join(dir)) {
            if file.components().any(|c| c.as_os_str() == "target") {
                continue;
            }
            let lines = fs::read_to_string(&file).map_or(0, |t| t.lines().count());
            if lines > MAX_LINES {
                long.push(format!("{} ({lines} lines)", file.display()));
            }
        }
    }
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines, to split along the concepts they mix:\n{}",
        long.join("\n")
    );
}

#[test]
fn only_sync_rs_names_synchronisation_primitives() {
    let src = Path::new(ROOT).join("src");
    let mut found = Vec::new();
    for file in rust_files(&src) {
        if file.ends_with("sync.rs") && file.parent() == Some(src.as_path()) {
            continue;
        }
        let text = fs::read_to_string(&file).expect("readable source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for name in ["std::sync", "tokio::sync", "loom::", "parking_lot"] {
                if code.contains(name) {
                    found.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "only src/sync.rs may name synchronisation primitives:\n{}",
        found.join("\n")
    );
}

/// Library code never unwraps: a failure on a caller's, a file's or the network's data is
/// a typed error. `expect` and `unwrap` are for test code only, in a `#[cfg(test)] mod`
/// at the end of a file or in a test file (`tests.rs`, `*_tests.rs`, under `tests/`),
/// each saying why.
#[test]
fn library_code_never_unwraps() {
    let mut found = Vec::new();
    for dir in ["src", "python/src", "server/src"] {
        for file in rust_files(&Path::new(ROOT).join(dir)) {
            let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let text = fs::read_to_string(&file).unwrap_or_default();
            let test_file = name == "tests.rs"
                || name.ends_with("_tests.rs")
                || file.components().any(|c| c.as_os_str() == "tests");
            let unwraps = text.contains(".unwrap()") || text.contains(".expect(");
            if !unwraps {
                continue;
            }
            if test_file {
                assert!(
                    text.contains("tests/layout.rs checks"),
                    "{}: test code that unwraps says why",
                    file.display()
                );
                continue;
            }
            let lines: Vec<&str> = text.lines().collect();
            let tests_from = (0..lines.len())
                .find(|&i| {
                    lines[i].trim() == "#[cfg(test)]"
                        && lines[i + 1..]
                            .iter()
                            .find(|l| !l.trim().is_empty())
                            .is_some_and(|l| l.trim_start().starts_with("mod "))
                })
                .unwrap_or(lines.len());
            for (i, line) in lines[..tests_from].iter().enumerate() {
                let code = line.trim_start();
                if !code.starts_with("//")
                    && (code.contains(".unwrap()") || code.contains(".expect("))
                {
                    found.push(format!("{}:{}: {}", file.display(), i + 1, code));
                }
            }
            let test_unwraps = lines[tests_from..]
                .iter()
                .any(|l| l.contains(".unwrap()") || l.contains(".expect("));
            if test_unwraps {
                assert!(
                    text.contains("tests/layout.rs checks"),
                    "{}: test code that unwraps says why",
                    file.display()
                );
            }
        }
    }
    assert!(
        found.is_empty(),
        "unwrap / expect in library code:\n{}",
        found.join("\n")
    );
}
