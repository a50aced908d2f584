//! An in-process point-to-point link between two devices (a virtual cable).
//!
//! Frames are copied into pooled buffers (a [`FrameQueue`] per direction), so a steady flow
//! allocates nothing; an engine's own transmission ([`Device::send_batch_take`]) moves the batch's
//! buffers to the peer instead, exchanging them for pool buffers, so no frame is copied on
//! the way (as a NIC's DMA costs the CPU nothing). Each direction holds at most `capacity`
//! frames; more are tail-dropped and counted, as a full NIC ring would.
//!
//! The pipe gathers ([`Device::can_gather`]): a gathered frame (headers + a reference to a
//! zero-copy payload, [`TxPayload`](crate::TxPayload)) crosses as it is, and [`Device::recv_batch_parts`] hands
//! the receiver the headers and the payload where it lies — one copy of the payload in all,
//! the receiver's into its receive buffer. The whole-frame receive calls flatten it first.

use crate::{Device, DeviceCaps, FrameQueue, Instant, PartsSink, TxBatch};
use std::cell::RefCell;
use std::rc::Rc;

/// Default frames queued per direction.
pub const DEFAULT_CAPACITY: usize = 4096;

#[derive(Debug)]
struct Shared {
    /// `queues[i]` holds frames travelling towards end `i`.
    queues: [FrameQueue; 2],
    caps: DeviceCaps,
}

/// One end of a [`pipe`].
#[derive(Debug, Clone)]
pub struct PipeEnd {
    shared: Rc<RefCell<Shared>>,
    side: usize,
    /// Where a gathered frame is flattened for a whole-frame receiver (kept: no allocation
    /// once warm).
    flat: Vec<u8>,
}

/// Creates a connected pair of ends with the given capabilities and per-direction capacity.
pub fn pipe(caps: DeviceCaps, capacity: usize) -> (PipeEnd, PipeEnd) {
    let shared = Rc::new(RefCell::new(Shared {
        queues: [FrameQueue::new(capacity), FrameQueue::new(capacity)],
        caps,
    }));
    (
        PipeEnd {
            shared: shared.clone(),
            side: 0,
            flat: Vec::new(),
        },
        PipeEnd {
            shared,
            side: 1,
            flat: Vec::new(),
        },
    )
}

impl PipeEnd {
    /// Frames this end sent that were dropped because the peer's queue was full.
    pub fn tx_drops(&self) -> u64 {
        self.shared.borrow().queues[1 - self.side].drops()
    }
}

