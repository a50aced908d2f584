//! The ARP cache (RFC 826, RFC 1122 §2.3.2): resolved entries with expiry, a bounded queue of
//! datagrams waiting for resolution, and request rate limiting.

use flowstack_wire::{Duration, EthernetAddress, Instant, Ipv4Address};
use std::collections::{HashMap, VecDeque};

/// ARP limits and timers.
#[derive(Debug, Clone, Copy)]
pub struct ArpConfig {
    /// How long a resolved entry stays valid.
    pub entry_ttl: Duration,
    /// Most resolved entries kept.
    pub max_entries: usize,
    /// Most datagrams queued per unresolved address (RFC 1122 §2.3.2.2 asks for at least one).
    pub queue_per_addr: usize,
    /// Most datagrams queued for all unresolved addresses together.
    pub queue_total: usize,
    /// Least time between two requests for one address.
    pub request_interval: Duration,
    /// Requests sent before giving up on an address.
    pub max_requests: u32,
}

impl Default for ArpConfig {
    fn default() -> Self {
        Self {
            entry_ttl: Duration::from_secs(60),
            max_entries: 1024,
            queue_per_addr: 64,
            queue_total: 1024,
            request_interval: Duration::from_secs(1),
            max_requests: 3,
        }
    }
}

#[derive(Debug)]
struct Pending {
    /// IP datagrams (no Ethernet header) waiting for the address.
    queue: VecDeque<Vec<u8>>,
    last_request: Instant,
    requests: u32,
}

/// What the engine should do after a cache operation.
#[derive(Debug, Default)]
pub(crate) struct Flushed {
    /// The address resolved, with the datagrams to send to it now. (The interface already
    /// holds the MAC it just learned; only the tests read this.)
    #[cfg_attr(not(test), allow(dead_code))]
    pub mac: Option<EthernetAddress>,
    /// Datagrams released (send them to `mac`).
    pub packets: Vec<Vec<u8>>,
    /// The cache was full: the entry closest to expiry made room.
    pub evicted: bool,
}

/// Outcome of queueing a datagram behind resolution.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Enqueued {
    /// Queued; send a request now.
    SendRequest,
    /// Queued; a request went out less than `request_interval` ago.
    Waiting,
    /// The queue is full; the datagram was dropped.
    Dropped,
}

/// The cache.
#[derive(Debug)]
pub(crate) struct ArpCache {
    cfg: ArpConfig,
    entries: HashMap<Ipv4Address, (EthernetAddress, Instant)>,
    pending: HashMap<Ipv4Address, Pending>,
    queued: usize,
}

impl ArpCache {
    /// An empty cache.
    pub fn new(cfg: ArpConfig) -> Self {
        Self {
            cfg,
            entries: HashMap::new(),
            pending: HashMap::new(),
            queued: 0,
        }
    }

    /// The MAC for `ip` if resolved and not expired.
    pub fn lookup(&self, now: Instant, ip: Ipv4Address) -> Option<EthernetAddress> {
        match self.entries.get(&ip) {
            Some(&(mac, exp)) if exp > now => Some(mac),
            _ => None,
        }
    }

    /// True if an entry exists (even expired) or a request is outstanding for `ip`: the only
    /// cases in which a reply may update the cache.
    pub fn knows(&self, ip: Ipv4Address) -> bool {
        self.entries.contains_key(&ip) || self.pending.contains_key(&ip)
    }

    /// Records `ip` at `mac` and returns the datagrams that were waiting for it.
    pub fn insert(&mut self, now: Instant, ip: Ipv4Address, mac: EthernetAddress) -> Flushed {
        let full = self.entries.len() >= self.cfg.max_entries && !self.entries.contains_key(&ip);
        if full {
            // Evict the entry closest to expiry.
            if let Some(old) = self
                .entries
                .iter()
                .min_by_key(|(_, v)| v.1)
                .map(|(k, _)| *k)
            {
                self.entries.remove(&old);
            }
        }
        self.entries.insert(ip, (mac, now + self.cfg.entry_ttl));
        match self.pending.remove(&ip) {
            Some(p) => {
                self.queued -= p.queue.len();
                Flushed {
                    mac: Some(mac),
                    packets: p.queue.into(),
                    evicted: full,
                }
            }
            None => Flushed {
                evicted: full,
                ..Flushed::default()
            },
        }
    }

