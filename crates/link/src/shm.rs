//! The shm wire: a `Device` connecting engines in different processes through shared memory.
//!
//! A sealed memfd ([`SharedRegion`]) holds, for each direction, a lock-free single-producer /
//! single-consumer byte ring of variable-length frame records ([`flowstack_sys::ring`]; the
//! layout, the memory orderings and the checks on what the peer wrote are described there).
//! Producers publish a whole batch with one store of `head`; consumers hand frames to the
//! engine straight from the shared pages (no copy) and release a batch with one store of
//! `tail`. An idle consumer spins briefly, then sleeps on a futex that the producer rings only
//! when the consumer said it is waiting, so an idle stack does not burn a core.
//!
//! It is a trusted in-memory link: by default it declares checksum offload (as Linux loopback
//! does) and accepts 64 KiB TCP segments (no segmentation needed); both can be turned off.
//! Each side records its process id; a side whose peer process has died reports the link down,
//! and so does a side whose peer broke the ring protocol (counted in [`ShmStats::corrupt`]).
//!
//! The one `unsafe` left here adopts the descriptor number [`ShmWire::attach`] is given.
#![allow(unsafe_code)]

use crate::{ChecksumCaps, Device, DeviceCaps, Instant, TxBatch};
use flowstack_sys::ring::{self, Consumer, Producer, RingError, RingLayout, Waited};
use flowstack_sys::{process, SharedRegion};
use flowstack_wire::Duration;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

const MAGIC: u64 = 0x666c_6f77_7368_6d31; // "flowshm1"
/// Bytes of each direction's ring (a power of two).
pub const RING_BYTES: usize = 16 << 20;
/// Largest frame the wire carries (a 64 KiB IP datagram plus Ethernet header).
pub const MAX_FRAME: usize = 65535 + 14;
/// The header page: magic (u64 at 0), ring size (u64 at 8), each side's process id (u32 at
/// 16 and 20). The two rings follow, side 0 → side 1 first.
const HEADER: usize = 4096;
const LEN: usize = HEADER + 2 * ring::ring_bytes(RING_BYTES);

/// Ring of direction `d` (0: side 0 → side 1).
fn layout(d: usize) -> RingLayout {
    RingLayout {
        offset: HEADER + d * ring::ring_bytes(RING_BYTES),
        capacity: RING_BYTES,
        max_record: MAX_FRAME,
    }
}

/// What the wire offers; each optimisation can be switched off for ablation.
#[derive(Debug, Clone, Copy)]
pub struct ShmOptions {
    /// Declare checksum offload (skip checksums on this trusted link).
    pub checksum_offload: bool,
    /// Accept TCP segments up to 64 KiB (segmentation offload).
    pub large_segments: bool,
    /// MTU announced when large segments are off.
    pub mtu: usize,
    /// Spin this long before sleeping when idle.
    pub spin: Duration,
}

impl Default for ShmOptions {
    fn default() -> Self {
        Self {
            checksum_offload: true,
            large_segments: true,
            mtu: 1500,
            spin: Duration::from_micros(500),
        }
    }
}

/// Counters of one side.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShmStats {
    /// Frames sent.
    pub tx_frames: u64,
    /// Frames dropped because the ring was full or the frame too large.
    pub tx_drops: u64,
    /// Frames received.
    pub rx_frames: u64,
    /// Times the consumer went to sleep.
    pub sleeps: u64,
    /// Times the producer woke the peer.
    pub wakeups: u64,
    /// Times the peer's side of the shared memory held a value the ring protocol cannot
    /// produce (the link is then down).
    pub corrupt: u64,
}

/// One side of the shm wire: a thin [`Device`] over two [`flowstack_sys::ring`]s, ours to
/// produce on and the peer's to consume from.
pub struct ShmWire {
    region: Arc<SharedRegion>,
    tx: Producer,
    rx: Consumer,
    side: usize,
    opts: ShmOptions,
    stats: ShmStats,
    peer_dead: std::cell::Cell<bool>,
}

