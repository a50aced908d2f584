//! The AF_XDP driver against the kernel on a veth pair, inside a private network namespace
//! that the test thread creates for itself (it disappears with the thread). Root only:
//! skipped otherwise, failing under CI as the interop tests do.

use super::*;
use std::net::UdpSocket;
use std::process::Command;
use std::time::{Duration as StdDuration, Instant as StdInstant};

const NOW: Instant = Instant::ZERO;
const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];
/// `UDP_SEGMENT`: the kernel sends one datagram as a UDP GSO packet of `gso_size` segments.
const UDP_SEGMENT: libc::c_int = 103;

fn have_root() -> bool {
    // SAFETY: getuid(2) has no preconditions.
    if unsafe { libc::getuid() } == 0 {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "the AF_XDP tests need root in CI"
    );
    eprintln!("skipped: the AF_XDP tests need root (network namespace, veth, XDP)");
    false
}

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("ip(8)");
    assert!(
        o.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Runs `f` on a thread of its own in a fresh network namespace holding a veth pair: `xa`
/// (the kernel, 10.9.0.1/24) and `xb` (for the driver, 10.9.0.2 as the kernel's neighbour
/// table says). Nothing outside the namespace is touched; it goes away with the thread.
fn in_veth_netns(f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        // SAFETY: unshare(2) moves only this thread into a new, empty network namespace;
        // commands it spawns inherit it.
        let r = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(r, 0, "unshare: {}", io::Error::last_os_error());
        let mac = |m: [u8; 6]| {
            m.iter()
                .map(|b| format!("{b:02x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        let (a, b) = (mac(MAC_A), mac(MAC_B));
        ip(&[
            "link", "add", "xa", "address", &a, "type", "veth", "peer", "name", "xb", "address", &b,
        ]);
        ip(&["addr", "add", "10.9.0.1/24", "dev", "xa"]);
        ip(&["link", "set", "xa", "up"]);
        ip(&["link", "set", "xb", "up"]);
        ip(&["neigh", "add", "10.9.0.2", "lladdr", &b, "dev", "xa"]);
        f()
    })
    .join()
    .expect("the test thread panicked");
}

/// The UDP payload of `frame` if it is an IPv4 UDP datagram to `port`.
fn udp_payload(frame: &[u8], port: u16) -> Option<&[u8]> {
    if frame.len() < 42 || frame[12..14] != [8, 0] || frame[23] != 17 {
        return None;
    }
    let l4 = 14 + ((frame[14] & 0xf) as usize) * 4;
    let total = u16::from_be_bytes([frame[16], frame[17]]) as usize;
    if u16::from_be_bytes([frame[l4 + 2], frame[l4 + 3]]) != port || 14 + total > frame.len() {
        return None;
    }
    Some(&frame[l4 + 8..14 + total])
}

/// Receives until `want` payload bytes to `port` arrived or 3 s passed; returns the payloads
/// in order and the largest frame seen.
fn receive(s: &mut XdpSocket, port: u16, want: usize) -> (Vec<u8>, usize) {
    let (mut got, mut largest) = (Vec::new(), 0);
    let start = StdInstant::now();
    while got.len() < want && start.elapsed() < StdDuration::from_secs(3) {
        s.recv_batch(NOW, 64, &mut |f| {
            if let Some(p) = udp_payload(f, port) {
                got.extend_from_slice(p);
                largest = largest.max(f.len());
            }
        });
        s.wait(Duration::from_millis(10));
    }
    (got, largest)
}

/// Sends `payload` from the kernel to 10.9.0.2:`port` as one UDP GSO packet.
fn kernel_send_gso(payload: &[u8], port: u16) {
    let u = UdpSocket::bind("10.9.0.1:0").unwrap();
    let seg: libc::c_int = 1400;
    // SAFETY: `seg` is a live c_int of the size passed; `u` is an open UDP socket.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&u),
            libc::SOL_UDP,
            UDP_SEGMENT,
            &seg as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "UDP_SEGMENT: {}", io::Error::last_os_error());
    assert_eq!(
        u.send_to(payload, ("10.9.0.2", port)).unwrap(),
        payload.len()
    );
}

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 % 251) as u8).collect()
}

#[test]
fn a_veth_peers_large_segment_arrives_whole_in_generic_mode() {
    if !have_root() {
        return;
    }
    in_veth_netns(|| {
        let mut socks = XdpSocket::open_queues("xb", 1).unwrap();
        let s = &mut socks[0];
        assert!(!s.driver_mode(), "a veth gets generic mode by default");
        let payload = pattern(14_000);
        kernel_send_gso(&payload, 9000);
        let (got, largest) = receive(s, 9000, payload.len());
        assert_eq!(got, payload, "byte-exact");
        assert!(
            largest > FRAME as usize,
            "one frame larger than a chunk: {largest}"
        );
        assert!(s.stats().rx_multi >= 1, "{:?}", s.stats());
    });
}

