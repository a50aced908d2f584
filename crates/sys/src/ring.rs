//! A lock-free single-producer / single-consumer ring of variable-length byte records in a
//! [`SharedRegion`], between threads or processes.
//!
//! # Layout
//! At a 64-byte aligned `offset` of the region: a control block of [`CTL_BYTES`] bytes, then
//! `capacity` bytes of data (a power of two). The control block keeps what each side writes on
//! its own cache line: `head` and `room_waiting` (producer), `tail` and `room_doorbell`
//! (consumer), then `waiting` (consumer) and `doorbell` (producer). `head` and `tail` count bytes from the ring's start and never wrap
//! (2^64 bytes outlast any process). A record is a 32-bit native-endian length followed by the
//! bytes, padded to 8 ([`record_bytes`]); a record never wraps: when one does not fit before
//! the end of the data, the producer writes the length [`u32::MAX`] (skip to the start) there
//! and puts the record at the start. A zero-filled ring is empty and valid.
//!
//! # Protocol
//! - The [`Producer`] writes records past `head` where the consumer does not read, and
//!   publishes a whole batch with one store of `head` ([`Producer::publish`]).
//! - The [`Consumer`] hands records to its caller straight from the shared pages (borrowed
//!   slices, no copy) and releases the batch with one store of `tail` ([`Consumer::recv`]).
//! - An idle consumer spins, then reads `doorbell`, raises `waiting`, issues a sequentially
//!   consistent fence, checks `head` once more and sleeps on the `doorbell` futex
//!   ([`Consumer::wait`]). A producer stores `head`, issues the same fence, and if it then sees
//!   `waiting` bumps `doorbell` and wakes it. The two fences are ordered one way or the other,
//!   so at least one side sees the other's store: either the consumer sees the records or the
//!   producer sees it wait (without the fences, both could miss — a lost wake-up, the sleeper
//!   then waiting out its whole timeout). The consumer read `doorbell` before announcing, so a
//!   wake racing its way into `futex_wait` makes that call return at once.
//! - The same protocol runs the other way when the ring is full: a producer that needs room
//!   publishes, reads `room_doorbell`, raises `room_waiting`, fences, re-reads `tail` and
//!   sleeps on `room_doorbell` ([`Producer::wait_room`]); a consumer that released records
//!   (stored `tail`) fences, and if it sees `room_waiting` bumps `room_doorbell` and wakes it.
//! - The protocol is model-checked with `loom` (`scripts/loom.sh`, models in
//!   `ring/loom_models.rs`): the atomics, the fences and the futex calls above come from
//!   `crate::sync`, which maps them to loom's under `--cfg loom`.
//!
//! - A consumer that drains several rings (a receive queue fed by several producers) sleeps on
//!   one [`Bell`] instead: the same protocol with `waiting` and `doorbell` in the bell, the
//!   producers publishing with [`Producer::publish_with`] and the consumer checking every ring's
//!   `head` after raising `waiting` ([`Bell::wait`]). Each producer pairs with the consumer as
//!   above, so a wake-up from any of them cannot be lost.
//!
//! Per record the data path does no atomic operation and one copy (the producer's); per batch
//! the producer does one store of `head`, one fence and one load of `waiting`, and reads `tail`
//! only when the space it last saw runs out; the consumer does one load of `head`, one store of
//! `tail`, one fence and one load of `room_waiting` (on the line it read `head` from).
//!
//! # Untrusted peer
//! The other side may be another process, buggy or hostile, and can write anything anywhere in
//! the ring at any time. Neither side ever trusts a value it did not write itself: each keeps
//! its own index privately (the consumer its `tail`, the producer its `head`), every position
//! it reads or writes is masked into the data area, and every value read from the region — the
//! peer's index, each record length, each skip marker — is checked against the capacity, the
//! largest record and the published span before use. A value that fails is reported as
//! [`RingError::Corrupt`]; nothing is read or written outside the ring. What the checks cannot
//! stop is a peer changing bytes of a record while the consumer's caller reads them: record
//! contents are untrusted input, to be parsed and validated like bytes from a network.
//! Nor can they stop a peer from raising or lowering its `waiting`/`room_waiting` flag at
//! will: that costs the other side a spurious `futex_wake` per batch, or makes a sleep last
//! until its timeout; it never makes either side read or write outside the ring.
//!
//! # Sharing rules
//! At most one [`Producer`] and one [`Consumer`] per ring, in whatever processes. Bytes of the
//! region inside a ring belong to the ring; use the rest (e.g. through
//! [`SharedRegion::atomic_u32`]) for anything else.
#![allow(unsafe_code)]

