//! The server crate's shape, checked on its sources (tidy, in the spirit of rust-analyzer's):
//!
//! - no file imports another in a circle (`crate::…`/`super::…` paths, test modules aside);
//! - the machine (`src/machine/`) is sans-I/O: it names none of the drivers, readers or I/O
//!   modules, and uses no clock, file system, thread, socket, process or async runtime;
//! - the readers (the API, the dashboard, the what-if runner) send asks and read the view:
//!   they name none of the machine, the log or the drivers.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn sources(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
    let mut entries: Vec<PathBuf> =
        std::fs::read_dir(dir).expect("src").map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            sources(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).expect("under src").to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).expect("source");
            out.insert(rel, without_tests_and_comments(&text));
        }
    }
}

/// The file's code before its test module, without comments.
fn without_tests_and_comments(text: &str) -> String {
    let code = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    code.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `machine/daemon.rs` → `["machine", "daemon"]`; `view/mod.rs` → `["view"]`.
fn module_path(rel: &str) -> Vec<String> {
    let mut parts: Vec<String> =
        rel.trim_end_matches(".rs").split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The paths (`a::b::c`) that follow each occurrence of `prefix::` in `code`.
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    let needle = format!("{prefix}::");
    let mut rest = code;
    while let Some(i) = rest.find(&needle) {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + needle.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        out.push(rest[..end].split("::").filter(|s| !s.is_empty()).collect());
    }
    out
}

struct Crate {
    files: BTreeMap<String, String>,
    modules: BTreeMap<Vec<String>, String>,
}

impl Crate {
    fn load() -> Crate {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = BTreeMap::new();
        sources(&root, &root, &mut files);
        // Modules declared `#[cfg(test)] mod name;` are test code: left out like test modules.
        let mut test_only = Vec::new();
        for (rel, code) in &files {
            let mut parent = module_path(rel);
            let mut rest = code.as_str();
            while let Some(i) = rest.find("#[cfg(test)]\nmod ") {
                rest = &rest[i + "#[cfg(test)]\nmod ".len()..];
                let name: String = rest.chars().take_while(|c| *c != ';').collect();
                parent.push(name);
                test_only.push(parent.clone());
                parent.pop();
            }
        }
        let modules: BTreeMap<Vec<String>, String> =
            files.keys().map(|rel| (module_path(rel), rel.clone())).collect();
        for m in test_only {
            if let Some(rel) = modules.get(&m) {
                files.remove(rel);
            }
        }
        let modules = files.keys().map(|rel| (module_path(rel), rel.clone())).collect();
        Crate { files, modules }
    }

    /// The file a path from `base` (a module path) leads to: its longest module prefix.
    fn target(&self, base: &[String], segments: &[&str]) -> Option<String> {
        let mut best = None;
        for n in 1..=segments.len() {
            let mut path = base.to_vec();
            path.extend(segments[..n].iter().map(|s| (*s).to_string()));
            if let Some(file) = self.modules.get(&path) {
                best = Some(file.clone());
            }
        }
        best.or_else(|| self.modules.get(base).cloned())
    }

    /// Every file each file names through `crate::` or `super::` paths.
    fn edges(&self) -> BTreeMap<String, BTreeSet<String>> {
        let mut edges = BTreeMap::new();
        for (rel, code) in &self.files {
            let mut to = BTreeSet::new();
            for segments in paths_after(code, "crate") {
                if let Some(t) = self.target(&[], &segments) {
                    to.insert(t);
                }
            }
            let mut parent = module_path(rel);
            parent.pop();
            for segments in paths_after(code, "super") {
                if let Some(t) = self.target(&parent, &segments) {
                    to.insert(t);
                }
            }
            to.remove(rel);
            edges.insert(rel.clone(), to);
        }
        edges
    }
}

/// Files that lie on a cycle of imports (strongly connected components of two or more).
fn files_in_cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reaches = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(f) = todo.pop() {
            for t in edges.get(&f).into_iter().flatten() {
                if seen.insert(t.clone()) {
                    todo.push(t.clone());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&String, BTreeSet<String>> =
        edges.keys().map(|f| (f, reaches(f))).collect();
    let mut cycles: Vec<Vec<String>> = Vec::new();
    let mut placed = BTreeSet::new();
    for f in edges.keys() {
        if placed.contains(f) || !reach[f].contains(f) {
            continue;
        }
        let component: Vec<String> =
            reach[f].iter().filter(|g| reach[*g].contains(f)).cloned().collect();
        placed.extend(component.iter().cloned());
        cycles.push(component);
    }
    cycles
}

#[test]
fn no_file_imports_another_in_a_circle() {
    let krate = Crate::load();
    let cycles = files_in_cycles(&krate.edges());
    assert!(cycles.is_empty(), "files importing each other in a circle: {cycles:?}");
}

#[test]
fn the_machine_is_sans_io() {
    let krate = Crate::load();
    let edges = krate.edges();
    let outside = [
        "api.rs",
        "boot.rs",
        "driver.rs",
        "durable.rs",
        "executor.rs",
        "handle.rs",
        "simulation.rs",
        "state.rs",
        "telemetry.rs",
        "whatif.rs",
        "lib.rs",
        "os.rs",
    ];
    let io = [
        "std::fs",
        "std::thread",
        "std::net",
        "std::process",
        "SystemTime",
        "Instant",
        "tokio",
        "std::sync::mpsc",
    ];
    let mut problems = Vec::new();
    for (rel, code) in &krate.files {
        if !rel.starts_with("machine/") {
            continue;
        }
        for t in &edges[rel] {
            if outside.contains(&t.as_str()) || t.starts_with("dashboard/") {
                problems.push(format!("{rel} names {t}"));
            }
        }
        for word in io {
            if code.contains(word) {
                problems.push(format!("{rel} uses {word}"));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn readers_send_asks_and_read_the_view() {
    let krate = Crate::load();
    let edges = krate.edges();
    let hidden = ["boot.rs", "driver.rs", "durable.rs", "executor.rs", "simulation.rs"];
    let mut problems = Vec::new();
    for (rel, targets) in &edges {
        let reader = rel == "api.rs" || rel == "whatif.rs" || rel.starts_with("dashboard/");
        if !reader {
            continue;
        }
        for t in targets {
            if hidden.contains(&t.as_str()) || t.starts_with("machine/") {
                problems.push(format!("{rel} names {t}"));
            }
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn the_checker_sees_a_circle() {
    let mut edges = BTreeMap::new();
    edges.insert("a.rs".to_string(), BTreeSet::from(["b.rs".to_string()]));
    edges.insert("b.rs".to_string(), BTreeSet::from(["a.rs".to_string()]));
    edges.insert("c.rs".to_string(), BTreeSet::from(["a.rs".to_string()]));
    assert_eq!(files_in_cycles(&edges), vec![vec!["a.rs".to_string(), "b.rs".to_string()]]);
    let krate = Crate::load();
    let edges = krate.edges();
    assert!(
        edges["machine/foreign.rs"].contains("machine/daemon.rs"),
        "{:?}",
        edges["machine/foreign.rs"]
    );
    assert!(edges["api.rs"].contains("handle.rs") || edges["api.rs"].contains("state.rs"));
}
