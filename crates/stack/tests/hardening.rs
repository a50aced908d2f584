//! Hardening (issue 19): the bugs found by treating flowstack as a hostile peer would, and the
//! hostile cases handled as Linux handles them — each checked end to end through the engine,
//! with the counter that records it.

use flowstack_link::DeviceCaps;
use flowstack_stack::netsim::{bulk_transfer, Net, NetConfig, PathMtu, A_IP, B_IP};
use flowstack_stack::{Counter, Engine, EngineConfig, IfaceConfig, TcpHandle};
use flowstack_wire::ethernet::EthernetRepr;
use flowstack_wire::icmpv4::{DstUnreachable, Icmpv4Repr};
use flowstack_wire::ipv4::{IpProtocol, Ipv4Repr};
use flowstack_wire::tcp::{Flags, TcpOptions, TcpRepr};
use flowstack_wire::udp::UdpRepr;
use flowstack_wire::{
    ChecksumCaps, Duration, EtherType, EthernetAddress, Instant, Ipv4Address, Ipv4Cidr, SeqNum,
};
use std::net::SocketAddrV4;

const TSO: DeviceCaps = DeviceCaps {
    max_tx_datagram: 65535,
    ..DeviceCaps::ETHERNET
};

fn net(cfg: NetConfig) -> Net {
    Net::new(cfg, None).unwrap()
}

fn mac_of(ip: Ipv4Address) -> EthernetAddress {
    EthernetAddress([2, 0, 0, 0, 0, ip.0[3]])
}

/// An Ethernet frame carrying an IPv4 datagram `r` with payload `p`, from `r.src`'s MAC.
fn frame(r: &Ipv4Repr, p: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 20 + p.len()];
    EthernetRepr {
        src: mac_of(r.src),
        dst: mac_of(r.dst),
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut f);
    r.emit(&mut f[14..], ChecksumCaps::SOFTWARE);
    f[34..].copy_from_slice(p);
    f
}

fn tcp_bytes(src: Ipv4Address, dst: Ipv4Address, t: &TcpRepr) -> Vec<u8> {
    let mut b = vec![0u8; t.buffer_len()];
    t.emit(&mut b, src, dst, ChecksumCaps::SOFTWARE);
    b
}

fn tcp_frame(src: Ipv4Address, dst: Ipv4Address, t: &TcpRepr) -> Vec<u8> {
    let b = tcp_bytes(src, dst, t);
    frame(&Ipv4Repr::new(src, dst, IpProtocol::Tcp, b.len()), &b)
}

fn seg(sport: u16, dport: u16, seq: SeqNum, ack: SeqNum, flags: Flags) -> TcpRepr<'static> {
    TcpRepr {
        src_port: sport,
        dst_port: dport,
        seq,
        ack,
        flags,
        window: 65535,
        urgent: 0,
        options: TcpOptions::default(),
        payload: &[],
    }
}

/// An established connection A → B:5001 with some data acknowledged and more in flight
/// (B's listener is kept so the engine holds it).
fn established(n: &mut Net) -> (TcpHandle, TcpHandle) {
    let l = n.b.tcp_listen(5001, 4).unwrap();
    n.stamp();
    let c =
        n.a.tcp_connect(SocketAddrV4::new(B_IP.into(), 5001))
            .unwrap();
    let mut s = None;
    assert!(n.run_until(Duration::from_secs(2), |n| {
        s = s.or_else(|| n.b.tcp_accept(l).ok());
        s.is_some() && n.a.tcp_conn(c).unwrap().is_open()
    }));
    (c, s.unwrap())
}

/// An ICMP error from the router about a TCP segment A sent on `c` with sequence `seq`.
fn icmp_about(n: &Net, c: TcpHandle, seq: SeqNum, icmp: impl Fn(&[u8]) -> Icmpv4Repr) -> Vec<u8> {
    let t = n.a.tcp_conn(c).unwrap().tuple();
    let quoted_tcp = tcp_bytes(
        A_IP,
        B_IP,
        &seg(t.local_port, t.remote_port, seq, SeqNum(0), Flags::ACK),
    );
    let ip = Ipv4Repr::new(A_IP, B_IP, IpProtocol::Tcp, 1400);
    let mut q = vec![0u8; 28];
    ip.emit(&mut q, ChecksumCaps::SOFTWARE);
    q[20..28].copy_from_slice(&quoted_tcp[..8]);
    let m = icmp(&q);
    let mut b = vec![0u8; m.buffer_len()];
    m.emit(&mut b, ChecksumCaps::SOFTWARE);
    let router = Ipv4Address::new(10, 0, 0, 254);
    let mut r = Ipv4Repr::new(router, A_IP, IpProtocol::Icmp, b.len());
    r.ttl = 60;
    let mut f = frame(&r, &b);
    f[6..12].copy_from_slice(&mac_of(B_IP).0); // the router is behind B's MAC here
    f
}