use crate::sync::{fence, futex, AtomicU32, AtomicU64, Ordering};
use crate::SharedRegion;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

/// Control block: each side's fields on their own cache line.
#[repr(C, align(64))]
struct Ctl {
    // Written by the producer.
    head: AtomicU64,
    room_waiting: AtomicU32,
    _p0: [u8; 52],
    // Written by the consumer.
    tail: AtomicU64,
    room_doorbell: AtomicU32,
    _p1: [u8; 52],
    // Written by the consumer (`waiting`) and the producer (`doorbell`).
    waiting: AtomicU32,
    doorbell: AtomicU32,
    _p2: [u8; 56],
}

/// Bytes of a ring's control block (the data follows it).
pub const CTL_BYTES: usize = std::mem::size_of::<Ctl>();
// Under loom an atomic is a bigger model object: the layout only holds for the real build.
#[cfg(not(loom))]
const _: () = assert!(CTL_BYTES == 192);
/// Alignment of a ring's offset in its region.
pub const RING_ALIGN: usize = 64;
/// Smallest data capacity.
pub const MIN_CAPACITY: usize = 64;
const SKIP: u32 = u32::MAX;
const HDR: usize = 4;

/// Bytes a ring with `capacity` bytes of data takes in its region (control block + data).
pub const fn ring_bytes(capacity: usize) -> usize {
    CTL_BYTES + capacity
}

/// Bytes a record of `len` bytes takes in the ring: a 4-byte length, the bytes, padding to 8.
pub const fn record_bytes(len: usize) -> usize {
    (HDR + len + 7) & !7
}

/// Where a ring lies in its region and what it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    /// Byte offset of the control block in the region; a multiple of [`RING_ALIGN`].
    pub offset: usize,
    /// Bytes of record data: a power of two, at least [`MIN_CAPACITY`].
    pub capacity: usize,
    /// Largest record, in bytes; its [`record_bytes`] must fit in `capacity`.
    pub max_record: usize,
}

/// What went wrong with a ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RingError {
    /// The [`RingLayout`] does not fit the region or breaks a rule.
    Layout(&'static str),
    /// A record larger than the layout's `max_record`.
    TooLarge {
        /// Its length.
        len: usize,
        /// The largest record the ring takes.
        max: usize,
    },
    /// Not enough free space now (the consumer is behind).
    Full,
    /// The shared memory holds a value the peer cannot have written by this protocol: the
    /// peer is broken or hostile. Nothing was read or written outside the ring.
    Corrupt {
        /// Which value.
        what: &'static str,
        /// The value read.
        value: u64,
    },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Layout(why) => write!(f, "ring layout: {why}"),
            RingError::TooLarge { len, max } => {
                write!(f, "record of {len} bytes exceeds the ring's largest, {max}")
            }
            RingError::Full => write!(f, "ring full"),
            RingError::Corrupt { what, value } => {
                write!(f, "shared ring corrupt: {what} ({value:#x})")
            }
        }
    }
}

impl std::error::Error for RingError {}

fn corrupt(what: &'static str, value: u64) -> RingError {
    RingError::Corrupt { what, value }
}

#[cfg(all(loom, test))]
impl Ctl {
    fn new() -> Self {
        Self {
            head: AtomicU64::new(0),
            room_waiting: AtomicU32::new(0),
            _p0: [0; 52],
            tail: AtomicU64::new(0),
            room_doorbell: AtomicU32::new(0),
            _p1: [0; 52],
            waiting: AtomicU32::new(0),
            doorbell: AtomicU32::new(0),
            _p2: [0; 56],
        }
    }
}

/// Under loom, zero-filled memory is not a valid atomic (loom's are model objects): puts a
/// fresh, empty control block at `offset` of `region` before the ring's sides attach.
#[cfg(all(loom, test))]
pub(crate) fn loom_init(region: &SharedRegion, offset: usize) {
    assert!(offset.is_multiple_of(RING_ALIGN) && offset + CTL_BYTES <= region.len());
    // SAFETY: CTL_BYTES at `offset` lie inside the mapping (asserted), 64-byte aligned (the
    // base is page-aligned, the offset a multiple of 64); nothing references them yet. The old
    // bytes are not a value to drop (plain memory), so they are overwritten without a drop.
    unsafe { (region.as_ptr().add(offset) as *mut Ctl).write(Ctl::new()) }
}

