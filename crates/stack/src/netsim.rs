//! Deterministic network simulation: engines over an in-process link with seeded fault
//! injection and a virtual clock. A failing seed reproduces exactly.
//!
//! Virtual time advances by `step_cost` for every turn in which frames moved, and jumps to the
//! next deadline (timer or delayed frame) when nothing did.

use crate::{Engine, EngineConfig, IfaceConfig};
use flowstack_link::impair::{ImpairSpec, Impaired};
use flowstack_link::pcap::{Pcap, PcapWriter};
use flowstack_link::pipe::{pipe, DEFAULT_CAPACITY};
use flowstack_link::TxBatch;
use flowstack_link::{Device, DeviceCaps, PartsSink, RxMeta};
use flowstack_wire::{Duration, EthernetAddress, Instant, Ipv4Address, Ipv4Cidr};
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io::{self, Write};
use std::rc::Rc;

/// A writer that several owners can share (the capture and whoever finishes it).
#[derive(Clone)]
pub struct SharedWriter(pub Rc<RefCell<Box<dyn Write>>>);

impl Write for SharedWriter {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.borrow_mut().write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.borrow_mut().flush()
    }
}

/// Address of host A in simulations.
pub const A_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
/// Address of host B in simulations.
pub const B_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

/// Two engines, A and B, on a virtual cable.
pub struct Net {
    /// Host A (10.0.0.1).
    pub a: Engine,
    /// Host B (10.0.0.2).
    pub b: Engine,
    dev_a: Box<dyn Device>,
    dev_b: Box<dyn Device>,
    /// The virtual clock.
    pub now: Instant,
    /// Virtual time charged per productive turn.
    pub step_cost: Duration,
    pcap: Option<SharedWriter>,
    tune: fn(&mut EngineConfig),
    /// What the path between A and B saw of A's frames.
    pub path: Rc<Cell<PathStats>>,
    /// When set, host B is not polled: it has vanished (crashed or unplugged) and answers
    /// nothing.
    pub b_down: bool,
}

/// How to build a [`Net`].
#[derive(Clone)]
pub struct NetConfig {
    /// Impairment applied to each direction.
    pub impair: ImpairSpec,
    /// Seed for the impairment RNGs (A→B uses `seed`, B→A `seed + 1`).
    pub seed: u64,
    /// Link capabilities.
    pub caps: DeviceCaps,
    /// Frames per direction the cable holds.
    pub capacity: usize,
    /// Adjusts each engine's configuration before it is built.
    pub tune: fn(&mut EngineConfig),
    /// A narrower hop on the path from A to B (a router with a smaller MTU), if any.
    pub path_mtu: Option<PathMtu>,
    /// Drops chosen TCP segments A sends: called with each segment's payload length, its
    /// FIN flag and a counter it may keep (starts at 0); returns true to drop the segment.
    pub drop_a: Option<DropFn>,
    /// The cable gathers (`Device::can_gather`, scatter-gather transmit): with checksums
    /// offloaded in `caps`, segments of zero-copy sends cross as header + a reference to the
    /// sender's memory. Impairment and capture read whole frames, so they cannot be combined
    /// with it ([`Net::new`] fails).
    pub gather: bool,
}

/// See [`NetConfig::drop_a`].
pub type DropFn = fn(payload_len: usize, fin: bool, state: &mut u32) -> bool;

/// A hop with a smaller MTU between A and B, as a router on the path would be: A's IPv4
/// datagrams longer than `mtu` are dropped there, and with `icmp` the router answers each
/// with ICMP "fragmentation needed" carrying `mtu` (RFC 1191 §4); without, it is a PMTU
/// black hole (ICMP filtered somewhere, RFC 2923 §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathMtu {
    /// Largest IPv4 datagram the hop forwards.
    pub mtu: usize,
    /// Whether the hop reports drops with ICMP.
    pub icmp: bool,
}

/// What the path saw of A's frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Largest TCP payload in a frame A sent.
    pub max_tcp_payload: usize,
    /// Datagrams dropped for being larger than the path MTU.
    pub too_big: u64,
    /// ICMP "fragmentation needed" messages sent back to A.
    pub icmp_sent: u64,
    /// Gathered frames A sent (payload referenced, not copied: [`NetConfig::gather`]),
    /// dropped ones included.
    pub gathered: u64,
    /// Payload bytes in those frames.
    pub gathered_bytes: u64,
}

