//! An in-process point-to-point link between two devices (a virtual cable).
//!
//! Frames are copied into buffers from a pool shared by both ends, so a steady flow allocates
//! nothing; an engine's own transmission ([`Device::send_batch_take`]) moves the batch's
//! buffers to the peer instead, exchanging them for pool buffers, so no frame is copied on
//! the way (as a NIC's DMA costs the CPU nothing). Each direction holds at most `capacity` frames; more are tail-dropped and counted,
//! as a full NIC ring would.

use crate::{Device, DeviceCaps, Instant, TxBatch};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;

/// Default frames queued per direction.
pub const DEFAULT_CAPACITY: usize = 4096;

#[derive(Debug)]
struct Shared {
    /// `queues[i]` holds frames travelling towards end `i`: a buffer and the frame's length
    /// (buffers keep their largest length, see [`TxBatch`]).
    queues: [VecDeque<(Vec<u8>, usize)>; 2],
    pool: Vec<Vec<u8>>,
    capacity: usize,
    drops: [u64; 2],
    caps: DeviceCaps,
}

/// One end of a [`pipe`].
#[derive(Debug, Clone)]
pub struct PipeEnd {
    shared: Rc<RefCell<Shared>>,
    side: usize,
}

/// Creates a connected pair of ends with the given capabilities and per-direction capacity.
pub fn pipe(caps: DeviceCaps, capacity: usize) -> (PipeEnd, PipeEnd) {
    let shared = Rc::new(RefCell::new(Shared {
        queues: [VecDeque::new(), VecDeque::new()],
        pool: Vec::new(),
        capacity,
        drops: [0; 2],
        caps,
    }));
    (
        PipeEnd {
            shared: shared.clone(),
            side: 0,
        },
        PipeEnd { shared, side: 1 },
    )
}

impl PipeEnd {
    /// Frames this end sent that were dropped because the peer's queue was full.
    pub fn tx_drops(&self) -> u64 {
        self.shared.borrow().drops[1 - self.side]
    }
}

impl Device for PipeEnd {
    fn caps(&self) -> DeviceCaps {
        self.shared.borrow().caps
    }

    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < budget {
            let Some((frame, len)) = self.shared.borrow_mut().queues[self.side].pop_front() else {
                break;
            };
            sink(&frame[..len]);
            self.shared.borrow_mut().pool.push(frame);
            n += 1;
        }
        n
    }

    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        let mut s = self.shared.borrow_mut();
        let s = &mut *s;
        let peer = 1 - self.side;
        let mut sent = 0;
        for f in batch.iter() {
            if s.queues[peer].len() >= s.capacity {
                s.drops[peer] += 1;
                continue;
            }
            let mut buf = s.pool.pop().unwrap_or_default();
            if buf.len() < f.len() {
                buf.resize(f.len(), 0);
            }
            buf[..f.len()].copy_from_slice(f);
            s.queues[peer].push_back((buf, f.len()));
            sent += 1;
        }
        sent
    }

    fn send_batch_take(&mut self, _now: Instant, batch: &mut TxBatch) -> usize {
        let mut s = self.shared.borrow_mut();
        let s = &mut *s;
        let peer = 1 - self.side;
        let mut sent = 0;
        for i in 0..batch.len() {
            if s.queues[peer].len() >= s.capacity {
                s.drops[peer] += 1;
                continue;
            }
            let mut buf = s.pool.pop().unwrap_or_default();
            let len = batch.take_frame(i, &mut buf);
            s.queues[peer].push_back((buf, len));
            sent += 1;
        }
        sent
    }

    fn rx_pending(&self, _now: Instant) -> bool {
        !self.shared.borrow().queues[self.side].is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