/// The pointers of one ring, valid while `_region` lives.
struct Raw {
    _region: Arc<SharedRegion>,
    ctl: NonNull<Ctl>,
    data: NonNull<u8>,
    cap: usize,
    max_record: usize,
}

impl Raw {
    fn new(region: Arc<SharedRegion>, l: RingLayout) -> Result<Self, RingError> {
        if !l.capacity.is_power_of_two() || l.capacity < MIN_CAPACITY {
            return Err(RingError::Layout(
                "capacity must be a power of two of at least 64",
            ));
        }
        if l.max_record >= SKIP as usize || record_bytes(l.max_record) > l.capacity {
            return Err(RingError::Layout("largest record does not fit the ring"));
        }
        let end = l
            .offset
            .checked_add(ring_bytes(l.capacity))
            .ok_or(RingError::Layout("ring ends beyond the address space"))?;
        if end > region.len() {
            return Err(RingError::Layout("ring ends beyond the region"));
        }
        let base = region.as_ptr().wrapping_add(l.offset);
        if !(base as usize).is_multiple_of(RING_ALIGN) {
            return Err(RingError::Layout("ring offset not 64-byte aligned"));
        }
        let ctl = NonNull::new(base as *mut Ctl).ok_or(RingError::Layout("null region"))?;
        // Inside the region (checked above), so non-null too.
        let data = NonNull::new(base.wrapping_add(CTL_BYTES)).ok_or(RingError::Layout("null"))?;
        Ok(Raw {
            _region: region,
            ctl,
            data,
            cap: l.capacity,
            max_record: l.max_record,
        })
    }

    #[inline]
    fn ctl(&self) -> &Ctl {
        // SAFETY: `ctl` points at CTL_BYTES inside the mapping (checked in `new`), 64-byte
        // aligned, and the mapping lives as long as `_region`, i.e. as long as `self`. Ctl is
        // atomics and padding only, valid for every bit pattern, and atomics on shared pages
        // stay atomic across processes.
        unsafe { self.ctl.as_ref() }
    }

    #[inline]
    fn mask(&self) -> u64 {
        (self.cap - 1) as u64
    }
}

// SAFETY: the pointers lead into a mapping kept alive by the Arc'd SharedRegion (Send + Sync);
// a Producer or Consumer has no state tied to the thread that made it.
unsafe impl Send for Producer {}
// SAFETY: as for Producer.
unsafe impl Send for Consumer {}

/// The writing side of a ring.
///
/// It keeps its private copy of `head` in itself and writes it at every record, so it sits
/// alone on its cache lines (aligned to two, as adjacent-line prefetch pairs them): endpoints
/// made together on one thread and then run on different cores share no line.
#[repr(align(128))]
pub struct Producer {
    raw: Raw,
    /// Next byte to write (records up to here are written, maybe not yet published).
    head: u64,
    /// `head` as last published.
    published: u64,
    /// `tail` as last read from the consumer: the space before it is free.
    tail: u64,
}

impl Producer {
    /// Takes the producing side of the ring at `layout` in `region` (zero-filled, or left by a
    /// previous producer: it continues from the published `head`).
    pub fn new(region: Arc<SharedRegion>, layout: RingLayout) -> Result<Self, RingError> {
        let raw = Raw::new(region, layout)?;
        let head = raw.ctl().head.load(Ordering::Acquire);
        let tail = raw.ctl().tail.load(Ordering::Acquire);
        if !head.is_multiple_of(8)
            || head.wrapping_sub(tail) > raw.cap as u64
            || !tail.is_multiple_of(8)
        {
            return Err(corrupt("head/tail of an existing ring", head));
        }
        Ok(Self {
            raw,
            head,
            published: head,
            tail,
        })
    }

    /// Bytes of record data the ring holds.
    pub fn capacity(&self) -> usize {
        self.raw.cap
    }

    /// Largest record the ring takes.
    pub fn max_record(&self) -> usize {
        self.raw.max_record
    }

    /// Appends a copy of `record` to the batch being written; it becomes visible to the
    /// consumer at the next [`Producer::publish`].
    #[inline]
    pub fn push(&mut self, record: &[u8]) -> Result<(), RingError> {
        self.push_with(record.len(), |dst| dst.copy_from_slice(record))
    }

