//! What every CLI test needs: the repository root, the built binary run from it, its output
//! as text.
#![allow(dead_code)] // each test file uses its own subset

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs `allot` with `args` from the repository root.
pub fn allot(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_allot"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("run allot")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}
