//! In-order data handed to a reader before the receive buffer (`on_segment_to`): what the
//! buffer holds goes first, then the payload, and only what the reader leaves is queued; a
//! reader's limit (`set_read_limit`) bounds the window offered.

#![allow(dead_code, unused_imports)] // the shared fixture has more than these tests use

include!("fixture/mod.rs");

impl Fx {
    /// The peer's next in-order segment of `payload`, offered to a reader that takes at most
    /// `take` bytes in all; returns each offer's (first byte, length) and what was taken.
    fn deliver(&mut self, payload: &[u8], mut take: usize) -> Vec<((u8, usize), usize)> {
        let mut seen = Vec::new();
        let s = seg(self.peer, SeqNum(OUR_ISN + 1), Flags::ACK, payload);
        self.c
            .on_segment_to(self.now, &s, &mut self.ctr, &mut |d: &[u8]| {
                let k = d.len().min(take);
                take -= k;
                seen.push(((d[0], d.len()), k));
                k
            });
        self.peer += payload.len();
        seen
    }
}

#[test]
fn what_the_reader_leaves_is_queued_and_offered_first_next_time() {
    let mut f = Fx::established();
    let a: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    // Room for 600: the rest is offered once more, declined, and queued.
    let seen = f.deliver(&a, 600);
    assert_eq!(seen, [((0, 1000), 600), ((a[600], 400), 0)]);
    assert_eq!(f.c.recv_queue(), 400);
    // The next segment: the 400 queued bytes are offered first, then the new payload.
    let b = vec![9u8; 300];
    let seen = f.deliver(&b, usize::MAX);
    assert_eq!(seen, [((a[600], 400), 400), ((9, 300), 300)]);
    assert_eq!(f.c.recv_queue(), 0, "nothing entered the buffer");
    // Everything counts as received: the ACK covers all 1300 bytes.
    let out = f.poll();
    assert_eq!(out.last().map(|o| o.ack), Some(f.peer));
}

#[test]
fn a_reader_that_takes_nothing_leaves_the_usual_path() {
    let mut f = Fx::established();
    let seen = f.deliver(&[1u8; 500], 0);
    assert_eq!(seen, [((1, 500), 0)]);
    assert_eq!(f.c.recv_queue(), 500);
    // Queued bytes not taken: the new payload is not offered ahead of them.
    let seen = f.deliver(&[2u8; 100], 0);
    assert_eq!(seen, [((1, 500), 0)]);
    assert_eq!(f.c.recv_queue(), 600);
    let mut out = [0u8; 600];
    assert_eq!(f.c.recv(&mut out), Ok(600));
    assert!(out[..500].iter().all(|&b| b == 1) && out[500..].iter().all(|&b| b == 2));
}

/// The peer's next in-order segments, `total` bytes in 1000-byte pieces, all taken by the
/// reader; returns the window of the ACK that follows.
fn take_all(f: &mut Fx, total: usize) -> u16 {
    for _ in 0..total / 1000 {
        f.deliver(&[5u8; 1000], usize::MAX);
    }
    let out = f.poll();
    let last = out.last().expect("an ACK");
    assert_eq!(last.ack, f.peer);
    last.window
}

/// A reader that can take 10,000 more bytes: what it takes counts against that, so the
/// window's right edge stays where it was offered (it never moves left) instead of moving
/// on as the emptied buffer would let it; raising the limit announces the larger window at
/// once. Without a limit the same bytes leave the full window offered.
#[test]
fn the_readers_limit_bounds_the_window() {
    let mut free = Fx::established();
    assert_eq!(
        take_all(&mut free, 30_000),
        65535,
        "no limit: the buffer is empty"
    );

    let mut f = Fx::established();
    assert!(f.c.set_read_limit(10_000));
    assert!(!f.c.set_read_limit(10_000), "unchanged");
    assert!(f.poll().is_empty(), "a smaller limit is not announced");
    assert_eq!(
        take_all(&mut f, 30_000),
        65535 - 30_000,
        "the edge stayed put"
    );
    assert_eq!(f.c.recv_queue(), 0, "the reader took every byte");
    // Room again: announced at once, up to the buffer.
    assert!(f.c.set_read_limit(1 << 20));
    let out = f.poll();
    assert_eq!(out.len(), 1, "one window update");
    assert_eq!(out[0].window, 65535);
}
