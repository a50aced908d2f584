//! cargo-fuzz target: see `flowstack_stack::fuzzing::tcp_conn` (the harness is shared with the
//! corpus replay in `cargo test`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    flowstack_stack::fuzzing::tcp_conn(data);
});
