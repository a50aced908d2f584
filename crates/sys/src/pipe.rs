//! A fused connection's byte pipe: two byte rings (one per direction) in one sealed memfd
//! that both applications of a loopback connection map, so its bytes go from one program to
//! the other in two copies (writer → pipe, pipe → reader) with the daemon only signalling
//! (Solaris's TCP fusion and Onload's loopback acceleration do the same).
//!
//! Layout (little-endian, offsets in bytes): a 4 KiB header, then direction 0's ring, then
//! direction 1's, each [`Pipe::cap`] bytes. The header holds the magic and the capacity, and
//! per direction `d` (at `64 + 256·d`) on cache lines of their own: `head` (bytes ever
//! written, by the writer), `tail` (bytes ever read, by readers), the `rwait`/`wwait` flags a
//! side sets before it sleeps, the writers' lock, and `closed` (set by the daemon when the
//! reading end is gone).
//!
//! Every value read from the header is untrusted (the other program writes it): a head more
//! than `cap` ahead of the tail, or behind it, is [`PipeError::Corrupt`], never an access
//! outside the mapping. Bytes are only copied in and out ([`SharedRegion::read_at`]).
//!
//! # Wake-ups
//! A reader that finds nothing says in `rwait` who is to be woken and looks again
//! ([`Pipe::readable_arm`]); a writer publishes its bytes, then takes `rwait` (the `wake` of
//! [`Pipe::write`]) and wakes whom it names. `rwait` is a [`Wake`] word: bit 0 asks the
//! daemon (which writes the reader's placeholder token, or signals its wake-up channel), and
//! the bits above name the one application that sleeps on its own wake-up channel and may be
//! signalled there directly by the writer, with no daemon between them. A second reader
//! that arms while another one's name is there turns bit 0 on, so both are woken. The same
//! with `wwait` (daemon only) for a writer that finds no room. Both sides fence (`SeqCst`)
//! between their store and their load, so one of them always sees the other (no lost
//! wake-up).
//!
//! # Several processes
//! Readers claim bytes with a compare-and-swap on `tail` after copying them (a losing reader
//! copies again from the new tail), so two processes reading one connection each get whole,
//! distinct parts of the stream, as in the kernel. Writers serialise on a lock word, taken
//! for the copy only; a lock held for longer than [`LOCK_PATIENCE`] (its holder died
//! mid-copy) is [`PipeError::Stuck`].

use crate::region::SharedRegion;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The header's size: the rings start here.
pub const HEADER: usize = 4096;
/// "FSPIPE01".
pub const MAGIC: u64 = u64::from_le_bytes(*b"FSPIPE01");
/// Smallest and largest ring capacity.
pub const MIN_CAP: u64 = 4096;
/// Largest ring capacity (per direction).
pub const MAX_CAP: u64 = 64 << 20;
/// How long a writer waits for another process's writer lock before giving up.
pub const LOCK_PATIENCE: Duration = Duration::from_secs(2);

const AT_MAGIC: usize = 0;
const AT_CAP: usize = 8;
const fn dir_base(d: usize) -> usize {
    64 + 256 * d
}
const HEAD: usize = 0;
const TAIL: usize = 64;
const RWAIT: usize = 128;
const WWAIT: usize = 132;
const CLOSED: usize = 136;
const WLOCK: usize = 192;

/// What went wrong with a pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PipeError {
    /// The header holds values no honest peer writes.
    Corrupt,
    /// Another process holds the writers' lock for too long.
    Stuck,
}

impl std::fmt::Display for PipeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PipeError::Corrupt => "fused pipe corrupt",
            PipeError::Stuck => "fused pipe's writer lock held too long",
        })
    }
}

impl std::error::Error for PipeError {}

/// Who a reader waiting on an empty pipe wants woken (the `rwait` word): bit 0 — through
/// the daemon; bits 1.. — the application with that wake-up id, directly on its wake-up
/// channel. The word is written by the other program too: an id there is only a hint (the
/// writer signals the channel it was given for that id, or asks the daemon).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Wake(pub u32);

impl Wake {
    /// Nobody asked.
    pub const NONE: Wake = Wake(0);
    /// Through the daemon.
    pub const DAEMON: Wake = Wake(1);

    /// The application with wake-up id `id` (1..2^31), directly; the daemon for 0.
    pub fn direct(id: u32) -> Wake {
        if id == 0 || id > u32::MAX >> 1 {
            Wake::DAEMON
        } else {
            Wake(id << 1)
        }
    }

    /// The direct id named, if any.
    pub fn id(self) -> Option<u32> {
        Some(self.0 >> 1).filter(|&i| i != 0)
    }

    /// Whether the daemon is to be asked.
    pub fn daemon(self) -> bool {
        self.0 & 1 != 0
    }

