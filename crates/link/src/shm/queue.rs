//! One queue pair of one side: the [`Device`] an engine owns.

use super::layout::Geometry;
use super::{ShmOptions, ShmStats};
use crate::{ChecksumCaps, Device, DeviceCaps, Instant, TxBatch};
use flowstack_sys::ring::{Bell, Consumer, Producer, RingError, Waited};
use flowstack_sys::{process, SharedRegion};
use flowstack_wire::rss::{queue_of, Toeplitz};
use flowstack_wire::Duration;
use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Queue pair `index` of one side of a (multi-queue) shm wire: the [`Device`] of one engine.
///
/// It transmits like a NIC with receive-side scaling on the peer's behalf: each frame goes to
/// the peer's receive queue `queue_of(hash_frame(frame), n)` under the symmetric Toeplitz key
/// (queue 0 for frames without a hash, such as ARP), through the ring from this engine to
/// that queue. It receives from the n rings that end at its own queue, one from each peer
/// engine, starting each batch at the next ring in turn. It is `Send`: move it to the thread
/// that runs its engine.
pub struct ShmQueue {
    pub(super) region: Arc<SharedRegion>,
    /// Rings from this engine to each of the peer's receive queues, by queue.
    tx: Vec<Producer>,
    /// The bells of the peer's receive queues, by queue.
    peer_bells: Vec<Bell>,
    /// Rings from each peer engine to this queue, by sender.
    rx: Vec<Consumer>,
    /// This queue's bell, which every peer engine rings.
    bell: Bell,
    /// The ring `recv_batch` drains first next time.
    next: usize,
    /// The RSS hash (absent with one queue: everything goes to queue 0).
    hasher: Option<Box<Toeplitz>>,
    index: usize,
    side: usize,
    opts: ShmOptions,
    stats: ShmStats,
    /// Shared by the queues of this side: the peer died or broke the protocol.
    down: Arc<AtomicBool>,
}

