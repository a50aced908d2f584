//! Hostile input: random bytes and mutations of valid packets never make a parser panic, and
//! whatever a parser accepts re-emits to something it accepts again with the same meaning.

use flowstack_wire::{arp, ethernet, icmpv4, ipv4, tcp, udp, ChecksumCaps, Ipv4Address, SeqNum};

const CASES: usize = 100_000;
const A: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
const B: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // splitmix64
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Produces case `i`: even cases are random bytes, odd ones mutate a valid seed.
fn case(rng: &mut Rng, seed: &[u8], out: &mut Vec<u8>) {
    out.clear();
    if rng.next().is_multiple_of(2) {
        let len = rng.below(128);
        out.extend((0..len).map(|_| rng.next() as u8));
        return;
    }
    out.extend_from_slice(seed);
    for _ in 0..1 + rng.below(4) {
        match rng.below(5) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = rng.next() as u8;
            }
            2 => {
                let n = rng.below(out.len() + 1);
                out.truncate(n);
            }
            3 => {
                let n = rng.below(16);
                out.extend((0..n).map(|_| rng.next() as u8));
            }
            _ if out.len() > 13 => {
                // Hit the length/offset bytes most parsers read.
                let i = rng.below(14);
                out[i] = [0, 1, 4, 5, 0xff, 0x0f, 0xf0][rng.below(7)];
            }
            _ => {}
        }
    }
}

fn run(seed: &[u8], salt: u64, mut f: impl FnMut(&[u8]) -> bool) {
    let mut rng = Rng(salt);
    let mut buf = Vec::with_capacity(256);
    let mut accepted = 0;
    for _ in 0..CASES {
        case(&mut rng, seed, &mut buf);
        accepted += f(&buf) as usize;
    }
    // The mutations must leave some inputs valid, or the test exercises nothing past the checks.
    assert!(accepted > 0, "no case was accepted");
}

#[test]
fn ethernet_never_panics() {
    let mut seed = [0u8; 60];
    seed[12] = 8;
    run(&seed, 1, |b| match ethernet::Frame::new_checked(b) {
        Ok(f) => {
            let r = ethernet::EthernetRepr::parse(&f).unwrap();
            let mut o = [0u8; 14];
            r.emit(&mut o);
            assert_eq!(&o[..], &b[..14]);
            assert_eq!(f.payload().len(), b.len() - 14);
            true
        }
        Err(_) => false,
    });
}

#[test]
fn arp_never_panics() {
    let r = arp::ArpRepr {
        operation: arp::ArpOperation::Request,
        source_hardware_addr: flowstack_wire::EthernetAddress([2, 0, 0, 0, 0, 1]),
        source_protocol_addr: A,
        target_hardware_addr: Default::default(),
        target_protocol_addr: B,
    };
    let mut seed = [0u8; 28];
    r.emit(&mut seed);
    run(&seed, 2, |b| {
        let Ok(p) = arp::Packet::new_checked(b) else {
            return false;
        };
        match arp::ArpRepr::parse(&p) {
            Ok(r) => {
                let mut o = [0u8; 28];
                r.emit(&mut o);
                assert_eq!(&o[..], &b[..28]);
                true
            }
            Err(_) => false,
        }
    });
}

#[test]
fn ipv4_never_panics() {
    let r = ipv4::Ipv4Repr::new(A, B, ipv4::IpProtocol::Udp, 12);
    let mut seed = [0u8; 32];
    r.emit(&mut seed, ChecksumCaps::SOFTWARE);
    for caps in [ChecksumCaps::SOFTWARE, ChecksumCaps::OFFLOADED] {
        run(&seed, 3, |b| {
            let Ok(p) = ipv4::Packet::new_checked(b) else {
                return false;
            };
            assert!(p.header_len() >= 20 && p.header_len() <= p.total_len());
            assert!(p.total_len() <= b.len());
            match ipv4::Ipv4Repr::parse(&p, caps) {
                Ok(r) => {
                    assert_eq!(r.payload_len, p.payload().len());
                    let mut o = [0u8; 20];
                    r.emit(&mut o, ChecksumCaps::SOFTWARE);
                    let again = ipv4::Ipv4Repr::parse(
                        &ipv4::Packet::new_unchecked(&o[..]),
                        ChecksumCaps::SOFTWARE,
                    );
                    // Re-emitting drops options, so only the header fields must survive.
                    let again = again.map(|a| (a.src, a.dst, a.protocol, a.ttl, a.frag_offset));
                    assert_eq!(again, Ok((r.src, r.dst, r.protocol, r.ttl, r.frag_offset)));
                    true
                }
                Err(_) => false,
            }
        });
    }
}