/// The address of the router that reports a smaller MTU.
pub const ROUTER_IP: Ipv4Address = Ipv4Address::new(10, 0, 0, 254);

/// A's side of the cable seen through the path: measures A's frames and applies the
/// [`PathMtu`] hop.
struct PathDev {
    inner: Box<dyn Device>,
    hop: Option<PathMtu>,
    stats: Rc<Cell<PathStats>>,
    /// ICMP messages for A, delivered before the cable's frames.
    back: VecDeque<Vec<u8>>,
    pass: TxBatch,
    drop: Option<DropFn>,
    drop_state: u32,
    /// A gathered frame made whole for inspection.
    flat: Vec<u8>,
}

impl PathDev {
    /// Looks at one frame A sends; returns whether it goes on.
    fn inspect(&mut self, f: &[u8]) -> bool {
        use flowstack_wire::{ethernet, ipv4, tcp};
        let mut st = self.stats.get();
        let Ok(e) = ethernet::Frame::new_checked(f) else {
            return true;
        };
        let Ok(ip) = ipv4::Packet::new_checked(e.payload()) else {
            return true;
        };
        if ip.protocol() == ipv4::IpProtocol::Tcp {
            if let Ok(t) = tcp::Packet::new_checked(ip.payload()) {
                st.max_tcp_payload = st.max_tcp_payload.max(t.payload().len());
                if let Some(d) = self.drop {
                    if d(t.payload().len(), t.flags().fin(), &mut self.drop_state) {
                        return false;
                    }
                }
            }
        }
        let pass = match self.hop {
            Some(h) if ip.total_len() > h.mtu => {
                st.too_big += 1;
                if h.icmp {
                    st.icmp_sent += 1;
                    self.back.push_back(frag_needed(f, h.mtu));
                }
                false
            }
            _ => true,
        };
        self.stats.set(st);
        pass
    }
}

/// The frame a router sends back for A's frame `f` that does not fit `mtu` (RFC 792, RFC
/// 1191 §4): IP header plus the first 8 bytes of the datagram quoted.
fn frag_needed(f: &[u8], mtu: usize) -> Vec<u8> {
    use flowstack_wire::ethernet::EthernetRepr;
    use flowstack_wire::icmpv4::{DstUnreachable, Icmpv4Repr};
    use flowstack_wire::ipv4::{IpProtocol, Ipv4Repr};
    use flowstack_wire::{ChecksumCaps, EtherType};
    let ip = &f[14..];
    let quote = &ip[..(((ip[0] & 0xf) as usize) * 4 + 8).min(ip.len())];
    let icmp = Icmpv4Repr::DstUnreachable {
        reason: DstUnreachable::FragRequired,
        next_hop_mtu: mtu as u16,
        original: quote,
    };
    let src = Ipv4Address(ip[12..16].try_into().unwrap());
    let r = Ipv4Repr::new(ROUTER_IP, src, IpProtocol::Icmp, icmp.buffer_len());
    let mut out = vec![0u8; 14 + 20 + icmp.buffer_len()];
    EthernetRepr {
        src: EthernetAddress(f[0..6].try_into().unwrap()),
        dst: EthernetAddress(f[6..12].try_into().unwrap()),
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut out);
    r.emit(&mut out[14..], ChecksumCaps::SOFTWARE);
    icmp.emit(&mut out[34..], ChecksumCaps::SOFTWARE);
    out
}

