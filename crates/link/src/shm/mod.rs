//! The shm wire: `Device`s connecting engines in two processes through shared memory, with one
//! or several queue pairs per side.
//!
//! # Rings
//! A sealed memfd ([`SharedRegion`]) holds lock-free single-producer / single-consumer byte
//! rings of variable-length frame records ([`flowstack_sys::ring`]; the layout, the memory
//! orderings and the checks on what the peer wrote are described there). Producers publish a
//! whole batch with one store of `head` per ring; consumers hand frames to the engine straight
//! from the shared pages (no copy) and release a batch with one store of `tail` per ring.
//!
//! # One queue pair or n
//! [`ShmWire`] is the wire of two single-engine processes: one ring each way. [`ShmMulti`]
//! joins two processes that each run `n` engines (one per core), each engine owning one queue
//! pair of its side as a [`ShmQueue`] (a `Send` [`Device`] to move to the engine's thread).
//! `ShmWire` is exactly the `n = 1` case.
//!
//! The transmitting side plays the NIC's receive-side scaling for the peer: a frame that
//! engine `i` of side A sends goes to receive queue `q = queue_of(hash_frame(frame), n)` of
//! side B ([`flowstack_wire::rss`], symmetric Toeplitz key, 128-entry round-robin indirection
//! table), and frames without a hash (ARP, non-IPv4) go to queue 0, as a NIC sends them.
//! Because the key is symmetric, both directions of a flow land on the same queue index on
//! each side, so the engine that owns a flow on one side talks to the engine that owns it on
//! the other.
//!
//! To keep every ring single-producer/single-consumer the rings form a mesh: one ring for each
//! (sending engine, receiving queue) pair in each direction, n² per direction. Receive queue
//! `q` drains its n incoming rings, starting one ring further at each
//! [`Device::recv_batch`] and stopping at the budget, so no sender starves another. When both
//! sides steer flows by the same hash (the per-core runtime does), almost all traffic runs on
//! the n "diagonal" rings (engine `i` to queue `i`): the others carry ARP and flows that an
//! engine opened outside its own queue.
//!
//! # Sleeping and waking
//! An idle queue spins briefly, then sleeps on its own futex *bell* ([`Bell`](flowstack_sys::ring::Bell)): it reads the
//! bell's doorbell word, raises the bell's `waiting` flag, checks the `head` of each of its n
//! incoming rings once more and only then sleeps. Every producer into that queue publishes its
//! ring's `head` and then checks the same `waiting` flag, ringing the bell if it is raised. The
//! `head` stores, the `waiting` store and the loads after each are sequentially consistent, so
//! for each producer either the queue sees its frames before sleeping or the producer sees the
//! queue waiting and wakes it: whichever of the n producers sends, no wake-up is lost. Busy
//! queues make no system call; idle ones use no CPU.
//!
//! # Memory
//! [`ShmOptions::ring_memory`] bytes of ring data per direction (default [`RING_BYTES`],
//! 16 MiB) are split over that direction's n² rings: each ring gets the largest power of two
//! not above `ring_memory / n²`, but at least [`MIN_RING_BYTES`] (256 KiB: three 64 KiB TSO
//! frames and then some) and at most [`MAX_RING_BYTES`]. With the default, the region
//! (both directions, plus a header page or a few) is:
//!
//! | n | rings per direction | bytes per ring | region |
//! |---|---|---|---|
//! | 1 | 1 | 16 MiB | 32 MiB |
//! | 2 | 4 | 4 MiB | 32 MiB |
//! | 4 | 16 | 1 MiB | 32 MiB |
//! | 8 | 64 | 256 KiB | 32 MiB |
//! | 16 | 256 | 256 KiB (floor) | 128 MiB |
//! | 32 | 1024 | 256 KiB (floor) | 512 MiB |
//! | 64 ([`MAX_QUEUES`]) | 4096 | 256 KiB (floor) | 2 GiB |
//!
//! These are sizes of the memfd, not memory in use: the kernel backs a page of it only once a
//! side writes there, and a ring touches its pages only as far as its traffic has gone round
//! it. The diagonal rings of a busy wire fill in completely; a ring that has carried a few
//! ARP frames holds a page or two.
//!
//! # A trusted link that does not trust its peer
//! It is a trusted in-memory link: by default it declares checksum offload (as Linux loopback
//! does) and accepts 64 KiB TCP segments (no segmentation needed); both can be turned off.
//! Each side records its process id; a side whose peer process has died reports the link down,
//! and so does a side whose peer broke the ring protocol (counted in [`ShmStats::corrupt`]):
//! every queue of that side then reports it.
//!
//! The one `unsafe` left here adopts the descriptor number [`ShmWire::attach`] and
//! [`ShmMulti::attach`] are given.
#![allow(unsafe_code)]

