//! Engine behaviour over the simulated link: ARP, ICMP, UDP, fragmentation, and a named drop
//! counter for each malformed input.

use flowstack_link::impair::ImpairSpec;
use flowstack_link::DeviceCaps;
use flowstack_stack::netsim::{Net, NetConfig, A_IP, B_IP};
use flowstack_stack::{Counter, Engine, EngineConfig, IfaceConfig, SocketError};
use flowstack_wire::ethernet::EthernetRepr;
use flowstack_wire::ipv4::{IpProtocol, Ipv4Repr};
use flowstack_wire::tcp::{Flags, TcpOptions, TcpRepr};
use flowstack_wire::udp::UdpRepr;
use flowstack_wire::{
    arp, ChecksumCaps, Duration, EtherType, EthernetAddress, Instant, Ipv4Address, Ipv4Cidr, SeqNum,
};
use std::net::SocketAddrV4;

fn net() -> Net {
    Net::new(NetConfig::default(), None).unwrap()
}

fn sa(ip: Ipv4Address, port: u16) -> SocketAddrV4 {
    SocketAddrV4::new(ip.into(), port)
}

#[test]
fn ping_resolves_by_arp_and_gets_reply() {
    let mut n = net();
    n.stamp();
    n.a.ping_send(B_IP, 7, 1, b"abcdefgh").unwrap();
    let mut reply = None;
    assert!(n.run_until(Duration::from_secs(1), |n| {
        reply = n.a.ping_recv();
        reply.is_some()
    }));
    let r = reply.unwrap();
    assert_eq!((r.from, r.ident, r.seq_no, r.len), (B_IP, 7, 1, 8));
    assert_eq!(n.a.counters().get(Counter::ArpOutRequests), 1);
    assert_eq!(n.b.counters().get(Counter::ArpInRequests), 1);
    assert_eq!(n.b.counters().get(Counter::IcmpOutEchoReps), 1);
    // B learned A from the request, so it never had to ask.
    assert_eq!(n.b.counters().get(Counter::ArpOutRequests), 0);
}

#[test]
fn udp_datagrams_cross_and_port_unreachable_refuses() {
    let mut n = net();
    n.stamp();
    let ha = n.a.udp_bind(0).unwrap();
    let hb = n.b.udp_bind(9000).unwrap();
    assert_eq!(n.b.udp_bind(9000), Err(SocketError::AddrInUse));
    n.a.udp_send_to(ha, sa(B_IP, 9000), b"hello").unwrap();
    let mut buf = [0u8; 64];
    let mut got = None;
    assert!(n.run_until(Duration::from_secs(1), |n| {
        got = n.b.udp_recv_from(hb, &mut buf).ok();
        got.is_some()
    }));
    let (len, from) = got.unwrap();
    assert_eq!(&buf[..len], b"hello");
    assert_eq!(from.port(), n.a.udp_local_port(ha).unwrap());
    // Nobody listens on 9001: B answers port unreachable, A's socket reports refused.
    n.stamp();
    n.a.udp_send_to(ha, sa(B_IP, 9001), b"x").unwrap();
    let mut err = None;
    assert!(n.run_until(Duration::from_secs(1), |n| {
        err =
            n.a.udp_recv_from(ha, &mut buf)
                .err()
                .filter(|e| *e != SocketError::WouldBlock);
        err.is_some()
    }));
    assert_eq!(err, Some(SocketError::ConnectionRefused));
    assert_eq!(n.b.counters().get(Counter::UdpNoPorts), 1);
    assert_eq!(n.b.counters().get(Counter::IcmpOutDestUnreachs), 1);
}

#[test]
fn short_buffer_is_an_error_and_keeps_the_datagram() {
    let mut n = net();
    n.stamp();
    let ha = n.a.udp_bind(0).unwrap();
    let hb = n.b.udp_bind(53).unwrap();
    n.a.udp_send_to(ha, sa(B_IP, 53), &[7u8; 100]).unwrap();
    assert!(n.run_until(Duration::from_secs(1), |n| n.b.udp_readable(hb)));
    let mut small = [0u8; 10];
    assert_eq!(
        n.b.udp_recv_from(hb, &mut small),
        Err(SocketError::BufferTooSmall { needed: 100 })
    );
    let mut big = [0u8; 100];
    assert_eq!(n.b.udp_recv_from(hb, &mut big).unwrap().0, 100);
    assert_eq!(big, [7u8; 100]);
}

