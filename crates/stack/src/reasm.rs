//! IPv4 fragment reassembly (RFC 791 §3.2, RFC 815) with a hard memory cap, a timeout, and
//! overlap rejection: a datagram any of whose fragments overlap is discarded whole (the rule
//! RFC 5722 sets for IPv6, applied here as Linux does for IPv4 since 2018; it defeats
//! overlap-based filter evasion). An exact duplicate of a received fragment is ignored.

use flowstack_wire::ipv4::{IpProtocol, Ipv4Repr};
use flowstack_wire::{Duration, Instant, Ipv4Address};
use std::collections::HashMap;

/// Reassembly limits.
#[derive(Debug, Clone, Copy)]
pub struct ReasmConfig {
    /// Most bytes held in incomplete datagrams (payload plus per-fragment overhead).
    pub max_bytes: usize,
    /// How long an incomplete datagram is kept (RFC 791 suggests 15 s; Linux uses 30 s).
    pub timeout: Duration,
    /// Most incomplete datagrams at once.
    pub max_datagrams: usize,
}

impl Default for ReasmConfig {
    fn default() -> Self {
        Self {
            max_bytes: 4 << 20,
            timeout: Duration::from_secs(30),
            max_datagrams: 1024,
        }
    }
}

/// Bookkeeping cost charged per stored fragment on top of its payload.
const FRAGMENT_OVERHEAD: usize = 64;

type Key = (Ipv4Address, Ipv4Address, u8, u16);

#[derive(Debug)]
struct Partial {
    /// Fragments sorted by offset: (start, bytes).
    frags: Vec<(usize, Vec<u8>)>,
    total: Option<usize>,
    first_seen: Instant,
    charged: usize,
}

/// Why a fragment did not complete a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReasmEvent {
    /// Stored; more fragments are needed.
    Incomplete,
    /// Ignored: an exact duplicate of a stored fragment.
    Duplicate,
    /// The fragment overlapped another; the whole datagram was discarded.
    Overlap,
    /// The fragment is malformed (length not a multiple of 8, past 64 KiB, inconsistent end).
    Invalid,
    /// Limits forced a drop.
    NoMemory,
}

/// Incomplete datagrams.
#[derive(Debug)]
pub(crate) struct Reassembler {
    cfg: ReasmConfig,
    partials: HashMap<Key, Partial>,
    used: usize,
    /// Datagrams evicted to make room since [`Reassembler::take_evicted`] last ran.
    evicted: u64,
}

impl Reassembler {
    /// An empty reassembler.
    pub fn new(cfg: ReasmConfig) -> Self {
        Self {
            cfg,
            partials: HashMap::new(),
            used: 0,
            evicted: 0,
        }
    }

    /// Datagrams evicted to make room since the last call (the engine counts them as
    /// reassembly failures); resets the count.
    #[inline]
    pub fn take_evicted(&mut self) -> u64 {
        std::mem::take(&mut self.evicted)
    }

    /// Bytes currently charged to incomplete datagrams.
    pub fn memory_used(&self) -> usize {
        self.used
    }

