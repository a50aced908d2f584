//! The sender's SACK scoreboard (RFC 6675 §3): which ranges above SND.UNA the peer holds.

use flowstack_wire::tcp::SackBlock;
use flowstack_wire::SeqNum;

/// RFC 6675 §2: DupThresh.
pub const DUP_THRESH: usize = 3;

/// Sorted, disjoint SACKed ranges within `[SND.UNA, SND.NXT)`.
#[derive(Debug, Default)]
pub struct Scoreboard {
    blocks: Vec<(SeqNum, SeqNum)>,
    max: usize,
}

impl Scoreboard {
    /// A scoreboard holding at most `max` ranges (older information is dropped beyond that).
    pub fn new(max: usize) -> Self {
        Self {
            blocks: Vec::new(),
            max,
        }
    }

    /// Merges the blocks of one ACK; blocks outside `(una, nxt]` are ignored (RFC 2018 D-SACK
    /// or bogus). Returns true if anything new was learned.
    pub fn update(&mut self, una: SeqNum, nxt: SeqNum, sacks: &[SackBlock]) -> bool {
        let mut changed = false;
        for b in sacks {
            if !(una < b.right && b.left < b.right && b.right <= nxt) {
                continue;
            }
            let (s, e) = (b.left.max(una), b.right);
            let i = self.blocks.partition_point(|r| r.1 < s);
            let mut j = i;
            let (mut ns, mut ne) = (s, e);
            while j < self.blocks.len() && self.blocks[j].0 <= ne {
                ns = ns.min(self.blocks[j].0);
                ne = ne.max(self.blocks[j].1);
                j += 1;
            }
            if j == i + 1 && self.blocks[i] == (ns, ne) {
                continue;
            }
            if i == j && self.blocks.len() >= self.max {
                continue;
            }
            self.blocks.splice(i..j, [(ns, ne)]);
            changed = true;
        }
        changed
    }

    /// Drops everything below the new SND.UNA.
    pub fn advance(&mut self, una: SeqNum) {
        self.blocks.retain(|r| r.1 > una);
        if self.blocks.is_empty() && self.blocks.capacity() > 0 {
            // Everything SACKed is now cumulatively acknowledged (recovery is over): the
            // list's memory goes back, so an idle connection holds none.
            self.blocks = Vec::new();
        }
        if let Some(f) = self.blocks.first_mut() {
            f.0 = f.0.max(una);
        }
    }

    /// Bytes SACKed.
    pub fn sacked_bytes(&self) -> usize {
        self.blocks.iter().map(|r| r.1 - r.0).sum()
    }

    /// The highest SACKed sequence number (exclusive end).
    pub fn high(&self) -> Option<SeqNum> {
        self.blocks.last().map(|r| r.1)
    }

    /// True if nothing is SACKed.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// RFC 6675 §4 IsLost: more than (DupThresh − 1)·MSS bytes SACKed above `seq`, with the
    /// DupThresh in force (lower for a small flight, see RFC 5827).
    pub fn is_lost(&self, seq: SeqNum, mss: usize, dup_thresh: usize) -> bool {
        let above: usize = self
            .blocks
            .iter()
            .filter(|r| r.1 > seq)
            .map(|r| r.1 - r.0.max(seq))
            .sum();
        above > (dup_thresh - 1) * mss
    }

    /// The first un-SACKed range at or after `from` that lies below the highest SACK.
    pub fn next_hole(&self, from: SeqNum) -> Option<(SeqNum, SeqNum)> {
        let mut cur = from;
        for r in &self.blocks {
            if r.1 <= cur {
                continue;
            }
            if r.0 > cur {
                return Some((cur, r.0));
            }
            cur = r.1;
        }
        None
    }

    /// Bytes in holes below the highest SACK that lie at or above `from`.
    pub fn hole_bytes_from(&self, from: SeqNum) -> usize {
        let mut n = 0;
        let mut cur = from;
        while let Some((s, e)) = self.next_hole(cur) {
            n += e - s;
            cur = e;
        }
        n
    }

    /// If `seq` lies in a SACKed block, the end of that block.
    pub fn sacked_until(&self, seq: SeqNum) -> Option<SeqNum> {
        self.blocks
            .iter()
            .find(|r| r.0 <= seq && seq < r.1)
            .map(|r| r.1)
    }

    /// The start of the first SACKed block above `seq`.
    pub fn next_sacked_after(&self, seq: SeqNum) -> Option<SeqNum> {
        self.blocks.iter().find(|r| r.0 > seq).map(|r| r.0)
    }

    /// Heap bytes held now (the block list's allocation).
    pub fn heap_bytes(&self) -> usize {
        self.blocks.capacity() * std::mem::size_of::<(SeqNum, SeqNum)>()
    }

    /// Forgets everything (the receiver may have reneged).
    pub fn clear(&mut self) {
        self.blocks.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(l: u32, r: u32) -> SackBlock {
        SackBlock {
            left: SeqNum(l),
            right: SeqNum(r),
        }
    }

    #[test]
    fn holes_and_loss() {
        let mut s = Scoreboard::new(8);
        assert!(s.update(SeqNum(0), SeqNum(10_000), &[b(2000, 3000), b(4000, 6000)]));
        assert!(!s.update(SeqNum(0), SeqNum(10_000), &[b(2000, 3000)]));
        assert_eq!(s.sacked_bytes(), 3000);
        assert_eq!(s.next_hole(SeqNum(0)), Some((SeqNum(0), SeqNum(2000))));
        assert_eq!(
            s.next_hole(SeqNum(2000)),
            Some((SeqNum(3000), SeqNum(4000)))
        );
        assert_eq!(s.next_hole(SeqNum(6000)), None);
        assert!(s.is_lost(SeqNum(0), 1000, DUP_THRESH));
        assert!(!s.is_lost(SeqNum(3000), 1000, DUP_THRESH));
        assert_eq!(s.hole_bytes_from(SeqNum(0)), 3000);
        s.advance(SeqNum(2500));
        assert_eq!(s.sacked_bytes(), 2500);
        // Blocks outside the window are ignored.
        assert!(!s.update(
            SeqNum(2500),
            SeqNum(10_000),
            &[b(9000, 12_000), b(100, 200)]
        ));
    }
}