#[test]
fn large_datagram_is_fragmented_and_reassembled() {
    for impair in ["", "reorder=0.3,dup=0.2"] {
        let cfg = NetConfig {
            impair: impair.parse::<ImpairSpec>().unwrap(),
            seed: 11,
            ..Default::default()
        };
        let mut n = Net::new(cfg, None).unwrap();
        let ha = n.a.udp_bind(0).unwrap();
        let hb = n.b.udp_bind(7).unwrap();
        let data: Vec<u8> = (0..20_000u32).map(|i| (i * 7 % 256) as u8).collect();
        n.stamp();
        n.a.udp_send_to(ha, sa(B_IP, 7), &data).unwrap();
        let mut buf = vec![0u8; 65536];
        let mut len = 0;
        assert!(n.run_until(Duration::from_secs(2), |n| {
            len = n.b.udp_recv_from(hb, &mut buf).map(|r| r.0).unwrap_or(0);
            len > 0
        }));
        assert_eq!(&buf[..len], &data[..], "impair {impair}");
        assert_eq!(n.a.counters().get(Counter::IpFragCreates), 14);
        assert_eq!(n.b.counters().get(Counter::IpReasmOKs), 1);
        assert!(n.a.udp_send_to(ha, sa(B_IP, 7), &vec![0; 65508]).is_err());
    }
}

#[test]
fn arp_requests_are_rate_limited_and_resolution_gives_up() {
    let mut n = net();
    let ha = n.a.udp_bind(0).unwrap();
    let ghost = Ipv4Address::new(10, 0, 0, 99);
    for _ in 0..10 {
        n.stamp();
        n.a.udp_send_to(ha, sa(ghost, 1), b"?").unwrap();
        n.run_until(Duration::from_millis(50), |_| false);
    }
    assert_eq!(n.a.counters().get(Counter::ArpOutRequests), 1);
    n.run_until(Duration::from_secs(5), |_| false);
    assert_eq!(n.a.counters().get(Counter::ArpOutRequests), 3);
    assert_eq!(n.a.counters().get(Counter::ArpResolveFailed), 10);
}

// ---- malformed input, one named counter each -----------------------------------------------

const PEER_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 0x42]);
const OUR_MAC: EthernetAddress = EthernetAddress([2, 0, 0, 0, 0, 1]);

fn engine() -> Engine {
    Engine::new(
        EngineConfig::new(IfaceConfig::new(OUR_MAC, Ipv4Cidr::new(A_IP, 24))),
        DeviceCaps::ETHERNET,
    )
}

fn eth(ethertype: EtherType, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + payload.len()];
    EthernetRepr {
        src: PEER_MAC,
        dst: OUR_MAC,
        ethertype,
    }
    .emit(&mut f);
    f[14..].copy_from_slice(payload);
    f
}

fn ip(proto: IpProtocol, payload: &[u8]) -> Vec<u8> {
    let r = Ipv4Repr::new(B_IP, A_IP, proto, payload.len());
    let mut p = vec![0u8; 20 + payload.len()];
    r.emit(&mut p, ChecksumCaps::SOFTWARE);
    p[20..].copy_from_slice(payload);
    p
}

fn fix_ip_csum(p: &mut [u8]) {
    p[10..12].copy_from_slice(&[0, 0]);
    let hl = ((p[0] & 0xf) as usize * 4).min(p.len());
    let c = flowstack_wire::checksum::checksum(&p[..hl]);
    p[10..12].copy_from_slice(&c.to_be_bytes());
}

fn udp(payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0u8; 8 + payload.len()];
    u[8..].copy_from_slice(payload);
    UdpRepr {
        src_port: 1,
        dst_port: 2,
    }
    .emit_header(&mut u, B_IP, A_IP, payload.len(), ChecksumCaps::SOFTWARE);
    u
}

