//! cargo-fuzz target: see `flowstack_stack::fuzzing::wire_roundtrip` (the harness is shared with the
//! corpus replay in `cargo test`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    flowstack_stack::fuzzing::wire_roundtrip(data);
});
