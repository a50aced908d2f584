//! Receive path: Ethernet → ARP / IPv4 (+ reassembly) → ICMP / UDP / TCP demux.
//!
//! Every `Err` arm of a parse and every drop decision increments a named (nstat-style) counter
//! where it happens (an exact duplicate IPv4 fragment is ignored and counted
//! `IpExtReasmDuplicates`).

use super::Engine;
use crate::counters::Counter;
use crate::reasm::ReasmEvent;
use crate::udp::Delivery;
use crate::SocketError;
use flowstack_link::RxMeta;
use flowstack_tcp::{FourTuple, IcmpError};
use flowstack_wire::arp::{self, ArpOperation, ArpRepr};
use flowstack_wire::ethernet::{self, EthernetRepr};
use flowstack_wire::icmpv4::{self, DstUnreachable, Icmpv4Repr};
use flowstack_wire::ipv4::{self, IpProtocol, Ipv4Repr};
use flowstack_wire::tcp::{self as wtcp, TcpRepr};
use flowstack_wire::udp::{self as wudp, UdpRepr};
use flowstack_wire::{ChecksumCaps, Error as WireError, EtherType, Instant, SeqNum};

/// ICMP type 5 (RFC 792).
const ICMP_REDIRECT: u8 = 5;

impl Engine {
    /// Processes one received Ethernet frame with what its device knows of it: a frame marked
    /// `l4_csum_ok` has its TCP or UDP checksum trusted, not verified (it may hold only the
    /// pseudo-header sum: a packet the local kernel built with checksum offload). The IPv4
    /// header checksum, ICMP, and fragments are verified as always.
    pub fn receive_meta(&mut self, now: Instant, frame: &[u8], meta: RxMeta) {
        self.rx_l4_csum_ok = meta.l4_csum_ok;
        self.receive(now, frame);
        self.rx_l4_csum_ok = false;
    }

    /// The checksum work for a received TCP or UDP packet: the interface's, minus the
    /// verification when the device vouched for this frame (and it was not reassembled).
    pub(super) fn l4_checksum(&self) -> ChecksumCaps {
        let mut c = self.iface.checksum();
        c.verify_rx &= !self.rx_l4_csum_ok;
        c
    }

    /// Processes one received Ethernet frame.
    pub fn receive(&mut self, now: Instant, frame: &[u8]) {
        self.set_now(now);
        let _p = flowstack_prof::enter(flowstack_prof::Layer::EthIpInput);
        let f = match ethernet::Frame::new_checked(frame) {
            Ok(f) => f,
            Err(_) => return self.iface.counters_mut().inc(Counter::EthInRunts),
        };
        let eth = EthernetRepr::parse(&f).expect("checked frame parses");
        if eth.dst != self.iface.mac() && !eth.dst.is_broadcast() {
            return self.iface.counters_mut().inc(Counter::EthInOtherHost);
        }
        match eth.ethertype {
            EtherType::Arp => self.arp_input(now, &eth, f.payload()),
            EtherType::Ipv4 => self.ip_input(now, f.payload()),
            EtherType::Unknown(_) => self.iface.counters_mut().inc(Counter::EthInUnknownProtos),
        }
    }

    fn arp_input(&mut self, now: Instant, eth: &EthernetRepr, payload: &[u8]) {
        let repr = match arp::Packet::new_checked(payload).and_then(|p| ArpRepr::parse(&p)) {
            Ok(r) => r,
            Err(_) => return self.iface.counters_mut().inc(Counter::ArpInErrors),
        };
        let sha = repr.source_hardware_addr;
        let spa = repr.source_protocol_addr;
        if !sha.is_unicast() || sha != eth.src || spa.is_broadcast() || spa.is_multicast() {
            return self.iface.counters_mut().inc(Counter::ArpInErrors);
        }
        let for_us = repr.target_protocol_addr == self.ip();
        // RFC 826 "merge": update an entry we already have (or are resolving) for the sender.
        let known = self.iface.arp_knows(spa);
        match repr.operation {
            ArpOperation::Request if for_us => {
                self.iface.counters_mut().inc(Counter::ArpInRequests);
                // The requester is about to talk to us: learn it (RFC 826), then answer.
                if !spa.is_unspecified() {
                    self.iface.arp_learned(now, spa, sha);
                }
                self.iface.send_arp(ArpOperation::Reply, spa, Some(sha));
            }
            ArpOperation::Reply if for_us && known => {
                self.iface.counters_mut().inc(Counter::ArpInReplies);
                self.iface.arp_learned(now, spa, sha);
            }
            ArpOperation::Reply if for_us => {
                // Never create an entry from a reply nobody asked for (cache poisoning).
                self.iface.counters_mut().inc(Counter::ArpInUnsolicited);
            }
            _ if known && !spa.is_unspecified() => self.iface.arp_learned(now, spa, sha),
            _ => {}
        }
    }

