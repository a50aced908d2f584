//! Fuzzing harnesses: each takes arbitrary bytes and panics only on a bug. The `cargo fuzz`
//! targets in `fuzz/` call them, and `cargo test` replays every file of the corpora in
//! `fuzz/corpus/` through the same functions (`crates/stack/tests/fuzz_corpus.rs`), so a crash
//! found once stays a regression test.
//!
//! - [`wire_roundtrip`]: every `Packet`/`Repr` pair — whatever parses re-emits to bytes
//!   that parse to the same representation.
//! - [`engine_rx`]: an engine with a listener, a UDP socket and an established-looking
//!   state fed arbitrary frames; what it sends must itself parse, and its memory stays
//!   bounded.
//! - [`tcp_conn`]: one TCP connection driven by arbitrary segments, application calls and
//!   timer firings, with invariants checked after every step: the send sequence space is
//!   ordered, buffers stay within their sizes, received bytes are exactly the peer's stream,
//!   segments are no larger than the MSS allows.

use crate::{Engine, EngineConfig, IfaceConfig};
use flowstack_link::DeviceCaps;
use flowstack_tcp::{Connection, Counters, FourTuple, State, TcpConfig};
use flowstack_wire::ethernet::{self, EthernetRepr};
use flowstack_wire::icmpv4::{self, Icmpv4Repr};
use flowstack_wire::ipv4::{self, IpProtocol, Ipv4Repr};
use flowstack_wire::tcp::{self as wtcp, Flags, SackBlock, TcpOptions, TcpRepr};
use flowstack_wire::udp::{self as wudp, UdpRepr};
use flowstack_wire::{arp, ChecksumCaps, Duration, EthernetAddress, Instant, Ipv4Address};
use flowstack_wire::{Ipv4Cidr, SeqNum};

/// A cursor over fuzz input that yields zeros once exhausted (so every input decodes).
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

const A: Ipv4Address = Ipv4Address::new(10, 0, 0, 1);
const B: Ipv4Address = Ipv4Address::new(10, 0, 0, 2);

/// Parses `data` as the protocol its first byte selects; if it parses, emits the
/// representation and checks that the bytes parse back to the same thing.
pub fn wire_roundtrip(data: &[u8]) {
    let Some((&sel, b)) = data.split_first() else {
        return;
    };
    let caps = if sel & 0x80 != 0 {
        ChecksumCaps::SOFTWARE
    } else {
        ChecksumCaps::OFFLOADED
    };
    match sel % 6 {
        0 => {
            if let Ok(f) = ethernet::Frame::new_checked(b) {
                let r = EthernetRepr::parse(&f).expect("checked frame parses");
                let mut out = [0u8; ethernet::HEADER_LEN];
                r.emit(&mut out);
                let f2 = ethernet::Frame::new_checked(&out[..]).unwrap();
                assert_eq!(EthernetRepr::parse(&f2).unwrap(), r);
            }
        }
        1 => {
            if let Ok(r) = arp::Packet::new_checked(b).and_then(|p| arp::ArpRepr::parse(&p)) {
                let mut out = vec![0u8; r.buffer_len()];
                r.emit(&mut out);
                let p = arp::Packet::new_checked(&out[..]).unwrap();
                assert_eq!(arp::ArpRepr::parse(&p).unwrap(), r);
            }
        }
        2 => {
            let Ok(p) = ipv4::Packet::new_checked(b) else {
                return;
            };
            if let Ok(r) = Ipv4Repr::parse(&p, caps) {
                assert_eq!(r.payload_len, p.payload().len());
                let mut out = vec![0u8; r.buffer_len() + r.payload_len];
                r.emit(&mut out, ChecksumCaps::SOFTWARE);
                out[r.buffer_len()..].copy_from_slice(p.payload());
                let p2 = ipv4::Packet::new_checked(&out[..]).unwrap();
                assert_eq!(Ipv4Repr::parse(&p2, ChecksumCaps::SOFTWARE).unwrap(), r);
            }
        }
        3 => {
            let Ok(p) = icmpv4::Packet::new_checked(b) else {
                return;
            };
            if let Ok(r) = Icmpv4Repr::parse(&p, caps) {
                let mut out = vec![0u8; r.buffer_len()];
                r.emit(&mut out, ChecksumCaps::SOFTWARE);
                let p2 = icmpv4::Packet::new_checked(&out[..]).unwrap();
                assert_eq!(Icmpv4Repr::parse(&p2, ChecksumCaps::SOFTWARE).unwrap(), r);
            }
        }
        4 => {
            let Ok(p) = wudp::Packet::new_checked(b) else {
                return;
            };
            if let Ok(r) = UdpRepr::parse(&p, A, B, caps) {
                let pl = p.payload();
                let mut out = vec![0u8; wudp::HEADER_LEN + pl.len()];
                out[wudp::HEADER_LEN..].copy_from_slice(pl);
                r.emit_header(&mut out, A, B, pl.len(), ChecksumCaps::SOFTWARE);
                let p2 = wudp::Packet::new_checked(&out[..]).unwrap();
                assert_eq!(
                    UdpRepr::parse(&p2, A, B, ChecksumCaps::SOFTWARE).unwrap(),
                    r
                );
                assert_eq!(p2.payload(), pl);
            }
        }
        _ => {
            let Ok(p) = wtcp::Packet::new_checked(b) else {
                return;
            };
            if let Ok(r) = TcpRepr::parse(&p, A, B, caps) {
                let mut out = vec![0u8; r.buffer_len()];
                r.emit(&mut out, A, B, ChecksumCaps::SOFTWARE);
                let p2 = wtcp::Packet::new_checked(&out[..]).unwrap();
                let r2 = TcpRepr::parse(&p2, A, B, ChecksumCaps::SOFTWARE).unwrap();
                // SACK blocks that do not fit beside the other options are left out on emit.
                let mut expect = r;
                expect.options.sack_len = r2.options.sack_len.min(r.options.sack_len);
                assert_eq!(r2, expect);
            }
        }
    }
}

