//! Every file of the fuzzing corpora (`fuzz/corpus/<target>/`) through the same harness the
//! `cargo fuzz` target runs, so what the fuzzer found (and every crash, once minimized into the
//! corpus) stays a regression test without cargo-fuzz.

use flowstack_stack::fuzzing;
use std::path::PathBuf;

fn replay(target: &str, harness: fn(&[u8])) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "empty corpus {}", dir.display());
    for f in &files {
        let data = std::fs::read(f).unwrap();
        let r = std::panic::catch_unwind(|| harness(&data));
        assert!(
            r.is_ok(),
            "{target}: {} fails; replay with `cargo fuzz run {target} {}`",
            f.display(),
            f.display()
        );
    }
}

#[test]
fn wire_roundtrip_corpus() {
    replay("wire_roundtrip", fuzzing::wire_roundtrip);
}

#[test]
fn engine_rx_corpus() {
    replay("engine_rx", fuzzing::engine_rx);
}

#[test]
fn tcp_conn_corpus() {
    replay("tcp_conn", fuzzing::tcp_conn);
}