    /// True if nothing is held.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.partials.is_empty()
    }

    /// Adds one fragment. On completion returns the whole datagram's header and payload.
    pub fn input(
        &mut self,
        now: Instant,
        ip: &Ipv4Repr,
        payload: &[u8],
    ) -> Result<(Ipv4Repr, Vec<u8>), ReasmEvent> {
        let start = ip.frag_offset as usize;
        let end = start + payload.len();
        // RFC 791: every fragment but the last carries a multiple of 8 bytes.
        if (ip.more_frags && (payload.is_empty() || !payload.len().is_multiple_of(8)))
            || end > 65535 - 20
        {
            return Err(ReasmEvent::Invalid);
        }
        let key = (ip.src, ip.dst, u8::from(ip.protocol), ip.ident);
        let cost = payload.len() + FRAGMENT_OVERHEAD;
        if cost > self.cfg.max_bytes {
            return Err(ReasmEvent::NoMemory);
        }
        if !self.partials.contains_key(&key) && self.partials.len() >= self.cfg.max_datagrams {
            self.evict_oldest();
        }
        while self.used + cost > self.cfg.max_bytes {
            if !self.evict_oldest_except(key) {
                return Err(ReasmEvent::NoMemory);
            }
        }
        let p = self.partials.entry(key).or_insert_with(|| Partial {
            frags: Vec::new(),
            total: None,
            first_seen: now,
            charged: 0,
        });
        let at = p.frags.partition_point(|f| f.0 < start);
        if let Some(f) = p.frags.get(at) {
            if f.0 == start && f.1.len() == payload.len() && (ip.more_frags || p.total == Some(end))
            {
                return Err(ReasmEvent::Duplicate);
            }
        }
        let overlaps_prev = at > 0 && {
            let f = &p.frags[at - 1];
            f.0 + f.1.len() > start
        };
        let overlaps_next = p.frags.get(at).is_some_and(|f| f.0 < end);
        let bad_end = if ip.more_frags {
            p.total.is_some_and(|t| end > t)
        } else {
            p.total.is_some_and(|t| t != end)
                || p.frags.last().is_some_and(|f| f.0 + f.1.len() > end)
        };
        if overlaps_prev || overlaps_next || bad_end {
            let ev = if bad_end {
                ReasmEvent::Invalid
            } else {
                ReasmEvent::Overlap
            };
            let charged = p.charged;
            self.partials.remove(&key);
            self.used -= charged;
            return Err(ev);
        }
        if !ip.more_frags {
            p.total = Some(end);
        }
        p.frags.insert(at, (start, payload.to_vec()));
        p.charged += cost;
        self.used += cost;
        // Complete when the fragments tile 0..total with no gap (overlaps were refused above).
        let Some(total) = p.total else {
            return Err(ReasmEvent::Incomplete);
        };
        let mut next = 0;
        for f in &p.frags {
            if f.0 != next {
                return Err(ReasmEvent::Incomplete);
            }
            next += f.1.len();
        }
        if next != total {
            return Err(ReasmEvent::Incomplete);
        }
        let p = self.partials.remove(&key).expect("present");
        self.used -= p.charged;
        let mut data = Vec::with_capacity(total);
        for (_, f) in p.frags {
            data.extend_from_slice(&f);
        }
        let mut whole = *ip;
        whole.payload_len = total;
        whole.more_frags = false;
        whole.frag_offset = 0;
        whole.protocol = IpProtocol::from(key.2);
        Ok((whole, data))
    }

    fn evict_oldest(&mut self) -> bool {
        self.evict_where(|_| true)
    }

    fn evict_oldest_except(&mut self, keep: Key) -> bool {
        self.evict_where(|k| *k != keep)
    }

    fn evict_where(&mut self, ok: impl Fn(&Key) -> bool) -> bool {
        let Some(k) = self
            .partials
            .iter()
            .filter(|(k, _)| ok(k))
            .min_by_key(|(_, p)| p.first_seen)
            .map(|(k, _)| *k)
        else {
            return false;
        };
        let p = self.partials.remove(&k).expect("present");
        self.used -= p.charged;
        self.evicted += 1;
        true
    }

    /// Drops datagrams older than the timeout; returns how many.
    pub fn on_timer(&mut self, now: Instant) -> usize {
        let timeout = self.cfg.timeout;
        let before = self.partials.len();
        let mut freed = 0;
        self.partials.retain(|_, p| {
            let keep = now.saturating_since(p.first_seen) < timeout;
            if !keep {
                freed += p.charged;
            }
            keep
        });
        self.used -= freed;
        before - self.partials.len()
    }

    /// When the oldest datagram times out.
    pub fn poll_at(&self) -> Option<Instant> {
        self.partials
            .values()
            .map(|p| p.first_seen + self.cfg.timeout)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frag(ident: u16, off: usize, len: usize, more: bool) -> (Ipv4Repr, Vec<u8>) {
        let mut r = Ipv4Repr::new(
            Ipv4Address::new(10, 0, 0, 1),
            Ipv4Address::new(10, 0, 0, 2),
            IpProtocol::Udp,
            len,
        );
        r.ident = ident;
        r.dont_frag = false;
        r.more_frags = more;
        r.frag_offset = off as u16;
        let data = (off..off + len).map(|i| (i % 251) as u8).collect();
        (r, data)
    }

    fn feed(
        r: &mut Reassembler,
        f: &(Ipv4Repr, Vec<u8>),
    ) -> Result<(Ipv4Repr, Vec<u8>), ReasmEvent> {
        r.input(Instant::ZERO, &f.0, &f.1)
    }

    fn expected(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8).collect()
    }

    #[test]
    fn in_order_fragments_reassemble() {
        let mut r = Reassembler::new(ReasmConfig::default());
        assert_eq!(
            feed(&mut r, &frag(1, 0, 1480, true)).unwrap_err(),
            ReasmEvent::Incomplete
        );
        assert_eq!(
            feed(&mut r, &frag(1, 1480, 1480, true)).unwrap_err(),
            ReasmEvent::Incomplete
        );
        let (h, d) = feed(&mut r, &frag(1, 2960, 40, false)).unwrap();
        assert_eq!(d, expected(3000));
        assert_eq!(h.payload_len, 3000);
        assert!(!h.is_fragment());
        assert!(r.is_empty() && r.memory_used() == 0);
    }

    #[test]
    fn out_of_order_fragments_reassemble() {
        let mut r = Reassembler::new(ReasmConfig::default());
        feed(&mut r, &frag(2, 2960, 40, false)).unwrap_err();
        feed(&mut r, &frag(2, 0, 1480, true)).unwrap_err();
        assert_eq!(
            feed(&mut r, &frag(2, 0, 1480, true)).unwrap_err(),
            ReasmEvent::Duplicate
        );
        let (_, d) = feed(&mut r, &frag(2, 1480, 1480, true)).unwrap();
        assert_eq!(d, expected(3000));
    }

    #[test]
    fn overlapping_fragment_discards_datagram() {
        let mut r = Reassembler::new(ReasmConfig::default());
        feed(&mut r, &frag(3, 0, 1480, true)).unwrap_err();
        assert_eq!(
            feed(&mut r, &frag(3, 1472, 800, true)).unwrap_err(),
            ReasmEvent::Overlap
        );
        assert!(r.is_empty());
        // The rest of the datagram then never completes it.
        assert_eq!(
            feed(&mut r, &frag(3, 1480, 40, false)).unwrap_err(),
            ReasmEvent::Incomplete
        );
    }

    #[test]
    fn inconsistent_end_and_bad_length_are_invalid() {
        let mut r = Reassembler::new(ReasmConfig::default());
        assert_eq!(
            feed(&mut r, &frag(4, 0, 100, true)).unwrap_err(),
            ReasmEvent::Invalid
        );
        feed(&mut r, &frag(4, 0, 1480, true)).unwrap_err();
        feed(&mut r, &frag(4, 2960, 40, false)).unwrap_err();
        assert_eq!(
            feed(&mut r, &frag(4, 1480, 40, false)).unwrap_err(),
            ReasmEvent::Invalid
        );
    }

    #[test]
    fn flood_of_incomplete_fragments_stays_under_cap() {
        let cfg = ReasmConfig {
            max_bytes: 256 * 1024,
            ..Default::default()
        };
        let mut r = Reassembler::new(cfg);
        for id in 0..20_000u16 {
            let _ = feed(&mut r, &frag(id, 0, 1480, true));
            assert!(r.memory_used() <= cfg.max_bytes);
        }
        assert!(r.evicted > 0);
        // A legitimate datagram still gets through the flood.
        feed(&mut r, &frag(60_000, 0, 1480, true)).unwrap_err();
        assert!(feed(&mut r, &frag(60_000, 1480, 20, false)).is_ok());
    }

    #[test]
    fn incomplete_datagrams_time_out() {
        let mut r = Reassembler::new(ReasmConfig::default());
        feed(&mut r, &frag(5, 0, 1480, true)).unwrap_err();
        assert_eq!(r.poll_at(), Some(Instant::from_millis(30_000)));
        assert_eq!(r.on_timer(Instant::from_millis(29_999)), 0);
        assert_eq!(r.on_timer(Instant::from_millis(30_000)), 1);
        assert_eq!(r.memory_used(), 0);
    }
}
