//! UDP sockets of `flowstack_client::posix` over a daemon (what the shim's `SOCK_DGRAM`
//! sockets use): "processes" are separate `Posix` instances. Byte-exact datagrams (sizes up
//! to 65507, enough to wrap the transmit and receive areas), sources, readiness on the
//! placeholder, MSG_TRUNC/MSG_PEEK/FIONREAD, the UDP port namespace, connected filtering,
//! and datagrams between applications on two engine threads. Every wait is bounded.

mod common;

use common::{daemon, lo};
use flowstack_client::posix::{Errno, Posix, RecvFlags, SockId, Type};
use flowstack_sys::placeholder::wait_a;
use std::net::SocketAddrV4;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

const T: Option<Duration> = Some(common::T);
const BLOCK: RecvFlags = RecvFlags::BLOCK;
const NONBLOCK: RecvFlags = RecvFlags::NONBLOCK;
const PEEK: RecvFlags = RecvFlags::PEEK;

fn bound(p: &Posix) -> (OwnedFd, SockId, SocketAddrV4) {
    let (a, id) = p.socket(Type::Dgram).unwrap();
    let port = p.bind(id, lo(0)).unwrap();
    assert_eq!(p.local_addr(id).unwrap(), lo(port));
    (a, id, lo(port))
}

fn datagram(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + seed * 13) as u8).collect()
}

/// `n` datagrams of growing sizes one way, echoed back, every byte and source checked.
fn exchange(a: &Posix, b: &Posix, n: usize) {
    let (fa, ida, addr_a) = bound(a);
    let (fb, idb, addr_b) = bound(b);
    let _ = &fa;
    assert!(a.carries_dgram(ida, addr_b).unwrap());
    let mut buf = vec![0u8; 70_000];
    for i in 0..n {
        let len = [0, 1, 1472, 1473, 30_000, 65_507][i % 6];
        let d = datagram(i, len);
        assert_eq!(a.send_to(ida, &d, Some(addr_b), false, T).unwrap(), len);
        // Readable on the placeholder, as poll(2) sees it.
        let (r, _, _) = wait_a(fb.as_fd(), true, false, T.unwrap()).unwrap();
        assert!(r, "readable after a datagram");
        let (got, src) = b.recv_from(idb, &mut buf, BLOCK, T).unwrap();
        assert_eq!((got, src), (len, Some(addr_a)));
        assert!(buf[..len] == d[..], "datagram {i} of {len} bytes differs");
        assert_eq!(b.send_to(idb, &buf[..len], src, false, T).unwrap(), len);
        let (got, src) = a.recv_from(ida, &mut buf, BLOCK, T).unwrap();
        assert_eq!((got, src), (len, Some(addr_b)));
        assert!(buf[..len] == d[..]);
    }
    assert_eq!(
        b.recv_from(idb, &mut buf, NONBLOCK, None),
        Err(Errno::EAGAIN)
    );
}

#[test]
fn datagrams_keep_their_bytes_and_sources_across_both_areas_wrap() {
    let d = daemon("udp-pair", 1, false);
    let (a, b) = (
        Posix::attach(&d.path).unwrap(),
        Posix::attach(&d.path).unwrap(),
    );
    // 120 datagrams, 20 of 65507 bytes: several times round the 2 MiB areas.
    exchange(&a, &b, 120);
}

#[test]
fn datagrams_cross_engine_threads() {
    let d = daemon("udp-engines", 2, true);
    let (a, b) = (
        Posix::attach(&d.path).unwrap(),
        Posix::attach(&d.path).unwrap(),
    );
    let s = flowstack_offload::stats::query(&d.path).unwrap();
    let engine = |p: &Posix| {
        let id = p.app_id().unwrap();
        s.apps.iter().find(|x| x.id == id).unwrap().engine
    };
    assert_ne!(engine(&a), engine(&b), "spread over two engines");
    exchange(&a, &b, 12);
}

