//! Out-of-order bookkeeping for the receive side: which sequence ranges above RCV.NXT have
//! arrived, and the duplicate to report in the next ACK (RFC 2883 D-SACK). Holds at most a
//! configured number of ranges so the cost per segment stays bounded under a flood of tiny
//! out-of-order segments (the data itself sits in the receive ring).

use flowstack_wire::SeqNum;
use std::num::NonZeroU32;

/// A nonempty range `[start, start + len)`; `Option<Span>` takes 8 bytes (the zero length is
/// its `None`), which keeps the assembler — part of every connection — as small as it was
/// before it also held the D-SACK range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Span {
    start: SeqNum,
    len: NonZeroU32,
}

impl Span {
    fn new(start: SeqNum, end: SeqNum) -> Option<Self> {
        if end <= start {
            return None;
        }
        NonZeroU32::new((end - start) as u32).map(|len| Span { start, len })
    }
    fn end(self) -> SeqNum {
        self.start + self.len.get() as usize
    }
    fn pair(self) -> (SeqNum, SeqNum) {
        (self.start, self.end())
    }
}

/// Sorted, disjoint, non-adjacent ranges `[start, end)` above the contiguous data.
#[derive(Debug)]
pub struct Assembler {
    ranges: Vec<(SeqNum, SeqNum)>,
    max: u32,
    /// The range most recently added to (reported first in SACK, RFC 2018 §4).
    last: Option<Span>,
    /// A duplicate received and not yet reported: the first block of the next ACK's SACK
    /// option (RFC 2883 §4), sent once.
    dsack: Option<Span>,
}

/// Adding would need more ranges than allowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TooManyRanges;

impl Assembler {
    /// Allows at most `max` ranges. Nothing is allocated until data arrives out of order.
    pub fn new(max: usize) -> Self {
        Self {
            ranges: Vec::new(),
            max: max.min(u32::MAX as usize) as u32,
            last: None,
            dsack: None,
        }
    }
    /// True if no out-of-order data is held.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }
    /// The ranges held.
    pub fn ranges(&self) -> &[(SeqNum, SeqNum)] {
        &self.ranges
    }

    /// Records `[start, end)` as received, merging with neighbours.
    pub fn add(&mut self, start: SeqNum, end: SeqNum) -> Result<(), TooManyRanges> {
        if end <= start {
            return Ok(());
        }
        // First range that ends at or after `start` (could merge).
        let i = self.ranges.partition_point(|r| r.1 < start);
        let mut j = i;
        let (mut s, mut e) = (start, end);
        while j < self.ranges.len() && self.ranges[j].0 <= e {
            s = s.min(self.ranges[j].0);
            e = e.max(self.ranges[j].1);
            j += 1;
        }
        if i == j && self.ranges.len() >= self.max as usize {
            return Err(TooManyRanges);
        }
        self.ranges.splice(i..j, [(s, e)]);
        self.last = Span::new(s, e);
        Ok(())
    }

    /// If a range starts at or below `rcv_nxt`, removes it and returns its end (the new
    /// RCV.NXT).
    pub fn pop_front(&mut self, rcv_nxt: SeqNum) -> Option<SeqNum> {
        let first = *self.ranges.first()?;
        if first.0 <= rcv_nxt {
            self.ranges.remove(0);
            if self.ranges.is_empty() {
                // Every hole is filled: the list's memory goes back (an idle connection
                // holds none; the next out-of-order episode allocates again).
                self.ranges = Vec::new();
            }
            if self.last.is_some_and(|l| l.start == first.0) {
                self.last = None;
            }
            Some(first.1.max(rcv_nxt))
        } else {
            None
        }
    }

    /// Up to `n` SACK blocks, most recently changed range first (RFC 2018 §4).
    pub fn sack_blocks(&self, out: &mut [(SeqNum, SeqNum)]) -> usize {
        let mut k = 0;
        if let Some(l) = self.last.map(Span::pair) {
            if let Some(r) = self.ranges.iter().find(|r| r.0 <= l.0 && l.1 <= r.1) {
                if k < out.len() {
                    out[k] = *r;
                    k += 1;
                }
            }
        }
        for r in self.ranges.iter().rev() {
            if k >= out.len() {
                break;
            }
            if k > 0 && out[0] == *r {
                continue;
            }
            out[k] = *r;
            k += 1;
        }
        k
    }