fn frag_needed(mtu: u16) -> impl Fn(&[u8]) -> Icmpv4Repr<'_> {
    move |q| Icmpv4Repr::DstUnreachable {
        reason: DstUnreachable::FragRequired,
        next_hop_mtu: mtu,
        original: q,
    }
}

// ---- 1. the five bugs -----------------------------------------------------------------------

/// RFC 9293 §3.7.1: with segmentation offload, segments are still cut at the effective send
/// MSS — a peer that announced 536 never receives more (before the fix: 64 KB frames).
#[test]
fn segmentation_offload_cuts_at_the_peers_mss() {
    let mut n = net(NetConfig {
        caps: TSO,
        tune: |c| {
            if c.iface.addr.addr == B_IP {
                c.tcp.defaults.mss = 536;
            }
        },
        ..Default::default()
    });
    let r = bulk_transfer(&mut n, 300_000, Duration::from_secs(30), |_| {}, |_| {}).unwrap();
    assert!(r.complete && r.mismatch_at.is_none());
    assert!(n.path.get().max_tcp_payload <= 536, "{:?}", n.path.get());
    // The same link with the full MSS does hand large segments to the device.
    let mut n = net(NetConfig {
        caps: TSO,
        ..Default::default()
    });
    let r = bulk_transfer(&mut n, 300_000, Duration::from_secs(30), |_| {}, |_| {}).unwrap();
    assert!(r.complete);
    assert!(n.path.get().max_tcp_payload > 1460);
}

/// RFC 1191: a router with a smaller MTU answers with "fragmentation needed"; the connection
/// lowers its MSS and the transfer completes byte-exact (before the fix it hung: every
/// full-sized segment carried DF and died at the router).
#[test]
fn path_mtu_discovery_from_icmp() {
    for caps in [DeviceCaps::ETHERNET, TSO] {
        let mut n = net(NetConfig {
            caps,
            path_mtu: Some(PathMtu {
                mtu: 1000,
                icmp: true,
            }),
            ..Default::default()
        });
        let r = bulk_transfer(&mut n, 200_000, Duration::from_secs(20), |_| {}, |_| {}).unwrap();
        assert!(r.complete && r.mismatch_at.is_none(), "{r:?}");
        let p = n.path.get();
        assert!(p.icmp_sent >= 1, "{p:?}");
        assert!(n.a.tcp_iter().all(|c| c.mss() <= 960));
        assert!(n.a.counters().get(Counter::TcpExtTCPPMTUReduced) >= 1);
        // Not treated as congestion: no timeout was needed.
        assert_eq!(r.client.timeouts, 0, "{r:?}");
    }
}

/// RFC 4821 §7.7: ICMP filtered (a PMTU black hole) — after repeated timeouts of full-sized
/// segments the MSS is lowered and the transfer completes.
#[test]
fn pmtu_black_hole_is_detected() {
    let mut n = net(NetConfig {
        path_mtu: Some(PathMtu {
            mtu: 1200,
            icmp: false,
        }),
        ..Default::default()
    });
    let r = bulk_transfer(&mut n, 100_000, Duration::from_secs(120), |_| {}, |_| {}).unwrap();
    assert!(r.complete && r.mismatch_at.is_none(), "{r:?}");
    assert!(n.a.counters().get(Counter::TcpExtTCPMTUPBlackhole) >= 1);
    assert!(n.path.get().too_big >= 3);
}