fn ring_err(e: RingError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl ShmWire {
    /// Creates a wire in a new memfd; this process is side 0. Pass the returned descriptor
    /// (inheritable) to the peer, which calls [`ShmWire::attach`].
    pub fn create(opts: ShmOptions) -> io::Result<Self> {
        let region = SharedRegion::create("flowstack-shm", LEN)?;
        // The peer process inherits it.
        region.set_inheritable(true)?;
        let word64 = |o| region.atomic_u64(o).expect("header inside the region");
        word64(0).store(MAGIC, Ordering::Relaxed);
        word64(8).store(RING_BYTES as u64, Ordering::Relaxed);
        Self::with_region(region, 0, opts)
    }

    /// Attaches to a wire created by another process (side 1), given the inherited
    /// descriptor, which this wire then owns (and closes).
    pub fn attach(fd: RawFd, opts: ShmOptions) -> io::Result<Self> {
        // SAFETY: per this function's contract the caller hands over a descriptor it owns and
        // will not use again (inherited from the creator and named on the command line).
        Self::attach_fd(unsafe { OwnedFd::from_raw_fd(fd) }, opts)
    }

    /// [`ShmWire::attach`] for a descriptor already owned (e.g. received over a unix socket).
    pub fn attach_fd(fd: OwnedFd, opts: ShmOptions) -> io::Result<Self> {
        let region = SharedRegion::from_fd(fd)?;
        let ok = region.len() == LEN
            && region.atomic_u64(0).map(|m| m.load(Ordering::Relaxed)) == Some(MAGIC)
            && region.atomic_u64(8).map(|r| r.load(Ordering::Relaxed)) == Some(RING_BYTES as u64);
        if !ok {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a flowstack shm wire",
            ));
        }
        Self::with_region(region, 1, opts)
    }

    fn with_region(region: SharedRegion, side: usize, opts: ShmOptions) -> io::Result<Self> {
        let region = Arc::new(region);
        let tx = Producer::new(region.clone(), layout(side)).map_err(ring_err)?;
        let rx = Consumer::new(region.clone(), layout(1 - side)).map_err(ring_err)?;
        let w = Self {
            region,
            tx,
            rx,
            side,
            opts,
            stats: ShmStats::default(),
            peer_dead: std::cell::Cell::new(false),
        };
        w.pid(side).store(std::process::id(), Ordering::SeqCst);
        Ok(w)
    }

    /// The descriptor to hand to the peer process.
    pub fn raw_fd(&self) -> RawFd {
        self.region.raw_fd()
    }

    /// Counters.
    pub fn stats(&self) -> ShmStats {
        self.stats
    }

    fn pid(&self, side: usize) -> &AtomicU32 {
        self.region
            .atomic_u32(16 + 4 * side)
            .expect("header inside the region")
    }

    /// Is the peer process still there? (Checked only when idle; a syscall.)
    fn peer_alive(&self) -> bool {
        let pid = self.pid(1 - self.side).load(Ordering::SeqCst);
        // 0: not attached yet.
        pid == 0 || process::is_alive(pid)
    }

    /// The peer broke the ring protocol: count it and take the link down.
    #[cold]
    fn corrupt(&mut self) {
        self.stats.corrupt += 1;
        self.peer_dead.set(true);
    }
}