    /// Queues a datagram for `ip` until it resolves.
    pub fn enqueue(&mut self, now: Instant, ip: Ipv4Address, datagram: Vec<u8>) -> Enqueued {
        let cfg = self.cfg;
        let total_full = self.queued >= cfg.queue_total;
        let p = self.pending.entry(ip).or_insert_with(|| Pending {
            queue: VecDeque::new(),
            last_request: Instant::ZERO,
            requests: 0,
        });
        if total_full || p.queue.len() >= cfg.queue_per_addr {
            return Enqueued::Dropped;
        }
        p.queue.push_back(datagram);
        self.queued += 1;
        // RFC 1122 §2.3.2.1: no more than one request per second per address.
        if p.requests == 0 || now.saturating_since(p.last_request) >= cfg.request_interval {
            p.requests += 1;
            p.last_request = now;
            Enqueued::SendRequest
        } else {
            Enqueued::Waiting
        }
    }

    /// Retries and expiries due at `now`: returns addresses to request again, and the number of
    /// datagrams dropped because their address failed to resolve.
    pub fn on_timer(&mut self, now: Instant, retry: &mut Vec<Ipv4Address>) -> usize {
        let cfg = self.cfg;
        let mut failed = 0;
        self.pending.retain(|ip, p| {
            if now.saturating_since(p.last_request) < cfg.request_interval {
                return true;
            }
            if p.requests >= cfg.max_requests {
                failed += p.queue.len();
                return false;
            }
            p.requests += 1;
            p.last_request = now;
            retry.push(*ip);
            true
        });
        self.queued -= failed;
        self.entries.retain(|_, v| v.1 > now);
        failed
    }

    /// When [`ArpCache::on_timer`] next has work: a retry, or the earliest entry expiry
    /// (expired entries are also ignored by `lookup`, so sweeping them is only housekeeping).
    pub fn poll_at(&self) -> Option<Instant> {
        let retry = self
            .pending
            .values()
            .map(|p| p.last_request + self.cfg.request_interval)
            .min();
        let expiry = self.entries.values().map(|e| e.1).min();
        match (retry, expiry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Resolved entries (for `arp -n`-style display).
    pub fn entries(&self) -> impl Iterator<Item = (Ipv4Address, EthernetAddress, Instant)> + '_ {
        self.entries
            .iter()
            .map(|(ip, (mac, exp))| (*ip, *mac, *exp))
    }

    /// Datagrams currently waiting for resolution.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 9);
    const MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 9]);

    #[test]
    fn one_request_per_interval_and_flush_on_insert() {
        let mut c = ArpCache::new(ArpConfig::default());
        let t0 = Instant::from_millis(10);
        assert_eq!(c.enqueue(t0, IP, vec![1]), Enqueued::SendRequest);
        assert_eq!(
            c.enqueue(t0 + Duration::from_millis(500), IP, vec![2]),
            Enqueued::Waiting
        );
        assert_eq!(
            c.enqueue(t0 + Duration::from_millis(1000), IP, vec![3]),
            Enqueued::SendRequest
        );
        let f = c.insert(t0, IP, MAC);
        assert_eq!(f.mac, Some(MAC));
        assert_eq!(f.packets, vec![vec![1], vec![2], vec![3]]);
        assert_eq!(c.lookup(t0, IP), Some(MAC));
        assert_eq!(c.queued(), 0);
    }

    #[test]
    fn queue_is_bounded() {
        let cfg = ArpConfig {
            queue_per_addr: 2,
            ..Default::default()
        };
        let mut c = ArpCache::new(cfg);
        c.enqueue(Instant::ZERO, IP, vec![]);
        c.enqueue(Instant::ZERO, IP, vec![]);
        assert_eq!(c.enqueue(Instant::ZERO, IP, vec![]), Enqueued::Dropped);
    }

    #[test]
    fn entries_expire_and_resolution_gives_up() {
        let mut c = ArpCache::new(ArpConfig::default());
        c.insert(Instant::ZERO, IP, MAC);
        assert_eq!(c.lookup(Instant::from_millis(61_000), IP), None);
        let other = Ipv4Address::new(10, 0, 0, 8);
        c.enqueue(Instant::ZERO, other, vec![0]);
        let mut retry = vec![];
        let mut t = Instant::ZERO;
        let mut failed = 0;
        for _ in 0..5 {
            t += Duration::from_secs(1);
            failed += c.on_timer(t, &mut retry);
        }
        assert_eq!(retry, vec![other, other]);
        assert_eq!(failed, 1);
        assert!(!c.knows(other));
    }
}
