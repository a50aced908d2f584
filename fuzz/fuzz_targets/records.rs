//! The daemon's ring record codec (`flowstack_api::record`) on arbitrary bytes: decoding never
//! panics, and what decodes re-encodes to the same bytes. The harness is shared with the
//! corpus replay test in crates/sys/tests.
#![no_main]

#[path = "../../crates/sys/tests/harness/records.rs"]
mod harness;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| harness::records(data));
