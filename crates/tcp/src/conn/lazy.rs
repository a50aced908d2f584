//! State allocated on first use and released at rest (issue 19: an idle connection costs
//! ≤ 512 bytes). A [`Lazy`] field is one pointer while its state is at rest: reads see a
//! shared idle instance, the first write allocates, and the owner frees it again once the
//! state is back at rest. The send queue, the reassembly list and the SACK scoreboard are
//! held this way; the methods the data path calls on them are forwarded here so that an
//! unallocated one is never allocated just to be read or found empty.

use super::input::ChallengeAcks;
use crate::assembler::{Assembler, TooManyRanges};
use crate::sack::Scoreboard;
use crate::sendq::SendQueue;
use flowstack_wire::tcp::SackBlock;
use flowstack_wire::{Instant, SeqNum};
use std::ops::{Deref, DerefMut};
use std::sync::LazyLock;

/// A type that can be held lazily: how a fresh one is made (from the field's parameter, a
/// limit) and the shared instance reads see while none is allocated.
pub(crate) trait AtRest: Sized + 'static {
    /// A fresh instance, as the connection would have created it.
    fn fresh(param: u32) -> Self;
    /// The shared idle instance (what reads of an unallocated field see).
    fn idle() -> &'static Self;
    /// True when the instance holds nothing a fresh one would not.
    fn at_rest(&self) -> bool;
}

/// `T`, allocated on first write; 16 bytes (the pointer and `T`'s limit) while at rest.
pub(crate) struct Lazy<T: AtRest> {
    b: Option<Box<T>>,
    param: u32,
}

impl<T: AtRest> Lazy<T> {
    /// An unallocated field whose instance will be `T::fresh(param)`.
    pub(crate) fn new(param: usize) -> Self {
        Self {
            b: None,
            param: u32::try_from(param).unwrap_or(u32::MAX),
        }
    }
    /// True once allocated.
    pub(crate) fn is_allocated(&self) -> bool {
        self.b.is_some()
    }
    /// Frees the instance if it is at rest; true if nothing is allocated afterwards.
    pub(crate) fn release_at_rest(&mut self) -> bool {
        if self.b.as_deref().is_some_and(T::at_rest) {
            self.b = None;
        }
        self.b.is_none()
    }
    /// The limit fresh instances get.
    pub(crate) fn param(&self) -> usize {
        self.param as usize
    }
}

impl<T: AtRest> Deref for Lazy<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        match &self.b {
            Some(b) => b,
            None => T::idle(),
        }
    }
}

impl<T: AtRest> DerefMut for Lazy<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        let p = self.param;
        self.b.get_or_insert_with(|| Box::new(T::fresh(p)))
    }
}

// ---- the send queue ------------------------------------------------------------------------

static IDLE_SENDQ: LazyLock<SendQueue> = LazyLock::new(|| SendQueue::new(0));

impl AtRest for SendQueue {
    fn fresh(cap: u32) -> Self {
        SendQueue::new(cap as usize)
    }
    fn idle() -> &'static Self {
        &IDLE_SENDQ
    }
    /// Empty (its ring is freed with it). Completions are the connection's counters, not
    /// the queue's: one nobody took does not keep the queue.
    fn at_rest(&self) -> bool {
        self.is_empty()
    }
}

impl Lazy<SendQueue> {
    /// Bytes queued (unsent and unacknowledged).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.b.as_ref().map_or(0, |q| q.len())
    }
    /// True if nothing is queued.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Room left under the limit.
    #[inline]
    pub(crate) fn window(&self) -> usize {
        self.param() - self.len()
    }
    /// Drops `n` acknowledged bytes from the front.
    #[inline]
    pub(crate) fn consume(&mut self, n: usize) {
        if let Some(q) = &mut self.b {
            q.consume(n);
        }
    }
    /// Zero-copy sends queued and not yet completed ([`SendQueue::zc_pending`]).
    #[inline]
    pub(crate) fn zc_pending(&self) -> usize {
        self.b.as_ref().map_or(0, |q| q.zc_pending())
    }
    /// Zero-copy buffers' borrowed memory replaced by heap copies ([`SendQueue::rehome`]).
    pub(crate) fn rehome(&mut self, owner: &crate::sendq::SharedOwner) -> usize {
        self.b.as_mut().map_or(0, |q| q.rehome(owner))
    }
    /// Heap held: the queue and what it holds.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.b
            .as_ref()
            .map_or(0, |q| std::mem::size_of::<SendQueue>() + q.heap_bytes())
    }
}

