//! The per-core engine: one interface, its protocol layers and sockets, driven sans-IO.
//!
//! # Driving contract
//!
//! An `Engine` never reads a clock or touches a device on its own. Its owner, on one thread:
//!
//! 1. feeds every received frame to [`Engine::receive`] (or lets [`Engine::poll`] pull a batch
//!    from a [`Device`]);
//! 2. calls [`Engine::on_timers`] and then [`Engine::dispatch`] so timers fire and sockets with
//!    pending output emit segments;
//! 3. hands the built frames ([`Engine::tx`]) to the device and clears them;
//! 4. sleeps until [`Engine::poll_at`] or until a frame arrives or the application acts.
//!
//! [`Engine::poll`] does 1–3 in order for a [`Device`]. Socket calls (`udp_*`, `ping_*`,
//! `tcp_*`, and the [`Sockets`] trait) may be made at any time between polls and take no
//! clock: the engine stamps them with the time of its latest entry point that took `now`
//! ([`Engine::poll`], [`Engine::receive`], [`Engine::on_timers`], [`Engine::dispatch`], or
//! [`Engine::set_now`]), and their output goes out on the next poll. An engine that was never
//! given a time runs at [`Instant::ZERO`].
//!
//! An engine belongs to one thread: it is `Send` (it may be built on one thread and moved to
//! the core that runs it) but not `Sync`, so two threads can never share one.

use crate::counters::{Counter, Counters};
use crate::iface::{Iface, IfaceConfig};
use crate::reasm::{ReasmConfig, ReasmEvent, Reassembler};
use crate::tcp_socket::{self, TcpHandle, TcpLimits, TcpSockets};
use crate::udp::{Delivery, UdpConfig, UdpHandle, UdpTable};
use crate::{Readiness, SocketError};
use flowstack_link::{Device, DeviceCaps, TxBatch};
use flowstack_tcp::{Connection, FourTuple, State, TcpConfig, TcpError};
use flowstack_wire::arp::{self, ArpOperation, ArpRepr};
use flowstack_wire::ethernet::{self, EthernetRepr};
use flowstack_wire::icmpv4::{self, DstUnreachable, Icmpv4Repr};
use flowstack_wire::ipv4::{self, IpProtocol, Ipv4Repr};
use flowstack_wire::tcp::{self as wtcp, TcpRepr};
use flowstack_wire::udp::{self as wudp, UdpRepr};
use flowstack_wire::{Error as WireError, EtherType, Instant, Ipv4Address};
use std::cell::Cell;
use std::collections::VecDeque;
use std::marker::PhantomData;
use std::net::SocketAddrV4;

/// Everything an engine needs to start.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Addressing and ARP/ICMP limits.
    pub iface: IfaceConfig,
    /// Fragment reassembly limits.
    pub reasm: ReasmConfig,
    /// UDP limits.
    pub udp: UdpConfig,
    /// Echo replies kept for [`Engine::ping_recv`].
    pub ping_queue: usize,
    /// Frames taken from the device per poll.
    pub rx_budget: usize,
    /// TCP limits and socket defaults.
    pub tcp: TcpLimits,
    /// 128-bit secret for ISNs and SYN cookies; `None` draws one from the OS RNG.
    pub secret: Option<[u8; 16]>,
}

impl EngineConfig {
    /// Defaults for an interface.
    pub fn new(iface: IfaceConfig) -> Self {
        Self {
            iface,
            reasm: ReasmConfig::default(),
            udp: UdpConfig::default(),
            ping_queue: 256,
            rx_budget: 256,
            tcp: TcpLimits::default(),
            secret: None,
        }
    }
}

/// An echo reply received for [`Engine::ping_send`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PingReply {
    /// Who answered.
    pub from: Ipv4Address,
    /// Identifier.
    pub ident: u16,
    /// Sequence number.
    pub seq_no: u16,
    /// Payload length.
    pub len: usize,
    /// TTL of the reply.
    pub ttl: u8,
    /// First bytes of the payload (senders put a timestamp there).
    pub head: [u8; 16],
    /// When it arrived.
    pub at: Instant,
}

/// One engine: owned by one thread (`!Sync` by construction of its parts' use).
pub struct Engine {
    iface: Iface,
    reasm: Reassembler,
    udp: UdpTable,
    tcp: TcpSockets,
    pings: VecDeque<PingReply>,
    cfg: EngineConfig,
    next_port: u16,
    /// The latest time an entry point was given; socket calls are stamped with it.
    now: Instant,
    /// Makes the engine `!Sync` (one thread owns it) while leaving it `Send`.
    _not_sync: PhantomData<Cell<()>>,
}

