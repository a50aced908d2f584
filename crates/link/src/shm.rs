//! The shm wire: a `Device` connecting engines in different processes through shared memory.
//!
//! A memfd-backed region holds, for each direction, a lock-free single-producer /
//! single-consumer byte ring of variable-length frame records. Producers publish a whole batch
//! with one release store of `head`; consumers hand frames to the engine straight from the
//! shared pages (no copy) and release a batch with one store of `tail`. An idle consumer spins
//! briefly, then sleeps on a futex that the producer rings only when the consumer said it is
//! waiting, so an idle stack does not burn a core.
//!
//! It is a trusted in-memory link: by default it declares checksum offload (as Linux loopback
//! does) and accepts 64 KiB TCP segments (no segmentation needed); both can be turned off.
//! Each side records its process id; a side whose peer process has died reports the link down.
#![allow(unsafe_code)]

use crate::sys::cvt;
use crate::{ChecksumCaps, Device, DeviceCaps, Instant, TxBatch};
use flowstack_wire::Duration;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const MAGIC: u64 = 0x666c_6f77_7368_6d31; // "flowshm1"
/// Bytes of each direction's ring (a power of two).
pub const RING_BYTES: usize = 16 << 20;
/// Largest frame the wire carries (a 64 KiB IP datagram plus Ethernet header).
pub const MAX_FRAME: usize = 65535 + 14;
const HEADER: usize = 4096;
const SKIP: u32 = u32::MAX;

/// Per-direction control block, producer and consumer fields on separate cache lines.
#[repr(C, align(64))]
struct Ctl {
    head: AtomicU64,
    _p0: [u8; 56],
    tail: AtomicU64,
    _p1: [u8; 56],
    waiting: AtomicU32,
    doorbell: AtomicU32,
    _p2: [u8; 56],
}

#[repr(C)]
struct Header {
    magic: u64,
    ring_bytes: u64,
    pid: [AtomicU32; 2],
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
}

/// One side of the shm wire.
pub struct ShmWire {
    fd: OwnedFd,
    base: NonNull<u8>,
    len: usize,
    side: usize,
    opts: ShmOptions,
    stats: ShmStats,
    peer_dead: std::cell::Cell<bool>,
}

// SAFETY: the mapping is process-shared memory accessed only through atomics (control) and
// through the SPSC protocol (data); a ShmWire is used by one thread at a time.
unsafe impl Send for ShmWire {}

fn futex(word: &AtomicU32, op: i32, val: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let tsp = ts
        .as_ref()
        .map(|t| t as *const libc::timespec)
        .unwrap_or(std::ptr::null());
    // SAFETY: `word` is a valid, aligned 32-bit word in shared memory (FUTEX_WAIT/WAKE without
    // FUTEX_PRIVATE, because both processes map it).
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), op, val, tsp, 0usize, 0u32);
    }
}

impl ShmWire {
    /// Creates a wire in a new memfd; this process is side 0. Pass the returned descriptor
    /// (inheritable) to the peer, which calls [`ShmWire::attach`].
    pub fn create(opts: ShmOptions) -> io::Result<Self> {
        let name = std::ffi::CString::new("flowstack-shm").unwrap();
        // SAFETY: memfd_create with a valid name; the fd is owned right away. No MFD_CLOEXEC:
        // the peer process inherits it.
        let raw = cvt(unsafe { libc::memfd_create(name.as_ptr(), 0) })?;
        // SAFETY: fresh descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let len = HEADER + 2 * (std::mem::size_of::<Ctl>() + RING_BYTES);
        // SAFETY: ftruncate on our memfd.
        cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
        let w = Self::map(fd, 0, opts)?;
        let h = w.header();
        // SAFETY: the region is new and zero-filled; we are its only user yet.
        unsafe {
            let hp = w.base.as_ptr() as *mut Header;
            (*hp).magic = MAGIC;
            (*hp).ring_bytes = RING_BYTES as u64;
        }
        h.pid[0].store(std::process::id(), Ordering::SeqCst);
        Ok(w)
    }

    /// Attaches to a wire created by another process (side 1), given the inherited descriptor.
    pub fn attach(fd: RawFd, opts: ShmOptions) -> io::Result<Self> {
        // SAFETY: the caller passes a descriptor it owns (inherited from the creator).
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let w = Self::map(fd, 1, opts)?;
        let h = w.header();
        if h.magic != MAGIC || h.ring_bytes != RING_BYTES as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not a flowstack shm wire",
            ));
        }
        h.pid[1].store(std::process::id(), Ordering::SeqCst);
        Ok(w)
    }

    fn map(fd: OwnedFd, side: usize, opts: ShmOptions) -> io::Result<Self> {
        let len = HEADER + 2 * (std::mem::size_of::<Ctl>() + RING_BYTES);
        // SAFETY: maps the whole memfd shared; unmapped in Drop.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            fd,
            base: NonNull::new(p as *mut u8).expect("non-null mapping"),
            len,
            side,
            opts,
            stats: ShmStats::default(),
            peer_dead: std::cell::Cell::new(false),
        })
    }

    /// The descriptor to hand to the peer process.
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Counters.
    pub fn stats(&self) -> ShmStats {
        self.stats
    }

    fn header(&self) -> &Header {
        // SAFETY: the header lies at the start of the mapping; its fields are read-only after
        // creation except the atomics.
        unsafe { &*(self.base.as_ptr() as *const Header) }
    }

    /// Control block and data of direction `d` (0: side 0 → side 1). The control block is
    /// reached through atomics only, so it is handed out unbound from `self`'s borrow.
    fn ring<'a>(&self, d: usize) -> (&'a Ctl, *mut u8) {
        let off = HEADER + d * (std::mem::size_of::<Ctl>() + RING_BYTES);
        // SAFETY: offsets computed from the fixed layout lie inside the mapping, which lives
        // until Drop; callers use the reference only inside a method of this ShmWire. Ctl is
        // 64-byte aligned within a page-aligned mapping and all its fields are atomics.
        unsafe {
            let ctl = &*(self.base.as_ptr().add(off) as *const Ctl);
            (
                ctl,
                self.base.as_ptr().add(off + std::mem::size_of::<Ctl>()),
            )
        }
    }

    fn tx<'a>(&self) -> (&'a Ctl, *mut u8) {
        self.ring(self.side)
    }

    fn rx<'a>(&self) -> (&'a Ctl, *mut u8) {
        self.ring(1 - self.side)
    }

    /// Is the peer process still there? (Checked only when idle; a syscall.)
    fn peer_alive(&self) -> bool {
        let pid = self.header().pid[1 - self.side].load(Ordering::SeqCst);
        if pid == 0 {
            return true; // not attached yet
        }
        // SAFETY: kill with signal 0 only checks for existence.
        let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
        r == 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }
}