    /// Appends a record of `len` bytes that `fill` writes in place (its buffer holds stale
    /// bytes, not zeros); it becomes visible at the next [`Producer::publish`]. `fill` is not
    /// called if the record is too large, the ring full or the consumer's index corrupt.
    #[inline]
    pub fn push_with(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) -> Result<(), RingError> {
        if len > self.raw.max_record {
            return Err(RingError::TooLarge {
                len,
                max: self.raw.max_record,
            });
        }
        let need = record_bytes(len) as u64;
        let pos = (self.head & self.raw.mask()) as usize;
        let to_end = self.raw.cap as u64 - pos as u64;
        if !self.has_room(len)? {
            return Err(RingError::Full);
        }
        let data = self.raw.data.as_ptr();
        let mut at = pos;
        if need > to_end {
            // SAFETY: `pos` is 8-aligned and below the capacity, so the 4-byte marker lies in
            // the data area, in space the consumer does not read until `head` passes it.
            unsafe { (data.add(pos) as *mut u32).write(SKIP) };
            self.head = self.head.wrapping_add(to_end);
            at = 0;
        }
        // SAFETY: [at, at + need) lies in the data area (`need <= to_end`, or `at == 0` and
        // `need <= cap` since len <= max_record) and in the free span checked above, which the
        // consumer does not read before `head` is published past it. `at` is 8-aligned, so the
        // length word is aligned. The slice lives only during `fill`.
        unsafe {
            (data.add(at) as *mut u32).write(len as u32);
            fill(std::slice::from_raw_parts_mut(data.add(at + HDR), len));
        }
        self.head = self.head.wrapping_add(need);
        Ok(())
    }

    /// Whether a record of `len` bytes (at most `max_record`) fits now; re-reads the consumer's
    /// `tail` only if the space last seen is not enough.
    #[inline]
    fn has_room(&mut self, len: usize) -> Result<bool, RingError> {
        let cap = self.raw.cap as u64;
        let need = record_bytes(len) as u64;
        let to_end = cap - (self.head & self.raw.mask());
        // A record never wraps: if it does not fit before the end, skip to the start.
        let total = if need > to_end { to_end + need } else { need };
        // Positions are u64 counters compared modulo 2^64 (a ring left by a previous
        // producer may sit anywhere): `head - tail` is at most `cap` once checked.
        if self.head.wrapping_sub(self.tail) + total <= cap {
            return Ok(true);
        }
        self.refresh_tail()?;
        Ok(self.head.wrapping_sub(self.tail) + total <= cap)
    }

    /// Re-reads the consumer's `tail`, checking that it only moved forward, within what was
    /// published.
    #[cold]
    fn refresh_tail(&mut self) -> Result<(), RingError> {
        let t = self.raw.ctl().tail.load(Ordering::Acquire);
        if !t.is_multiple_of(8)
            || t.wrapping_sub(self.tail) > self.published.wrapping_sub(self.tail)
        {
            return Err(corrupt("consumer tail", t));
        }
        self.tail = t;
        Ok(())
    }

    /// Makes every record pushed since the last publish visible with one store of `head`, and
    /// wakes the consumer if it said it sleeps. Returns whether it woke it.
    #[inline]
    pub fn publish(&mut self) -> bool {
        if !self.store_head() {
            return false;
        }
        self.wake()
    }

    /// Makes the records pushed since the last publish visible without waking the consumer:
    /// for records it does not wait for (it reads them with the next ones that wake it, or
    /// at its next call). Returns whether anything was published. The store of `head` is
    /// fenced (SeqCst), so a flag the caller loads next — the consumer saying it wants these
    /// records after all, stored before its own sleep announcement and fence — is either
    /// seen, and the caller calls [`Producer::wake`], or the consumer sees this `head`.
    #[inline]
    pub fn publish_quiet(&mut self) -> bool {
        if !self.store_head() {
            return false;
        }
        fence(Ordering::SeqCst);
        true
    }

    /// Wakes the consumer if it said it sleeps (after [`Producer::publish_quiet`], or from
    /// [`Producer::publish`]); returns whether it woke it.
    #[inline]
    pub fn wake(&self) -> bool {
        // Pairs with the fence in `Consumer::wait`: either it sees this head or we see it wait.
        fence(Ordering::SeqCst);
        let ctl = self.raw.ctl();
        if ctl.waiting.load(Ordering::Acquire) != 0 {
            ctl.doorbell.fetch_add(1, Ordering::Release);
            futex::wake(&ctl.doorbell, 1);
            return true;
        }
        false
    }