fn fuzz_engine() -> Engine {
    let mac = EthernetAddress([2, 0, 0, 0, 0, 1]);
    let mut cfg = EngineConfig::new(IfaceConfig::new(mac, Ipv4Cidr::new(A, 24)));
    cfg.secret = Some([7; 16]);
    cfg.reasm.max_bytes = 64 * 1024;
    cfg.iface.arp.max_entries = 32;
    cfg.tcp.max_connections = 64;
    cfg.tcp.syn_backlog = 8;
    Engine::new(cfg, DeviceCaps::ETHERNET)
}

/// Feeds an engine arbitrary frames (each a length byte pair then that many bytes), with
/// time moving by the input; everything the engine sends must parse as a valid frame.
pub fn engine_rx(data: &[u8]) {
    let mut e = fuzz_engine();
    let listener = e.tcp_listen(80, 8).unwrap();
    let udp = e.udp_bind(53).unwrap();
    let mut b = Bytes(data);
    let mut now = Instant::from_millis(1);
    let mut buf = [0u8; 2048];
    while !b.is_empty() {
        let len = (b.u16() & 0x7ff) as usize;
        now += Duration::from_millis(b.u8() as u64 * 10);
        let frame = b.take(len).to_vec();
        e.receive(now, &frame);
        e.on_timers(now);
        e.dispatch(now);
        for f in e.tx().iter() {
            check_frame(f);
        }
        e.tx().clear();
        if let Ok(h) = e.tcp_accept(listener) {
            let _ = e.tcp_send(h, b"hello");
            let _ = e.tcp_recv(h, &mut buf);
        }
        let _ = e.udp_recv_from(udp, &mut buf);
        assert!(e.reassembly_memory() <= 64 * 1024);
        assert!(e.arp_entries().count() <= 32);
        assert!(e.tcp_iter().count() <= 64);
    }
}