impl Device for ShmWire {
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
            queues: 1,
        }
    }

    fn send_batch(&mut self, _now: Instant, batch: &TxBatch) -> usize {
        let mut sent = 0;
        for f in batch.iter() {
            match self.tx.push(f) {
                Ok(()) => sent += 1,
                Err(RingError::Corrupt { .. }) => {
                    self.stats.tx_drops += 1;
                    self.corrupt();
                }
                // Full, or larger than MAX_FRAME.
                Err(_) => self.stats.tx_drops += 1,
            }
        }
        if sent > 0 {
            self.stats.tx_frames += sent as u64;
            if self.tx.publish() {
                self.stats.wakeups += 1;
            }
        }
        sent
    }

    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        let r = self.rx.recv(budget, |f| {
            n += 1;
            sink(f)
        });
        self.stats.rx_frames += n as u64;
        if r.is_err() {
            self.corrupt();
        }
        n
    }

    fn rx_pending(&self, _now: Instant) -> bool {
        self.rx.pending()
    }

    /// Adaptive back-off: spin, then sleep on the futex until a frame or the timeout.
    fn wait(&mut self, timeout: Duration) {
        match self.rx.wait(self.opts.spin, timeout) {
            Waited::Ready | Waited::SpunOut => {}
            Waited::Slept => {
                self.stats.sleeps += 1;
                if !self.rx.pending() && !self.peer_alive() {
                    self.peer_dead.set(true);
                }
            }
        }
    }

    fn link_down(&self) -> bool {
        self.peer_dead.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;

    fn pair() -> (ShmWire, ShmWire) {
        let a = ShmWire::create(ShmOptions::default()).unwrap();
        // Duplicate the descriptor so each side owns one.
        let dup = a.region.fd().try_clone_to_owned().unwrap();
        let b = ShmWire::attach(dup.into_raw_fd(), ShmOptions::default()).unwrap();
        (a, b)
    }

    #[test]
    fn frames_cross_in_order_across_wrap_around() {
        let (mut a, mut b) = pair();
        let mut batch = TxBatch::new();
        let mut expect = 0u32;
        let mut got = 0u32;
        // Push well over 16 MiB through the ring in batches, with odd sizes so the records
        // hit the end of the ring at every possible offset.
        for round in 0..2000u32 {
            batch.clear();
            for k in 0..8u32 {
                let len = 60 + ((round * 8 + k) * 977 % 9000) as usize;
                let f = batch.push(len);
                f[..4].copy_from_slice(&(round * 8 + k).to_be_bytes());
                f[len - 1] = 0xab;
            }
            assert_eq!(a.send_batch(Instant::ZERO, &batch), 8);
            b.recv_batch(Instant::ZERO, 1000, &mut |f| {
                assert_eq!(u32::from_be_bytes(f[..4].try_into().unwrap()), got);
                assert_eq!(*f.last().unwrap(), 0xab);
                got += 1;
            });
            expect += 8;
        }
        assert_eq!(got, expect);
        assert!(!b.rx_pending(Instant::ZERO), "empty after draining");
    }

    #[test]
    fn full_ring_drops_and_counts_then_recovers() {
        let (mut a, mut b) = pair();
        let mut batch = TxBatch::new();
        for _ in 0..300 {
            batch.push(65000);
        }
        let sent = a.send_batch(Instant::ZERO, &batch);
        assert!(sent < 300 && sent > 200, "sent {sent}");
        assert_eq!(a.stats().tx_drops as usize, 300 - sent);
        let n = b.recv_batch(Instant::ZERO, 10_000, &mut |_| {});
        assert_eq!(n, sent);
        assert_eq!(a.send_batch(Instant::ZERO, &batch), sent, "space is back");
    }

    #[test]
    fn oversized_frame_is_dropped() {
        let (mut a, _b) = pair();
        let mut batch = TxBatch::new();
        batch.push(MAX_FRAME + 1);
        assert_eq!(a.send_batch(Instant::ZERO, &batch), 0);
        assert_eq!(a.stats().tx_drops, 1);
    }

    #[test]
    fn idle_wait_sleeps_and_returns_at_timeout() {
        let (mut a, _b) = pair();
        a.wait(Duration::from_millis(5));
        assert_eq!(a.stats().sleeps, 1);
        assert!(!a.link_down(), "the peer (this process) is alive");
    }

    #[test]
    fn a_peer_breaking_the_ring_takes_the_link_down() {
        let (mut a, mut b) = pair();
        let mut batch = TxBatch::new();
        batch.push(100);
        assert_eq!(a.send_batch(Instant::ZERO, &batch), 1);
        // The peer claims a head beyond the ring: b must not read past it.
        let head = a.region.atomic_u64(layout(0).offset).unwrap();
        head.store(RING_BYTES as u64 * 3, Ordering::SeqCst);
        assert!(!b.link_down());
        assert_eq!(
            b.recv_batch(Instant::ZERO, 10, &mut |_| panic!("no frame")),
            0
        );
        assert!(b.link_down());
        assert_eq!(b.stats().corrupt, 1);
    }

    #[test]
    fn attach_refuses_what_is_not_a_wire() {
        let other = SharedRegion::create("not-a-wire", LEN).unwrap();
        let fd = other.fd().try_clone_to_owned().unwrap();
        let e = ShmWire::attach_fd(fd, ShmOptions::default()).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "no magic");
        let small = SharedRegion::create("small", 4096).unwrap();
        let fd = small.fd().try_clone_to_owned().unwrap();
        assert!(
            ShmWire::attach_fd(fd, ShmOptions::default()).is_err(),
            "wrong size"
        );
    }
}