mod layout;
mod queue;

pub use queue::ShmQueue;

use crate::{Device, DeviceCaps, Instant, TxBatch};
use flowstack_sys::{process, SharedRegion};
use flowstack_wire::Duration;
use layout::Geometry;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Bytes of ring data per direction by default ([`ShmOptions::ring_memory`]); with one queue
/// pair, the size of each direction's ring.
pub const RING_BYTES: usize = 16 << 20;
/// Largest frame the wire carries (a 64 KiB IP datagram plus Ethernet header).
pub const MAX_FRAME: usize = 65535 + 14;
/// Most queue pairs per side (the transmit path keeps one bit per destination queue).
pub const MAX_QUEUES: usize = 64;
/// Smallest ring, whatever the queue count and [`ShmOptions::ring_memory`].
pub const MIN_RING_BYTES: usize = 256 << 10;
/// Largest ring.
pub const MAX_RING_BYTES: usize = 1 << 30;

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
    /// Bytes of ring data per direction, split over the n² rings of that direction (see
    /// "Memory" in the [module docs](self)). Used when creating a wire; the attaching side
    /// takes the sizes the creator chose.
    pub ring_memory: usize,
}

impl Default for ShmOptions {
    fn default() -> Self {
        Self {
            checksum_offload: true,
            large_segments: true,
            mtu: 1500,
            spin: Duration::from_micros(500),
            ring_memory: RING_BYTES,
        }
    }
}

/// Counters of one queue pair (or, summed, of a side).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
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

impl std::ops::AddAssign for ShmStats {
    fn add_assign(&mut self, o: Self) {
        self.tx_frames += o.tx_frames;
        self.tx_drops += o.tx_drops;
        self.rx_frames += o.rx_frames;
        self.sleeps += o.sleeps;
        self.wakeups += o.wakeups;
        self.corrupt += o.corrupt;
    }
}

impl std::ops::Add for ShmStats {
    type Output = Self;
    fn add(mut self, o: Self) -> Self {
        self += o;
        self
    }
}

impl std::iter::Sum for ShmStats {
    fn sum<I: Iterator<Item = Self>>(iter: I) -> Self {
        iter.fold(Self::default(), |a, b| a + b)
    }
}

/// One side of a multi-queue shm wire, before its queues go to their engines.
pub struct ShmMulti {
    region: Arc<SharedRegion>,
    geometry: Geometry,
    queues: Vec<ShmQueue>,
}

impl std::fmt::Debug for ShmMulti {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmMulti")
            .field("region", &self.region)
            .field("queues", &self.geometry.n)
            .field("ring_capacity", &self.geometry.cap)
            .finish()
    }
}

impl ShmMulti {
    /// Creates a wire of `n` queue pairs per side (1 to [`MAX_QUEUES`]) in a new memfd; this
    /// process is side 0. Pass the returned descriptor (inheritable) to the peer, which calls
    /// [`ShmMulti::attach`].
    pub fn create(n: usize, opts: ShmOptions) -> io::Result<Self> {
        let g = Geometry::new(n, opts.ring_memory)?;
        let region = SharedRegion::create("flowstack-shm", g.len())?;
        // The peer process inherits it.
        region.set_inheritable(true)?;
        g.write_header(&region);
        Self::with_region(region, g, 0, opts)
    }

    /// Attaches to a wire created by another process (side 1), given the inherited
    /// descriptor, which this wire then owns (and closes).
    pub fn attach(fd: RawFd, opts: ShmOptions) -> io::Result<Self> {
        // SAFETY: per this function's contract the caller hands over a descriptor it owns and
        // will not use again (inherited from the creator and named on the command line).
        Self::attach_fd(unsafe { OwnedFd::from_raw_fd(fd) }, opts)
    }