fn ring_err(e: RingError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl ShmQueue {
    /// Takes queue pair `index` of side `side` of the wire in `region`.
    pub(super) fn new(
        region: &Arc<SharedRegion>,
        g: Geometry,
        side: usize,
        index: usize,
        opts: ShmOptions,
        down: Arc<AtomicBool>,
    ) -> io::Result<Self> {
        let peer = 1 - side;
        let tx = (0..g.n)
            .map(|q| Producer::new(region.clone(), g.ring(side, index, q)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ring_err)?;
        let rx = (0..g.n)
            .map(|i| Consumer::new(region.clone(), g.ring(peer, i, index)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ring_err)?;
        let peer_bells = (0..g.n)
            .map(|q| Bell::new(region.clone(), g.bell(peer, q)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(ring_err)?;
        let bell = Bell::new(region.clone(), g.bell(side, index)).map_err(ring_err)?;
        Ok(Self {
            region: region.clone(),
            tx,
            peer_bells,
            rx,
            bell,
            next: 0,
            hasher: (g.n > 1).then(|| Box::new(Toeplitz::symmetric())),
            index,
            side,
            opts,
            stats: ShmStats::default(),
            down,
        })
    }

    /// Which queue pair of its side this is (0-based; engine `index` owns it).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Queue pairs per side.
    pub fn queues(&self) -> usize {
        self.rx.len()
    }

    /// Which side of the wire (0: the creator, 1: the attacher).
    pub fn side(&self) -> usize {
        self.side
    }

    /// Bytes of record data in each ring.
    pub fn ring_capacity(&self) -> usize {
        self.rx[0].capacity()
    }

    /// The wire's descriptor, to hand to the peer process.
    pub fn raw_fd(&self) -> RawFd {
        self.region.raw_fd()
    }

    /// This queue's counters (sum several with [`Iterator::sum`]).
    pub fn stats(&self) -> ShmStats {
        self.stats
    }

    /// The peer receive queue that `frame` goes to.
    #[inline]
    pub fn queue_for(&self, frame: &[u8]) -> usize {
        match &self.hasher {
            None => 0,
            // No hash (ARP, not IPv4): queue 0, as a NIC does.
            Some(h) => h
                .hash_frame(frame)
                .map_or(0, |h| queue_of(h, self.rx.len())),
        }
    }

    /// Appends `frame` to the ring to peer queue `q`; false if it was dropped (counted).
    #[inline]
    fn push(&mut self, q: usize, frame: &[u8]) -> bool {
        match self.tx[q].push(frame) {
            Ok(()) => true,
            Err(e) => {
                self.stats.tx_drops += 1;
                // Otherwise full, or larger than MAX_FRAME.
                if let RingError::Corrupt { .. } = e {
                    self.corrupt();
                }
                false
            }
        }
    }

    /// Hands up to `budget` frames of the ring from peer engine `i` to `sink`; returns how many.
    #[inline]
    fn drain(&mut self, i: usize, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let mut got = 0;
        let r = self.rx[i].recv(budget, |f| {
            got += 1;
            sink(f)
        });
        if r.is_err() {
            self.corrupt();
        }
        got
    }

    /// Is the peer process still there? (Checked only when idle; a syscall.)
    fn peer_alive(&self) -> bool {
        let pid = Geometry::pid(&self.region, 1 - self.side).load(Ordering::SeqCst);
        // 0: not attached yet.
        pid == 0 || process::is_alive(pid)
    }

    /// The peer broke the ring protocol: count it and take the link down (every queue of
    /// this side: the peer is not to be trusted any more).
    #[cold]
    fn corrupt(&mut self) {
        self.stats.corrupt += 1;
        self.down.store(true, Ordering::Relaxed);
    }
}

impl Device for ShmQueue {
    fn caps(&self) -> DeviceCaps {
        let mtu = self.opts.mtu;
        DeviceCaps {
            mtu,
            checksum: if self.opts.checksum_offload {
                ChecksumCaps::OFFLOADED
            } else {
                ChecksumCaps::SOFTWARE
            },
            max_tx_datagram: if self.opts.large_segments { 65535 } else { mtu },
            queues: self.rx.len(),
        }
    }

    /// Pushes each frame onto the ring to its peer queue, then publishes each ring it used
    /// with one store of `head` and rings that queue's bell if it sleeps.
    #[inline]
    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        let mut sent = 0;
        // Rings pushed onto (at most 64 queues: one bit each).
        let mut touched = 0u64;
        if self.hasher.is_none() {
            // One queue pair: one ring, nothing to hash.
            for f in batch.iter() {
                sent += usize::from(self.push(0, f));
            }
            touched = u64::from(sent > 0);
        } else {
            for f in batch.iter() {
                let q = self.queue_for(f);
                if self.push(q, f) {
                    sent += 1;
                    touched |= 1 << q;
                }
            }
        }
        self.stats.tx_frames += sent as u64;
        while touched != 0 {
            let q = touched.trailing_zeros() as usize;
            touched &= touched - 1;
            if self.tx[q].publish_with(&self.peer_bells[q]) {
                self.stats.wakeups += 1;
            }
        }
        sent
    }

    /// Drains the n incoming rings, starting one ring further each call (so no peer engine
    /// can starve another), up to `budget` frames in all; frames are handed over straight
    /// from the shared pages, and each ring is released with one store of `tail`.
    #[inline]
    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let n = self.rx.len();
        let got = if n == 1 {
            self.drain(0, budget, sink)
        } else {
            let start = self.next;
            self.next = if start + 1 == n { 0 } else { start + 1 };
            let mut got = 0;
            for k in 0..n {
                if got >= budget {
                    break;
                }
                let i = if start + k >= n {
                    start + k - n
                } else {
                    start + k
                };
                got += self.drain(i, budget - got, sink);
            }
            got
        };
        self.stats.rx_frames += got as u64;
        got
    }

    #[inline]
    fn rx_pending(&self, _now: Instant) -> bool {
        self.rx.iter().any(Consumer::pending)
    }

    /// Adaptive back-off: spin, then sleep on this queue's bell (which any peer engine rings)
    /// until a frame or the timeout.
    fn wait(&mut self, timeout: Duration) {
        match self.bell.wait(&self.rx, self.opts.spin, timeout) {
            Waited::Ready | Waited::SpunOut => {}
            Waited::Slept => {
                self.stats.sleeps += 1;
                if !self.rx.iter().any(Consumer::pending) && !self.peer_alive() {
                    self.down.store(true, Ordering::Relaxed);
                }
            }
        }
    }

    #[inline]
    fn link_down(&self) -> bool {
        self.down.load(Ordering::Relaxed)
    }
}

const _: () = {
    const fn send<T: Send>() {}
    send::<ShmQueue>();
};