/// RFC 5927 §4.1: an ICMP error whose quoted sequence number is not in flight is ignored
/// and counted; an absurd MTU is raised to the floor (Linux min_pmtu 552); an MTU not below
/// the current one is ignored.
#[test]
fn icmp_errors_are_checked_against_the_connection() {
    let mut n = net(NetConfig::default());
    let (c, _s) = established(&mut n);
    n.stamp();
    n.a.tcp_send(c, &[7u8; 4000]).unwrap();
    n.turn(); // data in flight, not yet acknowledged
    let (una, max) = n.a.tcp_conn(c).unwrap().send_seq();
    assert!(max > una);
    let now = n.now;
    // Outside [SND.UNA, SND.NXT): ignored.
    let f = icmp_about(&n, c, una - 10_000, frag_needed(600));
    n.a.receive(now, &f);
    assert_eq!(n.a.counters().get(Counter::TcpExtOutOfWindowIcmps), 1);
    assert_eq!(n.a.tcp_conn(c).unwrap().mss(), 1460);
    // Not below the current MTU: ignored.
    let f = icmp_about(&n, c, una, frag_needed(9000));
    n.a.receive(now, &f);
    assert_eq!(n.a.counters().get(Counter::TcpExtTCPPMTUIgnored), 1);
    // Absurd (below 68): the floor.
    let f = icmp_about(&n, c, una, frag_needed(20));
    n.a.receive(now, &f);
    assert_eq!(n.a.tcp_conn(c).unwrap().mss(), 552 - 40);
    assert_eq!(n.a.counters().get(Counter::TcpExtTCPPMTUReduced), 1);
}

/// RFC 1122 §4.2.3.9: port and host unreachable on an established connection are soft
/// errors — the connection stays and the error is only remembered.
#[test]
fn unreachable_on_established_is_a_soft_error() {
    let mut n = net(NetConfig::default());
    let (c, _s) = established(&mut n);
    n.stamp();
    n.a.tcp_send(c, &[1u8; 100]).unwrap();
    n.turn();
    let (una, _) = n.a.tcp_conn(c).unwrap().send_seq();
    for reason in [
        DstUnreachable::PortUnreachable,
        DstUnreachable::HostUnreachable,
    ] {
        let f = icmp_about(&n, c, una, |q| Icmpv4Repr::DstUnreachable {
            reason,
            next_hop_mtu: 0,
            original: q,
        });
        let now = n.now;
        n.a.receive(now, &f);
    }
    assert_eq!(n.a.counters().get(Counter::TcpExtTCPIcmpSoftErrors), 2);
    let conn = n.a.tcp_conn(c).unwrap();
    assert!(conn.is_open() && conn.error().is_none());
    assert!(conn.soft_error().is_some());
    assert!(n.run_until(Duration::from_secs(2), |n| {
        n.a.tcp_conn(c).unwrap().send_queue() == 0
    }));
}

/// ICMP redirects are ignored (accept_redirects=0) and counted.
#[test]
fn redirects_are_ignored_and_counted() {
    let mut e = lone_engine();
    let mut m = vec![5u8, 1, 0, 0, 10, 0, 0, 99];
    m.extend_from_slice(&[0u8; 28]);
    let ck = flowstack_wire::checksum::checksum(&m);
    m[2..4].copy_from_slice(&ck.to_be_bytes());
    let r = Ipv4Repr::new(B_IP, A_IP, IpProtocol::Icmp, m.len());
    e.receive(Instant::ZERO, &frame(&r, &m));
    assert_eq!(e.counters().get(Counter::IcmpInRedirects), 1);
    assert_eq!(e.counters().get(Counter::IcmpExtInIgnored), 1);
    assert!(e.tx().is_empty());
}

fn lone_engine() -> Engine {
    let mut cfg = EngineConfig::new(IfaceConfig::new(mac_of(A_IP), Ipv4Cidr::new(A_IP, 24)));
    cfg.secret = Some([1; 16]);
    Engine::new(cfg, DeviceCaps::ETHERNET)
}

fn udp_to_a(port: u16, payload: &[u8], tweak: impl Fn(&mut Ipv4Repr)) -> Vec<u8> {
    let mut u = vec![0u8; 8 + payload.len()];
    u[8..].copy_from_slice(payload);
    UdpRepr {
        src_port: 999,
        dst_port: port,
    }
    .emit_header(&mut u, B_IP, A_IP, payload.len(), ChecksumCaps::SOFTWARE);
    let mut r = Ipv4Repr::new(B_IP, A_IP, IpProtocol::Udp, u.len());
    tweak(&mut r);
    frame(&r, &u)
}