fn tcp(opts: TcpOptions) -> Vec<u8> {
    let r = TcpRepr {
        src_port: 1,
        dst_port: 2,
        seq: SeqNum(1),
        ack: SeqNum(0),
        flags: Flags::SYN,
        window: 100,
        urgent: 0,
        options: opts,
        payload: &[],
    };
    let mut t = vec![0u8; r.buffer_len()];
    r.emit(&mut t, B_IP, A_IP, ChecksumCaps::SOFTWARE);
    t
}

fn feed(frame: &[u8], counter: Counter) {
    let mut e = engine();
    e.receive(Instant::ZERO, frame);
    assert_eq!(
        e.counters().get(counter),
        1,
        "{counter:?}; counters: {:?}",
        e.counters().nonzero().collect::<Vec<_>>()
    );
}

#[test]
fn runt_ethernet_frame_counted() {
    feed(&[0u8; 13], Counter::EthInRunts);
}

#[test]
fn ihl_below_five_counted() {
    let mut p = ip(IpProtocol::Udp, &udp(b"x"));
    p[0] = 0x44;
    fix_ip_csum(&mut p);
    feed(&eth(EtherType::Ipv4, &p), Counter::IpInHdrErrors);
}

#[test]
fn header_longer_than_total_length_counted() {
    let mut p = ip(IpProtocol::Udp, &udp(b""));
    p[0] = 0x47; // 28-byte header
    p[2..4].copy_from_slice(&24u16.to_be_bytes());
    fix_ip_csum(&mut p);
    feed(&eth(EtherType::Ipv4, &p), Counter::IpInHdrErrors);
}

#[test]
fn total_length_longer_than_frame_counted() {
    let mut p = ip(IpProtocol::Udp, &udp(b"abc"));
    p[2..4].copy_from_slice(&200u16.to_be_bytes());
    fix_ip_csum(&mut p);
    feed(&eth(EtherType::Ipv4, &p), Counter::IpExtInTruncatedPkts);
}

#[test]
fn bad_ip_checksum_counted() {
    let mut p = ip(IpProtocol::Udp, &udp(b"abc"));
    p[8] = 1; // TTL changed, checksum stale
    feed(&eth(EtherType::Ipv4, &p), Counter::IpExtInCsumErrors);
}

#[test]
fn total_length_too_short_for_transport_header_counted() {
    feed(
        &eth(EtherType::Ipv4, &ip(IpProtocol::Udp, &[0u8; 4])),
        Counter::UdpInErrors,
    );
    feed(
        &eth(EtherType::Ipv4, &ip(IpProtocol::Tcp, &[0u8; 12])),
        Counter::TcpInErrs,
    );
}

#[test]
fn udp_length_below_eight_counted() {
    let mut u = udp(b"abcd");
    u[4..6].copy_from_slice(&6u16.to_be_bytes());
    feed(
        &eth(EtherType::Ipv4, &ip(IpProtocol::Udp, &u)),
        Counter::UdpInErrors,
    );
}

#[test]
fn udp_length_past_payload_counted() {
    let mut u = udp(b"abcd");
    u[4..6].copy_from_slice(&40u16.to_be_bytes());
    feed(
        &eth(EtherType::Ipv4, &ip(IpProtocol::Udp, &u)),
        Counter::UdpInErrors,
    );
}

#[test]
fn udp_bad_checksum_counted() {
    let mut u = udp(b"abcd");
    u[9] ^= 0xff;
    feed(
        &eth(EtherType::Ipv4, &ip(IpProtocol::Udp, &u)),
        Counter::UdpInCsumErrors,
    );
}

#[test]
fn tcp_data_offset_below_five_counted() {
    let mut t = tcp(TcpOptions::default());
    t[12] = 0x40;
    feed(
        &eth(EtherType::Ipv4, &ip(IpProtocol::Tcp, &t)),
        Counter::TcpInErrs,
    );
}

#[test]
fn tcp_data_offset_past_segment_counted() {
    let mut t = tcp(TcpOptions::default());
    t[12] = 0xf0;
    feed(
        &eth(EtherType::Ipv4, &ip(IpProtocol::Tcp, &t)),
        Counter::TcpInErrs,
    );
}