    /// [`ShmMulti::attach`] for a descriptor already owned (e.g. received over a unix socket).
    /// Fails with `InvalidData` unless the region is a wire, exactly as large as its header
    /// says, and with `AddrInUse` if another live process holds side 1.
    pub fn attach_fd(fd: OwnedFd, opts: ShmOptions) -> io::Result<Self> {
        let region = SharedRegion::from_fd(fd)?;
        let g = Geometry::read_header(&region)?;
        let held = Geometry::pid(&region, 1).load(Ordering::SeqCst);
        if held != 0 && held != std::process::id() && process::is_alive(held) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("shm wire already attached by process {held}"),
            ));
        }
        Self::with_region(region, g, 1, opts)
    }

    fn with_region(
        region: SharedRegion,
        g: Geometry,
        side: usize,
        opts: ShmOptions,
    ) -> io::Result<Self> {
        let region = Arc::new(region);
        let down = Arc::new(AtomicBool::new(false));
        let queues = (0..g.n)
            .map(|i| ShmQueue::new(&region, g, side, i, opts, down.clone()))
            .collect::<io::Result<Vec<_>>>()?;
        Geometry::pid(&region, side).store(std::process::id(), Ordering::SeqCst);
        Ok(Self {
            region,
            geometry: g,
            queues,
        })
    }

    /// Queue pairs per side.
    pub fn queues(&self) -> usize {
        self.geometry.n
    }

    /// Bytes of record data in each ring.
    pub fn ring_capacity(&self) -> usize {
        self.geometry.cap
    }

    /// Bytes of the whole shared region.
    pub fn region_bytes(&self) -> usize {
        self.region.len()
    }

    /// The descriptor to hand to the peer process (it stays open while any queue lives).
    pub fn raw_fd(&self) -> RawFd {
        self.region.raw_fd()
    }

    /// The queue pairs, in order: queue `i` is engine `i`'s device.
    pub fn into_queues(self) -> Vec<ShmQueue> {
        self.queues
    }
}

/// One side of a single-queue shm wire (the `n = 1` [`ShmMulti`]): one ring each way.
pub struct ShmWire {
    q: ShmQueue,
}

impl ShmWire {
    /// Creates a wire in a new memfd; this process is side 0. Pass the returned descriptor
    /// (inheritable) to the peer, which calls [`ShmWire::attach`].
    pub fn create(opts: ShmOptions) -> io::Result<Self> {
        Self::single(ShmMulti::create(1, opts)?)
    }

    /// Creates a wire of `n` queue pairs per side: [`ShmMulti::create`].
    pub fn create_multi(n: usize, opts: ShmOptions) -> io::Result<ShmMulti> {
        ShmMulti::create(n, opts)
    }

    /// Attaches to a wire created by another process (side 1), given the inherited
    /// descriptor, which this wire then owns (and closes).
    pub fn attach(fd: RawFd, opts: ShmOptions) -> io::Result<Self> {
        Self::single(ShmMulti::attach(fd, opts)?)
    }

    /// [`ShmWire::attach`] for a descriptor already owned (e.g. received over a unix socket).
    pub fn attach_fd(fd: OwnedFd, opts: ShmOptions) -> io::Result<Self> {
        Self::single(ShmMulti::attach_fd(fd, opts)?)
    }

    fn single(m: ShmMulti) -> io::Result<Self> {
        let n = m.queues();
        match <[ShmQueue; 1]>::try_from(m.into_queues()) {
            Ok([q]) => Ok(Self { q }),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("a shm wire of {n} queue pairs: attach it with ShmMulti"),
            )),
        }
    }

    /// The descriptor to hand to the peer process.
    pub fn raw_fd(&self) -> RawFd {
        self.q.raw_fd()
    }

    /// Counters.
    pub fn stats(&self) -> ShmStats {
        self.q.stats()
    }
}

impl Device for ShmWire {
    #[inline]
    fn caps(&self) -> DeviceCaps {
        self.q.caps()
    }
    #[inline]
    fn send_batch(&mut self, now: Instant, batch: &TxBatch) -> usize {
        self.q.send_batch(now, batch)
    }
    #[inline]
    fn recv_batch(&mut self, now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        self.q.recv_batch(now, budget, sink)
    }
    #[inline]
    fn rx_pending(&self, now: Instant) -> bool {
        self.q.rx_pending(now)
    }
    #[inline]
    fn wait(&mut self, timeout: Duration) {
        self.q.wait(timeout)
    }
    #[inline]
    fn link_down(&self) -> bool {
        self.q.link_down()
    }
}

#[cfg(test)]
mod tests;
