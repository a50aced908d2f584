//! The interface: addresses, routing, ARP resolution and IPv4 output (with fragmentation).
//!
//! Every layer above sends through [`Iface::send_ip`], which writes the datagram straight into
//! a transmit frame when the next hop's MAC is known, or queues it behind ARP resolution.

use crate::arp_cache::{ArpCache, ArpConfig, Enqueued};
use crate::counters::{Counter, Counters};
use crate::SocketError;
use flowstack_link::{ChecksumCaps, DeviceCaps, TxBatch, TxPayload};
use flowstack_wire::arp::{ArpOperation, ArpRepr};
use flowstack_wire::ethernet::{EthernetRepr, HEADER_LEN as ETH_LEN};
use flowstack_wire::icmpv4::{DstUnreachable, Icmpv4Repr};
use flowstack_wire::ipv4::{IpProtocol, Ipv4Repr, HEADER_LEN as IP_LEN};
use flowstack_wire::{EtherType, EthernetAddress, Instant, Ipv4Address, Ipv4Cidr};

/// Addressing of the interface.
#[derive(Debug, Clone, Copy)]
pub struct IfaceConfig {
    /// Our MAC address.
    pub mac: EthernetAddress,
    /// Our IPv4 address and on-link prefix.
    pub addr: Ipv4Cidr,
    /// Default gateway for destinations off the prefix.
    pub gateway: Option<Ipv4Address>,
    /// ARP limits.
    pub arp: ArpConfig,
    /// ICMP error messages allowed per second (token bucket refill).
    pub icmp_errors_per_sec: u32,
    /// ICMP error burst size.
    pub icmp_burst: u32,
    /// A loopback interface (as Linux's `lo`): every address of the prefix is ours. Input
    /// accepts the whole prefix, and a datagram for any address of it is framed to our own
    /// MAC without ARP, so the device hands it back to this engine.
    pub loopback: bool,
}

impl IfaceConfig {
    /// A configuration with default limits.
    pub fn new(mac: EthernetAddress, addr: Ipv4Cidr) -> Self {
        Self {
            mac,
            addr,
            gateway: None,
            arp: ArpConfig::default(),
            icmp_errors_per_sec: 1000,
            icmp_burst: 50,
            loopback: false,
        }
    }

    /// A loopback interface on `addr` (e.g. 127.0.0.1/8): see [`IfaceConfig::loopback`].
    pub fn loopback(mac: EthernetAddress, addr: Ipv4Cidr) -> Self {
        Self {
            loopback: true,
            ..Self::new(mac, addr)
        }
    }
}

/// Interface state shared by all protocol layers of one engine.
#[derive(Debug)]
pub(crate) struct Iface {
    /// Addressing.
    cfg: IfaceConfig,
    /// Device capabilities in effect.
    caps: DeviceCaps,
    /// ARP cache.
    arp: ArpCache,
    /// Frames built and waiting for the device.
    tx: TxBatch,
    /// Counters of every layer but TCP's.
    counters: Counters,
    ident: u16,
    scratch: Vec<u8>,
    pool: Vec<Vec<u8>>,
    icmp_tokens: f64,
    icmp_refill_at: Instant,
    /// The device takes gathered frames ([`Iface::set_gather`]).
    gather: bool,
}

/// Writes a payload whole: `fill` the bytes before `tail`, then `tail`'s bytes copied.
fn fill_flat(buf: &mut [u8], fill: &mut dyn FnMut(&mut [u8]), tail: Option<&TxPayload>) {
    let t = tail.map_or(&[][..], |t| t.bytes());
    let head = buf.len() - t.len();
    fill(&mut buf[..head]);
    buf[head..].copy_from_slice(t);
}

/// Where a datagram goes next.
enum NextHop {
    Broadcast,
    Unicast(Ipv4Address),
    /// Back to this interface (loopback): framed to our own MAC, no ARP.
    Local,
}