/// RFC 1122 §3.2.1.7: the TTL rule is about sending; a datagram addressed to us with TTL 0 or
/// 1 is delivered.
#[test]
fn ttl_zero_and_one_addressed_to_us_are_delivered() {
    let mut e = lone_engine();
    let h = e.udp_bind(53).unwrap();
    for ttl in [0u8, 1] {
        e.receive(Instant::ZERO, &udp_to_a(53, b"hi", |r| r.ttl = ttl));
    }
    let mut buf = [0u8; 8];
    for _ in 0..2 {
        assert_eq!(e.udp_recv_from(h, &mut buf).unwrap().0, 2);
    }
    assert_eq!(e.counters().get(Counter::IpInHdrErrors), 0);
}

/// A datagram whose header carries `opts`, to A.
fn with_ip_options(opts: &[u8]) -> Vec<u8> {
    let mut f = udp_to_a(53, b"x", |_| {});
    let hl = 20 + opts.len();
    let mut ip = f[14..34].to_vec();
    ip[0] = 0x40 | (hl / 4) as u8;
    let total = (hl + 9) as u16;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(opts);
    ip[10..12].copy_from_slice(&[0, 0]);
    let ck = flowstack_wire::checksum::checksum(&ip[..hl]);
    ip[10..12].copy_from_slice(&ck.to_be_bytes());
    let udp = f[34..].to_vec();
    f.truncate(14);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&udp);
    f
}

/// Source routes and malformed options are dropped and counted (as Linux with
/// accept_source_route=0); a bad header checksum is a header error too.
#[test]
fn source_routes_malformed_options_and_bad_checksums_counted() {
    let mut e = lone_engine();
    let h = e.udp_bind(53).unwrap();
    e.receive(Instant::ZERO, &with_ip_options(&[1, 131, 7, 4, 1, 2, 3, 4]));
    e.receive(Instant::ZERO, &with_ip_options(&[1, 137, 7, 4, 1, 2, 3, 4]));
    assert_eq!(e.counters().get(Counter::IpExtInSrcRouteDrops), 2);
    e.receive(Instant::ZERO, &with_ip_options(&[30, 9, 0, 0]));
    assert_eq!(e.counters().get(Counter::IpInHdrErrors), 3);
    let mut f = udp_to_a(53, b"x", |_| {});
    f[14 + 10] ^= 0x40;
    e.receive(Instant::ZERO, &f);
    assert_eq!(e.counters().get(Counter::IpExtInCsumErrors), 1);
    assert_eq!(e.counters().get(Counter::IpInHdrErrors), 4);
    // A harmless option (record route) still gets through.
    e.receive(Instant::ZERO, &with_ip_options(&[7, 7, 4, 0, 0, 0, 0, 0]));
    let mut buf = [0u8; 8];
    assert_eq!(e.udp_recv_from(h, &mut buf).unwrap().0, 1);
}

/// RFC 9293 §3.10.7.4 / RFC 5961 §4: SYN+FIN and SYN+RST on an established connection get a
/// challenge ACK (before the fix they were dropped at parse); the connection survives.
#[test]
fn syn_fin_and_syn_rst_on_established_get_challenge_acks() {
    let mut n = net(NetConfig::default());
    let (c, _s) = established(&mut n);
    let t = n.a.tcp_conn(c).unwrap().tuple();
    let (_, max) = n.a.tcp_conn(c).unwrap().send_seq();
    let rcv = n.a.tcp_conn(c).unwrap().recv_next();
    for flags in [
        Flags::SYN | Flags::FIN,
        Flags::SYN | Flags::RST,
        Flags::SYN | Flags::RST | Flags::ACK,
    ] {
        let before = n.a.counters().get(Counter::TcpExtTCPChallengeACK);
        let f = tcp_frame(
            B_IP,
            A_IP,
            &seg(t.remote_port, t.local_port, rcv, max, flags),
        );
        let now = n.now;
        n.a.receive(now, &f);
        n.a.dispatch(now);
        assert_eq!(
            n.a.counters().get(Counter::TcpExtTCPChallengeACK),
            before + 1,
            "{flags}"
        );
        assert!(n.a.tcp_conn(c).unwrap().is_open(), "{flags}");
        n.a.tx().clear();
        n.now += Duration::from_secs(1); // past the challenge-ACK rate limit window
    }
    assert_eq!(n.a.counters().get(Counter::TcpExtTCPBadSynFlags), 3);
    assert_eq!(n.a.tcp_error(c), None);
}