/// A frame the engine emitted parses at every layer.
fn check_frame(f: &[u8]) {
    let eth = ethernet::Frame::new_checked(f).expect("own frame: ethernet");
    let r = EthernetRepr::parse(&eth).unwrap();
    match r.ethertype {
        flowstack_wire::EtherType::Arp => {
            arp::Packet::new_checked(eth.payload())
                .and_then(|p| arp::ArpRepr::parse(&p))
                .expect("own frame: ARP");
        }
        flowstack_wire::EtherType::Ipv4 => {
            let p = ipv4::Packet::new_checked(eth.payload()).expect("own frame: IPv4");
            let ip = Ipv4Repr::parse(&p, ChecksumCaps::SOFTWARE).expect("own frame: IPv4 repr");
            if ip.is_fragment() {
                return;
            }
            match ip.protocol {
                IpProtocol::Tcp => {
                    let t = wtcp::Packet::new_checked(p.payload()).expect("own frame: TCP");
                    TcpRepr::parse(&t, ip.src, ip.dst, ChecksumCaps::SOFTWARE)
                        .expect("own frame: TCP repr");
                }
                IpProtocol::Icmp => {
                    let i = icmpv4::Packet::new_checked(p.payload()).expect("own frame: ICMP");
                    Icmpv4Repr::parse(&i, ChecksumCaps::SOFTWARE).expect("own frame: ICMP repr");
                }
                IpProtocol::Udp => {
                    let u = wudp::Packet::new_checked(p.payload()).expect("own frame: UDP");
                    UdpRepr::parse(&u, ip.src, ip.dst, ChecksumCaps::SOFTWARE)
                        .expect("own frame: UDP repr");
                }
                IpProtocol::Unknown(_) => panic!("own frame: unknown protocol"),
            }
        }
        flowstack_wire::EtherType::Unknown(_) => panic!("own frame: unknown ethertype"),
    }
}

/// The byte at offset `i` of the peer's stream (position-dependent, so misplaced data shows).
fn peer_byte(i: u32) -> u8 {
    (i.wrapping_mul(2_654_435_761) >> 24) as u8 ^ i as u8
}

const PEER_ISN: u32 = 0x8000_0000;

/// Drives one passive connection with arbitrary segments (relative to its sequence space),
/// application calls and timers, checking invariants after each step.
pub fn tcp_conn(data: &[u8]) {
    let mut b = Bytes(data);
    let cfg = TcpConfig {
        send_buffer: 16 * 1024,
        recv_buffer: 8 * 1024,
        max_tso_segment: if b.u8() & 1 == 1 { 16 * 1024 } else { 0 },
        ..TcpConfig::default()
    };
    let tuple = FourTuple {
        local_ip: A,
        local_port: 80,
        remote_ip: B,
        remote_port: 4000,
    };
    let mut now = Instant::from_millis(1000);
    let syn_opts = options(&mut b);
    let mut syn = peer_seg(SeqNum(PEER_ISN), SeqNum(0), Flags::SYN, &[]);
    syn.options = syn_opts;
    syn.options.sack_len = 0;
    let mut c = Connection::accept(cfg, tuple, &syn, SeqNum(1), now, None);
    let mut ctr = Counters::default();
    // Everything the application has read, as stream offsets of the peer's data.
    let mut read = 0u32;
    let mut scratch = [0u8; 4096];
    let mut payload = [0u8; 3000];
    let mut sent_by_app = 0usize;
    while !b.is_empty() {
        match b.u8() % 8 {
            0..=3 => {
                // A segment from the peer, placed relative to RCV.NXT and SND.UNA.
                let flags = Flags(b.u8());
                let seq_off = b.u16() as i16 as i32;
                let ack_off = b.u16() as i16 as i32;
                let len = (b.u16() % 3000) as usize;
                let window = b.u16();
                let mut opts = options(&mut b);
                let seq = SeqNum(c.recv_next().0.wrapping_add(seq_off as u32));
                let ack = SeqNum(c.send_seq().0 .0.wrapping_add(ack_off as u32));
                let off = seq.0.wrapping_sub(PEER_ISN + 1);
                for (k, p) in payload[..len].iter_mut().enumerate() {
                    *p = peer_byte(off.wrapping_add(k as u32));
                }
                for blk in opts.sack.iter_mut() {
                    blk.left = SeqNum(c.send_seq().0 .0.wrapping_add(blk.left.0 & 0xffff));
                    blk.right = SeqNum(blk.left.0.wrapping_add(blk.right.0 & 0x3fff));
                }
                let mut s = peer_seg(seq, ack, flags, &payload[..len]);
                s.window = window;
                s.options = opts;
                s.urgent = b.u16();
                c.on_segment(now, &s, &mut ctr);
            }
            4 => {
                let n = (b.u16() % 5000) as usize;
                let chunk = vec![0xab; n];
                if let Ok(k) = c.send(&chunk) {
                    sent_by_app += k;
                }
            }
            5 => {
                let n = (b.u16() as usize % scratch.len()) + 1;
                if let Ok(k) = c.recv(&mut scratch[..n]) {
                    for (j, &x) in scratch[..k].iter().enumerate() {
                        assert_eq!(
                            x,
                            peer_byte(read.wrapping_add(j as u32)),
                            "stream byte {} misplaced",
                            read as usize + j
                        );
                    }
                    read = read.wrapping_add(k as u32);
                }
            }
            6 => {
                now += Duration::from_millis(b.u16() as u64 * 4);
                if c.poll_at().is_due(now) {
                    c.on_timeout(now, &mut ctr);
                }
            }
            _ => match b.u8() % 4 {
                0 => c.shutdown_write(),
                1 => c.close(now),
                2 => c.abort(now),
                _ => c.set_nodelay(b.u8() & 1 == 1),
            },
        }
        // RFC 4821 §7.5: a PLPMTUD probe is larger than the current MSS, but never above
        // search_high (itself at most the size the connection started the search at).
        let mss = c.mss();
        let search_high = c.mtu_search().map_or(0, |(_, high)| high);
        assert!(search_high <= cfg.mss as usize, "search_high above our MSS");
        let max_seg = mss.max(search_high).max(cfg.max_tso_segment);
        let (una, max) = c.send_seq();
        c.poll_transmit(now, &mut ctr, &mut |r| {
            assert!(
                r.payload.len() <= max_seg,
                "segment of {} > {max_seg}",
                r.payload.len()
            );
            if !r.flags.rst() && !r.payload.is_empty() {
                assert!(una <= r.seq, "data below SND.UNA");
            }
        });
        check_invariants(&c, &cfg, sent_by_app);
        let (una2, max2) = c.send_seq();
        assert!(
            una2 >= una || c.state() == State::Closed,
            "SND.UNA went back"
        );
        assert!(
            max2 >= max || c.state() == State::Closed,
            "SND.MAX went back"
        );
    }
}

