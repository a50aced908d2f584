//! What a device says of a received frame ([`RxMeta`]): a frame marked `l4_csum_ok` (a packet
//! the local kernel built with checksum offload, handed over by a TAP or packet socket with
//! its TCP/UDP checksum holding only the pseudo-header sum) is accepted without verification;
//! the same bytes without the mark are a checksum error, and the IPv4 header checksum, ICMP and
//! reassembled datagrams are verified whatever the mark says.

use flowstack_link::{DeviceCaps, RxMeta};
use flowstack_stack::{Counter, Engine, EngineConfig, IfaceConfig};
use flowstack_wire::checksum::pseudo_header;
use flowstack_wire::ethernet::EthernetRepr;
use flowstack_wire::ipv4::{IpProtocol, Ipv4Repr};
use flowstack_wire::{ChecksumCaps, EtherType, EthernetAddress, Instant, Ipv4Address, Ipv4Cidr};

const OUR_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0xa]);
const PEER_MAC: EthernetAddress = EthernetAddress([0x02, 0, 0, 0, 0, 0xb]);
const US: Ipv4Address = Ipv4Address([10, 9, 0, 1]);
const PEER: Ipv4Address = Ipv4Address([10, 9, 0, 2]);
const TRUSTED: RxMeta = RxMeta { l4_csum_ok: true };

fn engine() -> Engine {
    Engine::new(
        EngineConfig::new(IfaceConfig::new(OUR_MAC, Ipv4Cidr::new(US, 24))),
        DeviceCaps::ETHERNET,
    )
}

/// An Ethernet frame around the IPv4 packet `ip`.
fn eth(ip: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + ip.len()];
    EthernetRepr {
        src: PEER_MAC,
        dst: OUR_MAC,
        ethertype: EtherType::Ipv4,
    }
    .emit(&mut f);
    f[14..].copy_from_slice(ip);
    f
}

/// An IPv4 packet from the peer to us carrying `l4`.
fn ip(proto: IpProtocol, l4: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 20 + l4.len()];
    Ipv4Repr::new(PEER, US, proto, l4.len()).emit(&mut p, ChecksumCaps::SOFTWARE);
    p[20..].copy_from_slice(l4);
    p
}

fn fix_ip_csum(p: &mut [u8]) {
    p[10..12].copy_from_slice(&[0, 0]);
    let c = flowstack_wire::checksum::checksum(&p[..20]);
    p[10..12].copy_from_slice(&c.to_be_bytes());
}

/// A UDP datagram to `port` whose checksum field holds only the pseudo-header sum, as the
/// kernel hands over a locally built packet with checksum offload (CHECKSUM_PARTIAL).
fn partial_udp(port: u16, payload: &[u8]) -> Vec<u8> {
    let len = 8 + payload.len();
    let mut u = vec![0u8; len];
    u[0..2].copy_from_slice(&4000u16.to_be_bytes());
    u[2..4].copy_from_slice(&port.to_be_bytes());
    u[4..6].copy_from_slice(&(len as u16).to_be_bytes());
    u[6..8].copy_from_slice(&pseudo_header(PEER, US, 17, len as u32).to_be_bytes());
    u[8..].copy_from_slice(payload);
    u
}

/// A TCP SYN to `port` with a partial checksum.
fn partial_syn(port: u16) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&4001u16.to_be_bytes());
    t[2..4].copy_from_slice(&port.to_be_bytes());
    t[4..8].copy_from_slice(&1000u32.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = 0x02; // SYN
    t[14..16].copy_from_slice(&65535u16.to_be_bytes());
    t[16..18].copy_from_slice(&pseudo_header(PEER, US, 6, 20).to_be_bytes());
    t
}