/// A listener drops SYN+FIN (as Linux) and anything that is neither SYN, RST nor a cookie
/// ACK; TCP to a broadcast address and land segments are dropped; each is counted.
#[test]
fn odd_segments_to_listeners_broadcast_and_land_counted() {
    let mut e = lone_engine();
    e.tcp_listen(80, 4).unwrap();
    let syn_fin = seg(4000, 80, SeqNum(1), SeqNum(0), Flags::SYN | Flags::FIN);
    e.receive(Instant::ZERO, &tcp_frame(B_IP, A_IP, &syn_fin));
    assert_eq!(e.counters().get(Counter::TcpExtTCPSynFinDrop), 1);
    let fin = seg(4000, 80, SeqNum(1), SeqNum(0), Flags::FIN);
    e.receive(Instant::ZERO, &tcp_frame(B_IP, A_IP, &fin));
    assert_eq!(e.counters().get(Counter::TcpExtTCPListenBadFlags), 1);
    let syn = seg(4000, 80, SeqNum(1), SeqNum(0), Flags::SYN);
    let mut bcast = tcp_frame(B_IP, Ipv4Address::new(10, 0, 0, 255), &syn);
    bcast[0..6].copy_from_slice(&[0xff; 6]);
    e.receive(Instant::ZERO, &bcast);
    assert_eq!(e.counters().get(Counter::TcpExtTCPBroadcastDrop), 1);
    // Land: our own address as the source, from the wire (martian), and same port.
    let land = seg(80, 80, SeqNum(1), SeqNum(0), Flags::SYN);
    e.receive(Instant::ZERO, &tcp_frame(A_IP, A_IP, &land));
    assert_eq!(e.counters().get(Counter::IpExtInMartianSrc), 1);
    for src in [
        Ipv4Address::new(127, 0, 0, 1),
        Ipv4Address::new(0, 1, 2, 3),
        Ipv4Address::new(240, 0, 0, 1),
    ] {
        e.receive(Instant::ZERO, &tcp_frame(src, A_IP, &syn));
    }
    assert_eq!(e.counters().get(Counter::IpExtInMartianSrc), 4);
    // Nothing of that was answered.
    assert!(e.tx().is_empty(), "{} frames", e.tx().len());
    assert_eq!(e.counters().get(Counter::TcpPassiveOpens), 0);
}

/// An engine serving 127/8 itself sees a land segment at TCP (no martian check there).
#[test]
fn land_segment_on_loopback_engine_dropped() {
    let lo = Ipv4Address::new(127, 0, 0, 1);
    let cfg = EngineConfig::new(IfaceConfig::new(mac_of(lo), Ipv4Cidr::new(lo, 8)));
    let mut e = Engine::new(cfg, DeviceCaps::ETHERNET);
    e.tcp_listen(80, 4).unwrap();
    let land = seg(80, 80, SeqNum(1), SeqNum(0), Flags::SYN);
    let mut f = tcp_frame(lo, lo, &land);
    f[0..6].copy_from_slice(&mac_of(lo).0);
    e.receive(Instant::ZERO, &f);
    assert_eq!(e.counters().get(Counter::TcpExtTCPLandDrop), 1);
    assert!(e.tx().is_empty());
}

/// Tiny MSS and window scale above 14 from a peer's SYN are clamped and counted.
#[test]
fn syn_option_clamps_counted() {
    let mut e = lone_engine();
    e.tcp_listen(80, 4).unwrap();
    let mut syn = seg(4000, 80, SeqNum(1), SeqNum(0), Flags::SYN);
    syn.options.mss = Some(1);
    syn.options.window_scale = Some(200);
    e.receive(Instant::ZERO, &tcp_frame(B_IP, A_IP, &syn));
    assert_eq!(e.counters().get(Counter::TcpExtTCPMSSClamped), 1);
    assert_eq!(e.counters().get(Counter::TcpExtTCPWscaleClamped), 1);
    let c = e.tcp_iter().next().unwrap();
    assert_eq!(c.mss(), 48);
    assert_eq!(c.options().2, 14);
}