fn check_invariants(c: &Connection, cfg: &TcpConfig, sent_by_app: usize) {
    let (una, max) = c.send_seq();
    assert!(una <= max, "SND.UNA {una:?} beyond SND.MAX {max:?}");
    assert!(
        c.send_queue() <= cfg.send_buffer,
        "send queue over its buffer"
    );
    assert!(
        c.send_queue() <= sent_by_app,
        "more queued than the application sent"
    );
    assert!(
        c.recv_queue() <= cfg.recv_buffer,
        "receive queue over its buffer"
    );
    assert!(c.mss() >= flowstack_tcp::MIN_MSS && c.mss() <= cfg.mss as usize);
    assert!(c.cwnd() >= c.mss(), "cwnd {} below one MSS", c.cwnd());
}

fn options(b: &mut Bytes) -> TcpOptions {
    let k = b.u8();
    let mut o = TcpOptions::default();
    if k & 1 != 0 {
        o.mss = Some(b.u16());
    }
    if k & 2 != 0 {
        o.window_scale = Some(b.u8());
    }
    o.sack_permitted = k & 4 != 0;
    if k & 8 != 0 {
        o.timestamp = Some((b.u32(), b.u32()));
    }
    let n = ((k >> 4) & 3) as usize;
    for i in 0..n {
        o.sack[i] = SackBlock {
            left: SeqNum(b.u16() as u32),
            right: SeqNum(b.u16() as u32),
        };
    }
    o.sack_len = n as u8;
    o
}

fn peer_seg(seq: SeqNum, ack: SeqNum, flags: Flags, payload: &[u8]) -> TcpRepr<'_> {
    TcpRepr {
        src_port: 4000,
        dst_port: 80,
        seq,
        ack,
        flags,
        window: 65535,
        urgent: 0,
        options: TcpOptions::default(),
        payload,
    }
}