    fn ip_input(&mut self, now: Instant, payload: &[u8]) {
        let csum = self.iface.checksum();
        let c = self.iface.counters_mut();
        c.inc(Counter::IpInReceives);
        let pkt = match ipv4::Packet::new_checked(payload) {
            Ok(p) => p,
            Err(WireError::Ipv4TotalPastFrame) => return c.inc(Counter::IpExtInTruncatedPkts),
            Err(_) => return c.inc(Counter::IpInHdrErrors),
        };
        let repr = match Ipv4Repr::parse(&pkt, csum) {
            Ok(r) => r,
            // As Linux: a bad checksum is a header error too (both counters move).
            Err(WireError::Ipv4BadChecksum) => {
                c.inc(Counter::IpInHdrErrors);
                return c.inc(Counter::IpExtInCsumErrors);
            }
            Err(WireError::Ipv4SourceRoute) => {
                c.inc(Counter::IpInHdrErrors);
                return c.inc(Counter::IpExtInSrcRouteDrops);
            }
            Err(_) => return c.inc(Counter::IpInHdrErrors),
        };
        if !self.ip_admit(&repr) {
            return;
        }
        if !repr.is_fragment() {
            return self.deliver(now, &repr, pkt.header(), pkt.payload());
        }
        // A reassembled datagram is checked whole, whatever its last fragment's frame said.
        self.rx_l4_csum_ok = false;
        self.iface.counters_mut().inc(Counter::IpReasmReqds);
        match self.reasm.input(now, &repr, pkt.payload()) {
            Ok((whole, data)) => {
                self.iface.counters_mut().inc(Counter::IpReasmOKs);
                let mut hdr = [0u8; ipv4::HEADER_LEN];
                whole.emit(&mut hdr, csum);
                self.deliver(now, &whole, &hdr, &data);
            }
            Err(ReasmEvent::Incomplete) => {}
            Err(ReasmEvent::Duplicate) => {
                self.iface.counters_mut().inc(Counter::IpExtReasmDuplicates)
            }
            Err(ReasmEvent::Overlap) => {
                let c = self.iface.counters_mut();
                c.inc(Counter::IpExtReasmOverlaps);
                c.inc(Counter::IpReasmFails);
            }
            Err(ReasmEvent::Invalid) => self.iface.counters_mut().inc(Counter::IpReasmFails),
            Err(ReasmEvent::NoMemory) => {
                let c = self.iface.counters_mut();
                c.inc(Counter::IpExtReasmNoMemory);
                c.inc(Counter::IpReasmFails);
            }
        }
        let evicted = self.reasm.take_evicted();
        let c = self.iface.counters_mut();
        c.add(Counter::IpReasmFails, evicted);
        c.add(Counter::IpExtReasmNoMemory, evicted);
    }

    /// True if a parsed datagram is for us and from a possible source; counts the drop if not.
    pub(super) fn ip_admit(&mut self, repr: &Ipv4Repr) -> bool {
        if !self.iface.accepts(repr.dst) {
            self.iface.counters_mut().inc(Counter::IpInAddrErrors);
            return false;
        }
        if self.is_martian_source(repr.src) {
            self.iface.counters_mut().inc(Counter::IpExtInMartianSrc);
            return false;
        }
        true
    }

