//! Bulk sends straight from the transmit area (`app::txzc`): spans pinned by a connection
//! whose peer does not read never stop the application's other connections (stuck spans
//! are copied out of the area), a sender waiting for area room (not for its credit) is woken
//! when the area is released, and every byte arrives in order. Private socket paths, bounded
//! waits.

mod common;
use common::*;
use flowstack_api::{Sockets, TcpHandle};
use flowstack_client::posix::{Errno, Posix, RecvFlags, Type};
use flowstack_client::Client;
use flowstack_offload::{Daemon, DaemonConfig};
use flowstack_sys::placeholder::wait_a;
use std::os::fd::AsFd;
use std::sync::mpsc;

/// Byte `i` of stream `s` (streams differ, so a byte of one in another shows).
fn pat(s: usize, i: usize) -> u8 {
    pattern(i.wrapping_add(s * 7919))
}

/// Receives exactly `len` bytes of stream `s` on `c`, checking every byte.
fn recv_exact(app: &mut Client, c: TcpHandle, s: usize, len: usize) {
    let mut buf = vec![0u8; 100_003];
    let mut got = 0;
    while got < len {
        let want = buf.len().min(len - got);
        let n = app
            .recv(c, &mut buf[..want], T)
            .unwrap_or_else(|e| panic!("{e:?} at {got} of {len}"));
        assert!(n > 0, "early end of stream at {got}");
        for (k, &x) in buf[..n].iter().enumerate() {
            assert_eq!(x, pat(s, got + k), "stream {s} byte {}", got + k);
        }
        got += n;
    }
}

fn stream(s: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| pat(s, i)).collect()
}

/// One connection's peer does not read (its spans stay pinned in the area); a second
/// connection of the same application sends four transmit areas' worth: it completes (the
/// stuck spans are copied out of the area), and both streams arrive byte-exact.
#[test]
fn a_connection_whose_peer_does_not_read_does_not_stop_the_others() {
    const A: usize = 2 << 20; // beyond what the peer takes unread: some stays pinned
    const B: usize = 8 << 20; // four transmit areas
    let d = daemon("txzc-stuck", 1, false);
    let mut srv = Client::connect(&d.path).unwrap();
    let mut cli = Client::connect(&d.path).unwrap();
    let l = listen(&mut srv, 7561).unwrap();
    let (go, read_a) = mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let a = srv.accept(l, T).unwrap();
        let b = srv.accept(l, T).unwrap();
        recv_exact(&mut srv, b, 1, B);
        read_a.recv().unwrap();
        recv_exact(&mut srv, a, 0, A);
        let mut one = [0u8; 1];
        for c in [a, b] {
            assert_eq!(srv.recv(c, &mut one, T).unwrap(), 0, "end of stream");
            srv.close(c, T).unwrap();
        }
    });
    let a = cli.connect_to(lo(7561), T).unwrap();
    let b = cli.connect_to(lo(7561), T).unwrap();
    let data = stream(0, A);
    for k in data.chunks(128 << 10) {
        cli.send_all(a, k, T).unwrap();
    }
    let data = stream(1, B);
    for k in data.chunks(128 << 10) {
        cli.send_all(b, k, T).unwrap();
    }
    go.send(()).unwrap();
    cli.tcp_shutdown(a).unwrap();
    cli.tcp_shutdown(b).unwrap();
    server.join().unwrap();
    cli.close(a, T).unwrap();
    cli.close(b, T).unwrap();
    assert!(counter(&d.path, "FlowstackdTxZcBytes") >= B as u64 / 2);
    assert!(
        counter(&d.path, "FlowstackdTxRehomedBytes") > 0,
        "the pinned spans were never copied out, yet B got through?"
    );
    // Some of the received bytes went from the frame straight into the area (`rxdirect`),
    // the rest through the receive ring (A's while its reader waited): both byte-exact.
    assert!(counter(&d.path, "FlowstackdRxDirectBytes") > 0);
}

/// With spans never copied out (`tx_hold_limit` unbounded), a connection whose peer does
/// not read holds most of the area; another connection's non-blocking sends run out of
/// area room (their credit is far from spent) and its placeholder turns unwritable. When
/// the first connection's peer reads, the area is released and the waiter is woken (its
/// filler emptied): every `EAGAIN` ends with the socket writable again, and both streams
/// arrive byte-exact.
#[test]
fn a_sender_waiting_for_area_room_is_woken_when_it_is_released() {
    // The peer takes 512 KiB unread (its receive credit: the window it offers), the
    // engine's send buffer 1 MiB more, and 768 KiB wait in the daemon: about 1.75 MiB of
    // the 2 MiB area stays pinned, less than the other connection's credit (1 MiB).
    const A: usize = (2 << 20) + (256 << 10);
    const C: usize = 2 << 20;
    let dir = sock_path("txzc-wake");
    let d = Daemon::spawn(&DaemonConfig {
        socket: dir,
        tx_hold_limit: u64::MAX,
        fuse_pipe: 0, // the daemon's send area is what is tested; a pipe would bypass it
        ..DaemonConfig::default()
    })
    .unwrap();
    let server = Posix::attach(&d.path).unwrap();
    let client = Posix::attach(&d.path).unwrap();
    let (_la, lid) = server.socket(Type::Stream).unwrap();
    let port = server.bind(lid, lo(0)).unwrap();
    server.listen(lid, 16, None).unwrap();
    let (_aa, aid) = client.socket(Type::Stream).unwrap();
    client.connect(aid, lo(port), false, Some(T)).unwrap();
    let (_sa, sa, _, _) = server.accept(lid, false, Some(T)).unwrap();
    let (ca, cid) = client.socket(Type::Stream).unwrap();
    client.connect(cid, lo(port), false, Some(T)).unwrap();
    let (_sc, sc, _, _) = server.accept(lid, false, Some(T)).unwrap();
    let (go, read_a) = mpsc::channel::<()>();
    let reader = std::thread::spawn(move || {
        let recv_all = |id, s, len| {
            let mut buf = vec![0u8; 65_536];
            let mut got = 0;
            while got < len {
                let n = server
                    .recv(id, &mut buf, RecvFlags::BLOCK, Some(T))
                    .unwrap_or_else(|e| panic!("{e:?} at {got}"));
                assert!(n > 0, "early end of stream");
                for (k, &x) in buf[..n].iter().enumerate() {
                    assert_eq!(x, pat(s, got + k), "stream {s} byte {}", got + k);
                }
                got += n;
            }
        };
        read_a.recv().unwrap();
        recv_all(sa, 0, A);
        recv_all(sc, 1, C);
    });
    let data = stream(0, A);
    let mut at = 0;
    while at < A {
        at += client
            .send(aid, &data[at..(at + (128 << 10)).min(A)], false, Some(T))
            .unwrap();
    }
    let data = stream(1, C);
    let mut at = 0;
    let mut waits = 0;
    while at < C {
        match client.send(cid, &data[at..(at + (128 << 10)).min(C)], true, None) {
            Ok(n) => at += n,
            Err(e) => {
                assert_eq!(e, Errno::EAGAIN);
                if waits == 0 {
                    // Out of area room: only the first connection's reader frees it.
                    assert!(at < 1 << 20, "{at} bytes sent: the area was not pinned");
                    go.send(()).unwrap();
                }
                waits += 1;
                assert!(
                    wait_a(ca.as_fd(), false, true, POLL).unwrap().1,
                    "still unwritable after {at} bytes"
                );
            }
        }
    }
    assert!(waits > 0, "never ran out of room");
    reader.join().unwrap();
}

const POLL: std::time::Duration = std::time::Duration::from_secs(10);
