//! Tidy checks: the core stays pure. Fails if `allot-core` gains a dependency on a workspace
//! crate or on async/serde/HTTP/fs crates, or if its sources read the clock, the environment,
//! randomness, the file system or the network.

use std::fs;
use std::path::{Path, PathBuf};

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Names in `[dependencies]` (not dev- or build-dependencies) of the core's manifest.
fn normal_dependencies(manifest: &str) -> Vec<String> {
    let mut deps = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_deps = line == "[dependencies]" || line.starts_with("[dependencies.");
            if let Some(name) = line.strip_prefix("[dependencies.") {
                deps.push(name.trim_end_matches(']').to_string());
            }
            continue;
        }
        if in_deps
            && !line.is_empty()
            && !line.starts_with('#')
            && let Some((name, _)) = line.split_once('=')
        {
            deps.push(name.trim().to_string());
        }
    }
    deps
}

#[test]
fn core_has_no_forbidden_dependencies() {
    let manifest = fs::read_to_string(crate_dir().join("Cargo.toml")).expect("read manifest");
    let forbidden_prefixes = [
        "allot",
        "tokio",
        "async",
        "futures",
        "serde",
        "hyper",
        "axum",
        "reqwest",
        "http",
        "rusqlite",
        "sqlx",
        "rand",
        "getrandom",
        "chrono",
        "time",
        "walkdir",
        "tempfile",
    ];
    for dep in normal_dependencies(&manifest) {
        let bad = forbidden_prefixes.iter().any(|p| dep.starts_with(p));
        assert!(!bad, "allot-core must not depend on {dep:?}: keep the core pure (STYLE.md)");
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("read dir").flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn core_sources_do_no_io_and_read_no_clock() {
    let forbidden = [
        "std::time::SystemTime",
        "SystemTime::now",
        "Instant::now",
        "std::env",
        "env::var",
        "std::fs",
        "std::net",
        "std::process",
        "std::thread",
        "HashMap",
        "HashSet",
        "RandomState",
        "thread_rng",
        "println!",
        "eprintln!",
    ];
    let mut files = Vec::new();
    rust_files(&crate_dir().join("src"), &mut files);
    assert!(!files.is_empty(), "no sources found");
    for file in files {
        let text = fs::read_to_string(&file).expect("read source");
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            for word in forbidden {
                assert!(
                    !code.contains(word),
                    "{}:{}: `{word}` in allot-core; time, randomness and I/O come in as \
                     arguments or events",
                    file.display(),
                    n + 1
                );
            }
        }
    }
}

#[test]
fn tidy_parser_sees_dependencies() {
    // Guards the check above against silently passing on a manifest it cannot read.
    let deps = normal_dependencies(
        "[dependencies]\nfoo = \"1\"\n[dependencies.bar]\n[dev-dependencies]\nbaz = \"1\"\n",
    );
    assert_eq!(deps, vec!["foo".to_string(), "bar".to_string()]);
}