fn rec_len(n: usize) -> usize {
    (4 + n + 7) & !7
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
        let (ctl, data) = self.tx();
        let mask = (RING_BYTES - 1) as u64;
        let tail = ctl.tail.load(Ordering::Acquire);
        let mut head = ctl.head.load(Ordering::Relaxed);
        let mut sent = 0;
        for f in batch.iter() {
            let need = rec_len(f.len()) as u64;
            let pos = (head & mask) as usize;
            let to_end = (RING_BYTES - pos) as u64;
            // A record never wraps: if it does not fit before the end, skip to the start.
            let total = if need > to_end { to_end + need } else { need };
            if f.len() > MAX_FRAME || head + total - tail > RING_BYTES as u64 {
                self.stats.tx_drops += 1;
                continue;
            }
            // SAFETY: [pos, pos+need) (or the skip marker at pos and the record at 0) lies in
            // the ring and in the free region the consumer will not read until `head` moves.
            unsafe {
                if need > to_end {
                    (data.add(pos) as *mut u32).write(SKIP);
                    head += to_end;
                }
                let p = (head & mask) as usize;
                (data.add(p) as *mut u32).write(f.len() as u32);
                std::ptr::copy_nonoverlapping(f.as_ptr(), data.add(p + 4), f.len());
            }
            head += need;
            sent += 1;
        }
        if sent > 0 {
            ctl.head.store(head, Ordering::Release);
            self.stats.tx_frames += sent as u64;
            if ctl.waiting.load(Ordering::SeqCst) != 0 {
                ctl.doorbell.fetch_add(1, Ordering::SeqCst);
                futex(&ctl.doorbell, libc::FUTEX_WAKE, 1, None);
                self.stats.wakeups += 1;
            }
        }
        sent
    }

    fn recv_batch(&mut self, _now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let (ctl, data) = self.rx();
        let mask = (RING_BYTES - 1) as u64;
        let head = ctl.head.load(Ordering::Acquire);
        let mut tail = ctl.tail.load(Ordering::Relaxed);
        let mut n = 0;
        while tail != head && n < budget {
            let pos = (tail & mask) as usize;
            // SAFETY: the producer published every record below `head`; the length word and
            // the frame lie inside the ring.
            let len = unsafe { (data.add(pos) as *const u32).read() };
            if len == SKIP {
                tail += (RING_BYTES - pos) as u64;
                continue;
            }
            let len = (len as usize).min(MAX_FRAME);
            // SAFETY: as above; the producer will not overwrite it until `tail` moves past it.
            let frame = unsafe { std::slice::from_raw_parts(data.add(pos + 4), len) };
            sink(frame);
            tail += rec_len(len) as u64;
            n += 1;
        }
        if n > 0 || tail != ctl.tail.load(Ordering::Relaxed) {
            ctl.tail.store(tail, Ordering::Release);
        }
        self.stats.rx_frames += n as u64;
        n
    }

    fn rx_pending(&self, _now: Instant) -> bool {
        let (ctl, _) = self.rx();
        ctl.head.load(Ordering::Acquire) != ctl.tail.load(Ordering::Relaxed)
    }

    /// Adaptive back-off: spin, then sleep on the futex until a frame or the timeout.
    fn wait(&mut self, timeout: Duration) {
        let start = std::time::Instant::now();
        let spin = self.opts.spin.min(timeout);
        while start.elapsed() < spin {
            if self.rx_pending(Instant::ZERO) {
                return;
            }
            std::hint::spin_loop();
        }
        let rest = timeout.saturating_sub(start.elapsed());
        if rest.is_zero() {
            return;
        }
        let (ctl, _) = self.rx();
        let bell = ctl.doorbell.load(Ordering::SeqCst);
        ctl.waiting.store(1, Ordering::SeqCst);
        if !self.rx_pending(Instant::ZERO) {
            self.stats.sleeps += 1;
            futex(&ctl.doorbell, libc::FUTEX_WAIT, bell, Some(rest));
        }
        ctl.waiting.store(0, Ordering::SeqCst);
        if !self.rx_pending(Instant::ZERO) && !self.peer_alive() {
            self.peer_dead.set(true);
        }
    }

    fn link_down(&self) -> bool {
        self.peer_dead.get()
    }
}

impl Drop for ShmWire {
    fn drop(&mut self) {
        // SAFETY: unmaps the region mapped in `map`; nothing borrowed from it outlives self.
        unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (ShmWire, ShmWire) {
        let a = ShmWire::create(ShmOptions::default()).unwrap();
        // SAFETY (test): duplicate the descriptor so each side owns one.
        let dup = unsafe { libc::dup(a.raw_fd()) };
        let b = ShmWire::attach(dup, ShmOptions::default()).unwrap();
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
}