#[test]
fn a_trusted_partial_udp_checksum_is_delivered_and_an_untrusted_one_is_an_error() {
    let frame = eth(&ip(IpProtocol::Udp, &partial_udp(7000, b"offloaded")));

    let mut e = engine();
    let h = e.udp_bind(7000).unwrap();
    e.receive(Instant::ZERO, &frame);
    assert_eq!(e.counters().get(Counter::UdpInCsumErrors), 1);
    assert!(!e.udp_readable(h));

    e.receive_meta(Instant::ZERO, &frame, TRUSTED);
    assert_eq!(e.counters().get(Counter::UdpInCsumErrors), 1);
    assert_eq!(e.counters().get(Counter::UdpInDatagrams), 1);
    let mut buf = [0u8; 64];
    let (n, from) = e.udp_recv_from(h, &mut buf).unwrap();
    assert_eq!(&buf[..n], b"offloaded");
    assert_eq!(from.port(), 4000);

    // The mark lasts one frame: the same bytes again, unmarked, are an error again.
    e.receive(Instant::ZERO, &frame);
    assert_eq!(e.counters().get(Counter::UdpInCsumErrors), 2);
}

#[test]
fn a_trusted_partial_tcp_checksum_reaches_the_listener() {
    let frame = eth(&ip(IpProtocol::Tcp, &partial_syn(80)));
    for (meta, csum_errors) in [(RxMeta::default(), 1), (TRUSTED, 0)] {
        let mut e = engine();
        e.tcp_listen(80, 8).unwrap();
        e.receive_meta(Instant::ZERO, &frame, meta);
        assert_eq!(
            e.counters().get(Counter::TcpInCsumErrors),
            csum_errors,
            "{meta:?}"
        );
        // A SYN that got through is answered (SYN-ACK, after resolving the peer).
        assert_eq!(
            e.counters().get(Counter::TcpInSegs) - e.counters().get(Counter::TcpInErrs),
            1 - csum_errors,
            "{meta:?}: {:?}",
            e.counters().nonzero().collect::<Vec<_>>()
        );
    }
}

#[test]
fn the_ip_header_checksum_is_verified_whatever_the_mark() {
    let mut p = ip(IpProtocol::Udp, &partial_udp(7000, b"x"));
    p[8] = 1; // TTL changed, header checksum stale
    let mut e = engine();
    e.udp_bind(7000).unwrap();
    e.receive_meta(Instant::ZERO, &eth(&p), TRUSTED);
    assert_eq!(e.counters().get(Counter::IpExtInCsumErrors), 1);
    assert_eq!(e.counters().get(Counter::UdpInDatagrams), 0);
}

#[test]
fn a_reassembled_datagram_is_verified_whatever_its_fragments_said() {
    // One UDP datagram (partial checksum: wrong as a full checksum) in two fragments.
    let udp = partial_udp(7000, &[0x5a; 40]);
    let whole = ip(IpProtocol::Udp, &udp);
    let (head, tail) = udp.split_at(24);
    let mut f1 = whole[..20].to_vec();
    f1.extend_from_slice(head);
    f1[2..4].copy_from_slice(&(20 + head.len() as u16).to_be_bytes());
    f1[6..8].copy_from_slice(&0x2000u16.to_be_bytes()); // MF, offset 0
    fix_ip_csum(&mut f1);
    let mut f2 = whole[..20].to_vec();
    f2.extend_from_slice(tail);
    f2[2..4].copy_from_slice(&(20 + tail.len() as u16).to_be_bytes());
    f2[6..8].copy_from_slice(&((head.len() / 8) as u16).to_be_bytes()); // offset 3 (24 B)
    fix_ip_csum(&mut f2);

    let mut e = engine();
    let h = e.udp_bind(7000).unwrap();
    e.receive_meta(Instant::ZERO, &eth(&f1), TRUSTED);
    e.receive_meta(Instant::ZERO, &eth(&f2), TRUSTED);
    assert_eq!(e.counters().get(Counter::IpReasmOKs), 1);
    assert_eq!(e.counters().get(Counter::UdpInCsumErrors), 1);
    assert!(!e.udp_readable(h));
}