    /// Waits until a record of `len` bytes fits: publishes what was pushed (so that the
    /// consumer can drain it), spins for up to `spin` (bounded by `timeout`), then announces
    /// that it sleeps and sleeps on the ring's `room_doorbell` for the rest of `timeout`,
    /// unless the consumer released enough meanwhile. [`Waited::Ready`] means the next push of
    /// up to `len` bytes succeeds; after [`Waited::Slept`] the caller tries again.
    pub fn wait_room(
        &mut self,
        len: usize,
        spin: Duration,
        timeout: Duration,
    ) -> Result<Waited, RingError> {
        if len > self.raw.max_record {
            return Err(RingError::TooLarge {
                len,
                max: self.raw.max_record,
            });
        }
        self.publish();
        let start = std::time::Instant::now();
        let spin = spin.min(timeout);
        loop {
            if self.has_room(len)? {
                return Ok(Waited::Ready);
            }
            if start.elapsed() >= spin {
                break;
            }
            std::hint::spin_loop();
        }
        let rest = timeout.saturating_sub(start.elapsed());
        if rest.is_zero() {
            return Ok(Waited::SpunOut);
        }
        let ctl = self.raw.ctl();
        let bell = ctl.room_doorbell.load(Ordering::Relaxed);
        ctl.room_waiting.store(1, Ordering::Release);
        // Pairs with the fence in `Consumer::recv` after its store of `tail`.
        fence(Ordering::SeqCst);
        let r = match self.has_room(len) {
            Ok(true) => Ok(Waited::Ready),
            Ok(false) => {
                futex::wait(&self.raw.ctl().room_doorbell, bell, Some(rest));
                Ok(Waited::Slept)
            }
            Err(e) => Err(e),
        };
        self.raw.ctl().room_waiting.store(0, Ordering::Relaxed);
        r
    }

    /// [`Producer::publish`] for a ring whose consumer sleeps on a [`Bell`] shared with other
    /// rings instead of on this ring's own doorbell: one store of `head`, then [`Bell::ring`].
    /// Returns whether it woke the consumer.
    #[inline]
    pub fn publish_with(&mut self, bell: &Bell) -> bool {
        self.store_head() && bell.ring()
    }

    /// Stores `head` if records were pushed since the last publish; returns whether it did.
    #[inline]
    fn store_head(&mut self) -> bool {
        if self.head == self.published {
            return false;
        }
        // Release: the records before it are visible to whoever sees it. The caller then
        // fences before it looks at the consumer's `waiting` (see the module docs).
        self.raw.ctl().head.store(self.head, Ordering::Release);
        self.published = self.head;
        true
    }

    /// Bytes written but not yet published.
    pub fn unpublished(&self) -> usize {
        self.head.wrapping_sub(self.published) as usize
    }
}

/// The reading side of a ring; alone on its cache lines, like [`Producer`].
#[repr(align(128))]
pub struct Consumer {
    raw: Raw,
    /// Next byte to read; only this side writes the shared `tail`, so this copy is the truth.
    tail: u64,
}

/// How a [`Consumer::wait`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    /// Records are waiting (found without sleeping).
    Ready,
    /// The timeout passed while spinning; no sleep was tried.
    SpunOut,
    /// Slept on the doorbell until woken, the timeout or a signal: records may or may not
    /// be waiting now.
    Slept,
}

impl Consumer {
    /// Takes the consuming side of the ring at `layout` in `region` (zero-filled, or left by a
    /// previous consumer: it continues from the shared `tail`).
    pub fn new(region: Arc<SharedRegion>, layout: RingLayout) -> Result<Self, RingError> {
        let raw = Raw::new(region, layout)?;
        let tail = raw.ctl().tail.load(Ordering::Acquire);
        let head = raw.ctl().head.load(Ordering::Acquire);
        if !tail.is_multiple_of(8) || head.wrapping_sub(tail) > raw.cap as u64 {
            return Err(corrupt("head/tail of an existing ring", tail));
        }
        Ok(Self { raw, tail })
    }

    /// Bytes of record data the ring holds.
    pub fn capacity(&self) -> usize {
        self.raw.cap
    }

    /// True if published records wait (one load of `head`).
    #[inline]
    pub fn pending(&self) -> bool {
        self.raw.ctl().head.load(Ordering::Acquire) != self.tail
    }