/// First ephemeral port (IANA dynamic range).
pub const EPHEMERAL_FIRST: u16 = 49152;

/// Picks the next free ephemeral port after `*next`, wrapping within the dynamic range.
fn ephemeral_port(next: &mut u16, taken: impl Fn(u16) -> bool) -> Result<u16, SocketError> {
    for _ in 0..=(u16::MAX - EPHEMERAL_FIRST) {
        let p = *next;
        *next = if p == u16::MAX {
            EPHEMERAL_FIRST
        } else {
            p + 1
        };
        if !taken(p) {
            return Ok(p);
        }
    }
    Err(SocketError::AddrNotAvailable)
}

impl Engine {
    /// Builds an engine for a device with capabilities `caps`.
    pub fn new(cfg: EngineConfig, caps: DeviceCaps) -> Self {
        let seed = u16::from_be_bytes([cfg.iface.mac.0[4], cfg.iface.mac.0[5]]);
        let secret = cfg.secret.unwrap_or_else(|| {
            let mut k = [0u8; 16];
            // RFC 6528 §3: the secret should be random. Without an OS RNG (never on Linux)
            // fall back to a MAC-derived key, which is predictable.
            if getrandom::fill(&mut k).is_err() {
                k[..6].copy_from_slice(&cfg.iface.mac.0);
            }
            k
        });
        Self {
            tcp: TcpSockets::new(cfg.tcp, secret),
            iface: Iface::new(cfg.iface, caps),
            reasm: Reassembler::new(cfg.reasm),
            udp: UdpTable::new(cfg.udp),
            pings: VecDeque::new(),
            next_port: EPHEMERAL_FIRST + seed % (u16::MAX - EPHEMERAL_FIRST),
            cfg,
            now: Instant::ZERO,
            _not_sync: PhantomData,
        }
    }

    /// Our IPv4 address.
    pub fn ip(&self) -> Ipv4Address {
        self.iface.ip()
    }

    /// Counters of every layer.
    pub fn counters(&self) -> Counters {
        let mut c = self.iface.counters.clone();
        c.merge(&self.tcp.counters);
        c
    }