// ---- reassembly ----------------------------------------------------------------------------

static IDLE_ASSEMBLER: LazyLock<Assembler> = LazyLock::new(|| Assembler::new(0));

impl AtRest for Assembler {
    fn fresh(max: u32) -> Self {
        Assembler::new(max as usize)
    }
    fn idle() -> &'static Self {
        &IDLE_ASSEMBLER
    }
    fn at_rest(&self) -> bool {
        // A D-SACK block still to report (RFC 2883 §4) is state: freeing it would lose it.
        self.is_empty() && self.heap_bytes() == 0 && self.dsack().is_none()
    }
}

impl Lazy<Assembler> {
    /// The pending D-SACK block went out; frees the list if nothing else is held.
    #[inline]
    pub(crate) fn dsack_sent(&mut self) {
        if let Some(a) = self.b.as_mut() {
            a.dsack_sent();
        }
        self.release_at_rest();
    }
    /// True if no out-of-order data is held.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.b.as_ref().is_none_or(|a| a.is_empty())
    }
    /// Adds a range (allocating the list).
    #[inline]
    pub(crate) fn add(&mut self, start: SeqNum, end: SeqNum) -> Result<(), TooManyRanges> {
        let r = (**self).add(start, end);
        self.release_at_rest();
        r
    }
    /// The end of the front range once RCV.NXT reaches it; frees the list when it empties.
    #[inline]
    pub(crate) fn pop_front(&mut self, rcv_nxt: SeqNum) -> Option<SeqNum> {
        let end = self.b.as_mut()?.pop_front(rcv_nxt);
        self.release_at_rest();
        end
    }
    /// SACK blocks describing the held ranges (RFC 2018 §4), most recent first.
    #[inline]
    pub(crate) fn sack_blocks(&self, out: &mut [(SeqNum, SeqNum)]) -> usize {
        self.b.as_ref().map_or(0, |a| a.sack_blocks(out))
    }
    /// Heap held: the list and its ranges.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.b
            .as_ref()
            .map_or(0, |a| std::mem::size_of::<Assembler>() + a.heap_bytes())
    }
}

// ---- the SACK scoreboard -------------------------------------------------------------------

static IDLE_SCOREBOARD: LazyLock<Scoreboard> = LazyLock::new(|| Scoreboard::new(0));

impl AtRest for Scoreboard {
    fn fresh(max: u32) -> Self {
        Scoreboard::new(max as usize)
    }
    fn idle() -> &'static Self {
        &IDLE_SCOREBOARD
    }
    fn at_rest(&self) -> bool {
        self.is_empty() && self.heap_bytes() == 0
    }
}