// ---- 2. limits and floods -------------------------------------------------------------------

fn arp_request_from(ip: Ipv4Address, mac: EthernetAddress) -> Vec<u8> {
    use flowstack_wire::arp::{ArpOperation, ArpRepr};
    let r = ArpRepr {
        operation: ArpOperation::Request,
        source_hardware_addr: mac,
        source_protocol_addr: ip,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: A_IP,
    };
    let mut f = vec![0u8; 14 + r.buffer_len()];
    EthernetRepr {
        src: mac,
        dst: EthernetAddress::BROADCAST,
        ethertype: EtherType::Arp,
    }
    .emit(&mut f);
    r.emit(&mut f[14..]);
    f
}

/// An ARP flood (requests from many senders, each of which a host learns, RFC 826) never
/// grows the cache past its configured bound; every eviction is counted.
#[test]
fn arp_flood_is_bounded_and_counted() {
    let mut cfg = EngineConfig::new(IfaceConfig::new(mac_of(A_IP), Ipv4Cidr::new(A_IP, 16)));
    cfg.iface.arp.max_entries = 16;
    let mut e = Engine::new(cfg, DeviceCaps::ETHERNET);
    for i in 0..100u32 {
        let ip = Ipv4Address::new(10, 0, 1 + (i / 200) as u8, (i % 200) as u8 + 1);
        let mac = EthernetAddress([2, 1, 0, 0, (i >> 8) as u8, i as u8]);
        e.receive(Instant::from_millis(i as u64), &arp_request_from(ip, mac));
        e.tx().clear();
    }
    assert_eq!(e.arp_entries().count(), 16);
    assert_eq!(e.counters().get(Counter::ArpExtCacheFull), 84);
    assert_eq!(e.counters().get(Counter::ArpInRequests), 100);
}

fn fragment(ident: u16, offset: u16, more: bool, data: &[u8]) -> Vec<u8> {
    let mut r = Ipv4Repr::new(B_IP, A_IP, IpProtocol::Udp, data.len());
    r.ident = ident;
    r.dont_frag = false;
    r.frag_offset = offset;
    r.more_frags = more;
    frame(&r, data)
}

/// A duplicate fragment is counted; a fragment flood beyond the reassembly memory bound is
/// dropped and counted.
#[test]
fn duplicate_fragments_and_reassembly_memory_counted() {
    let mut cfg = EngineConfig::new(IfaceConfig::new(mac_of(A_IP), Ipv4Cidr::new(A_IP, 24)));
    cfg.reasm.max_bytes = 8 * 1024;
    let mut e = Engine::new(cfg, DeviceCaps::ETHERNET);
    let f = fragment(1, 0, true, &[0u8; 512]);
    e.receive(Instant::ZERO, &f);
    e.receive(Instant::ZERO, &f);
    assert_eq!(e.counters().get(Counter::IpExtReasmDuplicates), 1);
    for id in 2..200u16 {
        e.receive(Instant::ZERO, &fragment(id, 0, true, &[0u8; 512]));
    }
    assert!(e.reassembly_memory() <= 8 * 1024);
    assert!(e.counters().get(Counter::IpExtReasmNoMemory) > 100);
}

/// The connection limit is enforced for both directions and its exhaustion counted.
#[test]
fn connection_limit_counted() {
    let mut n = net(NetConfig {
        tune: |c| c.tcp.max_connections = 2,
        ..Default::default()
    });
    n.b.tcp_listen(5001, 8).unwrap();
    n.stamp();
    let a = SocketAddrV4::new(B_IP.into(), 5001);
    n.a.tcp_connect(a).unwrap();
    n.a.tcp_connect(a).unwrap();
    assert_eq!(
        n.a.tcp_connect(a),
        Err(flowstack_stack::SocketError::LimitReached)
    );
    assert_eq!(n.a.counters().get(Counter::TcpExtTCPConnLimit), 1);
    n.run_until(Duration::from_secs(1), |_| false);
    assert_eq!(n.b.tcp_iter().count(), 2);
}

