//! The consumer of a shared-memory ring whose producing peer writes garbage into the ring
//! between operations (`flowstack_sys::fuzzing::ring_peer`): typed errors, never a panic or an
//! access outside the region.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| flowstack_sys::fuzzing::ring_peer(data));