impl Lazy<Scoreboard> {
    /// Merges the blocks of one ACK (allocating the scoreboard only if there are any).
    #[inline]
    pub(crate) fn update(&mut self, una: SeqNum, nxt: SeqNum, sacks: &[SackBlock]) -> bool {
        if sacks.is_empty() {
            return false;
        }
        let changed = (**self).update(una, nxt, sacks);
        self.release_at_rest();
        changed
    }
    /// Drops everything below SND.UNA; frees the scoreboard when it empties.
    #[inline]
    pub(crate) fn advance(&mut self, una: SeqNum) {
        if let Some(s) = &mut self.b {
            s.advance(una);
            self.release_at_rest();
        }
    }
    /// Forgets everything.
    pub(crate) fn clear(&mut self) {
        self.b = None;
    }
    /// Bytes SACKed.
    #[inline]
    pub(crate) fn sacked_bytes(&self) -> usize {
        self.b.as_ref().map_or(0, |s| s.sacked_bytes())
    }
    /// The highest SACKed sequence number.
    #[inline]
    pub(crate) fn high(&self) -> Option<SeqNum> {
        self.b.as_ref()?.high()
    }
    /// Whether the segment at `seq` is deemed lost (RFC 6675 IsLost).
    #[inline]
    pub(crate) fn is_lost(&self, seq: SeqNum, mss: usize, dup_thresh: usize) -> bool {
        self.b
            .as_ref()
            .is_some_and(|s| s.is_lost(seq, mss, dup_thresh))
    }
    /// The first hole at or after `from`.
    #[inline]
    pub(crate) fn next_hole(&self, from: SeqNum) -> Option<(SeqNum, SeqNum)> {
        self.b.as_ref()?.next_hole(from)
    }
    /// The end of the SACKed block holding `seq`.
    #[inline]
    pub(crate) fn sacked_until(&self, seq: SeqNum) -> Option<SeqNum> {
        self.b.as_ref()?.sacked_until(seq)
    }
    /// The start of the first SACKed block after `seq`.
    #[inline]
    pub(crate) fn next_sacked_after(&self, seq: SeqNum) -> Option<SeqNum> {
        self.b.as_ref()?.next_sacked_after(seq)
    }
    /// Heap held: the scoreboard and its blocks.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.b
            .as_ref()
            .map_or(0, |s| std::mem::size_of::<Scoreboard>() + s.heap_bytes())
    }
}

// ---- small boxed values --------------------------------------------------------------------

/// A value boxed while present: 8 bytes while `None` (for state that is rare and larger
/// than a pointer, such as a spurious-timeout record).
pub(crate) type Rare<T> = Option<Box<T>>;

// ---- state without a limit --------------------------------------------------------------

/// `T`, allocated on first write; one pointer while at rest (for state whose fresh value
/// needs no parameter).
pub(crate) struct Lazy0<T: AtRest>(Option<Box<T>>);

impl<T: AtRest> Lazy0<T> {
    /// Unallocated.
    pub(crate) const fn new() -> Self {
        Self(None)
    }
    /// True once allocated.
    pub(crate) fn is_allocated(&self) -> bool {
        self.0.is_some()
    }
    /// Frees the instance if it is at rest.
    pub(crate) fn release_at_rest(&mut self) {
        if self.0.as_deref().is_some_and(T::at_rest) {
            self.0 = None;
        }
    }
}

impl<T: AtRest> Deref for Lazy0<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        match &self.0 {
            Some(b) => b,
            None => T::idle(),
        }
    }
}

impl<T: AtRest> DerefMut for Lazy0<T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        self.0.get_or_insert_with(|| Box::new(T::fresh(0)))
    }
}

// ---- the send path's gather space ----------------------------------------------------------

static IDLE_SCRATCH: Vec<u8> = Vec::new();

impl AtRest for Vec<u8> {
    fn fresh(_: u32) -> Self {
        Vec::new()
    }
    fn idle() -> &'static Self {
        &IDLE_SCRATCH
    }
    /// Scratch space: its contents never outlive one segment.
    fn at_rest(&self) -> bool {
        true
    }
}

impl Lazy0<Vec<u8>> {
    /// Heap held: the vector and its capacity.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.0
            .as_ref()
            .map_or(0, |v| std::mem::size_of::<Vec<u8>>() + v.capacity())
    }
}

// ---- the challenge-ACK rate limit ----------------------------------------------------------

static IDLE_CHALLENGE: LazyLock<ChallengeAcks> =
    LazyLock::new(|| ChallengeAcks::new(Instant::ZERO));

impl AtRest for ChallengeAcks {
    fn fresh(_: u32) -> Self {
        ChallengeAcks::new(Instant::ZERO)
    }
    fn idle() -> &'static Self {
        &IDLE_CHALLENGE
    }
    /// Released only by `Connection::release_at_rest`, after at least a second without
    /// input: by then the one-second window (RFC 5961 §7) has run out, and a fresh limiter
    /// behaves the same.
    fn at_rest(&self) -> bool {
        true
    }
}