impl Device for PipeEnd {
    fn caps(&self) -> DeviceCaps {
        self.shared.borrow().caps
    }

    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let mut s = self.shared.borrow_mut();
        let q = &mut s.queues[self.side];
        // A receiver of whole frames: gathered ones are flattened (the copy a gathering
        // receiver saves).
        (0..budget)
            .take_while(|_| q.pop_whole(&mut self.flat, sink))
            .count()
    }

    fn recv_batch_parts(&mut self, _now: Instant, budget: usize, sink: &mut PartsSink) -> usize {
        let mut s = self.shared.borrow_mut();
        let q = &mut s.queues[self.side];
        (0..budget).take_while(|_| q.pop_parts(sink)).count()
    }

    fn can_gather(&self) -> bool {
        true
    }

    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        let mut s = self.shared.borrow_mut();
        let q = &mut s.queues[1 - self.side];
        // A tail crosses by reference (a reference count, no copy).
        batch
            .iter_parts()
            .filter(|(f, tail)| q.push_copy(f, *tail))
            .count()
    }

    fn send_batch_take(&mut self, _now: Instant, batch: &mut TxBatch) -> usize {
        let mut s = self.shared.borrow_mut();
        let q = &mut s.queues[1 - self.side];
        (0..batch.len()).filter(|&i| q.push_taken(batch, i)).count()
    }

    fn rx_pending(&self, _now: Instant) -> bool {
        !self.shared.borrow().queues[self.side].is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TxPayload;

    #[test]
    fn frames_cross_in_order_and_overflow_is_counted() {
        let (mut a, mut b) = pipe(DeviceCaps::ETHERNET, 3);
        let mut batch = TxBatch::new();
        for i in 0..5u8 {
            batch.push(20)[0] = i;
        }
        assert_eq!(a.send_batch(Instant::ZERO, &batch), 3);
        assert_eq!(a.tx_drops(), 2);
        assert!(b.rx_pending(Instant::ZERO));
        let mut got = vec![];
        assert_eq!(b.recv_batch(Instant::ZERO, 10, &mut |f| got.push(f[0])), 3);
        assert_eq!(got, vec![0, 1, 2]);
        assert!(!a.rx_pending(Instant::ZERO));
    }

    #[test]
    fn taken_frames_cross_unchanged_and_overflow_is_counted() {
        let (mut a, mut b) = pipe(DeviceCaps::ETHERNET, 3);
        let mut batch = TxBatch::new();
        for round in 0..3u8 {
            for i in 0..5u8 {
                let f = batch.push(20 + i as usize);
                f.fill(i);
                f[0] = round;
            }
            assert_eq!(a.send_batch_take(Instant::ZERO, &mut batch), 3);
            batch.clear();
            let mut got = vec![];
            b.recv_batch(Instant::ZERO, 10, &mut |f| {
                got.push((f[0], f.len(), f[f.len() - 1]))
            });
            assert_eq!(got, vec![(round, 20, 0), (round, 21, 1), (round, 22, 2)]);
        }
        assert_eq!(a.tx_drops(), 6);
    }

    #[test]
    fn a_gathered_frame_crosses_by_reference_and_whole_receivers_get_it_flattened() {
        let o = std::sync::Arc::new(b"PAYLOAD!".to_vec());
        let d: crate::SharedBytes = o.clone();
        let (mut a, mut b) = pipe(DeviceCaps::ETHERNET, 8);
        assert!(a.can_gather());
        let mut batch = TxBatch::new();
        for taken in [true, false] {
            batch.push(3).copy_from_slice(b"abc");
            batch
                .push_gather(2, TxPayload::new(d.clone(), 1, 6).unwrap())
                .copy_from_slice(b"hd");
            if taken {
                assert_eq!(a.send_batch_take(Instant::ZERO, &mut batch), 2);
            } else {
                assert_eq!(a.send_batch(Instant::ZERO, &batch), 2);
            }
            batch.clear();
            assert_eq!(std::sync::Arc::strong_count(&o), 3, "in flight: referenced");
            let mut got = vec![];
            b.recv_batch_parts(Instant::ZERO, 1, &mut |h, t, _| {
                got.push((h.to_vec(), t.to_vec()))
            });
            b.recv_batch_parts(Instant::ZERO, 1, &mut |h, t, _| {
                // Not copied: the tail is the owner's memory.
                assert_eq!(t.as_ptr(), o[1..].as_ptr());
                got.push((h.to_vec(), t.to_vec()))
            });
            assert_eq!(
                got,
                vec![
                    (b"abc".to_vec(), vec![]),
                    (b"hd".to_vec(), b"AYLOAD".to_vec())
                ]
            );
            assert_eq!(
                std::sync::Arc::strong_count(&o),
                2,
                "released once received"
            );
        }
        // A receiver of whole frames gets the flattened frame.
        batch
            .push_gather(2, TxPayload::new(d.clone(), 0, 3).unwrap())
            .copy_from_slice(b"xy");
        a.send_batch_take(Instant::ZERO, &mut batch);
        let mut whole = vec![];
        b.recv_batch(Instant::ZERO, 4, &mut |f| whole.push(f.to_vec()));
        assert_eq!(whole, vec![b"xyPAY".to_vec()]);
        assert_eq!(std::sync::Arc::strong_count(&o), 2);
    }
}