    /// Hands up to `budget` records, in order, to `sink` as slices of the shared pages (no
    /// copy), then releases them to the producer with one store of `tail`; returns how many.
    ///
    /// On [`RingError::Corrupt`] the records before the bad value have been handed to `sink`
    /// and released; the ring stays stuck at the bad value (every later call reports it).
    #[inline]
    pub fn recv(&mut self, budget: usize, mut sink: impl FnMut(&[u8])) -> Result<usize, RingError> {
        let ctl = self.raw.ctl();
        let head = ctl.head.load(Ordering::Acquire);
        let cap = self.raw.cap as u64;
        let mut tail = self.tail;
        if !head.is_multiple_of(8) || head.wrapping_sub(tail) > cap {
            return Err(corrupt("producer head", head));
        }
        let data = self.raw.data.as_ptr();
        let mut n = 0;
        let mut err = None;
        while tail != head && n < budget {
            let pos = (tail & self.raw.mask()) as usize;
            let avail = head.wrapping_sub(tail);
            // SAFETY: `pos` is 8-aligned (tail only moves by multiples of 8) and below the
            // capacity, a multiple of 8, so the 4-byte word lies in the data area, aligned.
            // Volatile: read exactly once, so the value checked is the value used even if the
            // peer rewrites it meanwhile.
            let len = unsafe { (data.add(pos) as *const u32).read_volatile() };
            if len == SKIP {
                let skip = cap - pos as u64;
                if skip > avail {
                    err = Some(corrupt("skip marker past the published head", tail));
                    break;
                }
                tail = tail.wrapping_add(skip);
                continue;
            }
            let len = len as usize;
            let rec = record_bytes(len) as u64;
            if len > self.raw.max_record || rec > cap - pos as u64 || rec > avail {
                err = Some(corrupt("record length", len as u64));
                break;
            }
            // SAFETY: [pos + 4, pos + 4 + len) lies in the data area (checked against the end)
            // and in the published span (checked against `avail`), which the producer does not
            // write until `tail` moves past it, after `sink` returns; the slice does not outlive
            // the call. u8 is valid for any bytes. A peer breaking the protocol can still write
            // them meanwhile: the contents are then garbage, never out of bounds (the zero-copy
            // trade every shared-memory reader makes; see "Untrusted peer" above).
            let record = unsafe { std::slice::from_raw_parts(data.add(pos + HDR), len) };
            sink(record);
            tail = tail.wrapping_add(rec);
            n += 1;
        }
        if tail != self.tail {
            ctl.tail.store(tail, Ordering::Release);
            self.tail = tail;
            // Pairs with the fence in `Producer::wait_room`: either it sees this tail or we
            // see it wait for room.
            fence(Ordering::SeqCst);
            if ctl.room_waiting.load(Ordering::Acquire) != 0 {
                ctl.room_doorbell.fetch_add(1, Ordering::Release);
                futex::wake(&ctl.room_doorbell, 1);
            }
        }
        match err {
            None => Ok(n),
            Some(e) => Err(e),
        }
    }

    /// Waits for records: spins for up to `spin` (bounded by `timeout`), then announces that it
    /// sleeps and sleeps on the doorbell for the rest of `timeout`, unless records arrived.
    pub fn wait(&self, spin: Duration, timeout: Duration) -> Waited {
        let start = std::time::Instant::now();
        let spin = spin.min(timeout);
        while start.elapsed() < spin {
            if self.pending() {
                return Waited::Ready;
            }
            std::hint::spin_loop();
        }
        let rest = timeout.saturating_sub(start.elapsed());
        if rest.is_zero() {
            return Waited::SpunOut;
        }
        let ctl = self.raw.ctl();
        let bell = ctl.doorbell.load(Ordering::Relaxed);
        ctl.waiting.store(1, Ordering::Release);
        // Pairs with the fence in `Producer::publish`: see the module docs.
        fence(Ordering::SeqCst);
        let r = if ctl.head.load(Ordering::Acquire) != self.tail {
            Waited::Ready
        } else {
            futex::wait(&ctl.doorbell, bell, Some(rest));
            Waited::Slept
        };
        ctl.waiting.store(0, Ordering::Relaxed);
        r
    }
}

mod bell;
pub use bell::{Bell, BELL_BYTES};

#[cfg(all(test, not(loom)))]
mod tests;

#[cfg(all(test, loom))]
mod loom_models;
