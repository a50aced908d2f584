//! A queue of frames passed on in memory, for devices that are cables inside one process:
//! the pipe (one queue per direction) and a loopback interface (one queue back to itself).
//!
//! Frames are copied into pooled buffers ([`FrameQueue::push_copy`]) or take the sender's
//! batch buffers in exchange for pooled ones ([`FrameQueue::push_taken`], no copy); a
//! gathered frame's tail ([`TxPayload`]) crosses by reference and is released only once the
//! receiver is done with it ([`FrameQueue::pop_parts`]), so a pool that reuses memory only
//! when it holds the last reference cannot refill it under a frame in flight. At most
//! `capacity` frames wait; more are tail-dropped and counted, as a full NIC ring would.
//! Nothing is allocated once the pool is warm.

use crate::{PartsSink, RxMeta, TxBatch, TxPayload};
use std::collections::VecDeque;

/// A buffer, the length of the frame's bytes in it (buffers keep their largest length, see
/// [`TxBatch`]) and, for a gathered frame, its tail.
type Queued = (Vec<u8>, usize, Option<TxPayload>);

/// Frames in order, with a pool of buffers and a drop counter.
#[derive(Debug)]
pub struct FrameQueue {
    frames: VecDeque<Queued>,
    pool: Vec<Vec<u8>>,
    capacity: usize,
    drops: u64,
}

impl FrameQueue {
    /// An empty queue holding at most `capacity` frames.
    pub fn new(capacity: usize) -> Self {
        Self {
            frames: VecDeque::new(),
            pool: Vec::new(),
            capacity,
            drops: 0,
        }
    }

    /// Frames waiting.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// True if no frame waits.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Frames dropped because the queue was full.
    pub fn drops(&self) -> u64 {
        self.drops
    }

    /// True (and the drop counted) if the queue is full.
    fn full(&mut self) -> bool {
        let full = self.frames.len() >= self.capacity;
        self.drops += u64::from(full);
        full
    }

    /// Queues a copy of `head` followed by `tail` (by reference); false if full (dropped).
    pub fn push_copy(&mut self, head: &[u8], tail: Option<&TxPayload>) -> bool {
        if self.full() {
            return false;
        }
        let mut buf = self.pool.pop().unwrap_or_default();
        if buf.len() < head.len() {
            buf.resize(head.len(), 0);
        }
        buf[..head.len()].copy_from_slice(head);
        self.frames.push_back((buf, head.len(), tail.cloned()));
        true
    }

    /// Queues frame `i` of `batch` by taking its buffer (and tail) in exchange for a pooled
    /// one: no copy. False if full (dropped; the frame stays in the batch).
    pub fn push_taken(&mut self, batch: &mut TxBatch, i: usize) -> bool {
        if self.full() {
            return false;
        }
        let mut buf = self.pool.pop().unwrap_or_default();
        let (len, tail) = batch.take_frame_parts(i, &mut buf);
        self.frames.push_back((buf, len, tail));
        true
    }

    /// Hands the oldest frame to `sink` as headers and tail (empty for a whole frame), then
    /// releases the tail's reference and recycles the buffer; false if none waits.
    pub fn pop_parts(&mut self, sink: &mut PartsSink) -> bool {
        let Some((buf, len, tail)) = self.frames.pop_front() else {
            return false;
        };
        sink(
            &buf[..len],
            tail.as_ref().map_or(&[][..], |t| t.bytes()),
            RxMeta::default(),
        );
        drop(tail);
        self.pool.push(buf);
        true
    }

    /// Hands the oldest frame to `sink` whole: a gathered one is flattened into `flat` (the
    /// copy a gathering receiver saves); false if none waits.
    pub fn pop_whole(&mut self, flat: &mut Vec<u8>, sink: &mut dyn FnMut(&[u8])) -> bool {
        self.pop_parts(&mut |head, tail, _| {
            if tail.is_empty() {
                sink(head)
            } else {
                flat.clear();
                flat.extend_from_slice(head);
                flat.extend_from_slice(tail);
                sink(flat);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SharedBytes;
    use std::sync::Arc;

    /// A gathered frame's source stays referenced (so its pool cannot reuse it) until the
    /// receiver has consumed the frame, whether it was copied in or taken.
    #[test]
    fn a_gathered_source_is_held_until_the_frame_is_consumed() {
        let o = Arc::new(b"0123456789".to_vec());
        let d: SharedBytes = o.clone();
        let mut q = FrameQueue::new(2);
        let mut b = TxBatch::new();
        b.push_gather(2, TxPayload::new(d.clone(), 2, 5).unwrap())
            .copy_from_slice(b"hd");
        assert!(q.push_taken(&mut b, 0));
        b.clear();
        assert!(q.push_copy(b"xy", Some(&TxPayload::new(d, 0, 1).unwrap())));
        assert!(!q.push_copy(b"zz", None), "full");
        assert_eq!(q.drops(), 1);
        assert_eq!(Arc::strong_count(&o), 3, "two frames in flight");
        let mut got = vec![];
        assert!(q.pop_parts(&mut |h, t, _| got.push([h, t].concat())));
        assert_eq!(Arc::strong_count(&o), 2, "released once consumed");
        let mut flat = vec![];
        assert!(q.pop_whole(&mut flat, &mut |f| got.push(f.to_vec())));
        assert_eq!(Arc::strong_count(&o), 1);
        assert_eq!(got, vec![b"hd23456".to_vec(), b"xy0".to_vec()]);
        assert!(!q.pop_parts(&mut |_, _, _| panic!("empty")));
        assert!(q.is_empty());
    }
}