impl Device for PathDev {
    fn caps(&self) -> DeviceCaps {
        self.inner.caps()
    }
    fn recv_batch(&mut self, now: Instant, budget: usize, sink: &mut dyn FnMut(&[u8])) -> usize {
        let mut n = 0;
        while n < budget {
            let Some(f) = self.back.pop_front() else {
                break;
            };
            sink(&f);
            n += 1;
        }
        n + self.inner.recv_batch(now, budget - n, sink)
    }
    fn recv_batch_parts(&mut self, now: Instant, budget: usize, sink: &mut PartsSink) -> usize {
        let mut n = 0;
        while n < budget {
            let Some(f) = self.back.pop_front() else {
                break;
            };
            sink(&f, &[], RxMeta::default());
            n += 1;
        }
        n + self.inner.recv_batch_parts(now, budget - n, sink)
    }
    fn can_gather(&self) -> bool {
        self.inner.can_gather()
    }
    fn send_batch(&mut self, now: Instant, batch: &TxBatch) -> usize {
        let mut pass = std::mem::take(&mut self.pass);
        let mut flat = std::mem::take(&mut self.flat);
        pass.clear();
        let mut dropped = 0;
        for (f, tail) in batch.iter_parts() {
            let whole = match tail {
                Some(t) => {
                    let mut st = self.stats.get();
                    st.gathered += 1;
                    st.gathered_bytes += t.len() as u64;
                    self.stats.set(st);
                    flat.clear();
                    flat.extend_from_slice(f);
                    flat.extend_from_slice(t.bytes());
                    &flat[..]
                }
                None => f,
            };
            if !self.inspect(whole) {
                dropped += 1;
                continue;
            }
            match tail {
                Some(t) => pass.push_gather(f.len(), t.clone()).copy_from_slice(f),
                None => pass.push(f.len()).copy_from_slice(f),
            }
        }
        let sent = self.inner.send_batch(now, &pass) + dropped;
        // Release the tails' references now, as a device that sent them would.
        pass.clear();
        self.pass = pass;
        self.flat = flat;
        sent
    }
    fn poll_at(&self) -> Option<Instant> {
        if self.back.is_empty() {
            self.inner.poll_at()
        } else {
            Some(Instant::ZERO)
        }
    }
    fn rx_pending(&self, now: Instant) -> bool {
        !self.back.is_empty() || self.inner.rx_pending(now)
    }
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            impair: ImpairSpec::default(),
            seed: 0,
            caps: DeviceCaps::ETHERNET,
            capacity: DEFAULT_CAPACITY,
            tune: |_| {},
            path_mtu: None,
            drop_a: None,
            gather: false,
        }
    }
}

fn engine_cfg(ip: Ipv4Address, last: u8, seed: u64, tune: fn(&mut EngineConfig)) -> EngineConfig {
    let mac = EthernetAddress([0x02, 0, 0, 0, 0, last]);
    let mut cfg = EngineConfig::new(IfaceConfig::new(mac, Ipv4Cidr::new(ip, 24)));
    // A fixed secret keeps ISNs, and so the whole run, reproducible from the seed.
    let mut secret = [last; 16];
    secret[..8].copy_from_slice(&seed.to_le_bytes());
    cfg.secret = Some(secret);
    tune(&mut cfg);
    cfg
}