    /// The ARP cache (for display).
    pub fn arp_entries(
        &self,
    ) -> impl Iterator<Item = (Ipv4Address, flowstack_wire::EthernetAddress, Instant)> + '_ {
        self.iface.arp.entries()
    }

    /// Bytes held by fragment reassembly.
    pub fn reassembly_memory(&self) -> usize {
        self.reasm.memory_used()
    }

    /// Frames waiting for the device.
    pub fn tx(&mut self) -> &mut TxBatch {
        &mut self.iface.tx
    }

    /// One full turn: receive a batch from `dev`, run timers and socket output, transmit.
    /// Returns true if any frame moved.
    pub fn poll<D: Device + ?Sized>(&mut self, now: Instant, dev: &mut D) -> bool {
        use flowstack_prof::{enter, Layer};
        self.set_now(now);
        let _p = enter(Layer::Engine);
        let budget = self.cfg.rx_budget;
        let got = {
            let _p = enter(Layer::DevRx);
            dev.recv_batch(now, budget, &mut |f| self.receive(now, f))
        };
        self.on_timers(now);
        self.dispatch(now);
        let sent = self.iface.tx.len();
        if sent > 0 {
            let accepted = {
                let _p = enter(Layer::DevTx);
                dev.send_batch(now, &self.iface.tx)
            };
            self.iface
                .counters
                .add(Counter::EthOutDrops, (sent - accepted) as u64);
            self.iface.tx.clear();
        }
        got > 0 || sent > 0
    }

    /// Advances the engine's clock for socket calls made before the next poll (tests and
    /// drive loops that act between polls at a known time). Time never goes backwards: an
    /// earlier `now` is ignored.
    pub fn set_now(&mut self, now: Instant) {
        if now > self.now {
            self.now = now;
        }
    }

    /// The engine's clock: the latest time it was given.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// When the engine next needs [`Engine::on_timers`], if ever.
    pub fn poll_at(&self) -> Option<Instant> {
        [
            self.iface.poll_at(),
            self.reasm.poll_at(),
            self.tcp.poll_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Fires due timers (ARP retries, reassembly expiry).
    pub fn on_timers(&mut self, now: Instant) {
        self.set_now(now);
        // Only when something is due: this runs on every poll.
        if self.iface.poll_at().is_some_and(|t| t <= now) {
            self.iface.on_timer(now);
        }
        if self.reasm.poll_at().is_none_or(|t| t > now) {
            return;
        }
        let expired = self.reasm.on_timer(now);
        self.iface
            .counters
            .add(Counter::IpReasmTimeout, expired as u64);
        self.iface
            .counters
            .add(Counter::IpReasmFails, expired as u64);
    }

    /// Lets sockets emit pending output.
    pub fn dispatch(&mut self, now: Instant) {
        self.set_now(now);
        self.tcp.dispatch(now, &mut self.iface);
    }

    /// Processes one received Ethernet frame.
    pub fn receive(&mut self, now: Instant, frame: &[u8]) {
        self.set_now(now);
        let _p = flowstack_prof::enter(flowstack_prof::Layer::EthIpInput);
        let f = match ethernet::Frame::new_checked(frame) {
            Ok(f) => f,
            Err(_) => return self.iface.counters.inc(Counter::EthInRunts),
        };
        let eth = EthernetRepr::parse(&f).expect("checked frame parses");
        if eth.dst != self.iface.cfg.mac && !eth.dst.is_broadcast() {
            return self.iface.counters.inc(Counter::EthInOtherHost);
        }
        match eth.ethertype {
            EtherType::Arp => self.arp_input(now, &eth, f.payload()),
            EtherType::Ipv4 => self.ip_input(now, f.payload()),
            EtherType::Unknown(_) => self.iface.counters.inc(Counter::EthInUnknownProtos),
        }
    }

    fn arp_input(&mut self, now: Instant, eth: &EthernetRepr, payload: &[u8]) {
        let repr = match arp::Packet::new_checked(payload).and_then(|p| ArpRepr::parse(&p)) {
            Ok(r) => r,
            Err(_) => return self.iface.counters.inc(Counter::ArpInErrors),
        };
        let sha = repr.source_hardware_addr;
        let spa = repr.source_protocol_addr;
        if !sha.is_unicast() || sha != eth.src || spa.is_broadcast() || spa.is_multicast() {
            return self.iface.counters.inc(Counter::ArpInErrors);
        }
        let for_us = repr.target_protocol_addr == self.ip();
        // RFC 826 "merge": update an entry we already have (or are resolving) for the sender.
        let known = self.iface.arp.knows(spa);
        match repr.operation {
            ArpOperation::Request if for_us => {
                self.iface.counters.inc(Counter::ArpInRequests);
                // The requester is about to talk to us: learn it (RFC 826), then answer.
                if !spa.is_unspecified() {
                    self.iface.arp_learned(now, spa, sha);
                }
                self.iface.send_arp(ArpOperation::Reply, spa, Some(sha));
            }
            ArpOperation::Reply if for_us && known => {
                self.iface.counters.inc(Counter::ArpInReplies);
                self.iface.arp_learned(now, spa, sha);
            }
            ArpOperation::Reply if for_us => {
                // Never create an entry from a reply nobody asked for (cache poisoning).
                self.iface.counters.inc(Counter::ArpInUnsolicited);
            }
            _ if known && !spa.is_unspecified() => self.iface.arp_learned(now, spa, sha),
            _ => {}
        }
    }

    fn ip_input(&mut self, now: Instant, payload: &[u8]) {
        let c = &mut self.iface.counters;
        c.inc(Counter::IpInReceives);
        let pkt = match ipv4::Packet::new_checked(payload) {
            Ok(p) => p,
            Err(WireError::Ipv4TotalPastFrame) => return c.inc(Counter::IpExtInTruncatedPkts),
            Err(_) => return c.inc(Counter::IpInHdrErrors),
        };
        let repr = match Ipv4Repr::parse(&pkt, self.iface.caps.checksum) {
            Ok(r) => r,
            Err(WireError::Ipv4BadChecksum) => return c.inc(Counter::IpExtInCsumErrors),
            Err(_) => return c.inc(Counter::IpInHdrErrors),
        };
        if !self.iface.accepts(repr.dst) {
            return self.iface.counters.inc(Counter::IpInAddrErrors);
        }
        if !repr.is_fragment() {
            return self.deliver(now, &repr, pkt.header(), pkt.payload());
        }
        let c = &mut self.iface.counters;
        c.inc(Counter::IpReasmReqds);
        match self.reasm.input(now, &repr, pkt.payload()) {
            Ok((whole, data)) => {
                self.iface.counters.inc(Counter::IpReasmOKs);
                let mut hdr = [0u8; ipv4::HEADER_LEN];
                whole.emit(&mut hdr, self.iface.caps.checksum);
                self.deliver(now, &whole, &hdr, &data);
            }
            Err(ReasmEvent::Incomplete | ReasmEvent::Duplicate) => {}
            Err(ReasmEvent::Overlap) => {
                let c = &mut self.iface.counters;
                c.inc(Counter::IpExtReasmOverlaps);
                c.inc(Counter::IpReasmFails);
            }
            Err(ReasmEvent::Invalid | ReasmEvent::NoMemory) => {
                self.iface.counters.inc(Counter::IpReasmFails)
            }
        }
        let evicted = std::mem::take(&mut self.reasm.evicted);
        self.iface.counters.add(Counter::IpReasmFails, evicted);
    }

    /// Hands a whole datagram to its protocol. `header` is its IP header (for ICMP errors).
    fn deliver(&mut self, now: Instant, ip: &Ipv4Repr, header: &[u8], payload: &[u8]) {
        self.iface.counters.inc(Counter::IpInDelivers);
        match ip.protocol {
            IpProtocol::Icmp => self.icmp_input(now, ip, payload),
            IpProtocol::Udp => self.udp_input(now, ip, header, payload),
            IpProtocol::Tcp => self.tcp_input(now, ip, payload),
            IpProtocol::Unknown(_) => {
                self.iface.counters.inc(Counter::IpInUnknownProtos);
                self.icmp_error(now, ip, header, payload, DstUnreachable::ProtoUnreachable);
            }
        }
    }

    fn icmp_error(
        &mut self,
        now: Instant,
        ip: &Ipv4Repr,
        header: &[u8],
        payload: &[u8],
        why: DstUnreachable,
    ) {
        let mut orig = [0u8; 60 + 8];
        let hl = header.len().min(60);
        let pl = payload.len().min(8);
        orig[..hl].copy_from_slice(&header[..hl]);
        orig[hl..hl + pl].copy_from_slice(&payload[..pl]);
        self.iface.send_icmp_error(now, ip, &orig[..hl + pl], why);
    }

    fn icmp_input(&mut self, now: Instant, ip: &Ipv4Repr, payload: &[u8]) {
        let c = &mut self.iface.counters;
        c.inc(Counter::IcmpInMsgs);
        let parsed = icmpv4::Packet::new_checked(payload)
            .and_then(|p| Icmpv4Repr::parse(&p, self.iface.caps.checksum));
        let repr = match parsed {
            Ok(r) => r,
            Err(WireError::IcmpBadChecksum) => {
                c.inc(Counter::IcmpInErrors);
                return c.inc(Counter::IcmpInCsumErrors);
            }
            Err(WireError::IcmpUnsupported) => return c.inc(Counter::IcmpExtInIgnored),
            Err(_) => return c.inc(Counter::IcmpInErrors),
        };
        match repr {
            Icmpv4Repr::EchoRequest {
                ident,
                seq_no,
                data,
            } => {
                c.inc(Counter::IcmpInEchos);
                // Like Linux's icmp_echo_ignore_broadcasts=1: answer unicast pings only.
                if ip.dst != self.iface.cfg.addr.addr {
                    return c.inc(Counter::IcmpExtInIgnored);
                }
                let reply = Icmpv4Repr::EchoReply {
                    ident,
                    seq_no,
                    data,
                };
                let csum = self.iface.caps.checksum;
                let len = reply.buffer_len();
                if self
                    .iface
                    .send_ip(now, ip.src, IpProtocol::Icmp, len, false, &mut |b| {
                        reply.emit(b, csum)
                    })
                    .is_ok()
                {
                    self.iface.counters.inc(Counter::IcmpOutMsgs);
                    self.iface.counters.inc(Counter::IcmpOutEchoReps);
                }
            }
            Icmpv4Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => {
                c.inc(Counter::IcmpInEchoReps);
                if self.pings.len() >= self.cfg.ping_queue {
                    self.pings.pop_front();
                }
                let mut head = [0u8; 16];
                let n = data.len().min(16);
                head[..n].copy_from_slice(&data[..n]);
                self.pings.push_back(PingReply {
                    from: ip.src,
                    ident,
                    seq_no,
                    len: data.len(),
                    ttl: ip.ttl,
                    head,
                    at: now,
                });
            }
            Icmpv4Repr::DstUnreachable {
                reason, original, ..
            } => {
                c.inc(Counter::IcmpInDestUnreachs);
                self.icmp_unreachable(reason, original);
            }
            Icmpv4Repr::TimeExceeded { .. } => c.inc(Counter::IcmpInTimeExcds),
        }
    }

    /// Reports an ICMP destination-unreachable to the socket it concerns (RFC 1122 §4.1.3.3).
    /// The quoted datagram is usually cut after 8 payload bytes, so its fields are read
    /// directly once the header is known to be there.
    fn icmp_unreachable(&mut self, reason: DstUnreachable, q: &[u8]) {
        if q.len() < ipv4::HEADER_LEN + 4 || q[0] >> 4 != 4 {
            return;
        }
        let hl = ((q[0] & 0xf) as usize) * 4;
        if hl < ipv4::HEADER_LEN || q.len() < hl + 4 {
            return;
        }
        let proto = IpProtocol::from(q[9]);
        let sport = u16::from_be_bytes([q[hl], q[hl + 1]]);
        if proto == IpProtocol::Udp && reason == DstUnreachable::PortUnreachable {
            if let Some(&idx) = self.udp.ports.get(&sport) {
                if let Some(s) = self.udp.socks[idx].as_mut() {
                    s.error = Some(SocketError::ConnectionRefused);
                }
            }
        }
    }

    fn udp_input(&mut self, now: Instant, ip: &Ipv4Repr, header: &[u8], payload: &[u8]) {
        let c = &mut self.iface.counters;
        let pkt = match wudp::Packet::new_checked(payload) {
            Ok(p) => p,
            Err(_) => return c.inc(Counter::UdpInErrors),
        };
        let repr = match UdpRepr::parse(&pkt, ip.src, ip.dst, self.iface.caps.checksum) {
            Ok(r) => r,
            Err(WireError::UdpBadChecksum) => {
                c.inc(Counter::UdpInErrors);
                return c.inc(Counter::UdpInCsumErrors);
            }
            Err(_) => return c.inc(Counter::UdpInErrors),
        };
        match self
            .udp
            .deliver(ip.src, repr.src_port, repr.dst_port, pkt.payload())
        {
            Delivery::Delivered => self.iface.counters.inc(Counter::UdpInDatagrams),
            Delivery::QueueFull => self.iface.counters.inc(Counter::UdpRcvbufErrors),
            Delivery::NoPort => {
                self.iface.counters.inc(Counter::UdpNoPorts);
                self.icmp_error(now, ip, header, payload, DstUnreachable::PortUnreachable);
            }
        }
    }

    fn tcp_input(&mut self, now: Instant, ip: &Ipv4Repr, payload: &[u8]) {
        // TCP input as seed 000 counts it: header parse, checksum, demux, processing.
        let _p = flowstack_prof::enter(flowstack_prof::Layer::TcpInput);
        let c = &mut self.iface.counters;
        c.inc(Counter::TcpInSegs);
        let pkt = match wtcp::Packet::new_checked(payload) {
            Ok(p) => p,
            Err(_) => return c.inc(Counter::TcpInErrs),
        };
        let seg = match TcpRepr::parse(&pkt, ip.src, ip.dst, self.iface.caps.checksum) {
            Ok(r) => r,
            Err(WireError::TcpBadChecksum) => {
                c.inc(Counter::TcpInErrs);
                return c.inc(Counter::TcpInCsumErrors);
            }
            Err(WireError::TcpOptionBadLength | WireError::TcpOptionPastHeader) => {
                c.inc(Counter::TcpInErrs);
                return c.inc(Counter::TcpExtTCPBadOptions);
            }
            Err(_) => return c.inc(Counter::TcpInErrs),
        };
        self.tcp.input(now, &mut self.iface, ip, &seg);
    }

    // ---- UDP sockets -------------------------------------------------------------------

    /// Binds a UDP socket to `port` (0 picks an ephemeral port).
    pub fn udp_bind(&mut self, port: u16) -> Result<UdpHandle, SocketError> {
        let port = if port == 0 {
            let ports = &self.udp.ports;
            ephemeral_port(&mut self.next_port, |p| ports.contains_key(&p))?
        } else {
            port
        };
        self.udp.bind(port)
    }

    /// The local port of a UDP socket.
    pub fn udp_local_port(&mut self, h: UdpHandle) -> Result<u16, SocketError> {
        Ok(self.udp.get(h)?.port)
    }

    /// Sends one datagram. Larger than the MTU → fragmented; larger than 65507 bytes →
    /// `MessageTooLong`.
    pub fn udp_send_to(
        &mut self,
        h: UdpHandle,
        dst: SocketAddrV4,
        data: &[u8],
    ) -> Result<(), SocketError> {
        let sport = self.udp.get(h)?.port;
        if data.len() > 65535 - ipv4::HEADER_LEN - wudp::HEADER_LEN {
            return Err(SocketError::MessageTooLong);
        }
        if dst.port() == 0 {
            return Err(SocketError::InvalidArgument);
        }
        let src = self.ip();
        let dip: Ipv4Address = (*dst.ip()).into();
        let repr = UdpRepr {
            src_port: sport,
            dst_port: dst.port(),
        };
        let csum = self.iface.caps.checksum;
        let len = wudp::HEADER_LEN + data.len();
        let now = self.now;
        self.iface
            .send_ip(now, dip, IpProtocol::Udp, len, false, &mut |b| {
                b[wudp::HEADER_LEN..].copy_from_slice(data);
                repr.emit_header(b, src, dip, data.len(), csum);
            })?;
        self.iface.counters.inc(Counter::UdpOutDatagrams);
        Ok(())
    }

    /// Receives one datagram into `buf`. Never truncates: if `buf` is too small the call fails
    /// with `BufferTooSmall` and the datagram stays queued.
    pub fn udp_recv_from(
        &mut self,
        h: UdpHandle,
        buf: &mut [u8],
    ) -> Result<(usize, SocketAddrV4), SocketError> {
        self.udp.recv(h, buf)
    }

    /// True if a datagram (or an error) is waiting.
    pub fn udp_readable(&mut self, h: UdpHandle) -> bool {
        self.udp
            .get(h)
            .map(|s| !s.queue.is_empty() || s.error.is_some())
            .unwrap_or(false)
    }

    /// Closes a UDP socket, freeing its port.
    pub fn udp_close(&mut self, h: UdpHandle) -> Result<(), SocketError> {
        self.udp.close(h)
    }

    // ---- TCP sockets -------------------------------------------------------------------

    /// Listens on `port` with the engine's default TCP configuration.
    pub fn tcp_listen(&mut self, port: u16, backlog: usize) -> Result<TcpHandle, SocketError> {
        let cfg = self.tcp.defaults();
        self.tcp_listen_with(port, backlog, cfg)
    }

    /// Listens on `port`; accepted connections use `cfg`.
    pub fn tcp_listen_with(
        &mut self,
        port: u16,
        backlog: usize,
        mut cfg: TcpConfig,
    ) -> Result<TcpHandle, SocketError> {
        self.fit_to_device(&mut cfg);
        self.tcp.listen(port, backlog, cfg)
    }

    /// Clamps the MSS to the link and enables segmentation offload when the device takes
    /// TCP segments larger than its MTU.
    fn fit_to_device(&self, cfg: &mut TcpConfig) {
        cfg.mss = cfg
            .mss
            .min((self.iface.max_payload() - wtcp::HEADER_LEN) as u16);
        let caps = self.iface.caps;
        cfg.max_tso_segment = if caps.max_tx_datagram > caps.mtu {
            caps.max_tx_datagram - ipv4::HEADER_LEN - wtcp::HEADER_LEN
        } else {
            0
        };
    }

    /// Takes an established connection from a listener's accept queue.
    pub fn tcp_accept(&mut self, listener: TcpHandle) -> Result<TcpHandle, SocketError> {
        self.tcp.accept(listener)
    }

    /// Opens a connection to `remote` (non-blocking: poll until writable or failed).
    pub fn tcp_connect(&mut self, remote: SocketAddrV4) -> Result<TcpHandle, SocketError> {
        let cfg = self.tcp.defaults();
        self.tcp_connect_with(remote, cfg)
    }

    /// Opens a connection with a per-socket configuration.
    pub fn tcp_connect_with(
        &mut self,
        remote: SocketAddrV4,
        cfg: TcpConfig,
    ) -> Result<TcpHandle, SocketError> {
        self.tcp_connect_from(0, remote, cfg)
    }

    /// Opens a connection from a chosen local port (0 picks an ephemeral one); used for
    /// simultaneous open and by applications that bind before connecting.
    pub fn tcp_connect_from(
        &mut self,
        local_port: u16,
        remote: SocketAddrV4,
        mut cfg: TcpConfig,
    ) -> Result<TcpHandle, SocketError> {
        let rip: Ipv4Address = (*remote.ip()).into();
        if remote.port() == 0 || self.iface.is_broadcast(rip) || rip.is_multicast() {
            return Err(SocketError::InvalidArgument);
        }
        self.fit_to_device(&mut cfg);
        let local_ip = self.ip();
        let mut tuple = FourTuple {
            local_ip,
            local_port,
            remote_ip: rip,
            remote_port: remote.port(),
        };
        if local_port == 0 {
            let tcp = &self.tcp;
            tuple.local_port = ephemeral_port(&mut self.next_port, |p| {
                tcp.tuple_in_use(&FourTuple {
                    local_port: p,
                    ..tuple
                })
            })?;
        }
        self.tcp.connect(self.now, tuple, cfg)
    }

    /// Queues bytes to send; returns how many were taken.
    pub fn tcp_send(&mut self, h: TcpHandle, data: &[u8]) -> Result<usize, SocketError> {
        // The whole socket call (lookup and copy) is the "application → socket" layer.
        let _p = flowstack_prof::enter(flowstack_prof::Layer::AppCopyIn);
        let c = self.tcp.conn_mut_pub(h)?;
        let r = match c.send(data) {
            Ok(0) if !data.is_empty() => Err(SocketError::WouldBlock),
            Ok(n) => Ok(n),
            Err(TcpError::Aborted) if c.error().is_none() => Err(SocketError::BrokenPipe),
            Err(e) => Err(tcp_socket::map_err(e)),
        };
        if matches!(r, Ok(n) if n > 0) {
            self.tcp.touch(h);
        }
        r
    }

    /// Zero-copy send: queues an application-owned buffer without copying it (it must fit
    /// whole, else `WouldBlock`). Returns a token that [`Engine::tcp_zc_completion`] reports
    /// once the peer has acknowledged every byte; until then the buffer stays referenced.
    pub fn tcp_send_zc(
        &mut self,
        h: TcpHandle,
        buf: std::sync::Arc<[u8]>,
    ) -> Result<u64, SocketError> {
        let _p = flowstack_prof::enter(flowstack_prof::Layer::AppCopyIn);
        let c = self.tcp.conn_mut_pub(h)?;
        let r = match c.send_zc(buf) {
            Ok(Some(t)) => Ok(t),
            Ok(None) => Err(SocketError::WouldBlock),
            Err(TcpError::Aborted) if c.error().is_none() => Err(SocketError::BrokenPipe),
            Err(e) => Err(tcp_socket::map_err(e)),
        };
        if r.is_ok() {
            self.tcp.touch(h);
        }
        r
    }

    /// The token of a zero-copy send whose bytes are all acknowledged, if any.
    pub fn tcp_zc_completion(&mut self, h: TcpHandle) -> Option<u64> {
        self.tcp.conn_mut_pub(h).ok()?.take_zc_completion()
    }

    /// Reads received bytes; `Ok(0)` means the peer closed (end of stream).
    pub fn tcp_recv(&mut self, h: TcpHandle, buf: &mut [u8]) -> Result<usize, SocketError> {
        let _p = flowstack_prof::enter(flowstack_prof::Layer::AppCopyOut);
        let c = self.tcp.conn_mut_pub(h)?;
        match c.recv(buf) {
            Ok(n) => {
                // Reading frees window: a window update may be due.
                self.tcp.touch(h);
                Ok(n)
            }
            Err(Some(e)) => Err(tcp_socket::map_err(e)),
            Err(None) if c.state() == State::Closed => Err(SocketError::NotConnected),
            Err(None) => Err(SocketError::WouldBlock),
        }
    }

    /// Zero-copy receive: borrows up to `max` readable bytes in place (at most two slices,
    /// the receive ring may wrap). Call [`Engine::tcp_consume`] with how many were used.
    pub fn tcp_peek(&self, h: TcpHandle, max: usize) -> Result<(&[u8], &[u8]), SocketError> {
        let c = self.tcp.conn(h)?;
        if c.recv_queue() == 0 {
            if let Some(e) = c.error() {
                return Err(tcp_socket::map_err(e));
            }
        }
        Ok(c.peek_recv(max))
    }

    /// Marks `n` peeked bytes as read (frees receive window).
    pub fn tcp_consume(&mut self, h: TcpHandle, n: usize) -> Result<(), SocketError> {
        let _p = flowstack_prof::enter(flowstack_prof::Layer::AppCopyOut);
        self.tcp.conn_mut_pub(h)?.consume(n);
        self.tcp.touch(h);
        Ok(())
    }

    /// True once the peer's FIN has been received and every byte before it read.
    pub fn tcp_at_eof(&self, h: TcpHandle) -> bool {
        self.tcp
            .conn(h)
            .map(|c| c.recv_queue() == 0 && c.is_readable() && c.error().is_none())
            .unwrap_or(false)
    }

    /// Closes the sending side (FIN); reading continues.
    pub fn tcp_shutdown(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        self.tcp.conn_mut_pub(h)?.shutdown_write();
        self.tcp.touch(h);
        Ok(())
    }

    /// Releases the handle; the connection closes gracefully in the background.
    pub fn tcp_close(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        self.tcp.close(self.now, h)
    }

    /// Resets the connection (RST) and releases nothing: close the handle afterwards.
    pub fn tcp_abort(&mut self, h: TcpHandle) -> Result<(), SocketError> {
        let now = self.now;
        self.tcp.conn_mut_pub(h)?.abort(now);
        self.tcp.touch(h);
        Ok(())
    }

    /// The connection behind a handle (state, statistics, readiness).
    pub fn tcp_conn(&self, h: TcpHandle) -> Result<&Connection, SocketError> {
        self.tcp.conn(h)
    }

    /// Mutable access for per-socket options (no-delay, keepalive).
    /// The connection is queued for the next dispatch, as anything may change.
    pub fn tcp_conn_mut(&mut self, h: TcpHandle) -> Result<&mut Connection, SocketError> {
        self.tcp.conn(h)?;
        self.tcp.touch(h);
        self.tcp.conn_mut_pub(h)
    }

    /// Readiness of a TCP socket: what a `poll(2)` on it would report.
    pub fn tcp_poll(&self, h: TcpHandle) -> Result<Readiness, SocketError> {
        if let Ok(n) = self.tcp.accept_queue_len(h) {
            return Ok(Readiness {
                readable: n > 0,
                writable: false,
                error: None,
            });
        }
        let c = self.tcp.conn(h)?;
        Ok(Readiness {
            readable: c.is_readable(),
            writable: c.is_writable(),
            error: c.error().map(tcp_socket::map_err),
        })
    }

    /// Sets TCP_NODELAY (disables Nagle) on a connection.
    pub fn tcp_set_nodelay(&mut self, h: TcpHandle, on: bool) -> Result<(), SocketError> {
        self.tcp.conn_mut_pub(h)?.set_nodelay(on);
        self.tcp.touch(h);
        Ok(())
    }

    /// Turns keepalive on (with its timers) or off.
    pub fn tcp_set_keepalive(
        &mut self,
        h: TcpHandle,
        k: Option<flowstack_tcp::Keepalive>,
    ) -> Result<(), SocketError> {
        let now = self.now;
        self.tcp.conn_mut_pub(h)?.set_keepalive(k, now);
        self.tcp.touch(h);
        Ok(())
    }

    /// The error that ended a connection, as a socket error.
    pub fn tcp_error(&self, h: TcpHandle) -> Option<SocketError> {
        self.tcp.conn(h).ok()?.error().map(tcp_socket::map_err)
    }

    /// Connections in any state.
    pub fn tcp_connections(&self) -> usize {
        self.tcp.connections()
    }

    /// Every connection (for `ss`-like listings).
    pub fn tcp_iter(&self) -> impl Iterator<Item = &Connection> {
        self.tcp.iter()
    }

    // ---- ICMP echo ---------------------------------------------------------------------

    /// Sends an echo request.
    pub fn ping_send(
        &mut self,
        dst: Ipv4Address,
        ident: u16,
        seq_no: u16,
        data: &[u8],
    ) -> Result<(), SocketError> {
        let req = Icmpv4Repr::EchoRequest {
            ident,
            seq_no,
            data,
        };
        let csum = self.iface.caps.checksum;
        let len = req.buffer_len();
        let now = self.now;
        self.iface
            .send_ip(now, dst, IpProtocol::Icmp, len, false, &mut |b| {
                req.emit(b, csum)
            })?;
        self.iface.counters.inc(Counter::IcmpOutMsgs);
        self.iface.counters.inc(Counter::IcmpOutEchos);
        Ok(())
    }

    /// Takes the oldest echo reply received.
    pub fn ping_recv(&mut self) -> Option<PingReply> {
        self.pings.pop_front()
    }
}