    /// The first part of `[start, end)` already held out of order, if any (a duplicate).
    pub fn overlap(&self, start: SeqNum, end: SeqNum) -> Option<(SeqNum, SeqNum)> {
        let i = self.ranges.partition_point(|r| r.1 <= start);
        let r = self.ranges.get(i)?;
        let (s, e) = (start.max(r.0), end.min(r.1));
        (s < e).then_some((s, e))
    }

    /// Records `[start, end)` as a duplicate to report as a D-SACK block. RFC 2883 §4: "each
    /// duplicate contiguous sequence of data received is reported in at most one D-SACK
    /// block"; a second duplicate before the ACK went out extends a pending block it touches
    /// (one contiguous duplicate), else replaces it (the ACK for the first was owed at once).
    pub fn set_dsack(&mut self, start: SeqNum, end: SeqNum) {
        let merged = match self.dsack.map(Span::pair) {
            Some((s, e)) if start <= e && s <= end => Span::new(s.min(start), e.max(end)),
            _ => Span::new(start, end),
        };
        if merged.is_some() {
            self.dsack = merged;
        }
    }

    /// The duplicate to report in the next ACK, if any.
    pub fn dsack(&self) -> Option<(SeqNum, SeqNum)> {
        self.dsack.map(Span::pair)
    }

    /// The D-SACK block went out: it is reported once.
    pub fn dsack_sent(&mut self) {
        self.dsack = None;
    }

    /// Heap bytes held now (the range list's allocation).
    pub fn heap_bytes(&self) -> usize {
        self.ranges.capacity() * std::mem::size_of::<(SeqNum, SeqNum)>()
    }

    /// Forgets everything.
    pub fn clear(&mut self) {
        self.ranges.clear();
        self.last = None;
        self.dsack = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(n: u32) -> SeqNum {
        SeqNum(n)
    }

    #[test]
    fn merges_and_pops() {
        let mut a = Assembler::new(4);
        a.add(s(20), s(30)).unwrap();
        a.add(s(40), s(50)).unwrap();
        a.add(s(30), s(40)).unwrap();
        assert_eq!(a.ranges(), &[(s(20), s(50))]);
        assert_eq!(a.pop_front(s(10)), None);
        assert_eq!(a.pop_front(s(20)), Some(s(50)));
        assert!(a.is_empty());
    }

    #[test]
    fn bounded_ranges() {
        let mut a = Assembler::new(2);
        a.add(s(10), s(11)).unwrap();
        a.add(s(20), s(21)).unwrap();
        assert_eq!(a.add(s(30), s(31)), Err(TooManyRanges));
        // Merging into an existing range is still allowed.
        a.add(s(21), s(25)).unwrap();
        assert_eq!(a.ranges(), &[(s(10), s(11)), (s(20), s(25))]);
    }

    #[test]
    fn sack_blocks_most_recent_first() {
        let mut a = Assembler::new(8);
        a.add(s(100), s(110)).unwrap();
        a.add(s(300), s(310)).unwrap();
        a.add(s(200), s(210)).unwrap();
        let mut out = [(s(0), s(0)); 3];
        assert_eq!(a.sack_blocks(&mut out), 3);
        assert_eq!(out[0], (s(200), s(210)));
        assert!(out[1..].contains(&(s(100), s(110))) && out[1..].contains(&(s(300), s(310))));
    }

    #[test]
    fn overlap_and_dsack() {
        let mut a = Assembler::new(8);
        a.add(s(100), s(200)).unwrap();
        a.add(s(300), s(400)).unwrap();
        assert_eq!(a.overlap(s(50), s(100)), None);
        assert_eq!(a.overlap(s(150), s(250)), Some((s(150), s(200))));
        assert_eq!(a.overlap(s(250), s(350)), Some((s(300), s(350))));
        assert_eq!(a.overlap(s(200), s(300)), None);
        assert_eq!(a.dsack(), None);
        a.set_dsack(s(10), s(20));
        a.set_dsack(s(20), s(30)); // contiguous: one block
        assert_eq!(a.dsack(), Some((s(10), s(30))));
        a.set_dsack(s(50), s(60)); // elsewhere: replaces
        assert_eq!(a.dsack(), Some((s(50), s(60))));
        a.dsack_sent();
        assert_eq!(a.dsack(), None);
        // An idle assembler with both its ranges unset costs no more than before D-SACK.
        assert!(std::mem::size_of::<Assembler>() <= 48);
    }

    #[test]
    fn wraps_around_zero() {
        let mut a = Assembler::new(4);
        a.add(s(u32::MAX - 5), s(5)).unwrap();
        a.add(s(5), s(10)).unwrap();
        assert_eq!(a.ranges(), &[(s(u32::MAX - 5), s(10))]);
    }
}