impl Net {
    /// Builds the pair; with `pcap`, A's traffic in both directions is captured there.
    pub fn new(cfg: NetConfig, pcap: Option<Box<dyn Write>>) -> io::Result<Self> {
        let (pa, pb) = pipe(cfg.caps, cfg.capacity);
        let stats = Rc::new(Cell::new(PathStats::default()));
        if cfg.gather && (cfg.impair != ImpairSpec::default() || pcap.is_some()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a gathering cable takes no impairment and no capture",
            ));
        }
        let (inner_a, dev_b): (Box<dyn Device>, Box<dyn Device>) = if cfg.gather {
            (Box::new(pa), Box::new(pb))
        } else {
            (
                Box::new(Impaired::new(pa, cfg.impair, cfg.seed)),
                Box::new(Impaired::new(pb, cfg.impair, cfg.seed.wrapping_add(1))),
            )
        };
        let ia = PathDev {
            inner: inner_a,
            hop: cfg.path_mtu,
            stats: stats.clone(),
            back: VecDeque::new(),
            pass: TxBatch::new(),
            drop: cfg.drop_a,
            drop_state: 0,
            flat: Vec::new(),
        };
        let (dev_a, shared): (Box<dyn Device>, _) = match pcap {
            Some(w) => {
                let shared = SharedWriter(Rc::new(RefCell::new(w)));
                let epoch = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                let writer = PcapWriter::new(shared.clone(), epoch)?;
                (Box::new(Pcap::new(ia, writer)), Some(shared))
            }
            None => (Box::new(ia), None),
        };
        let mut net = Self {
            a: Engine::new(engine_cfg(A_IP, 1, cfg.seed, cfg.tune), cfg.caps),
            b: Engine::new(engine_cfg(B_IP, 2, cfg.seed, cfg.tune), cfg.caps),
            dev_a,
            dev_b,
            now: Instant::from_millis(1),
            step_cost: Duration::from_micros(5),
            pcap: shared,
            tune: cfg.tune,
            path: stats,
            b_down: false,
        };
        net.stamp();
        Ok(net)
    }

    /// Tells both engines the current virtual time, so socket calls made before their next
    /// poll are stamped with it.
    pub fn stamp(&mut self) {
        self.a.set_now(self.now);
        self.b.set_now(self.now);
    }

    /// One turn of both engines at the current time. Returns true if frames moved or are
    /// waiting to be received: a delayed frame that B's side released into the cable during
    /// B's poll is A's to receive on the next turn, not after the next timer (found by
    /// `simnet`: without this, every ACK on a delayed link waited for the sender's RTO).
    pub fn turn(&mut self) -> bool {
        let x = self.a.poll(self.now, &mut self.dev_a);
        let y = !self.b_down && self.b.poll(self.now, &mut self.dev_b);
        let pending =
            self.dev_a.rx_pending(self.now) || (!self.b_down && self.dev_b.rx_pending(self.now));
        x || y || pending
    }

    /// One turn of host A only (for harnesses that time each side on its own).
    pub fn poll_a(&mut self) -> bool {
        self.a.poll(self.now, &mut self.dev_a)
    }

    /// One turn of host B only.
    pub fn poll_b(&mut self) -> bool {
        self.b.poll(self.now, &mut self.dev_b)
    }

    /// The next instant at which anything is scheduled.
    pub fn next_deadline(&self) -> Option<Instant> {
        [
            self.a.poll_at(),
            self.b.poll_at(),
            self.dev_a.poll_at(),
            self.dev_b.poll_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Advances the simulation until `done` holds or virtual time passes `limit` (relative to
    /// now). Returns whether `done` held. `done` may act on the engines (send, receive).
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Net) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            // Socket calls made by `done` are stamped with the current virtual time.
            self.stamp();
            if done(self) {
                return true;
            }
            if self.now >= end {
                return false;
            }
            if self.turn() {
                self.now += self.step_cost;
                continue;
            }
            // Idle: give the application one more look, then jump to the next deadline.
            self.stamp();
            if done(self) {
                return true;
            }
            match self.next_deadline() {
                Some(t) if t > self.now => self.now = t.min(end),
                Some(_) => self.now += self.step_cost,
                None => self.now = end,
            }
        }
    }

    /// Host B restarts: a fresh engine with the same addresses and a new secret (`seed`), so
    /// it remembers no connection and picks new ISNs.
    pub fn restart_b(&mut self, seed: u64) {
        let caps = self.b.caps();
        self.b = Engine::new(engine_cfg(B_IP, 2, seed, self.tune), caps);
        self.stamp();
    }

    /// Flushes the capture, if any.
    pub fn finish_pcap(&mut self) -> io::Result<()> {
        if let Some(w) = &mut self.pcap {
            w.flush()?;
        }
        Ok(())
    }
}

/// The byte at stream offset `i` of the test pattern: cheap, and position-dependent so any
/// loss, duplication or reordering of data shows.
pub fn pattern(i: u64) -> u8 {
    let x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x >> 56) as u8 ^ (i as u8)
}

/// What a bulk transfer did.
#[derive(Debug, Clone)]
pub struct TransferReport {
    /// Bytes the sender queued.
    pub sent: u64,
    /// Bytes the receiver read.
    pub received: u64,
    /// First offset at which received data differed from the pattern.
    pub mismatch_at: Option<u64>,
    /// True if the receiver saw end of stream after all bytes.
    pub complete: bool,
    /// Virtual time the transfer took.
    pub elapsed: Duration,
    /// Sender connection statistics.
    pub client: flowstack_tcp::ConnStats,
    /// Receiver connection statistics.
    pub server: flowstack_tcp::ConnStats,
    /// Sender's smoothed RTT.
    pub srtt: Option<Duration>,
    /// Final states (sender, receiver) when the report was taken.
    pub states: (flowstack_tcp::State, flowstack_tcp::State),
}

