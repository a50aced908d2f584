//! Fuzz harness of the daemon's ring record codec (`flowstack_api::record`), shared by the
//! `records` cargo-fuzz target (`fuzz/fuzz_targets/records.rs`, which includes this file) and
//! the corpus replay test (`crates/sys/tests/ring_fuzz_corpus.rs`). It lives here because the
//! codec's crate belongs to others and `flowstack-sys` takes `flowstack-api` as a dev-dependency
//! only.

use flowstack_api::record::{CommandRecord, EventRecord, RECORD_LEN};

/// Every 64-byte chunk of `data` (the last one zero-padded) decoded as a command and as an
/// event, as the daemon and the application read them from shared memory: decoding never
/// panics, and whatever decodes re-encodes to the very same bytes (the codec rejects every
/// byte it would not write back) and decodes again to the same record.
pub fn records(data: &[u8]) {
    for chunk in data.chunks(RECORD_LEN) {
        let mut b = [0u8; RECORD_LEN];
        b[..chunk.len()].copy_from_slice(chunk);
        let mut out = [0xa5u8; RECORD_LEN];
        if let Ok(c) = CommandRecord::decode(&b) {
            c.encode(&mut out);
            assert_eq!(out, b, "command {c:?} re-encodes differently");
            assert_eq!(CommandRecord::decode(&out), Ok(c));
        }
        out = [0xa5u8; RECORD_LEN];
        if let Ok(e) = EventRecord::decode(&b) {
            e.encode(&mut out);
            assert_eq!(out, b, "event {e:?} re-encodes differently");
            assert_eq!(EventRecord::decode(&out), Ok(e));
        }
    }
}