#[test]
fn in_driver_mode_the_same_segment_arrives_as_mtu_frames() {
    if !have_root() {
        return;
    }
    in_veth_netns(|| {
        let opts = XdpOptions {
            mode: Some(XdpMode::Driver),
            ..XdpOptions::default()
        };
        let mut socks = XdpSocket::open_queues_with("xb", 1, opts).unwrap();
        let s = &mut socks[0];
        assert!(s.driver_mode());
        let payload = pattern(14_000);
        kernel_send_gso(&payload, 9000);
        let (got, largest) = receive(s, 9000, payload.len());
        assert_eq!(got, payload, "byte-exact, segment by segment");
        assert!(largest <= 1514, "MTU-sized frames: {largest}");
        assert_eq!(s.stats().rx_multi, 0);
    });
}

/// An Ethernet/IPv4/UDP frame from 10.9.0.2:9002 to the kernel's 10.9.0.1:`port` (UDP
/// checksum 0: none, as IPv4 allows).
fn udp_frame(buf: &mut [u8], port: u16, payload: &[u8]) {
    buf[..6].copy_from_slice(&MAC_A);
    buf[6..12].copy_from_slice(&MAC_B);
    buf[12..14].copy_from_slice(&[8, 0]);
    let ip = &mut buf[14..34];
    ip.copy_from_slice(
        &[0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0]
            .iter()
            .chain(&[10, 9, 0, 2, 10, 9, 0, 1])
            .copied()
            .collect::<Vec<u8>>(),
    );
    ip[2..4].copy_from_slice(&((28 + payload.len()) as u16).to_be_bytes());
    let mut acc = flowstack_wire::checksum::Accumulator::new();
    acc.add(ip);
    ip[10..12].copy_from_slice(&acc.finish().to_be_bytes());
    let udp = &mut buf[34..42];
    udp[..2].copy_from_slice(&9002u16.to_be_bytes());
    udp[2..4].copy_from_slice(&port.to_be_bytes());
    udp[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    udp[6..8].copy_from_slice(&[0, 0]);
    buf[42..42 + payload.len()].copy_from_slice(payload);
}

/// Sends one UDP frame through an XDP socket transmitting as `tx`; the kernel must get it.
fn frame_reaches_the_kernel(tx: XdpTx) {
    // A fresh namespace per variant: the kernel releases a socket's queue binding after the
    // socket is closed, asynchronously, so binding the same queue at once again can fail with
    // EBUSY.
    in_veth_netns(move || {
        let k = UdpSocket::bind("10.9.0.1:9001").unwrap();
        k.set_read_timeout(Some(StdDuration::from_secs(2))).unwrap();
        let opts = XdpOptions { tx, mode: None };
        let mut socks = XdpSocket::open_queues_with("xb", 1, opts).unwrap();
        let s = &mut socks[0];
        assert_eq!(s.packet_tx(), tx == XdpTx::Auto, "copy mode on a veth");
        let msg = format!("hello over {tx:?}");
        let mut batch = TxBatch::new();
        udp_frame(batch.push(42 + msg.len()), 9001, msg.as_bytes());
        assert_eq!(s.send_batch(NOW, &batch), 1);
        let mut buf = [0u8; 64];
        let (n, from) = k.recv_from(&mut buf).expect("the kernel got the frame");
        assert_eq!(&buf[..n], msg.as_bytes());
        assert_eq!(from.to_string(), "10.9.0.2:9002");
    });
}

#[test]
fn frames_reach_the_kernel_through_the_packet_socket() {
    if have_root() {
        frame_reaches_the_kernel(XdpTx::Auto);
    }
}

#[test]
fn frames_reach_the_kernel_through_the_tx_ring() {
    if have_root() {
        frame_reaches_the_kernel(XdpTx::Ring);
    }
}

#[test]
fn a_full_tx_ring_drops_and_counts_then_reaped_completions_free_it() {
    if !have_root() {
        return;
    }
    in_veth_netns(|| {
        let opts = XdpOptions {
            tx: XdpTx::Ring,
            mode: None,
        };
        let mut socks = XdpSocket::open_queues_with("xb", 1, opts).unwrap();
        let s = &mut socks[0];
        // More frames per batch than the TX ring has slots and the pool has chunks.
        let per_batch = RING as usize + 1000;
        let mut batch = TxBatch::new();
        for i in 0..per_batch {
            udp_frame(batch.push(50), 9009, &(i as u64).to_be_bytes());
        }
        let mut accepted = 0;
        for round in 1..=3u64 {
            let before = s.stats();
            let n = s.send_batch(NOW, &batch);
            let after = s.stats();
            accepted += n;
            assert_eq!(
                n as u64 + (after.tx_ring_full - before.tx_ring_full),
                per_batch as u64,
                "round {round}: every frame sent or counted as dropped"
            );
        }
        assert!(
            accepted > RING as usize,
            "completions were reaped and their chunks reused: {accepted} sent"
        );
        assert_eq!(s.stats().tx_frames, accepted as u64);
    });
}