    /// This request joined by `who`'s: one direct id at most; a second, different one
    /// turns to the daemon (which wakes whoever holds the socket).
    pub fn with(self, who: Wake) -> Wake {
        match (self.id(), who.id()) {
            (None, _) => Wake(self.0 | who.0),
            (Some(a), Some(b)) if a == b => Wake(self.0 | who.0),
            (Some(_), None) => Wake(self.0 | who.0),
            (Some(_), Some(_)) => Wake(self.0 | 1),
        }
    }
}

/// A mapped pipe (both directions).
#[derive(Debug)]
pub struct Pipe {
    region: SharedRegion,
    cap: u64,
}

impl Pipe {
    /// A new pipe of `cap` bytes per direction in a sealed memfd (the daemon's side).
    pub fn create(cap: u64) -> io::Result<Arc<Self>> {
        if !(MIN_CAP..=MAX_CAP).contains(&cap) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("pipe capacity {cap} outside {MIN_CAP}..={MAX_CAP}"),
            ));
        }
        let region = SharedRegion::create("flowstack-pipe", HEADER + 2 * cap as usize)?;
        let p = Self { region, cap };
        p.word64(AT_MAGIC).store(MAGIC, Ordering::Relaxed);
        p.word64(AT_CAP).store(cap, Ordering::Release);
        Ok(Arc::new(p))
    }

    /// Maps a pipe received from the daemon and checks its header against its size; the
    /// descriptor is closed once mapped.
    pub fn open(fd: OwnedFd) -> io::Result<Arc<Self>> {
        let region = SharedRegion::map_fd(fd)?;
        let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, format!("pipe: {m}"));
        let magic = region
            .atomic_u64(AT_MAGIC)
            .map(|a| a.load(Ordering::Acquire));
        if magic != Some(MAGIC) {
            return Err(bad("bad magic"));
        }
        let cap = region
            .atomic_u64(AT_CAP)
            .map_or(0, |a| a.load(Ordering::Acquire));
        if !(MIN_CAP..=MAX_CAP).contains(&cap) || region.len() as u64 != HEADER as u64 + 2 * cap {
            return Err(bad("capacity does not match its size"));
        }
        Ok(Arc::new(Self { region, cap }))
    }

    /// The descriptor to pass on (only a pipe made by [`Pipe::create`] keeps one).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.region.fd()
    }

    /// Bytes per direction.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    fn word64(&self, at: usize) -> &AtomicU64 {
        self.region.atomic_u64(at).expect("header word inside")
    }
    fn word32(&self, at: usize) -> &AtomicU32 {
        self.region.atomic_u32(at).expect("header word inside")
    }
    fn head(&self, d: usize) -> &AtomicU64 {
        self.word64(dir_base(d & 1) + HEAD)
    }
    fn tail(&self, d: usize) -> &AtomicU64 {
        self.word64(dir_base(d & 1) + TAIL)
    }
    fn flag(&self, d: usize, which: usize) -> &AtomicU32 {
        self.word32(dir_base(d & 1) + which)
    }

    /// Head and tail of direction `d`, checked: `head - tail` within `0..=cap`.
    fn span(&self, d: usize) -> Result<(u64, u64), PipeError> {
        let t = self.tail(d).load(Ordering::Acquire);
        let h = self.head(d).load(Ordering::Acquire);
        match h.checked_sub(t) {
            Some(n) if n <= self.cap => Ok((h, t)),
            _ => Err(PipeError::Corrupt),
        }
    }

    /// Bytes waiting in direction `d`.
    pub fn readable(&self, d: usize) -> Result<u64, PipeError> {
        self.span(d).map(|(h, t)| h - t)
    }

    /// Free room in direction `d`.
    pub fn room(&self, d: usize) -> Result<u64, PipeError> {
        self.readable(d).map(|n| self.cap - n)
    }

    /// [`Pipe::readable`]; when nothing waits, asks the writer for a wake-up of `who`
    /// (`rwait`, see [`Wake`]) and looks again, so bytes written after this call are
    /// announced.
    pub fn readable_arm(&self, d: usize, who: Wake) -> Result<u64, PipeError> {
        let n = self.readable(d)?;
        if n > 0 {
            return Ok(n);
        }
        let _ = self
            .flag(d, RWAIT)
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
                Some(Wake(cur).with(who).0)
            });
        fence(Ordering::SeqCst);
        self.readable(d)
    }

    /// Whether direction `d` has room for a quarter of its capacity; when not, asks the
    /// reader for a wake-up (`wwait`) and looks again.
    pub fn writable_arm(&self, d: usize) -> Result<bool, PipeError> {
        if self.room(d)? * 4 >= self.cap {
            return Ok(true);
        }
        self.flag(d, WWAIT).store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        Ok(self.room(d)? * 4 >= self.cap)
    }

    /// Copies as much of `data` as fits into direction `d`; returns how many bytes, and
    /// whom the reader asked to be woken (the caller wakes them; [`Wake::NONE`] if nobody).
    /// When nothing fits, the writer's wake-up is asked for (`wwait`) and the room looked at
    /// again before `Ok((0, Wake::NONE))` is returned.
    pub fn write(&self, d: usize, data: &[u8]) -> Result<(usize, Wake), PipeError> {
        if data.is_empty() {
            return Ok((0, Wake::NONE));
        }
        loop {
            let n = self.write_once(d, data)?;
            if n > 0 {
                fence(Ordering::SeqCst);
                let wake = Wake(self.flag(d, RWAIT).swap(0, Ordering::SeqCst));
                return Ok((n, wake));
            }
            self.flag(d, WWAIT).store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            if self.room(d)? == 0 {
                return Ok((0, Wake::NONE));
            }
        }
    }

    /// One copy under the writers' lock.
    fn write_once(&self, d: usize, data: &[u8]) -> Result<usize, PipeError> {
        let lock = self.flag(d, WLOCK);
        let since = Instant::now();
        while lock
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            if since.elapsed() > LOCK_PATIENCE {
                return Err(PipeError::Stuck);
            }
            std::thread::yield_now();
        }
        let r = self.write_locked(d, data);
        lock.store(0, Ordering::Release);
        r
    }

    fn write_locked(&self, d: usize, data: &[u8]) -> Result<usize, PipeError> {
        let (h, t) = self.span(d)?;
        let n = (self.cap - (h - t)).min(data.len() as u64) as usize;
        self.copy(d, h, n, |at, k, done| {
            let _ = self.region.write_at(at, &data[done..done + k]);
        });
        self.head(d).store(h + n as u64, Ordering::Release);
        Ok(n)
    }

    /// Runs `f(offset in the region, length, bytes before)` over the (at most two) pieces of
    /// `n` bytes from stream position `pos` in direction `d`'s ring.
    fn copy(&self, d: usize, pos: u64, n: usize, mut f: impl FnMut(usize, usize, usize)) {
        let base = HEADER + (d & 1) * self.cap as usize;
        let mut done = 0;
        while done < n {
            let at = ((pos + done as u64) % self.cap) as usize;
            let k = (self.cap as usize - at).min(n - done);
            f(base + at, k, done);
            done += k;
        }
    }

    /// Copies the next bytes of direction `d` into `buf`; with `peek` they stay. Returns how
    /// many, and whether the writer asked for a wake-up (after a read that freed room).
    pub fn read(&self, d: usize, buf: &mut [u8], peek: bool) -> Result<(usize, bool), PipeError> {
        loop {
            let (h, t) = self.span(d)?;
            let n = (h - t).min(buf.len() as u64) as usize;
            if n == 0 {
                return Ok((0, false));
            }
            self.copy(d, t, n, |at, k, done| {
                let _ = self.region.read_at(at, &mut buf[done..done + k]);
            });
            if peek {
                return Ok((n, false));
            }
            // Claim what was copied; another process that read the same bytes first wins.
            if self
                .tail(d)
                .compare_exchange(t, t + n as u64, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                fence(Ordering::SeqCst);
                let kick = self.flag(d, WWAIT).swap(0, Ordering::SeqCst) != 0;
                return Ok((n, kick));
            }
        }
    }

    /// The daemon: the reading end of direction `d` is gone; writes fail from now on.
    pub fn close_reader(&self, d: usize) {
        self.flag(d, CLOSED).store(1, Ordering::Release);
    }

    /// Whether the reading end of direction `d` is gone.
    pub fn reader_closed(&self, d: usize) -> bool {
        self.flag(d, CLOSED).load(Ordering::Acquire) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cap: u64) -> (Arc<Pipe>, Arc<Pipe>) {
        let p = Pipe::create(cap).unwrap();
        let fd = rustix::io::dup(p.fd()).unwrap();
        (p, Pipe::open(fd).unwrap())
    }

    /// Bytes written on one mapping come out of the other in order, across the ring's wrap,
    /// and each direction is its own stream.
    #[test]
    fn bytes_cross_in_order_and_wrap() {
        let (a, b) = pair(4096);
        let mut sent = 0u32;
        let mut got = 0u32;
        let mut buf = vec![0u8; 3000];
        for _ in 0..20 {
            let chunk: Vec<u8> = (0..2500).map(|i| (sent + i) as u8).collect();
            let (n, _) = a.write(0, &chunk).unwrap();
            sent += n as u32;
            let (m, _) = b.read(0, &mut buf, false).unwrap();
            for &x in &buf[..m] {
                assert_eq!(x, got as u8);
                got += 1;
            }
        }
        assert!(got > 40_000, "{got}");
        assert_eq!(b.readable(1).unwrap(), 0);
        assert_eq!(a.room(1).unwrap(), 4096);
    }

    /// A full ring takes nothing and asks for a wake-up; the read that frees room says so,
    /// and a write to a reader that asked says so too.
    #[test]
    fn wake_ups_are_asked_and_told() {
        let (a, b) = pair(4096);
        assert_eq!(a.write(1, &[7u8; 5000]).unwrap(), (4096, Wake::NONE));
        assert_eq!(a.write(1, &[7u8; 10]).unwrap(), (0, Wake::NONE));
        let mut buf = [0u8; 100];
        assert_eq!(b.read(1, &mut buf, true).unwrap(), (100, false), "peek");
        assert_eq!(b.read(1, &mut buf, false).unwrap(), (100, true));
        assert_eq!(b.read(1, &mut buf, false).unwrap(), (100, false));
        let mut big = vec![0u8; 8192];
        b.read(1, &mut big, false).unwrap();
        assert_eq!(b.readable_arm(1, Wake::DAEMON).unwrap(), 0);
        assert_eq!(a.write(1, b"x").unwrap(), (1, Wake::DAEMON));
        assert_eq!(a.write(1, b"y").unwrap(), (1, Wake::NONE));
        b.read(1, &mut buf, false).unwrap();
        // One application asking twice is one direct wake-up; a second one turns to the
        // daemon (which wakes whoever holds the socket) and keeps the first one's.
        assert_eq!(b.readable_arm(1, Wake::direct(5)).unwrap(), 0);
        assert_eq!(b.readable_arm(1, Wake::direct(5)).unwrap(), 0);
        let (_, w) = a.write(1, b"z").unwrap();
        assert_eq!((w.id(), w.daemon()), (Some(5), false));
        b.read(1, &mut buf, false).unwrap();
        b.readable_arm(1, Wake::direct(5)).unwrap();
        b.readable_arm(1, Wake::direct(9)).unwrap();
        let (_, w) = a.write(1, b"z").unwrap();
        assert_eq!((w.id(), w.daemon()), (Some(5), true));
        assert_eq!(Wake::direct(0), Wake::DAEMON);
        assert_eq!(
            Wake::direct(u32::MAX),
            Wake::DAEMON,
            "ids above 2^31 do not fit"
        );
    }

    /// A header written by a hostile peer is an error, not an access outside the mapping.
    #[test]
    fn a_corrupt_header_is_refused() {
        let (a, b) = pair(4096);
        a.head(0).store(1 << 40, Ordering::Relaxed);
        let mut buf = [0u8; 16];
        assert_eq!(b.read(0, &mut buf, false), Err(PipeError::Corrupt));
        assert_eq!(b.write(0, b"z"), Err(PipeError::Corrupt));
        a.head(0).store(0, Ordering::Relaxed);
        a.tail(0).store(5, Ordering::Relaxed);
        assert_eq!(b.readable(0), Err(PipeError::Corrupt));
        a.word64(AT_MAGIC).store(0, Ordering::Relaxed);
        let fd = rustix::io::dup(a.fd()).unwrap();
        assert!(Pipe::open(fd).is_err());
    }

    /// Two readers racing on one direction get distinct bytes that add up to the stream.
    #[test]
    fn racing_readers_split_the_stream_without_duplicates() {
        let (a, b) = pair(1 << 16);
        let total: u64 = 4 << 20;
        let reader = |p: Arc<Pipe>| {
            std::thread::spawn(move || {
                let mut sum = 0u64;
                let mut n = 0u64;
                let mut buf = vec![0u8; 1000];
                let until = Instant::now() + Duration::from_secs(30);
                while Instant::now() < until {
                    let (k, _) = p.read(0, &mut buf, false).unwrap();
                    n += k as u64;
                    sum += buf[..k].iter().map(|&x| x as u64).sum::<u64>();
                    if p.reader_closed(0) && p.readable(0).unwrap() == 0 {
                        break;
                    }
                }
                (n, sum)
            })
        };
        let (r1, r2) = (reader(b.clone()), reader(b));
        let mut off = 0u64;
        let mut expect = 0u64;
        while off < total {
            let chunk: Vec<u8> = (off..off + 4000).map(|i| (i % 251) as u8).collect();
            let (n, _) = a.write(0, &chunk).unwrap();
            expect += chunk[..n].iter().map(|&x| x as u64).sum::<u64>();
            off += n as u64;
        }
        while a.readable(0).unwrap() > 0 {
            std::thread::yield_now();
        }
        a.close_reader(0);
        let (x, y) = (r1.join().unwrap(), r2.join().unwrap());
        assert_eq!(x.0 + y.0, off);
        assert_eq!(x.1 + y.1, expect);
    }
}