impl Iface {
    /// Builds an interface for a device with `caps`.
    pub fn new(cfg: IfaceConfig, caps: DeviceCaps) -> Self {
        Self {
            cfg,
            caps,
            arp: ArpCache::new(cfg.arp),
            tx: TxBatch::new(),
            counters: Counters::default(),
            ident: 1,
            scratch: Vec::new(),
            pool: Vec::new(),
            icmp_tokens: cfg.icmp_burst as f64,
            icmp_refill_at: Instant::ZERO,
            gather: false,
        }
    }

    /// Whether the device takes gathered frames (`Device::can_gather`); set before each
    /// turn's output by the engine's poll.
    pub fn set_gather(&mut self, on: bool) {
        self.gather = on;
    }

    /// True if a zero-copy payload may leave as a reference ([`Iface::send_ip_gather`]
    /// gathers instead of copying): the device gathers and no checksum is computed in
    /// software (a checksum would read every payload byte anyway).
    pub fn gathers(&self) -> bool {
        self.gather && !self.caps.checksum.fill_tx
    }

    /// Our IPv4 address.
    #[inline]
    pub fn ip(&self) -> Ipv4Address {
        self.cfg.addr.addr
    }

    /// A loopback interface ([`IfaceConfig::loopback`]).
    #[inline]
    pub fn is_loopback(&self) -> bool {
        self.cfg.loopback
    }

    /// Our MAC address.
    #[inline]
    pub fn mac(&self) -> EthernetAddress {
        self.cfg.mac
    }

    /// Device capabilities in effect.
    #[inline]
    pub fn caps(&self) -> DeviceCaps {
        self.caps
    }

    /// Checksum work left to software (a part of [`Iface::caps`]).
    #[inline]
    pub fn checksum(&self) -> ChecksumCaps {
        self.caps.checksum
    }

    /// Counters of every layer but TCP's.
    #[inline]
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Counters of every layer but TCP's, to count into.
    #[inline]
    pub fn counters_mut(&mut self) -> &mut Counters {
        &mut self.counters
    }

    /// Frames built and waiting for the device.
    #[inline]
    pub fn tx(&self) -> &TxBatch {
        &self.tx
    }

    /// Frames built and waiting for the device, to hand over and clear.
    #[inline]
    pub fn tx_mut(&mut self) -> &mut TxBatch {
        &mut self.tx
    }

    /// True if the ARP cache has an entry (even expired) or a request outstanding for `ip`.
    #[inline]
    pub fn arp_knows(&self, ip: Ipv4Address) -> bool {
        self.arp.knows(ip)
    }

