//! The TCP table's 4-tuple → slot map, in 8 bytes a bucket (issue 19: a `HashMap<FourTuple,
//! u32>` costs 17 bytes a bucket, about 30 per connection).
//!
//! Open addressing with linear probing and backward-shift deletion. A bucket holds the slot
//! and 32 bits of the key's hash; the key is the connection's own 4-tuple, read back through
//! `key_of` (the table never stores it twice) only when the hash bits match, so a probe
//! rarely touches a connection it does not want. Buckets are a power of two, at most 7/8
//! full. Lookups hash with
//! the standard library's randomly keyed SipHash, as `HashMap` did, so a peer cannot aim
//! its tuples at one bucket chain.

use flowstack_tcp::FourTuple;
use std::hash::{BuildHasher, RandomState};

/// An empty bucket.
const EMPTY: u64 = u64::MAX;

/// 4-tuple → slot.
pub(crate) struct Demux {
    /// `tag << 32 | slot`, where `tag` is the high half of the key's hash: it places the
    /// entry (its low bits are the home bucket) and screens probes.
    buckets: Vec<u64>,
    len: usize,
    hasher: RandomState,
}

#[inline]
fn tag_of(b: u64) -> u32 {
    (b >> 32) as u32
}

#[inline]
fn slot_of(b: u64) -> u32 {
    b as u32
}

impl Demux {
    pub(crate) fn new() -> Self {
        Self {
            buckets: Vec::new(),
            len: 0,
            hasher: RandomState::new(),
        }
    }

    /// The key's hash: the 4-tuple packed into one 96-bit value, hashed with one write (the
    /// derived `Hash` made six small writes, each a pass through SipHash's buffering: the
    /// lookup was 2–3% of the daemon's CPU under `wrk`). Same keyed SipHash, same spread.
    #[inline]
    fn tag(&self, t: &FourTuple) -> u32 {
        let k = (t.local_ip.to_u32() as u128) << 64
            | (t.remote_ip.to_u32() as u128) << 32
            | (t.local_port as u128) << 16
            | t.remote_port as u128;
        (self.hasher.hash_one(k) >> 32) as u32
    }

    #[inline]
    fn home(&self, tag: u32) -> usize {
        tag as usize & (self.buckets.len() - 1)
    }

    /// The bucket holding `t`, if any.
    #[inline]
    fn find(&self, t: &FourTuple, key_of: impl Fn(u32) -> FourTuple) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mask = self.buckets.len() - 1;
        let tag = self.tag(t);
        let mut i = self.home(tag);
        loop {
            match self.buckets[i] {
                EMPTY => return None,
                b if tag_of(b) == tag && key_of(slot_of(b)) == *t => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// The slot of `t`.
    #[inline]
    pub(crate) fn get(&self, t: &FourTuple, key_of: impl Fn(u32) -> FourTuple) -> Option<u32> {
        self.find(t, key_of).map(|i| slot_of(self.buckets[i]))
    }

    /// Adds `slot` under `t` (which is not present).
    pub(crate) fn insert(&mut self, t: &FourTuple, slot: u32) {
        if (self.len + 1) * 8 > self.buckets.len() * 7 {
            self.grow();
        }
        let tag = self.tag(t);
        self.place((u64::from(tag) << 32) | u64::from(slot));
        self.len += 1;
    }

    fn place(&mut self, b: u64) {
        let mask = self.buckets.len() - 1;
        let mut i = self.home(tag_of(b));
        while self.buckets[i] != EMPTY {
            i = (i + 1) & mask;
        }
        self.buckets[i] = b;
    }

    /// Doubles the buckets (entries carry their tag, so nothing is hashed again).
    fn grow(&mut self) {
        let size = (self.buckets.len() * 2).max(16);
        let old = std::mem::replace(&mut self.buckets, vec![EMPTY; size]);
        for b in old.into_iter().filter(|&b| b != EMPTY) {
            self.place(b);
        }
    }

    /// Removes `t`; its slot must still answer `key_of` (remove before freeing the slot).
    pub(crate) fn remove(&mut self, t: &FourTuple, key_of: impl Fn(u32) -> FourTuple) {
        let Some(mut hole) = self.find(t, key_of) else {
            return;
        };
        let mask = self.buckets.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let b = self.buckets[j];
            if b == EMPTY {
                break;
            }
            // Move the entry into the hole unless its home lies cyclically in (hole, j]:
            // then it is still reachable from its home without crossing the hole.
            let h = self.home(tag_of(b));
            let reachable = if hole < j {
                hole < h && h <= j
            } else {
                hole < h || h <= j
            };
            if !reachable {
                self.buckets[hole] = b;
                hole = j;
            }
        }
        self.buckets[hole] = EMPTY;
        self.len -= 1;
    }

    /// Bytes allocated (8 a bucket).
    pub(crate) fn heap_bytes(&self) -> usize {
        self.buckets.capacity() * std::mem::size_of::<u64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flowstack_wire::ipv4::Ipv4Address;

    fn tuple(n: u32) -> FourTuple {
        FourTuple {
            local_ip: Ipv4Address::new(10, 0, 0, 1),
            local_port: 80,
            remote_ip: Ipv4Address((n >> 16).to_be_bytes()),
            remote_port: n as u16,
        }
    }

    /// Inserts, finds and removes thousands of keys (slot n holds tuple n), checking after
    /// every removal that every remaining key is still found and removed ones are not.
    #[test]
    fn finds_what_it_holds_through_growth_and_removal() {
        let key = |s: u32| tuple(s * 7919);
        let mut d = Demux::new();
        for s in 0..3000 {
            d.insert(&key(s), s);
        }
        assert_eq!(d.heap_bytes(), 4096 * 8);
        for s in 0..3000 {
            assert_eq!(d.get(&key(s), key), Some(s));
        }
        for s in (0..3000).step_by(3) {
            d.remove(&key(s), key);
            assert_eq!(d.get(&key(s), key), None);
        }
        for s in 0..3000 {
            let want = (s % 3 != 0).then_some(s);
            assert_eq!(d.get(&key(s), key), want, "slot {s}");
        }
        assert_eq!(d.len, 2000);
    }
}