fn tcp_with_raw_options(opts: &[u8; 4]) -> Vec<u8> {
    let mut t = tcp(TcpOptions {
        mss: Some(1460),
        ..Default::default()
    });
    t[20..24].copy_from_slice(opts);
    t[16..18].copy_from_slice(&[0, 0]);
    let mut acc = flowstack_wire::checksum::Accumulator::new();
    acc.add_sum(flowstack_wire::checksum::pseudo_header(
        B_IP,
        A_IP,
        6,
        t.len() as u32,
    ));
    acc.add(&t);
    let c = acc.finish();
    t[16..18].copy_from_slice(&c.to_be_bytes());
    t
}

#[test]
fn tcp_option_length_zero_or_one_counted() {
    for len in [0u8, 1] {
        let t = tcp_with_raw_options(&[2, len, 5, 0xb4]);
        feed(
            &eth(EtherType::Ipv4, &ip(IpProtocol::Tcp, &t)),
            Counter::TcpExtTCPBadOptions,
        );
    }
}

#[test]
fn tcp_option_past_header_counted() {
    let t = tcp_with_raw_options(&[1, 1, 8, 10]);
    feed(
        &eth(EtherType::Ipv4, &ip(IpProtocol::Tcp, &t)),
        Counter::TcpExtTCPBadOptions,
    );
}

#[test]
fn unsolicited_arp_reply_creates_no_entry() {
    let r = arp::ArpRepr {
        operation: arp::ArpOperation::Reply,
        source_hardware_addr: PEER_MAC,
        source_protocol_addr: B_IP,
        target_hardware_addr: OUR_MAC,
        target_protocol_addr: A_IP,
    };
    let mut p = [0u8; 28];
    r.emit(&mut p);
    let mut e = engine();
    e.receive(Instant::ZERO, &eth(EtherType::Arp, &p));
    assert_eq!(e.counters().get(Counter::ArpInUnsolicited), 1);
    assert_eq!(e.arp_entries().count(), 0);
}

#[test]
fn frames_for_other_hosts_and_unknown_types_counted() {
    let mut f = eth(EtherType::Ipv4, &ip(IpProtocol::Udp, &udp(b"x")));
    f[5] = 0x77;
    feed(&f, Counter::EthInOtherHost);
    feed(
        &eth(EtherType::Unknown(0x86dd), &[0u8; 40]),
        Counter::EthInUnknownProtos,
    );
    let mut p = ip(IpProtocol::Udp, &udp(b"x"));
    p[16..20].copy_from_slice(&[10, 0, 0, 77]);
    fix_ip_csum(&mut p);
    feed(&eth(EtherType::Ipv4, &p), Counter::IpInAddrErrors);
}

#[test]
fn random_and_mutated_frames_never_panic() {
    let mut e = engine();
    let seeds = [
        eth(EtherType::Ipv4, &ip(IpProtocol::Udp, &udp(b"payload"))),
        eth(
            EtherType::Ipv4,
            &ip(
                IpProtocol::Tcp,
                &tcp(TcpOptions {
                    mss: Some(1),
                    window_scale: Some(3),
                    ..Default::default()
                }),
            ),
        ),
        eth(
            EtherType::Ipv4,
            &ip(IpProtocol::Icmp, &[8, 0, 0, 0, 0, 1, 0, 1]),
        ),
    ];
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut f = Vec::new();
    for i in 0..100_000u64 {
        f.clear();
        f.extend_from_slice(&seeds[(i % 3) as usize]);
        for _ in 0..1 + next() % 3 {
            let at = (next() as usize) % f.len();
            f[at] = next() as u8;
        }
        if next() % 4 == 0 {
            let n = (next() as usize) % (f.len() + 1);
            f.truncate(n);
        }
        e.receive(Instant::from_millis(i), &f);
        e.tx().clear();
    }
    let c = e.counters();
    assert!(c.get(Counter::IpInReceives) > 0);
    assert!(c.get(Counter::IpExtInCsumErrors) > 0);
}