    /// RFC 1122 §3.2.1.3 / RFC 1812 §5.3.7: a source that cannot be a host on the link —
    /// "this network" 0/8 (0.0.0.0 itself is allowed, hosts use it while configuring),
    /// class E 240/4, loopback 127/8 and our own address arriving from the wire (a spoofed
    /// or "land" datagram). A loopback interface (127/8, or one carrying a host's own
    /// address locally) sees only what it sent itself, so nothing it receives is martian.
    fn is_martian_source(&self, src: ipv4::Ipv4Address) -> bool {
        let ours = self.iface.ip();
        let o = src.0[0];
        if ours.is_loopback() || self.iface.is_loopback() {
            return false;
        }
        (o == 0 && !src.is_unspecified()) || o >= 240 || src.is_loopback() || src == ours
    }

    /// Hands a whole datagram to its protocol. `header` is its IP header (for ICMP errors).
    fn deliver(&mut self, now: Instant, ip: &Ipv4Repr, header: &[u8], payload: &[u8]) {
        self.iface.counters_mut().inc(Counter::IpInDelivers);
        match ip.protocol {
            IpProtocol::Icmp => self.icmp_input(now, ip, payload),
            IpProtocol::Udp => self.udp_input(now, ip, header, payload),
            IpProtocol::Tcp => self.tcp_input(now, ip, payload),
            IpProtocol::Unknown(_) => {
                self.iface.counters_mut().inc(Counter::IpInUnknownProtos);
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
        let (csum, our_ip) = (self.iface.checksum(), self.iface.ip());
        let c = self.iface.counters_mut();
        c.inc(Counter::IcmpInMsgs);
        let parsed = icmpv4::Packet::new_checked(payload).and_then(|p| Icmpv4Repr::parse(&p, csum));
        let repr = match parsed {
            Ok(r) => r,
            Err(WireError::IcmpBadChecksum) => {
                c.inc(Counter::IcmpInErrors);
                return c.inc(Counter::IcmpInCsumErrors);
            }
            Err(WireError::IcmpUnsupported) => {
                // RFC 1122 §3.2.2.2 lets a host update its routes from a redirect; like
                // Linux with accept_redirects=0 (the default for hosts that route
                // nothing), flowstack ignores them: a forged redirect cannot steer traffic.
                if payload.first() == Some(&ICMP_REDIRECT) {
                    c.inc(Counter::IcmpInRedirects);
                }
                return c.inc(Counter::IcmpExtInIgnored);
            }
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
                if ip.dst != our_ip {
                    return c.inc(Counter::IcmpExtInIgnored);
                }
                let reply = Icmpv4Repr::EchoReply {
                    ident,
                    seq_no,
                    data,
                };
                let len = reply.buffer_len();
                if self
                    .iface
                    .send_ip(now, ip.src, IpProtocol::Icmp, len, false, &mut |b| {
                        reply.emit(b, csum)
                    })
                    .is_ok()
                {
                    let c = self.iface.counters_mut();
                    c.inc(Counter::IcmpOutMsgs);
                    c.inc(Counter::IcmpOutEchoReps);
                }
            }
            Icmpv4Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => {
                c.inc(Counter::IcmpInEchoReps);
                self.echo_reply_received(now, ip, ident, seq_no, data);
            }
            Icmpv4Repr::DstUnreachable {
                reason,
                next_hop_mtu,
                original,
            } => {
                c.inc(Counter::IcmpInDestUnreachs);
                self.icmp_unreachable(now, reason, next_hop_mtu, original);
            }
            Icmpv4Repr::TimeExceeded { code, original } => {
                c.inc(Counter::IcmpInTimeExcds);
                // Code 0 (TTL exceeded in transit) concerns the path; code 1 (reassembly)
                // concerns only fragments, which TCP never sends.
                if code == 0 {
                    self.icmp_tcp(now, IcmpError::TimeExceeded, original);
                }
            }
        }
    }

    /// Reports an ICMP destination-unreachable to the socket it concerns (RFC 1122 §4.1.3.3).
    /// The quoted datagram is usually cut after 8 payload bytes, so its fields are read
    /// directly once the header is known to be there.
    fn icmp_unreachable(&mut self, now: Instant, reason: DstUnreachable, mtu: u16, q: &[u8]) {
        if q.len() < ipv4::HEADER_LEN + 4 || q[0] >> 4 != 4 {
            return;
        }
        let hl = ((q[0] & 0xf) as usize) * 4;
        if hl < ipv4::HEADER_LEN || q.len() < hl + 4 {
            return;
        }
        let proto = IpProtocol::from(q[9]);
        let sport = u16::from_be_bytes([q[hl], q[hl + 1]]);
        match proto {
            IpProtocol::Udp if reason == DstUnreachable::PortUnreachable => {
                self.udp.report_error(sport, SocketError::ConnectionRefused);
            }
            IpProtocol::Tcp => {
                let err = match reason {
                    DstUnreachable::FragRequired => IcmpError::FragNeeded {
                        mtu,
                        quoted_len: u16::from_be_bytes([q[2], q[3]]),
                    },
                    DstUnreachable::PortUnreachable => IcmpError::PortUnreachable,
                    _ => IcmpError::Unreachable,
                };
                self.icmp_tcp(now, err, q);
            }
            _ => {}
        }
    }

    /// Hands an ICMP error about a TCP segment we sent to its connection. RFC 792 quotes the
    /// IP header and at least 8 bytes of TCP: ports and sequence number, all TCP needs.
    fn icmp_tcp(&mut self, now: Instant, err: IcmpError, q: &[u8]) {
        if q.len() < ipv4::HEADER_LEN || q[0] >> 4 != 4 || q[9] != u8::from(IpProtocol::Tcp) {
            return;
        }
        let hl = ((q[0] & 0xf) as usize) * 4;
        if hl < ipv4::HEADER_LEN || q.len() < hl + 8 {
            return self.iface.counters_mut().inc(Counter::IcmpInErrors);
        }
        let addr = |at: usize| ipv4::Ipv4Address([q[at], q[at + 1], q[at + 2], q[at + 3]]);
        let (src, dst) = (addr(12), addr(16));
        if src != self.iface.ip() {
            // Not a datagram we sent: forged or misdirected.
            return self
                .iface
                .counters_mut()
                .inc(Counter::TcpExtTCPIcmpNoSocket);
        }
        let t = FourTuple {
            local_ip: src,
            local_port: u16::from_be_bytes([q[hl], q[hl + 1]]),
            remote_ip: dst,
            remote_port: u16::from_be_bytes([q[hl + 2], q[hl + 3]]),
        };
        let seq = SeqNum(u32::from_be_bytes([
            q[hl + 4],
            q[hl + 5],
            q[hl + 6],
            q[hl + 7],
        ]));
        self.tcp.icmp_error(now, &t, seq, err);
    }

    fn udp_input(&mut self, now: Instant, ip: &Ipv4Repr, header: &[u8], payload: &[u8]) {
        let csum = self.l4_checksum();
        let c = self.iface.counters_mut();
        let pkt = match wudp::Packet::new_checked(payload) {
            Ok(p) => p,
            Err(_) => return c.inc(Counter::UdpInErrors),
        };
        let repr = match UdpRepr::parse(&pkt, ip.src, ip.dst, csum) {
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
            Delivery::Delivered => self.iface.counters_mut().inc(Counter::UdpInDatagrams),
            Delivery::QueueFull => self.iface.counters_mut().inc(Counter::UdpRcvbufErrors),
            Delivery::NoPort => {
                self.iface.counters_mut().inc(Counter::UdpNoPorts);
                self.icmp_error(now, ip, header, payload, DstUnreachable::PortUnreachable);
            }
        }
    }

    fn tcp_input(&mut self, now: Instant, ip: &Ipv4Repr, payload: &[u8]) {
        // TCP input as seed 000 counts it: header parse, checksum, demux, processing.
        let _p = flowstack_prof::enter(flowstack_prof::Layer::TcpInput);
        let csum = self.l4_checksum();
        let c = self.iface.counters_mut();
        c.inc(Counter::TcpInSegs);
        let pkt = match wtcp::Packet::new_checked(payload) {
            Ok(p) => p,
            Err(_) => return c.inc(Counter::TcpInErrs),
        };
        let seg = match TcpRepr::parse(&pkt, ip.src, ip.dst, csum) {
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
}
