//! Helpers shared by the root-only interop test files.

use std::process::{Command, Output};

/// True as root; otherwise says why the test is skipped (and fails under CI, which runs as
/// root, so a skipped interop test can never pass there silently).
pub fn have_root() -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if !root {
        if std::env::var_os("CI").is_some() {
            panic!("interop tests need root in CI");
        }
        eprintln!("skipped: interop tests need root (network namespaces, TAP)");
    }
    root
}

/// Runs a command to completion; a command that cannot start fails the test.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}