#[test]
fn icmp_never_panics() {
    let r = icmpv4::Icmpv4Repr::EchoRequest {
        ident: 1,
        seq_no: 2,
        data: b"0123456789",
    };
    let mut seed = vec![0u8; r.buffer_len()];
    r.emit(&mut seed, ChecksumCaps::SOFTWARE);
    run(&seed, 4, |b| {
        let Ok(p) = icmpv4::Packet::new_checked(b) else {
            return false;
        };
        match icmpv4::Icmpv4Repr::parse(&p, ChecksumCaps::SOFTWARE) {
            Ok(r) => {
                let mut o = vec![0u8; r.buffer_len()];
                r.emit(&mut o, ChecksumCaps::SOFTWARE);
                let p2 = icmpv4::Packet::new_checked(&o[..]).unwrap();
                assert_eq!(
                    icmpv4::Icmpv4Repr::parse(&p2, ChecksumCaps::SOFTWARE),
                    Ok(r)
                );
                true
            }
            Err(_) => false,
        }
    });
}

#[test]
fn udp_never_panics() {
    let mut seed = vec![0u8; 20];
    udp::UdpRepr {
        src_port: 5,
        dst_port: 7,
    }
    .emit_header(&mut seed, A, B, 12, ChecksumCaps::SOFTWARE);
    for caps in [ChecksumCaps::SOFTWARE, ChecksumCaps::OFFLOADED] {
        run(&seed, 5, |b| {
            let Ok(p) = udp::Packet::new_checked(b) else {
                return false;
            };
            assert!(p.len() >= 8 && p.len() <= b.len());
            assert_eq!(p.payload().len(), p.len() - 8);
            udp::UdpRepr::parse(&p, A, B, caps).is_ok()
        });
    }
}

#[test]
fn tcp_never_panics() {
    let mut opts = tcp::TcpOptions {
        mss: Some(1460),
        window_scale: Some(7),
        sack_permitted: true,
        timestamp: Some((9, 8)),
        ..Default::default()
    };
    opts.sack[0] = tcp::SackBlock {
        left: SeqNum(1),
        right: SeqNum(9),
    };
    opts.sack_len = 1;
    let r = tcp::TcpRepr {
        src_port: 1,
        dst_port: 2,
        seq: SeqNum(3),
        ack: SeqNum(4),
        flags: tcp::Flags::ACK,
        window: 5,
        urgent: 0,
        options: opts,
        payload: b"data",
    };
    let mut seed = vec![0u8; r.buffer_len()];
    r.emit(&mut seed, A, B, ChecksumCaps::SOFTWARE);
    for caps in [ChecksumCaps::SOFTWARE, ChecksumCaps::OFFLOADED] {
        run(&seed, 6, |b| {
            let Ok(p) = tcp::Packet::new_checked(b) else {
                return false;
            };
            assert!(p.header_len() >= 20 && p.header_len() <= b.len());
            match tcp::TcpRepr::parse(&p, A, B, caps) {
                Ok(r) => {
                    let mut o = vec![0u8; r.buffer_len()];
                    r.emit(&mut o, A, B, ChecksumCaps::SOFTWARE);
                    let p2 = tcp::Packet::new_checked(&o[..]).unwrap();
                    let r2 = tcp::TcpRepr::parse(&p2, A, B, ChecksumCaps::SOFTWARE).unwrap();
                    assert_eq!(
                        (r2.seq, r2.ack, r2.flags, r2.payload),
                        (r.seq, r.ack, r.flags, r.payload)
                    );
                    assert_eq!(r2.options.mss, r.options.mss);
                    assert_eq!(r2.options.timestamp, r.options.timestamp);
                    true
                }
                Err(_) => false,
            }
        });
    }
}
