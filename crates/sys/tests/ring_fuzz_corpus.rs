//! Every file of the `ring_peer` and `records` fuzzing corpora (`fuzz/corpus/<target>/`)
//! through the same harness the `cargo fuzz` target runs, so what the fuzzer found (and every
//! crash, once minimized into the corpus) stays a regression test without cargo-fuzz.

#[path = "harness/records.rs"]
mod records;

use std::path::PathBuf;

fn replay(target: &str, harness: fn(&[u8])) -> usize {
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
    files.len()
}

#[test]
fn ring_peer_corpus() {
    replay("ring_peer", flowstack_sys::fuzzing::ring_peer);
}

#[test]
fn records_corpus() {
    replay("records", records::records);
}

/// The harnesses catch what they claim to: a peer's garbage is reported, not obeyed, and a
/// record that does not re-encode is caught (so a green replay means something).
#[test]
fn harnesses_see_garbage() {
    // Push 3 records of 0x10 bytes and publish (op 6), receive (op 5): clean, checked.
    flowstack_sys::fuzzing::ring_peer(&[6, 0x10, 1, 6, 0x10, 1, 6, 0x10, 1, 5, 0xff]);
    // An arbitrary head (op 0), then receive: reported as corrupt, no panic.
    flowstack_sys::fuzzing::ring_peer(&[0, 9, 9, 9, 9, 9, 9, 9, 9, 5, 0xff]);
    // A command with a non-zero reserved byte does not decode; the harness accepts that.
    let mut bad = [0u8; 64];
    bad[18] = 1;
    records::records(&bad);
}