    /// Resolved ARP entries: address, MAC, expiry.
    pub fn arp_entries(
        &self,
    ) -> impl Iterator<Item = (Ipv4Address, EthernetAddress, Instant)> + '_ {
        self.arp.entries()
    }

    /// True if `dst` of a received datagram is ours (unicast, limited or directed broadcast).
    #[inline]
    pub fn accepts(&self, dst: Ipv4Address) -> bool {
        dst == self.ip()
            || dst.is_broadcast()
            || dst == self.cfg.addr.broadcast()
            || (self.cfg.loopback && self.cfg.addr.contains(dst))
    }

    /// True if `dst` is a unicast address of ours: [`Iface::ip`], or on a loopback
    /// interface any non-broadcast address of the prefix.
    #[inline]
    pub fn owns(&self, dst: Ipv4Address) -> bool {
        dst == self.ip()
            || (self.cfg.loopback && self.cfg.addr.contains(dst) && !self.is_broadcast(dst))
    }

    /// True if `dst` is a broadcast address on this link.
    pub fn is_broadcast(&self, dst: Ipv4Address) -> bool {
        dst.is_broadcast() || (self.cfg.addr.prefix_len < 31 && dst == self.cfg.addr.broadcast())
    }

    fn route(&self, dst: Ipv4Address) -> Result<NextHop, SocketError> {
        if self.is_broadcast(dst) {
            return Ok(NextHop::Broadcast);
        }
        // A loopback interface owns its whole prefix (as Linux's `lo` owns 127.0.0.0/8).
        if self.cfg.loopback && self.cfg.addr.contains(dst) && !dst.is_unspecified() {
            return Ok(NextHop::Local);
        }
        if dst == self.ip() || dst.is_unspecified() || dst.is_multicast() {
            return Err(SocketError::NoRoute);
        }
        if self.cfg.addr.contains(dst) {
            return Ok(NextHop::Unicast(dst));
        }
        self.cfg
            .gateway
            .map(NextHop::Unicast)
            .ok_or(SocketError::NoRoute)
    }

    /// Largest IP payload one unfragmented datagram carries.
    pub fn max_payload(&self) -> usize {
        self.caps.mtu - IP_LEN
    }

    /// Sends one IPv4 datagram of `payload_len` bytes to `dst`; `fill` writes the payload.
    ///
    /// Datagrams larger than the MTU are fragmented unless `dont_frag` is set (then
    /// `MessageTooLong`). TCP may pass up to `caps.max_tx_datagram` bytes when the device
    /// segments itself.
    pub fn send_ip(
        &mut self,
        now: Instant,
        dst: Ipv4Address,
        protocol: IpProtocol,
        payload_len: usize,
        dont_frag: bool,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), SocketError> {
        self.send_ip_from(now, self.ip(), dst, protocol, payload_len, dont_frag, fill)
    }

    /// [`Iface::send_ip`] from a chosen source address of ours: on a loopback interface a
    /// connection accepted on 127.0.0.5 answers from 127.0.0.5. A source that is not ours
    /// (only a loopback interface owns more than [`Iface::ip`]) is replaced by [`Iface::ip`].
    #[allow(clippy::too_many_arguments)]
    pub fn send_ip_from(
        &mut self,
        now: Instant,
        src: Ipv4Address,
        dst: Ipv4Address,
        protocol: IpProtocol,
        payload_len: usize,
        dont_frag: bool,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), SocketError> {
        self.send_ip_parts(now, src, dst, protocol, payload_len, dont_frag, fill, None)
    }

    /// [`Iface::send_ip_from`] of a datagram whose payload is `head_len` bytes written by
    /// `fill` followed by `tail`'s bytes. When the frame goes to the device now and
    /// [`Iface::gathers`], it is a gathered frame: the tail is referenced, not copied (the
    /// caller must not need a checksum over it). Otherwise (no gather, queued behind ARP,
    /// fragmented) the tail is copied after the head, and the datagram is byte-identical.
    #[allow(clippy::too_many_arguments)]
    pub fn send_ip_gather(
        &mut self,
        now: Instant,
        src: Ipv4Address,
        dst: Ipv4Address,
        protocol: IpProtocol,
        head_len: usize,
        tail: TxPayload,
        dont_frag: bool,
        fill: &mut dyn FnMut(&mut [u8]),
    ) -> Result<(), SocketError> {
        let len = head_len + tail.len();
        self.send_ip_parts(now, src, dst, protocol, len, dont_frag, fill, Some(tail))
    }

    /// Sends a datagram of `payload_len` bytes: `fill` writes the bytes before `tail`.
    #[allow(clippy::too_many_arguments)]
    fn send_ip_parts(
        &mut self,
        now: Instant,
        src: Ipv4Address,
        dst: Ipv4Address,
        protocol: IpProtocol,
        payload_len: usize,
        dont_frag: bool,
        fill: &mut dyn FnMut(&mut [u8]),
        tail: Option<TxPayload>,
    ) -> Result<(), SocketError> {
        let src = if self.cfg.loopback && self.cfg.addr.contains(src) {
            src
        } else {
            self.ip()
        };
        let _p = flowstack_prof::enter(flowstack_prof::Layer::IpOutput);
        let hop = match self.route(dst) {
            Ok(h) => h,
            Err(e) => {
                self.counters.inc(Counter::IpOutNoRoutes);
                return Err(e);
            }
        };
        let mut repr = Ipv4Repr::new(src, dst, protocol, payload_len);
        repr.dont_frag = dont_frag;
        repr.ident = self.ident;
        self.ident = self.ident.wrapping_add(1);
        let limit = if protocol == IpProtocol::Tcp {
            self.caps.max_tx_datagram.max(self.caps.mtu)
        } else {
            self.caps.mtu
        };
        if IP_LEN + payload_len <= limit {
            self.counters.inc(Counter::IpOutRequests);
            self.output(now, &hop, &repr, fill, tail);
            return Ok(());
        }
        if dont_frag || payload_len > 65535 - IP_LEN {
            self.counters.inc(Counter::IpFragFails);
            return Err(SocketError::MessageTooLong);
        }
        // RFC 791 §3.2: every fragment but the last carries a multiple of 8 bytes.
        let mut whole = std::mem::take(&mut self.scratch);
        whole.clear();
        whole.resize(payload_len, 0);
        fill_flat(&mut whole, fill, tail.as_ref());
        let chunk = (self.caps.mtu - IP_LEN) & !7;
        let mut off = 0;
        self.counters.inc(Counter::IpOutRequests);
        self.counters.inc(Counter::IpFragOKs);
        while off < payload_len {
            let n = chunk.min(payload_len - off);
            let mut f = repr;
            f.payload_len = n;
            f.frag_offset = off as u16;
            f.more_frags = off + n < payload_len;
            let piece = &whole[off..off + n];
            self.output(now, &hop, &f, &mut |b| b.copy_from_slice(piece), None);
            self.counters.inc(Counter::IpFragCreates);
            off += n;
        }
        self.scratch = whole;
        Ok(())
    }

    /// Frames and queues one datagram; `fill` writes its payload up to `tail`, if any.
    fn output(
        &mut self,
        now: Instant,
        hop: &NextHop,
        repr: &Ipv4Repr,
        fill: &mut dyn FnMut(&mut [u8]),
        tail: Option<TxPayload>,
    ) {
        let _p = flowstack_prof::enter(flowstack_prof::Layer::EthOutput);
        let mac = match *hop {
            NextHop::Broadcast => Some(EthernetAddress::BROADCAST),
            NextHop::Unicast(ip) => self.arp.lookup(now, ip),
            NextHop::Local => Some(self.cfg.mac),
        };
        let csum = self.caps.checksum;
        match (mac, hop) {
            (Some(mac), _) => {
                let len = ETH_LEN + IP_LEN + repr.payload_len;
                let gather = self.gathers();
                let frame = match tail {
                    Some(t) if gather => self.tx.push_gather(len - t.len(), t),
                    ref t => {
                        let frame = self.tx.push(len);
                        fill_flat(&mut frame[ETH_LEN + IP_LEN..], fill, t.as_ref());
                        frame
                    }
                };
                EthernetRepr {
                    src: self.cfg.mac,
                    dst: mac,
                    ethertype: EtherType::Ipv4,
                }
                .emit(frame);
                if gather {
                    fill(&mut frame[ETH_LEN + IP_LEN..]);
                }
                repr.emit(&mut frame[ETH_LEN..], csum);
            }
            (None, NextHop::Unicast(ip)) => {
                let mut buf = self.pool.pop().unwrap_or_default();
                buf.clear();
                buf.resize(IP_LEN + repr.payload_len, 0);
                fill_flat(&mut buf[IP_LEN..], fill, tail.as_ref());
                repr.emit(&mut buf, csum);
                match self.arp.enqueue(now, *ip, buf) {
                    Enqueued::SendRequest => self.send_arp(ArpOperation::Request, *ip, None),
                    Enqueued::Waiting => {}
                    Enqueued::Dropped => self.counters.inc(Counter::ArpQueueDrops),
                }
            }
            (None, NextHop::Broadcast | NextHop::Local) => {
                unreachable!("broadcast and local always have a MAC")
            }
        }
    }

    /// Emits an ARP request for `target` (broadcast) or a reply to `to`.
    pub fn send_arp(&mut self, op: ArpOperation, target: Ipv4Address, to: Option<EthernetAddress>) {
        let repr = ArpRepr {
            operation: op,
            source_hardware_addr: self.cfg.mac,
            source_protocol_addr: self.ip(),
            target_hardware_addr: to.unwrap_or_default(),
            target_protocol_addr: target,
        };
        let frame = self.tx.push(ETH_LEN + repr.buffer_len());
        EthernetRepr {
            src: self.cfg.mac,
            dst: to.unwrap_or(EthernetAddress::BROADCAST),
            ethertype: EtherType::Arp,
        }
        .emit(frame);
        repr.emit(&mut frame[ETH_LEN..]);
        self.counters.inc(match op {
            ArpOperation::Request => Counter::ArpOutRequests,
            ArpOperation::Reply => Counter::ArpOutReplies,
        });
    }

    /// Records a resolved address and transmits whatever waited for it.
    pub fn arp_learned(&mut self, now: Instant, ip: Ipv4Address, mac: EthernetAddress) {
        let flushed = self.arp.insert(now, ip, mac);
        if flushed.evicted {
            self.counters.inc(Counter::ArpExtCacheFull);
        }
        for dgram in flushed.packets {
            let frame = self.tx.push(ETH_LEN + dgram.len());
            EthernetRepr {
                src: self.cfg.mac,
                dst: mac,
                ethertype: EtherType::Ipv4,
            }
            .emit(frame);
            frame[ETH_LEN..].copy_from_slice(&dgram);
            self.pool.push(dgram);
        }
    }

    /// Sends an ICMP error about `original` (its IP header and payload), subject to RFC 1122
    /// §3.2.2 (never about ICMP errors, broadcasts or non-first fragments) and the rate limit.
    pub fn send_icmp_error(
        &mut self,
        now: Instant,
        orig: &Ipv4Repr,
        orig_bytes: &[u8],
        reason: DstUnreachable,
    ) {
        if self.is_broadcast(orig.dst) || orig.frag_offset != 0 || orig.src.is_unspecified() {
            return;
        }
        if !self.icmp_allowed(now) {
            self.counters.inc(Counter::IcmpExtOutRateLimited);
            return;
        }
        // RFC 792: the internet header plus the first 64 bits of the original data.
        let hl = orig_bytes.len().min(IP_LEN + 8);
        let icmp = Icmpv4Repr::DstUnreachable {
            reason,
            next_hop_mtu: 0,
            original: &orig_bytes[..hl],
        };
        let csum = self.caps.checksum;
        let len = icmp.buffer_len();
        if self
            .send_ip(now, orig.src, IpProtocol::Icmp, len, false, &mut |b| {
                icmp.emit(b, csum)
            })
            .is_ok()
        {
            self.counters.inc(Counter::IcmpOutMsgs);
            self.counters.inc(Counter::IcmpOutDestUnreachs);
        }
    }

    fn icmp_allowed(&mut self, now: Instant) -> bool {
        let rate = self.cfg.icmp_errors_per_sec as f64;
        let elapsed = now.saturating_since(self.icmp_refill_at).as_secs_f64();
        self.icmp_refill_at = now;
        self.icmp_tokens = (self.icmp_tokens + elapsed * rate).min(self.cfg.icmp_burst as f64);
        if self.icmp_tokens >= 1.0 {
            self.icmp_tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Runs ARP retries and expiries.
    pub fn on_timer(&mut self, now: Instant) {
        let mut retry = Vec::new();
        let failed = self.arp.on_timer(now, &mut retry);
        self.counters.add(Counter::ArpResolveFailed, failed as u64);
        for ip in retry {
            self.send_arp(ArpOperation::Request, ip, None);
        }
    }

    /// When [`Iface::on_timer`] next has work.
    pub fn poll_at(&self) -> Option<Instant> {
        self.arp.poll_at()
    }
}