#[test]
fn truncation_peek_and_fionread() {
    let d = daemon("udp-trunc", 1, false);
    let (a, b) = (
        Posix::attach(&d.path).unwrap(),
        Posix::attach(&d.path).unwrap(),
    );
    let (_fa, ida, addr_a) = bound(&a);
    let (fb, idb, addr_b) = bound(&b);
    let (d1, d2) = (datagram(1, 100), datagram(2, 40));
    a.send_to(ida, &d1, Some(addr_b), false, T).unwrap();
    a.send_to(ida, &d2, Some(addr_b), false, T).unwrap();
    wait_a(fb.as_fd(), true, false, T.unwrap()).unwrap();
    assert_eq!(
        b.readable_bytes(idb).unwrap(),
        100,
        "the next datagram's size"
    );
    let mut small = [0u8; 10];
    // Peek: its start, its full length; it stays.
    assert_eq!(
        b.recv_from(idb, &mut small, PEEK, None).unwrap(),
        (100, Some(addr_a))
    );
    assert_eq!(small[..], d1[..10]);
    // A short buffer: its start, its full length (the caller's MSG_TRUNC); the rest is gone.
    let mut tiny = [0u8; 3];
    assert_eq!(
        b.recv_from(idb, &mut tiny, BLOCK, T).unwrap(),
        (100, Some(addr_a))
    );
    assert_eq!(tiny[..], d1[..3]);
    // The next datagram is the second one, whole.
    assert_eq!(b.recv_from(idb, &mut tiny, PEEK, T).unwrap().0, 40);
    assert_eq!(b.readable_bytes(idb).unwrap(), 40);
    let mut buf = [0u8; 100];
    assert_eq!(
        b.recv_from(idb, &mut buf, BLOCK, T).unwrap(),
        (40, Some(addr_a))
    );
    assert_eq!(buf[..40], d2[..]);
    assert_eq!(b.readable_bytes(idb).unwrap(), 0);
    // Sizes and destinations refused as Linux does.
    let big = vec![0u8; 65_508];
    assert_eq!(a.send_to(ida, &big, Some(addr_b), false, T), Err(Errno(90)));
    assert_eq!(a.send_to(ida, b"x", None, false, T), Err(Errno(89)));
}

#[test]
fn udp_ports_are_one_namespace_across_applications() {
    let d = daemon("udp-inuse", 1, false);
    let (a, b) = (
        Posix::attach(&d.path).unwrap(),
        Posix::attach(&d.path).unwrap(),
    );
    let (_fa, _ida, addr_a) = bound(&a);
    let (_fb, idb) = b.socket(Type::Dgram).unwrap();
    assert_eq!(b.bind(idb, addr_a), Err(Errno::EADDRINUSE));
    let any = SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, addr_a.port());
    assert_eq!(b.bind(idb, any), Err(Errno::EADDRINUSE));
    // TCP's port of the same number is another port.
    let (_ft, idt) = b.socket(Type::Stream).unwrap();
    assert_eq!(b.bind(idt, addr_a).unwrap(), addr_a.port());
    // A port nobody holds is no flowstack destination (the shim moves such a socket to
    // the kernel); the held one is.
    assert!(!b.carries_dgram(idb, lo(1)).unwrap());
    assert!(b.carries_dgram(idb, addr_a).unwrap());
}

#[test]
fn a_connected_socket_hears_only_its_peer() {
    let d = daemon("udp-conn", 1, false);
    let p = Posix::attach(&d.path).unwrap();
    let (_fr, r, addr_r) = bound(&p);
    let (_fa, a, addr_a) = bound(&p);
    let (_fb, b, addr_b) = bound(&p);
    p.connect(r, addr_a, false, T).unwrap();
    assert_eq!(p.peer_addr(r).unwrap(), addr_a);
    p.send_to(b, b"from b", Some(addr_r), false, T).unwrap();
    p.send_to(a, b"from a", Some(addr_r), false, T).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(
        p.recv_from(r, &mut buf, BLOCK, T).unwrap(),
        (6, Some(addr_a))
    );
    assert_eq!(&buf[..6], b"from a");
    // send without a destination goes to the peer.
    p.send_to(r, b"reply", None, false, T).unwrap();
    assert_eq!(
        p.recv_from(a, &mut buf, BLOCK, T).unwrap(),
        (5, Some(addr_r))
    );
    // Dissolved (AF_UNSPEC): every source again.
    p.connect(
        r,
        SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
        false,
        T,
    )
    .unwrap();
    assert_eq!(p.peer_addr(r), Err(Errno::ENOTCONN));
    p.send_to(b, b"again", Some(addr_r), false, T).unwrap();
    assert_eq!(
        p.recv_from(r, &mut buf, BLOCK, T).unwrap(),
        (5, Some(addr_b))
    );
    let s = flowstack_offload::stats::query(&d.path).unwrap();
    assert_eq!(s.counters["FlowstackdUdpPeerFiltered"], 1);
}
