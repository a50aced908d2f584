//! Segments cut for an emitter that gathers (`poll_transmit_gather` with `gathers`): a
//! segment that starts in a zero-copy send's shared range never runs into the next buffer,
//! so it can leave as a reference instead of being gathered into a scratch copy.

#![allow(dead_code, unused_imports)] // the shared fixture has more than these tests use

include!("fixture/mod.rs");

use flowstack_tcp::sendq::{ExtBuf, SharedOwner};
use std::sync::Arc;

/// (payload length, whether it lies in one shared range) of each data segment sent.
fn transmit(f: &mut Fx, gathers: bool) -> Vec<(usize, bool)> {
    let mut v = Vec::new();
    f.c.poll_transmit_gather(f.now, &mut f.ctr, gathers, &mut |r, at| {
        if !r.payload.is_empty() {
            v.push((r.payload.len(), at.is_some()));
        }
    });
    v
}

/// Two zero-copy buffers (different owners) of 2000 and 3000 bytes, then 500 copied bytes,
/// on a connection with a 1460-byte MSS and room for all of them.
fn queued() -> Fx {
    let mut f = Fx::established();
    for n in [2000usize, 3000] {
        let owner: SharedOwner = Arc::new(vec![7u8; n]);
        let buf = ExtBuf::shared(owner, 0, n).unwrap();
        assert!(f.c.send_zc(buf).unwrap().is_some());
    }
    assert_eq!(f.c.send(&[1u8; 500]).unwrap(), 500);
    f
}

#[test]
fn a_gathering_emitter_gets_segments_cut_at_zero_copy_range_ends() {
    let mut f = queued();
    let segs = transmit(&mut f, true);
    // 2000 (between one and two segments): two halves, not 1460 and a runt. 3000: a full
    // segment, then the 1540 left in two halves. The copied bytes last, from the ring.
    assert_eq!(
        segs,
        [
            (1000, true),
            (1000, true),
            (1460, true),
            (770, true),
            (770, true),
            (500, false)
        ]
    );
}

#[test]
fn other_emitters_get_full_segments_across_buffers() {
    let mut f = queued();
    let segs = transmit(&mut f, false);
    // Full segments regardless of where the buffers end: the straddling ones are copies.
    assert_eq!(
        segs,
        [(1460, true), (1460, false), (1460, true), (1120, false)]
    );
}