/// Sends `bytes` of [`pattern`] from A to B over TCP (port 5001), checks every byte, closes
/// both sides, and reports. `tx` sees every chunk A queued and `rx` every chunk B read (e.g.
/// to hash them).
pub fn bulk_transfer(
    net: &mut Net,
    bytes: u64,
    limit: Duration,
    mut tx: impl FnMut(&[u8]),
    mut rx: impl FnMut(&[u8]),
) -> Result<TransferReport, crate::SocketError> {
    use std::net::SocketAddrV4;
    let start = net.now;
    let listener = net.b.tcp_listen(5001, 16)?;
    net.stamp();
    let client = net.a.tcp_connect(SocketAddrV4::new(B_IP.into(), 5001))?;
    let mut server = None;
    let mut sent = 0u64;
    let mut received = 0u64;
    let mut mismatch = None;
    let mut eof = false;
    let mut shut = false;
    let mut chunk = vec![0u8; 64 * 1024];
    let mut rbuf = vec![0u8; 64 * 1024];
    let mut failure = None;
    net.run_until(limit, |n| {
        // Sender: keep the send buffer full, then half-close.
        while sent < bytes {
            let len = (bytes - sent).min(chunk.len() as u64) as usize;
            for (k, b) in chunk[..len].iter_mut().enumerate() {
                *b = pattern(sent + k as u64);
            }
            match n.a.tcp_send(client, &chunk[..len]) {
                Ok(k) => {
                    tx(&chunk[..k]);
                    sent += k as u64
                }
                Err(crate::SocketError::WouldBlock) => break,
                Err(e) => {
                    failure = Some(e);
                    return true;
                }
            }
        }
        if sent == bytes && !shut {
            shut = n.a.tcp_shutdown(client).is_ok();
        }
        // Receiver.
        if server.is_none() {
            server = n.b.tcp_accept(listener).ok();
        }
        if let Some(s) = server {
            loop {
                match n.b.tcp_recv(s, &mut rbuf) {
                    Ok(0) => {
                        eof = true;
                        break;
                    }
                    Ok(k) => {
                        for (j, &b) in rbuf[..k].iter().enumerate() {
                            if mismatch.is_none() && b != pattern(received + j as u64) {
                                mismatch = Some(received + j as u64);
                            }
                        }
                        rx(&rbuf[..k]);
                        received += k as u64;
                    }
                    Err(crate::SocketError::WouldBlock) => break,
                    Err(e) => {
                        failure = Some(e);
                        return true;
                    }
                }
            }
        }
        if let Some(e) = n.a.tcp_error(client) {
            failure = Some(e);
            return true;
        }
        eof
    });
    if let Some(e) = failure {
        return Err(e);
    }
    let elapsed = net.now.saturating_since(start);
    let sstats = server
        .and_then(|s| net.b.tcp_conn(s).ok())
        .map(|c| c.stats())
        .unwrap_or_default();
    // Let the close handshake finish.
    if let Some(s) = server {
        net.stamp();
        net.b.tcp_close(s)?;
    }
    net.run_until(Duration::from_secs(1), |n| {
        n.a.tcp_conn(client)
            .map(|c| {
                matches!(
                    c.state(),
                    flowstack_tcp::State::TimeWait | flowstack_tcp::State::Closed
                )
            })
            .unwrap_or(true)
    });
    let cc = net.a.tcp_conn(client)?;
    let (cstats, srtt, cstate) = (cc.stats(), cc.srtt(), cc.state());
    // The server's handle is closed; once CLOSED its connection is freed.
    let sstate = net
        .b
        .tcp_iter()
        .find(|c| c.tuple().local_port == 5001)
        .map(|c| c.state())
        .unwrap_or(flowstack_tcp::State::Closed);
    Ok(TransferReport {
        sent,
        received,
        mismatch_at: mismatch,
        complete: eof && received == bytes,
        elapsed,
        client: cstats,
        server: sstats,
        srtt,
        states: (cstate, sstate),
    })
}