/// Regression (found by simnet): on a link with delay, a frame the far side's impairment
/// released during its poll waited in the cable until the receiver's next timer (every ACK
/// came an RTO late). The RTT measured must be about twice the one-way delay.
#[test]
fn netsim_delivers_delayed_frames_without_waiting_for_a_timer() {
    let mut n = net(NetConfig {
        impair: "delay=5ms".parse().unwrap(),
        ..Default::default()
    });
    let r = bulk_transfer(&mut n, 200_000, Duration::from_secs(30), |_| {}, |_| {}).unwrap();
    assert!(r.complete);
    let srtt = r.srtt.unwrap();
    assert!(srtt < Duration::from_millis(50), "{srtt:?}");
    assert_eq!(r.client.timeouts, 0);
}

/// Thousands of idle connections cost no work per turn and do not stop a real client.
#[test]
fn thousands_of_idle_connections_while_a_client_is_served() {
    let mut n = net(NetConfig::default());
    let l = n.b.tcp_listen(6000, 4096).unwrap();
    n.stamp();
    let mut idle = Vec::new();
    for _ in 0..2000 {
        idle.push(
            n.a.tcp_connect(SocketAddrV4::new(B_IP.into(), 6000))
                .unwrap(),
        );
    }
    let mut accepted = 0;
    assert!(n.run_until(Duration::from_secs(10), |n| {
        while n.b.tcp_accept(l).is_ok() {
            accepted += 1;
        }
        accepted == 2000
    }));
    let r = bulk_transfer(&mut n, 1_000_000, Duration::from_secs(30), |_| {}, |_| {}).unwrap();
    assert!(r.complete && r.mismatch_at.is_none());
    assert!(idle.iter().all(|&h| n.a.tcp_conn(h).unwrap().is_open()));
    assert_eq!(n.b.counters().get(Counter::TcpExtListenDrops), 0);
}

/// RFC 9293 §3.10.7.1: a connection that is over (here aborted by A's application, which
/// still holds its handle) answers a segment from the peer with a RST, as a port without a
/// socket does — before, the segment was silently ignored while the handle lived, so a peer
/// that missed our RST (or answered it with a challenge ACK) was never told.
#[test]
fn a_closed_connection_still_held_answers_with_rst() {
    let mut n = net(NetConfig::default());
    let (c, _s) = established(&mut n);
    let t = n.a.tcp_conn(c).unwrap().tuple();
    let (_, max) = n.a.tcp_conn(c).unwrap().send_seq();
    let rcv = n.a.tcp_conn(c).unwrap().recv_next();
    n.a.tcp_abort(c).unwrap();
    let now = n.now;
    n.a.dispatch(now);
    n.a.tx().clear();
    assert!(
        n.a.tcp_conn(c).is_ok(),
        "the application still holds the handle"
    );
    let rsts = n.a.counters().get(Counter::TcpOutRsts);
    let no_sock = n.a.counters().get(Counter::TcpExtTCPNoSocket);
    // The peer, unaware, acknowledges and sends more.
    let f = tcp_frame(
        B_IP,
        A_IP,
        &seg(
            t.remote_port,
            t.local_port,
            rcv,
            max,
            Flags::ACK | Flags::PSH,
        ),
    );
    n.a.receive(now, &f);
    n.a.dispatch(now);
    assert_eq!(n.a.counters().get(Counter::TcpOutRsts), rsts + 1);
    assert_eq!(n.a.counters().get(Counter::TcpExtTCPNoSocket), no_sock + 1);
    let sent: Vec<Vec<u8>> = n.a.tx().iter().map(|f| f.to_vec()).collect();
    let rst = sent
        .iter()
        .filter_map(|f| {
            let ip = flowstack_wire::ipv4::Packet::new_checked(&f[14..]).ok()?;
            let tcp = flowstack_wire::tcp::Packet::new_checked(ip.payload()).ok()?;
            tcp.flags().rst().then(|| tcp.seq())
        })
        .next()
        .expect("a RST went out");
    // §3.10.7.1: the RST takes its sequence number from the segment's ACK field.
    assert_eq!(rst, max);
    // A RST is never answered.
    let f = tcp_frame(
        B_IP,
        A_IP,
        &seg(t.remote_port, t.local_port, rcv, max, Flags::RST),
    );
    n.a.receive(now, &f);
    n.a.dispatch(now);
    assert_eq!(n.a.counters().get(Counter::TcpOutRsts), rsts + 1);
}
